//! Retry emulation (spec 18.20): with no wire, the software RNIC learns at
//! once that a responder had no receive WQE (RNR) or that a destination is
//! unreachable, and makes the requester wait as an InfiniBand requester
//! would — the responder's RNR timer, or the local ACK timeout — before it
//! tries again, until the QP's retry counts are used up.

use std::time::{Duration, Instant};

use log::debug;
use virtio_rdma_abi::datapath::WcOpcode;

use crate::resources::{Qp, SendWait};

/// Interval of the transport retries of an RC QP with `timeout` 0, which
/// retries without limit at an interval the device chooses (spec 18.20).
const ENDLESS_RETRY_INTERVAL: Duration = Duration::from_millis(10);

/// When the head WQE of `qp` waits for a retry that is not due yet: the end
/// of its wait.
pub(in crate::rnic) fn waiting(qp: &Qp) -> Option<Instant> {
    let w = qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci)?;
    (Instant::now() < w.at).then_some(w.at)
}

/// The head WQE of `qp` whose transport retries are used up, once its last
/// wait has ended: its `wr_id` and completion opcode.
pub(in crate::rnic) fn exhausted(qp: &Qp) -> Option<(u64, WcOpcode)> {
    qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci)?.exhausted
}

/// The retry state of send WQE `index` of `qp`: the current one if it is
/// the WQE that waited last, else full counters (spec 18.20: both counters
/// apply to each WQE afresh).
fn retry_state(qp: &Qp, index: u32) -> SendWait {
    match qp.rt.wait.filter(|w| w.index == index) {
        Some(w) => w,
        None => SendWait {
            index,
            at: Instant::now(),
            rnr_left: qp.attr.rnr_retry,
            retry_left: qp.attr.retry_cnt,
            held_since: None,
            exhausted: None,
        },
    }
}

/// The responder of send WQE `index` of `qp` had no receive WQE: the wait
/// before the next try, for the interval the responder's `min_rnr_timer`
/// (`code`) selects — or `None` when `rnr_retry` is used up (7: retry
/// without limit) (spec 18.20).
pub(in crate::rnic) fn rnr_retry(qp: &Qp, index: u32, code: u32) -> Option<SendWait> {
    let mut w = retry_state(qp, index);
    if w.rnr_left == 0 {
        return None;
    }
    if qp.attr.rnr_retry != 7 {
        w.rnr_left = w.rnr_left.saturating_sub(1);
    }
    debug!("QP {:#x}: RNR, {} retries left", qp.qpn, w.rnr_left);
    w.at = later(rnr_delay(code));
    Some(w)
}

/// The destination of send WQE `index` (`wr_id`, completion opcode `op`) of
/// RC QP `qp` is unreachable (spec 18.20): nothing was delivered, and the
/// requester learns it only when the local ACK timeout, `4.096 µs ×
/// 2^timeout`, expires — as an InfiniBand requester whose packet got no
/// answer. It then tries again, at most `retry_cnt` times; when the timeout
/// after the last retry expires, the WQE fails with `RETRY_EXC_ERR`
/// untried. `timeout` 0 retries without limit.
pub(in crate::rnic) fn transport_retry(qp: &Qp, index: u32, wr_id: u64, op: WcOpcode) -> SendWait {
    let mut w = retry_state(qp, index);
    let timeout = qp.attr.timeout;
    let interval = if timeout == 0 {
        ENDLESS_RETRY_INTERVAL
    } else {
        if w.retry_left == 0 {
            w.exhausted = Some((wr_id, op));
        } else {
            w.retry_left = w.retry_left.saturating_sub(1);
        }
        ack_timeout(timeout)
    };
    w.at = later(interval);
    w
}

/// How often a WQE held for a stopped destination tries again (spec 20.6):
/// often enough that the blackout a peer sees ends within a few
/// milliseconds of the destination's start, rarely enough that thousands
/// of held QPs cost little.
const HOLD_INTERVAL: Duration = Duration::from_millis(2);

/// The destination of send WQE `index` (`wr_id`, completion opcode `op`)
/// of RC QP `qp` is a stopped device instance (spec 20.6): the WQE waits
/// without spending its retries, for at most `hold` since it first found
/// the destination stopped; after that the destination counts as
/// unreachable ([`transport_retry`]).
pub(in crate::rnic) fn pause_hold(
    qp: &Qp,
    index: u32,
    wr_id: u64,
    op: WcOpcode,
    hold: Duration,
) -> SendWait {
    let mut w = retry_state(qp, index);
    let now = Instant::now();
    let since = *w.held_since.get_or_insert(now);
    if now.saturating_duration_since(since) >= hold {
        let mut w = transport_retry(qp, index, wr_id, op);
        w.held_since = Some(since);
        return w;
    }
    w.at = later(HOLD_INTERVAL);
    w
}

/// `d` from now. The delays here are at most hours (`ack_timeout`), far
/// from where an `Instant` overflows; if one did, the wait ends at once.
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or(now)
}

/// The local ACK timeout `4.096 µs × 2^timeout` (spec 18.20).
fn ack_timeout(timeout: u32) -> Duration {
    Duration::from_nanos(4096u64 << timeout.min(31))
}

/// RNR NAK timer codes (IB table) in microseconds, indexed by code 0..=31.
fn rnr_delay(code: u32) -> Duration {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    Duration::from_micros(US.get(code as usize).copied().unwrap_or(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing;
    use virtio_rdma_abi::qp::QpType;

    /// The IB RNR NAK timer encodings (spec 18.20): code 0 is the longest
    /// wait, codes 1 to 31 grow from 10 µs to 491.52 ms; codes past the
    /// 5-bit field wait the shortest interval.
    #[test]
    fn rnr_timer_codes_follow_the_ib_table() {
        let us = |c| rnr_delay(c).as_micros();
        assert_eq!(us(0), 655_360);
        assert_eq!((us(1), us(2), us(5), us(14)), (10, 20, 60, 1280));
        assert_eq!((us(20), us(31)), (10_240, 491_520));
        for c in 2..=31 {
            assert!(us(c) > us(c - 1), "code {c} waits less than code {}", c - 1);
        }
        assert!(us(0) > us(31));
        assert_eq!((us(32), us(u32::MAX)), (10, 10));
    }

    /// The local ACK timeout is 4.096 µs × 2^timeout; the 5-bit field caps
    /// the exponent at 31.
    #[test]
    fn ack_timeout_doubles_per_step() {
        assert_eq!(ack_timeout(0), Duration::from_nanos(4096));
        assert_eq!(ack_timeout(14), Duration::from_nanos(4096 << 14));
        assert_eq!(ack_timeout(31), Duration::from_nanos(4096 << 31));
        assert_eq!(ack_timeout(32), ack_timeout(31));
    }

    /// `rnr_retry` tries follow a first one, then the WQE fails; 7 retries
    /// without limit; a new WQE starts with full counters.
    #[test]
    fn rnr_retries_are_counted_per_wqe() {
        let mut qp = testing::qp(QpType::RC);
        qp.attr.rnr_retry = 2;
        let start = Instant::now();
        let w = rnr_retry(&qp, 0, 14).expect("first retry");
        assert_eq!((w.index, w.rnr_left), (0, 1));
        assert!(w.at >= start + Duration::from_micros(1280));
        qp.rt.wait = Some(w);
        let w = rnr_retry(&qp, 0, 14).expect("second retry");
        assert_eq!(w.rnr_left, 0);
        qp.rt.wait = Some(w);
        assert!(rnr_retry(&qp, 0, 14).is_none(), "rnr_retry used up");
        assert_eq!(rnr_retry(&qp, 1, 14).map(|w| w.rnr_left), Some(1));
        qp.attr.rnr_retry = 7;
        qp.rt.wait = None;
        for _ in 0..10 {
            let w = rnr_retry(&qp, 0, 1).expect("without limit");
            assert_eq!(w.rnr_left, 7);
            qp.rt.wait = Some(w);
        }
    }

    /// After `retry_cnt` retries the next wait ends in `RETRY_EXC_ERR`;
    /// `timeout` 0 retries without limit.
    #[test]
    fn transport_retries_run_out_unless_timeout_is_zero() {
        let mut qp = testing::qp(QpType::RC);
        qp.attr.retry_cnt = 1;
        qp.attr.timeout = 14;
        let wait = |qp: &Qp| transport_retry(qp, 0, 77, WcOpcode::RDMA_WRITE);
        let start = Instant::now();
        let w = wait(&qp);
        assert_eq!((w.retry_left, w.exhausted), (0, None));
        assert!(w.at >= start + ack_timeout(14));
        qp.rt.wait = Some(w);
        let w = wait(&qp);
        assert_eq!(w.exhausted, Some((77, WcOpcode::RDMA_WRITE)));
        qp.rt.wait = Some(w);
        assert_eq!(exhausted(&qp), Some((77, WcOpcode::RDMA_WRITE)));
        assert!(waiting(&qp).is_some(), "the last timeout has not passed");
        qp.rt.sq_ci = 1;
        assert_eq!((exhausted(&qp), waiting(&qp)), (None, None), "another WQE");
        qp.rt.sq_ci = 0;
        qp.attr.timeout = 0;
        qp.rt.wait = None;
        for _ in 0..10 {
            let w = wait(&qp);
            assert_eq!((w.retry_left, w.exhausted), (1, None));
            assert!(w.at >= start + ENDLESS_RETRY_INTERVAL);
            qp.rt.wait = Some(w);
        }
    }
}
