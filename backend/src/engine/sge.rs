//! A QP's own scatter/gather lists: each SGE checked against its VM's MRs
//! (key, PD, rights, bounds) — or, with the local DMA key, against its
//! RAM — and resolved into segments of guest RAM, for the requester's
//! buffers and the responder's receive buffers alike.

use crate::keys::LOCAL_DMA_LKEY;
use crate::memory::access::{self, Segment, Translate};
use crate::resources::Mr;
use crate::vm::VmState;
use virtio_rdma_abi::config::F_MEM_MGT;
use virtio_rdma_abi::datapath::{Sge, WcStatus};
use virtio_rdma_abi::mem::access as acc;

/// The local memory an SGE names.
#[derive(Debug, Clone, Copy)]
pub enum LocalBuf<'c> {
    /// A range of a memory region (its `iova` space).
    Mr(&'c Mr),
    /// Guest-physical memory through the local DMA key (spec 18.28): the
    /// SGE's range `[start, end)`, inside one RAM region of the memory
    /// table.
    Dma {
        /// First guest-physical address of the SGE.
        start: u64,
        /// One past its last.
        end: u64,
    },
}

impl Translate for LocalBuf<'_> {
    #[inline]
    fn translate(&self, iova: u64, len: u64) -> Option<(u64, u64)> {
        match self {
            LocalBuf::Mr(mr) => mr.translate(iova, len),
            LocalBuf::Dma { start, end } => {
                if iova < *start || iova.checked_add(len)? > *end {
                    return None;
                }
                Some((iova, end.checked_sub(iova)?))
            }
        }
    }

    #[inline]
    fn walk(&self, iova: u64, len: u64, mut f: impl FnMut(u64, u64)) -> Option<()> {
        match self {
            LocalBuf::Mr(mr) => mr.walk(iova, len, f),
            LocalBuf::Dma { .. } => {
                self.translate(iova, len)?;
                if len > 0 {
                    f(iova, len);
                }
                Some(())
            }
        }
    }
}

/// Checks a local SGE list of a QP in PD `pd` of `state` (`write` requires
/// LOCAL_WRITE) and resolves its first `limit` bytes into `out` (which is
/// cleared first). Every SGE is checked in full — key, PD, rights and
/// bounds — but only the bytes that will be accessed are translated page by
/// page, so a small message into a large receive buffer costs little.
/// Returns the total length of the list. Any failure is a local protection
/// error.
pub fn local_segments(
    state: &VmState,
    pd: u32,
    sges: &[Sge],
    write: bool,
    limit: u64,
    out: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    local_range(state, pd, sges, write, 0, limit, out)
}

/// Checks a local SGE list of a QP in PD `pd` of `state` as
/// [`local_range`] does — key, PD, rights (`write`: LOCAL_WRITE) and bounds
/// of every SGE — without translating any of it: a cost in the number of
/// SGEs, not of bytes or pages. Returns the total length of the list.
pub fn check_local(state: &VmState, pd: u32, sges: &[Sge], write: bool) -> Result<u64, WcStatus> {
    let mut total = 0u64;
    for sge in sges.iter().filter(|s| s.length != 0) {
        local_mr(state, pd, sge, write)?;
        total = total.saturating_add(u64::from(sge.length));
    }
    Ok(total)
}

/// The memory of local SGE `sge` (of non-zero length) of a QP in PD `pd`,
/// once its key, PD, rights (`write`: LOCAL_WRITE) and bounds are checked,
/// and where the SGE starts: its guest address and the bytes contiguous
/// there.
pub fn local_mr<'c>(
    state: &'c VmState,
    pd: u32,
    sge: &Sge,
    write: bool,
) -> Result<(LocalBuf<'c>, (u64, u64)), WcStatus> {
    let Some(mr) = state
        .res
        .lkeys
        .get(&sge.lkey)
        .and_then(|h| state.res.mrs.get(*h))
    else {
        return local_dma(state, sge);
    };
    if mr.pd != pd || (write && mr.access & acc::LOCAL_WRITE == 0) || mr.host_lost {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    let at = mr
        .translate(sge.addr, u64::from(sge.length))
        .ok_or(WcStatus::LOC_PROT_ERR)?;
    Ok((LocalBuf::Mr(mr), at))
}

/// Local SGE `sge`, whose key names no memory region, through the local
/// DMA key (spec 18.28): with `F_MEM_MGT` negotiated, its `addr` is a
/// guest-physical address and the range lies in one RAM region of the
/// current memory table (one lookup in the VM's RAM map; the doorbell
/// region and other shared memory are not in it). Valid in every PD, for
/// reading and writing.
fn local_dma<'c>(state: &'c VmState, sge: &Sge) -> Result<(LocalBuf<'c>, (u64, u64)), WcStatus> {
    let len = u64::from(sge.length);
    if sge.lkey != LOCAL_DMA_LKEY || !state.has(F_MEM_MGT) || !state.ram.contains(sge.addr, len) {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    let end = sge.addr.checked_add(len).ok_or(WcStatus::LOC_PROT_ERR)?;
    Ok((
        LocalBuf::Dma {
            start: sge.addr,
            end,
        },
        (sge.addr, len),
    ))
}

/// [`local_segments`] for a piece of the list: every SGE is checked in full,
/// but only the `limit` bytes after the first `skip` are resolved into `out`
/// (a piece of a message executed in pieces). Returns the total length
/// of the list.
pub fn local_range(
    state: &VmState,
    pd: u32,
    sges: &[Sge],
    write: bool,
    skip: u64,
    limit: u64,
    out: &mut Vec<Segment>,
) -> Result<u64, WcStatus> {
    out.clear();
    let end = skip.saturating_add(limit);
    let mut total = 0u64;
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        let (mr, _) = local_mr(state, pd, sge, write)?;
        let len = u64::from(sge.length);
        // The part of this SGE inside [skip, end) of the list.
        let from = skip.saturating_sub(total).min(len);
        let to = end.saturating_sub(total).min(len);
        if to > from {
            let addr = sge.addr.checked_add(from).ok_or(WcStatus::LOC_PROT_ERR)?;
            access::resolve(&mr, addr, to.saturating_sub(from), out)
                .map_err(|_| WcStatus::LOC_PROT_ERR)?;
        }
        total = total.saturating_add(len);
    }
    Ok(total)
}
