#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! End-to-end data path through the real daemon: the reference guest driver
//! (`virtio-rdma-driver`) on two test VMs, over
//! [`VmmTransport`](vhost_user_rdma_tests::transport::VmmTransport) (DMA memory
//! made of scattered guest pages).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::{
    assert_quiet, cap, conn, connect, ok, pattern, poll_n, poll_one, qp_state, rc_pair, rc_qp,
    sges, ud_pair, wait_state, wr, write_op, Buf, Pair, UdPair, Vm, QKEY, QP_ACCESS, WAIT,
};
use vhost_user_rdma_tests::harness::{on_host_rnic, TestDaemon};
use vhost_user_rdma_tests::verbs::{QpInit as RawQpInit, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::{
    db_slot_offset, WcOpcode, WcStatus, DB_DEVICE_OFFSET, DB_FLAG_KICK, DB_FLAG_POLLING, DB_NONE,
    DB_PAGE_SIZE,
};
use virtio_rdma_abi::mem::DB_RECORD_SIZE;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{
    Cq, Payload, Qp, QpInit, RecvWr, SendFlags, SendOp, SendWr, Sge, Srq, UdDest,
};
use vm_memory::GuestAddress;

/// `RDMA_TEST_DOORBELL=shmem` runs every test in the shared-memory
/// doorbell mode (VMM with VIRTIO shared memory, spec 18.7); the default is
/// the guest-RAM mode. `scripts/test.sh` runs both.
fn shmem_mode() -> bool {
    std::env::var("RDMA_TEST_DOORBELL").is_ok_and(|v| v == "shmem")
}

/// Opens VM `i` of `d` in the doorbell mode [`shmem_mode`] asks for.
fn open(d: &TestDaemon, i: usize) -> Vm {
    let shmem = shmem_mode();
    let vm = Vm::open(
        d,
        i,
        VmmOptions {
            shmem,
            ..VmmOptions::default()
        },
    );
    // The mode really is the one asked for.
    assert_eq!(vm.dev.doorbell_page().is_some(), shmem);
    vm
}

/// `RDMA_TEST_FENCE_ELISION=1`: the daemon sets DB_FLAG_POLLING while it
/// polls (scripts/test.sh runs the suite so once).
fn fence_elision() -> bool {
    std::env::var("RDMA_TEST_FENCE_ELISION").is_ok_and(|v| v == "1")
}

/// Two VMs ([`open`]) on a daemon of their own, fence elision as
/// [`fence_elision`] says.
fn two_vms() -> (TestDaemon, Vm, Vm) {
    let d = TestDaemon::with_config(2, |c| c.fence_elision = fence_elision()).unwrap();
    let a = open(&d, 0);
    let b = open(&d, 1);
    (d, a, b)
}

const SIZES: [usize; 4] = [0, 1, 4096, (1 << 20) + 3];
const BIG: usize = (1 << 20) + 64;

#[test]
fn rdma_write_sizes() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let src = Buf::new(&a, BIG);
    let dst = Buf::new(&b, BIG);
    // The transport's DMA memory is contiguous for the driver only.
    for buf in [&src.buf, &dst.buf] {
        assert!(buf.pages().windows(2).all(|w| w[0] + 4096 != w[1]));
    }
    for (i, &len) in SIZES.iter().enumerate() {
        let (so, dof) = (7, 5);
        let data = pattern(len, i as u64 + 1);
        src.write(so, &data);
        dst.write(0, &vec![0xEE; BIG]);
        let sg = sges(&src, so, len);
        let op = write_op(&dst, dof);
        p.qa.post_send(&[wr(i as u64, op, &sg)]).unwrap();
        let wc = poll_one(&p.cqa);
        ok(&wc, i as u64, WcOpcode::RDMA_WRITE);
        assert_eq!(dst.read(dof, len), data, "write of {len} bytes");
        assert_eq!(dst.read(0, dof), vec![0xEE; dof]);
        assert_eq!(dst.read(dof + len, 16), vec![0xEE; 16]);
    }
    // A WRITE without immediate data completes nothing at the responder.
    assert_quiet(&p.cqb);
}

#[test]
fn rdma_read_sizes() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let dst = Buf::new(&a, BIG);
    let src = Buf::new(&b, BIG);
    for (i, &len) in SIZES.iter().enumerate() {
        let (dof, so) = (3, 9);
        let data = pattern(len, 100 + i as u64);
        src.write(so, &data);
        dst.write(0, &vec![0xEE; BIG]);
        let sg = sges(&dst, dof, len);
        let op = SendOp::RdmaRead {
            remote_addr: src.addr(so),
            rkey: src.mr.rkey(),
        };
        p.qa.post_send(&[wr(i as u64, op, &sg)]).unwrap();
        let wc = poll_one(&p.cqa);
        ok(&wc, i as u64, WcOpcode::RDMA_READ);
        assert_eq!(wc.byte_len as usize, len);
        assert_eq!(dst.read(dof, len), data, "read of {len} bytes");
        assert_eq!(dst.read(0, dof), vec![0xEE; dof]);
        assert_eq!(dst.read(dof + len, 16), vec![0xEE; 16]);
    }
    assert_quiet(&p.cqb);
}

#[test]
fn send_recv_ping_pong() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 8192), Buf::new(&b, 8192));
    const N: u64 = 20;
    for i in 0..N {
        let with_imm = i % 2 == 1;
        let len = 1 + (i as usize * 397) % 3000;
        // Receives on both sides (the reply's receive first).
        p.qa.post_recv(&[RecvWr {
            wr_id: 1000 + i,
            sg_list: &sges(&ba, 4096, 4096),
        }])
        .unwrap();
        p.qb.post_recv(&[RecvWr {
            wr_id: 2000 + i,
            sg_list: &sges(&bb, 0, 4096),
        }])
        .unwrap();
        let ping = pattern(len, i);
        ba.write(0, &ping);
        let sg = [ba.sge(0, len)];
        let op = if with_imm {
            SendOp::SendWithImm {
                imm: 0xABCD_0000 + i as u32,
            }
        } else {
            SendOp::Send
        };
        p.qa.post_send(&[wr(i, op, &sg)]).unwrap();
        let r = poll_one(&p.cqb);
        ok(&r, 2000 + i, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.qpn, p.qb.qpn());
        assert_eq!(r.imm(), with_imm.then_some(0xABCD_0000 + i as u32));
        assert_eq!(bb.read(0, len), ping);
        ok(&poll_one(&p.cqa), i, WcOpcode::SEND);
        // Pong: echo it back.
        let sg = [bb.sge(0, len)];
        p.qb.post_send(&[wr(i, op, &sg)]).unwrap();
        let r = poll_one(&p.cqa);
        ok(&r, 1000 + i, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.imm(), with_imm.then_some(0xABCD_0000 + i as u32));
        assert_eq!(ba.read(4096, len), ping);
        ok(&poll_one(&p.cqb), i, WcOpcode::SEND);
    }
    // WRITE with immediate consumes a receive and reports the immediate.
    p.qb.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &[],
    }])
    .unwrap();
    ba.write(0, b"write-imm");
    let sg = [ba.sge(0, 9)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: bb.addr(100),
        rkey: bb.mr.rkey(),
        imm: 0x0102_0304,
    };
    p.qa.post_send(&[wr(78, op, &sg)]).unwrap();
    let r = poll_one(&p.cqb);
    ok(&r, 77, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(r.imm(), Some(0x0102_0304));
    assert_eq!(r.byte_len, 9);
    assert_eq!(bb.read(100, 9), b"write-imm");
    ok(&poll_one(&p.cqa), 78, WcOpcode::RDMA_WRITE);
}

#[test]
fn inline_send() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let bb = Buf::new(&b, 4096);
    for (i, len) in [1usize, 13, 64].into_iter().enumerate() {
        p.qb.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[bb.sge(0, 4096)],
        }])
        .unwrap();
        let data = pattern(len, 7 + i as u64);
        p.qa.post_send(&[SendWr {
            wr_id: 50 + i as u64,
            op: SendOp::Send,
            payload: Payload::Inline(&data),
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
        let r = poll_one(&p.cqb);
        ok(&r, i as u64, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(bb.read(0, len), data);
        ok(&poll_one(&p.cqa), 50 + i as u64, WcOpcode::SEND);
    }
    // Inline RDMA WRITE too.
    let data = pattern(40, 99);
    p.qa.post_send(&[SendWr {
        wr_id: 9,
        op: write_op(&bb, 1000),
        payload: Payload::Inline(&data),
        flags: SendFlags::SIGNALED,
        ud: None,
    }])
    .unwrap();
    ok(&poll_one(&p.cqa), 9, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(1000, 40), data);
}

#[test]
fn atomics_concurrent() {
    const QPS: usize = 4;
    const ADDS: usize = 1000;
    const CAS: usize = 100;
    const BATCH: usize = 16;
    let (_d, a, b) = two_vms();
    let target = Buf::new(&b, 4096);
    target.write(0, &[0; 64]);
    let pairs: Vec<Pair> = (0..QPS).map(|_| rc_pair(&a, &b)).collect();
    let fetched: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(t, p)| {
                let a = &a;
                let target = &target;
                s.spawn(move || {
                    let res = Buf::new(a, BATCH * 8);
                    let mut got = Vec::with_capacity(ADDS);
                    for chunk in 0..ADDS / BATCH + 1 {
                        let n = BATCH.min(ADDS - chunk * BATCH);
                        if n == 0 {
                            break;
                        }
                        let sg: Vec<[Sge; 1]> = (0..n).map(|k| [res.sge(k * 8, 8)]).collect();
                        let wrs: Vec<SendWr<'_>> = (0..n)
                            .map(|k| {
                                wr(
                                    k as u64,
                                    SendOp::AtomicFetchAdd {
                                        remote_addr: target.addr(0),
                                        rkey: target.mr.rkey(),
                                        add: 1,
                                    },
                                    &sg[k],
                                )
                            })
                            .collect();
                        p.qa.post_send(&wrs).unwrap();
                        for (k, wc) in poll_n(&p.cqa, n).iter().enumerate() {
                            ok(wc, k as u64, WcOpcode::FETCH_ADD);
                            assert_eq!(wc.byte_len, 8);
                        }
                        got.extend((0..n).map(|k| res.u64_at(k * 8)));
                    }
                    // Compare-and-swap increments of a second counter.
                    let mut cur = 0u64;
                    let mut done = 0;
                    while done < CAS {
                        let sg = [res.sge(0, 8)];
                        let op = SendOp::AtomicCmpSwp {
                            remote_addr: target.addr(8),
                            rkey: target.mr.rkey(),
                            compare: cur,
                            swap: cur + 1,
                        };
                        p.qa.post_send(&[wr(t as u64, op, &sg)]).unwrap();
                        ok(&poll_one(&p.cqa), t as u64, WcOpcode::COMP_SWAP);
                        let orig = res.u64_at(0);
                        if orig == cur {
                            done += 1;
                            cur += 1;
                        } else {
                            cur = orig;
                        }
                    }
                    got
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(target.u64_at(0), (QPS * ADDS) as u64);
    assert_eq!(target.u64_at(8), (QPS * CAS) as u64);
    let mut all: Vec<u64> = fetched.into_iter().flatten().collect();
    all.sort_unstable();
    let want: Vec<u64> = (0..(QPS * ADDS) as u64).collect();
    assert_eq!(all, want, "every fetch-add saw a distinct value");
    // Nothing completes at the responder.
    for p in &pairs {
        assert_eq!(p.cqb.poll_one(), None);
    }
}

#[test]
fn ud_send_through_ah() {
    let (_d, a, b) = two_vms();
    let UdPair {
        cqa,
        cqb,
        qa,
        qb,
        ah,
    } = ud_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    // Up to the port's UD payload (1024 on a 1500-byte host link).
    let max = a.dev.query_port().unwrap().max_ud_payload as usize;
    for i in 0..3u64 {
        let len = (100 + i as usize * 500).min(max);
        bb.write(0, &[0xEE; 4096]);
        // The GRH straddles two SGEs.
        qb.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[bb.sge(0, 24), bb.sge(24, 4000)],
        }])
        .unwrap();
        let data = pattern(len, 300 + i);
        ba.write(0, &data);
        let sg = [ba.sge(0, len)];
        let mut w = wr(10 + i, SendOp::Send, &sg);
        if i == 1 {
            w.op = SendOp::SendWithImm { imm: 0x55 };
        }
        w.ud = Some(UdDest {
            ah: &ah,
            remote_qpn: qb.qpn(),
            remote_qkey: QKEY,
        });
        qa.post_send(&[w]).unwrap();
        ok(&poll_one(&cqa), 10 + i, WcOpcode::SEND);
        let r = poll_one(&cqb);
        ok(&r, i, WcOpcode::RECV);
        assert!(r.has_grh(), "{r:?}");
        assert_eq!(r.src_qpn, qa.qpn());
        assert_eq!(r.qpn, qb.qpn());
        assert_eq!(r.byte_len as usize, 40 + len);
        assert_eq!(r.imm(), (i == 1).then_some(0x55));
        assert_eq!(bb.read(8, 16), a.dev.gid(), "GRH source GID");
        assert_eq!(bb.read(24, 16), b.dev.gid(), "GRH destination GID");
        assert_eq!(bb.read(40, len), data);
    }
    // A wrong Q_Key is dropped silently: the sender still completes.
    qb.post_recv(&[RecvWr {
        wr_id: 99,
        sg_list: &[bb.sge(0, 4096)],
    }])
    .unwrap();
    let sg = [ba.sge(0, 8)];
    let mut w = wr(20, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: qb.qpn(),
        remote_qkey: QKEY ^ 1,
    });
    qa.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 20, WcOpcode::SEND);
    assert_quiet(&cqb);
}

/// A UD message may carry the port's `max_ud_payload` bytes (spec 18.11):
/// that many arrive whole; one byte more fails at the requester with
/// `LOC_LEN_ERR` and nothing reaches the responder.
#[test]
fn ud_message_longer_than_the_mtu_fails() {
    let (_d, a, b) = two_vms();
    let p = ud_pair(&a, &b);
    let port = a.dev.query_port().unwrap();
    let max = port.max_ud_payload as usize;
    // The path MTU of the link (4096 on the software RNIC, a host port's
    // active one on a host RNIC).
    assert_eq!(max, 128 << port.active_mtu);
    let (ba, bb) = (Buf::new(&a, 2 * max), Buf::new(&b, 2 * max));
    let data = pattern(max + 1, 77);
    ba.write(0, &data);
    bb.write(0, &vec![0xEE; 2 * max]);
    p.qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bb.sge(0, 2 * max)],
    }])
    .unwrap();
    let send = |id: u64, len: usize| {
        let sg = [ba.sge(0, len)];
        let mut w = wr(id, SendOp::Send, &sg);
        w.ud = Some(UdDest {
            ah: &p.ah,
            remote_qpn: p.qb.qpn(),
            remote_qkey: QKEY,
        });
        p.qa.post_send(&[w]).unwrap();
    };
    send(10, max);
    ok(&poll_one(&p.cqa), 10, WcOpcode::SEND);
    let r = poll_one(&p.cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!(r.byte_len as usize, 40 + max);
    assert_eq!(bb.read(40, max), data[..max]);

    bb.write(0, &vec![0xEE; 2 * max]);
    p.qb.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[bb.sge(0, 2 * max)],
    }])
    .unwrap();
    send(11, max + 1);
    let wc = poll_one(&p.cqa);
    assert_eq!(
        (wc.wr_id, wc.status()),
        (11, Some(WcStatus::LOC_LEN_ERR)),
        "{wc:?}"
    );
    assert_quiet(&p.cqb);
    assert_eq!(bb.read(0, 2 * max), vec![0xEE; 2 * max]);
}

#[test]
fn srq_receives() {
    let (_d, a, b) = two_vms();
    let srq = Srq::create(&b.pd, 64, 1, 0).unwrap();
    let cqa = Cq::create(&a.dev, 256).unwrap();
    let cqb = Cq::create(&b.dev, 256).unwrap();
    let mk_b = || {
        let mut init = QpInit::rc(&cqb);
        init.cap = cap();
        init.srq = Some(srq.clone());
        Qp::create(&b.pd, &init).unwrap()
    };
    let (qa1, qa2) = (rc_qp(&a, &cqa), rc_qp(&a, &cqa));
    let (qb1, qb2) = (mk_b(), mk_b());
    connect(&a, &qa1, &b, &qb1);
    connect(&a, &qa2, &b, &qb2);
    let bb = Buf::new(&b, 16 * 256);
    let ba = Buf::new(&a, 4096);
    const N: usize = 16;
    for k in 0..N {
        srq.post_recv(&[RecvWr {
            wr_id: 500 + k as u64,
            sg_list: &[bb.sge(k * 256, 256)],
        }])
        .unwrap();
    }
    for k in 0..N {
        let msg = format!("message {k:02} via srq");
        ba.write(k * 32, msg.as_bytes());
        let sg = [ba.sge(k * 32, msg.len())];
        let q = if k % 2 == 0 { &qa1 } else { &qa2 };
        q.post_send(&[wr(k as u64, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&cqa), k as u64, WcOpcode::SEND);
    }
    let wcs = poll_n(&cqb, N);
    for (k, r) in wcs.iter().enumerate() {
        // The SRQ hands out its WQEs in order.
        ok(r, 500 + k as u64, WcOpcode::RECV);
        let want = if k % 2 == 0 { qb1.qpn() } else { qb2.qpn() };
        assert_eq!(r.qpn, want, "{r:?}");
        let msg = format!("message {k:02} via srq");
        assert_eq!(r.byte_len as usize, msg.len());
        assert_eq!(bb.read(k * 256, msg.len()), msg.as_bytes());
    }
}

#[test]
fn cq_arming_raises_an_event() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let bb = Buf::new(&b, 4096);
    let ba = Buf::new(&a, 4096);
    for round in 0..3u64 {
        p.cqb.req_notify(false);
        assert_eq!(p.cqb.poll_one(), None);
        assert!(!p.cqb.wait_event(Some(Duration::ZERO)).unwrap());
        p.qb.post_recv(&[RecvWr {
            wr_id: round,
            sg_list: &[bb.sge(0, 64)],
        }])
        .unwrap();
        let sg = [ba.sge(0, 64)];
        p.qa.post_send(&[wr(round, SendOp::Send, &sg)]).unwrap();
        assert!(p.cqb.wait_event(Some(WAIT)).unwrap(), "round {round}");
        ok(&poll_one(&p.cqb), round, WcOpcode::RECV);
        ok(&poll_one(&p.cqa), round, WcOpcode::SEND);
        // One event per arming.
        assert!(!p.cqb.wait_event(Some(Duration::from_millis(30))).unwrap());
    }
}

#[test]
fn error_bad_lkey_flushes() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let mut bad = ba.sge(0, 16);
    bad.lkey ^= 0x00ab_cd00;
    let good = [ba.sge(0, 16)];
    let op = write_op(&bb, 0);
    let bad = [bad];
    let mut unsignaled = wr(3, op, &good);
    unsignaled.flags = SendFlags::NONE;
    p.qa.post_send(&[wr(1, op, &bad), wr(2, op, &good), unsignaled])
        .unwrap();
    let wcs = poll_n(&p.cqa, 3);
    assert_eq!(wcs[0].wr_id, 1);
    assert_eq!(wcs[0].status(), Some(WcStatus::LOC_PROT_ERR), "{wcs:?}");
    for (k, wc) in wcs[1..].iter().enumerate() {
        assert_eq!(wc.wr_id, 2 + k as u64);
        assert_eq!(wc.status(), Some(WcStatus::WR_FLUSH_ERR), "{wc:?}");
    }
    wait_state(&p.qa, QpState::ERR);
    // Later work is flushed too, receives included.
    p.qa.post_send(&[wr(4, op, &good)]).unwrap();
    p.qa.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &good,
    }])
    .unwrap();
    let wcs = poll_n(&p.cqa, 2);
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [4, 5]);
    assert!(wcs
        .iter()
        .all(|w| w.status() == Some(WcStatus::WR_FLUSH_ERR)));
    assert_eq!(bb.read(0, 16), vec![0; 16], "nothing was written");
}

#[test]
fn error_bad_rkey() {
    let (_d, a, b) = two_vms();
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let sg = [ba.sge(0, 16)];
    let op = SendOp::RdmaWrite {
        remote_addr: bb.addr(0),
        rkey: bb.mr.rkey() ^ 0x00ab_cd00,
    };
    p.qa.post_send(&[wr(1, op, &sg)]).unwrap();
    let wc = poll_one(&p.cqa);
    assert_eq!(wc.wr_id, 1);
    assert_eq!(wc.status(), Some(WcStatus::REM_ACCESS_ERR), "{wc:?}");
    wait_state(&p.qa, QpState::ERR);
    if on_host_rnic() {
        // Whether the responder fails too is the NIC's (spec appendix D).
        return;
    }
    wait_state(&p.qb, QpState::ERR);
    // The responder flushes its receives.
    p.qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[bb.sge(0, 16)],
    }])
    .unwrap();
    let wc = poll_one(&p.cqb);
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status(), Some(WcStatus::WR_FLUSH_ERR), "{wc:?}");
}

/// Small WRITEs posted together take the engine's one-pass lane after the
/// first of the burst: they land like any other, and a bad one among them
/// (remote key, remote bounds, local key, each after good ones in the
/// same post) fails with the status the general path gives it, the WRITEs
/// after it flushed.
#[test]
fn small_writes_in_one_post_are_checked_like_any_other() {
    // (size, source offset, destination offset): in a page, across a page
    // boundary of the scattered buffers (the general path), a whole page.
    const GOOD: [(usize, usize, usize); 6] = [
        (1, 0, 0),
        (64, 100, 200),
        (512, 1000, 1100),
        (300, 4000, 4090),
        (4096, 4096, 8192),
        (17, 2, 3),
    ];
    for bad in ["rkey", "remote bounds", "lkey"] {
        let (_d, a, b) = two_vms();
        let p = rc_pair(&a, &b);
        let (src, dst) = (Buf::new(&a, 3 * 4096), Buf::new(&b, 4 * 4096));
        let data = pattern(3 * 4096, 7);
        src.write(0, &data);
        dst.write(0, &vec![0xEE; 4 * 4096]);
        let good: Vec<[Sge; 1]> = GOOD.iter().map(|&(n, so, _)| [src.sge(so, n)]).collect();
        let mut wrs: Vec<SendWr<'_>> = GOOD
            .iter()
            .zip(&good)
            .enumerate()
            .map(|(i, (&(_, _, dof), sg))| wr(i as u64, write_op(&dst, dof), sg))
            .collect();
        let mut bad_sge = [src.sge(0, 64)];
        let mut op = write_op(&dst, 0);
        let want = match bad {
            "rkey" => {
                op = SendOp::RdmaWrite {
                    remote_addr: dst.addr(0),
                    rkey: dst.mr.rkey() ^ 0x0001_0000,
                };
                WcStatus::REM_ACCESS_ERR
            }
            "remote bounds" => {
                op = write_op(&dst, 4 * 4096 - 32);
                WcStatus::REM_ACCESS_ERR
            }
            _ => {
                bad_sge[0].lkey ^= 0x0001_0000;
                WcStatus::LOC_PROT_ERR
            }
        };
        wrs.push(wr(100, op, &bad_sge));
        let after = [src.sge(0, 8)];
        wrs.push(wr(101, write_op(&dst, 0), &after));
        p.qa.post_send(&wrs).unwrap();
        let wcs = poll_n(&p.cqa, GOOD.len() + 2);
        for (i, (wc, &(n, so, dof))) in wcs.iter().zip(&GOOD).enumerate() {
            ok(wc, i as u64, WcOpcode::RDMA_WRITE);
            assert_eq!(dst.read(dof, n), data[so..so + n], "{bad}: WRITE {i}");
        }
        let (failed, flushed) = (&wcs[GOOD.len()], &wcs[GOOD.len() + 1]);
        assert_eq!(failed.wr_id, 100);
        assert_eq!(failed.status(), Some(want), "{bad}: {failed:?}");
        assert_eq!(flushed.wr_id, 101);
        assert_eq!(flushed.status(), Some(WcStatus::WR_FLUSH_ERR), "{bad}");
        wait_state(&p.qa, QpState::ERR);
        // Nothing beyond the good WRITEs was written.
        assert_eq!(dst.read(4 * 4096 - 32, 32), vec![0xEE; 32], "{bad}");
    }
}

#[test]
fn error_rnr_retry_exceeded() {
    let (_d, a, b) = two_vms();
    let cqa = Cq::create(&a.dev, 64).unwrap();
    let cqb = Cq::create(&b.dev, 64).unwrap();
    let qa = rc_qp(&a, &cqa);
    let qb = rc_qp(&b, &cqb);
    let mut ca = conn(&qb, &b);
    ca.rnr_retry = 0;
    qa.rc_connect(QP_ACCESS, &ca).unwrap();
    let mut cb = conn(&qa, &a);
    cb.min_rnr_timer = 1;
    qb.rc_connect(QP_ACCESS, &cb).unwrap();
    let ba = Buf::new(&a, 4096);
    let sg = [ba.sge(0, 32)];
    qa.post_send(&[wr(1, SendOp::Send, &sg)]).unwrap();
    let wc = poll_one(&cqa);
    assert_eq!(wc.wr_id, 1);
    assert_eq!(wc.status(), Some(WcStatus::RNR_RETRY_EXC_ERR), "{wc:?}");
    wait_state(&qa, QpState::ERR);
    // The responder is unharmed.
    assert_eq!(qp_state(&qb), u32::from(QpState::RTS));
    assert_eq!(cqb.poll_one(), None);
}

/// A guest scribbles random bytes over its own SQ ring and doorbell record
/// (and kicks) while the engine runs; the other VM's traffic stays correct.
#[test]
fn scribbling_guest_does_not_hurt_others() {
    let (_d, a, b) = two_vms();
    // The rogue QP, made with raw verbs so the test knows its ring pages.
    let (sq_pages, db, rogue, peer_qpn, slot) = {
        let mut vmm = a.t.vmm();
        let window = vmm.shmem_window().cloned();
        let mut v = Verbs::new(&mut vmm);
        let ctx_resp = v.create_ctx_full().unwrap();
        let ctx = ctx_resp.ctx_handle;
        let pd = v.alloc_pd(ctx).unwrap();
        let cq = v.create_cq(ctx, 64).unwrap();
        let mut init = RawQpInit::rc(pd, cq);
        init.max_inline_data = 64;
        let (req, tail) = v.qp_request(&init).unwrap();
        let r = v.create_qp_raw(&req, &tail).unwrap();
        // A target in VM 1 (its own context there).
        let mut vmm_b = b.t.vmm();
        let mut vb = Verbs::new(&mut vmm_b);
        let ctx_b = vb.create_ctx().unwrap();
        let pd_b = vb.alloc_pd(ctx_b).unwrap();
        let cq_b = vb.create_cq(ctx_b, 64).unwrap();
        let peer = vb.create_qp(&RawQpInit::rc(pd_b, cq_b)).unwrap();
        vb.connect_rc(peer.handle, r.qpn, a.dev.gid()).unwrap();
        v.connect_rc(r.qp_handle, peer.qpn, b.dev.gid()).unwrap();
        let pages: Vec<GuestAddress> = tail
            .chunks_exact(8)
            .map(|c| GuestAddress(u64::from_le_bytes(c.try_into().unwrap())))
            .collect();
        // In the shared-memory mode the producer indices live in the
        // doorbell page: scribble there too.
        let slot = window.filter(|_| r.db_slot != DB_NONE).map(|w| {
            let off = u64::from(ctx_resp.doorbell_page) * DB_PAGE_SIZE
                + db_slot_offset(r.db_slot).unwrap();
            (w, off as usize)
        });
        (pages, GuestAddress(req.db_gpa), r.qp_handle, peer.qpn, slot)
    };
    let stop = AtomicBool::new(false);
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 65536), Buf::new(&b, 65536));
    std::thread::scope(|s| {
        let mem = a.t.mem().clone();
        let t = a.t.clone();
        let stop = &stop;
        let gid_b = b.dev.gid();
        let scribbler = s.spawn(move || {
            use virtio_rdma_driver::Transport;
            let mut i = 0u64;
            let mut revived = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                for (k, &pg) in sq_pages.iter().enumerate() {
                    mem.write(pg, &pattern(4096, i * 31 + k as u64)).unwrap();
                }
                mem.write(db, &pattern(64, i)).unwrap();
                if let Some((w, off)) = &slot {
                    let g = pattern(8, i);
                    w.store_u32(*off, u32::from_le_bytes(g[..4].try_into().unwrap()));
                    w.store_u32(*off + 4, u32::from_le_bytes(g[4..].try_into().unwrap()));
                }
                t.notify(virtio_rdma_abi::config::NOTIFYQ).unwrap();
                std::thread::sleep(Duration::from_micros(200));
                if i % 16 == 0 {
                    // Once the garbage has put the rogue QP in ERR, bring it
                    // back so the engine keeps chewing on garbage.
                    let mut vmm = t.vmm();
                    let mut v = Verbs::new(&mut vmm);
                    let st = v.query_qp(rogue).unwrap().attr.qp_state;
                    if st == u32::from(QpState::ERR) {
                        let reset = virtio_rdma_abi::qp::QpAttr {
                            qp_state: QpState::RESET.into(),
                            ..Default::default()
                        };
                        v.modify_qp(rogue, virtio_rdma_abi::qp::attr::STATE, &reset)
                            .unwrap();
                        v.connect_rc(rogue, peer_qpn, gid_b).unwrap();
                        revived += 1;
                    }
                }
            }
            revived
        });
        // At least 1.5 s of scribbling, and at least ROUNDS rounds however
        // slow the host (a busy machine, soft-RoCE under TCG).
        const ROUNDS: u64 = 12;
        let deadline = Instant::now() + Duration::from_millis(1500);
        let mut i = 0u64;
        while i < ROUNDS || Instant::now() < deadline {
            i += 1;
            let len = 1 + (i as usize * 7919) % 65535;
            let data = pattern(len, 1000 + i);
            ba.write(0, &data);
            let sg = sges(&ba, 0, len);
            let op = write_op(&bb, 0);
            p.qa.post_send(&[wr(i, op, &sg)]).unwrap();
            ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
            assert_eq!(bb.read(0, len), data);
            // And back with SEND.
            p.qa.post_recv(&[RecvWr {
                wr_id: i,
                sg_list: &[ba.sge(0, 65536)],
            }])
            .unwrap();
            let sg = sges(&bb, 0, len.min(4096));
            p.qb.post_send(&[wr(i, SendOp::Send, &sg)]).unwrap();
            ok(&poll_one(&p.cqb), i, WcOpcode::SEND);
            let r = poll_one(&p.cqa);
            ok(&r, i, WcOpcode::RECV);
            assert_eq!(ba.read(0, len.min(4096)), data[..len.min(4096)]);
        }
        stop.store(true, Ordering::Relaxed);
        let revived = scribbler.join().unwrap();
        assert!(revived > 0, "the garbage never reached the engine");
    });
    // The device still answers VM 0's control path.
    let q = Qp::create(&a.pd, &QpInit::rc(&p.cqa)).unwrap();
    assert_eq!(q.state(), QpState::RESET);
}

/// With `fence_elision` on, a stream of work makes the engine set
/// DB_FLAG_POLLING in the context's doorbell header (the driver then
/// publishes without a fence and never notifies); when the stream stops it
/// clears the flag, waits for the system-wide barrier and parks with
/// DB_FLAG_KICK; work posted then still completes (spec 18.6). Where the
/// host has no `membarrier`, or the option is off (the default), the flag
/// never appears. In both doorbell modes (the header is in guest RAM or in
/// the doorbell page).
#[test]
fn a_busy_engine_polls_without_fences_and_parks_after_the_barrier() {
    busy_then_idle(true);
}

/// The default: drivers always fence, the flag never appears.
#[test]
fn without_fence_elision_a_busy_engine_never_sets_polling() {
    busy_then_idle(false);
}

fn busy_then_idle(fence_elision: bool) {
    let d = TestDaemon::with_config(2, |c| c.fence_elision = fence_elision).unwrap();
    let (a, b) = (open(&d, 0), open(&d, 1));
    let p = rc_pair(&a, &b);
    let (ba, bb) = (Buf::new(&a, 4096), Buf::new(&b, 4096));
    let supported =
        fence_elision && vhost_user_rdma::engine::barrier::SystemBarrier::get().is_some();
    let sg = sges(&ba, 0, 64);
    let mut seen = 0u32;
    let start = Instant::now();
    let mut n = 0u64;
    // Busy until the flag shows. The engine sets it after 1 ms awake with
    // work on end, and an unpinned engine parks whenever 20 µs pass
    // without work: on a loaded host, where this thread or the engine's
    // is preempted now and then, that may take many tries, so the loop
    // waits for the flag (or 60 s), not for a fixed time. Without a
    // barrier: 300 ms of work, in which the flag must not appear.
    let busy = |seen: u32| {
        if supported {
            seen & DB_FLAG_POLLING == 0 && start.elapsed() < Duration::from_secs(60)
        } else {
            start.elapsed() < Duration::from_millis(300)
        }
    };
    while busy(seen) {
        let w = wr(n, write_op(&bb, 0), &sg);
        p.qa.post_send(&[w]).unwrap();
        ok(&poll_one(&p.cqa), n, WcOpcode::RDMA_WRITE);
        seen |= a.dev.doorbell_flags();
        n += 1;
    }
    if supported {
        assert_ne!(
            seen & DB_FLAG_POLLING,
            0,
            "a busy engine never set DB_FLAG_POLLING"
        );
    } else {
        assert_eq!(
            seen & DB_FLAG_POLLING,
            0,
            "DB_FLAG_POLLING without a barrier"
        );
    }
    // Idle: the flag goes, and the engine parks with DB_FLAG_KICK.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flags = a.dev.doorbell_flags();
        assert_ne!(flags, DB_FLAG_POLLING | DB_FLAG_KICK, "flags are exclusive");
        if flags == DB_FLAG_KICK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "engine never parked (flags {flags:#x})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let data = pattern(100, n);
    ba.write(0, &data);
    let sg = sges(&ba, 0, data.len());
    let w = wr(n, write_op(&bb, 0), &sg);
    let before = d.traffic(0).notifications;
    p.qa.post_send(&[w]).unwrap();
    ok(&poll_one(&p.cqa), n, WcOpcode::RDMA_WRITE);
    assert_eq!(bb.read(0, data.len()), data);
    // That post found the engine parked and woke it through notifyq.
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.traffic(0).notifications == before {
        assert!(
            Instant::now() < deadline,
            "the post to a parked engine sent no notification"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Creating a CQ, SRQ or QP writes the device half of its doorbell record
/// (spec 18.4): whatever the driver left there, the command returns with
/// consumer and producer indices, `armed_seq` and reserved fields 0 and
/// `flags` 0 (or the flags the engine's other records carry by the time the
/// test looks: `DB_FLAG_KICK` if it parked, `DB_FLAG_POLLING` if it polls).
/// A failed create writes nothing.
#[test]
fn create_writes_the_device_half_of_doorbell_records() {
    const DEV: u64 = DB_DEVICE_OFFSET;
    const HALF: usize = (DB_RECORD_SIZE - DB_DEVICE_OFFSET) as usize;
    let (_d, a, _b) = two_vms();
    let mut vmm = a.t.vmm();
    let mem = vmm.mem().clone();
    let mut v = Verbs::new(&mut vmm);
    // The context's doorbell header is the device's: CREATE_CTX writes all
    // of it over whatever was there (spec 12.4, 18.4).
    let header = mem.alloc(64, 64).unwrap();
    mem.write(header, &[0xA5; 64]).unwrap();
    let ctx = v.create_ctx_at(header.0).unwrap().ctx_handle;
    let mut h = mem.read_vec(header, 64).unwrap();
    let flags = u32::from_le_bytes(h[0..4].try_into().unwrap());
    assert!(
        flags == 0 || flags == DB_FLAG_KICK || flags == DB_FLAG_POLLING,
        "context header: flags {flags:#x}"
    );
    h[0..4].fill(0);
    assert_eq!(h, [0; 64], "context header");
    let pd = v.alloc_pd(ctx).unwrap();
    // The driver zeroes its half before the create command; the device
    // half holds leftovers.
    let leftovers = |db: u64| {
        mem.write(GuestAddress(db), &[0; DEV as usize]).unwrap();
        mem.write(GuestAddress(db + DEV), &[0xA5; HALF]).unwrap();
    };
    let device_half = |db: u64| mem.read_vec(GuestAddress(db + DEV), HALF).unwrap();
    // Bytes 8 to 11 of the device half are `flags`.
    let initialized = |db: u64, what: &str| {
        let mut half = device_half(db);
        let flags = u32::from_le_bytes(half[8..12].try_into().unwrap());
        assert!(
            flags == 0 || flags == DB_FLAG_KICK || flags == DB_FLAG_POLLING,
            "{what}: flags {flags:#x}"
        );
        half[8..12].fill(0);
        assert_eq!(half, [0; HALF], "{what}: device half");
    };
    let (req, tail) = v.cq_request(ctx, 16).unwrap();
    leftovers(req.db_gpa);
    let cq = v.create_cq_raw(&req, &tail).unwrap();
    assert_eq!(device_half(req.db_gpa), [0; HALF], "CQ: device half");
    let (req, tail) = v.srq_request(pd, 16, 1, 0).unwrap();
    leftovers(req.db_gpa);
    v.create_srq_raw(&req, &tail).unwrap();
    initialized(req.db_gpa, "SRQ");
    let (mut req, tail) = v.qp_request(&RawQpInit::rc(pd, cq)).unwrap();
    leftovers(req.db_gpa);
    req.send_cq = 0xdead;
    assert!(v.create_qp_raw(&req, &tail).is_err());
    assert_eq!(device_half(req.db_gpa), [0xA5; HALF], "failed CREATE_QP");
    req.send_cq = cq;
    v.create_qp_raw(&req, &tail).unwrap();
    initialized(req.db_gpa, "QP");
}
