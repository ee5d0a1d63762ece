//! Helpers for tests of fast registration and the local DMA key
//! (`F_MEM_MGT`, spec 12.22, 18.27, 18.28): a buffer with an `ALLOC_MR`
//! region over it, and the `REG_MR`, `LOCAL_INV` and `SEND_WITH_INV` work
//! requests, posted through the reference driver.
//!
//! Test fixtures: they panic on any failure, with a message saying what
//! failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    DmaBuf, FastMr, FastReg, Payload, Qp, SendFlags, SendOp, SendWr, Sge, WorkCompletion,
};

use crate::dp::{ok, poll_one, Vm, GUARD};

/// A page-aligned buffer of guest pages with an `ALLOC_MR` region of as
/// many pages (`max_num_sg`), free until [`FastBuf::register`].
pub struct FastBuf {
    /// The memory (filled with [`GUARD`] at first).
    pub buf: Arc<DmaBuf>,
    /// The region.
    pub mr: FastMr,
}

impl FastBuf {
    /// `pages` 4 KiB pages on `vm` and a region for all of them.
    pub fn new(vm: &Vm, pages: usize) -> FastBuf {
        Self::with_room(vm, pages, u32::try_from(pages).expect("pages"))
    }

    /// `pages` 4 KiB pages on `vm` and a region for `max_num_sg` pages.
    pub fn with_room(vm: &Vm, pages: usize, max_num_sg: u32) -> FastBuf {
        let buf = Arc::new(vm.dev.alloc_dma(pages * 4096, 4096).expect("alloc DMA"));
        buf.fill(0, pages * 4096, GUARD).expect("fill buffer");
        let mr = FastMr::alloc(&vm.pd, max_num_sg).expect("ALLOC_MR");
        FastBuf { buf, mr }
    }

    /// The `REG_MR` of the whole buffer with `access` (next consumer
    /// byte), not posted.
    pub fn map(&mut self, acc: u32) -> FastReg {
        let len = self.buf.len();
        self.mr
            .map_buf(&self.buf, 0, len, acc)
            .expect("map the buffer")
    }

    /// Registers the whole buffer with every right through a signaled
    /// `REG_MR` on `q` (whose send CQ nothing else completes into
    /// meanwhile) and checks its completion. Returns the new key.
    pub fn register(&mut self, q: &Qp, wr_id: u64) -> u32 {
        let r = self.map(access::ALL);
        q.post_send(&[reg_wr(wr_id, r)]).expect("post REG_MR");
        let wc = poll_one(q.send_cq());
        ok(&wc, wr_id, WcOpcode::REG_MR);
        r.key
    }

    /// iova of byte `off` (of the registration [`FastBuf::map`] makes).
    pub fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    /// An SGE over `len` bytes at `off` under the region's current key.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        self.mr
            .sge(self.addr(off), u32::try_from(len).expect("SGE length"))
    }

    /// Reads `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.buf.to_vec(off, len).expect("read buffer")
    }

    /// Writes `data` at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(off, data).expect("write buffer");
    }
}

/// A signaled `REG_MR` work request.
pub fn reg_wr(wr_id: u64, r: FastReg) -> SendWr<'static> {
    SendWr::signaled(wr_id, SendOp::RegMr(r), &[])
}

/// A signaled `LOCAL_INV` of `key`.
pub fn inv_wr(wr_id: u64, key: u32) -> SendWr<'static> {
    SendWr::signaled(wr_id, SendOp::LocalInv { key }, &[])
}

/// A signaled `SEND_WITH_INV` of `sges` invalidating `key` at the
/// responder.
pub fn send_inv_wr(wr_id: u64, key: u32, sges: &[Sge]) -> SendWr<'_> {
    SendWr::signaled(wr_id, SendOp::SendWithInv { key }, sges)
}

/// `wr` unsignaled.
pub fn unsignaled(mut wr: SendWr<'_>) -> SendWr<'_> {
    wr.flags = SendFlags::NONE;
    wr
}

/// `wr` carrying `data` inline.
pub fn inline<'a>(mut wr: SendWr<'a>, data: &'a [u8]) -> SendWr<'a> {
    wr.payload = Payload::Inline(data);
    wr
}

/// Invalidates `key` through a signaled `LOCAL_INV` on `q` and checks its
/// completion.
pub fn invalidate(q: &Qp, wr_id: u64, key: u32) -> WorkCompletion {
    q.post_send(&[inv_wr(wr_id, key)]).expect("post LOCAL_INV");
    let wc = poll_one(q.send_cq());
    ok(&wc, wr_id, WcOpcode::LOCAL_INV);
    wc
}

/// Bits 31 to 8 of a key (what an `ALLOC_MR` region owns).
pub fn prefix(key: u32) -> u32 {
    key >> 8
}
