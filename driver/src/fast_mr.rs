//! Fast-registration regions (`ALLOC_MR`, `F_MEM_MGT`, spec 12.22 and
//! 18.27) and the local DMA key (spec 18.28).
//!
//! A [`FastMr`] is registered and invalidated by work requests on a QP,
//! in the QP's order: [`FastMr::map`] writes the page array into the
//! region's own DMA page and returns the [`FastReg`] of a `REG_MR` work
//! request ([`crate::SendOp::RegMr`]) with the next consumer byte, as
//! Linux's `ib_map_mr_sg` and `ib_update_fast_reg_key` do; a
//! [`crate::SendOp::LocalInv`] of its key, or a peer's
//! [`crate::SendOp::SendWithInv`], makes it free again.

use std::sync::Arc;

use virtio_rdma_abi::config::F_MEM_MGT;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::datapath::Sge;
use virtio_rdma_abi::verbs::{AllocMrReq, MrHandleReq, RegMrResp};

use crate::device::Device;
use crate::dma::DmaBuf;
use crate::error::{Error, Result};
use crate::mr::MrPages;
use crate::pd::Pd;

/// Bytes of the page array of one registration: one 4 KiB page.
const ARRAY_BYTES: usize = 4096;

/// What a `REG_MR` work request registers (the fields of its `RegMrWqe`
/// but `wr_id` and `flags`). Built by [`FastMr::map`]; every field is
/// public so that a test can send any value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastReg {
    /// The region.
    pub mr_handle: u32,
    /// The new key: the region's bits 31 to 8, a new consumer byte.
    pub key: u32,
    /// Address of the region's first byte.
    pub iova: u64,
    /// Bytes registered.
    pub length: u64,
    /// Access flags ([`virtio_rdma_abi::mem::access`]).
    pub access: u32,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Entries of the page array.
    pub npages: u32,
    /// Guest-physical address of the page array.
    pub pages_gpa: u64,
}

/// A fast-registration region (`ALLOC_MR`), deregistered (`DEREG_MR`) on
/// drop (a failure is logged, and the page array kept allocated). It
/// starts free; its registrations are work requests.
#[derive(Debug)]
pub struct FastMr {
    pd: Arc<Pd>,
    handle: u32,
    key: u32,
    max_num_sg: u32,
    /// The page array of the next registration (the device reads it when
    /// it executes the `REG_MR` work request); leaked, not freed, if the
    /// region cannot be deregistered.
    array: Option<DmaBuf>,
}

impl FastMr {
    /// Allocates a region for registrations of up to `max_num_sg` pages
    /// (at most `DeviceAttr.max_fast_reg_pages`).
    pub fn alloc(pd: &Arc<Pd>, max_num_sg: u32) -> Result<FastMr> {
        let dev = &pd.dev.inner;
        dev.require(F_MEM_MGT)?;
        // The array must lie in one 4 KiB page of guest RAM.
        let array = pd.dev.alloc_dma(ARRAY_BYTES, ARRAY_BYTES)?;
        if array.page_shift() < 12 || array.first_page_offset() != 0 {
            return Err(Error::InvalidArgument(
                "the transport's DMA memory is not page aligned".into(),
            ));
        }
        let r: RegMrResp = dev.cmd(
            Opcode::ALLOC_MR,
            &AllocMrReq {
                pd_handle: pd.handle,
                max_num_sg,
            },
            &[],
        )?;
        Ok(FastMr {
            pd: pd.clone(),
            handle: r.mr_handle,
            key: r.lkey,
            max_num_sg,
            array: Some(array),
        })
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Its key (lkey and rkey) as of the last [`FastMr::map`].
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Most pages of one registration.
    pub fn max_num_sg(&self) -> u32 {
        self.max_num_sg
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Guest-physical address of the region's page array.
    pub fn array_gpa(&self) -> u64 {
        self.array.as_ref().and_then(|a| a.gpa(0)).unwrap_or(0)
    }

    /// Prepares the registration of `pages` (guest-physical addresses of
    /// `2^page_shift`-byte pages) as `length` bytes from `iova`, whose
    /// offset in its page is its offset in the first page: writes the page
    /// array, moves the key to the next consumer byte and returns the
    /// `REG_MR` work request's [`FastReg`]. Post it before the array is
    /// written again (the device reads it when it executes the request).
    pub fn map(
        &mut self,
        pages: &[u64],
        page_shift: u32,
        iova: u64,
        length: u64,
        access: u32,
    ) -> Result<FastReg> {
        if pages.is_empty() || pages.len() > self.max_num_sg as usize {
            return Err(Error::InvalidArgument(format!(
                "{} pages for a region of {}",
                pages.len(),
                self.max_num_sg
            )));
        }
        let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.array
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("region destroyed".into()))?
            .write(0, &bytes)?;
        self.key = next_key(self.key);
        Ok(FastReg {
            mr_handle: self.handle,
            key: self.key,
            iova,
            length,
            access,
            page_shift,
            npages: pages.len() as u32,
            pages_gpa: self.array_gpa(),
        })
    }

    /// [`FastMr::map`] of `len` bytes at `offset` of `buf` (its pages and
    /// page size; `iova` the driver address of that byte).
    pub fn map_buf(
        &mut self,
        buf: &DmaBuf,
        offset: usize,
        len: usize,
        access: u32,
    ) -> Result<FastReg> {
        let spec = MrPages::of_buf(buf, offset, len)?;
        // The iova's offset in its page must be the data's (spec 18.27):
        // true of a driver address when the page size is the host's or
        // the buffer is page aligned; checked rather than assumed.
        let mask = (1u64 << spec.page_shift) - 1;
        if spec.iova & mask != u64::from(spec.first_page_offset) {
            return Err(Error::InvalidArgument(
                "the buffer's address and its pages are not aligned alike".into(),
            ));
        }
        self.map(spec.pages, spec.page_shift, spec.iova, spec.length, access)
    }

    /// An SGE for `len` bytes at `addr` (an address of the current
    /// registration) under the region's key.
    pub fn sge(&self, addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            length: len,
            lkey: self.key,
        }
    }
}

impl Drop for FastMr {
    fn drop(&mut self) {
        let ok = self.pd.dev.inner.destroy(
            Opcode::DEREG_MR,
            &MrHandleReq {
                mr_handle: self.handle,
            },
            "DEREG_MR",
        );
        if !ok {
            // The device may still read the array: keep it allocated.
            std::mem::forget(self.array.take());
        }
    }
}

/// `key` with the next consumer byte (Linux `ib_inc_rkey`).
pub fn next_key(key: u32) -> u32 {
    (key & !0xff) | (key.wrapping_add(1) & 0xff)
}

impl Device {
    /// The local DMA key (spec 18.28), with `F_MEM_MGT`: SGEs with it name
    /// guest-physical addresses, for local access only. `None` without
    /// the feature.
    pub fn local_dma_lkey(&self) -> Option<u32> {
        self.inner
            .has(F_MEM_MGT)
            .then_some(self.inner.attr.local_dma_lkey)
    }

    /// An SGE over `len` bytes of guest-physical memory at `gpa` through
    /// the local DMA key; `None` without `F_MEM_MGT`.
    pub fn dma_sge(&self, gpa: u64, len: u32) -> Option<Sge> {
        Some(Sge {
            addr: gpa,
            length: len,
            lkey: self.local_dma_lkey()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::next_key;

    #[test]
    fn the_consumer_byte_wraps_within_the_key() {
        assert_eq!(next_key(0x1234_5600), 0x1234_5601);
        assert_eq!(next_key(0x1234_56ff), 0x1234_5600);
        assert_eq!(next_key(0xffff_ffff), 0xffff_ff00);
    }
}
