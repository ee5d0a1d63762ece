//! Builders of requests, page lists and QPs in given states for the cases, and
//! the payload offsets the expected `detail` values name (spec 8.2, 10.3, 12).

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{rc_transitions, QpInit};
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, Status};
use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
use virtio_rdma_abi::qp::QpAttr;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::GuestAddress;

use crate::world::{gid, World, IOVA, LW, OWN_GID_INDEX};

// ---------------------------------------------------------------------------
// Offsets used in `detail` (payload offsets, spec chapters 10 and 12).
// ---------------------------------------------------------------------------

/// Offset of `buf` (the BufferDesc) in each request payload (spec 10.3, "B").
pub const CQ_BUF: u32 = 16;
pub const MR_BUF: u32 = 24;
pub const QP_BUF: u32 = 56;
/// Offsets of the BufferDesc fields.
pub const ADDR: u32 = 0;
pub const NPAGES: u32 = 8;
pub const FPO: u32 = 12;
pub const SHIFT: u32 = 16;
pub const MODE: u32 = 20;
/// Size of `RegMrReq` (the payload size reported for page-list length errors).
pub const REG_MR_SIZE: u32 = 48;
/// Offsets of `ModifyQpReq` attribute fields (8 + QpAttr offset; av at 80).
pub const M_ACCESS: u32 = 16;
pub const M_PKEY_INDEX: u32 = 20;
pub const M_PORT: u32 = 24;
pub const M_PATH_MTU: u32 = 32;
pub const M_TIMEOUT: u32 = 36;
pub const M_RETRY_CNT: u32 = 40;
pub const M_RNR_RETRY: u32 = 44;
pub const M_MIN_RNR_TIMER: u32 = 48;
pub const M_RQ_PSN: u32 = 52;
pub const M_SQ_PSN: u32 = 56;
pub const M_DEST_QPN: u32 = 60;
pub const M_MAX_RD_ATOMIC: u32 = 64;
pub const M_MAX_DEST_RD_ATOMIC: u32 = 68;
pub const M_EN_SQD: u32 = 72;
pub const M_AV_FLOW_LABEL: u32 = 96;
pub const M_AV_SGID_INDEX: u32 = 100;
pub const M_AV_SL: u32 = 103;

// ---------------------------------------------------------------------------
// Request builders.
// ---------------------------------------------------------------------------

pub fn desc(mode: PageListMode, addr: u64, npages: u32, page_shift: u32) -> BufferDesc {
    BufferDesc {
        addr,
        npages,
        first_page_offset: 0,
        page_shift,
        mode: mode.into(),
    }
}

pub fn inline(npages: u32) -> BufferDesc {
    desc(PageListMode::INLINE, 0, npages, 12)
}

pub fn le64s(addrs: &[u64]) -> Vec<u8> {
    addrs.iter().flat_map(|a| a.to_le_bytes()).collect()
}

/// A REG_MR request of `length` bytes on `pd` with local write access.
pub fn mr_req(pd: u32, length: u64, buf: BufferDesc) -> RegMrReq {
    RegMrReq {
        pd_handle: pd,
        access: LW,
        iova: IOVA,
        length,
        buf,
    }
}

/// `n` valid 4 KiB pages of VM A, as addresses.
pub fn pages(w: &World, n: usize) -> Vec<u64> {
    w.a.mem()
        .alloc_pages(n, PAGE_SIZE)
        .unwrap()
        .iter()
        .map(|p| p.0)
        .collect()
}

/// End of RAM region `i` of VM A.
pub fn region_end(w: &World, i: usize) -> u64 {
    w.a.mem().layout().regions[i].end()
}

/// A valid CREATE_CQ request of `depth` on A's baseline context, with an
/// inline page list.
pub fn cq_req(w: &mut World, depth: u32) -> (CreateCqReq, Vec<u8>) {
    let ctx = w.base().ctx;
    let v = w.va();
    let ring = v.alloc_ring(u64::from(depth) * 32).unwrap();
    let list = v.page_list(&ring.pages, 12, PageListMode::INLINE).unwrap();
    (
        CreateCqReq {
            ctx_handle: ctx,
            depth,
            db_gpa: ring.db.0,
            buf: list.desc,
        },
        list.tail,
    )
}

/// A valid CREATE_QP request for `init`, with freshly allocated rings.
pub fn qp_req(w: &mut World, init: &QpInit) -> (CreateQpReq, Vec<u8>) {
    w.va().qp_request(init).unwrap()
}

/// A fresh RC QP in RESET on A's baseline PD and CQ.
pub fn fresh_qp(w: &mut World) -> u32 {
    let b = w.base();
    w.ok("create QP", |v| v.create_qp(&QpInit::rc(b.pd, b.cq)))
        .handle
}

/// The RC transitions RESET -> INIT, INIT -> RTR, RTR -> RTS towards B.
pub fn rc_steps(w: &World) -> [(u32, QpAttr); 3] {
    rc_transitions(w.b_base.qp.qpn, gid(1), OWN_GID_INDEX)
}

/// A fresh RC QP moved through the first `n` transitions (0: RESET,
/// 1: INIT, 2: RTR, 3: RTS).
pub fn qp_in(w: &mut World, n: usize) -> u32 {
    let qp = fresh_qp(w);
    for (mask, a) in rc_steps(w).into_iter().take(n) {
        w.ok("modify QP", |v| v.modify_qp(qp, mask, &a));
    }
    qp
}

/// MODIFY_QP that must fail with `status` / `detail` and leave the QP
/// exactly as it was (all-or-nothing).
pub fn expect_modify(
    w: &mut World,
    what: &str,
    qp: u32,
    mask: u32,
    a: QpAttr,
    status: Status,
    detail: u32,
) {
    let before = w.ok("query QP", |v| v.query_qp(qp));
    w.expect(what, status, detail, |v| v.modify_qp(qp, mask, &a));
    let after = w.ok("query QP", |v| v.query_qp(qp));
    assert_eq!(after, before, "{what}: the failed MODIFY_QP changed the QP");
}

/// A valid CREATE_CTX payload: a fresh context doorbell header in VM A.
pub fn new_ctx_req(w: &World) -> Vec<u8> {
    let db_gpa = w.a.mem().alloc(64, 64).unwrap().0;
    CreateCtxReq { db_gpa }.to_bytes()
}

/// Writes a request (header with request id 0xABCD, then `payload`) into a
/// fresh page of A and returns its address and length.
pub fn raw_request(w: &World, opcode: Opcode, payload: &[u8]) -> (GuestAddress, u32) {
    let mem = w.a.mem();
    let mut bytes = RequestHeader {
        request_id: 0xABCD,
        opcode: opcode.into(),
        reserved: 0,
    }
    .to_bytes();
    bytes.extend_from_slice(payload);
    let gpa = mem.alloc(bytes.len() as u64, PAGE_SIZE).unwrap();
    mem.write(gpa, &bytes).unwrap();
    (gpa, bytes.len() as u32)
}

/// A fresh device-writable page of A.
pub fn resp_buf(w: &World) -> GuestAddress {
    w.a.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap()
}
