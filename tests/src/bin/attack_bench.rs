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
//! The attacks, each what a guest can do with its own objects:
//! - `huge-send`: SENDs of `--msg-mib` MiB (default 1 GiB) from a region of
//!   one repeated page into another, to its own second VM, two in flight;
//! - `huge-read`: the same with RDMA READs;
//! - `retry-nowhere`: 8 RC QPs with `timeout` 0 (retry without end) to a
//!   QP number that exists nowhere, each with such a SEND at its head;
//! - `flush-storm`: a QP in ERR whose 16,384-deep send queue the guest
//!   refills as fast as it is flushed (no control command involved);
//! - `ctrl-heavy`: registering and deregistering a 16 GiB region of one
//!   repeated page in a loop (the control path holds the VM's lock);
//! - `self-send`: 8 RC QP pairs inside one VM, each keeping a SEND of
//!   `--msg-mib` or twice that (at most 2 GiB) going between two regions
//!   of one repeated page each (two pages of RAM in all);
//! - `self-send-2vm`: the same in each of the attacker's two VMs;
//! - `hog`: not an attack but the reference of an honest heavy tenant,
//!   64 KiB RDMA WRITEs on 8 QPs, 64 deep.
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
use vhost_user_rdma_tests::bench::{
    lat_client, lat_client_paced, loadavg, median, pin_current, print_header, thread_cpu_times,
    thread_placement, verdict, LatResult,
};
use vhost_user_rdma_tests::dp::{rc_pair, repeated_page_mr, Buf, Vm, QP_ACCESS};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;

use virtio_rdma_driver::{
    Cq, DmaBuf, Error as DriverError, Mr, Payload, Qp, QpCap, QpInit, RcConnect, RecvWr, SendFlags,
    SendOp, SendWr, WorkCompletion,
};

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const WARMUP: Duration = Duration::from_millis(300);
/// Sleep of an attacker with nothing to do for now.
const NAP: Duration = Duration::from_millis(1);
const ATTACKS: [&str; 8] = [
    "huge-send",
    "huge-read",
    "retry-nowhere",
    "flush-storm",
    "ctrl-heavy",
    "self-send",
    "self-send-2vm",
    "hog",
];
/// QP pairs of a `self-send` attacker VM.
const SELF_PAIRS: usize = 8;
/// The largest message (the port's `max_msg_size`).
const MAX_MSG: u64 = 1 << 31;

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

/// A region of `len` bytes at `iova` made of `page` repeated.
fn repeated(vm: &Vm, page: &DmaBuf, iova: u64, len: u64) -> Res<Mr> {
    // SAFETY: the attack keeps `page` allocated for as long as the region
    // (both live in the same attack object, the region dropped first) and
    // never reads it through a Rust reference.
    Ok(unsafe { repeated_page_mr(vm, page, iova, len) }?)
}

fn qp(vm: &Vm, cq: &Arc<Cq>, send: u32, recv: u32) -> Res<Qp> {
    let mut init = QpInit::rc(cq);
    init.cap = QpCap {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    Ok(Qp::create(&vm.pd, &init)?)
}

fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) -> Res<()> {
    qa.rc_connect(QP_ACCESS, &RcConnect::new(qb.qpn(), b.dev.gid()))?;
    qb.rc_connect(QP_ACCESS, &RcConnect::new(qa.qpn(), a.dev.gid()))?;
    Ok(())
}

/// One attack's objects, driven by [`Attack::step`] on the attacker's
/// thread. Fields are dropped in order: regions before their pages.
#[allow(clippy::large_enum_variant)] // One per run; never moved in a loop.
enum Attack {
    /// Huge SENDs or READs between two regions of a repeated page.
    Huge {
        read: bool,
        qa: Qp,
        qb: Qp,
        cqa: Arc<Cq>,
        cqb: Arc<Cq>,
        src: Mr,
        dst: Mr,
        outstanding: usize,
        _pages: (DmaBuf, DmaBuf),
    },
    /// QPs retrying without end; nothing to drive.
    Nowhere {
        _qps: Vec<Qp>,
        _cq: Arc<Cq>,
        _src: Mr,
        _page: DmaBuf,
    },
    /// A QP in ERR refilled as fast as it is flushed.
    Flush {
        qp: Qp,
        cq: Arc<Cq>,
        buf: Buf,
        depth: usize,
        outstanding: usize,
    },
    /// Registering and deregistering a huge region.
    Ctrl { vm: Arc<Vm>, page: DmaBuf },
    /// Huge SENDs between QP pairs inside the attacker's VMs.
    SelfSend(Vec<SelfSender>),
    /// 64 KiB WRITEs, deep.
    Hog {
        qps: Vec<Qp>,
        _peers: Vec<Qp>,
        cq: Arc<Cq>,
        _cqb: Arc<Cq>,
        src: Buf,
        dst: Buf,
        outstanding: Vec<usize>,
    },
}

/// One attacker VM sending huge messages to itself: [`SELF_PAIRS`] RC QP
/// pairs, each with one SEND of `msg` or `2 msg` (at most [`MAX_MSG`])
/// bytes in flight, from a region of one repeated page into another.
/// Fields are dropped in order: regions before their pages.
struct SelfSender {
    pairs: Vec<(Qp, Qp)>,
    busy: Vec<bool>,
    scq: Arc<Cq>,
    rcq: Arc<Cq>,
    posted: u64,
    src: Mr,
    dst: Mr,
    _pages: (DmaBuf, DmaBuf),
}

impl SelfSender {
    fn new(vm: &Vm, msg: u64) -> Res<SelfSender> {
        let (scq, rcq) = (Cq::create(&vm.dev, 64)?, Cq::create(&vm.dev, 64)?);
        let mut pairs = Vec::new();
        for _ in 0..SELF_PAIRS {
            let (qa, qb) = (qp(vm, &scq, 4, 4)?, qp(vm, &rcq, 4, 4)?);
            connect(vm, &qa, vm, &qb)?;
            pairs.push((qa, qb));
        }
        let (ps, pd) = (vm.dev.alloc_dma(4096, 4096)?, vm.dev.alloc_dma(4096, 4096)?);
        let big = msg.saturating_mul(2).min(MAX_MSG);
        let src = repeated(vm, &ps, 0x100_0000_0000, big)?;
        let dst = repeated(vm, &pd, 0x200_0000_0000, big)?;
        Ok(SelfSender {
            busy: vec![false; pairs.len()],
            pairs,
            scq,
            rcq,
            posted: 0,
            src,
            dst,
            _pages: (ps, pd),
        })
    }

    /// Reaps completions and gives every idle pair its next SEND; false if
    /// there was nothing to do.
    fn step(&mut self, msg: u64) -> Res<bool> {
        let mut wc = [WorkCompletion::default(); 64];
        let done = self.scq.poll(&mut wc);
        for w in &wc[..done] {
            if !w.is_success() {
                return Err(format!("self-send: {w:?}").into());
            }
            if let Some(b) = self.busy.get_mut(usize::try_from(w.wr_id)?) {
                *b = false;
            }
        }
        let _ = self.rcq.poll(&mut wc);
        let big = msg.saturating_mul(2).min(MAX_MSG);
        let mut any = done > 0;
        for (i, (qa, qb)) in self.pairs.iter().enumerate() {
            if self.busy[i] {
                continue;
            }
            let len = if self.posted % 2 == 0 { msg } else { big };
            let len = u32::try_from(len)?;
            qb.post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[self.dst.sge(0, len)?],
            }])?;
            qa.post_send(&[SendWr::signaled(
                i as u64,
                SendOp::Send,
                &[self.src.sge(0, len)?],
            )])?;
            self.busy[i] = true;
            self.posted += 1;
            any = true;
        }
        Ok(any)
    }
}

const HUGE_DEPTH: usize = 2;
const HOG_DEPTH: usize = 64;
const HOG_SIZE: usize = 64 << 10;

impl Attack {
    fn new(name: &str, a: &Arc<Vm>, b: &Vm, msg: u64) -> Res<Attack> {
        Ok(match name {
            "huge-send" | "huge-read" => {
                let (cqa, cqb) = (Cq::create(&a.dev, 64)?, Cq::create(&b.dev, 64)?);
                let (qa, qb) = (qp(a, &cqa, 16, 16)?, qp(b, &cqb, 16, 16)?);
                connect(a, &qa, b, &qb)?;
                let (pa, pb) = (a.dev.alloc_dma(4096, 4096)?, b.dev.alloc_dma(4096, 4096)?);
                let src = repeated(a, &pa, 0x100_0000_0000, msg)?;
                let dst = repeated(b, &pb, 0x200_0000_0000, msg)?;
                Attack::Huge {
                    read: name == "huge-read",
                    qa,
                    qb,
                    cqa,
                    cqb,
                    src,
                    dst,
                    outstanding: 0,
                    _pages: (pa, pb),
                }
            }
            "retry-nowhere" => {
                let cq = Cq::create(&a.dev, 64)?;
                let page = a.dev.alloc_dma(4096, 4096)?;
                let src = repeated(a, &page, 0x100_0000_0000, msg)?;
                let len = u32::try_from(msg.min(u64::from(u32::MAX)))?;
                let mut qps = Vec::new();
                for i in 0..8u32 {
                    let q = qp(a, &cq, 4, 4)?;
                    // A QP number of the peer's GID that no QP has.
                    let mut c = RcConnect::new(0x00ab_cd00 + i, b.dev.gid());
                    c.timeout = 0;
                    q.rc_connect(QP_ACCESS, &c)?;
                    let sge = [src.sge(0, len)?];
                    q.post_send(&[SendWr::signaled(1, SendOp::Send, &sge)])?;
                    qps.push(q);
                }
                Attack::Nowhere {
                    _qps: qps,
                    _cq: cq,
                    _src: src,
                    _page: page,
                }
            }
            "flush-storm" => {
                let depth = 16_384;
                let cq = Cq::create(&a.dev, 65_536)?;
                let q = qp(a, &cq, u32::try_from(depth)?, 16)?;
                q.to_error()?;
                Attack::Flush {
                    qp: q,
                    cq,
                    buf: Buf::new(a, 4096),
                    depth,
                    outstanding: 0,
                }
            }
            "self-send" => Attack::SelfSend(vec![SelfSender::new(a, msg)?]),
            "self-send-2vm" => {
                Attack::SelfSend(vec![SelfSender::new(a, msg)?, SelfSender::new(b, msg)?])
            }
            "ctrl-heavy" => Attack::Ctrl {
                vm: a.clone(),
                page: a.dev.alloc_dma(4096, 4096)?,
            },
            "hog" => {
                let cq = Cq::create(&a.dev, 4096)?;
                let cqb = Cq::create(&b.dev, 64)?;
                let (mut qps, mut peers) = (Vec::new(), Vec::new());
                for _ in 0..8 {
                    let (qa, qb) = (qp(a, &cq, 2 * HOG_DEPTH as u32, 4)?, qp(b, &cqb, 4, 4)?);
                    connect(a, &qa, b, &qb)?;
                    qps.push(qa);
                    peers.push(qb);
                }
                Attack::Hog {
                    outstanding: vec![0; qps.len()],
                    qps,
                    _peers: peers,
                    cq,
                    _cqb: cqb,
                    src: Buf::new(a, HOG_SIZE),
                    dst: Buf::new(b, HOG_SIZE),
                }
            }
            other => return Err(format!("unknown attack {other}").into()),
        })
    }

    /// Drives the attack a little; false if there was nothing to do.
    fn step(&mut self, msg: u64) -> Res<bool> {
        let mut wc = [WorkCompletion::default(); 64];
        match self {
            Attack::Huge {
                read,
                qa,
                qb,
                cqa,
                cqb,
                src,
                dst,
                outstanding,
                ..
            } => {
                let done = cqa.poll(&mut wc);
                *outstanding = outstanding.saturating_sub(done);
                let _ = cqb.poll(&mut wc);
                let len = u32::try_from(msg.min(u64::from(u32::MAX)))?;
                let mut any = done > 0;
                while *outstanding < HUGE_DEPTH {
                    let op = if *read {
                        SendOp::RdmaRead {
                            remote_addr: dst.iova(),
                            rkey: dst.rkey(),
                        }
                    } else {
                        qb.post_recv(&[RecvWr {
                            wr_id: 0,
                            sg_list: &[dst.sge(0, len)?],
                        }])?;
                        SendOp::Send
                    };
                    qa.post_send(&[SendWr::signaled(0, op, &[src.sge(0, len)?])])?;
                    *outstanding += 1;
                    any = true;
                }
                Ok(any)
            }
            Attack::Nowhere { .. } => Ok(false),
            Attack::Flush {
                qp,
                cq,
                buf,
                depth,
                outstanding,
            } => {
                let mut any = false;
                loop {
                    let k = cq.poll(&mut wc);
                    *outstanding = outstanding.saturating_sub(k);
                    any |= k > 0;
                    if k < wc.len() {
                        break;
                    }
                }
                let sge = [buf.sge(0, 8)];
                let wrs: Vec<SendWr<'_>> = (0..(*depth - *outstanding).min(256))
                    .map(|i| SendWr {
                        wr_id: i as u64,
                        op: SendOp::Send,
                        payload: Payload::Sges(&sge),
                        flags: SendFlags::NONE,
                        ud: None,
                    })
                    .collect();
                if !wrs.is_empty() {
                    match qp.post_send(&wrs) {
                        Ok(()) => {
                            *outstanding += wrs.len();
                            any = true;
                        }
                        // The device has not published its consumer index
                        // past the flushed ones yet: refill next time.
                        Err(DriverError::QueueFull { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(any)
            }
            Attack::Ctrl { vm, page } => {
                let mr = repeated(vm, page, 0x100_0000_0000, 16 << 30)?;
                drop(mr);
                Ok(true)
            }
            Attack::SelfSend(senders) => {
                let mut any = false;
                for s in senders {
                    any |= s.step(msg)?;
                }
                Ok(any)
            }
            Attack::Hog {
                qps,
                cq,
                src,
                dst,
                outstanding,
                ..
            } => {
                let k = cq.poll(&mut wc);
                for w in &wc[..k] {
                    if let Some(o) = outstanding.get_mut(usize::try_from(w.wr_id)?) {
                        *o = o.saturating_sub(HOG_DEPTH / 4);
                    }
                }
                let sge = [src.sge(0, HOG_SIZE)];
                let op = SendOp::RdmaWrite {
                    remote_addr: dst.addr(0),
                    rkey: dst.mr.rkey(),
                };
                let mut any = k > 0;
                for (i, q) in qps.iter().enumerate() {
                    while outstanding[i] + HOG_DEPTH / 4 <= HOG_DEPTH {
                        let wrs: Vec<SendWr<'_>> = (0..HOG_DEPTH / 4)
                            .map(|j| SendWr {
                                wr_id: i as u64,
                                op,
                                payload: Payload::Sges(&sge),
                                flags: if j + 1 == HOG_DEPTH / 4 {
                                    SendFlags::SIGNALED
                                } else {
                                    SendFlags::NONE
                                },
                                ud: None,
                            })
                            .collect();
                        q.post_send(&wrs)?;
                        outstanding[i] += HOG_DEPTH / 4;
                        any = true;
                    }
                }
                Ok(any)
            }
        }
    }
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
                        // An attack with nothing to drive (its QPs retry
                        // by themselves) must not cost the victim's CPU.
                        let nap = if matches!(at, Attack::Nowhere { .. }) {
                            Duration::from_millis(50)
                        } else {
                            NAP
                        };
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
