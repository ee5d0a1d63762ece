//! Hostile-guest tests: a guest (VM A) sends malformed, inconsistent or
//! malicious control requests through the real vhost-user socket.
//!
//! Every case asserts the exact status and `detail` that
//! `docs/virtio-rdma-spec.md` documents, and that a failed command had no
//! effect (no object created or destroyed, no QP number consumed). After every
//! case, [`world::assert_unharmed`] checks that
//!
//! - VM A is still served: a valid command sequence succeeds and its
//!   pre-existing QP reads back exactly as before;
//! - VM B, on the same daemon, is unaffected: it never reconnected, holds the
//!   objects it created before the attack (its QP reads back exactly as
//!   before), saw no failed or malformed command, and can create, use and
//!   destroy new objects;
//! - the daemon holds exactly the QP numbers of the live QPs of both VMs.
//!
//! Each `#[test]` is one named case run by [`world::hostile`] (or
//! [`world::hostile_in`] for a daemon with small limits or a guest without
//! some features), on a daemon of its own.
//!
//! Cases marked `Regression` failed against an earlier daemon; the comment
//! says what it got wrong.
//!
//! The cases are grouped by the chapter of the spec they attack, one module
//! each; `world` and `requests` are the fixtures they share.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chains;
mod commands;
mod controlq;
mod disconnect;
mod fast_reg;
mod gsi;
mod handles;
mod ownership;
mod page_list_addresses;
mod page_list_shape;
mod qp_states;
mod quotas;
mod requests;
mod resize;
mod world;
mod xrc;
