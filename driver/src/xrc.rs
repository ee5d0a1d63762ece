//! XRC (`F_XRC`): domains and target QPs. XRC SRQs are [`crate::Srq`]s
//! ([`crate::Srq::create_xrc`]); initiator QPs are [`crate::Qp`]s of type
//! XRC_INI ([`crate::QpInit::xrc_ini`]).

use std::sync::Arc;

use virtio_rdma_abi::config::F_XRC;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::mem::BufferDesc;
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::{
    CreateQpReq, CreateQpResp, CtxHandleReq, ModifyQpReq, QpHandleReq, QueryQpResp, XrcdHandle,
};

use crate::device::Device;
use crate::error::Result;
use crate::qp::{init_attrs, rtr_attrs};
use crate::qp_attr::{QpAttrs, RcConnect};

/// An XRC domain (`OPEN_XRCD`), closed (`CLOSE_XRCD`) when the last
/// reference is dropped. XRC SRQs and target QPs hold an `Arc<Xrcd>`.
#[derive(Debug)]
pub struct Xrcd {
    dev: Device,
    handle: u32,
}

impl Xrcd {
    /// Opens an XRC domain in the device's context.
    pub fn open(dev: &Device) -> Result<Arc<Xrcd>> {
        dev.inner.require(F_XRC)?;
        let r: XrcdHandle = dev.inner.cmd(
            Opcode::OPEN_XRCD,
            &CtxHandleReq {
                ctx_handle: dev.inner.ctx,
            },
            &[],
        )?;
        Ok(Arc::new(Xrcd {
            dev: dev.clone(),
            handle: r.xrcd_handle,
        }))
    }

    /// The device handle of the domain.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

impl Drop for Xrcd {
    fn drop(&mut self) {
        self.dev.inner.destroy(
            Opcode::CLOSE_XRCD,
            &XrcdHandle {
                xrcd_handle: self.handle,
            },
            "CLOSE_XRCD",
        );
    }
}

/// An XRC target QP (`CREATE_QP` of type XRC_TGT): no rings; a message an
/// XRC_INI QP connected to it sends lands in the XRC SRQ of its domain the
/// message names, and completes on that SRQ's CQ. Destroyed on drop.
#[derive(Debug)]
pub struct XrcTgt {
    xrcd: Arc<Xrcd>,
    handle: u32,
    qpn: u32,
}

impl XrcTgt {
    /// Creates a target QP in domain `xrcd` (state RESET).
    pub fn create(xrcd: &Arc<Xrcd>) -> Result<XrcTgt> {
        let req = CreateQpReq {
            qp_type: QpType::XRC_TGT.into(),
            xrcd_handle: xrcd.handle,
            buf: BufferDesc::default(),
            ..CreateQpReq::default()
        };
        let r: CreateQpResp = xrcd.dev.inner.cmd(Opcode::CREATE_QP, &req, &[])?;
        Ok(XrcTgt {
            xrcd: xrcd.clone(),
            handle: r.qp_handle,
            qpn: r.qpn,
        })
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The QP number (an initiator's `dest_qpn`).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// MODIFY_QP with typed attributes.
    pub fn modify(&self, attrs: &QpAttrs) -> Result<()> {
        let (attr_mask, attr) = attrs.to_wire();
        self.xrcd.dev.inner.cmd_unit(
            Opcode::MODIFY_QP,
            &ModifyQpReq {
                qp_handle: self.handle,
                attr_mask,
                attr,
            },
        )
    }

    /// RESET → INIT → RTR → RTS towards initiator `c.dest_qpn`, with remote
    /// `access` for the messages it takes: a responder's attributes, and of
    /// a requester's only the PSN and timeout (spec 13.2).
    pub fn connect(&self, access: u32, c: &RcConnect) -> Result<()> {
        let rts = QpAttrs {
            state: Some(virtio_rdma_abi::qp::QpState::RTS),
            sq_psn: Some(c.sq_psn),
            timeout: Some(c.timeout),
            ..QpAttrs::default()
        };
        [
            init_attrs(access),
            rtr_attrs(c, self.xrcd.dev.gid_index()),
            rts,
        ]
        .iter()
        .try_for_each(|a| self.modify(a))
    }

    /// QUERY_QP.
    pub fn query(&self) -> Result<QueryQpResp> {
        self.xrcd.dev.inner.cmd(
            Opcode::QUERY_QP,
            &QpHandleReq {
                qp_handle: self.handle,
            },
            &[],
        )
    }
}

impl Drop for XrcTgt {
    fn drop(&mut self) {
        self.xrcd.dev.inner.destroy(
            Opcode::DESTROY_QP,
            &QpHandleReq {
                qp_handle: self.handle,
            },
            "DESTROY_QP",
        );
    }
}
