//! Protection domains.

use std::sync::Arc;

use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::verbs::{CqHandleResp, CtxHandleReq, PdHandleReq, PdHandleResp};
use virtio_rdma_abi::{Field, Wire};

use crate::cq::{Cq, NewCq};
use crate::device::Device;
use crate::error::Result;
use crate::image::PdImage;

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

    /// [`Pd::alloc`] and [`Cq::create`]`(dev, cqe)` with one wait for
    /// both: the two commands are made available together (neither needs
    /// the other's handle), which saves a round trip with the device where
    /// an opening makes both, as most do. If either fails, the other is
    /// destroyed (dropped) and the first error in command order returned.
    pub fn alloc_with_cq(dev: &Device, cqe: u32) -> Result<(Arc<Pd>, Arc<Cq>)> {
        let new_cq = NewCq::prepare(dev, cqe)?;
        let pd_req = CtxHandleReq {
            ctx_handle: dev.inner.ctx,
        }
        .to_bytes();
        let [pd, cq] = dev.inner.execute_all([
            (Opcode::ALLOC_PD, &[&pd_req[..]], PdHandleResp::SIZE),
            (Opcode::CREATE_CQ, &new_cq.parts(), CqHandleResp::SIZE),
        ]);
        let pd = pd.map(|payload| {
            Arc::new(Pd {
                dev: dev.clone(),
                handle: PdHandleResp::read(&payload).pd_handle,
            })
        });
        let cq = new_cq.finish(dev, cq);
        Ok((pd?, cq?))
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

impl Pd {
    /// The PD's image ([`crate::image`]).
    pub fn image(&self) -> PdImage {
        PdImage {
            handle: self.handle,
        }
    }

    /// The PD of `image` on `dev` (restored from its image): nothing is
    /// sent.
    pub fn restore(dev: &Device, image: &PdImage) -> Arc<Pd> {
        Arc::new(Pd {
            dev: dev.clone(),
            handle: image.handle,
        })
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
