//! Flushing QPs in the error state: every outstanding WQE completes with
//! `WR_FLUSH_ERR` (spec 18.19); and the `QP_SQ_DRAINED` event of a QP in
//! SQD whose started work has completed.

use virtio_rdma_abi::datapath::{QpDoorbell, WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;

use super::completer::{self, traffic};
use super::doorbell::{self, load_pi};
use super::requester::wc_opcode;
use super::wqe::{fetch_recv, fetch_send, posted, RecvRing, WqeBuf, WqeError};
use crate::memory::HostMem;
use crate::rnic_path::RnicPath;
use crate::stats::TrafficCounters;
use crate::vm::VmState;

/// Completes every outstanding WQE of a QP in the error state with
/// WR_FLUSH_ERR. WQEs of a queue that is out of range or whose ring cannot
/// be read are not flushed: they were never taken, and nothing of them can
/// be trusted (spec 18.18, notes).
///
/// Flushes at most `max` WQEs (send and receive together) and returns how
/// many; the rest waits for the next service. Send WQEs wait while the
/// RNIC still has some of the QP's taken.
pub(super) fn flush<P: RnicPath>(
    path: &P,
    state: &mut VmState,
    mem: &HostMem,
    h: u32,
    sq_pi: u32,
    buf: &mut WqeBuf,
    max: u32,
) -> u32 {
    let mut did = 0u32;
    loop {
        if did >= max {
            return did;
        }
        let Some(qp) = state.res.qps.get(h) else {
            return did;
        };
        // WQEs the RNIC took complete first (it flushes them itself):
        // completions keep the order of the queue.
        if qp.rt.outstanding > 0 {
            break;
        }
        let Some(1..) = posted(sq_pi, qp.rt.sq_ci, qp.sq_depth) else {
            break;
        };
        let index = qp.rt.sq_ci;
        let (cq, qpn) = (qp.send_cq, qp.qpn);
        let (wr_id, op) = match fetch_send(mem, qp, index, buf) {
            Ok(wr) => (wr.hdr.wr_id, wc_opcode(wr.opcode)),
            Err(WqeError::Malformed { wr_id, opcode }) => {
                (wr_id, opcode.map_or(WcOpcode::SEND, wc_opcode))
            }
            Err(WqeError::Unusable) => break,
        };
        let cqe = completer::error_cqe(wr_id, op, WcStatus::WR_FLUSH_ERR, qpn);
        let _ = completer::complete(state, mem, cq, cqe);
        count_flushed(state);
        if let Some(qp) = state.res.qps.get_mut(h) {
            qp.rt.sq_ci = index.wrapping_add(1);
            qp.rt.wait = None;
            qp.rt.partial = None;
            let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
        }
        did = did.saturating_add(1);
    }
    // A receive WQE the RNIC took (a message arriving in pieces).
    if did < max && path.flush_taken(state, mem, h) {
        count_flushed(state);
        did = did.saturating_add(1);
    }
    // Receives of a QP with its own receive queue.
    loop {
        if did >= max {
            return did;
        }
        let Some(qp) = state.res.qps.get(h) else {
            return did;
        };
        // Receives the RNIC took complete first (it flushes them).
        if qp.srq != 0 || qp.rt.recv_outstanding > 0 {
            break;
        }
        let Some(rq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ) else {
            break;
        };
        let Some(1..) = posted(rq_pi, qp.rt.rq_ci, qp.rq_depth) else {
            break;
        };
        let index = qp.rt.rq_ci;
        let (cq, qpn) = (qp.recv_cq, qp.qpn);
        let wr_id = match fetch_recv(mem, &RecvRing::of_qp(qp), index, buf) {
            Ok(w) => w.wr_id,
            Err(WqeError::Malformed { wr_id, .. }) => wr_id,
            Err(WqeError::Unusable) => break,
        };
        let cqe = completer::error_cqe(wr_id, WcOpcode::RECV, WcStatus::WR_FLUSH_ERR, qpn);
        let _ = completer::complete(state, mem, cq, cqe);
        count_flushed(state);
        if let Some(qp) = state.res.qps.get_mut(h) {
            qp.rt.rq_ci = index.wrapping_add(1);
            let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::RQ_CI, qp.rt.rq_ci);
        }
        did = did.saturating_add(1);
    }
    did
}

/// Counts one `WR_FLUSH_ERR` completion of the VM `state` belongs to.
fn count_flushed(state: &VmState) {
    if let Some(t) = traffic(state) {
        TrafficCounters::add_single_writer(&t.flushed, 1);
    }
}

/// Queues `QP_SQ_DRAINED` for QP `h` if it entered SQD with the event
/// enabled while work was in flight and that work has now completed.
pub(super) fn drained(state: &mut VmState, h: u32) {
    let Some(qp) = state.res.qps.get_mut(h) else {
        return;
    };
    if qp.state == QpState::SQD && qp.rt.drain_owed && !qp.rt.in_flight() {
        qp.rt.drain_owed = false;
        state.events.push(EventKind::QP_SQ_DRAINED, h, 0);
    }
}
