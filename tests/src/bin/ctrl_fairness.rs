//! Control-command fairness: does one VM flooding its control queue slow
//! the others down?
//!
//! Four VMs on one in-process daemon (`TestDaemon`), all driven by this
//! process over real vhost-user sockets:
//!
//! - **A** floods its control queue: `--window` requests always in flight,
//!   each slot cycling REG_MR (16 pages) → DEREG_MR → CREATE_CQ → DESTROY_CQ
//!   as fast as the device answers;
//! - **B** measures control-verb latency, one command at a time: ALLOC_PD,
//!   DEALLOC_PD, MODIFY_QP RESET→INIT, MODIFY_QP INIT→RESET (p50/p99 of
//!   each command's round trip);
//! - **C** streams RDMA WRITEs of `--msg` bytes to **D** (RC, `--depth`
//!   outstanding) for `--secs` seconds.
//!
//! Each run measures B and C alone, then again while A floods, and (with
//! `--limit N`) while A floods under a `ctrl_per_sec` limit of N. Medians
//! over `--runs` runs and the ratios flood / alone are printed with the
//! command line. Placement: this thread (B's and C's clients) on
//! `--client-cpu`, A's flooding client on `--flood-cpu`, the daemon (its
//! vhost-user workers and the engine thread inherit it) started from a
//! thread pinned to `--engine-cpu`.
//!
//! Nothing here asserts a timing.
//!
//! Run: `cargo run --release -p vhost-user-rdma-tests --bin ctrl_fairness -- [options]`
//! (see docs/isolation.md, "Control-command fairness").

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use vhost_user_rdma::qos::{QosClass, QosSpec, DEFAULT_CTRL_PER_SEC};
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::bench::{pin_current, print_header, thread_placement};
use vhost_user_rdma_tests::ctrl::Completion;
use vhost_user_rdma_tests::dp::{self, Buf, Vm};
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::mem::{access, PageListMode};
use virtio_rdma_abi::qp::{attr, QpAttr, QpState};
use virtio_rdma_abi::verbs::{CqHandleReq, CqHandleResp, MrHandleReq, RegMrReq, RegMrResp};
use virtio_rdma_abi::{Field, Wire};
use virtio_rdma_driver::{SendOp, SendWr, WorkCompletion};

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// VM indices.
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const D: usize = 3;
/// A wait for a completion longer than this is an error (no hang).
const WAIT: Duration = Duration::from_secs(20);

#[derive(Parser, Debug)]
#[command(about = "control-command fairness between VMs (see docs/isolation.md)")]
struct Args {
    /// Runs (medians are printed).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds of each data-stream measurement.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Probe iterations (4 commands each) per measurement.
    #[arg(long, default_value_t = 500)]
    probe: usize,
    /// A's requests in flight.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// RDMA WRITE size of C's stream.
    #[arg(long, default_value_t = 65536)]
    msg: usize,
    /// C's outstanding WRITEs.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Also measure with A limited to this many control commands per
    /// second (0: skip); the default is the daemon's default limit.
    #[arg(long, default_value_t = DEFAULT_CTRL_PER_SEC)]
    limit: u64,
    /// The daemon's `max_ctrl_outstanding` (requests taken per pass).
    #[arg(long)]
    max_ctrl_outstanding: Option<u32>,
    /// CPU of B's and C's clients (this thread).
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of A's flooding client.
    #[arg(long)]
    flood_cpu: Option<usize>,
    /// Nice value of A's flooding client thread. On a host each VM has its
    /// own vCPUs, so A's guest never takes CPU time from B's and C's; on a
    /// 2-core machine the clients share a CPU, and at equal priority A's
    /// busy client would mostly measure that. 19 (default) keeps A's
    /// *guest* out of the way while everything in the daemon runs at
    /// normal priority; 0 shows the raw effect.
    #[arg(long, default_value_t = 19)]
    flood_nice: i32,
    /// CPU of the daemon's engine thread.
    #[arg(long, default_value_t = 1)]
    engine_cpu: usize,
    /// CPU of the daemon's vhost-user (control) workers; default: the
    /// engine's CPU (the daemon is started from a thread pinned there and
    /// every thread inherits it). With another CPU the engine is pinned by
    /// the daemon's `engine_cpu` setting and the workers run here.
    #[arg(long)]
    worker_cpu: Option<usize>,
    /// A tiny version (smoke test).
    #[arg(long)]
    quick: bool,
}

// ---------------------------------------------------------------------------
// Statistics

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The `q`-quantile (0..=1) of `v`, in the units of `v`.
fn quantile(v: &mut [u64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)] as f64
}

/// One measurement of B's probe: p50/p99 in microseconds per group.
#[derive(Debug, Clone, Copy, Default)]
struct Probe {
    pd_p50: f64,
    pd_p99: f64,
    qp_p50: f64,
    qp_p99: f64,
}

/// One run of a scenario.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    probe: Probe,
    /// C's stream in MB/s.
    stream: f64,
    /// A's completed commands per second during the measurements.
    flood_rate: f64,
}

// ---------------------------------------------------------------------------
// A: the flood

/// What a flood slot sends next.
#[derive(Clone, Copy)]
enum Step {
    RegMr,
    DeregMr(u32),
    CreateCq,
    DestroyCq(u32),
}

struct Slot {
    step: Step,
    reg: (Vec<u8>, Vec<u8>),
    cq: (Vec<u8>, Vec<u8>),
}

fn submit(v: &mut Verbs<'_>, s: &Slot) -> Res<u64> {
    let q = v.ctrl();
    let t = match s.step {
        Step::RegMr => q.submit_parts(Opcode::REG_MR, &[&s.reg.0, &s.reg.1], RegMrResp::SIZE)?,
        Step::DeregMr(h) => q.submit(
            Opcode::DEREG_MR,
            &MrHandleReq { mr_handle: h }.to_bytes(),
            0,
        )?,
        Step::CreateCq => {
            q.submit_parts(Opcode::CREATE_CQ, &[&s.cq.0, &s.cq.1], CqHandleResp::SIZE)?
        }
        Step::DestroyCq(h) => q.submit(
            Opcode::DESTROY_CQ,
            &CqHandleReq { cq_handle: h }.to_bytes(),
            0,
        )?,
    };
    Ok(t)
}

/// The step after `c` completed for a slot at `step`.
fn next(step: Step, c: &Completion) -> Res<Step> {
    if !c.is_ok() {
        return Err(format!("flood command failed: {:?}", c.status()).into());
    }
    Ok(match step {
        Step::RegMr => Step::DeregMr(c.parse::<RegMrResp>()?.mr_handle),
        Step::DeregMr(_) => Step::CreateCq,
        Step::CreateCq => Step::DestroyCq(c.parse::<CqHandleResp>()?.cq_handle),
        Step::DestroyCq(_) => Step::RegMr,
    })
}

/// Floods VM A's control queue while `run` is set (between phases it
/// drains and waits, parked); counts completed commands in `done`.
fn flood(
    vmm: &mut TestVmm,
    window: usize,
    run: &AtomicBool,
    quit: &AtomicBool,
    done: &AtomicU64,
) -> Res<()> {
    let mut v = Verbs::new(vmm);
    let ctx = v.create_ctx()?;
    let pd = v.alloc_pd(ctx)?;
    let mut slots = Vec::with_capacity(window);
    for i in 0..window {
        let pages = v.mem().alloc_pages(16, PAGE_SIZE)?;
        let list = v.page_list(&pages, 12, PageListMode::INLINE)?;
        let reg = RegMrReq {
            pd_handle: pd,
            access: access::LOCAL_WRITE | access::REMOTE_WRITE,
            iova: (i as u64) << 20,
            length: 16 * PAGE_SIZE,
            buf: list.desc,
        };
        let (cq, tail) = v.cq_request(ctx, 64)?;
        slots.push(Slot {
            step: Step::RegMr,
            reg: (reg.to_bytes(), list.tail),
            cq: (cq.to_bytes(), tail),
        });
    }
    while !quit.load(Ordering::Acquire) {
        if !run.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let mut inflight: HashMap<u64, usize> = HashMap::new();
        for (i, s) in slots.iter().enumerate() {
            inflight.insert(submit(&mut v, s)?, i);
        }
        while !inflight.is_empty() {
            let got = v.ctrl().wait_any_timeout(WAIT)?;
            let go_on = run.load(Ordering::Acquire);
            for c in got {
                let Some(i) = inflight.remove(&c.token) else {
                    continue;
                };
                done.fetch_add(1, Ordering::Relaxed);
                let s = &mut slots[i];
                s.step = next(s.step, &c)?;
                if go_on {
                    inflight.insert(submit(&mut v, s)?, i);
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// B: the probe

struct ProbeVm {
    vmm: TestVmm,
    ctx: u32,
    qp: u32,
}

impl ProbeVm {
    fn new(mut vmm: TestVmm) -> Res<ProbeVm> {
        let mut v = Verbs::new(&mut vmm);
        let ctx = v.create_ctx()?;
        let pd = v.alloc_pd(ctx)?;
        let cq = v.create_cq(ctx, 64)?;
        let qp = v.create_qp(&QpInit::rc(pd, cq))?.handle;
        Ok(ProbeVm { vmm, ctx, qp })
    }

    fn run(&mut self, iters: usize) -> Res<Probe> {
        let mut v = Verbs::new(&mut self.vmm);
        let mut pd_ns = Vec::with_capacity(2 * iters);
        let mut qp_ns = Vec::with_capacity(2 * iters);
        let init = QpAttr {
            qp_state: QpState::INIT.into(),
            pkey_index: 0,
            port: 1,
            access: access::REMOTE_WRITE,
            ..QpAttr::default()
        };
        let init_mask = attr::STATE | attr::PKEY_INDEX | attr::PORT | attr::ACCESS;
        let reset = QpAttr {
            qp_state: QpState::RESET.into(),
            ..QpAttr::default()
        };
        let time = |f: &mut dyn FnMut() -> Res<()>| -> Res<u64> {
            let t = Instant::now();
            f()?;
            Ok(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
        };
        for _ in 0..iters {
            let mut pd = 0;
            pd_ns.push(time(&mut || {
                pd = v.alloc_pd(self.ctx)?;
                Ok(())
            })?);
            pd_ns.push(time(&mut || Ok(v.dealloc_pd(pd)?))?);
            qp_ns.push(time(&mut || Ok(v.modify_qp(self.qp, init_mask, &init)?))?);
            qp_ns.push(time(&mut || {
                Ok(v.modify_qp(self.qp, attr::STATE, &reset)?)
            })?);
        }
        Ok(Probe {
            pd_p50: quantile(&mut pd_ns, 0.5) / 1e3,
            pd_p99: quantile(&mut pd_ns, 0.99) / 1e3,
            qp_p50: quantile(&mut qp_ns, 0.5) / 1e3,
            qp_p99: quantile(&mut qp_ns, 0.99) / 1e3,
        })
    }
}

// ---------------------------------------------------------------------------
// C -> D: the stream

struct Stream {
    c: Vm,
    d: Vm,
    pair: dp::Pair,
    src: Buf,
    dst: Buf,
}

impl Stream {
    fn new(daemon: &TestDaemon, msg: usize) -> Stream {
        let c = Vm::open(daemon, C, VmmOptions::default());
        let d = Vm::open(daemon, D, VmmOptions::default());
        let pair = dp::rc_pair(&c, &d);
        let src = Buf::new(&c, msg);
        let dst = Buf::new(&d, msg);
        Stream {
            c,
            d,
            pair,
            src,
            dst,
        }
    }

    /// MB/s of `msg`-byte WRITEs, `depth` outstanding, for `secs`.
    fn run(&self, msg: usize, depth: usize, secs: f64) -> Res<f64> {
        let _ = (&self.c, &self.d);
        let sg = [self.src.sge(0, msg)];
        let op = SendOp::RdmaWrite {
            remote_addr: self.dst.addr(0),
            rkey: self.dst.mr.rkey(),
        };
        let depth = depth.clamp(1, dp::cap().max_send_wr as usize);
        let mut wc = [WorkCompletion::default(); 32];
        let (mut posted, mut done) = (0u64, 0u64);
        let start = Instant::now();
        let until = start + Duration::from_secs_f64(secs);
        let mut last = Instant::now();
        loop {
            let now = Instant::now();
            let stop = now >= until;
            while !stop && posted - done < depth as u64 {
                self.pair
                    .qa
                    .post_send(&[SendWr::signaled(posted, op, &sg)])?;
                posted += 1;
            }
            if stop && posted == done {
                break;
            }
            let k = self.pair.cqa.poll(&mut wc);
            for w in &wc[..k] {
                if !w.is_success() {
                    return Err(format!("WRITE failed: {w:?}").into());
                }
            }
            done += k as u64;
            if k > 0 {
                last = Instant::now();
            } else if last.elapsed() > WAIT {
                return Err("stream: no completion".into());
            } else {
                std::thread::yield_now();
            }
        }
        let t = start.elapsed().as_secs_f64();
        Ok(done as f64 * msg as f64 / t / 1e6)
    }
}

/// Sets the calling thread's nice value.
fn set_nice(nice: i32) -> Res<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid)?;
    // SAFETY: setpriority on this thread's id only changes its nice value.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
        return Err(format!("setpriority({nice}): {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------

struct World<'d> {
    daemon: &'d TestDaemon,
    probe: ProbeVm,
    stream: Stream,
    run: &'d AtomicBool,
    done: &'d AtomicU64,
}

impl World<'_> {
    fn measure(&mut self, args: &Args, flood: bool) -> Res<Sample> {
        let before = self.done.load(Ordering::Relaxed);
        let t = Instant::now();
        if flood {
            self.run.store(true, Ordering::Release);
            // Let the flood reach its steady state.
            std::thread::sleep(Duration::from_millis(50));
        }
        let probe = self.probe.run(args.probe)?;
        let stream = self.stream.run(args.msg, args.depth, args.secs)?;
        let flood_rate =
            (self.done.load(Ordering::Relaxed) - before) as f64 / t.elapsed().as_secs_f64();
        if flood {
            self.run.store(false, Ordering::Release);
            // Drained: the flooder stops submitting and collects what is
            // in flight.
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Sample {
            probe,
            stream,
            flood_rate,
        })
    }
}

fn print_sample(name: &str, s: &Sample) {
    println!(
        "  {name:<14} B ALLOC/DEALLOC_PD p50 {:>8.1} us p99 {:>8.1} us | MODIFY_QP p50 {:>8.1} us p99 {:>8.1} us | C WRITE {:>9.1} MB/s | A {:>9.0} cmds/s",
        s.probe.pd_p50, s.probe.pd_p99, s.probe.qp_p50, s.probe.qp_p99, s.stream, s.flood_rate
    );
}

fn med(v: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.quick {
        args.runs = 1;
        args.secs = 0.1;
        args.probe = 20;
        args.window = 8;
    }
    print_header("ctrl_fairness");
    let flood_cpu = args.flood_cpu.unwrap_or(args.client_cpu);
    let worker_cpu = args.worker_cpu.unwrap_or(args.engine_cpu);
    println!(
        "  placement: B and C clients on CPU {}, A's flood client on CPU {flood_cpu} (nice {}), daemon's vhost-user workers on CPU {worker_cpu}, engine on CPU {}",
        args.client_cpu, args.flood_nice, args.engine_cpu
    );
    let mut limits = Limits::default();
    if let Some(m) = args.max_ctrl_outstanding {
        limits.max_ctrl_outstanding = m;
    }
    println!(
        "  A: {} requests in flight (REG_MR 64 KiB / DEREG_MR / CREATE_CQ / DESTROY_CQ); B: {} x (ALLOC_PD, DEALLOC_PD, MODIFY_QP x2) one at a time; C->D: RDMA WRITE {} B, {} outstanding, {} s; max_ctrl_outstanding {}",
        args.window, args.probe, args.msg, args.depth, args.secs, limits.max_ctrl_outstanding
    );

    let engine_cpu = (worker_cpu != args.engine_cpu).then_some(args.engine_cpu);
    let daemon = std::thread::scope(|s| -> Res<TestDaemon> {
        let h = s.spawn(move || -> Res<TestDaemon> {
            pin_current(worker_cpu)?;
            Ok(TestDaemon::with_config(4, |c| {
                c.set_limits(limits);
                c.engine_cpus = engine_cpu.into_iter().collect();
                // "A floods" is A without any limit; the limited phase
                // sets one.
                c.qos_classes.push(QosClass {
                    name: "unlimited".into(),
                    spec: QosSpec::unlimited(),
                });
                for vm in &mut c.vms {
                    vm.qos_class = Some("unlimited".into());
                }
            })?)
        });
        h.join().map_err(|_| BoxError::from("launcher panicked"))?
    })?;
    pin_current(args.client_cpu)?;

    let run = AtomicBool::new(false);
    let quit = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let mut a_vmm = daemon.connect(A)?;
    let probe = ProbeVm::new(daemon.connect(B)?)?;
    let stream = Stream::new(&daemon, args.msg);

    let result = std::thread::scope(|s| -> Res<()> {
        let (run, quit, done) = (&run, &quit, &done);
        let window = args.window;
        let flood_nice = args.flood_nice;
        let flooder = std::thread::Builder::new()
            .name("flood-A".into())
            .spawn_scoped(s, move || -> Res<()> {
                pin_current(flood_cpu)?;
                set_nice(flood_nice)?;
                let r = flood(&mut a_vmm, window, run, quit, done);
                if r.is_err() {
                    quit.store(true, Ordering::Release);
                }
                r
            })?;
        let mut w = World {
            daemon: &daemon,
            probe,
            stream,
            run,
            done,
        };
        let out = scenarios(&args, &mut w);
        quit.store(true, Ordering::Release);
        run.store(false, Ordering::Release);
        let f = flooder
            .join()
            .map_err(|_| BoxError::from("flood thread panicked"))?;
        out.and(f)
    });
    result?;
    let t = daemon.traffic(A);
    println!(
        "  daemon counters: A ctrl_cmds {} ctrl_errors {} (mean {:.1} us), B ctrl_cmds {}",
        t.ctrl_cmds,
        t.ctrl_errors,
        t.ctrl_latency.sum_ns as f64 / t.ctrl_latency.count.max(1) as f64 / 1e3,
        daemon.traffic(B).ctrl_cmds
    );
    Ok(())
}

fn scenarios(args: &Args, w: &mut World<'_>) -> Res<()> {
    println!("  placement now: {}", thread_placement());
    let (mut alone, mut flooded, mut limited) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..args.runs {
        println!("run {}:", r + 1);
        let s = w.measure(args, false)?;
        print_sample("alone", &s);
        alone.push(s);
        let s = w.measure(args, true)?;
        print_sample("A floods", &s);
        flooded.push(s);
        if args.limit > 0 {
            let spec = QosSpec {
                ctrl_per_sec: args.limit,
                ..QosSpec::default()
            };
            w.daemon.daemon().qos().set_vm(A, spec)?;
            let s = w.measure(args, true)?;
            w.daemon.daemon().qos().set_vm(A, QosSpec::unlimited())?;
            print_sample("A limited", &s);
            limited.push(s);
        }
    }
    println!(
        "medians over {} runs (ratios: scenario / alone; latency > 1 is slower, stream < 1 is slower):",
        args.runs
    );
    let mut rows = vec![("alone", &alone), ("A floods", &flooded)];
    if args.limit > 0 {
        rows.push(("A limited", &limited));
    }
    let base = (
        med(&alone, |s| s.probe.pd_p50),
        med(&alone, |s| s.probe.pd_p99),
        med(&alone, |s| s.probe.qp_p50),
        med(&alone, |s| s.probe.qp_p99),
        med(&alone, |s| s.stream),
    );
    for (name, v) in rows {
        let m = Sample {
            probe: Probe {
                pd_p50: med(v, |s| s.probe.pd_p50),
                pd_p99: med(v, |s| s.probe.pd_p99),
                qp_p50: med(v, |s| s.probe.qp_p50),
                qp_p99: med(v, |s| s.probe.qp_p99),
            },
            stream: med(v, |s| s.stream),
            flood_rate: med(v, |s| s.flood_rate),
        };
        print_sample(name, &m);
        println!(
            "  {:<14} ratios: PD p50 x{:.2} p99 x{:.2} | MODIFY_QP p50 x{:.2} p99 x{:.2} | stream x{:.3}",
            "",
            m.probe.pd_p50 / base.0,
            m.probe.pd_p99 / base.1,
            m.probe.qp_p50 / base.2,
            m.probe.qp_p99 / base.3,
            m.stream / base.4
        );
    }
    if args.limit > 0 {
        println!("  (A limited: ctrl_per_sec {} for VM A)", args.limit);
    }
    Ok(())
}
