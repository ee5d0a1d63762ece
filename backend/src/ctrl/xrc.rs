//! OPEN_XRCD, CLOSE_XRCD, CREATE_XRC_SRQ (spec 12.28, 12.29).

use virtio_rdma_abi::config::{F_SRQ, F_XRC};
use virtio_rdma_abi::ctrl::{quota, Opcode, Status};
use virtio_rdma_abi::datapath::DB_NONE;
use virtio_rdma_abi::mem::QpBufferLayout;
use virtio_rdma_abi::qp::{QpAttr, QpState, QpType};
use virtio_rdma_abi::verbs::{
    CreateQpReq, CreateQpResp, CreateXrcSrqReq, CtxHandleReq, XrcdHandle, MAX_XRCD,
};
use virtio_rdma_abi::Wire;
use vm_memory::GuestMemoryBackend;

use super::parse::{destroy_error, field, fixed, with_list};
use super::srq::SrqShape;
use super::{CmdError, CmdResult};
use crate::memory::PageList;
use crate::resources::Qp;
use crate::vm::VmState;

impl VmState {
    /// `F_XRC` negotiated (and `F_SRQ`, which it needs), else `UNSUPPORTED`
    /// naming `op`.
    fn need_xrc(&self, op: Opcode) -> Result<(), CmdError> {
        if self.has(F_XRC) && self.has(F_SRQ) {
            Ok(())
        } else {
            Err(CmdError::new(Status::UNSUPPORTED, op.into()))
        }
    }

    pub(super) fn open_xrcd(&mut self, payload: &[u8]) -> CmdResult {
        self.need_xrc(Opcode::OPEN_XRCD)?;
        let req: CtxHandleReq = fixed(payload)?;
        if self.res.ctxs.get(req.ctx_handle).is_none() {
            return Err(field::<CtxHandleReq>(Status::BAD_HANDLE, "ctx_handle"));
        }
        if self.res.xrcds.len() >= MAX_XRCD as usize {
            return Err(CmdError::new(Status::QUOTA, quota::XRCD));
        }
        let xrcd_handle = self.res.insert_xrcd(req.ctx_handle)?;
        Ok(XrcdHandle { xrcd_handle }.to_bytes())
    }

    pub(super) fn close_xrcd(&mut self, payload: &[u8]) -> CmdResult {
        self.need_xrc(Opcode::CLOSE_XRCD)?;
        let req: XrcdHandle = fixed(payload)?;
        self.res
            .close_xrcd(req.xrcd_handle)
            .map_err(|e| destroy_error::<XrcdHandle>(e, "xrcd_handle"))?;
        Ok(Vec::new())
    }

    pub(super) fn create_xrc_srq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        type R = CreateXrcSrqReq;
        self.need_xrc(Opcode::CREATE_XRC_SRQ)?;
        let (req, list) = with_list::<R>(payload)?;
        let ctx = self.pd_ctx::<R>(req.pd_handle)?;
        // A domain of any context of the VM (spec 12.28).
        if self.res.xrcds.get(req.xrcd_handle).is_none() {
            return Err(field::<R>(Status::BAD_HANDLE, "xrcd_handle"));
        }
        let cq = self
            .res
            .cqs
            .get(req.cq_handle)
            .ok_or_else(|| field::<R>(Status::BAD_HANDLE, "cq_handle"))?;
        if cq.ctx != ctx {
            return Err(field::<R>(Status::MISMATCH, "cq_handle"));
        }
        let shape = SrqShape {
            pd: req.pd_handle,
            ctx,
            depth: req.depth,
            max_sge: req.max_sge,
            limit: req.limit,
            db_gpa: req.db_gpa,
            buf: req.buf,
        };
        self.new_srq::<R, M>(mem, &shape, list, Some((req.xrcd_handle, req.cq_handle)))
    }

    /// `CREATE_QP` of an XRC_TGT QP (spec 12.12): it belongs to the domain
    /// `xrcd_handle` names (and to that domain's context), and has no PD,
    /// CQs, SRQ, rings or doorbell: every such field must be zero.
    pub(super) fn create_tgt_qp(&mut self, req: &CreateQpReq, list: &[u8]) -> CmdResult {
        type R = CreateQpReq;
        if !self.has(F_SRQ) {
            return Err(field::<R>(Status::UNSUPPORTED, "qp_type"));
        }
        let b = &req.buf;
        let unused = [
            (req.pd_handle, "pd_handle"),
            (req.send_cq, "send_cq"),
            (req.recv_cq, "recv_cq"),
            (req.srq_handle, "srq_handle"),
            (req.flags, "flags"),
            (req.sq_depth, "sq_depth"),
            (req.rq_depth, "rq_depth"),
            (req.max_send_sge, "max_send_sge"),
            (req.max_recv_sge, "max_recv_sge"),
            (req.max_inline_data, "max_inline_data"),
            (u32::from(req.db_gpa != 0), "db_gpa"),
            (u32::from(b.addr != 0 || b.npages != 0), "buf"),
            (b.first_page_offset | b.page_shift | b.mode, "buf"),
            (u32::from(!list.is_empty()), "buf"),
        ];
        if let Some((_, name)) = unused.into_iter().find(|(v, _)| *v != 0) {
            return Err(field::<R>(Status::INVALID, name));
        }
        let ctx = self
            .res
            .xrcds
            .get(req.xrcd_handle)
            .map(|x| x.ctx)
            .ok_or_else(|| field::<R>(Status::BAD_HANDLE, "xrcd_handle"))?;
        if self.res.qps.len() >= self.limits.max_qp as usize {
            return Err(CmdError::new(Status::QUOTA, super::quota::QP));
        }
        let qp = Qp {
            pd: 0,
            ctx,
            qp_type: QpType::XRC_TGT,
            send_cq: 0,
            recv_cq: 0,
            srq: 0,
            xrcd: req.xrcd_handle,
            flags: 0,
            qpn: 0,
            incarnation: 0,
            sq_depth: 0,
            rq_depth: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline_data: 0,
            layout: QpBufferLayout {
                sq_wqe_shift: 0,
                rq_wqe_shift: 0,
                rq_offset: 0,
                total: 0,
            },
            db_gpa: 0,
            db_slot: None,
            ring: PageList::none(),
            state: QpState::RESET,
            attr: QpAttr::default(),
            rt: Default::default(),
        };
        let (qp_handle, qpn) = self.res.insert_qp(qp, self.rnic.as_ref())?;
        Ok(CreateQpResp {
            qp_handle,
            qpn,
            sq_wqe_shift: 0,
            rq_wqe_shift: 0,
            rq_offset: 0,
            db_slot: DB_NONE,
        }
        .to_bytes())
    }
}
