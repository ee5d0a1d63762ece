//! ALLOC_MW, DEALLOC_MW (spec 12.23, 12.24).

use virtio_rdma_abi::config::F_MW;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;

use super::parse::{destroy_error, field, fixed};
use super::{quota, CmdError, CmdResult};
use crate::resources::Mw;
use crate::vm::VmState;

impl VmState {
    fn need_mw(&self, op: Opcode) -> Result<(), CmdError> {
        if self.has(F_MW) {
            Ok(())
        } else {
            Err(CmdError::new(Status::UNSUPPORTED, op.into()))
        }
    }

    /// Whether another MR or window fits `max_mr` (windows count as MRs).
    pub(super) fn mr_quota(&self) -> Result<(), CmdError> {
        let live = self.res.mrs.len().saturating_add(self.res.mws.len());
        if live >= self.limits.max_mr as usize {
            return Err(CmdError::new(Status::QUOTA, quota::MR));
        }
        Ok(())
    }

    pub(super) fn alloc_mw(&mut self, payload: &[u8]) -> CmdResult {
        self.need_mw(Opcode::ALLOC_MW)?;
        let req: AllocMwReq = fixed(payload)?;
        let ctx = self.pd_ctx::<AllocMwReq>(req.pd_handle)?;
        if req.mw_type != MW_TYPE_1 && req.mw_type != MW_TYPE_2 {
            return Err(field::<AllocMwReq>(Status::INVALID, "mw_type"));
        }
        self.mr_quota()?;
        let mw = Mw {
            pd: req.pd_handle,
            ctx,
            mw_type: req.mw_type,
            key: 0,
            binding: None,
        };
        let (mw_handle, rkey) = self.res.insert_mw(mw, self.rnic.as_ref())?;
        Ok(AllocMwResp { mw_handle, rkey }.to_bytes())
    }

    pub(super) fn dealloc_mw(&mut self, payload: &[u8]) -> CmdResult {
        self.need_mw(Opcode::DEALLOC_MW)?;
        let req: MwHandleReq = fixed(payload)?;
        self.res
            .dealloc_mw(req.mw_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<MwHandleReq>(e, "mw_handle"))?;
        Ok(Vec::new())
    }
}
