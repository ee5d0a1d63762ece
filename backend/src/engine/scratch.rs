//! An engine thread's reusable memory: what serving a VM's QPs needs
//! between work requests without allocating, and the thread's clocks
//! and flags that the sweep and the parking share.

use std::time::Instant;

use super::anticipate::Anticipation;
use super::attention::Attention;
use super::wqe::WqeBuf;
use crate::qos::rate_limits::RateLimits;

/// Reusable memory of the engine thread (no allocation per work request),
/// with its RNIC data path's own (`T`).
pub struct Scratch<T> {
    pub(super) wqe: Box<WqeBuf>,
    pub(super) handles: Vec<u32>,
    /// The earliest end of a send WQE's retry wait or of a rate limit's
    /// hold seen since it was last cleared (the parking re-check clears it
    /// and visits every QP).
    pub(super) next_timer: Option<Instant>,
    /// Rate limits (token buckets) of every VM and tenant.
    pub(super) limits: RateLimits,
    /// Payload bytes the last executed WQE moved (0 if it failed).
    pub(crate) moved: u64,
    /// Bytes of work the last executed WQE is charged besides its payload
    /// (the pages of a fast registration).
    pub(super) work: u64,
    /// Work requests and bytes the current burst executed.
    pub(super) executed: (u32, u64),
    /// A VM's lock was busy since this was last cleared, so there may be
    /// work the engine could not look at: it must not park on it.
    pub(crate) contended: bool,
    /// The thread's work clock: the modelled engine time
    /// ([`crate::qos::drr::cost_ns`]) of all the work it did, plus
    /// `SWEEP_WORK` per busy sweep (`thread`); parked VMs are peeked by it.
    pub(super) worked: u64,
    /// Which VM to anticipate, and what is known of their posting
    /// (`super::anticipate`).
    pub(super) anticipation: Anticipation,
    /// Which VMs' lists a sweep visits, and the rounds over the parked
    /// ones (`super::attention`).
    pub(super) attention: Attention,
    /// The RNIC data path's reusable memory.
    pub(crate) path: T,
}

impl<T: Default> Scratch<T> {
    pub(super) fn new() -> Self {
        Scratch {
            wqe: WqeBuf::new(),
            handles: Vec::new(),
            next_timer: None,
            limits: RateLimits::default(),
            moved: 0,
            work: 0,
            executed: (0, 0),
            contended: false,
            worked: 0,
            anticipation: Anticipation::default(),
            attention: Attention::default(),
            path: T::default(),
        }
    }
}

impl<T> Scratch<T> {
    /// Notes a retry deadline.
    pub(crate) fn timer(&mut self, at: Instant) {
        self.next_timer = Some(self.next_timer.map_or(at, |t| t.min(at)));
    }
}
