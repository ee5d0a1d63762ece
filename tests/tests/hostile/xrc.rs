//! XRC commands out of their domains (`F_XRC`, spec 12.12, 12.28, 12.29):
//! without the feature, handles that name nothing (or another VM's
//! object), fields an XRC_TGT QP must not have, and the domain quota. Each
//! is refused with its status and detail and changes nothing.

use vhost_user_rdma_tests::verbs::{QpInit, Verbs};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{ALL_DEVICE_FEATURES, F_XRC};
use virtio_rdma_abi::ctrl::{quota, Status};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::MAX_XRCD;

use crate::world::{hostile, hostile_in, opts, World};
use vhost_user_rdma::config::Limits;

/// Offsets of the fields the details name.
const D_SRQ_XRCD: u32 = 16;
const D_SRQ_CQ: u32 = 20;
const D_QP_XRCD: u32 = 44;
const D_QP_BUF: u32 = 56;

/// Without `F_XRC` every XRC command, and both XRC QP types, are a
/// feature the guest does not have.
#[test]
fn xrc_without_f_xrc() {
    let a_opts = VmmOptions {
        driver_features: ALL_DEVICE_FEATURES & !F_XRC,
        ..opts()
    };
    hostile_in(World::build(Limits::default(), a_opts), |w| {
        let b = w.base();
        w.expect("OPEN_XRCD without F_XRC", Status::UNSUPPORTED, 0x22, |v| {
            v.open_xrcd(b.ctx)
        });
        w.expect("CLOSE_XRCD without F_XRC", Status::UNSUPPORTED, 0x23, |v| {
            v.close_xrcd(1)
        });
        w.expect(
            "CREATE_XRC_SRQ without F_XRC",
            Status::UNSUPPORTED,
            0x74,
            |v| v.create_xrc_srq(b.pd, 1, b.cq, 16),
        );
        let mut ini = QpInit::rc(b.pd, b.cq);
        ini.qp_type = QpType::XRC_INI;
        w.expect("XRC_INI without F_XRC", Status::UNSUPPORTED, 4, |v| {
            v.create_qp(&ini)
        });
    });
}

/// Handles that name no object of the VM — VM B's domain included — and
/// the fields an XRC_TGT QP must leave zero.
#[test]
fn xrc_handles_and_fields() {
    hostile(|w| {
        let b = w.base();
        let b_ctx = w.b_base.ctx;
        let theirs = w.vb().open_xrcd(b_ctx).unwrap();
        w.snapshot_b();
        w.expect("OPEN_XRCD, no such context", Status::BAD_HANDLE, 0, |v| {
            v.open_xrcd(0xdead_beef)
        });
        w.expect("CLOSE_XRCD, VM B's domain", Status::BAD_HANDLE, 0, |v| {
            v.close_xrcd(theirs)
        });
        w.expect(
            "CREATE_XRC_SRQ, VM B's domain",
            Status::BAD_HANDLE,
            D_SRQ_XRCD,
            |v| v.create_xrc_srq(b.pd, theirs, b.cq, 16),
        );
        w.expect(
            "XRC_TGT, VM B's domain",
            Status::BAD_HANDLE,
            D_QP_XRCD,
            |v| v.create_qp_raw(&Verbs::tgt_request(theirs), &[]),
        );
        let ours = w.va().open_xrcd(b.ctx).unwrap();
        w.expect(
            "CREATE_XRC_SRQ, no such CQ",
            Status::BAD_HANDLE,
            D_SRQ_CQ,
            |v| v.create_xrc_srq(b.pd, ours, 0xdead_beef, 16),
        );
        w.expect("XRC_TGT with a page list", Status::INVALID, D_QP_BUF, |v| {
            v.create_qp_raw(&Verbs::tgt_request(ours), &[0u8; 8])
        });
        let rc = QpInit::rc(b.pd, b.cq);
        w.expect("RC QP with a domain", Status::INVALID, D_QP_XRCD, |v| {
            let (mut req, tail) = v.qp_request(&rc)?;
            req.xrcd_handle = ours;
            v.create_qp_raw(&req, &tail)
        });
        // A domain in use cannot be closed, one that is not can.
        let tgt = w
            .va()
            .create_qp_raw(&Verbs::tgt_request(ours), &[])
            .unwrap();
        w.expect("CLOSE_XRCD of a domain in use", Status::BUSY, 1, |v| {
            v.close_xrcd(ours)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(tgt.qp_handle));
        w.ok("CLOSE_XRCD", |v| v.close_xrcd(ours));
    });
}

/// `MAX_XRCD` domains per instance, whichever context opened them.
#[test]
fn xrcd_quota() {
    hostile(|w| {
        let b = w.base();
        let ctx2 = w.va().create_ctx().unwrap();
        for i in 0..MAX_XRCD {
            let ctx = if i % 2 == 0 { b.ctx } else { ctx2 };
            w.va().open_xrcd(ctx).unwrap();
        }
        w.expect(
            "OPEN_XRCD beyond MAX_XRCD",
            Status::QUOTA,
            quota::XRCD,
            |v| v.open_xrcd(b.ctx),
        );
        // DESTROY_CTX gives its domains back.
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx2));
        assert_eq!(w.a_counts().xrcd, MAX_XRCD as usize / 2);
        w.ok("OPEN_XRCD", |v| v.open_xrcd(b.ctx));
    });
}
