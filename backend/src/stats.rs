//! Per-VM traffic counters and the control-latency histogram, shared by the
//! engine (which counts), the control workers, and the operator interfaces
//! (which read). Relaxed atomics: each value is a monotonic counter, and
//! readers need no ordering between them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive, in microseconds) of the latency histogram's
/// buckets; a last, unbounded bucket follows.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000, 1_000_000,
];

/// A latency histogram (Prometheus style: cumulative on export).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// A snapshot of a [`Histogram`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations per bucket (not cumulative); the last is unbounded.
    pub buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    /// Observations.
    pub count: u64,
    /// Sum of the observations in nanoseconds.
    pub sum_ns: u64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Current values.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot {
            count: self.count.load(Ordering::Relaxed),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            ..HistogramSnapshot::default()
        };
        for (o, b) in s.buckets.iter_mut().zip(self.buckets.iter()) {
            *o = b.load(Ordering::Relaxed);
        }
        s
    }
}

/// Data-path and control-path counters of one VM.
#[derive(Debug, Default)]
pub struct TrafficCounters {
    /// Send work requests the VM's QPs executed (successfully or not).
    pub send_ops: AtomicU64,
    /// Payload bytes of the VM's successful send work requests.
    pub send_bytes: AtomicU64,
    /// Messages delivered to the VM's QPs (SEND, WRITE, READ, atomic as
    /// responder).
    pub recv_ops: AtomicU64,
    /// Payload bytes of those messages.
    pub recv_bytes: AtomicU64,
    /// Completions with an error status other than a flush.
    pub error_cqes: AtomicU64,
    /// Completions with `WR_FLUSH_ERR`.
    pub flushed: AtomicU64,
    /// Messages dropped (UD with no taker, wrong Q_Key, foreign tenant).
    pub drops: AtomicU64,
    /// Times the engine postponed the VM's work for a rate limit.
    pub throttled: AtomicU64,
    /// Notifications (kicks) of notifyq the VM sent to wake the engine;
    /// each is a VM exit, so a driver should kick only when the engine is
    /// parked (spec 18.6).
    pub notifications: AtomicU64,
    /// Control commands executed.
    pub ctrl_cmds: AtomicU64,
    /// Control commands that failed.
    pub ctrl_errors: AtomicU64,
    /// Time from a control request being taken to its response.
    pub ctrl_latency: Histogram,
}

/// A snapshot of [`TrafficCounters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct TrafficStats {
    pub send_ops: u64,
    pub send_bytes: u64,
    pub recv_ops: u64,
    pub recv_bytes: u64,
    pub error_cqes: u64,
    pub flushed: u64,
    pub drops: u64,
    pub throttled: u64,
    pub notifications: u64,
    pub ctrl_cmds: u64,
    pub ctrl_errors: u64,
    pub ctrl_latency: HistogramSnapshot,
}

impl TrafficCounters {
    /// Adds `n` to `counter` (a field of `self`).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` to `counter` when the calling thread is its only writer —
    /// the engine thread for the data-path counters (`send_*`, `recv_*`,
    /// `error_cqes`, `flushed`, `drops`, `throttled`): a plain load and
    /// store instead of a locked read-modify-write, because these move with
    /// every work request (four locked adds cost some 8 % of the 64-byte
    /// message rate). Readers still see a monotonic value.
    pub fn add_single_writer(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Current values.
    pub fn snapshot(&self) -> TrafficStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TrafficStats {
            send_ops: r(&self.send_ops),
            send_bytes: r(&self.send_bytes),
            recv_ops: r(&self.recv_ops),
            recv_bytes: r(&self.recv_bytes),
            error_cqes: r(&self.error_cqes),
            flushed: r(&self.flushed),
            drops: r(&self.drops),
            throttled: r(&self.throttled),
            notifications: r(&self.notifications),
            ctrl_cmds: r(&self.ctrl_cmds),
            ctrl_errors: r(&self.ctrl_errors),
            ctrl_latency: self.ctrl_latency.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_micros(5));
        h.observe(Duration::from_micros(6));
        h.observe(Duration::from_secs(5));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], 2);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[LATENCY_BOUNDS_US.len()], 1);
        assert_eq!(s.sum_ns, 5_000_014_000);
    }
}
