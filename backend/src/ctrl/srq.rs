//! CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ.

use virtio_rdma_abi::config::{F_RESIZE, F_SRQ};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{SrqDoorbell, DB_NONE};
use virtio_rdma_abi::mem::{recv_wqe_shift, BufferDesc};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::parse::{depth, destroy_error, field, fixed, with_list};
use super::queue_mem::init_device_half;
use super::ring_copy::{copy_entries, Ring};
use super::{quota, CmdError, CmdResult, DETAIL_DB_RECORD};
use crate::memory::volatile::read_guest;
use crate::resources::Srq;
use crate::vm::VmState;

/// What `CREATE_SRQ` and `CREATE_XRC_SRQ` have in common, checked as far
/// as the PD (and its context).
pub(super) struct SrqShape {
    pub(super) pd: u32,
    pub(super) ctx: u32,
    pub(super) depth: u32,
    pub(super) max_sge: u32,
    pub(super) limit: u32,
    pub(super) db_gpa: u64,
    pub(super) buf: BufferDesc,
}

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
        let shape = SrqShape {
            pd: req.pd_handle,
            ctx,
            depth: req.depth,
            max_sge: req.max_sge,
            limit: req.limit,
            db_gpa: req.db_gpa,
            buf: req.buf,
        };
        self.new_srq::<CreateSrqReq, M>(mem, &shape, list, None)
    }

    /// Creates an SRQ of `shape` (whose request `T` names the fields for
    /// `detail`), an XRC SRQ of domain and CQ `xrc` if given; returns the
    /// `CreateSrqResp` bytes.
    pub(super) fn new_srq<T: Wire, M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        shape: &SrqShape,
        list: &[u8],
        xrc: Option<(u32, u32)>,
    ) -> CmdResult {
        if self.res.srqs.len() >= self.limits.max_srq as usize {
            return Err(CmdError::new(Status::QUOTA, quota::SRQ));
        }
        depth::<T>(shape.depth, self.limits.max_srq_wr, "depth")?;
        if shape.max_sge == 0 {
            return Err(field::<T>(Status::INVALID, "max_sge"));
        }
        if shape.max_sge > self.limits.max_recv_sge {
            return Err(field::<T>(Status::RANGE, "max_sge"));
        }
        if shape.limit >= shape.depth {
            return Err(field::<T>(Status::RANGE, "limit"));
        }
        let wqe_shift = recv_wqe_shift(shape.max_sge);
        let bytes = u64::from(shape.depth) << wqe_shift;
        let ring = self.queue_memory::<T, M>(mem, &shape.buf, list, bytes, shape.db_gpa)?;
        let srq_handle = self.res.insert_srq(
            Srq {
                pd: shape.pd,
                ctx: shape.ctx,
                depth: shape.depth,
                max_sge: shape.max_sge,
                limit: shape.limit,
                wqe_shift,
                db_gpa: shape.db_gpa,
                db_slot: None,
                ring,
                users: 0,
                xrc: None,
                rt: Default::default(),
            },
            self.rnic.as_ref(),
        )?;
        let srqn = match xrc {
            None => 0,
            Some((xrcd, cq)) => {
                match self
                    .res
                    .make_xrc_srq(srq_handle, xrcd, cq, self.rnic.as_ref())
                {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = self.res.destroy_srq(srq_handle, self.rnic.as_ref());
                        return Err(e.into());
                    }
                }
            }
        };
        let db_slot = self.alloc_db_slot(shape.ctx);
        if let Some(srq) = self.res.srqs.get_mut(srq_handle) {
            srq.db_slot = db_slot.clone();
        }
        init_device_half(mem, shape.db_gpa);
        Ok(CreateSrqResp {
            srq_handle,
            wqe_shift,
            db_slot: db_slot.as_ref().map_or(DB_NONE, |s| s.at().slot),
            srqn,
        }
        .to_bytes())
    }

    pub(super) fn modify_srq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        self.need_srq(Opcode::MODIFY_SRQ)?;
        let (head, _) = with_list::<ModifySrqReq>(payload)?;
        let resize = head.attr_mask & SRQ_ATTR_MAX_WR != 0 && self.has(F_RESIZE);
        // The version 2 form is exactly a `ModifySrqReq`.
        let req: ModifySrqReq = if resize { head } else { fixed(payload)? };
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
            if !resize {
                return Err(CmdError::new(Status::UNSUPPORTED, SRQ_ATTR_MAX_WR));
            }
            return self.resize_srq(mem, payload);
        }
        if req.limit >= srq.depth {
            return Err(field::<ModifySrqReq>(Status::RANGE, "limit"));
        }
        srq.limit = req.limit;
        Ok(Vec::new())
    }

    /// `MODIFY_SRQ` with `SRQ_ATTR_MAX_WR` (spec 12.19): the posted WQEs
    /// move to the new ring at their indices. Under the VM's lock, which
    /// the engine holds while it consumes WQEs: none is consumed
    /// meanwhile.
    fn resize_srq<M: GuestMemoryBackend>(&mut self, mem: &M, payload: &[u8]) -> CmdResult {
        let (req, list) = with_list::<ModifySrqResizeReq>(payload)?;
        let srq = self
            .res
            .srqs
            .get(req.srq_handle)
            .ok_or_else(|| field::<ModifySrqResizeReq>(Status::BAD_HANDLE, "srq_handle"))?;
        depth::<ModifySrqResizeReq>(req.max_wr, self.limits.max_srq_wr, "max_wr")?;
        let pi = match &srq.db_slot {
            Some(slot) => Some(slot.load(0)),
            None => {
                let mut word = [0u8; 4];
                srq.db_gpa
                    .checked_add(SrqDoorbell::PI)
                    .and_then(|at| read_guest(mem, GuestAddress(at), &mut word).ok())
                    .map(|()| u32::from_le_bytes(word))
            }
        }
        .ok_or_else(|| CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD))?;
        // Posted and not consumed, those a host NIC took included.
        let posted = pi.wrapping_sub(srq.rt.ci);
        if posted > srq.depth || posted > req.max_wr {
            return Err(field::<ModifySrqResizeReq>(Status::RANGE, "max_wr"));
        }
        let limit = if req.attr_mask & SRQ_ATTR_LIMIT != 0 {
            req.limit
        } else {
            srq.limit
        };
        if limit >= req.max_wr {
            return Err(field::<ModifySrqResizeReq>(Status::RANGE, "limit"));
        }
        let (old_depth, shift, db_gpa, ci) = (srq.depth, srq.wqe_shift, srq.db_gpa, srq.rt.ci);
        let bytes = u64::from(req.max_wr) << shift;
        let ring =
            self.queue_memory::<ModifySrqResizeReq, M>(mem, &req.buf, list, bytes, db_gpa)?;
        let stride = 1usize << shift;
        let copied = self.res.srqs.get(req.srq_handle).is_some_and(|srq| {
            let from = Ring {
                pages: &srq.ring,
                depth: old_depth,
                stride,
            };
            let to = Ring {
                pages: &ring,
                depth: req.max_wr,
                stride,
            };
            copy_entries(mem, from, to, ci, posted, |_, _| {}).is_ok()
        });
        if !copied {
            self.res.release(ring);
            return Err(CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD));
        }
        self.res
            .swap_srq_ring(req.srq_handle, ring, req.max_wr, limit)
            .map_err(|_| CmdError::new(Status::QUOTA, quota::HOST_BYTES))?;
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
