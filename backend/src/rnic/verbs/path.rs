//! The libibverbs RNIC's data path ([`VerbsPath`]): the engine takes WQEs
//! from the guest's rings as for either RNIC and they are posted to the
//! host QPs and SRQs (scatter lists pass unchanged: a guest region is a
//! host region at the guest's iova, its keys the host's); host completions
//! become the guest's CQEs in the order the host reports them.
//!
//! A burst's send work requests go to the host in one post, signaled on
//! the host only where the guest signaled them and at the post's end
//! ([`super::chain`]): a host completion stands for the requests before it
//! too; the guest sees a success only for a WQE it signaled. At most a send queue's depth of a QP's WQEs is
//! posted at a time, and host CQs are sized for everything that can
//! complete into them ([`super::rnic`]), so neither host queue overflows
//! whatever the guest posts.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use log::debug;
use rdma_sys::ibv_req_notify_cq;
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::qp::QpType;

use super::chain::{self, Chain};
use super::rnic::moves;
use super::rnic::{lock_tables, VerbsRnic, VmHost};
use super::scratch::Scratch;
use super::{complete, gsi, post, routes};
use crate::engine::requester::{complete_send, Completion};
use crate::memory::HostMem;
use crate::rnic_path::{Outgoing, RnicPath, Serving, Step};
use crate::sync::lock;
use crate::tenancy::Tenancy;
use crate::vm::VmState;

/// How often the watchdog looks for stalled QPs.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The libibverbs RNIC's data path.
pub struct VerbsPath<'a> {
    rnic: &'a VerbsRnic,
    /// Who may reach whom, and the isolation and traffic counters.
    tenancy: &'a Tenancy,
    /// The send work requests of the burst being served, posted at its
    /// end (one engine thread: never contended).
    chain: Mutex<Box<Chain>>,
}

impl<'a> VerbsPath<'a> {
    /// The data path of `rnic` for the VMs of `tenancy`.
    pub fn new(rnic: &'a VerbsRnic, tenancy: &'a Tenancy) -> Self {
        VerbsPath {
            rnic,
            tenancy,
            chain: Mutex::new(Chain::new()),
        }
    }

    fn host(&self, vm: usize) -> Option<&'a VmHost> {
        self.rnic.vm(vm)
    }
}

impl RnicPath for VerbsPath<'_> {
    type Scratch = Scratch;
    /// The burst's chain of host work requests ([`super::chain`]).
    type Burst<'a> = Option<&'a mut Chain>;

    const TAKES_RECEIVES: bool = true;

    const WANTS_POLL: bool = true;

    fn with_burst<S, F>(
        &self,
        cx: &mut Serving<'_>,
        _h: u32,
        scratch: &mut S,
        burst: F,
    ) -> Option<bool>
    where
        F: for<'s> FnOnce(&mut Serving<'s>, &mut Self::Burst<'s>, &mut S) -> bool,
    {
        let mut chain = lock(&self.chain);
        // The chain is borrowed for the burst alone.
        let ran = {
            let mut cx = Serving {
                vms: cx.vms,
                vm: cx.vm,
                state: &mut *cx.state,
                mem: cx.mem,
            };
            burst(&mut cx, &mut Some(&mut **chain), scratch)
        };
        // The burst's work requests go to the host in one post.
        if let Some(host) = self.host(cx.vm) {
            chain::post(&mut chain, &mut lock_tables(host), cx.state, cx.mem);
        }
        Some(ran)
    }

    fn post_send(
        &self,
        cx: &mut Serving<'_>,
        burst: &mut Option<&mut Chain>,
        ts: &mut Self::Scratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step {
        if msg.qp_type == QpType::GSI {
            // QP 1 is the daemon's: its MADs go to the CM bridge.
            return gsi::send(self.rnic, self.tenancy, cx, ts, moved, msg);
        }
        let Some(host) = self.host(cx.vm) else {
            let c = Completion::failed(msg.wr.hdr.wr_id, msg.op, WcStatus::LOC_QP_OP_ERR);
            return complete_send(cx.state, cx.mem, msg.qp, msg.index, c);
        };
        match burst {
            Some(chain) => post::send(
                self.rnic,
                host,
                self.tenancy,
                cx,
                &mut ts.wqe,
                chain,
                moved,
                msg,
            ),
            // Outside a burst (not a path the engine takes): a chain of
            // its own, posted at once.
            None => {
                let mut chain = Chain::new();
                let step = post::send(
                    self.rnic,
                    host,
                    self.tenancy,
                    cx,
                    &mut ts.wqe,
                    &mut chain,
                    moved,
                    msg,
                );
                chain::post(&mut chain, &mut lock_tables(host), cx.state, cx.mem);
                step
            }
        }
    }

    fn post_recv(
        &self,
        cx: &mut Serving<'_>,
        ts: &mut Self::Scratch,
        h: u32,
        rq_pi: u32,
        max: u32,
    ) -> bool {
        // The GSI QP's receives stay in its ring until a MAD arrives.
        if cx.state.res.gsi_qp() == Some(h) {
            return false;
        }
        match self.host(cx.vm) {
            Some(host) => post::recvs(host, cx.state, cx.mem, &mut ts.wqe, h, rq_pi, max),
            None => false,
        }
    }

    fn poll(&self, cx: &mut Serving<'_>, ts: &mut Self::Scratch) -> bool {
        let Some(host) = self.host(cx.vm) else {
            return false;
        };
        let mut did = complete::host_events(host, cx.state);
        did |= gsi::deliver(self.rnic, self.tenancy, cx, ts);
        did |= complete::poll_cqs(host, cx.state, cx.mem, ts);
        let now = Instant::now();
        did |= complete::watchdog(host, cx.state, now, WATCH_EVERY);
        routes::flush_due(now);
        if host.srqs.load(Ordering::Relaxed) > 0 {
            did |= post::srq_recvs(host, cx.state, cx.mem, &mut ts.wqe);
        }
        if host.repoints.load(Ordering::Relaxed) > 0 {
            did |= self.repoint(host, cx, ts);
        }
        did
    }

    fn poll_stopped(&self, cx: &mut Serving<'_>, ts: &mut Self::Scratch) -> bool {
        let Some(host) = self.host(cx.vm) else {
            return false;
        };
        let mut did = complete::host_events(host, cx.state);
        did |= complete::poll_cqs(host, cx.state, cx.mem, ts);
        if !did && !moves::in_flight(host) {
            *lock(&host.rested) = Some(Instant::now());
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
        if let Some(q) = lock_tables(host).qps.get_mut(&qpn) {
            q.fail();
        }
        false
    }

    fn wants_poll(&self, vm: usize) -> bool {
        self.host(vm).is_some_and(|h| {
            h.qps.load(Ordering::Relaxed) > 0
                || h.srqs.load(Ordering::Relaxed) > 0
                || !lock_events_empty(h)
        }) || self.rnic.cm().is_some_and(|c| c.inboxes().pending(vm))
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

impl VerbsPath<'_> {
    /// Points the VM's connections whose destination moved at its new
    /// place (`moves::repoint_due`), then posts again the receives their
    /// host QPs dropped with the reset; a QP that could not be pointed
    /// fails. True if any was.
    fn repoint(&self, host: &VmHost, cx: &mut Serving<'_>, ts: &mut Scratch) -> bool {
        let res = &cx.state.res;
        let attrs = |h: u32| res.qps.get(h).map(|q| (q.state, q.attr));
        let done = moves::repoint_due(self.rnic, host, &attrs, Instant::now());
        for &(h, ok) in &done {
            let Some(q) = cx.state.res.qps.get_mut(h) else {
                continue;
            };
            if !ok {
                cx.state
                    .qp_enter_err(h, Some(virtio_rdma_abi::event::EventKind::QP_FATAL));
                continue;
            }
            // Its destination is on another daemon now, whatever this one
            // knew of it (spec 18.23's check is for destinations here).
            q.rt.dest_incarnation = None;
            if q.srq != 0 {
                continue;
            }
            // The host dropped its receives: the ring's, from the first
            // not completed on, go to it again.
            q.rt.recv_outstanding = 0;
            let depth = q.rq_depth;
            let pi = crate::engine::doorbell::load_pi(
                cx.mem,
                q.db_gpa,
                q.db_slot.as_ref(),
                crate::engine::doorbell::RQ,
            );
            if let Some(pi) = pi {
                post::recvs(host, cx.state, cx.mem, &mut ts.wqe, h, pi, depth);
            }
        }
        !done.is_empty()
    }
}

fn lock_events_empty(h: &VmHost) -> bool {
    h.events.lock().map(|e| e.is_empty()).unwrap_or(true)
}
