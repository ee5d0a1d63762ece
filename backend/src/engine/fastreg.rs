//! The local memory operations of a send queue (`F_MEM_MGT`, spec 18.27),
//! executed in the queue's order like any WQE and completed at once: a
//! `REG_MR` work request registers pages into an `ALLOC_MR` region under a
//! new key, a `LOCAL_INV` invalidates a region's key. Neither reaches a
//! responder. Both change the VM's key maps under the VM's lock, which
//! every access through a key (the VM's own work requests and its peers'
//! messages) holds too: an access sees the region before or after, never
//! half of it.

use virtio_rdma_abi::config::F_ATOMIC;
use virtio_rdma_abi::datapath::{
    RegMrWqe, SendWqe, WcStatus, WrOpcode, REG_MR_MAX_PAGE_SHIFT, REG_MR_MIN_PAGE_SHIFT,
    WQE_INLINE, WQE_SOLICITED,
};
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::Field;

use crate::memory::access;
use crate::memory::HostMem;
use crate::resources::fast::{prefix, Registration};
use crate::rnic_path::SendWr;
use crate::vm::VmState;

/// The page array of a registration lies in one page of this size.
const ARRAY_BYTES: usize = 4096;
/// [`ARRAY_BYTES`] as an address span.
const ARRAY_PAGE: u64 = ARRAY_BYTES as u64;
/// Bytes a registration is charged per page it registers (spec 18.27,
/// "Cost": a work request of `npages` pages).
const CHARGE_PER_PAGE: u64 = 4096;

/// Whether `op` is one of the local memory operations (with `BIND_MW`,
/// spec 18.29).
#[inline]
pub(super) fn is_local(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::REG_MR | WrOpcode::LOCAL_INV | WrOpcode::BIND_MW
    )
}

/// Executes local operation `wr` (shape checked) of QP `h`: its outcome
/// (the requester completes it) and the bytes of work it is charged (a
/// registration's pages).
pub(super) fn execute(
    state: &mut VmState,
    mem: &HostMem,
    h: u32,
    wr: &SendWr<'_>,
) -> (Result<(), WcStatus>, u64) {
    match wr.opcode {
        WrOpcode::REG_MR => register(state, mem, h, &wr.hdr),
        WrOpcode::BIND_MW => (super::bind::bind(state, h, &wr.hdr), 0),
        _ => (invalidate(state, h, wr.hdr.rkey), 0),
    }
}

/// `LOCAL_INV` of `key` on QP `h`: the key of an `ALLOC_MR` region of the
/// QP's PD (all 32 bits), registered or free, or of a type 2 memory
/// window of that PD (spec 18.29).
fn invalidate(state: &mut VmState, h: u32, key: u32) -> Result<(), WcStatus> {
    let pd = state
        .res
        .qps
        .get(h)
        .map(|q| q.pd)
        .ok_or(WcStatus::LOC_PROT_ERR)?;
    if state.res.invalidate_key(pd, key) {
        Ok(())
    } else {
        Err(WcStatus::LOC_PROT_ERR)
    }
}

/// A `REG_MR` work request of QP `h` whose slot header is `hdr` (read as
/// a `SendWqe`), checked as spec 18.27 lists and applied; nothing changes
/// unless every check passes. Also the bytes of work it is charged: once
/// its page count is known to be within the region's, `npages` pages.
fn register(
    state: &mut VmState,
    mem: &HostMem,
    h: u32,
    hdr: &SendWqe,
) -> (Result<(), WcStatus>, u64) {
    let mut raw = [0u8; SendWqe::SIZE];
    hdr.write(&mut raw);
    let w = RegMrWqe::read(&raw);
    // `reserved0` is `SendWqe.num_sge` (0, or the WQE is malformed
    // already), `reserved1`'s upper half `SendWqe.reserved` (checked when
    // the WQE was taken).
    if w.reserved0 != 0 || w.reserved1 != 0 || w.flags & (WQE_INLINE | WQE_SOLICITED) != 0 {
        return (Err(WcStatus::LOC_QP_OP_ERR), 0);
    }
    let Some(max_num_sg) = checked_region(state, h, &w) else {
        return (Err(WcStatus::LOC_PROT_ERR), 0);
    };
    if w.npages == 0 || w.npages > max_num_sg {
        return (Err(WcStatus::LOC_PROT_ERR), 0);
    }
    let work = u64::from(w.npages).saturating_mul(CHARGE_PER_PAGE);
    let checked = checked_fields(state, &w).and_then(|()| {
        let mut array = [0u8; ARRAY_BYTES];
        let pages = read_array(state, mem, &w, &mut array)?;
        let reg = Registration {
            key: w.key,
            iova: w.iova,
            length: w.length,
            access: w.access,
            page_shift: w.page_shift,
        };
        let entries = pages.chunks_exact(8).map(le64);
        if state.res.fast_register(w.mr_handle, &reg, entries) {
            Ok(())
        } else {
            Err(WcStatus::LOC_PROT_ERR)
        }
    });
    (checked, work)
}

/// The `max_num_sg` of the region `w` names, if it is a free `ALLOC_MR`
/// region of QP `h`'s PD and `w.key` has its bits 31 to 8.
fn checked_region(state: &VmState, h: u32, w: &RegMrWqe) -> Option<u32> {
    let pd = state.res.qps.get(h)?.pd;
    let mr = state.res.fast_mr(w.mr_handle, pd)?;
    let fast = mr.fast?;
    // A registered region is invalidated before it is registered again.
    (!fast.valid && prefix(w.key) == prefix(mr.lkey)).then_some(fast.max_num_sg)
}

/// The checks of `w`'s fields that need no guest memory: page size,
/// length, access flags and the VM's registered bytes.
fn checked_fields(state: &VmState, w: &RegMrWqe) -> Result<(), WcStatus> {
    let bad = Err(WcStatus::LOC_PROT_ERR);
    if !(REG_MR_MIN_PAGE_SHIFT..=REG_MR_MAX_PAGE_SHIFT).contains(&w.page_shift) {
        return bad;
    }
    // Below 2^30, and `npages` at most 512: no overflow.
    let page = 1u64 << w.page_shift;
    let within = w.iova & page.wrapping_sub(1);
    let room = u64::from(w.npages).checked_shl(w.page_shift).unwrap_or(0);
    let fits = within.checked_add(w.length).is_some_and(|end| end <= room);
    if w.length == 0 || !fits || w.iova.checked_add(w.length).is_none() {
        return bad;
    }
    if w.length > state.limits.max_mr_size {
        return bad;
    }
    // Section 10.5's rules, as for the `REG_MR` command.
    let remote = acc::REMOTE_WRITE | acc::REMOTE_ATOMIC;
    if w.access & !acc::ALL != 0
        || (w.access & acc::REMOTE_ATOMIC != 0 && !state.has(F_ATOMIC))
        || (w.access & remote != 0 && w.access & acc::LOCAL_WRITE == 0)
    {
        return bad;
    }
    let bytes = state.res.registered_bytes.saturating_add(w.length);
    if bytes > state.limits.max_mr_bytes {
        return bad;
    }
    Ok(())
}

/// Copies the page array of `w` out of guest RAM into `array` and checks
/// it: 8-byte aligned, inside one 4 KiB page of RAM, and every page
/// aligned to the page size and wholly in one RAM region of the memory
/// table. Returns the copied bytes (`npages` entries).
fn read_array<'a>(
    state: &VmState,
    mem: &HostMem,
    w: &RegMrWqe,
    array: &'a mut [u8; ARRAY_BYTES],
) -> Result<&'a [u8], WcStatus> {
    let bad = WcStatus::LOC_PROT_ERR;
    let bytes = u64::from(w.npages).saturating_mul(8);
    let within = w.pages_gpa % ARRAY_PAGE;
    let in_page = within.checked_add(bytes).is_some_and(|e| e <= ARRAY_PAGE);
    if w.pages_gpa % 8 != 0 || !in_page || !state.ram.contains(w.pages_gpa, bytes) {
        return Err(bad);
    }
    let n = usize::try_from(bytes).map_err(|_| bad)?;
    let copy = array.get_mut(..n).ok_or(bad)?;
    // A copy first: the guest may change the array while it is checked.
    access::read_bytes(mem, w.pages_gpa, copy).map_err(|_| bad)?;
    let page = 1u64 << w.page_shift;
    for raw in copy.chunks_exact(8) {
        let gpa = le64(raw);
        if gpa & page.wrapping_sub(1) != 0 || !state.ram.contains(gpa, page) {
            return Err(bad);
        }
    }
    Ok(copy)
}

fn le64(raw: &[u8]) -> u64 {
    u64::read(raw)
}
