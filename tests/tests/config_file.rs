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
gids = ["fd00::42:1", "10.1.2.3"]
mac = "52:54:00:12:34:56"
[vm.limits]
max_qp = 2

[[vm]]
name = "big"
socket = "{0}/big.sock"
tenant = "red"
abi = 2
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

    // VM 0: max_qp 2 from [vm.limits], the configured GIDs behind the
    // default GID of its MAC, the IPv4 one first.
    let mut vm = d.connect(0).unwrap();
    let cfg = vm.config().unwrap();
    assert_eq!((cfg.max_qp, cfg.abi_version), (2, 3));
    assert_eq!(cfg.max_cq, 64);
    let offered = vm.device_features();
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_device().unwrap().max_qp, 2);
    assert_eq!(v.query_port(1).unwrap().gid_tbl_len, 16);
    let gid = |text: &str| text.parse::<std::net::Ipv6Addr>().unwrap().octets();
    for (index, want) in [
        (0, gid("fe80::5054:ff:fe12:3456")),
        (1, gid("::ffff:10.1.2.3")),
        (2, gid("fd00::42:1")),
        (3, [0; 16]),
        (15, [0; 16]),
    ] {
        assert_eq!(v.query_gid(1, index).unwrap().gid, want, "index {index}");
    }
    assert_eq!(v.own_gid().unwrap(), (1, gid("::ffff:10.1.2.3")));
    assert_eq!(
        offered & virtio_rdma_abi::config::F_UD,
        virtio_rdma_abi::config::F_UD
    );
    // The limit is enforced: a third QP is refused.
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
    v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    assert!(v.create_qp(&QpInit::rc(pd, cq)).is_err());
    drop(vm);

    // VM 1: max_qp 256, ABI version 2 (`abi = 2`): the version-2 GID
    // table, the default GID of index 1 (::ffff:10.42.0.2) alone at index
    // 0, and no version-3 feature bit.
    let mut vm = d.connect(1).unwrap();
    let cfg = vm.config().unwrap();
    assert_eq!((cfg.max_qp, cfg.abi_version), (256, 2));
    assert_eq!(cfg.max_cq, 64);
    let offered = vm.device_features();
    assert_eq!(
        offered & !virtio_rdma_abi::config::V2_DEVICE_FEATURES & 0xff_ffff,
        0
    );
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_device().unwrap().max_qp, 256);
    assert_eq!(v.query_port(1).unwrap().gid_tbl_len, 1);
    let gid: std::net::Ipv6Addr = "::ffff:10.42.0.2".parse().unwrap();
    assert_eq!(v.query_gid(1, 0).unwrap().gid, gid.octets());
    assert!(v.query_gid(1, 1).is_err(), "one entry");
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
