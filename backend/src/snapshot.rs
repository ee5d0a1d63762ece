//! Point-in-time snapshots of every VM's state and counters, and their sums
//! per tenant: what the operator interfaces ([`crate::mgmt`],
//! [`crate::metrics`]) report.

use crate::device::QueueDepths;
use crate::qos::QosSpec;
use crate::resources::ResourceCounts;
use crate::rnic_objects::HostUsage;
use crate::stats::TrafficStats;
use crate::tenancy::IsolationStats;
use crate::view::{DaemonView, VmStats};
use crate::vm::CtrlStats;

/// Everything reported about one VM.
#[derive(Debug, Clone, Default)]
pub struct VmSnapshot {
    /// Its index.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// Index of its tenant.
    pub tenant: usize,
    /// Name of its tenant.
    pub tenant_name: String,
    /// Connection state and device counters.
    pub stats: VmStats,
    /// Traffic and control counters, control-latency histogram.
    pub traffic: TrafficStats,
    /// Isolation counters.
    pub isolation: IsolationStats,
    /// Current QoS settings.
    pub qos: Option<QosSpec>,
    /// Its part of the host NIC and of the daemon's mappings (`verbs`).
    pub host: Option<HostUsage>,
}

/// Sums over a group of VMs (a tenant).
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// VMs summed.
    pub vms: u64,
    /// Of them, connected now.
    pub connected: u64,
    /// VMM connections accepted.
    pub connections: u64,
    /// Of them, reported with last-known device values (their state lock
    /// was busy: [`crate::view::VmStats::stale_ms`]).
    pub stale: u64,
    /// Live objects and registered bytes.
    pub resources: ResourceCounts,
    /// Control commands completed by the devices.
    pub ctrl: CtrlStats,
    /// Events lost.
    pub events_lost: u64,
    /// Work waiting in the queues.
    pub queues: QueueDepths,
    /// Traffic counters and the merged latency histogram.
    pub traffic: TrafficStats,
    /// Isolation counters.
    pub isolation: IsolationStats,
    /// Parts of the host NIC and of the daemon's mappings (`verbs`).
    pub host: Option<HostUsage>,
}

impl Totals {
    /// Adds one VM.
    pub fn add(&mut self, s: &VmSnapshot) {
        self.vms += 1;
        self.connected += u64::from(s.stats.connected);
        self.connections += s.stats.connections;
        self.stale += u64::from(s.stats.stale_ms.is_some());
        let d = &s.stats.device;
        self.resources.add(&d.resources);
        self.ctrl.add(&d.ctrl);
        self.events_lost += d.events_lost;
        self.queues.add(&d.queues);
        self.traffic.add(&s.traffic);
        self.isolation.add(&s.isolation);
        if let Some(h) = &s.host {
            self.host.get_or_insert_with(HostUsage::default).add(h);
        }
    }
}

/// Snapshot of VM `index`.
pub fn vm(view: &DaemonView, index: usize) -> Option<VmSnapshot> {
    let tn = view.tenancy();
    let vm = tn.vm(index)?;
    Some(VmSnapshot {
        index,
        name: vm.name.clone(),
        tenant: vm.tenant,
        tenant_name: tn
            .tenants()
            .get(vm.tenant)
            .map(|t| t.name.clone())
            .unwrap_or_default(),
        stats: view.vm_stats(index).unwrap_or_default(),
        traffic: vm.traffic.snapshot(),
        isolation: vm.counters.snapshot(),
        qos: view.qos().vm(index),
        host: view.host_usage(index),
    })
}

/// Snapshots of every VM, by index.
pub fn vms(view: &DaemonView) -> Vec<VmSnapshot> {
    (0..view.tenancy().vms().len())
        .filter_map(|i| vm(view, i))
        .collect()
}

/// The sums of `vms` per tenant, by tenant index.
pub fn tenant_totals(view: &DaemonView, vms: &[VmSnapshot]) -> Vec<Totals> {
    let mut t = vec![Totals::default(); view.tenancy().tenants().len()];
    for s in vms {
        if let Some(tt) = t.get_mut(s.tenant) {
            tt.add(s);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_everything() {
        let mut s = VmSnapshot::default();
        s.stats.connected = true;
        s.stats.connections = 2;
        s.stats.device.resources.qp = 3;
        s.stats.device.resources.registered_bytes = 4096;
        s.stats.device.resources.host_bytes = 300;
        s.stats.device.ctrl.failed = 1;
        s.traffic.send_bytes = 10;
        s.traffic.ctrl_latency.buckets[1] = 2;
        s.traffic.ctrl_latency.count = 2;
        s.isolation.gid_spoof = 1;
        let mut t = Totals::default();
        t.add(&s);
        t.add(&s);
        assert_eq!((t.vms, t.connected, t.connections), (2, 2, 4));
        assert_eq!(t.resources.qp, 6);
        assert_eq!(t.resources.registered_bytes, 8192);
        assert_eq!(t.resources.host_bytes, 600);
        assert_eq!(t.ctrl.failed, 2);
        assert_eq!(t.traffic.send_bytes, 20);
        assert_eq!(t.traffic.ctrl_latency.buckets[1], 4);
        assert_eq!(t.traffic.ctrl_latency.count, 4);
        assert_eq!(t.isolation.gid_spoof, 2);
        assert_eq!(
            t.resources.fields()[3..],
            [
                ("qp", 6),
                ("mr", 0),
                ("mw", 0),
                ("srq", 0),
                ("ah", 0),
                ("xrcd", 0),
                ("registered_bytes", 8192),
                ("host_bytes", 600)
            ]
        );
        assert_eq!(
            t.ctrl.fields(),
            [("ok", 0), ("failed", 2), ("malformed", 0)]
        );
    }
}
