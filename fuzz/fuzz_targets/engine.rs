//! cargo-fuzz target `engine`: see `vhost_user_rdma_fuzz::engine`. The input is
//! decoded exactly as `vhost_user_rdma_fuzz::engine::run` (which the replay test
//! uses) decodes it, so `cargo fuzz fmt engine FILE` shows what a file does.
#![no_main]

use vhost_user_rdma_fuzz::engine::{run_input, Input};

libfuzzer_sys::fuzz_target!(|input: Input| {
    run_input(&input);
});
