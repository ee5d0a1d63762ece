//! Daemon configuration: the VMs to serve (socket, tenant, GID, limits)
//! and daemon-wide settings. [`crate::config_file`] builds one from a TOML
//! file; `main` builds one from the command line.

use std::path::PathBuf;

use thiserror::Error;
use virtio_rdma_abi::config::{
    DeviceConfig, F_GSI, F_MCAST, F_MEM_MGT, F_MW, F_RESIZE, F_UC, F_UD, F_XRC, V2_DEVICE_FEATURES,
};

/// The device feature bits this daemon implements, and so may offer. A
/// device offers those of them its RNIC supports (`Caps::features`).
pub const IMPLEMENTED_FEATURES: u64 =
    V2_DEVICE_FEATURES | F_GSI | F_MEM_MGT | F_MW | F_UC | F_MCAST | F_RESIZE | F_XRC;
use virtio_rdma_abi::mem::{send_wqe_shift, MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};
use virtio_rdma_abi::verbs::DeviceAttr;
use virtio_rdma_abi::{ABI_VERSION, MIN_COMPATIBLE_ABI_VERSION};

use crate::gid_table::{operator_order, GidTable, GID_TABLE_LEN};
use crate::resources::handle::MAX_SLOTS;
use crate::rnic_objects::{Caps, RnicKind};

/// A configuration value that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No VM (socket path) was given.
    #[error("at least one VM is required (--socket-path or [[vm]] in --config)")]
    NoSockets,
    /// A VM's `standby_for` names no VM it can be the standby of, or the
    /// standby differs from it (spec 20.5).
    #[error("VM {vm:?}: standby: {why}")]
    Standby {
        /// The standby.
        vm: String,
        /// What is wrong.
        why: String,
    },
    /// The same socket path was given twice.
    #[error("socket path {0} is given more than once")]
    DuplicateSocket(PathBuf),
    /// Two VMs have the same name.
    #[error("VM name {0:?} is given more than once")]
    DuplicateVm(String),
    /// Two tenants have the same name.
    #[error("tenant name {0:?} is given more than once")]
    DuplicateTenant(String),
    /// Two QoS classes have the same name.
    #[error("QoS class {0:?} is given more than once")]
    DuplicateQosClass(String),
    /// A QoS class has invalid settings.
    #[error("QoS class {class:?}: {source}")]
    QosClass {
        /// The class.
        class: String,
        /// What is wrong.
        source: crate::qos::QosError,
    },
    /// A tenant or VM names a QoS class that is not defined.
    #[error("{owner}: QoS class {class:?} is not defined")]
    UnknownQosClass {
        /// The tenant or VM.
        owner: String,
        /// The class it names.
        class: String,
    },
    /// A VM names a tenant that is not defined.
    #[error("VM {vm:?}: tenant {tenant:?} is not defined")]
    UnknownTenant {
        /// The VM.
        vm: String,
        /// The tenant it names.
        tenant: String,
    },
    /// Two VMs (or one VM twice) would have the same GID, in any entry
    /// of their GID tables (the default GIDs of their MACs included).
    #[error("VM {vm:?}: GID {gid} is already a GID of VM {other:?}")]
    DuplicateGid {
        /// The VM.
        vm: String,
        /// Its GID, as text.
        gid: String,
        /// The VM that has it already.
        other: String,
    },
    /// A VM has more GIDs than its table holds.
    #[error("VM {vm:?}: {count} GIDs, but its GID table holds {max} besides the default GID (abi = 2: 1 in all)")]
    TooManyGids {
        /// The VM.
        vm: String,
        /// GIDs given.
        count: usize,
        /// Most it may have.
        max: usize,
    },
    /// A VM's `cm_listen` port is 0 or another VM's (or listed twice).
    #[error("VM {vm:?}: cm_listen port {port} {why}")]
    CmListen {
        /// The VM.
        vm: String,
        /// The port.
        port: u16,
        /// What is wrong: `is not a port` or `is already VM "x"'s`.
        why: String,
    },
    /// A VM's `abi` is not a version the daemon implements.
    #[error("VM {vm:?}: abi = {abi}, but the daemon implements ABI versions 2 and 3")]
    BadAbi {
        /// The VM.
        vm: String,
        /// The version given.
        abi: u32,
    },
    /// A VM's MAC address cannot pair its port with a guest interface.
    #[error("VM {vm:?}: MAC address {mac} {source}")]
    BadMac {
        /// The VM.
        vm: String,
        /// The address, as text.
        mac: String,
        /// What is wrong with it.
        source: MacError,
    },
    /// Two VMs of one tenant network would pair with the same MAC address.
    #[error("VM {vm:?}: MAC address {mac} is already the MAC address of VM {other:?} in the same tenant")]
    DuplicateMac {
        /// The VM.
        vm: String,
        /// The address, as text.
        mac: String,
        /// The VM of the same tenant that has it already.
        other: String,
    },
    /// `--mac` names a VM that is not configured.
    #[error("--mac {0}=...: there is no VM named {0:?} (VMs of --socket-path are named vm<N>, N their position among all VMs)")]
    MacForUnknownVm(String),
    /// `--cm-listen` names a VM that is not configured.
    #[error("--cm-listen {0}=...: there is no VM named {0:?} (VMs of --socket-path are named vm<N>, N their position among all VMs)")]
    CmListenForUnknownVm(String),
    /// `--mac` is given twice for one VM.
    #[error("--mac is given more than once for VM {0:?}")]
    MacGivenTwice(String),
    /// A limit of one VM is invalid.
    #[error("VM {vm:?}: {source}")]
    VmLimits {
        /// The VM.
        vm: String,
        /// What is wrong.
        source: Box<ConfigError>,
    },
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
    /// `engine_cpus` does not give one CPU per engine thread.
    #[error("engine_cpus lists {cpus} CPUs for {threads} engine threads (one each, or none)")]
    EngineCpus {
        /// CPUs listed.
        cpus: usize,
        /// `engine_threads`.
        threads: usize,
    },
    /// A tenant is placed on an engine thread that does not exist.
    #[error("tenant {tenant:?}: engine = {engine}, but there are {threads} engine threads (0..{threads})")]
    TenantEngine {
        /// The tenant.
        tenant: String,
        /// Its `engine`.
        engine: usize,
        /// `engine_threads`.
        threads: usize,
    },
}

/// Most engine threads.
pub const MAX_ENGINE_THREADS: usize = 64;

/// Generates, from the one list of limits below: [`Limits`] and its
/// `Default`, [`LimitOverrides`] (the `--max-*` options, `clap` arguments
/// flattened into the daemon's command line, and their merge), each limit's
/// own bounds check, the copy of the advertised limits into the wire
/// structures ([`Limits::device_config`], [`Limits::device_attr`]), and
/// `limit_fields!`, which hands `name: type` of every limit to another
/// generator (the TOML `limits` tables of [`crate::config_file`]).
///
/// An entry is `doc; name: type = default, "option", [min, max(, check)]`:
/// the doc is the field's and the option's help; `"option"` is the command
/// line's `--option` and the name errors give; `check` is a function
/// `fn(&'static str, u64) -> Result<(), ConfigError>` run after the range.
/// The entries of `advertised` are fields of `DeviceConfig` and
/// `DeviceAttr` (the abi's wire structures, of the same names); those of
/// `host` are the daemon's alone.
macro_rules! limits {
    (
        advertised {
            $(
                $(#[doc = $adoc:literal])+
                $afield:ident: $aty:ty = $adefault:expr, $aflag:literal,
                    [$amin:expr, $amax:expr $(, $acheck:ident)?];
            )*
        }
        host {
            $(
                $(#[doc = $hdoc:literal])+
                $hfield:ident: $hty:ty = $hdefault:expr, $hflag:literal,
                    [$hmin:expr, $hmax:expr $(, $hcheck:ident)?];
            )*
        }
    ) => {
        /// Per-VM limits, advertised in the device configuration (all but
        /// the host-side ones) and enforced on every create command.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Limits {
            $($(#[doc = $adoc])+ pub $afield: $aty,)*
            $($(#[doc = $hdoc])+ pub $hfield: $hty,)*
        }

        impl Default for Limits {
            fn default() -> Self {
                Limits {
                    $($afield: $adefault,)*
                    $($hfield: $hdefault,)*
                }
            }
        }

        /// Limits given explicitly: the `--max-*` options of the command
        /// line (flattened into its arguments). Each `Some` replaces the
        /// field of the same name of a [`Limits`].
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::Args)]
        pub struct LimitOverrides {
            $($(#[doc = $adoc])+ #[arg(long = $aflag)] pub $afield: Option<$aty>,)*
            $($(#[doc = $hdoc])+ #[arg(long = $hflag)] pub $hfield: Option<$hty>,)*
        }

        impl LimitOverrides {
            /// Replaces the fields of `limits` that are given here.
            pub fn apply(&self, limits: &mut Limits) {
                $(if let Some(v) = self.$afield {
                    limits.$afield = v;
                })*
                $(if let Some(v) = self.$hfield {
                    limits.$hfield = v;
                })*
            }

            /// Whether the field named `name` (`max_qp`) is given here.
            pub fn is_set(&self, name: &str) -> bool {
                match name {
                    $(stringify!($afield) => self.$afield.is_some(),)*
                    $(stringify!($hfield) => self.$hfield.is_some(),)*
                    _ => false,
                }
            }
        }

        impl Limits {
            /// Checks every limit against its own bounds, in list order.
            fn check_each(&self) -> Result<(), ConfigError> {
                $(
                    range($aflag, wide(self.$afield), $amin, $amax)?;
                    $($acheck($aflag, wide(self.$afield))?;)?
                )*
                $(
                    range($hflag, wide(self.$hfield), $hmin, $hmax)?;
                    $($hcheck($hflag, wide(self.$hfield))?;)?
                )*
                Ok(())
            }

            /// The device configuration advertised to the driver, without
            /// a paired interface (`mac` zero).
            pub fn device_config(&self) -> DeviceConfig {
                DeviceConfig {
                    abi_version: ABI_VERSION,
                    $($afield: self.$afield,)*
                    // `mac` is not a limit: the VM's (`VmConfig::mac`),
                    // set by the device.
                    ..DeviceConfig::default()
                }
            }

            /// The QUERY_DEVICE attributes these limits determine; the
            /// others (identity, versions, capabilities of the RNIC) are
            /// zero, for the caller to fill.
            pub fn device_attr(&self) -> DeviceAttr {
                DeviceAttr {
                    $($afield: self.$afield,)*
                    max_qp_init_rd_atom: self.max_qp_rd_atom,
                    max_mr_pages: self.max_mr_pages(),
                    ..DeviceAttr::default()
                }
            }
        }

        #[cfg(test)]
        impl Limits {
            /// `(field, option)` of every limit.
            const OPTIONS: &'static [(&'static str, &'static str)] = &[
                $((stringify!($afield), $aflag),)*
                $((stringify!($hfield), $hflag),)*
            ];
        }

        /// Calls the generator `$gen` with `name: type,` of every limit.
        macro_rules! limit_fields {
            ($gen:ident) => {
                $gen! { $($afield: $aty,)* $($hfield: $hty,)* }
            };
        }
        pub(crate) use limit_fields;
    };
}

/// Largest depth of any queue: the ring index arithmetic uses 32 bits and
/// we want headroom.
const MAX_DEPTH: u64 = 1 << 22;

/// Every page size from 4 KiB to 1 GiB (bit n: 2^n-byte pages).
const ALL_PAGE_SIZES: u64 = ((1u64 << (MAX_PAGE_SHIFT + 1)) - 1) & !((1u64 << MIN_PAGE_SHIFT) - 1);

/// Most live objects of one kind.
const MAX_OBJECTS: u64 = MAX_SLOTS as u64;

// The limits: to add one, add its line here (and, if advertised, its field
// to `DeviceConfig` and `DeviceAttr` in the abi and the spec).
limits! {
    advertised {
        /// Per-VM maximum number of contexts.
        max_ctx: u32 = 64, "max-ctx", [1, MAX_OBJECTS];
        /// Per-VM maximum number of protection domains.
        max_pd: u32 = 1024, "max-pd", [1, MAX_OBJECTS];
        /// Per-VM maximum number of completion queues.
        max_cq: u32 = 16384, "max-cq", [1, MAX_OBJECTS];
        /// Per-VM maximum number of queue pairs.
        max_qp: u32 = 16384, "max-qp", [1, MAX_OBJECTS];
        /// Per-VM maximum number of memory regions.
        max_mr: u32 = 16384, "max-mr", [1, MAX_OBJECTS];
        /// Per-VM maximum number of shared receive queues.
        max_srq: u32 = 1024, "max-srq", [1, MAX_OBJECTS];
        /// Per-VM maximum number of address handles.
        max_ah: u32 = 16384, "max-ah", [1, MAX_OBJECTS];
        /// Maximum CQ depth (power of two).
        max_cqe: u32 = 65536, "max-cqe", [1, MAX_DEPTH, power_of_two];
        /// Maximum send/receive queue depth (power of two).
        max_qp_wr: u32 = 16384, "max-qp-wr", [1, MAX_DEPTH, power_of_two];
        /// Maximum SRQ depth (power of two).
        max_srq_wr: u32 = 16384, "max-srq-wr", [1, MAX_DEPTH, power_of_two];
        /// Maximum scatter/gather entries per send work request (1..=30).
        max_send_sge: u32 = 16, "max-send-sge", [1, 30];
        /// Maximum scatter/gather entries per receive work request (1..=30).
        max_recv_sge: u32 = 16, "max-recv-sge", [1, 30];
        /// Maximum inline data bytes per send work request (0..=480).
        max_inline_data: u32 = 256, "max-inline-data", [0, 480];
        /// Maximum entries of an inline page list.
        max_inline_pages: u32 = 512, "max-inline-pages", [1, 65536];
        /// Maximum outstanding RDMA READ/atomic operations per QP (1..=255).
        max_qp_rd_atom: u32 = 16, "max-qp-rd-atom", [1, 255];
        /// Maximum bytes of one memory region.
        max_mr_size: u64 = 16 << 30, "max-mr-size", [4096, 1 << 46];
        /// Per-VM maximum of registered bytes over all memory regions.
        // The daemon keeps 8 bytes of translation per registered 4 KiB
        // page: 64 GiB of registrations cost at most 128 MiB of host memory.
        max_mr_bytes: u64 = 64 << 30, "max-mr-bytes", [4096, 1 << 50];
        /// Allowed page sizes, bit n for 2^n-byte pages: 4 KiB to 1 GiB,
        /// 4 KiB always included (default: all of them).
        page_size_cap: u64 = ALL_PAGE_SIZES, "page-size-cap", [0, u64::MAX, page_sizes];
    }
    host {
        /// Per-VM maximum of host memory held for the VM's objects (page-list
        /// translations of MRs and queue rings, object state), in bytes. Not
        /// advertised to the driver; a create command over it fails with
        /// QUOTA, detail 9 (see resources::host_cost).
        // The translation of max_mr_bytes in 4 KiB pages (128 MiB) and as
        // much again for rings and objects. Every queue at its largest
        // (max_qp QPs of max_qp_wr WQEs and so on) would need ~0.7 GiB;
        // real workloads use a small fraction, and contiguous or huge-page
        // memory descriptions cost nothing.
        max_host_bytes: u64 = 256 << 20, "max-host-bytes", [1 << 16, 1 << 40];
        /// Per-VM maximum of the daemon's memory mappings (`vm.max_map_count`)
        /// held for the VM's host objects with the `verbs` RNIC: its
        /// memory regions' windows and what the libibverbs provider maps for
        /// its QPs, CQs and SRQs. The effective limit is the smaller of this
        /// and the VM's share of the daemon's budget (spec 9.5, appendix D); beyond it a
        /// create command fails with QUOTA, detail 10.
        max_host_mappings: u64 = 16384, "max-host-mappings", [16, 1 << 24];
        /// Control requests taken from one VM's control queue per pass before
        /// other VMs' control workers get to run (1..=1024; the requests
        /// beyond it wait in the ring, they are not failed).
        max_ctrl_outstanding: u32 = 64, "max-ctrl-outstanding", [1, 1024];
        /// Management datagrams (MADs) the VM's GSI QP may send per second
        /// (bursts of 64); beyond it a MAD is dropped (its work request
        /// still completes) and counted in `mad_dropped` (spec 18.26).
        mad_per_sec: u32 = 1000, "mad-per-sec", [1, 1_000_000];
        /// Connections the VM's GSI QP may have in the `verbs` RNIC's CM
        /// bridge at once (being set up, established or being torn down);
        /// beyond it a connection request is rejected ("no resources").
        cm_connections: u32 = 64, "cm-connections", [1, 4096];
        /// How long, in milliseconds, the VM's RC QPs wait for a peer whose
        /// device instance is stopped (a pause, a migration's blackout)
        /// without spending their retries (spec 20.6); then the retries of
        /// spec 18.20 apply. 0: no hold.
        pause_hold_ms: u32 = 30_000, "pause-hold-ms", [0, 600_000];
    }
}

/// MADs a VM may send at once before [`Limits::mad_per_sec`] holds it.
pub const MAD_BURST: u64 = 64;

/// A limit as `u64`, for its bounds check.
fn wide(v: impl Into<u64>) -> u64 {
    v.into()
}

/// Checks that depth limit `name` is a power of two.
fn power_of_two(name: &'static str, value: u64) -> Result<(), ConfigError> {
    if !value.is_power_of_two() {
        return Err(ConfigError::NotPowerOfTwo { name, value });
    }
    Ok(())
}

/// Checks that `page_size_cap` allows only 4 KiB to 1 GiB pages, 4 KiB
/// among them (spec 5: drivers rely on it).
fn page_sizes(_name: &'static str, value: u64) -> Result<(), ConfigError> {
    if value & !ALL_PAGE_SIZES != 0 || value & (1 << MIN_PAGE_SHIFT) == 0 {
        return Err(ConfigError::LimitOutOfRange {
            name: "page-size-cap (only 4 KiB to 1 GiB pages, 4 KiB included)",
            value,
            min: 1 << MIN_PAGE_SHIFT,
            max: u64::MAX,
        });
    }
    Ok(())
}

impl ConfigError {
    /// The [`Limits`] field (`max_qp_wr`) a limit error is about, if any.
    pub fn limit_field(&self) -> Option<String> {
        let name = match self {
            ConfigError::LimitOutOfRange { name, .. } | ConfigError::NotPowerOfTwo { name, .. } => {
                name
            }
            ConfigError::RingTooLarge { .. } => "max-qp-wr",
            ConfigError::VmLimits { source, .. } => return source.limit_field(),
            _ => return None,
        };
        let word = name.split(' ').next().unwrap_or(name);
        Some(word.replace('-', "_"))
    }
}

impl Limits {
    /// Checks every limit against what the implementation can support:
    /// each against its bounds, then the combinations.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_each()?;
        let stride = 1u64 << send_wqe_shift(self.max_send_sge, self.max_inline_data);
        if u64::from(self.max_qp_wr) * stride > 1 << 31 {
            return Err(ConfigError::RingTooLarge {
                depth: self.max_qp_wr,
                stride,
            });
        }
        Ok(())
    }

    /// Most pages one MR may have: the 4 KiB pages a region of
    /// `max_mr_size` bytes spans when it starts on the last byte of its
    /// first page, `ceil((4095 + max_mr_size) / 4096)`, capped to what a
    /// u32 count can hold. Every allowed region fits (spec 10.3: `REG_MR`
    /// never reports `RANGE` on `npages`).
    pub fn max_mr_pages(&self) -> u32 {
        const PAGE: u64 = 1 << MIN_PAGE_SHIFT;
        let span = self.max_mr_size.saturating_add(PAGE - 1);
        u32::try_from(span.div_ceil(PAGE)).unwrap_or(u32::MAX)
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

/// The GID a VM gets when none is configured: the IPv4-mapped address
/// 10.42.x.y, where x.y is `index + 1` (the VM's position in the daemon).
/// It is only a label inside the daemon's virtual network.
pub fn default_gid(index: usize) -> [u8; 16] {
    let n = (index + 1) as u32;
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12] = 10;
    gid[13] = 42;
    gid[14] = (n >> 8) as u8;
    gid[15] = n as u8;
    gid
}

/// A GID as text: IPv6 notation (IPv4-mapped GIDs print as `::ffff:a.b.c.d`).
pub fn gid_text(gid: [u8; 16]) -> String {
    let a = std::net::Ipv6Addr::from(gid);
    match a.to_ipv4_mapped() {
        Some(v4) => format!("::ffff:{v4}"),
        None => a.to_string(),
    }
}

/// Why a MAC address cannot be the address of the guest interface a port is
/// paired with (spec appendix A).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum MacError {
    /// Not six two-digit hex bytes separated by colons.
    #[error("is not a MAC address (six two-digit hexadecimal bytes separated by ':', e.g. 52:54:00:12:34:56)")]
    Syntax,
    /// All zero: the device reports that as "no interface configured".
    #[error("is all zero; leave the MAC address out to pair no interface")]
    Zero,
    /// A group address, which no interface has as its own.
    #[error("is a multicast address (bit 0 of the first byte is set); a network interface's own address is unicast")]
    Multicast,
}

/// Checks that `mac` can name a guest interface: unicast and not all zero.
pub fn check_mac(mac: [u8; 6]) -> Result<(), MacError> {
    if mac == [0; 6] {
        return Err(MacError::Zero);
    }
    if mac[0] & 1 != 0 {
        return Err(MacError::Multicast);
    }
    Ok(())
}

/// A MAC address from text `52:54:00:12:34:56` (hex digits in either case),
/// checked with [`check_mac`].
pub fn parse_mac(text: &str) -> Result<[u8; 6], MacError> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or(MacError::Syntax)?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(MacError::Syntax);
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| MacError::Syntax)?;
    }
    if parts.next().is_some() {
        return Err(MacError::Syntax);
    }
    check_mac(mac)?;
    Ok(mac)
}

/// A MAC address as text: `52:54:00:12:34:56`.
pub fn mac_text(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// Name of the tenant that VMs given only on the command line belong to.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant: a group of VMs under one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// Unique name.
    pub name: String,
    /// QoS class (one of [`DaemonConfig::qos_classes`]): rate limits on the
    /// sum of the tenant's VMs' traffic.
    pub qos_class: Option<String>,
    /// The engine thread that serves the tenant's VMs; `None`: tenants
    /// are spread over the threads in turn ([`DaemonConfig::vm_engines`]).
    pub engine: Option<usize>,
    /// GIDs of remote hosts (other daemons' VMs, native RDMA peers) the
    /// tenant's VMs may name with the `verbs` RNIC; a VM may always
    /// name its own host's GID (then the QP number decides, as on one
    /// daemon). On a fabric, keeping other traffic away from these
    /// addresses is the network's part (docs/operations.md).
    pub remote_gids: Vec<[u8; 16]>,
    /// What the tenant's VMs may put in the address vector fields that
    /// reach the fabric (traffic class, service level, flow label).
    pub fabric: FabricPolicy,
    /// Its weight in the split of a host NIC's objects and of the daemon's
    /// mappings among tenants (`nic_share`, default 1; spec appendix D).
    pub nic_share: u32,
}

/// What a tenant's VMs may put in one field of an address vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldRule {
    /// The guest's value, unfiltered.
    Any,
    /// Only these values; an address vector with another is refused
    /// (`DENIED`).
    Allow(Vec<u32>),
    /// This value, whatever the guest asked for.
    Force(u32),
}

impl FieldRule {
    /// The value a guest's `asked` becomes under this rule, or `None` if
    /// the rule refuses it.
    pub fn apply(&self, asked: u32) -> Option<u32> {
        match self {
            FieldRule::Any => Some(asked),
            FieldRule::Allow(list) => list.contains(&asked).then_some(asked),
            FieldRule::Force(v) => Some(*v),
        }
    }
}

/// A tenant's rules for the address vector fields a host RNIC puts on the
/// fabric: the traffic class selects a priority (lossless or ECN-marked
/// classes on a converged network), the service level likewise, the flow
/// label steers ECMP. `None`: the RNIC's default ([`FabricPolicy::rules`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricPolicy {
    /// The GRH traffic class (0..=255).
    pub traffic_class: Option<FieldRule>,
    /// The service level (0..=15).
    pub service_level: Option<FieldRule>,
    /// The GRH flow label (0..2^20).
    pub flow_label: Option<FieldRule>,
}

impl FabricPolicy {
    /// The rules in force, traffic class, service level and flow label,
    /// with the defaults filled in: on a host RNIC (`fabric`) a guest gets
    /// traffic class and service level 0 unless the operator allows more —
    /// a shared fabric's priorities are the operator's; on the software
    /// RNIC the values reach only a VM of the same tenant, unfiltered.
    pub fn rules(&self, fabric: bool) -> [FieldRule; 3] {
        let default = || {
            if fabric {
                FieldRule::Force(0)
            } else {
                FieldRule::Any
            }
        };
        [
            self.traffic_class.clone().unwrap_or_else(default),
            self.service_level.clone().unwrap_or_else(default),
            self.flow_label.clone().unwrap_or(FieldRule::Any),
        ]
    }
}

/// One VM: the socket its VMM connects to and what its device offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// Unique name (logs, thread names).
    pub name: String,
    /// Its vhost-user socket.
    pub socket: PathBuf,
    /// Name of its tenant (one of [`DaemonConfig::tenants`]).
    pub tenant: String,
    /// The operator's GIDs of its port (`gids`, or `gid` as a list of
    /// one), in the order given; empty: [`default_gid`] of its index. The
    /// table puts IPv4-mapped ones first ([`DaemonConfig::gid_table`]).
    pub gids: Vec<[u8; 16]>,
    /// The ABI version its device reports: 3, or 2 for guests whose driver
    /// knows only version 2 (no version-3 feature bit, the version-2 GID
    /// table).
    pub abi: u32,
    /// MAC address of the guest network interface its port is paired with
    /// (`DeviceConfig.mac`, spec appendix A); `None`: none (all zero).
    pub mac: Option<[u8; 6]>,
    /// Its limits.
    pub limits: Limits,
    /// QoS class (one of [`DaemonConfig::qos_classes`]): the VM's weight
    /// and rate limits; `None`: the default weight, no limits.
    pub qos_class: Option<String>,
    /// The `rdma_cm` ports (TCP port space) the `verbs` RNIC listens on
    /// for the VM on the host's address (`cm_listen`): connection requests
    /// to them go to the VM's GSI QP. A port is one VM's.
    pub cm_listen: Vec<u16>,
    /// The VM this one is the standby of (`standby_for`, spec 20.5): the
    /// socket a migration's destination VMM connects to. A standby has its
    /// VM's tenant, GIDs, MAC, ABI version, limits and QoS class (copied
    /// here), no `cm_listen` ports, and takes the VM's state only.
    pub standby_for: Option<String>,
}

/// The host RDMA device the `verbs` RNIC uses (`[daemon] rnic_device`,
/// `rnic_port`, `gid_index`; `--rnic-device`, `--rnic-port`, `--gid-index`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The device (`rxe0`, `mlx5_0`); `None`: the first one.
    pub device: Option<String>,
    /// The port (from 1).
    pub port: u8,
    /// The index of the GID everything is sent from (for RoCEv2 over IPv4
    /// on rxe: 1, the interface's address).
    pub gid_index: u32,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            port: 1,
            gid_index: 0,
        }
    }
}

/// Everything the daemon needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The VMs, one vhost-user socket each; a VM's index is its position.
    pub vms: Vec<VmConfig>,
    /// The tenants the VMs belong to.
    pub tenants: Vec<TenantConfig>,
    /// The RNIC behind the devices.
    pub rnic: crate::rnic_objects::RnicKind,
    /// The host RDMA device of the `verbs` RNIC.
    pub verbs: VerbsConfig,
    /// Device feature bits offered to drivers.
    pub device_features: u64,
    /// How long a control-queue worker keeps polling for more requests
    /// after a batch before it sleeps (0: never polls).
    pub ctrl_poll: std::time::Duration,
    /// Named QoS settings that tenants and VMs refer to.
    pub qos_classes: Vec<crate::qos::QosClass>,
    /// Number of RNIC engine threads (1..=[`MAX_ENGINE_THREADS`]).
    pub engine_threads: usize,
    /// The CPU of each engine thread, in order (empty: not pinned).
    pub engine_cpus: Vec<usize>,
    /// Engine threads set `DB_FLAG_POLLING` while they poll, so that
    /// drivers post without a fence (spec 18.6; needs `membarrier(2)`).
    pub fence_elision: bool,
    /// Accept guest RAM and dirty-log files without `F_SEAL_SHRINK` (spec
    /// 19.6.1, 20.4). Off by default: a VMM that truncates such a file
    /// crashes the daemon.
    pub allow_unsealed_memory: bool,
    /// Path of the management socket (JSON API); `None`: none.
    pub mgmt_socket: Option<PathBuf>,
    /// Path of the hand-over socket a successor daemon takes every VM
    /// over on (spec 20.7); `None`: none.
    pub handover_socket: Option<PathBuf>,
    /// Address of the Prometheus metrics HTTP listener; `None`: none.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// Default control-queue polling window.
pub const DEFAULT_CTRL_POLL: std::time::Duration = std::time::Duration::from_micros(50);

impl DaemonConfig {
    /// A configuration serving `sockets` with default limits: VM `i` is
    /// named `vm<i>` and belongs to the tenant [`DEFAULT_TENANT`].
    pub fn new(sockets: Vec<PathBuf>) -> Self {
        let mut c = DaemonConfig {
            vms: Vec::new(),
            tenants: Vec::new(),
            rnic: crate::rnic_objects::RnicKind::Soft,
            verbs: VerbsConfig::default(),
            device_features: IMPLEMENTED_FEATURES,
            ctrl_poll: DEFAULT_CTRL_POLL,
            qos_classes: Vec::new(),
            engine_threads: 1,
            engine_cpus: Vec::new(),
            fence_elision: false,
            allow_unsealed_memory: false,
            mgmt_socket: None,
            handover_socket: None,
            metrics_listen: None,
        };
        for s in sockets {
            c.add_default_vm(s, Limits::default());
        }
        c
    }

    /// Adds a VM named `vm<index>` in the tenant [`DEFAULT_TENANT`] (created
    /// if missing) with the default GID.
    pub fn add_default_vm(&mut self, socket: PathBuf, limits: Limits) {
        if !self.tenants.iter().any(|t| t.name == DEFAULT_TENANT) {
            self.tenants.push(TenantConfig {
                nic_share: 1,
                name: DEFAULT_TENANT.into(),
                qos_class: None,
                engine: None,
                remote_gids: Vec::new(),
                fabric: FabricPolicy::default(),
            });
        }
        self.vms.push(VmConfig {
            name: format!("vm{}", self.vms.len()),
            socket,
            tenant: DEFAULT_TENANT.into(),
            gids: Vec::new(),
            abi: ABI_VERSION,
            mac: None,
            limits,
            qos_class: None,
            cm_listen: Vec::new(),
            standby_for: None,
        });
    }

    /// Adds a standby of VM `vm` (spec 20.5) on `socket`, named
    /// `<vm>-standby`: the VM's identity, limits and QoS class, no
    /// `cm_listen` ports.
    pub fn add_standby(&mut self, vm: usize, socket: PathBuf) {
        let Some(p) = self.vms.get(vm).cloned() else {
            return;
        };
        self.vms.push(VmConfig {
            name: format!("{}-standby", p.name),
            socket,
            cm_listen: Vec::new(),
            standby_for: Some(p.name),
            ..p
        });
    }

    /// The VM whose identity VM `index` has: itself, or the VM it is the
    /// standby of.
    pub fn identity(&self, index: usize) -> usize {
        self.vms
            .get(index)
            .and_then(|v| v.standby_for.as_ref())
            .and_then(|p| self.vms.iter().position(|o| &o.name == p))
            .unwrap_or(index)
    }

    /// Gives every VM `limits`.
    pub fn set_limits(&mut self, limits: Limits) {
        for vm in &mut self.vms {
            vm.limits = limits;
        }
    }

    /// The operator's GIDs of VM `index` in table order (IPv4-mapped
    /// first): its configured ones, or [`default_gid`] of its index.
    pub fn gids(&self, index: usize) -> Vec<[u8; 16]> {
        let index = self.identity(index);
        match self.vms.get(index) {
            Some(v) if !v.gids.is_empty() => operator_order(&v.gids).collect(),
            _ => vec![default_gid(index)],
        }
    }

    /// The first of VM `index`'s operator GIDs ([`DaemonConfig::gids`]):
    /// the GID the operator knows it by.
    pub fn gid(&self, index: usize) -> [u8; 16] {
        self.gids(index)
            .first()
            .copied()
            .unwrap_or_else(|| default_gid(self.identity(index)))
    }

    /// The GID table of VM `index`'s port on an RNIC that gives each VM
    /// its own table (the software RNIC): with ABI version 3 the default
    /// GID of its MAC at index 0 and its operator GIDs after it; with
    /// version 2 its first operator GID alone (spec appendix A).
    pub fn gid_table(&self, index: usize) -> GidTable {
        let gids = self.gids(index);
        match self.vms.get(index) {
            Some(v) if v.abi < ABI_VERSION => GidTable::single(self.gid(index)),
            v => GidTable::v3(v.and_then(|v| v.mac), &gids),
        }
    }

    /// The device feature bits VM `index` is offered on an RNIC with
    /// `caps`: the daemon's, without version 3's for a VM of `abi = 2`,
    /// and without `F_GSI` where the RNIC carries no MADs or UD (whose
    /// AHs address them) is off.
    pub fn vm_features(&self, index: usize, caps: &Caps) -> u64 {
        let mut f = self.device_features;
        if self.vms.get(index).is_some_and(|v| v.abi < ABI_VERSION) {
            f &= V2_DEVICE_FEATURES;
        }
        if !caps.gsi || f & F_UD == 0 {
            f &= !F_GSI;
        }
        f
    }

    /// The QoS settings of a VM of class `name` (`None`: the defaults).
    pub fn qos_spec(&self, name: Option<&str>) -> crate::qos::QosSpec {
        name.and_then(|n| self.qos_classes.iter().find(|c| c.name == n))
            .map(|c| c.spec)
            .unwrap_or_default()
    }

    /// The QoS settings of a tenant of class `name` (`None`: no limits on
    /// the tenant as a whole).
    pub fn tenant_qos_spec(&self, name: Option<&str>) -> crate::qos::QosSpec {
        match name {
            Some(_) => self.qos_spec(name),
            None => crate::qos::QosSpec::unlimited(),
        }
    }

    /// The engine thread of tenant `index`: its `engine`, or else the
    /// tenants without one take the threads in turn, in their order.
    pub fn tenant_engine(&self, index: usize) -> usize {
        let threads = self.engine_threads.max(1);
        match self.tenants.get(index).and_then(|t| t.engine) {
            Some(e) => e,
            None => {
                let unplaced = self.tenants[..index.min(self.tenants.len())]
                    .iter()
                    .filter(|t| t.engine.is_none())
                    .count();
                unplaced % threads
            }
        }
    }

    /// One entry per engine thread: the CPU it is pinned to, if any.
    pub fn engine_thread_cpus(&self) -> Vec<Option<usize>> {
        (0..self.engine_threads.max(1))
            .map(|i| self.engine_cpus.get(i).copied())
            .collect()
    }

    /// The engine thread of every VM, by VM index: its tenant's
    /// ([`DaemonConfig::tenant_engine`]).
    pub fn vm_engines(&self) -> Vec<usize> {
        self.vms
            .iter()
            .map(|vm| {
                self.tenants
                    .iter()
                    .position(|t| t.name == vm.tenant)
                    .map_or(0, |t| self.tenant_engine(t))
            })
            .collect()
    }

    /// The GIDs of VM `i` that must be unique among all VMs: every
    /// entry of its table — the default GID of its MAC too, except on a
    /// host RNIC, whose ports have the host's GID instead (the operator's
    /// are still checked there).
    fn unique_gids(&self, i: usize) -> Vec<[u8; 16]> {
        if self.rnic == RnicKind::Verbs {
            return self.gids(i);
        }
        self.gid_table(i).iter().map(|(_, g)| g).collect()
    }

    /// VM `i`'s `abi` and GIDs: a version the daemon implements, no more
    /// GIDs than its table holds, none twice, none another VM's (`seen`:
    /// the GIDs of the VMs before it, and whose they are).
    fn check_gids(
        &self,
        i: usize,
        seen: &mut std::collections::HashMap<[u8; 16], usize>,
    ) -> Result<(), ConfigError> {
        let Some(vm) = self.vms.get(i) else {
            return Ok(());
        };
        if !(MIN_COMPATIBLE_ABI_VERSION..=ABI_VERSION).contains(&vm.abi) {
            return Err(ConfigError::BadAbi {
                vm: vm.name.clone(),
                abi: vm.abi,
            });
        }
        let max = if vm.abi < ABI_VERSION {
            1
        } else {
            GID_TABLE_LEN as usize - 1
        };
        if vm.gids.len() > max {
            return Err(ConfigError::TooManyGids {
                vm: vm.name.clone(),
                count: vm.gids.len(),
                max,
            });
        }
        let duplicate = |gid: [u8; 16], other: &str| ConfigError::DuplicateGid {
            vm: vm.name.clone(),
            gid: gid_text(gid),
            other: other.into(),
        };
        for g in self.unique_gids(i) {
            if let Some(&j) = seen.get(&g) {
                let other = self.vms.get(j).map_or("", |o| o.name.as_str());
                return Err(duplicate(g, other));
            }
            seen.insert(g, i);
        }
        Ok(())
    }

    /// The checks of [`DaemonConfig::validate`] on VM `i`'s `abi` and
    /// GIDs, against the VMs before it.
    pub fn check_vm_gids(&self, i: usize) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashMap::new();
        for j in 0..i.min(self.vms.len()) {
            for g in self.unique_gids(j) {
                seen.entry(g).or_insert(j);
            }
        }
        self.check_gids(i, &mut seen)
    }

    /// VM `i`'s `cm_listen`: ports (not 0), each listed once and by no VM
    /// before it (the host listens on one address for every VM of the
    /// daemon: a port can hand its requests to one VM only).
    pub fn check_cm_listen(&self, i: usize) -> Result<(), ConfigError> {
        let Some(vm) = self.vms.get(i) else {
            return Ok(());
        };
        let bad = |port: u16, why: String| ConfigError::CmListen {
            vm: vm.name.clone(),
            port,
            why,
        };
        for (k, &port) in vm.cm_listen.iter().enumerate() {
            if port == 0 {
                return Err(bad(port, "is not a port".into()));
            }
            if vm.cm_listen[..k].contains(&port) {
                return Err(bad(port, "is listed twice".into()));
            }
            if let Some(other) = self.vms[..i].iter().find(|o| o.cm_listen.contains(&port)) {
                return Err(bad(port, format!("is already VM {:?}'s", other.name)));
            }
        }
        Ok(())
    }

    /// VM `i`, the standby of `primary`: that VM is listed before it, is
    /// no standby itself and has no other standby; the standby has its
    /// tenant, GIDs, MAC and ABI version and listens on no port.
    pub fn check_standby(&self, i: usize, primary: &str) -> Result<(), ConfigError> {
        let Some(vm) = self.vms.get(i) else {
            return Ok(());
        };
        let bad = |why: String| ConfigError::Standby {
            vm: vm.name.clone(),
            why,
        };
        let before = &self.vms[..i];
        let Some(p) = before.iter().find(|o| o.name == primary) else {
            return Err(bad(format!("VM {primary:?} is not listed before it")));
        };
        if p.standby_for.is_some() {
            return Err(bad(format!("VM {primary:?} is a standby itself")));
        }
        if let Some(o) = before
            .iter()
            .find(|o| o.standby_for.as_deref() == Some(primary))
        {
            return Err(bad(format!(
                "VM {primary:?} already has a standby, {:?}",
                o.name
            )));
        }
        if (&vm.tenant, &vm.gids, vm.mac, vm.abi) != (&p.tenant, &p.gids, p.mac, p.abi)
            || !vm.cm_listen.is_empty()
        {
            return Err(bad(format!(
                "a standby has VM {primary:?}'s tenant, GIDs, MAC and ABI version and no cm_listen ports"
            )));
        }
        Ok(())
    }

    /// Checks the whole configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vms.is_empty() {
            return Err(ConfigError::NoSockets);
        }
        let threads = self.engine_threads;
        if threads == 0 || threads > MAX_ENGINE_THREADS {
            return Err(ConfigError::LimitOutOfRange {
                name: "engine_threads",
                value: threads as u64,
                min: 1,
                max: MAX_ENGINE_THREADS as u64,
            });
        }
        if !self.engine_cpus.is_empty() && self.engine_cpus.len() != threads {
            return Err(ConfigError::EngineCpus {
                cpus: self.engine_cpus.len(),
                threads,
            });
        }
        for t in &self.tenants {
            if let Some(engine) = t.engine.filter(|&e| e >= threads) {
                return Err(ConfigError::TenantEngine {
                    tenant: t.name.clone(),
                    engine,
                    threads,
                });
            }
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if self.tenants[..i].iter().any(|o| o.name == t.name) {
                return Err(ConfigError::DuplicateTenant(t.name.clone()));
            }
        }
        for (i, c) in self.qos_classes.iter().enumerate() {
            if self.qos_classes[..i].iter().any(|o| o.name == c.name) {
                return Err(ConfigError::DuplicateQosClass(c.name.clone()));
            }
            c.spec.validate().map_err(|e| ConfigError::QosClass {
                class: c.name.clone(),
                source: e,
            })?;
        }
        let class_known = |c: &Option<String>| {
            c.as_ref()
                .is_none_or(|n| self.qos_classes.iter().any(|q| &q.name == n))
        };
        for t in &self.tenants {
            if !class_known(&t.qos_class) {
                return Err(ConfigError::UnknownQosClass {
                    owner: format!("tenant {:?}", t.name),
                    class: t.qos_class.clone().unwrap_or_default(),
                });
            }
        }
        let mut gids = std::collections::HashMap::new();
        for (i, vm) in self.vms.iter().enumerate() {
            if !class_known(&vm.qos_class) {
                return Err(ConfigError::UnknownQosClass {
                    owner: format!("VM {:?}", vm.name),
                    class: vm.qos_class.clone().unwrap_or_default(),
                });
            }
            let before = &self.vms[..i];
            if before.iter().any(|o| o.socket == vm.socket) {
                return Err(ConfigError::DuplicateSocket(vm.socket.clone()));
            }
            if before.iter().any(|o| o.name == vm.name) {
                return Err(ConfigError::DuplicateVm(vm.name.clone()));
            }
            if !self.tenants.iter().any(|t| t.name == vm.tenant) {
                return Err(ConfigError::UnknownTenant {
                    vm: vm.name.clone(),
                    tenant: vm.tenant.clone(),
                });
            }
            if let Some(p) = &vm.standby_for {
                self.check_standby(i, p)?;
            }
            if let Some(mac) = vm.mac.filter(|_| vm.standby_for.is_none()) {
                check_mac(mac).map_err(|source| ConfigError::BadMac {
                    vm: vm.name.clone(),
                    mac: mac_text(mac),
                    source,
                })?;
                if let Some(other) = before.iter().find(|o| {
                    o.mac == Some(mac) && o.tenant == vm.tenant && o.standby_for.is_none()
                }) {
                    return Err(ConfigError::DuplicateMac {
                        vm: vm.name.clone(),
                        mac: mac_text(mac),
                        other: other.name.clone(),
                    });
                }
            }
            if vm.standby_for.is_none() {
                self.check_gids(i, &mut gids)?;
            }
            self.check_cm_listen(i)?;
            vm.limits.validate().map_err(|e| ConfigError::VmLimits {
                vm: vm.name.clone(),
                source: Box::new(e),
            })?;
        }
        if self.device_features & !IMPLEMENTED_FEATURES != 0 {
            return Err(ConfigError::UnsupportedFeatures(
                self.device_features & !IMPLEMENTED_FEATURES,
            ));
        }
        if self.ctrl_poll > MAX_CTRL_POLL {
            return Err(ConfigError::LimitOutOfRange {
                name: "ctrl-poll-us",
                value: u64::try_from(self.ctrl_poll.as_micros()).unwrap_or(u64::MAX),
                min: 0,
                max: 10_000,
            });
        }
        Ok(())
    }
}

/// Longest control-queue polling window.
pub const MAX_CTRL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

#[cfg(test)]
mod tests {

    #[test]
    fn fabric_defaults_force_priorities_on_a_host_rnic_only() {
        let p = FabricPolicy::default();
        assert_eq!(
            p.rules(true),
            [FieldRule::Force(0), FieldRule::Force(0), FieldRule::Any]
        );
        assert_eq!(
            p.rules(false),
            [FieldRule::Any, FieldRule::Any, FieldRule::Any]
        );
        let p = FabricPolicy {
            service_level: Some(FieldRule::Allow(vec![2])),
            ..FabricPolicy::default()
        };
        let [tc, sl, flow] = p.rules(true);
        assert_eq!(
            (tc.apply(7), sl.apply(2), sl.apply(3), flow.apply(9)),
            (Some(0), Some(2), None, Some(9))
        );
    }
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
        assert_eq!(Limits::default().page_size_cap & 0xfff, 0);
        assert_ne!(Limits::default().page_size_cap & (1 << 30), 0);
        assert_eq!(Limits::default().page_size_cap >> 31, 0);
    }

    /// [`ConfigError::limit_field`] finds a limit's field from its option
    /// name, and the advertised limits reach both wire structures.
    #[test]
    fn options_are_the_field_names_and_limits_are_advertised() {
        for (field, option) in Limits::OPTIONS {
            assert_eq!(option.replace('-', "_"), *field);
        }
        assert_eq!(Limits::OPTIONS.len(), 24);
        let l = Limits {
            max_qp: 7,
            max_qp_rd_atom: 3,
            max_mr_size: 1 << 20,
            ..Limits::default()
        };
        let (c, a) = (l.device_config(), l.device_attr());
        assert_eq!((c.abi_version, c.max_qp, c.mac), (ABI_VERSION, 7, [0; 6]));
        assert_eq!(
            (a.max_qp, a.max_qp_rd_atom, a.max_qp_init_rd_atom),
            (7, 3, 3)
        );
        assert_eq!(
            (c.max_mr_size, a.max_mr_size, a.max_mr_pages),
            (1 << 20, 1 << 20, 257)
        );
        assert_eq!(c.page_size_cap, a.page_size_cap);
    }

    #[test]
    fn tenants_without_an_engine_take_the_threads_in_turn() {
        let mut c = DaemonConfig::new(Vec::new());
        c.engine_threads = 3;
        for (name, engine) in [
            ("a", None),
            ("b", Some(0)),
            ("c", None),
            ("d", None),
            ("e", None),
        ] {
            c.tenants.push(TenantConfig {
                nic_share: 1,
                name: name.into(),
                qos_class: None,
                engine,
                remote_gids: Vec::new(),
                fabric: FabricPolicy::default(),
            });
        }
        let placed: Vec<usize> = (0..5).map(|t| c.tenant_engine(t)).collect();
        // "b" is placed by hand and does not take a turn.
        assert_eq!(placed, [0, 0, 1, 2, 0]);
        for (i, t) in ["e", "b", "c"].iter().enumerate() {
            c.add_default_vm(format!("/tmp/{i}.sock").into(), Limits::default());
            c.vms[i].tenant = (*t).into();
        }
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.vm_engines(), [0, 0, 1]);
        assert_eq!(c.engine_thread_cpus(), [None, None, None]);
        c.engine_cpus = vec![3, 2];
        assert_eq!(
            c.validate(),
            Err(ConfigError::EngineCpus {
                cpus: 2,
                threads: 3
            })
        );
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
        // Spec 5: 4 KiB pages are always accepted (drivers rely on it).
        let l = Limits {
            page_size_cap: 1 << 21,
            ..Limits::default()
        };
        assert!(matches!(
            l.validate(),
            Err(ConfigError::LimitOutOfRange {
                value: 0x20_0000,
                ..
            })
        ));
        let mut c = DaemonConfig::new(vec!["/a".into()]);
        // Bit 23: a device-specific bit no ABI version defines yet.
        c.device_features |= 1 << 23;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnsupportedFeatures(0x80_0000))
        ));
        let c = DaemonConfig::new(vec!["/a".into(), "/a".into()]);
        assert!(matches!(c.validate(), Err(ConfigError::DuplicateSocket(_))));
        assert_eq!(
            DaemonConfig::new(vec![]).validate(),
            Err(ConfigError::NoSockets)
        );
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into()]);
        c.vms[1].gids = vec![default_gid(0)];
        assert!(matches!(
            c.validate(),
            Err(ConfigError::DuplicateGid { .. })
        ));
        let mut c = DaemonConfig::new(vec!["/a".into()]);
        c.vms[0].limits.max_qp = 0;
        assert!(matches!(c.validate(), Err(ConfigError::VmLimits { .. })));
        c.vms[0].limits.max_qp = 1;
        c.vms[0].tenant = "x".into();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnknownTenant { .. })
        ));
        assert_eq!(gid_text(default_gid(0)), "::ffff:10.42.0.1");
    }

    #[test]
    fn mac_text_round_trips_and_bad_addresses_are_refused() {
        let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
        assert_eq!(parse_mac("52:54:00:AB:cd:ef"), Ok(mac));
        assert_eq!(parse_mac(" 52:54:00:ab:cd:ef "), Ok(mac));
        assert_eq!(mac_text(mac), "52:54:00:ab:cd:ef");
        // Locally administered addresses (bit 1) are what VMMs generate.
        assert_eq!(parse_mac("02:00:00:00:00:01"), Ok([2, 0, 0, 0, 0, 1]));
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:ef:01",
            "52-54-00-ab-cd-ef",
            "52:54:00:ab:cd:e",
            "52:54:00:ab:cd:eff",
            "52:54:00:ab:cd:+f",
            "52:54:00:ab:cd:xy",
            "525400abcdef",
            "52:54::ab:cd:ef",
        ] {
            assert_eq!(parse_mac(bad), Err(MacError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_mac("00:00:00:00:00:00"), Err(MacError::Zero));
        assert_eq!(parse_mac("01:00:5e:00:00:01"), Err(MacError::Multicast));
        assert_eq!(parse_mac("ff:ff:ff:ff:ff:ff"), Err(MacError::Multicast));
        assert_eq!(parse_mac("33:33:00:00:00:01"), Err(MacError::Multicast));
    }

    fn gid(text: &str) -> [u8; 16] {
        crate::config_file::parse_gid(text).unwrap()
    }

    /// The GID table of a VM (appendix A): ABI version 3 puts the default
    /// GID of its MAC at index 0 and its GIDs after it, IPv4-mapped first;
    /// ABI version 2 its one GID at index 0. Every entry is unique among
    /// the VMs, the default GIDs included.
    #[test]
    fn gid_tables_follow_abi_and_mac_and_are_unique() {
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into()]);
        c.vms[0].gids = vec![gid("fd00::1"), gid("10.0.0.1")];
        c.vms[0].mac = Some([0x52, 0x54, 0, 0, 0, 1]);
        assert_eq!(c.validate(), Ok(()));
        let t = c.gid_table(0);
        assert_eq!(t.len(), 16);
        assert_eq!(t.get(0), Some(gid("fe80::5054:ff:fe00:1")));
        assert_eq!(
            (t.get(1), t.get(2)),
            (Some(gid("10.0.0.1")), Some(gid("fd00::1")))
        );
        assert_eq!(c.gid(0), gid("10.0.0.1"));
        // VM 1: no MAC, the default GID of its index.
        let t = c.gid_table(1);
        assert_eq!((t.get(0), t.get(1)), (Some([0; 16]), Some(default_gid(1))));
        // ABI version 2: one entry, no default GID.
        c.vms[1].abi = 2;
        c.vms[1].mac = Some([0x52, 0x54, 0, 0, 0, 2]);
        let t = c.gid_table(1);
        assert_eq!((t.len(), t.get(0)), (1, Some(default_gid(1))));
        assert_eq!(c.validate(), Ok(()));
        // One GID at most with ABI version 2, 15 with version 3.
        c.vms[1].gids = vec![gid("10.0.0.2"), gid("10.0.0.3")];
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TooManyGids {
                count: 2,
                max: 1,
                ..
            })
        ));
        c.vms[1].abi = 3;
        assert_eq!(c.validate(), Ok(()));
        c.vms[1].gids = (0..16).map(|i| gid(&format!("10.1.0.{i}"))).collect();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TooManyGids {
                count: 16,
                max: 15,
                ..
            })
        ));
        c.vms[1].abi = 4;
        c.vms[1].gids.clear();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::BadAbi { abi: 4, .. })
        ));
        // Any entry twice: in another VM, in the same VM, or as another
        // VM's default GID.
        c.vms[1].abi = 3;
        for (gids, other) in [
            (vec![gid("10.2.0.1"), gid("fd00::1")], "vm0"),
            (vec![gid("10.2.0.1"), gid("::ffff:10.2.0.1")], "vm1"),
            (vec![gid("fe80::5054:ff:fe00:1")], "vm0"),
        ] {
            c.vms[1].gids = gids;
            match c.validate() {
                Err(ConfigError::DuplicateGid { other: o, .. }) => assert_eq!(o, other),
                r => panic!("{r:?}"),
            }
        }
    }

    /// A `cm_listen` port is one VM's: the check names the second VM and
    /// the first.
    #[test]
    fn cm_listen_ports_are_one_vms() {
        let mut c = DaemonConfig::new(vec!["/n/a.sock".into(), "/n/b.sock".into()]);
        c.vms[0].cm_listen = vec![7174];
        c.vms[1].cm_listen = vec![4420];
        c.validate().unwrap();
        c.vms[1].cm_listen.push(7174);
        match c.validate() {
            Err(ConfigError::CmListen { vm, port, why }) => {
                assert_eq!((vm.as_str(), port), ("vm1", 7174));
                assert!(why.contains("vm0"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Without a version-3 driver's bits for `abi = 2`; without `F_GSI`
    /// where the RNIC carries no MADs or UD is off.
    #[test]
    fn offered_features_follow_abi_and_rnic() {
        use virtio_rdma_abi::config::{F_GSI, F_SRQ};
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into()]);
        c.vms[1].abi = 2;
        use crate::rnic_objects::RnicObjects;
        let mut caps = crate::rnic::soft::SoftRnic::new().caps();
        c.device_features = V2_DEVICE_FEATURES | F_GSI;
        assert_eq!(c.vm_features(0, &caps), V2_DEVICE_FEATURES | F_GSI);
        assert_ne!(c.vm_features(0, &caps) & F_GSI, 0);
        assert_eq!(c.vm_features(1, &caps), V2_DEVICE_FEATURES);
        caps.gsi = false;
        assert_eq!(c.vm_features(0, &caps) & F_GSI, 0);
        caps.gsi = true;
        c.device_features &= !F_UD;
        assert_eq!(c.vm_features(0, &caps) & (F_GSI | F_UD), 0);
        assert_ne!(c.vm_features(0, &caps) & F_SRQ, 0);
    }

    #[test]
    fn macs_are_validated_per_vm_and_unique_per_tenant() {
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into()]);
        assert_eq!(c.validate(), Ok(()), "no MAC is fine");
        c.vms[0].mac = Some([0x52, 0x54, 0, 0, 0, 1]);
        c.vms[1].mac = Some([0x52, 0x54, 0, 0, 0, 2]);
        assert_eq!(c.validate(), Ok(()));
        c.vms[1].mac = Some([0; 6]);
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "VM \"vm1\": MAC address 00:00:00:00:00:00 is all zero; leave the MAC address out to pair no interface"
        );
        c.vms[1].mac = Some([0x01, 0, 0x5e, 0, 0, 1]);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::BadMac {
                source: MacError::Multicast,
                ..
            })
        ));
        // The same address twice in one tenant network is a mistake ...
        c.vms[1].mac = c.vms[0].mac;
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "VM \"vm1\": MAC address 52:54:00:00:00:01 is already the MAC address of VM \"vm0\" in the same tenant"
        );
        // ... and in separate networks too with ABI version 3: the MAC's
        // default GID would be in both GID tables (routing goes by GID);
        // with ABI version 2, which has no default GID, they may.
        c.tenants.push(TenantConfig {
            nic_share: 1,
            name: "red".into(),
            qos_class: None,
            engine: None,
            remote_gids: Vec::new(),
            fabric: FabricPolicy::default(),
        });
        c.vms[1].tenant = "red".into();
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "VM \"vm1\": GID fe80::5054:ff:fe00:1 is already a GID of VM \"vm0\""
        );
        c.vms[1].abi = 2;
        assert_eq!(c.validate(), Ok(()));
        // A host RNIC's ports have the host's GID, not the default GIDs.
        c.vms[1].abi = 3;
        c.rnic = RnicKind::Verbs;
        assert_eq!(c.validate(), Ok(()));
    }
}
