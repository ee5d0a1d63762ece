#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The shared-memory doorbell mode (spec 18.7) end to end: the test VMM
//! plays a QEMU with VIRTIO shared memory (and checks QEMU's rules on every
//! `SHMEM_MAP`), the reference driver writes producer indices into the
//! doorbell pages, and the daemon's engine reads them there.
//!
//! `datapath.rs` runs its whole suite in this mode as well
//! (`RDMA_TEST_DOORBELL=shmem`, see `scripts/test.sh`); this file covers
//! what is specific to the mode: mapping, parking, slot allocation,
//! fallbacks and isolation between the pages of different contexts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::*;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{QpInit as RawQpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::config::F_SHMEM_DOORBELL;
use virtio_rdma_abi::datapath::{
    db_slot_offset, WcOpcode, DB_FLAG_KICK, DB_NONE, DB_PAGE_SIZE, DB_PAGE_SLOTS,
};
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, Device, Pd, Qp, QpInit, Srq};

fn shmem_opts() -> VmmOptions {
    VmmOptions {
        shmem: true,
        ..VmmOptions::default()
    }
}

fn page_off(page: u32) -> usize {
    (u64::from(page) * DB_PAGE_SIZE) as usize
}

/// The mode is negotiated, the region mapped exactly once, as one window
/// covering the whole power-of-two region, and RDMA works through it.
#[test]
fn shmem_mode_maps_once_and_carries_traffic() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open_shmem(&d, 1);
    for vm in [&a, &b] {
        assert_ne!(vm.t.vmm().features() & F_SHMEM_DOORBELL, 0);
        let w = vm.window().unwrap();
        assert!(
            vm.dev.doorbell_page().is_some(),
            "requests {} violations {:?}",
            w.map_requests(),
            w.violations()
        );
        let w = vm.window().unwrap();
        assert!(w.len().is_power_of_two());
        assert_eq!(w.mappings(), vec![(0, w.len() as u64)]);
        assert_eq!(w.map_count(), 1);
    }
    let p = rc_pair(&a, &b);
    assert!(p.qa.doorbell_slot().is_some() && p.qb.doorbell_slot().is_some());
    let (ba, bb) = (Buf::new(&a, 1 << 20), Buf::new(&b, 1 << 20));
    for (i, len) in [1usize, 64, 4096, 1 << 19].into_iter().enumerate() {
        let data = pattern(len, i as u64);
        write_and_send_back(&p, &ba, &bb, &data, 1 << 19, i as u64);
    }
    // More contexts on the same VM: distinct pages, still one mapping.
    let a2 = Device::open(a.t.clone()).unwrap();
    assert_ne!(a2.doorbell_page(), a.dev.doorbell_page());
    let w = a.window().unwrap();
    assert_eq!(w.map_count(), 1);
    assert_eq!(w.violations(), Vec::<String>::new());
    assert_eq!(b.window().unwrap().violations(), Vec::<String>::new());
}

/// When the engine parks it sets DB_FLAG_KICK in the page header (and the
/// driver then notifies); work posted after that still completes.
#[test]
fn parked_engine_is_woken_through_the_page_header() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open_shmem(&d, 1);
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let w = a.window().unwrap();
    let header = page_off(a.dev.doorbell_page().unwrap());
    for round in 0..20u64 {
        // Wait until the engine has parked.
        let deadline = Instant::now() + Duration::from_secs(5);
        while w.load_u32(header).unwrap() & DB_FLAG_KICK == 0 {
            assert!(Instant::now() < deadline, "engine never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        let data = pattern(100, round);
        write_and_send_back(&p, &ba, &bb, &data, 2048, round);
    }
}

/// A VM whose VMM has no shared memory (QEMU < 11.1) and one whose VMM has
/// it exchange data; the guest-RAM VM never sees the feature.
#[test]
fn mixed_modes_interoperate() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open(&d, 1, VmmOptions::default());
    assert!(a.dev.doorbell_page().is_some());
    assert!(b.dev.doorbell_page().is_none());
    assert_eq!(b.t.vmm().features() & F_SHMEM_DOORBELL, 0);
    let p = rc_pair(&a, &b);
    assert!(p.qa.doorbell_slot().is_some());
    assert!(p.qb.doorbell_slot().is_none());
    let (ba, bb) = (Buf::new(&a, 65536), Buf::new(&b, 65536));
    for i in 0..10u64 {
        let data = pattern(1000 + i as usize * 3000, i);
        write_and_send_back(&p, &ba, &bb, &data, 32768, i);
    }
}

/// A VMM that negotiates shared memory but refuses the map: contexts fall
/// back to guest-RAM doorbells, and the daemon asks only once.
#[test]
fn refused_map_falls_back_to_guest_ram() {
    let d = TestDaemon::start(2).unwrap();
    let opts = VmmOptions {
        shmem: true,
        shmem_refuse_map: true,
        ..VmmOptions::default()
    };
    let a = Vm::open(&d, 0, opts);
    let b = Vm::open_shmem(&d, 1);
    assert_eq!(a.dev.doorbell_page(), None);
    let p = rc_pair(&a, &b);
    assert_eq!(p.qa.doorbell_slot(), None);
    let (ba, bb) = (Buf::new(&a, 8192), Buf::new(&b, 8192));
    write_and_send_back(&p, &ba, &bb, &pattern(5000, 7), 0, 1);
    let w = a.window().unwrap();
    assert_eq!(w.map_requests(), 1, "the daemon retried a refused map");
    assert_eq!(w.map_count(), 0);
}

/// QEMU drops shared memory mappings on a device reset; the daemon maps
/// again at the next context and never maps while the device is stopped.
#[test]
fn reset_drops_the_mapping_and_the_daemon_maps_again() {
    let d = TestDaemon::start(1).unwrap();
    let mut vmm: TestVmm = d.connect_with(0, shmem_opts()).unwrap();
    let w = vmm.shmem_window().cloned().unwrap();
    let mut v = Verbs::new(&mut vmm);
    let c1 = v.create_ctx_full().unwrap();
    assert_ne!(c1.doorbell_page, DB_NONE);
    assert_eq!(w.map_count(), 1);
    vmm.reset().unwrap();
    assert!(w.mappings().is_empty(), "reset keeps mappings");
    let mut v = Verbs::new(&mut vmm);
    let c2 = v.create_ctx_full().unwrap();
    assert_ne!(c2.doorbell_page, DB_NONE);
    assert_eq!(w.map_count(), 2);
    // A queue of the new context works through its slot: create a QP and
    // check its slot was zeroed even if the page had old contents.
    let pd = v.alloc_pd(c2.ctx_handle).unwrap();
    let cq = v.create_cq(c2.ctx_handle, 64).unwrap();
    let (req, tail) = v.qp_request(&RawQpInit::rc(pd, cq)).unwrap();
    let r = v.create_qp_raw(&req, &tail).unwrap();
    assert!(r.db_slot < DB_PAGE_SLOTS);
    assert_eq!(w.violations(), Vec::<String>::new());
    // Queues stopped and restarted without a reset (a pause): no map while
    // stopped, and the mapping stays.
    vmm.stop_queues().unwrap();
    assert_eq!(w.mappings().len(), 1);
    assert_eq!(w.violations(), Vec::<String>::new());
}

/// A VMM that reconnects gets a fresh window, mapped again.
#[test]
fn reconnect_maps_a_new_window() {
    let d = TestDaemon::start(2).unwrap();
    let b = Vm::open_shmem(&d, 1);
    for round in 0..3u64 {
        let a = Vm::open_shmem(&d, 0);
        assert_eq!(a.window().unwrap().map_count(), 1);
        let p = rc_pair(&a, &b);
        let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
        write_and_send_back(&p, &ba, &bb, &pattern(3000, round), 0, round);
        drop(p);
        drop((ba, bb));
        drop(a);
        d.wait_released(0);
    }
}

/// A context has DB_PAGE_SLOTS slots; further queues use guest-RAM
/// doorbells and work; a freed slot is reused and handed out zeroed.
#[test]
fn slots_run_out_into_guest_ram_mode() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open_shmem(&d, 1);
    let w = a.window().unwrap();
    let page = a.dev.doorbell_page().unwrap();
    // Fill the driver's context with raw QPs (cheaper than driver QPs).
    let (mut handles, slots) = {
        let mut vmm = a.t.vmm();
        let mut v = Verbs::new(&mut vmm);
        let pd = v.alloc_pd(a.dev.ctx_handle()).unwrap();
        let cq = v.create_cq(a.dev.ctx_handle(), 64).unwrap();
        let mut handles = Vec::new();
        let mut slots = Vec::new();
        for _ in 0..DB_PAGE_SLOTS {
            let (req, tail) = v.qp_request(&RawQpInit::rc(pd, cq)).unwrap();
            let r = v.create_qp_raw(&req, &tail).unwrap();
            handles.push(r.qp_handle);
            slots.push(r.db_slot);
        }
        (handles, slots)
    };
    let mut sorted = slots.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), DB_PAGE_SLOTS as usize, "slots not distinct");
    assert!(sorted.iter().all(|&s| s < DB_PAGE_SLOTS));
    // The page is full: the driver's QP works in guest-RAM mode.
    let p = rc_pair(&a, &b);
    assert_eq!(p.qa.doorbell_slot(), None);
    assert!(p.qb.doorbell_slot().is_some());
    let (ba, bb) = (Buf::new(&a, 8192), Buf::new(&b, 8192));
    write_and_send_back(&p, &ba, &bb, &pattern(4000, 1), 4096, 1);
    // Free one slot after dirtying it; a new QP gets it back zeroed.
    let victim = slots[17];
    let off = page_off(page) + db_slot_offset(victim).unwrap() as usize;
    assert!(w.store_u32(off, 0xdead_beef));
    {
        let mut vmm = a.t.vmm();
        let mut v = Verbs::new(&mut vmm);
        v.destroy_qp(handles.swap_remove(17)).unwrap();
    }
    let cq = Cq::create(&a.dev, 64).unwrap();
    let q = rc_qp(&a, &cq);
    assert_eq!(q.doorbell_slot(), Some(victim));
    assert_eq!(w.load_u32(off), Some(0));
}

/// SRQs get slots too, and receives posted through them are consumed.
#[test]
fn srq_uses_its_slot() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open_shmem(&d, 1);
    let srq = Srq::create(&b.pd, 64, 2, 0).unwrap();
    assert!(srq.doorbell_slot().is_some());
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let qa = rc_qp(&a, &cqa);
    let mut init = QpInit::rc(&cqb);
    init.cap = cap();
    init.srq = Some(srq.clone());
    let qb = Qp::create(&b.pd, &init).unwrap();
    connect(&a, &qa, &b, &qb);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    for i in 0..8u64 {
        srq.post_recv(&[virtio_rdma_driver::RecvWr {
            wr_id: 100 + i,
            sg_list: &[bb.sge(i as usize * 256, 256)],
        }])
        .unwrap();
    }
    for i in 0..8u64 {
        let data = pattern(200, i);
        ba.write(0, &data);
        let sg = [ba.sge(0, 200)];
        qa.post_send(&[wr(i, virtio_rdma_driver::SendOp::Send, &sg)])
            .unwrap();
        ok(&poll_one(&cqa), i, WcOpcode::SEND);
        let r = poll_one(&cqb);
        ok(&r, 100 + i, WcOpcode::RECV);
        assert_eq!(bb.read(i as usize * 256, 200), data);
    }
}

/// A guest process that scribbles over its own context's page (header,
/// every slot) hurts only its own queues: another context of the same VM
/// keeps exchanging correct data with a third party, and the daemon keeps
/// serving.
#[test]
fn scribbling_over_a_doorbell_page_stays_in_its_context() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open_shmem(&d, 0);
    let b = Vm::open_shmem(&d, 1);
    // The rogue context on VM A, with a live QP connected to VM B.
    let rogue_dev = Device::open(a.t.clone()).unwrap();
    let rogue_page = rogue_dev.doorbell_page().unwrap();
    assert_ne!(Some(rogue_page), a.dev.doorbell_page());
    let rogue = Vm {
        t: a.t.clone(),
        pd: Pd::alloc(&rogue_dev).unwrap(),
        dev: rogue_dev,
    };
    let rp = rc_pair(&rogue, &b);
    let w = a.window().unwrap();
    // Unassigned slots of the good context's page: the device ignores them.
    let good_page = a.dev.doorbell_page().unwrap();
    let p = rc_pair(&a, &b);
    let used: Vec<u32> = [p.qa.doorbell_slot()].into_iter().flatten().collect();
    let stop = AtomicBool::new(false);
    let (ba, bb) = (Buf::new(&a, 65536), Buf::new(&b, 65536));
    std::thread::scope(|s| {
        let w = w.clone();
        let stop = &stop;
        let used = &used;
        s.spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                i = i.wrapping_add(0x9E37_79B9);
                for off in (0..DB_PAGE_SIZE as usize).step_by(4) {
                    w.store_u32(page_off(rogue_page) + off, i ^ off as u32);
                }
                for slot in (0..DB_PAGE_SLOTS).filter(|s| !used.contains(s)) {
                    let off = db_slot_offset(slot).unwrap() as usize;
                    w.store_u32(page_off(good_page) + off, i);
                    w.store_u32(page_off(good_page) + off + 4, !i);
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let deadline = Instant::now() + Duration::from_millis(1500);
        let mut i = 0u64;
        while Instant::now() < deadline {
            i += 1;
            let len = 1 + (i as usize * 7919) % 32768;
            write_and_send_back(&p, &ba, &bb, &pattern(len, i), 32768, i);
        }
        stop.store(true, Ordering::Relaxed);
        assert!(i > 10, "only {i} round trips");
    });
    // The rogue QP saw garbage producer indices: it is broken (ERR) or
    // at least never corrupted anyone else; the daemon still serves VM A.
    let st = rp.qa.query().map(|r| r.attr.qp_state);
    assert!(st.is_ok(), "daemon stopped answering: {st:?}");
    assert_eq!(p.qa.query().unwrap().attr.qp_state, u32::from(QpState::RTS));
    assert_eq!(w.violations(), Vec::<String>::new());
}

/// Finding 7: the doorbell region outlives a connection, so the producer
/// indices a guest wrote into its slots must not be there for the next
/// connection (or the next boot after a reset) to find: the daemon zeroes
/// the whole region on disconnect and on reset. (It kept them.)
#[test]
fn disconnect_and_reset_zero_the_doorbell_region() {
    let d = TestDaemon::start(1).unwrap();
    for reset in [false, true] {
        let mut vmm: TestVmm = d.connect_with(0, shmem_opts()).unwrap();
        let w = vmm.shmem_window().cloned().unwrap();
        let mut v = Verbs::new(&mut vmm);
        // Two contexts: the next connection's single one will not take
        // (and zero) the second one's page.
        let c0 = v.create_ctx_full().unwrap();
        let c = v.create_ctx_full().unwrap();
        assert_ne!(c.doorbell_page, c0.doorbell_page);
        let pd = v.alloc_pd(c.ctx_handle).unwrap();
        let cq = v.create_cq(c.ctx_handle, 64).unwrap();
        let mut slots = Vec::new();
        for _ in 0..3 {
            let (req, tail) = v.qp_request(&RawQpInit::rc(pd, cq)).unwrap();
            slots.push(v.create_qp_raw(&req, &tail).unwrap().db_slot);
        }
        // The guest posts: producer indices in its slots.
        let at = |slot: u32| page_off(c.doorbell_page) + db_slot_offset(slot).unwrap() as usize;
        for &s in &slots {
            assert!(w.store_u32(at(s), 0x5eed_0000 + s));
        }
        if reset {
            vmm.reset().unwrap();
        } else {
            drop(vmm);
            d.wait_released(0);
            vmm = d.connect_with(0, shmem_opts()).unwrap();
        }
        let w = vmm.shmem_window().cloned().unwrap();
        let mut v = Verbs::new(&mut vmm);
        let c2 = v.create_ctx_full().unwrap();
        assert_ne!(c2.doorbell_page, DB_NONE);
        assert_ne!(c2.doorbell_page, c.doorbell_page, "the page is not reused");
        let left: Vec<u32> = slots
            .iter()
            .map(|&s| w.load_u32(at(s)).unwrap_or(u32::MAX))
            .collect();
        assert!(left.iter().all(|&x| x == 0), "reset {reset}: {left:x?}");
    }
}

/// Protocol features of a VMM that never sends `RESET_DEVICE`; the device
/// then recognises a reset from the restart of the queues (spec 15.1).
fn shmem_opts_without_reset_device() -> VmmOptions {
    VmmOptions {
        shmem: true,
        ..VmmOptions::without_reset_device()
    }
}

/// Doorbell pages of `n` new contexts (`DB_NONE` for those without one).
fn new_ctx_pages(vmm: &mut TestVmm, n: usize) -> Vec<u32> {
    let mut v = Verbs::new(vmm);
    (0..n)
        .map(|_| v.create_ctx_full().unwrap().doorbell_page)
        .collect()
}

/// The pages that are not `DB_NONE`, sorted.
fn pages_of(ctx_pages: &[u32]) -> Vec<u32> {
    let mut p: Vec<u32> = ctx_pages
        .iter()
        .copied()
        .filter(|&p| p != DB_NONE)
        .collect();
    p.sort_unstable();
    p
}

/// Spec 15.2 and 18.7: a VMM reconnection without a device reset leaves
/// guest processes mapping the doorbell pages of the previous connection
/// (the guest kernel has not noticed yet). Those pages stay out of use
/// until the driver resets the device, announced (`RESET_DEVICE`) or
/// recognised from the queues; a reconnection alone never releases them,
/// and a context that finds only such pages works in guest-RAM mode.
#[test]
fn pages_of_a_closed_connection_stay_unused_until_a_reset() {
    for opts in [shmem_opts(), shmem_opts_without_reset_device()] {
        let d = TestDaemon::with_limits(
            1,
            vhost_user_rdma::Limits {
                max_ctx: 4,
                ..vhost_user_rdma::Limits::default()
            },
        )
        .unwrap();
        // Connection 1: two contexts get two of the four pages.
        let mut vmm = d.connect_with(0, opts.clone()).unwrap();
        let first = pages_of(&new_ctx_pages(&mut vmm, 2));
        assert_eq!(first.len(), 2, "{first:?}");
        vmm.disconnect();
        assert!(d.wait_released(0).device.resources.is_empty());

        // Connection 2, the guest not reset: only the two other pages.
        let mut vmm = d.connect_with(0, opts.clone()).unwrap();
        let ctxs = new_ctx_pages(&mut vmm, 4);
        let second = pages_of(&ctxs);
        assert_eq!(second.len(), 2, "contexts got {ctxs:x?}");
        assert!(
            second.iter().all(|p| !first.contains(p)),
            "a page of connection 1 was handed out again: {first:?} then {second:?}"
        );
        vmm.disconnect();
        assert!(d.wait_released(0).device.resources.is_empty());

        // Connection 3: every page was assigned when a connection closed.
        let mut vmm = d.connect_with(0, opts.clone()).unwrap();
        {
            let mut v = Verbs::new(&mut vmm);
            let ctxs: Vec<_> = (0..4).map(|_| v.create_ctx_full().unwrap()).collect();
            let pages: Vec<u32> = ctxs.iter().map(|c| c.doorbell_page).collect();
            assert_eq!(pages, vec![DB_NONE; 4], "a reconnection released pages");
            // Such a context works in guest-RAM mode: its QPs get no slot.
            let pd = v.alloc_pd(ctxs[0].ctx_handle).unwrap();
            let cq = v.create_cq(ctxs[0].ctx_handle, 64).unwrap();
            let (req, tail) = v.qp_request(&RawQpInit::rc(pd, cq)).unwrap();
            assert_eq!(v.create_qp_raw(&req, &tail).unwrap().db_slot, DB_NONE);
        }

        // The driver resets the device: every page is usable again.
        vmm.reset().unwrap();
        let after = pages_of(&new_ctx_pages(&mut vmm, 4));
        assert_eq!(after, vec![0, 1, 2, 3], "opts {:?}", opts.protocol_features);
        let w = vmm.shmem_window().cloned().unwrap();
        assert_eq!(w.violations(), Vec::<String>::new());
    }
}
