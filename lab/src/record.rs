//! What a run records: per workload, the completions and their latencies
//! in fixed intervals; per VM, the engine's traffic counters sampled at
//! the same intervals.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use vhost_user_rdma::engine::EngineStats;

/// Longest latency a histogram holds (longer ones are clamped to it).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

fn histogram() -> Histogram<u64> {
    // 3 significant digits over 1 ns..=60 s: a few tens of KiB each.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).unwrap_or_else(|_| unreachable!())
}

/// One interval of one workload.
#[derive(Clone)]
pub struct Interval {
    /// Work requests completed.
    pub ops: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// Their post-to-completion latencies, ns.
    pub latency: Histogram<u64>,
    /// Posts of a paced workload that found their QP full (missed, not
    /// delayed: the open loop keeps its schedule).
    pub missed: u64,
}

/// The completions of one workload, by interval of the run.
pub struct Recorder {
    t0: Instant,
    interval: Duration,
    /// The intervals, from the run's start.
    pub intervals: Vec<Interval>,
}

impl Recorder {
    /// A recorder for a run that started at `t0`, `n` intervals of
    /// `interval`.
    pub fn new(t0: Instant, interval: Duration, n: usize) -> Recorder {
        let empty = Interval {
            ops: 0,
            bytes: 0,
            latency: histogram(),
            missed: 0,
        };
        Recorder {
            t0,
            interval,
            intervals: vec![empty; n],
        }
    }

    fn slot(&self, at: Instant) -> usize {
        let i = at.saturating_duration_since(self.t0).as_nanos() / self.interval.as_nanos().max(1);
        usize::try_from(i)
            .unwrap_or(usize::MAX)
            .min(self.intervals.len().saturating_sub(1))
    }

    /// A paced post due at `at` found its QP full.
    pub fn missed(&mut self, at: Instant) {
        let i = self.slot(at);
        if let Some(s) = self.intervals.get_mut(i) {
            s.missed += 1;
        }
    }

    /// A work request of `bytes` posted at `posted` completed at `done`.
    pub fn complete(&mut self, posted: Instant, done: Instant, bytes: u64) {
        let ns = u64::try_from(done.saturating_duration_since(posted).as_nanos())
            .unwrap_or(MAX_LATENCY_NS)
            .clamp(1, MAX_LATENCY_NS);
        let i = self.slot(done);
        if let Some(s) = self.intervals.get_mut(i) {
            s.ops += 1;
            s.bytes += bytes;
            // Cannot fail: the value is within the bounds.
            let _ = s.latency.record(ns);
        }
    }
}

/// The merged intervals `[from, to)` of `intervals`.
pub fn merge(intervals: &[Interval], from: usize, to: usize) -> Interval {
    let mut out = Interval {
        ops: 0,
        bytes: 0,
        latency: histogram(),
        missed: 0,
    };
    for s in intervals.iter().take(to).skip(from) {
        out.ops += s.ops;
        out.bytes += s.bytes;
        out.missed += s.missed;
        // Cannot fail: same bounds.
        let _ = out.latency.add(&s.latency);
    }
    out
}

/// The engine's counters of one VM at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmCounters {
    /// Bytes its send queues' work requests moved.
    pub bytes: u64,
    /// Its send work requests executed.
    pub ops: u64,
}

/// The VMs' and engine threads' counters at the end of every interval
/// (index 0: at the start).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// `at[i][vm]`: the counters at the end of interval `i - 1`.
    pub at: Vec<Vec<VmCounters>>,
    /// `engines[i][thread]`, likewise.
    pub engines: Vec<Vec<EngineStats>>,
}

impl Samples {
    /// VM `vm`'s bytes and ops in intervals `[from, to)`.
    pub fn delta(&self, vm: usize, from: usize, to: usize) -> VmCounters {
        let get = |i: usize| {
            self.at
                .get(i.min(self.at.len().saturating_sub(1)))
                .and_then(|v| v.get(vm))
                .copied()
                .unwrap_or_default()
        };
        let (a, b) = (get(from), get(to));
        VmCounters {
            bytes: b.bytes.saturating_sub(a.bytes),
            ops: b.ops.saturating_sub(a.ops),
        }
    }

    /// Engine thread `e`'s counters over intervals `[from, to)` (the
    /// counting fields; the others as at the end).
    pub fn engine_delta(&self, e: usize, from: usize, to: usize) -> EngineStats {
        let get = |i: usize| {
            self.engines
                .get(i.min(self.engines.len().saturating_sub(1)))
                .and_then(|v| v.get(e))
                .copied()
                .unwrap_or_default()
        };
        let (a, b) = (get(from), get(to));
        EngineStats {
            index: b.index,
            cpu: b.cpu,
            vms: b.vms,
            wqes: b.wqes.saturating_sub(a.wqes),
            bytes: b.bytes.saturating_sub(a.bytes),
            parks: b.parks.saturating_sub(a.parks),
            vm_parks: b.vm_parks.saturating_sub(a.vm_parks),
            peeked: b.peeked.saturating_sub(a.peeked),
            late_kicks: b.late_kicks.saturating_sub(a.late_kicks),
            anticipated: b.anticipated.saturating_sub(a.anticipated),
            // A gauge: its value at the end.
            poll_window_us: b.poll_window_us,
        }
    }

    /// Engine threads sampled.
    pub fn engine_count(&self) -> usize {
        self.engines.first().map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn completions_land_in_their_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(100);
        let mut r = Recorder::new(t0, ms, 3);
        r.complete(t0, t0 + Duration::from_millis(50), 64);
        r.complete(t0 + ms, t0 + Duration::from_millis(150), 64);
        r.complete(t0 + ms, t0 + Duration::from_secs(9), 64);
        assert_eq!(r.intervals[0].ops, 1);
        assert_eq!(r.intervals[1].ops, 1);
        // Past the end: the last interval.
        assert_eq!(r.intervals[2].ops, 1);
        let m = merge(&r.intervals, 0, 2);
        assert_eq!((m.ops, m.bytes), (2, 128));
        let p50 = m.latency.value_at_quantile(0.5);
        assert!((49_900_000..=50_100_000).contains(&p50), "{p50}");
    }

    #[test]
    fn deltas_of_samples() {
        let c = |bytes, ops| VmCounters { bytes, ops };
        let s = Samples {
            at: vec![vec![c(0, 0)], vec![c(100, 1)], vec![c(300, 3)]],
            engines: Vec::new(),
        };
        assert_eq!(s.delta(0, 0, 2), c(300, 3));
        assert_eq!(s.delta(0, 1, 2), c(200, 2));
        assert_eq!(s.delta(0, 1, 9), c(200, 2));
        assert_eq!(s.delta(5, 0, 2), c(0, 0));
    }
}
