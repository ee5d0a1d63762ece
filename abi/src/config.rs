//! Feature bits, virtqueues and the device configuration layout.

use crate::wire_struct;

/// Feature bit: UD queue pairs and address handles are supported.
pub const F_UD: u64 = 1 << 0;
/// Feature bit: shared receive queues are supported.
pub const F_SRQ: u64 = 1 << 1;
/// Feature bit: 8-byte atomic operations are supported.
pub const F_ATOMIC: u64 = 1 << 2;
/// Feature bit: doorbell pages in a VIRTIO shared memory region
/// (data-path chapter).
pub const F_SHMEM_DOORBELL: u64 = 1 << 3;
/// Feature bit (ABI version 3): a GSI QP (QP 1) per instance and the MAD
/// path that connection management runs over.
pub const F_GSI: u64 = 1 << 4;
/// Feature bit (ABI version 3): the local DMA key, `ALLOC_MR`, and the
/// `REG_MR`, `LOCAL_INV` and `SEND_WITH_INV` work requests with remote
/// invalidation.
pub const F_MEM_MGT: u64 = 1 << 5;
/// Feature bit (ABI version 3): resizing — `RESIZE_CQ`, `MODIFY_SRQ` with
/// `SRQ_ATTR_MAX_WR` and a new ring, `REREG_MR`.
pub const F_RESIZE: u64 = 1 << 6;
/// Feature bit (ABI version 3): memory windows, type 1 and type 2
/// (`ALLOC_MW`, `DEALLOC_MW`, the `BIND_MW` work request; invalidation of
/// type 2 windows by `LOCAL_INV` and `SEND_WITH_INV` needs `F_MEM_MGT`).
pub const F_MW: u64 = 1 << 7;
/// Feature bit (ABI version 3): unreliable connected QPs (`qp_type` UC).
pub const F_UC: u64 = 1 << 8;
/// Feature bit (ABI version 3): extended reliable connected transport —
/// XRC domains (`OPEN_XRCD`, `CLOSE_XRCD`), XRC SRQs (`CREATE_XRC_SRQ`),
/// `qp_type` XRC_INI and XRC_TGT, and the send WQE's `xrc_srqn`; needs
/// `F_SRQ`.
pub const F_XRC: u64 = 1 << 9;
/// Feature bit (ABI version 3): UD multicast within the tenant
/// (`ATTACH_MCAST`, `DETACH_MCAST`, sends to `MCAST_QPN`; needs `F_UD`).
pub const F_MCAST: u64 = 1 << 10;

/// All device-specific feature bits this ABI version defines.
pub const ALL_DEVICE_FEATURES: u64 = F_UD
    | F_SRQ
    | F_ATOMIC
    | F_SHMEM_DOORBELL
    | F_GSI
    | F_MEM_MGT
    | F_RESIZE
    | F_MW
    | F_UC
    | F_XRC
    | F_MCAST;

/// The device-specific feature bits ABI version 2 defines: all a device
/// that reports version 2 may offer.
pub const V2_DEVICE_FEATURES: u64 = F_UD | F_SRQ | F_ATOMIC | F_SHMEM_DOORBELL;

/// Virtqueue index of the control queue.
pub const CONTROLQ: u16 = 0;
/// Virtqueue index of the event queue.
pub const EVENTQ: u16 = 1;
/// Virtqueue index of the doorbell notification queue (data-path chapter).
pub const NOTIFYQ: u16 = 2;
/// Number of virtqueues the device has.
pub const NUM_QUEUES: usize = 3;

wire_struct! {
    /// Device configuration space (read-only for the driver).
    ///
    /// The limit fields are the per-VM quotas and capabilities in force for
    /// this device instance; every create command is checked against them.
    pub struct DeviceConfig {
        /// ABI version, [`crate::ABI_VERSION`].
        abi_version: u32,
        /// Maximum number of live contexts.
        max_ctx: u32,
        /// Maximum number of live protection domains.
        max_pd: u32,
        /// Maximum number of live completion queues.
        max_cq: u32,
        /// Maximum number of live queue pairs.
        max_qp: u32,
        /// Maximum number of live memory regions.
        max_mr: u32,
        /// Maximum number of live shared receive queues.
        max_srq: u32,
        /// Maximum number of live address handles.
        max_ah: u32,
        /// Maximum CQ depth (entries).
        max_cqe: u32,
        /// Maximum send or receive queue depth (work requests).
        max_qp_wr: u32,
        /// Maximum SRQ depth (work requests).
        max_srq_wr: u32,
        /// Maximum scatter/gather entries per send work request.
        max_send_sge: u32,
        /// Maximum scatter/gather entries per receive work request.
        max_recv_sge: u32,
        /// Maximum inline data bytes per send work request.
        max_inline_data: u32,
        /// Maximum entries of an inline page list.
        max_inline_pages: u32,
        /// Maximum outstanding RDMA READ / atomic operations per QP.
        max_qp_rd_atom: u32,
        /// Maximum length in bytes of one memory region.
        max_mr_size: u64,
        /// Maximum bytes registered by all memory regions of this VM together.
        max_mr_bytes: u64,
        /// Supported page sizes: bit n set means 2^n-byte pages may be used.
        page_size_cap: u64,
        /// MAC address of the guest network interface the port is paired
        /// with (spec appendix A), in transmission order; all zero when the
        /// operator configured none.
        mac: [u8; 6],
        /// Zero.
        reserved: u16,
    }
}

impl DeviceConfig {
    /// The MAC address of the paired guest interface; `None` when the
    /// device reports none (all zero).
    pub fn paired_mac(&self) -> Option<[u8; 6]> {
        (self.mac != [0; 6]).then_some(self.mac)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::wire::Wire;

    /// The MAC is appended at the end, byte 0 first, after every field of
    /// ABI version 1, and the structure stays a multiple of 8 bytes.
    #[test]
    fn mac_is_stored_in_transmission_order_at_the_end() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let cfg = DeviceConfig {
            page_size_cap: 1 << 12,
            mac,
            ..DeviceConfig::default()
        };
        let bytes = cfg.to_bytes();
        assert_eq!(bytes.len(), 96);
        assert_eq!(&bytes[80..88], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[88..94], &mac);
        assert_eq!(&bytes[94..], &[0, 0]);
        assert_eq!(
            DeviceConfig::parse(&bytes).map(|c| c.paired_mac()),
            Ok(Some(mac))
        );
        assert_eq!(DeviceConfig::default().paired_mac(), None);
        let mut bad = bytes;
        bad[95] = 1;
        assert!(DeviceConfig::parse(&bad).is_err(), "reserved must be zero");
    }
}
