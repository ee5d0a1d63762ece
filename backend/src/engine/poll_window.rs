//! How long an engine thread polls after its last piece of work before it
//! parks: adapted to the traffic, in the way KVM adapts the time a vCPU
//! polls before it halts (`halt_poll_ns`).
//!
//! Polling pays when the next piece of work comes while the thread still
//! polls: it is then taken without a wake-up. It is wasted when the next
//! one comes later anyway; the thread then spent the whole window's CPU,
//! which on a host whose CPUs the guests' vCPUs keep busy is taken from
//! them (a guest that sends a message now and then, such as a ping-pong
//! over TCG, paid for it with its own latency). So each time a parked
//! thread wakes to work the window is judged by the gap since the last
//! work: a gap that a window up to [`POLL_MAX`] would have covered grows
//! it, a longer one shrinks it; work found while polling leaves it as it
//! is.
//!
//! Only a thread with a CPU of its own polls past [`POLL_MIN`]
//! ([`PollWindow::fixed`] for the others). On a CPU it shares with busy
//! vCPUs, polling on keeps the CPU from the very vCPU whose next request
//! it waits for, and giving the CPU up while polling (`sched_yield`) gets
//! it back only after the vCPU's time slice, milliseconds later, whatever
//! came meanwhile; a parked thread is woken by the kick at once.

use std::time::Duration;

/// The longest window, and the one a thread starts with.
pub const POLL_MAX: Duration = Duration::from_micros(200);

/// The shortest window: the thread always spins this long after work, for
/// the next work request of a driver that posts several one after another.
pub const POLL_MIN: Duration = Duration::from_micros(20);

/// The polling window of one engine thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollWindow {
    now: Duration,
    /// [`POLL_MIN`] whatever the traffic.
    fixed: bool,
}

impl Default for PollWindow {
    fn default() -> Self {
        PollWindow {
            now: POLL_MAX,
            fixed: false,
        }
    }
}

impl PollWindow {
    /// The window of a thread that shares its CPU: [`POLL_MIN`], never
    /// adapted.
    pub fn fixed() -> Self {
        PollWindow {
            now: POLL_MIN,
            fixed: true,
        }
    }

    /// How long the thread polls after work now.
    pub fn get(&self) -> Duration {
        self.now
    }

    /// The thread parked after polling for the window, and woke to work
    /// `gap` after its last work (the window it polled included). Returns
    /// whether the window changed.
    pub fn woke_to_work(&mut self, gap: Duration) -> bool {
        if self.fixed {
            return false;
        }
        let old = self.now;
        self.now = if gap <= POLL_MAX {
            // Polling a little longer would have caught it.
            self.now.saturating_mul(2).min(POLL_MAX)
        } else {
            // No window would have: spend less on the next gap.
            self.now.checked_div(2).unwrap_or(POLL_MIN).max(POLL_MIN)
        };
        self.now != old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn sporadic_work_shrinks_the_window_to_the_spin() {
        let mut w = PollWindow::default();
        assert_eq!(w.get(), POLL_MAX);
        let mut steps = 0;
        while w.woke_to_work(us(1_000)) {
            steps += 1;
            assert!(w.get() >= POLL_MIN);
        }
        assert_eq!(w.get(), POLL_MIN);
        assert!(steps <= 4, "{steps} wake-ups to shrink it");
    }

    #[test]
    fn work_a_longer_window_would_have_caught_grows_it_back() {
        let mut w = PollWindow {
            now: POLL_MIN,
            fixed: false,
        };
        assert!(w.woke_to_work(us(60)));
        assert_eq!(w.get(), us(40));
        while w.woke_to_work(us(150)) {}
        assert_eq!(w.get(), POLL_MAX, "never past the longest");
        // A gap just past the longest window shrinks it again.
        assert!(w.woke_to_work(POLL_MAX + us(1)));
        assert_eq!(w.get(), POLL_MAX / 2);
    }

    #[test]
    fn a_shared_cpus_window_is_the_spin_whatever_the_traffic() {
        let mut w = PollWindow::fixed();
        for gap in [us(30), us(60), us(150), us(1_000)] {
            assert!(!w.woke_to_work(gap));
            assert_eq!(w.get(), POLL_MIN);
        }
    }
}
