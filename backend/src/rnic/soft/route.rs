//! Getting a message to its responder (`Router::transmit`): the QPN
//! lookup with its per-QP hint, the tenant policy's checks, and the peer
//! VM's lock, held for a burst (`burst::Burst`, `SoftPath::with_burst`).
//!
//! The engine locks a VM's device state while it works on that VM, and the
//! peer VM's state inside that for VM-to-VM operations (once per burst of
//! an RC QP). Control threads only ever hold their own VM's lock, and the
//! peer is always served by the same engine thread (only a VM of the same
//! tenant is reached, and a tenant's VMs share an engine; `deliver`
//! refuses any other route), so the nesting cannot deadlock.

use std::sync::Arc;

use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::{is_multicast_gid, MCAST_QPN};

use super::burst::Burst;
use super::checks::connected_responder;
use super::lane;
use super::pieces::Span;
use super::request::{Request, RespOutcome, RespScratch};
use super::responder::respond;
use crate::engine::sge::{check_local, local_range};
use crate::engine::{count_privileged, management_qp};
use crate::memory::access::Segment;
use crate::rnic_objects::RnicObjects;
use crate::rnic_path::{Outgoing, Serving};
use crate::tenancy::{IsolationCounters, Tenancy};
use crate::vm::cell::{Locked, VmCell};
use crate::vm::VmState;

/// Finds the responder of a message: QP numbers through the RNIC's object
/// half, reach through the tenant policy.
#[derive(Clone, Copy)]
pub(super) struct Router<'a> {
    /// The object half whose QP numbers messages address (the software
    /// RNIC's, or a test's wrapper of it).
    pub(super) objects: &'a dyn RnicObjects,
    /// Who may reach whom, and the isolation and traffic counters.
    pub(super) tenancy: &'a Tenancy,
}

impl Router<'_> {
    /// Sends message `msg` of QP `h` to its responder and returns the
    /// outcome, or the requester's error status when the message's local
    /// buffers fail their checks (keys, rights, bounds).
    ///
    /// An RC message finds its responder before a byte of it is
    /// translated: a message to nowhere (retried forever with `timeout` 0)
    /// then costs a lookup per try, not its length. Only the part of the
    /// message this execution moves is translated, into `local`.
    pub(super) fn transmit(
        &self,
        cx: &mut Serving<'_>,
        b: &mut Burst<'_>,
        msg: &Outgoing<'_>,
        span: Span,
        local: &mut Vec<Segment>,
        resp: &mut RespScratch,
    ) -> Result<RespOutcome, WcStatus> {
        let (h, ud, dgid) = (msg.qp, msg.ud(), msg.av.dgid);
        if ud && msg.dest_qpn == MCAST_QPN && is_multicast_gid(&dgid) {
            return self.multicast(cx, b, msg, span, local, resp);
        }
        let reached = b.reached.take().filter(|&(q, _)| q == h && !ud);
        let (route, unreached) = match reached {
            Some((_, route)) => (Some(route), None),
            None if ud => {
                let route = self.route_of(msg.dest_qpn);
                // QPs 0 and 1 have no route (never handed out): checked
                // only when the lookup failed, free for every delivery.
                if route.is_none() && management_qp(msg.dest_qpn) {
                    count_privileged(self.tenancy, cx.vm);
                    return Ok(RespOutcome::Nak(WcStatus::LOC_QP_OP_ERR));
                }
                (route, None)
            }
            None => {
                let (mut route, gone) = match self.rc_route(cx.state, h) {
                    RcRoute::To(r) => (Some(r), None),
                    RcRoute::Nowhere => (None, None),
                    RcRoute::Gone => (None, Some(RespOutcome::Gone)),
                };
                let unreached = gone.or_else(|| self.precheck_rc(cx, b, h, &mut route, dgid));
                (route, unreached)
            }
        };
        if let Some(outcome) = unreached {
            // Nothing is moved, but a message that could not even be
            // built still fails as such (keys, rights, bounds: a cost in
            // SGEs, not pages).
            check_local(cx.state, msg.pd, msg.wr.sges, msg.writes_local)?;
            return Ok(outcome);
        }
        // A small WRITE into the VM held for the burst, in one pass.
        if let Some(r) = route.filter(|_| !ud && span.start == 0) {
            if lane::small_write(cx, b, msg, r).is_some() {
                b.reached = Some((h, r));
                return Ok(RespOutcome::Done);
            }
        }
        self.general(cx, b, msg, span, route, local, resp)
    }

    /// The general path of [`Router::transmit`], for a message whose
    /// route (VM, QP handle) `route` passed the checks that need no lock
    /// of the responder's VM: its local buffers translated (the part
    /// `span` of them), then delivered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn general(
        &self,
        cx: &mut Serving<'_>,
        b: &mut Burst<'_>,
        msg: &Outgoing<'_>,
        span: Span,
        route: Option<(usize, u32)>,
        local: &mut Vec<Segment>,
        resp: &mut RespScratch,
    ) -> Result<RespOutcome, WcStatus> {
        let (h, ud, dgid) = (msg.qp, msg.ud(), msg.av.dgid);
        // Every piece resolves only its own part.
        let sges = msg.wr.sges;
        local_range(
            cx.state,
            msg.pd,
            sges,
            msg.writes_local,
            span.start,
            span.limit,
            local,
        )?;
        // The key still allows the range, but the VMM may have taken the
        // pages out of the memory table since (spec 19.6.2): a local
        // protection error, not a fault of the responder.
        if !local.iter().all(|s| cx.mem.covers(s.gpa, s.len)) {
            return Err(WcStatus::LOC_PROT_ERR);
        }
        let mut req = Request {
            admitted: !ud,
            wr: msg.wr,
            qp_type: msg.qp_type,
            vm: cx.vm,
            src_qpn: msg.src_qpn,
            src_gid: source_gid(cx.state, &msg.av),
            av: msg.av,
            local,
            len: msg.len,
            part: span.part,
            mem: cx.mem,
            dest_qpn: msg.dest_qpn,
            qkey: msg.qkey,
        };
        let mut outcome = deliver(cx, b, route, dgid, &req, ud, resp);
        if !ud && matches!(outcome, RespOutcome::Done) {
            b.reached = route.map(|r| (h, r));
        }
        if matches!(outcome, RespOutcome::Stale) {
            // The routing hint was stale: resolve the QPN afresh, once.
            // The number may now belong to another QP of the VM held for
            // this burst: `deliver` must use that lock, not take it again.
            let route = if ud {
                self.route_of(msg.dest_qpn)
            } else {
                match self.relookup(cx.state, h) {
                    RcRoute::To(r) => Some(r),
                    RcRoute::Nowhere => None,
                    RcRoute::Gone => return Ok(RespOutcome::Gone),
                }
            };
            req.admitted = false;
            outcome = deliver(cx, b, route, dgid, &req, ud, resp);
        }
        Ok(outcome)
    }

    /// A UD message to a multicast group (spec 18.11.7): its local
    /// buffers translated once, then handed to every QP attached to the
    /// group in a VM of the sender's tenant on this engine thread (each
    /// takes it or drops it, as a UD QP does). `Done` if any took it, else
    /// `Dropped`; `resp.fanout` says how many did, for the charge.
    fn multicast(
        &self,
        cx: &mut Serving<'_>,
        b: &mut Burst<'_>,
        msg: &Outgoing<'_>,
        span: Span,
        local: &mut Vec<Segment>,
        resp: &mut RespScratch,
    ) -> Result<RespOutcome, WcStatus> {
        local_range(
            cx.state,
            msg.pd,
            msg.wr.sges,
            msg.writes_local,
            span.start,
            span.limit,
            local,
        )?;
        if !local.iter().all(|s| cx.mem.covers(s.gpa, s.len)) {
            return Err(WcStatus::LOC_PROT_ERR);
        }
        let req = Request {
            admitted: false,
            wr: msg.wr,
            qp_type: msg.qp_type,
            vm: cx.vm,
            src_qpn: msg.src_qpn,
            src_gid: source_gid(cx.state, &msg.av),
            av: msg.av,
            local,
            len: msg.len,
            part: span.part,
            mem: cx.mem,
            dest_qpn: MCAST_QPN,
            qkey: msg.qkey,
        };
        let mut members = std::mem::take(&mut resp.members);
        self.objects.mcast_members(&msg.av.dgid, &mut members);
        let mut took = 0u32;
        for m in &members {
            let reach = m.vm == cx.vm
                || (self.tenancy.may_reach(cx.vm, m.vm) && same_thread(cx.vms, cx.vm, m.vm));
            if !reach {
                continue;
            }
            let out = if m.vm == cx.vm {
                respond(cx.state, cx.mem, m.handle, &req, true, resp)
            } else if let Some(p) = b.held.as_mut().filter(|p| p.vm == m.vm) {
                let out = respond(p.state, p.mem, m.handle, &req, true, resp);
                if !p.state.events.is_empty() {
                    p.dev.wake_events();
                }
                out
            } else {
                match cx.vms.get(m.vm).and_then(Option::as_ref) {
                    Some(peer) => match respond_in(peer, |_| Ok(m.handle), &req, true, resp) {
                        Locked::Ran(out) => out,
                        // A member whose VM is busy or gone misses the
                        // message, as a UD receiver may.
                        Locked::Busy | Locked::Gone => RespOutcome::Dropped,
                    },
                    None => RespOutcome::Dropped,
                }
            };
            if matches!(out, RespOutcome::Done) {
                took = took.saturating_add(1);
            }
        }
        members.clear();
        resp.members = members;
        resp.fanout = took;
        Ok(if took > 0 {
            RespOutcome::Done
        } else {
            RespOutcome::Dropped
        })
    }

    /// Where RC QP `h`'s messages go, from the QP's hint when it names
    /// the current destination QPN and the incarnation the QP is bound to
    /// (spec 18.23), else looked up.
    pub(super) fn rc_route(&self, state: &mut VmState, h: u32) -> RcRoute {
        let Some(qp) = state.res.qps.get(h) else {
            return RcRoute::Nowhere;
        };
        // An unbound QP looks its destination up every time: a hint
        // could name a QP destroyed before the QP ever reached it.
        if let (Some((qpn, vm, ph, inc)), Some(bound)) = (qp.rt.peer, qp.rt.dest_incarnation) {
            if qpn == qp.attr.dest_qpn && inc == bound {
                return RcRoute::To((vm, ph));
            }
        }
        self.relookup(state, h)
    }

    /// Looks RC QP `h`'s destination up afresh (no hint, or a stale one)
    /// and keeps the result as its new hint.
    pub(super) fn relookup(&self, state: &mut VmState, h: u32) -> RcRoute {
        let Some(qp) = state.res.qps.get_mut(h) else {
            return RcRoute::Nowhere;
        };
        let dest = qp.attr.dest_qpn;
        let found = self.objects.lookup_qpn(dest);
        qp.rt.peer = found.map(|o| (dest, o.vm, o.handle, o.incarnation));
        match (found, qp.rt.dest_incarnation) {
            // The QP it was connected to is destroyed; the number is free
            // or another QP's.
            (None, Some(_)) => RcRoute::Gone,
            (Some(o), Some(bound)) if o.incarnation != bound => RcRoute::Gone,
            (Some(o), _) => RcRoute::To((o.vm, o.handle)),
            (None, None) => RcRoute::Nowhere,
        }
    }

    /// The (VM, QP handle) that has QP number `qpn`.
    fn route_of(&self, qpn: u32) -> Option<(usize, u32)> {
        self.objects.lookup_qpn(qpn).map(|o| (o.vm, o.handle))
    }

    /// What an RC message of QP `h` finds before anything of it is
    /// translated: `Some(outcome)` when it cannot be delivered — no QP
    /// with that number at that GID in reach, or a responder QP that
    /// takes no message in its state — else `None`, with `route` updated
    /// if the hint was stale. Only what is known without locking the
    /// peer is looked at: the same VM, or the VM held for the burst.
    fn precheck_rc(
        &self,
        cx: &mut Serving<'_>,
        b: &Burst<'_>,
        h: u32,
        route: &mut Option<(usize, u32)>,
        dgid: [u8; 16],
    ) -> Option<RespOutcome> {
        for fresh in [false, true] {
            let (pvm, pqp) = match admit(cx, *route, dgid, false) {
                Ok(r) => r,
                // A stopped destination may have moved to another
                // instance of its VM (spec 20.5): look it up again.
                Err(RespOutcome::Paused) if !fresh => {
                    *route = match self.relookup(cx.state, h) {
                        RcRoute::To(r) => Some(r),
                        RcRoute::Nowhere => None,
                        // Destroyed while it was stopped: a reset, whose
                        // failing of its peers flushes this QP's work
                        // (spec 18.23); until then, as towards a host that
                        // does not answer.
                        RcRoute::Gone => return Some(RespOutcome::Unreachable),
                    };
                    continue;
                }
                Err(outcome) => return Some(outcome),
            };
            let qp = cx.state.res.qps.get_mut(h)?;
            let dest_qpn = qp.attr.dest_qpn;
            // The route's hint holds the incarnation of the QP found.
            let Some((_, _, _, inc)) = qp.rt.peer else {
                return Some(RespOutcome::Unreachable);
            };
            // The first message that finds its destination in reach binds
            // a QP connected while it was not live (spec 18.23).
            qp.rt.dest_incarnation.get_or_insert(inc);
            let t = qp.qp_type;
            let verdict = if pvm == cx.vm {
                connected_responder(cx.state, pqp, dest_qpn, Some(inc), t).err()
            } else {
                match b.held.as_ref().filter(|p| p.vm == pvm) {
                    Some(p) => connected_responder(p.state, pqp, dest_qpn, Some(inc), t).err(),
                    None => None,
                }
            };
            match verdict {
                Some(RespOutcome::Stale) if !fresh => {
                    *route = match self.relookup(cx.state, h) {
                        RcRoute::To(r) => Some(r),
                        RcRoute::Nowhere => None,
                        RcRoute::Gone => return Some(RespOutcome::Gone),
                    };
                }
                Some(RespOutcome::Stale) => return Some(RespOutcome::Unreachable),
                other => return other,
            }
        }
        None
    }
}

/// Where an RC QP's messages go ([`Router::rc_route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RcRoute {
    /// To this (VM, QP handle), if the tenant policy lets them.
    To((usize, u32)),
    /// No QP has the destination QPN, and the QP was never bound to one:
    /// unreachable (retried).
    Nowhere,
    /// The QP it is connected to was destroyed (spec 18.23).
    Gone,
}

impl RcRoute {
    /// The (VM, QP handle), if there is one.
    pub(super) fn to(self) -> Option<(usize, u32)> {
        match self {
            RcRoute::To(r) => Some(r),
            RcRoute::Nowhere | RcRoute::Gone => None,
        }
    }
}

/// Why [`deliver`] found no responder (which isolation counter moves).
#[derive(Clone, Copy)]
enum Unreached {
    /// No such QPN (at the GID addressed).
    Unknown,
    /// A UD message to another tenant.
    ForeignUd,
    /// An RC message to another tenant.
    ForeignRc,
}

/// Hands `req` to the responder at `route` (VM, QP handle): in the same VM,
/// in the VM held for the burst, or in another VM locked for this message.
///
/// The tenant policy (spec 18.23): QP numbers are a per-tenant namespace.
/// A route to a VM of another tenant ends here exactly as a QPN that does
/// not exist — `Unreachable` (UD drops, RC retries) — before anything of
/// the other VM is looked at; it is counted in the requester's
/// `foreign_drops` (UD) or `foreign_rc` (RC). A QPN that exists nowhere, or
/// not at the GID addressed, counts `unknown_qpn`. Counts are per attempt
/// (each RC retry counts again, as each would be a packet on a wire).
fn deliver(
    cx: &mut Serving<'_>,
    b: &mut Burst<'_>,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
) -> RespOutcome {
    // An RC message's route was admitted by `Router::precheck_rc` already.
    let admitted = if req.admitted {
        route.ok_or(RespOutcome::Unreachable)
    } else {
        admit(cx, route, dgid, ud)
    };
    let (peer_vm, peer_qp) = match admitted {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    if peer_vm == cx.vm {
        return respond(cx.state, cx.mem, peer_qp, req, ud, resp);
    }
    if let Some(p) = b.held.as_mut().filter(|p| p.vm == peer_vm) {
        if !p.state.owns_gid(&dgid) {
            return RespOutcome::Unreachable;
        }
        let out = respond(p.state, p.mem, peer_qp, req, ud, resp);
        if !p.state.events.is_empty() {
            p.dev.wake_events();
        }
        return out;
    }
    let Some(peer) = cx.vms.get(peer_vm).and_then(Option::as_ref) else {
        return RespOutcome::Unreachable;
    };
    let ran = respond_in(
        peer,
        |pstate| {
            if pstate.owns_gid(&dgid) {
                Ok(peer_qp)
            } else {
                Err(RespOutcome::Unreachable)
            }
        },
        req,
        ud,
        resp,
    );
    match ran {
        Locked::Ran(out) => out,
        Locked::Busy => RespOutcome::Busy,
        Locked::Gone => RespOutcome::Unreachable,
    }
}

/// Hands `req` to the responder QP that `find` names in VM `peer` (or
/// answers what `find` says), under the VM's lock if it is free
/// ([`VmCell::try_with_dataplane`]); wakes its event worker and its
/// engine list as the responder's part requires.
pub(super) fn respond_in(
    peer: &VmCell,
    find: impl FnOnce(&VmState) -> Result<u32, RespOutcome>,
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
) -> Locked<RespOutcome> {
    peer.try_with_dataplane(|pstate, pmem| {
        let qp = match find(pstate) {
            Ok(qp) => qp,
            Err(outcome) => return outcome,
        };
        let out = respond(pstate, pmem, qp, req, ud, resp);
        if !pstate.events.is_empty() {
            peer.wake_events();
        }
        // A QP the responder failed is flushed even if its VM is parked.
        peer.engine_changed(pstate);
        out
    })
}

/// The checks of [`deliver`] that need no lock of the other VM: the route
/// (VM, QP handle) of a message to `dgid`, or the outcome (`Unreachable`,
/// counted in the requester's isolation counters) when there is none in
/// reach (see [`deliver`] for the tenant policy).
fn admit(
    cx: &Serving<'_>,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    ud: bool,
) -> Result<(usize, u32), RespOutcome> {
    let (vms, vm_id, state) = (cx.vms, cx.vm, &*cx.state);
    let count = |which: Unreached| {
        if let Some(c) = state.tenancy().counters(vm_id) {
            IsolationCounters::bump(match which {
                Unreached::Unknown => &c.unknown_qpn,
                Unreached::ForeignUd => &c.foreign_drops,
                Unreached::ForeignRc => &c.foreign_rc,
            });
        }
        Err(RespOutcome::Unreachable)
    };
    let unknown = Unreached::Unknown;
    let Some((peer_vm, peer_qp)) = route else {
        return count(unknown);
    };
    if peer_vm == vm_id {
        if !state.owns_gid(&dgid) {
            return count(unknown);
        }
        return Ok((peer_vm, peer_qp));
    }
    if !state.tenancy().may_reach(vm_id, peer_vm) {
        return count(if ud {
            Unreached::ForeignUd
        } else {
            Unreached::ForeignRc
        });
    }
    // Never lock a VM of another engine thread (see the module
    // documentation). A tenant's VMs share a thread, so this only guards
    // that invariant.
    if !same_thread(vms, vm_id, peer_vm) {
        return count(unknown);
    }
    // The peer's GID, from the tenancy table: no need to lock the peer to
    // learn that the address is wrong.
    if !state
        .tenancy()
        .vm(peer_vm)
        .is_some_and(|v| v.gids.contains(&dgid))
    {
        return count(unknown);
    }
    // A stopped device takes no message (spec 15.1); checked again under
    // its lock. Its requesters hold (spec 20.6).
    match vms.get(peer_vm).and_then(Option::as_ref) {
        Some(d) if d.running() => {}
        Some(_) => return Err(RespOutcome::Paused),
        None => return Err(RespOutcome::Unreachable),
    }
    Ok((peer_vm, peer_qp))
}

/// Whether VMs `a` and `b` are served by the same engine thread.
pub(super) fn same_thread(vms: &[Option<Arc<VmCell>>], a: usize, b: usize) -> bool {
    let thread = |v: usize| {
        vms.get(v)
            .and_then(Option::as_ref)
            .map(|d| d.engine_index())
    };
    thread(a).is_some() && thread(a) == thread(b)
}

/// The source GID of a message sent with address vector `av` by a QP of
/// `state`: the entry of its port's table that `av.sgid_index` names (the
/// control path let only assigned entries into AHs and QP attributes, and
/// the table never changes; an unassigned one would read as zero).
pub(super) fn source_gid(state: &VmState, av: &AddressVector) -> [u8; 16] {
    state
        .gids()
        .assigned(u32::from(av.sgid_index))
        .unwrap_or([0; 16])
}
