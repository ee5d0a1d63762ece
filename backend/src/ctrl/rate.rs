//! The control-command rate limit of one VM (`QosSpec::ctrl_per_sec`).
//!
//! A token bucket: one token per command, refilled at `rate` tokens per
//! second, holding at most [`burst`]`(rate)` tokens — 10 ms worth of
//! commands, at least one. A short burst passes at once; a sustained
//! stream gets `rate` commands per second. The arithmetic is exact (credit
//! in "nanoseconds × rate", 128 bits), so small and large rates alike
//! neither drift nor overflow. (Why not a crate: `engine/sched.rs`.)

use std::time::{Duration, Instant};

const NS_PER_SEC: u128 = 1_000_000_000;

/// Tokens the bucket holds at most for `rate` commands per second: 10 ms
/// worth, at least 1. Small, so that a limited VM's rate holds over short
/// intervals too (a burst of `rate / 10` would let a 1000/s VM issue 100
/// commands at once), and at least one command always passes.
pub fn burst(rate: u64) -> u64 {
    (rate / 100).max(1)
}

/// A token bucket for control commands.
#[derive(Debug, Clone)]
pub struct CtrlLimiter {
    /// Commands per second; 0: unlimited.
    rate: u64,
    /// Credit in units of ns × rate; one token costs [`NS_PER_SEC`].
    credit: u128,
    /// Largest credit (`burst` tokens).
    cap: u128,
    /// When `credit` was last brought up to date.
    at: Instant,
}

impl CtrlLimiter {
    /// A bucket for `rate` commands per second (0: unlimited), full.
    pub fn new(rate: u64, now: Instant) -> Self {
        let cap = u128::from(burst(rate)) * NS_PER_SEC;
        CtrlLimiter {
            rate,
            credit: cap,
            cap,
            at: now,
        }
    }

    /// The configured rate (0: unlimited).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Changes the rate, keeping the credit (capped to the new burst) so a
    /// change neither grants nor takes away a burst.
    pub fn set_rate(&mut self, rate: u64, now: Instant) {
        if rate == self.rate {
            return;
        }
        self.refill(now);
        let tokens = self.credit / NS_PER_SEC;
        self.rate = rate;
        self.cap = u128::from(burst(rate)) * NS_PER_SEC;
        self.credit = tokens.saturating_mul(NS_PER_SEC).min(self.cap);
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        self.at = now;
        self.credit = self
            .credit
            .saturating_add(elapsed.saturating_mul(u128::from(self.rate)))
            .min(self.cap);
    }

    /// Takes up to `want` tokens; returns how many it took (0 when the
    /// bucket is empty). Unlimited: all of them.
    pub fn take(&mut self, want: u64, now: Instant) -> u64 {
        if self.rate == 0 {
            return want;
        }
        self.refill(now);
        let have = u64::try_from(self.credit / NS_PER_SEC).unwrap_or(u64::MAX);
        let n = have.min(want);
        // `n <= credit / NS_PER_SEC`: neither saturates.
        self.credit = self
            .credit
            .saturating_sub(u128::from(n).saturating_mul(NS_PER_SEC));
        n
    }

    /// Returns `n` tokens taken but not used (capped to the burst).
    pub fn give_back(&mut self, n: u64) {
        if self.rate != 0 {
            self.credit = self
                .credit
                .saturating_add(u128::from(n) * NS_PER_SEC)
                .min(self.cap);
        }
    }

    /// How long until one token is available (zero if one is now).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.wait_for(1, now)
    }

    /// How long a worker that wants `want` commands waits: until a batch
    /// of them is available — 1 ms of the rate, at most `want` and at
    /// least one. A flooding VM's worker then wakes about a thousand times
    /// a second instead of once per command (each wake-up costs whoever
    /// shares its CPU, the engine included); a VM that wants one command
    /// waits for one token, no longer.
    pub fn wait_batch(&mut self, want: u64, now: Instant) -> Duration {
        let batch = want.min(self.rate / 1000).min(burst(self.rate)).max(1);
        self.wait_for(batch, now)
    }

    /// How long until `n` tokens are available (at most the burst).
    fn wait_for(&mut self, n: u64, now: Instant) -> Duration {
        if self.rate == 0 {
            return Duration::ZERO;
        }
        self.refill(now);
        let need = (u128::from(n) * NS_PER_SEC).min(self.cap.max(NS_PER_SEC));
        let missing = need.saturating_sub(self.credit);
        // Round up: waking early finds the bucket still empty.
        let ns = missing.div_ceil(u128::from(self.rate));
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_takes_everything() {
        let now = Instant::now();
        let mut l = CtrlLimiter::new(0, now);
        assert_eq!(l.take(1000, now), 1000);
        assert_eq!(l.wait(now), Duration::ZERO);
    }

    #[test]
    fn a_flood_waits_for_a_batch_a_single_command_for_one_token() {
        let t0 = Instant::now();
        let mut l = CtrlLimiter::new(20_000, t0);
        assert_eq!(l.take(1000, t0), 200, "the burst: 10 ms");
        // 64 wanted: wait for 1 ms of tokens (20), not one (50 µs).
        assert_eq!(l.wait_batch(64, t0), Duration::from_millis(1));
        assert_eq!(l.wait_batch(5, t0), Duration::from_micros(250));
        assert_eq!(l.wait_batch(1, t0), Duration::from_micros(50));
        assert_eq!(l.take(64, t0 + Duration::from_millis(1)), 20);
        // A slow rate: one token at a time, never more than the burst.
        let mut slow = CtrlLimiter::new(100, t0);
        assert_eq!(slow.take(5, t0), 1);
        assert_eq!(slow.wait_batch(64, t0), Duration::from_millis(10));
    }

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut l = CtrlLimiter::new(1000, t0);
        assert_eq!(burst(1000), 10);
        assert_eq!(l.take(64, t0), 10);
        assert_eq!(l.take(1, t0), 0);
        assert_eq!(l.wait(t0), Duration::from_millis(1));
        // 1 ms later exactly one more; 5.5 ms later five.
        assert_eq!(l.take(64, t0 + Duration::from_millis(1)), 1);
        assert_eq!(l.take(64, t0 + Duration::from_micros(6500)), 5);
        // Half a token left: the wait is the other half.
        assert_eq!(
            l.wait(t0 + Duration::from_micros(6500)),
            Duration::from_micros(500)
        );
        // Never more than the burst, however long idle.
        assert_eq!(l.take(64, t0 + Duration::from_secs(60)), 10);
    }

    #[test]
    fn slow_rates_and_changes() {
        let t0 = Instant::now();
        let mut l = CtrlLimiter::new(3, t0);
        assert_eq!(l.take(5, t0), 1);
        assert_eq!(l.wait(t0), Duration::from_nanos(333_333_334));
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 1);
        l.set_rate(0, t0 + Duration::from_secs(1));
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 5);
        l.set_rate(100, t0 + Duration::from_secs(1));
        assert_eq!(l.rate(), 100);
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 0);
        assert_eq!(l.take(5, t0 + Duration::from_millis(1010)), 1);
    }
}
