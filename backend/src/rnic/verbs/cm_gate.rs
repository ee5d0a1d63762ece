//! What `MODIFY_QP` of an RC QP the CM bridge connected must match and
//! use (docs/abi-v3-design.md section 4): its RTR must aim at the peer QP
//! and GID of its connection (`INVALID` otherwise: a guest cannot point a
//! bridged QP elsewhere), and its RTS sends from the first PSN the host CM
//! told the peer, not the guest's (a QP-less `rdma_cm_id` cannot send the
//! guest's).

use virtio_rdma_abi::qp::{attr as attr_mask, QpAttr, QpState};

use super::cm::bridge::Binding;
use crate::rnic_objects::QpChange;

/// Whether RTR attributes `a` aim at the peer of connection `b`.
pub fn rtr_matches(b: &Binding, a: &QpAttr) -> bool {
    a.dest_qpn == b.dest_qpn && a.av.dgid == b.peer_gid
}

/// The attributes to give the host QP for `change` of a QP bridged as
/// `b`: its RTR-to-RTS with the host CM's `sq_psn`; `None`: `change`'s own.
pub fn rts_attr(b: Option<&Binding>, change: &QpChange<'_>) -> Option<QpAttr> {
    let b = b?;
    let to_rts = change.from == QpState::RTR && change.to == QpState::RTS;
    if !to_rts || change.mask & attr_mask::SQ_PSN == 0 {
        return None;
    }
    let mut a = *change.attr;
    a.sq_psn = b.sq_psn;
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];

    fn binding() -> Binding {
        Binding {
            dest_qpn: 0x2a,
            peer_gid: PEER,
            rq_psn: 0x111,
            sq_psn: 0x222,
        }
    }

    fn attr(dest_qpn: u32, dgid: [u8; 16], sq_psn: u32) -> QpAttr {
        let mut a = QpAttr {
            dest_qpn,
            sq_psn,
            ..QpAttr::default()
        };
        a.av.dgid = dgid;
        a
    }

    #[test]
    fn rtr_must_aim_at_the_connections_peer() {
        let b = binding();
        assert!(rtr_matches(&b, &attr(0x2a, PEER, 0)));
        assert!(!rtr_matches(&b, &attr(0x2b, PEER, 0)), "another QP");
        let mut other = PEER;
        other[15] = 3;
        assert!(!rtr_matches(&b, &attr(0x2a, other, 0)), "another GID");
    }

    #[test]
    fn rts_sends_from_the_host_cms_psn() {
        let b = binding();
        let a = attr(0x2a, PEER, 0x777);
        let change = |from, to, mask| QpChange {
            qpn: 0x11,
            from,
            to,
            attr: &a,
            mask,
        };
        let rts = attr_mask::STATE | attr_mask::SQ_PSN;
        let fixed = rts_attr(Some(&b), &change(QpState::RTR, QpState::RTS, rts));
        assert_eq!(fixed.map(|f| f.sq_psn), Some(0x222));
        assert_eq!(fixed.map(|f| f.dest_qpn), Some(0x2a), "the rest as given");
        // Not bridged, not RTR to RTS, or no PSN given: unchanged.
        assert!(rts_attr(None, &change(QpState::RTR, QpState::RTS, rts)).is_none());
        let sqd = change(QpState::SQD, QpState::RTS, rts);
        assert!(rts_attr(Some(&b), &sqd).is_none());
        let err = change(QpState::RTS, QpState::ERR, attr_mask::STATE);
        assert!(rts_attr(Some(&b), &err).is_none());
    }
}
