//! The state of one VM: the type the control dispatcher executes commands
//! on and the engine serves, and the lock both take it under.
//!
//! - [`VmState`] (here): the VM's objects ([`crate::resources`]), pending
//!   events, memory map, port identity, negotiated features, and the state
//!   changes both the control path and the engine make (a QP failing, a
//!   reset, peers gone);
//! - [`cell`]: [`cell::VmCell`], the VM's state behind its lock, with what
//!   the engine reads without it.

pub mod cell;

use std::sync::Arc;

use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;

use crate::config::{Limits, MAD_BURST};
use crate::events::EventQueue;
use crate::gid_table::GidTable;
use crate::memory::RamMap;
use crate::qos::bucket::TokenBucket;
use crate::resources::{Qp, VmResources};
use crate::rnic_objects::RnicObjects;
use crate::tenancy::Tenancy;

crate::stats::sums! {
/// Counters of control-path activity of one VM.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CtrlStats {
    /// Commands that completed with OK.
    pub ok: u64,
    /// Commands that completed with an error status.
    pub failed: u64,
    /// Chains that could not be answered at all (used length 0).
    pub malformed: u64,
}
}

/// Identity of the VM's port (its GID table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortIdentity {
    /// The VM's GID table (spec appendix A).
    pub gids: GidTable,
    /// GUID of this device instance (node and system image GUID): one per
    /// VM, so guests cannot tell that they share a host.
    pub guid: u64,
    /// Index of the VM in the daemon (its socket's position).
    pub vm: usize,
}

/// The state of one VM's device: its objects, pending events, memory map,
/// port identity and negotiated features. The control dispatcher
/// (`ctrl`) executes commands on it; the engine works on its objects under
/// the same lock ([`cell::VmCell`]).
pub struct VmState {
    /// The VM's objects.
    pub res: VmResources,
    /// Pending asynchronous events.
    pub events: EventQueue,
    /// Activity counters.
    pub stats: CtrlStats,
    pub(crate) limits: Limits,
    pub(crate) features: u64,
    /// The host half of the VM's objects.
    pub(crate) rnic: Arc<dyn RnicObjects>,
    pub(crate) ram: RamMap,
    /// Advances with every [`VmState::set_ram`]: a translation prepared
    /// against an older map is built again (see [`Prepared`]).
    pub(crate) ram_gen: u64,
    pub(crate) port: PortIdentity,
    pub(crate) tenancy: Arc<Tenancy>,
    /// The doorbell flags the engine serving the VM gives its contexts
    /// (`DB_FLAG_KICK` while it does not poll the VM, `DB_FLAG_POLLING`
    /// while it polls and lets drivers skip the fence): queues created
    /// meanwhile start with them.
    db_flags: u32,
    /// A command changed something the engine must act on (see
    /// [`VmState::take_engine_work`]).
    pub(crate) engine_work: bool,
    /// A command may have changed the VM's QPs, their states or doorbells
    /// (see [`VmState::take_dp_changed`]).
    pub(crate) dp_changed: bool,
    /// The device is started (spec 15.1): only then does the engine
    /// execute the VM's work and do peers' messages reach it. Changed by
    /// the device under the VM's lock.
    pub(crate) running: bool,
    /// The MADs its GSI QP may still send (`mad_per_sec`, bursts of
    /// [`MAD_BURST`]; spec 18.26). Not refilled by a reset: a guest
    /// cannot reset its way past the rate.
    mad_limit: TokenBucket,
}

impl VmState {
    /// The state of VM `port.vm` before its driver has done anything.
    pub fn new(
        limits: Limits,
        rnic: Arc<dyn RnicObjects>,
        port: PortIdentity,
        tenancy: Arc<Tenancy>,
    ) -> Self {
        VmState {
            res: VmResources::new(port.vm, limits.max_host_bytes),
            events: EventQueue::default(),
            stats: CtrlStats::default(),
            limits,
            features: 0,
            rnic,
            ram: RamMap::default(),
            ram_gen: 0,
            port,
            tenancy,
            // Kicks until its engine looks at it for the first time.
            db_flags: virtio_rdma_abi::datapath::DB_FLAG_KICK,
            engine_work: false,
            dp_changed: false,
            running: false,
            mad_limit: TokenBucket::counted(
                u64::from(limits.mad_per_sec),
                MAD_BURST,
                std::time::Instant::now(),
            ),
        }
    }

    /// Takes one MAD of the VM's rate at `now`; false when the rate is
    /// spent (the MAD is dropped).
    pub fn take_mad(&mut self, now: std::time::Instant) -> bool {
        self.mad_limit.take(1, now) == 1
    }

    /// Returns a MAD taken by [`VmState::take_mad`] that was not sent
    /// (its destination's lock was busy: it is tried again).
    pub fn give_back_mad(&mut self) {
        self.mad_limit.give_back(1);
    }

    /// The device flags a new doorbell record or page starts with: those
    /// the engine gives the VM's existing ones — kicks while the engine
    /// does not poll the VM, so a post to the new queue wakes it. Read
    /// under the VM's lock, which orders it with the engine's updates
    /// ([`VmState::set_doorbell_flags`]).
    pub fn new_doorbell_flags(&self) -> u32 {
        self.db_flags
    }

    /// Gives every context of the VM the doorbell flags `v` (the engine,
    /// under the VM's lock): the value new contexts start with, then
    /// every header in guest RAM or doorbell page (spec 18.4, 18.6). A
    /// stopped VM's memory is left alone (spec 15.1): its start writes the
    /// value then in force ([`VmState::refresh_doorbell_flags`]).
    pub fn set_doorbell_flags(&mut self, mem: &crate::memory::HostMem, v: u32) {
        self.db_flags = v;
        if self.running {
            self.refresh_doorbell_flags(mem);
        }
    }

    /// Whether a command since the last call may have made posted work
    /// startable or in need of a flush (a QP state change, a QP failed by
    /// the control path): the engine must look even if no doorbell rings.
    /// Creating objects needs no wake-up: new queues have no work yet, and
    /// ask for kicks themselves ([`VmState::new_doorbell_flags`]).
    pub fn take_engine_work(&mut self) -> bool {
        std::mem::take(&mut self.engine_work)
    }

    /// Whether a command since the last call may have changed what the
    /// engine's polling list of the VM is built from — its QPs, their
    /// states, their doorbells — so that the list must be rebuilt. Other
    /// commands leave it alone: a rebuild costs the engine a pass over
    /// every QP of the VM under its lock.
    pub fn take_dp_changed(&mut self) -> bool {
        std::mem::take(&mut self.dp_changed)
    }

    /// Index of the VM in the daemon.
    pub fn vm_index(&self) -> usize {
        self.port.vm
    }

    /// The daemon's tenancy table (isolation policy and counters).
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// The VM's GID table.
    pub fn gids(&self) -> &GidTable {
        &self.port.gids
    }

    /// Whether `gid` is one of the VM's GIDs (a message to it is the
    /// VM's).
    #[inline]
    pub fn owns_gid(&self, gid: &[u8; 16]) -> bool {
        self.port.gids.contains(gid)
    }

    /// Sets the device features the driver negotiated.
    pub fn set_features(&mut self, features: u64) {
        self.features = features;
    }

    /// Tells the RNIC that the VM's guest RAM is now `mem` (`None`:
    /// unmapped), before the new map is used (`RnicObjects::set_memory`).
    /// Each region's host registration is then checked against the new
    /// map (`RnicObjects::remap_mr`): one whose pages moved loses it, and
    /// its local key fails from then on whatever the NIC would report
    /// (spec 19.6.2).
    pub fn memory_changed(&mut self, mem: Option<&crate::memory::GuestRam>) {
        self.rnic.set_memory(self.port.vm, mem);
        let lost: Vec<u32> = self
            .res
            .mrs
            .iter()
            .filter(|(_, mr)| {
                let keys = crate::rnic_objects::MrKeys {
                    lkey: mr.lkey,
                    rkey: mr.rkey,
                };
                !mr.host_lost && !self.rnic.remap_mr(keys, &mr.spec())
            })
            .map(|(h, _)| h)
            .collect();
        for h in lost {
            if let Some(mr) = self.res.mrs.get_mut(h) {
                mr.host_lost = true;
            }
        }
    }

    /// Replaces the view of guest RAM (after a memory table update).
    pub fn set_ram(&mut self, ram: RamMap) {
        self.ram = ram;
        // Only compared for equality: wrapping is harmless.
        self.ram_gen = self.ram_gen.wrapping_add(1);
    }

    /// Whether the device is started (see `running`).
    pub fn running(&self) -> bool {
        self.running
    }

    /// Marks the device started or stopped.
    pub fn set_running(&mut self, on: bool) {
        self.running = on;
    }

    /// Writes the engine's current doorbell flags into the header of every
    /// context (spec 18.4): at a start, since the engine leaves a stopped
    /// device's memory alone and its headers may show a state it has left.
    pub fn refresh_doorbell_flags(&self, mem: &crate::memory::HostMem) {
        let v = self.new_doorbell_flags();
        for (_, ctx) in self.res.ctxs.iter() {
            if ctx.db_page.is_none() {
                let _ = crate::memory::access::store_u32_release(mem, ctx.db_gpa, v);
            }
        }
        if let Some(pages) = &self.res.doorbells {
            pages.set_flags_all(v);
        }
    }

    /// Destroys every object and drops pending events (device reset or
    /// disconnect). Returns the numbers and incarnations of the RC QPs it
    /// destroyed, so that the QPs of other VMs connected to them can be
    /// failed.
    pub fn reset(&mut self) -> Vec<(u32, u64)> {
        let rc: Vec<(u32, u64)> = self
            .res
            .qps
            .iter()
            .filter(|(_, q)| q.qp_type == virtio_rdma_abi::qp::QpType::RC || q.qp_type.xrc())
            .map(|(_, q)| (q.qpn, q.incarnation))
            .collect();
        self.res.clear(self.rnic.as_ref());
        // Freed here, under the lock (nothing drains them afterwards; the
        // engine only tries the lock), in steps like the control path's: a
        // guest may reset in a loop with a 16 GiB region registered.
        crate::memory::pagelist::release_all(self.res.take_released());
        self.events.reset();
        rc
    }

    /// The RC QPs of this VM connected to one of `gone` (number and
    /// incarnation, sorted by number) at a GID of `gids` (QPs of a device
    /// instance that went away) move to `ERR` with `QP_FATAL`; the engine
    /// then flushes their work (spec 18.23). Returns how many.
    pub fn fail_peers_of(&mut self, gids: &GidTable, gone: &[(u32, u64)]) -> usize {
        use virtio_rdma_abi::qp::QpType;
        // The incarnation of the gone QP with `q`'s destination number.
        let hit = |q: &Qp| {
            if !(q.qp_type == QpType::RC || q.qp_type.xrc()) || !gids.contains(&q.attr.av.dgid) {
                return None;
            }
            let i = gone
                .binary_search_by_key(&q.attr.dest_qpn, |&(n, _)| n)
                .ok()?;
            gone.get(i).map(|&(_, inc)| inc)
        };
        let failed = self.fail_qps(|q| {
            matches!(
                q.state,
                QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE
            ) && hit(q).is_some()
        });
        // A QP whose send found one of them gone after the reset and
        // before this call failed then, without the event.
        let owed: Vec<u32> = self
            .res
            .qps
            .iter()
            .filter(|(_, q)| {
                q.state == QpState::ERR
                    && q.rt.dest_gone
                    && q.rt.dest_incarnation.is_some()
                    && hit(q) == q.rt.dest_incarnation
            })
            .map(|(h, _)| h)
            .collect();
        for &h in &owed {
            if let Some(q) = self.res.qps.get_mut(h) {
                q.rt.dest_gone = false;
            }
            self.events.push(EventKind::QP_FATAL, h, 0);
        }
        failed.saturating_add(owed.len())
    }

    /// Moves every QP that `which` picks and that is not in ERR yet into
    /// ERR with `QP_FATAL` ([`VmState::qp_enter_err`]); returns how many.
    pub fn fail_qps(&mut self, which: impl Fn(&Qp) -> bool) -> usize {
        let hit: Vec<u32> = self
            .res
            .qps
            .iter()
            .filter(|(_, q)| q.state != QpState::ERR && which(q))
            .map(|(h, _)| h)
            .collect();
        for &h in &hit {
            self.qp_enter_err(h, Some(EventKind::QP_FATAL));
        }
        hit.len()
    }

    /// Notes a chain that could not be answered.
    pub fn count_malformed(&mut self) {
        self.stats.malformed = self.stats.malformed.saturating_add(1);
    }

    pub(crate) fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    /// Whether the driver negotiated `F_ATOMIC`: without it an atomic send
    /// WQE is malformed (spec 18.8).
    pub fn atomics_negotiated(&self) -> bool {
        self.has(virtio_rdma_abi::config::F_ATOMIC)
    }

    /// Moves QP `h` into ERR for a data-path error, unless it is there
    /// already, and queues its events: `event` (if any), then
    /// `QP_LAST_WQE_REACHED` for a QP attached to an SRQ.
    pub fn qp_enter_err(&mut self, h: u32, event: Option<EventKind>) {
        let Some(qp) = self.res.qps.get_mut(h) else {
            return;
        };
        if qp.state == QpState::ERR {
            return;
        }
        qp.state = QpState::ERR;
        // Its posted work is to be flushed.
        self.engine_work = true;
        if let Some(e) = event {
            self.events.push(e, h, 0);
        }
        self.last_wqe_reached(h);
    }

    /// The first message QP `qp` accepts in RTR queues `QP_COMM_EST`, once
    /// per entry into RTR and only while the QP is still in RTR (spec
    /// 18.22); the data path of either RNIC reports it here.
    pub fn comm_established(&mut self, qp: u32) {
        let Some(q) = self.res.qps.get_mut(qp) else {
            return;
        };
        if q.state == QpState::RTR && !q.rt.comm_est {
            q.rt.comm_est = true;
            self.events.push(EventKind::QP_COMM_EST, qp, 0);
        }
    }

    /// Queues `QP_LAST_WQE_REACHED` for QP `h`, which has just entered ERR,
    /// if it is attached to an SRQ (spec 18.19 item 5, 18.21). In ERR it
    /// consumes no more SRQ WQEs, and the engine completes each SRQ WQE in
    /// the step that consumes it, under the VM's lock, so every SRQ WQE the
    /// QP took has completed by now: the event can be queued at once. The
    /// SRQ's WQEs stay for the other QPs (the flush leaves them alone).
    pub(crate) fn last_wqe_reached(&mut self, h: u32) {
        if self.res.qps.get(h).is_some_and(|q| q.srq != 0) {
            self.events.push(EventKind::QP_LAST_WQE_REACHED, h, 0);
        }
    }
}
