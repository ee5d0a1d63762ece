#![allow(clippy::unwrap_used)]
//! The daemon answers a control command through the real socket.

use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{QpInit, Verbs};

#[test]
fn daemon_answers() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let cfg = vm.config().unwrap();
    assert_eq!(cfg.abi_version, virtio_rdma_abi::ABI_VERSION);
    let mut v = Verbs::new(&mut vm);
    let dev = v.query_device().unwrap();
    assert_eq!(dev.max_qp, cfg.max_qp);
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    let (_, gid) = v.own_gid().unwrap();
    v.connect_rc(qp.handle, qp.qpn, gid).unwrap();
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qp_state, 3);
    assert_eq!(d.stats(0).device.resources.qp, 1);
    drop(vm);
    let s = d.wait_released(0);
    assert!(s.device.resources.is_empty(), "{s:?}");
    assert_eq!(d.daemon().qpns_in_use(), 0);
}
