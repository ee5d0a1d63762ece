//! The objects a VM owns, in per-VM handle tables, with their dependencies.
//!
//! Everything here has already been validated by the control path; these
//! types only keep state consistent: reference counts, key maps, quotas and
//! the release of everything on destroy, context teardown and disconnect.

pub mod fast;
pub mod handle;
pub mod mcast;
pub mod objects;
pub mod qp_state;
pub mod resize;
pub mod restore;
pub mod windows;
pub mod xrc;

use handle::HandleTable;
pub use objects::{
    Ah, Binding, Context, Cq, CqRuntime, FastReg, HostCost, Inbound, Mr, Mw, Pd, Qp, QpRuntime,
    SendPartial, SendWait, Srq, SrqRuntime, XrcSrq, Xrcd,
};

use std::sync::atomic::{AtomicU64, Ordering};

use virtio_rdma_abi::qp::{QpType, GSI_QPN};

use crate::keys::KeyMap;
use crate::memory::PageList;
use crate::rnic_objects::{MrKeys, Owner, QpSpec, RnicError, RnicObjects, SrqSpec};
use crate::shmem::{DbSlot, DoorbellPages};

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
    /// Memory windows.
    pub mw: usize,
    /// Shared receive queues.
    pub srq: usize,
    /// Address handles.
    pub ah: usize,
    /// XRC domains.
    pub xrcd: usize,
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

/// Why an object could not be inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The VM's host memory budget (`max_host_bytes`) cannot take it.
    OverBudget,
    /// Its table has no free handle.
    Full,
    /// The RNIC refused to create its host half.
    Rnic(RnicError),
}

/// All objects of one VM.
///
/// Objects enter through `insert_*` and leave through `destroy_*`
/// (`dereg_mr`, `dealloc_pd`), which keep the invariants together: the
/// reference counts of the objects each one uses, the key maps, the
/// registered bytes, the host memory charged to the VM's budget, and the
/// host half of each object in the RNIC.
pub struct VmResources {
    /// Contexts.
    pub ctxs: HandleTable<Context>,
    /// Protection domains.
    pub pds: HandleTable<Pd>,
    /// Completion queues.
    pub cqs: HandleTable<Cq>,
    /// Memory regions.
    pub mrs: HandleTable<Mr>,
    /// Memory windows.
    pub mws: HandleTable<Mw>,
    /// Queue pairs.
    pub qps: HandleTable<Qp>,
    /// Address handles.
    pub ahs: HandleTable<Ah>,
    /// Shared receive queues.
    pub srqs: HandleTable<Srq>,
    /// XRC domains (`F_XRC`).
    pub xrcds: HandleTable<Xrcd>,
    /// XRC SRQ number -> SRQ handle.
    pub srqns: KeyMap<u32>,
    /// lkey -> MR handle.
    pub lkeys: KeyMap<u32>,
    /// rkey -> MR handle.
    pub rkeys: KeyMap<u32>,
    /// Bits 31 to 8 of the key of an `ALLOC_MR` region -> its handle
    /// (registered or free: `LOCAL_INV` finds a free one too).
    pub fast_keys: KeyMap<u32>,
    /// Bits 31 to 8 of a memory window's key -> its handle.
    pub mw_keys: KeyMap<u32>,
    /// MR handle -> the number of windows bound to it (only MRs with
    /// some).
    pub bound_windows: KeyMap<u32>,
    /// Multicast groups the VM's UD QPs are attached to.
    pub mcast: mcast::Groups,
    /// Sum of the lengths of all live MRs.
    pub registered_bytes: u64,
    /// Sum of the [`HostCost`] of all live objects.
    pub host_bytes: u64,
    /// Doorbell pages and slots (shared-memory doorbell mode).
    pub doorbells: Option<DoorbellPages>,
    /// The handle of the VM's GSI QP, QP 1, if it has one (spec 18.26).
    gsi: Option<u32>,
    /// Translations of destroyed objects, not yet freed: freeing the 32 MiB
    /// of a 16 GiB MR takes milliseconds, which the control path spends
    /// after it releases the VM's lock ([`VmResources::take_released`]).
    released: Vec<PageList>,
    /// Index of the VM in the daemon (the owner of its host objects).
    vm: usize,
    /// The most host memory the objects may hold (`max_host_bytes`).
    budget: u64,
}

fn dec(count: &mut u32) {
    *count = count.saturating_sub(1);
}

fn inc(count: &mut u32) {
    *count = count.saturating_add(1);
}

/// The last QP incarnation handed out (see [`Qp::incarnation`]). One
/// counter for the process: 64 bits do not wrap in its lifetime, so no two
/// QPs of any daemon ever share one.
static INCARNATIONS: AtomicU64 = AtomicU64::new(0);

/// Notes that QP incarnations up to `last` are in use (QPs of a loaded
/// device state keep theirs, spec 20.2): none of them is handed out again.
pub fn note_incarnation(last: u64) {
    INCARNATIONS.fetch_max(last, Ordering::Relaxed);
}

/// A QP incarnation never handed out before (never 0).
fn next_incarnation() -> u64 {
    INCARNATIONS.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
}

impl VmResources {
    /// No objects, for VM `vm` with a host memory budget of `budget` bytes.
    pub fn new(vm: usize, budget: u64) -> Self {
        VmResources {
            ctxs: HandleTable::default(),
            pds: HandleTable::default(),
            cqs: HandleTable::default(),
            mrs: HandleTable::default(),
            mws: HandleTable::default(),
            qps: HandleTable::default(),
            ahs: HandleTable::default(),
            srqs: HandleTable::default(),
            xrcds: HandleTable::default(),
            srqns: KeyMap::default(),
            lkeys: KeyMap::default(),
            rkeys: KeyMap::default(),
            fast_keys: KeyMap::default(),
            mw_keys: KeyMap::default(),
            bound_windows: KeyMap::default(),
            mcast: mcast::Groups::new(),
            registered_bytes: 0,
            host_bytes: 0,
            doorbells: None,
            gsi: None,
            released: Vec::new(),
            vm,
            budget,
        }
    }

    /// Live object counts.
    pub fn counts(&self) -> ResourceCounts {
        ResourceCounts {
            ctx: self.ctxs.len(),
            pd: self.pds.len(),
            cq: self.cqs.len(),
            qp: self.qps.len(),
            mr: self.mrs.len(),
            mw: self.mws.len(),
            srq: self.srqs.len(),
            ah: self.ahs.len(),
            xrcd: self.xrcds.len(),
            registered_bytes: self.registered_bytes,
            host_bytes: self.host_bytes,
        }
    }

    fn owner(&self, handle: u32) -> Owner {
        Owner {
            vm: self.vm,
            handle,
            incarnation: 0,
        }
    }

    /// What is left of the host memory budget.
    pub fn host_bytes_left(&self) -> u64 {
        self.budget.saturating_sub(self.host_bytes)
    }

    /// `OverBudget` unless the budget can take `cost` more bytes.
    pub fn host_room(&self, cost: u64) -> Result<(), InsertError> {
        if cost > self.host_bytes_left() {
            return Err(InsertError::OverBudget);
        }
        Ok(())
    }

    fn refund(&mut self, obj: &impl HostCost) {
        self.host_bytes = self.host_bytes.saturating_sub(obj.host_cost());
    }

    /// Inserts `obj` into the table `table` picks and charges its host
    /// memory. An object refused keeps no translation: it is released.
    fn insert_charged<T: HostCost>(
        &mut self,
        table: fn(&mut Self) -> &mut HandleTable<T>,
        obj: T,
    ) -> Result<u32, InsertError> {
        let cost = obj.host_cost();
        let refused = match self.host_room(cost) {
            Ok(()) => match table(self).insert(obj) {
                Ok(handle) => {
                    self.host_bytes = self.host_bytes.saturating_add(cost);
                    return Ok(handle);
                }
                Err(obj) => (obj, InsertError::Full),
            },
            Err(e) => (obj, e),
        };
        if let Some(pages) = refused.0.into_pages() {
            self.release(pages);
        }
        Err(refused.1)
    }

    /// The handle of the VM's GSI QP (QP 1), if it has one.
    pub fn gsi_qp(&self) -> Option<u32> {
        self.gsi
    }

    /// Inserts a context.
    pub fn insert_ctx(&mut self, ctx: Context) -> Result<u32, InsertError> {
        self.insert_charged(|r| &mut r.ctxs, ctx)
    }

    /// Inserts a PD and creates its host half.
    pub fn insert_pd(&mut self, pd: Pd, t: &dyn RnicObjects) -> Result<u32, InsertError> {
        let h = self.insert_charged(|r| &mut r.pds, pd)?;
        if let Err(e) = t.create_pd(self.owner(h)) {
            self.unmake(h, |r| &mut r.pds);
            return Err(InsertError::Rnic(e));
        }
        Ok(h)
    }

    /// Inserts a CQ and creates its host half.
    pub fn insert_cq(&mut self, cq: Cq, t: &dyn RnicObjects) -> Result<u32, InsertError> {
        let depth = cq.depth;
        let h = self.insert_charged(|r| &mut r.cqs, cq)?;
        if let Err(e) = t.create_cq(self.owner(h), depth) {
            self.unmake(h, |r| &mut r.cqs);
            return Err(InsertError::Rnic(e));
        }
        Ok(h)
    }

    /// Inserts an AH (a user of its PD) and creates its host half.
    pub fn insert_ah(&mut self, ah: Ah, t: &dyn RnicObjects) -> Result<u32, InsertError> {
        let (pd, av) = (ah.pd, ah.av);
        let h = self.insert_charged(|r| &mut r.ahs, ah)?;
        if let Err(e) = t.create_ah(self.owner(h), pd, &av) {
            self.unmake(h, |r| &mut r.ahs);
            return Err(InsertError::Rnic(e));
        }
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        Ok(h)
    }

    /// Inserts an SRQ (a user of its PD) and creates its host half.
    pub fn insert_srq(&mut self, srq: Srq, t: &dyn RnicObjects) -> Result<u32, InsertError> {
        let spec = SrqSpec {
            pd: srq.pd,
            depth: srq.depth,
            max_sge: srq.max_sge,
        };
        let pd = spec.pd;
        let h = self.insert_charged(|r| &mut r.srqs, srq)?;
        if let Err(e) = t.create_srq(self.owner(h), &spec) {
            self.unmake(h, |r| &mut r.srqs);
            return Err(InsertError::Rnic(e));
        }
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        Ok(h)
    }

    /// Inserts an MR (a user of its PD), registers it with the RNIC,
    /// which chooses its keys (`mr.lkey`/`rkey` are ignored; an rkey if
    /// [`Mr::remote`]), and makes them resolve. Returns its handle and keys.
    pub fn insert_mr(
        &mut self,
        mut mr: Mr,
        t: &dyn RnicObjects,
    ) -> Result<(u32, MrKeys), InsertError> {
        mr.lkey = 0;
        mr.rkey = 0;
        let (pd, length) = (mr.pd, mr.length);
        let h = self.insert_charged(|r| &mut r.mrs, mr)?;
        let owner = self.owner(h);
        let registered = match self.mrs.get(h) {
            Some(mr) => t.reg_mr(owner, &mr.spec()),
            None => Err(RnicError::Exhausted),
        };
        let keys = match registered {
            Ok(k) => k,
            Err(e) => {
                self.unmake(h, |r| &mut r.mrs);
                return Err(InsertError::Rnic(e));
            }
        };
        if let Some(mr) = self.mrs.get_mut(h) {
            mr.lkey = keys.lkey;
            mr.rkey = keys.rkey;
        }
        self.lkeys.insert(keys.lkey, h);
        if keys.rkey != 0 {
            self.rkeys.insert(keys.rkey, h);
        }
        self.registered_bytes = self.registered_bytes.saturating_add(length);
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        Ok((h, keys))
    }

    /// Inserts a QP (a user of its PD, CQs and SRQ) and creates its host
    /// half, which gives it its number (`qp.qpn` is ignored); a GSI QP is
    /// QP 1 and has no host half. Returns its handle and number.
    pub fn insert_qp(
        &mut self,
        mut qp: Qp,
        t: &dyn RnicObjects,
    ) -> Result<(u32, u32), InsertError> {
        qp.qpn = 0;
        let spec = QpSpec {
            qp_type: qp.qp_type,
            pd: qp.pd,
            send_cq: qp.send_cq,
            recv_cq: qp.recv_cq,
            srq: qp.srq,
            sq_depth: qp.sq_depth,
            rq_depth: qp.rq_depth,
            max_send_sge: qp.max_send_sge,
            max_recv_sge: qp.max_recv_sge,
            max_inline_data: qp.max_inline_data,
        };
        let (pd, cqs, srq) = (spec.pd, [spec.send_cq, spec.recv_cq], spec.srq);
        let h = self.insert_charged(|r| &mut r.qps, qp)?;
        let incarnation = next_incarnation();
        let owner = Owner {
            incarnation,
            ..self.owner(h)
        };
        // The GSI QP is QP 1 in every VM: its number is not the RNIC's
        // (QP 1 is never handed out), and peers reach it through its VM.
        let qpn = if spec.qp_type == QpType::GSI {
            self.gsi = Some(h);
            t.gsi_created(self.vm);
            GSI_QPN
        } else {
            match t.create_qp(owner, &spec) {
                Ok(n) => n,
                Err(e) => {
                    self.unmake(h, |r| &mut r.qps);
                    return Err(InsertError::Rnic(e));
                }
            }
        };
        if let Some(qp) = self.qps.get_mut(h) {
            qp.qpn = qpn;
            qp.incarnation = incarnation;
        }
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        for cq in cqs {
            if let Some(cq) = self.cqs.get_mut(cq) {
                inc(&mut cq.users);
            }
        }
        if srq != 0 {
            if let Some(srq) = self.srqs.get_mut(srq) {
                inc(&mut srq.users);
            }
        }
        self.join_domain(h);
        Ok((h, qpn))
    }

    /// Takes back an object just inserted whose host half could not be
    /// created: nothing else refers to it yet.
    fn unmake<T: HostCost>(&mut self, h: u32, table: fn(&mut Self) -> &mut HandleTable<T>) {
        if let Some(obj) = table(self).remove(h) {
            self.refund(&obj);
            if let Some(pages) = obj.into_pages() {
                self.release(pages);
            }
        }
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

    /// Destroys a QP and drops its references; its QPN returns to the
    /// RNIC.
    pub fn destroy_qp(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        self.detach_all_mcast(handle, t);
        let qp = self.qps.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&qp);
        self.leave_domain(&qp);
        self.invalidate_windows_of(handle);
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
        if self.gsi == Some(handle) {
            self.gsi = None;
            t.gsi_destroyed(self.vm);
        } else {
            t.destroy_qp(qp.qpn);
        }
        self.free_slot(qp.db_slot.as_ref());
        self.release(qp.ring);
        Ok(())
    }

    fn free_slot(&mut self, slot: Option<&DbSlot>) {
        if let (Some(db), Some(s)) = (self.doorbells.as_mut(), slot) {
            db.free_slot(s.at());
        }
    }

    /// Deregisters an MR unless windows are bound to it; its keys return
    /// to the RNIC.
    pub fn dereg_mr(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let windows = self.windows_on(handle);
        if windows > 0 {
            return Err(DestroyError::Busy(windows));
        }
        let mr = self.mrs.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&mr);
        // A free `ALLOC_MR` region's key is in neither map, and no other
        // region has it: removing it is harmless.
        self.lkeys.remove(&mr.lkey);
        if mr.rkey != 0 {
            self.rkeys.remove(&mr.rkey);
        }
        if mr.fast.is_some() {
            self.fast_keys.remove(&fast::prefix(mr.lkey));
            t.free_fast_mr(mr.lkey);
        } else {
            t.dereg_mr(MrKeys {
                lkey: mr.lkey,
                rkey: mr.rkey,
            });
        }
        self.registered_bytes = self.registered_bytes.saturating_sub(mr.length);
        if let Some(pd) = self.pds.get_mut(mr.pd) {
            dec(&mut pd.users);
        }
        self.release(mr.pages);
        Ok(())
    }

    /// Destroys an AH.
    pub fn destroy_ah(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let ah = self.ahs.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&ah);
        t.destroy_ah(self.owner(handle));
        if let Some(pd) = self.pds.get_mut(ah.pd) {
            dec(&mut pd.users);
        }
        Ok(())
    }

    /// Destroys an SRQ unless QPs use it.
    pub fn destroy_srq(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let srq = self.srqs.get(handle).ok_or(DestroyError::BadHandle)?;
        if srq.users > 0 {
            return Err(DestroyError::Busy(srq.users));
        }
        let pd = srq.pd;
        if let Some(srq) = self.srqs.remove(handle) {
            self.refund(&srq);
            if let Some(x) = srq.xrc {
                self.unmake_xrc_srq(x, t);
            }
            t.destroy_srq(self.owner(handle));
            self.free_slot(srq.db_slot.as_ref());
            self.release(srq.ring);
        }
        if let Some(pd) = self.pds.get_mut(pd) {
            dec(&mut pd.users);
        }
        Ok(())
    }

    /// Destroys a CQ unless QPs use it.
    pub fn destroy_cq(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let cq = self.cqs.get(handle).ok_or(DestroyError::BadHandle)?;
        if cq.users > 0 {
            return Err(DestroyError::Busy(cq.users));
        }
        if let Some(cq) = self.cqs.remove(handle) {
            self.refund(&cq);
            t.destroy_cq(self.owner(handle));
            self.release(cq.ring);
        }
        Ok(())
    }

    /// Frees a PD unless MRs, QPs, AHs or SRQs use it.
    pub fn dealloc_pd(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let pd = self.pds.get(handle).ok_or(DestroyError::BadHandle)?;
        if pd.users > 0 {
            return Err(DestroyError::Busy(pd.users));
        }
        if let Some(pd) = self.pds.remove(handle) {
            self.refund(&pd);
            t.destroy_pd(self.owner(handle));
        }
        Ok(())
    }

    /// Destroys a context and everything it owns, dependents first.
    pub fn destroy_ctx(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        if self.ctxs.get(handle).is_none() {
            return Err(DestroyError::BadHandle);
        }
        let owned = |ctx: u32| ctx == handle;
        // Its XRC domains go with it, and so do the XRC_TGT QPs and XRC
        // SRQs in them, of whatever context.
        let (domains, tgts, xrc_srqs) = self.xrc_of_ctx(handle);
        for h in tgts.into_iter().chain(collect(&self.qps, |o| owned(o.ctx))) {
            let _ = self.destroy_qp(h, t);
        }
        // No QP is attached to an XRC SRQ (`CREATE_QP` refuses one).
        for h in xrc_srqs {
            let _ = self.destroy_srq(h, t);
        }
        for h in collect(&self.srqs, |o| owned(o.ctx)) {
            let _ = self.destroy_srq(h, t);
        }
        for h in domains {
            let _ = self.close_xrcd(h);
        }
        for h in collect(&self.ahs, |o| owned(o.ctx)) {
            let _ = self.destroy_ah(h, t);
        }
        for h in collect(&self.mws, |o| owned(o.ctx)) {
            let _ = self.dealloc_mw(h, t);
        }
        for h in collect(&self.mrs, |o| owned(o.ctx)) {
            let _ = self.dereg_mr(h, t);
        }
        for h in collect(&self.cqs, |o| owned(o.ctx)) {
            let _ = self.destroy_cq(h, t);
        }
        for h in collect(&self.pds, |o| owned(o.ctx)) {
            let _ = self.dealloc_pd(h, t);
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
    pub fn clear(&mut self, t: &dyn RnicObjects) {
        for h in self.ctxs.handles() {
            let _ = self.destroy_ctx(h, t);
        }
        // Nothing can exist outside a context; release defensively anyway
        // so a bookkeeping slip cannot leak numbers into the RNIC.
        for h in self.qps.handles() {
            let _ = self.destroy_qp(h, t);
        }
        for h in self.mws.handles() {
            let _ = self.dealloc_mw(h, t);
        }
        for h in self.mrs.handles() {
            let _ = self.dereg_mr(h, t);
        }
        for h in self.srqs.handles() {
            if let Some(x) = self.srqs.get(h).and_then(|s| s.xrc) {
                t.free_srqn(x.srqn);
            }
            t.destroy_srq(self.owner(h));
        }
        for h in self.ahs.handles() {
            t.destroy_ah(self.owner(h));
        }
        for h in self.cqs.handles() {
            t.destroy_cq(self.owner(h));
        }
        for h in self.pds.handles() {
            t.destroy_pd(self.owner(h));
        }
        self.qps.clear();
        self.srqs.clear();
        self.srqns.clear();
        self.xrcds.clear();
        self.ahs.clear();
        self.mws.clear();
        self.mrs.clear();
        self.cqs.clear();
        self.pds.clear();
        self.lkeys.clear();
        self.rkeys.clear();
        self.fast_keys.clear();
        self.mw_keys.clear();
        self.bound_windows.clear();
        self.mcast.clear();
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
mod tests {
    use super::*;
    use crate::memory::pagelist::PageListLimits;
    use crate::memory::RamMap;
    use crate::rnic::soft::SoftRnic;
    use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
    use vm_memory::GuestAddress;

    fn mr(npages: u32) -> Mr {
        let mem = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
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
            host_lost: false,
            keyed: false,
            fast: None,
        }
    }

    #[test]
    fn destroyed_translations_are_handed_out_for_freeing() {
        let rnic = SoftRnic::new();
        let mut res = VmResources::new(0, u64::MAX);
        let m = mr(1000);
        let cost = m.host_cost();
        assert!(cost >= 8000);
        let (h, keys) = res.insert_mr(m, &rnic).unwrap();
        assert_eq!(res.lkeys.get(&keys.lkey), Some(&h));
        assert_eq!(res.counts().host_bytes, cost);
        assert_eq!(rnic.keys_in_use(), 1);
        res.dereg_mr(h, &rnic).unwrap();
        assert_eq!(rnic.keys_in_use(), 0);
        assert_eq!(res.counts().host_bytes, 0);
        let released = res.take_released();
        assert_eq!(released.len(), 1);
        assert_eq!(released.first().map(PageList::host_bytes), Some(8000));
        assert!(res.take_released().is_empty());
        // A reset frees everything itself.
        let (h, _) = res.insert_mr(mr(10), &rnic).unwrap();
        res.clear(&rnic);
        assert_eq!(rnic.keys_in_use(), 0);
        assert!(res.mrs.get(h).is_none());
        assert_eq!(res.counts().host_bytes, 0);
    }
}
