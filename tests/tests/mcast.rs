//! UD multicast (`F_MCAST`, spec 12.27, 18.11.7) through the real
//! vhost-user socket and the reference driver: a send to a group reaches
//! every QP of the sender's tenant attached to it (the sender's own VM
//! included), each with the group's GID in its GRH, and no QP of another
//! tenant attached to the same group; detaching, destroying a QP and the
//! limits; what `ATTACH_MCAST` refuses.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    ah, assert_quiet, ok, open, poll_one, rc_qp, recv, status, ud_qp, Buf, Vm, QKEY,
};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use virtio_rdma_abi::ctrl::{quota, Status};
use virtio_rdma_abi::datapath::{WcOpcode, UD_GRH_SIZE};
use virtio_rdma_abi::verbs::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MCAST_QPN};
use virtio_rdma_driver::{Cq, Qp, SendOp, SendWr, UdDest};

/// An IPv4-mapped group, 239.1.1.`n` (RoCE v2's GID of that address).
fn group(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[239, 1, 1, n]);
    g
}

/// A UD QP of `vm` on a fresh CQ, with a receive of 256 bytes posted.
fn member(vm: &Vm, buf: &Buf, off: usize) -> (Arc<Cq>, Qp) {
    let cq = Cq::create(&vm.dev, 16).unwrap();
    let q = ud_qp(vm, &cq, 4);
    recv(&q, off as u64, &[buf.sge(off, 256)]);
    (cq, q)
}

/// Sends `data` from `q` (on `vm`) to group `g`.
fn send_to_group(vm: &Vm, q: &Qp, src: &Buf, g: [u8; 16], data: &[u8]) {
    src.write(0, data);
    let ah = ah(vm, g).expect("an AH for the group");
    let sg = [src.sge(0, data.len())];
    let wr = SendWr {
        ud: Some(UdDest {
            ah: &ah,
            remote_qpn: MCAST_QPN,
            remote_qkey: QKEY,
        }),
        ..SendWr::signaled(7, SendOp::Send, &sg)
    };
    q.post_send(&[wr]).unwrap();
    ok(&poll_one(q.send_cq()), 7, WcOpcode::SEND);
}

/// Spec 18.11.7: one send reaches the attached QPs of its tenant, in the
/// sender's VM and in another, with the group's GID as the GRH's
/// destination; an attached QP of another tenant, and a QP of the tenant
/// not attached, get nothing.
#[test]
fn a_send_reaches_the_tenants_attached_qps_only() {
    let d = TestDaemon::with_config(3, |c| {
        add_tenant(c, "red", &[2]);
    })
    .unwrap();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let g = group(1);
    let (ba, bb, br) = (Buf::new(&a, 4096), Buf::new(&b, 4096), Buf::new(&red, 4096));
    let (cq_a, qa) = member(&a, &ba, 1024);
    let (cq_b1, qb1) = member(&b, &bb, 0);
    let (cq_b2, qb2) = member(&b, &bb, 1024);
    let (cq_out, _qout) = member(&b, &bb, 2048);
    let (cq_red, qred) = member(&red, &br, 0);
    for q in [&qa, &qb1, &qb2, &qred] {
        q.attach_mcast(g).unwrap();
    }
    // Attaching again changes nothing.
    qb1.attach_mcast(g).unwrap();
    let (_cq_s, sender) = member(&a, &ba, 2048);
    let src = Buf::new(&a, 64);
    send_to_group(&a, &sender, &src, g, b"to the whole group");
    for (cq, q, buf, off) in [
        (&cq_a, &qa, &ba, 1024),
        (&cq_b1, &qb1, &bb, 0),
        (&cq_b2, &qb2, &bb, 1024),
    ] {
        let r = poll_one(cq);
        ok(&r, off as u64, WcOpcode::RECV);
        assert_eq!(r.byte_len, UD_GRH_SIZE + 18);
        assert_eq!(r.src_qpn, sender.qpn());
        assert_eq!(r.qpn, q.qpn());
        let grh = buf.read(off, UD_GRH_SIZE as usize);
        assert_eq!(&grh[24..40], &g, "the GRH's destination is the group");
        assert_eq!(
            buf.read(off + UD_GRH_SIZE as usize, 18),
            b"to the whole group"
        );
    }
    assert_quiet(&cq_out);
    assert_quiet(&cq_red);
    assert!(d.traffic(0).send_bytes >= 3 * 18, "charged per copy");
}

/// Spec 12.27, 18.11.7: a detached QP, and a destroyed one, no longer
/// receive; a group none of the tenant's QPs is in drops the message and
/// the send succeeds.
#[test]
fn detached_and_destroyed_members_receive_nothing() {
    let d = TestDaemon::start(2).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let g = group(2);
    let bb = Buf::new(&b, 4096);
    let (cq1, q1) = member(&b, &bb, 0);
    let (cq2, q2) = member(&b, &bb, 1024);
    q1.attach_mcast(g).unwrap();
    q2.attach_mcast(g).unwrap();
    q1.detach_mcast(g).unwrap();
    assert_eq!(
        status(q1.detach_mcast(g)),
        (Status::INVALID, 8),
        "not attached"
    );
    drop(q2);
    let ba = Buf::new(&a, 4096);
    let (_cq, sender) = member(&a, &ba, 0);
    let src = Buf::new(&a, 64);
    send_to_group(&a, &sender, &src, g, b"anyone?");
    send_to_group(&a, &sender, &src, group(3), b"nobody");
    assert_quiet(&cq1);
    assert_quiet(&cq2);
}

/// Spec 12.27: what `ATTACH_MCAST` refuses: a QP that is not UD, a GID
/// that is not a group, a bad handle, more than `MAX_MCAST_QP_ATTACH` QPs
/// in a group or `MAX_MCAST_GRP` groups.
#[test]
fn attach_checks_its_request_and_its_limits() {
    let d = TestDaemon::start(1).unwrap();
    let a = open(&d, 0);
    let cq = Cq::create(&a.dev, 16).unwrap();
    let rc = rc_qp(&a, &cq);
    assert_eq!(status(rc.attach_mcast(group(1))), (Status::INVALID, 0));
    let ud = ud_qp(&a, &cq, 4);
    assert_eq!(status(ud.attach_mcast(a.dev.gid())), (Status::INVALID, 8));
    let mut qps = Vec::new();
    for _ in 0..MAX_MCAST_QP_ATTACH {
        let q = ud_qp(&a, &cq, 1);
        q.attach_mcast(group(9)).unwrap();
        qps.push(q);
    }
    assert_eq!(
        status(ud.attach_mcast(group(9))),
        (Status::QUOTA, quota::MCAST_MEMBERS)
    );
    for n in 0..MAX_MCAST_GRP - 1 {
        ud.attach_mcast(group(100 + n as u8)).unwrap();
    }
    assert_eq!(
        status(ud.attach_mcast(group(250))),
        (Status::QUOTA, quota::MCAST_GROUPS)
    );
}
