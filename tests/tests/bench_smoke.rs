//! Smoke test of the control-path benchmark: `ctrl_bench --quick` runs every
//! benchmark in a tiny version and exits successfully. Timings are printed,
//! never asserted.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn ctrl_bench_quick_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_ctrl_bench"))
        .arg("--quick")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ctrl_bench --quick failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for section in [
        "== 1. control-verb round trip",
        "== 2. QP setup rate",
        "== 3. REG_MR round trip",
        "ALLOC_PD",
        "DEALLOC_PD",
        "QUERY_PORT",
        "daemon pipelined",
        "4 KiB shuffled, INDIRECT",
        "2 MiB shuffled, INLINE",
        "baseline: plain loop",
    ] {
        assert!(
            stdout.contains(section),
            "missing {section:?} in:\n{stdout}"
        );
    }
}

/// Smoke test of the attack catalogue: `attack_bench --quick` runs every
/// attack against the victim and prints a line for each (the attacks run
/// for real — a daemon that hung or refused one would fail it).
#[test]
fn attack_bench_quick_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_attack_bench"))
        .args(["--quick", "--secs", "0.2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "attack_bench --quick failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for attack in [
        "alone",
        "huge-send",
        "huge-read",
        "retry-nowhere",
        "flush-storm",
        "ctrl-heavy",
        "hog",
    ] {
        assert!(
            stdout.contains(&format!("run 1: {attack}")),
            "missing {attack:?} in:\n{stdout}"
        );
    }
}
