//! Test VMM for vhost-user-rdma: an in-process vhost-user frontend with
//! memfd-backed guest RAM, driver-side virtqueues, control and event queue
//! clients, and a minimal echo backend used as a baseline.
//!
//! Typical use:
//! ```no_run
//! use vhost_user_rdma_tests::{echo, vmm::{TestVmm, VmmOptions}};
//! use virtio_rdma_abi::ctrl::Opcode;
//! let backend = echo::spawn("/tmp/echo.sock")?;
//! let mut vm = TestVmm::connect(backend.socket_path(), VmmOptions::default())?;
//! let c = vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0)?;
//! assert_eq!(c.resp_request_id, c.request_id);
//! # Ok::<(), vhost_user_rdma_tests::Error>(())
//! ```

pub mod attack;
pub mod bench;
pub mod cm_probe;
pub mod conn;
pub mod ctrl;
pub mod dirty_log;
mod dma_arena;
pub mod dp;
pub mod echo;
pub mod error;
pub mod events;
pub mod fast;
pub mod guest_mem;
pub mod harness;
pub mod rnics;
pub mod shmem;
pub mod state_transfer;
pub mod transport;
pub mod verbs;
pub mod vm_image;
pub mod vm_move;
pub mod vmm;
pub mod vring;

pub use error::{Error, Result};
