//! Smoke test of the data-path benchmark: `rdma_perf --quick` runs every
//! test at one small size, and the scaling mode with a few QPs, and exits
//! successfully. Timings are printed, never asserted.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma_perf"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rdma_perf {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn rdma_perf_quick_runs() {
    let stdout = run(&["all", "--quick", "--size", "4096", "--inline", "64"]);
    for section in [
        "polled SPSC ring",
        "one-core memcpy",
        "RDMA_Write Latency Test",
        "RDMA_Read Latency Test",
        "Send Latency Test",
        "RDMA_Write BW Test",
        "Send BW Test",
        "t_typical[usec]",
        "BW average[MB/sec]",
        "rnic-engine",
        "summary (key value)",
        "write_bw.4096.bw_avg_mbps",
    ] {
        assert!(
            stdout.contains(section),
            "missing {section:?} in:\n{stdout}"
        );
    }
    // A size small enough to go inline.
    let stdout = run(&["write_lat", "--quick", "--size", "2", "--inline", "64"]);
    assert!(stdout.contains("write_lat.2.t_typical_us"), "{stdout}");
}

#[test]
fn rdma_perf_scaling_quick_runs() {
    let stdout = run(&[
        "--qps",
        "16",
        "--vms",
        "4",
        "--ref-qps",
        "4",
        "--quick",
        "--no-baselines",
    ]);
    assert!(stdout.contains("scale.vms4.qps16.loss_pct"), "{stdout}");
}
