//! The kernel's cached routes, invalidated when a host RC or UC QP is
//! pointed at another destination.
//!
//! Linux soft-RoCE (`rdma_rxe`) looks up the route of an RC QP's first
//! packet and keeps it in the QP for its life, on the assumption that a
//! QP's destination never changes. Pointed at another host after a reset
//! (a guest that reconnects its QP elsewhere, or a peer moved to another
//! host, spec 20.8), such a QP would go on sending along the old route:
//! to itself when its old destination was on this host, where the packets
//! are dropped, and the connection times out. The cached route is checked
//! against the network namespace's route generation at each send, so
//! flushing the route cache (`/proc/sys/net/ipv4/route/flush`, and IPv6's)
//! makes the next packet look its route up again. The cost is one new
//! lookup for every cached route of the namespace per flush, and flushes
//! are at least [`MIN_GAP`] apart however many QPs change; NICs that route
//! in hardware do not need it and are not harmed by it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{debug, warn};

/// The files whose write flushes a family's route cache.
const FLUSH: [&str; 2] = [
    "/proc/sys/net/ipv4/route/flush",
    "/proc/sys/net/ipv6/route/flush",
];

/// The least time between two flushes. A flush is host-wide and a guest
/// may reconnect its QPs as often as its control-command rate allows: the
/// requests of every VM in between make one flush, so the host sees at
/// most 20 a second whatever the guests do. A QP that sends meanwhile
/// along its old route loses that packet and sends it again after its
/// ACK timeout, by then along the new one.
const MIN_GAP: Duration = Duration::from_millis(50);

/// A flush was asked for and not made yet.
static PENDING: AtomicBool = AtomicBool::new(false);
/// When the last flush was made.
static LAST: Mutex<Option<Instant>> = Mutex::new(None);
/// Whether a failure was reported already (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Asks for the cached routes of the daemon's network namespace to be
/// flushed, host QP `qpn` having been pointed at another destination:
/// now, or by [`flush_due`] within [`MIN_GAP`].
pub(crate) fn forget_cached(qpn: u32) {
    debug!("QPN {qpn:#x}: pointed elsewhere; the route cache is to be flushed");
    PENDING.store(true, Ordering::Release);
    flush_due(Instant::now());
}

/// Makes the flush asked for, if any, unless the last one was less than
/// [`MIN_GAP`] ago (the data path calls it at each poll: one load when
/// nothing is asked).
pub(crate) fn flush_due(now: Instant) {
    if !PENDING.load(Ordering::Acquire) {
        return;
    }
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_some_and(|at| now.saturating_duration_since(at) < MIN_GAP) {
        return;
    }
    if PENDING.swap(false, Ordering::AcqRel) {
        *last = Some(now);
        flush();
    }
}

/// Flushes both families' route caches; a daemon without the right to
/// (`CAP_NET_ADMIN`) says so once.
fn flush() {
    let mut failed = None;
    for path in FLUSH {
        match std::fs::write(path, "1") {
            Ok(()) => {}
            // No IPv6 in this kernel: nothing of it is cached.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed = Some((path, e)),
        }
    }
    if let Some((path, e)) = failed {
        if !WARNED.swap(true, Ordering::Relaxed) {
            warn!(
                "a QP was pointed elsewhere, but the route cache cannot be flushed ({path}: {e}); \
                 on soft-RoCE its packets may follow the old route until the cache is flushed \
                 (`ip route flush cache`)"
            );
        }
    }
}
