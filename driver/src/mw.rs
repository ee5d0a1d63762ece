//! Memory windows (`ALLOC_MW`, `DEALLOC_MW`, `F_MW`, spec 12.23, 12.24 and
//! 18.29).
//!
//! A [`Mw`] is bound by a work request on an RC QP, in the QP's order:
//! [`Mw::bind`] returns the [`MwBind`] of a `BIND_MW` work request
//! ([`crate::SendOp::BindMw`]) with the next consumer byte, as
//! `ibv_inc_rkey` does; a type 1 window is unbound by a bind of length 0,
//! a type 2 one invalidated by [`crate::SendOp::LocalInv`] or a peer's
//! [`crate::SendOp::SendWithInv`] of its key.

use std::sync::Arc;

use virtio_rdma_abi::config::F_MW;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::verbs::{AllocMwReq, AllocMwResp, MwHandleReq};

use crate::error::Result;
use crate::fast_mr::next_key;
use crate::pd::Pd;

/// What a `BIND_MW` work request binds (the fields of its `BindMwWqe` but
/// `wr_id` and `flags`). Built by [`Mw::bind`]; every field is public so
/// that a test can send any value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window.
    pub mw_handle: u32,
    /// The window's new key.
    pub new_rkey: u32,
    /// First byte of the window, in the MR's address space.
    pub addr: u64,
    /// Bytes; 0 unbinds a type 1 window.
    pub length: u64,
    /// The MR's lkey.
    pub mr_lkey: u32,
    /// Remote rights ([`virtio_rdma_abi::mem::access`] `REMOTE_*`).
    pub access: u32,
}

/// A memory window, deallocated (`DEALLOC_MW`) on drop (a failure is
/// logged).
#[derive(Debug)]
pub struct Mw {
    pd: Arc<Pd>,
    handle: u32,
    key: u32,
    mw_type: u32,
}

impl Mw {
    /// Allocates a window of `mw_type` (`MW_TYPE_1` or `MW_TYPE_2`), free.
    pub fn alloc(pd: &Arc<Pd>, mw_type: u32) -> Result<Mw> {
        let dev = &pd.dev.inner;
        dev.require(F_MW)?;
        let r: AllocMwResp = dev.cmd(
            Opcode::ALLOC_MW,
            &AllocMwReq {
                pd_handle: pd.handle,
                mw_type,
            },
            &[],
        )?;
        Ok(Mw {
            pd: pd.clone(),
            handle: r.mw_handle,
            key: r.rkey,
            mw_type,
        })
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Its key as of the last [`Mw::bind`].
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Its type.
    pub fn mw_type(&self) -> u32 {
        self.mw_type
    }

    /// The `BIND_MW` of `length` bytes at `addr` of the MR whose lkey is
    /// `mr_lkey`, granting `access`, under the next consumer byte, which
    /// becomes the window's key here (the device's once the work request
    /// succeeds).
    pub fn bind(&mut self, mr_lkey: u32, addr: u64, length: u64, access: u32) -> MwBind {
        self.key = next_key(self.key);
        MwBind {
            mw_handle: self.handle,
            new_rkey: self.key,
            addr,
            length,
            mr_lkey,
            access,
        }
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        self.pd.dev.inner.destroy(
            Opcode::DEALLOC_MW,
            &MwHandleReq {
                mw_handle: self.handle,
            },
            "DEALLOC_MW",
        );
    }
}
