//! Memory windows (spec 12.23, 18.29): their insertion and deallocation,
//! the binds and invalidations that work requests make, and the lookup of
//! a window's key at a responder. The checks of a bind are the engine's
//! (`crate::engine::bind`); these keep the window key map, the MRs' counts
//! of bound windows and the RNIC's keys consistent.

use virtio_rdma_abi::verbs::MW_TYPE_2;

use super::fast::prefix;
use super::{dec, inc, Binding, DestroyError, InsertError, Mw, VmResources};
use crate::rnic_objects::RnicObjects;

impl VmResources {
    /// Inserts a window (a user of its PD), free, and has the RNIC draw
    /// its key: bits 31 to 8 its own, as an `ALLOC_MR` region's are.
    /// Returns its handle and key.
    pub fn insert_mw(
        &mut self,
        mut mw: Mw,
        t: &dyn RnicObjects,
    ) -> Result<(u32, u32), InsertError> {
        mw.key = 0;
        mw.binding = None;
        let pd = mw.pd;
        let h = self.insert_charged(|r| &mut r.mws, mw)?;
        let key = match t.alloc_fast_mr(self.owner(h)) {
            Ok(k) => k,
            Err(e) => {
                self.unmake(h, |r| &mut r.mws);
                return Err(InsertError::Rnic(e));
            }
        };
        if let Some(mw) = self.mws.get_mut(h) {
            mw.key = key;
        }
        self.mw_keys.insert(prefix(key), h);
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        Ok((h, key))
    }

    /// Frees a window, unbinding it first; its keys return to the RNIC.
    pub fn dealloc_mw(&mut self, handle: u32, t: &dyn RnicObjects) -> Result<(), DestroyError> {
        let mw = self.mws.remove(handle).ok_or(DestroyError::BadHandle)?;
        self.refund(&mw);
        if let Some(b) = mw.binding {
            self.unbound(b.mr);
        }
        self.mw_keys.remove(&prefix(mw.key));
        t.free_fast_mr(mw.key);
        if let Some(pd) = self.pds.get_mut(mw.pd) {
            dec(&mut pd.users);
        }
        Ok(())
    }

    /// Window `h` of PD `pd`.
    pub fn window(&self, h: u32, pd: u32) -> Option<&Mw> {
        self.mws.get(h).filter(|mw| mw.pd == pd)
    }

    /// The number of windows bound to MR `mr`.
    pub fn windows_on(&self, mr: u32) -> u32 {
        self.bound_windows.get(&mr).copied().unwrap_or(0)
    }

    fn unbound(&mut self, mr: u32) {
        if let Some(n) = self.bound_windows.get_mut(&mr) {
            dec(n);
            if *n == 0 {
                self.bound_windows.remove(&mr);
            }
        }
    }

    /// Applies a checked bind to window `h`: its key becomes `key` and it
    /// grants `binding`, or nothing (`None`, a type 1 unbind). False, with
    /// nothing changed, if `h` names no window or `key` has other bits 31
    /// to 8.
    pub fn bind_window(&mut self, h: u32, key: u32, binding: Option<Binding>) -> bool {
        let Some(mw) = self.mws.get_mut(h) else {
            return false;
        };
        if prefix(key) != prefix(mw.key) {
            return false;
        }
        let old = std::mem::replace(&mut mw.binding, binding);
        mw.key = key;
        if let Some(b) = old {
            self.unbound(b.mr);
        }
        if let Some(b) = binding {
            inc(self.bound_windows.entry(b.mr).or_insert(0));
        }
        true
    }

    /// The type 2 window of PD `pd` whose key is `key` (all 32 bits),
    /// bound or free: the window `LOCAL_INV` and `SEND_WITH_INV` name.
    pub fn type2_window_of_key(&self, pd: u32, key: u32) -> Option<u32> {
        let h = *self.mw_keys.get(&prefix(key))?;
        self.window(h, pd)
            .filter(|mw| mw.mw_type == MW_TYPE_2 && mw.key == key)
            .map(|_| h)
    }

    /// Invalidates the type 2 window of PD `pd` whose key is `key`: it is
    /// free afterwards. False if there is no such window.
    pub fn invalidate_window(&mut self, pd: u32, key: u32) -> bool {
        let Some(h) = self.type2_window_of_key(pd, key) else {
            return false;
        };
        let old = self.mws.get_mut(h).and_then(|mw| mw.binding.take());
        if let Some(b) = old {
            self.unbound(b.mr);
        }
        true
    }

    /// Invalidates the type 2 windows QP `qp` bound (it is destroyed).
    pub(super) fn invalidate_windows_of(&mut self, qp: u32) {
        if self.mws.is_empty() {
            return;
        }
        let bound: Vec<u32> = self
            .mws
            .iter()
            .filter(|(_, mw)| {
                mw.binding
                    .is_some_and(|b| b.qp.is_some_and(|(h, _)| h == qp))
            })
            .map(|(h, _)| h)
            .collect();
        for h in bound {
            let old = self.mws.get_mut(h).and_then(|mw| mw.binding.take());
            if let Some(b) = old {
                self.unbound(b.mr);
            }
        }
    }

    /// What the window with key `rkey` (all 32 bits) grants at responder
    /// QP `qp` (handle and incarnation) of PD `pd`: a bound window of the
    /// PD, and for type 2 one that QP bound.
    pub fn window_grant(&self, rkey: u32, pd: u32, qp: (u32, u64)) -> Option<&Binding> {
        let h = *self.mw_keys.get(&prefix(rkey))?;
        let mw = self.window(h, pd).filter(|mw| mw.key == rkey)?;
        mw.binding
            .as_ref()
            .filter(|b| b.qp.is_none_or(|bound| bound == qp))
    }

    /// Whether `key` (all 32 bits) names what `LOCAL_INV` and
    /// `SEND_WITH_INV` invalidate in PD `pd`: an `ALLOC_MR` region or a
    /// type 2 window (spec 18.27, 18.29).
    pub fn invalidatable(&self, pd: u32, key: u32) -> bool {
        self.fast_mr_of_key(pd, key).is_some() || self.type2_window_of_key(pd, key).is_some()
    }

    /// Invalidates what `key` names in PD `pd` ([`Self::invalidatable`]).
    /// False if it names nothing.
    pub fn invalidate_key(&mut self, pd: u32, key: u32) -> bool {
        self.invalidate_fast(pd, key) || self.invalidate_window(pd, key)
    }
}
