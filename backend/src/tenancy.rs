//! Tenants, the VMs in them, and the isolation policy between them.
//!
//! Every VM belongs to one tenant (a virtual network) and has the GID table
//! the operator's configuration gives it; the guest cannot change it (there
//! is no command for it, and every message's source address is an entry of
//! its port's table). A VM reaches only
//! VMs of its own tenant: QP numbers and GIDs of other tenants resolve to
//! nothing, exactly as if they did not exist, so probing them teaches a
//! guest nothing — and every such attempt is counted in the VM's
//! [`IsolationCounters`] for the operator to see.
//!
//! The table is built once at start (GIDs and tenants do not change while
//! the daemon runs); only the counters move.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{DaemonConfig, FabricPolicy};
use crate::gid_table::GidTable;
use crate::stats::TrafficCounters;

crate::stats::counters! {
    /// Counters of isolation-relevant events of one VM (the VM is the one
    /// that caused them).
    pub struct IsolationCounters;
    /// A snapshot of [`IsolationCounters`].
    pub struct IsolationStats;
    counters {
        /// Control commands refused with `DENIED` (a destination outside the
        /// tenant, an address vector field the tenant's fabric rules do not
        /// allow).
        denied,
        /// UD messages to a destination outside the tenant, dropped.
        foreign_drops,
        /// RC messages to a destination outside the tenant, not delivered.
        foreign_rc,
        /// Messages to a QP number that does not exist in the tenant (QPN
        /// probing), and XRC messages naming an SRQ number the target QP's
        /// domain does not have (SRQ number probing).
        unknown_qpn,
        /// Remote accesses refused for an rkey that names no MR of the
        /// responder, or one of another PD (rkey probing).
        bad_rkey,
        /// Attempts to send from a GID that is not the VM's own: a source
        /// GID index past the table or naming an unassigned entry.
        gid_spoof,
        /// Attempts at what only a privileged consumer of a fabric may use:
        /// a privileged Q_Key (bit 31) refused by `MODIFY_QP`, a UD send to
        /// QP 0 or 1 (the ports' management QPs) refused on the data path.
        privileged,
    }
}

impl IsolationCounters {
    /// Adds one to `counter` (a field of `self`).
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One VM of the daemon.
#[derive(Debug)]
pub struct VmEntry {
    /// Its name.
    pub name: String,
    /// Index of its tenant in [`Tenancy::tenants`].
    pub tenant: usize,
    /// Its port's GID table.
    pub gids: GidTable,
    /// The ABI version its device reports (2 or 3).
    pub abi: u32,
    /// MAC address of the guest interface its port is paired with
    /// (`DeviceConfig.mac`); `None`: none configured.
    pub mac: Option<[u8; 6]>,
    /// Its isolation counters.
    pub counters: IsolationCounters,
    /// Its traffic and control counters.
    pub traffic: TrafficCounters,
    /// The VM whose identity it has: its own index, or that of the VM it
    /// is the standby of (spec 20.5).
    pub identity: usize,
    /// For a VM that is its own identity: the instance that holds it now
    /// (itself, or its standby after a migration).
    active: std::sync::atomic::AtomicUsize,
}

impl VmEntry {
    /// The instance (VM index) that holds this identity now.
    pub fn active(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// One tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantEntry {
    /// Its name.
    pub name: String,
    /// Its QoS class, if any.
    pub qos_class: Option<String>,
    /// Remote GIDs its VMs may name (`verbs` RNIC).
    pub remote_gids: Vec<[u8; 16]>,
    /// Its rules for address vector fields that reach the fabric.
    pub fabric: FabricPolicy,
}

/// The tenancy table of the daemon.
#[derive(Debug, Default)]
pub struct Tenancy {
    vms: Vec<VmEntry>,
    tenants: Vec<TenantEntry>,
    by_gid: HashMap<[u8; 16], usize>,
}

impl Tenancy {
    /// The table of a (validated) configuration: VM `i` is `config.vms[i]`
    /// with its configured GID table ([`DaemonConfig::gid_table`]).
    pub fn from_config(config: &DaemonConfig) -> Self {
        let tables: Vec<GidTable> = (0..config.vms.len()).map(|i| config.gid_table(i)).collect();
        Self::with_gid_tables(config, &tables)
    }

    /// The table of a (validated) configuration whose VM `i` has the GID
    /// table `tables[i]` (what its RNIC gives its port).
    pub fn with_gid_tables(config: &DaemonConfig, tables: &[GidTable]) -> Self {
        let tenants: Vec<TenantEntry> = config
            .tenants
            .iter()
            .map(|t| TenantEntry {
                name: t.name.clone(),
                qos_class: t.qos_class.clone(),
                remote_gids: t.remote_gids.clone(),
                fabric: t.fabric.clone(),
            })
            .collect();
        let mut t = Tenancy {
            vms: Vec::new(),
            tenants,
            by_gid: HashMap::new(),
        };
        for (i, vm) in config.vms.iter().enumerate() {
            let tenant = t
                .tenants
                .iter()
                .position(|x| x.name == vm.tenant)
                .unwrap_or(0);
            let gids = tables
                .get(i)
                .copied()
                .unwrap_or_else(|| config.gid_table(i));
            let identity = config.identity(i);
            for (_, g) in gids.iter().filter(|_| identity == i) {
                // A host RNIC gives every VM its one GID: the first VM
                // keeps it here (routing there goes by QP number).
                t.by_gid.entry(g).or_insert(i);
            }
            t.vms.push(VmEntry {
                name: vm.name.clone(),
                tenant,
                gids,
                abi: vm.abi,
                mac: vm.mac,
                counters: IsolationCounters::default(),
                traffic: TrafficCounters::default(),
                identity,
                active: std::sync::atomic::AtomicUsize::new(i),
            });
        }
        t
    }

    /// Makes instance `to` the holder of VM `identity`'s identity (a state
    /// moved there, spec 20.5): GIDs then lead to it.
    pub fn set_active(&self, identity: usize, to: usize) {
        if let Some(v) = self.vms.get(identity) {
            v.active.store(to, std::sync::atomic::Ordering::Release);
        }
    }

    /// VM `vm`.
    pub fn vm(&self, vm: usize) -> Option<&VmEntry> {
        self.vms.get(vm)
    }

    /// Every VM, by index.
    pub fn vms(&self) -> &[VmEntry] {
        &self.vms
    }

    /// Every tenant, by index.
    pub fn tenants(&self) -> &[TenantEntry] {
        &self.tenants
    }

    /// The tenant of VM `vm`.
    pub fn tenant_of(&self, vm: usize) -> Option<usize> {
        self.vms.get(vm).map(|v| v.tenant)
    }

    /// The VM whose port has `gid` (at any index of its table).
    pub fn vm_by_gid(&self, gid: &[u8; 16]) -> Option<usize> {
        let identity = *self.by_gid.get(gid)?;
        self.vms.get(identity).map(VmEntry::active)
    }

    /// Whether VM `from` may reach VM `to` (same tenant; a VM always
    /// reaches itself).
    pub fn may_reach(&self, from: usize, to: usize) -> bool {
        from == to
            || matches!(
                (self.tenant_of(from), self.tenant_of(to)),
                (Some(a), Some(b)) if a == b
            )
    }

    /// Whether VM `vm` may name `gid` of a remote host (its tenant lists
    /// it).
    pub fn may_reach_remote(&self, vm: usize, gid: &[u8; 16]) -> bool {
        self.tenant_of(vm)
            .and_then(|t| self.tenants.get(t))
            .is_some_and(|t| t.remote_gids.contains(gid))
    }

    /// The fabric rules of VM `vm`'s tenant.
    pub fn fabric_of(&self, vm: usize) -> Option<&FabricPolicy> {
        self.tenant_of(vm)
            .and_then(|t| self.tenants.get(t))
            .map(|t| &t.fabric)
    }

    /// The counters of VM `vm`; a VM outside the table counts nowhere.
    pub fn counters(&self, vm: usize) -> Option<&IsolationCounters> {
        self.vms.get(vm).map(|v| &v.counters)
    }

    /// The traffic counters of VM `vm`.
    pub fn traffic(&self, vm: usize) -> Option<&TrafficCounters> {
        self.vms.get(vm).map(|v| &v.traffic)
    }

    /// Index of the VM named `name`.
    pub fn vm_index(&self, name: &str) -> Option<usize> {
        self.vms.iter().position(|v| v.name == name)
    }

    /// Index of the tenant named `name`.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }
}

impl crate::qos::Membership for Tenancy {
    fn vm_count(&self) -> usize {
        self.vms.len()
    }

    fn tenant_of(&self, vm: usize) -> Option<usize> {
        Tenancy::tenant_of(self, vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantConfig;

    #[test]
    fn reach_follows_tenants() {
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into(), "/c".into()]);
        c.tenants.push(TenantConfig {
            nic_share: 1,
            name: "red".into(),
            qos_class: None,
            engine: None,
            remote_gids: Vec::new(),
            fabric: Default::default(),
        });
        c.vms[2].tenant = "red".into();
        let t = Tenancy::from_config(&c);
        assert!(t.may_reach(0, 1));
        assert!(t.may_reach(2, 2));
        assert!(!t.may_reach(0, 2));
        assert!(!t.may_reach(2, 1));
        assert!(!t.may_reach(0, 7));
        assert_eq!(t.vm_by_gid(&c.gid(2)), Some(2));
        assert_eq!(t.vm_index("vm1"), Some(1));
        assert_eq!(t.tenant_index("red"), Some(1));
        let n = t.counters(2).map(|c| {
            IsolationCounters::bump(&c.foreign_drops);
            c.snapshot().foreign_drops
        });
        assert_eq!(n, Some(1));
    }
}
