#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The `vhost-user-rdma` binary with `--config`: a bad file is refused with
//! exit code 2 and its line on stderr; a good one is served.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vhost-user-rdma");

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vur-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bad_config_exits_2_with_the_line() {
    let dir = temp_dir("bad");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[[tenant]]\nname = \"blue\"\n\n[[vm]]\nname = \"vm0\"\nsocket = \"/tmp/x.sock\"\ntenant = \"red\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "{}:7: VM \"vm0\": tenant \"red\" is not defined",
        path.display()
    );
    assert!(stderr.contains(&want), "{stderr}");

    std::fs::write(&path, "[daemon]\nctrl_pol_us = 5\n").unwrap();
    let out = Command::new(BIN).arg("-c").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:2:1: unknown field `ctrl_pol_us`",
            path.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn good_config_is_served() {
    let dir = temp_dir("good");
    let path = dir.join("good.toml");
    let file_sock = dir.join("file.sock");
    let cli_sock = dir.join("cli.sock");
    std::fs::write(
        &path,
        format!(
            "[[tenant]]\nname = \"blue\"\n[[vm]]\nname = \"a\"\nsocket = \"{}\"\ntenant = \"blue\"\n",
            file_sock.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .arg("--socket-path")
        .arg(&cli_sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(file_sock.exists() && cli_sock.exists()) && Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("daemon exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let served = file_sock.exists() && cli_sock.exists();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(served, "sockets not created");
}

/// Engine threads: the command line replaces the file's settings, and the
/// result is checked as a whole (a tenant placed on a thread the command
/// line took away, CPUs that do not match the threads).
#[test]
fn engine_settings_from_the_command_line_are_checked() {
    let dir = temp_dir("engines");
    let path = dir.join("engines.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\nengine_threads = 2\n[[tenant]]\nname = \"blue\"\nengine = 1\n[[vm]]\nname = \"a\"\nsocket = \"{}\"\ntenant = \"blue\"\n",
            dir.join("a.sock").display()
        ),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--engine-threads", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tenant \"blue\": engine = 1, but there are 1 engine threads (0..1)"),
        "{err}"
    );
    let (code, err) = run(&["--engine-cpus", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("engine_cpus lists 1 CPUs for 2 engine threads"),
        "{err}"
    );
    let (code, err) = run(&["--engine-threads", "65"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("engine_threads = 65 is out of range (1..=64)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--rnic verbs` on a host without RDMA (this machine, CI's) does not
/// start, and says why and what to do instead.
#[test]
fn verbs_without_rdma_says_why() {
    let has_rdma = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if has_rdma {
        eprintln!("this host has RDMA devices: nothing to check");
        return;
    }
    let dir = temp_dir("verbs");
    let out = Command::new(BIN)
        .args([
            "--rnic",
            "verbs",
            "--rnic-device",
            "rxe0",
            "--gid-index",
            "1",
        ])
        .arg("--socket-path")
        .arg(dir.join("vm.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--rnic verbs: this host has no RDMA"),
        "{stderr}"
    );
    assert!(stderr.contains("--rnic soft"), "{stderr}");
    assert!(
        !dir.join("vm.sock").exists(),
        "no socket without a transport"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tenant's remote GID that is not an address is refused with its line.
#[test]
fn bad_remote_gid_is_refused_with_the_line() {
    let dir = temp_dir("rgid");
    let path = dir.join("rgid.toml");
    std::fs::write(
        &path,
        "[[tenant]]\nname = \"blue\"\nremote_gids = [\"10.43.0.2\", \"nope\"]\n",
    )
    .unwrap();
    let out = Command::new(BIN).arg("-c").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tenant \"blue\": remote GID \"nope\" is not an IPv6 or IPv4 address"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}:3:", path.display())),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the daemon with `vms` sockets under a descriptor limit of `soft`
/// and `hard`; returns its soft limit once it listens (from
/// `/proc/PID/limits`) and what it logged.
fn daemon_under_limit(tag: &str, vms: usize, soft: u64, hard: u64) -> (u64, String) {
    use std::os::unix::process::CommandExt;
    let dir = temp_dir(tag);
    let socks: Vec<_> = (0..vms).map(|i| dir.join(format!("vm{i}.sock"))).collect();
    let log = dir.join("daemon.log");
    let mut cmd = Command::new(BIN);
    for s in &socks {
        cmd.arg("--socket-path").arg(s);
    }
    // SAFETY: only setrlimit, which is async-signal-safe, between fork
    // and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socks.iter().all(|s| s.exists()) {
        let exited = child.try_wait().unwrap();
        assert!(exited.is_none(), "daemon exited: {exited:?}");
        assert!(Instant::now() < deadline, "sockets not created");
        std::thread::sleep(Duration::from_millis(10));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let soft_now = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    (soft_now, logged)
}

/// The daemon raises its soft descriptor limit to the hard one (it holds a
/// few dozen descriptors per VM, and a soft limit of 1024 would refuse the
/// 30th VM), and warns when even the hard limit is short for its VMs.
#[test]
fn the_descriptor_limit_is_raised_and_a_short_one_named() {
    let (soft, logged) = daemon_under_limit("nofile-ok", 4, 256, 4096);
    assert_eq!(soft, 4096, "{logged}");
    assert!(!logged.contains("descriptor limit"), "{logged}");
    let (soft, logged) = daemon_under_limit("nofile-short", 12, 300, 600);
    assert_eq!(soft, 600);
    assert!(
        logged.contains("the descriptor limit is 600 and 12 VMs need about"),
        "{logged}"
    );
}
