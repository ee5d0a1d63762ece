//! Handles that do not resolve: stale, zero, garbage, another VM's and of the
//! wrong kind (spec 9.1).

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{MrSpec, QpInit};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::qp::{AddressVector, QpState};

use crate::requests::{fresh_qp, inline, le64s, mr_req, pages, rc_steps};
use crate::world::{hostile, IOVA, RW};

#[test]
fn stale_handles_after_destroy() {
    hostile(|w| {
        let b = w.base();
        let p = pages(w, 1);
        // A PD, freed, its slot reused.
        let old_pd = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(old_pd));
        let new_pd = w.ok("ALLOC_PD again", |v| v.alloc_pd(b.ctx));
        assert_ne!(new_pd, old_pd, "a handle value was reused at once");
        w.expect("DEALLOC_PD of a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(old_pd)
        });
        let req = mr_req(old_pd, PAGE_SIZE, inline(1));
        w.expect("REG_MR on a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        w.expect("CREATE_QP on a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.create_qp(&QpInit::rc(old_pd, b.cq))
        });
        // The new PD is intact.
        let mr = w.ok("REG_MR on the new PD", |v| {
            v.reg_mr_raw(&mr_req(new_pd, PAGE_SIZE, inline(1)), &le64s(&p))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        w.expect("DEREG_MR twice", Status::BAD_HANDLE, 0, |v| {
            v.dereg_mr(mr.mr_handle)
        });
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(new_pd));

        // A QP, destroyed, its slot reused.
        let old_qp = fresh_qp(w);
        w.ok("DESTROY_QP", |v| v.destroy_qp(old_qp));
        let new_qp = fresh_qp(w);
        assert_ne!(new_qp, old_qp);
        w.expect("QUERY_QP of a destroyed QP", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(old_qp)
        });
        let (mask, a) = rc_steps(w)[0];
        w.expect("MODIFY_QP of a destroyed QP", Status::BAD_HANDLE, 0, |v| {
            v.modify_qp(old_qp, mask, &a)
        });
        w.expect("DESTROY_QP twice", Status::BAD_HANDLE, 0, |v| {
            v.destroy_qp(old_qp)
        });
        let q = w.ok("QUERY_QP of the new QP", |v| v.query_qp(new_qp));
        assert_eq!(q.attr.qp_state, u32::from(QpState::RESET));
        w.ok("DESTROY_QP", |v| v.destroy_qp(new_qp));

        // A whole context: its objects' handles die with it.
        let ctx = w.ok("CREATE_CTX", |v| v.create_ctx());
        let pd = w.ok("ALLOC_PD", |v| v.alloc_pd(ctx));
        let cq = w.ok("CREATE_CQ", |v| v.create_cq(ctx, 16));
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        w.expect(
            "ALLOC_PD in a destroyed context",
            Status::BAD_HANDLE,
            0,
            |v| v.alloc_pd(ctx),
        );
        w.expect(
            "DEALLOC_PD of a destroyed context's PD",
            Status::BAD_HANDLE,
            0,
            |v| v.dealloc_pd(pd),
        );
        w.expect(
            "DESTROY_CQ of a destroyed context's CQ",
            Status::BAD_HANDLE,
            0,
            |v| v.destroy_cq(cq),
        );
        w.expect("DESTROY_CTX twice", Status::BAD_HANDLE, 0, |v| {
            v.destroy_ctx(ctx)
        });
    });
}

#[test]
fn handle_zero_and_garbage_handles() {
    hostile(|w| {
        let b = w.base();
        let p = pages(w, 1);
        for h in [0, u32::MAX, 0x000f_ffff, 0xfff0_0000] {
            w.expect(
                &format!("ALLOC_PD ctx {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.alloc_pd(h),
            );
            w.expect(&format!("DESTROY_CTX {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_ctx(h)
            });
            w.expect(
                &format!("CREATE_CQ ctx {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_cq(h, 16),
            );
            w.expect(&format!("REG_MR pd {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.reg_mr_raw(&mr_req(h, PAGE_SIZE, inline(1)), &le64s(&p))
            });
            w.expect(
                &format!("CREATE_QP pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_qp(&QpInit::rc(h, b.cq)),
            );
            w.expect(
                &format!("CREATE_QP send_cq {h:#x}"),
                Status::BAD_HANDLE,
                8,
                |v| {
                    v.create_qp(&QpInit {
                        send_cq: h,
                        ..QpInit::rc(b.pd, b.cq)
                    })
                },
            );
            w.expect(
                &format!("CREATE_QP recv_cq {h:#x}"),
                Status::BAD_HANDLE,
                12,
                |v| {
                    v.create_qp(&QpInit {
                        recv_cq: h,
                        ..QpInit::rc(b.pd, b.cq)
                    })
                },
            );
            w.expect(&format!("QUERY_QP {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.query_qp(h)
            });
            w.expect(&format!("DESTROY_QP {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_qp(h)
            });
            w.expect(&format!("DEREG_MR {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.dereg_mr(h)
            });
            w.expect(&format!("DESTROY_CQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_cq(h)
            });
            w.expect(&format!("DEALLOC_PD {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.dealloc_pd(h)
            });
            w.expect(
                &format!("CREATE_AH pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_ah(h, AddressVector::default()),
            );
            w.expect(&format!("DESTROY_AH {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_ah(h)
            });
            w.expect(&format!("QUERY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.query_srq(h)
            });
            w.expect(&format!("MODIFY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.modify_srq(h, 0x2, 0, 0)
            });
            w.expect(&format!("DESTROY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_srq(h)
            });
            w.expect(
                &format!("CREATE_SRQ pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_srq(h, 16, 1, 0),
            );
        }
        // A non-zero srq_handle that names nothing.
        w.expect("CREATE_QP srq 0xfff00000", Status::BAD_HANDLE, 16, |v| {
            v.create_qp(&QpInit {
                srq: 0xfff0_0000,
                rq_depth: 0,
                ..QpInit::rc(b.pd, b.cq)
            })
        });
    });
}

#[test]
fn handles_of_another_vm() {
    hostile(|w| {
        let a = w.base();
        // Objects of B in slots A does not use: A holds exactly one object of
        // each kind (its baseline), so these values name nothing in A.
        let bb = w.b_base;
        let (b_ctx, b_pd, b_cq, b_qp, b_mr) = w.b_ok("B's extra objects", |v| {
            let ctx = v.create_ctx()?;
            let pd = v.alloc_pd(ctx)?;
            let cq = v.create_cq(ctx, 16)?;
            let qp = v.create_qp(&QpInit::rc(pd, cq))?;
            let pages = v.mem().alloc_pages(1, PAGE_SIZE)?;
            let mr = v.reg_mr(&MrSpec::new(pd, RW, IOVA, &pages))?;
            Ok((ctx, pd, cq, qp, mr.mr_handle))
        });
        for (kind, theirs, ours) in [
            ("ctx", b_ctx, a.ctx),
            ("pd", b_pd, a.pd),
            ("cq", b_cq, a.cq),
            ("qp", b_qp.handle, a.qp.handle),
            ("mr", b_mr, a.mr),
        ] {
            assert_ne!(
                theirs, ours,
                "B's {kind} handle equals A's: the test cannot tell them apart"
            );
        }
        let b_qp_before = w.b_ok("QUERY_QP", |v| v.query_qp(b_qp.handle));
        w.snapshot_b();
        let p = pages(w, 1);
        let (mask, init) = rc_steps(w)[0];
        w.expect("A: ALLOC_PD in B's context", Status::BAD_HANDLE, 0, |v| {
            v.alloc_pd(b_ctx)
        });
        w.expect(
            "A: DESTROY_CTX of B's context",
            Status::BAD_HANDLE,
            0,
            |v| v.destroy_ctx(b_ctx),
        );
        w.expect("A: DEALLOC_PD of B's PD", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(b_pd)
        });
        w.expect("A: REG_MR on B's PD", Status::BAD_HANDLE, 0, |v| {
            v.reg_mr_raw(&mr_req(b_pd, PAGE_SIZE, inline(1)), &le64s(&p))
        });
        w.expect("A: CREATE_QP with B's CQ", Status::BAD_HANDLE, 8, |v| {
            v.create_qp(&QpInit {
                send_cq: b_cq,
                ..QpInit::rc(a.pd, a.cq)
            })
        });
        w.expect("A: DESTROY_CQ of B's CQ", Status::BAD_HANDLE, 0, |v| {
            v.destroy_cq(b_cq)
        });
        w.expect("A: QUERY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(b_qp.handle)
        });
        w.expect("A: MODIFY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.modify_qp(b_qp.handle, mask, &init)
        });
        w.expect("A: DESTROY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.destroy_qp(b_qp.handle)
        });
        w.expect("A: DEREG_MR of B's MR", Status::BAD_HANDLE, 0, |v| {
            v.dereg_mr(b_mr)
        });
        // B's objects are untouched and usable.
        let q = w.b_ok("QUERY_QP", |v| v.query_qp(b_qp.handle));
        assert_eq!(q, b_qp_before, "B's QP changed");
        w.b_ok("B uses and destroys its objects", |v| {
            v.modify_qp(b_qp.handle, mask, &init)?;
            v.dereg_mr(b_mr)?;
            v.destroy_qp(b_qp.handle)?;
            v.destroy_cq(b_cq)?;
            v.dealloc_pd(b_pd)?;
            v.destroy_ctx(b_ctx)
        });
        let q = w.b_ok("QUERY_QP of B's baseline QP", |v| v.query_qp(bb.qp.handle));
        assert_eq!(q, bb.qp_attrs);
        w.snapshot_b();
    });
}

#[test]
fn wrong_kind_of_handle() {
    hostile(|w| {
        let b = w.base();
        // A CQ handle and a QP handle whose values name no object of the
        // other kinds in A: three extra CQs (the last in a slot no other
        // table of A uses), and a QP whose slot was recycled once (a
        // generation no CQ of A has).
        let extra_cqs: Vec<u32> = (0..3)
            .map(|_| w.ok("CREATE_CQ", |v| v.create_cq(b.ctx, 16)))
            .collect();
        let cq = extra_cqs[2];
        let first = fresh_qp(w);
        w.ok("DESTROY_QP", |v| v.destroy_qp(first));
        let qp = fresh_qp(w);
        let c = w.a_counts();
        assert_eq!(
            (c.ctx, c.pd, c.cq, c.qp, c.mr, c.srq, c.ah),
            (1, 1, 4, 2, 1, 0, 0)
        );
        let live_cqs = [b.cq, extra_cqs[0], extra_cqs[1], cq];
        assert!(
            ![b.ctx, b.pd, b.qp.handle, qp, b.mr].contains(&cq)
                && !live_cqs.contains(&qp)
                && qp != b.pd
                && qp != b.mr,
            "handle values collide: the test cannot tell kinds apart"
        );
        let p = pages(w, 1);
        w.expect("DEALLOC_PD of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(cq)
        });
        w.expect(
            "REG_MR with a CQ handle as PD",
            Status::BAD_HANDLE,
            0,
            |v| v.reg_mr_raw(&mr_req(cq, PAGE_SIZE, inline(1)), &le64s(&p)),
        );
        w.expect(
            "ALLOC_PD with a CQ handle as context",
            Status::BAD_HANDLE,
            0,
            |v| v.alloc_pd(cq),
        );
        w.expect(
            "CREATE_QP with a QP handle as send CQ",
            Status::BAD_HANDLE,
            8,
            |v| {
                v.create_qp(&QpInit {
                    send_cq: qp,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect("DESTROY_CQ of a QP handle", Status::BAD_HANDLE, 0, |v| {
            v.destroy_cq(qp)
        });
        w.expect("QUERY_SRQ of a QP handle", Status::BAD_HANDLE, 0, |v| {
            v.query_srq(qp)
        });
        w.expect("DESTROY_AH of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.destroy_ah(cq)
        });
        w.expect("QUERY_QP of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
        for h in extra_cqs {
            w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
        }
    });
}
