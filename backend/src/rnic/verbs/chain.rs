//! A burst's send work requests, posted to their host QP together: one
//! `ibv_post_send` per burst instead of one per work request (for
//! soft-RoCE, one `write(2)` to the kernel), with only the requests whose
//! end the engine must learn signaled on the host: those the guest
//! signaled, and the last of each post. A host completion then stands for
//! every request of the QP before it too: a send queue completes in order,
//! and a request that fails (or is flushed) always completes, signaled or
//! not. `complete::apply` reads them so.

use log::debug;
use rdma_sys::{ibv_post_send, ibv_send_flags, ibv_send_wr, ibv_sge};
use virtio_rdma_abi::datapath::WcStatus;

use super::complete::drain_unposted;
use super::rnic::Tables;
use crate::engine::wqe::MAX_STRIDE;
use crate::memory::HostMem;
use crate::vm::VmState;

/// Most work requests of one post (a burst takes at most
/// [`crate::qos::rate_limits::BURST`]; a longer one posts in parts).
pub(super) const CHAIN: usize = 32;

/// Most SGEs of one work request (the WQE format's).
pub(super) const MAX_SGE: usize = 32;

/// The work requests of one burst of one QP, not posted yet.
pub struct Chain {
    /// The device's QP number of the requests (while `len > 0`).
    qpn: u32,
    /// How many are waiting.
    len: usize,
    wrs: [ibv_send_wr; CHAIN],
    sges: [[ibv_sge; MAX_SGE]; CHAIN],
    /// Each request's inline data: the host copies it at the post, and
    /// the engine's copy of the WQE is reused by the next one.
    inline: [[u8; MAX_STRIDE]; CHAIN],
    /// Each request's `Sent::seq` (its host `wr_id`).
    seqs: [u64; CHAIN],
}

// SAFETY: the raw pointers in the requests point into the chain's own
// box (scatter lists, inline bytes, the links) or at host objects of the
// VM's tables (address handles), and are dereferenced only by
// `ibv_post_send` in `post`, with those tables locked; nothing in a chain
// is tied to the thread that filled it.
unsafe impl Send for Chain {}

impl Chain {
    /// An empty chain (boxed: it is some 60 KiB).
    pub fn new() -> Box<Self> {
        let layout = std::alloc::Layout::new::<Chain>();
        // SAFETY: `Chain` is not zero-sized.
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Chain>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of `Chain`'s layout, all zero,
        // and every field is plain data (integers, raw pointers, unions of
        // them) for which all-zero is a valid value.
        unsafe { Box::from_raw(p) }
    }

    /// Whether a request of QP `qpn` must wait for a post of those
    /// waiting: the chain is full, or holds another QP's.
    pub(super) fn must_post_before(&self, qpn: u32) -> bool {
        self.len == CHAIN || (self.len > 0 && self.qpn != qpn)
    }

    /// Adds request `wr` (its list and chaining are set here) of QP `qpn`
    /// with host `wr_id` `seq`: its scatter list `sges`, or its inline
    /// data. False (nothing added) when it does not fit
    /// ([`Chain::must_post_before`] first) or is larger than a WQE's.
    pub(super) fn push(
        &mut self,
        qpn: u32,
        mut wr: ibv_send_wr,
        sges: &[ibv_sge],
        inline: Option<&[u8]>,
        seq: u64,
    ) -> bool {
        let i = self.len;
        if self.must_post_before(qpn) {
            return false;
        }
        let (Some(list), Some(bytes), Some(slot), Some(s)) = (
            self.sges.get_mut(i),
            self.inline.get_mut(i),
            self.wrs.get_mut(i),
            self.seqs.get_mut(i),
        ) else {
            return false;
        };
        match inline {
            Some(data) => {
                let Some(to) = bytes.get_mut(..data.len()) else {
                    return false;
                };
                to.copy_from_slice(data);
                let Some(first) = list.first_mut() else {
                    return false;
                };
                *first = ibv_sge {
                    addr: to.as_ptr() as u64,
                    length: u32::try_from(data.len()).unwrap_or(0),
                    lkey: 0,
                };
                wr.num_sge = i32::from(!data.is_empty());
            }
            None => {
                let Some(to) = list.get_mut(..sges.len()) else {
                    return false;
                };
                to.copy_from_slice(sges);
                wr.num_sge = i32::try_from(sges.len()).unwrap_or(0);
            }
        }
        wr.sg_list = list.as_mut_ptr();
        wr.wr_id = seq;
        wr.next = std::ptr::null_mut();
        *slot = wr;
        *s = seq;
        self.qpn = qpn;
        self.len = i.saturating_add(1);
        true
    }
}

/// Posts the waiting requests to their host QP (in `t`, the VM's tables,
/// locked), the last one signaled. If the host refuses the post, its
/// requests fail with `LOC_QP_OP_ERR` after those before them, and the
/// host QP is moved to ERR so that those complete (flushed): as a refused
/// single post failed its work request and the QP.
pub(super) fn post(chain: &mut Chain, t: &mut Tables, state: &mut VmState, mem: &HostMem) {
    let n = std::mem::take(&mut chain.len);
    if n == 0 {
        return;
    }
    let qpn = chain.qpn;
    let Some(q) = t.qps.get_mut(&qpn) else {
        // The QP was destroyed meanwhile, its work with it.
        return;
    };
    let Some(wrs) = chain.wrs.get_mut(..n) else {
        return;
    };
    // Linked in order; the pointers are into the box, which does not move.
    let base = wrs.as_mut_ptr();
    for (i, w) in wrs.iter_mut().enumerate() {
        w.next = if i.saturating_add(1) < n {
            // SAFETY: `i + 1 < n <= CHAIN`: an element of the array.
            unsafe { base.add(i.saturating_add(1)) }
        } else {
            std::ptr::null_mut()
        };
    }
    if let Some(last) = wrs.last_mut() {
        last.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    // SAFETY: a live QP of the VM's table (locked); the requests, their
    // lists and inline bytes live in the chain across the call, which
    // copies what it keeps.
    let rc = unsafe { ibv_post_send(q.qp.as_ptr(), base, &mut bad) };
    if rc == 0 {
        return;
    }
    // The first request the host did not take (all of them if it does
    // not say).
    let first = if bad.is_null() {
        0
    } else {
        (bad as usize)
            .saturating_sub(base as usize)
            .checked_div(std::mem::size_of::<ibv_send_wr>())
            .unwrap_or(0)
            .min(n)
    };
    debug!("QPN {qpn:#x}: ibv_post_send of {n}: errno {rc}, {first} taken");
    // Every request of the post fails, those the host took too: their
    // last one, the signaled one, was not taken, so those that succeed
    // would never be reported (those that fail or are flushed are; they
    // then complete with the host's status).
    if let Some(&from) = chain.seqs.first() {
        for s in q.sent.iter_mut().filter(|s| s.seq >= from) {
            s.posted = false;
        }
    }
    q.fail();
    drain_unposted(q, state, mem, WcStatus::LOC_QP_OP_ERR);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ibv_send_wr {
        // SAFETY: all-zero is a valid work request.
        unsafe { std::mem::zeroed() }
    }

    fn sge(addr: u64) -> ibv_sge {
        ibv_sge {
            addr,
            length: 64,
            lkey: 7,
        }
    }

    /// A chain holds one QP's requests up to its size, each with its own
    /// copy of its scatter list or inline data and its host `wr_id`.
    #[test]
    fn holds_one_qps_requests_up_to_its_size() {
        let mut c = Chain::new();
        assert!(!c.must_post_before(5));
        assert!(c.push(5, request(), &[sge(0x1000), sge(0x2000)], None, 10));
        assert!(c.push(5, request(), &[], Some(b"hello"), 11));
        assert!(
            c.must_post_before(6),
            "another QP's request waits for a post"
        );
        assert!(!c.push(6, request(), &[sge(0x3000)], None, 12));
        let [first, second, ..] = &c.wrs;
        assert_eq!((first.wr_id, first.num_sge), (10, 2));
        assert_eq!((second.wr_id, second.num_sge), (11, 1));
        let [list0, list1, ..] = &c.sges;
        assert_eq!(first.sg_list.cast_const(), list0.as_ptr());
        assert_eq!(second.sg_list.cast_const(), list1.as_ptr());
        let [[a, b, ..], ..] = &c.sges;
        assert_eq!((a.addr, b.addr), (0x1000, 0x2000));
        let [_, [h, ..], ..] = &c.sges;
        let [_, bytes, ..] = &c.inline;
        assert_eq!((h.addr, h.length), (bytes.as_ptr() as u64, 5));
        assert!(bytes.starts_with(b"hello"));
        for seq in 12..42 {
            assert!(c.push(5, request(), &[sge(seq)], None, seq));
        }
        assert!(c.must_post_before(5), "full");
        assert!(!c.push(5, request(), &[sge(1)], None, 42));
        assert_eq!(c.len, CHAIN);
        assert_eq!(c.seqs.last(), Some(&41));
    }

    /// What does not fit a request is refused, not cut.
    #[test]
    fn refuses_what_does_not_fit() {
        let mut c = Chain::new();
        let many = [sge(1); MAX_SGE + 1];
        assert!(!c.push(1, request(), &many, None, 0));
        let long = [0u8; MAX_STRIDE + 1];
        assert!(!c.push(1, request(), &[], Some(&long), 0));
        assert_eq!(c.len, 0);
    }
}
