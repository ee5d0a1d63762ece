//! Error types of the driver.

use virtio_rdma_abi::ctrl::{Opcode, Status};

use crate::transport::TransportError;

/// Result type of the driver.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device executed a control command and answered with a failure
    /// status (spec chapter 8); `detail` is the status-specific detail.
    #[error("{} failed: {} (detail {detail:#x})", opcode.name(), status.name())]
    Command {
        /// The command.
        opcode: Opcode,
        /// The device's status.
        status: Status,
        /// The `detail` field of the response header.
        detail: u32,
    },
    /// The device answered with a status this driver does not know (treated
    /// as a failure, spec chapter 17).
    #[error("{} failed with unknown status {code} (detail {detail:#x})", opcode.name())]
    UnknownStatus {
        /// The command.
        opcode: Opcode,
        /// The raw status value.
        code: u32,
        /// The `detail` field of the response header.
        detail: u32,
    },
    /// The device returned the request with used length 0: it was not
    /// executed (spec section 7.4).
    #[error("{} was not executed by the device (used length 0)", opcode.name())]
    NotExecuted {
        /// The command.
        opcode: Opcode,
    },
    /// The device's response is malformed (wrong request id, too short, or
    /// values inconsistent with the request).
    #[error("malformed response to {}: {reason}", opcode.name())]
    BadResponse {
        /// The command.
        opcode: Opcode,
        /// What is wrong.
        reason: String,
    },
    /// A work queue has no room for the work requests (nothing was posted).
    #[error("queue full: {needed} work requests, room for {free}")]
    QueueFull {
        /// Work requests the caller tried to post.
        needed: usize,
        /// Free slots at the time of the call.
        free: usize,
    },
    /// A work request is invalid for this queue (nothing was posted).
    #[error("invalid work request #{index}: {reason}")]
    InvalidWr {
        /// Index of the offending work request in the list.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// An argument is outside what the device or the driver supports.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device lacks a feature the call needs.
    #[error("feature not negotiated: {0}")]
    Unsupported(&'static str),
    /// The device implements an ABI version this driver does not.
    #[error("device ABI version {0} is not supported")]
    AbiVersion(u32),
    /// The object refers to another device or protection domain than required.
    #[error("object mismatch: {0}")]
    Mismatch(&'static str),
    /// A blocking wait ended without a result.
    #[error("timed out")]
    Timeout,
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
}

impl Error {
    /// The device status and detail when this is a failed control command.
    pub fn status(&self) -> Option<(Status, u32)> {
        match self {
            Error::Command { status, detail, .. } => Some((*status, *detail)),
            _ => None,
        }
    }

    /// Whether this is [`Error::QueueFull`].
    pub fn is_queue_full(&self) -> bool {
        matches!(self, Error::QueueFull { .. })
    }
}
