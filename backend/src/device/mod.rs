//! The vhost-user device of one VM: what the VMM sees (queues,
//! configuration space, features, vhost-user messages) and the workers
//! behind its queues.
//!
//! - [`RdmaDevice`] (here): the device, its statistics and lifecycle
//!   (disconnect, reset); [`Shared`], what every device shares;
//! - `backend`: the `VhostUserBackend` implementation (features, config
//!   space, memory updates, device reset and queue start/stop);
//! - `controlq`: the control-queue worker (rate limits, copying requests
//!   out of their chains, executing them on the VM's state);
//! - `eventq`: delivering asynchronous events.

mod backend;
mod controlq;
mod eventq;
mod migrate;
mod state_fd;

pub use migrate::MigrationBoard;

use std::io;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::warn;
use thiserror::Error;
use vhost_user_backend::VringT;

use virtio_rdma_abi::config::{DeviceConfig, F_SHMEM_DOORBELL, NUM_QUEUES};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::verbs::PORT_NUM;
use virtio_rdma_abi::Wire;
use vm_memory::{GuestMemoryAtomic, GuestMemoryLoadGuard};
use vmm_sys_util::event::EventNotifier;
use vmm_sys_util::eventfd::EventFd;

use crate::config::Limits;
use crate::engine::Engine;
use crate::memory::dirty::DirtyLog;
use crate::memory::{GuestRam, RamMap};
use crate::qos::ctrl_limit::{CtrlLimits, TenantCtrlLimits};
use crate::qos::QosTable;
use crate::resources::ResourceCounts;
use crate::restart::RestartTracker;
use crate::rnic_objects::RnicObjects;
use crate::shmem::{DoorbellRegion, RegionLink};
use crate::stats::TrafficCounters;
use crate::sync::lock;
use crate::tenancy::Tenancy;
use crate::vm::cell::{Guarded, VmCell};
use crate::vm::{CtrlStats, PortIdentity, VmState};
use crate::vring::Vring;

/// Largest virtqueue the device accepts.
pub const MAX_QUEUE_SIZE: usize = 1024;

/// Errors of the vhost-user device.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// An event for a queue the device does not have.
    #[error("event for unknown queue {0}")]
    UnknownQueue(u16),
    /// The exit eventfd could not be created.
    #[error("cannot create exit event: {0}")]
    ExitEvent(io::Error),
}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> Self {
        io::Error::other(e)
    }
}

pub(super) type Mem = GuestMemoryLoadGuard<GuestRam>;

/// A snapshot of one device's state, for statistics and leak checks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeviceStats {
    /// Live objects.
    pub resources: ResourceCounts,
    /// Control-path counters.
    pub ctrl: CtrlStats,
    /// Events dropped for lack of event buffers.
    pub events_lost: u64,
    /// Work waiting in the VM's queues now.
    pub queues: QueueDepths,
}

crate::stats::sums! {
/// Work waiting in a VM's queues (a snapshot; producer indices are read
/// from the doorbells, so a queue the driver claims to have overfilled
/// counts as full).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepths {
    /// Send WQEs posted and not yet completed by the device, all QPs.
    pub send_wqes: u64,
    /// Receive WQEs posted and not yet consumed, QPs' own receive queues.
    pub recv_wqes: u64,
    /// Receive WQEs posted and not yet consumed, SRQs.
    pub srq_wqes: u64,
    /// Asynchronous events waiting for an event buffer.
    pub events_pending: u64,
}
}

/// The virtio-rdma device of one VM.
pub struct RdmaDevice {
    id: usize,
    /// The VM's state and lock, shared with the engine thread serving it.
    cell: Arc<VmCell>,
    config: Vec<u8>,
    device_features: u64,
    event_idx: AtomicBool,
    ctrl_poll: Duration,
    exit_notifiers: Mutex<Vec<EventNotifier>>,
    /// Raw descriptors of the exit-event consumers of the current
    /// connection's workers (see [`RdmaDevice::close_exit_consumers`]).
    exit_consumers: Mutex<Vec<std::os::fd::RawFd>>,
    engine: Arc<Engine>,
    /// The notification queue's kick eventfd (our own descriptor of it),
    /// which the engine thread waits on: see [`crate::engine::kicks`].
    notify_kick: Mutex<Option<std::fs::File>>,
    /// The doorbell region and its mapping into the guest
    /// (`F_SHMEM_DOORBELL` offered).
    shmem: Option<RegionLink>,
    /// The driver negotiated `F_SHMEM_DOORBELL`.
    shmem_acked: AtomicBool,
    /// The daemon's live QoS settings (control-command rate limit).
    qos: Arc<QosTable>,
    limits: Limits,
    /// The daemon's tenancy table (the VM's control counters).
    tenancy: Arc<Tenancy>,
    /// The VM's control-command rate limit and its tenant's; used by the
    /// VM's vring worker only.
    ctrl_limits: CtrlLimits,
    /// Advances, under the state lock, on every device reset and VMM
    /// disconnect: control requests taken off the ring before it are not
    /// executed after it (they would create objects in the fresh state).
    epoch: AtomicU64,
    /// The control queue's avail ring was found unusable and that was
    /// logged; cleared when requests are taken again.
    ctrlq_unusable: AtomicBool,
    /// Starts and stops of the queues since the last reset (a reset
    /// without `RESET_DEVICE` is recognised from them, spec 15.1).
    restart: Mutex<RestartTracker>,
    /// The guest memory the device uses (queues, control path): the last
    /// memory table it accepted, empty while none is. The library's own
    /// copy also holds tables the device refused (spec 19.6.1).
    guest_mem: GuestMemoryAtomic<GuestRam>,
    /// Accept guest RAM files without `F_SEAL_SHRINK` (spec 19.6.1).
    allow_unsealed_memory: bool,
    /// The running or last device-state transfer (spec 20.1).
    state_transfer: state_fd::StateTransfer,
    /// The daemon's saved states (spec 20.5).
    board: Arc<MigrationBoard>,
    /// The features of a state loaded before the front-end negotiated
    /// them and sent its memory table: both are checked at the start
    /// (spec 20.1).
    pending: Mutex<Option<u64>>,
    /// The VMM's dirty log and whether logging is on (spec 20.4).
    dirty: Arc<DirtyLog>,
    /// The RNIC's writes into guest RAM are all the daemon's, so it offers
    /// `VHOST_F_LOG_ALL` and `LOG_SHMFD` (spec 20.4).
    can_log: bool,
}

/// Daemon-wide state every device shares.
#[derive(Clone)]
pub struct Shared {
    /// Tenants, GIDs and isolation counters.
    pub tenancy: Arc<Tenancy>,
    /// Live QoS settings.
    pub qos: Arc<QosTable>,
    /// Each tenant's control-command rate limit (`ctrl_per_sec` of its QoS
    /// class), shared by the control workers of its VMs.
    pub tenant_ctrl: Arc<TenantCtrlLimits>,
    /// Accept guest RAM files that can shrink (spec 19.6.1; a VMM that
    /// truncates one crashes the daemon).
    pub allow_unsealed_memory: bool,
    /// The states saved and not yet taken (spec 20.5).
    pub board: Arc<MigrationBoard>,
}

impl Shared {
    /// The shared state of a daemon with `tenants` tenants.
    pub fn new(tenancy: Arc<Tenancy>, qos: Arc<QosTable>) -> Self {
        let tenant_ctrl = TenantCtrlLimits::new(tenancy.tenants().len(), Instant::now());
        Shared {
            tenancy,
            qos,
            tenant_ctrl: Arc::new(tenant_ctrl),
            allow_unsealed_memory: false,
            board: Arc::new(MigrationBoard::default()),
        }
    }
}

/// Epoll id of [`RdmaDevice::event_wake_fd`] (past the queue ids).
pub const EVENT_WAKE: u16 = NUM_QUEUES as u16 + 1;

impl RdmaDevice {
    /// Creates the device of one VM.
    pub fn new(
        limits: Limits,
        device_features: u64,
        ctrl_poll: Duration,
        rnic: Arc<dyn RnicObjects>,
        engine: Arc<Engine>,
        port: PortIdentity,
        shared: &Shared,
    ) -> io::Result<Self> {
        let id = port.vm;
        // What the RNIC cannot do is not offered (F_MEM_MGT on a host NIC).
        let device_features = device_features & rnic.caps().features();
        let can_log = rnic.caps().dirty_log;
        let mut ctrl = VmState::new(limits, rnic, port, shared.tenancy.clone());
        let shmem = if device_features & F_SHMEM_DOORBELL != 0 {
            let region = DoorbellRegion::new(limits.max_ctx).map_err(io::Error::other)?;
            let link = RegionLink::new(Arc::new(region));
            ctrl.res.doorbells = Some(link.pages());
            Some(link)
        } else {
            None
        };
        // The port is up from the start; the event waits for a buffer.
        ctrl.events.push(EventKind::PORT_ACTIVE, PORT_NUM, 0);
        let cell = Arc::new(VmCell::new(ctrl, engine.index(), engine.kicked_vms())?);
        let dirty = DirtyLog::new();
        let (weak_cell, weak_log) = (Arc::downgrade(&cell), Arc::downgrade(&dirty));
        dirty.set_hook(move || {
            if let (Some(cell), Some(log)) = (weak_cell.upgrade(), weak_log.upgrade()) {
                engine_log_changed(&cell, &log);
            }
        });
        Ok(RdmaDevice {
            id,
            cell,
            config: device_config(&limits, shared.tenancy.vm(id)).to_bytes(),
            device_features,
            event_idx: AtomicBool::new(false),
            ctrl_poll,
            exit_notifiers: Mutex::new(Vec::new()),
            exit_consumers: Mutex::new(Vec::new()),
            engine,
            notify_kick: Mutex::new(None),
            shmem,
            shmem_acked: AtomicBool::new(false),
            qos: shared.qos.clone(),
            limits,
            tenancy: shared.tenancy.clone(),
            ctrl_limits: CtrlLimits::new(id, shared.tenant_ctrl.clone(), Instant::now()),
            epoch: AtomicU64::new(0),
            ctrlq_unusable: AtomicBool::new(false),
            restart: Mutex::new(RestartTracker::default()),
            guest_mem: GuestMemoryAtomic::new(GuestRam::new()),
            allow_unsealed_memory: shared.allow_unsealed_memory,
            state_transfer: state_fd::StateTransfer::default(),
            board: shared.board.clone(),
            pending: Mutex::new(None),
            dirty,
            can_log,
        })
    }

    /// The device's dirty-logging state (spec 20.4).
    pub fn dirty_log(&self) -> &Arc<DirtyLog> {
        &self.dirty
    }

    /// The daemon's live QoS settings.
    pub fn qos(&self) -> &Arc<QosTable> {
        &self.qos
    }

    /// The VM's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Index of this VM in the daemon.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The VM's state and lock (shared with the engine thread).
    pub fn cell(&self) -> &Arc<VmCell> {
        &self.cell
    }

    /// Whether the device is started (see [`VmCell::running`]).
    pub fn running(&self) -> bool {
        self.cell.running()
    }

    /// The engine thread serving this VM.
    pub fn engine_index(&self) -> usize {
        self.engine.index()
    }

    fn bump_dp_gen(&self) {
        self.cell.bump_dp_gen();
    }

    /// Asks the vhost-user worker to deliver pending events.
    pub fn wake_events(&self) {
        self.cell.wake_events();
    }

    /// The eventfd that wakes the worker for event delivery; registered as
    /// [`EVENT_WAKE`] with the vhost-user epoll loop.
    pub fn event_wake_fd(&self) -> &EventFd {
        self.cell.event_wake_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Guarded> {
        self.cell.lock()
    }

    /// Current statistics.
    pub fn stats(&self) -> DeviceStats {
        stats_of(&self.lock())
    }

    /// Current statistics if the VM's state lock is free; `None` while
    /// another thread holds it. The operator interfaces use this, so that
    /// one VM whose lock is stuck cannot hang every scrape.
    pub fn try_stats(&self) -> Option<DeviceStats> {
        self.cell.try_lock().map(|st| stats_of(&st))
    }

    /// The engine thread waits on `kick` for the notification queue's
    /// kicks from now on (`None`: on none).
    pub(super) fn set_notify_kick(&self, kick: Option<&std::fs::File>) {
        let mut held = crate::sync::lock(&self.notify_kick);
        if let Some(old) = held.take() {
            if let Err(e) = self.engine.unwatch_kick(&old) {
                warn!(
                    "VM {}: cannot stop watching the notification kicks: {e}",
                    self.id
                );
            }
        }
        let Some(kick) = kick else {
            return;
        };
        // Our own descriptor: the queue's may be closed while the engine
        // still waits on it.
        let watched = kick
            .try_clone()
            .and_then(|own| self.engine.watch_kick(self.id, &own).map(|()| own));
        match watched {
            Ok(own) => *held = Some(own),
            // Not an eventfd the kernel can poll (a VMM's mistake): its
            // doorbells are found by the engine's re-check of parked VMs,
            // slowly, and nobody else pays for it.
            Err(e) => warn!(
                "VM {}: the notification queue's kick cannot be watched ({e}): \
                 its doorbells will be served late",
                self.id
            ),
        }
    }

    /// The VMM went away: releases every resource of the VM and the
    /// mapping of its memory. The device object itself lives on for the
    /// next connection, so handle generations keep advancing and handles
    /// from an earlier connection never resolve again.
    pub fn disconnected(&self) {
        self.abandon_state_fd();
        self.set_notify_kick(None);
        // A state held for a start that will not come (spec 20.1).
        *crate::sync::lock(&self.pending) = None;
        if let Some(link) = &self.shmem {
            link.forget();
            link.set_channel(None);
        }
        self.shmem_acked.store(false, Ordering::Release);
        self.restart_lock().clear();
        // Logging ends with the connection (the next VMM sets its own
        // log); not under the VM's lock, which the change takes.
        self.dirty.clear();
        let mut st = self.lock();
        self.cell.set_running(&mut st, false);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        // A migration's destination that ends before it starts gives the
        // state back (spec 20.5).
        let identity = self.tenancy.vm(self.id).map_or(self.id, |v| v.identity);
        if let Some(from) = self.board.give_back(identity, self.id, &mut st) {
            self.tenancy.set_active(identity, from);
        }
        // The guest has not reset the device: its kernel may still map the
        // doorbell pages of this connection's contexts into processes, so
        // none of them goes to a new context before a reset (spec 15.2).
        if let Some(pages) = st.vm.res.doorbells.as_mut() {
            let n = pages.quarantine_in_use();
            if n > 0 {
                log::info!(
                    "VM {}: {n} doorbell pages kept out of use until the driver resets the device",
                    self.id
                );
            }
        }
        let mut gone = st.vm.reset();
        self.keep_moved_peers(identity, &st, &mut gone);
        // No producer index of this connection survives into the next.
        if let Some(link) = &self.shmem {
            link.clear_region();
        }
        let gids = *st.vm.gids();
        st.vm.set_features(0);
        st.vm.memory_changed(None);
        st.vm.set_ram(RamMap::default());
        st.mem = None;
        st.host = None;
        // Unmap the guest's RAM now, not when the next VMM connects: the
        // mapping and its files are this VM's memory (spec 19.8).
        self.forget_memory();
        self.bump_dp_gen();
        st.vm.events.push(EventKind::PORT_ACTIVE, PORT_NUM, 0);
        self.event_idx.store(false, Ordering::Relaxed);
        // Not under our lock: the peers' locks are taken one at a time.
        drop(st);
        self.engine.peers_gone(self.id, &gids, gone);
        // The engine's doorbell list of the VM holds the old mapping until
        // it is rebuilt, and a parked VM's list is looked at only when
        // kicked: have it let go now.
        self.cell.kick();
        self.engine.wake();
    }

    /// Drops the device's view of guest memory (the vrings of the ended
    /// connection share it), so that nothing of the daemon maps the VM's
    /// RAM or holds its files any more.
    fn forget_memory(&self) {
        match self.guest_mem.lock() {
            Ok(g) => g.replace(GuestRam::new()),
            Err(e) => e.into_inner().replace(GuestRam::new()),
        }
    }

    /// Closes the exit-event consumers handed to the vring workers of a
    /// connection that has ended. vhost-user-backend 0.24.0 registers each
    /// with its epoll through `into_raw_fd` and never closes it: one
    /// descriptor per connection would leak. Call only after the
    /// connection's `VhostUserDaemon` is dropped (its workers joined), so
    /// no epoll still watches them.
    pub fn close_exit_consumers(&self) {
        let fds = std::mem::take(&mut *lock(&self.exit_consumers));
        for fd in fds {
            // SAFETY: `fd` is the eventfd this device created in
            // `exit_event` and gave away as an `EventConsumer`, which the
            // library converted into a raw descriptor that nothing owns or
            // closes (the exact version is pinned for this). Its worker has
            // been joined, so no one uses it; it is taken out of the list,
            // so it is closed exactly once, and it stayed open until now,
            // so the number cannot have been reused.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
    }

    /// Stops the worker threads serving the current connection.
    pub fn stop_workers(&self) {
        let notifiers = std::mem::take(&mut *lock(&self.exit_notifiers));
        for n in notifiers.iter() {
            if let Err(e) = n.notify() {
                warn!("cannot signal worker exit: {e}");
            }
        }
    }

    /// Maps the doorbell region into the guest if the driver negotiated
    /// shared-memory doorbells and it is not mapped yet. Called with
    /// requests in hand: a driver that has made a request available has
    /// started the device, so the VMM accepts the map now (a kick alone
    /// proves nothing: the worker also runs when the VMM sets the kick fd,
    /// before the device is started). Must run without the state lock (see
    /// `RegionLink::ensure_mapped`).
    fn map_doorbells(&self) {
        if let Some(link) = &self.shmem {
            if self.shmem_acked.load(Ordering::Acquire) {
                link.ensure_mapped();
            }
        }
    }

    /// The VM's traffic counters (control commands and their latency).
    fn traffic(&self) -> Option<&TrafficCounters> {
        self.tenancy.traffic(self.id)
    }
}

/// Logging turned on or off, or the log changed: the engine's view of the
/// VM's memory is rebuilt with the log it must mark (under the VM's lock,
/// so that no data-path write after this uses the old one).
fn engine_log_changed(cell: &VmCell, log: &DirtyLog) {
    let mut st = cell.lock();
    if let Some(host) = st.host.as_ref() {
        let host = Arc::new(host.with_log(log.engine_log()));
        st.host = Some(host);
    }
    cell.bump_dp_gen();
    drop(st);
    cell.kick();
}

/// The configuration space of a VM with `limits`: its ABI version and the
/// guest interface its port is paired with, from its entry `vm` (spec
/// chapter 5, appendix A).
fn device_config(limits: &Limits, vm: Option<&crate::tenancy::VmEntry>) -> DeviceConfig {
    let base = limits.device_config();
    DeviceConfig {
        abi_version: vm.map_or(base.abi_version, |v| v.abi),
        mac: vm.and_then(|v| v.mac).unwrap_or_default(),
        ..base
    }
}

/// The statistics of a VM (under its lock).
fn stats_of(st: &Guarded) -> DeviceStats {
    DeviceStats {
        resources: st.vm.res.counts(),
        ctrl: st.vm.stats,
        events_lost: st.vm.events.lost_total,
        queues: queue_depths(st),
    }
}

/// The work waiting in the queues of a VM (under its lock).
fn queue_depths(st: &Guarded) -> QueueDepths {
    use crate::engine::doorbell::{load_pi, RQ, SQ, SRQ};
    let res = &st.vm.res;
    let mut q = QueueDepths {
        events_pending: st.vm.events.len() as u64,
        ..QueueDepths::default()
    };
    let Some(mem) = st.host.as_deref() else {
        return q;
    };
    // Guest-written indices: clamp to the depth, as the engine would refuse
    // more.
    let pending = |pi: Option<u32>, ci: u32, depth: u32| {
        pi.map_or(0, |pi| u64::from(pi.wrapping_sub(ci).min(depth)))
    };
    for (_, qp) in res.qps.iter() {
        let slot = qp.db_slot.as_ref();
        q.send_wqes += pending(load_pi(mem, qp.db_gpa, slot, SQ), qp.rt.sq_ci, qp.sq_depth);
        if qp.srq == 0 {
            q.recv_wqes += pending(load_pi(mem, qp.db_gpa, slot, RQ), qp.rt.rq_ci, qp.rq_depth);
        }
    }
    for (_, srq) in res.srqs.iter() {
        let pi = load_pi(mem, srq.db_gpa, srq.db_slot.as_ref(), SRQ);
        q.srq_wqes += pending(pi, srq.rt.ci, srq.depth);
    }
    q
}
/// Interrupts the driver unless it asked not to be (EVENT_IDX `used_event`).
pub(super) fn signal(vring: &Vring) -> io::Result<()> {
    if vring.needs_notification().map_err(io::Error::other)? {
        vring.signal_used_queue()?;
    }
    Ok(())
}
