//! The control-command rate limit of VMs and tenants
//! (`QosSpec::ctrl_per_sec`), as their control workers enforce it.
//!
//! One token per command, taken before the commands run from a
//! [`TokenBucket::ctrl`](super::bucket::TokenBucket::ctrl) holding at most
//! [`ctrl_burst`]`(rate)` tokens — 10 ms worth of commands, at least one. A
//! short burst passes at once; a sustained stream gets `rate` commands per
//! second.

/// Tokens a control-command bucket holds at most for `rate` commands per
/// second: 10 ms worth, at least 1. Small, so that a limited VM's rate
/// holds over short intervals too (a burst of `rate / 10` would let a
/// 1000/s VM issue 100 commands at once), and at least one command always
/// passes.
pub fn ctrl_burst(rate: u64) -> u64 {
    (rate / 100).max(1)
}
