//! What the tests here share beyond [`vhost_user_rdma_tests::dp`]: RC
//! connections with fast transport retries ([`dp::fast`]), so that a peer
//! that is gone is reported within milliseconds; the size of the UD GRH; and
//! what an error completion must not carry.

use vhost_user_rdma_tests::dp::{self, Pair, Vm};
use virtio_rdma_driver::{Qp, RcConnect, WorkCompletion};

/// UD_GRH_SIZE.
pub const GRH: usize = 40;

/// Connection attributes to reach `peer` on `peer_vm`, fast retries.
pub fn conn(peer: &Qp, peer_vm: &Vm) -> RcConnect {
    dp::fast(dp::conn(peer, peer_vm))
}

/// Connection attributes to reach QP number `qpn` on `peer_vm`, fast
/// retries.
pub fn conn_qpn(qpn: u32, peer_vm: &Vm) -> RcConnect {
    dp::fast(dp::conn_qpn(qpn, peer_vm))
}

/// Connects `qa` (on `a`) and `qb` (on `b`) to each other, fast retries.
pub fn connect(a: &Vm, qa: &Qp, b: &Vm, qb: &Qp) {
    dp::connect_with(a, qa, b, qb, dp::fast);
}

/// Creates and connects an RC pair between `a` and `b`, fast retries.
pub fn rc_pair(a: &Vm, b: &Vm) -> Pair {
    dp::rc_pair_with(a, b, dp::fast)
}

/// Asserts that an error completion carries none of the failed message's
/// fields: `byte_len`, `flags`, `imm_data` and `src_qpn` are 0 (spec
/// 18.14).
pub fn assert_no_message_fields(wc: &WorkCompletion, what: &str) {
    assert_eq!(
        (wc.byte_len, wc.flags, wc.imm_data, wc.src_qpn),
        (0, 0, 0, 0),
        "{what}: {wc:?}"
    );
}
