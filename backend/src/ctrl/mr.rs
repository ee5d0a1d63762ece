//! REG_MR, DEREG_MR.

use virtio_rdma_abi::config::F_ATOMIC;
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::{Bytes, GuestAddress};

use super::parse::{destroy_error, field, fixed, page_list_error, shift_plausible, with_list};
use super::{quota, CmdError, CmdResult, Ctrl};
use crate::memory::pagelist::pages_for;
use crate::memory::PageList;
use crate::resources::Mr;

/// Checks memory access flags (for MRs; QPs use only the remote bits).
pub(super) fn check_access<T: Wire>(
    flags: u32,
    allowed: u32,
    atomics: bool,
    name: &str,
) -> Result<(), CmdError> {
    if flags & !allowed != 0 {
        return Err(field::<T>(Status::INVALID, name));
    }
    if flags & access::REMOTE_ATOMIC != 0 && !atomics {
        return Err(field::<T>(Status::UNSUPPORTED, name));
    }
    Ok(())
}

impl Ctrl {
    fn unique_key(&mut self, rkey: bool) -> Result<u32, CmdError> {
        // Collisions are rare (the VM holds at most max_mr of 2^32 keys);
        // bound the retries anyway.
        for _ in 0..64 {
            let k = self
                .keys
                .next_u32()
                .map_err(|_| CmdError::new(Status::INTERNAL, u32::MAX))?;
            let map = if rkey {
                &self.res.rkeys
            } else {
                &self.res.lkeys
            };
            if k != 0 && !map.contains_key(&k) {
                return Ok(k);
            }
        }
        Err(CmdError::new(Status::INTERNAL, u32::MAX))
    }

    pub(super) fn reg_mr<M: Bytes<GuestAddress>>(&mut self, mem: &M, payload: &[u8]) -> CmdResult {
        let (req, list) = with_list::<RegMrReq>(payload)?;
        let ctx = self.pd_ctx::<RegMrReq>(req.pd_handle)?;
        if self.res.mrs.len() >= self.limits.max_mr as usize {
            return Err(CmdError::new(Status::QUOTA, quota::MR));
        }
        check_access::<RegMrReq>(req.access, access::ALL, self.has(F_ATOMIC), "access")?;
        let remote = access::REMOTE_WRITE | access::REMOTE_ATOMIC;
        if req.access & remote != 0 && req.access & access::LOCAL_WRITE == 0 {
            return Err(field::<RegMrReq>(Status::INVALID, "access"));
        }
        if req.length == 0 {
            return Err(field::<RegMrReq>(Status::INVALID, "length"));
        }
        if req.length > self.limits.max_mr_size {
            return Err(field::<RegMrReq>(Status::RANGE, "length"));
        }
        if req.iova.checked_add(req.length).is_none() {
            return Err(field::<RegMrReq>(Status::INVALID, "length"));
        }
        if self.res.registered_bytes.saturating_add(req.length) > self.limits.max_mr_bytes {
            return Err(CmdError::new(Status::QUOTA, quota::MR_BYTES));
        }
        if shift_plausible(req.buf.page_shift) {
            let page = 1u64 << req.buf.page_shift;
            if u64::from(req.buf.first_page_offset) >= page {
                return Err(field::<RegMrReq>(Status::INVALID, "buf.first_page_offset"));
            }
            let span = u64::from(req.buf.first_page_offset) + req.length;
            if u64::from(req.buf.npages) != pages_for(span, req.buf.page_shift) {
                return Err(field::<RegMrReq>(Status::INVALID, "buf.npages"));
            }
        }
        let pages = PageList::resolve(&req.buf, list, &self.page_list_limits(), &self.ram, mem)
            .map_err(page_list_error::<RegMrReq>)?;
        let lkey = self.unique_key(false)?;
        let remote_any = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
        let rkey = if req.access & remote_any != 0 {
            self.unique_key(true)?
        } else {
            0
        };
        let mr_handle = self
            .res
            .mrs
            .insert(Mr {
                pd: req.pd_handle,
                ctx,
                access: req.access,
                iova: req.iova,
                length: req.length,
                first_page_offset: req.buf.first_page_offset,
                lkey,
                rkey,
                pages,
            })
            .map_err(|_| CmdError::no_memory())?;
        self.res.lkeys.insert(lkey, mr_handle);
        if rkey != 0 {
            self.res.rkeys.insert(rkey, mr_handle);
        }
        self.res.registered_bytes += req.length;
        if let Some(pd) = self.res.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        Ok(RegMrResp {
            mr_handle,
            lkey,
            rkey,
        }
        .to_bytes())
    }

    pub(super) fn dereg_mr(&mut self, payload: &[u8]) -> CmdResult {
        let req: MrHandleReq = fixed(payload)?;
        self.res
            .dereg_mr(req.mr_handle)
            .map_err(|e| destroy_error::<MrHandleReq>(e, "mr_handle"))?;
        Ok(Vec::new())
    }
}
