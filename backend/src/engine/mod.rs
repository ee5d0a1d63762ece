//! The data-path engine: the device model both RNICs share. It polls the
//! doorbells, schedules the VMs, takes send WQEs from the guest rings,
//! checks and addresses them and hands them to an RNIC's data path
//! ([`crate::rnic_path::RnicPath`]), writes CQEs and flushes QPs in error.
//! Which RNIC moves the bytes is `crate::rnic`'s to say ([`Launch`]): the
//! engine never asks.
//!
//! - [`Engine`] (here): one engine thread, as the daemon holds it;
//!   [`placement`] starts the threads and places tenants' VMs on them;
//! - `thread`: the thread's loop and parking; `scratch`: its reusable
//!   memory; `sweep`: one round over the VMs with work, a burst per QP;
//!   `poll`: the polling lists of doorbell records and the doorbell flags;
//!   [`doorbell`]: the fields of doorbell records and slots; [`barrier`]:
//!   the system-wide barrier behind `DB_FLAG_POLLING` (rate limits and
//!   weighted sharing are in [`crate::qos`]);
//! - [`requester`]: taking send WQEs and checking and addressing them, and
//!   completing them for the RNIC (`complete_send`, `complete_posted`);
//!   `fastreg`: the local memory operations (REG_MR, LOCAL_INV work
//!   requests), `bind`: BIND_MW;
//!   [`wqe`]: copying WQEs out of guest rings; [`sge`]: a QP's own
//!   scatter/gather lists; [`completer`]: CQEs and completion events;
//!   `flush`: QPs in error; [`kicks`]: the notification queue's kicks,
//!   which the thread waits on itself.

mod anticipate;
mod attention;
pub mod barrier;
mod bind;
pub mod completer;
pub mod doorbell;
mod fastreg;
mod flush;
#[cfg(test)]
mod in_flight;
pub mod kicks;
pub mod placement;
mod poll;
pub mod poll_window;
pub mod requester;
mod scratch;
pub mod sge;
mod sweep;
#[cfg(test)]
pub(crate) mod testing;
mod thread;
pub mod wqe;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use log::warn;
use vmm_sys_util::eventfd::EventFd;

use crate::qos::QosTable;
use crate::rnic_objects::Caps;
use crate::sync::lock;
use crate::tenancy::Tenancy;
use crate::vm::cell::KickedVms;
use kicks::KickWatch;
use placement::Registry;
use thread::pin_to;

pub use placement::{EnginePlan, EngineStats, Engines};
pub use thread::POLL_WINDOW;

/// What an engine thread runs: the data path of the RNIC behind the
/// devices. `crate::rnic` gives it for the RNIC the configuration names,
/// so the engine never asks which RNIC it is.
pub trait Launch: Send + Sync {
    /// The RNIC's caps (the requester checks every work request against
    /// them).
    fn caps(&self) -> Caps;

    /// Runs the loop of engine thread `engine` over the RNIC's data path
    /// (`Engine::run`) until the engine stops.
    fn run(&self, engine: &Engine);
}

/// Whether `qpn` is QP 0 or 1, the management QPs (SMI, GSI) of an
/// InfiniBand or RoCE port: the device never hands those numbers out, and a
/// guest's UD send to them is refused (spec 18.11.5) rather than let reach
/// a fabric's management through a host RNIC.
pub(crate) fn management_qp(qpn: u32) -> bool {
    qpn <= 1
}

/// Counts a refused attempt at a management QP in VM `vm`'s `privileged`.
pub(crate) fn count_privileged(tenancy: &Tenancy, vm: usize) {
    if let Some(c) = tenancy.counters(vm) {
        crate::tenancy::IsolationCounters::bump(&c.privileged);
    }
}

/// Work counters of one engine thread (written by it alone).
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Send work requests executed to completion.
    pub wqes: AtomicU64,
    /// Payload bytes moved by them (and by pieces of large WRITEs).
    pub bytes: AtomicU64,
    /// Times the thread parked (went to sleep for want of work).
    pub parks: AtomicU64,
    /// Times a VM was parked on its own while the thread polled others.
    pub vm_parks: AtomicU64,
    /// Times a peek found work of a parked VM while the thread was busy
    /// (before, or without, the VM's notification).
    pub peeked: AtomicU64,
    /// Times the thread's re-check of its parked VMs before a sleep (at
    /// most every 50 ms, a batch of them at a time) found work whose
    /// notification had not arrived (late, or lost: the re-check bounds the
    /// wait either way).
    pub late_kicks: AtomicU64,
    /// Times the thread watched an entitled VM's doorbells and found its
    /// next post (`anticipate`).
    pub anticipated: AtomicU64,
    /// How long the thread polls after work before it parks now, in µs
    /// ([`poll_window`]).
    pub poll_window_us: AtomicU64,
}

/// An engine thread and the VMs it serves.
pub struct Engine {
    /// Its position among the daemon's engine threads.
    index: usize,
    registry: Arc<Registry>,
    /// The QoS generation whose settings this thread enforces.
    qos_applied: AtomicU64,
    /// The `flags` the thread's VMs' doorbells carry, set just before the
    /// thread writes them into the existing ones: the control path gives
    /// new queues and pages the same (`VmState::new_doorbell_flags`).
    db_flags: Arc<AtomicU32>,
    counters: EngineCounters,
    /// The RNIC's caps, read once (the requester checks every work
    /// request against them).
    caps: Caps,
    wake: EventFd,
    /// The notification kicks of its VMs, which it waits on when it sleeps.
    kicks: KickWatch,
    /// Its VMs kicked since it last looked (kicks of every origin).
    kicked_vms: Arc<KickedVms>,
    stop: AtomicBool,
    /// Held by a test (`Engines::hold`): the thread does nothing until it
    /// is released; `held` acknowledges that it has stopped working.
    hold: AtomicBool,
    held: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Who may reach whom, and the isolation and traffic counters.
    tenancy: Arc<Tenancy>,
    /// The live QoS settings.
    qos: Arc<QosTable>,
    /// Whether to set `DB_FLAG_POLLING` while polling (spec 18.6).
    fence_elision: bool,
    /// Pinned to a CPU (`engine_cpus`), which the operator gives it for
    /// itself: only then does it poll past `POLL_MIN` after work
    /// (`poll_window`).
    pinned: bool,
}

impl Engine {
    /// Starts engine thread `index` for the VMs `registry` places on it,
    /// pinned to `cpu` if given, on `rnic`'s data path.
    pub fn start(
        index: usize,
        registry: Arc<Registry>,
        rnic: Arc<dyn Launch>,
        tenancy: Arc<Tenancy>,
        qos: Arc<QosTable>,
        cpu: Option<usize>,
        fence_elision: bool,
    ) -> std::io::Result<Arc<Engine>> {
        let engine = Arc::new(Engine {
            index,
            registry,
            qos_applied: AtomicU64::new(0),
            db_flags: Arc::new(AtomicU32::new(0)),
            counters: EngineCounters::default(),
            caps: rnic.caps(),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            kicks: KickWatch::new()?,
            kicked_vms: Arc::default(),
            stop: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            held: AtomicBool::new(false),
            thread: Mutex::new(None),
            tenancy,
            qos,
            fence_elision,
            pinned: cpu.is_some(),
        });
        let e = engine.clone();
        let t = std::thread::Builder::new()
            .name(format!("rnic-engine{index}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to(cpu);
                }
                rnic.run(&e);
            })?;
        *lock(&engine.thread) = Some(t);
        Ok(engine)
    }

    /// Who may reach whom, and the traffic counters.
    pub(crate) fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// Its position among the daemon's engine threads.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its work counters.
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// The doorbell flags of the thread's VMs (for their control path:
    /// new queues start with them).
    pub fn doorbell_flags(&self) -> Arc<AtomicU32> {
        self.db_flags.clone()
    }

    /// The list its VMs' kicks go to (`VmCell::new`).
    pub fn kicked_vms(&self) -> Arc<KickedVms> {
        self.kicked_vms.clone()
    }

    /// Whether this thread serves VM `vm`.
    fn serves(&self, vm: usize) -> bool {
        self.registry.engine_of(vm) == Some(self.index)
    }

    /// The RC QPs `qpns` (number, incarnation) of VM `vm` (GID table `gids`)
    /// are gone with their VM's connection or reset: every RC QP of another
    /// VM connected to one of them moves to `ERR` with `QP_FATAL`, and the
    /// engine flushes its work (spec 18.23), rather than letting it retry
    /// into nothing.
    /// Takes one VM's lock at a time (the caller holds none).
    pub fn peers_gone(
        &self,
        vm: usize,
        gids: &crate::gid_table::GidTable,
        mut qpns: Vec<(u32, u64)>,
    ) {
        if qpns.is_empty() {
            return;
        }
        qpns.sort_unstable();
        let mut failed = 0usize;
        // The peers are VMs of the same tenant: served by this thread.
        for (i, dev) in self.registry.all_vms().iter().enumerate() {
            if i == vm {
                continue;
            }
            if let Some(dev) = dev {
                failed = failed.saturating_add(dev.fail_peers_of(gids, &qpns));
            }
        }
        if failed > 0 {
            log::info!("VM {vm} went away: {failed} connected QPs of other VMs failed");
            self.wake();
        }
    }

    /// The newest QoS generation whose settings this thread enforces: a
    /// change made at generation `g` is in force once this is at least
    /// `g` ([`Engines::sync_qos`]).
    pub fn qos_applied(&self) -> u64 {
        self.qos_applied.load(Ordering::Acquire)
    }

    /// Wakes the thread on `kick`, VM `vm`'s notification kick eventfd,
    /// until [`Engine::unwatch_kick`]; the caller keeps `kick` open
    /// meanwhile ([`KickWatch::watch`]).
    pub fn watch_kick(&self, vm: usize, kick: &std::fs::File) -> std::io::Result<()> {
        self.kicks.watch(vm, kick)
    }

    /// Stops waking the thread on `kick`.
    pub fn unwatch_kick(&self, kick: &std::fs::File) -> std::io::Result<()> {
        self.kicks.unwatch(kick)
    }

    /// Wakes the engine (a control-path change; doorbell kicks reach the
    /// thread directly, [`Engine::watch_kick`]).
    pub fn wake(&self) {
        if let Err(e) = self.wake.write(1) {
            warn!("cannot wake the engine: {e}");
        }
    }

    /// Holds the thread (`on`), returning once it has stopped working, or
    /// releases it: for tests that need the engine not to look at a VM for
    /// a while (a race made deterministic). Nothing in the daemon holds it.
    pub fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::Release);
        self.wake();
        while on && !self.held.load(Ordering::Acquire) && !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stops the engine thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::management_qp;

    /// QPs 0 and 1 (SMI, GSI) are the management QPs a UD send may not
    /// name, on either RNIC; every other number may be named.
    #[test]
    fn only_qps_0_and_1_are_management_qps() {
        assert!(management_qp(0));
        assert!(management_qp(1));
        assert!(!management_qp(2));
        assert!(!management_qp(0x11));
        assert!(!management_qp(0x00ff_ffff));
    }
}
