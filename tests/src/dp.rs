//! Helpers for data-path integration tests: a VM opened through the
//! reference driver over [`VmmTransport`], registered buffers, connected RC
//! pairs and UD QPs, completion polling, QP states and asynchronous events.
//!
//! These are test fixtures: they panic on any failure, with a message that
//! says what failed, so a test reads as the scenario it checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::{Event, EventKind};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, Mr, Pd, Qp, QpCap, QpInit, RcConnect, RecvWr, SendOp, SendWr, Sge, Srq,
    WorkCompletion,
};

use crate::harness::TestDaemon;
use crate::shmem::ShmemWindow;
use crate::transport::VmmTransport;
use crate::vmm::VmmOptions;

/// Default wait for completions.
pub const WAIT: Duration = Duration::from_secs(10);
/// Remote rights the helpers grant on RC QPs.
pub const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
/// How long "nothing happens" is watched for by [`assert_quiet`] and
/// [`assert_no_event`].
pub const QUIET: Duration = Duration::from_millis(50);
/// Q_Key of the UD QPs the helpers make.
pub const QKEY: u32 = 0x1111_2222;
/// Fill byte of memory nothing may write ([`Buf::guarded`]).
pub const GUARD: u8 = 0xEE;

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

    /// Connects to the VM socket at `path` (of a daemon process) and opens
    /// the device.
    pub fn open_path(path: &std::path::Path, opts: VmmOptions) -> Vm {
        let vmm = crate::vmm::TestVmm::connect(path, opts).expect("connect test VM");
        let t = VmmTransport::new(vmm).expect("transport");
        let dev = Device::open(t.clone()).expect("open device");
        let pd = Pd::alloc(&dev).expect("alloc PD");
        Vm { t, dev, pd }
    }

    /// [`Vm::open_path`] that reports a failure instead of panicking (for
    /// programs).
    pub fn try_open_path(
        path: &std::path::Path,
        opts: VmmOptions,
    ) -> std::result::Result<Vm, Box<dyn std::error::Error>> {
        let vmm = crate::vmm::TestVmm::connect(path, opts)?;
        let t = VmmTransport::new(vmm)?;
        let dev = Device::open(t.clone())?;
        let pd = Pd::alloc(&dev)?;
        Ok(Vm { t, dev, pd })
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

/// Connects to socket `i` of `d` with default options and opens the device.
pub fn open(d: &TestDaemon, i: usize) -> Vm {
    Vm::open(d, i, VmmOptions::default())
}

/// A daemon of its own serving `n` VMs, each opened with default options.
pub fn vms(n: usize) -> (TestDaemon, Vec<Vm>) {
    let d = TestDaemon::start(n).expect("start daemon");
    let v = (0..n).map(|i| open(&d, i)).collect();
    (d, v)
}

/// A daemon of its own serving two VMs, both opened with default options.
pub fn two_vms() -> (TestDaemon, Vm, Vm) {
    let d = TestDaemon::start(2).expect("start daemon");
    let a = open(&d, 0);
    let b = open(&d, 1);
    (d, a, b)
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
    /// Allocates `len` bytes on `vm` filled with [`GUARD`] and registers
    /// them with all access rights.
    pub fn guarded(vm: &Vm, len: usize) -> Buf {
        Self::with_access(vm, &vm.pd, len, access::ALL)
    }
    /// Allocates `len` bytes on `vm` filled with [`GUARD`] and registers
    /// them in `pd` with `acc`.
    pub fn with_access(vm: &Vm, pd: &Arc<Pd>, len: usize, acc: u32) -> Buf {
        let buf = Arc::new(vm.dev.alloc_dma(len, 8).expect("alloc DMA"));
        buf.fill(0, len, GUARD).expect("fill buffer");
        let mr = Mr::register(pd, buf.clone(), acc).expect("register MR");
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
    /// The little-endian 64-bit value at `off`.
    pub fn u64_at(&self, off: usize) -> u64 {
        let b = self.read(off, 8);
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }
    /// Asserts that `[off, off + len)` still holds only [`GUARD`].
    pub fn assert_untouched(&self, off: usize, len: usize, what: &str) {
        assert_untouched(&self.buf, off, len, what);
    }
}

/// Asserts that `[off, off + len)` of `buf` still holds only [`GUARD`].
pub fn assert_untouched(buf: &DmaBuf, off: usize, len: usize, what: &str) {
    let got = buf.to_vec(off, len).expect("read buffer");
    if let Some(p) = got.iter().position(|&b| b != GUARD) {
        panic!("{what}: byte {} was written ({:#x})", off + p, got[p]);
    }
}

/// Splits `len` bytes at `off` of `b` into up to three SGEs (uneven sizes).
pub fn sges(b: &Buf, off: usize, len: usize) -> Vec<Sge> {
    match len {
        0 => Vec::new(),
        1..=2 => vec![b.sge(off, len)],
        _ => {
            let x = len / 3 + 1;
            let y = len / 5 + 2;
            vec![
                b.sge(off, x),
                b.sge(off + x, y),
                b.sge(off + x + y, len - x - y),
            ]
        }
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
    rc_qp_on(vm, cq, cq)
}

/// An RC QP on `vm` sending into `send_cq` and receiving into `recv_cq`.
pub fn rc_qp_on(vm: &Vm, send_cq: &Arc<Cq>, recv_cq: &Arc<Cq>) -> Qp {
    let mut init = QpInit::rc(send_cq);
    init.recv_cq = recv_cq.clone();
    init.cap = cap();
    Qp::create(&vm.pd, &init).expect("create RC QP")
}

/// An RC QP on `vm` with both queues on `cq`, receiving through `srq`.
pub fn srq_qp(vm: &Vm, cq: &Arc<Cq>, srq: &Arc<Srq>) -> Qp {
    let mut init = QpInit::rc(cq);
    init.cap = cap();
    init.srq = Some(srq.clone());
    Qp::create(&vm.pd, &init).expect("create RC QP on an SRQ")
}

/// A UD QP on `vm` with both queues on `cq` and `rq_depth` receive WQEs,
/// moved to RTS with [`QKEY`].
pub fn ud_qp(vm: &Vm, cq: &Arc<Cq>, rq_depth: u32) -> Qp {
    let mut init = QpInit::ud(cq);
    init.cap = cap();
    init.cap.max_recv_wr = rq_depth;
    let q = Qp::create(&vm.pd, &init).expect("create UD QP");
    q.ud_activate(QKEY, 0).expect("activate UD QP");
    q
}

/// The GSI QP (QP 1) of `vm` on `cq` with receive depth `rq_depth`,
/// moved to RTS with the GSI's Q_Key.
pub fn gsi_qp(vm: &Vm, cq: &Arc<Cq>, rq_depth: u32) -> Qp {
    let mut init = QpInit::gsi(cq);
    init.cap = cap();
    init.cap.max_recv_wr = rq_depth;
    let q = Qp::create(&vm.pd, &init).expect("create GSI QP");
    q.gsi_activate().expect("activate GSI QP");
    q
}

/// An address handle on `vm` for `dgid` from `vm`'s own GID (hop limit
/// 64).
pub fn ah(vm: &Vm, dgid: [u8; 16]) -> virtio_rdma_driver::Result<Ah> {
    Ah::create(&vm.pd, &vm.dev.av(dgid))
}

/// An address handle on `vm` for the GID of `dst`.
pub fn ah_to(vm: &Vm, dst: &Vm) -> Ah {
    ah(vm, dst.dev.gid()).expect("create AH")
}

/// Two UD QPs (on `a` and `b`, [`ud_qp`]) with their CQs, and an AH on
/// `a` for `b`'s GID.
pub struct UdPair {
    /// CQ of `qa`.
    pub cqa: Arc<Cq>,
    /// CQ of `qb`.
    pub cqb: Arc<Cq>,
    /// QP on the first VM.
    pub qa: Qp,
    /// QP on the second VM.
    pub qb: Qp,
    /// AH on the first VM for the second.
    pub ah: Ah,
}

/// Creates a [`UdPair`] between `a` and `b` (CQs of 64 entries).
pub fn ud_pair(a: &Vm, b: &Vm) -> UdPair {
    let cqa = Cq::create(&a.dev, 64).expect("CQ A");
    let cqb = Cq::create(&b.dev, 64).expect("CQ B");
    let qa = ud_qp(a, &cqa, cap().max_recv_wr);
    let qb = ud_qp(b, &cqb, cap().max_recv_wr);
    let ah = ah_to(a, b);
    UdPair {
        cqa,
        cqb,
        qa,
        qb,
        ah,
    }
}

/// Connection attributes to reach `peer` on `peer_vm`.
pub fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    conn_qpn(peer.qpn(), peer_vm)
}

/// Connection attributes to reach QP number `qpn` on `peer_vm`.
pub fn conn_qpn(qpn: u32, peer_vm: &Vm) -> RcConnect {
    let mut c = RcConnect::new(qpn, peer_vm.dev.gid());
    let attr = peer_vm.dev.attr();
    c.max_rd_atomic = attr.max_qp_init_rd_atom.min(16);
    c.max_dest_rd_atomic = attr.max_qp_rd_atom.min(16);
    c
}

/// `c` with fast transport retries: an unreachable peer is reported after
/// 3 tries of 4.096 us * 2^8 (about 3 ms).
pub fn fast(mut c: RcConnect) -> RcConnect {
    c.timeout = 8;
    c.retry_cnt = 2;
    c
}

/// Connects `qa` (on `a`) and `qb` (on `b`) to each other.
pub fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) {
    connect_with(a, qa, b, qb, |c| c);
}

/// Connects `qa` (on `a`) and `qb` (on `b`) to each other with the
/// attributes of [`conn`] changed by `f`.
pub fn connect_with(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp, f: impl Fn(RcConnect) -> RcConnect) {
    qa.rc_connect(QP_ACCESS, &f(conn(qb, b)))
        .expect("connect A");
    qb.rc_connect(QP_ACCESS, &f(conn(qa, a)))
        .expect("connect B");
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

/// A 16-entry CQ on each of `a` and `b`.
pub fn cq_pair(a: &Vm, b: &Vm) -> (Arc<Cq>, Arc<Cq>) {
    (
        Cq::create(&a.dev, 16).expect("CQ A"),
        Cq::create(&b.dev, 16).expect("CQ B"),
    )
}

/// Creates and connects an RC pair between `a` and `b`.
pub fn rc_pair(a: &Vm, b: &Vm) -> Pair {
    rc_pair_with(a, b, |c| c)
}

/// Creates an RC pair between `a` and `b` and connects it with the
/// attributes of [`conn`] changed by `f`.
pub fn rc_pair_with(a: &Vm, b: &Vm, f: impl Fn(RcConnect) -> RcConnect) -> Pair {
    let cqa = Cq::create(&a.dev, 256).expect("CQ A");
    let cqb = Cq::create(&b.dev, 256).expect("CQ B");
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &cqb);
    connect_with(a, &qa, b, &qb, f);
    Pair { cqa, cqb, qa, qb }
}

/// Posts one receive of `sg` with `wr_id` on `q`.
pub fn recv(q: &Qp, wr_id: u64, sg: &[Sge]) {
    q.post_recv(&[RecvWr { wr_id, sg_list: sg }])
        .expect("post receive");
}

/// An RDMA WRITE to byte `off` of `dst`.
pub fn write_op(dst: &Buf, off: usize) -> SendOp {
    SendOp::RdmaWrite {
        remote_addr: dst.addr(off),
        rkey: dst.mr.rkey(),
    }
}

/// Posts `n` signaled `len`-byte RDMA WRITEs from `src` into `dst` (both at
/// offset 0) over `p.qa`, with ids from `first`; `n` must fit the send
/// queue (64).
pub fn post_writes(p: &Pair, src: &Buf, dst: &Buf, len: usize, first: u64, n: usize) {
    let sg = [src.sge(0, len)];
    let op = write_op(dst, 0);
    let wrs: Vec<SendWr<'_>> = (0..n as u64).map(|i| wr(first + i, op, &sg)).collect();
    p.qa.post_send(&wrs).expect("post WRITEs");
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

/// Asserts a completion of `wr_id` with `status`.
pub fn failed(wc: &WorkCompletion, wr_id: u64, status: WcStatus) {
    assert_eq!(wc.wr_id, wr_id, "{wc:?}");
    assert_eq!(wc.status(), Some(status), "{wc:?}");
}

/// Asserts that no completion arrives on `cq` for [`QUIET`].
pub fn assert_quiet(cq: &Cq) {
    assert_quiet_for(cq, QUIET);
}

/// Asserts that no completion arrives on `cq` for `quiet`.
pub fn assert_quiet_for(cq: &Cq, quiet: Duration) {
    std::thread::sleep(quiet);
    assert_eq!(cq.poll_one(), None, "a completion arrived");
}

/// The status and detail of a driver call that must have failed.
pub fn status<T: std::fmt::Debug>(r: virtio_rdma_driver::Result<T>) -> (Status, u32) {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("not a status: {e}")),
        Ok(v) => panic!("succeeded: {v:?}"),
    }
}

/// The state of `q` (QUERY_QP).
pub fn qp_state(q: &Qp) -> u32 {
    q.query().expect("query QP").attr.qp_state
}

/// Waits (up to [`WAIT`]) until `q` is in state `s`.
pub fn wait_state(q: &Qp, s: QpState) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = qp_state(q);
        if now == u32::from(s) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "QP {:#x} in state {now}, never reached {s:?}",
            q.qpn()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Asserts that `q` is in state `s`.
pub fn assert_state(q: &Qp, s: QpState) {
    assert_eq!(qp_state(q), u32::from(s), "QP {:#x}", q.qpn());
}

/// The next asynchronous event of `dev` other than `PORT_ACTIVE` (which
/// every device start generates), within `timeout`.
pub fn next_event(dev: &Device, timeout: Duration) -> Option<Event> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = dev.next_async_event(Some(left)).expect("read event")?;
        if EventKind::from_u32(ev.kind) != Some(EventKind::PORT_ACTIVE) {
            return Some(ev);
        }
    }
}

/// The kind of `ev`, if it is one the ABI knows.
pub fn kind_of(ev: &Event) -> Option<EventKind> {
    EventKind::from_u32(ev.kind)
}

/// Waits (up to [`WAIT`]) for the next event of `dev` and asserts it is
/// `kind` for `handle`.
pub fn expect_event(dev: &Device, kind: EventKind, handle: u32) {
    let ev = next_event(dev, WAIT).unwrap_or_else(|| panic!("no {kind:?} event for {handle:#x}"));
    assert_eq!(
        (kind_of(&ev), ev.handle, ev.detail),
        (Some(kind), handle, 0),
        "{ev:?}"
    );
}

/// Asserts that no asynchronous event arrives on `dev` for [`QUIET`].
pub fn assert_no_event(dev: &Device, what: &str) {
    if let Some(ev) = next_event(dev, QUIET) {
        panic!("{what}: unexpected event {:?} {ev:?}", kind_of(&ev));
    }
}

/// Every event (kind, handle) of `dev` until none arrives for a while, or
/// until `want` of them have arrived and then none for a while; sorted.
pub fn collect_events(dev: &Device, want: usize) -> Vec<(Option<EventKind>, u32)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < want && Instant::now() < deadline {
        if let Some(ev) = next_event(dev, deadline.saturating_duration_since(Instant::now())) {
            assert_eq!(ev.detail, 0, "{ev:?}");
            out.push((kind_of(&ev), ev.handle));
        }
    }
    while let Some(ev) = next_event(dev, QUIET * 2) {
        out.push((kind_of(&ev), ev.handle));
    }
    sorted(out)
}

/// `v` sorted as [`collect_events`] sorts.
pub fn sorted(mut v: Vec<(Option<EventKind>, u32)>) -> Vec<(Option<EventKind>, u32)> {
    v.sort_by_key(|&(k, h)| (k.map(u32::from), h));
    v
}

/// A signaled send work request over `sges`.
pub fn wr<'a>(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> SendWr<'a> {
    SendWr::signaled(wr_id, op, sges)
}

/// RDMA WRITE of `data` from `src` (offset 0) into `dst` (offset 0) over
/// `p.qa`, then SEND of the same bytes back over `p.qb` into `src` at
/// offset `back`; checks both land. `seq` makes the work request ids.
pub fn write_and_send_back(p: &Pair, src: &Buf, dst: &Buf, data: &[u8], back: usize, seq: u64) {
    src.write(0, data);
    let sg = [src.sge(0, data.len())];
    p.qa.post_send(&[wr(seq, write_op(dst, 0), &sg)])
        .expect("post WRITE");
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

/// One checked round each way over `p`: a WRITE and a SEND of a pattern
/// (its length and bytes from `seq`) from `qa`'s VM into `qb`'s, then the
/// same back; `abuf` and `bbuf` are the VMs' buffers (at least 8 KiB:
/// WRITEs land at 0, SENDs at 4096).
pub fn checked_round(p: &Pair, abuf: &Buf, bbuf: &Buf, seq: u64) {
    let len = 1500 + (seq as usize * 97) % 2000;
    for (from, to, q, cq, peer_q, peer_cq, src, dst) in [
        (0, 1, &p.qa, &p.cqa, &p.qb, &p.cqb, abuf, bbuf),
        (1, 0, &p.qb, &p.cqb, &p.qa, &p.cqa, bbuf, abuf),
    ] {
        let data = pattern(len, seq * 2 + from);
        src.write(0, &data);
        q.post_send(&[wr(seq, write_op(dst, 0), &[src.sge(0, len)])])
            .expect("post WRITE");
        ok(&poll_one(cq), seq, WcOpcode::RDMA_WRITE);
        assert_eq!(dst.read(0, len), data, "WRITE {from} -> {to}, round {seq}");
        recv(peer_q, seq, &[dst.sge(4096, len)]);
        q.post_send(&[wr(seq, SendOp::Send, &[src.sge(0, len)])])
            .expect("post SEND");
        ok(&poll_one(cq), seq, WcOpcode::SEND);
        let r = poll_one(peer_cq);
        ok(&r, seq, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(
            dst.read(4096, len),
            data,
            "SEND {from} -> {to}, round {seq}"
        );
    }
}
