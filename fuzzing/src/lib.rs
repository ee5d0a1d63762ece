//! Fuzzing harnesses of vhost-user-rdma.
//!
//! The harness logic lives in this stable crate so that two users share it:
//! the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) are one-line
//! `fuzz_target!`s that call [`ctrl::run`], [`wqe::run`] and
//! [`engine::run`] and [`vhost::run`], and the integration test `tests/replay.rs` runs every
//! file of the committed corpus through the same functions on stable, on
//! every `cargo test`. A finding of a target is a panic (or, for a hang of
//! the engine harness, an abort by its watchdog).
//!
//! Each function takes raw bytes; most of them are decoded with
//! [`arbitrary`] into a sequence of structured operations (well-formed
//! commands with handles taken from earlier responses, so the fuzzer gets
//! deep), with room for raw, malformed bytes as well.
// A finding is a panic: the harnesses assert their invariants, and treat a
// failure of their own set-up (mapping the guest's RAM, starting the daemon)
// as fatal too, like tests do.
#![allow(clippy::panic, clippy::expect_used)]

pub mod ctrl;
pub mod engine;
pub mod guest;
pub mod state;
pub mod vhost;
pub mod wqe;
