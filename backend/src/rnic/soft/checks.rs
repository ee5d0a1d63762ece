//! The responder's checks of a message, one set for the general path
//! (`route`, `responder`) and the small-WRITE lane (`lane`): whether the
//! responder QP takes a message now, and which MR an rkey names there.
//! The lane runs them and falls back to the general path on any failure,
//! which runs them again and reports the failure: the two cannot differ
//! in what they let through.

use virtio_rdma_abi::qp::{QpState, QpType, GSI_QPN};

use super::request::RespOutcome;
use crate::memory::access::Translate;
use crate::resources::{Mr, Qp};
use crate::vm::VmState;

/// Whether a QP in `state` takes messages: RTR and later, until an
/// error.
fn receiving(state: QpState) -> bool {
    matches!(state, QpState::RTR | QpState::RTS | QpState::SQD)
}

/// RC QP `qp` of `state`, if it takes a message addressed to QPN `qpn`
/// (and, if given, to the QP of incarnation `inc`) now. Otherwise what
/// the requester gets: `Paused` if the VM is stopped (no QP answers, as on
/// a wire to a halted host; spec 20.6), `Stale` if the handle no longer names
/// that QP (a stale routing hint), `Unreachable` if it is not an RC QP
/// that takes messages in its state.
#[inline]
pub(super) fn rc_responder(
    state: &VmState,
    qp: u32,
    qpn: u32,
    inc: Option<u64>,
) -> Result<&Qp, RespOutcome> {
    connected_responder(state, qp, qpn, inc, QpType::RC)
}

/// [`rc_responder`] for a message of a connected QP of type `t` (RC or
/// UC): the responder must be of the same type.
#[inline]
pub(super) fn connected_responder(
    state: &VmState,
    qp: u32,
    qpn: u32,
    inc: Option<u64>,
    t: QpType,
) -> Result<&Qp, RespOutcome> {
    let q = addressed(state, qp, qpn, inc, RespOutcome::Paused)?;
    // An XRC initiator talks to an XRC target.
    let want = if t == QpType::XRC_INI {
        QpType::XRC_TGT
    } else {
        t
    };
    if q.qp_type != want || !receiving(q.state) {
        return Err(RespOutcome::Unreachable);
    }
    Ok(q)
}

/// UD or GSI QP `qp` of `state`, if it takes a datagram addressed to QPN
/// `qpn` with Q_Key `qkey` now; otherwise the message is dropped
/// (`Dropped`), or the handle no longer names that QP (`Stale`). Only a
/// MAD reaches the GSI QP: QP number 1 and the GSI's Q_Key, which no
/// other QP has (spec 18.26).
pub(super) fn ud_responder(
    state: &VmState,
    qp: u32,
    qpn: u32,
    qkey: u32,
) -> Result<&Qp, RespOutcome> {
    let q = addressed(state, qp, qpn, None, RespOutcome::Dropped)?;
    let gsi = q.qp_type == QpType::GSI;
    if !q.qp_type.datagram()
        || gsi != (qpn == GSI_QPN)
        || q.attr.qkey != qkey
        || !receiving(q.state)
    {
        return Err(RespOutcome::Dropped);
    }
    Ok(q)
}

/// UD QP `qp` of `state`, if it takes a message to multicast group `mgid`
/// with Q_Key `qkey` now: its VM runs, it is attached to the group, and
/// its Q_Key and state take it (spec 18.11.7); otherwise the message is
/// dropped for it.
pub(super) fn mcast_responder<'s>(
    state: &'s VmState,
    qp: u32,
    mgid: &[u8; 16],
    qkey: u32,
) -> Result<&'s Qp, RespOutcome> {
    if !state.running() || !state.res.mcast_attached(qp, mgid) {
        return Err(RespOutcome::Dropped);
    }
    let q = state.res.qps.get(qp).ok_or(RespOutcome::Dropped)?;
    if q.qp_type != QpType::UD || q.attr.qkey != qkey || !receiving(q.state) {
        return Err(RespOutcome::Dropped);
    }
    Ok(q)
}

/// QP `qp` of `state`, if its VM runs (else `stopped`) and the handle
/// still names the QP numbered `qpn` (of incarnation `inc`, if given; else
/// `Stale`).
fn addressed(
    state: &VmState,
    qp: u32,
    qpn: u32,
    inc: Option<u64>,
    stopped: RespOutcome,
) -> Result<&Qp, RespOutcome> {
    if !state.running() {
        return Err(stopped);
    }
    state
        .res
        .qps
        .get(qp)
        .filter(|q| q.qpn == qpn && inc.is_none_or(|i| q.incarnation == i))
        .ok_or(RespOutcome::Stale)
}

/// What an rkey names at a responder: an MR, or the range of one a bound
/// memory window grants (spec 18.29), translated through the MR.
pub(super) struct RemoteRegion<'s> {
    mr: &'s Mr,
    /// A window's first byte and length, in the MR's address space.
    window: Option<(u64, u64)>,
}

impl RemoteRegion<'_> {
    /// Whether `[iova, iova + len)` is inside the window, if it is one.
    #[inline]
    fn inside(&self, iova: u64, len: u64) -> bool {
        self.window.is_none_or(|(start, length)| {
            let (Some(end), Some(limit)) = (iova.checked_add(len), start.checked_add(length))
            else {
                return false;
            };
            iova >= start && end <= limit
        })
    }
}

impl Translate for RemoteRegion<'_> {
    #[inline]
    fn translate(&self, iova: u64, len: u64) -> Option<(u64, u64)> {
        if !self.inside(iova, len) {
            return None;
        }
        self.mr.translate(iova, len)
    }

    #[inline]
    fn walk(&self, iova: u64, len: u64, f: impl FnMut(u64, u64)) -> Option<()> {
        if !self.inside(iova, len) {
            return None;
        }
        self.mr.walk(iova, len, f)
    }
}

/// What rkey `rkey` names for responder QP `qp` (`q`) and access
/// `right`: an MR of the QP's PD that grants `right`, else a bound window
/// of that PD that grants it (a type 2 one bound by this QP). The QP's own
/// right is the caller's to check.
pub(super) fn remote_mr<'s>(
    state: &'s VmState,
    qp: u32,
    q: &Qp,
    rkey: u32,
    right: u32,
) -> Option<RemoteRegion<'s>> {
    // An XRC_TGT QP's keys are those of its message's SRQ's PD.
    let pd = state.res.recv_side(q).pd;
    if let Some(mr) = remote_region_of(state, pd, rkey, right) {
        return Some(RemoteRegion { mr, window: None });
    }
    remote_window(state, qp, q, pd, rkey, right)
}

/// The MR of `state` that rkey `rkey` names for responder QP `q` and
/// access `right`: one of the QP's PD that grants `right`. The
/// small-WRITE lane's lookup: a window's key is the general path's (the
/// lane falls back to it), which keeps the lane as short as it was.
#[inline]
pub(super) fn remote_region<'s>(
    state: &'s VmState,
    q: &Qp,
    rkey: u32,
    right: u32,
) -> Option<&'s Mr> {
    remote_region_of(state, q.pd, rkey, right)
}

/// [`remote_region`] for PD `pd`.
#[inline]
fn remote_region_of(state: &VmState, pd: u32, rkey: u32, right: u32) -> Option<&Mr> {
    state
        .res
        .rkeys
        .get(&rkey)
        .and_then(|h| state.res.mrs.get(*h))
        .filter(|mr| mr.pd == pd && mr.access & right != 0)
}

/// The window part of [`remote_mr`].
#[cold]
#[inline(never)]
fn remote_window<'s>(
    state: &'s VmState,
    qp: u32,
    q: &Qp,
    pd: u32,
    rkey: u32,
    right: u32,
) -> Option<RemoteRegion<'s>> {
    let grant = state.res.window_grant(rkey, pd, (qp, q.incarnation))?;
    if grant.access & right == 0 {
        return None;
    }
    Some(RemoteRegion {
        mr: state.res.mrs.get(grant.mr)?,
        window: Some((grant.addr, grant.length)),
    })
}
