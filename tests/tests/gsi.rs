#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! ABI version 3's GSI QP and GID table (spec 18.26, appendix A), through
//! the real vhost-user socket with the reference driver: QP 1 in every VM,
//! MADs between the VMs of a tenant with their GRH, the limits of a MAD,
//! the GSI's Q_Key, the default GID and the source GID index; a VM of
//! `abi = 2`; and what a hostile guest can do with MADs (flood, other
//! tenants, forged sources, another context's QP 1).

use std::sync::Arc;
use std::time::Instant;

use vhost_user_rdma::config::{parse_mac, DaemonConfig};
use vhost_user_rdma_tests::dp::{
    ah, assert_quiet, failed, ok, open, poll_n, poll_one, status, wait_state, Buf, Vm, GUARD, QKEY,
};
use vhost_user_rdma_tests::harness::{add_tenant, TestDaemon};
use vhost_user_rdma_tests::verbs::{status_of, QpInit as RawQpInit, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{F_GSI, F_UD, V2_DEVICE_FEATURES};
use virtio_rdma_abi::ctrl::{Status, DETAIL_NONE};
use virtio_rdma_abi::datapath::{UdGrh, WcOpcode, WcStatus, UD_GRH_SIZE};
use virtio_rdma_abi::qp::{
    attr, AddressVector, QpAttr, QpState, QpType, GSI_QKEY, GSI_QPN, MAX_MAD_BYTES,
};
use virtio_rdma_driver::{
    Ah, Cq, Pd, Qp, QpAttrs, QpCap, QpInit, RecvWr, SendOp, SendWr, UdDest, WorkCompletion,
};

/// Bytes of a receive buffer for one MAD: the GRH and the MAD.
const SLOT: usize = UD_GRH_SIZE as usize + MAX_MAD_BYTES as usize;
/// The most a GSI QP's queues hold.
const DEPTH: u32 = 256;

fn gid(text: &str) -> [u8; 16] {
    text.parse::<std::net::Ipv6Addr>().unwrap().octets()
}

/// A VM's GSI QP in RTS, its CQs, a receive buffer of `recvs` slots (all
/// posted) and a send buffer.
struct Gsi {
    scq: Arc<Cq>,
    rcq: Arc<Cq>,
    qp: Qp,
    rbuf: Buf,
    sbuf: Buf,
}

impl Gsi {
    fn new(vm: &Vm, recvs: usize) -> Gsi {
        Self::on(vm, &vm.pd, recvs)
    }

    fn on(vm: &Vm, pd: &Arc<Pd>, recvs: usize) -> Gsi {
        let scq = Cq::create(&vm.dev, 512).unwrap();
        let rcq = Cq::create(&vm.dev, 512).unwrap();
        let qp = Qp::create(
            pd,
            &QpInit {
                recv_cq: rcq.clone(),
                cap: QpCap {
                    max_send_wr: DEPTH,
                    max_recv_wr: DEPTH,
                    ..QpCap::default()
                },
                ..QpInit::gsi(&scq)
            },
        )
        .unwrap();
        assert_eq!(qp.qpn(), GSI_QPN, "the GSI QP is QP 1");
        qp.gsi_activate().unwrap();
        let rbuf = Buf::guarded(vm, SLOT * recvs.max(1));
        let g = Gsi {
            scq,
            rcq,
            qp,
            rbuf,
            sbuf: Buf::new(vm, 4096),
        };
        for i in 0..recvs {
            g.recv(i);
        }
        g
    }

    /// Posts receive slot `i`.
    fn recv(&self, i: usize) {
        self.qp
            .post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: &[self.rbuf.sge(i * SLOT, SLOT)],
            }])
            .unwrap();
    }

    /// Posts a MAD of `data` (signaled, `wr_id`) through `ah` to QP
    /// `remote_qpn`.
    fn send_to(&self, ah: &Ah, wr_id: u64, data: &[u8], remote_qpn: u32) {
        self.sbuf.write(0, data);
        let sg = [self.sbuf.sge(0, data.len())];
        let mut w = SendWr::send(wr_id, &sg);
        w.ud = Some(UdDest {
            remote_qpn,
            ..UdDest::gsi(ah)
        });
        self.qp.post_send(&[w]).unwrap();
    }

    /// Posts a MAD to QP 1.
    fn send(&self, ah: &Ah, wr_id: u64, data: &[u8]) {
        self.send_to(ah, wr_id, data, GSI_QPN);
    }

    /// The GRH and the MAD of receive slot `i` that took `len` MAD bytes.
    fn received(&self, i: usize, len: usize) -> (UdGrh, Vec<u8>) {
        let raw: [u8; UD_GRH_SIZE as usize] = self.rbuf.read(i * SLOT, 40).try_into().unwrap();
        (
            UdGrh::parse(&raw).unwrap(),
            self.rbuf.read(i * SLOT + 40, len),
        )
    }
}

/// A MAD receive completion of `wr_id` with `len` MAD bytes, on QP 1 from
/// QP 1, behind a GRH.
fn mad_received(wc: &WorkCompletion, wr_id: u64, len: usize) {
    ok(wc, wr_id, WcOpcode::RECV);
    assert!(wc.has_grh(), "{wc:?}");
    assert_eq!(
        (wc.byte_len as usize, wc.qpn, wc.src_qpn),
        (UD_GRH_SIZE as usize + len, GSI_QPN, GSI_QPN),
        "{wc:?}"
    );
}

/// A 256-byte MAD whose bytes name `seed`.
fn mad(seed: u8) -> Vec<u8> {
    (0..MAX_MAD_BYTES as usize)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

/// A daemon of `n` VMs of one tenant after `configure`.
fn daemon(n: usize, configure: impl FnOnce(&mut DaemonConfig)) -> TestDaemon {
    TestDaemon::with_config(n, configure).unwrap()
}

// ---------------------------------------------------------------------------
// The GSI QP

/// Every VM has its own QP 1; a second GSI QP in the same VM — in the same
/// PD or another context's — is BUSY (detail 4); once destroyed, or with
/// its context, QP 1 can be created again. Its queues hold at most 256
/// WQEs; no other QP ever gets number 1.
#[test]
fn every_vm_has_one_qp_1() {
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    assert_ne!(a.dev.features() & F_GSI, 0, "F_GSI negotiated");
    let cq = Cq::create(&a.dev, 16).unwrap();
    let mut deep = QpInit::gsi(&cq);
    deep.cap.max_send_wr = 512;
    assert_eq!(status(Qp::create(&a.pd, &deep)), (Status::RANGE, 24));
    deep.cap.max_send_wr = 16;
    deep.cap.max_recv_wr = 512;
    assert_eq!(status(Qp::create(&a.pd, &deep)), (Status::RANGE, 28));
    let ga = Gsi::new(&a, 0);
    let gb = Gsi::new(&b, 0);
    assert_eq!((ga.qp.qpn(), gb.qp.qpn()), (1, 1));
    let q = ga.qp.query().unwrap();
    assert_eq!((q.qp_type, q.qpn), (QpType::GSI as u32, 1));
    assert_eq!(
        (q.attr.qkey, q.attr.qp_state),
        (GSI_QKEY, QpState::RTS as u32)
    );
    assert_eq!(
        status(Qp::create(&a.pd, &QpInit::gsi(&cq))),
        (Status::BUSY, 4)
    );
    // Another context of the same VM (another process of the guest).
    let other = virtio_rdma_driver::Device::open(a.t.clone()).unwrap();
    let other_pd = Pd::alloc(&other).unwrap();
    let other_cq = Cq::create(&other, 16).unwrap();
    assert_eq!(
        status(Qp::create(&other_pd, &QpInit::gsi(&other_cq))),
        (Status::BUSY, 4)
    );
    // Ordinary QPs are never QP 1 (nor 0).
    let many: Vec<Qp> = (0..64)
        .map(|_| Qp::create(&a.pd, &QpInit::ud(&cq)).unwrap())
        .collect();
    assert!(many.iter().all(|q| q.qpn() > 1));
    drop(many);
    // Destroyed, it can be created again, in the other context.
    ga.qp.destroy().unwrap();
    let again = Qp::create(&other_pd, &QpInit::gsi(&other_cq)).unwrap();
    assert_eq!(again.qpn(), 1);
    // Its context's DESTROY_CTX destroys it (the process's handles are
    // left behind, as a crashed process leaves them).
    let ctx = other.ctx_handle();
    std::mem::forget((again, other_cq, other_pd, other));
    {
        let mut vmm = a.t.vmm();
        Verbs::new(&mut vmm).destroy_ctx(ctx).unwrap();
    }
    let q = Qp::create(&a.pd, &QpInit::gsi(&cq)).unwrap();
    assert_eq!(q.qpn(), 1);
    assert_eq!(d.stats(0).device.resources.qp, 1);
}

/// A 256-byte MAD each way between two VMs of a tenant: it arrives behind
/// a GRH whose source GID is the sender's table entry its AH names and
/// whose destination is the receiver's GID, on QP 1 from QP 1; the
/// sender completes `SEND`. `remote_qkey` is ignored.
#[test]
fn mads_go_between_qp_1_of_two_vms() {
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let (ga, gb) = (Gsi::new(&a, 4), Gsi::new(&b, 4));
    let (to_b, to_a) = (ah(&a, b.dev.gid()).unwrap(), ah(&b, a.dev.gid()).unwrap());
    // A's MAD with a Q_Key that is not the GSI's: the device sends the GSI's.
    ga.sbuf.write(0, &mad(1));
    let sg = [ga.sbuf.sge(0, MAX_MAD_BYTES as usize)];
    let mut w = SendWr::send(10, &sg);
    w.ud = Some(UdDest {
        ah: &to_b,
        remote_qpn: GSI_QPN,
        remote_qkey: QKEY,
    });
    ga.qp.post_send(&[w]).unwrap();
    ok(&poll_one(&ga.scq), 10, WcOpcode::SEND);
    mad_received(&poll_one(&gb.rcq), 0, 256);
    let (grh, data) = gb.received(0, 256);
    assert_eq!((grh.sgid, grh.dgid), (a.dev.gid(), b.dev.gid()));
    assert_eq!(grh.hop_limit, 64);
    assert_eq!(data, mad(1));
    // And back, with the immediate.
    gb.sbuf.write(0, &mad(2));
    let sg = [gb.sbuf.sge(0, 256)];
    let mut w = SendWr::signaled(11, SendOp::SendWithImm { imm: 0x1234 }, &sg);
    w.ud = Some(UdDest::gsi(&to_a));
    gb.qp.post_send(&[w]).unwrap();
    ok(&poll_one(&gb.scq), 11, WcOpcode::SEND);
    let wc = poll_one(&ga.rcq);
    mad_received(&wc, 0, 256);
    assert_eq!(wc.imm(), Some(0x1234));
    let (grh, data) = ga.received(0, 256);
    assert_eq!((grh.sgid, grh.dgid), (b.dev.gid(), a.dev.gid()));
    assert_eq!(data, mad(2));
    // A MAD to the VM's own GID reaches its own QP 1.
    let to_self = ah(&a, a.dev.gid()).unwrap();
    ga.send(&to_self, 12, &mad(3));
    ok(&poll_one(&ga.scq), 12, WcOpcode::SEND);
    mad_received(&poll_one(&ga.rcq), 1, 256);
    assert_eq!(ga.received(1, 256).1, mad(3));
    assert_eq!((d.traffic(0).mad_dropped, d.traffic(1).mad_dropped), (0, 0));
}

/// A MAD longer than 256 bytes fails with `LOC_LEN_ERR`; a GSI send to a
/// QP other than 1 is malformed (`LOC_QP_OP_ERR`); either way nothing
/// arrives and the GSI QP is in ERR. (A UD QP's send to QP 1 stays
/// malformed too.)
#[test]
fn a_mad_is_at_most_256_bytes_to_qp_1() {
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let gb = Gsi::new(&b, 4);
    for (wr_id, len, qpn, want) in [
        (1, 257, GSI_QPN, WcStatus::LOC_LEN_ERR),
        (2, 256, 2, WcStatus::LOC_QP_OP_ERR),
        (3, 64, 0x12345, WcStatus::LOC_QP_OP_ERR),
    ] {
        let ga = Gsi::new(&a, 0);
        let to_b = ah(&a, b.dev.gid()).unwrap();
        ga.send_to(&to_b, wr_id, &vec![0x5a; len], qpn);
        failed(&poll_one(&ga.scq), wr_id, want);
        wait_state(&ga.qp, QpState::ERR);
        ga.qp.destroy().unwrap();
    }
    assert_quiet(&gb.rcq);
    gb.rbuf.assert_untouched(0, 4 * SLOT, "B's MAD buffers");
    // A UD QP cannot address QP 1.
    let cq = Cq::create(&a.dev, 16).unwrap();
    let ud = vhost_user_rdma_tests::dp::ud_qp(&a, &cq, 4);
    let to_b = ah(&a, b.dev.gid()).unwrap();
    let src = Buf::new(&a, 64);
    let sg = [src.sge(0, 64)];
    let mut w = SendWr::send(4, &sg);
    w.ud = Some(UdDest::gsi(&to_b));
    ud.post_send(&[w]).unwrap();
    failed(&poll_one(&cq), 4, WcStatus::LOC_QP_OP_ERR);
    assert_quiet(&gb.rcq);
    // The largest MAD still passes.
    let ga = Gsi::new(&a, 0);
    ga.send(&to_b, 5, &mad(5));
    ok(&poll_one(&ga.scq), 5, WcOpcode::SEND);
    mad_received(&poll_one(&gb.rcq), 0, 256);
}

/// The GSI QP has the GSI's Q_Key and no other (`INVALID` at the offset
/// of `qkey`, 28); no other QP may have a privileged Q_Key (`DENIED`,
/// counted `privileged`, spec 12.13).
#[test]
fn only_the_gsi_qp_has_the_gsi_qkey() {
    let d = daemon(1, |_| {});
    let a = open(&d, 0);
    let cq = Cq::create(&a.dev, 16).unwrap();
    let gsi = Qp::create(&a.pd, &QpInit::gsi(&cq)).unwrap();
    let init = |qkey| QpAttrs {
        state: Some(QpState::INIT),
        pkey_index: Some(0),
        port: Some(1),
        qkey: Some(qkey),
        ..QpAttrs::default()
    };
    for qkey in [0, QKEY, 0x8000_0000, GSI_QKEY + 1] {
        assert_eq!(
            status(gsi.modify(&init(qkey))),
            (Status::INVALID, 28),
            "{qkey:#x}"
        );
    }
    assert_eq!(gsi.query().unwrap().attr.qp_state, QpState::RESET as u32);
    gsi.modify(&init(GSI_QKEY)).unwrap();
    let ud = Qp::create(&a.pd, &QpInit::ud(&cq)).unwrap();
    assert_eq!(
        status(ud.modify(&init(GSI_QKEY))),
        (Status::DENIED, DETAIL_NONE)
    );
    assert_eq!(d.isolation(0).privileged, 1);
    ud.modify(&init(QKEY)).unwrap();
    // Nor later: the GSI QP keeps its Q_Key in every state.
    gsi.modify(&QpAttrs::state(QpState::RTR)).unwrap();
    let rts = QpAttrs {
        state: Some(QpState::RTS),
        sq_psn: Some(0),
        qkey: Some(0x1111),
        ..QpAttrs::default()
    };
    assert_eq!(status(gsi.modify(&rts)), (Status::INVALID, 28));
}

/// Without `F_GSI` negotiated, `qp_type` GSI is UNSUPPORTED (detail 4).
#[test]
fn without_f_gsi_the_gsi_qp_is_unsupported() {
    let d = daemon(1, |_| {});
    let opts = VmmOptions {
        driver_features: virtio_rdma_abi::config::ALL_DEVICE_FEATURES & !F_GSI,
        ..VmmOptions::default()
    };
    let mut vmm = d.connect_with(0, opts).unwrap();
    let mut v = Verbs::new(&mut vmm);
    let (_, pd, cq) = v.ctx_pd_cq(16).unwrap();
    let r = v.create_qp(&RawQpInit::gsi(pd, cq));
    assert_eq!(status_of(&r), Some((Status::UNSUPPORTED, 4)));
}

// ---------------------------------------------------------------------------
// The GID table

/// Index 0 is the default GID of the VM's MAC; the operator's GIDs follow,
/// IPv4-mapped first. A MAD goes to the VM with the destination GID at any
/// index, and its GRH source is the entry the AH's `sgid_index` names:
/// index 1 and 2 of two operator GIDs give two sources, index 0 the
/// link-local default GID; an unassigned index is refused (`INVALID` at
/// offset 28).
#[test]
fn the_source_gid_is_the_entry_sgid_index_names() {
    let d = daemon(2, |c| {
        c.vms[0].mac = Some(parse_mac("52:54:00:12:34:56").unwrap());
        c.vms[0].gids = vec![gid("fd00::a"), gid("::ffff:10.7.0.1")];
        c.vms[1].mac = Some(parse_mac("52:54:00:12:34:57").unwrap());
    });
    let (a, b) = (open(&d, 0), open(&d, 1));
    let table = a.dev.gid_table().unwrap();
    assert_eq!(table.len(), 16);
    assert_eq!(table[0], gid("fe80::5054:ff:fe12:3456"));
    assert_eq!(table[1], gid("::ffff:10.7.0.1"));
    assert_eq!(table[2], gid("fd00::a"));
    assert!(table[3..].iter().all(|g| *g == [0; 16]));
    assert_eq!((a.dev.gid_index(), a.dev.gid()), (1, table[1]));
    let b_default = gid("fe80::5054:ff:fe12:3457");
    assert_eq!(b.dev.gid_table().unwrap()[0], b_default);

    let ga = Gsi::new(&a, 0);
    let gb = Gsi::new(&b, 8);
    let from = |index: u8, dgid: [u8; 16]| {
        Ah::create(
            &a.pd,
            &AddressVector {
                sgid_index: index,
                ..a.dev.av(dgid)
            },
        )
    };
    let cases = [
        (1, b.dev.gid(), table[1]),
        (2, b.dev.gid(), table[2]),
        (0, b.dev.gid(), table[0]),
        // To B's default GID: any entry of B's table is B.
        (2, b_default, table[2]),
    ];
    for (slot, &(index, dgid, sgid)) in cases.iter().enumerate() {
        let ah = from(index, dgid).unwrap();
        ga.send(&ah, slot as u64, &mad(slot as u8));
        ok(&poll_one(&ga.scq), slot as u64, WcOpcode::SEND);
        mad_received(&poll_one(&gb.rcq), slot as u64, 256);
        let (grh, data) = gb.received(slot, 256);
        assert_eq!((grh.sgid, grh.dgid), (sgid, dgid), "sgid_index {index}");
        assert_eq!(data, mad(slot as u8));
    }
    // Unassigned (3), past the table (16): refused, counted.
    assert_eq!(status(from(3, b.dev.gid())), (Status::INVALID, 28));
    assert_eq!(status(from(16, b.dev.gid())), (Status::RANGE, 28));
    assert_eq!(d.isolation(0).gid_spoof, 2);
}

/// A VM of `abi = 2` sees ABI version 2: no version-3 feature bit, the
/// version-2 GID table (its one GID at index 0, `gid_tbl_len` 1), and the
/// GSI QP type refused; it still talks UD with a version-3 VM of its
/// tenant, each addressing the other's GID.
#[test]
fn an_abi_2_vm_sees_version_2() {
    let d = daemon(2, |c| {
        c.vms[1].abi = 2;
        c.vms[1].mac = Some(parse_mac("52:54:00:00:00:02").unwrap());
    });
    let mut vmm = d.connect(1).unwrap();
    let cfg = vmm.config().unwrap();
    assert_eq!(cfg.abi_version, 2);
    let offered = vmm.device_features() & 0xff_ffff;
    assert_eq!(offered & !V2_DEVICE_FEATURES, 0, "{offered:#x}");
    assert_ne!(offered & F_UD, 0);
    let mut v = Verbs::new(&mut vmm);
    assert_eq!(v.query_port(1).unwrap().gid_tbl_len, 1);
    let own = vhost_user_rdma::config::default_gid(1);
    assert_eq!(v.query_gid(1, 0).unwrap().gid, own);
    assert_eq!(status_of(&v.query_gid(1, 1)), Some((Status::RANGE, 4)));
    let (_, pd, cq) = v.ctx_pd_cq(16).unwrap();
    let r = v.create_qp(&RawQpInit::gsi(pd, cq));
    assert_eq!(status_of(&r), Some((Status::UNSUPPORTED, 4)));
    drop(v);
    drop(vmm);
    d.wait_released(1);

    let (a, b) = (open(&d, 0), open(&d, 1));
    assert_eq!((b.dev.gid_index(), b.dev.gid()), (0, own));
    assert_eq!(b.dev.features() & F_GSI, 0);
    let p = vhost_user_rdma_tests::dp::ud_pair(&a, &b);
    let back = ah(&b, a.dev.gid()).unwrap();
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    for (q, buf, wr_id) in [(&p.qa, &ba, 1), (&p.qb, &bb, 2)] {
        q.post_recv(&[RecvWr {
            wr_id,
            sg_list: &[buf.sge(0, 4096)],
        }])
        .unwrap();
    }
    let sa = Buf::new(&a, 64);
    let sg = [sa.sge(0, 64)];
    let send = |q: &Qp, ah: &Ah, to: &Qp, wr_id| {
        let mut w = SendWr::send(wr_id, &sg);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: to.qpn(),
            remote_qkey: QKEY,
        });
        q.post_send(&[w]).unwrap();
    };
    send(&p.qa, &p.ah, &p.qb, 10);
    ok(&poll_one(&p.cqa), 10, WcOpcode::SEND);
    ok(&poll_one(&p.cqb), 2, WcOpcode::RECV);
    let raw: [u8; 40] = bb.read(0, 40).try_into().unwrap();
    assert_eq!(UdGrh::parse(&raw).unwrap().sgid, a.dev.gid());
    let sgb = [bb.sge(40, 64)];
    let mut w = SendWr::send(11, &sgb);
    w.ud = Some(UdDest {
        ah: &back,
        remote_qpn: p.qa.qpn(),
        remote_qkey: QKEY,
    });
    p.qb.post_send(&[w]).unwrap();
    ok(&poll_one(&p.cqb), 11, WcOpcode::SEND);
    ok(&poll_one(&p.cqa), 1, WcOpcode::RECV);
    let raw: [u8; 40] = ba.read(0, 40).try_into().unwrap();
    assert_eq!(UdGrh::parse(&raw).unwrap().sgid, own);
}

// ---------------------------------------------------------------------------
// Hostile guests

/// A VM flooding MADs is held to its MAD rate (`mad_per_sec` 10, bursts
/// of 64): what passes fits the burst plus the rate over the flood's
/// time, the rest is dropped and counted, every work request completes
/// `SUCCESS`; another VM's MADs to the same victim still all get through.
#[test]
fn a_mad_flood_is_held_to_the_mad_rate() {
    const FLOOD: u64 = 400;
    let d = daemon(3, |c| c.vms[0].limits.mad_per_sec = 10);
    let (a, b, c) = (open(&d, 0), open(&d, 1), open(&d, 2));
    let (ga, gb, gc) = (
        Gsi::new(&a, 0),
        Gsi::new(&b, DEPTH as usize),
        Gsi::new(&c, 0),
    );
    let to_b = ah(&a, b.dev.gid()).unwrap();
    let start = Instant::now();
    ga.sbuf.write(0, &mad(9));
    let sg = [ga.sbuf.sge(0, 256)];
    let mut done = 0u64;
    let mut posted = 0u64;
    while done < FLOOD {
        // Keep the send queue full.
        while posted < FLOOD && posted - done < u64::from(DEPTH) {
            let mut w = SendWr::send(posted, &sg);
            w.ud = Some(UdDest::gsi(&to_b));
            ga.qp.post_send(&[w]).unwrap();
            posted += 1;
        }
        for wc in poll_n(&ga.scq, 1) {
            ok(&wc, wc.wr_id, WcOpcode::SEND);
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // The engine delivers a MAD before it completes its work request.
    let delivered = d.traffic(1).recv_ops;
    let bound = 64 + (10.0 * secs).ceil() as u64 + 1;
    assert!(
        (64..=bound).contains(&delivered),
        "{delivered} MADs passed in {secs:.3} s (at most {bound})"
    );
    let t = d.traffic(0);
    assert_eq!(t.mad_dropped, FLOOD - delivered, "{t:?}");
    assert!(t.drops >= t.mad_dropped, "{t:?}");
    let received = poll_n(&gb.rcq, delivered as usize);
    assert!(received.iter().all(|wc| wc.is_success() && wc.src_qpn == 1));
    assert_quiet(&gb.rcq);
    // The victim still hears from the others: C's five MADs all arrive.
    let c_to_b = ah(&c, b.dev.gid()).unwrap();
    for i in 0..5 {
        gc.send(&c_to_b, i, &mad(0x40 + i as u8));
        ok(&poll_one(&gc.scq), i, WcOpcode::SEND);
    }
    let from_c = poll_n(&gb.rcq, 5);
    for (i, wc) in from_c.iter().enumerate() {
        mad_received(wc, delivered + i as u64, 256);
        let (grh, data) = gb.received(wc.wr_id as usize, 256);
        assert_eq!((grh.sgid, data), (c.dev.gid(), mad(0x40 + i as u8)));
    }
    assert_eq!(d.traffic(2).mad_dropped, 0);
}

/// MADs stay inside the tenant network: an AH for another tenant's GID is
/// refused (`DENIED`, counted `denied`), so the only MADs a VM can send go
/// to its own tenant — red's MADs reach red, never the default tenant's
/// QP 1 with the same number. (The data path drops and counts a MAD to a
/// foreign GID too: `rnic::soft::mad`'s unit test, since no guest can
/// build such an AH.)
#[test]
fn mads_to_another_tenant_go_nowhere() {
    let d = daemon(4, |c| {
        add_tenant(c, "red", &[2, 3]);
    });
    let (a, b, red, red2) = (open(&d, 0), open(&d, 1), open(&d, 2), open(&d, 3));
    let (gb, gred) = (Gsi::new(&b, 4), Gsi::new(&red, 4));
    let gred2 = Gsi::new(&red2, 0);
    assert_eq!(
        status(ah(&red2, b.dev.gid())),
        (Status::DENIED, DETAIL_NONE)
    );
    assert_eq!(status(ah(&a, red.dev.gid())), (Status::DENIED, DETAIL_NONE));
    assert_eq!((d.isolation(3).denied, d.isolation(0).denied), (1, 1));
    let to_red = ah(&red2, red.dev.gid()).unwrap();
    gred2.send(&to_red, 1, &mad(1));
    ok(&poll_one(&gred2.scq), 1, WcOpcode::SEND);
    mad_received(&poll_one(&gred.rcq), 0, 256);
    assert_quiet(&gb.rcq);
    gb.rbuf
        .assert_untouched(0, 4 * SLOT, "the other tenant's MAD buffers");
}

/// A guest cannot send a MAD that claims another VM's GID: its AH names an
/// index of its own table, which holds only its GIDs; an index naming none
/// is refused; every MAD it sends shows one of its own GIDs.
#[test]
fn a_mad_cannot_claim_another_vms_gid() {
    let d = daemon(2, |c| {
        c.vms[0].gids = vec![gid("::ffff:10.9.0.1")];
    });
    let (a, b) = (open(&d, 0), open(&d, 1));
    let own: Vec<[u8; 16]> = a
        .dev
        .gid_table()
        .unwrap()
        .into_iter()
        .filter(|g| *g != [0; 16])
        .collect();
    assert_eq!(own, [gid("::ffff:10.9.0.1")]);
    let ga = Gsi::new(&a, 0);
    let gb = Gsi::new(&b, 1);
    let mut refused = 0;
    for index in 0..=u8::MAX {
        let av = AddressVector {
            sgid_index: index,
            ..a.dev.av(b.dev.gid())
        };
        match Ah::create(&a.pd, &av) {
            Ok(ah) => {
                assert_eq!(index, 1, "only the VM's own entry makes an AH");
                ga.send(&ah, 1, &mad(1));
                ok(&poll_one(&ga.scq), 1, WcOpcode::SEND);
                mad_received(&poll_one(&gb.rcq), 0, 256);
                let (grh, _) = gb.received(0, 256);
                assert_eq!(grh.sgid, own[0]);
            }
            Err(e) => {
                let (s, detail) = e.status().unwrap();
                assert!(matches!(s, Status::INVALID | Status::RANGE), "{e}");
                assert_eq!(detail, 28);
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 255);
    assert_eq!(d.isolation(0).gid_spoof, 255);
}

/// QP 1 is the VM's, not a context's: a process's AH of another PD does
/// not serve the GSI QP (`LOC_QP_OP_ERR`); another context's QP handle is
/// no handle here; a MAD reaches the GSI QP whatever context made it.
#[test]
fn the_gsi_qp_of_another_context() {
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    // B's GSI QP belongs to a second context (another process of B).
    let dev2 = virtio_rdma_driver::Device::open(b.t.clone()).unwrap();
    let pd2 = Pd::alloc(&dev2).unwrap();
    let vm2 = Vm {
        t: b.t.clone(),
        dev: dev2.clone(),
        pd: pd2.clone(),
    };
    let gb = Gsi::on(&vm2, &pd2, 2);
    // A sends to B's GID: B's QP 1, of whichever context, takes it.
    let ga = Gsi::new(&a, 0);
    let to_b = ah(&a, b.dev.gid()).unwrap();
    ga.send(&to_b, 1, &mad(1));
    ok(&poll_one(&ga.scq), 1, WcOpcode::SEND);
    mad_received(&poll_one(&gb.rcq), 0, 256);
    // B's first context cannot send on it with an AH of its own PD.
    let other_pd_ah = ah(&b, a.dev.gid()).unwrap();
    gb.sbuf.write(0, &mad(2));
    let sg = [gb.sbuf.sge(0, 256)];
    let mut w = SendWr::send(2, &sg);
    w.ud = Some(UdDest::gsi(&other_pd_ah));
    let r = gb.qp.post_send(&[w]);
    assert!(r.is_err(), "the driver refuses an AH of another PD");
    // (The device refuses such a WQE too: `datapath_multi`'s `gsi_wqes`.)
    // The first context sees the QP by its handle (handles are the VM's),
    // cannot make a second one, nor give it another Q_Key.
    let mut vmm = b.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let q = v.query_qp(gb.qp.handle()).unwrap();
    assert_eq!(q.qpn, 1);
    let cq = v.create_cq(b.dev.ctx_handle(), 16).unwrap();
    let second = v.create_qp(&RawQpInit::gsi(b.pd.handle(), cq));
    assert_eq!(status_of(&second), Some((Status::BUSY, 4)));
    let mask = attr::QKEY;
    let r = v.modify_qp(
        gb.qp.handle(),
        mask,
        &QpAttr {
            qkey: 5,
            ..QpAttr::default()
        },
    );
    assert_eq!(status_of(&r), Some((Status::INVALID, 28)));
    v.destroy_cq(cq).unwrap();
    drop(v);
    drop(vmm);
    assert_eq!(gb.rbuf.read(SLOT, 1), [GUARD]);
}

/// `rdma-peer cm-probe` between two VMs of one daemon (qemu-rxe runs it
/// across hosts, through the verbs transport's CM bridges): the server's
/// VM gets the client's REQ on QP 1 behind the client's GID and rejects
/// it; the client gets that REJ.
#[test]
fn the_cm_probe_between_two_vms() {
    use vhost_user_rdma_tests::cm_probe;
    use virtio_rdma_apps::oob::ChannelOob;
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    let (mut oa, mut ob) = ChannelOob::pair();
    let timeout = std::time::Duration::from_secs(20);
    std::thread::scope(|s| {
        let server =
            s.spawn(|| cm_probe::server(&b.dev, 7480, &mut ob, timeout).map_err(|e| e.to_string()));
        cm_probe::client(&a.dev, server_ip.into(), 7480, &mut oa, timeout).unwrap();
        server.join().unwrap().unwrap();
    });
    assert_eq!((d.traffic(0).mad_dropped, d.traffic(1).mad_dropped), (0, 0));
}

/// `rdma-peer rping-server` and `rping-client` between two VMs of one
/// daemon: the connection set up by the VMs' own CMs over QP 1 (REQ, REP,
/// RTU), rping's protocol over it with every ping's data compared, then
/// the client's DREQ answered.
#[test]
fn rping_over_the_vms_own_cm() {
    use virtio_rdma_apps::cm_agent::Timers;
    use virtio_rdma_apps::rping;
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    let opts = rping::Options {
        size: 100,
        count: 0,
        verify: true,
        timeout: std::time::Duration::from_secs(60),
        gid_index: None,
        timers: Default::default(),
    };
    std::thread::scope(|s| {
        let server = s.spawn(|| rping::server(&b.dev, 7174, &opts).map_err(|e| e.to_string()));
        let client_opts = rping::Options {
            count: 20,
            // Speaks from the same GID, named by its index.
            gid_index: Some(a.dev.gid_index()),
            timers: Timers {
                response_wait: std::time::Duration::from_millis(200),
                max_sends: 300,
            },
            ..opts.clone()
        };
        let pinged = rping::client(
            &a.dev,
            server_ip.into(),
            7174,
            &client_opts,
            std::time::Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(pinged, 20);
        assert_eq!(server.join().unwrap().unwrap(), 20);
    });
    // The client's first REQs may precede the server's QP 1 (dropped, sent
    // again); everything the server sent found the client's.
    assert_eq!(d.traffic(1).mad_dropped, 0);
}

/// A connection request for a port nobody listens on is rejected with
/// "invalid service ID", as rdma_cm's hosts do.
#[test]
fn a_request_for_a_port_nobody_listens_on_is_rejected() {
    use virtio_rdma_apps::cm_agent::{CmError, CmPort, ConnParam};
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut cm = CmPort::open(&b.dev).map_err(|e| e.to_string())?;
            let cq = Cq::create(&b.dev, 4).map_err(|e| e.to_string())?;
            let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).map_err(|e| e.to_string())?;
            // Listens on 7000; the client asks for 7001 first.
            cm.accept(
                &qp,
                7000,
                &ConnParam::default(),
                std::time::Duration::from_secs(60),
            )
            .map(|c| c.remote_qpn)
            .map_err(|e| e.to_string())
        });
        let mut cm = CmPort::open(&a.dev).unwrap();
        let cq = Cq::create(&a.dev, 4).unwrap();
        let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
        // Until the server's QP 1 exists, the REQ may go unanswered or be
        // refused; either way it is refused for this port.
        match cm.connect(&qp, server_ip.into(), 7001, &ConnParam::default()) {
            Err(CmError::Rejected { reason }) => assert_eq!(reason, 8),
            other => panic!("{other:?}"),
        }
        let qp2 = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
        let conn = cm
            .connect(&qp2, server_ip.into(), 7000, &ConnParam::default())
            .unwrap();
        assert_eq!(server.join().unwrap().unwrap(), qp2.qpn());
        assert_eq!(conn.peer_ip(), std::net::IpAddr::from(server_ip));
    });
}

/// A server that went away (its QP 1 destroyed): the client's REQ is sent
/// as often as its timers say, every send dropped by the RNIC for want of
/// a QP 1 there, and the connection attempt ends in a timeout.
#[test]
fn a_request_to_a_server_that_went_away_times_out() {
    use virtio_rdma_apps::cm_agent::{CmError, CmPort, ConnParam, Timers};
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    // The server had its CM up, then went away.
    drop(CmPort::open(&b.dev).unwrap());
    let mut cm = CmPort::open(&a.dev).unwrap();
    cm.set_timers(Timers {
        response_wait: std::time::Duration::from_millis(50),
        max_sends: 3,
    });
    let cq = Cq::create(&a.dev, 4).unwrap();
    let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
    match cm.connect(&qp, server_ip.into(), 7002, &ConnParam::default()) {
        Err(CmError::Timeout { what, sends }) => assert_eq!((what, sends), ("REQ", 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.traffic(0).mad_dropped, 3);
    // The QP was never connected: still usable for another attempt.
    assert_ne!(
        qp.query().unwrap().attr.qp_state,
        virtio_rdma_abi::qp::QpState::RTS as u32
    );
}

/// A hostile peer answers the REQ with an unparseable MAD, a REP in
/// another transaction, a REP for another communication ID and an RTU:
/// the client drops all four and takes the one REJ that names its REQ.
#[test]
fn the_cm_drops_answers_that_do_not_fit_its_req() {
    use ib_cm_wire::cm::which;
    use ib_cm_wire::{CmMessage, Rej, Rep, Rtu};
    use virtio_rdma_apps::cm_agent::{CmError, CmPort, ConnParam};
    use virtio_rdma_apps::gsi_port::{Gsi, Received};
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    let timeout = std::time::Duration::from_secs(60);
    let gsi = Gsi::open(&b.dev).unwrap();
    std::thread::scope(|s| {
        let bdev = &b.dev;
        let hostile = s.spawn(move || -> Result<(), String> {
            let e = |e: Box<dyn std::error::Error>| e.to_string();
            let got = gsi
                .receive_until(std::time::Instant::now() + timeout)
                .map_err(e)?;
            let Some(Received::Cm(grh, tid, CmMessage::Req(req))) = got else {
                return Err("expected a REQ".into());
            };
            let send = |m: &[u8]| gsi.send(bdev, grh.sgid, m, timeout).map_err(e);
            send(&[0xa5; 256])?;
            let rep = Rep {
                local_comm_id: 7,
                remote_comm_id: req.local_comm_id,
                local_qpn: 0x77,
                ..Rep::default()
            };
            send(
                &CmMessage::Rep(rep.clone())
                    .emit(tid ^ 1)
                    .map_err(|x| x.to_string())?,
            )?;
            let other = Rep {
                remote_comm_id: req.local_comm_id ^ 1,
                ..rep
            };
            send(&CmMessage::Rep(other).emit(tid).map_err(|x| x.to_string())?)?;
            let rtu = Rtu {
                local_comm_id: 7,
                remote_comm_id: req.local_comm_id,
                private_data: Vec::new(),
            };
            send(&CmMessage::Rtu(rtu).emit(tid).map_err(|x| x.to_string())?)?;
            let rej = Rej {
                local_comm_id: 7,
                remote_comm_id: req.local_comm_id,
                message_rejected: which::REQ,
                reason: 28,
                ari: Vec::new(),
                private_data: Vec::new(),
            };
            send(&CmMessage::Rej(rej).emit(tid).map_err(|x| x.to_string())?)
        });
        let mut cm = CmPort::open(&a.dev).unwrap();
        let cq = Cq::create(&a.dev, 4).unwrap();
        let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
        match cm.connect(&qp, server_ip.into(), 7003, &ConnParam::default()) {
            Err(CmError::Rejected { reason }) => assert_eq!(reason, 28),
            other => panic!("{other:?}"),
        }
        hostile.join().unwrap().unwrap();
        assert_eq!(cm.dropped(), 4);
    });
}

/// The REQ as Linux's `rdma_cm` expects it on RoCE (the TCP port space's
/// service ID, the `rdma_cm` header with both IPv4 addresses, the path's
/// GIDs, RC); an MRA for it lengthens the client's wait past its response
/// time (one send only, 50 ms, the REP half a second later); the QP is
/// connected with the REP's values and the RTU answers in the REQ's
/// transaction.
#[test]
fn the_req_is_rdma_cms_and_an_mra_lengthens_the_wait() {
    use ib_cm_wire::cm::{transport, which};
    use ib_cm_wire::cma::{self, CmaHeader};
    use ib_cm_wire::{CmMessage, Mra, Rep};
    use virtio_rdma_apps::cm_agent::{CmPort, ConnParam, Timers};
    use virtio_rdma_apps::gsi_port::{Gsi, Received};
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let v4 = |g: [u8; 16]| std::net::Ipv6Addr::from(g).to_ipv4_mapped().unwrap();
    let (client_ip, server_ip) = (v4(a.dev.gid()), v4(b.dev.gid()));
    let timeout = std::time::Duration::from_secs(60);
    let gsi = Gsi::open(&b.dev).unwrap();
    let bdev = &b.dev;
    let (adev_gid, bdev_gid) = (a.dev.gid(), b.dev.gid());
    std::thread::scope(|s| {
        let peer = s.spawn(move || -> Result<u32, String> {
            let e = |e: Box<dyn std::error::Error>| e.to_string();
            let next = || -> Result<Received, String> {
                gsi.receive_until(std::time::Instant::now() + timeout)
                    .map_err(e)?
                    .ok_or_else(|| "nothing came".to_string())
            };
            let Received::Cm(grh, tid, CmMessage::Req(req)) = next()? else {
                return Err("expected a REQ".into());
            };
            assert_eq!(req.service_id, 0x0000_0000_0106_0000 | 7004);
            assert_eq!(req.transport_service_type, transport::RC);
            assert_eq!(
                (req.primary.local_gid, req.primary.remote_gid, grh.sgid),
                (adev_gid, bdev_gid, adev_gid)
            );
            assert_eq!(tid >> 32, u64::from(req.local_comm_id));
            let hdr = CmaHeader::parse(&req.private_data).map_err(|x| x.to_string())?;
            assert_eq!((hdr.src, hdr.dst), (client_ip.into(), server_ip.into()));
            assert!(req.private_data.len() >= cma::CMA_HEADER_SIZE);
            let send = |m: CmMessage| {
                let mad = m.emit(tid).map_err(|x| x.to_string())?;
                gsi.send(bdev, grh.sgid, &mad, timeout).map_err(e)
            };
            send(CmMessage::Mra(Mra {
                local_comm_id: 9,
                remote_comm_id: req.local_comm_id,
                message_mraed: which::REQ,
                // 4.096 µs × 2^22: some 17 s more.
                service_timeout: 22,
                private_data: Vec::new(),
            }))?;
            std::thread::sleep(std::time::Duration::from_millis(500));
            send(CmMessage::Rep(Rep {
                local_comm_id: 9,
                remote_comm_id: req.local_comm_id,
                local_qpn: 0x77,
                starting_psn: 0x1234,
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 6,
                ..Rep::default()
            }))?;
            let Received::Cm(_, rtu_tid, CmMessage::Rtu(rtu)) = next()? else {
                return Err("expected the RTU".into());
            };
            assert_eq!(
                (rtu_tid, rtu.local_comm_id, rtu.remote_comm_id),
                (tid, req.local_comm_id, 9)
            );
            Ok(req.starting_psn)
        });
        let mut cm = CmPort::open(&a.dev).unwrap();
        cm.set_timers(Timers {
            response_wait: std::time::Duration::from_millis(50),
            max_sends: 1,
        });
        let cq = Cq::create(&a.dev, 4).unwrap();
        let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
        let conn = cm
            .connect(&qp, server_ip.into(), 7004, &ConnParam::default())
            .unwrap();
        let psn = peer.join().unwrap().unwrap();
        assert_eq!((conn.remote_qpn, conn.remote_comm_id), (0x77, 9));
        let attr = qp.query().unwrap().attr;
        assert_eq!(
            (attr.qp_state, attr.dest_qpn, attr.rq_psn, attr.sq_psn),
            (virtio_rdma_abi::qp::QpState::RTS as u32, 0x77, 0x1234, psn)
        );
        assert_eq!(
            (attr.rnr_retry, attr.max_rd_atomic, attr.av.dgid),
            (6, 1, bdev_gid)
        );
        assert_eq!(cm.dropped(), 0);
    });
}

/// The passive side against a hostile client: a REQ for another port is
/// rejected ("invalid service ID") in that REQ's transaction; an RTU in
/// another transaction is dropped (the REP is sent again), the REQ's
/// retransmission too, and the RTU in the REQ's transaction completes the
/// connection with the REQ's values.
#[test]
fn the_passive_side_takes_only_the_rtu_of_its_req() {
    use ib_cm_wire::cm::transport;
    use ib_cm_wire::cma::{self, CmaHeader};
    use ib_cm_wire::{CmMessage, Path, Req, Rtu};
    use virtio_rdma_apps::cm_agent::{CmPort, ConnParam, Timers};
    use virtio_rdma_apps::gsi_port::{Gsi, Received};
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let v4 = |g: [u8; 16]| std::net::Ipv6Addr::from(g).to_ipv4_mapped().unwrap();
    let timeout = std::time::Duration::from_secs(60);
    let gsi = Gsi::open(&a.dev).unwrap();
    let mut cm = CmPort::open(&b.dev).unwrap();
    cm.set_timers(Timers {
        response_wait: std::time::Duration::from_millis(100),
        max_sends: 100,
    });
    let cq = Cq::create(&b.dev, 4).unwrap();
    let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
    let (adev, agid, bgid) = (&a.dev, a.dev.gid(), b.dev.gid());
    std::thread::scope(|s| {
        let client = s.spawn(move || -> Result<u32, String> {
            let e = |e: Box<dyn std::error::Error>| e.to_string();
            let send = |m: CmMessage, tid: u64| {
                let mad = m.emit(tid).map_err(|x| x.to_string())?;
                gsi.send(adev, bgid, &mad, timeout).map_err(e)
            };
            let next = || -> Result<(u64, CmMessage), String> {
                match gsi
                    .receive_until(std::time::Instant::now() + timeout)
                    .map_err(e)?
                {
                    Some(Received::Cm(_, tid, msg)) => Ok((tid, msg)),
                    _ => Err("nothing came".into()),
                }
            };
            let req = |comm_id: u32, port: u16| Req {
                local_comm_id: comm_id,
                service_id: cma::service_id(cma::ps::TCP, port),
                local_qpn: 0x99,
                responder_resources: 1,
                initiator_depth: 1,
                transport_service_type: transport::RC,
                starting_psn: 0x4321,
                retry_count: 7,
                rnr_retry_count: 7,
                path_mtu: 3,
                primary: Path {
                    local_gid: agid,
                    remote_gid: bgid,
                    local_ack_timeout: 14,
                    ..Path::default()
                },
                private_data: CmaHeader {
                    src_port: 40_000,
                    src: v4(agid).into(),
                    dst: v4(bgid).into(),
                }
                .with_user_data(b"hi")
                .unwrap(),
                ..Req::default()
            };
            send(CmMessage::Req(req(5, 7010)), 0x55)?;
            match next()? {
                (0x55, CmMessage::Rej(r)) if r.remote_comm_id == 5 && r.reason == 8 => {}
                other => return Err(format!("expected the REJ: {other:?}")),
            }
            send(CmMessage::Req(req(6, 7011)), 0x66)?;
            let (tid, CmMessage::Rep(rep)) = next()? else {
                return Err("expected the REP".into());
            };
            assert_eq!((tid, rep.remote_comm_id), (0x66, 6));
            let rtu = |tid| {
                send(
                    CmMessage::Rtu(Rtu {
                        local_comm_id: 6,
                        remote_comm_id: rep.local_comm_id,
                        private_data: Vec::new(),
                    }),
                    tid,
                )
            };
            rtu(0x67)?;
            // Dropped: the REP comes again.
            let (tid, CmMessage::Rep(again)) = next()? else {
                return Err("expected the REP again".into());
            };
            assert_eq!((tid, again.local_comm_id), (0x66, rep.local_comm_id));
            send(CmMessage::Req(req(6, 7011)), 0x66)?;
            rtu(0x66)?;
            Ok(rep.local_qpn)
        });
        let conn = cm
            .accept(&qp, 7011, &ConnParam::default(), timeout)
            .unwrap();
        assert_eq!(client.join().unwrap().unwrap(), qp.qpn());
        assert_eq!(conn.remote_qpn, 0x99);
        // The user's private data after the rdma_cm header (zero-padded
        // to the REQ's fixed size).
        assert!(
            conn.private_data.starts_with(b"hi"),
            "{:?}",
            conn.private_data
        );
        let attr = qp.query().unwrap().attr;
        assert_eq!(
            (attr.qp_state, attr.dest_qpn, attr.rq_psn, attr.timeout),
            (virtio_rdma_abi::qp::QpState::RTS as u32, 0x99, 0x4321, 14)
        );
        // The RTU of another transaction; REPs for the REQ's
        // retransmission are not counted as drops.
        assert!(cm.dropped() >= 1, "{}", cm.dropped());
    });
}

/// A server that accepts and then disconnects at once: the rping client
/// answers its DREQ and fails, naming the disconnection, instead of
/// waiting for a go-ahead that never comes.
#[test]
fn rping_client_stops_when_the_server_disconnects() {
    use virtio_rdma_apps::cm_agent::{CmPort, ConnParam, Timers};
    use virtio_rdma_apps::rping;
    use virtio_rdma_driver::{Cq, Qp, QpInit};
    let d = daemon(2, |_| {});
    let (a, b) = (open(&d, 0), open(&d, 1));
    let server_ip = std::net::Ipv6Addr::from(b.dev.gid())
        .to_ipv4_mapped()
        .unwrap();
    let timeout = std::time::Duration::from_secs(60);
    let mut cm = CmPort::open(&b.dev).unwrap();
    let cq = Cq::create(&b.dev, 4).unwrap();
    let qp = Qp::create(cm.pd(), &QpInit::rc(&cq)).unwrap();
    std::thread::scope(|s| {
        let server = s.spawn(move || -> Result<(), String> {
            let conn = cm
                .accept(&qp, 7020, &ConnParam::default(), timeout)
                .map_err(|e| e.to_string())?;
            cm.disconnect(&qp, &conn).map_err(|e| e.to_string())
        });
        let opts = rping::Options {
            size: 64,
            count: 5,
            verify: true,
            timeout,
            gid_index: None,
            timers: Timers::default(),
        };
        let err = rping::client(&a.dev, server_ip.into(), 7020, &opts, timeout)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the server disconnected during ping 0"),
            "{err}"
        );
        server.join().unwrap().unwrap();
    });
}
