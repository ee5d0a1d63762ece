//! The transport: how the driver reaches the device.
//!
//! Two implementations are planned: the in-process test VMM (vhost-user
//! frontend with memfd guest RAM, in the tests crate) and virtio-pci in a
//! real guest (`uio_pci_generic`, BARs through sysfs, hugepage DMA memory
//! whose guest-physical addresses come from `/proc/self/pagemap`).
//!
//! The transport owns everything that is virtio: feature negotiation,
//! virtqueue setup, keeping device-writable buffers on the event queue,
//! descriptor chains for control requests, and notifications. It hands the
//! driver:
//!
//! - **DMA memory** ([`DmaRegion`]): bytes the driver can reach through a
//!   pointer and the device through guest-physical page addresses (rings,
//!   doorbell records, indirect list pages, user buffers);
//! - **control commands**: request bytes (in several parts, concatenated by
//!   the device) and a writable response area of a given size, with many
//!   requests in flight ([`Transport::submit`] / [`Transport::wait`]) or a
//!   blocking [`Transport::call`];
//! - **notifications** of a virtqueue (the driver only notifies
//!   [`NOTIFYQ`](virtio_rdma_abi::config::NOTIFYQ) for doorbell kicks);
//! - **events** from the event queue, one at a time, with a timeout;
//! - the **device configuration** and the negotiated features.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use virtio_rdma_abi::config::DeviceConfig;
use virtio_rdma_abi::event::Event;

/// Errors a transport reports.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A wait ended before the device answered (the request, if any, is
    /// still in flight and may be waited for again).
    #[error("timed out")]
    Timeout,
    /// No DMA memory of the requested size and alignment is available.
    #[error("out of DMA memory ({size} bytes, alignment {align})")]
    OutOfMemory {
        /// Bytes requested.
        size: usize,
        /// Alignment requested.
        align: usize,
    },
    /// The token does not name a request in flight.
    #[error("unknown request token {0}")]
    UnknownToken(u64),
    /// The device or the VMM went away (reset, disconnect).
    #[error("device disconnected")]
    Disconnected,
    /// An I/O error (sysfs, mmap, socket, eventfd, ...).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
}

/// Identifies a control request in flight (chosen by the transport).
pub type Token = u64;

/// Memory shared between the driver and the device.
///
/// Byte `o` of the region (`0 <= o < len()`) is at the driver address
/// `as_ptr() + o` and at the guest-physical address
/// `pages()[(first_page_offset() + o) >> page_shift()] + ((first_page_offset() + o) & (page_size - 1))`.
/// Dropping the region gives the memory back to the transport.
///
/// # Safety
///
/// An implementation guarantees that, for as long as the region is alive:
/// `as_ptr()` and `len()` do not change, `as_ptr()` is valid for reads and
/// writes of `len()` bytes, is not
/// referenced by any Rust reference elsewhere (the driver accesses it only
/// through raw pointers, volatile and atomic operations), and is aligned to
/// the alignment requested at allocation (at least 8); `pages()` holds
/// exactly `ceil((first_page_offset() + len()) / page_size)` entries which are
/// the guest-physical addresses of those bytes, each a multiple of the page
/// size; `page_shift()` is in 12..=30 and `first_page_offset()` is below the
/// page size; the guest-physical address of byte 0 is a multiple of the
/// requested alignment when that alignment does not exceed the page size.
pub unsafe trait DmaRegion: Send + Sync + fmt::Debug {
    /// Driver address of byte 0.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes (at least 1).
    fn len(&self) -> usize;
    /// Whether the region is empty (never, for a valid region).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// log2 of the page size of `pages()`.
    fn page_shift(&self) -> u32;
    /// Offset of byte 0 within the first page.
    fn first_page_offset(&self) -> u32;
    /// Guest-physical addresses of the pages holding the region, in order.
    fn pages(&self) -> &[u64];
}

/// A VIRTIO shared memory region of the device as the driver sees it (for
/// virtio-pci, the part of a BAR a `VIRTIO_PCI_CAP_SHARED_MEMORY_CFG`
/// capability names).
///
/// # Safety
///
/// An implementation guarantees that `as_ptr()` is valid for reads and
/// writes of `len()` bytes for as long as the value is alive, aligned to at
/// least 4096, and never referenced by a Rust reference (the device writes
/// it concurrently; the driver uses atomic operations only).
pub unsafe trait SharedMemory: Send + Sync + fmt::Debug {
    /// Driver address of byte 0 of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Length of the region in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How the driver reaches the device (see the module documentation).
///
/// The transport has completed virtio initialization (features negotiated
/// with `VIRTIO_F_VERSION_1`, the three virtqueues set up, event buffers
/// posted, `DRIVER_OK` set) before it is given to
/// [`Device::open`](crate::Device::open). All methods take `&self`: a
/// transport is shared by every object of a device and may be called from
/// several threads at once.
pub trait Transport: Send + Sync {
    /// The negotiated device feature bits (`F_UD`, `F_SRQ`, `F_ATOMIC`, ...).
    fn features(&self) -> u64;

    /// Reads the device configuration space.
    fn read_config(&self) -> Result<DeviceConfig, TransportError>;

    /// log2 of the page size of the DMA memory this transport allocates
    /// (12 for 4 KiB pages, 21 for 2 MiB hugepages). Queue buffers are laid
    /// out for this page size.
    fn dma_page_shift(&self) -> u32;

    /// Allocates `len` bytes of DMA memory aligned to `align` (a power of
    /// two; queue buffers ask for the page size, doorbell records for 64).
    /// The contents are unspecified: the driver zeroes what must be zero.
    fn alloc_dma(&self, len: usize, align: usize) -> Result<Box<dyn DmaRegion>, TransportError>;

    /// Makes a control request available: the device-readable part is the
    /// concatenation of `request` (the driver's header, payload and page list
    /// as separate parts; the transport copies them), the device-writable
    /// part is `response_len` bytes. Returns a token for [`Transport::wait`].
    fn submit(&self, request: &[&[u8]], response_len: usize) -> Result<Token, TransportError>;

    /// Waits for the request `token` to complete, at most `timeout` (`None`:
    /// no limit; `Some(Duration::ZERO)`: only check). Returns the bytes the
    /// device wrote, as many as the used length says (empty for used length
    /// 0). On [`TransportError::Timeout`] the request stays in flight.
    fn wait(&self, token: Token, timeout: Option<Duration>) -> Result<Vec<u8>, TransportError>;

    /// Submits a request and waits for its response (see
    /// [`Transport::submit`] and [`Transport::wait`]).
    fn call(
        &self,
        request: &[&[u8]],
        response_len: usize,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, TransportError> {
        let token = self.submit(request, response_len)?;
        self.wait(token, timeout)
    }

    /// Notifies virtqueue `queue` (no buffer is added).
    fn notify(&self, queue: u16) -> Result<(), TransportError>;

    /// Takes the next event from the event queue, waiting at most `timeout`
    /// (`None`: no limit; `Some(Duration::ZERO)`: poll). `Ok(None)` when
    /// none arrived in time. The transport gives the buffer back to the
    /// device.
    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<Event>, TransportError>;

    /// A region over guest pages that are allocated already: those of a
    /// DMA region of a driver whose objects are being restored over a copy
    /// of its guest RAM ([`crate::image`]). Dropping it frees them as a
    /// region from [`Transport::alloc_dma`] would be. A transport that
    /// cannot map given pages refuses (the default).
    fn adopt_dma(
        &self,
        pages: &[u64],
        first_page_offset: u32,
        len: usize,
    ) -> Result<Box<dyn DmaRegion>, TransportError> {
        let _ = (pages, first_page_offset, len);
        Err(TransportError::Other(
            "this transport cannot map given guest pages".into(),
        ))
    }

    /// The device's shared memory region `id`, if the transport has one
    /// (`F_SHMEM_DOORBELL` uses region 0). A transport that returns a
    /// region must have negotiated `F_SHMEM_DOORBELL` only together with
    /// it (spec chapter 4).
    fn shared_memory(&self, id: u8) -> Option<Arc<dyn SharedMemory>> {
        let _ = id;
        None
    }
}
