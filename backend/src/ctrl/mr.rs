//! REG_MR, DEREG_MR, ALLOC_MR, REREG_MR.

use virtio_rdma_abi::config::{F_ATOMIC, F_MEM_MGT, F_MW, F_RESIZE};
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, Status};
use virtio_rdma_abi::mem::{access, BufferDesc};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use super::parse::{destroy_error, field, fixed, page_list_error, shift_plausible, with_list};
use super::{quota, CmdError, CmdResult};
use crate::memory::pagelist::{pages_for, PageListLimits};
use crate::memory::{PageList, PageListError, RamMap};
use crate::resources::resize::{Rereg, ReregError};
use crate::resources::Mr;
use crate::rnic_objects::MrKeys;
use crate::vm::VmState;

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

/// What `REG_MR` needs to build its translation without the VM's lock: a
/// copy of the RAM map and limits, taken under the lock just before
/// ([`VmState::preparer`]). A 16 GiB region has 4·10^6 pages to check (tens of
/// milliseconds); the engine locks the VM to serve its data path, and must
/// not wait for that.
pub struct Preparer {
    ram: RamMap,
    ram_gen: u64,
    limits: PageListLimits,
    max_mr_size: u64,
}

/// A translation built by [`Preparer::prepare`]; `REG_MR` uses it if the
/// RAM map has not changed since (otherwise it builds it again, under the
/// lock: memory table updates are rare).
pub struct Prepared {
    ram_gen: u64,
    pub(super) pages: Result<PageList, PageListError>,
}

impl Preparer {
    /// Whether `request` is a command with work worth doing beforehand
    /// (a `REG_MR` with a page list to translate).
    pub fn wanted(request: &[u8]) -> bool {
        request
            .get(..RequestHeader::SIZE)
            .map(RequestHeader::read)
            .is_some_and(|h| h.opcode == u32::from(Opcode::REG_MR))
    }

    /// Builds the translation of a `REG_MR` request. `None` when the
    /// request is not one, or fails a check that comes first anyway: the
    /// command then runs as without preparation.
    pub fn prepare<M: GuestMemoryBackend>(&self, mem: &M, request: &[u8]) -> Option<Prepared> {
        let head = request.get(..RequestHeader::SIZE)?;
        RequestHeader::parse(head).ok()?;
        if RequestHeader::read(head).opcode != u32::from(Opcode::REG_MR) {
            return None;
        }
        let payload = request.get(RequestHeader::SIZE..)?;
        let (req, list) = with_list::<RegMrReq>(payload).ok()?;
        if req.length == 0 || req.length > self.max_mr_size {
            return None;
        }
        Some(Prepared {
            ram_gen: self.ram_gen,
            pages: PageList::resolve(&req.buf, list, &self.limits, &self.ram, mem),
        })
    }
}

impl VmState {
    /// A [`Preparer`] for the next command (take it under the VM's lock,
    /// use it without).
    pub fn preparer(&self) -> Preparer {
        Preparer {
            ram: self.ram.clone(),
            ram_gen: self.ram_gen,
            limits: self.page_list_limits(),
            max_mr_size: self.limits.max_mr_size,
        }
    }

    pub(super) fn reg_mr<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
        prepared: &mut Option<Prepared>,
    ) -> CmdResult {
        let (req, list) = with_list::<RegMrReq>(payload)?;
        let ctx = self.pd_ctx::<RegMrReq>(req.pd_handle)?;
        self.mr_quota()?;
        self.check_mr_access::<RegMrReq>(req.access)?;
        self.check_mr_range::<RegMrReq>(req.iova, req.length, &req.buf, self.res.registered_bytes)?;
        // The translation prepared without the lock, unless the RAM map
        // changed since, or the budget refused it (the refusal costs
        // nothing to repeat, and the budget is the current one here).
        let pages = match prepared.take() {
            Some(p)
                if p.ram_gen == self.ram_gen
                    && !matches!(p.pages, Err(PageListError::OverBudget(_))) =>
            {
                p.pages
            }
            _ => PageList::resolve(&req.buf, list, &self.page_list_limits(), &self.ram, mem),
        }
        .map_err(page_list_error::<RegMrReq>)?;
        // The RNIC chooses the keys (an rkey if any remote access).
        let (mr_handle, MrKeys { lkey, rkey }) = self.res.insert_mr(
            Mr {
                pd: req.pd_handle,
                ctx,
                access: req.access,
                iova: req.iova,
                length: req.length,
                first_page_offset: req.buf.first_page_offset,
                lkey: 0,
                rkey: 0,
                pages,
                host_lost: false,
                keyed: self.has(F_RESIZE),
                fast: None,
            },
            self.rnic.as_ref(),
        )?;
        Ok(RegMrResp {
            mr_handle,
            lkey,
            rkey,
        }
        .to_bytes())
    }

    /// `ALLOC_MR` (spec 12.22): a free fast-registration region whose
    /// translation space is allocated and charged now.
    pub(super) fn alloc_mr(&mut self, payload: &[u8]) -> CmdResult {
        if !self.has(F_MEM_MGT) {
            return Err(CmdError::new(Status::UNSUPPORTED, Opcode::ALLOC_MR.into()));
        }
        let req: AllocMrReq = fixed(payload)?;
        let ctx = self.pd_ctx::<AllocMrReq>(req.pd_handle)?;
        if req.max_num_sg == 0 {
            return Err(field::<AllocMrReq>(Status::INVALID, "max_num_sg"));
        }
        if req.max_num_sg > self.rnic.caps().max_fast_reg_pages {
            return Err(field::<AllocMrReq>(Status::RANGE, "max_num_sg"));
        }
        self.mr_quota()?;
        // Checked before the translation space is allocated.
        self.res.host_room(Mr::fast_cost(req.max_num_sg))?;
        let mr = Mr::fast(req.pd_handle, ctx, req.max_num_sg);
        let (mr_handle, key) = self.res.insert_fast_mr(mr, self.rnic.as_ref())?;
        Ok(RegMrResp {
            mr_handle,
            lkey: key,
            rkey: key,
        }
        .to_bytes())
    }

    /// `DeviceAttr.local_dma_lkey` and `max_fast_reg_pages`: with
    /// `F_MEM_MGT` negotiated, else 0 (spec 12.1).
    pub(super) fn fast_reg_attr(&self) -> (u32, u32) {
        if self.has(F_MEM_MGT) {
            (
                crate::keys::LOCAL_DMA_LKEY,
                self.rnic.caps().max_fast_reg_pages,
            )
        } else {
            (0, 0)
        }
    }

    pub(super) fn dereg_mr(&mut self, payload: &[u8]) -> CmdResult {
        let req: MrHandleReq = fixed(payload)?;
        self.res
            .dereg_mr(req.mr_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<MrHandleReq>(e, "mr_handle"))?;
        Ok(Vec::new())
    }

    /// `REREG_MR` (spec 12.26): new pages, PD or access for a `REG_MR`
    /// region, its keys kept. Under the VM's lock, which the engine holds
    /// while it executes work requests: each sees the region before or
    /// after, never half changed.
    pub(super) fn rereg_mr<M: GuestMemoryBackend>(&mut self, mem: &M, payload: &[u8]) -> CmdResult {
        if !self.has(F_RESIZE) {
            return Err(CmdError::new(Status::UNSUPPORTED, Opcode::REREG_MR.into()));
        }
        let (req, list) = with_list::<ReregMrReq>(payload)?;
        let mr = self
            .res
            .mrs
            .get(req.mr_handle)
            .ok_or_else(|| field::<ReregMrReq>(Status::BAD_HANDLE, "mr_handle"))?;
        if req.flags == 0 || req.flags & !REREG_ALL != 0 {
            return Err(field::<ReregMrReq>(Status::INVALID, "flags"));
        }
        if mr.fast.is_some() {
            return Err(CmdError::new(Status::INVALID, 0));
        }
        let (ctx, mut pd, mut access, old_length) = (mr.ctx, mr.pd, mr.access, mr.length);
        let windows = self.res.windows_on(req.mr_handle);
        if windows > 0 {
            return Err(CmdError::new(Status::BUSY, windows));
        }
        if req.flags & REREG_PD != 0 {
            pd = req.pd_handle;
            if self.res.pds.get(pd).is_none_or(|p| p.ctx != ctx) {
                return Err(field::<ReregMrReq>(Status::BAD_HANDLE, "pd_handle"));
            }
        }
        if req.flags & REREG_ACCESS != 0 {
            access = req.access;
            self.check_mr_access::<ReregMrReq>(access)?;
        }
        let translation = if req.flags & REREG_TRANSLATION != 0 {
            let left = self.res.registered_bytes.saturating_sub(old_length);
            self.check_mr_range::<ReregMrReq>(req.iova, req.length, &req.buf, left)?;
            let pages = PageList::resolve(&req.buf, list, &self.page_list_limits(), &self.ram, mem)
                .map_err(page_list_error::<ReregMrReq>)?;
            Some((pages, req.iova, req.length, req.buf.first_page_offset))
        } else {
            None
        };
        let keys = self
            .res
            .rereg_mr(
                req.mr_handle,
                Rereg {
                    pd,
                    access,
                    translation,
                },
                self.rnic.as_ref(),
            )
            .map_err(|e| match e {
                ReregError::BadHandle => field::<ReregMrReq>(Status::BAD_HANDLE, "mr_handle"),
                ReregError::OverBudget => CmdError::new(Status::QUOTA, quota::HOST_BYTES),
                ReregError::Rnic(e) => e.into(),
            })?;
        Ok(RegMrResp {
            mr_handle: req.mr_handle,
            lkey: keys.lkey,
            rkey: keys.rkey,
        }
        .to_bytes())
    }

    /// The access checks of `REG_MR` (spec 12.10) on field `access` of `T`.
    fn check_mr_access<T: Wire>(&self, access: u32) -> Result<(), CmdError> {
        let allowed = access::ALL | access::MW_BIND;
        check_access::<T>(access, allowed, self.has(F_ATOMIC), "access")?;
        if access & access::MW_BIND != 0 && !self.has(F_MW) {
            return Err(field::<T>(Status::UNSUPPORTED, "access"));
        }
        let remote = access::REMOTE_WRITE | access::REMOTE_ATOMIC;
        if access & remote != 0 && access & access::LOCAL_WRITE == 0 {
            return Err(field::<T>(Status::INVALID, "access"));
        }
        Ok(())
    }

    /// The `length`, registered-bytes and `buf` shape checks of `REG_MR`
    /// (spec 12.10) on the fields of `T`; `others` is what the VM's other
    /// regions have registered.
    fn check_mr_range<T: Wire>(
        &self,
        iova: u64,
        length: u64,
        buf: &BufferDesc,
        others: u64,
    ) -> Result<(), CmdError> {
        if length == 0 {
            return Err(field::<T>(Status::INVALID, "length"));
        }
        if length > self.limits.max_mr_size {
            return Err(field::<T>(Status::RANGE, "length"));
        }
        if iova.checked_add(length).is_none() {
            return Err(field::<T>(Status::INVALID, "length"));
        }
        if others.saturating_add(length) > self.limits.max_mr_bytes {
            return Err(CmdError::new(Status::QUOTA, quota::MR_BYTES));
        }
        if shift_plausible(buf.page_shift) {
            let page = 1u64 << buf.page_shift;
            if u64::from(buf.first_page_offset) >= page {
                return Err(field::<T>(Status::INVALID, "buf.first_page_offset"));
            }
            // `length <= max_mr_size` (checked above): cannot saturate.
            let span = u64::from(buf.first_page_offset).saturating_add(length);
            if u64::from(buf.npages) != pages_for(span, buf.page_shift) {
                return Err(field::<T>(Status::INVALID, "buf.npages"));
            }
        }
        Ok(())
    }
}
