//! Taking work requests out of guest rings: copy first, then parse.

use virtio_rdma_abi::datapath::{RecvWqe, SendWqe, Sge, WcStatus, WrOpcode, WQE_INLINE};
use virtio_rdma_abi::mem::{RECV_WQE_HEADER, SEND_WQE_HEADER, SGE_SIZE};
use virtio_rdma_abi::{Field, Wire};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::memory::PageList;
use crate::resources::Qp;

/// A send work request, copied out of the ring and checked for shape.
#[derive(Debug, Clone)]
pub struct SendWr {
    /// The header.
    pub hdr: SendWqe,
    /// The opcode.
    pub opcode: WrOpcode,
    /// Scatter/gather list (empty with inline data).
    pub sges: Vec<Sge>,
    /// Inline data.
    pub inline: Option<Vec<u8>>,
}

/// A receive work request.
#[derive(Debug, Clone)]
pub struct RecvWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: Vec<Sge>,
}

/// Largest WQE stride (64-byte header + 30 SGEs, or 480 inline bytes, rounded up).
pub const MAX_STRIDE: usize = 1024;

/// Copies the `stride`-byte slot `index` of a ring at `ring_offset` in
/// `ring` into `buf` and returns the filled part.
fn read_slot<'b>(
    mem: &GuestMemoryMmap<()>,
    ring: &PageList,
    ring_offset: u64,
    depth: u32,
    shift: u32,
    index: u32,
    buf: &'b mut [u8; MAX_STRIDE],
) -> Option<&'b [u8]> {
    let slot = u64::from(index & (depth - 1)) << shift;
    let (gpa, contiguous) = ring.translate(ring_offset + slot)?;
    let stride = 1usize << shift;
    // Strides never exceed a page and slots are stride-aligned, so a slot
    // never crosses a page; checked anyway.
    if (contiguous as usize) < stride {
        return None;
    }
    let dst = buf.get_mut(..stride)?;
    mem.read_slice(dst, GuestAddress(gpa)).ok()?;
    Some(dst)
}

fn sges(buf: &[u8], header: u32, n: usize) -> Option<Vec<Sge>> {
    (0..n)
        .map(|i| {
            let off = header as usize + i * SGE_SIZE as usize;
            buf.get(off..off + Sge::SIZE)
                .and_then(|b| Sge::parse(b).ok())
        })
        .collect()
}

/// Copies and parses send WQE `index`. A malformed WQE is `LOC_QP_OP_ERR`
/// (with the `wr_id` if the header could be read).
pub fn fetch_send(
    mem: &GuestMemoryMmap<()>,
    qp: &Qp,
    index: u32,
) -> Result<SendWr, (WcStatus, u64)> {
    let (ring, depth, shift) = (&qp.ring, qp.sq_depth, qp.layout.sq_wqe_shift);
    let (max_sge, max_inline) = (qp.max_send_sge, qp.max_inline_data);
    let mut slot = [0u8; MAX_STRIDE];
    let buf = read_slot(mem, ring, 0, depth, shift, index, &mut slot)
        .ok_or((WcStatus::LOC_QP_OP_ERR, 0))?;
    let raw = buf
        .get(..SendWqe::SIZE)
        .ok_or((WcStatus::LOC_QP_OP_ERR, 0))?;
    let wr_id = SendWqe::read(raw).wr_id;
    let bad = (WcStatus::LOC_QP_OP_ERR, wr_id);
    let hdr = SendWqe::parse(raw).map_err(|_| bad)?;
    let opcode = WrOpcode::from_u32(u32::from(hdr.opcode)).ok_or(bad)?;
    let known = virtio_rdma_abi::datapath::WQE_SIGNALED
        | virtio_rdma_abi::datapath::WQE_SOLICITED
        | WQE_INLINE
        | virtio_rdma_abi::datapath::WQE_FENCE;
    if hdr.flags & !known != 0 {
        return Err(bad);
    }
    if hdr.flags & WQE_INLINE != 0 {
        if hdr.num_sge != 0 || hdr.inline_len > max_inline {
            return Err(bad);
        }
        let start = SEND_WQE_HEADER as usize;
        let data = buf.get(start..start + hdr.inline_len as usize).ok_or(bad)?;
        return Ok(SendWr {
            hdr,
            opcode,
            sges: Vec::new(),
            inline: Some(data.to_vec()),
        });
    }
    if u32::from(hdr.num_sge) > max_sge {
        return Err(bad);
    }
    let sges = sges(buf, SEND_WQE_HEADER, usize::from(hdr.num_sge)).ok_or(bad)?;
    Ok(SendWr {
        hdr,
        opcode,
        sges,
        inline: None,
    })
}

/// Copies and parses receive WQE `index` of a ring at `ring_offset`.
pub fn fetch_recv(
    mem: &GuestMemoryMmap<()>,
    ring: &PageList,
    ring_offset: u64,
    depth: u32,
    shift: u32,
    max_sge: u32,
    index: u32,
) -> Result<RecvWr, (WcStatus, u64)> {
    let mut slot = [0u8; MAX_STRIDE];
    let buf = read_slot(mem, ring, ring_offset, depth, shift, index, &mut slot)
        .ok_or((WcStatus::LOC_QP_OP_ERR, 0))?;
    let raw = buf
        .get(..RecvWqe::SIZE)
        .ok_or((WcStatus::LOC_QP_OP_ERR, 0))?;
    let wr_id = RecvWqe::read(raw).wr_id;
    let bad = (WcStatus::LOC_QP_OP_ERR, wr_id);
    let hdr = RecvWqe::parse(raw).map_err(|_| bad)?;
    if hdr.num_sge > max_sge {
        return Err(bad);
    }
    let sges = sges(buf, RECV_WQE_HEADER, hdr.num_sge as usize).ok_or(bad)?;
    Ok(RecvWr { wr_id, sges })
}
