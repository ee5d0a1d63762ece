#![allow(clippy::unwrap_used)]
//! A daemon started from a configuration file gives each VM its own limits
//! and GID, seen through the real vhost-user socket.

use vhost_user_rdma::config::LimitOverrides;
use vhost_user_rdma::config_file;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{QpInit, Verbs};
use vhost_user_rdma_tests::Error;

#[test]
fn per_vm_limits_and_gid_from_the_file() {
    let d = TestDaemon::from_config(|dir| {
        let text = format!(
            r#"
[daemon]
ctrl_poll_us = 10

[defaults.limits]
max_qp = 4096
max_cq = 64

[[qos_class]]
name = "gold"
weight = 400

[[tenant]]
name = "blue"
qos_class = "gold"

[[tenant]]
name = "red"

[[vm]]
name = "small"
socket = "{0}/small.sock"
tenant = "blue"
gid = "fd00::42:1"
[vm.limits]
max_qp = 2

[[vm]]
name = "big"
socket = "{0}/big.sock"
tenant = "red"
[vm.limits]
max_qp = 256
"#,
            dir.display()
        );
        let path = dir.join("config.toml");
        std::fs::write(&path, text).unwrap();
        config_file::load(&path, &LimitOverrides::default())
            .map(|l| l.config)
            .map_err(|e| Error::Backend(e.to_string()))
    })
    .unwrap();

    // VM 0: max_qp 2 from [vm.limits], the configured GID.
    let mut vm = d.connect(0).unwrap();
    let cfg = vm.config().unwrap();
    assert_eq!(cfg.max_qp, 2);
    assert_eq!(cfg.max_cq, 64);
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_device().unwrap().max_qp, 2);
    let gid: std::net::Ipv6Addr = "fd00::42:1".parse().unwrap();
    assert_eq!(v.query_gid(1, 0).unwrap().gid, gid.octets());
    // The limit is enforced: a third QP is refused.
    let ctx = v.create_ctx().unwrap();
    let pd = v.alloc_pd(ctx).unwrap();
    let cq = v.create_cq(ctx, 64).unwrap();
    v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    assert!(v.create_qp(&QpInit::rc(pd, cq)).is_err());
    drop(vm);

    // VM 1: max_qp 256, the default GID of index 1 (::ffff:10.42.0.2).
    let mut vm = d.connect(1).unwrap();
    let cfg = vm.config().unwrap();
    assert_eq!(cfg.max_qp, 256);
    assert_eq!(cfg.max_cq, 64);
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_device().unwrap().max_qp, 256);
    let gid: std::net::Ipv6Addr = "::ffff:10.42.0.2".parse().unwrap();
    assert_eq!(v.query_gid(1, 0).unwrap().gid, gid.octets());
}
