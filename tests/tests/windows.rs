//! Memory windows (`F_MW`, spec 12.23, 12.24, 18.29) between two VMs of
//! one daemon, through the real vhost-user socket and the reference
//! driver: `ALLOC_MW` and its limits, `BIND_MW` work requests and the
//! peer's RDMA through the window's key (its range and rights, and for type
//! 2 its QP), rebinding and unbinding type 1, invalidating type 2 locally
//! and remotely, the MR a window holds, and every refusal of a bind.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{
    connect, expect_event, failed, ok, open, pattern, poll_one, rc_pair, rc_qp, recv, status,
    two_vms, wait_state, wr, Buf, Pair, GUARD,
};
use vhost_user_rdma_tests::fast::{invalidate, prefix, send_inv_wr};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{status_of, Verbs};
use virtio_rdma_abi::ctrl::{quota, Status};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_abi::verbs::{MW_TYPE_1, MW_TYPE_2};
use virtio_rdma_driver::{Mw, MwBind, Pd, SendOp, SendWr};

/// Rights of a buffer windows may be bound to.
const BINDABLE: u32 = access::ALL | access::MW_BIND;

/// An RDMA WRITE to `addr` under `rkey`.
fn write_to(addr: u64, rkey: u32) -> SendOp {
    SendOp::RdmaWrite {
        remote_addr: addr,
        rkey,
    }
}

/// An RDMA READ from `addr` under `rkey`.
fn read_from(addr: u64, rkey: u32) -> SendOp {
    SendOp::RdmaRead {
        remote_addr: addr,
        rkey,
    }
}

/// Posts `bind` on `q` (signaled) and returns its completion.
fn post_bind(
    q: &virtio_rdma_driver::Qp,
    wr_id: u64,
    bind: MwBind,
) -> virtio_rdma_driver::WorkCompletion {
    q.post_send(&[SendWr::signaled(wr_id, SendOp::BindMw(bind), &[])])
        .expect("post BIND_MW");
    poll_one(q.send_cq())
}

/// Binds `mw` to `len` bytes at `off` of `buf` with `acc` on `q`, checks
/// the completion and returns the window's key.
fn bind(
    q: &virtio_rdma_driver::Qp,
    wr_id: u64,
    mw: &mut Mw,
    buf: &Buf,
    off: usize,
    len: usize,
    acc: u32,
) -> u32 {
    let b = mw.bind(buf.mr.lkey(), buf.addr(off), len as u64, acc);
    ok(&post_bind(q, wr_id, b), wr_id, WcOpcode::BIND_MW);
    b.new_rkey
}

/// A's WRITE of `data` at `addr` under `rkey`: its completion status.
fn write_status(p: &Pair, src: &Buf, wr_id: u64, addr: u64, rkey: u32, len: usize) -> WcStatus {
    p.qa.post_send(&[wr(wr_id, write_to(addr, rkey), &[src.sge(0, len)])])
        .unwrap();
    poll_one(&p.cqa).status().expect("a known status")
}

/// Spec 12.23, 12.24, 9.4: `ALLOC_MW` checks its type, counts against
/// `max_mr` with the MRs, gives keys unique in bits 31 to 8, holds its PD,
/// and `DEALLOC_MW` gives everything back.
#[test]
fn alloc_mw_checks_its_request_and_counts_as_an_mr() {
    let d = TestDaemon::with_limits(
        1,
        Limits {
            max_mr: 4,
            ..Limits::default()
        },
    )
    .unwrap();
    let a = open(&d, 0);
    let before = d.stats(0).device.resources;
    for bad in [0, 3, u32::MAX] {
        assert_eq!(
            status(Mw::alloc(&a.pd, bad)),
            (Status::INVALID, 4),
            "type {bad}"
        );
    }
    let r = Verbs::new(&mut a.t.vmm()).alloc_mw(0xdead_0001, MW_TYPE_2);
    assert_eq!(status_of(&r), Some((Status::BAD_HANDLE, 0)));
    let w1 = Mw::alloc(&a.pd, MW_TYPE_1).unwrap();
    let w2 = Mw::alloc(&a.pd, MW_TYPE_2).unwrap();
    let buf = Buf::new(&a, 4096);
    assert_eq!(d.stats(0).device.resources.mw, before.mw + 2);
    let w3 = Mw::alloc(&a.pd, MW_TYPE_2).unwrap();
    // Three windows and an MR: max_mr.
    assert_eq!(
        status(Mw::alloc(&a.pd, MW_TYPE_1)),
        (Status::QUOTA, quota::MR)
    );
    let keys = [w1.key(), w2.key(), w3.key(), buf.mr.lkey(), buf.mr.rkey()];
    for (i, k) in keys.iter().enumerate().take(3) {
        for (j, other) in keys.iter().enumerate() {
            if i != j {
                assert_ne!(prefix(*k), prefix(*other), "{k:#x} and {other:#x}");
            }
        }
    }
    // The PD is held by its windows.
    let r = Verbs::new(&mut a.t.vmm()).dealloc_pd(a.pd.handle());
    assert_eq!(status_of(&r).map(|s| s.0), Some(Status::BUSY));
    let r = Verbs::new(&mut a.t.vmm()).dealloc_mw(0xdead_0002);
    assert_eq!(status_of(&r), Some((Status::BAD_HANDLE, 0)));
    drop((w1, w2, w3, buf));
    assert_eq!(d.stats(0).device.resources, before, "everything given back");
}

/// Spec 18.29: a type 2 window bound by B's QP grants A's RDMA to exactly
/// its range with exactly its rights; A's READ and WRITE through it move
/// the MR's bytes; outside the range, without the right, after the window
/// is invalidated (locally, then remotely by SEND_WITH_INV), the access
/// fails with `REM_ACCESS_ERR` and nothing is written.
#[test]
fn a_type2_window_grants_its_range_and_rights_until_invalidated() {
    let (_d, a, b) = two_vms();
    let target = Buf::with_access(&b, &b.pd, 3 * 4096, BINDABLE);
    let src = Buf::new(&a, 4096);
    let data = pattern(1000, 3);
    src.write(0, &data);
    let mut mw = Mw::alloc(&b.pd, MW_TYPE_2).unwrap();
    let k0 = mw.key();
    let p = rc_pair(&a, &b);
    let rw = access::REMOTE_READ | access::REMOTE_WRITE;
    let key = bind(&p.qb, 1, &mut mw, &target, 4096, 4096, rw);
    assert_eq!(prefix(key), prefix(k0));
    assert_ne!(key, k0);
    // Inside: WRITE, then READ back.
    assert_eq!(
        write_status(&p, &src, 2, target.addr(4096 + 100), key, 1000),
        WcStatus::SUCCESS
    );
    assert_eq!(target.read(4096 + 100, 1000), data);
    let back = Buf::guarded(&a, 4096);
    p.qa.post_send(&[wr(
        3,
        read_from(target.addr(4096 + 100), key),
        &[back.sge(0, 1000)],
    )])
    .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_READ);
    assert_eq!(back.read(0, 1000), data);
    // One byte over either end of the window: refused, nothing written.
    for (i, addr) in [target.addr(4096 - 1), target.addr(2 * 4096 - 999)]
        .into_iter()
        .enumerate()
    {
        let p = rc_pair(&a, &b);
        let key = rebind(&p, &mut mw, &target, rw);
        let wr_id = 10 + i as u64;
        assert_eq!(
            write_status(&p, &src, wr_id, addr, key, 1000),
            WcStatus::REM_ACCESS_ERR
        );
        expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, p.qb.handle());
    }
    target.assert_untouched(0, 4096, "below the window");
    target.assert_untouched(2 * 4096, 4096, "above the window");
    // Atomics: not granted.
    let p = rc_pair(&a, &b);
    let key = rebind(&p, &mut mw, &target, rw);
    p.qa.post_send(&[wr(
        20,
        SendOp::AtomicFetchAdd {
            remote_addr: target.addr(4096),
            rkey: key,
            add: 1,
        },
        &[src.sge(0, 8)],
    )])
    .unwrap();
    failed(&poll_one(&p.cqa), 20, WcStatus::REM_ACCESS_ERR);
    expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, p.qb.handle());
    // Invalidated locally: refused from then on.
    let p = rc_pair(&a, &b);
    let key = rebind(&p, &mut mw, &target, rw);
    invalidate(&p.qb, 30, key);
    let before = target.read(4096, 8);
    assert_eq!(
        write_status(&p, &src, 31, target.addr(4096), key, 8),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(target.read(4096, 8), before);
    // Invalidated by the peer's SEND_WITH_INV.
    let p = rc_pair(&a, &b);
    let key = rebind(&p, &mut mw, &target, rw);
    let inbox = Buf::guarded(&b, 4096);
    recv(&p.qb, 40, &[inbox.sge(0, 64)]);
    p.qa.post_send(&[send_inv_wr(41, key, &[src.sge(0, 16)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 41, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 40, WcOpcode::RECV);
    assert_eq!(r.invalidated(), Some(key));
    assert_eq!(
        write_status(&p, &src, 42, target.addr(4096), key, 8),
        WcStatus::REM_ACCESS_ERR
    );
}

/// Invalidates the type 2 window `mw` and binds it anew to the second
/// page of `target` with `acc` on `p.qb`: its new key.
fn rebind(p: &Pair, mw: &mut Mw, target: &Buf, acc: u32) -> u32 {
    // A type 2 window is invalidated before it is bound again.
    invalidate(&p.qb, 99, mw.key());
    bind(&p.qb, 100, mw, target, 4096, 4096, acc)
}

/// Spec 18.29: a type 2 window is accessed through the QP that bound it
/// only; another QP of the same PD gets `REM_ACCESS_ERR`. A type 1 window
/// serves every QP of its PD.
#[test]
fn a_type2_window_serves_its_own_qp_only() {
    let (_d, a, b) = two_vms();
    let target = Buf::with_access(&b, &b.pd, 4096, BINDABLE);
    let src = Buf::new(&a, 64);
    src.write(0, b"through its qp");
    let p1 = rc_pair(&a, &b);
    let p2 = rc_pair(&a, &b);
    let mut w2 = Mw::alloc(&b.pd, MW_TYPE_2).unwrap();
    let k2 = bind(&p1.qb, 1, &mut w2, &target, 0, 4096, access::REMOTE_WRITE);
    assert_eq!(
        write_status(&p1, &src, 2, target.addr(0), k2, 14),
        WcStatus::SUCCESS
    );
    assert_eq!(target.read(0, 14), b"through its qp");
    assert_eq!(
        write_status(&p2, &src, 3, target.addr(100), k2, 14),
        WcStatus::REM_ACCESS_ERR
    );
    target.assert_untouched(100, 14, "through another QP");
    // Type 1, bound on p1's QP, serves p2's too.
    let p3 = rc_pair(&a, &b);
    let mut w1 = Mw::alloc(&b.pd, MW_TYPE_1).unwrap();
    let k1 = bind(&p3.qb, 4, &mut w1, &target, 0, 4096, access::REMOTE_WRITE);
    let p4 = rc_pair(&a, &b);
    src.write(0, b"any qp of the pd");
    assert_eq!(
        write_status(&p4, &src, 5, target.addr(200), k1, 16),
        WcStatus::SUCCESS
    );
    assert_eq!(target.read(200, 16), b"any qp of the pd");
}

/// Spec 18.29: a type 1 window is rebound under a new key (the old one is
/// refused from then on) and unbound by a bind of length 0; `LOCAL_INV`
/// of a type 1 key fails as a key that names nothing.
#[test]
fn a_type1_window_is_rebound_and_unbound_by_binds() {
    let (_d, a, b) = two_vms();
    let target = Buf::with_access(&b, &b.pd, 2 * 4096, BINDABLE);
    let src = Buf::new(&a, 64);
    src.write(0, b"v1v2v3");
    let p = rc_pair(&a, &b);
    let mut mw = Mw::alloc(&b.pd, MW_TYPE_1).unwrap();
    let k1 = bind(&p.qb, 1, &mut mw, &target, 0, 4096, access::REMOTE_WRITE);
    assert_eq!(
        write_status(&p, &src, 2, target.addr(0), k1, 2),
        WcStatus::SUCCESS
    );
    // Rebound to the second page: the old key and the old range are gone.
    let k2 = bind(&p.qb, 3, &mut mw, &target, 4096, 4096, access::REMOTE_WRITE);
    assert_ne!(k1, k2);
    assert_eq!(
        write_status(&p, &src, 4, target.addr(4096), k2, 4),
        WcStatus::SUCCESS
    );
    assert_eq!(target.read(4096, 4), b"v1v2");
    let p = rc_pair(&a, &b);
    assert_eq!(
        write_status(&p, &src, 5, target.addr(4096), k1, 2),
        WcStatus::REM_ACCESS_ERR
    );
    let p = rc_pair(&a, &b);
    assert_eq!(
        write_status(&p, &src, 6, target.addr(0), k2, 2),
        WcStatus::REM_ACCESS_ERR
    );
    // LOCAL_INV does not apply to type 1.
    let p = rc_pair(&a, &b);
    p.qb.post_send(&[vhost_user_rdma_tests::fast::inv_wr(7, mw.key())])
        .unwrap();
    failed(&poll_one(&p.cqb), 7, WcStatus::LOC_PROT_ERR);
    // Unbound by a zero-length bind.
    let p = rc_pair(&a, &b);
    let b0 = mw.bind(0, 0, 0, 0);
    ok(&post_bind(&p.qb, 8, b0), 8, WcOpcode::BIND_MW);
    assert_eq!(
        write_status(&p, &src, 9, target.addr(4096), b0.new_rkey, 2),
        WcStatus::REM_ACCESS_ERR
    );
}

/// Spec 18.29, 12.11: a window holds its MR: `DEREG_MR` is refused with
/// `BUSY` (the number of bound windows) until the windows are unbound,
/// invalidated or deallocated; destroying the QP that bound a type 2
/// window invalidates it.
#[test]
fn a_bound_window_holds_its_mr() {
    let (d, a, b) = two_vms();
    let target = Buf::with_access(&b, &b.pd, 4096, BINDABLE);
    let handle = target.mr.handle();
    let p = rc_pair(&a, &b);
    let mut w1 = Mw::alloc(&b.pd, MW_TYPE_1).unwrap();
    let mut w2 = Mw::alloc(&b.pd, MW_TYPE_2).unwrap();
    bind(&p.qb, 1, &mut w1, &target, 0, 64, access::REMOTE_READ);
    let k2 = bind(&p.qb, 2, &mut w2, &target, 0, 64, access::REMOTE_READ);
    let r = Verbs::new(&mut b.t.vmm()).dereg_mr(handle);
    assert_eq!(status_of(&r), Some((Status::BUSY, 2)));
    drop(w1);
    let r = Verbs::new(&mut b.t.vmm()).dereg_mr(handle);
    assert_eq!(status_of(&r), Some((Status::BUSY, 1)));
    // The QP that bound w2 goes: w2 is free, the MR no longer held.
    let Pair { qa, qb, cqa, cqb } = p;
    drop((qa, qb));
    let p = Pair {
        qa: rc_qp(&a, &cqa),
        qb: rc_qp(&b, &cqb),
        cqa,
        cqb,
    };
    connect(&a, &p.qa, &b, &p.qb);
    let src = Buf::new(&a, 64);
    assert_eq!(
        write_status(&p, &src, 3, target.addr(0), k2, 8),
        WcStatus::REM_ACCESS_ERR
    );
    let mws = d.stats(1).device.resources.mw;
    Verbs::new(&mut b.t.vmm()).dereg_mr(handle).unwrap();
    std::mem::forget(target);
    drop(w2);
    assert_eq!(d.stats(1).device.resources.mw, mws - 1);
}

/// Spec 18.29: every refusal of a bind: `MW_BIND_ERR`, completion opcode
/// `BIND_MW`, the QP into ERR, and the window unchanged (its old key still
/// works). Format errors are `LOC_QP_OP_ERR`.
#[test]
fn every_bad_bind_is_refused_and_changes_nothing() {
    let (_d, a, b) = two_vms();
    let target = Buf::with_access(&b, &b.pd, 2 * 4096, BINDABLE);
    let plain = Buf::with_access(&b, &b.pd, 4096, access::ALL);
    let read_only = Buf::with_access(&b, &b.pd, 4096, access::REMOTE_READ | access::MW_BIND);
    let other_pd = Pd::alloc(&b.dev).unwrap();
    let foreign = Buf::with_access(&b, &other_pd, 4096, BINDABLE);
    let foreign_mw = Mw::alloc(&other_pd, MW_TYPE_2).unwrap();
    let src = Buf::new(&a, 64);
    src.write(0, b"still works");
    let mut mw = Mw::alloc(&b.pd, MW_TYPE_1).unwrap();
    let p = rc_pair(&a, &b);
    let good = bind(&p.qb, 1, &mut mw, &target, 0, 4096, access::REMOTE_WRITE);
    let base = MwBind {
        mw_handle: mw.handle(),
        new_rkey: good.wrapping_add(1) & 0xff | good & !0xff,
        addr: target.addr(0),
        length: 4096,
        mr_lkey: target.mr.lkey(),
        access: access::REMOTE_WRITE,
    };
    let cases: Vec<(&str, MwBind)> = vec![
        (
            "unknown window",
            MwBind {
                mw_handle: 0xdead_0003,
                ..base
            },
        ),
        (
            "a window of another PD",
            MwBind {
                mw_handle: foreign_mw.handle(),
                new_rkey: foreign_mw.key(),
                ..base
            },
        ),
        (
            "other key bits 31..8",
            MwBind {
                new_rkey: base.new_rkey ^ 0x100,
                ..base
            },
        ),
        (
            "an MR without MW_BIND",
            MwBind {
                mr_lkey: plain.mr.lkey(),
                addr: plain.addr(0),
                ..base
            },
        ),
        (
            "an MR of another PD",
            MwBind {
                mr_lkey: foreign.mr.lkey(),
                addr: foreign.addr(0),
                ..base
            },
        ),
        (
            "an unknown lkey",
            MwBind {
                mr_lkey: 0x0bad_0b00,
                ..base
            },
        ),
        (
            "below the MR",
            MwBind {
                addr: target.addr(0) - 1,
                ..base
            },
        ),
        (
            "past the MR",
            MwBind {
                addr: target.addr(4097),
                ..base
            },
        ),
        (
            "wrapping",
            MwBind {
                addr: u64::MAX - 10,
                ..base
            },
        ),
        (
            "LOCAL_WRITE",
            MwBind {
                access: access::LOCAL_WRITE | access::REMOTE_WRITE,
                ..base
            },
        ),
        (
            "MW_BIND",
            MwBind {
                access: access::MW_BIND,
                ..base
            },
        ),
        (
            "unknown bits",
            MwBind {
                access: 1 << 20,
                ..base
            },
        ),
        (
            "write without the MR's LOCAL_WRITE",
            MwBind {
                mr_lkey: read_only.mr.lkey(),
                addr: read_only.addr(0),
                ..base
            },
        ),
    ];
    for (i, (what, bad)) in cases.into_iter().enumerate() {
        let p = rc_pair(&a, &b);
        let wc = post_bind(&p.qb, 10 + i as u64, bad);
        failed(&wc, 10 + i as u64, WcStatus::MW_BIND_ERR);
        assert_eq!(wc.opcode(), Some(WcOpcode::BIND_MW), "{what}");
        wait_state(&p.qb, QpState::ERR);
        // Unchanged: the good key still grants the write (a type 1
        // window: through any QP of its PD).
        let p = rc_pair(&a, &b);
        assert_eq!(
            write_status(&p, &src, 100 + i as u64, target.addr(0), good, 11),
            WcStatus::SUCCESS,
            "{what}"
        );
        assert_eq!(target.read(0, 11), b"still works");
        target.buf.fill(0, 11, GUARD).unwrap();
    }
    // A bound type 2 window is invalidated before it is bound again.
    let p = rc_pair(&a, &b);
    let mut w2 = Mw::alloc(&b.pd, MW_TYPE_2).unwrap();
    bind(&p.qb, 200, &mut w2, &target, 0, 64, access::REMOTE_READ);
    let again = w2.bind(target.mr.lkey(), target.addr(0), 64, access::REMOTE_READ);
    failed(&post_bind(&p.qb, 201, again), 201, WcStatus::MW_BIND_ERR);
}
