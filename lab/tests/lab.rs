//! The lab binary end to end: a scenario run against the real daemon
//! through its vhost-user sockets and management socket, its verdicts, its
//! files, and its errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma-lab"))
        .args(args)
        .output()
        .expect("run vhost-user-rdma-lab")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lab-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Two tenants: "capped" limited to 64 MiB/s by its class, whose VM
/// streams 64 KiB WRITEs, and "probe" with a paced 64 B WRITE; at 1.5 s the
/// stream's VM is limited to 300 ops/s through the management socket.
const SCENARIO: &str = r#"
[lab]
duration_s = 3
sample_ms = 50

[[qos_class]]
name = "capped"
bytes_per_sec = 67108864

[[tenant]]
name = "capped"
qos_class = "capped"
[[tenant]]
name = "probe"

[[vm]]
name = "c0"
tenant = "capped"
[[vm]]
name = "c1"
tenant = "capped"
[[vm]]
name = "p0"
tenant = "probe"
[[vm]]
name = "p1"
tenant = "probe"

[[workload]]
name = "stream"
vm = "c0"
peer = "c1"
op = "write"
size = 65536
qps = 2
depth = 16

[[workload]]
name = "probe"
vm = "p0"
peer = "p1"
op = "send"
size = 64
rate = 200

[[change]]
at_s = 1.5
vm = "c0"
ops_per_sec = 300

[[phase]]
name = "tenant-cap"
from_s = 0.5
to_s = 1.5
[[phase]]
name = "vm-cap"
from_s = 2
to_s = 3

[[expect]]
metric = "mib_per_s"
tenant = "capped"
phase = "tenant-cap"
max = 70.4
[[expect]]
metric = "ops_per_s"
vm = "c0"
phase = "vm-cap"
max = 330
[[expect]]
metric = "p99_us"
workload = "probe"
phase = "vm-cap"
max = 10000000
"#;

#[test]
fn a_scenario_runs_against_the_daemon_and_reports() {
    let d = scratch("run");
    let s = write(&d, "caps.toml", SCENARIO);
    let out = d.join("out");
    let o = lab(&[s.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("caps.json")).unwrap()).unwrap();
    assert_eq!(j["passed"], true);
    let run = &j["runs"][0];
    // The limits held, and the traffic was real: the stream moved data in
    // both phases and the probe's SENDs completed at their pace.
    let phases = run["phases"].as_array().unwrap();
    let tenant = |p: &Value, n: &str| {
        p["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()
            .clone()
    };
    let capped = tenant(&phases[0], "capped");
    let mib = capped["mib_per_s"].as_f64().unwrap();
    assert!(mib > 1.0 && mib <= 70.4, "{capped}");
    let c0 = &phases[1]["vms"][0];
    let ops = c0["ops_per_s"].as_f64().unwrap();
    assert!(ops > 10.0 && ops <= 330.0, "{c0}");
    let probe = &phases[1]["workloads"][1];
    assert!(probe["ops_per_s"].as_f64().unwrap() > 20.0, "{probe}");
    assert!(probe["p99_us"].as_f64().unwrap() > 0.0, "{probe}");
    // The change went through the management socket and was in force.
    let ch = &run["changes"][0];
    assert_eq!(ch["what"], "VM c0: ops/s 300");
    assert!(ch["error"].is_null(), "{ch}");
    // The series cover the run; the files are there.
    assert_eq!(run["t_s"].as_array().unwrap().len(), 60);
    let svg = std::fs::read_to_string(out.join("caps.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("capped") && svg.contains("VM c0"));
    let md = std::fs::read_to_string(out.join("caps.md")).unwrap();
    assert!(
        md.contains("## Expectations") && md.contains("### Phase vm-cap"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missed_expectation_fails_the_run() {
    let d = scratch("miss");
    // The stream cannot stay under 1 MiB/s with its tenant capped at 64.
    let text = SCENARIO.replace("max = 70.4", "max = 1");
    let s = write(&d, "miss.toml", &text);
    let out = d.join("out");
    let o = lab(&[s.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("miss.json")).unwrap()).unwrap();
    assert_eq!(j["passed"], false);
    assert_eq!(j["expectations"][0]["pass"], false);
    assert_eq!(j["expectations"][1]["pass"], true);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_scenarios_are_refused_with_their_line() {
    let d = scratch("bad");
    let s = write(
        &d,
        "bad.toml",
        &SCENARIO.replace("peer = \"p1\"", "peer = \"c1\""),
    );
    let o = lab(&[s.to_str().unwrap(), "--check"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("bad.toml:") && e.contains("different tenants"),
        "{e}"
    );
    let s = write(&d, "ok.toml", SCENARIO);
    let o = lab(&[s.to_str().unwrap(), "--check"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("2 workloads, 4 VMs"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_shipped_scenarios_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let o = lab(&[p.to_str().unwrap(), "--check"]);
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 3, "{n} scenarios");
}
