//! Asynchronous data-path events: a CQ that overflows fails its QPs only
//! (spec 18.17), SRQ limit events and `QP_LAST_WQE_REACHED` (spec 18.19,
//! 18.21).

use std::cell::Cell;

use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, assert_state, collect_events, expect_event, failed, ok, pattern,
    poll_n, poll_one, rc_qp, rc_qp_on, recv, sges, sorted, srq_qp, vms, wr, write_op, Buf, QUIET,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, RecvWr, SendOp, SendWr, Srq};

use crate::fixtures::{connect, rc_pair};

// ---------------------------------------------------------------------------
// CQ overflow

/// A CQ of depth 4 that nobody polls overflows on the fifth completion
/// (spec 18.17): exactly one `CQ_ERROR` for it, one `QP_FATAL` for each QP
/// using it (as send CQ or as receive CQ), both QPs in ERR, their flush
/// completions on their other CQs, nothing more in the failed CQ (no CQE,
/// no `CQ_COMPLETION` event even when armed), the responders untouched, and
/// other QP pairs — on the same VMs with other CQs, and on other VMs — keep
/// working.
#[test]
fn cq_overflow_fails_its_qps_only() {
    let (_d, vm) = vms(4);
    let (a, b) = (&vm[0], &vm[1]);
    let small = Cq::create(&a.dev, 4).unwrap();
    assert_eq!(small.depth(), 4);
    let big = Cq::create(&a.dev, 64).unwrap();
    let big2 = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    // qa sends into `small`; qa2 receives into it.
    let qa = rc_qp_on(a, &small, &big);
    let qa2 = rc_qp_on(a, &big2, &small);
    let (qb, qb2) = (rc_qp(b, &cqb), rc_qp(b, &cqb));
    connect(a, &qa, b, &qb);
    connect(a, &qa2, b, &qb2);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    recv(&qa, 50, &[ba.sge(0, 64)]);
    recv(&qa, 51, &[ba.sge(64, 64)]);
    recv(&qa2, 60, &[ba.sge(128, 64)]);
    ba.write(1024, &pattern(64, 1));
    let sg = [ba.sge(1024, 8)];
    let wrs: Vec<SendWr<'_>> = (0..6u64)
        .map(|i| wr(i, write_op(&bb, 8 * i as usize), &sg))
        .collect();
    qa.post_send(&wrs).unwrap();
    let evs = collect_events(&a.dev, 3);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::CQ_ERROR), small.handle()),
            (Some(EventKind::QP_FATAL), qa.handle()),
            (Some(EventKind::QP_FATAL), qa2.handle()),
        ])
    );
    assert_state(&qa, QpState::ERR);
    assert_state(&qa2, QpState::ERR);
    // The four completions that fit, then nothing.
    let wcs = poll_n(&small, 4);
    for (i, wc) in wcs.iter().enumerate() {
        ok(wc, i as u64, WcOpcode::RDMA_WRITE);
    }
    // qa's receives are flushed into its receive CQ.
    let fl = poll_n(&big, 2);
    for (wc, id) in fl.iter().zip([50, 51]) {
        failed(wc, id, WcStatus::WR_FLUSH_ERR);
        assert_eq!(wc.qpn, qa.qpn());
    }
    // qa2's sends are flushed into its send CQ.
    qa2.post_send(&[wr(61, write_op(&bb, 0), &sg)]).unwrap();
    failed(&poll_one(&big2), 61, WcStatus::WR_FLUSH_ERR);
    // The failed CQ stays silent, armed or not, whatever is flushed to it.
    small.req_notify(false);
    qa.post_send(&[wr(7, write_op(&bb, 0), &sg)]).unwrap();
    recv(&qa2, 62, &[ba.sge(0, 8)]);
    assert_quiet(&small);
    assert!(!small.wait_event(Some(QUIET)).unwrap());
    assert_quiet(&big);
    // The responders are unharmed; VM 1 saw no event.
    assert_state(&qb, QpState::RTS);
    assert_state(&qb2, QpState::RTS);
    assert_no_event(&b.dev, "responder VM");
    // Other pairs keep working: VM 0 with other CQs, VMs 2 and 3.
    for (x, y) in [(0, 1), (2, 3), (3, 0)] {
        let p = rc_pair(&vm[x], &vm[y]);
        let (bx, by) = (Buf::guarded(&vm[x], 8192), Buf::guarded(&vm[y], 16384));
        let data = pattern(5000, 77 + x as u64);
        bx.write(0, &data);
        recv(&p.qb, 1, &sges(&by, 8192, 8192));
        let sg = sges(&bx, 0, 4000);
        p.qa.post_send(&[
            wr(2, write_op(&by, 0), &sges(&bx, 0, 5000)),
            wr(3, SendOp::Send, &sg),
        ])
        .unwrap();
        let w = poll_n(&p.cqa, 2);
        ok(&w[0], 2, WcOpcode::RDMA_WRITE);
        ok(&w[1], 3, WcOpcode::SEND);
        let r = poll_one(&p.cqb);
        ok(&r, 1, WcOpcode::RECV);
        assert_eq!(r.byte_len, 4000);
        assert_eq!(by.read(0, 5000), data);
        assert_eq!(by.read(8192, 4000), data[..4000]);
        by.assert_untouched(5000, 8192 - 5000, "between WRITE and SEND");
    }
    assert_no_event(&a.dev, "after the overflow");
}

/// The responder's receive CQ overflows: the message was delivered, so the
/// requester's WQE completes successfully (spec 18.18, notes); the
/// responder gets `CQ_ERROR` and `QP_FATAL` and its QP is in ERR; later
/// sends find it unreachable (`RETRY_EXC_ERR`).
#[test]
fn cq_overflow_at_the_responder_still_delivers() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let small = Cq::create(&b.dev, 2).unwrap();
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &small);
    connect(a, &qa, b, &qb);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    for k in 0..4 {
        recv(&qb, k, &[bb.sge(k as usize * 64, 64)]);
    }
    for k in 0..3u64 {
        let d = pattern(32, 500 + k);
        ba.write(0, &d);
        let sg = [ba.sge(0, 32)];
        qa.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&cqa), k, WcOpcode::SEND);
        assert_eq!(bb.read(k as usize * 64, 32), d, "message {k} delivered");
    }
    let evs = collect_events(&b.dev, 2);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::CQ_ERROR), small.handle()),
            (Some(EventKind::QP_FATAL), qb.handle()),
        ])
    );
    assert_state(&qb, QpState::ERR);
    let sg = [ba.sge(0, 8)];
    qa.post_send(&[wr(9, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&cqa), 9, WcStatus::RETRY_EXC_ERR);
    assert_no_event(&a.dev, "requester VM");
}

// ---------------------------------------------------------------------------
// SRQ limit

/// SRQ limit events (spec 12.19, 18.21): an SRQ on VM 1 shared by QPs
/// connected to VMs 0 and 2. `SRQ_LIMIT_REACHED` is queued exactly once,
/// at the consumption that leaves fewer posted WQEs than the limit, and the
/// limit then reads 0; arming a limit already above the number posted
/// raises nothing until the next consumption; arming again works.
#[test]
fn srq_limit_event_once_per_arming() {
    let (_d, vm) = vms(3);
    let b = &vm[1];
    let srq = Srq::create(&b.pd, 16, 1, 0).unwrap();
    assert_eq!(srq.depth(), 16);
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let (qb0, qb2) = (srq_qp(b, &cqb, &srq), srq_qp(b, &cqb, &srq));
    let (cq0, cq2) = (
        Cq::create(&vm[0].dev, 64).unwrap(),
        Cq::create(&vm[2].dev, 64).unwrap(),
    );
    let (q0, q2) = (rc_qp(&vm[0], &cq0), rc_qp(&vm[2], &cq2));
    connect(&vm[0], &q0, b, &qb0);
    connect(&vm[2], &q2, b, &qb2);
    let (s0, s2) = (Buf::guarded(&vm[0], 4096), Buf::guarded(&vm[2], 4096));
    let rb = Buf::guarded(b, 32 * 128);
    let (posted, consumed) = (Cell::new(0u64), Cell::new(0u64));
    let post = |n: u64| {
        for _ in 0..n {
            let k = posted.get();
            recv_srq(&srq, k, &rb, k as usize * 128);
            posted.set(k + 1);
        }
    };
    // One message from VM 0 or VM 2 (alternating), received through the SRQ.
    let message = || {
        let k = consumed.get();
        let (q, cq, s, qb) = if k % 2 == 0 {
            (&q0, &cq0, &s0, &qb0)
        } else {
            (&q2, &cq2, &s2, &qb2)
        };
        let d = pattern(40 + k as usize, 300 + k);
        s.write(0, &d);
        let sg = [s.sge(0, d.len())];
        q.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(cq), k, WcOpcode::SEND);
        let r = poll_one(&cqb);
        ok(&r, k, WcOpcode::RECV);
        assert_eq!(r.qpn, qb.qpn());
        assert_eq!(rb.read(k as usize * 128, d.len()), d);
        consumed.set(k + 1);
    };
    let limit = || srq.query().unwrap().limit;
    post(8);
    assert_eq!(limit(), 0);
    srq.modify_limit(4).unwrap();
    assert_eq!(limit(), 4);
    assert_no_event(&b.dev, "arming above the posted count");
    // 8 posted: consumptions leave 7, 6, 5, 4 — none below 4.
    for _ in 0..4 {
        message();
        assert_no_event(&b.dev, "posted WQEs not below the limit");
    }
    // 3 < 4: the event, once, and the limit is disarmed.
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    message();
    assert_no_event(&b.dev, "disarmed limit");
    // 2 posted: arming 3 raises nothing by itself ...
    srq.modify_limit(3).unwrap();
    assert_eq!(limit(), 3);
    assert_no_event(&b.dev, "arming below the posted count");
    // ... but the next consumption does.
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    assert_no_event(&b.dev, "one event per arming");
    // 1 + 8 posted; limit 8: 9 -> 8 is not below it, 8 -> 7 is.
    post(8);
    srq.modify_limit(8).unwrap();
    message();
    assert_no_event(&b.dev, "8 posted, limit 8");
    assert_eq!(limit(), 8);
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    while consumed.get() < posted.get() {
        message();
    }
    assert_no_event(&b.dev, "SRQ drained with the limit disarmed");
    assert_quiet(&cqb);
}

fn recv_srq(srq: &Srq, wr_id: u64, b: &Buf, off: usize) {
    srq.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[b.sge(off, 128)],
    }])
    .unwrap();
}

/// A QP attached to an SRQ that enters ERR leaves the SRQ's WQEs to the
/// other QPs and queues one `QP_LAST_WQE_REACHED` (spec 18.19 item 5,
/// 18.21).
#[test]
fn srq_qp_error_last_wqe_reached() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let srq = Srq::create(&b.pd, 16, 1, 0).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let (qb1, qb2) = (srq_qp(b, &cqb, &srq), srq_qp(b, &cqb, &srq));
    let (qa1, qa2) = (rc_qp(a, &cqa), rc_qp(a, &cqa));
    connect(a, &qa1, b, &qb1);
    connect(a, &qa2, b, &qb2);
    let rb = Buf::guarded(b, 4096);
    for k in 0..2u64 {
        recv_srq(&srq, k, &rb, k as usize * 128);
    }
    qb1.to_error().unwrap();
    expect_event(&b.dev, EventKind::QP_LAST_WQE_REACHED, qb1.handle());
    assert_no_event(&b.dev, "one QP_LAST_WQE_REACHED");
    // The SRQ's WQEs were not flushed: qb2 receives the first one.
    assert_quiet(&cqb);
    let sa = Buf::guarded(a, 4096);
    sa.write(0, b"still here");
    let sg = [sa.sge(0, 10)];
    qa2.post_send(&[wr(5, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&cqa), 5, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 0, WcOpcode::RECV);
    assert_eq!(r.qpn, qb2.qpn());
    assert_eq!(rb.read(0, 10), b"still here");
}
