//! The requester: it takes a QP's send WQEs in bursts, checks each (format,
//! opcode, lengths, local buffers, address handle), hands it to the
//! transport, and completes it on the send CQ.

use std::time::Instant;

use log::debug;
use virtio_rdma_abi::datapath::{
    Cqe, QpDoorbell, WcOpcode, WcStatus, WrOpcode, WQE_FENCE, WQE_SIGNALED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType, QP_FLAG_SIG_ALL};

use super::completer::{self, traffic};
use super::doorbell;
use super::sge::{check_local, local_range};
use super::soft::pieces::{ALONE_PIECE, PIECE};
use super::soft::retry::{exhausted, rnr_retry, transport_retry, waiting};
use super::soft::route::{deliver, same_thread, Held};
use super::soft::{Request, RespOutcome, RespScratch};
use super::thread::Scratch;
use super::wqe::{fetch_send, SendWr, WqeError};
use super::Engine;
use crate::ctrl::Ctrl;
use crate::device::{Locked, RdmaDevice};
use crate::memory::access::Segment;
use crate::memory::HostMem;
use crate::resources::{Qp, SendPartial, SendWait};
use crate::stats::TrafficCounters;
use std::sync::Arc;

/// `remote_qkey` bit 31: the message carries the sending QP's own Q_Key
/// instead (spec 18.8, 18.11.5).
const QKEY_USE_OWN: u32 = 1 << 31;

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_sq(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
    ) -> bool {
        let Some(qp) = ctrl.res.qps.get(h) else {
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
        // An RC QP talks to one QP: lock its VM once for the burst (never
        // a VM of another tenant: `deliver` refuses that route untouched).
        if qp.qp_type == QpType::RC {
            let tenancy = &self.shared.tenancy;
            let route = self.rc_route(ctrl, h);
            if let Some((pvm, _)) = route.filter(|&(v, _)| {
                v != vm_id && tenancy.may_reach(vm_id, v) && same_thread(vms, vm_id, v)
            }) {
                if let Some(dev) = vms.get(pvm).and_then(Option::as_ref) {
                    let done = dev.try_with_dataplane(|pctrl, pmem| {
                        let mut held = Held {
                            vm: pvm,
                            dev,
                            ctrl: pctrl,
                            mem: pmem,
                        };
                        let did =
                            self.burst(vms, vm_id, ctrl, mem, h, sq_pi, scratch, Some(&mut held));
                        if !held.ctrl.events.is_empty() {
                            dev.wake_events();
                        }
                        did
                    });
                    match done {
                        Locked::Ran(did) => return did,
                        // The peer's control path holds its lock: this QP
                        // waits for the next sweep (its messages would only
                        // find the lock busy).
                        Locked::Busy => {
                            scratch.contended = true;
                            return false;
                        }
                        Locked::Gone => {}
                    }
                }
            }
        }
        self.burst(vms, vm_id, ctrl, mem, h, sq_pi, scratch, None)
    }

    /// Executes up to a burst ([`sched::grain_of`] the VM's weight) of
    /// send WQEs of QP `h`.
    #[allow(clippy::too_many_arguments)]
    fn burst(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
        mut held: Option<&mut Held<'_>>,
    ) -> bool {
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
        // A piece of a WRITE executed in pieces counts towards the burst's
        // bytes, not its work requests: every piece moves at least `PIECE`
        // bytes, so the burst ends.
        while wqes < max_wqes {
            let Some(qp) = ctrl.res.qps.get(h) else {
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
            if sq_pi.wrapping_sub(qp.rt.sq_ci) > qp.sq_depth {
                // The driver claims more WQEs than the ring holds.
                fail(ctrl, h, Some(EventKind::QP_FATAL));
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
            // Split: the piece takes what is left of the burst's bytes, and
            // at least `PIECE` (a message that fits runs whole). Alone, a
            // message still runs in pieces of `ALONE_PIECE`: whoever starts
            // work next waits for one piece, not for up to 2 GiB.
            scratch.piece = if scratch.split {
                max_bytes.saturating_sub(bytes).max(PIECE)
            } else {
                ALONE_PIECE.max(max_bytes)
            };
            let index = qp.rt.sq_ci;
            let outcome = match exhausted(qp) {
                // The last transport retry found the destination
                // unreachable, and its timeout has passed (spec 18.20).
                Some((wr_id, op)) => {
                    complete_send(ctrl, mem, h, index, wr_id, op, WcStatus::RETRY_EXC_ERR, 0)
                }
                None => self.execute(
                    vms,
                    vm_id,
                    ctrl,
                    mem,
                    h,
                    index,
                    scratch,
                    held.as_deref_mut(),
                ),
            };
            let Some(qp) = ctrl.res.qps.get_mut(h) else {
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
        if let Some(qp) = ctrl.res.qps.get(h) {
            if did && published != Some(qp.rt.sq_ci) {
                let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
            }
        }
        did
    }

    /// Executes send WQE `index` of QP `h`, writing its completion.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        index: u32,
        scratch: &mut Scratch,
        mut held: Option<&mut Held<'_>>,
    ) -> Step {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (pd, qpn, qp_type, sig_all) =
            (qp.pd, qp.qpn, qp.qp_type, qp.flags & QP_FLAG_SIG_ALL != 0);
        // A plain RDMA WRITE this QP has partly executed (spec: pieces).
        let partial = qp.rt.partial.filter(|p| p.index == index);
        let Scratch {
            wqe: wqe_buf,
            local,
            resp,
            moved,
            piece,
            ..
        } = scratch;
        let wr = match fetch_send(mem, qp, index, wqe_buf) {
            Ok(wr) => wr,
            Err(WqeError::Unusable) => {
                // The ring is not in guest RAM: the queue is unusable, the
                // QP fails with QP_FATAL and the WQE is not taken (spec
                // 18.18).
                fail(ctrl, h, Some(EventKind::QP_FATAL));
                return Step::Broken;
            }
            Err(WqeError::Malformed { wr_id, opcode }) => {
                let op = opcode.map_or(WcOpcode::SEND, wc_opcode);
                let status = WcStatus::LOC_QP_OP_ERR;
                return complete_send(ctrl, mem, h, index, wr_id, op, status, 0);
            }
        };
        let malformed = malformed_op(qp, &wr, ctrl.atomics_negotiated());
        let (wr_id, op) = (wr.hdr.wr_id, wc_opcode(wr.opcode));
        // The requester's error completion for this WQE.
        let failed =
            |ctrl: &mut Ctrl, status| complete_send(ctrl, mem, h, index, wr_id, op, status, 0);
        if malformed {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let signaled = sig_all || wr.hdr.flags & WQE_SIGNALED != 0;
        let _fence = wr.hdr.flags & WQE_FENCE != 0; // Operations complete in order here.
        let writes_local = matches!(
            op,
            WcOpcode::RDMA_READ | WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD
        );
        // Every RC message from or into local buffers is executed in
        // pieces (SEND, WRITE, READ; not inline data, atomics or UD, which
        // are small); the burst says how much one execution may move.
        let piecewise = qp_type == QpType::RC
            && wr.inline.is_none()
            && !matches!(
                wr.opcode,
                WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
            );
        if let Some(p) = partial {
            // The guest rewrote a WQE the device had started: it fails
            // rather than resume with other checks than its first piece had.
            let hdr = &wr.hdr;
            if !piecewise
                || wr.opcode != p.opcode
                || hdr.rkey != p.rkey
                || hdr.remote_addr != p.remote_addr
            {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            }
        }
        let start = partial.map_or(0, |p| p.done);
        let limit = if piecewise { *piece } else { u64::MAX };
        // The message length first, from the SGE lengths alone, before any
        // of it is looked up or translated (a message over a huge MR of one
        // repeated page costs its sender nothing; its translation would
        // cost the engine). At most 30 SGEs of 4 GiB: no overflow.
        let total: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        if partial.is_some_and(|p| p.len != total || p.wr_id != wr_id || p.done >= total) {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let len = wr.inline.map_or(total, |d| d.len() as u64);
        if len > u64::from(self.rnic.caps().max_msg_size) {
            return failed(ctrl, WcStatus::LOC_LEN_ERR);
        }
        // The part this execution moves: all of it but for a piece.
        let part = if piecewise {
            // `start < total` (checked above) but for a rewritten WQE.
            let Some(left) = len.checked_sub(start) else {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            };
            (start, limit.min(left))
        } else {
            (0, len)
        };
        let ud = qp_type == QpType::UD;
        if matches!(op, WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD) && len != 8 {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        // A UD message is one packet: at most the MTU (spec 18.11).
        if ud && len > u64::from(self.rnic.caps().max_ud_payload()) {
            return failed(ctrl, WcStatus::LOC_LEN_ERR);
        }
        // Find the responder.
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (dest_qpn, av) = if ud {
            let Some(ah) = ctrl.res.ahs.get(wr.hdr.ah_handle).filter(|a| a.pd == pd) else {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            };
            (wr.hdr.remote_qpn, ah.av)
        } else {
            (qp.attr.dest_qpn, qp.attr.av)
        };
        let dgid = av.dgid;
        let qkey = if wr.hdr.remote_qkey & QKEY_USE_OWN != 0 {
            qp.attr.qkey
        } else {
            wr.hdr.remote_qkey
        };
        let mut route = if ud {
            self.rnic.lookup_qpn(dest_qpn)
        } else {
            self.rc_route(ctrl, h)
        };
        // An RC message finds its responder before a byte of it is
        // translated: a message to nowhere (retried forever with `timeout`
        // 0) then costs a lookup per try, not its length.
        let unreached = if ud {
            None
        } else {
            self.precheck_rc(vms, vm_id, ctrl, h, &mut route, dgid, held.as_deref())
        };
        let outcome = match unreached {
            Some(outcome) => {
                // Nothing is moved, but a message that could not even be
                // built still fails as such (keys, rights, bounds: a cost
                // in SGEs, not pages).
                if let Err(status) = check_local(ctrl, pd, wr.sges, writes_local) {
                    return failed(ctrl, status);
                }
                outcome
            }
            None => {
                // Every piece resolves only its own part.
                if let Err(status) =
                    local_range(ctrl, pd, wr.sges, writes_local, start, limit, local)
                {
                    return failed(ctrl, status);
                }
                let mut req = Request {
                    admitted: !ud,
                    wr: &wr,
                    vm: vm_id,
                    src_qpn: qpn,
                    src_gid: ctrl.port_gid(),
                    av,
                    local,
                    len,
                    part,
                    mem,
                    dest_qpn,
                    qkey,
                };
                let mut outcome = deliver(
                    vms,
                    vm_id,
                    ctrl,
                    mem,
                    route,
                    dgid,
                    &req,
                    ud,
                    resp,
                    held.as_deref_mut(),
                );
                if matches!(outcome, RespOutcome::Stale) {
                    // The routing hint was stale: resolve the QPN afresh,
                    // once. The number may now belong to another QP of the
                    // VM held for this burst: `deliver` must use that lock,
                    // not take it again.
                    let route = self.relookup(ctrl, h, dest_qpn, !ud);
                    req.admitted = false;
                    outcome = deliver(vms, vm_id, ctrl, mem, route, dgid, &req, ud, resp, held);
                }
                outcome
            }
        };
        shrink_scratch(local, resp);
        // UD gives no delivery guarantee: a message nobody takes is dropped
        // (spec 18.11.5), yet the send succeeded.
        let dropped = matches!(outcome, RespOutcome::Dropped)
            || (ud && matches!(outcome, RespOutcome::Unreachable | RespOutcome::Stale));
        if dropped {
            if let Some(t) = self.shared.tenancy.traffic(vm_id) {
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
            if let Some(q) = ctrl.res.qps.get_mut(h) {
                q.rt.partial = Some(SendPartial {
                    index,
                    done: end,
                    wr_id,
                    len,
                    opcode: wr.opcode,
                    rkey: wr.hdr.rkey,
                    remote_addr: wr.hdr.remote_addr,
                });
            }
            return Step::Piece;
        }
        match outcome {
            RespOutcome::Done | RespOutcome::Dropped => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let ok = WcStatus::SUCCESS;
                    return complete_send(ctrl, mem, h, index, wr_id, op, ok, byte_len);
                }
                Step::Done { published: false }
            }
            // UD gives no delivery guarantee: a message nobody takes is
            // dropped (spec 18.11.5).
            RespOutcome::Unreachable | RespOutcome::Stale if ud => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let ok = WcStatus::SUCCESS;
                    return complete_send(ctrl, mem, h, index, wr_id, op, ok, byte_len);
                }
                Step::Done { published: false }
            }
            RespOutcome::Nak(status) => failed(ctrl, status),
            RespOutcome::Busy => Step::Busy,
            RespOutcome::Unreachable | RespOutcome::Stale => {
                let Some(qp) = ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                debug!("QP {qpn:#x}: destination {dest_qpn:#x} unreachable");
                transport_retry(qp, index, wr_id, op)
            }
            RespOutcome::Rnr(code) => {
                let Some(qp) = ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                match rnr_retry(qp, index, code) {
                    Some(w) => Step::Wait(w),
                    None => failed(ctrl, WcStatus::RNR_RETRY_EXC_ERR),
                }
            }
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

/// Completes send WQE `index` (`wr_id`, completion opcode `op`) of QP `h`
/// with `status` on its send CQ; an error fails the QP. The WQE's slot is
/// released first (spec 18.5: no later than its completion).
#[allow(clippy::too_many_arguments)]
pub(super) fn complete_send(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    h: u32,
    index: u32,
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    len: u32,
) -> Step {
    let Some((db_gpa, send_cq, qpn)) = ctrl.res.qps.get(h).map(|q| (q.db_gpa, q.send_cq, q.qpn))
    else {
        return Step::Done { published: false };
    };
    let _ = doorbell::store(mem, db_gpa, QpDoorbell::SQ_CI, index.wrapping_add(1));
    finish(ctrl, mem, h, send_cq, qpn, wr_id, op, status, len);
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
    /// A piece of a plain RDMA WRITE was written; the WQE stays at the
    /// head ([`Qp::rt`]`.partial`) until its last piece.
    Piece,
    /// The send queue is unusable and the QP failed; the WQE was not taken.
    Broken,
    /// The responder's VM was locked by its control path: the WQE stays at
    /// the head, untouched, for the next service.
    Busy,
}

/// Writes the requester's completion (always for errors) and fails the QP
/// on error.
#[allow(clippy::too_many_arguments)]
fn finish(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    cq: u32,
    qpn: u32,
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    byte_len: u32,
) {
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
    let ok = completer::complete(ctrl, mem, cq, cqe);
    if status != WcStatus::SUCCESS || !ok {
        fail(ctrl, qp, None);
    }
}

/// Moves QP `qp` into ERR with `event` (see [`Ctrl::qp_enter_err`]).
pub(super) fn fail(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    ctrl.qp_enter_err(qp, event);
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
