#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Dirty logging (spec 20.4) through the real vhost-user socket: the test
//! VMM negotiates `LOG_SHMFD`, hands the daemon a log memfd with
//! `SET_LOG_BASE`, turns `VHOST_F_LOG_ALL` on, and reads and clears the
//! bitmap as a migrating VMM does. Every write of the daemon into guest RAM
//! must mark its pages (data of WRITE, SEND, READ responses and atomics,
//! CQEs, control responses, event buffers, used rings), and nothing else
//! is marked; with logging off nothing is marked at all.

use std::collections::BTreeSet;

use vhost::vhost_user::VhostUserProtocolFeatures;
use vhost_user_rdma_tests::dirty_log::{log_bytes_for, DirtyLogFile, LOG_PAGE};
use vhost_user_rdma_tests::dp::{
    self, pattern, poll_one, rc_pair, recv, wr, write_op, Buf, Pair, Vm,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_driver::SendOp;

/// Options of a VMM that can log: `LOG_SHMFD` asked for.
fn logging_opts() -> VmmOptions {
    let base = VmmOptions::default();
    VmmOptions {
        protocol_features: base.protocol_features | VhostUserProtocolFeatures::LOG_SHMFD,
        // `quiesce` watches the control queue's `avail_event`.
        event_idx: true,
        ..base
    }
}

/// A log that covers all of a VM's RAM.
fn log_for(vm: &Vm) -> DirtyLogFile {
    let end =
        vm.t.vmm()
            .options()
            .mem
            .regions
            .iter()
            .map(|r| r.end())
            .max()
            .unwrap();
    DirtyLogFile::new(usize::try_from(log_bytes_for(end)).unwrap()).unwrap()
}

/// Sets `log` as `vm`'s dirty log and turns logging on or off.
fn start_log(vm: &Vm, log: &DirtyLogFile, on: bool) {
    let mut vmm = vm.t.vmm();
    vmm.set_log_base(log, log.len() as u64, 0)
        .expect("SET_LOG_BASE");
    vmm.set_log_all(on).expect("SET_FEATURES with LOG_ALL");
}

/// Two VMs of one daemon, each with a log, logging `on`, an RC pair
/// between them.
struct World {
    // Dropped in this order: the QPs and VMs before their daemon.
    p: Pair,
    a: Vm,
    b: Vm,
    la: DirtyLogFile,
    lb: DirtyLogFile,
    _d: TestDaemon,
}

fn world(on: bool) -> World {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open(&d, 0, logging_opts());
    let b = Vm::open(&d, 1, logging_opts());
    let (la, lb) = (log_for(&a), log_for(&b));
    start_log(&a, &la, on);
    start_log(&b, &lb, on);
    let p = rc_pair(&a, &b);
    // The first message a QP takes raises COMM_EST (an event written into
    // the eventq): one each way now, so that the tests see only what their
    // own operations write.
    for (q, cq, from, to) in [(&p.qa, &p.cqa, &a, &b), (&p.qb, &p.cqb, &b, &a)] {
        let s = Buf::new(from, 64);
        let d = Buf::new(to, 64);
        q.post_send(&[wr(0, write_op(&d, 0), &[s.sge(0, 64)])])
            .unwrap();
        dp::ok(&poll_one(cq), 0, WcOpcode::RDMA_WRITE);
    }
    World {
        p,
        a,
        b,
        la,
        lb,
        _d: d,
    }
}

/// The pages of bytes `[off, off + len)` of `buf`.
fn buf_pages(buf: &Buf, off: usize, len: usize) -> BTreeSet<u64> {
    (off..off + len)
        .step_by(64)
        .chain(std::iter::once(off + len - 1))
        .map(|i| buf.buf.gpa(i).unwrap() / LOG_PAGE)
        .collect()
}

/// The pages of a CQ's ring.
fn cq_pages(cq: &virtio_rdma_driver::Cq) -> BTreeSet<u64> {
    cq.ring_pages().iter().map(|g| g / LOG_PAGE).collect()
}

/// What a VMM's log sync finds now, the bits cleared.
fn sync(log: &DirtyLogFile) -> BTreeSet<u64> {
    log.take()
}

/// [`sync`] of `vm`'s log without the page of its context's doorbell
/// header: the engine writes its flags there whenever it parks or wakes
/// the VM (spec 18.4), at times of its own (those writes are logged too:
/// `events_control_responses_and_used_rings_are_marked` and
/// `the_context_header_is_marked`).
fn sync_data(vm: &Vm, log: &DirtyLogFile) -> BTreeSet<u64> {
    let mut got = log.take();
    if let Some(h) = vm.dev.ctx_header_gpa() {
        got.remove(&(h / LOG_PAGE));
    }
    got
}

/// Waits until `vm`'s control queue is idle: after its last request the
/// device polls the avail ring for a while and then re-arms kicks, writing
/// `avail_event` into the used ring (a write of its own, logged too), which
/// would otherwise land in the middle of a test's operation.
fn quiesce(vm: &Vm) {
    let deadline = std::time::Instant::now() + dp::WAIT;
    loop {
        let idle = {
            let mut vmm = vm.t.vmm();
            let v = vmm.ctrl().vring();
            v.device_avail_event().unwrap() == v.avail_idx()
        };
        if idle {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the control queue stays busy"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Both VMs' control queues idle, both logs cleared.
fn settle(w: &World) {
    quiesce(&w.a);
    quiesce(&w.b);
    let (_, _) = (sync(&w.la), sync(&w.lb));
}

#[test]
fn write_marks_exactly_the_pages_written() {
    let w = world(true);
    // Three pages and a bit, not page aligned.
    let len = 3 * 4096 + 100;
    let src = Buf::new(&w.b, len + 8192);
    let dst = Buf::new(&w.a, len + 8192);
    let data = pattern(len, 7);
    src.write(0, &data);
    settle(&w);

    let sg = [src.sge(0, len)];
    w.p.qb
        .post_send(&[wr(1, write_op(&dst, 300), &sg)])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(300, len), data);

    // A: the written bytes' pages, and nothing else (no completion there).
    let got = sync_data(&w.a, &w.la);
    assert_eq!(got, buf_pages(&dst, 300, len), "A's log");
    // B: its CQE's page; never the source, which the device only read.
    let got = sync(&w.lb);
    assert!(
        got.intersection(&cq_pages(&w.p.cqb)).count() == 1,
        "B's CQ page: {got:?}"
    );
    assert!(got.is_disjoint(&buf_pages(&src, 0, len)), "{got:?}");
    // A sync clears: nothing new since.
    assert!(sync(&w.la).is_empty());
}

#[test]
fn write_with_immediate_marks_the_responders_cq_page() {
    let w = world(true);
    let src = Buf::new(&w.b, 4096);
    let dst = Buf::new(&w.a, 4096);
    let rbuf = Buf::new(&w.a, 64);
    recv(&w.p.qa, 9, &[rbuf.sge(0, 64)]);
    settle(&w);
    let sg = [src.sge(0, 512)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(0),
        rkey: dst.mr.rkey(),
        imm: 5,
    };
    w.p.qb.post_send(&[wr(2, op, &sg)]).unwrap();
    dp::ok(&poll_one(&w.p.cqb), 2, WcOpcode::RDMA_WRITE);
    dp::ok(&poll_one(&w.p.cqa), 9, WcOpcode::RECV_RDMA_WITH_IMM);
    let got = sync(&w.la);
    let want: BTreeSet<u64> = buf_pages(&dst, 0, 512);
    assert!(want.is_subset(&got), "{got:?}");
    assert_eq!(got.intersection(&cq_pages(&w.p.cqa)).count(), 1, "{got:?}");
}

#[test]
fn send_marks_the_receive_buffer_pages() {
    let w = world(true);
    let len = 2 * 4096 + 10;
    let src = Buf::new(&w.b, len);
    let rbuf = Buf::new(&w.a, len + 4096);
    let data = pattern(len, 3);
    src.write(0, &data);
    recv(&w.p.qa, 4, &[rbuf.sge(100, len)]);
    settle(&w);
    w.p.qb
        .post_send(&[wr(3, SendOp::Send, &[src.sge(0, len)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 3, WcOpcode::SEND);
    dp::ok(&poll_one(&w.p.cqa), 4, WcOpcode::RECV);
    assert_eq!(rbuf.read(100, len), data);
    let got = sync_data(&w.a, &w.la);
    let data_pages = buf_pages(&rbuf, 100, len);
    assert!(data_pages.is_subset(&got), "{got:?}");
    assert_eq!(got.intersection(&cq_pages(&w.p.cqa)).count(), 1, "{got:?}");
    // Besides the data's pages and the CQE's, at most the doorbell records
    // of the CQ and the QP (the device's halves) may be marked.
    assert!(got.len() <= data_pages.len() + 3, "{got:?}");
    assert!(sync(&w.lb).is_disjoint(&buf_pages(&src, 0, len)));
}

#[test]
fn read_marks_the_readers_pages_only() {
    let w = world(true);
    let len = 4096 + 500;
    let remote = Buf::new(&w.b, len);
    let local = Buf::new(&w.a, len + 4096);
    let data = pattern(len, 11);
    remote.write(0, &data);
    settle(&w);
    let op = SendOp::RdmaRead {
        remote_addr: remote.addr(0),
        rkey: remote.mr.rkey(),
    };
    w.p.qa
        .post_send(&[wr(5, op, &[local.sge(1000, len)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqa), 5, WcOpcode::RDMA_READ);
    assert_eq!(local.read(1000, len), data);
    let got = sync(&w.la);
    assert!(buf_pages(&local, 1000, len).is_subset(&got), "{got:?}");
    assert_eq!(got.intersection(&cq_pages(&w.p.cqa)).count(), 1);
    // The responder's memory was only read.
    let gb = sync(&w.lb);
    assert!(gb.is_disjoint(&buf_pages(&remote, 0, len)), "{gb:?}");
}

#[test]
fn atomics_mark_the_target_and_the_result_pages() {
    let w = world(true);
    let target = Buf::new(&w.b, 3 * 4096);
    let result = Buf::new(&w.a, 4096);
    settle(&w);
    let op = SendOp::AtomicFetchAdd {
        remote_addr: target.addr(2 * 4096 + 8),
        rkey: target.mr.rkey(),
        add: 3,
    };
    w.p.qa
        .post_send(&[wr(6, op, &[result.sge(16, 8)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqa), 6, WcOpcode::FETCH_ADD);
    assert_eq!(target.u64_at(2 * 4096 + 8), 3);
    let gb = sync(&w.lb);
    assert_eq!(
        gb,
        buf_pages(&target, 2 * 4096 + 8, 8),
        "B: the 8 bytes' page"
    );
    let ga = sync(&w.la);
    assert!(buf_pages(&result, 16, 8).is_subset(&ga), "{ga:?}");
}

#[test]
fn events_control_responses_and_used_rings_are_marked() {
    let w = world(true);
    settle(&w);
    // A control command: its response and the controlq used ring.
    let cq = virtio_rdma_driver::Cq::create(&w.a.dev, 16).unwrap();
    let got = sync(&w.la);
    let (ctrl_used, event_used, event_pages) = {
        let mut vmm = w.a.t.vmm();
        let (c, e, _) = vmm.queues();
        (
            c.vring().used_ring().0 / LOG_PAGE,
            e.vring().used_ring().0 / LOG_PAGE,
            e.buffer_pages()
                .iter()
                .map(|g| g.0 / LOG_PAGE)
                .collect::<BTreeSet<u64>>(),
        )
    };
    assert!(got.contains(&ctrl_used), "controlq used ring: {got:?}");
    assert!(got.len() >= 2, "and the response buffer: {got:?}");
    drop(cq);
    // An event: arm the CQ, complete into it.
    let cqa = &w.p.cqa;
    cqa.req_notify(false);
    let src = Buf::new(&w.a, 64);
    let dst = Buf::new(&w.b, 64);
    let _ = sync(&w.la);
    w.p.qa
        .post_send(&[wr(7, write_op(&dst, 0), &[src.sge(0, 64)])])
        .unwrap();
    dp::ok(&poll_one(cqa), 7, WcOpcode::RDMA_WRITE);
    let ev = cqa.wait_event(Some(dp::WAIT)).unwrap();
    assert!(ev, "CQ_COMPLETION");
    let got = sync(&w.la);
    assert!(got.contains(&event_used), "eventq used ring: {got:?}");
    assert!(!got.is_disjoint(&event_pages), "an event buffer: {got:?}");
}

#[test]
fn nothing_is_marked_with_logging_off() {
    // A log is set but LOG_ALL is not acknowledged.
    let w = world(false);
    let src = Buf::new(&w.b, 8192);
    let dst = Buf::new(&w.a, 8192);
    let rbuf = Buf::new(&w.a, 8192);
    recv(&w.p.qa, 1, &[rbuf.sge(0, 8192)]);
    w.p.qb
        .post_send(&[wr(1, write_op(&dst, 0), &[src.sge(0, 8192)])])
        .unwrap();
    w.p.qb
        .post_send(&[wr(2, SendOp::Send, &[src.sge(0, 8192)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 1, WcOpcode::RDMA_WRITE);
    dp::ok(&poll_one(&w.p.cqb), 2, WcOpcode::SEND);
    dp::ok(&poll_one(&w.p.cqa), 1, WcOpcode::RECV);
    assert!(w.la.peek().is_empty(), "{:?}", w.la.peek());
    assert!(w.lb.peek().is_empty(), "{:?}", w.lb.peek());

    // On, then off again: marks only while on.
    w.a.t.vmm().set_log_all(true).unwrap();
    settle(&w);
    w.p.qb
        .post_send(&[wr(3, write_op(&dst, 0), &[src.sge(0, 100)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(sync_data(&w.a, &w.la), buf_pages(&dst, 0, 100));
    w.a.t.vmm().set_log_all(false).unwrap();
    settle(&w);
    w.p.qb
        .post_send(&[wr(4, write_op(&dst, 4096), &[src.sge(0, 100)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 4, WcOpcode::RDMA_WRITE);
    assert!(w.la.peek().is_empty(), "{:?}", w.la.peek());
}

#[test]
fn a_second_log_replaces_the_first() {
    let w = world(true);
    let fresh = log_for(&w.a);
    w.a.t
        .vmm()
        .set_log_base(&fresh, fresh.len() as u64, 0)
        .unwrap();
    let _ = (sync(&w.la), sync(&fresh));
    let src = Buf::new(&w.b, 4096);
    let dst = Buf::new(&w.a, 4096);
    settle(&w);
    let _ = sync(&fresh);
    w.p.qb
        .post_send(&[wr(1, write_op(&dst, 0), &[src.sge(0, 64)])])
        .unwrap();
    dp::ok(&poll_one(&w.p.cqb), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(sync_data(&w.a, &fresh), buf_pages(&dst, 0, 64));
    assert!(sync(&w.la).is_empty(), "the old log is not written");
}

#[test]
fn the_context_header_is_marked() {
    // Logging on from the start: the engine writes the context's flags at
    // the device's start and whenever it parks the VM.
    let w = world(true);
    let h = w.a.dev.ctx_header_gpa().expect("guest-RAM doorbell mode") / LOG_PAGE;
    let deadline = std::time::Instant::now() + dp::WAIT;
    let mut seen = BTreeSet::new();
    let src = Buf::new(&w.a, 64);
    let dst = Buf::new(&w.b, 64);
    let mut id = 0;
    while !seen.contains(&h) {
        seen.extend(sync(&w.la));
        // Work, then idleness again: the engine wakes and parks A.
        id += 1;
        w.p.qa
            .post_send(&[wr(id, write_op(&dst, 0), &[src.sge(0, 8)])])
            .unwrap();
        dp::ok(&poll_one(&w.p.cqa), id, WcOpcode::RDMA_WRITE);
        assert!(
            std::time::Instant::now() < deadline,
            "the context header's page {h} never marked: {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn nothing_is_written_past_the_log() {
    // The log is announced `need` bytes long in a longer file: the bytes
    // of the file after it are the VMM's, never the daemon's.
    use std::os::unix::fs::FileExt;
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open(&d, 0, logging_opts());
    let b = Vm::open(&d, 1, logging_opts());
    let end =
        a.t.vmm()
            .options()
            .mem
            .regions
            .iter()
            .map(|r| r.end())
            .max()
            .unwrap();
    let need = log_bytes_for(end);
    let log = DirtyLogFile::with_file_len(
        usize::try_from(need).unwrap(),
        need + 8192,
        vhost_user_rdma_tests::dirty_log::LogFile::Sealed,
    )
    .unwrap();
    start_log(&a, &log, true);
    let p = rc_pair(&a, &b);
    // Traffic into A's RAM: WRITEs into the last buffer the VMM hands out
    // (the highest addresses) and SENDs.
    let dst = Buf::new(&a, 64 << 10);
    let src = Buf::new(&b, 64 << 10);
    for i in 0..16u64 {
        recv(&p.qa, i, &[dst.sge(0, 4096)]);
        p.qb.post_send(&[wr(i, write_op(&dst, 4096), &[src.sge(0, 60 << 10)])])
            .unwrap();
        p.qb.post_send(&[wr(100 + i, SendOp::Send, &[src.sge(0, 4096)])])
            .unwrap();
        dp::ok(&poll_one(&p.cqb), i, WcOpcode::RDMA_WRITE);
        dp::ok(&poll_one(&p.cqb), 100 + i, WcOpcode::SEND);
        dp::ok(&poll_one(&p.cqa), i, WcOpcode::RECV);
    }
    assert!(!log.peek().is_empty(), "the traffic was logged");
    let mut tail = vec![0xffu8; 8192];
    log.file().read_exact_at(&mut tail, need).unwrap();
    assert!(
        tail.iter().all(|&b| b == 0),
        "a byte past the log was written"
    );
    drop(p);
}
