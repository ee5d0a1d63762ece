//! The control queue's framing and flow: unknown opcodes, short and long
//! requests and responses, reserved fields (spec 7.1, 7.4), features that were
//! not negotiated (spec 4, 7.6), and garbage among many requests in flight
//! (spec 7.2).

use std::fmt::Debug;

use vhost_user_rdma::vm::CtrlStats;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::ctrl::RequestSpec;
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{MrSpec, QpInit};
use vhost_user_rdma_tests::vmm::VmmOptions;
use vhost_user_rdma_tests::vring::{RawDesc, Seg};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::mem::{access, PageListMode};
use virtio_rdma_abi::qp::QpAttr;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use crate::requests::{
    cq_req, expect_modify, fresh_qp, inline, le64s, mr_req, new_ctx_req, pages, qp_req,
    raw_request, rc_steps, resp_buf, M_ACCESS,
};
use crate::world::{hostile, hostile_in, opts, World, IOVA};

// ===========================================================================
// Framing (spec 7.4).
// ===========================================================================

#[test]
fn unknown_opcode() {
    hostile(|w| {
        for op in [0u32, 0x04, 0x12, 0x24, 0x54, 0x75, 0x99, 0xffff_ffff] {
            let spec = RequestSpec::new(op, &[], 64);
            w.expect_spec(&format!("opcode {op:#x}"), &spec, Status::UNSUPPORTED, op);
        }
        // With a plausible payload too.
        let payload = CtxHandleReq {
            ctx_handle: w.base().ctx,
        }
        .to_bytes();
        let parts: [&[u8]; 1] = [&payload];
        let spec = RequestSpec::new(0x24u32, &parts, 4);
        w.expect_spec(
            "opcode 0x24 with a payload",
            &spec,
            Status::UNSUPPORTED,
            0x24,
        );
    });
}

#[test]
fn request_shorter_than_header() {
    hostile(|w| {
        let resp = resp_buf(w);
        // 12 readable bytes: a request id and an opcode, no reserved field.
        let (req, _) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        for len in [12u32, 8, 1] {
            let chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 64)]);
            let before = w.a_stats();
            let qpns = w.d.daemon().qpns_in_use();
            let ctrl = w.a.ctrl();
            let t = ctrl.submit_raw_chain(&chain, Some((resp, 64))).unwrap();
            let c = ctrl.wait(t).unwrap();
            assert_eq!(
                (c.status(), c.detail, c.resp_request_id, c.used_len),
                (Some(Status::INVALID), 0, 0, 16),
                "{len}-byte request: {c:?}"
            );
            w.assert_no_effect("short request", before, qpns, 1, 0);
        }
        // No readable descriptor at all.
        let chain = RawDesc::chain(&[Seg::writable(resp, 64)]);
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let ctrl = w.a.ctrl();
        let t = ctrl.submit_raw_chain(&chain, Some((resp, 64))).unwrap();
        let c = ctrl.wait(t).unwrap();
        assert_eq!(
            (c.status(), c.detail, c.resp_request_id, c.used_len),
            (Some(Status::INVALID), 0, 0, 16),
            "request without readable part: {c:?}"
        );
        w.assert_no_effect("no readable part", before, qpns, 1, 0);
    });
}

#[test]
fn reserved_header_field_not_zero() {
    hostile(|w| {
        for reserved in [1, 0x8000_0000, u32::MAX] {
            let spec = RequestSpec {
                reserved,
                ..RequestSpec::new(Opcode::CREATE_CTX, &[], CreateCtxResp::SIZE)
            };
            w.expect_spec(
                &format!("header reserved {reserved:#x}"),
                &spec,
                Status::INVALID,
                12,
            );
        }
    });
}

#[test]
fn reserved_payload_field_not_zero() {
    hostile(|w| {
        let b = w.base();
        let (mut req, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        req.xrcd_handle = 1;
        w.expect(
            "CREATE_QP, xrcd_handle = 1 on an RC QP",
            Status::INVALID,
            44,
            |v| v.create_qp_raw(&req, &tail),
        );
        req.xrcd_handle = 0x8000_0000;
        w.expect(
            "CREATE_QP, xrcd_handle = 2^31 on an RC QP",
            Status::INVALID,
            44,
            |v| v.create_qp_raw(&req, &tail),
        );
    });
}

/// Each request of `cases` (opcode, payload, response size, the payload size
/// the command has) fails with `INVALID`, that size as its detail, and has no
/// effect.
fn expect_invalid_sizes(w: &mut World, cases: &[(Opcode, &[u8], usize, u32)]) {
    for &(op, payload, resp, size) in cases {
        let parts: [&[u8]; 1] = [payload];
        let spec = RequestSpec::new(op, &parts, resp);
        w.expect_spec(
            &format!("{} with {} bytes", op.name(), payload.len()),
            &spec,
            Status::INVALID,
            size,
        );
    }
}

#[test]
fn payload_too_short() {
    hostile(|w| {
        let b = w.base();
        let pd = PdHandleReq { pd_handle: b.pd }.to_bytes();
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let (cq, _) = cq_req(w, 64);
        let cq = cq.to_bytes();
        let (qp, _) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        let qp = qp.to_bytes();
        let modify = ModifyQpReq::default().to_bytes();
        let cases: [(Opcode, &[u8], usize, u32); 7] = [
            (Opcode::ALLOC_PD, &ctx[..2], 4, 4),
            (Opcode::DEALLOC_PD, &[], 0, 4),
            (Opcode::QUERY_QP, &pd[..3], QueryQpResp::SIZE, 4),
            (Opcode::CREATE_CQ, &cq[..39], 4, 40),
            (Opcode::CREATE_QP, &qp[..56], CreateQpResp::SIZE, 80),
            (Opcode::MODIFY_QP, &modify[..103], 0, 104),
            (Opcode::QUERY_GID, &[1, 0, 0, 0], QueryGidResp::SIZE, 8),
        ];
        expect_invalid_sizes(w, &cases);
    });
}

#[test]
fn payload_too_long() {
    hostile(|w| {
        let b = w.base();
        let mut ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        ctx.extend_from_slice(&[0; 4]);
        let mut qp = QpHandleReq {
            qp_handle: b.qp.handle,
        }
        .to_bytes();
        qp.push(0);
        let mut modify = ModifyQpReq {
            qp_handle: b.qp.handle,
            attr_mask: 0,
            attr: QpAttr::default(),
        }
        .to_bytes();
        modify.extend_from_slice(&[0; 8]);
        let cases: [(Opcode, &[u8], usize, u32); 5] = [
            (Opcode::QUERY_DEVICE, &[0; 4], DeviceAttr::SIZE, 0),
            (Opcode::CREATE_CTX, &[0; 12], CreateCtxResp::SIZE, 8),
            (Opcode::ALLOC_PD, &ctx, PdHandleResp::SIZE, 4),
            (Opcode::QUERY_QP, &qp, QueryQpResp::SIZE, 4),
            (Opcode::MODIFY_QP, &modify, 0, 104),
        ];
        expect_invalid_sizes(w, &cases);
    });
}

#[test]
fn response_buffer_too_small() {
    hostile(|w| {
        let b = w.base();
        // Each request is valid; only the writable part is too small. The
        // command must not run: `expect_spec` checks that no object appeared.
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let p = pages(w, 1);
        let mr = mr_req(b.pd, PAGE_SIZE, inline(1)).to_bytes();
        let mr_list = le64s(&p);
        let (qp, qp_tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        let qp = qp.to_bytes();
        let (cq, cq_tail) = cq_req(w, 64);
        let cq = cq.to_bytes();
        let header = w.a.mem().alloc(64, 64).unwrap().0;
        let new_ctx = CreateCtxReq { db_gpa: header }.to_bytes();
        let cases: [(Opcode, Vec<&[u8]>, usize, usize); 7] = [
            (Opcode::CREATE_CTX, vec![&new_ctx], 16 + 7, 24),
            (Opcode::CREATE_CTX, vec![&new_ctx], 16, 24),
            (Opcode::ALLOC_PD, vec![&ctx], 16 + 3, 20),
            (Opcode::CREATE_CQ, vec![&cq, &cq_tail], 16, 20),
            (Opcode::REG_MR, vec![&mr, &mr_list], 16 + 11, 28),
            (Opcode::CREATE_QP, vec![&qp, &qp_tail], 16 + 23, 40),
            (
                Opcode::QUERY_DEVICE,
                vec![],
                16 + DeviceAttr::SIZE - 1,
                16 + DeviceAttr::SIZE,
            ),
        ];
        for (op, parts, writable, need) in cases {
            let spec = RequestSpec {
                writable_len: Some(writable),
                ..RequestSpec::new(op, &parts, 0)
            };
            w.expect_spec(
                &format!("{} with {writable} writable bytes", op.name()),
                &spec,
                Status::INVALID,
                need as u32,
            );
        }
        // The same REG_MR with the response split over 4-byte descriptors
        // of exactly the right total size succeeds.
        let parts: [&[u8]; 2] = [&mr, &mr_list];
        let spec = RequestSpec {
            writable_split: Some(4),
            ..RequestSpec::new(Opcode::REG_MR, &parts, RegMrResp::SIZE)
        };
        let ctrl = w.a.ctrl();
        let t = ctrl.submit_spec(&spec).unwrap();
        let c = ctrl.wait(t).unwrap().ok().unwrap();
        assert_eq!(c.used_len, 28);
        let r: RegMrResp = c.parse().unwrap();
        w.ok("DEREG_MR", |v| v.dereg_mr(r.mr_handle));
    });
}

// ===========================================================================
// Features that were not negotiated (spec 4, 7.6).
// ===========================================================================

#[test]
fn features_not_negotiated() {
    let w = World::build(
        Limits::default(),
        VmmOptions {
            driver_features: 0,
            ..opts()
        },
    );
    hostile_in(w, |w| {
        let b = w.base();
        // Opcodes that need a feature: UNSUPPORTED, detail = the opcode,
        // before any look at the payload (here: an empty one).
        for op in [
            Opcode::CREATE_AH,
            Opcode::DESTROY_AH,
            Opcode::CREATE_SRQ,
            Opcode::MODIFY_SRQ,
            Opcode::QUERY_SRQ,
            Opcode::DESTROY_SRQ,
        ] {
            let spec = RequestSpec::new(op, &[], 64);
            w.expect_spec(
                &format!("{} without its feature", op.name()),
                &spec,
                Status::UNSUPPORTED,
                op.into(),
            );
        }
        // Values that need a feature: UNSUPPORTED, detail = the field offset.
        w.expect("UD QP without F_UD", Status::UNSUPPORTED, 4, |v| {
            v.create_qp(&QpInit::ud(b.pd, b.cq))
        });
        w.expect(
            "QP with an SRQ without F_SRQ",
            Status::UNSUPPORTED,
            16,
            |v| {
                v.create_qp(&QpInit {
                    srq: 0x0010_0000,
                    rq_depth: 0,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        w.expect(
            "REG_MR REMOTE_ATOMIC without F_ATOMIC",
            Status::UNSUPPORTED,
            4,
            |v| {
                v.reg_mr(&MrSpec::new(
                    b.pd,
                    access::LOCAL_WRITE | access::REMOTE_ATOMIC,
                    IOVA,
                    &p,
                ))
            },
        );
        let qp = fresh_qp(w);
        let (m_init, init) = rc_steps(w)[0];
        expect_modify(
            w,
            "QP access REMOTE_ATOMIC without F_ATOMIC",
            qp,
            m_init,
            QpAttr {
                access: access::REMOTE_ATOMIC,
                ..init
            },
            Status::UNSUPPORTED,
            M_ACCESS,
        );
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.atomic_caps, 0);
    });
}

// ===========================================================================
// Many requests in flight, garbage among them.
// ===========================================================================

#[derive(Debug)]
enum Want {
    /// A valid command of this kind ("pd", "cq" or "query").
    Ok(&'static str),
    Fails(Status, u32),
    Malformed,
}

#[test]
fn garbage_mixed_with_valid_requests_in_flight() {
    hostile(|w| {
        let b = w.base();
        let ctx = w.ok("CREATE_CTX", |v| v.create_ctx());
        let before = w.a_stats();
        let hole = w.a.mem().hole_gpa();
        let ctx_req = CtxHandleReq { ctx_handle: ctx }.to_bytes();
        let bad_ctx = CtxHandleReq {
            ctx_handle: 0xfff0_0007,
        }
        .to_bytes();
        let qp_req = QpHandleReq {
            qp_handle: b.qp.handle,
        }
        .to_bytes();
        // Prepare CQ rings and raw chains before submitting anything.
        let mut cq_reqs = Vec::new();
        for _ in 0..12 {
            let v = w.va();
            let ring = v.alloc_ring(64 * 32).unwrap();
            let list = v.page_list(&ring.pages, 12, PageListMode::INLINE).unwrap();
            let req = CreateCqReq {
                ctx_handle: ctx,
                depth: 64,
                db_gpa: ring.db.0,
                buf: list.desc,
            };
            cq_reqs.push((req.to_bytes(), list.tail));
        }
        let (raw_req, raw_len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));

        let mut tokens = Vec::new();
        {
            let v = &mut w.va();
            let ctrl = v.ctrl();
            ctrl.set_auto_kick(false);
            for (i, (cq, tail)) in cq_reqs.iter().enumerate() {
                let t = ctrl
                    .submit(Opcode::ALLOC_PD, &ctx_req, PdHandleResp::SIZE)
                    .unwrap();
                tokens.push((t, Want::Ok("pd")));
                let t = ctrl.submit(0x7fu32, &ctx_req, 4).unwrap();
                tokens.push((t, Want::Fails(Status::UNSUPPORTED, 0x7f)));
                let t = ctrl
                    .submit_parts(Opcode::CREATE_CQ, &[cq, tail], CqHandleResp::SIZE)
                    .unwrap();
                tokens.push((t, Want::Ok("cq")));
                let (t, want) = match i % 4 {
                    0 => (
                        ctrl.submit(Opcode::ALLOC_PD, &bad_ctx, PdHandleResp::SIZE)
                            .unwrap(),
                        Want::Fails(Status::BAD_HANDLE, 0),
                    ),
                    1 => (
                        ctrl.submit(Opcode::ALLOC_PD, &ctx_req[..3], PdHandleResp::SIZE)
                            .unwrap(),
                        Want::Fails(Status::INVALID, 4),
                    ),
                    2 => {
                        let resp = ctrl.vring().mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
                        let chain = RawDesc::chain(&[
                            Seg::readable(raw_req, raw_len),
                            Seg::writable(GuestAddress(hole), 24),
                            Seg::writable(resp, 24),
                        ]);
                        (
                            ctrl.submit_raw_chain(&chain, None).unwrap(),
                            Want::Malformed,
                        )
                    }
                    _ => (
                        ctrl.submit(Opcode::QUERY_QP, &qp_req, QueryQpResp::SIZE)
                            .unwrap(),
                        Want::Ok("query"),
                    ),
                };
                tokens.push((t, want));
            }
            ctrl.kick().unwrap();
            ctrl.set_auto_kick(true);
        }
        // Collect in whatever order they complete.
        let mut pds = Vec::new();
        let mut cqs = Vec::new();
        let (mut n_ok, mut n_failed, mut n_malformed) = (0u64, 0u64, 0u64);
        for (t, want) in &tokens {
            let c = w.a.ctrl().wait(*t).unwrap();
            match want {
                Want::Ok(kind) => {
                    n_ok += 1;
                    let c = c
                        .clone()
                        .ok()
                        .unwrap_or_else(|e| panic!("valid {kind} failed: {e}"));
                    match *kind {
                        "pd" => pds.push(c.parse::<PdHandleResp>().unwrap().pd_handle),
                        "cq" => cqs.push(c.parse::<CqHandleResp>().unwrap().cq_handle),
                        _ => assert_eq!(c.parse::<QueryQpResp>().unwrap(), b.qp_attrs),
                    }
                }
                Want::Fails(status, detail) => {
                    n_failed += 1;
                    assert_eq!(
                        (c.status(), c.detail, c.used_len),
                        (Some(*status), *detail, 16),
                        "{c:?}"
                    );
                    assert_eq!(c.resp_request_id, c.request_id);
                }
                Want::Malformed => {
                    n_malformed += 1;
                    assert_eq!(c.used_len, 0, "{c:?}");
                }
            }
        }
        let distinct = |v: &Vec<u32>| v.iter().collect::<std::collections::HashSet<_>>().len();
        assert_eq!((pds.len(), distinct(&pds)), (12, 12));
        assert_eq!((cqs.len(), distinct(&cqs)), (12, 12));
        let after = w.a_stats();
        assert_eq!(after.resources.pd, before.resources.pd + 12);
        assert_eq!(after.resources.cq, before.resources.cq + 12);
        assert_eq!(after.resources.ctx, before.resources.ctx);
        assert_eq!(
            after.ctrl,
            CtrlStats {
                ok: before.ctrl.ok + n_ok,
                failed: before.ctrl.failed + n_failed,
                malformed: before.ctrl.malformed + n_malformed,
            }
        );
        // Every object created in the storm is usable and goes away with its context.
        w.ok("QP on a PD and CQ from the storm", |v| {
            v.create_qp(&QpInit::rc(pds[5], cqs[7]))
        });
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        assert_eq!(w.a_counts().pd, before.resources.pd);
    });
}

// ===========================================================================
// Reference: a request the guest rewrites while it is in flight.
// ===========================================================================
//
// Not tested: the daemon copies every request (and every list page) out of
// guest memory before it looks at it (backend/src/device.rs handle_chain,
// backend/src/memory/pagelist.rs), but a test cannot time a rewrite to land
// between the daemon's reads without instrumenting the daemon.
