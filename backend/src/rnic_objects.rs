//! The object half of an RNIC: what the RNIC behind the devices provides
//! for the objects a VM creates.
//!
//! The device model (handles, validation, the tenant policy, the rings in
//! guest memory) is the same whatever moves the bytes. An [`RnicObjects`]
//! creates the host half of each object: QP numbers and memory keys, which
//! travel on the wire and so are the RNIC's to choose, and whatever a host
//! NIC needs behind a QP, CQ, SRQ, AH or MR. The control path calls it
//! under the VM's lock; the data-path half of an RNIC, which moves work
//! requests, is [`crate::rnic_path::RnicPath`].
//!
//! RNICs (`crate::rnic`): the software RNIC (VMs of one daemon, the
//! default) and a host RNIC through libibverbs (VMs on any host of the
//! fabric). Which one a daemon runs is [`RnicKind`], the configuration's
//! `rnic`.

use thiserror::Error;
use virtio_rdma_abi::qp::{AddressVector, QpAttr, QpState, QpType};

use crate::memory::PageList;
use crate::relocation::{HostState, MoveRecord};

/// Errors of an RNIC's object operations.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RnicError {
    /// A number space (QP numbers, memory keys) or a host table is full.
    #[error("host resources exhausted")]
    Exhausted,
    /// The system random source failed.
    #[error("random source failed")]
    Random,
    /// The host NIC refused the operation (an errno).
    #[error("host RNIC refused: errno {0}")]
    Host(i32),
    /// The command asks what the RNIC does not allow the QP (`INVALID`): a
    /// bridged QP aimed at another peer than its connection's.
    #[error("not allowed for this QP")]
    Invalid,
    /// The VM's part of the host is spent: its share of the host NIC's
    /// objects or of the daemon's mappings (`QUOTA` with this detail).
    #[error("the VM's host quota {0} is spent")]
    Quota(u32),
}

/// One line of a VM's part of the host ([`HostUsage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostQuota {
    /// What it counts: `maps` (memory mappings) or an object kind (`qp`,
    /// `cq`, `mr`, `pd`, `ah`, `srq`).
    pub kind: &'static str,
    /// The VM's configured limit (`max_host_mappings`, `max_qp`, ...).
    pub configured: u64,
    /// Its share of what the host has.
    pub share: u64,
    /// The limit in force: the smaller of the two.
    pub effective: u64,
    /// Held now.
    pub used: u64,
}

/// A VM's part of the host an RNIC gives it (a host RNIC's objects
/// and the daemon's mappings), for the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// One line per thing counted.
    pub rows: Vec<HostQuota>,
}

impl HostUsage {
    /// Adds `other` (another VM's) line by line.
    pub fn add(&mut self, other: &HostUsage) {
        for r in &other.rows {
            match self.rows.iter_mut().find(|x| x.kind == r.kind) {
                Some(x) => {
                    x.configured = x.configured.saturating_add(r.configured);
                    x.share = x.share.saturating_add(r.share);
                    x.effective = x.effective.saturating_add(r.effective);
                    x.used = x.used.saturating_add(r.used);
                }
                None => self.rows.push(*r),
            }
        }
    }
}

/// The RNICs a daemon can run (`[daemon] rnic`, `--rnic`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RnicKind {
    /// The built-in software RNIC: RDMA between the VMs of this daemon.
    #[default]
    Soft,
    /// A host RNIC through libibverbs: a real one, or Linux soft-RoCE
    /// (`rdma_rxe`); RDMA with VMs and hosts anywhere on the fabric.
    Verbs,
}

impl RnicKind {
    /// The name used in the configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            RnicKind::Soft => "soft",
            RnicKind::Verbs => "verbs",
        }
    }
}

/// Port and device properties the RNIC dictates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Largest path MTU (an `Mtu` value).
    pub max_mtu: u32,
    /// Link rate in Mbit/s.
    pub link_rate_mbps: u32,
    /// Whether atomics are supported.
    pub atomics: bool,
    /// Largest message in bytes (the port's `max_msg_size`); a longer one
    /// fails with `LOC_LEN_ERR` before any of it is looked at.
    pub max_msg_size: u32,
    /// `DeviceAttr.local_ca_ack_delay`: the longest time the RNIC
    /// takes to acknowledge a request, 4.096 µs × 2^value (0 to 31).
    pub local_ca_ack_delay: u32,
    /// `DeviceAttr.max_fast_reg_pages`: the most pages one fast
    /// registration may give an `ALLOC_MR` region. 0: the RNIC has no
    /// fast registration, and the device does not offer `F_MEM_MGT`.
    pub max_fast_reg_pages: u32,
    /// Whether the RNIC runs memory windows (`F_MW`, spec 18.29).
    pub windows: bool,
    /// Whether the RNIC runs UC QPs (`F_UC`, spec 18.11.6).
    pub uc: bool,
    /// Whether the RNIC runs UD multicast (`F_MCAST`, spec 18.11.7).
    pub mcast: bool,
    /// Whether the RNIC runs XRC (`F_XRC`, spec 18.11.8).
    pub xrc: bool,
    /// Whether CQs and SRQs may get new rings and regions new pages, PD
    /// and access (`F_RESIZE`, spec 12.19, 12.25, 12.26).
    pub resize: bool,
    /// The GID table each VM's port has on this RNIC.
    pub gids: PortGids,
    /// Whether the RNIC carries the MADs of a GSI QP (`F_GSI`, spec
    /// 18.26): the software RNIC between its VMs; a host RNIC when its CM
    /// bridge could open the host's `rdma_cm` (its QP 1 is the host's).
    pub gsi: bool,
    /// Whether the daemon itself makes every write into guest RAM, so that
    /// it can log them all for a migrating VMM (`VHOST_F_LOG_ALL`, spec
    /// 20.4): the software RNIC; not a host RNIC, which writes guest RAM by
    /// DMA the daemon does not see.
    pub dirty_log: bool,
}

/// The GID table an RNIC gives each VM's port (spec appendix A, D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortGids {
    /// The VM's own table, as configured: ABI version 3's default GID at
    /// index 0 and the operator's GIDs after it (the software RNIC, where
    /// every GID is a label in the daemon's virtual network).
    PerVm,
    /// One entry, index 0: the GID the RNIC sends everything from
    /// ([`RnicObjects::port_gid`]), the same for every VM (a host RNIC).
    Host,
}

impl Caps {
    /// The largest UD message payload: the MTU in bytes (`128 << mtu`).
    pub fn max_ud_payload(&self) -> u32 {
        128u32.checked_shl(self.max_mtu).unwrap_or(0)
    }

    /// The device feature bits an RNIC with these caps lets a device
    /// offer: all of them but `F_MEM_MGT` without fast registration,
    /// `F_MW` without memory windows and `F_UC` without UC.
    pub fn features(&self) -> u64 {
        use virtio_rdma_abi::config::{
            ALL_DEVICE_FEATURES, F_MCAST, F_MEM_MGT, F_MW, F_RESIZE, F_UC, F_XRC,
        };
        let mut features = ALL_DEVICE_FEATURES;
        if self.max_fast_reg_pages == 0 {
            features &= !F_MEM_MGT;
        }
        if !self.windows {
            features &= !F_MW;
        }
        if !self.uc {
            features &= !F_UC;
        }
        if !self.mcast {
            features &= !F_MCAST;
        }
        if !self.xrc {
            features &= !F_XRC;
        }
        if !self.resize {
            features &= !F_RESIZE;
        }
        features
    }
}

/// The VM object a host object belongs to: the VM's index in the daemon
/// and the object's handle there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    /// Index of the VM in the daemon.
    pub vm: usize,
    /// The object's handle in the VM's table.
    pub handle: u32,
    /// For a QP: its incarnation, a number the daemon never gives to
    /// another QP (a QP number may be, once its QP is destroyed), so that
    /// a peer connected to the QP tells it from a later one with the same
    /// number (spec 18.23). 0 for other objects.
    pub incarnation: u64,
}

/// The keys of a registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key; 0 when the region grants no remote access.
    pub rkey: u32,
}

/// A memory region to register, as the control path validated it.
#[derive(Debug, Clone, Copy)]
pub struct MrSpec<'a> {
    /// Its PD's handle.
    pub pd: u32,
    /// `access` flags of the spec.
    pub access: u32,
    /// The I/O virtual address the guest gave it.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Whether it needs an rkey (any remote access).
    pub remote: bool,
    /// Where its first byte is in its first page.
    pub first_page_offset: u32,
    /// Its guest pages (a host NIC registers a window over them:
    /// `memory::window`).
    pub pages: &'a PageList,
}

/// A QP to create, as the control path validated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSpec {
    /// RC or UD.
    pub qp_type: QpType,
    /// Its PD's handle.
    pub pd: u32,
    /// The handles of its send and receive CQs.
    pub send_cq: u32,
    /// See `send_cq`.
    pub recv_cq: u32,
    /// Its SRQ's handle, 0 for none.
    pub srq: u32,
    /// Send queue depth (WQEs).
    pub sq_depth: u32,
    /// Receive queue depth (WQEs; 0 with an SRQ).
    pub rq_depth: u32,
    /// Most SGEs of a send WQE.
    pub max_send_sge: u32,
    /// Most SGEs of a receive WQE.
    pub max_recv_sge: u32,
    /// Most inline bytes of a send WQE.
    pub max_inline_data: u32,
}

/// An SRQ to create, as the control path validated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqSpec {
    /// Its PD's handle.
    pub pd: u32,
    /// Depth (WQEs).
    pub depth: u32,
    /// Most SGEs of a receive WQE.
    pub max_sge: u32,
}

/// A QP state change the control path has validated (spec 13.3) and is
/// about to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpChange<'a> {
    /// The QP's number.
    pub qpn: u32,
    /// Its state now.
    pub from: QpState,
    /// Its state after the change.
    pub to: QpState,
    /// Its attributes after the change.
    pub attr: &'a virtio_rdma_abi::qp::QpAttr,
    /// The attribute mask of the command.
    pub mask: u32,
}

/// The host half of a VM's objects.
///
/// Object operations are called by the control path under the VM's lock,
/// after the command was validated; a refusal becomes the command's status
/// (`NO_MEMORY` for [`RnicError::Exhausted`], `QUOTA` for
/// [`RnicError::Quota`], `INTERNAL` otherwise).
/// A destroy cannot fail: the device model has released the object already.
pub trait RnicObjects: Send + Sync {
    /// Which RNIC this is.
    fn kind(&self) -> RnicKind;

    /// Port and device properties.
    fn caps(&self) -> Caps;

    /// Creates the host half of PD `owner` (a host NIC checks that a QP and
    /// the regions it uses share a PD). An RNIC with nothing behind a PD,
    /// a CQ, an SRQ or an AH (the software RNIC) keeps the defaults of
    /// these, which do nothing.
    fn create_pd(&self, _owner: Owner) -> Result<(), RnicError> {
        Ok(())
    }

    /// Destroys the host half of PD `owner` (nothing uses it any more).
    fn destroy_pd(&self, _owner: Owner) {}

    /// Creates the host half of QP `owner` (its PD, CQs and SRQ are `spec`'s
    /// handles in the same VM, created before) and returns its number,
    /// unique among all VMs of this RNIC; peers address the QP by it.
    fn create_qp(&self, owner: Owner, spec: &QpSpec) -> Result<u32, RnicError>;

    /// Applies a state change to QP `change.qpn` (a host NIC's QP follows
    /// the device's state machine).
    fn modify_qp(&self, change: &QpChange<'_>) -> Result<(), RnicError>;

    /// Destroys QP `qpn`; its number may be handed out again.
    fn destroy_qp(&self, qpn: u32);

    /// VM `vm` created its GSI QP (QP 1, which has no host half): an RNIC
    /// that serves the VM's MADs itself (a host RNIC's CM bridge) starts
    /// to, with the VM's listeners.
    fn gsi_created(&self, _vm: usize) {}

    /// VM `vm`'s GSI QP is gone (destroyed by the guest, or with every
    /// object at a device reset or disconnect): the VM's connection
    /// management ends with it.
    fn gsi_destroyed(&self, _vm: usize) {}

    /// The owner of QP number `qpn`, if it is live, as given to
    /// [`RnicObjects::create_qp`] (its incarnation included).
    fn lookup_qpn(&self, qpn: u32) -> Option<Owner>;

    /// Gives QP number `qpn` to `owner`'s QP as [`RnicObjects::create_qp`]
    /// would have (a loaded device state, spec 20.5); refused if the number
    /// is taken or the RNIC cannot choose its numbers.
    fn claim_qp(&self, _owner: Owner, _qpn: u32, _spec: &QpSpec) -> Result<(), RnicError> {
        Err(RnicError::Invalid)
    }

    /// Gives `keys` to `owner`'s region as [`RnicObjects::reg_mr`] would
    /// have; refused if one is taken or the RNIC cannot choose its keys.
    fn claim_mr(&self, _owner: Owner, _keys: MrKeys, _mr: &MrSpec<'_>) -> Result<(), RnicError> {
        Err(RnicError::Invalid)
    }

    /// Gives `key` to `owner`'s fast-registration region or window as
    /// [`RnicObjects::alloc_fast_mr`] would have.
    fn claim_fast_mr(&self, _owner: Owner, _key: u32) -> Result<(), RnicError> {
        Err(RnicError::Invalid)
    }

    /// Moves QP numbers `qpns` and XRC SRQ numbers `srqns`, and every
    /// multicast membership, from VM `from`'s objects to the objects with
    /// the same handles of VM `to` (a state moved between two instances of
    /// one VM in this daemon, spec 20.5). Refused, with nothing changed,
    /// if one of the numbers is not `from`'s.
    fn rehome(
        &self,
        _from: usize,
        _to: usize,
        _qpns: &[u32],
        _srqns: &[u32],
    ) -> Result<(), RnicError> {
        Err(RnicError::Invalid)
    }

    /// Gives XRC SRQ number `srqn` to `owner` as
    /// [`RnicObjects::alloc_srqn`] would have.
    fn claim_srqn(&self, _owner: Owner, _srqn: u32) -> Result<(), RnicError> {
        Err(RnicError::Invalid)
    }

    /// Whether the host halves of stopped VM `vm` are at rest since
    /// `since`: nothing they took is in flight, and the data path has
    /// applied every host completion (a host RNIC's NIC completes what it
    /// took after the device stopped). A state of the VM is saved only
    /// then (spec 20.8). An RNIC without host halves is always at rest.
    fn host_at_rest(&self, _vm: usize, _since: std::time::Instant) -> bool {
        true
    }

    /// The host halves of VM `vm`'s QPs for a saved state (spec 20.8):
    /// `None` for an RNIC without; refused while they are not at rest or
    /// when one cannot move.
    fn save_host(&self, _vm: usize) -> Result<Option<HostState>, RnicError> {
        Ok(None)
    }

    /// Whether a loaded state's QPs past INIT need the host halves' state
    /// (`save_host` of the source): a host RNIC.
    fn loads_host_state(&self) -> bool {
        false
    }

    /// Brings the host half of loaded QP `qpn` of VM `vm` (claimed with
    /// [`RnicObjects::claim_qp`]) into state `to` with the device's
    /// attributes `attr` and the source's host state `host` (spec 20.8).
    fn restore_qp(
        &self,
        _vm: usize,
        _qpn: u32,
        _to: QpState,
        _attr: &QpAttr,
        _host: Option<&HostState>,
    ) -> Result<(), RnicError> {
        Ok(())
    }

    /// The move record of VM `vm` (named `name`) after a state from
    /// another host was loaded into it: what its peers' daemons take.
    fn move_record(&self, _vm: usize, _name: &str) -> Option<MoveRecord> {
        None
    }

    /// How VM `vm`'s QPs are known on the wire now: the GID they send
    /// from and each QP's device number with its host number (what a
    /// peer's daemon holds with [`RnicObjects::peer_hold`] before the VM
    /// moves); `None` for an RNIC whose numbers never leave the daemon.
    fn wire_qps(&self, _vm: usize) -> Option<crate::relocation::WireQps> {
        None
    }

    /// Holds this RNIC's connections to QPs `qpns` of GID `gid` (a VM
    /// about to move) until `until`; how many. An RNIC whose VMs are all
    /// its own (the software RNIC) has none to hold.
    fn peer_hold(&self, _gid: [u8; 16], _qpns: &[u32], _until: std::time::Instant) -> usize {
        0
    }

    /// Takes the move record of a peer VM: its connections here go to
    /// the new place; how many are pointed anew.
    fn peer_moved(&self, _record: &MoveRecord) -> Result<usize, String> {
        Err("this RNIC's VMs have no peers on other hosts".into())
    }

    /// QP numbers in use (for leak checks and statistics).
    fn qpns_in_use(&self) -> usize;

    /// Creates the host half of CQ `owner` of `depth` entries.
    fn create_cq(&self, _owner: Owner, _depth: u32) -> Result<(), RnicError> {
        Ok(())
    }

    /// Destroys the host half of CQ `owner`.
    fn destroy_cq(&self, _owner: Owner) {}

    /// Creates the host half of SRQ `owner`.
    fn create_srq(&self, _owner: Owner, _spec: &SrqSpec) -> Result<(), RnicError> {
        Ok(())
    }

    /// Destroys the host half of SRQ `owner`.
    fn destroy_srq(&self, _owner: Owner) {}

    /// A number for XRC SRQ `owner` (`F_XRC`), unique on the RNIC; an RNIC
    /// without XRC refuses.
    fn alloc_srqn(&self, _owner: Owner) -> Result<u32, RnicError> {
        Err(RnicError::Host(libc::EOPNOTSUPP))
    }

    /// Gives back an XRC SRQ's number.
    fn free_srqn(&self, _srqn: u32) {}

    /// Creates the host half of AH `owner` of PD `pd` for `av`.
    fn create_ah(&self, _owner: Owner, _pd: u32, _av: &AddressVector) -> Result<(), RnicError> {
        Ok(())
    }

    /// Destroys the host half of AH `owner`.
    fn destroy_ah(&self, _owner: Owner) {}

    /// Registers MR `owner` and returns its keys: non-zero, not in use by
    /// another live region of the RNIC, and as hard to guess as the
    /// RNIC can make them (a peer that could guess an rkey could
    /// reach memory it was never given).
    fn reg_mr(&self, owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError>;

    /// Deregisters the region with `keys`; they may be handed out again.
    fn dereg_mr(&self, keys: MrKeys);

    /// Re-registers the region with `keys` as `mr` now is (`REREG_MR`,
    /// spec 12.26): the lkey stays, the rkey stays once the region has
    /// one, and one is drawn when `mr` first needs it. Returns the keys.
    /// An RNIC without `Caps::resize` refuses, and the region is as it
    /// was.
    fn rereg_mr(
        &self,
        _owner: Owner,
        _keys: MrKeys,
        _mr: &MrSpec<'_>,
    ) -> Result<MrKeys, RnicError> {
        Err(RnicError::Invalid)
    }

    /// Draws the key of fast-registration region `owner` (`ALLOC_MR`,
    /// `F_MEM_MGT`; spec 12.22): its lkey and rkey. Bits 31 to 8 are
    /// unique among every live key of the RNIC, whatever their bits 7 to
    /// 0 (the consumer byte, which the guest changes at each registration),
    /// and never those of [`crate::keys::LOCAL_DMA_LKEY`]. An RNIC without
    /// fast registration (`Caps::max_fast_reg_pages` 0) refuses.
    fn alloc_fast_mr(&self, owner: Owner) -> Result<u32, RnicError>;

    /// Frees the key of a fast-registration region (`key`'s bits 31 to 8;
    /// its consumer byte does not matter).
    fn free_fast_mr(&self, key: u32);

    /// Memory keys in use (lkeys and rkeys; for leak checks).
    fn keys_in_use(&self) -> usize;

    /// VM `vm`'s guest RAM is now `mem` (`None`: unmapped, its VMM gone),
    /// after a memory table update; called with the VM's lock held, before
    /// any of its objects is created over the new map. An RNIC whose
    /// regions are windows over guest pages makes them again. The software
    /// RNIC reads guest RAM through the VM's own map and ignores it.
    fn set_memory(&self, _vm: usize, _mem: Option<&crate::memory::GuestRam>) {}

    /// After [`RnicObjects::set_memory`], for each of the VM's regions: the
    /// region with `keys` is `mr` over the new map. An RNIC whose
    /// regions hold guest pages keeps a region whose pages are still the
    /// same and drops the host registration of one whose pages moved or
    /// left guest RAM (it must not keep them); false then, and accesses
    /// with its keys fail from now on.
    fn remap_mr(&self, _keys: MrKeys, _mr: &MrSpec<'_>) -> bool {
        true
    }

    /// Attaches UD QP `owner` to multicast group `mgid` (`F_MCAST`); an
    /// RNIC without multicast refuses.
    fn mcast_attach(&self, _owner: Owner, _mgid: &[u8; 16]) -> Result<(), RnicError> {
        Err(RnicError::Host(libc::EOPNOTSUPP))
    }

    /// Detaches UD QP `owner` from group `mgid` (if attached).
    fn mcast_detach(&self, _owner: Owner, _mgid: &[u8; 16]) {}

    /// The QPs attached to group `mgid`, into `out` (cleared first).
    fn mcast_members(&self, _mgid: &[u8; 16], out: &mut Vec<Owner>) {
        out.clear();
    }

    /// Whether the port is up (a host RNIC's follows its host port).
    fn port_active(&self) -> bool {
        true
    }

    /// The GID VM `vm`'s port must have, if the RNIC dictates it (a
    /// host RNIC sends from its own address); `None`: the configured one.
    fn port_gid(&self, _vm: usize) -> Option<[u8; 16]> {
        None
    }

    /// VM `vm`'s part of the host (a host RNIC's object shares and the
    /// mapping budget); `None` for an RNIC that has no such limits.
    fn host_usage(&self, _vm: usize) -> Option<HostUsage> {
        None
    }
}
