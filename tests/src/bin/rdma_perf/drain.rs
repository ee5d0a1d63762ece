//! `rdma_perf --drain`: what one engine thread and two engine threads do
//! with a fixed amount of work while the client is out of the way.
//!
//! On a 2-CPU machine the other modes keep one CPU busy with the client,
//! so a second engine thread would have no CPU of its own. Here the engine
//! threads are held (`Engines::hold`) while the client fills the send queue
//! of every QP with 64-byte RDMA WRITEs; then they are released and the
//! client sleeps until every signaled completion is there, looking every
//! millisecond. Each engine thread's rate comes from its own work
//! counter and the moment it reached its share; its CPU time from
//! `/proc/self/task/TID/schedstat`.
//!
//! VM pair k (VMs 2k, 2k+1) is tenant `pairk`, placed on engine thread
//! k mod T: a VM only reaches VMs of its tenant, so every WRITE's requester
//! and responder are on the same thread, and with 4 VMs and 2 threads each
//! thread serves one pair. Thread 0 runs on `--engine-cpu`, thread 1 on the
//! client's CPU (the client sleeps during the drain).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::bench::pin_current;
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use virtio_rdma_driver::{Cq, Payload, Qp, QpCap, SendFlags, SendOp, SendWr, Sge, WorkCompletion};

use super::{
    connect, drain_successes, median, on_cpu, open_vm, page_aligned, rc_qp, Args, BoxError, Buf,
    Res, Summary, Vm, WAIT,
};

/// How often the client looks while the engines drain: each look costs the
/// engine thread that shares the client's CPU some microseconds, and each
/// thread's end is interpolated between two looks.
const LOOK: Duration = Duration::from_millis(1);
/// Share of a thread's span spent waiting for its CPU above which a round's
/// wall-clock figures are left out of the medians (the client's looks
/// take about 2.5 % from the thread on its CPU).
const DISTURBED: f64 = 0.05;
/// The test VMM maps a queue's guest pages one by one: the rings of a
/// drain may take at most this share of `vm.max_map_count`.
const MAP_SHARE: f64 = 0.6;
/// WQEs per `post_send` call while filling a queue.
const POST_BATCH: usize = 256;

/// One QP of the drain and what it writes.
struct DrainQp {
    qp: Qp,
    /// Its VM.
    vm: usize,
    sge: [Sge; 1],
    op: SendOp,
}

/// The VMs, queues and QPs of one daemon.
struct Setup {
    qps: Vec<DrainQp>,
    cqs: Vec<Arc<Cq>>,
    _bufs: Vec<Buf>,
    // Dropped last: the objects above belong to these devices.
    _vms: Vec<Vm>,
}

/// One drain: when each engine thread reached its share, and its CPU time.
struct DrainRun {
    threads: usize,
    /// The client's time per WQE posted (with the engines held).
    post_ns: f64,
    /// Release to the last signaled completion.
    wall: Duration,
    /// Per engine thread.
    per: Vec<ThreadRun>,
}

struct ThreadRun {
    cpu: usize,
    wqes: u64,
    /// Release to the look that found its share executed.
    done: Duration,
    /// Its time on a CPU and waiting for one over that span, ns.
    run_ns: u64,
    wait_ns: u64,
}

impl DrainRun {
    fn total(&self) -> u64 {
        self.per.iter().map(|t| t.wqes).sum()
    }

    fn mpps(&self) -> f64 {
        self.total() as f64 / self.wall.as_secs_f64() / 1e6
    }

    /// Whether another task had an engine thread's CPU for more than
    /// [`DISTURBED`] of the thread's span: its wall-clock figures then
    /// measure the other task too.
    fn disturbed(&self) -> bool {
        self.per
            .iter()
            .any(|t| t.wait_ns as f64 > DISTURBED * t.done.as_nanos() as f64)
    }
}

impl ThreadRun {
    fn mpps(&self) -> f64 {
        self.wqes as f64 / self.done.as_secs_f64() / 1e6
    }

    fn ns_per_wqe(&self) -> f64 {
        self.run_ns as f64 / self.wqes.max(1) as f64
    }
}

/// Validated drain parameters.
struct Params {
    vms: usize,
    qps: usize,
    depth: usize,
    signal: usize,
}

impl Params {
    fn from_args(a: &Args) -> Res<Params> {
        if a.vms < 2 || a.vms % 2 != 0 {
            return Err("--vms must be even and >= 2".into());
        }
        if a.drain_qps == 0 || a.drain_depth < 2 || a.drain_depth > 16384 {
            return Err("--drain-qps must be >= 1, --drain-depth 2..=16384".into());
        }
        if a.drain_signal == 0 || a.drain_signal > a.drain_depth {
            return Err("--drain-signal must be 1..=drain-depth".into());
        }
        // 128-byte WQEs (one SGE), each ring page a mapping of its own.
        let pages = a.vms * a.drain_qps * (a.drain_depth * 128).div_ceil(4096);
        let max_maps = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(65530);
        if pages as f64 > max_maps as f64 * MAP_SHARE {
            return Err(format!(
                "the send queues take {pages} pages, each mapped on its own by the test VMM: \
                 more than {MAP_SHARE} of vm.max_map_count ({max_maps}); \
                 lower --drain-qps or --drain-depth"
            )
            .into());
        }
        let (qps, depth) = if a.quick {
            (a.drain_qps.min(4), a.drain_depth.min(1024))
        } else {
            (a.drain_qps, a.drain_depth)
        };
        Ok(Params {
            vms: a.vms,
            qps,
            depth,
            signal: a.drain_signal.min(depth),
        })
    }

    /// Signaled WQEs of one QP per drain: every `signal`-th, and the last.
    fn signaled_per_qp(&self) -> usize {
        self.depth.div_ceil(self.signal)
    }
}

/// The CPUs of `threads` engine threads: the engine's CPU first, then the
/// others in order (on 2 CPUs: thread 0 keeps its CPU with 1 or 2 threads,
/// thread 1 shares the sleeping client's).
fn engine_cpus(args: &Args, threads: usize) -> Res<Vec<usize>> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let online = usize::try_from(online).unwrap_or(1);
    let cpus: Vec<usize> = std::iter::once(args.engine_cpu)
        .chain((0..online).filter(|&c| c != args.engine_cpu))
        .take(threads)
        .collect();
    if cpus.len() < threads {
        return Err(
            format!("{threads} engine threads need {threads} CPUs, {online} online").into(),
        );
    }
    Ok(cpus)
}

/// Starts a daemon with `threads` engine threads on `cpus` and VM pair k
/// as tenant `pairk` on thread k mod `threads`.
fn start_daemon(args: &Args, p: &Params, threads: usize, cpus: Vec<usize>) -> Res<TestDaemon> {
    let fence_elision = args.fence_elision;
    on_cpu(args.engine_cpu, "perf-launcher", move || {
        Ok(TestDaemon::with_config(p.vms, |c| {
            c.engine_threads = threads;
            c.engine_cpus = cpus;
            c.fence_elision = fence_elision;
            for k in 0..p.vms / 2 {
                add_tenant(c, &format!("pair{k}"), &[2 * k, 2 * k + 1]).engine = Some(k % threads);
            }
        })?)
    })
}

/// Opens the VMs and connects `p.qps` QPs per VM, QP j of VM 2k to QP j
/// of VM 2k+1; both post.
fn setup(d: &TestDaemon, p: &Params) -> Res<Setup> {
    let vms: Vec<Vm> = (0..p.vms).map(|i| open_vm(d, i)).collect::<Res<_>>()?;
    // Room for every signaled completion of a drain, unpolled.
    let cqe = u32::try_from((p.qps * p.signaled_per_qp() + 64).next_power_of_two())?;
    let cqs: Vec<Arc<Cq>> = vms
        .iter()
        .map(|v| Cq::create(&v.dev, cqe).map_err(BoxError::from))
        .collect::<Res<_>>()?;
    // A 64-byte slot per QP at each end: the payload stays in cache, as
    // in the message-rate tests.
    let bufs: Vec<Buf> = vms
        .iter()
        .map(|v| Buf::new(v, p.qps * 64))
        .collect::<Res<_>>()?;
    let cap = QpCap {
        max_send_wr: u32::try_from(p.depth)?,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(p.vms * p.qps);
    for pair in 0..p.vms / 2 {
        let (x, y) = (2 * pair, 2 * pair + 1);
        for j in 0..p.qps {
            let qx = rc_qp(&vms[x], &cqs[x], cap)?;
            let qy = rc_qp(&vms[y], &cqs[y], cap)?;
            connect(&vms[x], &qx, &vms[y], &qy)?;
            for (qp, me, peer) in [(qx, x, y), (qy, y, x)] {
                qps.push(DrainQp {
                    qp,
                    vm: me,
                    sge: [bufs[me].sge(j * 64, 64)?],
                    op: SendOp::RdmaWrite {
                        remote_addr: bufs[peer].addr(j * 64),
                        rkey: bufs[peer].mr.rkey(),
                    },
                });
            }
        }
    }
    Ok(Setup {
        qps,
        cqs,
        _bufs: bufs,
        _vms: vms,
    })
}

/// The thread ids of the engine threads `rnic-engine0..threads`.
fn engine_tids(threads: usize) -> Res<Vec<u32>> {
    let mut tids = vec![None; threads];
    for e in std::fs::read_dir("/proc/self/task")?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let Some(i) = comm.trim().strip_prefix("rnic-engine") else {
            continue;
        };
        if let (Ok(i), Some(tid)) = (i.parse::<usize>(), e.file_name().to_str()) {
            if let Some(slot) = tids.get_mut(i) {
                *slot = tid.parse::<u32>().ok();
            }
        }
    }
    tids.into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| BoxError::from(format!("no thread rnic-engine{i}"))))
        .collect()
}

/// Thread `tid`'s time on a CPU and waiting for one, ns. The run time
/// comes from the thread's CPU clock, which is exact at every read; its
/// figure in `/proc/self/task/TID/schedstat` moves only at the scheduler's
/// ticks (4 ms here) while the thread runs. The wait time comes from
/// there, as far as it has been accounted.
fn schedstat(tid: u32) -> Res<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
    let wait = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| format!("unreadable schedstat of thread {tid}: {s:?}"))?;
    // The kernel's per-thread scheduler clock of `tid`
    // (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) in linux/posix-timers.h).
    let clock = (!i32::try_from(tid)? << 3) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec the kernel writes; an invalid clock
    // id is an error return, not undefined behaviour.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(format!(
            "CPU clock of thread {tid}: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    let run = u64::try_from(ts.tv_sec)? * 1_000_000_000 + u64::try_from(ts.tv_nsec)?;
    Ok((run, wait))
}

/// What the client saw at one look: the time since the release, and per
/// engine thread its WQEs and its CPU run and wait time since then.
struct Look {
    t: Duration,
    wqes: Vec<u64>,
    run: Vec<u64>,
    wait: Vec<u64>,
}

/// Thread `i`'s figures when it executed its `share`-th WQE: between the
/// last look before and the first look after, at the pace of the look
/// interval before (it worked steadily until then, and only polls or sleeps
/// after). A thread done before the first look is taken as done then.
fn finish(looks: &[Look], i: usize, share: u64) -> Option<(Duration, u64, u64)> {
    let k = looks.iter().position(|l| l.wqes[i] >= share)?;
    let at = &looks[k];
    let (Some(prev), Some(pace)) = (
        k.checked_sub(1).and_then(|j| looks.get(j)),
        k.checked_sub(2).and_then(|j| looks.get(j)),
    ) else {
        return Some((at.t, at.run[i], at.wait[i]));
    };
    let dt = (prev.t - pace.t).as_secs_f64();
    let rate = (prev.wqes[i] - pace.wqes[i]) as f64 / dt;
    if rate <= 0.0 {
        return Some((at.t, at.run[i], at.wait[i]));
    }
    let more = ((share - prev.wqes[i]) as f64 / rate).min((at.t - prev.t).as_secs_f64());
    // A time at `prev`, carried on at its pace over the interval before.
    let lerp = |at_prev: &[u64], at_pace: &[u64]| {
        let per_s = at_prev[i].saturating_sub(at_pace[i]) as f64 / dt;
        (at_prev[i] as f64 + per_s * more) as u64
    };
    let run = lerp(&prev.run, &pace.run).min(at.run[i]);
    let wait = lerp(&prev.wait, &pace.wait).min(at.wait[i]);
    Some((prev.t + Duration::from_secs_f64(more), run, wait))
}

/// Posts one full send queue on every QP with the engines held, releases
/// them and waits, sleeping between looks, until every signaled completion
/// is there.
fn drain_once(d: &TestDaemon, s: &Setup, p: &Params, cpus: &[usize]) -> Res<DrainRun> {
    let engines = d.daemon().engines();
    let threads = engines.len();
    let placement: Vec<usize> = (0..p.vms).map(|v| (v / 2) % threads).collect();
    let mut share = vec![0u64; threads];
    for q in &s.qps {
        share[placement[q.vm]] += p.depth as u64;
    }
    engines.hold(true);
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(POST_BATCH);
    let t_post = Instant::now();
    let posted = (|| -> Res<()> {
        for q in &s.qps {
            let mut k = 0;
            while k < p.depth {
                wrs.clear();
                for i in k..(k + POST_BATCH).min(p.depth) {
                    let sig = (i + 1) % p.signal == 0 || i + 1 == p.depth;
                    wrs.push(SendWr {
                        wr_id: i as u64,
                        op: q.op,
                        payload: Payload::Sges(&q.sge),
                        flags: if sig {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        },
                        ud: None,
                    });
                }
                q.qp.post_send(&wrs)?;
                k += wrs.len();
            }
        }
        Ok(())
    })();
    if let Err(e) = posted {
        engines.hold(false);
        return Err(e);
    }
    let post_ns = t_post.elapsed().as_nanos() as f64 / (s.qps.len() * p.depth) as f64;
    let tids = engine_tids(threads)?;
    let sched = || -> Res<(Vec<u64>, Vec<u64>)> {
        let v: Vec<(u64, u64)> = tids.iter().map(|&t| schedstat(t)).collect::<Res<_>>()?;
        Ok(v.into_iter().unzip())
    };
    let (run0, wait0) = sched()?;
    let wqes0: Vec<u64> = engines.stats().iter().map(|e| e.wqes).collect();
    let since = |now: &[u64], then: &[u64]| -> Vec<u64> {
        now.iter()
            .zip(then)
            .map(|(a, b)| a.wrapping_sub(*b))
            .collect()
    };
    let expected = (s.qps.len() * p.signaled_per_qp()) as u64;
    let mut completions = 0u64;
    let mut looks = vec![Look {
        t: Duration::ZERO,
        wqes: vec![0; threads],
        run: vec![0; threads],
        wait: vec![0; threads],
    }];
    let mut wc = [WorkCompletion::default(); 64];
    let t0 = Instant::now();
    engines.hold(false);
    loop {
        std::thread::sleep(LOOK);
        let t = t0.elapsed();
        let wqes: Vec<u64> = engines.stats().iter().map(|e| e.wqes).collect();
        let (run, wait) = sched()?;
        looks.push(Look {
            t,
            wqes: since(&wqes, &wqes0),
            run: since(&run, &run0),
            wait: since(&wait, &wait0),
        });
        for cq in &s.cqs {
            drain_successes(cq, &mut wc, |_| {
                completions += 1;
                Ok(())
            })?;
        }
        let all = looks
            .last()
            .is_some_and(|l| l.wqes.iter().zip(&share).all(|(w, s)| w >= s));
        if completions >= expected && all {
            break;
        }
        if t > WAIT {
            return Err(format!("drain stuck: {completions} of {expected} completions").into());
        }
    }
    let per: Vec<ThreadRun> = (0..threads)
        .map(|i| {
            let (done, run_ns, wait_ns) = finish(&looks, i, share[i]).unwrap_or_default();
            ThreadRun {
                cpu: cpus.get(i).copied().unwrap_or(usize::MAX),
                wqes: share[i],
                done,
                run_ns,
                wait_ns,
            }
        })
        .collect();
    Ok(DrainRun {
        threads,
        post_ns,
        wall: per.iter().map(|t| t.done).max().unwrap_or_default(),
        per,
    })
}

/// One round with `threads` engine threads: a daemon, a warm-up drain
/// (first touches of the rings' pages), then a measured one.
fn round(args: &Args, p: &Params, threads: usize) -> Res<DrainRun> {
    let cpus = engine_cpus(args, threads)?;
    let d = start_daemon(args, p, threads, cpus.clone())?;
    // The daemon's own account of the placement, against the one the
    // shares are computed from.
    for e in d.daemon().engines().stats() {
        let want = (0..p.vms).filter(|v| (v / 2) % threads == e.index).count();
        if e.vms != want || e.cpu != cpus.get(e.index).copied() {
            return Err(format!(
                "engine thread {} has {} VMs on CPU {:?}, expected {want} on {:?}",
                e.index,
                e.vms,
                e.cpu,
                cpus.get(e.index)
            )
            .into());
        }
    }
    let s = setup(&d, p)?;
    drain_once(&d, &s, p, &cpus)?;
    let r = drain_once(&d, &s, p, &cpus)?;
    drop(s);
    drop(d);
    Ok(r)
}

/// Copy rate of each of `cpus.len()` threads copying `size`-byte buffers
/// at once for `secs`, each pinned to its CPU, MB/s (2^20 bytes copied per
/// second). Every thread copies for the whole span: a fixed count of
/// copies would let the faster one finish early and the slower one then
/// run alone.
fn copy_rates(cpus: &[usize], size: usize, secs: f64) -> Res<Vec<f64>> {
    let start = Arc::new(Barrier::new(cpus.len()));
    let span = Duration::from_secs_f64(secs);
    std::thread::scope(|sc| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let start = start.clone();
                sc.spawn(move || -> Res<f64> {
                    pin_current(cpu)?;
                    let mut src_mem = vec![0x5Au8; size + 4096];
                    let mut dst_mem = vec![0u8; size + 4096];
                    let src: &[u8] = page_aligned(&mut src_mem, size);
                    let dst = page_aligned(&mut dst_mem, size);
                    dst.copy_from_slice(src);
                    start.wait();
                    let t0 = Instant::now();
                    let mut copies = 0usize;
                    while t0.elapsed() < span {
                        dst.copy_from_slice(std::hint::black_box(src));
                        std::hint::black_box(&mut *dst);
                        copies += 1;
                    }
                    Ok((copies * size) as f64 / t0.elapsed().as_secs_f64() / super::MB)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| BoxError::from("copy thread panicked"))?
            })
            .collect()
    })
}

/// The memory-bandwidth baseline: one thread, then one per CPU at once, of
/// cache-sized and of memory-sized copies.
fn bandwidth_baseline(args: &Args, sum: &mut Summary) -> Res<()> {
    let both = engine_cpus(args, 2)?;
    let big = if args.quick { 16 << 20 } else { 128 << 20 };
    let secs = if args.quick { 0.05 } else { 0.5 };
    for (size, what) in [(64 << 10, "in L2"), (big, "memory")] {
        let one = copy_rates(&both[..1], size, secs)?;
        let two = copy_rates(&both, size, secs)?;
        let agg: f64 = two.iter().sum();
        println!(
            "  memcpy of {} B buffers, {what}: 1 thread (CPU {}) {:.0} MB/s; 2 threads at once (CPUs {:?}) {:.0} + {:.0} = {:.0} MB/s ({:.2} x one)",
            size, both[0], one[0], both, two[0], two[1], agg, agg / one[0]
        );
        let key = if size == 64 << 10 { "cache" } else { "mem" };
        sum.add(format!("drain.baseline.copy_{key}.t1_mbps"), one[0]);
        sum.add(format!("drain.baseline.copy_{key}.t2_mbps"), agg);
    }
    Ok(())
}

/// `rdma_perf --drain`.
pub(super) fn drain_mode(args: &Args, sum: &mut Summary) -> Res<()> {
    let p = Params::from_args(args)?;
    let mut counts = args.engine_threads.clone();
    if counts.is_empty() {
        counts = vec![1, 2];
    }
    if counts.contains(&0) {
        return Err("--engine-threads must be >= 1".into());
    }
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 5 }).max(1);
    let per_drain = p.vms * p.qps * p.depth;
    println!(
        "\n== drain: {} VMs (pair k = tenant pairk on engine thread k mod T), {} RC QPs per VM, each with {} 64 B RDMA WRITEs to its partner (every {}th and the last signaled) = {} WQEs, posted with the engines held; then released, the client sleeping and looking every {} ms ==",
        p.vms,
        p.qps,
        p.depth,
        p.signal,
        per_drain,
        LOOK.as_millis()
    );
    if !args.no_baselines {
        bandwidth_baseline(args, sum)?;
    }
    let mut runs: Vec<DrainRun> = Vec::new();
    for r in 0..reps {
        // Alternating orders, so that drift of the machine hits both.
        let order: Vec<usize> = if r % 2 == 0 {
            counts.clone()
        } else {
            counts.iter().rev().copied().collect()
        };
        for &t in &order {
            let run = round(args, &p, t)?;
            let threads: Vec<String> = run
                .per
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    format!(
                        "engine{i} (CPU {}) {} WQEs in {:.1} ms = {:.2} M/s, CPU {:.1} ms = {:.0} ns/WQE, waited {:.1} ms",
                        x.cpu,
                        x.wqes,
                        x.done.as_secs_f64() * 1e3,
                        x.mpps(),
                        x.run_ns as f64 / 1e6,
                        x.ns_per_wqe(),
                        x.wait_ns as f64 / 1e6
                    )
                })
                .collect();
            println!(
                "  round {} T={}: posted at {:.0} ns/WQE; {} WQEs in {:.1} ms = {:.2} M/s{} | {}",
                r + 1,
                run.threads,
                run.post_ns,
                run.total(),
                run.wall.as_secs_f64() * 1e3,
                run.mpps(),
                if run.disturbed() { " (disturbed)" } else { "" },
                threads.join(" | ")
            );
            runs.push(run);
        }
    }
    println!(
        "\n  medians over {reps} rounds. wall: WQEs / time from the release to the last one executed (per thread: its WQEs / its own end), \
         over the rounds no other task disturbed (\"quiet\": no engine thread waited for its CPU more than {:.0} % of its span); \
         CPU: the thread's CPU clock until its end, and what the threads would do each on a CPU of its own (sum of 1 / CPU per WQE), over all rounds; \
         waited: time the thread was runnable but another task had its CPU",
        DISTURBED * 100.0
    );
    println!(
        "  {:>2} | {:>5} | {:>10} | {:>8} | {:>15} | {:>12} | {:>10} | {:>8} | {:>11}",
        "T",
        "quiet",
        "wall M/s",
        "speed-up",
        "per thread M/s",
        "CPU ns/WQE",
        "CPU M/s",
        "speed-up",
        "waited ms"
    );
    let cpu_mpps = |r: &DrainRun| -> f64 { r.per.iter().map(|x| 1e3 / x.ns_per_wqe()).sum() };
    let quiet = |t: usize| {
        runs.iter()
            .filter(|r| r.threads == t && !r.disturbed())
            .count()
    };
    // Wall-clock figures over the quiet rounds (all if none was), CPU
    // figures over all.
    let of = |t: usize, wall: bool, f: &dyn Fn(&DrainRun) -> f64| -> f64 {
        let only_quiet = wall && quiet(t) > 0;
        median(
            &runs
                .iter()
                .filter(|r| r.threads == t && !(only_quiet && r.disturbed()))
                .map(f)
                .collect::<Vec<_>>(),
        )
    };
    let (base_wall, base_cpu) = if counts.contains(&1) {
        (of(1, true, &DrainRun::mpps), of(1, false, &cpu_mpps))
    } else {
        (f64::NAN, f64::NAN)
    };
    for &t in &counts {
        let wall = of(t, true, &DrainRun::mpps);
        let cpu = of(t, false, &cpu_mpps);
        let col = |wall: bool, f: &dyn Fn(&ThreadRun) -> f64| -> Vec<f64> {
            (0..t)
                .map(|i| of(t, wall, &|r: &DrainRun| r.per.get(i).map_or(f64::NAN, f)))
                .collect()
        };
        let rate = col(true, &ThreadRun::mpps);
        let ns = col(false, &ThreadRun::ns_per_wqe);
        let waited = col(false, &|x: &ThreadRun| x.wait_ns as f64 / 1e6);
        let list = |v: &[f64], prec: usize| {
            v.iter()
                .map(|x| format!("{x:.prec$}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "  {:>2} | {:>5} | {:>10.2} | {:>8.2} | {:>15} | {:>12} | {:>10.2} | {:>8.2} | {:>11}",
            t,
            format!("{}/{}", quiet(t), reps),
            wall,
            wall / base_wall,
            list(&rate, 2),
            list(&ns, 0),
            cpu,
            cpu / base_cpu,
            list(&waited, 1)
        );
        sum.add(format!("drain.t{t}.quiet_rounds"), quiet(t) as f64);
        sum.add(format!("drain.t{t}.wall_mpps"), wall);
        sum.add(format!("drain.t{t}.cpu_mpps"), cpu);
        if base_wall.is_finite() {
            sum.add(format!("drain.t{t}.wall_speedup"), wall / base_wall);
            sum.add(format!("drain.t{t}.cpu_speedup"), cpu / base_cpu);
        }
        for (i, (r, c)) in rate.iter().zip(&ns).enumerate() {
            sum.add(format!("drain.t{t}.engine{i}.wall_mpps"), *r);
            sum.add(format!("drain.t{t}.engine{i}.cpu_ns_per_wqe"), *c);
        }
    }
    let post = median(&runs.iter().map(|r| r.post_ns).collect::<Vec<_>>());
    println!(
        "  the client (CPU {}) posted at {post:.0} ns per WQE (median; post_send of {POST_BATCH} at a time, engines held)",
        args.client_cpu
    );
    sum.add("drain.post_ns_per_wqe", post);
    Ok(())
}
