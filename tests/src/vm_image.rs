//! A test VM that moves to another host: everything it is outside the
//! daemon — its guest RAM, its VMM's queues, its driver's objects — in one
//! image, written to a stream on the source host and read on the
//! destination, where the VM goes on over a copy of its RAM on another
//! daemon (spec 20.8).
//!
//! A QEMU guest's driver state is in its RAM and moves with it; the test
//! VMM's driver lives in a host process, so its objects travel as images
//! ([`virtio_rdma_driver::image`]). The device's side is the state the
//! source daemon saved (`SET_DEVICE_STATE_FD`), carried in the image and
//! loaded into the destination's device before its queues start.
//!
//! The stream: the line `vhost-user-rdma VM image 1`, the JSON header's
//! length (8 bytes, little endian) and the header, then the device state
//! and the contents of every allocated RAM range, in the header's order.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_rdma_driver::image::{CqImage, DeviceImage, MrImage, PdImage, QpImage, RegionImage};
use virtio_rdma_driver::{Cq, Device, DeviceOptions, DmaBuf, Mr, Pd, Qp};
use vm_memory::GuestAddress;

use crate::dp::{Buf, Vm};
use crate::error::{Error, Result};
use crate::guest_mem::GuestMem;
use crate::state_transfer::load;
use crate::transport::VmmTransport;
use crate::vmm::{TestVmm, VmmImage, VmmOptions};

const MAGIC: &[u8] = b"vhost-user-rdma VM image 1\n";
/// Largest header accepted (a VM of the tests has a few objects).
const MAX_HEADER: u64 = 64 << 20;
/// Largest device state or RAM range accepted.
const MAX_SECTION: u64 = 1 << 30;

/// A QP's image and the CQs it completes into (indices into
/// [`VmImage::cqs`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QpEntry {
    /// The QP.
    pub qp: QpImage,
    /// Its send CQ.
    pub send_cq: usize,
    /// Its receive CQ.
    pub recv_cq: usize,
}

/// A moving VM: its VMM, its driver's objects, the device state the
/// source saved, and the contents of its guest RAM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmImage {
    /// The VMM: the guest RAM's layout and allocator, the queues.
    pub vmm: VmmImage,
    /// Where each queue stopped (`GET_VRING_BASE`).
    pub bases: Vec<u32>,
    /// The driver's device handle.
    pub device: DeviceImage,
    /// Its protection domain.
    pub pd: PdImage,
    /// Its CQs.
    pub cqs: Vec<CqImage>,
    /// Its QPs.
    pub qps: Vec<QpEntry>,
    /// Its registered buffers (in the PD).
    pub bufs: Vec<(RegionImage, MrImage)>,
    /// What the application that moves wants to find again.
    pub app: serde_json::Value,
    /// The device state the source saved.
    #[serde(skip)]
    pub state: Vec<u8>,
    /// The contents of every allocated RAM range (`vmm.mem.allocated`).
    #[serde(skip)]
    pub ram: Vec<Vec<u8>>,
}

/// What a moved VM is on its destination.
pub struct MovedVm {
    /// The VM: its transport, device handle and PD.
    pub vm: Vm,
    /// Its CQs, in the image's order.
    pub cqs: Vec<Arc<Cq>>,
    /// Its QPs.
    pub qps: Vec<Qp>,
    /// Its registered buffers.
    pub bufs: Vec<Buf>,
}

fn arc_index(cqs: &[&Arc<Cq>], cq: &Arc<Cq>) -> Result<usize> {
    cqs.iter()
        .position(|c| Arc::ptr_eq(c, cq))
        .ok_or_else(|| Error::Backend("a QP completes into a CQ the image lacks".into()))
}

fn driver(what: &str, e: virtio_rdma_driver::Error) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

impl VmImage {
    /// The image of `vm`, stopped by [`TestVmm::stop_queues`] (which
    /// returned `bases`) and saved (`state`): its CQs, QPs and buffers as
    /// listed, `app` for the application.
    pub fn capture(
        vm: &Vm,
        bases: Vec<u32>,
        state: Vec<u8>,
        cqs: &[&Arc<Cq>],
        qps: &[&Qp],
        bufs: &[&Buf],
        app: serde_json::Value,
    ) -> Result<VmImage> {
        let vmm = vm.t.vmm().image()?;
        let ram = vmm
            .mem
            .allocated
            .iter()
            .map(|&(gpa, len)| {
                let len = usize::try_from(len)
                    .map_err(|_| Error::Backend(format!("RAM range of {len:#x} bytes")))?;
                vm.t.mem().read_vec(GuestAddress(gpa), len)
            })
            .collect::<Result<Vec<_>>>()?;
        let qps = qps
            .iter()
            .map(|q| {
                Ok(QpEntry {
                    qp: q.image().map_err(|e| driver("QP image", e))?,
                    send_cq: arc_index(cqs, q.send_cq())?,
                    recv_cq: arc_index(cqs, q.recv_cq())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(VmImage {
            vmm,
            bases,
            device: vm.dev.image().map_err(|e| driver("device image", e))?,
            pd: vm.pd.image(),
            cqs: cqs
                .iter()
                .map(|c| c.image().map_err(|e| driver("CQ image", e)))
                .collect::<Result<_>>()?,
            qps,
            bufs: bufs.iter().map(|b| (b.buf.image(), b.mr.image())).collect(),
            app,
            state,
            ram,
        })
    }

    /// Writes the image (see the module documentation).
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        let header = serde_json::to_vec(self)
            .map_err(|e| Error::Backend(format!("VM image header: {e}")))?;
        let io = |e| Error::io("writing a VM image", e);
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(&header).map_err(io)?;
        w.write_all(&(self.state.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(&self.state).map_err(io)?;
        for range in &self.ram {
            w.write_all(range).map_err(io)?;
        }
        w.flush().map_err(io)
    }

    /// Reads an image [`VmImage::write_to`] wrote; what it names is
    /// checked when it is restored.
    pub fn read_from(r: &mut impl Read) -> Result<VmImage> {
        let io = |e| Error::io("reading a VM image", e);
        let mut magic = vec![0u8; MAGIC.len()];
        r.read_exact(&mut magic).map_err(io)?;
        if magic != MAGIC {
            return Err(Error::Backend("not a VM image".into()));
        }
        let mut section = |limit: u64, what: &str| -> Result<Vec<u8>> {
            let mut len = [0u8; 8];
            r.read_exact(&mut len).map_err(io)?;
            let len = u64::from_le_bytes(len);
            if len > limit {
                return Err(Error::Backend(format!(
                    "a VM image's {what} of {len} bytes"
                )));
            }
            let mut buf = vec![0u8; len as usize];
            r.read_exact(&mut buf).map_err(io)?;
            Ok(buf)
        };
        let header = section(MAX_HEADER, "header")?;
        let state = section(MAX_SECTION, "device state")?;
        let mut image: VmImage = serde_json::from_slice(&header)
            .map_err(|e| Error::Backend(format!("VM image header: {e}")))?;
        image.state = state;
        let mut total = 0u64;
        for &(gpa, len) in &image.vmm.mem.allocated {
            total = total.saturating_add(len);
            if len > MAX_SECTION || total > MAX_SECTION {
                return Err(Error::Backend(format!(
                    "a VM image's RAM range {gpa:#x}+{len:#x}"
                )));
            }
            let mut buf = vec![0u8; len as usize];
            r.read_exact(&mut buf).map_err(io)?;
            image.ram.push(buf);
        }
        Ok(image)
    }

    /// Brings the VM up at `socket` (its destination device): new guest
    /// RAM with the image's contents, a VMM that connects, loads the
    /// device state (refused: an error) and starts the queues where they
    /// stopped, then the driver's objects over it. Nothing is created:
    /// the objects are the ones the device state carried.
    pub fn move_in(&self, socket: &Path, opts: VmmOptions) -> Result<MovedVm> {
        let mem = Arc::new(GuestMem::restore(&self.vmm.mem)?);
        if self.ram.len() != self.vmm.mem.allocated.len() {
            return Err(Error::Backend("a VM image without its RAM".into()));
        }
        for (&(gpa, _), bytes) in self.vmm.mem.allocated.iter().zip(&self.ram) {
            mem.write(GuestAddress(gpa), bytes)?;
        }
        let mut vmm = TestVmm::restore(mem, &self.vmm, opts)?;
        vmm.move_to_via(socket, &self.bases, |conn| {
            if load(conn, &self.state)? {
                Ok(())
            } else {
                Err(Error::Backend(
                    "the destination refused the device state".into(),
                ))
            }
        })?;
        let t = VmmTransport::new(vmm).map_err(|e| Error::io("transport", e))?;
        let dev = Device::restore(t.clone(), &self.device, DeviceOptions::default())
            .map_err(|e| driver("device", e))?;
        let pd = Pd::restore(&dev, &self.pd);
        let cqs = self
            .cqs
            .iter()
            .map(|c| Cq::restore(&dev, c).map_err(|e| driver("CQ", e)))
            .collect::<Result<Vec<_>>>()?;
        let cq = |i: usize| {
            cqs.get(i)
                .ok_or_else(|| Error::Backend(format!("a QP on CQ {i} of {}", cqs.len())))
        };
        let qps = self
            .qps
            .iter()
            .map(|e| {
                Qp::restore(&pd, cq(e.send_cq)?, cq(e.recv_cq)?, &e.qp).map_err(|e| driver("QP", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let bufs = self
            .bufs
            .iter()
            .map(|(region, mr)| {
                let buf = Arc::new(DmaBuf::adopt(&*t, region).map_err(|e| driver("buffer", e))?);
                let mr = Mr::restore(&pd, Some(buf.clone()), mr).map_err(|e| driver("MR", e))?;
                Ok(Buf { buf, mr })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MovedVm {
            vm: Vm { t, dev, pd },
            cqs,
            qps,
            bufs,
        })
    }
}
