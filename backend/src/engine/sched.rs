//! Quality of service in the engine: rate limits (token buckets per VM and
//! per tenant) and weighted fair sharing of the engine's time between the
//! VMs that have work (hierarchical deficit round robin, [`Drr`]).
//!
//! Both are plain state of the single engine thread: no locks and no
//! atomics, and every function takes the time as an argument, so the unit
//! tests drive them with an injected clock. The engine re-reads the live
//! [`QosTable`] whenever its generation moves ([`Limits::refresh`],
//! [`Drr::set_weight`]), so an operator's change applies at the next sweep.
//! docs/isolation.md ("QoS: rate limits and weighted fair sharing") gives
//! the reasons and the measurements behind the design.
//!
//! The token buckets are our own, not a crate's (`governor` 0.10.4, the
//! maintained one, read): its GCRA refuses a request larger than the
//! burst outright, where [`TokenBucket`] lets a work request run and then
//! owes what it moved (a 1 MiB message under a 5 ms burst must pass);
//! its `Quota` holds at most `u32::MAX` cells per second or one per
//! nanosecond, short of byte rates above 4 GB/s; a rate change means a new
//! limiter, losing the debt; and it reads its own clock, while the
//! engine passes one `now` to everything (and the tests inject it). It
//! would also bring a dozen crates (dashmap, quanta, futures-util...). The
//! control-command bucket (`ctrl/rate.rs`) is ours for the same reasons.

use std::time::{Duration, Instant};

use crate::qos::{QosSpec, QosTable, DEFAULT_WEIGHT};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;

/// How much of its rate a token bucket may save up: 5 ms (so a 1-second
/// measurement sees at most 0.5 % more than the rate from the burst).
pub const BURST_TIME: Duration = Duration::from_millis(5);
/// Work requests taken from one QP before moving on, at the default weight
/// and above.
pub const BURST: u32 = 32;
/// Bytes after which a QP's burst ends early (after the work request that
/// crossed it), at the default weight and above: bounds the engine time of
/// one burst — how long another VM's work can wait behind it — to some
/// 10-30 µs of copying, while a single VM streaming 64 KiB messages still
/// takes four per sweep (one per sweep cost it 7 % of its bandwidth).
pub const BURST_BYTES: u64 = 256 << 10;

/// Engine time a VM may use per round per unit of weight: the default
/// weight (100) gets 10 µs per round. Small enough that a light VM waits at
/// most a few tens of microseconds behind heavy ones, large enough that a
/// round is not mostly switching between VMs.
pub const QUANTUM_PER_WEIGHT: Duration = Duration::from_nanos(100);

/// A token bucket: it holds up to `rate × BURST_TIME` tokens (at least
/// one) and refills continuously. A work request may start while the
/// bucket is not empty (level above 0), and is charged after it ran, with
/// what it actually moved. The level may therefore go into debt by at most
/// one message: a 4 MiB WRITE under a 1 MiB/s limit runs, and the VM then
/// waits four seconds. This keeps the burst small and still lets messages
/// larger than the burst through, with no need to know a message's length
/// before it is parsed.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Tokens per second; 0: unlimited.
    rate: u64,
    /// Largest level.
    cap: f64,
    /// Current level; negative: in debt.
    level: f64,
    /// When `level` was last brought up to date (none yet: full).
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `rate` tokens per second (0: unlimited).
    pub fn new(rate: u64) -> Self {
        let cap = Self::cap_of(rate);
        TokenBucket {
            rate,
            cap,
            level: cap,
            last: None,
        }
    }

    fn cap_of(rate: u64) -> f64 {
        (rate as f64 * BURST_TIME.as_secs_f64()).max(1.0)
    }

    /// Whether the bucket limits nothing.
    pub fn unlimited(&self) -> bool {
        self.rate == 0
    }

    /// Changes the rate. A newly limited bucket starts full; otherwise the
    /// level is kept (a debt is still owed, at the new rate) but never
    /// above the new burst.
    pub fn set_rate(&mut self, rate: u64) {
        if rate == self.rate {
            return;
        }
        let was_unlimited = self.unlimited();
        self.rate = rate;
        self.cap = Self::cap_of(rate);
        if was_unlimited {
            self.level = self.cap;
            self.last = None;
        } else {
            self.level = self.level.min(self.cap);
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.level = (self.level + dt * self.rate as f64).min(self.cap);
        }
        self.last = Some(now);
    }

    /// `None` if work may start at `now`, else the earliest time it may.
    pub fn check(&mut self, now: Instant) -> Option<Instant> {
        if self.unlimited() {
            return None;
        }
        self.refill(now);
        if self.level > 0.0 {
            return None;
        }
        // One nanosecond past the moment the level is back at zero, so the
        // level is above zero when the engine looks again.
        let wait = -self.level / self.rate as f64;
        let wait = Duration::from_secs_f64(wait.min(1e6)).saturating_add(Duration::from_nanos(1));
        // At most about 11 days: an `Instant` does not overflow there.
        Some(now.checked_add(wait).unwrap_or(now))
    }

    /// Takes `n` tokens (may go into debt).
    pub fn charge(&mut self, n: u64) {
        if !self.unlimited() {
            self.level -= n as f64;
        }
    }
}

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
            ops: TokenBucket::new(spec.ops_per_sec),
            bytes: TokenBucket::new(spec.bytes_per_sec),
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
pub struct Limits {
    seen: Option<u64>,
    vms: Vec<VmLimits>,
    tenants: Vec<Limiter>,
}

impl Limits {
    /// Re-reads the QoS table if it changed since the last call. A change
    /// also clears every cached block, so a raised limit applies at once.
    pub fn refresh(&mut self, table: &QosTable, tenancy: &Tenancy) {
        let gen = table.generation();
        if self.seen == Some(gen) && self.vms.len() == tenancy.vms().len() {
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
        for i in 0..tenancy.vms().len() {
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
        self.vms.truncate(tenancy.vms().len());
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

/// Deficit round robin over the engine's VMs, indexed by the VM's position
/// in the engine's list.
///
/// Every sweep of the engine is one round. A VM with work gets its quantum
/// added to its deficit and is served — pass after pass over its QPs with
/// work, each QP a burst — while the deficit is positive; the cost of each
/// burst ([`cost_of`]) is subtracted. A deficit left in debt by the last
/// burst carries over, so over time each VM gets engine work in proportion
/// to its weight. Each round starts one VM further, so VMs competing for
/// one tenant bucket take turns at being first. A VM without work forgets
/// its deficit (no hoarding), and a positive deficit never exceeds one
/// quantum. When no VM with work could be served in a round (all in debt),
/// the fewest whole rounds that make one of them positive are added at
/// once, so the engine never idles while there is work. A VM in debt `D`
/// waits at most `D / quantum` rounds, and a round lasts at most the sum of
/// the quanta plus one burst per VM: nobody starves.
///
/// The sharing is hierarchical: the tenants with work share the engine by
/// their weights, and a tenant's share goes to its VMs with work by
/// theirs. A VM's quantum in a round is therefore `tenant weight × VM
/// weight / (sum of the weights of the tenant's VMs with work)` units, so
/// a tenant gets no more engine time by running more VMs.
#[derive(Debug, Default)]
pub struct Drr {
    slots: Vec<DrrSlot>,
    /// Scratch: per group, the sum of the weights of its VMs with work in
    /// the current round.
    group_sums: Vec<u64>,
    /// Scratch: VMs skipped in the current round for being in debt.
    skipped: Vec<usize>,
    /// Rounds so far: each round starts one VM further, so that VMs which
    /// compete for something other than engine time — their tenant's
    /// token bucket — take turns at being first.
    rounds: usize,
}

#[derive(Debug, Clone, Copy)]
struct DrrSlot {
    /// The VM's own weight.
    weight: u32,
    /// Its group (tenant) and the group's weight.
    group: usize,
    group_weight: u32,
    /// Nanoseconds of engine time per round (set at the start of each
    /// round from the weights of the VMs with work).
    quantum: i64,
    /// Nanoseconds the VM may still use; negative: in debt.
    deficit: i64,
}

impl Default for DrrSlot {
    fn default() -> Self {
        DrrSlot {
            weight: DEFAULT_WEIGHT,
            group: usize::MAX,
            group_weight: DEFAULT_WEIGHT,
            quantum: quantum_of(DEFAULT_WEIGHT),
            deficit: 0,
        }
    }
}

fn quantum_of(weight: u32) -> i64 {
    let q = i64::try_from(QUANTUM_PER_WEIGHT.as_nanos()).unwrap_or(i64::MAX);
    q.saturating_mul(i64::from(weight.max(1)))
}

/// The quantum of a VM of weight `weight` in a group of weight `group`
/// whose VMs with work weigh `sum` together: the group's quantum, split by
/// weight (at least 1 ns, so every VM makes progress).
fn share_of(weight: u32, group: u32, sum: u64) -> i64 {
    let q = u64::try_from(QUANTUM_PER_WEIGHT.as_nanos()).unwrap_or(u64::MAX);
    let ns = q
        .saturating_mul(u64::from(group.max(1)))
        .saturating_mul(u64::from(weight.max(1)));
    // A zero sum divides by 1.
    let ns = ns.checked_div(sum).unwrap_or(ns);
    i64::try_from(ns).unwrap_or(i64::MAX).max(1)
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// How [`Drr::round`] asks for a VM to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Position of the VM.
    pub vm: usize,
    /// The first pass of this turn (the VM's doorbells were just scanned).
    pub first: bool,
    /// Other VMs have work: the pass ends when the deficit runs out. A VM
    /// alone is charged too, but only so that a pass over several QPs ends
    /// after about one quantum (its deficit is refilled every round).
    pub shared: bool,
}

/// Engine time a work request costs besides its bytes (fetching and
/// checking the WQE, the responder's checks, the completions): from
/// `rdma_perf write_bw --size 64` on a quiet run of these 2-vCPU VMs,
/// about 3.5 M WRITEs/s, 0.3 µs each.
pub const OP_COST: Duration = Duration::from_nanos(300);
/// Bytes the engine copies per microsecond: 20 KiB (about 21 GB/s), from
/// `rdma_perf write_bw --size 65536` on the same quiet run (22 GB/s).
pub const BYTES_PER_US: u64 = 20 << 10;

/// The engine time charged for `wqes` work requests that moved `bytes`:
/// the cost model of the weighted sharing, a constant per work request
/// plus the bytes at the engine's copy rate (a model, not a clock: see
/// docs/isolation.md, "Cost model").
pub fn cost_of(wqes: u64, bytes: u64) -> Duration {
    let ns = wqes
        .saturating_mul(u64::try_from(OP_COST.as_nanos()).unwrap_or(u64::MAX))
        .saturating_add(bytes.saturating_mul(1000) / BYTES_PER_US);
    Duration::from_nanos(ns)
}

impl Drr {
    /// Sets the number of VMs (new ones get the default weight).
    pub fn resize(&mut self, n: usize) {
        self.slots.resize(n, DrrSlot::default());
    }

    /// Sets the weight of VM `vm`. Until [`Drr::set_group`] it is a group
    /// of its own: it shares with the other VMs by its weight alone.
    pub fn set_weight(&mut self, vm: usize, weight: u32) {
        if let Some(s) = self.slots.get_mut(vm) {
            s.weight = weight.max(1);
            if s.group == usize::MAX {
                s.group_weight = s.weight;
            }
            s.quantum = quantum_of(weight);
            s.deficit = s.deficit.min(s.quantum);
        }
    }

    /// Puts VM `vm` into group `group` (its tenant) of weight `weight`:
    /// the group's VMs with work share the group's part of the engine.
    pub fn set_group(&mut self, vm: usize, group: usize, weight: u32) {
        if let Some(s) = self.slots.get_mut(vm) {
            s.group = group;
            s.group_weight = weight.max(1);
        }
    }

    /// Sets every active VM's quantum for this round from the weights of
    /// the VMs with work (see the type's documentation).
    fn set_quanta(&mut self, active: &[usize]) {
        self.group_sums.clear();
        for &vm in active {
            let Some(s) = self.slots.get(vm) else {
                continue;
            };
            // Ungrouped VMs (usize::MAX) are groups of their own.
            if s.group == usize::MAX {
                continue;
            }
            if self.group_sums.len() <= s.group {
                self.group_sums.resize(s.group.saturating_add(1), 0);
            }
            if let Some(sum) = self.group_sums.get_mut(s.group) {
                *sum = sum.saturating_add(u64::from(s.weight));
            }
        }
        for &vm in active {
            let Some(s) = self.slots.get_mut(vm) else {
                continue;
            };
            let sum = match s.group {
                usize::MAX => u64::from(s.weight),
                g => self.group_sums.get(g).copied().unwrap_or(0),
            };
            s.quantum = share_of(s.weight, s.group_weight, sum);
        }
    }

    /// VM `vm` had no work: it forgets its deficit.
    pub fn idle(&mut self, vm: usize) {
        if let Some(s) = self.slots.get_mut(vm) {
            s.deficit = 0;
        }
    }

    /// Charges `cost` of engine time to VM `vm`; returns whether it may go
    /// on in this round.
    pub fn charge(&mut self, vm: usize, cost: Duration) -> bool {
        match self.slots.get_mut(vm) {
            Some(s) => {
                s.deficit = s.deficit.saturating_sub(ns(cost));
                s.deficit > 0
            }
            None => true,
        }
    }

    /// The deficit of VM `vm` in nanoseconds (for tests and diagnostics).
    pub fn deficit(&self, vm: usize) -> i64 {
        self.slots.get(vm).map_or(0, |s| s.deficit)
    }

    /// One round over `active` (the VMs with work that no rate limit holds
    /// back, in order). `serve` performs one pass over a VM's work and
    /// returns whether it did any; a VM is served pass after pass while it
    /// has work and a positive deficit. Returns whether any work was done.
    pub fn round(
        &mut self,
        active: &[usize],
        mut serve: impl FnMut(&mut Drr, Turn) -> bool,
    ) -> bool {
        if let [vm] = *active {
            // Alone: nobody to share with, so no debt is kept, and one pass
            // per sweep (the next sweep sees VMs whose work arrived
            // meanwhile); a pass over several QPs still ends after about
            // one quantum.
            if let Some(s) = self.slots.get_mut(vm) {
                s.deficit = s.quantum;
            }
            return serve(
                self,
                Turn {
                    vm,
                    first: true,
                    shared: false,
                },
            );
        }
        self.set_quanta(active);
        let mut skipped = std::mem::take(&mut self.skipped);
        skipped.clear();
        let mut did = false;
        let mut served = false;
        let n = active.len();
        self.rounds = self.rounds.wrapping_add(1);
        for k in 0..n {
            // A rotation: `rounds` wraps, and so may the sum.
            let at = k.wrapping_add(self.rounds).checked_rem(n);
            let Some(&vm) = at.and_then(|i| active.get(i)) else {
                continue;
            };
            let Some(s) = self.slots.get_mut(vm) else {
                continue;
            };
            s.deficit = s.deficit.saturating_add(s.quantum).min(s.quantum);
            if s.deficit <= 0 {
                skipped.push(vm);
                continue;
            }
            served = true;
            did |= self.turn(vm, &mut serve);
        }
        if !served && !skipped.is_empty() {
            // Everyone with work is in debt: run the fewest whole rounds
            // that bring one of them above zero, at once.
            let rounds = skipped
                .iter()
                .filter_map(|&vm| self.slots.get(vm))
                .map(|s| {
                    // ceil((1 - deficit) / quantum), `deficit <= 0`.
                    let need = 1i64
                        .saturating_sub(s.deficit)
                        .saturating_add(s.quantum.saturating_sub(1));
                    need.checked_div(s.quantum.max(1)).unwrap_or(1)
                })
                .min()
                .unwrap_or(1)
                .max(1);
            for &vm in &skipped {
                if let Some(s) = self.slots.get_mut(vm) {
                    s.deficit = s
                        .deficit
                        .saturating_add(s.quantum.saturating_mul(rounds))
                        .min(s.quantum);
                }
            }
            for &vm in &skipped {
                if self.slots.get(vm).is_some_and(|s| s.deficit > 0) {
                    did |= self.turn(vm, &mut serve);
                }
            }
        }
        self.skipped = skipped;
        did
    }

    /// Serves VM `vm` while it has work and a positive deficit.
    fn turn(&mut self, vm: usize, serve: &mut impl FnMut(&mut Drr, Turn) -> bool) -> bool {
        let mut did = false;
        let mut first = true;
        loop {
            let d = serve(
                self,
                Turn {
                    vm,
                    first,
                    shared: true,
                },
            );
            did |= d;
            first = false;
            if !d || self.slots.get(vm).is_none_or(|s| s.deficit <= 0) {
                return did;
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn bucket_enforces_rate_with_small_burst() {
        let t0 = Instant::now();
        // 1000 ops/s: burst 5 ops.
        let mut b = TokenBucket::new(1000);
        let mut n = 0u64;
        while b.check(t0).is_none() {
            b.charge(1);
            n += 1;
            assert!(n < 100, "bucket never runs dry");
        }
        assert_eq!(n, 5, "burst is 5 ms of the rate");
        // Simulate a greedy client for one second with a 1 µs step clock:
        // it gets the rate, plus at most the burst.
        let mut now = t0;
        let end = at(t0, 1000);
        let mut ops = 0u64;
        while now < end {
            match b.check(now) {
                None => {
                    b.charge(1);
                    ops += 1;
                }
                Some(next) => {
                    assert!(next > now, "a refusal names a later time");
                    now = next;
                }
            }
        }
        assert!((999..=1001).contains(&ops), "{ops} ops in 1 s at 1000/s");
    }

    #[test]
    fn bucket_lets_large_messages_through_in_debt() {
        let t0 = Instant::now();
        // 1 MiB/s; a 4 MiB message runs, then the next waits 4 s.
        let mut b = TokenBucket::new(1 << 20);
        assert_eq!(b.check(t0), None);
        b.charge(4 << 20);
        let next = b.check(t0).map(|t| t.duration_since(t0));
        let Some(wait) = next else {
            panic!("bucket in debt must refuse");
        };
        let want = 4.0 - BURST_TIME.as_secs_f64();
        assert!((wait.as_secs_f64() - want).abs() < 1e-3, "waits {wait:?}");
        assert_eq!(b.check(t0 + wait), None, "free again at the time it named");
    }

    #[test]
    fn bucket_rate_change_applies_at_once() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10);
        b.charge(1);
        assert!(b.check(t0).is_some());
        // Unlimited: free at once.
        b.set_rate(0);
        assert_eq!(b.check(t0), None);
        // Limited again: starts full (1 token at 10/s), then refuses.
        b.set_rate(10);
        assert_eq!(b.check(t0), None);
        b.charge(2);
        let wait = b.check(t0).map(|t| t.duration_since(t0));
        assert!(wait.is_some_and(|w| w > Duration::from_millis(99)));
        // Raised: the debt is owed at the new rate (much sooner).
        b.set_rate(10_000);
        let wait = b.check(t0).map(|t| t.duration_since(t0));
        assert!(
            wait.is_some_and(|w| w < Duration::from_micros(200)),
            "{wait:?}"
        );
    }

    fn table(vms: Vec<QosSpec>, tenants: Vec<QosSpec>) -> QosTable {
        QosTable::new(vms, tenants)
    }

    fn tenancy(vms: usize, tenant_of: &[usize]) -> Tenancy {
        use crate::config::{DaemonConfig, TenantConfig};
        let sockets = (0..vms).map(|i| format!("/x{i}").into()).collect();
        let mut c = DaemonConfig::new(sockets);
        c.tenants.push(TenantConfig {
            name: "t1".into(),
            qos_class: None,
            engine: None,
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
    fn tenant_limit_applies_to_the_sum_and_counts_throttling() {
        let t0 = Instant::now();
        let ten = tenancy(3, &[1, 1, 0]);
        let lim = QosSpec {
            ops_per_sec: 1000,
            ..QosSpec::default()
        };
        let q = table(vec![QosSpec::default(); 3], vec![QosSpec::default(), lim]);
        let mut l = Limits::default();
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
    fn cost_model() {
        assert_eq!(cost_of(1, 0), OP_COST);
        // 64 KiB: 3.2 µs of copying plus the work request.
        assert_eq!(cost_of(1, 64 << 10), OP_COST + Duration::from_nanos(3200));
        assert_eq!(
            cost_of(32, 64 * 32),
            OP_COST * 32 + Duration::from_nanos(100)
        );
        assert_eq!(cost_of(u64::MAX, u64::MAX), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn low_weights_get_small_bursts() {
        assert_eq!(grain_of(100), (BURST, BURST_BYTES));
        assert_eq!(grain_of(1000), (BURST, BURST_BYTES));
        assert_eq!(grain_of(50), (BURST / 2, BURST_BYTES / 2));
        assert_eq!(grain_of(1), (1, BURST_BYTES / 100));
    }

    /// VMs that compete for one tenant bucket take turns at being first.
    #[test]
    fn drr_rotates_the_first_vm() {
        let mut d = Drr::default();
        d.resize(3);
        let mut firsts = [0; 3];
        for _ in 0..300 {
            let mut first = None;
            d.round(&[0, 1, 2], |d, t| {
                first.get_or_insert(t.vm);
                d.charge(t.vm, Duration::from_micros(20));
                true
            });
            if let Some(f) = first {
                firsts[f] += 1;
            }
        }
        assert_eq!(firsts, [100, 100, 100]);
    }

    /// Three always-busy VMs with weights 1:2:4 and different costs per
    /// burst: engine time follows the weights.
    #[test]
    fn drr_shares_follow_weights() {
        let mut d = Drr::default();
        d.resize(3);
        for (vm, w) in [(0, 100), (1, 200), (2, 400)] {
            d.set_weight(vm, w);
        }
        // Cost of one burst: VM 0 has expensive bursts, VM 2 cheap ones.
        let cost = [
            Duration::from_micros(37),
            Duration::from_micros(5),
            Duration::from_nanos(700),
        ];
        let bursts_per_pass = 4;
        let mut used = [Duration::ZERO; 3];
        for _ in 0..20_000 {
            d.round(&[0, 1, 2], |d, t| {
                assert!(t.shared);
                for _ in 0..bursts_per_pass {
                    used[t.vm] += cost[t.vm];
                    if !d.charge(t.vm, cost[t.vm]) {
                        break;
                    }
                }
                true
            });
        }
        let total: f64 = used.iter().map(Duration::as_secs_f64).sum();
        for (vm, ideal) in [(0, 1.0 / 7.0), (1, 2.0 / 7.0), (2, 4.0 / 7.0)] {
            let share = used[vm].as_secs_f64() / total;
            assert!(
                (share / ideal - 1.0).abs() < 0.02,
                "VM {vm}: {share} vs {ideal}"
            );
        }
    }

    /// Runs `rounds` rounds over `active`, each pass of VM `v` costing
    /// `cost[v]` per burst (four bursts a pass); returns each VM's share of
    /// the engine time.
    fn shares(d: &mut Drr, active: &[usize], cost: &[Duration], rounds: usize) -> Vec<f64> {
        let mut used = vec![Duration::ZERO; cost.len()];
        for _ in 0..rounds {
            d.round(active, |d, t| {
                for _ in 0..4 {
                    used[t.vm] += cost[t.vm];
                    if !d.charge(t.vm, cost[t.vm]) {
                        break;
                    }
                }
                true
            });
        }
        let total: f64 = used.iter().map(Duration::as_secs_f64).sum();
        used.iter().map(|u| u.as_secs_f64() / total).collect()
    }

    /// Tenants share by their weights, and a tenant's share is split among
    /// its VMs with work by theirs: a tenant gets nothing more by running
    /// more VMs, and its idle VMs leave their part to its busy ones.
    #[test]
    fn drr_shares_tenants_first_then_their_vms() {
        let mut d = Drr::default();
        d.resize(4);
        // Tenant 0: VM 0. Tenant 1: VMs 1, 2 and 3 (VM 3 twice as heavy).
        for (vm, w, group) in [(0, 100, 0), (1, 100, 1), (2, 100, 1), (3, 200, 1)] {
            d.set_weight(vm, w);
            d.set_group(vm, group, 100);
        }
        let cost = [
            Duration::from_micros(3),
            Duration::from_micros(11),
            Duration::from_nanos(900),
            Duration::from_micros(2),
        ];
        let got = shares(&mut d, &[0, 1, 2, 3], &cost, 20_000);
        for (vm, ideal) in [(0, 0.5), (1, 0.125), (2, 0.125), (3, 0.25)] {
            assert!((got[vm] / ideal - 1.0).abs() < 0.02, "VM {vm}: {got:?}");
        }
        // Tenant weights 1:3; VM 2 idle: VMs 1 and 3 split tenant 1's part.
        for vm in 0..4 {
            d.set_group(vm, usize::from(vm > 0), if vm > 0 { 300 } else { 100 });
        }
        let got = shares(&mut d, &[0, 1, 3], &cost, 20_000);
        for (vm, ideal) in [(0, 0.25), (1, 0.25), (3, 0.5)] {
            assert!((got[vm] / ideal - 1.0).abs() < 0.02, "VM {vm}: {got:?}");
        }
    }

    /// A light VM next to a heavy one is served in every round, and the
    /// heavy one is never starved even with the smallest weight.
    #[test]
    fn drr_serves_light_vms_every_round_and_starves_nobody() {
        let mut d = Drr::default();
        d.resize(2);
        d.set_weight(0, 1); // heavy: 100 ns quantum, 1 ms bursts
        d.set_weight(1, 100); // light: 1 µs of work per round
        let mut last_heavy = 0;
        let mut gaps = Vec::new();
        for round in 0..100_000 {
            let mut light = false;
            let did = d.round(&[0, 1], |d, t| {
                if t.vm == 1 {
                    light = true;
                    d.charge(1, Duration::from_micros(1));
                    // Its queue is empty after one pass.
                    return t.first;
                }
                d.charge(0, Duration::from_millis(1));
                gaps.push(round - last_heavy);
                last_heavy = round;
                true
            });
            assert!(did);
            assert!(light, "the light VM is served in round {round}");
        }
        // The heavy VM's 1 ms bursts against a 100 ns quantum: one burst
        // every 10 000 rounds, never more.
        let max_gap = gaps.iter().skip(1).max().copied().unwrap_or(0);
        assert!(!gaps.is_empty() && max_gap <= 10_000, "max gap {max_gap}");
    }

    /// When everyone with work is in debt, the round still serves someone
    /// (no idle sweep); a VM alone gets one pass per round and keeps no
    /// debt.
    #[test]
    fn drr_never_idles_with_work() {
        let mut d = Drr::default();
        d.resize(2);
        d.set_weight(0, 1);
        d.set_weight(1, 1);
        for _ in 0..1000 {
            let did = d.round(&[0, 1], |d, t| {
                d.charge(t.vm, Duration::from_millis(3));
                true
            });
            assert!(did, "a round with work did work");
        }
        let mut n = 0;
        d.round(&[1], |d, t| {
            assert!(t.first && !t.shared);
            n += 1;
            d.charge(1, Duration::from_millis(3))
        });
        assert_eq!(n, 1, "alone: one pass per round");
        d.round(&[1], |d, _| {
            assert_eq!(d.deficit(1), 100, "alone: a fresh quantum, no debt");
            true
        });
        // No work: deficit forgotten.
        d.idle(0);
        assert_eq!(d.deficit(0), 0);
    }
}
