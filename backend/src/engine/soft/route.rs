//! Routing a message to its responder: the QPN lookup with its per-QP hint,
//! the tenant policy's checks, and the peer VM's lock.
//!
//! The engine locks a VM's device state while it works on that VM, and the
//! peer VM's state inside that for VM-to-VM operations (once per burst of
//! an RC QP). Control threads only ever hold their own VM's lock, and the
//! peer is always served by the same engine thread (only a VM of the same
//! tenant is reached, and a tenant's VMs share an engine; [`deliver`]
//! refuses any other route), so the nesting cannot deadlock.

use std::sync::Arc;

use virtio_rdma_abi::qp::{QpState, QpType};

use super::responder::respond;
use super::{Request, RespOutcome, RespScratch};
use crate::ctrl::Ctrl;
use crate::device::{Locked, RdmaDevice};
use crate::engine::Engine;
use crate::memory::HostMem;
use crate::tenancy::IsolationCounters;

/// The other VM of an RC QP's burst, locked once for the whole burst.
pub(in crate::engine) struct Held<'p> {
    pub(in crate::engine) vm: usize,
    pub(in crate::engine) dev: &'p RdmaDevice,
    pub(in crate::engine) ctrl: &'p mut Ctrl,
    pub(in crate::engine) mem: &'p HostMem,
}

impl Engine {
    /// Where an RC QP's messages go: (VM, QP handle), from the QP's hint
    /// when it names the current destination QPN.
    pub(in crate::engine) fn rc_route(&self, ctrl: &mut Ctrl, h: u32) -> Option<(usize, u32)> {
        let qp = ctrl.res.qps.get_mut(h)?;
        let dest = qp.attr.dest_qpn;
        if let Some((qpn, vm, ph)) = qp.rt.peer {
            if qpn == dest {
                return Some((vm, ph));
            }
        }
        let (vm, ph) = self.rnic.lookup_qpn(dest)?;
        qp.rt.peer = Some((dest, vm, ph));
        Some((vm, ph))
    }

    /// Looks destination `dest_qpn` of QP `h` up afresh (its routing hint
    /// was stale); an RC QP (`hint`) keeps the result as its new hint.
    pub(in crate::engine) fn relookup(
        &self,
        ctrl: &mut Ctrl,
        h: u32,
        dest_qpn: u32,
        hint: bool,
    ) -> Option<(usize, u32)> {
        let route = self.rnic.lookup_qpn(dest_qpn);
        if let Some(q) = ctrl.res.qps.get_mut(h) {
            q.rt.peer = match route {
                Some((vm, ph)) if hint => Some((dest_qpn, vm, ph)),
                _ => None,
            };
        }
        route
    }

    /// What an RC message of QP `h` finds before anything of it is
    /// translated: `Some(outcome)` when it cannot be delivered — no QP
    /// with that number at that GID in reach, or a responder QP that
    /// takes no message in its state — else `None`, with `route` updated
    /// if the hint was stale. Only what is known without locking the
    /// peer is looked at: the same VM, or the VM held for the burst.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) fn precheck_rc(
        &self,
        vms: &[Option<Arc<RdmaDevice>>],
        vm_id: usize,
        ctrl: &mut Ctrl,
        h: u32,
        route: &mut Option<(usize, u32)>,
        dgid: [u8; 16],
        held: Option<&Held<'_>>,
    ) -> Option<RespOutcome> {
        let dest_qpn = ctrl.res.qps.get(h).map(|q| q.attr.dest_qpn)?;
        for fresh in [false, true] {
            let (pvm, pqp) = match admit(vms, vm_id, ctrl, *route, dgid, false) {
                Ok(r) => r,
                Err(outcome) => return Some(outcome),
            };
            let verdict = if pvm == vm_id {
                responder_takes(ctrl, pqp, dest_qpn)
            } else {
                match held.filter(|p| p.vm == pvm) {
                    Some(p) => responder_takes(p.ctrl, pqp, dest_qpn),
                    None => None,
                }
            };
            match verdict {
                Some(RespOutcome::Stale) if !fresh => {
                    *route = self.relookup(ctrl, h, dest_qpn, true);
                }
                Some(RespOutcome::Stale) => return Some(RespOutcome::Unreachable),
                other => return other,
            }
        }
        None
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
#[allow(clippy::too_many_arguments)]
pub(in crate::engine) fn deliver(
    vms: &[Option<Arc<RdmaDevice>>],
    vm_id: usize,
    ctrl: &mut Ctrl,
    mem: &HostMem,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
    held: Option<&mut Held<'_>>,
) -> RespOutcome {
    // An RC message's route was admitted by `Engine::precheck_rc` already.
    let admitted = if req.admitted {
        route.ok_or(RespOutcome::Unreachable)
    } else {
        admit(vms, vm_id, ctrl, route, dgid, ud)
    };
    let (peer_vm, peer_qp) = match admitted {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    if peer_vm == vm_id {
        return respond_ud_checked(ctrl, mem, peer_qp, req, ud, resp);
    }
    if let Some(p) = held.filter(|p| p.vm == peer_vm) {
        if p.ctrl.port_gid() != dgid {
            return RespOutcome::Unreachable;
        }
        let out = respond_ud_checked(p.ctrl, p.mem, peer_qp, req, ud, resp);
        if !p.ctrl.events.is_empty() {
            p.dev.wake_events();
        }
        return out;
    }
    let Some(peer) = vms.get(peer_vm).and_then(Option::as_ref) else {
        return RespOutcome::Unreachable;
    };
    let ran = peer.try_with_dataplane(|pctrl, pmem| {
        if pctrl.port_gid() != dgid {
            return RespOutcome::Unreachable;
        }
        let out = respond_ud_checked(pctrl, pmem, peer_qp, req, ud, resp);
        if !pctrl.events.is_empty() {
            peer.wake_events();
        }
        out
    });
    match ran {
        Locked::Ran(out) => out,
        Locked::Busy => RespOutcome::Busy,
        Locked::Gone => RespOutcome::Unreachable,
    }
}

/// The checks of [`deliver`] that need no lock of the other VM: the route
/// (VM, QP handle) of a message to `dgid`, or the outcome (`Unreachable`,
/// counted in the requester's isolation counters) when there is none in
/// reach (see [`deliver`] for the tenant policy).
fn admit(
    vms: &[Option<Arc<RdmaDevice>>],
    vm_id: usize,
    ctrl: &Ctrl,
    route: Option<(usize, u32)>,
    dgid: [u8; 16],
    ud: bool,
) -> Result<(usize, u32), RespOutcome> {
    let count = |which: Unreached| {
        if let Some(c) = ctrl.tenancy().counters(vm_id) {
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
        if ctrl.port_gid() != dgid {
            return count(unknown);
        }
        return Ok((peer_vm, peer_qp));
    }
    if !ctrl.tenancy().may_reach(vm_id, peer_vm) {
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
    if ctrl.tenancy().vm(peer_vm).map(|v| v.gid) != Some(dgid) {
        return count(unknown);
    }
    // A stopped device takes no message (spec 15.1); checked again under
    // its lock.
    if !vms
        .get(peer_vm)
        .and_then(Option::as_ref)
        .is_some_and(|d| d.running())
    {
        return Err(RespOutcome::Unreachable);
    }
    Ok((peer_vm, peer_qp))
}

/// Whether RC QP `qp` of `ctrl` takes a message addressed to `qpn` now:
/// `None` if it does, else what the requester gets (`Stale`: the handle
/// no longer has that number; `Unreachable`: a state that takes none).
fn responder_takes(ctrl: &Ctrl, qp: u32, qpn: u32) -> Option<RespOutcome> {
    if !ctrl.running() {
        return Some(RespOutcome::Unreachable);
    }
    let Some(q) = ctrl.res.qps.get(qp).filter(|q| q.qpn == qpn) else {
        return Some(RespOutcome::Stale);
    };
    let takes =
        q.qp_type == QpType::RC && matches!(q.state, QpState::RTR | QpState::RTS | QpState::SQD);
    (!takes).then_some(RespOutcome::Unreachable)
}

/// Whether VMs `a` and `b` are served by the same engine thread.
pub(in crate::engine) fn same_thread(vms: &[Option<Arc<RdmaDevice>>], a: usize, b: usize) -> bool {
    let thread = |v: usize| {
        vms.get(v)
            .and_then(Option::as_ref)
            .map(|d| d.engine_index())
    };
    thread(a).is_some() && thread(a) == thread(b)
}

fn respond_ud_checked(
    ctrl: &mut Ctrl,
    mem: &HostMem,
    peer_qp: u32,
    req: &Request<'_>,
    ud: bool,
    resp: &mut RespScratch,
) -> RespOutcome {
    if !ctrl.running() {
        // Stopped: no QP answers, as on a wire to a halted host.
        return if ud {
            RespOutcome::Dropped
        } else {
            RespOutcome::Unreachable
        };
    }
    let Some(q) = ctrl.res.qps.get(peer_qp) else {
        return RespOutcome::Stale;
    };
    if q.qpn != req.dest_qpn {
        return RespOutcome::Stale;
    }
    if ud {
        if q.qp_type != QpType::UD || q.attr.qkey != req.qkey {
            return RespOutcome::Dropped;
        }
    } else if q.qp_type != QpType::RC {
        return RespOutcome::Unreachable;
    }
    respond(ctrl, mem, peer_qp, req, resp)
}
