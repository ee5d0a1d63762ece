#![allow(clippy::unwrap_used)]
//! A daemon started from a configuration file gives each VM its own limits
//! and GID, seen through the real vhost-user socket.

use serde_json::Value;
use vhost_user_rdma::config::LimitOverrides;
use vhost_user_rdma::{config_file, mgmt, Limits};
use vhost_user_rdma_tests::dp::Vm;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{QpInit, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
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
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
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

/// Spec chapter 5 and appendix A: the MAC address of the guest interface a
/// VM's port is paired with comes from its `[[vm]] mac` and reaches the
/// guest in the configuration space at offset 88; a VM without one reads
/// zeros there. The reference driver and the management API show it too.
#[test]
fn paired_mac_from_the_file_reaches_the_configuration_space() {
    let d = TestDaemon::from_config(|dir| {
        let text = format!(
            r#"
[[tenant]]
name = "blue"

[[vm]]
name = "paired"
socket = "{0}/paired.sock"
tenant = "blue"
mac = "52:54:00:AB:cd:01"

[[vm]]
name = "unpaired"
socket = "{0}/unpaired.sock"
tenant = "blue"
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
    let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0x01];

    let mut vm = d.connect(0).unwrap();
    assert_eq!(vm.config().unwrap().mac, mac);
    // Byte by byte at the offsets of the spec, the reserved bytes zero.
    assert_eq!(
        vm.config_bytes(88, 8).unwrap(),
        [0x52, 0x54, 0x00, 0xab, 0xcd, 0x01, 0, 0]
    );
    // The limits before it are where they were.
    assert_eq!(
        vm.config().unwrap().page_size_cap,
        Limits::default().page_size_cap
    );
    drop(vm);

    let mut vm = d.connect(1).unwrap();
    assert_eq!(vm.config().unwrap().mac, [0; 6]);
    assert_eq!(vm.config_bytes(88, 8).unwrap(), [0; 8]);
    drop(vm);

    // The reference driver exposes it.
    let a = Vm::open(&d, 0, VmmOptions::default());
    assert_eq!(a.dev.paired_mac(), Some(mac));
    let b = Vm::open(&d, 1, VmmOptions::default());
    assert_eq!(b.dev.paired_mac(), None);

    // `ctl vms` (the management API's list_vms) shows it.
    let answer: Value = serde_json::from_str(&mgmt::api::handle_line(
        &d.daemon().view(),
        br#"{"cmd":"list_vms"}"#,
    ))
    .unwrap();
    assert_eq!(answer["vms"][0]["mac"], "52:54:00:ab:cd:01");
    assert_eq!(answer["vms"][1]["mac"], Value::Null);
}
