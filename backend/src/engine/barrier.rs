//! A system-wide memory barrier, run off the engine threads, behind
//! `DB_FLAG_POLLING` (spec 18.6): before an engine thread stops polling it
//! clears the flag and waits for every CPU of the host to execute a full
//! barrier before it asks for kicks. The barrier takes a grace period, far
//! too long to block an engine thread serving other VMs, so one thread of
//! the process runs it on request and the engine keeps polling until it
//! has passed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread;

use crate::sync::{lock, wait};
use log::warn;

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;

/// Barrier requests and completions, as tickets.
///
/// `DB_FLAG_POLLING` lets a driver publish a producer index without a full
/// fence while the engine polls. Before the engine stops polling it must
/// make sure that every store a driver made before it could see the flag
/// cleared is visible: it clears the flag, then waits for every CPU of the
/// host to execute a full barrier — `membarrier(2)` with
/// `MEMBARRIER_CMD_GLOBAL`, which reaches the VMM's vCPU threads too — and
/// only then sets `DB_FLAG_KICK` and re-reads the producer indices. A
/// driver whose read of the flag came before the clear has its store
/// drained by that barrier; one whose read came after sees the flag
/// cleared and fences itself. This is the asymmetric-fence technique of
/// user-space RCU.
pub struct SystemBarrier {
    /// The last ticket handed out.
    requested: Mutex<u64>,
    cond: Condvar,
    /// Every ticket up to this one has had a whole barrier after it.
    passed: AtomicU64,
}

impl SystemBarrier {
    /// The process's barrier thread, started on first use; `None` if the
    /// host cannot run the barrier (no `membarrier`, `nohz_full`, a seccomp
    /// filter).
    pub fn get() -> Option<&'static SystemBarrier> {
        static BARRIER: OnceLock<Option<&'static SystemBarrier>> = OnceLock::new();
        *BARRIER.get_or_init(Self::start)
    }

    fn start() -> Option<&'static SystemBarrier> {
        // SAFETY: membarrier with CMD_QUERY takes no pointers; it returns
        // the supported commands as a bit mask or -1.
        let mask = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        if mask < 0 || mask & MEMBARRIER_CMD_GLOBAL == 0 {
            warn!(
                "membarrier(MEMBARRIER_CMD_GLOBAL) unavailable ({}): drivers fence every post",
                std::io::Error::last_os_error()
            );
            return None;
        }
        let barrier: &'static SystemBarrier = Box::leak(Box::new(SystemBarrier {
            requested: Mutex::new(0),
            cond: Condvar::new(),
            passed: AtomicU64::new(0),
        }));
        let spawned = thread::Builder::new()
            .name("rnic-barrier".into())
            .spawn(move || barrier.serve());
        match spawned {
            Ok(_) => Some(barrier),
            Err(e) => {
                warn!("cannot start the barrier thread ({e}): drivers fence every post");
                None
            }
        }
    }

    /// Asks for a barrier that starts after this call; returns its ticket
    /// for [`SystemBarrier::passed`].
    pub fn request(&self) -> u64 {
        let mut r = lock(&self.requested);
        *r = r.wrapping_add(1);
        self.cond.notify_one();
        *r
    }

    /// Whether a whole barrier has run since `ticket` was requested.
    pub fn passed(&self, ticket: u64) -> bool {
        self.passed.load(Ordering::Acquire) >= ticket
    }

    fn serve(&self) {
        let mut done = 0u64;
        let mut warned = false;
        loop {
            let target = {
                let mut r = lock(&self.requested);
                while *r == done {
                    r = wait(&self.cond, r);
                }
                *r
            };
            // Every ticket up to `target` was requested before this call
            // starts (the lock orders the request's stores before it).
            // SAFETY: membarrier with CMD_GLOBAL takes no pointers.
            let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
            if rc != 0 {
                // Worked at start-up, so this should not happen; never
                // report a barrier that did not run (the engine then polls
                // on instead of parking, which is safe).
                if !std::mem::replace(&mut warned, true) {
                    warn!(
                        "membarrier failed: {}; retrying",
                        std::io::Error::last_os_error()
                    );
                }
                thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            done = target;
            self.passed.store(done, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_ticket_passes_only_after_a_barrier_requested_later() {
        let Some(b) = SystemBarrier::get() else {
            eprintln!("membarrier unavailable here: nothing to test");
            return;
        };
        let t1 = b.request();
        let t2 = b.request();
        assert!(t2 > t1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !b.passed(t2) {
            assert!(Instant::now() < deadline, "barrier never passed");
            thread::sleep(Duration::from_millis(1));
        }
        assert!(b.passed(t1));
        assert!(!b.passed(b.request().saturating_add(1)));
    }
}
