//! The built-in software RNIC.
//!
//! It owns the namespace that must be unique across VMs (QP numbers, so one
//! VM's QP can address another's); the engine routes messages through it.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use virtio_rdma_abi::qp::Mtu;

use super::{Rnic, RnicCaps, RnicError};
use crate::keys::KeySource;
use crate::resources::KeyMap;

/// QPNs are 24 bits; 0 and 1 are the special management QPs of InfiniBand.
const QPN_MASK: u32 = 0x00ff_ffff;
const FIRST_QPN: u32 = 2;
/// Give up finding a free random QPN after this many draws (the space is
/// 16M; this only triggers when it is nearly full).
const QPN_DRAWS: usize = 64;
/// Reported ack delay, 4.096 µs × 2^15 ≈ 134 ms: the engine answers a
/// request when it executes it, but its threads share the host with
/// everything else and may be descheduled; 15 is also what Linux's soft
/// RoCE reports, so timeouts derived from it are the familiar ones.
const SOFT_ACK_DELAY: u32 = 15;

struct Inner {
    /// Allocated QP numbers and, once bound, their (VM, handle).
    used: KeyMap<Option<(usize, u32)>>,
    keys: KeySource,
}

/// The software RNIC engine.
///
/// The QPN table is behind a read-write lock: lookups (the engine routing a
/// UD message, the control path checking a destination against the tenant
/// policy) share it and never wait for each other; only allocation and
/// release take it exclusively.
pub struct SoftRnic {
    inner: RwLock<Inner>,
}

impl SoftRnic {
    /// Creates the engine.
    pub fn new() -> Result<Self, RnicError> {
        Ok(SoftRnic {
            inner: RwLock::new(Inner {
                used: KeyMap::default(),
                keys: KeySource::new(),
            }),
        })
    }

    fn lock(&self) -> RwLockWriteGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of a
        // set of integers; the set itself is still consistent.
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl Rnic for SoftRnic {
    fn caps(&self) -> RnicCaps {
        RnicCaps {
            max_mtu: Mtu::MTU_4096 as u32,
            link_rate_mbps: 100_000,
            atomics: true,
            max_msg_size: 1 << 31,
            local_ca_ack_delay: SOFT_ACK_DELAY,
        }
    }

    fn alloc_qpn(&self) -> Result<u32, RnicError> {
        let mut inner = self.lock();
        for _ in 0..QPN_DRAWS {
            let qpn = inner.keys.next_u32().map_err(|_| RnicError::Random)? & QPN_MASK;
            if qpn >= FIRST_QPN && !inner.used.contains_key(&qpn) {
                inner.used.insert(qpn, None);
                return Ok(qpn);
            }
        }
        Err(RnicError::QpnExhausted)
    }

    fn bind_qpn(&self, qpn: u32, vm: usize, handle: u32) {
        if let Some(slot) = self.lock().used.get_mut(&qpn) {
            *slot = Some((vm, handle));
        }
    }

    fn lookup_qpn(&self, qpn: u32) -> Option<(usize, u32)> {
        self.read().used.get(&qpn).copied().flatten()
    }

    fn free_qpn(&self, qpn: u32) {
        self.lock().used.remove(&qpn);
    }

    fn qpns_in_use(&self) -> usize {
        self.read().used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpns_unique_and_24_bit() {
        let r = SoftRnic::new().unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let q = r.alloc_qpn().unwrap();
            assert!((FIRST_QPN..=QPN_MASK).contains(&q));
            assert!(seen.insert(q));
        }
        assert_eq!(r.qpns_in_use(), 10_000);
        let q = *seen.iter().next().unwrap();
        assert_eq!(r.lookup_qpn(q), None);
        r.bind_qpn(q, 3, 0x100005);
        assert_eq!(r.lookup_qpn(q), Some((3, 0x100005)));
        for q in seen {
            r.free_qpn(q);
        }
        assert_eq!(r.qpns_in_use(), 0);
    }
}
