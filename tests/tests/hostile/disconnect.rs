//! A VMM that disconnects in the middle of a command, and handles from before
//! a reconnect (spec 9.1, 15.2).

use std::time::{Duration, Instant};

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::guest_mem::{GIB, PAGE_SIZE};
use vhost_user_rdma_tests::verbs::{QpInit, Verbs};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::mem::PageListMode;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use crate::requests::qp_req;
use crate::world::{create_base, finish_base, gid, hostile, hostile_in, opts, World, IOVA, RW};

/// Limits that allow several 4 GiB regions.
fn big_mr_limits() -> Limits {
    Limits {
        max_mr_size: 16 * GIB,
        max_mr_bytes: 64 * GIB,
        ..Limits::default()
    }
}

/// Small commands submitted in front of the huge registrations.
const STORM_SMALL: u16 = 8;

/// Publishes, without waiting, `STORM_SMALL` small commands, then `n`
/// REG_MRs of 2^20 pages (4 GiB each, all backed by four guest pages, in
/// 2048 indirect list pages), then a few more small commands.
fn submit_storm_with_huge_mrs(w: &mut World, n: usize) {
    let b = w.base();
    let backing = w.a.mem().alloc_pages(4, PAGE_SIZE).unwrap();
    let many: Vec<GuestAddress> = (0..1usize << 20).map(|i| backing[i % 4]).collect();
    let list = w.va().page_list(&many, 12, PageListMode::INDIRECT).unwrap();
    let fixed = RegMrReq {
        pd_handle: b.pd,
        access: RW,
        iova: IOVA,
        length: 4 * GIB,
        buf: list.desc,
    }
    .to_bytes();
    let (qp, qp_tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
    let qp = qp.to_bytes();
    let ctx_req = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
    let ctrl = w.a.ctrl();
    ctrl.set_auto_kick(false);
    for _ in 0..STORM_SMALL / 2 {
        ctrl.submit(Opcode::ALLOC_PD, &ctx_req, PdHandleResp::SIZE)
            .unwrap();
        ctrl.submit_parts(Opcode::CREATE_QP, &[&qp, &qp_tail], CreateQpResp::SIZE)
            .unwrap();
    }
    for _ in 0..n {
        ctrl.submit_parts(Opcode::REG_MR, &[&fixed, &list.tail], RegMrResp::SIZE)
            .unwrap();
    }
    for _ in 0..4 {
        ctrl.submit(Opcode::CREATE_CTX, &[], CreateCtxResp::SIZE)
            .unwrap();
    }
    ctrl.kick().unwrap();
}

/// VM A went away: VM B's baseline QP, connected to A's, failed with it
/// (spec 18.23); record ERR as the state it must keep from now on.
fn b_qp_failed_with_a(w: &mut World) {
    let err = u32::from(QpState::ERR);
    let q = Verbs::new(&mut w.b)
        .query_qp(w.b_base.qp.handle)
        .expect("VM B: QUERY_QP");
    assert_eq!(q.attr.qp_state, err, "VM B's QP connected to VM A: {q:?}");
    w.b_base.qp_attrs.attr.qp_state = err;
    w.b_base.qp_attrs.attr.cur_qp_state = err;
}

#[test]
fn vmm_disconnects_mid_command() {
    hostile_in(World::build(big_mr_limits(), opts()), |w| {
        let b_qps = w.d.stats(1).device.resources.qp;
        let start = w.a.ctrl().vring().device_used_idx().unwrap();
        submit_storm_with_huge_mrs(w, 3);
        // Wait (bounded) until the daemon has started on the batch: the
        // small commands in front have been returned in the used ring (the
        // daemon writes each used element as it finishes the command).
        let deadline = Instant::now() + Duration::from_secs(5);
        while w
            .a
            .ctrl()
            .vring()
            .device_used_idx()
            .unwrap()
            .wrapping_sub(start)
            < STORM_SMALL
        {
            assert!(
                Instant::now() < deadline,
                "the daemon never started the batch"
            );
            std::thread::yield_now();
        }
        // Pull the plug while the huge registrations are being validated.
        w.a.disconnect();
        let s = w.d.wait_released(0);
        assert!(
            !s.connected,
            "VM A still connected after the disconnect: {s:?}"
        );
        assert!(
            s.device.resources.is_empty(),
            "VM A's objects were not all released: {:?}",
            s.device.resources
        );
        assert_eq!(
            w.d.daemon().qpns_in_use(),
            b_qps,
            "QP numbers of VM A leaked"
        );
        b_qp_failed_with_a(w);
        // The socket accepts a new VMM, which starts from nothing and works.
        w.a = w.d.connect_with(0, opts()).unwrap();
        let s = w.d.stats_connected(0, 2);
        assert!(s.connected);
        assert_eq!(s.connections, 2);
        assert!(
            s.device.resources.is_empty(),
            "objects carried over: {:?}",
            s.device.resources
        );
        let base = create_base(&mut w.a);
        w.a_base = Some(finish_base(&mut w.a, base, Some((w.b_base.qp.qpn, gid(1)))));
    });
}

/// Regression: the daemon built fresh handle tables for every connection,
/// so after a disconnect the same handle values came back and a handle from
/// before it named a new object. Spec 9.1 and 15.2: generations keep
/// advancing; handles from before do not resolve.
#[test]
fn handles_from_before_a_reconnect_do_not_resolve() {
    hostile(|w| {
        let old = w.base();
        w.a.disconnect();
        let s = w.d.wait_released(0);
        assert!(!s.connected && s.device.resources.is_empty(), "{s:?}");
        b_qp_failed_with_a(w);
        w.a = w.d.connect_with(0, opts()).unwrap();
        // The new VMM creates the same sequence of objects.
        let new = create_base(&mut w.a);
        w.a_base = Some(finish_base(&mut w.a, new, Some((w.b_base.qp.qpn, gid(1)))));
        let (ctx, pd, cq, qp, mr) = new;
        for (kind, was, now) in [
            ("context", old.ctx, ctx),
            ("PD", old.pd, pd),
            ("CQ", old.cq, cq),
            ("QP", old.qp.handle, qp.handle),
            ("MR", old.mr, mr),
        ] {
            assert_ne!(
                was, now,
                "the {kind} handle {was:#x} from before the reset was handed out again"
            );
        }
        w.expect(
            "QUERY_QP with a QP handle from before the reset",
            Status::BAD_HANDLE,
            0,
            |v| v.query_qp(old.qp.handle),
        );
    });
}
