//! Resizing (`F_RESIZE`, spec 12.19, 12.25, 12.26): a CQ's or SRQ's new
//! ring and a region's new pages, PD and access, with the host memory
//! charge and the key maps kept consistent. The control path checks the
//! request and copies the ring's entries; these swap what it built in.

use super::{dec, inc, HostCost, InsertError, Mr, VmResources};
use crate::memory::PageList;
use crate::rnic_objects::{MrKeys, MrSpec, RnicError, RnicObjects};

/// What `REREG_MR` changes in a region, checked by the control path.
#[derive(Debug)]
pub struct Rereg {
    /// The new PD (the region's own when it does not change).
    pub pd: u32,
    /// The new access flags.
    pub access: u32,
    /// The new translation, address, length and first-page offset, if
    /// they change.
    pub translation: Option<(PageList, u64, u64, u32)>,
}

/// Why [`VmResources::rereg_mr`] refused: nothing was changed.
#[derive(Debug)]
pub enum ReregError {
    /// No `REG_MR` region has the handle.
    BadHandle,
    /// The host memory budget cannot take the growth.
    OverBudget,
    /// The RNIC refused.
    Rnic(RnicError),
}

impl VmResources {
    /// Re-charges an object whose [`HostCost`] goes from `old` to `new`:
    /// `OverBudget`, with nothing changed, unless the budget can take the
    /// growth.
    pub fn recharge(&mut self, old: u64, new: u64) -> Result<(), InsertError> {
        if new > old {
            self.host_room(new.saturating_sub(old))?;
        }
        self.host_bytes = self.host_bytes.saturating_sub(old).saturating_add(new);
        Ok(())
    }

    /// Charges `ring`, replacing a ring of `old` host bytes (`None`: the
    /// object is gone); `ring` is released if refused.
    fn charge_ring(&mut self, old: Option<u64>, ring: PageList) -> Result<PageList, InsertError> {
        let charged = match old {
            Some(old) => self.recharge(old, ring.host_bytes()),
            None => Err(InsertError::Full),
        };
        match charged {
            Ok(()) => Ok(ring),
            Err(e) => {
                self.release(ring);
                Err(e)
            }
        }
    }

    /// Gives CQ `h` ring `ring` of `depth` entries (whose entries the
    /// caller copied) and the budget its cost; the old ring is released.
    /// `OverBudget` (the new ring released, the CQ unchanged) if the
    /// budget cannot take the growth.
    pub fn swap_cq_ring(&mut self, h: u32, ring: PageList, depth: u32) -> Result<(), InsertError> {
        let old = self.cqs.get(h).map(|c| c.ring.host_bytes());
        let ring = self.charge_ring(old, ring)?;
        if let Some(cq) = self.cqs.get_mut(h) {
            cq.depth = depth;
            let old = std::mem::replace(&mut cq.ring, ring);
            self.release(old);
        }
        Ok(())
    }

    /// As [`VmResources::swap_cq_ring`] for SRQ `h`, whose limit becomes
    /// `limit`.
    pub fn swap_srq_ring(
        &mut self,
        h: u32,
        ring: PageList,
        depth: u32,
        limit: u32,
    ) -> Result<(), InsertError> {
        let old = self.srqs.get(h).map(|s| s.ring.host_bytes());
        let ring = self.charge_ring(old, ring)?;
        if let Some(srq) = self.srqs.get_mut(h) {
            srq.depth = depth;
            srq.limit = limit;
            let old = std::mem::replace(&mut srq.ring, ring);
            self.release(old);
        }
        Ok(())
    }

    /// Re-registers `REG_MR` region `h` as `r` says (spec 12.26): the
    /// budget, the registered bytes, the PDs' uses and the rkey map follow;
    /// the RNIC keeps the lkey and draws an rkey if the region first needs
    /// one. Returns the keys. On error nothing changed (a new translation
    /// is released).
    pub fn rereg_mr(
        &mut self,
        h: u32,
        r: Rereg,
        t: &dyn RnicObjects,
    ) -> Result<MrKeys, ReregError> {
        let owner = self.owner(h);
        let checked = match self.mrs.get(h).filter(|m| m.fast.is_none()) {
            None => Err(ReregError::BadHandle),
            Some(mr) => {
                let (iova, length, offset, pages) = match &r.translation {
                    Some((p, iova, length, offset)) => (*iova, *length, *offset, p),
                    None => (mr.iova, mr.length, mr.first_page_offset, &mr.pages),
                };
                let remote = Mr::remote_access(r.access) || mr.keyed;
                let old_cost = mr.host_cost();
                let new_cost = Mr::reg_cost(pages.host_bytes(), remote);
                let old = MrKeys {
                    lkey: mr.lkey,
                    rkey: mr.rkey,
                };
                let spec = MrSpec {
                    pd: r.pd,
                    access: r.access,
                    iova,
                    length,
                    remote,
                    first_page_offset: offset,
                    pages,
                };
                if new_cost > old_cost && self.host_room(new_cost.saturating_sub(old_cost)).is_err()
                {
                    Err(ReregError::OverBudget)
                } else {
                    t.rereg_mr(owner, old, &spec)
                        .map(|keys| (keys, old, old_cost, new_cost, mr.pd, mr.length))
                        .map_err(ReregError::Rnic)
                }
            }
        };
        let (keys, old, old_cost, new_cost, old_pd, old_length) = match checked {
            Ok(c) => c,
            Err(e) => {
                if let Some((p, ..)) = r.translation {
                    self.release(p);
                }
                return Err(e);
            }
        };
        self.host_bytes = self
            .host_bytes
            .saturating_sub(old_cost)
            .saturating_add(new_cost);
        let mut old_pages = None;
        let mut new_length = old_length;
        if let Some(mr) = self.mrs.get_mut(h) {
            mr.pd = r.pd;
            mr.access = r.access;
            mr.rkey = keys.rkey;
            if let Some((pages, iova, length, offset)) = r.translation {
                old_pages = Some(std::mem::replace(&mut mr.pages, pages));
                mr.iova = iova;
                mr.length = length;
                mr.first_page_offset = offset;
                mr.host_lost = false;
                new_length = length;
            }
        }
        if old.rkey == 0 && keys.rkey != 0 {
            self.rkeys.insert(keys.rkey, h);
        }
        self.registered_bytes = self
            .registered_bytes
            .saturating_sub(old_length)
            .saturating_add(new_length);
        if r.pd != old_pd {
            if let Some(pd) = self.pds.get_mut(old_pd) {
                dec(&mut pd.users);
            }
            if let Some(pd) = self.pds.get_mut(r.pd) {
                inc(&mut pd.users);
            }
        }
        if let Some(p) = old_pages {
            self.release(p);
        }
        Ok(keys)
    }
}
