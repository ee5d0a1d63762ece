//! UC queue pairs (`F_UC`, spec 13.2, 18.11.6) between two VMs of one
//! daemon, through the real vhost-user socket and the reference driver:
//! SENDs and WRITEs (with immediate data, inline, in pieces) arrive as on
//! RC; what RC would answer with an RNR or a NAK is dropped instead, the
//! sender completing successfully and the responder left as it was;
//! READ and atomics are malformed; RC's reliability attributes are not
//! UC's; UC and RC QPs do not talk to each other.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, cap, conn, failed, ok, pattern, poll_one, rc_qp, recv, two_vms,
    wait_state, wr, Buf, Vm, GUARD, QP_ACCESS,
};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::qp::{attr, QpState};
use virtio_rdma_driver::{Cq, Payload, Qp, QpAttrs, QpInit, SendOp, SendWr};

/// A UC QP on `vm` with both queues on `cq`.
fn uc_qp(vm: &Vm, cq: &Arc<Cq>) -> Qp {
    let mut init = QpInit::uc(cq);
    init.cap = cap();
    Qp::create(&vm.pd, &init).expect("create UC QP")
}

/// Two connected UC QPs with their CQs.
struct UcPair {
    cqa: Arc<Cq>,
    cqb: Arc<Cq>,
    qa: Qp,
    qb: Qp,
}

fn uc_pair(a: &Vm, b: &Vm) -> UcPair {
    let cqa = Cq::create(&a.dev, 256).expect("CQ A");
    let cqb = Cq::create(&b.dev, 256).expect("CQ B");
    let qa = uc_qp(a, &cqa);
    let qb = uc_qp(b, &cqb);
    qa.uc_connect(QP_ACCESS, &conn(&qb, b)).expect("connect A");
    qb.uc_connect(QP_ACCESS, &conn(&qa, a)).expect("connect B");
    UcPair { cqa, cqb, qa, qb }
}

/// Spec 18.11.6: SEND, SEND_WITH_IMM, RDMA WRITE and WRITE_WITH_IMM work
/// on UC as on RC, inline data and a message of several pieces too.
#[test]
fn sends_and_writes_arrive() {
    let (_d, a, b) = two_vms();
    let p = uc_pair(&a, &b);
    let src = Buf::new(&a, 3 << 20);
    let dst = Buf::guarded(&b, 3 << 20);
    let data = pattern(5000, 1);
    src.write(0, &data);
    recv(&p.qb, 1, &[dst.sge(0, 8192)]);
    p.qa.post_send(&[wr(
        2,
        SendOp::SendWithImm { imm: 0x1234 },
        &[src.sge(0, 5000)],
    )])
    .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.imm_data), (5000, 0x1234));
    assert_eq!(dst.read(0, 5000), data);
    // A WRITE of 3 MiB: several pieces.
    let big = pattern(3 << 20, 2);
    src.write(0, &big);
    let w = SendOp::RdmaWrite {
        remote_addr: dst.addr(0),
        rkey: dst.mr.rkey(),
    };
    p.qa.post_send(&[wr(3, w, &[src.sge(0, 3 << 20)])]).unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 3 << 20), big);
    // WRITE_WITH_IMM consumes a receive; inline WRITE.
    recv(&p.qb, 4, &[]);
    let wi = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(100),
        rkey: dst.mr.rkey(),
        imm: 7,
    };
    let inline = SendWr {
        payload: Payload::Inline(b"inline!"),
        ..wr(5, wi, &[])
    };
    p.qa.post_send(&[inline]).unwrap();
    ok(&poll_one(&p.cqa), 5, WcOpcode::RDMA_WRITE);
    let r = poll_one(&p.cqb);
    ok(&r, 4, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(r.imm_data, 7);
    assert_eq!(dst.read(100, 7), b"inline!");
}

/// Spec 18.11.6: a SEND with no receive posted, and a WRITE through a bad
/// key, are dropped: the sender completes `SUCCESS`, the responder gets
/// no completion and no event and stays in RTS, and the next message
/// arrives.
#[test]
fn what_rc_would_refuse_is_dropped() {
    let (d, a, b) = two_vms();
    let p = uc_pair(&a, &b);
    let src = Buf::new(&a, 4096);
    let dst = Buf::guarded(&b, 4096);
    src.write(0, b"lost and found");
    let drops = d.traffic(0).drops;
    p.qa.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 14)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::SEND);
    let bad = SendOp::RdmaWrite {
        remote_addr: dst.addr(0),
        rkey: dst.mr.rkey() ^ 0x100,
    };
    p.qa.post_send(&[wr(2, bad, &[src.sge(0, 14)])]).unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
    let outside = SendOp::RdmaWrite {
        remote_addr: dst.addr(4090),
        rkey: dst.mr.rkey(),
    };
    p.qa.post_send(&[wr(3, outside, &[src.sge(0, 14)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(d.traffic(0).drops, drops + 3);
    dst.assert_untouched(0, 4096, "dropped messages");
    assert_quiet(&p.cqb);
    assert_no_event(&b.dev, "a UC responder that dropped messages");
    assert_eq!(p.qb.query().unwrap().attr.qp_state, QpState::RTS as u32);
    recv(&p.qb, 4, &[dst.sge(0, 64)]);
    p.qa.post_send(&[wr(5, SendOp::Send, &[src.sge(0, 14)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 5, WcOpcode::SEND);
    ok(&poll_one(&p.cqb), 4, WcOpcode::RECV);
    assert_eq!(dst.read(0, 14), b"lost and found");
}

/// Spec 18.8, 18.11.6: RDMA READ and atomics are malformed on UC
/// (`LOC_QP_OP_ERR`, the QP enters ERR, nothing sent).
#[test]
fn read_and_atomics_are_malformed() {
    let (_d, a, b) = two_vms();
    let dst = Buf::guarded(&b, 4096);
    let src = Buf::new(&a, 4096);
    let ops = [
        SendOp::RdmaRead {
            remote_addr: dst.addr(0),
            rkey: dst.mr.rkey(),
        },
        SendOp::AtomicFetchAdd {
            remote_addr: dst.addr(0),
            rkey: dst.mr.rkey(),
            add: 1,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let p = uc_pair(&a, &b);
        p.qa.post_send(&[wr(i as u64, op, &[src.sge(0, 8)])])
            .unwrap();
        failed(&poll_one(&p.cqa), i as u64, WcStatus::LOC_QP_OP_ERR);
        wait_state(&p.qa, QpState::ERR);
    }
    dst.assert_untouched(0, 4096, "READ and atomics on UC");
}

/// Spec 13.2: UC's transitions take RC's connection attributes but not
/// its reliability ones (`INVALID`, detail the offending mask bits).
#[test]
fn rc_reliability_attributes_are_not_ucs() {
    let (_d, a, b) = two_vms();
    let cq = Cq::create(&a.dev, 16).unwrap();
    let q = uc_qp(&a, &cq);
    let peer_cq = Cq::create(&b.dev, 16).unwrap();
    let peer = uc_qp(&b, &peer_cq);
    let c = conn(&peer, &b);
    q.modify(&QpAttrs {
        state: Some(QpState::INIT),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(QP_ACCESS),
        ..QpAttrs::default()
    })
    .unwrap();
    let mut av = c.av;
    av.sgid_index = a.dev.gid_index();
    let rtr = QpAttrs {
        state: Some(QpState::RTR),
        av: Some(av),
        path_mtu: Some(c.path_mtu),
        dest_qpn: Some(c.dest_qpn),
        rq_psn: Some(0),
        ..QpAttrs::default()
    };
    let e = q
        .modify(&QpAttrs {
            max_dest_rd_atomic: Some(1),
            ..rtr
        })
        .unwrap_err();
    assert_eq!(
        e.status(),
        Some((Status::INVALID, attr::MAX_DEST_RD_ATOMIC))
    );
    q.modify(&rtr).unwrap();
    let e = q
        .modify(&QpAttrs {
            state: Some(QpState::RTS),
            sq_psn: Some(0),
            retry_cnt: Some(7),
            ..QpAttrs::default()
        })
        .unwrap_err();
    assert_eq!(e.status(), Some((Status::INVALID, attr::RETRY_CNT)));
}

/// Spec 18.11.6, 18.23: a UC QP and an RC QP connected to each other do
/// not talk: the UC sender's message is dropped, the RC sender's finds no
/// RC responder (unreachable: it retries and fails).
#[test]
fn uc_and_rc_do_not_mix() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 16).unwrap();
    let cqb = Cq::create(&b.dev, 16).unwrap();
    let qa = uc_qp(&a, &cqa);
    let qb = rc_qp(&b, &cqb);
    qa.uc_connect(QP_ACCESS, &conn(&qb, &b)).unwrap();
    let mut c = conn(&qa, &a);
    c.timeout = 8;
    c.retry_cnt = 1;
    qb.rc_connect(QP_ACCESS, &c).unwrap();
    let src = Buf::new(&a, 64);
    let dst = Buf::guarded(&b, 64);
    recv(&qb, 1, &[dst.sge(0, 64)]);
    qa.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 8)])])
        .unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    assert_eq!(dst.read(0, 8), vec![GUARD; 8], "nothing delivered");
    let back = Buf::new(&b, 64);
    qb.post_send(&[wr(3, SendOp::Send, &[back.sge(0, 8)])])
        .unwrap();
    failed(&poll_one(&cqb), 3, WcStatus::RETRY_EXC_ERR);
}

/// Spec 18.11.6: a message to a destroyed UC peer is dropped (no retries,
/// no error): the sender completes `SUCCESS` and stays in RTS.
#[test]
fn a_gone_peer_loses_messages_quietly() {
    let (_d, a, b) = two_vms();
    let p = uc_pair(&a, &b);
    let UcPair { cqa, qa, qb, cqb } = p;
    drop(qb);
    drop(cqb);
    let src = Buf::new(&a, 64);
    for i in 0..3 {
        qa.post_send(&[wr(i, SendOp::Send, &[src.sge(0, 8)])])
            .unwrap();
        ok(&poll_one(&cqa), i, WcOpcode::SEND);
    }
    assert_eq!(qa.query().unwrap().attr.qp_state, QpState::RTS as u32);
}
