//! Resizing (`F_RESIZE`, spec 12.19, 12.25, 12.26) between two VMs of one
//! daemon, through the real vhost-user socket and the reference driver:
//! a CQ or SRQ gets a new ring while the engine writes completions into it
//! or consumes its WQEs, and no entry is lost, duplicated or reordered; a
//! ring too small for what is outstanding is refused and changes nothing;
//! a region gets new access, pages or PD with its keys kept, and the data
//! path follows at once (a QP using the region sees the new state).

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    assert_quiet, connect, failed, ok, pattern, poll_n, poll_one, rc_qp, recv, srq_qp, status,
    two_vms, wr, Buf, Vm, GUARD,
};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::verbs::{MW_TYPE_1, REREG_ACCESS, REREG_PD, REREG_TRANSLATION};
use virtio_rdma_driver::{Cq, Mr, Mw, Pd, Qp, RecvWr, SendOp, SendWr, Srq};

/// Two connected RC QPs, the first completing into a CQ of `depth`.
fn pair(a: &Vm, b: &Vm, depth: u32) -> (Arc<Cq>, Arc<Cq>, Qp, Qp) {
    let cqa = Cq::create(&a.dev, depth).expect("CQ A");
    let cqb = Cq::create(&b.dev, 256).expect("CQ B");
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &cqb);
    connect(a, &qa, b, &qb);
    (cqa, cqb, qa, qb)
}

/// Posts `n` signaled 64-byte WRITEs from `src` to `dst` with ids from
/// `first`.
fn writes(q: &Qp, src: &Buf, dst: &Buf, first: u64, n: u64) {
    let sg = [src.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(0),
        rkey: dst.mr.rkey(),
    };
    let wrs: Vec<_> = (first..first + n).map(|i| wr(i, op, &sg)).collect();
    q.post_send(&wrs).expect("post WRITEs");
}

/// Spec 12.25: rounds of 24 WRITEs, each round's CQ resized (larger and
/// smaller, never below 24) while the engine is still completing them,
/// some polled before: every completion arrives once, in order.
#[test]
fn cq_resize_under_traffic_keeps_every_completion_in_order() {
    let (_d, a, b) = two_vms();
    let (cqa, _cqb, qa, _qb) = pair(&a, &b, 32);
    let src = Buf::new(&a, 4096);
    let dst = Buf::new(&b, 4096);
    let depths = [64, 32, 128, 32, 256, 64];
    let mut next = 0u64;
    for round in 0..60usize {
        let n = 24;
        writes(&qa, &src, &dst, next, n);
        let early = round % 4;
        let mut got = poll_n(&cqa, early);
        let depth = depths[round % depths.len()];
        cqa.resize(depth).expect("RESIZE_CQ");
        assert_eq!(cqa.depth(), depth);
        got.extend(poll_n(&cqa, n as usize - early));
        for (i, wc) in got.iter().enumerate() {
            ok(wc, next + i as u64, WcOpcode::RDMA_WRITE);
        }
        next += n;
    }
    assert_quiet(&cqa);
}

/// Spec 12.25: a depth below the completions not polled yet is refused
/// with `RANGE` (detail 4), and the CQ keeps its ring and every one of
/// them; afterwards it shrinks.
#[test]
fn cq_shrink_below_unpolled_is_refused_and_loses_nothing() {
    let (_d, a, b) = two_vms();
    let (cqa, cqb, qa, qb) = pair(&a, &b, 32);
    let src = Buf::new(&a, 4096);
    let dst = Buf::new(&b, 4096);
    recv(&qb, 100, &[dst.sge(1024, 64)]);
    writes(&qa, &src, &dst, 0, 10);
    qa.post_send(&[wr(10, SendOp::Send, &[src.sge(0, 64)])])
        .unwrap();
    // The SEND arrived: the ten WRITEs before it completed at A.
    ok(&poll_one(&cqb), 100, WcOpcode::RECV);
    assert_eq!(status(cqa.resize(8)), (Status::RANGE, 4));
    assert_eq!(cqa.depth(), 32);
    let got = poll_n(&cqa, 11);
    for (i, wc) in got.iter().take(10).enumerate() {
        ok(wc, i as u64, WcOpcode::RDMA_WRITE);
    }
    ok(&got[10], 10, WcOpcode::SEND);
    assert_quiet(&cqa);
    cqa.resize(8).expect("shrink an empty CQ");
    writes(&qa, &src, &dst, 20, 8);
    for (i, wc) in poll_n(&cqa, 8).iter().enumerate() {
        ok(wc, 20 + i as u64, WcOpcode::RDMA_WRITE);
    }
}

/// Spec 12.19: receives posted to an SRQ before a resize are consumed
/// after it, in order, with their own buffers; the SRQ is resized while
/// messages are arriving; a depth below the posted WQEs is refused.
#[test]
fn srq_resize_carries_posted_wqes_over_in_order() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 256).unwrap();
    let cqb = Cq::create(&b.dev, 256).unwrap();
    let srq = Srq::create(&b.pd, 16, 1, 0).unwrap();
    let qa = rc_qp(&a, &cqa);
    let qb = srq_qp(&b, &cqb, &srq);
    connect(&a, &qa, &b, &qb);
    let src = Buf::new(&a, 64 * 512);
    let dst = Buf::guarded(&b, 64 * 512);
    let post = |first: u64, n: u64| {
        for i in first..first + n {
            let sg = [dst.sge((i % 512) as usize * 64, 64)];
            srq.post_recv(&[RecvWr {
                wr_id: 1000 + i,
                sg_list: &sg,
            }])
            .unwrap();
        }
    };
    let send = |first: u64, n: u64| {
        for i in first..first + n {
            src.write((i % 512) as usize * 64, &pattern(64, i));
        }
        let sgs: Vec<_> = (first..first + n)
            .map(|i| [src.sge((i % 512) as usize * 64, 64)])
            .collect();
        let wrs: Vec<_> = (first..first + n)
            .zip(&sgs)
            .map(|(i, sg)| wr(i, SendOp::SendWithImm { imm: i as u32 }, sg))
            .collect();
        qa.post_send(&wrs).unwrap();
    };
    let check = |first: u64, n: u64| {
        for (k, wc) in poll_n(&cqb, n as usize).iter().enumerate() {
            let i = first + k as u64;
            ok(wc, 1000 + i, WcOpcode::RECV);
            assert_eq!(wc.imm_data, i as u32);
            assert_eq!(dst.read((i % 512) as usize * 64, 64), pattern(64, i));
        }
        for wc in poll_n(&cqa, n as usize) {
            assert!(wc.is_success(), "{wc:?}");
        }
    };
    post(0, 12);
    send(0, 3);
    check(0, 3);
    // Nine posted: four WQEs cannot hold them.
    assert_eq!(status(srq.resize(4)), (Status::RANGE, 8));
    assert_eq!(srq.depth(), 16);
    srq.resize(64).expect("grow the SRQ");
    assert_eq!(srq.depth(), 64);
    post(12, 40);
    send(3, 49);
    check(3, 49);
    // Under traffic: the messages arrive while the ring changes.
    let sizes = [16u32, 64, 32, 128, 16];
    let mut next = 52u64;
    for round in 0..30usize {
        let n = 12;
        post(next, n);
        send(next, n);
        srq.resize(sizes[round % sizes.len()])
            .expect("resize under traffic");
        check(next, n);
        next += n;
    }
    assert_quiet(&cqb);
    dst.assert_untouched(
        64 * (next as usize % 512),
        64,
        "a receive buffer never posted",
    );
}

/// Spec 12.10, 12.26: access granted and taken away with the keys kept:
/// the rkey the region had from its registration starts and stops
/// granting remote writes.
#[test]
fn rereg_access_keeps_keys() {
    let (_d, a, b) = two_vms();
    let (cqa, _cqb, qa, _qb) = pair(&a, &b, 64);
    let src = Buf::new(&a, 4096);
    let mem = Arc::new(b.dev.alloc_dma(4096, 8).unwrap());
    mem.fill(0, 4096, GUARD).unwrap();
    let mut mr = Mr::register(&b.pd, mem.clone(), access::LOCAL_WRITE).unwrap();
    // With F_RESIZE a region has an rkey from the start (spec 12.10):
    // a peer may learn it before remote access is granted.
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    assert_ne!(rkey, 0, "F_RESIZE: an rkey for every region");
    mr.rereg(
        REREG_ACCESS,
        None,
        access::LOCAL_WRITE | access::REMOTE_WRITE,
        None,
    )
    .unwrap();
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
    let data = pattern(64, 7);
    src.write(0, &data);
    let op = SendOp::RdmaWrite {
        remote_addr: mr.iova(),
        rkey,
    };
    qa.post_send(&[wr(1, op, &[src.sge(0, 64)])]).unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(mem.to_vec(0, 64).unwrap(), data);
    // Remote write taken away: the key stays, and grants nothing.
    mr.rereg(REREG_ACCESS, None, access::LOCAL_WRITE, None)
        .unwrap();
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
    src.write(0, &pattern(64, 8));
    qa.post_send(&[wr(2, op, &[src.sge(0, 64)])]).unwrap();
    failed(&poll_one(&cqa), 2, WcStatus::REM_ACCESS_ERR);
    assert_eq!(
        mem.to_vec(0, 64).unwrap(),
        data,
        "refused WRITE left no trace"
    );
}

/// Spec 12.26: new pages under the same keys: WRITEs land in the new
/// buffer, the old one stays as it was, and the old range is gone.
#[test]
fn rereg_translation_moves_the_region() {
    let (_d, a, b) = two_vms();
    let (cqa, _cqb, qa, _qb) = pair(&a, &b, 64);
    let src = Buf::new(&a, 8192);
    let old = Arc::new(b.dev.alloc_dma(8192, 8).unwrap());
    old.fill(0, 8192, GUARD).unwrap();
    let new = Arc::new(b.dev.alloc_dma(8192, 8).unwrap());
    new.fill(0, 8192, GUARD).unwrap();
    let mut mr = Mr::register(&b.pd, old.clone(), access::ALL).unwrap();
    let (lkey, rkey, old_iova) = (mr.lkey(), mr.rkey(), mr.iova());
    mr.rereg(REREG_TRANSLATION, None, 0, Some(new.clone()))
        .unwrap();
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
    let data = pattern(5000, 3);
    src.write(0, &data);
    let op = SendOp::RdmaWrite {
        remote_addr: mr.iova() + 100,
        rkey,
    };
    qa.post_send(&[wr(1, op, &[src.sge(0, 5000)])]).unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(new.to_vec(100, 5000).unwrap(), data);
    assert_eq!(old.to_vec(0, 8192).unwrap(), vec![GUARD; 8192]);
    if old_iova + 8192 <= mr.iova() || mr.iova() + 8192 <= old_iova {
        let stale = SendOp::RdmaWrite {
            remote_addr: old_iova,
            rkey,
        };
        qa.post_send(&[wr(2, stale, &[src.sge(0, 64)])]).unwrap();
        failed(&poll_one(&cqa), 2, WcStatus::REM_ACCESS_ERR);
    }
}

/// Spec 12.26: a region moved to another PD while a QP of the old PD has
/// a receive posted on it: the receive fails the message (the responder's
/// protection check), the requester sees `REM_OP_ERR`; moved back, a new
/// QP pair works again.
#[test]
fn rereg_pd_while_a_qp_uses_the_region() {
    let (_d, a, b) = two_vms();
    let (cqa, _cqb, qa, qb) = pair(&a, &b, 64);
    let src = Buf::new(&a, 4096);
    let mut dst = Buf::guarded(&b, 4096);
    recv(&qb, 7, &[dst.sge(0, 64)]);
    let other = Pd::alloc(&b.dev).unwrap();
    let lkey = dst.mr.lkey();
    dst.mr.rereg(REREG_PD, Some(&other), 0, None).unwrap();
    assert_eq!(dst.mr.lkey(), lkey);
    qa.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 64)])])
        .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::REM_OP_ERR);
    dst.assert_untouched(0, 4096, "a receive into a region of another PD");
    // Back in the QPs' PD, a fresh pair delivers into it.
    dst.mr.rereg(REREG_PD, Some(&b.pd), 0, None).unwrap();
    let (cqa2, cqb2, qa2, qb2) = pair(&a, &b, 64);
    recv(&qb2, 8, &[dst.sge(0, 64)]);
    src.write(0, &pattern(64, 9));
    qa2.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 64)])])
        .unwrap();
    ok(&poll_one(&cqa2), 2, WcOpcode::SEND);
    ok(&poll_one(&cqb2), 8, WcOpcode::RECV);
    assert_eq!(dst.read(0, 64), pattern(64, 9));
}

/// Spec 12.26: a region a window is bound to is not re-registered
/// (`BUSY`, the number of windows: they are bound to its old range and
/// keys); unbound, it is.
#[test]
fn rereg_of_a_region_with_a_bound_window_is_busy() {
    let (_d, a, b) = two_vms();
    let bindable = access::ALL | access::MW_BIND;
    let mut target = Buf::with_access(&b, &b.pd, 4096, bindable);
    let (_cqa, cqb, _qa, qb) = pair(&a, &b, 64);
    let mut w = Mw::alloc(&b.pd, MW_TYPE_1).unwrap();
    let bind = w.bind(target.mr.lkey(), target.addr(0), 64, access::REMOTE_READ);
    qb.post_send(&[SendWr::signaled(1, SendOp::BindMw(bind), &[])])
        .unwrap();
    ok(&poll_one(&cqb), 1, WcOpcode::BIND_MW);
    let r = target
        .mr
        .rereg(REREG_ACCESS, None, access::LOCAL_WRITE, None);
    assert_eq!(status(r), (Status::BUSY, 1));
    assert_eq!(target.mr.access(), bindable, "the region unchanged");
    drop(w);
    target
        .mr
        .rereg(REREG_ACCESS, None, access::LOCAL_WRITE, None)
        .expect("no window bound any more");
    assert_eq!(target.mr.access(), access::LOCAL_WRITE);
}

/// Spec 12.25: sends posted and not completed yet count as the CQ's:
/// a resize right after posting them, whether or not the engine has
/// completed any, is refused below their number, and all arrive.
#[test]
fn cq_shrink_below_posted_sends_is_refused() {
    let (_d, a, b) = two_vms();
    let (cqa, _cqb, qa, _qb) = pair(&a, &b, 32);
    let src = Buf::new(&a, 4096);
    let dst = Buf::new(&b, 4096);
    for round in 0..20u64 {
        writes(&qa, &src, &dst, round * 20, 20);
        assert_eq!(status(cqa.resize(8)), (Status::RANGE, 4));
        for (i, wc) in poll_n(&cqa, 20).iter().enumerate() {
            ok(wc, round * 20 + i as u64, WcOpcode::RDMA_WRITE);
        }
    }
    assert_quiet(&cqa);
    cqa.resize(8).expect("nothing outstanding");
}
