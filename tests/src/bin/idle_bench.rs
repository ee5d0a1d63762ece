//! What idle VMs cost the daemon, and what a VM waking from idle waits
//! (issue 32, target 4).
//!
//! Starts the daemon (the release binary, a process of its own) with one
//! socket per VM, connects `--vms` test VMMs with the reference driver,
//! and gives each VM pair (0-1, 2-3, ...) `--qps` connected RC QPs, which
//! then stay idle. It reports:
//!
//! 1. the daemon's CPU while every VM is connected and idle, over
//!    `--idle-secs` (the run time of all its threads, from
//!    `/proc/PID/task/*/schedstat`), as a share of one core, with the
//!    engine thread's part;
//! 2. the post-to-completion time of a 64-byte RDMA WRITE of VM 0 to VM 1:
//!    warm (back to back, the engine polling) and after `--pause-ms` idle
//!    (the engine asleep, the VM parked: the WRITE's notification wakes
//!    it), with the baseline of the same run: how long this machine takes
//!    to wake a thread asleep in `ppoll` on an eventfd, as the engine
//!    sleeps.
//!
//! The client runs on CPU 0 and the daemon on CPU 1 (`--no-pin`: wherever
//! the scheduler puts them). Nothing here asserts a timing.
//!
//! Run: `cargo run --release -p vhost-user-rdma-tests --bin idle_bench --
//! [--vms 1000]` after `cargo build --release -p vhost-user-rdma`.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use vhost_user_rdma_tests::bench::{loadavg, median, one_request, pct, pin_current, print_header};
use vhost_user_rdma_tests::dp::{rc_pair, write_op, Buf, Pair, Vm};
use vhost_user_rdma_tests::guest_mem::MemLayout;
use vhost_user_rdma_tests::vmm::VmmOptions;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
#[command(about = "the daemon's cost of idle VMs, and a WRITE after idle (docs/benchmarks.md)")]
struct Args {
    /// Connected VMs (an even number: they are paired).
    #[arg(long, default_value_t = 1000)]
    vms: usize,
    /// Connected RC QPs per VM pair.
    #[arg(long, default_value_t = 1)]
    qps: usize,
    /// How long the idle daemon's CPU is measured, seconds.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// How long the VMs idle before that, seconds: the engine's re-checks
    /// rebuild the lists the set-up left stale a few at a time.
    #[arg(long, default_value_t = 10)]
    settle_secs: u64,
    /// WRITEs after idle (each after `--pause-ms`).
    #[arg(long, default_value_t = 30)]
    wakes: usize,
    /// Idle time before each of them, ms.
    #[arg(long, default_value_t = 200)]
    pause_ms: u64,
    /// The daemon binary.
    #[arg(long, default_value = "target/release/vhost-user-rdma")]
    daemon: PathBuf,
    /// Do not pin the client to CPU 0 and the daemon to CPU 1.
    #[arg(long)]
    no_pin: bool,
}

/// The daemon process, killed when dropped.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("the daemon's log, last lines:");
            for l in tail.iter().rev() {
                eprintln!("  {l}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    fn start(args: &Args) -> Res<Daemon> {
        let dir = std::env::temp_dir().join(format!("idle-bench-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let mut cmd = Command::new(&args.daemon);
        for i in 0..args.vms {
            cmd.arg("--socket-path")
                .arg(dir.join(format!("vm{i}.sock")));
        }
        if !args.no_pin {
            cmd.args(["--engine-cpus", "1"]);
        }
        let log = fs::File::create(dir.join("daemon.log"))?;
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", args.daemon.display()))?;
        let d = Daemon { child, dir };
        if !args.no_pin {
            // Every thread of it, as the engine's.
            let _ = Command::new("taskset")
                .args(["-a", "-p", "-c", "1", &d.child.id().to_string()])
                .stdout(Stdio::null())
                .status();
        }
        Ok(d)
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("vm{i}.sock"))
    }

    /// Waits until every socket exists (the daemon listens).
    fn wait_ready(&mut self, n: usize) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(0..n).all(|i| self.socket(i).exists()) {
            if let Some(st) = self.child.try_wait()? {
                return Err(format!("the daemon exited: {st}").into());
            }
            if Instant::now() > deadline {
                return Err("the daemon's sockets did not appear in 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Run time of every thread of the daemon (ns), and of its engine
    /// threads, with the times these ran (schedstat's third field: a
    /// sleeping thread's wake-ups).
    fn cpu_ns(&self) -> Res<(u64, u64, u64)> {
        let (mut all, mut engine, mut runs) = (0u64, 0u64, 0u64);
        let tasks = Path::new("/proc")
            .join(self.child.id().to_string())
            .join("task");
        for t in fs::read_dir(tasks)? {
            let t = t?.path();
            // A thread that ended meanwhile is not counted.
            let Ok(stat) = fs::read_to_string(t.join("schedstat")) else {
                continue;
            };
            let field = |i: usize| -> u64 {
                stat.split_whitespace()
                    .nth(i)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            all += field(0);
            let comm = fs::read_to_string(t.join("comm")).unwrap_or_default();
            if comm.starts_with("rnic-engine") {
                engine += field(0);
                runs += field(2);
            }
        }
        Ok((all, engine, runs))
    }

    /// Entries in the daemon's `/proc/PID/<what>` (`fd`, `task`).
    fn count(&self, what: &str) -> usize {
        let dir = Path::new("/proc")
            .join(self.child.id().to_string())
            .join(what);
        fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
    }
}

/// Descriptors one VM takes in the daemon (34 measured) and in this
/// process, with a margin.
const FDS_PER_VM: u64 = 40;

/// Raises this process's descriptor limit (the daemon, started after,
/// inherits it): a VM takes a few dozen descriptors in the daemon. Up to
/// 2^20 where allowed (root), else to the hard limit. Returns the limit.
fn raise_nofile() -> u64 {
    let want = libc::rlimit {
        rlim_cur: 1 << 20,
        rlim_max: 1 << 20,
    };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both are valid rlimits for the calls.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0
            && libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0
        {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

/// One signaled 64-byte WRITE of `p.qa`, spinning on its CQ: µs.
fn write_once(p: &Pair, src: &Buf, dst: &Buf, id: u64) -> Res<f64> {
    one_request(
        &p.cqa,
        &p.qa,
        &[src.sge(0, 64)],
        write_op(dst, 0),
        id,
        Instant::now(),
    )
}

/// The baseline: a thread asleep in `ppoll` on an eventfd (as the parked
/// engine sleeps) on CPU 1, woken by a write from CPU 0; µs from the write
/// to the sleeper running, `n` times after `pause` each.
fn thread_wakeups(n: usize, pause: Duration, pin: bool) -> Res<Vec<f64>> {
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK)?);
    let stamp = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let sleeper = {
        let (efd, stamp, stop) = (efd.clone(), stamp.clone(), stop.clone());
        std::thread::spawn(move || {
            if pin {
                let _ = pin_current(1);
            }
            while !stop.load(Ordering::Acquire) {
                let mut p = libc::pollfd {
                    fd: efd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a null timeout waits.
                unsafe { libc::ppoll(&mut p, 1, std::ptr::null(), std::ptr::null()) };
                let now = Instant::now();
                let _ = efd.read();
                if let Some(t) = stamp.lock().ok().and_then(|mut s| s.take()) {
                    let _ = tx.send(now.duration_since(t).as_secs_f64() * 1e6);
                }
            }
        })
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(pause);
        if let Ok(mut s) = stamp.lock() {
            *s = Some(Instant::now());
        }
        efd.write(1)?;
        out.push(rx.recv_timeout(Duration::from_secs(5))?);
    }
    stop.store(true, Ordering::Release);
    efd.write(1)?;
    let _ = sleeper.join();
    Ok(out)
}

fn summary(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    // A wait of a scheduler tick or more (4 ms at HZ=250) is counted on
    // its own: a missed notification shows there, not in the median.
    let slow = v.iter().filter(|&&us| us >= 5_000.0).count();
    format!(
        "p50 {:.1} µs, p90 {:.1} µs, max {:.1} µs ({} samples, {slow} of them ≥ 5 ms)",
        median(v),
        pct(v, 0.90),
        v.last().copied().unwrap_or(0.0),
        v.len()
    )
}

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.vms < 2 || args.vms % 2 != 0 {
        return Err("--vms: an even number of at least 2".into());
    }
    print_header("idle_bench");
    let limit = raise_nofile();
    let asked = args.vms;
    let fit = usize::try_from(limit.saturating_sub(256) / FDS_PER_VM).unwrap_or(usize::MAX) & !1;
    if fit < args.vms {
        args.vms = fit.max(2);
        println!(
            "   the descriptor limit is {limit} (hard): {} VMs instead of {asked}, the idle cost \
             scaled to {asked} below (it grows with the VMs: the engine's re-check reads each)",
            args.vms
        );
    }
    println!(
        "   {} VMs in {} pairs, {} connected RC QP(s) per pair; load before: {}",
        args.vms,
        args.vms / 2,
        args.qps,
        loadavg()
    );
    let pin = !args.no_pin;
    let mut daemon = Daemon::start(&args)?;
    if pin {
        pin_current(0)?;
    }
    daemon.wait_ready(args.vms)?;

    // Small guest RAM: the driver's rings and buffers fit in a few MiB.
    let opts = || VmmOptions {
        mem: MemLayout::two_regions(8 << 20, 8 << 20),
        ..VmmOptions::default()
    };
    let t = Instant::now();
    let mut vms = Vec::with_capacity(args.vms);
    for i in 0..args.vms {
        vms.push(Vm::open_path(&daemon.socket(i), opts()));
    }
    let connected = t.elapsed();
    let mut pairs = Vec::new();
    for k in (0..args.vms).step_by(2) {
        for _ in 0..args.qps {
            pairs.push(rc_pair(&vms[k], &vms[k + 1]));
        }
    }
    println!(
        "   connected and opened in {:.1} s, {} QPs created and connected in {:.1} s; the daemon has {} threads and {} descriptors",
        connected.as_secs_f64(),
        2 * pairs.len(),
        (t.elapsed() - connected).as_secs_f64(),
        daemon.count("task"),
        daemon.count("fd")
    );

    // 1. Idle: the engine parks all VMs and sleeps; measured once the
    // lists are settled.
    std::thread::sleep(Duration::from_secs(args.settle_secs));
    let (a0, e0, r0) = daemon.cpu_ns()?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let (a1, e1, r1) = daemon.cpu_ns()?;
    let wall = t0.elapsed().as_secs_f64() * 1e9;
    let share = |ns: u64| ns as f64 / wall * 100.0;
    println!(
        "idle: the daemon used {:.3} % of a core over {:.1} s ({:.3} % its engine thread), {:.2} µs of CPU per VM per second",
        share(a1 - a0),
        wall / 1e9,
        share(e1 - e0),
        (a1 - a0) as f64 / 1e3 / (wall / 1e9) / args.vms as f64
    );
    let runs = r1.saturating_sub(r0).max(1);
    println!(
        "idle: the engine ran {:.1} times per second, {:.1} µs each",
        runs as f64 / (wall / 1e9),
        (e1 - e0) as f64 / 1e3 / runs as f64
    );
    if asked != args.vms {
        println!(
            "idle, scaled to {asked} VMs: {:.3} % of a core",
            share(a1 - a0) * asked as f64 / args.vms as f64
        );
    }

    // 2. A WRITE warm, and after idle.
    let p = &pairs[0];
    let (src, dst) = (Buf::new(&vms[0], 4096), Buf::new(&vms[1], 4096));
    let mut id = 0u64;
    let mut warm = Vec::new();
    for _ in 0..2000 {
        id += 1;
        warm.push(write_once(p, &src, &dst, id)?);
    }
    let mut cold = Vec::new();
    for _ in 0..args.wakes {
        std::thread::sleep(Duration::from_millis(args.pause_ms));
        id += 1;
        cold.push(write_once(p, &src, &dst, id)?);
    }
    let mut wake = thread_wakeups(args.wakes, Duration::from_millis(args.pause_ms), pin)?;
    let (w50, c50, k50) = (median(&warm), median(&cold), median(&wake));
    println!(
        "warm 64 B WRITE, post to completion: {}",
        summary(&mut warm)
    );
    println!("after {} ms idle: {}", args.pause_ms, summary(&mut cold));
    println!(
        "baseline, a thread woken from ppoll on an eventfd: {}",
        summary(&mut wake)
    );
    println!(
        "after idle / (2 x warm + wake-up), medians: {:.2} ({:.1} / (2 x {:.1} + {:.1}) µs)",
        c50 / (2.0 * w50 + k50),
        c50,
        w50,
        k50
    );
    println!("   load after: {}", loadavg());
    drop(pairs);
    drop(vms);
    Ok(())
}
