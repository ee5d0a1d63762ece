//! CREATE_QP, MODIFY_QP, QUERY_QP, DESTROY_QP.

use virtio_rdma_abi::config::{F_ATOMIC, F_GSI, F_SRQ, F_UC, F_UD, F_XRC};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{QpDoorbell, DB_NONE};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::{access, qp_buffer_layout};
use virtio_rdma_abi::qp::attr::*;
use virtio_rdma_abi::qp::{Mtu, QpAttr, QpState, QpType, GSI_QKEY, MAX_GSI_DEPTH, QP_FLAG_SIG_ALL};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::mr::check_access;
use super::parse::{depth, destroy_error, field, fixed, shift_plausible, with_list};
use super::queue_mem::init_device_half;
use super::{quota, CmdError, CmdResult};
use crate::memory::volatile::{read_guest, write_guest};
use crate::resources::qp_state::rule;
use crate::resources::Qp;
use crate::rnic_objects::QpChange;
use crate::vm::VmState;

/// Packet sequence numbers and QP numbers are 24 bits.
const PSN_LIMIT: u32 = 1 << 24;

type M = ModifyQpReq;

impl VmState {
    pub(super) fn create_qp<Mem: GuestMemoryBackend>(
        &mut self,
        mem: &Mem,
        payload: &[u8],
    ) -> CmdResult {
        type R = CreateQpReq;
        let (req, list) = with_list::<R>(payload)?;
        if req.qp_type == QpType::XRC_TGT as u32 && self.has(F_XRC) {
            // No PD, CQs or rings: its own command shape (spec 12.12).
            return self.create_tgt_qp(&req, list);
        }
        let ctx = self.pd_ctx::<R>(req.pd_handle)?;
        let qp_type =
            QpType::from_u32(req.qp_type).ok_or_else(|| field::<R>(Status::INVALID, "qp_type"))?;
        let gsi = qp_type == QpType::GSI;
        // XRC_INI: a send queue only.
        let ini = qp_type == QpType::XRC_INI;
        if (gsi && !self.has(F_GSI))
            || (qp_type == QpType::UD && !self.has(F_UD))
            || (qp_type == QpType::UC && !self.has(F_UC))
            || (qp_type.xrc() && !(self.has(F_XRC) && self.has(F_SRQ)))
        {
            return Err(field::<R>(Status::UNSUPPORTED, "qp_type"));
        }
        if req.xrcd_handle != 0 {
            return Err(field::<R>(Status::INVALID, "xrcd_handle"));
        }
        if ini {
            let unused = [
                (req.recv_cq, "recv_cq"),
                (req.srq_handle, "srq_handle"),
                (req.rq_depth, "rq_depth"),
                (req.max_recv_sge, "max_recv_sge"),
            ];
            if let Some((_, name)) = unused.into_iter().find(|(v, _)| *v != 0) {
                return Err(field::<R>(Status::INVALID, name));
            }
        }
        // One GSI QP per device instance: QP 1 (spec 18.26).
        if gsi && self.res.gsi_qp().is_some() {
            return Err(field::<R>(Status::BUSY, "qp_type"));
        }
        let cqs: &[&str] = if ini {
            &["send_cq"]
        } else {
            &["send_cq", "recv_cq"]
        };
        for &name in cqs {
            let h = if name == "send_cq" {
                req.send_cq
            } else {
                req.recv_cq
            };
            let cq = self
                .res
                .cqs
                .get(h)
                .ok_or_else(|| field::<R>(Status::BAD_HANDLE, name))?;
            if cq.ctx != ctx {
                return Err(field::<R>(Status::MISMATCH, name));
            }
        }
        if req.srq_handle != 0 {
            if gsi {
                // MADs arrive on the GSI QP's own receive queue.
                return Err(field::<R>(Status::INVALID, "srq_handle"));
            }
            if !self.has(F_SRQ) {
                return Err(field::<R>(Status::UNSUPPORTED, "srq_handle"));
            }
            let srq = self
                .res
                .srqs
                .get(req.srq_handle)
                .ok_or_else(|| field::<R>(Status::BAD_HANDLE, "srq_handle"))?;
            if srq.pd != req.pd_handle {
                return Err(field::<R>(Status::MISMATCH, "srq_handle"));
            }
            // An XRC SRQ takes the messages of XRC_TGT QPs only.
            if srq.xrc.is_some() {
                return Err(field::<R>(Status::INVALID, "srq_handle"));
            }
        }
        if req.flags & !QP_FLAG_SIG_ALL != 0 {
            return Err(field::<R>(Status::INVALID, "flags"));
        }
        if self.res.qps.len() >= self.limits.max_qp as usize {
            return Err(CmdError::new(Status::QUOTA, quota::QP));
        }
        let l = self.limits;
        let max_depth = if gsi {
            l.max_qp_wr.min(MAX_GSI_DEPTH)
        } else {
            l.max_qp_wr
        };
        depth::<R>(req.sq_depth, max_depth, "sq_depth")?;
        if req.srq_handle != 0 {
            if req.rq_depth != 0 {
                return Err(field::<R>(Status::INVALID, "rq_depth"));
            }
        } else if !ini {
            depth::<R>(req.rq_depth, max_depth, "rq_depth")?;
        }
        // max_send_sge 0 is allowed: a QP that posts only inline or
        // zero-SGE WQEs (spec 12.12); its stride holds the header and the
        // inline slots (11.3).
        if req.max_recv_sge == 0 && req.srq_handle == 0 && !ini {
            return Err(field::<R>(Status::INVALID, "max_recv_sge"));
        }
        if req.max_send_sge > l.max_send_sge {
            return Err(field::<R>(Status::RANGE, "max_send_sge"));
        }
        if req.max_recv_sge > l.max_recv_sge {
            return Err(field::<R>(Status::RANGE, "max_recv_sge"));
        }
        if req.max_inline_data > l.max_inline_data {
            return Err(field::<R>(Status::RANGE, "max_inline_data"));
        }
        if !shift_plausible(req.buf.page_shift) {
            // Checked before the layout, which depends on the page size.
            return Err(field::<R>(Status::INVALID, "buf.page_shift"));
        }
        let layout = qp_buffer_layout(
            req.sq_depth,
            req.rq_depth,
            req.max_send_sge,
            req.max_recv_sge,
            req.max_inline_data,
            req.buf.page_shift,
        );
        let rq_offset =
            u32::try_from(layout.rq_offset).map_err(|_| field::<R>(Status::RANGE, "sq_depth"))?;
        let ring = self.queue_memory::<R, Mem>(mem, &req.buf, list, layout.total, req.db_gpa)?;
        let qp = Qp {
            pd: req.pd_handle,
            ctx,
            qp_type,
            send_cq: req.send_cq,
            recv_cq: req.recv_cq,
            srq: req.srq_handle,
            xrcd: 0,
            flags: req.flags,
            qpn: 0,
            incarnation: 0,
            sq_depth: req.sq_depth,
            rq_depth: req.rq_depth,
            max_send_sge: req.max_send_sge,
            max_recv_sge: req.max_recv_sge,
            max_inline_data: req.max_inline_data,
            layout,
            db_gpa: req.db_gpa,
            db_slot: None,
            ring,
            state: QpState::RESET,
            attr: QpAttr::default(),
            rt: Default::default(),
        };
        // The RNIC gives it its number.
        let (qp_handle, qpn) = self.res.insert_qp(qp, self.rnic.as_ref())?;
        let db_slot = self.alloc_db_slot(ctx);
        if let Some(qp) = self.res.qps.get_mut(qp_handle) {
            qp.db_slot = db_slot.clone();
        }
        init_device_half(mem, req.db_gpa);
        Ok(CreateQpResp {
            qp_handle,
            qpn,
            sq_wqe_shift: layout.sq_wqe_shift,
            rq_wqe_shift: layout.rq_wqe_shift,
            rq_offset,
            db_slot: db_slot.as_ref().map_or(DB_NONE, |s| s.at().slot),
        }
        .to_bytes())
    }

    /// Checks the attributes of a QP of type `qp_type` in a loaded device
    /// state (spec 20.3) as `MODIFY_QP` checks them: every attribute that
    /// is not 0 (0 is what an attribute never given holds, and every value
    /// out of range is not 0).
    pub(crate) fn check_loaded_attr(&self, qp_type: QpType, a: &QpAttr) -> Result<(), String> {
        let av = a.av;
        let given = [
            (ACCESS, a.access),
            (PKEY_INDEX, a.pkey_index),
            (PORT, a.port),
            (QKEY, a.qkey),
            (PATH_MTU, a.path_mtu),
            (TIMEOUT, a.timeout),
            (RETRY_CNT, a.retry_cnt),
            (RNR_RETRY, a.rnr_retry),
            (RQ_PSN, a.rq_psn),
            (MAX_RD_ATOMIC, a.max_rd_atomic),
            (MIN_RNR_TIMER, a.min_rnr_timer),
            (SQ_PSN, a.sq_psn),
            (MAX_DEST_RD_ATOMIC, a.max_dest_rd_atomic),
            (DEST_QPN, a.dest_qpn),
            (EN_SQD_ASYNC_NOTIFY, a.en_sqd_async_notify),
        ];
        let mut mask = given
            .iter()
            .filter(|(_, v)| *v != 0)
            .fold(0, |m, (bit, _)| m | bit);
        if av != virtio_rdma_abi::qp::AddressVector::default() {
            mask |= AV;
        }
        // Only the GSI QP's Q_Key is checked against one value; a GSI QP
        // not yet given one holds 0.
        if qp_type == QpType::GSI && a.qkey == 0 {
            mask &= !QKEY;
        }
        self.check_attr_values(qp_type, mask, a).map_err(|e| {
            format!(
                "a QP's attributes: status {:?}, detail {}",
                e.status, e.detail
            )
        })
    }

    /// Checks the value of every attribute present in `mask` for a QP of
    /// type `qp_type`.
    fn check_attr_values(&self, qp_type: QpType, mask: u32, a: &QpAttr) -> Result<(), CmdError> {
        let bad = |status: Status, name: &str| field::<M>(status, &format!("attr.{name}"));
        let has = |bit: u32| mask & bit != 0;
        if has(ACCESS) {
            // LOCAL_WRITE is accepted (verbs software passes it, perftest
            // among them) and means nothing for a QP: local writes are
            // governed by the MRs. It is stored and reported back by
            // QUERY_QP like the rest (spec 10.5).
            check_access::<M>(a.access, access::ALL, self.has(F_ATOMIC), "attr.access")?;
        }
        if has(PKEY_INDEX) && a.pkey_index != 0 {
            return Err(bad(Status::RANGE, "pkey_index"));
        }
        if has(PORT) && a.port != PORT_NUM {
            return Err(bad(Status::RANGE, "port"));
        }
        // The GSI QP has the GSI's Q_Key and no other (spec 18.26).
        if has(QKEY) && qp_type == QpType::GSI && a.qkey != GSI_QKEY {
            return Err(bad(Status::INVALID, "qkey"));
        }
        if has(AV) {
            self.check_av::<M>(&a.av, "attr.av")?;
        }
        if has(PATH_MTU) {
            let mtu = Mtu::from_u32(a.path_mtu).ok_or_else(|| bad(Status::INVALID, "path_mtu"))?;
            if mtu as u32 > self.rnic.caps().max_mtu {
                return Err(bad(Status::RANGE, "path_mtu"));
            }
        }
        let small = [
            (TIMEOUT, a.timeout, 31, "timeout"),
            (RETRY_CNT, a.retry_cnt, 7, "retry_cnt"),
            (RNR_RETRY, a.rnr_retry, 7, "rnr_retry"),
            (MIN_RNR_TIMER, a.min_rnr_timer, 31, "min_rnr_timer"),
            (RQ_PSN, a.rq_psn, PSN_LIMIT - 1, "rq_psn"),
            (SQ_PSN, a.sq_psn, PSN_LIMIT - 1, "sq_psn"),
            (DEST_QPN, a.dest_qpn, PSN_LIMIT - 1, "dest_qpn"),
            (
                EN_SQD_ASYNC_NOTIFY,
                a.en_sqd_async_notify,
                1,
                "en_sqd_async_notify",
            ),
        ];
        for (bit, value, max, name) in small {
            if has(bit) && value > max {
                return Err(bad(Status::INVALID, name));
            }
        }
        if has(MAX_RD_ATOMIC) && a.max_rd_atomic > self.limits.max_qp_rd_atom {
            return Err(bad(Status::RANGE, "max_rd_atomic"));
        }
        if has(MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > self.limits.max_qp_rd_atom {
            return Err(bad(Status::RANGE, "max_dest_rd_atomic"));
        }
        Ok(())
    }

    pub(super) fn modify_qp<G: GuestMemoryBackend>(
        &mut self,
        mem: &G,
        payload: &[u8],
    ) -> CmdResult {
        let req: M = fixed(payload)?;
        let mask = req.attr_mask;
        let mut a = req.attr;
        let (cur, qp_type) = self
            .res
            .qps
            .get(req.qp_handle)
            .map(|qp| (qp.state, qp.qp_type))
            .ok_or_else(|| field::<M>(Status::BAD_HANDLE, "qp_handle"))?;
        if mask & !ALL != 0 {
            return Err(CmdError::new(Status::INVALID, mask & !ALL));
        }
        let target = if mask & STATE != 0 {
            QpState::from_u32(a.qp_state)
                .ok_or_else(|| field::<M>(Status::INVALID, "attr.qp_state"))?
        } else {
            cur
        };
        if mask & CUR_STATE != 0 {
            let claimed = QpState::from_u32(a.cur_qp_state)
                .ok_or_else(|| field::<M>(Status::INVALID, "attr.cur_qp_state"))?;
            if claimed != cur {
                return Err(CmdError::new(Status::BAD_STATE, cur.into()));
            }
        }
        let r = rule(qp_type, cur, target)
            .ok_or_else(|| CmdError::new(Status::BAD_STATE, cur.into()))?;
        let given = mask & !STATE;
        let missing = r.required & !given;
        let extra = given & !(r.required | r.optional);
        if missing | extra != 0 {
            return Err(CmdError::new(Status::INVALID, missing | extra));
        }
        self.check_attr_values(qp_type, mask, &a)?;
        if mask & QKEY != 0 && qp_type != QpType::GSI {
            // A policy, after the other checks (spec 12.13): no QP but the
            // GSI QP (whose Q_Key is checked above) has a privileged one.
            self.privileged_qkey(a.qkey)?;
        }
        if qp_type.connected() && mask & (AV | DEST_QPN) != 0 {
            // The tenant policy, after every other check (spec 12.13): the
            // destination the QP will have once the command is applied.
            let Some(qp) = self.res.qps.get(req.qp_handle) else {
                return Err(field::<M>(Status::BAD_HANDLE, "qp_handle"));
            };
            let dgid = if mask & AV != 0 {
                a.av.dgid
            } else {
                qp.attr.av.dgid
            };
            let dest = if mask & DEST_QPN != 0 {
                a.dest_qpn
            } else {
                qp.attr.dest_qpn
            };
            self.allowed_route(&dgid, dest)?;
        }
        if mask & AV != 0 {
            self.fabric_av(&mut a.av)?;
        }

        // All checks passed. The attributes after the command; the host
        // half of the QP follows first, so that a refusal leaves the QP as
        // it was.
        let Some(qp) = self.res.qps.get(req.qp_handle) else {
            return Err(field::<M>(Status::BAD_HANDLE, "qp_handle"));
        };
        let mut attr = qp.attr;
        if target == QpState::RESET {
            attr = QpAttr::default();
        } else {
            apply(&mut attr, mask, &a);
        }
        // A new RC or UC destination (another QPN or GID) is bound to the
        // QP that has that number now, if any (spec 18.23).
        let new_dest = qp_type.connected()
            && target != QpState::RESET
            && (mask & DEST_QPN != 0 || (mask & AV != 0 && attr.av.dgid != qp.attr.av.dgid));
        let bound = new_dest.then(|| self.dest_incarnation(&attr.av.dgid, attr.dest_qpn));
        self.rnic.modify_qp(&QpChange {
            qpn: qp.qpn,
            from: cur,
            to: target,
            attr: &attr,
            mask,
        })?;

        // Apply atomically.
        let Some(qp) = self.res.qps.get_mut(req.qp_handle) else {
            return Err(field::<M>(Status::BAD_HANDLE, "qp_handle"));
        };
        // An XRC_TGT QP has no rings (nor a doorbell record to publish to).
        let tgt = qp.qp_type == QpType::XRC_TGT;
        if !tgt && (target == QpState::RESET) != (cur == QpState::RESET) {
            // Entering and leaving RESET empty the rings at the driver's
            // producer indices (spec 18.22): here, in the command, not
            // whenever the engine next looks — work posted in RESET must
            // never survive into INIT.
            empty_rings(qp, mem);
        }
        qp.attr = attr;
        if target == QpState::RESET {
            // A message executed in pieces is abandoned with the queues,
            // as sender and as receiver.
            qp.rt.partial = None;
            qp.rt.inbound = None;
            // So is the connection.
            qp.rt.dest_incarnation = None;
            qp.rt.dest_gone = false;
            qp.rt.peer = None;
        }
        if let Some(bound) = bound {
            qp.rt.dest_incarnation = bound;
            qp.rt.peer = None;
        }
        if target == QpState::RTR && cur != QpState::RTR {
            // A new stay in RTR: its first accepted message queues
            // QP_COMM_EST again (spec 18.22).
            qp.rt.comm_est = false;
        }
        if target != cur {
            // Posted work may now start, be flushed or be discarded. A QP
            // entering RTS with nothing posted needs no engine: a later
            // post kicks a sleeping engine or is seen by a polling one
            // (waking it for every QP a driver connects would cost a look
            // at every QP each time).
            let wake = match target {
                _ if tgt => false,
                QpState::RTS => {
                    cur == QpState::SQD
                        || ring_pi(qp, mem, 0, QpDoorbell::SQ_PI) != Some(qp.rt.sq_ci)
                }
                QpState::ERR | QpState::RESET | QpState::SQD => true,
                _ => cur == QpState::SQD,
            };
            self.engine_work |= wake;
        }
        qp.state = target;
        qp.attr.qp_state = target.into();
        qp.attr.cur_qp_state = target.into();
        if target != QpState::SQD {
            // A drain still owed is void once the QP leaves SQD.
            qp.rt.drain_owed = false;
        } else if cur != QpState::SQD && qp.attr.en_sqd_async_notify == 1 {
            // Work in flight completes first; the engine queues the event
            // then (spec 13.3).
            if qp.rt.in_flight() {
                qp.rt.drain_owed = true;
            } else {
                self.events.push(EventKind::QP_SQ_DRAINED, req.qp_handle, 0);
            }
        }
        if target == QpState::ERR && cur != QpState::ERR {
            self.last_wqe_reached(req.qp_handle);
        }
        Ok(Vec::new())
    }

    pub(super) fn query_qp(&mut self, payload: &[u8]) -> CmdResult {
        let req: QpHandleReq = fixed(payload)?;
        let qp = self
            .res
            .qps
            .get(req.qp_handle)
            .ok_or_else(|| field::<QpHandleReq>(Status::BAD_HANDLE, "qp_handle"))?;
        let mut attr = qp.attr;
        attr.qp_state = qp.state.into();
        attr.cur_qp_state = qp.state.into();
        attr.sq_draining = u32::from(qp.state == QpState::SQD && qp.rt.in_flight());
        Ok(QueryQpResp {
            attr,
            qp_type: qp.qp_type.into(),
            qpn: qp.qpn,
            sq_depth: qp.sq_depth,
            rq_depth: qp.rq_depth,
            max_send_sge: qp.max_send_sge,
            max_recv_sge: qp.max_recv_sge,
            max_inline_data: qp.max_inline_data,
            srq_handle: qp.srq,
        }
        .to_bytes())
    }

    pub(super) fn destroy_qp(&mut self, payload: &[u8]) -> CmdResult {
        let req: QpHandleReq = fixed(payload)?;
        self.res
            .destroy_qp(req.qp_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<QpHandleReq>(e, "qp_handle"))?;
        Ok(Vec::new())
    }
}

/// Copies the attributes named in `mask` from `src` into `dst`.
fn apply(dst: &mut QpAttr, mask: u32, src: &QpAttr) {
    let has = |bit: u32| mask & bit != 0;
    if has(ACCESS) {
        dst.access = src.access;
    }
    if has(PKEY_INDEX) {
        dst.pkey_index = src.pkey_index;
    }
    if has(PORT) {
        dst.port = src.port;
    }
    if has(QKEY) {
        dst.qkey = src.qkey;
    }
    if has(AV) {
        dst.av = src.av;
    }
    if has(PATH_MTU) {
        dst.path_mtu = src.path_mtu;
    }
    if has(TIMEOUT) {
        dst.timeout = src.timeout;
    }
    if has(RETRY_CNT) {
        dst.retry_cnt = src.retry_cnt;
    }
    if has(RNR_RETRY) {
        dst.rnr_retry = src.rnr_retry;
    }
    if has(MIN_RNR_TIMER) {
        dst.min_rnr_timer = src.min_rnr_timer;
    }
    if has(RQ_PSN) {
        dst.rq_psn = src.rq_psn;
    }
    if has(SQ_PSN) {
        dst.sq_psn = src.sq_psn;
    }
    if has(DEST_QPN) {
        dst.dest_qpn = src.dest_qpn;
    }
    if has(MAX_RD_ATOMIC) {
        dst.max_rd_atomic = src.max_rd_atomic;
    }
    if has(MAX_DEST_RD_ATOMIC) {
        dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    }
    if has(EN_SQD_ASYNC_NOTIFY) {
        dst.en_sqd_async_notify = src.en_sqd_async_notify;
    }
}

/// Sets QP `qp`'s consumer indices to its producer indices (its own
/// receive queue's too, not an SRQ's) and publishes them in the device
/// half of its doorbell record (spec 18.22). A record out of RAM leaves
/// the index as it was (the engine fails such a QP when it needs it).
/// The producer index in word `word` of the QP's doorbell slot, or at byte
/// `field` of its record.
pub(super) fn ring_pi<G: GuestMemoryBackend>(
    qp: &Qp,
    mem: &G,
    word: u32,
    field: u64,
) -> Option<u32> {
    if let Some(slot) = &qp.db_slot {
        return Some(slot.load(word));
    }
    let at = qp.db_gpa.checked_add(field)?;
    let mut b = [0u8; 4];
    read_guest(mem, GuestAddress(at), &mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn empty_rings<G: GuestMemoryBackend>(qp: &mut Qp, mem: &G) {
    /// Stores consumer index `ci` at byte `field` of the QP's record.
    fn publish<G: GuestMemoryBackend>(qp: &Qp, mem: &G, field: u64, ci: u32) {
        if let Some(at) = qp.db_gpa.checked_add(field) {
            let _ = write_guest(mem, GuestAddress(at), &ci.to_le_bytes());
        }
    }
    if let Some(p) = ring_pi(qp, mem, 0, QpDoorbell::SQ_PI) {
        qp.rt.sq_ci = p;
        publish(qp, mem, QpDoorbell::SQ_CI, p);
    }
    if qp.srq == 0 {
        if let Some(p) = ring_pi(qp, mem, 1, QpDoorbell::RQ_PI) {
            qp.rt.rq_ci = p;
            publish(qp, mem, QpDoorbell::RQ_CI, p);
        }
    }
    qp.rt.wait = None;
}
