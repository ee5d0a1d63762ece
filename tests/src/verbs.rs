//! A typed control-verb client over the test VMM's control queue.
//!
//! Each method builds the request from the ABI crate's types, allocates the
//! guest memory a command needs (rings, doorbell records, indirect list
//! pages) and returns the parsed response, or [`Error::Status`] with the
//! device's status and detail.

use std::sync::Arc;

use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::CtxDoorbell;
use virtio_rdma_abi::mem::{
    indirect_list_pages, qp_buffer_layout, recv_wqe_shift, BufferDesc, PageListMode, CQE_SIZE,
    DB_RECORD_SIZE, LIST_PAGE_ENTRIES, LIST_PAGE_SIZE,
};
use virtio_rdma_abi::qp::{attr, AddressVector, Mtu, QpAttr, QpState, QpType};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Field;
use vm_memory::GuestAddress;

use crate::ctrl::CtrlQueue;
use crate::error::{Error, Result};
use crate::guest_mem::{GuestMem, PAGE_SIZE};
use crate::vmm::TestVmm;

/// The status and detail of a failed command, if `r` is one.
pub fn status_of<T>(r: &Result<T>) -> Option<(Status, u32)> {
    match r {
        Err(Error::Status { status, detail, .. }) => {
            Status::from_u32(*status).map(|s| (s, *detail))
        }
        _ => None,
    }
}

/// Guest memory described by a page list, ready to go into a request.
#[derive(Debug, Clone)]
pub struct PageListReq {
    /// The descriptor for the request's `buf` field.
    pub desc: BufferDesc,
    /// Bytes that follow the fixed part (inline entries or list-page addresses).
    pub tail: Vec<u8>,
}

/// Ring memory of a CQ, QP or SRQ.
#[derive(Debug, Clone)]
pub struct Ring {
    /// Guest pages, in ring order.
    pub pages: Vec<GuestAddress>,
    /// Doorbell record.
    pub db: GuestAddress,
}

/// Creation parameters of a QP.
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    /// Protection domain.
    pub pd: u32,
    /// Transport.
    pub qp_type: QpType,
    /// Send CQ.
    pub send_cq: u32,
    /// Receive CQ.
    pub recv_cq: u32,
    /// SRQ or 0.
    pub srq: u32,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth (0 with an SRQ).
    pub rq_depth: u32,
    /// SGEs per send WQE.
    pub max_send_sge: u32,
    /// SGEs per receive WQE.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

impl QpInit {
    /// A small RC QP on one CQ.
    pub fn rc(pd: u32, cq: u32) -> Self {
        QpInit {
            pd,
            qp_type: QpType::RC,
            send_cq: cq,
            recv_cq: cq,
            srq: 0,
            sq_depth: 16,
            rq_depth: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        }
    }

    /// A small UD QP on one CQ.
    pub fn ud(pd: u32, cq: u32) -> Self {
        QpInit {
            qp_type: QpType::UD,
            ..Self::rc(pd, cq)
        }
    }

    /// A small GSI QP (QP 1, needs `F_GSI`) on one CQ.
    pub fn gsi(pd: u32, cq: u32) -> Self {
        QpInit {
            qp_type: QpType::GSI,
            ..Self::rc(pd, cq)
        }
    }
}

/// A memory registration: `length` bytes at `iova`, backed by `pages`
/// (4 KiB each) starting `first_page_offset` bytes into the first page.
#[derive(Debug, Clone, Copy)]
pub struct MrSpec<'p> {
    /// Protection domain.
    pub pd: u32,
    /// Access flags.
    pub access: u32,
    /// Start address in work requests.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Backing pages.
    pub pages: &'p [GuestAddress],
    /// Offset of the first byte in the first page.
    pub first_page_offset: u32,
    /// How the page list is sent.
    pub mode: PageListMode,
}

impl<'p> MrSpec<'p> {
    /// Whole pages from offset 0, inline page list.
    pub fn new(pd: u32, access: u32, iova: u64, pages: &'p [GuestAddress]) -> Self {
        MrSpec {
            pd,
            access,
            iova,
            length: pages.len() as u64 * PAGE_SIZE,
            pages,
            first_page_offset: 0,
            mode: PageListMode::INLINE,
        }
    }
}

/// A created QP.
#[derive(Debug, Clone, Copy)]
pub struct QpInfo {
    /// Handle.
    pub handle: u32,
    /// QP number.
    pub qpn: u32,
}

/// Typed control verbs of one VM.
pub struct Verbs<'a> {
    ctrl: &'a mut CtrlQueue,
    mem: Arc<GuestMem>,
}

impl<'a> Verbs<'a> {
    /// Verbs over the VMM's control queue.
    pub fn new(vmm: &'a mut TestVmm) -> Self {
        let mem = vmm.mem().clone();
        Verbs {
            ctrl: vmm.ctrl(),
            mem,
        }
    }

    /// The raw control queue.
    pub fn ctrl(&mut self) -> &mut CtrlQueue {
        self.ctrl
    }

    /// Guest memory.
    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    /// Describes `pages` (each `1 << shift` bytes) in `mode`, writing list
    /// pages into guest memory for `INDIRECT`.
    pub fn page_list(
        &self,
        pages: &[GuestAddress],
        shift: u32,
        mode: PageListMode,
    ) -> Result<PageListReq> {
        let npages =
            u32::try_from(pages.len()).map_err(|_| Error::Backend("too many pages".into()))?;
        let mut desc = BufferDesc {
            addr: 0,
            npages,
            first_page_offset: 0,
            page_shift: shift,
            mode: mode.into(),
        };
        let tail = match mode {
            PageListMode::INLINE => pages.iter().flat_map(|p| p.0.to_le_bytes()).collect(),
            PageListMode::CONTIGUOUS => {
                desc.addr = pages.first().map_or(0, |p| p.0);
                Vec::new()
            }
            PageListMode::INDIRECT => {
                let nlist = indirect_list_pages(npages) as usize;
                let mut dir = Vec::with_capacity(nlist * 8);
                for chunk in pages.chunks(LIST_PAGE_ENTRIES as usize) {
                    let lp = self.mem.alloc(LIST_PAGE_SIZE, LIST_PAGE_SIZE)?;
                    let bytes: Vec<u8> = chunk.iter().flat_map(|p| p.0.to_le_bytes()).collect();
                    self.mem.write(lp, &bytes)?;
                    dir.extend_from_slice(&lp.0.to_le_bytes());
                }
                dir
            }
        };
        Ok(PageListReq { desc, tail })
    }

    /// Allocates ring memory of `bytes` (4 KiB pages, deliberately not
    /// contiguous) and a doorbell record.
    pub fn alloc_ring(&self, bytes: u64) -> Result<Ring> {
        let n = bytes.div_ceil(PAGE_SIZE).max(1) as usize;
        let pages = self.mem.alloc_pages(n, PAGE_SIZE)?;
        let db = self.mem.alloc(DB_RECORD_SIZE, DB_RECORD_SIZE)?;
        Ok(Ring { pages, db })
    }

    fn list_for(&self, ring: &Ring) -> Result<PageListReq> {
        let mode = if ring.pages.len() <= 64 {
            PageListMode::INLINE
        } else {
            PageListMode::INDIRECT
        };
        self.page_list(&ring.pages, 12, mode)
    }

    /// QUERY_DEVICE.
    pub fn query_device(&mut self) -> Result<DeviceAttr> {
        self.ctrl
            .call(Opcode::QUERY_DEVICE, &[], DeviceAttr::SIZE)?
            .ok()?
            .parse()
    }

    /// QUERY_PORT.
    pub fn query_port(&mut self, port: u32) -> Result<PortAttr> {
        self.ctrl
            .call_typed(Opcode::QUERY_PORT, &QueryPortReq { port }, &[])
    }

    /// QUERY_GID.
    pub fn query_gid(&mut self, port: u32, index: u32) -> Result<QueryGidResp> {
        self.ctrl
            .call_typed(Opcode::QUERY_GID, &QueryGidReq { port, index }, &[])
    }

    /// CREATE_CTX.
    pub fn create_ctx(&mut self) -> Result<u32> {
        Ok(self.create_ctx_full()?.ctx_handle)
    }

    /// CREATE_CTX, with the whole response (the doorbell page); the
    /// context's doorbell header is allocated in guest memory.
    pub fn create_ctx_full(&mut self) -> Result<CreateCtxResp> {
        let header = CtxDoorbell::SIZE as u64;
        let db_gpa = self.mem.alloc(header, header)?.0;
        self.create_ctx_at(db_gpa)
    }

    /// CREATE_CTX with the doorbell header at `db_gpa` (any value: hostile
    /// tests pass bad ones).
    pub fn create_ctx_at(&mut self, db_gpa: u64) -> Result<CreateCtxResp> {
        self.ctrl
            .call_typed(Opcode::CREATE_CTX, &CreateCtxReq { db_gpa }, &[])
    }

    /// DESTROY_CTX.
    pub fn destroy_ctx(&mut self, ctx_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DESTROY_CTX, &CtxHandleReq { ctx_handle }, &[])
            .map(drop)
    }

    /// ALLOC_PD.
    pub fn alloc_pd(&mut self, ctx_handle: u32) -> Result<u32> {
        let r: PdHandleResp =
            self.ctrl
                .call_typed(Opcode::ALLOC_PD, &CtxHandleReq { ctx_handle }, &[])?;
        Ok(r.pd_handle)
    }

    /// CREATE_CTX, then ALLOC_PD in the new context: (context, PD), what
    /// most command sequences start from.
    pub fn ctx_pd(&mut self) -> Result<(u32, u32)> {
        let ctx = self.create_ctx()?;
        let pd = self.alloc_pd(ctx)?;
        Ok((ctx, pd))
    }

    /// [`Verbs::ctx_pd`], then CREATE_CQ of `depth` in the new context:
    /// (context, PD, CQ).
    pub fn ctx_pd_cq(&mut self, depth: u32) -> Result<(u32, u32, u32)> {
        let (ctx, pd) = self.ctx_pd()?;
        let cq = self.create_cq(ctx, depth)?;
        Ok((ctx, pd, cq))
    }

    /// DEALLOC_PD.
    pub fn dealloc_pd(&mut self, pd_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DEALLOC_PD, &PdHandleReq { pd_handle }, &[])
            .map(drop)
    }

    /// CREATE_CQ with freshly allocated ring memory.
    pub fn create_cq(&mut self, ctx_handle: u32, depth: u32) -> Result<u32> {
        let (req, tail) = self.cq_request(ctx_handle, depth)?;
        self.create_cq_raw(&req, &tail)
    }

    /// Builds a CREATE_CQ request with freshly allocated ring memory (the
    /// ring's pages are the inline page list, the record is `db_gpa`).
    pub fn cq_request(&self, ctx_handle: u32, depth: u32) -> Result<(CreateCqReq, Vec<u8>)> {
        let ring = self.alloc_ring(u64::from(depth) * u64::from(CQE_SIZE))?;
        let list = self.list_for(&ring)?;
        Ok((
            CreateCqReq {
                ctx_handle,
                depth,
                db_gpa: ring.db.0,
                buf: list.desc,
            },
            list.tail,
        ))
    }

    /// CREATE_CQ with a request built by the caller.
    pub fn create_cq_raw(&mut self, req: &CreateCqReq, tail: &[u8]) -> Result<u32> {
        let r: CqHandleResp = self.ctrl.call_typed(Opcode::CREATE_CQ, req, tail)?;
        Ok(r.cq_handle)
    }

    /// DESTROY_CQ.
    pub fn destroy_cq(&mut self, cq_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DESTROY_CQ, &CqHandleReq { cq_handle }, &[])
            .map(drop)
    }

    /// REG_MR as described by `spec`.
    pub fn reg_mr(&mut self, spec: &MrSpec<'_>) -> Result<RegMrResp> {
        let mut list = self.page_list(spec.pages, 12, spec.mode)?;
        list.desc.first_page_offset = spec.first_page_offset;
        self.reg_mr_raw(
            &RegMrReq {
                pd_handle: spec.pd,
                access: spec.access,
                iova: spec.iova,
                length: spec.length,
                buf: list.desc,
            },
            &list.tail,
        )
    }

    /// REG_MR with a request built by the caller.
    pub fn reg_mr_raw(&mut self, req: &RegMrReq, tail: &[u8]) -> Result<RegMrResp> {
        self.ctrl.call_typed(Opcode::REG_MR, req, tail)
    }

    /// ALLOC_MR (`F_MEM_MGT`): a fast-registration region of PD
    /// `pd_handle` for up to `max_num_sg` pages.
    pub fn alloc_mr(&mut self, pd_handle: u32, max_num_sg: u32) -> Result<RegMrResp> {
        self.ctrl.call_typed(
            Opcode::ALLOC_MR,
            &AllocMrReq {
                pd_handle,
                max_num_sg,
            },
            &[],
        )
    }

    /// ALLOC_MW (`F_MW`).
    pub fn alloc_mw(&mut self, pd_handle: u32, mw_type: u32) -> Result<AllocMwResp> {
        self.ctrl
            .call_typed(Opcode::ALLOC_MW, &AllocMwReq { pd_handle, mw_type }, &[])
    }

    /// DEALLOC_MW (`F_MW`).
    pub fn dealloc_mw(&mut self, mw_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DEALLOC_MW, &MwHandleReq { mw_handle }, &[])
            .map(drop)
    }

    /// DEREG_MR.
    pub fn dereg_mr(&mut self, mr_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DEREG_MR, &MrHandleReq { mr_handle }, &[])
            .map(drop)
    }

    /// Builds a CREATE_QP request with freshly allocated ring memory.
    pub fn qp_request(&self, init: &QpInit) -> Result<(CreateQpReq, Vec<u8>)> {
        let layout = qp_buffer_layout(
            init.sq_depth,
            init.rq_depth,
            init.max_send_sge,
            init.max_recv_sge,
            init.max_inline_data,
            12,
        );
        let ring = self.alloc_ring(layout.total)?;
        let list = self.list_for(&ring)?;
        Ok((
            CreateQpReq {
                pd_handle: init.pd,
                qp_type: init.qp_type.into(),
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                srq_handle: init.srq,
                flags: 0,
                sq_depth: init.sq_depth,
                rq_depth: init.rq_depth,
                max_send_sge: init.max_send_sge,
                max_recv_sge: init.max_recv_sge,
                max_inline_data: init.max_inline_data,
                xrcd_handle: 0,
                db_gpa: ring.db.0,
                buf: list.desc,
            },
            list.tail,
        ))
    }

    /// CREATE_QP.
    pub fn create_qp(&mut self, init: &QpInit) -> Result<QpInfo> {
        let (req, tail) = self.qp_request(init)?;
        let r = self.create_qp_raw(&req, &tail)?;
        Ok(QpInfo {
            handle: r.qp_handle,
            qpn: r.qpn,
        })
    }

    /// CREATE_QP with a request built by the caller.
    pub fn create_qp_raw(&mut self, req: &CreateQpReq, tail: &[u8]) -> Result<CreateQpResp> {
        self.ctrl.call_typed(Opcode::CREATE_QP, req, tail)
    }

    /// MODIFY_QP.
    pub fn modify_qp(&mut self, qp_handle: u32, attr_mask: u32, attr: &QpAttr) -> Result<()> {
        self.ctrl
            .call_typed_unit(
                Opcode::MODIFY_QP,
                &ModifyQpReq {
                    qp_handle,
                    attr_mask,
                    attr: *attr,
                },
                &[],
            )
            .map(drop)
    }

    /// QUERY_QP.
    pub fn query_qp(&mut self, qp_handle: u32) -> Result<QueryQpResp> {
        self.ctrl
            .call_typed(Opcode::QUERY_QP, &QpHandleReq { qp_handle }, &[])
    }

    /// DESTROY_QP.
    pub fn destroy_qp(&mut self, qp_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DESTROY_QP, &QpHandleReq { qp_handle }, &[])
            .map(drop)
    }

    /// The VM's own GID and its index, as the reference driver picks it:
    /// the operator's first GID, index 1 of a table with more than one
    /// entry (index 0 is the default GID of ABI version 3), else index 0.
    pub fn own_gid(&mut self) -> Result<(u8, [u8; 16])> {
        if self.query_port(1)?.gid_tbl_len > 1 {
            let g = self.query_gid(1, 1)?.gid;
            if g != [0; 16] {
                return Ok((1, g));
            }
        }
        Ok((0, self.query_gid(1, 0)?.gid))
    }

    /// Moves an RC QP RESET -> INIT -> RTR -> RTS towards `dest_qpn` at
    /// `dgid`, from the VM's own GID ([`Verbs::own_gid`]).
    pub fn connect_rc(&mut self, qp: u32, dest_qpn: u32, dgid: [u8; 16]) -> Result<()> {
        // The path MTU is at most what the link carries now (a host RNIC's
        // port reports its netdev's).
        let active = self.query_port(1)?.active_mtu;
        let (sgid_index, _) = self.own_gid()?;
        for (mask, mut a) in rc_transitions(dest_qpn, dgid, sgid_index) {
            if mask & attr::PATH_MTU != 0 {
                a.path_mtu = a.path_mtu.min(active);
            }
            self.modify_qp(qp, mask, &a)?;
        }
        Ok(())
    }

    /// Moves a UD QP RESET -> INIT -> RTR -> RTS with `qkey`.
    pub fn activate_ud(&mut self, qp: u32, qkey: u32) -> Result<()> {
        for (mask, a) in ud_transitions(qkey) {
            self.modify_qp(qp, mask, &a)?;
        }
        Ok(())
    }

    /// Moves the GSI QP RESET -> INIT -> RTR -> RTS with the GSI's Q_Key.
    pub fn activate_gsi(&mut self, qp: u32) -> Result<()> {
        self.activate_ud(qp, virtio_rdma_abi::qp::GSI_QKEY)
    }

    /// CREATE_AH.
    pub fn create_ah(&mut self, pd_handle: u32, av: AddressVector) -> Result<u32> {
        let r: AhHandleResp = self.ctrl.call_typed(
            Opcode::CREATE_AH,
            &CreateAhReq {
                pd_handle,
                port: 1,
                av,
            },
            &[],
        )?;
        Ok(r.ah_handle)
    }

    /// DESTROY_AH.
    pub fn destroy_ah(&mut self, ah_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DESTROY_AH, &AhHandleReq { ah_handle }, &[])
            .map(drop)
    }

    /// CREATE_SRQ with freshly allocated ring memory.
    pub fn create_srq(
        &mut self,
        pd_handle: u32,
        depth: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<CreateSrqResp> {
        let (req, tail) = self.srq_request(pd_handle, depth, max_sge, limit)?;
        self.create_srq_raw(&req, &tail)
    }

    /// Builds a CREATE_SRQ request with freshly allocated ring memory (the
    /// ring's pages are the inline page list, the record is `db_gpa`).
    pub fn srq_request(
        &self,
        pd_handle: u32,
        depth: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<(CreateSrqReq, Vec<u8>)> {
        let ring = self.alloc_ring(u64::from(depth) << recv_wqe_shift(max_sge))?;
        let list = self.list_for(&ring)?;
        Ok((
            CreateSrqReq {
                pd_handle,
                depth,
                max_sge,
                limit,
                db_gpa: ring.db.0,
                buf: list.desc,
            },
            list.tail,
        ))
    }

    /// CREATE_SRQ with a request built by the caller.
    pub fn create_srq_raw(&mut self, req: &CreateSrqReq, tail: &[u8]) -> Result<CreateSrqResp> {
        self.ctrl.call_typed(Opcode::CREATE_SRQ, req, tail)
    }

    /// MODIFY_SRQ.
    pub fn modify_srq(
        &mut self,
        srq_handle: u32,
        attr_mask: u32,
        max_wr: u32,
        limit: u32,
    ) -> Result<()> {
        self.ctrl
            .call_typed_unit(
                Opcode::MODIFY_SRQ,
                &ModifySrqReq {
                    srq_handle,
                    attr_mask,
                    max_wr,
                    limit,
                },
                &[],
            )
            .map(drop)
    }

    /// QUERY_SRQ.
    pub fn query_srq(&mut self, srq_handle: u32) -> Result<QuerySrqResp> {
        self.ctrl
            .call_typed(Opcode::QUERY_SRQ, &SrqHandleReq { srq_handle }, &[])
    }

    /// DESTROY_SRQ.
    pub fn destroy_srq(&mut self, srq_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::DESTROY_SRQ, &SrqHandleReq { srq_handle }, &[])
            .map(drop)
    }

    /// OPEN_XRCD (`F_XRC`).
    pub fn open_xrcd(&mut self, ctx_handle: u32) -> Result<u32> {
        self.ctrl
            .call_typed::<_, XrcdHandle>(Opcode::OPEN_XRCD, &CtxHandleReq { ctx_handle }, &[])
            .map(|r| r.xrcd_handle)
    }

    /// CLOSE_XRCD (`F_XRC`).
    pub fn close_xrcd(&mut self, xrcd_handle: u32) -> Result<()> {
        self.ctrl
            .call_typed_unit(Opcode::CLOSE_XRCD, &XrcdHandle { xrcd_handle }, &[])
            .map(drop)
    }

    /// Builds a CREATE_XRC_SRQ request with freshly allocated ring memory.
    pub fn xrc_srq_request(
        &self,
        pd_handle: u32,
        xrcd_handle: u32,
        cq_handle: u32,
        depth: u32,
    ) -> Result<(CreateXrcSrqReq, Vec<u8>)> {
        let (r, tail) = self.srq_request(pd_handle, depth, 1, 0)?;
        Ok((
            CreateXrcSrqReq {
                pd_handle,
                depth,
                max_sge: r.max_sge,
                limit: 0,
                xrcd_handle,
                cq_handle,
                db_gpa: r.db_gpa,
                buf: r.buf,
            },
            tail,
        ))
    }

    /// CREATE_XRC_SRQ (`F_XRC`) of `depth` one-SGE WQEs.
    pub fn create_xrc_srq(
        &mut self,
        pd_handle: u32,
        xrcd_handle: u32,
        cq_handle: u32,
        depth: u32,
    ) -> Result<CreateSrqResp> {
        let (req, tail) = self.xrc_srq_request(pd_handle, xrcd_handle, cq_handle, depth)?;
        self.create_xrc_srq_raw(&req, &tail)
    }

    /// CREATE_XRC_SRQ with a request built by the caller.
    pub fn create_xrc_srq_raw(
        &mut self,
        req: &CreateXrcSrqReq,
        tail: &[u8],
    ) -> Result<CreateSrqResp> {
        self.ctrl.call_typed(Opcode::CREATE_XRC_SRQ, req, tail)
    }

    /// The CREATE_QP request of an XRC_TGT QP in domain `xrcd_handle`:
    /// every field but the type and the domain zero.
    pub fn tgt_request(xrcd_handle: u32) -> CreateQpReq {
        CreateQpReq {
            qp_type: QpType::XRC_TGT.into(),
            xrcd_handle,
            ..CreateQpReq::default()
        }
    }
}

/// The three MODIFY_QP steps that bring an RC QP from RESET to RTS, to
/// `dest_qpn` at `dgid` from GID index `sgid_index`.
pub fn rc_transitions(dest_qpn: u32, dgid: [u8; 16], sgid_index: u8) -> [(u32, QpAttr); 3] {
    use virtio_rdma_abi::mem::access;
    let init = QpAttr {
        qp_state: QpState::INIT.into(),
        pkey_index: 0,
        port: 1,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::RTR.into(),
        av: AddressVector {
            dgid,
            sgid_index,
            hop_limit: 64,
            ..AddressVector::default()
        },
        path_mtu: Mtu::MTU_4096.into(),
        dest_qpn,
        rq_psn: 0x1234,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    let rts = QpAttr {
        qp_state: QpState::RTS.into(),
        sq_psn: 0x1234,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    [
        (
            attr::STATE | attr::PKEY_INDEX | attr::PORT | attr::ACCESS,
            init,
        ),
        (
            attr::STATE
                | attr::AV
                | attr::PATH_MTU
                | attr::DEST_QPN
                | attr::RQ_PSN
                | attr::MAX_DEST_RD_ATOMIC
                | attr::MIN_RNR_TIMER,
            rtr,
        ),
        (
            attr::STATE
                | attr::SQ_PSN
                | attr::TIMEOUT
                | attr::RETRY_CNT
                | attr::RNR_RETRY
                | attr::MAX_RD_ATOMIC,
            rts,
        ),
    ]
}

/// The three MODIFY_QP steps that bring a UD QP from RESET to RTS.
pub fn ud_transitions(qkey: u32) -> [(u32, QpAttr); 3] {
    let init = QpAttr {
        qp_state: QpState::INIT.into(),
        port: 1,
        qkey,
        ..QpAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::RTR.into(),
        ..QpAttr::default()
    };
    let rts = QpAttr {
        qp_state: QpState::RTS.into(),
        sq_psn: 1,
        ..QpAttr::default()
    };
    [
        (
            attr::STATE | attr::PKEY_INDEX | attr::PORT | attr::QKEY,
            init,
        ),
        (attr::STATE, rtr),
        (attr::STATE | attr::SQ_PSN, rts),
    ]
}
