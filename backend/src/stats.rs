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

impl HistogramSnapshot {
    /// Adds the observations of `other`.
    pub fn add(&mut self, other: &Self) {
        for (x, y) in self.buckets.iter_mut().zip(other.buckets) {
            *x += y;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }
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

/// Generates, from one list of counters, a struct of `AtomicU64`s (the
/// counters), its snapshot struct of `u64`s, `snapshot()`, the snapshot's
/// `add` (sums over VMs), `NAMES` and `fields()` (name and value of every
/// counter, in list order: the JSON keys of the management API and the
/// rows of `ctl stats`), and `METRICS` (the Prometheus name and help of
/// those that have one, by position).
///
/// An entry is `doc name,` or `doc name => "metric_total": "help",`.
/// Fields of other types (`others`) follow with the type of their
/// snapshot, which has `add` too; they are not in `fields()`.
macro_rules! counters {
    (
        $(#[doc = $cdoc:literal])+
        pub struct $counters:ident;
        $(#[doc = $sdoc:literal])+
        pub struct $stats:ident;
        counters {
            $(
                $(#[doc = $doc:literal])+
                $field:ident $(=> $metric:literal: $help:literal)?,
            )*
        }
        $(others {
            $(
                $(#[doc = $odoc:literal])+
                $ofield:ident: $oty:ty => $osty:ty,
            )*
        })?
    ) => {
        $(#[doc = $cdoc])+
        #[derive(Debug, Default)]
        pub struct $counters {
            $($(#[doc = $doc])+ pub $field: std::sync::atomic::AtomicU64,)*
            $($($(#[doc = $odoc])+ pub $ofield: $oty,)*)?
        }

        $(#[doc = $sdoc])+
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct $stats {
            $($(#[doc = $doc])+ pub $field: u64,)*
            $($($(#[doc = $odoc])+ pub $ofield: $osty,)*)?
        }

        impl $counters {
            /// Current values.
            pub fn snapshot(&self) -> $stats {
                $stats {
                    $($field: self.$field.load(std::sync::atomic::Ordering::Relaxed),)*
                    $($($ofield: self.$ofield.snapshot(),)*)?
                }
            }
        }

        impl $stats {
            /// Names of the counters, in list order.
            pub const NAMES: [&'static str; [$(stringify!($field)),*].len()] =
                [$(stringify!($field)),*];

            /// Prometheus name and help of each counter that has them,
            /// in the order of [`Self::NAMES`].
            pub const METRICS: [Option<(&'static str, &'static str)>; Self::NAMES.len()] =
                [$($crate::stats::counters!(@metric $($metric: $help)?)),*];

            /// Name and value of every counter, in list order.
            pub fn fields(&self) -> [(&'static str, u64); Self::NAMES.len()] {
                [$((stringify!($field), self.$field)),*]
            }

            /// Adds `other` (another VM's) to these sums.
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
                $($(self.$ofield.add(&other.$ofield);)*)?
            }
        }
    };
    (@metric) => { None };
    (@metric $metric:literal: $help:literal) => { Some(($metric, $help)) };
}
pub(crate) use counters;

/// Generates, for a struct of plain values (`usize` or `u64`) that are
/// summed over VMs, `add` (the sums), `NAMES` and `fields()` (name and
/// value of every field, in order: the JSON keys of the management API and
/// the rows of `ctl stats`). The struct is written as usual inside.
macro_rules! sums {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[doc = $doc:literal])+ pub $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[doc = $doc])+ pub $field: $ty, )*
        }

        impl $name {
            /// Names of the fields, in order.
            pub const NAMES: [&'static str; [$(stringify!($field)),*].len()] =
                [$(stringify!($field)),*];

            /// Name and value of every field, in order.
            pub fn fields(&self) -> [(&'static str, u64); Self::NAMES.len()] {
                [$((stringify!($field), $crate::stats::as_u64(self.$field))),*]
            }

            /// Adds `other` (another VM's) to these sums.
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }
        }
    };
}
pub(crate) use sums;

/// A count as `u64` (saturating), for the `fields()` of `sums!`.
pub fn as_u64(v: impl TryInto<u64>) -> u64 {
    v.try_into().unwrap_or(u64::MAX)
}

counters! {
    /// Data-path and control-path counters of one VM.
    pub struct TrafficCounters;
    /// A snapshot of [`TrafficCounters`].
    pub struct TrafficStats;
    counters {
        /// Send work requests the VM's QPs executed (successfully or not).
        send_ops => "send_ops_total": "Send work requests executed.",
        /// Payload bytes of the VM's successful send work requests.
        send_bytes => "send_bytes_total": "Payload bytes of successful send work requests.",
        /// Messages delivered to the VM's QPs (SEND, WRITE, READ, atomic as
        /// responder).
        recv_ops => "recv_ops_total": "Messages delivered to the VM's QPs as responder.",
        /// Payload bytes of those messages.
        recv_bytes => "recv_bytes_total": "Payload bytes of messages delivered to the VM's QPs.",
        /// Completions with an error status other than a flush.
        error_cqes => "error_completions_total":
            "Completions with an error status other than flush.",
        /// Completions with `WR_FLUSH_ERR`.
        flushed => "flushed_completions_total": "Completions with WR_FLUSH_ERR.",
        /// Messages dropped (UD with no taker, wrong Q_Key, foreign tenant).
        drops => "drops_total":
            "Messages dropped (UD without taker, wrong Q_Key, foreign tenant).",
        /// MADs of the VM's GSI QP dropped: over its MAD rate, to a GID
        /// outside its tenant or of nobody, or not taken (no GSI QP
        /// receiving there; on the `verbs` RNIC also those its CM bridge
        /// does not take or cannot deliver); each also counts in `drops`.
        mad_dropped => "mad_dropped_total":
            "MADs dropped (over the MAD rate, outside the tenant, or not taken).",
        /// Of those, the CM MADs the `verbs` RNIC's CM bridge refused: not
        /// a CM message it handles (another class too), one naming a
        /// connection the VM does not have, or in the wrong state.
        cm_dropped => "cm_dropped_total":
            "MADs the CM bridge refused (not CM, not the VM's connection, wrong state).",
        /// Times the engine postponed the VM's work for a rate limit.
        throttled => "throttled_total": "Times the engine postponed work for a rate limit.",
        /// Notifications (kicks) of notifyq the VM sent to wake the engine;
        /// each is a VM exit, so a driver should kick only when the engine is
        /// parked (spec 18.6).
        notifications => "notifications_total":
            "Notifications of notifyq (doorbell kicks, each a VM exit) to wake the engine.",
        /// Control commands executed.
        ctrl_cmds => "ctrl_commands_total": "Control commands executed (engine accounting).",
        /// Control commands that failed.
        ctrl_errors => "ctrl_errors_total": "Control commands that failed (engine accounting).",
    }
    others {
        /// Time from a control request being taken to its response.
        ctrl_latency: Histogram => HistogramSnapshot,
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_snapshot_sum_and_list_their_fields() {
        let c = TrafficCounters::default();
        TrafficCounters::add(&c.send_ops, 2);
        TrafficCounters::add_single_writer(&c.ctrl_errors, 5);
        c.ctrl_latency.observe(Duration::from_micros(7));
        let mut s = c.snapshot();
        s.add(&c.snapshot());
        assert_eq!((s.send_ops, s.ctrl_errors), (4, 10));
        assert_eq!((s.ctrl_latency.count, s.ctrl_latency.buckets[1]), (2, 2));
        let f = s.fields();
        assert_eq!(f.len(), 13);
        assert_eq!(f[0], ("send_ops", 4));
        assert_eq!(f[12], ("ctrl_errors", 10));
        assert_eq!(f.map(|(name, _)| name), TrafficStats::NAMES);
        assert_eq!(
            TrafficStats::METRICS[4].map(|(name, _)| name),
            Some("error_completions_total")
        );
        assert!(TrafficStats::METRICS.iter().all(Option::is_some));
    }

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
