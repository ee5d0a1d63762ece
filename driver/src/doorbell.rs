//! Doorbell records (64 bytes in guest RAM) and the kick protocol.
//!
//! Bytes 0..32 of a record are written only by the driver, bytes 32..64
//! only by the device. After storing a producer index (release) the driver
//! issues a full fence, reads the device's `flags` and, if `DB_FLAG_KICK` is
//! set, notifies the notification queue: the engine parked and asked to be
//! woken up.

use std::sync::atomic::{fence, Ordering};

use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::DB_FLAG_KICK;
use virtio_rdma_abi::mem::DB_RECORD_SIZE;

use crate::dma::DmaBuf;
use crate::error::{Error, Result};
use crate::transport::Transport;

/// Byte offsets of the fields of `QpDoorbell`, `CqDoorbell` and
/// `SrqDoorbell` (checked against the ABI's layout tables in the tests).
pub(crate) mod off {
    /// `QpDoorbell::sq_pi`.
    pub const QP_SQ_PI: usize = 0;
    /// `QpDoorbell::rq_pi`.
    pub const QP_RQ_PI: usize = 4;
    /// `QpDoorbell::sq_ci`.
    pub const QP_SQ_CI: usize = 32;
    /// `QpDoorbell::rq_ci`.
    pub const QP_RQ_CI: usize = 36;
    /// `QpDoorbell::flags`.
    pub const QP_FLAGS: usize = 40;
    /// `CqDoorbell::ci`.
    pub const CQ_CI: usize = 0;
    /// `CqDoorbell::arm`.
    pub const CQ_ARM: usize = 4;
    /// `CqDoorbell::pi`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub const CQ_PI: usize = 32;
    /// `CqDoorbell::armed_seq`.
    pub const CQ_ARMED_SEQ: usize = 36;
    /// `SrqDoorbell::pi`.
    pub const SRQ_PI: usize = 0;
    /// `SrqDoorbell::ci`.
    pub const SRQ_CI: usize = 32;
    /// `SrqDoorbell::flags`.
    pub const SRQ_FLAGS: usize = 40;
}

/// One doorbell record in DMA memory.
#[derive(Debug)]
pub(crate) struct DoorbellRecord {
    buf: DmaBuf,
    gpa: u64,
}

impl DoorbellRecord {
    /// Allocates a zeroed, 64-byte aligned record.
    pub(crate) fn alloc(transport: &dyn Transport) -> Result<Self> {
        let size = DB_RECORD_SIZE as usize;
        let buf = DmaBuf::new(transport.alloc_dma(size, size)?)?;
        let gpa = buf.gpa(0).unwrap_or(1);
        if buf.len() < size || gpa % DB_RECORD_SIZE != 0 || buf.as_ptr() as usize % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "transport returned a misaligned doorbell record (gpa {gpa:#x})"
            )));
        }
        buf.fill(0, size, 0)?;
        Ok(DoorbellRecord { buf, gpa })
    }

    /// Guest-physical address (for the create command).
    pub(crate) fn gpa(&self) -> u64 {
        self.gpa
    }

    /// Loads a field with acquire semantics.
    pub(crate) fn load(&self, offset: usize) -> u32 {
        self.buf.atomic_u32(offset).load(Ordering::Acquire)
    }

    /// Stores a driver field with release semantics.
    pub(crate) fn store(&self, offset: usize, value: u32) {
        self.buf.atomic_u32(offset).store(value, Ordering::Release);
    }

    /// Publishes a producer index: release-store `pi` at `pi_offset`, full
    /// fence, read `flags` at `flags_offset`, and notify notifyq if the
    /// device asked for a kick. Returns whether it kicked.
    pub(crate) fn publish(
        &self,
        transport: &dyn Transport,
        pi_offset: usize,
        flags_offset: usize,
        pi: u32,
    ) -> Result<bool> {
        self.store(pi_offset, pi);
        fence(Ordering::SeqCst);
        let flags = self.buf.atomic_u32(flags_offset).load(Ordering::Relaxed);
        if flags & DB_FLAG_KICK != 0 {
            transport.notify(NOTIFYQ)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The underlying memory (tests inspect it).
    #[cfg(test)]
    pub(crate) fn buf(&self) -> &DmaBuf {
        &self.buf
    }
}
