#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A hostile front-end in the device-state transfer (spec 20.1, issue 30
//! item 6): corrupt, truncated, oversized and endless states, files that
//! cannot be used, a writer that never closes, a disconnect in the middle,
//! a phase that does not exist. Each time the instance is left as it was
//! (it then takes a good state), the daemon closes the front-end's file and
//! ends its thread, and VMs 1 and 2 keep exchanging RDMA traffic.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostTransferStateDirection;
use vhost::vhost_user::VhostUserProtocolFeatures;
use vhost_user_rdma::migration::state_bound;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{pattern, rc_pair, write_and_send_back, Buf, Pair, Vm};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::state_transfer::{
    check, inode, load, migrating_vmm, pipe, pipe_descriptors, save, set_state_fd, transfer_threads,
};
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const HEADER_LEN: usize = 32;

/// The tests look at the process's transfer threads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Waits until `done` holds, failing after `what` made no progress for a
/// long time (the daemon's thread ends as soon as it sees its cause).
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The daemon holds neither end of pipe `ino` and no transfer thread.
fn let_go(ino: u64, ours: usize) {
    eventually("the daemon closes the state file", || {
        pipe_descriptors(ino) == ours
    });
    eventually("the transfer thread ends", || transfer_threads().is_empty());
}

/// A daemon with VM 0 under attack, VMs 1 and 2 exchanging traffic, and
/// a good state of VM 0.
struct World {
    // Dropped in this order: the VMs' objects before their daemon.
    p: Pair,
    src: Buf,
    dst: Buf,
    seq: u64,
    _a: Vm,
    _b: Vm,
    good: Vec<u8>,
    d: TestDaemon,
}

impl World {
    fn new() -> World {
        Self::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> World {
        let d = TestDaemon::with_limits(3, limits).unwrap();
        let a = Vm::open(&d, 1, VmmOptions::default());
        let b = Vm::open(&d, 2, VmmOptions::default());
        let p = rc_pair(&a, &b);
        let src = Buf::new(&a, 4096);
        let dst = Buf::new(&b, 4096);
        let mut vmm = d.connect_with(0, migrating_vmm()).unwrap();
        vmm.stop_queues().unwrap();
        let good = save(&mut vmm).unwrap();
        drop(vmm);
        d.wait_released(0);
        let mut w = World {
            d,
            p,
            src,
            dst,
            seq: 0,
            _a: a,
            _b: b,
            good,
        };
        w.others_work();
        w
    }

    /// A front-end on VM 0 with the device stopped, as at a migration's
    /// destination.
    fn stopped_vm0(&self) -> (TestVmm, Vec<u32>) {
        let mut vmm = self.d.connect_with(0, migrating_vmm()).unwrap();
        let bases = vmm.stop_queues().unwrap();
        (vmm, bases)
    }

    fn others_work(&mut self) {
        self.seq += 1;
        let data = pattern(512, self.seq);
        write_and_send_back(&self.p, &self.src, &self.dst, &data, 2048, self.seq);
    }

    /// After a refused transfer: the instance takes the good state, runs,
    /// and the others still work.
    fn still_serves(&mut self, mut vmm: TestVmm, bases: &[u32]) {
        assert!(load(&mut vmm, &self.good).unwrap(), "the good state after");
        vmm.resume(bases).unwrap();
        Verbs::new(&mut vmm).query_port(1).expect("VM 0 runs");
        self.others_work();
        assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
    }
}

/// Every kind of damage to a whole state, each written and closed as QEMU
/// does: `CHECK_DEVICE_STATE` fails, the instance is unchanged.
#[test]
fn a_corrupt_state_is_refused_and_changes_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let good = w.good.clone();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut b = good.clone();
    b[0] ^= 0xff;
    cases.push(("bad magic", b));
    let mut b = good.clone();
    b[8] = 99;
    cases.push(("unknown version", b));
    let mut b = good.clone();
    let last = b.len() - 1;
    b[last] ^= 0x01;
    cases.push(("bad checksum", b));
    cases.push(("truncated body", good[..good.len() - 3].to_vec()));
    cases.push(("truncated header", good[..HEADER_LEN - 5].to_vec()));
    cases.push(("empty", Vec::new()));
    let mut b = good.clone();
    b.extend_from_slice(&[0; 7]);
    cases.push(("bytes after the frame", b));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("declared length u64::MAX", b));

    for (what, bytes) in cases {
        let (mut vmm, bases) = w.stopped_vm0();
        assert!(!load(&mut vmm, &bytes).unwrap(), "{what}: refused");
        assert!(
            transfer_threads().is_empty(),
            "{what}: {:?}",
            transfer_threads()
        );
        w.others_work();
        w.still_serves(vmm, &bases);
        w.d.wait_released(0);
    }
}

/// A header declaring more than the instance's bound is refused from the
/// header alone: the daemon closes the file while the front-end still
/// holds its end open and has sent nothing else.
#[test]
fn a_declared_length_past_the_bound_is_refused_before_the_body() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let bound = state_bound(&Limits::default());
    let (mut vmm, bases) = w.stopped_vm0();
    let (r, mut wr) = pipe().unwrap();
    let ino = inode(&wr);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    let mut header = w.good[..HEADER_LEN].to_vec();
    header[16..24].copy_from_slice(&(bound - HEADER_LEN as u64 + 1).to_le_bytes());
    wr.write_all(&header).unwrap();
    let_go(ino, 1);
    assert!(!check(&mut vmm).unwrap());
    drop(wr);
    w.still_serves(vmm, &bases);
}

/// A front-end that goes on writing past the bound: the daemon reads the
/// bound and one chunk more at most, then closes the file; the writer
/// sees the pipe broken long before it is done.
#[test]
fn a_writer_past_the_bound_is_cut_off() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Small limits, for a small bound.
    let limits = Limits {
        max_ctx: 1,
        max_pd: 1,
        max_cq: 1,
        max_qp: 2,
        max_srq: 1,
        max_mr: 1,
        max_ah: 1,
        max_mr_bytes: 1 << 20,
        ..Limits::default()
    };
    let bound = state_bound(&limits);
    let mut w = World::with_limits(limits);
    let (mut vmm, bases) = w.stopped_vm0();
    let (r, mut wr) = pipe().unwrap();
    let ino = inode(&wr);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    // A header declaring exactly the bound, then four times as much.
    let mut stream = w.good[..HEADER_LEN].to_vec();
    stream[16..24].copy_from_slice(&(bound - HEADER_LEN as u64).to_le_bytes());
    stream.resize(usize::try_from(bound * 4).unwrap(), 0x5a);
    let total = stream.len();
    let writer = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < stream.len() {
            match wr.write(&stream[sent..]) {
                Ok(n) => sent += n,
                Err(e) => return (sent, Some(e.kind())),
            }
        }
        (sent, None)
    });
    let (sent, err) = writer.join().unwrap();
    assert_eq!(err, Some(std::io::ErrorKind::BrokenPipe), "sent {sent}");
    assert!(
        (sent as u64) < bound * 2,
        "the daemon read {sent} bytes of a {total}-byte stream, bound {bound}"
    );
    let_go(ino, 0);
    assert!(!check(&mut vmm).unwrap());
    w.still_serves(vmm, &bases);
}

/// A whole, good state whose writer never closes the file: the front-end's
/// `CHECK_DEVICE_STATE` fails (it did not close its end), the daemon
/// closes the file and the thread ends. Nothing is loaded.
#[test]
fn a_writer_that_never_closes_fails_at_check() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let (mut vmm, bases) = w.stopped_vm0();
    let (r, mut wr) = pipe().unwrap();
    let ino = inode(&wr);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    wr.write_all(&w.good).unwrap();
    eventually("the reader thread runs, waiting for end of file", || {
        transfer_threads().len() == 1
    });
    assert!(!check(&mut vmm).unwrap(), "CHECK with the file open");
    let_go(ino, 1);
    // The daemon's end is closed: our writes now fail.
    assert_eq!(
        wr.write(&[0]).map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::BrokenPipe)
    );
    drop(wr);
    w.still_serves(vmm, &bases);
}

/// A front-end that disconnects in the middle of a `LOAD` (and one in the
/// middle of a `SAVE` it never reads) leaves nothing behind.
#[test]
fn a_disconnect_mid_transfer_leaves_nothing_behind() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let (mut vmm, _) = w.stopped_vm0();
    let (r, mut wr) = pipe().unwrap();
    let ino = inode(&wr);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    wr.write_all(&w.good[..w.good.len() / 2]).unwrap();
    drop(vmm);
    w.d.wait_released(0);
    let_go(ino, 1);
    drop(wr);
    w.others_work();

    // A SAVE whose state the front-end never reads, then a disconnect.
    let (mut vmm, _) = w.stopped_vm0();
    let (r, wr) = pipe().unwrap();
    let ino = inode(&r);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::SAVE, wr).unwrap());
    drop(vmm);
    w.d.wait_released(0);
    let_go(ino, 1);
    drop(r);

    let (vmm, bases) = w.stopped_vm0();
    w.still_serves(vmm, &bases);
}

/// Files the daemon cannot use for the direction asked: the read end of a
/// pipe to `SAVE` into, a pipe whose reader is gone, the write end of a
/// pipe to `LOAD` from, a directory.
#[test]
fn an_unusable_file_fails_the_transfer() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let (mut vmm, bases) = w.stopped_vm0();

    let (r, wr) = pipe().unwrap();
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::SAVE, r).unwrap());
    assert!(!check(&mut vmm).unwrap(), "SAVE into a read end");
    drop(wr);

    let (r, wr) = pipe().unwrap();
    drop(r);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::SAVE, wr).unwrap());
    assert!(!check(&mut vmm).unwrap(), "SAVE into a pipe nobody reads");

    let (r, wr) = pipe().unwrap();
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, wr).unwrap());
    assert!(!check(&mut vmm).unwrap(), "LOAD from a write end");
    drop(r);

    let dir = File::open(w.d.dir()).unwrap();
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, dir).unwrap());
    assert!(!check(&mut vmm).unwrap(), "LOAD from a directory");

    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
    w.others_work();
    w.still_serves(vmm, &bases);
}

/// A second `SET_DEVICE_STATE_FD` while a `LOAD` waits for its writer
/// ends the first (its file closed) and runs the second.
#[test]
fn a_new_transfer_replaces_a_waiting_one() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let (mut vmm, bases) = w.stopped_vm0();
    let (r, mut wr) = pipe().unwrap();
    let ino = inode(&wr);
    assert!(set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    wr.write_all(&w.good[..10]).unwrap();
    w.still_serves(vmm, &bases);
    assert_eq!(pipe_descriptors(ino), 1, "the first file is closed");
}

/// `SET_DEVICE_STATE_FD` naming a phase vhost-user does not define:
/// vhost-user-backend ends the connection (an invalid message); the file
/// is closed, the socket serves the next front-end, the others run on.
#[test]
fn an_unknown_phase_ends_the_connection() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let s = std::os::unix::net::UnixStream::connect(w.d.socket(0)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = |s: &std::os::unix::net::UnixStream, req: u32, body: &[u8]| {
        let mut m = Vec::new();
        for v in [req, 1, u32::try_from(body.len()).unwrap()] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(body);
        (&*s).write_all(&m).unwrap();
    };
    let reply_u64 = |s: &std::os::unix::net::UnixStream| -> Option<u64> {
        use std::io::Read;
        let mut m = [0u8; 20];
        (&*s).read_exact(&mut m).ok()?;
        Some(u64::from_le_bytes(m[12..20].try_into().unwrap()))
    };
    request(&s, 3, &[]); // SET_OWNER
    request(&s, 1, &[]); // GET_FEATURES
    let features = reply_u64(&s).unwrap();
    request(&s, 15, &[]); // GET_PROTOCOL_FEATURES
    let protocol = reply_u64(&s).unwrap();
    assert_ne!(protocol & VhostUserProtocolFeatures::DEVICE_STATE.bits(), 0);
    let acked = protocol & !VhostUserProtocolFeatures::REPLY_ACK.bits();
    request(&s, 16, &acked.to_le_bytes()); // SET_PROTOCOL_FEATURES
    request(&s, 2, &features.to_le_bytes()); // SET_FEATURES

    let (r, wr) = pipe().unwrap();
    let ino = inode(&wr);
    let mut m = Vec::new();
    for v in [42u32, 1, 8, 1, 7] {
        // SET_DEVICE_STATE_FD, LOAD, phase 7
        m.extend_from_slice(&v.to_le_bytes());
    }
    s.send_with_fd(&m[..], r.as_raw_fd()).unwrap();
    drop(r);
    assert_eq!(reply_u64(&s), None, "the daemon closes the connection");
    w.d.wait_released(0);
    let_go(ino, 1);
    drop(wr);

    let (vmm, bases) = w.stopped_vm0();
    w.still_serves(vmm, &bases);
}
