//! The software RNIC's data path ([`SoftPath`]): each send work request is
//! executed at once against the responder's objects and memory
//! ([`super::route`], [`super::responder`]); an RC message that finds no
//! receive WQE or no responder waits and is tried again as on a wire
//! ([`super::retry`]); a large message runs in pieces ([`super::pieces`]).

use std::time::Duration;

use log::debug;
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::qp::QpType;

use super::burst::{Burst, Held};
use super::lane;
use super::mad;
use super::pieces::{self, Pieces, Span};
use super::request::{RespOutcome, RespScratch};
use super::retry::{exhausted, pause_hold, rnr_retry, transport_retry, waiting};
use super::route::{same_thread, Router};
use crate::engine::requester::{complete_send, Completion};
use crate::memory::access::Segment;
use crate::memory::HostMem;
use crate::resources::Qp;
use crate::rnic_objects::RnicObjects;
use crate::rnic_path::{Head, Outgoing, RnicPath, Serving, Step};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;
use crate::vm::cell::Locked;
use crate::vm::VmState;

/// The software RNIC's data path.
#[derive(Clone, Copy)]
pub struct SoftPath<'a> {
    router: Router<'a>,
}

impl<'a> SoftPath<'a> {
    /// The data path over `objects` (the software RNIC's object half, or
    /// a wrapper of it) for the VMs of `tenancy`.
    pub fn new(objects: &'a dyn RnicObjects, tenancy: &'a Tenancy) -> Self {
        SoftPath {
            router: Router { objects, tenancy },
        }
    }
}

/// Reusable memory of the software RNIC on one engine thread.
pub struct SoftScratch {
    /// Segments of the local buffers of the message being sent.
    local: Vec<Segment>,
    /// The responder's side.
    resp: RespScratch,
    /// How large the pieces of the VM being served are.
    pieces: Pieces,
}

impl Default for SoftScratch {
    fn default() -> Self {
        SoftScratch {
            local: Vec::with_capacity(64),
            resp: RespScratch::new(),
            pieces: Pieces::new(),
        }
    }
}

/// Segment lists of this many entries and more are not kept between work
/// requests: one huge message must not leave the engine holding its
/// translation (16 bytes a page) for good.
const SCRATCH_KEEP: usize = 4096;

/// Gives back what one work request made the scratch lists grow past
/// [`SCRATCH_KEEP`].
fn shrink_scratch(local: &mut Vec<Segment>, resp: &mut RespScratch) {
    for v in [local, &mut resp.segs] {
        if v.capacity() > SCRATCH_KEEP {
            v.clear();
            v.shrink_to(SCRATCH_KEEP);
        }
    }
}

impl RnicPath for SoftPath<'_> {
    type Scratch = SoftScratch;
    type Burst<'a> = Burst<'a>;

    fn sweep_started(&self, ts: &mut SoftScratch) {
        ts.pieces.next_sweep();
    }

    fn vm_active(&self, ts: &mut SoftScratch, k: usize) {
        ts.pieces.note_active(k);
    }

    fn serving(&self, ts: &mut SoftScratch, k: usize) {
        ts.pieces.serve(k);
    }

    fn head(&self, qp: &Qp) -> Head {
        if let Some(at) = waiting(qp) {
            return Head::WaitUntil(at);
        }
        // The last transport retry found the destination unreachable, and
        // its timeout has passed (spec 18.20).
        match exhausted(qp) {
            Some((wr_id, op)) => Head::Failed(wr_id, op, WcStatus::RETRY_EXC_ERR),
            None => Head::Ready,
        }
    }

    fn with_burst<S, F>(
        &self,
        cx: &mut Serving<'_>,
        h: u32,
        scratch: &mut S,
        burst: F,
    ) -> Option<bool>
    where
        F: for<'s> FnOnce(&mut Serving<'s>, &mut Burst<'s>, &mut S) -> bool,
    {
        // An RC or UC QP talks to one QP: its VM is locked once for the
        // burst (unless it is the same VM, one out of reach, or one gone).
        let vm_id = cx.vm;
        let tenancy = self.router.tenancy;
        let rc = cx
            .state
            .res
            .qps
            .get(h)
            .is_some_and(|q| q.qp_type.connected());
        let peer = if rc {
            self.router.rc_route(cx.state, h).to().filter(|&(v, _)| {
                v != vm_id && tenancy.may_reach(vm_id, v) && same_thread(cx.vms, vm_id, v)
            })
        } else {
            None
        };
        let Some(dev) = peer.and_then(|(pvm, _)| cx.vms.get(pvm).and_then(Option::as_ref)) else {
            return Some(burst(cx, &mut Burst::default(), scratch));
        };
        let pvm = dev.id();
        // `burst` runs at most once: in the closure, or after it if the
        // peer's VM is gone.
        let mut burst = Some(burst);
        let done = dev.try_with_dataplane(|pstate, pmem| {
            let mut cx = Serving {
                vms: cx.vms,
                vm: vm_id,
                state: &mut *cx.state,
                mem: cx.mem,
            };
            let mut with_peer = Burst {
                held: Some(Held {
                    vm: pvm,
                    dev,
                    state: pstate,
                    mem: pmem,
                }),
                reached: None,
            };
            let did = burst
                .take()
                .is_some_and(|b| b(&mut cx, &mut with_peer, scratch));
            if let Some(held) = with_peer.held {
                if !held.state.events.is_empty() {
                    dev.wake_events();
                }
                // A QP of the peer that its responder failed during the
                // burst is flushed even if the peer's VM is parked (once
                // per burst, not per message).
                dev.engine_changed(held.state);
            }
            did
        });
        match done {
            Locked::Ran(did) => Some(did),
            // The peer's control path holds its lock: this QP waits for
            // the next sweep (its messages would only find the lock busy).
            Locked::Busy => None,
            Locked::Gone => Some(
                burst
                    .take()
                    .is_some_and(|b| b(cx, &mut Burst::default(), scratch)),
            ),
        }
    }

    // Inlined into the requester's burst, as the code it replaced was: a
    // call per work request measured 5 % of the 64 B message rate.
    #[inline]
    fn post_send(
        &self,
        cx: &mut Serving<'_>,
        b: &mut Burst<'_>,
        ts: &mut SoftScratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step {
        let (h, index, mem) = (msg.qp, msg.index, cx.mem);
        let (wr_id, op) = (msg.wr.hdr.wr_id, msg.op);
        // A small WRITE on the route the burst already checked, in one pass
        // (`lane`); a burst's first one takes it in `transmit`, after the
        // route's checks.
        let checked = b.reached.filter(|&(q, _)| q == h).map(|(_, r)| r);
        if let Some(n) = checked.and_then(|r| lane::small_write(cx, b, msg, r)) {
            *moved = n;
            if !msg.signaled {
                return Step::Done { published: false };
            }
            let c = Completion::ok(wr_id, op, u32::try_from(n).unwrap_or(u32::MAX));
            return complete_send(cx.state, mem, h, index, c);
        }
        let Some(qp) = cx.state.res.qps.get(h) else {
            return Step::Done { published: false };
        };
        // The requester's error completion for this WQE.
        let failed = |state: &mut VmState, status| {
            complete_send(state, mem, h, index, Completion::failed(wr_id, op, status))
        };
        let SoftScratch {
            local,
            resp,
            pieces,
        } = ts;
        pieces.size_next(msg.room.max_bytes, msg.room.moved);
        // A message this QP has partly executed (`pieces`).
        let partial = qp.rt.partial.filter(|p| p.index == index);
        let piecewise = pieces::piecewise(qp.qp_type, msg.wr);
        if partial.is_some_and(|p| !pieces::resumes(&p, msg.wr, piecewise, msg.len)) {
            return failed(cx.state, WcStatus::LOC_QP_OP_ERR);
        }
        let start = partial.map_or(0, |p| p.done);
        let limit = pieces.limit(piecewise);
        // The part this execution moves: all of it but for a piece.
        let Some(part) = pieces::part(piecewise, msg.len, start, limit) else {
            return failed(cx.state, WcStatus::LOC_QP_OP_ERR);
        };
        let span = Span { start, limit, part };
        let sent = if msg.qp_type == QpType::GSI {
            // QP 1 of the VM with that GID, not a QP number of the RNIC.
            mad::transmit(self.router.tenancy, cx, msg, local, resp)
        } else {
            self.router.transmit(cx, b, msg, span, local, resp)
        };
        let outcome = match sent {
            Ok(outcome) => outcome,
            Err(status) => return failed(cx.state, status),
        };
        // A multicast message is charged once per QP that took it.
        let copies = u64::from(std::mem::take(&mut resp.fanout).max(1));
        shrink_scratch(local, resp);
        let ud = msg.ud();
        // UC neither retries nor hears of a refusal (spec 18.11.6).
        let uc = msg.qp_type == QpType::UC;
        // UD and UC give no delivery guarantee: a message nobody takes is
        // dropped (spec 18.11.5), yet the send succeeded.
        let dropped = matches!(outcome, RespOutcome::Dropped)
            || ((ud || uc)
                && matches!(
                    outcome,
                    RespOutcome::Unreachable | RespOutcome::Stale | RespOutcome::Paused
                ))
            || (uc
                && matches!(
                    outcome,
                    RespOutcome::Nak(_) | RespOutcome::Gone | RespOutcome::Rnr(_)
                ));
        if dropped {
            if let Some(t) = self.router.tenancy.traffic(cx.vm) {
                TrafficCounters::add_single_writer(&t.drops, 1);
            }
        }
        if dropped || matches!(outcome, RespOutcome::Done) {
            *moved = part.1.saturating_mul(copies);
        }
        // `part.1 <= len - part.0`: at most `len`.
        let end = part.0.saturating_add(part.1);
        if matches!(outcome, RespOutcome::Done) && end < msg.len {
            // A piece: the WQE stays at the head until its last one.
            if let Some(q) = cx.state.res.qps.get_mut(h) {
                q.rt.partial = Some(pieces::started(index, msg.wr, msg.len, end));
            }
            return Step::Piece;
        }
        let ok = |state: &mut VmState| {
            if msg.signaled {
                let byte_len = u32::try_from(msg.len).unwrap_or(u32::MAX);
                let c = Completion::ok(wr_id, op, byte_len);
                return complete_send(state, mem, h, index, c);
            }
            Step::Done { published: false }
        };
        match outcome {
            RespOutcome::Done | RespOutcome::Dropped => ok(cx.state),
            _ if dropped => ok(cx.state),
            // UD gives no delivery guarantee: a message nobody takes is
            // dropped (spec 18.11.5).
            RespOutcome::Unreachable | RespOutcome::Stale | RespOutcome::Paused if ud => {
                ok(cx.state)
            }
            RespOutcome::Nak(status) => failed(cx.state, status),
            // The destination was destroyed: the requester knows it has
            // nobody to retry to (spec 18.23).
            RespOutcome::Gone => {
                debug!(
                    "QP {:#x}: destination {:#x} destroyed",
                    msg.src_qpn, msg.dest_qpn
                );
                if let Some(q) = cx.state.res.qps.get_mut(h) {
                    q.rt.dest_gone = true;
                }
                failed(cx.state, WcStatus::RETRY_EXC_ERR)
            }
            RespOutcome::Busy => Step::Busy,
            RespOutcome::Unreachable | RespOutcome::Stale => {
                let Some(qp) = cx.state.res.qps.get_mut(h) else {
                    return Step::Done { published: false };
                };
                debug!(
                    "QP {:#x}: destination {:#x} unreachable",
                    qp.qpn, msg.dest_qpn
                );
                let w = transport_retry(qp, index, wr_id, op);
                qp.rt.wait = Some(w);
                Step::Wait(w.at)
            }
            RespOutcome::Paused => {
                let hold = Duration::from_millis(u64::from(cx.state.limits.pause_hold_ms));
                let Some(qp) = cx.state.res.qps.get_mut(h) else {
                    return Step::Done { published: false };
                };
                let w = pause_hold(qp, index, wr_id, op, hold);
                qp.rt.wait = Some(w);
                Step::Wait(w.at)
            }
            RespOutcome::Rnr(code) => {
                let Some(qp) = cx.state.res.qps.get_mut(h) else {
                    return Step::Done { published: false };
                };
                match rnr_retry(qp, index, code) {
                    Some(w) => {
                        qp.rt.wait = Some(w);
                        Step::Wait(w.at)
                    }
                    None => failed(cx.state, WcStatus::RNR_RETRY_EXC_ERR),
                }
            }
        }
    }

    fn flush_taken(&self, vm: &mut VmState, mem: &HostMem, h: u32) -> bool {
        super::receive::flush_inbound(vm, mem, h)
    }
}
