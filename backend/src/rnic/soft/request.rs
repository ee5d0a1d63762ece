//! A message as the responder gets it ([`Request`]), what the requester
//! hears back ([`RespOutcome`]), and what both sides of the responder do
//! with one: copy its payload in, or refuse it.

use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{AddressVector, QpType};

use crate::engine::wqe::WqeBuf;
use crate::memory::access::{self, Segment};
use crate::memory::HostMem;
use crate::rnic_path::SendWr;
use crate::vm::VmState;

/// Reusable memory of the responder side (no allocation per message).
pub struct RespScratch {
    /// The copied receive WQE.
    pub recv: Box<WqeBuf>,
    /// Segments of the remote range or the receive buffer.
    pub segs: Vec<Segment>,
    /// The QPs a multicast message went to (`Router::multicast`): the
    /// requester is charged for each; 0 for any other message.
    pub fanout: u32,
    /// The members of the group a multicast message goes to.
    pub members: Vec<crate::rnic_objects::Owner>,
}

impl RespScratch {
    /// Empty scratch memory.
    pub fn new() -> Self {
        RespScratch {
            recv: WqeBuf::new(),
            segs: Vec::with_capacity(64),
            fanout: 0,
            members: Vec::new(),
        }
    }
}

impl Default for RespScratch {
    fn default() -> Self {
        Self::new()
    }
}

/// What the requester needs from the responder.
#[derive(Debug)]
pub enum RespOutcome {
    /// Done; for READ and atomics the bytes went to the local segments.
    Done,
    /// No receive WQE posted (RNR); the responder QP's `min_rnr_timer`
    /// selects the wait (spec 18.20).
    Rnr(u32),
    /// The destination is unreachable (spec 18.23): RC retries, UD drops.
    Unreachable,
    /// The destination's device instance is stopped (paused, or in a
    /// migration's blackout) with its objects: RC holds without spending
    /// its retries (spec 20.6), UD and UC drop.
    Paused,
    /// RC: the QP the requester is connected to was destroyed (spec
    /// 18.23): the requester fails at once with `RETRY_EXC_ERR`.
    Gone,
    /// The responder refused: the requester's CQE status.
    Nak(WcStatus),
    /// Silently dropped (UD only).
    Dropped,
    /// The responder QP no longer has the addressed QPN (a stale routing
    /// hint); the requester resolves the QPN again.
    Stale,
    /// The responder's VM is locked by its control path: nothing was done,
    /// the requester tries again at its next service (not a retry in the
    /// sense of spec 18.20; the engine never waits for a VM's lock).
    Busy,
}

/// The requester's side of one message, ready for the responder.
pub struct Request<'a> {
    /// Its route passed the tenant policy's checks already (the engine's
    /// pre-check of an RC message): delivery need not repeat them.
    pub admitted: bool,
    /// The work request.
    pub wr: &'a SendWr<'a>,
    /// The requester QP's type: the responder's must be the same.
    pub qp_type: QpType,
    /// Index of the requester's VM (isolation counters are the
    /// requester's).
    pub vm: usize,
    /// Requester QPN.
    pub src_qpn: u32,
    /// Requester GID.
    pub src_gid: [u8; 16],
    /// The address vector the message was sent with: a UD message's AH
    /// (its traffic class, flow label and hop limit go into the receiver's
    /// GRH, spec 18.13), an RC QP's `av`.
    pub av: AddressVector,
    /// Local segments (source of SEND/WRITE, destination of READ/atomics).
    pub local: &'a [Segment],
    /// Message length.
    pub len: u64,
    /// The part of the message this execution moves: offset and length
    /// (`(0, len)` unless the message is executed in pieces; then
    /// `local` holds only this part). The first part of a WRITE checks the
    /// whole remote range, every later one its own.
    pub part: (u64, u64),
    /// Requester memory.
    pub mem: &'a HostMem,
    /// QPN the requester addressed (the responder must still have it).
    pub dest_qpn: u32,
    /// UD: the Q_Key the message carries (`remote_qkey`, or the sending
    /// QP's own Q_Key). Unused for RC.
    pub qkey: u32,
}

/// The responder refuses: its QP fails with an async event, the requester
/// gets `status`. A UC responder drops the message instead and stays as it
/// is (spec 18.11.6): UC has no responses.
pub(super) fn nak(state: &mut VmState, qp: u32, status: WcStatus) -> RespOutcome {
    if state
        .res
        .qps
        .get(qp)
        .is_some_and(|q| q.qp_type == QpType::UC)
    {
        return RespOutcome::Dropped;
    }
    let event = if status == WcStatus::REM_ACCESS_ERR {
        EventKind::QP_ACCESS_ERROR
    } else {
        EventKind::QP_REQ_ERROR
    };
    state.qp_enter_err(qp, Some(event));
    RespOutcome::Nak(status)
}

/// Copies the request's payload (inline bytes or local segments) into `dst`:
/// the part of it this execution moves (`req.part`, the whole message but
/// for a plain RDMA WRITE executed in pieces).
pub(super) fn copy_in(
    req: &Request<'_>,
    mem: &HostMem,
    dst: &[Segment],
) -> Result<(), access::AccessError> {
    match req.wr.inline {
        Some(data) => access::write(mem, dst, data),
        None => access::copy(req.mem, req.local, mem, dst, req.part.1),
    }
}
