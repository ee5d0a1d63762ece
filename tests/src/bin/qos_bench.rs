//! QoS benchmarks of the software RNIC engine (Husky / Justitia style),
//! each measured over several runs in one command and printed with
//! medians, ratios and a PASS/MISS verdict against its target:
//!
//! 1. `lat`: a latency-sensitive tenant (64-byte RDMA WRITE, one at a time,
//!    post to completion) alone, and next to a bandwidth hog in another
//!    tenant (64 KiB WRITEs on many QPs with deep queues) — without QoS,
//!    with weights (hog at the smallest weight), and with the hog's tenant
//!    rate-limited. Target: p99 ≤ 2 × alone and throughput ≥ 0.9 × alone.
//! 2. `limits`: configured rate limits (bytes/s and ops/s, per VM and per
//!    tenant with two VMs) against saturating senders. Target: ±5 %.
//! 3. `shares`: weights 1:2:4 among three saturating VMs. Target: each
//!    share within ±5 % of its ideal share (1/7, 2/7, 4/7).
//! 4. `change`: a limit changed mid-run through the live QoS table (what
//!    the management API calls). Target: both rates within ±5 %.
//!
//! Rates are read from the daemon's per-VM traffic counters (bytes and
//! work requests the engine executed) over a window that starts after a
//! warm-up. Senders post from one thread pinned to the client CPU and sleep
//! while their queues are full, so they leave that CPU to the latency
//! client; the daemon (engine and vhost-user threads) runs on the engine
//! CPU.
//!
//! Nothing here asserts a timing: the verdicts are printed.
//!
//! Run: `cargo run --release -p vhost-user-rdma-tests --bin qos_bench`
//! (see docs/isolation.md, section "QoS benchmarks").

use std::error::Error as StdError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use vhost_user_rdma::config::TenantConfig;
use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma_tests::bench::{
    lat_client, loadavg, median, pin_current, print_header, thread_placement, verdict, LatResult,
    LAT_WINDOW,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpCap, QpInit, RcConnect, SendFlags, SendOp, SendWr,
    Sge, WorkCompletion,
};

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
const MIB: f64 = 1_048_576.0;
/// Buffers this aligned are guest-physically contiguous in the test VMM
/// (as hugepages in a real guest).
const CONTIGUOUS: usize = 2 << 20;
/// Sleep of a sender whose queues are all full (they hold milliseconds of
/// work).
const NAP: Duration = Duration::from_millis(1);
/// The same for the hog: rarer wake-ups disturb the latency client less
/// (its queues hold tens of milliseconds of work).
const HOG_NAP: Duration = Duration::from_millis(2);
/// Warm-up before every measured window.
const WARMUP: Duration = Duration::from_millis(300);

#[derive(Parser, Debug)]
#[command(about = "QoS benchmarks of vhost-user-rdma's engine (see docs/isolation.md)")]
struct Args {
    /// Comma-separated: lat, limits, shares, change, or all.
    #[arg(default_value = "all")]
    tests: String,
    /// Runs of every measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds of every measured window.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Tiny version (smoke test).
    #[arg(long)]
    quick: bool,
    /// CPU of the clients (latency client and senders).
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of the daemon (engine).
    #[arg(long, default_value_t = 1)]
    engine_cpu: usize,
    /// Engine threads; the benchmark's tenants are placed on them in
    /// turn (in `lat`: the latency tenant on thread 0, the hog's on 1).
    #[arg(long, default_value_t = 1)]
    engine_threads: usize,
    /// CPUs of the engine threads, one each (default: all on
    /// --engine-cpu).
    #[arg(long, value_delimiter = ',')]
    engine_cpus: Vec<usize>,
    /// Message size of the saturating senders (limits, shares, change).
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Message sizes of the bandwidth hog (comma-separated; the latency
    /// benchmark runs once per size).
    #[arg(long, default_value = "65536,1048576")]
    hog_sizes: String,
    /// QPs of the hog.
    #[arg(long, default_value_t = 8)]
    hog_qps: usize,
    /// Outstanding WRITEs per hog QP: deep, because the hog's sender runs
    /// at nice 19 next to the spinning latency client and gets the CPU
    /// only now and then.
    #[arg(long, default_value_t = 2048)]
    hog_depth: usize,
    /// Outstanding WRITEs per sender QP (limits, shares, change).
    #[arg(long, default_value_t = 512)]
    depth: usize,
    /// Weight of the hog VM in the "weights" scenario (the latency VM has
    /// 1000).
    #[arg(long, default_value_t = 1)]
    hog_weight: u32,
    /// Bytes limit of the hog's tenant in the "limited" scenario, MiB/s.
    #[arg(long, default_value_t = 256)]
    hog_limit_mib: u64,
}

// ---------------------------------------------------------------------------
// VMs, buffers, QPs

struct Vm {
    dev: Device,
    pd: Arc<Pd>,
}

fn open_vm(sock: &PathBuf) -> Res<Vm> {
    let vmm = TestVmm::connect(sock, VmmOptions::default())?;
    let t = VmmTransport::new(vmm)?;
    let dev = Device::open(t)?;
    let pd = Pd::alloc(&dev)?;
    Ok(Vm { dev, pd })
}

struct Buf {
    _buf: Arc<DmaBuf>,
    mr: Mr,
}

impl Buf {
    fn new(vm: &Vm, len: usize) -> Res<Buf> {
        let buf = Arc::new(vm.dev.alloc_dma(len, CONTIGUOUS)?);
        buf.fill(0, len, 0xA5)?;
        let mr = Mr::register(&vm.pd, buf.clone(), access::ALL)?;
        Ok(Buf { _buf: buf, mr })
    }
    fn sge(&self, len: usize) -> Res<Sge> {
        Ok(self.mr.sge(0, u32::try_from(len)?)?)
    }
}

fn rc_qp(vm: &Vm, cq: &Arc<Cq>, depth: usize) -> Res<Qp> {
    let mut init = QpInit::rc(cq);
    init.cap = QpCap {
        // Room for the window plus completions seen before the device's
        // consumer index moves.
        max_send_wr: u32::try_from(2 * depth.max(8))?,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    Ok(Qp::create(&vm.pd, &init)?)
}

fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    RcConnect::new(peer.qpn(), peer_vm.dev.gid())
}

/// An RC QP pair from `a` to `b` (each on the given CQ).
fn pair(a: &Vm, ca: &Arc<Cq>, b: &Vm, cb: &Arc<Cq>, depth: usize) -> Res<(Qp, Qp)> {
    let qa = rc_qp(a, ca, depth)?;
    let qb = rc_qp(b, cb, depth)?;
    qa.rc_connect(QP_ACCESS, &conn(&qb, b))?;
    qb.rc_connect(QP_ACCESS, &conn(&qa, a))?;
    Ok((qa, qb))
}

/// A saturating stream of `size`-byte RDMA WRITEs from one VM into
/// another over `qps` QPs, each kept `depth` deep (posted in chunks whose
/// last WQE is signaled).
struct Stream {
    cq: Arc<Cq>,
    qps: Vec<Qp>,
    _peers: Vec<Qp>,
    src: Buf,
    dst: Buf,
    size: usize,
    chunk: usize,
    depth: usize,
    outstanding: Vec<usize>,
}

impl Stream {
    fn new(a: &Vm, b: &Vm, qps: usize, depth: usize, size: usize) -> Res<Stream> {
        let chunk = (depth / 4).max(1);
        let cq = Cq::create(&a.dev, u32::try_from((qps * depth / chunk + 16).max(64))?)?;
        let cb = Cq::create(&b.dev, 64)?;
        let mut q = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..qps {
            let (qa, qb) = pair(a, &cq, b, &cb, depth)?;
            q.push(qa);
            peers.push(qb);
        }
        Ok(Stream {
            cq,
            qps: q,
            _peers: peers,
            src: Buf::new(a, size)?,
            dst: Buf::new(b, size)?,
            size,
            chunk,
            depth,
            outstanding: vec![0; qps],
        })
    }

    /// Reaps completions and tops every QP up; true if anything happened.
    fn pump(&mut self, wc: &mut [WorkCompletion]) -> Res<bool> {
        let mut any = false;
        loop {
            let k = self.cq.poll(wc);
            for w in &wc[..k] {
                if !w.is_success() {
                    return Err(format!("hog completion with error: {w:?}").into());
                }
                let i = usize::try_from(w.wr_id)?;
                if let Some(o) = self.outstanding.get_mut(i) {
                    *o = o.saturating_sub(self.chunk);
                }
            }
            any |= k > 0;
            if k < wc.len() {
                break;
            }
        }
        let sge = [self.src.sge(self.size)?];
        let op = SendOp::RdmaWrite {
            remote_addr: self.dst.mr.iova(),
            rkey: self.dst.mr.rkey(),
        };
        let mut wrs = Vec::with_capacity(self.chunk);
        for (i, qp) in self.qps.iter().enumerate() {
            while self.outstanding[i] + self.chunk <= self.depth {
                wrs.clear();
                for j in 0..self.chunk {
                    wrs.push(SendWr {
                        wr_id: i as u64,
                        op,
                        payload: Payload::Sges(&sge),
                        flags: if j + 1 == self.chunk {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        },
                        ud: None,
                    });
                }
                qp.post_send(&wrs)?;
                self.outstanding[i] += self.chunk;
                any = true;
            }
        }
        Ok(any)
    }
}

/// Runs `streams` on a thread pinned to `cpu` until `stop`; the thread
/// sleeps for `nap` while every queue is full. The hog runs at nice 19,
/// leaving the CPU to the latency client (it shares that CPU: there are
/// only two); the other senders at the normal priority, so that compile
/// jobs of others on the machine do not starve them.
fn spawn_senders<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    cpu: usize,
    mut streams: Vec<Stream>,
    stop: &'s AtomicBool,
    nap: Duration,
    nice: i32,
) -> std::thread::ScopedJoinHandle<'s, Res<()>> {
    s.spawn(move || -> Res<()> {
        pin_current(cpu)?;
        // SAFETY: plain system calls on the calling thread (Linux keeps the
        // nice value per thread); no memory is passed.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid).unwrap_or(0), nice)
        };
        if nice != 0 && rc != 0 {
            eprintln!(
                "cannot lower the sender's priority: {}",
                std::io::Error::last_os_error()
            );
        }
        let mut wc = [WorkCompletion::default(); 64];
        while !stop.load(Ordering::Relaxed) {
            let mut any = false;
            for st in streams.iter_mut() {
                any |= st.pump(&mut wc)?;
            }
            if !any {
                std::thread::sleep(nap);
            }
        }
        Ok(())
    })
}

fn join(h: std::thread::ScopedJoinHandle<'_, Res<()>>) -> Res<()> {
    h.join()
        .map_err(|_| BoxError::from("sender thread panicked"))?
}

// ---------------------------------------------------------------------------
// Daemon and statistics

/// Starts a daemon with `vms` VMs in the given tenants (names; `default`
/// is the implicit one) from a thread pinned to the engine CPU, so the
/// engine and the vhost-user threads run there.
fn daemon(args: &Args, tenants: &[&str]) -> Res<TestDaemon> {
    let tenants: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
    let cpu = args.engine_cpu;
    let threads = args.engine_threads.max(1);
    let cpus = if args.engine_cpus.is_empty() {
        vec![cpu; threads]
    } else {
        args.engine_cpus.clone()
    };
    std::thread::scope(|s| {
        s.spawn(move || -> Res<TestDaemon> {
            pin_current(cpu)?;
            Ok(TestDaemon::with_config(tenants.len(), |c| {
                c.engine_threads = threads;
                c.engine_cpus = cpus;
                let mut placed = 0;
                for (i, t) in tenants.iter().enumerate() {
                    if !c.tenants.iter().any(|x| &x.name == t) {
                        c.tenants.push(TenantConfig {
                            nic_share: 1,
                            name: t.clone(),
                            qos_class: None,
                            engine: Some(placed % threads),
                            remote_gids: Vec::new(),
                            fabric: Default::default(),
                        });
                        placed += 1;
                    }
                    c.vms[i].tenant = t.clone();
                }
            })?)
        })
        .join()
        .map_err(|_| BoxError::from("launcher panicked"))?
    })
}

fn sockets(d: &TestDaemon, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| d.socket(i).to_path_buf()).collect()
}

/// Bytes and work requests VM `vm` has executed so far.
fn sent(d: &TestDaemon, vm: usize) -> (u64, u64) {
    d.daemon()
        .tenancy()
        .traffic(vm)
        .map(|t| {
            let s = t.snapshot();
            (s.send_bytes, s.send_ops)
        })
        .unwrap_or_default()
}

/// Rates (bytes/s, ops/s) of `vms` over `secs` seconds.
fn rates(d: &TestDaemon, vms: &[usize], secs: f64) -> Vec<(f64, f64)> {
    let before: Vec<(u64, u64)> = vms.iter().map(|&v| sent(d, v)).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let dt = t0.elapsed().as_secs_f64();
    vms.iter()
        .zip(before)
        .map(|(&v, (b0, o0))| {
            let (b1, o1) = sent(d, v);
            ((b1 - b0) as f64 / dt, (o1 - o0) as f64 / dt)
        })
        .collect()
}

fn spec(weight: u32, bytes_per_sec: u64, ops_per_sec: u64) -> QosSpec {
    QosSpec {
        weight,
        bytes_per_sec,
        ops_per_sec,
        ..QosSpec::default()
    }
}

// ---------------------------------------------------------------------------
// 1. Latency next to a hog

fn bench_lat(args: &Args, secs: f64, hog_size: usize) -> Res<Vec<String>> {
    println!("\n== 1. latency-sensitive tenant next to a bandwidth hog ==");
    println!(
        "  latency: VM0 -> VM1 (tenant lat), one {} B RDMA WRITE at a time, post to completion, spinning on the CQ; ops/s = median of {} ms windows",
        64,
        LAT_WINDOW.as_millis()
    );
    println!(
        "  hog: VM2 -> VM3 (tenant bulk), {} B RDMA WRITEs on {} QPs, {} outstanding each",
        hog_size, args.hog_qps, args.hog_depth
    );
    let d = daemon(args, &["lat", "lat", "bulk", "bulk"])?;
    let socks = sockets(&d, 4);
    let vms: Vec<Vm> = socks.iter().map(open_vm).collect::<Res<_>>()?;
    let lcq = Cq::create(&vms[0].dev, 64)?;
    let lcb = Cq::create(&vms[1].dev, 64)?;
    let (lq, _lqb) = pair(&vms[0], &lcq, &vms[1], &lcb, 8)?;
    let lsrc = Buf::new(&vms[0], 4096)?;
    let ldst = Buf::new(&vms[1], 4096)?;
    let qos = d.daemon().qos().clone();
    let bulk = d.daemon().tenancy().tenant_of(2).unwrap_or(0);
    let lat_t = d.daemon().tenancy().tenant_of(0).unwrap_or(0);
    let scenarios: [(&str, &str); 5] = [
        ("alone", "no hog"),
        (
            "hog only",
            "the hog alone, no latency client (its rate for reference)",
        ),
        ("no QoS", "hog, default weights, no limits"),
        (
            "weights",
            "latency tenant and VM weight 1000, the hog's --hog-weight",
        ),
        ("limited", "hog's tenant limited to --hog-limit-mib MiB/s"),
    ];
    // results[scenario] = (p50s, p99s, ops, hog MiB/s) over runs
    let mut res: Vec<[Vec<f64>; 4]> = (0..scenarios.len()).map(|_| Default::default()).collect();
    let stop = AtomicBool::new(false);
    let mut streams = Some(vec![Stream::new(
        &vms[2],
        &vms[3],
        args.hog_qps,
        args.depth,
        hog_size,
    )?]);
    for run in 0..args.runs {
        for (k, (name, _)) in scenarios.iter().enumerate() {
            // QoS of this scenario.
            let lat_w = if *name == "weights" { 1000 } else { 100 };
            let hog_w = if *name == "weights" {
                args.hog_weight
            } else {
                100
            };
            qos.set_vm(0, spec(lat_w, 0, 0))?;
            qos.set_vm(2, spec(hog_w, 0, 0))?;
            let limit = if *name == "limited" {
                args.hog_limit_mib << 20
            } else {
                0
            };
            // Different tenants share by their tenants' weights.
            qos.set_tenant(lat_t, spec(lat_w, 0, 0))?;
            qos.set_tenant(bulk, spec(hog_w, limit, 0))?;
            let hog = *name != "alone";
            let client = *name != "hog only";
            let (lat, hog_rate) = std::thread::scope(|s| -> Res<(LatResult, f64)> {
                stop.store(false, Ordering::Relaxed);
                let h = if hog {
                    let st = streams.take().unwrap_or_default();
                    Some(spawn_senders(s, args.client_cpu, st, &stop, HOG_NAP, 19))
                } else {
                    None
                };
                std::thread::sleep(WARMUP);
                let b0 = sent(&d, 2).0;
                let t0 = Instant::now();
                let lat = if client {
                    let op = SendOp::RdmaWrite {
                        remote_addr: ldst.mr.iova(),
                        rkey: ldst.mr.rkey(),
                    };
                    lat_client(&lcq, &lq, lsrc.sge(64)?, op, secs)
                } else {
                    std::thread::sleep(Duration::from_secs_f64(secs));
                    Ok(LatResult {
                        p50: f64::NAN,
                        p90: f64::NAN,
                        p99: f64::NAN,
                        p999: f64::NAN,
                        max: f64::NAN,
                        ops: f64::NAN,
                    })
                };
                let hog_rate = (sent(&d, 2).0 - b0) as f64 / t0.elapsed().as_secs_f64() / MIB;
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = h {
                    join(h)?;
                }
                Ok((lat?, hog_rate))
            })?;
            if hog && streams.is_none() {
                // The stream went into the thread: rebuild it (its queues
                // drain when its QPs are destroyed).
                streams = Some(vec![Stream::new(
                    &vms[2],
                    &vms[3],
                    args.hog_qps,
                    args.hog_depth,
                    hog_size,
                )?]);
            }
            println!(
                "  run {}: {:<8} p50 {:>7.2} us  p99 {:>7.2} us  p99.9 {:>8.2} us  max {:>9.1} us  {:>9.0} ops/s   hog {:>8.1} MiB/s",
                run + 1,
                name,
                lat.p50,
                lat.p99,
                lat.p999,
                lat.max,
                lat.ops,
                hog_rate
            );
            res[k][0].push(lat.p50);
            res[k][1].push(lat.p99);
            res[k][2].push(lat.ops);
            res[k][3].push(hog_rate);
        }
    }
    qos.set_vm(0, QosSpec::default())?;
    qos.set_vm(2, QosSpec::default())?;
    qos.set_tenant(bulk, QosSpec::default())?;
    qos.set_tenant(lat_t, QosSpec::default())?;
    let alone_p99 = median(&res[0][1]);
    let alone_ops = median(&res[0][2]);
    println!(
        "  medians over {} runs (target: p99 <= 2 x alone, ops >= 0.9 x alone):",
        args.runs
    );
    let mut summary = Vec::new();
    for (k, (name, what)) in scenarios.iter().enumerate() {
        let p99 = median(&res[k][1]);
        let ops = median(&res[k][2]);
        let (rp, ro) = (p99 / alone_p99, ops / alone_ops);
        let v = if k <= 1 {
            "-"
        } else {
            verdict(rp <= 2.0 && ro >= 0.9)
        };
        println!(
            "    {:<8} p50 {:>7.2} us  p99 {:>7.2} us ({:>5.2} x alone)  {:>9.0} ops/s ({:>4.2} x alone)  hog {:>8.1} MiB/s  {v}   [{what}]",
            name,
            median(&res[k][0]),
            p99,
            rp,
            ops,
            ro,
            median(&res[k][3]),
        );
        summary.push(format!(
            "lat.hog{}.{}: p99 {:.2} us ({:.2}x), ops {:.0}/s ({:.2}x), hog {:.0} MiB/s {v}",
            hog_size,
            name.replace(' ', "_"),
            p99,
            rp,
            ops,
            ro,
            median(&res[k][3])
        ));
    }
    Ok(summary)
}

// ---------------------------------------------------------------------------
// 2. Rate limits

fn bench_limits(args: &Args, secs: f64) -> Res<Vec<String>> {
    println!("\n== 2. configured rate limits against saturating senders ==");
    // VM0, VM1: tenant t1, write into VM2 (t1). Each sender: 4 QPs.
    let d = daemon(args, &["t1", "t1", "t1"])?;
    let socks = sockets(&d, 3);
    let vms: Vec<Vm> = socks.iter().map(open_vm).collect::<Res<_>>()?;
    let qos = d.daemon().qos().clone();
    let small = 64usize;
    // (name, per-VM spec, tenant spec, senders, message size, target, unit is bytes)
    let mib = |m: u64| m << 20;
    let cases: Vec<(&str, QosSpec, QosSpec, usize, usize, f64, bool)> = vec![
        (
            "VM bytes 200 MiB/s",
            spec(100, mib(200), 0),
            QosSpec::default(),
            1,
            args.size,
            200.0 * MIB,
            true,
        ),
        (
            "VM ops 20000/s (64 B)",
            spec(100, 0, 20_000),
            QosSpec::default(),
            1,
            small,
            20_000.0,
            false,
        ),
        (
            "tenant bytes 300 MiB/s, 2 VMs",
            QosSpec::default(),
            spec(100, mib(300), 0),
            2,
            args.size,
            300.0 * MIB,
            true,
        ),
        (
            "tenant ops 30000/s, 2 VMs (64 B)",
            QosSpec::default(),
            spec(100, 0, 30_000),
            2,
            small,
            30_000.0,
            false,
        ),
    ];
    let mut summary = Vec::new();
    for (name, vm_spec, t_spec, senders, size, target, bytes) in cases {
        let mut got = Vec::new();
        let mut per_vm = Vec::new();
        for _ in 0..args.runs {
            for v in 0..2 {
                qos.set_vm(v, vm_spec)?;
            }
            let tenant = d.daemon().tenancy().tenant_of(0).unwrap_or(0);
            qos.set_tenant(tenant, t_spec)?;
            let streams: Vec<Stream> = (0..senders)
                .map(|v| Stream::new(&vms[v], &vms[2], 4, args.depth, size))
                .collect::<Res<_>>()?;
            let stop = AtomicBool::new(false);
            let r = std::thread::scope(|s| -> Res<Vec<(f64, f64)>> {
                let h = spawn_senders(s, args.client_cpu, streams, &stop, NAP, 0);
                std::thread::sleep(WARMUP);
                let r = rates(&d, &(0..senders).collect::<Vec<_>>(), secs);
                stop.store(true, Ordering::Relaxed);
                join(h)?;
                Ok(r)
            })?;
            let total: f64 = r.iter().map(|x| if bytes { x.0 } else { x.1 }).sum();
            got.push(total);
            per_vm.push(
                r.iter()
                    .map(|x| if bytes { x.0 / MIB } else { x.1 })
                    .collect::<Vec<_>>(),
            );
            // Let the queues of the destroyed QPs settle.
            for v in 0..2 {
                qos.set_vm(v, QosSpec::default())?;
            }
            qos.set_tenant(tenant, QosSpec::default())?;
        }
        let m = median(&got);
        let ratio = m / target;
        let unit = if bytes { "MiB/s" } else { "ops/s" };
        let scale = if bytes { MIB } else { 1.0 };
        let runs: Vec<String> = got.iter().map(|g| format!("{:.1}", g / scale)).collect();
        let v = verdict((ratio - 1.0).abs() <= 0.05);
        println!(
            "  {name:<34} target {:>9.1} {unit}  got {:>9.1} {unit} (runs {}; per VM last run {:?})  ratio {:.3}  {v}",
            target / scale,
            m / scale,
            runs.join(", "),
            per_vm.last().map(|p| p.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>()).unwrap_or_default(),
            ratio
        );
        summary.push(format!("limits.{name}: ratio {ratio:.3} {v}"));
    }
    Ok(summary)
}

// ---------------------------------------------------------------------------
// 3. Weighted shares

fn bench_shares(args: &Args, secs: f64) -> Res<Vec<String>> {
    println!("\n== 3. weighted shares among saturating VMs ==");
    let mut summary = Vec::new();
    // VM weights within one tenant: VM0, VM1, VM2 write into VM3.
    let weights = [100u32, 200, 400];
    let wsum: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    summary.push(shares_case(
        args,
        secs,
        &format!("one tenant, VM weights {weights:?}"),
        "shares 1:2:4",
        &["t", "t", "t", "t"],
        &[(0, 3), (1, 3), (2, 3)],
        &weights,
        &[],
        &weights.map(|w| f64::from(w) / wsum),
    )?);
    // Tenants first: tenant a (VM0 -> VM3) and tenant b (VM1, VM2 -> VM4),
    // equal weights everywhere: a gets half, b's two VMs a quarter each.
    summary.push(shares_case(
        args,
        secs,
        "tenants a (1 VM) and b (2 VMs), equal weights",
        "tenant shares 1:1",
        &["a", "b", "b", "a", "b"],
        &[(0, 3), (1, 4), (2, 4)],
        &[100, 100, 100],
        &[("a", 100), ("b", 100)],
        &[0.5, 0.25, 0.25],
    )?);
    Ok(summary)
}

/// One weighted-shares measurement: `senders` (source VM, sink VM) stream
/// saturating WRITEs; the sources have VM weights `weights` and the named
/// tenants `tenant_weights`; every run's shares of the bytes moved are
/// compared with `ideal` (±5 %).
#[allow(clippy::too_many_arguments)]
fn shares_case(
    args: &Args,
    secs: f64,
    title: &str,
    label: &str,
    tenants: &[&str],
    senders: &[(usize, usize)],
    weights: &[u32],
    tenant_weights: &[(&str, u32)],
    ideal: &[f64],
) -> Res<String> {
    println!(
        "  {title}: {} B messages on 4 QPs x {} outstanding per sender",
        args.size, args.depth
    );
    let d = daemon(args, tenants)?;
    let socks = sockets(&d, tenants.len());
    let vms: Vec<Vm> = socks.iter().map(open_vm).collect::<Res<_>>()?;
    let qos = d.daemon().qos().clone();
    let src: Vec<usize> = senders.iter().map(|&(s, _)| s).collect();
    for (&v, &w) in src.iter().zip(weights) {
        qos.set_vm(v, spec(w, 0, 0))?;
    }
    for &(name, w) in tenant_weights {
        let t = d
            .daemon()
            .tenancy()
            .tenants()
            .iter()
            .position(|t| t.name == name)
            .ok_or("no such tenant")?;
        qos.set_tenant(
            t,
            QosSpec {
                weight: w,
                ..QosSpec::unlimited()
            },
        )?;
    }
    d.daemon().sync_qos(Duration::from_secs(5));
    let mut shares: Vec<Vec<f64>> = vec![Vec::new(); senders.len()];
    let mut totals = Vec::new();
    for run in 0..args.runs {
        let streams: Vec<Stream> = senders
            .iter()
            .map(|&(s, t)| Stream::new(&vms[s], &vms[t], 4, args.depth, args.size))
            .collect::<Res<_>>()?;
        let stop = AtomicBool::new(false);
        let r = std::thread::scope(|s| -> Res<Vec<(f64, f64)>> {
            let h = spawn_senders(s, args.client_cpu, streams, &stop, NAP, 0);
            std::thread::sleep(WARMUP);
            let r = rates(&d, &src, secs);
            stop.store(true, Ordering::Relaxed);
            join(h)?;
            Ok(r)
        })?;
        let total: f64 = r.iter().map(|x| x.0).sum();
        let line: Vec<String> = r
            .iter()
            .map(|x| format!("{:.1} MiB/s ({:.3})", x.0 / MIB, x.0 / total))
            .collect();
        println!(
            "  run {}: total {:.1} MiB/s: {}",
            run + 1,
            total / MIB,
            line.join(", ")
        );
        totals.push(total / MIB);
        for (v, x) in r.iter().enumerate() {
            shares[v].push(x.0 / total);
        }
    }
    let mut all_ok = true;
    let mut parts = Vec::new();
    for (k, &v) in src.iter().enumerate() {
        let m = median(&shares[k]);
        let ok = (m / ideal[k] - 1.0).abs() <= 0.05;
        all_ok &= ok;
        println!(
            "    VM{v} (tenant {}, weight {}): share {:.3} (ideal {:.3}, ratio {:.3}) {}",
            tenants[v],
            weights[k],
            m,
            ideal[k],
            m / ideal[k],
            verdict(ok)
        );
        parts.push(format!("{:.3}/{:.3}", m, ideal[k]));
    }
    println!(
        "  median total {:.1} MiB/s; verdict {}",
        median(&totals),
        verdict(all_ok)
    );
    Ok(format!("{label}: {} {}", parts.join(" "), verdict(all_ok)))
}

// ---------------------------------------------------------------------------
// 4. Run-time change

fn bench_change(args: &Args, secs: f64) -> Res<Vec<String>> {
    println!("\n== 4. a limit changed mid-run through the live QoS table ==");
    let d = daemon(args, &["t", "t"])?;
    let socks = sockets(&d, 2);
    let vms: Vec<Vm> = socks.iter().map(open_vm).collect::<Res<_>>()?;
    let qos = d.daemon().qos().clone();
    let (before, after) = (100u64, 300u64);
    println!(
        "  VM0 writes {} B messages into VM1 (4 QPs x {}); its bytes limit goes from {before} to {after} MiB/s mid-run, then is removed",
        args.size, args.depth
    );
    let mut b = Vec::new();
    let mut a = Vec::new();
    let mut free = Vec::new();
    let mut lag = Vec::new();
    for run in 0..args.runs {
        qos.set_vm(0, spec(100, before << 20, 0))?;
        let streams = vec![Stream::new(&vms[0], &vms[1], 4, args.depth, args.size)?];
        let stop = AtomicBool::new(false);
        let r = std::thread::scope(|s| -> Res<(f64, f64, f64, f64)> {
            let h = spawn_senders(s, args.client_cpu, streams, &stop, NAP, 0);
            std::thread::sleep(WARMUP);
            let r1 = rates(&d, &[0], secs)[0].0 / MIB;
            let t_change = Instant::now();
            let b0 = sent(&d, 0).0;
            qos.set_vm(0, spec(100, after << 20, 0))?;
            // How long until the engine runs at the new rate: the first
            // 1 ms slice moving more than the old rate allows.
            let mut last = b0;
            let mut lag = f64::NAN;
            while t_change.elapsed() < Duration::from_millis(100) {
                std::thread::sleep(Duration::from_millis(1));
                let now = sent(&d, 0).0;
                let moved = (now - last) as f64;
                last = now;
                if moved > 1.5 * (before << 20) as f64 / 1000.0 {
                    lag = t_change.elapsed().as_secs_f64() * 1e3;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
            let r2 = rates(&d, &[0], secs)[0].0 / MIB;
            qos.set_vm(0, QosSpec::default())?;
            std::thread::sleep(Duration::from_millis(100));
            let r3 = rates(&d, &[0], secs / 2.0)[0].0 / MIB;
            stop.store(true, Ordering::Relaxed);
            join(h)?;
            Ok((r1, r2, r3, lag))
        })?;
        println!(
            "  run {}: before {:.1} MiB/s, after {:.1} MiB/s (new rate visible after {:.1} ms), unlimited {:.1} MiB/s",
            run + 1,
            r.0,
            r.1,
            r.3,
            r.2
        );
        b.push(r.0);
        a.push(r.1);
        free.push(r.2);
        lag.push(r.3);
    }
    let (mb, ma) = (median(&b), median(&a));
    let ok = (mb / before as f64 - 1.0).abs() <= 0.05 && (ma / after as f64 - 1.0).abs() <= 0.05;
    println!(
        "  medians: before {mb:.1} MiB/s ({:.3} of {before}), after {ma:.1} MiB/s ({:.3} of {after}), applied after {:.1} ms, unlimited {:.1} MiB/s  {}",
        mb / before as f64,
        ma / after as f64,
        median(&lag),
        median(&free),
        verdict(ok)
    );
    qos.set_vm(0, QosSpec::default())?;
    Ok(vec![format!(
        "change {before}->{after} MiB/s: {mb:.1} -> {ma:.1} {}",
        verdict(ok)
    )])
}

// ---------------------------------------------------------------------------

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.quick {
        args.runs = 1;
        args.secs = args.secs.min(0.3);
        args.depth = args.depth.min(16);
        args.hog_depth = args.hog_depth.min(64);
        args.hog_qps = args.hog_qps.min(2);
    }
    let args = args;
    let secs = args.secs;
    print_header("qos_bench");
    println!(
        "  placement: clients on CPU {}, daemon (engine, vhost-user threads) on CPU {}; {} engine thread(s) on CPUs {:?}; {} runs of {} s each; MiB = 2^20 bytes",
        args.client_cpu,
        args.engine_cpu,
        args.engine_threads,
        if args.engine_cpus.is_empty() {
            vec![args.engine_cpu; args.engine_threads.max(1)]
        } else {
            args.engine_cpus.clone()
        },
        args.runs,
        secs
    );
    pin_current(args.client_cpu)?;
    let all = args.tests == "all";
    let want = |t: &str| all || args.tests.split(',').any(|x| x == t);
    let mut summary = Vec::new();
    if want("lat") {
        for size in args.hog_sizes.split(',') {
            let size: usize = size.trim().parse()?;
            summary.extend(bench_lat(&args, secs, size)?);
        }
    }
    if want("limits") {
        summary.extend(bench_limits(&args, secs)?);
    }
    if want("shares") {
        summary.extend(bench_shares(&args, secs)?);
    }
    if want("change") {
        summary.extend(bench_change(&args, secs)?);
    }
    println!("\n  threads by CPU: {}", thread_placement());
    println!("  load average at end: {}", loadavg());
    let cmdline: Vec<String> = std::env::args().collect();
    println!("\nsummary ({}):", cmdline.join(" "));
    for s in summary {
        println!("  {s}");
    }
    Ok(())
}
