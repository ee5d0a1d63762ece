//! Errors and corner cases of the operations (spec 18.11, 18.18): remote
//! access and length errors, zero-length messages, an RDMA_WRITE_WITH_IMM
//! without a receive WQE, and READs and atomics to a responder whose
//! `max_dest_rd_atomic` is 0.

use vhost_user_rdma_tests::dp::{
    ah_to, assert_no_event, assert_quiet, assert_state, cq_pair, expect_event, failed, ok, pattern,
    poll_n, poll_one, rc_qp, recv, sges, ud_qp, vms, wait_state, wr, write_op, Buf, QKEY,
    QP_ACCESS,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, Payload, Pd, SendFlags, SendOp, SendWr, UdDest};

use crate::fixtures::{conn, rc_pair, GRH};

/// Remote access errors (spec 18.11.2, 18.11.3, 18.18): the requester's WQE
/// completes with `REM_ACCESS_ERR`, both QPs go to ERR, the responder's VM
/// gets `QP_ACCESS_ERROR` for its QP, no receive is consumed and no byte of
/// the target is written; later work on the requester is flushed.
#[test]
fn remote_access_errors() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other_pd = Pd::alloc(&b.dev).unwrap();
    struct Case {
        what: &'static str,
        mr_access: u32,
        other_pd: bool,
        qp_access: u32,
        read: bool,
        /// Offset and length in the 4096-byte target MR.
        off: usize,
        len: usize,
    }
    let base = Case {
        what: "",
        mr_access: access::ALL,
        other_pd: false,
        qp_access: QP_ACCESS,
        read: false,
        off: 0,
        len: 64,
    };
    let cases = [
        Case {
            what: "WRITE to an MR without REMOTE_WRITE",
            mr_access: access::LOCAL_WRITE | access::REMOTE_READ,
            ..base
        },
        Case {
            what: "READ from an MR without REMOTE_READ",
            mr_access: access::LOCAL_WRITE | access::REMOTE_WRITE,
            read: true,
            ..base
        },
        Case {
            what: "WRITE to a QP without REMOTE_WRITE",
            qp_access: access::REMOTE_READ,
            ..base
        },
        Case {
            what: "READ from a QP without REMOTE_READ",
            qp_access: access::REMOTE_WRITE,
            read: true,
            ..base
        },
        Case {
            what: "WRITE one byte past the end of the MR",
            off: 4096 - 63,
            ..base
        },
        Case {
            what: "WRITE to an MR of another PD",
            other_pd: true,
            ..base
        },
    ];
    for c in &cases {
        let cqa = Cq::create(&a.dev, 64).unwrap();
        let cqb = Cq::create(&b.dev, 64).unwrap();
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
        qb.rc_connect(c.qp_access, &conn(&qa, a)).unwrap();
        let pd = if c.other_pd { &other_pd } else { &b.pd };
        let target = Buf::with_access(b, pd, 4096, c.mr_access);
        let local = Buf::guarded(a, 4096);
        let inbox = Buf::guarded(b, 4096);
        recv(&qb, 1, &[inbox.sge(0, 4096)]);
        local.write(0, &pattern(64, 9));
        let sg = [local.sge(0, c.len)];
        let op = if c.read {
            SendOp::RdmaRead {
                remote_addr: target.addr(c.off),
                rkey: target.mr.rkey(),
            }
        } else {
            write_op(&target, c.off)
        };
        qa.post_send(&[wr(10, op, &sg), wr(11, SendOp::Send, &sg)])
            .unwrap();
        let wcs = poll_n(&cqa, 2);
        assert_eq!(wcs[0].wr_id, 10, "{}: {wcs:?}", c.what);
        assert_eq!(
            wcs[0].status(),
            Some(WcStatus::REM_ACCESS_ERR),
            "{}: {wcs:?}",
            c.what
        );
        failed(&wcs[1], 11, WcStatus::WR_FLUSH_ERR);
        expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, qb.handle());
        assert_no_event(&b.dev, c.what);
        assert_no_event(&a.dev, c.what);
        wait_state(&qa, QpState::ERR);
        wait_state(&qb, QpState::ERR);
        target.assert_untouched(0, 4096, c.what);
        // The receive was not consumed by the failed WQE: it is flushed.
        let r = poll_one(&cqb);
        failed(&r, 1, WcStatus::WR_FLUSH_ERR);
        inbox.assert_untouched(0, 4096, c.what);
        assert_quiet(&cqb);
    }
}

/// Length errors (spec 18.11.1, 18.13, 18.18). RC: a SEND one byte longer
/// than the receive buffers fails with `REM_INV_REQ_ERR`, the consumed
/// receive with `LOC_LEN_ERR`, both QPs go to ERR, no event, no byte past
/// the receive buffers written. UD: a message that does not fit after the
/// GRH completes successfully at the sender and with `LOC_LEN_ERR` at the
/// receiver, which goes to ERR and drops what follows.
#[test]
fn length_errors() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    // RC.
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, &pattern(200, 3));
    recv(&p.qb, 1, &[bb.sge(0, 60), bb.sge(1000, 40)]);
    let sg = sges(&ba, 0, 101);
    p.qa.post_send(&[wr(2, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&p.cqa), 2, WcStatus::REM_INV_REQ_ERR);
    let r = poll_one(&p.cqb);
    failed(&r, 1, WcStatus::LOC_LEN_ERR);
    assert_eq!(r.qpn, p.qb.qpn());
    assert!(r.raw_opcode & 0x80 != 0, "a receive completion: {r:?}");
    wait_state(&p.qa, QpState::ERR);
    wait_state(&p.qb, QpState::ERR);
    bb.assert_untouched(60, 940, "between the receive SGEs");
    bb.assert_untouched(1040, 4096 - 1040, "past the receive SGEs");
    assert_no_event(&a.dev, "RC length error (requester)");
    assert_no_event(&b.dev, "RC length error (responder)");
    // UD.
    let (cqa, cqb) = cq_pair(a, b);
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    let ub_buf = Buf::guarded(b, 4096);
    recv(&ub, 3, &[ub_buf.sge(0, GRH + 50)]);
    recv(&ub, 4, &[ub_buf.sge(2048, 1024)]);
    let dest = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    let sg = [ba.sge(0, 51)];
    let mut w = wr(5, SendOp::Send, &sg);
    w.ud = dest;
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 5, WcOpcode::SEND);
    failed(&poll_one(&cqb), 3, WcStatus::LOC_LEN_ERR);
    wait_state(&ub, QpState::ERR);
    ub_buf.assert_untouched(GRH + 50, 2048 - GRH - 50, "past a UD receive");
    // The receiver in ERR flushes its other receive and drops messages.
    failed(&poll_one(&cqb), 4, WcStatus::WR_FLUSH_ERR);
    let sg = [ba.sge(0, 10)];
    let mut w = wr(6, SendOp::Send, &sg);
    w.ud = dest;
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 6, WcOpcode::SEND);
    assert_state(&ua, QpState::RTS);
    assert_quiet(&cqb);
    ub_buf.assert_untouched(2048, 2048, "a dropped UD message");
}

/// Zero-length SENDs (spec 18.9, 18.10, 18.13): without SGEs, with an
/// empty inline payload and with immediate data, RC and UD. The receive
/// completes with `byte_len` 0 (UD: 40, the GRH alone) and no byte of the
/// receive buffer is written (UD: only the GRH).
#[test]
fn zero_length_send() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let bb = Buf::guarded(b, 4096);
    recv(&p.qb, 1, &[bb.sge(0, 128)]);
    p.qa.post_send(&[wr(1, SendOp::Send, &[])]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::SEND);
    assert_eq!(s.byte_len, 0);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.imm()), (0, None));
    recv(&p.qb, 2, &[bb.sge(128, 128)]);
    p.qa.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::SendWithImm { imm: 0xFEED },
        payload: Payload::Inline(&[]),
        flags: SendFlags::SIGNALED,
        ud: None,
    }])
    .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 2, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.imm()), (0, Some(0xFEED)));
    // A receive without SGEs takes a zero-length SEND.
    recv(&p.qb, 3, &[]);
    p.qa.post_send(&[wr(3, SendOp::Send, &[])]).unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 3, WcOpcode::RECV);
    assert_eq!(r.byte_len, 0);
    bb.assert_untouched(0, 4096, "zero-length RC SENDs");
    assert_state(&p.qa, QpState::RTS);
    assert_state(&p.qb, QpState::RTS);
    // UD: the GRH alone.
    let (cqa, cqb) = cq_pair(a, b);
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    let ubuf = Buf::guarded(b, 4096);
    recv(&ub, 4, &[ubuf.sge(0, 1024)]);
    let mut w = wr(4, SendOp::SendWithImm { imm: 9 }, &[]);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 4, WcOpcode::RECV);
    assert!(r.has_grh());
    assert_eq!((r.byte_len as usize, r.imm()), (GRH, Some(9)));
    assert_eq!(r.src_qpn, ua.qpn());
    assert_eq!(ubuf.read(8, 16), a.dev.gid());
    assert_eq!(ubuf.read(24, 16), b.dev.gid());
    ubuf.assert_untouched(GRH, 4096 - GRH, "a zero-length UD SEND");
}

/// Zero-length RDMA operations access no memory and check neither `rkey`
/// nor `remote_addr` (spec 18.11.2, 18.11.3): a zero-length
/// RDMA_WRITE_WITH_IMM with `rkey` 0 delivers just the immediate value, a
/// zero-length RDMA READ or WRITE with a bogus key succeeds.
#[test]
fn zero_length_rdma_ignores_rkey() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    recv(&p.qb, 1, &[]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: 0xABCD,
    };
    p.qa.post_send(&[wr(1, op, &[])]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::RDMA_WRITE);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!((r.byte_len, r.imm()), (0, Some(0xABCD)));
    let read = SendOp::RdmaRead {
        remote_addr: 0x1234_5678,
        rkey: 0xDEAD_BEEF,
    };
    let write = SendOp::RdmaWrite {
        remote_addr: 0x1234_5678,
        rkey: 0xDEAD_BEEF,
    };
    p.qa.post_send(&[wr(2, read, &[]), wr(3, write, &[])])
        .unwrap();
    let w = poll_n(&p.cqa, 2);
    ok(&w[0], 2, WcOpcode::RDMA_READ);
    assert_eq!(w[0].byte_len, 0);
    ok(&w[1], 3, WcOpcode::RDMA_WRITE);
    assert_state(&p.qb, QpState::RTS);
    assert_no_event(&b.dev, "zero-length RDMA");
}

/// RDMA_WRITE_WITH_IMM without a receive WQE at the responder: RNR, and
/// nothing is written (spec 18.11.2: the device makes sure a receive WQE is
/// available before it writes any data).
#[test]
fn write_with_imm_rnr_writes_nothing() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (cqa, cqb) = cq_pair(a, b);
    let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
    let mut ca = conn(&qb, b);
    ca.rnr_retry = 0;
    qa.rc_connect(QP_ACCESS, &ca).unwrap();
    let mut cb = conn(&qa, a);
    cb.min_rnr_timer = 1;
    qb.rc_connect(QP_ACCESS, &cb).unwrap();
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, &pattern(100, 8));
    let sg = [ba.sge(0, 100)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: bb.addr(0),
        rkey: bb.mr.rkey(),
        imm: 1,
    };
    qa.post_send(&[wr(1, op, &sg)]).unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RNR_RETRY_EXC_ERR);
    bb.assert_untouched(0, 4096, "RDMA_WRITE_WITH_IMM without a receive");
    assert_state(&qb, QpState::RTS);
    assert_quiet(&cqb);
}

/// An RDMA READ or atomic to a responder whose `max_dest_rd_atomic` is 0 is
/// an invalid request (spec 18.11.3, 18.18): `REM_INV_REQ_ERR`, both QPs in
/// ERR, `QP_REQ_ERROR` for the responder, nothing read or changed.
#[test]
fn read_to_responder_without_rd_atomic() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    bb.write(0, &pattern(64, 1));
    let ops = [
        SendOp::RdmaRead {
            remote_addr: bb.addr(0),
            rkey: bb.mr.rkey(),
        },
        SendOp::AtomicFetchAdd {
            remote_addr: bb.addr(0),
            rkey: bb.mr.rkey(),
            add: 1,
        },
    ];
    for (op, len) in ops.into_iter().zip([64, 8]) {
        let (cqa, cqb) = cq_pair(a, b);
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
        let mut cb = conn(&qa, a);
        cb.max_dest_rd_atomic = 0;
        qb.rc_connect(QP_ACCESS, &cb).unwrap();
        let sg = [ba.sge(0, len)];
        qa.post_send(&[wr(1, op, &sg)]).unwrap();
        failed(&poll_one(&cqa), 1, WcStatus::REM_INV_REQ_ERR);
        expect_event(&b.dev, EventKind::QP_REQ_ERROR, qb.handle());
        wait_state(&qa, QpState::ERR);
        wait_state(&qb, QpState::ERR);
        ba.assert_untouched(0, 4096, "READ or atomic refused");
        assert_eq!(bb.read(0, 64), pattern(64, 1), "responder memory changed");
    }
}
