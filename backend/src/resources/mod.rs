//! The objects a VM owns, in per-VM handle tables, with their dependencies.
//!
//! Everything here has already been validated by the control path; these
//! types only keep state consistent: reference counts, key maps, quotas and
//! the release of everything on destroy, context teardown and disconnect.

pub mod handle;
pub mod objects;
pub mod qp_state;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use handle::HandleTable;
pub use objects::{
    Ah, Context, Cq, CqRuntime, HostCost, Inbound, Mr, Pd, Qp, QpRuntime, SendPartial, SendWait,
    Srq, SrqRuntime,
};

use crate::memory::PageList;
use crate::rnic::Rnic;
use crate::shmem::{DbSlot, DoorbellPages};

/// A hasher for the 32-bit keys the data path looks up per work request
/// (lkeys, rkeys, QP numbers): one multiply instead of SipHash.
///
/// The keys are drawn by the device from a random source, never chosen by
/// a guest, so a guest cannot aim many keys at one bucket; a keyed hash that
/// resists such flooding is not needed here.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

const KEY_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(KEY_MUL);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(n)).wrapping_mul(KEY_MUL);
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(KEY_MUL);
    }

    fn finish(&self) -> u64 {
        // The table indexes buckets with the low bits: fold the well-mixed
        // high half of the product into them.
        self.0 ^ (self.0 >> 29)
    }
}

/// A map keyed by device-drawn 32-bit keys, hashed with [`KeyHasher`].
pub type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

crate::stats::sums! {
/// Counts of live objects of one VM.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Contexts.
    pub ctx: usize,
    /// Protection domains.
    pub pd: usize,
    /// Completion queues.
    pub cq: usize,
    /// Queue pairs.
    pub qp: usize,
    /// Memory regions.
    pub mr: usize,
    /// Shared receive queues.
    pub srq: usize,
    /// Address handles.
    pub ah: usize,
    /// Bytes registered by all MRs.
    pub registered_bytes: u64,
    /// Host memory held for the live objects ([`HostCost`]).
    pub host_bytes: u64,
}
}

impl ResourceCounts {
    /// Whether the VM holds nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == ResourceCounts::default()
    }
}

/// Why an object could not be destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// No such live object.
    BadHandle,
    /// Other objects still refer to it (how many).
    Busy(u32),
}

/// All objects of one VM.
#[derive(Default)]
pub struct VmResources {
    /// Contexts.
    pub ctxs: HandleTable<Context>,
    /// Protection domains.
    pub pds: HandleTable<Pd>,
    /// Completion queues.
    pub cqs: HandleTable<Cq>,
    /// Memory regions.
    pub mrs: HandleTable<Mr>,
    /// Queue pairs.
    pub qps: HandleTable<Qp>,
    /// Address handles.
    pub ahs: HandleTable<Ah>,
    /// Shared receive queues.
    pub srqs: HandleTable<Srq>,
    /// lkey -> MR handle.
    pub lkeys: KeyMap<u32>,
    /// rkey -> MR handle.
    pub rkeys: KeyMap<u32>,
    /// Sum of the lengths of all live MRs.
    pub registered_bytes: u64,
    /// Sum of the [`HostCost`] of all live objects.
    pub host_bytes: u64,
    /// Doorbell pages and slots (shared-memory doorbell mode).
    pub doorbells: Option<DoorbellPages>,
    /// Translations of destroyed objects, not yet freed: freeing the 32 MiB
    /// of a 16 GiB MR takes milliseconds, which the control path spends
    /// after it releases the VM's lock ([`VmResources::take_released`]).
    released: Vec<PageList>,
}

fn dec(count: &mut u32) {
    *count = count.saturating_sub(1);
}

impl VmResources {
    /// Live object counts.
    pub fn counts(&self) -> ResourceCounts {
        ResourceCounts {
            ctx: self.ctxs.len(),
            pd: self.pds.len(),
            cq: self.cqs.len(),
            qp: self.qps.len(),
            mr: self.mrs.len(),
            srq: self.srqs.len(),
            ah: self.ahs.len(),
            registered_bytes: self.registered_bytes,
            host_bytes: self.host_bytes,
        }
    }

    /// Charges the host memory of an object just inserted (its cost taken
    /// before the insert, see [`HostCost`]).
    pub fn charge(&mut self, bytes: u64) {
        self.host_bytes = self.host_bytes.saturating_add(bytes);
    }

    fn refund(&mut self, obj: &impl HostCost) {
        self.host_bytes = self.host_bytes.saturating_sub(obj.host_cost());
    }

    /// Keeps a translation that is no longer used (of a destroyed object,
    /// or of one that could not be created) for [`VmResources::take_released`]
    /// (only one that holds heap memory).
    pub fn release(&mut self, pages: PageList) {
        if pages.host_bytes() > 0 {
            self.released.push(pages);
        }
    }

    /// The translations of objects destroyed since the last call: the
    /// caller drops them once it no longer holds the VM's lock.
    pub fn take_released(&mut self) -> Vec<PageList> {
        std::mem::take(&mut self.released)
    }

    /// Destroys a QP and drops its references; its QPN returns to the engine.
    pub fn destroy_qp(&mut self, handle: u32, rnic: &dyn Rnic) -> Result<(), DestroyError> {
        let qp = self.qps.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&qp);
        if let Some(pd) = self.pds.get_mut(qp.pd) {
            dec(&mut pd.users);
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(cq) {
                dec(&mut cq.users);
            }
        }
        if qp.srq != 0 {
            if let Some(srq) = self.srqs.get_mut(qp.srq) {
                dec(&mut srq.users);
            }
        }
        rnic.free_qpn(qp.qpn);
        self.free_slot(qp.db_slot.as_ref());
        self.release(qp.ring);
        Ok(())
    }

    fn free_slot(&mut self, slot: Option<&DbSlot>) {
        if let (Some(db), Some(s)) = (self.doorbells.as_mut(), slot) {
            db.free_slot(s.at());
        }
    }

    /// Deregisters an MR.
    pub fn dereg_mr(&mut self, handle: u32) -> Result<(), DestroyError> {
        let mr = self.mrs.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&mr);
        self.lkeys.remove(&mr.lkey);
        if mr.rkey != 0 {
            self.rkeys.remove(&mr.rkey);
        }
        self.registered_bytes = self.registered_bytes.saturating_sub(mr.length);
        if let Some(pd) = self.pds.get_mut(mr.pd) {
            dec(&mut pd.users);
        }
        self.release(mr.pages);
        Ok(())
    }

    /// Destroys an AH.
    pub fn destroy_ah(&mut self, handle: u32) -> Result<(), DestroyError> {
        let ah = self.ahs.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&ah);
        if let Some(pd) = self.pds.get_mut(ah.pd) {
            dec(&mut pd.users);
        }
        Ok(())
    }

    /// Destroys an SRQ unless QPs use it.
    pub fn destroy_srq(&mut self, handle: u32) -> Result<(), DestroyError> {
        let srq = self.srqs.get(handle).ok_or(DestroyError::BadHandle)?;
        if srq.users > 0 {
            return Err(DestroyError::Busy(srq.users));
        }
        let pd = srq.pd;
        if let Some(srq) = self.srqs.remove(handle) {
            self.refund(&srq);
            self.free_slot(srq.db_slot.as_ref());
            self.release(srq.ring);
        }
        if let Some(pd) = self.pds.get_mut(pd) {
            dec(&mut pd.users);
        }
        Ok(())
    }

    /// Destroys a CQ unless QPs use it.
    pub fn destroy_cq(&mut self, handle: u32) -> Result<(), DestroyError> {
        let cq = self.cqs.get(handle).ok_or(DestroyError::BadHandle)?;
        if cq.users > 0 {
            return Err(DestroyError::Busy(cq.users));
        }
        if let Some(cq) = self.cqs.remove(handle) {
            self.refund(&cq);
            self.release(cq.ring);
        }
        Ok(())
    }

    /// Frees a PD unless MRs, QPs, AHs or SRQs use it.
    pub fn dealloc_pd(&mut self, handle: u32) -> Result<(), DestroyError> {
        let pd = self.pds.get(handle).ok_or(DestroyError::BadHandle)?;
        if pd.users > 0 {
            return Err(DestroyError::Busy(pd.users));
        }
        if let Some(pd) = self.pds.remove(handle) {
            self.refund(&pd);
        }
        Ok(())
    }

    /// Destroys a context and everything it owns, dependents first.
    pub fn destroy_ctx(&mut self, handle: u32, rnic: &dyn Rnic) -> Result<(), DestroyError> {
        if self.ctxs.get(handle).is_none() {
            return Err(DestroyError::BadHandle);
        }
        let owned = |ctx: u32| ctx == handle;
        for h in collect(&self.qps, |o| owned(o.ctx)) {
            let _ = self.destroy_qp(h, rnic);
        }
        for h in collect(&self.srqs, |o| owned(o.ctx)) {
            let _ = self.destroy_srq(h);
        }
        for h in collect(&self.ahs, |o| owned(o.ctx)) {
            let _ = self.destroy_ah(h);
        }
        for h in collect(&self.mrs, |o| owned(o.ctx)) {
            let _ = self.dereg_mr(h);
        }
        for h in collect(&self.cqs, |o| owned(o.ctx)) {
            let _ = self.destroy_cq(h);
        }
        for h in collect(&self.pds, |o| owned(o.ctx)) {
            let _ = self.dealloc_pd(h);
        }
        if let Some(ctx) = self.ctxs.remove(handle) {
            self.refund(&ctx);
            if let (Some(db), Some(page)) = (self.doorbells.as_mut(), ctx.db_page) {
                db.free_page(page);
            }
        }
        Ok(())
    }

    /// Releases everything (device reset or VMM disconnect).
    pub fn clear(&mut self, rnic: &dyn Rnic) {
        for h in self.ctxs.handles() {
            let _ = self.destroy_ctx(h, rnic);
        }
        // Nothing can exist outside a context; clear defensively anyway so a
        // bookkeeping slip cannot leak QPNs into the shared engine.
        for (_, qp) in self.qps.iter() {
            rnic.free_qpn(qp.qpn);
        }
        self.qps.clear();
        self.srqs.clear();
        self.ahs.clear();
        self.mrs.clear();
        self.cqs.clear();
        self.pds.clear();
        self.lkeys.clear();
        self.rkeys.clear();
        self.registered_bytes = 0;
        self.host_bytes = 0;
        if let Some(db) = self.doorbells.as_mut() {
            db.clear();
        }
    }
}

fn collect<T>(table: &HandleTable<T>, pred: impl Fn(&T) -> bool) -> Vec<u32> {
    table
        .iter()
        .filter(|(_, o)| pred(o))
        .map(|(h, _)| h)
        .collect()
}

#[cfg(test)]
#[allow(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;
    use crate::memory::pagelist::PageListLimits;
    use crate::memory::RamMap;
    use crate::rnic::soft::SoftRnic;
    use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    fn mr(npages: u32) -> Mr {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let ram = RamMap::from_guest_memory(&mem);
        let desc = BufferDesc {
            addr: 0,
            npages,
            first_page_offset: 0,
            page_shift: 12,
            mode: PageListMode::INLINE as u32,
        };
        let list: Vec<u8> = (0..u64::from(npages))
            .flat_map(|i| ((i % 16) * 4096).to_le_bytes())
            .collect();
        let limits = PageListLimits {
            max_pages: 1 << 20,
            max_inline: 1 << 20,
            page_size_cap: 1 << 12,
            max_list_bytes: u64::MAX,
        };
        Mr {
            pd: 0,
            ctx: 0,
            access: 0,
            iova: 0,
            length: u64::from(npages) * 4096,
            first_page_offset: 0,
            lkey: 7,
            rkey: 0,
            pages: PageList::resolve(&desc, &list, &limits, &ram, &mem).unwrap(),
        }
    }

    #[test]
    fn destroyed_translations_are_handed_out_for_freeing() {
        let mut res = VmResources::default();
        let m = mr(1000);
        let cost = m.host_cost();
        assert!(cost >= 8000);
        let h = res.mrs.insert(m).unwrap_or(0);
        res.lkeys.insert(7, h);
        res.charge(cost);
        assert_eq!(res.counts().host_bytes, cost);
        res.dereg_mr(h).unwrap();
        assert_eq!(res.counts().host_bytes, 0);
        let released = res.take_released();
        assert_eq!(released.len(), 1);
        assert_eq!(released.first().map(PageList::host_bytes), Some(8000));
        assert!(res.take_released().is_empty());
        // A reset frees everything itself.
        let h = res.mrs.insert(mr(10)).unwrap_or(0);
        res.charge(1);
        let rnic = SoftRnic::new().unwrap();
        res.clear(&rnic);
        assert!(res.mrs.get(h).is_none());
        assert_eq!(res.counts().host_bytes, 0);
    }
}
