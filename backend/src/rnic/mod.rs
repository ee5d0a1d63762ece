//! The host RNIC behind the device.
//!
//! The device model (per-VM handles, validation, the control path) is the
//! same whatever moves the bytes; an [`Rnic`] engine provides the resources
//! that are shared between VMs. The built-in [`soft::SoftRnic`] is the
//! default; a libibverbs engine comes later behind the same trait.

pub mod soft;

use thiserror::Error;

/// Errors of an RNIC engine.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RnicError {
    /// The engine has no free QP number left.
    #[error("QP number space exhausted")]
    QpnExhausted,
    /// The system random source failed.
    #[error("random source failed")]
    Random,
}

/// Port and device properties the engine dictates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RnicCaps {
    /// Largest path MTU (an `Mtu` value).
    pub max_mtu: u32,
    /// Link rate in Mbit/s.
    pub link_rate_mbps: u32,
    /// Whether atomics are supported.
    pub atomics: bool,
    /// Largest message in bytes (the port's `max_msg_size`); a longer one
    /// fails with `LOC_LEN_ERR` before any of it is looked at.
    pub max_msg_size: u32,
    /// `DeviceAttr.local_ca_ack_delay`: the longest time the engine takes
    /// to acknowledge a request, 4.096 µs × 2^value (0 to 31).
    pub local_ca_ack_delay: u32,
}

impl RnicCaps {
    /// The largest UD message payload: the MTU in bytes (`128 << mtu`).
    pub fn max_ud_payload(&self) -> u32 {
        128u32.checked_shl(self.max_mtu).unwrap_or(0)
    }
}

/// A host RNIC engine shared by all VMs the daemon serves.
pub trait Rnic: Send + Sync {
    /// Engine capabilities.
    fn caps(&self) -> RnicCaps;
    /// Allocates a QP number, unique among all VMs of this engine.
    fn alloc_qpn(&self) -> Result<u32, RnicError>;
    /// Records which VM (`vm`) and QP handle own an allocated QP number, so
    /// that peers can reach it.
    fn bind_qpn(&self, qpn: u32, vm: usize, handle: u32);
    /// The owner of a QP number.
    fn lookup_qpn(&self, qpn: u32) -> Option<(usize, u32)>;
    /// Returns a QP number to the engine.
    fn free_qpn(&self, qpn: u32);
    /// QP numbers currently allocated (for leak checks and statistics).
    fn qpns_in_use(&self) -> usize;
}
