//! Reading producer indices in either doorbell mode (spec 18.4, 18.7): from
//! the driver half of a doorbell record in guest RAM, or from the queue's
//! slot in its context's doorbell page.

use crate::memory::access;
use crate::memory::HostMem;
use crate::shmem::DbSlot;

/// Slot word / record field of a QP's send producer index.
pub const SQ: u32 = 0;
/// Slot word / record field of a QP's receive producer index.
pub const RQ: u32 = 1;
/// Slot word / record field of an SRQ's producer index.
pub const SRQ: u32 = 0;

/// Acquire load of producer index `which` ([`SQ`], [`RQ`] or [`SRQ`]) of
/// the queue with doorbell record `db_gpa` and slot `slot`; `None` if the
/// record is not in guest RAM.
pub fn load_pi(mem: &HostMem, db_gpa: u64, slot: Option<&DbSlot>, which: u32) -> Option<u32> {
    match slot {
        Some(s) => Some(s.load(which)),
        // Saturated: an address past RAM fails the load.
        None => access::load_u32_acquire(
            mem,
            db_gpa.saturating_add(u64::from(which).saturating_mul(4)),
        )
        .ok(),
    }
}
