//! Data-path encoding: WQEs in ring slots, producer indices, the kick
//! protocol, CQE polling by owner phase, arming and completion events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::*;
use virtio_rdma_abi::event::{Event, EventKind};
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::{Field, Wire};

use super::mock::Mock;
use super::setup;
use crate::doorbell::{off, DoorbellRecord};
use crate::{
    Ah, Cq, Device, Error, Payload, Pd, Qp, QpCap, QpInit, RecvWr, SendFlags, SendOp, SendWr, Srq,
    UdDest,
};

fn qp_with(dev: &Device, cap: QpCap, ud: bool) -> (Arc<Pd>, Arc<Cq>, Qp) {
    let pd = Pd::alloc(dev).unwrap();
    let cq = Cq::create(dev, 16).unwrap();
    let init = if ud { QpInit::ud(&cq) } else { QpInit::rc(&cq) };
    let qp = Qp::create(&pd, &QpInit { cap, ..init }).unwrap();
    // Out of RESET, where posting is refused.
    if ud {
        qp.ud_to_init(0x1234).unwrap();
    } else {
        qp.rc_to_init(0).unwrap();
    }
    (pd, cq, qp)
}

fn small_cap() -> QpCap {
    QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// The context's device flags, written as the device would.
fn ctx_flags(dev: &Device, v: u32) {
    let header = dev.inner.ctx_header.as_ref().unwrap();
    header.atomic_u32(0).store(v, Ordering::Release);
}

/// The device half of a doorbell record, written as the device would.
fn dev_store(db: &DoorbellRecord, offset: usize, v: u32) {
    db.buf().atomic_u32(offset).store(v, Ordering::Release);
}

fn send_slot(qp: &Qp, index: u32) -> (SendWqe, Vec<u8>) {
    let g = qp.sq_geometry();
    let bytes = qp
        .mem()
        .buf
        .to_vec(g.slot_offset(index), g.stride())
        .unwrap();
    (SendWqe::read(&bytes), bytes[64..].to_vec())
}

#[test]
fn post_send_writes_the_wqe_at_its_slot_and_bumps_sq_pi() {
    let (mock, dev) = setup();
    let (_pd, _cq, qp) = qp_with(&dev, small_cap(), false);
    let stride = qp.sq_geometry().stride();
    assert_eq!(stride, 128); // max(2 SGEs, 64 inline bytes = 4 slots) -> 64 + 64
    let sges = [
        Sge {
            addr: 0x1000,
            length: 10,
            lkey: 7,
        },
        Sge {
            addr: 0x2000,
            length: 20,
            lkey: 8,
        },
    ];
    let wr = SendWr {
        wr_id: 0xabc,
        op: SendOp::SendWithImm { imm: 0x1234_5678 },
        payload: Payload::Sges(&sges),
        flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
        ud: None,
    };
    qp.post_send(&[wr]).unwrap();
    let db = &qp.mem().db;
    assert_eq!(db.load(off::QP_SQ_PI), 1);
    assert_eq!(db.load(off::QP_RQ_PI), 0);
    let (h, rest) = send_slot(&qp, 0);
    assert_eq!(
        h,
        SendWqe {
            wr_id: 0xabc,
            opcode: WrOpcode::SEND_WITH_IMM as u8,
            flags: WQE_SIGNALED | WQE_SOLICITED,
            num_sge: 2,
            imm_data: 0x1234_5678,
            ..SendWqe::default()
        }
    );
    assert_eq!(Sge::read(&rest[..16]), sges[0]);
    assert_eq!(Sge::read(&rest[16..32]), sges[1]);

    // Every opcode encodes its operands; slot 1, 2, 3.
    let one = [Sge {
        addr: 0x3000,
        length: 8,
        lkey: 9,
    }];
    let wrs = [
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: 0x5000,
                rkey: 0x77,
                imm: 5,
            },
            payload: Payload::Sges(&one),
            flags: SendFlags::FENCE,
            ud: None,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::AtomicCmpSwp {
                remote_addr: 0x6000,
                rkey: 0x78,
                compare: 1,
                swap: 2,
            },
            payload: Payload::Sges(&one),
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 4,
            op: SendOp::AtomicFetchAdd {
                remote_addr: 0x6008,
                rkey: 0x78,
                add: 3,
            },
            payload: Payload::Sges(&one),
            flags: SendFlags::NONE,
            ud: None,
        },
    ];
    qp.post_send(&wrs).unwrap();
    assert_eq!(db.load(off::QP_SQ_PI), 4);
    let (h, _) = send_slot(&qp, 1);
    assert_eq!(h.opcode, WrOpcode::RDMA_WRITE_WITH_IMM as u8);
    assert_eq!(
        (h.remote_addr, h.rkey, h.imm_data, h.flags),
        (0x5000, 0x77, 5, WQE_FENCE)
    );
    let (h, _) = send_slot(&qp, 2);
    assert_eq!(h.opcode, WrOpcode::ATOMIC_CMP_AND_SWP as u8);
    assert_eq!((h.compare_add, h.swap), (1, 2));
    let (h, _) = send_slot(&qp, 3);
    assert_eq!(h.opcode, WrOpcode::ATOMIC_FETCH_AND_ADD as u8);
    assert_eq!((h.compare_add, h.remote_addr), (3, 0x6008));
    // The engine never parked: no notification.
    assert_eq!(mock.notify_count(), 0);
}

#[test]
fn kick_only_when_the_device_asks() {
    let (mock, dev) = setup();
    let (_pd, _cq, qp) = qp_with(&dev, small_cap(), false);
    let sge = [Sge {
        addr: 0,
        length: 1,
        lkey: 1,
    }];
    qp.post_send(&[SendWr::send(1, &sge)]).unwrap();
    assert_eq!(mock.notify_count(), 0);
    ctx_flags(&dev, DB_FLAG_KICK);
    qp.post_send(&[SendWr::send(2, &sge)]).unwrap();
    qp.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &sge,
    }])
    .unwrap();
    assert_eq!(*mock.notifies.lock().unwrap(), [NOTIFYQ, NOTIFYQ]);
    ctx_flags(&dev, 0);
    qp.post_send(&[SendWr::send(4, &sge)]).unwrap();
    assert_eq!(mock.notify_count(), 2);
    // A batch is one producer update and at most one kick.
    dev_store(&qp.mem().db, off::QP_SQ_CI, 3);
    ctx_flags(&dev, DB_FLAG_KICK);
    qp.post_send(&[SendWr::send(5, &sge), SendWr::send(6, &sge)])
        .unwrap();
    assert_eq!(mock.notify_count(), 3);
    assert_eq!(qp.mem().db.load(off::QP_SQ_PI), 5);
    // A polling engine needs no notification (and the driver no fence).
    ctx_flags(&dev, DB_FLAG_POLLING);
    qp.post_send(&[SendWr::send(7, &sge)]).unwrap();
    assert_eq!(mock.notify_count(), 3);
    assert_eq!(qp.mem().db.load(off::QP_SQ_PI), 6);
}

#[test]
fn full_send_queue_and_slot_reuse_after_wrap() {
    let (_mock, dev) = setup();
    let (_pd, _cq, qp) = qp_with(&dev, small_cap(), false);
    let sge = [Sge {
        addr: 0,
        length: 1,
        lkey: 1,
    }];
    let db = &qp.mem().db;
    for i in 0..4 {
        qp.post_send(&[SendWr::send(i, &sge)]).unwrap();
    }
    let e = qp.post_send(&[SendWr::send(99, &sge)]).unwrap_err();
    assert!(matches!(e, Error::QueueFull { needed: 1, free: 0 }));
    assert!(e.is_queue_full());
    assert_eq!(db.load(off::QP_SQ_PI), 4);
    // The device took two WQEs: two slots are free again, not three.
    dev_store(db, off::QP_SQ_CI, 2);
    let three = [
        SendWr::send(10, &sge),
        SendWr::send(11, &sge),
        SendWr::send(12, &sge),
    ];
    assert!(matches!(
        qp.post_send(&three),
        Err(Error::QueueFull { needed: 3, free: 2 })
    ));
    assert_eq!(db.load(off::QP_SQ_PI), 4, "all or nothing");
    qp.post_send(&three[..2]).unwrap();
    assert_eq!(db.load(off::QP_SQ_PI), 6);
    // Indices 4 and 5 reuse slots 0 and 1; slots 2 and 3 are untouched.
    assert_eq!(send_slot(&qp, 4).0.wr_id, 10);
    assert_eq!(send_slot(&qp, 5).0.wr_id, 11);
    assert_eq!(send_slot(&qp, 2).0.wr_id, 2);
    assert_eq!(send_slot(&qp, 3).0.wr_id, 3);
}

#[test]
fn producer_indices_wrap_around_u32() {
    let (_mock, dev) = setup();
    let (_pd, _cq, qp) = qp_with(&dev, small_cap(), false);
    let sge = [Sge::default()];
    let db = &qp.mem().db;
    // Move the QP through RESET with the device's indices near u32::MAX:
    // the driver restarts its producer index at the device's consumer index.
    dev_store(db, off::QP_SQ_CI, u32::MAX - 1);
    qp.to_reset().unwrap();
    assert_eq!(db.load(off::QP_SQ_PI), u32::MAX - 1);
    assert!(
        qp.post_send(&[SendWr::send(8, &sge)]).is_err(),
        "posting in RESET is refused"
    );
    qp.rc_to_init(0).unwrap();
    for i in 0..4 {
        qp.post_send(&[SendWr::send(i, &sge)]).unwrap();
    }
    assert_eq!(db.load(off::QP_SQ_PI), 2);
    assert!(qp.post_send(&[SendWr::send(9, &sge)]).is_err());
    dev_store(db, off::QP_SQ_CI, 0);
    qp.post_send(&[SendWr::send(4, &sge)]).unwrap();
    assert_eq!(send_slot(&qp, 2).0.wr_id, 4);
}

#[test]
fn inline_and_ud_sends() {
    let (_mock, dev) = setup();
    let (pd, _cq, qp) = qp_with(&dev, small_cap(), true);
    let ah = Ah::create(
        &pd,
        &AddressVector {
            dgid: [1; 16],
            ..AddressVector::default()
        },
    )
    .unwrap();
    let data: Vec<u8> = (0..13).collect();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Inline(&data),
        flags: SendFlags::SIGNALED,
        ud: Some(UdDest {
            ah: &ah,
            remote_qpn: 0x4321,
            remote_qkey: 0x8000_0000,
        }),
    };
    qp.post_send(&[wr]).unwrap();
    let (h, rest) = send_slot(&qp, 0);
    assert_eq!(h.flags, WQE_SIGNALED | WQE_INLINE);
    assert_eq!((h.num_sge, h.inline_len), (0, 13));
    assert_eq!(
        (h.ah_handle, h.remote_qpn, h.remote_qkey),
        (ah.handle(), 0x4321, 0x8000_0000)
    );
    assert_eq!(&rest[..13], &data[..]);
}

#[test]
fn invalid_work_requests_post_nothing() {
    let (_mock, dev) = setup();
    let (pd, _cq, rc) = qp_with(&dev, small_cap(), false);
    let (_pd2, _cq2, ud) = qp_with(&dev, small_cap(), true);
    let ah = Ah::create(&pd, &AddressVector::default()).unwrap();
    let sge = [Sge {
        addr: 0,
        length: 8,
        lkey: 1,
    }];
    let three = [Sge::default(); 3];
    let big = [0u8; 65];
    let dest = UdDest {
        ah: &ah,
        remote_qpn: 2,
        remote_qkey: 0,
    };
    let base = SendWr::send(0, &sge);
    let rc_bad = [
        SendWr {
            payload: Payload::Sges(&three),
            ..base
        },
        SendWr {
            payload: Payload::Inline(&big),
            ..base
        },
        SendWr {
            ud: Some(dest),
            ..base
        },
        SendWr {
            op: SendOp::AtomicFetchAdd {
                remote_addr: 4,
                rkey: 1,
                add: 1,
            },
            ..base
        },
        SendWr {
            op: SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 1,
            },
            payload: Payload::Inline(&big[..4]),
            ..base
        },
        SendWr {
            op: SendOp::AtomicCmpSwp {
                remote_addr: 8,
                rkey: 1,
                compare: 0,
                swap: 0,
            },
            payload: Payload::Sges(&three[..1]),
            ..base
        },
    ];
    for bad in rc_bad {
        // A valid WR first: the batch is refused as a whole.
        let e = rc.post_send(&[base, bad]).unwrap_err();
        assert!(matches!(e, Error::InvalidWr { index: 1, .. }), "{e}");
    }
    assert_eq!(rc.mem().db.load(off::QP_SQ_PI), 0);
    // UD: only SEND, always with a destination, an AH of the QP's PD.
    assert!(ud.post_send(&[base]).is_err());
    let write = SendWr {
        op: SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        },
        ud: Some(dest),
        ..base
    };
    assert!(ud.post_send(&[write]).is_err());
    let other_pd = SendWr {
        ud: Some(dest),
        ..base
    };
    assert!(matches!(
        ud.post_send(&[other_pd]),
        Err(Error::InvalidWr { index: 0, .. })
    ));
    assert_eq!(ud.mem().db.load(off::QP_SQ_PI), 0);
    let too_many = RecvWr {
        wr_id: 1,
        sg_list: &three,
    };
    assert!(rc.post_recv(&[too_many]).is_err());
}

#[test]
fn post_recv_writes_at_the_receive_ring() {
    let (_mock, dev) = setup();
    let (_pd, _cq, qp) = qp_with(&dev, small_cap(), false);
    let rq = qp.rq_geometry().unwrap();
    assert_eq!((rq.base, rq.shift), (4096, 6)); // 16 + 2 * 16 = 48 -> 64
    let sges = [
        Sge {
            addr: 0x10,
            length: 100,
            lkey: 3,
        },
        Sge {
            addr: 0x20,
            length: 200,
            lkey: 4,
        },
    ];
    for i in 0..6u64 {
        if i == 4 {
            dev_store(&qp.mem().db, off::QP_RQ_CI, 2);
        }
        qp.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sg_list: &sges[..(i % 2 + 1) as usize],
        }])
        .unwrap();
    }
    assert_eq!(qp.mem().db.load(off::QP_RQ_PI), 6);
    assert_eq!(qp.mem().db.load(off::QP_SQ_PI), 0);
    let slot = |i| qp.mem().buf.to_vec(rq.slot_offset(i), 64).unwrap();
    let s5 = slot(5);
    assert_eq!(rq.slot_offset(5), 4096 + 64);
    assert_eq!(
        RecvWqe::parse(&s5[..16]).unwrap(),
        RecvWqe {
            wr_id: 105,
            num_sge: 2,
            reserved: 0
        }
    );
    assert_eq!(Sge::read(&s5[16..32]), sges[0]);
    assert_eq!(Sge::read(&s5[32..48]), sges[1]);
    assert_eq!(RecvWqe::read(&slot(2)).wr_id, 102);
}

#[test]
fn srq_post_recv_and_limit() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let srq = Srq::create(&pd, 3, 1, 0).unwrap();
    assert_eq!(srq.depth(), 4);
    let sge = [Sge {
        addr: 0x40,
        length: 64,
        lkey: 5,
    }];
    let wrs: Vec<_> = (0..4)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: &sge,
        })
        .collect();
    srq.post_recv(&wrs).unwrap();
    assert!(srq.post_recv(&wrs[..1]).unwrap_err().is_queue_full());
    srq.modify_limit(2).unwrap();
    let m = mock
        .last(virtio_rdma_abi::ctrl::Opcode::MODIFY_SRQ)
        .unwrap();
    let m = virtio_rdma_abi::verbs::ModifySrqReq::parse(&m.payload).unwrap();
    assert_eq!(
        (m.attr_mask, m.limit),
        (virtio_rdma_abi::verbs::SRQ_ATTR_LIMIT, 2)
    );
    // A QP on the SRQ has no receive ring of its own.
    let cq = Cq::create(&dev, 4).unwrap();
    let qp = Qp::create(
        &pd,
        &QpInit {
            srq: Some(srq.clone()),
            ..QpInit::rc(&cq)
        },
    )
    .unwrap();
    assert!(qp.rq_geometry().is_none());
    assert!(qp
        .post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &sge
        }])
        .is_err());
    let q = mock.last(virtio_rdma_abi::ctrl::Opcode::CREATE_QP).unwrap();
    let q = virtio_rdma_abi::verbs::CreateQpReq::parse_prefix(&q.payload)
        .unwrap()
        .0;
    assert_eq!((q.srq_handle, q.rq_depth), (srq.handle(), 0));
}

/// Writes CQE `index` as the device does: every field, then `owner` last
/// with release semantics.
fn device_write_cqe(cq: &Cq, index: u32, wr_id: u64, status: WcStatus) {
    let slot = ((index & (cq.depth() - 1)) * 32) as usize;
    let cqe = Cqe {
        wr_id,
        opcode: WcOpcode::RECV as u8,
        status: status as u8,
        flags: CQE_WITH_IMM,
        owner: 0,
        byte_len: 100 + index,
        imm_data: 0x55,
        qpn: 0x101,
        src_qpn: 0,
        vendor_err: 0,
    };
    let bytes = cqe.to_bytes();
    cq.ring().write(slot, &bytes[..11]).unwrap();
    cq.ring().write(slot + 12, &bytes[12..]).unwrap();
    cq.ring()
        .atomic_u8(slot + CQE_OWNER_OFFSET as usize)
        .store(cqe_owner(index, cq.depth()), Ordering::Release);
    dev_store(cq.db(), off::CQ_PI, index + 1);
}

#[test]
fn poll_cq_follows_the_owner_phase_across_a_wrap() {
    let (_mock, dev) = setup();
    let cq = Cq::create(&dev, 3).unwrap();
    assert_eq!(cq.depth(), 4);
    let mut wc = [crate::WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wc), 0);
    for i in 0..4 {
        device_write_cqe(&cq, i, 1000 + u64::from(i), WcStatus::SUCCESS);
    }
    assert_eq!(cq.poll(&mut wc[..3]), 3);
    assert_eq!(cq.db().load(off::CQ_CI), 3);
    assert_eq!(wc[0].wr_id, 1000);
    assert!(wc[0].is_success());
    assert_eq!(wc[0].opcode(), Some(WcOpcode::RECV));
    assert_eq!(wc[0].imm(), Some(0x55));
    assert_eq!((wc[2].byte_len, wc[2].qpn), (102, 0x101));
    // Index 3 is valid; index 4 (slot 0) still holds the first pass's
    // entry with owner 1, which is stale for the second pass.
    assert_eq!(cq.poll(&mut wc), 1);
    assert_eq!(wc[0].wr_id, 1003);
    assert_eq!(cq.poll(&mut wc), 0);
    assert_eq!(cq.db().load(off::CQ_CI), 4);
    device_write_cqe(&cq, 4, 1004, WcStatus::WR_FLUSH_ERR);
    device_write_cqe(&cq, 5, 1005, WcStatus::SUCCESS);
    assert_eq!(cq.poll(&mut wc), 2);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (1004, 1005));
    assert_eq!(wc[0].status(), Some(WcStatus::WR_FLUSH_ERR));
    assert!(!wc[0].is_success());
    assert_eq!(cq.db().load(off::CQ_CI), 6);
    // Third pass (owner 1 again) over slots 2, 3, 0.
    for i in 6..9 {
        device_write_cqe(&cq, i, 1000 + u64::from(i), WcStatus::SUCCESS);
    }
    let got: Vec<u64> = std::iter::from_fn(|| cq.poll_one().map(|w| w.wr_id)).collect();
    assert_eq!(got, [1006, 1007, 1008]);
    assert_eq!(cq.db().load(off::CQ_CI), 9);
}

#[test]
fn arming_writes_a_new_sequence_number() {
    let (_mock, dev) = setup();
    let cq = Cq::create(&dev, 4).unwrap();
    let db = cq.db();
    cq.req_notify(false);
    assert_eq!(db.load(off::CQ_ARM), 1 << 2 | ARM_NEXT);
    // The device consumed it.
    dev_store(db, off::CQ_ARMED_SEQ, 1);
    cq.req_notify(true);
    assert_eq!(db.load(off::CQ_ARM), 2 << 2 | ARM_SOLICITED);
    // A re-arm before the device consumed the previous one still changes seq.
    cq.req_notify(false);
    assert_eq!(db.load(off::CQ_ARM), 3 << 2 | ARM_NEXT);
    // Never the device's armed_seq (that would not arm).
    dev_store(db, off::CQ_ARMED_SEQ, 4);
    cq.req_notify(false);
    assert_eq!(db.load(off::CQ_ARM), 5 << 2 | ARM_NEXT);
    // The driver-written ci is untouched.
    assert_eq!(db.load(off::CQ_CI), 0);
}

#[test]
fn completion_events_go_to_their_cq_and_others_to_the_device() {
    let (mock, dev) = setup();
    let a = Cq::create(&dev, 4).unwrap();
    let b = Cq::create(&dev, 4).unwrap();
    let ev = |kind: EventKind, handle| Event {
        kind: kind.into(),
        handle,
        detail: 0,
        seq: 0,
    };
    mock.events.lock().unwrap().extend([
        ev(EventKind::CQ_COMPLETION, b.handle()),
        ev(EventKind::QP_FATAL, 77),
        ev(EventKind::CQ_COMPLETION, 0xdead), // not ours: ignored
        ev(EventKind::CQ_COMPLETION, a.handle()),
    ]);
    assert!(a.wait_event(Some(Duration::from_millis(500))).unwrap());
    assert!(!a.wait_event(Some(Duration::ZERO)).unwrap());
    assert!(b.wait_event(Some(Duration::ZERO)).unwrap());
    assert!(!b.wait_event(Some(Duration::from_millis(20))).unwrap());
    let e = dev.next_async_event(Some(Duration::ZERO)).unwrap().unwrap();
    assert_eq!((e.kind, e.handle), (EventKind::QP_FATAL as u32, 77));
    assert!(dev
        .next_async_event(Some(Duration::ZERO))
        .unwrap()
        .is_none());
}

#[test]
fn concurrent_waiters_get_their_own_events() {
    let mock = Arc::new(Mock::new());
    let dev = Device::open(mock.clone()).unwrap();
    let a = Cq::create(&dev, 4).unwrap();
    let b = Cq::create(&dev, 4).unwrap();
    let (ha, hb) = (a.handle(), b.handle());
    let t = std::thread::spawn(move || b.wait_event(Some(Duration::from_secs(5))).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    for h in [ha, hb] {
        mock.events.lock().unwrap().push_back(Event {
            kind: EventKind::CQ_COMPLETION.into(),
            handle: h,
            detail: 0,
            seq: 0,
        });
    }
    assert!(a.wait_event(Some(Duration::from_secs(5))).unwrap());
    assert!(t.join().unwrap());
}
