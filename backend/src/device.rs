//! The vhost-user device: virtqueues, configuration space, feature
//! negotiation, and the loop that takes control requests off the control
//! queue and delivers asynchronous events on the event queue.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{debug, warn};
use thiserror::Error;
use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use virtio_rdma_abi::config::{
    DeviceConfig, CONTROLQ, EVENTQ, F_SHMEM_DOORBELL, NOTIFYQ, NUM_QUEUES,
};
use virtio_rdma_abi::ctrl::{ResponseHeader, MAX_REQUEST_BYTES};
use virtio_rdma_abi::event::{Event, EventKind};
use virtio_rdma_abi::verbs::PORT_NUM;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryLoadGuard, GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::EventFd;

use crate::config::Limits;
use crate::ctrl::{Prepared, Preparer};
use crate::engine::Engine;
use crate::memory::{HostMem, RamMap};
use crate::qos::ctrl_limit::{CtrlLimits, TenantCtrlLimits};
use crate::qos::QosTable;
use crate::resources::ResourceCounts;
use crate::restart::{RestartTracker, Verdict};
use crate::shmem::{DoorbellRegion, RegionLink};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;
use crate::transport::Transport;
use crate::vm::cell::{Guarded, VmCell};
use crate::vm::{CtrlStats, PortIdentity, VmState};
use crate::vring::{QueueObserver, Vring};

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

type Mem = GuestMemoryLoadGuard<GuestMemoryMmap<()>>;

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
}

/// Longest single sleep of a rate-limited control worker: it re-checks
/// that its queue still runs this often, so a stop or reset is not held up
/// by a long wait.
const RATE_SLICE: Duration = Duration::from_millis(5);

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
}

impl Shared {
    /// The shared state of a daemon with `tenants` tenants.
    pub fn new(tenancy: Arc<Tenancy>, qos: Arc<QosTable>) -> Self {
        let tenant_ctrl = TenantCtrlLimits::new(tenancy.tenants().len(), Instant::now());
        Shared {
            tenancy,
            qos,
            tenant_ctrl: Arc::new(tenant_ctrl),
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
        transport: Arc<dyn Transport>,
        engine: Arc<Engine>,
        port: PortIdentity,
        shared: &Shared,
    ) -> io::Result<Self> {
        let id = port.vm;
        let mut ctrl = VmState::new(limits, transport, port, shared.tenancy.clone());
        ctrl.set_doorbell_flags(engine.doorbell_flags());
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
        Ok(RdmaDevice {
            id,
            cell: Arc::new(VmCell::new(ctrl, engine.index())?),
            config: device_config(&limits, shared.tenancy.vm(id).and_then(|v| v.mac)).to_bytes(),
            device_features,
            event_idx: AtomicBool::new(false),
            ctrl_poll,
            exit_notifiers: Mutex::new(Vec::new()),
            exit_consumers: Mutex::new(Vec::new()),
            engine,
            shmem,
            shmem_acked: AtomicBool::new(false),
            qos: shared.qos.clone(),
            limits,
            tenancy: shared.tenancy.clone(),
            ctrl_limits: CtrlLimits::new(id, shared.tenant_ctrl.clone(), Instant::now()),
            epoch: AtomicU64::new(0),
            ctrlq_unusable: AtomicBool::new(false),
            restart: Mutex::new(RestartTracker::default()),
        })
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

    /// The VMM went away: releases every resource of the VM and the
    /// mapping of its memory. The device object itself lives on for the
    /// next connection, so handle generations keep advancing and handles
    /// from an earlier connection never resolve again.
    pub fn disconnected(&self) {
        if let Some(link) = &self.shmem {
            link.forget();
            link.set_channel(None);
        }
        self.shmem_acked.store(false, Ordering::Release);
        self.restart_lock().clear();
        let mut st = self.lock();
        self.cell.set_running(&mut st, false);
        self.epoch.fetch_add(1, Ordering::AcqRel);
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
        let gone = st.vm.reset();
        // No producer index of this connection survives into the next.
        if let Some(link) = &self.shmem {
            link.clear_region();
        }
        let gid = st.vm.port_gid();
        st.vm.set_features(0);
        st.vm.set_ram(RamMap::default());
        st.mem = None;
        st.host = None;
        self.bump_dp_gen();
        st.vm.events.push(EventKind::PORT_ACTIVE, PORT_NUM, 0);
        self.event_idx.store(false, Ordering::Relaxed);
        // Not under our lock: the peers' locks are taken one at a time.
        drop(st);
        self.engine.peers_gone(self.id, gid, gone);
    }

    /// Closes the exit-event consumers handed to the vring workers of a
    /// connection that has ended. vhost-user-backend 0.24.0 registers each
    /// with its epoll through `into_raw_fd` and never closes it: one
    /// descriptor per connection would leak. Call only after the
    /// connection's `VhostUserDaemon` is dropped (its workers joined), so
    /// no epoll still watches them.
    pub fn close_exit_consumers(&self) {
        let fds = std::mem::take(
            &mut *self
                .exit_consumers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
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
        let notifiers = std::mem::take(
            &mut *self
                .exit_notifiers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
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

    /// Takes up to `want` control-command tokens from the VM's and its
    /// tenant's rate limits. Returns the number taken, or how long to wait
    /// for the next batch.
    fn ctrl_tokens(&self, want: u64) -> Result<u64, Duration> {
        self.ctrl_limits
            .take(want, Instant::now(), &self.qos, &self.tenancy)
    }

    /// Sleeps `wait` (the VM's control rate limit), in slices, without any
    /// lock held. Returns false if the queue stopped meanwhile.
    fn rate_wait(&self, vring: &Vring, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        loop {
            if !vring.get_ref().get_queue().ready() {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(RATE_SLICE));
        }
    }

    fn process_controlq(&self, vring: &Vring, eventq: &Vring, mem: &Mem) -> io::Result<()> {
        // Rounds in a row that found no request although the avail index
        // said there were some (a queue the VMM stopped): give up rather
        // than spin.
        let mut empty_rounds = 0;
        // Requests taken per pass: the lock is released and the CPU offered
        // to others between passes (`max_ctrl_outstanding`).
        let per_pass = u16::try_from(self.limits.max_ctrl_outstanding.max(1)).unwrap_or(u16::MAX);
        loop {
            // No kicks while we are awake and looking at the ring anyway.
            vring.disable_notification().map_err(io::Error::other)?;
            let want = pending(vring, mem).min(per_pass);
            // The VM's rate limit: requests beyond it wait in the ring, and
            // only this VM's worker waits for them.
            let take = match self.ctrl_tokens(u64::from(want)) {
                Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
                Err(wait) => {
                    if !self.rate_wait(vring, wait) {
                        return Ok(());
                    }
                    continue;
                }
            };
            // Taken under the state lock, so that a reset or disconnect is
            // either before all of them or after (see `epoch`).
            let st = self.lock();
            let epoch = self.epoch.load(Ordering::Acquire);
            let taken = vring.get_mut().get_queue_mut().iter(mem.clone()).map(|it| {
                let now = Instant::now();
                it.take(take).map(|c| (c, now)).collect::<Vec<_>>()
            });
            drop(st);
            let chains: Vec<(DescriptorChain<Mem>, Instant)> = match taken {
                Ok(c) => c,
                Err(e) => {
                    // The guest corrupted its avail ring; nothing in it can be
                    // trusted. Leave the queue alone until the driver resets.
                    // Every kick finds it so: warn once per breakage (a guest
                    // must not flood the log), count every time.
                    if self.ctrlq_unusable.swap(true, Ordering::AcqRel) {
                        debug!("control queue still unusable: {e}");
                    } else {
                        warn!("VM {}: control queue unusable: {e}", self.id);
                    }
                    self.lock().vm.count_malformed();
                    return Ok(());
                }
            };
            if !chains.is_empty() {
                // Usable again (restarted or repaired): warn anew next time.
                self.ctrlq_unusable.store(false, Ordering::Release);
            }
            let full = chains.len() >= usize::from(per_pass);
            if chains.is_empty() {
                empty_rounds += 1;
                if empty_rounds > 2 {
                    debug!("control queue shows requests it does not hand out; waiting for a kick");
                    break;
                }
            } else {
                empty_rounds = 0;
                self.map_doorbells();
                let mut engine_work = false;
                let queue_size = vring.get_ref().get_queue().size();
                for (chain, taken) in chains {
                    let head = chain.head_index();
                    // A head past the descriptor table names no chain, and
                    // a used element cannot name it either (spec 7.4): the
                    // entry is counted as malformed and returns nothing.
                    let named = head < queue_size;
                    // Copy the request, and do the expensive part of the
                    // command (an MR's translation), before taking the
                    // state lock for it: the engine waits on that lock.
                    let request = if named {
                        read_chain(mem, chain)
                    } else {
                        debug!("control queue: available head {head} is not a descriptor");
                        None
                    };
                    let prepared = match &request {
                        Some(r) if Preparer::wanted(&r.bytes) => {
                            let preparer = self.lock().vm.preparer();
                            preparer.prepare(&**mem, &r.bytes)
                        }
                        _ => None,
                    };
                    // The state lock is held per command, not per pass: the
                    // engine locks this VM too (to rebuild its polling list
                    // after a change), and must never wait for a whole pass
                    // of one VM's commands while every VM's data waits.
                    let (used, ok, released) = {
                        let mut st = self.lock();
                        if self.epoch.load(Ordering::Acquire) != epoch {
                            // Reset or disconnected since these were taken:
                            // the ring they came from is gone.
                            return Ok(());
                        }
                        let ok_before = st.vm.stats.ok;
                        let used = execute_chain(&mut st.vm, mem, request, prepared);
                        engine_work |= st.vm.take_engine_work();
                        // QPs may have come, gone or changed state.
                        self.bump_dp_gen();
                        // Translations of destroyed objects are freed below,
                        // without the lock (milliseconds for a large MR).
                        let released = st.vm.res.take_released();
                        (used, st.vm.stats.ok != ok_before, released)
                    };
                    drop(released);
                    if named {
                        if let Err(e) = vring.add_used(head, used) {
                            warn!("cannot return control buffer {head}: {e}");
                        }
                    }
                    if let Some(t) = self.traffic() {
                        TrafficCounters::add(&t.ctrl_cmds, 1);
                        if !ok {
                            // An error status, or a chain not answered.
                            TrafficCounters::add(&t.ctrl_errors, 1);
                        }
                        t.ctrl_latency.observe(taken.elapsed());
                    }
                }
                signal(vring)?;
                if engine_work {
                    // Posted work may have become startable, or need a
                    // flush. Other commands need no wake-up: a sleeping
                    // engine would look, find nothing and sleep again, at
                    // a cost that grows with the VM's QPs.
                    self.engine.wake();
                }
                // Commands may have raised events; deliver them now rather
                // than when the worker stops polling.
                self.deliver_events(eventq, mem)?;
            }
            if full {
                // A full pass: let other VMs' workers (and the engine) have
                // the CPU before taking more.
                std::thread::yield_now();
                continue;
            }
            if self.poll_for_more(vring, mem) {
                continue;
            }
            // Re-arm kicks; if requests slipped in meanwhile, go round again.
            if !vring.enable_notification().map_err(io::Error::other)? {
                break;
            }
        }
        Ok(())
    }

    /// Adaptive polling: after a batch, watch the avail ring for
    /// `ctrl_poll` before going back to sleep. A driver that issues
    /// commands back to back then needs no kick and the worker no wakeup,
    /// which on separate CPUs is most of a round trip. Yielding lets a
    /// driver that shares our CPU run.
    fn poll_for_more(&self, vring: &Vring, mem: &Mem) -> bool {
        if self.ctrl_poll.is_zero() {
            return false;
        }
        let deadline = Instant::now() + self.ctrl_poll;
        loop {
            if has_requests(vring, mem) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    fn deliver_events(&self, vring: &Vring, mem: &Mem) -> io::Result<()> {
        if !vring.get_ref().is_enabled() {
            return Ok(());
        }
        let mut st = self.lock();
        let mut delivered = false;
        let mut rechecked = false;
        while let Some(ev) = st.vm.events.pop() {
            // Bind first: the queue guard must be gone before the arms
            // below touch the vring again.
            let next = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let chain = match next {
                Some(c) => c,
                None => {
                    st.vm.events.unpop(ev);
                    // Out of buffers with events waiting: ask to be kicked
                    // when the driver posts more (with EVENT_IDX the driver
                    // only kicks past the index we publish here). If some
                    // arrived meanwhile, go round again.
                    // Only once: a stopped queue can show new avail
                    // entries it will not hand out, and this loop holds
                    // the state lock the engine needs.
                    if !rechecked && vring.enable_notification().map_err(io::Error::other)? {
                        rechecked = true;
                        continue;
                    }
                    break;
                }
            };
            rechecked = false;
            let head = chain.head_index();
            if head >= vring.get_ref().get_queue().size() {
                // Names no buffer, and cannot be returned (spec 7.4, 14.1).
                debug!("event queue: available head {head} is not a descriptor");
                st.vm.count_malformed();
                st.vm.events.unpop(ev);
                continue;
            }
            let used = if write_event(mem, chain, &ev) {
                Event::SIZE as u32
            } else {
                // Unusable buffer: give it back empty and keep the event.
                st.vm.count_malformed();
                st.vm.events.unpop(ev);
                0
            };
            if let Err(e) = vring.add_used(head, used) {
                warn!("cannot return event buffer {head}: {e}");
            }
            delivered = true;
        }
        drop(st);
        if delivered {
            signal(vring)?;
        }
        Ok(())
    }
}

/// The configuration space of a VM with `limits` whose port is paired with
/// the guest interface `mac` (spec chapter 5, appendix A).
fn device_config(limits: &Limits, mac: Option<[u8; 6]>) -> DeviceConfig {
    DeviceConfig {
        mac: mac.unwrap_or_default(),
        ..limits.device_config()
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

/// How many requests the driver has made available that are not taken
/// yet (as the avail index claims: a hostile value is only an upper bound
/// for the iterator, which checks it).
fn pending(vring: &Vring, mem: &Mem) -> u16 {
    let st = vring.get_ref();
    let q = st.get_queue();
    q.avail_idx(&**mem, AtomicOrdering::Acquire)
        .map(|a| a.0.wrapping_sub(q.next_avail()))
        .unwrap_or(0)
}

/// Whether the driver has made requests available that are not taken yet.
fn has_requests(vring: &Vring, mem: &Mem) -> bool {
    let st = vring.get_ref();
    let q = st.get_queue();
    q.avail_idx(&**mem, AtomicOrdering::Acquire)
        .map(|a| a.0 != q.next_avail())
        .unwrap_or(false)
}

/// Interrupts the driver unless it asked not to be (EVENT_IDX `used_event`).
fn signal(vring: &Vring) -> io::Result<()> {
    if vring.needs_notification().map_err(io::Error::other)? {
        vring.signal_used_queue()?;
    }
    Ok(())
}

/// A control request copied out of its chain.
struct ChainRequest {
    bytes: Vec<u8>,
    /// The device-writable descriptors, for the response.
    writable: Vec<(GuestAddress, usize)>,
    total_w: usize,
}

/// Executes a request read by [`read_chain`] and writes the response.
/// Returns the used length (0 when the chain was unusable: `None`).
fn execute_chain(
    ctrl: &mut VmState,
    mem: &Mem,
    request: Option<ChainRequest>,
    prepared: Option<Prepared>,
) -> u32 {
    let Some(r) = request else {
        ctrl.count_malformed();
        return 0;
    };
    let response = ctrl.execute_prepared(&**mem, &r.bytes, r.total_w, prepared);
    scatter(mem, &r.writable, &response)
}

/// Copies a control request out of guest memory; `None` when the chain is
/// unusable (it is then answered with used length 0).
fn read_chain(mem: &Mem, chain: DescriptorChain<Mem>) -> Option<ChainRequest> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut total_r = 0usize;
    let mut total_w = 0usize;
    let mut truncated = false;
    for desc in chain {
        // The iterator ends silently on a loop (its TTL runs out), an index
        // past the table or an unreadable descriptor; a chain whose last
        // descriptor still says NEXT was cut short that way.
        truncated = desc.has_next();
        let len = desc.len() as usize;
        // No bytes: nothing is read or written through it, so neither its
        // address nor its direction matters (spec 7.4).
        if len == 0 {
            continue;
        }
        if desc.is_write_only() {
            total_w = total_w.saturating_add(len);
            writable.push((desc.addr(), len));
        } else {
            if !writable.is_empty() {
                debug!("readable descriptor after a writable one");
                return None;
            }
            total_r = total_r.saturating_add(len);
            readable.push((desc.addr(), len));
        }
    }
    if truncated || total_r > MAX_REQUEST_BYTES || total_w < ResponseHeader::SIZE {
        return None;
    }
    if writable.iter().any(|&(a, l)| !mem.check_range(a, l)) {
        return None;
    }
    // Copy the whole request first: the guest may rewrite it while we parse.
    let mut request = vec![0u8; total_r];
    let mut off = 0;
    for (addr, len) in readable {
        let dst = request.get_mut(off..off + len)?;
        if mem.read_slice(dst, addr).is_err() {
            return None;
        }
        off += len;
    }
    Some(ChainRequest {
        bytes: request,
        writable,
        total_w,
    })
}

/// Writes `data` across the writable descriptors; returns bytes written.
fn scatter(mem: &Mem, writable: &[(GuestAddress, usize)], data: &[u8]) -> u32 {
    let mut rest = data;
    let mut written = 0usize;
    for &(addr, len) in writable {
        if rest.is_empty() {
            break;
        }
        let n = len.min(rest.len());
        if mem.write_slice(&rest[..n], addr).is_err() {
            return 0;
        }
        rest = &rest[n..];
        written += n;
    }
    u32::try_from(written).unwrap_or(0)
}

fn write_event(mem: &Mem, chain: DescriptorChain<Mem>, ev: &Event) -> bool {
    let mut writable = Vec::new();
    let mut total = 0usize;
    let mut truncated = false;
    for desc in chain {
        truncated = desc.has_next();
        // Ignored like an empty descriptor of a control request (spec 14.1).
        if desc.len() == 0 {
            continue;
        }
        if !desc.is_write_only() {
            return false;
        }
        total = total.saturating_add(desc.len() as usize);
        writable.push((desc.addr(), desc.len() as usize));
    }
    if truncated || total < Event::SIZE || writable.iter().any(|&(a, l)| !mem.check_range(a, l)) {
        return false;
    }
    scatter(mem, &writable, &ev.to_bytes()) as usize == Event::SIZE
}

impl VhostUserBackend for RdmaDevice {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | self.device_features
    }

    fn acked_features(&self, features: u64) {
        self.shmem_acked.store(
            features & self.device_features & F_SHMEM_DOORBELL != 0,
            Ordering::Release,
        );
        self.lock().vm.set_features(features & self.device_features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let base = VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE;
        if self.shmem.is_some() {
            base | VhostUserProtocolFeatures::BACKEND_REQ | VhostUserProtocolFeatures::SHMEM
        } else {
            base
        }
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        if let Some(link) = &self.shmem {
            link.set_channel(Some(backend));
        }
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        match &self.shmem {
            Some(link) => Ok(link.shmem_config()),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no shared memory regions without F_SHMEM_DOORBELL",
            )),
        }
    }

    fn reset_device(&self) {
        debug!("VM {}: RESET_DEVICE", self.id);
        // The next start is a fresh one; whether the device runs meanwhile
        // is up to the queues (a VMM stops them before it resets).
        self.restart_lock().forget_history();
        self.reset_objects();
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        // vhost-user carries at most a page of configuration space.
        let size = size.min(4096);
        if start >= self.config.len() {
            return Vec::new();
        }
        let mut out: Vec<u8> = self.config[start..]
            .iter()
            .take(size as usize)
            .copied()
            .collect();
        out.resize(size as usize, 0);
        out
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap<()>>) -> io::Result<()> {
        let snapshot = mem.memory().into_inner();
        let ram = RamMap::from_guest_memory(&*snapshot);
        let host = Arc::new(HostMem::new(snapshot));
        let mut st = self.lock();
        st.vm.set_ram(ram);
        st.mem = Some(mem);
        st.host = Some(host);
        self.bump_dp_gen();
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(p) => p,
            Err(e) => {
                warn!("{}", DeviceError::ExitEvent(e));
                return None;
            }
        };
        let keep = notifier.try_clone().ok()?;
        self.exit_notifiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(keep);
        self.exit_consumers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        // vhost-user-backend ends the worker thread on an error, and with
        // it the service of every queue of the VM until the VMM reconnects:
        // report, and keep serving.
        if let Err(e) = self.serve_event(device_event, evset, vrings) {
            warn!("VM {}: event {device_event}: {e}", self.id);
        }
        Ok(())
    }
}

impl RdmaDevice {
    fn restart_lock(&self) -> MutexGuard<'_, RestartTracker> {
        self.restart.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device reset (spec 15.1), however it was recognised: every
    /// object goes, the RC QPs of other VMs connected to it fail, and the
    /// doorbell region is mapped again at the next start (the VMM dropped
    /// the mapping).
    fn reset_objects(&self) {
        if let Some(link) = &self.shmem {
            link.forget();
        }
        let mut st = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let before = st.vm.res.counts();
        let gone = st.vm.reset();
        // A VMM resets the device at every driver probe too: an empty
        // device's reset is not news.
        let level = if before.is_empty() {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        log::log!(
            level,
            "VM {}: device reset: released {} QPs, {} MRs ({} bytes), {} CQs, {} contexts",
            self.id,
            before.qp,
            before.mr,
            before.registered_bytes,
            before.cq,
            before.ctx
        );
        // Spec 15.1 item 6: nothing of before the reset survives in it.
        // The driver resets only after every guest mapping of the pages is
        // gone, so the pages of earlier connections are free again.
        if let Some(pages) = st.vm.res.doorbells.as_mut() {
            let n = pages.end_quarantine();
            if n > 0 {
                log::info!(
                    "VM {}: device reset: {n} doorbell pages of earlier connections usable again",
                    self.id
                );
            }
        }
        if let Some(link) = &self.shmem {
            link.clear_region();
        }
        let gid = st.vm.port_gid();
        st.vm.events.push(EventKind::PORT_ACTIVE, PORT_NUM, 0);
        self.bump_dp_gen();
        drop(st);
        self.engine.peers_gone(self.id, gid, gone);
    }

    /// Marks the device started or stopped, under its lock: once this
    /// returns, no engine pass that saw it running is still working on it.
    fn set_running(&self, on: bool) {
        let mut st = self.lock();
        self.cell.set_running(&mut st, on);
        if on {
            if let Some(host) = st.host.as_ref() {
                st.vm.refresh_doorbell_flags(host);
            }
        }
        self.bump_dp_gen();
    }

    /// One event of the vring worker (a queue kick, or [`EVENT_WAKE`]).
    fn serve_event(&self, device_event: u16, evset: EventSet, vrings: &[Vring]) -> io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        let Some(mem) = self.lock().mem.as_ref().map(|m| m.memory()) else {
            return Ok(());
        };
        let (Some(ctrlq), Some(eventq)) = (
            vrings.get(usize::from(CONTROLQ)),
            vrings.get(usize::from(EVENTQ)),
        ) else {
            return Ok(());
        };
        match device_event {
            CONTROLQ => self.process_controlq(ctrlq, eventq, &mem)?,
            // New event buffers: delivery below.
            EVENTQ => {}
            // A doorbell kick: wake the engine.
            NOTIFYQ => {
                if let Some(t) = self.traffic() {
                    TrafficCounters::add(&t.notifications, 1);
                }
                self.engine.wake();
                return Ok(());
            }
            // The engine queued events.
            EVENT_WAKE => {
                let _ = self.cell.event_wake_fd().read();
            }
            other => return Err(DeviceError::UnknownQueue(other).into()),
        }
        self.deliver_events(eventq, &mem)
    }
}

impl QueueObserver for RdmaDevice {
    fn queue_started(&self, index: usize, base: u16) {
        let verdict = self.restart_lock().started(index, base);
        match verdict {
            None => return,
            Some(Verdict::Reset) => {
                log::info!(
                    "VM {}: the device restarted without RESET_DEVICE from a fresh \
                     queue: reset",
                    self.id
                );
                self.reset_objects();
            }
            Some(Verdict::Resume) => debug!("VM {}: resumed", self.id),
            Some(Verdict::Fresh) => {}
        }
        self.set_running(true);
        self.engine.wake();
    }

    fn queue_stopped(&self, index: usize, base: u16) {
        let running = {
            let mut t = self.restart_lock();
            t.stopped(index, base);
            t.running()
        };
        if !running && self.running() {
            debug!("VM {}: stopped", self.id);
            self.set_running(false);
        }
    }
}
