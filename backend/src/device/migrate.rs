//! Saving this VM's device state and loading one into it (spec chapter
//! 20): what `SET_DEVICE_STATE_FD` runs once the front-end has stopped the
//! device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use log::info;

use crate::migration::restore::{Numbers, Target};
use crate::migration::{self, DeviceState, MigrationError};
use crate::resources::{ResourceCounts, VmResources};
use crate::sync::lock;
use crate::vm::cell::VmCell;

use super::RdmaDevice;

/// A state saved in this daemon and not yet taken: which instance saved
/// it, and its migration id.
#[derive(Clone)]
struct Saved {
    id: u64,
    from: usize,
    cell: Arc<VmCell>,
}

/// The states saved by this daemon's instances, by the VM (identity) they
/// are of: the last one of each VM, until an instance of the same VM takes
/// it or the saving instance starts again (spec 20.5).
#[derive(Default)]
pub struct MigrationBoard {
    saved: Mutex<HashMap<usize, Saved>>,
}

impl MigrationBoard {
    /// Forgets the state instance `vm` saved of VM `identity`: the instance
    /// started again, and its objects may change.
    pub(crate) fn started(&self, identity: usize, vm: usize) {
        let mut saved = lock(&self.saved);
        if saved.get(&identity).is_some_and(|s| s.from == vm) {
            saved.remove(&identity);
        }
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

    /// Saves the device state. The device must be stopped (its queues
    /// stopped by the front-end), so that nothing changes it meanwhile.
    pub fn save_state(&self) -> Result<Vec<u8>, MigrationError> {
        if self.running() {
            return Err(MigrationError::NotSavable("the device is running".into()));
        }
        let (identity, name) = self.identity();
        let guarded = self.cell.lock();
        let vm = &guarded.vm;
        let objects = migration::save::objects(&vm.res, Instant::now())?;
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
        };
        let bytes = migration::encode(&state)?;
        lock(&self.board.saved).insert(
            identity,
            Saved {
                id,
                from: self.id,
                cell: self.cell.clone(),
            },
        );
        Ok(bytes)
    }

    /// Loads a saved state into this instance, which must be stopped, have
    /// no objects, be an instance of the VM that saved it and have
    /// negotiated the same features. If an instance of this daemon saved
    /// it (the VM's other instance, stopped since), the VM's QP numbers
    /// move from there to here and that instance is left without objects;
    /// else they must be free on this RNIC (a state from another daemon).
    /// A refused state changes nothing.
    pub fn load_state(&self, bytes: &[u8]) -> Result<(), MigrationError> {
        if self.running() {
            return Err(MigrationError::Invalid("the device is running".into()));
        }
        let state = migration::decode(bytes, self.state_bound())?;
        let (identity, name) = self.identity();
        if state.vm != name {
            return Err(MigrationError::Invalid(format!(
                "the state is VM {:?}'s, this instance is VM {name:?}'s",
                state.vm
            )));
        }
        let saved = lock(&self.board.saved)
            .get(&identity)
            .filter(|s| s.id == state.migration_id)
            .cloned();
        if saved.as_ref().is_some_and(|s| s.from == self.id) {
            return Err(MigrationError::Invalid(
                "the state was saved by this instance and its objects are still here".into(),
            ));
        }
        let mut guarded = self.cell.lock();
        let vm = &mut guarded.vm;
        if vm.res.counts() != ResourceCounts::default() {
            return Err(MigrationError::Invalid(
                "the destination instance already has objects".into(),
            ));
        }
        if state.features != vm.features {
            return Err(MigrationError::Invalid(format!(
                "saved with features {:#x}, the destination negotiated {:#x}",
                state.features, vm.features
            )));
        }
        let events = migration::restore::events(&state.events)?;
        let now = Instant::now();
        let checker: &crate::vm::VmState = vm;
        let check_attr = |t, a: &virtio_rdma_abi::qp::QpAttr| checker.check_loaded_attr(t, a);
        let res = match &saved {
            None => migration::restore::objects(
                &state.objects,
                &Target {
                    vm: self.id,
                    limits: &self.limits,
                    ram: &vm.ram,
                    rnic: vm.rnic.as_ref(),
                    numbers: Numbers::Claim,
                    check_attr: &check_attr,
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
                        ram: &vm.ram,
                        rnic: vm.rnic.as_ref(),
                        numbers: Numbers::Rehome {
                            from: s.from,
                            source: &src.vm.res,
                        },
                        check_attr: &check_attr,
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
                self.tenancy.set_active(identity, self.id);
                lock(&self.board.saved).remove(&identity);
                info!(
                    "VM {name:?}: the state of instance {} moved to instance {}",
                    s.from, self.id
                );
                res
            }
        };
        let mut res = res;
        // The doorbell region is this instance's (spec 20.2: not saved).
        res.doorbells = vm.res.doorbells.take();
        let old = std::mem::replace(&mut vm.res, res);
        drop(old);
        vm.events = events;
        vm.port.guid = state.guid;
        // The engine's lists of the VM are built again at its start.
        vm.engine_work = true;
        self.cell.engine_changed(vm);
        if saved.is_none() {
            self.tenancy.set_active(identity, self.id);
        }
        Ok(())
    }
}
