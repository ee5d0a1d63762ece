//! Validation of the memory behind CQ, QP and SRQ rings.

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::{BufferDesc, DB_RECORD_SIZE};
use virtio_rdma_abi::Wire;
use vm_memory::{Bytes, GuestAddress};

use super::parse::{field, page_list_error, shift_plausible};
use super::{CmdError, Ctrl, DETAIL_DB_RECORD};
use crate::memory::pagelist::pages_for;
use crate::memory::PageList;

impl Ctrl {
    /// Validates a ring buffer of `required` bytes described by the `buf`
    /// field of `T` (with its page list in `trailing`) and the doorbell
    /// record at `db_gpa`.
    pub(super) fn queue_memory<T: Wire, M: Bytes<GuestAddress>>(
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
