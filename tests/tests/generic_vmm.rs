#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The device behind a generic vhost-user front-end, as cloud-hypervisor's
//! `--generic-vhost-user device_type=rdma` drives it (v52, v53; the source
//! lines are quoted in `qemu-configs/cloud-hypervisor.md`), through the
//! real socket: [`VmmOptions::cloud_hypervisor`].
//!
//! Such a front-end offers the guest only transport features, so the driver
//! negotiates device features 0 (spec chapter 4: every command or value that
//! needs `F_UD`, `F_SRQ` or `F_ATOMIC` fails with `UNSUPPORTED`, and there is
//! no doorbell page); it negotiates neither `RESET_DEVICE` nor `SHMEM`, so a
//! reset has to be recognised from the queues (spec 15.1); and it starts each
//! queue at the avail index the guest's ring holds at `DRIVER_OK`.

use std::time::Duration;

use vhost::vhost_user::VhostUserProtocolFeatures;
use vhost_user_rdma_tests::dp::{self, pattern, poll_one, Vm};
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::{on_host_rnic, TestDaemon};
use vhost_user_rdma_tests::verbs::{status_of, MrSpec, QpInit as RawQpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::config::{DeviceConfig, F_ATOMIC, F_SRQ, F_UD};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{WcOpcode, DB_NONE};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::Field;
use virtio_rdma_driver::{Cq, DmaBuf, Error as DrvError, Mr, Qp, QpInit, RecvWr, SendOp, Srq};

/// Device feature bits (bits 0 to 23).
const DEVICE_BITS: u64 = (1 << 24) - 1;

/// Rights of the MRs and QPs here: everything but `REMOTE_ATOMIC`.
const RW: u32 = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;

fn generic() -> VmmOptions {
    VmmOptions::cloud_hypervisor()
}

/// A registered buffer without `REMOTE_ATOMIC`.
struct Buf {
    buf: std::sync::Arc<DmaBuf>,
    mr: Mr,
}

impl Buf {
    fn new(vm: &Vm, len: usize) -> Buf {
        let buf = std::sync::Arc::new(vm.dev.alloc_dma(len, 8).expect("alloc DMA"));
        let mr = Mr::register(&vm.pd, buf.clone(), RW).expect("register MR without atomics");
        Buf { buf, mr }
    }
}

#[test]
fn negotiation_leaves_the_guest_transport_features_only() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect_with(0, generic()).unwrap();

    // The daemon offered its device features; the front-end kept them from
    // the guest.
    let offered = vm.device_features();
    for bit in [F_UD, F_SRQ, F_ATOMIC] {
        assert_ne!(offered & bit, 0, "daemon offers {bit:#x}: {offered:#x}");
    }
    assert_eq!(vm.features() & DEVICE_BITS, 0, "{:#x}", vm.features());
    assert_ne!(vm.features() & (1 << 32), 0, "VERSION_1");

    // Protocol features: what both sides have. No RESET_DEVICE, no SHMEM.
    let p = vm.protocol_features();
    assert!(
        !p.contains(VhostUserProtocolFeatures::RESET_DEVICE),
        "{p:?}"
    );
    assert!(!p.contains(VhostUserProtocolFeatures::SHMEM), "{p:?}");
    // DEVICE_STATE: the device-state transfer (spec 20.1).
    for f in [
        VhostUserProtocolFeatures::CONFIG,
        VhostUserProtocolFeatures::MQ,
        VhostUserProtocolFeatures::REPLY_ACK,
        VhostUserProtocolFeatures::DEVICE_STATE,
    ] {
        assert!(p.contains(f), "{f:?} in {p:?}");
    }
    // Dirty logging (spec 20.4), on the software RNIC only.
    assert_eq!(
        p.contains(VhostUserProtocolFeatures::LOG_SHMFD),
        !on_host_rnic(),
        "{p:?}"
    );
    for f in [
        VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS,
        VhostUserProtocolFeatures::INFLIGHT_SHMFD,
    ] {
        assert!(!p.contains(f), "the daemon does not offer {f:?}: {p:?}");
    }
    assert!(vm.shmem_window().is_none());

    // The front-end forwards every guest access to the configuration space
    // as one GET_CONFIG of that access's offset and size: 4-byte reads give
    // the structure a whole read gives.
    let whole = vm.config_bytes(0, DeviceConfig::SIZE).unwrap();
    let mut pieces = Vec::new();
    for off in (0..DeviceConfig::SIZE).step_by(4) {
        pieces.extend(vm.config_bytes(u32::try_from(off).unwrap(), 4).unwrap());
    }
    assert_eq!(pieces, whole);
    assert_eq!(
        vm.config().unwrap().abi_version,
        virtio_rdma_abi::ABI_VERSION
    );
}

#[test]
fn rc_send_write_read_between_two_generic_vms() {
    let d = TestDaemon::start(2).unwrap();
    let a = Vm::open(&d, 0, generic());
    let b = Vm::open(&d, 1, generic());
    for vm in [&a, &b] {
        assert_eq!(vm.dev.features() & DEVICE_BITS, 0);
        assert_eq!(vm.dev.doorbell_page(), None, "no doorbell region");
        assert_eq!(vm.dev.attr().atomic_caps, 0, "no atomics without F_ATOMIC");
        // The back-end channel was opened (BACKEND_REQ), and nothing was
        // asked on it: no SHMEM_MAP without SHMEM.
        assert_eq!(vm.t.vmm().backend_map_requests(), Some(0));
    }

    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let qa = dp::rc_qp(&a, &cqa);
    let qb = dp::rc_qp(&b, &cqb);
    qa.rc_connect(RW, &dp::conn(&qb, &b)).unwrap();
    qb.rc_connect(RW, &dp::conn(&qa, &a)).unwrap();

    let len = 3 * PAGE_SIZE as usize + 100;
    let src = Buf::new(&a, len);
    let dst = Buf::new(&b, len);
    let data = pattern(len, 42);

    // RDMA WRITE a → b.
    src.buf.write(0, &data).unwrap();
    let sg = [src.mr.sge(0, u32::try_from(len).unwrap()).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.mr.iova(),
        rkey: dst.mr.rkey(),
    };
    qa.post_send(&[dp::wr(1, op, &sg)]).unwrap();
    dp::ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.buf.to_vec(0, len).unwrap(), data, "WRITE data");

    // SEND b → a.
    let back = Buf::new(&a, len);
    qa.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[back.mr.sge(0, u32::try_from(len).unwrap()).unwrap()],
    }])
    .unwrap();
    let sg = [dst.mr.sge(0, u32::try_from(len).unwrap()).unwrap()];
    qb.post_send(&[dp::wr(2, SendOp::Send, &sg)]).unwrap();
    dp::ok(&poll_one(&cqb), 2, WcOpcode::SEND);
    let wc = poll_one(&cqa);
    dp::ok(&wc, 2, WcOpcode::RECV);
    assert_eq!(wc.byte_len as usize, len);
    assert_eq!(back.buf.to_vec(0, len).unwrap(), data, "SEND data");

    // RDMA READ b ← a.
    let got = Buf::new(&b, len);
    let sg = [got.mr.sge(0, u32::try_from(len).unwrap()).unwrap()];
    let op = SendOp::RdmaRead {
        remote_addr: back.mr.iova(),
        rkey: back.mr.rkey(),
    };
    qb.post_send(&[dp::wr(3, op, &sg)]).unwrap();
    dp::ok(&poll_one(&cqb), 3, WcOpcode::RDMA_READ);
    assert_eq!(got.buf.to_vec(0, len).unwrap(), data, "READ data");

    // What needs a feature fails cleanly in the driver, before the device.
    match Qp::create(&a.pd, &QpInit::ud(&cqa)) {
        Err(DrvError::Unsupported(f)) => assert_eq!(f, "F_UD"),
        other => panic!("UD QP without F_UD: {other:?}"),
    }
    match Srq::create(&a.pd, 16, 1, 0) {
        Err(DrvError::Unsupported(f)) => assert_eq!(f, "F_SRQ"),
        other => panic!("SRQ without F_SRQ: {other:?}"),
    }
    let sg = [src.mr.sge(0, 8).unwrap()];
    let op = SendOp::AtomicFetchAdd {
        remote_addr: dst.mr.iova(),
        rkey: dst.mr.rkey(),
        add: 1,
    };
    let e = qa.post_send(&[dp::wr(4, op, &sg)]).unwrap_err();
    assert!(e.to_string().contains("F_ATOMIC"), "{e}");
    // ... and in the device, for what the driver passes on.
    let buf = std::sync::Arc::new(a.dev.alloc_dma(4096, 8).unwrap());
    match Mr::register(&a.pd, buf, RW | access::REMOTE_ATOMIC) {
        Err(DrvError::Command { status, .. }) => assert_eq!(status, Status::UNSUPPORTED),
        other => panic!("REMOTE_ATOMIC MR without F_ATOMIC: {other:?}"),
    }
    let qc = dp::rc_qp(&a, &cqa);
    match qc.rc_connect(RW | access::REMOTE_ATOMIC, &dp::conn(&qb, &b)) {
        Err(DrvError::Command { status, .. }) => assert_eq!(status, Status::UNSUPPORTED),
        other => panic!("REMOTE_ATOMIC QP without F_ATOMIC: {other:?}"),
    }

    // The pair still works after the refusals.
    src.buf.write(0, b"after").unwrap();
    let sg = [src.mr.sge(0, 5).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.mr.iova(),
        rkey: dst.mr.rkey(),
    };
    qa.post_send(&[dp::wr(5, op, &sg)]).unwrap();
    dp::ok(&poll_one(&cqa), 5, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.buf.to_vec(0, 5).unwrap(), b"after");
}

/// Below the driver: the daemon itself refuses what needs a feature the
/// front-end never let the guest negotiate (spec chapter 4).
#[test]
fn daemon_refuses_unnegotiated_features_with_unsupported() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect_with(0, generic()).unwrap();
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_device().unwrap().atomic_caps, 0);
    let ctx = v.create_ctx_full().unwrap();
    assert_eq!(ctx.doorbell_page, DB_NONE, "no doorbell page");
    let pd = v.alloc_pd(ctx.ctx_handle).unwrap();
    let cq = v.create_cq(ctx.ctx_handle, 64).unwrap();

    let r = v.create_qp(&RawQpInit::ud(pd, cq));
    assert_eq!(
        status_of(&r).map(|s| s.0),
        Some(Status::UNSUPPORTED),
        "UD QP"
    );
    let r = v.create_srq(pd, 16, 1, 0);
    assert_eq!(status_of(&r).map(|s| s.0), Some(Status::UNSUPPORTED), "SRQ");
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    let r = v.reg_mr(&MrSpec::new(pd, RW | access::REMOTE_ATOMIC, 0, &pages));
    assert_eq!(
        status_of(&r).map(|s| s.0),
        Some(Status::UNSUPPORTED),
        "REMOTE_ATOMIC MR"
    );
    // Without the refused bits, the same commands succeed.
    v.reg_mr(&MrSpec::new(pd, RW, 0, &pages)).unwrap();
    v.create_qp(&RawQpInit::rc(pd, cq)).unwrap();
}

/// The next event, within a short wait.
fn next_event(vm: &mut TestVmm, wait: Duration) -> Option<virtio_rdma_abi::event::Event> {
    vm.events().next_event(wait).unwrap()
}

/// A reset without `RESET_DEVICE` (queues disabled and stopped, then
/// started afresh at the avail index of fresh rings) is recognised as one
/// (spec 15.1): the objects are gone and the next event has `seq` 1.
#[test]
fn reset_without_reset_device_is_recognised() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect_with(0, generic()).unwrap();
    let first = next_event(&mut vm, Duration::from_secs(5)).expect("PORT_ACTIVE");
    assert_eq!(first.kind, EventKind::PORT_ACTIVE as u32);
    assert_eq!(first.seq, 1);

    let pd = {
        let mut v = Verbs::new(&mut vm);
        let (ctx, pd) = v.ctx_pd().unwrap();
        v.create_cq(ctx, 64).unwrap();
        pd
    };
    assert_eq!(d.stats(0).device.resources.cq, 1);

    let bases = vm.reset().unwrap();
    assert_ne!(bases[0], 0, "the control queue had taken commands");
    assert!(!vm
        .protocol_features()
        .contains(VhostUserProtocolFeatures::RESET_DEVICE));

    let ev = next_event(&mut vm, Duration::from_secs(5)).expect("PORT_ACTIVE after the reset");
    assert_eq!(ev.kind, EventKind::PORT_ACTIVE as u32);
    assert_eq!(ev.seq, 1, "sequence numbers restart at a reset");
    let mut v = Verbs::new(&mut vm);
    assert_eq!(
        status_of(&v.dealloc_pd(pd)).map(|s| s.0),
        Some(Status::BAD_HANDLE),
        "objects of before the reset are gone"
    );
    assert_eq!(d.stats(0).device.resources.cq, 0);
    // And the device works afresh.
    let ctx = v.create_ctx().unwrap();
    v.alloc_pd(ctx).unwrap();
}

/// cloud-hypervisor starts a queue at the avail index the guest's ring holds
/// at `DRIVER_OK`, not at 0: event buffers a driver made available before
/// `DRIVER_OK` (spec chapter 6 step 5) are skipped, and no event, not even
/// `PORT_ACTIVE`, is ever delivered. A front-end that starts at 0 (QEMU)
/// delivers them; a driver that posts its event buffers after `DRIVER_OK`
/// (the Linux driver of this repository does) works with both.
#[test]
fn event_buffers_before_driver_ok_are_lost_with_a_base_from_the_ring() {
    let d = TestDaemon::start(2).unwrap();
    let mut ch = d
        .connect_with(
            0,
            VmmOptions {
                events_before_start: true,
                ..generic()
            },
        )
        .unwrap();
    assert!(ch.events().vring().avail_idx() > 0);
    assert_eq!(
        next_event(&mut ch, Duration::from_millis(500)),
        None,
        "the device started the event queue past the buffers"
    );
    // The device works otherwise; only events are missing.
    Verbs::new(&mut ch).create_ctx().unwrap();

    let mut at_zero = d
        .connect_with(
            1,
            VmmOptions {
                events_before_start: true,
                base_from_avail_idx: false,
                ..generic()
            },
        )
        .unwrap();
    let ev = next_event(&mut at_zero, Duration::from_secs(5)).expect("PORT_ACTIVE");
    assert_eq!(ev.kind, EventKind::PORT_ACTIVE as u32);

    // Posted after DRIVER_OK, the buffers reach a device started at the
    // ring's index (0) — the default of these options.
    drop(ch);
    let mut after = d.connect_with(0, generic()).unwrap();
    let ev = next_event(&mut after, Duration::from_secs(5)).expect("PORT_ACTIVE");
    assert_eq!(ev.kind, EventKind::PORT_ACTIVE as u32);
}
