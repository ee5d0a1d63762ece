//! Queue pairs: creation, state changes, posting.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, PoisonError};

use virtio_rdma_abi::config::{F_ATOMIC, F_GSI, F_MCAST, F_MEM_MGT, F_MW, F_UC, F_UD, F_XRC};
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::datapath::SendWqe;
use virtio_rdma_abi::mem::qp_buffer_layout;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType, GSI_QKEY, QP_FLAG_SIG_ALL};
use virtio_rdma_abi::verbs::{
    CreateQpReq, CreateQpResp, McastReq, ModifyQpReq, QpHandleReq, QueryQpResp,
};
use virtio_rdma_abi::{Field, Wire};

use crate::cq::Cq;
use crate::device::{outcome_unknown, PORT};
use crate::doorbell::off;
use crate::error::{Error, Result};
use crate::image::QpImage;
use crate::page_list;
use crate::pd::Pd;
use crate::qp_attr::{QpAttrs, RcConnect};
use crate::ring::{post_encoded, Producer, QueueMem, RingGeometry, WqRegs};
use crate::srq::Srq;
use crate::wr::{encode_recv_at, encode_send_into, RecvWr, SendLimits, SendWr};

const SQ_REGS: WqRegs = WqRegs {
    pi: off::QP_SQ_PI,
    ci: off::QP_SQ_CI,
    slot_half: 0,
};
const RQ_REGS: WqRegs = WqRegs {
    pi: off::QP_RQ_PI,
    ci: off::QP_RQ_CI,
    slot_half: 1,
};

/// Queue sizes of a QP. Depths are rounded up to powers of two; the
/// created QP reports the actual values ([`Qp::cap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WQE; 0 for a QP that posts only inline or zero-length
    /// work requests (spec 12.12).
    pub max_send_sge: u32,
    /// SGEs per receive WQE (at least 1 without an SRQ).
    pub max_recv_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// Creation parameters of a QP.
#[derive(Debug, Clone)]
pub struct QpInit {
    /// RC, UD or GSI.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: Arc<Cq>,
    /// CQ for receive completions (may be the same).
    pub recv_cq: Arc<Cq>,
    /// SRQ to receive from, instead of an own receive queue.
    pub srq: Option<Arc<Srq>>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WQE produces a completion (`QP_FLAG_SIG_ALL`).
    pub sig_all: bool,
}

impl QpInit {
    /// An RC QP with default sizes on one CQ.
    pub fn rc(cq: &Arc<Cq>) -> Self {
        QpInit {
            qp_type: QpType::RC,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sig_all: false,
        }
    }

    /// A UC QP (needs `F_UC`) with default sizes on one CQ.
    pub fn uc(cq: &Arc<Cq>) -> Self {
        QpInit {
            qp_type: QpType::UC,
            ..Self::rc(cq)
        }
    }

    /// A UD QP with default sizes on one CQ.
    pub fn ud(cq: &Arc<Cq>) -> Self {
        QpInit {
            qp_type: QpType::UD,
            ..Self::rc(cq)
        }
    }

    /// An XRC initiator QP (needs `F_XRC`) with default sizes, completing
    /// its sends on `cq`: a send queue only (`recv_cq` is not used).
    pub fn xrc_ini(cq: &Arc<Cq>) -> Self {
        QpInit {
            qp_type: QpType::XRC_INI,
            ..Self::rc(cq)
        }
    }

    /// The GSI QP (QP 1, needs `F_GSI`; one per device instance) with
    /// default sizes on one CQ: a UD QP for MADs (spec 18.26).
    pub fn gsi(cq: &Arc<Cq>) -> Self {
        QpInit {
            qp_type: QpType::GSI,
            ..Self::rc(cq)
        }
    }
}

/// A send queue's indices and its context's device flags
/// ([`Qp::send_queue_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendQueueState {
    /// The driver's producer index (WQEs posted).
    pub posted: u32,
    /// The device's consumer index (WQEs it has taken).
    pub taken: u32,
    /// The context's device flags (`DB_FLAG_KICK`, `DB_FLAG_POLLING`).
    pub ctx_flags: u32,
}

/// A queue pair (`CREATE_QP`), destroyed on drop.
///
/// Ownership: the QP holds `Arc`s of its PD, CQs and SRQ, so they are
/// destroyed after it. Posting takes an internal lock per work queue; a QP
/// may be shared between threads.
#[derive(Debug)]
pub struct Qp {
    // Field order is drop order after DESTROY_QP: SRQ, CQs, then the PD
    // (the order DESTROY_CTX uses).
    srq: Option<Arc<Srq>>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    pd: Arc<Pd>,
    handle: u32,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq: RingGeometry,
    rq: Option<RingGeometry>,
    mem: ManuallyDrop<QueueMem>,
    sq_prod: Mutex<Producer>,
    rq_prod: Mutex<Producer>,
    state: Mutex<QpState>,
    destroyed: bool,
}

fn depth_of(what: &str, n: u32, max: u32) -> Result<u32> {
    n.max(1)
        .checked_next_power_of_two()
        .filter(|d| *d <= max)
        .ok_or_else(|| Error::InvalidArgument(format!("{what} of {n} (device maximum {max})")))
}

impl Qp {
    /// Creates a QP in `pd` (state RESET).
    pub fn create(pd: &Arc<Pd>, init: &QpInit) -> Result<Qp> {
        let inner = &pd.dev.inner;
        let cfg = &inner.config;
        if init.qp_type == QpType::UD {
            inner.require(F_UD)?;
        }
        if init.qp_type == QpType::GSI {
            inner.require(F_GSI)?;
        }
        if init.qp_type == QpType::UC {
            inner.require(F_UC)?;
        }
        // An XRC initiator has no receive queue.
        let ini = init.qp_type == QpType::XRC_INI;
        if ini {
            inner.require(F_XRC)?;
            if init.srq.is_some() {
                return Err(Error::InvalidArgument(
                    "an XRC_INI QP receives nothing".into(),
                ));
            }
        }
        for cq in [&init.send_cq, &init.recv_cq] {
            if !Arc::ptr_eq(&cq.device().inner, &pd.dev.inner) {
                return Err(Error::Mismatch("the CQ belongs to another device handle"));
            }
        }
        if let Some(srq) = &init.srq {
            if !Arc::ptr_eq(srq.pd(), pd) {
                return Err(Error::Mismatch("the SRQ belongs to another PD"));
            }
        }
        let sq_depth = depth_of("send queue", init.cap.max_send_wr, cfg.max_qp_wr)?;
        let (rq_depth, max_recv_sge) = match &init.srq {
            _ if ini => (0, 0),
            Some(_) => (0, init.cap.max_recv_sge),
            None => (
                depth_of("receive queue", init.cap.max_recv_wr, cfg.max_qp_wr)?,
                init.cap.max_recv_sge.max(1),
            ),
        };
        let cap = QpCap {
            max_send_wr: sq_depth,
            max_recv_wr: rq_depth,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        let t = &*inner.transport;
        let shift = t.dma_page_shift();
        let layout = qp_buffer_layout(
            sq_depth,
            rq_depth,
            cap.max_send_sge,
            cap.max_recv_sge,
            cap.max_inline_data,
            shift,
        );
        let bytes = usize::try_from(layout.total)
            .map_err(|_| Error::InvalidArgument("QP buffer too large".into()))?;
        let flags = inner.ctx_flags()?;
        let mem = QueueMem::alloc(t, bytes)?;
        let list = page_list::build(
            t,
            mem.pages(),
            shift,
            0,
            cfg.max_inline_pages,
            CreateQpReq::SIZE,
        )?;
        let req = CreateQpReq {
            pd_handle: pd.handle,
            qp_type: init.qp_type.into(),
            send_cq: init.send_cq.handle(),
            recv_cq: if ini { 0 } else { init.recv_cq.handle() },
            srq_handle: init.srq.as_ref().map_or(0, |s| s.handle()),
            flags: if init.sig_all { QP_FLAG_SIG_ALL } else { 0 },
            sq_depth,
            rq_depth,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
            xrcd_handle: 0,
            db_gpa: mem.db.gpa(),
            buf: list.desc,
        };
        let r: CreateQpResp = match inner.cmd(Opcode::CREATE_QP, &req, &list.tail) {
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
        let sq = RingGeometry {
            base: 0,
            shift: r.sq_wqe_shift,
            depth: sq_depth,
        };
        let rq = (rq_depth > 0).then_some(RingGeometry {
            base: r.rq_offset as usize,
            shift: r.rq_wqe_shift,
            depth: rq_depth,
        });
        let qp = Qp {
            pd: pd.clone(),
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.clone(),
            handle: r.qp_handle,
            qpn: r.qpn,
            qp_type: init.qp_type,
            cap,
            sq,
            rq,
            mem: ManuallyDrop::new({
                mem.slot = slot.as_ref().ok().cloned().flatten();
                mem.flags = Some(flags);
                mem
            }),
            sq_prod: Mutex::new(Producer::default()),
            rq_prod: Mutex::new(Producer::default()),
            state: Mutex::new(QpState::RESET),
            destroyed: false,
        };
        // The device's geometry must be the one the buffer was laid out for
        // (spec 11.3/11.4); otherwise the rings would not fit. Dropping `qp`
        // destroys it.
        // A slot the driver cannot use: dropping `qp` destroys it.
        let _ = slot?;
        let expect_rq = if rq_depth > 0 { layout.rq_offset } else { 0 };
        if r.sq_wqe_shift != layout.sq_wqe_shift
            || (rq_depth > 0 && r.rq_wqe_shift != layout.rq_wqe_shift)
            || u64::from(r.rq_offset) != expect_rq
            || !qp.sq.fits(bytes)
            || qp.rq.is_some_and(|rq| !rq.fits(bytes))
        {
            return Err(Error::BadResponse {
                opcode: Opcode::CREATE_QP,
                reason: format!(
                    "geometry sq_shift {} rq_shift {} rq_offset {}, expected {:?}",
                    r.sq_wqe_shift, r.rq_wqe_shift, r.rq_offset, layout
                ),
            });
        }
        Ok(qp)
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The QP number (for peers' `dest_qpn` / UD `remote_qpn`).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// RC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The actual queue sizes.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<Cq> {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<Cq> {
        &self.recv_cq
    }

    /// The SRQ, if the QP receives from one.
    pub fn srq(&self) -> Option<&Arc<Srq>> {
        self.srq.as_ref()
    }

    /// The state after the last successful [`Qp::modify`] (the device may
    /// have moved the QP to ERR since; [`Qp::query`] tells).
    pub fn state(&self) -> QpState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// MODIFY_QP with typed attributes.
    pub fn modify(&self, attrs: &QpAttrs) -> Result<()> {
        let (attr_mask, attr) = attrs.to_wire();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.pd.dev.inner.cmd_unit(
            Opcode::MODIFY_QP,
            &ModifyQpReq {
                qp_handle: self.handle,
                attr_mask,
                attr,
            },
        )?;
        if let Some(s) = attrs.state {
            *state = s;
            if s == QpState::RESET {
                self.rings_reset();
            }
        }
        Ok(())
    }

    /// After a transition to RESET the rings are empty: restart the
    /// producer indices at the device's consumer indices.
    fn rings_reset(&self) {
        for (prod, regs) in [(&self.sq_prod, SQ_REGS), (&self.rq_prod, RQ_REGS)] {
            let mut p = prod.lock().unwrap_or_else(PoisonError::into_inner);
            let ci = self.mem.db.load(regs.ci);
            p.pi = ci;
            p.ci = ci;
            self.mem.store_pi(regs, ci);
        }
    }

    /// The QP's image ([`crate::image`]); none for a QP with a doorbell
    /// slot or an SRQ.
    pub fn image(&self) -> Result<QpImage> {
        if self.mem.slot.is_some() {
            return Err(Error::Unsupported("an image of a QP with a doorbell slot"));
        }
        if self.srq.is_some() {
            return Err(Error::Unsupported("an image of a QP on an SRQ"));
        }
        let indices = |p: &Mutex<Producer>| {
            let p = p.lock().unwrap_or_else(PoisonError::into_inner);
            (p.pi, p.ci)
        };
        let ring = |r: &RingGeometry| (r.base, r.shift, r.depth);
        Ok(QpImage {
            handle: self.handle,
            qpn: self.qpn,
            qp_type: self.qp_type.into(),
            state: self.state().into(),
            cap: [
                self.cap.max_send_wr,
                self.cap.max_recv_wr,
                self.cap.max_send_sge,
                self.cap.max_recv_sge,
                self.cap.max_inline_data,
            ],
            sq: ring(&self.sq),
            rq: self.rq.as_ref().map(ring),
            sq_pi_ci: indices(&self.sq_prod),
            rq_pi_ci: indices(&self.rq_prod),
            buf: self.mem.buf.image(),
            npages: self.mem.npages,
            db: self.mem.db.image(),
        })
    }

    /// The QP of `image` in `pd` on `send_cq` and `recv_cq` (restored
    /// before it, over the same guest RAM): nothing is sent.
    pub fn restore(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        image: &QpImage,
    ) -> Result<Qp> {
        let inner = &pd.dev.inner;
        for cq in [send_cq, recv_cq] {
            if !Arc::ptr_eq(&cq.device().inner, inner) {
                return Err(Error::Mismatch("the CQ belongs to another device handle"));
            }
        }
        let bad = |what: String| Error::InvalidArgument(format!("a QP image with {what}"));
        let qp_type = QpType::from_u32(image.qp_type)
            .ok_or_else(|| bad(format!("type {}", image.qp_type)))?;
        let state =
            QpState::from_u32(image.state).ok_or_else(|| bad(format!("state {}", image.state)))?;
        let ring = |(base, shift, depth): (usize, u32, u32)| RingGeometry { base, shift, depth };
        let sq = ring(image.sq);
        let rq = image.rq.map(ring);
        let mut mem = QueueMem::adopt(&*inner.transport, &image.buf, &image.db, image.npages)?;
        let len = mem.buf.len();
        if !sq.fits(len) || rq.is_some_and(|r| !r.fits(len)) {
            return Err(bad(format!("rings outside its {len}-byte buffer")));
        }
        mem.flags = Some(inner.ctx_flags()?);
        let [max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data] = image.cap;
        let producer = |(pi, ci): (u32, u32)| {
            let mut p = Producer::default();
            (p.pi, p.ci) = (pi, ci);
            Mutex::new(p)
        };
        Ok(Qp {
            srq: None,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            pd: pd.clone(),
            handle: image.handle,
            qpn: image.qpn,
            qp_type,
            cap: QpCap {
                max_send_wr,
                max_recv_wr,
                max_send_sge,
                max_recv_sge,
                max_inline_data,
            },
            sq,
            rq,
            mem: ManuallyDrop::new(mem),
            sq_prod: producer(image.sq_pi_ci),
            rq_prod: producer(image.rq_pi_ci),
            state: Mutex::new(state),
            destroyed: false,
        })
    }

    /// The QP's doorbell slot in the shared-memory doorbell mode;
    /// `None`: its doorbell record in guest RAM is used.
    pub fn doorbell_slot(&self) -> Option<u32> {
        self.mem.slot.as_ref().map(|s| s.index())
    }

    /// RC: RESET → INIT with remote `access` flags.
    pub fn rc_to_init(&self, access: u32) -> Result<()> {
        self.modify(&init_attrs(access))
    }

    /// RC: INIT → RTR towards the peer in `c`.
    pub fn rc_to_rtr(&self, c: &RcConnect) -> Result<()> {
        self.modify(&rtr_attrs(c, self.pd.dev.gid_index()))
    }

    /// RC: RTR → RTS with the send parameters of `c`.
    pub fn rc_to_rts(&self, c: &RcConnect) -> Result<()> {
        self.modify(&rts_attrs(c))
    }

    /// RC: RESET → INIT → RTR → RTS in one go. From RESET or INIT (as the
    /// last modify left it) the three MODIFY_QP are made available together
    /// and answered with one wait: the device executes them in order (spec
    /// 7.2), and each transition is allowed only from the state the one
    /// before it reaches (spec 13.2; the device can only have moved the QP
    /// to ERR meanwhile, from which none is), so the outcome is that of one
    /// modify after the other, except that the transitions after a failed
    /// one are sent and fail too. Returns the first failure.
    pub fn rc_connect(&self, access: u32, c: &RcConnect) -> Result<()> {
        let steps = [
            init_attrs(access),
            rtr_attrs(c, self.pd.dev.gid_index()),
            rts_attrs(c),
        ];
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*state, QpState::RESET | QpState::INIT) {
            // From RTR, say, the RTS step alone could succeed.
            drop(state);
            return steps.iter().try_for_each(|a| self.modify(a));
        }
        let reqs = steps.each_ref().map(|a| {
            let (attr_mask, attr) = a.to_wire();
            ModifyQpReq {
                qp_handle: self.handle,
                attr_mask,
                attr,
            }
            .to_bytes()
        });
        let parts = reqs.each_ref().map(|r| [r.as_slice()]);
        let results = self
            .pd
            .dev
            .inner
            .execute_all(parts.each_ref().map(|p| (Opcode::MODIFY_QP, &p[..], 0)));
        for (a, r) in steps.iter().zip(results) {
            r?;
            if let Some(s) = a.state {
                *state = s;
            }
        }
        Ok(())
    }

    /// UC: RESET → INIT → RTR → RTS towards the peer in `c`, with RC's
    /// connection attributes but none of its reliability ones (spec 13.2).
    pub fn uc_connect(&self, access: u32, c: &RcConnect) -> Result<()> {
        let rtr = QpAttrs {
            max_dest_rd_atomic: None,
            min_rnr_timer: None,
            ..rtr_attrs(c, self.pd.dev.gid_index())
        };
        let rts = QpAttrs {
            state: Some(QpState::RTS),
            sq_psn: Some(c.sq_psn),
            ..QpAttrs::default()
        };
        [init_attrs(access), rtr, rts]
            .iter()
            .try_for_each(|a| self.modify(a))
    }

    /// XRC_INI: RESET → INIT → RTR → RTS towards XRC_TGT QP `c.dest_qpn`,
    /// with RC's connection attributes less a responder's (spec 13.2).
    pub fn xrc_ini_connect(&self, c: &RcConnect) -> Result<()> {
        let rtr = QpAttrs {
            max_dest_rd_atomic: None,
            min_rnr_timer: None,
            ..rtr_attrs(c, self.pd.dev.gid_index())
        };
        [init_attrs(0), rtr, rts_attrs(c)]
            .iter()
            .try_for_each(|a| self.modify(a))
    }

    /// Attaches this UD QP to multicast group `mgid` (`F_MCAST`, spec
    /// 12.27): it receives the group's messages from then on.
    pub fn attach_mcast(&self, mgid: [u8; 16]) -> Result<()> {
        self.mcast(Opcode::ATTACH_MCAST, mgid)
    }

    /// Detaches this UD QP from multicast group `mgid`.
    pub fn detach_mcast(&self, mgid: [u8; 16]) -> Result<()> {
        self.mcast(Opcode::DETACH_MCAST, mgid)
    }

    fn mcast(&self, op: Opcode, mgid: [u8; 16]) -> Result<()> {
        self.pd.dev.inner.require(F_MCAST)?;
        self.pd.dev.inner.cmd_unit(
            op,
            &McastReq {
                qp_handle: self.handle,
                reserved: 0,
                mgid,
            },
        )
    }

    /// UD: RESET → INIT with `qkey`.
    pub fn ud_to_init(&self, qkey: u32) -> Result<()> {
        self.modify(&QpAttrs {
            state: Some(QpState::INIT),
            pkey_index: Some(0),
            port: Some(PORT),
            qkey: Some(qkey),
            ..QpAttrs::default()
        })
    }

    /// UD: INIT → RTR.
    pub fn ud_to_rtr(&self) -> Result<()> {
        self.modify(&QpAttrs::state(QpState::RTR))
    }

    /// UD: RTR → RTS with first send PSN `sq_psn`.
    pub fn ud_to_rts(&self, sq_psn: u32) -> Result<()> {
        self.modify(&QpAttrs {
            state: Some(QpState::RTS),
            sq_psn: Some(sq_psn),
            ..QpAttrs::default()
        })
    }

    /// UD: RESET → INIT → RTR → RTS in one go.
    pub fn ud_activate(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        self.ud_to_init(qkey)?;
        self.ud_to_rtr()?;
        self.ud_to_rts(sq_psn)
    }

    /// GSI: RESET → INIT → RTR → RTS with the GSI's Q_Key, the one it
    /// may have (spec 18.26).
    pub fn gsi_activate(&self) -> Result<()> {
        self.ud_activate(GSI_QKEY, 0)
    }

    /// Any state → ERR (outstanding work completes with flush errors).
    pub fn to_error(&self) -> Result<()> {
        self.modify(&QpAttrs::state(QpState::ERR))
    }

    /// Any state → RESET (attributes cleared, rings emptied).
    pub fn to_reset(&self) -> Result<()> {
        self.modify(&QpAttrs::state(QpState::RESET))
    }

    /// The send queue as the rings show it, for diagnostics (a work
    /// request that never completes: did the device take it?).
    pub fn send_queue_state(&self) -> SendQueueState {
        let pi = self
            .sq_prod
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pi;
        SendQueueState {
            posted: pi,
            taken: self.mem.db.load(off::QP_SQ_CI),
            ctx_flags: self
                .mem
                .flags
                .as_ref()
                .map_or(0, |f| f.word().load(std::sync::atomic::Ordering::Acquire)),
        }
    }

    /// QUERY_QP.
    pub fn query(&self) -> Result<QueryQpResp> {
        self.pd.dev.inner.cmd(
            Opcode::QUERY_QP,
            &QpHandleReq {
                qp_handle: self.handle,
            },
            &[],
        )
    }

    /// Posts send work requests: all of them or, on any error, none. Each
    /// WQE is written into its slot, then the new `sq_pi` is stored
    /// (release) and notifyq is notified if the device asked for a kick.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_send_to(0, wrs)
    }

    /// [`Qp::post_send`] on an XRC_INI QP: the messages go to XRC SRQ
    /// `remote_srqn` at the target QP the QP is connected to.
    pub fn post_send_xrc(&self, remote_srqn: u32, wrs: &[SendWr<'_>]) -> Result<()> {
        if self.qp_type != QpType::XRC_INI {
            return Err(Error::InvalidArgument(
                "an SRQ number is for XRC_INI QPs".into(),
            ));
        }
        self.post_send_to(remote_srqn, wrs)
    }

    fn post_send_to(&self, xrc_srqn: u32, wrs: &[SendWr<'_>]) -> Result<()> {
        self.refuse_in_reset("post_send")?;
        let srqn_at = SendWqe::LAYOUT
            .iter()
            .find(|f| f.name == "xrc_srqn")
            .map_or(0, |f| f.offset);
        let lim = SendLimits {
            qp_type: self.qp_type,
            pd_handle: self.pd.handle,
            max_send_sge: self.cap.max_send_sge,
            max_inline_data: self.cap.max_inline_data,
            stride: self.sq.stride(),
            atomics: self.pd.dev.inner.has(F_ATOMIC),
            mem_mgt: self.pd.dev.inner.has(F_MEM_MGT),
            windows: self.pd.dev.inner.has(F_MW),
        };
        post_encoded(
            &*self.pd.dev.inner.transport,
            &self.mem,
            &self.sq,
            SQ_REGS,
            &self.sq_prod,
            wrs.len(),
            |index, out| {
                // Built only on failure: a post allocates nothing.
                let wr = wrs.get(index).ok_or_else(|| Error::InvalidWr {
                    index,
                    reason: "no such work request".into(),
                })?;
                let base = out.len();
                encode_send_into(wr, &lim, out)
                    .map_err(|reason| Error::InvalidWr { index, reason })?;
                // Local operations have their own layout and no SRQ.
                let at = base + srqn_at;
                if xrc_srqn != 0 && !wr.op.is_local() {
                    if let Some(f) = out.get_mut(at..at + 4) {
                        f.copy_from_slice(&xrc_srqn.to_le_bytes());
                    }
                }
                Ok(())
            },
        )
        .map(drop)
    }

    /// Posts receive work requests to the QP's own receive queue (all or
    /// none). QPs with an SRQ post to the SRQ instead.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.refuse_in_reset("post_recv")?;
        let rq = self
            .rq
            .ok_or_else(|| Error::InvalidArgument("the QP receives from an SRQ".into()))?;
        let max_sge = self.cap.max_recv_sge;
        post_encoded(
            &*self.pd.dev.inner.transport,
            &self.mem,
            &rq,
            RQ_REGS,
            &self.rq_prod,
            wrs.len(),
            |index, out| encode_recv_at(wrs, index, max_sge, rq.stride(), out),
        )
        .map(drop)
    }

    /// The device ignores WQEs posted in `RESET` and discards them when the
    /// QP leaves it (spec 18.22), so posting then is refused here instead of
    /// losing work silently (as verbs providers refuse it).
    fn refuse_in_reset(&self, what: &str) -> Result<()> {
        if self.state() == QpState::RESET {
            return Err(Error::InvalidArgument(format!(
                "{what} on QP {:#x} in RESET: move it to INIT first",
                self.qpn
            )));
        }
        Ok(())
    }

    /// Destroys the QP, reporting failure (dropping does the same but can
    /// only log). On failure the ring memory is leaked, not freed.
    pub fn destroy(mut self) -> Result<()> {
        self.destroyed = true;
        let r = self.pd.dev.inner.cmd_unit(
            Opcode::DESTROY_QP,
            &QpHandleReq {
                qp_handle: self.handle,
            },
        );
        if r.is_ok() {
            // SAFETY: `destroyed` keeps `Drop` from touching `mem` again;
            // it is dropped exactly once, here.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        }
        r
    }

    /// The queue memory (tests inspect it).
    #[cfg(test)]
    pub(crate) fn mem(&self) -> &QueueMem {
        &self.mem
    }

    /// The send ring geometry (tests).
    #[cfg(test)]
    pub(crate) fn sq_geometry(&self) -> RingGeometry {
        self.sq
    }

    /// The receive ring geometry (tests).
    #[cfg(test)]
    pub(crate) fn rq_geometry(&self) -> Option<RingGeometry> {
        self.rq
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        let ok = self.pd.dev.inner.destroy(
            Opcode::DESTROY_QP,
            &QpHandleReq {
                qp_handle: self.handle,
            },
            "DESTROY_QP",
        );
        if ok {
            // SAFETY: `mem` is dropped exactly once, here (`destroyed` is
            // false, so `destroy` did not drop it), and not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        }
    }
}

/// RC: RESET → INIT with the remote rights `access`.
pub(crate) fn init_attrs(access: u32) -> QpAttrs {
    QpAttrs {
        state: Some(QpState::INIT),
        pkey_index: Some(0),
        port: Some(PORT),
        access: Some(access),
        ..QpAttrs::default()
    }
}

/// RC: INIT → RTR towards the peer in `c`.
pub(crate) fn rtr_attrs(c: &RcConnect, own_gid_index: u8) -> QpAttrs {
    let av = AddressVector {
        sgid_index: c.sgid_index.unwrap_or(own_gid_index),
        ..c.av
    };
    QpAttrs {
        state: Some(QpState::RTR),
        av: Some(av),
        path_mtu: Some(c.path_mtu),
        dest_qpn: Some(c.dest_qpn),
        rq_psn: Some(c.rq_psn),
        max_dest_rd_atomic: Some(c.max_dest_rd_atomic),
        min_rnr_timer: Some(c.min_rnr_timer),
        ..QpAttrs::default()
    }
}

/// RC: RTR → RTS with the send parameters of `c`.
fn rts_attrs(c: &RcConnect) -> QpAttrs {
    QpAttrs {
        state: Some(QpState::RTS),
        sq_psn: Some(c.sq_psn),
        timeout: Some(c.timeout),
        retry_cnt: Some(c.retry_cnt),
        rnr_retry: Some(c.rnr_retry),
        max_rd_atomic: Some(c.max_rd_atomic),
        ..QpAttrs::default()
    }
}
