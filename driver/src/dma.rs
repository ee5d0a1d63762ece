//! [`DmaBuf`]: a checked handle on a transport's [`DmaRegion`].
//!
//! Memory the device also accesses is never turned into Rust references:
//! bytes are copied in and out with volatile accesses, and indices and flags
//! shared with the device are accessed as atomics.

use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU8};

use crate::error::{Error, Result};
use crate::image::RegionImage;
use crate::transport::{DmaRegion, Transport};

/// DMA memory: reachable by the driver through a pointer and by the device
/// through guest-physical pages. Dropping it frees the memory.
#[derive(Debug)]
pub struct DmaBuf {
    region: Box<dyn DmaRegion>,
    /// `region.as_ptr()` and `region.len()`, read once: the data path
    /// polls through them (a dynamic call each cost a tenth of an empty
    /// CQ poll).
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr` is the region's own address (fixed for its life by the
// `DmaRegion` contract), only a cached copy of what the `Send + Sync`
// region hands out to any thread; every access through it is volatile or
// atomic, as through the region.
unsafe impl Send for DmaBuf {}
// SAFETY: as for `Send`; shared references only read the cached fields.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// Wraps a region, checking that its description is consistent.
    pub fn new(region: Box<dyn DmaRegion>) -> Result<Self> {
        let shift = region.page_shift();
        if !(12..=30).contains(&shift) {
            return Err(Error::InvalidArgument(format!("DMA page shift {shift}")));
        }
        let page = 1u64 << shift;
        let fpo = u64::from(region.first_page_offset());
        let len = region.len() as u64;
        let need = (fpo + len).div_ceil(page);
        if len == 0 || fpo >= page || region.pages().len() as u64 != need {
            return Err(Error::InvalidArgument(format!(
                "DMA region of {len} bytes at page offset {fpo} with {} pages of {page} bytes",
                region.pages().len()
            )));
        }
        if region.as_ptr().is_null() || region.as_ptr() as usize % 8 != 0 {
            return Err(Error::InvalidArgument(
                "DMA region pointer is null or not 8-byte aligned".into(),
            ));
        }
        let (ptr, len) = (region.as_ptr(), region.len());
        Ok(DmaBuf { region, ptr, len })
    }

    /// What a restored driver needs to map this buffer again
    /// ([`DmaBuf::adopt`]).
    pub fn image(&self) -> RegionImage {
        RegionImage {
            pages: self.pages().to_vec(),
            first_page_offset: self.first_page_offset(),
            len: self.len,
        }
    }

    /// The buffer of `image` over `transport`'s guest RAM, whose pages are
    /// allocated already ([`Transport::adopt_dma`]); its contents are what
    /// the RAM holds.
    pub fn adopt(transport: &dyn Transport, image: &RegionImage) -> Result<Self> {
        let region = transport.adopt_dma(&image.pages, image.first_page_offset, image.len)?;
        if region.len() != image.len
            || region.pages() != image.pages.as_slice()
            || region.first_page_offset() != image.first_page_offset
        {
            return Err(Error::InvalidArgument(
                "transport mapped other pages than the image names".into(),
            ));
        }
        Self::new(region)
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Driver address of byte 0. Use it only for raw, volatile accesses
    /// (the device may access the memory at any time) or as the `iova` of a
    /// memory region.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// log2 of the page size.
    pub fn page_shift(&self) -> u32 {
        self.region.page_shift()
    }

    /// Offset of byte 0 within the first page.
    pub fn first_page_offset(&self) -> u32 {
        self.region.first_page_offset()
    }

    /// Guest-physical addresses of the pages, in order.
    pub fn pages(&self) -> &[u64] {
        self.region.pages()
    }

    /// Guest-physical address of byte `offset`, if it is inside the buffer.
    pub fn gpa(&self, offset: usize) -> Option<u64> {
        if offset >= self.len() {
            return None;
        }
        let abs = u64::from(self.first_page_offset()) + offset as u64;
        let page = *self.pages().get((abs >> self.page_shift()) as usize)?;
        Some(page + (abs & ((1u64 << self.page_shift()) - 1)))
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside a DMA buffer of {} bytes",
                self.len()
            ))),
        }
    }

    /// Copies `data` into the buffer at `offset` (volatile writes).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: `check` keeps [offset, offset + len) inside the region,
        // whose pointer is valid for writes of `len()` bytes while `self`
        // lives (`DmaRegion` contract).
        unsafe { volatile_copy_to(self.as_ptr().add(offset), data) };
        Ok(())
    }

    /// Copies bytes at `offset` out of the buffer into `out` (volatile reads).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as in `write`, the range is inside the region.
        unsafe { volatile_copy_from(self.as_ptr().add(offset), out) };
        Ok(())
    }

    /// Reads `len` bytes at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        // A word at a time where the range is aligned (the queues and
        // buffers zeroed at every creation are pages): a byte at a time
        // took most of a CQ's creation.
        let word = u64::from_ne_bytes([byte; 8]);
        let mut i = 0;
        while i < len {
            // SAFETY: offset + i < offset + len <= self.len().
            let p = unsafe { self.as_ptr().add(offset + i) };
            if p.align_offset(8) == 0 && len - i >= 8 {
                // SAFETY: p .. p + 8 is inside the region (i + 8 <= len) and
                // 8-aligned.
                unsafe { ptr::write_volatile(p.cast::<u64>(), word) };
                i += 8;
            } else {
                // SAFETY: p is inside the region (i < len).
                unsafe { ptr::write_volatile(p, byte) };
                i += 1;
            }
        }
        Ok(())
    }

    /// The 32-bit word at `offset` as an atomic. Offsets come from the
    /// driver's own ring geometry, checked at creation; a bad one is a
    /// driver bug.
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset % 4 == 0 && offset + 4 <= self.len(),
            "bad atomic offset {offset}"
        );
        // SAFETY: the word is inside the region and 4-byte aligned (the
        // region pointer is 8-aligned and `offset` a multiple of 4); the
        // region stays valid while `self` is borrowed; the driver accesses
        // shared words only atomically (the device is outside the Rust
        // abstract machine).
        unsafe { AtomicU32::from_ptr(self.as_ptr().add(offset).cast::<u32>()) }
    }

    /// The byte at `offset` as an atomic (see [`DmaBuf::atomic_u32`]).
    pub(crate) fn atomic_u8(&self, offset: usize) -> &AtomicU8 {
        assert!(offset < self.len(), "bad atomic offset {offset}");
        // SAFETY: the byte is inside the region, which is valid while `self`
        // is borrowed; u8 needs no alignment.
        unsafe { AtomicU8::from_ptr(self.as_ptr().add(offset)) }
    }
}

/// Copies `src` to `dst` with volatile stores, 8 bytes at a time where `dst`
/// is 8-byte aligned.
///
/// # Safety
///
/// `dst` must be valid for writes of `src.len()` bytes.
pub(crate) unsafe fn volatile_copy_to(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() {
        // SAFETY: i < src.len(), so dst + i is inside the caller's range.
        let p = unsafe { dst.add(i) };
        if p as usize % 8 == 0 && src.len() - i >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[i..i + 8]);
            // SAFETY: 8 bytes from p are inside the range, p is aligned.
            unsafe { ptr::write_volatile(p.cast::<u64>(), u64::from_ne_bytes(w)) };
            i += 8;
        } else {
            // SAFETY: p is inside the range.
            unsafe { ptr::write_volatile(p, src[i]) };
            i += 1;
        }
    }
}

/// Copies from `src` into `dst` with volatile loads, 8 bytes at a time where
/// `src` is 8-byte aligned.
///
/// # Safety
///
/// `src` must be valid for reads of `dst.len()` bytes.
pub(crate) unsafe fn volatile_copy_from(src: *const u8, dst: &mut [u8]) {
    let mut i = 0;
    while i < dst.len() {
        // SAFETY: i < dst.len(), so src + i is inside the caller's range.
        let p = unsafe { src.add(i) };
        if p as usize % 8 == 0 && dst.len() - i >= 8 {
            // SAFETY: 8 bytes from p are inside the range, p is aligned.
            let w = unsafe { ptr::read_volatile(p.cast::<u64>()) };
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: p is inside the range.
            dst[i] = unsafe { ptr::read_volatile(p) };
            i += 1;
        }
    }
}
