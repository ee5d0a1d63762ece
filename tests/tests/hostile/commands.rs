//! Absurd lengths, counts and values in command payloads: MR lengths and
//! offsets, CQ depths, and QP, SRQ and AH attributes out of their domains
//! (spec 12).

use vhost_user_rdma_tests::guest_mem::{MIB, PAGE_SIZE};
use vhost_user_rdma_tests::verbs::QpInit;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::mem::PageListMode;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::*;

use crate::requests::{cq_req, desc, inline, le64s, mr_req, pages, qp_req, FPO, MR_BUF, NPAGES};
use crate::world::{hostile, OWN_GID_INDEX};

#[test]
fn mr_length_zero() {
    hostile(|w| {
        // length 0 with first_page_offset 100 still needs exactly one page,
        // so only the length rule is broken.
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, 0, inline(1));
        req.buf.first_page_offset = 100;
        w.expect("REG_MR, length 0", Status::INVALID, 16, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
    });
}

#[test]
fn mr_length_over_max_mr_size() {
    hostile(|w| {
        // max_mr_size + 4 KiB in pages of 256 MiB, each the whole of
        // region 0 (pages may repeat): everything but the length is valid.
        let max = w.dev.max_mr_size;
        assert_eq!(
            max % (256 * MIB),
            0,
            "test assumes a max_mr_size in 256 MiB units"
        );
        assert!(max + PAGE_SIZE <= w.dev.max_mr_bytes);
        let length = max + PAGE_SIZE;
        let n = length.div_ceil(256 * MIB) as u32;
        let mut req = mr_req(w.base().pd, length, inline(n));
        req.buf.page_shift = 28;
        w.expect(
            "REG_MR, length max_mr_size + 4096",
            Status::RANGE,
            16,
            |v| v.reg_mr_raw(&req, &le64s(&vec![0; n as usize])),
        );
        // Exactly max_mr_size is accepted (and counted).
        let n = (max / (256 * MIB)) as u32;
        let mut req = mr_req(w.base().pd, max, inline(n));
        req.buf.page_shift = 28;
        let mr = w.ok("REG_MR, length max_mr_size", |v| {
            v.reg_mr_raw(&req, &le64s(&vec![0; n as usize]))
        });
        assert_eq!(w.a_counts().registered_bytes, max + PAGE_SIZE);
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
    });
}

/// Regression: the daemon reported the overflow of `iova + length` with
/// detail 8 (the offset of `iova`); spec 12.10 says INVALID, detail 16.
#[test]
fn mr_iova_plus_length_overflows() {
    hostile(|w| {
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.iova = u64::MAX - PAGE_SIZE + 1;
        w.expect("REG_MR, iova + length = 2^64", Status::INVALID, 16, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
    });
}

#[test]
fn mr_first_page_offset_and_npages_inconsistent() {
    hostile(|w| {
        let p = pages(w, 3);
        // first_page_offset must be below the page size.
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(2));
        req.buf.first_page_offset = PAGE_SIZE as u32;
        w.expect(
            "REG_MR, first_page_offset 4096",
            Status::INVALID,
            MR_BUF + FPO,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
        // 2 pages of data described by 3 pages.
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE, inline(3));
        w.expect(
            "REG_MR, one page too many",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // 2 pages + 1 byte described by 2 pages.
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE + 1, inline(2));
        w.expect(
            "REG_MR, one page too few",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
    });
}

#[test]
fn cq_depth_not_power_of_two() {
    hostile(|w| {
        for depth in [3, 100, 65535] {
            let (cq, tail) = cq_req(w, depth);
            w.expect(
                &format!("CREATE_CQ, depth {depth}"),
                Status::INVALID,
                4,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
    });
}

#[test]
fn cq_depth_over_max_cqe() {
    hostile(|w| {
        // depth 2 * max_cqe (a power of two) with a correct contiguous ring.
        let max = w.dev.max_cqe;
        let ctx = w.base().ctx;
        let bytes = 2 * u64::from(max) * 32;
        let ring = w.a.mem().alloc(bytes, PAGE_SIZE).unwrap();
        let db = w.a.mem().alloc(64, 64).unwrap();
        let cq = CreateCqReq {
            ctx_handle: ctx,
            depth: 2 * max,
            db_gpa: db.0,
            buf: desc(
                PageListMode::CONTIGUOUS,
                ring.0,
                (bytes / PAGE_SIZE) as u32,
                12,
            ),
        };
        w.expect("CREATE_CQ, depth 2 * max_cqe", Status::RANGE, 4, |v| {
            v.create_cq_raw(&cq, &[])
        });
        // max_cqe with the same memory is fine.
        let cq = CreateCqReq {
            depth: max,
            buf: desc(
                PageListMode::CONTIGUOUS,
                ring.0,
                (bytes / PAGE_SIZE / 2) as u32,
                12,
            ),
            ..cq
        };
        let h = w.ok("CREATE_CQ, depth max_cqe", |v| v.create_cq_raw(&cq, &[]));
        w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
    });
}

#[test]
fn create_qp_values_out_of_domain() {
    hostile(|w| {
        let b = w.base();
        let d = w.dev;
        let base = QpInit::rc(b.pd, b.cq);
        let with = |f: &dyn Fn(&mut QpInit)| {
            let mut i = base;
            f(&mut i);
            i
        };
        // Each request gets a ring of exactly the size its values need.
        let cases: [(&str, QpInit, Status, u32); 7] = [
            ("sq_depth 3", with(&|i| i.sq_depth = 3), Status::INVALID, 24),
            (
                "sq_depth 2 * max",
                with(&|i| i.sq_depth = 2 * d.max_qp_wr),
                Status::RANGE,
                24,
            ),
            ("rq_depth 3", with(&|i| i.rq_depth = 3), Status::INVALID, 28),
            (
                "rq_depth 2 * max",
                with(&|i| i.rq_depth = 2 * d.max_qp_wr),
                Status::RANGE,
                28,
            ),
            (
                "max_send_sge max + 1",
                with(&|i| i.max_send_sge = d.max_send_sge + 1),
                Status::RANGE,
                32,
            ),
            (
                "max_recv_sge max + 1",
                with(&|i| i.max_recv_sge = d.max_recv_sge + 1),
                Status::RANGE,
                36,
            ),
            (
                "max_inline_data max + 1",
                with(&|i| i.max_inline_data = d.max_inline_data + 1),
                Status::RANGE,
                40,
            ),
        ];
        for (what, init, status, detail) in cases {
            let (req, tail) = qp_req(w, &init);
            w.expect(&format!("CREATE_QP, {what}"), status, detail, |v| {
                v.create_qp_raw(&req, &tail)
            });
        }
        for (what, qp_type, flags, status, detail) in [
            ("qp_type 0", 0, 0, Status::INVALID, 4),
            // (qp_type 3, GSI, without F_GSI: hostile/gsi.rs.)
            // (qp_type 4, UC, is valid with F_UC.)
            // (qp_type 5 and 6, XRC_INI and XRC_TGT, are valid with
            // F_XRC: hostile/xrc.rs.)
            ("qp_type 7", 7, 0, Status::INVALID, 4),
            ("unknown flags", 1, 0x2, Status::INVALID, 20),
            ("unknown high flag", 1, 0x8000_0001, Status::INVALID, 20),
        ] {
            let (mut req, tail) = qp_req(w, &base);
            req.qp_type = qp_type;
            req.flags = flags;
            w.expect(&format!("CREATE_QP, {what}"), status, detail, |v| {
                v.create_qp_raw(&req, &tail)
            });
        }
        // A receive queue together with an SRQ.
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let (req, tail) = qp_req(w, &QpInit { srq, ..base });
        w.expect(
            "CREATE_QP, rq_depth 16 with an SRQ",
            Status::INVALID,
            28,
            |v| v.create_qp_raw(&req, &tail),
        );
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));
    });
}

/// Spec 12.12: `max_send_sge` 0 is accepted (a QP that posts only inline
/// or zero-length work requests, ABI version 2); the send stride is the one
/// of section 11.3 for 0 SGEs, and QUERY_QP reports the 0.
#[test]
fn create_qp_max_send_sge_zero() {
    hostile(|w| {
        let b = w.base();
        for (inline, shift) in [(0, 6), (64, 7)] {
            let init = QpInit {
                max_send_sge: 0,
                max_inline_data: inline,
                ..QpInit::rc(b.pd, b.cq)
            };
            let (req, tail) = qp_req(w, &init);
            let r = w.ok("CREATE_QP, max_send_sge 0", |v| {
                v.create_qp_raw(&req, &tail)
            });
            assert_eq!(r.sq_wqe_shift, shift, "max_inline_data {inline}");
            let q = w.ok("QUERY_QP", |v| v.query_qp(r.qp_handle));
            assert_eq!(q.max_send_sge, 0);
            w.ok("DESTROY_QP", |v| v.destroy_qp(r.qp_handle));
        }
    });
}

/// Regression: the daemon accepted `max_recv_sge` 0 for a QP with its own
/// receive queue. Spec 12.12: INVALID, detail 36.
#[test]
fn create_qp_max_recv_sge_zero_without_srq() {
    hostile(|w| {
        let b = w.base();
        let init = QpInit {
            max_recv_sge: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        let (req, tail) = qp_req(w, &init);
        w.expect(
            "CREATE_QP, max_recv_sge 0 without SRQ",
            Status::INVALID,
            36,
            |v| v.create_qp_raw(&req, &tail),
        );
        // With an SRQ, 0 is allowed.
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let init = QpInit {
            srq,
            rq_depth: 0,
            ..init
        };
        let qp = w.ok("CREATE_QP, max_recv_sge 0 with an SRQ", |v| {
            v.create_qp(&init)
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(qp.handle)?;
            v.destroy_srq(srq)
        });
    });
}

#[test]
fn srq_and_ah_values_out_of_domain() {
    hostile(|w| {
        let pd = w.base().pd;
        let d = w.dev;
        for (what, depth, max_sge, limit, status, detail) in [
            ("depth 3", 3, 1, 0, Status::INVALID, 4),
            ("depth 2 * max", 2 * d.max_srq_wr, 1, 0, Status::RANGE, 4),
            ("max_sge 0", 16, 0, 0, Status::INVALID, 8),
            (
                "max_sge max + 1",
                16,
                d.max_recv_sge + 1,
                0,
                Status::RANGE,
                8,
            ),
            ("limit = depth", 16, 1, 16, Status::RANGE, 12),
        ] {
            w.expect(&format!("CREATE_SRQ, {what}"), status, detail, |v| {
                v.create_srq(pd, depth, max_sge, limit)
            });
        }
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 4))
            .srq_handle;
        for (what, mask, limit, status, detail) in [
            ("mask 0", 0, 1, Status::INVALID, 0),
            ("unknown mask bit", 0x2 | 0x4, 1, Status::INVALID, 0x4),
            // With F_RESIZE, SRQ_ATTR_MAX_WR needs the longer request
            // (spec 12.19); the version 2 form is too short.
            ("MAX_WR", 0x1, 1, Status::INVALID, 40),
            ("limit = depth", 0x2, 16, Status::RANGE, 12),
        ] {
            w.expect(&format!("MODIFY_SRQ, {what}"), status, detail, |v| {
                v.modify_srq(srq, mask, 32, limit)
            });
        }
        let q = w.ok("QUERY_SRQ", |v| v.query_srq(srq));
        assert_eq!(
            (q.depth, q.max_sge, q.limit),
            (16, 1, 4),
            "failed MODIFY_SRQs changed the SRQ"
        );
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));

        let av = AddressVector {
            sgid_index: OWN_GID_INDEX,
            ..AddressVector::default()
        };
        for (what, port, av, status, detail) in [
            ("port 2", 2, av, Status::RANGE, 4),
            (
                "flow_label 2^20",
                1,
                AddressVector {
                    flow_label: 1 << 20,
                    ..av
                },
                Status::INVALID,
                24,
            ),
            (
                "sgid_index 16 (past the table)",
                1,
                AddressVector {
                    sgid_index: 16,
                    ..av
                },
                Status::RANGE,
                28,
            ),
            (
                "sgid_index 0 (the default GID, unassigned without a MAC)",
                1,
                AddressVector {
                    sgid_index: 0,
                    ..av
                },
                Status::INVALID,
                28,
            ),
            (
                "sgid_index 2 (unassigned)",
                1,
                AddressVector {
                    sgid_index: 2,
                    ..av
                },
                Status::INVALID,
                28,
            ),
            (
                "sl 16",
                1,
                AddressVector { sl: 16, ..av },
                Status::INVALID,
                31,
            ),
        ] {
            let req = CreateAhReq {
                pd_handle: pd,
                port,
                av,
            };
            w.expect(&format!("CREATE_AH, {what}"), status, detail, |v| {
                v.ctrl()
                    .call_typed::<_, AhHandleResp>(Opcode::CREATE_AH, &req, &[])
            });
        }
        w.expect("QUERY_PORT 2", Status::RANGE, 0, |v| v.query_port(2));
        w.expect("QUERY_PORT 0", Status::RANGE, 0, |v| v.query_port(0));
        w.expect("QUERY_GID index 16", Status::RANGE, 4, |v| {
            v.query_gid(1, 16)
        });
        w.expect("QUERY_GID port 2", Status::RANGE, 0, |v| v.query_gid(2, 0));
    });
}
