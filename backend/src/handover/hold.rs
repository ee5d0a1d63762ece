//! Holding a VM socket's accepting thread still during a hand-over: a VMM
//! that connects meanwhile waits in the socket's backlog for whichever
//! daemon serves afterwards, rather than being accepted by the one that is
//! going away.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::sync::lock;

/// What the accepting thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doing {
    /// Waiting for a connection.
    Accepting,
    /// Setting a connection up.
    Connecting,
    /// Serving a connection (its relay runs).
    Serving,
    /// Held: accepting nothing.
    Parked,
}

#[derive(Debug)]
struct State {
    held: bool,
    doing: Doing,
}

/// One VM socket's accepting thread and the hand-over's hold on it.
#[derive(Debug)]
pub struct AcceptHold {
    state: Mutex<State>,
    changed: Condvar,
    wake: EventFd,
}

impl AcceptHold {
    /// A thread about to accept.
    pub fn new() -> io::Result<AcceptHold> {
        Ok(AcceptHold {
            state: Mutex::new(State {
                held: false,
                doing: Doing::Accepting,
            }),
            changed: Condvar::new(),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// What wakes the accepting thread's poll (a hold, or the daemon's
    /// stop).
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Wakes the accepting thread.
    pub fn wake(&self) {
        let _ = self.wake.write(1);
    }

    /// Accepting thread: consumes a wake-up.
    pub fn woken(&self) {
        let _ = self.wake.read();
    }

    /// Accepting thread: waits while held (or until `stop`); true if it
    /// may accept now, and then counts as setting a connection up until
    /// [`AcceptHold::serving`] or [`AcceptHold::idle`].
    pub fn may_accept(&self, stop: &AtomicBool) -> bool {
        let mut st = lock(&self.state);
        while st.held && !stop.load(Ordering::Acquire) {
            st.doing = Doing::Parked;
            self.changed.notify_all();
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.doing = Doing::Connecting;
        !stop.load(Ordering::Acquire)
    }

    /// Accepting thread: serving a connection whose relay runs.
    pub fn serving(&self) {
        self.set(Doing::Serving);
    }

    /// Accepting thread: back to waiting for a connection.
    pub fn idle(&self) {
        self.set(Doing::Accepting);
    }

    fn set(&self, doing: Doing) {
        lock(&self.state).doing = doing;
        self.changed.notify_all();
    }

    /// Hand-over: holds the thread; true once it is parked or serving a
    /// connection (then its relay is there to pause), false if it did not
    /// get there within `wait` (the hold stays; release it).
    pub fn hold(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut st = lock(&self.state);
        st.held = true;
        self.wake();
        loop {
            if matches!(st.doing, Doing::Parked | Doing::Serving) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    }

    /// Hand-over: lets the thread accept again.
    pub fn release(&self) {
        lock(&self.state).held = false;
        self.changed.notify_all();
    }

    /// The daemon stops: a parked thread must see it.
    pub fn notify_stop(&self) {
        let _st = lock(&self.state);
        self.changed.notify_all();
        self.wake();
    }
}
