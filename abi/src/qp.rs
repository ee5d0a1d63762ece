//! Queue pair types, states, attributes and the attribute mask.

use crate::ctrl::code_enum;
use crate::wire_struct;

code_enum! {
    /// Queue pair transport types.
    pub enum QpType {
        /// Reliable connected.
        RC = 1,
        /// Unreliable datagram (requires `F_UD`).
        UD = 2,
        /// The general services interface QP, QP number 1, that carries
        /// MADs (requires `F_GSI`; at most one per instance).
        GSI = 3,
        /// Unreliable connected (requires `F_UC`).
        UC = 4,
        /// XRC initiator: the send side of an XRC connection, no receive
        /// queue (requires `F_XRC`).
        XRC_INI = 5,
        /// XRC target: the receive side of an XRC connection, no rings;
        /// its messages land in the XRC SRQ each names (requires `F_XRC`).
        XRC_TGT = 6,
    }
}

impl QpType {
    /// Whether the type sends datagrams addressed by an AH, with a GRH on
    /// every receive: UD and the GSI QP (its ring layout and states are
    /// UD's, spec 18.26).
    pub fn datagram(self) -> bool {
        matches!(self, QpType::UD | QpType::GSI)
    }

    /// Whether the type is connected to one destination QP (its `av` and
    /// `dest_qpn`): RC, UC and XRC's two halves.
    pub fn connected(self) -> bool {
        matches!(
            self,
            QpType::RC | QpType::UC | QpType::XRC_INI | QpType::XRC_TGT
        )
    }

    /// Whether the type is one of XRC's two halves.
    pub fn xrc(self) -> bool {
        matches!(self, QpType::XRC_INI | QpType::XRC_TGT)
    }
}

/// QP number of the GSI QP, in every instance.
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of the GSI QP: the only Q_Key with bit 31 set that
/// a QP may have, and only the GSI QP.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Largest message a GSI QP sends or receives: one MAD.
pub const MAX_MAD_BYTES: u32 = 256;
/// Largest `sq_depth` and `rq_depth` of a GSI QP.
pub const MAX_GSI_DEPTH: u32 = 256;

code_enum! {
    /// Queue pair states.
    pub enum QpState {
        /// Initial state after creation.
        RESET = 0,
        /// Initialised: receives may be posted.
        INIT = 1,
        /// Ready to receive.
        RTR = 2,
        /// Ready to send.
        RTS = 3,
        /// Send queue drain.
        SQD = 4,
        /// Send queue error (UD only).
        SQE = 5,
        /// Error: all work completes with flush errors.
        ERR = 6,
    }
}

code_enum! {
    /// Path MTU values.
    pub enum Mtu {
        /// 256 bytes.
        MTU_256 = 1,
        /// 512 bytes.
        MTU_512 = 2,
        /// 1024 bytes.
        MTU_1024 = 3,
        /// 2048 bytes.
        MTU_2048 = 4,
        /// 4096 bytes.
        MTU_4096 = 5,
    }
}

/// `CREATE_QP` flag: every send WQE generates a completion.
pub const QP_FLAG_SIG_ALL: u32 = 1 << 0;

/// Bits of `ModifyQpReq::attr_mask`: which fields of [`QpAttr`] to apply.
pub mod attr {
    /// `qp_state`: the new state.
    pub const STATE: u32 = 1 << 0;
    /// `cur_qp_state`: the state the driver believes the QP is in.
    pub const CUR_STATE: u32 = 1 << 1;
    /// `access`: remote access allowed on the QP.
    pub const ACCESS: u32 = 1 << 2;
    /// `pkey_index`.
    pub const PKEY_INDEX: u32 = 1 << 3;
    /// `port`.
    pub const PORT: u32 = 1 << 4;
    /// `qkey` (UD).
    pub const QKEY: u32 = 1 << 5;
    /// `av`: destination address (RC).
    pub const AV: u32 = 1 << 6;
    /// `path_mtu` (RC).
    pub const PATH_MTU: u32 = 1 << 7;
    /// `timeout` (RC).
    pub const TIMEOUT: u32 = 1 << 8;
    /// `retry_cnt` (RC).
    pub const RETRY_CNT: u32 = 1 << 9;
    /// `rnr_retry` (RC).
    pub const RNR_RETRY: u32 = 1 << 10;
    /// `rq_psn`.
    pub const RQ_PSN: u32 = 1 << 11;
    /// `max_rd_atomic` (RC).
    pub const MAX_RD_ATOMIC: u32 = 1 << 12;
    /// `min_rnr_timer` (RC).
    pub const MIN_RNR_TIMER: u32 = 1 << 13;
    /// `sq_psn`.
    pub const SQ_PSN: u32 = 1 << 14;
    /// `max_dest_rd_atomic` (RC).
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 15;
    /// `dest_qpn` (RC).
    pub const DEST_QPN: u32 = 1 << 16;
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 17;
    /// Every defined bit.
    pub const ALL: u32 = (1 << 18) - 1;
}

wire_struct! {
    /// Address vector: where a connected QP or an address handle sends to.
    pub struct AddressVector {
        /// Destination GID.
        dgid: [u8; 16],
        /// IPv6 flow label (20 bits).
        flow_label: u32,
        /// Index of the source GID in the port's GID table.
        sgid_index: u8,
        /// Hop limit / TTL.
        hop_limit: u8,
        /// Traffic class / DSCP+ECN.
        traffic_class: u8,
        /// Service level (0..=15).
        sl: u8,
    }
}

wire_struct! {
    /// Queue pair attributes (MODIFY_QP input, QUERY_QP output).
    pub struct QpAttr {
        /// New state, one of [`QpState`].
        qp_state: u32,
        /// Current state as the driver believes it, one of [`QpState`].
        cur_qp_state: u32,
        /// Remote access flags ([`crate::mem::access`] minus `LOCAL_WRITE`).
        access: u32,
        /// P_Key table index (the table has one entry).
        pkey_index: u32,
        /// Port number (1).
        port: u32,
        /// Q_Key (UD).
        qkey: u32,
        /// Path MTU, one of [`Mtu`].
        path_mtu: u32,
        /// Local ACK timeout exponent (0..=31).
        timeout: u32,
        /// Transport retry count (0..=7).
        retry_cnt: u32,
        /// RNR retry count (0..=7; 7 means infinite).
        rnr_retry: u32,
        /// Minimum RNR NAK timer code (0..=31).
        min_rnr_timer: u32,
        /// Receive packet sequence number (24 bits).
        rq_psn: u32,
        /// Send packet sequence number (24 bits).
        sq_psn: u32,
        /// Destination QP number (24 bits).
        dest_qpn: u32,
        /// Outstanding RDMA READ/atomic as initiator.
        max_rd_atomic: u32,
        /// Outstanding RDMA READ/atomic as responder.
        max_dest_rd_atomic: u32,
        /// 1: generate `QP_SQ_DRAINED` when SQD is reached.
        en_sqd_async_notify: u32,
        /// QUERY_QP only: 1 while a QP in SQD still has send work in flight.
        sq_draining: u32,
        /// Destination address (RC).
        av: AddressVector,
    }
}
