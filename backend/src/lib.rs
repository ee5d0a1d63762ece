//! vhost-user-rdma: a vhost-user daemon that gives virtual machines an RDMA
//! device (virtio-rdma, device ID 42).
//!
//! Layout, one line per module (what it owns), by layer:
//!
//! Daemon and configuration
//! - [`config`]: the daemon configuration and per-VM [`Limits`];
//! - [`config_file`]: the TOML configuration file, errors with file:line;
//! - [`server`]: [`Daemon`], one listener thread per VM socket;
//! - [`view`]: [`DaemonView`] and [`VmStats`], what the operator interfaces
//!   see of a running daemon.
//!
//! vhost-user shell
//! - [`device`]: [`device::RdmaDevice`], one VM's device: the
//!   `VhostUserBackend` (queues, config space, features), the control-queue
//!   worker and event delivery; its `mod.rs` lists its files;
//! - [`vring`]: the virtqueue type (a kick read that survives restarts);
//! - [`restart`]: telling a paused device from a reset one;
//! - [`shmem`]: the shared-memory doorbell region (one page per context).
//!
//! VM model and control path
//! - [`vm`]: [`vm::VmState`], one VM's state (objects, events, memory map,
//!   port), and [`vm::cell::VmCell`], that state behind the VM's lock;
//! - [`ctrl`]: the control-verb dispatcher, one file per object family;
//! - [`resources`]: per-VM objects, handle tables with `insert_*`/
//!   `destroy_*`, the QP state machine;
//! - [`memory`]: the guest RAM map, page-list translation, guest access,
//!   dirty logging for a migrating VMM;
//! - [`events`]: the asynchronous event queue;
//! - [`gid_table`]: a port's GID table (the default GID, the operator's);
//! - [`keys`]: the random source of keys, QP numbers and GUIDs.
//!
//! RNICs and the data path, from the top down
//! - [`rnic`]: the RNICs, each with both of its halves: the software RNIC
//!   ([`rnic::soft`]) and a host RNIC through libibverbs ([`rnic::verbs`]:
//!   host devices, host objects, regions over windows of guest pages,
//!   host events, its data path); [`rnic::Rnic`] opens the one the
//!   configuration names and starts its data path on the engine threads;
//! - [`engine`]: the data path's device model both RNICs share (engine
//!   threads, doorbell polling, the requester, the completer, flush); its
//!   `mod.rs` lists its files;
//! - [`rnic_path`]: the seam of an RNIC's data path: what the engine hands
//!   a checked work request to ([`rnic_path::RnicPath`]);
//! - [`rnic_objects`]: the seam of an RNIC's object half: what the control
//!   path asks of the RNIC for each object ([`rnic_objects::RnicObjects`]:
//!   QPs, CQs, SRQs, AHs, MRs, QP numbers and keys, caps);
//! - [`relocation`]: what a host RNIC's objects carry to another host (the
//!   host QPs' transport state) and the move record a VM's peers take.
//!
//! Policy
//! - [`tenancy`]: tenants, VMs' GIDs and the isolation counters;
//! - [`qos`]: settings, token bucket, DRR, rate limits, control-command
//!   limiter; its `mod.rs` lists its files.
//!
//! Operations
//! - [`stats`]: per-VM traffic counters and latency histograms;
//! - [`snapshot`]: per-VM snapshots and per-tenant sums for reporting;
//! - [`mgmt`]: the management socket (JSON API) and its `ctl` client;
//! - [`metrics`]: Prometheus metrics over HTTP;
//! - [`conn_pool`]: the capped thread-per-connection pool of both;
//! - [`logging`]: text or JSON log lines naming the VM and tenant.

// The guest-facing modules (`guest_facing!` at the end of this file and
// for the RNICs' data paths in `rnic`, and the whole `virtio-rdma-abi`
// crate) carry a `deny`: every handle, length, index and
// address they handle may come from a hostile guest, so arithmetic that can
// overflow, indexing that can panic and casts that can truncate are errors
// there. An exception is a narrow `#[allow]` on the smallest item, with a
// comment saying why it is bounded. Unit tests (`cfg(test)`) are exempt.
macro_rules! guest_facing {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$attr])*
            #[cfg_attr(
                not(test),
                deny(
                    clippy::arithmetic_side_effects,
                    clippy::indexing_slicing,
                    clippy::cast_possible_truncation
                )
            )]
            pub mod $name;
        )*
    };
}

pub mod config;
pub mod config_file;
pub mod conn_pool;
pub mod device;
pub mod events;
pub mod gid_table;
pub mod handover;
pub mod keys;
pub mod local_socket;
pub mod logging;
pub mod metrics;
pub mod mgmt;
pub mod notify;
pub mod restart;
pub mod rnic;
pub mod rnic_objects;
pub mod server;
pub mod snapshot;
pub mod stats;
pub mod sync;
pub mod tenancy;
pub mod view;
pub mod vring;

guest_facing!(ctrl, engine, memory, migration, qos, relocation, resources, rnic_path, shmem, vm);

pub use config::{DaemonConfig, Limits};
pub use server::Daemon;
pub use view::{DaemonView, VmStats};
