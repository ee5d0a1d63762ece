//! The responder's checks of a message, one set for the general path
//! (`route`, `responder`) and the small-WRITE lane (`lane`): whether the
//! responder QP takes a message now, and which MR an rkey names there.
//! The lane runs them and falls back to the general path on any failure,
//! which runs them again and reports the failure: the two cannot differ
//! in what they let through.

use virtio_rdma_abi::qp::{QpState, QpType, GSI_QPN};

use super::request::RespOutcome;
use crate::resources::{Mr, Qp};
use crate::vm::VmState;

/// Whether a QP in `state` takes messages: RTR and later, until an
/// error.
fn receiving(state: QpState) -> bool {
    matches!(state, QpState::RTR | QpState::RTS | QpState::SQD)
}

/// RC QP `qp` of `state`, if it takes a message addressed to QPN `qpn`
/// (and, if given, to the QP of incarnation `inc`) now. Otherwise what
/// the requester gets: `Unreachable` if the VM is stopped (no QP answers,
/// as on a wire to a halted host), `Stale` if the handle no longer names
/// that QP (a stale routing hint), `Unreachable` if it is not an RC QP
/// that takes messages in its state.
pub(super) fn rc_responder(
    state: &VmState,
    qp: u32,
    qpn: u32,
    inc: Option<u64>,
) -> Result<&Qp, RespOutcome> {
    let q = addressed(state, qp, qpn, inc, RespOutcome::Unreachable)?;
    if q.qp_type != QpType::RC || !receiving(q.state) {
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
    if !q.qp_type.datagram() || gsi != (qpn == GSI_QPN) || q.attr.qkey != qkey || !receiving(q.state)
    {
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

/// The MR of `state` that rkey `rkey` names for responder QP `q` and
/// access `right`: one of the QP's PD that grants `right` (the QP's own
/// right is the caller's to check).
pub(super) fn remote_mr<'s>(state: &'s VmState, q: &Qp, rkey: u32, right: u32) -> Option<&'s Mr> {
    state
        .res
        .rkeys
        .get(&rkey)
        .and_then(|h| state.res.mrs.get(*h))
        .filter(|mr| mr.pd == q.pd && mr.access & right != 0)
}
