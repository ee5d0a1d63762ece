//! The responder: remote checks (rkey, rights, ranges) and the operation
//! on the responder QP's VM — the copy of an RDMA WRITE or READ, an atomic,
//! or the placement of a message into a receive WQE ([`super::receive`]).

use log::debug;
use virtio_rdma_abi::datapath::{WcStatus, WrOpcode};
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::{is_multicast_gid, MCAST_QPN};

use super::checks::{connected_responder, mcast_responder, remote_mr, ud_responder};
use super::receive::{
    abandon, consume_recv, next_piece, peek_recv, place_piece, place_send, received, recv_cqe,
    recv_failed, recv_queue_failed, Broken, Head, Peeked,
};
use super::request::{copy_in, nak, Request, RespOutcome, RespScratch};
use crate::engine::sge::check_local;
use crate::memory::access::{self, Segment, Translate};
use crate::memory::HostMem;
use crate::resources::Inbound;
use crate::stats::TrafficCounters;
use crate::tenancy::IsolationCounters;
use crate::vm::VmState;

/// Resolves a remote range of responder QP `qp` through `rkey`, checking
/// the MR's and the QP's rights for `right`. An rkey that names no MR of
/// the responder, or one of another PD or without `right`, is counted in
/// the requester's (`requester`) `bad_rkey`: that is what guessing keys
/// looks like.
fn remote_segments(
    state: &VmState,
    qp: u32,
    requester: usize,
    range: (u32, u64, u64),
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    remote_part(state, qp, requester, range, (0, range.2), right, out)
}

/// [`remote_segments`] that checks the whole range `(rkey, addr, len)` but
/// resolves only the part `(skip, take)` of it (a piece of an RDMA WRITE).
fn remote_part(
    state: &VmState,
    qp: u32,
    requester: usize,
    (rkey, addr, len): (u32, u64, u64),
    (skip, take): (u64, u64),
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    let q = state.res.qps.get(qp).ok_or(WcStatus::REM_ACCESS_ERR)?;
    let Some(mr) = remote_mr(state, qp, q, rkey, right) else {
        if let Some(c) = state.tenancy().counters(requester) {
            IsolationCounters::bump(&c.bad_rkey);
        }
        return Err(WcStatus::REM_ACCESS_ERR);
    };
    if q.attr.access & right == 0 {
        return Err(WcStatus::REM_ACCESS_ERR);
    }
    out.clear();
    if (skip, take) == (0, len) {
        return access::resolve(&mr, addr, len, out).map_err(|_| WcStatus::REM_ACCESS_ERR);
    }
    let inside = skip.checked_add(take).is_some_and(|end| end <= len);
    if !inside || (len > 0 && mr.translate(addr, len).is_none()) {
        return Err(WcStatus::REM_ACCESS_ERR);
    }
    let start = addr.checked_add(skip).ok_or(WcStatus::REM_ACCESS_ERR)?;
    access::resolve(&mr, start, take, out).map_err(|_| WcStatus::REM_ACCESS_ERR)
}

/// Checks the target of an RDMA WRITE of `len` bytes at responder QP `qp`
/// and resolves it into `out`. A zero-length WRITE accesses no memory, so
/// its `rkey` and `remote_addr` are not checked (it may carry `rkey` 0);
/// the responder QP's REMOTE_WRITE right still is (spec 18.11.2).
///
/// A WRITE executed in pieces (`req.part`): the first piece checks the
/// whole remote range before any byte is written and resolves its own part;
/// every later piece checks and resolves its own part again, so an MR
/// deregistered meanwhile fails the WRITE (`REM_ACCESS_ERR`) as a
/// mid-transfer invalidation does.
fn write_target(
    state: &VmState,
    qp: u32,
    req: &Request<'_>,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    if req.len > 0 {
        return remote_range(state, qp, req, acc::REMOTE_WRITE, out);
    }
    out.clear();
    match state.res.qps.get(qp) {
        Some(q) if q.attr.access & acc::REMOTE_WRITE != 0 => Ok(()),
        _ => Err(WcStatus::REM_ACCESS_ERR),
    }
}

/// Checks the remote range of an RDMA WRITE or READ (`right`) of
/// `req.len > 0` bytes at responder QP `qp` and resolves the part this
/// execution moves (`req.part`) into `out`: the first part checks the
/// whole range before any byte moves, every later one checks its own part
/// again, so an MR deregistered meanwhile fails the operation
/// (`REM_ACCESS_ERR`) as a mid-transfer invalidation does.
fn remote_range(
    state: &VmState,
    qp: u32,
    req: &Request<'_>,
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    let (wr, len) = (req.wr, req.len);
    let (skip, take) = req.part;
    if skip == 0 {
        let range = (wr.hdr.rkey, wr.hdr.remote_addr, len);
        return remote_part(state, qp, req.vm, range, req.part, right, out);
    }
    let addr = wr.hdr.remote_addr.checked_add(skip);
    let addr = addr.ok_or(WcStatus::REM_ACCESS_ERR)?;
    remote_segments(state, qp, req.vm, (wr.hdr.rkey, addr, take), right, out)
}

/// Performs `req` at responder QP `qp` of `state` (whose memory is `mem`)
/// if that QP takes it (`connected_responder`, `ud_responder` for `ud`: its
/// VM running, still numbered `req.dest_qpn`, of the message's type and in
/// a state that takes messages; for UD with the message's Q_Key).
pub fn respond(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    ud: bool,
    scratch: &mut RespScratch,
) -> RespOutcome {
    let takes = if ud && req.dest_qpn == MCAST_QPN && is_multicast_gid(&req.av.dgid) {
        mcast_responder(state, qp, &req.av.dgid, req.qkey)
    } else if ud {
        ud_responder(state, qp, req.dest_qpn, req.qkey)
    } else {
        connected_responder(state, qp, req.dest_qpn, None, req.qp_type)
    };
    let tgt = match takes {
        Ok(q) => q.qp_type == QpType::XRC_TGT,
        Err(outcome) => return outcome,
    };
    // An XRC message names the SRQ it goes to: one of the TGT QP's domain
    // in this VM, else an invalid request (spec 18.11.8).
    if let Some(miss) = tgt
        .then(|| state.res.bind_xrc_srq(qp, req.wr.hdr.xrc_srqn).err())
        .flatten()
    {
        debug!(
            "QP {:#x}: XRC SRQ number {:#x} from QP {:#x} refused ({miss:?})",
            req.dest_qpn, req.wr.hdr.xrc_srqn, req.src_qpn
        );
        if let Some(c) = state.tenancy().counters(req.vm) {
            IsolationCounters::bump(&c.unknown_qpn);
        }
        return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
    }
    let out = perform(state, mem, qp, req, scratch);
    // A message executed in pieces counts once, with its last piece.
    let last = req.part.0.saturating_add(req.part.1) >= req.len;
    if matches!(out, RespOutcome::Done) {
        state.comm_established(qp);
        if !last {
            return out;
        }
        if let Some(t) = state.tenancy().traffic(state.vm_index()) {
            TrafficCounters::add_single_writer(&t.recv_ops, 1);
            TrafficCounters::add_single_writer(&t.recv_bytes, req.len);
        }
    }
    out
}

/// The work of [`respond`] once the QP takes the message: the checks of
/// its operation, receive consumption, data movement and the responder's
/// completion.
fn perform(
    state: &mut VmState,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
) -> RespOutcome {
    let Some(q) = state.res.qps.get(qp) else {
        return RespOutcome::Unreachable;
    };
    let ud = q.qp_type.datagram();
    // UC drops what RC would answer with an RNR or a NAK (spec 18.11.6).
    let uc = q.qp_type == QpType::UC;
    let side = state.res.recv_side(q);
    let (recv_cq, my_qpn, pd) = (side.cq, q.qpn, side.pd);
    let min_rnr = q.attr.min_rnr_timer;
    // A responder with max_dest_rd_atomic 0 accepts no RDMA READ or atomic
    // request: an invalid request (spec 18.11.3, 18.18).
    let takes_rd_atomic = q.attr.max_dest_rd_atomic != 0;
    let wr = req.wr;
    let RespScratch {
        recv: recv_buf,
        segs,
        ..
    } = scratch;
    match wr.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => {
            if let Err(s) = write_target(state, qp, req, segs) {
                return nak(state, qp, s);
            }
            if wr.opcode == WrOpcode::RDMA_WRITE {
                return match copy_in(req, mem, segs) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => nak(state, qp, WcStatus::REM_ACCESS_ERR),
                };
            }
        }
        WrOpcode::RDMA_READ => {
            if !takes_rd_atomic {
                return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
            }
            if req.len == 0 {
                // A zero-length READ accesses no memory and is not checked
                // (spec 18.11.3): no rkey, address or access right.
                return RespOutcome::Done;
            }
            return match remote_range(state, qp, req, acc::REMOTE_READ, segs) {
                Ok(()) => match access::copy(mem, segs, req.mem, req.local, req.part.1) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => nak(state, qp, WcStatus::REM_ACCESS_ERR),
                },
                Err(s) => nak(state, qp, s),
            };
        }
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => {
            if !takes_rd_atomic || wr.hdr.remote_addr % 8 != 0 {
                return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
            }
            let range = (wr.hdr.rkey, wr.hdr.remote_addr, 8);
            if let Err(s) = remote_segments(state, qp, req.vm, range, acc::REMOTE_ATOMIC, segs) {
                return nak(state, qp, s);
            }
            let Some(target) = segs.first().filter(|s| s.len == 8).copied() else {
                return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
            };
            let old = if wr.opcode == WrOpcode::ATOMIC_CMP_AND_SWP {
                access::compare_swap(mem, target.gpa, wr.hdr.compare_add, wr.hdr.swap)
            } else {
                access::fetch_add(mem, target.gpa, wr.hdr.compare_add)
            };
            return match old {
                Ok(v) => match access::write(req.mem, req.local, &v.to_le_bytes()) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => RespOutcome::Nak(WcStatus::LOC_PROT_ERR),
                },
                Err(_) => nak(state, qp, WcStatus::REM_ACCESS_ERR),
            };
        }
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM | WrOpcode::SEND_WITH_INV => {}
        // Local operations never reach a responder (the requester
        // executes them).
        WrOpcode::REG_MR | WrOpcode::LOCAL_INV | WrOpcode::BIND_MW => {
            return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
        }
    }
    // SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM consume a receive WQE.
    let (skip, take) = req.part;
    let last = skip.saturating_add(take) >= req.len;
    if skip > 0 {
        return next_piece(state, mem, qp, req, scratch, last);
    }
    // A first piece while another message is still arriving: its sender
    // stopped mid-message. As a responder expecting the rest of a message,
    // this one is an invalid request (its receive WQE fails with it).
    // A UC responder takes the new message (its sender gave the old one
    // up; no response says so).
    if let Some(inb) = state.res.qps.get_mut(qp).and_then(|q| q.rt.inbound.take()) {
        abandon(state, mem, qp, &inb);
        if !uc {
            return nak(state, qp, WcStatus::REM_INV_REQ_ERR);
        }
    }
    // A SEND_WITH_INV whose key names no `ALLOC_MR` region or type 2
    // window of this QP's PD fails before a receive WQE is looked at (spec
    // 18.27, 18.29).
    let invalidates = (wr.opcode == WrOpcode::SEND_WITH_INV).then_some(wr.hdr.imm_data);
    if invalidates.is_some_and(|key| !state.res.invalidatable(pd, key)) {
        return nak(state, qp, WcStatus::REM_OP_ERR);
    }
    // The receive WQE is copied and checked in full before any byte of the
    // message is written, so that an RNR, a malformed WQE or a broken queue
    // leaves the responder's memory as it was (spec 18.11.2, 18.13).
    let Peeked { head, pi } = match peek_recv(state, mem, qp, recv_buf) {
        Ok(p) => p,
        Err(Broken) => {
            recv_queue_failed(state, qp);
            // The responder is in ERR now: unreachable (RC retries).
            return if ud {
                RespOutcome::Dropped
            } else {
                RespOutcome::Unreachable
            };
        }
    };
    let recv = match head {
        Head::Wqe(r) => r,
        Head::Empty if ud || uc => return RespOutcome::Dropped,
        Head::Empty => return RespOutcome::Rnr(min_rnr),
        Head::Malformed(wr_id) => {
            return recv_failed(state, mem, qp, pi, wr_id, WcStatus::LOC_QP_OP_ERR, ud)
        }
    };
    if !last {
        // The first of several pieces: the receive WQE must hold the whole
        // message, and is consumed now and completed with the last piece.
        let sges = if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
            Vec::new()
        } else {
            match check_local(state, pd, recv.sges, true) {
                Ok(room) if room >= req.len => recv.sges.to_vec(),
                Ok(_) => {
                    return recv_failed(state, mem, qp, pi, recv.wr_id, WcStatus::LOC_LEN_ERR, ud)
                }
                Err(status) => return recv_failed(state, mem, qp, pi, recv.wr_id, status, ud),
            }
        };
        consume_recv(state, mem, qp, pi);
        // The message is accepted: the key is invalidated as it arrives,
        // before any of it is placed (and before the receive completes).
        if let Some(key) = invalidates {
            state.res.invalidate_key(pd, key);
        }
        let inb = Inbound {
            wr_id: recv.wr_id,
            sges,
            len: req.len,
            placed: 0,
        };
        return place_piece(state, mem, qp, req, scratch, inb, false);
    }
    let placed = if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
        // The data goes to the RDMA target; the receive WQE's buffers are
        // not touched (spec 18.11.2).
        if copy_in(req, mem, segs).is_err() {
            return nak(state, qp, WcStatus::REM_ACCESS_ERR);
        }
        req.len
    } else {
        match place_send(state, mem, req, pd, ud, recv.sges, segs) {
            Ok(n) => n,
            Err(status) => return recv_failed(state, mem, qp, pi, recv.wr_id, status, ud),
        }
    };
    consume_recv(state, mem, qp, pi);
    if let Some(key) = invalidates {
        state.res.invalidate_key(pd, key);
    }
    let cqe = recv_cqe(req, my_qpn, recv.wr_id, placed, ud);
    received(state, mem, qp, recv_cq, cqe)
}
