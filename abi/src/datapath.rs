//! Data-path formats: doorbell records, work queue entries and completion
//! queue entries, shared between the driver and the device in guest memory.
//!
//! Rings are arrays of fixed-size entries in the queue buffer described at
//! creation (see [`crate::mem`] for strides and the QP buffer layout).
//! Producer and consumer indices are free-running 32-bit counters; the slot
//! of index `i` is `i & (depth - 1)`.

use crate::ctrl::code_enum;
use crate::wire::{field_offset, Field, Wire};
use crate::wire_struct;

wire_struct! {
    /// Doorbell record of a QP (128 bytes at `db_gpa`, 128-byte aligned).
    ///
    /// The driver owns the first 64 bytes (`sq_pi`, `rq_pi`), the device the
    /// last 64 (`sq_ci`, `rq_ci`): each half is a cache line of its own, so
    /// the line the driver stores producer indices into is never written by
    /// the device. The device's flags are per context ([`CtxDoorbell`]).
    /// The driver writes WQEs, then stores the new producer index with
    /// release semantics; the device reads it with acquire semantics and
    /// copies each WQE out of guest memory before it parses it.
    pub struct QpDoorbell {
        /// Send queue producer index (driver).
        sq_pi: u32,
        /// Receive queue producer index (driver).
        rq_pi: u32,
        /// Must be zero.
        reserved0: u64,
        /// Must be zero.
        reserved1: u64,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
        /// Must be zero.
        reserved4: u64,
        /// Must be zero.
        reserved5: u64,
        /// Must be zero.
        reserved6: u64,
        /// Send queue consumer index (device): WQEs taken by the device.
        sq_ci: u32,
        /// Receive queue consumer index (device): WQEs consumed.
        rq_ci: u32,
        /// Must be zero (ABI version 1 had the device flags here; they
        /// moved to the context, [`CtxDoorbell`]).
        reserved7: u64,
        /// Must be zero.
        reserved8: u64,
        /// Must be zero.
        reserved9: u64,
        /// Must be zero.
        reserved10: u64,
        /// Must be zero.
        reserved11: u64,
        /// Must be zero.
        reserved12: u64,
        /// Must be zero.
        reserved13: u64,
    }
}

wire_struct! {
    /// Doorbell record of a CQ (128 bytes at `db_gpa`, 128-byte aligned).
    pub struct CqDoorbell {
        /// Consumer index (driver): CQEs the driver has consumed.
        ci: u32,
        /// Arm request (driver): `arm_seq << 2 | ARM_*`. A new value with a
        /// different `arm_seq` arms the CQ once.
        arm: u32,
        /// Must be zero.
        reserved0: u64,
        /// Must be zero.
        reserved1: u64,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
        /// Must be zero.
        reserved4: u64,
        /// Must be zero.
        reserved5: u64,
        /// Must be zero.
        reserved6: u64,
        /// Producer index (device): CQEs written.
        pi: u32,
        /// `arm_seq` of the last arm request the device consumed (device).
        armed_seq: u32,
        /// Must be zero.
        reserved7: u64,
        /// Must be zero.
        reserved8: u64,
        /// Must be zero.
        reserved9: u64,
        /// Must be zero.
        reserved10: u64,
        /// Must be zero.
        reserved11: u64,
        /// Must be zero.
        reserved12: u64,
        /// Must be zero.
        reserved13: u64,
    }
}

wire_struct! {
    /// Doorbell record of an SRQ (128 bytes at `db_gpa`, 128-byte aligned).
    pub struct SrqDoorbell {
        /// Producer index (driver).
        pi: u32,
        /// Must be zero.
        reserved0: u32,
        /// Must be zero.
        reserved1: u64,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
        /// Must be zero.
        reserved4: u64,
        /// Must be zero.
        reserved5: u64,
        /// Must be zero.
        reserved6: u64,
        /// Must be zero.
        reserved7: u64,
        /// Consumer index (device).
        ci: u32,
        /// Must be zero.
        reserved8: u32,
        /// Must be zero.
        reserved9: u64,
        /// Must be zero.
        reserved10: u64,
        /// Must be zero.
        reserved11: u64,
        /// Must be zero.
        reserved12: u64,
        /// Must be zero.
        reserved13: u64,
        /// Must be zero.
        reserved14: u64,
        /// Must be zero.
        reserved15: u64,
    }
}

wire_struct! {
    /// Doorbell header of a context in guest RAM (64 bytes at the
    /// `CREATE_CTX` request's `db_gpa`, 64-byte aligned), written only by the
    /// device: the flags the driver reads after every producer index store
    /// of the context's queues (spec 18.6). A context with a doorbell page
    /// uses the page's header ([`DbPageHeader`]) instead.
    pub struct CtxDoorbell {
        /// [`DB_FLAG_KICK`] or [`DB_FLAG_POLLING`] (or neither).
        flags: u32,
        /// Must be zero.
        reserved0: u32,
        /// Must be zero.
        reserved1: u64,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
        /// Must be zero.
        reserved4: u64,
        /// Must be zero.
        reserved5: u64,
        /// Must be zero.
        reserved6: u64,
        /// Must be zero.
        reserved7: u64,
    }
}

// Where the indices and flags lie in the doorbell records, headers and
// slots: offsets taken from the structures' layouts, so that the device
// names a field instead of writing its offset by hand.

impl QpDoorbell {
    /// Byte offset of `sq_pi` (driver half).
    pub const SQ_PI: u64 = field_offset(Self::LAYOUT, "sq_pi");
    /// Byte offset of `rq_pi` (driver half).
    pub const RQ_PI: u64 = field_offset(Self::LAYOUT, "rq_pi");
    /// Byte offset of `sq_ci` (device half).
    pub const SQ_CI: u64 = field_offset(Self::LAYOUT, "sq_ci");
    /// Byte offset of `rq_ci` (device half).
    pub const RQ_CI: u64 = field_offset(Self::LAYOUT, "rq_ci");
}

impl CqDoorbell {
    /// Byte offset of `ci` (driver half).
    pub const CI: u64 = field_offset(Self::LAYOUT, "ci");
    /// Byte offset of `arm` (driver half).
    pub const ARM: u64 = field_offset(Self::LAYOUT, "arm");
    /// Byte offset of `pi` (device half).
    pub const PI: u64 = field_offset(Self::LAYOUT, "pi");
    /// Byte offset of `armed_seq` (device half).
    pub const ARMED_SEQ: u64 = field_offset(Self::LAYOUT, "armed_seq");
}

impl SrqDoorbell {
    /// Byte offset of `pi` (driver half).
    pub const PI: u64 = field_offset(Self::LAYOUT, "pi");
    /// Byte offset of `ci` (device half).
    pub const CI: u64 = field_offset(Self::LAYOUT, "ci");
}

impl CtxDoorbell {
    /// Byte offset of `flags`.
    pub const FLAGS: u64 = field_offset(Self::LAYOUT, "flags");
}

impl QpDbSlot {
    /// Byte offset of `sq_pi` in the slot.
    pub const SQ_PI: u64 = field_offset(Self::LAYOUT, "sq_pi");
    /// Byte offset of `rq_pi` in the slot.
    pub const RQ_PI: u64 = field_offset(Self::LAYOUT, "rq_pi");
}

impl SrqDbSlot {
    /// Byte offset of `pi` in the slot.
    pub const PI: u64 = field_offset(Self::LAYOUT, "pi");
}

/// Byte offset of the driver-owned part of every doorbell record.
pub const DB_DRIVER_OFFSET: u64 = 0;
/// Byte offset of the device-owned part of every doorbell record: a cache
/// line of its own, so the two sides never write into the same line.
pub const DB_DEVICE_OFFSET: u64 = 64;

/// Doorbell `flags` bit: the engine is parked; after advancing a producer
/// index the driver must notify the notification queue.
pub const DB_FLAG_KICK: u32 = 1 << 0;
/// Doorbell `flags` bit: the engine polls this queue's producer indices and
/// will see a new value without a fence on the driver's side (spec 18.6):
/// after storing a producer index a driver that reads this bit set is done.
pub const DB_FLAG_POLLING: u32 = 1 << 1;

/// Shared memory region id of the doorbell region (`F_SHMEM_DOORBELL`).
pub const SHMEM_ID_DOORBELL: u8 = 0;
/// Size of one doorbell page of the doorbell region; page `p` starts at
/// byte `p * DB_PAGE_SIZE` of the region.
pub const DB_PAGE_SIZE: u64 = 4096;
/// Byte offset of slot 0 in a doorbell page (after the device's header).
pub const DB_SLOT_OFFSET: u64 = 64;
/// Size of one doorbell slot.
pub const DB_SLOT_SIZE: u64 = 8;
/// Number of doorbell slots in a page.
// Bounded: (4096 - 64) / 8 = 504, computed at compile time.
#[allow(clippy::cast_possible_truncation)]
pub const DB_PAGE_SLOTS: u32 = ((DB_PAGE_SIZE - DB_SLOT_OFFSET) / DB_SLOT_SIZE) as u32;
/// `doorbell_page` / `db_slot` value meaning "none: guest-RAM doorbell mode".
pub const DB_NONE: u32 = u32::MAX;

/// Byte offset of slot `slot` in its doorbell page, or `None` past the
/// last slot.
pub const fn db_slot_offset(slot: u32) -> Option<u64> {
    if slot < DB_PAGE_SLOTS {
        // Bounded: slot < 504, so at most 64 + 503 * 8 = 4088.
        #[allow(clippy::arithmetic_side_effects)]
        Some(DB_SLOT_OFFSET + slot as u64 * DB_SLOT_SIZE)
    } else {
        None
    }
}

wire_struct! {
    /// Header of a doorbell page (bytes 0..64), written only by the device.
    pub struct DbPageHeader {
        /// [`DB_FLAG_KICK`] while the engine does not poll this page's slots.
        flags: u32,
        /// Must be zero.
        reserved0: u32,
        /// Must be zero.
        reserved1: u64,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
        /// Must be zero.
        reserved4: u64,
        /// Must be zero.
        reserved5: u64,
        /// Must be zero.
        reserved6: u64,
        /// Must be zero.
        reserved7: u64,
    }
}

wire_struct! {
    /// Doorbell slot of a QP, written only by the driver: replaces the
    /// producer indices of the QP's doorbell record.
    pub struct QpDbSlot {
        /// Send queue producer index.
        sq_pi: u32,
        /// Receive queue producer index (0 with an SRQ).
        rq_pi: u32,
    }
}

wire_struct! {
    /// Doorbell slot of an SRQ, written only by the driver.
    pub struct SrqDbSlot {
        /// Producer index.
        pi: u32,
        /// Must be zero.
        reserved: u32,
    }
}

/// `CqDoorbell::arm` kind: the next completion of any kind raises an event.
pub const ARM_NEXT: u32 = 1;
/// `CqDoorbell::arm` kind: the next solicited (or error) completion raises an event.
pub const ARM_SOLICITED: u32 = 2;

code_enum! {
    /// Send work request opcodes.
    pub enum WrOpcode {
        /// RDMA WRITE.
        RDMA_WRITE = 0,
        /// RDMA WRITE with immediate data.
        RDMA_WRITE_WITH_IMM = 1,
        /// SEND.
        SEND = 2,
        /// SEND with immediate data.
        SEND_WITH_IMM = 3,
        /// RDMA READ.
        RDMA_READ = 4,
        /// 8-byte atomic compare and swap.
        ATOMIC_CMP_AND_SWP = 5,
        /// 8-byte atomic fetch and add.
        ATOMIC_FETCH_AND_ADD = 6,
        /// Fast registration of an `ALLOC_MR` MR (`F_MEM_MGT`); the slot
        /// is a [`RegMrWqe`].
        REG_MR = 7,
        /// Invalidation of the key in `rkey` (`F_MEM_MGT`).
        LOCAL_INV = 8,
        /// SEND that also invalidates, at the responder, the key in
        /// `imm_data` (`F_MEM_MGT`).
        SEND_WITH_INV = 9,
        /// Binding of a memory window to a range of an MR (`F_MW`); the
        /// slot is a [`BindMwWqe`].
        BIND_MW = 10,
    }
}

/// Send WQE flag: generate a completion (always for `QP_FLAG_SIG_ALL` QPs).
pub const WQE_SIGNALED: u8 = 1 << 0;
/// Send WQE flag: the receiver's completion is solicited.
pub const WQE_SOLICITED: u8 = 1 << 1;
/// Send WQE flag: the data is inline in the WQE instead of SGEs.
pub const WQE_INLINE: u8 = 1 << 2;
/// Send WQE flag: wait for earlier RDMA READ and atomics to complete first.
pub const WQE_FENCE: u8 = 1 << 3;

wire_struct! {
    /// Fixed header of a send WQE (followed by `num_sge` [`Sge`]s, or by
    /// `inline_len` bytes of inline data, in the rest of the stride).
    pub struct SendWqe {
        /// Returned in the completion.
        wr_id: u64,
        /// A [`WrOpcode`].
        opcode: u8,
        /// `WQE_*` flags.
        flags: u8,
        /// Number of SGEs (0 with `WQE_INLINE`).
        num_sge: u16,
        /// Immediate data (`*_WITH_IMM`), network order as given by the application.
        imm_data: u32,
        /// Remote address (RDMA and atomics).
        remote_addr: u64,
        /// Remote key (RDMA and atomics).
        rkey: u32,
        /// Bytes of inline data (`WQE_INLINE`).
        inline_len: u32,
        /// Compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
        compare_add: u64,
        /// Swap value (CMP_AND_SWP).
        swap: u64,
        /// Address handle (UD).
        ah_handle: u32,
        /// Destination QPN (UD).
        remote_qpn: u32,
        /// Q_Key (UD).
        remote_qkey: u32,
        /// XRC_INI: the number of the XRC SRQ the message goes to at the
        /// destination (`F_XRC`); zero on every other QP type.
        xrc_srqn: u32,
    }
}

wire_struct! {
    /// A scatter/gather entry.
    pub struct Sge {
        /// Address in the MR (its iova space).
        addr: u64,
        /// Length in bytes.
        length: u32,
        /// Local key of the MR.
        lkey: u32,
    }
}

/// The `size`-byte little-endian field at byte `off` of a structure held
/// as little-endian 8-byte words `w`; the field lies inside one word (wire
/// structures are naturally aligned).
#[inline(always)]
fn word_field<const N: usize>(w: &[u64; N], off: u64, size: u32) -> u64 {
    let word = usize::try_from(off / 8)
        .ok()
        .and_then(|i| w.get(i))
        .copied()
        .unwrap_or(0);
    // `off & 7` is below 8 and `size` below 8 in the masked arm: the
    // shifts stay below 64 bits.
    let v = word.wrapping_shr(u32::from((off & 7) as u8).wrapping_mul(8));
    match size {
        8.. => v,
        _ => v & 1u64.wrapping_shl(size.wrapping_mul(8)).wrapping_sub(1),
    }
}

/// Reads field `$name` of type `$t` of wire structure `$s` from its words.
macro_rules! from_word {
    ($w:expr, $s:ty, $name:literal, $t:ty) => {{
        const OFF: u64 = field_offset(<$s as Wire>::LAYOUT, $name);
        // The mask in `word_field` keeps the value within `$t`.
        #[allow(clippy::cast_possible_truncation)]
        let v = word_field($w, OFF, <$t as Field>::SIZE as u32) as $t;
        v
    }};
}

impl SendWqe {
    /// Decodes a send WQE header held as its eight little-endian 8-byte
    /// words, as [`Field::read`] decodes its bytes. For a reader that loads
    /// the header from the ring one word at a time and decodes the words
    /// where they are: a copy parsed at once would be read with loads wider
    /// than the stores that made it, which the CPU cannot forward.
    #[inline(always)]
    pub fn from_words(w: &[u64; 8]) -> Self {
        SendWqe {
            wr_id: from_word!(w, SendWqe, "wr_id", u64),
            opcode: from_word!(w, SendWqe, "opcode", u8),
            flags: from_word!(w, SendWqe, "flags", u8),
            num_sge: from_word!(w, SendWqe, "num_sge", u16),
            imm_data: from_word!(w, SendWqe, "imm_data", u32),
            remote_addr: from_word!(w, SendWqe, "remote_addr", u64),
            rkey: from_word!(w, SendWqe, "rkey", u32),
            inline_len: from_word!(w, SendWqe, "inline_len", u32),
            compare_add: from_word!(w, SendWqe, "compare_add", u64),
            swap: from_word!(w, SendWqe, "swap", u64),
            ah_handle: from_word!(w, SendWqe, "ah_handle", u32),
            remote_qpn: from_word!(w, SendWqe, "remote_qpn", u32),
            remote_qkey: from_word!(w, SendWqe, "remote_qkey", u32),
            xrc_srqn: from_word!(w, SendWqe, "xrc_srqn", u32),
        }
    }
}

impl Sge {
    /// Decodes an SGE held as its two little-endian 8-byte words, as
    /// [`Field::read`] decodes its bytes (see [`SendWqe::from_words`]).
    #[inline(always)]
    pub fn from_words(w: &[u64; 2]) -> Self {
        Sge {
            addr: from_word!(w, Sge, "addr", u64),
            length: from_word!(w, Sge, "length", u32),
            lkey: from_word!(w, Sge, "lkey", u32),
        }
    }
}

wire_struct! {
    /// A `REG_MR` send WQE (`F_MEM_MGT`): the 64-byte slot header read in
    /// this layout instead of [`SendWqe`]'s, `opcode` and `flags` where a
    /// [`SendWqe`] has them. No SGEs follow.
    pub struct RegMrWqe {
        /// Returned in the completion.
        wr_id: u64,
        /// [`WrOpcode::REG_MR`].
        opcode: u8,
        /// `WQE_*` flags (`WQE_INLINE` must be clear).
        flags: u8,
        /// Must be zero.
        reserved0: u16,
        /// The MR's key with its new consumer byte (bits 7 to 0); bits 31
        /// to 8 must be the MR's.
        key: u32,
        /// First byte address the registration gives.
        iova: u64,
        /// Bytes registered.
        length: u64,
        /// Guest-physical address of `npages` little-endian 64-bit page
        /// addresses, 8-byte aligned and within one 4 KiB guest page.
        pages_gpa: u64,
        /// The MR, an `ALLOC_MR` MR of the QP's PD.
        mr_handle: u32,
        /// Access flags (`ACCESS_*`).
        access: u32,
        /// Pages in the list: 1 to the MR's `max_num_sg`.
        npages: u32,
        /// log2 of the page size: 12 to 30.
        page_shift: u32,
        /// Must be zero.
        reserved1: u64,
    }
}

wire_struct! {
    /// A `BIND_MW` send WQE (`F_MW`): the 64-byte slot header read in this
    /// layout instead of [`SendWqe`]'s, `opcode` and `flags` where a
    /// [`SendWqe`] has them. No SGEs follow.
    pub struct BindMwWqe {
        /// Returned in the completion.
        wr_id: u64,
        /// [`WrOpcode::BIND_MW`].
        opcode: u8,
        /// `WQE_*` flags (`WQE_INLINE` and `WQE_SOLICITED` must be clear).
        flags: u8,
        /// Must be zero.
        reserved0: u16,
        /// The window's new key: bits 31 to 8 the window's, bits 7 to 0
        /// the new consumer byte.
        new_rkey: u32,
        /// First byte of the window, in the MR's address space.
        addr: u64,
        /// Bytes of the window; 0 unbinds a type 1 window.
        length: u64,
        /// The window.
        mw_handle: u32,
        /// Local key of the MR the window is bound to.
        mr_lkey: u32,
        /// Remote rights the window grants (`ACCESS_REMOTE_*`).
        access: u32,
        /// Must be zero.
        reserved1: u32,
        /// Must be zero.
        reserved2: u64,
        /// Must be zero.
        reserved3: u64,
    }
}

/// Smallest `page_shift` of a `REG_MR` work request.
pub const REG_MR_MIN_PAGE_SHIFT: u32 = 12;
/// Largest `page_shift` of a `REG_MR` work request.
pub const REG_MR_MAX_PAGE_SHIFT: u32 = 30;

wire_struct! {
    /// Fixed header of a receive WQE (followed by `num_sge` [`Sge`]s).
    pub struct RecvWqe {
        /// Returned in the completion.
        wr_id: u64,
        /// Number of SGEs.
        num_sge: u32,
        /// Must be zero.
        reserved: u32,
    }
}

code_enum! {
    /// Completion opcodes.
    pub enum WcOpcode {
        /// A SEND completed.
        SEND = 0,
        /// An RDMA WRITE completed.
        RDMA_WRITE = 1,
        /// An RDMA READ completed.
        RDMA_READ = 2,
        /// A compare-and-swap completed.
        COMP_SWAP = 3,
        /// A fetch-and-add completed.
        FETCH_ADD = 4,
        /// A `REG_MR` work request completed.
        REG_MR = 5,
        /// A `LOCAL_INV` work request completed.
        LOCAL_INV = 6,
        /// A `BIND_MW` work request completed.
        BIND_MW = 7,
        /// A receive completed (SEND arrived).
        RECV = 0x80,
        /// A receive was consumed by RDMA WRITE with immediate data.
        RECV_RDMA_WITH_IMM = 0x81,
    }
}

code_enum! {
    /// Completion status values.
    pub enum WcStatus {
        /// Success.
        SUCCESS = 0,
        /// Local length error (a message larger than the receive buffer, ...).
        LOC_LEN_ERR = 1,
        /// Local QP operation error (malformed WQE).
        LOC_QP_OP_ERR = 2,
        /// Local protection error (bad lkey, PD, bounds or rights of a local buffer).
        LOC_PROT_ERR = 3,
        /// Work request flushed because the QP is in the error state.
        WR_FLUSH_ERR = 4,
        /// Bad response from the responder.
        BAD_RESP_ERR = 5,
        /// Local access error (responder side: bad buffer for incoming data).
        LOC_ACCESS_ERR = 6,
        /// Remote invalid request (responder could not process the request).
        REM_INV_REQ_ERR = 7,
        /// Remote access error (bad rkey, bounds or rights at the responder).
        REM_ACCESS_ERR = 8,
        /// Remote operation error.
        REM_OP_ERR = 9,
        /// Transport retry counter exceeded (peer unreachable).
        RETRY_EXC_ERR = 10,
        /// RNR retry counter exceeded (no receive posted at the peer).
        RNR_RETRY_EXC_ERR = 11,
        /// Fatal device error.
        FATAL_ERR = 12,
        /// A `BIND_MW` work request was refused (window, MR, range or
        /// rights, spec 18.29).
        MW_BIND_ERR = 13,
    }
}

/// CQE flag: `imm_data` is valid.
pub const CQE_WITH_IMM: u8 = 1 << 0;
/// CQE flag: a 40-byte GRH precedes the data in the receive buffer (UD).
pub const CQE_GRH: u8 = 1 << 1;
/// CQE flag: the completion is solicited.
pub const CQE_SOLICITED: u8 = 1 << 2;
/// CQE flag: the SEND that arrived was a `SEND_WITH_INV`; `imm_data` holds
/// the key it invalidated.
pub const CQE_WITH_INV: u8 = 1 << 3;

/// Bytes reserved for the global route header at the start of every UD
/// receive buffer (as with InfiniBand verbs).
pub const UD_GRH_SIZE: u32 = 40;

/// IP version in the first nibble of the UD GRH (an IPv6 header).
pub const GRH_IP_VERSION: u8 = 6;
/// `next header` of the UD GRH: UDP (17), as in RoCEv2.
pub const GRH_NEXT_HEADER_UDP: u8 = 17;
/// RoCEv2 bytes between the IPv6 header and a UD SEND's payload: the UDP
/// header (8), the BTH (12) and the DETH (8).
pub const GRH_UD_HEADERS: u32 = 28;
/// RoCEv2 bytes of an immediate (ImmDt header of SEND_WITH_IMM).
pub const GRH_IMM_BYTES: u32 = 4;
/// RoCEv2 bytes after the payload: the invariant CRC.
pub const GRH_ICRC_BYTES: u32 = 4;

/// The `payload length` field of the GRH of a UD message of `msg_len`
/// bytes (spec 18.13): what the IPv6 header of the RoCEv2 packet carrying
/// it would say, that is UDP, BTH and DETH headers, the immediate if any,
/// the payload padded to a multiple of 4, and the ICRC. A UD message is at
/// most the MTU (4096), so this fits; larger inputs saturate.
pub fn ud_grh_payload_length(msg_len: u64, with_imm: bool) -> u16 {
    let imm = if with_imm { GRH_IMM_BYTES } else { 0 };
    let padded = msg_len.checked_next_multiple_of(4).unwrap_or(u64::MAX);
    let total = padded
        .saturating_add(u64::from(GRH_UD_HEADERS))
        .saturating_add(u64::from(imm))
        .saturating_add(u64::from(GRH_ICRC_BYTES));
    u16::try_from(total).unwrap_or(u16::MAX)
}

/// The global route header the device writes at the start of a UD receive
/// buffer: an IPv6 header (spec 18.13), in network byte order on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdGrh {
    /// IPv6 traffic class: the sender's address handle's `traffic_class`.
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits): the address handle's `flow_label`.
    pub flow_label: u32,
    /// IPv6 payload length ([`ud_grh_payload_length`]).
    pub payload_length: u16,
    /// IPv6 hop limit: the address handle's `hop_limit`.
    pub hop_limit: u8,
    /// Source GID: the sender's.
    pub sgid: [u8; 16],
    /// Destination GID: the receiver's.
    pub dgid: [u8; 16],
}

impl UdGrh {
    /// The 40 bytes: version 6, traffic class, flow label (bits above 20
    /// dropped), payload length, next header 17, hop limit, source and
    /// destination GIDs.
    pub fn to_bytes(&self) -> [u8; UD_GRH_SIZE as usize] {
        let word = (u32::from(GRH_IP_VERSION) << 28)
            | (u32::from(self.traffic_class) << 20)
            | (self.flow_label & 0x000f_ffff);
        let len = self.payload_length.to_be_bytes();
        let mut out = [0u8; UD_GRH_SIZE as usize];
        let head = word.to_be_bytes().into_iter().chain([
            len[0],
            len[1],
            GRH_NEXT_HEADER_UDP,
            self.hop_limit,
        ]);
        let gids = self.sgid.into_iter().chain(self.dgid);
        for (d, s) in out.iter_mut().zip(head.chain(gids)) {
            *d = s;
        }
        out
    }

    /// Parses a GRH; `None` unless it is an IPv6 header with next header
    /// UDP, as the device writes it (a driver or test checking one).
    pub fn parse(b: &[u8; UD_GRH_SIZE as usize]) -> Option<UdGrh> {
        let [w0, w1, w2, w3, l0, l1, next, hop_limit, gids @ ..] = *b;
        let word = u32::from_be_bytes([w0, w1, w2, w3]);
        if word >> 28 != u32::from(GRH_IP_VERSION) || next != GRH_NEXT_HEADER_UDP {
            return None;
        }
        let (sgid, dgid) = gids.split_at(16);
        Some(UdGrh {
            traffic_class: u8::try_from((word >> 20) & 0xff).unwrap_or(0),
            flow_label: word & 0x000f_ffff,
            payload_length: u16::from_be_bytes([l0, l1]),
            hop_limit,
            sgid: sgid.try_into().ok()?,
            dgid: dgid.try_into().ok()?,
        })
    }
}

wire_struct! {
    /// A completion queue entry (32 bytes).
    ///
    /// The device writes every field, then `owner` last with release
    /// semantics. The entry at consumer index `c` is valid when `owner`
    /// equals [`cqe_owner`]`(c, depth)`.
    pub struct Cqe {
        /// The WQE's `wr_id`.
        wr_id: u64,
        /// A [`WcOpcode`].
        opcode: u8,
        /// A [`WcStatus`].
        status: u8,
        /// `CQE_*` flags.
        flags: u8,
        /// Phase bit.
        owner: u8,
        /// Bytes transferred (receives, RDMA READ, atomics: 8).
        byte_len: u32,
        /// Immediate data (`CQE_WITH_IMM`).
        imm_data: u32,
        /// Local QP number.
        qpn: u32,
        /// Source QP number (UD receives).
        src_qpn: u32,
        /// Vendor error detail (0 on success).
        vendor_err: u32,
    }
}

/// Byte offset of `owner` within a CQE.
pub const CQE_OWNER_OFFSET: u64 = field_offset(Cqe::LAYOUT, "owner");

/// The owner value marking a valid CQE at index `index` of a CQ of `depth`
/// entries: 1 on the first pass over the ring, 0 on the second, and so on.
/// Zero-filled CQ memory is therefore empty.
#[inline]
pub fn cqe_owner(index: u32, depth: u32) -> u8 {
    let shift = depth.max(1).trailing_zeros();
    u8::from((index >> shift) & 1 == 0)
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::wire::{Field, Wire};

    #[test]
    fn sizes_and_offsets() {
        assert_eq!(QpDoorbell::SIZE, 128);
        assert_eq!(CqDoorbell::SIZE, 128);
        assert_eq!(SrqDoorbell::SIZE, 128);
        assert_eq!(CtxDoorbell::SIZE, 64);
        assert_eq!(SendWqe::SIZE, 64);
        assert_eq!(RegMrWqe::SIZE, 64);
        assert_eq!(RecvWqe::SIZE, 16);
        assert_eq!(Sge::SIZE, 16);
        assert_eq!(Cqe::SIZE, 32);
        assert_eq!(CQE_OWNER_OFFSET, 11);
        for l in [QpDoorbell::LAYOUT, CqDoorbell::LAYOUT, SrqDoorbell::LAYOUT] {
            let dev = l.iter().find(|f| f.offset as u64 == DB_DEVICE_OFFSET);
            assert!(dev.is_some_and(|f| !f.name.starts_with("reserved")));
        }
        // The driver's indices open the record, the device's open its half
        // (spec 18.4); slots have the layout of a record's driver half.
        let d = DB_DEVICE_OFFSET;
        assert_eq!((QpDoorbell::SQ_PI, QpDoorbell::RQ_PI), (0, 4));
        assert_eq!((QpDoorbell::SQ_CI, QpDoorbell::RQ_CI), (d, d + 4));
        assert_eq!((CqDoorbell::CI, CqDoorbell::ARM), (0, 4));
        assert_eq!((CqDoorbell::PI, CqDoorbell::ARMED_SEQ), (d, d + 4));
        assert_eq!((SrqDoorbell::PI, SrqDoorbell::CI), (0, d));
        assert_eq!(CtxDoorbell::FLAGS, DB_DRIVER_OFFSET);
        assert_eq!((QpDbSlot::SQ_PI, QpDbSlot::RQ_PI), (0, 4));
        assert_eq!(SrqDbSlot::PI, 0);
    }

    /// Decoding from words gives what decoding the words' bytes gives.
    #[test]
    fn send_wqe_and_sge_from_words() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let mut w = [0u64; 8];
            for v in &mut w {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x;
            }
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(SendWqe::from_words(&w), SendWqe::read(&bytes));
            let [a, b, c, d, ..] = w;
            assert_eq!(Sge::from_words(&[a, b]), Sge::read(&bytes));
            assert_eq!(
                Sge::from_words(&[c, d]),
                Sge::read(bytes.get(16..).unwrap_or(&[]))
            );
        }
    }

    /// Spec 18.13: an IPv6 header as RoCEv2 would have it, as
    /// libibverbs' `ibv_init_ah_from_wc()` reads it (version nibble in byte
    /// 0, next header in byte 6).
    #[test]
    fn ud_grh_layout() {
        let g = UdGrh {
            traffic_class: 0xa5,
            flow_label: 0x1_2345,
            payload_length: ud_grh_payload_length(13, true),
            hop_limit: 64,
            sgid: [1; 16],
            dgid: [2; 16],
        };
        let b = g.to_bytes();
        assert_eq!(&b[..8], &[0x6a, 0x51, 0x23, 0x45, 0, 52, 17, 64]);
        assert_eq!(&b[8..24], &[1; 16]);
        assert_eq!(&b[24..], &[2; 16]);
        assert_eq!(UdGrh::parse(&b), Some(g));
        // 13 bytes pad to 16: 28 + 4 (immediate) + 16 + 4 (ICRC).
        assert_eq!(g.payload_length, 52);
        assert_eq!(ud_grh_payload_length(0, false), 32);
        assert_eq!(ud_grh_payload_length(4096, false), 4128);
        assert_eq!(ud_grh_payload_length(u64::MAX, true), u16::MAX);
        // Flow label bits above 20 are not written.
        let wide = UdGrh {
            flow_label: 0xfff0_0001,
            ..g
        };
        assert_eq!(&wide.to_bytes()[1..4], &[0x50, 0x00, 0x01]);
        let mut zeros = b;
        zeros[..8].fill(0);
        assert_eq!(UdGrh::parse(&zeros), None, "the v1 GRH");
    }

    #[test]
    fn owner_phase() {
        assert_eq!(cqe_owner(0, 4), 1);
        assert_eq!(cqe_owner(3, 4), 1);
        assert_eq!(cqe_owner(4, 4), 0);
        assert_eq!(cqe_owner(8, 4), 1);
        assert_eq!(cqe_owner(u32::MAX, 1), 0);
    }
}
