//! The engine's access to doorbells (spec 18.4, 18.7): producer indices
//! from a doorbell record in guest RAM or from the queue's slot in its
//! context's doorbell page, and the device's fields of a record, all at
//! the offsets of the `abi` layouts ([`QpDoorbell::SQ_CI`] and the like).

use crate::memory::access::{self, AccessError};
use crate::memory::HostMem;
use crate::shmem::DbSlot;
use virtio_rdma_abi::datapath::{QpDoorbell, SrqDoorbell};

/// A producer index the driver publishes: where it lies in the queue's
/// doorbell record, and which word of the queue's doorbell slot holds it
/// (a slot has the layout of a record's driver half: `QpDbSlot`,
/// `SrqDbSlot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pi {
    /// Byte offset in the doorbell record.
    record: u64,
    /// Word of the doorbell slot (`DbSlot::load`).
    word: u32,
}

/// A QP's send producer index.
pub const SQ: Pi = Pi {
    record: QpDoorbell::SQ_PI,
    word: 0,
};
/// A QP's receive producer index.
pub const RQ: Pi = Pi {
    record: QpDoorbell::RQ_PI,
    word: 1,
};
/// An SRQ's producer index.
pub const SRQ: Pi = Pi {
    record: SrqDoorbell::PI,
    word: 0,
};

// The accessors below are a sum and an atomic access: `#[inline]`, so that
// naming a field costs what writing its offset did.

/// Acquire load of producer index `which` ([`SQ`], [`RQ`] or [`SRQ`]) of
/// the queue with doorbell record `db_gpa` and slot `slot`; `None` if the
/// record is not in guest RAM.
#[inline]
pub fn load_pi(mem: &HostMem, db_gpa: u64, slot: Option<&DbSlot>, which: Pi) -> Option<u32> {
    match slot {
        Some(s) => Some(s.load(which.word)),
        None => load(mem, db_gpa, which.record).ok(),
    }
}

/// Acquire load of the field at byte `field` (e.g. [`QpDoorbell::SQ_PI`])
/// of the doorbell record at `db_gpa`.
#[inline]
pub fn load(mem: &HostMem, db_gpa: u64, field: u64) -> Result<u32, AccessError> {
    // A record's address was checked to be RAM at creation, so the sum
    // cannot overflow; it saturates anyway, and a saturated address is not
    // RAM (the access fails).
    access::load_u32_acquire(mem, db_gpa.saturating_add(field))
}

/// Release store of `value` into the field at byte `field` (e.g.
/// [`QpDoorbell::SQ_CI`]) of the doorbell record at `db_gpa`.
#[inline]
pub fn store(mem: &HostMem, db_gpa: u64, field: u64, value: u32) -> Result<(), AccessError> {
    // Saturated as in `load`.
    access::store_u32_release(mem, db_gpa.saturating_add(field), value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_rdma_abi::datapath::{QpDbSlot, SrqDbSlot};

    /// A producer index's slot word is the one its slot's layout gives it.
    #[test]
    fn slot_words_follow_the_slot_layouts() {
        let byte = |p: Pi| u64::from(p.word).checked_mul(4);
        assert_eq!(byte(SQ), Some(QpDbSlot::SQ_PI));
        assert_eq!(byte(RQ), Some(QpDbSlot::RQ_PI));
        assert_eq!(byte(SRQ), Some(SrqDbSlot::PI));
    }
}
