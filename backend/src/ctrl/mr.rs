//! REG_MR, DEREG_MR, ALLOC_MR.

use virtio_rdma_abi::config::{F_ATOMIC, F_MEM_MGT, F_MW};
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, Status};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use super::parse::{destroy_error, field, fixed, page_list_error, shift_plausible, with_list};
use super::{quota, CmdError, CmdResult};
use crate::memory::pagelist::{pages_for, PageListLimits};
use crate::memory::{PageList, PageListError, RamMap};
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
        let allowed = access::ALL | access::MW_BIND;
        check_access::<RegMrReq>(req.access, allowed, self.has(F_ATOMIC), "access")?;
        if req.access & access::MW_BIND != 0 && !self.has(F_MW) {
            return Err(field::<RegMrReq>(Status::UNSUPPORTED, "access"));
        }
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
            // `length <= max_mr_size` (checked above): cannot saturate.
            let span = u64::from(req.buf.first_page_offset).saturating_add(req.length);
            if u64::from(req.buf.npages) != pages_for(span, req.buf.page_shift) {
                return Err(field::<RegMrReq>(Status::INVALID, "buf.npages"));
            }
        }
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
}
