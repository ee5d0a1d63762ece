//! cargo-fuzz target `wqe`: see `vhost_user_rdma_fuzz::wqe`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_rdma_fuzz::wqe::run(data));
