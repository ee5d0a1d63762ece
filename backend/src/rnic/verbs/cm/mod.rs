//! The connection-management bridge of the libibverbs transport: the host
//! port's QP 1 belongs to the host kernel, so the daemon terminates the CM
//! exchange of a guest's GSI QP and drives the host's `rdma_cm` for the
//! guest's host QP (docs/abi-v3-design.md, section 4).
//!
//! - [`host`]: the host's `rdma_cm` (librdmacm), QP-less ids and their
//!   events.

pub mod host;
