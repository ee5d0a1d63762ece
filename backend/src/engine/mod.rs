//! The data-path engine of the software RNIC.
//!
//! An engine thread serves the QPs of the VMs placed on it: the VMs of
//! some tenants ([`group`]: one thread by default, more with
//! `engine_threads`; a tenant's VMs always share one). It polls
//! the producer indices in the VMs' doorbell records while there is work
//! (adaptive polling), and when it has been idle for a while it parks: it
//! sets `DB_FLAG_KICK` in every doorbell record, re-checks once, and sleeps
//! until a driver notifies the notification queue or the control path
//! changes something (spec chapter 18). While it has been busy for a while
//! it sets `DB_FLAG_POLLING` instead, so that drivers publish without a
//! fence; before parking it then clears that flag and waits for a
//! system-wide barrier ([`barrier`]) before it asks for kicks.
//!
//! Requester, responder and completer are separate modules ([`exec`],
//! [`completer`]); [`wqe`] copies work requests out of guest rings.
//!
//! Polling: the engine keeps, per VM, a compact list of the host addresses
//! of the QPs' doorbell records with the last producer indices it acted on
//! ([`DbList`]). A sweep reads those without taking any lock and locks a VM
//! only when one of its QPs shows work, so idle QPs cost a load each. The
//! list is rebuilt whenever the VM's data-path generation changes (any
//! control command, memory update, reset or disconnect), but a VM whose
//! rebuild is expensive (thousands of QPs) is rebuilt at most so often
//! that rebuilding takes a tenth of the time ([`REBUILD_FREE`]): a VM
//! creating QPs one command after another would otherwise cost a rebuild
//! of all its QPs per command, under its lock. A stale list is safe: it
//! keeps the mappings it points into alive, and the engine looks every QP
//! up afresh in the VM's tables before it acts; a QP it does not list yet
//! is found at the next rebuild or by the parking re-check. Parking does not
//! rely on the list: it sets `DB_FLAG_KICK` and re-checks through the VM's
//! authoritative tables under its lock (spec section 18.6).
//!
//! Large messages: while another VM had work in a recent sweep, an RC
//! message from or into memory regions (WRITE, SEND, READ) larger than what
//! is left of a burst is executed in pieces of at least [`PIECE`] bytes, so
//! other VMs' work runs between them; the requester QP keeps the partly
//! executed head WQE in `rt.partial`, a receiving QP the receive WQE it took
//! in `rt.inbound`, and both complete after the last piece
//! (docs/isolation.md, "Large messages in pieces").
//!
//! Locking: the engine locks a VM's device state while it works on that
//! VM, and the peer VM's state inside that for VM-to-VM operations (once
//! per burst of an RC QP). Control threads only ever hold their own VM's
//! lock, and the peer is always served by the same engine thread (only a
//! VM of the same tenant is reached, and a tenant's VMs share an engine;
//! `deliver` refuses any other route), so the nesting cannot deadlock.

pub mod barrier;
pub mod completer;
pub mod doorbell;
pub mod exec;
pub mod group;
pub mod sched;
pub mod wqe;

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, warn};
use virtio_rdma_abi::datapath::{
    Cqe, CtxDoorbell, QpDoorbell, WcOpcode, WcStatus, WrOpcode, DB_FLAG_KICK, DB_FLAG_POLLING,
    WQE_FENCE, WQE_SIGNALED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::DB_RECORD_SIZE;
use virtio_rdma_abi::qp::{QpState, QpType, QP_FLAG_SIG_ALL};
use vmm_sys_util::eventfd::EventFd;

use crate::ctrl::Ctrl;
use crate::device::{Locked, RdmaDevice, Shared};
use crate::memory::access::Segment;
use crate::memory::HostMem;
use crate::qos::DEFAULT_WEIGHT;
use crate::resources::{Qp, SendPartial, SendWait};
use crate::rnic::Rnic;
use crate::shmem::DoorbellRegion;
use crate::stats::TrafficCounters;
use crate::tenancy::IsolationCounters;
use doorbell::load_pi;
use exec::{check_local, local_range, respond, wc_opcode, Request, RespOutcome, RespScratch};
use sched::{cost_of, Drr, Limits, Turn};
use wqe::{fetch_send, SendWr, WqeBuf, WqeError};

/// How long the engine keeps polling after its last piece of work.
pub const POLL_WINDOW: Duration = Duration::from_micros(200);
/// For this long after its last piece of work the engine spins without
/// yielding its CPU (a `sched_yield` costs more than a whole work request).
const SPIN_WINDOW: Duration = Duration::from_micros(20);
/// Longest sleep while parked. Retry timers (spec 18.20) shorten the
/// sleep to their deadline, so parking never delays them.
const MAX_PARK: Duration = Duration::from_millis(50);
/// After this long awake with work the engine sets `DB_FLAG_POLLING`: a
/// stream of work, not one request after a sleep. Short bursts do not pay
/// for the barrier the flag costs at the next park.
const PROMOTE_AFTER: Duration = Duration::from_millis(1);
/// Interval of the transport retries of an RC QP with `timeout` 0, which
/// retries without limit at an interval the device chooses (spec 18.20).
const ENDLESS_RETRY_INTERVAL: Duration = Duration::from_millis(10);
/// A polling-list rebuild that took at most this long is not rate-limited
/// (a VM with up to some hundreds of QPs): changes show at the next sweep.
const REBUILD_FREE: Duration = Duration::from_micros(20);
/// After a longer rebuild, the next one waits this many times as long, so
/// rebuilding takes at most a tenth of the engine's time (and of the VM's
/// lock) however fast the VM's control commands come.
const REBUILD_SPACING: u32 = 9;
/// `remote_qkey` bit 31: the message carries the sending QP's own Q_Key
/// instead (spec 18.8, 18.11.5).
const QKEY_USE_OWN: u32 = 1 << 31;
/// The smallest piece of a plain RDMA WRITE executed in pieces (see
/// [`Scratch::split`]): another VM's work waits at most about one piece.
/// Chosen by measurement (`qos_bench lat`, see docs/isolation.md).
pub const PIECE: u64 = 8 << 10;
/// A VM's large messages are executed in pieces of its burst while another
/// VM had work in one of the last this many sweeps. While pieces run, a
/// sweep takes about a piece; an engine left with one VM returns to pieces
/// of [`ALONE_PIECE`] after this many sweeps.
const RECENT_SWEEPS: u64 = 256;
/// The piece of a VM that had the engine to itself lately: large, so that
/// the per-piece checks cost nothing measurable, yet bounded — a guest
/// must not be able to wait until the others pause for a moment and then
/// occupy the engine with a whole 2 GiB message.
pub const ALONE_PIECE: u64 = 256 << 10;

/// The VMs of the daemon, shared by its engine threads, and which thread
/// serves each.
pub struct Registry {
    vms: Mutex<Vec<Weak<RdmaDevice>>>,
    /// Bumped on every registration, so the threads refresh their lists.
    generation: AtomicUsize,
    /// The engine thread of each VM, by VM id.
    placement: Vec<usize>,
}

impl Registry {
    /// A registry of VMs placed on engine threads by `placement` (VM id →
    /// thread index).
    pub fn new(placement: Vec<usize>) -> Self {
        Registry {
            vms: Mutex::new(Vec::new()),
            generation: AtomicUsize::new(0),
            placement,
        }
    }

    /// The engine thread serving VM `vm`.
    pub fn engine_of(&self, vm: usize) -> Option<usize> {
        self.placement.get(vm).copied()
    }

    /// Adds a VM; its id is its index.
    pub fn register(&self, id: usize, vm: &Arc<RdmaDevice>) {
        let mut vms = self.vms.lock().unwrap_or_else(|p| p.into_inner());
        if vms.len() <= id {
            vms.resize(id.saturating_add(1), Weak::new());
        }
        if let Some(slot) = vms.get_mut(id) {
            *slot = Arc::downgrade(vm);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The live VMs, indexed by id.
    fn all_vms(&self) -> Vec<Option<Arc<RdmaDevice>>> {
        self.vms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(Weak::upgrade)
            .collect()
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
    /// new queues and pages the same (`Ctrl::new_doorbell_flags`).
    db_flags: Arc<AtomicU32>,
    counters: EngineCounters,
    rnic: Arc<dyn Rnic>,
    wake: EventFd,
    stop: AtomicBool,
    /// Held by a test (`Engines::hold`): the thread does nothing until it
    /// is released; `held` acknowledges that it has stopped working.
    hold: AtomicBool,
    held: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Tenancy (who may reach whom) and QoS settings.
    shared: Shared,
    /// Whether to set `DB_FLAG_POLLING` while polling (spec 18.6).
    fence_elision: bool,
}

/// One QP in a [`DbList`].
struct DbEntry {
    /// Host address of the QP's doorbell record (`sq_pi`, then `rq_pi`).
    db: *const AtomicU32,
    /// The QP's handle.
    handle: u32,
    /// `sq_pi` up to which the engine has acted.
    seen_sq: u32,
    /// `rq_pi` up to which the engine has acted (when `watch_rq`).
    seen_rq: u32,
    /// The QP's state makes `rq_pi` matter (RESET and ERR, own RQ).
    watch_rq: bool,
    /// A QP in ERR owes the completion of a message it was receiving in
    /// pieces: work, whatever the indices say.
    owed: bool,
    /// The QP's head WQE waits for a retry until then: no work before.
    due: Option<Instant>,
}

/// The engine's polling list of one VM (see the module documentation).
struct DbList {
    dev: Arc<RdmaDevice>,
    /// The VM's data-path generation the list was built for.
    gen: Option<u64>,
    /// Keeps the memory behind the `db` pointers mapped (records in guest
    /// RAM, slots in the doorbell region).
    host: Option<Arc<HostMem>>,
    region: Option<Arc<DoorbellRegion>>,
    /// No rebuild before this (see the module documentation).
    rebuild_after: Option<Instant>,
    qps: Vec<DbEntry>,
    /// Indices into `qps` that showed work in the last scan.
    work: Vec<usize>,
    /// Index into `work` of the next QP to serve: a pass that ends early
    /// (the VM's deficit ran out) leaves the rest for the next one, and the
    /// doorbells are read again only when `work` is used up (a read costs
    /// a load per QP: with thousands of QPs, rescanning after every short
    /// pass would cost more than the work).
    next: usize,
}

impl DbList {
    /// Whether QPs of the last scan are still waiting for their burst.
    fn pending(&self) -> bool {
        self.next < self.work.len()
    }

    fn new(dev: Arc<RdmaDevice>) -> Self {
        DbList {
            dev,
            gen: None,
            host: None,
            region: None,
            rebuild_after: None,
            qps: Vec::new(),
            work: Vec::new(),
            next: 0,
        }
    }

    /// Rebuilds the list if the VM changed, unless the last rebuild was
    /// expensive and recent (then `scratch` gets a timer for it).
    fn refresh_if_changed(&mut self, scratch: &mut Scratch) {
        if self.gen == Some(self.dev.dp_generation()) {
            return;
        }
        let now = Instant::now();
        if let Some(at) = self.rebuild_after.filter(|&at| now < at) {
            scratch.timer(at);
            return;
        }
        if !self.rebuild() {
            scratch.contended = true;
            return;
        }
        let took = now.elapsed();
        self.rebuild_after = (took > REBUILD_FREE)
            .then(|| now.checked_add(took.saturating_mul(REBUILD_SPACING)))
            .flatten();
    }

    /// Rebuilds the list from the VM's tables (under its lock); false if
    /// the lock was busy (the list stays as it was).
    fn rebuild(&mut self) -> bool {
        // Indices into the old `qps` mean nothing now.
        self.work.clear();
        self.next = 0;
        let dev = self.dev.clone();
        let built = dev.try_with_dataplane(|ctrl, host| {
            let gen = dev.dp_generation();
            self.qps.clear();
            self.region = ctrl.res.doorbells.as_ref().map(|d| d.region().clone());
            for (handle, qp) in ctrl.res.qps.iter() {
                // A slot has the layout of a record's driver half: `sq_pi`,
                // then `rq_pi` (spec 18.7).
                let db = match &qp.db_slot {
                    Some(slot) => {
                        let p = slot.pi_ptr();
                        if p.is_null() {
                            continue;
                        }
                        p
                    }
                    None => {
                        if qp.db_gpa % DB_RECORD_SIZE != 0 {
                            continue;
                        }
                        let Some(db) = host.ptr(qp.db_gpa, DB_RECORD_SIZE) else {
                            continue;
                        };
                        db.cast_const().cast()
                    }
                };
                // Whatever was posted beyond what the engine has acted on
                // shows up as work in the next scan.
                let watch_rq = qp.srq == 0 && matches!(qp.state, QpState::RESET | QpState::ERR);
                self.qps.push(DbEntry {
                    db,
                    handle,
                    seen_sq: qp.rt.sq_ci,
                    seen_rq: if watch_rq { qp.rt.rq_ci } else { 0 },
                    watch_rq,
                    owed: owes_flush(qp),
                    due: None,
                });
            }
            (gen, host.clone())
        });
        match built {
            Locked::Ran((gen, host)) => {
                self.gen = Some(gen);
                self.host = Some(host);
            }
            // The control path holds the lock: the next sweep rebuilds.
            Locked::Busy => return false,
            Locked::Gone => {
                // No memory: nothing to poll until the next generation.
                self.qps.clear();
                self.host = None;
                self.gen = Some(self.dev.dp_generation());
            }
        }
        true
    }

    /// Reads every doorbell and collects the QPs with something to do.
    fn scan(&mut self) -> bool {
        self.work.clear();
        self.next = 0;
        // A stopped device's work waits for its start (spec 15.1), which
        // changes the VM's generation and so rebuilds this list.
        if self.host.is_none() || !self.dev.running() {
            return false;
        }
        // Read once, and only if a QP waits for a retry.
        let mut now = None;
        for (i, e) in self.qps.iter_mut().enumerate() {
            // A QP whose head WQE waits for a retry is not work before its
            // time, whatever its indices say: a guest with thousands of
            // QPs retrying without end must not make every sweep visit them.
            if let Some(at) = e.due {
                if *now.get_or_insert_with(Instant::now) < at {
                    continue;
                }
                e.due = None;
                self.work.push(i);
                continue;
            }
            // SAFETY: `e.db` is either the host address of a 64-byte,
            // 64-byte aligned doorbell record inside a RAM region of the
            // mapping `self.host` keeps alive (checked by `HostMem::ptr`
            // when the list was built), or of an 8-byte slot inside the
            // doorbell region `self.region` keeps alive; in both cases the
            // 4-byte atomics at offsets 0 and 4 are valid and aligned. The
            // guest writes them concurrently; they are only ever accessed
            // atomically by the device.
            let (sq, rq) = unsafe {
                let sq = (*e.db).load(Ordering::Acquire);
                let rq = if e.watch_rq {
                    (*e.db.add(1)).load(Ordering::Acquire)
                } else {
                    e.seen_rq
                };
                (u32::from_le(sq), u32::from_le(rq))
            };
            if sq != e.seen_sq || rq != e.seen_rq || e.owed {
                self.work.push(i);
            }
        }
        !self.work.is_empty()
    }
}

/// Reusable memory of the engine thread (no allocation per work request).
struct Scratch {
    wqe: Box<WqeBuf>,
    local: Vec<Segment>,
    resp: RespScratch,
    handles: Vec<u32>,
    /// The earliest end of a send WQE's retry wait or of a rate limit's
    /// hold seen since it was last cleared (the parking re-check clears it
    /// and visits every QP).
    next_timer: Option<Instant>,
    /// Rate limits (token buckets) of every VM and tenant.
    limits: Limits,
    /// Payload bytes the last executed WQE moved (0 if it failed).
    moved: u64,
    /// Work requests and bytes the current burst executed.
    executed: (u32, u64),
    /// Large plain RDMA WRITEs of the VM being served are executed in
    /// pieces, so that other VMs' work runs between them: another VM had
    /// work in a recent sweep. Alone, a VM runs its WRITEs whole.
    split: bool,
    /// The most bytes the next execution of a plain RDMA WRITE may move
    /// (`u64::MAX`: whole), set by the burst.
    piece: u64,
    /// A VM's lock was busy since this was last cleared, so there may be
    /// work the engine could not look at: it must not park on it.
    contended: bool,
    /// Sweeps so far, and the last two VMs (list positions) that had work
    /// with the sweep they last had it in, most recent first.
    sweeps: u64,
    recent: [(usize, u64); 2],
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            wqe: WqeBuf::new(),
            local: Vec::with_capacity(64),
            resp: RespScratch::new(),
            handles: Vec::new(),
            next_timer: None,
            limits: Limits::default(),
            moved: 0,
            executed: (0, 0),
            split: false,
            piece: u64::MAX,
            contended: false,
            sweeps: 0,
            recent: [(usize::MAX, 0); 2],
        }
    }

    /// VM `vm` (a list position) has work in the current sweep.
    fn note_active(&mut self, vm: usize) {
        let now = (vm, self.sweeps);
        match self.recent {
            [(v, _), _] if v == vm => self.recent[0] = now,
            [first, _] => self.recent = [now, first],
        }
    }

    /// Whether a VM other than `vm` had work in one of the last
    /// [`RECENT_SWEEPS`] sweeps.
    fn others_active(&self, vm: usize) -> bool {
        let [a, b] = self.recent;
        let (v, at) = if a.0 != vm { a } else { b };
        v != usize::MAX && self.sweeps.wrapping_sub(at) <= RECENT_SWEEPS
    }

    /// Notes a retry deadline.
    fn timer(&mut self, at: Instant) {
        self.next_timer = Some(self.next_timer.map_or(at, |t| t.min(at)));
    }
}

/// The other VM of an RC QP's burst, locked once for the whole burst.
struct Held<'p> {
    vm: usize,
    dev: &'p RdmaDevice,
    ctrl: &'p mut Ctrl,
    mem: &'p HostMem,
}

impl Engine {
    /// Starts engine thread `index` for the VMs `registry` places on it,
    /// pinned to `cpu` if given.
    pub fn start(
        index: usize,
        registry: Arc<Registry>,
        rnic: Arc<dyn Rnic>,
        shared: Shared,
        cpu: Option<usize>,
        fence_elision: bool,
    ) -> std::io::Result<Arc<Engine>> {
        let engine = Arc::new(Engine {
            index,
            registry,
            qos_applied: AtomicU64::new(0),
            db_flags: Arc::new(AtomicU32::new(0)),
            counters: EngineCounters::default(),
            rnic,
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            held: AtomicBool::new(false),
            thread: Mutex::new(None),
            shared,
            fence_elision,
        });
        let e = engine.clone();
        let t = thread::Builder::new()
            .name(format!("rnic-engine{index}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to(cpu);
                }
                e.run()
            })?;
        *engine.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(engine)
    }

    /// Tenancy and QoS state the engine enforces.
    pub fn shared(&self) -> &Shared {
        &self.shared
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

    /// Writes `flags` (0, `DB_FLAG_POLLING` or `DB_FLAG_KICK`) into every
    /// doorbell of the VMs of `lists`; false if a VM's lock was busy, so
    /// its doorbells may keep the old value. The shared value changes
    /// first: a queue created under a VM's lock either sees it, or is
    /// covered by the loop (which takes that lock after).
    fn publish_flags(&self, lists: &[DbList], flags: u32) -> bool {
        self.db_flags.store(flags, Ordering::SeqCst);
        set_flags(lists, flags)
    }

    /// Whether this thread serves VM `vm`.
    fn serves(&self, vm: usize) -> bool {
        self.registry.engine_of(vm) == Some(self.index)
    }

    /// The RC QPs `qpns` of VM `vm` (port GID `gid`) are gone with their
    /// VM's connection or reset: every RC QP of another VM connected to
    /// one of them moves to `ERR` with `QP_FATAL`, and the engine flushes
    /// its work (spec 18.23), rather than letting it retry into nothing.
    /// Takes one VM's lock at a time (the caller holds none).
    pub fn peers_gone(&self, vm: usize, gid: [u8; 16], mut qpns: Vec<u32>) {
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
                failed = failed.saturating_add(dev.fail_peers_of(gid, &qpns));
            }
        }
        if failed > 0 {
            log::info!("VM {vm} went away: {failed} connected QPs of other VMs failed");
            self.wake();
        }
    }

    /// The newest QoS generation whose settings this thread enforces: a
    /// change made at generation `g` is in force once this is at least
    /// `g` ([`group::Engines::sync_qos`]).
    pub fn qos_applied(&self) -> u64 {
        self.qos_applied.load(Ordering::Acquire)
    }

    /// Wakes the engine (a doorbell kick, or a control-path change).
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
            thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stops the engine thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }

    fn run(&self) {
        let mut last_work = Instant::now();
        let mut idle_sweeps = 0u64;
        let mut seen = usize::MAX;
        let mut vms: Vec<Option<Arc<RdmaDevice>>> = Vec::new();
        let mut lists: Vec<DbList> = Vec::new();
        let mut scratch = Scratch::new();
        let mut drr = Drr::default();
        // The QoS generation and VM list the weights in `drr` are from.
        let mut weights_seen = None;
        let mut active = Vec::new();
        // Just back from parking, no work found since.
        let mut woke = false;
        // Since when the thread has been awake (for `PROMOTE_AFTER`).
        let mut awake_since = Instant::now();
        let barrier = if self.fence_elision {
            barrier::SystemBarrier::get()
        } else {
            None
        };
        let mut polling = Polling::Off;
        while !self.stop.load(Ordering::Acquire) {
            if self.hold.load(Ordering::Acquire) {
                self.held.store(true, Ordering::Release);
                thread::sleep(Duration::from_micros(200));
                continue;
            }
            self.held.store(false, Ordering::Release);
            let generation = self.registry.generation.load(Ordering::Acquire);
            if generation != seen {
                // Every VM (peers are looked up by id), but the polling
                // lists only of the VMs this thread serves.
                vms = self.registry.all_vms();
                lists = vms
                    .iter()
                    .flatten()
                    .filter(|d| self.serves(d.id()))
                    .cloned()
                    .map(DbList::new)
                    .collect();
                seen = generation;
            }
            // QoS changes apply at the next sweep (one atomic load each).
            let qos = &self.shared.qos;
            let qos_gen = qos.generation();
            scratch.limits.refresh(qos, &self.shared.tenancy);
            if weights_seen != Some((qos_gen, seen)) {
                weights_seen = Some((qos_gen, seen));
                drr = Drr::default();
                drr.resize(lists.len());
                for (k, list) in lists.iter().enumerate() {
                    let id = list.dev.id();
                    let w = qos.vm(id).map_or(DEFAULT_WEIGHT, |s| s.weight);
                    drr.set_weight(k, w);
                    if let Some(t) = self.shared.tenancy.tenant_of(id) {
                        let tw = qos.tenant(t).map_or(DEFAULT_WEIGHT, |s| s.weight);
                        drr.set_group(k, t, tw);
                    }
                }
                // Both were read after `qos_gen` was: everything up to it
                // is now enforced.
                self.qos_applied.store(qos_gen, Ordering::Release);
            }
            if self.sweep(&vms, &mut lists, &mut scratch, &mut drr, &mut active) {
                idle_sweeps = 0;
                woke = false;
                // Not while a drain is pending: work that comes and goes
                // faster than a barrier would otherwise keep the engine
                // from ever parking. A finished drain leaves every flag
                // clear.
                if let (Polling::Draining(t), Some(b)) = (polling, barrier) {
                    if b.passed(t) {
                        polling = Polling::Off;
                    }
                }
                if polling == Polling::Off
                    && barrier.is_some()
                    && awake_since.elapsed() >= PROMOTE_AFTER
                {
                    self.publish_flags(&lists, DB_FLAG_POLLING);
                    polling = Polling::On;
                }
                continue;
            }
            // Polling pays off after work, when more tends to follow. A wake
            // that found none (a control command, a QoS change, a timer)
            // parks again at once: spinning then would only take the CPU
            // from the control workers, O(QPs) per sweep.
            if !std::mem::take(&mut woke) {
                if idle_sweeps == 0 {
                    last_work = Instant::now();
                }
                // Only looked at modulo 32 (and 0 restarts the idle
                // clock): wrapping after 2^64 sweeps is harmless.
                idle_sweeps = idle_sweeps.wrapping_add(1);
                // Reading the clock costs as much as a sweep of a few QPs:
                // only every so often while spinning.
                if idle_sweeps % 32 != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let idle = last_work.elapsed();
                if idle < SPIN_WINDOW {
                    continue;
                }
                if idle < POLL_WINDOW {
                    thread::yield_now();
                    continue;
                }
            }
            // Drivers that saw DB_FLAG_POLLING did not fence: clear it, and
            // poll on until a system-wide barrier has made their stores
            // visible (spec 18.6).
            match (polling, barrier) {
                (Polling::On, Some(b)) => {
                    if self.publish_flags(&lists, 0) {
                        polling = Polling::Draining(b.request());
                    }
                    thread::yield_now();
                    continue;
                }
                (Polling::Draining(ticket), Some(b)) if !b.passed(ticket) => {
                    thread::yield_now();
                    continue;
                }
                _ => polling = Polling::Off,
            }
            // Park: ask for kicks, then look once more — through the VMs'
            // own tables, not the polling lists — so that a doorbell rung
            // before the flag became visible is not missed.
            let armed = self.publish_flags(&lists, DB_FLAG_KICK);
            fence(Ordering::SeqCst);
            scratch.contended = false;
            let found = self.sweep_all(&vms, &lists, &mut scratch);
            if found || !armed || std::mem::take(&mut scratch.contended) {
                // Work, or a VM whose lock was busy (its records may lack
                // the flag, and the re-check skipped it): poll on.
                self.publish_flags(&lists, 0);
                idle_sweeps = 0;
                if !found {
                    thread::yield_now();
                }
                continue;
            }
            TrafficCounters::add_single_writer(&self.counters.parks, 1);
            self.park(scratch.next_timer);
            self.publish_flags(&lists, 0);
            idle_sweeps = 0;
            woke = true;
            awake_since = Instant::now();
        }
    }

    /// Sleeps until woken, [`MAX_PARK`] passes, or `timer` (the earliest
    /// retry deadline) arrives.
    fn park(&self, timer: Option<Instant>) {
        let mut sleep = MAX_PARK;
        if let Some(at) = timer {
            sleep = sleep.min(at.saturating_duration_since(Instant::now()));
        }
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&self.wake),
            events: libc::POLLIN,
            revents: 0,
        };
        // Nanosecond resolution: retry waits can be a few microseconds.
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(sleep.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(sleep.subsec_nanos()),
        };
        // SAFETY: `pfd` and `ts` are valid for the duration of the call, the
        // count is 1 and a null signal mask leaves the mask unchanged.
        let _ = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        let _ = self.wake.read();
    }
}

/// Pins the calling thread to `cpu` (logs and carries on if it cannot).
fn pin_to(cpu: usize) {
    // SAFETY: `cpu_set_t` is plain data for which all-zero is a valid
    // (empty) set; CPU_SET writes inside it (it ignores indices past its
    // size) and sched_setaffinity only reads `size_of` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        warn!(
            "cannot pin the engine to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    } else {
        log::info!("engine pinned to CPU {cpu}");
    }
}

/// Runs `f` on a VM's objects and memory under its lock and hands the
/// events it queued to the VM's event worker; returns what `f` returned
/// (false while no VMM is connected).
///
/// The lock is only tried: while the VM's control path holds it, `f` does
/// not run (false), and the VM's work waits for the next sweep rather
/// than every VM of the thread waiting for its command.
/// `None` if the lock was busy.
fn work_on(dev: &RdmaDevice, f: impl FnOnce(&mut Ctrl, &HostMem) -> bool) -> Option<bool> {
    let ran = dev.try_with_dataplane(|ctrl, mem| {
        let before = ctrl.events.len();
        let did = f(ctrl, mem);
        (did, ctrl.events.len() != before)
    });
    let (did, events) = match ran {
        Locked::Ran(r) => r,
        Locked::Busy => return None,
        Locked::Gone => return Some(false),
    };
    if events {
        dev.wake_events();
    }
    Some(did)
}

/// Whether the thread's doorbells may carry `DB_FLAG_POLLING`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polling {
    /// None does: drivers fence.
    Off,
    /// They may: drivers that saw it did not fence.
    On,
    /// Cleared everywhere; the barrier with this ticket makes the stores
    /// of drivers that saw it before visible.
    Draining(u64),
}

/// Writes `v` into `flags` of the doorbell header of every context: in
/// guest RAM, or its doorbell page's header (spec 18.4, 18.6).
///
/// Returns false if a VM's lock was busy, so its headers may keep the old
/// value: the engine must not park then (it would sleep through that VM's
/// posts), nor count on a cleared `DB_FLAG_POLLING`.
///
/// A stopped VM is left alone: nothing is written into its memory while
/// it is stopped (spec 15.1). Its start writes the flags of the moment
/// into its headers ([`crate::ctrl::Ctrl::refresh_doorbell_flags`]) and
/// wakes the engine, which then looks at all of its queues.
fn set_flags(lists: &[DbList], v: u32) -> bool {
    let mut all = true;
    for list in lists {
        let ran = list.dev.try_with_dataplane(|ctrl, mem| {
            if !ctrl.running() {
                return;
            }
            for (_, ctx) in ctrl.res.ctxs.iter() {
                if ctx.db_page.is_none() {
                    let _ = doorbell::store(mem, ctx.db_gpa, CtxDoorbell::FLAGS, v);
                }
            }
            if let Some(pages) = &ctrl.res.doorbells {
                pages.set_flags_all(v);
            }
        });
        all &= ran != Locked::Busy;
    }
    all
}

impl Engine {
    /// One sweep: reads every VM's doorbells, then serves the VMs with
    /// work in one round of deficit round robin (a VM that a rate limit
    /// holds back is skipped without being locked until its tokens are
    /// due); true if any work was done.
    fn sweep(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        lists: &mut [DbList],
        scratch: &mut Scratch,
        drr: &mut Drr,
        active: &mut Vec<usize>,
    ) -> bool {
        active.clear();
        scratch.sweeps = scratch.sweeps.wrapping_add(1);
        // The clock is read only when some VM is held back.
        let mut now = None;
        for (k, list) in lists.iter_mut().enumerate() {
            list.refresh_if_changed(scratch);
            if !list.pending() && !list.scan() {
                drr.idle(k);
                continue;
            }
            if let Some(until) = scratch.limits.blocked_until(list.dev.id()) {
                if *now.get_or_insert_with(Instant::now) < until {
                    scratch.timer(until);
                    continue;
                }
            }
            active.push(k);
            scratch.note_active(k);
        }
        drr.round(active, |drr, turn| {
            let Some(list) = lists.get_mut(turn.vm) else {
                return false;
            };
            // Later passes of a turn look at the doorbells again once the
            // last scan's QPs are served.
            if !turn.first && !list.pending() && !list.scan() {
                return false;
            }
            self.pass(vms, list, scratch, drr, turn)
        })
    }

    /// One pass over the QPs of a VM that showed work in the last scan, a
    /// burst each, starting where the last pass stopped. Each burst's cost
    /// ([`sched::cost_of`] its work requests and bytes) is charged to the
    /// VM's deficit; the pass ends when the deficit runs out.
    fn pass(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        list: &mut DbList,
        scratch: &mut Scratch,
        drr: &mut Drr,
        turn: Turn,
    ) -> bool {
        let dev = list.dev.clone();
        let vm_id = dev.id();
        let DbList {
            qps, work, next, ..
        } = list;
        scratch.split = scratch.others_active(turn.vm);
        let done = work_on(&dev, |ctrl, mem| {
            let mut did = false;
            if !ctrl.running() {
                // Stopped since the scan (checked under the lock).
                work.clear();
                *next = 0;
                return false;
            }
            while let Some(&i) = work.get(*next) {
                *next = next.saturating_add(1);
                let Some(e) = qps.get_mut(i) else {
                    continue;
                };
                scratch.executed = (0, 0);
                let busy = self.service_qp(vms, vm_id, ctrl, mem, e.handle, scratch);
                did |= busy;
                refresh(e, ctrl, mem);
                // Work that executed no WQE (a flush, a failed QP) still
                // costs one work request, so every turn ends.
                let (wqes, bytes) = scratch.executed;
                let wqes = if busy { u64::from(wqes.max(1)) } else { 0 };
                if !drr.charge(turn.vm, cost_of(wqes, bytes)) {
                    break;
                }
            }
            did
        });
        done.unwrap_or_else(|| {
            scratch.contended = true;
            false
        })
    }

    /// One pass over every QP of every VM through the VMs' tables (the
    /// re-check of the parking protocol); true if any work was done.
    /// Also finds the earliest retry deadline ([`Scratch::next_timer`]).
    fn sweep_all(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        lists: &[DbList],
        scratch: &mut Scratch,
    ) -> bool {
        scratch.next_timer = None;
        let mut busy = false;
        // The VMs of the polling lists, by their position there, so a WRITE
        // posted just before the engine parks is split as in a sweep.
        for (k, list) in lists.iter().enumerate() {
            let vm = &list.dev;
            scratch.split = scratch.others_active(k);
            let done = work_on(vm, |ctrl, mem| {
                if !ctrl.running() {
                    return false;
                }
                let mut handles = std::mem::take(&mut scratch.handles);
                ctrl.res.qps.fill_handles(&mut handles);
                let mut did = false;
                for &h in handles.iter() {
                    did |= self.service_qp(vms, vm.id(), ctrl, mem, h, scratch);
                }
                scratch.handles = handles;
                did
            });
            match done {
                Some(did) => busy |= did,
                None => scratch.contended = true,
            }
        }
        busy
    }

    /// Takes send work of one QP, or flushes it in the error state.
    fn service_qp(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        scratch: &mut Scratch,
    ) -> bool {
        let Some(qp) = ctrl.res.qps.get_mut(h) else {
            return false;
        };
        let Some(sq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::SQ) else {
            // The record left guest RAM (spec 18.18): a QP whose send
            // queue the device reads fails; in other states nothing reads
            // it (and in ERR nothing of the queue can be trusted).
            if matches!(qp.state, QpState::RTS | QpState::SQD) {
                fail(ctrl, h, Some(EventKind::QP_FATAL));
                return true;
            }
            return false;
        };
        match qp.state {
            QpState::RESET => {
                // Nothing posted in RESET is ever executed.
                let rq_pi = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ)
                    .unwrap_or(qp.rt.rq_ci);
                let changed = qp.rt.sq_ci != sq_pi || qp.rt.rq_ci != rq_pi;
                qp.rt.sq_ci = sq_pi;
                qp.rt.rq_ci = if qp.srq == 0 { rq_pi } else { qp.rt.rq_ci };
                qp.rt.wait = None;
                qp.rt.partial = None;
                if changed {
                    let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
                    let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::RQ_CI, qp.rt.rq_ci);
                }
                false
            }
            QpState::ERR => {
                // At most a burst's worth of WQEs per service, each charged
                // as a work request: a guest re-arms the flush for free by
                // bumping its producer index, without a control command.
                if scratch.limits.limited(vm_id) {
                    let traffic = self.shared.tenancy.traffic(vm_id);
                    if let Some(at) = scratch.limits.admit(vm_id, Instant::now(), traffic) {
                        scratch.timer(at);
                        return false;
                    }
                }
                let (max, _) = scratch.limits.grain(vm_id);
                let n = flush(ctrl, mem, h, sq_pi, &mut scratch.wqe, max);
                scratch.executed.0 = scratch.executed.0.saturating_add(n);
                scratch.limits.charge_ops(vm_id, u64::from(n));
                n > 0
            }
            // In SQD only the head WQE already started goes on (spec 13.3).
            QpState::RTS => self.run_sq(vms, vm_id, ctrl, mem, h, sq_pi, scratch),
            QpState::SQD if qp.rt.in_flight() => {
                let did = self.run_sq(vms, vm_id, ctrl, mem, h, sq_pi, scratch);
                drained(ctrl, h);
                did
            }
            _ => false,
        }
    }

    /// Where an RC QP's messages go: (VM, QP handle), from the QP's hint
    /// when it names the current destination QPN.
    fn rc_route(&self, ctrl: &mut Ctrl, h: u32) -> Option<(usize, u32)> {
        let qp = ctrl.res.qps.get_mut(h)?;
        let dest = qp.attr.dest_qpn;
        if let Some((qpn, vm, ph)) = qp.rt.peer {
            if qpn == dest {
                return Some((vm, ph));
            }
        }
        let (vm, ph) = self.rnic.lookup_qpn(dest)?;
        qp.rt.peer = Some((dest, vm, ph));
        Some((vm, ph))
    }

    /// Looks destination `dest_qpn` of QP `h` up afresh (its routing hint
    /// was stale); an RC QP (`hint`) keeps the result as its new hint.
    fn relookup(&self, ctrl: &mut Ctrl, h: u32, dest_qpn: u32, hint: bool) -> Option<(usize, u32)> {
        let route = self.rnic.lookup_qpn(dest_qpn);
        if let Some(q) = ctrl.res.qps.get_mut(h) {
            q.rt.peer = match route {
                Some((vm, ph)) if hint => Some((dest_qpn, vm, ph)),
                _ => None,
            };
        }
        route
    }

    /// What an RC message of QP `h` finds before anything of it is
    /// translated: `Some(outcome)` when it cannot be delivered — no QP
    /// with that number at that GID in reach, or a responder QP that
    /// takes no message in its state — else `None`, with `route` updated
    /// if the hint was stale. Only what is known without locking the
    /// peer is looked at: the same VM, or the VM held for the burst.
    #[allow(clippy::too_many_arguments)]
    fn precheck_rc(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        h: u32,
        route: &mut Option<(usize, u32)>,
        dgid: [u8; 16],
        held: Option<&Held<'_>>,
    ) -> Option<RespOutcome> {
        let dest_qpn = ctrl.res.qps.get(h).map(|q| q.attr.dest_qpn)?;
        for fresh in [false, true] {
            let (pvm, pqp) = match admit(vms, vm_id, ctrl, *route, dgid, false) {
                Ok(r) => r,
                Err(outcome) => return Some(outcome),
            };
            let verdict = if pvm == vm_id {
                responder_takes(ctrl, pqp, dest_qpn)
            } else {
                match held.filter(|p| p.vm == pvm) {
                    Some(p) => responder_takes(p.ctrl, pqp, dest_qpn),
                    None => None,
                }
            };
            match verdict {
                Some(RespOutcome::Stale) if !fresh => {
                    *route = self.relookup(ctrl, h, dest_qpn, true);
                }
                Some(RespOutcome::Stale) => return Some(RespOutcome::Unreachable),
                other => return other,
            }
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn run_sq(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
    ) -> bool {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return false;
        };
        if qp.rt.sq_ci == sq_pi {
            return false;
        }
        // The head WQE waits for a retry: nothing to do (and no peer to
        // lock) before its timer ends; later WQEs wait behind it.
        if let Some(at) = waiting(qp) {
            scratch.timer(at);
            return false;
        }
        // An RC QP talks to one QP: lock its VM once for the burst (never
        // a VM of another tenant: `deliver` refuses that route untouched).
        if qp.qp_type == QpType::RC {
            let tenancy = &self.shared.tenancy;
            let route = self.rc_route(ctrl, h);
            if let Some((pvm, _)) = route.filter(|&(v, _)| {
                v != vm_id && tenancy.may_reach(vm_id, v) && same_thread(vms, vm_id, v)
            }) {
                if let Some(dev) = vms.get(pvm).and_then(Option::as_ref) {
                    let done = dev.try_with_dataplane(|pctrl, pmem| {
                        let mut held = Held {
                            vm: pvm,
                            dev,
                            ctrl: pctrl,
                            mem: pmem,
                        };
                        let did =
                            self.burst(vms, vm_id, ctrl, mem, h, sq_pi, scratch, Some(&mut held));
                        if !held.ctrl.events.is_empty() {
                            dev.wake_events();
                        }
                        did
                    });
                    match done {
                        Locked::Ran(did) => return did,
                        // The peer's control path holds its lock: this QP
                        // waits for the next sweep (its messages would only
                        // find the lock busy).
                        Locked::Busy => {
                            scratch.contended = true;
                            return false;
                        }
                        Locked::Gone => {}
                    }
                }
            }
        }
        self.burst(vms, vm_id, ctrl, mem, h, sq_pi, scratch, None)
    }

    /// Executes up to a burst ([`sched::grain_of`] the VM's weight) of
    /// send WQEs of QP `h`.
    #[allow(clippy::too_many_arguments)]
    fn burst(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch,
        mut held: Option<&mut Held<'_>>,
    ) -> bool {
        let mut did = false;
        let mut published = None;
        let traffic = self.shared.tenancy.traffic(vm_id);
        // Rate limits: one clock read per burst, and only for a VM that
        // (or whose tenant) has a limit.
        let now = scratch.limits.limited(vm_id).then(Instant::now);
        // The grain of the VM's service: how long other VMs may have to
        // wait behind this burst.
        let (max_wqes, max_bytes) = scratch.limits.grain(vm_id);
        let mut bytes = 0u64;
        let mut wqes = 0u32;
        // A piece of a WRITE executed in pieces counts towards the burst's
        // bytes, not its work requests: every piece moves at least `PIECE`
        // bytes, so the burst ends.
        while wqes < max_wqes {
            let Some(qp) = ctrl.res.qps.get(h) else {
                break;
            };
            let startable =
                qp.state == QpState::RTS || (qp.state == QpState::SQD && qp.rt.in_flight());
            if !startable || qp.rt.sq_ci == sq_pi {
                break;
            }
            if let Some(at) = waiting(qp) {
                scratch.timer(at);
                break;
            }
            if sq_pi.wrapping_sub(qp.rt.sq_ci) > qp.sq_depth {
                // The driver claims more WQEs than the ring holds.
                fail(ctrl, h, Some(EventKind::QP_FATAL));
                did = true;
                break;
            }
            if let Some(now) = now {
                if let Some(at) = scratch.limits.admit(vm_id, now, traffic) {
                    // Held back until the VM's and its tenant's buckets
                    // allow; the WQE stays at the head.
                    scratch.timer(at);
                    break;
                }
            }
            did = true;
            scratch.moved = 0;
            // Split: the piece takes what is left of the burst's bytes, and
            // at least `PIECE` (a message that fits runs whole). Alone, a
            // message still runs in pieces of `ALONE_PIECE`: whoever starts
            // work next waits for one piece, not for up to 2 GiB.
            scratch.piece = if scratch.split {
                max_bytes.saturating_sub(bytes).max(PIECE)
            } else {
                ALONE_PIECE.max(max_bytes)
            };
            let index = qp.rt.sq_ci;
            let outcome = match exhausted(qp) {
                // The last transport retry found the destination
                // unreachable, and its timeout has passed (spec 18.20).
                Some((wr_id, op)) => {
                    complete_send(ctrl, mem, h, index, wr_id, op, WcStatus::RETRY_EXC_ERR, 0)
                }
                None => self.execute(
                    vms,
                    vm_id,
                    ctrl,
                    mem,
                    h,
                    index,
                    scratch,
                    held.as_deref_mut(),
                ),
            };
            let Some(qp) = ctrl.res.qps.get_mut(h) else {
                break;
            };
            match outcome {
                Step::Wait(w) => {
                    // Each try (an RNR or a transport retry) is work the
                    // guest caused: a work request to its rate limits, as
                    // to its share (the pass charges the service).
                    scratch.timer(w.at);
                    qp.rt.wait = Some(w);
                    scratch.limits.charge_ops(vm_id, 1);
                    break;
                }
                Step::Piece => {
                    // The WQE stays at the head; its completion comes with
                    // its last piece. The piece is charged its bytes.
                    let moved = std::mem::take(&mut scratch.moved);
                    if let Some(t) = traffic {
                        TrafficCounters::add_single_writer(&t.send_bytes, moved);
                    }
                    TrafficCounters::add_single_writer(&self.counters.bytes, moved);
                    scratch.limits.charge_bytes(vm_id, moved);
                    bytes = bytes.saturating_add(moved);
                    scratch.executed.1 = scratch.executed.1.saturating_add(moved);
                }
                Step::Done { published: p } => {
                    wqes = wqes.saturating_add(1);
                    qp.rt.wait = None;
                    qp.rt.partial = None;
                    qp.rt.sq_ci = index.wrapping_add(1);
                    published = p.then_some(qp.rt.sq_ci);
                    let moved = std::mem::take(&mut scratch.moved);
                    if let Some(t) = traffic {
                        TrafficCounters::add_single_writer(&t.send_ops, 1);
                        TrafficCounters::add_single_writer(&t.send_bytes, moved);
                    }
                    TrafficCounters::add_single_writer(&self.counters.wqes, 1);
                    TrafficCounters::add_single_writer(&self.counters.bytes, moved);
                    scratch.limits.charge(vm_id, moved);
                    bytes = bytes.saturating_add(moved);
                    scratch.executed.0 = scratch.executed.0.saturating_add(1);
                    scratch.executed.1 = scratch.executed.1.saturating_add(moved);
                }
                Step::Broken | Step::Busy => break,
            }
            if bytes >= max_bytes {
                break;
            }
        }
        // The consumer index of the WQEs taken in this burst, once (those
        // with a completion published it before writing it).
        if let Some(qp) = ctrl.res.qps.get(h) {
            if did && published != Some(qp.rt.sq_ci) {
                let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
            }
        }
        did
    }

    /// Executes send WQE `index` of QP `h`, writing its completion.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &HostMem,
        h: u32,
        index: u32,
        scratch: &mut Scratch,
        mut held: Option<&mut Held<'_>>,
    ) -> Step {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (pd, qpn, qp_type, sig_all) =
            (qp.pd, qp.qpn, qp.qp_type, qp.flags & QP_FLAG_SIG_ALL != 0);
        // A plain RDMA WRITE this QP has partly executed (spec: pieces).
        let partial = qp.rt.partial.filter(|p| p.index == index);
        let Scratch {
            wqe: wqe_buf,
            local,
            resp,
            moved,
            piece,
            ..
        } = scratch;
        let wr = match fetch_send(mem, qp, index, wqe_buf) {
            Ok(wr) => wr,
            Err(WqeError::Unusable) => {
                // The ring is not in guest RAM: the queue is unusable, the
                // QP fails with QP_FATAL and the WQE is not taken (spec
                // 18.18).
                fail(ctrl, h, Some(EventKind::QP_FATAL));
                return Step::Broken;
            }
            Err(WqeError::Malformed { wr_id, opcode }) => {
                let op = opcode.map_or(WcOpcode::SEND, wc_opcode);
                let status = WcStatus::LOC_QP_OP_ERR;
                return complete_send(ctrl, mem, h, index, wr_id, op, status, 0);
            }
        };
        let malformed = malformed_op(qp, &wr, ctrl.atomics_negotiated());
        let (wr_id, op) = (wr.hdr.wr_id, wc_opcode(wr.opcode));
        // The requester's error completion for this WQE.
        let failed =
            |ctrl: &mut Ctrl, status| complete_send(ctrl, mem, h, index, wr_id, op, status, 0);
        if malformed {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let signaled = sig_all || wr.hdr.flags & WQE_SIGNALED != 0;
        let _fence = wr.hdr.flags & WQE_FENCE != 0; // Operations complete in order here.
        let writes_local = matches!(
            op,
            WcOpcode::RDMA_READ | WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD
        );
        // Every RC message from or into local buffers is executed in
        // pieces (SEND, WRITE, READ; not inline data, atomics or UD, which
        // are small); the burst says how much one execution may move.
        let piecewise = qp_type == QpType::RC
            && wr.inline.is_none()
            && !matches!(
                wr.opcode,
                WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
            );
        if let Some(p) = partial {
            // The guest rewrote a WQE the device had started: it fails
            // rather than resume with other checks than its first piece had.
            let hdr = &wr.hdr;
            if !piecewise
                || wr.opcode != p.opcode
                || hdr.rkey != p.rkey
                || hdr.remote_addr != p.remote_addr
            {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            }
        }
        let start = partial.map_or(0, |p| p.done);
        let limit = if piecewise { *piece } else { u64::MAX };
        // The message length first, from the SGE lengths alone, before any
        // of it is looked up or translated (a message over a huge MR of one
        // repeated page costs its sender nothing; its translation would
        // cost the engine). At most 30 SGEs of 4 GiB: no overflow.
        let total: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        if partial.is_some_and(|p| p.len != total || p.wr_id != wr_id || p.done >= total) {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        let len = wr.inline.map_or(total, |d| d.len() as u64);
        if len > u64::from(self.rnic.caps().max_msg_size) {
            return failed(ctrl, WcStatus::LOC_LEN_ERR);
        }
        // The part this execution moves: all of it but for a piece.
        let part = if piecewise {
            // `start < total` (checked above) but for a rewritten WQE.
            let Some(left) = len.checked_sub(start) else {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            };
            (start, limit.min(left))
        } else {
            (0, len)
        };
        let ud = qp_type == QpType::UD;
        if matches!(op, WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD) && len != 8 {
            return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
        }
        // A UD message is one packet: at most the MTU (spec 18.11).
        if ud && len > u64::from(self.rnic.caps().max_ud_payload()) {
            return failed(ctrl, WcStatus::LOC_LEN_ERR);
        }
        // Find the responder.
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        let (dest_qpn, av) = if ud {
            let Some(ah) = ctrl.res.ahs.get(wr.hdr.ah_handle).filter(|a| a.pd == pd) else {
                return failed(ctrl, WcStatus::LOC_QP_OP_ERR);
            };
            (wr.hdr.remote_qpn, ah.av)
        } else {
            (qp.attr.dest_qpn, qp.attr.av)
        };
        let dgid = av.dgid;
        let qkey = if wr.hdr.remote_qkey & QKEY_USE_OWN != 0 {
            qp.attr.qkey
        } else {
            wr.hdr.remote_qkey
        };
        let mut route = if ud {
            self.rnic.lookup_qpn(dest_qpn)
        } else {
            self.rc_route(ctrl, h)
        };
        // An RC message finds its responder before a byte of it is
        // translated: a message to nowhere (retried forever with `timeout`
        // 0) then costs a lookup per try, not its length.
        let unreached = if ud {
            None
        } else {
            self.precheck_rc(vms, vm_id, ctrl, h, &mut route, dgid, held.as_deref())
        };
        let outcome = match unreached {
            Some(outcome) => {
                // Nothing is moved, but a message that could not even be
                // built still fails as such (keys, rights, bounds: a cost
                // in SGEs, not pages).
                if let Err(status) = check_local(ctrl, pd, wr.sges, writes_local) {
                    return failed(ctrl, status);
                }
                outcome
            }
            None => {
                // Every piece resolves only its own part.
                if let Err(status) =
                    local_range(ctrl, pd, wr.sges, writes_local, start, limit, local)
                {
                    return failed(ctrl, status);
                }
                let mut req = Request {
                    admitted: !ud,
                    wr: &wr,
                    vm: vm_id,
                    src_qpn: qpn,
                    src_gid: ctrl.port_gid(),
                    av,
                    local,
                    len,
                    part,
                    mem,
                    dest_qpn,
                    qkey,
                };
                let mut outcome = deliver(
                    vms,
                    vm_id,
                    ctrl,
                    mem,
                    route,
                    dgid,
                    &req,
                    ud,
                    resp,
                    held.as_deref_mut(),
                );
                if matches!(outcome, RespOutcome::Stale) {
                    // The routing hint was stale: resolve the QPN afresh,
                    // once. The number may now belong to another QP of the
                    // VM held for this burst: `deliver` must use that lock,
                    // not take it again.
                    let route = self.relookup(ctrl, h, dest_qpn, !ud);
                    req.admitted = false;
                    outcome = deliver(vms, vm_id, ctrl, mem, route, dgid, &req, ud, resp, held);
                }
                outcome
            }
        };
        shrink_scratch(local, resp);
        // UD gives no delivery guarantee: a message nobody takes is dropped
        // (spec 18.11.5), yet the send succeeded.
        let dropped = matches!(outcome, RespOutcome::Dropped)
            || (ud && matches!(outcome, RespOutcome::Unreachable | RespOutcome::Stale));
        if dropped {
            if let Some(t) = self.shared.tenancy.traffic(vm_id) {
                TrafficCounters::add_single_writer(&t.drops, 1);
            }
        }
        if dropped || matches!(outcome, RespOutcome::Done) {
            *moved = part.1;
        }
        // `part.1 <= len - part.0`: at most `len`.
        let end = part.0.saturating_add(part.1);
        if matches!(outcome, RespOutcome::Done) && end < len {
            // A piece: the WQE stays at the head until its last one.
            if let Some(q) = ctrl.res.qps.get_mut(h) {
                q.rt.partial = Some(SendPartial {
                    index,
                    done: end,
                    wr_id,
                    len,
                    opcode: wr.opcode,
                    rkey: wr.hdr.rkey,
                    remote_addr: wr.hdr.remote_addr,
                });
            }
            return Step::Piece;
        }
        match outcome {
            RespOutcome::Done | RespOutcome::Dropped => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let ok = WcStatus::SUCCESS;
                    return complete_send(ctrl, mem, h, index, wr_id, op, ok, byte_len);
                }
                Step::Done { published: false }
            }
            // UD gives no delivery guarantee: a message nobody takes is
            // dropped (spec 18.11.5).
            RespOutcome::Unreachable | RespOutcome::Stale if ud => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let ok = WcStatus::SUCCESS;
                    return complete_send(ctrl, mem, h, index, wr_id, op, ok, byte_len);
                }
                Step::Done { published: false }
            }
            RespOutcome::Nak(status) => failed(ctrl, status),
            RespOutcome::Busy => Step::Busy,
            RespOutcome::Unreachable | RespOutcome::Stale => {
                let Some(qp) = ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                debug!("QP {qpn:#x}: destination {dest_qpn:#x} unreachable");
                transport_retry(qp, index, wr_id, op)
            }
            RespOutcome::Rnr(code) => {
                let Some(qp) = ctrl.res.qps.get(h) else {
                    return Step::Done { published: false };
                };
                match rnr_retry(qp, index, code) {
                    Some(w) => Step::Wait(w),
                    None => failed(ctrl, WcStatus::RNR_RETRY_EXC_ERR),
                }
            }
        }
    }
}

/// Whether send WQE `wr` is malformed on QP `qp` for reasons its opcode
/// decides (spec 18.8): an opcode the QP's type does not allow (UD: SEND
/// and SEND_WITH_IMM only), inline data on an RDMA READ or atomic, an RDMA
/// READ or atomic on a QP whose `max_rd_atomic` is 0, or an atomic while
/// `F_ATOMIC` is not negotiated (`atomics` false).
fn malformed_op(qp: &Qp, wr: &SendWr<'_>, atomics: bool) -> bool {
    let atomic = matches!(
        wr.opcode,
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
    );
    let rd_atomic = atomic || wr.opcode == WrOpcode::RDMA_READ;
    let ud_allowed = matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM);
    (qp.qp_type == QpType::UD && !ud_allowed)
        || (rd_atomic && (wr.inline.is_some() || qp.attr.max_rd_atomic == 0))
        || (atomic && !atomics)
}

/// When the head WQE of `qp` waits for a retry that is not due yet: the end
/// of its wait.
fn waiting(qp: &Qp) -> Option<Instant> {
    let w = qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci)?;
    (Instant::now() < w.at).then_some(w.at)
}

/// The head WQE of `qp` whose transport retries are used up, once its last
/// wait has ended: its `wr_id` and completion opcode.
fn exhausted(qp: &Qp) -> Option<(u64, WcOpcode)> {
    qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci)?.exhausted
}

/// The retry state of send WQE `index` of `qp`: the current one if it is
/// the WQE that waited last, else full counters (spec 18.20: both counters
/// apply to each WQE afresh).
fn retry_state(qp: &Qp, index: u32) -> SendWait {
    match qp.rt.wait.filter(|w| w.index == index) {
        Some(w) => w,
        None => SendWait {
            index,
            at: Instant::now(),
            rnr_left: qp.attr.rnr_retry,
            retry_left: qp.attr.retry_cnt,
            exhausted: None,
        },
    }
}

/// The responder of send WQE `index` of `qp` had no receive WQE: the wait
/// before the next try, for the interval the responder's `min_rnr_timer`
/// (`code`) selects — or `None` when `rnr_retry` is used up (7: retry
/// without limit) (spec 18.20).
fn rnr_retry(qp: &Qp, index: u32, code: u32) -> Option<SendWait> {
    let mut w = retry_state(qp, index);
    if w.rnr_left == 0 {
        return None;
    }
    if qp.attr.rnr_retry != 7 {
        w.rnr_left = w.rnr_left.saturating_sub(1);
    }
    debug!("QP {:#x}: RNR, {} retries left", qp.qpn, w.rnr_left);
    w.at = later(rnr_delay(code));
    Some(w)
}

/// The destination of send WQE `index` (`wr_id`, completion opcode `op`) of
/// RC QP `qp` is unreachable (spec 18.20): nothing was delivered, and the
/// requester learns it only when the local ACK timeout, `4.096 µs ×
/// 2^timeout`, expires — as an InfiniBand requester whose packet got no
/// answer. It then tries again, at most `retry_cnt` times; when the timeout
/// after the last retry expires, the WQE fails with `RETRY_EXC_ERR`
/// untried. `timeout` 0 retries without limit.
fn transport_retry(qp: &Qp, index: u32, wr_id: u64, op: WcOpcode) -> Step {
    let mut w = retry_state(qp, index);
    let timeout = qp.attr.timeout;
    let interval = if timeout == 0 {
        ENDLESS_RETRY_INTERVAL
    } else {
        if w.retry_left == 0 {
            w.exhausted = Some((wr_id, op));
        } else {
            w.retry_left = w.retry_left.saturating_sub(1);
        }
        ack_timeout(timeout)
    };
    w.at = later(interval);
    Step::Wait(w)
}

/// `d` from now. The delays here are at most hours (`ack_timeout`), far
/// from where an `Instant` overflows; if one did, the wait ends at once.
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or(now)
}

/// The local ACK timeout `4.096 µs × 2^timeout` (spec 18.20).
fn ack_timeout(timeout: u32) -> Duration {
    Duration::from_nanos(4096u64 << timeout.min(31))
}

/// Completes send WQE `index` (`wr_id`, completion opcode `op`) of QP `h`
/// with `status` on its send CQ; an error fails the QP. The WQE's slot is
/// released first (spec 18.5: no later than its completion).
#[allow(clippy::too_many_arguments)]
fn complete_send(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    h: u32,
    index: u32,
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    len: u32,
) -> Step {
    let Some((db_gpa, send_cq, qpn)) = ctrl.res.qps.get(h).map(|q| (q.db_gpa, q.send_cq, q.qpn))
    else {
        return Step::Done { published: false };
    };
    let _ = doorbell::store(mem, db_gpa, QpDoorbell::SQ_CI, index.wrapping_add(1));
    finish(ctrl, mem, h, send_cq, qpn, wr_id, op, status, len);
    Step::Done { published: true }
}

/// Why [`deliver`] found no responder (which isolation counter moves).
#[derive(Clone, Copy)]
enum Unreached {
    /// No such QPN (at the GID addressed).
    Unknown,
    /// A UD message to another tenant.
    ForeignUd,
    /// An RC message to another tenant.
    ForeignRc,
}

/// Hands `req` to the responder at `route` (VM, QP handle): in the same VM,
/// in the VM held for the burst, or in another VM locked for this message.
///
/// The tenant policy (spec 18.23): QP numbers are a per-tenant namespace.
/// A route to a VM of another tenant ends here exactly as a QPN that does
/// not exist — `Unreachable` (UD drops, RC retries) — before anything of
/// the other VM is looked at; it is counted in the requester's
/// `foreign_drops` (UD) or `foreign_rc` (RC). A QPN that exists nowhere, or
/// not at the GID addressed, counts `unknown_qpn`. Counts are per attempt
/// (each RC retry counts again, as each would be a packet on a wire).
#[allow(clippy::too_many_arguments)]
fn deliver(
    vms: &[Option<Arc<RdmaDevice>>],
    vm_id: usize,
    ctrl: &mut Ctrl,
    mem: &HostMem,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
    held: Option<&mut Held<'_>>,
) -> RespOutcome {
    // An RC message's route was admitted by `Engine::precheck_rc` already.
    let admitted = if req.admitted {
        route.ok_or(RespOutcome::Unreachable)
    } else {
        admit(vms, vm_id, ctrl, route, dgid, ud)
    };
    let (peer_vm, peer_qp) = match admitted {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    if peer_vm == vm_id {
        return respond_ud_checked(ctrl, mem, peer_qp, req, ud, resp);
    }
    if let Some(p) = held.filter(|p| p.vm == peer_vm) {
        if p.ctrl.port_gid() != dgid {
            return RespOutcome::Unreachable;
        }
        let out = respond_ud_checked(p.ctrl, p.mem, peer_qp, req, ud, resp);
        if !p.ctrl.events.is_empty() {
            p.dev.wake_events();
        }
        return out;
    }
    let Some(peer) = vms.get(peer_vm).and_then(Option::as_ref) else {
        return RespOutcome::Unreachable;
    };
    let ran = peer.try_with_dataplane(|pctrl, pmem| {
        if pctrl.port_gid() != dgid {
            return RespOutcome::Unreachable;
        }
        let out = respond_ud_checked(pctrl, pmem, peer_qp, req, ud, resp);
        if !pctrl.events.is_empty() {
            peer.wake_events();
        }
        out
    });
    match ran {
        Locked::Ran(out) => out,
        Locked::Busy => RespOutcome::Busy,
        Locked::Gone => RespOutcome::Unreachable,
    }
}

/// The checks of [`deliver`] that need no lock of the other VM: the route
/// (VM, QP handle) of a message to `dgid`, or the outcome (`Unreachable`,
/// counted in the requester's isolation counters) when there is none in
/// reach (see [`deliver`] for the tenant policy).
fn admit(
    vms: &[Option<Arc<RdmaDevice>>],
    vm_id: usize,
    ctrl: &Ctrl,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    ud: bool,
) -> Result<(usize, u32), RespOutcome> {
    let count = |which: Unreached| {
        if let Some(c) = ctrl.tenancy().counters(vm_id) {
            IsolationCounters::bump(match which {
                Unreached::Unknown => &c.unknown_qpn,
                Unreached::ForeignUd => &c.foreign_drops,
                Unreached::ForeignRc => &c.foreign_rc,
            });
        }
        Err(RespOutcome::Unreachable)
    };
    let unknown = Unreached::Unknown;
    let Some((peer_vm, peer_qp)) = route else {
        return count(unknown);
    };
    if peer_vm == vm_id {
        if ctrl.port_gid() != dgid {
            return count(unknown);
        }
        return Ok((peer_vm, peer_qp));
    }
    if !ctrl.tenancy().may_reach(vm_id, peer_vm) {
        return count(if ud {
            Unreached::ForeignUd
        } else {
            Unreached::ForeignRc
        });
    }
    // Never lock a VM of another engine thread (see "Locking" above). A
    // tenant's VMs share a thread, so this only guards that invariant.
    if !same_thread(vms, vm_id, peer_vm) {
        return count(unknown);
    }
    // The peer's GID, from the tenancy table: no need to lock the peer to
    // learn that the address is wrong.
    if ctrl.tenancy().vm(peer_vm).map(|v| v.gid) != Some(dgid) {
        return count(unknown);
    }
    // A stopped device takes no message (spec 15.1); checked again under
    // its lock.
    if !vms
        .get(peer_vm)
        .and_then(Option::as_ref)
        .is_some_and(|d| d.running())
    {
        return Err(RespOutcome::Unreachable);
    }
    Ok((peer_vm, peer_qp))
}

/// Whether RC QP `qp` of `ctrl` takes a message addressed to `qpn` now:
/// `None` if it does, else what the requester gets (`Stale`: the handle
/// no longer has that number; `Unreachable`: a state that takes none).
fn responder_takes(ctrl: &Ctrl, qp: u32, qpn: u32) -> Option<RespOutcome> {
    if !ctrl.running() {
        return Some(RespOutcome::Unreachable);
    }
    let Some(q) = ctrl.res.qps.get(qp).filter(|q| q.qpn == qpn) else {
        return Some(RespOutcome::Stale);
    };
    let takes =
        q.qp_type == QpType::RC && matches!(q.state, QpState::RTR | QpState::RTS | QpState::SQD);
    (!takes).then_some(RespOutcome::Unreachable)
}

/// Segment lists of this many entries and more are not kept between work
/// requests: one huge message must not leave the engine holding its
/// translation (16 bytes a page) for good.
const SCRATCH_KEEP: usize = 4096;

/// Gives back what one work request made the scratch lists grow past
/// [`SCRATCH_KEEP`].
fn shrink_scratch(local: &mut Vec<Segment>, resp: &mut RespScratch) {
    for v in [local, &mut resp.segs] {
        if v.capacity() > SCRATCH_KEEP {
            v.clear();
            v.shrink_to(SCRATCH_KEEP);
        }
    }
}

/// Queues `QP_SQ_DRAINED` for QP `h` if it entered SQD with the event
/// enabled while work was in flight and that work has now completed.
fn drained(ctrl: &mut Ctrl, h: u32) {
    let Some(qp) = ctrl.res.qps.get_mut(h) else {
        return;
    };
    if qp.state == QpState::SQD && qp.rt.drain_owed && !qp.rt.in_flight() {
        qp.rt.drain_owed = false;
        ctrl.events.push(EventKind::QP_SQ_DRAINED, h, 0);
    }
}

/// Whether VMs `a` and `b` are served by the same engine thread.
fn same_thread(vms: &[Option<Arc<RdmaDevice>>], a: usize, b: usize) -> bool {
    let thread = |v: usize| {
        vms.get(v)
            .and_then(Option::as_ref)
            .map(|d| d.engine_index())
    };
    thread(a).is_some() && thread(a) == thread(b)
}

/// Updates a polling-list entry after its QP was serviced (under the VM's
/// lock): the indices up to which the engine has acted.
fn refresh(e: &mut DbEntry, ctrl: &Ctrl, mem: &HostMem) {
    let Some(qp) = ctrl.res.qps.get(e.handle) else {
        // Gone: never look again (the list is rebuilt with the next
        // generation anyway).
        e.watch_rq = false;
        e.owed = false;
        e.due = None;
        e.seen_sq = sq_pi_now(e);
        e.seen_rq = 0;
        return;
    };
    e.owed = owes_flush(qp);
    // Its retry timer brings it back (the sweep that parks, or the first
    // scan after it).
    e.due = match qp.state {
        QpState::RTS | QpState::SQD => qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci).map(|w| w.at),
        _ => None,
    };
    let own_rq = qp.srq == 0;
    match qp.state {
        QpState::RTS | QpState::ERR | QpState::RESET => e.seen_sq = qp.rt.sq_ci,
        // Draining: the started WQE is still work.
        QpState::SQD if qp.rt.in_flight() => e.seen_sq = qp.rt.sq_ci,
        // States that take no send work: act again only on a new post.
        _ => {
            e.seen_sq =
                load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::SQ).unwrap_or(qp.rt.sq_ci)
        }
    }
    e.watch_rq = own_rq && matches!(qp.state, QpState::RESET | QpState::ERR);
    e.seen_rq = if e.watch_rq { qp.rt.rq_ci } else { 0 };
}

/// Whether QP `qp` is in ERR with a message it was receiving in pieces,
/// whose receive WQE the flush completes.
fn owes_flush(qp: &Qp) -> bool {
    qp.state == QpState::ERR && qp.rt.inbound.is_some()
}

/// The current `sq_pi` of an entry's record.
fn sq_pi_now(e: &DbEntry) -> u32 {
    // SAFETY: as in `DbList::scan`: `e.db` points into a mapping the list
    // keeps alive, aligned for a 4-byte atomic.
    u32::from_le(unsafe { (*e.db).load(Ordering::Acquire) })
}

fn respond_ud_checked(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    peer_qp: u32,
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
) -> RespOutcome {
    if !ctrl.running() {
        // Stopped: no QP answers, as on a wire to a halted host.
        return if ud {
            RespOutcome::Dropped
        } else {
            RespOutcome::Unreachable
        };
    }
    let Some(q) = ctrl.res.qps.get(peer_qp) else {
        return RespOutcome::Stale;
    };
    if q.qpn != req.dest_qpn {
        return RespOutcome::Stale;
    }
    if ud {
        if q.qp_type != QpType::UD || q.attr.qkey != req.qkey {
            return RespOutcome::Dropped;
        }
    } else if q.qp_type != QpType::RC {
        return RespOutcome::Unreachable;
    }
    respond(ctrl, mem, peer_qp, req, resp)
}

/// RNR NAK timer codes (IB table) in microseconds, indexed by code 0..=31.
fn rnr_delay(code: u32) -> Duration {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    Duration::from_micros(US.get(code as usize).copied().unwrap_or(10))
}

/// What to do with the WQE at the head of the send queue.
enum Step {
    /// Completed (successfully or not); move on.
    Done {
        /// Whether `sq_ci` past this WQE has been stored already (before
        /// its completion).
        published: bool,
    },
    /// Wait for a retry (spec 18.20); the WQE stays at the head.
    Wait(SendWait),
    /// A piece of a plain RDMA WRITE was written; the WQE stays at the
    /// head ([`Qp::rt`]`.partial`) until its last piece.
    Piece,
    /// The send queue is unusable and the QP failed; the WQE was not taken.
    Broken,
    /// The responder's VM was locked by its control path: the WQE stays at
    /// the head, untouched, for the next service.
    Busy,
}

/// Writes the requester's completion (always for errors) and fails the QP
/// on error.
#[allow(clippy::too_many_arguments)]
fn finish(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    qp: u32,
    cq: u32,
    qpn: u32,
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    byte_len: u32,
) {
    let cqe = if status == WcStatus::SUCCESS {
        Cqe {
            wr_id,
            opcode: op as u8,
            status: status as u8,
            byte_len,
            qpn,
            ..Cqe::default()
        }
    } else {
        completer::error_cqe(wr_id, op, status, qpn)
    };
    if status != WcStatus::SUCCESS {
        if let Some(t) = traffic(ctrl) {
            TrafficCounters::add_single_writer(&t.error_cqes, 1);
        }
    }
    let ok = completer::complete(ctrl, mem, cq, cqe);
    if status != WcStatus::SUCCESS || !ok {
        fail(ctrl, qp, None);
    }
}

/// The traffic counters of the VM `ctrl` belongs to.
fn traffic(ctrl: &Ctrl) -> Option<&TrafficCounters> {
    ctrl.tenancy().traffic(ctrl.vm_index())
}

/// Counts one `WR_FLUSH_ERR` completion of the VM `ctrl` belongs to.
fn count_flushed(ctrl: &Ctrl) {
    if let Some(t) = traffic(ctrl) {
        TrafficCounters::add_single_writer(&t.flushed, 1);
    }
}

/// Moves QP `qp` into ERR with `event` (see [`Ctrl::qp_enter_err`]).
fn fail(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    ctrl.qp_enter_err(qp, event);
}

/// Completes every outstanding WQE of a QP in the error state with
/// WR_FLUSH_ERR. WQEs of a queue that is out of range or whose ring cannot
/// be read are not flushed: they were never taken, and nothing of them can
/// be trusted (spec 18.18, notes).
///
/// Flushes at most `max` WQEs (send and receive together) and returns how
/// many; the rest waits for the next service.
fn flush(ctrl: &mut Ctrl, mem: &HostMem, h: u32, sq_pi: u32, buf: &mut WqeBuf, max: u32) -> u32 {
    let mut did = 0u32;
    loop {
        if did >= max {
            return did;
        }
        let Some(qp) = ctrl.res.qps.get(h) else {
            return did;
        };
        if qp.rt.sq_ci == sq_pi || sq_pi.wrapping_sub(qp.rt.sq_ci) > qp.sq_depth {
            break;
        }
        let index = qp.rt.sq_ci;
        let (cq, qpn) = (qp.send_cq, qp.qpn);
        let (wr_id, op) = match fetch_send(mem, qp, index, buf) {
            Ok(wr) => (wr.hdr.wr_id, wc_opcode(wr.opcode)),
            Err(WqeError::Malformed { wr_id, opcode }) => {
                (wr_id, opcode.map_or(WcOpcode::SEND, wc_opcode))
            }
            Err(WqeError::Unusable) => break,
        };
        let cqe = completer::error_cqe(wr_id, op, WcStatus::WR_FLUSH_ERR, qpn);
        let _ = completer::complete(ctrl, mem, cq, cqe);
        count_flushed(ctrl);
        if let Some(qp) = ctrl.res.qps.get_mut(h) {
            qp.rt.sq_ci = index.wrapping_add(1);
            qp.rt.wait = None;
            qp.rt.partial = None;
            let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
        }
        did = did.saturating_add(1);
    }
    // A message that was arriving in pieces: its receive WQE was taken.
    if did < max && exec::flush_inbound(ctrl, mem, h) {
        count_flushed(ctrl);
        did = did.saturating_add(1);
    }
    // Receives of a QP with its own receive queue.
    loop {
        if did >= max {
            return did;
        }
        let Some(qp) = ctrl.res.qps.get(h) else {
            return did;
        };
        if qp.srq != 0 {
            break;
        }
        let Some(rq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ) else {
            break;
        };
        if qp.rt.rq_ci == rq_pi || rq_pi.wrapping_sub(qp.rt.rq_ci) > qp.rq_depth {
            break;
        }
        let index = qp.rt.rq_ci;
        let (cq, qpn) = (qp.recv_cq, qp.qpn);
        let wr_id = match wqe::fetch_recv(
            mem,
            &qp.ring,
            qp.layout.rq_offset,
            qp.rq_depth,
            qp.layout.rq_wqe_shift,
            qp.max_recv_sge,
            index,
            buf,
        ) {
            Ok(w) => w.wr_id,
            Err(WqeError::Malformed { wr_id, .. }) => wr_id,
            Err(WqeError::Unusable) => break,
        };
        let cqe = completer::error_cqe(wr_id, WcOpcode::RECV, WcStatus::WR_FLUSH_ERR, qpn);
        let _ = completer::complete(ctrl, mem, cq, cqe);
        count_flushed(ctrl);
        if let Some(qp) = ctrl.res.qps.get_mut(h) {
            qp.rt.rq_ci = index.wrapping_add(1);
            let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::RQ_CI, qp.rt.rq_ci);
        }
        did = did.saturating_add(1);
    }
    did
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WRITEs are split while another VM had work in one of the last
    /// `RECENT_SWEEPS` sweeps, never for a VM alone.
    #[test]
    fn split_only_while_another_vm_was_recently_active() {
        let mut s = Scratch::new();
        let sweep = |s: &mut Scratch, active: &[usize]| {
            s.sweeps += 1;
            for &k in active {
                s.note_active(k);
            }
        };
        sweep(&mut s, &[0]);
        assert!(!s.others_active(0), "alone");
        sweep(&mut s, &[0, 1]);
        assert!(s.others_active(0) && s.others_active(1));
        assert!(s.others_active(2), "two others");
        for _ in 0..=RECENT_SWEEPS {
            sweep(&mut s, &[0]);
        }
        assert!(!s.others_active(0), "VM 1 idle for RECENT_SWEEPS sweeps");
        assert!(s.others_active(1), "VM 0 is active");
        // Alternating VMs that never share a sweep still see each other.
        sweep(&mut s, &[2]);
        sweep(&mut s, &[0]);
        assert!(s.others_active(0) && s.others_active(2));
    }
}
