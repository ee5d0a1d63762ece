//! The wait of the host event threads (`events`, `cm_events`): bounded, so
//! that a thread notices when its RNIC is no longer in use.

use std::os::fd::RawFd;

/// How often an event thread looks whether its RNIC is still in use.
pub(super) const STOP_POLL_MS: libc::c_int = 100;

/// Whether `fd` becomes readable within [`STOP_POLL_MS`].
pub(super) fn readable(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the caller holds the RNIC that keeps `fd`
    // open while it waits.
    unsafe { libc::poll(&mut pfd, 1, STOP_POLL_MS) > 0 }
}
