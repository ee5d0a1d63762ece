//! Reference guest driver of the virtio-rdma device (virtio device ID 42):
//! a verbs-like userspace library over a [`Transport`].
//!
//! The control path (contexts, PDs, MRs, CQs, QPs, SRQs, AHs) goes through
//! the control queue as described in `docs/virtio-rdma-spec.md`. The data
//! path is shared memory: rings and doorbell records in DMA memory, as in
//! the data-path chapter (`virtio_rdma_abi::datapath`):
//!
//! - posting writes each WQE into its ring slot, then release-stores the
//!   producer index in the doorbell record and reads the device's `flags`:
//!   with `DB_FLAG_POLLING` it is done; otherwise it issues a full fence,
//!   reads `flags` again and notifies notifyq only if `DB_FLAG_KICK` is set;
//! - polling reads a CQE's `owner` (acquire), copies the CQE out, and
//!   release-stores the consumer index;
//! - arming writes `arm = seq << 2 | kind` with a new `seq`; the device
//!   answers with one `CQ_COMPLETION` event.
//!
//! Ownership: every object keeps what it depends on alive through `Arc`s
//! (an [`Mr`] its [`Pd`], a [`Qp`] its PD, CQs and SRQ, every object the
//! [`Device`] and thus the context), so drops happen in the order the device
//! requires, each sending its destroy command. When a destroy command fails
//! the object's DMA memory is leaked rather than freed, since the device may
//! still access it.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use virtio_rdma_driver::*;
//! # fn demo(transport: Arc<dyn Transport>) -> Result<()> {
//! use virtio_rdma_abi::mem::access;
//! let dev = Device::open(transport)?;
//! let pd = Pd::alloc(&dev)?;
//! let cq = Cq::create(&dev, 64)?;
//! let buf = Arc::new(dev.alloc_dma(4096, 4096)?);
//! let mr = Mr::register(&pd, buf, access::LOCAL_WRITE)?;
//! let qp = Qp::create(&pd, &QpInit::rc(&cq))?;
//! qp.rc_connect(0, &RcConnect::new(0x1234, [0; 16]))?;
//! let sge = [mr.sge(0, 64)?];
//! qp.post_send(&[SendWr::send(1, &sge)])?;
//! let mut wc = [WorkCompletion::default(); 16];
//! let n = cq.poll(&mut wc);
//! # let _ = n; Ok(()) }
//! ```

pub mod ah;
pub mod cq;
pub mod device;
pub mod dma;
mod doorbell;
pub mod error;
pub mod event;
pub mod fast_mr;
pub mod image;
pub mod mr;
pub mod mw;
mod page_list;
#[cfg(target_os = "linux")]
pub mod pci;
pub mod pd;
pub mod qp;
pub mod qp_attr;
mod ring;
pub mod srq;
pub mod transport;
pub mod wr;
pub mod xrc;

#[cfg(test)]
mod tests;

pub use ah::Ah;
pub use cq::Cq;
pub use device::{Device, DeviceOptions};
pub use dma::DmaBuf;
pub use error::{Error, Result};
pub use fast_mr::{FastMr, FastReg};
pub use mr::{Mr, MrPages};
pub use mw::{Mw, MwBind};
pub use pd::Pd;
pub use qp::{Qp, QpCap, QpInit, SendQueueState};
pub use qp_attr::{QpAttrs, RcConnect};
pub use srq::Srq;
pub use transport::{DmaRegion, SharedMemory, Token, Transport, TransportError};
pub use virtio_rdma_abi;
pub use virtio_rdma_abi::datapath::Sge;
pub use wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, UdDest, WorkCompletion};
pub use xrc::{XrcTgt, Xrcd};
