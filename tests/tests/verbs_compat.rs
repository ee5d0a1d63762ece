#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What real verbs software (Linux ib_core, rdma-core, perftest) needs from
//! the device, end to end through the reference driver and the real
//! vhost-user socket: values it reads (port and device attributes, the UD
//! GRH) and arguments it passes (`LOCAL_WRITE` in a QP's access, QPs
//! without send SGEs).

use std::sync::Arc;

use vhost_user_rdma::rnic::soft::SoftRnic;
use vhost_user_rdma::rnic_objects::{
    Caps, MrKeys, MrSpec, Owner, QpChange, QpSpec, RnicError, RnicKind, RnicObjects, SrqSpec,
};
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::*;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{status_of, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{UdGrh, WcOpcode, WcStatus, DB_PAGE_SIZE, UD_GRH_SIZE};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::{
    PHYS_STATE_LINK_UP, PORT_STATE_ACTIVE, SPEED_EDR, WIDTH_1X, WIDTH_4X,
};
use virtio_rdma_driver::{Ah, Cq, Payload, Qp, QpCap, QpInit, RecvWr, SendOp, SendWr, UdDest};

/// Spec 10.5: `LOCAL_WRITE` in a QP's access is accepted (perftest's
/// `ib_send_bw` passes it), stored and reported back by QUERY_QP, and grants
/// nothing: remote rights still come from the `REMOTE_*` bits alone.
#[test]
fn qp_access_accepts_local_write() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let (qa, qb) = (rc_qp(&a, &cqa), rc_qp(&b, &cqb));
    let granted = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    qa.rc_connect(access::LOCAL_WRITE, &conn(&qb, &b)).unwrap();
    qb.rc_connect(granted, &conn(&qa, &a)).unwrap();
    assert_eq!(qa.query().unwrap().attr.access, access::LOCAL_WRITE);
    assert_eq!(qb.query().unwrap().attr.access, granted);

    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let data = pattern(1000, 1);
    ba.write(0, &data);
    let sg = [ba.sge(0, data.len())];
    let op = write_op(&bb, 0);
    qa.post_send(&[wr(1, op, &sg)]).unwrap();
    ok(&poll_one(&cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(0, data.len()), data);

    // qa allows LOCAL_WRITE only: a WRITE from qb into it is refused.
    let sg = [bb.sge(0, 16)];
    let op = write_op(&ba, 2048);
    qb.post_send(&[wr(2, op, &sg)]).unwrap();
    let wc = poll_one(&cqb);
    assert_eq!(wc.wr_id, 2);
    assert_eq!(wc.status(), Some(WcStatus::REM_ACCESS_ERR), "{wc:?}");
    assert_eq!(ba.read(2048, 16), vec![0; 16], "the refused WRITE landed");
}

/// Spec 12.12: a QP created with `max_send_sge` 0 posts inline and
/// zero-length work requests (SEND, SEND_WITH_IMM, RDMA WRITE), which
/// arrive; its send stride holds the inline data. A work request with an
/// SGE does not fit it.
#[test]
fn qp_without_send_sges_posts_inline_and_empty_sends() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    for inline in [0u32, 64] {
        let mut init = QpInit::rc(&cqa);
        init.cap = QpCap {
            max_send_sge: 0,
            max_inline_data: inline,
            ..cap()
        };
        let qa = Qp::create(&a.pd, &init).unwrap();
        assert_eq!(qa.cap().max_send_sge, 0);
        assert_eq!(qa.query().unwrap().max_send_sge, 0);
        let qb = rc_qp(&b, &cqb);
        connect(&a, &qa, &b, &qb);
        let bb = Buf::new(&b, 4096);
        bb.write(0, &[0xEE; 4096]);
        let data = pattern(inline as usize, u64::from(inline));
        let mut wrs = vec![
            wr(1, SendOp::Send, &[]),
            wr(2, SendOp::SendWithImm { imm: 0x1234 }, &[]),
        ];
        if inline > 0 {
            wrs.push(SendWr {
                payload: Payload::Inline(&data),
                ..wr(3, SendOp::Send, &[])
            });
            wrs.push(SendWr {
                payload: Payload::Inline(&data),
                ..wr(4, write_op(&bb, 2048), &[])
            });
        }
        let recvs = wrs.iter().filter(|w| w.wr_id != 4).count();
        for i in 0..recvs {
            qb.post_recv(&[RecvWr {
                wr_id: 100 + i as u64,
                sg_list: &[bb.sge(i * 128, 128)],
            }])
            .unwrap();
        }
        qa.post_send(&wrs).unwrap();
        for (w, wc) in wrs.iter().zip(poll_n(&cqa, wrs.len())) {
            let op = if w.wr_id == 4 {
                WcOpcode::RDMA_WRITE
            } else {
                WcOpcode::SEND
            };
            ok(&wc, w.wr_id, op);
        }
        let got = poll_n(&cqb, recvs);
        ok(&got[0], 100, WcOpcode::RECV);
        assert_eq!(got[0].byte_len, 0);
        ok(&got[1], 101, WcOpcode::RECV);
        assert_eq!((got[1].byte_len, got[1].imm()), (0, Some(0x1234)));
        assert_eq!(bb.read(0, 256), vec![0xEE; 256], "empty sends wrote");
        if inline > 0 {
            ok(&got[2], 102, WcOpcode::RECV);
            assert_eq!(got[2].byte_len, inline);
            assert_eq!(bb.read(256, data.len()), data, "inline SEND");
            assert_eq!(bb.read(2048, data.len()), data, "inline WRITE");
        }
        // One SGE is more than the QP takes: the driver refuses it.
        let sg = [bb.sge(0, 8)];
        assert!(qa.post_send(&[wr(5, SendOp::Send, &sg)]).is_err());
        assert_quiet(&cqa);
    }
}

/// Spec 12.1, 12.2: QUERY_PORT reports the physical state, speed and width
/// that verbs attributes need (the soft engine's 100 Gbit/s link is 4X EDR)
/// and QUERY_DEVICE the ack delay; the reference driver reads them at open.
#[test]
fn port_and_device_attributes_for_verbs() {
    let d = TestDaemon::start(1).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let port = *a.dev.port_attr();
    assert_eq!(port.state, PORT_STATE_ACTIVE);
    assert_eq!(port.phys_state, PHYS_STATE_LINK_UP);
    assert_eq!(port.link_rate_mbps, 100_000);
    assert_eq!(
        (port.active_speed, port.active_width),
        (SPEED_EDR, WIDTH_4X)
    );
    assert_eq!(a.dev.query_port().unwrap(), port);
    let dev = a.dev.attr();
    assert_eq!(dev.local_ca_ack_delay, 15);
    assert_eq!(dev.reserved, 0);
}

/// The software engine with another link rate and an out-of-range ack
/// delay: the port's speed and width follow the rate (spec 12.2's table),
/// and the ack delay is reported within its 5 bits.
struct OtherLink(SoftRnic);

impl RnicObjects for OtherLink {
    fn kind(&self) -> RnicKind {
        RnicKind::Soft
    }
    fn caps(&self) -> Caps {
        Caps {
            link_rate_mbps: 25_000,
            local_ca_ack_delay: 40,
            ..self.0.caps()
        }
    }
    fn create_pd(&self, owner: Owner) -> Result<(), RnicError> {
        self.0.create_pd(owner)
    }
    fn destroy_pd(&self, owner: Owner) {
        self.0.destroy_pd(owner)
    }
    fn create_qp(&self, owner: Owner, spec: &QpSpec) -> Result<u32, RnicError> {
        self.0.create_qp(owner, spec)
    }
    fn modify_qp(&self, change: &QpChange<'_>) -> Result<(), RnicError> {
        self.0.modify_qp(change)
    }
    fn destroy_qp(&self, qpn: u32) {
        self.0.destroy_qp(qpn)
    }
    fn lookup_qpn(&self, qpn: u32) -> Option<Owner> {
        self.0.lookup_qpn(qpn)
    }
    fn qpns_in_use(&self) -> usize {
        self.0.qpns_in_use()
    }
    fn create_cq(&self, owner: Owner, depth: u32) -> Result<(), RnicError> {
        self.0.create_cq(owner, depth)
    }
    fn destroy_cq(&self, owner: Owner) {
        self.0.destroy_cq(owner)
    }
    fn create_srq(&self, owner: Owner, spec: &SrqSpec) -> Result<(), RnicError> {
        self.0.create_srq(owner, spec)
    }
    fn destroy_srq(&self, owner: Owner) {
        self.0.destroy_srq(owner)
    }
    fn create_ah(&self, owner: Owner, pd: u32, av: &AddressVector) -> Result<(), RnicError> {
        self.0.create_ah(owner, pd, av)
    }
    fn destroy_ah(&self, owner: Owner) {
        self.0.destroy_ah(owner)
    }
    fn reg_mr(&self, owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.0.reg_mr(owner, mr)
    }
    fn dereg_mr(&self, keys: MrKeys) {
        self.0.dereg_mr(keys)
    }
    fn alloc_fast_mr(&self, owner: Owner) -> Result<u32, RnicError> {
        self.0.alloc_fast_mr(owner)
    }
    fn free_fast_mr(&self, key: u32) {
        self.0.free_fast_mr(key)
    }
    fn keys_in_use(&self) -> usize {
        self.0.keys_in_use()
    }
}

#[test]
fn port_speed_and_ack_delay_follow_the_engine() {
    let rnic = Arc::new(OtherLink(SoftRnic::new()));
    let d = TestDaemon::with_soft_rnic(1, rnic).unwrap();
    let a = Vm::open(&d, 0, VmmOptions::default());
    let port = a.dev.port_attr();
    assert_eq!(port.link_rate_mbps, 25_000);
    assert_eq!(
        (port.active_speed, port.active_width),
        (SPEED_EDR, WIDTH_1X)
    );
    assert_eq!(port.phys_state, PHYS_STATE_LINK_UP);
    assert_eq!(a.dev.attr().local_ca_ack_delay, 31);
}

/// Spec 12.4, 18.7: in the shared-memory doorbell mode every context gets a
/// doorbell page below `max_ctx`, distinct from the other live ones, up to
/// `max_ctx` contexts; pages the power-of-two region adds past `max_ctx`
/// are never handed out, after frees, a reset or a reconnect either.
#[test]
fn doorbell_pages_are_below_max_ctx() {
    // 5 contexts: the region is 8 pages long (a power of two).
    const MAX_CTX: u32 = 5;
    let d = TestDaemon::with_limits(
        1,
        Limits {
            max_ctx: MAX_CTX,
            ..Limits::default()
        },
    )
    .unwrap();
    let shmem = VmmOptions {
        shmem: true,
        ..VmmOptions::default()
    };
    let fill = |v: &mut Verbs<'_>, when: &str| -> Vec<(u32, u32)> {
        let ctxs: Vec<(u32, u32)> = (0..MAX_CTX)
            .map(|_| {
                let c = v.create_ctx_full().unwrap();
                (c.ctx_handle, c.doorbell_page)
            })
            .collect();
        let mut pages: Vec<u32> = ctxs.iter().map(|c| c.1).collect();
        assert!(
            pages.iter().all(|&p| p < MAX_CTX),
            "{when}: pages {pages:?}, max_ctx {MAX_CTX}"
        );
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), MAX_CTX as usize, "{when}: pages not distinct");
        assert_eq!(
            status_of(&v.create_ctx_full()),
            Some((Status::QUOTA, 1)),
            "{when}: context max_ctx + 1"
        );
        ctxs
    };
    for round in ["first connection", "reconnect"] {
        let mut vmm = d.connect_with(0, shmem.clone()).unwrap();
        if round == "reconnect" {
            // The pages of the closed connection are quarantined until the
            // driver resets the device (spec 15.2).
            vmm.reset().unwrap();
        }
        let w = vmm.shmem_window().cloned().unwrap();
        assert!(w.len() as u64 > u64::from(MAX_CTX) * DB_PAGE_SIZE);
        let mut v = Verbs::new(&mut vmm);
        let ctxs = fill(&mut v, round);
        // Free every other context and fill up again.
        for c in ctxs.iter().step_by(2) {
            v.destroy_ctx(c.0).unwrap();
        }
        for _ in ctxs.iter().step_by(2) {
            let c = v.create_ctx_full().unwrap();
            assert!(c.doorbell_page < MAX_CTX, "{round}, refill: {c:?}");
        }
        vmm.reset().unwrap();
        let mut v = Verbs::new(&mut vmm);
        fill(&mut v, &format!("{round}, after a reset"));
        drop(vmm);
        d.wait_released(0);
    }
}

/// Spec 18.13: the GRH in front of a UD message is the IPv6 header RoCEv2
/// would have had (version 6, the AH's traffic class, flow label and hop
/// limit, the payload length, next header UDP, the GIDs), so that what
/// `ibv_create_ah_from_wc()` does — an AH towards the GRH's source, from the
/// GID table entry of its destination — answers the sender.
#[test]
fn ud_grh_is_an_ipv6_header() {
    let (_d, a, b) = two_vms();
    let (cqa, cqb) = (
        Cq::create(&a.dev, 64).unwrap(),
        Cq::create(&b.dev, 64).unwrap(),
    );
    let (qa, qb) = (ud_qp(&a, &cqa, 64), ud_qp(&b, &cqb, 64));
    let (ba, bb) = (Buf::new(&a, 8192), Buf::new(&b, 8192));
    let cases = [
        // traffic class, flow label, hop limit, length, immediate
        (0xa5u8, 0x1_2345u32, 7u8, 13usize, Some(0x55u32)),
        (0, 0, 64, 100, None),
        (0xff, 0xf_ffff, 255, 4096, None),
    ];
    for (i, &(tc, flow, hops, len, imm)) in cases.iter().enumerate() {
        let ah = Ah::create(
            &a.pd,
            &AddressVector {
                dgid: b.dev.gid(),
                flow_label: flow,
                sgid_index: a.dev.gid_index(),
                hop_limit: hops,
                traffic_class: tc,
                ..AddressVector::default()
            },
        )
        .unwrap();
        bb.write(0, &[0xEE; 8192]);
        // The GRH's first eight bytes straddle two SGEs.
        qb.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[bb.sge(0, 3), bb.sge(3, 8189)],
        }])
        .unwrap();
        let data = pattern(len, i as u64);
        ba.write(0, &data);
        let sg = [ba.sge(0, len)];
        let op = match imm {
            Some(imm) => SendOp::SendWithImm { imm },
            None => SendOp::Send,
        };
        let mut w = wr(10 + i as u64, op, &sg);
        w.ud = Some(UdDest {
            ah: &ah,
            remote_qpn: qb.qpn(),
            remote_qkey: QKEY,
        });
        qa.post_send(&[w]).unwrap();
        ok(&poll_one(&cqa), 10 + i as u64, WcOpcode::SEND);
        let r = poll_one(&cqb);
        ok(&r, i as u64, WcOpcode::RECV);
        assert!(r.has_grh());
        assert_eq!(r.byte_len as usize, UD_GRH_SIZE as usize + len);
        let raw: [u8; UD_GRH_SIZE as usize] = bb.read(0, 40).try_into().unwrap();
        // What libibverbs looks at first: the version nibble and next header.
        assert_eq!(raw[0] >> 4, 6, "case {i}: {raw:02x?}");
        assert_eq!(raw[6], 17, "case {i}: {raw:02x?}");
        assert_eq!(guessed_ip_version(&raw), Some(6), "case {i}: {raw:02x?}");
        let grh = UdGrh::parse(&raw).unwrap();
        let padded = len.next_multiple_of(4) as u16;
        let want = UdGrh {
            traffic_class: tc,
            flow_label: flow,
            payload_length: 28 + if imm.is_some() { 4 } else { 0 } + padded + 4,
            hop_limit: hops,
            sgid: a.dev.gid(),
            dgid: b.dev.gid(),
        };
        assert_eq!(grh, want, "case {i}");
        assert_eq!(bb.read(40, len), data);

        // The reply, as ibv_create_ah_from_wc() builds it: towards the
        // GRH's source GID, from B's GID table entry equal to its
        // destination GID, with its hop limit and traffic class.
        let sgid_index = (0..b.dev.port_attr().gid_tbl_len)
            .find(|&k| b.dev.query_gid(k).unwrap() == grh.dgid)
            .expect("the GRH's destination GID is in the receiver's table");
        let back = Ah::create(
            &b.pd,
            &AddressVector {
                dgid: grh.sgid,
                flow_label: grh.flow_label,
                sgid_index: u8::try_from(sgid_index).unwrap(),
                hop_limit: grh.hop_limit,
                traffic_class: grh.traffic_class,
                sl: 0,
            },
        )
        .unwrap();
        qa.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &[ba.sge(4096, 4096)],
        }])
        .unwrap();
        let sg = [bb.sge(40, 8)];
        let mut w = wr(200 + i as u64, SendOp::Send, &sg);
        w.ud = Some(UdDest {
            ah: &back,
            remote_qpn: r.src_qpn,
            remote_qkey: QKEY,
        });
        qb.post_send(&[w]).unwrap();
        ok(&poll_one(&cqb), 200 + i as u64, WcOpcode::SEND);
        let r = poll_one(&cqa);
        ok(&r, 100 + i as u64, WcOpcode::RECV);
        assert_eq!(r.src_qpn, qb.qpn());
        let raw: [u8; UD_GRH_SIZE as usize] = ba.read(4096, 40).try_into().unwrap();
        let grh = UdGrh::parse(&raw).unwrap();
        assert_eq!((grh.sgid, grh.dgid), (b.dev.gid(), a.dev.gid()));
        assert_eq!((grh.traffic_class, grh.hop_limit), (tc, hops));
        assert_eq!(ba.read(4096 + 40, 8), data[..8].to_vec());
    }
}

/// How libibverbs (rdma-core's `ibv_init_ah_from_wc()`) decides which IP
/// header a GRH holds: without the IPv6 version nibble, an IPv4 header at
/// bytes 20..40 if its version nibble is 4; with it, still IPv4 if bytes
/// 20..40 have an IPv4 header length of 5 and a valid IPv4 checksum, else
/// IPv6. `None`: neither (the call fails).
fn guessed_ip_version(grh: &[u8; 40]) -> Option<u8> {
    let v4 = &grh[20..];
    if grh[0] >> 4 != 6 {
        return (v4[0] >> 4 == 4).then_some(4);
    }
    if v4[0] & 0x0f != 5 {
        return Some(6);
    }
    // One's complement sum of the ten 16-bit words, checksum included: a
    // valid header sums to 0xffff.
    let sum: u32 = v4
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    Some(if (folded & 0xffff) + (folded >> 16) == 0xffff {
        4
    } else {
        6
    })
}
