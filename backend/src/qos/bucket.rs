//! The token bucket of the rate limits.
//!
//! The token buckets are our own, not a crate's (`governor` 0.10.4, the
//! maintained one, read): its GCRA refuses a request larger than the
//! burst outright, where [`TokenBucket`] lets a work request run and then
//! owes what it moved (a 1 MiB message under a 5 ms burst must pass);
//! its `Quota` holds at most `u32::MAX` cells per second or one per
//! nanosecond, short of byte rates above 4 GB/s; a rate change means a new
//! limiter, losing the debt; and it reads its own clock, while the
//! engine passes one `now` to everything (and the tests inject it). It
//! would also bring a dozen crates (dashmap, quanta, futures-util...). The
//! control-command bucket (`ctrl/rate.rs`) is ours for the same reasons.

use std::time::{Duration, Instant};

use super::rate_limits::BURST_TIME;

/// A token bucket: it holds up to `rate × BURST_TIME` tokens (at least
/// one) and refills continuously. A work request may start while the
/// bucket is not empty (level above 0), and is charged after it ran, with
/// what it actually moved. The level may therefore go into debt by at most
/// one message: a 4 MiB WRITE under a 1 MiB/s limit runs, and the VM then
/// waits four seconds. This keeps the burst small and still lets messages
/// larger than the burst through, with no need to know a message's length
/// before it is parsed.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Tokens per second; 0: unlimited.
    rate: u64,
    /// Largest level.
    cap: f64,
    /// Current level; negative: in debt.
    level: f64,
    /// When `level` was last brought up to date (none yet: full).
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `rate` tokens per second (0: unlimited).
    pub fn new(rate: u64) -> Self {
        let cap = Self::cap_of(rate);
        TokenBucket {
            rate,
            cap,
            level: cap,
            last: None,
        }
    }

    fn cap_of(rate: u64) -> f64 {
        (rate as f64 * BURST_TIME.as_secs_f64()).max(1.0)
    }

    /// Whether the bucket limits nothing.
    pub fn unlimited(&self) -> bool {
        self.rate == 0
    }

    /// Changes the rate. A newly limited bucket starts full; otherwise the
    /// level is kept (a debt is still owed, at the new rate) but never
    /// above the new burst.
    pub fn set_rate(&mut self, rate: u64) {
        if rate == self.rate {
            return;
        }
        let was_unlimited = self.unlimited();
        self.rate = rate;
        self.cap = Self::cap_of(rate);
        if was_unlimited {
            self.level = self.cap;
            self.last = None;
        } else {
            self.level = self.level.min(self.cap);
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.level = (self.level + dt * self.rate as f64).min(self.cap);
        }
        self.last = Some(now);
    }

    /// `None` if work may start at `now`, else the earliest time it may.
    pub fn check(&mut self, now: Instant) -> Option<Instant> {
        if self.unlimited() {
            return None;
        }
        self.refill(now);
        if self.level > 0.0 {
            return None;
        }
        // One nanosecond past the moment the level is back at zero, so the
        // level is above zero when the engine looks again.
        let wait = -self.level / self.rate as f64;
        let wait = Duration::from_secs_f64(wait.min(1e6)).saturating_add(Duration::from_nanos(1));
        // At most about 11 days: an `Instant` does not overflow there.
        Some(now.checked_add(wait).unwrap_or(now))
    }

    /// Takes `n` tokens (may go into debt).
    pub fn charge(&mut self, n: u64) {
        if !self.unlimited() {
            self.level -= n as f64;
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn bucket_enforces_rate_with_small_burst() {
        let t0 = Instant::now();
        // 1000 ops/s: burst 5 ops.
        let mut b = TokenBucket::new(1000);
        let mut n = 0u64;
        while b.check(t0).is_none() {
            b.charge(1);
            n += 1;
            assert!(n < 100, "bucket never runs dry");
        }
        assert_eq!(n, 5, "burst is 5 ms of the rate");
        // Simulate a greedy client for one second with a 1 µs step clock:
        // it gets the rate, plus at most the burst.
        let mut now = t0;
        let end = at(t0, 1000);
        let mut ops = 0u64;
        while now < end {
            match b.check(now) {
                None => {
                    b.charge(1);
                    ops += 1;
                }
                Some(next) => {
                    assert!(next > now, "a refusal names a later time");
                    now = next;
                }
            }
        }
        assert!((999..=1001).contains(&ops), "{ops} ops in 1 s at 1000/s");
    }

    #[test]
    fn bucket_lets_large_messages_through_in_debt() {
        let t0 = Instant::now();
        // 1 MiB/s; a 4 MiB message runs, then the next waits 4 s.
        let mut b = TokenBucket::new(1 << 20);
        assert_eq!(b.check(t0), None);
        b.charge(4 << 20);
        let next = b.check(t0).map(|t| t.duration_since(t0));
        let Some(wait) = next else {
            panic!("bucket in debt must refuse");
        };
        let want = 4.0 - BURST_TIME.as_secs_f64();
        assert!((wait.as_secs_f64() - want).abs() < 1e-3, "waits {wait:?}");
        assert_eq!(b.check(t0 + wait), None, "free again at the time it named");
    }

    #[test]
    fn bucket_rate_change_applies_at_once() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10);
        b.charge(1);
        assert!(b.check(t0).is_some());
        // Unlimited: free at once.
        b.set_rate(0);
        assert_eq!(b.check(t0), None);
        // Limited again: starts full (1 token at 10/s), then refuses.
        b.set_rate(10);
        assert_eq!(b.check(t0), None);
        b.charge(2);
        let wait = b.check(t0).map(|t| t.duration_since(t0));
        assert!(wait.is_some_and(|w| w > Duration::from_millis(99)));
        // Raised: the debt is owed at the new rate (much sooner).
        b.set_rate(10_000);
        let wait = b.check(t0).map(|t| t.duration_since(t0));
        assert!(
            wait.is_some_and(|w| w < Duration::from_micros(200)),
            "{wait:?}"
        );
    }
}
