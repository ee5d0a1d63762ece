//! `ALLOC_MR` regions (fast registration, spec 12.22 and 18.27): their
//! insertion, and the registration and invalidation that work requests
//! make. The checks of a work request are the engine's
//! (`crate::engine::fastreg`); these keep the key maps, the registered
//! bytes and the RNIC's keys consistent. A free region has no entry in
//! the lkey and rkey maps; a registered one has its key in both.

use super::{inc, InsertError, Mr, VmResources};
use crate::rnic_objects::RnicObjects;

/// Bits 31 to 8 of a key: what an `ALLOC_MR` region owns of the key space.
pub fn prefix(key: u32) -> u32 {
    key.checked_shr(8).unwrap_or(0)
}

/// A registration a `REG_MR` work request makes, once the engine checked
/// it (spec 18.27).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The new key (bits 31 to 8 the region's).
    pub key: u32,
    /// Address of the first byte.
    pub iova: u64,
    /// Bytes registered.
    pub length: u64,
    /// Access flags.
    pub access: u32,
    /// log2 of the page size.
    pub page_shift: u32,
}

impl VmResources {
    /// Inserts an `ALLOC_MR` region (a user of its PD) and has the RNIC
    /// draw its key. Returns its handle and key.
    pub fn insert_fast_mr(
        &mut self,
        mut mr: Mr,
        t: &dyn RnicObjects,
    ) -> Result<(u32, u32), InsertError> {
        mr.lkey = 0;
        mr.rkey = 0;
        let pd = mr.pd;
        let h = self.insert_charged(|r| &mut r.mrs, mr)?;
        let key = match t.alloc_fast_mr(self.owner(h)) {
            Ok(k) => k,
            Err(e) => {
                self.unmake(h, |r| &mut r.mrs);
                return Err(InsertError::Rnic(e));
            }
        };
        if let Some(mr) = self.mrs.get_mut(h) {
            mr.lkey = key;
            mr.rkey = key;
        }
        self.fast_keys.insert(prefix(key), h);
        if let Some(pd) = self.pds.get_mut(pd) {
            inc(&mut pd.users);
        }
        Ok((h, key))
    }

    /// The `ALLOC_MR` region `h` of PD `pd`.
    pub fn fast_mr(&self, h: u32, pd: u32) -> Option<&Mr> {
        self.mrs
            .get(h)
            .filter(|mr| mr.fast.is_some() && mr.pd == pd)
    }

    /// The `ALLOC_MR` region of PD `pd` whose key is `key` (all 32 bits),
    /// registered or free: the region `LOCAL_INV` and `SEND_WITH_INV`
    /// name.
    pub fn fast_mr_of_key(&self, pd: u32, key: u32) -> Option<u32> {
        let h = *self.fast_keys.get(&prefix(key))?;
        self.fast_mr(h, pd).filter(|mr| mr.lkey == key).map(|_| h)
    }

    /// Registers `pages` (validated) into free `ALLOC_MR` region `h` as
    /// `reg` says: its key becomes `reg.key` and resolves as lkey and
    /// rkey, its length counts as registered. False, with nothing changed,
    /// if `h` is not a free `ALLOC_MR` region, `reg.key` has other bits 31
    /// to 8, or the pages do not fit its translation space.
    pub fn fast_register(
        &mut self,
        h: u32,
        reg: &Registration,
        pages: impl ExactSizeIterator<Item = u64>,
    ) -> bool {
        let Some(mr) = self.mrs.get_mut(h) else {
            return false;
        };
        let Some(fast) = mr.fast.as_mut() else {
            return false;
        };
        if fast.valid || prefix(reg.key) != prefix(mr.lkey) {
            return false;
        }
        if !mr.pages.refill(reg.page_shift, pages) {
            return false;
        }
        fast.valid = true;
        mr.lkey = reg.key;
        mr.rkey = reg.key;
        mr.iova = reg.iova;
        mr.length = reg.length;
        mr.access = reg.access;
        // The low `page_shift` bits of `iova`: below 2^30.
        let within = reg.iova & !(u64::MAX.checked_shl(reg.page_shift).unwrap_or(0));
        mr.first_page_offset = u32::try_from(within).unwrap_or(0);
        let length = mr.length;
        self.lkeys.insert(reg.key, h);
        self.rkeys.insert(reg.key, h);
        self.registered_bytes = self.registered_bytes.saturating_add(length);
        true
    }

    /// Invalidates the `ALLOC_MR` region of PD `pd` whose key is `key`:
    /// its key no longer resolves and its bytes no longer count. A free
    /// region stays free. False if there is no such region.
    pub fn invalidate_fast(&mut self, pd: u32, key: u32) -> bool {
        let Some(h) = self.fast_mr_of_key(pd, key) else {
            return false;
        };
        let Some(mr) = self.mrs.get_mut(h) else {
            return false;
        };
        let Some(fast) = mr.fast.as_mut() else {
            return false;
        };
        if fast.valid {
            fast.valid = false;
            let length = std::mem::take(&mut mr.length);
            self.lkeys.remove(&key);
            self.rkeys.remove(&key);
            self.registered_bytes = self.registered_bytes.saturating_sub(length);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::PageList;
    use crate::resources::{HostCost, Pd};
    use crate::rnic::soft::SoftRnic;

    fn reg(key: u32, length: u64) -> Registration {
        Registration {
            key,
            iova: 0x7000_0010,
            length,
            access: virtio_rdma_abi::mem::access::ALL,
            page_shift: 12,
        }
    }

    /// The life of an `ALLOC_MR` region in the VM's tables: free, then
    /// registered under a new consumer byte (its key resolving in both
    /// maps, its bytes counted), invalidated, registered again, and
    /// deregistered, its cost the same throughout and given back.
    #[test]
    fn a_fast_region_is_registered_invalidated_and_freed() {
        let rnic = SoftRnic::new();
        let mut res = VmResources::new(0, u64::MAX);
        let pd = res.insert_pd(Pd { ctx: 1, users: 0 }, &rnic).unwrap();
        let cost = Mr::fast_cost(8);
        let (h, key) = res.insert_fast_mr(Mr::fast(pd, 1, 8), &rnic).unwrap();
        let pd_cost = res.counts().host_bytes - res.mrs.get(h).unwrap().host_cost();
        assert_eq!(res.mrs.get(h).unwrap().host_cost(), cost);
        assert_eq!(res.mrs.get(h).unwrap().pages.host_bytes(), 64);
        assert_eq!(rnic.keys_in_use(), 1);
        assert!(res.lkeys.is_empty() && res.rkeys.is_empty(), "free");
        assert_eq!(res.fast_mr_of_key(pd, key), Some(h));
        assert_eq!(res.fast_mr_of_key(pd, key ^ 1), None, "all 32 bits");
        assert_eq!(res.fast_mr_of_key(pd + 1, key), None, "another PD");

        // Another prefix, or more pages than its room: refused, unchanged.
        let pages = || [0x1000u64, 0x3000].into_iter();
        let k1 = (key & !0xff) | (key.wrapping_add(7) & 0xff);
        assert!(!res.fast_register(h, &reg(key ^ 0x100, 100), pages()));
        assert!(!res.fast_register(h, &reg(k1, 100), [0u64; 9].into_iter()));
        assert!(res.lkeys.is_empty() && res.registered_bytes == 0);

        assert!(res.fast_register(h, &reg(k1, 5000), pages()));
        assert_eq!(res.lkeys.get(&k1), Some(&h));
        assert_eq!(res.rkeys.get(&k1), Some(&h));
        assert_eq!(res.registered_bytes, 5000);
        let mr = res.mrs.get(h).unwrap();
        use crate::memory::access::Translate;
        assert_eq!(mr.translate(0x7000_0010, 1), Some((0x1010, 4096 - 16)));
        assert_eq!(
            mr.translate(0x7000_0010 + 4096, 1),
            Some((0x3010, 4096 - 16))
        );
        assert_eq!(mr.translate(0x7000_0010 + 5000, 1), None);
        assert_eq!(mr.host_cost(), cost, "the cost never changes");
        let k2 = (key & !0xff) | (key.wrapping_add(8) & 0xff);
        assert!(!res.fast_register(h, &reg(k2, 1), pages()), "valid");

        // Invalidation: by the whole key only; idempotent.
        assert!(!res.invalidate_fast(pd, key), "the old key");
        assert!(res.invalidate_fast(pd, k1));
        assert!(res.lkeys.is_empty() && res.rkeys.is_empty());
        assert_eq!(res.registered_bytes, 0);
        assert!(res.invalidate_fast(pd, k1), "a free region");
        assert!(res.fast_register(h, &reg(k2, 10), pages()));
        assert_eq!(res.lkeys.get(&k1), None);
        assert_eq!(res.lkeys.get(&k2), Some(&h));

        res.dereg_mr(h, &rnic).unwrap();
        assert!(res.lkeys.is_empty() && res.rkeys.is_empty() && res.fast_keys.is_empty());
        assert_eq!(res.registered_bytes, 0);
        assert_eq!(rnic.keys_in_use(), 0);
        assert_eq!(res.counts().host_bytes, pd_cost);
        assert_eq!(res.pds.get(pd).unwrap().users, 0);
        let released: Vec<PageList> = res.take_released();
        assert_eq!(released.len(), 1);
    }
}
