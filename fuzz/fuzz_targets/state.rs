//! cargo-fuzz target `state`: see `vhost_user_rdma_fuzz::state`. The input is
//! the body of a device state, which the harness frames and loads.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vhost_user_rdma_fuzz::state::run(data);
});
