//! Quotas and limits on a daemon with small limits (spec 9.5).

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::guest_mem::{MIB, PAGE_SIZE};
use vhost_user_rdma_tests::verbs::{MrSpec, QpInit};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::PageListMode;
use virtio_rdma_abi::verbs::*;

use crate::requests::{
    desc, fresh_qp, inline, le64s, mr_req, pages, CQ_BUF, MR_BUF, NPAGES, SHIFT,
};
use crate::world::{hostile_in, opts, World, IOVA, LW};

fn small_limits() -> Limits {
    Limits {
        max_ctx: 3,
        max_pd: 3,
        max_cq: 4,
        max_qp: 3,
        max_mr: 3,
        max_mr_bytes: 64 * 1024,
        // max_mr_pages = 1 MiB / 4 KiB + 1 = 257.
        max_mr_size: MIB,
        page_size_cap: (1 << 12) | (1 << 21),
        max_cqe: 65_536,
        max_inline_pages: 512,
        ..Limits::default()
    }
}

fn small_world() -> World {
    World::build(small_limits(), opts())
}

#[test]
fn quota_contexts_and_pds() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // A has 1 context and 1 PD; the quotas are 3 each.
        let ctxs: Vec<u32> = (0..2)
            .map(|_| w.ok("CREATE_CTX", |v| v.create_ctx()))
            .collect();
        w.expect("4th CREATE_CTX", Status::QUOTA, 1, |v| v.create_ctx());
        let pds: Vec<u32> = (0..2)
            .map(|_| w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx)))
            .collect();
        w.expect("4th ALLOC_PD", Status::QUOTA, 2, |v| v.alloc_pd(ctxs[0]));
        // B's quota is its own: it can still allocate.
        let b_ctx = w.b_base.ctx;
        w.b_ok("B: ALLOC_PD while A is at its quota", |v| {
            let pd = v.alloc_pd(b_ctx)?;
            v.dealloc_pd(pd)
        });
        // Freeing one gives the quota back.
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(pds[0]));
        let pd = w.ok("ALLOC_PD after a free", |v| v.alloc_pd(b.ctx));
        w.expect("ALLOC_PD at the quota again", Status::QUOTA, 2, |v| {
            v.alloc_pd(b.ctx)
        });
        w.ok("cleanup", |v| {
            v.dealloc_pd(pd)?;
            v.dealloc_pd(pds[1])?;
            v.destroy_ctx(ctxs[0])?;
            v.destroy_ctx(ctxs[1])
        });
    });
}

#[test]
fn quota_qps() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        let qpns = w.d.daemon().qpns_in_use();
        let q1 = fresh_qp(w);
        let q2 = fresh_qp(w);
        assert_eq!(w.d.daemon().qpns_in_use(), qpns + 2);
        // `expect` also checks that the refused create consumed no QPN.
        w.expect("4th CREATE_QP", Status::QUOTA, 4, |v| {
            v.create_qp(&QpInit::rc(b.pd, b.cq))
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q1));
        let q3 = fresh_qp(w);
        w.expect("CREATE_QP at the quota again", Status::QUOTA, 4, |v| {
            v.create_qp(&QpInit::rc(b.pd, b.cq))
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(q2)?;
            v.destroy_qp(q3)
        });
        assert_eq!(w.d.daemon().qpns_in_use(), qpns);
    });
}

#[test]
fn quota_mrs() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        let m1 = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p)));
        let m2 = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p)));
        w.expect("4th REG_MR", Status::QUOTA, 5, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(m1.mr_handle));
        let m3 = w.ok("REG_MR after a free", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.ok("cleanup", |v| {
            v.dereg_mr(m2.mr_handle)?;
            v.dereg_mr(m3.mr_handle)
        });
    });
}

#[test]
fn quota_registered_bytes() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // A holds 4 KiB (baseline), B holds 4 KiB of its own; max_mr_bytes
        // is 64 KiB per VM.
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
        let p = w.a.mem().alloc_pages(14, PAGE_SIZE).unwrap();
        let big = w.ok("REG_MR 56 KiB", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.expect("REG_MR 8 KiB over max_mr_bytes", Status::QUOTA, 8, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        // Exactly up to the quota is fine (B's bytes do not count for A).
        let last = w.ok("REG_MR up to max_mr_bytes", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..1]))
        });
        assert_eq!(w.a_counts().registered_bytes, 64 * 1024);
        w.ok("DEREG_MR", |v| v.dereg_mr(last.mr_handle));
        w.expect("REG_MR 8 KiB, still over", Status::QUOTA, 8, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        // Deregistering gives the bytes back.
        w.ok("DEREG_MR 56 KiB", |v| v.dereg_mr(big.mr_handle));
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
        let m = w.ok("REG_MR 8 KiB after the free", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(m.mr_handle));
    });
}

#[test]
fn limits_npages_and_page_size_cap() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // max_mr_pages is 257: a CQ of depth 65536 needs 512 pages.
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.max_mr_pages, 257);
        let ring = w.a.mem().alloc(2 * MIB, PAGE_SIZE).unwrap();
        let db = w.a.mem().alloc(64, 64).unwrap();
        let cq = CreateCqReq {
            ctx_handle: b.ctx,
            depth: 65_536,
            db_gpa: db.0,
            buf: desc(PageListMode::CONTIGUOUS, ring.0, 512, 12),
        };
        w.expect(
            "CREATE_CQ, 512 pages > max_mr_pages",
            Status::RANGE,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &[]),
        );
        // In 2 MiB pages (allowed by page_size_cap) it is one page.
        let big = w.a.mem().alloc(2 * MIB, 2 * MIB).unwrap();
        let cq = CreateCqReq {
            buf: desc(PageListMode::CONTIGUOUS, big.0, 1, 21),
            ..cq
        };
        let h = w.ok("CREATE_CQ in one 2 MiB page", |v| v.create_cq_raw(&cq, &[]));
        w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
        // 8 KiB pages are in range but not in page_size_cap.
        let p = pages(w, 1);
        let mut req = mr_req(b.pd, PAGE_SIZE, inline(1));
        req.buf.page_shift = 13;
        w.expect(
            "REG_MR, 8 KiB pages not in page_size_cap",
            Status::INVALID,
            MR_BUF + SHIFT,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // MR length above the small max_mr_size.
        let list = le64s(&vec![p[0]; 257]);
        let req = mr_req(b.pd, MIB + PAGE_SIZE, inline(257));
        w.expect(
            "REG_MR, length max_mr_size + 4096",
            Status::RANGE,
            16,
            |v| v.reg_mr_raw(&req, &list),
        );
    });
}

/// Spec 10.3: rule 9 (`npages` is the count the buffer needs, INVALID)
/// comes before rule 4 (`npages` <= `max_mr_pages`, RANGE), so RANGE on
/// `npages` means "this buffer needs more pages than one list may have".
/// For a memory region that can only happen if `max_mr_pages` is too small
/// for a region of `max_mr_size` bytes: the device advertises enough for
/// one at any `first_page_offset`, so REG_MR never reports it, and a
/// count the length does not call for is INVALID.
///
/// Regression: `max_mr_pages` was `max_mr_size / 4096 + 1`, one page
/// short when `max_mr_size` is not a multiple of 4096; a region of the
/// largest size starting late in its first page got RANGE on `npages`
/// although its length was allowed.
#[test]
fn max_mr_pages_covers_the_largest_region_at_any_offset() {
    let limits = Limits {
        max_mr_size: MIB + 4095,
        ..Limits::default()
    };
    hostile_in(World::build(limits, opts()), |w| {
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.max_mr_size, MIB + 4095);
        // ceil((4095 + max_mr_size) / 4096)
        assert_eq!(dev.max_mr_pages, 258);
        let pd = w.base().pd;
        let p = pages(w, 1);
        let list = le64s(&vec![p[0]; 258]);
        let mut req = mr_req(pd, MIB + 4095, inline(258));
        req.buf.first_page_offset = 4095;
        let mr = w.ok("REG_MR of max_mr_size at offset 4095", |v| {
            v.reg_mr_raw(&req, &list)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        // More pages than max_mr_pages that the length does not need:
        // rule 9 fires first.
        let list = le64s(&vec![p[0]; 300]);
        let req = mr_req(pd, PAGE_SIZE, inline(300));
        w.expect(
            "REG_MR, 300 pages for one page of data",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &list),
        );
    });
}
