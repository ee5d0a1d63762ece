#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Several engine threads (`engine_threads`), through the real vhost-user
//! socket: each tenant's VMs are served by their own thread, a VM's lock
//! held elsewhere holds up no other VM, a QoS change is in
//! force on every thread when `sync_qos` returns, and a departing VM fails
//! its peers' QPs as with one thread.
//!
//! Two tenants: "default" (VMs 0 and 1) on thread 0, "red" (VMs 2 and 3)
//! on thread 1.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma_tests::dp::{
    conn, ok, open, poll_n, poll_one, post_writes, rc_pair, wr, write_and_send_back, write_op, Buf,
    Pair, Vm, QP_ACCESS, WAIT,
};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{SendOp, SendWr};

/// How long a VM's lock is held at most to stall its engine thread
/// (released earlier once the other tenant's round trips are done).
const STALL: Duration = Duration::from_secs(60);
/// Round trips of the other tenant during a stall.
const TRIPS: u64 = 20;

fn daemon(threads: usize) -> TestDaemon {
    TestDaemon::with_config(4, |c| {
        c.engine_threads = threads;
        add_tenant(c, "red", &[2, 3]);
    })
    .unwrap()
}

#[test]
fn each_tenant_runs_on_its_own_thread() {
    let d = daemon(2);
    let view = d.daemon().view();
    let placement: Vec<usize> = (0..4).map(|v| view.engine_of(v)).collect();
    assert_eq!(placement, [0, 0, 1, 1]);
    // A thread names itself once it runs: wait for both names.
    let both = |names: &[String]| {
        names.iter().any(|n| n == "rnic-engine0") && names.iter().any(|n| n == "rnic-engine1")
    };
    let start = Instant::now();
    let mut names = engine_thread_names();
    while !both(&names) && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
        names = engine_thread_names();
    }
    assert!(both(&names), "{names:?}");

    let vms: Vec<Vm> = (0..4).map(|i| open(&d, i)).collect();
    let blue = rc_pair(&vms[0], &vms[1]);
    let red = rc_pair(&vms[2], &vms[3]);
    let (bs, bd) = (Buf::new(&vms[0], 8192), Buf::new(&vms[1], 8192));
    let (rs, rd) = (Buf::new(&vms[2], 8192), Buf::new(&vms[3], 8192));
    // Different amounts on each side, so the per-thread counters tell
    // whose work each thread did.
    for i in 0..3 {
        write_and_send_back(&blue, &bs, &bd, &[i as u8; 100], 4096, i);
    }
    for i in 0..5 {
        write_and_send_back(&red, &rs, &rd, &[i as u8; 300], 4096, i);
    }
    let e = d.daemon().engines().stats();
    assert_eq!(e.len(), 2);
    // Each round trip: one WRITE and one SEND.
    assert_eq!((e[0].vms, e[0].wqes, e[0].bytes), (2, 6, 600));
    assert_eq!((e[1].vms, e[1].wqes, e[1].bytes), (2, 10, 3000));
}

/// The names of this process's threads that belong to the engine.
fn engine_thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("rnic-engine"))
        .collect()
}

/// Holds VM 0's lock while VM 0 has work (the engine must not block on
/// it), and meanwhile runs [`TRIPS`] round trips between VMs 2 and 3; the
/// lock is released once they are done, or after [`STALL`] at the latest.
/// Returns whether the round trips finished while the lock was held.
fn stall_vm0_and_run_red(d: &TestDaemon) -> bool {
    let vms: Vec<Vm> = (0..4).map(|i| open(d, i)).collect();
    let blue = rc_pair(&vms[0], &vms[1]);
    let red = rc_pair(&vms[2], &vms[3]);
    let (bs, bd) = (Buf::new(&vms[0], 4096), Buf::new(&vms[1], 4096));
    let (rs, rd) = (Buf::new(&vms[2], 8192), Buf::new(&vms[3], 8192));
    let dev0 = d.daemon().device(0).unwrap().clone();
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        dev0.cell()
            .with_dataplane(|_, _| {
                locked_tx.send(()).unwrap();
                // Released by the round trips' end, not by a clock: a
                // loaded machine makes them slow, not wrong.
                release_rx.recv_timeout(STALL).is_ok()
            })
            .unwrap()
    });
    locked_rx.recv().unwrap();
    // VM 0 has work: its thread locks VM 0 and waits there.
    post_writes(&blue, &bs, &bd, 64, 1, 1);
    for i in 0..TRIPS {
        write_and_send_back(&red, &rs, &rd, &[i as u8; 256], 4096, i);
    }
    // Fails to arrive if the holder gave up waiting (the lock is free).
    let _ = release_tx.send(());
    let held_throughout = holder.join().unwrap();
    // VM 0's work runs once the lock is free.
    ok(&poll_one(&blue.cqa), 1, WcOpcode::RDMA_WRITE);
    held_throughout
}

/// A VM's lock held elsewhere (its control path busy with a long command)
/// holds up neither another thread's tenants nor — the engine only ever
/// tries a VM's lock and comes back later — the other VMs of its own
/// thread. (With one thread, red's round trips used to wait for the lock.)
#[test]
fn a_held_vm_lock_does_not_hold_up_other_vms() {
    for threads in [2, 1] {
        assert!(
            stall_vm0_and_run_red(&daemon(threads)),
            "{threads} thread(s): red's round trips waited for VM 0's lock (held for {STALL:?})"
        );
    }
}

/// `set_vm_qos` returns once both threads enforce the change: the limit on
/// a VM of thread 1 paces its very next work requests, and lifting it
/// releases the rest at once.
#[test]
fn qos_changes_are_in_force_on_every_thread() {
    let d = daemon(2);
    let vms: Vec<Vm> = (0..4).map(|i| open(&d, i)).collect();
    let red = rc_pair(&vms[2], &vms[3]);
    let (src, dst) = (Buf::new(&vms[2], 4096), Buf::new(&vms[3], 4096));
    let limited = QosSpec {
        ops_per_sec: 100,
        ..QosSpec::default()
    };
    for round in 0..3u64 {
        d.set_vm_qos(2, limited).unwrap();
        const K: u64 = 20;
        let t0 = Instant::now();
        let sg = [src.sge(0, 64)];
        let op = write_op(&dst, 0);
        let wrs: Vec<SendWr<'_>> = (0..K).map(|i| wr(round * 100 + i, op, &sg)).collect();
        red.qa.post_send(&wrs).unwrap();
        let wcs = poll_n(&red.cqa, K as usize);
        let took = t0.elapsed().as_secs_f64();
        for (i, wc) in wcs.iter().enumerate() {
            ok(wc, round * 100 + i as u64, WcOpcode::RDMA_WRITE);
        }
        // A burst of at most 2, then 100/s (20 % slack for the clock).
        let floor = (K - 2) as f64 / 100.0 * 0.8;
        assert!(took >= floor, "round {round}: {K} WRITEs took {took} s");
        d.set_vm_qos(2, QosSpec::default()).unwrap();
    }
}

/// A VM that resets fails the connected QPs of its tenant's other VM (on
/// the same thread), and the other thread's tenant is untouched.
#[test]
fn a_departing_vm_fails_its_peers_with_two_threads() {
    let d = daemon(2);
    let vms: Vec<Vm> = (0..4).map(|i| open(&d, i)).collect();
    let blue = rc_pair(&vms[0], &vms[1]);
    let red = rc_pair(&vms[2], &vms[3]);
    vms[3].t.vmm().reset().unwrap();
    let deadline = Instant::now() + WAIT;
    while red.qa.query().unwrap().attr.qp_state != u32::from(QpState::ERR) {
        assert!(Instant::now() < deadline, "VM 2's QP did not fail");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Work posted to the failed QP is flushed.
    let src = Buf::new(&vms[2], 4096);
    red.qa
        .post_send(&[wr(9, SendOp::Send, &[src.sge(0, 8)])])
        .unwrap();
    let wc = poll_one(&red.cqa);
    assert_eq!((wc.wr_id, wc.status()), (9, Some(WcStatus::WR_FLUSH_ERR)));
    // Blue, on the other thread, carries on.
    assert_eq!(
        blue.qa.query().unwrap().attr.qp_state,
        u32::from(QpState::RTS)
    );
    let (bs, bd) = (Buf::new(&vms[0], 8192), Buf::new(&vms[1], 8192));
    write_and_send_back(&blue, &bs, &bd, b"still here", 4096, 1);
    assert_eq!(d.stats(3).device.resources.qp, 0);
}

/// The engine thread's park count.
fn parks(d: &TestDaemon) -> u64 {
    d.daemon().engines().stats()[0].parks
}

/// Waits until the engine thread has parked since `before`.
fn wait_parked(d: &TestDaemon, before: u64) {
    let deadline = Instant::now() + WAIT;
    while parks(d) <= before {
        assert!(Instant::now() < deadline, "the engine never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// VMs 0 and 1 of `d`, an RC pair between them and a 4 KiB buffer on each
/// (the source on VM 0).
fn writer_pair(d: &TestDaemon) -> (Vm, Vm, Pair, Buf, Buf) {
    let (a, b) = (open(d, 0), open(d, 1));
    let p = rc_pair(&a, &b);
    let (src, dst) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    (a, b, p, src, dst)
}

/// Control commands wake a sleeping engine only when they may have made
/// work startable (a QP state change), not for every object created: a
/// VM creating QPs costs the engine nothing. A QP connected while the
/// engine sleeps still has its first post served at once (the connect
/// wakes the engine, which arms the new QP's kicks before it sleeps
/// again).
#[test]
fn control_commands_wake_the_engine_only_for_state_changes() {
    use virtio_rdma_driver::Cq;
    let d = TestDaemon::start(2).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let p0 = parks(&d);
    std::thread::sleep(Duration::from_millis(5));
    wait_parked(&d, p0);
    // 100 CQs and 100 QPs left in RESET: no wake-up each.
    let p1 = parks(&d);
    let cq = Cq::create(&a.dev, 16).unwrap();
    let qps: Vec<_> = (0..100)
        .map(|_| vhost_user_rdma_tests::dp::rc_qp(&a, &cq))
        .collect();
    let woke = parks(&d) - p1;
    // Some parks come from the 50 ms park limit; a wake-up per command
    // would be 100 or more.
    assert!(woke < 50, "{woke} wake-ups for 100 QPs created");
    drop(qps);
    // 100 QPs connected up to RTS with nothing posted: no wake-up each
    // either.
    let p2 = parks(&d);
    let pairs: Vec<_> = (0..50).map(|_| rc_pair(&a, &b)).collect();
    let woke = parks(&d) - p2;
    assert!(woke < 50, "{woke} wake-ups for 100 QPs connected");
    drop(pairs);

    // A WRITE posted in RTR, while the engine sleeps, starts when its QP
    // enters RTS (spec 18.22): that transition wakes the engine.
    let mut took = Vec::new();
    for i in 0..5u64 {
        let (cqa, cqb) = (
            Cq::create(&a.dev, 16).unwrap(),
            Cq::create(&b.dev, 16).unwrap(),
        );
        let qa = vhost_user_rdma_tests::dp::rc_qp(&a, &cqa);
        let qb = vhost_user_rdma_tests::dp::rc_qp(&b, &cqb);
        qb.rc_connect(QP_ACCESS, &conn(&qa, &a)).unwrap();
        let c = conn(&qb, &b);
        qa.rc_to_init(QP_ACCESS).unwrap();
        qa.rc_to_rtr(&c).unwrap();
        let p = Pair { cqa, cqb, qa, qb };
        let (src, dst) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
        post_writes(&p, &src, &dst, 64, i, 1);
        let before = parks(&d);
        wait_parked(&d, before);
        let mut wc = [virtio_rdma_driver::WorkCompletion::default()];
        assert_eq!(p.cqa.poll(&mut wc), 0, "a WRITE ran in RTR");
        let t0 = Instant::now();
        p.qa.rc_to_rts(&c).unwrap();
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        took.push(t0.elapsed());
    }
    took.sort();
    // A lost wake-up shows as the 50 ms park limit.
    assert!(
        took[2] < Duration::from_millis(25),
        "WRITEs posted in RTR took {took:?} after RTS"
    );

    // Connect while the engine sleeps, then post: served at once.
    let mut took = Vec::new();
    for i in 0..5u64 {
        let before = parks(&d);
        wait_parked(&d, before);
        let p = rc_pair(&a, &b);
        let (src, dst) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
        let t0 = Instant::now();
        post_writes(&p, &src, &dst, 64, i, 1);
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        took.push(t0.elapsed());
    }
    took.sort();
    // A lost wake-up shows as the 50 ms park limit.
    assert!(
        took[2] < Duration::from_millis(25),
        "first posts after a connect took {took:?}"
    );
}

/// A parked VM whose notifications never reach the device (a VMM that
/// drops them, or one so starved of CPU that they come arbitrarily late)
/// still has its work served: after a sleep the engine re-checks its
/// parked VMs, at most every 50 ms, and counts each find in `late_kicks`.
/// Without the re-check the WRITEs below wait for good.
#[test]
fn a_parked_vm_whose_notifications_never_come_is_still_served() {
    let d = TestDaemon::start(2).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (held, served) = write_unnotified(&d, &a, &b);
    assert!(held >= 3, "{held} notifications held back");
    let late = served.late_kicks;
    assert!(late >= 3, "{late} late kicks counted");
}

/// The same while two other VMs keep the engine's sleeps short (a SEND
/// that the receiver, with no receive posted, answers with RNR NAKs,
/// retried without end): each unnotified WRITE is still found, by the
/// re-check or by a peek between the retries.
#[test]
fn short_sleeps_do_not_keep_an_unnotified_parked_vm_waiting() {
    let d = TestDaemon::start(4).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (c, e) = (open(&d, 2), open(&d, 3));
    let rnr = rc_pair(&c, &e);
    let cs = Buf::new(&c, 64);
    rnr.qa
        .post_send(&[SendWr::signaled(99, SendOp::Send, &[cs.sge(0, 64)])])
        .unwrap();
    let (t0, parks0) = (Instant::now(), parks(&d));
    let (held, served) = write_unnotified(&d, &a, &b);
    let (slept, elapsed) = (parks(&d) - parks0, t0.elapsed());
    assert!(held >= 3, "{held} notifications held back");
    let found = served.late_kicks + served.peeked;
    assert!(found >= 3, "{served:?}");
    // The retries cut the sleeps: far more of them than 50 ms periods.
    let periods = elapsed.as_millis() / 50 + 1;
    assert!(
        u128::from(slept) > 4 * periods,
        "{slept} sleeps in {elapsed:?}: the RNR retries did not keep them short"
    );
    let mut wc = [virtio_rdma_driver::WorkCompletion::default()];
    assert_eq!(rnr.cqa.poll(&mut wc), 0, "the RNR-retried SEND completed");
}

/// A VM held back by its rate limit waits parked for its deadline, not
/// for a notification: when the engine wakes at that deadline, its re-check
/// must leave the VM to the sweep that serves it, and not count its work as
/// a kick that came late (found by the qos lab: 20 "late kicks" a second
/// next to an ops limit).
#[test]
fn a_rate_limited_vm_waiting_for_its_deadline_is_not_a_late_kick() {
    let d = TestDaemon::start(2).unwrap();
    let (_a, _b, p, src, dst) = writer_pair(&d);
    // 20 WRITEs a second, in bursts of one: each waits ~50 ms for its
    // token, asleep in the engine (longer than the re-check's period).
    d.set_vm_qos(
        0,
        QosSpec {
            ops_per_sec: 20,
            ..QosSpec::default()
        },
    )
    .unwrap();
    let before = d.daemon().engines().stats()[0];
    post_writes(&p, &src, &dst, 64, 0, 12);
    let got = poll_n(&p.cqa, 12);
    for (i, c) in got.iter().enumerate() {
        ok(c, i as u64, WcOpcode::RDMA_WRITE);
    }
    let after = d.daemon().engines().stats()[0];
    assert!(
        after.parks > before.parks + 5,
        "{before:?} {after:?}: the engine did not sleep"
    );
    assert_eq!(
        after.late_kicks, before.late_kicks,
        "the rate limit's waits were counted as late kicks"
    );
}

/// Three RDMA WRITEs from VM `a` to VM `b`, each posted once the engine
/// slept, with `a`'s notifications held back; returns the notifications
/// held and the engine's counters after them.
fn write_unnotified(d: &TestDaemon, a: &Vm, b: &Vm) -> (u64, vhost_user_rdma::engine::EngineStats) {
    let p = rc_pair(a, b);
    let (src, dst) = (Buf::new(a, 4096), Buf::new(b, 4096));
    a.t.hold_notifications(true).unwrap();
    for i in 0..3u64 {
        let before = parks(d);
        wait_parked(d, before);
        post_writes(&p, &src, &dst, 64, i, 1);
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
    }
    let held = a.t.held_notifications();
    a.t.hold_notifications(false).unwrap();
    (held, d.daemon().engines().stats()[0])
}

/// The engine thread's polling window now, µs.
fn poll_window(d: &TestDaemon) -> u64 {
    d.daemon().engines().stats()[0].poll_window_us
}

/// The polling window of a pinned engine thread adapts to the traffic
/// (`engine/poll_window.rs`):
/// WRITEs a few milliseconds apart, which no polling reaches, shrink it to
/// the 20 µs spin, so that a sporadic sender's engine stops spending
/// 200 µs of CPU after each; WRITEs posted right after the engine parked,
/// which a longer window would have caught, grow it back. Each WRITE
/// completes either way.
#[test]
fn the_polling_window_shrinks_for_a_sporadic_sender_and_grows_for_a_quick_one() {
    // Only a thread with a CPU of its own adapts its window: pinned to
    // the CPU this test runs on (one the process may use).
    // SAFETY: no arguments; returns the CPU or -1.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
    let d = TestDaemon::with_config(2, |c| c.engine_cpus = vec![cpu]).unwrap();
    let (_a, _b, p, src, dst) = writer_pair(&d);
    let mut n = 0u64;
    let mut write = || {
        n += 1;
        p.qa.post_send(&[wr(n, write_op(&dst, 0), &[src.sge(0, 64)])])
            .unwrap();
        ok(&poll_one(&p.cqa), n, WcOpcode::RDMA_WRITE);
    };
    assert_eq!(poll_window(&d), 200, "the window starts at its longest");
    let mut sporadic = 0;
    while poll_window(&d) > 20 {
        write();
        std::thread::sleep(Duration::from_millis(3));
        sporadic += 1;
        assert!(sporadic < 1_000, "still {} µs", poll_window(&d));
    }
    // Quick: the next WRITE as soon as the engine parked after the last
    // (20 µs later): each gap is well within 200 µs, unless the machine
    // is so loaded that this thread misses it; then try again.
    let mut quick = 0;
    while poll_window(&d) <= 20 {
        let before = parks(&d);
        write();
        while parks(&d) == before {
            std::hint::spin_loop();
        }
        write();
        quick += 1;
        assert!(quick < 10_000, "the window never grew");
    }
    println!(
        "POLL-WINDOW: 20 µs after {sporadic} WRITEs 3 ms apart, {} µs after {quick} quick ones",
        poll_window(&d)
    );
}

/// A VM's doorbells are served on their notifications while its control
/// queue's worker waits for the VM's control rate limit: the notification
/// queue's kicks go to the engine thread itself, not through that worker
/// (`engine/kicks.rs`). Each WRITE, posted once the engine slept, is
/// counted as notified before it completes; had the kick waited behind the
/// sleeping worker, the engine's re-check would have found it (a late
/// kick) with no notification counted.
#[test]
fn kicks_are_not_held_up_by_a_rate_limited_control_queue() {
    const WRITES: u64 = 5;
    let d = TestDaemon::start(2).unwrap();
    let (a, _b, p, src, dst) = writer_pair(&d);
    d.set_vm_qos(
        0,
        QosSpec {
            ctrl_per_sec: 1,
            ..QosSpec::default()
        },
    )
    .unwrap();
    let done = AtomicBool::new(false);
    let late = std::thread::scope(|s| {
        // Ends the control thread however this one leaves the scope.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Release);
            }
        }
        let _done = Done(&done);
        // One command a second: this thread's commands keep the worker
        // asleep in its rate wait until the limit is lifted below.
        let ctrl = s.spawn(|| {
            while !done.load(Acquire) {
                a.dev.query_port().unwrap();
            }
        });
        // Until the worker waits for tokens (the second command).
        let deadline = Instant::now() + WAIT;
        while d.traffic(0).ctrl_cmds < 2 {
            assert!(Instant::now() < deadline, "no control command ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        let late0 = d.daemon().engines().stats()[0].late_kicks;
        for i in 0..WRITES {
            let (before, notified) = (parks(&d), d.traffic(0).notifications);
            wait_parked(&d, before);
            post_writes(&p, &src, &dst, 64, i, 1);
            ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
            assert!(
                d.traffic(0).notifications > notified,
                "WRITE {i} completed without its notification counted"
            );
        }
        let late = d.daemon().engines().stats()[0].late_kicks - late0;
        done.store(true, Release);
        d.set_vm_qos(0, QosSpec::default()).unwrap();
        ctrl.join().unwrap();
        late
    });
    println!("KICKS: {WRITES} WRITEs notified, {late} late kicks");
    // A doorbell rung between two parks can still be found by a re-check
    // before its kick is read (a busy machine's timing); not every one.
    assert!(late < WRITES, "{late} of {WRITES} WRITEs found late");
}

/// A VM whose kick comes while the engine still polls after another VM's
/// work is served at once: the thread takes the kick while it polls, and
/// must sweep for it rather than go to sleep with it taken (until its
/// sleep's 50 ms limit). Each round lets the engine sleep, wakes it with
/// a WRITE of VM 0, then posts a SEND of VM 1, parked with the thread,
/// 0 to 36 µs later, and times its wait.
#[test]
fn a_kick_taken_while_the_engine_polls_is_served_before_it_sleeps() {
    const ROUNDS: usize = 100;
    let d = TestDaemon::start(2).unwrap();
    let (_a, _b, p, src, dst) = writer_pair(&d);
    let mut waits = Vec::new();
    for i in 0..ROUNDS as u64 {
        wait_parked(&d, parks(&d));
        post_writes(&p, &src, &dst, 64, i, 1);
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        p.qa.post_recv(&[virtio_rdma_driver::RecvWr {
            wr_id: i,
            sg_list: &[src.sge(0, 64)],
        }])
        .unwrap();
        // Posted at different moments of the thread's polling (20 µs
        // once sporadic rounds have shrunk it), its end among them.
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(4 * (i % 10)) {
            std::hint::spin_loop();
        }
        p.qb.post_send(&[wr(i, SendOp::Send, &[dst.sge(0, 64)])])
            .unwrap();
        ok(&poll_one(&p.cqb), i, WcOpcode::SEND);
        waits.push(t.elapsed());
        ok(&poll_one(&p.cqa), i, WcOpcode::RECV);
    }
    waits.sort_unstable();
    // A kick left to the sleep's limit costs its SEND ~50 ms, in about one
    // round of twenty (when the kick is taken just as the thread gives up
    // polling); a busy machine may delay one SEND that long, not several.
    let slow = waits
        .iter()
        .filter(|w| **w >= Duration::from_millis(45))
        .count();
    println!(
        "KICK-WHILE-POLLING: SEND waits median {:?}, max {:?}, {slow} of {ROUNDS} of 45 ms or more",
        waits[ROUNDS / 2],
        waits[ROUNDS - 1]
    );
    assert!(
        slow <= 1,
        "{slow} of {ROUNDS} SENDs waited 45 ms or more: {waits:?}"
    );
}

/// An engine thread that shares its CPU (not pinned) polls for 20 µs after
/// work and parks, whatever the traffic: quick WRITEs that would grow a
/// pinned thread's window leave it at 20 µs, and each still completes.
#[test]
fn a_thread_sharing_its_cpu_polls_only_briefly_after_work() {
    let d = TestDaemon::start(2).unwrap();
    let (_a, _b, p, src, dst) = writer_pair(&d);
    assert_eq!(poll_window(&d), 20);
    for i in 0..50u64 {
        let before = parks(&d);
        p.qa.post_send(&[wr(i, write_op(&dst, 0), &[src.sge(0, 64)])])
            .unwrap();
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        wait_parked(&d, before);
    }
    assert_eq!(poll_window(&d), 20, "the window of a shared CPU adapted");
}
