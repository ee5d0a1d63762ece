//! cargo-fuzz target `vhost`: see `vhost_user_rdma_fuzz::vhost`. The input is
//! decoded exactly as `vhost_user_rdma_fuzz::vhost::run` (which the replay test
//! uses) decodes it, so `cargo fuzz fmt vhost FILE` shows what a file does.
#![no_main]

use vhost_user_rdma_fuzz::vhost::{run_input, Input};

libfuzzer_sys::fuzz_target!(|input: Input| {
    run_input(&input);
});
