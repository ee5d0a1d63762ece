//! Each VM's part of the host: its share of the host NIC's objects (what
//! `ibv_query_device` says the NIC has) and of the daemon's mappings
//! (`vm.max_map_count`, `memory::window`).
//!
//! Shares are fixed when the daemon starts: the daemon keeps a part of the
//! NIC for itself and the host ([`NIC_RESERVE_PERCENT`]), the tenants that
//! have VMs split the rest by weight, and each tenant's part is split
//! equally among its VMs. The shares of all VMs together never exceed what
//! there is, so no VM can take what another's share promises. A VM's
//! effective limit is the smaller of its configured limit (`max_qp`, ...,
//! `max_host_mappings`) and its share; an object beyond it is refused with
//! `QUOTA` ([`RnicError::Quota`]) before the NIC is asked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_rdma_abi::ctrl::quota;

use crate::memory::window::{MapBudget, MapCharge, WindowError};
use crate::rnic_objects::{HostQuota, HostUsage, RnicError};

/// The part of each of the NIC's capacities the daemon leaves to no VM: for
/// the host's other users of the NIC and the daemon's own needs.
pub const NIC_RESERVE_PERCENT: u64 = 10;

/// The kinds of host objects a VM's share bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Queue pairs.
    Qp,
    /// Completion queues.
    Cq,
    /// Memory regions.
    Mr,
    /// Protection domains.
    Pd,
    /// Address handles.
    Ah,
    /// Shared receive queues.
    Srq,
}

impl Kind {
    /// Every kind, in the order of [`PerKind`].
    pub const ALL: [Kind; 6] = [Kind::Qp, Kind::Cq, Kind::Mr, Kind::Pd, Kind::Ah, Kind::Srq];

    /// Its name in statistics.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Qp => "qp",
            Kind::Cq => "cq",
            Kind::Mr => "mr",
            Kind::Pd => "pd",
            Kind::Ah => "ah",
            Kind::Srq => "srq",
        }
    }

    fn index(self) -> usize {
        match self {
            Kind::Qp => 0,
            Kind::Cq => 1,
            Kind::Mr => 2,
            Kind::Pd => 3,
            Kind::Ah => 4,
            Kind::Srq => 5,
        }
    }

    /// The `QUOTA` detail of a refusal (spec: the object's quota).
    fn detail(self) -> u32 {
        match self {
            Kind::Qp => quota::QP,
            Kind::Cq => quota::CQ,
            Kind::Mr => quota::MR,
            Kind::Pd => quota::PD,
            Kind::Ah => quota::AH,
            Kind::Srq => quota::SRQ,
        }
    }
}

/// A count per [`Kind`], in the order of [`Kind::ALL`].
pub type PerKind = [u64; 6];

/// Splits `capacity`: `reserve_percent` % (rounded up) is kept back, the
/// rest goes to the tenants that have VMs in proportion to `weights`
/// (tenant `t`'s is `weights[t]`, 1 if missing; 0 counts as 1), and each
/// tenant's part equally to its VMs (`vm_tenant[i]`: VM `i`'s tenant).
/// Rounds down: the shares never sum to more than the rest.
pub fn split(
    capacity: u64,
    reserve_percent: u64,
    vm_tenant: &[usize],
    weights: &[u32],
) -> Vec<u64> {
    let reserve = u128::from(capacity)
        .saturating_mul(u128::from(reserve_percent.min(100)))
        .div_ceil(100);
    let rest = u128::from(capacity).saturating_sub(reserve);
    let weight = |t: usize| u128::from(weights.get(t).copied().unwrap_or(1).max(1));
    let tenants = vm_tenant
        .iter()
        .copied()
        .max()
        .map_or(0, |m| m.saturating_add(1));
    let mut vms_of = vec![0u128; tenants];
    for &t in vm_tenant {
        if let Some(n) = vms_of.get_mut(t) {
            *n += 1;
        }
    }
    let total: u128 = (0..tenants)
        .filter(|&t| vms_of.get(t).is_some_and(|&n| n > 0))
        .map(weight)
        .sum();
    vm_tenant
        .iter()
        .map(|&t| {
            let n = vms_of.get(t).copied().unwrap_or(1).max(1);
            let part = rest
                .saturating_mul(weight(t))
                .checked_div(total)
                .unwrap_or(0);
            u64::try_from(part / n).unwrap_or(u64::MAX)
        })
        .collect()
}

/// Mappings a libibverbs provider makes for each host queue: soft-RoCE
/// (`rxe`) maps its send and receive queues for a QP and its queue for a
/// CQ or SRQ; `siw` likewise; hardware providers map queue buffers,
/// doorbell records and pages. Conservative: an estimate too high costs a
/// VM some objects, one too low lets the kernel's limit be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapCosts {
    /// Per QP.
    pub qp: usize,
    /// Per CQ.
    pub cq: usize,
    /// Per SRQ.
    pub srq: usize,
}

impl MapCosts {
    /// The costs for device `name` (by its provider's naming: `rxe0`,
    /// `siw0`; anything else is taken for hardware).
    pub fn of_device(name: &str) -> MapCosts {
        if name.starts_with("rxe") || name.starts_with("siw") {
            MapCosts {
                qp: 2,
                cq: 1,
                srq: 1,
            }
        } else {
            MapCosts {
                qp: 4,
                cq: 2,
                srq: 2,
            }
        }
    }
}

/// The capacities of a host NIC, per kind (`ibv_query_device`).
pub type Capacity = PerKind;

/// What the RNIC needs to know of each VM to give it its part (the
/// server makes it from the configuration).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Each VM's tenant (index).
    pub vm_tenant: Vec<usize>,
    /// Each tenant's weight.
    pub tenant_weights: Vec<u32>,
    /// Each VM's configured object limits (`max_qp`, `max_cq`, `max_mr`,
    /// `max_pd`, `max_ah`, `max_srq`).
    pub configured: Vec<PerKind>,
    /// Each VM's configured mapping limit (`max_host_mappings`).
    pub max_mappings: Vec<u64>,
}

impl Plan {
    /// Each VM's quota over a NIC of `capacity` and the daemon's mapping
    /// budget `maps`.
    pub fn quotas(&self, capacity: &Capacity, maps: &Arc<MapBudget>) -> Vec<Arc<VmQuota>> {
        let n = self.vm_tenant.len();
        let mut shares = vec![[0u64; 6]; n];
        for (k, &cap) in capacity.iter().enumerate() {
            let s = split(
                cap,
                NIC_RESERVE_PERCENT,
                &self.vm_tenant,
                &self.tenant_weights,
            );
            for (vm, v) in s.into_iter().enumerate() {
                if let Some(row) = shares.get_mut(vm) {
                    if let Some(x) = row.get_mut(k) {
                        *x = v;
                    }
                }
            }
        }
        // The daemon's budget has its reserve taken off already.
        let limit = u64::try_from(maps.limit()).unwrap_or(u64::MAX);
        let map_shares = split(limit, 0, &self.vm_tenant, &self.tenant_weights);
        (0..n)
            .map(|vm| {
                VmQuota::new(
                    self.configured.get(vm).copied().unwrap_or([u64::MAX; 6]),
                    shares.get(vm).copied().unwrap_or_default(),
                    self.max_mappings.get(vm).copied().unwrap_or(u64::MAX),
                    map_shares.get(vm).copied().unwrap_or(0),
                    maps,
                )
            })
            .collect()
    }
}

/// One VM's part of the host: its object shares and counts, and its
/// mapping budget.
#[derive(Debug)]
pub struct VmQuota {
    configured: PerKind,
    share: PerKind,
    used: [AtomicU64; 6],
    maps_configured: u64,
    maps_share: u64,
    maps: Arc<MapBudget>,
}

impl VmQuota {
    /// A VM's quota: `configured` and `share` objects per kind, and a
    /// mapping budget of the smaller of `maps_configured` and `maps_share`
    /// drawn from the daemon's `maps`.
    pub fn new(
        configured: PerKind,
        share: PerKind,
        maps_configured: u64,
        maps_share: u64,
        maps: &Arc<MapBudget>,
    ) -> Arc<VmQuota> {
        let limit = usize::try_from(maps_configured.min(maps_share)).unwrap_or(usize::MAX);
        Arc::new(VmQuota {
            configured,
            share,
            used: Default::default(),
            maps_configured,
            maps_share,
            maps: MapBudget::child(maps, limit),
        })
    }

    /// The effective limit of `kind`: the smaller of the configured one and
    /// the share.
    pub fn effective(&self, kind: Kind) -> u64 {
        let i = kind.index();
        let c = self.configured.get(i).copied().unwrap_or(0);
        c.min(self.share.get(i).copied().unwrap_or(0))
    }

    /// Objects of `kind` held now.
    pub fn used(&self, kind: Kind) -> u64 {
        self.used
            .get(kind.index())
            .map_or(0, |u| u.load(Ordering::Relaxed))
    }

    /// The VM's mapping budget (its MRs' windows draw from it).
    pub fn maps(&self) -> &Arc<MapBudget> {
        &self.maps
    }

    /// Takes one object of `kind` that makes `maps` mappings: `QUOTA` (the
    /// object's detail) beyond its effective limit, `QUOTA` (mappings)
    /// beyond the VM's mapping budget, `NO_MEMORY` when the daemon's is
    /// spent. Given back when the charge is dropped.
    pub fn take(self: &Arc<Self>, kind: Kind, maps: usize) -> Result<Charge, RnicError> {
        let limit = self.effective(kind);
        let Some(used) = self.used.get(kind.index()) else {
            return Err(RnicError::Exhausted);
        };
        used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < limit).then_some(n.saturating_add(1))
        })
        .map_err(|_| RnicError::Quota(kind.detail()))?;
        // From here on the charge gives the object back if the mappings
        // are refused.
        let mut charge = Charge {
            quota: self.clone(),
            kind,
            maps: None,
        };
        if maps > 0 {
            charge.maps = Some(self.maps.charge(maps).map_err(|e| map_error(&e))?);
        }
        Ok(charge)
    }

    /// What the operator sees: configured, share, effective and used, for
    /// the mappings and each kind.
    pub fn usage(&self) -> HostUsage {
        let mut rows = vec![HostQuota {
            kind: "maps",
            configured: self.maps_configured,
            share: self.maps_share,
            effective: u64::try_from(self.maps.limit()).unwrap_or(u64::MAX),
            used: u64::try_from(self.maps.used()).unwrap_or(u64::MAX),
        }];
        for k in Kind::ALL {
            let i = k.index();
            rows.push(HostQuota {
                kind: k.name(),
                configured: self.configured.get(i).copied().unwrap_or(0),
                share: self.share.get(i).copied().unwrap_or(0),
                effective: self.effective(k),
                used: self.used(k),
            });
        }
        HostUsage { rows }
    }
}

/// The status of a refused mapping charge: the VM's own budget spent is
/// `QUOTA` (mappings), the daemon's `NO_MEMORY`.
pub fn map_error(e: &WindowError) -> RnicError {
    match e {
        WindowError::MapCount { daemon: false, .. } => RnicError::Quota(quota::HOST_MAPPINGS),
        _ => RnicError::Exhausted,
    }
}

/// One host object of a VM and the mappings it makes, counted against its
/// quota until dropped.
#[derive(Debug)]
pub struct Charge {
    quota: Arc<VmQuota>,
    kind: Kind,
    maps: Option<MapCharge>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(u) = self.quota.used.get(self.kind.index()) {
            u.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_never_exceed_the_rest() {
        // 10 % of 1000 kept; 900 between two tenants of 1 and 3 VMs.
        assert_eq!(
            split(1000, 10, &[0, 1, 1, 1], &[1, 1]),
            vec![450, 150, 150, 150]
        );
        // Weights: tenant 1 gets twice tenant 0's part.
        assert_eq!(split(900, 0, &[0, 1], &[1, 2]), vec![300, 600]);
        // A tenant without VMs takes nothing; a weight of 0 counts as 1.
        assert_eq!(split(900, 0, &[2, 2], &[5, 0, 0]), vec![450, 450]);
        // Rounded down, the reserve up.
        assert_eq!(split(7, 10, &[0, 0, 0], &[]), vec![2, 2, 2]);
        assert_eq!(split(0, 10, &[0], &[]), vec![0]);
        assert!(split(5, 0, &[], &[]).is_empty());
        // No overflow at the extremes.
        let s = split(u64::MAX, 10, &[0, 1, 2], &[u32::MAX, 1, u32::MAX]);
        let rest = u128::from(u64::MAX) - u128::from(u64::MAX).div_ceil(10);
        assert!(s.iter().map(|&x| u128::from(x)).sum::<u128>() <= rest);
        for cap in [1u64, 9, 100, 12345, 1 << 40] {
            for vms in [&[0usize][..], &[0, 0, 1], &[0, 1, 2, 2, 2, 3]] {
                let s = split(cap, NIC_RESERVE_PERCENT, vms, &[3, 1, 2]);
                let sum: u64 = s.iter().sum();
                assert!(
                    sum <= cap - (cap * NIC_RESERVE_PERCENT).div_ceil(100),
                    "{cap} {vms:?}"
                );
            }
        }
    }

    fn plan(vms: usize, configured_qp: u64) -> Plan {
        Plan {
            vm_tenant: (0..vms).collect(),
            tenant_weights: vec![1; vms],
            configured: vec![[configured_qp, 100, 100, 100, 100, 100]; vms],
            max_mappings: vec![1000; vms],
        }
    }

    /// A VM's effective limit is the smaller of its configured limit and
    /// its share; beyond it, QUOTA with the object's detail; another VM's
    /// share is untouched, and objects given back can be taken again.
    #[test]
    fn a_vm_gets_its_share_and_no_more() {
        // A NIC of 20 QPs, 10 CQs: 18 and 9 after the reserve, 9 QPs and
        // 4 CQs per VM.
        let daemon = MapBudget::new(1000);
        let q = plan(2, 100).quotas(&[20, 10, 1000, 1000, 1000, 1000], &daemon);
        let (a, b) = (&q[0], &q[1]);
        assert_eq!((a.effective(Kind::Qp), a.effective(Kind::Cq)), (9, 4));
        let held: Vec<Charge> = (0..9).map(|_| a.take(Kind::Qp, 0).unwrap()).collect();
        assert_eq!(a.take(Kind::Qp, 0).err(), Some(RnicError::Quota(quota::QP)));
        let other: Vec<Charge> = (0..9).map(|_| b.take(Kind::Qp, 0).unwrap()).collect();
        drop(held);
        assert_eq!(a.used(Kind::Qp), 0);
        assert!(a.take(Kind::Qp, 0).is_ok());
        drop(other);
        // A configured limit below the share is the limit.
        let q = plan(1, 3).quotas(&[20, 10, 10, 10, 10, 10], &daemon);
        assert_eq!(q[0].effective(Kind::Qp), 3);
        let u = q[0].usage();
        let qp = u.rows.iter().find(|r| r.kind == "qp").unwrap();
        assert_eq!(
            (qp.configured, qp.share, qp.effective, qp.used),
            (3, 18, 3, 0)
        );
    }

    /// Host queues' mappings are charged to the VM's mapping budget (a
    /// share of the daemon's): beyond it QUOTA (mappings), with nothing
    /// kept of the refused object; the daemon's budget spent: NO_MEMORY.
    #[test]
    fn host_queues_are_charged_their_mappings() {
        let daemon = MapBudget::new(10);
        let q = plan(2, 100).quotas(&[100; 6], &daemon);
        let (a, b) = (&q[0], &q[1]);
        assert_eq!(a.maps().limit(), 5);
        let qp = a.take(Kind::Qp, 4).unwrap();
        assert_eq!(
            a.take(Kind::Qp, 2).err(),
            Some(RnicError::Quota(quota::HOST_MAPPINGS))
        );
        assert_eq!(
            (a.used(Kind::Qp), a.maps().used(), daemon.used()),
            (1, 4, 4)
        );
        let cq = b.take(Kind::Cq, 5).unwrap();
        drop(qp);
        assert_eq!(daemon.used(), 5);
        // A VM budget larger than the daemon has left: NO_MEMORY.
        let big = VmQuota::new([100; 6], [100; 6], 100, 100, &daemon);
        assert_eq!(big.take(Kind::Cq, 6).err(), Some(RnicError::Exhausted));
        assert_eq!(big.used(Kind::Cq), 0);
        drop(cq);
        assert_eq!(daemon.used(), 0);
    }

    #[test]
    fn providers_are_charged_conservatively() {
        assert_eq!(MapCosts::of_device("rxe0").qp, 2);
        assert!(MapCosts::of_device("mlx5_0").qp >= 2);
    }
}
