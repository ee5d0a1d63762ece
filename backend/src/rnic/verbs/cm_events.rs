//! The host CM's events, read by one thread per RNIC while its CM bridge
//! is open: it waits on the bridge's descriptor and hands each event to
//! the bridge, whose answers for guests go to their inboxes and wake their
//! engines ([`super::cm_hub`]). A wakeup handles a bounded number of
//! events, so the control path and the engines, which share the bridge's
//! lock, wait at most that long for it.

use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::warn;

use super::readable::{readable, STOP_POLL_MS};
use super::rnic::VerbsRnic;

/// Host CM events handled per hold of the bridge's lock.
const EVENTS_PER_WAKEUP: usize = 32;

/// Starts the thread for `rnic`'s CM bridge, if it has one; it runs for
/// as long as anything else holds the RNIC.
pub fn start(rnic: &Arc<VerbsRnic>) -> io::Result<Option<JoinHandle<()>>> {
    let Some(fd) = rnic.cm().map(|c| c.fd()) else {
        return Ok(None);
    };
    let weak = Arc::downgrade(rnic);
    thread::Builder::new()
        .name("verbs-cm".into())
        .spawn(move || {
            while let Some(rnic) = weak.upgrade() {
                wait_and_handle(&rnic, fd);
            }
        })
        .map(Some)
}

/// Waits up to [`STOP_POLL_MS`] for host CM events and handles those there
/// are, [`EVENTS_PER_WAKEUP`] at a time.
fn wait_and_handle(rnic: &VerbsRnic, fd: std::os::fd::RawFd) {
    // The descriptor is the bridge's channel's, open for as long as the
    // RNIC (which the caller holds).
    if !readable(fd) {
        return;
    }
    loop {
        match rnic.with_cm(|s| s.poll(EVENTS_PER_WAKEUP)) {
            Some(Ok(true)) => continue,
            Some(Ok(false)) | None => return,
            Some(Err(e)) => {
                warn!("host rdma_cm events: {e}");
                // Not a busy loop on a broken channel.
                std::thread::sleep(std::time::Duration::from_millis(STOP_POLL_MS as u64));
                return;
            }
        }
    }
}
