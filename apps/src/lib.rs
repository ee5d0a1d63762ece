//! Programs written against the reference guest driver
//! (`virtio-rdma-driver`), over any [`Transport`](virtio_rdma_driver::Transport):
//!
//! - [`cm_agent`]: a connection manager speaking IB CM over the VM's GSI
//!   QP (QP 1) as Linux's `rdma_cm` does on RoCE, over [`gsi_port`];
//! - [`rping`]: librdmacm's `rping` protocol over a [`cm_agent`]
//!   connection, interoperating with the unmodified tool;
//! - [`exchange`]: two peers connect RC queue pairs and move data by
//!   SEND/RECV, RDMA WRITE (with and without immediate), RDMA READ and
//!   atomics, checking every byte; the demo and the end-to-end test;
//! - [`hostile`]: a guest that feeds the device wrong addresses, keys and
//!   bounds, expects each to be refused, then keeps a transfer running
//!   until it is killed;
//! - [`oob`]: the out-of-band channel the peers exchange their addresses
//!   over (a serial cable between two QEMU guests, a TCP connection between
//!   machines, or an in-process channel);
//! - [`perf`]: perftest's RDMA WRITE latency (`ib_write_lat`) and
//!   bandwidth (`ib_write_bw`) measurements between two peers;
//! - [`pingpong`]: an RC ping-pong of SENDs that interoperates with
//!   rdma-core's unmodified `ibv_rc_pingpong` on the other side;
//! - [`ud`]: UD datagrams both ways between two peers, every one checked
//!   (GRH, source QP, length, bytes) at its receiver.
//!
//! The `rdma-guest` binary runs them in a real guest over the virtio-pci
//! transport; the tests crate runs the same functions over the test VMM
//! (its `rdma-peer` binary plays one VM of a daemon against a peer on
//! another machine).

pub mod cm_agent;
pub mod exchange;
pub mod gsi_port;
pub mod hostile;
pub mod oob;
pub mod pattern;
pub mod perf;
pub mod pingpong;
pub mod rping;
pub mod ud;

/// Errors of the programs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver reported an error.
    #[error("driver: {0}")]
    Driver(#[from] virtio_rdma_driver::Error),
    /// The out-of-band channel failed.
    #[error("out-of-band channel: {0}")]
    Oob(#[from] std::io::Error),
    /// The peer sent something unexpected.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A check failed: data, status or value not as expected.
    #[error("check failed: {0}")]
    Check(String),
    /// Something did not happen in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

/// Result of the programs.
pub type Result<T> = std::result::Result<T, Error>;
