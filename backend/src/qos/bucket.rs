//! The token bucket of every rate limit: work requests and bytes on the
//! data path ([`TokenBucket::data`]) and control commands
//! ([`TokenBucket::ctrl`]).
//!
//! The arithmetic is exact: credit is counted in units of one nanosecond ×
//! the rate, so a token is [`TOKEN`] units and every nanosecond adds `rate`
//! units, with no rounding. A signed 128-bit count holds the burst and a
//! debt of any `u64` rate and message size (it saturates only past
//! centuries of refill), so tiny and huge rates alike neither drift nor
//! overflow, and a data-path bucket can owe what a message moved.
//!
//! The two kinds differ in their burst and in how a rate change treats
//! what they saved up (see [`TokenBucket::data`] and
//! [`TokenBucket::ctrl`]); refill and the arithmetic are the same.
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
//! control commands use the same bucket for the same reasons.

use std::time::{Duration, Instant};

/// How much of its rate a data-path token bucket may save up: 5 ms (so a 1-second
/// measurement sees at most 0.5 % more than the rate from the burst).
pub const BURST_TIME: Duration = Duration::from_millis(5);

/// Tokens a control-command bucket holds at most for `rate` commands per
/// second: 10 ms worth, at least 1. Small, so that a limited VM's rate
/// holds over short intervals too (a burst of `rate / 10` would let a
/// 1000/s VM issue 100 commands at once), and at least one command always
/// passes.
pub fn ctrl_burst(rate: u64) -> u64 {
    (rate / 100).max(1)
}

/// Units of credit in one token: nanoseconds per second, so that a
/// nanosecond at `rate` tokens per second adds `rate` units.
pub const TOKEN: i128 = 1_000_000_000;

/// Longest wait [`TokenBucket::check`] names: 10⁶ s (about 11 days), far
/// inside what an `Instant` can add.
const MAX_WAIT_NS: i128 = 1_000_000 * TOKEN;

/// What a bucket limits, which sets its burst and how a rate change treats
/// the credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Work requests or bytes: charged after they ran, debt allowed.
    Data,
    /// Control commands: whole tokens taken before they run, no debt.
    Ctrl,
    /// Whole tokens like `Ctrl`, with a burst of its own (a VM's MADs).
    Counted(u64),
}

impl Kind {
    /// The largest credit at `rate` tokens per second.
    fn cap(self, rate: u64) -> i128 {
        match self {
            Kind::Data => {
                let burst_ns = i128::try_from(BURST_TIME.as_nanos()).unwrap_or(i128::MAX);
                i128::from(rate).saturating_mul(burst_ns).max(TOKEN)
            }
            Kind::Ctrl => i128::from(ctrl_burst(rate)).saturating_mul(TOKEN),
            Kind::Counted(burst) => i128::from(burst.max(1)).saturating_mul(TOKEN),
        }
    }
}

/// A token bucket that refills continuously at `rate` tokens per second (0:
/// unlimited) up to a burst. Every method takes the time as an argument.
///
/// A data-path bucket ([`TokenBucket::data`]) is looked at with
/// [`check`](TokenBucket::check) and [`charge`](TokenBucket::charge); a
/// control-command bucket ([`TokenBucket::ctrl`]) with
/// [`take`](TokenBucket::take), [`give_back`](TokenBucket::give_back) and
/// [`wait_batch`](TokenBucket::wait_batch).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    kind: Kind,
    /// Tokens per second; 0: unlimited.
    rate: u64,
    /// Largest credit (the burst), in units of [`TOKEN`] per token.
    cap: i128,
    /// Current credit, in units of [`TOKEN`] per token; negative: in debt.
    credit: i128,
    /// When `credit` was last brought up to date (none yet: it is full).
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full data-path bucket of `rate` tokens (work requests or bytes)
    /// per second (0: unlimited).
    ///
    /// It holds up to `rate × BURST_TIME` tokens (at least one). A work
    /// request may start while the bucket is not empty (level above 0), and
    /// is charged after it ran, with what it actually moved. The level may
    /// therefore go into debt by at most one message: a 4 MiB WRITE under
    /// a 1 MiB/s limit runs, and the VM then waits four seconds. This keeps
    /// the burst small and still lets messages larger than the burst
    /// through, with no need to know a message's length before it is
    /// parsed. A rate change keeps the level (a debt is still owed, at the
    /// new rate), capped to the new burst; a newly limited bucket starts
    /// full.
    pub fn data(rate: u64) -> Self {
        let cap = Kind::Data.cap(rate);
        TokenBucket {
            kind: Kind::Data,
            rate,
            cap,
            credit: cap,
            last: None,
        }
    }

    /// A full control-command bucket of `rate` commands per second (0:
    /// unlimited), at `now`.
    ///
    /// It holds up to [`ctrl_burst`]`(rate)` whole tokens, one per command,
    /// taken before the commands run; it never goes into debt. A rate
    /// change keeps the whole tokens saved up, capped to the new burst: it
    /// neither grants nor takes away a burst.
    pub fn ctrl(rate: u64, now: Instant) -> Self {
        let cap = Kind::Ctrl.cap(rate);
        TokenBucket {
            kind: Kind::Ctrl,
            rate,
            cap,
            credit: cap,
            last: Some(now),
        }
    }

    /// A full bucket of `rate` whole tokens per second (0: unlimited)
    /// that holds at most `burst` of them (at least one), at `now`; used
    /// like a control-command bucket ([`take`](TokenBucket::take),
    /// [`give_back`](TokenBucket::give_back)). A VM's MAD rate (spec
    /// 18.26).
    pub fn counted(rate: u64, burst: u64, now: Instant) -> Self {
        let kind = Kind::Counted(burst);
        let cap = kind.cap(rate);
        TokenBucket {
            kind,
            rate,
            cap,
            credit: cap,
            last: Some(now),
        }
    }

    /// The configured rate (0: unlimited).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Whether the bucket limits nothing.
    pub fn unlimited(&self) -> bool {
        self.rate == 0
    }

    /// Changes the rate. The time since the bucket was last looked at is
    /// credited at the new rate (the engine changes rates just before it
    /// looks). See the constructors for what happens to the credit.
    pub fn set_rate(&mut self, rate: u64) {
        if rate == self.rate {
            return;
        }
        let was_unlimited = self.unlimited();
        self.rate = rate;
        self.cap = self.kind.cap(rate);
        match self.kind {
            Kind::Data if was_unlimited => {
                self.credit = self.cap;
                self.last = None;
            }
            Kind::Data => self.credit = self.credit.min(self.cap),
            Kind::Ctrl | Kind::Counted(_) => {
                let whole = self
                    .credit
                    .checked_div_euclid(TOKEN)
                    .map_or(0, |t| t.saturating_mul(TOKEN));
                self.credit = whole.min(self.cap);
            }
        }
    }

    /// Changes the rate at `now`: the time up to `now` is credited at the
    /// old rate, then as [`TokenBucket::set_rate`].
    pub fn set_rate_at(&mut self, rate: u64, now: Instant) {
        if rate == self.rate {
            return;
        }
        self.refill(now);
        self.set_rate(rate);
    }

    /// Brings the credit up to `now`.
    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let ns = now.saturating_duration_since(last).as_nanos();
            let ns = i128::try_from(ns).unwrap_or(i128::MAX);
            self.credit = self
                .credit
                .saturating_add(ns.saturating_mul(i128::from(self.rate)))
                .min(self.cap);
        }
        self.last = Some(now);
    }

    /// `None` if work may start at `now` (the level is above 0), else the
    /// earliest time it may.
    pub fn check(&mut self, now: Instant) -> Option<Instant> {
        if self.unlimited() {
            return None;
        }
        self.refill(now);
        if self.credit > 0 {
            return None;
        }
        // One nanosecond past the moment the level is back at zero, so the
        // level is above zero when the engine looks again.
        let ns = self
            .credit
            .saturating_neg()
            .checked_div(i128::from(self.rate))
            .unwrap_or(0)
            .min(MAX_WAIT_NS)
            .saturating_add(1);
        let wait = Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
        Some(now.checked_add(wait).unwrap_or(now))
    }

    /// Takes `n` tokens after the fact (may go into debt).
    pub fn charge(&mut self, n: u64) {
        if !self.unlimited() {
            self.credit = self.credit.saturating_sub(tokens(n));
        }
    }

    /// Takes up to `want` whole tokens at `now`; returns how many it took
    /// (0 when the bucket holds less than one). Unlimited: all of them.
    pub fn take(&mut self, want: u64, now: Instant) -> u64 {
        if self.unlimited() {
            return want;
        }
        self.refill(now);
        let have = self.credit.checked_div(TOKEN).unwrap_or(0).max(0);
        let n = u64::try_from(have).unwrap_or(u64::MAX).min(want);
        // `n` tokens are in the credit: no saturation.
        self.credit = self.credit.saturating_sub(tokens(n));
        n
    }

    /// Returns `n` tokens taken but not used (capped to the burst).
    pub fn give_back(&mut self, n: u64) {
        if !self.unlimited() {
            self.credit = self.credit.saturating_add(tokens(n)).min(self.cap);
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
        let burst = self.cap.checked_div(TOKEN).unwrap_or(0);
        let burst = u64::try_from(burst).unwrap_or(u64::MAX);
        let batch = want.min(self.rate / 1000).min(burst).max(1);
        self.wait_for(batch, now)
    }

    /// How long until `n` whole tokens are available (at most the burst).
    fn wait_for(&mut self, n: u64, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        let need = tokens(n).min(self.cap.max(TOKEN));
        let missing = need.saturating_sub(self.credit).max(0);
        // Round up: waking early finds the bucket still empty.
        let rate = i128::from(self.rate);
        let ns = missing
            .saturating_add(rate.saturating_sub(1))
            .checked_div(rate)
            .unwrap_or(0);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// The credit of `n` tokens.
fn tokens(n: u64) -> i128 {
    i128::from(n).saturating_mul(TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn bucket_enforces_rate_with_small_burst() {
        let t0 = Instant::now();
        // 1000 ops/s: burst 5 ops.
        let mut b = TokenBucket::data(1000);
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
        let mut b = TokenBucket::data(1 << 20);
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
        let mut b = TokenBucket::data(10);
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

    #[test]
    fn unlimited_takes_everything() {
        let now = Instant::now();
        let mut l = TokenBucket::ctrl(0, now);
        assert_eq!(l.take(1000, now), 1000);
        assert_eq!(l.wait(now), Duration::ZERO);
    }

    #[test]
    fn a_flood_waits_for_a_batch_a_single_command_for_one_token() {
        let t0 = Instant::now();
        let mut l = TokenBucket::ctrl(20_000, t0);
        assert_eq!(l.take(1000, t0), 200, "the burst: 10 ms");
        // 64 wanted: wait for 1 ms of tokens (20), not one (50 µs).
        assert_eq!(l.wait_batch(64, t0), Duration::from_millis(1));
        assert_eq!(l.wait_batch(5, t0), Duration::from_micros(250));
        assert_eq!(l.wait_batch(1, t0), Duration::from_micros(50));
        assert_eq!(l.take(64, t0 + Duration::from_millis(1)), 20);
        // A slow rate: one token at a time, never more than the burst.
        let mut slow = TokenBucket::ctrl(100, t0);
        assert_eq!(slow.take(5, t0), 1);
        assert_eq!(slow.wait_batch(64, t0), Duration::from_millis(10));
    }

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut l = TokenBucket::ctrl(1000, t0);
        assert_eq!(ctrl_burst(1000), 10);
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
        let mut l = TokenBucket::ctrl(3, t0);
        assert_eq!(l.take(5, t0), 1);
        assert_eq!(l.wait(t0), Duration::from_nanos(333_333_334));
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 1);
        l.set_rate_at(0, t0 + Duration::from_secs(1));
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 5);
        l.set_rate_at(100, t0 + Duration::from_secs(1));
        assert_eq!(l.rate(), 100);
        assert_eq!(l.take(5, t0 + Duration::from_secs(1)), 0);
        assert_eq!(l.take(5, t0 + Duration::from_millis(1010)), 1);
    }

    /// Both kinds at a rate of one token a second: waits to the nanosecond.
    #[test]
    fn tiny_rates_are_exact() {
        let t0 = Instant::now();
        let ns = Duration::from_nanos;
        let mut d = TokenBucket::data(1);
        assert_eq!(d.check(t0), None, "burst: one token");
        d.charge(3);
        // Two tokens owed: back above zero one nanosecond after 2 s.
        assert_eq!(d.check(t0), Some(t0 + ns(2_000_000_001)));
        assert_eq!(
            d.check(t0 + ns(2_000_000_000)),
            Some(t0 + ns(2_000_000_001))
        );
        assert_eq!(d.check(t0 + ns(2_000_000_001)), None);

        let mut c = TokenBucket::ctrl(1, t0);
        assert_eq!(ctrl_burst(1), 1);
        assert_eq!(c.take(5, t0), 1);
        assert_eq!(c.wait(t0), Duration::from_secs(1));
        assert_eq!(c.take(5, t0 + ns(999_999_999)), 0);
        assert_eq!(c.wait(t0 + ns(999_999_999)), ns(1));
        assert_eq!(c.take(5, t0 + ns(1_000_000_000)), 1);
    }

    /// Rates and amounts up to `u64::MAX` neither overflow nor panic, and
    /// stay exact.
    #[test]
    fn huge_rates_and_debts_do_not_overflow() {
        let t0 = Instant::now();
        let max = u64::MAX;
        let mut d = TokenBucket::data(max);
        assert_eq!(d.check(t0), None);
        for _ in 0..10 {
            d.charge(max);
        }
        // Ten seconds of the rate owed, less the 5 ms burst.
        let wait = Duration::from_nanos(10_000_000_000 - 5_000_000 + 1);
        assert_eq!(d.check(t0), Some(t0 + wait));
        // A debt of ages is capped to a wait an `Instant` can hold.
        let mut slow = TokenBucket::data(1);
        for _ in 0..1000 {
            slow.charge(max);
        }
        let longest = Duration::from_secs(1_000_000) + Duration::from_nanos(1);
        assert_eq!(slow.check(t0), Some(t0 + longest));
        slow.give_back(max);
        slow.set_rate(max);
        assert!(slow.check(t0).is_some());

        let mut c = TokenBucket::ctrl(max, t0);
        assert_eq!(c.take(max, t0), max / 100, "the burst: 10 ms");
        // A batch is 1 ms of the rate.
        assert_eq!(c.wait_batch(max, t0), Duration::from_millis(1));
        assert_eq!(c.take(max, t0 + Duration::from_millis(1)), max / 1000);
        // Idle for a century: the burst, no more.
        let later = t0 + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(c.take(max, later), max / 100);
        c.give_back(max);
        assert_eq!(c.take(max, later), max / 100);
    }

    /// Refilled in many small steps, a bucket gets exactly the rate: no
    /// rounding accumulates.
    #[test]
    fn small_steps_do_not_drift() {
        let t0 = Instant::now();
        let step = Duration::from_nanos(7_001);
        let steps = 1_000_000u32;
        let mut c = TokenBucket::ctrl(3, t0);
        let mut d = TokenBucket::data(3);
        let (mut taken, mut started) = (0, 0);
        for k in 0..steps {
            let now = t0 + step * k;
            taken += c.take(u64::MAX, now);
            if d.check(now).is_none() {
                d.charge(1);
                started += 1;
            }
        }
        // The last step is at 7.000992999 s: the burst (one token) and
        // 21.002978997 tokens at 3/s, whole ones taken.
        assert_eq!(taken, 22);
        // The data bucket starts while above zero: at 0 (the burst), one
        // step later (in debt from then on), and 21 times at 3/s.
        assert_eq!(started, 23);
    }

    /// The kinds' bursts, and what a rate change does to their credit.
    #[test]
    fn kinds_differ_in_burst_and_rate_changes() {
        let t0 = Instant::now();
        // 1000/s: 5 ms of data, 10 ms of commands.
        assert_eq!(TokenBucket::data(1000).take(100, t0), 5);
        assert_eq!(TokenBucket::ctrl(1000, t0).take(100, t0), 10);
        // 150/s: at least one token, and whole commands only.
        assert_eq!(TokenBucket::data(150).take(100, t0), 1);
        assert_eq!(TokenBucket::ctrl(150, t0).take(100, t0), 1);
        // Newly limited: a data bucket starts full, a command bucket keeps
        // what it had (here: nothing).
        let mut d = TokenBucket::data(0);
        let mut c = TokenBucket::ctrl(1000, t0);
        assert_eq!(c.take(100, t0), 10);
        c.set_rate_at(0, t0);
        d.set_rate(1000);
        c.set_rate_at(1000, t0);
        assert_eq!(d.take(100, t0), 5);
        assert_eq!(c.take(100, t0), 0);
        // A command bucket credits the time before a change at the old
        // rate and keeps whole tokens: 2.5 tokens at 1000/s, then 2 at
        // 10/s (capped to that burst: 1).
        c.set_rate_at(10, t0 + Duration::from_micros(2500));
        assert_eq!(c.take(100, t0 + Duration::from_micros(2500)), 1);
        // A data bucket keeps its debt through a change.
        d.charge(1000);
        d.set_rate(2000);
        let wait = d.check(t0).map(|t| t.duration_since(t0));
        assert_eq!(wait, Some(Duration::from_nanos(500_000_001)));
    }

    #[test]
    fn a_counted_bucket_has_its_own_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::counted(10, 64, t0);
        assert_eq!(b.take(100, t0), 64, "the burst, not 10 ms of the rate");
        assert_eq!(b.take(1, t0), 0);
        b.give_back(1);
        assert_eq!(b.take(1, t0), 1);
        // 10 per second: one more after 100 ms, never more than the burst.
        assert_eq!(b.take(5, t0 + Duration::from_millis(100)), 1);
        assert_eq!(b.take(100, t0 + Duration::from_secs(3600)), 64);
    }
}
