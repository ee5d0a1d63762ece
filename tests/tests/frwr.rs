//! Fast registration, invalidation and the local DMA key (`F_MEM_MGT`,
//! spec 12.22, 18.27, 18.28) between two VMs of one daemon, through the
//! real vhost-user socket and the reference driver: `ALLOC_MR` and its
//! limits, `REG_MR` work requests and the peer's RDMA through the new key,
//! the consumer byte, `LOCAL_INV`, `SEND_WITH_INV`, the order of a send
//! queue, RDMA READ responses into a region invalidated meanwhile, and
//! SGEs of guest-physical memory.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{
    assert_state, expect_event, failed, ok, open, pattern, poll_one, rc_pair, recv, status,
    two_vms, wait_state, wr, Buf, Vm, GUARD,
};
use vhost_user_rdma_tests::fast::{
    inline, inv_wr, invalidate, prefix, reg_wr, send_inv_wr, unsignaled, FastBuf,
};
use vhost_user_rdma_tests::guest_mem::{MemLayout, RegionSpec, MIB};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{status_of, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{ALL_DEVICE_FEATURES, F_MEM_MGT};
use virtio_rdma_abi::ctrl::{quota, Opcode, Status};
use virtio_rdma_abi::datapath::{Sge, WcOpcode, WcStatus, CQE_WITH_IMM, CQE_WITH_INV};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{FastMr, RecvWr, SendOp};

/// The registered bytes and MRs of VM `i`.
fn mr_counts(d: &TestDaemon, i: usize) -> (usize, u64) {
    let r = d.stats(i).device.resources;
    (r.mr, r.registered_bytes)
}

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

/// Spec 12.1, 12.22: the device reports the local DMA key and the page
/// limit of fast registration; `ALLOC_MR` checks its request, counts
/// against `max_mr`, charges its translation space at once, registers
/// nothing, and gives everything back when deregistered. Its key is its
/// lkey and rkey, and no other live key shares its bits 31 to 8.
#[test]
fn alloc_mr_checks_its_request_and_counts_as_an_mr() {
    let d = TestDaemon::with_limits(
        2,
        Limits {
            max_mr: 5,
            ..Limits::default()
        },
    )
    .unwrap();
    let a = open(&d, 0);
    assert_eq!(a.dev.attr().max_fast_reg_pages, 512);
    let dma = a.dev.local_dma_lkey().unwrap();
    assert!(dma != 0 && dma & 0xff == 0, "{dma:#x}");
    assert_eq!(status(FastMr::alloc(&a.pd, 0)), (Status::INVALID, 4));
    assert_eq!(status(FastMr::alloc(&a.pd, 513)), (Status::RANGE, 4));
    let r = Verbs::new(&mut a.t.vmm()).alloc_mr(0xdead_0001, 1);
    assert_eq!(status_of(&r), Some((Status::BAD_HANDLE, 0)));
    let before = d.stats(0).device.resources;
    let big = FastMr::alloc(&a.pd, 512).unwrap();
    let after = d.stats(0).device.resources;
    assert_eq!(after.mr, before.mr + 1);
    assert!(
        after.host_bytes >= before.host_bytes + 512 * 8,
        "the translation space of 512 pages is charged at ALLOC_MR: {} -> {}",
        before.host_bytes,
        after.host_bytes
    );
    assert_eq!(after.registered_bytes, before.registered_bytes, "free");
    // The raw response: one key, valid as lkey and rkey.
    let raw = Verbs::new(&mut a.t.vmm())
        .alloc_mr(a.pd.handle(), 3)
        .unwrap();
    assert_eq!(raw.lkey, raw.rkey);
    assert_ne!(raw.lkey, 0);
    let small = FastMr::alloc(&a.pd, 1).unwrap();
    let normal = Buf::new(&a, 4096);
    // The fifth MR: ALLOC_MR regions count as MRs.
    let last = FastMr::alloc(&a.pd, 1).unwrap();
    assert_eq!(status(FastMr::alloc(&a.pd, 1)), (Status::QUOTA, quota::MR));
    let fast_keys = [big.key(), raw.lkey, small.key(), last.key()];
    for f in fast_keys {
        assert_ne!(prefix(f), prefix(dma), "{f:#x}");
        for k in [normal.mr.lkey(), normal.mr.rkey(), dma] {
            assert_ne!(prefix(k), prefix(f), "{k:#x} shares bits 31..8 with {f:#x}");
        }
        assert_eq!(
            fast_keys
                .iter()
                .filter(|&&g| prefix(g) == prefix(f))
                .count(),
            1
        );
    }
    drop(small);
    let again = FastMr::alloc(&a.pd, 1).unwrap();
    Verbs::new(&mut a.t.vmm()).dereg_mr(raw.mr_handle).unwrap();
    drop((big, normal, last, again));
    assert_eq!(d.stats(0).device.resources, before, "everything given back");
}

/// Spec 12.22: the translation space is charged to the host memory
/// budget at `ALLOC_MR`, which fails with `QUOTA` detail 9 once the
/// budget is spent, and works again once a region is freed.
#[test]
fn alloc_mr_is_charged_to_the_host_memory_budget() {
    let d = TestDaemon::with_limits(
        1,
        Limits {
            max_host_bytes: 64 << 10,
            ..Limits::default()
        },
    )
    .unwrap();
    let a = open(&d, 0);
    let mut regions = Vec::new();
    let refused = loop {
        match FastMr::alloc(&a.pd, 512) {
            Ok(r) => regions.push(r),
            Err(e) => break status::<()>(Err(e)),
        }
        assert!(
            regions.len() <= 16,
            "64 KiB hold at most 16 translations of 4 KiB"
        );
    };
    assert_eq!(refused, (Status::QUOTA, quota::HOST_BYTES));
    assert!(!regions.is_empty(), "the budget takes at least one");
    // A region freed gives its share back.
    regions.pop();
    regions.push(FastMr::alloc(&a.pd, 512).unwrap());
}

/// Spec 12.22, 12.1: without `F_MEM_MGT` negotiated `ALLOC_MR` is
/// `UNSUPPORTED` with the opcode as detail, and the device reports no
/// local DMA key and no fast registration.
#[test]
fn without_the_feature_there_is_no_fast_registration() {
    let d = TestDaemon::start(1).unwrap();
    let a = Vm::open(
        &d,
        0,
        VmmOptions {
            driver_features: ALL_DEVICE_FEATURES & !F_MEM_MGT,
            ..VmmOptions::default()
        },
    );
    assert_eq!(a.dev.features() & F_MEM_MGT, 0);
    assert_eq!(a.dev.attr().local_dma_lkey, 0);
    assert_eq!(a.dev.attr().max_fast_reg_pages, 0);
    let r = Verbs::new(&mut a.t.vmm()).alloc_mr(a.pd.handle(), 1);
    assert_eq!(
        status_of(&r),
        Some((Status::UNSUPPORTED, u32::from(Opcode::ALLOC_MR)))
    );
}

/// Spec 18.27: a `REG_MR` work request registers the region under a new
/// consumer byte; the peer then writes and reads it through the new key,
/// the owner uses it as an lkey, and its bytes count while registered.
#[test]
fn a_peer_writes_and_reads_through_a_fast_registration() {
    let (d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let mut fb = FastBuf::new(&b, 3);
    let k0 = fb.mr.key();
    let (mrs, bytes) = mr_counts(&d, 1);
    let k1 = fb.register(&p.qb, 1);
    assert_eq!(prefix(k1), prefix(k0));
    assert_ne!(k1, k0, "a new consumer byte");
    assert_eq!(mr_counts(&d, 1), (mrs, bytes + 3 * 4096));
    let src = Buf::new(&a, 3 * 4096);
    let data = pattern(3 * 4096 - 100, 7);
    src.write(0, &data);
    let sg = [src.sge(0, data.len())];
    p.qa.post_send(&[wr(2, write_to(fb.addr(50), k1), &sg)])
        .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
    assert_eq!(fb.read(50, data.len()), data);
    assert!(fb.read(0, 50).iter().all(|&x| x == GUARD));
    assert!(fb.read(3 * 4096 - 50, 50).iter().all(|&x| x == GUARD));
    // READ it back.
    let back = Buf::guarded(&a, 3 * 4096);
    let sg = [back.sge(0, data.len())];
    p.qa.post_send(&[wr(3, read_from(fb.addr(50), k1), &sg)])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_READ);
    assert_eq!(back.read(0, data.len()), data);
    // The owner sends from the region under the key as an lkey.
    recv(&p.qa, 4, &[back.sge(0, 1000)]);
    p.qb.post_send(&[wr(4, SendOp::Send, &[fb.sge(60, 1000)])])
        .unwrap();
    ok(&poll_one(&p.cqb), 4, WcOpcode::SEND);
    let r = poll_one(&p.cqa);
    ok(&r, 4, WcOpcode::RECV);
    assert_eq!(back.read(0, 1000), &data[10..1010]);
    assert_eq!(r.invalidated(), None);
    // Invalidated: the bytes no longer count.
    invalidate(&p.qb, 5, k1);
    assert_eq!(mr_counts(&d, 1), (mrs, bytes));
}

/// Spec 18.27: after `LOCAL_INV` the key grants nothing: the peer's access
/// fails with `REM_ACCESS_ERR` (and is counted as a bad rkey); after a new
/// registration the old consumer byte is refused and the new one works.
#[test]
fn an_invalidated_or_old_key_is_refused() {
    let (d, a, b) = two_vms();
    let mut fb = FastBuf::new(&b, 2);
    let src = Buf::new(&a, 4096);
    src.write(0, b"before");
    let p = rc_pair(&a, &b);
    let k1 = fb.register(&p.qb, 1);
    p.qa.post_send(&[wr(2, write_to(fb.addr(0), k1), &[src.sge(0, 6)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
    assert_eq!(fb.read(0, 6), b"before");
    invalidate(&p.qb, 3, k1);
    let bad = d.isolation(0).bad_rkey;
    p.qa.post_send(&[wr(4, read_from(fb.addr(0), k1), &[src.sge(0, 6)])])
        .unwrap();
    failed(&poll_one(&p.cqa), 4, WcStatus::REM_ACCESS_ERR);
    expect_event(&b.dev, EventKind::QP_ACCESS_ERROR, p.qb.handle());
    assert_eq!(d.isolation(0).bad_rkey, bad + 1);
    // Registered again: the old byte is refused, the new one works.
    let p = rc_pair(&a, &b);
    let k2 = fb.register(&p.qb, 5);
    assert_eq!(prefix(k2), prefix(k1));
    assert_ne!(k2, k1);
    src.write(0, b"after!");
    p.qa.post_send(&[wr(6, write_to(fb.addr(0), k2), &[src.sge(0, 6)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 6, WcOpcode::RDMA_WRITE);
    assert_eq!(fb.read(0, 6), b"after!");
    src.write(0, b"stale!");
    p.qa.post_send(&[wr(7, write_to(fb.addr(0), k1), &[src.sge(0, 6)])])
        .unwrap();
    failed(&poll_one(&p.cqa), 7, WcStatus::REM_ACCESS_ERR);
    assert_eq!(fb.read(0, 6), b"after!", "nothing written with the old key");
}

/// Spec 18.27: a registered region is invalidated before it is registered
/// again. A `REG_MR` of a valid region fails with `LOC_PROT_ERR`
/// (completion opcode `REG_MR`), its QP enters ERR, and the region keeps
/// its registration.
#[test]
fn a_valid_region_is_not_registered_again() {
    let (_d, a, b) = two_vms();
    let mut fb = FastBuf::new(&b, 1);
    let p = rc_pair(&a, &b);
    let k1 = fb.register(&p.qb, 1);
    let r = fb.map(access::ALL);
    p.qb.post_send(&[reg_wr(2, r)]).unwrap();
    let wc = poll_one(&p.cqb);
    failed(&wc, 2, WcStatus::LOC_PROT_ERR);
    assert_eq!(wc.opcode(), Some(WcOpcode::REG_MR));
    wait_state(&p.qb, QpState::ERR);
    // Unchanged: the first key still works.
    let src = Buf::new(&a, 64);
    src.write(0, b"still k1");
    let p = rc_pair(&a, &b);
    p.qa.post_send(&[wr(3, write_to(fb.addr(0), k1), &[src.sge(0, 8)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(fb.read(0, 8), b"still k1");
    p.qa.post_send(&[wr(4, write_to(fb.addr(0), r.key), &[src.sge(0, 8)])])
        .unwrap();
    failed(&poll_one(&p.cqa), 4, WcStatus::REM_ACCESS_ERR);
}

/// Spec 18.27, 18.14: `SEND_WITH_INV` invalidates the responder's key as
/// the message arrives; the receive completes with `CQE_WITH_INV` and the
/// key in `imm_data`, the requester with `SEND`; the key is refused from
/// then on. Inline data too.
#[test]
fn send_with_invalidate_invalidates_the_responders_key() {
    let (d, a, b) = two_vms();
    let mut fb = FastBuf::new(&b, 1);
    let dst = Buf::guarded(&b, 4096);
    let src = Buf::new(&a, 4096);
    src.write(0, b"done with it");
    for (i, inline_data) in [false, true].into_iter().enumerate() {
        let p = rc_pair(&a, &b);
        let key = fb.register(&p.qb, 1);
        let (_, bytes) = mr_counts(&d, 1);
        recv(&p.qb, 2, &[dst.sge(0, 64)]);
        let sg = [src.sge(0, 12)];
        let w = if inline_data {
            inline(send_inv_wr(3, key, &[]), b"done with it")
        } else {
            send_inv_wr(3, key, &sg)
        };
        p.qa.post_send(&[w]).unwrap();
        ok(&poll_one(&p.cqa), 3, WcOpcode::SEND);
        let r = poll_one(&p.cqb);
        ok(&r, 2, WcOpcode::RECV);
        assert_eq!(r.invalidated(), Some(key), "{r:?}");
        assert_eq!(r.flags & CQE_WITH_INV, CQE_WITH_INV);
        assert_eq!(r.flags & CQE_WITH_IMM, 0);
        assert_eq!(r.imm_data, key);
        assert_eq!(r.byte_len, 12);
        assert_eq!(dst.read(0, 12), b"done with it");
        assert_eq!(mr_counts(&d, 1).1, bytes - 4096, "invalidation {i}");
        p.qa.post_send(&[wr(4, write_to(fb.addr(0), key), &sg)])
            .unwrap();
        failed(&poll_one(&p.cqa), 4, WcStatus::REM_ACCESS_ERR);
    }
}

/// Spec 18.27: a `SEND_WITH_INV` whose key names no `ALLOC_MR` region of
/// the receiving QP's PD (an ordinary region's rkey, one consumer byte
/// off, nothing at all) fails as a remote operation error: the requester
/// gets `REM_OP_ERR`, both QPs enter ERR, no receive completes but
/// flushed, and the region stays registered.
#[test]
fn send_with_invalidate_of_a_bad_key_is_a_remote_operation_error() {
    let (_d, a, b) = two_vms();
    let mut fb = FastBuf::new(&b, 1);
    let ordinary = Buf::guarded(&b, 4096);
    let src = Buf::new(&a, 4096);
    let p = rc_pair(&a, &b);
    let key = fb.register(&p.qb, 1);
    for (i, bad) in [
        ordinary.mr.rkey(),
        (key & !0xff) | (key.wrapping_add(1) & 0xff),
        0x00ab_cd00,
    ]
    .into_iter()
    .enumerate()
    {
        let p = rc_pair(&a, &b);
        recv(&p.qb, 10, &[ordinary.sge(0, 64)]);
        let w = send_inv_wr(11, bad, &[]);
        p.qa.post_send(&[inline(w, b"x")]).unwrap();
        failed(&poll_one(&p.cqa), 11, WcStatus::REM_OP_ERR);
        failed(&poll_one(&p.cqb), 10, WcStatus::WR_FLUSH_ERR);
        wait_state(&p.qa, QpState::ERR);
        assert_state(&p.qb, QpState::ERR);
        ordinary.assert_untouched(0, 64, &format!("bad key {i}"));
    }
    // The region was never touched: its key still works.
    let p = rc_pair(&a, &b);
    src.write(0, b"valid");
    p.qa.post_send(&[wr(1, write_to(fb.addr(0), key), &[src.sge(0, 5)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(fb.read(0, 5), b"valid");
}

/// Spec 18.27: work requests take effect in the QP's order. Posted in one
/// go, a WRITE before a `LOCAL_INV` and `REG_MR` gathers from the old
/// pages, one after them from the new; the old key fails after them.
#[test]
fn work_requests_before_a_registration_use_the_old_one() {
    let (_d, a, b) = two_vms();
    let dst = Buf::guarded(&b, 3 * 4096);
    let p = rc_pair(&a, &b);
    // Two buffers of A with different contents, one region mapped over
    // either at the same iova.
    let mut old = FastBuf::new(&a, 1);
    let new = a.dev.alloc_dma(4096, 4096).unwrap();
    old.write(0, &[0x11; 4096]);
    new.write(0, &[0x22; 4096]).unwrap();
    let k1 = old.register(&p.qa, 1);
    let iova = old.addr(0);
    let r2 = old
        .mr
        .map(new.pages(), 12, iova, 4096, access::LOCAL_WRITE)
        .unwrap();
    let at = |off: usize| write_to(dst.addr(off), dst.mr.rkey());
    let s1 = [Sge {
        addr: iova,
        length: 4096,
        lkey: k1,
    }];
    let s2 = [Sge {
        lkey: r2.key,
        ..s1[0]
    }];
    p.qa.post_send(&[
        unsignaled(wr(2, at(0), &s1)),
        unsignaled(inv_wr(3, k1)),
        unsignaled(reg_wr(4, r2)),
        wr(5, at(4096), &s2),
        wr(6, at(2 * 4096), &s1),
    ])
    .unwrap();
    ok(&poll_one(&p.cqa), 5, WcOpcode::RDMA_WRITE);
    failed(&poll_one(&p.cqa), 6, WcStatus::LOC_PROT_ERR);
    assert_eq!(dst.read(0, 4096), vec![0x11; 4096], "before: the old pages");
    assert_eq!(
        dst.read(4096, 4096),
        vec![0x22; 4096],
        "after: the new pages"
    );
    dst.assert_untouched(2 * 4096, 4096, "the old key after the registration");
    drop(new);
}

/// Spec 18.27: an RDMA READ whose response lands in a region that is
/// invalidated meanwhile fails with `LOC_PROT_ERR`. The READ (1 GiB into
/// a region of 512 2-MiB pages, all the same page, read in pieces) is in
/// flight once bytes have landed; another QP of the VM then invalidates.
#[test]
fn a_read_into_a_region_invalidated_meanwhile_fails() {
    const PAGE: usize = 2 << 20;
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let p2 = rc_pair(&a, &b);
    // The source: 1 GiB of B over one page of 0x5a.
    let page = b.dev.alloc_dma(4096, 4096).unwrap();
    page.fill(0, 4096, 0x5a).unwrap();
    // SAFETY: `page` outlives the region (dropped after it, below).
    let src = unsafe {
        vhost_user_rdma_tests::dp::repeated_page_mr(&b, &page, 0x4000_0000, 1 << 30).unwrap()
    };
    // The destination: one 2 MiB page of A, 512 times.
    let big = a.dev.alloc_dma(PAGE, PAGE).unwrap();
    big.fill(0, PAGE, GUARD).unwrap();
    let mut mr = FastMr::alloc(&a.pd, 512).unwrap();
    let gpa = big.gpa(0).unwrap();
    let r = mr
        .map(&[gpa; 512], 21, 0x1_0000_0000, 1 << 30, access::LOCAL_WRITE)
        .unwrap();
    p.qa.post_send(&[reg_wr(1, r)]).unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::REG_MR);
    let sg = [Sge {
        addr: 0x1_0000_0000,
        length: 1 << 30,
        lkey: r.key,
    }];
    p.qa.post_send(&[wr(2, read_from(0x4000_0000, src.rkey()), &sg)])
        .unwrap();
    // In flight once its first bytes landed.
    let deadline = std::time::Instant::now() + vhost_user_rdma_tests::dp::WAIT;
    while big.to_vec(0, 1).unwrap()[0] != 0x5a {
        assert!(
            std::time::Instant::now() < deadline,
            "the READ never started"
        );
        std::thread::yield_now();
    }
    p2.qa.post_send(&[inv_wr(3, r.key)]).unwrap();
    ok(&poll_one(&p2.cqa), 3, WcOpcode::LOCAL_INV);
    failed(&poll_one(&p.cqa), 2, WcStatus::LOC_PROT_ERR);
    drop((src, page));
}

/// Spec 18.28: SGEs with the local DMA key name guest-physical addresses,
/// for sending and receiving, in any PD, without registering anything.
#[test]
fn the_local_dma_key_sends_and_receives_guest_physical_memory() {
    let (d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let sbuf = a.dev.alloc_dma(8192, 4096).unwrap();
    let rbuf = b.dev.alloc_dma(8192, 4096).unwrap();
    rbuf.fill(0, 8192, GUARD).unwrap();
    let data = pattern(5000, 3);
    sbuf.write(0, &data).unwrap();
    let (mrs, bytes) = mr_counts(&d, 1);
    // Scattered pages: one SGE per page.
    let sg: Vec<Sge> = [(0, 4096), (4096, 5000 - 4096)]
        .iter()
        .map(|&(off, len)| a.dev.dma_sge(sbuf.gpa(off).unwrap(), len).unwrap())
        .collect();
    let rg: Vec<Sge> = [(0, 4096), (4096, 4096)]
        .iter()
        .map(|&(off, len)| b.dev.dma_sge(rbuf.gpa(off).unwrap(), len).unwrap())
        .collect();
    p.qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &rg,
    }])
    .unwrap();
    p.qa.post_send(&[wr(2, SendOp::Send, &sg)]).unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!(r.byte_len, 5000);
    assert_eq!(rbuf.to_vec(0, 5000).unwrap(), data);
    assert!(rbuf.to_vec(5000, 100).unwrap().iter().all(|&x| x == GUARD));
    assert_eq!(mr_counts(&d, 1), (mrs, bytes), "nothing registered");
    // An RDMA READ into guest-physical memory: local write.
    let back = a.dev.alloc_dma(4096, 4096).unwrap();
    let src = Buf::new(&b, 4096);
    src.write(0, &data[..4096]);
    let sg = [a.dev.dma_sge(back.gpa(0).unwrap(), 4096).unwrap()];
    p.qa.post_send(&[wr(3, read_from(src.addr(0), src.mr.rkey()), &sg)])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_READ);
    assert_eq!(back.to_vec(0, 4096).unwrap(), &data[..4096]);
}

/// Spec 18.28: the local DMA key is never an rkey: a remote access naming
/// it fails as an invalid key, and is counted as one.
#[test]
fn the_local_dma_key_is_not_an_rkey() {
    let (d, a, b) = two_vms();
    let dma = b.dev.local_dma_lkey().unwrap();
    let target = b.dev.alloc_dma(4096, 4096).unwrap();
    target.fill(0, 4096, GUARD).unwrap();
    let src = Buf::new(&a, 64);
    for (i, op) in [
        write_to(target.gpa(0).unwrap(), dma),
        read_from(target.gpa(0).unwrap(), dma),
    ]
    .into_iter()
    .enumerate()
    {
        let p = rc_pair(&a, &b);
        let bad = d.isolation(0).bad_rkey;
        p.qa.post_send(&[wr(1, op, &[src.sge(0, 64)])]).unwrap();
        failed(&poll_one(&p.cqa), 1, WcStatus::REM_ACCESS_ERR);
        assert_eq!(d.isolation(0).bad_rkey, bad + 1, "op {i}");
    }
    assert!(target.to_vec(0, 4096).unwrap().iter().all(|&x| x == GUARD));
}

/// Spec 18.28: a local DMA key SGE must lie in one RAM region of the
/// memory table: one in a hole, past the end of RAM, overflowing, or
/// across two regions that touch fails with `LOC_PROT_ERR`; so does the
/// key without `F_MEM_MGT`. Regions that touch: 0..64 MiB and 64..128 MiB.
#[test]
fn local_dma_key_sges_outside_one_ram_region_fail() {
    let d = TestDaemon::start(3).unwrap();
    let touching = MemLayout {
        regions: vec![
            RegionSpec {
                gpa: 0,
                size: 64 * MIB,
            },
            RegionSpec {
                gpa: 64 * MIB,
                size: 64 * MIB,
            },
            RegionSpec {
                gpa: 4 << 30,
                size: 64 * MIB,
            },
        ],
    };
    let a = Vm::open(
        &d,
        0,
        VmmOptions {
            mem: touching,
            ..VmmOptions::default()
        },
    );
    let b = open(&d, 1);
    let dma = a.dev.local_dma_lkey().unwrap();
    let sge = |addr: u64, length: u32| Sge {
        addr,
        length,
        lkey: dma,
    };
    for (what, s) in [
        ("across two regions that touch", sge(64 * MIB - 8, 16)),
        ("in the hole", sge(128 * MIB, 16)),
        ("past the end of RAM", sge((4 << 30) + 64 * MIB - 8, 16)),
        ("overflowing", sge(u64::MAX - 7, 16)),
    ] {
        let p = rc_pair(&a, &b);
        let dst = Buf::guarded(&b, 64);
        p.qa.post_send(&[wr(1, write_to(dst.addr(0), dst.mr.rkey()), &[s])])
            .unwrap();
        failed(&poll_one(&p.cqa), 1, WcStatus::LOC_PROT_ERR);
        dst.assert_untouched(0, 64, what);
    }
    // Inside either region it works.
    let p = rc_pair(&a, &b);
    let dst = Buf::guarded(&b, 64);
    let s = sge(64 * MIB - 16, 16);
    p.qa.post_send(&[wr(2, write_to(dst.addr(0), dst.mr.rkey()), &[s])])
        .unwrap();
    ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
    // Without F_MEM_MGT the key is nothing.
    let c = Vm::open(
        &d,
        2,
        VmmOptions {
            driver_features: ALL_DEVICE_FEATURES & !F_MEM_MGT,
            ..VmmOptions::default()
        },
    );
    let cq = virtio_rdma_driver::Cq::create(&c.dev, 16).unwrap();
    let qc = vhost_user_rdma_tests::dp::rc_qp(&c, &cq);
    let qa2 = vhost_user_rdma_tests::dp::rc_qp(&a, &p.cqa);
    vhost_user_rdma_tests::dp::connect(&c, &qc, &a, &qa2);
    let target = Buf::guarded(&a, 64);
    let page = c.dev.alloc_dma(4096, 4096).unwrap();
    let s = sge(page.gpa(0).unwrap(), 16);
    qc.post_send(&[wr(3, write_to(target.addr(0), target.mr.rkey()), &[s])])
        .unwrap();
    failed(&poll_one(&cq), 3, WcStatus::LOC_PROT_ERR);
    target.assert_untouched(0, 64, "no F_MEM_MGT");
    drop(b);
}
