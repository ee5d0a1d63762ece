//! Guest memory descriptions: page lists, queue buffer layouts, access flags.

use crate::ctrl::code_enum;
use crate::wire_struct;

wire_struct! {
    /// Describes guest memory as a list of equally sized guest-physical pages.
    ///
    /// Where the page addresses are depends on `mode` (see [`PageListMode`]);
    /// for `INLINE` and `INDIRECT` they follow the command's fixed part in
    /// the device-readable area of the request.
    pub struct BufferDesc {
        /// `CONTIGUOUS`: guest-physical address of the first page. Otherwise 0.
        addr: u64,
        /// Number of pages.
        npages: u32,
        /// Offset of the first byte within the first page (memory regions
        /// only; 0 for queue buffers).
        first_page_offset: u32,
        /// log2 of the page size; the page size must be set in `page_size_cap`.
        page_shift: u32,
        /// One of [`PageListMode`].
        mode: u32,
    }
}

code_enum! {
    /// Where the page addresses of a [`BufferDesc`] are.
    pub enum PageListMode {
        /// `npages` little-endian u64 page addresses follow the fixed part.
        INLINE = 1,
        /// `ceil(npages / 512)` u64 addresses of list pages follow the fixed
        /// part; each list page is a 4096-byte, 4096-aligned guest page of
        /// 512 u64 page addresses (the last one partly used).
        INDIRECT = 2,
        /// The pages are consecutive from `addr`; nothing follows.
        CONTIGUOUS = 3,
    }
}

/// Bytes of one indirect list page.
pub const LIST_PAGE_SIZE: u64 = 4096;
/// Page addresses held by one indirect list page.
pub const LIST_PAGE_ENTRIES: u64 = LIST_PAGE_SIZE / 8;
/// Smallest allowed `page_shift`.
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest allowed `page_shift`.
pub const MAX_PAGE_SHIFT: u32 = 30;

/// Size in bytes of a doorbell record (its address must be aligned to it).
pub const DB_RECORD_SIZE: u64 = 128;
/// Size in bytes of one completion queue entry.
pub const CQE_SIZE: u32 = 32;
/// Size of the fixed header of a send WQE.
pub const SEND_WQE_HEADER: u32 = 64;
/// Size of the fixed header of a receive WQE.
pub const RECV_WQE_HEADER: u32 = 16;
/// Size of one scatter/gather entry.
pub const SGE_SIZE: u32 = 16;

/// Number of list pages an `INDIRECT` page list of `npages` pages uses.
pub const fn indirect_list_pages(npages: u32) -> u64 {
    (npages as u64).div_ceil(LIST_PAGE_ENTRIES)
}

fn ceil_log2(v: u64) -> u32 {
    // Past 2^63 the next power of two is 2^64.
    v.checked_next_power_of_two()
        .map_or(u64::BITS, u64::trailing_zeros)
}

/// log2 of the send WQE stride for the given capabilities:
/// the smallest power of two, at least 64, that holds the 64-byte header and
/// `max(max_send_sge, ceil(max_inline_data / 16))` 16-byte slots.
pub fn send_wqe_shift(max_send_sge: u32, max_inline_data: u32) -> u32 {
    let slots =
        u64::from(max_send_sge).max(u64::from(max_inline_data).div_ceil(u64::from(SGE_SIZE)));
    // Cannot saturate: slots < 2^32, so at most 64 + 2^36 bytes.
    ceil_log2(u64::from(SEND_WQE_HEADER).saturating_add(slots.saturating_mul(u64::from(SGE_SIZE))))
        .max(6)
}

/// log2 of the receive WQE stride: the smallest power of two, at least 32,
/// that holds the 16-byte header and `max_recv_sge` 16-byte entries.
pub fn recv_wqe_shift(max_recv_sge: u32) -> u32 {
    ceil_log2(
        u64::from(RECV_WQE_HEADER)
            .saturating_add(u64::from(max_recv_sge).saturating_mul(u64::from(SGE_SIZE))),
    )
    .max(5)
}

/// Byte layout of a QP's queue buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpBufferLayout {
    /// log2 of the send WQE stride.
    pub sq_wqe_shift: u32,
    /// log2 of the receive WQE stride.
    pub rq_wqe_shift: u32,
    /// Offset of the receive ring (0 when the QP has no receive ring).
    pub rq_offset: u64,
    /// Total bytes the buffer must cover.
    pub total: u64,
}

/// Computes a QP buffer layout: the send ring at offset 0, the receive ring
/// at the first page boundary after it.
pub fn qp_buffer_layout(
    sq_depth: u32,
    rq_depth: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
    page_shift: u32,
) -> QpBufferLayout {
    let sq_wqe_shift = send_wqe_shift(max_send_sge, max_inline_data);
    let rq_wqe_shift = recv_wqe_shift(max_recv_sge);
    let sq_bytes = u64::from(sq_depth) << sq_wqe_shift;
    let rq_bytes = u64::from(rq_depth) << rq_wqe_shift;
    let page = 1u64 << page_shift.min(63);
    let rq_offset = if rq_depth == 0 {
        0
    } else {
        sq_bytes.div_ceil(page).saturating_mul(page)
    };
    QpBufferLayout {
        sq_wqe_shift,
        rq_wqe_shift,
        rq_offset,
        // Saturated: a total no page list can cover is refused by the
        // caller's size check.
        total: rq_offset.max(sq_bytes).saturating_add(rq_bytes),
    }
}

/// Memory access flags (memory regions and QPs).
pub mod access {
    /// The device may write the memory on behalf of local work requests.
    pub const LOCAL_WRITE: u32 = 1 << 0;
    /// Remote peers may read the memory (RDMA READ).
    pub const REMOTE_READ: u32 = 1 << 1;
    /// Remote peers may write the memory (RDMA WRITE). Requires `LOCAL_WRITE`.
    pub const REMOTE_WRITE: u32 = 1 << 2;
    /// Remote peers may perform atomics on the memory. Requires `LOCAL_WRITE`.
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    /// Memory windows may be bound to the region (`F_MW`; MRs only).
    pub const MW_BIND: u32 = 1 << 4;
    /// Every flag of a QP's access, and of an MR's without `MW_BIND`.
    pub const ALL: u32 = LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC;
    /// The remote rights: what a memory window grants.
    pub const REMOTE: u32 = REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides() {
        assert_eq!(send_wqe_shift(1, 0), 7); // 64 + 16 = 80 -> 128
        assert_eq!(send_wqe_shift(0, 0), 6);
        assert_eq!(send_wqe_shift(4, 0), 7); // 128
        assert_eq!(send_wqe_shift(4, 256), 9); // 64 + 256 = 320 -> 512
        assert_eq!(recv_wqe_shift(1), 5);
        assert_eq!(recv_wqe_shift(2), 6); // 48 -> 64
        assert_eq!(recv_wqe_shift(0), 5);
    }

    #[test]
    fn qp_layout() {
        let l = qp_buffer_layout(64, 64, 2, 1, 0, 12);
        assert_eq!(l.sq_wqe_shift, 7);
        assert_eq!(l.rq_offset, 8192);
        assert_eq!(l.total, 8192 + 64 * 32);
        let l = qp_buffer_layout(1, 0, 1, 1, 0, 12);
        assert_eq!(l.rq_offset, 0);
        assert_eq!(l.total, 128);
        assert_eq!(indirect_list_pages(512), 1);
        assert_eq!(indirect_list_pages(513), 2);
        assert_eq!(indirect_list_pages(0), 0);
    }
}
