//! The InfiniBand QP state machine: which transitions exist and which
//! attributes each one requires or accepts.

use virtio_rdma_abi::qp::attr::*;
use virtio_rdma_abi::qp::{QpState, QpType};

/// Attributes a transition requires and those it additionally accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Bits that must be present.
    pub required: u32,
    /// Bits that may be present.
    pub optional: u32,
}

const fn r(required: u32, optional: u32) -> Option<Rule> {
    Some(Rule { required, optional })
}

/// The rule for `from -> to` on a QP of type `t`, or `None` when the
/// transition does not exist. `STATE` itself is not part of the masks.
pub fn rule(t: QpType, from: QpState, to: QpState) -> Option<Rule> {
    use QpState::*;
    let rc = t == QpType::RC;
    // UC: RC's connection attributes without the reliability ones (no
    // acknowledgements, retries or RDMA READ and atomics).
    let uc = t == QpType::UC;
    // XRC: RC's attributes, less those of the half a QP does not have:
    // an initiator never responds, a target never requests (as Linux's
    // `ib_modify_qp_is_ok` has them).
    let ini = t == QpType::XRC_INI;
    let tgt = t == QpType::XRC_TGT;
    let connected = rc || uc || ini || tgt;
    match (from, to) {
        (_, RESET) | (_, ERR) => r(0, CUR_STATE),
        (RESET, INIT) if connected => r(PKEY_INDEX | PORT | ACCESS, 0),
        (RESET, INIT) => r(PKEY_INDEX | PORT | QKEY, 0),
        (INIT, INIT) if connected => r(0, PKEY_INDEX | PORT | ACCESS),
        (INIT, INIT) => r(0, PKEY_INDEX | PORT | QKEY),
        (INIT, RTR) if uc || ini => r(AV | PATH_MTU | DEST_QPN | RQ_PSN, ACCESS | PKEY_INDEX),
        (INIT, RTR) if tgt => r(
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ACCESS | PKEY_INDEX,
        ),
        (RTR, RTS) if ini => r(
            SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC,
            CUR_STATE | ACCESS,
        ),
        (RTR, RTS) if tgt => r(SQ_PSN | TIMEOUT, CUR_STATE | ACCESS | MIN_RNR_TIMER),
        (RTS, RTS) | (SQD, RTS) if ini => r(0, CUR_STATE | ACCESS),
        (RTS, RTS) | (SQD, RTS) if tgt => r(0, CUR_STATE | ACCESS | MIN_RNR_TIMER),
        (SQD, SQD) if ini => r(
            0,
            AV | PATH_MTU | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC | ACCESS | PKEY_INDEX,
        ),
        (SQD, SQD) if tgt => r(
            0,
            AV | TIMEOUT | MAX_DEST_RD_ATOMIC | ACCESS | PKEY_INDEX | MIN_RNR_TIMER,
        ),
        (INIT, RTR) if rc => r(
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ACCESS | PKEY_INDEX,
        ),
        (INIT, RTR) => r(0, PKEY_INDEX | QKEY),
        (RTR, RTS) if rc => r(
            SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC,
            CUR_STATE | ACCESS | MIN_RNR_TIMER,
        ),
        (RTR, RTS) if uc => r(SQ_PSN, CUR_STATE | ACCESS),
        (RTR, RTS) => r(SQ_PSN, CUR_STATE | QKEY),
        (RTS, RTS) | (SQD, RTS) if rc => r(0, CUR_STATE | ACCESS | MIN_RNR_TIMER),
        (RTS, RTS) | (SQD, RTS) if uc => r(0, CUR_STATE | ACCESS),
        (RTS, RTS) | (SQD, RTS) => r(0, CUR_STATE | QKEY),
        (RTS, SQD) => r(0, EN_SQD_ASYNC_NOTIFY),
        (SQD, SQD) if rc => r(
            0,
            AV | PATH_MTU
                | TIMEOUT
                | RETRY_CNT
                | RNR_RETRY
                | MAX_RD_ATOMIC
                | MAX_DEST_RD_ATOMIC
                | ACCESS
                | PKEY_INDEX
                | MIN_RNR_TIMER,
        ),
        (SQD, SQD) if uc => r(0, AV | PATH_MTU | ACCESS | PKEY_INDEX),
        (SQD, SQD) => r(0, PKEY_INDEX | QKEY),
        (SQE, RTS) if uc => r(0, CUR_STATE | ACCESS),
        (SQE, RTS) if !connected => r(0, CUR_STATE | QKEY),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    /// Every QP type the table has rules for.
    const TYPES: [QpType; 5] = [
        QpType::RC,
        QpType::UD,
        QpType::UC,
        QpType::XRC_INI,
        QpType::XRC_TGT,
    ];

    #[test]
    fn table_shape() {
        // Every state can go to RESET and ERR.
        for s in QpState::ALL {
            for t in TYPES {
                assert!(rule(t, *s, RESET).is_some());
                assert!(rule(t, *s, ERR).is_some());
            }
        }
        assert!(rule(QpType::RC, RESET, RTR).is_none());
        assert!(rule(QpType::RC, INIT, RTS).is_none());
        assert!(rule(QpType::RC, SQE, RTS).is_none());
        assert!(rule(QpType::UD, SQE, RTS).is_some());
        assert!(rule(QpType::RC, ERR, INIT).is_none());
        let rtr = rule(QpType::RC, INIT, RTR).unwrap();
        assert_ne!(rtr.required & DEST_QPN, 0);
        assert_eq!(rule(QpType::UD, INIT, RTR).unwrap().required, 0);
        // UC: connected, without RC's reliability attributes.
        let uc = rule(QpType::UC, INIT, RTR).unwrap();
        assert_ne!(uc.required & (AV | DEST_QPN | RQ_PSN), 0);
        assert_eq!(
            (uc.required | uc.optional) & (MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
            0
        );
        let rts = rule(QpType::UC, RTR, RTS).unwrap();
        assert_eq!(rts.required, SQ_PSN);
        assert_eq!(
            (rts.required | rts.optional) & (TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC),
            0
        );
        assert!(rule(QpType::UC, SQE, RTS).is_some());
        // XRC: a target needs no send attributes beyond the PSN and
        // timeout, an initiator none of a responder's.
        let tgt = rule(QpType::XRC_TGT, RTR, RTS).unwrap();
        assert_eq!(tgt.required, SQ_PSN | TIMEOUT);
        let ini = rule(QpType::XRC_INI, INIT, RTR).unwrap();
        assert_eq!(
            (ini.required | ini.optional) & (MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
            0
        );
        assert!(rule(QpType::XRC_INI, SQE, RTS).is_none());
        // Required and optional never overlap.
        for from in QpState::ALL {
            for to in QpState::ALL {
                for t in TYPES {
                    if let Some(r) = rule(t, *from, *to) {
                        assert_eq!(r.required & r.optional, 0);
                        assert_eq!((r.required | r.optional) & STATE, 0);
                    }
                }
            }
        }
    }
}
