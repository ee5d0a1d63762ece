//! The vhost-user connection of a test VM, with a watchdog so that a
//! backend that stops answering fails the message instead of hanging the
//! test.
//!
//! vhost 0.18's endpoint retries `EAGAIN` in a loop, so socket timeouts
//! (`SO_RCVTIMEO`) would turn a hang into a busy spin. Instead, a watchdog
//! thread shuts the socket down when a message takes longer than the
//! timeout; the blocked receive then sees end-of-file and returns an error.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost::vhost_user::Frontend;

use crate::error::{Error, Result};

#[derive(Debug, Default)]
struct WdState {
    deadline: Option<Instant>,
    /// When the thread wakes up by itself next (None: only when notified).
    wake: Option<Instant>,
    fired: bool,
    quit: bool,
}

type WdShared = Arc<(Mutex<WdState>, Condvar)>;

fn lock(m: &Mutex<WdState>) -> MutexGuard<'_, WdState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shuts the socket down when an armed deadline passes.
#[derive(Debug)]
struct Watchdog {
    shared: WdShared,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn spawn(sock: OwnedFd) -> Result<Self> {
        let shared: WdShared = Arc::new((Mutex::new(WdState::default()), Condvar::new()));
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vmm-watchdog".into())
            .spawn(move || Self::run(&s2, &sock))
            .map_err(|e| Error::io("spawn watchdog", e))?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    fn run(shared: &WdShared, sock: &OwnedFd) {
        let (m, cv) = &**shared;
        let mut st = lock(m);
        loop {
            if st.quit {
                return;
            }
            st = match st.deadline {
                None => {
                    st.wake = None;
                    cv.wait(st).unwrap_or_else(|e| e.into_inner())
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        // SAFETY: `sock` is an fd we own (a dup of the
                        // vhost-user socket); shutdown has no memory effects.
                        unsafe {
                            libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR);
                        }
                        st.fired = true;
                        st.deadline = None;
                        continue;
                    }
                    st.wake = Some(d);
                    cv.wait_timeout(st, d - now)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            };
        }
    }

    fn arm(&self, timeout: Duration) {
        let (m, cv) = &*self.shared;
        let deadline = Instant::now() + timeout;
        let mut st = lock(m);
        st.deadline = Some(deadline);
        // Deadlines only move later (the same timeout from a later now): a
        // thread that wakes up by itself before this one looks again then.
        // Waking it for every message cost a thread switch per message.
        if st.wake.is_none_or(|w| w > deadline) {
            cv.notify_one();
        }
    }

    /// Disarms; returns whether the watchdog fired since it was armed.
    fn disarm(&self) -> bool {
        let (m, _) = &*self.shared;
        let mut st = lock(m);
        st.deadline = None;
        std::mem::take(&mut st.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (m, cv) = &*self.shared;
        lock(m).quit = true;
        cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A vhost-user frontend connection with per-message timeout.
pub struct Conn {
    fe: Frontend,
    timeout: Option<Duration>,
    watchdog: Option<Watchdog>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("fd", &self.fe.as_raw_fd())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Wraps `fe`; every message sent through [`Conn::call`] must complete
    /// within `timeout` (None: no limit).
    pub fn new(fe: Frontend, timeout: Option<Duration>) -> Result<Self> {
        let watchdog = match timeout {
            Some(_) => {
                // SAFETY: the fd is the frontend's open socket, alive while
                // borrowed here; it is immediately duplicated into an OwnedFd.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fe.as_raw_fd()) };
                let dup = fd
                    .try_clone_to_owned()
                    .map_err(|e| Error::io("dup vhost-user socket", e))?;
                Some(Watchdog::spawn(dup)?)
            }
            None => None,
        };
        Ok(Conn {
            fe,
            timeout,
            watchdog,
        })
    }

    /// Runs one vhost-user exchange under the watchdog.
    pub fn call<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T> {
        if let (Some(wd), Some(t)) = (&self.watchdog, self.timeout) {
            wd.arm(t);
        }
        let r = f(&mut self.fe);
        let fired = self.watchdog.as_ref().is_some_and(Watchdog::disarm);
        match r {
            Ok(v) => Ok(v),
            Err(_) if fired => Err(Error::MessageTimeout {
                what,
                timeout: self.timeout.unwrap_or_default(),
            }),
            Err(e) => Err(Error::vhost(what, e)),
        }
    }

    /// The frontend itself (messages sent directly are not timed).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    /// Shuts the socket down (both directions); the backend sees a hangup.
    pub fn shutdown(&self) {
        // SAFETY: the fd is the frontend's open socket, alive for the call;
        // shutdown does not close it and has no memory effects.
        unsafe {
            libc::shutdown(self.fe.as_raw_fd(), libc::SHUT_RDWR);
        }
    }
}
