//! The requester: it takes a QP's send WQEs in bursts, checks each (format,
//! opcode, lengths, local buffers, address handle), hands it to the
//! transport (`soft`), and completes it on the send CQ.

use std::time::Instant;

use log::debug;
use virtio_rdma_abi::datapath::{Cqe, QpDoorbell, WcOpcode, WcStatus, WrOpcode, WQE_SIGNALED};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType, QP_FLAG_SIG_ALL};

use super::completer::{self, traffic};
use super::doorbell;
use super::soft::pieces;
use super::soft::retry::{exhausted, rnr_retry, transport_retry, waiting};
use super::soft::{RespOutcome, RespScratch};
use super::sweep::Serving;
use super::thread::Scratch;
use super::wqe::{fetch_send, posted, SendWr, WqeError};
use super::Engine;
use crate::ctrl::Ctrl;
use crate::memory::access::Segment;
use crate::memory::HostMem;
use crate::resources::{Qp, SendWait};
use crate::stats::TrafficCounters;

/// `remote_qkey` bit 31: the message carries the sending QP's own Q_Key
/// instead (spec 18.8, 18.11.5).
const QKEY_USE_OWN: u32 = 1 << 31;

impl Engine {
    /// Takes send work of QP `h` (in RTS, or in SQD with work started) up
    /// to producer index `sq_pi`: a burst, unless its head WQE waits for a
    /// retry.
    pub(super) fn run_sq(
        &self,
        cx: &mut Serving<'_>,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
    ) -> bool {
        let Some(qp) = cx.ctrl.res.qps.get(h) else {
            return false;
        };
        if qp.rt.sq_ci == sq_pi {
            return false;
        }
        // The head WQE waits for a retry: nothing to do (and no peer to
        // lock) before its timer ends; later WQEs wait behind it.
        if let Some(at) = waiting(qp) {
            scratch.timer(at);
            return false;
        }
        // An RC QP talks to one QP: its VM is locked once for the burst.
        if qp.qp_type == QpType::RC {
            if let Some(did) = self.burst_with_peer(cx, h, sq_pi, scratch) {
                return did;
            }
        }
        self.burst(cx, h, sq_pi, scratch)
    }

    /// Executes up to a burst ([`crate::qos::rate_limits::grain_of`] the
    /// VM's weight) of send WQEs of QP `h`.
    pub(super) fn burst(
        &self,
        cx: &mut Serving<'_>,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
    ) -> bool {
        let (vm_id, mem) = (cx.vm, cx.mem);
        let mut did = false;
        let mut published = None;
        let traffic = self.shared.tenancy.traffic(vm_id);
        // Rate limits: one clock read per burst, and only for a VM that
        // (or whose tenant) has a limit.
        let now = scratch.limits.limited(vm_id).then(Instant::now);
        // The grain of the VM's service: how long other VMs may have to
        // wait behind this burst.
        let (max_wqes, max_bytes) = scratch.limits.grain(vm_id);
        let mut bytes = 0u64;
        let mut wqes = 0u32;
        // A piece of a message executed in pieces counts towards the
        // burst's bytes, not its work requests: every piece moves at least
        // `PIECE` bytes, so the burst ends.
        while wqes < max_wqes {
            let Some(qp) = cx.ctrl.res.qps.get(h) else {
                break;
            };
            let startable =
                qp.state == QpState::RTS || (qp.state == QpState::SQD && qp.rt.in_flight());
            if !startable || qp.rt.sq_ci == sq_pi {
                break;
            }
            if let Some(at) = waiting(qp) {
                scratch.timer(at);
                break;
            }
            if posted(sq_pi, qp.rt.sq_ci, qp.sq_depth).is_none() {
                // The driver claims more WQEs than the ring holds.
                cx.ctrl.qp_enter_err(h, Some(EventKind::QP_FATAL));
                did = true;
                break;
            }
            if let Some(now) = now {
                if let Some(at) = scratch.limits.admit(vm_id, now, traffic) {
                    // Held back until the VM's and its tenant's buckets
                    // allow; the WQE stays at the head.
                    scratch.timer(at);
                    break;
                }
            }
            did = true;
            scratch.moved = 0;
            scratch.pieces.size_next(max_bytes, bytes);
            let index = qp.rt.sq_ci;
            let outcome = match exhausted(qp) {
                // The last transport retry found the destination
                // unreachable, and its timeout has passed (spec 18.20).
                Some((wr_id, op)) => {
                    let c = Completion::failed(wr_id, op, WcStatus::RETRY_EXC_ERR);
                    complete_send(cx.ctrl, mem, h, index, c)
                }
                None => self.execute(cx, h, index, scratch),
            };
            let Some(qp) = cx.ctrl.res.qps.get_mut(h) else {
                break;
            };
            match outcome {
                Step::Wait(w) => {
                    // Each try (an RNR or a transport retry) is work the
                    // guest caused: a work request to its rate limits, as
                    // to its share (the pass charges the service).
                    scratch.timer(w.at);
                    qp.rt.wait = Some(w);
                    scratch.limits.charge_ops(vm_id, 1);
                    break;
                }
                Step::Piece => {
                    // The WQE stays at the head; its completion comes with
                    // its last piece. The piece is charged its bytes.
                    let moved = std::mem::take(&mut scratch.moved);
                    if let Some(t) = traffic {
                        TrafficCounters::add_single_writer(&t.send_bytes, moved);
                    }
                    TrafficCounters::add_single_writer(&self.counters.bytes, moved);
                    scratch.limits.charge_bytes(vm_id, moved);
                    bytes = bytes.saturating_add(moved);
                    scratch.executed.1 = scratch.executed.1.saturating_add(moved);
                }
                Step::Done { published: p } => {
                    wqes = wqes.saturating_add(1);
                    qp.rt.wait = None;
                    qp.rt.partial = None;
                    qp.rt.sq_ci = index.wrapping_add(1);
                    published = p.then_some(qp.rt.sq_ci);
                    let moved = std::mem::take(&mut scratch.moved);
                    if let Some(t) = traffic {
                        TrafficCounters::add_single_writer(&t.send_ops, 1);
                        TrafficCounters::add_single_writer(&t.send_bytes, moved);
                    }
                    TrafficCounters::add_single_writer(&self.counters.wqes, 1);
                    TrafficCounters::add_single_writer(&self.counters.bytes, moved);
                    scratch.limits.charge(vm_id, moved);
                    bytes = bytes.saturating_add(moved);
                    scratch.executed.0 = scratch.executed.0.saturating_add(1);
                    scratch.executed.1 = scratch.executed.1.saturating_add(moved);
                }
                Step::Broken | Step::Busy => break,
            }
            if bytes >= max_bytes {
                break;
            }
        }
        // The consumer index of the WQEs taken in this burst, once (those
        // with a completion published it before writing it).
        if let Some(qp) = cx.ctrl.res.qps.get(h) {
            if did && published != Some(qp.rt.sq_ci) {
                let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
            }
        }
        did
    }

    /// Executes send WQE `index` of QP `h`, writing its completion.
    fn execute(&self, cx: &mut Serving<'_>, h: u32, index: u32, scratch: &mut Scratch) -> Step {
        let mem = cx.mem;
        let Some(qp) = cx.ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (pd, qpn, qp_type, sig_all) =
            (qp.pd, qp.qpn, qp.qp_type, qp.flags & QP_FLAG_SIG_ALL != 0);
        // A message this QP has partly executed (`soft::pieces`).
        let partial = qp.rt.partial.filter(|p| p.index == index);
        let Scratch {
            wqe: wqe_buf,
            local,
            resp,
            moved,
            pieces,
            ..
        } = scratch;
        let wr = match fetch_send(mem, qp, index, wqe_buf) {
            Ok(wr) => wr,
            Err(WqeError::Unusable) => {
                // The ring is not in guest RAM: the queue is unusable, the
                // QP fails with QP_FATAL and the WQE is not taken (spec
                // 18.18).
                cx.ctrl.qp_enter_err(h, Some(EventKind::QP_FATAL));
                return Step::Broken;
            }
            Err(WqeError::Malformed { wr_id, opcode }) => {
                let op = opcode.map_or(WcOpcode::SEND, wc_opcode);
                let c = Completion::failed(wr_id, op, WcStatus::LOC_QP_OP_ERR);
                return complete_send(cx.ctrl, mem, h, index, c);
            }
        };
        let malformed = malformed_op(qp, &wr, cx.ctrl.atomics_negotiated());
        let (wr_id, op) = (wr.hdr.wr_id, wc_opcode(wr.opcode));
        // The requester's error completion for this WQE.
        let failed = |ctrl: &mut Ctrl, status| {
            complete_send(ctrl, mem, h, index, Completion::failed(wr_id, op, status))
        };
        if malformed {
            return failed(cx.ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let signaled = sig_all || wr.hdr.flags & WQE_SIGNALED != 0;
        // `WQE_FENCE` asks nothing more: operations complete in order here.
        let writes_local = matches!(
            op,
            WcOpcode::RDMA_READ | WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD
        );
        let piecewise = pieces::piecewise(qp_type, &wr);
        let start = partial.map_or(0, |p| p.done);
        let limit = pieces.limit(piecewise);
        // The message length first, from the SGE lengths alone, before any
        // of it is looked up or translated (a message over a huge MR of one
        // repeated page costs its sender nothing; its translation would
        // cost the engine). At most 30 SGEs of 4 GiB: no overflow.
        let total: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        if partial.is_some_and(|p| !pieces::resumes(&p, &wr, piecewise, total)) {
            return failed(cx.ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let len = wr.inline.map_or(total, |d| d.len() as u64);
        if len > u64::from(self.rnic.caps().max_msg_size) {
            return failed(cx.ctrl, WcStatus::LOC_LEN_ERR);
        }
        // The part this execution moves: all of it but for a piece.
        let Some(part) = pieces::part(piecewise, len, start, limit) else {
            return failed(cx.ctrl, WcStatus::LOC_QP_OP_ERR);
        };
        let ud = qp_type == QpType::UD;
        if matches!(op, WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD) && len != 8 {
            return failed(cx.ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        // A UD message is one packet: at most the MTU (spec 18.11).
        if ud && len > u64::from(self.rnic.caps().max_ud_payload()) {
            return failed(cx.ctrl, WcStatus::LOC_LEN_ERR);
        }
        // Its destination.
        let Some(qp) = cx.ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (dest_qpn, av) = if ud {
            let Some(ah) = cx.ctrl.res.ahs.get(wr.hdr.ah_handle).filter(|a| a.pd == pd) else {
                return failed(cx.ctrl, WcStatus::LOC_QP_OP_ERR);
            };
            (wr.hdr.remote_qpn, ah.av)
        } else {
            (qp.attr.dest_qpn, qp.attr.av)
        };
        let qkey = if wr.hdr.remote_qkey & QKEY_USE_OWN != 0 {
            qp.attr.qkey
        } else {
            wr.hdr.remote_qkey
        };
        let msg = Outgoing {
            wr: &wr,
            pd,
            src_qpn: qpn,
            ud,
            dest_qpn,
            av,
            qkey,
            writes_local,
            start,
            limit,
            len,
            part,
        };
        let outcome = match self.transmit(cx, h, &msg, local, resp) {
            Ok(outcome) => outcome,
            Err(status) => return failed(cx.ctrl, status),
        };
        shrink_scratch(local, resp);
        // UD gives no delivery guarantee: a message nobody takes is dropped
        // (spec 18.11.5), yet the send succeeded.
        let dropped = matches!(outcome, RespOutcome::Dropped)
            || (ud && matches!(outcome, RespOutcome::Unreachable | RespOutcome::Stale));
        if dropped {
            if let Some(t) = self.shared.tenancy.traffic(cx.vm) {
                TrafficCounters::add_single_writer(&t.drops, 1);
            }
        }
        if dropped || matches!(outcome, RespOutcome::Done) {
            *moved = part.1;
        }
        // `part.1 <= len - part.0`: at most `len`.
        let end = part.0.saturating_add(part.1);
        if matches!(outcome, RespOutcome::Done) && end < len {
            // A piece: the WQE stays at the head until its last one.
            if let Some(q) = cx.ctrl.res.qps.get_mut(h) {
                q.rt.partial = Some(pieces::started(index, &wr, len, end));
            }
            return Step::Piece;
        }
        match outcome {
            RespOutcome::Done | RespOutcome::Dropped => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let c = Completion::ok(wr_id, op, byte_len);
                    return complete_send(cx.ctrl, mem, h, index, c);
                }
                Step::Done { published: false }
            }
            // UD gives no delivery guarantee: a message nobody takes is
            // dropped (spec 18.11.5).
            RespOutcome::Unreachable | RespOutcome::Stale if ud => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let c = Completion::ok(wr_id, op, byte_len);
                    return complete_send(cx.ctrl, mem, h, index, c);
                }
                Step::Done { published: false }
            }
            RespOutcome::Nak(status) => failed(cx.ctrl, status),
            RespOutcome::Busy => Step::Busy,
            RespOutcome::Unreachable | RespOutcome::Stale => {
                let Some(qp) = cx.ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                debug!("QP {qpn:#x}: destination {dest_qpn:#x} unreachable");
                transport_retry(qp, index, wr_id, op)
            }
            RespOutcome::Rnr(code) => {
                let Some(qp) = cx.ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                match rnr_retry(qp, index, code) {
                    Some(w) => Step::Wait(w),
                    None => failed(cx.ctrl, WcStatus::RNR_RETRY_EXC_ERR),
                }
            }
        }
    }
}

/// A send work request the requester has checked and addressed, ready for
/// the transport.
pub(super) struct Outgoing<'a> {
    /// The work request.
    pub(super) wr: &'a SendWr<'a>,
    /// The PD of the sending QP.
    pub(super) pd: u32,
    /// The sending QP's number.
    pub(super) src_qpn: u32,
    /// Sent on a UD QP.
    pub(super) ud: bool,
    /// The destination QPN.
    pub(super) dest_qpn: u32,
    /// The address vector: a UD message's AH, an RC QP's `av`.
    pub(super) av: AddressVector,
    /// UD: the Q_Key the message carries.
    pub(super) qkey: u32,
    /// The local buffers are written (RDMA READ, atomics): they need
    /// LOCAL_WRITE.
    pub(super) writes_local: bool,
    /// The bytes of the message moved before this execution.
    pub(super) start: u64,
    /// The most bytes this execution may move (`u64::MAX`: all).
    pub(super) limit: u64,
    /// The message length.
    pub(super) len: u64,
    /// The part of it this execution moves: offset and length.
    pub(super) part: (u64, u64),
}

/// What the requester reports of one send WQE: its CQE's fields.
#[derive(Debug, Clone, Copy)]
pub(super) struct Completion {
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    byte_len: u32,
}

impl Completion {
    /// A successful completion of `byte_len` bytes.
    fn ok(wr_id: u64, op: WcOpcode, byte_len: u32) -> Self {
        Completion {
            wr_id,
            op,
            status: WcStatus::SUCCESS,
            byte_len,
        }
    }

    /// An error completion (it carries no length, spec 18.14).
    fn failed(wr_id: u64, op: WcOpcode, status: WcStatus) -> Self {
        Completion {
            wr_id,
            op,
            status,
            byte_len: 0,
        }
    }
}

/// Whether send WQE `wr` is malformed on QP `qp` for reasons its opcode
/// decides (spec 18.8): an opcode the QP's type does not allow (UD: SEND
/// and SEND_WITH_IMM only), inline data on an RDMA READ or atomic, an RDMA
/// READ or atomic on a QP whose `max_rd_atomic` is 0, or an atomic while
/// `F_ATOMIC` is not negotiated (`atomics` false).
fn malformed_op(qp: &Qp, wr: &SendWr<'_>, atomics: bool) -> bool {
    let atomic = matches!(
        wr.opcode,
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
    );
    let rd_atomic = atomic || wr.opcode == WrOpcode::RDMA_READ;
    let ud_allowed = matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM);
    (qp.qp_type == QpType::UD && !ud_allowed)
        || (rd_atomic && (wr.inline.is_some() || qp.attr.max_rd_atomic == 0))
        || (atomic && !atomics)
}

/// Completes send WQE `index` of QP `h` with `c` on its send CQ (always
/// for errors); an error, or a CQ that cannot take the CQE, fails the QP.
/// The WQE's slot is released first (spec 18.5: no later than its
/// completion).
pub(super) fn complete_send(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    h: u32,
    index: u32,
    c: Completion,
) -> Step {
    let Some((db_gpa, send_cq, qpn)) = ctrl.res.qps.get(h).map(|q| (q.db_gpa, q.send_cq, q.qpn))
    else {
        return Step::Done { published: false };
    };
    let _ = doorbell::store(mem, db_gpa, QpDoorbell::SQ_CI, index.wrapping_add(1));
    let Completion {
        wr_id,
        op,
        status,
        byte_len,
    } = c;
    let cqe = if status == WcStatus::SUCCESS {
        Cqe {
            wr_id,
            opcode: op as u8,
            status: status as u8,
            byte_len,
            qpn,
            ..Cqe::default()
        }
    } else {
        completer::error_cqe(wr_id, op, status, qpn)
    };
    if status != WcStatus::SUCCESS {
        if let Some(t) = traffic(ctrl) {
            TrafficCounters::add_single_writer(&t.error_cqes, 1);
        }
    }
    let ok = completer::complete(ctrl, mem, send_cq, cqe);
    if status != WcStatus::SUCCESS || !ok {
        ctrl.qp_enter_err(h, None);
    }
    Step::Done { published: true }
}

/// What to do with the WQE at the head of the send queue.
pub(super) enum Step {
    /// Completed (successfully or not); move on.
    Done {
        /// Whether `sq_ci` past this WQE has been stored already (before
        /// its completion).
        published: bool,
    },
    /// Wait for a retry (spec 18.20); the WQE stays at the head.
    Wait(SendWait),
    /// A piece of a message was moved; the WQE stays at the head
    /// ([`Qp::rt`]`.partial`) until its last piece.
    Piece,
    /// The send queue is unusable and the QP failed; the WQE was not taken.
    Broken,
    /// The responder's VM was locked by its control path: the WQE stays at
    /// the head, untouched, for the next service.
    Busy,
}

/// Segment lists of this many entries and more are not kept between work
/// requests: one huge message must not leave the engine holding its
/// translation (16 bytes a page) for good.
const SCRATCH_KEEP: usize = 4096;

/// Gives back what one work request made the scratch lists grow past
/// [`SCRATCH_KEEP`].
fn shrink_scratch(local: &mut Vec<Segment>, resp: &mut RespScratch) {
    for v in [local, &mut resp.segs] {
        if v.capacity() > SCRATCH_KEEP {
            v.clear();
            v.shrink_to(SCRATCH_KEEP);
        }
    }
}

/// The requester's completion opcode for a work request opcode.
pub(super) fn wc_opcode(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM => WcOpcode::SEND,
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => WcOpcode::RDMA_WRITE,
        WrOpcode::RDMA_READ => WcOpcode::RDMA_READ,
        WrOpcode::ATOMIC_CMP_AND_SWP => WcOpcode::COMP_SWAP,
        WrOpcode::ATOMIC_FETCH_AND_ADD => WcOpcode::FETCH_ADD,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{self, send_wr as wr};

    /// Spec 18.8: what a send WQE's opcode rules out on its QP.
    #[test]
    fn malformed_ops() {
        use WrOpcode::*;
        let mut rc = testing::qp(QpType::RC);
        rc.attr.max_rd_atomic = 1;
        for op in [
            RDMA_WRITE,
            RDMA_WRITE_WITH_IMM,
            SEND,
            SEND_WITH_IMM,
            RDMA_READ,
        ] {
            assert!(!malformed_op(&rc, &wr(op, None), false), "{op:?} on RC");
        }
        for op in [ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD] {
            assert!(!malformed_op(&rc, &wr(op, None), true), "{op:?}, F_ATOMIC");
            assert!(
                malformed_op(&rc, &wr(op, None), false),
                "{op:?} without F_ATOMIC"
            );
            assert!(
                malformed_op(&rc, &wr(op, Some(&[0; 8])), true),
                "inline {op:?}"
            );
        }
        assert!(
            malformed_op(&rc, &wr(RDMA_READ, Some(&[0; 8])), true),
            "inline READ"
        );
        assert!(
            !malformed_op(&rc, &wr(RDMA_WRITE, Some(&[0; 8])), true),
            "inline WRITE"
        );
        rc.attr.max_rd_atomic = 0;
        for op in [RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD] {
            assert!(
                malformed_op(&rc, &wr(op, None), true),
                "{op:?}, max_rd_atomic 0"
            );
        }
        assert!(!malformed_op(&rc, &wr(SEND, None), true));
        let mut ud = testing::qp(QpType::UD);
        ud.attr.max_rd_atomic = 1;
        for op in [SEND, SEND_WITH_IMM] {
            assert!(
                !malformed_op(&ud, &wr(op, Some(&[1])), true),
                "{op:?} on UD"
            );
        }
        for op in [
            RDMA_WRITE,
            RDMA_WRITE_WITH_IMM,
            RDMA_READ,
            ATOMIC_FETCH_AND_ADD,
        ] {
            assert!(malformed_op(&ud, &wr(op, None), true), "{op:?} on UD");
        }
    }
}
