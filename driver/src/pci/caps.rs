//! The virtio vendor capabilities of a virtio-pci function's configuration
//! space (virtio 1.x, "Virtio Structure PCI Capabilities"): where in which
//! BAR the common configuration, notification area, ISR byte, device
//! configuration and shared memory regions are.
//!
//! Parsed from a copy of the configuration space, never trusted blindly: a
//! capability list that loops, points outside the space or is truncated is an
//! error, not a crash.

use std::fmt;

/// PCI capability ID of a vendor-specific capability (the virtio ones).
const CAP_ID_VENDOR: u8 = 0x09;
/// Offset of the capabilities pointer in the PCI header.
const CAP_POINTER: usize = 0x34;
/// Status register bit: the function has a capability list.
const STATUS_CAP_LIST: u16 = 1 << 4;
/// More entries than a 256-byte space can hold means the list loops.
const MAX_CAPS: usize = 48;

/// `cfg_type` values of `struct virtio_pci_cap`.
mod cfg_type {
    pub const COMMON: u8 = 1;
    pub const NOTIFY: u8 = 2;
    pub const ISR: u8 = 3;
    pub const DEVICE: u8 = 4;
    pub const SHARED_MEMORY: u8 = 8;
}

/// A window of a BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarWindow {
    /// BAR index, 0 to 5.
    pub bar: u8,
    /// Offset of the window within the BAR.
    pub offset: u64,
    /// Length of the window in bytes.
    pub length: u64,
}

/// A VIRTIO shared memory region (`VIRTIO_PCI_CAP_SHARED_MEMORY_CFG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmRegion {
    /// The region's ID (`shmid`).
    pub id: u8,
    /// Where it is.
    pub window: BarWindow,
}

/// The virtio structures of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtioCaps {
    /// Common configuration structure.
    pub common: BarWindow,
    /// Notification area.
    pub notify: BarWindow,
    /// Bytes between the notification addresses of consecutive
    /// `queue_notify_off` values.
    pub notify_off_multiplier: u32,
    /// The ISR status byte.
    pub isr: BarWindow,
    /// Device-specific configuration, if the device has one.
    pub device: Option<BarWindow>,
    /// Shared memory regions.
    pub shm: Vec<ShmRegion>,
}

/// Why a configuration space does not describe a usable virtio-pci function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapsError {
    /// The space is shorter than a PCI header.
    Short(usize),
    /// The function has no capability list.
    NoCapList,
    /// A capability pointer or structure lies outside the space.
    OutOfRange(usize),
    /// The capability list loops.
    Loop,
    /// A required structure is missing.
    Missing(&'static str),
}

impl fmt::Display for CapsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapsError::Short(n) => write!(f, "configuration space of {n} bytes is too short"),
            CapsError::NoCapList => f.write_str("no PCI capability list"),
            CapsError::OutOfRange(at) => {
                write!(
                    f,
                    "capability at {at:#x} lies outside the configuration space"
                )
            }
            CapsError::Loop => f.write_str("the capability list loops"),
            CapsError::Missing(what) => write!(f, "no virtio {what} capability"),
        }
    }
}

impl std::error::Error for CapsError {}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl VirtioCaps {
    /// Parses the virtio capabilities out of a copy of the configuration
    /// space (at least the 256-byte PCI-compatible part).
    pub fn parse(space: &[u8]) -> Result<VirtioCaps, CapsError> {
        if space.len() < 0x40 {
            return Err(CapsError::Short(space.len()));
        }
        if le16(space, 0x06) & STATUS_CAP_LIST == 0 {
            return Err(CapsError::NoCapList);
        }
        let mut common = None;
        let mut notify = None;
        let mut isr = None;
        let mut device = None;
        let mut shm = Vec::new();
        // The low two bits of capability pointers are reserved.
        let mut at = usize::from(space[CAP_POINTER] & !3);
        let mut seen = 0;
        while at != 0 {
            seen += 1;
            if seen > MAX_CAPS {
                return Err(CapsError::Loop);
            }
            if at < 0x40 || at + 2 > space.len() {
                return Err(CapsError::OutOfRange(at));
            }
            let next = usize::from(space[at + 1] & !3);
            if space[at] == CAP_ID_VENDOR {
                // struct virtio_pci_cap: vndr, next, len, cfg_type, bar, id,
                // padding[2], offset, length (16 bytes).
                if at + 16 > space.len() {
                    return Err(CapsError::OutOfRange(at));
                }
                let cap_len = usize::from(space[at + 2]);
                let kind = space[at + 3];
                let bar = space[at + 4];
                let id = space[at + 5];
                let mut window = BarWindow {
                    bar,
                    offset: u64::from(le32(space, at + 8)),
                    length: u64::from(le32(space, at + 12)),
                };
                let usable = bar <= 5;
                match kind {
                    cfg_type::COMMON if common.is_none() && usable => common = Some(window),
                    cfg_type::NOTIFY if notify.is_none() && usable => {
                        if cap_len < 20 || at + 20 > space.len() {
                            return Err(CapsError::OutOfRange(at));
                        }
                        notify = Some((window, le32(space, at + 16)));
                    }
                    cfg_type::ISR if isr.is_none() && usable => isr = Some(window),
                    cfg_type::DEVICE if device.is_none() && usable => device = Some(window),
                    cfg_type::SHARED_MEMORY if usable => {
                        // struct virtio_pci_cap64 adds offset_hi, length_hi.
                        if cap_len < 24 || at + 24 > space.len() {
                            return Err(CapsError::OutOfRange(at));
                        }
                        window.offset |= u64::from(le32(space, at + 16)) << 32;
                        window.length |= u64::from(le32(space, at + 20)) << 32;
                        shm.push(ShmRegion { id, window });
                    }
                    // Later duplicates, unknown types (PCI_CFG access, vendor
                    // data) and BAR indices the spec reserves are skipped, as
                    // the virtio spec asks of drivers.
                    _ => {}
                }
            }
            at = next;
        }
        let (notify, notify_off_multiplier) = notify.ok_or(CapsError::Missing("notify"))?;
        Ok(VirtioCaps {
            common: common.ok_or(CapsError::Missing("common configuration"))?,
            notify,
            notify_off_multiplier,
            isr: isr.ok_or(CapsError::Missing("ISR"))?,
            device,
            shm,
        })
    }

    /// Every BAR some structure lives in.
    pub fn bars(&self) -> impl Iterator<Item = u8> + '_ {
        [
            Some(self.common),
            Some(self.notify),
            Some(self.isr),
            self.device,
        ]
        .into_iter()
        .flatten()
        .chain(self.shm.iter().map(|s| s.window))
        .map(|w| w.bar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 256-byte space with the given capabilities chained from 0x40.
    fn space(caps: &[Vec<u8>]) -> Vec<u8> {
        let mut s = vec![0u8; 256];
        s[0x06] = STATUS_CAP_LIST as u8;
        let mut at = 0x40;
        s[CAP_POINTER] = at as u8;
        for (i, c) in caps.iter().enumerate() {
            s[at..at + c.len()].copy_from_slice(c);
            let next = if i + 1 == caps.len() { 0 } else { at + 24 };
            s[at + 1] = next as u8;
            at += 24;
        }
        s
    }

    fn cap(kind: u8, bar: u8, id: u8, offset: u32, length: u32, extra: &[u32]) -> Vec<u8> {
        let mut c = vec![
            CAP_ID_VENDOR,
            0,
            (16 + 4 * extra.len()) as u8,
            kind,
            bar,
            id,
            0,
            0,
        ];
        c.extend_from_slice(&offset.to_le_bytes());
        c.extend_from_slice(&length.to_le_bytes());
        for e in extra {
            c.extend_from_slice(&e.to_le_bytes());
        }
        c
    }

    fn qemu_like() -> Vec<Vec<u8>> {
        vec![
            vec![0x11, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0], // MSI-X, skipped
            cap(cfg_type::COMMON, 4, 0, 0, 0x1000, &[]),
            cap(cfg_type::ISR, 4, 0, 0x1000, 0x1000, &[]),
            cap(cfg_type::DEVICE, 4, 0, 0x2000, 0x1000, &[]),
            cap(cfg_type::NOTIFY, 4, 0, 0x3000, 0x1000, &[4]),
            cap(cfg_type::SHARED_MEMORY, 2, 0, 0, 0, &[0, 1]),
        ]
    }

    #[test]
    fn parses_the_structures_qemu_offers() {
        let caps = VirtioCaps::parse(&space(&qemu_like())).unwrap();
        assert_eq!(
            caps.common,
            BarWindow {
                bar: 4,
                offset: 0,
                length: 0x1000
            }
        );
        assert_eq!(caps.notify.offset, 0x3000);
        assert_eq!(caps.notify_off_multiplier, 4);
        assert_eq!(caps.isr.offset, 0x1000);
        assert_eq!(caps.device.unwrap().offset, 0x2000);
        assert_eq!(
            caps.shm,
            vec![ShmRegion {
                id: 0,
                window: BarWindow {
                    bar: 2,
                    offset: 0,
                    length: 1 << 32
                }
            }]
        );
        assert_eq!(caps.bars().collect::<Vec<_>>(), vec![4, 4, 4, 4, 2]);
    }

    #[test]
    fn rejects_broken_lists() {
        assert_eq!(VirtioCaps::parse(&[0; 16]), Err(CapsError::Short(16)));
        let mut s = space(&qemu_like());
        s[0x06] = 0;
        assert_eq!(VirtioCaps::parse(&s), Err(CapsError::NoCapList));
        // A loop: the last capability points back at the first.
        let mut s = space(&qemu_like());
        s[0x40 + 5 * 24 + 1] = 0x40;
        assert_eq!(VirtioCaps::parse(&s), Err(CapsError::Loop));
        // A pointer into the header or past the end.
        let mut s = space(&qemu_like());
        s[CAP_POINTER] = 0x10;
        assert_eq!(VirtioCaps::parse(&s), Err(CapsError::OutOfRange(0x10)));
        let mut s = space(&qemu_like());
        s[0x40 + 1] = 0xf8;
        s[0xf8] = CAP_ID_VENDOR;
        assert_eq!(VirtioCaps::parse(&s), Err(CapsError::OutOfRange(0xf8)));
        // A missing notify structure.
        let mut c = qemu_like();
        c.remove(4);
        assert_eq!(
            VirtioCaps::parse(&space(&c)),
            Err(CapsError::Missing("notify"))
        );
    }

    #[test]
    fn skips_reserved_bars_and_duplicates() {
        let mut c = qemu_like();
        c[0] = cap(cfg_type::COMMON, 7, 0, 0x9000, 0x10, &[]);
        c.push(cap(cfg_type::COMMON, 4, 0, 0x8000, 0x10, &[]));
        let caps = VirtioCaps::parse(&space(&c)).unwrap();
        assert_eq!(caps.common.offset, 0);
    }
}
