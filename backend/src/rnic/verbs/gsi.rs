//! Each VM's GSI QP on the libibverbs transport: QP 1 of the device, with
//! no host QP (the host port's QP 1 is the host kernel's). Its rings are
//! the guest's and the engine serves them as on the software RNIC: a CM
//! MAD the guest sends goes to the CM bridge ([`super::cm`]), within the
//! VM's MAD rate; the MADs the bridge answers with wait in the VM's inbox
//! ([`super::cm_hub`]) and are placed in QP 1's receive queue by the
//! software RNIC's responder, behind a GRH whose source is the peer's GID.
//! Whatever the bridge does not take (another class, a CM message that
//! fits no connection of the VM) is dropped and counted in `mad_dropped`.

use std::time::Instant;

use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::qp::{QpType, MAX_MAD_BYTES};

use super::cm::bridge::GuestVerdict;
use super::rnic::VerbsRnic;
use super::scratch::Scratch;
use crate::engine::requester::{complete_send, Completion};
use crate::engine::sge::local_range;
use crate::memory::access;
use crate::rnic::soft::mad;
use crate::rnic::soft::request::RespOutcome;
use crate::rnic_path::{Outgoing, Serving, Step};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;
use crate::vm::VmState;

/// MADs placed in one VM's GSI QP per service (the rest wait for the
/// next: the engine's fairness between VMs).
const DELIVER_BATCH: usize = 16;

/// Sends GSI WQE `msg` (checked by the engine: SEND, to QP 1, at most a
/// MAD) of the VM being served: its MAD goes to the CM bridge. The WQE
/// completes now: successfully whether the bridge took the MAD or not (a
/// fabric drops MADs too), with the requester's error if its buffers fail
/// their checks.
pub(super) fn send(
    rnic: &VerbsRnic,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    ts: &mut Scratch,
    moved: &mut u64,
    msg: &Outgoing<'_>,
) -> Step {
    let (wr, mem, vm) = (msg.wr, cx.mem, cx.vm);
    let mut buf = [0u8; MAX_MAD_BYTES as usize];
    let read = match usize::try_from(msg.len).ok().and_then(|n| buf.get_mut(..n)) {
        None => Err(WcStatus::LOC_LEN_ERR),
        Some(out) => match wr.inline {
            Some(data) if data.len() == out.len() => {
                out.copy_from_slice(data);
                Ok(out.len())
            }
            Some(_) => Err(WcStatus::LOC_LEN_ERR),
            None => gather(cx.state, msg, &mut ts.segs, out, mem).map(|()| out.len()),
        },
    };
    let n = match read {
        Ok(n) => n,
        Err(status) => {
            let c = Completion::failed(wr.hdr.wr_id, msg.op, status);
            return complete_send(cx.state, mem, msg.qp, msg.index, c);
        }
    };
    *moved = msg.len;
    let mad = buf.get(..n).unwrap_or_default();
    let taken = cx.state.take_mad(Instant::now()) && {
        let state: &VmState = cx.state;
        let owns = |qpn: u32| owns_rc(rnic, state, vm, qpn);
        let dgid = msg.av.dgid;
        rnic.with_cm(|s| s.guest_mad(vm, dgid, mad, owns)) == Some(GuestVerdict::Taken)
    };
    if !taken {
        dropped(tenancy, vm, 1);
    }
    if !msg.signaled {
        return Step::Done { published: false };
    }
    let byte_len = u32::try_from(msg.len).unwrap_or(u32::MAX);
    let c = Completion::ok(wr.hdr.wr_id, msg.op, byte_len);
    complete_send(cx.state, mem, msg.qp, msg.index, c)
}

/// Reads the MAD of `msg` from its scatter list into `out`, after the
/// requester's checks of the local buffers (keys, rights, bounds, RAM).
fn gather(
    state: &VmState,
    msg: &Outgoing<'_>,
    segs: &mut Vec<access::Segment>,
    out: &mut [u8],
    mem: &crate::memory::HostMem,
) -> Result<(), WcStatus> {
    local_range(state, msg.pd, msg.wr.sges, false, 0, msg.len, segs)?;
    if !segs.iter().all(|s| mem.covers(s.gpa, s.len)) {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    access::read(mem, segs, out).map_err(|_| WcStatus::LOC_PROT_ERR)
}

/// Whether `qpn` is an RC QP of VM `vm` (a REQ or REP may name only those).
fn owns_rc(rnic: &VerbsRnic, state: &VmState, vm: usize, qpn: u32) -> bool {
    use crate::rnic_objects::RnicObjects;
    rnic.lookup_qpn(qpn).is_some_and(|o| {
        o.vm == vm
            && state
                .res
                .qps
                .get(o.handle)
                .is_some_and(|q| q.qpn == qpn && q.qp_type == QpType::RC)
    })
}

/// Places the MADs the CM bridge queued for the VM being served in its
/// GSI QP (at most [`DELIVER_BATCH`]); true if there was anything to do.
pub(super) fn deliver(
    rnic: &VerbsRnic,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    ts: &mut Scratch,
) -> bool {
    let Some(hub) = rnic.cm() else {
        return false;
    };
    let vm = cx.vm;
    let inbox = hub.inboxes();
    let lost = inbox.take_lost(vm);
    if lost > 0 {
        dropped(tenancy, vm, lost);
    }
    let Scratch { mads, resp, .. } = ts;
    mads.clear();
    inbox.take(vm, DELIVER_BATCH, mads);
    if mads.is_empty() {
        return lost > 0;
    }
    // Sent to the VM's GID: the host port's, every VM's on this RNIC.
    let dgid = rnic.device().gid().0;
    for m in mads.drain(..) {
        let out = mad::receive(cx.state, cx.mem, m.sgid, dgid, &m.mad, resp);
        if !matches!(out, RespOutcome::Done) {
            dropped(tenancy, vm, 1);
        }
    }
    if inbox.pending(vm) {
        rnic.wake(vm);
    }
    true
}

/// `n` MADs of VM `vm` dropped: counted in its `mad_dropped` and `drops`.
fn dropped(tenancy: &Tenancy, vm: usize, n: u64) {
    if let Some(t) = tenancy.traffic(vm) {
        TrafficCounters::add_single_writer(&t.mad_dropped, n);
        TrafficCounters::add_single_writer(&t.drops, n);
    }
}
