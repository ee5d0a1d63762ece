//! What completions carry (spec 18.14): the fields of successful and of error
//! completions, `QP_COMM_EST` on the first message in RTR (spec 18.22), and
//! READs and atomics on a QP without `max_rd_atomic` (spec 18.8).

use vhost_user_rdma_tests::dp::{
    ah_to, assert_no_event, assert_state, cq_pair, expect_event, failed, ok, pattern, poll_one,
    rc_qp, recv, ud_qp, vms, wait_state, wr, Buf, QKEY, QP_ACCESS,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{SendFlags, SendOp, SendWr, Sge, UdDest};

use crate::fixtures::{assert_no_message_fields, conn, rc_pair, GRH};

/// The first message accepted by a QP in RTR queues one `QP_COMM_EST`
/// (spec 18.22); a QP in RTR receives SENDs.
#[test]
fn comm_est_on_first_message_in_rtr() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (cqa, cqb) = cq_pair(a, b);
    let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
    qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
    let cb = conn(&qa, a);
    qb.rc_to_init(QP_ACCESS).unwrap();
    qb.rc_to_rtr(&cb).unwrap();
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, b"hello rtr");
    let sg = [ba.sge(0, 9)];
    for k in 0..2u64 {
        recv(&qb, k, &[bb.sge(0, 64)]);
        qa.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&cqa), k, WcOpcode::SEND);
        ok(&poll_one(&cqb), k, WcOpcode::RECV);
        assert_eq!(bb.read(0, 9), b"hello rtr");
    }
    expect_event(&b.dev, EventKind::QP_COMM_EST, qb.handle());
    assert_no_event(&b.dev, "one QP_COMM_EST per entry into RTR");
    qb.rc_to_rts(&cb).unwrap();
    recv(&qb, 9, &[bb.sge(0, 64)]);
    qa.post_send(&[wr(9, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&cqb), 9, WcOpcode::RECV);
    assert_no_event(&b.dev, "in RTS");
}

/// The fields of successful completions (spec 18.14, table "Field values
/// of successful completions"): `src_qpn` is the sender's QP number only
/// for UD receives and 0 otherwise; requester completions carry no flag and
/// no immediate; `vendor_err` is 0.
#[test]
fn rc_completion_fields() {
    let (_d, vm) = vms(2);
    let p = rc_pair(&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(&vm[0], 4096), Buf::guarded(&vm[1], 4096));
    let sg = [ba.sge(0, 32)];
    let ops = [
        (SendOp::Send, WcOpcode::RECV, None),
        (SendOp::SendWithImm { imm: 5 }, WcOpcode::RECV, Some(5)),
        (
            SendOp::RdmaWriteWithImm {
                remote_addr: bb.addr(1024),
                rkey: bb.mr.rkey(),
                imm: 6,
            },
            WcOpcode::RECV_RDMA_WITH_IMM,
            Some(6),
        ),
    ];
    for (k, (op, rop, imm)) in ops.into_iter().enumerate() {
        let k = k as u64;
        recv(&p.qb, k, &[bb.sge(0, 64)]);
        p.qa.post_send(&[wr(k, op, &sg)]).unwrap();
        let s = poll_one(&p.cqa);
        assert!(s.is_success(), "{s:?}");
        assert_eq!(
            (s.flags, s.imm_data, s.src_qpn, s.vendor_err, s.byte_len),
            (0, 0, 0, 0, 32),
            "requester {s:?}"
        );
        let r = poll_one(&p.cqb);
        ok(&r, k, rop);
        assert_eq!(r.imm(), imm, "{r:?}");
        assert_eq!(r.imm_data, imm.unwrap_or(0), "{r:?}");
        assert_eq!((r.src_qpn, r.vendor_err), (0, 0), "RC receive {r:?}");
    }
}

// ---------------------------------------------------------------------------
// Error completions and malformed work requests

/// A solicited SEND_WITH_IMM over `sg`.
fn solicited_send_with_imm(wr_id: u64, sg: &[Sge]) -> SendWr<'_> {
    let mut w = wr(wr_id, SendOp::SendWithImm { imm: 0x1234_5678 }, sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    w
}

/// Error completions carry `wr_id`, `status`, `opcode` and `qpn` only;
/// `byte_len`, `flags`, `imm_data` and `src_qpn` are 0 (spec 18.14),
/// whatever the failed message carried. A solicited RC SEND_WITH_IMM one
/// byte too long for the receive buffer fails at both ends; the same UD
/// message fails at the receiver, which would otherwise report CQE_GRH and
/// the sender's QPN.
#[test]
fn error_completions_carry_no_message_fields() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    let sg = [ba.sge(0, 65)];
    // RC.
    let p = rc_pair(a, b);
    recv(&p.qb, 1, &[bb.sge(0, 64)]);
    p.qa.post_send(&[solicited_send_with_imm(2, &sg)]).unwrap();
    let s = poll_one(&p.cqa);
    failed(&s, 2, WcStatus::REM_INV_REQ_ERR);
    assert_eq!(
        (s.opcode(), s.qpn),
        (Some(WcOpcode::SEND), p.qa.qpn()),
        "{s:?}"
    );
    assert_no_message_fields(&s, "RC requester");
    let r = poll_one(&p.cqb);
    failed(&r, 1, WcStatus::LOC_LEN_ERR);
    assert_eq!(
        (r.opcode(), r.qpn),
        (Some(WcOpcode::RECV), p.qb.qpn()),
        "{r:?}"
    );
    assert_no_message_fields(&r, "RC responder");
    // UD: room for the GRH, not for the message.
    let (cqa, cqb) = cq_pair(a, b);
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    recv(&ub, 3, &[bb.sge(1024, GRH + 64)]);
    let mut w = solicited_send_with_imm(4, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::SEND);
    let r = poll_one(&cqb);
    failed(&r, 3, WcStatus::LOC_LEN_ERR);
    assert_eq!(
        (r.opcode(), r.qpn),
        (Some(WcOpcode::RECV), ub.qpn()),
        "{r:?}"
    );
    assert_no_message_fields(&r, "UD receiver");
}

/// An RDMA READ or atomic on a QP whose `max_rd_atomic` is 0 is malformed
/// (spec 18.8): it fails with `LOC_QP_OP_ERR` before anything reaches the
/// responder; the requester goes to ERR, no event on either side, the
/// responder stays in RTS and its memory and the local buffer are
/// untouched.
#[test]
fn rd_atomic_without_max_rd_atomic_is_malformed() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    bb.write(0, &pattern(64, 2));
    let (remote_addr, rkey) = (bb.addr(0), bb.mr.rkey());
    let ops = [
        (
            SendOp::RdmaRead { remote_addr, rkey },
            64,
            WcOpcode::RDMA_READ,
        ),
        (
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            8,
            WcOpcode::FETCH_ADD,
        ),
        (
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
            8,
            WcOpcode::COMP_SWAP,
        ),
    ];
    for (op, len, wop) in ops {
        let (cqa, cqb) = cq_pair(a, b);
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut ca = conn(&qb, b);
        ca.max_rd_atomic = 0;
        qa.rc_connect(QP_ACCESS, &ca).unwrap();
        qb.rc_connect(QP_ACCESS, &conn(&qa, a)).unwrap();
        qa.post_send(&[wr(1, op, &[ba.sge(0, len)])]).unwrap();
        let wc = poll_one(&cqa);
        failed(&wc, 1, WcStatus::LOC_QP_OP_ERR);
        assert_eq!(wc.opcode(), Some(wop), "{wc:?}");
        wait_state(&qa, QpState::ERR);
        assert_state(&qb, QpState::RTS);
        ba.assert_untouched(0, 4096, "local buffer of a malformed WQE");
        assert_eq!(bb.read(0, 64), pattern(64, 2), "responder memory changed");
        assert_no_event(&a.dev, "malformed WQE (requester)");
        assert_no_event(&b.dev, "malformed WQE (responder)");
    }
}
