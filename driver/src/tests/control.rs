//! Control-path encoding: open, object lifetimes, page lists, MODIFY_QP masks.

use std::sync::Arc;

use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{CqDoorbell, CtxDoorbell, QpDoorbell, SrqDoorbell};
use virtio_rdma_abi::mem::{access, BufferDesc, PageListMode};
use virtio_rdma_abi::qp::{attr, QpAttr, QpState};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;

use super::setup;
use crate::doorbell::off;
use crate::{Cq, Error, Mr, MrPages, Pd, Qp, QpCap, QpInit, RcConnect};

#[test]
fn doorbell_offsets_match_the_abi() {
    let at = |l: &[virtio_rdma_abi::FieldLayout], name: &str| {
        l.iter().find(|f| f.name == name).map(|f| f.offset).unwrap()
    };
    let q = QpDoorbell::LAYOUT;
    assert_eq!(off::QP_SQ_PI, at(q, "sq_pi"));
    assert_eq!(off::QP_RQ_PI, at(q, "rq_pi"));
    assert_eq!(off::QP_SQ_CI, at(q, "sq_ci"));
    assert_eq!(off::QP_RQ_CI, at(q, "rq_ci"));
    let c = CqDoorbell::LAYOUT;
    assert_eq!(off::CQ_CI, at(c, "ci"));
    assert_eq!(off::CQ_ARM, at(c, "arm"));
    assert_eq!(off::CQ_PI, at(c, "pi"));
    assert_eq!(off::CQ_ARMED_SEQ, at(c, "armed_seq"));
    let s = SrqDoorbell::LAYOUT;
    assert_eq!(off::SRQ_PI, at(s, "pi"));
    assert_eq!(off::SRQ_CI, at(s, "ci"));
    // The device flags are per context (spec 18.4), at offset 0 of its header.
    assert_eq!(at(CtxDoorbell::LAYOUT, "flags"), 0);
}

#[test]
fn open_queries_then_creates_a_context_and_drop_destroys_it() {
    let (mock, dev) = setup();
    assert_eq!(
        mock.opcodes(),
        [
            Opcode::QUERY_DEVICE,
            Opcode::QUERY_PORT,
            Opcode::QUERY_GID,
            Opcode::QUERY_GID,
            Opcode::CREATE_CTX
        ]
    );
    let port = QueryPortReq::parse(&mock.last(Opcode::QUERY_PORT).unwrap().payload).unwrap();
    assert_eq!(port.port, 1);
    // A version-3 device: index 0 is the default GID, the handle's own
    // GID is the operator's first, at index 1.
    assert_eq!((dev.gid()[15], dev.gid_index()), (7, 1));
    assert_eq!(dev.av([9; 16]).sgid_index, 1);
    assert_eq!(dev.gid_table().unwrap()[0][..2], [0xfe, 0x80]);
    assert_eq!(dev.port_attr().active_mtu, 3);
    let ctx = dev.ctx_handle();
    drop(dev);
    let d = mock.last(Opcode::DESTROY_CTX).unwrap();
    assert_eq!(CtxHandleReq::parse(&d.payload).unwrap().ctx_handle, ctx);
}

#[test]
fn open_sends_its_commands_before_waiting() {
    let (mock, _dev) = setup();
    assert_eq!(*mock.waits.lock().unwrap(), [5, 5, 5, 5, 5]);
}

#[test]
fn open_destroys_its_context_when_a_query_failed() {
    let m = Arc::new(super::mock::Mock::new());
    *m.fail.lock().unwrap() = Some((Opcode::QUERY_PORT, Status::INVALID, 1));
    let e = crate::Device::open(m.clone()).unwrap_err();
    assert!(matches!(
        e,
        Error::Command {
            opcode: Opcode::QUERY_PORT,
            status: Status::INVALID,
            ..
        }
    ));
    assert_eq!(
        m.opcodes(),
        [
            Opcode::QUERY_DEVICE,
            Opcode::QUERY_PORT,
            Opcode::QUERY_GID,
            Opcode::QUERY_GID,
            Opcode::CREATE_CTX,
            Opcode::DESTROY_CTX
        ]
    );
}

#[test]
fn the_paired_mac_is_exposed() {
    let (_mock, dev) = setup();
    assert_eq!(dev.paired_mac(), Some(super::mock::MOCK_MAC));
    assert_eq!(dev.config().mac, super::mock::MOCK_MAC);
    let mut m = super::mock::Mock::new();
    m.config.mac = [0; 6];
    let dev = crate::Device::open(Arc::new(m)).unwrap();
    assert_eq!(dev.paired_mac(), None, "all zero: none configured");
}

#[test]
fn abi_version_is_checked() {
    // Version 1 (the layout before the v2 doorbell changes) and any later
    // one are refused before a single command is sent; version 2 is driven
    // as a version-3 device without the version-3 features.
    for v in [0, 1, virtio_rdma_abi::ABI_VERSION + 1, u32::MAX] {
        let mut m = super::mock::Mock::new();
        m.config.abi_version = v;
        let m = Arc::new(m);
        let r = crate::Device::open(m.clone());
        assert!(matches!(r, Err(Error::AbiVersion(got)) if got == v), "{v}");
        assert!(m.opcodes().is_empty(), "version {v}: commands sent");
    }
    for v in [2, virtio_rdma_abi::ABI_VERSION] {
        let mut m = super::mock::Mock::new();
        m.config.abi_version = v;
        let dev = crate::Device::open(Arc::new(m)).unwrap();
        // Either way the handle's GID is the operator's: index 0 of a
        // version-2 table (one entry, read alone), 1 of a version-3 one.
        assert_eq!(
            (dev.gid()[15], u32::from(dev.gid_index())),
            (7, v.saturating_sub(2)),
            "version {v}"
        );
    }
    // A GID index given by the caller is read alone.
    let m = Arc::new(super::mock::Mock::new());
    let opts = crate::DeviceOptions {
        gid_index: Some(0),
        ..crate::DeviceOptions::default()
    };
    let dev = crate::Device::open_with(m.clone(), opts).unwrap();
    assert_eq!((&dev.gid()[..2], dev.gid_index()), (&[0xfe, 0x80][..], 0));
    assert_eq!(
        m.opcodes()
            .iter()
            .filter(|&&o| o == Opcode::QUERY_GID)
            .count(),
        1
    );
}

#[test]
fn failed_command_carries_status_and_detail() {
    let (mock, dev) = setup();
    *mock.fail.lock().unwrap() = Some((Opcode::ALLOC_PD, Status::QUOTA, 2));
    let e = Pd::alloc(&dev).unwrap_err();
    assert_eq!(e.status(), Some((Status::QUOTA, 2)));
    assert!(matches!(
        e,
        Error::Command {
            opcode: Opcode::ALLOC_PD,
            ..
        }
    ));
    assert!(Pd::alloc(&dev).is_ok());
}

#[test]
fn objects_are_destroyed_after_their_users() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 16).unwrap();
    let qp = Qp::create(&pd, &QpInit::rc(&cq)).unwrap();
    let buf = Arc::new(dev.alloc_dma(8192, 4096).unwrap());
    let mr = Mr::register(&pd, buf, access::LOCAL_WRITE).unwrap();
    let n = mock.opcodes().len();
    // Drop the parents first: the children keep them alive.
    drop(dev);
    drop(pd);
    drop(cq);
    assert_eq!(mock.opcodes().len(), n, "nothing destroyed yet");
    drop(mr);
    drop(qp);
    assert_eq!(
        mock.opcodes()[n..],
        [
            Opcode::DEREG_MR,
            Opcode::DESTROY_QP,
            Opcode::DESTROY_CQ,
            Opcode::DEALLOC_PD,
            Opcode::DESTROY_CTX
        ]
    );
}

#[test]
fn create_qp_describes_the_buffer_and_doorbell() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 100).unwrap();
    assert_eq!(cq.depth(), 128);
    let init = QpInit {
        cap: QpCap {
            max_send_wr: 60,
            max_recv_wr: 30,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..QpInit::rc(&cq)
    };
    let qp = Qp::create(&pd, &init).unwrap();
    let req = mock.last(Opcode::CREATE_QP).unwrap();
    let (r, tail) = CreateQpReq::parse_prefix(&req.payload).unwrap();
    assert_eq!((r.sq_depth, r.rq_depth), (64, 32));
    assert_eq!(
        (r.send_cq, r.recv_cq, r.srq_handle),
        (cq.handle(), cq.handle(), 0)
    );
    assert_eq!(r.pd_handle, pd.handle());
    assert_eq!(r.db_gpa, qp.mem().db.gpa());
    assert_eq!(r.db_gpa % 64, 0);
    // 64 * 128 bytes of send ring, then 32 * 32 of receive ring: 3 pages.
    assert_eq!(r.buf.npages, 3);
    assert_eq!(r.buf.page_shift, 12);
    assert_eq!(r.buf.first_page_offset, 0);
    assert_eq!(r.buf.mode, u32::from(PageListMode::CONTIGUOUS));
    assert_eq!(r.buf.addr, qp.mem().buf.gpa(0).unwrap());
    assert!(tail.is_empty());
    assert_eq!(qp.sq_geometry().shift, 7);
    assert_eq!(qp.rq_geometry().unwrap().base, 8192);
    assert_eq!(qp.cap().max_send_wr, 64);

    let c = mock.last(Opcode::CREATE_CQ).unwrap();
    let (c, _) = CreateCqReq::parse_prefix(&c.payload).unwrap();
    assert_eq!(c.depth, 128);
    assert_eq!(c.ctx_handle, dev.ctx_handle());
    assert_eq!(c.buf.npages, 1);
}

#[test]
fn mr_page_lists_inline_and_indirect() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    // Scattered pages (every other one): not contiguous.
    let pages: Vec<u64> = (0..3).map(|i| 0x10_0000 + i * 0x2000).collect();
    let spec = MrPages {
        iova: 0x7000_0800,
        length: 3 * 4096 - 0x800,
        first_page_offset: 0x800,
        page_shift: 12,
        pages: &pages,
    };
    // SAFETY: the mock device never accesses registered pages.
    let mr = unsafe { Mr::register_pages(&pd, &spec, access::LOCAL_WRITE) }.unwrap();
    let req = mock.last(Opcode::REG_MR).unwrap();
    let (r, tail) = RegMrReq::parse_prefix(&req.payload).unwrap();
    assert_eq!(
        r.buf,
        BufferDesc {
            addr: 0,
            npages: 3,
            first_page_offset: 0x800,
            page_shift: 12,
            mode: PageListMode::INLINE.into()
        }
    );
    assert_eq!((r.iova, r.length), (spec.iova, spec.length));
    let got: Vec<u64> = tail
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, pages);
    assert_eq!(mr.lkey(), 0x1000 + mr.handle());
    let sge = mr.sge(16, 32).unwrap();
    assert_eq!(
        (sge.addr, sge.length, sge.lkey),
        (0x7000_0810, 32, mr.lkey())
    );
    assert!(mr.sge(spec.length - 8, 16).is_err());

    // More pages than max_inline_pages (4): indirect, two list pages.
    let pages: Vec<u64> = (0..600).map(|i| 0x100_0000 + i * 0x2000).collect();
    let spec = MrPages {
        iova: 0,
        length: 600 * 4096,
        first_page_offset: 0,
        page_shift: 12,
        pages: &pages,
    };
    // SAFETY: as above.
    let _mr2 = unsafe { Mr::register_pages(&pd, &spec, 0) }.unwrap();
    let req = mock.last(Opcode::REG_MR).unwrap();
    let (r, tail) = RegMrReq::parse_prefix(&req.payload).unwrap();
    assert_eq!(r.buf.mode, u32::from(PageListMode::INDIRECT));
    assert_eq!(tail.len(), 16);
    for lp in tail.chunks(8) {
        assert_eq!(u64::from_le_bytes(lp.try_into().unwrap()) % 4096, 0);
    }
    assert_eq!(*mock.indirect.lock().unwrap(), pages);
}

#[test]
fn mr_from_dma_buf_range() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let buf = Arc::new(dev.alloc_dma(3 * 4096, 4096).unwrap());
    let mr = Mr::register_range(&pd, buf.clone(), 4096 + 100, 5000, access::LOCAL_WRITE).unwrap();
    let (r, _) = RegMrReq::parse_prefix(&mock.last(Opcode::REG_MR).unwrap().payload).unwrap();
    assert_eq!(r.iova, buf.as_ptr() as u64 + 4096 + 100);
    assert_eq!(r.length, 5000);
    assert_eq!(r.buf.first_page_offset, 100);
    assert_eq!(r.buf.npages, 2);
    assert_eq!(r.buf.mode, u32::from(PageListMode::CONTIGUOUS));
    assert_eq!(r.buf.addr, buf.pages()[1]);
    assert_eq!(mr.iova(), r.iova);
    assert!(Mr::register_range(&pd, buf, 3 * 4096 - 10, 11, 0).is_err());
}

fn modify_masks(mock: &super::mock::Mock) -> Vec<(u32, QpAttr)> {
    mock.requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.opcode == Opcode::MODIFY_QP)
        .map(|r| {
            let m = ModifyQpReq::parse(&r.payload).unwrap();
            (m.attr_mask, m.attr)
        })
        .collect()
}

#[test]
fn alloc_with_cq_sends_both_before_waiting_and_makes_what_each_makes() {
    let (mock, dev) = setup();
    let before = mock.requests.lock().unwrap().len();
    mock.waits.lock().unwrap().clear();
    let (pd, cq) = Pd::alloc_with_cq(&dev, 100).unwrap();
    assert_eq!(*mock.waits.lock().unwrap(), [before + 2; 2]);
    assert_eq!(
        mock.opcodes()[before..],
        [Opcode::ALLOC_PD, Opcode::CREATE_CQ]
    );
    let pd_req = CtxHandleReq::parse(&mock.last(Opcode::ALLOC_PD).unwrap().payload).unwrap();
    let cq_req = CreateCqReq::parse(&mock.last(Opcode::CREATE_CQ).unwrap().payload).unwrap();
    assert_eq!(
        (pd_req.ctx_handle, cq_req.ctx_handle),
        (dev.ctx_handle(), dev.ctx_handle())
    );
    // As `Cq::create` would: rounded up to a power of two.
    assert_eq!((cq_req.depth, cq.depth()), (128, 128));
    assert_ne!(pd.handle(), 0);
    assert_ne!(cq.handle(), 0);
    drop((pd, cq));
    let n = mock.opcodes().len();
    assert_eq!(
        mock.opcodes()[n - 2..],
        [Opcode::DEALLOC_PD, Opcode::DESTROY_CQ]
    );
}

#[test]
fn alloc_with_cq_destroys_the_one_made_when_the_other_failed() {
    let (mock, dev) = setup();
    *mock.fail.lock().unwrap() = Some((Opcode::CREATE_CQ, Status::QUOTA, 2));
    let e = Pd::alloc_with_cq(&dev, 16).unwrap_err();
    assert_eq!(e.status(), Some((Status::QUOTA, 2)));
    let pd = CtxHandleReq::parse(&mock.last(Opcode::ALLOC_PD).unwrap().payload).unwrap();
    assert_eq!(pd.ctx_handle, dev.ctx_handle());
    assert_eq!(mock.opcodes().last(), Some(&Opcode::DEALLOC_PD));
    *mock.fail.lock().unwrap() = Some((Opcode::ALLOC_PD, Status::QUOTA, 1));
    let e = Pd::alloc_with_cq(&dev, 16).unwrap_err();
    assert_eq!(e.status(), Some((Status::QUOTA, 1)));
    assert_eq!(mock.opcodes().last(), Some(&Opcode::DESTROY_CQ));
}

#[test]
fn rc_connect_sends_its_three_modifies_before_waiting() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 16).unwrap();
    let qp = Qp::create(&pd, &QpInit::rc(&cq)).unwrap();
    let before = mock.requests.lock().unwrap().len();
    mock.waits.lock().unwrap().clear();
    qp.rc_connect(access::REMOTE_WRITE, &RcConnect::new(0x345, [9; 16]))
        .unwrap();
    assert_eq!(*mock.waits.lock().unwrap(), [before + 3; 3]);
    // From RTS (or anywhere but RESET and INIT), one after the other: the
    // first fails, nothing else is sent (the mock refuses nothing itself).
    *mock.fail.lock().unwrap() = Some((Opcode::MODIFY_QP, Status::BAD_STATE, 3));
    mock.waits.lock().unwrap().clear();
    let e = qp
        .rc_connect(access::REMOTE_WRITE, &RcConnect::new(0x345, [9; 16]))
        .unwrap_err();
    assert_eq!(e.status(), Some((Status::BAD_STATE, 3)));
    assert_eq!(*mock.waits.lock().unwrap(), [before + 4]);
    assert_eq!(qp.state(), QpState::RTS);
}

#[test]
fn rc_connect_reports_the_first_failure_and_keeps_the_state_it_reached() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 16).unwrap();
    let qp = Qp::create(&pd, &QpInit::rc(&cq)).unwrap();
    // The INIT step fails; the mock (which keeps no QP state) accepts the
    // two after it, which a device would refuse.
    *mock.fail.lock().unwrap() = Some((Opcode::MODIFY_QP, Status::INVALID, 5));
    let e = qp
        .rc_connect(access::REMOTE_WRITE, &RcConnect::new(0x345, [9; 16]))
        .unwrap_err();
    assert_eq!(e.status(), Some((Status::INVALID, 5)));
    assert_eq!(modify_masks(&mock).len(), 3);
    assert_eq!(qp.state(), QpState::RESET);
}

#[test]
fn rc_connect_uses_the_required_attributes() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 16).unwrap();
    let qp = Qp::create(&pd, &QpInit::rc(&cq)).unwrap();
    let mut c = RcConnect::new(0x345, [9; 16]);
    c.rq_psn = 11;
    c.sq_psn = 22;
    qp.rc_connect(access::REMOTE_WRITE, &c).unwrap();
    assert_eq!(qp.state(), QpState::RTS);
    let m = modify_masks(&mock);
    assert_eq!(m.len(), 3);
    assert_eq!(
        m[0].0,
        attr::STATE | attr::PKEY_INDEX | attr::PORT | attr::ACCESS
    );
    assert_eq!(m[0].1.qp_state, QpState::INIT as u32);
    assert_eq!((m[0].1.port, m[0].1.access), (1, access::REMOTE_WRITE));
    assert_eq!(
        m[1].0,
        attr::STATE
            | attr::AV
            | attr::PATH_MTU
            | attr::DEST_QPN
            | attr::RQ_PSN
            | attr::MAX_DEST_RD_ATOMIC
            | attr::MIN_RNR_TIMER
    );
    assert_eq!(
        (m[1].1.dest_qpn, m[1].1.rq_psn, m[1].1.av.dgid),
        (0x345, 11, [9; 16])
    );
    assert_eq!(
        m[2].0,
        attr::STATE
            | attr::SQ_PSN
            | attr::TIMEOUT
            | attr::RETRY_CNT
            | attr::RNR_RETRY
            | attr::MAX_RD_ATOMIC
    );
    assert_eq!((m[2].1.qp_state, m[2].1.sq_psn), (QpState::RTS as u32, 22));
    // Unselected fields are written as 0.
    assert_eq!(m[2].1.dest_qpn, 0);
}

#[test]
fn ud_activate_uses_the_required_attributes() {
    let (mock, dev) = setup();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 16).unwrap();
    let qp = Qp::create(&pd, &QpInit::ud(&cq)).unwrap();
    qp.ud_activate(0x1111, 5).unwrap();
    let m = modify_masks(&mock);
    assert_eq!(
        m[0].0,
        attr::STATE | attr::PKEY_INDEX | attr::PORT | attr::QKEY
    );
    assert_eq!(m[0].1.qkey, 0x1111);
    assert_eq!(m[1].0, attr::STATE);
    assert_eq!(m[1].1.qp_state, QpState::RTR as u32);
    assert_eq!(m[2].0, attr::STATE | attr::SQ_PSN);
    qp.to_error().unwrap();
    assert_eq!(qp.state(), QpState::ERR);
    let q = CreateQpReq::parse_prefix(&mock.last(Opcode::CREATE_QP).unwrap().payload)
        .unwrap()
        .0;
    assert_eq!(q.qp_type, 2);
}

#[test]
fn features_are_required() {
    let mut m = super::mock::Mock::new();
    m.features = 0;
    let dev = crate::Device::open(Arc::new(m)).unwrap();
    let pd = Pd::alloc(&dev).unwrap();
    let cq = Cq::create(&dev, 4).unwrap();
    assert!(matches!(
        Qp::create(&pd, &QpInit::ud(&cq)),
        Err(Error::Unsupported("F_UD"))
    ));
    assert!(matches!(
        crate::Srq::create(&pd, 4, 1, 0),
        Err(Error::Unsupported("F_SRQ"))
    ));
}
