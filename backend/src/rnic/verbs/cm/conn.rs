//! What the bridge and the host CM exchange: connection parameters, the
//! QP parameters of a connection, the kinds of host events.

/// The connection parameters of a connect, accept or host event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParams {
    /// The consumer's private data (without `rdma_cm`'s own header).
    pub private_data: Vec<u8>,
    /// RDMA READ / atomic requests accepted as responder.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests outstanding as initiator.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// The QP number: the guest's host QP (ours), or the peer's (events).
    pub qp_num: u32,
}

/// What the host CM says a QP of the connection needs in RTR and RTS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpParams {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The first PSN the peer sends (RTR).
    pub rq_psn: u32,
    /// The first PSN this side sends (RTS): the host CM's, not the guest's.
    pub sq_psn: u32,
    /// Path MTU (libibverbs encoding, which is IB's).
    pub path_mtu: u32,
    /// Responder resources (RTR).
    pub max_dest_rd_atomic: u8,
    /// Initiator depth (RTS).
    pub max_rd_atomic: u8,
}

/// Kinds of host CM events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostKind {
    /// The destination address resolved.
    AddrResolved,
    /// The destination address did not resolve.
    AddrError,
    /// The route resolved.
    RouteResolved,
    /// The route did not resolve.
    RouteError,
    /// A peer asks to connect to a listener (the event's id is new).
    ConnectRequest,
    /// The peer replied (a QP-less id: the caller sends the RTU).
    ConnectResponse,
    /// The connection failed.
    ConnectError,
    /// The peer did not answer.
    Unreachable,
    /// The peer rejected (status: the REJ reason).
    Rejected,
    /// The connection is established (passive side: the RTU arrived).
    Established,
    /// The connection is released.
    Disconnected,
    /// The host device went away.
    DeviceRemoval,
    /// The id left time-wait.
    TimewaitExit,
    /// Anything else (address changes, multicast).
    #[default]
    Other,
}
