//! A VM's host QPs across hosts (spec 20.8), both ends of the move and its
//! peers:
//!
//! - at the source, [`save`]: once its data path has applied every host
//!   completion of the stopped VM and nothing it posted is in flight, each
//!   host QP's PSNs and where its requests went;
//! - at the destination, [`restore_qp`]: a loaded QP's new host QP (its
//!   number the source's, virtual, over the new host one:
//!   `VerbsRnic::add_qp`) brought into its state, connected where the
//!   source's was, at the source's PSNs; and the move record of the VM;
//! - at each daemon with a peer of the VM, [`hold`] (before the stop: no
//!   new request to it, those in flight complete) and [`moved`] (after the
//!   load: every connection to it is pointed at its new place, from the
//!   PSNs it had reached, by the data path when nothing of it is in
//!   flight: [`repoint_due`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use rdma_sys::{ibv_modify_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_query_qp};
use virtio_rdma_abi::qp::{QpAttr, QpState, QpType};

use super::{lock_tables, HostQp, VerbsRnic, VmHost};
use crate::relocation::{HostQpState, HostState, MoveRecord, MovedQp};
use crate::rnic::verbs::attr;
use crate::rnic::verbs::objects::errno_of;
use crate::rnic_objects::{QpChange, RnicError};
use crate::sync::{lock, read, write};

/// Most QPs or rkeys one move record may name.
pub const MAX_RECORD: usize = 1 << 20;

/// The PSNs host QP `q` has reached: the next it sends and the next it
/// expects.
fn psns(q: &HostQp) -> Result<(u32, u32), RnicError> {
    // SAFETY: all-zero is a valid attribute and init-attribute structure.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
        | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
        | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0;
    let mask = i32::try_from(mask).unwrap_or(i32::MAX);
    // SAFETY: a live QP of the caller's locked table and two structures
    // to fill.
    let rc = unsafe { ibv_query_qp(q.qp.as_ptr(), &mut a, mask, &mut init) };
    if rc != 0 {
        return Err(RnicError::Host(errno_of(rc)));
    }
    Ok((a.sq_psn & 0xff_ffff, a.rq_psn & 0xff_ffff))
}

/// Whether stopped VM `vm`'s host halves are at rest since `since`: none of
/// its host QPs has a request in flight, and its data path found its host
/// CQs empty after `since` (`VerbsPath::poll_stopped`).
pub(crate) fn at_rest(rnic: &VerbsRnic, vm: usize, since: Instant) -> bool {
    let Some(host) = rnic.vm(vm) else {
        return true;
    };
    let rested = *lock(&host.rested);
    rested.is_some_and(|at| at >= since) && !in_flight(host)
}

/// Whether a host QP of the VM has requests in flight.
pub(crate) fn in_flight(host: &VmHost) -> bool {
    lock_tables(host).qps.values().any(|q| !q.sent.is_empty())
}

/// The host halves of VM `vm`'s QPs for a saved state. Refused while a
/// request is in flight, and for a QP connected through the CM bridge
/// (the host's `rdma_cm` holds that connection; it does not move).
pub(crate) fn save(rnic: &VerbsRnic, vm: usize) -> Result<HostState, RnicError> {
    let host = rnic.vm(vm).ok_or(RnicError::Exhausted)?;
    let t = lock_tables(host);
    let mut qps = Vec::with_capacity(t.qps.len());
    for (&qpn, q) in t.qps.iter() {
        if !q.sent.is_empty() {
            debug!(
                "QPN {qpn:#x}: {} sends in flight; not savable yet",
                q.sent.len()
            );
            return Err(RnicError::Host(libc::EBUSY));
        }
        if q.bridged.is_some() {
            debug!("QPN {qpn:#x}: connected through the CM bridge; it does not move");
            return Err(RnicError::Invalid);
        }
        let (sq_psn, rq_psn) = psns(q)?;
        info!(
            "QPN {qpn:#x} (host {:#x}) saved: next PSN {sq_psn:#x}, expected {rq_psn:#x}, to {:?}",
            q.host_qpn(),
            q.dest.map(|(_, d)| d)
        );
        qps.push(HostQpState {
            qpn,
            host_qpn: q.host_qpn(),
            sq_psn,
            rq_psn,
            dest: q.dest,
            rkeys: q
                .rkeys
                .as_ref()
                .map(|m| {
                    let mut v: Vec<(u32, u32)> = m.iter().map(|(&a, &b)| (a, b)).collect();
                    v.sort_unstable();
                    v
                })
                .unwrap_or_default(),
        });
    }
    qps.sort_unstable_by_key(|q| q.qpn);
    Ok(HostState {
        gid: rnic.device().gid().0,
        qps,
    })
}

/// One host state change of `q` (device QP `qpn`) from `from` to `to` with
/// `a`, the attributes each transition requires.
fn step(
    rnic: &VerbsRnic,
    q: &HostQp,
    qpn: u32,
    from: QpState,
    to: QpState,
    a: &QpAttr,
) -> Result<(), RnicError> {
    let change = QpChange {
        qpn,
        from,
        to,
        attr: a,
        mask: 0,
    };
    let (mut h, mask) = attr::modify(&change, q.qp_type, rnic.source());
    // SAFETY: a live QP of the caller's locked table and a filled
    // attribute structure.
    let rc = unsafe { ibv_modify_qp(q.qp.as_ptr(), &mut h, mask) };
    if rc != 0 {
        debug!(
            "QPN {qpn:#x}: host {from:?} -> {to:?} (mask {mask:#x}): errno {}",
            errno_of(rc)
        );
        return Err(RnicError::Host(errno_of(rc)));
    }
    Ok(())
}

/// Walks host QP `q` from RESET to `to` (INIT, RTR, RTS; SQD as RTS, ERR
/// straight) with `a`, its destination and PSNs already those it must have.
fn walk(rnic: &VerbsRnic, q: &HostQp, qpn: u32, to: QpState, a: &QpAttr) -> Result<(), RnicError> {
    if to == QpState::ERR {
        return step(rnic, q, qpn, QpState::RESET, QpState::ERR, a);
    }
    let path = [QpState::INIT, QpState::RTR, QpState::RTS];
    let last = match to {
        QpState::INIT => 0,
        QpState::RTR => 1,
        QpState::RTS | QpState::SQD => 2,
        _ => return Ok(()),
    };
    let mut from = QpState::RESET;
    for &s in path.iter().take(last + 1) {
        step(rnic, q, qpn, from, s, a)?;
        from = s;
    }
    Ok(())
}

/// The device's attributes `saved` with the host destination and PSNs of
/// `entry`.
fn on_host(saved: &QpAttr, entry: Option<&HostQpState>, moved: Option<&MovedQp>) -> QpAttr {
    let mut a = *saved;
    if let Some(m) = moved {
        a.av.dgid = m.gid;
        a.dest_qpn = m.qpn;
    }
    if let Some(e) = entry {
        a.sq_psn = e.sq_psn;
        a.rq_psn = e.rq_psn;
    }
    a
}

/// Brings the new host half of loaded QP `qpn` of VM `vm` into state `to`
/// with the device's attributes `saved` and, from `host`, the PSNs the
/// source's host QP had reached; adds the QP to the VM's move record. A
/// connected QP past INIT needs its host entry (a state saved on another
/// RNIC has none).
///
/// Where its requests go is the device's destination (`saved`, checked
/// against the tenant's policy at the load as `MODIFY_QP` checks it),
/// through the moves this daemon knows from its operator: never the
/// state's own `dest` and `rkeys`, which came through the front-end and
/// could aim the QP, and its rkeys, at anything on the fabric.
pub(crate) fn restore_qp(
    rnic: &VerbsRnic,
    vm: usize,
    qpn: u32,
    to: QpState,
    saved: &QpAttr,
    host: Option<&HostState>,
) -> Result<(), RnicError> {
    let h = rnic.vm(vm).ok_or(RnicError::Exhausted)?;
    let entry = host.and_then(|s| s.qp(qpn));
    let moved = read(&rnic.moves)
        .get(&(saved.av.dgid, saved.dest_qpn))
        .cloned();
    let mut t = lock_tables(h);
    let q = t.qps.get_mut(&qpn).ok_or(RnicError::Invalid)?;
    let connected = matches!(q.qp_type, QpType::RC | QpType::UC);
    let beyond_init = !matches!(to, QpState::RESET | QpState::INIT);
    if connected && beyond_init && entry.is_none() {
        return Err(RnicError::Invalid);
    }
    let a = on_host(saved, entry, moved.as_ref().filter(|_| connected));
    walk(rnic, q, qpn, to, &a)?;
    info!(
        "QPN {qpn:#x}: host QP {:#x} in {to:?}, next PSN {:#x}, expected {:#x}, to QPN {:#x}",
        q.host_qpn(),
        a.sq_psn,
        a.rq_psn,
        a.dest_qpn
    );
    q.timeout = saved.timeout;
    q.retry_cnt = saved.retry_cnt;
    if connected && beyond_init {
        q.dest = Some((a.av.dgid, a.dest_qpn));
        q.rkeys = moved.map(|m| m.rkeys);
        q.route_to(a.av.dgid);
    }
    let new_qpn = q.host_qpn();
    if let (Some(s), Some(e)) = (host, entry) {
        let r = t.arrived.get_or_insert_with(Default::default);
        r.from_gid = s.gid;
        r.to_gid = rnic.device().gid().0;
        r.qps.push((e.host_qpn, new_qpn));
    }
    Ok(())
}

/// The move record of VM `vm` (named `name`), once a state from another
/// host was loaded into it.
pub(crate) fn record(rnic: &VerbsRnic, vm: usize, name: &str) -> Option<MoveRecord> {
    let h = rnic.vm(vm)?;
    let t = lock_tables(h);
    let mut r = t.arrived.clone()?;
    r.vm = name.to_string();
    Some(r)
}

/// Holds every connection of this RNIC's VMs to QPs `qpns` of GID `gid`
/// (a VM about to move): no new request is posted to them until `until`
/// or the move record comes; those in flight complete. Returns how many
/// host QPs are held.
pub(crate) fn hold(rnic: &VerbsRnic, gid: [u8; 16], qpns: &[u32], until: Instant) -> usize {
    let mut n = 0usize;
    for (i, h) in rnic.vms().iter().enumerate() {
        let mut t = lock_tables(h);
        let mut any = false;
        for q in t.qps.values_mut() {
            if q.dest.is_some_and(|(g, d)| g == gid && qpns.contains(&d)) {
                if q.held_until.replace(until).is_none() {
                    h.holding.fetch_add(1, Ordering::Relaxed);
                }
                n = n.saturating_add(1);
                any = true;
            }
        }
        drop(t);
        if any {
            rnic.wake(i);
        }
    }
    n
}

/// Takes move record `r`: connections made from now on to a QP it names
/// go to the QP's new place, and every connection of this RNIC's VMs to
/// one is pointed there by its data path ([`repoint_due`]). Returns how
/// many host QPs will be pointed anew.
pub(crate) fn moved(rnic: &VerbsRnic, r: &MoveRecord) -> Result<usize, String> {
    r.check(MAX_RECORD)?;
    // Only destinations a hold named (`peer_hold`, from the source's own
    // `wire_qps`): the record's "before" side comes from the destination
    // daemon, which read it from a state that passed through a front-end,
    // and must not re-point connections to anything else.
    let held = held_places(rnic);
    let (entries, unheld): (Vec<_>, Vec<_>) = r
        .entries()
        .into_iter()
        .partition(|(from, _)| held.contains(from));
    if entries.is_empty() {
        return Err(format!(
            "none of the record's {} QPs is a destination held here (peer_hold comes first)",
            r.qps.len()
        ));
    }
    if !unheld.is_empty() {
        warn!(
            "VM {:?}'s move record: {} QPs not held here are ignored",
            r.vm,
            unheld.len()
        );
    }
    {
        let mut moves = write(&rnic.moves);
        for (from, to) in &entries {
            moves.insert(*from, to.clone());
        }
    }
    let by_place: HashMap<([u8; 16], u32), MovedQp> = entries.into_iter().collect();
    let mut n = 0usize;
    for (i, h) in rnic.vms().iter().enumerate() {
        let mut t = lock_tables(h);
        let mut any = false;
        let mut more = 0u32;
        for q in t.qps.values_mut() {
            let Some(to) = q.dest.and_then(|d| by_place.get(&d)) else {
                continue;
            };
            if q.repoint.replace(to.clone()).is_none() {
                more = more.saturating_add(1);
            }
            n = n.saturating_add(1);
            any = true;
        }
        h.repoints.fetch_add(more, Ordering::Relaxed);
        drop(t);
        if any {
            rnic.wake(i);
        }
    }
    info!(
        "VM {:?} moved to another host: {} of its QPs and {} rkeys recorded, {n} connections here to point anew",
        r.vm,
        r.qps.len(),
        r.rkeys.len()
    );
    Ok(n)
}

/// The destinations (GID, host QP number) of this RNIC's connections
/// whose hold has not ended.
fn held_places(rnic: &VerbsRnic) -> std::collections::HashSet<([u8; 16], u32)> {
    let now = Instant::now();
    let mut out = std::collections::HashSet::new();
    for h in rnic.vms() {
        let t = lock_tables(h);
        for q in t.qps.values() {
            if let (Some(d), Some(u)) = (q.dest, q.held_until) {
                if u > now {
                    out.insert(d);
                }
            }
        }
    }
    out
}

/// How long a moved connection waits for its requests in flight before it
/// is pointed anew all the same (they then fail as the NIC reports).
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// Points the VM's host QPs whose destination moved at its new place, each
/// once nothing it posted is in flight (after [`DRAIN_WAIT`] with some
/// still in flight, the connection fails instead): the host
/// QP goes through RESET to its state again with the PSNs it had reached,
/// connected to the new GID and QP number, and translates the
/// destination's rkeys from then on. The receives the host dropped with
/// the reset are posted again by the caller: the device QPs' handles are
/// returned, each with whether it worked (one that did not has failed on
/// the host and must fail on the device). Called by the data path with
/// the VM's lock held, after its host completions were applied.
pub(crate) fn repoint_due(
    rnic: &VerbsRnic,
    host: &VmHost,
    attrs: &dyn Fn(u32) -> Option<(QpState, QpAttr)>,
    now: Instant,
) -> Vec<(u32, bool)> {
    let mut t = lock_tables(host);
    let mut done = Vec::new();
    let mut pending = host.repoints.load(Ordering::Relaxed);
    for (&qpn, q) in t.qps.iter_mut() {
        let Some(to) = q.repoint.clone() else {
            continue;
        };
        let waited = q
            .progress
            .is_some_and(|p| now.saturating_duration_since(p) >= DRAIN_WAIT);
        if !q.sent.is_empty() && !waited {
            continue;
        }
        q.repoint = None;
        if q.held_until.take().is_some() {
            dec(&host.holding);
        }
        pending = pending.saturating_sub(1);
        if !q.sent.is_empty() {
            // Requests still in flight after DRAIN_WAIT (their old
            // destination went before it answered): the connection fails,
            // and its host QP flushes them.
            warn!("QPN {qpn:#x}: requests to its moved destination never completed; it fails");
            done.push((q.handle, false));
            continue;
        }
        let Some((state, saved)) = attrs(q.handle) else {
            continue;
        };
        if !matches!(state, QpState::RTR | QpState::RTS | QpState::SQD) {
            // Not connected any more: its next RTR finds the record.
            continue;
        }
        let (sq_psn, rq_psn) = match psns(q) {
            Ok(p) => p,
            Err(e) => {
                warn!("QPN {qpn:#x}: its PSNs cannot be read ({e}); it is not pointed anew");
                continue;
            }
        };
        let mut a = saved;
        a.av.dgid = to.gid;
        a.dest_qpn = to.qpn;
        a.sq_psn = sq_psn;
        a.rq_psn = rq_psn;
        let walked = step(rnic, q, qpn, state, QpState::RESET, &a)
            .and_then(|()| walk(rnic, q, qpn, state, &a));
        // The reset dropped what the host had taken.
        q.sent.clear();
        q.recvd.clear();
        q.progress = None;
        let ok = match walked {
            Ok(()) => {
                q.dest = Some((to.gid, to.qpn));
                q.rkeys = Some(to.rkeys.clone());
                q.route_to(to.gid);
                info!(
                    "QPN {qpn:#x}: pointed at QP {:#x} of its destination's new host \
                     (next PSN {sq_psn:#x}, expected {rq_psn:#x})",
                    to.qpn
                );
                true
            }
            Err(e) => {
                warn!("QPN {qpn:#x}: cannot be pointed at its destination's new host: {e}");
                false
            }
        };
        done.push((q.handle, ok));
    }
    host.repoints.store(pending, Ordering::Relaxed);
    drop(t);
    done
}

/// Takes one from counter `a` (never below 0).
pub(crate) fn dec(a: &std::sync::atomic::AtomicU32) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
}

/// How often a request held for its destination's move looks again.
const HELD_RETRY: Duration = Duration::from_millis(2);

/// Whether a connection of the VM may be held (one load; the data path
/// looks closer only then).
pub(crate) fn any_held(host: &VmHost) -> bool {
    host.holding.load(Ordering::Relaxed) > 0 || host.repoints.load(Ordering::Relaxed) > 0
}

/// Whether the requests of the VM's QP `qpn` wait for its destination's
/// move: when to look again, if they do. A hold that ran out ends here.
pub(crate) fn held(host: &VmHost, qpn: u32, now: Instant) -> Option<Instant> {
    let mut t = lock_tables(host);
    let q = t.qps.get_mut(&qpn)?;
    if q.repoint.is_some() {
        return Some(now + HELD_RETRY);
    }
    let until = q.held_until?;
    if until > now {
        return Some(until.min(now + HELD_RETRY));
    }
    q.held_until = None;
    dec(&host.holding);
    None
}
