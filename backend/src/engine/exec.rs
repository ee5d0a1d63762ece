//! Executing send work requests: the requester side (local checks), the
//! responder side (remote checks, receive consumption, the copy into or out
//! of the other guest's RAM) and the completions on both ends.
//!
//! Between VMs of one daemon there is no wire: the requester performs the
//! responder's part directly on the peer's objects and memory, which makes
//! each RC operation complete in one step.

use super::doorbell::{self, load_pi};
use super::wqe::{fetch_recv, RecvWr, SendWr, WqeBuf};
use crate::ctrl::Ctrl;
use crate::memory::access::{self, Segment};
use crate::memory::HostMem;
use virtio_rdma_abi::datapath::{
    Cqe, Sge, WcOpcode, WcStatus, WrOpcode, CQE_GRH, CQE_SOLICITED, CQE_WITH_IMM, DB_DEVICE_OFFSET,
    UD_GRH_SIZE, WQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::{QpState, QpType};

/// Offset of `rq_ci` in the device half of a QP doorbell record.
const RQ_CI: u64 = DB_DEVICE_OFFSET + 4;
/// Offset of the SRQ doorbell's `ci` in its device half.
const SRQ_CI: u64 = DB_DEVICE_OFFSET;

/// Checks a local SGE list of a QP in PD `pd` of `ctrl` (`write` requires
/// LOCAL_WRITE) and resolves its first `limit` bytes into `out` (which is
/// cleared first). Every SGE is checked in full — key, PD, rights and
/// bounds — but only the bytes that will be accessed are translated page by
/// page, so a small message into a large receive buffer costs little.
/// Returns the total length of the list. Any failure is a local protection
/// error.
pub fn local_segments(
    ctrl: &Ctrl,
    pd: u32,
    sges: &[Sge],
    write: bool,
    limit: u64,
    out: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    out.clear();
    let mut total = 0u64;
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        let mr = ctrl
            .res
            .lkeys
            .get(&sge.lkey)
            .and_then(|h| ctrl.res.mrs.get(*h))
            .ok_or(WcStatus::LOC_PROT_ERR)?;
        if mr.pd != pd || (write && mr.access & acc::LOCAL_WRITE == 0) {
            return Err(WcStatus::LOC_PROT_ERR);
        }
        let len = u64::from(sge.length);
        mr.translate(sge.addr, len).ok_or(WcStatus::LOC_PROT_ERR)?;
        let want = limit.saturating_sub(total).min(len);
        if want > 0 {
            access::resolve(mr, sge.addr, want, out).map_err(|_| WcStatus::LOC_PROT_ERR)?;
        }
        total += len;
    }
    Ok(total)
}

/// Reusable memory of the responder side (no allocation per message).
pub struct RespScratch {
    /// The copied receive WQE.
    pub recv: Box<WqeBuf>,
    /// Segments of the remote range or the receive buffer.
    pub segs: Vec<Segment>,
}

impl RespScratch {
    /// Empty scratch memory.
    pub fn new() -> Self {
        RespScratch {
            recv: WqeBuf::new(),
            segs: Vec::with_capacity(64),
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
    /// No receive WQE posted (RNR).
    Rnr,
    /// The responder refused: the requester's CQE status.
    Nak(WcStatus),
    /// Silently dropped (UD only).
    Dropped,
    /// The responder QP no longer has the addressed QPN (a stale routing
    /// hint); the requester resolves the QPN again.
    Stale,
}

/// The requester's side of one message, ready for the responder.
pub struct Request<'a> {
    /// The work request.
    pub wr: &'a SendWr<'a>,
    /// Requester QPN.
    pub src_qpn: u32,
    /// Requester GID.
    pub src_gid: [u8; 16],
    /// Local segments (source of SEND/WRITE, destination of READ/atomics).
    pub local: &'a [Segment],
    /// Message length.
    pub len: u64,
    /// Requester memory.
    pub mem: &'a HostMem,
    /// QPN the requester addressed (the responder must still have it).
    pub dest_qpn: u32,
    /// UD: the Q_Key the message carries (`remote_qkey`, or the sending
    /// QP's own Q_Key). Unused for RC.
    pub qkey: u32,
}

/// Moves QP `qp` into ERR with `event` (see [`Ctrl::qp_enter_err`]).
fn fail_qp(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    ctrl.qp_enter_err(qp, event);
}

/// Takes the next receive WQE of responder QP `qp` (its RQ or SRQ).
fn take_recv<'s>(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    scratch: &'s mut WqeBuf,
) -> Result<Option<RecvWr<'s>>, ()> {
    let q = ctrl.res.qps.get(qp).ok_or(())?;
    if q.srq != 0 {
        let srq_h = q.srq;
        let srq = ctrl.res.srqs.get_mut(srq_h).ok_or(())?;
        let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ).ok_or(())?;
        if pi == srq.rt.ci {
            return Ok(None);
        }
        if pi.wrapping_sub(srq.rt.ci) > srq.depth {
            return Err(());
        }
        let wr = fetch_recv(
            mem,
            &srq.ring,
            0,
            srq.depth,
            srq.wqe_shift,
            srq.max_sge,
            srq.rt.ci,
            scratch,
        )
        .map_err(|_| ())?;
        srq.rt.ci = srq.rt.ci.wrapping_add(1);
        let _ = access::store_u32_release(mem, srq.db_gpa + SRQ_CI, srq.rt.ci);
        let posted = pi.wrapping_sub(srq.rt.ci);
        if srq.limit != 0 && posted < srq.limit {
            srq.limit = 0;
            ctrl.events.push(EventKind::SRQ_LIMIT_REACHED, srq_h, 0);
        }
        return Ok(Some(wr));
    }
    let pi = load_pi(mem, q.db_gpa, q.db_slot.as_ref(), doorbell::RQ).ok_or(())?;
    if pi == q.rt.rq_ci {
        return Ok(None);
    }
    if pi.wrapping_sub(q.rt.rq_ci) > q.rq_depth {
        return Err(());
    }
    let wr = fetch_recv(
        mem,
        &q.ring,
        q.layout.rq_offset,
        q.rq_depth,
        q.layout.rq_wqe_shift,
        q.max_recv_sge,
        q.rt.rq_ci,
        scratch,
    )
    .map_err(|_| ())?;
    let Some(q) = ctrl.res.qps.get_mut(qp) else {
        return Err(());
    };
    q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
    let _ = access::store_u32_release(mem, q.db_gpa + RQ_CI, q.rt.rq_ci);
    Ok(Some(wr))
}

/// Whether responder QP `qp` has a receive WQE posted (on its RQ or SRQ),
/// without consuming it. `Err` in the cases where [`take_recv`] fails on
/// the queue itself: its doorbell is unreadable or its producer index is
/// out of range.
fn recv_posted(ctrl: &Ctrl, mem: &HostMem, qp: u32) -> Result<bool, ()> {
    let q = ctrl.res.qps.get(qp).ok_or(())?;
    let (pi, ci, depth) = if q.srq != 0 {
        let srq = ctrl.res.srqs.get(q.srq).ok_or(())?;
        let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ).ok_or(())?;
        (pi, srq.rt.ci, srq.depth)
    } else {
        let pi = load_pi(mem, q.db_gpa, q.db_slot.as_ref(), doorbell::RQ).ok_or(())?;
        (pi, q.rt.rq_ci, q.rq_depth)
    };
    if pi.wrapping_sub(ci) > depth {
        return Err(());
    }
    Ok(pi != ci)
}

/// Resolves a remote range of responder QP `qp` through `rkey`, checking
/// the MR's and the QP's rights for `right`.
fn remote_segments(
    ctrl: &Ctrl,
    qp: u32,
    rkey: u32,
    addr: u64,
    len: u64,
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    let q = ctrl.res.qps.get(qp).ok_or(WcStatus::REM_ACCESS_ERR)?;
    let mr = ctrl
        .res
        .rkeys
        .get(&rkey)
        .and_then(|h| ctrl.res.mrs.get(*h))
        .ok_or(WcStatus::REM_ACCESS_ERR)?;
    if mr.pd != q.pd || mr.access & right == 0 || q.attr.access & right == 0 {
        return Err(WcStatus::REM_ACCESS_ERR);
    }
    out.clear();
    access::resolve(mr, addr, len, out).map_err(|_| WcStatus::REM_ACCESS_ERR)
}

/// Checks the target of an RDMA WRITE of `len` bytes at responder QP `qp`
/// and resolves it into `out`. A zero-length WRITE accesses no memory, so
/// its `rkey` and `remote_addr` are not checked (it may carry `rkey` 0);
/// the responder QP's REMOTE_WRITE right still is (spec 18.11.2).
fn write_target(
    ctrl: &Ctrl,
    qp: u32,
    wr: &SendWr<'_>,
    len: u64,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    if len > 0 {
        let (rkey, addr) = (wr.hdr.rkey, wr.hdr.remote_addr);
        return remote_segments(ctrl, qp, rkey, addr, len, acc::REMOTE_WRITE, out);
    }
    out.clear();
    match ctrl.res.qps.get(qp) {
        Some(q) if q.attr.access & acc::REMOTE_WRITE != 0 => Ok(()),
        _ => Err(WcStatus::REM_ACCESS_ERR),
    }
}

/// Performs `req` at responder QP `qp` of `ctrl` (whose memory is `mem`).
pub fn respond(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
) -> RespOutcome {
    let out = perform(ctrl, mem, qp, req, scratch);
    if matches!(out, RespOutcome::Done) {
        comm_established(ctrl, qp);
    }
    out
}

/// The first message a QP accepts in RTR queues `QP_COMM_EST`, once per
/// entry into RTR and only while the QP is still in RTR (spec 18.22).
fn comm_established(ctrl: &mut Ctrl, qp: u32) {
    let Some(q) = ctrl.res.qps.get_mut(qp) else {
        return;
    };
    if q.state == QpState::RTR && !q.rt.comm_est {
        q.rt.comm_est = true;
        ctrl.events.push(EventKind::QP_COMM_EST, qp, 0);
    }
}

/// The work of [`respond`]: checks, receive consumption, data movement and
/// the responder's completion.
fn perform(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
) -> RespOutcome {
    let Some(q) = ctrl.res.qps.get(qp) else {
        return RespOutcome::Nak(WcStatus::RETRY_EXC_ERR);
    };
    if q.qpn != req.dest_qpn {
        // The handle came from a stale hint: the QP is gone.
        return RespOutcome::Stale;
    }
    if !matches!(q.state, QpState::RTR | QpState::RTS | QpState::SQD) {
        return if q.qp_type == QpType::UD {
            RespOutcome::Dropped
        } else {
            RespOutcome::Nak(WcStatus::RETRY_EXC_ERR)
        };
    }
    let ud = q.qp_type == QpType::UD;
    let recv_cq = q.recv_cq;
    let my_qpn = q.qpn;
    let pd = q.pd;
    // A responder with max_dest_rd_atomic 0 accepts no RDMA READ or atomic
    // request: an invalid request (spec 18.11.3, 18.18).
    let takes_rd_atomic = q.attr.max_dest_rd_atomic != 0;
    let wr = req.wr;
    let RespScratch {
        recv: recv_buf,
        segs,
    } = scratch;
    // Where incoming data goes.
    let mut placed: u64 = req.len;
    match wr.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => {
            if let Err(s) = write_target(ctrl, qp, wr, req.len, segs) {
                return nak(ctrl, qp, s);
            }
            // WITH_IMM consumes a receive WQE: make sure one is there before
            // any byte is written, so that an RNR leaves the memory as it
            // was (spec 18.11.2). It is taken below, after the data.
            if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
                match recv_posted(ctrl, mem, qp) {
                    Ok(true) => {}
                    Ok(false) => return RespOutcome::Rnr,
                    Err(()) => return nak(ctrl, qp, WcStatus::REM_OP_ERR),
                }
            }
            if copy_in(req, mem, segs).is_err() {
                return nak(ctrl, qp, WcStatus::REM_ACCESS_ERR);
            }
        }
        WrOpcode::RDMA_READ => {
            if !takes_rd_atomic {
                return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
            }
            if req.len == 0 {
                // A zero-length READ accesses no memory and is not checked
                // (spec 18.11.3): no rkey, address or access right.
                return RespOutcome::Done;
            }
            return match remote_segments(
                ctrl,
                qp,
                wr.hdr.rkey,
                wr.hdr.remote_addr,
                req.len,
                acc::REMOTE_READ,
                segs,
            ) {
                Ok(()) => match access::copy(mem, segs, req.mem, req.local, req.len) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => nak(ctrl, qp, WcStatus::REM_ACCESS_ERR),
                },
                Err(s) => nak(ctrl, qp, s),
            };
        }
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => {
            if !takes_rd_atomic || wr.hdr.remote_addr % 8 != 0 {
                return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
            }
            if let Err(s) = remote_segments(
                ctrl,
                qp,
                wr.hdr.rkey,
                wr.hdr.remote_addr,
                8,
                acc::REMOTE_ATOMIC,
                segs,
            ) {
                return nak(ctrl, qp, s);
            }
            let Some(target) = segs.first().filter(|s| s.len == 8).copied() else {
                return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
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
                Err(_) => nak(ctrl, qp, WcStatus::REM_ACCESS_ERR),
            };
        }
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM => {}
    }
    let is_send = matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM);
    let with_imm = matches!(
        wr.opcode,
        WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    if !(is_send || with_imm) {
        return RespOutcome::Done;
    }
    // A receive WQE is consumed.
    let recv = match take_recv(ctrl, mem, qp, recv_buf) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return if ud {
                RespOutcome::Dropped
            } else {
                RespOutcome::Rnr
            }
        }
        Err(()) => return nak(ctrl, qp, WcStatus::REM_OP_ERR),
    };
    let mut flags = 0u8;
    if with_imm {
        flags |= CQE_WITH_IMM;
    }
    if wr.hdr.flags & WQE_SOLICITED != 0 {
        flags |= CQE_SOLICITED;
    }
    let mut status = WcStatus::SUCCESS;
    if is_send {
        let grh = if ud { u64::from(UD_GRH_SIZE) } else { 0 };
        let needed = grh.saturating_add(req.len);
        match local_segments(ctrl, pd, recv.sges, true, needed, segs) {
            Ok(capacity) if capacity < needed => {
                if ud {
                    flags |= CQE_GRH;
                }
                status = WcStatus::LOC_LEN_ERR;
            }
            Ok(_) => {
                if ud {
                    flags |= CQE_GRH;
                    let mut header = [0u8; UD_GRH_SIZE as usize];
                    header[8..24].copy_from_slice(&req.src_gid);
                    header[24..40].copy_from_slice(&ctrl.port_gid());
                    if access::write(mem, segs, &header).is_err() {
                        status = WcStatus::LOC_LEN_ERR;
                    } else {
                        skip(segs, grh);
                        placed = needed;
                    }
                }
                if status == WcStatus::SUCCESS && copy_in(req, mem, segs).is_err() {
                    status = WcStatus::LOC_PROT_ERR;
                }
            }
            Err(s) => status = s,
        }
    }
    let opcode = if matches!(wr.opcode, WrOpcode::RDMA_WRITE_WITH_IMM) {
        WcOpcode::RECV_RDMA_WITH_IMM
    } else {
        WcOpcode::RECV
    };
    let cqe = Cqe {
        wr_id: recv.wr_id,
        opcode: opcode as u8,
        status: status as u8,
        flags,
        owner: 0,
        byte_len: u32::try_from(placed).unwrap_or(u32::MAX),
        imm_data: wr.hdr.imm_data,
        qpn: my_qpn,
        // The sender's QPN is reported for UD receives only; RC completions
        // carry 0 (spec 18.14, "Field values of successful completions").
        src_qpn: if ud { req.src_qpn } else { 0 },
        vendor_err: 0,
    };
    let completed = super::completer::complete(ctrl, mem, recv_cq, cqe);
    if status == WcStatus::SUCCESS {
        if !completed {
            // Only the receive completion is lost: the message was
            // delivered, so the requester completes normally (spec 18.18,
            // notes). An overflowed CQ has already failed this QP with
            // QP_FATAL (spec 18.17).
            fail_qp(ctrl, qp, None);
        }
        return RespOutcome::Done;
    }
    fail_qp(ctrl, qp, None);
    if ud {
        return RespOutcome::Dropped;
    }
    RespOutcome::Nak(if status == WcStatus::LOC_LEN_ERR {
        WcStatus::REM_INV_REQ_ERR
    } else {
        WcStatus::REM_OP_ERR
    })
}

/// The responder refuses: its QP fails with an async event, the requester
/// gets `status`.
fn nak(ctrl: &mut Ctrl, qp: u32, status: WcStatus) -> RespOutcome {
    let event = if status == WcStatus::REM_ACCESS_ERR {
        EventKind::QP_ACCESS_ERROR
    } else {
        EventKind::QP_REQ_ERROR
    };
    fail_qp(ctrl, qp, Some(event));
    RespOutcome::Nak(status)
}

/// Copies the request's payload (inline bytes or local segments) into `dst`.
fn copy_in(req: &Request<'_>, mem: &HostMem, dst: &[Segment]) -> Result<(), access::AccessError> {
    match req.wr.inline {
        Some(data) => access::write(mem, dst, data),
        None => access::copy(req.mem, req.local, mem, dst, req.len),
    }
}

/// Drops the first `n` bytes of `segs` (in place).
fn skip(segs: &mut Vec<Segment>, mut n: u64) {
    let mut whole = 0;
    for s in segs.iter_mut() {
        if n >= s.len {
            n -= s.len;
            whole += 1;
            continue;
        }
        s.gpa += n;
        s.len -= n;
        break;
    }
    segs.drain(..whole);
}

/// The requester's completion opcode for a work request opcode.
pub fn wc_opcode(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM => WcOpcode::SEND,
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => WcOpcode::RDMA_WRITE,
        WrOpcode::RDMA_READ => WcOpcode::RDMA_READ,
        WrOpcode::ATOMIC_CMP_AND_SWP => WcOpcode::COMP_SWAP,
        WrOpcode::ATOMIC_FETCH_AND_ADD => WcOpcode::FETCH_ADD,
    }
}
