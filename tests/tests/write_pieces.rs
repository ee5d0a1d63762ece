#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Large messages executed in pieces (`engine::PIECE`) while another VM
//! has work, end to end through the real daemon and the reference driver
//! — SENDs, READs and WRITEs with immediate as well as plain WRITEs. For
//! the plain WRITEs:
//! the data lands intact and in order, the requester completes after the
//! last piece only, an MR deregistered between pieces fails the WRITE with
//! `REM_ACCESS_ERR` without touching anything outside the range, a QP moved
//! to ERR mid-WRITE flushes it, one moved to SQD finishes it before it
//! reports the drain (as does a SEND waiting for RNR retries), and a VM
//! alone runs its WRITEs whole.
//!
//! Pieces are made observable with a rate limit on the writer: its bytes
//! bucket holds it back between two pieces, and its `send_bytes` counter
//! grows piece by piece. "Another VM has work" is a third VM whose SEND
//! waits for RNR retries without end: its send queue is never empty.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma::rnic::soft::{ALONE_PIECE, PIECE};
use vhost_user_rdma::stats::TrafficStats;
use vhost_user_rdma_tests::dp::{
    assert_untouched, conn, cq_pair, next_event, ok, open, pattern, poll_n, rc_pair, rc_qp,
    wait_state, wr, Buf, Pair, Vm, GUARD, QP_ACCESS, WAIT,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, DmaBuf, Mr, Qp, SendOp};

const PAGE: usize = 4096;

fn traffic(d: &TestDaemon, vm: usize) -> TrafficStats {
    d.daemon().tenancy().traffic(vm).unwrap().snapshot()
}

/// Weight 1 (pieces of `PIECE` bytes) and a bytes limit.
fn slow(bytes_per_sec: u64) -> QosSpec {
    QosSpec {
        weight: 1,
        bytes_per_sec,
        ..QosSpec::default()
    }
}

/// Keeps VM `c` busy for the engine: an RC SEND to a QP on `b` that never
/// posts a receive, retried after RNR without end, every 10 us. Keep the
/// result alive.
struct Busy {
    _cqs: (Arc<Cq>, Arc<Cq>),
    _qps: (Qp, Qp),
    _buf: Buf,
}

fn busy(c: &Vm, b: &Vm) -> Busy {
    let (cqc, cqb) = cq_pair(c, b);
    let (qc, qb) = (rc_qp(c, &cqc), rc_qp(b, &cqb));
    let mut cc = conn(&qb, b);
    cc.rnr_retry = 7;
    qc.rc_connect(QP_ACCESS, &cc).unwrap();
    let mut cb = conn(&qc, c);
    // 10 us between tries: a QP waiting for a retry is work only when the
    // retry is due, and the engine must see VM `c` at work every few
    // hundred sweeps to keep splitting.
    cb.min_rnr_timer = 1;
    qb.rc_connect(QP_ACCESS, &cb).unwrap();
    let buf = Buf::new(c, 64);
    let sg = [buf.sge(0, 64)];
    qc.post_send(&[wr(99, SendOp::Send, &sg)]).unwrap();
    Busy {
        _cqs: (cqc, cqb),
        _qps: (qc, qb),
        _buf: buf,
    }
}

/// VMs 0, 1 and 2 of `d`, VM 2 kept busy ([`busy`]) and an RC pair between
/// VMs 0 and 1: a large message between them runs in pieces.
fn pair_next_to_busy(d: &TestDaemon) -> (Vm, Vm, Vm, Busy, Pair) {
    let (a, b, c) = (open(d, 0), open(d, 1), open(d, 2));
    let busy = busy(&c, &b);
    let p = rc_pair(&a, &b);
    (a, b, c, busy, p)
}

/// `len + 2 pages` bytes on `vm` filled with [`GUARD`], with an MR over the
/// `len` bytes after the first page only.
fn guarded(vm: &Vm, len: usize) -> (Arc<DmaBuf>, Mr) {
    let buf = Arc::new(vm.dev.alloc_dma(len + 2 * PAGE, 8).unwrap());
    buf.fill(0, len + 2 * PAGE, GUARD).unwrap();
    let mr = Mr::register_range(&vm.pd, buf.clone(), PAGE, len, access::ALL).unwrap();
    (buf, mr)
}

fn post_write(p: &Pair, id: u64, src: &Buf, len: usize, mr: &Mr) {
    let sg = [src.sge(0, len)];
    let op = SendOp::RdmaWrite {
        remote_addr: mr.iova(),
        rkey: mr.rkey(),
    };
    p.qa.post_send(&[wr(id, op, &sg)]).unwrap();
}

/// Waits until VM `vm` has moved at least `bytes`; returns what it moved.
fn wait_bytes(d: &TestDaemon, vm: usize, bytes: u64) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = traffic(d, vm).send_bytes;
        if s >= bytes {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "VM {vm} moved {s} of {bytes} bytes"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A 1 MiB WRITE next to a busy VM runs in pieces (the writer's counter is
/// seen between 0 and 1 MiB with no completion yet), lands intact between
/// untouched guard pages, completes once, and a small WRITE posted after it
/// completes after it.
#[test]
fn large_write_in_pieces_lands_intact_and_in_order() {
    const LEN: usize = 1 << 20;
    let d = TestDaemon::start(3).unwrap();
    let (a, b, _c, _busy, p) = pair_next_to_busy(&d);
    let src = Buf::new(&a, LEN);
    let data = pattern(LEN, 7);
    src.write(0, &data);
    let (dst, mr) = guarded(&b, LEN);
    let (small, small_mr) = guarded(&b, 64);
    // About 100 ms for the 1 MiB: each piece waits for its tokens.
    d.set_vm_qos(0, slow(10 << 20)).unwrap();

    post_write(&p, 1, &src, LEN, &mr);
    post_write(&p, 2, &src, 64, &small_mr);
    let mut seen_partial = false;
    let mut wcs = Vec::new();
    let deadline = Instant::now() + WAIT;
    while wcs.len() < 2 {
        let moved = traffic(&d, 0).send_bytes;
        let mut got = [virtio_rdma_driver::WorkCompletion::default(); 2];
        let n = p.cqa.poll(&mut got);
        if moved > 0 && moved < LEN as u64 && wcs.is_empty() {
            // Part of the WRITE is done and it has not completed (the
            // completion, polled after the counter was read, may only come
            // from a later piece if it is there).
            seen_partial = true;
            assert_eq!(moved % PIECE, 0, "pieces of {PIECE} bytes: {moved}");
        }
        wcs.extend_from_slice(&got[..n]);
        assert!(Instant::now() < deadline, "{} completions", wcs.len());
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(seen_partial, "the 1 MiB WRITE was never seen in pieces");
    ok(&wcs[0], 1, WcOpcode::RDMA_WRITE);
    ok(&wcs[1], 2, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.to_vec(PAGE, LEN).unwrap(), data, "the WRITE's data");
    assert_untouched(&dst, 0, PAGE, "guard before");
    assert_untouched(&dst, PAGE + LEN, PAGE, "guard after");
    assert_eq!(small.to_vec(PAGE, 64).unwrap(), data[..64]);
    let s = traffic(&d, 0);
    assert_eq!((s.send_ops, s.send_bytes), (2, LEN as u64 + 64));
    assert_eq!(s.error_cqes + s.flushed, 0);
    let r = traffic(&d, 1);
    assert_eq!((r.recv_ops, r.recv_bytes), (2, LEN as u64 + 64));
    drop(mr);
}

/// Without another VM at work, the same WRITE runs in large pieces of
/// `ALONE_PIECE` (bounded even then, so that a guest cannot wait for the
/// others to pause and then hold the engine for a whole huge message): the
/// writer's counter moves in steps of `ALONE_PIECE`, not of the burst.
#[test]
fn large_write_alone_runs_in_large_pieces() {
    const LEN: usize = 1 << 20;
    let d = TestDaemon::start(2).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let p = rc_pair(&a, &b);
    let src = Buf::new(&a, LEN);
    let data = pattern(LEN, 8);
    src.write(0, &data);
    let (dst, mr) = guarded(&b, LEN);
    d.set_vm_qos(0, slow(10 << 20)).unwrap();
    post_write(&p, 1, &src, LEN, &mr);
    let deadline = Instant::now() + WAIT;
    let mut seen_partial = false;
    loop {
        let moved = traffic(&d, 0).send_bytes;
        assert_eq!(moved % ALONE_PIECE, 0, "moved {moved}");
        seen_partial |= moved > 0 && moved < LEN as u64;
        if moved == LEN as u64 {
            assert!(seen_partial, "never seen between pieces");
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_micros(100));
    }
    ok(&poll_n(&p.cqa, 1)[0], 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.to_vec(PAGE, LEN).unwrap(), data);
}

/// The first piece of a [`MidWrite`] landed in `dst`, and nothing after
/// it in the range.
fn assert_only_first_piece(dst: &DmaBuf, data: &[u8]) {
    let piece = PIECE as usize;
    assert_eq!(dst.to_vec(PAGE, piece).unwrap(), data[..piece]);
    assert_untouched(dst, PAGE + piece, MID_LEN - piece, "after the first piece");
}

/// Length of the WRITE that [`MidWrite`] holds after its first piece.
const MID_LEN: usize = 256 << 10;

/// A `MID_LEN`-byte RDMA WRITE (id 1) from VM 0 into a guarded MR of VM 1,
/// held after its first piece: VM 2 keeps the engine splitting, and VM 0's
/// bytes limit (16 KiB/s) holds the writer for about a second.
struct MidWrite {
    p: Pair,
    src: Buf,
    data: Vec<u8>,
    dst: Arc<DmaBuf>,
    mr: Mr,
    _busy: Busy,
    a: Vm,
    b: Vm,
    _c: Vm,
    d: TestDaemon,
}

impl MidWrite {
    /// Sets it up with data pattern `seed`; `then_small` also posts a
    /// 64-byte WRITE (id 2) behind it.
    fn start(seed: u64, then_small: bool) -> MidWrite {
        let d = TestDaemon::start(3).unwrap();
        let (a, b, c, busy, p) = pair_next_to_busy(&d);
        let src = Buf::new(&a, MID_LEN);
        let data = pattern(MID_LEN, seed);
        src.write(0, &data);
        let (dst, mr) = guarded(&b, MID_LEN);
        d.set_vm_qos(0, slow(16 << 10)).unwrap();
        post_write(&p, 1, &src, MID_LEN, &mr);
        if then_small {
            post_write(&p, 2, &src, 64, &mr);
        }
        assert_eq!(wait_bytes(&d, 0, 1), PIECE, "one piece");
        MidWrite {
            p,
            src,
            data,
            dst,
            mr,
            _busy: busy,
            a,
            b,
            _c: c,
            d,
        }
    }
}

/// The responder deregisters the target MR after the first piece: the next
/// piece finds no MR, the WRITE fails with `REM_ACCESS_ERR` (both QPs go to
/// ERR), and only the first piece's bytes were written — nothing after it
/// and nothing outside the range.
#[test]
fn mr_deregistered_between_pieces_fails_the_write() {
    let w = MidWrite::start(9, false);
    let mut none = [virtio_rdma_driver::WorkCompletion::default(); 1];
    assert_eq!(w.p.cqa.poll(&mut none), 0, "completed after one piece");
    w.mr.destroy().unwrap();
    w.d.set_vm_qos(0, QosSpec::default()).unwrap();

    let wc = poll_n(&w.p.cqa, 1);
    assert_eq!(wc[0].wr_id, 1);
    assert_eq!(
        wc[0].status(),
        Some(WcStatus::REM_ACCESS_ERR),
        "{:?}",
        wc[0]
    );
    wait_state(&w.p.qa, QpState::ERR);
    wait_state(&w.p.qb, QpState::ERR);
    assert_only_first_piece(&w.dst, &w.data);
    assert_untouched(&w.dst, 0, PAGE, "guard before");
    assert_untouched(&w.dst, PAGE + MID_LEN, PAGE, "guard after");
    let s = traffic(&w.d, 0);
    assert_eq!((s.send_ops, s.send_bytes, s.error_cqes), (1, PIECE, 1));
    assert_eq!(traffic(&w.d, 1).recv_ops, 0);
}

/// The writer's QP is moved to ERR after the first piece: the WRITE and the
/// one behind it complete with `WR_FLUSH_ERR`, and nothing more is written.
#[test]
fn qp_moved_to_err_mid_write_flushes_it() {
    let w = MidWrite::start(10, true);
    w.p.qa.to_error().unwrap();
    w.d.set_vm_qos(0, QosSpec::default()).unwrap();

    let wcs = poll_n(&w.p.cqa, 2);
    for (wc, id) in wcs.iter().zip([1, 2]) {
        assert_eq!(wc.wr_id, id);
        assert_eq!(wc.status(), Some(WcStatus::WR_FLUSH_ERR), "{wc:?}");
    }
    assert_only_first_piece(&w.dst, &w.data);
    let s = traffic(&w.d, 0);
    assert_eq!((s.send_ops, s.send_bytes, s.flushed), (0, PIECE, 2));
    // The responder took no message and is still usable.
    assert_eq!(traffic(&w.d, 1).recv_ops, 0);
    assert_eq!(
        w.p.qb.query().unwrap().attr.qp_state,
        u32::from(QpState::RTS)
    );
}

/// The writer's QP is reset after the first piece and connected again: the
/// partly written WRITE is abandoned with the queue (nothing more of it is
/// written and it never completes), and a new WRITE runs normally.
#[test]
fn qp_reset_mid_write_abandons_it() {
    let w = MidWrite::start(11, false);
    let (small, small_mr) = guarded(&w.b, 64);
    w.p.qa.to_reset().unwrap();
    w.p.qa.rc_connect(QP_ACCESS, &conn(&w.p.qb, &w.b)).unwrap();
    w.d.set_vm_qos(0, QosSpec::default()).unwrap();
    post_write(&w.p, 2, &w.src, 64, &small_mr);

    let wc = poll_n(&w.p.cqa, 1);
    ok(&wc[0], 2, WcOpcode::RDMA_WRITE);
    assert_eq!(small.to_vec(PAGE, 64).unwrap(), w.data[..64]);
    assert_only_first_piece(&w.dst, &w.data);
    let s = traffic(&w.d, 0);
    assert_eq!((s.send_ops, s.send_bytes), (1, PIECE + 64));
}

/// RTS → SQD with `en_sqd_async_notify`.
fn to_sqd(qp: &Qp) {
    qp.modify(&virtio_rdma_driver::QpAttrs {
        state: Some(QpState::SQD),
        en_sqd_async_notify: Some(true),
        ..Default::default()
    })
    .unwrap();
}

/// A QP moved to SQD after the first piece of a WRITE (spec 13.3, 18.22):
/// the started WRITE still completes, whole and successful; the WQE behind
/// it is not started; `sq_draining` reads 1 until then, and
/// `QP_SQ_DRAINED` comes only after the WRITE's completion. Back in RTS,
/// the next WQE runs.
#[test]
fn sqd_mid_write_finishes_it_then_reports_drained() {
    use virtio_rdma_abi::event::EventKind;
    let w = MidWrite::start(12, true);
    let (d, a, p) = (&w.d, &w.a, &w.p);

    to_sqd(&p.qa);
    let q = p.qa.query().unwrap();
    assert_eq!(q.attr.qp_state, u32::from(QpState::SQD));
    assert_eq!(q.attr.sq_draining, 1, "the WRITE is in flight");
    assert!(
        next_event(&a.dev, Duration::from_millis(50)).is_none(),
        "drained while a WRITE was in flight"
    );

    d.set_vm_qos(0, QosSpec::default()).unwrap();
    ok(&poll_n(&p.cqa, 1)[0], 1, WcOpcode::RDMA_WRITE);
    assert_eq!(w.dst.to_vec(PAGE, MID_LEN).unwrap(), w.data);
    let ev = next_event(&a.dev, WAIT).expect("QP_SQ_DRAINED");
    assert_eq!(EventKind::from_u32(ev.kind), Some(EventKind::QP_SQ_DRAINED));
    assert_eq!(ev.handle, p.qa.handle());
    assert_eq!(p.qa.query().unwrap().attr.sq_draining, 0);
    // The second WRITE was not started in SQD.
    let mut wc = [virtio_rdma_driver::WorkCompletion::default(); 2];
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(p.cqa.poll(&mut wc), 0, "a WQE was started in SQD");
    assert_eq!(traffic(d, 0).send_ops, 1);

    p.qa.modify(&virtio_rdma_driver::QpAttrs::state(QpState::RTS))
        .unwrap();
    ok(&poll_n(&p.cqa, 1)[0], 2, WcOpcode::RDMA_WRITE);
    assert!(next_event(&a.dev, Duration::from_millis(20)).is_none());
}

/// A SEND waiting for RNR retries when its QP moves to SQD is still
/// retried: once the responder posts a receive it completes, and only then
/// is `QP_SQ_DRAINED` reported. Moving to SQD with nothing in flight
/// reports it at once.
#[test]
fn sqd_with_a_send_waiting_for_rnr_retries_drains_once_it_is_taken() {
    use virtio_rdma_abi::event::EventKind;
    use virtio_rdma_driver::RecvWr;
    let d = TestDaemon::start(2).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (cqa, cqb) = cq_pair(&a, &b);
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
    let mut ca = conn(&qb, &b);
    ca.rnr_retry = 7;
    qa.rc_connect(QP_ACCESS, &ca).unwrap();
    let mut cb = conn(&qa, &a);
    cb.min_rnr_timer = 1; // 0.01 ms between tries
    qb.rc_connect(QP_ACCESS, &cb).unwrap();
    let (sbuf, rbuf) = (Buf::new(&a, 64), Buf::new(&b, 64));
    sbuf.write(0, b"sent before SQD");
    qa.post_send(&[wr(5, SendOp::Send, &[sbuf.sge(0, 15)])])
        .unwrap();
    // Let it meet the empty receive queue at least once.
    std::thread::sleep(Duration::from_millis(20));

    to_sqd(&qa);
    assert_eq!(qa.query().unwrap().attr.sq_draining, 1);
    assert!(next_event(&a.dev, Duration::from_millis(50)).is_none());
    qb.post_recv(&[RecvWr {
        wr_id: 6,
        sg_list: &[rbuf.sge(0, 64)],
    }])
    .unwrap();
    ok(&poll_n(&cqa, 1)[0], 5, WcOpcode::SEND);
    ok(&poll_n(&cqb, 1)[0], 6, WcOpcode::RECV);
    assert_eq!(rbuf.read(0, 15), b"sent before SQD");
    let ev = next_event(&a.dev, WAIT).expect("QP_SQ_DRAINED");
    assert_eq!(EventKind::from_u32(ev.kind), Some(EventKind::QP_SQ_DRAINED));
    assert_eq!(qa.query().unwrap().attr.sq_draining, 0);

    // Nothing in flight: SQD → RTS → SQD reports the drain at once.
    qa.modify(&virtio_rdma_driver::QpAttrs::state(QpState::RTS))
        .unwrap();
    to_sqd(&qa);
    let ev = next_event(&a.dev, WAIT).expect("QP_SQ_DRAINED");
    assert_eq!(EventKind::from_u32(ev.kind), Some(EventKind::QP_SQ_DRAINED));
    assert_eq!(ev.handle, qa.handle());
}

/// Polls `cq` until `n` completions arrived, noting whether VM `vm` was
/// seen to have moved part of `len` bytes (beyond the `base` it had moved
/// before) before the first one.
fn poll_seeing_pieces(
    d: &TestDaemon,
    vm: usize,
    cq: &Cq,
    n: usize,
    (base, len): (u64, u64),
) -> (Vec<virtio_rdma_driver::WorkCompletion>, bool) {
    let mut seen_partial = false;
    let mut wcs = Vec::new();
    let deadline = Instant::now() + WAIT;
    while wcs.len() < n {
        let moved = traffic(d, vm).send_bytes - base;
        let mut got = [virtio_rdma_driver::WorkCompletion::default(); 4];
        let k = cq.poll(&mut got);
        if moved > 0 && moved < len && wcs.is_empty() {
            seen_partial = true;
        }
        wcs.extend_from_slice(&got[..k]);
        assert!(Instant::now() < deadline, "{} completions", wcs.len());
        std::thread::sleep(Duration::from_micros(200));
    }
    (wcs, seen_partial)
}

/// A 1 MiB SEND next to a busy VM runs in pieces too (one engine service
/// never moves a whole large message while others wait): the receive WQE
/// taken by the first piece completes once, after the last, with the whole
/// length; the data lands intact across its two SGEs, between untouched
/// guard pages.
#[test]
fn large_send_in_pieces_lands_intact() {
    use virtio_rdma_driver::RecvWr;
    const LEN: usize = 1 << 20;
    let d = TestDaemon::start(3).unwrap();
    let (a, b, _c, _busy, p) = pair_next_to_busy(&d);
    let src = Buf::new(&a, LEN);
    let data = pattern(LEN, 11);
    src.write(0, &data);
    let (dst, mr) = guarded(&b, LEN);
    let half = u32::try_from(LEN / 2).unwrap();
    let sg = [
        mr.sge(0, half).unwrap(),
        mr.sge(u64::from(half), half).unwrap(),
    ];
    p.qb.post_recv(&[RecvWr {
        wr_id: 30,
        sg_list: &sg,
    }])
    .unwrap();
    d.set_vm_qos(0, slow(10 << 20)).unwrap();
    p.qa.post_send(&[wr(3, SendOp::Send, &[src.sge(0, LEN)])])
        .unwrap();
    let (wcs, seen_partial) = poll_seeing_pieces(&d, 0, &p.cqa, 1, (0, LEN as u64));
    assert!(seen_partial, "the 1 MiB SEND was never seen in pieces");
    ok(&wcs[0], 3, WcOpcode::SEND);
    let r = poll_n(&p.cqb, 1)[0];
    ok(&r, 30, WcOpcode::RECV);
    assert_eq!(r.byte_len as usize, LEN);
    assert_eq!(dst.to_vec(PAGE, LEN).unwrap(), data, "the SEND's data");
    assert_untouched(&dst, 0, PAGE, "guard before");
    assert_untouched(&dst, PAGE + LEN, PAGE, "guard after");
    let rb = traffic(&d, 1);
    assert_eq!((rb.recv_ops, rb.recv_bytes), (1, LEN as u64));
    drop(mr);
}

/// A 1 MiB RDMA READ and a 1 MiB RDMA WRITE with immediate run in pieces
/// as well; the READ's data lands in the reader's buffer, the WRITE's in
/// the target, and its receive completion (with the immediate) comes once.
#[test]
fn large_read_and_write_with_imm_in_pieces_land_intact() {
    use virtio_rdma_driver::RecvWr;
    const LEN: usize = 1 << 20;
    let d = TestDaemon::start(3).unwrap();
    let (a, b, _c, _busy, p) = pair_next_to_busy(&d);
    // READ: A reads B's buffer into its own.
    let remote = Buf::new(&b, LEN);
    let data = pattern(LEN, 12);
    remote.write(0, &data);
    let (local, local_mr) = guarded(&a, LEN);
    d.set_vm_qos(0, slow(10 << 20)).unwrap();
    let op = SendOp::RdmaRead {
        remote_addr: remote.addr(0),
        rkey: remote.mr.rkey(),
    };
    p.qa.post_send(&[wr(4, op, &[local_mr.sge(0, LEN as u32).unwrap()])])
        .unwrap();
    let (wcs, seen_partial) = poll_seeing_pieces(&d, 0, &p.cqa, 1, (0, LEN as u64));
    assert!(seen_partial, "the 1 MiB READ was never seen in pieces");
    ok(&wcs[0], 4, WcOpcode::RDMA_READ);
    assert_eq!(local.to_vec(PAGE, LEN).unwrap(), data, "the READ's data");
    assert_untouched(&local, 0, PAGE, "guard before");
    assert_untouched(&local, PAGE + LEN, PAGE, "guard after");

    // WRITE with immediate: A writes into B's guarded buffer.
    let before = traffic(&d, 0).send_bytes;
    let src = Buf::new(&a, LEN);
    let data = pattern(LEN, 13);
    src.write(0, &data);
    let (dst, mr) = guarded(&b, LEN);
    let rbuf = Buf::new(&b, 64);
    p.qb.post_recv(&[RecvWr {
        wr_id: 50,
        sg_list: &[rbuf.sge(0, 64)],
    }])
    .unwrap();
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: mr.iova(),
        rkey: mr.rkey(),
        imm: 0x1234_5678,
    };
    p.qa.post_send(&[wr(5, op, &[src.sge(0, LEN)])]).unwrap();
    let (wcs, seen_partial) = poll_seeing_pieces(&d, 0, &p.cqa, 1, (before, LEN as u64));
    ok(&wcs[0], 5, WcOpcode::RDMA_WRITE);
    assert!(
        seen_partial,
        "the WRITE with immediate was never seen in pieces"
    );
    let r = poll_n(&p.cqb, 1)[0];
    ok(&r, 50, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(r.imm_data, 0x1234_5678);
    assert_eq!(dst.to_vec(PAGE, LEN).unwrap(), data, "the WRITE's data");
    assert_untouched(&dst, 0, PAGE, "guard before");
    assert_untouched(&dst, PAGE + LEN, PAGE, "guard after");
    drop((mr, local_mr));
}

/// The receiver of a SEND in pieces moves to ERR midway: the receive WQE
/// its first piece took completes with `WR_FLUSH_ERR` (owed by the flush,
/// although the receive queue's indices show nothing outstanding), and
/// nothing more of the message lands.
#[test]
fn receiver_moved_to_err_mid_send_flushes_the_taken_receive() {
    use virtio_rdma_driver::RecvWr;
    const LEN: usize = 1 << 20;
    let d = TestDaemon::start(3).unwrap();
    let (a, b, _c, _busy, p) = pair_next_to_busy(&d);
    let src = Buf::new(&a, LEN);
    src.write(0, &pattern(LEN, 14));
    let (dst, mr) = guarded(&b, LEN);
    p.qb.post_recv(&[RecvWr {
        wr_id: 60,
        sg_list: &[mr.sge(0, LEN as u32).unwrap()],
    }])
    .unwrap();
    // 1 MiB/s: about a second for the whole message.
    d.set_vm_qos(0, slow(1 << 20)).unwrap();
    p.qa.post_send(&[wr(6, SendOp::Send, &[src.sge(0, LEN)])])
        .unwrap();
    wait_bytes(&d, 0, PIECE);
    p.qb.to_error().unwrap();
    let r = poll_n(&p.cqb, 1)[0];
    assert_eq!((r.wr_id, r.status()), (60, Some(WcStatus::WR_FLUSH_ERR)));
    // Whatever landed before, nothing lands after: the rest stays guard.
    let landed = traffic(&d, 0).send_bytes as usize;
    std::thread::sleep(Duration::from_millis(50));
    assert_untouched(
        &dst,
        PAGE + landed.min(LEN),
        LEN - landed.min(LEN),
        "after ERR",
    );
    drop(mr);
}
