//! The notification queue's kicks, watched by the engine thread itself.
//!
//! A driver kicks the notification queue when it rings a doorbell of a
//! parked VM (spec 18.6). Were the kick eventfd watched by the
//! connection's vring worker, as the other queues are, every such
//! doorbell would need two host threads woken in turn, the worker and then
//! the engine, each waiting for a CPU that the guests' vCPU threads may
//! hold: on a busy host that doubles the wait of every sporadic message.
//! So the engine thread waits on the kick eventfds of its VMs directly,
//! through one epoll instance per thread.
//!
//! The control side registers and removes the eventfds (on the vhost-user
//! message thread, as `SET_VRING_KICK` arrives and when the connection
//! ends) and owns them; the engine thread only waits and learns which VMs
//! were kicked. The registrations are edge-triggered and the engine never
//! reads the eventfds: a read could block (the VMM shares the file and may
//! clear `O_NONBLOCK` or take the count itself), and with one event per
//! write there is nothing to drain. The count an eventfd keeps is the
//! VMM's to read when it stops the device.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// How many kicked VMs one `epoll_wait` reports; more are read in turns.
const BATCH: usize = 64;

/// The kick eventfds of one engine thread's VMs.
pub struct KickWatch {
    epoll: Epoll,
}

impl KickWatch {
    /// An empty watch.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            epoll: Epoll::new()?,
        })
    }

    /// Watches `kick`, VM `vm`'s notification kick eventfd, until
    /// [`KickWatch::unwatch`]. The caller keeps `kick` open meanwhile: the
    /// registration follows the open file, which the VMM holds too, so
    /// closing our descriptor alone would not end it.
    pub fn watch(&self, vm: usize, kick: &File) -> io::Result<()> {
        let event = EpollEvent::new(
            EventSet::IN | EventSet::EDGE_TRIGGERED,
            u64::try_from(vm).unwrap_or(u64::MAX),
        );
        self.epoll
            .ctl(ControlOperation::Add, kick.as_raw_fd(), event)
    }

    /// Stops watching `kick` (registered by [`KickWatch::watch`]).
    pub fn unwatch(&self, kick: &File) -> io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Delete,
            kick.as_raw_fd(),
            EpollEvent::default(),
        )
    }

    /// The descriptor that is readable while a kick waits (for the engine
    /// thread's sleep).
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Calls `kicked` with each VM kicked since the last call (a VM may
    /// come twice), without waiting.
    pub fn take(&self, mut kicked: impl FnMut(usize)) {
        let mut events = [EpollEvent::default(); BATCH];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("cannot read the kicks: {e}");
                    return;
                }
            };
            for event in events.iter().take(n) {
                if let Ok(vm) = usize::try_from(event.data()) {
                    kicked(vm);
                }
            }
            if n < BATCH {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, IntoRawFd};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    fn pair() -> (EventFd, File) {
        let efd = EventFd::new(EFD_NONBLOCK).unwrap_or_else(|e| panic!("{e}"));
        let dup = efd.try_clone().unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: `dup` owns its descriptor, which goes to the File alone.
        let file = unsafe { File::from_raw_fd(dup.into_raw_fd()) };
        (efd, file)
    }

    fn taken(w: &KickWatch) -> Vec<usize> {
        let mut v = Vec::new();
        w.take(|vm| v.push(vm));
        v.sort_unstable();
        v
    }

    /// Each write is reported once, for its VM, although nobody reads the
    /// eventfd; a removed one is no longer reported.
    #[test]
    fn every_kick_is_reported_once_without_reading_the_eventfd() {
        let w = KickWatch::new().unwrap_or_else(|e| panic!("{e}"));
        let (a, fa) = pair();
        let (b, fb) = pair();
        w.watch(3, &fa).unwrap_or_else(|e| panic!("{e}"));
        w.watch(7, &fb).unwrap_or_else(|e| panic!("{e}"));
        assert!(taken(&w).is_empty());
        a.write(1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken(&w), vec![3]);
        assert!(taken(&w).is_empty(), "reported once");
        a.write(1).unwrap_or_else(|e| panic!("{e}"));
        b.write(1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken(&w), vec![3, 7]);
        w.unwatch(&fa).unwrap_or_else(|e| panic!("{e}"));
        a.write(1).unwrap_or_else(|e| panic!("{e}"));
        assert!(taken(&w).is_empty());
        // The count stays for the VMM.
        assert_eq!(a.read().unwrap_or_else(|e| panic!("{e}")), 3);
    }

    /// The watch's descriptor is readable exactly while a kick waits.
    #[test]
    fn the_descriptor_is_readable_while_a_kick_waits() {
        let w = KickWatch::new().unwrap_or_else(|e| panic!("{e}"));
        let (a, fa) = pair();
        w.watch(0, &fa).unwrap_or_else(|e| panic!("{e}"));
        let readable = || {
            let mut p = libc::pollfd {
                fd: w.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, no wait.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!readable());
        a.write(1).unwrap_or_else(|e| panic!("{e}"));
        assert!(readable());
        assert_eq!(taken(&w), vec![0]);
        assert!(!readable());
    }
}
