//! Smoke test of the control-command fairness benchmark: `ctrl_fairness
//! --quick` runs every scenario in a tiny version, exits successfully and
//! prints its command line, every scenario and the ratios. Timings are
//! printed, never asserted.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn ctrl_fairness_quick_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_ctrl_fairness"))
        .arg("--quick")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ctrl_fairness --quick failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for section in [
        "ctrl_fairness: ",
        "alone ",
        "A floods ",
        "A limited ",
        "ratios: PD p50",
        "stream x",
        "daemon counters: A ctrl_cmds",
    ] {
        assert!(
            stdout.contains(section),
            "missing {section:?} in:\n{stdout}"
        );
    }
}
