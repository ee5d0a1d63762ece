//! Shared receive queues.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use virtio_rdma_abi::config::{F_RESIZE, F_SRQ, F_XRC};
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::mem::recv_wqe_shift;
use virtio_rdma_abi::verbs::{
    CreateSrqReq, CreateSrqResp, CreateXrcSrqReq, ModifySrqReq, ModifySrqResizeReq, QuerySrqResp,
    SrqHandleReq, SRQ_ATTR_LIMIT, SRQ_ATTR_MAX_WR,
};
use virtio_rdma_abi::Field;

use crate::cq::Cq;
use crate::device::outcome_unknown;
use crate::dma::DmaBuf;
use crate::doorbell::off;
use crate::error::{Error, Result};
use crate::page_list;
use crate::pd::Pd;
use crate::ring::{post_encoded_into, Producer, QueueMem, RingGeometry, WqRegs};
use crate::wr::{encode_recv_at, RecvWr};
use crate::xrc::Xrcd;

const SRQ_REGS: WqRegs = WqRegs {
    pi: off::SRQ_PI,
    ci: off::SRQ_CI,
    slot_half: 0,
};

/// A shared receive queue (`CREATE_SRQ`, needs `F_SRQ`), destroyed on drop.
/// QPs attached to it hold an `Arc<Srq>`.
#[derive(Debug)]
pub struct Srq {
    /// An XRC SRQ's domain and CQ (`CREATE_XRC_SRQ`); dropped after it.
    xrc: Option<(Arc<Xrcd>, Arc<Cq>)>,
    pd: Arc<Pd>,
    handle: u32,
    srqn: u32,
    max_sge: u32,
    /// The ring's geometry and, once resized, its memory; posts hold it.
    ring: Mutex<SrqRing>,
    mem: ManuallyDrop<QueueMem>,
    prod: Mutex<Producer>,
}

/// An SRQ's ring as it is now.
#[derive(Debug)]
struct SrqRing {
    geometry: RingGeometry,
    /// The ring `MODIFY_SRQ` with `SRQ_ATTR_MAX_WR` gave the SRQ last, if
    /// any (the first one is `Srq::mem`'s).
    buf: Option<DmaBuf>,
}

impl Srq {
    /// Creates an SRQ of at least `max_wr` WQEs (rounded up to a power of
    /// two) with `max_sge` SGEs each and limit `limit` (0: disarmed).
    pub fn create(pd: &Arc<Pd>, max_wr: u32, max_sge: u32, limit: u32) -> Result<Arc<Srq>> {
        Self::make(pd, max_wr, max_sge, limit, None)
    }

    /// Creates an XRC SRQ (`CREATE_XRC_SRQ`, needs `F_XRC`) of domain
    /// `xrcd` whose receives complete on `cq`: XRC_INI QPs of any VM of the
    /// tenant send to it by its number ([`Srq::srqn`]) through an XRC_TGT
    /// QP of the same domain.
    pub fn create_xrc(
        pd: &Arc<Pd>,
        xrcd: &Arc<Xrcd>,
        cq: &Arc<Cq>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<Srq>> {
        pd.dev.inner.require(F_XRC)?;
        Self::make(pd, max_wr, max_sge, 0, Some((xrcd.clone(), cq.clone())))
    }

    fn make(
        pd: &Arc<Pd>,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
        xrc: Option<(Arc<Xrcd>, Arc<Cq>)>,
    ) -> Result<Arc<Srq>> {
        let inner = &pd.dev.inner;
        inner.require(F_SRQ)?;
        let depth = max_wr
            .max(1)
            .checked_next_power_of_two()
            .filter(|d| *d <= inner.config.max_srq_wr)
            .ok_or_else(|| Error::InvalidArgument(format!("SRQ of {max_wr} WQEs")))?;
        let max_sge = max_sge.max(1);
        let shift = recv_wqe_shift(max_sge);
        let ring = RingGeometry {
            base: 0,
            shift,
            depth,
        };
        let t = &*inner.transport;
        let flags = inner.ctx_flags()?;
        let mem = QueueMem::alloc(t, (depth as usize) << shift)?;
        let list = page_list::build(
            t,
            mem.pages(),
            mem.buf.page_shift(),
            0,
            inner.config.max_inline_pages,
            CreateSrqReq::SIZE,
        )?;
        let req = CreateSrqReq {
            pd_handle: pd.handle,
            depth,
            max_sge,
            limit,
            db_gpa: mem.db.gpa(),
            buf: list.desc,
        };
        let sent = match &xrc {
            None => inner.cmd(Opcode::CREATE_SRQ, &req, &list.tail),
            Some((xrcd, cq)) => {
                let req = CreateXrcSrqReq {
                    pd_handle: req.pd_handle,
                    depth,
                    max_sge,
                    limit,
                    xrcd_handle: xrcd.handle(),
                    cq_handle: cq.handle(),
                    db_gpa: req.db_gpa,
                    buf: req.buf,
                };
                inner.cmd(Opcode::CREATE_XRC_SRQ, &req, &list.tail)
            }
        };
        let r: CreateSrqResp = match sent {
            Ok(r) => r,
            Err(e) => {
                if outcome_unknown(&e) {
                    std::mem::forget((mem, list));
                }
                return Err(e);
            }
        };
        let mut mem = mem;
        let slot = inner.doorbell_slot(r.db_slot);
        mem.slot = slot.as_ref().ok().cloned().flatten();
        mem.flags = Some(flags);
        let srq = Srq {
            xrc,
            pd: pd.clone(),
            handle: r.srq_handle,
            srqn: r.srqn,
            max_sge,
            ring: Mutex::new(SrqRing {
                geometry: ring,
                buf: None,
            }),
            mem: ManuallyDrop::new(mem),
            prod: Mutex::new(Producer::default()),
        };
        // A slot the driver cannot use: dropping `srq` destroys it.
        let _ = slot?;
        if r.wqe_shift != shift {
            // Dropping `srq` destroys it.
            return Err(Error::BadResponse {
                opcode: Opcode::CREATE_SRQ,
                reason: format!("wqe_shift {} instead of {shift}", r.wqe_shift),
            });
        }
        Ok(Arc::new(srq))
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// An XRC SRQ's number (what senders name), 0 for any other SRQ.
    pub fn srqn(&self) -> u32 {
        self.srqn
    }

    /// An XRC SRQ's domain.
    pub fn xrcd(&self) -> Option<&Arc<Xrcd>> {
        self.xrc.as_ref().map(|(x, _)| x)
    }

    /// The SRQ's doorbell slot in the shared-memory doorbell mode;
    /// `None`: its doorbell record in guest RAM is used.
    pub fn doorbell_slot(&self) -> Option<u32> {
        self.mem.slot.as_ref().map(|s| s.index())
    }

    /// Number of WQEs.
    pub fn depth(&self) -> u32 {
        self.lock_ring().geometry.depth
    }

    fn lock_ring(&self) -> MutexGuard<'_, SrqRing> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `MODIFY_SRQ` with `SRQ_ATTR_MAX_WR` (needs `F_RESIZE`): a new ring
    /// of at least `max_wr` WQEs (a power of two), into which the device
    /// copies the WQEs posted and not consumed yet. Posts wait meanwhile.
    pub fn resize(&self, max_wr: u32) -> Result<()> {
        let inner = &self.pd.dev.inner;
        inner.require(F_RESIZE)?;
        let depth = max_wr
            .max(1)
            .checked_next_power_of_two()
            .ok_or_else(|| Error::InvalidArgument(format!("SRQ of {max_wr} WQEs")))?;
        let mut r = self.lock_ring();
        let shift = r.geometry.shift;
        let t = &*inner.transport;
        let page_shift = t.dma_page_shift();
        let bytes = (depth as usize) << shift;
        let buf = DmaBuf::new(t.alloc_dma(bytes, 1usize << page_shift)?)?;
        buf.fill(0, bytes, 0)?;
        let list = page_list::build(
            t,
            buf.pages(),
            buf.page_shift(),
            0,
            inner.config.max_inline_pages,
            ModifySrqResizeReq::SIZE,
        )?;
        let req = ModifySrqResizeReq {
            srq_handle: self.handle,
            attr_mask: SRQ_ATTR_MAX_WR,
            max_wr: depth,
            limit: 0,
            buf: list.desc,
        };
        let bytes = virtio_rdma_abi::Wire::to_bytes(&req);
        if let Err(e) = inner.execute(Opcode::MODIFY_SRQ, &[&bytes, &list.tail], 0) {
            if outcome_unknown(&e) {
                // The device may use either ring.
                std::mem::forget((buf, list));
            }
            return Err(e);
        }
        r.geometry.depth = depth;
        drop(r.buf.replace(buf));
        Ok(())
    }

    /// SGEs per WQE.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Posts receive work requests (all or none).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let r = self.lock_ring();
        let (max_sge, stride) = (self.max_sge, r.geometry.stride());
        post_encoded_into(
            &*self.pd.dev.inner.transport,
            &self.mem,
            r.buf.as_ref().unwrap_or(&self.mem.buf),
            &r.geometry,
            SRQ_REGS,
            &self.prod,
            wrs.len(),
            |index, out| encode_recv_at(wrs, index, max_sge, stride, out),
        )
        .map(drop)
    }

    /// Arms (non-zero, below the depth) or disarms (0) the SRQ limit.
    pub fn modify_limit(&self, limit: u32) -> Result<()> {
        self.pd.dev.inner.cmd_unit(
            Opcode::MODIFY_SRQ,
            &ModifySrqReq {
                srq_handle: self.handle,
                attr_mask: SRQ_ATTR_LIMIT,
                max_wr: 0,
                limit,
            },
        )
    }

    /// QUERY_SRQ.
    pub fn query(&self) -> Result<QuerySrqResp> {
        self.pd.dev.inner.cmd(
            Opcode::QUERY_SRQ,
            &SrqHandleReq {
                srq_handle: self.handle,
            },
            &[],
        )
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let ok = self.pd.dev.inner.destroy(
            Opcode::DESTROY_SRQ,
            &SrqHandleReq {
                srq_handle: self.handle,
            },
            "DESTROY_SRQ",
        );
        if ok {
            // SAFETY: `mem` is dropped exactly once, here, and not used
            // afterwards.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        } else {
            // The device may still read the rings: leak them.
            let r = self.ring.get_mut().unwrap_or_else(PoisonError::into_inner);
            std::mem::forget(r.buf.take());
        }
    }
}
