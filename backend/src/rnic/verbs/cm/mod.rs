//! The connection-management bridge of the libibverbs transport: the host
//! port's QP 1 belongs to the host kernel, so the daemon terminates the CM
//! exchange of a guest's GSI QP and drives the host's `rdma_cm` for the
//! guest's host QP (docs/abi-v3-design.md, section 4).
//!
//! - [`bridge`]: the decisions, without I/O (also tested without a host
//!   RNIC);
//! - [`conn`]: what the bridge and the host CM exchange;
//! - [`host`]: the host's `rdma_cm` (librdmacm), QP-less ids and their
//!   events;
//! - [`service`]: the decisions executed on the host CM.

pub mod bridge;
pub mod conn;
#[cfg(feature = "verbs")]
pub mod host;
#[cfg(feature = "verbs")]
pub mod service;
