//! Translating the device's values into libibverbs' and back: access
//! flags, address vectors, QP state changes, completion statuses, and
//! the context value a host object carries back to its owner.
//!
//! The device's codes (spec) and libibverbs' differ in value even where
//! they mean the same thing, so every translation is an explicit table.

use rdma_sys::{
    ibv_access_flags, ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_wc_opcode, ibv_wc_status,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{attr as mask, AddressVector, QpState, QpType};

use crate::rnic_objects::QpChange;

/// The host port and source GID everything of the RNIC uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The port number.
    pub port: u8,
    /// The index of the host GID in the port's table.
    pub gid_index: u8,
}

/// The VM index and device handle an object's host context value encodes
/// (`VerbsRnic` sets it to `vm << 32 | handle`).
pub(crate) fn owner_of_context(context: usize) -> (usize, u32) {
    let v = context as u64;
    ((v >> 32) as usize, (v & 0xffff_ffff) as u32)
}

/// The context value of the object of VM `vm` with handle `handle`.
pub(crate) fn context_of(vm: usize, handle: u32) -> usize {
    (((vm as u64) << 32) | u64::from(handle)) as usize
}

/// Hop limit used when the guest leaves it 0 (RoCEv2 needs one; 64 is the
/// usual IP default).
const DEFAULT_HOP_LIMIT: u8 = 64;

/// libibverbs access flags of a memory region with device `access` flags.
pub fn mr_access(flags: u32) -> u32 {
    let table = [
        (
            access::LOCAL_WRITE,
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
        ),
        (
            access::REMOTE_READ,
            ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        ),
        (
            access::REMOTE_WRITE,
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        ),
        (
            access::REMOTE_ATOMIC,
            ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        ),
    ];
    table
        .iter()
        .filter(|(ours, _)| flags & ours != 0)
        .fold(0, |acc, (_, theirs)| acc | theirs.0)
}

/// The host address of `av`: always global (RoCE routes by GID), from the
/// RNIC's own source GID whatever the guest's `sgid_index` (0, its
/// only entry, checked by the control path).
pub fn ah_attr(av: &AddressVector, src: Source) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label & 0xf_ffff,
            sgid_index: src.gid_index,
            hop_limit: if av.hop_limit == 0 {
                DEFAULT_HOP_LIMIT
            } else {
                av.hop_limit
            },
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: av.sl & 0xf,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: src.port,
    }
}

/// Attributes each transition needs on a host QP, beyond those the guest's
/// mask names: libibverbs requires them even where the device has defaults
/// (spec 13.3), and the device's attributes after the change hold a value
/// for every one of them.
fn required(qp_type: QpType, from: QpState, to: QpState) -> u32 {
    let rc = qp_type == QpType::RC;
    let uc = qp_type == QpType::UC;
    match (from, to) {
        (QpState::RESET, QpState::INIT) if rc || uc => mask::PKEY_INDEX | mask::PORT | mask::ACCESS,
        (QpState::RESET, QpState::INIT) => mask::PKEY_INDEX | mask::PORT | mask::QKEY,
        (QpState::INIT, QpState::RTR) if uc => {
            mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN
        }
        (QpState::INIT, QpState::RTR) if rc => {
            mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER
        }
        (QpState::RTR, QpState::RTS) if rc => {
            mask::SQ_PSN | mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_RD_ATOMIC
        }
        (QpState::RTR, QpState::RTS) => mask::SQ_PSN,
        _ => 0,
    }
}

/// Which attributes a QP type may carry at all (libibverbs refuses a UD
/// QP's change that names an RC attribute).
fn allowed(qp_type: QpType) -> u32 {
    let common = mask::STATE
        | mask::CUR_STATE
        | mask::PKEY_INDEX
        | mask::PORT
        | mask::SQ_PSN
        | mask::EN_SQD_ASYNC_NOTIFY;
    match qp_type {
        QpType::UD => common | mask::QKEY,
        // No acknowledgements: none of RC's timers, retries or reads.
        QpType::UC => {
            common | mask::ACCESS | mask::AV | mask::PATH_MTU | mask::RQ_PSN | mask::DEST_QPN
        }
        _ => {
            common
                | mask::ACCESS
                | mask::AV
                | mask::PATH_MTU
                | mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::RQ_PSN
                | mask::MAX_RD_ATOMIC
                | mask::MIN_RNR_TIMER
                | mask::MAX_DEST_RD_ATOMIC
                | mask::DEST_QPN
        }
    }
}

/// The host change for device change `c` of a QP of `qp_type`: the
/// attributes and libibverbs' mask.
pub fn modify(c: &QpChange<'_>, qp_type: QpType, src: Source) -> (ibv_qp_attr, i32) {
    let a = c.attr;
    let want = (c.mask | mask::STATE | required(qp_type, c.from, c.to)) & allowed(qp_type);
    // SAFETY: plain C structure for which all-zero is valid.
    let mut h: ibv_qp_attr = unsafe { std::mem::zeroed() };
    h.qp_state = c.to as u32;
    h.cur_qp_state = c.from as u32;
    h.qp_access_flags = mr_access(a.access) & !ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    h.pkey_index = 0;
    h.port_num = src.port;
    h.qkey = a.qkey;
    h.path_mtu = a.path_mtu;
    h.timeout = clamp_u8(a.timeout);
    h.retry_cnt = clamp_u8(a.retry_cnt);
    h.rnr_retry = clamp_u8(a.rnr_retry);
    h.min_rnr_timer = clamp_u8(a.min_rnr_timer);
    h.rq_psn = a.rq_psn & 0xff_ffff;
    h.sq_psn = a.sq_psn & 0xff_ffff;
    h.dest_qp_num = a.dest_qpn & 0xff_ffff;
    h.max_rd_atomic = clamp_u8(a.max_rd_atomic);
    h.max_dest_rd_atomic = clamp_u8(a.max_dest_rd_atomic);
    h.en_sqd_async_notify = u8::from(a.en_sqd_async_notify != 0);
    h.ah_attr = ah_attr(&a.av, src);
    use ibv_qp_attr_mask as m;
    let table = [
        (mask::STATE, m::IBV_QP_STATE),
        (mask::ACCESS, m::IBV_QP_ACCESS_FLAGS),
        (mask::PKEY_INDEX, m::IBV_QP_PKEY_INDEX),
        (mask::PORT, m::IBV_QP_PORT),
        (mask::QKEY, m::IBV_QP_QKEY),
        (mask::AV, m::IBV_QP_AV),
        (mask::PATH_MTU, m::IBV_QP_PATH_MTU),
        (mask::TIMEOUT, m::IBV_QP_TIMEOUT),
        (mask::RETRY_CNT, m::IBV_QP_RETRY_CNT),
        (mask::RNR_RETRY, m::IBV_QP_RNR_RETRY),
        (mask::RQ_PSN, m::IBV_QP_RQ_PSN),
        (mask::MAX_RD_ATOMIC, m::IBV_QP_MAX_QP_RD_ATOMIC),
        (mask::MIN_RNR_TIMER, m::IBV_QP_MIN_RNR_TIMER),
        (mask::SQ_PSN, m::IBV_QP_SQ_PSN),
        (mask::MAX_DEST_RD_ATOMIC, m::IBV_QP_MAX_DEST_RD_ATOMIC),
        (mask::DEST_QPN, m::IBV_QP_DEST_QPN),
        (mask::EN_SQD_ASYNC_NOTIFY, m::IBV_QP_EN_SQD_ASYNC_NOTIFY),
    ];
    let host = table
        .iter()
        .filter(|(ours, _)| want & ours != 0)
        .fold(0u32, |acc, (_, theirs)| acc | theirs.0);
    (h, i32::try_from(host).unwrap_or(i32::MAX))
}

fn clamp_u8(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// The device's status for a host completion status.
pub fn wc_status(s: u32) -> WcStatus {
    use ibv_wc_status as h;
    match s {
        h::IBV_WC_SUCCESS => WcStatus::SUCCESS,
        h::IBV_WC_LOC_LEN_ERR => WcStatus::LOC_LEN_ERR,
        h::IBV_WC_LOC_QP_OP_ERR => WcStatus::LOC_QP_OP_ERR,
        h::IBV_WC_LOC_PROT_ERR => WcStatus::LOC_PROT_ERR,
        h::IBV_WC_WR_FLUSH_ERR => WcStatus::WR_FLUSH_ERR,
        h::IBV_WC_BAD_RESP_ERR => WcStatus::BAD_RESP_ERR,
        h::IBV_WC_LOC_ACCESS_ERR => WcStatus::LOC_ACCESS_ERR,
        h::IBV_WC_REM_INV_REQ_ERR | h::IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::REM_INV_REQ_ERR,
        h::IBV_WC_REM_ACCESS_ERR => WcStatus::REM_ACCESS_ERR,
        h::IBV_WC_REM_OP_ERR | h::IBV_WC_REM_ABORT_ERR => WcStatus::REM_OP_ERR,
        h::IBV_WC_RETRY_EXC_ERR | h::IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RETRY_EXC_ERR,
        h::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RNR_RETRY_EXC_ERR,
        _ => WcStatus::FATAL_ERR,
    }
}

/// The device's opcode for a host completion opcode, if it is one the
/// device has (a host never reports others for the work the daemon posts).
pub fn wc_opcode(op: u32) -> Option<WcOpcode> {
    use ibv_wc_opcode as h;
    Some(match op {
        h::IBV_WC_SEND => WcOpcode::SEND,
        h::IBV_WC_RDMA_WRITE => WcOpcode::RDMA_WRITE,
        h::IBV_WC_RDMA_READ => WcOpcode::RDMA_READ,
        h::IBV_WC_COMP_SWAP => WcOpcode::COMP_SWAP,
        h::IBV_WC_FETCH_ADD => WcOpcode::FETCH_ADD,
        h::IBV_WC_RECV => WcOpcode::RECV,
        h::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RECV_RDMA_WITH_IMM,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_rdma_abi::qp::QpAttr;

    const SRC: Source = Source {
        port: 1,
        gid_index: 3,
    };

    #[test]
    fn access_flags_by_meaning() {
        assert_eq!(mr_access(0), 0);
        assert_eq!(mr_access(access::LOCAL_WRITE), 1);
        assert_eq!(mr_access(access::REMOTE_READ), 4);
        assert_eq!(mr_access(access::REMOTE_WRITE), 2);
        assert_eq!(mr_access(access::REMOTE_ATOMIC), 8);
        assert_eq!(mr_access(access::ALL), 15);
    }

    #[test]
    fn statuses_by_meaning() {
        assert_eq!(wc_status(ibv_wc_status::IBV_WC_SUCCESS), WcStatus::SUCCESS);
        assert_eq!(
            wc_status(ibv_wc_status::IBV_WC_WR_FLUSH_ERR),
            WcStatus::WR_FLUSH_ERR
        );
        assert_eq!(
            wc_status(ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR),
            WcStatus::RNR_RETRY_EXC_ERR
        );
        assert_eq!(
            wc_status(ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            WcStatus::REM_ACCESS_ERR
        );
        assert_eq!(wc_status(999), WcStatus::FATAL_ERR);
        assert_eq!(wc_opcode(ibv_wc_opcode::IBV_WC_RECV), Some(WcOpcode::RECV));
        assert_eq!(wc_opcode(ibv_wc_opcode::IBV_WC_BIND_MW), None);
    }

    /// RTR of an RC QP whose guest named only the state and the
    /// destination: the host still gets every attribute libibverbs
    /// requires, from the QP's attributes, and the RNIC's GID.
    #[test]
    fn rtr_carries_what_libibverbs_requires() {
        let mut attr = QpAttr {
            path_mtu: 3,
            dest_qpn: 0x1234,
            rq_psn: 0x100_0007,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..QpAttr::default()
        };
        attr.av.dgid = [0xfe; 16];
        let c = QpChange {
            qpn: 0x11,
            from: QpState::INIT,
            to: QpState::RTR,
            attr: &attr,
            mask: mask::STATE | mask::DEST_QPN,
        };
        let (h, m) = modify(&c, QpType::RC, SRC);
        use ibv_qp_attr_mask as x;
        let need = x::IBV_QP_STATE.0
            | x::IBV_QP_AV.0
            | x::IBV_QP_PATH_MTU.0
            | x::IBV_QP_DEST_QPN.0
            | x::IBV_QP_RQ_PSN.0
            | x::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | x::IBV_QP_MIN_RNR_TIMER.0;
        assert_eq!(m as u32, need);
        assert_eq!(h.qp_state, QpState::RTR as u32);
        assert_eq!(h.rq_psn, 7, "24-bit PSN");
        assert_eq!(h.ah_attr.is_global, 1);
        assert_eq!(h.ah_attr.grh.sgid_index, 3);
        assert_eq!(h.ah_attr.grh.hop_limit, DEFAULT_HOP_LIMIT);
        // SAFETY: reading the byte view of a GID union.
        assert_eq!(unsafe { h.ah_attr.grh.dgid.raw }, [0xfe; 16]);
    }

    /// A UC QP carries what the kernel requires of UC at each step and
    /// none of RC's acknowledgement attributes, even if the guest named
    /// them (the host would refuse the change).
    #[test]
    fn uc_changes_carry_uc_attributes_only() {
        use ibv_qp_attr_mask as x;
        let mut attr = QpAttr {
            path_mtu: 3,
            dest_qpn: 0x1234,
            rq_psn: 5,
            sq_psn: 6,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            ..QpAttr::default()
        };
        attr.av.dgid = [0xfe; 16];
        let rc_only = mask::MAX_DEST_RD_ATOMIC
            | mask::MIN_RNR_TIMER
            | mask::TIMEOUT
            | mask::RETRY_CNT
            | mask::RNR_RETRY
            | mask::MAX_RD_ATOMIC;
        let step = |from, to| {
            let c = QpChange {
                qpn: 0x11,
                from,
                to,
                attr: &attr,
                mask: mask::STATE | rc_only,
            };
            modify(&c, QpType::UC, SRC).1 as u32
        };
        assert_eq!(
            step(QpState::RESET, QpState::INIT),
            x::IBV_QP_STATE.0
                | x::IBV_QP_PKEY_INDEX.0
                | x::IBV_QP_PORT.0
                | x::IBV_QP_ACCESS_FLAGS.0
        );
        assert_eq!(
            step(QpState::INIT, QpState::RTR),
            x::IBV_QP_STATE.0
                | x::IBV_QP_AV.0
                | x::IBV_QP_PATH_MTU.0
                | x::IBV_QP_DEST_QPN.0
                | x::IBV_QP_RQ_PSN.0
        );
        assert_eq!(
            step(QpState::RTR, QpState::RTS),
            x::IBV_QP_STATE.0 | x::IBV_QP_SQ_PSN.0
        );
    }

    /// A UD QP never passes an RC attribute to the host, even if the guest
    /// named one.
    #[test]
    fn ud_changes_carry_ud_attributes_only() {
        let attr = QpAttr {
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        let c = QpChange {
            qpn: 0x11,
            from: QpState::RESET,
            to: QpState::INIT,
            attr: &attr,
            mask: mask::STATE | mask::ACCESS | mask::DEST_QPN,
        };
        let (_, m) = modify(&c, QpType::UD, SRC);
        use ibv_qp_attr_mask as x;
        assert_eq!(
            m as u32,
            x::IBV_QP_STATE.0 | x::IBV_QP_PKEY_INDEX.0 | x::IBV_QP_PORT.0 | x::IBV_QP_QKEY.0
        );
    }
}
