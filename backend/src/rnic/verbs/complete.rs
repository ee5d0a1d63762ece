//! Host completions and host events, applied to the VM being served.
//!
//! A send completion takes the oldest send its QP posted (a host QP
//! completes its sends in order); a receive of a QP's own queue the oldest
//! receive, one of an SRQ the slot its `wr_id` names. The guest's consumer
//! indices move on as each receive completes, as on the software RNIC.

use std::time::{Duration, Instant};

use log::{debug, info};
use rdma_sys::{ibv_poll_cq, ibv_wc, ibv_wc_flags, ibv_wc_status};
use virtio_rdma_abi::datapath::{
    Cqe, QpDoorbell, SrqDoorbell, UdGrh, WcOpcode, WcStatus, CQE_GRH, CQE_SOLICITED, CQE_WITH_IMM,
    GRH_NEXT_HEADER_UDP, UD_GRH_SIZE,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType};

use super::attr::{wc_opcode, wc_status};
use super::rnic::{lock_tables, HostEvent, HostQp, Tables, VmHost, RECV_SRQ, RECV_WR};
use super::scratch::Scratch;
use crate::engine::completer::{complete, cq_error, error_cqe};
use crate::engine::doorbell;
use crate::engine::requester::{complete_posted, posted_done, Completion};
use crate::engine::sge::local_segments;
use crate::engine::wqe::{fetch_recv, RecvRing, WqeBuf};
use crate::memory::access::{self, Segment};
use crate::memory::HostMem;
use crate::sync::lock;
use crate::vm::VmState;

/// Applies the host events queued for the VM; true if there were any.
pub(super) fn host_events(host: &VmHost, state: &mut VmState) -> bool {
    let events = {
        let mut q = lock(&host.events);
        if q.is_empty() {
            return false;
        }
        std::mem::take(&mut *q)
    };
    for ev in events {
        match ev {
            HostEvent::Qp(h, EventKind::QP_COMM_EST) => state.comm_established(h),
            HostEvent::Qp(h, EventKind::QP_LAST_WQE_REACHED) => {
                state.events.push(EventKind::QP_LAST_WQE_REACHED, h, 0);
            }
            HostEvent::Qp(h, kind) => {
                if state
                    .res
                    .qps
                    .get(h)
                    .is_some_and(|q| q.state != QpState::ERR)
                {
                    state.qp_enter_err(h, Some(kind));
                }
            }
            HostEvent::CqError(h) => {
                if state.res.cqs.get(h).is_some_and(|c| !c.rt.overflowed) {
                    let _ = cq_error(state, h);
                }
            }
            HostEvent::SrqError(h) => {
                if let Some(s) = state.res.srqs.get_mut(h).filter(|s| !s.rt.broken) {
                    s.rt.broken = true;
                    state.events.push(EventKind::SRQ_ERROR, h, 0);
                }
            }
            HostEvent::DeviceFatal => {
                state.events.push(EventKind::DEVICE_FATAL, 0, 0);
                state.fail_qps(|q| q.state != QpState::RESET);
            }
            HostEvent::Port(down) => {
                let kind = if down {
                    EventKind::PORT_ERROR
                } else {
                    EventKind::PORT_ACTIVE
                };
                state.events.push(kind, virtio_rdma_abi::verbs::PORT_NUM, 0);
                if down {
                    // Whether, and when, a NIC fails the connections of a
                    // port that went down varies (Linux soft-RoCE never
                    // does): the device fails them now, so that no guest
                    // waits for ever (spec appendix D).
                    let n =
                        state.fail_qps(|q| q.qp_type == QpType::RC && q.state != QpState::RESET);
                    if n > 0 {
                        info!("port down: {n} RC QPs of VM {} fail", state.vm_index());
                    }
                }
            }
        }
    }
    true
}

/// Fails the RC QPs of the VM whose oldest outstanding send has seen no
/// completion for much longer than the NIC's own retries should take
/// ([`stalled_after`]): a NIC that never gives up (Linux soft-RoCE after a
/// link flap) must not leave the guest waiting for ever. The host QP moves
/// to ERR and flushes; the first send reports `RETRY_EXC_ERR`.
/// It looks at most once per `every` for a VM.
pub(super) fn watchdog(host: &VmHost, state: &mut VmState, now: Instant, every: Duration) -> bool {
    let mut t = lock_tables(host);
    if t.watched
        .is_some_and(|at| now.saturating_duration_since(at) < every)
    {
        return false;
    }
    t.watched = Some(now);
    let mut hit = Vec::new();
    for (qpn, q) in t.qps.iter_mut() {
        let Some(since) = q.progress else {
            continue;
        };
        let Some(limit) = stalled_after(q.timeout, q.retry_cnt) else {
            continue;
        };
        if q.failed || q.qp_type != QpType::RC || now.saturating_duration_since(since) < limit {
            continue;
        }
        info!(
            "QPN {qpn:#x}: no completion for {:?} (timeout {}, retry_cnt {}): the QP fails",
            now.saturating_duration_since(since),
            q.timeout,
            q.retry_cnt
        );
        q.timed_out = true;
        q.progress = None;
        hit.push(q.handle);
    }
    drop(t);
    let any = !hit.is_empty();
    for h in hit {
        // The flush moves the host QP to ERR (`VerbsPath::flush_taken`).
        state.qp_enter_err(h, None);
    }
    any
}

/// How long an RC QP with `timeout` and `retry_cnt` may go without any send
/// completing before the watchdog fails it: four times the time the IB
/// transport's retries may take (4.096 µs × 2^timeout, retry_cnt + 1
/// times), and at least 2 s; `None` for timeout 0 (the guest asked to
/// wait for ever).
pub(crate) fn stalled_after(timeout: u32, retry_cnt: u32) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let one = Duration::from_nanos(4096u64.checked_shl(timeout.min(31))?);
    let all = one
        .saturating_mul(retry_cnt.min(7).saturating_add(1))
        .saturating_mul(4);
    Some(all.max(Duration::from_secs(2)))
}

/// Reads up to `batch` completions of each of the VM's host CQs and
/// applies them; true if there were any.
pub(super) fn poll_cqs(
    host: &VmHost,
    state: &mut VmState,
    mem: &HostMem,
    ts: &mut Scratch,
) -> bool {
    let mut t = lock_tables(host);
    let mut did = false;
    let Scratch {
        wcs,
        cqs,
        wqe,
        segs,
        ..
    } = ts;
    cqs.clear();
    cqs.extend(t.cqs.values().map(|c| c.cq.as_ptr() as usize));
    for &cq in cqs.iter() {
        let cq = cq as *mut rdma_sys::ibv_cq;
        let n = i32::try_from(wcs.len()).unwrap_or(0);
        // SAFETY: a live CQ of the VM's table (locked: nobody destroys it
        // meanwhile) and room for `n` completions.
        let got = unsafe { ibv_poll_cq(cq, n, wcs.as_mut_ptr()) };
        let got = usize::try_from(got).unwrap_or(0);
        for wc in wcs.iter().take(got) {
            apply(&mut t, state, mem, wc, (wqe, segs));
            did = true;
        }
    }
    did
}

/// Fails with `status` the send work requests at the head of `hq` that
/// the host refused to take (`Sent::posted` false): nothing before them
/// is left to complete. Restarts the watchdog's clock for what is left
/// (called after each send completion).
pub(super) fn drain_unposted(
    hq: &mut HostQp,
    state: &mut VmState,
    mem: &HostMem,
    status: WcStatus,
) {
    while let Some(s) = hq.sent.front().copied().filter(|s| !s.posted) {
        hq.sent.pop_front();
        complete_posted(
            state,
            mem,
            hq.handle,
            Completion::failed(s.wr_id, s.op, status),
        );
    }
    hq.progress = (!hq.sent.is_empty()).then(Instant::now);
}

/// Applies one host completion (`scratch`: for the GRH of a UD receive).
fn apply(
    t: &mut Tables,
    state: &mut VmState,
    mem: &HostMem,
    wc: &ibv_wc,
    scratch: (&mut WqeBuf, &mut Vec<Segment>),
) {
    let qpn = t.device_qpn(wc.qp_num);
    let Some(hq) = t.qps.get_mut(&qpn) else {
        // Its QP was destroyed meanwhile.
        return;
    };
    let h = hq.handle;
    let status = wc_status(wc.status);
    if status != WcStatus::SUCCESS {
        debug!(
            "QPN {:#x}: host completion {:#x}: status {} ({status:?}), vendor error {:#x}",
            wc.qp_num, wc.wr_id, wc.status, wc.vendor_err
        );
    }
    if wc.wr_id & RECV_WR == 0 {
        // The host reports the signaled work requests and the failed ones:
        // every one before it completed, successfully (`chain`).
        let seq = wc.wr_id;
        if hq.sent.front().is_none_or(|s| s.seq > seq) {
            debug!("QPN {:#x}: a send completion without a send", wc.qp_num);
            return;
        }
        while let Some(s) = hq.sent.front().copied().filter(|s| s.seq < seq) {
            hq.sent.pop_front();
            if s.signaled {
                complete_posted(state, mem, h, Completion::ok(s.wr_id, s.op, s.len));
            } else {
                posted_done(state, h);
            }
        }
        let Some(s) = hq.sent.front().copied().filter(|s| s.seq == seq) else {
            debug!("QPN {:#x}: a send completion without a send", wc.qp_num);
            return;
        };
        hq.sent.pop_front();
        // The send the watchdog gave up on reports what the NIC's retries
        // running out would have.
        let status = if std::mem::take(&mut hq.timed_out) && status == WcStatus::WR_FLUSH_ERR {
            WcStatus::RETRY_EXC_ERR
        } else {
            status
        };
        if status == WcStatus::SUCCESS && !s.signaled {
            posted_done(state, h);
        } else if status == WcStatus::SUCCESS {
            complete_posted(state, mem, h, Completion::ok(s.wr_id, s.op, s.len));
        } else {
            complete_posted(state, mem, h, Completion::failed(s.wr_id, s.op, status));
        }
        drain_unposted(hq, state, mem, WcStatus::LOC_QP_OP_ERR);
        return;
    }
    let srq = hq.srq;
    // The receive WQE's `wr_id` and its place in its ring.
    let (wr_id, index) = if wc.wr_id & RECV_SRQ != 0 {
        let slot = (wc.wr_id & 0xffff_ffff) as u32;
        let Some(hs) = t.srqs.get_mut(&srq) else {
            return;
        };
        let Some(&w) = hs.wr_ids.get(slot as usize) else {
            return;
        };
        hs.free.push(slot);
        srq_consumed(state, mem, srq);
        w
    } else {
        let Some(w) = hq.recvd.pop_front() else {
            debug!(
                "QPN {:#x}: a receive completion without a receive",
                wc.qp_num
            );
            return;
        };
        let Some(qp) = state.res.qps.get_mut(h) else {
            return;
        };
        if qp.state == QpState::RESET {
            return;
        }
        let index = qp.rt.rq_ci;
        qp.rt.recv_outstanding = qp.rt.recv_outstanding.saturating_sub(1);
        qp.rt.rq_ci = qp.rt.rq_ci.wrapping_add(1);
        let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::RQ_CI, qp.rt.rq_ci);
        (w, index)
    };
    let Some((qpn, recv_cq, ud)) = state
        .res
        .qps
        .get(h)
        .map(|q| (q.qpn, q.recv_cq, q.qp_type == QpType::UD))
    else {
        return;
    };
    let cqe = if status == WcStatus::SUCCESS {
        // The first message received in RTR establishes the connection
        // (spec 13.3), whether or not the NIC reports it.
        state.comm_established(h);
        let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        // libibverbs does not say whether a message was solicited: every
        // receive counts as one, so that a CQ armed for solicited
        // completions is never left asleep (spec appendix D).
        let mut flags = CQE_SOLICITED;
        if with_imm {
            flags |= CQE_WITH_IMM;
        }
        if ud && wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0 {
            flags |= CQE_GRH;
            grh_to_ipv6(state, mem, h, index, scratch);
        }
        Cqe {
            wr_id,
            opcode: wc_opcode(wc.opcode).unwrap_or(WcOpcode::RECV) as u8,
            status: WcStatus::SUCCESS as u8,
            flags,
            owner: 0,
            byte_len: wc.byte_len,
            imm_data: if with_imm {
                // SAFETY: the union's immediate-data view, a plain integer.
                unsafe { wc.imm_data_invalidated_rkey_union.imm_data }
            } else {
                0
            },
            qpn,
            src_qpn: if ud { wc.src_qp } else { 0 },
            vendor_err: 0,
        }
    } else {
        let mut c = error_cqe(wr_id, WcOpcode::RECV, status, qpn);
        c.vendor_err = wc.vendor_err;
        c
    };
    let ok = complete(state, mem, recv_cq, cqe);
    if !ok || (status != WcStatus::SUCCESS && wc.status != ibv_wc_status::IBV_WC_WR_FLUSH_ERR) {
        state.qp_enter_err(h, None);
    }
}

/// The first 40 bytes of a UD receive as the device defines them (spec
/// 18.13: an IPv6 header for every pair of GIDs) from what a RoCEv2 NIC
/// wrote for an IPv4 packet: 20 bytes of zeros, then the IPv4 header.
/// `None` if it is not that.
pub(crate) fn ipv6_grh_of_ipv4(
    b: &[u8; UD_GRH_SIZE as usize],
) -> Option<[u8; UD_GRH_SIZE as usize]> {
    let (zeros, ip) = b.split_at(20);
    let [vihl, tos, l0, l1, _, _, _, _, ttl, proto, _, _, s0, s1, s2, s3, d0, d1, d2, d3] = *ip
    else {
        return None;
    };
    if zeros.iter().any(|&z| z != 0) || vihl != 0x45 || proto != GRH_NEXT_HEADER_UDP {
        return None;
    }
    let v4 = |a, b, c, d| {
        std::net::Ipv4Addr::new(a, b, c, d)
            .to_ipv6_mapped()
            .octets()
    };
    Some(
        UdGrh {
            traffic_class: tos,
            flow_label: 0,
            // IPv4 counts its own 20-byte header, IPv6 does not.
            payload_length: u16::from_be_bytes([l0, l1]).saturating_sub(20),
            hop_limit: ttl,
            sgid: v4(s0, s1, s2, s3),
            dgid: v4(d0, d1, d2, d3),
        }
        .to_bytes(),
    )
}

/// Rewrites the GRH the host NIC placed at the start of UD receive `index`
/// of QP `h`'s queue (its own or its SRQ's) into the device's form. The WQE
/// is read again from the ring, where it stays until its completion, and
/// checked again (a guest that rewrote it only misplaces its own header).
fn grh_to_ipv6(
    state: &VmState,
    mem: &HostMem,
    h: u32,
    index: u32,
    (buf, segs): (&mut WqeBuf, &mut Vec<Segment>),
) {
    let Some(qp) = state.res.qps.get(h) else {
        return;
    };
    let ring = match qp.srq {
        0 => RecvRing::of_qp(qp),
        s => match state.res.srqs.get(s) {
            Some(srq) => RecvRing::of_srq(srq),
            None => return,
        },
    };
    let Ok(wr) = fetch_recv(mem, &ring, index, buf) else {
        return;
    };
    let mut grh = [0u8; UD_GRH_SIZE as usize];
    let got = local_segments(state, qp.pd, wr.sges, true, u64::from(UD_GRH_SIZE), segs);
    if got.is_err() || access::total(segs) != u64::from(UD_GRH_SIZE) {
        return;
    }
    if access::read(mem, segs, &mut grh).is_err() {
        return;
    }
    if let Some(v6) = ipv6_grh_of_ipv4(&grh) {
        let _ = access::write(mem, segs, &v6);
    }
}

/// One receive of SRQ `h` completed: its consumer index moves on, and the
/// limit event fires when the posted receives fall below it (spec 18.21).
fn srq_consumed(state: &mut VmState, mem: &HostMem, h: u32) {
    let Some(srq) = state.res.srqs.get_mut(h) else {
        return;
    };
    srq.rt.outstanding = srq.rt.outstanding.saturating_sub(1);
    srq.rt.ci = srq.rt.ci.wrapping_add(1);
    let _ = doorbell::store(mem, srq.db_gpa, SrqDoorbell::CI, srq.rt.ci);
    let pi = doorbell::load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), doorbell::SRQ)
        .unwrap_or(srq.rt.ci);
    let posted = pi.wrapping_sub(srq.rt.ci);
    if srq.limit != 0 && posted < srq.limit {
        srq.limit = 0;
        state.events.push(EventKind::SRQ_LIMIT_REACHED, h, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four times the NIC's budget of `retry_cnt` + 1 tries of 4.096 µs ×
    /// 2^`timeout` each, at least 2 s, none for timeout 0.
    #[test]
    fn the_watchdog_waits_for_the_nics_own_retries() {
        assert_eq!(stalled_after(0, 7), None, "timeout 0: for ever");
        // 16.8 ms × 8 × 4 = 0.54 s: the floor.
        assert_eq!(stalled_after(12, 7), Some(Duration::from_secs(2)));
        // 67.1 ms × 8 × 4 = 2.147 s.
        assert_eq!(
            stalled_after(14, 7),
            Some(Duration::from_nanos(4096 << 14) * 32)
        );
        // 4.096 µs × 2^20 ≈ 4.3 s, 8 tries, four times over.
        let long = stalled_after(20, 7).unwrap();
        assert!(long > Duration::from_secs(130) && long < Duration::from_secs(140));
        assert!(stalled_after(31, 7).is_some(), "no overflow");
    }

    /// What rxe writes for a UD message from 10.43.0.2 to 10.43.0.1 (TOS
    /// 0x20, TTL 64, IPv4 total length 80) becomes the IPv6 form with
    /// IPv4-mapped GIDs; anything else is left alone.
    #[test]
    fn an_ipv4_header_becomes_the_devices_grh() {
        let mut b = [0u8; 40];
        b[20..40].copy_from_slice(&[
            0x45, 0x20, 0, 80, 0x12, 0x34, 0x40, 0, 64, 17, 0xab, 0xcd, 10, 43, 0, 2, 10, 43, 0, 1,
        ]);
        let v6 = ipv6_grh_of_ipv4(&b).unwrap();
        let g = UdGrh::parse(&v6).unwrap();
        assert_eq!(g.traffic_class, 0x20);
        assert_eq!(g.hop_limit, 64);
        assert_eq!(g.payload_length, 60);
        assert_eq!(g.sgid[10..], [0xff, 0xff, 10, 43, 0, 2]);
        assert_eq!(g.dgid[10..], [0xff, 0xff, 10, 43, 0, 1]);
        assert_eq!(g.sgid[..10], [0; 10]);
        // Not IPv4-in-GRH: an IPv6 GRH, a non-zero first half, not UDP.
        assert_eq!(ipv6_grh_of_ipv4(&v6), None);
        let mut odd = b;
        odd[3] = 1;
        assert_eq!(ipv6_grh_of_ipv4(&odd), None);
        let mut tcp = b;
        tcp[29] = 6;
        assert_eq!(ipv6_grh_of_ipv4(&tcp), None);
    }
}
