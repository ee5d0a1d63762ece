//! Quality of service: per-VM and per-tenant rate limits and the weights of
//! weighted fair sharing — the settings, changeable while the daemon runs,
//! and the code that enforces them.
//!
//! A [`QosSpec`] is what an operator sets: a weight and rate limits (bytes
//! per second, work requests per second, control commands per second; 0
//! means unlimited). Classes (`[[qos_class]]` in the configuration file)
//! name specs. A tenant's class sets its share of the engine among the
//! tenants with work, and limits on the sum of its VMs' traffic; a VM's
//! class sets its share of its tenant's part among the tenant's VMs with
//! work, and its own limits.
//!
//! [`QosTable`] holds the live values. Readers (the engine, the control
//! workers) poll its generation and re-read on change, so an update never
//! blocks the data path.
//!
//! Files:
//! - this one: the settings ([`QosSpec`], [`QosClass`], [`QosTable`]);
//! - [`bucket`]: the token bucket of every rate limit, data path and
//!   control commands alike;
//! - [`ctrl_limit`]: the control-command rate limits of VMs and tenants,
//!   as their control workers enforce them;
//! - [`drr`]: weighted fair sharing of an engine thread's time
//!   (hierarchical deficit round robin) and its cost model;
//! - [`rate_limits`]: the data-path rate limits of VMs and tenants, as an
//!   engine thread enforces them, and the size of a VM's bursts.

pub mod bucket;
pub mod ctrl_limit;
pub mod drr;
pub mod rate_limits;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::sync::{read, write};
use thiserror::Error;

/// Largest weight (a VM with weight 1000 next to one with weight 1 gets
/// 1000 times its share).
pub const MAX_WEIGHT: u32 = 1000;
/// Default weight.
pub const DEFAULT_WEIGHT: u32 = 100;
/// Default control-command rate limit of a VM (commands per second). Ample
/// for real set-up work (10,000 QPs with their CQs and MRs in a few
/// seconds), and what keeps a VM that floods its control queue from taking
/// CPU time from everyone else (docs/isolation.md, "Control-command
/// fairness"). A class that sets `ctrl_per_sec = 0` is unlimited.
pub const DEFAULT_CTRL_PER_SEC: u64 = 20_000;

/// QoS settings that are out of range.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QosError {
    /// The weight is 0 or above [`MAX_WEIGHT`].
    #[error("weight {0} is out of range (1..={MAX_WEIGHT})")]
    Weight(u32),
    /// No VM with this index or name.
    #[error("no VM {0:?}")]
    UnknownVm(String),
    /// No tenant with this index or name.
    #[error("no tenant {0:?}")]
    UnknownTenant(String),
}

/// Rate limits and weight of a VM or tenant. The default: weight
/// [`DEFAULT_WEIGHT`], no data-path limit, [`DEFAULT_CTRL_PER_SEC`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosSpec {
    /// Share of the engine's time among active VMs (1..=[`MAX_WEIGHT`]).
    pub weight: u32,
    /// Payload bytes per second moved by the VM's send queues; 0: unlimited.
    pub bytes_per_sec: u64,
    /// Send work requests per second; 0: unlimited.
    pub ops_per_sec: u64,
    /// Control commands per second; 0: unlimited.
    pub ctrl_per_sec: u64,
}

impl Default for QosSpec {
    fn default() -> Self {
        QosSpec {
            weight: DEFAULT_WEIGHT,
            bytes_per_sec: 0,
            ops_per_sec: 0,
            ctrl_per_sec: DEFAULT_CTRL_PER_SEC,
        }
    }
}

impl QosSpec {
    /// No limit at all and the default weight: the settings of a tenant
    /// without a QoS class (its VMs are limited one by one).
    pub fn unlimited() -> Self {
        QosSpec {
            ctrl_per_sec: 0,
            ..QosSpec::default()
        }
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), QosError> {
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(QosError::Weight(self.weight));
        }
        Ok(())
    }

    /// Whether any rate is limited.
    pub fn limited(&self) -> bool {
        self.bytes_per_sec != 0 || self.ops_per_sec != 0 || self.ctrl_per_sec != 0
    }
}

/// A named QoS class of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosClass {
    /// Unique name.
    pub name: String,
    /// Its settings.
    pub spec: QosSpec,
}

/// The live QoS settings of every VM and tenant (by index).
#[derive(Debug, Default)]
pub struct QosTable {
    vms: RwLock<Vec<QosSpec>>,
    tenants: RwLock<Vec<QosSpec>>,
    generation: AtomicU64,
}

fn nth<T: Clone>(l: &RwLock<Vec<T>>, i: usize) -> Option<T> {
    read(l).get(i).cloned()
}

impl QosTable {
    /// A table with the given initial settings.
    pub fn new(vms: Vec<QosSpec>, tenants: Vec<QosSpec>) -> Self {
        QosTable {
            vms: RwLock::new(vms),
            tenants: RwLock::new(tenants),
            generation: AtomicU64::new(0),
        }
    }

    /// Changes with every update; readers cache until it moves.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The settings of VM `vm`.
    pub fn vm(&self, vm: usize) -> Option<QosSpec> {
        nth(&self.vms, vm)
    }

    /// The settings of tenant `tenant`.
    pub fn tenant(&self, tenant: usize) -> Option<QosSpec> {
        nth(&self.tenants, tenant)
    }

    /// Every VM's settings, by index.
    pub fn all_vms(&self) -> Vec<QosSpec> {
        read(&self.vms).clone()
    }

    /// Every tenant's settings, by index.
    pub fn all_tenants(&self) -> Vec<QosSpec> {
        read(&self.tenants).clone()
    }

    /// Replaces the settings of VM `vm`.
    pub fn set_vm(&self, vm: usize, spec: QosSpec) -> Result<(), QosError> {
        spec.validate()?;
        let mut v = write(&self.vms);
        let slot = v
            .get_mut(vm)
            .ok_or_else(|| QosError::UnknownVm(vm.to_string()))?;
        *slot = spec;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Replaces the settings of tenant `tenant`.
    pub fn set_tenant(&self, tenant: usize, spec: QosSpec) -> Result<(), QosError> {
        spec.validate()?;
        let mut t = write(&self.tenants);
        let slot = t
            .get_mut(tenant)
            .ok_or_else(|| QosError::UnknownTenant(tenant.to_string()))?;
        *slot = spec;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// What QoS needs of the tenancy table: which tenant each VM belongs to.
pub trait Membership {
    /// Number of VMs (indices `0..vm_count()`).
    fn vm_count(&self) -> usize;
    /// The tenant of VM `vm`.
    fn tenant_of(&self, vm: usize) -> Option<usize>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::Tenancy;

    /// A tenancy of `vms` VMs, VM `i` in tenant `tenant_of[i]`: 0 (the
    /// default tenant) or 1.
    pub(super) fn tenancy(vms: usize, tenant_of: &[usize]) -> Tenancy {
        use crate::config::{DaemonConfig, TenantConfig};
        let sockets = (0..vms).map(|i| format!("/x{i}").into()).collect();
        let mut c = DaemonConfig::new(sockets);
        c.tenants.push(TenantConfig {
            nic_share: 1,
            name: "t1".into(),
            qos_class: None,
            engine: None,
            remote_gids: Vec::new(),
            fabric: Default::default(),
        });
        for (i, &t) in tenant_of.iter().enumerate() {
            c.vms[i].tenant = if t == 0 {
                "default".into()
            } else {
                "t1".into()
            };
        }
        Tenancy::from_config(&c)
    }

    #[test]
    fn updates_bump_generation_and_are_checked() {
        let t = QosTable::new(vec![QosSpec::default(); 2], vec![QosSpec::default()]);
        let g = t.generation();
        let spec = QosSpec {
            weight: 300,
            bytes_per_sec: 1 << 30,
            ..QosSpec::default()
        };
        assert_eq!(t.set_vm(1, spec), Ok(()));
        assert_eq!(t.vm(1), Some(spec));
        assert_eq!(t.vm(0), Some(QosSpec::default()));
        assert!(t.generation() > g);
        let bad = QosSpec {
            weight: 0,
            ..QosSpec::default()
        };
        assert_eq!(t.set_vm(0, bad), Err(QosError::Weight(0)));
        assert!(matches!(t.set_vm(2, spec), Err(QosError::UnknownVm(_))));
        assert!(matches!(
            t.set_tenant(1, spec),
            Err(QosError::UnknownTenant(_))
        ));
        assert_eq!(t.set_tenant(0, spec), Ok(()));
        assert_eq!(t.tenant(0), Some(spec));
    }
}
