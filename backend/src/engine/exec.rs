//! Executing send work requests: the requester side (local checks), the
//! responder side (remote checks, receive consumption, the copy into or out
//! of the other guest's RAM) and the completions on both ends.
//!
//! Between VMs of one daemon there is no wire: the requester performs the
//! responder's part directly on the peer's objects and memory, which makes
//! each RC operation complete in one step.

use super::completer::{complete, error_cqe};
use super::doorbell::{self, load_pi};
use super::wqe::{fetch_recv, RecvWr, SendWr, WqeBuf, WqeError};
use crate::ctrl::Ctrl;
use crate::memory::access::{self, Segment};
use crate::memory::{HostMem, PageList};
use crate::resources::{Inbound, Mr};
use crate::stats::TrafficCounters;
use crate::tenancy::IsolationCounters;
use virtio_rdma_abi::datapath::{
    ud_grh_payload_length, Cqe, QpDoorbell, Sge, SrqDoorbell, UdGrh, WcOpcode, WcStatus, WrOpcode,
    CQE_GRH, CQE_SOLICITED, CQE_WITH_IMM, UD_GRH_SIZE, WQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType};

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
    local_range(ctrl, pd, sges, write, 0, limit, out)
}

/// Checks a local SGE list of a QP in PD `pd` of `ctrl` as
/// [`local_range`] does — key, PD, rights (`write`: LOCAL_WRITE) and bounds
/// of every SGE — without translating any of it: a cost in the number of
/// SGEs, not of bytes or pages. Returns the total length of the list.
pub fn check_local(ctrl: &Ctrl, pd: u32, sges: &[Sge], write: bool) -> Result<u64, WcStatus> {
    let mut total = 0u64;
    for sge in sges.iter().filter(|s| s.length != 0) {
        local_mr(ctrl, pd, sge, write)?;
        total = total.saturating_add(u64::from(sge.length));
    }
    Ok(total)
}

/// The MR of local SGE `sge` (of non-zero length) of a QP in PD `pd`, once
/// its key, PD, rights (`write`: LOCAL_WRITE) and bounds are checked.
fn local_mr<'c>(ctrl: &'c Ctrl, pd: u32, sge: &Sge, write: bool) -> Result<&'c Mr, WcStatus> {
    let mr = ctrl
        .res
        .lkeys
        .get(&sge.lkey)
        .and_then(|h| ctrl.res.mrs.get(*h))
        .ok_or(WcStatus::LOC_PROT_ERR)?;
    if mr.pd != pd || (write && mr.access & acc::LOCAL_WRITE == 0) {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    mr.translate(sge.addr, u64::from(sge.length))
        .ok_or(WcStatus::LOC_PROT_ERR)?;
    Ok(mr)
}

/// [`local_segments`] for a piece of the list: every SGE is checked in full,
/// but only the `limit` bytes after the first `skip` are resolved into `out`
/// (a piece of a message executed in pieces). Returns the total length
/// of the list.
pub fn local_range(
    ctrl: &Ctrl,
    pd: u32,
    sges: &[Sge],
    write: bool,
    skip: u64,
    limit: u64,
    out: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    out.clear();
    let end = skip.saturating_add(limit);
    let mut total = 0u64;
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        let mr = local_mr(ctrl, pd, sge, write)?;
        let len = u64::from(sge.length);
        // The part of this SGE inside [skip, end) of the list.
        let from = skip.saturating_sub(total).min(len);
        let to = end.saturating_sub(total).min(len);
        if to > from {
            let addr = sge.addr.checked_add(from).ok_or(WcStatus::LOC_PROT_ERR)?;
            access::resolve(mr, addr, to.saturating_sub(from), out)
                .map_err(|_| WcStatus::LOC_PROT_ERR)?;
        }
        total = total.saturating_add(len);
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
    /// No receive WQE posted (RNR); the responder QP's `min_rnr_timer`
    /// selects the wait (spec 18.20).
    Rnr(u32),
    /// The destination is unreachable (spec 18.23): RC retries, UD drops.
    Unreachable,
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

/// Moves QP `qp` into ERR with `event` (see [`Ctrl::qp_enter_err`]).
fn fail_qp(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    ctrl.qp_enter_err(qp, event);
}

/// The receive WQE at the head of a responder QP's receive queue or SRQ,
/// copied out of the ring but not consumed yet.
enum Head<'s> {
    /// None is posted.
    Empty,
    /// A well-formed WQE.
    Wqe(RecvWr<'s>),
    /// A malformed WQE (spec 18.13), with its `wr_id`.
    Malformed(u64),
}

/// A peeked head and the producer index it was read against.
struct Peeked<'s> {
    head: Head<'s>,
    pi: u32,
}

/// The receive queue or SRQ itself is broken: its doorbell record or ring
/// is not in guest RAM, or its producer index is out of range (spec
/// 18.18). Nothing of it can be trusted, so nothing is consumed.
struct Broken;

/// Copies the receive WQE at the head of responder QP `qp`'s queue (its
/// RQ or SRQ) into `scratch` and checks its format, without consuming it:
/// the caller consumes it with [`consume_recv`] once it knows the message
/// is accepted, so that a refused message leaves the queue as it was.
fn peek_recv<'s>(
    ctrl: &Ctrl,
    mem: &HostMem,
    qp: u32,
    scratch: &'s mut WqeBuf,
) -> Result<Peeked<'s>, Broken> {
    let q = ctrl.res.qps.get(qp).ok_or(Broken)?;
    let (pi, r) = if q.srq != 0 {
        let srq = ctrl.res.srqs.get(q.srq).ok_or(Broken)?;
        if srq.rt.broken {
            return Err(Broken);
        }
        let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ).ok_or(Broken)?;
        let ring = RecvRing {
            ring: &srq.ring,
            offset: 0,
            depth: srq.depth,
            shift: srq.wqe_shift,
            max_sge: srq.max_sge,
            ci: srq.rt.ci,
        };
        (pi, ring)
    } else {
        let pi = load_pi(mem, q.db_gpa, q.db_slot.as_ref(), doorbell::RQ).ok_or(Broken)?;
        let ring = RecvRing {
            ring: &q.ring,
            offset: q.layout.rq_offset,
            depth: q.rq_depth,
            shift: q.layout.rq_wqe_shift,
            max_sge: q.max_recv_sge,
            ci: q.rt.rq_ci,
        };
        (pi, ring)
    };
    if pi.wrapping_sub(r.ci) > r.depth {
        return Err(Broken);
    }
    if pi == r.ci {
        return Ok(Peeked {
            head: Head::Empty,
            pi,
        });
    }
    let fetched = fetch_recv(
        mem, r.ring, r.offset, r.depth, r.shift, r.max_sge, r.ci, scratch,
    );
    let head = match fetched {
        Ok(wr) => Head::Wqe(wr),
        Err(WqeError::Malformed { wr_id, .. }) => Head::Malformed(wr_id),
        Err(WqeError::Unusable) => return Err(Broken),
    };
    Ok(Peeked { head, pi })
}

/// A receive ring as [`peek_recv`] reads it.
struct RecvRing<'a> {
    ring: &'a PageList,
    /// Offset of the ring in `ring`'s buffer.
    offset: u64,
    depth: u32,
    /// log2 of the WQE stride.
    shift: u32,
    max_sge: u32,
    /// The next WQE to consume.
    ci: u32,
}

/// Consumes the receive WQE [`peek_recv`] returned for responder QP `qp`
/// (read against producer index `pi`): advances and publishes the consumer
/// index, and for an SRQ checks its limit (spec 18.21).
fn consume_recv(ctrl: &mut Ctrl, mem: &HostMem, qp: u32, pi: u32) {
    let Some(q) = ctrl.res.qps.get_mut(qp) else {
        return;
    };
    if q.srq == 0 {
        q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
        let _ = doorbell::store(mem, q.db_gpa, QpDoorbell::RQ_CI, q.rt.rq_ci);
        return;
    }
    let srq_h = q.srq;
    let Some(srq) = ctrl.res.srqs.get_mut(srq_h) else {
        return;
    };
    srq.rt.ci = srq.rt.ci.wrapping_add(1);
    let _ = doorbell::store(mem, srq.db_gpa, SrqDoorbell::CI, srq.rt.ci);
    let posted = pi.wrapping_sub(srq.rt.ci);
    if srq.limit != 0 && posted < srq.limit {
        srq.limit = 0;
        ctrl.events.push(EventKind::SRQ_LIMIT_REACHED, srq_h, 0);
    }
}

/// Responder QP `qp` found its receive queue broken (spec 18.18, 18.21):
/// its own receive queue fails the QP with `QP_FATAL`; a broken SRQ fails
/// for good with `SRQ_ERROR`, and every QP attached to it goes to ERR with
/// `QP_FATAL`. No completion is written: no WQE of the queue is trusted.
fn recv_queue_failed(ctrl: &mut Ctrl, qp: u32) {
    let Some(srq_h) = ctrl.res.qps.get(qp).map(|q| q.srq) else {
        return;
    };
    if srq_h == 0 {
        fail_qp(ctrl, qp, Some(EventKind::QP_FATAL));
        return;
    }
    if let Some(srq) = ctrl.res.srqs.get_mut(srq_h) {
        if !srq.rt.broken {
            srq.rt.broken = true;
            ctrl.events.push(EventKind::SRQ_ERROR, srq_h, 0);
        }
    }
    let attached: Vec<u32> = ctrl
        .res
        .qps
        .iter()
        .filter(|(_, q)| q.srq == srq_h)
        .map(|(h, _)| h)
        .collect();
    for h in attached {
        fail_qp(ctrl, h, Some(EventKind::QP_FATAL));
    }
}

/// Resolves a remote range of responder QP `qp` through `rkey`, checking
/// the MR's and the QP's rights for `right`. An rkey that names no MR of
/// the responder, or one of another PD or without `right`, is counted in
/// the requester's (`requester`) `bad_rkey`: that is what guessing keys
/// looks like.
fn remote_segments(
    ctrl: &Ctrl,
    qp: u32,
    requester: usize,
    range: (u32, u64, u64),
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    remote_part(ctrl, qp, requester, range, (0, range.2), right, out)
}

/// [`remote_segments`] that checks the whole range `(rkey, addr, len)` but
/// resolves only the part `(skip, take)` of it (a piece of an RDMA WRITE).
fn remote_part(
    ctrl: &Ctrl,
    qp: u32,
    requester: usize,
    (rkey, addr, len): (u32, u64, u64),
    (skip, take): (u64, u64),
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    let q = ctrl.res.qps.get(qp).ok_or(WcStatus::REM_ACCESS_ERR)?;
    let mr = ctrl
        .res
        .rkeys
        .get(&rkey)
        .and_then(|h| ctrl.res.mrs.get(*h))
        .filter(|mr| mr.pd == q.pd && mr.access & right != 0);
    let Some(mr) = mr else {
        if let Some(c) = ctrl.tenancy().counters(requester) {
            IsolationCounters::bump(&c.bad_rkey);
        }
        return Err(WcStatus::REM_ACCESS_ERR);
    };
    if q.attr.access & right == 0 {
        return Err(WcStatus::REM_ACCESS_ERR);
    }
    out.clear();
    if (skip, take) == (0, len) {
        return access::resolve(mr, addr, len, out).map_err(|_| WcStatus::REM_ACCESS_ERR);
    }
    let inside = skip.checked_add(take).is_some_and(|end| end <= len);
    if !inside || (len > 0 && mr.translate(addr, len).is_none()) {
        return Err(WcStatus::REM_ACCESS_ERR);
    }
    let start = addr.checked_add(skip).ok_or(WcStatus::REM_ACCESS_ERR)?;
    access::resolve(mr, start, take, out).map_err(|_| WcStatus::REM_ACCESS_ERR)
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
    ctrl: &Ctrl,
    qp: u32,
    req: &Request<'_>,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    if req.len > 0 {
        return remote_range(ctrl, qp, req, acc::REMOTE_WRITE, out);
    }
    out.clear();
    match ctrl.res.qps.get(qp) {
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
    ctrl: &Ctrl,
    qp: u32,
    req: &Request<'_>,
    right: u32,
    out: &mut Vec<Segment>,
) -> Result<(), WcStatus> {
    let (wr, len) = (req.wr, req.len);
    let (skip, take) = req.part;
    if skip == 0 {
        let range = (wr.hdr.rkey, wr.hdr.remote_addr, len);
        return remote_part(ctrl, qp, req.vm, range, req.part, right, out);
    }
    let addr = wr.hdr.remote_addr.checked_add(skip);
    let addr = addr.ok_or(WcStatus::REM_ACCESS_ERR)?;
    remote_segments(ctrl, qp, req.vm, (wr.hdr.rkey, addr, take), right, out)
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
    // A message executed in pieces counts once, with its last piece.
    let last = req.part.0.saturating_add(req.part.1) >= req.len;
    if matches!(out, RespOutcome::Done) {
        comm_established(ctrl, qp);
        if !last {
            return out;
        }
        if let Some(t) = ctrl.tenancy().traffic(ctrl.vm_index()) {
            TrafficCounters::add_single_writer(&t.recv_ops, 1);
            TrafficCounters::add_single_writer(&t.recv_bytes, req.len);
        }
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
        return RespOutcome::Unreachable;
    };
    if q.qpn != req.dest_qpn {
        // The handle came from a stale hint: the QP is gone.
        return RespOutcome::Stale;
    }
    if !matches!(q.state, QpState::RTR | QpState::RTS | QpState::SQD) {
        return if q.qp_type == QpType::UD {
            RespOutcome::Dropped
        } else {
            RespOutcome::Unreachable
        };
    }
    let ud = q.qp_type == QpType::UD;
    let (recv_cq, my_qpn, pd) = (q.recv_cq, q.qpn, q.pd);
    let min_rnr = q.attr.min_rnr_timer;
    // A responder with max_dest_rd_atomic 0 accepts no RDMA READ or atomic
    // request: an invalid request (spec 18.11.3, 18.18).
    let takes_rd_atomic = q.attr.max_dest_rd_atomic != 0;
    let wr = req.wr;
    let RespScratch {
        recv: recv_buf,
        segs,
    } = scratch;
    match wr.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => {
            if let Err(s) = write_target(ctrl, qp, req, segs) {
                return nak(ctrl, qp, s);
            }
            if wr.opcode == WrOpcode::RDMA_WRITE {
                return match copy_in(req, mem, segs) {
                    Ok(()) => RespOutcome::Done,
                    Err(_) => nak(ctrl, qp, WcStatus::REM_ACCESS_ERR),
                };
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
            return match remote_range(ctrl, qp, req, acc::REMOTE_READ, segs) {
                Ok(()) => match access::copy(mem, segs, req.mem, req.local, req.part.1) {
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
            let range = (wr.hdr.rkey, wr.hdr.remote_addr, 8);
            if let Err(s) = remote_segments(ctrl, qp, req.vm, range, acc::REMOTE_ATOMIC, segs) {
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
    // SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM consume a receive WQE.
    let (skip, take) = req.part;
    let last = skip.saturating_add(take) >= req.len;
    if skip > 0 {
        return next_piece(ctrl, mem, qp, req, scratch, last);
    }
    // A first piece while another message is still arriving: its sender
    // stopped mid-message. As a responder expecting the rest of a message,
    // this one is an invalid request (its receive WQE fails with it).
    if let Some(inb) = ctrl.res.qps.get_mut(qp).and_then(|q| q.rt.inbound.take()) {
        abandon(ctrl, mem, qp, &inb);
        return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
    }
    // The receive WQE is copied and checked in full before any byte of the
    // message is written, so that an RNR, a malformed WQE or a broken queue
    // leaves the responder's memory as it was (spec 18.11.2, 18.13).
    let Peeked { head, pi } = match peek_recv(ctrl, mem, qp, recv_buf) {
        Ok(p) => p,
        Err(Broken) => {
            recv_queue_failed(ctrl, qp);
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
        Head::Empty if ud => return RespOutcome::Dropped,
        Head::Empty => return RespOutcome::Rnr(min_rnr),
        Head::Malformed(wr_id) => {
            return recv_failed(ctrl, mem, qp, pi, wr_id, WcStatus::LOC_QP_OP_ERR, ud)
        }
    };
    if !last {
        // The first of several pieces: the receive WQE must hold the whole
        // message, and is consumed now and completed with the last piece.
        let sges = if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
            Vec::new()
        } else {
            match check_local(ctrl, pd, recv.sges, true) {
                Ok(room) if room >= req.len => recv.sges.to_vec(),
                Ok(_) => {
                    return recv_failed(ctrl, mem, qp, pi, recv.wr_id, WcStatus::LOC_LEN_ERR, ud)
                }
                Err(status) => return recv_failed(ctrl, mem, qp, pi, recv.wr_id, status, ud),
            }
        };
        consume_recv(ctrl, mem, qp, pi);
        let inb = Inbound {
            wr_id: recv.wr_id,
            sges,
            len: req.len,
            placed: 0,
        };
        return place_piece(ctrl, mem, qp, req, scratch, inb, false);
    }
    let placed = if wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM {
        // The data goes to the RDMA target; the receive WQE's buffers are
        // not touched (spec 18.11.2).
        if copy_in(req, mem, segs).is_err() {
            return nak(ctrl, qp, WcStatus::REM_ACCESS_ERR);
        }
        req.len
    } else {
        match place_send(ctrl, mem, req, pd, ud, recv.sges, segs) {
            Ok(n) => n,
            Err(status) => return recv_failed(ctrl, mem, qp, pi, recv.wr_id, status, ud),
        }
    };
    consume_recv(ctrl, mem, qp, pi);
    let cqe = recv_cqe(req, my_qpn, recv.wr_id, placed, ud);
    received(ctrl, mem, qp, recv_cq, cqe)
}

/// Writes the successful receive completion `cqe` of QP `qp` on CQ `cq`.
/// If only that completion is lost, the message was still delivered, so
/// the requester completes normally (spec 18.18, notes); a CQ in error has
/// already failed this QP with QP_FATAL (spec 18.17).
fn received(ctrl: &mut Ctrl, mem: &HostMem, qp: u32, cq: u32, cqe: Cqe) -> RespOutcome {
    if !complete(ctrl, mem, cq, cqe) {
        fail_qp(ctrl, qp, None);
    }
    RespOutcome::Done
}

/// A later piece of a message arriving in pieces at responder QP `qp`: it
/// must continue the message the QP's receive WQE was taken for, exactly
/// where the last piece ended; anything else is an invalid request.
fn next_piece(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
    last: bool,
) -> RespOutcome {
    let inb = ctrl.res.qps.get_mut(qp).and_then(|q| q.rt.inbound.take());
    let Some(inb) = inb.filter(|i| i.len == req.len && i.placed == req.part.0) else {
        return nak(ctrl, qp, WcStatus::REM_INV_REQ_ERR);
    };
    // (An RDMA WRITE with immediate has its piece of the target in
    // `scratch.segs` already, resolved by `perform`.)
    place_piece(ctrl, mem, qp, req, scratch, *inb, last)
}

/// Places piece `req.part` of a message arriving in pieces (receive WQE
/// `inb`) and, with the last piece, writes the receive completion; else
/// keeps `inb` on the QP for the next piece. For an RDMA WRITE with
/// immediate `scratch.segs` holds the piece's part of the RDMA target.
fn place_piece(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    req: &Request<'_>,
    scratch: &mut RespScratch,
    mut inb: Inbound,
    last: bool,
) -> RespOutcome {
    let Some((pd, cq, qpn)) = ctrl.res.qps.get(qp).map(|q| (q.pd, q.recv_cq, q.qpn)) else {
        return RespOutcome::Unreachable;
    };
    let (skip, take) = req.part;
    let segs = &mut scratch.segs;
    if req.wr.opcode != WrOpcode::RDMA_WRITE_WITH_IMM {
        // The receive buffers are checked again for every piece: an MR
        // deregistered meanwhile fails the message.
        if let Err(status) = local_range(ctrl, pd, &inb.sges, true, skip, take, segs) {
            let wr_id = inb.wr_id;
            return piece_failed(ctrl, mem, qp, wr_id, status);
        }
    }
    if copy_in(req, mem, segs).is_err() {
        return piece_failed(ctrl, mem, qp, inb.wr_id, WcStatus::LOC_PROT_ERR);
    }
    inb.placed = skip.saturating_add(take);
    if !last {
        if let Some(q) = ctrl.res.qps.get_mut(qp) {
            q.rt.inbound = Some(Box::new(inb));
        }
        return RespOutcome::Done;
    }
    let cqe = recv_cqe(req, qpn, inb.wr_id, inb.len, false);
    received(ctrl, mem, qp, cq, cqe)
}

/// The receive WQE of a message arriving in pieces (already consumed)
/// cannot take the rest: it completes with `status`, the responder QP goes
/// to ERR, and the requester gets `REM_OP_ERR` (spec 18.18).
fn piece_failed(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    wr_id: u64,
    status: WcStatus,
) -> RespOutcome {
    recv_error(ctrl, mem, qp, wr_id, status);
    fail_qp(ctrl, qp, None);
    RespOutcome::Nak(WcStatus::REM_OP_ERR)
}

/// Completes the receive WQE of a message that stopped arriving midway
/// (its sender went away, or sent something else) with `LOC_QP_OP_ERR`.
fn abandon(ctrl: &mut Ctrl, mem: &HostMem, qp: u32, inb: &Inbound) {
    recv_error(ctrl, mem, qp, inb.wr_id, WcStatus::LOC_QP_OP_ERR);
}

/// Writes the error completion `status` of receive WQE `wr_id` of QP `qp`
/// on its receive CQ, and counts it.
fn recv_error(ctrl: &mut Ctrl, mem: &HostMem, qp: u32, wr_id: u64, status: WcStatus) {
    if let Some(t) = ctrl.tenancy().traffic(ctrl.vm_index()) {
        TrafficCounters::add_single_writer(&t.error_cqes, 1);
    }
    if let Some((cq, qpn)) = ctrl.res.qps.get(qp).map(|q| (q.recv_cq, q.qpn)) {
        let _ = complete(ctrl, mem, cq, error_cqe(wr_id, WcOpcode::RECV, status, qpn));
    }
}

/// A responder QP in ERR whose message was arriving in pieces: its
/// consumed receive WQE completes with `WR_FLUSH_ERR` (spec 18.19).
/// Returns whether there was one.
pub fn flush_inbound(ctrl: &mut Ctrl, mem: &HostMem, qp: u32) -> bool {
    let Some(q) = ctrl.res.qps.get_mut(qp) else {
        return false;
    };
    let Some(inb) = q.rt.inbound.take() else {
        return false;
    };
    let (cq, qpn) = (q.recv_cq, q.qpn);
    let cqe = error_cqe(inb.wr_id, WcOpcode::RECV, WcStatus::WR_FLUSH_ERR, qpn);
    let _ = complete(ctrl, mem, cq, cqe);
    true
}

/// Places a SEND's message — for UD behind the GRH — into the buffers of a
/// receive WQE (`sges`) of a QP in PD `pd`, after checking every SGE and
/// the room (spec 18.9, 18.13). Returns the bytes placed.
fn place_send(
    ctrl: &Ctrl,
    mem: &HostMem,
    req: &Request<'_>,
    pd: u32,
    ud: bool,
    sges: &[Sge],
    segs: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    let grh = if ud { u64::from(UD_GRH_SIZE) } else { 0 };
    let needed = grh.saturating_add(req.len);
    let capacity = local_segments(ctrl, pd, sges, true, needed, segs)?;
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
            dgid: ctrl.port_gid(),
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
fn recv_cqe(req: &Request<'_>, qpn: u32, wr_id: u64, placed: u64, ud: bool) -> Cqe {
    let wr = req.wr;
    let with_imm = matches!(
        wr.opcode,
        WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    let mut flags = 0u8;
    if with_imm {
        flags |= CQE_WITH_IMM;
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
        imm_data: if with_imm { wr.hdr.imm_data } else { 0 },
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
fn recv_failed(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    pi: u32,
    wr_id: u64,
    status: WcStatus,
    ud: bool,
) -> RespOutcome {
    consume_recv(ctrl, mem, qp, pi);
    recv_error(ctrl, mem, qp, wr_id, status);
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

/// Copies the request's payload (inline bytes or local segments) into `dst`:
/// the part of it this execution moves (`req.part`, the whole message but
/// for a plain RDMA WRITE executed in pieces).
fn copy_in(req: &Request<'_>, mem: &HostMem, dst: &[Segment]) -> Result<(), access::AccessError> {
    match req.wr.inline {
        Some(data) => access::write(mem, dst, data),
        None => access::copy(req.mem, req.local, mem, dst, req.part.1),
    }
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
