//! Validation of the memory behind CQ, QP and SRQ rings.

use log::warn;
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::{CtxDoorbell, DB_DEVICE_OFFSET};
use virtio_rdma_abi::mem::{BufferDesc, DB_RECORD_SIZE};
use virtio_rdma_abi::Wire;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::parse::{field, page_list_error, shift_plausible};
use super::{CmdError, DETAIL_DB_RECORD};
use crate::memory::pagelist::pages_for;
use crate::memory::volatile::write_guest;
use crate::memory::PageList;
use crate::vm::VmState;

impl VmState {
    /// Validates a ring buffer of `required` bytes described by the `buf`
    /// field of `T` (with its page list in `trailing`) and the doorbell
    /// record at `db_gpa`.
    pub(super) fn queue_memory<T: Wire, M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        buf: &BufferDesc,
        trailing: &[u8],
        required: u64,
        db_gpa: u64,
    ) -> Result<PageList, CmdError> {
        if buf.first_page_offset != 0 {
            return Err(field::<T>(Status::INVALID, "buf.first_page_offset"));
        }
        if shift_plausible(buf.page_shift)
            && u64::from(buf.npages) != pages_for(required, buf.page_shift)
        {
            return Err(field::<T>(Status::INVALID, "buf.npages"));
        }
        if db_gpa % DB_RECORD_SIZE != 0 || !self.ram.contains(db_gpa, DB_RECORD_SIZE) {
            return Err(CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD));
        }
        PageList::resolve(buf, trailing, &self.page_list_limits(), &self.ram, mem)
            .map_err(page_list_error::<T>)
    }
}

/// Initializes the device half of a new queue's doorbell record at `db_gpa`
/// (validated by [`VmState::queue_memory`]): the driver may leave anything
/// there, and the device writes consumer and producer indices 0,
/// `armed_seq` 0 and reserved fields 0 before the create command returns
/// (spec 18.4). Called only once the create command cannot fail any more:
/// a failed create writes nothing.
pub(super) fn init_device_half<M: GuestMemoryBackend>(mem: &M, db_gpa: u64) {
    // Bounded: constants, 128 - 64 bytes.
    #[allow(clippy::cast_possible_truncation)]
    let half = [0u8; (DB_RECORD_SIZE - DB_DEVICE_OFFSET) as usize];
    // Volatile: the driver may be looking at the record already.
    let written = db_gpa
        .checked_add(DB_DEVICE_OFFSET)
        .is_some_and(|gpa| write_guest(mem, GuestAddress(gpa), &half).is_ok());
    if !written {
        warn!("doorbell record {db_gpa:#x}: cannot initialize the device half");
    }
}

/// Writes a new context's doorbell header at `db_gpa` (validated by the
/// caller): `flags`, reserved fields 0 (spec 18.4).
pub(super) fn init_ctx_header<M: GuestMemoryBackend>(mem: &M, db_gpa: u64, flags: u32) {
    let header = CtxDoorbell {
        flags,
        ..CtxDoorbell::default()
    }
    .to_bytes();
    if write_guest(mem, GuestAddress(db_gpa), &header).is_err() {
        warn!("context doorbell header {db_gpa:#x}: cannot initialize it");
    }
}
