//! Page lists that name guest addresses outside RAM: holes, ends of regions,
//! overflowing and misaligned pages, bad list pages (spec 10.3 rules 10-12),
//! and bad doorbell records (spec 10.4).

use vhost_user_rdma_tests::guest_mem::{MIB, PAGE_SIZE};
use vhost_user_rdma_tests::verbs::QpInit;
use virtio_rdma_abi::ctrl::{Opcode, Status, DETAIL_DB_RECORD, DETAIL_LIST_PAGE};
use virtio_rdma_abi::mem::{PageListMode, DB_RECORD_SIZE};
use virtio_rdma_abi::verbs::*;
use vm_memory::GuestAddress;

use crate::requests::{cq_req, desc, inline, le64s, mr_req, pages, qp_req, region_end};
use crate::world::{hostile, TOP_PAGE};

#[test]
fn page_in_hole_between_regions() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[1] = w.a.mem().hole_gpa();
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect("REG_MR, page 1 in the hole", Status::BAD_ADDRESS, 1, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        // The same page in a CQ ring.
        let (mut cq, _) = cq_req(w, 128);
        let mut ring = pages(w, 1);
        ring[0] = w.a.mem().hole_gpa() + 16 * PAGE_SIZE;
        cq.buf = inline(1);
        w.expect(
            "CREATE_CQ, ring page in the hole",
            Status::BAD_ADDRESS,
            0,
            |v| v.create_cq_raw(&cq, &le64s(&ring)),
        );
    });
}

#[test]
fn page_past_end_of_ram() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[2] = region_end(w, 1);
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect(
            "REG_MR, page 2 past the end of RAM",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        p[2] = 1 << 52;
        w.expect(
            "REG_MR, page 2 far beyond RAM",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
    });
}

#[test]
fn page_address_overflows_u64() {
    hostile(|w| {
        // Aligned, but a + 4096 overflows 64 bits.
        let mut p = pages(w, 2);
        p[0] = TOP_PAGE;
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE, inline(2));
        w.expect(
            "REG_MR, page 0 at 2^64 - 4096",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // CONTIGUOUS: the page addresses themselves run past 2^64.
        let start = TOP_PAGE;
        let req = mr_req(
            w.base().pd,
            2 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 2, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS wrapping 2^64",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
    });
}

#[test]
fn contiguous_list_across_end_of_region0() {
    hostile(|w| {
        // Pages 0 and 1 are the last two pages of region 0; page 2 is the
        // first page of the hole.
        let start = region_end(w, 0) - 2 * PAGE_SIZE;
        let req = mr_req(
            w.base().pd,
            4 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 4, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS across the hole",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &[]),
        );
        // The same for a CQ ring of 4 pages (depth 512).
        let (mut cq, _) = cq_req(w, 512);
        cq.buf = desc(PageListMode::CONTIGUOUS, start, 4, 12);
        w.expect(
            "CREATE_CQ, CONTIGUOUS across the hole",
            Status::BAD_ADDRESS,
            2,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn large_page_crossing_end_of_region() {
    hostile(|w| {
        // One 512 MiB page at GPA 0: aligned, starts in RAM, but region 0
        // is only 256 MiB long.
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, 0, 1, 29),
        );
        w.expect(
            "REG_MR, 512 MiB page over the region end",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
        // A 512 MiB page at the start of region 1 (which is 256 MiB long).
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.buf.page_shift = 29;
        let region1 = w.a.mem().layout().regions[1].gpa;
        w.expect(
            "REG_MR, 512 MiB page over the end of region 1",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &le64s(&[region1])),
        );
    });
}

#[test]
fn misaligned_pages() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[1] += 0x800;
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect("REG_MR, page 1 misaligned", Status::BAD_ADDRESS, 1, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        // 4 KiB aligned but not 2 MiB aligned with 2 MiB pages.
        let big = w.a.mem().alloc(4 * MIB, 2 * MIB).unwrap().0;
        let mut req = mr_req(w.base().pd, 4 * MIB, inline(2));
        req.buf.page_shift = 21;
        w.expect(
            "REG_MR, 2 MiB page at a 4 KiB boundary",
            Status::BAD_ADDRESS,
            1,
            |v| v.reg_mr_raw(&req, &le64s(&[big, big + 2 * MIB + PAGE_SIZE])),
        );
        // CONTIGUOUS with a misaligned start (rule 10: detail 0).
        let req = mr_req(
            w.base().pd,
            2 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, big + 8, 2, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS addr misaligned",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
    });
}

#[test]
fn indirect_list_page_outside_ram() {
    hostile(|w| {
        let pd = w.base().pd;
        // 600 pages need two list pages.
        let backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        let lp0 = u64::from_le_bytes(list.tail[..8].try_into().unwrap());
        for (what, lp1) in [
            ("list page in the hole", w.a.mem().hole_gpa()),
            ("list page past the end of RAM", region_end(w, 1)),
            ("list page misaligned", lp0 + 8),
            ("list page overflowing", TOP_PAGE),
        ] {
            w.expect(what, Status::BAD_ADDRESS, DETAIL_LIST_PAGE, |v| {
                v.reg_mr_raw(&req, &le64s(&[lp0, lp1]))
            });
        }
        // The intact list registers fine.
        let mr = w.ok("REG_MR with the intact list", |v| {
            v.reg_mr_raw(&req, &list.tail)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
    });
}

#[test]
fn indirect_entry_outside_ram() {
    hostile(|w| {
        let pd = w.base().pd;
        let mut backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        // Entry 519 = entry 7 of the second list page.
        backing[519] = GuestAddress(w.a.mem().hole_gpa());
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        w.expect(
            "REG_MR, list entry 519 in the hole",
            Status::BAD_ADDRESS,
            519,
            |v| v.reg_mr_raw(&req, &list.tail),
        );
    });
}

#[test]
fn doorbell_record_bad() {
    hostile(|w| {
        let hole = w.a.mem().hole_gpa();
        let end = region_end(w, 1);
        for (what, db) in [
            ("doorbell misaligned", None),
            ("doorbell in the hole", Some(hole)),
            ("doorbell past the end of RAM", Some(end)),
            (
                "doorbell overflowing",
                Some(TOP_PAGE + (PAGE_SIZE - DB_RECORD_SIZE)),
            ),
        ] {
            let (mut cq, tail) = cq_req(w, 64);
            cq.db_gpa = db.unwrap_or(cq.db_gpa + 8);
            w.expect(
                &format!("CREATE_CQ, {what}"),
                Status::BAD_ADDRESS,
                DETAIL_DB_RECORD,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
        // The context's doorbell header (spec 12.4): 64-byte aligned, in RAM.
        for (what, db) in [
            ("misaligned", 8),
            ("in the hole", hole),
            ("past the end of RAM", end),
            ("overflowing", u64::MAX - 63),
        ] {
            w.expect(
                &format!("CREATE_CTX, doorbell header {what}"),
                Status::BAD_ADDRESS,
                DETAIL_DB_RECORD,
                |v| v.create_ctx_at(db),
            );
        }
        let b = w.base();
        let (mut qp, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        qp.db_gpa = hole + DB_RECORD_SIZE;
        w.expect(
            "CREATE_QP, doorbell in the hole",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| v.create_qp_raw(&qp, &tail),
        );
        qp.db_gpa = region_end(w, 0) - 32;
        w.expect(
            "CREATE_QP, doorbell misaligned at the region end",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| v.create_qp_raw(&qp, &tail),
        );
        // SRQ: build a valid request by hand.
        let ring = w.va().alloc_ring(16 << 5).unwrap();
        let list = w
            .va()
            .page_list(&ring.pages, 12, PageListMode::INLINE)
            .unwrap();
        let srq = CreateSrqReq {
            pd_handle: b.pd,
            depth: 16,
            max_sge: 1,
            limit: 0,
            db_gpa: end,
            buf: list.desc,
        };
        w.expect(
            "CREATE_SRQ, doorbell past the end of RAM",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| {
                v.ctrl()
                    .call_typed::<_, CreateSrqResp>(Opcode::CREATE_SRQ, &srq, &list.tail)
            },
        );
    });
}
