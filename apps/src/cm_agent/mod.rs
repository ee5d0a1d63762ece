//! A connection manager on the reference driver: IB CM over the VM's GSI
//! QP, as Linux's `rdma_cm` speaks it on RoCE (the TCP port space, service
//! ID `0x0106_0000 | port`, the `rdma_cm` header with the IP addresses at
//! the start of the REQ's private data, IPv4-mapped GIDs), so that its
//! peer may be an unmodified `rdma_cm` application — through the soft
//! RNIC's MAD routing, or through the libibverbs transport's CM bridge and
//! the hosts' own `rdma_cm`.
//!
//! - Active side ([`CmPort::connect`]): REQ, retransmitted until a REP,
//!   REJ or MRA answers it (an MRA extends the wait); the QP to RTR and RTS
//!   with the REP's values; RTU.
//! - Passive side ([`CmPort::accept`]): waits for a REQ for its port (a
//!   REQ for any other is rejected, "invalid service ID", as a host with
//!   no listener does); the QP to RTR and RTS with the REQ's values; REP,
//!   retransmitted until the RTU arrives.
//! - Disconnection ([`CmPort::disconnect`], [`CmPort::poll_dreq`]): DREQ
//!   retransmitted until the DREP; a DREQ answered with a DREP.
//!
//! Everything received is checked against the exchange it claims to
//! belong to (communication IDs, transaction ID, sender's GID, state);
//! what fits none is dropped and counted, never answered with this side's
//! state. Transaction IDs are kept as Linux's CM keeps them: a REQ's for
//! the REP, REJ, MRA and RTU of its exchange, a DREQ's for its DREP.
//!
//! The waits are counted in retransmissions ([`Timers`]), each of a
//! response time, as the IB CM does: there is no overall wall-clock limit
//! on an exchange that still gets answers (an MRA lengthens it).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ib_cm_wire::cm::{rej_reason, which};
use ib_cm_wire::{CmMessage, Rej, Req};
use virtio_rdma_abi::qp::Mtu;
use virtio_rdma_driver::Device;

use crate::gsi_port::{gid_ip, ip_gid, Gsi, Received};

mod active;
mod disconnect;
mod passive;

type BoxError = Box<dyn std::error::Error>;

/// How long one MAD send may take to complete on QP 1.
const SEND_WAIT: Duration = Duration::from_secs(30);
/// The CM response timeout code this side announces (2^20 × 4.096 µs).
const CM_RESPONSE_TIMEOUT: u8 = 20;
/// The local ACK timeout code of the path (as rdma_cm on RoCE: ~1 s).
const ACK_TIMEOUT: u8 = 18;

/// The CM's retransmission timers.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// How long one REQ, REP or DREQ waits for its answer before it is
    /// sent again.
    pub response_wait: Duration,
    /// Sends of one REQ, REP or DREQ before the exchange is given up.
    pub max_sends: u32,
}

impl Default for Timers {
    /// As rdma_cm's: a CM response timeout of 2^20 × 4.096 µs ≈ 4.3 s and
    /// 15 sends (`max_cm_retries`).
    fn default() -> Self {
        Timers {
            response_wait: Duration::from_millis(4300),
            max_sends: 15,
        }
    }
}

/// Parameters of a connection, as `rdma_conn_param`.
#[derive(Debug, Clone)]
pub struct ConnParam {
    /// RDMA READ/atomic this side accepts as responder.
    pub responder_resources: u8,
    /// RDMA READ/atomic this side has outstanding as initiator.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7: forever).
    pub rnr_retry_count: u8,
    /// The user's private data (after the rdma_cm header in a REQ).
    pub private_data: Vec<u8>,
}

impl Default for ConnParam {
    /// As `rping`'s: one READ each way, 7 retries of each kind.
    fn default() -> Self {
        ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: Vec::new(),
        }
    }
}

/// An established connection.
#[derive(Debug, Clone)]
pub struct Connection {
    /// This side's communication ID.
    pub local_comm_id: u32,
    /// The peer's communication ID.
    pub remote_comm_id: u32,
    /// The peer's GID (IPv4-mapped for IPv4).
    pub peer_gid: [u8; 16],
    /// The peer's QP number.
    pub remote_qpn: u32,
    /// The private data the peer sent (its REQ's after the rdma_cm
    /// header, or its REP's).
    pub private_data: Vec<u8>,
}

impl Connection {
    /// The peer's IP address.
    pub fn peer_ip(&self) -> IpAddr {
        gid_ip(self.peer_gid)
    }
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The peer rejected it (IBTA reason code; 8: no listener).
    #[error("rejected by the peer: reason {reason} ({})", rej_name(*.reason))]
    Rejected {
        /// The REJ's reason.
        reason: u16,
    },
    /// No answer after every retransmission.
    #[error("no answer from the peer to the {what} after {sends} sends")]
    Timeout {
        /// The message that went unanswered (`"REQ"`, `"REP"`, `"DREQ"`).
        what: &'static str,
        /// How often it was sent.
        sends: u32,
    },
    /// Anything else: the device, a bad message.
    #[error("{0}")]
    Other(String),
}

impl From<Box<dyn std::error::Error>> for CmError {
    fn from(e: Box<dyn std::error::Error>) -> Self {
        CmError::Other(e.to_string())
    }
}

impl From<virtio_rdma_driver::Error> for CmError {
    fn from(e: virtio_rdma_driver::Error) -> Self {
        CmError::Other(e.to_string())
    }
}

fn rej_name(reason: u16) -> &'static str {
    match reason {
        rej_reason::NO_QP => "no QP",
        rej_reason::NO_RESOURCES => "no resources",
        rej_reason::TIMEOUT => "timeout",
        rej_reason::INVALID_SERVICE_ID => "invalid service ID: nothing listens there",
        rej_reason::STALE_CONN => "stale connection",
        rej_reason::CONSUMER_DEFINED => "consumer defined",
        _ => "see IBTA 12.6.7",
    }
}

/// A random 32-bit value (communication IDs, PSNs, transaction IDs).
fn random_u32() -> u32 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        Instant::now()
            .elapsed()
            .as_nanos()
            .wrapping_add(u128::from(std::process::id())),
    );
    (h.finish() >> 16) as u32
}

/// The path MTU code for an MTU code of a message, at most `port`'s.
fn mtu(code: u8, port: u32) -> Mtu {
    let c = u32::from(code).clamp(1, 5).min(port.clamp(1, 5));
    match c {
        1 => Mtu::MTU_256,
        2 => Mtu::MTU_512,
        3 => Mtu::MTU_1024,
        4 => Mtu::MTU_2048,
        _ => Mtu::MTU_4096,
    }
}

/// A random transaction ID whose upper half is `comm_id` (as Linux's CM
/// forms them).
fn new_tid(comm_id: u32) -> u64 {
    (u64::from(comm_id) << 32) | u64::from(random_u32())
}

/// The index of `ip`'s GID (IPv4-mapped for IPv4) in `dev`'s GID table.
pub fn gid_index_of(dev: &Device, ip: IpAddr) -> Result<u8, BoxError> {
    let gid = ip_gid(ip);
    let table = dev.gid_table()?;
    let i = table
        .iter()
        .position(|g| *g == gid)
        .ok_or_else(|| format!("{ip} is not in the device's GID table"))?;
    Ok(u8::try_from(i)?)
}

/// A VM's CM endpoint: its GSI QP and the GID it speaks from.
pub struct CmPort<'d> {
    dev: &'d Device,
    gsi: Gsi,
    /// The GID this side's MADs and connections go out from, and its
    /// index in the device's GID table.
    sgid: [u8; 16],
    sgid_index: u8,
    timers: Timers,
    /// Connections made, (peer's GID, peer's communication ID): their
    /// REQs' retransmissions are dropped, not rejected.
    known: Vec<([u8; 16], u32)>,
    /// MADs that fit no exchange of this port (dropped).
    dropped: u64,
}

impl<'d> CmPort<'d> {
    /// Opens the VM's GSI QP (the device must offer `F_GSI`), speaking
    /// from the device handle's own GID.
    pub fn open(dev: &'d Device) -> Result<Self, BoxError> {
        CmPort::open_from(dev, dev.gid_index())
    }

    /// Opens the VM's GSI QP, speaking from GID table entry `sgid_index`
    /// (0: the MAC-derived default GID; further ones the VM's configured
    /// GIDs; [`gid_index_of`] finds an IP's).
    pub fn open_from(dev: &'d Device, sgid_index: u8) -> Result<Self, BoxError> {
        let sgid = dev.query_gid(u32::from(sgid_index))?;
        if sgid == [0; 16] {
            return Err(format!("GID table entry {sgid_index} is not assigned").into());
        }
        Ok(CmPort {
            dev,
            gsi: Gsi::open_from(dev, sgid_index)?,
            sgid,
            sgid_index,
            timers: Timers::default(),
            known: Vec::new(),
            dropped: 0,
        })
    }

    /// Replaces the retransmission timers.
    pub fn set_timers(&mut self, timers: Timers) {
        self.timers = Timers {
            max_sends: timers.max_sends.max(1),
            ..timers
        };
    }

    /// The GID this side speaks from.
    pub fn gid(&self) -> [u8; 16] {
        self.sgid
    }

    /// The protection domain of the GSI QP, for the application's QP too.
    pub fn pd(&self) -> &std::sync::Arc<virtio_rdma_driver::Pd> {
        &self.gsi.pd
    }

    /// MADs dropped so far (not for any exchange of this port).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// This side's IP address (its GID's).
    pub fn ip(&self) -> IpAddr {
        gid_ip(self.sgid)
    }

    fn send(&self, dgid: [u8; 16], msg: CmMessage, tid: u64) -> Result<(), BoxError> {
        let mad = msg.emit(tid)?;
        self.gsi.send(self.dev, dgid, &mad, SEND_WAIT)
    }

    /// The next CM message before `deadline` (sender's GID, transaction
    /// ID, message), or `None`; other MADs are dropped.
    fn next(&mut self, deadline: Instant) -> Result<Option<Incoming>, BoxError> {
        loop {
            match self.gsi.receive_until(deadline)? {
                Some(Received::Cm(grh, tid, msg)) => {
                    return Ok(Some(Incoming {
                        from: grh.sgid,
                        tid,
                        msg,
                    }))
                }
                Some(Received::Dropped(why)) => {
                    log::debug!("CM: dropped a MAD: {why}");
                    self.dropped += 1;
                }
                None => return Ok(None),
            }
        }
    }

    /// Rejects `req` (transaction `tid`) from `from` with `reason`.
    fn reject(&self, from: [u8; 16], tid: u64, req: &Req, reason: u16) -> Result<(), BoxError> {
        let rej = Rej {
            local_comm_id: random_u32(),
            remote_comm_id: req.local_comm_id,
            message_rejected: which::REQ,
            reason,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        self.send(from, CmMessage::Rej(rej), tid)
    }

    /// A message for no exchange under way: a new REQ is refused as a
    /// host without a listener refuses it; anything else is dropped.
    fn stray(&mut self, from: [u8; 16], tid: u64, msg: &CmMessage) {
        if let CmMessage::Req(req) = msg {
            if !self.known.contains(&(from, req.local_comm_id))
                && self
                    .reject(from, tid, req, rej_reason::INVALID_SERVICE_ID)
                    .is_ok()
            {
                return;
            }
        }
        log::debug!("CM: dropped a stray {msg:?}");
        self.dropped += 1;
    }
}

/// A CM message received.
struct Incoming {
    /// The sender's GID (the GRH's source).
    from: [u8; 16],
    /// The MAD's transaction ID.
    tid: u64,
    msg: CmMessage,
}
