//! Saving this VM's device state and loading one into it (spec chapter
//! 20): what `SET_DEVICE_STATE_FD` runs once the front-end has stopped the
//! device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use log::{info, warn};

use crate::memory::RamMap;
use crate::migration::restore::{Numbers, Target};
use crate::migration::{self, DeviceState, MigrationError};
use crate::resources::VmResources;
use crate::sync::lock;
use crate::vm::cell::{Guarded, VmCell};

use super::RdmaDevice;

/// How long a save waits for a host RNIC to complete what it took before
/// the stop (its peers held, that is a round trip or a few).
const HOST_REST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A state saved in this daemon and not yet taken: which instance saved
/// it, and its migration id.
#[derive(Clone)]
struct Saved {
    id: u64,
    from: usize,
    cell: Arc<VmCell>,
    /// When it was saved: the source had stopped by then.
    at: Instant,
}

/// A state one instance took from another, until either starts.
struct Taken {
    /// When the state was saved.
    saved_at: Instant,
    from: usize,
    from_cell: Arc<VmCell>,
    to: usize,
    to_cell: Arc<VmCell>,
}

/// Moves every object of `src` (instance `from`) to `dst` (instance `to`,
/// empty) on the RNIC and in the tables: the same handles, numbers and
/// keys. False, with nothing changed, if the RNIC refuses.
fn move_objects(from: usize, src: &mut Guarded, to: usize, dst: &mut Guarded) -> bool {
    let (qpns, srqns) = src.vm.res.numbers();
    let rnic = src.vm.rnic.clone();
    if rnic.rehome(from, to, &qpns, &srqns).is_err() {
        return false;
    }
    if src.vm.res.gsi_qp().is_some() {
        rnic.gsi_destroyed(from);
        rnic.gsi_created(to);
    }
    let budget = src.vm.limits.max_host_bytes;
    let mut empty = VmResources::new(from, budget);
    empty.doorbells = src.vm.res.doorbells.take();
    let mut moved = std::mem::replace(&mut src.vm.res, empty).rehomed(to);
    moved.doorbells = dst.vm.res.doorbells.take();
    let old = std::mem::replace(&mut dst.vm.res, moved);
    drop(old);
    dst.vm.engine_work = true;
    true
}

/// The states saved by this daemon's instances, by the VM (identity) they
/// are of: the last one of each VM, until an instance of the same VM takes
/// it or the saving instance starts again; and the states taken, until the
/// instance that took it or the one it came from starts (spec 20.5).
#[derive(Default)]
pub struct MigrationBoard {
    saved: Mutex<HashMap<usize, Saved>>,
    taken: Mutex<HashMap<usize, Taken>>,
}

impl MigrationBoard {
    /// Instance `vm` of VM `identity` starts, under its lock (`st`): a
    /// state it saved is forgotten (its objects may change from now on);
    /// a state taken from it by an instance that has not started comes
    /// back (a migration that failed after its destination loaded the
    /// state, the source resumed); a state it took is its for good.
    pub(crate) fn started(&self, identity: usize, vm: usize, st: &mut Guarded) {
        {
            let mut saved = lock(&self.saved);
            if saved.get(&identity).is_some_and(|s| s.from == vm) {
                saved.remove(&identity);
            }
        }
        let Some(t) = lock(&self.taken).remove(&identity) else {
            return;
        };
        if t.to == vm {
            // What the VM's peers saw as its blackout, at most: from the
            // source's stop (its state saved) to the destination's start.
            info!(
                "VM {identity}: running at instance {vm}, {} ms after instance {} saved its state",
                t.saved_at.elapsed().as_millis(),
                t.from
            );
            return;
        }
        if t.from != vm || t.to_cell.running() {
            return;
        }
        // The destination's lock after the source's: the reverse of a
        // load's order, so never wait for it.
        let Some(mut dst) = t.to_cell.try_lock() else {
            warn!(
                "VM {identity}: instance {} busy; its state stays there",
                t.to
            );
            return;
        };
        if t.to_cell.running() || !st.vm.res.counts().is_empty() {
            return;
        }
        if !move_objects(t.to, &mut dst, vm, st) {
            warn!(
                "VM {identity}: the state of instance {} cannot move back",
                t.to
            );
            return;
        }
        drop(dst);
        info!(
            "VM {identity}: instance {vm} started again; the state came back from instance {}",
            t.to
        );
    }

    /// Whether instance `vm` saved the last state of VM `identity` and has
    /// not started since.
    pub(crate) fn saved_here(&self, identity: usize, vm: usize) -> bool {
        lock(&self.saved)
            .get(&identity)
            .is_some_and(|s| s.from == vm)
    }

    /// Instance `vm` of VM `identity` is reset or disconnected, under its
    /// lock (`st`), before it released anything: if it took a state and
    /// has not started since, the objects go back to the instance they came
    /// from (stopped, empty) rather than away — a migration's destination
    /// that died — and true is returned: there is nothing left to release.
    pub(crate) fn give_back(&self, identity: usize, vm: usize, st: &mut Guarded) -> Option<usize> {
        let t = {
            let mut taken = lock(&self.taken);
            match taken.get(&identity) {
                Some(t) if t.to == vm => taken.remove(&identity),
                _ => None,
            }
        };
        let t = t?;
        // This instance's lock, then the source's, as a load takes them.
        let mut src = t.from_cell.lock();
        if t.from_cell.running() || !src.vm.res.counts().is_empty() || st.vm.res.counts().is_empty()
        {
            return None;
        }
        if !move_objects(vm, st, t.from, &mut src) {
            return None;
        }
        drop(src);
        t.from_cell.bump_dp_gen();
        info!("VM {identity}: instance {vm} ended before it started; the state went back to instance {}", t.from);
        Some(t.from)
    }
}

impl RdmaDevice {
    /// The VM whose identity this instance has (itself, or the VM it is
    /// the standby of) and that VM's name.
    fn identity(&self) -> (usize, String) {
        let identity = self.tenancy.vm(self.id).map_or(self.id, |v| v.identity);
        let name = self
            .tenancy
            .vm(identity)
            .map(|v| v.name.clone())
            .unwrap_or_default();
        (identity, name)
    }

    /// The largest state this instance saves or accepts, frame included.
    pub fn state_bound(&self) -> u64 {
        migration::state_bound(&self.limits)
    }

    /// Saves the device state for a migration. The device must be stopped
    /// (its queues stopped by the front-end), so that nothing changes it
    /// meanwhile. Contexts with doorbell pages cannot migrate (spec 20.2):
    /// the destination's VMM maps a shared memory region only while the
    /// device runs, that is once the guest runs again, and a producer
    /// index the guest stores before the map would be lost.
    pub fn save_state(&self) -> Result<Vec<u8>, MigrationError> {
        self.save(false)
    }

    /// Saves the device state for a hand-over to a new daemon (spec 20.7):
    /// with the doorbell pages and slots, whose region goes along as a
    /// file ([`RdmaDevice::doorbell_region`]).
    pub fn save_for_hand_over(&self) -> Result<Vec<u8>, MigrationError> {
        self.save(true)
    }

    /// The doorbell region, for a hand-over, and whether the VMM maps it
    /// into the guest.
    pub fn doorbell_region(&self) -> Option<(Arc<crate::shmem::DoorbellRegion>, bool)> {
        self.shmem.as_ref().map(|l| (l.region(), l.is_mapped()))
    }

    fn save(&self, hand_over: bool) -> Result<Vec<u8>, MigrationError> {
        if self.running() {
            return Err(MigrationError::NotSavable("the device is running".into()));
        }
        let (identity, name) = self.identity();
        let rnic = self.cell.lock().vm.rnic.clone();
        if hand_over && rnic.loads_host_state() {
            // The host NIC's objects belong to this process and die with
            // it; the peers' connections to them cannot follow (spec 20.7).
            return Err(MigrationError::NotSavable(
                "a hand-over cannot take host RNIC objects to a new process".into(),
            ));
        }
        self.wait_host_at_rest(rnic.as_ref())?;
        let guarded = self.cell.lock();
        let vm = &guarded.vm;
        let objects = migration::save::objects(&vm.res, Instant::now())?;
        let host = vm.rnic.save_host(self.id).map_err(|e| {
            MigrationError::NotSavable(format!(
                "the host RNIC's QPs cannot be saved ({e}): requests in flight, or a QP \
                 connected through the CM bridge"
            ))
        })?;
        let doorbells = migration::save::doorbells(&vm.res);
        if doorbells.is_some() && !hand_over {
            return Err(MigrationError::NotSavable(
                "contexts with shared-memory doorbell pages do not migrate: the destination \
                 could map the region only after the guest runs again"
                    .into(),
            ));
        }
        let mut keys = crate::keys::KeySource::new();
        let hi = keys
            .next_u32()
            .map_err(|e| MigrationError::NotSavable(e.to_string()))?;
        let lo = keys
            .next_u32()
            .map_err(|e| MigrationError::NotSavable(e.to_string()))?;
        let id = (u64::from(hi) << 32) | u64::from(lo);
        let state = DeviceState {
            vm: name,
            migration_id: id,
            features: vm.features,
            guid: vm.port.guid,
            events: migration::save::events(&vm.events),
            objects,
            doorbells,
            host,
        };
        let bytes = migration::encode(&state)?;
        lock(&self.board.saved).insert(
            identity,
            Saved {
                id,
                from: self.id,
                cell: self.cell.clone(),
                at: Instant::now(),
            },
        );
        Ok(bytes)
    }

    /// This instance was reset or its VMM went away (under its lock,
    /// `st`), releasing objects whose connected peers are `gone`: if it had
    /// saved its state on a host RNIC and not started since, the state may
    /// live on at a destination on another host (spec 20.8), so its peers
    /// are left to the move (pointed there, or failed by their own
    /// retries if it never comes) and `gone` is emptied.
    pub(super) fn keep_moved_peers(
        &self,
        identity: usize,
        st: &crate::vm::cell::Guarded,
        gone: &mut Vec<(u32, u64)>,
    ) {
        if gone.is_empty()
            || !st.vm.rnic.loads_host_state()
            || !self.board.saved_here(identity, self.id)
        {
            return;
        }
        info!(
            "VM {}: released after its state was saved: its {} peers' connections are left to \
             the move",
            self.id,
            gone.len()
        );
        gone.clear();
    }

    /// Waits until the host halves of this stopped instance are at rest
    /// (a host RNIC completes what it took after the stop; the data path
    /// applies it): at most [`HOST_REST_WAIT`], else the state cannot be
    /// saved yet.
    fn wait_host_at_rest(
        &self,
        rnic: &dyn crate::rnic_objects::RnicObjects,
    ) -> Result<(), MigrationError> {
        let since = Instant::now();
        // The engine looks at the VM again after `since`.
        self.cell.kick();
        while !rnic.host_at_rest(self.id, since) {
            if since.elapsed() >= HOST_REST_WAIT {
                return Err(MigrationError::NotSavable(format!(
                    "the host RNIC still had requests in flight {} s after the stop",
                    HOST_REST_WAIT.as_secs()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.cell.kick();
        }
        Ok(())
    }

    /// Loads a saved state into this instance, which must be stopped, have
    /// no objects and be an instance of the VM that saved it, and puts the
    /// objects in place with every check done (a refusal changes nothing).
    /// QEMU sends the state before it negotiates features and sends the
    /// memory table: then the checks that need them (the features equal to
    /// the state's, every address inside guest RAM) run at the device's
    /// start instead (`RdmaDevice::start_loaded`), where a mismatch fails
    /// the device (spec 20.1). If an instance of this daemon saved the
    /// state (the VM's other instance, stopped since), the VM's QP numbers
    /// move from there; else they must be free on this RNIC.
    pub fn load_state(&self, bytes: &[u8]) -> Result<(), MigrationError> {
        self.load(bytes, None)
    }

    /// Loads the state of a hand-over (spec 20.7): as
    /// [`RdmaDevice::load_state`], and with the predecessor's doorbell
    /// region, if it had one: the memfd and whether the VMM maps it. The
    /// instance then serves that region (the guest's mapping of it stays
    /// valid), with the pages and slots the state gives.
    pub fn load_handed_over(
        &self,
        bytes: &[u8],
        region: Option<(std::os::fd::OwnedFd, bool)>,
    ) -> Result<(), MigrationError> {
        let region = match (region, &self.shmem) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(MigrationError::Invalid(
                    "a doorbell region came, this instance has no shared-memory doorbells".into(),
                ))
            }
            (Some((fd, mapped)), Some(_)) => {
                let r = crate::shmem::DoorbellRegion::adopt(fd, self.limits.max_ctx)
                    .map_err(|e| MigrationError::Invalid(e.to_string()))?;
                Some((r, mapped))
            }
        };
        self.load(bytes, Some(region))
    }

    /// `region`: `None` for a migration, `Some` for a hand-over (with the
    /// predecessor's doorbell region if it had one).
    fn load(
        &self,
        bytes: &[u8],
        region: Option<Option<(crate::shmem::DoorbellRegion, bool)>>,
    ) -> Result<(), MigrationError> {
        if self.running() {
            return Err(MigrationError::Invalid("the device is running".into()));
        }
        let state = migration::decode(bytes, self.state_bound())?;
        let region = match region {
            None if state.doorbells.is_some() => {
                return Err(MigrationError::Invalid(
                    "doorbell pages come only with a hand-over, and their region".into(),
                ))
            }
            None => None,
            Some(None) if state.doorbells.is_some() => {
                return Err(MigrationError::Invalid(
                    "doorbell pages without their region".into(),
                ))
            }
            Some(r) => r,
        };
        let (_, name) = self.identity();
        if state.vm != name {
            return Err(MigrationError::Invalid(format!(
                "the state is VM {:?}'s, this instance is VM {name:?}'s",
                state.vm
            )));
        }
        let mut guarded = self.cell.lock();
        if !guarded.vm.res.counts().is_empty() {
            return Err(MigrationError::Invalid(
                "the destination instance already has objects".into(),
            ));
        }
        let early = guarded.vm.features == 0 || guarded.vm.ram.total_bytes() == 0;
        let features = state.features;
        // The attributes are checked against the state's features, which
        // the start checks the negotiated ones against.
        let negotiated = guarded.vm.features;
        if early {
            guarded.vm.features = features;
        }
        if let Err(e) = self.install(state, &mut guarded, early, region) {
            guarded.vm.features = negotiated;
            return Err(e);
        }
        if early {
            info!("VM {name:?}: device state loaded; its memory and features are checked at the start");
            *lock(&self.pending) = Some(features);
        }
        Ok(())
    }

    /// At the device's start, under its lock (`st`): the checks a state
    /// loaded before the memory table and features could not have (spec
    /// 20.1). On a mismatch every object goes and the device fails
    /// (`DEVICE_FATAL`): the migration can no longer be refused; what is
    /// returned then is for [`crate::engine::Engine::peers_gone`], once the
    /// lock is released.
    pub(crate) fn start_loaded(
        &self,
        st: &mut Guarded,
    ) -> Option<(crate::gid_table::GidTable, Vec<(u32, u64)>)> {
        let features = lock(&self.pending).take()?;
        let vm = &mut st.vm;
        let checked = if features != vm.features {
            Err(MigrationError::Invalid(format!(
                "saved with features {features:#x}, the destination negotiated {:#x}",
                vm.features
            )))
        } else {
            migration::restore::check_ram(&vm.res, &vm.ram)
        };
        if let Err(e) = checked {
            log::error!("VM {}: the loaded device state does not fit: {e}", self.id);
            let gone = vm.reset();
            vm.events
                .push(virtio_rdma_abi::event::EventKind::DEVICE_FATAL, 0, 0);
            return Some((*vm.gids(), gone));
        }
        None
    }

    /// Puts `state` in place in this instance (no objects), under its
    /// lock; `early`: its features and memory table are not known yet.
    fn install(
        &self,
        state: DeviceState,
        guarded: &mut Guarded,
        early: bool,
        region: Option<(crate::shmem::DoorbellRegion, bool)>,
    ) -> Result<(), MigrationError> {
        let (identity, name) = self.identity();
        let saved = lock(&self.board.saved)
            .get(&identity)
            .filter(|s| s.id == state.migration_id && s.from != self.id)
            .cloned();
        let vm = &mut guarded.vm;
        if !early && state.features != vm.features {
            return Err(MigrationError::Invalid(format!(
                "saved with features {:#x}, the destination negotiated {:#x}",
                state.features, vm.features
            )));
        }
        let events = migration::restore::events(&state.events)?;
        let now = Instant::now();
        let anywhere = RamMap::from_ranges(&[(0, u64::MAX)]);
        let ram = if early { &anywhere } else { &vm.ram };
        let checker: &crate::vm::VmState = vm;
        let check_attr = |t, a: &virtio_rdma_abi::qp::QpAttr| checker.check_loaded_attr(t, a);
        let res = match &saved {
            None => migration::restore::objects(
                &state.objects,
                &Target {
                    vm: self.id,
                    limits: &self.limits,
                    ram,
                    rnic: vm.rnic.as_ref(),
                    numbers: Numbers::Claim,
                    check_attr: &check_attr,
                    host: state.host.as_ref(),
                },
                now,
            )?,
            Some(s) => {
                // This instance's lock, then the source's: only a load takes
                // two, and the engine never waits for one.
                let mut src = s.cell.lock();
                if s.cell.running() {
                    return Err(MigrationError::Invalid(
                        "the instance that saved the state runs again".into(),
                    ));
                }
                let res = migration::restore::objects(
                    &state.objects,
                    &Target {
                        vm: self.id,
                        limits: &self.limits,
                        ram,
                        rnic: vm.rnic.as_ref(),
                        numbers: Numbers::Rehome {
                            from: s.from,
                            source: &src.vm.res,
                        },
                        check_attr: &check_attr,
                        host: state.host.as_ref(),
                    },
                    now,
                )?;
                // The source keeps nothing: its objects' numbers are this
                // instance's now, and its reset or disconnect must neither
                // release them nor fail their peers.
                let budget = src.vm.limits.max_host_bytes;
                let doorbells = src.vm.res.doorbells.take();
                let mut empty = VmResources::new(s.from, budget);
                empty.doorbells = doorbells;
                let old = std::mem::replace(&mut src.vm.res, empty);
                drop(src);
                drop(old);
                lock(&self.board.saved).remove(&identity);
                lock(&self.board.taken).insert(
                    identity,
                    Taken {
                        saved_at: s.at,
                        from: s.from,
                        from_cell: s.cell.clone(),
                        to: self.id,
                        to_cell: self.cell.clone(),
                    },
                );
                info!(
                    "VM {name:?}: the state of instance {} moved to instance {}",
                    s.from, self.id
                );
                res
            }
        };
        let mut res = res;
        match (region, &self.shmem) {
            // A hand-over's region: the instance serves it from now on,
            // with the pages and slots of the state.
            (Some((region, mapped)), Some(link)) => {
                let region = Arc::new(region);
                let pages = link.pages_over(region.clone());
                let none = migration::state::DoorbellsState::default();
                let saved = state.doorbells.as_ref().unwrap_or(&none);
                let placed =
                    migration::restore::doorbells(saved, &mut res, pages, self.limits.max_ctx);
                if let Err(e) = placed {
                    // What the objects claimed on the RNIC goes back.
                    res.clear(vm.rnic.as_ref());
                    crate::memory::pagelist::release_all(res.take_released());
                    return Err(e);
                }
                link.install(region, mapped);
            }
            // The doorbell region is this instance's (spec 20.2: not saved).
            _ => res.doorbells = vm.res.doorbells.take(),
        }
        if state.host.is_some() {
            // Which QP incarnation a connection's destination was is the
            // source daemon's bookkeeping: here the destinations are
            // elsewhere, or other objects (spec 20.8).
            for h in res.qps.handles() {
                if let Some(q) = res.qps.get_mut(h) {
                    q.rt.dest_incarnation = None;
                }
            }
        }
        let old = std::mem::replace(&mut vm.res, res);
        drop(old);
        vm.events = events;
        vm.port.guid = state.guid;
        // The engine's lists of the VM are built again at its start.
        vm.engine_work = true;
        self.cell.engine_changed(vm);
        self.tenancy.set_active(identity, self.id);
        Ok(())
    }
}
