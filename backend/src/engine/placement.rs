//! The daemon's engine threads and the placement of VMs on them.
//!
//! A tenant's VMs all run on one engine thread: a VM only ever reaches
//! VMs of its own tenant, so every VM-to-VM operation stays inside one
//! thread (no lock is ever taken across threads, see `rnic::soft::route`), and
//! the tenant's rate limits are one set of token buckets in that thread.
//! Tenants on different threads share no engine time at all: a bandwidth
//! hog on one thread cannot delay a latency-sensitive tenant on another,
//! whatever the weights. Weighted sharing (DRR) is among the VMs of one
//! thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::{Engine, Launch};
use crate::config::DaemonConfig;
use crate::qos::QosTable;
use crate::sync::lock;
use crate::tenancy::Tenancy;
use crate::vm::cell::VmCell;

/// The VMs of the daemon, shared by its engine threads, and which thread
/// serves each.
pub struct Registry {
    vms: Mutex<Vec<Weak<VmCell>>>,
    /// Bumped on every registration, so the threads refresh their lists.
    pub(super) generation: AtomicUsize,
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
    pub fn register(&self, id: usize, vm: &Arc<VmCell>) {
        let mut vms = lock(&self.vms);
        if vms.len() <= id {
            vms.resize(id.saturating_add(1), Weak::new());
        }
        if let Some(slot) = vms.get_mut(id) {
            *slot = Arc::downgrade(vm);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The live VMs, indexed by id.
    pub(super) fn all_vms(&self) -> Vec<Option<Arc<VmCell>>> {
        lock(&self.vms).iter().map(Weak::upgrade).collect()
    }
}

/// Where VMs run: the engine threads and each VM's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnginePlan {
    /// One entry per engine thread: the CPU it is pinned to, if any.
    pub cpus: Vec<Option<usize>>,
    /// The engine thread of each VM, by VM index (each below
    /// `cpus.len()`).
    pub placement: Vec<usize>,
    /// The threads set `DB_FLAG_POLLING` while they poll (spec 18.6).
    pub fence_elision: bool,
}

impl EnginePlan {
    /// The plan a configuration asks for: its threads and their CPUs, and
    /// every VM on its tenant's thread.
    pub fn from_config(c: &DaemonConfig) -> Self {
        EnginePlan {
            cpus: c.engine_thread_cpus(),
            placement: c.vm_engines(),
            fence_elision: c.fence_elision,
        }
    }

    /// One unpinned thread for `vms` VMs.
    pub fn single(vms: usize) -> Self {
        EnginePlan {
            cpus: vec![None],
            placement: vec![0; vms],
            fence_elision: false,
        }
    }
}

/// A snapshot of one engine thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// The thread's index.
    pub index: usize,
    /// The CPU it is pinned to.
    pub cpu: Option<usize>,
    /// VMs placed on it.
    pub vms: usize,
    /// Send work requests it executed.
    pub wqes: u64,
    /// Payload bytes it moved.
    pub bytes: u64,
    /// Times it parked.
    pub parks: u64,
    /// Times it parked a VM on its own while it polled others.
    pub vm_parks: u64,
    /// Times a peek found work of a parked VM while it was busy.
    pub peeked: u64,
    /// Times its idle re-check found a parked VM's work before the VM's
    /// notification.
    pub late_kicks: u64,
    /// Times it kept its time for an entitled VM and found its next post
    /// (anticipation).
    pub anticipated: u64,
    /// How long it polls after work before it parks, µs (it adapts to the
    /// traffic: spec 18.6's polling is the device's choice).
    pub poll_window_us: u64,
}

/// The running engine threads.
pub struct Engines {
    registry: Arc<Registry>,
    engines: Vec<Arc<Engine>>,
    plan: EnginePlan,
}

impl Engines {
    /// Starts the threads of `plan` on `rnic`'s data path. A placement
    /// naming a thread the plan does not have is an `InvalidInput` error
    /// (configuration validation rules it out first).
    pub fn start(
        rnic: Arc<dyn Launch>,
        tenancy: Arc<Tenancy>,
        qos: Arc<QosTable>,
        plan: EnginePlan,
    ) -> std::io::Result<Self> {
        let threads = plan.cpus.len();
        if threads == 0 || plan.placement.iter().any(|&e| e >= threads) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "engine placement {:?} for {threads} threads",
                    plan.placement
                ),
            ));
        }
        let registry = Arc::new(Registry::new(plan.placement.clone()));
        let mut engines: Vec<Arc<Engine>> = Vec::with_capacity(threads);
        for (index, cpu) in plan.cpus.iter().enumerate() {
            let started = Engine::start(
                index,
                registry.clone(),
                rnic.clone(),
                tenancy.clone(),
                qos.clone(),
                *cpu,
                plan.fence_elision,
            );
            match started {
                Ok(e) => engines.push(e),
                Err(e) => {
                    for started in &engines {
                        started.stop();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Engines {
            registry,
            engines,
            plan,
        })
    }

    /// The engine thread of VM `vm` (the first thread for a VM outside
    /// the plan, which never happens for VMs the daemon was started with).
    pub fn for_vm(&self, vm: usize) -> &Arc<Engine> {
        let i = self.registry.engine_of(vm).unwrap_or(0);
        // Bounded: `start` made sure there is at least one thread and every
        // placement is in range; the index is clamped to the last anyway.
        #[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
        let engine = &self.engines[i.min(self.engines.len() - 1)];
        engine
    }

    /// Adds VM `id` (served by its thread from now on).
    pub fn register(&self, id: usize, vm: &Arc<VmCell>) {
        self.registry.register(id, vm);
        self.for_vm(id).wake();
    }

    /// Number of threads.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Whether there are no threads (never: a plan has at least one).
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// Holds every engine thread (`on`) until released (see
    /// [`Engine::hold`]); for tests.
    pub fn hold(&self, on: bool) {
        for e in &self.engines {
            e.hold(on);
        }
    }

    /// The counters of every thread.
    pub fn stats(&self) -> Vec<EngineStats> {
        use std::sync::atomic::Ordering::Relaxed;
        self.engines
            .iter()
            .map(|e| {
                let c = e.counters();
                EngineStats {
                    index: e.index(),
                    cpu: self.plan.cpus.get(e.index()).copied().flatten(),
                    vms: self
                        .plan
                        .placement
                        .iter()
                        .filter(|&&p| p == e.index())
                        .count(),
                    wqes: c.wqes.load(Relaxed),
                    bytes: c.bytes.load(Relaxed),
                    parks: c.parks.load(Relaxed),
                    vm_parks: c.vm_parks.load(Relaxed),
                    peeked: c.peeked.load(Relaxed),
                    late_kicks: c.late_kicks.load(Relaxed),
                    anticipated: c.anticipated.load(Relaxed),
                    poll_window_us: c.poll_window_us.load(Relaxed),
                }
            })
            .collect()
    }

    /// Waits until every engine thread enforces every QoS change made so
    /// far (through [`crate::qos::QosTable`]), waking the sleeping ones;
    /// false if that took longer than `timeout` (a thread is stopped or
    /// starved of CPU). Without this a change applies at each thread's
    /// next sweep: work posted right after it may still run under the old
    /// settings.
    pub fn sync_qos(&self, qos_generation: u64, timeout: Duration) -> bool {
        let behind = |e: &&Arc<Engine>| e.qos_applied() < qos_generation;
        for e in self.engines.iter().filter(behind) {
            e.wake();
        }
        // No deadline if `timeout` is too long to represent.
        let deadline = Instant::now().checked_add(timeout);
        while self.engines.iter().any(|e| behind(&e)) {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            thread::sleep(Duration::from_micros(50));
        }
        true
    }

    /// Stops every thread.
    pub fn stop(&self) {
        for e in &self.engines {
            e.stop();
        }
    }
}
