//! The `BIND_MW` work request (`F_MW`, spec 18.29): a window of the QP's
//! PD bound to a range of an MR of that PD under a new key, in the send
//! queue's order, or a type 1 window unbound. Executed by the requester
//! and completed at once, like the other local memory operations
//! (`fastreg`); the VM's lock, which every access through a key holds
//! too, makes the change atomic for them.

use virtio_rdma_abi::config::F_ATOMIC;
use virtio_rdma_abi::datapath::{BindMwWqe, SendWqe, WcStatus, WQE_INLINE, WQE_SOLICITED};
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::verbs::{MW_TYPE_1, MW_TYPE_2};
use virtio_rdma_abi::Field;

use crate::resources::fast::prefix;
use crate::resources::Binding;
use crate::vm::VmState;

/// `BIND_MW` of QP `h` whose slot header is `hdr` (read as a `SendWqe`):
/// checked as spec 18.29 lists and applied; nothing changes unless every
/// check passes.
pub(super) fn bind(state: &mut VmState, h: u32, hdr: &SendWqe) -> Result<(), WcStatus> {
    let mut raw = [0u8; SendWqe::SIZE];
    hdr.write(&mut raw);
    let w = BindMwWqe::read(&raw);
    // `reserved0` is `SendWqe.num_sge` (0, or the WQE is malformed
    // already); the upper half of `reserved3` is `SendWqe.reserved`.
    let reserved = u64::from(w.reserved0) | u64::from(w.reserved1) | w.reserved2 | w.reserved3;
    if reserved != 0 || w.flags & (WQE_INLINE | WQE_SOLICITED) != 0 {
        return Err(WcStatus::LOC_QP_OP_ERR);
    }
    let (binding, new_key) = checked(state, h, &w).ok_or(WcStatus::MW_BIND_ERR)?;
    if state.res.bind_window(w.mw_handle, new_key, binding) {
        Ok(())
    } else {
        Err(WcStatus::MW_BIND_ERR)
    }
}

/// What `w` binds window `w.mw_handle` to (`None`: a type 1 unbind) and
/// under which key, if every rule of spec 18.29 holds for QP `h`.
fn checked(state: &VmState, h: u32, w: &BindMwWqe) -> Option<(Option<Binding>, u32)> {
    let qp = state.res.qps.get(h)?;
    let (pd, incarnation) = (qp.pd, qp.incarnation);
    let mw = state.res.window(w.mw_handle, pd)?;
    if prefix(w.new_rkey) != prefix(mw.key) {
        return None;
    }
    // A type 2 window is invalidated before it is bound again.
    if mw.mw_type == MW_TYPE_2 && mw.binding.is_some() {
        return None;
    }
    if mw.mw_type == MW_TYPE_1 && w.length == 0 {
        return Some((None, w.new_rkey));
    }
    let mr_handle = *state.res.lkeys.get(&w.mr_lkey)?;
    let mr = state.res.mrs.get(mr_handle)?;
    if mr.pd != pd || mr.access & acc::MW_BIND == 0 || mr.host_lost {
        return None;
    }
    let end = w.addr.checked_add(w.length)?;
    let mr_end = mr.iova.checked_add(mr.length)?;
    if w.addr < mr.iova || end > mr_end {
        return None;
    }
    // Remote rights only; write and atomics need the MR's LOCAL_WRITE, as
    // they do for an MR (spec 10.5).
    let writes = acc::REMOTE_WRITE | acc::REMOTE_ATOMIC;
    if w.access & !acc::REMOTE != 0
        || (w.access & acc::REMOTE_ATOMIC != 0 && !state.has(F_ATOMIC))
        || (w.access & writes != 0 && mr.access & acc::LOCAL_WRITE == 0)
    {
        return None;
    }
    let binding = Binding {
        mr: mr_handle,
        addr: w.addr,
        length: w.length,
        access: w.access,
        qp: (mw.mw_type == MW_TYPE_2).then_some((h, incarnation)),
    };
    Some((Some(binding), w.new_rkey))
}
