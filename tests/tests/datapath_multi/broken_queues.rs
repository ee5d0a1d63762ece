//! Unusable and broken queues (spec 18.13, 18.17, 18.18, 18.21): CQ or QP
//! memory the VMM no longer maps, malformed receive WQEs, receive queues and
//! SRQs whose producer index is out of range.

use vhost_user_rdma_tests::dp::{
    ah_to, assert_no_event, assert_quiet, assert_state, collect_events, cq_pair, expect_event,
    failed, ok, pattern, poll_one, rc_qp, sorted, ud_qp, vms, wait_state, wr, write_op, Buf, QKEY,
    QP_ACCESS,
};
use virtio_rdma_abi::datapath::{RecvWqe, SendWqe, Sge as WireSge, WcOpcode, WcStatus, WrOpcode};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType};
use virtio_rdma_driver::{Cq, SendOp, UdDest};
use vm_memory::GuestAddress;

use crate::fixtures::{assert_no_message_fields, conn_qpn, rc_pair};
use crate::raw::{
    bad_opcode_wqe, load_index, raw_connect, raw_cq, raw_post_recv, raw_post_send, raw_qp, raw_srq,
    raw_state, raw_ud_activate, restore_mem, store_index, unmap_page, DEVICE_CI, RAW_DEPTH, RQ_CI,
    RQ_PI,
};

/// A CQ whose ring or doorbell record guest RAM no longer maps (the VMM took
/// the page out of its memory table) is treated like an overflow (spec
/// 18.17, 18.18): the completion is lost, the CQ gets `CQ_ERROR` and every
/// QP using it — as send CQ or as receive CQ — `QP_FATAL`, and those QPs
/// are in ERR. A QP's own unusable send ring or doorbell record fails that
/// QP alone with `QP_FATAL`, without a completion. The VM's other queues
/// keep working.
#[test]
fn unusable_cq_memory_is_a_cq_error() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other = Cq::create(&a.dev, 16).unwrap();
    for what in ["CQ ring", "CQ doorbell record"] {
        let (cq, ring) = raw_cq(a, 16);
        // q1 completes its sends into the CQ, q2 its receives.
        let q1 = raw_qp(a, QpType::RC, cq, other.handle(), 0);
        let q2 = raw_qp(a, QpType::RC, other.handle(), cq, 0);
        raw_connect(a, &q1, q2.qpn, a);
        raw_connect(a, &q2, q1.qpn, a);
        let page = if what == "CQ ring" {
            ring.pages[0]
        } else {
            GuestAddress(ring.db.0 & !4095)
        };
        unmap_page(a, page);
        // q1's malformed WQE needs an error completion in the CQ.
        raw_post_send(a, &q1, 0, bad_opcode_wqe(7));
        let evs = collect_events(&a.dev, 3);
        restore_mem(a);
        assert_eq!(
            evs,
            sorted(vec![
                (Some(EventKind::CQ_ERROR), cq),
                (Some(EventKind::QP_FATAL), q1.handle),
                (Some(EventKind::QP_FATAL), q2.handle),
            ]),
            "{what}"
        );
        assert_eq!(raw_state(a, &q1), u32::from(QpState::ERR), "{what}");
        assert_eq!(raw_state(a, &q2), u32::from(QpState::ERR), "{what}");
        assert_quiet(&other);
    }
    // A QP's doorbell record: the device can no longer read its producer
    // indices, so the QP fails with QP_FATAL without anything posted.
    let q = raw_qp(a, QpType::RC, other.handle(), other.handle(), 0);
    raw_connect(a, &q, q.qpn, a);
    unmap_page(a, GuestAddress(q.ring.db.0 & !4095));
    expect_event(&a.dev, EventKind::QP_FATAL, q.handle);
    assert_eq!(raw_state(a, &q), u32::from(QpState::ERR));
    assert_quiet(&other);
    restore_mem(a);
    assert_no_event(&a.dev, "after the doorbell record came back");
    // A QP's send ring.
    let q = raw_qp(a, QpType::RC, other.handle(), other.handle(), 0);
    raw_connect(a, &q, q.qpn, a);
    unmap_page(a, q.ring.pages[0]);
    let send = SendWqe {
        opcode: WrOpcode::SEND as u8,
        ..bad_opcode_wqe(8)
    };
    raw_post_send(a, &q, 0, send);
    expect_event(&a.dev, EventKind::QP_FATAL, q.handle);
    assert_eq!(raw_state(a, &q), u32::from(QpState::ERR));
    assert_quiet(&other);
    restore_mem(a);
    assert_no_event(&a.dev, "after the send ring came back");
    // The VM's other queues still work.
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, b"still fine");
    p.qa.post_send(&[wr(1, write_op(&bb, 0), &[ba.sge(0, 10)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(0, 10), b"still fine");
}

/// A malformed receive WQE at the responder (spec 18.13: `reserved` not
/// zero, or more SGEs than `max_recv_sge`) is consumed and completes with
/// `LOC_QP_OP_ERR`, carrying no message fields; the RC requester fails with
/// `REM_OP_ERR`; both QPs go to ERR; no event (spec 18.18). The WQE is
/// checked before any byte is written, so an RDMA_WRITE_WITH_IMM writes
/// nothing. A UD receiver fails the same way while its sender succeeds.
#[test]
fn malformed_receive_wqe_completes_with_loc_qp_op_err() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, &pattern(64, 3));
    let sge = WireSge {
        addr: bb.addr(0),
        length: 1024,
        lkey: bb.mr.lkey(),
    };
    let cases = [
        (
            "reserved not zero",
            RecvWqe {
                wr_id: 77,
                num_sge: 1,
                reserved: 1,
            },
        ),
        (
            "num_sge above max_recv_sge",
            RecvWqe {
                wr_id: 77,
                num_sge: 3,
                reserved: 0,
            },
        ),
    ];
    let sg = [ba.sge(0, 64)];
    for (what, wqe) in cases {
        let sges = vec![sge; wqe.num_sge as usize];
        let write_with_imm = SendOp::RdmaWriteWithImm {
            remote_addr: bb.addr(2048),
            rkey: bb.mr.rkey(),
            imm: 5,
        };
        for op in [SendOp::Send, write_with_imm] {
            let (cqa, cqb) = cq_pair(a, b);
            let qa = rc_qp(a, &cqa);
            let qb = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), 0);
            qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
            raw_connect(b, &qb, qa.qpn(), a);
            raw_post_recv(b, &qb, 0, wqe, &sges);
            qa.post_send(&[wr(1, op, &sg)]).unwrap();
            failed(&poll_one(&cqa), 1, WcStatus::REM_OP_ERR);
            let r = poll_one(&cqb);
            failed(&r, 77, WcStatus::LOC_QP_OP_ERR);
            assert_eq!((r.opcode(), r.qpn), (Some(WcOpcode::RECV), qb.qpn), "{r:?}");
            assert_no_message_fields(&r, what);
            wait_state(&qa, QpState::ERR);
            assert_eq!(raw_state(b, &qb), u32::from(QpState::ERR), "{what}");
            assert_eq!(load_index(b, qb.ring.db_at(RQ_CI)), 1, "{what}: consumed");
            bb.assert_untouched(0, 4096, what);
            assert_no_event(&a.dev, what);
            assert_no_event(&b.dev, what);
        }
    }
    // UD.
    let (cqa, cqb) = cq_pair(a, b);
    let ua = ud_qp(a, &cqa, 4);
    let ub = raw_qp(b, QpType::UD, cqb.handle(), cqb.handle(), 0);
    raw_ud_activate(b, &ub);
    raw_post_recv(b, &ub, 0, cases[0].1, &[sge]);
    let ah = ah_to(a, b);
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn,
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    let r = poll_one(&cqb);
    failed(&r, 77, WcStatus::LOC_QP_OP_ERR);
    assert_no_message_fields(&r, "UD");
    assert_eq!(raw_state(b, &ub), u32::from(QpState::ERR));
    assert_state(&ua, QpState::RTS);
    bb.assert_untouched(0, 4096, "UD");
    assert_no_event(&a.dev, "UD sender");
    assert_no_event(&b.dev, "UD receiver");
}

/// A receive queue whose producer index is out of range (`rq_pi - rq_ci`
/// above the depth) is broken (spec 18.18): the responder QP goes to ERR
/// with `QP_FATAL`, consumes nothing and writes no completion. It is
/// unreachable from then on: an RC requester retries and fails with
/// `RETRY_EXC_ERR`, a UD sender's message is dropped.
#[test]
fn receive_queue_out_of_range_is_fatal() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::guarded(a, 4096);
    let sg = [ba.sge(0, 64)];
    // RC.
    let (cqa, cqb) = cq_pair(a, b);
    let qa = rc_qp(a, &cqa);
    let qb = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), 0);
    qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
    raw_connect(b, &qb, qa.qpn(), a);
    store_index(b, qb.ring.db_at(RQ_PI), RAW_DEPTH + 1);
    qa.post_send(&[wr(1, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RETRY_EXC_ERR);
    expect_event(&b.dev, EventKind::QP_FATAL, qb.handle);
    assert_eq!(raw_state(b, &qb), u32::from(QpState::ERR));
    assert_eq!(load_index(b, qb.ring.db_at(RQ_CI)), 0, "nothing consumed");
    assert_quiet(&cqb);
    assert_no_event(&a.dev, "RC requester");
    // UD.
    let (cqa, cqb) = cq_pair(a, b);
    let ua = ud_qp(a, &cqa, 4);
    let ub = raw_qp(b, QpType::UD, cqb.handle(), cqb.handle(), 0);
    raw_ud_activate(b, &ub);
    store_index(b, ub.ring.db_at(RQ_PI), RAW_DEPTH + 1);
    let ah = ah_to(a, b);
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn,
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    expect_event(&b.dev, EventKind::QP_FATAL, ub.handle);
    assert_eq!(raw_state(b, &ub), u32::from(QpState::ERR));
    assert_quiet(&cqb);
    assert_no_event(&a.dev, "UD sender");
}

/// An SRQ whose producer index is out of range fails (spec 18.21): one
/// `SRQ_ERROR`, and every attached QP goes to ERR with `QP_FATAL` (and, as
/// any QP with an SRQ that enters ERR, `QP_LAST_WQE_REACHED`); nothing is
/// consumed or completed, and the requester finds the responder
/// unreachable.
#[test]
fn srq_out_of_range_fails_every_attached_qp() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (srq, srq_ring) = raw_srq(b);
    let (cqa, cqb) = cq_pair(a, b);
    let (qa1, qa2) = (rc_qp(a, &cqa), rc_qp(a, &cqa));
    let qb1 = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), srq);
    let qb2 = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), srq);
    for (qa, qb) in [(&qa1, &qb1), (&qa2, &qb2)] {
        qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
        raw_connect(b, qb, qa.qpn(), a);
    }
    store_index(b, srq_ring.db, RAW_DEPTH + 1);
    let ba = Buf::guarded(a, 4096);
    qa1.post_send(&[wr(1, SendOp::Send, &[ba.sge(0, 64)])])
        .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RETRY_EXC_ERR);
    let evs = collect_events(&b.dev, 5);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::SRQ_ERROR), srq),
            (Some(EventKind::QP_FATAL), qb1.handle),
            (Some(EventKind::QP_FATAL), qb2.handle),
            (Some(EventKind::QP_LAST_WQE_REACHED), qb1.handle),
            (Some(EventKind::QP_LAST_WQE_REACHED), qb2.handle),
        ])
    );
    assert_eq!(raw_state(b, &qb1), u32::from(QpState::ERR));
    assert_eq!(raw_state(b, &qb2), u32::from(QpState::ERR));
    assert_eq!(
        load_index(b, srq_ring.db_at(DEVICE_CI)),
        0,
        "nothing consumed"
    );
    assert_quiet(&cqb);
    assert_state(&qa2, QpState::RTS);
    assert_no_event(&a.dev, "requester VM");
}
