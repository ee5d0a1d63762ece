//! The device state of one VM, as it leaves a device instance and enters
//! another: live migration through vhost-user's device-state transfer
//! (`SET_DEVICE_STATE_FD`, `CHECK_DEVICE_STATE`) and the hand-over to a new
//! daemon binary (spec chapter 20).
//!
//! - [`mod@format`]: the framed, versioned, checksummed encoding and its size
//!   bound;
//! - [`state`]: what the state holds.
//!
//! The state is opaque to the VMM (vhost-user leaves its format to the
//! back-end); what the daemon reads from a front-end is as hostile as any
//! other VMM input: it is bounded before it is read, checked whole before
//! anything of it is used, and a refused state changes nothing.

pub mod format;
pub mod restore;
pub mod save;
pub mod state;

use thiserror::Error;

pub use format::{decode, encode, state_bound, FORMAT_VERSION, FORMAT_VERSION_PLAIN, MAGIC};
pub use state::DeviceState;

/// Why a device state could not be saved or loaded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MigrationError {
    /// The state does not start with [`MAGIC`].
    #[error("not a virtio-rdma device state (bad magic)")]
    BadMagic,
    /// A format version this daemon does not read.
    #[error("device state format version {found} (this daemon reads {supported})")]
    Version {
        /// The version in the state.
        found: u32,
        /// The version this daemon reads and writes.
        supported: u32,
    },
    /// The state is larger than an instance with these limits can have.
    #[error("device state of {len} bytes exceeds the bound of {bound} bytes for this instance")]
    TooLarge {
        /// Its length (as declared or as read so far).
        len: u64,
        /// The bound.
        bound: u64,
    },
    /// The state ended before its declared length, or went on past it.
    #[error("device state is {found} bytes, its header declares {declared}")]
    Length {
        /// Bytes present.
        found: u64,
        /// Bytes the header declares.
        declared: u64,
    },
    /// The checksum does not match the body.
    #[error("device state checksum mismatch")]
    Checksum,
    /// The body does not decode as a state of this version.
    #[error("device state body is malformed: {0}")]
    Malformed(String),
    /// The state decodes but is inconsistent, or does not fit this instance
    /// (its limits, its features, its guest memory).
    #[error("device state refused: {0}")]
    Invalid(String),
    /// The device cannot be saved in its present condition.
    #[error("device state cannot be saved: {0}")]
    NotSavable(String),
}
