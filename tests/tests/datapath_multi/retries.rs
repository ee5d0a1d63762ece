//! Transport and RNR retries (spec 18.20): an unreachable destination fails
//! after its retries, a destination that becomes reachable in time gets the
//! message once, and the RNR wait is the responder's.

use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, assert_state, cq_pair, failed, ok, pattern, poll_n, poll_one,
    rc_qp, recv, vms, wr, write_op, Buf, QP_ACCESS,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, SendOp};

use crate::fixtures::{conn, conn_qpn, rc_pair};

/// The local ACK timeout of `timeout` (spec 18.20): 4.096 µs × 2^timeout.
fn ack_timeout(timeout: u32) -> Duration {
    Duration::from_nanos(4096 << timeout)
}

/// An RC QP whose destination is unreachable (spec 18.20, 18.23) — its peer
/// QP was destroyed, or no QP has its `dest_qpn` — tries, waits the local
/// ACK timeout, retries `retry_cnt` times, and fails with `RETRY_EXC_ERR`
/// when the timeout after the last retry expires, as an InfiniBand
/// requester that gets no answer: (retry_cnt + 1) × 4.096 µs × 2^timeout
/// after posting. The QP goes to ERR and flushes the WQE behind; no event.
/// Short timeouts are not stretched by the engine parking between retries.
#[test]
fn rc_unreachable_destination_retries_then_fails() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::guarded(a, 4096);
    let sg = [ba.sge(0, 16)];
    let cases = [
        ("peer QP destroyed", 12, 3),
        ("no such QP number", 11, 2),
        ("short timeout, many retries", 8, 7),
    ];
    for (what, timeout, retry_cnt) in cases {
        let cqa = Cq::create(&a.dev, 16).unwrap();
        let qa = rc_qp(a, &cqa);
        let dest = if what == "no such QP number" {
            // QP numbers 0 and 1 are never assigned (spec 12.12).
            1
        } else {
            let cqb = Cq::create(&b.dev, 16).unwrap();
            let qb = rc_qp(b, &cqb);
            let n = qb.qpn();
            qb.destroy().unwrap();
            n
        };
        let mut c = conn_qpn(dest, b);
        c.timeout = timeout;
        c.retry_cnt = retry_cnt;
        qa.rc_connect(QP_ACCESS, &c).unwrap();
        let start = Instant::now();
        qa.post_send(&[wr(1, SendOp::Send, &sg), wr(2, SendOp::Send, &sg)])
            .unwrap();
        let wc = poll_one(&cqa);
        let took = start.elapsed();
        failed(&wc, 1, WcStatus::RETRY_EXC_ERR);
        let least = ack_timeout(timeout) * (retry_cnt + 1);
        assert!(
            took >= least,
            "{what}: failed after {took:?}, before {least:?}"
        );
        // Parking sleeps up to 50 ms at a time; the timers cut it short
        // (8 waits not cut short would take 400 ms more; the margin is for
        // a loaded machine).
        let most = least + Duration::from_millis(300);
        assert!(
            took < most,
            "{what}: failed after {took:?}, expected {least:?}"
        );
        failed(&poll_one(&cqa), 2, WcStatus::WR_FLUSH_ERR);
        assert_state(&qa, QpState::ERR);
        assert_no_event(&a.dev, what);
    }
}

/// A message retried because its destination was unreachable is delivered
/// — once, and before the WQE behind it — when the destination becomes
/// reachable before the retries run out (spec 18.20: here the peer QP
/// reaches RTR). Meanwhile the waiting QP holds up no other QP. `timeout` 0
/// retries without limit.
#[test]
fn rc_retry_delivers_once_the_peer_is_ready() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other = rc_pair(a, b);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    // (timeout, retry_cnt, how long the peer stays unreachable)
    for (timeout, retry_cnt, unready) in [(16, 7, 150), (0, 0, 400)] {
        let (cqa, cqb) = cq_pair(a, b);
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut c = conn(&qb, b);
        c.timeout = timeout;
        c.retry_cnt = retry_cnt;
        qa.rc_connect(QP_ACCESS, &c).unwrap();
        // In INIT the peer accepts nothing: unreachable.
        qb.rc_to_init(QP_ACCESS).unwrap();
        let data = pattern(32, 40 + u64::from(timeout));
        ba.write(0, &data);
        qa.post_send(&[
            wr(1, SendOp::Send, &[ba.sge(0, 16)]),
            wr(2, SendOp::Send, &[ba.sge(16, 16)]),
        ])
        .unwrap();
        // Another QP pair of the same VMs keeps going.
        let until = Instant::now() + Duration::from_millis(unready);
        let mut k = 0u64;
        while Instant::now() < until {
            k += 1;
            other
                .qa
                .post_send(&[wr(k, write_op(&bb, 3000), &[ba.sge(100, 8)])])
                .unwrap();
            ok(&poll_one(&other.cqa), k, WcOpcode::RDMA_WRITE);
        }
        assert!(k > 3, "timeout {timeout}: only {k} WRITEs on the other QP");
        assert_quiet(&cqa);
        recv(&qb, 11, &[bb.sge(0, 64)]);
        recv(&qb, 12, &[bb.sge(64, 64)]);
        qb.rc_to_rtr(&conn(&qa, a)).unwrap();
        let s = poll_n(&cqa, 2);
        ok(&s[0], 1, WcOpcode::SEND);
        ok(&s[1], 2, WcOpcode::SEND);
        let r = poll_n(&cqb, 2);
        ok(&r[0], 11, WcOpcode::RECV);
        ok(&r[1], 12, WcOpcode::RECV);
        assert_eq!(bb.read(0, 16), data[..16]);
        assert_eq!(bb.read(64, 16), data[16..]);
        assert_quiet(&cqb);
        assert_state(&qa, QpState::RTS);
    }
}

/// The RNR wait is the interval that the *responder* QP's `min_rnr_timer`
/// selects (spec 18.20), not the requester's own: a requester whose
/// `min_rnr_timer` is 0 (655.36 ms) gives up after three waits of the
/// responder's 0.01 ms; one whose value is 1 waits the responder's 5.12 ms
/// three times.
#[test]
fn rnr_wait_uses_the_responders_min_rnr_timer() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::guarded(a, 4096);
    // (requester's min_rnr_timer, responder's, least and most time in ms;
    // three of the requester's own waits would take 1966 ms and 0.03 ms)
    let cases = [(0, 1, 0, 1000), (1, 18, 15, 1000)];
    for (mine, theirs, least, most) in cases {
        let (cqa, cqb) = cq_pair(a, b);
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut ca = conn(&qb, b);
        ca.min_rnr_timer = mine;
        ca.rnr_retry = 3;
        qa.rc_connect(QP_ACCESS, &ca).unwrap();
        let mut cb = conn(&qa, a);
        cb.min_rnr_timer = theirs;
        qb.rc_connect(QP_ACCESS, &cb).unwrap();
        let start = Instant::now();
        qa.post_send(&[wr(1, SendOp::Send, &[ba.sge(0, 8)])])
            .unwrap();
        failed(&poll_one(&cqa), 1, WcStatus::RNR_RETRY_EXC_ERR);
        let took = start.elapsed();
        let what = format!("min_rnr_timer {mine} here, {theirs} at the responder");
        assert!(took >= Duration::from_millis(least), "{what}: {took:?}");
        assert!(took < Duration::from_millis(most), "{what}: {took:?}");
        assert_state(&qb, QpState::RTS);
    }
}
