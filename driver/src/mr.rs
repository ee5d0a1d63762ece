//! Memory regions.

use std::sync::Arc;

use virtio_rdma_abi::config::F_RESIZE;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::datapath::Sge;
use virtio_rdma_abi::verbs::{
    MrHandleReq, RegMrReq, RegMrResp, ReregMrReq, REREG_ACCESS, REREG_PD,
};
use virtio_rdma_abi::Field;

use crate::device::outcome_unknown;
use crate::dma::DmaBuf;
use crate::error::{Error, Result};
use crate::image::MrImage;
use crate::page_list;
use crate::pd::Pd;

/// Guest memory given by its pages, for [`Mr::register_pages`].
#[derive(Debug, Clone, Copy)]
pub struct MrPages<'a> {
    /// Address work requests and peers use for the first byte.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Offset of the first byte in the first page.
    pub first_page_offset: u32,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Guest-physical page addresses, in order
    /// (`ceil((first_page_offset + length) / page_size)` of them).
    pub pages: &'a [u64],
}

impl<'a> MrPages<'a> {
    /// `len` bytes at `offset` of `buf`: its pages and page size, the
    /// `iova` the driver address of byte `offset`.
    pub fn of_buf(buf: &'a DmaBuf, offset: usize, len: usize) -> Result<MrPages<'a>> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(Error::InvalidArgument(format!(
                "range {offset}+{len} of a {}-byte buffer",
                buf.len()
            )));
        }
        let shift = buf.page_shift();
        let abs = u64::from(buf.first_page_offset()) + offset as u64;
        let first = (abs >> shift) as usize;
        let fpo = (abs & ((1u64 << shift) - 1)) as u32;
        let npages = (u64::from(fpo) + len as u64).div_ceil(1u64 << shift) as usize;
        let pages = buf
            .pages()
            .get(first..first + npages)
            .ok_or_else(|| Error::InvalidArgument("DMA buffer page list too short".into()))?;
        Ok(MrPages {
            iova: buf.as_ptr() as u64 + offset as u64,
            length: len as u64,
            first_page_offset: fpo,
            page_shift: shift,
            pages,
        })
    }
}

/// A registered memory region (`REG_MR`), deregistered (`DEREG_MR`) on drop.
///
/// A region registered from a [`DmaBuf`] keeps an `Arc` of it, so the
/// memory stays allocated while the device may access it; if deregistration
/// fails the memory is leaked rather than freed.
#[derive(Debug)]
pub struct Mr {
    pd: Arc<Pd>,
    handle: u32,
    lkey: u32,
    rkey: u32,
    iova: u64,
    length: u64,
    access: u32,
    buf: Option<Arc<DmaBuf>>,
    destroyed: bool,
}

impl Mr {
    /// Registers the whole of `buf` with `access` flags
    /// ([`virtio_rdma_abi::mem::access`]); its `iova` is the driver address of
    /// the buffer.
    pub fn register(pd: &Arc<Pd>, buf: Arc<DmaBuf>, access: u32) -> Result<Mr> {
        let len = buf.len();
        Self::register_range(pd, buf, 0, len, access)
    }

    /// Registers `len` bytes of `buf` from `offset`; the `iova` is the
    /// driver address of byte `offset`.
    pub fn register_range(
        pd: &Arc<Pd>,
        buf: Arc<DmaBuf>,
        offset: usize,
        len: usize,
        access: u32,
    ) -> Result<Mr> {
        let spec = MrPages::of_buf(&buf, offset, len)?;
        let (iova, length) = (spec.iova, spec.length);
        let (handle, r) = Self::reg(pd, &spec, access)?;
        Ok(Mr {
            pd: pd.clone(),
            handle,
            lkey: r.lkey,
            rkey: r.rkey,
            iova,
            length,
            access,
            buf: Some(buf),
            destroyed: false,
        })
    }

    /// Registers memory given by its guest-physical pages.
    ///
    /// # Safety
    ///
    /// The device may write these pages (when `access` allows it) until the
    /// region is dropped: the caller keeps them allocated for that long and
    /// must not rely on Rust references to them staying unchanged.
    pub unsafe fn register_pages(pd: &Arc<Pd>, spec: &MrPages<'_>, access: u32) -> Result<Mr> {
        let (handle, r) = Self::reg(pd, spec, access)?;
        Ok(Mr {
            pd: pd.clone(),
            handle,
            lkey: r.lkey,
            rkey: r.rkey,
            iova: spec.iova,
            length: spec.length,
            access,
            buf: None,
            destroyed: false,
        })
    }

    fn reg(pd: &Arc<Pd>, spec: &MrPages<'_>, access: u32) -> Result<(u32, RegMrResp)> {
        let dev = &pd.dev.inner;
        let list = page_list::build(
            &*dev.transport,
            spec.pages,
            spec.page_shift,
            spec.first_page_offset,
            dev.config.max_inline_pages,
            RegMrReq::SIZE,
        )?;
        let req = RegMrReq {
            pd_handle: pd.handle,
            access,
            iova: spec.iova,
            length: spec.length,
            buf: list.desc,
        };
        match dev.cmd::<RegMrResp>(Opcode::REG_MR, &req, &list.tail) {
            Ok(r) => Ok((r.mr_handle, r)),
            Err(e) => {
                if outcome_unknown(&e) {
                    // The device may still read the list pages.
                    std::mem::forget(list);
                }
                Err(e)
            }
        }
    }

    /// `REREG_MR` (needs `F_RESIZE`): `flags` (`REREG_*`) say which of
    /// `pd`, `access` and the pages of `buf` (the whole buffer) change. The
    /// keys stay; an rkey appears when remote access is first granted.
    pub fn rereg(
        &mut self,
        flags: u32,
        pd: Option<&Arc<Pd>>,
        access: u32,
        buf: Option<Arc<DmaBuf>>,
    ) -> Result<()> {
        let dev = &self.pd.dev.inner;
        dev.require(F_RESIZE)?;
        let spec = buf
            .as_ref()
            .map(|b| MrPages::of_buf(b, 0, b.len()))
            .transpose()?;
        let list = match &spec {
            Some(spec) => Some(page_list::build(
                &*dev.transport,
                spec.pages,
                spec.page_shift,
                spec.first_page_offset,
                dev.config.max_inline_pages,
                ReregMrReq::SIZE,
            )?),
            None => None,
        };
        let req = ReregMrReq {
            mr_handle: self.handle,
            flags,
            pd_handle: pd.map_or(0, |p| p.handle),
            access,
            iova: spec.as_ref().map_or(0, |s| s.iova),
            length: spec.as_ref().map_or(0, |s| s.length),
            buf: list.as_ref().map(|l| l.desc).unwrap_or_default(),
        };
        let range = spec.as_ref().map(|s| (s.iova, s.length));
        let tail = list.as_ref().map_or(&[][..], |l| &l.tail[..]);
        let r = match dev.cmd::<RegMrResp>(Opcode::REREG_MR, &req, tail) {
            Ok(r) => r,
            Err(e) => {
                if outcome_unknown(&e) {
                    // The device may use the new pages: keep them.
                    std::mem::forget((list, buf));
                }
                return Err(e);
            }
        };
        (self.lkey, self.rkey) = (r.lkey, r.rkey);
        if flags & REREG_PD != 0 {
            if let Some(pd) = pd {
                self.pd = pd.clone();
            }
        }
        if flags & REREG_ACCESS != 0 {
            self.access = access;
        }
        if let (Some((iova, length)), Some(b)) = (range, buf) {
            (self.iova, self.length) = (iova, length);
            self.buf = Some(b);
        }
        Ok(())
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Local key (for SGEs of local work requests).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key (0 when no remote access was granted).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Address of the first byte in work requests.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Access flags it was registered with.
    pub fn access(&self) -> u32 {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The DMA buffer it was registered from, if any.
    pub fn buf(&self) -> Option<&Arc<DmaBuf>> {
        self.buf.as_ref()
    }

    /// An SGE for `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: u64, len: u32) -> Result<Sge> {
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|end| end > self.length)
        {
            return Err(Error::InvalidArgument(format!(
                "SGE {offset}+{len} outside an MR of {} bytes",
                self.length
            )));
        }
        Ok(Sge {
            addr: self.iova + offset,
            length: len,
            lkey: self.lkey,
        })
    }

    /// Deregisters the region, reporting failure (dropping does the same
    /// but can only log).
    pub fn destroy(mut self) -> Result<()> {
        self.destroyed = true;
        let r = self.pd.dev.inner.cmd_unit(
            Opcode::DEREG_MR,
            &MrHandleReq {
                mr_handle: self.handle,
            },
        );
        if r.is_err() {
            std::mem::forget(self.buf.take());
        }
        r
    }
}

impl Mr {
    /// The region's image ([`crate::image`]); the buffer it was registered
    /// over has its own ([`DmaBuf::image`]).
    pub fn image(&self) -> MrImage {
        MrImage {
            handle: self.handle,
            lkey: self.lkey,
            rkey: self.rkey,
            iova: self.iova,
            length: self.length,
            access: self.access,
        }
    }

    /// The region of `image` in `pd`, over `buf` (restored before it; the
    /// region keeps it) or over pages its owner keeps allocated: nothing
    /// is sent.
    pub fn restore(pd: &Arc<Pd>, buf: Option<Arc<DmaBuf>>, image: &MrImage) -> Result<Mr> {
        if let Some(b) = &buf {
            if (b.len() as u64) < image.length {
                return Err(Error::InvalidArgument(format!(
                    "a region image of {} bytes over a {}-byte buffer",
                    image.length,
                    b.len()
                )));
            }
        }
        Ok(Mr {
            pd: pd.clone(),
            handle: image.handle,
            lkey: image.lkey,
            rkey: image.rkey,
            iova: image.iova,
            length: image.length,
            access: image.access,
            buf,
            destroyed: false,
        })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        let ok = self.pd.dev.inner.destroy(
            Opcode::DEREG_MR,
            &MrHandleReq {
                mr_handle: self.handle,
            },
            "DEREG_MR",
        );
        if !ok {
            // The device may still access the pages: keep them allocated.
            std::mem::forget(self.buf.take());
        }
    }
}
