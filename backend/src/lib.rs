//! vhost-user-rdma: a vhost-user daemon that gives virtual machines an RDMA
//! device (virtio-rdma, device ID 42).
//!
//! Layout:
//! - [`config`]: limits and daemon configuration;
//! - [`server`]: one listener thread per vhost-user socket (one VM each);
//! - [`device`]: the `VhostUserBackend` implementation (queues, config space);
//! - [`ctrl`]: the control-verb dispatcher;
//! - [`engine`]: the data path: engine threads, doorbell polling, the
//!   requester, completions, QoS, and the software RNIC's transport;
//! - [`resources`]: per-VM objects, handles and the QP state machine;
//! - [`memory`]: guest RAM map and page-list translation;
//! - [`events`]: the asynchronous event queue;
//! - [`restart`]: telling a paused device from a reset one;
//! - [`rnic`]: the host RNIC engines (built-in software RNIC);
//! - [`tenancy`]: tenants, VMs' GIDs and the isolation policy;
//! - [`qos`]: rate limits and weights, changeable at run time;
//! - [`stats`]: per-VM traffic counters and latency histograms;
//! - [`snapshot`]: per-VM snapshots and per-tenant sums for reporting;
//! - [`mgmt`]: the management socket (JSON API) and its client;
//! - [`metrics`]: Prometheus metrics over HTTP;
//! - [`logging`]: text or JSON log lines;
//! - [`vring`]: the virtqueue type (a kick read that survives queue restarts).

// The guest-facing modules, `ctrl`, `engine`, `memory`, `resources` and
// `shmem` (and the whole `virtio-rdma-abi` crate), each carry the `deny`
// below: every handle, length, index and address they handle may come from a
// hostile guest, so arithmetic that can overflow, indexing that can panic and
// casts that can truncate are errors there. An exception is a narrow
// `#[allow]` on the smallest item, with a comment saying why it is bounded.
pub mod config;
pub mod config_file;
pub mod conn_pool;
#[deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
pub mod ctrl;
pub mod device;
#[deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
pub mod engine;
pub mod events;
pub mod keys;
pub mod logging;
#[deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
pub mod memory;
pub mod metrics;
pub mod mgmt;
pub mod qos;
#[deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
pub mod resources;
pub mod restart;
pub mod rnic;
pub mod server;
#[deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
pub mod shmem;
pub mod snapshot;
pub mod stats;
pub mod tenancy;
pub mod view;
pub mod vring;

pub use config::{DaemonConfig, Limits};
pub use server::Daemon;
pub use view::{DaemonView, VmStats};
