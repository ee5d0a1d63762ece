#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Tenant isolation, tried to be broken through the real vhost-user socket:
//! a daemon with two tenants ("default": VMs 0 and 1, "red": VMs 2 and 3),
//! guests that connect RC QPs to and create AHs for the other tenant's
//! real QPNs and GIDs, send UD messages across, guess rkeys and spoof the
//! source GID; the per-VM quotas and control-command limits. Every refusal
//! is checked both in what the guest sees (status, completion, untouched
//! memory) and in the VM's isolation counters, read from the daemon.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma::tenancy::IsolationStats;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{
    ah, assert_quiet_for, conn, fast, ok, open, pattern, poll_one, rc_qp, status, ud_qp, wr,
    write_op, Buf, GUARD, QKEY, QP_ACCESS,
};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use vhost_user_rdma_tests::verbs::Verbs;
use virtio_rdma_abi::ctrl::{quota, Opcode, Status, DETAIL_NONE};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{AddressVector, QpState};
use virtio_rdma_abi::verbs::DeviceAttr;
use virtio_rdma_abi::Field;
use virtio_rdma_driver::{
    Ah, Cq, Mr, Qp, QpAttrs, QpInit, RcConnect, RecvWr, SendOp, SendWr, UdDest,
};

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(100);

/// VMs 0, 1 in tenant "default"; VMs 2, 3 in tenant "red".
fn two_tenants() -> TestDaemon {
    two_tenants_with(|_| {})
}

fn two_tenants_with(more: impl FnOnce(&mut vhost_user_rdma::DaemonConfig)) -> TestDaemon {
    TestDaemon::with_config(4, |c| {
        add_tenant(c, "red", &[2, 3]);
        more(c);
    })
    .unwrap()
}

fn iso(d: &TestDaemon, i: usize) -> IsolationStats {
    d.isolation(i)
}

// ---------------------------------------------------------------------------
// Control path

#[test]
fn rc_connect_to_another_tenant_is_denied_and_same_tenant_works() {
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let (cqa, cqb, cqr) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
        Cq::create(&red.dev, 64).unwrap(),
    );
    let (qa, qb, qr) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb), rc_qp(&red, &cqr));
    assert_ne!(a.dev.gid(), red.dev.gid());

    // The other tenant's real QPN at its real GID: DENIED at RTR, nothing
    // changed (the QP stays in INIT without a destination).
    qa.rc_to_init(QP_ACCESS).unwrap();
    let r = qa.rc_to_rtr(&conn(&qr, &red));
    assert_eq!(status(r), (Status::DENIED, DETAIL_NONE));
    let q = qa.query().unwrap();
    assert_eq!(q.attr.qp_state, u32::from(QpState::INIT));
    assert_eq!((q.attr.dest_qpn, q.attr.av.dgid), (0, [0; 16]));
    assert_eq!(iso(&d, 0).denied, 1);

    // A GID nobody has gets the same answer (no oracle for other tenants).
    let r = qa.rc_to_rtr(&RcConnect::new(qb.qpn(), [7; 16]));
    assert_eq!(status(r), (Status::DENIED, DETAIL_NONE));
    // A same-tenant GID with a QPN of a different same-tenant VM (here A's
    // own QP): contradictory, DENIED.
    let other = rc_qp(&a, &cqa);
    let r = qa.rc_to_rtr(&RcConnect::new(other.qpn(), b.dev.gid()));
    assert_eq!(status(r), (Status::DENIED, DETAIL_NONE));
    assert_eq!(iso(&d, 0).denied, 3);

    // The other tenant sees nothing of it.
    assert_eq!(iso(&d, 2), IsolationStats::default());
    assert_eq!(qr.query().unwrap().attr.qp_state, u32::from(QpState::RESET));

    // The same tenant: connects, and data flows both ways.
    qa.rc_to_rtr(&conn(&qb, &b)).unwrap();
    qa.rc_to_rts(&conn(&qb, &b)).unwrap();
    qb.rc_connect(QP_ACCESS, &conn(&qa, &a)).unwrap();
    let (src, dst) = (Buf::new(&a, 4096), Buf::guarded(&b, 4096));
    let data = pattern(4096, 1);
    src.write(0, &data);
    let sg = [src.sge(0, 4096)];
    let op = write_op(&dst, 0);
    qa.post_send(&[wr(1, op, &sg)]).unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 4096), data);
    let back = Buf::new(&a, 64);
    qa.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[back.sge(0, 64)],
    }])
    .unwrap();
    let sg = [dst.sge(0, 64)];
    qb.post_send(&[wr(3, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&cqb), 3, WcOpcode::SEND);
    ok(&poll_one(&cqa), 2, WcOpcode::RECV);
    assert_eq!(back.read(0, 64), data[..64]);
    assert_eq!(iso(&d, 0).denied, 3);
    assert_eq!(iso(&d, 1), IsolationStats::default());
}

#[test]
fn rc_to_another_tenants_qpn_at_an_own_gid_is_unreachable() {
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let (cqa, cqr) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&red.dev, 64).unwrap(),
    );
    let (qa, qr) = (rc_qp(&a, &cqa), rc_qp(&red, &cqr));
    // The red QP is in RTS and ready to take anything A sends (it cannot
    // name A's GID, but A's QPN at its own GID is accepted: a foreign QPN
    // is as good as one that does not exist).
    let mut c = conn(&qa, &a);
    c.av.dgid = red.dev.gid();
    qr.rc_connect(QP_ACCESS, &c).unwrap();
    let target = Buf::guarded(&red, 4096);
    qr.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[target.sge(0, 4096)],
    }])
    .unwrap();
    // A names red's QPN with a GID of its own tenant: a foreign QPN is
    // treated as one that does not exist (accepted: refusing it would tell
    // A that the QPN exists elsewhere) ...
    qa.rc_connect(QP_ACCESS, &fast(RcConnect::new(qr.qpn(), b.dev.gid())))
        .unwrap();
    let src = Buf::new(&a, 4096);
    src.write(0, &pattern(4096, 2));
    let sg = [src.sge(0, 4096)];
    let op = write_op(&target, 0);
    qa.post_send(&[wr(1, op, &sg), wr(2, SendOp::Send, &sg)])
        .unwrap();
    // ... and is never reached: transport retries, then RETRY_EXC_ERR.
    let wc = poll_one(&cqa);
    assert_eq!((wc.wr_id, wc.status()), (1, Some(WcStatus::RETRY_EXC_ERR)));
    let wc = poll_one(&cqa);
    assert_eq!((wc.wr_id, wc.status()), (2, Some(WcStatus::WR_FLUSH_ERR)));
    assert_quiet_for(&cqr, QUIET);
    assert_eq!(target.read(0, 4096), vec![GUARD; 4096]);
    assert_eq!(qr.query().unwrap().attr.qp_state, u32::from(QpState::RTS));
    let s = iso(&d, 0);
    // One try and retry_cnt (2) retries, each counted.
    assert_eq!(s.foreign_rc, 3, "{s:?}");
    assert_eq!((s.denied, s.unknown_qpn), (0, 0), "{s:?}");
    assert_eq!(iso(&d, 2), IsolationStats::default());
}

#[test]
fn create_ah_to_another_tenant_is_denied() {
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    assert_eq!(status(ah(&a, red.dev.gid())), (Status::DENIED, DETAIL_NONE));
    assert_eq!(status(ah(&a, [0x55; 16])), (Status::DENIED, DETAIL_NONE));
    ah(&a, b.dev.gid()).unwrap();
    ah(&a, a.dev.gid()).unwrap();
    assert_eq!(status(ah(&red, b.dev.gid())), (Status::DENIED, DETAIL_NONE));
    ah(&red, red.dev.gid()).unwrap();
    assert_eq!(iso(&d, 0).denied, 2);
    assert_eq!(iso(&d, 2).denied, 1);
    assert_eq!(iso(&d, 1), IsolationStats::default());
}

/// A source GID index that names no GID of the VM — past its table
/// (`RANGE`) or an unassigned entry (`INVALID`: index 0, the default GID
/// without a MAC, and any index after the VM's GIDs) — is refused and
/// counted as spoofing; the VM's own index works.
#[test]
fn sgid_index_naming_no_own_gid_is_refused_and_counted_as_spoofing() {
    let d = two_tenants();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let own = a.dev.gid_index();
    assert_eq!(own, 1, "index 0 is the (unassigned) default GID");
    for (index, want) in [
        (16, Status::RANGE),
        (0, Status::INVALID),
        (2, Status::INVALID),
    ] {
        let spoof = AddressVector {
            sgid_index: index,
            ..a.dev.av(b.dev.gid())
        };
        assert_eq!(
            status(Ah::create(&a.pd, &spoof)),
            (want, 28),
            "index {index}"
        );
    }
    let cqa = Cq::create(&a.dev, 16).unwrap();
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &Cq::create(&b.dev, 16).unwrap()));
    qa.rc_to_init(QP_ACCESS).unwrap();
    let mut c = conn(&qb, &b);
    c.sgid_index = Some(3);
    assert_eq!(status(qa.rc_to_rtr(&c)), (Status::INVALID, 100));
    c.sgid_index = Some(200);
    assert_eq!(status(qa.rc_to_rtr(&c)), (Status::RANGE, 100));
    let s = iso(&d, 0);
    assert_eq!((s.gid_spoof, s.denied), (5, 0), "{s:?}");
    // The VM's own index works.
    c.sgid_index = Some(own);
    qa.rc_to_rtr(&c).unwrap();
    assert_eq!(qa.query().unwrap().attr.av.sgid_index, own);
    assert_eq!(iso(&d, 0).gid_spoof, 5);
}

// ---------------------------------------------------------------------------
// Data path

#[test]
fn ud_to_another_tenants_qpn_is_dropped_and_counted() {
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let (cqa, cqb, cqr) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
        Cq::create(&red.dev, 64).unwrap(),
    );
    let (ua, ub, ur) = (
        ud_qp(&a, &cqa, 64),
        ud_qp(&b, &cqb, 64),
        ud_qp(&red, &cqr, 64),
    );
    let (rbuf, bbuf) = (Buf::guarded(&red, 4096), Buf::guarded(&b, 4096));
    ur.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[rbuf.sge(0, 4096)],
    }])
    .unwrap();
    let src = Buf::new(&a, 256);
    src.write(0, &pattern(256, 3));
    let sg = [src.sge(0, 256)];
    let to_b = ah(&a, b.dev.gid()).unwrap();
    let to_a = ah(&a, a.dev.gid()).unwrap();
    let send = |wr_id: u64, ah: &Ah, qpn: u32| {
        let mut w = SendWr::send(wr_id, &sg);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
        });
        ua.post_send(&[w]).unwrap();
        // UD gives no delivery guarantee: the sender completes normally.
        ok(&poll_one(&cqa), wr_id, WcOpcode::SEND);
    };
    // Red's real QPN, through an AH to B (own tenant) and to A itself.
    send(1, &to_b, ur.qpn());
    send(2, &to_a, ur.qpn());
    // A QPN that exists nowhere (a destroyed QP's).
    let gone = ud_qp(&a, &cqa, 64);
    let gone_qpn = gone.qpn();
    gone.destroy().unwrap();
    send(3, &to_b, gone_qpn);
    // B's QPN at A's GID: no such QP at that address.
    send(4, &to_a, ub.qpn());
    assert_quiet_for(&cqr, QUIET);
    assert_quiet_for(&cqb, QUIET);
    assert_eq!(rbuf.read(0, 4096), vec![GUARD; 4096]);
    assert_eq!(bbuf.read(0, 4096), vec![GUARD; 4096]);
    let s = iso(&d, 0);
    assert_eq!((s.foreign_drops, s.unknown_qpn), (2, 2), "{s:?}");
    assert_eq!((s.foreign_rc, s.denied), (0, 0), "{s:?}");
    assert_eq!(iso(&d, 2), IsolationStats::default());

    // The same sender reaches B: the setup itself works.
    ub.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: &[bbuf.sge(0, 4096)],
    }])
    .unwrap();
    send(5, &to_b, ub.qpn());
    let wc = poll_one(&cqb);
    ok(&wc, 8, WcOpcode::RECV);
    assert_eq!(bbuf.read(40, 256), pattern(256, 3));
    // Red's receive WQE is still there, unconsumed: red's own tenant can
    // use it.
    let red2 = open(&d, 3);
    let cq2 = Cq::create(&red2.dev, 16).unwrap();
    let u2 = ud_qp(&red2, &cq2, 64);
    let to_red = ah(&red2, red.dev.gid()).unwrap();
    let s2 = Buf::new(&red2, 16);
    s2.write(0, b"same tenant ok!!");
    let sg2 = [s2.sge(0, 16)];
    let mut w = SendWr::send(1, &sg2);
    w.ud = Some(UdDest {
        ah: &to_red,
        remote_qpn: ur.qpn(),
        remote_qkey: QKEY,
    });
    u2.post_send(&[w]).unwrap();
    ok(&poll_one(&cq2), 1, WcOpcode::SEND);
    ok(&poll_one(&cqr), 7, WcOpcode::RECV);
    assert_eq!(rbuf.read(40, 16), b"same tenant ok!!");
}

#[test]
fn rkey_brute_force_fails_every_guess_and_is_counted() {
    const GUESSES: u64 = 1000;
    let d = two_tenants();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (cqa, cqb) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
    );
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
    // The victim: 4 MRs with remote rights (one rkey each), all guarded.
    let victims: Vec<Buf> = (0..4).map(|_| Buf::guarded(&b, 4096)).collect();
    let real: Vec<u32> = victims.iter().map(|v| v.mr.rkey()).collect();
    let src = Buf::new(&a, 64);
    src.write(0, &[0x42; 64]);
    let sg = [src.sge(0, 64)];
    let mut x = 0x1234_5678_9abc_def1u64;
    let start = Instant::now();
    for i in 0..GUESSES {
        qa.rc_connect(QP_ACCESS, &conn(&qb, &b)).unwrap();
        qb.rc_connect(QP_ACCESS, &conn(&qa, &a)).unwrap();
        // A guessed rkey (xorshift), never one of the real ones.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut guess = x as u32;
        while real.contains(&guess) {
            guess = guess.wrapping_add(1);
        }
        let op = SendOp::RdmaWrite {
            remote_addr: victims[(i % 4) as usize].addr(0),
            rkey: guess,
        };
        qa.post_send(&[wr(i, op, &sg)]).unwrap();
        let wc = poll_one(&cqa);
        assert_eq!(
            (wc.wr_id, wc.status()),
            (i, Some(WcStatus::REM_ACCESS_ERR)),
            "guess {guess:#x}"
        );
        // Both QPs are in ERR now: start over.
        qa.to_reset().unwrap();
        qb.to_reset().unwrap();
    }
    eprintln!("{GUESSES} guesses in {:?}", start.elapsed());
    for v in &victims {
        assert_eq!(v.read(0, 4096), vec![GUARD; 4096], "a victim byte changed");
    }
    let s = iso(&d, 0);
    assert_eq!(s.bad_rkey, GUESSES, "{s:?}");
    assert_eq!(iso(&d, 1).bad_rkey, 0);
    // The real key works (the guesses failed for the key alone).
    qa.rc_connect(QP_ACCESS, &conn(&qb, &b)).unwrap();
    qb.rc_connect(QP_ACCESS, &conn(&qa, &a)).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: victims[0].addr(0),
        rkey: real[0],
    };
    qa.post_send(&[wr(GUESSES, op, &sg)]).unwrap();
    ok(&poll_one(&cqa), GUESSES, WcOpcode::RDMA_WRITE);
    assert_eq!(victims[0].read(0, 64), vec![0x42; 64]);
    // An MR without remote rights: its rkey is refused and counted too.
    let local = Buf {
        buf: victims[1].buf.clone(),
        mr: Mr::register(&b.pd, victims[1].buf.clone(), access::LOCAL_WRITE).unwrap(),
    };
    let op = write_op(&local, 0);
    qa.post_send(&[wr(GUESSES + 1, op, &sg)]).unwrap();
    let wc = poll_one(&cqa);
    assert_eq!(wc.status(), Some(WcStatus::REM_ACCESS_ERR));
    // (Its rkey is 0: an MR without remote rights has none.)
    assert_eq!(iso(&d, 0).bad_rkey, GUESSES + 1);
    assert_eq!(victims[1].read(0, 4096), vec![GUARD; 4096]);
}

// ---------------------------------------------------------------------------
// Quotas and control-command limits

#[test]
fn registered_bytes_quota() {
    let limits = Limits {
        max_mr_size: 64 << 10,
        max_mr_bytes: 3 * (16 << 10),
        ..Limits::default()
    };
    let d = TestDaemon::with_limits(1, limits).unwrap();
    let a = open(&d, 0);
    let buf = Arc::new(a.dev.alloc_dma(64 << 10, 4096).unwrap());
    let reg = |off: usize, len: usize| {
        Mr::register_range(&a.pd, buf.clone(), off, len, access::LOCAL_WRITE)
    };
    let m1 = reg(0, 16 << 10).unwrap();
    let _m2 = reg(16 << 10, 16 << 10).unwrap();
    let _m3 = reg(32 << 10, 16 << 10).unwrap();
    assert_eq!(
        status(reg(48 << 10, 4096)),
        (Status::QUOTA, quota::MR_BYTES)
    );
    // Released bytes can be registered again.
    m1.destroy().unwrap();
    let _m4 = reg(48 << 10, 16 << 10).unwrap();
    assert_eq!(status(reg(0, 4096)), (Status::QUOTA, quota::MR_BYTES));
}

/// `n` QUERY_DEVICE commands one after the other on `v`; their duration.
fn query_n(v: &mut Verbs<'_>, n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        v.query_device().unwrap();
    }
    t.elapsed()
}

#[test]
fn ctrl_rate_limit_slows_only_the_limited_vm() {
    // A rate low enough that the limit, not the machine's load, decides:
    // 40 commands at 10/s take about four seconds, 40 unlimited ones
    // milliseconds (hundreds under a heavy load): the checks compare the
    // two rather than trusting a wall-clock bound.
    const N: usize = 40;
    let d = two_tenants();
    let (mut vm0, mut vm1) = (d.connect(0).unwrap(), d.connect(1).unwrap());
    let spec = QosSpec {
        ctrl_per_sec: 10,
        ..QosSpec::default()
    };
    d.set_vm_qos(0, spec).unwrap();
    let before = (d.traffic(0).ctrl_cmds, d.traffic(1).ctrl_cmds);
    let (limited, free) = std::thread::scope(|s| {
        let h = s.spawn(|| query_n(&mut Verbs::new(&mut vm0), N));
        let free = query_n(&mut Verbs::new(&mut vm1), N);
        (h.join().unwrap(), free)
    });
    eprintln!("limited VM: {limited:?}, unlimited VM: {free:?}");
    // 40 commands at 10/s with a burst of 1 (`ctrl_burst`): at least 3.9 s.
    assert!(limited >= Duration::from_millis(3800), "{limited:?}");
    // The other VM is not held up by it (it would take as long if the
    // limiter slowed the daemon rather than the VM).
    assert!(free < limited / 2, "{free:?} vs {limited:?}");
    let (t0, t1) = (d.traffic(0), d.traffic(1));
    assert_eq!(t0.ctrl_cmds - before.0, N as u64);
    assert_eq!(t1.ctrl_cmds - before.1, N as u64);
    assert_eq!((t0.ctrl_errors, t1.ctrl_errors), (0, 0));
    assert!(t0.ctrl_latency.count >= N as u64);

    // Lifted at run time: the next commands are fast again.
    d.set_vm_qos(0, QosSpec::default()).unwrap();
    let again = query_n(&mut Verbs::new(&mut vm0), N);
    assert!(again < limited / 2, "{again:?} vs {limited:?}");
}

/// A tenant's `ctrl_per_sec` limits the sum of its VMs' control commands;
/// VMs of other tenants are not held up.
#[test]
fn tenant_ctrl_rate_limit_is_shared_by_its_vms() {
    // Rates low enough that the limit, not the machine's load, decides the
    // times: 60 commands of the tenant at 10/s with a burst of 1 take at
    // least 5.9 s; 30 unlimited commands take milliseconds (hundreds under
    // a heavy load): the checks compare them.
    const N: usize = 30;
    let d = two_tenants();
    let spec = QosSpec {
        ctrl_per_sec: 10,
        ..QosSpec::default()
    };
    // Tenant 1 is "red": VMs 2 and 3.
    d.set_tenant_qos(1, spec).unwrap();
    let mut vms: Vec<_> = [2, 3, 0].iter().map(|&i| d.connect(i).unwrap()).collect();
    let (red_a, red_b, blue) = std::thread::scope(|s| {
        let mut it = vms.iter_mut();
        let (a, b, c) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let ha = s.spawn(move || query_n(&mut Verbs::new(a), N));
        let hb = s.spawn(move || query_n(&mut Verbs::new(b), N));
        let blue = query_n(&mut Verbs::new(c), N);
        (ha.join().unwrap(), hb.join().unwrap(), blue)
    });
    eprintln!("red VMs: {red_a:?} {red_b:?}, blue VM: {blue:?}");
    // Alone, each red VM's 30 would take (30 - 1) / 10 s = 2.9 s; shared,
    // the later of the two finishes after (60 - 1) / 10 s = 5.9 s.
    let red = red_a.max(red_b);
    assert!(red >= Duration::from_millis(5000), "{red_a:?} {red_b:?}");
    assert!(blue < red / 2, "{blue:?} vs {red:?}");
    d.set_tenant_qos(1, QosSpec::default()).unwrap();
    let again = query_n(&mut Verbs::new(&mut vms[0]), N);
    assert!(again < red / 2, "{again:?} vs {red:?}");
}

#[test]
fn ctrl_errors_are_counted() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let before = d.traffic(0);
    v.query_device().unwrap();
    assert!(v.dealloc_pd(0x1234).is_err());
    assert!(v.destroy_cq(0x4321).is_err());
    let t = d.traffic(0);
    assert_eq!(t.ctrl_cmds - before.ctrl_cmds, 3);
    assert_eq!(t.ctrl_errors - before.ctrl_errors, 2);
    assert_eq!(t.ctrl_latency.count - before.ctrl_latency.count, 3);
}

#[test]
fn max_ctrl_outstanding_takes_requests_in_passes_and_completes_all() {
    const N: usize = 120;
    let limits = Limits {
        max_ctrl_outstanding: 4,
        ..Limits::default()
    };
    let d = TestDaemon::with_limits(1, limits).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let q = v.ctrl();
    // All in the ring before the one kick: the device takes 4 per pass and
    // must come back for the rest without being kicked again.
    q.set_auto_kick(false);
    let tokens: Vec<u64> = (0..N)
        .map(|_| {
            q.submit(Opcode::QUERY_DEVICE, &[], DeviceAttr::SIZE)
                .unwrap()
        })
        .collect();
    q.kick().unwrap();
    for t in tokens {
        let c = q.wait(t).unwrap();
        assert!(c.is_ok(), "{:?}", c.status());
        c.parse::<DeviceAttr>().unwrap();
    }
    let t = d.traffic(0);
    assert!(t.ctrl_cmds >= N as u64, "{t:?}");
    assert_eq!(t.ctrl_errors, 0);
}

// ---------------------------------------------------------------------------
// Privileged Q_Keys and the management QPs

/// `MODIFY_QP` refuses a privileged Q_Key (bit 31; the GSI's is
/// 0x8001_0000) with `DENIED`, whatever the transition, and leaves the QP
/// as it was; the refusals are counted in `privileged`. Bit 31 clear is
/// fine. Spec 12.13.
#[test]
fn a_privileged_qkey_is_refused_by_modify_qp_and_counted() {
    let d = two_tenants();
    let a = open(&d, 0);
    let cq = Cq::create(&a.dev, 64).unwrap();
    let mut init = QpInit::ud(&cq);
    init.cap = vhost_user_rdma_tests::dp::cap();
    let q = Qp::create(&a.pd, &init).unwrap();
    assert_eq!(
        status(q.ud_to_init(0x8001_0000)),
        (Status::DENIED, DETAIL_NONE)
    );
    assert_eq!(q.query().unwrap().attr.qp_state, u32::from(QpState::RESET));
    q.ud_activate(0x7fff_ffff, 0).unwrap();
    let r = q.modify(&QpAttrs {
        qkey: Some(0x8000_0000),
        ..QpAttrs::default()
    });
    assert_eq!(status(r), (Status::DENIED, DETAIL_NONE));
    let now = q.query().unwrap();
    assert_eq!(
        (now.attr.qp_state, now.attr.qkey),
        (u32::from(QpState::RTS), 0x7fff_ffff)
    );
    let s = iso(&d, 0);
    assert_eq!((s.privileged, s.denied), (2, 0), "{s:?}");
}

/// A UD send to QP 0 or 1 — the management QPs of a port, never handed
/// out — fails with `LOC_QP_OP_ERR` (the WQE is malformed, spec 18.11.5)
/// and moves the QP to ERR; a send WQE asking for its QP's own Q_Key (bit
/// 31 of `remote_qkey`) sends that Q_Key, which is never privileged.
/// Counted in `privileged`; nothing reaches any other VM.
#[test]
fn ud_sends_to_the_management_qps_fail_and_are_counted() {
    let d = two_tenants();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (cqa, cqb) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
    );
    let ub = ud_qp(&b, &cqb, 64);
    let bbuf = Buf::guarded(&b, 4096);
    let src = Buf::new(&a, 256);
    let sg = [src.sge(0, 64)];
    let to_b = ah(&a, b.dev.gid()).unwrap();
    let send = |ua: &virtio_rdma_driver::Qp, wr_id: u64, qpn: u32, qkey: u32| {
        let mut w = SendWr::send(wr_id, &sg);
        w.ud = Some(UdDest {
            ah: &to_b,
            remote_qpn: qpn,
            remote_qkey: qkey,
        });
        ua.post_send(&[w]).unwrap();
        poll_one(&cqa)
    };
    // Own Q_Key through bit 31: delivered with QKEY.
    let ua = ud_qp(&a, &cqa, 64);
    ub.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[bbuf.sge(0, 4096)],
    }])
    .unwrap();
    ok(&send(&ua, 1, ub.qpn(), 0x8000_0000), 1, WcOpcode::SEND);
    ok(&poll_one(&cqb), 5, WcOpcode::RECV);
    for (i, qpn) in [0u32, 1].into_iter().enumerate() {
        let ua = ud_qp(&a, &cqa, 64);
        let wr_id = 10 + i as u64;
        let wc = send(&ua, wr_id, qpn, QKEY);
        assert_eq!(
            (wc.wr_id, wc.status()),
            (wr_id, Some(WcStatus::LOC_QP_OP_ERR))
        );
        assert_eq!(ua.query().unwrap().attr.qp_state, u32::from(QpState::ERR));
    }
    assert_quiet_for(&cqb, QUIET);
    let s = iso(&d, 0);
    assert_eq!((s.privileged, s.unknown_qpn), (2, 0), "{s:?}");
    assert_eq!(iso(&d, 1), IsolationStats::default());
}

/// The tenant's fabric rules (spec 12.16): a forced traffic class replaces
/// the guest's in the address handle, seen in the GRH the receiver gets;
/// a service level or flow label outside the allowed values is `DENIED` in
/// `CREATE_AH` and in `MODIFY_QP`, counted in `denied`; another tenant
/// without rules passes the guest's values through (software RNIC default).
#[test]
fn fabric_rules_force_and_refuse_address_vector_fields() {
    use vhost_user_rdma::config::FieldRule;
    use virtio_rdma_abi::datapath::{UdGrh, UD_GRH_SIZE};
    let d = two_tenants_with(|c| {
        let t = c.tenants.iter_mut().find(|t| t.name == "default").unwrap();
        t.fabric.traffic_class = Some(FieldRule::Force(96));
        t.fabric.service_level = Some(FieldRule::Allow(vec![0, 3]));
        t.fabric.flow_label = Some(FieldRule::Allow(vec![0]));
    });
    let (a, b, red, red2) = (open(&d, 0), open(&d, 1), open(&d, 2), open(&d, 3));
    let av = |dgid, tc, sl, flow_label| AddressVector {
        dgid,
        traffic_class: tc,
        sl,
        flow_label,
        hop_limit: 64,
        sgid_index: a.dev.gid_index(),
    };
    // Refused: SL 5, flow label 7; allowed SL 3 with any traffic class.
    assert_eq!(
        status(Ah::create(&a.pd, &av(b.dev.gid(), 0, 5, 0))),
        (Status::DENIED, DETAIL_NONE)
    );
    assert_eq!(
        status(Ah::create(&a.pd, &av(b.dev.gid(), 0, 0, 7))),
        (Status::DENIED, DETAIL_NONE)
    );
    let to_b = Ah::create(&a.pd, &av(b.dev.gid(), 0xa5, 3, 0)).unwrap();
    // An RC QP's path takes the same rules.
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &Cq::create(&b.dev, 16).unwrap()));
    qa.rc_to_init(QP_ACCESS).unwrap();
    let mut c = conn(&qb, &b);
    c.av.sl = 5;
    assert_eq!(status(qa.rc_to_rtr(&c)), (Status::DENIED, DETAIL_NONE));
    c.av.sl = 3;
    c.av.traffic_class = 0x10;
    qa.rc_to_rtr(&c).unwrap();
    let q = qa.query().unwrap();
    assert_eq!((q.attr.av.traffic_class, q.attr.av.sl), (96, 3));
    assert_eq!(iso(&d, 0).denied, 3);

    // The forced traffic class is what the receiver's GRH shows.
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let (ua, ub) = (ud_qp(&a, &cqa, 64), ud_qp(&b, &cqb, 64));
    let bbuf = Buf::new(&b, 4096);
    ub.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bbuf.sge(0, 4096)],
    }])
    .unwrap();
    let src = Buf::new(&a, 256);
    let sg = [src.sge(0, 64)];
    let mut w = SendWr::send(2, &sg);
    w.ud = Some(UdDest {
        ah: &to_b,
        remote_qpn: ub.qpn(),
        remote_qkey: QKEY,
    });
    ua.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    ok(&poll_one(&cqb), 1, WcOpcode::RECV);
    let raw: [u8; UD_GRH_SIZE as usize] = bbuf.read(0, 40).try_into().unwrap();
    assert_eq!(UdGrh::parse(&raw).unwrap().traffic_class, 96);

    // Tenant "red" has no rules: on the software RNIC the guest's values
    // pass.
    let r = Ah::create(&red.pd, &av(red2.dev.gid(), 0xa5, 5, 7)).unwrap();
    drop(r);
    assert_eq!(iso(&d, 2), IsolationStats::default());
}

// ---------------------------------------------------------------------------
// Parked VMs next to a busy tenant (issue 26, N1)

/// A VM idle between its requests is parked by the engine (it asks for
/// notifications), but while another tenant keeps the engine thread busy
/// its request must not wait for the notification: that comes through a
/// thread which, on the engine's CPU, the scheduler lets wait a whole time
/// slice or more behind the busy engine (milliseconds per request). Here
/// the victim's notifications are held back altogether; every WRITE must
/// still complete while the other tenant's huge SENDs keep the engine busy.
/// Before peeks existed the first one never did (the engine, always busy,
/// never looked at the parked VM again).
#[test]
fn a_parked_vm_is_served_while_another_tenant_keeps_the_engine_busy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use vhost_user_rdma_tests::dp::{rc_pair, repeated_page_mr};
    use virtio_rdma_driver::{QpCap, QpInit, WorkCompletion};

    const MSG: u32 = 64 << 20;
    const PAIRS: usize = 4;
    const DEPTH: usize = 2;
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));

    // The busy tenant: RC QP pairs inside its own VM, each keeping DEPTH
    // SENDs of 64 MiB going between two regions of one repeated page.
    let (scq, rcq) = (
        Cq::create(&red.dev, 64).unwrap(),
        Cq::create(&red.dev, 64).unwrap(),
    );
    let qp = |cq: &Arc<Cq>| {
        let mut init = QpInit::rc(cq);
        init.cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        virtio_rdma_driver::Qp::create(&red.pd, &init).unwrap()
    };
    let pairs: Vec<_> = (0..PAIRS)
        .map(|_| {
            let (qa, qb) = (qp(&scq), qp(&rcq));
            qa.rc_connect(QP_ACCESS, &conn(&qb, &red)).unwrap();
            qb.rc_connect(QP_ACCESS, &conn(&qa, &red)).unwrap();
            (qa, qb)
        })
        .collect();
    let (ps, pd) = (
        red.dev.alloc_dma(4096, 4096).unwrap(),
        red.dev.alloc_dma(4096, 4096).unwrap(),
    );
    // SAFETY: the pages outlive the regions (dropped at the end of the
    // test, after them) and are never read through a Rust reference.
    let (src, dst) = unsafe {
        (
            repeated_page_mr(&red, &ps, 0x100_0000_0000, u64::from(MSG)).unwrap(),
            repeated_page_mr(&red, &pd, 0x200_0000_0000, u64::from(MSG)).unwrap(),
        )
    };
    let post = |i: usize| {
        let (qa, qb) = &pairs[i];
        qb.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &[dst.sge(0, MSG).unwrap()],
        }])
        .unwrap();
        qa.post_send(&[SendWr::signaled(
            i as u64,
            SendOp::Send,
            &[src.sge(0, MSG).unwrap()],
        )])
        .unwrap();
    };
    let stop = AtomicBool::new(false);
    let sends = std::thread::scope(|s| {
        let busy = s.spawn(|| {
            let mut sent = 0u64;
            for i in 0..PAIRS * DEPTH {
                post(i % PAIRS);
                sent += 1;
            }
            let mut wc = [WorkCompletion::default(); 16];
            while !stop.load(Ordering::Relaxed) {
                let n = scq.poll(&mut wc);
                for w in &wc[..n] {
                    assert!(w.is_success(), "{w:?}");
                    post(usize::try_from(w.wr_id).unwrap());
                    sent += 1;
                }
                let _ = rcq.poll(&mut wc);
                if n == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            sent
        });

        // However the victim's part ends (a failed assertion too), the
        // busy tenant stops, so that the scope can end.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        // The victim: one 64-byte WRITE after every 10 ms of idleness
        // (50 POLL_WINDOWs: its VM is parked when it posts), with its
        // notifications held back.
        let p = rc_pair(&a, &b);
        let (vsrc, vdst) = (Buf::new(&a, 64), Buf::new(&b, 64));
        a.t.hold_notifications(true).unwrap();
        let mut wc = [WorkCompletion::default(); 1];
        for i in 0..10u64 {
            std::thread::sleep(Duration::from_millis(10));
            p.qa.post_send(&[SendWr::signaled(i, write_op(&vdst, 0), &[vsrc.sge(0, 64)])])
                .unwrap();
            let t0 = Instant::now();
            while p.cqa.poll(&mut wc) == 0 {
                // Generous: a debug build on a busy machine; the old
                // engine never served it while the other tenant was busy.
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "WRITE {i} of the parked VM not served while the engine was busy \
                     ({} notifications held back; {:?}; {:?})",
                    a.t.held_notifications(),
                    d.daemon().engines().stats(),
                    d.daemon().tenancy().traffic(2).map(|t| t.snapshot()),
                );
                std::thread::yield_now();
            }
            assert!(wc[0].is_success(), "{:?}", wc[0]);
        }
        let held = a.t.held_notifications();
        let stats = d.daemon().engines().stats();
        stop.store(true, Ordering::Relaxed);
        let sent = busy.join().unwrap();
        a.t.hold_notifications(false).unwrap();
        // The VM was parked when it posted (its driver wanted to notify),
        // and the engine found its work by peeking.
        assert!(held > 0, "the victim's VM was never parked");
        assert!(stats[0].vm_parks > 0 && stats[0].peeked > 0, "{stats:?}");
        sent
    });
    assert!(
        sends > (PAIRS * DEPTH) as u64,
        "the other tenant kept sending"
    );
    drop((src, dst));
    drop((ps, pd));
}

/// Anticipation (docs/isolation.md): a closed loop of a VM entitled to far
/// more of the engine than a busy tenant is waited for, and nothing else
/// is. With equal weights the engine never keeps its time for anyone (the
/// counter stays 0 however the loop runs); with the victim's tenant and VMs
/// at 1000 and the busy tenant's at 1, it does, and the busy tenant's SENDs
/// still complete while the victim's closed loop keeps coming back: a
/// debtor is repaid by the anticipated VM's work, never starved.
#[test]
fn only_a_far_heavier_closed_loop_is_anticipated_and_the_other_tenant_still_progresses() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use vhost_user_rdma_tests::dp::{rc_pair, repeated_page_mr};
    use virtio_rdma_driver::WorkCompletion;

    const MSG: u32 = 1 << 20;
    let d = two_tenants();
    let (a, b, red) = (open(&d, 0), open(&d, 1), open(&d, 2));
    // The busy tenant: one RC QP pair inside VM 2, two SENDs of 1 MiB in
    // flight, between two regions of one repeated page.
    let busy = rc_pair(&red, &red);
    let (ps, pd) = (
        red.dev.alloc_dma(4096, 4096).unwrap(),
        red.dev.alloc_dma(4096, 4096).unwrap(),
    );
    // SAFETY: the pages outlive the regions (dropped at the end of the
    // test, after them) and are never read through a Rust reference.
    let (src, dst) = unsafe {
        (
            repeated_page_mr(&red, &ps, 0x100_0000_0000, u64::from(MSG)).unwrap(),
            repeated_page_mr(&red, &pd, 0x200_0000_0000, u64::from(MSG)).unwrap(),
        )
    };
    let post = || {
        busy.qb
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[dst.sge(0, MSG).unwrap()],
            }])
            .unwrap();
        busy.qa
            .post_send(&[SendWr::signaled(
                0,
                SendOp::Send,
                &[src.sge(0, MSG).unwrap()],
            )])
            .unwrap();
    };
    let p = rc_pair(&a, &b);
    let (vsrc, vdst) = (Buf::new(&a, 64), Buf::new(&b, 64));
    let anticipated = || d.daemon().engines().stats()[0].anticipated;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        let busy_side = s.spawn(|| {
            post();
            post();
            let mut wc = [WorkCompletion::default(); 4];
            while !stop.load(Ordering::Relaxed) {
                let n = busy.cqa.poll(&mut wc);
                for w in &wc[..n] {
                    assert!(w.is_success(), "{w:?}");
                    done.fetch_add(1, Ordering::Relaxed);
                    post();
                }
                let _ = busy.cqb.poll(&mut wc);
                if n == 0 {
                    std::thread::yield_now();
                }
            }
        });
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        // The victim's closed loop: the next WRITE as soon as the last
        // completes, until `until` says so.
        let closed_loop = |until: &dyn Fn(u64) -> bool| {
            let mut wc = [WorkCompletion::default(); 1];
            let mut i = 0u64;
            while !until(i) {
                p.qa.post_send(&[SendWr::signaled(i, write_op(&vdst, 0), &[vsrc.sge(0, 64)])])
                    .unwrap();
                while p.cqa.poll(&mut wc) == 0 {
                    std::hint::spin_loop();
                }
                assert!(wc[0].is_success(), "{:?}", wc[0]);
                i += 1;
            }
        };
        // Equal weights: 2,000 WRITEs next to the busy tenant, nothing
        // anticipated.
        closed_loop(&|i| i >= 2_000);
        assert_eq!(anticipated(), 0, "{:?}", d.daemon().engines().stats());
        // The isolation weights of docs/isolation.md.
        let w = |weight| QosSpec {
            weight,
            ..QosSpec::default()
        };
        let tenancy = d.daemon().tenancy().clone();
        for (vm, weight) in [(0, 1000), (1, 1000), (2, 1), (3, 1)] {
            d.set_vm_qos(vm, w(weight)).unwrap();
        }
        for (vm, weight) in [(0, 1000), (2, 1)] {
            d.set_tenant_qos(tenancy.tenant_of(vm).unwrap(), w(weight))
                .unwrap();
        }
        // The busy tenant completes SENDs while the closed loop runs
        // without a break: its debt is repaid; and the engine waits for the
        // closed loop at some point (on a busy machine that may take more
        // than a few thousand WRITEs: the loop goes on until both are seen,
        // a generous guard, in WRITEs, against a hang).
        let start = done.load(Ordering::Relaxed);
        closed_loop(&|i| {
            assert!(
                i < 50_000_000,
                "the busy tenant starved ({} SENDs) or nothing was anticipated: {:?}",
                done.load(Ordering::Relaxed) - start,
                d.daemon().engines().stats()
            );
            i >= 1_000 && done.load(Ordering::Relaxed) >= start + 3 && anticipated() > 0
        });
        stop.store(true, Ordering::Relaxed);
        busy_side.join().unwrap();
    });
    drop((src, dst));
    drop((ps, pd));
}
