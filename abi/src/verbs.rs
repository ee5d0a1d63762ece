//! Request and response payloads of every control command.
//!
//! A request is `RequestHeader` + the command's request payload (+ a page
//! list for commands that carry a [`BufferDesc`]); a response is
//! `ResponseHeader` + the command's response payload. Commands whose table
//! entry says "none" carry no payload in that direction.

use crate::ctrl::Opcode;
use crate::mem::BufferDesc;
use crate::qp::{AddressVector, QpAttr};
use crate::wire_struct;

wire_struct! {
    /// QUERY_DEVICE response.
    pub struct DeviceAttr {
        /// Firmware version of the device implementation.
        fw_version: u64,
        /// Node GUID.
        node_guid: u64,
        /// System image GUID.
        sys_image_guid: u64,
        /// Same as the configuration field.
        max_mr_size: u64,
        /// Same as the configuration field.
        max_mr_bytes: u64,
        /// Same as the configuration field.
        page_size_cap: u64,
        /// 0x1af4, the PCI vendor ID of virtio devices, as the virtio-pci
        /// function of the device carries it (spec 12.1: why not an OUI).
        vendor_id: u32,
        /// 42, the virtio device type of the RDMA device.
        vendor_part_id: u32,
        /// Implementer-defined hardware version.
        hw_version: u32,
        /// Number of ports (1).
        phys_port_cnt: u32,
        /// Same as the configuration field.
        max_ctx: u32,
        /// Same as the configuration field.
        max_pd: u32,
        /// Same as the configuration field.
        max_cq: u32,
        /// Same as the configuration field.
        max_qp: u32,
        /// Same as the configuration field.
        max_mr: u32,
        /// Same as the configuration field.
        max_srq: u32,
        /// Same as the configuration field.
        max_ah: u32,
        /// Same as the configuration field.
        max_cqe: u32,
        /// Same as the configuration field.
        max_qp_wr: u32,
        /// Same as the configuration field.
        max_srq_wr: u32,
        /// Same as the configuration field.
        max_send_sge: u32,
        /// Same as the configuration field.
        max_recv_sge: u32,
        /// Same as the configuration field.
        max_inline_data: u32,
        /// Same as the configuration field.
        max_inline_pages: u32,
        /// Same as the configuration field.
        max_qp_rd_atom: u32,
        /// Maximum outstanding RDMA READ/atomic a QP may initiate.
        max_qp_init_rd_atom: u32,
        /// Maximum pages of one memory region.
        max_mr_pages: u32,
        /// 0: no atomics; 1: atomics are atomic with respect to this device.
        atomic_caps: u32,
        /// Longest time the device takes to acknowledge a request as
        /// responder, IB encoding: 4.096 µs × 2^value, 0 to 31.
        local_ca_ack_delay: u32,
        /// With `F_MEM_MGT`: the local DMA key, an `lkey` whose SGEs name
        /// guest-physical addresses of the instance's RAM directly (local
        /// access only, never an `rkey`). Zero without `F_MEM_MGT`.
        local_dma_lkey: u32,
        /// With `F_MEM_MGT`: the largest `max_num_sg` of `ALLOC_MR`, and so
        /// the largest page count of one `REG_MR` work request. Zero
        /// without `F_MEM_MGT`.
        max_fast_reg_pages: u32,
        /// Must be zero.
        reserved: u32,
    }
}

wire_struct! {
    /// QUERY_PORT request.
    pub struct QueryPortReq {
        /// Port number (1).
        port: u32,
    }
}

wire_struct! {
    /// QUERY_PORT response.
    pub struct PortAttr {
        /// Port state: 1 down, 4 active.
        state: u32,
        /// Largest supported path MTU (an `Mtu` value).
        max_mtu: u32,
        /// Active MTU (an `Mtu` value).
        active_mtu: u32,
        /// GID table length.
        gid_tbl_len: u32,
        /// P_Key table length (1).
        pkey_tbl_len: u32,
        /// Largest message in bytes.
        max_msg_size: u32,
        /// Link rate in Mbit/s (informational).
        link_rate_mbps: u32,
        /// Maximum UD payload bytes (the active MTU in bytes).
        max_ud_payload: u32,
        /// Physical port state, IB encoding: `PHYS_STATE_LINK_UP` when
        /// `state` is active, `PHYS_STATE_DISABLED` when it is down.
        phys_state: u32,
        /// Link speed per lane, a `SPEED_*` value ([`port_speed_width`]).
        active_speed: u32,
        /// Link width, a `WIDTH_*` value ([`port_speed_width`]).
        active_width: u32,
    }
}

/// The number of the device's only port: the value of every `port` field,
/// and the `handle` of the port events `PORT_ACTIVE`, `PORT_ERROR` and
/// `GID_CHANGE` (spec 14.2), as Linux's `ib_event.element.port_num` needs.
pub const PORT_NUM: u32 = 1;

/// Port state value: down.
pub const PORT_STATE_DOWN: u32 = 1;
/// Port state value: active.
pub const PORT_STATE_ACTIVE: u32 = 4;
/// Physical port state (IB `PortPhysicalState`, Linux `ib_port_phys_state`)
/// reported with `PORT_STATE_DOWN`: disabled.
pub const PHYS_STATE_DISABLED: u32 = 3;
/// Physical port state reported with `PORT_STATE_ACTIVE`: link up.
pub const PHYS_STATE_LINK_UP: u32 = 5;

/// Link speed per lane (Linux `enum ib_port_speed`): 2.5 Gbit/s.
pub const SPEED_SDR: u32 = 1;
/// 5 Gbit/s per lane.
pub const SPEED_DDR: u32 = 2;
/// 10 Gbit/s per lane.
pub const SPEED_QDR: u32 = 4;
/// 10 Gbit/s per lane (64b/66b encoded).
pub const SPEED_FDR10: u32 = 8;
/// 14 Gbit/s per lane.
pub const SPEED_FDR: u32 = 16;
/// 25 Gbit/s per lane.
pub const SPEED_EDR: u32 = 32;
/// 50 Gbit/s per lane.
pub const SPEED_HDR: u32 = 64;
/// 100 Gbit/s per lane.
pub const SPEED_NDR: u32 = 128;
/// 200 Gbit/s per lane.
pub const SPEED_XDR: u32 = 256;

/// Link width (Linux `enum ib_port_width`): one lane.
pub const WIDTH_1X: u32 = 1;
/// Two lanes.
pub const WIDTH_2X: u32 = 16;
/// Four lanes.
pub const WIDTH_4X: u32 = 2;
/// Eight lanes.
pub const WIDTH_8X: u32 = 4;
/// Twelve lanes.
pub const WIDTH_12X: u32 = 8;

/// `PortAttr.active_speed` and `active_width` for a port of
/// `link_rate_mbps` (spec 12.2): the pair Linux reports for an Ethernet
/// port of that speed whose lane count is unknown, so that the rate a guest
/// computes from them (speed × width) matches the link rate where one of
/// the pairs does.
pub const fn port_speed_width(link_rate_mbps: u32) -> (u32, u32) {
    match link_rate_mbps {
        0..=1_000 => (SPEED_SDR, WIDTH_1X),
        1_001..=10_000 => (SPEED_FDR10, WIDTH_1X),
        10_001..=20_000 => (SPEED_DDR, WIDTH_4X),
        20_001..=25_000 => (SPEED_EDR, WIDTH_1X),
        25_001..=40_000 => (SPEED_FDR10, WIDTH_4X),
        40_001..=50_000 => (SPEED_EDR, WIDTH_2X),
        50_001..=100_000 => (SPEED_EDR, WIDTH_4X),
        100_001..=200_000 => (SPEED_HDR, WIDTH_4X),
        _ => (SPEED_NDR, WIDTH_4X),
    }
}

/// GID type value: RoCE v2 (IPv4-mapped or IPv6 GIDs over UDP).
pub const GID_TYPE_ROCE_V2: u32 = 2;

wire_struct! {
    /// QUERY_GID request.
    pub struct QueryGidReq {
        /// Port number (1).
        port: u32,
        /// GID table index.
        index: u32,
    }
}

wire_struct! {
    /// QUERY_GID response.
    pub struct QueryGidResp {
        /// The GID.
        gid: [u8; 16],
        /// GID type (`GID_TYPE_ROCE_V2`).
        gid_type: u32,
        /// Must be zero.
        reserved: u32,
    }
}

wire_struct! {
    /// CREATE_CTX request.
    pub struct CreateCtxReq {
        /// Guest-physical address of the context's doorbell header
        /// ([`crate::datapath::CtxDoorbell`], 64 bytes, 64-byte aligned).
        db_gpa: u64,
    }
}

wire_struct! {
    /// CREATE_CTX response.
    pub struct CreateCtxResp {
        /// Handle of the new context.
        ctx_handle: u32,
        /// Index of the context's doorbell page in the shared memory region,
        /// or `u32::MAX` when `F_SHMEM_DOORBELL` is not negotiated.
        doorbell_page: u32,
    }
}

wire_struct! {
    /// DESTROY_CTX, ALLOC_PD and OPEN_XRCD request.
    pub struct CtxHandleReq {
        /// A context handle.
        ctx_handle: u32,
    }
}

wire_struct! {
    /// CLOSE_XRCD request and OPEN_XRCD response (`F_XRC`).
    pub struct XrcdHandle {
        /// An XRC domain handle.
        xrcd_handle: u32,
    }
}

/// Most XRC domains one device instance has open at once (`F_XRC`).
pub const MAX_XRCD: u32 = 64;

wire_struct! {
    /// DEALLOC_PD request.
    pub struct PdHandleReq {
        /// A PD handle.
        pd_handle: u32,
    }
}

wire_struct! {
    /// ALLOC_PD response.
    pub struct PdHandleResp {
        /// Handle of the new PD.
        pd_handle: u32,
    }
}

wire_struct! {
    /// CREATE_CQ request (followed by the page list of `buf`).
    pub struct CreateCqReq {
        /// Owning context.
        ctx_handle: u32,
        /// Number of CQEs, a power of two.
        depth: u32,
        /// Guest-physical address of the CQ's doorbell record.
        db_gpa: u64,
        /// CQ ring memory: `depth * CQE_SIZE` bytes.
        buf: BufferDesc,
    }
}

wire_struct! {
    /// DESTROY_CQ request.
    pub struct CqHandleReq {
        /// A CQ handle.
        cq_handle: u32,
    }
}

wire_struct! {
    /// CREATE_CQ response.
    pub struct CqHandleResp {
        /// Handle of the new CQ.
        cq_handle: u32,
    }
}

wire_struct! {
    /// RESIZE_CQ request (`F_RESIZE`; followed by the page list of `buf`).
    /// The response is [`CqHandleResp`], the CQ's handle unchanged.
    pub struct ResizeCqReq {
        /// The CQ.
        cq_handle: u32,
        /// New number of CQEs, a power of two, at least the entries the
        /// driver has not consumed yet.
        depth: u32,
        /// The new ring: `depth * CQE_SIZE` bytes.
        buf: BufferDesc,
    }
}

wire_struct! {
    /// REG_MR request (followed by the page list of `buf`).
    pub struct RegMrReq {
        /// Protection domain.
        pd_handle: u32,
        /// Access flags ([`crate::mem::access`]).
        access: u32,
        /// Address the region is known by in work requests (guest virtual).
        iova: u64,
        /// Length in bytes.
        length: u64,
        /// The pages backing the region.
        buf: BufferDesc,
    }
}

wire_struct! {
    /// REG_MR response.
    pub struct RegMrResp {
        /// Handle of the new MR.
        mr_handle: u32,
        /// Local key.
        lkey: u32,
        /// Remote key (0 when no remote access was granted).
        rkey: u32,
    }
}

wire_struct! {
    /// DEREG_MR request.
    pub struct MrHandleReq {
        /// An MR handle.
        mr_handle: u32,
    }
}

/// `ReregMrReq::flags` bit: new pages, `iova` and `length` (`buf`).
pub const REREG_TRANSLATION: u32 = 1 << 0;
/// `ReregMrReq::flags` bit: a new protection domain (`pd_handle`).
pub const REREG_PD: u32 = 1 << 1;
/// `ReregMrReq::flags` bit: new access flags (`access`).
pub const REREG_ACCESS: u32 = 1 << 2;
/// Every `ReregMrReq::flags` bit.
pub const REREG_ALL: u32 = REREG_TRANSLATION | REREG_PD | REREG_ACCESS;

wire_struct! {
    /// REREG_MR request (`F_RESIZE`; followed by the page list of `buf`,
    /// empty without `REREG_TRANSLATION`). The response is [`RegMrResp`]:
    /// the same `mr_handle` and `lkey`, the same `rkey` once the region
    /// has one.
    pub struct ReregMrReq {
        /// The MR (a `REG_MR` region).
        mr_handle: u32,
        /// `REREG_*` bits: what changes (at least one).
        flags: u32,
        /// New protection domain (`REREG_PD`), of the MR's context.
        pd_handle: u32,
        /// New access flags (`REREG_ACCESS`).
        access: u32,
        /// New address (`REREG_TRANSLATION`).
        iova: u64,
        /// New length in bytes (`REREG_TRANSLATION`).
        length: u64,
        /// The new pages (`REREG_TRANSLATION`; all zero otherwise).
        buf: BufferDesc,
    }
}

wire_struct! {
    /// ALLOC_MR request (`F_MEM_MGT`): an MR for fast registration, free
    /// until a `REG_MR` work request registers it. The response is
    /// [`RegMrResp`], `lkey` and `rkey` the same key.
    pub struct AllocMrReq {
        /// A PD handle.
        pd_handle: u32,
        /// Most pages one `REG_MR` work request may give it: 1 to
        /// `DeviceAttr.max_fast_reg_pages`.
        max_num_sg: u32,
    }
}

wire_struct! {
    /// ATTACH_MCAST and DETACH_MCAST request (`F_MCAST`).
    pub struct McastReq {
        /// A UD QP.
        qp_handle: u32,
        /// Must be zero.
        reserved: u32,
        /// The group: a multicast GID ([`is_multicast_gid`]).
        mgid: [u8; 16],
    }
}

/// The destination QP number of a UD send to a multicast group: the
/// message goes to every QP attached to the group its AH's `dgid` names.
pub const MCAST_QPN: u32 = 0x00ff_ffff;
/// Most groups the QPs of one device instance are attached to.
pub const MAX_MCAST_GRP: u32 = 64;
/// Most QPs of one device instance attached to one group.
pub const MAX_MCAST_QP_ATTACH: u32 = 16;

/// Whether `gid` names a multicast group: an IPv6 multicast address
/// (`ff00::/8`), or an IPv4-mapped one in `224.0.0.0/4` (RoCE v2's groups
/// of IPv4 multicast addresses).
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    let mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    gid[0] == 0xff || (mapped && gid[12] & 0xf0 == 0xe0)
}

wire_struct! {
    /// ALLOC_MW request (`F_MW`).
    pub struct AllocMwReq {
        /// A PD handle.
        pd_handle: u32,
        /// `MW_TYPE_1` or `MW_TYPE_2`.
        mw_type: u32,
    }
}

wire_struct! {
    /// ALLOC_MW response.
    pub struct AllocMwResp {
        /// Handle of the new window.
        mw_handle: u32,
        /// Its key: bits 31 to 8 its own, bits 7 to 0 the first consumer
        /// byte.
        rkey: u32,
    }
}

wire_struct! {
    /// DEALLOC_MW request.
    pub struct MwHandleReq {
        /// A memory window handle.
        mw_handle: u32,
    }
}

/// `AllocMwReq.mw_type`: a type 1 window, bound by a work request of any
/// QP of its PD, usable through every QP of its PD, never invalidated.
pub const MW_TYPE_1: u32 = 1;
/// `AllocMwReq.mw_type`: a type 2 window, bound by a work request of a QP
/// of its PD, usable through that QP only, invalidated by `LOCAL_INV` or
/// `SEND_WITH_INV`.
pub const MW_TYPE_2: u32 = 2;

wire_struct! {
    /// CREATE_QP request (followed by the page list of `buf`).
    pub struct CreateQpReq {
        /// Protection domain.
        pd_handle: u32,
        /// One of `QpType`.
        qp_type: u32,
        /// CQ for send completions.
        send_cq: u32,
        /// CQ for receive completions.
        recv_cq: u32,
        /// SRQ handle, or 0 for a QP with its own receive queue.
        srq_handle: u32,
        /// `QP_FLAG_*` bits.
        flags: u32,
        /// Send queue depth, a power of two.
        sq_depth: u32,
        /// Receive queue depth, a power of two; 0 when `srq_handle` is set.
        rq_depth: u32,
        /// Scatter/gather entries per send WQE.
        max_send_sge: u32,
        /// Scatter/gather entries per receive WQE.
        max_recv_sge: u32,
        /// Inline data bytes per send WQE.
        max_inline_data: u32,
        /// XRC_TGT: its XRC domain (`F_XRC`); zero for every other type.
        xrcd_handle: u32,
        /// Guest-physical address of the QP's doorbell record.
        db_gpa: u64,
        /// Send and receive rings (layout from `qp_buffer_layout`).
        buf: BufferDesc,
    }
}

wire_struct! {
    /// CREATE_QP response.
    pub struct CreateQpResp {
        /// Handle of the new QP.
        qp_handle: u32,
        /// QP number used on the wire.
        qpn: u32,
        /// log2 of the send WQE stride.
        sq_wqe_shift: u32,
        /// log2 of the receive WQE stride.
        rq_wqe_shift: u32,
        /// Offset of the receive ring in the buffer.
        rq_offset: u32,
        /// Doorbell slot of the QP in its context's doorbell page, or
        /// `DB_NONE` (guest-RAM doorbell mode).
        db_slot: u32,
    }
}

wire_struct! {
    /// MODIFY_QP request.
    pub struct ModifyQpReq {
        /// The QP.
        qp_handle: u32,
        /// Which attributes to apply (`attr::*`).
        attr_mask: u32,
        /// The attributes.
        attr: QpAttr,
    }
}

wire_struct! {
    /// QUERY_QP and DESTROY_QP request.
    pub struct QpHandleReq {
        /// A QP handle.
        qp_handle: u32,
    }
}

wire_struct! {
    /// QUERY_QP response.
    pub struct QueryQpResp {
        /// Current attributes; `qp_state` and `cur_qp_state` both hold the
        /// current state.
        attr: QpAttr,
        /// One of `QpType`.
        qp_type: u32,
        /// QP number.
        qpn: u32,
        /// Send queue depth.
        sq_depth: u32,
        /// Receive queue depth.
        rq_depth: u32,
        /// Scatter/gather entries per send WQE.
        max_send_sge: u32,
        /// Scatter/gather entries per receive WQE.
        max_recv_sge: u32,
        /// Inline data bytes per send WQE.
        max_inline_data: u32,
        /// SRQ handle or 0.
        srq_handle: u32,
    }
}

wire_struct! {
    /// CREATE_AH request.
    pub struct CreateAhReq {
        /// Protection domain.
        pd_handle: u32,
        /// Port number (1).
        port: u32,
        /// Destination.
        av: AddressVector,
    }
}

wire_struct! {
    /// DESTROY_AH request.
    pub struct AhHandleReq {
        /// An AH handle.
        ah_handle: u32,
    }
}

wire_struct! {
    /// CREATE_AH response.
    pub struct AhHandleResp {
        /// Handle of the new AH.
        ah_handle: u32,
    }
}

wire_struct! {
    /// CREATE_SRQ request (followed by the page list of `buf`).
    pub struct CreateSrqReq {
        /// Protection domain.
        pd_handle: u32,
        /// Number of WQEs, a power of two.
        depth: u32,
        /// Scatter/gather entries per WQE.
        max_sge: u32,
        /// Limit: 0 disarmed, otherwise less than `depth`.
        limit: u32,
        /// Guest-physical address of the SRQ's doorbell record.
        db_gpa: u64,
        /// Ring memory: `depth << recv_wqe_shift(max_sge)` bytes.
        buf: BufferDesc,
    }
}

wire_struct! {
    /// CREATE_SRQ response.
    pub struct CreateSrqResp {
        /// Handle of the new SRQ.
        srq_handle: u32,
        /// log2 of the WQE stride.
        wqe_shift: u32,
        /// Doorbell slot of the SRQ in its context's doorbell page, or
        /// `DB_NONE` (guest-RAM doorbell mode).
        db_slot: u32,
        /// An XRC SRQ's number, which XRC_INI senders name (`CREATE_XRC_SRQ`);
        /// zero for any other SRQ.
        srqn: u32,
    }
}

wire_struct! {
    /// CREATE_XRC_SRQ request (`F_XRC`; followed by the page list of
    /// `buf`): a [`CreateSrqReq`] with the XRC domain and the CQ its
    /// receives complete on.
    pub struct CreateXrcSrqReq {
        /// Protection domain.
        pd_handle: u32,
        /// Number of WQEs, a power of two.
        depth: u32,
        /// Scatter/gather entries per WQE.
        max_sge: u32,
        /// Limit: 0 disarmed, otherwise less than `depth`.
        limit: u32,
        /// The XRC domain.
        xrcd_handle: u32,
        /// The CQ of its receive completions.
        cq_handle: u32,
        /// Guest-physical address of the SRQ's doorbell record.
        db_gpa: u64,
        /// Ring memory: `depth << recv_wqe_shift(max_sge)` bytes.
        buf: BufferDesc,
    }
}

/// `ModifySrqReq::attr_mask` bit: change the depth (`F_RESIZE`; the
/// request is then a [`ModifySrqResizeReq`]).
pub const SRQ_ATTR_MAX_WR: u32 = 1 << 0;
/// `ModifySrqReq::attr_mask` bit: arm the limit.
pub const SRQ_ATTR_LIMIT: u32 = 1 << 1;

wire_struct! {
    /// MODIFY_SRQ request.
    pub struct ModifySrqReq {
        /// The SRQ.
        srq_handle: u32,
        /// `SRQ_ATTR_*` bits.
        attr_mask: u32,
        /// New depth (`SRQ_ATTR_MAX_WR`).
        max_wr: u32,
        /// New limit (`SRQ_ATTR_LIMIT`).
        limit: u32,
    }
}

wire_struct! {
    /// MODIFY_SRQ request with `SRQ_ATTR_MAX_WR` (`F_RESIZE`): a
    /// [`ModifySrqReq`] extended by the new ring, followed by its page
    /// list. A request without `SRQ_ATTR_MAX_WR` is a [`ModifySrqReq`].
    pub struct ModifySrqResizeReq {
        /// The SRQ.
        srq_handle: u32,
        /// `SRQ_ATTR_*` bits, `SRQ_ATTR_MAX_WR` among them.
        attr_mask: u32,
        /// New depth, a power of two.
        max_wr: u32,
        /// New limit (`SRQ_ATTR_LIMIT`).
        limit: u32,
        /// The new ring: `max_wr << wqe_shift` bytes.
        buf: BufferDesc,
    }
}

wire_struct! {
    /// QUERY_SRQ and DESTROY_SRQ request.
    pub struct SrqHandleReq {
        /// An SRQ handle.
        srq_handle: u32,
    }
}

wire_struct! {
    /// QUERY_SRQ response.
    pub struct QuerySrqResp {
        /// Number of WQEs.
        depth: u32,
        /// Scatter/gather entries per WQE.
        max_sge: u32,
        /// Current limit (0 when disarmed).
        limit: u32,
    }
}

/// Payload shapes of one command: request and response structure names
/// ("none" for no payload) and whether a page list follows the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandShape {
    /// The command.
    pub opcode: Opcode,
    /// Request payload structure, or "none".
    pub request: &'static str,
    /// Whether the request carries a page list after its fixed part.
    pub page_list: bool,
    /// Response payload structure, or "none".
    pub response: &'static str,
}

impl Opcode {
    /// The payload shapes of this command.
    pub fn shape(self) -> CommandShape {
        use Opcode::*;
        let (request, page_list, response) = match self {
            QUERY_DEVICE => ("none", false, "DeviceAttr"),
            QUERY_PORT => ("QueryPortReq", false, "PortAttr"),
            QUERY_GID => ("QueryGidReq", false, "QueryGidResp"),
            CREATE_CTX => ("CreateCtxReq", false, "CreateCtxResp"),
            DESTROY_CTX => ("CtxHandleReq", false, "none"),
            ALLOC_PD => ("CtxHandleReq", false, "PdHandleResp"),
            OPEN_XRCD => ("CtxHandleReq", false, "XrcdHandle"),
            CLOSE_XRCD => ("XrcdHandle", false, "none"),
            DEALLOC_PD => ("PdHandleReq", false, "none"),
            CREATE_CQ => ("CreateCqReq", true, "CqHandleResp"),
            DESTROY_CQ => ("CqHandleReq", false, "none"),
            RESIZE_CQ => ("ResizeCqReq", true, "CqHandleResp"),
            REG_MR => ("RegMrReq", true, "RegMrResp"),
            DEREG_MR => ("MrHandleReq", false, "none"),
            ALLOC_MR => ("AllocMrReq", false, "RegMrResp"),
            REREG_MR => ("ReregMrReq", true, "RegMrResp"),
            ALLOC_MW => ("AllocMwReq", false, "AllocMwResp"),
            DEALLOC_MW => ("MwHandleReq", false, "none"),
            CREATE_QP => ("CreateQpReq", true, "CreateQpResp"),
            MODIFY_QP => ("ModifyQpReq", false, "none"),
            QUERY_QP => ("QpHandleReq", false, "QueryQpResp"),
            DESTROY_QP => ("QpHandleReq", false, "none"),
            CREATE_AH => ("CreateAhReq", false, "AhHandleResp"),
            DESTROY_AH => ("AhHandleReq", false, "none"),
            ATTACH_MCAST | DETACH_MCAST => ("McastReq", false, "none"),
            CREATE_SRQ => ("CreateSrqReq", true, "CreateSrqResp"),
            MODIFY_SRQ => ("ModifySrqReq", false, "none"),
            QUERY_SRQ => ("SrqHandleReq", false, "QuerySrqResp"),
            DESTROY_SRQ => ("SrqHandleReq", false, "none"),
            CREATE_XRC_SRQ => ("CreateXrcSrqReq", true, "CreateSrqResp"),
        };
        CommandShape {
            opcode: self,
            request,
            page_list,
            response,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Field, Wire};

    #[test]
    fn sizes() {
        assert_eq!(crate::ctrl::RequestHeader::SIZE, 16);
        assert_eq!(crate::ctrl::ResponseHeader::SIZE, 16);
        assert_eq!(BufferDesc::SIZE, 24);
        assert_eq!(AddressVector::SIZE, 24);
        assert_eq!(QpAttr::SIZE, 96);
        assert_eq!(CreateQpReq::SIZE, 80);
        assert_eq!(ModifyQpReq::SIZE, 104);
        assert_eq!(crate::config::DeviceConfig::SIZE, 96);
        assert_eq!(crate::event::Event::SIZE, 16);
    }

    /// Spec 12.2: the table's rows, at both ends of each range, and the
    /// rate they imply covers the link rate.
    #[test]
    fn port_speed_and_width_follow_the_link_rate() {
        let per_lane_mbps = |speed| match speed {
            SPEED_SDR => 2_500,
            SPEED_DDR => 5_000,
            SPEED_QDR | SPEED_FDR10 => 10_000,
            SPEED_FDR => 14_000,
            SPEED_EDR => 25_000,
            SPEED_HDR => 50_000,
            SPEED_NDR => 100_000,
            SPEED_XDR => 200_000,
            _ => 0,
        };
        let lanes = |width| match width {
            WIDTH_1X => 1,
            WIDTH_2X => 2,
            WIDTH_4X => 4,
            WIDTH_8X => 8,
            WIDTH_12X => 12,
            _ => 0,
        };
        let rows = [
            (0, 1_000, SPEED_SDR, WIDTH_1X),
            (1_001, 10_000, SPEED_FDR10, WIDTH_1X),
            (10_001, 20_000, SPEED_DDR, WIDTH_4X),
            (20_001, 25_000, SPEED_EDR, WIDTH_1X),
            (25_001, 40_000, SPEED_FDR10, WIDTH_4X),
            (40_001, 50_000, SPEED_EDR, WIDTH_2X),
            (50_001, 100_000, SPEED_EDR, WIDTH_4X),
            (100_001, 200_000, SPEED_HDR, WIDTH_4X),
            (200_001, u32::MAX, SPEED_NDR, WIDTH_4X),
        ];
        for (lo, hi, speed, width) in rows {
            for rate in [lo, hi] {
                assert_eq!(port_speed_width(rate), (speed, width), "{rate} Mbit/s");
            }
            let implied: u64 = per_lane_mbps(speed) * lanes(width);
            assert!(
                implied >= u64::from(hi).min(400_000),
                "{lo}..={hi}: {implied}"
            );
        }
    }

    #[test]
    fn every_shape_names_a_known_structure() {
        let names: Vec<_> = crate::all_layouts().into_iter().map(|l| l.0).collect();
        for op in Opcode::ALL {
            let s = op.shape();
            for n in [s.request, s.response] {
                assert!(n == "none" || names.contains(&n), "{n}");
            }
        }
    }

    #[test]
    fn nested_parse() {
        let req = CreateCqReq {
            ctx_handle: 5,
            depth: 64,
            db_gpa: 0x1000,
            buf: BufferDesc {
                addr: 0,
                npages: 1,
                first_page_offset: 0,
                page_shift: 12,
                mode: 1,
            },
        };
        let mut bytes = req.to_bytes();
        bytes.extend_from_slice(&0x2000u64.to_le_bytes());
        let (got, rest) = CreateCqReq::parse_prefix(&bytes).unwrap();
        assert_eq!(got, req);
        assert_eq!(rest, &0x2000u64.to_le_bytes());
    }
}
