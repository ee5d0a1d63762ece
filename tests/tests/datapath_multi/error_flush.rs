//! The flush of a responder QP that a remote access error moved to `ERR`
//! (spec 18.19 item 2): its posted receive completes with `WR_FLUSH_ERR`
//! whatever the engine was doing with the responder's VM when the error
//! happened — in particular when that VM was parked (no doorbell of it
//! polled, no kick to come), the window where the receive used to be
//! left posted for ever.

use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::{
    expect_event, failed, poll_one, rc_pair, recv, vms, wr, Buf, Pair, Vm, WAIT,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_driver::SendOp;

/// The engine thread's park count.
fn parks(d: &TestDaemon) -> u64 {
    d.daemon().engines().stats()[0].parks
}

/// Waits until the engine thread has parked after this call: every VM's
/// polling list is parked then, and only a kick wakes one.
fn wait_parked(d: &TestDaemon) {
    let before = parks(d);
    let deadline = Instant::now() + WAIT;
    while parks(d) <= before {
        assert!(Instant::now() < deadline, "the engine never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// B posts a receive; A writes to B with an rkey that names no MR of B.
/// A's WRITE fails with `REM_ACCESS_ERR`, B's QP goes to ERR with
/// `QP_ACCESS_ERROR`, and B's receive is flushed. `park`: the engine has
/// parked (every VM's list) before A posts, so only A's kick wakes it.
/// Otherwise A posts after `pause`, which the stress test varies so that
/// the engine is caught at every point between polling B and parking it.
/// `notify`: B's CQ is armed and the flush must raise `CQ_COMPLETION`.
fn bad_rkey_flushes_the_receive(d: &TestDaemon, a: &Vm, b: &Vm, run: Run, i: u64) {
    let Run {
        park,
        pause,
        notify,
    } = run;
    let p: Pair = rc_pair(a, b);
    let target = Buf::guarded(b, 4096);
    let (local, inbox) = (Buf::new(a, 4096), Buf::new(b, 4096));
    recv(&p.qb, 1, &[inbox.sge(0, 4096)]);
    if notify {
        p.cqb.req_notify(false);
    }
    if park {
        wait_parked(d);
    } else {
        std::thread::sleep(pause);
    }
    let bad = SendOp::RdmaWrite {
        remote_addr: target.addr(0),
        rkey: target.mr.rkey() ^ 0x00ff_ff00,
    };
    p.qa.post_send(&[wr(10, bad, &[local.sge(0, 64)])]).unwrap();
    failed(&poll_one(&p.cqa), 10, WcStatus::REM_ACCESS_ERR);
    expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, p.qb.handle());
    if notify {
        assert!(
            p.cqb.wait_event(Some(WAIT)).unwrap(),
            "iteration {i}: no CQ_COMPLETION for the flush"
        );
    }
    let r = poll_one(&p.cqb);
    failed(&r, 1, WcStatus::WR_FLUSH_ERR);
    target.assert_untouched(0, 4096, "bad rkey");
}

/// How one round of [`bad_rkey_flushes_the_receive`] is timed.
#[derive(Clone, Copy)]
struct Run {
    park: bool,
    pause: Duration,
    notify: bool,
}

/// The window taken every time: the responder's VM is parked when the
/// error moves its QP to ERR. Before the fix nothing ever woke that VM's
/// list, so its receive stayed posted (`rq_ci` 0).
#[test]
fn a_parked_responder_flushes_its_receive_after_an_access_error() {
    let (d, vm) = vms(2);
    for (i, notify) in [false, true].into_iter().enumerate() {
        let run = Run {
            park: true,
            pause: Duration::ZERO,
            notify,
        };
        bad_rkey_flushes_the_receive(&d, &vm[0], &vm[1], run, i as u64);
    }
}

/// 100 rounds of the same with timings from none to past the engine's
/// polling window (200 us), half of them with B's CQ armed: every receive
/// is flushed. Before the fix a round whose pause let the engine park B
/// lost its receive.
#[test]
fn every_receive_of_a_failed_responder_is_flushed() {
    let (d, vm) = vms(2);
    for i in 0..100u64 {
        let run = Run {
            park: false,
            pause: Duration::from_micros((i / 2 % 10) * 60),
            notify: i % 2 == 1,
        };
        bad_rkey_flushes_the_receive(&d, &vm[0], &vm[1], run, i);
    }
}
