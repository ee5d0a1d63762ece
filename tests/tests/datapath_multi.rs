#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! End-to-end data path with more than two VMs on one daemon, asynchronous
//! data-path events (CQ overflow, SRQ limit, communication established, last
//! WQE reached), a VM that disconnects in the middle of traffic, and the
//! rules of spec chapter 18 that `datapath.rs` does not exercise: fences,
//! solicited arming, remote access and length errors, zero-length messages.
//!
//! Every VM runs the reference guest driver over [`VmmTransport`].

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vhost_user_rdma_tests::dp::{cap, ok, pattern, poll_n, poll_one, wr};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::verbs::{QpInit as RawQpInit, Verbs};
use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::{
    RecvWqe, SendWqe, Sge as WireSge, WcOpcode, WcStatus, WrOpcode, DB_NONE, WQE_SIGNALED,
};
use virtio_rdma_abi::event::{Event, EventKind};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType};
use virtio_rdma_abi::Wire;
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpInit, RcConnect, RecvWr, SendFlags, SendOp,
    SendWr, Sge, Srq, Transport, UdDest, WorkCompletion,
};
use vm_memory::GuestAddress;

const WAIT: Duration = Duration::from_secs(10);
/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(50);
const QKEY: u32 = 0x1111_2222;
const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
/// Fill byte of memory nothing may write.
const GUARD_BYTE: u8 = 0xEE;
/// UD_GRH_SIZE.
const GRH: usize = 40;

// ---------------------------------------------------------------------------
// VMs, buffers, QPs

struct Vm {
    t: Arc<VmmTransport>,
    dev: Device,
    pd: Arc<Pd>,
}

fn open(d: &TestDaemon, i: usize) -> Vm {
    let vmm = d.connect(i).unwrap();
    let t = VmmTransport::new(vmm).unwrap();
    let dev = Device::open(t.clone()).unwrap();
    let pd = Pd::alloc(&dev).unwrap();
    Vm { t, dev, pd }
}

fn vms(n: usize) -> (TestDaemon, Vec<Vm>) {
    let d = TestDaemon::start(n).unwrap();
    let v = (0..n).map(|i| open(&d, i)).collect();
    (d, v)
}

/// A registered buffer (scattered guest pages).
struct Buf {
    buf: Arc<DmaBuf>,
    mr: Mr,
}

impl Buf {
    fn new(vm: &Vm, len: usize) -> Buf {
        Self::with_access(vm, &vm.pd, len, access::ALL)
    }
    /// A buffer in `pd` registered with `acc`, filled with [`GUARD_BYTE`].
    fn with_access(vm: &Vm, pd: &Arc<Pd>, len: usize, acc: u32) -> Buf {
        let buf = Arc::new(vm.dev.alloc_dma(len, 8).unwrap());
        buf.fill(0, len, GUARD_BYTE).unwrap();
        let mr = Mr::register(pd, buf.clone(), acc).unwrap();
        Buf { buf, mr }
    }
    fn addr(&self, off: usize) -> u64 {
        self.mr.iova() + off as u64
    }
    fn sge(&self, off: usize, len: usize) -> Sge {
        self.mr
            .sge(off as u64, u32::try_from(len).unwrap())
            .unwrap()
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.buf.to_vec(off, len).unwrap()
    }
    fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(off, data).unwrap();
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.read(off, 8).try_into().unwrap())
    }
    /// Asserts that `[off, off + len)` still holds only [`GUARD_BYTE`].
    fn assert_untouched(&self, off: usize, len: usize, what: &str) {
        let got = self.read(off, len);
        if let Some(p) = got.iter().position(|&b| b != GUARD_BYTE) {
            panic!("{what}: byte {} was written ({:#x})", off + p, got[p]);
        }
    }
}

/// Splits `len` bytes at `off` of `b` into up to three SGEs (uneven sizes).
fn sges(b: &Buf, off: usize, len: usize) -> Vec<Sge> {
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

fn rc_qp_on(vm: &Vm, send_cq: &Arc<Cq>, recv_cq: &Arc<Cq>) -> Qp {
    let mut init = QpInit::rc(send_cq);
    init.recv_cq = recv_cq.clone();
    init.cap = cap();
    Qp::create(&vm.pd, &init).unwrap()
}

fn rc_qp(vm: &Vm, cq: &Arc<Cq>) -> Qp {
    rc_qp_on(vm, cq, cq)
}

fn srq_qp(vm: &Vm, cq: &Arc<Cq>, srq: &Arc<Srq>) -> Qp {
    let mut init = QpInit::rc(cq);
    init.cap = cap();
    init.srq = Some(srq.clone());
    Qp::create(&vm.pd, &init).unwrap()
}

fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    conn_qpn(peer.qpn(), peer_vm)
}

/// Connection attributes to reach QP number `qpn` on `peer_vm`.
fn conn_qpn(qpn: u32, peer_vm: &Vm) -> RcConnect {
    let mut c = RcConnect::new(qpn, peer_vm.dev.gid());
    let attr = peer_vm.dev.attr();
    c.max_rd_atomic = attr.max_qp_init_rd_atom.min(16);
    c.max_dest_rd_atomic = attr.max_qp_rd_atom.min(16);
    // An unreachable peer is reported quickly: 4.096 us * 2^8 per try.
    c.timeout = 8;
    c.retry_cnt = 2;
    c
}

/// Connects `qa` (on `a`) and `qb` (on `b`) to each other.
fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) {
    qa.rc_connect(QP_ACCESS, &conn(qb, b)).unwrap();
    qb.rc_connect(QP_ACCESS, &conn(qa, a)).unwrap();
}

struct Pair {
    cqa: Arc<Cq>,
    cqb: Arc<Cq>,
    qa: Qp,
    qb: Qp,
}

fn rc_pair(a: &Vm, b: &Vm) -> Pair {
    let cqa = Cq::create(&a.dev, 256).unwrap();
    let cqb = Cq::create(&b.dev, 256).unwrap();
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &cqb);
    connect(a, &qa, b, &qb);
    Pair { cqa, cqb, qa, qb }
}

fn ud_qp(vm: &Vm, cq: &Arc<Cq>, rq_depth: u32) -> Qp {
    let mut init = QpInit::ud(cq);
    init.cap = cap();
    init.cap.max_recv_wr = rq_depth;
    let q = Qp::create(&vm.pd, &init).unwrap();
    q.ud_activate(QKEY, 0).unwrap();
    q
}

fn ah_to(vm: &Vm, dst: &Vm) -> Ah {
    Ah::create(
        &vm.pd,
        &AddressVector {
            dgid: dst.dev.gid(),
            hop_limit: 64,
            ..AddressVector::default()
        },
    )
    .unwrap()
}

fn recv(q: &Qp, wr_id: u64, sg: &[Sge]) {
    q.post_recv(&[RecvWr { wr_id, sg_list: sg }]).unwrap();
}

fn write_op(dst: &Buf, off: usize) -> SendOp {
    SendOp::RdmaWrite {
        remote_addr: dst.addr(off),
        rkey: dst.mr.rkey(),
    }
}

// ---------------------------------------------------------------------------
// Completions, states, events

/// Asserts that no completion arrives for a little while.
fn assert_quiet(cq: &Cq) {
    std::thread::sleep(QUIET);
    assert_eq!(cq.poll_one(), None);
}

fn failed(wc: &WorkCompletion, wr_id: u64, status: WcStatus) {
    assert_eq!(wc.wr_id, wr_id, "{wc:?}");
    assert_eq!(wc.status(), Some(status), "{wc:?}");
}

fn qp_state(q: &Qp) -> u32 {
    q.query().unwrap().attr.qp_state
}

fn wait_state(q: &Qp, s: QpState) {
    let deadline = Instant::now() + WAIT;
    while qp_state(q) != u32::from(s) {
        assert!(Instant::now() < deadline, "QP state {}", qp_state(q));
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn assert_state(q: &Qp, s: QpState) {
    assert_eq!(qp_state(q), u32::from(s), "QP {:#x}", q.qpn());
}

/// The next asynchronous event of `dev` other than `PORT_ACTIVE` (which
/// every device start generates), within `timeout`.
fn next_event(dev: &Device, timeout: Duration) -> Option<Event> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = dev.next_async_event(Some(left)).unwrap()?;
        if EventKind::from_u32(ev.kind) != Some(EventKind::PORT_ACTIVE) {
            return Some(ev);
        }
    }
}

fn kind_of(ev: &Event) -> Option<EventKind> {
    EventKind::from_u32(ev.kind)
}

/// Waits for the next event and asserts it is `kind` for `handle`.
fn expect_event(dev: &Device, kind: EventKind, handle: u32) {
    let ev = next_event(dev, WAIT).unwrap_or_else(|| panic!("no {kind:?} event for {handle:#x}"));
    assert_eq!(
        (kind_of(&ev), ev.handle, ev.detail),
        (Some(kind), handle, 0),
        "{ev:?}"
    );
}

/// Asserts that no asynchronous event arrives for a little while.
fn assert_no_event(dev: &Device, what: &str) {
    if let Some(ev) = next_event(dev, QUIET) {
        panic!("{what}: unexpected event {:?} {ev:?}", kind_of(&ev));
    }
}

/// Every event (kind, handle) until none arrives for a while, or until
/// `want` of them have arrived and then none for a while.
fn collect_events(dev: &Device, want: usize) -> Vec<(Option<EventKind>, u32)> {
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
    out.sort_by_key(|&(k, h)| (k.map(u32::from), h));
    out
}

fn sorted(mut v: Vec<(Option<EventKind>, u32)>) -> Vec<(Option<EventKind>, u32)> {
    v.sort_by_key(|&(k, h)| (k.map(u32::from), h));
    v
}

// ---------------------------------------------------------------------------
// 1. Four VMs, all to all

const MESH: usize = 4;
/// Per source VM, each target VM has a write slot and a receive slot.
const SLOT: usize = 3 * 4096;
/// Data starts this far into a slot; the bytes before and after are guards.
const LEAD: usize = 61;

fn write_off(src: usize) -> usize {
    src * 2 * SLOT
}

fn recv_off(src: usize) -> usize {
    src * 2 * SLOT + SLOT
}

/// (RDMA WRITE length, SEND length) from VM `i` to VM `j`.
fn mesh_lens(i: usize, j: usize) -> (usize, usize) {
    let k = i * MESH + j;
    (4000 + 331 * k, 1 + 577 * k)
}

fn mesh_data(i: usize, j: usize) -> (Vec<u8>, Vec<u8>) {
    let (wl, sl) = mesh_lens(i, j);
    let s = (i * MESH + j) as u64 * 2;
    (pattern(wl, 7000 + s), pattern(sl, 7001 + s))
}

fn mesh_imm(i: usize, j: usize) -> u32 {
    0x5EED_0000 | (i as u32) << 8 | j as u32
}

/// Four VMs, an RC QP pair between every two of them. Each VM RDMA-WRITEs
/// into and then SENDs (with immediate) to every other VM, all VMs at
/// once. Every completion is checked (opcode, wr_id, byte_len, qpn,
/// immediate, requester order WRITE before SEND), the written data is in
/// place when the SEND behind it is received (spec 18.23), and afterwards
/// each VM's target memory is compared as a whole with the expected image:
/// every byte landed where expected and nowhere else.
#[test]
fn four_vms_all_to_all_write_and_send() {
    let (_d, vm) = vms(MESH);
    let len = 2 * SLOT * MESH;
    let src: Vec<Buf> = vm.iter().map(|v| Buf::new(v, len)).collect();
    let dst: Vec<Buf> = vm.iter().map(|v| Buf::new(v, len)).collect();
    let cq: Vec<Arc<Cq>> = vm.iter().map(|v| Cq::create(&v.dev, 64).unwrap()).collect();
    // qps[i][j]: the QP on VM i connected to VM j.
    let mut qps: Vec<Vec<Option<Qp>>> = (0..MESH)
        .map(|_| (0..MESH).map(|_| None).collect())
        .collect();
    for i in 0..MESH {
        for j in i + 1..MESH {
            let qi = rc_qp(&vm[i], &cq[i]);
            let qj = rc_qp(&vm[j], &cq[j]);
            connect(&vm[i], &qi, &vm[j], &qj);
            qps[i][j] = Some(qi);
            qps[j][i] = Some(qj);
        }
    }
    let qp = |i: usize, j: usize| qps[i][j].as_ref().unwrap();
    // Sources, and a receive on every QP (wr_id 100 + source) with room to
    // spare: bytes past the message must stay untouched.
    for (i, from) in src.iter().enumerate() {
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(i, j);
            from.write(write_off(j) + LEAD, &w);
            from.write(recv_off(j) + LEAD, &s);
            let sg = sges(&dst[j], recv_off(i) + LEAD, SLOT - 2 * LEAD);
            recv(qp(j, i), 100 + i as u64, &sg);
        }
    }
    std::thread::scope(|s| {
        for i in 0..MESH {
            let (src, dst, cq, qp) = (&src, &dst, &cq, &qp);
            s.spawn(move || {
                let peers: Vec<usize> = (0..MESH).filter(|&j| j != i).collect();
                for &j in &peers {
                    let (wl, sl) = mesh_lens(i, j);
                    let wsg = sges(&src[i], write_off(j) + LEAD, wl);
                    let ssg = sges(&src[i], recv_off(j) + LEAD, sl);
                    let send = SendOp::SendWithImm {
                        imm: mesh_imm(i, j),
                    };
                    qp(i, j)
                        .post_send(&[
                            wr(j as u64, write_op(&dst[j], write_off(i) + LEAD), &wsg),
                            wr(10 + j as u64, send, &ssg),
                        ])
                        .unwrap();
                }
                let wcs = poll_n(&cq[i], 3 * peers.len());
                for &j in &peers {
                    let (wl, sl) = mesh_lens(i, j);
                    let at = |id: u64| wcs.iter().position(|w| w.wr_id == id).unwrap();
                    let (w, sd) = (at(j as u64), at(10 + j as u64));
                    ok(&wcs[w], j as u64, WcOpcode::RDMA_WRITE);
                    ok(&wcs[sd], 10 + j as u64, WcOpcode::SEND);
                    assert!(w < sd, "VM {i}: SEND to {j} completed before the WRITE");
                    assert_eq!(wcs[w].byte_len as usize, wl);
                    assert_eq!(wcs[sd].byte_len as usize, sl);
                    assert_eq!(wcs[w].qpn, qp(i, j).qpn());
                    // The receive of j's SEND, with j's WRITE already here.
                    let r = wcs[at(100 + j as u64)];
                    ok(&r, 100 + j as u64, WcOpcode::RECV);
                    assert_eq!(r.qpn, qp(i, j).qpn(), "{r:?}");
                    assert_eq!(r.byte_len as usize, mesh_lens(j, i).1, "{r:?}");
                    assert_eq!(r.imm(), Some(mesh_imm(j, i)));
                    let (w_in, s_in) = mesh_data(j, i);
                    assert_eq!(
                        dst[i].read(write_off(j) + LEAD, w_in.len()),
                        w_in,
                        "VM {i}: WRITE from {j} not in place when its SEND arrived"
                    );
                    assert_eq!(dst[i].read(recv_off(j) + LEAD, s_in.len()), s_in);
                }
            });
        }
    });
    for i in 0..MESH {
        let mut image = vec![GUARD_BYTE; len];
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(j, i);
            let o = write_off(j) + LEAD;
            image[o..o + w.len()].copy_from_slice(&w);
            let o = recv_off(j) + LEAD;
            image[o..o + s.len()].copy_from_slice(&s);
        }
        let got = dst[i].read(0, len);
        if let Some(p) = got.iter().zip(&image).position(|(a, b)| a != b) {
            panic!(
                "VM {i}: byte {p:#x} is {:#x}, expected {:#x}",
                got[p], image[p]
            );
        }
        // Nothing wrote into the sources either.
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(i, j);
            assert_eq!(src[i].read(write_off(j) + LEAD, w.len()), w);
            assert_eq!(src[i].read(recv_off(j) + LEAD, s.len()), s);
        }
        assert_quiet(&cq[i]);
    }
}

// ---------------------------------------------------------------------------
// 2. UD fan-in

/// Receive slot size of the UD fan-in test (GRH + largest message).
const UD_SLOT: usize = 2048;
const UD_MSGS: usize = 12;

fn ud_len(s: usize, k: usize) -> usize {
    2 + (s * 131 + k * 53) % 1000
}

fn ud_data(s: usize, k: usize) -> Vec<u8> {
    let mut d = pattern(ud_len(s, k), 9000 + (s * 100 + k) as u64);
    d[0] = s as u8;
    d[1] = k as u8;
    d
}

fn ud_imm(s: usize, k: usize) -> Option<u32> {
    (k % 2 == 1).then_some(0xC0DE_0000 | (s as u32) << 8 | k as u32)
}

/// One UD QP on VM 0 receives from five UD QPs at once: one on VM 0 itself,
/// two on VM 1, one each on VMs 2 and 3. Every completion reports the
/// sender's QP number (`src_qpn`), a GRH with the sender's and the
/// receiver's GIDs, `byte_len` = 40 + message, the immediate data of
/// SEND_WITH_IMM, and the right data. Receives complete in posting order,
/// each sender's messages arrive in its posting order, and every message
/// arrives exactly once.
#[test]
fn ud_fan_in_from_four_vms() {
    let (_d, vm) = vms(4);
    let rcq = Cq::create(&vm[0].dev, 128).unwrap();
    let rq = ud_qp(&vm[0], &rcq, 128);
    // Senders: (VM, QP, CQ, AH, source buffer).
    let homes = [0usize, 1, 1, 2, 3];
    let senders: Vec<(usize, Qp, Arc<Cq>, Ah, Buf)> = homes
        .iter()
        .map(|&h| {
            let cq = Cq::create(&vm[h].dev, 64).unwrap();
            let q = ud_qp(&vm[h], &cq, 4);
            (
                h,
                q,
                cq,
                ah_to(&vm[h], &vm[0]),
                Buf::new(&vm[h], UD_MSGS * 1024),
            )
        })
        .collect();
    let total = senders.len() * UD_MSGS;
    let rbuf = Buf::new(&vm[0], total * UD_SLOT);
    for m in 0..total {
        // The GRH straddles two SGEs.
        let o = m * UD_SLOT;
        recv(
            &rq,
            m as u64,
            &[rbuf.sge(o, 30), rbuf.sge(o + 30, UD_SLOT - 30)],
        );
    }
    std::thread::scope(|sc| {
        for (s, (_, q, cq, ah, buf)) in senders.iter().enumerate() {
            let rqpn = rq.qpn();
            sc.spawn(move || {
                for k in 0..UD_MSGS {
                    let data = ud_data(s, k);
                    buf.write(k * 1024, &data);
                }
                for chunk in 0..UD_MSGS / 4 {
                    let sg: Vec<[Sge; 1]> = (0..4)
                        .map(|x| {
                            let k = chunk * 4 + x;
                            [buf.sge(k * 1024, ud_len(s, k))]
                        })
                        .collect();
                    let wrs: Vec<SendWr<'_>> = (0..4)
                        .map(|x| {
                            let k = chunk * 4 + x;
                            let op = match ud_imm(s, k) {
                                Some(imm) => SendOp::SendWithImm { imm },
                                None => SendOp::Send,
                            };
                            let mut w = wr(k as u64, op, &sg[x]);
                            w.ud = Some(UdDest {
                                ah,
                                remote_qpn: rqpn,
                                remote_qkey: QKEY,
                            });
                            w
                        })
                        .collect();
                    q.post_send(&wrs).unwrap();
                    for (x, wc) in poll_n(cq, 4).iter().enumerate() {
                        let k = chunk * 4 + x;
                        ok(wc, k as u64, WcOpcode::SEND);
                        assert_eq!(wc.byte_len as usize, ud_len(s, k));
                    }
                }
            });
        }
        let wcs = poll_n(&rcq, total);
        let mut next = vec![0usize; senders.len()];
        for (m, r) in wcs.iter().enumerate() {
            ok(r, m as u64, WcOpcode::RECV);
            assert!(r.has_grh(), "{r:?}");
            assert_eq!(r.qpn, rq.qpn());
            let o = m * UD_SLOT;
            let head = rbuf.read(o + GRH, 2);
            let (s, k) = (head[0] as usize, head[1] as usize);
            assert!(s < senders.len(), "message {m}: sender {s}");
            let (home, q, ..) = &senders[s];
            assert_eq!(r.src_qpn, q.qpn(), "message {m} from sender {s}");
            assert_eq!(k, next[s], "sender {s}: message {k} out of order");
            next[s] += 1;
            assert_eq!(r.byte_len as usize, GRH + ud_len(s, k), "{r:?}");
            assert_eq!(r.imm(), ud_imm(s, k), "{r:?}");
            assert_eq!(rbuf.read(o + 8, 16), vm[*home].dev.gid(), "source GID");
            assert_eq!(rbuf.read(o + 24, 16), vm[0].dev.gid(), "destination GID");
            assert_eq!(rbuf.read(o + GRH, ud_len(s, k)), ud_data(s, k));
            rbuf.assert_untouched(
                o + GRH + ud_len(s, k),
                UD_SLOT - GRH - ud_len(s, k),
                "past a UD message",
            );
        }
        assert_eq!(next, vec![UD_MSGS; senders.len()]);
    });
    assert_quiet(&rcq);
}

/// A UD send whose `remote_qkey` has bit 31 set carries the sending QP's
/// own Q_Key (spec 18.8, 18.11.5): with equal Q_Keys it is delivered.
#[test]
fn ud_qkey_bit31_sends_own_qkey() {
    let (_d, vm) = vms(2);
    let (cqa, cqb) = (
        Cq::create(&vm[0].dev, 16).unwrap(),
        Cq::create(&vm[1].dev, 16).unwrap(),
    );
    let (qa, qb) = (ud_qp(&vm[0], &cqa, 4), ud_qp(&vm[1], &cqb, 4));
    let ah = ah_to(&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(&vm[0], 4096), Buf::new(&vm[1], 4096));
    ba.write(0, b"own qkey");
    recv(&qb, 1, &[bb.sge(0, 4096)]);
    let sg = [ba.sge(0, 8)];
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: qb.qpn(),
        remote_qkey: 0x8000_0000,
    });
    qa.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!(r.src_qpn, qa.qpn());
    assert_eq!(bb.read(GRH, 8), b"own qkey");
}

// ---------------------------------------------------------------------------
// 3. CQ overflow

/// A CQ of depth 4 that nobody polls overflows on the fifth completion
/// (spec 18.17): exactly one `CQ_ERROR` for it, one `QP_FATAL` for each QP
/// using it (as send CQ or as receive CQ), both QPs in ERR, their flush
/// completions on their other CQs, nothing more in the failed CQ (no CQE,
/// no `CQ_COMPLETION` event even when armed), the responders untouched, and
/// other QP pairs — on the same VMs with other CQs, and on other VMs — keep
/// working.
#[test]
fn cq_overflow_fails_its_qps_only() {
    let (_d, vm) = vms(4);
    let (a, b) = (&vm[0], &vm[1]);
    let small = Cq::create(&a.dev, 4).unwrap();
    assert_eq!(small.depth(), 4);
    let big = Cq::create(&a.dev, 64).unwrap();
    let big2 = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    // qa sends into `small`; qa2 receives into it.
    let qa = rc_qp_on(a, &small, &big);
    let qa2 = rc_qp_on(a, &big2, &small);
    let (qb, qb2) = (rc_qp(b, &cqb), rc_qp(b, &cqb));
    connect(a, &qa, b, &qb);
    connect(a, &qa2, b, &qb2);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    recv(&qa, 50, &[ba.sge(0, 64)]);
    recv(&qa, 51, &[ba.sge(64, 64)]);
    recv(&qa2, 60, &[ba.sge(128, 64)]);
    ba.write(1024, &pattern(64, 1));
    let sg = [ba.sge(1024, 8)];
    let wrs: Vec<SendWr<'_>> = (0..6u64)
        .map(|i| wr(i, write_op(&bb, 8 * i as usize), &sg))
        .collect();
    qa.post_send(&wrs).unwrap();
    let evs = collect_events(&a.dev, 3);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::CQ_ERROR), small.handle()),
            (Some(EventKind::QP_FATAL), qa.handle()),
            (Some(EventKind::QP_FATAL), qa2.handle()),
        ])
    );
    assert_state(&qa, QpState::ERR);
    assert_state(&qa2, QpState::ERR);
    // The four completions that fit, then nothing.
    let wcs = poll_n(&small, 4);
    for (i, wc) in wcs.iter().enumerate() {
        ok(wc, i as u64, WcOpcode::RDMA_WRITE);
    }
    // qa's receives are flushed into its receive CQ.
    let fl = poll_n(&big, 2);
    for (wc, id) in fl.iter().zip([50, 51]) {
        failed(wc, id, WcStatus::WR_FLUSH_ERR);
        assert_eq!(wc.qpn, qa.qpn());
    }
    // qa2's sends are flushed into its send CQ.
    qa2.post_send(&[wr(61, write_op(&bb, 0), &sg)]).unwrap();
    failed(&poll_one(&big2), 61, WcStatus::WR_FLUSH_ERR);
    // The failed CQ stays silent, armed or not, whatever is flushed to it.
    small.req_notify(false);
    qa.post_send(&[wr(7, write_op(&bb, 0), &sg)]).unwrap();
    recv(&qa2, 62, &[ba.sge(0, 8)]);
    assert_quiet(&small);
    assert!(!small.wait_event(Some(QUIET)).unwrap());
    assert_quiet(&big);
    // The responders are unharmed; VM 1 saw no event.
    assert_state(&qb, QpState::RTS);
    assert_state(&qb2, QpState::RTS);
    assert_no_event(&b.dev, "responder VM");
    // Other pairs keep working: VM 0 with other CQs, VMs 2 and 3.
    for (x, y) in [(0, 1), (2, 3), (3, 0)] {
        let p = rc_pair(&vm[x], &vm[y]);
        let (bx, by) = (Buf::new(&vm[x], 8192), Buf::new(&vm[y], 16384));
        let data = pattern(5000, 77 + x as u64);
        bx.write(0, &data);
        recv(&p.qb, 1, &sges(&by, 8192, 8192));
        let sg = sges(&bx, 0, 4000);
        p.qa.post_send(&[
            wr(2, write_op(&by, 0), &sges(&bx, 0, 5000)),
            wr(3, SendOp::Send, &sg),
        ])
        .unwrap();
        let w = poll_n(&p.cqa, 2);
        ok(&w[0], 2, WcOpcode::RDMA_WRITE);
        ok(&w[1], 3, WcOpcode::SEND);
        let r = poll_one(&p.cqb);
        ok(&r, 1, WcOpcode::RECV);
        assert_eq!(r.byte_len, 4000);
        assert_eq!(by.read(0, 5000), data);
        assert_eq!(by.read(8192, 4000), data[..4000]);
        by.assert_untouched(5000, 8192 - 5000, "between WRITE and SEND");
    }
    assert_no_event(&a.dev, "after the overflow");
}

/// The responder's receive CQ overflows: the message was delivered, so the
/// requester's WQE completes successfully (spec 18.18, notes); the
/// responder gets `CQ_ERROR` and `QP_FATAL` and its QP is in ERR; later
/// sends find it unreachable (`RETRY_EXC_ERR`).
#[test]
fn cq_overflow_at_the_responder_still_delivers() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let small = Cq::create(&b.dev, 2).unwrap();
    let qa = rc_qp(a, &cqa);
    let qb = rc_qp(b, &small);
    connect(a, &qa, b, &qb);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    for k in 0..4 {
        recv(&qb, k, &[bb.sge(k as usize * 64, 64)]);
    }
    for k in 0..3u64 {
        let d = pattern(32, 500 + k);
        ba.write(0, &d);
        let sg = [ba.sge(0, 32)];
        qa.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&cqa), k, WcOpcode::SEND);
        assert_eq!(bb.read(k as usize * 64, 32), d, "message {k} delivered");
    }
    let evs = collect_events(&b.dev, 2);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::CQ_ERROR), small.handle()),
            (Some(EventKind::QP_FATAL), qb.handle()),
        ])
    );
    assert_state(&qb, QpState::ERR);
    let sg = [ba.sge(0, 8)];
    qa.post_send(&[wr(9, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&cqa), 9, WcStatus::RETRY_EXC_ERR);
    assert_no_event(&a.dev, "requester VM");
}

// ---------------------------------------------------------------------------
// 4. SRQ limit

/// SRQ limit events (spec 12.19, 18.21): an SRQ on VM 1 shared by QPs
/// connected to VMs 0 and 2. `SRQ_LIMIT_REACHED` is queued exactly once,
/// at the consumption that leaves fewer posted WQEs than the limit, and the
/// limit then reads 0; arming a limit already above the number posted
/// raises nothing until the next consumption; arming again works.
#[test]
fn srq_limit_event_once_per_arming() {
    let (_d, vm) = vms(3);
    let b = &vm[1];
    let srq = Srq::create(&b.pd, 16, 1, 0).unwrap();
    assert_eq!(srq.depth(), 16);
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let (qb0, qb2) = (srq_qp(b, &cqb, &srq), srq_qp(b, &cqb, &srq));
    let (cq0, cq2) = (
        Cq::create(&vm[0].dev, 64).unwrap(),
        Cq::create(&vm[2].dev, 64).unwrap(),
    );
    let (q0, q2) = (rc_qp(&vm[0], &cq0), rc_qp(&vm[2], &cq2));
    connect(&vm[0], &q0, b, &qb0);
    connect(&vm[2], &q2, b, &qb2);
    let (s0, s2) = (Buf::new(&vm[0], 4096), Buf::new(&vm[2], 4096));
    let rb = Buf::new(b, 32 * 128);
    let (posted, consumed) = (Cell::new(0u64), Cell::new(0u64));
    let post = |n: u64| {
        for _ in 0..n {
            let k = posted.get();
            recv_srq(&srq, k, &rb, k as usize * 128);
            posted.set(k + 1);
        }
    };
    // One message from VM 0 or VM 2 (alternating), received through the SRQ.
    let message = || {
        let k = consumed.get();
        let (q, cq, s, qb) = if k % 2 == 0 {
            (&q0, &cq0, &s0, &qb0)
        } else {
            (&q2, &cq2, &s2, &qb2)
        };
        let d = pattern(40 + k as usize, 300 + k);
        s.write(0, &d);
        let sg = [s.sge(0, d.len())];
        q.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(cq), k, WcOpcode::SEND);
        let r = poll_one(&cqb);
        ok(&r, k, WcOpcode::RECV);
        assert_eq!(r.qpn, qb.qpn());
        assert_eq!(rb.read(k as usize * 128, d.len()), d);
        consumed.set(k + 1);
    };
    let limit = || srq.query().unwrap().limit;
    post(8);
    assert_eq!(limit(), 0);
    srq.modify_limit(4).unwrap();
    assert_eq!(limit(), 4);
    assert_no_event(&b.dev, "arming above the posted count");
    // 8 posted: consumptions leave 7, 6, 5, 4 — none below 4.
    for _ in 0..4 {
        message();
        assert_no_event(&b.dev, "posted WQEs not below the limit");
    }
    // 3 < 4: the event, once, and the limit is disarmed.
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    message();
    assert_no_event(&b.dev, "disarmed limit");
    // 2 posted: arming 3 raises nothing by itself ...
    srq.modify_limit(3).unwrap();
    assert_eq!(limit(), 3);
    assert_no_event(&b.dev, "arming below the posted count");
    // ... but the next consumption does.
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    assert_no_event(&b.dev, "one event per arming");
    // 1 + 8 posted; limit 8: 9 -> 8 is not below it, 8 -> 7 is.
    post(8);
    srq.modify_limit(8).unwrap();
    message();
    assert_no_event(&b.dev, "8 posted, limit 8");
    assert_eq!(limit(), 8);
    message();
    expect_event(&b.dev, EventKind::SRQ_LIMIT_REACHED, srq.handle());
    assert_eq!(limit(), 0);
    while consumed.get() < posted.get() {
        message();
    }
    assert_no_event(&b.dev, "SRQ drained with the limit disarmed");
    assert_quiet(&cqb);
}

fn recv_srq(srq: &Srq, wr_id: u64, b: &Buf, off: usize) {
    srq.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[b.sge(off, 128)],
    }])
    .unwrap();
}

/// A QP attached to an SRQ that enters ERR leaves the SRQ's WQEs to the
/// other QPs and queues one `QP_LAST_WQE_REACHED` (spec 18.19 item 5,
/// 18.21).
#[test]
fn srq_qp_error_last_wqe_reached() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let srq = Srq::create(&b.pd, 16, 1, 0).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let (qb1, qb2) = (srq_qp(b, &cqb, &srq), srq_qp(b, &cqb, &srq));
    let (qa1, qa2) = (rc_qp(a, &cqa), rc_qp(a, &cqa));
    connect(a, &qa1, b, &qb1);
    connect(a, &qa2, b, &qb2);
    let rb = Buf::new(b, 4096);
    for k in 0..2u64 {
        recv_srq(&srq, k, &rb, k as usize * 128);
    }
    qb1.to_error().unwrap();
    expect_event(&b.dev, EventKind::QP_LAST_WQE_REACHED, qb1.handle());
    assert_no_event(&b.dev, "one QP_LAST_WQE_REACHED");
    // The SRQ's WQEs were not flushed: qb2 receives the first one.
    assert_quiet(&cqb);
    let sa = Buf::new(a, 4096);
    sa.write(0, b"still here");
    let sg = [sa.sge(0, 10)];
    qa2.post_send(&[wr(5, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&cqa), 5, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 0, WcOpcode::RECV);
    assert_eq!(r.qpn, qb2.qpn());
    assert_eq!(rb.read(0, 10), b"still here");
}

// ---------------------------------------------------------------------------
// 5. A VM disconnects in the middle of traffic

/// WRITE then SEND back and forth on `p` until `stop`; every byte checked.
/// Returns (rounds, rounds started after `gone` was set).
fn ping_pong_until(
    a: &Vm,
    b: &Vm,
    p: &Pair,
    seed: u64,
    stop: &AtomicBool,
    gone: &AtomicBool,
) -> (u64, u64) {
    let (ba, bb) = (Buf::new(a, 65536), Buf::new(b, 65536));
    let (mut i, mut after) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        if gone.load(Ordering::Relaxed) {
            after += 1;
        }
        let len = 1 + (i as usize * 7919) % 65535;
        let data = pattern(len, seed * 1_000_000 + i);
        ba.write(0, &data);
        let sg = sges(&ba, 0, len);
        p.qa.post_send(&[wr(i, write_op(&bb, 0), &sg)]).unwrap();
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        assert_eq!(bb.read(0, len), data, "round {i}");
        recv(&p.qa, i, &[ba.sge(0, 65536)]);
        let n = len.min(4096);
        let sg = sges(&bb, 0, n);
        p.qb.post_send(&[wr(i, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&p.cqb), i, WcOpcode::SEND);
        let r = poll_one(&p.cqa);
        ok(&r, i, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, n);
        assert_eq!(ba.read(0, n), data[..n]);
    }
    (i, after)
}

/// Five VMs: pairs (0,1) and (2,3) exchange checked traffic while VM 4 —
/// with big RDMA WRITEs into VMs 0 and 2 just posted, and VM 0 writing into
/// it — drops its vhost-user connection. The pairs keep exchanging correct
/// data; VM 0's QP towards the vanished VM fails with `RETRY_EXC_ERR` (its
/// peer QP no longer exists, spec 15.2, 18.20, 18.24) and only that QP; the
/// bytes around the region VM 4 was writing are untouched; the daemon
/// releases VM 4 and a new VM on the same socket works with the others.
#[test]
fn vm_disconnect_mid_transfer() {
    const BIG: usize = 1 << 20;
    let (d, mut vm) = vms(5);
    // Nothing of VM 4 is ever dropped: once it is disconnected, destroy
    // commands could only time out. Its objects (and the pairs that have
    // a side on it) stay leaked.
    let victim = ManuallyDrop::new(vm.pop().unwrap());
    let p01 = rc_pair(&vm[0], &vm[1]);
    let p23 = rc_pair(&vm[2], &vm[3]);
    // VM 0 -> VM 4 (VM 0 is the requester), VM 4 -> VMs 0 and 2.
    let p04 = ManuallyDrop::new(rc_pair(&vm[0], &victim));
    let p40 = ManuallyDrop::new(rc_pair(&victim, &vm[0]));
    let p42 = ManuallyDrop::new(rc_pair(&victim, &vm[2]));
    let sink0 = Buf::new(&vm[0], BIG + 4096);
    let sink2 = Buf::new(&vm[2], BIG + 4096);
    let vsrc = ManuallyDrop::new(Buf::new(&victim, BIG));
    vsrc.write(0, &pattern(BIG, 4));
    let vdst = ManuallyDrop::new(Buf::new(&victim, 65536));
    let probe = Buf::new(&vm[0], 65536);
    let (stop, gone) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let (stop, gone, vm) = (&stop, &gone, &vm);
        let h01 = s.spawn(|| ping_pong_until(&vm[0], &vm[1], &p01, 1, stop, gone));
        let h23 = s.spawn(|| ping_pong_until(&vm[2], &vm[3], &p23, 2, stop, gone));
        // VM 0 keeps writing into VM 4 until that fails.
        let prober = s.spawn(|| {
            let deadline = Instant::now() + WAIT;
            let mut i = 0u64;
            loop {
                assert!(Instant::now() < deadline, "writes into VM 4 never failed");
                i += 1;
                let len = 1 + (i as usize * 4099) % 65535;
                let data = pattern(len, 50_000 + i);
                probe.write(0, &data);
                let sg = sges(&probe, 0, len);
                p04.qa.post_send(&[wr(i, write_op(&vdst, 0), &sg)]).unwrap();
                let wc = poll_one(&p04.cqa);
                if wc.is_success() {
                    ok(&wc, i, WcOpcode::RDMA_WRITE);
                    assert_eq!(vdst.read(0, len), data, "write {i} into VM 4");
                    continue;
                }
                assert!(
                    gone.load(Ordering::Acquire),
                    "write {i} failed early: {wc:?}"
                );
                // The device knows VM 4 is gone: the QP fails and its
                // work is flushed rather than retried (spec 18.23).
                failed(&wc, i, WcStatus::WR_FLUSH_ERR);
                return i;
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        // VM 4: a burst of big writes, then the connection goes away.
        let sg = sges(&vsrc, 0, BIG);
        let burst: Vec<SendWr<'_>> = (0..8).map(|k| wr(k, write_op(&sink0, 0), &sg)).collect();
        p40.qa.post_send(&burst).unwrap();
        let burst: Vec<SendWr<'_>> = (0..8).map(|k| wr(k, write_op(&sink2, 0), &sg)).collect();
        p42.qa.post_send(&burst).unwrap();
        gone.store(true, Ordering::Release);
        victim.t.vmm().disconnect();
        let probes = prober.join().unwrap();
        assert!(probes > 1, "VM 0 never reached VM 4");
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        for (name, h) in [("0-1", h01), ("2-3", h23)] {
            let (rounds, after) = h.join().unwrap();
            assert!(rounds > 10, "pair {name}: {rounds} rounds");
            assert!(
                after > 3,
                "pair {name}: {after} rounds after the disconnect"
            );
        }
    });
    // Exactly the QPs connected to VM 4 failed, each with QP_FATAL, and
    // work posted to them now is flushed.
    for q in [&p04.qa, &p40.qb, &p42.qb] {
        wait_state(q, QpState::ERR);
    }
    p04.qa
        .post_send(&[wr(99, write_op(&probe, 0), &[])])
        .unwrap();
    failed(&poll_one(&p04.cqa), 99, WcStatus::WR_FLUSH_ERR);
    for q in [&p01.qa, &p01.qb, &p23.qa, &p23.qb] {
        assert_state(q, QpState::RTS);
    }
    let fatal = Some(EventKind::QP_FATAL);
    assert_eq!(
        collect_events(&vm[0].dev, 2),
        sorted(vec![(fatal, p04.qa.handle()), (fatal, p40.qb.handle())])
    );
    assert_eq!(
        collect_events(&vm[2].dev, 1),
        vec![(fatal, p42.qb.handle())]
    );
    // The victim's writes touched nothing past their range; its targets
    // completed nothing.
    sink0.assert_untouched(BIG, 4096, "past VM 4's writes into VM 0");
    sink2.assert_untouched(BIG, 4096, "past VM 4's writes into VM 2");
    assert_quiet(&p40.cqb);
    assert_quiet(&p42.cqb);
    for (i, v) in vm.iter().enumerate() {
        assert_no_event(&v.dev, &format!("VM {i}"));
    }
    // The daemon released VM 4 and serves a new VM on its socket.
    let s = d.wait_released(4);
    assert!(!s.connected, "{s:?}");
    assert!(s.device.resources.is_empty(), "{s:?}");
    let fresh = open(&d, 4);
    assert_eq!(d.stats_connected(4, 2).connections, 2);
    for peer in [0, 2] {
        let p = rc_pair(&vm[peer], &fresh);
        let (bp, bf) = (Buf::new(&vm[peer], 8192), Buf::new(&fresh, 8192));
        let data = pattern(6000, 600 + peer as u64);
        bp.write(0, &data);
        p.qa.post_send(&[wr(2, write_op(&bf, 100), &sges(&bp, 0, 6000))])
            .unwrap();
        ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
        assert_eq!(bf.read(100, 6000), data);
        bp.write(0, &[GUARD_BYTE; 6000]);
        recv(&p.qa, 1, &sges(&bp, 0, 8192));
        p.qb.post_send(&[wr(3, SendOp::Send, &sges(&bf, 100, 6000))])
            .unwrap();
        ok(&poll_one(&p.cqb), 3, WcOpcode::SEND);
        let r = poll_one(&p.cqa);
        ok(&r, 1, WcOpcode::RECV);
        assert_eq!(r.byte_len, 6000);
        assert_eq!(bp.read(0, 6000), data);
    }
}

// ---------------------------------------------------------------------------
// 6. Chapter 18 rules not covered by datapath.rs

/// `WQE_FENCE` (spec 18.12): a SEND fenced behind an RDMA READ sends the
/// bytes the READ fetched, and a WRITE fenced behind a FETCH_ADD writes the
/// fetched value. An unsignaled successful WQE in between produces no CQE.
#[test]
fn fence_after_read_and_atomic() {
    const LEN: usize = (1 << 20) + 5;
    /// An 8-byte aligned counter past the data.
    const CTR: usize = LEN.next_multiple_of(8) + 8;
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let remote = Buf::new(b, LEN + 4096);
    let data = pattern(LEN, 4242);
    remote.write(0, &data);
    remote.write(CTR, &41u64.to_le_bytes());
    let local = Buf::new(a, LEN + 4096);
    local.write(0, &vec![0; LEN + 4096]);
    let inbox = Buf::new(b, 8192);
    recv(&p.qb, 7, &[inbox.sge(0, 8192)]);
    let rsg = sges(&local, 0, LEN);
    let read = SendOp::RdmaRead {
        remote_addr: remote.addr(0),
        rkey: remote.mr.rkey(),
    };
    // The head and the tail of what the READ brings.
    let ssg = [local.sge(0, 3000), local.sge(LEN - 3000, 3000)];
    let mut send = wr(2, SendOp::Send, &ssg);
    send.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    let mut unsignaled = wr(3, write_op(&remote, CTR + 64), &ssg[..1]);
    unsignaled.flags = SendFlags::NONE;
    let fsg = [local.sge(CTR, 8)];
    let fadd = SendOp::AtomicFetchAdd {
        remote_addr: remote.addr(CTR),
        rkey: remote.mr.rkey(),
        add: 1,
    };
    let mut fenced_write = wr(5, write_op(&remote, CTR + 8), &fsg);
    fenced_write.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    p.qa.post_send(&[
        wr(1, read, &rsg),
        send,
        unsignaled,
        wr(4, fadd, &fsg),
        fenced_write,
    ])
    .unwrap();
    let wcs = poll_n(&p.cqa, 4);
    ok(&wcs[0], 1, WcOpcode::RDMA_READ);
    assert_eq!(wcs[0].byte_len as usize, LEN);
    ok(&wcs[1], 2, WcOpcode::SEND);
    ok(&wcs[2], 4, WcOpcode::FETCH_ADD);
    ok(&wcs[3], 5, WcOpcode::RDMA_WRITE);
    let r = poll_one(&p.cqb);
    ok(&r, 7, WcOpcode::RECV);
    assert_eq!(r.byte_len, 6000);
    assert_eq!(
        inbox.read(0, 3000),
        data[..3000],
        "SEND saw the READ's data"
    );
    assert_eq!(inbox.read(3000, 3000), data[LEN - 3000..]);
    assert_eq!(
        remote.read(CTR + 64, 3000),
        data[..3000],
        "unsignaled WRITE"
    );
    assert_eq!(remote.u64_at(CTR), 42);
    assert_eq!(remote.u64_at(CTR + 8), 41, "WRITE saw the fetched value");
    assert_quiet(&p.cqa);
    assert_quiet(&p.cqb);
}

/// `ARM_SOLICITED` (spec 18.12, 18.16): only a solicited completion (SEND or
/// RDMA_WRITE_WITH_IMM with `WQE_SOLICITED`) or a failed one raises the
/// event; completions carry `CQE_SOLICITED` exactly when solicited, and the
/// requester's completion carries no flag.
#[test]
fn arm_solicited_fires_only_for_solicited_or_failed() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, &pattern(256, 5));
    let sg = [ba.sge(0, 64)];
    let arm = |cq: &Cq| {
        cq.req_notify(true);
        assert_eq!(cq.poll_one(), None);
    };
    // Unsolicited SEND: a completion, no event.
    arm(&p.cqb);
    recv(&p.qb, 1, &[bb.sge(0, 256)]);
    p.qa.post_send(&[wr(1, SendOp::Send, &sg)]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::SEND);
    assert_eq!(s.flags, 0);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert!(!r.is_solicited(), "{r:?}");
    assert!(!p.cqb.wait_event(Some(QUIET)).unwrap(), "unsolicited SEND");
    // The same arming is still pending: a solicited SEND_WITH_IMM fires it.
    recv(&p.qb, 2, &[bb.sge(0, 256)]);
    let mut w = wr(2, SendOp::SendWithImm { imm: 0x0102_0304 }, &sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.qa.post_send(&[w]).unwrap();
    assert!(p.cqb.wait_event(Some(WAIT)).unwrap(), "solicited SEND");
    let s = poll_one(&p.cqa);
    ok(&s, 2, WcOpcode::SEND);
    assert_eq!(s.flags, 0, "requester completions carry no flag");
    let r = poll_one(&p.cqb);
    ok(&r, 2, WcOpcode::RECV);
    assert!(r.is_solicited(), "{r:?}");
    assert_eq!(r.imm(), Some(0x0102_0304));
    assert!(
        !p.cqb.wait_event(Some(QUIET)).unwrap(),
        "one event per arming"
    );
    // Solicited RDMA_WRITE_WITH_IMM.
    arm(&p.cqb);
    recv(&p.qb, 3, &[]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: bb.addr(1000),
        rkey: bb.mr.rkey(),
        imm: 77,
    };
    let mut w = wr(3, op, &sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.qa.post_send(&[w]).unwrap();
    assert!(
        p.cqb.wait_event(Some(WAIT)).unwrap(),
        "solicited WRITE_WITH_IMM"
    );
    let r = poll_one(&p.cqb);
    ok(&r, 3, WcOpcode::RECV_RDMA_WITH_IMM);
    assert!(r.is_solicited(), "{r:?}");
    assert_eq!(r.byte_len, 64);
    assert_eq!(bb.read(1000, 64), ba.read(0, 64));
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    // On the requester: a successful completion does not fire an
    // ARM_SOLICITED request, a failed one does.
    arm(&p.cqa);
    p.qa.post_send(&[wr(4, write_op(&bb, 0), &sg)]).unwrap();
    ok(&poll_one(&p.cqa), 4, WcOpcode::RDMA_WRITE);
    assert!(!p.cqa.wait_event(Some(QUIET)).unwrap(), "successful WRITE");
    let mut bad = ba.sge(0, 16);
    bad.lkey ^= 0x00ab_cd00;
    let bad = [bad];
    p.qa.post_send(&[wr(5, write_op(&bb, 0), &bad)]).unwrap();
    assert!(p.cqa.wait_event(Some(WAIT)).unwrap(), "failed WRITE");
    failed(&poll_one(&p.cqa), 5, WcStatus::LOC_PROT_ERR);
}

/// Remote access errors (spec 18.11.2, 18.11.3, 18.18): the requester's WQE
/// completes with `REM_ACCESS_ERR`, both QPs go to ERR, the responder's VM
/// gets `QP_ACCESS_ERROR` for its QP, no receive is consumed and no byte of
/// the target is written; later work on the requester is flushed.
#[test]
fn remote_access_errors() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other_pd = Pd::alloc(&b.dev).unwrap();
    struct Case {
        what: &'static str,
        mr_access: u32,
        other_pd: bool,
        qp_access: u32,
        read: bool,
        /// Offset and length in the 4096-byte target MR.
        off: usize,
        len: usize,
    }
    let base = Case {
        what: "",
        mr_access: access::ALL,
        other_pd: false,
        qp_access: QP_ACCESS,
        read: false,
        off: 0,
        len: 64,
    };
    let cases = [
        Case {
            what: "WRITE to an MR without REMOTE_WRITE",
            mr_access: access::LOCAL_WRITE | access::REMOTE_READ,
            ..base
        },
        Case {
            what: "READ from an MR without REMOTE_READ",
            mr_access: access::LOCAL_WRITE | access::REMOTE_WRITE,
            read: true,
            ..base
        },
        Case {
            what: "WRITE to a QP without REMOTE_WRITE",
            qp_access: access::REMOTE_READ,
            ..base
        },
        Case {
            what: "READ from a QP without REMOTE_READ",
            qp_access: access::REMOTE_WRITE,
            read: true,
            ..base
        },
        Case {
            what: "WRITE one byte past the end of the MR",
            off: 4096 - 63,
            ..base
        },
        Case {
            what: "WRITE to an MR of another PD",
            other_pd: true,
            ..base
        },
    ];
    for c in &cases {
        let cqa = Cq::create(&a.dev, 64).unwrap();
        let cqb = Cq::create(&b.dev, 64).unwrap();
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
        qb.rc_connect(c.qp_access, &conn(&qa, a)).unwrap();
        let pd = if c.other_pd { &other_pd } else { &b.pd };
        let target = Buf::with_access(b, pd, 4096, c.mr_access);
        let local = Buf::new(a, 4096);
        let inbox = Buf::new(b, 4096);
        recv(&qb, 1, &[inbox.sge(0, 4096)]);
        local.write(0, &pattern(64, 9));
        let sg = [local.sge(0, c.len)];
        let op = if c.read {
            SendOp::RdmaRead {
                remote_addr: target.addr(c.off),
                rkey: target.mr.rkey(),
            }
        } else {
            write_op(&target, c.off)
        };
        qa.post_send(&[wr(10, op, &sg), wr(11, SendOp::Send, &sg)])
            .unwrap();
        let wcs = poll_n(&cqa, 2);
        assert_eq!(wcs[0].wr_id, 10, "{}: {wcs:?}", c.what);
        assert_eq!(
            wcs[0].status(),
            Some(WcStatus::REM_ACCESS_ERR),
            "{}: {wcs:?}",
            c.what
        );
        failed(&wcs[1], 11, WcStatus::WR_FLUSH_ERR);
        expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, qb.handle());
        assert_no_event(&b.dev, c.what);
        assert_no_event(&a.dev, c.what);
        wait_state(&qa, QpState::ERR);
        wait_state(&qb, QpState::ERR);
        target.assert_untouched(0, 4096, c.what);
        // The receive was not consumed by the failed WQE: it is flushed.
        let r = poll_one(&cqb);
        failed(&r, 1, WcStatus::WR_FLUSH_ERR);
        inbox.assert_untouched(0, 4096, c.what);
        assert_quiet(&cqb);
    }
}

/// Length errors (spec 18.11.1, 18.13, 18.18). RC: a SEND one byte longer
/// than the receive buffers fails with `REM_INV_REQ_ERR`, the consumed
/// receive with `LOC_LEN_ERR`, both QPs go to ERR, no event, no byte past
/// the receive buffers written. UD: a message that does not fit after the
/// GRH completes successfully at the sender and with `LOC_LEN_ERR` at the
/// receiver, which goes to ERR and drops what follows.
#[test]
fn length_errors() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    // RC.
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, &pattern(200, 3));
    recv(&p.qb, 1, &[bb.sge(0, 60), bb.sge(1000, 40)]);
    let sg = sges(&ba, 0, 101);
    p.qa.post_send(&[wr(2, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&p.cqa), 2, WcStatus::REM_INV_REQ_ERR);
    let r = poll_one(&p.cqb);
    failed(&r, 1, WcStatus::LOC_LEN_ERR);
    assert_eq!(r.qpn, p.qb.qpn());
    assert!(r.raw_opcode & 0x80 != 0, "a receive completion: {r:?}");
    wait_state(&p.qa, QpState::ERR);
    wait_state(&p.qb, QpState::ERR);
    bb.assert_untouched(60, 940, "between the receive SGEs");
    bb.assert_untouched(1040, 4096 - 1040, "past the receive SGEs");
    assert_no_event(&a.dev, "RC length error (requester)");
    assert_no_event(&b.dev, "RC length error (responder)");
    // UD.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    let ub_buf = Buf::new(b, 4096);
    recv(&ub, 3, &[ub_buf.sge(0, GRH + 50)]);
    recv(&ub, 4, &[ub_buf.sge(2048, 1024)]);
    let dest = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    let sg = [ba.sge(0, 51)];
    let mut w = wr(5, SendOp::Send, &sg);
    w.ud = dest;
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 5, WcOpcode::SEND);
    failed(&poll_one(&cqb), 3, WcStatus::LOC_LEN_ERR);
    wait_state(&ub, QpState::ERR);
    ub_buf.assert_untouched(GRH + 50, 2048 - GRH - 50, "past a UD receive");
    // The receiver in ERR flushes its other receive and drops messages.
    failed(&poll_one(&cqb), 4, WcStatus::WR_FLUSH_ERR);
    let sg = [ba.sge(0, 10)];
    let mut w = wr(6, SendOp::Send, &sg);
    w.ud = dest;
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 6, WcOpcode::SEND);
    assert_state(&ua, QpState::RTS);
    assert_quiet(&cqb);
    ub_buf.assert_untouched(2048, 2048, "a dropped UD message");
}

/// Zero-length SENDs (spec 18.9, 18.10, 18.13): without SGEs, with an
/// empty inline payload and with immediate data, RC and UD. The receive
/// completes with `byte_len` 0 (UD: 40, the GRH alone) and no byte of the
/// receive buffer is written (UD: only the GRH).
#[test]
fn zero_length_send() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    let bb = Buf::new(b, 4096);
    recv(&p.qb, 1, &[bb.sge(0, 128)]);
    p.qa.post_send(&[wr(1, SendOp::Send, &[])]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::SEND);
    assert_eq!(s.byte_len, 0);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.imm()), (0, None));
    recv(&p.qb, 2, &[bb.sge(128, 128)]);
    p.qa.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::SendWithImm { imm: 0xFEED },
        payload: Payload::Inline(&[]),
        flags: SendFlags::SIGNALED,
        ud: None,
    }])
    .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 2, WcOpcode::RECV);
    assert_eq!((r.byte_len, r.imm()), (0, Some(0xFEED)));
    // A receive without SGEs takes a zero-length SEND.
    recv(&p.qb, 3, &[]);
    p.qa.post_send(&[wr(3, SendOp::Send, &[])]).unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 3, WcOpcode::RECV);
    assert_eq!(r.byte_len, 0);
    bb.assert_untouched(0, 4096, "zero-length RC SENDs");
    assert_state(&p.qa, QpState::RTS);
    assert_state(&p.qb, QpState::RTS);
    // UD: the GRH alone.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    let ubuf = Buf::new(b, 4096);
    recv(&ub, 4, &[ubuf.sge(0, 1024)]);
    let mut w = wr(4, SendOp::SendWithImm { imm: 9 }, &[]);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 4, WcOpcode::RECV);
    assert!(r.has_grh());
    assert_eq!((r.byte_len as usize, r.imm()), (GRH, Some(9)));
    assert_eq!(r.src_qpn, ua.qpn());
    assert_eq!(ubuf.read(8, 16), a.dev.gid());
    assert_eq!(ubuf.read(24, 16), b.dev.gid());
    ubuf.assert_untouched(GRH, 4096 - GRH, "a zero-length UD SEND");
}

/// Zero-length RDMA operations access no memory and check neither `rkey`
/// nor `remote_addr` (spec 18.11.2, 18.11.3): a zero-length
/// RDMA_WRITE_WITH_IMM with `rkey` 0 delivers just the immediate value, a
/// zero-length RDMA READ or WRITE with a bogus key succeeds.
#[test]
fn zero_length_rdma_ignores_rkey() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let p = rc_pair(a, b);
    recv(&p.qb, 1, &[]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: 0xABCD,
    };
    p.qa.post_send(&[wr(1, op, &[])]).unwrap();
    let s = poll_one(&p.cqa);
    ok(&s, 1, WcOpcode::RDMA_WRITE);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!((r.byte_len, r.imm()), (0, Some(0xABCD)));
    let read = SendOp::RdmaRead {
        remote_addr: 0x1234_5678,
        rkey: 0xDEAD_BEEF,
    };
    let write = SendOp::RdmaWrite {
        remote_addr: 0x1234_5678,
        rkey: 0xDEAD_BEEF,
    };
    p.qa.post_send(&[wr(2, read, &[]), wr(3, write, &[])])
        .unwrap();
    let w = poll_n(&p.cqa, 2);
    ok(&w[0], 2, WcOpcode::RDMA_READ);
    assert_eq!(w[0].byte_len, 0);
    ok(&w[1], 3, WcOpcode::RDMA_WRITE);
    assert_state(&p.qb, QpState::RTS);
    assert_no_event(&b.dev, "zero-length RDMA");
}

/// RDMA_WRITE_WITH_IMM without a receive WQE at the responder: RNR, and
/// nothing is written (spec 18.11.2: the device makes sure a receive WQE is
/// available before it writes any data).
#[test]
fn write_with_imm_rnr_writes_nothing() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
    let mut ca = conn(&qb, b);
    ca.rnr_retry = 0;
    qa.rc_connect(QP_ACCESS, &ca).unwrap();
    let mut cb = conn(&qa, a);
    cb.min_rnr_timer = 1;
    qb.rc_connect(QP_ACCESS, &cb).unwrap();
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, &pattern(100, 8));
    let sg = [ba.sge(0, 100)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: bb.addr(0),
        rkey: bb.mr.rkey(),
        imm: 1,
    };
    qa.post_send(&[wr(1, op, &sg)]).unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RNR_RETRY_EXC_ERR);
    bb.assert_untouched(0, 4096, "RDMA_WRITE_WITH_IMM without a receive");
    assert_state(&qb, QpState::RTS);
    assert_quiet(&cqb);
}

/// An RDMA READ or atomic to a responder whose `max_dest_rd_atomic` is 0 is
/// an invalid request (spec 18.11.3, 18.18): `REM_INV_REQ_ERR`, both QPs in
/// ERR, `QP_REQ_ERROR` for the responder, nothing read or changed.
#[test]
fn read_to_responder_without_rd_atomic() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    bb.write(0, &pattern(64, 1));
    let ops = [
        SendOp::RdmaRead {
            remote_addr: bb.addr(0),
            rkey: bb.mr.rkey(),
        },
        SendOp::AtomicFetchAdd {
            remote_addr: bb.addr(0),
            rkey: bb.mr.rkey(),
            add: 1,
        },
    ];
    for (op, len) in ops.into_iter().zip([64, 8]) {
        let (cqa, cqb) = (
            Cq::create(&a.dev, 16).unwrap(),
            Cq::create(&b.dev, 16).unwrap(),
        );
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
        let mut cb = conn(&qa, a);
        cb.max_dest_rd_atomic = 0;
        qb.rc_connect(QP_ACCESS, &cb).unwrap();
        let sg = [ba.sge(0, len)];
        qa.post_send(&[wr(1, op, &sg)]).unwrap();
        failed(&poll_one(&cqa), 1, WcStatus::REM_INV_REQ_ERR);
        expect_event(&b.dev, EventKind::QP_REQ_ERROR, qb.handle());
        wait_state(&qa, QpState::ERR);
        wait_state(&qb, QpState::ERR);
        ba.assert_untouched(0, 4096, "READ or atomic refused");
        assert_eq!(bb.read(0, 64), pattern(64, 1), "responder memory changed");
    }
}

/// The first message accepted by a QP in RTR queues one `QP_COMM_EST`
/// (spec 18.22); a QP in RTR receives SENDs.
#[test]
fn comm_est_on_first_message_in_rtr() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
    qa.rc_connect(QP_ACCESS, &conn(&qb, b)).unwrap();
    let cb = conn(&qa, a);
    qb.rc_to_init(QP_ACCESS).unwrap();
    qb.rc_to_rtr(&cb).unwrap();
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, b"hello rtr");
    let sg = [ba.sge(0, 9)];
    for k in 0..2u64 {
        recv(&qb, k, &[bb.sge(0, 64)]);
        qa.post_send(&[wr(k, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&cqa), k, WcOpcode::SEND);
        ok(&poll_one(&cqb), k, WcOpcode::RECV);
        assert_eq!(bb.read(0, 9), b"hello rtr");
    }
    expect_event(&b.dev, EventKind::QP_COMM_EST, qb.handle());
    assert_no_event(&b.dev, "one QP_COMM_EST per entry into RTR");
    qb.rc_to_rts(&cb).unwrap();
    recv(&qb, 9, &[bb.sge(0, 64)]);
    qa.post_send(&[wr(9, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&cqb), 9, WcOpcode::RECV);
    assert_no_event(&b.dev, "in RTS");
}

/// The fields of successful completions (spec 18.14, table "Field values
/// of successful completions"): `src_qpn` is the sender's QP number only
/// for UD receives and 0 otherwise; requester completions carry no flag and
/// no immediate; `vendor_err` is 0.
#[test]
fn rc_completion_fields() {
    let (_d, vm) = vms(2);
    let p = rc_pair(&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(&vm[0], 4096), Buf::new(&vm[1], 4096));
    let sg = [ba.sge(0, 32)];
    let ops = [
        (SendOp::Send, WcOpcode::RECV, None),
        (SendOp::SendWithImm { imm: 5 }, WcOpcode::RECV, Some(5)),
        (
            SendOp::RdmaWriteWithImm {
                remote_addr: bb.addr(1024),
                rkey: bb.mr.rkey(),
                imm: 6,
            },
            WcOpcode::RECV_RDMA_WITH_IMM,
            Some(6),
        ),
    ];
    for (k, (op, rop, imm)) in ops.into_iter().enumerate() {
        let k = k as u64;
        recv(&p.qb, k, &[bb.sge(0, 64)]);
        p.qa.post_send(&[wr(k, op, &sg)]).unwrap();
        let s = poll_one(&p.cqa);
        assert!(s.is_success(), "{s:?}");
        assert_eq!(
            (s.flags, s.imm_data, s.src_qpn, s.vendor_err, s.byte_len),
            (0, 0, 0, 0, 32),
            "requester {s:?}"
        );
        let r = poll_one(&p.cqb);
        ok(&r, k, rop);
        assert_eq!(r.imm(), imm, "{r:?}");
        assert_eq!(r.imm_data, imm.unwrap_or(0), "{r:?}");
        assert_eq!((r.src_qpn, r.vendor_err), (0, 0), "RC receive {r:?}");
    }
}

// ---------------------------------------------------------------------------
// 7. Error completions and malformed work requests

/// Asserts that an error completion carries none of the failed message's
/// fields: `byte_len`, `flags`, `imm_data` and `src_qpn` are 0 (spec
/// 18.14).
fn assert_no_message_fields(wc: &WorkCompletion, what: &str) {
    assert_eq!(
        (wc.byte_len, wc.flags, wc.imm_data, wc.src_qpn),
        (0, 0, 0, 0),
        "{what}: {wc:?}"
    );
}

/// A solicited SEND_WITH_IMM over `sg`.
fn solicited_send_with_imm(wr_id: u64, sg: &[Sge]) -> SendWr<'_> {
    let mut w = wr(wr_id, SendOp::SendWithImm { imm: 0x1234_5678 }, sg);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    w
}

/// Error completions carry `wr_id`, `status`, `opcode` and `qpn` only;
/// `byte_len`, `flags`, `imm_data` and `src_qpn` are 0 (spec 18.14),
/// whatever the failed message carried. A solicited RC SEND_WITH_IMM one
/// byte too long for the receive buffer fails at both ends; the same UD
/// message fails at the receiver, which would otherwise report CQE_GRH and
/// the sender's QPN.
#[test]
fn error_completions_carry_no_message_fields() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    let sg = [ba.sge(0, 65)];
    // RC.
    let p = rc_pair(a, b);
    recv(&p.qb, 1, &[bb.sge(0, 64)]);
    p.qa.post_send(&[solicited_send_with_imm(2, &sg)]).unwrap();
    let s = poll_one(&p.cqa);
    failed(&s, 2, WcStatus::REM_INV_REQ_ERR);
    assert_eq!(
        (s.opcode(), s.qpn),
        (Some(WcOpcode::SEND), p.qa.qpn()),
        "{s:?}"
    );
    assert_no_message_fields(&s, "RC requester");
    let r = poll_one(&p.cqb);
    failed(&r, 1, WcStatus::LOC_LEN_ERR);
    assert_eq!(
        (r.opcode(), r.qpn),
        (Some(WcOpcode::RECV), p.qb.qpn()),
        "{r:?}"
    );
    assert_no_message_fields(&r, "RC responder");
    // UD: room for the GRH, not for the message.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (ua, ub) = (ud_qp(a, &cqa, 4), ud_qp(b, &cqb, 4));
    let ah = ah_to(a, b);
    recv(&ub, 3, &[bb.sge(1024, GRH + 64)]);
    let mut w = solicited_send_with_imm(4, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::SEND);
    let r = poll_one(&cqb);
    failed(&r, 3, WcStatus::LOC_LEN_ERR);
    assert_eq!(
        (r.opcode(), r.qpn),
        (Some(WcOpcode::RECV), ub.qpn()),
        "{r:?}"
    );
    assert_no_message_fields(&r, "UD receiver");
}

/// An RDMA READ or atomic on a QP whose `max_rd_atomic` is 0 is malformed
/// (spec 18.8): it fails with `LOC_QP_OP_ERR` before anything reaches the
/// responder; the requester goes to ERR, no event on either side, the
/// responder stays in RTS and its memory and the local buffer are
/// untouched.
#[test]
fn rd_atomic_without_max_rd_atomic_is_malformed() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    bb.write(0, &pattern(64, 2));
    let (remote_addr, rkey) = (bb.addr(0), bb.mr.rkey());
    let ops = [
        (
            SendOp::RdmaRead { remote_addr, rkey },
            64,
            WcOpcode::RDMA_READ,
        ),
        (
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            8,
            WcOpcode::FETCH_ADD,
        ),
        (
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
            8,
            WcOpcode::COMP_SWAP,
        ),
    ];
    for (op, len, wop) in ops {
        let (cqa, cqb) = (
            Cq::create(&a.dev, 16).unwrap(),
            Cq::create(&b.dev, 16).unwrap(),
        );
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut ca = conn(&qb, b);
        ca.max_rd_atomic = 0;
        qa.rc_connect(QP_ACCESS, &ca).unwrap();
        qb.rc_connect(QP_ACCESS, &conn(&qa, a)).unwrap();
        qa.post_send(&[wr(1, op, &[ba.sge(0, len)])]).unwrap();
        let wc = poll_one(&cqa);
        failed(&wc, 1, WcStatus::LOC_QP_OP_ERR);
        assert_eq!(wc.opcode(), Some(wop), "{wc:?}");
        wait_state(&qa, QpState::ERR);
        assert_state(&qb, QpState::RTS);
        ba.assert_untouched(0, 4096, "local buffer of a malformed WQE");
        assert_eq!(bb.read(0, 64), pattern(64, 2), "responder memory changed");
        assert_no_event(&a.dev, "malformed WQE (requester)");
        assert_no_event(&b.dev, "malformed WQE (responder)");
    }
}

// ---------------------------------------------------------------------------
// Queues made with raw verbs
//
// The reference driver writes only well-formed WQEs and in-range indices.
// To see what the device does with anything else, these queues are made
// with raw verbs — in the driver's context and PD, on the driver's CQs
// where that helps, so that the driver still polls their completions — and
// the tests write their rings and doorbell records themselves.

/// Ring memory of a raw queue: its 4 KiB pages in ring order and its
/// doorbell record.
struct RawRing {
    pages: Vec<GuestAddress>,
    db: GuestAddress,
}

impl RawRing {
    /// The ring of a create request with an inline page list (`tail`).
    fn new(tail: &[u8], db_gpa: u64) -> Self {
        let pages = tail
            .chunks_exact(8)
            .map(|c| GuestAddress(u64::from_le_bytes(c.try_into().unwrap())))
            .collect();
        RawRing {
            pages,
            db: GuestAddress(db_gpa),
        }
    }

    /// Guest-physical address of byte `off` of the queue buffer.
    fn at(&self, off: u64) -> GuestAddress {
        GuestAddress(self.pages[(off / 4096) as usize].0 + off % 4096)
    }

    /// Guest-physical address of byte `off` of the doorbell record.
    fn db_at(&self, off: u64) -> GuestAddress {
        GuestAddress(self.db.0 + off)
    }
}

/// A QP made with raw verbs (queue depths 16, 2 SGEs per receive WQE).
struct RawQp {
    handle: u32,
    qpn: u32,
    ring: RawRing,
    rq_offset: u64,
    rq_shift: u32,
    sq_shift: u32,
}

/// Depth of the rings of raw queues.
const RAW_DEPTH: u32 = 16;

/// A raw QP of `qp_type` in `vm`'s PD, completing into CQs `send_cq` and
/// `recv_cq` (handles), receiving through SRQ `srq` (0: its own receive
/// queue).
fn raw_qp(vm: &Vm, qp_type: QpType, send_cq: u32, recv_cq: u32, srq: u32) -> RawQp {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let mut init = RawQpInit::rc(vm.pd.handle(), send_cq);
    init.qp_type = qp_type;
    init.recv_cq = recv_cq;
    init.srq = srq;
    if srq != 0 {
        init.rq_depth = 0;
    }
    let (req, tail) = v.qp_request(&init).unwrap();
    let r = v.create_qp_raw(&req, &tail).unwrap();
    assert_eq!(r.db_slot, DB_NONE, "guest-RAM doorbell mode");
    RawQp {
        handle: r.qp_handle,
        qpn: r.qpn,
        ring: RawRing::new(&tail, req.db_gpa),
        rq_offset: u64::from(r.rq_offset),
        rq_shift: r.rq_wqe_shift,
        sq_shift: r.sq_wqe_shift,
    }
}

/// A raw CQ of `depth` entries in `vm`'s context: its handle and ring.
fn raw_cq(vm: &Vm, depth: u32) -> (u32, RawRing) {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let (req, tail) = v.cq_request(vm.dev.ctx_handle(), depth).unwrap();
    let cq = v.create_cq_raw(&req, &tail).unwrap();
    (cq, RawRing::new(&tail, req.db_gpa))
}

/// A raw SRQ of [`RAW_DEPTH`] one-SGE WQEs in `vm`'s PD: its handle and
/// ring.
fn raw_srq(vm: &Vm) -> (u32, RawRing) {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let (req, tail) = v.srq_request(vm.pd.handle(), RAW_DEPTH, 1, 0).unwrap();
    let r = v.create_srq_raw(&req, &tail).unwrap();
    assert_eq!(r.db_slot, DB_NONE, "guest-RAM doorbell mode");
    (r.srq_handle, RawRing::new(&tail, req.db_gpa))
}

/// Moves raw RC QP `q` to RTS towards QP number `dest_qpn` on `peer`.
fn raw_connect(vm: &Vm, q: &RawQp, dest_qpn: u32, peer: &Vm) {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm)
        .connect_rc(q.handle, dest_qpn, peer.dev.gid())
        .unwrap();
}

/// Moves raw UD QP `q` to RTS with [`QKEY`].
fn raw_ud_activate(vm: &Vm, q: &RawQp) {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm).activate_ud(q.handle, QKEY).unwrap();
}

/// The state of raw QP `q`.
fn raw_state(vm: &Vm, q: &RawQp) -> u32 {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm)
        .query_qp(q.handle)
        .unwrap()
        .attr
        .qp_state
}

/// Stores a 32-bit index (release) at `gpa`.
fn store_index(vm: &Vm, gpa: GuestAddress, v: u32) {
    vm.t.mem().store(gpa, v, Ordering::Release).unwrap();
}

/// Loads a 32-bit index (acquire) at `gpa`.
fn load_index(vm: &Vm, gpa: GuestAddress) -> u32 {
    vm.t.mem().load(gpa, Ordering::Acquire).unwrap()
}

/// Doorbell offsets: `rq_pi`, the device half's first word (`sq_ci` of a QP,
/// `ci` of an SRQ) and `rq_ci`.
const RQ_PI: u64 = 4;
const DEVICE_CI: u64 = virtio_rdma_abi::datapath::DB_DEVICE_OFFSET;
const RQ_CI: u64 = DEVICE_CI + 4;

/// Writes receive WQE `wqe` with `sges` into slot `index` of raw QP `q`'s
/// receive queue and posts it (`rq_pi` = `index + 1`).
fn raw_post_recv(vm: &Vm, q: &RawQp, index: u32, wqe: RecvWqe, sges: &[WireSge]) {
    let mut bytes = wqe.to_bytes();
    for s in sges {
        bytes.extend(s.to_bytes());
    }
    let slot = q.rq_offset + (u64::from(index % RAW_DEPTH) << q.rq_shift);
    vm.t.mem().write(q.ring.at(slot), &bytes).unwrap();
    store_index(vm, q.ring.db_at(RQ_PI), index + 1);
}

/// Writes send WQE `wqe` into slot `index` of raw QP `q`'s send queue,
/// posts it (`sq_pi` = `index + 1`) and notifies.
fn raw_post_send(vm: &Vm, q: &RawQp, index: u32, wqe: SendWqe) {
    let slot = u64::from(index % RAW_DEPTH) << q.sq_shift;
    vm.t.mem().write(q.ring.at(slot), &wqe.to_bytes()).unwrap();
    store_index(vm, q.ring.db, index + 1);
    vm.t.notify(NOTIFYQ).unwrap();
}

/// Sends `regions` to the back-end as its memory table (`SET_MEM_TABLE`).
fn set_mem_table(vm: &Vm, regions: &[VhostUserMemoryRegionInfo]) {
    vm.t.vmm()
        .vhost_call("SET_MEM_TABLE", |fe| fe.set_mem_table(regions))
        .unwrap();
}

/// Takes the 4 KiB page at `page` out of the memory table the back-end
/// sees — as a VMM that unplugs memory — so that whatever the device keeps
/// there becomes unusable; the rest of guest RAM stays where it was. The
/// guest itself keeps its mapping.
fn unmap_page(vm: &Vm, page: GuestAddress) {
    let mut regions = vm.t.mem().region_infos().unwrap();
    let i = regions
        .iter()
        .position(|r| (r.guest_phys_addr..r.guest_phys_addr + r.memory_size).contains(&page.0))
        .unwrap();
    let r = regions.remove(i);
    let (start, end, cut) = (
        r.guest_phys_addr,
        r.guest_phys_addr + r.memory_size,
        page.0 + 4096,
    );
    if page.0 > start {
        regions.push(VhostUserMemoryRegionInfo {
            memory_size: page.0 - start,
            ..r
        });
    }
    if cut < end {
        let skip = cut - start;
        regions.push(VhostUserMemoryRegionInfo {
            guest_phys_addr: cut,
            memory_size: end - cut,
            userspace_addr: r.userspace_addr + skip,
            mmap_offset: r.mmap_offset + skip,
            ..r
        });
    }
    // The back-end wants them in address order.
    regions.sort_by_key(|r| r.guest_phys_addr);
    set_mem_table(vm, &regions);
}

/// Gives the back-end the whole of guest RAM again.
fn restore_mem(vm: &Vm) {
    set_mem_table(vm, &vm.t.mem().region_infos().unwrap());
}

/// A signaled send WQE with an opcode that does not exist: malformed.
fn bad_opcode_wqe(wr_id: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: 0x7f,
        flags: WQE_SIGNALED,
        ..SendWqe::default()
    }
}

// ---------------------------------------------------------------------------
// 8. Unusable and broken queues

/// A CQ whose ring or doorbell record guest RAM no longer maps (the VMM took
/// the page out of its memory table) is treated like an overflow (spec
/// 18.17, 18.18): the completion is lost, the CQ gets `CQ_ERROR` and every
/// QP using it — as send CQ or as receive CQ — `QP_FATAL`, and those QPs
/// are in ERR. A QP's own unusable send ring or doorbell record fails that
/// QP alone with `QP_FATAL`, without a completion. The VM's other queues
/// keep working.
#[test]
fn unusable_cq_memory_is_a_cq_error() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other = Cq::create(&a.dev, 16).unwrap();
    for what in ["CQ ring", "CQ doorbell record"] {
        let (cq, ring) = raw_cq(a, 16);
        // q1 completes its sends into the CQ, q2 its receives.
        let q1 = raw_qp(a, QpType::RC, cq, other.handle(), 0);
        let q2 = raw_qp(a, QpType::RC, other.handle(), cq, 0);
        raw_connect(a, &q1, q2.qpn, a);
        raw_connect(a, &q2, q1.qpn, a);
        let page = if what == "CQ ring" {
            ring.pages[0]
        } else {
            GuestAddress(ring.db.0 & !4095)
        };
        unmap_page(a, page);
        // q1's malformed WQE needs an error completion in the CQ.
        raw_post_send(a, &q1, 0, bad_opcode_wqe(7));
        let evs = collect_events(&a.dev, 3);
        restore_mem(a);
        assert_eq!(
            evs,
            sorted(vec![
                (Some(EventKind::CQ_ERROR), cq),
                (Some(EventKind::QP_FATAL), q1.handle),
                (Some(EventKind::QP_FATAL), q2.handle),
            ]),
            "{what}"
        );
        assert_eq!(raw_state(a, &q1), u32::from(QpState::ERR), "{what}");
        assert_eq!(raw_state(a, &q2), u32::from(QpState::ERR), "{what}");
        assert_quiet(&other);
    }
    // A QP's doorbell record: the device can no longer read its producer
    // indices, so the QP fails with QP_FATAL without anything posted.
    let q = raw_qp(a, QpType::RC, other.handle(), other.handle(), 0);
    raw_connect(a, &q, q.qpn, a);
    unmap_page(a, GuestAddress(q.ring.db.0 & !4095));
    expect_event(&a.dev, EventKind::QP_FATAL, q.handle);
    assert_eq!(raw_state(a, &q), u32::from(QpState::ERR));
    assert_quiet(&other);
    restore_mem(a);
    assert_no_event(&a.dev, "after the doorbell record came back");
    // A QP's send ring.
    let q = raw_qp(a, QpType::RC, other.handle(), other.handle(), 0);
    raw_connect(a, &q, q.qpn, a);
    unmap_page(a, q.ring.pages[0]);
    let send = SendWqe {
        opcode: WrOpcode::SEND as u8,
        ..bad_opcode_wqe(8)
    };
    raw_post_send(a, &q, 0, send);
    expect_event(&a.dev, EventKind::QP_FATAL, q.handle);
    assert_eq!(raw_state(a, &q), u32::from(QpState::ERR));
    assert_quiet(&other);
    restore_mem(a);
    assert_no_event(&a.dev, "after the send ring came back");
    // The VM's other queues still work.
    let p = rc_pair(a, b);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, b"still fine");
    p.qa.post_send(&[wr(1, write_op(&bb, 0), &[ba.sge(0, 10)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(0, 10), b"still fine");
}

/// A malformed receive WQE at the responder (spec 18.13: `reserved` not
/// zero, or more SGEs than `max_recv_sge`) is consumed and completes with
/// `LOC_QP_OP_ERR`, carrying no message fields; the RC requester fails with
/// `REM_OP_ERR`; both QPs go to ERR; no event (spec 18.18). The WQE is
/// checked before any byte is written, so an RDMA_WRITE_WITH_IMM writes
/// nothing. A UD receiver fails the same way while its sender succeeds.
#[test]
fn malformed_receive_wqe_completes_with_loc_qp_op_err() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    ba.write(0, &pattern(64, 3));
    let sge = WireSge {
        addr: bb.addr(0),
        length: 1024,
        lkey: bb.mr.lkey(),
    };
    let cases = [
        (
            "reserved not zero",
            RecvWqe {
                wr_id: 77,
                num_sge: 1,
                reserved: 1,
            },
        ),
        (
            "num_sge above max_recv_sge",
            RecvWqe {
                wr_id: 77,
                num_sge: 3,
                reserved: 0,
            },
        ),
    ];
    let sg = [ba.sge(0, 64)];
    for (what, wqe) in cases {
        let sges = vec![sge; wqe.num_sge as usize];
        let write_with_imm = SendOp::RdmaWriteWithImm {
            remote_addr: bb.addr(2048),
            rkey: bb.mr.rkey(),
            imm: 5,
        };
        for op in [SendOp::Send, write_with_imm] {
            let (cqa, cqb) = (
                Cq::create(&a.dev, 16).unwrap(),
                Cq::create(&b.dev, 16).unwrap(),
            );
            let qa = rc_qp(a, &cqa);
            let qb = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), 0);
            qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
            raw_connect(b, &qb, qa.qpn(), a);
            raw_post_recv(b, &qb, 0, wqe, &sges);
            qa.post_send(&[wr(1, op, &sg)]).unwrap();
            failed(&poll_one(&cqa), 1, WcStatus::REM_OP_ERR);
            let r = poll_one(&cqb);
            failed(&r, 77, WcStatus::LOC_QP_OP_ERR);
            assert_eq!((r.opcode(), r.qpn), (Some(WcOpcode::RECV), qb.qpn), "{r:?}");
            assert_no_message_fields(&r, what);
            wait_state(&qa, QpState::ERR);
            assert_eq!(raw_state(b, &qb), u32::from(QpState::ERR), "{what}");
            assert_eq!(load_index(b, qb.ring.db_at(RQ_CI)), 1, "{what}: consumed");
            bb.assert_untouched(0, 4096, what);
            assert_no_event(&a.dev, what);
            assert_no_event(&b.dev, what);
        }
    }
    // UD.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let ua = ud_qp(a, &cqa, 4);
    let ub = raw_qp(b, QpType::UD, cqb.handle(), cqb.handle(), 0);
    raw_ud_activate(b, &ub);
    raw_post_recv(b, &ub, 0, cases[0].1, &[sge]);
    let ah = ah_to(a, b);
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn,
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    let r = poll_one(&cqb);
    failed(&r, 77, WcStatus::LOC_QP_OP_ERR);
    assert_no_message_fields(&r, "UD");
    assert_eq!(raw_state(b, &ub), u32::from(QpState::ERR));
    assert_state(&ua, QpState::RTS);
    bb.assert_untouched(0, 4096, "UD");
    assert_no_event(&a.dev, "UD sender");
    assert_no_event(&b.dev, "UD receiver");
}

/// A receive queue whose producer index is out of range (`rq_pi - rq_ci`
/// above the depth) is broken (spec 18.18): the responder QP goes to ERR
/// with `QP_FATAL`, consumes nothing and writes no completion. It is
/// unreachable from then on: an RC requester retries and fails with
/// `RETRY_EXC_ERR`, a UD sender's message is dropped.
#[test]
fn receive_queue_out_of_range_is_fatal() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::new(a, 4096);
    let sg = [ba.sge(0, 64)];
    // RC.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let qa = rc_qp(a, &cqa);
    let qb = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), 0);
    qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
    raw_connect(b, &qb, qa.qpn(), a);
    store_index(b, qb.ring.db_at(RQ_PI), RAW_DEPTH + 1);
    qa.post_send(&[wr(1, SendOp::Send, &sg)]).unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RETRY_EXC_ERR);
    expect_event(&b.dev, EventKind::QP_FATAL, qb.handle);
    assert_eq!(raw_state(b, &qb), u32::from(QpState::ERR));
    assert_eq!(load_index(b, qb.ring.db_at(RQ_CI)), 0, "nothing consumed");
    assert_quiet(&cqb);
    assert_no_event(&a.dev, "RC requester");
    // UD.
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let ua = ud_qp(a, &cqa, 4);
    let ub = raw_qp(b, QpType::UD, cqb.handle(), cqb.handle(), 0);
    raw_ud_activate(b, &ub);
    store_index(b, ub.ring.db_at(RQ_PI), RAW_DEPTH + 1);
    let ah = ah_to(a, b);
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: ub.qpn,
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    expect_event(&b.dev, EventKind::QP_FATAL, ub.handle);
    assert_eq!(raw_state(b, &ub), u32::from(QpState::ERR));
    assert_quiet(&cqb);
    assert_no_event(&a.dev, "UD sender");
}

/// An SRQ whose producer index is out of range fails (spec 18.21): one
/// `SRQ_ERROR`, and every attached QP goes to ERR with `QP_FATAL` (and, as
/// any QP with an SRQ that enters ERR, `QP_LAST_WQE_REACHED`); nothing is
/// consumed or completed, and the requester finds the responder
/// unreachable.
#[test]
fn srq_out_of_range_fails_every_attached_qp() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let (srq, srq_ring) = raw_srq(b);
    let (cqa, cqb) = (
        Cq::create(&a.dev, 16).unwrap(),
        Cq::create(&b.dev, 16).unwrap(),
    );
    let (qa1, qa2) = (rc_qp(a, &cqa), rc_qp(a, &cqa));
    let qb1 = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), srq);
    let qb2 = raw_qp(b, QpType::RC, cqb.handle(), cqb.handle(), srq);
    for (qa, qb) in [(&qa1, &qb1), (&qa2, &qb2)] {
        qa.rc_connect(QP_ACCESS, &conn_qpn(qb.qpn, b)).unwrap();
        raw_connect(b, qb, qa.qpn(), a);
    }
    store_index(b, srq_ring.db, RAW_DEPTH + 1);
    let ba = Buf::new(a, 4096);
    qa1.post_send(&[wr(1, SendOp::Send, &[ba.sge(0, 64)])])
        .unwrap();
    failed(&poll_one(&cqa), 1, WcStatus::RETRY_EXC_ERR);
    let evs = collect_events(&b.dev, 5);
    assert_eq!(
        evs,
        sorted(vec![
            (Some(EventKind::SRQ_ERROR), srq),
            (Some(EventKind::QP_FATAL), qb1.handle),
            (Some(EventKind::QP_FATAL), qb2.handle),
            (Some(EventKind::QP_LAST_WQE_REACHED), qb1.handle),
            (Some(EventKind::QP_LAST_WQE_REACHED), qb2.handle),
        ])
    );
    assert_eq!(raw_state(b, &qb1), u32::from(QpState::ERR));
    assert_eq!(raw_state(b, &qb2), u32::from(QpState::ERR));
    assert_eq!(
        load_index(b, srq_ring.db_at(DEVICE_CI)),
        0,
        "nothing consumed"
    );
    assert_quiet(&cqb);
    assert_state(&qa2, QpState::RTS);
    assert_no_event(&a.dev, "requester VM");
}

// ---------------------------------------------------------------------------
// 9. Transport and RNR retries

/// The local ACK timeout of `timeout` (spec 18.20): 4.096 µs × 2^timeout.
fn ack_timeout(timeout: u32) -> Duration {
    Duration::from_nanos(4096 << timeout)
}

/// An RC QP whose destination is unreachable (spec 18.20, 18.23) — its peer
/// QP was destroyed, or no QP has its `dest_qpn` — tries, waits the local
/// ACK timeout, retries `retry_cnt` times, and fails with `RETRY_EXC_ERR`
/// when the timeout after the last retry expires, as an InfiniBand
/// requester that gets no answer: (retry_cnt + 1) × 4.096 µs × 2^timeout
/// after posting. The QP goes to ERR and flushes the WQE behind; no event.
/// Short timeouts are not stretched by the engine parking between retries.
#[test]
fn rc_unreachable_destination_retries_then_fails() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::new(a, 4096);
    let sg = [ba.sge(0, 16)];
    let cases = [
        ("peer QP destroyed", 12, 3),
        ("no such QP number", 11, 2),
        ("short timeout, many retries", 8, 7),
    ];
    for (what, timeout, retry_cnt) in cases {
        let cqa = Cq::create(&a.dev, 16).unwrap();
        let qa = rc_qp(a, &cqa);
        let dest = if what == "no such QP number" {
            // QP numbers 0 and 1 are never assigned (spec 12.12).
            1
        } else {
            let cqb = Cq::create(&b.dev, 16).unwrap();
            let qb = rc_qp(b, &cqb);
            let n = qb.qpn();
            qb.destroy().unwrap();
            n
        };
        let mut c = conn_qpn(dest, b);
        c.timeout = timeout;
        c.retry_cnt = retry_cnt;
        qa.rc_connect(QP_ACCESS, &c).unwrap();
        let start = Instant::now();
        qa.post_send(&[wr(1, SendOp::Send, &sg), wr(2, SendOp::Send, &sg)])
            .unwrap();
        let wc = poll_one(&cqa);
        let took = start.elapsed();
        failed(&wc, 1, WcStatus::RETRY_EXC_ERR);
        let least = ack_timeout(timeout) * (retry_cnt + 1);
        assert!(
            took >= least,
            "{what}: failed after {took:?}, before {least:?}"
        );
        // Parking sleeps up to 50 ms at a time; the timers cut it short
        // (8 waits not cut short would take 400 ms more; the margin is for
        // a loaded machine).
        let most = least + Duration::from_millis(300);
        assert!(
            took < most,
            "{what}: failed after {took:?}, expected {least:?}"
        );
        failed(&poll_one(&cqa), 2, WcStatus::WR_FLUSH_ERR);
        assert_state(&qa, QpState::ERR);
        assert_no_event(&a.dev, what);
    }
}

/// A message retried because its destination was unreachable is delivered
/// — once, and before the WQE behind it — when the destination becomes
/// reachable before the retries run out (spec 18.20: here the peer QP
/// reaches RTR). Meanwhile the waiting QP holds up no other QP. `timeout` 0
/// retries without limit.
#[test]
fn rc_retry_delivers_once_the_peer_is_ready() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let other = rc_pair(a, b);
    let (ba, bb) = (Buf::new(a, 4096), Buf::new(b, 4096));
    // (timeout, retry_cnt, how long the peer stays unreachable)
    for (timeout, retry_cnt, unready) in [(16, 7, 150), (0, 0, 400)] {
        let (cqa, cqb) = (
            Cq::create(&a.dev, 16).unwrap(),
            Cq::create(&b.dev, 16).unwrap(),
        );
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut c = conn(&qb, b);
        c.timeout = timeout;
        c.retry_cnt = retry_cnt;
        qa.rc_connect(QP_ACCESS, &c).unwrap();
        // In INIT the peer accepts nothing: unreachable.
        qb.rc_to_init(QP_ACCESS).unwrap();
        let data = pattern(32, 40 + u64::from(timeout));
        ba.write(0, &data);
        qa.post_send(&[
            wr(1, SendOp::Send, &[ba.sge(0, 16)]),
            wr(2, SendOp::Send, &[ba.sge(16, 16)]),
        ])
        .unwrap();
        // Another QP pair of the same VMs keeps going.
        let until = Instant::now() + Duration::from_millis(unready);
        let mut k = 0u64;
        while Instant::now() < until {
            k += 1;
            other
                .qa
                .post_send(&[wr(k, write_op(&bb, 3000), &[ba.sge(100, 8)])])
                .unwrap();
            ok(&poll_one(&other.cqa), k, WcOpcode::RDMA_WRITE);
        }
        assert!(k > 3, "timeout {timeout}: only {k} WRITEs on the other QP");
        assert_quiet(&cqa);
        recv(&qb, 11, &[bb.sge(0, 64)]);
        recv(&qb, 12, &[bb.sge(64, 64)]);
        qb.rc_to_rtr(&conn(&qa, a)).unwrap();
        let s = poll_n(&cqa, 2);
        ok(&s[0], 1, WcOpcode::SEND);
        ok(&s[1], 2, WcOpcode::SEND);
        let r = poll_n(&cqb, 2);
        ok(&r[0], 11, WcOpcode::RECV);
        ok(&r[1], 12, WcOpcode::RECV);
        assert_eq!(bb.read(0, 16), data[..16]);
        assert_eq!(bb.read(64, 16), data[16..]);
        assert_quiet(&cqb);
        assert_state(&qa, QpState::RTS);
    }
}

/// The RNR wait is the interval that the *responder* QP's `min_rnr_timer`
/// selects (spec 18.20), not the requester's own: a requester whose
/// `min_rnr_timer` is 0 (655.36 ms) gives up after three waits of the
/// responder's 0.01 ms; one whose value is 1 waits the responder's 5.12 ms
/// three times.
#[test]
fn rnr_wait_uses_the_responders_min_rnr_timer() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let ba = Buf::new(a, 4096);
    // (requester's min_rnr_timer, responder's, least and most time in ms;
    // three of the requester's own waits would take 1966 ms and 0.03 ms)
    let cases = [(0, 1, 0, 1000), (1, 18, 15, 1000)];
    for (mine, theirs, least, most) in cases {
        let (cqa, cqb) = (
            Cq::create(&a.dev, 16).unwrap(),
            Cq::create(&b.dev, 16).unwrap(),
        );
        let (qa, qb) = (rc_qp(a, &cqa), rc_qp(b, &cqb));
        let mut ca = conn(&qb, b);
        ca.min_rnr_timer = mine;
        ca.rnr_retry = 3;
        qa.rc_connect(QP_ACCESS, &ca).unwrap();
        let mut cb = conn(&qa, a);
        cb.min_rnr_timer = theirs;
        qb.rc_connect(QP_ACCESS, &cb).unwrap();
        let start = Instant::now();
        qa.post_send(&[wr(1, SendOp::Send, &[ba.sge(0, 8)])])
            .unwrap();
        failed(&poll_one(&cqa), 1, WcStatus::RNR_RETRY_EXC_ERR);
        let took = start.elapsed();
        let what = format!("min_rnr_timer {mine} here, {theirs} at the responder");
        assert!(took >= Duration::from_millis(least), "{what}: {took:?}");
        assert!(took < Duration::from_millis(most), "{what}: {took:?}");
        assert_state(&qb, QpState::RTS);
    }
}
