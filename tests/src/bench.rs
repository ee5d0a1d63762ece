//! Helpers shared by the benchmark binaries: thread placement, a
//! description of the machine printed with every result, statistics and a
//! closed-loop latency client.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use virtio_rdma_driver::{Cq, Qp, SendOp, SendWr, Sge, WorkCompletion};

/// Pins the calling thread to `cpu` (threads it creates inherit it).
pub fn pin_current(cpu: usize) -> io::Result<()> {
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(1024);
    if cpu >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} out of range"),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (checked above), so the bit lies in `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; the pointer and size describe a
    // live cpu_set_t that the kernel only reads.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("sched_setaffinity(CPU {cpu}): {e}"),
        ));
    }
    Ok(())
}

/// Threads of this process grouped by the CPUs they may run on, read from
/// /proc (shows that the placement took effect).
pub fn thread_placement() -> String {
    let mut by_cpus: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return "(no /proc/self/task)".into();
    };
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpus = std::fs::read_to_string(p.join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| "?".into());
        *by_cpus.entry(cpus).or_default().entry(comm).or_default() += 1;
    }
    by_cpus
        .iter()
        .map(|(cpus, names)| {
            let list: Vec<String> = names
                .iter()
                .map(|(n, k)| {
                    if *k > 1 {
                        format!("{n}x{k}")
                    } else {
                        n.clone()
                    }
                })
                .collect();
            format!("CPU {cpus}: {}", list.join(", "))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Prints what every benchmark prints first: `tool`'s command line, the
/// build profile, the machine and the load average.
pub fn print_header(tool: &str) {
    let cmdline: Vec<String> = std::env::args().collect();
    println!("{tool}: {}", cmdline.join(" "));
    println!(
        "  build: {}",
        if cfg!(debug_assertions) {
            "debug (numbers are not meaningful)"
        } else {
            "release"
        }
    );
    println!("  machine: {}", machine());
    println!("  load average at start: {}", loadavg());
}

/// The machine: CPU count, model and kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "?".into());
    // SAFETY: sysconf has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "nproc {online}, model name \"{model}\", kernel {}",
        kernel.trim()
    )
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The calling thread's time on a CPU and waiting for one, in ns, from
/// `/proc/thread-self/schedstat` (zeros where unreadable): the difference
/// over a measurement tells how much of it a client actually ran.
pub fn thread_cpu_times() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}

/// The median of `v` (0 for none).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// The `q` quantile (0..=1) of the sorted samples `sorted` (0 for none).
pub fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// "PASS" or "MISS".
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// What a closed-loop latency client measured.
#[derive(Debug, Clone, Copy)]
pub struct LatResult {
    /// Median post-to-completion time, µs.
    pub p50: f64,
    /// 90th percentile, µs.
    pub p90: f64,
    /// 99th percentile, µs.
    pub p99: f64,
    /// 99.9th percentile, µs.
    pub p999: f64,
    /// Largest, µs.
    pub max: f64,
    /// Work requests per second: the median over [`LAT_WINDOW`] windows.
    pub ops: f64,
}

/// The latency client's throughput is the median of its rates over
/// windows of this length.
pub const LAT_WINDOW: Duration = Duration::from_millis(100);

/// A completion that takes longer than this is an error (no hang).
const LAT_WAIT: Duration = Duration::from_secs(20);

/// Posts signaled work request `i` (`op` over `sge`) on `qp`, spins on
/// `cq` for its completion and returns the µs since `t0`.
pub fn one_request(
    cq: &Cq,
    qp: &Qp,
    sge: &[Sge; 1],
    op: SendOp,
    i: u64,
    t0: Instant,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let mut wc = [WorkCompletion::default(); 1];
    qp.post_send(&[SendWr::signaled(i, op, sge)])?;
    let deadline = t0 + LAT_WAIT;
    loop {
        if cq.poll(&mut wc) == 1 {
            if !wc[0].is_success() {
                return Err(format!("latency request failed: {:?}", wc[0]).into());
            }
            return Ok(t0.elapsed().as_secs_f64() * 1e6);
        }
        if Instant::now() > deadline {
            return Err("latency request: no completion within 20 s".into());
        }
    }
}

/// A closed-loop latency client: for `secs`, posts the signaled work
/// request `op` over `sge` on `qp`, one at a time, and spins on `cq` for its
/// completion. Returns p50/p99 (µs) and ops/s.
pub fn lat_client(
    cq: &Cq,
    qp: &Qp,
    sge: Sge,
    op: SendOp,
    secs: f64,
) -> Result<LatResult, Box<dyn std::error::Error + Send + Sync>> {
    let sge = [sge];
    let mut samples = Vec::with_capacity(200_000);
    let mut windows: Vec<f64> = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let t_start = Instant::now();
    let mut i = 0u64;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        samples.push(one_request(cq, qp, &sge, op, i, t0)?);
        let w = (t0.duration_since(t_start).as_nanos() / LAT_WINDOW.as_nanos()) as usize;
        if windows.len() <= w {
            windows.resize(w + 1, 0.0);
        }
        windows[w] += 1.0;
        i += 1;
    }
    // The median window: a few milliseconds in which another process
    // (not the engine) takes the client's CPU do not decide the rate.
    windows.pop();
    let ops = median(&windows) / LAT_WINDOW.as_secs_f64();
    Ok(summarize(samples, ops))
}

/// A latency client paced at one request per `interval` (an open loop
/// with one request at a time): for `secs`, sleeps until the next request
/// is due, posts the signaled work request `op` over `sge` on `qp` and
/// spins on `cq` for its completion. A request that completes after the
/// next one was due delays it (the schedule slips, so a slow device shows
/// in the rate too). Between requests the client's VM is idle, as a guest
/// that sends now and then is; that is what this client measures.
/// Returns p50/p90/p99 (µs) of the post-to-completion time and the
/// completed requests per second over the whole window.
pub fn lat_client_paced(
    cq: &Cq,
    qp: &Qp,
    sge: Sge,
    op: SendOp,
    secs: f64,
    interval: Duration,
) -> Result<LatResult, Box<dyn std::error::Error + Send + Sync>> {
    let sge = [sge];
    let mut samples = Vec::new();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut due = start;
    let mut i = 0u64;
    loop {
        let now = Instant::now();
        if due > now {
            // Sleep most of the gap, spin the last 100 µs: the request goes
            // out on time whatever the timer slack.
            let gap = due - now;
            if gap > Duration::from_micros(100) {
                std::thread::sleep(gap - Duration::from_micros(100));
            }
            while Instant::now() < due {
                std::hint::spin_loop();
            }
        }
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        samples.push(one_request(cq, qp, &sge, op, i, t0)?);
        i += 1;
        due += interval;
    }
    let ops = samples.len() as f64 / start.elapsed().as_secs_f64();
    Ok(summarize(samples, ops))
}

/// The percentiles of `samples` (µs, any order) with the rate `ops`.
fn summarize(mut samples: Vec<f64>, ops: f64) -> LatResult {
    samples.sort_by(f64::total_cmp);
    LatResult {
        p50: pct(&samples, 0.5),
        p90: pct(&samples, 0.9),
        p99: pct(&samples, 0.99),
        p999: pct(&samples, 0.999),
        max: samples.last().copied().unwrap_or(0.0),
        ops,
    }
}

/// Runs benchmark binary `exe` with `args` for a smoke test and returns
/// its standard output; panics, with both outputs, if it fails, and if
/// any of `expected` is missing from its output.
#[allow(clippy::panic)] // A test fixture: the panic is the test failing.
pub fn smoke_run(exe: &str, args: &[&str], expected: &[&str]) -> String {
    let out = match std::process::Command::new(exe).args(args).output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run {exe}: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{exe} {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for e in expected {
        assert!(stdout.contains(e), "missing {e:?} in:\n{stdout}");
    }
    stdout
}
