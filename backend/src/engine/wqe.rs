//! Taking work requests out of guest rings: copy first, then parse.
//!
//! A WQE is copied into engine-owned scratch memory ([`WqeBuf`]) — the
//! header first, then exactly the scatter/gather entries or inline bytes
//! that the copied header announces, never beyond the slot — and only that
//! copy is parsed. The parsed work request borrows the scratch memory, so
//! taking a WQE allocates nothing.

use virtio_rdma_abi::datapath::{RecvWqe, SendWqe, Sge, WrOpcode, WQE_INLINE};
use virtio_rdma_abi::mem::{RECV_WQE_HEADER, SEND_WQE_HEADER, SGE_SIZE};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::{Field, Wire};

use crate::memory::access;
use crate::memory::volatile;
use crate::memory::{HostMem, PageList};
use crate::resources::{Qp, Srq};
use crate::rnic_path::SendWr;

/// Largest WQE stride (64-byte header + 30 SGEs, or 480 inline bytes, rounded up).
pub const MAX_STRIDE: usize = 1024;
/// Most SGEs a WQE of the largest stride can hold.
const MAX_SGES: usize = MAX_STRIDE / SGE_SIZE as usize;

/// Scratch memory for one copied WQE and its parsed SGE list.
pub struct WqeBuf {
    slot: [u8; MAX_STRIDE],
    sges: [Sge; MAX_SGES],
}

impl WqeBuf {
    /// Empty scratch memory (boxed: it is 2 KiB).
    pub fn new() -> Box<Self> {
        Box::new(WqeBuf {
            slot: [0; MAX_STRIDE],
            sges: [Sge::default(); MAX_SGES],
        })
    }
}

/// Why a WQE could not be taken out of its ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeError {
    /// The slot is not in guest RAM (or not readable): the queue itself is
    /// unusable, which fails the queue, not the WQE (spec 18.18).
    Unusable,
    /// The copied WQE breaks the format rules (spec 18.8, 18.13): it
    /// completes with `LOC_QP_OP_ERR`.
    Malformed {
        /// Its `wr_id`, as copied.
        wr_id: u64,
        /// Its opcode, when the copied one is a `WrOpcode` (send WQEs).
        opcode: Option<WrOpcode>,
    },
}

impl WqeError {
    fn malformed(wr_id: u64, opcode: Option<WrOpcode>) -> Self {
        WqeError::Malformed { wr_id, opcode }
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// `wr_id`.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: &'a [Sge],
}

/// How many WQEs a ring of `depth` slots holds between consumer index `ci`
/// and the driver's producer index `pi` (free-running counters, so the
/// difference wraps); `None` when the driver claims more than the ring
/// holds (spec 18.18: the queue is broken).
pub fn posted(pi: u32, ci: u32, depth: u32) -> Option<u32> {
    let n = pi.wrapping_sub(ci);
    (n <= depth).then_some(n)
}

/// Guest-physical address of the `stride`-byte slot `index` of a ring at
/// `ring_offset` in `ring`, and the stride.
fn slot_gpa(
    ring: &PageList,
    ring_offset: u64,
    depth: u32,
    shift: u32,
    index: u32,
) -> Option<(u64, usize)> {
    let stride = 1usize << shift;
    if stride > MAX_STRIDE {
        return None;
    }
    let slot = u64::from(index & depth.wrapping_sub(1)) << shift;
    let (gpa, contiguous) = ring.translate(ring_offset.checked_add(slot)?)?;
    // Strides never exceed a page and slots are stride-aligned, so a slot
    // never crosses a page; checked anyway.
    if contiguous < stride as u64 {
        return None;
    }
    Some((gpa, stride))
}

/// Asks the CPU to bring the head send WQE of `qp` (the slot at its
/// consumer index) into its caches, without reading it: the engine does
/// this for the next QP it will serve.
#[inline]
pub fn prefetch_send_head(mem: &HostMem, qp: &Qp) {
    // One line: the header (asking for the SGEs' line too measured no
    // different at 10,000 QPs).
    prefetch_send_slot(mem, qp, qp.rt.sq_ci, 1);
}

/// How many WQEs ahead of the one it executes the requester prefetches.
pub const PREFETCH_AHEAD: u32 = 4;

/// Prefetches the lines of send WQE slot `index` of `qp` that a WQE of
/// its usual size (`max_send_sge` SGEs) fills.
#[inline]
pub fn prefetch_send_wqe(mem: &HostMem, qp: &Qp, index: u32) {
    let lines = usual_wqe(SEND_WQE_HEADER, qp.max_send_sge).div_ceil(64);
    prefetch_send_slot(mem, qp, index, lines);
}

/// Asks the CPU to bring the first `lines` cache lines of send WQE slot
/// `index` of `qp` into its caches, without reading them. The requester
/// does this a few WQEs ahead within a burst: each slot was last written
/// by the driver on another CPU, and the engine would otherwise wait for
/// its lines one WQE at a time.
#[inline]
fn prefetch_send_slot(mem: &HostMem, qp: &Qp, index: u32, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some((p, stride)) = slot_gpa(&qp.ring, 0, qp.sq_depth, qp.layout.sq_wqe_shift, index)
        .and_then(|(gpa, stride)| Some((mem.ptr(gpa, stride as u64)?, stride)))
    {
        const LINE: usize = 64;
        for off in (0..stride.min(lines.saturating_mul(LINE))).step_by(LINE) {
            // SAFETY: `p + off` lies inside the slot, a range of one RAM
            // region (checked by `HostMem::ptr`); SSE is part of the
            // x86_64 baseline, and a prefetch only hints the cache (it
            // never faults and reads nothing into the program).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.add(off).cast_const().cast::<i8>(),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (mem, qp, index, lines);
}

/// Copies the header (`header` bytes) of the slot at `gpa`, then the
/// `body(header)` bytes after it that the copied header announces (bounded
/// by the stride). Returns the copied bytes.
///
/// The first copy takes `first` bytes (at least the header, at most the
/// stride): with `first` the size of the queue's usual WQE, one copy takes
/// the whole WQE, and only a longer body (inline data) needs a second.
fn copy_slot<'b>(
    mem: &HostMem,
    gpa: u64,
    stride: usize,
    (header, first): (usize, usize),
    buf: &'b mut [u8; MAX_STRIDE],
    body: impl FnOnce(&[u8]) -> usize,
) -> Option<&'b [u8]> {
    let first = first.clamp(header, stride.max(header));
    access::read_bytes(mem, gpa, buf.get_mut(..first)?).ok()?;
    let extra = body(buf.get(..header)?).min(stride.saturating_sub(header));
    let end = header.checked_add(extra)?;
    if end > first {
        let rest = buf.get_mut(first..end)?;
        access::read_bytes(mem, gpa.checked_add(first as u64)?, rest).ok()?;
    }
    buf.get(..end)
}

/// Bytes of a WQE with a `header`-byte header and `max_sge` SGEs: what
/// [`copy_slot`] copies first.
fn usual_wqe(header: u32, max_sge: u32) -> usize {
    (max_sge as usize)
        .saturating_mul(SGE_SIZE as usize)
        .saturating_add(header as usize)
}

/// Parses `n` SGEs that follow a `header`-byte header in `buf` into `out`.
fn sges<'s>(buf: &[u8], header: u32, n: usize, out: &'s mut [Sge; MAX_SGES]) -> Option<&'s [Sge]> {
    let out = out.get_mut(..n)?;
    for (i, sge) in out.iter_mut().enumerate() {
        let off = (header as usize).checked_add(i.checked_mul(SGE_SIZE as usize)?)?;
        *sge = buf
            .get(off..off.checked_add(Sge::SIZE)?)
            .and_then(|b| Sge::parse(b).ok())?;
    }
    Some(out)
}

// `fetch_send` decodes the header from the first SEND_WQE_HEADER bytes.
const _: () = assert!(SEND_WQE_HEADER as usize == SendWqe::SIZE);

/// Copies and parses send WQE `index`.
///
/// Where the slot is 8-byte aligned in the host's mapping (always, but for
/// a VMM that maps RAM regions at odd offsets), the header and the SGEs
/// are read word by word, each word once, and decoded where they are: a
/// copy parsed straight away is read with loads wider than the stores that
/// made it, which the CPU cannot forward from its store buffer (at 64-byte
/// WRITEs they took a fifth of the engine's time). Inline data is copied.
// Inlined into the requester: the work request it returns (some 120
// bytes) cost more to move out of a call than to parse (64 B WRITE rate
// 1.08 x, `rdma_perf write_bw -s 64`, builds alternated).
#[inline(always)]
pub fn fetch_send<'a>(
    mem: &HostMem,
    qp: &Qp,
    index: u32,
    scratch: &'a mut WqeBuf,
) -> Result<SendWr<'a>, WqeError> {
    let (max_sge, max_inline) = (qp.max_send_sge, qp.max_inline_data);
    let (gpa, stride) = slot_gpa(&qp.ring, 0, qp.sq_depth, qp.layout.sq_wqe_shift, index)
        .ok_or(WqeError::Unusable)?;
    let WqeBuf {
        slot,
        sges: sge_buf,
    } = scratch;
    // The slot and at least a header's bytes, in one RAM region (every
    // send queue's stride holds a header; a ring that broke that rule is
    // read no further than the region allows).
    let span = stride.max(SEND_WQE_HEADER as usize);
    let words = mem
        .ptr(gpa, span as u64)
        .filter(|p| p.cast_const().cast::<u64>().is_aligned());
    let hdr = match words {
        // SAFETY: `p` is 8-byte aligned and `span` bytes from it, at least
        // the header's 64, lie in one RAM region (`HostMem::ptr`).
        Some(p) => SendWqe::from_words(&unsafe { volatile::words::<8>(p) }),
        None => {
            let h = slot
                .get_mut(..SEND_WQE_HEADER as usize)
                .ok_or(WqeError::Unusable)?;
            access::read_bytes(mem, gpa, h).map_err(|_| WqeError::Unusable)?;
            SendWqe::read(h)
        }
    };
    let opcode = WrOpcode::from_u32(u32::from(hdr.opcode));
    let bad = WqeError::malformed(hdr.wr_id, opcode);
    // `xrc_srqn` is an XRC_INI QP's only (spec 11.3): zero on every other.
    if hdr.xrc_srqn != 0 && qp.qp_type != QpType::XRC_INI {
        return Err(bad);
    }
    let opcode = opcode.ok_or(bad)?;
    let known = virtio_rdma_abi::datapath::WQE_SIGNALED
        | virtio_rdma_abi::datapath::WQE_SOLICITED
        | WQE_INLINE
        | virtio_rdma_abi::datapath::WQE_FENCE;
    if hdr.flags & !known != 0 {
        return Err(bad);
    }
    // The body after the header never reaches past the slot.
    let room = stride.saturating_sub(SEND_WQE_HEADER as usize);
    let body = gpa.checked_add(u64::from(SEND_WQE_HEADER)).ok_or(bad)?;
    if hdr.flags & WQE_INLINE != 0 {
        if hdr.num_sge != 0 || hdr.inline_len > max_inline {
            return Err(bad);
        }
        let n = hdr.inline_len as usize;
        let data = slot.get_mut(..n).filter(|_| n <= room).ok_or(bad)?;
        access::read_bytes(mem, body, data).map_err(|_| WqeError::Unusable)?;
        return Ok(SendWr {
            hdr,
            opcode,
            sges: &[],
            inline: Some(data),
        });
    }
    let n = usize::from(hdr.num_sge);
    if u32::from(hdr.num_sge) > max_sge || n.saturating_mul(SGE_SIZE as usize) > room {
        return Err(bad);
    }
    let out = sge_buf.get_mut(..n).ok_or(bad)?;
    match words {
        Some(p) => {
            for (i, sge) in out.iter_mut().enumerate() {
                // Header, then SGE `i < num_sge`: inside the slot (checked
                // against `room` above).
                let off = (SEND_WQE_HEADER as usize).saturating_add(i.saturating_mul(Sge::SIZE));
                // SAFETY: `p + off` is 8-byte aligned (`p` is, and so are
                // the header's and an SGE's sizes) and its 16 bytes lie in
                // the slot (`room` above), inside the `span` bytes checked.
                *sge = Sge::from_words(&unsafe { volatile::words::<2>(p.add(off)) });
            }
        }
        None => {
            let bytes = slot.get_mut(..n.saturating_mul(Sge::SIZE)).ok_or(bad)?;
            access::read_bytes(mem, body, bytes).map_err(|_| WqeError::Unusable)?;
            for (sge, b) in out.iter_mut().zip(bytes.chunks_exact(Sge::SIZE)) {
                *sge = Sge::read(b);
            }
        }
    }
    Ok(SendWr {
        hdr,
        opcode,
        sges: out,
        inline: None,
    })
}

/// A ring of receive WQEs: a QP's receive queue or an SRQ.
#[derive(Debug, Clone, Copy)]
pub struct RecvRing<'a> {
    /// The queue buffer.
    pub ring: &'a PageList,
    /// Offset of the ring in the buffer.
    pub offset: u64,
    /// Number of slots (a power of two).
    pub depth: u32,
    /// log2 of the WQE stride.
    pub shift: u32,
    /// Most SGEs a WQE may carry.
    pub max_sge: u32,
}

impl<'a> RecvRing<'a> {
    /// The receive queue of `qp` (one not attached to an SRQ).
    pub fn of_qp(qp: &'a Qp) -> Self {
        RecvRing {
            ring: &qp.ring,
            offset: qp.layout.rq_offset,
            depth: qp.rq_depth,
            shift: qp.layout.rq_wqe_shift,
            max_sge: qp.max_recv_sge,
        }
    }

    /// The ring of `srq`.
    pub fn of_srq(srq: &'a Srq) -> Self {
        RecvRing {
            ring: &srq.ring,
            offset: 0,
            depth: srq.depth,
            shift: srq.wqe_shift,
            max_sge: srq.max_sge,
        }
    }
}

/// Copies and parses receive WQE `index` of `ring`.
pub fn fetch_recv<'a>(
    mem: &HostMem,
    ring: &RecvRing<'_>,
    index: u32,
    scratch: &'a mut WqeBuf,
) -> Result<RecvWr<'a>, WqeError> {
    let max_sge = ring.max_sge;
    let (gpa, stride) = slot_gpa(ring.ring, ring.offset, ring.depth, ring.shift, index)
        .ok_or(WqeError::Unusable)?;
    let WqeBuf {
        slot,
        sges: sge_buf,
    } = scratch;
    let first = usual_wqe(RECV_WQE_HEADER, max_sge);
    let buf = copy_slot(
        mem,
        gpa,
        stride,
        (RECV_WQE_HEADER as usize, first),
        slot,
        |h| (RecvWqe::read(h).num_sge as usize).saturating_mul(SGE_SIZE as usize),
    )
    .ok_or(WqeError::Unusable)?;
    let raw = buf.get(..RecvWqe::SIZE).ok_or(WqeError::Unusable)?;
    let wr_id = RecvWqe::read(raw).wr_id;
    let bad = WqeError::malformed(wr_id, None);
    let hdr = RecvWqe::parse(raw).map_err(|_| bad)?;
    if hdr.num_sge > max_sge {
        return Err(bad);
    }
    let sges = sges(buf, RECV_WQE_HEADER, hdr.num_sge as usize, sge_buf).ok_or(bad)?;
    Ok(RecvWr { wr_id, sges })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Indices are free-running: the count wraps with them, and a driver
    /// claiming more than the ring holds (or a producer index behind the
    /// consumer's) is refused.
    #[test]
    fn posted_wqes_between_free_running_indices() {
        assert_eq!(posted(5, 3, 4), Some(2));
        assert_eq!(posted(3, 3, 4), Some(0));
        assert_eq!(posted(7, 3, 4), Some(4), "full");
        assert_eq!(posted(8, 3, 4), None, "more than the ring holds");
        assert_eq!(posted(1, u32::MAX, 4), Some(2), "across the wrap");
        assert_eq!(posted(2, 3, 4), None, "behind the consumer");
        assert_eq!(posted(0, 0, 0), Some(0));
    }
}
