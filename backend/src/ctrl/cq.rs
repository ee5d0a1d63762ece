//! CREATE_CQ, DESTROY_CQ.

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::CQE_SIZE;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::GuestMemoryBackend;

use super::parse::{depth, destroy_error, field, fixed, with_list};
use super::queue_mem::init_device_half;
use super::{quota, CmdError, CmdResult};
use crate::resources::Cq;
use crate::vm::VmState;

impl VmState {
    pub(super) fn create_cq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        let (req, list) = with_list::<CreateCqReq>(payload)?;
        if self.res.ctxs.get(req.ctx_handle).is_none() {
            return Err(field::<CreateCqReq>(Status::BAD_HANDLE, "ctx_handle"));
        }
        if self.res.cqs.len() >= self.limits.max_cq as usize {
            return Err(CmdError::new(Status::QUOTA, quota::CQ));
        }
        depth::<CreateCqReq>(req.depth, self.limits.max_cqe, "depth")?;
        let bytes = u64::from(req.depth).saturating_mul(u64::from(CQE_SIZE));
        let ring = self.queue_memory::<CreateCqReq, M>(mem, &req.buf, list, bytes, req.db_gpa)?;
        let cq_handle = self.res.insert_cq(
            Cq {
                ctx: req.ctx_handle,
                depth: req.depth,
                db_gpa: req.db_gpa,
                ring,
                users: 0,
                rt: Default::default(),
            },
            self.rnic.as_ref(),
        )?;
        init_device_half(mem, req.db_gpa);
        Ok(CqHandleResp { cq_handle }.to_bytes())
    }

    pub(super) fn destroy_cq(&mut self, payload: &[u8]) -> CmdResult {
        let req: CqHandleReq = fixed(payload)?;
        self.res
            .destroy_cq(req.cq_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<CqHandleReq>(e, "cq_handle"))?;
        Ok(Vec::new())
    }
}
