//! Destroying one RC QP fails the RC QPs connected to it (spec 18.23): each
//! moves to `ERR` with one `QP_FATAL` event, and its outstanding and posted
//! work completes with `WR_FLUSH_ERR` instead of retrying into a QP number
//! that is gone (and may be handed out again). QPs connected elsewhere are
//! untouched.

use std::sync::Arc;
use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, assert_state, expect_event, failed, poll_one, recv, vms,
    wait_state, wr, write_and_send_back, Buf, Pair, Vm,
};

use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::rnics::CountingRnic;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::SendOp;

use crate::fixtures::rc_pair;

/// `p.qb` (on `b`) is destroyed while `p.qa` (on `a`) has a receive posted
/// and an idle `other` pair (on `a` and `b`) is connected: `p.qa` fails
/// with `QP_FATAL`, its receive and a send posted afterwards are flushed;
/// `other` carries on.
fn destroying_fails_the_peer(a: &Vm, b: &Vm, p: Pair, other: &Pair) {
    let Pair { cqa, cqb, qa, qb } = p;
    let ba = Buf::guarded(a, 4096);
    recv(&qa, 1, &[ba.sge(0, 4096)]);
    drop(qb);
    drop(cqb);
    expect_event(&a.dev, EventKind::QP_FATAL, qa.handle());
    wait_state(&qa, QpState::ERR);
    failed(&poll_one(&cqa), 1, WcStatus::WR_FLUSH_ERR);
    qa.post_send(&[wr(2, SendOp::Send, &[ba.sge(0, 8)])])
        .unwrap();
    failed(&poll_one(&cqa), 2, WcStatus::WR_FLUSH_ERR);
    assert_quiet(&cqa);
    assert_no_event(&a.dev, "after the peer's QP_FATAL");
    assert_no_event(&b.dev, "the destroying side");
    // The other connection between the two is untouched.
    assert_state(&other.qa, QpState::RTS);
    assert_state(&other.qb, QpState::RTS);
    let (sa, sb) = (Buf::new(a, 8192), Buf::new(b, 8192));
    write_and_send_back(other, &sa, &sb, b"still connected", 4096, 1);
}

/// Both QPs in one VM (a loopback connection): destroying one fails the
/// other.
#[test]
fn destroying_a_qp_fails_its_peer_in_the_same_vm() {
    let (_d, vm) = vms(1);
    let a = &vm[0];
    let other = rc_pair(a, a);
    destroying_fails_the_peer(a, a, rc_pair(a, a), &other);
}

/// The QPs in two VMs of one tenant: destroying the one on B fails the one
/// on A (and nothing on B).
#[test]
fn destroying_a_qp_fails_its_peer_in_another_vm() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other = rc_pair(a, b);
    destroying_fails_the_peer(a, b, rc_pair(a, b), &other);
}

/// The transport is told to fail the host half of exactly the peers, and
/// before `DESTROY_QP` returns (what the verbs transport needs so that no
/// host QP sends on to a QP number the host NIC may hand out again): a
/// peer in another VM, then one in the same VM; never a QP connected
/// elsewhere, nor the destroyed QP itself.
#[test]
fn the_host_half_of_each_peer_fails_before_the_destroy_returns() {
    let rnic = Arc::new(CountingRnic::default());
    let d = TestDaemon::with_transport(2, rnic.clone()).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let (p, other, looped) = (rc_pair(&a, &b), rc_pair(&a, &b), rc_pair(&a, &a));
    assert!(rnic.failed().is_empty());
    let (peer, gone) = (p.qa.qpn(), p.qb.qpn());
    p.qb.destroy().unwrap();
    assert_eq!(rnic.failed(), [peer], "destroyed {gone:#x}");
    let (peer, gone) = (looped.qb.qpn(), looped.qa.qpn());
    looped.qa.destroy().unwrap();
    assert_eq!(rnic.failed()[1..], [peer], "destroyed {gone:#x}");
    // A QP already in ERR is not failed again; the other pair is intact.
    drop(p.qa);
    assert_eq!(rnic.failed().len(), 2);
    assert_state(&other.qa, QpState::RTS);
    assert_state(&other.qb, QpState::RTS);
}
