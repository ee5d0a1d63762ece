//! A hostile guest and fast registration (spec 12.22, 18.27, 18.28): work
//! requests that register memory the VM does not own, regions and keys of
//! other PDs and other VMs, invalidation racing a peer's RDMA, and a flood
//! of the largest registrations. These run on the data path, through the
//! reference driver (which passes whatever values it is given), on a daemon
//! of their own: the attacker A (VM 0), a peer C of its tenant (VM 1), and
//! a bystander B in another tenant (VM 2), which must see nothing of it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma_tests::dp::{
    failed, ok, open, pattern, poll_one, rc_pair, wait_state, wr, Buf, Pair, Vm, WAIT,
};
use vhost_user_rdma_tests::fast::{inv_wr, reg_wr, send_inv_wr, unsignaled, FastBuf};
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{FastMr, FastReg, Pd, SendOp};

use crate::world::TOP_PAGE;

/// A daemon with A and C in the default tenant and B in tenant `red`.
fn world() -> (TestDaemon, Vm, Vm, Vm) {
    let d = TestDaemon::with_config(3, |c| {
        add_tenant(c, "red", &[2]);
    })
    .unwrap();
    let a = open(&d, 0);
    let c = open(&d, 1);
    let b = open(&d, 2);
    (d, a, c, b)
}

/// The bystander's traffic inside its own VM: `n` WRITEs and READs of a
/// pattern, every one checked.
fn bystander_works(b: &Vm, p: &Pair, seed: u64) {
    let (src, dst) = (Buf::new(b, 8192), Buf::new(b, 8192));
    let data = pattern(8192, seed);
    src.write(0, &data);
    p.qa.post_send(&[wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr(0),
            rkey: dst.mr.rkey(),
        },
        &[src.sge(0, 8192)],
    )])
    .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 8192), data);
}

/// Checks that the bystander B saw no error and is still served.
fn bystander_unharmed(d: &TestDaemon, b: &Vm, p: &Pair) {
    bystander_works(b, p, 99);
    let t = d.traffic(2);
    assert_eq!(
        (t.error_cqes, t.flushed),
        (0, 0),
        "the bystander saw errors"
    );
    let iso = d.isolation(2);
    assert_eq!(iso.bad_rkey, 0);
}

/// Posts `r` as a `REG_MR` on a fresh QP of A's and asserts that it fails
/// with `LOC_PROT_ERR` (opcode `REG_MR`) and its QP enters ERR.
fn refused(a: &Vm, c: &Vm, r: FastReg, what: &str) {
    let p = rc_pair(a, c);
    p.qa.post_send(&[reg_wr(7, r)]).unwrap();
    let wc = poll_one(&p.cqa);
    assert_eq!(wc.status(), Some(WcStatus::LOC_PROT_ERR), "{what}: {wc:?}");
    assert_eq!(wc.opcode(), Some(WcOpcode::REG_MR), "{what}");
    wait_state(&p.qa, QpState::ERR);
}

/// A region that was refused registrations is still free: its key grants
/// nothing to the peer, nothing counts as registered, and a proper
/// registration then works.
fn still_free(d: &TestDaemon, a: &Vm, c: &Vm, fb: &mut FastBuf) {
    assert_eq!(
        d.stats(0).device.resources.registered_bytes,
        4096 * 2,
        "only A's Bufs"
    );
    let p = rc_pair(c, a);
    let src = Buf::new(c, 64);
    let op = SendOp::RdmaWrite {
        remote_addr: fb.addr(0),
        rkey: fb.mr.key(),
    };
    p.qa.post_send(&[wr(1, op, &[src.sge(0, 64)])]).unwrap();
    failed(&poll_one(&p.cqa), 1, WcStatus::REM_ACCESS_ERR);
    let p = rc_pair(a, c);
    fb.register(&p.qa, 2);
}

/// Spec 18.27: a `REG_MR` of pages the VM does not own fails with
/// `LOC_PROT_ERR` and changes nothing: a page in the hole between RAM
/// regions, past the end of RAM, at the top of the address space,
/// misaligned, or of a page size that runs past its region (the doorbell
/// region is never in the memory table, so its guest address is one of
/// these); a page array outside RAM, misaligned, crossing a 4 KiB
/// boundary or past the end of RAM. The bystander sees nothing.
#[test]
fn fast_registration_of_memory_the_vm_does_not_own() {
    let (d, a, c, b) = world();
    let pb = rc_pair(&b, &b);
    // Two Bufs of A count as registered bytes (`still_free`).
    let (_x, _y) = (Buf::new(&a, 4096), Buf::new(&a, 4096));
    let mut fb = FastBuf::new(&a, 4);
    let layout = a.t.mem().layout().clone();
    let (r0, r1) = (layout.regions[0], layout.regions[1]);
    let good = fb.map(access::ALL);
    let own: Vec<u64> = fb.buf.pages().to_vec();
    let with = |i: usize, gpa: u64| {
        let mut v = own.clone();
        v[i] = gpa;
        v
    };
    for (what, pages, shift) in [
        ("a page in the hole", with(2, r0.end()), 12),
        ("a page past the end of RAM", with(2, r1.end()), 12),
        (
            "a page at the top of the address space",
            with(2, TOP_PAGE),
            12,
        ),
        (
            "a page ending past the end of RAM",
            with(3, r1.end() - 2048),
            12,
        ),
        ("a misaligned page", with(1, own[1] + 8), 12),
        ("512 MiB pages, larger than region 0", vec![0; 4], 29),
        ("1 GiB pages from region 1", vec![r1.gpa; 4], 30),
    ] {
        let r = fb
            .mr
            .map(&pages, shift, good.iova, good.length, access::ALL)
            .unwrap();
        refused(&a, &c, r, what);
    }
    // The page array itself, in a page of A's.
    let arrays = a.dev.alloc_dma(4096, 4096).unwrap();
    let base = arrays.gpa(0).unwrap();
    let list: Vec<u8> = own.iter().flat_map(|p| p.to_le_bytes()).collect();
    arrays.write(4096 - 16, &list[..16]).unwrap();
    for (what, gpa) in [
        ("an array in the hole", r0.end()),
        ("an array past the end of RAM", r1.end() - 8),
        ("a misaligned array", base + 9),
        ("an array across a 4 KiB boundary", base + 4096 - 16),
        ("an array at the top of the address space", u64::MAX - 7),
    ] {
        let r = fb
            .mr
            .map(&own, 12, good.iova, good.length, access::ALL)
            .unwrap();
        refused(
            &a,
            &c,
            FastReg {
                pages_gpa: gpa,
                ..r
            },
            what,
        );
    }
    // Unchanged by all that; and a proper registration works.
    still_free(&d, &a, &c, &mut fb);
    bystander_unharmed(&d, &b, &pb);
}

/// Spec 18.27: fields a `REG_MR` must not have: another region's key bits,
/// more pages than the region's room, page sizes out of range, a length of
/// 0 or one that does not fit its pages or wraps, access flags against
/// section 10.5, more than `max_mr_bytes`. Each fails with
/// `LOC_PROT_ERR`; the region stays free.
#[test]
fn fast_registration_with_bad_fields() {
    let d = TestDaemon::with_config(3, |c| {
        add_tenant(c, "red", &[2]);
        for v in &mut c.vms {
            v.limits.max_mr_bytes = 64 << 10;
        }
    })
    .unwrap();
    let (a, c, b) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let pb = rc_pair(&b, &b);
    let (x, _y) = (Buf::new(&a, 4096), Buf::new(&a, 4096));
    let mut fb = FastBuf::new(&a, 4);
    let other = FastMr::alloc(&a.pd, 4).unwrap();
    let good = fb.map(access::ALL);
    let five: Vec<u64> = [fb.buf.pages(), &fb.buf.pages()[..1]].concat();
    let cases: Vec<(&str, FastReg)> = vec![
        (
            "another region's key",
            FastReg {
                key: other.key() | 1,
                ..good
            },
        ),
        (
            "the key of nothing",
            FastReg {
                key: good.key ^ 0x8000_0000,
                ..good
            },
        ),
        ("0 pages", FastReg { npages: 0, ..good }),
        (
            "page shift 11",
            FastReg {
                page_shift: 11,
                ..good
            },
        ),
        (
            "page shift 31",
            FastReg {
                page_shift: 31,
                ..good
            },
        ),
        ("length 0", FastReg { length: 0, ..good }),
        (
            "one byte more than its pages",
            FastReg {
                length: 4 * 4096 + 1,
                ..good
            },
        ),
        (
            "an iova offset that pushes it past its pages",
            FastReg {
                iova: good.iova + 1,
                ..good
            },
        ),
        (
            "an iova that wraps",
            FastReg {
                iova: u64::MAX - 4095,
                ..good
            },
        ),
        (
            "unknown access bits",
            FastReg {
                access: 0x100,
                ..good
            },
        ),
        (
            "remote write without local write",
            FastReg {
                access: access::REMOTE_WRITE,
                ..good
            },
        ),
        (
            "remote atomic without local write",
            FastReg {
                access: access::REMOTE_ATOMIC,
                ..good
            },
        ),
        (
            "a handle of nothing",
            FastReg {
                mr_handle: other.handle() ^ 0x7777,
                ..good
            },
        ),
        (
            "an ordinary region's handle",
            FastReg {
                mr_handle: x.mr.handle(),
                ..good
            },
        ),
    ];
    for (what, r) in cases {
        refused(&a, &c, r, what);
    }
    // More pages than the region's room (the array has five).
    let r = fb
        .mr
        .map(&five[..4], 12, good.iova, good.length, access::ALL)
        .unwrap();
    refused(
        &a,
        &c,
        FastReg { npages: 5, ..r },
        "more pages than max_num_sg",
    );
    // max_mr_bytes: 64 KiB, 8 KiB registered by the Bufs; 16 pages of 4 KiB
    // fit, 2 pages of 32 KiB do not.
    let big = a.dev.alloc_dma(64 << 10, 32 << 10).unwrap();
    let pages = [big.gpa(0).unwrap(), big.gpa(32 << 10).unwrap()];
    let r = fb
        .mr
        .map(&pages, 15, 0x1_0000, 64 << 10, access::ALL)
        .unwrap();
    refused(&a, &c, r, "more than max_mr_bytes");
    still_free(&d, &a, &c, &mut fb);
    drop(other);
    bystander_unharmed(&d, &b, &pb);
}

/// Spec 18.27: a region of another PD of the VM cannot be registered,
/// invalidated (`LOCAL_INV`) or remotely invalidated (`SEND_WITH_INV`)
/// through a QP of this PD, nor a region of another VM whatever its key;
/// an ordinary region's key is no `ALLOC_MR` key. Each attempt fails, and
/// the regions keep their registrations.
#[test]
fn regions_of_other_pds_and_other_vms() {
    let (d, a, c, b) = world();
    let pb = rc_pair(&b, &b);
    // A region of a second PD of A's, registered through a QP of that PD.
    let pd2 = Pd::alloc(&a.dev).unwrap();
    let vm2 = Vm {
        t: a.t.clone(),
        dev: a.dev.clone(),
        pd: pd2,
    };
    let mut theirs = FastBuf::new(&vm2, 1);
    let p2 = rc_pair(&vm2, &c);
    let k_theirs = theirs.register(&p2.qa, 1);
    // C's own region, registered.
    let mut cs = FastBuf::new(&c, 1);
    let pc = rc_pair(&c, &a);
    let k_c = cs.register(&pc.qa, 1);
    let ordinary = Buf::new(&a, 4096);
    // REG_MR of the other PD's region (it is free of nothing: make it so).
    p2.qa.post_send(&[inv_wr(2, k_theirs)]).unwrap();
    ok(&poll_one(&p2.cqa), 2, WcOpcode::LOCAL_INV);
    let r = theirs.map(access::ALL);
    refused(&a, &c, r, "a free region of another PD");
    let k_theirs = theirs.register(&p2.qa, 3);
    // LOCAL_INV through a QP of A's PD: another PD's key, C's key (another
    // VM), an ordinary region's keys.
    for (what, key) in [
        ("another PD's region", k_theirs),
        ("another VM's region", k_c),
        ("an ordinary region's lkey", ordinary.mr.lkey()),
        ("an ordinary region's rkey", ordinary.mr.rkey()),
    ] {
        let p = rc_pair(&a, &c);
        p.qa.post_send(&[inv_wr(4, key)]).unwrap();
        let wc = poll_one(&p.cqa);
        assert_eq!(wc.status(), Some(WcStatus::LOC_PROT_ERR), "{what}: {wc:?}");
        assert_eq!(wc.opcode(), Some(WcOpcode::LOCAL_INV), "{what}");
    }
    // SEND_WITH_INV from C to a QP of A's first PD, naming the region of
    // A's second PD: a remote operation error.
    let p = rc_pair(&c, &a);
    let dst = Buf::new(&a, 64);
    vhost_user_rdma_tests::dp::recv(&p.qb, 5, &[dst.sge(0, 64)]);
    let w = vhost_user_rdma_tests::fast::inline(send_inv_wr(6, k_theirs, &[]), b"x");
    p.qa.post_send(&[w]).unwrap();
    failed(&poll_one(&p.cqa), 6, WcStatus::REM_OP_ERR);
    failed(&poll_one(&p.cqb), 5, WcStatus::WR_FLUSH_ERR);
    // Both regions still registered: C writes through both keys.
    let src = Buf::new(&c, 64);
    src.write(0, b"still here");
    for (vm, fb, key) in [(&vm2, &theirs, k_theirs), (&c, &cs, k_c)] {
        let p = rc_pair(&c, vm);
        let op = SendOp::RdmaWrite {
            remote_addr: fb.addr(0),
            rkey: key,
        };
        p.qa.post_send(&[wr(7, op, &[src.sge(0, 10)])]).unwrap();
        ok(&poll_one(&p.cqa), 7, WcOpcode::RDMA_WRITE);
        assert_eq!(fb.read(0, 10), b"still here");
    }
    drop((p2, theirs, vm2));
    bystander_unharmed(&d, &b, &pb);
}

/// Invalidation racing a peer's RDMA: A registers and invalidates its
/// region in a loop (two pages alternately) while C writes through the
/// current key and, after each invalidation completed, through the key
/// just invalidated. No write through an invalidated key lands or
/// succeeds; the daemon keeps serving, and the bystander is unaffected.
#[test]
fn invalidation_races_leave_no_stale_access() {
    const ROUNDS: usize = 24;
    let (d, a, c, b) = world();
    let pb = rc_pair(&b, &b);
    let owner = rc_pair(&a, &c);
    let mut fb = FastBuf::new(&a, 1);
    let other = a.dev.alloc_dma(4096, 4096).unwrap();
    let pages = [fb.buf.pages()[0], other.pages()[0]];
    let iova = fb.addr(0);
    // Pairs made beforehand: a stale write fails its pair.
    let stale_pairs: Vec<Pair> = (0..ROUNDS).map(|_| rc_pair(&c, &a)).collect();
    let live_pairs: Vec<Pair> = (0..ROUNDS * 2).map(|_| rc_pair(&c, &a)).collect();
    let (stale_src, live_src) = (Buf::new(&c, 64), Buf::new(&c, 64));
    stale_src.write(0, &[0x5a; 64]);
    live_src.write(0, &[0x11; 64]);
    // keys[i]: the key of round i, published once registered; invalidated
    // once `done` > i.
    let keys: Vec<AtomicU32> = (0..ROUNDS).map(|_| AtomicU32::new(0)).collect();
    let (current, done) = (AtomicU32::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let (stale_ok, live_ok, live_refused) =
        (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            for (i, key) in keys.iter().enumerate() {
                let r = fb
                    .mr
                    .map(&[pages[i % 2]], 12, iova, 4096, access::ALL)
                    .unwrap();
                owner.qa.post_send(&[unsignaled(reg_wr(1, r))]).unwrap();
                key.store(r.key, Ordering::Release);
                current.store(r.key, Ordering::Release);
                owner.qa.post_send(&[inv_wr(2, r.key)]).unwrap();
                ok(&poll_one(&owner.cqa), 2, WcOpcode::LOCAL_INV);
                done.store(i as u64 + 1, Ordering::Release);
            }
            // The race needs the live writer to have tried once: on a busy
            // machine it may be scheduled only now (it failed so once).
            let deadline = Instant::now() + WAIT;
            while live_ok.load(Ordering::Relaxed) + live_refused.load(Ordering::Relaxed) == 0 {
                assert!(Instant::now() < deadline, "the live writer never ran");
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Release);
        });
        // Through the key just invalidated: every one must fail.
        s.spawn(|| {
            for (i, p) in stale_pairs.iter().enumerate() {
                let deadline = Instant::now() + WAIT;
                while done.load(Ordering::Acquire) <= i as u64 {
                    assert!(Instant::now() < deadline, "round {i} never ended");
                    std::thread::yield_now();
                }
                let key = keys[i].load(Ordering::Acquire);
                let op = SendOp::RdmaWrite {
                    remote_addr: iova,
                    rkey: key,
                };
                p.qa.post_send(&[wr(3, op, &[stale_src.sge(0, 64)])])
                    .unwrap();
                let wc = poll_one(&p.cqa);
                if wc.is_success() {
                    stale_ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        // Through the current key: succeeds or fails as the race goes.
        s.spawn(|| {
            let mut pairs = live_pairs.iter();
            let mut p = pairs.next();
            while let Some(q) = p {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let op = SendOp::RdmaWrite {
                    remote_addr: iova,
                    rkey: current.load(Ordering::Acquire),
                };
                q.qa.post_send(&[wr(4, op, &[live_src.sge(0, 8)])]).unwrap();
                if poll_one(&q.cqa).is_success() {
                    live_ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    live_refused.fetch_add(1, Ordering::Relaxed);
                    p = pairs.next();
                }
            }
        });
    });
    assert_eq!(
        stale_ok.load(Ordering::Relaxed),
        0,
        "a write through an invalidated key succeeded"
    );
    let landed = |b: Vec<u8>| b.contains(&0x5a);
    assert!(
        !landed(fb.read(0, 64)) && !landed(other.to_vec(0, 64).unwrap()),
        "a stale write landed"
    );
    // The race ran: some writes got through, and everything is accounted.
    assert!(live_ok.load(Ordering::Relaxed) + live_refused.load(Ordering::Relaxed) > 0);
    assert_eq!(d.stats(0).device.resources.registered_bytes, 0);
    // A is still served: a last registration works.
    let p = rc_pair(&a, &c);
    fb.register(&p.qa, 9);
    bystander_unharmed(&d, &b, &pb);
}

/// Spec 18.27, "Cost": a `REG_MR` is charged to the VM's QoS as a work
/// request of `npages` 4 KiB pages. A flood of 512-page registrations by a
/// VM limited to 64 MiB/s takes at least the time its bytes allow (17 of
/// 2 MiB: 0.5 s), while the bystander is served meanwhile.
#[test]
fn a_flood_of_large_registrations_is_bounded_by_qos() {
    const N: u64 = 17;
    const RATE: u64 = 64 << 20;
    let (d, a, c, b) = world();
    let pb = rc_pair(&b, &b);
    let p = rc_pair(&a, &c);
    let page = a.dev.alloc_dma(4096, 4096).unwrap();
    let mut mr = FastMr::alloc(&a.pd, 512).unwrap();
    let pages = vec![page.gpa(0).unwrap(); 512];
    d.set_vm_qos(
        0,
        QosSpec {
            bytes_per_sec: RATE,
            ..QosSpec::default()
        },
    )
    .unwrap();
    let throttled = d.traffic(0).throttled;
    let mut wrs = Vec::new();
    for i in 0..N {
        let r = mr
            .map(&pages, 12, 0x10_0000, 512 * PAGE_SIZE, access::ALL)
            .unwrap();
        wrs.push(unsignaled(reg_wr(2 * i, r)));
        wrs.push(if i + 1 == N {
            inv_wr(2 * i + 1, r.key)
        } else {
            unsignaled(inv_wr(2 * i + 1, r.key))
        });
    }
    let start = Instant::now();
    p.qa.post_send(&wrs).unwrap();
    // The bystander's traffic goes on meanwhile.
    bystander_works(&b, &pb, 1);
    ok(&poll_one(&p.cqa), 2 * N - 1, WcOpcode::LOCAL_INV);
    let took = start.elapsed();
    let floor =
        Duration::from_secs_f64(((N - 1) * 512 * PAGE_SIZE - RATE / 200) as f64 / RATE as f64);
    assert!(
        took >= floor,
        "{N} registrations of 2 MiB in {took:?}, below {floor:?} at 64 MiB/s"
    );
    assert!(d.traffic(0).throttled > throttled, "never held back");
    assert_eq!(
        d.traffic(0).send_bytes,
        0,
        "a registration moves no payload"
    );
    bystander_unharmed(&d, &b, &pb);
}
