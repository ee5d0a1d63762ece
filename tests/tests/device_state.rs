//! A VM's device state saved from one daemon and loaded into another (spec
//! chapter 20; here the hand-over to a new daemon): the guest's objects,
//! handles, QP numbers, keys, queue positions and posted receives survive,
//! and RDMA goes on as if nothing had happened. Through the real
//! vhost-user sockets; the state is taken and given with the device's
//! `save_state` / `load_state`, which `SET_DEVICE_STATE_FD` runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vhost_user_rdma::migration::MigrationError;
use vhost_user_rdma_tests::dp::{connect, ok, poll_one, rc_qp, wr, write_op, Buf, Vm};
use vhost_user_rdma_tests::error::Error;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_driver::{Cq, RecvWr, SendOp};

/// A daemon of `vms` VMs and a standby of VM 0, the last instance.
fn with_standby(vms: usize) -> TestDaemon {
    TestDaemon::with_standby(vms).unwrap()
}

#[test]
fn a_vm_moves_to_a_new_daemon_with_its_objects_and_traffic_goes_on() {
    // Both daemons outlive the VM (its objects are destroyed through the
    // second at the end).
    let d1 = TestDaemon::start(1).unwrap();
    let d2 = TestDaemon::start(1).unwrap();
    let a = Vm::open(&d1, 0, VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let src = Buf::new(&a, 8192);
    let dst = Buf::new(&a, 8192);
    src.write(0, b"before the move");
    q1.post_send(&[wr(1, write_op(&dst, 0), &[src.sge(0, 15)])])
        .unwrap();
    ok(&poll_one(&cq), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(0, 15), b"before the move");
    // A receive posted before the move is taken after it.
    q2.post_recv(&[RecvWr {
        wr_id: 50,
        sg_list: &[dst.sge(4096, 64)],
    }])
    .unwrap();
    let (qpn1, qpn2) = (q1.qpn(), q2.qpn());
    let before = d1.stats(0).device.resources;

    let bases = a.t.vmm().stop_queues().unwrap();
    let dev1 = d1.daemon().device(0).unwrap().clone();
    let state = dev1.save_state().unwrap();
    assert!(state.len() as u64 <= dev1.state_bound());

    let dev2 = d2.daemon().device(0).unwrap().clone();
    a.t.vmm()
        .move_to(d2.socket(0), &bases, || {
            dev2.load_state(&state)
                .map_err(|e| Error::Backend(e.to_string()))
        })
        .unwrap();
    let after = d2.stats(0).device.resources;
    assert_eq!(
        (after.ctx, after.pd, after.cq, after.qp, after.mr),
        (before.ctx, before.pd, before.cq, before.qp, before.mr)
    );
    assert_eq!(after.registered_bytes, before.registered_bytes);
    assert_eq!(
        after.host_bytes, before.host_bytes,
        "host memory charged alike"
    );
    assert_eq!(d2.daemon().qpns_in_use(), 2);
    assert_eq!((q1.qpn(), q2.qpn()), (qpn1, qpn2));

    // The same QPs, keys and CQ, through the new daemon.
    src.write(0, b"after the move!");
    q1.post_send(&[
        wr(2, write_op(&dst, 1024), &[src.sge(0, 15)]),
        wr(3, SendOp::Send, &[src.sge(0, 15)]),
    ])
    .unwrap();
    ok(&poll_one(&cq), 2, WcOpcode::RDMA_WRITE);
    let mut done = [poll_one(&cq), poll_one(&cq)];
    done.sort_by_key(|w| w.wr_id);
    ok(&done[0], 3, WcOpcode::SEND);
    ok(&done[1], 50, WcOpcode::RECV);
    assert_eq!(dst.read(1024, 15), b"after the move!");
    assert_eq!(dst.read(4096, 15), b"after the move!");
    // A new object gets a handle the old daemon never gave out.
    let cq2 = Cq::create(&a.dev, 16).unwrap();
    assert_ne!(cq2.handle(), cq.handle());
}

/// A state is refused by an instance that is running, that has objects,
/// or that is another VM's; a damaged one is refused whole; none of it
/// leaves a QP number or key taken.
#[test]
fn a_state_is_refused_where_it_does_not_belong_and_nothing_is_left_taken() {
    let d1 = TestDaemon::start(1).unwrap();
    let a = Vm::open(&d1, 0, VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let _buf = Buf::new(&a, 8192);
    let dev1 = d1.daemon().device(0).unwrap().clone();
    assert!(
        matches!(dev1.save_state(), Err(MigrationError::NotSavable(_))),
        "saved while running"
    );
    let bases = a.t.vmm().stop_queues().unwrap();
    let state = dev1.save_state().unwrap();

    // Another daemon whose VM 0 is running with objects of its own.
    let d2 = TestDaemon::start(2).unwrap();
    let b = Vm::open(&d2, 0, VmmOptions::default());
    let dev2 = d2.daemon().device(0).unwrap().clone();
    assert!(matches!(
        dev2.load_state(&state),
        Err(MigrationError::Invalid(_))
    ));
    let b_bases = b.t.vmm().stop_queues().unwrap();
    assert!(
        matches!(dev2.load_state(&state), Err(MigrationError::Invalid(m)) if m.contains("objects")),
        "loaded over objects"
    );
    // VM 1 is another VM.
    let dev21 = d2.daemon().device(1).unwrap().clone();
    assert!(
        matches!(dev21.load_state(&state), Err(MigrationError::Invalid(m)) if m.contains("VM")),
        "another VM's state"
    );
    // Damaged: every byte flipped in turn in a sample of positions.
    let qpns = d2.daemon().qpns_in_use();
    let keys = d2.daemon().keys_in_use();
    for pos in (0..state.len()).step_by(state.len() / 64 + 1) {
        let mut bad = state.clone();
        bad[pos] ^= 0x41;
        assert!(
            dev21.load_state(&bad).is_err(),
            "byte {pos} damaged and loaded"
        );
    }
    assert!(dev21.load_state(&state[..state.len() - 1]).is_err());
    assert_eq!(d2.daemon().qpns_in_use(), qpns, "QP numbers left taken");
    assert_eq!(d2.daemon().keys_in_use(), keys, "keys left taken");
    assert!(d2.stats(1).device.resources.is_empty());
    // The source goes on where it stopped.
    a.t.vmm().resume(&bases).unwrap();
    b.t.vmm().resume(&b_bases).unwrap();
    let src = Buf::new(&a, 4096);
    src.write(0, b"still here");
    q1.post_send(&[wr(9, write_op(&src, 2048), &[src.sge(0, 10)])])
        .unwrap();
    ok(&poll_one(&cq), 9, WcOpcode::RDMA_WRITE);
    assert_eq!(src.read(2048, 10), b"still here");
}

/// A state whose frame checks but whose contents lie is refused, each lie
/// for its own reason, and leaves nothing taken: a page outside the VM's
/// RAM, one key for two regions, a QP on a CQ that does not exist, a handle
/// that does not fit its slot, more QPs than the destination allows, a QP
/// number another VM of the destination holds, a CQ ring smaller than its
/// depth, QP attributes `MODIFY_QP` would refuse, an MR longer than its
/// pages.
#[test]
fn a_well_framed_state_that_lies_is_refused_and_leaves_nothing_taken() {
    use vhost_user_rdma::migration::state::PagesState;
    use vhost_user_rdma::migration::{decode, encode, DeviceState};
    use virtio_rdma_abi::qp::QpAttr;
    use virtio_rdma_abi::Wire;
    let d1 = TestDaemon::start(1).unwrap();
    let a = Vm::open(&d1, 0, VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let (_m1, _m2) = (Buf::new(&a, 8192), Buf::new(&a, 4096));
    let dev1 = d1.daemon().device(0).unwrap().clone();
    let bases = a.t.vmm().stop_queues().unwrap();
    let bytes = dev1.save_state().unwrap();
    let good = decode(&bytes, dev1.state_bound()).unwrap();

    // The destination: VM 0 of a daemon whose VM 1 has a QP of its own;
    // VM 0 stopped with no object (its driver not loaded), as a
    // destination VMM leaves it before it loads a state.
    let d2 = TestDaemon::with_config(2, |c| c.vms[0].limits.max_qp = 2).unwrap();
    let other = Vm::open(&d2, 1, VmmOptions::default());
    let ocq = Cq::create(&other.dev, 16).unwrap();
    let oqp = rc_qp(&other, &ocq);
    let mut dest = d2.connect(0).unwrap();
    let _ = dest.stop_queues().unwrap();
    let dev2 = d2.daemon().device(0).unwrap().clone();
    let (qpns, keys) = (d2.daemon().qpns_in_use(), d2.daemon().keys_in_use());

    type Lie = Box<dyn Fn(&mut DeviceState)>;
    let lies: Vec<(&str, Lie)> = vec![
        (
            "page outside RAM",
            Box::new(|s: &mut DeviceState| {
                s.objects.mrs.live[0].1.pages = PagesState::Contiguous {
                    page_shift: 12,
                    npages: 2,
                    base: 1 << 40,
                };
            }),
        ),
        (
            "one lkey twice",
            Box::new(|s: &mut DeviceState| {
                let k = s.objects.mrs.live[0].1.lkey;
                s.objects.mrs.live[1].1.lkey = k;
            }),
        ),
        (
            "a CQ that does not exist",
            Box::new(|s: &mut DeviceState| {
                s.objects.qps.live[0].1.send_cq ^= 0x40_0000;
            }),
        ),
        (
            "a handle off its slot",
            Box::new(|s: &mut DeviceState| {
                s.objects.cqs.live[0].0 = s.objects.cqs.live[0].0.wrapping_add(1 << 20);
            }),
        ),
        (
            "too many QPs",
            Box::new(|s: &mut DeviceState| {
                let q = s.objects.qps.live[0].clone();
                s.objects.qps.gens.push(1);
                let slot = (s.objects.qps.gens.len() - 1) as u32;
                s.objects.qps.live.push(((1 << 20) | slot, q.1));
            }),
        ),
        (
            "a QP number taken",
            Box::new(move |s: &mut DeviceState| {
                s.objects.qps.live[1].1.qpn = oqp.qpn();
            }),
        ),
        (
            "a CQ ring too small",
            Box::new(|s: &mut DeviceState| {
                s.objects.cqs.live[0].1.depth = 1 << 12;
            }),
        ),
        (
            "a QP attribute out of range",
            Box::new(|s: &mut DeviceState| {
                let q = &mut s.objects.qps.live[0].1;
                let mut a = QpAttr::parse(&q.attr).unwrap();
                a.max_dest_rd_atomic = 200;
                q.attr = a.to_bytes();
            }),
        ),
        (
            "a source GID the VM does not have",
            Box::new(|s: &mut DeviceState| {
                let q = &mut s.objects.qps.live[0].1;
                let mut a = QpAttr::parse(&q.attr).unwrap();
                a.av.sgid_index = 15;
                q.attr = a.to_bytes();
            }),
        ),
        (
            "an MR longer than its pages",
            Box::new(|s: &mut DeviceState| {
                s.objects.mrs.live[0].1.length += 1 << 20;
            }),
        ),
    ];
    for (what, lie) in &lies {
        let mut s = good.clone();
        lie(&mut s);
        let bytes = encode(&s).unwrap();
        let r = dev2.load_state(&bytes);
        assert!(
            matches!(r, Err(MigrationError::Invalid(_))),
            "{what}: {r:?}"
        );
        assert_eq!(
            d2.daemon().qpns_in_use(),
            qpns,
            "{what}: QP numbers left taken"
        );
        assert_eq!(d2.daemon().keys_in_use(), keys, "{what}: keys left taken");
        assert!(
            d2.stats(0).device.resources.is_empty(),
            "{what}: objects left"
        );
    }
    // The truth loads.
    dev2.load_state(&bytes).unwrap();
    assert_eq!(d2.stats(0).device.resources.qp, 2);
    a.t.vmm().resume(&bases).unwrap();
}

/// Spec 20.5 and 20.6, one daemon: VM A moves to its standby while its RC
/// peer B keeps its connection. B's WRITE posted during the blackout is
/// held, not failed, and lands once A runs at the standby; A's QPs keep
/// their numbers and keys; the old instance is left without objects and
/// its disconnect fails nobody; the daemon's QP numbers are the same.
#[test]
fn a_vm_moves_to_its_standby_and_its_peer_keeps_the_connection() {
    use vhost_user_rdma_tests::dp::{fast, rc_pair_with};
    let d = with_standby(2);
    assert_eq!(d.daemon().vm_count(), 3);
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    // Retries that a blackout would use up at once, were it not held.
    let p = rc_pair_with(&a, &b, fast);
    let abuf = Buf::new(&a, 8192);
    let bbuf = Buf::new(&b, 8192);
    bbuf.write(0, b"from B, held");
    abuf.write(0, b"from A, moved");
    p.qa.post_send(&[wr(1, write_op(&bbuf, 4096), &[abuf.sge(0, 13)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    let (qpn_a, qpns) = (p.qa.qpn(), d.daemon().qpns_in_use());

    let bases = a.t.vmm().stop_queues().unwrap();
    let src = d.daemon().device(0).unwrap().clone();
    let standby = d.daemon().device(2).unwrap().clone();
    let state = src.save_state().unwrap();
    // The blackout: B writes into A meanwhile.
    p.qb.post_send(&[wr(2, write_op(&abuf, 4096), &[bbuf.sge(0, 12)])])
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        p.cqb.poll_one().is_none(),
        "B's WRITE completed in the blackout"
    );
    a.t.vmm()
        .move_to(d.socket(2), &bases, || {
            standby
                .load_state(&state)
                .map_err(|e| Error::Backend(e.to_string()))
        })
        .unwrap();
    ok(&poll_one(&p.cqb), 2, WcOpcode::RDMA_WRITE);
    assert_eq!(abuf.read(4096, 12), b"from B, held");
    assert!(
        d.stats(0).device.resources.is_empty(),
        "the old instance kept objects"
    );
    assert_eq!(d.stats(2).device.resources.qp, 1);
    assert_eq!((p.qa.qpn(), d.daemon().qpns_in_use()), (qpn_a, qpns));
    // Both ways, after the move.
    p.qa.post_send(&[wr(3, write_op(&bbuf, 6000), &[abuf.sge(0, 13)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(bbuf.read(6000, 13), b"from A, moved");
    // The state is taken: no second load, here or in the old instance.
    assert!(src.load_state(&state).is_err());
    // B's QP is alive and got no fatal event from the old instance's end.
    assert!(
        b.dev
            .next_async_event(Some(std::time::Duration::from_millis(50)))
            .unwrap()
            .is_none_or(|e| virtio_rdma_abi::event::EventKind::from_u32(e.kind)
                != Some(virtio_rdma_abi::event::EventKind::QP_FATAL)),
        "B's QP failed"
    );
}

/// Spec 20.5: a migration that fails after its destination loaded the
/// state (the destination never starts, the source resumes) leaves the VM
/// as it was: the objects come back to the source when it starts again,
/// and its peer's connection and the objects' numbers are unchanged.
#[test]
fn a_source_that_resumes_before_its_standby_starts_gets_its_state_back() {
    use vhost_user_rdma_tests::dp::rc_pair;
    let d = with_standby(2);
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let p = rc_pair(&a, &b);
    let abuf = Buf::new(&a, 4096);
    let bbuf = Buf::new(&b, 4096);
    let before = d.stats(0).device.resources;
    let bases = a.t.vmm().stop_queues().unwrap();
    let state = d.daemon().device(0).unwrap().save_state().unwrap();
    // The destination VMM connects to the standby and loads, then dies.
    let mut dest = d.connect(2).unwrap();
    let _ = dest.stop_queues().unwrap();
    d.daemon().device(2).unwrap().load_state(&state).unwrap();
    assert!(d.stats(0).device.resources.is_empty());
    dest.disconnect();
    d.wait_released(2);
    // The source resumes.
    a.t.vmm().resume(&bases).unwrap();
    let after = d.stats(0).device.resources;
    assert_eq!(
        (after.qp, after.mr, after.cq),
        (before.qp, before.mr, before.cq)
    );
    assert!(d.stats(2).device.resources.is_empty());
    abuf.write(0, b"back home");
    p.qa.post_send(&[wr(1, write_op(&bbuf, 0), &[abuf.sge(0, 9)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bbuf.read(0, 9), b"back home");
    p.qb.post_send(&[wr(2, write_op(&abuf, 2048), &[bbuf.sge(0, 9)])])
        .unwrap();
    ok(&poll_one(&p.cqb), 2, WcOpcode::RDMA_WRITE);
    assert_eq!(abuf.read(2048, 9), b"back home");
}

/// Spec 20.1, QEMU's order: the destination front-end sends the state
/// before `SET_FEATURES` and `SET_MEM_TABLE`. The objects move at the load
/// and the checks that need the memory table and features run at the
/// start: A's objects and its peer's connection carry on. A state that
/// does not fit at the start (features other than the source's) fails the
/// device with `DEVICE_FATAL` and leaves no object.
#[test]
fn a_state_sent_before_the_memory_table_is_put_in_place_at_the_start() {
    use vhost_user_rdma_tests::dp::rc_pair;
    let d = with_standby(2);
    let a = Vm::open(&d, 0, VmmOptions::default());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let p = rc_pair(&a, &b);
    let abuf = Buf::new(&a, 4096);
    let bbuf = Buf::new(&b, 4096);
    let qpn = p.qa.qpn();
    let bases = a.t.vmm().stop_queues().unwrap();
    let state = d.daemon().device(0).unwrap().save_state().unwrap();
    let standby = d.daemon().device(2).unwrap().clone();
    a.t.vmm()
        .move_to_qemu_order(d.socket(2), &bases, |_| {
            standby
                .load_state(&state)
                .map_err(|e| Error::Backend(e.to_string()))?;
            // In place at once, the checks that need memory still to come.
            assert_eq!(d.stats(2).device.resources.qp, 1);
            assert!(d.stats(0).device.resources.is_empty());
            Ok(())
        })
        .unwrap();
    assert_eq!(d.stats(2).device.resources.qp, 1);
    assert!(d.stats(0).device.resources.is_empty());
    assert_eq!(p.qa.qpn(), qpn);
    abuf.write(0, b"qemu order");
    p.qa.post_send(&[wr(1, write_op(&bbuf, 0), &[abuf.sge(0, 10)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bbuf.read(0, 10), b"qemu order");
}

#[test]
fn a_held_state_that_does_not_fit_at_the_start_fails_the_device() {
    use vhost_user_rdma::migration::{decode, encode};
    let d = with_standby(1);
    let a = Vm::open(&d, 0, VmmOptions::default());
    let cq = Cq::create(&a.dev, 16).unwrap();
    let _q = rc_qp(&a, &cq);
    let bases = a.t.vmm().stop_queues().unwrap();
    let dev = d.daemon().device(0).unwrap().clone();
    let mut s = decode(&dev.save_state().unwrap(), dev.state_bound()).unwrap();
    s.features ^= 1 << 2;
    let bad = encode(&s).unwrap();
    let standby = d.daemon().device(1).unwrap().clone();
    a.t.vmm()
        .move_to_qemu_order(d.socket(1), &bases, |_| {
            standby
                .load_state(&bad)
                .map_err(|e| Error::Backend(e.to_string()))
        })
        .unwrap();
    assert!(
        d.stats(1).device.resources.is_empty(),
        "objects of a refused state"
    );
    let ev = a
        .dev
        .next_async_event(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let fatal = std::iter::successors(ev, |_| {
        a.dev
            .next_async_event(Some(std::time::Duration::from_secs(10)))
            .unwrap()
    })
    .find(|e| {
        virtio_rdma_abi::event::EventKind::from_u32(e.kind)
            == Some(virtio_rdma_abi::event::EventKind::DEVICE_FATAL)
    });
    assert!(fatal.is_some(), "no DEVICE_FATAL");
}

/// Doorbell pages (spec 18.7) go only with a hand-over, and with their
/// region (spec 20.2, 20.7): a migration's save refuses them and says why,
/// a migration's load refuses a state that has them, and a hand-over's
/// load refuses them without the region, with a region of another size or
/// unsealed, and with pages or slots that lie; none of it leaves a QP
/// number or key taken. The state as saved then loads, with its region.
#[test]
fn doorbell_pages_go_only_with_a_hand_over_and_their_region() {
    use std::os::fd::{AsFd, OwnedFd};
    use vhost_user_rdma::migration::format::FORMAT_VERSION_DOORBELLS;
    use vhost_user_rdma::migration::{decode, encode};

    let d1 = TestDaemon::start(1).unwrap();
    let a = Vm::open_shmem(&d1, 0);
    let page = a.dev.doorbell_page().expect("a doorbell page");
    let cq = Cq::create(&a.dev, 64).unwrap();
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    assert!(q1.doorbell_slot().is_some() && q2.doorbell_slot().is_some());
    connect(&a, &q1, &a, &q2);
    let bases = a.t.vmm().stop_queues().unwrap();
    let dev1 = d1.daemon().device(0).unwrap().clone();
    assert!(
        matches!(dev1.save_state(), Err(MigrationError::NotSavable(m)) if m.contains("doorbell")),
        "a migration's state with doorbell pages"
    );
    let state = dev1.save_for_hand_over().unwrap();
    assert_eq!(state[8..12], FORMAT_VERSION_DOORBELLS.to_le_bytes());
    let region = || -> Option<(OwnedFd, bool)> {
        let (r, mapped) = dev1.doorbell_region().unwrap();
        Some((r.fd().try_clone_to_owned().unwrap(), mapped))
    };

    let d2 = TestDaemon::start(1).unwrap();
    let dev2 = d2.daemon().device(0).unwrap().clone();
    let (qpns, keys) = (d2.daemon().qpns_in_use(), d2.daemon().keys_in_use());
    let refused = |bytes: &[u8], region: Option<(OwnedFd, bool)>, why: &str| {
        match dev2.load_handed_over(bytes, region) {
            Err(MigrationError::Invalid(m)) if m.contains(why) => {}
            other => panic!("{why}: {other:?}"),
        }
        assert_eq!(d2.daemon().qpns_in_use(), qpns, "QP numbers left taken");
        assert_eq!(d2.daemon().keys_in_use(), keys, "keys left taken");
        assert!(d2.stats(0).device.resources.is_empty());
    };
    match dev2.load_state(&state) {
        Err(MigrationError::Invalid(m)) if m.contains("hand-over") => {}
        other => panic!("a migration's load of doorbell pages: {other:?}"),
    }
    refused(&state, None, "without their region");
    let unsealed = {
        let f = tempfile_memfd(4096);
        Some((f, true))
    };
    refused(&state, unsealed, "does not fit");

    let lie = |f: &dyn Fn(&mut vhost_user_rdma::migration::state::DoorbellsState)| {
        let mut s = decode(&state, dev1.state_bound()).unwrap();
        f(s.doorbells.as_mut().unwrap());
        encode(&s).unwrap()
    };
    refused(&lie(&|d| d.pages[0].1 = 1 << 20), region(), "doorbell page");
    refused(
        &lie(&|d| {
            let again = d.qp_slots[0];
            d.qp_slots.push(again);
        }),
        region(),
        "given twice",
    );
    refused(&lie(&|d| d.qp_slots[0].1 = 504), region(), "past the page");
    refused(&lie(&|d| d.pages.clear()), region(), "without a page");
    refused(&lie(&|d| d.quarantined.push(page)), region(), "quarantined");

    // The truth loads: the same page and slots, on the region handed over.
    dev2.load_handed_over(&state, region()).unwrap();
    assert_eq!(d2.stats(0).device.resources.qp, 2);
    let (r1, _) = dev1.doorbell_region().unwrap();
    let (r2, mapped) = dev2.doorbell_region().unwrap();
    assert!(mapped, "the VMM maps the region handed over");
    let same = |a: std::os::fd::BorrowedFd<'_>, b: std::os::fd::BorrowedFd<'_>| {
        let st = |fd: std::os::fd::BorrowedFd<'_>| {
            let f = std::fs::File::from(fd.try_clone_to_owned().unwrap());
            use std::os::unix::fs::MetadataExt;
            let m = f.metadata().unwrap();
            (m.dev(), m.ino())
        };
        st(a) == st(b)
    };
    assert!(
        same(r1.fd(), r2.fd().as_fd()),
        "another file than the region handed over"
    );
    // The source goes on (its objects are destroyed through it).
    a.t.vmm().resume(&bases).unwrap();
}

/// An unsealed memfd of `len` bytes (not a doorbell region).
fn tempfile_memfd(len: u64) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: creates a descriptor; the name is NUL-terminated.
    let raw = unsafe { libc::memfd_create(c"not-a-region".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone().unwrap())
        .set_len(len)
        .unwrap();
    fd
}
