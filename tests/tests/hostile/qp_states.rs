//! The QP state machine: transitions that are not allowed, missing and extra
//! attributes, a current state that is not the QP's, and attribute values
//! out of range (spec 13).

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::qp::{attr, QpAttr, QpState};

use crate::requests::{
    expect_modify, fresh_qp, qp_in, rc_steps, M_AV_FLOW_LABEL, M_AV_SGID_INDEX, M_AV_SL,
    M_DEST_QPN, M_EN_SQD, M_MAX_DEST_RD_ATOMIC, M_MAX_RD_ATOMIC, M_MIN_RNR_TIMER, M_PATH_MTU,
    M_PKEY_INDEX, M_PORT, M_RETRY_CNT, M_RNR_RETRY, M_RQ_PSN, M_SQ_PSN, M_TIMEOUT,
};
use crate::world::hostile;

#[test]
fn qp_transition_not_allowed() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(w, "RESET -> RTR", qp, m_rtr, rtr, Status::BAD_STATE, 0);
        expect_modify(w, "RESET -> RTS", qp, m_rts, rts, Status::BAD_STATE, 0);
        let sqd = QpAttr {
            qp_state: QpState::SQD.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RESET -> SQD",
            qp,
            attr::STATE,
            sqd,
            Status::BAD_STATE,
            0,
        );
        let sqe = QpAttr {
            qp_state: QpState::SQE.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RESET -> SQE",
            qp,
            attr::STATE,
            sqe,
            Status::BAD_STATE,
            0,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        expect_modify(w, "INIT -> RTS", qp, m_rts, rts, Status::BAD_STATE, 1);
        expect_modify(w, "INIT -> SQE", qp, attr::STATE, sqe, Status::BAD_STATE, 1);
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTR",
            qp,
            m_rtr & !attr::AV,
            QpAttr { ..rtr },
            Status::BAD_STATE,
            2,
        );
        expect_modify(w, "RTR -> INIT", qp, m_init, init, Status::BAD_STATE, 2);
        w.ok("RTR -> RTS", |v| v.modify_qp(qp, m_rts, &rts));
        expect_modify(w, "RTS -> RTR", qp, m_rtr, rtr, Status::BAD_STATE, 3);
        expect_modify(
            w,
            "RC RTS -> SQE",
            qp,
            attr::STATE,
            sqe,
            Status::BAD_STATE,
            3,
        );
        let err = QpAttr {
            qp_state: QpState::ERR.into(),
            ..QpAttr::default()
        };
        w.ok("RTS -> ERR", |v| v.modify_qp(qp, attr::STATE, &err));
        expect_modify(w, "ERR -> INIT", qp, m_init, init, Status::BAD_STATE, 6);
        expect_modify(w, "ERR -> RTS", qp, m_rts, rts, Status::BAD_STATE, 6);
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_missing_required_attribute() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(
            w,
            "RESET -> INIT without PORT",
            qp,
            m_init & !attr::PORT,
            init,
            Status::INVALID,
            attr::PORT,
        );
        expect_modify(
            w,
            "RESET -> INIT without PKEY_INDEX and ACCESS",
            qp,
            attr::STATE | attr::PORT,
            init,
            Status::INVALID,
            attr::PKEY_INDEX | attr::ACCESS,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        expect_modify(
            w,
            "INIT -> RTR without DEST_QPN and RQ_PSN",
            qp,
            m_rtr & !(attr::DEST_QPN | attr::RQ_PSN),
            rtr,
            Status::INVALID,
            attr::DEST_QPN | attr::RQ_PSN,
        );
        expect_modify(
            w,
            "INIT -> RTR with only STATE",
            qp,
            attr::STATE,
            rtr,
            Status::INVALID,
            m_rtr & !attr::STATE,
        );
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTS without SQ_PSN",
            qp,
            m_rts & !attr::SQ_PSN,
            rts,
            Status::INVALID,
            attr::SQ_PSN,
        );
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_extra_attribute() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(
            w,
            "RC RESET -> INIT with QKEY",
            qp,
            m_init | attr::QKEY,
            init,
            Status::INVALID,
            attr::QKEY,
        );
        expect_modify(
            w,
            "RESET -> INIT with CUR_STATE",
            qp,
            m_init | attr::CUR_STATE,
            init,
            Status::INVALID,
            attr::CUR_STATE,
        );
        expect_modify(
            w,
            "RESET -> INIT without PORT but with DEST_QPN",
            qp,
            (m_init & !attr::PORT) | attr::DEST_QPN,
            init,
            Status::INVALID,
            attr::PORT | attr::DEST_QPN,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTS with DEST_QPN",
            qp,
            m_rts | attr::DEST_QPN,
            rts,
            Status::INVALID,
            attr::DEST_QPN,
        );
        expect_modify(
            w,
            "RTR -> RTS with AV and PATH_MTU",
            qp,
            m_rts | attr::AV | attr::PATH_MTU,
            rts,
            Status::INVALID,
            attr::AV | attr::PATH_MTU,
        );
        // Undefined mask bits.
        expect_modify(
            w,
            "mask bit 18",
            qp,
            m_rts | (1 << 18),
            rts,
            Status::INVALID,
            1 << 18,
        );
        expect_modify(
            w,
            "mask bits 18 and 31",
            qp,
            attr::STATE | (1 << 31) | (1 << 18),
            rts,
            Status::INVALID,
            (1 << 31) | (1 << 18),
        );
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_cur_state_mismatch() {
    hostile(|w| {
        let (m_rts, rts) = rc_steps(w)[2];
        let qp = qp_in(w, 2); // RTR
                              // RTR -> RTS claiming INIT.
        let claim = QpAttr {
            cur_qp_state: QpState::INIT.into(),
            ..rts
        };
        expect_modify(
            w,
            "RTR -> RTS claiming INIT",
            qp,
            m_rts | attr::CUR_STATE,
            claim,
            Status::BAD_STATE,
            2,
        );
        // -> ERR claiming RTS.
        let err = QpAttr {
            qp_state: QpState::ERR.into(),
            cur_qp_state: QpState::RTS.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RTR -> ERR claiming RTS",
            qp,
            attr::STATE | attr::CUR_STATE,
            err,
            Status::BAD_STATE,
            2,
        );
        // Values that are no QpState at all.
        let bad_cur = QpAttr {
            cur_qp_state: 7,
            ..rts
        };
        expect_modify(
            w,
            "cur_qp_state 7",
            qp,
            m_rts | attr::CUR_STATE,
            bad_cur,
            Status::INVALID,
            12,
        );
        let bad_target = QpAttr { qp_state: 9, ..rts };
        expect_modify(w, "qp_state 9", qp, m_rts, bad_target, Status::INVALID, 8);
        let bad_target = QpAttr {
            qp_state: u32::MAX,
            ..rts
        };
        expect_modify(
            w,
            "qp_state 2^32-1",
            qp,
            attr::STATE,
            bad_target,
            Status::INVALID,
            8,
        );
        // The right claim works.
        let claim = QpAttr {
            cur_qp_state: QpState::RTR.into(),
            ..rts
        };
        w.ok("RTR -> RTS claiming RTR", |v| {
            v.modify_qp(qp, m_rts | attr::CUR_STATE, &claim)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_path_mtu_9() {
    hostile(|w| {
        let (m_rtr, rtr) = rc_steps(w)[1];
        let qp = qp_in(w, 1); // INIT
        for mtu in [9, 0, 6] {
            expect_modify(
                w,
                &format!("INIT -> RTR, path_mtu {mtu}"),
                qp,
                m_rtr,
                QpAttr {
                    path_mtu: mtu,
                    ..rtr
                },
                Status::INVALID,
                M_PATH_MTU,
            );
        }
    });
}

#[test]
fn qp_timeout_32() {
    hostile(|w| {
        let (m_rts, rts) = rc_steps(w)[2];
        let qp = qp_in(w, 2); // RTR
        for timeout in [32, u32::MAX] {
            expect_modify(
                w,
                &format!("RTR -> RTS, timeout {timeout}"),
                qp,
                m_rts,
                QpAttr { timeout, ..rts },
                Status::INVALID,
                M_TIMEOUT,
            );
        }
    });
}

#[test]
fn qp_dest_qpn_over_24_bits() {
    hostile(|w| {
        let (m_rtr, rtr) = rc_steps(w)[1];
        let qp = qp_in(w, 1); // INIT
        for dest_qpn in [1 << 24, u32::MAX] {
            expect_modify(
                w,
                &format!("INIT -> RTR, dest_qpn {dest_qpn:#x}"),
                qp,
                m_rtr,
                QpAttr { dest_qpn, ..rtr },
                Status::INVALID,
                M_DEST_QPN,
            );
        }
    });
}

#[test]
fn qp_pkey_index_1() {
    hostile(|w| {
        let (m_init, init) = rc_steps(w)[0];
        let qp = fresh_qp(w);
        for pkey_index in [1, u32::MAX] {
            expect_modify(
                w,
                &format!("RESET -> INIT, pkey_index {pkey_index}"),
                qp,
                m_init,
                QpAttr { pkey_index, ..init },
                Status::RANGE,
                M_PKEY_INDEX,
            );
        }
        expect_modify(
            w,
            "RESET -> INIT, port 2",
            qp,
            m_init,
            QpAttr { port: 2, ..init },
            Status::RANGE,
            M_PORT,
        );
        expect_modify(
            w,
            "RESET -> INIT, port 0",
            qp,
            m_init,
            QpAttr { port: 0, ..init },
            Status::RANGE,
            M_PORT,
        );
    });
}

#[test]
fn qp_other_attribute_values() {
    hostile(|w| {
        let [_, (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let (init_rd, dest_rd) = (w.dev.max_qp_init_rd_atom, w.dev.max_qp_rd_atom);
        let edit = |base: QpAttr, f: &dyn Fn(&mut QpAttr)| {
            let mut a = base;
            f(&mut a);
            a
        };
        let in_init = qp_in(w, 1);
        let cases: [(&str, QpAttr, Status, u32); 8] = [
            (
                "min_rnr_timer 32",
                edit(rtr, &|a| a.min_rnr_timer = 32),
                Status::INVALID,
                M_MIN_RNR_TIMER,
            ),
            (
                "rq_psn 2^24",
                edit(rtr, &|a| a.rq_psn = 1 << 24),
                Status::INVALID,
                M_RQ_PSN,
            ),
            (
                "max_dest_rd_atomic max + 1",
                edit(rtr, &|a| a.max_dest_rd_atomic = dest_rd + 1),
                Status::RANGE,
                M_MAX_DEST_RD_ATOMIC,
            ),
            (
                "av.flow_label 2^20",
                edit(rtr, &|a| a.av.flow_label = 1 << 20),
                Status::INVALID,
                M_AV_FLOW_LABEL,
            ),
            (
                "av.sgid_index 16 (past the table)",
                edit(rtr, &|a| a.av.sgid_index = 16),
                Status::RANGE,
                M_AV_SGID_INDEX,
            ),
            (
                "av.sgid_index 0 (the default GID, unassigned without a MAC)",
                edit(rtr, &|a| a.av.sgid_index = 0),
                Status::INVALID,
                M_AV_SGID_INDEX,
            ),
            (
                "av.sgid_index 15 (unassigned)",
                edit(rtr, &|a| a.av.sgid_index = 15),
                Status::INVALID,
                M_AV_SGID_INDEX,
            ),
            (
                "av.sl 16",
                edit(rtr, &|a| a.av.sl = 16),
                Status::INVALID,
                M_AV_SL,
            ),
        ];
        for (what, a, status, detail) in cases {
            let what = format!("INIT -> RTR, {what}");
            expect_modify(w, &what, in_init, m_rtr, a, status, detail);
        }
        let in_rtr = qp_in(w, 2);
        let cases: [(&str, QpAttr, Status, u32); 4] = [
            (
                "retry_cnt 8",
                edit(rts, &|a| a.retry_cnt = 8),
                Status::INVALID,
                M_RETRY_CNT,
            ),
            (
                "rnr_retry 8",
                edit(rts, &|a| a.rnr_retry = 8),
                Status::INVALID,
                M_RNR_RETRY,
            ),
            (
                "sq_psn 2^24",
                edit(rts, &|a| a.sq_psn = 1 << 24),
                Status::INVALID,
                M_SQ_PSN,
            ),
            (
                "max_rd_atomic max + 1",
                edit(rts, &|a| a.max_rd_atomic = init_rd + 1),
                Status::RANGE,
                M_MAX_RD_ATOMIC,
            ),
        ];
        for (what, a, status, detail) in cases {
            let what = format!("RTR -> RTS, {what}");
            expect_modify(w, &what, in_rtr, m_rts, a, status, detail);
        }
        w.ok("RTR -> RTS", |v| v.modify_qp(in_rtr, m_rts, &rts));
        let sqd = QpAttr {
            qp_state: QpState::SQD.into(),
            en_sqd_async_notify: 2,
            ..QpAttr::default()
        };
        let mask = attr::STATE | attr::EN_SQD_ASYNC_NOTIFY;
        expect_modify(
            w,
            "RTS -> SQD, en_sqd_async_notify 2",
            in_rtr,
            mask,
            sqd,
            Status::INVALID,
            M_EN_SQD,
        );
    });
}
