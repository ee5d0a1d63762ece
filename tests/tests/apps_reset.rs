#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `exchange::stream_until_peer_reset`, the client's part of the QEMU
//! end-to-end test's reset scenario (`scripts/qemu-e2e.sh`), over the test
//! VMM: the server's device is reset (`RESET_DEVICE`, as QEMU sends on a
//! system reset) in the middle of the client's RDMA WRITE stream. Both
//! doorbell modes: the QEMU test can only use guest-RAM doorbells (QEMU
//! 10.2 has no VIRTIO shared memory), the test VMM offers both.

use std::io::Write;
use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use vhost_user_rdma_tests::dp::Vm;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_apps::exchange::{self, Options, Role};
use virtio_rdma_apps::oob::ChannelOob;

fn opts(timeout: Duration) -> Options {
    Options {
        buf_len: 1 << 20,
        pingpongs: 10,
        stream_writes: 2,
        rounds: 1,
        timeout,
        ..Options::default()
    }
}

/// Collects a program's output and reports once when a line starting with
/// `marker` has been written.
struct Watch {
    text: Vec<u8>,
    marker: &'static str,
    tx: Option<Sender<()>>,
}

impl Write for Watch {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        let seen = String::from_utf8_lossy(&self.text)
            .lines()
            .any(|l| l.starts_with(self.marker));
        if seen {
            if let Some(tx) = self.tx.take() {
                let _ = tx.send(());
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_client_sees_its_qps_fail_when_the_server_resets() {
    server_reset_mid_stream(false);
}

#[test]
fn the_client_sees_its_qps_fail_when_the_server_resets_shmem_doorbells() {
    server_reset_mid_stream(true);
}

fn server_reset_mid_stream(shmem: bool) {
    let d = TestDaemon::start(2).unwrap();
    let open = |i| {
        if shmem {
            Vm::open_shmem(&d, i)
        } else {
            Vm::open(&d, i, VmmOptions::default())
        }
    };
    let (a, b) = (open(0), open(1));
    for vm in [&a, &b] {
        assert_eq!(vm.dev.doorbell_page().is_some(), shmem, "doorbell mode");
    }
    let a_transport = a.t.clone();
    let (mut oa, mut ob) = ChannelOob::pair();
    // The server waits for a command that never comes; after the reset its
    // wait times out (its device instance is gone).
    let server = std::thread::spawn(move || {
        let r = exchange::run(
            &a.dev,
            Role::Server,
            &mut oa,
            &opts(Duration::from_secs(3)),
            &mut Vec::new(),
        );
        drop(a);
        r.is_ok()
    });
    let (tx, rx) = channel();
    let client = std::thread::spawn(move || {
        let mut out = Watch {
            text: Vec::new(),
            marker: "client: streaming",
            tx: Some(tx),
        };
        let r = exchange::stream_until_peer_reset(
            &b.dev,
            &mut ob,
            &opts(Duration::from_secs(60)),
            &mut out,
        );
        (
            r.map_err(|e| e.to_string()),
            String::from_utf8_lossy(&out.text).into_owned(),
        )
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the client never streamed");
    a_transport.vmm().reset().unwrap();
    let at_reset = d.traffic(0).recv_bytes;
    assert_eq!(d.stats(0).device.resources.qp, 0);
    assert_eq!(d.stats(0).device.resources.mr, 0);

    let (r, text) = client.join().unwrap();
    let r = r.unwrap_or_else(|e| panic!("client: {e}\n{text}"));
    assert!(r.writes_ok >= 16, "{r:?}\n{text}");
    assert_eq!(r.recvs_flushed, 16, "{r:?}\n{text}");
    assert!(
        r.statuses.keys().all(|s| *s == "WR_FLUSH_ERR"),
        "{r:?}\n{text}"
    );
    assert!(
        text.contains("client: peer reset: QP_FATAL on both QPs"),
        "{text}"
    );
    // Nothing reached the server after its reset.
    assert_eq!(d.traffic(0).recv_bytes, at_reset, "{text}");
    assert!(!server.join().unwrap(), "the server finished its exchange");
}
