#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A VM that moves as an image (`vhost_user_rdma_tests::vm_image`): its
//! guest RAM, VMM queues and driver objects written to a stream and read
//! back by a VMM and driver that never saw them, over the device state
//! its daemon saved; its RC connection goes on, every byte checked. The
//! cross-host move on the libibverbs transport (`scripts/qemu-rxe.sh`,
//! `rdma-peer move-out`/`move-in`) is built from the same pieces; here
//! the software RNIC's migration to a standby socket of the same daemon
//! carries the device side.

use serde_json::json;
use vhost_user_rdma_tests::dp::{assert_state, checked_round, rc_pair, Buf, Pair, Vm};
use vhost_user_rdma_tests::harness::{on_host_rnic, TestDaemon};
use vhost_user_rdma_tests::state_transfer::{migrating_vmm, save};
use vhost_user_rdma_tests::vm_image::VmImage;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::qp::QpState;

#[test]
fn a_vm_restored_from_its_image_keeps_its_objects_and_connection() {
    if on_host_rnic() {
        // Between sockets of one daemon only the software RNIC migrates;
        // the host RNIC's move is qemu-rxe's VERBS-MOVE-HOSTS.
        return;
    }
    vhost_user_rdma::logging::init(vhost_user_rdma::logging::LogFormat::Text);
    // VM 0's standby socket (index 2) is where its image comes back.
    let d = TestDaemon::with_standby(2).unwrap();
    let m = Vm::open(&d, 0, migrating_vmm());
    let p = Vm::open(&d, 1, VmmOptions::default());
    let Pair { cqa, cqb, qa, qb } = rc_pair(&m, &p);
    let pair = Pair { cqa, cqb, qa, qb };
    let mbuf = Buf::new(&m, 16384);
    let pbuf = Buf::new(&p, 16384);
    for seq in 1..=5 {
        checked_round(&pair, &mbuf, &pbuf, seq);
    }
    let (qpn, lkey, rkey) = (pair.qa.qpn(), mbuf.mr.lkey(), mbuf.mr.rkey());
    mbuf.write(12288, b"kept in the image's RAM");

    let bases = m.t.vmm().stop_queues().unwrap();
    let state = save(&mut *m.t.vmm()).unwrap();
    let image = VmImage::capture(
        &m,
        bases,
        state,
        &[&pair.cqa],
        &[&pair.qa],
        &[&mbuf],
        json!({"peer": pair.qb.qpn()}),
    )
    .unwrap();
    let mut bytes = Vec::new();
    image.write_to(&mut bytes).unwrap();
    // Cut short or not an image: refused, nothing restored.
    assert!(VmImage::read_from(&mut &bytes[..bytes.len() - 1]).is_err());
    assert!(VmImage::read_from(&mut &b"vhost-user-rdma VM image 9\n"[..]).is_err());
    let image = VmImage::read_from(&mut &bytes[..]).unwrap();
    assert_eq!(image.app["peer"], pair.qb.qpn());

    let moved = image.move_in(d.socket(2), migrating_vmm()).unwrap();
    // The source VMM exits once the destination runs; its driver objects
    // go with it (their destroys find the device gone).
    m.t.vmm().disconnect();
    let Pair { qa, cqa, cqb, qb } = pair;
    drop((qa, cqa, mbuf, m));

    let mut moved = moved;
    let mbuf = moved.bufs.remove(0);
    assert_eq!(mbuf.read(12288, 23), b"kept in the image's RAM");
    assert_eq!((mbuf.mr.lkey(), mbuf.mr.rkey()), (lkey, rkey));
    let pair = Pair {
        cqa: moved.cqs.remove(0),
        cqb,
        qa: moved.qps.remove(0),
        qb,
    };
    assert_eq!(pair.qa.qpn(), qpn);
    for seq in 6..=20 {
        checked_round(&pair, &mbuf, &pbuf, seq);
    }
    assert_state(&pair.qa, QpState::RTS);
    assert_state(&pair.qb, QpState::RTS);
    // The restored driver's control queue works: a new object, and the
    // moved ones destroyed at the end.
    let extra = Buf::new(&moved.vm, 4096);
    assert_ne!(extra.mr.lkey(), lkey);
    drop(extra);
    drop((pair, mbuf, pbuf, moved.vm, p));
    assert!(
        d.stats(0).device.resources.is_empty(),
        "objects left on the VM's instance"
    );
}
