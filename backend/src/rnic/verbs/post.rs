//! Posting the guest's work requests to host queues.
//!
//! A send WQE becomes one `ibv_send_wr` whose scatter list is the guest's
//! own (addresses are iovas of guest regions, keys the host's); inline data
//! is copied by the host at the post. Receive WQEs are posted as the guest
//! posts them, so that a message finds them; their `wr_id`s wait in the
//! RNIC's tables for the completion.

use log::debug;
use rdma_sys::{
    ibv_post_recv, ibv_post_srq_recv, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_wr_opcode, imm_data_invalidated_rkey_union_t, wr_t,
};
use virtio_rdma_abi::datapath::{
    QpDoorbell, Sge, WcOpcode, WcStatus, WrOpcode, WQE_FENCE, WQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType};

use super::chain::{self, Chain, MAX_SGE};
use super::rnic::{lock_tables, Sent, Tables, VerbsRnic, VmHost, RECV_SRQ, RECV_WR};
use crate::engine::completer::{complete, error_cqe};
use crate::engine::doorbell::{self, load_pi};
use crate::engine::requester::{complete_send, Completion};
use crate::engine::sge::check_local;
use crate::engine::wqe::{fetch_recv, posted, RecvRing, WqeBuf, WqeError};
use crate::engine::{count_privileged, management_qp};
use crate::memory::HostMem;
use crate::rnic_objects::RnicObjects;
use crate::rnic_path::{Outgoing, Serving, Step};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;
use crate::vm::cell::Locked;
use crate::vm::VmState;

const NO_SGE: ibv_sge = ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

/// The guest's scatter list in libibverbs' terms, its lkeys the host's
/// (`t`: those of a VM that moved here differ, spec 20.8).
fn host_sges(t: &Tables, sges: &[Sge], out: &mut [ibv_sge; MAX_SGE]) -> Option<usize> {
    if sges.len() > MAX_SGE {
        return None;
    }
    for (o, s) in out.iter_mut().zip(sges) {
        *o = ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: t.host_lkey(s.lkey),
        };
    }
    Some(sges.len())
}

/// The host opcode of a guest's; `None` for the fast-registration
/// opcodes, which the host QP cannot execute for the guest (the engine
/// refuses them before they get here).
fn opcode(op: WrOpcode) -> Option<u32> {
    Some(match op {
        WrOpcode::RDMA_WRITE => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        WrOpcode::RDMA_WRITE_WITH_IMM => ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        WrOpcode::SEND => ibv_wr_opcode::IBV_WR_SEND,
        WrOpcode::SEND_WITH_IMM => ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        WrOpcode::RDMA_READ => ibv_wr_opcode::IBV_WR_RDMA_READ,
        WrOpcode::ATOMIC_CMP_AND_SWP => ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
        WrOpcode::ATOMIC_FETCH_AND_ADD => ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
        WrOpcode::REG_MR | WrOpcode::LOCAL_INV | WrOpcode::SEND_WITH_INV | WrOpcode::BIND_MW => {
            return None
        }
    })
}

/// Takes send WQE `msg` for its host QP into `chain`, which the burst's
/// end posts ([`Step::InFlight`]), or completes it now with the
/// requester's error.
#[allow(clippy::too_many_arguments)]
pub(super) fn send(
    rnic: &VerbsRnic,
    host: &VmHost,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    buf: &mut WqeBuf,
    chain: &mut Chain,
    moved: &mut u64,
    msg: &Outgoing<'_>,
) -> Step {
    let wr = msg.wr;
    // Its destination is moving to another host (spec 20.8): nothing new
    // goes to it until it has, or the hold ends. Looked at before anything
    // else: the destination's old QP may be gone meanwhile.
    if super::rnic::moves::any_held(host) {
        if let Some(until) = super::rnic::moves::held(host, msg.src_qpn, std::time::Instant::now())
        {
            return Step::Wait(until);
        }
    }
    let local = msg.av.dgid == rnic.device().gid().0;
    let gone = local && !msg.ud() && dest_gone(rnic, cx.state, msg);
    if local && !gone && consumes_receive(wr.opcode) {
        take_peer_recvs(rnic, tenancy, cx, buf, msg.dest_qpn);
    }
    let (state, mem) = (&mut *cx.state, cx.mem);
    let mut t = lock_tables(host);
    // A WQE completed here must not overtake those the host still has: it
    // waits at the head until they completed (the CQ keeps the queue's
    // order).
    let in_flight = t.qps.get(&msg.src_qpn).is_some_and(|q| !q.sent.is_empty());
    let failed = |state: &mut VmState, status| {
        if in_flight {
            return Step::Busy;
        }
        let c = Completion::failed(wr.hdr.wr_id, msg.op, status);
        complete_send(state, mem, msg.qp, msg.index, c)
    };
    // The local buffers are checked as on the software RNIC (key, PD,
    // rights, bounds), so that the status does not depend on the NIC; the
    // NIC checks them again.
    if wr.inline.is_none() {
        if let Err(status) = check_local(state, msg.pd, wr.sges, msg.writes_local) {
            drop(t);
            return failed(state, status);
        }
    }
    if gone && msg.qp_type == QpType::UC {
        // UC: a message to a destroyed QP is lost without a word (spec
        // 18.11.6, 18.23); it must not reach a QP that reuses the number.
        if in_flight {
            return Step::Busy;
        }
        drop(t);
        let c = Completion::ok(wr.hdr.wr_id, msg.op, 0);
        return complete_send(state, mem, msg.qp, msg.index, c);
    }
    if gone {
        // The QP it is connected to on this host was destroyed (spec
        // 18.23): nothing more goes to its host QP number, which the host
        // NIC may give to any QP. The WQE fails with RETRY_EXC_ERR.
        debug!(
            "QPN {:#x}: destination {:#x} destroyed",
            msg.src_qpn, msg.dest_qpn
        );
        if let Some(q) = state.res.qps.get_mut(msg.qp) {
            q.rt.dest_gone = true;
        }
        let Some(q) = t.qps.get_mut(&msg.src_qpn).filter(|_| in_flight) else {
            drop(t);
            return failed(state, WcStatus::RETRY_EXC_ERR);
        };
        // Sends the host took first may wait for ever for the NIC's
        // retries: the QP fails now, as the watchdog fails it, and the
        // oldest of them reports RETRY_EXC_ERR; this one is flushed.
        q.timed_out = true;
        q.progress = None;
        drop(t);
        state.qp_enter_err(msg.qp, None);
        return Step::Broken;
    }
    let ah = if msg.ud() {
        // The management QPs of the host's port or of a remote one: never
        // the guest's to reach (spec 18.11.5).
        if management_qp(msg.dest_qpn) {
            drop(t);
            count_privileged(tenancy, cx.vm);
            return failed(state, WcStatus::LOC_QP_OP_ERR);
        }
        // Another tenant's QP on this host is out of reach as on the
        // software RNIC: the message is dropped, as UD may be.
        if local {
            let reachable = rnic
                .lookup_qpn(msg.dest_qpn)
                .is_some_and(|o| tenancy.may_reach(cx.vm, o.vm));
            if !reachable {
                if let Some(tr) = tenancy.traffic(cx.vm) {
                    TrafficCounters::add_single_writer(&tr.drops, 1);
                }
                drop(t);
                if in_flight {
                    return Step::Busy;
                }
                return if msg.signaled {
                    let c = Completion::ok(wr.hdr.wr_id, msg.op, len32(msg.len));
                    complete_send(state, mem, msg.qp, msg.index, c)
                } else {
                    Step::Done { published: false }
                };
            }
        }
        match t.ahs.get(&wr.hdr.ah_handle) {
            Some(a) => a.as_ptr(),
            None => {
                drop(t);
                return failed(state, WcStatus::LOC_QP_OP_ERR);
            }
        }
    } else {
        std::ptr::null_mut()
    };
    let Some(q) = t.qps.get(&msg.src_qpn) else {
        drop(t);
        return failed(state, WcStatus::LOC_QP_OP_ERR);
    };
    // At most a send queue's depth on the host: the rest waits at the head
    // of the guest's ring for completions.
    if q.sent.len() >= q.sq_depth.max(1) as usize {
        return Step::Busy;
    }
    let rkey = match &q.rkeys {
        Some(m) => m.get(&wr.hdr.rkey).copied().unwrap_or(wr.hdr.rkey),
        None => wr.hdr.rkey,
    };
    let mut sges = [NO_SGE; MAX_SGE];
    // Signaled on the host if the guest asked; the chain's post signals
    // its last request too.
    let mut flags = 0;
    if msg.signaled {
        flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if wr.hdr.flags & WQE_SOLICITED != 0 {
        flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if wr.hdr.flags & WQE_FENCE != 0 {
        flags |= ibv_send_flags::IBV_SEND_FENCE.0;
    }
    let nsge = match wr.inline {
        // The host copies inline data at the post; the chain keeps a copy
        // until then.
        Some(_) => {
            flags |= ibv_send_flags::IBV_SEND_INLINE.0;
            0
        }
        None => match host_sges(&t, wr.sges, &mut sges) {
            Some(n) => n,
            None => {
                drop(t);
                return failed(state, WcStatus::LOC_QP_OP_ERR);
            }
        },
    };
    let remote = match wr.opcode {
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => wr_t {
            atomic: rdma_sys::atomic_t {
                remote_addr: wr.hdr.remote_addr,
                compare_add: wr.hdr.compare_add,
                swap: wr.hdr.swap,
                rkey,
            },
        },
        _ if msg.ud() => wr_t {
            ud: rdma_sys::ud_t {
                ah,
                remote_qpn: msg.dest_qpn,
                remote_qkey: msg.qkey,
            },
        },
        _ => wr_t {
            rdma: rdma_sys::rdma_t {
                remote_addr: wr.hdr.remote_addr,
                rkey,
            },
        },
    };
    let Some(op) = opcode(wr.opcode) else {
        drop(t);
        return failed(state, WcStatus::LOC_QP_OP_ERR);
    };
    // SAFETY: all-zero is a valid work request; every field used is set
    // here or by the chain.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.opcode = op;
    w.send_flags = flags;
    // Immediate data is the guest's 32 bits, passed as they are.
    w.imm_data_invalidated_rkey_union = imm_data_invalidated_rkey_union_t {
        imm_data: wr.hdr.imm_data,
    };
    w.wr = remote;
    // The requests waiting in the chain go first if this one cannot join
    // them (full, or another QP's).
    if chain.must_post_before(msg.src_qpn) {
        chain::post(chain, &mut t, state, mem);
    }
    let Some(q) = t.qps.get_mut(&msg.src_qpn) else {
        drop(t);
        return failed(state, WcStatus::LOC_QP_OP_ERR);
    };
    if q.failed {
        // The host refused the post before: the QP fails (its work
        // requests are completed by then or with the host's flush).
        return Step::Busy;
    }
    let seq = q.next_seq;
    let sg = sges.get(..nsge).unwrap_or(&[]);
    if !chain.push(msg.src_qpn, w, sg, wr.inline, seq) {
        drop(t);
        return failed(state, WcStatus::LOC_QP_OP_ERR);
    }
    q.next_seq = seq.wrapping_add(1);
    if q.sent.is_empty() {
        q.progress = Some(std::time::Instant::now());
    }
    q.sent.push_back(Sent {
        seq,
        posted: true,
        wr_id: wr.hdr.wr_id,
        op: msg.op,
        signaled: msg.signaled,
        len: len32(msg.len),
    });
    *moved = msg.len;
    Step::InFlight
}

/// Whether RC message `msg` is addressed to a QP of this host that was
/// destroyed since its QP was connected to it: the QP number is free or
/// another QP's (spec 18.23).
fn dest_gone(rnic: &VerbsRnic, state: &VmState, msg: &Outgoing<'_>) -> bool {
    let bound = state
        .res
        .qps
        .get(msg.qp)
        .and_then(|q| q.rt.dest_incarnation);
    bound.is_some_and(|b| rnic.lookup_qpn(msg.dest_qpn).map(|o| o.incarnation) != Some(b))
}

fn consumes_receive(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    )
}

/// A message to a QP on this host consumes a receive its guest may have
/// posted before this send was, but that the engine has not taken yet
/// (another VM's, served later in the sweep or by another engine thread):
/// those receives are posted to the host first, so the message finds them
/// as it would on the software RNIC — a UD message without a receive is
/// dropped, and an RC one would wait out an RNR timer. Only a reachable
/// destination, at most its ring's worth, and only if its VM's lock is
/// free (otherwise the engine serving it is about to post them).
fn take_peer_recvs(
    rnic: &VerbsRnic,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    buf: &mut WqeBuf,
    dest_qpn: u32,
) {
    let Some(o) = rnic.lookup_qpn(dest_qpn) else {
        return;
    };
    let Some(host) = rnic.vm(o.vm) else {
        return;
    };
    if o.vm == cx.vm {
        take_recvs(host, cx.state, cx.mem, buf, o.handle);
        return;
    }
    if !tenancy.may_reach(cx.vm, o.vm) {
        return;
    }
    let Some(cell) = cx.vms.get(o.vm).and_then(Option::as_ref) else {
        return;
    };
    let ran = cell.try_with_dataplane(|state, mem| {
        let before = state.events.len();
        take_recvs(host, state, mem, buf, o.handle);
        // A QP that failed there is flushed even if its VM is parked.
        cell.engine_changed(state);
        state.events.len() != before
    });
    if let Locked::Ran(true) = ran {
        cell.wake_events();
    }
}

/// Posts the receives QP `h` of a VM has in its ring and the host has not
/// (those of its SRQs if it has one).
fn take_recvs(host: &VmHost, state: &mut VmState, mem: &HostMem, buf: &mut WqeBuf, h: u32) {
    let Some(qp) = state.res.qps.get(h) else {
        return;
    };
    if qp.srq != 0 {
        srq_recvs(host, state, mem, buf);
        return;
    }
    if !matches!(
        qp.state,
        QpState::INIT | QpState::RTR | QpState::RTS | QpState::SQD
    ) {
        return;
    }
    let Some(pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ) else {
        return;
    };
    if pi != qp.rt.rq_ci.wrapping_add(qp.rt.recv_outstanding) {
        let depth = qp.rq_depth;
        recvs(host, state, mem, buf, h, pi, depth);
    }
}

fn len32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Posts one receive to a host QP (`srq` false) or SRQ; its scatter list
/// is the host's already ([`host_sges`]).
fn post_one(
    target: *mut libc::c_void,
    srq: bool,
    wr_id: u64,
    sges: &mut [ibv_sge],
) -> Result<(), i32> {
    let mut w = ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: i32::try_from(sges.len()).unwrap_or(0),
    };
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: `target` is a live QP or SRQ (as `srq` says) of the VM's
    // table, locked by the caller; `w` and its SGEs live across the call.
    let rc = unsafe {
        if srq {
            ibv_post_srq_recv(target.cast(), &mut w, &mut bad)
        } else {
            ibv_post_recv(target.cast(), &mut w, &mut bad)
        }
    };
    if rc != 0 {
        return Err(rc);
    }
    Ok(())
}

/// Posts the receive WQEs of QP `h`'s own receive queue from the first
/// not yet posted up to `rq_pi` (at most `max`); true if any was.
pub(super) fn recvs(
    host: &VmHost,
    state: &mut VmState,
    mem: &HostMem,
    buf: &mut WqeBuf,
    h: u32,
    rq_pi: u32,
    max: u32,
) -> bool {
    let mut t = lock_tables(host);
    let mut did = false;
    for _ in 0..max {
        let Some(qp) = state.res.qps.get(h) else {
            return did;
        };
        let next = qp.rt.rq_ci.wrapping_add(qp.rt.recv_outstanding);
        let Some(1..) = posted(rq_pi, next, qp.rq_depth) else {
            // Nothing more, or more than the ring holds past what the
            // host has (the driver's indices are wrong).
            if posted(rq_pi, qp.rt.rq_ci, qp.rq_depth).is_none() {
                drop(t);
                state.qp_enter_err(h, Some(EventKind::QP_FATAL));
                return true;
            }
            return did;
        };
        let (qpn, recv_cq) = (qp.qpn, qp.recv_cq);
        if !t.qps.contains_key(&qpn) {
            return did;
        }
        match fetch_recv(mem, &RecvRing::of_qp(qp), next, buf) {
            Ok(wr) => {
                let mut list = [NO_SGE; MAX_SGE];
                let sges = host_sges(&t, wr.sges, &mut list).and_then(|n| list.get_mut(..n));
                let (Some(sges), Some(hq)) = (sges, t.qps.get_mut(&qpn)) else {
                    return did;
                };
                if let Err(rc) = post_one(hq.qp.as_ptr().cast(), false, RECV_WR, sges) {
                    debug!("QPN {qpn:#x}: ibv_post_recv: errno {rc}");
                    return did;
                }
                hq.recvd.push_back(wr.wr_id);
                if let Some(q) = state.res.qps.get_mut(h) {
                    q.rt.recv_outstanding = q.rt.recv_outstanding.saturating_add(1);
                }
            }
            Err(WqeError::Malformed { wr_id, .. }) => {
                // It completes in its turn, after those the host has.
                if qp.rt.recv_outstanding > 0 {
                    return did;
                }
                let cqe = error_cqe(wr_id, WcOpcode::RECV, WcStatus::LOC_QP_OP_ERR, qpn);
                if let Some(q) = state.res.qps.get_mut(h) {
                    q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
                    let _ = doorbell::store(mem, q.db_gpa, QpDoorbell::RQ_CI, q.rt.rq_ci);
                }
                drop(t);
                let _ = complete(state, mem, recv_cq, cqe);
                state.qp_enter_err(h, None);
                return true;
            }
            Err(WqeError::Unusable) => {
                drop(t);
                state.qp_enter_err(h, Some(EventKind::QP_FATAL));
                return true;
            }
        }
        did = true;
    }
    did
}

/// SRQ `h` is broken: it fails for good with `SRQ_ERROR` and its QPs with
/// it (`QP_FATAL`), as on the software RNIC (spec 18.21). What the host SRQ
/// took completes as the host reports it.
fn srq_failed(state: &mut VmState, h: u32) {
    if let Some(s) = state.res.srqs.get_mut(h) {
        s.rt.broken = true;
    }
    state.events.push(EventKind::SRQ_ERROR, h, 0);
    state.fail_qps(|q| q.srq == h);
}

/// Posts the new receive WQEs of the VM's SRQs; true if any was.
pub(super) fn srq_recvs(
    host: &VmHost,
    state: &mut VmState,
    mem: &HostMem,
    buf: &mut WqeBuf,
) -> bool {
    let mut t = lock_tables(host);
    let mut did = false;
    let handles: Vec<u32> = t.srqs.keys().copied().collect();
    for h in handles {
        while let Some(srq) = state.res.srqs.get(h) {
            if srq.rt.broken {
                break;
            }
            let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ);
            // Its record left RAM, or the driver claims more than the ring
            // holds: the SRQ is broken (spec 18.21).
            let Some(pi) = pi.filter(|&pi| posted(pi, srq.rt.ci, srq.depth).is_some()) else {
                srq_failed(state, h);
                did = true;
                break;
            };
            let next = srq.rt.ci.wrapping_add(srq.rt.outstanding);
            if posted(pi, next, srq.depth).unwrap_or(0) == 0 {
                break;
            }
            if t.srqs.get(&h).is_none_or(|hs| hs.free.is_empty()) {
                break;
            }
            let wr = match fetch_recv(mem, &RecvRing::of_srq(srq), next, buf) {
                Ok(wr) => wr,
                Err(_) => {
                    srq_failed(state, h);
                    did = true;
                    break;
                }
            };
            let mut list = [NO_SGE; MAX_SGE];
            let sges = host_sges(&t, wr.sges, &mut list).and_then(|n| list.get_mut(..n));
            let (Some(sges), Some(hs)) = (sges, t.srqs.get_mut(&h)) else {
                break;
            };
            let Some(slot) = hs.free.pop() else {
                break;
            };
            let host_id = RECV_WR | RECV_SRQ | u64::from(slot);
            if let Err(rc) = post_one(hs.srq.as_ptr().cast(), true, host_id, sges) {
                debug!("SRQ {h:#x}: ibv_post_srq_recv: errno {rc}");
                hs.free.push(slot);
                break;
            }
            if let Some(w) = hs.wr_ids.get_mut(slot as usize) {
                *w = (wr.wr_id, next);
            }
            if let Some(s) = state.res.srqs.get_mut(h) {
                s.rt.outstanding = s.rt.outstanding.saturating_add(1);
            }
            did = true;
        }
    }
    did
}
