#![allow(clippy::unwrap_used)]
//! Every control verb through the real vhost-user socket: the happy paths,
//! what each returns, page lists in every mode, and the QP state machine.

use std::time::Duration;

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::guest_mem::{MemLayout, PAGE_SIZE};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{
    rc_transitions, status_of, ud_transitions, MrSpec, QpInit, Verbs,
};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{F_ATOMIC, F_SRQ, F_UD};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::{access, PageListMode};
use virtio_rdma_abi::qp::{attr, AddressVector, Mtu, QpAttr, QpState, QpType};
use virtio_rdma_abi::verbs::{GID_TYPE_ROCE_V2, PORT_NUM, PORT_STATE_ACTIVE, SRQ_ATTR_LIMIT};
use vm_memory::GuestAddress;

/// The index of a VM's GID in its table (ABI version 3 without a MAC:
/// index 0, the default GID, is unassigned; the operator's is at 1).
const OWN_GID_INDEX: u8 = 1;

#[test]
fn config_and_queries() {
    let d = TestDaemon::start(2).unwrap();
    let mut vm = d.connect(0).unwrap();
    let cfg = vm.config().unwrap();
    let l = Limits::default();
    assert_eq!(cfg, l.device_config());
    // UD, SRQ and atomics are offered; shared-memory doorbells not yet.
    assert_eq!(
        vm.device_features() & (F_UD | F_SRQ | F_ATOMIC),
        F_UD | F_SRQ | F_ATOMIC
    );

    let mut v = Verbs::new(&mut vm);
    let dev = v.query_device().unwrap();
    assert_eq!(dev.max_qp, cfg.max_qp);
    assert_eq!(dev.max_mr_bytes, cfg.max_mr_bytes);
    assert_eq!(dev.phys_port_cnt, 1);
    // Spec 5: 4 KiB pages are always accepted.
    assert_ne!(cfg.page_size_cap & 1 << 12, 0);
    assert_eq!(dev.page_size_cap, cfg.page_size_cap);
    assert_eq!(dev.atomic_caps, 1);
    assert_ne!(dev.node_guid, 0);
    // Spec 12.1: the virtio PCI vendor ID and the device type (rdma-core
    // rejects a vendor_id of 0).
    assert_eq!((dev.vendor_id, dev.vendor_part_id), (0x1af4, 42));
    assert!(dev.max_mr_pages >= (16u64 << 30 >> 12) as u32);

    let port = v.query_port(1).unwrap();
    assert_eq!(port.state, PORT_STATE_ACTIVE);
    assert_eq!(port.active_mtu, Mtu::MTU_4096 as u32);
    assert_eq!(port.gid_tbl_len, 16);
    assert_eq!(port.max_ud_payload, 4096);

    // ABI version 3 without a MAC: index 0 (the default GID) unassigned,
    // the operator's GID at index 1, the rest unassigned; past the table
    // RANGE.
    assert_eq!(v.query_gid(1, 0).unwrap().gid, [0; 16]);
    let gid0 = v.query_gid(1, 1).unwrap();
    assert_eq!(gid0.gid_type, GID_TYPE_ROCE_V2);
    assert_eq!(&gid0.gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(v.query_gid(1, 15).unwrap().gid, [0; 16]);
    assert_eq!(status_of(&v.query_gid(1, 16)), Some((Status::RANGE, 4)));
    drop(v);

    // Another VM has another GID and another GUID.
    let mut vm1 = d.connect(1).unwrap();
    let mut v1 = Verbs::new(&mut vm1);
    let gid1 = v1.query_gid(1, 1).unwrap();
    assert_ne!(gid0.gid, gid1.gid);
    assert_ne!(v1.query_device().unwrap().node_guid, dev.node_guid);
}

/// The first event after every start (`DRIVER_OK` of a new connection, or
/// after a device reset) is `PORT_ACTIVE` with `seq` 1 and `handle` the port
/// number (spec 6, 14.2).
#[test]
fn port_active_event_arrives() {
    let first_event = |vm: &mut vhost_user_rdma_tests::vmm::TestVmm, when: &str| {
        let ev = vm
            .events()
            .next_event(Duration::from_secs(5))
            .unwrap()
            .unwrap_or_else(|| panic!("{when}: no PORT_ACTIVE event"));
        assert_eq!(ev.kind, EventKind::PORT_ACTIVE as u32, "{when}");
        assert_eq!(ev.handle, PORT_NUM, "{when}: handle is the port number");
        assert_eq!(ev.detail, 0, "{when}");
        assert_eq!(ev.seq, 1, "{when}");
    };
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    first_event(&mut vm, "first start");
    vm.reset().unwrap();
    first_event(&mut vm, "after a reset");
    drop(vm);
    d.wait_released(0);
    let mut vm = d.connect(0).unwrap();
    first_event(&mut vm, "after a reconnect");
}

#[test]
fn object_lifecycle_and_dependencies() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (ctx, pd, cq) = v.ctx_pd_cq(256).unwrap();
    let pages = v.mem().alloc_pages(4, PAGE_SIZE).unwrap();
    let mr = v
        .reg_mr(&MrSpec::new(
            pd,
            access::LOCAL_WRITE | access::REMOTE_READ,
            0x7000_0000,
            &pages,
        ))
        .unwrap();
    assert_ne!(mr.lkey, 0);
    assert_ne!(mr.rkey, 0);
    let srq = v.create_srq(pd, 64, 2, 0).unwrap();
    let qp = v
        .create_qp(&QpInit {
            srq: srq.srq_handle,
            rq_depth: 0,
            ..QpInit::rc(pd, cq)
        })
        .unwrap();
    let ah = v
        .create_ah(
            pd,
            AddressVector {
                // The device's own GID: the tenant policy refuses any other here.
                dgid: vhost_user_rdma::config::default_gid(0),
                sgid_index: OWN_GID_INDEX,
                hop_limit: 64,
                ..AddressVector::default()
            },
        )
        .unwrap();
    assert_eq!(d.stats(0).device.resources.qp, 1);
    assert_eq!(d.stats(0).device.resources.registered_bytes, 4 * PAGE_SIZE);

    // Dependents keep their parents alive.
    let busy = v.dealloc_pd(pd);
    assert_eq!(status_of(&busy), Some((Status::BUSY, 4)), "MR, SRQ, QP, AH");
    assert_eq!(status_of(&v.destroy_cq(cq)), Some((Status::BUSY, 2)));
    assert_eq!(
        status_of(&v.destroy_srq(srq.srq_handle)),
        Some((Status::BUSY, 1))
    );

    v.destroy_qp(qp.handle).unwrap();
    v.destroy_srq(srq.srq_handle).unwrap();
    v.destroy_cq(cq).unwrap();
    v.destroy_ah(ah).unwrap();
    v.dereg_mr(mr.mr_handle).unwrap();
    v.dealloc_pd(pd).unwrap();
    v.destroy_ctx(ctx).unwrap();
    assert!(d.stats(0).device.resources.is_empty());
    assert_eq!(d.daemon().qpns_in_use(), 0);
    assert_eq!(d.daemon().keys_in_use(), 0, "memory keys leaked");

    // Everything is gone: the old handles no longer resolve.
    assert_eq!(
        status_of(&v.dealloc_pd(pd)).map(|s| s.0),
        Some(Status::BAD_HANDLE)
    );
    assert_eq!(
        status_of(&v.destroy_qp(qp.handle)).map(|s| s.0),
        Some(Status::BAD_HANDLE)
    );
}

#[test]
fn destroy_ctx_releases_everything_it_owns() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let keep = v.create_ctx().unwrap();
    let keep_pd = v.alloc_pd(keep).unwrap();
    let ctx = v.create_ctx().unwrap();
    for _ in 0..3 {
        let pd = v.alloc_pd(ctx).unwrap();
        let cq = v.create_cq(ctx, 16).unwrap();
        let pages = v.mem().alloc_pages(2, PAGE_SIZE).unwrap();
        v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0, &pages))
            .unwrap();
        v.create_qp(&QpInit::rc(pd, cq)).unwrap();
        v.create_qp(&QpInit::ud(pd, cq)).unwrap();
    }
    let before = d.stats(0).device.resources;
    assert_eq!(before.qp, 6);
    assert_eq!(d.daemon().qpns_in_use(), 6);
    v.destroy_ctx(ctx).unwrap();
    let after = d.stats(0).device.resources;
    assert_eq!(
        (after.ctx, after.pd, after.cq, after.qp, after.mr),
        (1, 1, 0, 0, 0)
    );
    assert_eq!(after.registered_bytes, 0);
    assert_eq!(d.daemon().qpns_in_use(), 0);
    assert_eq!(d.daemon().keys_in_use(), 0, "memory keys leaked");
    // The other context is untouched.
    let cq = v.create_cq(keep, 16).unwrap();
    v.create_qp(&QpInit::rc(keep_pd, cq)).unwrap();
}

#[test]
fn page_list_modes() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd) = v.ctx_pd().unwrap();
    let la = access::LOCAL_WRITE;

    // INLINE, scattered pages over both regions, unaligned start.
    let pages = v.mem().alloc_pages(8, PAGE_SIZE).unwrap();
    assert!(
        pages.iter().any(|p| p.0 >= 1 << 32),
        "pages span both regions"
    );
    let spec = MrSpec {
        first_page_offset: 100,
        length: 8 * PAGE_SIZE - 100,
        ..MrSpec::new(pd, la, 0x1000_0064, &pages)
    };
    v.reg_mr(&spec).unwrap();

    // INDIRECT across several list pages (1,500 pages = 3 list pages).
    let pages = v.mem().alloc_pages(1500, PAGE_SIZE).unwrap();
    let r = v
        .reg_mr(&MrSpec {
            mode: PageListMode::INDIRECT,
            ..MrSpec::new(pd, la, 0, &pages)
        })
        .unwrap();
    assert_ne!(r.lkey, 0);
    // No remote access, yet an rkey: with F_RESIZE every region has one,
    // for REREG_MR to grant remote access under (spec 12.10).
    assert_ne!(r.rkey, 0, "F_RESIZE: an rkey for every region");

    // CONTIGUOUS.
    let base = v.mem().alloc(64 * PAGE_SIZE, PAGE_SIZE).unwrap();
    let contig: Vec<GuestAddress> = (0..64)
        .map(|i| GuestAddress(base.0 + i * PAGE_SIZE))
        .collect();
    v.reg_mr(&MrSpec {
        mode: PageListMode::CONTIGUOUS,
        ..MrSpec::new(pd, la, 0, &contig)
    })
    .unwrap();

    // 2 MiB pages.
    let huge = v.mem().alloc(4 << 21, 1 << 21).unwrap();
    let hp: Vec<GuestAddress> = (0..4).map(|i| GuestAddress(huge.0 + (i << 21))).collect();
    let list = v.page_list(&hp, 21, PageListMode::INLINE).unwrap();
    let req = virtio_rdma_abi::verbs::RegMrReq {
        pd_handle: pd,
        access: la,
        iova: 0,
        length: 4 << 21,
        buf: list.desc,
    };
    v.reg_mr_raw(&req, &list.tail).unwrap();
    assert_eq!(
        d.stats(0).device.resources.registered_bytes,
        (8 * PAGE_SIZE - 100) + 1500 * PAGE_SIZE + 64 * PAGE_SIZE + (4 << 21)
    );
}

#[test]
fn sixteen_gib_memory_region() {
    // 16 GiB in 4 KiB pages: 4,194,304 page entries in 8,192 indirect list
    // pages. A guest may map the same page many times, so a small guest can
    // register it; the daemon still validates and records every entry.
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd) = v.ctx_pd().unwrap();
    let data = v.mem().alloc_pages(512, PAGE_SIZE).unwrap();
    let npages: usize = (16usize << 30) >> 12;
    let pages: Vec<GuestAddress> = (0..npages).map(|i| data[i % data.len()]).collect();
    let r = v
        .reg_mr(&MrSpec {
            mode: PageListMode::INDIRECT,
            ..MrSpec::new(pd, access::LOCAL_WRITE | access::REMOTE_WRITE, 0, &pages)
        })
        .unwrap();
    assert_ne!(r.rkey, 0);
    assert_eq!(d.stats(0).device.resources.registered_bytes, 16 << 30);
    v.dereg_mr(r.mr_handle).unwrap();
    assert_eq!(d.stats(0).device.resources.registered_bytes, 0);
}

#[test]
fn keys_are_random_and_unique() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd) = v.ctx_pd().unwrap();
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    let mut keys = Vec::new();
    for _ in 0..200 {
        let r = v
            .reg_mr(&MrSpec::new(
                pd,
                access::LOCAL_WRITE | access::REMOTE_READ,
                0,
                &pages,
            ))
            .unwrap();
        keys.push(r.lkey);
        keys.push(r.rkey);
    }
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "duplicate keys");
    // Not sequential: consecutive keys differ in many bits on average.
    let avg_bits: f64 = keys
        .windows(2)
        .map(|w| f64::from((w[0] ^ w[1]).count_ones()))
        .sum::<f64>()
        / (keys.len() - 1) as f64;
    assert!(
        avg_bits > 10.0,
        "keys look predictable: {avg_bits} differing bits"
    );
}

fn modify(v: &mut Verbs<'_>, qp: u32, mask: u32, a: QpAttr) -> Result<(), (Status, u32)> {
    let r = v.modify_qp(qp, mask, &a);
    match status_of(&r) {
        Some(s) => Err(s),
        None => {
            r.unwrap();
            Ok(())
        }
    }
}

fn to(state: QpState) -> QpAttr {
    QpAttr {
        qp_state: state.into(),
        ..QpAttr::default()
    }
}

#[test]
fn rc_state_machine() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qp_state, QpState::RESET as u32);
    assert_eq!(q.qp_type, QpType::RC as u32);
    assert_eq!(q.qpn, qp.qpn);
    assert!(qp.qpn > 1 && qp.qpn < 1 << 24);

    // Transitions that do not exist from RESET.
    for bad in [QpState::RTR, QpState::RTS, QpState::SQD, QpState::SQE] {
        assert_eq!(
            modify(&mut v, qp.handle, attr::STATE, to(bad)),
            Err((Status::BAD_STATE, QpState::RESET as u32)),
            "RESET -> {bad:?}"
        );
    }
    let [(m_init, a_init), (m_rtr, a_rtr), (m_rts, a_rts)] =
        rc_transitions(0x42, vhost_user_rdma::config::default_gid(0), OWN_GID_INDEX);

    // Each required attribute is really required.
    for bit in [attr::PKEY_INDEX, attr::PORT, attr::ACCESS] {
        assert_eq!(
            modify(&mut v, qp.handle, m_init & !bit, a_init),
            Err((Status::INVALID, bit))
        );
    }
    // An attribute RESET->INIT does not take (QKEY is UD-only).
    assert_eq!(
        modify(&mut v, qp.handle, m_init | attr::QKEY, a_init),
        Err((Status::INVALID, attr::QKEY))
    );
    modify(&mut v, qp.handle, m_init, a_init).unwrap();
    // INIT -> INIT with an optional attribute.
    modify(
        &mut v,
        qp.handle,
        attr::STATE | attr::ACCESS,
        QpAttr {
            access: access::REMOTE_READ,
            ..to(QpState::INIT)
        },
    )
    .unwrap();
    for bit in [
        attr::AV,
        attr::PATH_MTU,
        attr::DEST_QPN,
        attr::RQ_PSN,
        attr::MAX_DEST_RD_ATOMIC,
        attr::MIN_RNR_TIMER,
    ] {
        assert_eq!(
            modify(&mut v, qp.handle, m_rtr & !bit, a_rtr),
            Err((Status::INVALID, bit))
        );
    }
    modify(&mut v, qp.handle, m_rtr, a_rtr).unwrap();
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qp_state, QpState::RTR as u32);
    assert_eq!(q.attr.dest_qpn, 0x42);
    assert_eq!(q.attr.av.dgid, vhost_user_rdma::config::default_gid(0));
    assert_eq!(q.attr.path_mtu, Mtu::MTU_4096 as u32);
    assert_eq!(q.attr.access, access::REMOTE_READ, "INIT->INIT change kept");

    // CUR_STATE must match.
    let mut wrong = a_rts;
    wrong.cur_qp_state = QpState::INIT.into();
    assert_eq!(
        modify(&mut v, qp.handle, m_rts | attr::CUR_STATE, wrong),
        Err((Status::BAD_STATE, QpState::RTR as u32))
    );
    modify(&mut v, qp.handle, m_rts, a_rts).unwrap();
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qp_state, QpState::RTS as u32);
    assert_eq!(q.attr.sq_psn, a_rts.sq_psn);
    assert_eq!(q.attr.timeout, 14);

    // RTS -> RTS may change MIN_RNR_TIMER but not the path.
    modify(
        &mut v,
        qp.handle,
        attr::MIN_RNR_TIMER,
        QpAttr {
            min_rnr_timer: 3,
            ..QpAttr::default()
        },
    )
    .unwrap();
    assert_eq!(
        modify(&mut v, qp.handle, attr::PATH_MTU, a_rtr),
        Err((Status::INVALID, attr::PATH_MTU))
    );

    // RTS -> SQD with notification, SQD -> SQD path change, SQD -> RTS.
    modify(
        &mut v,
        qp.handle,
        attr::STATE | attr::EN_SQD_ASYNC_NOTIFY,
        QpAttr {
            en_sqd_async_notify: 1,
            ..to(QpState::SQD)
        },
    )
    .unwrap();
    // The QP_SQ_DRAINED event itself is checked in `sqd_drained_event`.
    modify(
        &mut v,
        qp.handle,
        attr::STATE | attr::TIMEOUT,
        QpAttr {
            timeout: 20,
            ..to(QpState::SQD)
        },
    )
    .unwrap();
    modify(&mut v, qp.handle, attr::STATE, to(QpState::RTS)).unwrap();
    assert_eq!(v.query_qp(qp.handle).unwrap().attr.timeout, 20);

    // Anything -> ERR, ERR -> only RESET or ERR.
    modify(&mut v, qp.handle, attr::STATE, to(QpState::ERR)).unwrap();
    assert_eq!(
        modify(&mut v, qp.handle, m_init, a_init),
        Err((Status::BAD_STATE, QpState::ERR as u32))
    );
    // SQE does not exist for RC.
    assert_eq!(
        modify(&mut v, qp.handle, attr::STATE, to(QpState::SQE)),
        Err((Status::BAD_STATE, QpState::ERR as u32))
    );
    modify(&mut v, qp.handle, attr::STATE, to(QpState::RESET)).unwrap();
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qp_state, QpState::RESET as u32);
    assert_eq!(q.attr.dest_qpn, 0, "attributes cleared on RESET");
    // And around again.
    v.connect_rc(qp.handle, 0x43, vhost_user_rdma::config::default_gid(0))
        .unwrap();
    assert_eq!(v.query_qp(qp.handle).unwrap().attr.dest_qpn, 0x43);
}

#[test]
fn sqd_drained_event() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let first = vm
        .events()
        .next_event(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(first.kind, EventKind::PORT_ACTIVE as u32);
    let (qp, mask) = {
        let mut v = Verbs::new(&mut vm);
        let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
        let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
        v.connect_rc(qp.handle, 9, vhost_user_rdma::config::default_gid(0))
            .unwrap();
        let mask = attr::STATE | attr::EN_SQD_ASYNC_NOTIFY;
        (qp, mask)
    };
    Verbs::new(&mut vm)
        .modify_qp(
            qp.handle,
            mask,
            &QpAttr {
                en_sqd_async_notify: 1,
                ..to(QpState::SQD)
            },
        )
        .unwrap();
    let ev = vm
        .events()
        .next_event(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, EventKind::QP_SQ_DRAINED as u32);
    assert_eq!(ev.handle, qp.handle);
    assert_eq!(ev.seq, 2);
}

#[test]
fn ud_state_machine_and_ah() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
    let qp = v.create_qp(&QpInit::ud(pd, cq)).unwrap();
    let [(m_init, a_init), (m_rtr, a_rtr), (m_rts, a_rts)] = ud_transitions(0x1111_1111);
    // QKEY is required for UD RESET->INIT; ACCESS is RC-only.
    assert_eq!(
        modify(&mut v, qp.handle, m_init & !attr::QKEY, a_init),
        Err((Status::INVALID, attr::QKEY))
    );
    assert_eq!(
        modify(&mut v, qp.handle, m_init | attr::ACCESS, a_init),
        Err((Status::INVALID, attr::ACCESS))
    );
    modify(&mut v, qp.handle, m_init, a_init).unwrap();
    // RC path attributes are not allowed on UD.
    assert_eq!(
        modify(&mut v, qp.handle, m_rtr | attr::DEST_QPN, a_rtr),
        Err((Status::INVALID, attr::DEST_QPN))
    );
    modify(&mut v, qp.handle, m_rtr, a_rtr).unwrap();
    modify(&mut v, qp.handle, m_rts, a_rts).unwrap();
    // UD has SQE; RTS -> SQE is not a driver transition, but SQE -> RTS is.
    assert_eq!(
        modify(&mut v, qp.handle, attr::STATE, to(QpState::SQE)),
        Err((Status::BAD_STATE, QpState::RTS as u32))
    );
    let q = v.query_qp(qp.handle).unwrap();
    assert_eq!(q.attr.qkey, 0x1111_1111);
    assert_eq!(q.qp_type, QpType::UD as u32);

    let ah = v
        .create_ah(
            pd,
            AddressVector {
                dgid: vhost_user_rdma::config::default_gid(0),
                sgid_index: OWN_GID_INDEX,
                flow_label: 0xfffff,
                sl: 15,
                hop_limit: 1,
                ..AddressVector::default()
            },
        )
        .unwrap();
    v.destroy_ah(ah).unwrap();
}

#[test]
fn srq_modify_and_query() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (_, pd) = v.ctx_pd().unwrap();
    let srq = v.create_srq(pd, 128, 3, 10).unwrap();
    assert_eq!(srq.wqe_shift, 6, "16 + 3 * 16 = 64");
    let q = v.query_srq(srq.srq_handle).unwrap();
    assert_eq!((q.depth, q.max_sge, q.limit), (128, 3, 10));
    v.modify_srq(srq.srq_handle, SRQ_ATTR_LIMIT, 0, 100)
        .unwrap();
    assert_eq!(v.query_srq(srq.srq_handle).unwrap().limit, 100);
    assert_eq!(
        status_of(&v.modify_srq(srq.srq_handle, SRQ_ATTR_LIMIT, 0, 128)),
        Some((Status::RANGE, 12))
    );
    assert_eq!(
        v.query_srq(srq.srq_handle).unwrap().limit,
        100,
        "unchanged on error"
    );
}

#[test]
fn qpns_are_unique_across_vms() {
    let d = TestDaemon::start(3).unwrap();
    let mut qpns = Vec::new();
    let mut vms: Vec<_> = (0..3).map(|i| d.connect(i).unwrap()).collect();
    for vm in &mut vms {
        let mut v = Verbs::new(vm);
        let (_, pd, cq) = v.ctx_pd_cq(16).unwrap();
        for _ in 0..50 {
            qpns.push(v.create_qp(&QpInit::rc(pd, cq)).unwrap().qpn);
        }
    }
    let mut s = qpns.clone();
    s.sort_unstable();
    s.dedup();
    assert_eq!(s.len(), 150);
    assert_eq!(d.daemon().qpns_in_use(), 150);
}

#[test]
fn connect_two_vms_rc() {
    // Two VMs on one daemon create RC QPs and connect them to each other.
    let d = TestDaemon::start(2).unwrap();
    let mut a = d.connect(0).unwrap();
    let mut b = d.connect(1).unwrap();
    let setup = |vm: &mut vhost_user_rdma_tests::vmm::TestVmm| {
        let mut v = Verbs::new(vm);
        let (_, gid) = v.own_gid().unwrap();
        let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
        (gid, v.create_qp(&QpInit::rc(pd, cq)).unwrap())
    };
    let (gid_a, qa) = setup(&mut a);
    let (gid_b, qb) = setup(&mut b);
    Verbs::new(&mut a)
        .connect_rc(qa.handle, qb.qpn, gid_b)
        .unwrap();
    Verbs::new(&mut b)
        .connect_rc(qb.handle, qa.qpn, gid_a)
        .unwrap();
    let q = Verbs::new(&mut a).query_qp(qa.handle).unwrap();
    assert_eq!(
        (q.attr.qp_state, q.attr.dest_qpn, q.attr.av.dgid),
        (QpState::RTS as u32, qb.qpn, gid_b)
    );
}

#[test]
fn many_commands_in_flight() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                mem: MemLayout::default(),
                ..VmmOptions::default()
            },
        )
        .unwrap();
    let ctx = Verbs::new(&mut vm).create_ctx().unwrap();
    let ctrl = vm.ctrl();
    ctrl.set_auto_kick(false);
    let req = virtio_rdma_abi::verbs::CtxHandleReq { ctx_handle: ctx };
    let bytes = virtio_rdma_abi::Wire::to_bytes(&req);
    let tokens: Vec<u64> = (0..64)
        .map(|_| {
            ctrl.submit(virtio_rdma_abi::ctrl::Opcode::ALLOC_PD, &bytes, 4)
                .unwrap()
        })
        .collect();
    ctrl.kick().unwrap();
    let mut handles = Vec::new();
    for t in tokens {
        let c = ctrl.wait(t).unwrap().ok().unwrap();
        assert_eq!(c.resp_request_id, c.request_id);
        handles.push(
            c.parse::<virtio_rdma_abi::verbs::PdHandleResp>()
                .unwrap()
                .pd_handle,
        );
    }
    ctrl.set_auto_kick(true);
    handles.sort_unstable();
    handles.dedup();
    assert_eq!(handles.len(), 64);
    assert_eq!(d.stats(0).device.resources.pd, 64);
}

#[test]
fn held_events_reach_an_event_idx_driver() {
    // With EVENT_IDX a driver only notifies past the index the device
    // publishes; events held for lack of buffers must still arrive as soon
    // as buffers are posted, without any other activity. Control-queue
    // polling is off so the device worker goes back to sleep right after
    // each command, which is the case that needs the device to re-arm.
    let d = TestDaemon::with_config(1, |c| c.ctrl_poll = Duration::ZERO).unwrap();
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                event_idx: true,
                event_buffers: 1,
                ..VmmOptions::default()
            },
        )
        .unwrap();
    vm.events().set_auto_repost(false);
    let first = vm
        .events()
        .next_event(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(first.kind, EventKind::PORT_ACTIVE as u32);
    let qp = {
        let mut v = Verbs::new(&mut vm);
        let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
        let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
        v.connect_rc(qp.handle, 9, vhost_user_rdma::config::default_gid(0))
            .unwrap();
        for _ in 0..3 {
            v.modify_qp(
                qp.handle,
                attr::STATE | attr::EN_SQD_ASYNC_NOTIFY,
                &QpAttr {
                    en_sqd_async_notify: 1,
                    ..to(QpState::SQD)
                },
            )
            .unwrap();
            v.modify_qp(qp.handle, attr::STATE, &to(QpState::RTS))
                .unwrap();
        }
        qp
    };
    assert_eq!(
        vm.events().try_next_event().unwrap(),
        None,
        "no buffer, nothing delivered yet"
    );
    // Not a synchronisation: it only lets the worker finish its last pass
    // and park, so that nothing but a kick can bring the buffers to it.
    std::thread::sleep(Duration::from_millis(20));
    vm.events().post_buffers(3).unwrap();
    for seq in 2..=4 {
        let ev = vm
            .events()
            .next_event(Duration::from_secs(5))
            .unwrap()
            .expect("held event not delivered");
        assert_eq!(
            (ev.kind, ev.handle, ev.seq),
            (EventKind::QP_SQ_DRAINED as u32, qp.handle, seq)
        );
    }
}

/// Every object's host half (what a host NIC holds for it: a PD, CQ, QP,
/// SRQ, AH or registered MR of its own) is created with the object and
/// destroyed with it: by its destroy command, with its context, and when
/// the VMM goes away.
#[test]
fn host_halves_go_with_their_objects() {
    use vhost_user_rdma_tests::rnics::{CountingRnic, HostHalves};
    let rnic = std::sync::Arc::new(CountingRnic::default());
    let d = TestDaemon::with_soft_rnic(1, rnic.clone()).unwrap();
    // Makes one of each in a new context: returns it and its PD and CQ.
    let populate = |v: &mut Verbs<'_>| {
        let (ctx, pd, cq) = v.ctx_pd_cq(64).unwrap();
        let pages = v.mem().alloc_pages(2, PAGE_SIZE).unwrap();
        v.reg_mr(&MrSpec::new(
            pd,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
            0,
            &pages,
        ))
        .unwrap();
        let srq = v.create_srq(pd, 64, 2, 0).unwrap();
        v.create_qp(&QpInit {
            srq: srq.srq_handle,
            rq_depth: 0,
            ..QpInit::rc(pd, cq)
        })
        .unwrap();
        v.create_qp(&QpInit::ud(pd, cq)).unwrap();
        let av = AddressVector {
            dgid: vhost_user_rdma::config::default_gid(0),
            sgid_index: OWN_GID_INDEX,
            hop_limit: 64,
            ..AddressVector::default()
        };
        v.create_ah(pd, av).unwrap();
        (ctx, pd, cq)
    };
    let one_of_each = HostHalves {
        pds: 1,
        cqs: 1,
        qps: 2,
        srqs: 1,
        ahs: 1,
        mrs: 1,
    };
    let mut vm = d.connect(0).unwrap();
    let mut v = Verbs::new(&mut vm);
    let (ctx, _, _) = populate(&mut v);
    assert_eq!(rnic.live(), one_of_each);
    // Its context takes everything with it.
    v.destroy_ctx(ctx).unwrap();
    assert_eq!(rnic.live(), HostHalves::default());
    // One by one, by their own commands.
    let ctx = v.create_ctx().unwrap();
    let pd = v.alloc_pd(ctx).unwrap();
    let cq = v.create_cq(ctx, 16).unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    assert_eq!(
        (rnic.live().pds, rnic.live().cqs, rnic.live().qps),
        (1, 1, 1)
    );
    v.destroy_qp(qp.handle).unwrap();
    v.destroy_cq(cq).unwrap();
    v.dealloc_pd(pd).unwrap();
    assert_eq!(rnic.live(), HostHalves::default());
    // And when the VMM goes away.
    populate(&mut v);
    assert_eq!(rnic.live(), one_of_each);
    drop(v);
    vm.disconnect();
    let s = d.wait_released(0);
    assert!(s.device.resources.is_empty(), "{s:?}");
    assert_eq!(rnic.live(), HostHalves::default());
}
