//! The small-WRITE lane: an RDMA WRITE of at most `LANE_MAX` bytes from
//! one SGE, on an RC QP whose route passed the requester's checks (earlier
//! in the burst, or just now in `Router::transmit`), into a QP of the VM
//! held for the burst, is checked and copied in one pass. The checks are the general path's own
//! (`sge::local_mr`, [`super::checks`]); what the lane leaves out is its
//! machinery: segment lists and the outcome plumbing of retries and NAKs.
//!
//! Nothing is changed before the copy: a message the lane does not take,
//! or one that fails any check, goes down the general path, which then
//! executes it or reports its failure exactly as without the lane.

use virtio_rdma_abi::datapath::{WcOpcode, WrOpcode};
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::QpType;

use super::burst::Burst;
use super::checks::{rc_responder, remote_region};
use super::pieces::PIECE;
use crate::engine::sge::local_mr;
use crate::memory::access::Translate;
use crate::memory::volatile;
use crate::rnic_path::{Outgoing, Serving};
use crate::stats::TrafficCounters;

/// The largest WRITE the lane takes: a page (larger ones cross pages on
/// one side or the other; the general path merges their runs).
pub(super) const LANE_MAX: u64 = 4096;

// A lane message is never one the general path would run in pieces.
const _: () = assert!(LANE_MAX <= PIECE);

/// Executes `msg`, whose route (VM, QP handle) `route` passed the
/// requester's checks, in the lane if it qualifies and passes every check;
/// returns the bytes moved, or `None` for the general path.
#[inline]
pub(super) fn small_write(
    cx: &mut Serving<'_>,
    b: &mut Burst<'_>,
    msg: &Outgoing<'_>,
    (peer_vm, peer_qp): (usize, u32),
) -> Option<u64> {
    let wr = msg.wr;
    if msg.op != WcOpcode::RDMA_WRITE
        || wr.opcode != WrOpcode::RDMA_WRITE
        || msg.qp_type != QpType::RC
        || wr.inline.is_some()
    {
        return None;
    }
    let [sge] = wr.sges else {
        return None;
    };
    let len = u64::from(sge.length);
    if len == 0 || len > LANE_MAX || len != msg.len {
        return None;
    }
    let held = b.held.as_ref().filter(|p| p.vm == peer_vm)?;
    let (state, mem) = (&*cx.state, cx.mem);
    // A message this QP has partly executed is resumed by the general path.
    if state.res.qps.get(msg.qp)?.rt.partial.is_some() {
        return None;
    }
    // The local buffer: the general path's checks (`sge::local_mr`), and
    // inside one page and one RAM region.
    let (_, (src_gpa, src_room)) = local_mr(state, msg.pd, sge, false).ok()?;
    if src_room < len {
        return None;
    }
    let src = mem.ptr(src_gpa, len)?;
    // The responder: the general path's checks (`checks`): running, at
    // the GID addressed, still that QPN, an RC QP that takes messages,
    // REMOTE_WRITE on the QP and on an MR of its PD whose bounds hold the
    // range.
    let peer = &*held.state;
    if !peer.owns_gid(&msg.av.dgid) {
        return None;
    }
    let q = rc_responder(peer, peer_qp, msg.dest_qpn, None).ok()?;
    if q.attr.access & acc::REMOTE_WRITE == 0 {
        return None;
    }
    let rmr = remote_region(peer, q, wr.hdr.rkey, acc::REMOTE_WRITE)?;
    let (dst_gpa, dst_room) = rmr.translate(wr.hdr.remote_addr, len)?;
    if dst_room < len {
        return None;
    }
    let dst = held.mem.ptr(dst_gpa, len)?;
    let n = usize::try_from(len).ok()?;
    // SAFETY: `src` and `dst` are host ranges of `len` bytes inside RAM
    // regions of the two VMs' memories (checked by `HostMem::ptr`), mapped
    // while `cx` borrows them; `guest_to_guest` allows overlap.
    unsafe { volatile::guest_to_guest(src, dst, n) };
    held.mem.dirty(dst_gpa, len);
    // What the responder does after a WRITE (`responder::respond`).
    let held = b.held.as_mut()?;
    held.state.comm_established(peer_qp);
    if let Some(t) = held.state.tenancy().traffic(held.state.vm_index()) {
        TrafficCounters::add_single_writer(&t.recv_ops, 1);
        TrafficCounters::add_single_writer(&t.recv_bytes, len);
    }
    if !held.state.events.is_empty() {
        held.dev.wake_events();
    }
    Some(len)
}
