//! The libibverbs transport's data path ([`VerbsPath`]): the engine takes
//! WQEs from the guest's rings as for any transport and posts them to the
//! host QPs and SRQs (scatter lists pass unchanged: a guest region is a
//! host region at the guest's iova, its keys the host's); host completions
//! become the guest's CQEs in the order the host reports them.
//!
//! - [`post`]: send and receive work requests in libibverbs' terms;
//! - [`complete`]: host completions and host events applied to the VM.
//!
//! Every host work request is signaled (the host QPs have `sq_sig_all`),
//! so the engine learns of each one's end; the guest sees a success only
//! for a WQE it signaled. At most a send queue's depth of a QP's WQEs is
//! posted at a time, and host CQs are sized for everything that can
//! complete into them (`transport::verbs::rnic`), so neither host queue
//! overflows whatever the guest posts.

mod complete;
mod post;

use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;
use std::sync::atomic::Ordering;

use log::debug;
use rdma_sys::{
    ibv_modify_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_state, ibv_req_notify_cq, ibv_wc,
};

use super::requester::{complete_send, Completion, Outgoing};
use super::sweep::Serving;
use super::transport::{Step, TransportPath};
use super::wqe::WqeBuf;
use super::Engine;
use crate::memory::HostMem;
use crate::transport::verbs::rnic::{lock_tables, VmHost};
use crate::transport::verbs::VerbsRnic;
use crate::vm::VmState;
use virtio_rdma_abi::datapath::WcStatus;


/// Host completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// Reusable memory of the verbs data path on one engine thread.
pub struct Scratch {
    /// A receive WQE copied out of its ring.
    wqe: Box<WqeBuf>,
    /// Completions read from a host CQ.
    wcs: Vec<ibv_wc>,
    /// The host CQs of the VM being polled (addresses).
    cqs: Vec<usize>,
    /// The first bytes of a UD receive buffer (its GRH).
    segs: Vec<crate::memory::access::Segment>,
}

/// How often the watchdog looks for stalled QPs.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            wqe: WqeBuf::new(),
            // SAFETY: all-zero is a valid completion structure.
            wcs: (0..POLL_BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            cqs: Vec::new(),
            segs: Vec::new(),
        }
    }
}

/// The libibverbs transport's data path.
pub struct VerbsPath<'a> {
    rnic: &'a VerbsRnic,
}

impl<'a> VerbsPath<'a> {
    /// The data path of `rnic`.
    pub fn new(rnic: &'a VerbsRnic) -> Self {
        VerbsPath { rnic }
    }

    fn host(&self, vm: usize) -> Option<&'a VmHost> {
        self.rnic.vm(vm)
    }
}

impl TransportPath for VerbsPath<'_> {
    type Scratch = Scratch;

    const TAKES_RECEIVES: bool = true;

    fn post_send(
        &self,
        engine: &Engine,
        cx: &mut Serving<'_>,
        ts: &mut Self::Scratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step {
        let Some(host) = self.host(cx.vm) else {
            let c = Completion::failed(msg.wr.hdr.wr_id, msg.op, WcStatus::LOC_QP_OP_ERR);
            return complete_send(cx.state, cx.mem, msg.qp, msg.index, c);
        };
        post::send(self.rnic, host, engine, cx, &mut ts.wqe, moved, msg)
    }

    fn post_recv(
        &self,
        cx: &mut Serving<'_>,
        ts: &mut Self::Scratch,
        h: u32,
        rq_pi: u32,
        max: u32,
    ) -> bool {
        match self.host(cx.vm) {
            Some(host) => post::recvs(host, cx.state, cx.mem, &mut ts.wqe, h, rq_pi, max),
            None => false,
        }
    }

    fn poll(&self, _engine: &Engine, cx: &mut Serving<'_>, ts: &mut Self::Scratch) -> bool {
        let Some(host) = self.host(cx.vm) else {
            return false;
        };
        let mut did = complete::host_events(host, cx.state);
        did |= complete::poll_cqs(host, cx.state, cx.mem, ts);
        did |= complete::watchdog(host, cx.state, Instant::now(), WATCH_EVERY);
        if host.srqs.load(Ordering::Relaxed) > 0 {
            did |= post::srq_recvs(host, cx.state, cx.mem, &mut ts.wqe);
        }
        did
    }

    fn flush_taken(&self, vm: &mut VmState, _mem: &HostMem, h: u32) -> bool {
        // The device's QP failed for a reason the host did not see (a CQ
        // of the guest's overflowed, a ring left guest RAM): the host QP
        // must fail too, so that it flushes what it took.
        let Some(host) = self.host(vm.vm_index()) else {
            return false;
        };
        let Some(qpn) = vm.res.qps.get(h).map(|q| q.qpn) else {
            return false;
        };
        let mut t = lock_tables(host);
        if let Some(q) = t.qps.get_mut(&qpn).filter(|q| !q.failed) {
            // SAFETY: all-zero is a valid attribute structure.
            let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = ibv_qp_state::IBV_QPS_ERR;
            let mask = i32::try_from(ibv_qp_attr_mask::IBV_QP_STATE.0).unwrap_or(1);
            // SAFETY: a live QP of the VM and a filled attribute structure.
            let rc = unsafe { ibv_modify_qp(q.qp.as_ptr(), &mut a, mask) };
            if rc != 0 {
                debug!("QPN {qpn:#x}: host QP to ERR refused: {rc}");
            }
            q.failed = true;
        }
        false
    }

    fn wants_poll(&self, vm: usize) -> bool {
        self.host(vm).is_some_and(|h| {
            h.qps.load(Ordering::Relaxed) > 0
                || h.srqs.load(Ordering::Relaxed) > 0
                || !lock_events_empty(h)
        })
    }

    fn arm(&self, vm: usize) {
        let Some(host) = self.host(vm) else {
            return;
        };
        // Events of the last arming are read now: the descriptor must be
        // quiet for the park to mean anything.
        host.channel.drain();
        let _ = host.notify.read();
        let t = lock_tables(host);
        for cq in t.cqs.values() {
            // SAFETY: a live CQ of the VM's table.
            let rc = unsafe { ibv_req_notify_cq(cq.cq.as_ptr(), 0) };
            if rc != 0 {
                debug!("ibv_req_notify_cq: {rc}");
            }
        }
    }

    fn park_fds(&self, vm: usize, out: &mut Vec<RawFd>) {
        if let Some(host) = self.host(vm) {
            out.push(host.channel.fd());
            out.push(host.notify.as_raw_fd());
        }
    }
}

fn lock_events_empty(h: &VmHost) -> bool {
    h.events.lock().map(|e| e.is_empty()).unwrap_or(true)
}
