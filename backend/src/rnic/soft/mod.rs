//! The software RNIC: RDMA between the VMs of one daemon. With no wire
//! between them, the requester performs the responder's part directly on
//! the peer's objects and memory, and each operation completes in one step.
//!
//! - [`rnic`]: [`rnic::SoftRnic`], the object half (QP numbers, keys);
//!   [`keyspace`]: the keys, where a fast-registration region owns 256;
//! - [`path`]: [`path::SoftPath`], the data path behind the engine's seam
//!   ([`crate::rnic_path::RnicPath`]); [`burst`]: what it keeps for a
//!   burst (the peer VM locked for it); [`lane`]: small WRITEs in one pass;
//! - [`route`]: getting a message to its responder (QPN lookup, tenant
//!   policy, the peer VM's lock); [`request`]: a message as the responder
//!   gets it, and what it answers; [`mad`]: the GSI QP's MADs (QP 1 of
//!   the VM with the destination GID, the MAD rate); [`checks`]: whether the responder QP
//!   takes a message, one set for the general path and the lane;
//!   [`responder`] and [`receive`]: the responder's side; [`retry`]: retry emulation; [`pieces`]: large
//!   messages in pieces.

pub mod burst;
pub mod checks;
pub mod keyspace;
pub mod lane;
#[cfg(test)]
mod lane_agrees;
pub mod mad;
pub mod path;
pub mod pieces;
pub mod receive;
pub mod request;
pub mod responder;
pub mod retry;
pub mod rnic;
pub mod route;

pub use path::SoftPath;
pub use pieces::{ALONE_PIECE, PIECE};
pub use rnic::SoftRnic;
