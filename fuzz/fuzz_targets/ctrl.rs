//! cargo-fuzz target `ctrl`: see `vhost_user_rdma_fuzz::ctrl`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_rdma_fuzz::ctrl::run(data));
