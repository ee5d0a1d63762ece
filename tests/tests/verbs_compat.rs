#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What real verbs software (Linux ib_core, rdma-core, perftest) needs from
//! the device, end to end through the reference driver and the real
//! vhost-user socket: values it reads (port and device attributes, the UD
//! GRH) and arguments it passes (`LOCAL_WRITE` in a QP's access, QPs
//! without send SGEs).

use vhost_user_rdma_tests::dp::*;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{Cq, SendOp};

fn two_vms() -> (TestDaemon, Vm, Vm) {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    (d, a, b)
}

/// Spec 10.5: `LOCAL_WRITE` in a QP's access is accepted (perftest's
/// `ib_send_bw` passes it), stored and reported back by QUERY_QP, and grants
/// nothing: remote rights still come from the `REMOTE_*` bits alone.
#[test]
fn qp_access_accepts_local_write() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
    let granted = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    qa.rc_connect(access::LOCAL_WRITE, &conn(&qb, &b)).unwrap();
    qb.rc_connect(granted, &conn(&qa, &a)).unwrap();
    assert_eq!(qa.query().unwrap().attr.access, access::LOCAL_WRITE);
    assert_eq!(qb.query().unwrap().attr.access, granted);

    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let data = pattern(1000, 1);
    ba.write(0, &data);
    let sg = [ba.sge(0, data.len())];
    let op = SendOp::RdmaWrite {
        remote_addr: bb.addr(0),
        rkey: bb.mr.rkey(),
    };
    qa.post_send(&[wr(1, op, &sg)]).unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(0, data.len()), data);

    // qa allows LOCAL_WRITE only: a WRITE from qb into it is refused.
    let sg = [bb.sge(0, 16)];
    let op = SendOp::RdmaWrite {
        remote_addr: ba.addr(2048),
        rkey: ba.mr.rkey(),
    };
    qb.post_send(&[wr(2, op, &sg)]).unwrap();
    let wc = poll_one(&cqb);
    assert_eq!(wc.wr_id, 2);
    assert_eq!(wc.status(), Some(WcStatus::REM_ACCESS_ERR), "{wc:?}");
    assert_eq!(ba.read(2048, 16), vec![0; 16], "the refused WRITE landed");
}
