//! The requester: it takes a QP's send WQEs in bursts, checks each (format,
//! opcode, lengths, address handle), hands it to the RNIC
//! ([`crate::rnic_path::RnicPath::post_send`]), and completes it on the
//! send CQ, now or when the RNIC reports it ([`complete_posted`]).

use std::time::Instant;

use virtio_rdma_abi::config::{F_MEM_MGT, F_MW};
use virtio_rdma_abi::datapath::{Cqe, QpDoorbell, WcOpcode, WcStatus, WrOpcode, WQE_SIGNALED};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{
    AddressVector, QpState, QpType, GSI_QKEY, GSI_QPN, MAX_MAD_BYTES, QP_FLAG_SIG_ALL,
};

use super::completer::{self, traffic};
use super::doorbell;
use super::fastreg;
use super::scratch::Scratch;
use super::wqe::{fetch_send, posted, prefetch_send_wqe, WqeError, PREFETCH_AHEAD};
use super::Engine;
use crate::memory::HostMem;
use crate::resources::Qp;
use crate::rnic_path::{Head, Outgoing, RnicPath, Room, SendWr, Serving, Step};
use crate::stats::TrafficCounters;
use crate::vm::VmState;

/// `remote_qkey` bit 31: the message carries the sending QP's own Q_Key
/// instead (spec 18.8, 18.11.5).
const QKEY_USE_OWN: u32 = 1 << 31;

impl Engine {
    /// Takes send work of QP `h` (in RTS, or in SQD with work started) up
    /// to producer index `sq_pi`: a burst, unless its head WQE waits.
    pub(super) fn run_sq<P: RnicPath>(
        &self,
        path: &P,
        cx: &mut Serving<'_>,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let Some(qp) = cx.state.res.qps.get(h) else {
            return false;
        };
        if qp.rt.sq_ci == sq_pi {
            return false;
        }
        // The head WQE waits (a retry): nothing to do before its timer
        // ends; later WQEs wait behind it.
        if let Head::WaitUntil(at) = path.head(qp) {
            scratch.timer(at);
            return false;
        }
        let ran = path.with_burst(cx, h, scratch, |cx, b, scratch| {
            self.burst(path, cx, b, h, sq_pi, scratch)
        });
        ran.unwrap_or_else(|| {
            // A VM's lock was busy: this QP waits for the next sweep.
            scratch.contended = true;
            false
        })
    }

    /// Executes up to a burst ([`crate::qos::rate_limits::grain_of`] the
    /// VM's weight) of send WQEs of QP `h`.
    pub(super) fn burst<P: RnicPath>(
        &self,
        path: &P,
        cx: &mut Serving<'_>,
        b: &mut P::Burst<'_>,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let (vm_id, mem) = (cx.vm, cx.mem);
        let mut did = false;
        let mut published = None;
        let traffic = self.tenancy.traffic(vm_id);
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
            let Some(qp) = cx.state.res.qps.get(h) else {
                break;
            };
            let startable =
                qp.state == QpState::RTS || (qp.state == QpState::SQD && qp.rt.in_flight());
            if !startable || qp.rt.sq_ci == sq_pi {
                break;
            }
            let head = path.head(qp);
            if let Head::WaitUntil(at) = head {
                scratch.timer(at);
                break;
            }
            if posted(sq_pi, qp.rt.sq_ci, qp.sq_depth).is_none() {
                // The driver claims more WQEs than the ring holds.
                cx.state.qp_enter_err(h, Some(EventKind::QP_FATAL));
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
            let index = qp.rt.sq_ci;
            // A WQE a few slots on, if the driver has posted it: its lines
            // come from the driver's CPU while this one executes.
            if sq_pi.wrapping_sub(index) > PREFETCH_AHEAD {
                prefetch_send_wqe(mem, qp, index.wrapping_add(PREFETCH_AHEAD));
            }
            let room = Room {
                max_bytes,
                moved: bytes,
            };
            let outcome = match head {
                Head::Failed(wr_id, op, status) => {
                    let c = Completion::failed(wr_id, op, status);
                    complete_send(cx.state, mem, h, index, c)
                }
                _ => self.execute(path, cx, b, h, index, room, scratch),
            };
            let Some(qp) = cx.state.res.qps.get_mut(h) else {
                break;
            };
            match outcome {
                Step::Wait(at) => {
                    // Each try (an RNR or a transport retry) is work the
                    // guest caused: a work request to its rate limits, as
                    // to its share (the pass charges the service).
                    scratch.timer(at);
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
                Step::Done { .. } | Step::InFlight => {
                    wqes = wqes.saturating_add(1);
                    qp.rt.wait = None;
                    qp.rt.partial = None;
                    qp.rt.sq_ci = index.wrapping_add(1);
                    match outcome {
                        Step::Done { published: p } => {
                            published = p.then_some(qp.rt.sq_ci);
                        }
                        // Its completion comes later (`complete_posted`).
                        _ => qp.rt.outstanding = qp.rt.outstanding.saturating_add(1),
                    }
                    let moved = std::mem::take(&mut scratch.moved);
                    // What the QoS charges: the payload, and the work of a
                    // fast registration, which moves none.
                    let cost = moved.saturating_add(std::mem::take(&mut scratch.work));
                    if let Some(t) = traffic {
                        TrafficCounters::add_single_writer(&t.send_ops, 1);
                        TrafficCounters::add_single_writer(&t.send_bytes, moved);
                    }
                    TrafficCounters::add_single_writer(&self.counters.wqes, 1);
                    TrafficCounters::add_single_writer(&self.counters.bytes, moved);
                    scratch.limits.charge(vm_id, cost);
                    bytes = bytes.saturating_add(cost);
                    scratch.executed.0 = scratch.executed.0.saturating_add(1);
                    scratch.executed.1 = scratch.executed.1.saturating_add(cost);
                }
                Step::Broken | Step::Busy => break,
            }
            if bytes >= max_bytes {
                break;
            }
        }
        // The consumer index of the WQEs taken in this burst, once (those
        // with a completion published it before writing it).
        if let Some(qp) = cx.state.res.qps.get(h) {
            if did && published != Some(qp.rt.sq_ci) {
                let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
            }
        }
        did
    }

    /// Takes send WQE `index` of QP `h`: checks it (format, opcode,
    /// lengths, address handle), addresses it and hands it to the
    /// RNIC, or completes it with the requester's error.
    #[allow(clippy::too_many_arguments)]
    fn execute<P: RnicPath>(
        &self,
        path: &P,
        cx: &mut Serving<'_>,
        b: &mut P::Burst<'_>,
        h: u32,
        index: u32,
        room: Room,
        scratch: &mut Scratch<P::Scratch>,
    ) -> Step {
        let mem = cx.mem;
        let Some(qp) = cx.state.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (pd, qpn, qp_type, sig_all) =
            (qp.pd, qp.qpn, qp.qp_type, qp.flags & QP_FLAG_SIG_ALL != 0);
        let Scratch {
            wqe,
            path: ts,
            moved,
            work,
            ..
        } = scratch;
        match fetch_send(mem, qp, index, wqe) {
            Ok(wr) => {
                let negotiated = (
                    cx.state.atomics_negotiated(),
                    cx.state.has(F_MEM_MGT),
                    cx.state.has(F_MW),
                );
                let malformed = malformed_op(qp, &wr, negotiated);
                if !malformed && fastreg::is_local(wr.opcode) {
                    // Executed here, in the queue's order, and completed at
                    // once (spec 18.27).
                    let (outcome, charged) = fastreg::execute(cx.state, mem, h, &wr);
                    *work = charged;
                    let (wr_id, op) = (wr.hdr.wr_id, wc_opcode(wr.opcode));
                    let c = match outcome {
                        Ok(()) if !sig_all && wr.hdr.flags & WQE_SIGNALED == 0 => {
                            return Step::Done { published: false };
                        }
                        Ok(()) => Completion::ok(wr_id, op, 0),
                        Err(status) => Completion::failed(wr_id, op, status),
                    };
                    return complete_send(cx.state, mem, h, index, c);
                }
                match self.address(cx.state, qp, &wr, malformed) {
                    Ok((dest_qpn, av, qkey, len)) => {
                        let op = wc_opcode(wr.opcode);
                        let msg = Outgoing {
                            op,
                            qp: h,
                            index,
                            wr: &wr,
                            pd,
                            src_qpn: qpn,
                            qp_type,
                            dest_qpn,
                            av,
                            qkey,
                            writes_local: matches!(
                                op,
                                WcOpcode::RDMA_READ | WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD
                            ),
                            signaled: sig_all || wr.hdr.flags & WQE_SIGNALED != 0,
                            len,
                            room,
                        };
                        path.post_send(cx, b, ts, moved, &msg)
                    }
                    Err(status) => {
                        let c = Completion::failed(wr.hdr.wr_id, wc_opcode(wr.opcode), status);
                        complete_send(cx.state, mem, h, index, c)
                    }
                }
            }
            Err(WqeError::Unusable) => {
                // The ring is not in guest RAM: the queue is unusable, the
                // QP fails with QP_FATAL and the WQE is not taken (spec
                // 18.18).
                cx.state.qp_enter_err(h, Some(EventKind::QP_FATAL));
                Step::Broken
            }
            Err(WqeError::Malformed { wr_id, opcode }) => {
                let op = opcode.map_or(WcOpcode::SEND, wc_opcode);
                let c = Completion::failed(wr_id, op, WcStatus::LOC_QP_OP_ERR);
                complete_send(cx.state, mem, h, index, c)
            }
        }
    }

    /// The destination of send work request `wr` of QP `qp`, after the
    /// checks of its lengths and address handle: the destination QPN, the
    /// address vector, the Q_Key and the message length; or the
    /// requester's error status (a `malformed` WQE fails here).
    #[inline(always)]
    fn address(
        &self,
        state: &VmState,
        qp: &Qp,
        wr: &SendWr<'_>,
        malformed: bool,
    ) -> Result<(u32, AddressVector, u32, u64), WcStatus> {
        if malformed {
            return Err(WcStatus::LOC_QP_OP_ERR);
        }
        let op = wc_opcode(wr.opcode);
        // The message length first, from the SGE lengths alone, before any
        // of it is looked up or translated (a message over a huge MR of one
        // repeated page costs its sender nothing; its translation would
        // cost the engine). At most 30 SGEs of 4 GiB: no overflow.
        let total: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        let len = wr.inline.map_or(total, |d| d.len() as u64);
        let caps = &self.caps;
        if len > u64::from(caps.max_msg_size) {
            return Err(WcStatus::LOC_LEN_ERR);
        }
        if matches!(op, WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD) && len != 8 {
            return Err(WcStatus::LOC_QP_OP_ERR);
        }
        let ud = qp.qp_type.datagram();
        // A UD message is one packet: at most the MTU (spec 18.11); a
        // GSI QP's one MAD (spec 18.26).
        if ud && len > u64::from(caps.max_ud_payload()) {
            return Err(WcStatus::LOC_LEN_ERR);
        }
        let gsi = qp.qp_type == QpType::GSI;
        if gsi && len > u64::from(MAX_MAD_BYTES) {
            return Err(WcStatus::LOC_LEN_ERR);
        }
        let (dest_qpn, av) = if ud {
            let ah = state
                .res
                .ahs
                .get(wr.hdr.ah_handle)
                .filter(|a| a.pd == qp.pd)
                .ok_or(WcStatus::LOC_QP_OP_ERR)?;
            (wr.hdr.remote_qpn, ah.av)
        } else {
            (qp.attr.dest_qpn, qp.attr.av)
        };
        let qkey = if gsi {
            // `remote_qkey` is ignored: a MAD carries the GSI's Q_Key.
            GSI_QKEY
        } else if wr.hdr.remote_qkey & QKEY_USE_OWN != 0 {
            qp.attr.qkey
        } else {
            wr.hdr.remote_qkey
        };
        Ok((dest_qpn, av, qkey, len))
    }
}

/// What the requester reports of one send WQE: its CQE's fields.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    byte_len: u32,
}

impl Completion {
    /// A successful completion of `byte_len` bytes.
    pub fn ok(wr_id: u64, op: WcOpcode, byte_len: u32) -> Self {
        Completion {
            wr_id,
            op,
            status: WcStatus::SUCCESS,
            byte_len,
        }
    }

    /// An error completion (it carries no length, spec 18.14).
    pub fn failed(wr_id: u64, op: WcOpcode, status: WcStatus) -> Self {
        Completion {
            wr_id,
            op,
            status,
            byte_len: 0,
        }
    }
}

/// Whether send WQE `wr` is malformed on QP `qp` for reasons its opcode
/// decides (spec 18.8, 18.26, 18.27): an opcode the QP's type does not
/// allow (UD: SEND, SEND_WITH_IMM, REG_MR and LOCAL_INV only; UC: those
/// and the RDMA WRITEs; GSI: SEND and SEND_WITH_IMM to QP 1 only), inline data on an RDMA READ or atomic,
/// an RDMA READ or atomic on a QP whose `max_rd_atomic` is 0, an atomic
/// while `F_ATOMIC` is not negotiated (`atomics` false), one of
/// `F_MEM_MGT`'s opcodes without it (`mem_mgt` false), a BIND_MW without
/// `F_MW` (`windows` false) or on another QP than RC, or a REG_MR,
/// LOCAL_INV or BIND_MW with inline data or SGEs.
fn malformed_op(qp: &Qp, wr: &SendWr<'_>, (atomics, mem_mgt, windows): (bool, bool, bool)) -> bool {
    let atomic = matches!(
        wr.opcode,
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
    );
    let rd_atomic = atomic || wr.opcode == WrOpcode::RDMA_READ;
    let local = fastreg::is_local(wr.opcode);
    let bind = wr.opcode == WrOpcode::BIND_MW;
    let ud_allowed =
        (local && !bind) || matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM);
    // UC: SENDs and WRITEs (spec 18.11.6); no READ, atomics or responses.
    let uc_allowed = ud_allowed
        || matches!(
            wr.opcode,
            WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM
        );
    let mem_op = (local && !bind) || wr.opcode == WrOpcode::SEND_WITH_INV;
    (mem_op && !mem_mgt)
        || (bind && (!windows || qp.qp_type != QpType::RC))
        || (qp.qp_type.datagram() && !ud_allowed)
        || (qp.qp_type == QpType::UC && !uc_allowed)
        || (qp.qp_type == QpType::GSI && (local || wr.hdr.remote_qpn != GSI_QPN))
        || (local && (wr.inline.is_some() || !wr.sges.is_empty()))
        || (rd_atomic && (wr.inline.is_some() || qp.attr.max_rd_atomic == 0))
        || (atomic && !atomics)
}

/// Completes send WQE `index` of QP `h` with `c` on its send CQ (always
/// for errors); an error, or a CQ that cannot take the CQE, fails the QP.
/// The WQE's slot is released first (spec 18.5: no later than its
/// completion).
pub fn complete_send(
    state: &mut VmState,
    mem: &HostMem,
    h: u32,
    index: u32,
    c: Completion,
) -> Step {
    let Some(db_gpa) = state.res.qps.get(h).map(|q| q.db_gpa) else {
        return Step::Done { published: false };
    };
    let _ = doorbell::store(mem, db_gpa, QpDoorbell::SQ_CI, index.wrapping_add(1));
    write_send_cqe(state, mem, h, c);
    Step::Done { published: true }
}

/// Completes a send WQE of QP `h` that the RNIC took earlier
/// ([`Step::InFlight`]) with `c`, in the order the QP's WQEs were taken:
/// its CQE on the send CQ (an RNIC reports a success only for a
/// signaled WQE); an error, or a CQ that cannot take the CQE, fails the
/// QP. Its slot was released when it was taken.
pub fn complete_posted(state: &mut VmState, mem: &HostMem, h: u32, c: Completion) {
    let Some(qp) = state.res.qps.get_mut(h) else {
        return;
    };
    qp.rt.outstanding = qp.rt.outstanding.saturating_sub(1);
    write_send_cqe(state, mem, h, c);
}

/// An unsignaled send WQE of QP `h` that the RNIC took earlier
/// completed successfully: no CQE, it is no longer in flight.
pub fn posted_done(state: &mut VmState, h: u32) {
    if let Some(qp) = state.res.qps.get_mut(h) {
        qp.rt.outstanding = qp.rt.outstanding.saturating_sub(1);
    }
}

/// Writes the CQE of `c` for QP `h` on its send CQ; fails the QP on an
/// error or when the CQ cannot take it.
fn write_send_cqe(state: &mut VmState, mem: &HostMem, h: u32, c: Completion) {
    let Some((send_cq, qpn)) = state.res.qps.get(h).map(|q| (q.send_cq, q.qpn)) else {
        return;
    };
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
        if let Some(t) = traffic(state) {
            TrafficCounters::add_single_writer(&t.error_cqes, 1);
        }
    }
    let ok = completer::complete(state, mem, send_cq, cqe);
    if status != WcStatus::SUCCESS || !ok {
        state.qp_enter_err(h, None);
    }
}

/// The requester's completion opcode for a work request opcode.
pub fn wc_opcode(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM | WrOpcode::SEND_WITH_INV => WcOpcode::SEND,
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => WcOpcode::RDMA_WRITE,
        WrOpcode::RDMA_READ => WcOpcode::RDMA_READ,
        WrOpcode::ATOMIC_CMP_AND_SWP => WcOpcode::COMP_SWAP,
        WrOpcode::ATOMIC_FETCH_AND_ADD => WcOpcode::FETCH_ADD,
        WrOpcode::REG_MR => WcOpcode::REG_MR,
        WrOpcode::LOCAL_INV => WcOpcode::LOCAL_INV,
        WrOpcode::BIND_MW => WcOpcode::BIND_MW,
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
            assert!(
                !malformed_op(&rc, &wr(op, None), (false, false, false)),
                "{op:?} on RC"
            );
        }
        for op in [ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD] {
            assert!(
                !malformed_op(&rc, &wr(op, None), (true, false, false)),
                "{op:?}, F_ATOMIC"
            );
            assert!(
                malformed_op(&rc, &wr(op, None), (false, false, false)),
                "{op:?} without F_ATOMIC"
            );
            assert!(
                malformed_op(&rc, &wr(op, Some(&[0; 8])), (true, false, false)),
                "inline {op:?}"
            );
        }
        assert!(
            malformed_op(&rc, &wr(RDMA_READ, Some(&[0; 8])), (true, false, false)),
            "inline READ"
        );
        assert!(
            !malformed_op(&rc, &wr(RDMA_WRITE, Some(&[0; 8])), (true, false, false)),
            "inline WRITE"
        );
        rc.attr.max_rd_atomic = 0;
        for op in [RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD] {
            assert!(
                malformed_op(&rc, &wr(op, None), (true, false, false)),
                "{op:?}, max_rd_atomic 0"
            );
        }
        assert!(!malformed_op(&rc, &wr(SEND, None), (true, false, false)));
        let mut ud = testing::qp(QpType::UD);
        ud.attr.max_rd_atomic = 1;
        for op in [SEND, SEND_WITH_IMM] {
            assert!(
                !malformed_op(&ud, &wr(op, Some(&[1])), (true, false, false)),
                "{op:?} on UD"
            );
        }
        for op in [
            RDMA_WRITE,
            RDMA_WRITE_WITH_IMM,
            RDMA_READ,
            ATOMIC_FETCH_AND_ADD,
        ] {
            assert!(
                malformed_op(&ud, &wr(op, None), (true, false, false)),
                "{op:?} on UD"
            );
        }
    }

    /// Spec 18.8, 18.27: the opcodes of `F_MEM_MGT` are malformed without
    /// it; REG_MR and LOCAL_INV run on RC and UD QPs without inline data
    /// or SGEs, SEND_WITH_INV on RC only.
    #[test]
    fn malformed_memory_operations() {
        use WrOpcode::*;
        let rc = testing::qp(QpType::RC);
        let ud = testing::qp(QpType::UD);
        for op in [REG_MR, LOCAL_INV, SEND_WITH_INV] {
            assert!(
                malformed_op(&rc, &wr(op, None), (true, false, false)),
                "{op:?}"
            );
            assert!(
                malformed_op(&ud, &wr(op, None), (true, false, false)),
                "{op:?}"
            );
        }
        for op in [REG_MR, LOCAL_INV] {
            for q in [&rc, &ud] {
                assert!(
                    !malformed_op(q, &wr(op, None), (true, true, false)),
                    "{op:?}"
                );
                assert!(
                    malformed_op(q, &wr(op, Some(&[])), (true, true, false)),
                    "inline {op:?}"
                );
                let sge = [virtio_rdma_abi::datapath::Sge::default()];
                let with_sge = SendWr {
                    sges: &sge,
                    ..wr(op, None)
                };
                assert!(
                    malformed_op(q, &with_sge, (true, true, false)),
                    "{op:?} with an SGE"
                );
            }
        }
        assert!(!malformed_op(
            &rc,
            &wr(SEND_WITH_INV, None),
            (true, true, false)
        ));
        assert!(!malformed_op(
            &rc,
            &wr(SEND_WITH_INV, Some(&[1])),
            (true, true, false)
        ));
        assert!(malformed_op(
            &ud,
            &wr(SEND_WITH_INV, None),
            (true, true, false)
        ));
    }

    /// Spec 18.8, 18.29: BIND_MW is malformed without `F_MW`, on a QP
    /// other than RC, and with inline data or SGEs.
    #[test]
    fn malformed_binds() {
        use WrOpcode::BIND_MW;
        let rc = testing::qp(QpType::RC);
        let ud = testing::qp(QpType::UD);
        assert!(!malformed_op(&rc, &wr(BIND_MW, None), (true, false, true)));
        assert!(malformed_op(&rc, &wr(BIND_MW, None), (true, true, false)));
        assert!(malformed_op(&ud, &wr(BIND_MW, None), (true, true, true)));
        assert!(malformed_op(
            &rc,
            &wr(BIND_MW, Some(&[])),
            (true, true, true)
        ));
        let sge = [virtio_rdma_abi::datapath::Sge::default()];
        let with_sge = SendWr {
            sges: &sge,
            ..wr(BIND_MW, None)
        };
        assert!(malformed_op(&rc, &with_sge, (true, true, true)));
    }

    /// Spec 18.8, 18.11.6: UC runs SENDs, WRITEs and the local operations;
    /// READ, atomics, SEND_WITH_INV and BIND_MW are malformed on it.
    #[test]
    fn malformed_on_uc() {
        use WrOpcode::*;
        let mut uc = testing::qp(QpType::UC);
        uc.attr.max_rd_atomic = 1;
        for op in [
            SEND,
            SEND_WITH_IMM,
            RDMA_WRITE,
            RDMA_WRITE_WITH_IMM,
            LOCAL_INV,
        ] {
            assert!(
                !malformed_op(&uc, &wr(op, None), (true, true, true)),
                "{op:?}"
            );
        }
        for op in [
            RDMA_READ,
            ATOMIC_CMP_AND_SWP,
            ATOMIC_FETCH_AND_ADD,
            SEND_WITH_INV,
            BIND_MW,
        ] {
            assert!(
                malformed_op(&uc, &wr(op, None), (true, true, true)),
                "{op:?}"
            );
        }
    }
}
