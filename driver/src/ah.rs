//! Address handles (UD destinations).

use std::sync::Arc;

use virtio_rdma_abi::config::F_UD;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::{AhHandleReq, AhHandleResp, CreateAhReq};

use crate::device::PORT;
use crate::error::Result;
use crate::pd::Pd;

/// An address handle (`CREATE_AH`, needs `F_UD`), destroyed on drop.
#[derive(Debug)]
pub struct Ah {
    pd: Arc<Pd>,
    handle: u32,
    av: AddressVector,
}

impl Ah {
    /// Creates an address handle for `av` in `pd`.
    pub fn create(pd: &Arc<Pd>, av: &AddressVector) -> Result<Ah> {
        let dev = &pd.dev.inner;
        dev.require(F_UD)?;
        let r: AhHandleResp = dev.cmd(
            Opcode::CREATE_AH,
            &CreateAhReq {
                pd_handle: pd.handle,
                port: PORT,
                av: *av,
            },
            &[],
        )?;
        Ok(Ah {
            pd: pd.clone(),
            handle: r.ah_handle,
            av: *av,
        })
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Handle of the AH's protection domain.
    pub fn pd_handle(&self) -> u32 {
        self.pd.handle
    }

    /// The destination.
    pub fn av(&self) -> &AddressVector {
        &self.av
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        self.pd.dev.inner.destroy(
            Opcode::DESTROY_AH,
            &AhHandleReq {
                ah_handle: self.handle,
            },
            "DESTROY_AH",
        );
    }
}
