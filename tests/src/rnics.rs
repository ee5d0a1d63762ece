//! RNIC object halves for tests: the software RNIC with a different QP number
//! policy, to make races that take an attacker thousands of tries happen
//! at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use vhost_user_rdma::rnic::soft::SoftRnic;
use vhost_user_rdma::rnic_objects::{
    Caps, MrKeys, MrSpec, Owner, QpChange, QpSpec, RnicError, RnicKind, RnicObjects, SrqSpec,
};
use virtio_rdma_abi::qp::AddressVector;

#[derive(Default)]
struct Qpns {
    used: HashMap<u32, Owner>,
    free: Vec<u32>,
    next: u32,
}

/// The software RNIC, except that a freed QP number is handed out again
/// at once (last freed, first reused) while reuse is on; otherwise numbers
/// count up from 0x101. The data path is the software RNIC's.
pub struct RecyclingQpns {
    soft: SoftRnic,
    qpns: Mutex<Qpns>,
    reuse: bool,
    /// Hand out fresh numbers only for now.
    fresh: AtomicBool,
}

impl RecyclingQpns {
    /// Reusing freed numbers if `reuse`.
    pub fn new(reuse: bool) -> Self {
        RecyclingQpns {
            soft: SoftRnic::new(),
            qpns: Mutex::new(Qpns {
                next: 0x100,
                ..Qpns::default()
            }),
            reuse,
            fresh: AtomicBool::new(false),
        }
    }

    /// Starts the numbering again as a new one does (0x101 first, nothing
    /// to reuse), so that a harness keeping one daemon for many runs hands
    /// out the same numbers in each run as a fresh daemon would. Only while
    /// no number is in use: returns false (and changes nothing) otherwise.
    pub fn restart(&self) -> bool {
        let mut q = self.lock();
        if !q.used.is_empty() {
            return false;
        }
        q.free.clear();
        q.next = 0x100;
        self.fresh.store(false, Ordering::Relaxed);
        true
    }

    /// While `on`, every number handed out is one never used before.
    pub fn fresh_only(&self, on: bool) {
        self.fresh.store(on, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Qpns> {
        self.qpns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RnicObjects for RecyclingQpns {
    fn kind(&self) -> RnicKind {
        RnicKind::Soft
    }
    fn caps(&self) -> Caps {
        self.soft.caps()
    }
    fn create_pd(&self, owner: Owner) -> Result<(), RnicError> {
        self.soft.create_pd(owner)
    }
    fn destroy_pd(&self, owner: Owner) {
        self.soft.destroy_pd(owner)
    }
    fn create_qp(&self, owner: Owner, _spec: &QpSpec) -> Result<u32, RnicError> {
        let mut q = self.lock();
        let reuse = self.reuse && !self.fresh.load(Ordering::Relaxed);
        let qpn = match reuse.then(|| q.free.pop()).flatten() {
            Some(n) => n,
            None => {
                q.next += 1;
                q.next
            }
        };
        q.used.insert(qpn, owner);
        Ok(qpn)
    }
    fn modify_qp(&self, change: &QpChange<'_>) -> Result<(), RnicError> {
        self.soft.modify_qp(change)
    }
    fn destroy_qp(&self, qpn: u32) {
        let mut q = self.lock();
        if q.used.remove(&qpn).is_some() {
            q.free.push(qpn);
        }
    }
    fn lookup_qpn(&self, qpn: u32) -> Option<Owner> {
        self.lock().used.get(&qpn).copied()
    }
    fn qpns_in_use(&self) -> usize {
        self.lock().used.len()
    }
    fn create_cq(&self, owner: Owner, depth: u32) -> Result<(), RnicError> {
        self.soft.create_cq(owner, depth)
    }
    fn destroy_cq(&self, owner: Owner) {
        self.soft.destroy_cq(owner)
    }
    fn create_srq(&self, owner: Owner, spec: &SrqSpec) -> Result<(), RnicError> {
        self.soft.create_srq(owner, spec)
    }
    fn destroy_srq(&self, owner: Owner) {
        self.soft.destroy_srq(owner)
    }
    fn create_ah(&self, owner: Owner, pd: u32, av: &AddressVector) -> Result<(), RnicError> {
        self.soft.create_ah(owner, pd, av)
    }
    fn destroy_ah(&self, owner: Owner) {
        self.soft.destroy_ah(owner)
    }
    fn reg_mr(&self, owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.soft.reg_mr(owner, mr)
    }
    fn dereg_mr(&self, keys: MrKeys) {
        self.soft.dereg_mr(keys)
    }
    fn rereg_mr(&self, owner: Owner, keys: MrKeys, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.soft.rereg_mr(owner, keys, mr)
    }
    fn alloc_fast_mr(&self, owner: Owner) -> Result<u32, RnicError> {
        self.soft.alloc_fast_mr(owner)
    }
    fn free_fast_mr(&self, key: u32) {
        self.soft.free_fast_mr(key)
    }
    fn keys_in_use(&self) -> usize {
        self.soft.keys_in_use()
    }
}

/// The host halves a [`CountingRnic`] holds, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostHalves {
    /// PDs.
    pub pds: i64,
    /// CQs.
    pub cqs: i64,
    /// QPs.
    pub qps: i64,
    /// SRQs.
    pub srqs: i64,
    /// AHs.
    pub ahs: i64,
    /// Registered MRs.
    pub mrs: i64,
}

/// The software RNIC, counting the host halves of objects it holds: what a
/// host NIC would hold (a PD, CQ or MR of the NIC's per guest object), so
/// that a test can check that none outlives its object.
#[derive(Default)]
pub struct CountingRnic {
    soft: SoftRnic,
    live: Mutex<HostHalves>,
}

impl CountingRnic {
    /// The host halves held now.
    pub fn live(&self) -> HostHalves {
        *self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut HostHalves)) {
        f(&mut self.live.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Counts one more of a kind if `r` is a success, passing `r` on.
    fn made<T>(
        &self,
        r: Result<T, RnicError>,
        f: impl FnOnce(&mut HostHalves),
    ) -> Result<T, RnicError> {
        if r.is_ok() {
            self.count(f);
        }
        r
    }
}

impl RnicObjects for CountingRnic {
    fn kind(&self) -> RnicKind {
        RnicKind::Soft
    }
    fn caps(&self) -> Caps {
        self.soft.caps()
    }
    fn create_pd(&self, owner: Owner) -> Result<(), RnicError> {
        self.made(self.soft.create_pd(owner), |h| h.pds += 1)
    }
    fn destroy_pd(&self, owner: Owner) {
        self.soft.destroy_pd(owner);
        self.count(|h| h.pds -= 1);
    }
    fn create_qp(&self, owner: Owner, spec: &QpSpec) -> Result<u32, RnicError> {
        self.made(self.soft.create_qp(owner, spec), |h| h.qps += 1)
    }
    fn modify_qp(&self, change: &QpChange<'_>) -> Result<(), RnicError> {
        self.soft.modify_qp(change)
    }
    fn destroy_qp(&self, qpn: u32) {
        self.soft.destroy_qp(qpn);
        self.count(|h| h.qps -= 1);
    }
    fn lookup_qpn(&self, qpn: u32) -> Option<Owner> {
        self.soft.lookup_qpn(qpn)
    }
    fn qpns_in_use(&self) -> usize {
        self.soft.qpns_in_use()
    }
    fn create_cq(&self, owner: Owner, depth: u32) -> Result<(), RnicError> {
        self.made(self.soft.create_cq(owner, depth), |h| h.cqs += 1)
    }
    fn destroy_cq(&self, owner: Owner) {
        self.soft.destroy_cq(owner);
        self.count(|h| h.cqs -= 1);
    }
    fn create_srq(&self, owner: Owner, spec: &SrqSpec) -> Result<(), RnicError> {
        self.made(self.soft.create_srq(owner, spec), |h| h.srqs += 1)
    }
    fn destroy_srq(&self, owner: Owner) {
        self.soft.destroy_srq(owner);
        self.count(|h| h.srqs -= 1);
    }
    fn create_ah(&self, owner: Owner, pd: u32, av: &AddressVector) -> Result<(), RnicError> {
        self.made(self.soft.create_ah(owner, pd, av), |h| h.ahs += 1)
    }
    fn destroy_ah(&self, owner: Owner) {
        self.soft.destroy_ah(owner);
        self.count(|h| h.ahs -= 1);
    }
    fn reg_mr(&self, owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.made(self.soft.reg_mr(owner, mr), |h| h.mrs += 1)
    }
    fn dereg_mr(&self, keys: MrKeys) {
        self.soft.dereg_mr(keys);
        self.count(|h| h.mrs -= 1);
    }
    fn rereg_mr(&self, owner: Owner, keys: MrKeys, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.soft.rereg_mr(owner, keys, mr)
    }
    fn alloc_fast_mr(&self, owner: Owner) -> Result<u32, RnicError> {
        self.made(self.soft.alloc_fast_mr(owner), |h| h.mrs += 1)
    }
    fn free_fast_mr(&self, key: u32) {
        self.soft.free_fast_mr(key);
        self.count(|h| h.mrs -= 1);
    }
    fn keys_in_use(&self) -> usize {
        self.soft.keys_in_use()
    }
}
