#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A VM that connects, works and disconnects 1,000 times (every other time
//! in the middle of a transfer) next to VMs that stay: the daemon releases
//! everything each time, the QPs connected to the departed VM fail with
//! flush completions, the bystanders keep working, and the process does
//! not grow — file descriptors, threads, mappings and resident memory are
//! the same after the last cycle as after the warm-up.
//!
//! This is the only test of its binary, so the process-wide counts see no
//! other test's activity. They cover the daemon and the test VMM alike
//! (both run in this process); a leak in either fails the test.

use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::{
    connect, ok, pattern, poll_one, rc_qp, wait_state, wr, write_op, Buf, Vm, WAIT,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, RecvWr, SendOp};

const CYCLES: usize = 1000;
/// Cycles before the baseline is taken (allocator pools, lazily created
/// state and thread stacks settle).
const WARMUP: usize = 100;
const MSG: usize = 64 * 1024;

/// What the process holds.
#[derive(Debug, Clone, Copy)]
struct Usage {
    fds: usize,
    threads: usize,
    maps: usize,
    rss_kib: u64,
}

fn usage() -> Usage {
    let count = |dir: &str| std::fs::read_dir(dir).unwrap().count();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    Usage {
        fds: count("/proc/self/fd"),
        threads: count("/proc/self/task"),
        maps: std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count(),
        rss_kib,
    }
}

/// What the open file descriptors are, for a failure message.
fn fd_kinds() -> String {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let target = std::fs::read_link(e.path())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        // "anon_inode:[eventfd]", "/memfd:name (deleted)", "socket:[123]".
        let kind = match target.split_once(':') {
            Some((a, b)) if a == "anon_inode" => format!("{a}:{b}"),
            Some((a, _)) => a.to_string(),
            None => target,
        };
        *kinds.entry(kind).or_default() += 1;
    }
    format!("{kinds:?}")
}

/// Usage once the daemon's connection threads have wound down.
fn settled() -> Usage {
    std::thread::sleep(Duration::from_millis(100));
    usage()
}

#[test]
fn thousand_connect_work_disconnect_cycles_do_not_grow() {
    let d = TestDaemon::start(3).unwrap();
    // VM 0 stays and is the peer of the cycling VM 1; VM 2 stays and
    // keeps a connection to VM 0 that must never notice anything.
    let vm0 = Vm::open(&d, 0, VmmOptions::default());
    let vm2 = Vm::open(&d, 2, VmmOptions::default());
    let cq0 = Cq::create(&vm0.dev, 256).unwrap();
    let sink = Buf::new(&vm0, 16 * MSG);
    let rbuf = Buf::new(&vm0, 4096);
    let cq2 = Cq::create(&vm2.dev, 64).unwrap();
    let cq02 = Cq::create(&vm0.dev, 64).unwrap();
    let (q2, q02) = (rc_qp(&vm2, &cq2), rc_qp(&vm0, &cq02));
    connect(&vm2, &q2, &vm0, &q02);
    let src2 = Buf::new(&vm2, 4096);
    let dst2 = Buf::new(&vm0, 4096);

    let mut base = None;
    let start = Instant::now();
    for cycle in 0..CYCLES {
        if cycle == WARMUP {
            base = Some(settled());
        }
        let vm1 = Vm::open(&d, 1, VmmOptions::default());
        let cq1 = Cq::create(&vm1.dev, 64).unwrap();
        let q1 = rc_qp(&vm1, &cq1);
        let q0 = rc_qp(&vm0, &cq0);
        connect(&vm1, &q1, &vm0, &q0);
        q0.post_recv(&[RecvWr {
            wr_id: cycle as u64,
            sg_list: &[rbuf.sge(0, 4096)],
        }])
        .unwrap();
        let src = Buf::new(&vm1, MSG);

        // Work: a checked RDMA WRITE into VM 0.
        let len = 1 + (cycle * 7919) % MSG;
        let data = pattern(len, cycle as u64);
        src.write(0, &data);
        let op = write_op(&sink, 0);
        let sg = [src.sge(0, len)];
        q1.post_send(&[wr(1, op, &sg)]).unwrap();
        ok(&poll_one(&cq1), 1, WcOpcode::RDMA_WRITE);
        assert_eq!(sink.read(0, len), data, "cycle {cycle}: WRITE data");

        if cycle % 2 == 0 {
            // A clean goodbye: a SEND that VM 0 receives, then everything
            // is destroyed before the VMM disconnects.
            let sg = [src.sge(0, 64)];
            q1.post_send(&[wr(2, SendOp::Send, &sg)]).unwrap();
            ok(&poll_one(&cq1), 2, WcOpcode::SEND);
            let wc = poll_one(&cq0);
            ok(&wc, cycle as u64, WcOpcode::RECV);
            drop((q1, src, cq1));
            drop(vm1);
        } else {
            // Mid-transfer: a burst of WRITEs, then the VMM goes away
            // before the engine is done with them.
            let sg = [src.sge(0, MSG)];
            let burst: Vec<_> = (0..16u64)
                .map(|k| {
                    let op = write_op(&sink, k as usize * MSG);
                    wr(10 + k, op, &sg)
                })
                .collect();
            q1.post_send(&burst).unwrap();
            vm1.t.vmm().disconnect();
            // The device is gone: these destroys fail at once and free
            // the guest-side memory.
            drop((q1, src, cq1));
            drop(vm1);
            // VM 0's QP connected to the departed VM fails; its posted
            // receive is flushed, and it gets QP_FATAL.
            wait_state(&q0, QpState::ERR);
            let wc = poll_one(&cq0);
            assert_eq!(wc.wr_id, cycle as u64, "{wc:?}");
            assert_eq!(wc.status(), Some(WcStatus::WR_FLUSH_ERR), "{wc:?}");
            let ev = loop {
                let ev = vm0
                    .dev
                    .next_async_event(Some(WAIT))
                    .unwrap()
                    .expect("QP_FATAL event");
                // The start-up PORT_ACTIVE of the first cycle.
                if EventKind::from_u32(ev.kind) != Some(EventKind::PORT_ACTIVE) {
                    break ev;
                }
            };
            assert_eq!(EventKind::from_u32(ev.kind), Some(EventKind::QP_FATAL));
            assert_eq!(ev.handle, q0.handle());
        }
        let s = d.wait_released(1);
        assert!(!s.connected, "cycle {cycle}: {s:?}");
        assert!(s.device.resources.is_empty(), "cycle {cycle}: {s:?}");
        drop(q0);

        // The bystander pair works on, undisturbed.
        let data = pattern(4096, 1_000_000 + cycle as u64);
        src2.write(0, &data);
        let op = write_op(&dst2, 0);
        q2.post_send(&[wr(cycle as u64, op, &[src2.sge(0, 4096)])])
            .unwrap();
        ok(&poll_one(&cq2), cycle as u64, WcOpcode::RDMA_WRITE);
        assert_eq!(dst2.read(0, 4096), data, "cycle {cycle}: bystander");
    }
    let elapsed = start.elapsed();
    let base = base.unwrap();
    let end = settled();
    eprintln!(
        "{CYCLES} cycles in {:.1} s; after warm-up {base:?}, at the end {end:?}",
        elapsed.as_secs_f64()
    );
    assert_eq!(d.stats(1).connections, CYCLES as u64);
    assert_eq!(q2.query().unwrap().attr.qp_state, u32::from(QpState::RTS));
    // A leak of one descriptor, thread or mapping per cycle would show as
    // 900; the slack covers a connection still winding down.
    assert!(
        end.fds <= base.fds + 2,
        "fds grew: {base:?} -> {end:?}; now {}",
        fd_kinds()
    );
    assert!(
        end.threads <= base.threads + 1,
        "threads grew: {base:?} -> {end:?}"
    );
    assert!(
        end.maps <= base.maps + 8,
        "mappings grew: {base:?} -> {end:?}"
    );
    // Each cycle maps a fresh 64 MiB guest; 4 KiB kept per cycle would be
    // 3.6 MiB.
    assert!(
        end.rss_kib <= base.rss_kib + 4096,
        "resident memory grew: {base:?} -> {end:?}"
    );
}
