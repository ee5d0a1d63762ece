//! `rdma-peer`, the binary that plays one VM of a daemon against a peer on
//! another machine over TCP, run here as two processes against two VMs of
//! one in-process daemon (its software RNIC): the checked exchange with
//! its addresses swapped over TCP, the `ibv_rc_pingpong`-compatible
//! ping-pong as server and client, and a pingpong server fed garbage
//! instead of an address message; UD messages both ways, `ib_write_lat`'s
//! and `ib_write_bw`'s measurements, and the errors of a UD receiver whose
//! messages never come and of a peer that sends a malformed address;
//! `rping-server` and `rping-client` over the VMs' own CM (no TCP), and
//! the client's failures when its REQ is rejected or never answered.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_rdma::config::default_gid;
use vhost_user_rdma_tests::harness::TestDaemon;
use virtio_rdma_apps::exchange::sync;
use virtio_rdma_apps::oob::{Oob, TcpOob};

/// Longest a run may take before it is killed and the test fails (the runs
/// take well under a second each here).
const LIMIT: Duration = Duration::from_secs(25);

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A running `rdma-peer` with its output in files.
struct Peer {
    name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

/// What a finished `rdma-peer` did.
struct Done {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Peer {
    fn spawn(d: &TestDaemon, name: &str, args: &[&str]) -> Peer {
        let out = d.dir().join(format!("{name}.out"));
        let err = d.dir().join(format!("{name}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_rdma-peer"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Peer {
            name: name.to_string(),
            child,
            out,
            err,
        }
    }

    /// Waits for the process to end (killing it, and failing, after
    /// [`LIMIT`]).
    fn finish(mut self) -> Done {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let (stdout, stderr) = (read(&self.out), read(&self.err));
        let Some(status) = status else {
            panic!(
                "{} still running after {LIMIT:?}, killed\nstdout:\n{stdout}\nstderr:\n{stderr}",
                self.name
            );
        };
        Done {
            ok: status.success(),
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

impl Done {
    /// Panics with both peers' output unless this one exited 0.
    fn expect_ok(&self, name: &str, other: &Done) {
        assert!(
            self.ok,
            "{name} failed ({:?})\nstdout:\n{}\nstderr:\n{}\nthe other side's stdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr, other.stdout, other.stderr
        );
    }
}

fn sock(d: &TestDaemon, i: usize) -> String {
    d.socket(i).to_str().unwrap().to_string()
}

#[test]
fn exchange_between_two_processes_over_tcp() {
    let d = TestDaemon::start(2).unwrap();
    let tcp = format!("127.0.0.1:{}", free_port());
    let common = [
        "--tcp",
        &tcp,
        "--buf-len",
        "65536",
        "--pingpongs",
        "20",
        "--stream-writes",
        "4",
        "--timeout-secs",
        "10",
    ];
    let (s0, s1) = (sock(&d, 0), sock(&d, 1));
    // The client starts first: it must retry until the server listens.
    let client = Peer::spawn(
        &d,
        "client",
        &[
            &["exchange", "--socket", &s1, "--role", "client"],
            &common[..],
        ]
        .concat(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let server = Peer::spawn(
        &d,
        "server",
        &[
            &["exchange", "--socket", &s0, "--role", "server"],
            &common[..],
        ]
        .concat(),
    );
    let (c, s) = (client.finish(), server.finish());
    c.expect_ok("client", &s);
    s.expect_ok("server", &c);
    for (name, r) in [("client", &c), ("server", &s)] {
        assert!(
            r.stdout.lines().last() == Some("rdma-peer: exchange ok"),
            "{name}:\n{}",
            r.stdout
        );
    }
    assert!(s.stdout.contains("server: done"), "{}", s.stdout);
    // Every step ran and was checked (the atomics too: the device has them).
    for step in [
        "20 SEND/RECV ping-pongs",
        "all received intact",
        "data and guard bytes intact",
        "delivered with its data",
        "all read intact",
        "every old value and the final value exact",
        "RDMA WRITE stream: 4 x 64 KiB",
    ] {
        assert!(c.stdout.contains(step), "missing {step:?}:\n{}", c.stdout);
    }
    let checks: u32 = c
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("client: done: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no check count in:\n{}", c.stdout));
    // 20 ping-pongs, 8 SENDs, 8 WRITEs, 1 WRITE_WITH_IMM, 8 READs and 51
    // atomics for a 64 KiB buffer.
    assert_eq!(checks, 20 + 8 + 8 + 1 + 8 + 51, "{}", c.stdout);
}

/// The `local address:` / `remote address:` line of a pingpong run:
/// (QPN, PSN, GID text).
fn address(stdout: &str, which: &str) -> (u32, u32, String) {
    let line = stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(which))
        .unwrap_or_else(|| panic!("no {which:?} line in:\n{stdout}"));
    let field = |name: &str| {
        line.split(", ")
            .find_map(|f| f.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_string()
    };
    let hex = |s: String| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    (hex(field("QPN ")), hex(field("PSN ")), field("GID "))
}

/// Runs a pingpong server on VM 0 and a client on VM 1; checks both ran
/// all iterations and saw each other's addresses.
fn pingpong(size: usize, iters: u32, extra: &[&str]) {
    let d = TestDaemon::start(2).unwrap();
    let port = free_port().to_string();
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let common = [
        &[
            "-p",
            &port,
            "-s",
            &size_s,
            "-n",
            &iters_s,
            "--timeout-secs",
            "10",
        ][..],
        extra,
    ]
    .concat();
    let (s0, s1) = (sock(&d, 0), sock(&d, 1));
    let server = Peer::spawn(
        &d,
        "server",
        &[&["pingpong", "--socket", &s0, "--server"][..], &common].concat(),
    );
    let client = Peer::spawn(
        &d,
        "client",
        &[
            &["pingpong", "--socket", &s1, "--client", "127.0.0.1"][..],
            &common,
        ]
        .concat(),
    );
    let (c, s) = (client.finish(), server.finish());
    c.expect_ok("client", &s);
    s.expect_ok("server", &c);
    let bytes = size as u64 * u64::from(iters) * 2;
    for (name, r) in [("client", &c), ("server", &s)] {
        let lines: Vec<&str> = r.stdout.lines().collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{bytes} bytes in ")) && l.ends_with(" Mbit/sec")),
            "{name}:\n{}",
            r.stdout
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{iters} iters in ")) && l.ends_with(" usec/iter")),
            "{name}:\n{}",
            r.stdout
        );
        assert_eq!(lines.last(), Some(&"rdma-peer: pingpong ok"), "{name}");
    }
    // Each side's remote address is the other's local one, with the
    // daemon's GIDs of the two VMs.
    assert_eq!(
        address(&s.stdout, "remote address: "),
        address(&c.stdout, "local address:  ")
    );
    assert_eq!(
        address(&c.stdout, "remote address: "),
        address(&s.stdout, "local address:  ")
    );
    let gid = |i| Ipv6Addr::from(default_gid(i)).to_string();
    assert_eq!(address(&s.stdout, "local address:  ").2, gid(0));
    assert_eq!(address(&c.stdout, "local address:  ").2, gid(1));
}

#[test]
fn pingpong_between_two_processes() {
    pingpong(4096, 50, &[]);
}

/// One-byte messages, one receive posted at a time (the receive queue is
/// refilled after every message), the largest MTU.
#[test]
fn pingpong_of_one_byte_messages() {
    pingpong(1, 50, &["-r", "1", "-m", "4096"]);
}

/// Messages of several pages with the tool's `-c` on the client (its first
/// message has a zero at each page start, which the server's check must
/// accept), the smallest MTU.
#[test]
fn pingpong_of_multi_page_messages_with_chk() {
    pingpong(3 * 4096 + 5, 20, &["-c", "-m", "256", "-r", "4"]);
}

/// Connects to a pingpong server on `port` (retrying while it starts),
/// sends `bytes`, closes the sending half, and returns what the server
/// sent back before closing.
fn feed(port: u16, bytes: &[u8]) -> Vec<u8> {
    let deadline = Instant::now() + LIMIT;
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the server never listened: {e}"),
        }
    };
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

/// A server fed something other than an address message exits with an
/// error that says what was wrong, without answering, panicking or hanging.
#[test]
fn pingpong_server_refuses_garbage() {
    let d = TestDaemon::start(1).unwrap();
    let s0 = sock(&d, 0);
    for (i, (garbage, want)) in [
        (
            &b"GET / HTTP/1.1\r\nHost: example\r\n\r\nxxxxxxxxxxxxxxxxxxx"[..],
            "malformed address message from the peer",
        ),
        (
            &b"0000:000011:abcdef:00000000000000000000ffff0a2bXXXX\0"[..],
            "the GID has 'X' at byte 47",
        ),
        (
            &b"0000:00"[..],
            "closed the connection after 7 of the 52 bytes",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let port = free_port();
        let server = Peer::spawn(
            &d,
            &format!("server{i}"),
            &[
                "pingpong",
                "--socket",
                &s0,
                "--server",
                "-p",
                &port.to_string(),
                "--timeout-secs",
                "10",
            ],
        );
        let back = feed(port, garbage);
        let r = server.finish();
        assert!(!r.ok, "accepted {garbage:?}:\n{}", r.stdout);
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        assert!(back.is_empty(), "the server answered {back:?}");
        assert!(r.stderr.contains("rdma-peer: error: "), "{}", r.stderr);
        assert!(r.stderr.contains(want), "want {want:?} in:\n{}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        // The server did not start the ping-pong.
        assert!(!r.stdout.contains("remote address"), "{}", r.stdout);
    }
}

/// Runs `rdma-peer CMD` as server on VM 0 and client on VM 1 of one
/// daemon, connected over TCP, with `args` on both; both must succeed.
/// Returns (client, server).
fn pair(cmd: &str, args: &[&str]) -> (Done, Done) {
    let d = TestDaemon::start(2).unwrap();
    let tcp = format!("127.0.0.1:{}", free_port());
    let common = [&["--tcp", &tcp, "--timeout-secs", "10"][..], args].concat();
    let (s0, s1) = (sock(&d, 0), sock(&d, 1));
    let server = Peer::spawn(
        &d,
        "server",
        &[&[cmd, "--socket", &s0, "--role", "server"][..], &common].concat(),
    );
    let client = Peer::spawn(
        &d,
        "client",
        &[&[cmd, "--socket", &s1, "--role", "client"][..], &common].concat(),
    );
    let (c, s) = (client.finish(), server.finish());
    c.expect_ok("client", &s);
    s.expect_ok("server", &c);
    (c, s)
}

#[test]
fn ud_both_ways_between_two_processes() {
    let (c, s) = pair("ud", &["-n", "20"]);
    for (name, r, dir) in [
        ("client", &c, "server -> client"),
        ("server", &s, "client -> server"),
    ] {
        assert_eq!(
            r.stdout.lines().last(),
            Some("rdma-peer: ud ok (20 messages each way)"),
            "{name}:\n{}",
            r.stdout
        );
        // Each side checked what it received; on the software RNIC the
        // largest UD payload is above 1024, so -s (1024) caps the sizes.
        let want = format!(
            "ud: {dir}: 20 messages received, each checked (status, length, source QPN, GRH, bytes)"
        );
        assert!(r.stdout.contains(&want), "{name}:\n{}", r.stdout);
        assert!(
            r.stdout.contains("20 messages of 1..=1024 bytes each way"),
            "{name}:\n{}",
            r.stdout
        );
    }
}

/// The numbers of a `write_lat: size S iters N t_min X t_typical Y t_avg Z
/// t_p99 W usec` line: (S, N, [X, Y, Z, W]).
fn lat_line(stdout: &str) -> (u64, u64, [f64; 4]) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("write_lat: size "))
        .unwrap_or_else(|| panic!("no write_lat line in:\n{stdout}"));
    let w: Vec<&str> = line.split(' ').collect();
    let keys = [
        (0, "write_lat:"),
        (1, "size"),
        (3, "iters"),
        (5, "t_min"),
        (7, "t_typical"),
        (9, "t_avg"),
        (11, "t_p99"),
        (13, "usec"),
    ];
    assert_eq!(w.len(), 14, "{line:?}");
    for (i, k) in keys {
        assert_eq!(w[i], k, "{line:?}");
    }
    let t = |i: usize| {
        let v: f64 = w[i].parse().unwrap_or_else(|_| panic!("{line:?}"));
        // perftest's two decimals.
        assert_eq!(
            w[i].split_once('.').map(|(_, f)| f.len()),
            Some(2),
            "{line:?}"
        );
        v
    };
    (
        w[2].parse().unwrap(),
        w[4].parse().unwrap(),
        [t(6), t(8), t(10), t(12)],
    )
}

/// The same over UC QPs (`--uc` on both sides): the QPs are UC and every
/// round trip's WRITE arrives (an idle link loses none).
#[test]
fn write_lat_over_uc_between_two_processes() {
    let (c, s) = pair("write-lat", &["-n", "100", "--uc"]);
    for (name, r) in [("client", &c), ("server", &s)] {
        assert!(
            r.stdout.contains("write_lat_uc QP: QPN"),
            "{name}: UC QP:\n{}",
            r.stdout
        );
        let (size, iters, [min, typical, _, p99]) = lat_line(&r.stdout);
        assert_eq!((size, iters), (64, 100), "{name}");
        assert!(min <= typical && typical <= p99, "{name}:\n{}", r.stdout);
        assert_eq!(
            r.stdout.lines().last(),
            Some("rdma-peer: write-lat ok"),
            "{name}"
        );
    }
}

#[test]
fn write_lat_between_two_processes() {
    let (c, s) = pair("write-lat", &["-n", "200"]);
    for (name, r) in [("client", &c), ("server", &s)] {
        let (size, iters, [min, typical, avg, p99]) = lat_line(&r.stdout);
        assert_eq!((size, iters), (64, 200), "{name}");
        assert!(typical > 0.0, "{name}:\n{}", r.stdout);
        assert!(min <= typical && typical <= p99, "{name}:\n{}", r.stdout);
        assert!(min <= avg, "{name}:\n{}", r.stdout);
        assert_eq!(
            r.stdout.lines().last(),
            Some("rdma-peer: write-lat ok"),
            "{name}"
        );
    }
}

#[test]
fn write_bw_between_two_processes() {
    let (c, s) = pair("write-bw", &["-n", "200", "-s", "65536"]);
    for (name, r) in [("client", &c), ("server", &s)] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with("write_bw: size "))
            .unwrap_or_else(|| panic!("{name}: no write_bw line in:\n{}", r.stdout));
        let w: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            (w.len(), w[0], w[1], w[2], w[3], w[4], w[5], w[7]),
            (
                9,
                "write_bw:",
                "size",
                "65536",
                "iters",
                "200",
                "MB/s",
                "Mmsg/s"
            ),
            "{line:?}"
        );
        let mbps: f64 = w[6].parse().unwrap();
        let mmsgs: f64 = w[8].parse().unwrap();
        assert!(mbps > 0.0 && mmsgs > 0.0, "{line:?}");
        // 65536 bytes a message: MB/s = Mmsg/s × 65536 (up to rounding).
        assert!(
            (mbps - mmsgs * 65536.0).abs() <= 0.01 + mbps * 1e-4,
            "{line:?}"
        );
        assert_eq!(
            r.stdout.lines().last(),
            Some("rdma-peer: write-bw ok"),
            "{name}"
        );
    }
    // The server prints the client's measurement.
    let bw = |r: &Done| {
        r.stdout
            .lines()
            .find(|l| l.starts_with("write_bw: size "))
            .map(str::to_string)
    };
    assert_eq!(bw(&c), bw(&s));
}

/// Connects to an `rdma-peer` server's TCP port as a client would.
fn fake_client(port: u16) -> TcpOob {
    TcpOob::connect(("127.0.0.1", port), LIMIT).unwrap()
}

/// UD messages lost on the way (left out by the sender the first time, in
/// both directions, in two windows) are asked for again and arrive, each
/// checked like the rest; both receivers say how many they lost.
#[test]
fn ud_asks_for_lost_messages_again() {
    let (c, s) = pair("ud", &["-n", "40", "--drop-first", "3,33,39"]);
    for (name, r, dir) in [
        ("client", &c, "server -> client"),
        ("server", &s, "client -> server"),
    ] {
        assert_eq!(
            r.stdout.lines().last(),
            Some("rdma-peer: ud ok (40 messages each way; 3 lost and sent again)"),
            "{name}:\n{}",
            r.stdout
        );
        let want = format!(
            "ud: {dir}: 40 messages received, each checked (status, length, source QPN, GRH, bytes); 3 lost, asked for again"
        );
        assert!(r.stdout.contains(&want), "{name}:\n{}", r.stdout);
    }
}

/// The server's next line that is not a repeat of the address swap.
fn next_line(oob: &mut TcpOob) -> String {
    loop {
        let l = oob.recv(LIMIT).unwrap().expect("a line from the server");
        if !l.starts_with("SYNC ") {
            return l;
        }
    }
}

/// A UD server whose client says it sent messages that never come fails
/// after its grace period with an error naming every missing index, and
/// tells the client why.
#[test]
fn ud_names_the_messages_that_never_arrived() {
    let d = TestDaemon::start(1).unwrap();
    let port = free_port();
    let tcp = format!("127.0.0.1:{port}");
    let server = Peer::spawn(
        &d,
        "server",
        &[
            "ud",
            "--socket",
            &sock(&d, 0),
            "--role",
            "server",
            "--tcp",
            &tcp,
            "-n",
            "3",
            // The grace for missing messages is at most the timeout.
            "--timeout-secs",
            "1",
            "--resend-rounds",
            "1",
        ],
    );
    let mut oob = fake_client(port);
    let t = Duration::from_secs(10);
    let gid = default_gid(1)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let info = format!("qpn=abcdef gid={gid} qkey=11111111 payload=1024 n=3 size=1024");
    sync(&mut oob, "ud", &info, t).unwrap();
    assert_eq!(next_line(&mut oob), "UD READY 0 3");
    // Claim to have sent them, sending nothing: the server asks for all
    // three again, once; claim to have sent them again, sending nothing.
    oob.send("UD SENT 0 3").unwrap();
    assert_eq!(next_line(&mut oob), "UD RESEND 0 1 2");
    oob.send("UD RESENT 3").unwrap();
    let fail = next_line(&mut oob);
    let r = server.finish();
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    let want =
        "UD client -> server: messages 0, 1, 2 of 3 never arrived (0 of the 3 sent as 0..3 did";
    assert!(r.stderr.contains("1 time asked for again"), "{}", r.stderr);
    assert!(r.stderr.contains(want), "{}", r.stderr);
    assert!(fail.starts_with("FAIL ") && fail.contains(want), "{fail}");
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

/// A write-lat server sent a malformed address (a well-formed SYNC line
/// whose fields are not) fails saying what is wrong with it, to the
/// client too, without panicking; likewise for a peer that runs another
/// test or another size.
#[test]
fn perf_server_refuses_a_bad_peer() {
    let d = TestDaemon::start(1).unwrap();
    let gid = default_gid(1)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let good = format!(
        "test=write_lat qpn=abcdef psn=1 gid={gid} mtu=3 addr=1000 rkey=1 len=40 size=64 iters=1000"
    );
    for (i, (msg, want)) in [
        (
            good.replace("qpn=abcdef", "qpn=1"),
            "malformed the peer's address message: qpn 0x1 is not the number of an ordinary QP",
        ),
        (
            good.replace("rkey=1 ", ""),
            "malformed the peer's address message: no rkey=",
        ),
        (good.replace("gid=", "gid=zz"), "is not 32 hex digits"),
        (
            good.replace("write_lat", "write_bw"),
            "the peer runs the test write_bw, we run write_lat",
        ),
        (
            good.replace("size=64", "size=65"),
            "the peer runs -s 65, we run 64",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let port = free_port();
        let server = Peer::spawn(
            &d,
            &format!("server{i}"),
            &[
                "write-lat",
                "--socket",
                &sock(&d, 0),
                "--role",
                "server",
                "--tcp",
                &format!("127.0.0.1:{port}"),
                "--timeout-secs",
                "10",
            ],
        );
        let mut oob = fake_client(port);
        sync(&mut oob, "perf", &msg, Duration::from_secs(10)).unwrap();
        // The server says why it stops, so a real client would not wait.
        let fail = next_line(&mut oob);
        assert!(fail.starts_with("FAIL ") && fail.contains(want), "{fail}");
        let r = server.finish();
        assert_eq!(r.code, Some(1), "{msg}: {}\n{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(want), "want {want:?}:\n{}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        assert!(!r.stdout.contains("connected to"), "{}", r.stdout);
    }
}

/// VM `i`'s IP address (its default GID is IPv4-mapped).
fn vm_ip(i: usize) -> String {
    Ipv6Addr::from(default_gid(i))
        .to_ipv4_mapped()
        .unwrap()
        .to_string()
}

/// `rping-server` on VM 0 and `rping-client --verify` on VM 1: the
/// connection set up by the VMs' own CMs over QP 1, 20 pings in rping's
/// protocol with their data compared, the client's disconnection; the
/// lines a script looks for.
#[test]
fn rping_between_two_processes() {
    let d = TestDaemon::start(2).unwrap();
    let (s0, s1) = (sock(&d, 0), sock(&d, 1));
    let ip = vm_ip(0);
    let server = Peer::spawn(
        &d,
        "server",
        &[
            "rping-server",
            "--socket",
            &s0,
            "--port",
            "7174",
            "--timeout-secs",
            "10",
        ],
    );
    // Until the server's QP 1 exists its REQs go nowhere: sent again soon.
    let client = Peer::spawn(
        &d,
        "client",
        &[
            "rping-client",
            "--socket",
            &s1,
            "--addr",
            &ip,
            "--port",
            "7174",
            "--count",
            "20",
            "--verify",
            "--retry-rejected-secs",
            "10",
            "--cm-response-ms",
            "200",
            "--cm-sends",
            "50",
            "--timeout-secs",
            "10",
        ],
    );
    let (c, s) = (client.finish(), server.finish());
    c.expect_ok("client", &s);
    s.expect_ok("server", &c);
    assert_eq!(
        c.stdout.lines().last(),
        Some("rdma-peer: rping-client: 20 pings verified"),
        "{}",
        c.stdout
    );
    assert_eq!(
        s.stdout.lines().last(),
        Some("rdma-peer: rping-server: 20 pings served"),
        "{}",
        s.stdout
    );
    assert!(
        s.stdout
            .contains(&format!("rping-server: connection from {}", vm_ip(1))),
        "{}",
        s.stdout
    );
    // rping's text: the counter, then 50 letters from A (ping 0) or B
    // (ping 1) on, within 64 bytes with the NUL.
    let letters = |first: u8| (0..50u8).map(|i| char::from(first + i)).collect::<String>();
    let pings: Vec<&str> = s
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("server ping data: "))
        .collect();
    assert_eq!(pings.len(), 20, "{}", s.stdout);
    assert_eq!(pings[0], format!("rdma-ping-0: {}", letters(b'A')));
    assert_eq!(pings[1], format!("rdma-ping-1: {}", letters(b'B')));
    let echoed = c
        .stdout
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(echoed, 20, "{}", c.stdout);
}

/// A client whose REQ is rejected (nothing listens on its port) or never
/// answered (nothing runs on the server's VM) exits 1 saying which.
#[test]
fn rping_client_fails_on_rej_and_on_no_answer() {
    let d = TestDaemon::start(2).unwrap();
    let (s0, s1) = (sock(&d, 0), sock(&d, 1));
    let ip = vm_ip(0);
    let client = |name: &str, port: &str, sends: &str| {
        Peer::spawn(
            &d,
            name,
            &[
                "rping-client",
                "--socket",
                &s1,
                "--addr",
                &ip,
                "--port",
                port,
                "--count",
                "1",
                "--cm-response-ms",
                "200",
                "--cm-sends",
                sends,
                "--timeout-secs",
                "10",
            ],
        )
        .finish()
    };
    // No VM behind the server's GID has a QP 1: three REQs, then no more.
    let lost = client("lost", "7175", "3");
    assert_eq!(lost.code, Some(1), "{}\n{}", lost.stdout, lost.stderr);
    assert!(
        lost.stderr
            .contains("no answer from the peer to the REQ after 3 sends"),
        "{}",
        lost.stderr
    );
    // A server on 7176; a REQ for 7177 is refused, then one for 7176 served.
    let server = Peer::spawn(
        &d,
        "server",
        &[
            "rping-server",
            "--socket",
            &s0,
            "--port",
            "7176",
            "--timeout-secs",
            "10",
        ],
    );
    let rejected = client("rejected", "7177", "50");
    assert_eq!(rejected.code, Some(1), "{}", rejected.stdout);
    assert!(
        rejected.stderr.contains("rejected by the peer: reason 8"),
        "{}",
        rejected.stderr
    );
    let served = client("served", "7176", "50");
    let s = server.finish();
    served.expect_ok("client", &s);
    s.expect_ok("server", &served);
    assert_eq!(
        s.stdout.lines().last(),
        Some("rdma-peer: rping-server: 1 pings served"),
        "{}",
        s.stdout
    );
}
