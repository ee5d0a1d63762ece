//! Smoke test of the control-command fairness benchmark: `ctrl_fairness
//! --quick` runs every scenario in a tiny version, exits successfully and
//! prints its command line, every scenario and the ratios. Timings are
//! printed, never asserted.

use vhost_user_rdma_tests::bench::smoke_run;

#[test]
fn ctrl_fairness_quick_runs() {
    smoke_run(
        env!("CARGO_BIN_EXE_ctrl_fairness"),
        &["--quick"],
        &[
            "ctrl_fairness: ",
            "alone ",
            "A floods ",
            "A limited ",
            "ratios: PD p50",
            "stream x",
            "daemon counters: A ctrl_cmds",
        ],
    );
}
