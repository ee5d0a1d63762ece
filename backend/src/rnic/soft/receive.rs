//! The responder's receive side: peeking and consuming receive WQEs of a
//! QP's receive queue or SRQ, placing a message into their buffers (whole,
//! or piece by piece), and the receive completions.

use virtio_rdma_abi::datapath::{
    ud_grh_payload_length, Cqe, QpDoorbell, Sge, SrqDoorbell, UdGrh, WcOpcode, WcStatus, WrOpcode,
    CQE_GRH, CQE_SOLICITED, CQE_WITH_IMM, CQE_WITH_INV, UD_GRH_SIZE, WQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpType;

use super::request::{copy_in, nak, Request, RespOutcome, RespScratch};
use crate::engine::completer::{complete, error_cqe};
use crate::engine::doorbell::{self, load_pi};
use crate::engine::sge::{local_range, local_segments};
use crate::engine::wqe::{fetch_recv, posted, RecvRing, RecvWr, WqeBuf, WqeError};
use crate::memory::access::{self, Segment};
use crate::memory::HostMem;
use crate::resources::Inbound;
use crate::stats::TrafficCounters;
use crate::vm::VmState;

/// The receive WQE at the head of a responder QP's receive queue or SRQ,
/// copied out of the ring but not consumed yet.
pub(super) enum Head<'s> {
    /// None is posted.
    Empty,
    /// A well-formed WQE.
    Wqe(RecvWr<'s>),
    /// A malformed WQE (spec 18.13), with its `wr_id`.
    Malformed(u64),
}

/// A peeked head and the producer index it was read against.
pub(super) struct Peeked<'s> {
    pub(super) head: Head<'s>,
    pub(super) pi: u32,
}

/// The receive queue or SRQ itself is broken: its doorbell record or ring
/// is not in guest RAM, or its producer index is out of range (spec
/// 18.18). Nothing of it can be trusted, so nothing is consumed.
pub(super) struct Broken;

/// Copies the receive WQE at the head of responder QP `qp`'s queue (its
/// RQ or SRQ) into `scratch` and checks its format, without consuming it:
/// the caller consumes it with [`consume_recv`] once it knows the message
/// is accepted, so that a refused message leaves the queue as it was.
pub(super) fn peek_recv<'s>(
    state: &VmState,
    mem: &HostMem,
    qp: u32,
    scratch: &'s mut WqeBuf,
) -> Result<Peeked<'s>, Broken> {
    let q = state.res.qps.get(qp).ok_or(Broken)?;
    let side = state.res.recv_side(q);
    if side.srq == 0 && q.qp_type == QpType::XRC_TGT {
        // No SRQ bound: it has no receive queue of its own.
        return Err(Broken);
    }
    let (pi, r, ci) = if side.srq != 0 {
        let srq = state.res.srqs.get(side.srq).ok_or(Broken)?;
        if srq.rt.broken {
            return Err(Broken);
        }
        let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ).ok_or(Broken)?;
        (pi, RecvRing::of_srq(srq), srq.rt.ci)
    } else {
        let pi = load_pi(mem, q.db_gpa, q.db_slot.as_ref(), doorbell::RQ).ok_or(Broken)?;
        (pi, RecvRing::of_qp(q), q.rt.rq_ci)
    };
    if posted(pi, ci, r.depth).ok_or(Broken)? == 0 {
        return Ok(Peeked {
            head: Head::Empty,
            pi,
        });
    }
    let fetched = fetch_recv(mem, &r, ci, scratch);
    let head = match fetched {
        Ok(wr) => Head::Wqe(wr),
        Err(WqeError::Malformed { wr_id, .. }) => Head::Malformed(wr_id),
        Err(WqeError::Unusable) => return Err(Broken),
    };
    Ok(Peeked { head, pi })
}

/// Consumes the receive WQE [`peek_recv`] returned for responder QP `qp`
/// (read against producer index `pi`): advances and publishes the consumer
/// index, and for an SRQ checks its limit (spec 18.21).
pub(super) fn consume_recv(state: &mut VmState, mem: &HostMem, qp: u32, pi: u32) {
    let Some(srq_h) = state.res.qps.get(qp).map(|q| state.res.recv_side(q).srq) else {
        return;
    };
    let Some(q) = state.res.qps.get_mut(qp) else {
        return;
    };
    if srq_h == 0 {
        q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
        let _ = doorbell::store(mem, q.db_gpa, QpDoorbell::RQ_CI, q.rt.rq_ci);
        return;
    }
    let Some(srq) = state.res.srqs.get_mut(srq_h) else {
        return;
    };
    srq.rt.ci = srq.rt.ci.wrapping_add(1);
    let _ = doorbell::store(mem, srq.db_gpa, SrqDoorbell::CI, srq.rt.ci);
    let posted = pi.wrapping_sub(srq.rt.ci);
    if srq.limit != 0 && posted < srq.limit {
        srq.limit = 0;
        state.events.push(EventKind::SRQ_LIMIT_REACHED, srq_h, 0);
    }
}

/// Responder QP `qp` found its receive queue broken (spec 18.18, 18.21):
/// its own receive queue fails the QP with `QP_FATAL`; a broken SRQ fails
/// for good with `SRQ_ERROR`, and every QP attached to it goes to ERR with
/// `QP_FATAL`. No completion is written: no WQE of the queue is trusted.
pub(super) fn recv_queue_failed(state: &mut VmState, qp: u32) {
    let Some(srq_h) = state.res.qps.get(qp).map(|q| state.res.recv_side(q).srq) else {
        return;
    };
    if srq_h == 0 {
        state.qp_enter_err(qp, Some(EventKind::QP_FATAL));
        return;
    }
    if let Some(srq) = state.res.srqs.get_mut(srq_h) {
        if !srq.rt.broken {
            srq.rt.broken = true;
            state.events.push(EventKind::SRQ_ERROR, srq_h, 0);
        }
    }
    state.fail_qps(|q| q.srq == srq_h);
    // An XRC_TGT QP is not attached to the SRQ its message named.
    if state
        .res
        .qps
        .get(qp)
        .is_some_and(|q| q.qp_type == QpType::XRC_TGT)
    {
        state.qp_enter_err(qp, Some(EventKind::QP_FATAL));
    }
}

/// Writes the successful receive completion `cqe` of QP `qp` on CQ `cq`.
/// If only that completion is lost, the message was still delivered, so
/// the requester completes normally (spec 18.18, notes); a CQ in error has
/// already failed this QP with QP_FATAL (spec 18.17).
pub(super) fn received(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    cq: u32,
    cqe: Cqe,
) -> RespOutcome {
    if !complete(state, mem, cq, cqe) {
        state.qp_enter_err(qp, None);
    }
    RespOutcome::Done
}

/// A later piece of a message arriving in pieces at responder QP `qp`: it
/// must continue the message the QP's receive WQE was taken for, exactly
/// where the last piece ended; anything else is an invalid request.
pub(super) fn next_piece(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
    last: bool,
) -> RespOutcome {
    let inb = state.res.qps.get_mut(qp).and_then(|q| q.rt.inbound.take());
    let Some(inb) = inb.filter(|i| i.len == req.len && i.placed == req.part.0) else {
        return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
    };
    // (An RDMA WRITE with immediate has its piece of the target in
    // `scratch.segs` already, resolved by `perform`.)
    place_piece(state, mem, qp, req, scratch, *inb, last)
}

/// Places piece `req.part` of a message arriving in pieces (receive WQE
/// `inb`) and, with the last piece, writes the receive completion; else
/// keeps `inb` on the QP for the next piece. For an RDMA WRITE with
/// immediate `scratch.segs` holds the piece's part of the RDMA target.
pub(super) fn place_piece(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
    mut inb: Inbound,
    last: bool,
) -> RespOutcome {
    let Some((side, qpn)) = state
        .res
        .qps
        .get(qp)
        .map(|q| (state.res.recv_side(q), q.qpn))
    else {
        return RespOutcome::Unreachable;
    };
    let (pd, cq) = (side.pd, side.cq);
    let (skip, take) = req.part;
    let segs = &mut scratch.segs;
    if req.wr.opcode != WrOpcode::RDMA_WRITE_WITH_IMM {
        // The receive buffers are checked again for every piece: an MR
        // deregistered meanwhile fails the message.
        if let Err(status) = local_range(state, pd, &inb.sges, true, skip, take, segs) {
            let wr_id = inb.wr_id;
            return piece_failed(state, mem, qp, wr_id, status);
        }
    }
    if copy_in(req, mem, segs).is_err() {
        return piece_failed(state, mem, qp, inb.wr_id, WcStatus::LOC_PROT_ERR);
    }
    inb.placed = skip.saturating_add(take);
    if !last {
        if let Some(q) = state.res.qps.get_mut(qp) {
            q.rt.inbound = Some(Box::new(inb));
        }
        return RespOutcome::Done;
    }
    let cqe = recv_cqe(req, qpn, inb.wr_id, inb.len, false);
    received(state, mem, qp, cq, cqe)
}

/// The receive WQE of a message arriving in pieces (already consumed)
/// cannot take the rest: it completes with `status`, the responder QP goes
/// to ERR, and the requester gets `REM_OP_ERR` (spec 18.18).
fn piece_failed(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    wr_id: u64,
    status: WcStatus,
) -> RespOutcome {
    recv_error(state, mem, qp, wr_id, status);
    state.qp_enter_err(qp, None);
    RespOutcome::Nak(WcStatus::REM_OP_ERR)
}

/// Completes the receive WQE of a message that stopped arriving midway
/// (its sender went away, or sent something else) with `LOC_QP_OP_ERR`.
pub(super) fn abandon(state: &mut VmState, mem: &HostMem, qp: u32, inb: &Inbound) {
    recv_error(state, mem, qp, inb.wr_id, WcStatus::LOC_QP_OP_ERR);
}

/// Writes the error completion `status` of receive WQE `wr_id` of QP `qp`
/// on its receive CQ, and counts it.
fn recv_error(state: &mut VmState, mem: &HostMem, qp: u32, wr_id: u64, status: WcStatus) {
    if let Some(t) = state.tenancy().traffic(state.vm_index()) {
        TrafficCounters::add_single_writer(&t.error_cqes, 1);
    }
    if let Some((cq, qpn)) = state
        .res
        .qps
        .get(qp)
        .map(|q| (state.res.recv_side(q).cq, q.qpn))
    {
        let _ = complete(
            state,
            mem,
            cq,
            error_cqe(wr_id, WcOpcode::RECV, status, qpn),
        );
    }
}

/// A responder QP in ERR whose message was arriving in pieces: its
/// consumed receive WQE completes with `WR_FLUSH_ERR` (spec 18.19).
/// Returns whether there was one.
pub(in crate::rnic) fn flush_inbound(state: &mut VmState, mem: &HostMem, qp: u32) -> bool {
    let Some(cq) = state.res.qps.get(qp).map(|q| state.res.recv_side(q).cq) else {
        return false;
    };
    let Some(q) = state.res.qps.get_mut(qp) else {
        return false;
    };
    let Some(inb) = q.rt.inbound.take() else {
        return false;
    };
    let qpn = q.qpn;
    let cqe = error_cqe(inb.wr_id, WcOpcode::RECV, WcStatus::WR_FLUSH_ERR, qpn);
    let _ = complete(state, mem, cq, cqe);
    true
}

/// Places a SEND's message — for UD behind the GRH — into the buffers of a
/// receive WQE (`sges`) of a QP in PD `pd`, after checking every SGE and
/// the room (spec 18.9, 18.13). Returns the bytes placed.
pub(super) fn place_send(
    state: &VmState,
    mem: &HostMem,
    req: &Request<'_>,
    pd: u32,
    ud: bool,
    sges: &[Sge],
    segs: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    let grh = if ud { u64::from(UD_GRH_SIZE) } else { 0 };
    let needed = grh.saturating_add(req.len);
    let capacity = local_segments(state, pd, sges, true, needed, segs)?;
    if capacity < needed {
        return Err(WcStatus::LOC_LEN_ERR);
    }
    if ud {
        // An IPv6 header, as the RoCEv2 packet would have had (spec 18.13):
        // what libibverbs' ibv_init_ah_from_wc() needs to answer.
        let with_imm = req.wr.opcode == WrOpcode::SEND_WITH_IMM;
        let header = UdGrh {
            traffic_class: req.av.traffic_class,
            flow_label: req.av.flow_label,
            payload_length: ud_grh_payload_length(req.len, with_imm),
            hop_limit: req.av.hop_limit,
            sgid: req.src_gid,
            // The GID the sender addressed: one of this VM's.
            dgid: req.av.dgid,
        }
        .to_bytes();
        access::write(mem, segs, &header).map_err(|_| WcStatus::LOC_PROT_ERR)?;
        skip(segs, grh);
    }
    copy_in(req, mem, segs).map_err(|_| WcStatus::LOC_PROT_ERR)?;
    Ok(needed)
}

/// The successful receive completion of `req` at QP `qpn` (spec 18.14,
/// "Field values of successful completions").
pub(super) fn recv_cqe(req: &Request<'_>, qpn: u32, wr_id: u64, placed: u64, ud: bool) -> Cqe {
    let wr = req.wr;
    let with_imm = matches!(
        wr.opcode,
        WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    // A SEND_WITH_INV reports the key it invalidated where the immediate
    // data would be (spec 18.14, 18.27).
    let with_inv = wr.opcode == WrOpcode::SEND_WITH_INV;
    let mut flags = 0u8;
    if with_imm {
        flags |= CQE_WITH_IMM;
    }
    if with_inv {
        flags |= CQE_WITH_INV;
    }
    if wr.hdr.flags & WQE_SOLICITED != 0 {
        flags |= CQE_SOLICITED;
    }
    if ud {
        flags |= CQE_GRH;
    }
    let opcode = if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
        WcOpcode::RECV_RDMA_WITH_IMM
    } else {
        WcOpcode::RECV
    };
    Cqe {
        wr_id,
        opcode: opcode as u8,
        status: WcStatus::SUCCESS as u8,
        flags,
        owner: 0,
        byte_len: u32::try_from(placed).unwrap_or(u32::MAX),
        imm_data: if with_imm || with_inv {
            wr.hdr.imm_data
        } else {
            0
        },
        qpn,
        // The sender's QPN is reported for UD receives only; RC completions
        // carry 0.
        src_qpn: if ud { req.src_qpn } else { 0 },
        vendor_err: 0,
    }
}

/// The receive WQE `wr_id` of responder QP `qp` (peeked against `pi`)
/// cannot take the message: it is consumed and completes with `status` —
/// an error completion, carrying no message fields (spec 18.14) — and the
/// responder QP goes to ERR without an event (spec 18.18). The RC
/// requester fails with `REM_INV_REQ_ERR` for a length error and
/// `REM_OP_ERR` otherwise; a UD message counts as delivered.
pub(super) fn recv_failed(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    pi: u32,
    wr_id: u64,
    status: WcStatus,
    ud: bool,
) -> RespOutcome {
    consume_recv(state, mem, qp, pi);
    recv_error(state, mem, qp, wr_id, status);
    state.qp_enter_err(qp, None);
    if ud {
        return RespOutcome::Dropped;
    }
    RespOutcome::Nak(if status == WcStatus::LOC_LEN_ERR {
        WcStatus::REM_INV_REQ_ERR
    } else {
        WcStatus::REM_OP_ERR
    })
}

/// Drops the first `n` bytes of `segs` (in place).
fn skip(segs: &mut Vec<Segment>, mut n: u64) {
    let mut whole = 0usize;
    for s in segs.iter_mut() {
        if let Some(rest) = n.checked_sub(s.len) {
            n = rest;
            // At most `segs.len()`.
            whole = whole.saturating_add(1);
            continue;
        }
        // `n < s.len`: the rest of a valid range.
        s.gpa = s.gpa.saturating_add(n);
        s.len = s.len.saturating_sub(n);
        break;
    }
    segs.drain(..whole);
}
