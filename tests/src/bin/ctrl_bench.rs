//! Control-path benchmarks of vhost-user-rdma, measured in one run:
//!
//! 1. the round trip of a control verb (ALLOC_PD / DEALLOC_PD alternating,
//!    QUERY_PORT) through the real daemon against the same request through
//!    the raw vhost-user echo backend, with identical thread placement;
//! 2. the rate of QP setup (CREATE_QP + INIT/RTR/RTS), sequential and
//!    pipelined, and of QP destruction;
//! 3. REG_MR of 1 GiB in shuffled 4 KiB pages (INDIRECT page list) and in
//!    2 MiB pages (INLINE), against in-process translation baselines;
//! 4. 100,000 connected QPs and 100,000 MRs on one VM, and the host memory
//!    each takes (measured, and as the daemon accounts it).
//!
//! Each benchmark runs with two thread placements: "same CPU" (every thread
//! of the process on one CPU) and "split" (daemon or echo threads on a
//! second CPU, the client on the first). Nothing here asserts a timing.
//!
//! Run: `cargo run --release -p vhost-user-rdma-tests --bin ctrl_bench -- [--iters N] [--quick]`.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::bench::{loadavg, pin_current, print_header, thread_placement};
use vhost_user_rdma_tests::ctrl::CtrlQueue;
use vhost_user_rdma_tests::echo::{self, EchoHandle};
use vhost_user_rdma_tests::guest_mem::{GuestMem, MemLayout, GIB, MIB, PAGE_SIZE};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{rc_transitions, MrSpec, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::mem::{access, PageListMode, LIST_PAGE_ENTRIES, LIST_PAGE_SIZE};
use virtio_rdma_abi::qp::QpAttr;
use virtio_rdma_abi::verbs::{
    CreateQpReq, CreateQpResp, CtxHandleReq, ModifyQpReq, MrHandleReq, PdHandleReq, PdHandleResp,
    PortAttr, QpHandleReq, QueryPortReq, RegMrReq, RegMrResp,
};
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

#[derive(Parser, Debug)]
#[command(about = "Control-path benchmarks of vhost-user-rdma (see docs/benchmarks.md)")]
struct Args {
    /// Timed round trips per command and backend in the latency benchmark
    /// (default 20000; 300 with --quick).
    #[arg(long)]
    iters: Option<usize>,
    /// QPs per QP-rate run (default 10000; 200 with --quick).
    #[arg(long)]
    qps: Option<usize>,
    /// Repetitions of every QP-rate run; the median is reported (default
    /// 3; 1 with --quick).
    #[arg(long)]
    qp_reps: Option<usize>,
    /// REG_MR repetitions per configuration (default 20; 3 with --quick).
    #[arg(long)]
    mr_iters: Option<usize>,
    /// Bytes registered per MR, in MiB (default 1024; 64 with --quick).
    #[arg(long)]
    mr_mib: Option<u64>,
    /// QPs per batch in the pipelined QP runs (that many CREATE_QPs in
    /// flight, then 3x that many MODIFY_QPs).
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// A tiny version of every benchmark (smoke test).
    #[arg(long)]
    quick: bool,
    /// Objects the `objects` benchmark creates of each kind (default
    /// 100000; 2000 with --quick).
    #[arg(long)]
    objects: Option<usize>,
    /// Benchmarks to run, comma separated: latency, qp, mr, objects
    /// (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Placements to run, comma separated: same, split (default: both).
    #[arg(long, value_delimiter = ',')]
    placement: Vec<String>,
    /// The daemon's control-queue polling window in microseconds (default:
    /// the daemon's default; 0 turns adaptive polling off, so the daemon
    /// sleeps between requests exactly like the echo backend).
    #[arg(long)]
    ctrl_poll_us: Option<u64>,
    /// QP benchmark under load: two more VMs of the daemon stream 64-byte
    /// RDMA WRITEs through its engine for the whole run, and only the
    /// daemon's pipelined setup is measured (the engine then sees every
    /// new QP while it polls).
    #[arg(long)]
    traffic: bool,
}

/// The daemon polling window chosen on the command line.
static CTRL_POLL: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();

/// Starts the daemon under test with the chosen polling window.
fn start_daemon(limits: Limits, vms: usize) -> vhost_user_rdma_tests::Result<TestDaemon> {
    let poll = CTRL_POLL.get().copied().flatten();
    TestDaemon::with_config(vms, |c| {
        c.set_limits(limits);
        if let Some(p) = poll {
            c.ctrl_poll = p;
        }
        // The control path's own speed: no rate limit.
        c.qos_classes.push(vhost_user_rdma::qos::QosClass {
            name: "unlimited".into(),
            spec: vhost_user_rdma::qos::QosSpec::unlimited(),
        });
        for vm in &mut c.vms {
            vm.qos_class = Some("unlimited".into());
        }
    })
}

/// Effective parameters.
#[derive(Debug, Clone)]
struct Config {
    iters: usize,
    warmup: usize,
    block: usize,
    qps: usize,
    qp_reps: usize,
    batch: usize,
    mr_iters: usize,
    mr_bytes: u64,
    latency: bool,
    qp: bool,
    mr: bool,
    traffic: bool,
    objects: Option<usize>,
}

impl Config {
    fn from_args(a: &Args) -> Res<Self> {
        let _ = CTRL_POLL.set(a.ctrl_poll_us.map(std::time::Duration::from_micros));
        let iters = a.iters.unwrap_or(if a.quick { 300 } else { 20_000 }).max(1);
        let mr_mib = a.mr_mib.unwrap_or(if a.quick { 64 } else { 1024 });
        if mr_mib == 0 || mr_mib % 2 != 0 {
            return Err("--mr-mib must be a positive multiple of 2".into());
        }
        let want = |name: &str| a.only.is_empty() || a.only.iter().any(|o| o == name);
        for o in &a.only {
            if !["latency", "qp", "mr", "objects"].contains(&o.as_str()) {
                return Err(format!("unknown benchmark {o:?} (latency, qp, mr, objects)").into());
            }
        }
        if a.batch == 0 || a.batch > 160 {
            return Err("--batch must be 1..=160 (3 modifies of 2 descriptors each per QP must fit a 1024-entry queue)".into());
        }
        Ok(Config {
            iters,
            warmup: (iters / 10).clamp(20, 2000),
            block: 250,
            qps: a.qps.unwrap_or(if a.quick { 200 } else { 10_000 }).max(1),
            qp_reps: a.qp_reps.unwrap_or(if a.quick { 1 } else { 3 }).max(1),
            batch: a.batch,
            mr_iters: a.mr_iters.unwrap_or(if a.quick { 3 } else { 20 }).max(1),
            mr_bytes: mr_mib * MIB,
            latency: want("latency"),
            qp: want("qp"),
            mr: want("mr"),
            traffic: a.traffic,
            objects: want("objects").then(|| {
                a.objects
                    .unwrap_or(if a.quick { 2000 } else { 100_000 })
                    .max(1)
            }),
        })
    }
}

// ---------------------------------------------------------------------------
// CPU placement

/// CPUs this process may run on.
fn allowed_cpus() -> Res<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the pointer and size describe
    // `set`, which the kernel fills in.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(format!("sched_getaffinity: {}", std::io::Error::last_os_error()).into());
    }
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(1024);
    // SAFETY: every index is below CPU_SETSIZE, inside `set`.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Every thread on one CPU.
    Same { cpu: usize },
    /// Backend threads on `backend`, the client on `client`.
    Split { client: usize, backend: usize },
}

impl Placement {
    fn key(self) -> &'static str {
        match self {
            Placement::Same { .. } => "same",
            Placement::Split { .. } => "split",
        }
    }

    fn describe(self) -> String {
        match self {
            Placement::Same { cpu } => format!("same CPU: every thread on CPU {cpu}"),
            Placement::Split { client, backend } => {
                format!("split: daemon/echo threads on CPU {backend}, client on CPU {client}")
            }
        }
    }

    /// Runs `start` so that every thread it creates gets this placement's
    /// backend CPU, then leaves the calling thread on the client CPU.
    fn launch<T: Send>(self, start: impl FnOnce() -> Res<T> + Send) -> Res<T> {
        match self {
            Placement::Same { cpu } => {
                pin_current(cpu)?;
                start()
            }
            Placement::Split { client, backend } => {
                let out = std::thread::scope(|s| {
                    let h = std::thread::Builder::new()
                        .name("bench-launcher".into())
                        .spawn_scoped(s, move || -> Res<T> {
                            pin_current(backend)?;
                            start()
                        })?;
                    h.join()
                        .map_err(|_| BoxError::from("launcher thread panicked"))?
                })?;
                pin_current(client)?;
                Ok(out)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Statistics

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    n: usize,
    min: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

impl Stats {
    /// Statistics of `samples` in nanoseconds.
    fn of(samples: &[u64]) -> Self {
        if samples.is_empty() {
            return Stats::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let n = s.len();
        let pct = |q: f64| {
            let rank = (q * n as f64).ceil() as usize;
            s[rank.clamp(1, n) - 1] as f64
        };
        Stats {
            n,
            min: s[0] as f64,
            p50: pct(0.5),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Key/value lines printed at the end, for aggregating several runs.
#[derive(Default)]
struct Summary(Vec<(String, f64)>);

impl Summary {
    fn add(&mut self, key: impl Into<String>, v: f64) {
        self.0.push((key.into(), v));
    }
}

// ---------------------------------------------------------------------------
// Benchmark 1: control-verb round trip vs raw vhost-user echo

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    AllocPd,
    DeallocPd,
    QueryPort,
}

impl Cmd {
    fn name(self) -> &'static str {
        match self {
            Cmd::AllocPd => "ALLOC_PD",
            Cmd::DeallocPd => "DEALLOC_PD",
            Cmd::QueryPort => "QUERY_PORT",
        }
    }
}

/// One side of the comparison: a VM on the daemon or on the echo backend.
struct Side {
    vm: TestVmm,
    ctx: u32,
    /// The PD the last ALLOC_PD returned (daemon only).
    pd: u32,
    echo: bool,
}

impl Side {
    /// One sequential round trip of `cmd`: submit (with kick), wait for the
    /// used buffer (sleeping on the call eventfd). Returns nanoseconds.
    fn round_trip(&mut self, cmd: Cmd) -> Res<u64> {
        let (op, payload, resp) = match cmd {
            Cmd::AllocPd => (
                Opcode::ALLOC_PD,
                CtxHandleReq {
                    ctx_handle: self.ctx,
                }
                .to_bytes(),
                PdHandleResp::SIZE,
            ),
            Cmd::DeallocPd => (
                Opcode::DEALLOC_PD,
                PdHandleReq { pd_handle: self.pd }.to_bytes(),
                0,
            ),
            Cmd::QueryPort => (
                Opcode::QUERY_PORT,
                QueryPortReq { port: 1 }.to_bytes(),
                PortAttr::SIZE,
            ),
        };
        let ctrl = self.vm.ctrl();
        let t0 = Instant::now();
        let token = ctrl.submit(op, &payload, resp)?;
        let c = ctrl.wait(token)?;
        let dt = ns(t0.elapsed());
        let c = c.ok()?;
        if !self.echo && cmd == Cmd::AllocPd {
            self.pd = c.parse::<PdHandleResp>()?.pd_handle;
        }
        Ok(dt)
    }

    /// `n` iterations of `cmds` in order; samples appended per command.
    fn run(&mut self, cmds: &[Cmd], n: usize, out: &mut [Vec<u64>]) -> Res<()> {
        for _ in 0..n {
            for (i, &c) in cmds.iter().enumerate() {
                let t = self.round_trip(c)?;
                if let Some(v) = out.get_mut(i) {
                    v.push(t);
                }
            }
        }
        Ok(())
    }
}

struct LatencyRow {
    cmd: Cmd,
    echo: Stats,
    verb: Stats,
}

fn echo_socket() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "ctrl-bench-echo-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn latency_bench(cfg: &Config, p: Placement, sum: &mut Summary) -> Res<Vec<LatencyRow>> {
    let path = echo_socket();
    let (daemon, echo): (TestDaemon, EchoHandle) = p.launch(|| {
        let d = start_daemon(Limits::default(), 1)?;
        let e = echo::spawn(&path)?;
        Ok((d, e))
    })?;
    let opts = VmmOptions::default();
    let mut verb_vm = daemon.connect_with(0, opts.clone())?;
    let ctx = Verbs::new(&mut verb_vm).create_ctx()?;
    let echo_vm = TestVmm::connect(echo.socket_path(), opts)?;
    let mut sides = [
        Side {
            vm: echo_vm,
            ctx: 1,
            pd: 1,
            echo: true,
        },
        Side {
            vm: verb_vm,
            ctx,
            pd: 0,
            echo: false,
        },
    ];
    println!("  threads: {}", thread_placement());

    let mut rows = Vec::new();
    for cmds in [&[Cmd::AllocPd, Cmd::DeallocPd][..], &[Cmd::QueryPort][..]] {
        // samples[side][cmd]
        let mut samples: Vec<Vec<Vec<u64>>> = (0..2)
            .map(|_| {
                (0..cmds.len())
                    .map(|_| Vec::with_capacity(cfg.iters))
                    .collect()
            })
            .collect();
        let mut scratch: Vec<Vec<u64>> = Vec::new();
        for s in sides.iter_mut() {
            s.run(cmds, cfg.warmup, &mut scratch)?;
        }
        // Interleave blocks of the two backends, alternating which goes
        // first, so slow drifts of the machine hit both alike.
        let mut done = 0;
        let mut round = 0usize;
        while done < cfg.iters {
            let n = cfg.block.min(cfg.iters - done);
            for k in 0..2 {
                let i = (k + round) % 2;
                let (Some(side), Some(out)) = (sides.get_mut(i), samples.get_mut(i)) else {
                    continue;
                };
                side.run(cmds, n, out)?;
            }
            done += n;
            round += 1;
        }
        for (j, &cmd) in cmds.iter().enumerate() {
            let echo = Stats::of(&samples[0][j]);
            let verb = Stats::of(&samples[1][j]);
            let key = format!("latency.{}.{}", p.key(), cmd.name());
            for (who, st) in [("echo", &echo), ("verb", &verb)] {
                sum.add(format!("{key}.{who}_p50_us"), st.p50 / 1e3);
                sum.add(format!("{key}.{who}_p99_us"), st.p99 / 1e3);
                sum.add(format!("{key}.{who}_p999_us"), st.p999 / 1e3);
            }
            sum.add(format!("{key}.ratio_p50"), verb.p50 / echo.p50);
            sum.add(format!("{key}.ratio_p99"), verb.p99 / echo.p99);
            rows.push(LatencyRow { cmd, echo, verb });
        }
    }
    // Leave the daemon's PD table as it was.
    if let Some(s) = sides.get_mut(1) {
        if s.vm.ctrl().in_flight() == 0 {
            Verbs::new(&mut s.vm).destroy_ctx(s.ctx)?;
        }
    }
    drop(sides);
    drop(echo);
    drop(daemon);
    Ok(rows)
}

fn print_latency(cfg: &Config, p: Placement, rows: &[LatencyRow]) {
    println!(
        "  {} timed round trips per command and backend (after {} warm-up), blocks of {} alternating echo/daemon",
        cfg.iters, cfg.warmup, cfg.block
    );
    println!(
        "  {:<11} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>7} {:>7}",
        "command", "echo p50", "p99", "p99.9", "verb p50", "p99", "p99.9", "x p50", "x p99"
    );
    for r in rows {
        println!(
            "  {:<11} | {:>8.2} {:>8.2} {:>8.2} | {:>8.2} {:>8.2} {:>8.2} | {:>6.2}x {:>6.2}x",
            r.cmd.name(),
            r.echo.p50 / 1e3,
            r.echo.p99 / 1e3,
            r.echo.p999 / 1e3,
            r.verb.p50 / 1e3,
            r.verb.p99 / 1e3,
            r.verb.p999 / 1e3,
            r.verb.p50 / r.echo.p50,
            r.verb.p99 / r.echo.p99,
        );
    }
    println!(
        "  (microseconds; x = daemon / echo; target: x p50 <= 1.5) [{}]",
        p.key()
    );
}

// ---------------------------------------------------------------------------
// Benchmark 2: QP setup rate

struct QpRun {
    mode: &'static str,
    /// The same requests sent to the echo backend (the transport bound).
    echo: bool,
    setup: Duration,
    create: Duration,
    destroy: Duration,
    /// The other VMs' WRITEs per second during the setup (`--traffic`).
    traffic: Option<f64>,
}

/// Two VMs of the daemon streaming 64-byte RDMA WRITEs (16 signaled ones
/// at a time) until dropped.
struct Traffic {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    wqes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(d: &TestDaemon, a: usize, b: usize) -> Traffic {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use vhost_user_rdma_tests::dp;
        let (va, vb) = (dp::open(d, a), dp::open(d, b));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let wqes = std::sync::Arc::new(AtomicU64::new(0));
        let (stop2, wqes2) = (stop.clone(), wqes.clone());
        let thread = std::thread::spawn(move || {
            let p = dp::rc_pair(&va, &vb);
            let (src, dst) = (dp::Buf::new(&va, 4096), dp::Buf::new(&vb, 4096));
            let mut i = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                dp::post_writes(&p, &src, &dst, 64, i, 16);
                dp::poll_n(&p.cqa, 16);
                i += 16;
                wqes2.fetch_add(16, Ordering::Relaxed);
            }
        });
        Traffic {
            stop,
            wqes,
            thread: Some(thread),
        }
    }

    fn wqes(&self) -> u64 {
        self.wqes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn modify_bytes(qp_handle: u32, tr: &[(u32, QpAttr); 3]) -> [Vec<u8>; 3] {
    tr.map(|(attr_mask, attr)| {
        ModifyQpReq {
            qp_handle,
            attr_mask,
            attr,
        }
        .to_bytes()
    })
}

/// Waits for a CREATE_QP; returns its handle (0 from the echo backend,
/// which answers with a bare header).
fn create_ok(ctrl: &mut CtrlQueue, token: u64, echo: bool) -> Res<u32> {
    let c = ctrl.wait(token)?.ok()?;
    if echo {
        return Ok(0);
    }
    Ok(c.parse::<CreateQpResp>()?.qp_handle)
}

fn qp_sequential(
    ctrl: &mut CtrlQueue,
    reqs: &[(Vec<u8>, Vec<u8>)],
    tr: &[(u32, QpAttr); 3],
    echo: bool,
) -> Res<QpRun> {
    ctrl.set_auto_kick(true);
    let mut handles = Vec::with_capacity(reqs.len());
    let mut create = Duration::ZERO;
    let t0 = Instant::now();
    for (fixed, tail) in reqs {
        let tc = Instant::now();
        let token = ctrl.submit_parts(Opcode::CREATE_QP, &[fixed, tail], CreateQpResp::SIZE)?;
        let h = create_ok(ctrl, token, echo)?;
        create += tc.elapsed();
        for m in modify_bytes(h, tr) {
            ctrl.call(Opcode::MODIFY_QP, &m, 0)?.ok()?;
        }
        handles.push(h);
    }
    let setup = t0.elapsed();
    let t0 = Instant::now();
    for &h in &handles {
        ctrl.call(
            Opcode::DESTROY_QP,
            &QpHandleReq { qp_handle: h }.to_bytes(),
            0,
        )?
        .ok()?;
    }
    let destroy = t0.elapsed();
    Ok(QpRun {
        mode: "sequential",
        echo,
        setup,
        create,
        destroy,
        traffic: None,
    })
}

fn qp_pipelined(
    ctrl: &mut CtrlQueue,
    reqs: &[(Vec<u8>, Vec<u8>)],
    tr: &[(u32, QpAttr); 3],
    batch: usize,
    echo: bool,
) -> Res<QpRun> {
    let t0 = Instant::now();
    let (handles, create) = create_pipelined(ctrl, reqs, tr, batch, echo)?;
    let setup = t0.elapsed();
    ctrl.set_auto_kick(false);
    let t0 = Instant::now();
    for chunk in handles.chunks(batch * 3) {
        let mut tokens = Vec::with_capacity(chunk.len());
        for &h in chunk {
            tokens.push(ctrl.submit(
                Opcode::DESTROY_QP,
                &QpHandleReq { qp_handle: h }.to_bytes(),
                0,
            )?);
        }
        ctrl.kick()?;
        for t in tokens {
            ctrl.wait(t)?.ok()?;
        }
    }
    let destroy = t0.elapsed();
    ctrl.set_auto_kick(true);
    Ok(QpRun {
        mode: "pipelined",
        echo,
        setup,
        create,
        destroy,
        traffic: None,
    })
}

/// Creates and connects a QP per request, `batch` CREATE_QPs in flight,
/// then their 3 × `batch` MODIFY_QPs; returns the handles and the time the
/// CREATE_QPs took.
fn create_pipelined(
    ctrl: &mut CtrlQueue,
    reqs: &[(Vec<u8>, Vec<u8>)],
    tr: &[(u32, QpAttr); 3],
    batch: usize,
    echo: bool,
) -> Res<(Vec<u32>, Duration)> {
    ctrl.set_auto_kick(false);
    let mut handles = Vec::with_capacity(reqs.len());
    let mut create = Duration::ZERO;
    for chunk in reqs.chunks(batch) {
        let tc = Instant::now();
        let mut tokens = Vec::with_capacity(chunk.len());
        for (fixed, tail) in chunk {
            tokens.push(ctrl.submit_parts(
                Opcode::CREATE_QP,
                &[fixed, tail],
                CreateQpResp::SIZE,
            )?);
        }
        ctrl.kick()?;
        let mut created = Vec::with_capacity(chunk.len());
        for t in tokens {
            created.push(create_ok(ctrl, t, echo)?);
        }
        create += tc.elapsed();
        // INIT, RTR, RTS of every QP of the batch in one go: commands of one
        // VM execute in available-ring order (docs/virtio-rdma-spec.md, 7.2).
        let mut tokens = Vec::with_capacity(3 * chunk.len());
        for &h in &created {
            for m in modify_bytes(h, tr) {
                tokens.push(ctrl.submit(Opcode::MODIFY_QP, &m, 0)?);
            }
        }
        ctrl.kick()?;
        for t in tokens {
            ctrl.wait(t)?.ok()?;
        }
        handles.extend(created);
    }
    ctrl.set_auto_kick(true);
    Ok((handles, create))
}

// ---------------------------------------------------------------------------
// Benchmark 4: many objects, and the memory each takes

/// The process's anonymous resident memory in bytes (`RssAnon`): the heap
/// of the daemon and of the client, not guest memory (a shared memfd).
fn rss_anon() -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no RssAnon in /proc/self/status")?;
    Ok(kib * 1024)
}

/// `n` connected RC QPs (pipelined), then `n` one-page MRs, on one VM of
/// the in-process daemon: that it works, and what each costs in host
/// memory — measured (the growth of `RssAnon`, which the client adds next
/// to nothing to: its requests are built before) and as the daemon
/// accounts it against `max_host_bytes`.
fn objects_bench(n: usize, batch: usize, p: Placement, sum: &mut Summary) -> Res<()> {
    let big = u32::try_from(n + 16).unwrap_or(u32::MAX);
    let limits = Limits {
        max_qp: big,
        max_mr: big,
        max_host_bytes: 1 << 40,
        ..Limits::default()
    };
    let daemon = p.launch(|| Ok(start_daemon(limits, 1)?))?;
    let mut vm = daemon.connect_with(0, qp_vm_options(n))?;
    let page = vm.mem().allocator().alloc(PAGE_SIZE, PAGE_SIZE)?;
    let mut v = Verbs::new(&mut vm);
    let QpRequests { pd, reqs, tr } = qp_requests(&mut v, n)?;
    let host = |d: &TestDaemon| d.stats(0).device.resources.host_bytes;
    let (rss0, host0) = (rss_anon()?, host(&daemon));
    let t0 = Instant::now();
    let (qps, _) = create_pipelined(v.ctrl(), &reqs, &tr, batch, false)?;
    let qp_time = t0.elapsed();
    let (rss1, host1) = (rss_anon()?, host(&daemon));
    let pages = [page];
    let t0 = Instant::now();
    let mut mrs = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let spec = MrSpec::new(pd, access::LOCAL_WRITE, i << 12, &pages);
        mrs.push(v.reg_mr(&spec)?.mr_handle);
    }
    let mr_time = t0.elapsed();
    let (rss2, host2) = (rss_anon()?, host(&daemon));
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    println!("  threads: {}", thread_placement());
    println!(
        "  {n} connected RC QPs (SQ/RQ depth 4, pipelined) in {:.2} s: {:.0} bytes each measured (RssAnon), {:.0} accounted",
        qp_time.as_secs_f64(),
        per(rss0, rss1),
        per(host0, host1)
    );
    println!(
        "  {n} one-page MRs (one REG_MR at a time) in {:.2} s: {:.0} bytes each measured, {:.0} accounted [{}]",
        mr_time.as_secs_f64(),
        per(rss1, rss2),
        per(host1, host2),
        p.key()
    );
    let key = format!("objects.{}", p.key());
    sum.add(format!("{key}.qps"), n as f64);
    sum.add(format!("{key}.qp_rss_bytes"), per(rss0, rss1));
    sum.add(format!("{key}.qp_host_bytes"), per(host0, host1));
    sum.add(format!("{key}.mr_rss_bytes"), per(rss1, rss2));
    sum.add(format!("{key}.mr_host_bytes"), per(host1, host2));
    sum.add(format!("{key}.mrs_per_s"), n as f64 / mr_time.as_secs_f64());
    for h in mrs {
        v.dereg_mr(h)?;
    }
    for h in qps {
        v.ctrl()
            .call(
                Opcode::DESTROY_QP,
                &QpHandleReq { qp_handle: h }.to_bytes(),
                0,
            )?
            .ok()?;
    }
    drop(v);
    drop(vm);
    drop(daemon);
    Ok(())
}

/// Guest memory for `n` QPs: 3 guest pages each (2 ring pages and the
/// doorbell page), split over the two regions, plus the request buffers.
fn qp_vm_options(n: usize) -> VmmOptions {
    let per_region = (n as u64 * 3 * PAGE_SIZE / 2 + 128 * MIB).next_multiple_of(MIB);
    VmmOptions {
        mem: MemLayout::two_regions(per_region.max(256 * MIB), per_region.max(256 * MIB)),
        queue_size: 1024,
        ..VmmOptions::default()
    }
}

/// What [`qp_requests`] prepares.
struct QpRequests {
    pd: u32,
    /// Encoded CREATE_QP requests (fixed part, page-list tail).
    reqs: Vec<(Vec<u8>, Vec<u8>)>,
    /// INIT, RTR and RTS towards the device's own GID (the tenant policy
    /// refuses GIDs of no VM).
    tr: [(u32, QpAttr); 3],
}

/// A context, PD and CQ on `v`, and `n` RC QP requests (SQ/RQ depth 4, one
/// SGE, no inline data) with their rings allocated and encoded: guest-side
/// work kept out of the timed regions.
fn qp_requests(v: &mut Verbs<'_>, n: usize) -> Res<QpRequests> {
    let ctx = v.create_ctx()?;
    let pd = v.alloc_pd(ctx)?;
    let cq = v.create_cq(ctx, 16)?;
    let init = QpInit {
        sq_depth: 4,
        rq_depth: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        ..QpInit::rc(pd, cq)
    };
    let mut reqs = Vec::with_capacity(n);
    for _ in 0..n {
        let (req, tail): (CreateQpReq, Vec<u8>) = v.qp_request(&init)?;
        reqs.push((req.to_bytes(), tail));
    }
    let (index, gid) = v.own_gid()?;
    Ok(QpRequests {
        pd,
        reqs,
        tr: rc_transitions(0x00_1234, gid, index),
    })
}

fn qp_bench(cfg: &Config, p: Placement, sum: &mut Summary) -> Res<Vec<QpRun>> {
    let n = cfg.qps;
    let limits = Limits {
        max_qp: Limits::default()
            .max_qp
            .max(u32::try_from(n + 16).unwrap_or(u32::MAX)),
        ..Limits::default()
    };
    let path = echo_socket();
    let vms = if cfg.traffic { 3 } else { 1 };
    let (daemon, echo): (TestDaemon, EchoHandle) = p.launch(|| {
        let d = start_daemon(limits, vms)?;
        let e = echo::spawn(&path)?;
        Ok((d, e))
    })?;
    let opts = qp_vm_options(n);
    let mut echo_vm = TestVmm::connect(echo.socket_path(), opts.clone())?;
    let mut vm = daemon.connect_with(0, opts)?;
    let mut v = Verbs::new(&mut vm);
    // The same rings are reused by every run.
    let QpRequests { reqs, tr, .. } = qp_requests(&mut v, n)?;
    println!("  threads: {}", thread_placement());

    // The same request bytes go to the echo backend: the transport bound.
    let split = matches!(p, Placement::Split { .. });
    let mut all: Vec<QpRun> = Vec::new();
    if cfg.traffic {
        let traffic = Traffic::start(&daemon, 1, 2);
        qp_pipelined(v.ctrl(), &reqs[..reqs.len().min(64)], &tr, cfg.batch, false)?;
        for _ in 0..cfg.qp_reps {
            let (w0, t0) = (traffic.wqes(), Instant::now());
            let mut r = qp_pipelined(v.ctrl(), &reqs, &tr, cfg.batch, false)?;
            // Setup and teardown both ran under the traffic.
            r.traffic = Some((traffic.wqes() - w0) as f64 / t0.elapsed().as_secs_f64());
            r.mode = "pipelined+traffic";
            all.push(r);
        }
    }
    // Warm-up: a few QPs through both paths of both backends.
    let warm = if cfg.traffic { 0 } else { reqs.len().min(64) };
    for (ctrl, is_echo) in [(echo_vm.ctrl(), true), (v.ctrl(), false)] {
        qp_sequential(ctrl, &reqs[..warm], &tr, is_echo)?;
        qp_pipelined(ctrl, &reqs[..warm], &tr, cfg.batch, is_echo)?;
    }
    // Repetitions alternate the two backends (and which goes first), so a
    // burst of noise on the machine does not hit only one of them; the
    // median of the repetitions is reported.
    for rep in 0..if cfg.traffic { 0 } else { cfg.qp_reps } {
        let mut order = [(echo_vm.ctrl(), true), (v.ctrl(), false)];
        if rep % 2 == 1 {
            order.reverse();
        }
        for (ctrl, is_echo) in order {
            all.push(qp_sequential(ctrl, &reqs, &tr, is_echo)?);
            all.push(qp_pipelined(ctrl, &reqs, &tr, cfg.batch, is_echo)?);
            if split {
                // What a polling driver gets: the client spins on the used
                // ring instead of sleeping on the call eventfd (one wakeup,
                // the device's, per round trip).
                ctrl.set_busy_poll(Some(Duration::from_micros(200)));
                let r = qp_sequential(ctrl, &reqs, &tr, is_echo);
                ctrl.set_busy_poll(None);
                all.push(QpRun {
                    mode: "seq+busy-poll",
                    ..r?
                });
            }
        }
    }
    let mut runs = Vec::new();
    for echo in [true, false] {
        for mode in [
            "sequential",
            "pipelined",
            "seq+busy-poll",
            "pipelined+traffic",
        ] {
            let same: Vec<&QpRun> = all
                .iter()
                .filter(|r| r.echo == echo && r.mode == mode)
                .collect();
            if same.is_empty() {
                continue;
            }
            let med = |f: fn(&QpRun) -> Duration| {
                let mut v: Vec<Duration> = same.iter().map(|r| f(r)).collect();
                v.sort_unstable();
                v[v.len() / 2]
            };
            runs.push(QpRun {
                mode,
                echo,
                setup: med(|r| r.setup),
                create: med(|r| r.create),
                destroy: med(|r| r.destroy),
                traffic: {
                    let mut t: Vec<f64> = same.iter().filter_map(|r| r.traffic).collect();
                    t.sort_by(f64::total_cmp);
                    t.get(t.len() / 2).copied()
                },
            });
        }
    }
    for r in &runs {
        let who = if r.echo { "echo" } else { "verb" };
        let key = format!("qp.{}.{}.{}", p.key(), who, r.mode);
        sum.add(format!("{key}.qps_per_s"), n as f64 / r.setup.as_secs_f64());
        sum.add(
            format!("{key}.create_us"),
            r.create.as_secs_f64() * 1e6 / n as f64,
        );
        sum.add(
            format!("{key}.modify_us"),
            (r.setup - r.create).as_secs_f64() * 1e6 / n as f64,
        );
        sum.add(
            format!("{key}.destroy_per_s"),
            n as f64 / r.destroy.as_secs_f64(),
        );
        if let Some(t) = r.traffic {
            sum.add(format!("{key}.traffic_mpps"), t / 1e6);
        }
    }
    drop(v);
    drop(vm);
    drop(echo_vm);
    drop(echo);
    drop(daemon);
    Ok(runs)
}

fn print_qp(cfg: &Config, p: Placement, runs: &[QpRun]) {
    let n = cfg.qps as f64;
    println!(
        "  {} RC QPs (SQ/RQ depth 4, 2 ring pages, INLINE list) on one PD/CQ; pipelined batch {} creates, then 3x{} modifies; median of {} repetitions",
        cfg.qps, cfg.batch, cfg.batch, cfg.qp_reps
    );
    println!(
        "  {:<20} | {:>9} {:>8} | {:>10} {:>10} | {:>10} {:>8}",
        "mode", "QPs/s", "us/QP", "create us", "modify us", "destroy/s", "us/QP"
    );
    for r in runs {
        let setup_us = r.setup.as_secs_f64() * 1e6 / n;
        let create_us = r.create.as_secs_f64() * 1e6 / n;
        let mode = format!("{} {}", if r.echo { "echo" } else { "daemon" }, r.mode);
        println!(
            "  {:<20} | {:>9.0} {:>8.2} | {:>10.2} {:>10.2} | {:>10.0} {:>8.2}",
            mode,
            n / r.setup.as_secs_f64(),
            setup_us,
            create_us,
            setup_us - create_us,
            n / r.destroy.as_secs_f64(),
            r.destroy.as_secs_f64() * 1e6 / n,
        );
        if let Some(t) = r.traffic {
            println!(
                "  {:<20} | meanwhile two other VMs' 64 B RDMA WRITEs: {:.2} M/s",
                "",
                t / 1e6
            );
        }
    }
    println!(
        "  (setup = CREATE_QP + INIT + RTR + RTS, 4 commands per QP; \"echo\" = the same request bytes answered by the echo backend, the transport bound; seq+busy-poll = sequential with the client spinning on the used ring up to 200 us; target >= 20000 QPs/s) [{}]",
        p.key()
    );
}

// ---------------------------------------------------------------------------
// Benchmark 3: REG_MR

struct MrRow {
    name: String,
    pages: usize,
    reg: Stats,
    dereg: Stats,
}

/// A deterministic xorshift64* generator (no external crate needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap_or(0);
            v.swap(i, j);
        }
    }
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(a)
}

/// How the baselines check a page against the RAM layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// What the daemon's RamMap does: a last-hit region cache, then a
    /// binary search.
    LastHit,
    /// Every region compared with bitwise ANDs/ORs, no data-dependent branch.
    Branchless,
}

/// The plain baseline: read every list page, check every page address
/// against the RAM layout and collect the translation.
fn plain_translate(
    mem: &GuestMem,
    dir: &[u8],
    npages: usize,
    ram: &[(u64, u64)],
    check: Check,
) -> Res<Vec<u64>> {
    let mut out = Vec::with_capacity(npages);
    let mut buf = vec![0u8; LIST_PAGE_SIZE as usize];
    let mut last = 0usize;
    let last_hit = |last: &mut usize, gpa: u64, len: u64| -> bool {
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        if let Some(&(s, e)) = ram.get(*last) {
            if s <= gpa && end <= e {
                return true;
            }
        }
        let i = ram.partition_point(|&(_, e)| e <= gpa);
        match ram.get(i) {
            Some(&(s, e)) if s <= gpa && end <= e => {
                *last = i;
                true
            }
            _ => false,
        }
    };
    let branchless = |gpa: u64, len: u64| -> bool {
        let end = gpa.wrapping_add(len);
        let mut ok = false;
        for &(s, e) in ram {
            ok |= (gpa >= s) & (end <= e);
        }
        ok & (end > gpa)
    };
    let mut contains = |gpa: u64, len: u64| match check {
        Check::LastHit => last_hit(&mut last, gpa, len),
        Check::Branchless => branchless(gpa, len),
    };
    for raw in dir.chunks_exact(8) {
        let lp = le64(raw);
        if lp % LIST_PAGE_SIZE != 0 || !contains(lp, LIST_PAGE_SIZE) {
            return Err(format!("bad list page {lp:#x}").into());
        }
        mem.read(GuestAddress(lp), &mut buf)?;
        let take = (npages - out.len()).min(LIST_PAGE_ENTRIES as usize);
        for e in buf.chunks_exact(8).take(take) {
            let gpa = le64(e);
            if gpa % PAGE_SIZE != 0 || !contains(gpa, PAGE_SIZE) {
                return Err(format!("bad page {gpa:#x}").into());
            }
            out.push(gpa);
        }
    }
    Ok(out)
}

fn time_n<T>(n: usize, mut f: impl FnMut() -> Res<T>) -> Res<Vec<u64>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let r = f()?;
        v.push(ns(t0.elapsed()));
        drop(r);
    }
    Ok(v)
}

fn mr_bench(cfg: &Config, p: Placement, sum: &mut Summary) -> Res<Vec<MrRow>> {
    let daemon = p.launch(|| Ok(start_daemon(Limits::default(), 1)?))?;
    let region0 = (2 * GIB).max(cfg.mr_bytes + 512 * MIB);
    let opts = VmmOptions {
        mem: MemLayout::two_regions(region0, (cfg.mr_bytes / 2).max(64 * MIB)),
        ..VmmOptions::default()
    };
    let mut vm = daemon.connect_with(0, opts)?;
    let mem = vm.mem().clone();
    let mut v = Verbs::new(&mut vm);
    let ctx = v.create_ctx()?;
    let pd = v.alloc_pd(ctx)?;
    let block = mem.alloc(cfg.mr_bytes, 2 * MIB)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    let n4k = usize::try_from(cfg.mr_bytes / PAGE_SIZE)?;
    let in_order: Vec<GuestAddress> = (0..n4k as u64)
        .map(|i| GuestAddress(block.0 + i * PAGE_SIZE))
        .collect();
    let mut shuffled = in_order.clone();
    rng.shuffle(&mut shuffled);
    // Half the pages from the block in region 0, half from region 1,
    // shuffled together: the RAM lookup's last-hit cache misses about half
    // the time. (Registration never touches the data pages, so region 1
    // needs no allocation.)
    let region1 = mem.layout().regions.get(1).map_or(block.0, |r| r.gpa);
    let mut two_regions: Vec<GuestAddress> = (0..n4k as u64)
        .map(|i| {
            let base = if i % 2 == 0 { block.0 } else { region1 };
            GuestAddress(base + (i / 2) * PAGE_SIZE)
        })
        .collect();
    rng.shuffle(&mut two_regions);
    let huge = 2 * MIB;
    let mut huge_pages: Vec<GuestAddress> = (0..cfg.mr_bytes / huge)
        .map(|i| GuestAddress(block.0 + i * huge))
        .collect();
    rng.shuffle(&mut huge_pages);

    let configs = [
        (
            "4 KiB shuffled, INDIRECT",
            &shuffled,
            12,
            PageListMode::INDIRECT,
        ),
        (
            "4 KiB in order, INDIRECT",
            &in_order,
            12,
            PageListMode::INDIRECT,
        ),
        (
            "4 KiB shuffled, 2 regions",
            &two_regions,
            12,
            PageListMode::INDIRECT,
        ),
        (
            "2 MiB shuffled, INLINE",
            &huge_pages,
            21,
            PageListMode::INLINE,
        ),
    ];
    let mut built = Vec::new();
    for (name, pages, shift, mode) in configs {
        // List pages are written once, outside the timed region.
        let list = v.page_list(pages, shift, mode)?;
        let req = RegMrReq {
            pd_handle: pd,
            access: access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
            iova: 0x7f00_0000_0000,
            length: cfg.mr_bytes,
            buf: list.desc,
        };
        built.push((name, pages.len(), req.to_bytes(), list));
    }
    println!("  threads: {}", thread_placement());

    let per_gib = GIB as f64 / cfg.mr_bytes as f64;
    let mut rows = Vec::new();
    let ctrl = v.ctrl();
    for (name, npages, fixed, list) in &built {
        let reg_once = |ctrl: &mut CtrlQueue| -> Res<(u64, u32)> {
            let t0 = Instant::now();
            let token = ctrl.submit_parts(Opcode::REG_MR, &[fixed, &list.tail], RegMrResp::SIZE)?;
            let c = ctrl.wait(token)?;
            let dt = ns(t0.elapsed());
            Ok((dt, c.ok()?.parse::<RegMrResp>()?.mr_handle))
        };
        let dereg_once = |ctrl: &mut CtrlQueue, h: u32| -> Res<u64> {
            let t0 = Instant::now();
            let token = ctrl.submit(
                Opcode::DEREG_MR,
                &MrHandleReq { mr_handle: h }.to_bytes(),
                0,
            )?;
            let c = ctrl.wait(token)?;
            let dt = ns(t0.elapsed());
            c.ok()?;
            Ok(dt)
        };
        for _ in 0..2 {
            let (_, h) = reg_once(ctrl)?;
            dereg_once(ctrl, h)?;
        }
        let mut reg = Vec::with_capacity(cfg.mr_iters);
        let mut dereg = Vec::with_capacity(cfg.mr_iters);
        for _ in 0..cfg.mr_iters {
            let (t, h) = reg_once(ctrl)?;
            reg.push(t);
            dereg.push(dereg_once(ctrl, h)?);
        }
        rows.push(MrRow {
            name: (*name).to_string(),
            pages: *npages,
            reg: Stats::of(&reg),
            dereg: Stats::of(&dereg),
        });
    }

    // In-process baselines (this thread, no control path) on the shuffled
    // lists. (Calling the daemon's PageList::resolve from here is no
    // baseline: instantiated in this crate, its helpers are not inlined
    // across the crate boundary and it runs ~2x slower than in the daemon.)
    let ram: Vec<(u64, u64)> = mem
        .layout()
        .regions
        .iter()
        .map(|r| (r.gpa, r.end()))
        .collect();
    let baselines = [
        ("baseline: plain loop", 0, Check::LastHit),
        ("baseline: plain, 2 regions", 2, Check::LastHit),
        ("baseline: branchless, 2 regions", 2, Check::Branchless),
    ];
    for (name, index, check) in baselines {
        let Some((_, npages, _, list)) = built.get(index) else {
            continue;
        };
        let t = time_n(cfg.mr_iters + 2, || {
            plain_translate(&mem, &list.tail, *npages, &ram, check)
        })?;
        rows.push(MrRow {
            name: name.into(),
            pages: *npages,
            reg: Stats::of(t.get(2..).unwrap_or(&t)),
            dereg: Stats::default(),
        });
    }
    for r in &rows {
        let key = format!(
            "mr.{}.{}",
            p.key(),
            r.name
                .split([' ', ',', ':', '.'])
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("_")
        );
        sum.add(format!("{key}.ms_per_gib_p50"), r.reg.p50 / 1e6 * per_gib);
        sum.add(format!("{key}.ms_per_gib_min"), r.reg.min / 1e6 * per_gib);
        if r.dereg.n > 0 {
            sum.add(format!("{key}.dereg_p50_ms"), r.dereg.p50 / 1e6);
        }
    }
    drop(v);
    drop(vm);
    drop(daemon);
    Ok(rows)
}

fn print_mr(cfg: &Config, p: Placement, rows: &[MrRow]) {
    let per_gib = GIB as f64 / cfg.mr_bytes as f64;
    println!(
        "  REG_MR of {} MiB, {} timed repetitions (DEREG_MR between), guest region 0 >= 2 GiB",
        cfg.mr_bytes / MIB,
        cfg.mr_iters
    );
    println!(
        "  {:<31} {:>7} | {:>8} {:>8} | {:>9} {:>9} | {:>9}",
        "configuration", "pages", "REG p50", "min", "p50/GiB", "min/GiB", "DEREG p50"
    );
    for r in rows {
        let dereg = if r.dereg.n > 0 {
            format!("{:>9.3}", r.dereg.p50 / 1e6)
        } else {
            format!("{:>9}", "-")
        };
        println!(
            "  {:<31} {:>7} | {:>8.3} {:>8.3} | {:>9.3} {:>9.3} | {}",
            r.name,
            r.pages,
            r.reg.p50 / 1e6,
            r.reg.min / 1e6,
            r.reg.p50 / 1e6 * per_gib,
            r.reg.min / 1e6 * per_gib,
            dereg
        );
    }
    if let (Some(reg), Some(res)) = (
        rows.first(),
        rows.iter().find(|r| r.name.contains("plain loop")),
    ) {
        println!(
            "  REG_MR beyond the plain translation loop (4 KiB shuffled p50 - baseline p50): {:.3} ms",
            (reg.reg.p50 - res.reg.p50) / 1e6
        );
    }
    println!("  (milliseconds; target <= 5 ms per GiB) [{}]", p.key());
}

// ---------------------------------------------------------------------------

fn main() -> Res<()> {
    let args = Args::parse();
    let cfg = Config::from_args(&args)?;
    print_header("ctrl_bench");

    let cpus = allowed_cpus()?;
    let first = *cpus.first().ok_or("no CPU in the affinity mask")?;
    let mut placements = vec![Placement::Same { cpu: first }];
    match cpus.get(1) {
        Some(&second) => placements.push(Placement::Split {
            client: first,
            backend: second,
        }),
        None => println!("  only one CPU available: the split placement is skipped"),
    }
    if !args.placement.is_empty() {
        placements.retain(|p| args.placement.iter().any(|k| k == p.key()));
    }
    println!(
        "  placements: {}",
        placements
            .iter()
            .map(|p| p.describe())
            .collect::<Vec<_>>()
            .join("; ")
    );

    let mut sum = Summary::default();
    if cfg.latency {
        println!("\n== 1. control-verb round trip vs raw vhost-user echo (one request at a time: submit + kick, wait on the call eventfd) ==");
        for &p in &placements {
            println!("\n [{}]", p.describe());
            let rows = latency_bench(&cfg, p, &mut sum)?;
            print_latency(&cfg, p, &rows);
        }
    }
    if cfg.qp {
        println!("\n== 2. QP setup rate: CREATE_QP + MODIFY_QP INIT/RTR/RTS, then DESTROY_QP ==");
        for &p in &placements {
            println!("\n [{}]", p.describe());
            let runs = qp_bench(&cfg, p, &mut sum)?;
            print_qp(&cfg, p, &runs);
        }
    }
    if cfg.mr {
        println!(
            "\n== 3. REG_MR round trip (with the daemon's page-list validation and translation) =="
        );
        for &p in &placements {
            println!("\n [{}]", p.describe());
            let rows = mr_bench(&cfg, p, &mut sum)?;
            print_mr(&cfg, p, &rows);
        }
    }
    if let Some(n) = cfg.objects {
        println!("\n== 4. Many objects on one VM, and the host memory each takes ==");
        for &p in &placements {
            println!("\n [{}]", p.describe());
            objects_bench(n, cfg.batch, p, &mut sum)?;
        }
    }
    println!("\n  load average at end: {}", loadavg());
    println!("\nsummary (key value), for aggregating runs:");
    for (k, v) in &sum.0 {
        println!("  {k} {v:.3}");
    }
    Ok(())
}
