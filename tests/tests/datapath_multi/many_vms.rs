//! Many VMs on one daemon (spec 18.23): four VMs writing and sending to each
//! other all at once, one UD QP receiving from QPs on four VMs, and the Q_Key
//! a UD send with bit 31 set carries (spec 18.8).

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    ah_to, assert_quiet, ok, pattern, poll_n, poll_one, rc_qp, recv, sges, ud_qp, vms, wr,
    write_op, Buf, GUARD, QKEY,
};
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_driver::{Ah, Cq, Qp, SendOp, SendWr, Sge, UdDest};

use crate::fixtures::{connect, GRH};

// ---------------------------------------------------------------------------
// Four VMs, all to all

const MESH: usize = 4;
/// Per source VM, each target VM has a write slot and a receive slot.
const SLOT: usize = 3 * 4096;
/// Data starts this far into a slot; the bytes before and after are guards.
const LEAD: usize = 61;

fn write_off(src: usize) -> usize {
    src * 2 * SLOT
}

fn recv_off(src: usize) -> usize {
    src * 2 * SLOT + SLOT
}

/// (RDMA WRITE length, SEND length) from VM `i` to VM `j`.
fn mesh_lens(i: usize, j: usize) -> (usize, usize) {
    let k = i * MESH + j;
    (4000 + 331 * k, 1 + 577 * k)
}

fn mesh_data(i: usize, j: usize) -> (Vec<u8>, Vec<u8>) {
    let (wl, sl) = mesh_lens(i, j);
    let s = (i * MESH + j) as u64 * 2;
    (pattern(wl, 7000 + s), pattern(sl, 7001 + s))
}

fn mesh_imm(i: usize, j: usize) -> u32 {
    0x5EED_0000 | (i as u32) << 8 | j as u32
}

/// Four VMs, an RC QP pair between every two of them. Each VM RDMA-WRITEs
/// into and then SENDs (with immediate) to every other VM, all VMs at
/// once. Every completion is checked (opcode, wr_id, byte_len, qpn,
/// immediate, requester order WRITE before SEND), the written data is in
/// place when the SEND behind it is received (spec 18.23), and afterwards
/// each VM's target memory is compared as a whole with the expected image:
/// every byte landed where expected and nowhere else.
#[test]
fn four_vms_all_to_all_write_and_send() {
    let (_d, vm) = vms(MESH);
    let len = 2 * SLOT * MESH;
    let src: Vec<Buf> = vm.iter().map(|v| Buf::guarded(v, len)).collect();
    let dst: Vec<Buf> = vm.iter().map(|v| Buf::guarded(v, len)).collect();
    let cq: Vec<Arc<Cq>> = vm.iter().map(|v| Cq::create(&v.dev, 64).unwrap()).collect();
    // qps[i][j]: the QP on VM i connected to VM j.
    let mut qps: Vec<Vec<Option<Qp>>> = (0..MESH)
        .map(|_| (0..MESH).map(|_| None).collect())
        .collect();
    for i in 0..MESH {
        for j in i + 1..MESH {
            let qi = rc_qp(&vm[i], &cq[i]);
            let qj = rc_qp(&vm[j], &cq[j]);
            connect(&vm[i], &qi, &vm[j], &qj);
            qps[i][j] = Some(qi);
            qps[j][i] = Some(qj);
        }
    }
    let qp = |i: usize, j: usize| qps[i][j].as_ref().unwrap();
    // Sources, and a receive on every QP (wr_id 100 + source) with room to
    // spare: bytes past the message must stay untouched.
    for (i, from) in src.iter().enumerate() {
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(i, j);
            from.write(write_off(j) + LEAD, &w);
            from.write(recv_off(j) + LEAD, &s);
            let sg = sges(&dst[j], recv_off(i) + LEAD, SLOT - 2 * LEAD);
            recv(qp(j, i), 100 + i as u64, &sg);
        }
    }
    std::thread::scope(|s| {
        for i in 0..MESH {
            let (src, dst, cq, qp) = (&src, &dst, &cq, &qp);
            s.spawn(move || {
                let peers: Vec<usize> = (0..MESH).filter(|&j| j != i).collect();
                for &j in &peers {
                    let (wl, sl) = mesh_lens(i, j);
                    let wsg = sges(&src[i], write_off(j) + LEAD, wl);
                    let ssg = sges(&src[i], recv_off(j) + LEAD, sl);
                    let send = SendOp::SendWithImm {
                        imm: mesh_imm(i, j),
                    };
                    qp(i, j)
                        .post_send(&[
                            wr(j as u64, write_op(&dst[j], write_off(i) + LEAD), &wsg),
                            wr(10 + j as u64, send, &ssg),
                        ])
                        .unwrap();
                }
                let wcs = poll_n(&cq[i], 3 * peers.len());
                for &j in &peers {
                    let (wl, sl) = mesh_lens(i, j);
                    let at = |id: u64| wcs.iter().position(|w| w.wr_id == id).unwrap();
                    let (w, sd) = (at(j as u64), at(10 + j as u64));
                    ok(&wcs[w], j as u64, WcOpcode::RDMA_WRITE);
                    ok(&wcs[sd], 10 + j as u64, WcOpcode::SEND);
                    assert!(w < sd, "VM {i}: SEND to {j} completed before the WRITE");
                    assert_eq!(wcs[w].byte_len as usize, wl);
                    assert_eq!(wcs[sd].byte_len as usize, sl);
                    assert_eq!(wcs[w].qpn, qp(i, j).qpn());
                    // The receive of j's SEND, with j's WRITE already here.
                    let r = wcs[at(100 + j as u64)];
                    ok(&r, 100 + j as u64, WcOpcode::RECV);
                    assert_eq!(r.qpn, qp(i, j).qpn(), "{r:?}");
                    assert_eq!(r.byte_len as usize, mesh_lens(j, i).1, "{r:?}");
                    assert_eq!(r.imm(), Some(mesh_imm(j, i)));
                    let (w_in, s_in) = mesh_data(j, i);
                    assert_eq!(
                        dst[i].read(write_off(j) + LEAD, w_in.len()),
                        w_in,
                        "VM {i}: WRITE from {j} not in place when its SEND arrived"
                    );
                    assert_eq!(dst[i].read(recv_off(j) + LEAD, s_in.len()), s_in);
                }
            });
        }
    });
    for i in 0..MESH {
        let mut image = vec![GUARD; len];
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(j, i);
            let o = write_off(j) + LEAD;
            image[o..o + w.len()].copy_from_slice(&w);
            let o = recv_off(j) + LEAD;
            image[o..o + s.len()].copy_from_slice(&s);
        }
        let got = dst[i].read(0, len);
        if let Some(p) = got.iter().zip(&image).position(|(a, b)| a != b) {
            panic!(
                "VM {i}: byte {p:#x} is {:#x}, expected {:#x}",
                got[p], image[p]
            );
        }
        // Nothing wrote into the sources either.
        for j in (0..MESH).filter(|&j| j != i) {
            let (w, s) = mesh_data(i, j);
            assert_eq!(src[i].read(write_off(j) + LEAD, w.len()), w);
            assert_eq!(src[i].read(recv_off(j) + LEAD, s.len()), s);
        }
        assert_quiet(&cq[i]);
    }
}

// ---------------------------------------------------------------------------
// UD fan-in

/// Receive slot size of the UD fan-in test (GRH + largest message).
const UD_SLOT: usize = 2048;
const UD_MSGS: usize = 12;

fn ud_len(s: usize, k: usize) -> usize {
    2 + (s * 131 + k * 53) % 1000
}

fn ud_data(s: usize, k: usize) -> Vec<u8> {
    let mut d = pattern(ud_len(s, k), 9000 + (s * 100 + k) as u64);
    d[0] = s as u8;
    d[1] = k as u8;
    d
}

fn ud_imm(s: usize, k: usize) -> Option<u32> {
    (k % 2 == 1).then_some(0xC0DE_0000 | (s as u32) << 8 | k as u32)
}

/// One UD QP on VM 0 receives from five UD QPs at once: one on VM 0 itself,
/// two on VM 1, one each on VMs 2 and 3. Every completion reports the
/// sender's QP number (`src_qpn`), a GRH with the sender's and the
/// receiver's GIDs, `byte_len` = 40 + message, the immediate data of
/// SEND_WITH_IMM, and the right data. Receives complete in posting order,
/// each sender's messages arrive in its posting order, and every message
/// arrives exactly once.
#[test]
fn ud_fan_in_from_four_vms() {
    let (_d, vm) = vms(4);
    let rcq = Cq::create(&vm[0].dev, 128).unwrap();
    let rq = ud_qp(&vm[0], &rcq, 128);
    // Senders: (VM, QP, CQ, AH, source buffer).
    let homes = [0usize, 1, 1, 2, 3];
    let senders: Vec<(usize, Qp, Arc<Cq>, Ah, Buf)> = homes
        .iter()
        .map(|&h| {
            let cq = Cq::create(&vm[h].dev, 64).unwrap();
            let q = ud_qp(&vm[h], &cq, 4);
            (
                h,
                q,
                cq,
                ah_to(&vm[h], &vm[0]),
                Buf::guarded(&vm[h], UD_MSGS * 1024),
            )
        })
        .collect();
    let total = senders.len() * UD_MSGS;
    let rbuf = Buf::guarded(&vm[0], total * UD_SLOT);
    for m in 0..total {
        // The GRH straddles two SGEs.
        let o = m * UD_SLOT;
        recv(
            &rq,
            m as u64,
            &[rbuf.sge(o, 30), rbuf.sge(o + 30, UD_SLOT - 30)],
        );
    }
    std::thread::scope(|sc| {
        for (s, (_, q, cq, ah, buf)) in senders.iter().enumerate() {
            let rqpn = rq.qpn();
            sc.spawn(move || {
                for k in 0..UD_MSGS {
                    let data = ud_data(s, k);
                    buf.write(k * 1024, &data);
                }
                for chunk in 0..UD_MSGS / 4 {
                    let sg: Vec<[Sge; 1]> = (0..4)
                        .map(|x| {
                            let k = chunk * 4 + x;
                            [buf.sge(k * 1024, ud_len(s, k))]
                        })
                        .collect();
                    let wrs: Vec<SendWr<'_>> = (0..4)
                        .map(|x| {
                            let k = chunk * 4 + x;
                            let op = match ud_imm(s, k) {
                                Some(imm) => SendOp::SendWithImm { imm },
                                None => SendOp::Send,
                            };
                            let mut w = wr(k as u64, op, &sg[x]);
                            w.ud = Some(UdDest {
                                ah,
                                remote_qpn: rqpn,
                                remote_qkey: QKEY,
                            });
                            w
                        })
                        .collect();
                    q.post_send(&wrs).unwrap();
                    for (x, wc) in poll_n(cq, 4).iter().enumerate() {
                        let k = chunk * 4 + x;
                        ok(wc, k as u64, WcOpcode::SEND);
                        assert_eq!(wc.byte_len as usize, ud_len(s, k));
                    }
                }
            });
        }
        let wcs = poll_n(&rcq, total);
        let mut next = vec![0usize; senders.len()];
        for (m, r) in wcs.iter().enumerate() {
            ok(r, m as u64, WcOpcode::RECV);
            assert!(r.has_grh(), "{r:?}");
            assert_eq!(r.qpn, rq.qpn());
            let o = m * UD_SLOT;
            let head = rbuf.read(o + GRH, 2);
            let (s, k) = (head[0] as usize, head[1] as usize);
            assert!(s < senders.len(), "message {m}: sender {s}");
            let (home, q, ..) = &senders[s];
            assert_eq!(r.src_qpn, q.qpn(), "message {m} from sender {s}");
            assert_eq!(k, next[s], "sender {s}: message {k} out of order");
            next[s] += 1;
            assert_eq!(r.byte_len as usize, GRH + ud_len(s, k), "{r:?}");
            assert_eq!(r.imm(), ud_imm(s, k), "{r:?}");
            assert_eq!(rbuf.read(o + 8, 16), vm[*home].dev.gid(), "source GID");
            assert_eq!(rbuf.read(o + 24, 16), vm[0].dev.gid(), "destination GID");
            assert_eq!(rbuf.read(o + GRH, ud_len(s, k)), ud_data(s, k));
            rbuf.assert_untouched(
                o + GRH + ud_len(s, k),
                UD_SLOT - GRH - ud_len(s, k),
                "past a UD message",
            );
        }
        assert_eq!(next, vec![UD_MSGS; senders.len()]);
    });
    assert_quiet(&rcq);
}

/// A UD send whose `remote_qkey` has bit 31 set carries the sending QP's
/// own Q_Key (spec 18.8, 18.11.5): with equal Q_Keys it is delivered.
#[test]
fn ud_qkey_bit31_sends_own_qkey() {
    let (_d, vm) = vms(2);
    let (cqa, cqb) = (
        Cq::create(&vm[0].dev, 16).unwrap(),
        Cq::create(&vm[1].dev, 16).unwrap(),
    );
    let (qa, qb) = (ud_qp(&vm[0], &cqa, 4), ud_qp(&vm[1], &cqb, 4));
    let ah = ah_to(&vm[0], &vm[1]);
    let (ba, bb) = (Buf::guarded(&vm[0], 4096), Buf::guarded(&vm[1], 4096));
    ba.write(0, b"own qkey");
    recv(&qb, 1, &[bb.sge(0, 4096)]);
    let sg = [ba.sge(0, 8)];
    let mut w = wr(2, SendOp::Send, &sg);
    w.ud = Some(UdDest {
        ah: &ah,
        remote_qpn: qb.qpn(),
        remote_qkey: 0x8000_0000,
    });
    qa.post_send(&[w]).unwrap();
    ok(&poll_one(&cqa), 2, WcOpcode::SEND);
    let r = poll_one(&cqb);
    ok(&r, 1, WcOpcode::RECV);
    assert_eq!(r.src_qpn, qa.qpn());
    assert_eq!(bb.read(GRH, 8), b"own qkey");
}
