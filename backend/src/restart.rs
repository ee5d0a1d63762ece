//! Telling a paused device from a reset one when the VMM does not say.
//!
//! A VMM stops the device's queues (`GET_VRING_BASE`) both to pause a VM
//! and to reset its device; only `RESET_DEVICE` says which, and some VMMs
//! never send it (QEMU's generic vhost-user device, for one). What they
//! always do: a resumed queue restarts at the avail index it stopped at,
//! and a reset one at 0 (virtio resets its indices). Spec 15.1 makes that
//! the rule: the device is reset when, since it was last stopped, its
//! control queue restarts elsewhere than where it stopped. Index 0 at both
//! is ambiguous (a driver that had issued exactly a multiple of 65,536
//! commands); the event queue then decides the same way, and if it stopped
//! at 0 as well the device counts as reset: an idle driver loses nothing
//! it cannot re-create, while a rebooted guest must never find the
//! previous boot's objects.

use virtio_rdma_abi::config::{CONTROLQ, EVENTQ};

/// What a start of the control queue means for the device's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first start since the connection or the last reset.
    Fresh,
    /// A pause ended: everything continues where it stopped.
    Resume,
    /// The device was reset without `RESET_DEVICE`.
    Reset,
}

/// Where each of the two deciding queues stopped and restarted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Queue {
    stopped: Option<u16>,
    started: Option<u16>,
}

/// The start/stop history of the device's queues since its last reset or
/// connection (see the module documentation).
#[derive(Debug, Default)]
pub struct RestartTracker {
    ctrl: Queue,
    event: Queue,
    /// The control queue is started and the verdict on it was given.
    running: bool,
}

impl RestartTracker {
    /// Forgets everything: a new connection (its queues start afresh).
    pub fn clear(&mut self) {
        *self = RestartTracker::default();
    }

    /// Forgets where the queues stopped (an explicit `RESET_DEVICE`: the
    /// next start is a fresh one), keeping whether the device runs: a VMM
    /// that resets without stopping the queues first keeps them started.
    pub fn forget_history(&mut self) {
        self.ctrl.stopped = None;
        self.event.stopped = None;
    }

    /// Whether the device is started and its verdict given: only then may
    /// the engine execute its work and peers reach it.
    pub fn running(&self) -> bool {
        self.running
    }

    /// Queue `index` stopped at avail index `base`. The first stop since
    /// the last start is what a restart is compared with.
    pub fn stopped(&mut self, index: usize, base: u16) {
        let Some(q) = self.queue(index) else {
            return;
        };
        if q.started.is_some() || q.stopped.is_none() {
            q.stopped = Some(base);
        }
        q.started = None;
        if index == usize::from(CONTROLQ) {
            self.running = false;
        }
    }

    /// Queue `index` started at avail index `base`. Returns the verdict
    /// once it can be given (the control queue started, and the event
    /// queue too if it has to decide); the device then runs.
    pub fn started(&mut self, index: usize, base: u16) -> Option<Verdict> {
        let q = self.queue(index)?;
        q.started = Some(base);
        if self.running {
            return None;
        }
        let verdict = self.verdict()?;
        self.running = true;
        // The verdict is given for this stop; the next stop starts anew.
        for q in [&mut self.ctrl, &mut self.event] {
            if q.started.is_some() {
                q.stopped = None;
            }
        }
        Some(verdict)
    }

    fn queue(&mut self, index: usize) -> Option<&mut Queue> {
        match u16::try_from(index).ok()? {
            CONTROLQ => Some(&mut self.ctrl),
            EVENTQ => Some(&mut self.event),
            _ => None,
        }
    }

    fn verdict(&self) -> Option<Verdict> {
        let started = self.ctrl.started?;
        let Some(stopped) = self.ctrl.stopped else {
            return Some(Verdict::Fresh);
        };
        if started != stopped {
            return Some(Verdict::Reset);
        }
        if stopped != 0 {
            return Some(Verdict::Resume);
        }
        // Both at 0: the event queue decides.
        match self.event.stopped {
            Some(ev) if ev != 0 => match self.event.started {
                None => None,
                Some(b) if b == ev => Some(Verdict::Resume),
                Some(_) => Some(Verdict::Reset),
            },
            _ => Some(Verdict::Reset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: usize = CONTROLQ as usize;
    const E: usize = EVENTQ as usize;
    const N: usize = 2;

    fn stop_all(t: &mut RestartTracker, c: u16, e: u16) {
        t.stopped(C, c);
        t.stopped(E, e);
        t.stopped(N, 0);
        assert!(!t.running());
    }

    #[test]
    fn first_start_is_fresh_and_runs() {
        let mut t = RestartTracker::default();
        assert!(!t.running());
        assert_eq!(t.started(C, 0), Some(Verdict::Fresh));
        assert!(t.running());
        assert_eq!(t.started(E, 0), None, "one verdict per start");
    }

    #[test]
    fn restart_where_it_stopped_is_a_pause() {
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 17, 3);
        assert_eq!(t.started(C, 17), Some(Verdict::Resume));
        // Paused again later, further on.
        stop_all(&mut t, 40, 5);
        assert_eq!(t.started(C, 40), Some(Verdict::Resume));
    }

    #[test]
    fn restart_at_zero_after_work_is_a_reset() {
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 17, 3);
        assert_eq!(t.started(C, 0), Some(Verdict::Reset));
        // The reset's start is the reference for the next stop.
        stop_all(&mut t, 2, 1);
        assert_eq!(t.started(C, 2), Some(Verdict::Resume));
    }

    #[test]
    fn zero_and_zero_lets_the_event_queue_decide() {
        // The control queue wrapped to 0 exactly; the event queue did not.
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 0, 9);
        assert_eq!(t.started(C, 0), None, "undecided until the event queue");
        assert!(!t.running());
        assert_eq!(t.started(E, 9), Some(Verdict::Resume));
        assert!(t.running());
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 0, 9);
        t.started(C, 0);
        assert_eq!(t.started(E, 0), Some(Verdict::Reset));
        // Event queue first (another VMM's order): decided at the control queue.
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 0, 9);
        assert_eq!(t.started(E, 9), None);
        assert_eq!(t.started(C, 0), Some(Verdict::Resume));
    }

    #[test]
    fn all_zero_counts_as_reset() {
        let mut t = RestartTracker::default();
        t.started(C, 0);
        stop_all(&mut t, 0, 0);
        assert_eq!(t.started(C, 0), Some(Verdict::Reset));
    }

    #[test]
    fn repeated_stops_keep_the_first_index_and_clear_forgets() {
        let mut t = RestartTracker::default();
        t.started(C, 0);
        t.stopped(C, 8);
        // A second GET_VRING_BASE of a stopped queue reports its (reset)
        // index; the first one is what a resume restarts from.
        t.stopped(C, 0);
        assert_eq!(t.started(C, 8), Some(Verdict::Resume));
        t.stopped(C, 8);
        t.forget_history();
        assert_eq!(t.started(C, 0), Some(Verdict::Fresh));
        t.stopped(C, 3);
        t.clear();
        assert!(!t.running());
        assert_eq!(t.started(C, 0), Some(Verdict::Fresh));
    }
}
