//! The GSI QP of ABI version 3 (spec 18.26): creating a second one, or one
//! it may not have, and giving it, or another QP, a Q_Key it may not have.

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::verbs::{ud_transitions, QpInit};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{ALL_DEVICE_FEATURES, F_GSI};
use virtio_rdma_abi::ctrl::{Status, DETAIL_NONE};
use virtio_rdma_abi::qp::{attr, QpAttr, QpState, GSI_QKEY, GSI_QPN};

use crate::world::{hostile, hostile_in, opts, World};

/// QP 1 once per VM: a second GSI QP (same PD, another context) is BUSY
/// (detail 4); one with an SRQ or deeper queues than 256 is refused; none
/// of them consumes anything. The GSI QP's number is 1, not one of the
/// RNIC's.
#[test]
fn a_second_or_oversized_gsi_qp() {
    hostile(|w| {
        let b = w.base();
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let with_srq = QpInit {
            srq,
            rq_depth: 0,
            ..QpInit::gsi(b.pd, b.cq)
        };
        w.expect("GSI QP with an SRQ", Status::INVALID, 16, |v| {
            v.create_qp(&with_srq)
        });
        for (what, sq, rq, detail) in [("sq_depth 512", 512, 16, 24), ("rq_depth 512", 16, 512, 28)]
        {
            let init = QpInit {
                sq_depth: sq,
                rq_depth: rq,
                ..QpInit::gsi(b.pd, b.cq)
            };
            w.expect(&format!("GSI QP, {what}"), Status::RANGE, detail, |v| {
                v.create_qp(&init)
            });
        }
        let qpns = w.d.daemon().qpns_in_use();
        let gsi = w.ok("CREATE_QP GSI", |v| v.create_qp(&QpInit::gsi(b.pd, b.cq)));
        assert_eq!(gsi.qpn, GSI_QPN);
        assert_eq!(w.d.daemon().qpns_in_use(), qpns, "QP 1 is not the RNIC's");
        w.expect("a second GSI QP", Status::BUSY, 4, |v| {
            v.create_qp(&QpInit::gsi(b.pd, b.cq))
        });
        let ctx = w.ok("CREATE_CTX", |v| v.create_ctx());
        let pd = w.ok("ALLOC_PD", |v| v.alloc_pd(ctx));
        let cq = w.ok("CREATE_CQ", |v| v.create_cq(ctx, 16));
        w.expect("a GSI QP in another context", Status::BUSY, 4, |v| {
            v.create_qp(&QpInit::gsi(pd, cq))
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(gsi.handle));
        // Gone with DESTROY_CTX too.
        let again = w.ok("CREATE_QP GSI in the other context", |v| {
            v.create_qp(&QpInit::gsi(pd, cq))
        });
        assert_eq!(again.qpn, GSI_QPN);
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        let last = w.ok("CREATE_QP GSI after DESTROY_CTX", |v| {
            v.create_qp(&QpInit::gsi(b.pd, b.cq))
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(last.handle));
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));
    });
}

/// The GSI QP's Q_Key is the GSI's (`INVALID` at `qkey`'s offset for any
/// other); no other QP may have a privileged one (`DENIED`); the GSI QP
/// takes no RC attribute (an address vector: `INVALID`, the extra bit).
#[test]
fn qkeys_of_the_gsi_qp_and_the_others() {
    hostile(|w| {
        let b = w.base();
        let gsi = w.ok("CREATE_QP GSI", |v| v.create_qp(&QpInit::gsi(b.pd, b.cq)));
        let ud = w.ok("CREATE_QP UD", |v| v.create_qp(&QpInit::ud(b.pd, b.cq)));
        let [(m_init, init), (m_rtr, rtr), _] = ud_transitions(GSI_QKEY);
        for qkey in [0, 0x1111, 0x8000_0000, 0xffff_ffff] {
            let a = QpAttr { qkey, ..init };
            w.expect(
                &format!("GSI QP, qkey {qkey:#x}"),
                Status::INVALID,
                28,
                |v| v.modify_qp(gsi.handle, m_init, &a),
            );
        }
        w.expect("UD QP, the GSI Q_Key", Status::DENIED, DETAIL_NONE, |v| {
            v.modify_qp(ud.handle, m_init, &init)
        });
        w.ok("GSI QP to INIT", |v| v.modify_qp(gsi.handle, m_init, &init));
        w.expect("GSI QP to RTR with an AV", Status::INVALID, attr::AV, |v| {
            v.modify_qp(gsi.handle, m_rtr | attr::AV, &rtr)
        });
        let q = w.ok("QUERY_QP", |v| v.query_qp(gsi.handle));
        assert_eq!(
            (q.attr.qp_state, q.attr.qkey),
            (QpState::INIT as u32, GSI_QKEY)
        );
        w.ok("DESTROY_QP", |v| v.destroy_qp(gsi.handle));
        w.ok("DESTROY_QP", |v| v.destroy_qp(ud.handle));
    });
}

/// Without `F_GSI` negotiated the GSI QP type is a feature the guest does
/// not have: UNSUPPORTED, detail 4.
#[test]
fn a_gsi_qp_without_f_gsi() {
    let a_opts = VmmOptions {
        driver_features: ALL_DEVICE_FEATURES & !F_GSI,
        ..opts()
    };
    hostile_in(World::build(Limits::default(), a_opts), |w| {
        let b = w.base();
        w.expect("GSI QP without F_GSI", Status::UNSUPPORTED, 4, |v| {
            v.create_qp(&QpInit::gsi(b.pd, b.cq))
        });
    });
}
