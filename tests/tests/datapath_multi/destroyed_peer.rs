//! An RC QP whose peer QP is destroyed (spec 18.23): nothing happens to it
//! when the peer goes — its posted receives stay posted and it stays in
//! RTS, as on a fabric, where a QP learns of its peer's end only when it
//! next sends. Its next send to the destroyed QP completes at once with
//! `RETRY_EXC_ERR` (the device knows the QP is gone; no retries), the QP
//! moves to `ERR` and its receives are flushed. That holds even when the
//! destroyed QP's number has been given to a new QP meanwhile: the new QP
//! receives nothing.
//!
//! The connections retry without end (`timeout` 0): without the rule the
//! sends would never complete.

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, assert_state, conn, conn_qpn, failed, ok, poll_n, poll_one,
    rc_pair_with, rc_qp, recv, vms, wait_state, wr, Buf, Pair, Vm, QP_ACCESS, QUIET,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::rnics::RecyclingQpns;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, RcConnect, SendOp};

/// `c` retrying an unreachable destination for ever (`timeout` 0, spec
/// 18.20): only the destroyed-peer rule can complete such a send.
fn forever(mut c: RcConnect) -> RcConnect {
    c.timeout = 0;
    c
}

/// `p.qa` (on `a`) is destroyed; `p.qb` (on `b`) has two receives posted.
/// They stay posted and `p.qb` in RTS until it sends; its SEND then fails
/// with `RETRY_EXC_ERR`, its receives are flushed after it, and it is in
/// `ERR`. No event for either side (a requester's retries running out
/// queue none, spec 18.18).
fn destroyed_peer_fails_the_next_send(a: &Vm, b: &Vm) {
    let Pair { cqa, cqb, qa, qb } = rc_pair_with(a, b, forever);
    let bb = Buf::guarded(b, 4096);
    recv(&qb, 1, &[bb.sge(0, 1024)]);
    recv(&qb, 2, &[bb.sge(1024, 1024)]);
    qa.destroy().unwrap();
    drop(cqa);
    // Nothing happens to the peer until it acts.
    assert_quiet(&cqb);
    assert_state(&qb, QpState::RTS);
    assert_no_event(&b.dev, "the peer, before it sends");
    bb.write(2048, b"hello");
    qb.post_send(&[wr(3, SendOp::Send, &[bb.sge(2048, 5)])])
        .unwrap();
    let wcs = poll_n(&cqb, 3);
    failed(&wcs[0], 3, WcStatus::RETRY_EXC_ERR);
    failed(&wcs[1], 1, WcStatus::WR_FLUSH_ERR);
    failed(&wcs[2], 2, WcStatus::WR_FLUSH_ERR);
    wait_state(&qb, QpState::ERR);
    // Later sends are flushed.
    qb.post_send(&[wr(4, SendOp::Send, &[bb.sge(2048, 5)])])
        .unwrap();
    failed(&poll_one(&cqb), 4, WcStatus::WR_FLUSH_ERR);
    assert_quiet(&cqb);
    assert_no_event(&b.dev, "the peer");
    assert_no_event(&a.dev, "the destroying side");
    bb.assert_untouched(0, 2048, "the flushed receives");
}

/// Both QPs in one VM.
#[test]
fn a_destroyed_peer_in_the_same_vm_fails_the_next_send_only() {
    let (_d, vm) = vms(1);
    destroyed_peer_fails_the_next_send(&vm[0], &vm[0]);
}

/// The QPs in two VMs of one tenant.
#[test]
fn a_destroyed_peer_in_another_vm_fails_the_next_send_only() {
    let (_d, vm) = vms(2);
    destroyed_peer_fails_the_next_send(&vm[0], &vm[1]);
}

/// A daemon whose QP numbers are handed out again as soon as they are
/// freed (last freed, first reused), with VMs 0 and 1.
fn reusing_daemon() -> (TestDaemon, Vm, Vm) {
    let d = TestDaemon::with_soft_rnic(2, Arc::new(RecyclingQpns::new(true))).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    (d, a, b)
}

/// B's QP is destroyed before A's QP sent it anything, and its number goes
/// to a new QP of B, connected to A's QP and with a receive posted. A's
/// next SEND fails with `RETRY_EXC_ERR`; the new QP receives nothing (its
/// receive is untouched: the next SEND it gets, from a QP connected since,
/// lands in it).
#[test]
fn a_qp_number_reused_after_the_destroy_receives_nothing() {
    let (_d, a, b) = reusing_daemon();
    let Pair { cqa, cqb, qa, qb } = rc_pair_with(&a, &b, forever);
    let old = qb.qpn();
    qb.destroy().unwrap();
    let cq2 = Cq::create(&b.dev, 64).unwrap();
    let qb2 = rc_qp(&b, &cq2);
    assert_eq!(qb2.qpn(), old, "the test transport reuses the number");
    qb2.rc_connect(QP_ACCESS, &forever(conn(&qa, &a))).unwrap();
    let dst = Buf::guarded(&b, 4096);
    recv(&qb2, 10, &[dst.sge(0, 64)]);
    let src = Buf::new(&a, 4096);
    src.write(0, b"to the old QP");
    qa.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 13)])])
        .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RETRY_EXC_ERR);
    wait_state(&qa, QpState::ERR);
    assert_quiet(&cq2);
    assert_quiet(&cqb);
    dst.assert_untouched(0, 4096, "the new QP's receive buffer");
    assert_no_event(&b.dev, "the new QP's VM");
    // The receive is still the new QP's first: a QP connected to it now
    // reaches it, and its SEND lands there.
    let cqa2 = Cq::create(&a.dev, 64).unwrap();
    let qa2 = rc_qp(&a, &cqa2);
    qa2.rc_connect(QP_ACCESS, &forever(conn(&qb2, &b))).unwrap();
    src.write(0, b"to the new QP");
    qa2.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 13)])])
        .unwrap();
    ok(&poll_one(&cqa2), 2, WcOpcode::SEND);
    ok(&poll_one(&cq2), 10, WcOpcode::RECV);
    assert_eq!(dst.read(0, 13), b"to the new QP");
}

/// A QP connected to a QP number that is not live yet (spec 18.20) is
/// bound to the QP that first answers it: once that QP is destroyed and
/// its number reused, the next SEND fails with `RETRY_EXC_ERR` and the
/// newest QP receives nothing.
#[test]
fn a_qp_connected_before_its_peer_existed_is_bound_by_its_first_message() {
    let (_d, a, b) = reusing_daemon();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let qa = rc_qp(&a, &cqa);
    // The test transport counts numbers up: the next QP gets this one.
    let next = qa.qpn() + 1;
    qa.rc_connect(QP_ACCESS, &forever(conn_qpn(next, &b)))
        .unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let qb = rc_qp(&b, &cqb);
    assert_eq!(qb.qpn(), next);
    qb.rc_connect(QP_ACCESS, &forever(conn(&qa, &a))).unwrap();
    let dst = Buf::guarded(&b, 4096);
    recv(&qb, 1, &[dst.sge(0, 64)]);
    let src = Buf::new(&a, 4096);
    src.write(0, b"first");
    qa.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 5)])])
        .unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::SEND);
    ok(&poll_one(&cqb), 1, WcOpcode::RECV);
    // The QP that answered goes; a new one gets its number.
    qb.destroy().unwrap();
    let cq2 = Cq::create(&b.dev, 64).unwrap();
    let qb2 = rc_qp(&b, &cq2);
    assert_eq!(qb2.qpn(), next);
    qb2.rc_connect(QP_ACCESS, &forever(conn(&qa, &a))).unwrap();
    recv(&qb2, 2, &[dst.sge(64, 64)]);
    qa.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 5)])])
        .unwrap();
    failed(&poll_one(&cqa), 2, WcStatus::RETRY_EXC_ERR);
    assert_quiet(&cq2);
    dst.assert_untouched(64, 4096 - 64, "the new QP's receive buffer");
}

/// What unmodified `ibv_rc_pingpong` does: the client keeps spare receives
/// posted; the server destroys its QP first. The client's receives are not
/// flushed and its QP stays in RTS; it destroys its QP without an error
/// completion or event.
#[test]
fn spare_receives_of_a_client_outlive_the_server_qp() {
    let (_d, vm) = vms(2);
    let (server, client) = (&vm[0], &vm[1]);
    let Pair {
        cqa: scq,
        cqb: ccq,
        qa: sqp,
        qb: cqp,
    } = rc_pair_with(server, client, |c| c);
    let (sb, cb) = (Buf::new(server, 4096), Buf::guarded(client, 4096));
    for i in 0..4u64 {
        let at = usize::try_from(i).unwrap() * 64;
        recv(&cqp, i, &[cb.sge(at, 64)]);
    }
    recv(&sqp, 100, &[sb.sge(0, 64)]);
    // One round trip.
    cb.write(1024, b"ping");
    cqp.post_send(&[wr(50, SendOp::Send, &[cb.sge(1024, 4)])])
        .unwrap();
    ok(&poll_one(&ccq), 50, WcOpcode::SEND);
    ok(&poll_one(&scq), 100, WcOpcode::RECV);
    sb.write(64, b"pong");
    sqp.post_send(&[wr(101, SendOp::Send, &[sb.sge(64, 4)])])
        .unwrap();
    ok(&poll_one(&scq), 101, WcOpcode::SEND);
    ok(&poll_one(&ccq), 0, WcOpcode::RECV);
    // The server is done first.
    sqp.destroy().unwrap();
    std::thread::sleep(QUIET);
    assert_quiet(&ccq);
    assert_state(&cqp, QpState::RTS);
    assert_no_event(&client.dev, "the client");
    cqp.destroy().unwrap();
    assert_quiet(&ccq);
    cb.assert_untouched(64, 3 * 64, "the spare receives");
}
