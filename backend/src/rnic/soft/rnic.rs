//! The software RNIC's object half: the number spaces that must be unique
//! across the VMs of the daemon (QP numbers, so that one VM's QP can
//! address another's, and memory keys). It has no host objects behind CQs,
//! SRQs, AHs and MRs: the engine works on the device's own.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use virtio_rdma_abi::qp::Mtu;
use virtio_rdma_abi::verbs::MCAST_QPN;

use super::keyspace::KeySpace;
use crate::rnic::directory::Directory;
use crate::rnic_objects::{
    Caps, MrKeys, MrSpec, Owner, PortGids, QpChange, QpSpec, RnicError, RnicKind, RnicObjects,
};
use crate::sync::{lock, read, write};

/// QPNs are 24 bits; 0 and 1 are the special management QPs of InfiniBand.
const QPN_MASK: u32 = 0x00ff_ffff;
const FIRST_QPN: u32 = 2;
/// Reported ack delay, 4.096 µs × 2^15 ≈ 134 ms: the engine answers a
/// request when it executes it, but its threads share the host with
/// everything else and may be descheduled; 15 is also what Linux's soft
/// RoCE reports, so timeouts derived from it are the familiar ones.
const SOFT_ACK_DELAY: u32 = 15;
/// `max_fast_reg_pages`: the page array of a fast registration fills one
/// 4 KiB page (spec 18.27), and its translation, allocated at `ALLOC_MR`,
/// is 4 KiB.
pub const MAX_FAST_REG_PAGES: u32 = 512;

/// The software RNIC: RDMA between the VMs of one daemon.
///
/// The QPN directory is behind a read-write lock: lookups (the engine
/// routing a UD message, the control path checking a destination against
/// the tenant policy) share it and never wait for each other; only
/// creation and destruction take it exclusively.
pub struct SoftRnic {
    qpns: RwLock<Directory<Owner>>,
    /// lkeys and rkeys, one space (a key is never both, but for a
    /// fast-registration region, whose key is both its lkey and its rkey).
    keys: Mutex<KeySpace>,
    /// Multicast group -> the UD QPs attached to it, of every VM (a sender
    /// reaches those of its tenant only: `route`).
    mcast: RwLock<HashMap<[u8; 16], Vec<Owner>>>,
    /// XRC SRQ numbers (`F_XRC`): random and unique on the RNIC, as QPNs
    /// are, so that a number says nothing of another VM's SRQs.
    srqns: Mutex<Directory<Owner>>,
}

impl Default for SoftRnic {
    fn default() -> Self {
        Self::new()
    }
}

impl SoftRnic {
    /// A software RNIC with no objects.
    pub fn new() -> Self {
        SoftRnic {
            qpns: RwLock::new(Directory::new(QPN_MASK, FIRST_QPN)),
            keys: Mutex::new(KeySpace::new()),
            mcast: RwLock::new(HashMap::new()),
            srqns: Mutex::new(Directory::new(QPN_MASK, 1)),
        }
    }

    // A poisoned lock only means another thread panicked mid-update of a
    // set of integers; the set itself is still consistent.
    fn qpns(&self) -> RwLockWriteGuard<'_, Directory<Owner>> {
        write(&self.qpns)
    }

    fn qpns_read(&self) -> RwLockReadGuard<'_, Directory<Owner>> {
        read(&self.qpns)
    }

    fn keys(&self) -> MutexGuard<'_, KeySpace> {
        lock(&self.keys)
    }
}

impl RnicObjects for SoftRnic {
    fn kind(&self) -> RnicKind {
        RnicKind::Soft
    }

    fn caps(&self) -> Caps {
        Caps {
            max_mtu: Mtu::MTU_4096 as u32,
            link_rate_mbps: 100_000,
            atomics: true,
            max_msg_size: 1 << 31,
            local_ca_ack_delay: SOFT_ACK_DELAY,
            max_fast_reg_pages: MAX_FAST_REG_PAGES,
            windows: true,
            uc: true,
            mcast: true,
            xrc: true,
            resize: true,
            gids: PortGids::PerVm,
            gsi: true,
            dirty_log: true,
        }
    }

    fn create_qp(&self, owner: Owner, _spec: &QpSpec) -> Result<u32, RnicError> {
        // MCAST_QPN names a multicast group's QPs, never one QP.
        self.qpns().alloc_if(owner, |n| n != MCAST_QPN)
    }

    fn modify_qp(&self, _change: &QpChange<'_>) -> Result<(), RnicError> {
        // The engine reads the device's QP state itself.
        Ok(())
    }

    fn destroy_qp(&self, qpn: u32) {
        self.qpns().free(qpn);
    }

    fn alloc_srqn(&self, owner: Owner) -> Result<u32, RnicError> {
        lock(&self.srqns).alloc(owner)
    }

    fn free_srqn(&self, srqn: u32) {
        lock(&self.srqns).free(srqn);
    }

    fn lookup_qpn(&self, qpn: u32) -> Option<Owner> {
        self.qpns_read().get(qpn).copied()
    }

    fn claim_qp(&self, owner: Owner, qpn: u32, _spec: &QpSpec) -> Result<(), RnicError> {
        self.qpns().claim(qpn, owner, |n| n != MCAST_QPN)
    }

    fn claim_mr(&self, _owner: Owner, keys: MrKeys, _mr: &MrSpec<'_>) -> Result<(), RnicError> {
        let mut d = self.keys();
        d.claim(keys.lkey)?;
        if keys.rkey != 0 {
            if let Err(e) = d.claim(keys.rkey) {
                d.free(keys.lkey);
                return Err(e);
            }
        }
        Ok(())
    }

    fn claim_fast_mr(&self, _owner: Owner, key: u32) -> Result<(), RnicError> {
        self.keys().claim_fast(key)
    }

    fn claim_srqn(&self, owner: Owner, srqn: u32) -> Result<(), RnicError> {
        lock(&self.srqns).claim(srqn, owner, |_| true)
    }

    fn rehome(&self, from: usize, to: usize, qpns: &[u32], srqns: &[u32]) -> Result<(), RnicError> {
        let mut q = self.qpns();
        let mut s = lock(&self.srqns);
        let theirs = |o: Option<&Owner>| o.is_some_and(|o| o.vm == from);
        if !qpns.iter().all(|&n| theirs(q.get(n))) || !srqns.iter().all(|&n| theirs(s.get(n))) {
            return Err(RnicError::Invalid);
        }
        for &n in qpns {
            if let Some(o) = q.get_mut(n) {
                o.vm = to;
            }
        }
        for &n in srqns {
            if let Some(o) = s.get_mut(n) {
                o.vm = to;
            }
        }
        for members in write(&self.mcast).values_mut() {
            for m in members.iter_mut().filter(|m| m.vm == from) {
                m.vm = to;
            }
        }
        Ok(())
    }

    fn qpns_in_use(&self) -> usize {
        self.qpns_read().len()
    }

    fn reg_mr(&self, _owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        let mut keys = self.keys();
        let lkey = keys.alloc()?;
        let rkey = if mr.remote {
            match keys.alloc() {
                Ok(k) => k,
                Err(e) => {
                    keys.free(lkey);
                    return Err(e);
                }
            }
        } else {
            0
        };
        Ok(MrKeys { lkey, rkey })
    }

    fn dereg_mr(&self, keys: MrKeys) {
        let mut d = self.keys();
        d.free(keys.lkey);
        if keys.rkey != 0 {
            d.free(keys.rkey);
        }
    }

    fn rereg_mr(&self, _owner: Owner, keys: MrKeys, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        // The guest's region reads and writes guest RAM through the VM's
        // map at each access: only a missing rkey is the RNIC's to add.
        let rkey = if keys.rkey == 0 && mr.remote {
            self.keys().alloc()?
        } else {
            keys.rkey
        };
        Ok(MrKeys {
            lkey: keys.lkey,
            rkey,
        })
    }

    fn alloc_fast_mr(&self, _owner: Owner) -> Result<u32, RnicError> {
        self.keys().alloc_fast()
    }

    fn free_fast_mr(&self, key: u32) {
        self.keys().free_fast(key);
    }

    fn keys_in_use(&self) -> usize {
        self.keys().len()
    }

    fn mcast_attach(&self, owner: Owner, mgid: &[u8; 16]) -> Result<(), RnicError> {
        let mut groups = write(&self.mcast);
        let members = groups.entry(*mgid).or_default();
        if !members.contains(&owner) {
            members.push(owner);
        }
        Ok(())
    }

    fn mcast_detach(&self, owner: Owner, mgid: &[u8; 16]) {
        let mut groups = write(&self.mcast);
        if let Some(members) = groups.get_mut(mgid) {
            members.retain(|m| *m != owner);
            if members.is_empty() {
                groups.remove(mgid);
            }
        }
    }

    fn mcast_members(&self, mgid: &[u8; 16], out: &mut Vec<Owner>) {
        out.clear();
        if let Some(members) = read(&self.mcast).get(mgid) {
            out.extend_from_slice(members);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing;
    use virtio_rdma_abi::qp::QpType;
    use vm_memory::GuestAddress;

    /// Spec 12.29, appendix D: XRC SRQ numbers are 24 bits, never 0, one
    /// owner each until freed; an RNIC without XRC does not offer `F_XRC`.
    #[test]
    fn srq_numbers_and_the_xrc_feature() {
        use virtio_rdma_abi::config::F_XRC;
        let r = SoftRnic::new();
        let owner = Owner {
            vm: 1,
            handle: 9,
            incarnation: 0,
        };
        let n: Vec<u32> = (0..64).map(|_| r.alloc_srqn(owner).unwrap()).collect();
        assert!(n.iter().all(|&x| x != 0 && x <= QPN_MASK));
        let mut unique = n.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), n.len());
        for x in n {
            r.free_srqn(x);
        }
        assert!(lock(&r.srqns).is_empty());
        let caps = r.caps();
        assert_ne!(caps.features() & F_XRC, 0);
        let without = Caps { xrc: false, ..caps };
        assert_eq!(without.features() & F_XRC, 0);
    }

    #[test]
    fn qpns_are_24_bit_and_owned() {
        let r = SoftRnic::new();
        let owner = Owner {
            vm: 3,
            handle: 0x100005,
            incarnation: 7,
        };
        let spec = QpSpec {
            qp_type: QpType::RC,
            pd: 1,
            send_cq: 1,
            recv_cq: 1,
            srq: 0,
            sq_depth: 16,
            rq_depth: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let q = r.create_qp(owner, &spec).unwrap();
        assert!((FIRST_QPN..=QPN_MASK).contains(&q));
        assert_eq!(r.lookup_qpn(q), Some(owner));
        assert_eq!(r.qpns_in_use(), 1);
        r.destroy_qp(q);
        assert_eq!(r.lookup_qpn(q), None);
        assert_eq!(r.qpns_in_use(), 0);
    }

    #[test]
    fn keys_are_distinct_nonzero_and_returned() {
        let r = SoftRnic::new();
        let owner = Owner {
            vm: 0,
            handle: 1,
            incarnation: 0,
        };
        let mem = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
        let pages = testing::one_page(0, &mem);
        let spec = |remote| MrSpec {
            pd: 1,
            access: 0,
            iova: 0,
            length: 4096,
            remote,
            first_page_offset: 0,
            pages: &pages,
        };
        let local = r.reg_mr(owner, &spec(false)).unwrap();
        assert_ne!(local.lkey, 0);
        assert_eq!(local.rkey, 0);
        let both = r.reg_mr(owner, &spec(true)).unwrap();
        assert!(both.lkey != 0 && both.rkey != 0 && both.lkey != both.rkey);
        assert_ne!(both.lkey, local.lkey);
        assert_eq!(r.keys_in_use(), 3);
        r.dereg_mr(local);
        r.dereg_mr(both);
        assert_eq!(r.keys_in_use(), 0);
    }
}
