//! The guest programs of `virtio-rdma-apps` (the same code `rdma-guest` runs
//! inside QEMU guests over virtio-pci) run here over the test VMM: two VMs
//! do the whole checked exchange through the real daemon, while a third VM
//! misbehaves and streams WRITEs meanwhile.

use std::time::Duration;

use vhost_user_rdma::config::default_gid;
use vhost_user_rdma_tests::dp::Vm;
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_apps::exchange::{self, Options, Role};
use virtio_rdma_apps::hostile;
use virtio_rdma_apps::oob::ChannelOob;

fn opts() -> Options {
    Options {
        buf_len: 2 << 20,
        pingpongs: 50,
        stream_writes: 8,
        rounds: 2,
        timeout: Duration::from_secs(60),
        ..Options::default()
    }
}

#[test]
fn exchange_between_two_vms_checks_every_transfer() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let (mut oa, mut ob) = ChannelOob::pair();
    let server = std::thread::spawn(move || {
        let mut out = Vec::new();
        let r = exchange::run(&a.dev, Role::Server, &mut oa, &opts(), &mut out);
        (
            r.map_err(|e| e.to_string()),
            String::from_utf8_lossy(&out).into_owned(),
        )
    });
    let mut out = Vec::new();
    let s = exchange::run(&b.dev, Role::Client, &mut ob, &opts(), &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (sr, stext) = server.join().unwrap();
    let s = s.unwrap_or_else(|e| panic!("client: {e}\n{text}\nserver:\n{stext}"));
    sr.unwrap_or_else(|e| panic!("server: {e}\n{stext}\nclient:\n{text}"));
    // 50 ping-pongs, then per round: 11 SENDs, 11 WRITEs, 1 WRITE_WITH_IMM,
    // 11 READs, 51 atomics (sizes(2 MiB) has 11 entries).
    assert_eq!(s.checks, 50 + 2 * (11 + 11 + 1 + 11 + 51), "{text}");
    assert!(s.bytes > 2 * 3 * (2 << 20), "{text}");
    assert!(s.write_mbps > 0.0 && s.rtt_p50_us > 0.0, "{text}");
    assert!(text.contains("all received intact") && stext.contains("server: done"));
}

#[test]
fn hostile_vm_is_refused_while_the_others_exchange() {
    // The hostile VM is alone in its tenant and also tries to reach the
    // other two.
    let d = TestDaemon::with_config(3, |c| {
        add_tenant(c, "red", &[2]);
    })
    .unwrap();
    let foreign = [default_gid(0), default_gid(1)];
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let h = Vm::open(&d, 2, VmmOptions::default());

    // The hostile VM runs its checks, then streams WRITEs for a while, all
    // during the exchange of the other two.
    let hostile = std::thread::spawn(move || {
        let mut out = Vec::new();
        let r = hostile::run(&h.dev, Some(Duration::from_secs(3)), &foreign, &mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        (r.map_err(|e| e.to_string()), text, h)
    });
    let (mut oa, mut ob) = ChannelOob::pair();
    let server = std::thread::spawn(move || {
        let r = exchange::run(&a.dev, Role::Server, &mut oa, &opts(), &mut Vec::new());
        r.map_err(|e| e.to_string())
    });
    let mut out = Vec::new();
    let s = exchange::run(&b.dev, Role::Client, &mut ob, &opts(), &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    server.join().unwrap().unwrap();
    let s = s.unwrap_or_else(|e| panic!("client: {e}\n{text}"));
    assert_eq!(s.checks, 50 + 2 * (11 + 11 + 1 + 11 + 51), "{text}");

    let (r, htext, h) = hostile.join().unwrap();
    let checks = r.unwrap_or_else(|e| panic!("hostile: {e}\n{htext}"));
    // Two bad MRs, five bad WRITEs, per foreign VM a refused connect and
    // a refused AH, one good WRITE.
    assert_eq!(checks, 12, "{htext}");
    assert_eq!(htext.matches("refused with DENIED").count(), 4, "{htext}");
    assert_eq!(d.isolation(2).denied, 2 * 16 + 2, "{htext}");
    assert!(htext.contains(hostile::BUSY_MARKER), "{htext}");
    for line in ["refused with BAD_ADDRESS", "LOC_PROT_ERR", "REM_ACCESS_ERR"] {
        assert!(htext.contains(line), "{line}: {htext}");
    }
    drop(h);
}
