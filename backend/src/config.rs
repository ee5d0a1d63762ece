//! Daemon configuration: the sockets to serve and the per-VM limits.

use std::path::PathBuf;

use thiserror::Error;
use virtio_rdma_abi::config::{DeviceConfig, ALL_DEVICE_FEATURES};
use virtio_rdma_abi::mem::{send_wqe_shift, MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};
use virtio_rdma_abi::ABI_VERSION;

use crate::resources::handle::MAX_SLOTS;

/// A configuration value that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No socket path was given.
    #[error("at least one --socket-path is required")]
    NoSockets,
    /// The same socket path was given twice.
    #[error("socket path {0} is given more than once")]
    DuplicateSocket(PathBuf),
    /// A limit is out of its allowed range.
    #[error("{name} = {value} is out of range ({min}..={max})")]
    LimitOutOfRange {
        /// Name of the limit.
        name: &'static str,
        /// Value given.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// Device feature bits this implementation cannot offer.
    #[error("device feature bits {0:#x} are not implemented")]
    UnsupportedFeatures(u64),
    /// A send queue of the largest depth and stride would not fit the
    /// 32-bit ring offsets of the ABI.
    #[error("max-qp-wr {depth} with {stride}-byte send WQEs needs more than 2 GiB of ring")]
    RingTooLarge {
        /// `max_qp_wr`.
        depth: u32,
        /// Send WQE stride from `max_send_sge` and `max_inline_data`.
        stride: u64,
    },
    /// A limit that must be a power of two is not.
    #[error("{name} = {value} must be a power of two")]
    NotPowerOfTwo {
        /// Name of the limit.
        name: &'static str,
        /// Value given.
        value: u64,
    },
}

/// Per-VM limits, advertised in the device configuration and enforced on
/// every create command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Live contexts.
    pub max_ctx: u32,
    /// Live protection domains.
    pub max_pd: u32,
    /// Live completion queues.
    pub max_cq: u32,
    /// Live queue pairs.
    pub max_qp: u32,
    /// Live memory regions.
    pub max_mr: u32,
    /// Live shared receive queues.
    pub max_srq: u32,
    /// Live address handles.
    pub max_ah: u32,
    /// CQ depth.
    pub max_cqe: u32,
    /// Send/receive queue depth.
    pub max_qp_wr: u32,
    /// SRQ depth.
    pub max_srq_wr: u32,
    /// SGEs per send WQE.
    pub max_send_sge: u32,
    /// SGEs per receive WQE.
    pub max_recv_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline_data: u32,
    /// Entries of an inline page list.
    pub max_inline_pages: u32,
    /// Outstanding RDMA READ/atomic per QP.
    pub max_qp_rd_atom: u32,
    /// Bytes of one MR.
    pub max_mr_size: u64,
    /// Registered bytes of all MRs of the VM.
    pub max_mr_bytes: u64,
    /// Allowed page sizes (bit n = 2^n bytes).
    pub page_size_cap: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_ctx: 64,
            max_pd: 1024,
            max_cq: 16384,
            max_qp: 16384,
            max_mr: 16384,
            max_srq: 1024,
            max_ah: 16384,
            max_cqe: 65536,
            max_qp_wr: 16384,
            max_srq_wr: 16384,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
            max_inline_pages: 512,
            max_qp_rd_atom: 16,
            max_mr_size: 16 << 30,
            // The daemon keeps 8 bytes of translation per registered 4 KiB
            // page: 64 GiB of registrations cost at most 128 MiB of host memory.
            max_mr_bytes: 64 << 30,
            // Every page size from 4 KiB to 1 GiB.
            page_size_cap: ((1u64 << (MAX_PAGE_SHIFT + 1)) - 1) & !((1u64 << MIN_PAGE_SHIFT) - 1),
        }
    }
}

/// Largest depth of any queue: the ring index arithmetic uses 32 bits and
/// we want headroom.
const MAX_DEPTH: u64 = 1 << 22;

impl Limits {
    /// Checks every limit against what the implementation can support.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let counts = [
            ("max-ctx", self.max_ctx),
            ("max-pd", self.max_pd),
            ("max-cq", self.max_cq),
            ("max-qp", self.max_qp),
            ("max-mr", self.max_mr),
            ("max-srq", self.max_srq),
            ("max-ah", self.max_ah),
        ];
        for (name, v) in counts {
            range(name, u64::from(v), 1, MAX_SLOTS as u64)?;
        }
        for (name, v) in [
            ("max-cqe", self.max_cqe),
            ("max-qp-wr", self.max_qp_wr),
            ("max-srq-wr", self.max_srq_wr),
        ] {
            range(name, u64::from(v), 1, MAX_DEPTH)?;
            if !v.is_power_of_two() {
                return Err(ConfigError::NotPowerOfTwo {
                    name,
                    value: u64::from(v),
                });
            }
        }
        range("max-send-sge", u64::from(self.max_send_sge), 1, 30)?;
        range("max-recv-sge", u64::from(self.max_recv_sge), 1, 30)?;
        range("max-inline-data", u64::from(self.max_inline_data), 0, 480)?;
        range(
            "max-inline-pages",
            u64::from(self.max_inline_pages),
            1,
            65536,
        )?;
        range("max-qp-rd-atom", u64::from(self.max_qp_rd_atom), 1, 255)?;
        range("max-mr-size", self.max_mr_size, 4096, 1 << 46)?;
        range("max-mr-bytes", self.max_mr_bytes, 4096, 1 << 50)?;
        let stride = 1u64 << send_wqe_shift(self.max_send_sge, self.max_inline_data);
        if u64::from(self.max_qp_wr) * stride > 1 << 31 {
            return Err(ConfigError::RingTooLarge {
                depth: self.max_qp_wr,
                stride,
            });
        }
        let valid_pages = ((1u64 << (MAX_PAGE_SHIFT + 1)) - 1) & !((1u64 << MIN_PAGE_SHIFT) - 1);
        if self.page_size_cap & !valid_pages != 0 || self.page_size_cap & (1 << MIN_PAGE_SHIFT) == 0
        {
            return Err(ConfigError::LimitOutOfRange {
                name: "page-size-cap (only 4 KiB to 1 GiB pages, 4 KiB included)",
                value: self.page_size_cap,
                min: 1 << MIN_PAGE_SHIFT,
                max: u64::MAX,
            });
        }
        Ok(())
    }

    /// Most pages one MR may have (its largest length in 4 KiB pages, plus
    /// one for an unaligned start), capped to what a u32 count can hold.
    pub fn max_mr_pages(&self) -> u32 {
        u32::try_from((self.max_mr_size >> MIN_PAGE_SHIFT) + 1).unwrap_or(u32::MAX)
    }

    /// The device configuration advertised to the driver.
    pub fn device_config(&self) -> DeviceConfig {
        DeviceConfig {
            abi_version: ABI_VERSION,
            max_ctx: self.max_ctx,
            max_pd: self.max_pd,
            max_cq: self.max_cq,
            max_qp: self.max_qp,
            max_mr: self.max_mr,
            max_srq: self.max_srq,
            max_ah: self.max_ah,
            max_cqe: self.max_cqe,
            max_qp_wr: self.max_qp_wr,
            max_srq_wr: self.max_srq_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
            max_inline_pages: self.max_inline_pages,
            max_qp_rd_atom: self.max_qp_rd_atom,
            max_mr_size: self.max_mr_size,
            max_mr_bytes: self.max_mr_bytes,
            page_size_cap: self.page_size_cap,
        }
    }
}

fn range(name: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::LimitOutOfRange {
            name,
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// Everything the daemon needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// One vhost-user socket per VM.
    pub sockets: Vec<PathBuf>,
    /// Limits applied to each VM.
    pub limits: Limits,
    /// Device feature bits offered to drivers.
    pub device_features: u64,
    /// How long a control-queue worker keeps polling for more requests
    /// after a batch before it sleeps (0: never polls).
    pub ctrl_poll: std::time::Duration,
}

/// Default control-queue polling window.
pub const DEFAULT_CTRL_POLL: std::time::Duration = std::time::Duration::from_micros(50);

impl DaemonConfig {
    /// A configuration serving `sockets` with default limits.
    pub fn new(sockets: Vec<PathBuf>) -> Self {
        DaemonConfig {
            sockets,
            limits: Limits::default(),
            device_features: ALL_DEVICE_FEATURES,
            ctrl_poll: DEFAULT_CTRL_POLL,
        }
    }

    /// Checks the whole configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sockets.is_empty() {
            return Err(ConfigError::NoSockets);
        }
        for (i, s) in self.sockets.iter().enumerate() {
            if self.sockets[..i].contains(s) {
                return Err(ConfigError::DuplicateSocket(s.clone()));
            }
        }
        if self.device_features & !ALL_DEVICE_FEATURES != 0 {
            return Err(ConfigError::UnsupportedFeatures(
                self.device_features & !ALL_DEVICE_FEATURES,
            ));
        }
        if self.ctrl_poll > std::time::Duration::from_millis(10) {
            return Err(ConfigError::LimitOutOfRange {
                name: "ctrl-poll-us",
                value: u64::try_from(self.ctrl_poll.as_micros()).unwrap_or(u64::MAX),
                min: 0,
                max: 10_000,
            });
        }
        self.limits.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
        assert_eq!(Limits::default().page_size_cap & 0xfff, 0);
        assert_ne!(Limits::default().page_size_cap & (1 << 30), 0);
        assert_eq!(Limits::default().page_size_cap >> 31, 0);
    }

    #[test]
    fn rejects_bad_values() {
        let l = Limits {
            max_cqe: 1000,
            ..Limits::default()
        };
        assert!(matches!(
            l.validate(),
            Err(ConfigError::NotPowerOfTwo { .. })
        ));
        let l = Limits {
            max_qp: 0,
            ..Limits::default()
        };
        assert!(matches!(
            l.validate(),
            Err(ConfigError::LimitOutOfRange { name: "max-qp", .. })
        ));
        let l = Limits {
            max_qp_wr: 1 << 22,
            max_send_sge: 30,
            ..Limits::default()
        };
        assert!(matches!(
            l.validate(),
            Err(ConfigError::RingTooLarge { .. })
        ));
        let l = Limits {
            page_size_cap: Limits::default().page_size_cap | 1 << 31,
            ..Limits::default()
        };
        assert!(l.validate().is_err());
        let mut c = DaemonConfig::new(vec!["/a".into()]);
        c.device_features |= 1 << 4;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnsupportedFeatures(16))
        ));
        let c = DaemonConfig::new(vec!["/a".into(), "/a".into()]);
        assert!(matches!(c.validate(), Err(ConfigError::DuplicateSocket(_))));
        assert_eq!(
            DaemonConfig::new(vec![]).validate(),
            Err(ConfigError::NoSockets)
        );
    }
}
