//! The control-command rate limits of VMs and tenants
//! (`QosSpec::ctrl_per_sec`), as the VMs' control workers enforce them.
//!
//! One token per command, taken before the commands run from a
//! [`TokenBucket::ctrl`] holding at most [`ctrl_burst`](super::bucket::ctrl_burst)`(rate)` tokens —
//! 10 ms worth of commands, at least one. A short burst passes at once; a
//! sustained stream gets `rate` commands per second. A VM's commands need
//! a token of its tenant's bucket ([`TenantCtrlLimits`], shared by the
//! tenant's VMs) and one of its own ([`CtrlLimits`]). Both re-read their
//! rate when the generation of the [`QosTable`] moves.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bucket::TokenBucket;
use super::{Membership, QosTable};
use crate::sync::lock;

/// A control-command bucket and the QoS generation its rate was read at.
#[derive(Debug)]
struct Rated {
    generation: u64,
    bucket: TokenBucket,
}

impl Rated {
    /// Unlimited, and generation `u64::MAX`: the setting is read on first
    /// use.
    fn unread(now: Instant) -> Mutex<Rated> {
        Mutex::new(Rated {
            generation: u64::MAX,
            bucket: TokenBucket::ctrl(0, now),
        })
    }

    /// Re-reads the rate (`rate()`) if the QoS table is at another
    /// generation than when it was last read.
    fn refresh(&mut self, generation: u64, rate: impl FnOnce() -> u64, now: Instant) {
        if self.generation != generation {
            self.generation = generation;
            self.bucket.set_rate_at(rate(), now);
        }
    }
}

/// Every tenant's control-command bucket (`ctrl_per_sec` of its QoS
/// class), by tenant index, shared by the control workers of its VMs.
#[derive(Debug)]
pub struct TenantCtrlLimits {
    tenants: Vec<Mutex<Rated>>,
}

impl TenantCtrlLimits {
    /// The buckets of `tenants` tenants (their rates are read on first
    /// use).
    pub fn new(tenants: usize, now: Instant) -> Self {
        TenantCtrlLimits {
            tenants: (0..tenants).map(|_| Rated::unread(now)).collect(),
        }
    }
}

/// One VM's control-command rate limit: its own bucket and its tenant's.
/// Used by the VM's control worker only.
#[derive(Debug)]
pub struct CtrlLimits {
    vm: usize,
    own: Mutex<Rated>,
    tenants: Arc<TenantCtrlLimits>,
}

impl CtrlLimits {
    /// The limits of VM `vm`, whose tenant's bucket is in `tenants` (its
    /// rate is read on first use).
    pub fn new(vm: usize, tenants: Arc<TenantCtrlLimits>, now: Instant) -> Self {
        CtrlLimits {
            vm,
            own: Rated::unread(now),
            tenants,
        }
    }

    /// Takes up to `want` control-command tokens at `now`, re-reading the
    /// rates from `qos` when it changed (`tenancy` names the VM's tenant). Returns the number taken, or how
    /// long to wait for the next batch ([`TokenBucket::wait_batch`]).
    ///
    /// The tenant's bucket first (shared with its other VMs), then the
    /// VM's own; tokens the VM's bucket refuses go back to the tenant's.
    pub fn take(
        &self,
        want: u64,
        now: Instant,
        qos: &QosTable,
        tenancy: &impl Membership,
    ) -> Result<u64, Duration> {
        let generation = qos.generation();
        let tenant = tenancy
            .tenant_of(self.vm)
            .and_then(|t| Some((t, self.tenants.tenants.get(t)?)));
        let mut tenant = tenant.map(|(t, m)| {
            let mut guard = lock(m);
            let rate = || qos.tenant(t).map_or(0, |q| q.ctrl_per_sec);
            guard.refresh(generation, rate, now);
            guard
        });
        let allowed = match tenant.as_mut() {
            Some(t) => match t.bucket.take(want, now) {
                0 if want > 0 => return Err(t.bucket.wait_batch(want, now)),
                n => n,
            },
            None => want,
        };
        let mut own = lock(&self.own);
        let rate = || qos.vm(self.vm).map_or(0, |q| q.ctrl_per_sec);
        own.refresh(generation, rate, now);
        let n = own.bucket.take(allowed, now);
        if let Some(t) = tenant.as_mut() {
            // `n <= allowed`.
            t.bucket.give_back(allowed.saturating_sub(n));
        }
        match n {
            0 if want > 0 => Err(own.bucket.wait_batch(allowed, now)),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::tests::tenancy;
    use crate::qos::QosSpec;
    use crate::tenancy::Tenancy;

    const MS: Duration = Duration::from_millis(1);

    /// A control-command limit of `ctrl` per second and nothing else.
    fn ctrl(ctrl: u64) -> QosSpec {
        QosSpec {
            ctrl_per_sec: ctrl,
            ..QosSpec::unlimited()
        }
    }

    /// VMs 0 and 1 of tenant 1 (1000/s), VM 2 of tenant 0 (unlimited);
    /// `vms`: the VMs' own limits.
    fn world(vms: [u64; 3], t0: Instant) -> (QosTable, Tenancy, Vec<CtrlLimits>) {
        let q = QosTable::new(vms.map(ctrl).to_vec(), vec![ctrl(0), ctrl(1000)]);
        let ten = tenancy(3, &[1, 1, 0]);
        let shared = Arc::new(TenantCtrlLimits::new(2, t0));
        let l = (0..3)
            .map(|vm| CtrlLimits::new(vm, shared.clone(), t0))
            .collect();
        (q, ten, l)
    }

    #[test]
    fn a_tenant_limit_is_shared_by_its_vms() {
        let t0 = Instant::now();
        let (q, ten, l) = world([0, 0, 0], t0);
        // First use reads the settings; a bucket that was unlimited keeps
        // its one token.
        assert_eq!(l[0].take(64, t0, &q, &ten), Ok(1));
        let t1 = t0 + Duration::from_secs(1);
        // The tenant's burst (10 ms at 1000/s) to whoever asks first; the
        // tenant's other VM waits for a token (a batch of 1 ms is 1).
        assert_eq!(l[0].take(64, t1, &q, &ten), Ok(10));
        assert_eq!(l[1].take(64, t1, &q, &ten), Err(MS));
        assert_eq!(l[1].take(64, t1 + MS, &q, &ten), Ok(1));
        // Another tenant's VM is not held back.
        assert_eq!(l[2].take(64, t1, &q, &ten), Ok(64));
        assert_eq!(l[2].take(0, t1, &q, &ten), Ok(0));
    }

    #[test]
    fn tokens_the_vm_refuses_go_back_to_the_tenant() {
        let t0 = Instant::now();
        // VM 0 limited to 100/s (a burst of one), VM 1 unlimited.
        let (q, ten, l) = world([100, 0, 0], t0);
        assert_eq!(l[0].take(1, t0, &q, &ten), Ok(1));
        let t1 = t0 + Duration::from_secs(1);
        // The tenant grants 10, the VM's bucket takes 1: 9 go back.
        assert_eq!(l[0].take(64, t1, &q, &ten), Ok(1));
        // Refused by its own bucket: it waits for one of its tokens.
        assert_eq!(l[0].take(64, t1, &q, &ten), Err(10 * MS));
        // The 9 are there for VM 1.
        assert_eq!(l[1].take(64, t1, &q, &ten), Ok(9));
    }

    #[test]
    fn settings_are_reread_when_the_table_changes() {
        let t0 = Instant::now();
        let (q, ten, l) = world([100, 0, 0], t0);
        assert_eq!(l[0].take(5, t0, &q, &ten), Ok(1));
        assert_eq!(l[0].take(5, t0, &q, &ten), Err(MS));
        // Unlimited VM and tenant: everything at once.
        assert_eq!(q.set_vm(0, ctrl(0)), Ok(()));
        assert_eq!(q.set_tenant(1, ctrl(0)), Ok(()));
        assert_eq!(l[0].take(500, t0, &q, &ten), Ok(500));
        // Limited again: no burst is granted by the change.
        assert_eq!(q.set_vm(0, ctrl(100)), Ok(()));
        assert_eq!(l[0].take(5, t0, &q, &ten), Err(10 * MS));
    }
}
