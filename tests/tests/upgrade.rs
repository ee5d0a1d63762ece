//! A live upgrade (spec 20.7): a second daemon process takes every VM over
//! from the running one through its hand-over socket, which then exits;
//! the VMs' connections, objects, QP numbers and keys carry on, and RDMA
//! between two VMs goes on across it (a receive posted before is taken
//! after). A successor that cannot take the VMs over leaves the running
//! daemon serving. Two real daemon processes, the test VMMs on their
//! sockets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;
use vhost_user_rdma_tests::dp::{connect, ok, poll_one, rc_qp, wr, write_op, Buf, Vm};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcOpcode;

use virtio_rdma_driver::{Cq, Device, Qp, RecvWr, SendOp};

/// The daemon binary, built now (a no-op when it is up to date).
fn daemon_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-q",
        "-p",
        "vhost-user-rdma",
        "--bin",
        "vhost-user-rdma",
    ]);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success(), "cannot build the daemon");
    profile_dir.join("vhost-user-rdma")
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    fn spawn(dir: &Path, sockets: &[&str], take_over: bool) -> Daemon {
        Self::spawn_with(dir, sockets, take_over, &[])
    }

    fn spawn_with(dir: &Path, sockets: &[&str], take_over: bool, extra: &[&str]) -> Daemon {
        let mut cmd = Command::new(daemon_binary());
        cmd.args(extra);
        for s in sockets {
            cmd.arg("--socket-path").arg(dir.join(s));
        }
        cmd.arg("--handover-socket").arg(dir.join("handover.sock"));
        if take_over {
            cmd.arg("--take-over");
        }
        Daemon(cmd.spawn().unwrap())
    }

    /// Waits for the process to end (no time limit: it ends by itself or
    /// the test fails by hanging, which the harness reports).
    fn wait(&mut self) -> ExitStatus {
        self.0.wait().unwrap()
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

/// Waits until `path` exists while `d` runs.
fn wait_for(path: &Path, d: &mut Daemon) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            d.alive(),
            "the daemon ended before {} appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
        if start.elapsed() > Duration::from_secs(600) {
            panic!("{} never appeared", path.display());
        }
    }
}

/// Waits until `old` has handed over to `new` and exited; fails if `new`
/// ends first (a refused hand-over leaves `old` serving for good).
fn handed_over(old: &mut Daemon, new: &mut Daemon) {
    loop {
        if let Some(status) = new.0.try_wait().unwrap() {
            panic!("the successor ended with {status}: the hand-over was refused");
        }
        if let Some(status) = old.0.try_wait().unwrap() {
            assert!(status.success(), "the old daemon ended with {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// VMs A and B on `dir`'s sockets with an RC QP each, connected, and a
/// buffer each (fields in the order they must go).
struct Pair {
    qa: Qp,
    qb: Qp,
    src: Buf,
    dst: Buf,
    cqa: Arc<Cq>,
    cqb: Arc<Cq>,
    a: Vm,
    b: Vm,
}

impl Pair {
    fn open(dir: &Path) -> Pair {
        let a = Vm::open_path(&dir.join("a.sock"), VmmOptions::default());
        let b = Vm::open_path(&dir.join("b.sock"), VmmOptions::default());
        let (cqa, cqb) = (
            Cq::create(&a.dev, 64).unwrap(),
            Cq::create(&b.dev, 64).unwrap(),
        );
        let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
        connect(&a, &qa, &b, &qb);
        let src = Buf::new(&a, 8192);
        let dst = Buf::new(&b, 8192);
        Pair {
            qa,
            qb,
            src,
            dst,
            cqa,
            cqb,
            a,
            b,
        }
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vur-upgrade-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_new_daemon_takes_every_vm_over_and_rdma_goes_on() {
    let dir = temp_dir("ok");
    let socks = ["a.sock", "b.sock", "c.sock"];
    let mut old = Daemon::spawn(&dir, &socks, false);
    wait_for(&dir.join("handover.sock"), &mut old);
    let Pair {
        qa,
        qb,
        src,
        dst,
        cqa,
        cqb,
        a,
        b,
    } = Pair::open(&dir);
    src.write(0, b"before the move");
    qa.post_send(&[wr(1, write_op(&dst, 0), &[src.sge(0, 15)])])
        .unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 15), b"before the move");
    qb.post_recv(&[RecvWr {
        wr_id: 50,
        sg_list: &[dst.sge(4096, 64)],
    }])
    .unwrap();
    let (qpna, qpnb) = (qa.qpn(), qb.qpn());

    // WRITEs one after another across the upgrade, each checked; the
    // longest gap between two completions is what the VM saw of it.
    let upgraded = AtomicBool::new(false);
    let (mut new, (gap, writes)) = std::thread::scope(|sc| {
        let traffic = sc.spawn(|| {
            let (mut n, mut gap, mut last) = (0u64, Duration::ZERO, Instant::now());
            while !upgraded.load(Ordering::Acquire) || n < 20 {
                let tag = (n + 1).to_ne_bytes();
                src.write(64, &tag);
                qa.post_send(&[wr(1000 + n, write_op(&dst, 64), &[src.sge(64, 8)])])
                    .unwrap();
                ok(&poll_one(&cqa), 1000 + n, WcOpcode::RDMA_WRITE);
                assert_eq!(dst.read(64, 8), tag);
                gap = gap.max(last.elapsed());
                last = Instant::now();
                n += 1;
            }
            (gap, n)
        });
        let new = Daemon::spawn(&dir, &socks, true);
        let status = old.wait();
        assert!(status.success(), "the old daemon ended with {status}");
        upgraded.store(true, Ordering::Release);
        (new, traffic.join().unwrap())
    });
    assert!(new.alive(), "the new daemon did not take over");
    println!(
        "UPGRADE-GAP: {} ms, the longest gap between two of {writes} WRITE completions across the upgrade",
        gap.as_millis()
    );
    // VM C had no VMM: its socket, taken over too, accepts one now.
    let c = Vm::open_path(&dir.join("c.sock"), VmmOptions::default());
    let cqc = Cq::create(&c.dev, 16).unwrap();
    let (qc1, qc2) = (rc_qp(&c, &cqc), rc_qp(&c, &cqc));
    connect(&c, &qc1, &c, &qc2);
    let cbuf = Buf::new(&c, 4096);
    cbuf.write(0, b"c served");
    qc1.post_send(&[wr(9, write_op(&cbuf, 2048), &[cbuf.sge(0, 8)])])
        .unwrap();
    ok(&poll_one(&cqc), 9, WcOpcode::RDMA_WRITE);
    assert_eq!(cbuf.read(2048, 8), b"c served");

    // The same connections, QPs, keys and CQs, through the new daemon.
    src.write(0, b"after the move!");
    qa.post_send(&[
        wr(2, write_op(&dst, 1024), &[src.sge(0, 15)]),
        wr(3, SendOp::Send, &[src.sge(0, 15)]),
    ])
    .unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::RDMA_WRITE);
    ok(&poll_one(&cqa), 3, WcOpcode::SEND);
    ok(&poll_one(&cqb), 50, WcOpcode::RECV);
    assert_eq!(dst.read(1024, 15), b"after the move!");
    assert_eq!(dst.read(4096, 15), b"after the move!");
    assert_eq!((qa.qpn(), qb.qpn()), (qpna, qpnb));
    // New objects work too, and the new daemon hands over again.
    let cq2 = Cq::create(&a.dev, 16).unwrap();
    assert_ne!(cq2.handle(), cqa.handle());
    wait_for(&dir.join("handover.sock"), &mut new);
    let mut newer = Daemon::spawn(&dir, &socks, true);
    assert!(new.wait().success());
    qa.post_send(&[wr(4, write_op(&dst, 2048), &[src.sge(0, 15)])])
        .unwrap();
    ok(&poll_one(&cqa), 4, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(2048, 15), b"after the move!");
    assert!(newer.alive());
    // The VMs' objects go while their daemon runs.
    // And C's objects went along the second time.
    qc1.post_send(&[wr(10, write_op(&cbuf, 3072), &[cbuf.sge(0, 8)])])
        .unwrap();
    ok(&poll_one(&cqc), 10, WcOpcode::RDMA_WRITE);
    assert_eq!(cbuf.read(3072, 8), b"c served");
    drop((qa, qb, cq2, src, dst, cqa, cqb, a, b));
    drop((qc1, qc2, cbuf, cqc, c));
    drop(newer);
    let _ = std::fs::remove_dir_all(&dir);
}

/// VMs in the shared-memory doorbell mode (spec 18.7, 20.7): the new
/// daemon serves the doorbell region the guests map, so the contexts keep
/// their pages and the queues their slots and producer indices. Work
/// posted before the upgrade and run after it, and work posted after it,
/// complete; the VMM is asked for no new map; a new context gets a page
/// of its own; and the region moves on with a second upgrade.
#[test]
fn doorbell_pages_and_their_producer_indices_go_over_to_the_new_daemon() {
    let dir = temp_dir("shmem");
    let socks = ["a.sock", "b.sock"];
    let mut old = Daemon::spawn(&dir, &socks, false);
    wait_for(&dir.join("handover.sock"), &mut old);
    let shmem = VmmOptions {
        shmem: true,
        ..VmmOptions::default()
    };
    let a = Vm::open_path(&dir.join("a.sock"), shmem.clone());
    let b = Vm::open_path(&dir.join("b.sock"), shmem);
    let (wa, wb) = (a.window().unwrap(), b.window().unwrap());
    let (page_a, page_b) = (a.dev.doorbell_page(), b.dev.doorbell_page());
    assert!(
        page_a.is_some() && page_b.is_some(),
        "{:?}",
        wa.violations()
    );
    let (cqa, cqb) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
    );
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
    let (slot_a, slot_b) = (qa.doorbell_slot(), qb.doorbell_slot());
    assert!(slot_a.is_some() && slot_b.is_some());
    connect(&a, &qa, &b, &qb);
    let src = Buf::new(&a, 8192);
    let dst = Buf::new(&b, 8192);
    // The producer indices move before the upgrade.
    for n in 0..5u64 {
        src.write(0, &n.to_ne_bytes());
        qa.post_send(&[wr(n, write_op(&dst, 0), &[src.sge(0, 8)])])
            .unwrap();
        ok(&poll_one(&cqa), n, WcOpcode::RDMA_WRITE);
        assert_eq!(dst.read(0, 8), n.to_ne_bytes());
    }
    // Receives posted before (their producer index in the slot), taken
    // after.
    for n in 0..3u64 {
        qb.post_recv(&[RecvWr {
            wr_id: 50 + n,
            sg_list: &[dst.sge(4096 + 64 * n as usize, 64)],
        }])
        .unwrap();
    }

    let mut new = Daemon::spawn(&dir, &socks, true);
    handed_over(&mut old, &mut new);

    src.write(0, b"after the move!");
    for n in 0..3u64 {
        qa.post_send(&[wr(100 + n, SendOp::Send, &[src.sge(0, 15)])])
            .unwrap();
        ok(&poll_one(&cqa), 100 + n, WcOpcode::SEND);
        ok(&poll_one(&cqb), 50 + n, WcOpcode::RECV);
        assert_eq!(dst.read(4096 + 64 * n as usize, 15), b"after the move!");
    }
    qa.post_send(&[wr(200, write_op(&dst, 1024), &[src.sge(0, 15)])])
        .unwrap();
    ok(&poll_one(&cqa), 200, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(1024, 15), b"after the move!");
    assert_eq!((qa.doorbell_slot(), qb.doorbell_slot()), (slot_a, slot_b));
    // The guests' mappings stayed: nothing was mapped again.
    for w in [&wa, &wb] {
        assert_eq!((w.map_count(), w.map_requests()), (1, 1));
        assert_eq!(w.violations(), Vec::<String>::new());
    }
    // A new context gets a page of its own, and its queues slots.
    let a2 = Device::open(a.t.clone()).unwrap();
    let page_a2 = a2.doorbell_page();
    assert!(page_a2.is_some() && page_a2 != page_a);
    let pd2 = virtio_rdma_driver::Pd::alloc(&a2).unwrap();
    let cq2 = Cq::create(&a2, 16).unwrap();
    let q2 = Qp::create(&pd2, &virtio_rdma_driver::QpInit::rc(&cq2)).unwrap();
    assert!(q2.doorbell_slot().is_some());
    drop((q2, cq2, pd2, a2));

    // Again, to a third daemon.
    wait_for(&dir.join("handover.sock"), &mut new);
    let mut newer = Daemon::spawn(&dir, &socks, true);
    handed_over(&mut new, &mut newer);
    qa.post_send(&[wr(300, write_op(&dst, 2048), &[src.sge(0, 15)])])
        .unwrap();
    ok(&poll_one(&cqa), 300, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(2048, 15), b"after the move!");
    assert_eq!(wa.map_requests(), 1);
    assert!(newer.alive());
    drop((qa, qb, src, dst, cqa, cqb, a, b));
    drop(newer);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_successor_that_cannot_take_over_leaves_the_running_daemon_serving() {
    let dir = temp_dir("refused");
    let mut old = Daemon::spawn(&dir, &["a.sock", "b.sock"], false);
    wait_for(&dir.join("handover.sock"), &mut old);
    let a = Vm::open_path(&dir.join("a.sock"), VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let src = Buf::new(&a, 8192);
    let dst = Buf::new(&a, 8192);
    // A successor configured with other VMs: refused before anything moved.
    let mut other = Daemon::spawn(&dir, &["a.sock"], true);
    let status = other.wait();
    assert!(!status.success(), "a successor with other VMs took over");
    assert!(old.alive(), "the running daemon stopped");
    // One whose VM B has another MAC (what the guest pairs its port with).
    let mut other = Daemon::spawn_with(
        &dir,
        &["a.sock", "b.sock"],
        true,
        &["--mac", "vm1=52:54:00:00:00:09"],
    );
    assert!(
        !other.wait().success(),
        "a successor with another MAC took over"
    );
    assert!(old.alive(), "the running daemon stopped");
    src.write(0, b"still served");
    q1.post_send(&[wr(1, write_op(&dst, 0), &[src.sge(0, 12)])])
        .unwrap();
    ok(&poll_one(&cq), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 12), b"still served");
    drop((q1, q2, src, dst, cq, a));
    drop(old);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One message of the hand-over protocol, as a successor writes it.
fn wire_message(json: &str) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&u32::try_from(json.len()).unwrap().to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(json.as_bytes());
    m
}

/// A successor that stops midway, after the running daemon stopped every
/// VM and sent it all, and one that sends garbage: each time the running
/// daemon resumes every VM where it stopped and serves on.
#[test]
fn a_successor_that_fails_midway_or_talks_garbage_changes_nothing() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let dir = temp_dir("midway");
    let mut old = Daemon::spawn(&dir, &["a.sock", "b.sock"], false);
    wait_for(&dir.join("handover.sock"), &mut old);
    let Pair {
        qa,
        qb,
        src,
        dst,
        cqa,
        cqb,
        a,
        b,
    } = Pair::open(&dir);
    qb.post_recv(&[RecvWr {
        wr_id: 70,
        sg_list: &[dst.sge(4096, 64)],
    }])
    .unwrap();
    let sock = dir.join("handover.sock");

    // Hello, read the VMs as they come, then hang up before Ready.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&wire_message(r#"{"Hello":{"version":1}}"#))
        .unwrap();
    let mut first = [0u8; 8];
    s.read_exact(&mut first).unwrap();
    drop(s);
    // Garbage: a length far past any bound, then bytes that are no JSON.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&[0xff; 8]).unwrap();
    drop(s);
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&wire_message("{not json")).unwrap();
    drop(s);
    // A successor of another protocol version.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&wire_message(r#"{"Hello":{"version":99}}"#))
        .unwrap();
    let _ = s.read(&mut first);
    drop(s);

    assert!(old.alive(), "the running daemon stopped");
    src.write(0, b"still served");
    qa.post_send(&[
        wr(1, write_op(&dst, 0), &[src.sge(0, 12)]),
        wr(2, SendOp::Send, &[src.sge(0, 12)]),
    ])
    .unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    ok(&poll_one(&cqb), 70, WcOpcode::RECV);
    assert_eq!(dst.read(0, 12), b"still served");
    assert_eq!(dst.read(4096, 12), b"still served");
    // And a real successor still takes over afterwards.
    let mut new = Daemon::spawn(&dir, &["a.sock", "b.sock"], true);
    assert!(old.wait().success());
    qa.post_send(&[wr(3, write_op(&dst, 1024), &[src.sge(0, 12)])])
        .unwrap();
    ok(&poll_one(&cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(1024, 12), b"still served");
    assert!(new.alive());
    drop((qa, qb, src, dst, cqa, cqb, a, b));
    drop(new);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `systemctl reload` (SIGUSR2): the daemon starts its successor itself,
/// which takes the VMs over; the service manager (`NOTIFY_SOCKET`,
/// systemd's `Type=notify`, played here) hears that the successor is the
/// main process from the old one **before it exits** (`MAINPID=` and
/// `BARRIER=1`, which it waits for; systemd that sees the main process
/// exit first stops the service and kills the successor: seen under a real
/// systemd, scripts/qemu-package.sh) and from the successor once it
/// serves; the old one exits 0.
#[test]
fn sigusr2_starts_a_successor_that_tells_the_service_manager_it_is_the_daemon() {
    use std::os::unix::net::UnixDatagram;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let dir = temp_dir("usr2");
    let notify = UnixDatagram::bind(dir.join("notify.sock")).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(600)))
        .unwrap();
    // A notification and the descriptor that came with it (BARRIER=1's).
    let next_with_fd = || {
        let mut buf = [0u8; 256];
        let (n, fd) = notify.recv_with_fd(&mut buf).expect("a notification");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), fd)
    };
    let next = || next_with_fd().0;
    let mut cmd = Command::new(daemon_binary());
    cmd.arg("--socket-path")
        .arg(dir.join("a.sock"))
        .arg("--handover-socket")
        .arg(dir.join("handover.sock"))
        .env("NOTIFY_SOCKET", dir.join("notify.sock"));
    let mut old = Daemon(cmd.spawn().unwrap());
    assert_eq!(next(), "READY=1");
    let a = Vm::open_path(&dir.join("a.sock"), VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let buf = Buf::new(&a, 8192);
    buf.write(0, b"reloaded");

    let old_pid = old.0.id();
    let pid_t = libc::pid_t::try_from(old_pid).unwrap();
    // SAFETY: kill(2) on a child process of this test.
    let r = unsafe { libc::kill(pid_t, libc::SIGUSR2) };
    assert_eq!(r, 0);
    // The two processes' messages, interleaved in whatever order they
    // come: the old one's MAINPID= then BARRIER=1, the successor's
    // MAINPID= with READY=1 (which may come between the old one's two).
    let (mut from_old, mut from_new, mut barrier) = (None, None, false);
    // Killed if the test fails from here on: not this test's child, the
    // successor would live on holding the test's stdout (a test.sh that
    // pipes it would wait for it for ever).
    let mut successor = Stray(None);
    while from_old.is_none() || from_new.is_none() || !barrier {
        let (said, fd) = next_with_fd();
        if said == "BARRIER=1" {
            assert!(fd.is_some(), "BARRIER=1 without its pipe");
            assert!(
                from_old.is_some(),
                "BARRIER=1 before the old daemon's MAINPID="
            );
            // The old daemon waits for the barrier: it has not exited.
            assert!(
                old.0.try_wait().unwrap().is_none(),
                "the old daemon exited before the manager confirmed MAINPID={from_old:?}"
            );
            drop(fd);
            barrier = true;
            continue;
        }
        assert!(fd.is_none(), "{said:?} came with a descriptor");
        if let Some(p) = said
            .strip_prefix("MAINPID=")
            .and_then(|r| r.strip_suffix("\nREADY=1"))
        {
            from_new = Some(p.parse::<u32>().unwrap());
            successor.0 = from_new;
        } else if let Some(p) = said.strip_prefix("MAINPID=") {
            assert!(!barrier, "MAINPID={p} after the barrier");
            from_old = Some(p.parse::<u32>().unwrap());
            successor.0 = from_old;
        } else {
            panic!("unexpected notification {said:?}");
        }
    }
    let pid = from_new.unwrap();
    assert_eq!(from_old, Some(pid), "both name the successor");
    assert_ne!(pid, old_pid);
    assert!(old.wait().success());
    q1.post_send(&[wr(1, write_op(&buf, 4096), &[buf.sge(0, 8)])])
        .unwrap();
    ok(&poll_one(&cq), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(buf.read(4096, 8), b"reloaded");
    drop((q1, q2, buf, cq, a));
    // The successor is not this test's child: stop it and wait until its
    // socket is gone (it removes it when it stops).
    let pid_t = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) on the successor's pid, which it just told us.
    let r = unsafe { libc::kill(pid_t, libc::SIGTERM) };
    assert_eq!(r, 0);
    assert_eq!(next(), "STOPPING=1");
    let start = Instant::now();
    while dir.join("a.sock").exists() && start.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(10));
    }
    successor.0 = None;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon process that is not this test's child, killed when dropped
/// (a failing test unwinds through it).
struct Stray(Option<u32>);

impl Drop for Stray {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) on the pid the daemon announced; no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
