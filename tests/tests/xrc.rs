//! XRC (`F_XRC`, spec 12.28, 12.29, 13.2, 18.11.8) between two VMs of one
//! daemon, through the real vhost-user socket: an XRC_INI QP's messages
//! land in the XRC SRQ each names at the XRC_TGT QP it is connected to and
//! complete on that SRQ's CQ; an SRQ number of another domain or another VM
//! is an invalid request; XRC and RC QPs do not talk to each other, and an
//! initiator reaches targets of its tenant only; DESTROY_CTX takes a
//! domain's SRQs and target QPs with it; the control path refuses what does
//! not fit.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    cap, conn_qpn, expect_event, failed, fast, ok, open, pattern, poll_one, status, two_vms, wr,
    Buf, Vm, QP_ACCESS,
};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use vhost_user_rdma_tests::verbs::{status_of, QpInit as RawQpInit, Verbs};
use virtio_rdma_abi::ctrl::{quota, Status};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::MAX_XRCD;
use virtio_rdma_driver::{Cq, Qp, QpCap, QpInit, RecvWr, SendOp, Srq, XrcTgt, Xrcd};

/// The receive side on `vm`: a domain, a CQ, `n` XRC SRQs of the domain
/// on that CQ, and a target QP of the domain.
struct Target {
    srqs: Vec<Arc<Srq>>,
    tgt: XrcTgt,
    cq: Arc<Cq>,
    xrcd: Arc<Xrcd>,
}

fn target(vm: &Vm, n: usize) -> Target {
    let xrcd = Xrcd::open(&vm.dev).expect("open XRCD");
    let cq = Cq::create(&vm.dev, 64).expect("CQ");
    let srqs = (0..n)
        .map(|_| Srq::create_xrc(&vm.pd, &xrcd, &cq, 16, 1).expect("XRC SRQ"))
        .collect();
    let tgt = XrcTgt::create(&xrcd).expect("XRC_TGT QP");
    Target {
        srqs,
        tgt,
        cq,
        xrcd,
    }
}

/// An XRC_INI QP on `vm` (sends on a new CQ) connected to `t`'s target QP
/// on `peer`, and `t`'s target connected back to it.
fn initiator(vm: &Vm, peer: &Vm, t: &Target) -> (Arc<Cq>, Qp) {
    let cq = Cq::create(&vm.dev, 64).expect("CQ");
    let mut init = QpInit::xrc_ini(&cq);
    init.cap = QpCap {
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..cap()
    };
    let ini = Qp::create(&vm.pd, &init).expect("XRC_INI QP");
    t.tgt
        .connect(QP_ACCESS, &conn_qpn(ini.qpn(), vm))
        .expect("connect TGT");
    ini.xrc_ini_connect(&conn_qpn(t.tgt.qpn(), peer))
        .expect("connect INI");
    (cq, ini)
}

fn post_recv(srq: &Srq, wr_id: u64, buf: &Buf, off: usize, len: usize) {
    srq.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[buf.sge(off, len)],
    }])
    .expect("post receive");
}

/// Spec 18.11.8: each SEND goes to the SRQ its WQE names, among several
/// SRQs of one domain, and completes on that SRQ's CQ with the target
/// QP's number; RDMA WRITE and READ go through the target to the
/// regions of the SRQ's PD.
#[test]
fn messages_land_in_the_srq_they_name() {
    let (_d, a, b) = two_vms();
    let t = target(&b, 2);
    let (s1, s2) = (&t.srqs[0], &t.srqs[1]);
    assert!(s1.srqn() != 0 && s2.srqn() != 0 && s1.srqn() != s2.srqn());
    assert!(Arc::ptr_eq(s1.xrcd().unwrap(), &t.xrcd));
    let (cqa, ini) = initiator(&a, &b, &t);
    let src = Buf::new(&a, 8192);
    let dst = Buf::guarded(&b, 8192);
    let data = pattern(3000, 5);
    src.write(0, &data);
    post_recv(s1, 11, &dst, 0, 4096);
    post_recv(s2, 21, &dst, 4096, 4096);
    // To the second SRQ first: its WQE, not the first's, takes it.
    ini.post_send_xrc(s2.srqn(), &[wr(1, SendOp::Send, &[src.sge(0, 3000)])])
        .unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::SEND);
    let r = poll_one(&t.cq);
    ok(&r, 21, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.qpn), (3000, t.tgt.qpn()));
    assert_eq!(dst.read(4096, 3000), data);
    dst.assert_untouched(0, 4096, "the other SRQ's buffer");
    ini.post_send_xrc(
        s1.srqn(),
        &[wr(2, SendOp::SendWithImm { imm: 9 }, &[src.sge(0, 100)])],
    )
    .unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    let r = poll_one(&t.cq);
    ok(&r, 11, WcOpcode::RECV);
    assert_eq!(r.imm_data, 9);
    assert_eq!(dst.read(0, 100), data[..100]);
    // WRITE and READ through the target, keys of the SRQ's PD.
    src.write(0, b"written through XRC");
    let w = SendOp::RdmaWrite {
        remote_addr: dst.addr(7500),
        rkey: dst.mr.rkey(),
    };
    ini.post_send_xrc(s1.srqn(), &[wr(3, w, &[src.sge(0, 19)])])
        .unwrap();
    ok(&poll_one(&cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(7500, 19), b"written through XRC");
    let rd = SendOp::RdmaRead {
        remote_addr: dst.addr(4096),
        rkey: dst.mr.rkey(),
    };
    ini.post_send_xrc(s2.srqn(), &[wr(4, rd, &[src.sge(4096, 3000)])])
        .unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::RDMA_READ);
    assert_eq!(src.read(4096, 3000), data);
}

/// Spec 18.11.8: a message naming an XRC SRQ of another domain of the
/// target's VM is an invalid request: the initiator completes with
/// `REM_INV_REQ_ERR`, the target QP fails with `QP_REQ_ERROR`, and the
/// SRQ's WQE is not consumed.
#[test]
fn an_srq_of_another_domain_is_refused() {
    let (_d, a, b) = two_vms();
    let t = target(&b, 1);
    let other = target(&b, 1);
    let (cqa, ini) = initiator(&a, &b, &t);
    let src = Buf::new(&a, 4096);
    let dst = Buf::guarded(&b, 4096);
    post_recv(&other.srqs[0], 31, &dst, 0, 4096);
    ini.post_send_xrc(
        other.srqs[0].srqn(),
        &[wr(1, SendOp::Send, &[src.sge(0, 64)])],
    )
    .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::REM_INV_REQ_ERR);
    expect_event(&b.dev, EventKind::QP_REQ_ERROR, t.tgt.handle());
    dst.assert_untouched(0, 4096, "a refused XRC message");
    // The WQE is still there for its own domain's target.
    let (cq2, ini2) = initiator(&a, &b, &other);
    ini2.post_send_xrc(
        other.srqs[0].srqn(),
        &[wr(2, SendOp::Send, &[src.sge(0, 64)])],
    )
    .unwrap();
    ok(&poll_one(&cq2), 2, WcOpcode::SEND);
    ok(&poll_one(&other.cq), 31, WcOpcode::RECV);
}

/// Spec 18.11.8: SRQ numbers name SRQs of the target's VM only: the
/// number of an XRC SRQ of the sender's own VM is unknown at the target.
#[test]
fn an_srq_of_another_vm_is_refused() {
    let (_d, a, b) = two_vms();
    let t = target(&b, 1);
    let mine = target(&a, 1);
    let (cqa, ini) = initiator(&a, &b, &t);
    let src = Buf::new(&a, 4096);
    let dst = Buf::guarded(&a, 4096);
    post_recv(&mine.srqs[0], 41, &dst, 0, 4096);
    ini.post_send_xrc(
        mine.srqs[0].srqn(),
        &[wr(1, SendOp::Send, &[src.sge(0, 8)])],
    )
    .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::REM_INV_REQ_ERR);
    dst.assert_untouched(0, 4096, "another VM's SRQ");
}

/// Spec 12.28, 12.29: a domain in use cannot be closed; DESTROY_CTX of
/// the context that opened it takes its target QPs and XRC SRQs (another
/// context's too) with it, and leaves that other context's PD and CQ free
/// to go.
#[test]
fn destroy_ctx_takes_the_domain_with_it() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let owner = v.create_ctx().unwrap();
    let (other, pd) = v.ctx_pd().unwrap();
    let cq = v.create_cq(other, 16).unwrap();
    let xrcd = v.open_xrcd(owner).unwrap();
    let srq = v.create_xrc_srq(pd, xrcd, cq, 16).unwrap();
    assert_ne!(srq.srqn, 0);
    let tgt = v.create_qp_raw(&Verbs::tgt_request(xrcd), &[]).unwrap();
    assert_eq!(
        v.query_qp(tgt.qp_handle).unwrap().qp_type,
        QpType::XRC_TGT as u32
    );
    assert_eq!(
        status_of(&v.close_xrcd(xrcd)),
        Some((Status::BUSY, 2)),
        "an SRQ and a QP in it"
    );
    // The CQ is the SRQ's.
    assert_eq!(
        status_of(&v.destroy_cq(cq)).map(|s| s.0),
        Some(Status::BUSY)
    );
    let before = d.stats(0).device.resources;
    assert_eq!((before.qp, before.srq), (1, 1));
    v.destroy_ctx(owner).unwrap();
    let after = d.stats(0).device.resources;
    assert_eq!((after.qp, after.srq, after.ctx), (0, 0, 1));
    assert_eq!(d.daemon().qpns_in_use(), 0);
    assert_eq!(
        status_of(&v.close_xrcd(xrcd)).map(|s| s.0),
        Some(Status::BAD_HANDLE)
    );
    v.destroy_cq(cq).unwrap();
    v.dealloc_pd(pd).unwrap();
}

/// Spec 12.12, 12.28, 12.29: what the control path refuses, with the
/// offending field's offset.
#[test]
fn refusals() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (ctx, pd, cq) = v.ctx_pd_cq(16).unwrap();
    let ctx2 = v.create_ctx().unwrap();
    let foreign_cq = v.create_cq(ctx2, 16).unwrap();
    let xrcd = v.open_xrcd(ctx).unwrap();
    // CREATE_XRC_SRQ: the domain, the CQ, the CQ's context.
    assert_eq!(
        status_of(&v.create_xrc_srq(pd, xrcd + 1, cq, 16)),
        Some((Status::BAD_HANDLE, 16))
    );
    assert_eq!(
        status_of(&v.create_xrc_srq(pd, xrcd, cq + 100, 16)),
        Some((Status::BAD_HANDLE, 20))
    );
    assert_eq!(
        status_of(&v.create_xrc_srq(pd, xrcd, foreign_cq, 16)),
        Some((Status::MISMATCH, 20))
    );
    let srq = v.create_xrc_srq(pd, xrcd, cq, 16).unwrap();
    // An XRC SRQ serves no ordinary QP.
    let mut rc = RawQpInit::rc(pd, cq);
    rc.srq = srq.srq_handle;
    rc.rq_depth = 0;
    assert_eq!(
        status_of(&v.create_qp(&rc)).map(|s| s.0),
        Some(Status::INVALID)
    );
    // XRC_TGT: a domain, and nothing else.
    let mut req = Verbs::tgt_request(xrcd + 1);
    assert_eq!(
        status_of(&v.create_qp_raw(&req, &[])),
        Some((Status::BAD_HANDLE, 44))
    );
    req.xrcd_handle = xrcd;
    req.pd_handle = pd;
    assert_eq!(
        status_of(&v.create_qp_raw(&req, &[])),
        Some((Status::INVALID, 0))
    );
    req.pd_handle = 0;
    req.sq_depth = 16;
    assert_eq!(
        status_of(&v.create_qp_raw(&req, &[])),
        Some((Status::INVALID, 24))
    );
    // XRC_INI: no receive side.
    let mut ini = RawQpInit::rc(pd, cq);
    ini.qp_type = QpType::XRC_INI;
    assert_eq!(
        status_of(&v.create_qp(&ini)),
        Some((Status::INVALID, 12)),
        "a receive CQ"
    );
    ini.recv_cq = 0;
    ini.rq_depth = 0;
    ini.max_recv_sge = 0;
    v.create_qp(&ini).unwrap();
    // The domains of the instance are counted.
    for _ in 1..MAX_XRCD {
        v.open_xrcd(ctx).unwrap();
    }
    assert_eq!(
        status_of(&v.open_xrcd(ctx)),
        Some((Status::QUOTA, quota::XRCD))
    );
    assert_eq!(
        status_of(&v.open_xrcd(ctx + 100)).map(|s| s.0),
        Some(Status::BAD_HANDLE)
    );
}

/// Spec 18.11.8: an XRC initiator reaches XRC targets only, and an RC QP
/// no target: a message to a QP of another type is unreachable (retried,
/// then `RETRY_EXC_ERR`), and nothing arrives.
#[test]
fn xrc_and_rc_do_not_mix() {
    let (_d, a, b) = two_vms();
    let t = target(&b, 1);
    let src = Buf::new(&a, 4096);
    let dst = Buf::guarded(&b, 4096);
    post_recv(&t.srqs[0], 1, &dst, 0, 4096);
    // An RC QP of A connected to the target's number.
    let cqa = Cq::create(&a.dev, 16).unwrap();
    let mut init = QpInit::rc(&cqa);
    init.cap = cap();
    let rc = Qp::create(&a.pd, &init).unwrap();
    rc.rc_connect(QP_ACCESS, &fast(conn_qpn(t.tgt.qpn(), &b)))
        .unwrap();
    rc.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 8)])])
        .unwrap();
    failed(&poll_one(&cqa), 2, WcStatus::RETRY_EXC_ERR);
    // An initiator connected to an RC QP of B.
    let cqb = Cq::create(&b.dev, 16).unwrap();
    let mut init = QpInit::rc(&cqb);
    init.cap = cap();
    let rc_b = Qp::create(&b.pd, &init).unwrap();
    let cqi = Cq::create(&a.dev, 16).unwrap();
    let mut init = QpInit::xrc_ini(&cqi);
    init.cap = QpCap {
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..cap()
    };
    let ini = Qp::create(&a.pd, &init).unwrap();
    ini.xrc_ini_connect(&fast(conn_qpn(rc_b.qpn(), &b)))
        .unwrap();
    ini.post_send_xrc(t.srqs[0].srqn(), &[wr(3, SendOp::Send, &[src.sge(0, 8)])])
        .unwrap();
    failed(&poll_one(&cqi), 3, WcStatus::RETRY_EXC_ERR);
    dst.assert_untouched(0, 4096, "messages of the wrong type");
}

/// Spec 18.23, 18.11.8: XRC connects as RC does, within the tenant: an
/// initiator cannot be pointed at a target of another tenant's VM.
#[test]
fn a_target_of_another_tenant_is_out_of_reach() {
    let d = TestDaemon::with_config(2, |c| {
        add_tenant(c, "red", &[1]);
    })
    .unwrap();
    let (a, red) = (open(&d, 0), open(&d, 1));
    let t = target(&red, 1);
    let cq = Cq::create(&a.dev, 16).unwrap();
    let mut init = QpInit::xrc_ini(&cq);
    init.cap = QpCap {
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..cap()
    };
    let ini = Qp::create(&a.pd, &init).unwrap();
    let r = ini.xrc_ini_connect(&conn_qpn(t.tgt.qpn(), &red));
    assert_eq!(status(r).0, Status::DENIED);
}
