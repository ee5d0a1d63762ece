//! `vhost-user-rdma ctl`: the command-line client of the management socket.
//!
//! Tables for people by default, the daemon's JSON answer with `--json`.
//! Exit codes: [`EXIT_OK`], [`EXIT_DAEMON_ERROR`] (the daemon answered
//! with an error), [`EXIT_USAGE`] (bad usage or no connection).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use serde_json::{json, Map, Value};

use super::client::Client;
use crate::device::QueueDepths;
use crate::resources::ResourceCounts;
use crate::stats::TrafficStats;
use crate::tenancy::IsolationStats;
use crate::vm::CtrlStats;

/// Default path of the management socket (the systemd unit's).
pub const DEFAULT_SOCKET: &str = "/run/vhost-user-rdma/mgmt.sock";
/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the daemon answered with an error.
pub const EXIT_DAEMON_ERROR: u8 = 1;
/// Exit code: usage or connection error.
pub const EXIT_USAGE: u8 = 2;

/// Arguments of `vhost-user-rdma ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Management socket of the daemon.
    #[arg(long, short = 's', value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the daemon's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for the daemon's answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub timeout: u64,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// Commands of `vhost-user-rdma ctl`.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List the VMs: tenant, GID, connection, live objects, QoS.
    Vms,
    /// List the tenants: VMs, summed objects and traffic, QoS.
    Tenants,
    /// List the engine threads: CPU, VMs, work done.
    Engines,
    /// Show one VM's counters: objects, control path, traffic, isolation,
    /// control latency.
    Stats {
        /// VM name (or index).
        vm: String,
    },
    /// Show or change QoS settings of a VM or tenant.
    #[command(subcommand)]
    Qos(QosCommand),
    /// Show how a VM's QPs are known on the wire now (libibverbs): the
    /// GID and each QP's device and host number, what its peers' daemons
    /// hold before it moves (`peer-hold`).
    WireQps {
        /// VM name (or index).
        vm: String,
    },
    /// Print the move record of a VM that came from another host (spec
    /// 20.8): one JSON line, for `peer-moved` on its peers' daemons.
    MoveRecord {
        /// VM name (or index).
        vm: String,
    },
    /// Hold this daemon's connections to QPs of a VM about to move to
    /// another host: no new request goes to them until `peer-moved` or
    /// the time is up.
    PeerHold {
        /// The GID the moving VM's QPs send from now.
        #[arg(long)]
        gid: String,
        /// Their host QP numbers (decimal or 0x-hex, comma-separated).
        #[arg(long, value_delimiter = ',', value_parser = number, required = true)]
        qpns: Vec<u32>,
        /// Longest hold in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        ms: u64,
    },
    /// Point this daemon's connections to a VM that moved at its new
    /// host, from the record its new daemon gave (`move-record`).
    PeerMoved {
        /// The record's file (`-`: standard input).
        record: PathBuf,
    },
    /// Send one raw JSON request and print the answer.
    Raw {
        /// The request, e.g. '{"cmd":"list_vms"}'.
        request: String,
    },
    /// Check that the daemon answers.
    Ping,
    /// Show the daemon's version.
    Version,
}

/// Whose QoS settings.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("who").required(true).args(["vm", "tenant"])))]
pub struct QosWho {
    /// VM name (or index).
    pub vm: Option<String>,
    /// Tenant name (or index) instead of a VM.
    #[arg(long)]
    pub tenant: Option<String>,
}

/// `ctl qos` commands.
#[derive(Debug, Subcommand)]
pub enum QosCommand {
    /// Show the settings.
    Get {
        /// Whose.
        #[command(flatten)]
        who: QosWho,
    },
    /// Change some settings (the others stay); takes effect at once.
    #[command(group(ArgGroup::new("settings").required(true).multiple(true)
        .args(["weight", "bytes_per_sec", "ops_per_sec", "ctrl_per_sec"])))]
    Set {
        /// Whose.
        #[command(flatten)]
        who: QosWho,
        /// Weight among active VMs (1..=1000).
        #[arg(long)]
        weight: Option<u32>,
        /// Payload bytes per second (0: unlimited).
        #[arg(long)]
        bytes_per_sec: Option<u64>,
        /// Send work requests per second (0: unlimited).
        #[arg(long)]
        ops_per_sec: Option<u64>,
        /// Control commands per second (0: unlimited).
        #[arg(long)]
        ctrl_per_sec: Option<u64>,
    },
}

/// A number in decimal or `0x` hex.
fn number(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|e| format!("{text:?}: {e}"))
}

/// The move record in `path` (`-`: standard input), as the daemon's
/// `move_record` printed it: the object or the whole answer.
fn read_record(path: &std::path::Path) -> Result<Value, String> {
    let text = if path.as_os_str() == "-" {
        let mut t = String::new();
        std::io::stdin()
            .take(1 << 20)
            .read_to_string(&mut t)
            .map_err(|e| format!("standard input: {e}"))?;
        t
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let v: Value =
        serde_json::from_str(text.trim()).map_err(|e| format!("the record is not JSON: {e}"))?;
    Ok(match v.get("record") {
        Some(r) => r.clone(),
        None => v,
    })
}

fn who_json(who: &QosWho, m: &mut Map<String, Value>) {
    if let Some(t) = &who.tenant {
        m.insert("tenant".into(), Value::from(t.as_str()));
    } else if let Some(v) = &who.vm {
        m.insert("vm".into(), Value::from(v.as_str()));
    }
}

/// The request of a command; `Err` is a usage error.
fn request_of(cmd: &CtlCommand) -> Result<String, String> {
    let v = match cmd {
        CtlCommand::Vms => json!({"cmd": "list_vms"}),
        CtlCommand::Tenants => json!({"cmd": "list_tenants"}),
        CtlCommand::Engines => json!({"cmd": "list_engines"}),
        CtlCommand::Stats { vm } => json!({"cmd": "vm_stats", "vm": vm}),
        CtlCommand::Ping => json!({"cmd": "ping"}),
        CtlCommand::WireQps { vm } => json!({"cmd": "wire_qps", "vm": vm}),
        CtlCommand::MoveRecord { vm } => json!({"cmd": "move_record", "vm": vm}),
        CtlCommand::PeerHold { gid, qpns, ms } => {
            json!({"cmd": "peer_hold", "gid": gid, "qpns": qpns, "ms": ms})
        }
        CtlCommand::PeerMoved { record } => {
            json!({"cmd": "peer_moved", "record": read_record(record)?})
        }
        CtlCommand::Version => json!({"cmd": "version"}),
        CtlCommand::Raw { request } => {
            if request.contains('\n') {
                return Err("the raw request must be one line".into());
            }
            return Ok(request.clone());
        }
        CtlCommand::Qos(QosCommand::Get { who }) => {
            let mut m = Map::new();
            m.insert("cmd".into(), Value::from("get_qos"));
            who_json(who, &mut m);
            Value::Object(m)
        }
        CtlCommand::Qos(QosCommand::Set {
            who,
            weight,
            bytes_per_sec,
            ops_per_sec,
            ctrl_per_sec,
        }) => {
            let mut m = Map::new();
            m.insert("cmd".into(), Value::from("set_qos"));
            who_json(who, &mut m);
            for (k, v) in [
                ("weight", weight.map(u64::from)),
                ("bytes_per_sec", *bytes_per_sec),
                ("ops_per_sec", *ops_per_sec),
                ("ctrl_per_sec", *ctrl_per_sec),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), Value::from(v));
                }
            }
            Value::Object(m)
        }
    };
    Ok(v.to_string())
}

/// Runs `args`, printing to `out` (results) and `err` (errors); returns the
/// exit code.
pub fn run(args: &CtlArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let request = match request_of(&args.command) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_USAGE;
        }
    };
    let timeout = Duration::from_secs(args.timeout.max(1));
    let answer = Client::connect(&args.socket, timeout).and_then(|mut c| c.request_line(&request));
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_USAGE;
        }
    };
    if answer.get("ok") != Some(&Value::Bool(true)) {
        let msg = answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the daemon refused the request");
        if args.json || matches!(args.command, CtlCommand::Raw { .. }) {
            let _ = writeln!(out, "{answer}");
        }
        let _ = writeln!(err, "error: {msg}");
        return EXIT_DAEMON_ERROR;
    }
    let text = if args.json || matches!(args.command, CtlCommand::Raw { .. }) {
        format!("{answer}\n")
    } else {
        human(&args.command, &answer)
    };
    if out.write_all(text.as_bytes()).is_err() {
        return EXIT_USAGE;
    }
    EXIT_OK
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64().unwrap_or(0)
}

fn s(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn rate(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        n.to_string()
    }
}

/// QoS settings in one line.
fn qos_line(q: &Value) -> String {
    format!(
        "weight {}, bytes/s {}, ops/s {}, ctrl/s {}",
        u(q, &["weight"]),
        rate(u(q, &["bytes_per_sec"])),
        rate(u(q, &["ops_per_sec"])),
        rate(u(q, &["ctrl_per_sec"]))
    )
}

/// Limits as a short cell: `-` when nothing is limited.
fn limits_cell(q: &Value) -> String {
    let parts: Vec<String> = [
        ("bytes/s", "bytes_per_sec"),
        ("ops/s", "ops_per_sec"),
        ("ctrl/s", "ctrl_per_sec"),
    ]
    .iter()
    .filter_map(|(label, k)| {
        let n = u(q, &[k]);
        (n != 0).then(|| format!("{label}={n}"))
    })
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// A left-aligned text table.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            l.push_str(&format!("{c:<w$}  "));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

fn human(cmd: &CtlCommand, a: &Value) -> String {
    match cmd {
        CtlCommand::MoveRecord { .. } => format!("{}\n", a["record"]),
        CtlCommand::WireQps { .. } => {
            let rows: Vec<Vec<String>> = a["qps"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or(&[])
                .iter()
                .map(|q| {
                    let n = |i: usize| q[i].as_u64().unwrap_or(0);
                    vec![format!("{:#x}", n(0)), format!("{:#x}", n(1))]
                })
                .collect();
            format!(
                "GID {}\n{}",
                s(a, "gid"),
                table(&["QPN", "HOST_QPN"], &rows)
            )
        }
        CtlCommand::PeerHold { .. } => format!("{} connections held\n", u(a, &["held"])),
        CtlCommand::PeerMoved { .. } => {
            format!("{} connections to point anew\n", u(a, &["repointed"]))
        }
        CtlCommand::Vms => {
            let rows: Vec<Vec<String>> = a["vms"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or(&[])
                .iter()
                .map(|vm| {
                    vec![
                        s(vm, "name"),
                        s(vm, "tenant"),
                        s(vm, "gid"),
                        s(vm, "mac"),
                        u(vm, &["engine"]).to_string(),
                        if vm["connected"] == Value::Bool(true) {
                            "yes"
                        } else {
                            "no"
                        }
                        .into(),
                        u(vm, &["connections"]).to_string(),
                        u(vm, &["resources", "qp"]).to_string(),
                        u(vm, &["resources", "cq"]).to_string(),
                        u(vm, &["resources", "mr"]).to_string(),
                        u(vm, &["resources", "pd"]).to_string(),
                        u(vm, &["resources", "registered_bytes"]).to_string(),
                        u(vm, &["qos", "weight"]).to_string(),
                        limits_cell(&vm["qos"]),
                    ]
                })
                .collect();
            table(
                &[
                    "NAME",
                    "TENANT",
                    "GID",
                    "MAC",
                    "ENGINE",
                    "CONNECTED",
                    "CONNS",
                    "QP",
                    "CQ",
                    "MR",
                    "PD",
                    "REG_BYTES",
                    "WEIGHT",
                    "LIMITS",
                ],
                &rows,
            )
        }
        CtlCommand::Engines => {
            let rows: Vec<Vec<String>> = a["engines"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or(&[])
                .iter()
                .map(|e| {
                    vec![
                        u(e, &["index"]).to_string(),
                        e["cpu"].as_u64().map_or("-".into(), |c| c.to_string()),
                        u(e, &["vms"]).to_string(),
                        u(e, &["wqes"]).to_string(),
                        u(e, &["bytes"]).to_string(),
                        u(e, &["parks"]).to_string(),
                        u(e, &["peeked"]).to_string(),
                        u(e, &["late_kicks"]).to_string(),
                        u(e, &["poll_window_us"]).to_string(),
                    ]
                })
                .collect();
            table(
                &[
                    "ENGINE",
                    "CPU",
                    "VMS",
                    "WQES",
                    "BYTES",
                    "PARKS",
                    "PEEKED",
                    "LATE_KICKS",
                    "POLL_US",
                ],
                &rows,
            )
        }
        CtlCommand::Tenants => {
            let rows: Vec<Vec<String>> = a["tenants"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or(&[])
                .iter()
                .map(|t| {
                    let vms: Vec<&str> = t["vms"]
                        .as_array()
                        .map(|v| v.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    vec![
                        s(t, "name"),
                        if vms.is_empty() {
                            "-".into()
                        } else {
                            vms.join(",")
                        },
                        u(t, &["connected_vms"]).to_string(),
                        u(t, &["resources", "qp"]).to_string(),
                        u(t, &["traffic", "send_ops"]).to_string(),
                        u(t, &["traffic", "send_bytes"]).to_string(),
                        u(t, &["traffic", "recv_ops"]).to_string(),
                        u(t, &["traffic", "recv_bytes"]).to_string(),
                        limits_cell(&t["qos"]),
                    ]
                })
                .collect();
            table(
                &[
                    "NAME",
                    "VMS",
                    "CONNECTED",
                    "QP",
                    "SEND_OPS",
                    "SEND_BYTES",
                    "RECV_OPS",
                    "RECV_BYTES",
                    "LIMITS",
                ],
                &rows,
            )
        }
        CtlCommand::Stats { .. } => stats_text(a),
        CtlCommand::Qos(_) => {
            let who = match a["vm"].as_str() {
                Some(vm) => format!("VM {vm} (tenant {})", s(a, "tenant")),
                None => format!("tenant {}", s(a, "tenant")),
            };
            let mut t = format!("{who}: {}\n", qos_line(&a["qos"]));
            if a.get("previous").is_some() {
                t.push_str(&format!("previously: {}\n", qos_line(&a["previous"])));
            }
            if a.get("applied") == Some(&Value::Bool(false)) {
                t.push_str("not yet in force: the engine did not pick it up within 1 s\n");
            }
            t
        }
        CtlCommand::Ping => "pong\n".into(),
        CtlCommand::Version => format!(
            "{} {} (ABI version {})\n",
            s(a, "name"),
            s(a, "version"),
            s(a, "abi_version")
        ),
        CtlCommand::Raw { .. } => format!("{a}\n"),
    }
}

fn section(out: &mut String, title: &str, v: &Value, keys: &[&str]) {
    out.push_str(title);
    out.push_str(":\n");
    for k in keys {
        out.push_str(&format!("  {k:<17} {}\n", u(v, &[k])));
    }
}

fn stats_text(a: &Value) -> String {
    let mut out = format!(
        "VM {} (index {}, tenant {}): {}, {} connection(s)\n",
        s(a, "vm"),
        s(a, "index"),
        s(a, "tenant"),
        if a["connected"] == Value::Bool(true) {
            "connected"
        } else {
            "not connected"
        },
        u(a, &["connections"])
    );
    if let Some(ms) = a["stale_ms"].as_u64() {
        // The VM's state lock was busy: the objects, control and queue
        // values below are the last ones read.
        out.push_str(&format!(
            "(state lock busy: objects, control and queue values are {} old)\n",
            if ms == u64::MAX {
                "unknown (never read)".to_string()
            } else {
                format!("{ms} ms")
            }
        ));
    }
    section(&mut out, "objects", &a["resources"], &ResourceCounts::NAMES);
    section(&mut out, "control path", &a["ctrl"], &CtrlStats::NAMES);
    out.push_str(&format!(
        "  {:<17} {}\n",
        "events_lost",
        u(a, &["events_lost"])
    ));
    section(&mut out, "queued", &a["queues"], &QueueDepths::NAMES);
    if let Some(h) = a["host_quota"].as_object() {
        // The host NIC's objects and the daemon's mappings (verbs).
        out.push_str(&format!(
            "host share:\n  {:<17} {:>12} {:>12} {:>12} {:>12}\n",
            "", "configured", "share", "effective", "used"
        ));
        for (k, v) in h {
            out.push_str(&format!(
                "  {k:<17} {:>12} {:>12} {:>12} {:>12}\n",
                u(v, &["configured"]),
                u(v, &["share"]),
                u(v, &["effective"]),
                u(v, &["used"])
            ));
        }
    }
    section(&mut out, "traffic", &a["traffic"], &TrafficStats::NAMES);
    section(
        &mut out,
        "isolation",
        &a["isolation"],
        &IsolationStats::NAMES,
    );
    let h = &a["ctrl_latency"];
    let count = u(h, &["count"]);
    out.push_str(&format!("control latency: {count} command(s)"));
    if count > 0 {
        let mean_us = u(h, &["sum_ns"]) as f64 / count as f64 / 1000.0;
        out.push_str(&format!(", mean {mean_us:.1} us"));
    }
    out.push('\n');
    let bounds: Vec<u64> = h["bounds_us"]
        .as_array()
        .map(|b| b.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    if let Some(buckets) = h["buckets"].as_array() {
        for (i, n) in buckets.iter().enumerate() {
            let n = n.as_u64().unwrap_or(0);
            if n == 0 {
                continue;
            }
            let label = match bounds.get(i) {
                Some(b) => format!("<= {b} us"),
                None => "more".into(),
            };
            out.push_str(&format!("  {label:<17} {n}\n"));
        }
    }
    out.push_str(&format!("qos: {}\n", qos_line(&a["qos"])));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_tables() {
        let set = CtlCommand::Qos(QosCommand::Set {
            who: QosWho {
                vm: None,
                tenant: Some("blue".into()),
            },
            weight: Some(5),
            bytes_per_sec: None,
            ops_per_sec: Some(0),
            ctrl_per_sec: None,
        });
        let r: Value = serde_json::from_str(&request_of(&set).unwrap()).unwrap();
        assert_eq!(
            r,
            json!({"cmd":"set_qos","tenant":"blue","weight":5,"ops_per_sec":0})
        );
        assert!(request_of(&CtlCommand::Raw {
            request: "{}\n{}".into()
        })
        .is_err());
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    LONGER\nxyz  1\n");
        assert_eq!(
            limits_cell(&json!({"bytes_per_sec": 7, "ops_per_sec": 0})),
            "bytes/s=7"
        );
    }

    /// The move commands (spec 20.8): QP numbers in decimal or hex; the
    /// record read from a file, as `move-record` printed it or inside the
    /// daemon's whole answer; their answers as lines.
    #[test]
    fn move_commands_build_their_requests_and_read_records() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        let parse = |args: &[&str]| {
            let mut all = vec!["ctl", "-s", "/x"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).map(|c| c.ctl.command)
        };
        let hold = parse(&["peer-hold", "--gid", "::ffff:10.0.0.1", "--qpns", "0x11,18"]).unwrap();
        let r: Value = serde_json::from_str(&request_of(&hold).unwrap()).unwrap();
        assert_eq!(
            r,
            json!({"cmd": "peer_hold", "gid": "::ffff:10.0.0.1", "qpns": [17, 18], "ms": 30000})
        );
        assert!(parse(&["peer-hold", "--gid", "::1", "--qpns", "0xzz"]).is_err());
        assert!(
            parse(&["peer-hold", "--gid", "::1"]).is_err(),
            "QP numbers required"
        );
        let wire = parse(&["wire-qps", "web"]).unwrap();
        assert_eq!(
            request_of(&wire).unwrap(),
            r#"{"cmd":"wire_qps","vm":"web"}"#
        );

        let record = json!({"vm": "web", "from_gid": "::1", "to_gid": "::2",
            "qps": [[17, 19]], "rkeys": [[256, 512]]});
        let dir = std::env::temp_dir().join(format!("ctl-move-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            ("bare", record.to_string()),
            ("answer", json!({"ok": true, "record": record}).to_string()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let moved = CtlCommand::PeerMoved { record: path };
            let r: Value = serde_json::from_str(&request_of(&moved).unwrap()).unwrap();
            assert_eq!(r, json!({"cmd": "peer_moved", "record": record}), "{name}");
        }
        std::fs::write(dir.join("bad"), "not json").unwrap();
        let bad = CtlCommand::PeerMoved {
            record: dir.join("bad"),
        };
        assert!(request_of(&bad).unwrap_err().contains("not JSON"));
        let missing = CtlCommand::PeerMoved {
            record: dir.join("missing"),
        };
        assert!(request_of(&missing).is_err());
        std::fs::remove_dir_all(&dir).unwrap();

        let w = human(
            &wire,
            &json!({"ok": true, "gid": "::1", "qps": [[17, 19], [18, 18]]}),
        );
        assert_eq!(w, "GID ::1\nQPN   HOST_QPN\n0x11  0x13\n0x12  0x12\n");
        assert_eq!(
            human(&hold, &json!({"ok": true, "held": 2})),
            "2 connections held\n"
        );
    }

    /// `ctl stats` shows a VM's part of the host (verbs) as a table of
    /// configured, share, effective and used values; nothing without it.
    #[test]
    fn stats_show_the_host_share() {
        let mut answer = json!({"vm": "web", "index": 0, "tenant": "blue",
        "host_quota": {
            "maps": {"configured": 16384, "share": 32, "effective": 32, "used": 32},
            "qp": {"configured": 16384, "share": 29491, "effective": 16384, "used": 2},
        }});
        let t = stats_text(&answer);
        let rows: Vec<Vec<&str>> = t
            .lines()
            .skip_while(|l| *l != "host share:")
            .skip(2)
            .take(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                ["maps", "16384", "32", "32", "32"],
                ["qp", "16384", "29491", "16384", "2"]
            ],
            "{t}"
        );
        answer["host_quota"] = Value::Null;
        assert!(!stats_text(&answer).contains("host share"));
    }

    #[test]
    fn vms_table_shows_the_paired_mac() {
        let answer = json!({"vms": [
            {"name": "web", "tenant": "blue", "gid": "::ffff:10.42.0.1",
             "mac": "52:54:00:12:34:56", "engine": 0, "connected": true},
            {"name": "db", "tenant": "blue", "gid": "::ffff:10.42.0.2",
             "mac": null, "engine": 0, "connected": false},
        ]});
        let t = human(&CtlCommand::Vms, &answer);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("NAME  TENANT  GID               MAC  "),
            "{t}"
        );
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[1])[3], "52:54:00:12:34:56");
        assert_eq!(cells(lines[2])[3], "-");
    }
}
