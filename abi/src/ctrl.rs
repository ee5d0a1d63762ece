//! Control-queue framing: request and response headers, opcodes, statuses.

use crate::wire_struct;

wire_struct! {
    /// Header of every control request (device-readable part of a chain).
    pub struct RequestHeader {
        /// Chosen by the driver, echoed in the response.
        request_id: u64,
        /// Command, one of [`Opcode`].
        opcode: u32,
        /// Must be zero.
        reserved: u32,
    }
}

wire_struct! {
    /// Header of every control response (device-writable part of a chain).
    pub struct ResponseHeader {
        /// The request's `request_id`.
        request_id: u64,
        /// Outcome, one of [`Status`].
        status: u32,
        /// Extra information about a failure; see the spec's status table.
        detail: u32,
    }
}

/// `detail` value when a status carries no extra information.
pub const DETAIL_NONE: u32 = u32::MAX;

macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $var:ident = $val:expr ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        #[allow(non_camel_case_types)]
        pub enum $name { $( $(#[$vmeta])* $var = $val ),* }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];

            /// Decodes a wire value; `None` for an unknown one.
            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $( $val => Some($name::$var), )*
                    _ => None,
                }
            }

            /// Name as written in the spec.
            pub fn name(self) -> &'static str {
                match self { $( $name::$var => stringify!($var), )* }
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v as u32
            }
        }
    };
}
pub(crate) use code_enum;

code_enum! {
    /// Control command opcodes.
    pub enum Opcode {
        /// Device attributes.
        QUERY_DEVICE = 0x01,
        /// Port attributes.
        QUERY_PORT = 0x02,
        /// One GID table entry.
        QUERY_GID = 0x03,
        /// Create a context (one per guest process).
        CREATE_CTX = 0x10,
        /// Destroy a context and everything it owns.
        DESTROY_CTX = 0x11,
        /// Allocate a protection domain.
        ALLOC_PD = 0x20,
        /// Free a protection domain.
        DEALLOC_PD = 0x21,
        /// Open an XRC domain (`F_XRC`).
        OPEN_XRCD = 0x22,
        /// Close an XRC domain (`F_XRC`).
        CLOSE_XRCD = 0x23,
        /// Create a completion queue.
        CREATE_CQ = 0x30,
        /// Destroy a completion queue.
        DESTROY_CQ = 0x31,
        /// Give a completion queue a new ring of another depth (`F_RESIZE`).
        RESIZE_CQ = 0x32,
        /// Register a memory region.
        REG_MR = 0x40,
        /// Deregister a memory region.
        DEREG_MR = 0x41,
        /// Allocate a memory region for fast registration (`F_MEM_MGT`).
        ALLOC_MR = 0x42,
        /// Change a memory region's translation, PD or access, keeping its
        /// keys (`F_RESIZE`).
        REREG_MR = 0x43,
        /// Allocate a memory window (`F_MW`).
        ALLOC_MW = 0x44,
        /// Free a memory window (`F_MW`).
        DEALLOC_MW = 0x45,
        /// Create a queue pair.
        CREATE_QP = 0x50,
        /// Change queue pair state and attributes.
        MODIFY_QP = 0x51,
        /// Read queue pair attributes.
        QUERY_QP = 0x52,
        /// Destroy a queue pair.
        DESTROY_QP = 0x53,
        /// Create an address handle.
        CREATE_AH = 0x60,
        /// Destroy an address handle.
        DESTROY_AH = 0x61,
        /// Attach a UD QP to a multicast group (`F_MCAST`).
        ATTACH_MCAST = 0x62,
        /// Detach a UD QP from a multicast group (`F_MCAST`).
        DETACH_MCAST = 0x63,
        /// Create a shared receive queue.
        CREATE_SRQ = 0x70,
        /// Change SRQ attributes.
        MODIFY_SRQ = 0x71,
        /// Read SRQ attributes.
        QUERY_SRQ = 0x72,
        /// Destroy a shared receive queue.
        DESTROY_SRQ = 0x73,
        /// Create an XRC shared receive queue (`F_XRC`).
        CREATE_XRC_SRQ = 0x74,
    }
}

code_enum! {
    /// Status codes of control responses.
    pub enum Status {
        /// Success.
        OK = 0,
        /// Unknown opcode, or a feature that is not negotiated or not implemented.
        UNSUPPORTED = 1,
        /// Malformed request: wrong length, reserved field not zero, value out of its domain.
        INVALID = 2,
        /// A handle does not name a live object of the expected kind in this VM.
        BAD_HANDLE = 3,
        /// The object is still in use by other objects.
        BUSY = 4,
        /// A per-VM quota would be exceeded.
        QUOTA = 5,
        /// A guest-physical address is not in guest RAM, misaligned, or unreadable.
        BAD_ADDRESS = 6,
        /// A value exceeds a limit advertised by the device.
        RANGE = 7,
        /// The QP or SRQ state does not allow the request.
        BAD_STATE = 8,
        /// The objects named belong to different protection domains or contexts.
        MISMATCH = 9,
        /// The device could not allocate host resources.
        NO_MEMORY = 10,
        /// Refused by the operator's policy.
        DENIED = 11,
        /// Internal device error.
        INTERNAL = 12,
    }
}

/// Largest device-readable part of a control request the device accepts
/// (headers plus the longest indirect page list directory).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Resource codes carried in the `detail` of a `QUOTA` status.
pub mod quota {
    /// Contexts.
    pub const CTX: u32 = 1;
    /// Protection domains.
    pub const PD: u32 = 2;
    /// Completion queues.
    pub const CQ: u32 = 3;
    /// Queue pairs.
    pub const QP: u32 = 4;
    /// Memory regions.
    pub const MR: u32 = 5;
    /// Shared receive queues.
    pub const SRQ: u32 = 6;
    /// Address handles.
    pub const AH: u32 = 7;
    /// Registered bytes.
    pub const MR_BYTES: u32 = 8;
    /// Host memory the device holds for the instance's objects (page-list
    /// translations, queue and object state): an operator-set budget that
    /// `DeviceConfig` does not advertise.
    pub const HOST_BYTES: u32 = 9;
    /// Host memory mappings the device holds for the instance's objects
    /// (a host RNIC's memory region windows and queues): an operator-set
    /// budget that `DeviceConfig` does not advertise.
    pub const HOST_MAPPINGS: u32 = 10;
    /// Multicast groups of the instance's QPs (`MAX_MCAST_GRP`, `F_MCAST`).
    pub const MCAST_GROUPS: u32 = 11;
    /// QPs of the instance in one multicast group (`MAX_MCAST_QP_ATTACH`).
    pub const MCAST_MEMBERS: u32 = 12;
    /// XRC domains of the instance (`MAX_XRCD`, `F_XRC`).
    pub const XRCD: u32 = 13;
}

/// `BAD_ADDRESS` detail: the doorbell record is misaligned or outside RAM.
pub const DETAIL_DB_RECORD: u32 = u32::MAX;
/// `BAD_ADDRESS` detail: an indirect list page is misaligned, outside RAM or unreadable.
pub const DETAIL_LIST_PAGE: u32 = u32::MAX - 1;

/// Handles are `generation << HANDLE_SLOT_BITS | slot`; 0 is never a handle.
pub const HANDLE_SLOT_BITS: u32 = 20;
