//! XRC domains and the XRC halves of SRQs and QPs (`F_XRC`, spec 12.28,
//! 18.11.8): an XRC SRQ belongs to a domain and has a number, unique on its
//! RNIC, that XRC_INI senders name; an XRC_TGT QP belongs to a domain and
//! takes a message into the SRQ of its domain the message names.

use virtio_rdma_abi::qp::QpType;

use super::objects::{Qp, XrcSrq, Xrcd};
use super::{dec, inc, InsertError, VmResources};
use crate::rnic_objects::{RnicError, RnicObjects};

/// Why an XRC SRQ number does not lead to an SRQ a TGT QP may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XrcMiss {
    /// No XRC SRQ of the VM has that number.
    Unknown,
    /// The SRQ is in another domain than the QP.
    OtherDomain,
}

/// The receive side of responder QP `q` (its PD, receive CQ and SRQ, or
/// 0 for none): an XRC_TGT QP's is that of the XRC SRQ the message it takes
/// now names ([`VmResources::bind_xrc_srq`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvSide {
    /// The PD of the receive buffers and of remote keys.
    pub pd: u32,
    /// The CQ of receive completions.
    pub cq: u32,
    /// The SRQ, or 0 for the QP's own receive queue.
    pub srq: u32,
}

impl VmResources {
    /// Opens an XRC domain of context `ctx`.
    pub fn insert_xrcd(&mut self, ctx: u32) -> Result<u32, InsertError> {
        self.insert_charged(|r| &mut r.xrcds, Xrcd { ctx, users: 0 })
    }

    /// Closes an XRC domain unless SRQs or QPs are in it.
    pub fn close_xrcd(&mut self, handle: u32) -> Result<(), super::DestroyError> {
        let x = self
            .xrcds
            .get(handle)
            .ok_or(super::DestroyError::BadHandle)?;
        if x.users > 0 {
            return Err(super::DestroyError::Busy(x.users));
        }
        if let Some(x) = self.xrcds.remove(handle) {
            self.refund(&x);
        }
        Ok(())
    }

    /// Makes SRQ `h` (just inserted) an XRC SRQ of domain `xrcd` completing
    /// on `cq`: the RNIC gives it its number. Returns the number.
    pub fn make_xrc_srq(
        &mut self,
        h: u32,
        xrcd: u32,
        cq: u32,
        t: &dyn RnicObjects,
    ) -> Result<u32, RnicError> {
        let srqn = t.alloc_srqn(self.owner(h))?;
        if let Some(srq) = self.srqs.get_mut(h) {
            srq.xrc = Some(XrcSrq { xrcd, cq, srqn });
        }
        self.srqns.insert(srqn, h);
        if let Some(x) = self.xrcds.get_mut(xrcd) {
            inc(&mut x.users);
        }
        if let Some(c) = self.cqs.get_mut(cq) {
            inc(&mut c.users);
        }
        Ok(srqn)
    }

    /// Drops the references of destroyed XRC SRQ `x`; its number returns to
    /// the RNIC.
    pub(super) fn unmake_xrc_srq(&mut self, x: XrcSrq, t: &dyn RnicObjects) {
        self.srqns.remove(&x.srqn);
        t.free_srqn(x.srqn);
        if let Some(d) = self.xrcds.get_mut(x.xrcd) {
            dec(&mut d.users);
        }
        if let Some(c) = self.cqs.get_mut(x.cq) {
            dec(&mut c.users);
        }
    }

    /// Counts a new XRC_TGT QP `h` in its domain.
    pub(super) fn join_domain(&mut self, h: u32) {
        let Some(x) = self
            .qps
            .get(h)
            .filter(|q| q.qp_type == QpType::XRC_TGT)
            .map(|q| q.xrcd)
        else {
            return;
        };
        if let Some(d) = self.xrcds.get_mut(x) {
            inc(&mut d.users);
        }
    }

    /// Forgets destroyed QP `qp` in its domain, if it is an XRC_TGT QP.
    pub(super) fn leave_domain(&mut self, qp: &Qp) {
        if qp.qp_type != QpType::XRC_TGT {
            return;
        }
        if let Some(d) = self.xrcds.get_mut(qp.xrcd) {
            dec(&mut d.users);
        }
    }

    /// The XRC SRQ numbered `srqn` if XRC_TGT QP `qp` may take a message
    /// into it (same domain): it becomes the QP's receive side for that
    /// message.
    pub fn bind_xrc_srq(&mut self, qp: u32, srqn: u32) -> Result<u32, XrcMiss> {
        let h = *self.srqns.get(&srqn).ok_or(XrcMiss::Unknown)?;
        let domain = self
            .srqs
            .get(h)
            .and_then(|s| s.xrc)
            .map(|x| x.xrcd)
            .ok_or(XrcMiss::Unknown)?;
        let q = self.qps.get_mut(qp).ok_or(XrcMiss::Unknown)?;
        if q.qp_type != QpType::XRC_TGT || q.xrcd != domain {
            return Err(XrcMiss::OtherDomain);
        }
        q.rt.xrc_srq = h;
        Ok(h)
    }

    /// The receive side of responder QP `q` ([`RecvSide`]).
    pub fn recv_side(&self, q: &Qp) -> RecvSide {
        if q.qp_type != QpType::XRC_TGT {
            return RecvSide {
                pd: q.pd,
                cq: q.recv_cq,
                srq: q.srq,
            };
        }
        let bound = self
            .srqs
            .get(q.rt.xrc_srq)
            .and_then(|s| s.xrc.filter(|x| x.xrcd == q.xrcd).map(|x| (s.pd, x.cq)));
        match bound {
            Some((pd, cq)) => RecvSide {
                pd,
                cq,
                srq: q.rt.xrc_srq,
            },
            // None bound: nothing to receive into, no key valid.
            None => RecvSide {
                pd: 0,
                cq: 0,
                srq: 0,
            },
        }
    }

    /// The XRC domains of context `ctx`, and for each the XRC SRQs and
    /// XRC_TGT QPs in it (of any context): what destroying the context
    /// takes with it.
    pub(super) fn xrc_of_ctx(&self, ctx: u32) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let domains: Vec<u32> = super::collect(&self.xrcds, |x| x.ctx == ctx);
        let qps = super::collect(&self.qps, |q| {
            q.qp_type == QpType::XRC_TGT && domains.contains(&q.xrcd)
        });
        let srqs = super::collect(&self.srqs, |s| {
            s.xrc.is_some_and(|x| domains.contains(&x.xrcd))
        });
        (domains, qps, srqs)
    }
}
