//! cargo-fuzz target `engine`: see `vhost_user_rdma_fuzz::engine`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_rdma_fuzz::engine::run(data));
