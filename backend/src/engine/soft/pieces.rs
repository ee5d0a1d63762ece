//! Large messages in pieces: while another VM had work in a recent sweep,
//! an RC message from or into memory regions (WRITE, SEND, READ) larger
//! than what is left of a burst is executed in pieces of at least
//! [`PIECE`] bytes, so that other VMs' work runs between them; the
//! requester QP keeps the partly executed head WQE in `rt.partial`, a
//! receiving QP the receive WQE it took in `rt.inbound`, and both complete
//! after the last piece (docs/isolation.md, "Large messages in pieces").

/// The smallest piece of a plain RDMA WRITE executed in pieces (see
/// [`Scratch::split`]): another VM's work waits at most about one piece.
/// Chosen by measurement (`qos_bench lat`, see docs/isolation.md).
pub const PIECE: u64 = 8 << 10;

/// A VM's large messages are executed in pieces of its burst while another
/// VM had work in one of the last this many sweeps. While pieces run, a
/// sweep takes about a piece; an engine left with one VM returns to pieces
/// of [`ALONE_PIECE`] after this many sweeps.
pub(in crate::engine) const RECENT_SWEEPS: u64 = 256;

/// The piece of a VM that had the engine to itself lately: large, so that
/// the per-piece checks cost nothing measurable, yet bounded — a guest
/// must not be able to wait until the others pause for a moment and then
/// occupy the engine with a whole 2 GiB message.
pub const ALONE_PIECE: u64 = 256 << 10;
