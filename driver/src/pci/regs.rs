//! Register views of the virtio-pci structures inside mapped BARs: the
//! common configuration (virtio 1.x layout), the ISR byte, the notification
//! area and the device configuration.

use super::sysfs::BarMap;

/// `device_status` bits.
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 64;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 128;
}

/// `queue_msix_vector` / `config_msix_vector` value for "no vector".
pub const NO_VECTOR: u16 = 0xffff;

/// Offsets in `struct virtio_pci_common_cfg`.
mod off {
    pub const DEVICE_FEATURE_SELECT: usize = 0;
    pub const DEVICE_FEATURE: usize = 4;
    pub const DRIVER_FEATURE_SELECT: usize = 8;
    pub const DRIVER_FEATURE: usize = 12;
    pub const CONFIG_MSIX_VECTOR: usize = 16;
    pub const NUM_QUEUES: usize = 18;
    pub const DEVICE_STATUS: usize = 20;
    pub const CONFIG_GENERATION: usize = 21;
    pub const QUEUE_SELECT: usize = 22;
    pub const QUEUE_SIZE: usize = 24;
    pub const QUEUE_MSIX_VECTOR: usize = 26;
    pub const QUEUE_ENABLE: usize = 28;
    pub const QUEUE_NOTIFY_OFF: usize = 30;
    pub const QUEUE_DESC: usize = 32;
    pub const QUEUE_DRIVER: usize = 40;
    pub const QUEUE_DEVICE: usize = 48;
    /// Size of the structure this driver uses.
    pub const END: u64 = 56;
}

/// A window of device memory accessed with volatile loads and stores.
#[derive(Debug, Clone, Copy)]
pub struct Mmio {
    base: *mut u8,
    len: usize,
}

// SAFETY: device registers are process-wide and accessed only with volatile
// operations of their natural width, which may happen from any thread.
unsafe impl Send for Mmio {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// The window `offset .. offset + len` of `bar`, if it lies inside the
    /// mapping and is 4-byte aligned.
    pub fn new(bar: &BarMap, offset: u64, len: u64) -> Option<Mmio> {
        let base = bar.at(offset, len, 4)?;
        Some(Mmio {
            base,
            len: usize::try_from(len).ok()?,
        })
    }

    fn ptr<T>(&self, at: usize) -> *mut T {
        // Callers use compile-time offsets inside the window checked at
        // construction, naturally aligned for `T`.
        debug_assert!(at + std::mem::size_of::<T>() <= self.len);
        debug_assert!(at % std::mem::size_of::<T>() == 0);
        // SAFETY: `at + size_of::<T>() <= len` (the callers' offsets are
        // within the structure size checked by `Mmio::new`), so the pointer
        // stays inside the mapped window.
        unsafe { self.base.add(at).cast::<T>() }
    }

    /// Reads the byte at `at`.
    pub fn read8(&self, at: usize) -> u8 {
        // SAFETY: see `ptr`; device memory is read with a volatile load.
        unsafe { self.ptr::<u8>(at).read_volatile() }
    }

    /// Reads the le16 at `at`.
    pub fn read16(&self, at: usize) -> u16 {
        // SAFETY: see `ptr`; aligned, inside the window.
        u16::from_le(unsafe { self.ptr::<u16>(at).read_volatile() })
    }

    /// Reads the le32 at `at`.
    pub fn read32(&self, at: usize) -> u32 {
        // SAFETY: see `ptr`; aligned, inside the window.
        u32::from_le(unsafe { self.ptr::<u32>(at).read_volatile() })
    }

    /// Writes the byte at `at`.
    pub fn write8(&self, at: usize, v: u8) {
        // SAFETY: see `ptr`; device memory is written with a volatile store.
        unsafe { self.ptr::<u8>(at).write_volatile(v) }
    }

    /// Writes the le16 at `at`.
    pub fn write16(&self, at: usize, v: u16) {
        // SAFETY: see `ptr`; aligned, inside the window.
        unsafe { self.ptr::<u16>(at).write_volatile(v.to_le()) }
    }

    /// Writes the le32 at `at`.
    pub fn write32(&self, at: usize, v: u32) {
        // SAFETY: see `ptr`; aligned, inside the window.
        unsafe { self.ptr::<u32>(at).write_volatile(v.to_le()) }
    }

    /// Writes a le64 as two 32-bit stores, low half first (the virtio spec
    /// lets drivers do that, and not every platform has 64-bit MMIO).
    pub fn write64(&self, at: usize, v: u64) {
        self.write32(at, v as u32);
        self.write32(at + 4, (v >> 32) as u32);
    }

    /// Length of the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The common configuration structure.
#[derive(Debug, Clone, Copy)]
pub struct CommonCfg(Mmio);

impl CommonCfg {
    /// The structure at `offset` of `bar`, if it fits.
    pub fn new(bar: &BarMap, offset: u64, len: u64) -> Option<CommonCfg> {
        if len < off::END {
            return None;
        }
        Mmio::new(bar, offset, off::END).map(CommonCfg)
    }

    /// The 64 device feature bits.
    pub fn device_features(&self) -> u64 {
        self.0.write32(off::DEVICE_FEATURE_SELECT, 0);
        let lo = self.0.read32(off::DEVICE_FEATURE);
        self.0.write32(off::DEVICE_FEATURE_SELECT, 1);
        let hi = self.0.read32(off::DEVICE_FEATURE);
        u64::from(hi) << 32 | u64::from(lo)
    }

    /// Writes the 64 driver feature bits.
    pub fn set_driver_features(&self, features: u64) {
        self.0.write32(off::DRIVER_FEATURE_SELECT, 0);
        self.0.write32(off::DRIVER_FEATURE, features as u32);
        self.0.write32(off::DRIVER_FEATURE_SELECT, 1);
        self.0.write32(off::DRIVER_FEATURE, (features >> 32) as u32);
    }

    /// `device_status`.
    pub fn status(&self) -> u8 {
        self.0.read8(off::DEVICE_STATUS)
    }

    /// Writes `device_status` (0 resets the device).
    pub fn set_status(&self, s: u8) {
        self.0.write8(off::DEVICE_STATUS, s);
    }

    /// `config_generation`.
    pub fn config_generation(&self) -> u8 {
        self.0.read8(off::CONFIG_GENERATION)
    }

    /// Routes configuration change interrupts to `vector`.
    pub fn set_config_vector(&self, vector: u16) {
        self.0.write16(off::CONFIG_MSIX_VECTOR, vector);
    }

    /// Number of virtqueues the device has.
    pub fn num_queues(&self) -> u16 {
        self.0.read16(off::NUM_QUEUES)
    }

    /// Selects the queue the `queue_*` registers refer to.
    pub fn select_queue(&self, q: u16) {
        self.0.write16(off::QUEUE_SELECT, q);
    }

    /// Maximum size of the selected queue (0: no such queue).
    pub fn queue_size(&self) -> u16 {
        self.0.read16(off::QUEUE_SIZE)
    }

    /// Sets the size of the selected queue.
    pub fn set_queue_size(&self, n: u16) {
        self.0.write16(off::QUEUE_SIZE, n);
    }

    /// Routes the selected queue's interrupts to `vector`.
    pub fn set_queue_vector(&self, vector: u16) {
        self.0.write16(off::QUEUE_MSIX_VECTOR, vector);
    }

    /// The selected queue's notification offset.
    pub fn queue_notify_off(&self) -> u16 {
        self.0.read16(off::QUEUE_NOTIFY_OFF)
    }

    /// Sets the guest-physical addresses of the selected queue's parts.
    pub fn set_queue_addrs(&self, desc: u64, driver: u64, device: u64) {
        self.0.write64(off::QUEUE_DESC, desc);
        self.0.write64(off::QUEUE_DRIVER, driver);
        self.0.write64(off::QUEUE_DEVICE, device);
    }

    /// Enables the selected queue.
    pub fn enable_queue(&self) {
        self.0.write16(off::QUEUE_ENABLE, 1);
    }
}
