//! The host RNIC through libibverbs (`rdma-sys`): a real RNIC, or Linux's
//! soft-RoCE (`rdma_rxe`) where there is none, for RDMA between VMs on
//! different hosts.
//!
//! - [`device`]: opening a device, one of its ports and one GID, and what
//!   it offers ([`device::VerbsDevice::caps`]);
//! - [`rnic`]: [`rnic::VerbsRnic`], the object half: one host object per
//!   device object, memory regions over windows of guest pages;
//! - [`attr`]: the device's values in libibverbs' terms and back;
//! - [`objects`]: owned host objects, destroyed when dropped;
//! - [`events`]: the host's asynchronous events, handed to the VMs;
//! - [`quota`]: each VM's share of the host NIC's objects and of the
//!   daemon's mappings.
//!
//! The data path is `engine::verbs`.

// Everything but the quotas talks to libibverbs (feature `verbs`); the
// quotas are plain arithmetic, also tested over the software RNIC.
#[cfg(feature = "verbs")]
pub mod attr;
#[cfg(feature = "verbs")]
pub mod device;
#[cfg(feature = "verbs")]
pub mod events;
#[cfg(feature = "verbs")]
pub mod objects;
pub mod quota;
#[cfg(feature = "verbs")]
pub mod rnic;

#[cfg(feature = "verbs")]
pub use rnic::VerbsRnic;
