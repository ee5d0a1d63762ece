//! The error type shared by every module of the test VMM.

use std::io;
use std::time::Duration;

use virtio_rdma_abi::WireError;

/// Everything that can go wrong in the test VMM, its queues and the echo backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The guest memory layout is unusable (overlap, misalignment, zero size...).
    #[error("bad guest memory layout: {0}")]
    Layout(String),
    /// vm-memory refused to create the guest memory.
    #[error("cannot create guest memory: {0}")]
    CreateMemory(#[from] vm_memory::mmap::FromRangesError),
    /// A guest memory access failed (address outside guest RAM...).
    #[error("guest memory access at {gpa:#x} ({len} bytes): {source}")]
    Memory {
        /// Guest-physical address of the access.
        gpa: u64,
        /// Length of the access.
        len: usize,
        /// The underlying error.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// The guest memory allocator has no free range of the requested size.
    #[error("guest memory allocator: no free range of {size:#x} bytes aligned to {align:#x}")]
    OutOfGuestMemory {
        /// Requested size.
        size: u64,
        /// Requested alignment.
        align: u64,
    },
    /// `free` was called with an address the allocator did not hand out.
    #[error("guest memory allocator: {0:#x} is not an allocated range")]
    BadFree(u64),
    /// A vhost-user request failed.
    #[error("vhost-user {what}: {source}")]
    Vhost {
        /// The request that failed.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: vhost::Error,
    },
    /// A vhost-user exchange did not complete in time (the socket was shut
    /// down by the watchdog).
    #[error("vhost-user {what}: no answer within {timeout:?}")]
    MessageTimeout {
        /// The request that timed out.
        what: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The backend does not offer something the test VMM needs.
    #[error("backend: {0}")]
    Backend(String),
    /// The vhost-user socket could not be connected within the timeout.
    #[error("cannot connect to {path} within {timeout:?}: {last}")]
    Connect {
        /// Socket path.
        path: String,
        /// How long we tried.
        timeout: Duration,
        /// The last error seen.
        last: String,
    },
    /// Not enough free descriptors for the chain.
    #[error("virtqueue {queue}: {need} descriptors needed, {free} free")]
    QueueFull {
        /// Queue index.
        queue: u16,
        /// Descriptors the chain needs.
        need: usize,
        /// Descriptors free.
        free: usize,
    },
    /// A chain was empty, too long, or referenced a descriptor outside the table.
    #[error("virtqueue {queue}: bad chain: {reason}")]
    BadChain {
        /// Queue index.
        queue: u16,
        /// Why.
        reason: String,
    },
    /// The device put something impossible in the used ring.
    #[error("virtqueue {queue}: device misbehaved: {reason}")]
    DeviceBug {
        /// Queue index.
        queue: u16,
        /// What it did.
        reason: String,
    },
    /// Nothing arrived within the timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// `wait` was called for a request that is neither in flight nor completed.
    #[error("unknown request id {0}")]
    UnknownRequest(u64),
    /// A control command completed with a status other than OK.
    #[error("command {opcode:#x} failed: status {status} ({name}), detail {detail:#x}")]
    Status {
        /// Opcode of the command.
        opcode: u32,
        /// Status code returned.
        status: u32,
        /// Name of the status, or "?" for an unknown value.
        name: &'static str,
        /// Detail field returned.
        detail: u32,
    },
    /// A response payload could not be parsed.
    #[error("cannot parse response: {0}")]
    Wire(#[from] WireError),
    /// The vhost-user daemon framework failed (echo backend).
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
}

impl Error {
    /// Builds an [`Error::Io`] from the current `errno`.
    pub(crate) fn last_os(what: &'static str) -> Self {
        Error::Io {
            what,
            source: io::Error::last_os_error(),
        }
    }

    /// Builds an [`Error::Io`].
    pub(crate) fn io(what: &'static str, source: io::Error) -> Self {
        Error::Io { what, source }
    }

    /// Builds an [`Error::Vhost`].
    pub(crate) fn vhost(what: &'static str, source: vhost::Error) -> Self {
        Error::Vhost { what, source }
    }
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, Error>;
