//! cargo-fuzz target `wqe`: see `vhost_user_rdma_fuzz::wqe`. The input is
//! decoded exactly as `vhost_user_rdma_fuzz::wqe::run` (which the replay test
//! uses) decodes it, so `cargo fuzz fmt wqe FILE` shows what a file does.
#![no_main]

use vhost_user_rdma_fuzz::wqe::{run_input, Input};

libfuzzer_sys::fuzz_target!(|input: Input| {
    run_input(&input);
});
