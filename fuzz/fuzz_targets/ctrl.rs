//! cargo-fuzz target `ctrl`: see `vhost_user_rdma_fuzz::ctrl`. The input is
//! decoded exactly as `vhost_user_rdma_fuzz::ctrl::run` (which the replay test
//! uses) decodes it, so `cargo fuzz fmt ctrl FILE` shows what a file does.
#![no_main]

use vhost_user_rdma_fuzz::ctrl::{run_input, Input};

libfuzzer_sys::fuzz_target!(|input: Input| {
    run_input(&input);
});
