//! The reusable memory of the libibverbs data path on one engine thread.

use rdma_sys::ibv_wc;

use super::cm::bridge::ToGuest;
use crate::engine::wqe::WqeBuf;
use crate::memory::access::Segment;

/// Host completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// Reusable memory of the verbs data path on one engine thread.
pub struct Scratch {
    /// A receive WQE copied out of its ring.
    pub(super) wqe: Box<WqeBuf>,
    /// Completions read from a host CQ.
    pub(super) wcs: Vec<ibv_wc>,
    /// The host CQs of the VM being polled (addresses).
    pub(super) cqs: Vec<usize>,
    /// The first bytes of a UD receive buffer (its GRH); a MAD's buffers.
    pub(super) segs: Vec<Segment>,
    /// MADs taken from a VM's inbox.
    pub(super) mads: Vec<ToGuest>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            wqe: WqeBuf::new(),
            // SAFETY: all-zero is a valid completion structure.
            wcs: (0..POLL_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            cqs: Vec::new(),
            segs: Vec::new(),
            mads: Vec::new(),
        }
    }
}
