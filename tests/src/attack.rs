//! The attack catalogue: what a hostile guest can do with its own objects
//! to take engine time from other tenants. `attack_bench` measures a victim
//! against each; the QoS lab (`vhost-user-rdma-lab`) runs them as workloads
//! of a scenario.
//!
//! - `huge-send`: SENDs of the attack's message size (default 1 GiB) from a
//!   region of one repeated page into another, to the attacker's second VM,
//!   two in flight;
//! - `huge-read`: the same with RDMA READs;
//! - `retry-nowhere`: 8 RC QPs with `timeout` 0 (retry without end) to a QP
//!   number that exists nowhere, each with such a SEND at its head;
//! - `flush-storm`: a QP in ERR whose 16,384-deep send queue the guest
//!   refills as fast as it is flushed (no control command involved);
//! - `ctrl-heavy`: registering and deregistering a 16 GiB region of one
//!   repeated page in a loop (the control path holds the VM's lock);
//! - `self-send`: 8 RC QP pairs inside one VM, each keeping a SEND of the
//!   message size or twice that (at most 2 GiB) going between two regions
//!   of one repeated page each (two pages of RAM in all);
//! - `self-send-2vm`: the same in each of the attacker's two VMs;
//! - `hog`: not an attack but the reference of an honest heavy tenant,
//!   64 KiB RDMA WRITEs on 8 QPs, 64 deep.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, DmaBuf, Error as DriverError, Mr, Payload, Qp, QpCap, QpInit, RcConnect, RecvWr, SendFlags,
    SendOp, SendWr, WorkCompletion,
};

use crate::dp::{repeated_page_mr, Vm, QP_ACCESS};

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Every attack, by name.
pub const ATTACKS: [&str; 8] = [
    "huge-send",
    "huge-read",
    "retry-nowhere",
    "flush-storm",
    "ctrl-heavy",
    "self-send",
    "self-send-2vm",
    "hog",
];

/// The attacks that need the attacker's second VM.
pub const TWO_VM_ATTACKS: [&str; 4] = ["huge-send", "huge-read", "self-send-2vm", "hog"];

/// QP pairs of a `self-send` attacker VM.
const SELF_PAIRS: usize = 8;
/// The largest message (the port's `max_msg_size`).
pub const MAX_MSG: u64 = 1 << 31;
const HUGE_DEPTH: usize = 2;
const HOG_DEPTH: usize = 64;
const HOG_SIZE: usize = 64 << 10;
/// Where the attacks' repeated-page regions start (far above any buffer).
const SRC_IOVA: u64 = 0x100_0000_0000;
const DST_IOVA: u64 = 0x200_0000_0000;

/// A registered buffer that fails instead of panicking.
pub struct AttackBuf {
    _buf: Arc<DmaBuf>,
    /// Its registration (all rights).
    pub mr: Mr,
}

impl AttackBuf {
    fn new(vm: &Vm, len: usize) -> Res<AttackBuf> {
        let buf = Arc::new(vm.dev.alloc_dma(len, 4096)?);
        let mr = Mr::register(&vm.pd, buf.clone(), access::ALL)?;
        Ok(AttackBuf { _buf: buf, mr })
    }
}

/// A region of `len` bytes at `iova` made of `page` repeated.
fn repeated(vm: &Vm, page: &DmaBuf, iova: u64, len: u64) -> Res<Mr> {
    // SAFETY: every attack keeps `page` allocated for as long as the region
    // (both live in the same attack object, the region dropped first) and
    // never reads it through a Rust reference.
    Ok(unsafe { repeated_page_mr(vm, page, iova, len) }?)
}

/// An RC QP of `vm` on `cq` (both queues) with room for `send` and `recv`
/// work requests of one SGE each.
pub fn rc_qp(vm: &Vm, cq: &Arc<Cq>, send: u32, recv: u32) -> Res<Qp> {
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
pub enum Attack {
    /// Huge SENDs or READs between two regions of a repeated page.
    Huge {
        /// READs, not SENDs.
        read: bool,
        /// The sending QP.
        qa: Qp,
        /// Its peer.
        qb: Qp,
        /// `qa`'s CQ.
        cqa: Arc<Cq>,
        /// `qb`'s CQ.
        cqb: Arc<Cq>,
        /// The source region.
        src: Mr,
        /// The destination region.
        dst: Mr,
        /// Messages in flight.
        outstanding: usize,
        /// The regions' pages.
        _pages: (DmaBuf, DmaBuf),
    },
    /// QPs retrying without end; nothing to drive.
    Nowhere {
        /// The QPs.
        _qps: Vec<Qp>,
        /// Their CQ.
        _cq: Arc<Cq>,
        /// The region their SENDs read.
        _src: Mr,
        /// Its page.
        _page: DmaBuf,
    },
    /// A QP in ERR refilled as fast as it is flushed.
    Flush {
        /// The QP.
        qp: Qp,
        /// Its CQ.
        cq: Arc<Cq>,
        /// What its SENDs name.
        buf: AttackBuf,
        /// Its send queue's depth.
        depth: usize,
        /// WQEs posted and not flushed yet.
        outstanding: usize,
    },
    /// Registering and deregistering a huge region.
    Ctrl {
        /// The attacker's VM.
        vm: Arc<Vm>,
        /// The region's page.
        page: DmaBuf,
    },
    /// Huge SENDs between QP pairs inside the attacker's VMs.
    SelfSend(Vec<SelfSender>),
    /// 64 KiB WRITEs, deep.
    Hog {
        /// The sending QPs.
        qps: Vec<Qp>,
        /// Their peers.
        _peers: Vec<Qp>,
        /// The senders' CQ.
        cq: Arc<Cq>,
        /// The peers' CQ.
        _cqb: Arc<Cq>,
        /// Source buffer.
        src: AttackBuf,
        /// Destination buffer.
        dst: AttackBuf,
        /// WRITEs in flight per QP.
        outstanding: Vec<usize>,
    },
}

/// One attacker VM sending huge messages to itself: [`SELF_PAIRS`] RC QP
/// pairs, each with one SEND of `msg` or `2 msg` (at most [`MAX_MSG`])
/// bytes in flight, from a region of one repeated page into another.
/// Fields are dropped in order: regions before their pages.
pub struct SelfSender {
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
            let (qa, qb) = (rc_qp(vm, &scq, 4, 4)?, rc_qp(vm, &rcq, 4, 4)?);
            connect(vm, &qa, vm, &qb)?;
            pairs.push((qa, qb));
        }
        let (ps, pd) = (vm.dev.alloc_dma(4096, 4096)?, vm.dev.alloc_dma(4096, 4096)?);
        let big = msg.saturating_mul(2).min(MAX_MSG);
        let src = repeated(vm, &ps, SRC_IOVA, big)?;
        let dst = repeated(vm, &pd, DST_IOVA, big)?;
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

impl Attack {
    /// Sets attack `name` up in the attacker's VM `a` (with `b`, its second
    /// VM, where the attack needs one: [`TWO_VM_ATTACKS`]); `msg` is the
    /// size of its huge messages (at most [`MAX_MSG`]).
    pub fn new(name: &str, a: &Arc<Vm>, b: &Vm, msg: u64) -> Res<Attack> {
        let msg = msg.clamp(1, MAX_MSG);
        Ok(match name {
            "huge-send" | "huge-read" => {
                let (cqa, cqb) = (Cq::create(&a.dev, 64)?, Cq::create(&b.dev, 64)?);
                let (qa, qb) = (rc_qp(a, &cqa, 16, 16)?, rc_qp(b, &cqb, 16, 16)?);
                connect(a, &qa, b, &qb)?;
                let (pa, pb) = (a.dev.alloc_dma(4096, 4096)?, b.dev.alloc_dma(4096, 4096)?);
                let src = repeated(a, &pa, SRC_IOVA, msg)?;
                let dst = repeated(b, &pb, DST_IOVA, msg)?;
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
                let src = repeated(a, &page, SRC_IOVA, msg)?;
                let len = u32::try_from(msg.min(u64::from(u32::MAX)))?;
                let mut qps = Vec::new();
                for i in 0..8u32 {
                    let q = rc_qp(a, &cq, 4, 4)?;
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
                let q = rc_qp(a, &cq, u32::try_from(depth)?, 16)?;
                q.to_error()?;
                Attack::Flush {
                    qp: q,
                    cq,
                    buf: AttackBuf::new(a, 4096)?,
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
                    let (qa, qb) = (
                        rc_qp(a, &cq, 2 * HOG_DEPTH as u32, 4)?,
                        rc_qp(b, &cqb, 4, 4)?,
                    );
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
                    src: AttackBuf::new(a, HOG_SIZE)?,
                    dst: AttackBuf::new(b, HOG_SIZE)?,
                }
            }
            other => {
                return Err(
                    format!("unknown attack {other:?} (known: {})", ATTACKS.join(", ")).into(),
                )
            }
        })
    }

    /// How long the attacker's thread sleeps when [`Attack::step`] had
    /// nothing to do: an attack whose QPs retry by themselves must not cost
    /// the victim's CPU.
    pub fn nap(&self) -> Duration {
        if matches!(self, Attack::Nowhere { .. }) {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(1)
        }
    }

    /// Drives the attack a little; false if there was nothing to do.
    pub fn step(&mut self, msg: u64) -> Res<bool> {
        let msg = msg.clamp(1, MAX_MSG);
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
                let sge = [buf.mr.sge(0, 8)?];
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
                let mr = repeated(vm, page, SRC_IOVA, 16 << 30)?;
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
                    if !w.is_success() {
                        return Err(format!("hog: {w:?}").into());
                    }
                    if let Some(o) = outstanding.get_mut(usize::try_from(w.wr_id)?) {
                        *o = o.saturating_sub(HOG_DEPTH / 4);
                    }
                }
                let sge = [src.mr.sge(0, HOG_SIZE as u32)?];
                let op = SendOp::RdmaWrite {
                    remote_addr: dst.mr.iova(),
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
