//! Objects of another context or PD (spec 9.3, MISMATCH), objects still in
//! use (spec 9.4, BUSY) and access flags that are not allowed (spec 10.5).

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{MrSpec, QpInit};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{AddressVector, QpAttr};

use crate::requests::{expect_modify, fresh_qp, rc_steps, M_ACCESS};
use crate::world::{gid, hostile, IOVA, LW, OWN_GID_INDEX};

// ===========================================================================
// Ownership (spec 9.3, MISMATCH) and dependencies (spec 9.4, BUSY).
// ===========================================================================

#[test]
fn qp_with_cq_of_another_context() {
    hostile(|w| {
        let b = w.base();
        let ctx2 = w.ok("CREATE_CTX", |v| v.create_ctx());
        let cq2 = w.ok("CREATE_CQ in ctx2", |v| v.create_cq(ctx2, 16));
        w.expect(
            "CREATE_QP, send CQ of another context",
            Status::MISMATCH,
            8,
            |v| {
                v.create_qp(&QpInit {
                    send_cq: cq2,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect(
            "CREATE_QP, recv CQ of another context",
            Status::MISMATCH,
            12,
            |v| {
                v.create_qp(&QpInit {
                    recv_cq: cq2,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect(
            "CREATE_QP, both CQs of another context",
            Status::MISMATCH,
            8,
            |v| v.create_qp(&QpInit::rc(b.pd, cq2)),
        );
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx2));
    });
}

#[test]
fn qp_with_srq_of_another_pd() {
    hostile(|w| {
        let b = w.base();
        let pd2 = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        let srq2 = w
            .ok("CREATE_SRQ on pd2", |v| v.create_srq(pd2, 16, 1, 0))
            .srq_handle;
        let srq_qp = |srq| QpInit {
            srq,
            rq_depth: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        w.expect("CREATE_QP, SRQ of another PD", Status::MISMATCH, 16, |v| {
            v.create_qp(&srq_qp(srq2))
        });
        // An SRQ of another context.
        let ctx3 = w.ok("CREATE_CTX", |v| v.create_ctx());
        let pd3 = w.ok("ALLOC_PD", |v| v.alloc_pd(ctx3));
        let srq3 = w
            .ok("CREATE_SRQ on pd3", |v| v.create_srq(pd3, 16, 1, 0))
            .srq_handle;
        w.expect(
            "CREATE_QP, SRQ of another context",
            Status::MISMATCH,
            16,
            |v| v.create_qp(&srq_qp(srq3)),
        );
        // On its own PD the SRQ works.
        let qp = w.ok("CREATE_QP with the SRQ of its PD", |v| {
            v.create_qp(&QpInit {
                pd: pd2,
                ..srq_qp(srq2)
            })
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(qp.handle)?;
            v.destroy_srq(srq2)?;
            v.dealloc_pd(pd2)?;
            v.destroy_ctx(ctx3)
        });
    });
}

#[test]
fn busy_dealloc_pd_with_dependents() {
    hostile(|w| {
        let b = w.base();
        let pd = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        let mr = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(pd, LW, IOVA, &p)));
        w.expect("DEALLOC_PD with an MR", Status::BUSY, 1, |v| {
            v.dealloc_pd(pd)
        });
        let av = AddressVector {
            dgid: gid(0),
            sgid_index: OWN_GID_INDEX,
            ..AddressVector::default()
        };
        let ah = w.ok("CREATE_AH", |v| v.create_ah(pd, av));
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 0))
            .srq_handle;
        let qp = w.ok("CREATE_QP", |v| v.create_qp(&QpInit::rc(pd, b.cq)));
        w.expect("DEALLOC_PD with MR, AH, SRQ, QP", Status::BUSY, 4, |v| {
            v.dealloc_pd(pd)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        w.ok("DESTROY_AH", |v| v.destroy_ah(ah));
        w.expect("DEALLOC_PD with SRQ, QP", Status::BUSY, 2, |v| {
            v.dealloc_pd(pd)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp.handle));
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));
        w.ok("DEALLOC_PD once free", |v| v.dealloc_pd(pd));
    });
}

#[test]
fn busy_destroy_cq_used_by_qp() {
    hostile(|w| {
        let b = w.base();
        let cq = w.ok("CREATE_CQ", |v| v.create_cq(b.ctx, 16));
        let q1 = w.ok("CREATE_QP on cq (send and recv)", |v| {
            v.create_qp(&QpInit::rc(b.pd, cq))
        });
        w.expect("DESTROY_CQ used twice by one QP", Status::BUSY, 2, |v| {
            v.destroy_cq(cq)
        });
        let q2 = w.ok("CREATE_QP on cq (send only)", |v| {
            v.create_qp(&QpInit {
                recv_cq: b.cq,
                ..QpInit::rc(b.pd, cq)
            })
        });
        w.expect("DESTROY_CQ used three times", Status::BUSY, 3, |v| {
            v.destroy_cq(cq)
        });
        w.expect("DESTROY_CQ of the baseline CQ", Status::BUSY, 3, |v| {
            v.destroy_cq(b.cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q1.handle));
        w.expect("DESTROY_CQ used once", Status::BUSY, 1, |v| {
            v.destroy_cq(cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q2.handle));
        w.ok("DESTROY_CQ once free", |v| v.destroy_cq(cq));
    });
}

#[test]
fn busy_destroy_srq_with_qp() {
    hostile(|w| {
        let b = w.base();
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let init = QpInit {
            srq,
            rq_depth: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        let q1 = w.ok("CREATE_QP on the SRQ", |v| v.create_qp(&init));
        w.expect("DESTROY_SRQ with one QP", Status::BUSY, 1, |v| {
            v.destroy_srq(srq)
        });
        let q2 = w.ok("CREATE_QP on the SRQ", |v| v.create_qp(&init));
        w.expect("DESTROY_SRQ with two QPs", Status::BUSY, 2, |v| {
            v.destroy_srq(srq)
        });
        let q = w.ok("QUERY_QP", |v| v.query_qp(q1.handle));
        assert_eq!(q.srq_handle, srq);
        w.ok("cleanup", |v| {
            v.destroy_qp(q1.handle)?;
            v.destroy_qp(q2.handle)?;
            v.destroy_srq(srq)
        });
    });
}

// ===========================================================================
// Access flags (spec 10.5).
// ===========================================================================

#[test]
fn mr_access_flag_violations() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        for (what, flags) in [
            ("REMOTE_WRITE without LOCAL_WRITE", access::REMOTE_WRITE),
            (
                "REMOTE_WRITE | REMOTE_READ without LOCAL_WRITE",
                access::REMOTE_WRITE | access::REMOTE_READ,
            ),
            ("REMOTE_ATOMIC without LOCAL_WRITE", access::REMOTE_ATOMIC),
            ("unknown bit 0x20", access::LOCAL_WRITE | 0x20),
            ("unknown bit 31", 1 << 31),
            ("every bit", u32::MAX),
        ] {
            w.expect(&format!("REG_MR, {what}"), Status::INVALID, 4, |v| {
                v.reg_mr(&MrSpec::new(pd, flags, IOVA, &p))
            });
        }
        // REMOTE_READ alone and REMOTE_ATOMIC with LOCAL_WRITE are fine.
        for flags in [
            access::REMOTE_READ,
            access::LOCAL_WRITE | access::REMOTE_ATOMIC,
        ] {
            let mr = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(pd, flags, IOVA, &p)));
            assert_ne!(mr.rkey, 0);
            w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        }
        // MW_BIND (F_MW) grants no access by itself; the rkey it has is
        // every region's with F_RESIZE (spec 12.10), granting nothing.
        let flags = access::LOCAL_WRITE | access::MW_BIND;
        let mr = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(pd, flags, IOVA, &p)));
        assert_ne!(mr.rkey, 0);
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
    });
}

#[test]
fn qp_access_flag_violations() {
    hostile(|w| {
        let qp = fresh_qp(w);
        let (mask, init) = rc_steps(w)[0];
        // LOCAL_WRITE is allowed on a QP (spec 10.5); unknown bits are not.
        for (what, flags) in [
            ("unknown bit 0x10", access::REMOTE_READ | 0x10),
            ("LOCAL_WRITE | unknown bit 0x10", access::LOCAL_WRITE | 0x10),
            ("every bit", u32::MAX),
        ] {
            expect_modify(
                w,
                &format!("RESET -> INIT, access {what}"),
                qp,
                mask,
                QpAttr {
                    access: flags,
                    ..init
                },
                Status::INVALID,
                M_ACCESS,
            );
        }
    });
}
