//! Target `engine`: several VMs of one tenant on one real daemon.
//!
//! Every execution starts a daemon (the real [`Daemon`], one engine thread,
//! every VM in the default tenant) with a QP-number allocator that hands a
//! freed number out again at once ([`RecyclingQpns`]: QP numbers come back,
//! which a random 24-bit allocator almost never does), connects two or three
//! test VMMs (the in-process vhost-user frontend of the `tests` crate) and
//! opens the reference driver on each. The fuzzer then picks a sequence of
//! QP creations and destructions, connections (to live QPs, to destroyed
//! QP numbers, to raw numbers), receives and sends (SEND, WRITE, READ,
//! atomics; good, stale and raw keys; lengths in and beyond the buffers),
//! polls, device resets and VMM disconnects, with traffic in flight.
//!
//! Invariants:
//! - the daemon keeps answering: every operation is bounded by a watchdog
//!   ([`HANG`]); past it the harness prints what hung and aborts (a hang is
//!   a finding), and a control command that times out is a finding;
//! - objects are released: after each operation the daemon holds exactly
//!   the QPs the driver holds; after a device reset or a disconnect the VM
//!   holds nothing (within 5 s); at the end, after every VM disconnected,
//!   no object and no QP number remain;
//! - no completion names a QP destroyed earlier (its CQ is drained when the
//!   destroy returns; anything for it after that is a finding, until the
//!   number is given to a new QP of the VM);
//! - at the end the data path still works: a SEND between two fresh QPs of
//!   two VMs completes on both sides.
//!
//! Setting `RDMA_FUZZ_NO_QPN_REUSE=1` makes the allocator never reuse a
//! number (to fuzz past a known QP-number-reuse bug).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use vhost_user_rdma::transport::Transport;
use vhost_user_rdma::{Daemon, DaemonConfig};
use vhost_user_rdma_tests::guest_mem::{MemLayout, MIB};
use vhost_user_rdma_tests::rnics::RecyclingQpns;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DeviceOptions, DmaBuf, Error as DrvError, Mr, Pd, Qp, QpCap, QpInit, RcConnect,
    RecvWr, SendOp, SendWr, Sge, WorkCompletion,
};

/// Longest time one operation of the harness may take.
pub const HANG: Duration = Duration::from_secs(30);
/// Most operations one input runs.
const MAX_OPS: usize = 48;
/// Most QPs the harness keeps per VM.
const MAX_QPS: usize = 6;
/// Bytes of each VM's registered buffer.
const BUF: u64 = 16 << 10;
/// Offsets in a buffer are taken modulo this (mostly inside it).
const SPAN: u64 = BUF + BUF / 4;
/// Lengths are taken modulo this (mostly fitting).
const LEN_SPAN: u32 = 6 << 10;
/// Remote rights of the harness's QPs.
const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
/// wr_id of the final liveness probe's work requests.
const PROBE: u64 = 0xdead_beef_0000;

// ---------------------------------------------------------------------------
// QP numbers that come back

// ---------------------------------------------------------------------------
// Watchdog

type Armed = Mutex<Option<(Instant, String)>>;

fn watchdog() -> &'static Armed {
    static W: OnceLock<Arc<Armed>> = OnceLock::new();
    W.get_or_init(|| {
        let armed: Arc<Armed> = Arc::new(Mutex::new(None));
        let a = armed.clone();
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                let g = a.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((at, what)) = &*g {
                    if Instant::now() > *at {
                        eprintln!(
                            "engine harness: HANG: `{what}` did not finish within {HANG:?}; \
                             the daemon stopped answering"
                        );
                        std::process::abort();
                    }
                }
            })
            .expect("start the watchdog");
        armed
    })
}

fn arm(what: String) {
    *watchdog().lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now() + HANG, what));
}

fn disarm() {
    *watchdog().lock().unwrap_or_else(|p| p.into_inner()) = None;
}

// ---------------------------------------------------------------------------
// Input

/// A key in a work request.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Key {
    /// The right key.
    Good,
    /// A key of an MR registered earlier (perhaps gone).
    Stale(u8),
    /// Any value.
    Raw(u32),
}

/// Where a one-sided connection goes.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Target {
    /// A live QP (VM, QP).
    Live(u8, u8),
    /// A QP number destroyed earlier.
    Dead(u8),
    /// Any number.
    Raw(u32),
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// Create an RC QP.
    CreateQp(u8),
    /// Destroy a QP.
    DestroyQp(u8, u8),
    /// Connect two QPs to each other.
    Connect(u8, u8, u8, u8),
    /// Connect one QP.
    ConnectTo(u8, u8, Target),
    /// Post a receive.
    PostRecv {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Offset in the buffer.
        off: u16,
        /// Length.
        len: u16,
        /// Local key.
        key: Key,
    },
    /// Post a send work request.
    PostSend {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Operation (modulo 7).
        kind: u8,
        /// Offset in the local buffer.
        off: u16,
        /// Length.
        len: u16,
        /// Offset in the remote buffer.
        roff: u16,
        /// Local key.
        lkey: Key,
        /// Remote key.
        rkey: Key,
        /// Several copies of it.
        count: u8,
    },
    /// Poll a VM's CQ.
    Poll(u8),
    /// Let the engine run.
    Sleep(u8),
    /// Device reset of a VM (then its VMM reconnects).
    Reset(u8),
    /// The VMM of a VM disconnects (and reconnects).
    Disconnect(u8),
    /// Re-register a VM's buffer (new keys; the old ones go stale).
    Rereg(u8),
    /// Destroy a QP and create a new one at once (it gets the same QP
    /// number, and QPs connected to the old one now reach the new one).
    Recreate(u8, u8),
    /// Create a QP on each of two VMs and connect them to each other.
    Pair(u8, u8),
}

/// The whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// Three VMs instead of two.
    pub three: bool,
    /// The operations.
    pub ops: Vec<Op>,
}

// ---------------------------------------------------------------------------
// Harness state

struct QpS {
    qp: Qp,
    /// The VM of the QP it was connected to.
    peer: Option<usize>,
}

struct VmS {
    // Dropped in this order: QPs, MR, buffer, CQ, PD, device, transport.
    qps: Vec<QpS>,
    mr: Mr,
    buf: Arc<DmaBuf>,
    cq: Arc<Cq>,
    pd: Arc<Pd>,
    dev: Device,
    t: Arc<VmmTransport>,
    /// QP numbers of destroyed QPs of this VM (no completion may name them).
    dead: HashSet<u32>,
}

struct Harness {
    daemon: Option<Daemon>,
    dir: PathBuf,
    rnic: Arc<RecyclingQpns>,
    vms: Vec<Option<VmS>>,
    /// Keys of earlier registrations (lkey, rkey).
    old_keys: Vec<(u32, u32)>,
    /// QP numbers destroyed so far.
    dead_qpns: Vec<u32>,
    seq: u64,
}

/// A driver error that means the daemon did not answer.
fn no_answer(e: &DrvError) -> bool {
    !matches!(
        e,
        DrvError::Command { .. }
            | DrvError::QueueFull { .. }
            | DrvError::InvalidWr { .. }
            | DrvError::InvalidArgument(_)
            | DrvError::Mismatch(_)
            | DrvError::Unsupported(_)
    )
}

fn check<T>(what: &str, r: Result<T, DrvError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if no_answer(&e) => panic!("{what}: the daemon did not answer: {e}"),
        Err(_) => None,
    }
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 32,
    }
}

fn vmm_options() -> VmmOptions {
    VmmOptions {
        mem: MemLayout::two_regions(8 * MIB, 8 * MIB),
        timeout: Duration::from_secs(10),
        message_timeout: Some(Duration::from_secs(10)),
        ..VmmOptions::default()
    }
}

fn open_vm(socket: &std::path::Path) -> VmS {
    let vmm = TestVmm::connect(socket, vmm_options())
        .unwrap_or_else(|e| panic!("connect a VMM to {}: {e}", socket.display()));
    let t = VmmTransport::new(vmm).expect("transport");
    let opts = DeviceOptions {
        command_timeout: Some(Duration::from_secs(10)),
        ..DeviceOptions::default()
    };
    let dev = Device::open_with(t.clone(), opts).expect("open the device");
    let pd = Pd::alloc(&dev).expect("alloc PD");
    let cq = Cq::create(&dev, 1024).expect("create CQ");
    let buf = Arc::new(dev.alloc_dma(BUF as usize, 8).expect("alloc DMA"));
    let mr = Mr::register(&pd, buf.clone(), access::ALL).expect("register MR");
    VmS {
        qps: Vec::new(),
        mr,
        buf,
        cq,
        pd,
        dev,
        t,
        dead: HashSet::new(),
    }
}

impl Harness {
    fn start(n: usize) -> Harness {
        static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rdma-fuzz-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the socket directory");
        let sockets: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("vm{i}.sock"))).collect();
        let config = DaemonConfig::new(sockets.clone());
        // QP numbers are reused as soon as they are freed, unless
        // `RDMA_FUZZ_NO_QPN_REUSE` is set.
        let reuse = std::env::var_os("RDMA_FUZZ_NO_QPN_REUSE").is_none();
        let rnic = Arc::new(RecyclingQpns::new(reuse));
        let dyn_rnic: Arc<dyn Transport> = rnic.clone();
        let daemon = Daemon::start_with_transport(config, dyn_rnic).expect("start the daemon");
        let vms = sockets.iter().map(|s| Some(open_vm(s))).collect();
        Harness {
            daemon: Some(daemon),
            dir,
            rnic,
            vms,
            old_keys: Vec::new(),
            dead_qpns: Vec::new(),
            seq: 0,
        }
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("the daemon runs")
    }

    fn socket(&self, vm: usize) -> PathBuf {
        self.dir.join(format!("vm{vm}.sock"))
    }

    fn vm_index(&self, v: u8) -> usize {
        usize::from(v) % self.vms.len()
    }

    fn vm(&mut self, v: u8) -> (usize, &mut VmS) {
        let i = self.vm_index(v);
        (
            i,
            self.vms[i]
                .as_mut()
                .expect("every VM is open between steps"),
        )
    }

    /// Checks completions of VM `i`'s CQ (polls what is there).
    fn poll(&mut self, i: usize) {
        let Some(vm) = self.vms[i].as_ref() else {
            return;
        };
        let mut wc = [WorkCompletion::default(); 32];
        loop {
            let n = vm.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert!(
                    !vm.dead.contains(&c.qpn),
                    "VM {i}: completion {c:?} for QP number {:#x}, destroyed earlier",
                    c.qpn
                );
            }
            if n < wc.len() {
                break;
            }
        }
    }

    /// The daemon holds exactly the QPs the driver holds.
    fn check_counts(&self) {
        for (i, vm) in self.vms.iter().enumerate() {
            let Some(vm) = vm else { continue };
            let s = self
                .daemon()
                .vm_stats(i)
                .expect("statistics of a configured VM");
            assert_eq!(
                s.device.resources.qp,
                vm.qps.len(),
                "VM {i}: the daemon holds {} QPs, the driver {}",
                s.device.resources.qp,
                vm.qps.len()
            );
        }
    }

    fn key(&self, k: Key, good: u32) -> u32 {
        match k {
            Key::Good => good,
            Key::Stale(i) if !self.old_keys.is_empty() => {
                let (l, r) = self.old_keys[usize::from(i) % self.old_keys.len()];
                if i % 2 == 0 {
                    l
                } else {
                    r
                }
            }
            Key::Stale(i) => u32::from(i),
            Key::Raw(v) => v,
        }
    }

    /// Waits until VM `i` holds nothing (or panics after 5 s).
    fn wait_empty(&self, i: usize, why: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.daemon().vm_stats(i).expect("statistics");
            if s.device.resources.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "VM {i}: objects not released after {why}: {:?}",
                s.device.resources
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn step(&mut self, op: &Op) {
        self.seq += 1;
        match *op {
            Op::CreateQp(v) => {
                let (_, vm) = self.vm(v);
                if vm.qps.len() >= MAX_QPS {
                    return;
                }
                let mut init = QpInit::rc(&vm.cq);
                init.cap = cap();
                if let Some(qp) = check("CREATE_QP", Qp::create(&vm.pd, &init)) {
                    vm.dead.remove(&qp.qpn());
                    vm.qps.push(QpS { qp, peer: None });
                }
            }
            Op::DestroyQp(v, q) => {
                let (i, vm) = self.vm(v);
                if vm.qps.is_empty() {
                    return;
                }
                let qs = vm.qps.remove(usize::from(q) % vm.qps.len());
                let qpn = qs.qp.qpn();
                if let Err(e) = qs.qp.destroy() {
                    panic!("VM {i}: DESTROY_QP of a live QP failed: {e}");
                }
                // What is in the CQ now was written before the destroy.
                let mut wc = [WorkCompletion::default(); 32];
                while vm.cq.poll(&mut wc) > 0 {}
                vm.dead.insert(qpn);
                self.dead_qpns.push(qpn);
            }
            Op::Connect(va, qa, vb, qb) => {
                let (a, b) = (self.vm_index(va), self.vm_index(vb));
                let (Some(pa), Some(pb)) = (self.qp_of(a, qa), self.qp_of(b, qb)) else {
                    return;
                };
                if (a, pa) == (b, pb) {
                    return;
                }
                let (qpn_a, gid_a) = self.ident(a, pa);
                let (qpn_b, gid_b) = self.ident(b, pb);
                self.connect(a, pa, qpn_b, gid_b, Some(b));
                self.connect(b, pb, qpn_a, gid_a, Some(a));
            }
            Op::ConnectTo(v, q, target) => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, q) else { return };
                let (qpn, gid, peer) = match target {
                    Target::Live(vb, qb) => {
                        let b = self.vm_index(vb);
                        let Some(pb) = self.qp_of(b, qb) else { return };
                        let (qpn, gid) = self.ident(b, pb);
                        (qpn, gid, Some(b))
                    }
                    Target::Dead(k) if !self.dead_qpns.is_empty() => {
                        let qpn = self.dead_qpns[usize::from(k) % self.dead_qpns.len()];
                        let b = self.vm_index(k);
                        (qpn, self.gid(b), Some(b))
                    }
                    Target::Dead(k) => (u32::from(k), self.gid(a), None),
                    Target::Raw(n) => (n & 0x00ff_ffff, self.gid(a), None),
                };
                self.connect(a, pa, qpn, gid, peer);
            }
            Op::PostRecv {
                vm: v,
                qp,
                off,
                len,
                key,
            } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                let vm = self.vms[a].as_ref().expect("open");
                let lkey = self.key(key, vm.mr.lkey());
                let sge = Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: u32::from(len) % LEN_SPAN,
                    lkey,
                };
                let wr = RecvWr {
                    wr_id: self.seq,
                    sg_list: &[sge],
                };
                check("post_recv", vm.qps[pa].qp.post_recv(&[wr]));
            }
            Op::PostSend {
                vm: v,
                qp,
                kind,
                off,
                len,
                roff,
                lkey,
                rkey,
                count,
            } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                let vm = self.vms[a].as_ref().expect("open");
                let remote = vm.qps[pa]
                    .peer
                    .and_then(|p| self.vms[p].as_ref())
                    .unwrap_or(vm);
                let raddr = remote.mr.iova() + u64::from(roff) % SPAN;
                let rkey = self.key(rkey, remote.mr.rkey());
                let op = match kind % 7 {
                    0 => SendOp::Send,
                    1 => SendOp::SendWithImm { imm: 7 },
                    2 => SendOp::RdmaWrite {
                        remote_addr: raddr,
                        rkey,
                    },
                    3 => SendOp::RdmaWriteWithImm {
                        remote_addr: raddr,
                        rkey,
                        imm: 9,
                    },
                    4 => SendOp::RdmaRead {
                        remote_addr: raddr,
                        rkey,
                    },
                    5 => SendOp::AtomicCmpSwp {
                        remote_addr: raddr & !7,
                        rkey,
                        compare: 0,
                        swap: self.seq,
                    },
                    _ => SendOp::AtomicFetchAdd {
                        remote_addr: raddr & !7,
                        rkey,
                        add: 1,
                    },
                };
                let len = if kind % 7 >= 5 {
                    8
                } else {
                    u32::from(len) % LEN_SPAN
                };
                let sge = [Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: len,
                    lkey: self.key(lkey, vm.mr.lkey()),
                }];
                let n = usize::from(count % 4) + 1;
                let wrs: Vec<SendWr<'_>> = (0..n)
                    .map(|k| SendWr::signaled(self.seq * 8 + k as u64, op, &sge))
                    .collect();
                check("post_send", vm.qps[pa].qp.post_send(&wrs));
            }
            Op::Poll(v) => {
                let i = self.vm_index(v);
                self.poll(i);
            }
            Op::Sleep(ms) => std::thread::sleep(Duration::from_millis(u64::from(ms % 8))),
            Op::Reset(v) => {
                let i = self.vm_index(v);
                let vm = self.vms[i].take().expect("open");
                let r = vm.t.vmm().reset();
                if let Err(e) = r {
                    panic!("VM {i}: device reset failed: {e}");
                }
                self.wait_empty(i, "a device reset");
                self.reconnect(i, vm);
            }
            Op::Disconnect(v) => {
                let i = self.vm_index(v);
                let vm = self.vms[i].take().expect("open");
                self.reconnect(i, vm);
            }
            Op::Recreate(v, q) => {
                self.step(&Op::DestroyQp(v, q));
                self.step(&Op::CreateQp(v));
            }
            Op::Pair(va, vb) => {
                let (a, b) = (self.vm_index(va), self.vm_index(vb));
                let before = |h: &Self, i: usize| h.vms[i].as_ref().map_or(0, |v| v.qps.len());
                let (na, nb) = (before(self, a), before(self, b));
                self.step(&Op::CreateQp(va));
                self.step(&Op::CreateQp(vb));
                let (ma, mb) = (before(self, a), before(self, b));
                let created = if a == b {
                    ma >= na + 2
                } else {
                    ma > na && mb > nb
                };
                if created {
                    let (qa, qb) = if a == b {
                        (ma - 2, ma - 1)
                    } else {
                        (ma - 1, mb - 1)
                    };
                    let (qpn_a, gid_a) = self.ident(a, qa);
                    let (qpn_b, gid_b) = self.ident(b, qb);
                    self.connect(a, qa, qpn_b, gid_b, Some(b));
                    self.connect(b, qb, qpn_a, gid_a, Some(a));
                }
            }
            Op::Rereg(v) => {
                let (_, vm) = self.vm(v);
                let keys = (vm.mr.lkey(), vm.mr.rkey());
                let Some(mr) = check("REG_MR", Mr::register(&vm.pd, vm.buf.clone(), access::ALL))
                else {
                    return;
                };
                let old = std::mem::replace(&mut vm.mr, mr);
                drop(old);
                self.old_keys.push(keys);
            }
        }
    }

    /// Disconnects VM `i`'s VMM (after a reset, or mid-traffic), checks
    /// that the daemon releases everything, and connects a new one.
    fn reconnect(&mut self, i: usize, vm: VmS) {
        for q in &vm.qps {
            self.dead_qpns.push(q.qp.qpn());
        }
        vm.t.vmm().disconnect();
        // The destroys of the driver's objects fail at once (disconnected).
        drop(vm);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.daemon().vm_stats(i).expect("statistics");
            if !s.connected && s.device.resources.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "VM {i}: not released after its VMM disconnected: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        self.vms[i] = Some(open_vm(&self.socket(i)));
    }

    fn qp_of(&self, vm: usize, q: u8) -> Option<usize> {
        let n = self.vms[vm].as_ref()?.qps.len();
        (n > 0).then(|| usize::from(q) % n)
    }

    fn gid(&self, vm: usize) -> [u8; 16] {
        self.vms[vm].as_ref().map_or([0; 16], |v| v.dev.gid())
    }

    fn ident(&self, vm: usize, q: usize) -> (u32, [u8; 16]) {
        let v = self.vms[vm].as_ref().expect("open");
        (v.qps[q].qp.qpn(), v.dev.gid())
    }

    fn connect(&mut self, vm: usize, q: usize, dest: u32, gid: [u8; 16], peer: Option<usize>) {
        let v = self.vms[vm].as_mut().expect("open");
        let mut c = RcConnect::new(dest, gid);
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
        c.rnr_retry = 1;
        c.retry_cnt = 1;
        c.timeout = 8;
        let qs = &mut v.qps[q];
        if check("connect", qs.qp.rc_connect(QP_ACCESS, &c)).is_some() {
            qs.peer = peer;
        }
    }

    /// A SEND between fresh QPs of two VMs completes on both sides.
    fn probe(&mut self) {
        let (a, b) = (0, 1);
        let mk = |vm: &VmS| {
            let mut init = QpInit::rc(&vm.cq);
            init.cap = cap();
            Qp::create(&vm.pd, &init).expect("probe: create QP")
        };
        // Fresh numbers: no QP of the fuzzed traffic is connected to them.
        self.rnic.fresh_only(true);
        let qa = mk(self.vms[a].as_ref().expect("open"));
        let qb = mk(self.vms[b].as_ref().expect("open"));
        self.rnic.fresh_only(false);
        // (Fresh, so never in a VM's dead list; kept for safety.)
        for (i, q) in [(a, &qa), (b, &qb)] {
            if let Some(vm) = self.vms[i].as_mut() {
                vm.dead.remove(&q.qpn());
            }
        }
        let va = self.vms[a].as_ref().expect("open");
        let vb = self.vms[b].as_ref().expect("open");
        let conn = |dest: u32, gid| {
            let mut c = RcConnect::new(dest, gid);
            c.max_rd_atomic = 4;
            c.max_dest_rd_atomic = 4;
            c
        };
        qa.rc_connect(QP_ACCESS, &conn(qb.qpn(), vb.dev.gid()))
            .expect("probe: connect A");
        qb.rc_connect(QP_ACCESS, &conn(qa.qpn(), va.dev.gid()))
            .expect("probe: connect B");
        let rsge = [Sge {
            addr: vb.mr.iova(),
            length: 64,
            lkey: vb.mr.lkey(),
        }];
        qb.post_recv(&[RecvWr {
            wr_id: PROBE,
            sg_list: &rsge,
        }])
        .expect("probe: post receive");
        let ssge = [Sge {
            addr: va.mr.iova(),
            length: 64,
            lkey: va.mr.lkey(),
        }];
        qa.post_send(&[SendWr::signaled(PROBE, SendOp::Send, &ssge)])
            .expect("probe: post send");
        for (vm, q, who) in [(va, &qa, "sender"), (vb, &qb, "receiver")] {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut wc = [WorkCompletion::default(); 32];
            'wait: loop {
                let n = vm.cq.poll(&mut wc);
                for c in &wc[..n] {
                    assert!(!vm.dead.contains(&c.qpn), "completion {c:?} for a dead QP");
                    if c.qpn == q.qpn() && c.wr_id == PROBE {
                        assert_eq!(c.status(), Some(WcStatus::SUCCESS), "probe {who}: {c:?}");
                        break 'wait;
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "probe: the {who}'s completion did not come: the data path stopped"
                );
                if n == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        qa.destroy().expect("probe: destroy A");
        qb.destroy().expect("probe: destroy B");
    }

    fn finish(mut self) {
        arm("liveness probe".into());
        self.probe();
        arm("disconnect every VM".into());
        for i in 0..self.vms.len() {
            if let Some(vm) = self.vms[i].take() {
                vm.t.vmm().disconnect();
                drop(vm);
            }
        }
        for i in 0..self.vms.len() {
            self.wait_empty(i, "every VMM disconnected");
        }
        assert_eq!(
            self.rnic.qpns_in_use(),
            0,
            "QP numbers left after every VM disconnected"
        );
        arm("daemon shutdown".into());
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        disarm();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // On a panic (a finding), leave quickly: the VMs disconnect with
        // their transports, the daemon stops.
        for vm in self.vms.iter_mut().filter_map(Option::take) {
            vm.t.vmm().disconnect();
        }
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs one input of the `engine` target.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one decoded input of the `engine` target.
pub fn run_input(input: &Input) {
    arm("start the daemon and open the VMs".into());
    let mut h = Harness::start(if input.three { 3 } else { 2 });
    for (k, op) in input.ops.iter().take(MAX_OPS).enumerate() {
        arm(format!("operation {k}: {op:?}"));
        h.step(op);
        h.check_counts();
    }
    h.finish();
}
