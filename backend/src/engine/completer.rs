//! Writing completions: CQEs with the owner phase, CQ overflow, and the
//! completion events of armed CQs.

use std::sync::atomic::{fence, Ordering};

use super::doorbell;
use crate::memory::access;
use crate::memory::HostMem;
use crate::stats::TrafficCounters;
use crate::vm::VmState;
use log::debug;
use virtio_rdma_abi::datapath::{
    cqe_owner, CqDoorbell, Cqe, WcOpcode, WcStatus, ARM_NEXT, ARM_SOLICITED, CQE_OWNER_OFFSET,
    CQE_SOLICITED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::CQE_SIZE;

/// A completion with a status other than `SUCCESS`: it carries `wr_id`,
/// `opcode`, `status` and `qpn` only; `byte_len`, `flags`, `imm_data` and
/// `src_qpn` are 0 (spec 18.14), whatever the failed message had.
pub fn error_cqe(wr_id: u64, opcode: WcOpcode, status: WcStatus, qpn: u32) -> Cqe {
    Cqe {
        wr_id,
        opcode: opcode as u8,
        status: status as u8,
        qpn,
        ..Cqe::default()
    }
}

/// Writes `cqe` (its `owner` is set here) to CQ `cq_handle` of `state`.
/// Returns false when the CQ could not take it: missing, or in error —
/// because it overflowed now or earlier, or because its ring or doorbell
/// record is no longer in guest RAM (spec 18.17). A CQ entering the error
/// state fails the QPs that use it; the caller treats its own QP as
/// failed.
pub fn complete(state: &mut VmState, mem: &HostMem, cq_handle: u32, mut cqe: Cqe) -> bool {
    let Some(cq) = state.res.cqs.get_mut(cq_handle) else {
        return false;
    };
    if cq.rt.overflowed {
        return false;
    }
    let Ok(ci) = doorbell::load(mem, cq.db_gpa, CqDoorbell::CI) else {
        debug!("CQ {cq_handle:#x}: doorbell record unusable");
        return cq_error(state, cq_handle);
    };
    let used = cq.rt.pi.wrapping_sub(ci);
    if used >= cq.depth {
        debug!("CQ {cq_handle:#x} overflowed");
        return cq_error(state, cq_handle);
    }
    let index = cq.rt.pi;
    // `depth` is a power of two (checked at creation); a ring index wraps.
    let slot = index & cq.depth.wrapping_sub(1);
    let offset = u64::from(slot).saturating_mul(u64::from(CQE_SIZE));
    let Some((gpa, _)) = cq.ring.translate(offset) else {
        return cq_error(state, cq_handle);
    };
    cqe.owner = 0;
    let mut bytes = [0u8; CQE_SIZE as usize];
    virtio_rdma_abi::Field::write(&cqe, &mut bytes);
    // Everything but the owner byte first; the owner last, with release.
    // The entry lies in one page of RAM: its addresses do not overflow (and
    // a saturated one is not RAM).
    let owner_gpa = gpa.saturating_add(CQE_OWNER_OFFSET);
    let split = usize::try_from(CQE_OWNER_OFFSET)
        .ok()
        .and_then(|at| bytes.split_at_checked(at));
    // The entry's page is marked in the dirty log once, after the owner
    // byte (spec 20.4), not after each of the three writes.
    let ok = match split {
        Some((head, [_, tail @ ..])) => {
            let owner = cqe_owner(index, cq.depth);
            let ok = access::write_bytes_unlogged(mem, gpa, head).is_ok()
                && access::write_bytes_unlogged(mem, owner_gpa.saturating_add(1), tail).is_ok()
                && access::store_u8_release_unlogged(mem, owner_gpa, owner).is_ok();
            mem.dirty(gpa, u64::from(CQE_SIZE));
            ok
        }
        _ => false,
    };
    if !ok {
        // The owner byte is written last: a half-written entry never
        // looks valid to the driver.
        debug!("CQ {cq_handle:#x}: ring unusable");
        return cq_error(state, cq_handle);
    }
    cq.rt.pi = index.wrapping_add(1);
    let _ = doorbell::store(mem, cq.db_gpa, CqDoorbell::PI, cq.rt.pi);
    // Publishing the CQE and reading the arm request must not be reordered
    // (the driver arms, fences, then polls: one of the two sees the other).
    fence(Ordering::SeqCst);
    let arm = doorbell::load(mem, cq.db_gpa, CqDoorbell::ARM).unwrap_or(0);
    let seq = arm >> 2;
    if seq != cq.rt.armed_seq {
        let kind = arm & 3;
        let solicited = cqe.flags & CQE_SOLICITED != 0 || cqe.status != WcStatus::SUCCESS as u8;
        if kind == ARM_NEXT || (kind == ARM_SOLICITED && solicited) {
            cq.rt.armed_seq = seq;
            let _ = doorbell::store(mem, cq.db_gpa, CqDoorbell::ARMED_SEQ, seq);
            state.events.push(EventKind::CQ_COMPLETION, cq_handle, 0);
        }
    }
    true
}

/// CQ `cq_handle` enters the error state — it overflowed, or its memory
/// became unusable, which the spec treats alike (18.17): it takes no more
/// CQEs, `CQ_ERROR` is queued for it, and every QP that completes into it
/// and is not in ERR yet moves to ERR with `QP_FATAL`. Returns false (the
/// CQE was not written).
pub(crate) fn cq_error(state: &mut VmState, cq_handle: u32) -> bool {
    if let Some(cq) = state.res.cqs.get_mut(cq_handle) {
        cq.rt.overflowed = true;
    }
    state.events.push(EventKind::CQ_ERROR, cq_handle, 0);
    state.fail_qps(|q| q.send_cq == cq_handle || q.recv_cq == cq_handle);
    false
}

/// The traffic counters of the VM `state` belongs to.
pub(super) fn traffic(state: &VmState) -> Option<&TrafficCounters> {
    state.tenancy().traffic(state.vm_index())
}
