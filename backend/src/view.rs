//! What the operator interfaces see of a running daemon: [`DaemonView`]
//! (every VM's socket, connection state and counters, the tenancy table,
//! the live QoS settings, the engine threads) and [`VmStats`], one VM's
//! statistics. [`crate::server`] builds the view; [`crate::mgmt`],
//! [`crate::metrics`] and [`crate::snapshot`] read it without depending on
//! the server that starts them.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost_user_backend::ShutdownHandle;

use crate::device::{DeviceStats, RdmaDevice, Shared};
use crate::engine::{EngineStats, Engines};
use crate::handover::hold::AcceptHold;
use crate::handover::relay::Relay;
use crate::qos::QosTable;
use crate::sync::lock;
use crate::tenancy::Tenancy;

/// Statistics of one VM socket.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VmStats {
    /// Whether a VMM is connected now.
    pub connected: bool,
    /// Connections accepted so far.
    pub connections: u64,
    /// The current (or last) device's state.
    pub device: DeviceStats,
    /// `None` when `device` was read now. Otherwise the VM's state lock was
    /// busy (a long command, or a stuck thread), and `device` holds the last
    /// values read, this many milliseconds old (all zero if none were ever
    /// read). Only the operator interfaces ([`DaemonView`]) report such
    /// values; [`crate::Daemon::vm_stats`] waits for the lock.
    pub stale_ms: Option<u64>,
}

/// One VM socket: its device and connection state, shared by the socket's
/// serving thread ([`crate::server`]) and the operator interfaces.
pub(crate) struct VmSlot {
    pub(crate) path: PathBuf,
    /// A second descriptor of the listening socket: `shutdown(2)` on it
    /// wakes the serving thread's `accept()` at shutdown, also when the
    /// socket's path is gone (connecting to it would then fail).
    pub(crate) listen_wake: OwnedFd,
    pub(crate) device: Arc<RdmaDevice>,
    pub(crate) shutdown: Mutex<Option<ShutdownHandle>>,
    /// The relay of the VMM's connection, while one is connected and the
    /// relay runs.
    pub(crate) relay: Mutex<Option<Relay>>,
    /// The accepting thread, as a hand-over holds it.
    pub(crate) accept: AcceptHold,
    /// Whether a VMM is connected, and the connections counted so far.
    pub(crate) conn: ConnectionState,
    /// The last device statistics the operator interfaces read, and when.
    pub(crate) last_stats: Mutex<Option<(DeviceStats, Instant)>>,
}

/// Whether a VMM is connected to a VM socket, and how many connections
/// the socket has had. The socket's serving thread marks a connection
/// connected and counts it once the connection is set up, and clears the
/// mark only after it released everything of the connection (relay,
/// handler, vring workers, their exit events, the VM's memory): a reader
/// that finds the connection it waits for counted and the mark clear
/// knows the connection is gone.
#[derive(Debug, Default)]
pub(crate) struct ConnectionState {
    connected: AtomicBool,
    count: AtomicU64,
}

impl ConnectionState {
    /// The serving thread serves its next connection: marks it connected
    /// and returns its number (from 1).
    pub(crate) fn begin(&self) -> u64 {
        self.connected.store(true, Ordering::Release);
        self.count.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The serving thread has released everything of its connection.
    pub(crate) fn end(&self) {
        self.connected.store(false, Ordering::Release);
    }

    /// Whether a VMM is connected now.
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Whether a VMM is connected, and the connections counted: a pair that
    /// was true at one moment or another, never the count of a connection
    /// with the mark of before it (see [`ConnectionState::read_around`]).
    pub(crate) fn get(&self) -> (bool, u64) {
        self.read_around(|| ())
    }

    /// [`ConnectionState::get`], running `between` between its two loads
    /// (tests put the serving thread's steps there).
    ///
    /// The count is read first: `begin` marks before it counts, so the mark
    /// read afterwards is that of the last connection counted or a later
    /// one, and "not connected" means that connection has ended. Read the
    /// other way round, a connection counted between the loads came with
    /// the mark of before it: counted and not connected while being served
    /// (docs/fuzzing.md, campaign of 2026-11-28, item 3).
    fn read_around(&self, between: impl FnOnce()) -> (bool, u64) {
        let count = self.count.load(Ordering::Acquire);
        between();
        (self.connected.load(Ordering::Acquire), count)
    }
}

/// How long the operator interfaces try for a VM's state lock before they
/// report its last statistics instead. Commands and engine passes hold it
/// for microseconds; a scrape of many VMs must not add up long waits.
const STATS_LOCK_WAIT: Duration = Duration::from_millis(5);

impl VmSlot {
    /// A socket at `path` serving `device`, never connected yet.
    pub(crate) fn new(
        path: PathBuf,
        device: Arc<RdmaDevice>,
        listen_wake: OwnedFd,
        accept: AcceptHold,
    ) -> VmSlot {
        VmSlot {
            accept,
            path,
            listen_wake,
            device,
            shutdown: Mutex::new(None),
            relay: Mutex::new(None),
            conn: ConnectionState::default(),
            last_stats: Mutex::new(None),
        }
    }

    /// The VM's statistics, waiting for its state lock.
    pub(crate) fn stats(&self) -> VmStats {
        let (connected, connections) = self.conn.get();
        VmStats {
            connected,
            connections,
            device: self.device.stats(),
            stale_ms: None,
        }
    }

    /// [`VmSlot::stats`] without waiting for the VM's state lock (more than
    /// [`STATS_LOCK_WAIT`]): the operator interfaces' view.
    fn stats_nowait(&self) -> VmStats {
        let start = Instant::now();
        let fresh = loop {
            if let Some(s) = self.device.try_stats() {
                break Some(s);
            }
            if start.elapsed() >= STATS_LOCK_WAIT {
                break None;
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        let mut last = lock(&self.last_stats);
        let (device, stale_ms) = match fresh {
            Some(s) => {
                *last = Some((s, Instant::now()));
                (s, None)
            }
            None => match *last {
                Some((s, at)) => (
                    s,
                    Some(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)),
                ),
                None => (DeviceStats::default(), Some(u64::MAX)),
            },
        };
        let (connected, connections) = self.conn.get();
        VmStats {
            connected,
            connections,
            device,
            stale_ms,
        }
    }
}

/// What the operator interfaces (management socket, metrics) see of a
/// running daemon: every VM's socket, connection state and device counters,
/// the tenancy table and the live QoS settings. Cheap to clone.
#[derive(Clone)]
pub struct DaemonView {
    slots: Vec<Arc<VmSlot>>,
    shared: Shared,
    engines: Arc<Engines>,
    rnic: Arc<dyn crate::rnic_objects::RnicObjects>,
}

impl DaemonView {
    /// The view of the daemon serving `slots` ([`crate::Daemon::view`]).
    pub(crate) fn new(
        slots: Vec<Arc<VmSlot>>,
        shared: Shared,
        engines: Arc<Engines>,
        rnic: Arc<dyn crate::rnic_objects::RnicObjects>,
    ) -> Self {
        DaemonView {
            slots,
            shared,
            engines,
            rnic,
        }
    }

    /// VM `index`'s part of the host the RNIC gives it (`None`: the
    /// software RNIC, which has no such limits).
    pub fn host_usage(&self, index: usize) -> Option<crate::rnic_objects::HostUsage> {
        self.rnic.host_usage(index)
    }

    /// The move record of VM `identity` after a state from another host
    /// was loaded into one of its instances (spec 20.8); `None` if none
    /// was.
    pub fn move_record(&self, identity: usize) -> Option<crate::relocation::MoveRecord> {
        let tenancy = &self.shared.tenancy;
        let name = tenancy.vm(identity)?.name.clone();
        (0..self.slots.len())
            .filter(|&i| tenancy.vm(i).is_some_and(|v| v.identity == identity))
            .find_map(|i| self.rnic.move_record(i, &name))
    }

    /// How VM instance `index`'s QPs are known on the wire now (the
    /// libibverbs transport): GID, and device and host QP numbers.
    pub fn wire_qps(&self, index: usize) -> Option<crate::relocation::WireQps> {
        let tenancy = &self.shared.tenancy;
        let identity = tenancy.vm(index).map_or(index, |v| v.identity);
        let active = tenancy.vm(identity).map_or(index, |v| v.active());
        self.rnic.wire_qps(active)
    }

    /// Holds this daemon's connections to QPs `qpns` of GID `gid` until
    /// `until` (a peer VM is about to move); how many.
    pub fn peer_hold(&self, gid: [u8; 16], qpns: &[u32], until: std::time::Instant) -> usize {
        self.rnic.peer_hold(gid, qpns, until)
    }

    /// Takes a peer VM's move record; how many connections are pointed
    /// anew.
    pub fn peer_moved(&self, record: &crate::relocation::MoveRecord) -> Result<usize, String> {
        self.rnic.peer_moved(record)
    }

    /// Number of VMs.
    pub fn vm_count(&self) -> usize {
        self.slots.len()
    }

    /// Statistics of VM `index`, without waiting for its state lock: if
    /// the lock stays busy for 5 ms, its last statistics, marked
    /// with their age ([`VmStats::stale_ms`]).
    pub fn vm_stats(&self, index: usize) -> Option<VmStats> {
        self.slots.get(index).map(|s| s.stats_nowait())
    }

    /// The vhost-user socket of VM `index`.
    pub fn vm_socket(&self, index: usize) -> Option<&Path> {
        self.slots.get(index).map(|s| s.path.as_path())
    }

    /// Tenants, VMs and their counters.
    pub fn tenancy(&self) -> &Arc<Tenancy> {
        &self.shared.tenancy
    }

    /// The live QoS settings.
    pub fn qos(&self) -> &Arc<QosTable> {
        &self.shared.qos
    }

    /// Waits until every engine thread enforces every QoS change made so
    /// far ([`Engines::sync_qos`]).
    pub fn sync_qos(&self, timeout: Duration) -> bool {
        self.engines.sync_qos(self.shared.qos.generation(), timeout)
    }

    /// The engine threads' counters.
    pub fn engine_stats(&self) -> Vec<EngineStats> {
        self.engines.stats()
    }

    /// The engine thread serving VM `vm`.
    pub fn engine_of(&self, vm: usize) -> usize {
        self.engines.for_vm(vm).index()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection counted while its socket's state is read is never
    /// reported as counted and not connected: a reader waiting for that
    /// connection's end would take it for ended while it is being served.
    #[test]
    fn a_connection_counted_during_a_read_is_not_reported_ended() {
        let conn = ConnectionState::default();
        assert_eq!(conn.begin(), 1);
        conn.end();
        // Connection 2 is set up and counted between the two loads.
        let (connected, count) = conn.read_around(|| {
            assert_eq!(conn.begin(), 2);
        });
        assert!(
            connected || count < 2,
            "connection 2 reported counted and not connected while served"
        );
        assert_eq!(conn.get(), (true, 2));
        conn.end();
        assert_eq!(conn.get(), (false, 2));
    }
}
