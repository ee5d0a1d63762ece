//! Protection domains.

use std::sync::Arc;

use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::verbs::{CtxHandleReq, PdHandleReq, PdHandleResp};

use crate::device::Device;
use crate::error::Result;

/// A protection domain (`ALLOC_PD`), freed (`DEALLOC_PD`) when the last
/// reference is dropped. MRs, QPs, AHs and SRQs hold an `Arc<Pd>`, so the PD
/// outlives them.
#[derive(Debug)]
pub struct Pd {
    pub(crate) dev: Device,
    pub(crate) handle: u32,
}

impl Pd {
    /// Allocates a protection domain in the device's context.
    pub fn alloc(dev: &Device) -> Result<Arc<Pd>> {
        let r: PdHandleResp = dev.inner.cmd(
            Opcode::ALLOC_PD,
            &CtxHandleReq {
                ctx_handle: dev.inner.ctx,
            },
            &[],
        )?;
        Ok(Arc::new(Pd {
            dev: dev.clone(),
            handle: r.pd_handle,
        }))
    }

    /// The device handle of the PD.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The device the PD belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        self.dev.inner.destroy(
            Opcode::DEALLOC_PD,
            &PdHandleReq {
                pd_handle: self.handle,
            },
            "DEALLOC_PD",
        );
    }
}
