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
//! lookup for every cached route of the namespace, once per change; NICs
//! that route in hardware do not need it and are not harmed by it.

use std::sync::atomic::{AtomicBool, Ordering};

use log::{debug, warn};

/// The files whose write flushes a family's route cache.
const FLUSH: [&str; 2] = [
    "/proc/sys/net/ipv4/route/flush",
    "/proc/sys/net/ipv6/route/flush",
];

/// Whether a failure was reported already (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Flushes the cached routes of the daemon's network namespace after host
/// QP `qpn` was pointed at another destination; a daemon without the
/// right to (`CAP_NET_ADMIN`) says so once.
pub(crate) fn forget_cached(qpn: u32) {
    let mut failed = None;
    for path in FLUSH {
        match std::fs::write(path, "1") {
            Ok(()) => {}
            // No IPv6 in this kernel: nothing of it is cached.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed = Some((path, e)),
        }
    }
    match failed {
        None => debug!("QPN {qpn:#x}: pointed elsewhere; the route cache was flushed"),
        Some((path, e)) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                warn!(
                    "QPN {qpn:#x}: pointed elsewhere, but the route cache cannot be flushed \
                     ({path}: {e}); on soft-RoCE its packets may follow the old route until \
                     the cache is flushed (`ip route flush cache`)"
                );
            }
        }
    }
}
