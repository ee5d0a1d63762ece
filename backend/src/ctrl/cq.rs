//! CREATE_CQ, DESTROY_CQ, RESIZE_CQ.

use virtio_rdma_abi::config::F_RESIZE;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{cqe_owner, CqDoorbell, QpDoorbell, CQE_OWNER_OFFSET};
use virtio_rdma_abi::mem::CQE_SIZE;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::parse::{depth, destroy_error, field, fixed, with_list};
use super::qp::ring_pi;
use super::queue_mem::init_device_half;
use super::ring_copy::{copy_entries, Ring};
use super::{quota, CmdError, CmdResult, DETAIL_DB_RECORD};
use crate::memory::volatile::read_guest;
use crate::resources::Cq;
use crate::vm::VmState;

impl VmState {
    pub(super) fn create_cq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        let (req, list) = with_list::<CreateCqReq>(payload)?;
        if self.res.ctxs.get(req.ctx_handle).is_none() {
            return Err(field::<CreateCqReq>(Status::BAD_HANDLE, "ctx_handle"));
        }
        if self.res.cqs.len() >= self.limits.max_cq as usize {
            return Err(CmdError::new(Status::QUOTA, quota::CQ));
        }
        depth::<CreateCqReq>(req.depth, self.limits.max_cqe, "depth")?;
        let bytes = u64::from(req.depth).saturating_mul(u64::from(CQE_SIZE));
        let ring = self.queue_memory::<CreateCqReq, M>(mem, &req.buf, list, bytes, req.db_gpa)?;
        let cq_handle = self.res.insert_cq(
            Cq {
                ctx: req.ctx_handle,
                depth: req.depth,
                db_gpa: req.db_gpa,
                ring,
                users: 0,
                rt: Default::default(),
            },
            self.rnic.as_ref(),
        )?;
        init_device_half(mem, req.db_gpa);
        Ok(CqHandleResp { cq_handle }.to_bytes())
    }

    pub(super) fn destroy_cq(&mut self, payload: &[u8]) -> CmdResult {
        let req: CqHandleReq = fixed(payload)?;
        self.res
            .destroy_cq(req.cq_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<CqHandleReq>(e, "cq_handle"))?;
        Ok(Vec::new())
    }

    /// `RESIZE_CQ` (spec 12.25): the unconsumed CQEs move to the new ring
    /// at their indices. Under the VM's lock, which the engine holds while
    /// it writes completions: none is written meanwhile.
    pub(super) fn resize_cq<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        if !self.has(F_RESIZE) {
            return Err(CmdError::new(Status::UNSUPPORTED, Opcode::RESIZE_CQ.into()));
        }
        let (req, list) = with_list::<ResizeCqReq>(payload)?;
        let cq = self
            .res
            .cqs
            .get(req.cq_handle)
            .ok_or_else(|| field::<ResizeCqReq>(Status::BAD_HANDLE, "cq_handle"))?;
        depth::<ResizeCqReq>(req.depth, self.limits.max_cqe, "depth")?;
        let (old_depth, db_gpa, pi) = (cq.depth, cq.db_gpa, cq.rt.pi);
        let mut word = [0u8; 4];
        db_gpa
            .checked_add(CqDoorbell::CI)
            .and_then(|at| read_guest(mem, GuestAddress(at), &mut word).ok())
            .ok_or_else(|| CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD))?;
        let ci = u32::from_le_bytes(word);
        // The entries the driver has not consumed; a consumer index
        // outside the last `old_depth` entries is the driver's error.
        let unpolled = pi.wrapping_sub(ci);
        if unpolled > old_depth
            || u64::from(unpolled).saturating_add(self.pending_sends(mem, req.cq_handle))
                > u64::from(req.depth)
        {
            return Err(field::<ResizeCqReq>(Status::RANGE, "depth"));
        }
        let bytes = u64::from(req.depth).saturating_mul(u64::from(CQE_SIZE));
        let ring = self.queue_memory::<ResizeCqReq, M>(mem, &req.buf, list, bytes, db_gpa)?;
        let copied = match self.res.cqs.get(req.cq_handle) {
            Some(cq) => fill_cq_ring(mem, &cq.ring, old_depth, &ring, req.depth, ci, unpolled),
            None => false,
        };
        if !copied {
            self.res.release(ring);
            return Err(CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD));
        }
        self.res
            .swap_cq_ring(req.cq_handle, ring, req.depth)
            .map_err(|_| CmdError::new(Status::QUOTA, quota::HOST_BYTES))?;
        Ok(CqHandleResp {
            cq_handle: req.cq_handle,
        }
        .to_bytes())
    }
}

impl VmState {
    /// Send WQEs posted and not completed yet on the QPs whose send
    /// queue completes into CQ `cq` (at most each queue's depth): their
    /// completions are still to come, and a resized CQ must hold them
    /// (spec 12.25). The producer indices are the driver's; a false one
    /// only makes a resize of its own CQ fail.
    fn pending_sends<M: GuestMemoryBackend>(&self, mem: &M, cq: u32) -> u64 {
        self.res
            .qps
            .iter()
            .filter(|(_, q)| q.send_cq == cq)
            .map(|(_, q)| {
                ring_pi(q, mem, 0, QpDoorbell::SQ_PI)
                    .map_or(0, |pi| pi.wrapping_sub(q.rt.sq_ci).min(q.sq_depth))
            })
            .map(u64::from)
            .sum()
    }
}

/// Fills a CQ's new ring `to` of `depth` entries: entries `ci .. ci +
/// unpolled` of the old ring (`old_depth` entries) with the owner bit of
/// their index for the new depth, every other slot with an owner bit that
/// is not valid for the next index landing in it (spec 12.25, 18.15).
/// False if a ring is not in guest RAM.
fn fill_cq_ring<M: GuestMemoryBackend>(
    mem: &M,
    from: &crate::memory::PageList,
    old_depth: u32,
    to: &crate::memory::PageList,
    depth: u32,
    ci: u32,
    unpolled: u32,
) -> bool {
    let stride = CQE_SIZE as usize;
    let old = Ring {
        pages: from,
        depth: old_depth,
        stride,
    };
    let new = Ring {
        pages: to,
        depth,
        stride,
    };
    let owner_at = usize::try_from(CQE_OWNER_OFFSET).unwrap_or(0);
    let set_owner = |entry: &mut [u8], owner: u8| {
        if let Some(b) = entry.get_mut(owner_at) {
            *b = owner;
        }
    };
    let copied = copy_entries(mem, old, new, ci, unpolled, |index, entry| {
        set_owner(entry, cqe_owner(index, depth));
    });
    if copied.is_err() {
        return false;
    }
    // The slots after the copied entries, up to one ring: their next
    // index is `ci + unpolled ..`; an entry that is not valid for it.
    let mut empty = vec![0u8; stride];
    for i in unpolled..depth {
        let index = ci.wrapping_add(i);
        set_owner(&mut empty, cqe_owner(index, depth) ^ 1);
        if new.write(mem, index, &empty).is_err() {
            return false;
        }
    }
    true
}
