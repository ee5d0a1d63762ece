//! Helpers for data-path integration tests: a VM opened through the
//! reference driver over [`VmmTransport`], registered buffers, connected RC
//! pairs and completion polling.
//!
//! These are test fixtures: they panic on any failure, with a message that
//! says what failed, so a test reads as the scenario it checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Pd, Qp, QpCap, QpInit, RcConnect, SendOp, SendWr, Sge, WorkCompletion,
};

use crate::harness::TestDaemon;
use crate::shmem::ShmemWindow;
use crate::transport::VmmTransport;
use crate::vmm::VmmOptions;

/// Default wait for completions.
pub const WAIT: Duration = Duration::from_secs(10);
/// Remote rights the helpers grant on RC QPs.
pub const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;

/// A VM with an open device (one context) and a PD.
pub struct Vm {
    /// The transport (and through it the test VMM).
    pub t: Arc<VmmTransport>,
    /// The driver's device.
    pub dev: Device,
    /// A protection domain.
    pub pd: Arc<Pd>,
}

impl Vm {
    /// Connects to socket `i` of `d` with `opts` and opens the device.
    pub fn open(d: &TestDaemon, i: usize, opts: VmmOptions) -> Vm {
        let vmm = d.connect_with(i, opts).expect("connect test VM");
        let t = VmmTransport::new(vmm).expect("transport");
        let dev = Device::open(t.clone()).expect("open device");
        let pd = Pd::alloc(&dev).expect("alloc PD");
        Vm { t, dev, pd }
    }

    /// Like [`Vm::open`] with VIRTIO shared memory offered by the VMM.
    pub fn open_shmem(d: &TestDaemon, i: usize) -> Vm {
        Self::open(
            d,
            i,
            VmmOptions {
                shmem: true,
                ..VmmOptions::default()
            },
        )
    }

    /// The VMM's doorbell window, if shared memory was negotiated.
    pub fn window(&self) -> Option<Arc<ShmemWindow>> {
        self.t.vmm().shmem_window().cloned()
    }
}

/// A registered buffer of scattered guest pages.
pub struct Buf {
    /// The memory.
    pub buf: Arc<DmaBuf>,
    /// Its registration (all access rights).
    pub mr: Mr,
}

impl Buf {
    /// Allocates and registers `len` bytes on `vm`.
    pub fn new(vm: &Vm, len: usize) -> Buf {
        let buf = Arc::new(vm.dev.alloc_dma(len, 8).expect("alloc DMA"));
        let mr = Mr::register(&vm.pd, buf.clone(), access::ALL).expect("register MR");
        Buf { buf, mr }
    }
    /// iova of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.mr.iova() + off as u64
    }
    /// One SGE over `len` bytes at `off`.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        self.mr
            .sge(off as u64, u32::try_from(len).expect("SGE length"))
            .expect("SGE inside the MR")
    }
    /// Reads `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.buf.to_vec(off, len).expect("read buffer")
    }
    /// Writes `data` at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(off, data).expect("write buffer");
    }
}

/// `len` pseudo-random bytes from `seed` (xorshift).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Queue sizes the helpers use.
pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// An RC QP on `vm` with both queues on `cq`.
pub fn rc_qp(vm: &Vm, cq: &Arc<Cq>) -> Qp {
    let mut init = QpInit::rc(cq);
    init.cap = cap();
    Qp::create(&vm.pd, &init).expect("create RC QP")
}

/// Connection attributes to reach `peer` on `peer_vm`.
pub fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    let mut c = RcConnect::new(peer.qpn(), peer_vm.dev.gid());
    let attr = peer_vm.dev.attr();
    c.max_rd_atomic = attr.max_qp_init_rd_atom.min(16);
    c.max_dest_rd_atomic = attr.max_qp_rd_atom.min(16);
    c
}

/// Connects `qa` (on `a`) and `qb` (on `b`) to each other.
pub fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) {
    qa.rc_connect(QP_ACCESS, &conn(qb, b)).expect("connect A");
    qb.rc_connect(QP_ACCESS, &conn(qa, a)).expect("connect B");
}

/// Two connected RC QPs, each with its own CQ.
pub struct Pair {
    /// CQ of `qa`.
    pub cqa: Arc<Cq>,
    /// CQ of `qb`.
    pub cqb: Arc<Cq>,
    /// QP on the first VM.
    pub qa: Qp,
    /// QP on the second VM.
    pub qb: Qp,
}

/// Creates and connects an RC pair between `a` and `b`.
pub fn rc_pair(a: &Vm, b: &Vm) -> Pair {
    let cqa = Cq::create(&a.dev, 256).expect("CQ A");
    let cqb = Cq::create(&b.dev, 256).expect("CQ B");
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &cqb);
    connect(a, &qa, b, &qb);
    Pair { cqa, cqb, qa, qb }
}

/// Polls exactly `n` completions within [`WAIT`].
pub fn poll_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 32];
    while out.len() < n {
        let k = cq.poll(&mut wc[..(n - out.len()).min(32)]);
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Polls one completion within [`WAIT`].
pub fn poll_one(cq: &Cq) -> WorkCompletion {
    poll_n(cq, 1)[0]
}

/// Asserts a successful completion of `wr_id` with opcode `op`.
pub fn ok(wc: &WorkCompletion, wr_id: u64, op: WcOpcode) {
    assert!(wc.is_success(), "{wc:?}");
    assert_eq!(wc.wr_id, wr_id, "{wc:?}");
    assert_eq!(wc.opcode(), Some(op), "{wc:?}");
}

/// A signaled send work request over `sges`.
pub fn wr<'a>(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> SendWr<'a> {
    SendWr::signaled(wr_id, op, sges)
}

/// RDMA WRITE of `data` from `src` (offset 0) into `dst` (offset 0) over
/// `p.qa`, then SEND of the same bytes back over `p.qb` into `src` at
/// offset `back`; checks both land. `seq` makes the work request ids.
pub fn write_and_send_back(p: &Pair, src: &Buf, dst: &Buf, data: &[u8], back: usize, seq: u64) {
    use virtio_rdma_driver::RecvWr;
    src.write(0, data);
    let sg = [src.sge(0, data.len())];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(0),
        rkey: dst.mr.rkey(),
    };
    p.qa.post_send(&[wr(seq, op, &sg)]).expect("post WRITE");
    ok(&poll_one(&p.cqa), seq, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, data.len()), data, "WRITE data");
    p.qa.post_recv(&[RecvWr {
        wr_id: seq,
        sg_list: &[src.sge(back, data.len())],
    }])
    .expect("post RECV");
    let sg = [dst.sge(0, data.len())];
    p.qb.post_send(&[wr(seq, SendOp::Send, &sg)])
        .expect("post SEND");
    ok(&poll_one(&p.cqb), seq, WcOpcode::SEND);
    let r = poll_one(&p.cqa);
    ok(&r, seq, WcOpcode::RECV);
    assert_eq!(r.byte_len as usize, data.len());
    assert_eq!(src.read(back, data.len()), data, "SEND data");
}

/// Registers `len` bytes at `iova` on `vm` made of the first page of
/// `page` repeated: a region of any size for the price of one page (what a
/// hostile guest can register).
///
/// # Safety
///
/// As [`Mr::register_pages`]: `page` stays allocated while the region is
/// registered, and is not relied on through Rust references meanwhile.
pub unsafe fn repeated_page_mr(
    vm: &Vm,
    page: &DmaBuf,
    iova: u64,
    len: u64,
) -> virtio_rdma_driver::Result<Mr> {
    let bad = |what: &str| virtio_rdma_driver::Error::InvalidArgument(what.into());
    let gpa = page.gpa(0).ok_or_else(|| bad("page address"))?;
    let count = usize::try_from(len.div_ceil(4096)).map_err(|_| bad("length"))?;
    let pages = vec![gpa; count];
    let spec = virtio_rdma_driver::MrPages {
        iova,
        length: len,
        first_page_offset: 0,
        page_shift: 12,
        pages: &pages,
    };
    // SAFETY: the caller's contract is `register_pages`'s.
    unsafe { Mr::register_pages(&vm.pd, &spec, access::ALL) }
}
