//! Fenced work requests (spec 18.12) and CQs armed for solicited completions
//! only (spec 18.16).

use vhost_user_rdma_tests::dp::{
    assert_quiet, failed, ok, pattern, poll_n, poll_one, recv, sges, vms, wr, write_op, Buf, QUIET,
    WAIT,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_driver::{Cq, SendFlags, SendOp};

use crate::fixtures::rc_pair;

/// `WQE_FENCE` (spec 18.12): a SEND fenced behind an RDMA READ sends the
/// bytes the READ fetched, and a WRITE fenced behind a FETCH_ADD writes the
/// fetched value. An unsignaled successful WQE in between produces no CQE.
#[test]
fn fence_after_read_and_atomic() {
    const LEN: usize = (1 << 20) + 5;
    /// An 8-byte aligned counter past the data.
    const CTR: usize = LEN.next_multiple_of(8) + 8;
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let remote = Buf::guarded(b, LEN + 4096);
    let data = pattern(LEN, 4242);
    remote.write(0, &data);
    remote.write(CTR, &41u64.to_le_bytes());
    let local = Buf::guarded(a, LEN + 4096);
    local.write(0, &vec![0; LEN + 4096]);
    let inbox = Buf::guarded(b, 8192);
    recv(&p.qb, 7, &[inbox.sge(0, 8192)]);
    let rsg = sges(&local, 0, LEN);
    let read = SendOp::RdmaRead {
        remote_addr: remote.addr(0),
        rkey: remote.mr.rkey(),
    };
    // The head and the tail of what the READ brings.
    let ssg = [local.sge(0, 3000), local.sge(LEN - 3000, 3000)];
    let mut send = wr(2, SendOp::Send, &ssg);
    send.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    let mut unsignaled = wr(3, write_op(&remote, CTR + 64), &ssg[..1]);
    unsignaled.flags = SendFlags::NONE;
    let fsg = [local.sge(CTR, 8)];
    let fadd = SendOp::AtomicFetchAdd {
        remote_addr: remote.addr(CTR),
        rkey: remote.mr.rkey(),
        add: 1,
    };
    let mut fenced_write = wr(5, write_op(&remote, CTR + 8), &fsg);
    fenced_write.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    p.qa.post_send(&[
        wr(1, read, &rsg),
        send,
        unsignaled,
        wr(4, fadd, &fsg),
        fenced_write,
    ])
    .unwrap();
    let wcs = poll_n(&p.cqa, 4);
    ok(&wcs[0], 1, WcOpcode::RDMA_READ);
    assert_eq!(wcs[0].byte_len as usize, LEN);
    ok(&wcs[1], 2, WcOpcode::SEND);
    ok(&wcs[2], 4, WcOpcode::FETCH_ADD);
    ok(&wcs[3], 5, WcOpcode::RDMA_WRITE);
    let r = poll_one(&p.cqb);
    ok(&r, 7, WcOpcode::RECV);
    assert_eq!(r.byte_len, 6000);
    assert_eq!(
        inbox.read(0, 3000),
        data[..3000],
        "SEND saw the READ's data"
    );
    assert_eq!(inbox.read(3000, 3000), data[LEN - 3000..]);
    assert_eq!(
        remote.read(CTR + 64, 3000),
        data[..3000],
        "unsignaled WRITE"
    );
    assert_eq!(remote.u64_at(CTR), 42);
    assert_eq!(remote.u64_at(CTR + 8), 41, "WRITE saw the fetched value");
    assert_quiet(&p.cqa);
    assert_quiet(&p.cqb);
}

/// `ARM_SOLICITED` (spec 18.12, 18.16): only a solicited completion (SEND or
/// RDMA_WRITE_WITH_IMM with `WQE_SOLICITED`) or a failed one raises the
/// event; completions carry `CQE_SOLICITED` exactly when solicited, and the
/// requester's completion carries no flag.
#[test]
fn arm_solicited_fires_only_for_solicited_or_failed() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::guarded(a, 4096), Buf::guarded(b, 4096));
    ba.write(0, &pattern(256, 5));
    let sg = [ba.sge(0, 64)];
    let arm = |cq: &Cq| {
        cq.req_notify(true);
        assert_eq!(cq.poll_one(), None);
    };
    // Unsolicited SEND: a completion, no event.
    arm(&p.cqb);
    recv(&p.qb, 1, &[bb.sge(0, 256)]);
    p.qa.post_send(&[wr(1, SendOp::Send, &sg)]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::SEND);
    assert_eq!(s.flags, 0);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert!(!r.is_solicited(), "{r:?}");
    assert!(!p.cqb.wait_event(Some(QUIET)).unwrap(), "unsolicited SEND");
    // The same arming is still pending: a solicited SEND_WITH_IMM fires it.
    recv(&p.qb, 2, &[bb.sge(0, 256)]);
    let mut w = wr(2, SendOp::SendWithImm { imm: 0x0102_0304 }, &sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.qa.post_send(&[w]).unwrap();
    assert!(p.cqb.wait_event(Some(WAIT)).unwrap(), "solicited SEND");
    let s = poll_one(&p.cqa);
    ok(&s, 2, WcOpcode::SEND);
    assert_eq!(s.flags, 0, "requester completions carry no flag");
    let r = poll_one(&p.cqb);
    ok(&r, 2, WcOpcode::RECV);
    assert!(r.is_solicited(), "{r:?}");
    assert_eq!(r.imm(), Some(0x0102_0304));
    assert!(
        !p.cqb.wait_event(Some(QUIET)).unwrap(),
        "one event per arming"
    );
    // Solicited RDMA_WRITE_WITH_IMM.
    arm(&p.cqb);
    recv(&p.qb, 3, &[]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: bb.addr(1000),
        rkey: bb.mr.rkey(),
        imm: 77,
    };
    let mut w = wr(3, op, &sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.qa.post_send(&[w]).unwrap();
    assert!(
        p.cqb.wait_event(Some(WAIT)).unwrap(),
        "solicited WRITE_WITH_IMM"
    );
    let r = poll_one(&p.cqb);
    ok(&r, 3, WcOpcode::RECV_RDMA_WITH_IMM);
    assert!(r.is_solicited(), "{r:?}");
    assert_eq!(r.byte_len, 64);
    assert_eq!(bb.read(1000, 64), ba.read(0, 64));
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    // On the requester: a successful completion does not fire an
    // ARM_SOLICITED request, a failed one does.
    arm(&p.cqa);
    p.qa.post_send(&[wr(4, write_op(&bb, 0), &sg)]).unwrap();
    ok(&poll_one(&p.cqa), 4, WcOpcode::RDMA_WRITE);
    assert!(!p.cqa.wait_event(Some(QUIET)).unwrap(), "successful WRITE");
    let mut bad = ba.sge(0, 16);
    bad.lkey ^= 0x00ab_cd00;
    let bad = [bad];
    p.qa.post_send(&[wr(5, write_op(&bb, 0), &bad)]).unwrap();
    assert!(p.cqa.wait_event(Some(WAIT)).unwrap(), "failed WRITE");
    failed(&poll_one(&p.cqa), 5, WcStatus::LOC_PROT_ERR);
}
