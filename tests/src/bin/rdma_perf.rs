//! Data-path benchmarks of vhost-user-rdma in the style of perftest
//! (`ib_write_lat`, `ib_read_lat`, `ib_send_lat`, `ib_write_bw`,
//! `ib_send_bw`), measured in one run together with their baselines:
//!
//! 1. one-core `memcpy` bandwidth for the same message sizes (pinned to the
//!    engine's CPU);
//! 2. a bare polled ring: two threads, on the client's and the engine's
//!    CPUs, exchanging a 64-byte message through shared-memory SPSC rings
//!    (request ring + completion ring). Its round trip is the floor of
//!    post-to-completion latency on this machine;
//! 3. the message rate of that ring with the same window and selective
//!    signaling as the bandwidth tests.
//!
//! Two test VMs are connected to one in-process daemon (`TestDaemon`) and
//! use the reference guest driver (`virtio-rdma-driver`) over
//! `VmmTransport`; the QPs are RC QPs between the two VMs. The client
//! (which plays both VMs) is pinned to CPU 0, the daemon — and with it the
//! engine thread, which inherits the affinity of the thread that starts
//! the daemon — is started from a thread pinned to CPU 1.
//!
//! `--qps N --vms M` runs the scaling benchmark: N RC QPs spread over M VMs
//! (VM pairs 0-1, 2-3, ...; every QP is connected to a QP in its partner VM
//! and both ends post 64-byte RDMA WRITEs), compared with 10 QPs over the
//! same VMs.
//!
//! `--drain [--engine-threads 1,2]` measures per-engine-thread scaling
//! with the client out of the way: the send queues are filled while the
//! engine threads are held, then timed while they drain (`drain.rs`).
//!
//! Nothing here asserts a timing.
//!
//! Run: `cargo run --release -p vhost-user-rdma-tests --bin rdma_perf -- <test> [options]`
//! (see docs/benchmarks.md, section "Data path").

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use vhost::vhost_user::VhostUserProtocolFeatures;
use vhost_user_rdma_tests::bench::{loadavg, pin_current, print_header, thread_placement};
use vhost_user_rdma_tests::dirty_log::{log_bytes_for, DirtyLogFile};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpCap, QpInit, RcConnect, RecvWr, SendFlags, SendOp,
    SendWr, Sge, WorkCompletion,
};

// The drain mode has its own file; a bin crate root looks beside itself.
#[path = "rdma_perf/drain.rs"]
mod drain;

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
/// Largest message size of `-a`.
const MAX_SIZE: usize = 8 << 20;
/// A wait for a completion longer than this is an error (no hang).
const WAIT: Duration = Duration::from_secs(20);
const MB: f64 = 1_048_576.0;

#[derive(Parser, Debug)]
#[command(
    about = "perftest-style data-path benchmarks of vhost-user-rdma (see docs/benchmarks.md)"
)]
struct Args {
    /// write_lat, read_lat, send_lat, write_bw, send_bw or all (default:
    /// all, unless --qps is given).
    test: Option<String>,
    /// One message size in bytes.
    #[arg(long, short = 's')]
    size: Option<usize>,
    /// Every power-of-two size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long = "all-sizes")]
    all_sizes: bool,
    /// Iterations per size (latency default 10000, bandwidth default 20000;
    /// large sizes are capped by a byte budget, see --budget-mib).
    #[arg(long, short = 'n')]
    iters: Option<usize>,
    /// Bytes moved per size and repetition are capped at this many MiB
    /// (default 1024 for latency, 2048 for bandwidth).
    #[arg(long)]
    budget_mib: Option<usize>,
    /// Outstanding WQEs in the bandwidth tests.
    #[arg(long, default_value_t = 128)]
    tx_depth: usize,
    /// Selective signaling: every cq_mod-th WQE is signaled (default
    /// tx_depth / 2).
    #[arg(long)]
    cq_mod: Option<usize>,
    /// Messages up to this size are posted inline (copied into the WQE);
    /// at most 256 (the daemon's limit). Default 0: never.
    #[arg(long, default_value_t = 0)]
    inline: usize,
    /// Repetitions of every bandwidth measurement (default 3).
    #[arg(long)]
    reps: Option<usize>,
    /// Scaling mode: total number of QPs.
    #[arg(long)]
    qps: Option<usize>,
    /// Scaling mode: number of VMs (even).
    #[arg(long, default_value_t = 4)]
    vms: usize,
    /// Scaling mode: QPs of the reference run.
    #[arg(long, default_value_t = 10)]
    ref_qps: usize,
    /// Scaling mode: outstanding WQEs per QP (half of them per post, the
    /// last of each half signaled).
    #[arg(long, default_value_t = 16)]
    scale_depth: usize,
    /// Scaling mode: measured seconds per run (default 3).
    #[arg(long)]
    secs: Option<f64>,
    /// Skip the baselines.
    #[arg(long)]
    no_baselines: bool,
    /// A tiny version (smoke test).
    #[arg(long)]
    quick: bool,
    /// The client's CPU.
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// The daemon's (engine's) CPU.
    #[arg(long, default_value_t = 1)]
    engine_cpu: usize,
    /// Message buffers scattered over single guest pages (the worst case:
    /// every page a separate host run) instead of guest-physically
    /// contiguous 2 MiB-aligned memory, as a real guest gets from hugepages.
    #[arg(long)]
    scattered: bool,
    /// Shared-memory doorbell mode: the test VMM offers VIRTIO shared memory
    /// and producer indices go to doorbell slots (default: doorbell records
    /// in guest RAM).
    #[arg(long)]
    shmem: bool,
    /// The daemon's engine sets DB_FLAG_POLLING while it polls, and the
    /// driver then posts without a fence (spec 18.6; the daemon's
    /// --fence-elision). Default: off, as in the daemon.
    #[arg(long)]
    fence_elision: bool,
    /// Both VMs' VMMs set a dirty log (`SET_LOG_BASE`) and turn logging on
    /// (`VHOST_F_LOG_ALL`, spec 20.4), as during a live migration: every
    /// write of the daemon into guest RAM marks its pages. The log is not
    /// cleared during the run. Compare with and without in one run:
    /// `scripts/perf-ab.sh -x --dirty-log HEAD HEAD -- ...`.
    #[arg(long)]
    dirty_log: bool,
    /// Drain mode (per-engine-thread scaling): VM pair k (VMs 2k, 2k+1;
    /// --vms) is a tenant of its own on engine thread k mod T; with the
    /// engine threads held, every QP's send queue is filled with 64-byte
    /// RDMA WRITEs, then the threads are released and timed until every
    /// signaled completion is there while the client sleeps. Prints each
    /// thread's rate and CPU time per WQE, medians over --reps rounds
    /// (default 5), and a one- and two-thread memcpy baseline.
    #[arg(long)]
    drain: bool,
    /// Drain mode: the engine-thread counts to compare, e.g. `1,2`
    /// (default). Thread 0 runs on --engine-cpu, the others on the other
    /// CPUs in order (on 2 CPUs thread 1 shares the sleeping client's).
    #[arg(long, value_delimiter = ',')]
    engine_threads: Vec<usize>,
    /// Drain mode: RC QPs per VM (QP j of VM 2k is connected to QP j of
    /// VM 2k+1; both post).
    #[arg(long, default_value_t = 32)]
    drain_qps: usize,
    /// Drain mode: WQEs posted per QP and drain (its send queue's depth,
    /// at most 16384). The test VMM maps every ring page on its own: VMs x
    /// QPs x depth / 32 pages must stay well below vm.max_map_count.
    #[arg(long, default_value_t = 8192)]
    drain_depth: usize,
    /// Drain mode: every n-th WQE of a QP is signaled, and its last.
    #[arg(long, default_value_t = 512)]
    drain_signal: usize,
}

/// Whether the VMs use shared-memory doorbells (`--shmem`).
static SHMEM: AtomicBool = AtomicBool::new(false);
/// Whether the VMs' VMMs log dirty pages (`--dirty-log`).
static DIRTY_LOG: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    WriteLat,
    ReadLat,
    SendLat,
    WriteBw,
    SendBw,
}

impl Test {
    const ALL: [Test; 5] = [
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::WriteBw,
        Test::SendBw,
    ];

    fn key(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::WriteBw => "write_bw",
            Test::SendBw => "send_bw",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Test::WriteLat => "RDMA_Write Latency Test (post-to-completion of one signaled WRITE)",
            Test::ReadLat => "RDMA_Read Latency Test (post-to-completion of one signaled READ)",
            Test::SendLat => {
                "Send Latency Test (ping-pong: half of the SEND -> RECV -> SEND -> RECV round trip)"
            }
            Test::WriteBw => "RDMA_Write BW Test",
            Test::SendBw => "Send BW Test",
        }
    }

    fn is_lat(self) -> bool {
        matches!(self, Test::WriteLat | Test::ReadLat | Test::SendLat)
    }
}

/// Effective parameters.
struct Config {
    tests: Vec<Test>,
    sizes_lat: Vec<usize>,
    sizes_bw: Vec<usize>,
    lat_iters: usize,
    bw_iters: usize,
    lat_budget: usize,
    bw_budget: usize,
    tx_depth: usize,
    cq_mod: usize,
    inline: usize,
    reps: usize,
    baselines: bool,
    quick: bool,
}

impl Config {
    fn from_args(a: &Args) -> Res<Config> {
        let tests = match a.test.as_deref() {
            None if a.qps.is_some() || a.drain => Vec::new(),
            None | Some("all") => Test::ALL.to_vec(),
            Some(t) => vec![Test::ALL
                .into_iter()
                .find(|x| x.key() == t)
                .ok_or_else(|| {
                    format!("unknown test {t:?} (write_lat, read_lat, send_lat, write_bw, send_bw, all)")
                })?],
        };
        let all: Vec<usize> = (1..=23).map(|s| 1usize << s).collect();
        let (sizes_lat, sizes_bw) = match (a.size, a.all_sizes) {
            (Some(s), _) => {
                if s == 0 || s > MAX_SIZE {
                    return Err(format!("--size must be 1..={MAX_SIZE}").into());
                }
                (vec![s], vec![s])
            }
            (None, true) => (all.clone(), all),
            // perftest's defaults: 2 bytes for latency, 64 KiB for bandwidth.
            (None, false) => (vec![2], vec![65536]),
        };
        if a.tx_depth == 0 || a.tx_depth > 4096 {
            return Err("--tx-depth must be 1..=4096".into());
        }
        let cq_mod = a.cq_mod.unwrap_or((a.tx_depth / 2).max(1));
        if cq_mod == 0 || cq_mod > a.tx_depth {
            return Err("--cq-mod must be 1..=tx-depth".into());
        }
        if a.inline > 256 {
            return Err("--inline must be <= 256".into());
        }
        let q = a.quick;
        Ok(Config {
            tests,
            sizes_lat,
            sizes_bw,
            lat_iters: a.iters.unwrap_or(if q { 50 } else { 10_000 }).max(1),
            bw_iters: a.iters.unwrap_or(if q { 500 } else { 20_000 }).max(1),
            lat_budget: a.budget_mib.unwrap_or(if q { 8 } else { 1024 }) << 20,
            bw_budget: a.budget_mib.unwrap_or(if q { 16 } else { 2048 }) << 20,
            tx_depth: a.tx_depth,
            cq_mod,
            inline: a.inline,
            reps: a.reps.unwrap_or(if q { 1 } else { 3 }).max(1),
            baselines: !a.no_baselines,
            quick: q,
        })
    }

    fn lat_iters_for(&self, size: usize) -> usize {
        let min = if self.quick { 5 } else { 200 };
        (self.lat_budget / size).clamp(min.min(self.lat_iters), self.lat_iters)
    }

    fn bw_iters_for(&self, size: usize) -> usize {
        let min = (2 * self.tx_depth).min(self.bw_iters);
        (self.bw_budget / size).clamp(min, self.bw_iters.max(min))
    }
}

// ---------------------------------------------------------------------------
// CPU placement (as in ctrl_bench)

/// Runs `f` on a new thread pinned to `cpu` and returns its result.
fn on_cpu<T: Send>(cpu: usize, name: &str, f: impl FnOnce() -> Res<T> + Send) -> Res<T> {
    std::thread::scope(|s| {
        let h =
            std::thread::Builder::new()
                .name(name.into())
                .spawn_scoped(s, move || -> Res<T> {
                    pin_current(cpu)?;
                    f()
                })?;
        h.join()
            .map_err(|_| BoxError::from(format!("thread {name} panicked")))?
    })
}

// ---------------------------------------------------------------------------
// Statistics

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// perftest's latency columns, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
struct LatStats {
    n: usize,
    min: f64,
    max: f64,
    typical: f64,
    avg: f64,
    stdev: f64,
    p99: f64,
    p999: f64,
}

impl LatStats {
    /// Statistics of `samples` (nanoseconds), `scale` applied (0.5 for half
    /// round trips).
    fn of(samples: &[u64], scale: f64) -> LatStats {
        if samples.is_empty() {
            return LatStats::default();
        }
        let mut s: Vec<f64> = samples.iter().map(|&x| x as f64 * scale / 1e3).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let pct = |q: f64| {
            let rank = (q * n as f64).ceil() as usize;
            s[rank.clamp(1, n) - 1]
        };
        let avg = s.iter().sum::<f64>() / n as f64;
        let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        LatStats {
            n,
            min: s[0],
            max: s[n - 1],
            typical: pct(0.5),
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
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
// Baselines

/// One-core memcpy bandwidth (MB/s, 2^20 bytes) of `size`-byte copies
/// between two buffers: median of 5 repetitions of a byte budget.
fn memcpy_bw(size: usize, budget: usize) -> f64 {
    // Both buffers page-aligned, as guest buffers are. Where two heap
    // blocks happen to fall matters: with the destination 16 bytes past
    // the source modulo 4 KiB (two neighbouring blocks of one thread's
    // arena), glibc's `memcpy` of 32-128 KiB ran at a seventeenth of its
    // speed on this machine, which made the baseline meaningless.
    let mut src_mem = vec![0x5Au8; size + 4096];
    let mut dst_mem = vec![0u8; size + 4096];
    let src = page_aligned(&mut src_mem, size);
    let src: &[u8] = src;
    let dst = page_aligned(&mut dst_mem, size);
    let iters = (budget / size).clamp(16, 4_000_000);
    // Warm up (fault in, caches).
    for _ in 0..(iters / 10).max(2) {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
    }
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..iters {
            dst.copy_from_slice(black_box(src));
            black_box(&mut *dst);
        }
        let dt = t0.elapsed().as_secs_f64();
        rates.push((iters * size) as f64 / dt / MB);
    }
    median(&rates)
}

/// The page-aligned `size` bytes inside `buf` (which has a page to spare).
fn page_aligned(buf: &mut [u8], size: usize) -> &mut [u8] {
    let skip = buf.as_ptr().align_offset(4096);
    &mut buf[skip..skip + size]
}

/// A 64-byte ring slot: a sequence word (the "owner" of the slot) and
/// seven payload words (a WQE or CQE).
#[repr(align(64))]
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    data: [AtomicU64; 7],
}

/// A single-producer single-consumer ring of slots.
struct Ring {
    slots: Box<[Slot]>,
    mask: u64,
}

impl Ring {
    fn new(depth: usize) -> Ring {
        let depth = depth.next_power_of_two();
        Ring {
            slots: (0..depth).map(|_| Slot::default()).collect(),
            mask: depth as u64 - 1,
        }
    }

    fn slot(&self, i: u64) -> &Slot {
        // mask < len, so the index is in bounds.
        &self.slots[usize::try_from(i & self.mask).unwrap_or(0)]
    }

    /// Writes message `i` (payload, then the sequence word with release).
    fn produce(&self, i: u64, v: u64) {
        let s = self.slot(i);
        for (k, d) in s.data.iter().enumerate() {
            d.store(v ^ k as u64, Ordering::Relaxed);
        }
        s.seq.store(i + 1, Ordering::Release);
    }

    /// Whether message `i` is there; reads its payload.
    fn try_consume(&self, i: u64) -> Option<u64> {
        let s = self.slot(i);
        if s.seq.load(Ordering::Acquire) != i + 1 {
            return None;
        }
        Some(s.data.iter().fold(0, |a, d| a ^ d.load(Ordering::Relaxed)))
    }
}

struct RingResult {
    lat: LatStats,
    mpps: f64,
}

/// The bare polled-ring model: the client (this thread, `client_cpu`)
/// posts 64-byte "WQEs" into a request ring, a server thread on
/// `server_cpu` polls it and writes "CQEs" into a completion ring (every
/// message in the latency run; every `cq_mod`-th in the rate run).
fn ring_baseline(
    client_cpu: usize,
    server_cpu: usize,
    lat_iters: usize,
    rate_msgs: u64,
    tx_depth: usize,
    cq_mod: usize,
) -> Res<RingResult> {
    let req = Arc::new(Ring::new(tx_depth.max(1) * 2));
    let cq = Arc::new(Ring::new(tx_depth.max(1) * 2));
    let stop = Arc::new(AtomicBool::new(false));
    // Phase 1: every message completes. Phase 2: every cq_mod-th message
    // (and the last) completes. The server learns the phase from the
    // message index.
    let lat_total = lat_iters as u64 + 1000;
    let cq_mod = cq_mod.max(1) as u64;
    let server = {
        let (req, cq, stop) = (req.clone(), cq.clone(), stop.clone());
        std::thread::Builder::new()
            .name("ring-server".into())
            .spawn(move || -> Res<()> {
                pin_current(server_cpu)?;
                let (mut i, mut c) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let Some(v) = req.try_consume(i) else {
                        std::hint::spin_loop();
                        continue;
                    };
                    let signaled = i < lat_total || {
                        let k = i - lat_total + 1;
                        k % cq_mod == 0 || k == rate_msgs
                    };
                    if signaled {
                        cq.produce(c, v ^ i);
                        c += 1;
                    }
                    i += 1;
                }
                Ok(())
            })?
    };
    let deadline_err = || BoxError::from("ring baseline: no completion within 20 s");
    let run = || -> Res<RingResult> {
        pin_current(client_cpu)?;
        let (mut i, mut c) = (0u64, 0u64);
        let mut samples = Vec::with_capacity(lat_iters);
        let t_end = Instant::now() + WAIT;
        for k in 0..lat_total {
            let t0 = Instant::now();
            req.produce(i, k);
            i += 1;
            loop {
                if cq.try_consume(c).is_some() {
                    c += 1;
                    break;
                }
                std::hint::spin_loop();
                if Instant::now() > t_end {
                    return Err(deadline_err());
                }
            }
            if k >= 1000 {
                samples.push(ns(t0.elapsed()));
            }
        }
        // Message rate: window of tx_depth outstanding.
        let t0 = Instant::now();
        let (mut posted, mut done) = (0u64, 0u64);
        let depth = tx_depth as u64;
        let t_end = Instant::now() + WAIT;
        while done < rate_msgs {
            while posted < rate_msgs && posted - done < depth {
                req.produce(i, posted);
                i += 1;
                posted += 1;
            }
            while cq.try_consume(c).is_some() {
                c += 1;
                done = (done + cq_mod).min(rate_msgs);
            }
            if Instant::now() > t_end {
                return Err(deadline_err());
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        Ok(RingResult {
            lat: LatStats::of(&samples, 1.0),
            mpps: rate_msgs as f64 / dt / 1e6,
        })
    };
    let r = run();
    stop.store(true, Ordering::Relaxed);
    server
        .join()
        .map_err(|_| BoxError::from("ring server panicked"))??;
    r
}

// ---------------------------------------------------------------------------
// The two VMs

struct Vm {
    dev: Device,
    pd: Arc<Pd>,
    /// The dirty log, with `--dirty-log`.
    _log: Option<DirtyLogFile>,
}

fn open_vm(d: &TestDaemon, i: usize) -> Res<Vm> {
    let base = VmmOptions::default();
    let logging = DIRTY_LOG.load(Ordering::Relaxed);
    let opts = VmmOptions {
        shmem: SHMEM.load(Ordering::Relaxed),
        protocol_features: if logging {
            base.protocol_features | VhostUserProtocolFeatures::LOG_SHMFD
        } else {
            base.protocol_features
        },
        ..base
    };
    let end = opts.mem.regions.iter().map(|r| r.end()).max().unwrap_or(0);
    let mut vmm = d.connect_with(i, opts)?;
    let log = if logging {
        let log = DirtyLogFile::new(usize::try_from(log_bytes_for(end))?)?;
        vmm.set_log_base(&log, log.len() as u64, 0)?;
        vmm.set_log_all(true)?;
        Some(log)
    } else {
        None
    };
    let t = VmmTransport::new(vmm)?;
    let dev = Device::open(t)?;
    let pd = Pd::alloc(&dev)?;
    Ok(Vm { dev, pd, _log: log })
}

/// A registered buffer.
struct Buf {
    _buf: Arc<DmaBuf>,
    mr: Mr,
}

/// Alignment that makes the test VMM hand out one guest-physically
/// contiguous range (as hugepages do in a real guest).
const CONTIGUOUS: usize = 2 << 20;

impl Buf {
    /// `len` bytes of scattered guest pages.
    fn new(vm: &Vm, len: usize) -> Res<Buf> {
        Self::with_align(vm, len, 8)
    }

    /// `len` bytes aligned to `align` (see [`CONTIGUOUS`]).
    fn with_align(vm: &Vm, len: usize, align: usize) -> Res<Buf> {
        let buf = Arc::new(vm.dev.alloc_dma(len, align)?);
        buf.fill(0, len, 0xA5)?;
        let mr = Mr::register(&vm.pd, buf.clone(), access::ALL)?;
        Ok(Buf { _buf: buf, mr })
    }
    fn addr(&self, off: usize) -> u64 {
        self.mr.iova() + off as u64
    }
    fn sge(&self, off: usize, len: usize) -> Res<Sge> {
        Ok(self.mr.sge(off as u64, u32::try_from(len)?)?)
    }
}

fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    let mut c = RcConnect::new(peer.qpn(), peer_vm.dev.gid());
    let attr = peer_vm.dev.attr();
    c.max_rd_atomic = attr.max_qp_init_rd_atom.min(16);
    c.max_dest_rd_atomic = attr.max_qp_rd_atom.min(16);
    c
}

fn rc_qp(vm: &Vm, cq: &Arc<Cq>, cap: QpCap) -> Res<Qp> {
    let mut init = QpInit::rc(cq);
    init.cap = cap;
    Ok(Qp::create(&vm.pd, &init)?)
}

fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) -> Res<()> {
    qa.rc_connect(QP_ACCESS, &conn(qb, b))?;
    qb.rc_connect(QP_ACCESS, &conn(qa, a))?;
    Ok(())
}

/// Busy-polls `cq` (the client owns its CPU) until at least one completion
/// is there; returns how many were copied into `wc`.
fn spin_poll(cq: &Cq, wc: &mut [WorkCompletion]) -> Res<usize> {
    let mut spins = 0u32;
    let mut deadline: Option<Instant> = None;
    loop {
        let k = cq.poll(wc);
        if k > 0 {
            for w in &wc[..k] {
                if !w.is_success() {
                    return Err(format!("completion with error: {w:?}").into());
                }
            }
            return Ok(k);
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 {
            let d = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
            if Instant::now() > d {
                return Err("no completion within 20 s".into());
            }
        }
    }
}

/// Two VMs on one daemon, with one big registered buffer in each.
struct Bench {
    a: Vm,
    b: Vm,
    abuf: Buf,
    bbuf: Buf,
    cqa: Arc<Cq>,
    cqb: Arc<Cq>,
}

struct Pair {
    qa: Qp,
    qb: Qp,
}

impl Bench {
    fn new(d: &TestDaemon, max: usize, scattered: bool) -> Res<Bench> {
        let a = open_vm(d, 0)?;
        let b = open_vm(d, 1)?;
        let align = if scattered { 8 } else { CONTIGUOUS };
        let abuf = Buf::with_align(&a, max, align)?;
        let bbuf = Buf::with_align(&b, max, align)?;
        let cqa = Cq::create(&a.dev, 8192)?;
        let cqb = Cq::create(&b.dev, 8192)?;
        Ok(Bench {
            a,
            b,
            abuf,
            bbuf,
            cqa,
            cqb,
        })
    }

    fn pair(&self, cfg: &Config) -> Res<Pair> {
        let cap = QpCap {
            // Twice the window: a completion can be visible a moment before
            // the device's consumer index moves past its WQE.
            max_send_wr: u32::try_from((2 * cfg.tx_depth).max(16))?,
            max_recv_wr: u32::try_from((2 * cfg.tx_depth).max(64))?,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: u32::try_from(cfg.inline)?,
        };
        let qa = rc_qp(&self.a, &self.cqa, cap)?;
        let qb = rc_qp(&self.b, &self.cqb, cap)?;
        connect(&self.a, &qa, &self.b, &qb)?;
        Ok(Pair { qa, qb })
    }
}

fn send_wr<'a>(
    wr_id: u64,
    op: SendOp,
    sge: &'a [Sge],
    inline: Option<&'a [u8]>,
    signaled: bool,
) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        payload: match inline {
            Some(d) => Payload::Inline(d),
            None => Payload::Sges(sge),
        },
        flags: if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        },
        ud: None,
    }
}

struct LatRow {
    size: usize,
    stats: LatStats,
    /// Median time spent inside post_send, microseconds.
    post_p50: f64,
}

/// One latency measurement at `size`.
fn latency(
    bench: &Bench,
    p: &Pair,
    cfg: &Config,
    test: Test,
    size: usize,
    first: bool,
) -> Res<LatRow> {
    let iters = cfg.lat_iters_for(size);
    let warm = (iters / 10).clamp(5, 1000);
    let inline_data = vec![0x3Cu8; size.min(256)];
    let inline = (size <= cfg.inline && test != Test::ReadLat).then(|| &inline_data[..size]);
    let mut samples = Vec::with_capacity(iters);
    let mut posts = Vec::with_capacity(iters);
    let mut wc = [WorkCompletion::default(); 16];
    match test {
        Test::WriteLat | Test::ReadLat => {
            let sge = [bench.abuf.sge(0, size)?];
            let op = if test == Test::WriteLat {
                SendOp::RdmaWrite {
                    remote_addr: bench.bbuf.addr(0),
                    rkey: bench.bbuf.mr.rkey(),
                }
            } else {
                SendOp::RdmaRead {
                    remote_addr: bench.bbuf.addr(0),
                    rkey: bench.bbuf.mr.rkey(),
                }
            };
            for i in 0..warm + iters {
                let wr = [send_wr(i as u64, op, &sge, inline, true)];
                let t0 = Instant::now();
                p.qa.post_send(&wr)?;
                let t1 = Instant::now();
                spin_poll(&bench.cqa, &mut wc[..1])?;
                let t2 = Instant::now();
                if i >= warm {
                    samples.push(ns(t2 - t0));
                    posts.push(ns(t1 - t0));
                }
            }
            Ok(LatRow {
                size,
                stats: LatStats::of(&samples, 1.0),
                post_p50: LatStats::of(&posts, 1.0).typical,
            })
        }
        Test::SendLat => {
            // A sends to B, B answers with a SEND of the same size; the
            // sends are unsignaled, the receives complete. Latency is half
            // of the round trip, as in perftest's ib_send_lat.
            let sa = [bench.abuf.sge(0, size)?];
            let sb = [bench.bbuf.sge(0, size)?];
            // Receives of exactly the message size, as perftest posts
            // them (a fresh QP pair per size; see main). The responder
            // resolves the whole receive SGE, so a larger receive buffer
            // costs time even for a small message.
            while bench.cqa.poll(&mut wc) > 0 {}
            while bench.cqb.poll(&mut wc) > 0 {}
            let ra = [bench.abuf.sge(0, size)?];
            let rb = [bench.bbuf.sge(0, size)?];
            let depth = if first { 32u64 } else { 0 };
            for k in 0..depth {
                p.qa.post_recv(&[RecvWr {
                    wr_id: k,
                    sg_list: &ra,
                }])?;
                p.qb.post_recv(&[RecvWr {
                    wr_id: k,
                    sg_list: &rb,
                }])?;
            }
            for i in 0..warm + iters {
                // Every 16th send is signaled (and its completion drained),
                // so that the send completions do not fill the CQ.
                let sig = i % 16 == 15;
                let t0 = Instant::now();
                p.qa.post_send(&[send_wr(i as u64, SendOp::Send, &sa, inline, sig)])?;
                let t1 = Instant::now();
                // B: wait for the receive, answer.
                let mut got = false;
                while !got {
                    let k = spin_poll(&bench.cqb, &mut wc[..1])?;
                    got = wc[..k]
                        .iter()
                        .any(|w| w.opcode() == Some(WcOpcodeRecv::RECV));
                }
                p.qb.post_send(&[send_wr(i as u64, SendOp::Send, &sb, inline, sig)])?;
                let mut got = false;
                while !got {
                    let k = spin_poll(&bench.cqa, &mut wc[..1])?;
                    got = wc[..k]
                        .iter()
                        .any(|w| w.opcode() == Some(WcOpcodeRecv::RECV));
                }
                let t2 = Instant::now();
                // Replace the two receives (outside the timed region).
                p.qa.post_recv(&[RecvWr {
                    wr_id: i as u64,
                    sg_list: &ra,
                }])?;
                p.qb.post_recv(&[RecvWr {
                    wr_id: i as u64,
                    sg_list: &rb,
                }])?;
                if i >= warm {
                    samples.push(ns(t2 - t0));
                    posts.push(ns(t1 - t0));
                }
            }
            // Drain what is left (signaled sends).
            std::thread::sleep(Duration::from_millis(1));
            while bench.cqa.poll(&mut wc) > 0 {}
            while bench.cqb.poll(&mut wc) > 0 {}
            Ok(LatRow {
                size,
                stats: LatStats::of(&samples, 0.5),
                post_p50: LatStats::of(&posts, 1.0).typical,
            })
        }
        _ => Err("not a latency test".into()),
    }
}

use virtio_rdma_abi::datapath::WcOpcode as WcOpcodeRecv;

struct BwRow {
    size: usize,
    iters: usize,
    peak: f64,
    avg: f64,
    mpps: f64,
}

/// One bandwidth run: `iters` WQEs of `size` bytes with `tx_depth`
/// outstanding and every `cq_mod`-th signaled. Returns seconds.
fn bw_once(
    bench: &Bench,
    p: &Pair,
    cfg: &Config,
    test: Test,
    size: usize,
    iters: usize,
) -> Res<f64> {
    let inline_data = vec![0x3Cu8; size.min(256)];
    let inline = (size <= cfg.inline).then(|| &inline_data[..size]);
    let sge = [bench.abuf.sge(0, size)?];
    let rsge = [bench.bbuf.sge(0, size)?];
    let send = test == Test::SendBw;
    let op = if send {
        SendOp::Send
    } else {
        SendOp::RdmaWrite {
            remote_addr: bench.bbuf.addr(0),
            rkey: bench.bbuf.mr.rkey(),
        }
    };
    let rq_depth = p.qb.cap().max_recv_wr as usize;
    let mut recv_posted = 0usize;
    let mut recv_done = 0usize;
    let recvs: Vec<RecvWr<'_>> = (0..rq_depth)
        .map(|k| RecvWr {
            wr_id: k as u64,
            sg_list: &rsge,
        })
        .collect();
    if send {
        let n = rq_depth.min(iters);
        p.qb.post_recv(&recvs[..n])?;
        recv_posted = n;
    }
    let (depth, cq_mod) = (cfg.tx_depth, cfg.cq_mod);
    let mut wc = [WorkCompletion::default(); 64];
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(depth);
    let (mut posted, mut done) = (0usize, 0usize);
    let t0 = Instant::now();
    while done < iters {
        let mut n = (depth - (posted - done)).min(iters - posted);
        if send {
            n = n.min(recv_posted - posted);
        }
        if n > 0 {
            wrs.clear();
            for k in posted..posted + n {
                let sig = (k + 1) % cq_mod == 0 || k + 1 == iters;
                wrs.push(send_wr(k as u64, op, &sge, inline, sig));
            }
            p.qa.post_send(&wrs)?;
            posted += n;
        }
        let k = bench.cqa.poll(&mut wc);
        for w in &wc[..k] {
            if !w.is_success() {
                return Err(format!("completion with error: {w:?}").into());
            }
            done = done.max(usize::try_from(w.wr_id)? + 1);
        }
        if send {
            let k = bench.cqb.poll(&mut wc);
            for w in &wc[..k] {
                if !w.is_success() {
                    return Err(format!("receive completion with error: {w:?}").into());
                }
            }
            recv_done += k;
            let room = rq_depth - (recv_posted - recv_done);
            let want = room.min(iters - recv_posted);
            if want >= 16 || (want > 0 && recv_posted < iters && want == iters - recv_posted) {
                p.qb.post_recv(&recvs[..want])?;
                recv_posted += want;
            }
        }
        if k == 0 && n == 0 && t0.elapsed() > WAIT {
            return Err(format!("bandwidth run stuck at {done} of {iters}").into());
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    if send {
        // Every receive completes; collect the stragglers.
        let deadline = Instant::now() + WAIT;
        while recv_done < iters && Instant::now() < deadline {
            recv_done += bench.cqb.poll(&mut wc);
        }
    }
    Ok(dt)
}

fn bandwidth(bench: &Bench, p: &Pair, cfg: &Config, test: Test, size: usize) -> Res<BwRow> {
    let iters = cfg.bw_iters_for(size);
    // Warm-up.
    bw_once(
        bench,
        p,
        cfg,
        test,
        size,
        (iters / 10).max(cfg.tx_depth.min(iters)),
    )?;
    let mut rates = Vec::new();
    let mut total = 0.0;
    for _ in 0..cfg.reps {
        let dt = bw_once(bench, p, cfg, test, size, iters)?;
        total += dt;
        rates.push((iters * size) as f64 / dt / MB);
    }
    let avg = (iters * size * cfg.reps) as f64 / total / MB;
    Ok(BwRow {
        size,
        iters,
        peak: rates.iter().copied().fold(0.0, f64::max),
        avg,
        mpps: (iters * cfg.reps) as f64 / total / 1e6,
    })
}

// ---------------------------------------------------------------------------
// Scaling: N QPs over M VMs

struct ScaleQp {
    qp: Qp,
    remote_addr: u64,
    rkey: u32,
    outstanding: usize,
    /// In the queue of QPs with room for a post.
    queued: bool,
}

struct ScaleResult {
    qps: usize,
    mpps: f64,
    setup_s: f64,
}

/// `nqps` RC QPs over `vms` VMs of the daemon `d` (VM pairs 2k, 2k+1),
/// every QP posting 64-byte WRITEs to its partner; returns the total
/// message rate over `secs`.
/// Takes every completion `cq` has, into `wc` a batch at a time, and
/// calls `each` on each; an error completion is an error.
fn drain_successes(
    cq: &Cq,
    wc: &mut [WorkCompletion],
    mut each: impl FnMut(&WorkCompletion) -> Res<()>,
) -> Res<()> {
    loop {
        let k = cq.poll(wc);
        if k == 0 {
            return Ok(());
        }
        for w in wc.iter().take(k) {
            if !w.is_success() {
                return Err(format!("completion with error: {w:?}").into());
            }
            each(w)?;
        }
    }
}

fn scale_run(d: &TestDaemon, vms: usize, nqps: usize, depth: usize, secs: f64) -> Res<ScaleResult> {
    let t_setup = Instant::now();
    let vm: Vec<Vm> = (0..vms).map(|i| open_vm(d, i)).collect::<Res<_>>()?;
    let pairs = vms / 2;
    let conns = nqps / 2;
    // QPs per VM: connection c goes to VM pair c % pairs.
    let per_vm: Vec<usize> = (0..vms)
        .map(|v| (0..conns).filter(|c| c % pairs == v / 2).count())
        .collect();
    let half = (depth / 2).max(1);
    let cqs: Vec<Arc<Cq>> = vm
        .iter()
        .zip(&per_vm)
        .map(|(v, &n)| {
            Cq::create(
                &v.dev,
                u32::try_from((n * (depth / half + 1) + 64).next_power_of_two())?,
            )
            .map_err(BoxError::from)
        })
        .collect::<Res<_>>()?;
    let bufs: Vec<Buf> = vm
        .iter()
        .map(|v| Buf::new(v, 64 * 64))
        .collect::<Res<_>>()?;
    let cap = QpCap {
        // Twice the window: a completion can be visible a moment before the
        // device's consumer index moves past its WQE.
        max_send_wr: u32::try_from(2 * depth)?,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps: Vec<ScaleQp> = Vec::with_capacity(2 * conns);
    let mut sges: Vec<[Sge; 1]> = Vec::with_capacity(2 * conns);
    for c in 0..conns {
        let (x, y) = (2 * (c % pairs), 2 * (c % pairs) + 1);
        let qx = rc_qp(&vm[x], &cqs[x], cap)?;
        let qy = rc_qp(&vm[y], &cqs[y], cap)?;
        connect(&vm[x], &qx, &vm[y], &qy)?;
        let slot = (c % 64) * 64;
        for (qp, me, peer) in [(qx, x, y), (qy, y, x)] {
            qps.push(ScaleQp {
                qp,
                remote_addr: bufs[peer].addr(slot),
                rkey: bufs[peer].mr.rkey(),
                outstanding: 0,
                queued: true,
            });
            sges.push([bufs[me].sge(slot, 64)?]);
        }
    }
    let setup_s = t_setup.elapsed().as_secs_f64();
    let mut ready: std::collections::VecDeque<usize> = (0..qps.len()).collect();
    let mut wc = [WorkCompletion::default(); 64];
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(half);
    let warm = Duration::from_secs_f64((secs / 5.0).min(0.5));
    let t_start = Instant::now();
    let mut t_measure: Option<(Instant, u64)> = None;
    let mut completed = 0u64;
    let mut progress = (Instant::now(), 0u64);
    let mut rounds = 0u32;
    let end = loop {
        // The clock every 16 rounds (a read costs as much as a post): the
        // window's edges move by microseconds of a second.
        rounds = rounds.wrapping_add(1);
        if rounds % 16 == 0 {
            let now = Instant::now();
            match t_measure {
                None if now - t_start >= warm => t_measure = Some((now, completed)),
                Some((t0, _)) if (now - t0).as_secs_f64() >= secs => break now,
                _ => {}
            }
            // Progress is judged on the same clock reads.
            if completed != progress.1 {
                progress = (now, completed);
            } else if now - progress.0 > WAIT {
                return Err("scaling run: no completion for 20 s".into());
            }
        }
        // Only QPs with room are visited (a completion queues its QP
        // again), as an application posting on completion would: a scan
        // of every QP per round took 18 % of the client's time at 10,000
        // QPs (`perf record`).
        for _ in 0..ready.len() {
            let Some(i) = ready.pop_front() else {
                break;
            };
            let q = qps.get_mut(i).ok_or("bad QP index")?;
            let op = SendOp::RdmaWrite {
                remote_addr: q.remote_addr,
                rkey: q.rkey,
            };
            wrs.clear();
            for k in 0..half {
                let sig = k + 1 == half;
                wrs.push(SendWr {
                    wr_id: i as u64,
                    op,
                    payload: Payload::Sges(&sges[i]),
                    flags: if sig {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                    ud: None,
                });
            }
            match q.qp.post_send(&wrs) {
                Ok(()) => q.outstanding += half,
                // The completion of a WQE can be visible a moment
                // before the device's consumer index moves past it.
                Err(e) if e.is_queue_full() => {}
                Err(e) => return Err(e.into()),
            }
            if q.outstanding + half <= depth {
                ready.push_back(i);
            } else {
                q.queued = false;
            }
        }
        for cq in &cqs {
            drain_successes(cq, &mut wc, |w| {
                let i = usize::try_from(w.wr_id)?;
                let q = qps.get_mut(i).ok_or("bad wr_id")?;
                q.outstanding -= half;
                completed += half as u64;
                if !q.queued && q.outstanding + half <= depth {
                    q.queued = true;
                    ready.push_back(i);
                }
                Ok(())
            })?;
        }
    };
    let (t0, c0) = t_measure.ok_or("no measurement window")?;
    let mpps = (completed - c0) as f64 / (end - t0).as_secs_f64() / 1e6;
    // Let the outstanding work finish before the QPs go away.
    let deadline = Instant::now() + WAIT;
    while qps.iter().any(|q| q.outstanding > 0) && Instant::now() < deadline {
        for cq in &cqs {
            let k = cq.poll(&mut wc);
            for w in &wc[..k] {
                if let Some(q) = qps.get_mut(usize::try_from(w.wr_id)?) {
                    q.outstanding = q.outstanding.saturating_sub(half);
                }
            }
        }
    }
    drop(qps);
    drop(cqs);
    drop(bufs);
    drop(vm);
    Ok(ScaleResult {
        qps: 2 * conns,
        mpps,
        setup_s,
    })
}

fn scale_mode(args: &Args, sum: &mut Summary) -> Res<()> {
    let nqps = args.qps.unwrap_or(10_000);
    let vms = args.vms;
    if vms < 2 || vms % 2 != 0 {
        return Err("--vms must be even and >= 2".into());
    }
    if nqps < 2 || args.ref_qps < 2 {
        return Err("--qps and --ref-qps must be >= 2".into());
    }
    if args.scale_depth < 2 {
        return Err("--scale-depth must be >= 2".into());
    }
    let secs = args.secs.unwrap_or(if args.quick { 0.2 } else { 3.0 });
    println!(
        "\n== scaling: QPs over {vms} VMs (VM pairs 0-1, 2-3, ...), every QP posting 64 B RDMA WRITEs to its partner, {} outstanding per QP ({} per post, the last signaled), {secs} s measured after a warm-up ==",
        args.scale_depth,
        args.scale_depth / 2
    );
    let mut rows = Vec::new();
    // Reference, scaled, reference again (drift check).
    for (k, n) in [args.ref_qps, nqps, args.ref_qps].into_iter().enumerate() {
        let d = on_cpu(args.engine_cpu, "perf-launcher", || {
            Ok(TestDaemon::with_config(vms, |c| {
                c.fence_elision = args.fence_elision
            })?)
        })?;
        let r = scale_run(&d, vms, n, args.scale_depth, secs)?;
        if k == 1 {
            println!("  threads: {}", thread_placement());
        }
        println!(
            "  {:>6} QPs: {:>8.3} M WQEs/s total ({:.1} s to create and connect)",
            r.qps, r.mpps, r.setup_s
        );
        rows.push(r);
        drop(d);
    }
    let refr = (rows[0].mpps + rows[2].mpps) / 2.0;
    let big = rows[1].mpps;
    let loss = 1.0 - big / refr;
    println!(
        "  {} QPs vs {} QPs (mean of the two reference runs {:.3}): loss {:.1} % (target <= 10 %)",
        rows[1].qps,
        rows[0].qps,
        refr,
        loss * 100.0
    );
    sum.add(format!("scale.vms{vms}.qps{}.mpps", rows[0].qps), refr);
    sum.add(format!("scale.vms{vms}.qps{}.mpps", rows[1].qps), big);
    sum.add(
        format!("scale.vms{vms}.qps{}.loss_pct", rows[1].qps),
        loss * 100.0,
    );
    Ok(())
}

// ---------------------------------------------------------------------------

fn print_lat_header(test: Test) {
    println!(
        "\n---------------------------------------------------------------------------------------"
    );
    println!("                    {}", test.title());
    println!(
        "---------------------------------------------------------------------------------------"
    );
    println!(
        " {:<10} {:<12} {:>12} {:>12} {:>16} {:>12} {:>14} {:>22} {:>24} | {:>16} {:>14}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_max[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]",
        "post p50[usec]",
        "ring p50[usec]"
    );
}

fn print_bw_header(test: Test, cfg: &Config) {
    println!(
        "\n---------------------------------------------------------------------------------------"
    );
    println!(
        "                    {} (tx depth {}, every {}th WQE signaled)",
        test.title(),
        cfg.tx_depth,
        cfg.cq_mod
    );
    println!(
        "---------------------------------------------------------------------------------------"
    );
    println!(
        " {:<10} {:<12} {:>18} {:>21} {:>14} | {:>16} {:>12} {:>20}",
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
        "memcpy[MB/sec]",
        "BW/memcpy",
        "ring MsgRate[Mpps]"
    );
}

fn main() -> Res<()> {
    let args = Args::parse();
    let cfg = Config::from_args(&args)?;
    print_header("rdma_perf");
    SHMEM.store(args.shmem, Ordering::Relaxed);
    DIRTY_LOG.store(args.dirty_log, Ordering::Relaxed);
    println!(
        "  doorbells: {}; message buffers: {}",
        if args.shmem {
            "shared-memory doorbell pages (SHMEM_MAP)"
        } else {
            "records in guest RAM"
        },
        if args.scattered {
            "scattered 4 KiB guest pages"
        } else {
            "guest-physically contiguous (2 MiB aligned)"
        }
    );
    let (ccpu, ecpu) = (args.client_cpu, args.engine_cpu);
    println!(
        "  placement: client (this thread, plays both VMs) on CPU {ccpu}; daemon started from a thread pinned to CPU {ecpu}, so its engine thread (rnic-engine) and vhost-user threads run on CPU {ecpu}"
    );
    println!("  MB = 2^20 bytes (as perftest); latency in microseconds; no timing is asserted");
    pin_current(ccpu)?;
    let mut sum = Summary::default();

    // Baselines.
    let mut ring: Option<RingResult> = None;
    let mut memcpy: BTreeMap<usize, f64> = BTreeMap::new();
    let need_bw = cfg.tests.iter().any(|t| !t.is_lat());
    if cfg.baselines && (!cfg.tests.is_empty() || args.qps.is_some()) {
        println!("\n== baselines (same run) ==");
        let r = ring_baseline(
            ccpu,
            ecpu,
            if cfg.quick { 2000 } else { 200_000 },
            if cfg.quick { 20_000 } else { 20_000_000 },
            cfg.tx_depth,
            cfg.cq_mod,
        )?;
        println!(
            "  polled SPSC ring, CPU {ccpu} <-> CPU {ecpu}, 64 B messages: round trip p50 {:.3} us (min {:.3}, p99 {:.3}, p99.9 {:.3}); message rate {:.2} M/s (window {}, completion every {}th)",
            r.lat.typical, r.lat.min, r.lat.p99, r.lat.p999, r.mpps, cfg.tx_depth, cfg.cq_mod
        );
        sum.add("baseline.ring.rtt_p50_us", r.lat.typical);
        sum.add("baseline.ring.rtt_p99_us", r.lat.p99);
        sum.add("baseline.ring.msg_rate_mpps", r.mpps);
        ring = Some(r);
        if need_bw {
            let budget = if cfg.quick { 4 << 20 } else { 512 << 20 };
            let sizes = cfg.sizes_bw.clone();
            let m = on_cpu(ecpu, "memcpy", move || {
                Ok(sizes
                    .iter()
                    .map(|&s| (s, memcpy_bw(s, budget)))
                    .collect::<BTreeMap<_, _>>())
            })?;
            let line: Vec<String> = m.iter().map(|(s, b)| format!("{s}:{b:.0}")).collect();
            println!(
                "  one-core memcpy on CPU {ecpu} (bytes:MB/s): {}",
                line.join(" ")
            );
            for (s, b) in &m {
                sum.add(format!("baseline.memcpy.{s}.mbps"), *b);
            }
            memcpy = m;
        }
    }

    if !cfg.tests.is_empty() {
        let max = cfg
            .sizes_lat
            .iter()
            .chain(&cfg.sizes_bw)
            .copied()
            .max()
            .unwrap_or(2)
            .max(4096);
        let daemon = on_cpu(ecpu, "perf-launcher", || {
            Ok(TestDaemon::with_config(2, |c| {
                c.fence_elision = args.fence_elision
            })?)
        })?;
        let bench = Bench::new(&daemon, max, args.scattered)?;
        println!("\n  threads: {}", thread_placement());
        for &test in &cfg.tests {
            let p = bench.pair(&cfg)?;
            if test.is_lat() {
                print_lat_header(test);
                for &size in &cfg.sizes_lat {
                    // send_lat leaves receives of its size posted: a fresh
                    // pair per size.
                    let fresh;
                    let pp = if test == Test::SendLat {
                        fresh = bench.pair(&cfg)?;
                        &fresh
                    } else {
                        &p
                    };
                    let r = latency(&bench, pp, &cfg, test, size, true)?;
                    let s = r.stats;
                    println!(
                        " {:<10} {:<12} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>22.2} {:>24.2} | {:>16.3} {:>14.3}",
                        r.size, s.n, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999,
                        r.post_p50,
                        ring.as_ref().map_or(f64::NAN, |x| x.lat.typical)
                    );
                    let k = format!("{}.{}", test.key(), r.size);
                    sum.add(format!("{k}.t_typical_us"), s.typical);
                    sum.add(format!("{k}.t_p99_us"), s.p99);
                    sum.add(format!("{k}.post_p50_us"), r.post_p50);
                }
                if test == Test::SendLat {
                    println!(" (send_lat: half of the ping-pong round trip, receives pre-posted, sends unsignaled except every 16th)");
                } else {
                    println!(" (post-to-completion: post_send of one signaled WQE until the client has polled its completion; \"post\" is the time inside post_send)");
                }
            } else {
                print_bw_header(test, &cfg);
                for &size in &cfg.sizes_bw {
                    let r = bandwidth(&bench, &p, &cfg, test, size)?;
                    let mc = memcpy.get(&size).copied().unwrap_or(f64::NAN);
                    println!(
                        " {:<10} {:<12} {:>18.2} {:>21.2} {:>14.6} | {:>16.0} {:>12.3} {:>20.3}",
                        r.size,
                        r.iters,
                        r.peak,
                        r.avg,
                        r.mpps,
                        mc,
                        r.avg / mc,
                        ring.as_ref().map_or(f64::NAN, |x| x.mpps)
                    );
                    let k = format!("{}.{}", test.key(), r.size);
                    sum.add(format!("{k}.bw_avg_mbps"), r.avg);
                    sum.add(format!("{k}.bw_peak_mbps"), r.peak);
                    sum.add(format!("{k}.msg_rate_mpps"), r.mpps);
                    if mc.is_finite() {
                        sum.add(format!("{k}.ratio_memcpy"), r.avg / mc);
                    }
                }
                println!(
                    " (BW average = bytes of all {} repetitions / their time; BW peak = best repetition)",
                    cfg.reps
                );
            }
            drop(p);
        }
        drop(bench);
        drop(daemon);
    }

    if args.qps.is_some() {
        scale_mode(&args, &mut sum)?;
    }
    if args.drain {
        drain::drain_mode(&args, &mut sum)?;
    }

    if cfg.baselines && !cfg.tests.is_empty() {
        // The ring again, to show drift of the machine during the run.
        let r = ring_baseline(
            ccpu,
            ecpu,
            if cfg.quick { 2000 } else { 200_000 },
            if cfg.quick { 20_000 } else { 20_000_000 },
            cfg.tx_depth,
            cfg.cq_mod,
        )?;
        println!(
            "\n  polled ring again at the end: round trip p50 {:.3} us, message rate {:.2} M/s",
            r.lat.typical, r.mpps
        );
        sum.add("baseline.ring_end.rtt_p50_us", r.lat.typical);
        sum.add("baseline.ring_end.msg_rate_mpps", r.mpps);
    }
    println!("\n  load average at end: {}", loadavg());
    println!("\nsummary (key value), for aggregating runs:");
    for (k, v) in &sum.0 {
        println!("  {k} {v:.4}");
    }
    Ok(())
}
