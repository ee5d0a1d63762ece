//! Executing send work requests: the requester side (local checks), the
//! responder side (remote checks, receive consumption, the copy into or out
//! of the other guest's RAM) and the completions on both ends.
//!
//! Between VMs of one daemon there is no wire: the requester performs the
//! responder's part directly on the peer's objects and memory, which makes
//! each RC operation complete in one step.

use virtio_rdma_abi::datapath::{
    Cqe, Sge, WcOpcode, WcStatus, WrOpcode, CQE_GRH, CQE_SOLICITED, CQE_WITH_IMM, DB_DEVICE_OFFSET,
    UD_GRH_SIZE, WQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::{QpState, QpType};
use vm_memory::GuestMemoryMmap;

use super::doorbell::{self, load_pi};
use super::wqe::{fetch_recv, RecvWr, SendWr};
use crate::ctrl::Ctrl;
use crate::memory::access::{self, Segment};

/// Offset of `rq_ci` in the device half of a QP doorbell record.
const RQ_CI: u64 = DB_DEVICE_OFFSET + 4;
/// Offset of the SRQ doorbell's `ci` in its device half.
const SRQ_CI: u64 = DB_DEVICE_OFFSET;

/// Resolves a local SGE list of QP `qp` in `ctrl`; `write` requires
/// LOCAL_WRITE. Any failure is a local protection error.
pub fn local_segments(
    ctrl: &Ctrl,
    pd: u32,
    sges: &[Sge],
    write: bool,
) -> Result<Vec<Segment>, WcStatus> {
    let mut segs = Vec::with_capacity(sges.len());
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
        access::resolve(mr, sge.addr, u64::from(sge.length), &mut segs)
            .map_err(|_| WcStatus::LOC_PROT_ERR)?;
    }
    Ok(segs)
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
}

/// The requester's side of one message, ready for the responder.
pub struct Request<'a> {
    /// The work request.
    pub wr: &'a SendWr,
    /// Requester QPN.
    pub src_qpn: u32,
    /// Requester GID.
    pub src_gid: [u8; 16],
    /// Local segments (source of SEND/WRITE, destination of READ/atomics).
    pub local: &'a [Segment],
    /// Message length.
    pub len: u64,
    /// Requester memory.
    pub mem: &'a GuestMemoryMmap<()>,
}

fn fail_qp(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    if let Some(q) = ctrl.res.qps.get_mut(qp) {
        if q.state != QpState::ERR {
            q.state = QpState::ERR;
            if let Some(e) = event {
                ctrl.events.push(e, qp, 0);
            }
        }
    }
}

/// Takes the next receive WQE of responder QP `qp` (its RQ or SRQ).
fn take_recv(ctrl: &mut Ctrl, mem: &GuestMemoryMmap<()>, qp: u32) -> Result<Option<RecvWr>, ()> {
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
    )
    .map_err(|_| ())?;
    let Some(q) = ctrl.res.qps.get_mut(qp) else {
        return Err(());
    };
    q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
    let _ = access::store_u32_release(mem, q.db_gpa + RQ_CI, q.rt.rq_ci);
    Ok(Some(wr))
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
) -> Result<Vec<Segment>, WcStatus> {
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
    let mut segs = Vec::new();
    access::resolve(mr, addr, len, &mut segs).map_err(|_| WcStatus::REM_ACCESS_ERR)?;
    Ok(segs)
}

/// Performs `req` at responder QP `qp` of `ctrl` (whose memory is `mem`).
pub fn respond(
    ctrl: &mut Ctrl,
    mem: &GuestMemoryMmap<()>,
    qp: u32,
    req: &Request<'_>,
) -> RespOutcome {
    let Some(q) = ctrl.res.qps.get(qp) else {
        return RespOutcome::Nak(WcStatus::RETRY_EXC_ERR);
    };
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
    let wr = req.wr;
    let data_in = matches!(
        wr.opcode,
        WrOpcode::SEND
            | WrOpcode::SEND_WITH_IMM
            | WrOpcode::RDMA_WRITE
            | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    // Where incoming data goes.
    let mut placed: u64 = req.len;
    match wr.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => {
            match remote_segments(
                ctrl,
                qp,
                wr.hdr.rkey,
                wr.hdr.remote_addr,
                req.len,
                acc::REMOTE_WRITE,
            ) {
                Ok(dst) => {
                    if copy_in(req, mem, &dst).is_err() {
                        return nak(ctrl, qp, WcStatus::REM_ACCESS_ERR);
                    }
                }
                Err(s) => return nak(ctrl, qp, s),
            }
        }
        WrOpcode::RDMA_READ => {
            return match remote_segments(
                ctrl,
                qp,
                wr.hdr.rkey,
                wr.hdr.remote_addr,
                req.len,
                acc::REMOTE_READ,
            ) {
                Ok(src) => match access::copy(mem, &src, req.mem, req.local, req.len) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => nak(ctrl, qp, WcStatus::REM_ACCESS_ERR),
                },
                Err(s) => nak(ctrl, qp, s),
            };
        }
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => {
            if wr.hdr.remote_addr % 8 != 0 {
                return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
            }
            let dst = match remote_segments(
                ctrl,
                qp,
                wr.hdr.rkey,
                wr.hdr.remote_addr,
                8,
                acc::REMOTE_ATOMIC,
            ) {
                Ok(d) => d,
                Err(s) => return nak(ctrl, qp, s),
            };
            let Some(target) = dst.first().filter(|s| s.len == 8) else {
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
    let with_imm = matches!(
        wr.opcode,
        WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    if !(matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM) || with_imm) {
        return RespOutcome::Done;
    }
    // A receive WQE is consumed.
    let recv = match take_recv(ctrl, mem, qp) {
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
    if data_in && matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM) {
        match local_segments(ctrl, pd, &recv.sges, true) {
            Ok(mut dst) => {
                if ud {
                    flags |= CQE_GRH;
                    let mut grh = [0u8; UD_GRH_SIZE as usize];
                    grh[8..24].copy_from_slice(&req.src_gid);
                    grh[24..40].copy_from_slice(&ctrl.port_gid());
                    if access::total(&dst) < u64::from(UD_GRH_SIZE) + req.len
                        || access::write(mem, &dst, &grh).is_err()
                    {
                        status = WcStatus::LOC_LEN_ERR;
                    } else {
                        dst = skip(&dst, u64::from(UD_GRH_SIZE));
                        placed = req.len + u64::from(UD_GRH_SIZE);
                    }
                }
                if status == WcStatus::SUCCESS {
                    if access::total(&dst) < req.len {
                        status = WcStatus::LOC_LEN_ERR;
                    } else if copy_in(req, mem, &dst).is_err() {
                        status = WcStatus::LOC_PROT_ERR;
                    }
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
        src_qpn: req.src_qpn,
        vendor_err: 0,
    };
    let completed = super::completer::complete(ctrl, mem, recv_cq, cqe);
    if status != WcStatus::SUCCESS || !completed {
        fail_qp(ctrl, qp, None);
        if ud {
            return RespOutcome::Dropped;
        }
        return RespOutcome::Nak(if status == WcStatus::LOC_LEN_ERR {
            WcStatus::REM_INV_REQ_ERR
        } else {
            WcStatus::REM_OP_ERR
        });
    }
    RespOutcome::Done
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
fn copy_in(
    req: &Request<'_>,
    mem: &GuestMemoryMmap<()>,
    dst: &[Segment],
) -> Result<(), access::AccessError> {
    match &req.wr.inline {
        Some(data) => access::write(mem, dst, data),
        None => access::copy(req.mem, req.local, mem, dst, req.len),
    }
}

/// The segments after the first `n` bytes.
fn skip(segs: &[Segment], mut n: u64) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        if n >= s.len {
            n -= s.len;
            continue;
        }
        out.push(Segment {
            gpa: s.gpa + n,
            len: s.len - n,
        });
        n = 0;
    }
    out
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
