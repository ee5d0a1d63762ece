//! Smoke test of the control-path benchmark: `ctrl_bench --quick` runs every
//! benchmark in a tiny version and exits successfully. Timings are printed,
//! never asserted.

use vhost_user_rdma_tests::bench::smoke_run;

#[test]
fn ctrl_bench_quick_runs() {
    smoke_run(
        env!("CARGO_BIN_EXE_ctrl_bench"),
        &["--quick"],
        &[
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
        ],
    );
}

/// Smoke test of the attack catalogue: `attack_bench --quick` runs every
/// attack against the victims (closed loop and paced) and prints a line
/// for each (the attacks run for real — a daemon that hung or refused one
/// would fail it).
#[test]
fn attack_bench_quick_runs() {
    let lines: Vec<String> = std::iter::once("alone")
        .chain(vhost_user_rdma_tests::attack::ATTACKS)
        .map(|a| format!("run 1: {a}"))
        .collect();
    let expected: Vec<&str> = lines.iter().map(String::as_str).collect();
    smoke_run(
        env!("CARGO_BIN_EXE_attack_bench"),
        &["--quick", "--secs", "0.2"],
        &expected,
    );
}
