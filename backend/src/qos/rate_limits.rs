//! Rate limits as the engine enforces them: token buckets per VM and per
//! tenant, for work requests and bytes ([`RateLimits`]), and the size of a
//! VM's bursts ([`grain_of`]).
//!
//! This is plain state of one engine thread: no locks and no atomics, and
//! every function takes the time as an argument, so the unit tests drive
//! it with an injected clock. The engine re-reads the live [`QosTable`]
//! whenever its generation moves ([`RateLimits::refresh`]), so an
//! operator's change applies at the next sweep. docs/isolation.md ("QoS:
//! rate limits and weighted fair sharing") gives the reasons and the
//! measurements behind the design.

use std::time::Instant;

use super::bucket::TokenBucket;
use super::{Membership, QosSpec, QosTable, DEFAULT_WEIGHT};
use crate::stats::TrafficCounters;

/// Work requests taken from one QP before moving on, at the default weight
/// and above.
pub const BURST: u32 = 32;
/// Bytes after which a QP's burst ends early (after the work request that
/// crossed it), at the default weight and above: bounds the engine time of
/// one burst — how long another VM's work can wait behind it — to some
/// 10-30 µs of copying, while a single VM streaming 64 KiB messages still
/// takes four per sweep (one per sweep cost it 7 % of its bandwidth).
pub const BURST_BYTES: u64 = 256 << 10;

/// The two buckets of a VM or tenant: work requests and bytes.
#[derive(Debug, Clone)]
pub struct Limiter {
    ops: TokenBucket,
    bytes: TokenBucket,
}

impl Limiter {
    /// The buckets of `spec`.
    pub fn new(spec: &QosSpec) -> Self {
        Limiter {
            ops: TokenBucket::data(spec.ops_per_sec),
            bytes: TokenBucket::data(spec.bytes_per_sec),
        }
    }

    fn set(&mut self, spec: &QosSpec) {
        self.ops.set_rate(spec.ops_per_sec);
        self.bytes.set_rate(spec.bytes_per_sec);
    }

    /// Whether either bucket limits anything.
    pub fn limited(&self) -> bool {
        !self.ops.unlimited() || !self.bytes.unlimited()
    }

    /// `None` if a work request may start at `now`, else the earliest time.
    pub fn check(&mut self, now: Instant) -> Option<Instant> {
        match (self.ops.check(now), self.bytes.check(now)) {
            (None, None) => None,
            (a, b) => a.max(b),
        }
    }

    /// Charges one work request that moved `bytes`.
    pub fn charge(&mut self, bytes: u64) {
        self.ops.charge(1);
        self.bytes.charge(bytes);
    }

    /// Charges `bytes` moved by a piece of a work request (its operation is
    /// charged with its last piece).
    pub fn charge_bytes(&mut self, bytes: u64) {
        self.bytes.charge(bytes);
    }

    /// Charges `n` work requests that moved nothing (flushed ones).
    pub fn charge_ops(&mut self, n: u64) {
        self.ops.charge(n);
    }
}

/// Rate-limit state of one VM.
#[derive(Debug, Clone)]
struct VmLimits {
    own: Limiter,
    tenant: Option<usize>,
    /// The VM or its tenant has a limit (otherwise nothing is checked).
    limited: bool,
    /// The VM may not start work before this (a cache of the last check,
    /// so the sweep can skip the VM without locking it).
    blocked_until: Option<Instant>,
    /// Work of the VM is being held back (each held-back work request
    /// counts once in `throttled`, however often it is looked at).
    held: bool,
    /// Most work requests and bytes of one burst ([`grain_of`]).
    grain: (u32, u64),
}

/// The burst size of a VM of weight `weight`: [`BURST`] and
/// [`BURST_BYTES`] at the default weight and above, proportionally less
/// below it (at least one work request). A low-weight VM is then served in
/// small pieces, so a latency-sensitive VM next to it waits at most one of
/// its messages; VMs at the default weight keep the full burst (no extra
/// sweeps per work request).
pub fn grain_of(weight: u32) -> (u32, u64) {
    let w = weight.clamp(1, DEFAULT_WEIGHT);
    // `w <= DEFAULT_WEIGHT`: the products are small.
    let wqes = (BURST.saturating_mul(w) / DEFAULT_WEIGHT).max(1);
    const UNIT: u64 = DEFAULT_WEIGHT as u64;
    let bytes = (BURST_BYTES.saturating_mul(u64::from(w)) / UNIT).max(1);
    (wqes, bytes)
}

/// The rate limits of every VM and tenant, as the engine enforces them.
#[derive(Debug, Default)]
pub struct RateLimits {
    seen: Option<u64>,
    vms: Vec<VmLimits>,
    tenants: Vec<Limiter>,
}

impl RateLimits {
    /// Re-reads the QoS table if it changed since the last call. A change
    /// also clears every cached block, so a raised limit applies at once.
    pub fn refresh(&mut self, table: &QosTable, tenancy: &impl Membership) {
        let gen = table.generation();
        if self.seen == Some(gen) && self.vms.len() == tenancy.vm_count() {
            return;
        }
        self.seen = Some(gen);
        let tenants = table.all_tenants();
        for (i, spec) in tenants.iter().enumerate() {
            match self.tenants.get_mut(i) {
                Some(l) => l.set(spec),
                None => self.tenants.push(Limiter::new(spec)),
            }
        }
        self.tenants.truncate(tenants.len());
        let vms = table.all_vms();
        for i in 0..tenancy.vm_count() {
            let spec = vms.get(i).copied().unwrap_or_default();
            let tenant = tenancy.tenant_of(i).filter(|&t| t < self.tenants.len());
            let v = match self.vms.get_mut(i) {
                Some(v) => {
                    v.own.set(&spec);
                    v
                }
                None => {
                    self.vms.push(VmLimits {
                        own: Limiter::new(&spec),
                        tenant,
                        limited: false,
                        blocked_until: None,
                        held: false,
                        grain: grain_of(spec.weight),
                    });
                    let Some(v) = self.vms.last_mut() else {
                        continue;
                    };
                    v
                }
            };
            v.tenant = tenant;
            v.blocked_until = None;
            // A low weight of the VM or of its tenant: fine-grained service.
            let tenant_weight = tenant
                .and_then(|t| tenants.get(t))
                .map_or(DEFAULT_WEIGHT, |t| t.weight);
            v.grain = grain_of(spec.weight.min(tenant_weight));
            let tenant_limited = tenant
                .and_then(|t| self.tenants.get(t))
                .is_some_and(Limiter::limited);
            v.limited = v.own.limited() || tenant_limited;
        }
        self.vms.truncate(tenancy.vm_count());
    }

    /// Most work requests and bytes of one burst of VM `vm`.
    pub fn grain(&self, vm: usize) -> (u32, u64) {
        self.vms.get(vm).map_or((BURST, BURST_BYTES), |v| v.grain)
    }

    /// Whether VM `vm` (or its tenant) has a rate limit.
    pub fn limited(&self, vm: usize) -> bool {
        self.vms.get(vm).is_some_and(|v| v.limited)
    }

    /// The time before which VM `vm` was last found unable to start work.
    pub fn blocked_until(&self, vm: usize) -> Option<Instant> {
        self.vms.get(vm).and_then(|v| v.blocked_until)
    }

    /// Whether VM `vm` may start a work request at `now`: `None` if so,
    /// else when it may. A refusal is counted in `counters.throttled` once
    /// per held-back work request.
    pub fn admit(
        &mut self,
        vm: usize,
        now: Instant,
        counters: Option<&TrafficCounters>,
    ) -> Option<Instant> {
        let v = self.vms.get_mut(vm)?;
        if !v.limited {
            return None;
        }
        let own = v.own.check(now);
        let tenant = v
            .tenant
            .and_then(|t| self.tenants.get_mut(t))
            .and_then(|t| t.check(now));
        let until = match (own, tenant) {
            (None, None) => None,
            (a, b) => a.max(b),
        };
        v.blocked_until = until;
        if until.is_some() && !v.held {
            v.held = true;
            if let Some(c) = counters {
                TrafficCounters::add_single_writer(&c.throttled, 1);
            }
        }
        until
    }

    /// Charges one executed work request of VM `vm` that moved `bytes` to
    /// the VM's and its tenant's buckets.
    pub fn charge(&mut self, vm: usize, bytes: u64) {
        let Some(v) = self.vms.get_mut(vm) else {
            return;
        };
        if !v.limited {
            return;
        }
        v.held = false;
        v.own.charge(bytes);
        if let Some(t) = v.tenant.and_then(|t| self.tenants.get_mut(t)) {
            t.charge(bytes);
        }
    }

    /// Charges `n` work requests of VM `vm` that moved no payload (WQEs
    /// flushed with `WR_FLUSH_ERR`: work the guest causes by merely
    /// posting to a QP in ERR) to the VM's and its tenant's buckets.
    pub fn charge_ops(&mut self, vm: usize, n: u64) {
        let Some(v) = self.vms.get_mut(vm) else {
            return;
        };
        if !v.limited || n == 0 {
            return;
        }
        v.own.charge_ops(n);
        if let Some(t) = v.tenant.and_then(|t| self.tenants.get_mut(t)) {
            t.charge_ops(n);
        }
    }

    /// Charges `bytes` moved by a piece of a work request of VM `vm` (an
    /// RDMA WRITE executed in pieces) to the VM's and its tenant's byte
    /// buckets; the work request is charged with its last piece.
    pub fn charge_bytes(&mut self, vm: usize, bytes: u64) {
        let Some(v) = self.vms.get_mut(vm) else {
            return;
        };
        if !v.limited {
            return;
        }
        // `held` stays: a work request held back between its pieces
        // counts once in `throttled`.
        v.own.charge_bytes(bytes);
        if let Some(t) = v.tenant.and_then(|t| self.tenants.get_mut(t)) {
            t.charge_bytes(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::tests::tenancy;

    fn at(base: Instant, ms: u64) -> Instant {
        base + std::time::Duration::from_millis(ms)
    }

    fn table(vms: Vec<QosSpec>, tenants: Vec<QosSpec>) -> QosTable {
        QosTable::new(vms, tenants)
    }

    #[test]
    fn tenant_limit_applies_to_the_sum_and_counts_throttling() {
        let t0 = Instant::now();
        let ten = tenancy(3, &[1, 1, 0]);
        let lim = QosSpec {
            ops_per_sec: 1000,
            ..QosSpec::default()
        };
        let q = table(vec![QosSpec::default(); 3], vec![QosSpec::default(), lim]);
        let mut l = RateLimits::default();
        l.refresh(&q, &ten);
        assert!(l.limited(0) && l.limited(1) && !l.limited(2));
        let counters = TrafficCounters::default();
        // Two VMs of tenant 1 alternate for 1 s: together 1000 ops (+burst).
        let mut now = t0;
        let mut ops = [0u64; 2];
        let mut refusals = 0;
        let mut step = 0;
        while now < at(t0, 1000) {
            let mut next = None;
            // The engine's round robin: who goes first alternates.
            step += 1;
            for k in 0..2 {
                let vm = (k + step) % 2;
                match l.admit(vm, now, Some(&counters)) {
                    None => {
                        l.charge(vm, 64);
                        ops[vm] += 1;
                    }
                    Some(t) => {
                        refusals += 1;
                        next = Some(t);
                    }
                }
            }
            if let Some(t) = next {
                now = t;
            }
        }
        let total = ops[0] + ops[1];
        assert!((999..=1006).contains(&total), "{ops:?}");
        assert!(
            ops[0].abs_diff(ops[1]) <= 5,
            "alternating VMs share: {ops:?}"
        );
        // Each held-back request counts once, not every look.
        let throttled = counters.snapshot().throttled;
        assert!(
            throttled > 0 && throttled <= refusals,
            "{throttled} {refusals}"
        );
        // The unlimited VM is never held back.
        assert_eq!(l.admit(2, now, Some(&counters)), None);
        // A run-time change is picked up through the generation.
        let unl = QosSpec::default();
        assert_eq!(q.set_tenant(1, unl), Ok(()));
        l.refresh(&q, &ten);
        assert!(!l.limited(0));
        assert_eq!(l.admit(0, now, None), None);
    }

    #[test]
    fn low_weights_get_small_bursts() {
        assert_eq!(grain_of(100), (BURST, BURST_BYTES));
        assert_eq!(grain_of(1000), (BURST, BURST_BYTES));
        assert_eq!(grain_of(50), (BURST / 2, BURST_BYTES / 2));
        assert_eq!(grain_of(1), (1, BURST_BYTES / 100));
    }
}
