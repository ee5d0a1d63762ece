//! The host RNIC through libibverbs (`rdma-sys`): a real RNIC, or Linux's
//! soft-RoCE (`rdma_rxe`) where there is none, for RDMA between VMs on
//! different hosts.
//!
//! - [`device`]: opening a device, one of its ports and one GID, and what
//!   it offers ([`device::VerbsDevice::caps`]).

pub mod device;
