//! The CM bridge as the RNIC holds it (`CmHub`): the service on the
//! host's `rdma_cm`, shared by the control path (listeners, `MODIFY_QP`'s
//! bindings, destroyed QPs), the engine (the guests' CM MADs) and the CM
//! event thread ([`super::cm_events`]); and each VM's inbox of MADs for its
//! GSI QP, which the engine empties under the VM's lock.
//!
//! Lock order: the service's lock is taken last (under a VM's lock, never
//! the other way round); an inbox's lock is a leaf.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use log::{debug, warn};

use super::cm::bridge::{Limits, ToGuest, VmId};
use super::cm::service::CmService;
use crate::sync::lock;

/// MADs an inbox holds; beyond it they are dropped and counted (a guest
/// that does not take its MADs only loses its own).
pub(crate) const INBOX_DEPTH: usize = 256;

/// What the bridge needs of one VM's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmCm {
    /// The ports the host listens on for it (`cm_listen`).
    pub listen: Vec<u16>,
    /// Its connections in the bridge at once (`cm_connections`).
    pub connections: usize,
}

/// One VM's MADs for its GSI QP.
#[derive(Default)]
struct Inbox {
    mads: Mutex<VecDeque<ToGuest>>,
    /// How many `mads` holds (kept under its lock): the engine asks at
    /// every sweep, without the lock.
    queued: AtomicUsize,
    /// MADs dropped because the inbox was full, not counted yet in the
    /// VM's `mad_dropped` (the engine, its single writer, adds them).
    lost: AtomicU64,
}

/// Every VM's inbox: filled by whoever holds the bridge, emptied by the
/// VM's engine.
pub(crate) struct Inboxes(Vec<Inbox>);

impl Inboxes {
    /// Empty inboxes for `n` VMs.
    pub(crate) fn new(n: usize) -> Self {
        Inboxes((0..n).map(|_| Inbox::default()).collect())
    }

    /// Queues `m` in its VM's inbox; false if it was dropped (a VM the
    /// RNIC does not have, or a full inbox: counted).
    pub(crate) fn post(&self, m: ToGuest) -> bool {
        let Some(inbox) = self.0.get(m.vm) else {
            return false;
        };
        let mut q = lock(&inbox.mads);
        if q.len() >= INBOX_DEPTH {
            inbox.lost.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.push_back(m);
        inbox.queued.store(q.len(), Ordering::Relaxed);
        true
    }

    /// Takes at most `max` of `vm`'s MADs, oldest first.
    pub(crate) fn take(&self, vm: VmId, max: usize, out: &mut Vec<ToGuest>) {
        if let Some(inbox) = self.0.get(vm) {
            let mut q = lock(&inbox.mads);
            let n = q.len().min(max);
            out.extend(q.drain(..n));
            inbox.queued.store(q.len(), Ordering::Relaxed);
        }
    }

    /// MADs of `vm` dropped at a full inbox since the last call.
    pub(crate) fn take_lost(&self, vm: VmId) -> u64 {
        self.0
            .get(vm)
            .map_or(0, |i| i.lost.swap(0, Ordering::Relaxed))
    }

    /// Whether `vm` has MADs waiting, or drops to count.
    pub(crate) fn pending(&self, vm: VmId) -> bool {
        self.0.get(vm).is_some_and(|i| {
            i.lost.load(Ordering::Relaxed) > 0 || i.queued.load(Ordering::Relaxed) > 0
        })
    }

    /// Empties `vm`'s inbox (its GSI QP is new or gone).
    pub(crate) fn clear(&self, vm: VmId) {
        if let Some(i) = self.0.get(vm) {
            let mut q = lock(&i.mads);
            q.clear();
            i.queued.store(0, Ordering::Relaxed);
        }
    }
}

/// The CM bridge of the RNIC's VMs.
pub(crate) struct CmHub {
    service: Mutex<CmService>,
    inboxes: Inboxes,
    vms: Vec<VmCm>,
}

impl CmHub {
    /// Opens the bridge for the host port of `gid` and VMs `vms`; fails
    /// when the host's `rdma_cm` cannot be used on that address (no
    /// `rdma_ucm`, or the GID is not an IP address of the host's device).
    pub(crate) fn open(gid: [u8; 16], vms: Vec<VmCm>) -> io::Result<CmHub> {
        let mut seed = crate::keys::KeySource::new();
        let seed = seed.next_u32()?;
        let mut service = CmService::new(gid, Limits::default(), seed)?;
        service.probe()?;
        for (vm, c) in vms.iter().enumerate() {
            service.set_conn_limit(vm, c.connections);
        }
        Ok(CmHub {
            service: Mutex::new(service),
            inboxes: Inboxes::new(vms.len()),
            vms,
        })
    }

    /// The descriptor that is readable when the host CM has events.
    pub(crate) fn fd(&self) -> RawFd {
        lock(&self.service).fd()
    }

    /// Runs `f` on the service, then puts the MADs it produced into the
    /// VMs' inboxes and calls `wake` once for each VM that got some.
    pub(crate) fn with<R>(&self, wake: impl Fn(VmId), f: impl FnOnce(&mut CmService) -> R) -> R {
        let (r, out) = {
            let mut s = lock(&self.service);
            let r = f(&mut s);
            (r, s.take_to_guest())
        };
        let mut woken: Vec<VmId> = Vec::new();
        for m in out {
            let vm = m.vm;
            if self.inboxes.post(m) && !woken.contains(&vm) {
                woken.push(vm);
            }
        }
        for vm in woken {
            wake(vm);
        }
        r
    }

    /// The VMs' inboxes.
    pub(crate) fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }

    /// `vm`'s GSI QP exists: the host listens on its ports. A port the
    /// host cannot listen on is logged (the bridge's service says why).
    pub(crate) fn gsi_created(&self, vm: VmId, wake: impl Fn(VmId)) {
        self.inboxes.clear(vm);
        let ports = self
            .vms
            .get(vm)
            .map(|c| c.listen.clone())
            .unwrap_or_default();
        self.with(wake, |s| {
            for port in ports {
                match s.listen(vm, port) {
                    Ok(()) => debug!("VM {vm}: rdma_cm requests to port {port} go to its GSI QP"),
                    Err(other) => warn!("VM {vm}: cm_listen port {port} is VM {other}'s"),
                }
            }
        });
    }

    /// `vm`'s GSI QP is gone: its connections are released, its listeners
    /// closed and its inbox emptied.
    pub(crate) fn gsi_destroyed(&self, vm: VmId, wake: impl Fn(VmId)) {
        self.with(wake, |s| {
            s.vm_gone(vm);
            s.unlisten(vm);
        });
        self.inboxes.clear(vm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mad(vm: VmId, tag: u8) -> ToGuest {
        ToGuest {
            vm,
            sgid: [tag; 16],
            mad: [tag; 256],
        }
    }

    /// An inbox holds [`INBOX_DEPTH`] MADs in order; beyond, each one is
    /// dropped and counted once; a VM's inbox is its own.
    #[test]
    fn inboxes_are_bounded_and_per_vm() {
        let b = Inboxes::new(2);
        assert!(!b.pending(0) && !b.pending(1));
        for i in 0..INBOX_DEPTH {
            assert!(b.post(mad(0, (i % 251) as u8)));
        }
        assert!(!b.post(mad(0, 1)) && !b.post(mad(0, 2)));
        assert!(!b.post(mad(7, 1)), "no such VM");
        assert!(b.pending(0) && !b.pending(1));
        assert!(b.post(mad(1, 9)), "the other VM's inbox is not full");
        let mut out = Vec::new();
        b.take(0, 16, &mut out);
        assert_eq!(out.len(), 16);
        assert_eq!(out.first().map(|m| m.mad[0]), Some(0), "oldest first");
        assert_eq!(out.last().map(|m| m.mad[0]), Some(15));
        assert_eq!(b.take_lost(0), 2);
        assert_eq!(b.take_lost(0), 0, "counted once");
        b.clear(0);
        assert!(!b.pending(0) && b.pending(1));
        out.clear();
        b.take(1, 16, &mut out);
        assert_eq!((out.len(), out[0].sgid), (1, [9; 16]));
    }
}
