#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! QoS in the data path, end to end through the real daemon and the
//! reference driver: rate limits pace a VM's and a tenant's send work,
//! a run-time change through the live QoS table applies, and the per-VM
//! traffic counters match what was sent.
//!
//! The timing assertions are one-sided and loose (a lower bound on how
//! long a limited transfer takes, with 20 % slack; an upper bound only
//! where the unlimited alternative would take minutes), so a loaded
//! machine cannot make them fail. Rates are measured by `qos_bench`.

use std::time::{Duration, Instant};

use vhost_user_rdma::qos::{QosClass, QosSpec};
use vhost_user_rdma::stats::TrafficStats;
use vhost_user_rdma_tests::dp::{ok, open, poll_n, post_writes, rc_pair, wr, Buf, Vm};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_driver::{SendOp, SendWr};

fn traffic(d: &TestDaemon, vm: usize) -> TrafficStats {
    d.daemon().tenancy().traffic(vm).unwrap().snapshot()
}

fn check_writes(wcs: &[virtio_rdma_driver::WorkCompletion], first: u64) {
    for (i, wc) in wcs.iter().enumerate() {
        ok(wc, first + i as u64, WcOpcode::RDMA_WRITE);
    }
}

/// An ops limit of N/s paces K work requests: they take at least
/// (K − burst) / N (less 20 %). A run-time change through the QoS table
/// releases a VM held at 1 op/s at once, and the counters match.
#[test]
fn ops_limit_paces_sends_and_a_raise_unblocks() {
    let d = TestDaemon::start(2).unwrap();
    let a = open(&d, 0);
    let b = open(&d, 1);
    let p = rc_pair(&a, &b);
    let src = Buf::new(&a, 4096);
    let dst = Buf::new(&b, 4096);
    let limited = |ops_per_sec| QosSpec {
        ops_per_sec,
        ..QosSpec::default()
    };
    d.set_vm_qos(0, limited(200)).unwrap();

    // 60 WRITEs at 200/s: the bucket holds one token (5 ms of the rate),
    // and one more may start while it is not empty: a burst of 2.
    const K: usize = 60;
    let t0 = Instant::now();
    post_writes(&p, &src, &dst, 64, 0, K);
    let wcs = poll_n(&p.cqa, K);
    let took = t0.elapsed();
    check_writes(&wcs, 0);
    let floor = (K - 2) as f64 / 200.0 * 0.8;
    assert!(
        took.as_secs_f64() >= floor,
        "{K} WRITEs at 200/s took {took:?} (at least {floor} s)"
    );
    let s = traffic(&d, 0);
    assert_eq!(s.send_ops, K as u64);
    assert_eq!(s.send_bytes, K as u64 * 64);
    assert!(
        s.throttled >= 1 && s.throttled <= K as u64,
        "throttled {}",
        s.throttled
    );
    let r = traffic(&d, 1);
    assert_eq!((r.recv_ops, r.recv_bytes), (K as u64, K as u64 * 64));
    assert_eq!((r.send_ops, r.throttled), (0, 0));

    // Held at 1 op/s, 60 more would take a minute.
    d.set_vm_qos(0, limited(1)).unwrap();
    post_writes(&p, &src, &dst, 64, 1000, K);
    std::thread::sleep(Duration::from_millis(100));
    let mut early = [virtio_rdma_driver::WorkCompletion::default(); K];
    let n = p.cqa.poll(&mut early);
    assert!(n <= 3, "{n} WRITEs completed within 100 ms at 1/s");
    // Raised at run time: the rest completes within poll_n's 10 s.
    d.set_vm_qos(0, QosSpec::default()).unwrap();
    let rest = poll_n(&p.cqa, K - n);
    let mut all = early[..n].to_vec();
    all.extend(rest);
    check_writes(&all, 1000);
    let s = traffic(&d, 0);
    assert_eq!(s.send_ops, 2 * K as u64);
    assert_eq!(s.send_bytes, 2 * K as u64 * 64);
    assert!(s.throttled <= 2 * K as u64);
    assert_eq!(s.error_cqes + s.flushed + s.drops, 0);
}

/// A tenant's bytes limit applies to the sum of its two VMs (set in the
/// configuration through a QoS class); each VM's counters hold its own
/// share, and the responder VM (same tenant, sending nothing) is never
/// held back.
#[test]
fn tenant_bytes_limit_applies_to_the_sum_of_its_vms() {
    const MIB: u64 = 1 << 20;
    let d = TestDaemon::with_config(3, |c| {
        c.qos_classes.push(QosClass {
            name: "slow".into(),
            spec: QosSpec {
                bytes_per_sec: MIB,
                ..QosSpec::default()
            },
        });
        add_tenant(c, "red", &[0, 1, 2]).qos_class = Some("slow".into());
    })
    .unwrap();
    let vms: Vec<Vm> = (0..3).map(|i| open(&d, i)).collect();
    // VM 0 and VM 1 both write into VM 2.
    let p0 = rc_pair(&vms[0], &vms[2]);
    let p1 = rc_pair(&vms[1], &vms[2]);
    const LEN: usize = 64 << 10;
    const N: usize = 8;
    let s0 = Buf::new(&vms[0], LEN);
    let s1 = Buf::new(&vms[1], LEN);
    let dst = Buf::new(&vms[2], LEN);
    let t0 = Instant::now();
    post_writes(&p0, &s0, &dst, LEN, 0, N);
    post_writes(&p1, &s1, &dst, LEN, 0, N);
    check_writes(&poll_n(&p0.cqa, N), 0);
    check_writes(&poll_n(&p1.cqa, N), 0);
    let took = t0.elapsed().as_secs_f64();
    // 1 MiB in all at 1 MiB/s; the first message may start on the burst
    // and the last one ends in debt.
    let total = (2 * N * LEN) as f64;
    let floor = (total - LEN as f64) / MIB as f64 * 0.8;
    assert!(took >= floor, "1 MiB at 1 MiB/s took {took} s");
    for vm in 0..2 {
        let s = traffic(&d, vm);
        assert_eq!(s.send_ops, N as u64, "VM {vm}");
        assert_eq!(s.send_bytes, (N * LEN) as u64, "VM {vm}");
    }
    assert!(traffic(&d, 0).throttled + traffic(&d, 1).throttled >= 1);
    let r = traffic(&d, 2);
    assert_eq!(r.recv_ops, 2 * N as u64);
    assert_eq!(r.recv_bytes, (2 * N * LEN) as u64);
    assert_eq!(r.throttled, 0);
}

/// Error completions and flushes are counted for the VM they belong to.
#[test]
fn error_and_flush_completions_are_counted() {
    let d = TestDaemon::start(2).unwrap();
    let a = open(&d, 0);
    let b = open(&d, 1);
    let p = rc_pair(&a, &b);
    let src = Buf::new(&a, 4096);
    let sg = [src.sge(0, 64)];
    let bad = SendOp::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 0xdead_beef,
    };
    p.qa.post_send(&[wr(1, bad, &sg)]).unwrap();
    let wc = poll_n(&p.cqa, 1);
    assert_eq!(wc[0].status(), Some(WcStatus::REM_ACCESS_ERR), "{wc:?}");
    // The QP is in ERR now: whatever is posted is flushed.
    let wrs: Vec<SendWr<'_>> = (2..5).map(|i| wr(i, bad, &sg)).collect();
    p.qa.post_send(&wrs).unwrap();
    let wcs = poll_n(&p.cqa, 3);
    assert!(wcs
        .iter()
        .all(|w| w.status() == Some(WcStatus::WR_FLUSH_ERR)));
    let s = traffic(&d, 0);
    assert_eq!((s.send_ops, s.send_bytes), (1, 0));
    assert_eq!((s.error_cqes, s.flushed), (1, 3));
    assert_eq!(traffic(&d, 1).recv_ops, 0);
}

/// Smoke test of the QoS benchmark: `qos_bench --quick` runs every
/// benchmark briefly and prints every section and verdict line. Its
/// numbers are printed, never asserted.
#[test]
fn qos_bench_quick_runs() {
    vhost_user_rdma_tests::bench::smoke_run(
        env!("CARGO_BIN_EXE_qos_bench"),
        &["--quick", "--hog-sizes", "65536"],
        &[
            "== 1. latency-sensitive tenant",
            "== 2. configured rate limits",
            "== 3. weighted shares",
            "== 4. a limit changed mid-run",
            "lat.hog65536.weights",
            "limits.tenant bytes 300 MiB/s, 2 VMs",
            "shares 1:2:4",
            "change 100->300 MiB/s",
            "load average at end",
        ],
    );
}
