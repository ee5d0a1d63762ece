//! Opening a host RDMA device through libibverbs and reading what it offers:
//! the device, one port, one GID (the source address of everything the
//! daemon sends through it).

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::ptr::NonNull;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device_attr, ibv_free_device_list,
    ibv_get_device_list, ibv_get_device_name, ibv_gid, ibv_open_device, ibv_port_attr,
    ibv_query_device, ibv_query_gid,
};
use thiserror::Error;

use crate::rnic_objects::{Caps, PortGids};

/// Why a host RDMA device cannot be used.
#[derive(Debug, Error)]
pub enum VerbsError {
    /// The kernel has no RDMA support (`ibv_get_device_list` fails, with
    /// `ENOSYS` when there is no RDMA subsystem at all).
    #[error(
        "this host has no RDMA support ({0}): load an RDMA driver (without hardware, Linux \
         soft-RoCE: `modprobe rdma_rxe` and `rdma link add rxe0 type rxe netdev IFACE`), \
         or use the built-in software RNIC (--rnic soft)"
    )]
    NoRdma(#[source] io::Error),
    /// RDMA is there, but no device.
    #[error(
        "this host has no RDMA device (without hardware: `rdma link add rxe0 type rxe netdev \
         IFACE`), or use the built-in software RNIC (--rnic soft)"
    )]
    NoDevices,
    /// No device of that name.
    #[error("no RDMA device {name:?} (this host has: {available})")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The devices there are.
        available: String,
    },
    /// The device could not be opened.
    #[error("cannot open RDMA device {name}: {source}")]
    Open {
        /// The device.
        name: String,
        /// Why.
        source: io::Error,
    },
    /// A query of the device failed.
    #[error("RDMA device {name}: {what} failed: {source}")]
    Query {
        /// The device.
        name: String,
        /// Which query.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// The device has no such port.
    #[error("RDMA device {name} has no port {port} (ports 1 to {ports})")]
    NoPort {
        /// The device.
        name: String,
        /// The port asked for.
        port: u8,
        /// Its ports.
        ports: u8,
    },
    /// The port has no GID at that index.
    #[error("RDMA device {name} port {port} has no GID at index {index}")]
    NoGid {
        /// The device.
        name: String,
        /// The port.
        port: u8,
        /// The index asked for.
        index: u32,
    },
}

/// An open host RDMA device, one of its ports and one GID of that port.
pub struct VerbsDevice {
    ctx: NonNull<ibv_context>,
    name: String,
    port: u8,
    gid_index: u32,
    gid: [u8; 16],
    attr: ibv_device_attr,
    port_attr: ibv_port_attr,
}

// SAFETY: libibverbs contexts are thread-safe (every verb may be called
// from any thread, the library locks what it shares); the attributes are
// plain data read once.
unsafe impl Send for VerbsDevice {}
// SAFETY: as above.
unsafe impl Sync for VerbsDevice {}

impl fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .finish_non_exhaustive()
    }
}

/// The devices libibverbs lists, freed when dropped.
struct DeviceList {
    list: NonNull<*mut rdma_sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList, VerbsError> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-parameter; the list is freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(list) else {
            return Err(VerbsError::NoRdma(io::Error::last_os_error()));
        };
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// The devices with their names.
    fn devices(&self) -> impl Iterator<Item = (*mut rdma_sys::ibv_device, String)> + '_ {
        (0..self.len).filter_map(|i| {
            // SAFETY: the list holds `len` device pointers.
            let dev = unsafe { *self.list.as_ptr().add(i) };
            if dev.is_null() {
                return None;
            }
            // SAFETY: `dev` is a device of the list; its name is a
            // NUL-terminated string that lives as long as the list.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
            Some((dev, name.to_string_lossy().into_owned()))
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once;
        // opened contexts stay valid after it is freed.
        unsafe { ibv_free_device_list(self.list.as_ptr()) }
    }
}

impl VerbsDevice {
    /// Opens device `name` (the first one if `None`) and reads port
    /// `port` and its GID at `gid_index`.
    pub fn open(name: Option<&str>, port: u8, gid_index: u32) -> Result<VerbsDevice, VerbsError> {
        let list = DeviceList::get()?;
        let mut devices = list.devices();
        let found = match name {
            None => devices.next(),
            Some(want) => devices.find(|(_, n)| n == want),
        };
        let Some((dev, name)) = found else {
            let available: Vec<String> = list.devices().map(|(_, n)| n).collect();
            return Err(match name {
                Some(n) if !available.is_empty() => VerbsError::NotFound {
                    name: n.into(),
                    available: available.join(", "),
                },
                _ => VerbsError::NoDevices,
            });
        };
        // SAFETY: `dev` is a device of the live list.
        let ctx =
            NonNull::new(unsafe { ibv_open_device(dev) }).ok_or_else(|| VerbsError::Open {
                name: name.clone(),
                source: io::Error::last_os_error(),
            })?;
        let query = |what, rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(VerbsError::Query {
                    name: name.clone(),
                    what,
                    // Verbs return the errno (some set errno instead).
                    source: if rc > 0 {
                        io::Error::from_raw_os_error(rc)
                    } else {
                        io::Error::last_os_error()
                    },
                })
            }
        };
        let mut device = VerbsDevice {
            ctx,
            name: name.clone(),
            port,
            gid_index,
            gid: [0; 16],
            // SAFETY: plain C structures for which all-zero is valid.
            attr: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            port_attr: unsafe { std::mem::zeroed() },
        };
        // From here `device` closes the context when an error returns.
        // SAFETY: a live context and an attribute structure to fill.
        query("ibv_query_device", unsafe {
            ibv_query_device(ctx.as_ptr(), &mut device.attr)
        })?;
        if port == 0 || port > device.attr.phys_port_cnt {
            return Err(VerbsError::NoPort {
                name,
                port,
                ports: device.attr.phys_port_cnt,
            });
        }
        // SAFETY: a live context, an existing port and a structure to fill.
        query("ibv_query_port", unsafe {
            ___ibv_query_port(ctx.as_ptr(), port, &mut device.port_attr)
        })?;
        let index = libc::c_int::try_from(gid_index).unwrap_or(libc::c_int::MAX);
        if gid_index >= u32::try_from(device.port_attr.gid_tbl_len).unwrap_or(0) {
            return Err(VerbsError::NoGid {
                name,
                port,
                index: gid_index,
            });
        }
        // SAFETY: plain C union for which all-zero is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: a live context, port and index within the table.
        query("ibv_query_gid", unsafe {
            ibv_query_gid(ctx.as_ptr(), port, index, &mut gid)
        })?;
        // SAFETY: every 16-byte pattern is a valid `raw` view of the union.
        device.gid = unsafe { gid.raw };
        if device.gid == [0; 16] {
            return Err(VerbsError::NoGid {
                name,
                port,
                index: gid_index,
            });
        }
        Ok(device)
    }

    /// The open context, for verbs.
    pub fn context(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// The error of a step of setting the device up (`what` failed).
    pub fn error(&self, what: &'static str, source: io::Error) -> VerbsError {
        VerbsError::Query {
            name: self.name.clone(),
            what,
            source,
        }
    }

    /// The most entries of one CQ.
    pub fn max_cqe(&self) -> u32 {
        u32::try_from(self.attr.max_cqe).unwrap_or(0)
    }

    /// What the device can hold at most of each kind of object
    /// ([`super::quota::Kind::ALL`] order; `ibv_query_device`).
    pub fn capacity(&self) -> super::quota::Capacity {
        let a = &self.attr;
        [a.max_qp, a.max_cq, a.max_mr, a.max_pd, a.max_ah, a.max_srq]
            .map(|n| u64::try_from(n).unwrap_or(0))
    }

    /// The device's name (`rxe0`, `mlx5_0`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port in use.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID in use and its index.
    pub fn gid(&self) -> ([u8; 16], u32) {
        (self.gid, self.gid_index)
    }

    /// Whether the port is active (`IBV_PORT_ACTIVE`).
    pub fn port_active(&self) -> bool {
        self.port_attr.state == rdma_sys::ibv_port_state::IBV_PORT_ACTIVE
    }

    /// The firmware version the device reports.
    pub fn fw_ver(&self) -> String {
        let bytes: Vec<u8> = self
            .attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c.to_ne_bytes()[0])
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// What the device offers, as the daemon advertises it to guests.
    pub fn caps(&self) -> Caps {
        Caps {
            // What the link carries now (the netdev's MTU for RoCE), not
            // what the port could: a guest's path MTU is checked against it.
            max_mtu: self.port_attr.active_mtu,
            link_rate_mbps: link_rate_mbps(
                self.port_attr.active_speed,
                self.port_attr.active_width,
            ),
            atomics: self.attr.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            max_msg_size: self.port_attr.max_msg_sz,
            local_ca_ack_delay: u32::from(self.attr.local_ca_ack_delay),
            // No fast registration through a host NIC yet (spec appendix D).
            max_fast_reg_pages: 0,
            windows: false,
            uc: true,
            mcast: false,
            // XRC needs host XRC SRQs and TGT QPs bound to the guest's;
            // not built (spec appendix D).
            xrc: false,
            // Not built over host CQs, SRQs and regions yet (spec
            // appendix D).
            resize: false,
            // Everything leaves from the host port's GID; the host's QP 1
            // is its own: a guest's GSI QP needs the CM bridge, which
            // `VerbsRnic::enable_cm` opens (spec appendix D).
            gids: PortGids::Host,
            gsi: false,
            // The host NIC writes guest RAM by DMA (spec 20.4).
            dirty_log: false,
        }
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // SAFETY: the context was opened by `open` and is closed once.
        unsafe {
            ibv_close_device(self.ctx.as_ptr());
        }
    }
}

/// The link rate of `speed` (an `IBV_SPEED_*` code, per lane) and `width`
/// (an `IBV_WIDTH_*` code) in Mbit/s; 0 for codes it does not know.
pub fn link_rate_mbps(speed: u8, width: u8) -> u32 {
    let lane: u32 = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 0,
    };
    let lanes: u32 = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    lane.saturating_mul(lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IB speed and width codes (verbs.h `IBV_SPEED_*`, `IBV_WIDTH_*`).
    #[test]
    fn link_rates_follow_the_speed_and_width_codes() {
        assert_eq!(link_rate_mbps(1, 1), 2_500, "SDR 1x");
        assert_eq!(link_rate_mbps(32, 2), 100_000, "EDR 4x");
        assert_eq!(link_rate_mbps(64, 16), 100_000, "HDR 2x");
        assert_eq!(link_rate_mbps(128, 8), 1_200_000, "NDR 12x");
        assert_eq!(link_rate_mbps(3, 1), 0, "unknown speed");
        assert_eq!(link_rate_mbps(1, 3), 0, "unknown width");
    }

    /// On a host without RDMA devices (this machine, CI's) opening fails
    /// with one of the two errors that say so, and the message names the
    /// way out.
    #[test]
    fn a_host_without_rdma_gets_a_clear_error() {
        // A host with RDMA opens a device: nothing to check here
        // (qemu-rxe.sh checks that case).
        if let Err(e @ (VerbsError::NoRdma(_) | VerbsError::NoDevices)) =
            VerbsDevice::open(None, 1, 0)
        {
            assert!(e.to_string().contains("--rnic soft"), "{e}");
        }
    }
}
