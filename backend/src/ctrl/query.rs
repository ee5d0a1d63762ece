//! QUERY_DEVICE, QUERY_PORT, QUERY_GID.

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::Wire;

use super::parse::{field, fixed};
use super::CmdResult;
use crate::vm::VmState;

/// Firmware version reported: the crate version, major.minor.patch in
/// 16-bit fields.
fn fw_version() -> u64 {
    let part = |s: &str| s.parse::<u64>().unwrap_or(0) & 0xffff;
    (part(env!("CARGO_PKG_VERSION_MAJOR")) << 32)
        | (part(env!("CARGO_PKG_VERSION_MINOR")) << 16)
        | part(env!("CARGO_PKG_VERSION_PATCH"))
}

/// `vendor_id`: the PCI vendor ID of virtio devices (spec 12.1). rdma-core
/// treats 0 as no device.
const VENDOR_ID: u32 = 0x1af4;
/// `vendor_part_id`: the virtio device type of the RDMA device.
const VENDOR_PART_ID: u32 = 42;
/// Largest `local_ca_ack_delay` (a 5-bit exponent).
const MAX_ACK_DELAY: u32 = 31;

impl VmState {
    pub(super) fn query_device(&mut self, payload: &[u8]) -> CmdResult {
        if !payload.is_empty() {
            return Err(super::CmdError::new(Status::INVALID, 0));
        }
        let caps = self.rnic.caps();
        let (local_dma_lkey, max_fast_reg_pages) = self.fast_reg_attr();
        Ok(DeviceAttr {
            fw_version: fw_version(),
            node_guid: self.port.guid,
            sys_image_guid: self.port.guid,
            vendor_id: VENDOR_ID,
            vendor_part_id: VENDOR_PART_ID,
            hw_version: 1,
            phys_port_cnt: 1,
            atomic_caps: u32::from(caps.atomics && self.has(virtio_rdma_abi::config::F_ATOMIC)),
            local_ca_ack_delay: caps.local_ca_ack_delay.min(MAX_ACK_DELAY),
            local_dma_lkey,
            max_fast_reg_pages,
            // The limits, as in the device configuration.
            ..self.limits.device_attr()
        }
        .to_bytes())
    }

    pub(super) fn query_port(&mut self, payload: &[u8]) -> CmdResult {
        let req: QueryPortReq = fixed(payload)?;
        if req.port != PORT_NUM {
            return Err(field::<QueryPortReq>(Status::RANGE, "port"));
        }
        let caps = self.rnic.caps();
        // The software RNIC's port is always up, a host RNIC's follows the
        // host port (appendix A); speed and width follow the link rate
        // (spec 12.2).
        let (active_speed, active_width) = port_speed_width(caps.link_rate_mbps);
        let up = self.rnic.port_active();
        Ok(PortAttr {
            state: if up {
                PORT_STATE_ACTIVE
            } else {
                PORT_STATE_DOWN
            },
            max_mtu: caps.max_mtu,
            active_mtu: caps.max_mtu,
            gid_tbl_len: self.port.gids.len(),
            pkey_tbl_len: 1,
            max_msg_size: caps.max_msg_size,
            link_rate_mbps: caps.link_rate_mbps,
            max_ud_payload: caps.max_ud_payload(),
            phys_state: if up {
                PHYS_STATE_LINK_UP
            } else {
                PHYS_STATE_DISABLED
            },
            active_speed,
            active_width,
        }
        .to_bytes())
    }

    pub(super) fn query_gid(&mut self, payload: &[u8]) -> CmdResult {
        let req: QueryGidReq = fixed(payload)?;
        if req.port != PORT_NUM {
            return Err(field::<QueryGidReq>(Status::RANGE, "port"));
        }
        // Entry `index`; an unassigned one reads as zero (appendix A).
        let Some(gid) = self.port.gids.get(req.index) else {
            return Err(field::<QueryGidReq>(Status::RANGE, "index"));
        };
        Ok(QueryGidResp {
            gid,
            gid_type: GID_TYPE_ROCE_V2,
            reserved: 0,
        }
        .to_bytes())
    }
}
