//! Anticipation: keeping the thread's time for a VM that is about to post.
//!
//! A VM with one request in flight at a time (a closed loop) posts its
//! next request a fraction of a microsecond after the completion of the
//! last. Work-conserving as it is, the engine would meanwhile start the
//! piece of another VM with work (a large message goes in pieces, ~0.4 µs
//! each at weight 1), and the closed loop's next request would wait for
//! that piece every time: next to a tenant of weight 1, a tenant of weight
//! 1000 lost up to 70 % of its rate (issue 26, N1; docs/isolation.md).
//!
//! So after a sweep that served a VM entitled to much more of the engine
//! than every VM now waiting ([`crate::qos::drr::Drr::entitled`]), if that
//! VM shows no new work yet, the thread watches its doorbells for a short
//! window before it serves the others. The window follows the waits that
//! found a post (twice their average, plus a margin) and never exceeds
//! [`MAX_WAIT`]; a VM that did not post within it is anticipated again
//! only after 2, 4, … 64 further chances ([`MAX_SKIP`]), so a VM that
//! posts rarely costs the others almost nothing. The wait is charged to
//! the anticipated VM's deficit like its work, so anticipating a VM gives
//! it no more of the engine than its weight does, and a hostile guest
//! cannot use it to idle the thread beyond its share: it must first be
//! the VM with by far the largest weight, and then pays for every wait.

use std::time::Duration;

/// Longest wait for an anticipated VM's post.
pub const MAX_WAIT: Duration = Duration::from_micros(2);

/// Shortest window, and the margin added to twice the average wait (the
/// waits are measured coarsely: the clock is read every few looks).
const MIN_WAIT_NS: u64 = 500;

/// The window of a VM with no wait measured yet.
const FIRST_WAIT_NS: u64 = 1_000;

/// Most chances skipped after misses in a row (`2^misses`, up to this).
pub const MAX_SKIP: u32 = 64;

/// What the thread knows of one VM's posting (indexed like its lists).
#[derive(Debug, Clone, Copy, Default)]
struct VmPosting {
    /// Running average of the waits that found a post (ns; 0: none yet).
    wait_ns: u64,
    /// Windows in a row in which the VM did not post.
    misses: u32,
    /// Chances still to pass over before the VM is anticipated again.
    skip: u32,
}

/// The anticipation state of an engine thread.
#[derive(Debug, Default)]
pub struct Anticipation {
    vms: Vec<VmPosting>,
    /// The VM served last that may be anticipated in the next sweep.
    candidate: Option<usize>,
    /// Windows that found a post.
    pub hits: u64,
    /// Windows that ended without a post.
    pub misses: u64,
}

impl Anticipation {
    /// Forgets everything and sizes the state for `n` VMs (the thread's
    /// lists were rebuilt).
    pub fn reset(&mut self, n: usize) {
        self.vms.clear();
        self.vms.resize(n, VmPosting::default());
        self.candidate = None;
    }

    /// VM `vm` (if any) was served in this sweep and may be anticipated in
    /// the next.
    pub fn served(&mut self, vm: Option<usize>) {
        self.candidate = vm;
    }

    /// The VM that may be anticipated now (once: the next call gives
    /// `None` until [`Anticipation::served`]).
    pub fn take_candidate(&mut self) -> Option<usize> {
        self.candidate.take()
    }

    /// How long to watch VM `vm`'s doorbells now, or `None` when it is to
    /// be passed over this time (after misses) or unknown.
    pub fn window(&mut self, vm: usize) -> Option<Duration> {
        let p = self.vms.get_mut(vm)?;
        if p.skip > 0 {
            p.skip = p.skip.saturating_sub(1);
            return None;
        }
        let max = u64::try_from(MAX_WAIT.as_nanos()).unwrap_or(u64::MAX);
        let ns = if p.wait_ns == 0 {
            FIRST_WAIT_NS
        } else {
            p.wait_ns.saturating_mul(2).saturating_add(MIN_WAIT_NS)
        };
        Some(Duration::from_nanos(ns.clamp(MIN_WAIT_NS, max)))
    }

    /// VM `vm` posted after `waited` of watching.
    pub fn hit(&mut self, vm: usize, waited: Duration) {
        self.hits = self.hits.saturating_add(1);
        if let Some(p) = self.vms.get_mut(vm) {
            let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX).max(1);
            p.wait_ns = if p.wait_ns == 0 {
                w
            } else {
                // 3/4 of the old average: a change of pace shows within a
                // few requests.
                (p.wait_ns.saturating_mul(3).saturating_add(w)) / 4
            };
            p.misses = 0;
            p.skip = 0;
        }
    }

    /// VM `vm` did not post within its window.
    pub fn miss(&mut self, vm: usize) {
        self.misses = self.misses.saturating_add(1);
        if let Some(p) = self.vms.get_mut(vm) {
            p.misses = p.misses.saturating_add(1);
            // 2, 4, … MAX_SKIP chances passed over.
            let shift = p.misses.min(MAX_SKIP.trailing_zeros());
            p.skip = (1u32 << shift).min(MAX_SKIP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(n: usize) -> Anticipation {
        let mut a = Anticipation::default();
        a.reset(n);
        a
    }

    /// Whatever the waits seen, a window is never longer than `MAX_WAIT`
    /// nor shorter than the margin, and follows the waits that found a
    /// post.
    #[test]
    fn the_window_is_bounded_and_follows_the_waits() {
        let mut a = sized(2);
        assert_eq!(a.window(0), Some(Duration::from_nanos(FIRST_WAIT_NS)));
        for w in [1u64, 100, 400, 5_000, 1_000_000, u64::MAX] {
            a.hit(0, Duration::from_nanos(w));
            let win = a.window(0).expect("no skip after a hit");
            assert!(win <= MAX_WAIT, "{w} ns: {win:?}");
            assert!(win >= Duration::from_nanos(MIN_WAIT_NS), "{w} ns: {win:?}");
        }
        // A steady 300 ns gap: about twice that, plus the margin.
        let mut b = sized(1);
        for _ in 0..32 {
            b.hit(0, Duration::from_nanos(300));
        }
        assert_eq!(b.window(0), Some(Duration::from_nanos(1_100)));
        // Unknown VMs are never anticipated.
        assert_eq!(a.window(7), None);
    }

    /// A VM that does not post within its window is passed over 2, 4, …
    /// up to `MAX_SKIP` chances before the next window, so a VM that
    /// posts rarely costs at most one window per `MAX_SKIP` chances; one
    /// post within a window ends the backoff.
    #[test]
    fn misses_back_off_and_a_hit_ends_the_backoff() {
        let mut a = sized(1);
        let mut windows = 0;
        let chances = 10_000;
        for _ in 0..chances {
            if a.window(0).is_some() {
                windows += 1;
                a.miss(0);
            }
        }
        // The first few windows, then one per MAX_SKIP + 1 chances.
        assert!(
            windows <= 8 + chances / (MAX_SKIP as usize + 1),
            "{windows}"
        );
        assert!(windows >= chances / (MAX_SKIP as usize + 1), "{windows}");
        assert_eq!(a.misses as usize, windows);
        // Passed over now; a post seen later (a window of another turn)
        // puts it back at once.
        while a.window(0).is_some() {
            a.miss(0);
        }
        a.hit(0, Duration::from_nanos(300));
        assert!(a.window(0).is_some());
        assert_eq!(a.hits, 1);
    }

    /// The candidate is taken once: a VM is anticipated at most once per
    /// sweep that served it.
    #[test]
    fn a_candidate_is_anticipated_once_per_service() {
        let mut a = sized(3);
        assert_eq!(a.take_candidate(), None);
        a.served(Some(2));
        assert_eq!(a.take_candidate(), Some(2));
        assert_eq!(a.take_candidate(), None);
        a.served(Some(1));
        a.reset(3);
        assert_eq!(a.take_candidate(), None);
    }
}
