//! Doorbell records (128 bytes in guest RAM), the context's doorbell
//! header, and the kick protocol (spec 18.4 to 18.7).
//!
//! Bytes 0..64 of a record are written only by the driver, bytes 64..128
//! only by the device: one cache line each. The device's flags are once
//! per context, in a header only the device writes ([`CtxFlags`]). After
//! storing a producer index (release) the driver reads them:
//! `DB_FLAG_POLLING` means the engine polls and will see the store, and the
//! post is done. Otherwise it issues a full fence, reads them again and, if
//! `DB_FLAG_KICK` is set, notifies the notification queue: the engine
//! parked and asked to be woken up.
//!
//! In the shared-memory doorbell mode (spec 18.7) a queue's producer
//! indices live in a slot of its context's doorbell page instead, and the
//! context's flags in that page's header; the consumer indices stay in the
//! record.

use std::sync::atomic::{compiler_fence, fence, AtomicU32, Ordering};
use std::sync::Arc;

use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::{
    db_slot_offset, CtxDoorbell, DB_FLAG_KICK, DB_FLAG_POLLING, DB_PAGE_SIZE,
};
use virtio_rdma_abi::mem::DB_RECORD_SIZE;
use virtio_rdma_abi::Field;

use crate::dma::DmaBuf;
use crate::error::{Error, Result};
use crate::image::RegionImage;
use crate::transport::{SharedMemory, Transport};

/// Byte offsets of the fields of `QpDoorbell`, `CqDoorbell` and
/// `SrqDoorbell` (checked against the ABI's layout tables in the tests).
pub(crate) mod off {
    /// `QpDoorbell::sq_pi`.
    pub const QP_SQ_PI: usize = 0;
    /// `QpDoorbell::rq_pi`.
    pub const QP_RQ_PI: usize = 4;
    /// `QpDoorbell::sq_ci`.
    pub const QP_SQ_CI: usize = 64;
    /// `QpDoorbell::rq_ci`.
    pub const QP_RQ_CI: usize = 68;
    /// `CqDoorbell::ci`.
    pub const CQ_CI: usize = 0;
    /// `CqDoorbell::arm`.
    pub const CQ_ARM: usize = 4;
    /// `CqDoorbell::pi`.
    pub const CQ_PI: usize = 64;
    /// `CqDoorbell::armed_seq`.
    pub const CQ_ARMED_SEQ: usize = 68;
    /// `SrqDoorbell::pi`.
    pub const SRQ_PI: usize = 0;
    /// `SrqDoorbell::ci`.
    pub const SRQ_CI: usize = 64;
}

/// One doorbell record in DMA memory.
#[derive(Debug)]
pub(crate) struct DoorbellRecord {
    buf: DmaBuf,
    gpa: u64,
}

impl DoorbellRecord {
    /// Allocates a zeroed, 64-byte aligned record.
    pub(crate) fn alloc(transport: &dyn Transport) -> Result<Self> {
        let size = DB_RECORD_SIZE as usize;
        let buf = DmaBuf::new(transport.alloc_dma(size, size)?)?;
        let gpa = buf.gpa(0).unwrap_or(1);
        if buf.len() < size || gpa % DB_RECORD_SIZE != 0 || buf.as_ptr() as usize % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "transport returned a misaligned doorbell record (gpa {gpa:#x})"
            )));
        }
        buf.fill(0, size, 0)?;
        Ok(DoorbellRecord { buf, gpa })
    }

    /// Guest-physical address (for the create command).
    pub(crate) fn gpa(&self) -> u64 {
        self.gpa
    }

    /// The record of a restored queue ([`crate::image`]).
    pub(crate) fn adopt(transport: &dyn Transport, image: &RegionImage) -> Result<Self> {
        let buf = DmaBuf::adopt(transport, image)?;
        let size = DB_RECORD_SIZE as usize;
        let gpa = buf.gpa(0).unwrap_or(1);
        if buf.len() < size || gpa % DB_RECORD_SIZE != 0 || buf.as_ptr() as usize % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "a doorbell record in an image is misaligned (gpa {gpa:#x})"
            )));
        }
        Ok(DoorbellRecord { buf, gpa })
    }

    /// The record's image.
    pub(crate) fn image(&self) -> RegionImage {
        self.buf.image()
    }

    /// Loads a field with acquire semantics.
    pub(crate) fn load(&self, offset: usize) -> u32 {
        self.buf.atomic_u32(offset).load(Ordering::Acquire)
    }

    /// Stores a driver field with release semantics.
    pub(crate) fn store(&self, offset: usize, value: u32) {
        self.buf.atomic_u32(offset).store(value, Ordering::Release);
    }

    /// The underlying memory (tests inspect it).
    #[cfg(test)]
    pub(crate) fn buf(&self) -> &DmaBuf {
        &self.buf
    }
}

/// The notification step after a producer index store (spec 18.6): done
/// if the engine polls (`DB_FLAG_POLLING`: it guarantees to see the store
/// without a fence here); otherwise a full fence, a second read, and a
/// notification if the engine parked (`DB_FLAG_KICK`). Returns whether it
/// notified.
pub(crate) fn notify_step(transport: &dyn Transport, flags: &AtomicU32) -> Result<bool> {
    // The CPU may still let this load pass the store (the device's
    // system-wide barrier covers that); the compiler must not.
    compiler_fence(Ordering::SeqCst);
    if flags.load(Ordering::Relaxed) & DB_FLAG_POLLING != 0 {
        return Ok(false);
    }
    fence(Ordering::SeqCst);
    if flags.load(Ordering::Relaxed) & DB_FLAG_KICK != 0 {
        transport.notify(NOTIFYQ)?;
        return Ok(true);
    }
    Ok(false)
}

/// Where a context's device flags are (spec 18.4): its doorbell header in
/// guest RAM (`CtxDoorbell`), or its doorbell page's header.
#[derive(Debug, Clone)]
pub(crate) enum CtxFlags {
    /// The 64-byte header given to `CREATE_CTX`.
    Header(Arc<DmaBuf>),
    /// The header of the context's doorbell page.
    Page(Arc<DoorbellPage>),
}

impl CtxFlags {
    /// Allocates a context doorbell header: 64 bytes, 64-byte aligned.
    pub(crate) fn alloc_header(transport: &dyn Transport) -> Result<Arc<DmaBuf>> {
        let size = CtxDoorbell::SIZE;
        let buf = DmaBuf::new(transport.alloc_dma(size, size)?)?;
        let gpa = buf.gpa(0).unwrap_or(1);
        if buf.len() < size || gpa % size as u64 != 0 || buf.as_ptr() as usize % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "transport returned a misaligned context doorbell header (gpa {gpa:#x})"
            )));
        }
        buf.fill(0, size, 0)?;
        Ok(Arc::new(buf))
    }

    /// The `flags` word.
    pub(crate) fn word(&self) -> &AtomicU32 {
        match self {
            CtxFlags::Header(buf) => buf.atomic_u32(0),
            CtxFlags::Page(page) => page.word(0),
        }
    }
}

/// The context's doorbell page in the device's doorbell region
/// (shared-memory doorbell mode, spec 18.7).
#[derive(Debug)]
pub(crate) struct DoorbellPage {
    shm: Arc<dyn SharedMemory>,
    /// Byte offset of the page in the region.
    offset: usize,
    /// Page index (for diagnostics).
    index: u32,
}

impl DoorbellPage {
    /// The page `index` of `shm`, if it lies inside the region.
    pub(crate) fn new(shm: Arc<dyn SharedMemory>, index: u32) -> Result<Self> {
        let page = DB_PAGE_SIZE as usize;
        let offset = (index as usize)
            .checked_mul(page)
            .filter(|o| o.checked_add(page).is_some_and(|end| end <= shm.len()))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device returned doorbell page {index} outside the {}-byte region",
                    shm.len()
                ))
            })?;
        Ok(DoorbellPage { shm, offset, index })
    }

    /// The 32-bit word at byte `off` of the page (`off` < 4096, aligned).
    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= DB_PAGE_SIZE as usize);
        // SAFETY: the page lies inside the region (checked in `new`), which
        // is valid and 4096-aligned while `shm` lives (`SharedMemory`
        // contract) and only ever accessed atomically.
        unsafe { &*self.shm.as_ptr().add(self.offset + off).cast::<AtomicU32>() }
    }

    /// Page index.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }
}

/// A queue's doorbell slot in its context's doorbell page.
#[derive(Debug, Clone)]
pub(crate) struct DoorbellSlot {
    page: Arc<DoorbellPage>,
    /// Byte offset of the slot in the page.
    offset: usize,
    /// Slot index.
    index: u32,
}

impl DoorbellSlot {
    /// Slot `slot` of `page`, if the index is valid.
    pub(crate) fn new(page: Arc<DoorbellPage>, slot: u32) -> Result<Self> {
        let offset = db_slot_offset(slot).ok_or_else(|| {
            Error::InvalidArgument(format!("device returned doorbell slot {slot}"))
        })?;
        Ok(DoorbellSlot {
            page,
            offset: offset as usize,
            index: slot,
        })
    }

    /// Slot index.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Stores producer index word `half` (0: `sq_pi` / SRQ `pi`, 1: `rq_pi`).
    pub(crate) fn store(&self, half: usize, value: u32) {
        self.page
            .word(self.offset + 4 * (half & 1))
            .store(value, Ordering::Release);
    }
}
