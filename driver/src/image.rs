//! Images of driver objects: what the driver keeps of each object outside
//! guest RAM (handles, keys, ring geometry, indices), so that a driver
//! started over a copy of the same guest RAM takes the objects over.
//!
//! This is what live migration asks of a guest: its kernel's memory moves
//! with the RAM and its driver simply goes on. A test VMM whose driver
//! lives in a host process has to carry that memory across explicitly
//! ([`Device::image`](crate::Device::image) and `restore` on each object).
//! The device's side travels in its own state (spec 20); an image names
//! only what the device already has, so restoring one sends no command.
//!
//! Queues with a doorbell slot (shared-memory doorbell mode), SRQs, memory
//! windows, fast-registration regions and resized CQs have no image: their
//! restore is refused with [`Error::Unsupported`](crate::Error).

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// A DMA region: its guest-physical pages and where it starts in the
/// first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct RegionImage {
    /// Guest-physical address of every page, in order.
    pub pages: Vec<u64>,
    /// Offset of byte 0 in the first page.
    pub first_page_offset: u32,
    /// Length in bytes.
    pub len: usize,
}

/// An opened device: what it answered at open time and its context.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct DeviceImage {
    /// The configuration read at open time (wire bytes).
    pub config: Vec<u8>,
    /// The negotiated feature bits.
    pub features: u64,
    /// The QUERY_DEVICE response (wire bytes).
    pub attr: Vec<u8>,
    /// The QUERY_PORT response (wire bytes).
    pub port: Vec<u8>,
    /// The QUERY_GID response of the handle's own GID (wire bytes).
    pub gid: Vec<u8>,
    /// Its index in the GID table.
    pub gid_index: u8,
    /// The context's handle.
    pub ctx: u32,
    /// The context's doorbell header.
    pub ctx_header: RegionImage,
    /// The next control request id.
    pub next_id: u64,
}

/// A protection domain.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct PdImage {
    /// Its handle.
    pub handle: u32,
}

/// A completion queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct CqImage {
    /// Its handle.
    pub handle: u32,
    /// Number of entries.
    pub depth: u32,
    /// The consumer index: the next CQE to poll.
    pub ci: u32,
    /// The last arm sequence number written.
    pub arm_seq: u32,
    /// The ring.
    pub ring: RegionImage,
    /// Pages the ring's description names.
    pub npages: usize,
    /// The doorbell record.
    pub db: RegionImage,
}

/// A queue pair (its PD and CQs are restored first and given to
/// [`Qp::restore`](crate::Qp::restore)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct QpImage {
    /// Its handle.
    pub handle: u32,
    /// Its number.
    pub qpn: u32,
    /// Its type (`QpType` as a number).
    pub qp_type: u32,
    /// Its state as the driver last set it (`QpState` as a number).
    pub state: u32,
    /// Send queue depth, receive queue depth, SGEs per send and receive
    /// WQE, inline bytes.
    pub cap: [u32; 5],
    /// The send ring: byte offset, log2 of the slot size, depth.
    pub sq: (usize, u32, u32),
    /// The receive ring, if the QP has one.
    pub rq: Option<(usize, u32, u32)>,
    /// The send queue's producer index and the consumer index last seen.
    pub sq_pi_ci: (u32, u32),
    /// The receive queue's.
    pub rq_pi_ci: (u32, u32),
    /// The rings' buffer.
    pub buf: RegionImage,
    /// Pages the buffer's description names.
    pub npages: usize,
    /// The doorbell record.
    pub db: RegionImage,
}

/// A memory region registered over a DMA buffer (which is restored first
/// and given to [`Mr::restore`](crate::Mr::restore)) or over given pages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct MrImage {
    /// Its handle.
    pub handle: u32,
    /// Its local key.
    pub lkey: u32,
    /// Its remote key (0: none).
    pub rkey: u32,
    /// The address of byte 0 in the region's address space.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access flags.
    pub access: u32,
}
