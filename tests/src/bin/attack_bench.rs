//! The attack catalogue: a victim pair in one tenant measures its latency
//! and throughput (one 64-byte RDMA WRITE at a time, post to completion)
//! alone and while a hostile guest in another tenant runs one attack at a
//! time on the same engine thread, as three kinds of victim (`--victims`):
//! `closed` posts its next WRITE as soon as the last completes; `1ms` and
//! `10ms` post one WRITE per millisecond or per 10 ms and sleep between
//! them, so that their VM is idle (and parked by the engine) when each
//! WRITE is posted; under the QoS setting that
//! docs/isolation.md guarantees against a heavy honest tenant (the
//! victim's tenant and VMs at weight 1000, the attacker's at 1;
//! `--default-qos` for equal weights). Target: victim p99 ≤ 2 × alone and
//! throughput ≥ 0.9 × alone under every attack — the guarantee holds
//! against an adversary too.
//!
//! The attacks are the catalogue of `vhost_user_rdma_tests::attack`.
//!
//! Clients and attackers run on `--client-cpu` (the attacker at nice 19, or
//! SCHED_IDLE with `--attacker-idle`), the daemon on `--engine-cpu`. Nothing here asserts a timing: the
//! verdicts are printed. Each line also gives the share of the window in
//! which the victim's client thread was ready to run but waited for its
//! CPU (`/proc/thread-self/schedstat`): a closed loop's rate is its
//! client's as much as the engine's.
//!
//! Run: `cargo build --release -p vhost-user-rdma-tests --bin attack_bench &&
//! target/release/attack_bench --runs 3`

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use vhost_user_rdma::config::TenantConfig;
use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma_tests::attack::{Attack, ATTACKS};
use vhost_user_rdma_tests::bench::{
    lat_client, lat_client_paced, loadavg, median, pin_current, print_header, thread_cpu_times,
    thread_placement, verdict, LatResult,
};
use vhost_user_rdma_tests::dp::{rc_pair, Buf, Vm};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;

use virtio_rdma_driver::SendOp;

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const WARMUP: Duration = Duration::from_millis(300);
#[derive(Parser, Debug)]
#[command(about = "Attack catalogue of vhost-user-rdma's engine (see docs/isolation.md)")]
struct Args {
    /// Comma-separated attacks (see the module documentation), or all.
    #[arg(default_value = "all")]
    attacks: String,
    /// Runs of every measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds of every measured window.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Size of the huge messages, MiB.
    #[arg(long, default_value_t = 1024)]
    msg_mib: u64,
    /// CPU of the clients (victim and attacker).
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of the daemon (engine).
    #[arg(long, default_value_t = 1)]
    engine_cpu: usize,
    /// Comma-separated victims: `closed` (the next WRITE as soon as the
    /// last completes), `1ms` and `10ms` (one WRITE per interval, idle
    /// between them).
    #[arg(long, default_value = "closed,1ms,10ms")]
    victims: String,
    /// Tiny version (smoke test).
    #[arg(long)]
    quick: bool,
    /// Run the attacker's client at SCHED_IDLE instead of nice 19: closer
    /// to a guest on vCPUs of its own, which never holds the victim's
    /// guest CPU (a nice-19 thread keeps a CPU for its EEVDF slice once it
    /// has it; an idle one yields at once to any other thread).
    #[arg(long)]
    attacker_idle: bool,
    /// Run with the daemon's default QoS (equal weights) instead of the
    /// isolation setting of docs/isolation.md (the victim's tenant and VMs
    /// at weight 1000, the attacker's at 1).
    #[arg(long)]
    default_qos: bool,
}

/// A daemon with VMs 0 and 1 in tenant "lat", 2 and 3 in "evil", started
/// from a thread pinned to the engine CPU (its threads inherit it).
fn daemon(args: &Args) -> Res<TestDaemon> {
    let cpu = args.engine_cpu;
    std::thread::scope(|s| {
        s.spawn(move || -> Res<TestDaemon> {
            pin_current(cpu)?;
            Ok(TestDaemon::with_config(4, |c| {
                for (name, vms) in [("lat", [0, 1]), ("evil", [2, 3])] {
                    c.tenants.push(TenantConfig {
                        nic_share: 1,
                        name: name.to_string(),
                        qos_class: None,
                        engine: None,
                        remote_gids: Vec::new(),
                        fabric: Default::default(),
                    });
                    for v in vms {
                        c.vms[v].tenant = name.to_string();
                    }
                }
            })?)
        })
        .join()
        .map_err(|_| BoxError::from("launcher panicked"))?
    })
}

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.quick {
        args.runs = 1;
        args.secs = args.secs.min(0.3);
        args.msg_mib = args.msg_mib.min(64);
    }
    let args = args;
    print_header("attack_bench");
    println!(
        "  placement: clients on CPU {} (the attacker's at {}), daemon on CPU {}; {} runs of {} s; huge messages {} MiB; {}",
        args.client_cpu,
        if args.attacker_idle { "SCHED_IDLE" } else { "nice 19" },
        args.engine_cpu,
        args.runs,
        args.secs,
        args.msg_mib,
        if args.default_qos {
            "default QoS (equal weights, no limits)"
        } else {
            "weights: victim tenant and VMs 1000, attacker's 1 (docs/isolation.md)"
        }
    );
    let attacks: Vec<&str> = if args.attacks == "all" {
        ATTACKS.to_vec()
    } else {
        args.attacks.split(',').map(str::trim).collect()
    };
    let msg = args.msg_mib << 20;
    let d = daemon(&args)?;
    if !args.default_qos {
        let w = |weight| QosSpec {
            weight,
            ..QosSpec::default()
        };
        let tenancy = d.daemon().tenancy().clone();
        for (vm, weight) in [(0, 1000), (1, 1000), (2, 1), (3, 1)] {
            d.set_vm_qos(vm, w(weight))?;
            if vm % 2 == 0 {
                let t = tenancy.tenant_of(vm).ok_or("tenant")?;
                d.set_tenant_qos(t, w(weight))?;
            }
        }
    }
    pin_current(args.client_cpu)?;
    let vms: Vec<Arc<Vm>> = (0..4)
        .map(|i| Arc::new(Vm::open(&d, i, VmmOptions::default())))
        .collect();
    let victim = rc_pair(&vms[0], &vms[1]);
    let (vsrc, vdst) = (Buf::new(&vms[0], 4096), Buf::new(&vms[1], 4096));
    let vop = SendOp::RdmaWrite {
        remote_addr: vdst.addr(0),
        rkey: vdst.mr.rkey(),
    };
    let victims: Vec<Victim> = args
        .victims
        .split(',')
        .map(|v| Victim::parse(v.trim()))
        .collect::<Res<_>>()?;
    let scenarios: Vec<&str> = std::iter::once("alone").chain(attacks).collect();
    // res[scenario][victim]: one result per run.
    let mut res: Vec<Vec<Vec<LatResult>>> = vec![vec![Vec::new(); victims.len()]; scenarios.len()];
    // The victim VM's notifications (kicks) per WRITE, same indices.
    let mut kicks: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); victims.len()]; scenarios.len()];
    // The share of the window in which the victim's client thread waited
    // for its CPU (ready, not running), same indices: a closed loop's rate
    // is its client's as much as the engine's.
    let mut waited: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); victims.len()]; scenarios.len()];
    let stop = AtomicBool::new(false);
    let notifications = || {
        d.daemon()
            .tenancy()
            .traffic(0)
            .map_or(0, |t| t.snapshot().notifications)
    };
    for run in 0..args.runs {
        for (k, name) in scenarios.iter().enumerate() {
            let attack = match *name {
                "alone" => None,
                n => Some(Attack::new(n, &vms[2], &vms[3], msg)?),
            };
            let lats = std::thread::scope(|s| -> Res<Vec<(LatResult, f64, f64)>> {
                stop.store(false, Ordering::Relaxed);
                let h = attack.map(|mut at| {
                    let (cpu, stop, idle) = (args.client_cpu, &stop, args.attacker_idle);
                    s.spawn(move || -> Res<()> {
                        pin_current(cpu)?;
                        // SAFETY: plain system calls on the calling thread.
                        unsafe {
                            let tid = libc::gettid();
                            libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid)?, 19);
                        }
                        if idle {
                            let p = libc::sched_param { sched_priority: 0 };
                            // SAFETY: a plain system call on the calling
                            // thread with a valid parameter block.
                            if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) } != 0 {
                                return Err(std::io::Error::last_os_error().into());
                            }
                        }
                        let nap = at.nap();
                        while !stop.load(Ordering::Relaxed) {
                            if !at.step(msg)? {
                                std::thread::sleep(nap);
                            }
                        }
                        Ok(())
                    })
                });
                std::thread::sleep(WARMUP);
                let mut out = Vec::new();
                for v in &victims {
                    let n0 = notifications();
                    let (t0, c0) = (std::time::Instant::now(), thread_cpu_times());
                    let sge = vsrc.sge(0, 64);
                    let lat = match v.interval {
                        None => lat_client(&victim.cqa, &victim.qa, sge, vop, args.secs),
                        Some(i) => {
                            lat_client_paced(&victim.cqa, &victim.qa, sge, vop, args.secs, i)
                        }
                    };
                    let lat = match lat {
                        Ok(l) => l,
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    };
                    let ops = (lat.ops * args.secs).max(1.0);
                    let wait = thread_cpu_times().1.saturating_sub(c0.1) as f64
                        / t0.elapsed().as_nanos().max(1) as f64;
                    out.push((lat, notifications().saturating_sub(n0) as f64 / ops, wait));
                }
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = h {
                    h.join()
                        .map_err(|_| BoxError::from("attacker panicked"))??;
                }
                Ok(out)
            })?;
            for (j, (lat, kpo, wait)) in lats.into_iter().enumerate() {
                println!(
                    "  run {}: {:<14} {:<6} p50 {:>8.2} us  p90 {:>8.2} us  p99 {:>9.2} us  max {:>10.1} us  {:>9.0} ops/s  {:.2} kicks/op  client waited {:>4.1} %",
                    run + 1,
                    name,
                    victims[j].name,
                    lat.p50,
                    lat.p90,
                    lat.p99,
                    lat.max,
                    lat.ops,
                    kpo,
                    wait * 100.0
                );
                res[k][j].push(lat);
                kicks[k][j].push(kpo);
                waited[k][j].push(wait * 100.0);
            }
        }
    }
    println!(
        "\n  medians over {} runs; ratios are medians of each run's ratio to the same victim alone in that run (target: p99 <= 2 x alone, ops >= 0.9 x alone):",
        args.runs
    );
    let cmdline: Vec<String> = std::env::args().collect();
    let mut summary = Vec::new();
    let mut misses = 0;
    for (j, v) in victims.iter().enumerate() {
        let m = |k: usize, f: fn(&LatResult) -> f64| {
            median(&res[k][j].iter().map(f).collect::<Vec<_>>())
        };
        // Ratios to the victim alone *of the same run*: this machine's
        // speed changes by 2x between minutes, so medians of absolute
        // values across runs compare different machines.
        let ratio = |k: usize, f: fn(&LatResult) -> f64| {
            let r: Vec<f64> = res[k][j]
                .iter()
                .zip(&res[0][j])
                .map(|(x, alone)| f(x) / f(alone))
                .collect();
            median(&r)
        };
        for (k, name) in scenarios.iter().enumerate() {
            let (p50, p90, p99, ops) = (
                m(k, |r| r.p50),
                m(k, |r| r.p90),
                m(k, |r| r.p99),
                m(k, |r| r.ops),
            );
            let (rp, ro) = (ratio(k, |r| r.p99), ratio(k, |r| r.ops));
            let kpo = median(&kicks[k][j]);
            let cw = median(&waited[k][j]);
            let v_ = if k == 0 {
                "-"
            } else {
                let ok = rp <= 2.0 && ro >= 0.9;
                misses += usize::from(!ok);
                verdict(ok)
            };
            let line = format!(
                "{name:<14} {:<6} p50 {p50:>8.2} us  p90 {p90:>8.2} us  p99 {p99:>9.2} us ({rp:>6.2} x alone)  {ops:>9.0} ops/s ({ro:>4.2} x alone)  {kpo:>4.2} kicks/op  client waited {cw:>4.1} %  {v_}",
                v.name
            );
            println!("    {line}");
            summary.push(line);
        }
    }
    println!("\n  threads by CPU: {}", thread_placement());
    println!("  load average at end: {}", loadavg());
    println!("\nsummary ({}):", cmdline.join(" "));
    for s in summary {
        println!("  {s}");
    }
    println!("  misses: {misses}");
    Ok(())
}

/// A kind of victim client.
struct Victim {
    /// As given on the command line.
    name: String,
    /// One WRITE per this (None: closed loop).
    interval: Option<Duration>,
}

impl Victim {
    fn parse(v: &str) -> Res<Victim> {
        let interval = match v {
            "closed" => None,
            _ => {
                let ms: u64 = v
                    .strip_suffix("ms")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("victim {v}: closed or <n>ms"))?;
                Some(Duration::from_millis(ms.max(1)))
            }
        };
        Ok(Victim {
            name: v.to_string(),
            interval,
        })
    }
}
