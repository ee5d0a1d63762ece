//! Work queue rings: slot geometry and producer-side accounting.
//!
//! A ring is `depth` (a power of two) slots of `1 << shift` bytes at
//! `base` in a queue buffer. Indices are free-running u32; the slot of index
//! `i` is `i & (depth - 1)`. The driver may have at most `depth` WQEs the
//! device has not taken yet: `pi - ci <= depth`.

use std::sync::{Mutex, PoisonError};

use crate::dma::{volatile_copy_to, DmaBuf};
use virtio_rdma_abi::config::NOTIFYQ;

use crate::doorbell::{notify_step, CtxFlags, DoorbellRecord, DoorbellSlot};
use crate::error::{Error, Result};
use crate::image::RegionImage;
use crate::transport::Transport;

/// Geometry of one ring inside a queue buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    /// Byte offset of slot 0 in the buffer.
    pub base: usize,
    /// log2 of the slot size.
    pub shift: u32,
    /// Number of slots (a power of two).
    pub depth: u32,
}

impl RingGeometry {
    /// Byte offset of the slot of free-running index `index`.
    pub(crate) fn slot_offset(&self, index: u32) -> usize {
        self.base + (((index & (self.depth - 1)) as usize) << self.shift)
    }

    /// Slot size in bytes.
    pub(crate) fn stride(&self) -> usize {
        1usize << self.shift
    }

    /// Whether the ring lies inside a buffer of `len` bytes.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.depth.is_power_of_two()
            && self.shift < 31
            && (self.depth as usize)
                .checked_shl(self.shift)
                .and_then(|b| b.checked_add(self.base))
                .is_some_and(|end| end <= len)
    }
}

/// Producer state of a ring: the next index to post and the last consumer
/// index seen from the device.
#[derive(Debug, Default)]
pub(crate) struct Producer {
    /// Next producer index (published after the WQEs are written).
    pub pi: u32,
    /// Cached device consumer index.
    pub ci: u32,
    /// Reused encoding buffer of [`post_encoded`] (no allocation per post
    /// once it has grown).
    buf: Vec<u8>,
    /// End offsets of the WQEs in `buf`.
    ends: Vec<usize>,
}

impl Producer {
    /// Free slots according to the cached consumer index. A consumer index
    /// ahead of the producer (a confused device) counts as no room.
    fn free(&self, depth: u32) -> u32 {
        let used = self.pi.wrapping_sub(self.ci);
        depth.saturating_sub(used)
    }

    /// Checks that `n` WQEs fit, refreshing the consumer index with
    /// `load_ci` only when the cached value says they do not.
    pub(crate) fn reserve(
        &mut self,
        n: usize,
        depth: u32,
        load_ci: impl Fn() -> u32,
    ) -> Result<()> {
        if (self.free(depth) as usize) < n {
            self.ci = load_ci();
            let free = self.free(depth) as usize;
            if free < n {
                return Err(Error::QueueFull { needed: n, free });
            }
        }
        Ok(())
    }
}

/// Writes an encoded WQE into the slot of `index` (volatile stores). The
/// encoding was checked against the stride by the caller.
pub(crate) fn write_slot(buf: &DmaBuf, ring: &RingGeometry, index: u32, wqe: &[u8]) {
    debug_assert!(wqe.len() <= ring.stride());
    let off = ring.slot_offset(index);
    assert!(
        wqe.len() <= ring.stride() && off + ring.stride() <= buf.len(),
        "WQE outside its ring"
    );
    // SAFETY: [off, off + wqe.len()) lies inside the buffer (checked above),
    // which is valid for writes while `buf` is borrowed.
    unsafe { volatile_copy_to(buf.as_ptr().add(off), wqe) };
}

/// A queue buffer (rings) and its doorbell record.
#[derive(Debug)]
pub(crate) struct QueueMem {
    /// The ring memory, starting on a page boundary.
    pub buf: DmaBuf,
    /// The doorbell record.
    pub db: DoorbellRecord,
    /// The doorbell slot, when the device assigned one (shared-memory
    /// doorbell mode): the producer indices are stored there instead.
    pub slot: Option<DoorbellSlot>,
    /// The context's device flags (work queues only: CQs need no
    /// notification).
    pub flags: Option<CtxFlags>,
    /// Pages the buffer description must name (`ceil(bytes / P)`).
    pub npages: usize,
}

impl QueueMem {
    /// Allocates a zeroed queue buffer of `bytes` bytes (page aligned, in
    /// the transport's DMA page size) and a zeroed doorbell record.
    pub(crate) fn alloc(transport: &dyn Transport, bytes: usize) -> Result<Self> {
        let shift = transport.dma_page_shift();
        let page = 1usize << shift;
        let bytes = bytes.max(1);
        let buf = DmaBuf::new(transport.alloc_dma(bytes, page)?)?;
        if buf.first_page_offset() != 0 || buf.page_shift() != shift || buf.len() < bytes {
            return Err(Error::InvalidArgument(
                "transport returned a queue buffer that does not start a page".into(),
            ));
        }
        buf.fill(0, bytes, 0)?;
        let db = DoorbellRecord::alloc(transport)?;
        Ok(QueueMem {
            buf,
            db,
            slot: None,
            flags: None,
            npages: bytes.div_ceil(page),
        })
    }

    /// The queue memory of a restored queue ([`crate::image`]): its
    /// buffer and record as they are in guest RAM.
    pub(crate) fn adopt(
        transport: &dyn Transport,
        buf: &RegionImage,
        db: &RegionImage,
        npages: usize,
    ) -> Result<Self> {
        let buf = DmaBuf::adopt(transport, buf)?;
        if buf.first_page_offset() != 0 || npages == 0 || npages > buf.pages().len() {
            return Err(Error::InvalidArgument(
                "a queue buffer in an image does not start a page or names other pages".into(),
            ));
        }
        let db = DoorbellRecord::adopt(transport, db)?;
        Ok(QueueMem {
            buf,
            db,
            slot: None,
            flags: None,
            npages,
        })
    }

    /// Stores a producer index where the device reads it (record or slot),
    /// without the notification step.
    pub(crate) fn store_pi(&self, regs: WqRegs, pi: u32) {
        match &self.slot {
            Some(slot) => slot.store(regs.slot_half, pi),
            None => self.db.store(regs.pi, pi),
        }
    }

    /// Publishes a producer index: stores it, then the notification step
    /// of spec 18.6 on the context's flags; returns whether it notified.
    pub(crate) fn publish(&self, transport: &dyn Transport, regs: WqRegs, pi: u32) -> Result<bool> {
        self.store_pi(regs, pi);
        match &self.flags {
            Some(flags) => notify_step(transport, flags.word()),
            // Not a work queue (never happens): notify to be safe.
            None => {
                transport.notify(NOTIFYQ)?;
                Ok(true)
            }
        }
    }

    /// The pages the buffer description names.
    pub(crate) fn pages(&self) -> &[u64] {
        &self.buf.pages()[..self.npages.min(self.buf.pages().len())]
    }
}

/// Doorbell record offsets of one work queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WqRegs {
    /// Producer index (driver).
    pub pi: usize,
    /// Consumer index (device).
    pub ci: usize,
    /// Word of the doorbell slot holding the producer index (0 or 1).
    pub slot_half: usize,
}

/// Posts `n` WQEs that `encode(i, out)` appends to `out`: all of them are
/// encoded first (nothing is posted if one fails), then room is checked,
/// each is written into its slot and the new producer index is published
/// with the kick protocol. The encoding buffer is the producer's own, so a
/// post allocates nothing. Returns whether it kicked.
pub(crate) fn post_encoded(
    transport: &dyn Transport,
    mem: &QueueMem,
    ring: &RingGeometry,
    regs: WqRegs,
    producer: &Mutex<Producer>,
    n: usize,
    encode: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<bool> {
    post_encoded_into(transport, mem, &mem.buf, ring, regs, producer, n, encode)
}

/// [`post_encoded`] into ring memory `buf` instead of `mem`'s own (a
/// resized SRQ's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_encoded_into(
    transport: &dyn Transport,
    mem: &QueueMem,
    buf: &DmaBuf,
    ring: &RingGeometry,
    regs: WqRegs,
    producer: &Mutex<Producer>,
    n: usize,
    mut encode: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<bool> {
    if n == 0 {
        return Ok(false);
    }
    let mut guard = producer.lock().unwrap_or_else(PoisonError::into_inner);
    let p = &mut *guard;
    p.buf.clear();
    p.ends.clear();
    for i in 0..n {
        encode(i, &mut p.buf)?;
        p.ends.push(p.buf.len());
    }
    p.reserve(n, ring.depth, || mem.db.load(regs.ci))?;
    let mut start = 0;
    for &end in &p.ends {
        write_slot(buf, ring, p.pi, &p.buf[start..end]);
        p.pi = p.pi.wrapping_add(1);
        start = end;
    }
    mem.publish(transport, regs, p.pi)
}
