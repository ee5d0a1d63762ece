//! Work requests, their WQE encoding, and work completions.

use std::ops::BitOr;

use virtio_rdma_abi::datapath::{
    BindMwWqe, Cqe, RecvWqe, RegMrWqe, SendWqe, Sge, WcOpcode, WcStatus, WrOpcode, CQE_GRH,
    CQE_SOLICITED, CQE_WITH_IMM, CQE_WITH_INV, WQE_FENCE, WQE_INLINE, WQE_SIGNALED, WQE_SOLICITED,
};
use virtio_rdma_abi::mem::{RECV_WQE_HEADER, SEND_WQE_HEADER, SGE_SIZE};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::Field;

use crate::ah::Ah;
use crate::fast_mr::FastReg;

/// Flags of a send work request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No flag.
    pub const NONE: SendFlags = SendFlags(0);
    /// Write a completion when the request completes successfully.
    pub const SIGNALED: SendFlags = SendFlags(WQE_SIGNALED);
    /// The receiver's completion is solicited.
    pub const SOLICITED: SendFlags = SendFlags(WQE_SOLICITED);
    /// Start only after earlier RDMA READs and atomics of the QP completed.
    pub const FENCE: SendFlags = SendFlags(WQE_FENCE);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The `WQE_*` bits.
    pub fn bits(self) -> u8 {
        self.0
    }
}

impl BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data (network order as given by the application).
        imm: u32,
    },
    /// RDMA WRITE.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data.
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 8-byte compare and swap; the original value lands in the local SGE.
    AtomicCmpSwp {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// 8-byte fetch and add; the original value lands in the local SGE.
    AtomicFetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// SEND that also invalidates `key` at the responder (`F_MEM_MGT`, RC).
    SendWithInv {
        /// The responder's key to invalidate (an `ALLOC_MR` region's).
        key: u32,
    },
    /// Fast registration of an `ALLOC_MR` region (`F_MEM_MGT`; no SGEs):
    /// see [`crate::FastMr::map`].
    RegMr(FastReg),
    /// Invalidation of `key`, a local `ALLOC_MR` region's or type 2
    /// window's (`F_MEM_MGT`; no SGEs).
    LocalInv {
        /// The key.
        key: u32,
    },
    /// Binding of a memory window (`F_MW`, RC; no SGEs): see
    /// [`crate::Mw::bind`].
    BindMw(crate::mw::MwBind),
}

impl SendOp {
    fn opcode(&self) -> WrOpcode {
        match self {
            SendOp::Send => WrOpcode::SEND,
            SendOp::SendWithImm { .. } => WrOpcode::SEND_WITH_IMM,
            SendOp::RdmaWrite { .. } => WrOpcode::RDMA_WRITE,
            SendOp::RdmaWriteWithImm { .. } => WrOpcode::RDMA_WRITE_WITH_IMM,
            SendOp::RdmaRead { .. } => WrOpcode::RDMA_READ,
            SendOp::AtomicCmpSwp { .. } => WrOpcode::ATOMIC_CMP_AND_SWP,
            SendOp::AtomicFetchAdd { .. } => WrOpcode::ATOMIC_FETCH_AND_ADD,
            SendOp::SendWithInv { .. } => WrOpcode::SEND_WITH_INV,
            SendOp::RegMr(_) => WrOpcode::REG_MR,
            SendOp::LocalInv { .. } => WrOpcode::LOCAL_INV,
            SendOp::BindMw(_) => WrOpcode::BIND_MW,
        }
    }

    /// Whether the operation needs `F_MEM_MGT`.
    fn is_mem_mgt(&self) -> bool {
        matches!(
            self,
            SendOp::SendWithInv { .. } | SendOp::RegMr(_) | SendOp::LocalInv { .. }
        )
    }

    /// Whether the operation is local to the QP (no message, no SGEs).
    pub(crate) fn is_local(&self) -> bool {
        matches!(
            self,
            SendOp::RegMr(_) | SendOp::LocalInv { .. } | SendOp::BindMw(_)
        )
    }

    fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// Whether the device writes the local buffers (READ, atomics).
    fn writes_local(&self) -> bool {
        self.is_atomic() || matches!(self, SendOp::RdmaRead { .. })
    }
}

/// The data of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Scatter/gather entries naming registered memory.
    Sges(&'a [Sge]),
    /// Data copied into the WQE (at most the QP's `max_inline_data`; not for
    /// RDMA READ or atomics).
    Inline(&'a [u8]),
}

/// Destination of a UD (or GSI) send.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// Address handle (of the QP's PD).
    pub ah: &'a Ah,
    /// Destination QP number (a GSI QP's: 1).
    pub remote_qpn: u32,
    /// Q_Key (with the high bit set, the QP's own Q_Key is used; ignored
    /// on a GSI QP, which sends the GSI's).
    pub remote_qkey: u32,
}

impl<'a> UdDest<'a> {
    /// A MAD's destination: the GSI QP (QP 1, the GSI's Q_Key) of the
    /// device instance with the GID `ah` names (spec 18.26).
    pub fn gsi(ah: &'a Ah) -> Self {
        UdDest {
            ah,
            remote_qpn: virtio_rdma_abi::qp::GSI_QPN,
            remote_qkey: virtio_rdma_abi::qp::GSI_QKEY,
        }
    }
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The data.
    pub payload: Payload<'a>,
    /// Flags.
    pub flags: SendFlags,
    /// Destination (UD QPs only).
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendWr<'a> {
    /// A signaled SEND of `sges`.
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self::signaled(wr_id, SendOp::Send, sges)
    }

    /// A signaled work request of `op` over `sges` (RC: no destination).
    pub fn signaled(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            payload: Payload::Sges(sges),
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }
}

/// A receive work request (QP receive queue or SRQ).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers to scatter into (registered with `LOCAL_WRITE`).
    pub sg_list: &'a [Sge],
}

/// What a send WQE is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendLimits {
    pub qp_type: QpType,
    pub pd_handle: u32,
    pub max_send_sge: u32,
    pub max_inline_data: u32,
    pub stride: usize,
    pub atomics: bool,
    pub mem_mgt: bool,
    pub windows: bool,
}

/// Appends `bytes` zeroed bytes to `out` and returns them.
fn grow(out: &mut Vec<u8>, bytes: usize) -> &mut [u8] {
    let start = out.len();
    out.resize(start + bytes, 0);
    &mut out[start..]
}

/// Checks `wr` and appends its encoded WQE to `out` (header plus SGEs or
/// inline data, padded to a multiple of 8 bytes); on error `out` is left
/// as it was. Allocates nothing once `out` has grown to its working size.
pub(crate) fn encode_send_into(
    wr: &SendWr<'_>,
    lim: &SendLimits,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let base = out.len();
    let r = encode_send_at(wr, lim, out, base);
    if r.is_err() {
        out.truncate(base);
    }
    r
}

fn encode_send_at(
    wr: &SendWr<'_>,
    lim: &SendLimits,
    out: &mut Vec<u8>,
    base: usize,
) -> Result<(), String> {
    if wr.op.is_mem_mgt() && !lim.mem_mgt {
        return Err("fast registration and invalidation need F_MEM_MGT".into());
    }
    if matches!(wr.op, SendOp::BindMw(_)) && !lim.windows {
        return Err("memory windows need F_MW".into());
    }
    if wr.op.is_local() {
        return encode_local(wr, lim, out, base);
    }
    let mut wqe = SendWqe {
        wr_id: wr.wr_id,
        opcode: wr.op.opcode() as u8,
        flags: wr.flags.bits() & (WQE_SIGNALED | WQE_SOLICITED | WQE_FENCE),
        ..SendWqe::default()
    };
    match wr.op {
        SendOp::Send => {}
        SendOp::SendWithInv { key } => wqe.imm_data = key,
        // Encoded by `encode_local`.
        SendOp::RegMr(_) | SendOp::LocalInv { .. } | SendOp::BindMw(_) => {}
        SendOp::SendWithImm { imm } => wqe.imm_data = imm,
        SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaRead { remote_addr, rkey } => {
            wqe.remote_addr = remote_addr;
            wqe.rkey = rkey;
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            wqe.remote_addr = remote_addr;
            wqe.rkey = rkey;
            wqe.imm_data = imm;
        }
        SendOp::AtomicCmpSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            wqe.remote_addr = remote_addr;
            wqe.rkey = rkey;
            wqe.compare_add = compare;
            wqe.swap = swap;
        }
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wqe.remote_addr = remote_addr;
            wqe.rkey = rkey;
            wqe.compare_add = add;
        }
    }
    match (lim.qp_type, &wr.ud) {
        (QpType::UD | QpType::GSI, Some(ud)) => {
            if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
                return Err("UD and GSI QPs only SEND".into());
            }
            if ud.ah.pd_handle() != lim.pd_handle {
                return Err("the address handle belongs to another PD".into());
            }
            wqe.ah_handle = ud.ah.handle();
            wqe.remote_qpn = ud.remote_qpn;
            wqe.remote_qkey = ud.remote_qkey;
        }
        (QpType::UD | QpType::GSI, None) => {
            return Err("a UD or GSI send needs a destination".into())
        }
        (_, Some(_)) => return Err("a destination is only for UD and GSI QPs".into()),
        (_, None) => {}
    }
    if wr.op.is_atomic() {
        if !lim.atomics {
            return Err("atomics need F_ATOMIC".into());
        }
        if wqe.remote_addr % 8 != 0 {
            return Err("atomic remote address not 8-byte aligned".into());
        }
        let total: u64 = match wr.payload {
            Payload::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(_) => 0,
        };
        if total != 8 {
            return Err("the local SGEs of an atomic must describe exactly 8 bytes".into());
        }
    }
    match wr.payload {
        Payload::Sges(sges) => {
            if sges.len() > lim.max_send_sge as usize {
                return Err(format!(
                    "{} SGEs, the QP takes {}",
                    sges.len(),
                    lim.max_send_sge
                ));
            }
            wqe.num_sge = u16::try_from(sges.len()).map_err(|_| "too many SGEs".to_string())?;
            wqe.write(grow(out, SendWqe::SIZE));
            for s in sges {
                s.write(grow(out, Sge::SIZE));
            }
        }
        Payload::Inline(data) => {
            if wr.op.writes_local() {
                return Err("RDMA READ and atomics cannot be inline".into());
            }
            if data.len() > lim.max_inline_data as usize {
                return Err(format!(
                    "{} inline bytes, the QP takes {}",
                    data.len(),
                    lim.max_inline_data
                ));
            }
            wqe.flags |= WQE_INLINE;
            wqe.inline_len = data.len() as u32;
            wqe.write(grow(out, SendWqe::SIZE));
            out.extend_from_slice(data);
        }
    }
    let len = (out.len() - base).next_multiple_of(8);
    out.resize(base + len, 0);
    if len > lim.stride {
        return Err(format!(
            "WQE of {len} bytes in a {}-byte stride",
            lim.stride
        ));
    }
    debug_assert!(len >= SEND_WQE_HEADER as usize);
    Ok(())
}

/// Appends the WQE of a local operation (`REG_MR`, `LOCAL_INV`,
/// `BIND_MW`): a 64-byte header, no SGEs (spec 18.27, 18.29).
fn encode_local(
    wr: &SendWr<'_>,
    lim: &SendLimits,
    out: &mut Vec<u8>,
    base: usize,
) -> Result<(), String> {
    if !matches!(wr.payload, Payload::Sges(&[])) {
        return Err("REG_MR and LOCAL_INV carry no data".into());
    }
    if wr.ud.is_some() {
        return Err("REG_MR and LOCAL_INV have no destination".into());
    }
    if lim.stride < SEND_WQE_HEADER as usize {
        return Err(format!("a {}-byte stride", lim.stride));
    }
    // Signaled and fence only: `WQE_SOLICITED` must be clear.
    let flags = wr.flags.bits() & (WQE_SIGNALED | WQE_FENCE);
    let bytes = grow(out, SendWqe::SIZE);
    match wr.op {
        SendOp::RegMr(r) => RegMrWqe {
            wr_id: wr.wr_id,
            opcode: WrOpcode::REG_MR as u8,
            flags,
            reserved0: 0,
            key: r.key,
            iova: r.iova,
            length: r.length,
            pages_gpa: r.pages_gpa,
            mr_handle: r.mr_handle,
            access: r.access,
            npages: r.npages,
            page_shift: r.page_shift,
            reserved1: 0,
        }
        .write(bytes),
        SendOp::LocalInv { key } => SendWqe {
            wr_id: wr.wr_id,
            opcode: WrOpcode::LOCAL_INV as u8,
            flags,
            rkey: key,
            ..SendWqe::default()
        }
        .write(bytes),
        SendOp::BindMw(b) => BindMwWqe {
            wr_id: wr.wr_id,
            opcode: WrOpcode::BIND_MW as u8,
            flags,
            new_rkey: b.new_rkey,
            addr: b.addr,
            length: b.length,
            mw_handle: b.mw_handle,
            mr_lkey: b.mr_lkey,
            access: b.access,
            ..BindMwWqe::default()
        }
        .write(bytes),
        _ => return Err("not a local operation".into()),
    }
    debug_assert_eq!(out.len() - base, SEND_WQE_HEADER as usize);
    Ok(())
}

/// Checks `wr` against `max_sge` and the ring's `stride` and appends its
/// receive WQE to `out` (nothing is appended when it fails).
pub(crate) fn encode_recv_into(
    wr: &RecvWr<'_>,
    max_sge: u32,
    stride: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    if wr.sg_list.len() > max_sge as usize {
        return Err(format!(
            "{} SGEs, the queue takes {max_sge}",
            wr.sg_list.len()
        ));
    }
    let len = RECV_WQE_HEADER as usize + wr.sg_list.len() * SGE_SIZE as usize;
    if len > stride {
        return Err(format!("WQE of {len} bytes in a {stride}-byte stride"));
    }
    RecvWqe {
        wr_id: wr.wr_id,
        num_sge: wr.sg_list.len() as u32,
        reserved: 0,
    }
    .write(grow(out, RecvWqe::SIZE));
    for s in wr.sg_list {
        s.write(grow(out, Sge::SIZE));
    }
    Ok(())
}

/// Encodes receive work request `index` of `wrs` into `out` (see
/// [`encode_recv_into`]), for [`crate::ring::post_encoded`].
pub(crate) fn encode_recv_at(
    wrs: &[RecvWr<'_>],
    index: usize,
    max_sge: u32,
    stride: usize,
    out: &mut Vec<u8>,
) -> crate::error::Result<()> {
    let invalid = |reason| crate::error::Error::InvalidWr { index, reason };
    let wr = wrs
        .get(index)
        .ok_or_else(|| invalid("no such work request".into()))?;
    encode_recv_into(wr, max_sge, stride, out).map_err(invalid)
}

/// A work completion (a decoded CQE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Raw opcode (see [`WorkCompletion::opcode`]).
    pub raw_opcode: u8,
    /// Raw status (see [`WorkCompletion::status`]).
    pub raw_status: u8,
    /// `CQE_*` flags.
    pub flags: u8,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data, valid with [`WorkCompletion::imm`].
    pub imm_data: u32,
    /// Local QP number.
    pub qpn: u32,
    /// Source QP number (UD receives).
    pub src_qpn: u32,
    /// Vendor error detail.
    pub vendor_err: u32,
}

impl WorkCompletion {
    pub(crate) fn from_cqe(c: &Cqe) -> Self {
        WorkCompletion {
            wr_id: c.wr_id,
            raw_opcode: c.opcode,
            raw_status: c.status,
            flags: c.flags,
            byte_len: c.byte_len,
            imm_data: c.imm_data,
            qpn: c.qpn,
            src_qpn: c.src_qpn,
            vendor_err: c.vendor_err,
        }
    }

    /// The completion status (`None` for a value this driver does not know).
    pub fn status(&self) -> Option<WcStatus> {
        WcStatus::from_u32(u32::from(self.raw_status))
    }

    /// Whether the work request succeeded.
    pub fn is_success(&self) -> bool {
        self.raw_status == WcStatus::SUCCESS as u8
    }

    /// The completion opcode (`None` for an unknown value).
    pub fn opcode(&self) -> Option<WcOpcode> {
        WcOpcode::from_u32(u32::from(self.raw_opcode))
    }

    /// Immediate data, when the completion carries it.
    pub fn imm(&self) -> Option<u32> {
        (self.flags & CQE_WITH_IMM != 0).then_some(self.imm_data)
    }

    /// Whether a 40-byte GRH precedes the data (UD receives).
    pub fn has_grh(&self) -> bool {
        self.flags & CQE_GRH != 0
    }

    /// Whether the completion is solicited.
    pub fn is_solicited(&self) -> bool {
        self.flags & CQE_SOLICITED != 0
    }

    /// The key a `SEND_WITH_INV` invalidated, when the receive completion
    /// is of one.
    pub fn invalidated(&self) -> Option<u32> {
        (self.flags & CQE_WITH_INV != 0).then_some(self.imm_data)
    }
}
