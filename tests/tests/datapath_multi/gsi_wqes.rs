//! Send WQEs of a GSI QP that the reference driver would not write (spec
//! 18.26): an opcode other than SEND, an AH of another PD (another
//! process's), a MAD over 256 bytes; each is refused by the device itself,
//! and nothing reaches the peer's QP 1.

use vhost_user_rdma_tests::dp::{ah, assert_quiet, failed, ok, poll_one, vms, Buf};
use vhost_user_rdma_tests::verbs::Verbs;
use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::{
    SendWqe, Sge as WireSge, WcOpcode, WcStatus, WrOpcode, WQE_INLINE, WQE_SIGNALED,
};
use virtio_rdma_abi::qp::{QpState, QpType, GSI_QPN};
use virtio_rdma_abi::Wire;
use virtio_rdma_driver::{Cq, Pd, Qp, QpInit, RecvWr, Transport};

use crate::raw::{raw_qp, raw_state, store_index, RawQp};

/// Writes send WQE `wqe` with `sges` into the first slot of raw QP `q`'s
/// send queue, posts it and notifies.
fn post(vm: &vhost_user_rdma_tests::dp::Vm, q: &RawQp, wqe: SendWqe, sges: &[WireSge]) {
    let mut bytes = wqe.to_bytes();
    for s in sges {
        bytes.extend(s.to_bytes());
    }
    vm.t.mem().write(q.ring.at(0), &bytes).unwrap();
    store_index(vm, q.ring.db, 1);
    vm.t.notify(NOTIFYQ).unwrap();
}

#[test]
fn gsi_wqes_the_driver_would_not_write_are_refused() {
    if vhost_user_rdma_tests::harness::on_host_rnic() {
        // No F_GSI through a host RNIC yet (spec appendix D).
        return;
    }
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    // B's QP 1, through the driver, with a receive posted.
    let bcq = Cq::create(&b.dev, 16).unwrap();
    let gb = Qp::create(&b.pd, &QpInit::gsi(&bcq)).unwrap();
    gb.gsi_activate().unwrap();
    let rbuf = Buf::guarded(b, 4096);
    gb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[rbuf.sge(0, 4096)],
    }])
    .unwrap();
    let to_b = ah(a, b.dev.gid()).unwrap();
    // An AH of another PD of A's context.
    let pd2 = Pd::alloc(&a.dev).unwrap();
    let foreign_ah = virtio_rdma_driver::Ah::create(&pd2, &a.dev.av(b.dev.gid())).unwrap();
    let src = Buf::new(a, 4096);
    let cq = Cq::create(&a.dev, 16).unwrap();
    let send = |opcode: WrOpcode, ah_handle: u32| SendWqe {
        wr_id: 9,
        opcode: opcode as u8,
        flags: WQE_SIGNALED,
        num_sge: 1,
        ah_handle,
        remote_qpn: GSI_QPN,
        remote_qkey: 0,
        ..SendWqe::default()
    };
    let sge = |len: usize| {
        let s = src.sge(0, len);
        WireSge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }
    };
    for (what, wqe, len, status) in [
        (
            "RDMA WRITE",
            SendWqe {
                rkey: 1,
                remote_addr: 0x1000,
                ..send(WrOpcode::RDMA_WRITE, to_b.handle())
            },
            8,
            WcStatus::LOC_QP_OP_ERR,
        ),
        (
            "AH of another PD",
            send(WrOpcode::SEND, foreign_ah.handle()),
            8,
            WcStatus::LOC_QP_OP_ERR,
        ),
        (
            "257 bytes",
            send(WrOpcode::SEND, to_b.handle()),
            257,
            WcStatus::LOC_LEN_ERR,
        ),
        (
            "inline data to QP 2",
            SendWqe {
                flags: WQE_SIGNALED | WQE_INLINE,
                num_sge: 0,
                remote_qpn: 2,
                inline_len: 0,
                ..send(WrOpcode::SEND, to_b.handle())
            },
            0,
            WcStatus::LOC_QP_OP_ERR,
        ),
    ] {
        let q = raw_qp(a, QpType::GSI, cq.handle(), cq.handle(), 0);
        assert_eq!(q.qpn, GSI_QPN);
        {
            let mut vmm = a.t.vmm();
            Verbs::new(&mut vmm).activate_gsi(q.handle).unwrap();
        }
        let sges = if wqe.num_sge == 0 {
            vec![]
        } else {
            vec![sge(len)]
        };
        post(a, &q, wqe, &sges);
        failed(&poll_one(&cq), 9, status);
        assert_eq!(raw_state(a, &q), u32::from(QpState::ERR), "{what}");
        let mut vmm = a.t.vmm();
        Verbs::new(&mut vmm).destroy_qp(q.handle).unwrap();
    }
    assert_quiet(&bcq);
    rbuf.assert_untouched(0, 4096, "B's MAD buffer");
    // The well-formed one arrives.
    let q = raw_qp(a, QpType::GSI, cq.handle(), cq.handle(), 0);
    {
        let mut vmm = a.t.vmm();
        Verbs::new(&mut vmm).activate_gsi(q.handle).unwrap();
    }
    post(a, &q, send(WrOpcode::SEND, to_b.handle()), &[sge(256)]);
    ok(&poll_one(&cq), 9, WcOpcode::SEND);
    ok(&poll_one(&bcq), 1, WcOpcode::RECV);
}
