//! Typed QP attributes for MODIFY_QP, and the parameters of the
//! connection helpers.

use virtio_rdma_abi::qp::{attr, AddressVector, Mtu, QpAttr, QpState};

/// Attributes of a MODIFY_QP: every `Some` field is applied (and its mask
/// bit set). Which ones a transition requires or allows is in spec section
/// 13.2.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpAttrs {
    /// Target state.
    pub state: Option<QpState>,
    /// The state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// Access flags ([`virtio_rdma_abi::mem::access`]): the `REMOTE_*` bits
    /// allow remote operations; `LOCAL_WRITE` is accepted and has no effect
    /// on a QP (spec 10.5).
    pub access: Option<u32>,
    /// P_Key index (0).
    pub pkey_index: Option<u32>,
    /// Port (1).
    pub port: Option<u32>,
    /// Q_Key (UD).
    pub qkey: Option<u32>,
    /// Destination address (RC).
    pub av: Option<AddressVector>,
    /// Path MTU (RC).
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout exponent (RC).
    pub timeout: Option<u32>,
    /// Transport retry count (RC).
    pub retry_cnt: Option<u32>,
    /// RNR retry count, 7 = forever (RC).
    pub rnr_retry: Option<u32>,
    /// First expected receive PSN (RC).
    pub rq_psn: Option<u32>,
    /// Outstanding RDMA READ/atomic as initiator (RC).
    pub max_rd_atomic: Option<u32>,
    /// Minimum RNR NAK timer code (RC).
    pub min_rnr_timer: Option<u32>,
    /// First send PSN.
    pub sq_psn: Option<u32>,
    /// Outstanding RDMA READ/atomic as responder (RC).
    pub max_dest_rd_atomic: Option<u32>,
    /// Destination QP number (RC).
    pub dest_qpn: Option<u32>,
    /// Generate `QP_SQ_DRAINED` on reaching SQD.
    pub en_sqd_async_notify: Option<bool>,
}

impl QpAttrs {
    /// Only a state change.
    pub fn state(state: QpState) -> Self {
        QpAttrs {
            state: Some(state),
            ..QpAttrs::default()
        }
    }

    /// The attribute mask and wire attributes (unselected fields are 0).
    pub fn to_wire(&self) -> (u32, QpAttr) {
        let mut mask = 0;
        let mut a = QpAttr::default();
        macro_rules! set {
            ($field:ident, $bit:expr, $wire:ident, |$v:ident| $conv:expr) => {
                if let Some($v) = self.$field {
                    mask |= $bit;
                    a.$wire = $conv;
                }
            };
        }
        set!(state, attr::STATE, qp_state, |v| v.into());
        set!(cur_state, attr::CUR_STATE, cur_qp_state, |v| v.into());
        set!(access, attr::ACCESS, access, |v| v);
        set!(pkey_index, attr::PKEY_INDEX, pkey_index, |v| v);
        set!(port, attr::PORT, port, |v| v);
        set!(qkey, attr::QKEY, qkey, |v| v);
        set!(av, attr::AV, av, |v| v);
        set!(path_mtu, attr::PATH_MTU, path_mtu, |v| v.into());
        set!(timeout, attr::TIMEOUT, timeout, |v| v);
        set!(retry_cnt, attr::RETRY_CNT, retry_cnt, |v| v);
        set!(rnr_retry, attr::RNR_RETRY, rnr_retry, |v| v);
        set!(rq_psn, attr::RQ_PSN, rq_psn, |v| v);
        set!(max_rd_atomic, attr::MAX_RD_ATOMIC, max_rd_atomic, |v| v);
        set!(min_rnr_timer, attr::MIN_RNR_TIMER, min_rnr_timer, |v| v);
        set!(sq_psn, attr::SQ_PSN, sq_psn, |v| v);
        set!(
            max_dest_rd_atomic,
            attr::MAX_DEST_RD_ATOMIC,
            max_dest_rd_atomic,
            |v| v
        );
        set!(dest_qpn, attr::DEST_QPN, dest_qpn, |v| v);
        set!(
            en_sqd_async_notify,
            attr::EN_SQD_ASYNC_NOTIFY,
            en_sqd_async_notify,
            |v| u32::from(v)
        );
        (mask, a)
    }
}

/// Parameters of an RC connection (INIT → RTR → RTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnect {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The peer's address (its GID in `dgid`). Its `sgid_index` is
    /// replaced by [`RcConnect::sgid_index`].
    pub av: AddressVector,
    /// The index of the GID the QP sends from in the device's table;
    /// `None`: the device handle's own ([`crate::Device::gid_index`]).
    pub sgid_index: Option<u8>,
    /// Path MTU (at most the port's active MTU).
    pub path_mtu: Mtu,
    /// First PSN expected from the peer (the peer's `sq_psn`).
    pub rq_psn: u32,
    /// First PSN sent (the peer's `rq_psn`).
    pub sq_psn: u32,
    /// RDMA READ/atomic accepted as responder.
    pub max_dest_rd_atomic: u32,
    /// RDMA READ/atomic outstanding as initiator.
    pub max_rd_atomic: u32,
    /// Minimum RNR NAK timer code.
    pub min_rnr_timer: u32,
    /// Local ACK timeout exponent.
    pub timeout: u32,
    /// Transport retry count.
    pub retry_cnt: u32,
    /// RNR retry count (7: forever).
    pub rnr_retry: u32,
}

impl RcConnect {
    /// Defaults for a peer `dest_qpn` at `dgid`: sent from the device
    /// handle's GID, MTU 1024, PSNs 0, one outstanding READ/atomic each
    /// way, timeout 14, retry 7, RNR retry 7, RNR timer 12.
    pub fn new(dest_qpn: u32, dgid: [u8; 16]) -> Self {
        RcConnect {
            dest_qpn,
            av: AddressVector {
                dgid,
                hop_limit: 64,
                ..AddressVector::default()
            },
            sgid_index: None,
            path_mtu: Mtu::MTU_1024,
            rq_psn: 0,
            sq_psn: 0,
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}
