#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
//! Operations, end to end: the real `vhost-user-rdma` binary started from a
//! configuration file with a management socket, a metrics listener and JSON
//! logs; guests connected through the test VMM create objects; then the
//! real `vhost-user-rdma ctl`, the JSON API (including hostile requests)
//! and `/metrics` must show them, QoS changes must apply live, and SIGTERM
//! must end the daemon cleanly and remove its sockets.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{MrSpec, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::mem::access;

const BIN: &str = env!("CARGO_BIN_EXE_vhost-user-rdma");

/// A daemon process with its private directory and captured log lines.
struct Daemon {
    child: Child,
    dir: PathBuf,
    mgmt: PathBuf,
    metrics: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

fn unique_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vur-ops-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Daemon {
    /// Starts the daemon with three VMs: web and db (tenant blue, class
    /// gold) and batch (tenant red), on two engine threads (blue on the
    /// first, red on the second).
    fn start(tag: &str) -> Daemon {
        let dir = unique_dir(tag);
        let config = format!(
            r#"
[daemon]
mgmt_socket = "{d}/mgmt.sock"
metrics_listen = "127.0.0.1:0"
log_format = "json"
engine_threads = 2

[[qos_class]]
name = "gold"
weight = 400
bytes_per_sec = 1000000000

[[tenant]]
name = "blue"
qos_class = "gold"

[[tenant]]
name = "red"

[[vm]]
name = "web"
socket = "{d}/web.sock"
tenant = "blue"
qos_class = "gold"
mac = "52:54:00:00:00:01"

[[vm]]
name = "db"
socket = "{d}/db.sock"
tenant = "blue"

[[vm]]
name = "batch"
socket = "{d}/batch.sock"
tenant = "red"
"#,
            d = dir.display()
        );
        let path = dir.join("config.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        let mgmt = dir.join("mgmt.sock");
        let deadline = Instant::now() + Duration::from_secs(20);
        let metrics = loop {
            let found = log.lock().unwrap().iter().find_map(|line| {
                let v: Value = serde_json::from_str(line).ok()?;
                let m = v["message"].as_str()?;
                let rest = m.strip_prefix("metrics on http://")?;
                rest.strip_suffix("/metrics")?.parse::<SocketAddr>().ok()
            });
            if let (Some(addr), true) = (found, mgmt.exists()) {
                break addr;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("daemon exited: {status}: {:?}", log.lock().unwrap());
            }
            assert!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Daemon {
            child,
            dir,
            mgmt,
            metrics,
            log,
        }
    }

    fn socket(&self, vm: &str) -> PathBuf {
        self.dir.join(format!("{vm}.sock"))
    }

    /// Connects a test VMM to `vm` and waits until the daemon shows it
    /// connected (it counts a connection right after the accept, while the
    /// connection's thread may already be answering the VMM).
    fn connect(&self, vm: &str) -> TestVmm {
        let before = self.connections(vm);
        let t = TestVmm::connect(self.socket(vm), VmmOptions::default()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.connections(vm) <= before {
            assert!(Instant::now() < deadline, "{vm}: connection not counted");
            std::thread::sleep(Duration::from_millis(1));
        }
        t
    }

    /// Connections of `vm` counted so far, from the management API.
    fn connections(&self, vm: &str) -> u64 {
        let v = self.ctl_json(&["vms"]);
        v["vms"]
            .as_array()
            .and_then(|vms| vms.iter().find(|x| x["name"] == vm))
            .and_then(|x| x["connections"].as_u64())
            .unwrap_or(0)
    }

    /// Runs `vhost-user-rdma ctl --socket <mgmt> args...`.
    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.mgmt)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `ctl --json args...`, expected to succeed, parsed.
    fn ctl_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let (code, out, err) = self.ctl(&a);
        assert_eq!(code, 0, "ctl {args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Whether a log line containing `needle` arrives: the daemon writes
    /// it when it acts, and the reader thread takes it from the pipe some
    /// time later (a busy machine may delay either).
    fn logs(&self, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.log_lines().iter().any(|l| l.contains(needle)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM and checks that the daemon exits with 0 and removes
    /// every socket.
    fn stop(mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "daemon did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "daemon exit status {status}");
        assert!(!self.mgmt.exists(), "management socket left behind");
        for vm in ["web", "db", "batch"] {
            assert!(!self.socket(vm).exists(), "socket of {vm} left behind");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Only reached when a test fails before stop().
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Creates a context, a PD, a CQ, `qps` RC QPs and an MR of `mr_pages`
/// pages.
fn create_objects(vm: &mut TestVmm, qps: usize, mr_pages: usize) {
    let mut v = Verbs::new(vm);
    let ctx = v.create_ctx().unwrap();
    let pd = v.alloc_pd(ctx).unwrap();
    let cq = v.create_cq(ctx, 16).unwrap();
    for _ in 0..qps {
        v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    }
    let pages = v.mem().alloc_pages(mr_pages, PAGE_SIZE).unwrap();
    v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0x10_0000, &pages))
        .unwrap();
}

/// A connection to the management socket.
struct Api {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Api {
    fn connect(path: &Path) -> Api {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Api {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    /// Sends without minding a connection the daemon has closed already.
    fn try_send(&mut self, bytes: &[u8]) {
        let _ = self.writer.write_all(bytes);
    }

    fn read_answer(&mut self) -> Value {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with('\n'), "answer {line:?} is not one line");
        serde_json::from_str(&line).unwrap()
    }

    fn call(&mut self, request: &str) -> Value {
        self.send_raw(format!("{request}\n").as_bytes());
        self.read_answer()
    }
}

fn assert_error(v: &Value, contains: &str) {
    assert_eq!(v["ok"], false, "{v}");
    let e = v["error"].as_str().unwrap_or("");
    assert!(e.contains(contains), "error {e:?} lacks {contains:?}");
}

/// The cells of the table row of `ctl` output whose first cell is `first`.
fn row<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first} in\n{table}"))
}

#[test]
fn ctl_shows_live_objects_and_changes_qos() {
    let d = Daemon::start("ctl");
    let mut web = d.connect("web");
    create_objects(&mut web, 3, 1);

    // ctl vms: a table with web connected, 3 QPs, one page registered, the
    // gold class's weight and byte limit; db and batch idle.
    let (code, out, err) = d.ctl(&["vms"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines()
            .next()
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec![
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
            "LIMITS"
        ])
    );
    assert_eq!(
        row(&out, "web"),
        [
            "web",
            "blue",
            "::ffff:10.42.0.1",
            "52:54:00:00:00:01",
            "0",
            "yes",
            "1",
            "3",
            "1",
            "1",
            "1",
            "4096",
            "400",
            "bytes/s=1000000000,ctrl/s=20000"
        ]
    );
    assert_eq!(
        row(&out, "batch"),
        [
            "batch",
            "red",
            "::ffff:10.42.0.3",
            "-",
            "1",
            "no",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "100",
            "ctrl/s=20000"
        ]
    );

    // The same as JSON.
    let v = d.ctl_json(&["vms"]);
    assert_eq!(v["ok"], true);
    let vms = v["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 3);
    assert_eq!(vms[0]["name"], "web");
    assert_eq!(vms[0]["resources"]["qp"], 3);
    assert_eq!(vms[0]["resources"]["registered_bytes"], PAGE_SIZE);
    assert_eq!(vms[0]["socket"], d.socket("web").display().to_string());
    assert_eq!(vms[1]["connected"], false);
    assert_eq!(vms[2]["tenant"], "red");
    assert_eq!(vms[0]["mac"], "52:54:00:00:00:01");
    assert_eq!(vms[2]["mac"], Value::Null);

    // ctl stats: human text and JSON (by name, by index).
    let (code, out, err) = d.ctl(&["stats", "web"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("VM web (index 0, tenant blue): connected, 1 connection(s)\n"));
    assert_eq!(row(&out, "qp"), ["qp", "3"]);
    assert_eq!(row(&out, "registered_bytes"), ["registered_bytes", "4096"]);
    let s = d.ctl_json(&["stats", "web"]);
    // ctx, pd, cq, 3 QPs and the MR completed with OK.
    assert!(s["ctrl"]["ok"].as_u64().unwrap() >= 7, "{s}");
    assert_eq!(s["ctrl"]["failed"], 0);
    assert_eq!(s["resources"]["cq"], 1);
    assert_eq!(s["ctrl_latency"]["buckets"].as_array().unwrap().len(), 15);
    assert!(s["isolation"]["denied"].is_u64());
    assert!(s["traffic"]["send_ops"].is_u64());
    let s = d.ctl_json(&["stats", "2"]);
    assert_eq!(s["vm"], "batch");

    // Errors from the daemon: exit 1 and its message.
    let (code, _, err) = d.ctl(&["stats", "nosuch"]);
    assert_eq!(code, 1);
    assert!(err.contains("no VM named \"nosuch\""), "{err}");
    let (code, _, err) = d.ctl(&["qos", "set", "db", "--weight", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("weight 0 is out of range"), "{err}");
    // Usage errors: exit 2.
    assert_eq!(d.ctl(&["qos", "set", "db"]).0, 2);
    assert_eq!(d.ctl(&["qos", "get"]).0, 2);
    assert_eq!(d.ctl(&["frobnicate"]).0, 2);
    let o = Command::new(BIN)
        .args(["ctl", "--socket", "/nonexistent/mgmt.sock", "vms"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot connect to the management socket"),
        "{err}"
    );

    // ctl qos set: a partial update, live, logged.
    let (code, out, err) = d.ctl(&[
        "qos",
        "set",
        "db",
        "--weight",
        "250",
        "--ops-per-sec",
        "5000",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "VM db (tenant blue): weight 250, bytes/s unlimited, ops/s 5000, ctrl/s 20000\n\
         previously: weight 100, bytes/s unlimited, ops/s unlimited, ctrl/s 20000\n"
    );
    let q = d.ctl_json(&["qos", "get", "db"]);
    assert_eq!(
        q["qos"],
        json!({"weight": 250, "bytes_per_sec": 0, "ops_per_sec": 5000, "ctrl_per_sec": 20000})
    );
    // The reply comes once the engine enforces the change.
    let r = d.ctl_json(&["qos", "set", "db", "--bytes-per-sec", "77"]);
    assert_eq!(r["applied"], true, "{r}");
    let q = d.ctl_json(&["qos", "get", "db"]);
    assert_eq!(q["qos"]["weight"], 250);
    assert_eq!(q["qos"]["ops_per_sec"], 5000);
    assert_eq!(q["qos"]["bytes_per_sec"], 77);
    let (code, _, err) = d.ctl(&["qos", "set", "--tenant", "red", "--ctrl-per-sec", "9"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = d.ctl(&["qos", "get", "--tenant", "red"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "tenant red: weight 100, bytes/s unlimited, ops/s unlimited, ctrl/s 9\n"
    );

    // ctl tenants.
    let (code, out, _) = d.ctl(&["tenants"]);
    assert_eq!(code, 0);
    let blue = row(&out, "blue");
    assert_eq!(&blue[..4], ["blue", "web,db", "1", "3"]);
    assert_eq!(blue.last(), Some(&"bytes/s=1000000000,ctrl/s=20000"));
    assert_eq!(row(&out, "red").last(), Some(&"ctrl/s=9"));
    let t = d.ctl_json(&["tenants"]);
    assert_eq!(t["tenants"][0]["resources"]["mr"], 1);
    assert_eq!(t["tenants"][0]["vms"], json!(["web", "db"]));
    assert_eq!(
        (&t["tenants"][0]["engine"], &t["tenants"][1]["engine"]),
        (&json!(0), &json!(1))
    );

    // ctl engines: two threads, blue's two VMs on the first, red's one on
    // the second; neither pinned.
    let (code, out, err) = d.ctl(&["engines"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines()
            .next()
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec![
            "ENGINE",
            "CPU",
            "VMS",
            "WQES",
            "BYTES",
            "PARKS",
            "PEEKED",
            "LATE_KICKS",
            "POLL_US"
        ])
    );
    assert_eq!(row(&out, "0")[1..3], ["-", "2"]);
    assert_eq!(row(&out, "1")[1..3], ["-", "1"]);
    let e = d.ctl_json(&["engines"]);
    assert_eq!(e["engines"].as_array().map(Vec::len), Some(2));
    assert_eq!(e["engines"][1]["vms"], 1);
    // Threads not pinned (`engine_cpus`) poll 20 µs after work, whatever
    // the traffic (a pinned one adapts: tests/tests/engines.rs).
    assert_eq!(e["engines"][0]["poll_window_us"], 20);
    assert_eq!(e["engines"][1]["poll_window_us"], 20);

    // ctl raw, ping, version.
    let (code, out, _) = d.ctl(&["raw", r#"{"cmd":"ping","id":42}"#]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, json!({"ok": true, "pong": true, "id": 42}));
    let (code, out, _) = d.ctl(&["raw", r#"{"cmd":"nope"}"#]);
    assert_eq!(code, 1);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["ok"], false);
    assert_eq!(d.ctl(&["ping"]), (0, "pong\n".to_string(), String::new()));
    let (code, out, _) = d.ctl(&["version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("vhost-user-rdma {}", env!("CARGO_PKG_VERSION"))));

    // The JSON log: every line an object with ts, level, target, message;
    // connect and QoS messages carry the VM and tenant.
    let lines = d.log_lines();
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    for v in &parsed {
        for k in ["ts", "level", "target", "message"] {
            assert!(v[k].is_string(), "{v} lacks {k}");
        }
    }
    let find = |prefix: &str| {
        parsed
            .iter()
            .find(|v| v["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no log line {prefix:?} in {lines:?}"))
    };
    // The connect message (whatever its wording) names web and blue.
    assert!(
        parsed.iter().any(|v| v["vm"] == "web"
            && v["tenant"] == "blue"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("connected"))),
        "{lines:?}"
    );
    let q = find("QoS of VM db changed: weight 100 -> 250");
    assert_eq!((&q["vm"], &q["tenant"]), (&json!("db"), &json!("blue")));
    let q = find("QoS of tenant red changed");
    assert_eq!(q["tenant"], "red");
    assert!(q.get("vm").is_none());

    // The management socket is private to the daemon's user.
    let mode = std::fs::metadata(&d.mgmt).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    drop(web);
    d.stop();
}

#[test]
fn api_refuses_bad_requests_and_keeps_serving() {
    let d = Daemon::start("api");
    let mut api = Api::connect(&d.mgmt);
    assert_error(&api.call("not json"), "invalid JSON");
    assert_error(&api.call("[1,2]"), "must be a JSON object");
    assert_error(&api.call(r#"{"id":3}"#), "missing \"cmd\"");
    assert_error(&api.call(r#"{"cmd":7}"#), "must be a string");
    assert_error(&api.call(r#"{"cmd":"frobnicate"}"#), "unknown command");
    assert_error(&api.call(r#"{"cmd":"list_vms","x":1}"#), "unknown field");
    assert_error(&api.call(r#"{"cmd":"vm_stats"}"#), "missing field `vm`");
    assert_error(
        &api.call(r#"{"cmd":"vm_stats","vm":"nosuch"}"#),
        "no VM named",
    );
    assert_error(
        &api.call(r#"{"cmd":"vm_stats","vm":99}"#),
        "no VM with index 99",
    );
    assert_error(&api.call(r#"{"cmd":"vm_stats","vm":-1}"#), "vm_stats");
    assert_error(
        &api.call(r#"{"cmd":"get_qos"}"#),
        "give \"vm\" or \"tenant\"",
    );
    assert_error(
        &api.call(r#"{"cmd":"get_qos","tenant":"green"}"#),
        "no tenant named",
    );
    let bad_sets = [
        (r#"{"cmd":"set_qos","vm":"web","weight":0}"#, "out of range"),
        (
            r#"{"cmd":"set_qos","vm":"web","weight":1001}"#,
            "out of range",
        ),
        (
            r#"{"cmd":"set_qos","vm":"web","weight":-1}"#,
            "invalid value",
        ),
        (
            r#"{"cmd":"set_qos","vm":"web","weight":"x"}"#,
            "invalid type",
        ),
        (
            r#"{"cmd":"set_qos","vm":"web","weight":1.5}"#,
            "invalid type",
        ),
        (
            r#"{"cmd":"set_qos","vm":"web","bytes_per_sec":1e30}"#,
            "invalid type",
        ),
        (r#"{"cmd":"set_qos","vm":"web"}"#, "nothing to set"),
        (
            r#"{"cmd":"set_qos","vm":"web","tenant":"blue","weight":5}"#,
            "not both",
        ),
        (r#"{"cmd":"set_qos","vm":"web","burst":5}"#, "unknown field"),
    ];
    for (req, why) in bad_sets {
        assert_error(&api.call(req), why);
    }
    // Nothing of those was applied.
    let q = api.call(r#"{"cmd":"get_qos","vm":"web"}"#);
    assert_eq!(q["qos"]["weight"], 400, "{q}");
    assert_eq!(q["qos"]["bytes_per_sec"], 1_000_000_000u64);
    // Blank lines are ignored; ids are echoed; several requests in one write.
    api.send_raw(b"\n\r\n{\"cmd\":\"ping\",\"id\":\"a\"}\n{\"cmd\":\"vm_stats\",\"vm\":\"2\"}\n");
    assert_eq!(
        api.read_answer(),
        json!({"ok": true, "pong": true, "id": "a"})
    );
    assert_eq!(api.read_answer()["vm"], "batch");
    let v = api.call(r#"{"cmd":"version"}"#);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let h = api.call(r#"{"cmd":"help"}"#);
    assert!(h["commands"]
        .as_array()
        .unwrap()
        .contains(&json!("set_qos")));

    // An oversized request: an error, then the connection is closed.
    let mut big = Api::connect(&d.mgmt);
    let junk = vec![b'x'; 70 * 1024];
    // The daemon may close before it has read all of it.
    big.try_send(&junk);
    assert_error(&big.read_answer(), "longer than 65536 bytes");
    let mut rest = String::new();
    assert_eq!(big.reader.read_line(&mut rest).unwrap(), 0, "{rest}");
    // Also a complete line just over the limit, sent at once; a line at
    // the limit is fine (answered: it is no JSON).
    let mut at = Api::connect(&d.mgmt);
    let mut line = vec![b'x'; 64 * 1024];
    line.push(b'\n');
    at.send_raw(&line);
    assert_error(&at.read_answer(), "invalid JSON");
    line.insert(0, b'x');
    at.try_send(&line);
    assert_error(&at.read_answer(), "longer than 65536 bytes");
    drop(at);

    // Too many connections at once: with `api`, 8 are served, the next is
    // told so and closed.
    std::thread::sleep(Duration::from_millis(200));
    let mut idle = Vec::new();
    loop {
        let mut extra = Api::connect(&d.mgmt);
        extra.try_send(b"{\"cmd\":\"ping\"}\n");
        let a = extra.read_answer();
        if a["ok"] == false {
            assert_error(&a, "too many connections");
            break;
        }
        idle.push(extra);
        assert!(idle.len() < 8, "the connection limit never applied");
    }
    assert_eq!(idle.len() + 1, 8);
    drop(idle);
    // The daemon keeps serving: the old connection and, once the idle ones
    // are gone, new ones.
    assert_eq!(api.call(r#"{"cmd":"ping"}"#)["ok"], true);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = Api::connect(&d.mgmt);
        if again.call(r#"{"cmd":"ping"}"#)["ok"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "no new connection served");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(api);
    d.stop();
}

/// One HTTP exchange: sends `request`, returns (status, head, body).
fn http(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8(resp).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(len, body.len());
    (status, head.to_string(), body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses a text exposition page strictly; returns `series -> value`, the
/// series written as `name{k="v",...}` in the page's label order.
fn parse_metrics(page: &str) -> HashMap<String, f64> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: Vec<String> = Vec::new();
    let mut samples = HashMap::new();
    assert!(page.ends_with('\n'));
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            assert!(valid_name(name) && !help.is_empty(), "{line}");
            assert!(!helped.contains(&name.to_string()), "second HELP: {line}");
            helped.push(name.into());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap();
            assert!(valid_name(name), "{line}");
            assert!(["counter", "gauge", "histogram"].contains(&t), "{line}");
            assert!(
                types.insert(name.into(), t.into()).is_none(),
                "second TYPE: {line}"
            );
            continue;
        }
        assert!(!line.starts_with('#'), "{line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("{line}"))),
            None => (series, ""),
        };
        assert!(valid_name(name), "{line}");
        // Labels: k="v" separated by commas; values without raw quotes.
        let mut rest = labels;
        while !rest.is_empty() {
            let (k, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
            assert!(valid_name(k), "{line}");
            let end = after.find('"').unwrap_or_else(|| panic!("{line}"));
            rest = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let base = name.strip_suffix(s)?;
                (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(name);
        let t = types
            .get(family)
            .unwrap_or_else(|| panic!("no TYPE before {line}"));
        if t == "counter" {
            assert!(name.ends_with("_total"), "{line}");
        }
        assert!(v >= 0.0, "{line}");
        assert!(
            samples.insert(series.to_string(), v).is_none(),
            "duplicate {line}"
        );
    }
    samples
}

#[test]
fn metrics_endpoint() {
    let d = Daemon::start("metrics");
    let mut web = d.connect("web");
    create_objects(&mut web, 2, 2);
    let mut batch = d.connect("batch");
    create_objects(&mut batch, 1, 1);

    let (status, head, body) = get(d.metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let m = parse_metrics(&body);
    let val = |s: &str| *m.get(s).unwrap_or_else(|| panic!("no {s}"));
    assert_eq!(val(r#"vhost_user_rdma_info{version="0.1.0"}"#), 1.0);
    let web_l = r#"vm="web",tenant="blue""#;
    assert_eq!(
        val(&format!(
            "vhost_user_rdma_vm_objects{{{web_l},kind=\"qp\"}}"
        )),
        2.0
    );
    assert_eq!(
        val(&format!(
            "vhost_user_rdma_vm_objects{{{web_l},kind=\"mr\"}}"
        )),
        1.0
    );
    assert_eq!(
        val(&format!(
            "vhost_user_rdma_vm_objects{{{web_l},kind=\"srq\"}}"
        )),
        0.0
    );
    assert_eq!(
        val(&format!("vhost_user_rdma_vm_registered_bytes{{{web_l}}}")),
        2.0 * PAGE_SIZE as f64
    );
    assert_eq!(
        val(&format!("vhost_user_rdma_vm_connected{{{web_l}}}")),
        1.0
    );
    assert_eq!(
        val(&format!("vhost_user_rdma_vm_connections_total{{{web_l}}}")),
        1.0
    );
    assert_eq!(
        val(r#"vhost_user_rdma_vm_connected{vm="db",tenant="blue"}"#),
        0.0
    );
    assert_eq!(
        val(r#"vhost_user_rdma_vm_objects{vm="batch",tenant="red",kind="qp"}"#),
        1.0
    );
    assert!(
        val(&format!(
            "vhost_user_rdma_vm_ctrl_completed_total{{{web_l},result=\"ok\"}}"
        )) >= 6.0
    );
    assert_eq!(
        val(&format!(
            "vhost_user_rdma_vm_ctrl_completed_total{{{web_l},result=\"failed\"}}"
        )),
        0.0
    );
    for kind in [
        "denied",
        "foreign_drops",
        "foreign_rc",
        "unknown_qpn",
        "bad_rkey",
        "gid_spoof",
        "privileged",
    ] {
        val(&format!(
            "vhost_user_rdma_vm_isolation_events_total{{{web_l},kind=\"{kind}\"}}"
        ));
        val(&format!(
            "vhost_user_rdma_tenant_isolation_events_total{{tenant=\"red\",kind=\"{kind}\"}}"
        ));
    }
    for name in [
        "send_ops_total",
        "send_bytes_total",
        "recv_ops_total",
        "recv_bytes_total",
        "error_completions_total",
        "flushed_completions_total",
        "drops_total",
        "throttled_total",
        "notifications_total",
        "ctrl_commands_total",
        "ctrl_errors_total",
        "events_lost_total",
    ] {
        val(&format!("vhost_user_rdma_vm_{name}{{{web_l}}}"));
        val(&format!("vhost_user_rdma_tenant_{name}{{tenant=\"blue\"}}"));
    }
    // Tenant sums.
    assert_eq!(
        val(r#"vhost_user_rdma_tenant_objects{tenant="blue",kind="qp"}"#),
        2.0
    );
    assert_eq!(
        val(r#"vhost_user_rdma_tenant_objects{tenant="red",kind="qp"}"#),
        1.0
    );
    assert_eq!(
        val(r#"vhost_user_rdma_tenant_connected{tenant="blue"}"#),
        1.0
    );
    assert_eq!(val(r#"vhost_user_rdma_tenant_vms{tenant="blue"}"#), 2.0);
    assert_eq!(val(r#"vhost_user_rdma_tenant_vms{tenant="red"}"#), 1.0);
    assert_eq!(val(r#"vhost_user_rdma_engine_vms{engine="0"}"#), 2.0);
    assert_eq!(val(r#"vhost_user_rdma_engine_vms{engine="1"}"#), 1.0);
    assert!(val(r#"vhost_user_rdma_engine_parks_total{engine="1"}"#) >= 0.0);
    // The latency histogram: cumulative buckets ending in +Inf = _count.
    let mut last = 0.0;
    for le in ["0.000005", "0.00001", "0.0001", "0.001", "0.1", "1", "+Inf"] {
        let b = val(&format!(
            "vhost_user_rdma_vm_ctrl_latency_seconds_bucket{{{web_l},le=\"{le}\"}}"
        ));
        assert!(b >= last, "bucket {le} below the one before");
        last = b;
    }
    assert_eq!(
        last,
        val(&format!(
            "vhost_user_rdma_vm_ctrl_latency_seconds_count{{{web_l}}}"
        ))
    );
    val(&format!(
        "vhost_user_rdma_vm_ctrl_latency_seconds_sum{{{web_l}}}"
    ));
    val(r#"vhost_user_rdma_tenant_ctrl_latency_seconds_count{tenant="blue"}"#);
    // QoS gauges, before and after a live change.
    assert_eq!(
        val(&format!("vhost_user_rdma_vm_qos_weight{{{web_l}}}")),
        400.0
    );
    assert_eq!(
        val(r#"vhost_user_rdma_tenant_qos_bytes_per_second{tenant="blue"}"#),
        1e9
    );
    assert_eq!(
        val(r#"vhost_user_rdma_vm_qos_ops_per_second{vm="db",tenant="blue"}"#),
        0.0
    );
    let mut api = Api::connect(&d.mgmt);
    let a = api.call(r#"{"cmd":"set_qos","vm":"web","weight":7,"ctrl_per_sec":300}"#);
    assert_eq!(a["ok"], true, "{a}");
    let a = api.call(r#"{"cmd":"set_qos","tenant":"red","ops_per_sec":12345}"#);
    assert_eq!(a["ok"], true, "{a}");
    // Objects go away with the VM's connection.
    drop(batch);
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = parse_metrics(&get(d.metrics, "/metrics").2);
        if m[r#"vhost_user_rdma_vm_connected{vm="batch",tenant="red"}"#] == 0.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "batch never disconnected");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(m[&format!("vhost_user_rdma_vm_qos_weight{{{web_l}}}")], 7.0);
    assert_eq!(
        m[&format!("vhost_user_rdma_vm_qos_ctrl_per_second{{{web_l}}}")],
        300.0
    );
    assert_eq!(
        m[r#"vhost_user_rdma_tenant_qos_ops_per_second{tenant="red"}"#],
        12345.0
    );
    assert_eq!(
        m[r#"vhost_user_rdma_vm_objects{vm="batch",tenant="red",kind="qp"}"#],
        0.0
    );
    assert_eq!(
        m[r#"vhost_user_rdma_vm_connections_total{vm="batch",tenant="red"}"#],
        1.0
    );

    // The other endpoints and errors.
    let (status, _, body) = get(d.metrics, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(get(d.metrics, "/metrics?x=1").0, 200);
    assert_eq!(get(d.metrics, "/").0, 404);
    assert_eq!(get(d.metrics, "/metricsx").0, 404);
    let (status, head, _) = http(
        d.metrics,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(head.contains("Allow: GET"), "{head}");
    assert_eq!(http(d.metrics, b"GARBAGE\r\n\r\n").0, 400);
    assert_eq!(http(d.metrics, b"GET /metrics SPDY/9\r\n\r\n").0, 400);
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(10_000)
    );
    assert_eq!(http(d.metrics, huge.as_bytes()).0, 431);

    // A slow client (connected, silent) does not hold up others.
    let mut slow = TcpStream::connect(d.metrics).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let t = Instant::now();
    assert_eq!(get(d.metrics, "/healthz").0, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // ... and is cut off after the read timeout.
    slow.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));

    drop(web);
    d.stop();
}

#[test]
fn other_users_are_refused() {
    let d = Daemon::start("cred");
    let mode = std::fs::metadata(&d.mgmt).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the check of another user's connection is skipped");
        d.stop();
        return;
    }
    use std::os::unix::process::CommandExt;
    // A copy of the binary that user nobody can run.
    let bin = d.dir.join("bin");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&d.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = || {
        Command::new(&bin)
            .args(["ctl", "--socket"])
            .arg(&d.mgmt)
            .arg("ping")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    // The socket's mode keeps nobody out ...
    let o = as_nobody();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));
    // ... and if the mode were wider, the daemon refuses the peer itself.
    std::fs::set_permissions(&d.mgmt, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("error: permission denied"));
    // Its own user is still served.
    assert_eq!(d.ctl(&["ping"]).0, 0);
    assert!(d.logs("refused a connection from another user"));
    d.stop();
}

#[test]
fn dist_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let loaded = vhost_user_rdma::config_file::load(
        &path,
        &vhost_user_rdma::config::LimitOverrides::default(),
    )
    .unwrap();
    let c = &loaded.config;
    assert_eq!(
        c.mgmt_socket.as_deref(),
        Some(Path::new(vhost_user_rdma::mgmt::ctl::DEFAULT_SOCKET))
    );
    assert_eq!(c.metrics_listen.map(|a| a.port()), Some(9842));
    assert_eq!(
        loaded.log_format,
        Some(vhost_user_rdma::logging::LogFormat::Json)
    );
    assert!(c
        .vms
        .iter()
        .all(|v| v.socket.starts_with("/run/vhost-user-rdma/")));
}

#[test]
fn systemd_unit_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/vhost-user-rdma.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for want in [
        "ExecStart=/usr/bin/vhost-user-rdma --config /etc/vhost-user-rdma/config.toml",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/run/vhost-user-rdma",
        "RuntimeDirectory=vhost-user-rdma",
        "Restart=on-failure",
    ] {
        assert!(text.lines().any(|l| l == want), "unit lacks {want}");
    }
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("systemd-analyze not installed: the unit's syntax check is skipped");
        return;
    }
    // Verify a copy that starts the binary just built (verify checks that
    // ExecStart exists).
    let dir = unique_dir("unit");
    let copy = dir.join("vhost-user-rdma.service");
    std::fs::write(&copy, text.replace("/usr/bin/vhost-user-rdma", BIN)).unwrap();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Only this unit's own complaints count (verify also loads the
    // machine's units it refers to).
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("vhost-user-rdma.service"))
        .collect();
    assert!(o.status.success() && ours.is_empty(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
