//! CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ.

use virtio_rdma_abi::config::F_SRQ;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::DB_NONE;
use virtio_rdma_abi::mem::recv_wqe_shift;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::GuestMemoryBackend;

use super::parse::{depth, destroy_error, field, fixed, with_list};
use super::queue_mem::init_device_half;
use super::{quota, CmdError, CmdResult};
use crate::resources::Srq;
use crate::vm::VmState;

impl VmState {
    fn need_srq(&self, op: Opcode) -> Result<(), CmdError> {
        if self.has(F_SRQ) {
            Ok(())
        } else {
            Err(CmdError::new(Status::UNSUPPORTED, op.into()))
        }
    }

    pub(super) fn create_srq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        self.need_srq(Opcode::CREATE_SRQ)?;
        let (req, list) = with_list::<CreateSrqReq>(payload)?;
        let ctx = self.pd_ctx::<CreateSrqReq>(req.pd_handle)?;
        if self.res.srqs.len() >= self.limits.max_srq as usize {
            return Err(CmdError::new(Status::QUOTA, quota::SRQ));
        }
        depth::<CreateSrqReq>(req.depth, self.limits.max_srq_wr, "depth")?;
        if req.max_sge == 0 {
            return Err(field::<CreateSrqReq>(Status::INVALID, "max_sge"));
        }
        if req.max_sge > self.limits.max_recv_sge {
            return Err(field::<CreateSrqReq>(Status::RANGE, "max_sge"));
        }
        if req.limit >= req.depth {
            return Err(field::<CreateSrqReq>(Status::RANGE, "limit"));
        }
        let wqe_shift = recv_wqe_shift(req.max_sge);
        let bytes = u64::from(req.depth) << wqe_shift;
        let ring = self.queue_memory::<CreateSrqReq, M>(mem, &req.buf, list, bytes, req.db_gpa)?;
        let srq_handle = self.res.insert_srq(
            Srq {
                pd: req.pd_handle,
                ctx,
                depth: req.depth,
                max_sge: req.max_sge,
                limit: req.limit,
                wqe_shift,
                db_gpa: req.db_gpa,
                db_slot: None,
                ring,
                users: 0,
                rt: Default::default(),
            },
            self.rnic.as_ref(),
        )?;
        let db_slot = self.alloc_db_slot(ctx);
        if let Some(srq) = self.res.srqs.get_mut(srq_handle) {
            srq.db_slot = db_slot.clone();
        }
        init_device_half(mem, req.db_gpa);
        Ok(CreateSrqResp {
            srq_handle,
            wqe_shift,
            db_slot: db_slot.as_ref().map_or(DB_NONE, |s| s.at().slot),
            reserved: 0,
        }
        .to_bytes())
    }

    pub(super) fn modify_srq(&mut self, payload: &[u8]) -> CmdResult {
        self.need_srq(Opcode::MODIFY_SRQ)?;
        let req: ModifySrqReq = fixed(payload)?;
        let known = SRQ_ATTR_MAX_WR | SRQ_ATTR_LIMIT;
        let srq = self
            .res
            .srqs
            .get_mut(req.srq_handle)
            .ok_or_else(|| field::<ModifySrqReq>(Status::BAD_HANDLE, "srq_handle"))?;
        if req.attr_mask == 0 || req.attr_mask & !known != 0 {
            return Err(CmdError::new(Status::INVALID, req.attr_mask & !known));
        }
        if req.attr_mask & SRQ_ATTR_MAX_WR != 0 {
            return Err(CmdError::new(Status::UNSUPPORTED, SRQ_ATTR_MAX_WR));
        }
        if req.limit >= srq.depth {
            return Err(field::<ModifySrqReq>(Status::RANGE, "limit"));
        }
        srq.limit = req.limit;
        Ok(Vec::new())
    }

    pub(super) fn query_srq(&mut self, payload: &[u8]) -> CmdResult {
        self.need_srq(Opcode::QUERY_SRQ)?;
        let req: SrqHandleReq = fixed(payload)?;
        let srq = self
            .res
            .srqs
            .get(req.srq_handle)
            .ok_or_else(|| field::<SrqHandleReq>(Status::BAD_HANDLE, "srq_handle"))?;
        Ok(QuerySrqResp {
            depth: srq.depth,
            max_sge: srq.max_sge,
            limit: srq.limit,
        }
        .to_bytes())
    }

    pub(super) fn destroy_srq(&mut self, payload: &[u8]) -> CmdResult {
        self.need_srq(Opcode::DESTROY_SRQ)?;
        let req: SrqHandleReq = fixed(payload)?;
        self.res
            .destroy_srq(req.srq_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<SrqHandleReq>(e, "srq_handle"))?;
        Ok(Vec::new())
    }
}
