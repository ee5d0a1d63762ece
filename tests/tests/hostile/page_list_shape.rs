//! The shape of a memory description: page counts against the length, page
//! sizes, list modes and queue buffers (spec 10.1-10.3 rules 1-9).

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{status_of, QpInit};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::PageListMode;

use crate::requests::{
    cq_req, desc, inline, le64s, mr_req, pages, qp_req, ADDR, CQ_BUF, FPO, MODE, MR_BUF, NPAGES,
    QP_BUF, REG_MR_SIZE, SHIFT,
};
use crate::world::hostile;

#[test]
fn page_list_too_short() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = pages(w, 3);
        let req = mr_req(pd, 3 * PAGE_SIZE, inline(3));
        // INVALID, detail = the expected payload size (48 + 3 * 8).
        w.expect(
            "INLINE list with 2 of 3 entries",
            Status::INVALID,
            REG_MR_SIZE + 24,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
        w.expect(
            "INLINE list with 7 bytes of the third entry",
            Status::INVALID,
            REG_MR_SIZE + 24,
            |v| v.reg_mr_raw(&req, &le64s(&p)[..23]),
        );
        // INDIRECT: 600 pages need 2 list page addresses; give 1.
        let backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        w.expect(
            "INDIRECT directory too short",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &list.tail[..8]),
        );
        // A CQ ring list: CreateCqReq is 40 bytes, one entry expected.
        let (cq, _) = cq_req(w, 64);
        w.expect(
            "CREATE_CQ, INLINE list missing",
            Status::INVALID,
            40 + 8,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn page_list_trailing_garbage() {
    hostile(|w| {
        let pd = w.base().pd;
        let mut p = pages(w, 2);
        let req = mr_req(pd, 2 * PAGE_SIZE, inline(2));
        p.push(0xdead_b000);
        w.expect(
            "INLINE list with an extra entry",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        let mut bytes = le64s(&p[..2]);
        bytes.push(0);
        w.expect(
            "INLINE list with one extra byte",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &bytes),
        );
        let start = p[0];
        let req = mr_req(pd, PAGE_SIZE, desc(PageListMode::CONTIGUOUS, start, 1, 12));
        w.expect(
            "CONTIGUOUS followed by bytes",
            Status::INVALID,
            REG_MR_SIZE,
            |v| v.reg_mr_raw(&req, &le64s(&[start])),
        );
    });
}

#[test]
fn npages_zero() {
    hostile(|w| {
        let req = mr_req(w.base().pd, PAGE_SIZE, inline(0));
        w.expect(
            "REG_MR, INLINE npages 0",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &[]),
        );
        let start = pages(w, 1)[0];
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 0, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS npages 0",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &[]),
        );
        let (mut cq, _) = cq_req(w, 64);
        cq.buf.npages = 0;
        w.expect(
            "CREATE_CQ, npages 0",
            Status::INVALID,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn npages_absurd() {
    hostile(|w| {
        // npages = 2^32 - 1 with CONTIGUOUS (no list to send). This breaks
        // rule 4 (npages <= max_mr_pages: RANGE) and rule 9 (npages must
        // match the length: INVALID), both with detail B + 8; spec 7.5
        // lets the device report either (the SHOULD order of 10.3 checks
        // rule 9 first and gives INVALID).
        let start = pages(w, 1)[0];
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, u32::MAX, 12),
        );
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let r = w.va().reg_mr_raw(&req, &[]);
        let got = status_of(&r);
        assert!(
            got == Some((Status::RANGE, MR_BUF + NPAGES))
                || got == Some((Status::INVALID, MR_BUF + NPAGES)),
            "REG_MR with npages 2^32-1: {r:?}"
        );
        w.assert_no_effect("npages 2^32-1", before, qpns, 1, 0);
        // A QP ring claiming 2^31 pages.
        let b = w.base();
        let (mut qp, _) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        qp.buf = desc(PageListMode::CONTIGUOUS, start, 1 << 31, 12);
        let before = w.a_stats();
        let r = w.va().create_qp_raw(&qp, &[]);
        let got = status_of(&r);
        assert!(
            got == Some((Status::RANGE, QP_BUF + NPAGES))
                || got == Some((Status::INVALID, QP_BUF + NPAGES)),
            "CREATE_QP with npages 2^31: {r:?}"
        );
        w.assert_no_effect("QP npages 2^31", before, qpns, 1, 0);
    });
}

#[test]
fn inline_list_over_max_inline_pages() {
    hostile(|w| {
        // max_inline_pages + 1 entries (the same page repeated, which is
        // allowed) with a consistent length.
        let max = w.dev.max_inline_pages;
        let n = max + 1;
        let p = pages(w, 1);
        let list = le64s(&vec![p[0]; n as usize]);
        let req = mr_req(w.base().pd, u64::from(n) * PAGE_SIZE, inline(n));
        w.expect(
            "REG_MR, max_inline_pages + 1 inline pages",
            Status::RANGE,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &list),
        );
        // max_inline_pages is fine.
        let req = mr_req(w.base().pd, u64::from(max) * PAGE_SIZE, inline(max));
        let mr = w.ok("REG_MR, max_inline_pages inline pages", |v| {
            v.reg_mr_raw(&req, &list[..max as usize * 8])
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
    });
}

#[test]
fn page_shift_out_of_range() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = pages(w, 2);
        // npages is consistent with the (invalid) page size where one exists.
        for (shift, npages) in [(11, 2), (0, 1), (31, 1), (63, 1), (64, 1), (u32::MAX, 1)] {
            let mut req = mr_req(pd, PAGE_SIZE, inline(npages));
            req.buf.page_shift = shift;
            w.expect(
                &format!("REG_MR, page_shift {shift}"),
                Status::INVALID,
                MR_BUF + SHIFT,
                |v| v.reg_mr_raw(&req, &le64s(&p[..npages as usize])),
            );
        }
        for shift in [11, 31, 64] {
            let (mut cq, tail) = cq_req(w, 64);
            cq.buf.page_shift = shift;
            w.expect(
                &format!("CREATE_CQ, page_shift {shift}"),
                Status::INVALID,
                CQ_BUF + SHIFT,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
    });
}

/// Regression: the daemon computed the QP buffer layout with the guest's
/// page_shift and reported RANGE, detail 24 (`sq_depth`), before the page
/// list rules ran. Spec 10.3 rule 2: INVALID, detail B + 16 = 72.
#[test]
fn qp_page_shift_out_of_range() {
    hostile(|w| {
        let b = w.base();
        for shift in [11, 31, 32, 40, 63] {
            let (mut qp, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
            qp.buf.page_shift = shift;
            w.expect(
                &format!("CREATE_QP, page_shift {shift}"),
                Status::INVALID,
                QP_BUF + SHIFT,
                |v| v.create_qp_raw(&qp, &tail),
            );
        }
    });
}

#[test]
fn unknown_page_list_mode() {
    hostile(|w| {
        let p = pages(w, 1);
        for mode in [0, 4, 0x8000_0001, u32::MAX] {
            let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
            req.buf.mode = mode;
            w.expect(
                &format!("REG_MR, mode {mode:#x}"),
                Status::INVALID,
                MR_BUF + MODE,
                |v| v.reg_mr_raw(&req, &le64s(&p)),
            );
        }
        let (mut cq, tail) = cq_req(w, 64);
        cq.buf.mode = 7;
        w.expect("CREATE_CQ, mode 7", Status::INVALID, CQ_BUF + MODE, |v| {
            v.create_cq_raw(&cq, &tail)
        });
    });
}

#[test]
fn addr_not_zero_for_list_modes() {
    hostile(|w| {
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.buf.addr = p[0];
        w.expect(
            "REG_MR, INLINE with addr",
            Status::INVALID,
            MR_BUF + ADDR,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
    });
}

#[test]
fn queue_buffer_shape_errors() {
    hostile(|w| {
        // first_page_offset must be 0 for a queue buffer.
        let (mut cq, tail) = cq_req(w, 64);
        cq.buf.first_page_offset = 64;
        w.expect(
            "CREATE_CQ, first_page_offset 64",
            Status::INVALID,
            CQ_BUF + FPO,
            |v| v.create_cq_raw(&cq, &tail),
        );
        // npages must be exactly what the ring needs: depth 64 -> 1 page.
        let (mut cq, mut tail) = cq_req(w, 64);
        cq.buf.npages = 2;
        tail.extend_from_slice(&tail.clone());
        w.expect(
            "CREATE_CQ, one page too many",
            Status::INVALID,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &tail),
        );
    });
}
