//! One VM's state behind its lock, shared by the VM's vhost-user device
//! (control queue, events, memory updates) and the engine thread serving
//! it, with the hints the engine reads without the lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::warn;
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::eventfd::EventFd;

use super::VmState;
use crate::memory::HostMem;
use crate::sync::lock;

/// What the VM's lock guards.
pub struct Guarded {
    /// The VM's state.
    pub vm: VmState,
    /// Guest memory as the VMM mapped it (the control path's view); `None`
    /// while no VMM is connected.
    pub mem: Option<GuestMemoryAtomic<crate::memory::GuestRam>>,
    /// The data path's view of the same memory (built with every memory
    /// table update).
    pub host: Option<Arc<HostMem>>,
}

/// What [`VmCell::try_with_dataplane`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked<R> {
    /// It ran the closure, which returned this.
    Ran(R),
    /// The VM's lock is held elsewhere: try again later.
    Busy,
    /// No VMM is connected.
    Gone,
}

thread_local! {
    /// The VMs whose lock the current thread holds through
    /// [`VmCell::with_dataplane`] (at most a few: an engine thread holds
    /// the VM it serves and the peer of an RC QP's burst).
    static HELD_VMS: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a VM's lock as held by the current thread while it lives.
struct HeldLock(usize);

impl HeldLock {
    /// `None` if the current thread holds VM `vm`'s lock already: taking
    /// it again would block the thread on itself for good.
    fn enter(vm: usize) -> Option<HeldLock> {
        HELD_VMS.with(|h| {
            let mut h = h.borrow_mut();
            if h.contains(&vm) {
                return None;
            }
            h.push(vm);
            Some(HeldLock(vm))
        })
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        HELD_VMS.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&v| v == self.0) {
                h.swap_remove(i);
            }
        });
    }
}

/// The VMs of one engine thread kicked since the thread last looked
/// ([`VmCell::kick`]): the thread reads the kicked VMs' doorbells, not
/// those of every VM it parked, so a kick costs the same next to ten idle
/// VMs or a thousand.
#[derive(Debug, Default)]
pub struct KickedVms {
    /// Set after an id was pushed (the thread's one load per sweep).
    pending: AtomicBool,
    /// At most about two entries per VM: one is pushed only when a VM's
    /// `kicked` flag goes up, and the thread drains the list each time it
    /// takes `pending` (so a VM can be here twice, never more).
    ids: Mutex<Vec<usize>>,
}

impl KickedVms {
    fn push(&self, id: usize) {
        lock(&self.ids).push(id);
        self.pending.store(true, Ordering::SeqCst);
    }

    /// Whether a VM was kicked since the last [`KickedVms::drain_into`].
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Moves the ids of the VMs kicked since the last call into `out`;
    /// false (and nothing moved) if none was.
    pub fn drain_into(&self, out: &mut Vec<usize>) -> bool {
        // A load first: the swap's locked write only when there is news.
        if !self.pending() || !self.pending.swap(false, Ordering::SeqCst) {
            return false;
        }
        out.append(&mut lock(&self.ids));
        true
    }
}

/// One VM's state and lock.
pub struct VmCell {
    id: usize,
    /// The engine thread serving the VM.
    engine: usize,
    state: Mutex<Guarded>,
    /// Advances whenever the data path's view of the VM may have changed
    /// (a control command ran, memory was remapped, a reset or disconnect),
    /// so the engine rebuilds what it caches about the VM.
    dp_gen: AtomicU64,
    /// The device is started, for readers without the lock;
    /// [`VmState::running`] is the authoritative copy.
    running: AtomicBool,
    /// Wakes the VM's vhost-user worker to deliver queued events.
    event_wake: EventFd,
    /// The VM has work for its engine that the engine may not see by
    /// itself: a doorbell kick, or a control command that made posted
    /// work startable. A polling list the engine parked is looked at
    /// again only once this is set ([`VmCell::kick`]).
    kicked: AtomicBool,
    /// Its engine thread's list of kicked VMs.
    kicked_vms: Arc<KickedVms>,
}

impl VmCell {
    /// The cell of VM `vm.vm_index()`, served by engine thread `engine`
    /// (whose list of kicked VMs is `kicked_vms`), with no memory mapped.
    pub fn new(vm: VmState, engine: usize, kicked_vms: Arc<KickedVms>) -> std::io::Result<Self> {
        Ok(VmCell {
            id: vm.vm_index(),
            engine,
            state: Mutex::new(Guarded {
                vm,
                mem: None,
                host: None,
            }),
            dp_gen: AtomicU64::new(0),
            running: AtomicBool::new(false),
            event_wake: EventFd::new(libc::EFD_NONBLOCK)?,
            kicked: AtomicBool::new(false),
            kicked_vms,
        })
    }

    /// Notes that the VM has work its engine must look at (then wake the
    /// engine): a doorbell kick, or a control command that made posted
    /// work startable or in need of a flush.
    pub fn kick(&self) {
        // The flag first: the thread that finds the id takes the flag.
        if !self.kicked.swap(true, Ordering::SeqCst) {
            self.kicked_vms.push(self.id);
        }
    }

    /// Whether a kick waits for the engine (without taking it).
    pub(crate) fn kick_pending(&self) -> bool {
        self.kicked.load(Ordering::SeqCst)
    }

    /// Whether [`VmCell::kick`] was called since the last call.
    pub(crate) fn take_kick(&self) -> bool {
        self.kicked.swap(false, Ordering::SeqCst)
    }

    /// Index of the VM in the daemon.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The engine thread serving the VM.
    pub fn engine_index(&self) -> usize {
        self.engine
    }

    /// Takes the VM's lock (the control path's access).
    pub fn lock(&self) -> MutexGuard<'_, Guarded> {
        // A panic while holding the lock would be a daemon bug; the state
        // stays structurally valid, so keep serving rather than cascade.
        lock(&self.state)
    }

    /// The VM's lock if it is free; `None` while another thread holds it
    /// (the operator interfaces use this, so that one VM whose lock is
    /// stuck cannot hang every scrape).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Guarded>> {
        match self.state.try_lock() {
            Ok(st) => Some(st),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Runs `f` on the VM's state and mapped memory (the data-path
    /// engine's access); `None` while no VMM is connected, and — rather
    /// than deadlock — when the calling thread already holds this VM's
    /// lock (an engine thread nests a peer VM's lock inside its own; the
    /// held one must be passed down instead, see `rnic::soft::route`).
    pub fn with_dataplane<R>(&self, f: impl FnOnce(&mut VmState, &Arc<HostMem>) -> R) -> Option<R> {
        let Some(_held) = HeldLock::enter(self.id) else {
            log::error!(
                "VM {}: refusing to lock a VM this thread already holds (daemon bug)",
                self.id
            );
            return None;
        };
        let mut st = self.lock();
        let Guarded { vm, host, .. } = &mut *st;
        let host = host.as_ref()?;
        Some(f(vm, host))
    }

    /// [`VmCell::with_dataplane`] for the engine, which must never wait
    /// for a VM's lock: a control command holding it (a large registration,
    /// say) would stall every VM the engine serves. `Busy` if the lock is
    /// taken; the engine comes back at its next sweep.
    ///
    /// A try never waits, so it needs no guard against the thread holding
    /// the lock already: that, too, reads as `Busy`.
    pub fn try_with_dataplane<R>(
        &self,
        f: impl FnOnce(&mut VmState, &Arc<HostMem>) -> R,
    ) -> Locked<R> {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::WouldBlock) => return Locked::Busy,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Guarded { vm, host, .. } = &mut *st;
        match host.as_ref() {
            Some(host) => Locked::Ran(f(vm, host)),
            None => Locked::Gone,
        }
    }

    /// Whether the device is started: stopped (a paused VM, or one being
    /// reset), the engine executes none of its work and peers' messages
    /// find no QP (spec 15.1). Read without the VM's lock, so only a hint:
    /// under the lock, [`VmState::running`] decides.
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Starts or stops the device; call with the lock held (`st`), which
    /// orders the hint with the authoritative copy.
    pub fn set_running(&self, st: &mut Guarded, on: bool) {
        self.running.store(on, Ordering::Release);
        st.vm.set_running(on);
    }

    /// The data-path generation: it changes (under the VM's lock, before
    /// the lock is released) whenever objects, memory or the connection of
    /// the VM may have changed. Read it under [`VmCell::with_dataplane`] to
    /// pair it with the state it describes.
    pub fn dp_generation(&self) -> u64 {
        self.dp_gen.load(Ordering::Acquire)
    }

    /// Advances the data-path generation (with the lock held).
    pub fn bump_dp_gen(&self) {
        self.dp_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Called by the engine with the VM's lock held (`state` being the
    /// VM's state) after it worked on the VM: if that moved one of its QPs
    /// to ERR — the VM's own work, or a message of another VM that its
    /// responder refused — the engine's polling list of the VM is rebuilt
    /// (a QP in ERR watches its receive queue, so the flush is work) and
    /// the list is woken if it was parked. Without this a QP failed while
    /// its VM was parked was never flushed (spec 18.19 item 2): nothing
    /// else would wake its list, and nothing in its doorbells changed.
    /// Costs a flag test when nothing failed.
    pub(crate) fn engine_changed(&self, state: &mut VmState) {
        if state.take_engine_work() {
            self.bump_dp_gen();
            self.kick();
        }
    }

    /// Asks the VM's vhost-user worker to deliver pending events.
    pub fn wake_events(&self) {
        if let Err(e) = self.event_wake.write(1) {
            warn!("cannot wake the event worker: {e}");
        }
    }

    /// The eventfd behind [`VmCell::wake_events`].
    pub fn event_wake_fd(&self) -> &EventFd {
        &self.event_wake
    }

    /// RC QPs of this VM whose destination was one of `gone` (number and
    /// incarnation, sorted by number) at a GID of `gids` (a VM that
    /// disconnected or was reset) move to `ERR`; returns how many.
    pub fn fail_peers_of(&self, gids: &crate::gid_table::GidTable, gone: &[(u32, u64)]) -> usize {
        let mut st = self.lock();
        let n = st.vm.fail_peers_of(gids, gone);
        if n > 0 {
            self.bump_dp_gen();
            drop(st);
            self.kick();
            self.wake_events();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::HeldLock;

    /// A thread never takes a VM's lock it holds; other VMs' locks and
    /// other threads are not affected, and the mark goes with the guard.
    #[test]
    fn held_lock_refuses_only_a_second_entry_on_the_same_thread() {
        let a = HeldLock::enter(7);
        assert!(a.is_some());
        assert!(HeldLock::enter(7).is_none(), "same VM, same thread");
        let b = HeldLock::enter(8);
        assert!(b.is_some(), "another VM");
        let other = std::thread::spawn(|| HeldLock::enter(7).is_some());
        assert!(other.join().unwrap_or(false), "another thread");
        drop(a);
        assert!(HeldLock::enter(7).is_some(), "released");
        drop(b);
    }
}
