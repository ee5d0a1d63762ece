//! The workloads of a scenario on their VMs: honest ones (one operation,
//! closed loop or paced) and attacks from the catalogue. Each runs on a
//! thread of its own between its start and stop times and records what
//! completed in a [`Recorder`].

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::attack::{rc_qp, Attack};
use vhost_user_rdma_tests::dp::{Vm, QP_ACCESS};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, DmaBuf, Mr, Payload, Qp, RcConnect, RecvWr, SendFlags, SendOp, SendWr, Sge, WorkCompletion,
};

use crate::record::Recorder;
use crate::scenario::{Kind, Op, Workload};

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Buffers this aligned are guest-physically contiguous in the test VMM
/// (as hugepages in a real guest), so the engine's copies are not split.
const CONTIGUOUS: usize = 2 << 20;
/// READs and atomics in flight per QP (the device's default limit).
const RD_ATOMIC: u32 = 16;

/// A registered buffer.
struct Buf {
    _buf: Arc<DmaBuf>,
    mr: Mr,
}

impl Buf {
    fn new(vm: &Vm, len: usize) -> Res<Buf> {
        let buf = Arc::new(
            vm.dev
                .alloc_dma(len, CONTIGUOUS.min(len.next_power_of_two()))?,
        );
        buf.fill(0, len, 0x5A)?;
        let mr = Mr::register(&vm.pd, buf.clone(), access::ALL)?;
        Ok(Buf { _buf: buf, mr })
    }
}

/// An honest workload's objects.
pub struct Honest {
    op: Op,
    size: u32,
    depth: usize,
    rate: Option<f64>,
    nap: Duration,
    cq: Arc<Cq>,
    qps: Vec<Qp>,
    // Dropped after the QPs that point at them.
    peers: Vec<Qp>,
    peer_cq: Arc<Cq>,
    local: Buf,
    remote: Buf,
    /// Post times of each QP's outstanding work requests, oldest first
    /// (an RC QP completes in order).
    posted: Vec<VecDeque<Instant>>,
    next_qp: usize,
}

/// A workload ready to run.
pub enum Runner {
    /// One operation, closed loop or paced.
    Honest(Box<Honest>),
    /// An attack of the catalogue; its message size.
    Attack(Box<Attack>, u64),
}

fn connect(q: &Qp, peer: &Qp, peer_vm: &Vm) -> Res<()> {
    let mut c = RcConnect::new(peer.qpn(), peer_vm.dev.gid());
    c.max_rd_atomic = RD_ATOMIC;
    c.max_dest_rd_atomic = RD_ATOMIC;
    q.rc_connect(QP_ACCESS, &c)?;
    Ok(())
}

fn cq_size(entries: u32) -> u32 {
    entries.saturating_add(64).next_power_of_two().min(65_536)
}

impl Runner {
    /// Sets workload `w` up on its VMs (`vms`, by index): QPs, buffers and
    /// the peer's side.
    pub fn new(w: &Workload, vms: &[Arc<Vm>]) -> Res<Runner> {
        let (vm, peer) = (&vms[w.vm], &vms[w.peer]);
        match &w.kind {
            Kind::Attack { name, msg } => Ok(Runner::Attack(
                Box::new(Attack::new(name, vm, peer, *msg)?),
                *msg,
            )),
            Kind::Honest {
                op,
                size,
                qps,
                depth,
                rate,
                nap_us,
            } => {
                let outstanding = qps.saturating_mul(*depth);
                let cq = Cq::create(&vm.dev, cq_size(outstanding))?;
                let peer_cq = Cq::create(&peer.dev, cq_size(outstanding))?;
                // Room for the window plus completions the driver has seen
                // before the device's consumer index moves.
                let sq = depth.saturating_mul(2).max(8);
                let rq = if *op == Op::Send { sq } else { 4 };
                let mut q = Vec::new();
                let mut p = Vec::new();
                for _ in 0..*qps {
                    let a = rc_qp(vm, &cq, sq, 4)?;
                    let b = rc_qp(peer, &peer_cq, 4, rq)?;
                    connect(&a, &b, peer)?;
                    connect(&b, &a, vm)?;
                    q.push(a);
                    p.push(b);
                }
                let len = usize::try_from(*size)?;
                let h = Honest {
                    op: *op,
                    size: *size,
                    depth: usize::try_from(*depth)?,
                    rate: *rate,
                    nap: Duration::from_micros(*nap_us),
                    cq,
                    posted: vec![VecDeque::new(); q.len()],
                    qps: q,
                    peers: p,
                    peer_cq,
                    local: Buf::new(vm, len)?,
                    remote: Buf::new(peer, len)?,
                    next_qp: 0,
                };
                if h.op == Op::Send {
                    for i in 0..h.peers.len() {
                        for _ in 0..h.depth {
                            h.post_recv(i)?;
                        }
                    }
                }
                Ok(Runner::Honest(Box::new(h)))
            }
        }
    }

    /// Runs from `t0 + w.start_s` to `t0 + w.stop_s` (or until `abort`),
    /// recording into `rec`.
    pub fn run(
        &mut self,
        w: &Workload,
        t0: Instant,
        abort: &AtomicBool,
        rec: &mut Recorder,
    ) -> Res<()> {
        let start = t0 + Duration::from_secs_f64(w.start_s);
        let end = t0 + Duration::from_secs_f64(w.stop_s);
        while Instant::now() < start {
            if abort.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(
                start
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(20)),
            );
        }
        match self {
            Runner::Honest(h) => h.run(end, abort, rec),
            Runner::Attack(a, msg) => {
                let nap = a.nap();
                while Instant::now() < end && !abort.load(Ordering::Relaxed) {
                    // What an attack moves is read from the daemon's
                    // counters of its VM: it has no latency to record.
                    if !a.step(*msg)? {
                        std::thread::sleep(nap);
                    }
                }
                Ok(())
            }
        }
    }
}

impl Honest {
    fn post_recv(&self, i: usize) -> Res<()> {
        let sge = self.remote.mr.sge(0, self.size)?;
        self.peers[i].post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[sge],
        }])?;
        Ok(())
    }

    fn op(&self) -> SendOp {
        match self.op {
            Op::Write => SendOp::RdmaWrite {
                remote_addr: self.remote.mr.iova(),
                rkey: self.remote.mr.rkey(),
            },
            Op::Read => SendOp::RdmaRead {
                remote_addr: self.remote.mr.iova(),
                rkey: self.remote.mr.rkey(),
            },
            Op::Send => SendOp::Send,
        }
    }

    /// Posts `n` signaled work requests on QP `i`.
    fn post(&mut self, i: usize, n: usize, sge: &[Sge; 1]) -> Res<()> {
        let op = self.op();
        let wrs: Vec<SendWr<'_>> = (0..n)
            .map(|_| SendWr {
                wr_id: i as u64,
                op,
                payload: Payload::Sges(sge),
                flags: SendFlags::SIGNALED,
                ud: None,
            })
            .collect();
        self.qps[i].post_send(&wrs)?;
        let now = Instant::now();
        self.posted[i].extend(std::iter::repeat_n(now, n));
        Ok(())
    }

    /// Records the completions there are; their number.
    fn reap(&mut self, wc: &mut [WorkCompletion], rec: &mut Recorder) -> Res<usize> {
        let mut total = 0;
        loop {
            let k = self.cq.poll(wc);
            let now = Instant::now();
            for c in &wc[..k] {
                if !c.is_success() {
                    return Err(format!("a work request failed: {c:?}").into());
                }
                let i = usize::try_from(c.wr_id)?;
                let posted = self
                    .posted
                    .get_mut(i)
                    .and_then(VecDeque::pop_front)
                    .ok_or("a completion nothing was posted for")?;
                rec.complete(posted, now, u64::from(self.size));
            }
            total += k;
            if k < wc.len() {
                break;
            }
        }
        if self.op == Op::Send {
            loop {
                let k = self.peer_cq.poll(wc);
                for c in &wc[..k] {
                    if !c.is_success() {
                        return Err(format!("a receive failed: {c:?}").into());
                    }
                    self.post_recv(usize::try_from(c.wr_id)?)?;
                }
                if k < wc.len() {
                    break;
                }
            }
        }
        Ok(total)
    }

    fn outstanding(&self) -> usize {
        self.posted.iter().map(VecDeque::len).sum()
    }

    fn run(&mut self, end: Instant, abort: &AtomicBool, rec: &mut Recorder) -> Res<()> {
        let sge = [self.local.mr.sge(0, self.size)?];
        let mut wc = [WorkCompletion::default(); 64];
        let interval = self.rate.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut next = Instant::now();
        loop {
            let now = Instant::now();
            if now >= end || abort.load(Ordering::Relaxed) {
                return Ok(());
            }
            let reaped = self.reap(&mut wc, rec)?;
            match interval {
                None => {
                    let mut posted = false;
                    for i in 0..self.qps.len() {
                        let room = self.depth.saturating_sub(self.posted[i].len());
                        if room > 0 {
                            self.post(i, room, &sge)?;
                            posted = true;
                        }
                    }
                    if reaped == 0 && !posted {
                        if self.nap.is_zero() {
                            std::hint::spin_loop();
                        } else {
                            std::thread::sleep(self.nap);
                        }
                    }
                }
                Some(iv) => {
                    // Open loop: every post has its time; one that finds
                    // its QP full is missed, not delayed.
                    while next <= now {
                        let i = self.next_qp;
                        self.next_qp = (i + 1) % self.qps.len();
                        if self.posted[i].len() < self.depth {
                            self.post(i, 1, &sge)?;
                        } else {
                            rec.missed(next);
                        }
                        next += iv;
                    }
                    if self.outstanding() == 0 {
                        // Idle until the next post, as a sporadic sender
                        // is; its completion is then waited for spinning.
                        let wake = next.min(end);
                        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }
}
