//! End-to-end data path with more than two VMs on one daemon, asynchronous
//! data-path events (CQ overflow, SRQ limit, communication established, last
//! WQE reached), a VM that disconnects in the middle of traffic, and the
//! rules of spec chapter 18 that `datapath.rs` does not exercise: fences,
//! solicited arming, remote access and length errors, zero-length messages.
//!
//! Every VM runs the reference guest driver over
//! [`VmmTransport`](vhost_user_rdma_tests::transport::VmmTransport).
//!
//! The tests are grouped by what they cover, one module each; the fixtures
//! they share are in [`vhost_user_rdma_tests::dp`] and `fixtures`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod async_events;
mod broken_queues;
mod completions;
mod destroyed_peer;
mod disconnect;
mod error_flush;
mod fences_and_arming;
mod fixtures;
mod gsi_wqes;
mod many_vms;
mod memory_table;
mod operations;
mod raw;
mod retries;
