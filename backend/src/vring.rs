//! The device's virtqueue type: `vhost_user_backend::VringRwLock` with a
//! kick read that survives a queue restart.
//!
//! The vring worker of `vhost-user-backend` (0.24) collects a batch of
//! ready file descriptors from epoll and then, for each queue event in the
//! batch, reads the queue's *current* kick eventfd before calling
//! `handle_event`. If the front-end stops and restarts the queue while the
//! worker is busy with an earlier event of the same batch (a device reset:
//! `GET_VRING_BASE`, then `SET_VRING_KICK` with a new eventfd), that read
//! hits an eventfd nobody has written yet and fails with `EAGAIN`
//! (the kick fds of QEMU and of the test VMM are non-blocking). The worker
//! treats any error of that read as fatal and ends, silently: from then on
//! no control request, event buffer or doorbell kick of the VM is ever
//! looked at again, although the vhost-user connection stays up.
//!
//! [`Vring`] reads the kick the same way but takes an empty eventfd for
//! what it is, a stale readiness report, and lets the event through as a
//! spurious wakeup (the device's handlers look at the rings and find
//! whatever there is, possibly nothing).
//!
//! It also reports each start and stop of the queue, with the avail index
//! it starts from or stopped at, and each new kick eventfd, to a
//! [`QueueObserver`] (the device): the
//! library tells a back-end about stops (`stop_vring`) but not about
//! starts, and a VMM that never sends `RESET_DEVICE` shows a reset only
//! as a restart from index 0 (spec 15.1). The library creates the queues
//! inside `VhostUserDaemon::new`; [`observe_new_vrings`] hands the
//! observer to the queues created by the closure it runs.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::sync::{Arc, Weak};

use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::GuestMemoryAtomic;

/// The guest memory type of the device's queues.
pub type Gm = GuestMemoryAtomic<crate::memory::GuestRam>;

/// Learns when the device's queues start and stop (see the module
/// documentation). Called on the vhost-user message thread.
pub trait QueueObserver: Send + Sync {
    /// Queue `index` started (its kick fd is set and it is ready) at avail
    /// index `base`.
    fn queue_started(&self, index: usize, base: u16);
    /// Queue `index` stopped (`GET_VRING_BASE`) at avail index `base`.
    fn queue_stopped(&self, index: usize, base: u16);
    /// The guest memory the device's queues use instead of the library's:
    /// the library installs a VMM's memory table before the device has
    /// checked it, and a queue must never touch a table the device refused
    /// (spec 19.6.1). `None`: the library's.
    fn queue_memory(&self) -> Option<Gm> {
        None
    }
    /// Queue `index` got a new kick eventfd (`SET_VRING_KICK`), or lost it
    /// (`None`: stopped). Called before the queue holds the new one.
    fn queue_kick(&self, _index: usize, _kick: Option<&File>) {}
}

thread_local! {
    /// The observer for queues created on this thread, and the index of
    /// the next one (see [`observe_new_vrings`]).
    static NEW_VRINGS: RefCell<Option<(Weak<dyn QueueObserver>, usize)>> =
        const { RefCell::new(None) };
}

/// Runs `f`, handing `observer` to the queues created meanwhile on this
/// thread, numbered from 0 in creation order (the library creates them in
/// queue order).
pub fn observe_new_vrings<R>(observer: Weak<dyn QueueObserver>, f: impl FnOnce() -> R) -> R {
    NEW_VRINGS.with(|n| *n.borrow_mut() = Some((observer, 0)));
    let r = f();
    NEW_VRINGS.with(|n| *n.borrow_mut() = None);
    r
}

/// Who to tell about this queue's starts and stops.
struct Watch {
    observer: Weak<dyn QueueObserver>,
    index: usize,
}

/// A virtqueue of the device (see the module documentation).
#[derive(Clone)]
pub struct Vring(VringRwLock<Gm>, Option<Arc<Watch>>);

impl<'a> VringStateGuard<'a, Gm> for Vring {
    type G = <VringRwLock<Gm> as VringStateGuard<'a, Gm>>::G;
}

impl<'a> VringStateMutGuard<'a, Gm> for Vring {
    type G = <VringRwLock<Gm> as VringStateMutGuard<'a, Gm>>::G;
}

impl VringT<Gm> for Vring {
    fn new(mem: Gm, max_queue_size: u16) -> Result<Self, VirtQueError> {
        let watch = NEW_VRINGS.with(|n| {
            let mut n = n.borrow_mut();
            let (observer, next) = n.as_mut()?;
            let index = *next;
            *next += 1;
            Some(Arc::new(Watch {
                observer: observer.clone(),
                index,
            }))
        });
        let mem = watch
            .as_ref()
            .and_then(|w| w.observer.upgrade())
            .and_then(|o| o.queue_memory())
            .unwrap_or(mem);
        VringRwLock::new(mem, max_queue_size).map(|v| Vring(v, watch))
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, Gm>>::G {
        self.0.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, Gm>>::G {
        self.0.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.0.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.0.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.0.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.0.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.0.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.0.set_enabled(enabled)
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.0.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.0.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.0.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.0.set_queue_next_used(idx)
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.0.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.0.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.0.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        let was = self.0.get_ref().get_queue().ready();
        self.0.set_queue_ready(ready);
        if was == ready {
            return;
        }
        let Some(w) = &self.1 else {
            return;
        };
        let Some(observer) = w.observer.upgrade() else {
            return;
        };
        let base = self.0.queue_next_avail();
        if ready {
            observer.queue_started(w.index, base);
        } else {
            observer.queue_stopped(w.index, base);
        }
    }

    fn set_kick(&self, file: Option<File>) {
        if let Some(w) = &self.1 {
            if let Some(observer) = w.observer.upgrade() {
                observer.queue_kick(w.index, file.as_ref());
            }
        }
        self.0.set_kick(file)
    }

    /// Consumes the kick and says whether the queue is enabled, like
    /// `VringRwLock::read_kick`, except that an empty kick eventfd is not
    /// an error (see the module documentation).
    fn read_kick(&self) -> io::Result<bool> {
        let st = self.0.get_ref();
        if let Some(kick) = st.get_kick() {
            match kick.consume() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    log::debug!("stale kick event (the queue was restarted meanwhile)");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(st.is_enabled())
    }

    fn set_call(&self, file: Option<File>) {
        self.0.set_call(file)
    }

    fn set_err(&self, file: Option<File>) {
        self.0.set_err(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, IntoRawFd};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    fn vring() -> Vring {
        let mem = GuestMemoryAtomic::new(crate::memory::GuestRam::new());
        Vring::new(mem, 256).unwrap_or_else(|e| panic!("{e}"))
    }

    fn kick_file(efd: &EventFd) -> File {
        let dup = efd.try_clone().unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: `into_raw_fd` hands over sole ownership of the duplicate.
        unsafe { File::from_raw_fd(dup.into_raw_fd()) }
    }

    /// A kick event whose eventfd was replaced by an empty one before it was
    /// handled reads as a spurious wakeup, not an error.
    #[test]
    fn empty_kick_fd_is_a_spurious_wakeup() {
        let v = vring();
        assert!(!v.read_kick().unwrap_or_else(|e| panic!("{e}")));
        let efd = EventFd::new(EFD_NONBLOCK).unwrap_or_else(|e| panic!("{e}"));
        v.set_kick(Some(kick_file(&efd)));
        v.set_enabled(true);
        // Nothing written: the stale case.
        assert!(v.read_kick().unwrap_or_else(|e| panic!("{e}")));
        // A real kick is consumed.
        efd.write(1).unwrap_or_else(|e| panic!("{e}"));
        assert!(v.read_kick().unwrap_or_else(|e| panic!("{e}")));
        assert!(efd.read().is_err(), "the kick was not consumed");
        v.set_enabled(false);
        assert!(!v.read_kick().unwrap_or_else(|e| panic!("{e}")));
    }
}
