//! The host RNIC through libibverbs (`rdma-sys`): a real RNIC, or Linux's
//! soft-RoCE (`rdma_rxe`) where there is none, for RDMA between VMs on
//! different hosts. Both halves: the object half ([`VerbsRnic`]) and the
//! data path ([`VerbsPath`]).
//!
//! - [`device`]: opening a device, one of its ports and one GID, and what
//!   it offers ([`device::VerbsDevice::caps`]);
//! - [`rnic`]: [`rnic::VerbsRnic`], the object half: one host object per
//!   device object, memory regions over windows of guest pages; and
//!   [`rnic::moves`], host QPs across hosts (spec 20.8): their transport
//!   state saved and restored, peers' connections held and pointed anew;
//! - [`attr`]: the device's values in libibverbs' terms and back;
//! - [`objects`]: owned host objects, destroyed when dropped;
//! - [`events`]: the host's asynchronous events, handed to the VMs;
//! - [`quota`]: each VM's share of the host NIC's objects and of the
//!   daemon's mappings;
//! - [`path`]: [`path::VerbsPath`], the data path: the engine's checked
//!   WQEs posted to the host queues; [`post`]: send and receive work
//!   requests in libibverbs' terms; [`chain`]: a burst's send requests
//!   posted together; [`complete`]: host completions and
//!   host events applied to the VM; [`scratch`]: the data path's reusable
//!   memory;
//! - [`cm`]: the bridge between a guest's connection management and the
//!   host's `rdma_cm`; [`cm_hub`]: the bridge as the RNIC holds it, with
//!   each VM's inbox of MADs; [`cm_events`]: the thread that feeds it the
//!   host CM's events; [`gsi`]: each VM's GSI QP, whose MADs go to the
//!   bridge; [`cm_gate`]: what `MODIFY_QP` of a bridged QP must match.

// Everything but the quotas talks to libibverbs (feature `verbs`); the
// quotas are plain arithmetic, also tested over the software RNIC. The data
// path handles what guests post: it is guest-facing.
#[cfg(feature = "verbs")]
pub mod attr;
pub mod cm;
#[cfg(feature = "verbs")]
pub mod cm_events;
pub mod cm_gate;
#[cfg(feature = "verbs")]
pub mod cm_hub;
#[cfg(feature = "verbs")]
pub mod device;
#[cfg(feature = "verbs")]
pub mod events;
#[cfg(feature = "verbs")]
pub mod objects;
pub mod quota;
#[cfg(feature = "verbs")]
mod readable;
#[cfg(feature = "verbs")]
pub mod rnic;
#[cfg(feature = "verbs")]
mod routes;
guest_facing!(
    #[cfg(feature = "verbs")]
    chain,
    #[cfg(feature = "verbs")]
    complete,
    #[cfg(feature = "verbs")]
    gsi,
    #[cfg(feature = "verbs")]
    path,
    #[cfg(feature = "verbs")]
    post,
    #[cfg(feature = "verbs")]
    scratch,
);

#[cfg(feature = "verbs")]
pub use path::VerbsPath;
#[cfg(feature = "verbs")]
pub use rnic::VerbsRnic;
