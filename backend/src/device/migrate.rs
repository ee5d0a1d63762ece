//! Saving this VM's device state and loading one into it (spec chapter
//! 20): what `SET_DEVICE_STATE_FD` runs once the front-end has stopped the
//! device.

use std::time::Instant;

use crate::migration::{self, DeviceState, MigrationError};
use crate::resources::ResourceCounts;

use super::RdmaDevice;

impl RdmaDevice {
    fn vm_name(&self) -> String {
        self.tenancy
            .vm(self.id)
            .map(|v| v.name.clone())
            .unwrap_or_default()
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
        let guarded = self.cell.lock();
        let vm = &guarded.vm;
        let objects = migration::save::objects(&vm.res, std::time::Instant::now())?;
        let mut keys = crate::keys::KeySource::new();
        let hi = keys
            .next_u32()
            .map_err(|e| MigrationError::NotSavable(e.to_string()))?;
        let lo = keys
            .next_u32()
            .map_err(|e| MigrationError::NotSavable(e.to_string()))?;
        let state = DeviceState {
            vm: self.vm_name(),
            migration_id: (u64::from(hi) << 32) | u64::from(lo),
            features: vm.features,
            guid: vm.port.guid,
            events: migration::save::events(&vm.events),
            objects,
        };
        migration::encode(&state)
    }

    /// Loads a saved state into this instance, which must be stopped, have
    /// no objects and have negotiated the features the state was saved
    /// with. A refused state changes nothing.
    pub fn load_state(&self, bytes: &[u8]) -> Result<(), MigrationError> {
        if self.running() {
            return Err(MigrationError::Invalid("the device is running".into()));
        }
        let state = migration::decode(bytes, self.state_bound())?;
        let name = self.vm_name();
        if state.vm != name {
            return Err(MigrationError::Invalid(format!(
                "the state is VM {:?}'s, this instance is VM {name:?}'s",
                state.vm
            )));
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
        let target = migration::restore::Target {
            vm: self.id,
            limits: &self.limits,
            ram: &vm.ram,
            rnic: vm.rnic.as_ref(),
        };
        let mut res = migration::restore::objects(&state.objects, &target, Instant::now())?;
        // The doorbell region is this instance's (spec 20.2: not saved).
        res.doorbells = vm.res.doorbells.take();
        let old = std::mem::replace(&mut vm.res, res);
        drop(old);
        vm.events = events;
        vm.port.guid = state.guid;
        // The engine's lists of the VM are built again at its start.
        vm.engine_work = true;
        self.cell.engine_changed(vm);
        Ok(())
    }
}
