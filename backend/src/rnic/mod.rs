//! The RNICs behind the devices, each with both of its halves: the object
//! half ([`crate::rnic_objects::RnicObjects`]: QP numbers, keys, host
//! objects) and the data path ([`crate::rnic_path::RnicPath`]) that the
//! engine's threads run.
//!
//! - [`soft`]: the built-in software RNIC, RDMA between the VMs of one
//!   daemon (the default);
//! - [`verbs`]: a host RNIC through libibverbs (cargo feature `verbs`;
//!   its per-VM quotas are plain arithmetic and always built);
//! - [`directory`]: randomly drawn QP numbers and keys, unique across the
//!   VMs of an RNIC;
//! - [`Rnic`] (here): the RNIC the configuration names (`rnic`), opened,
//!   and how the engine's threads start its data path.

pub mod directory;
pub mod verbs;
guest_facing!(soft);

use std::sync::Arc;

use thiserror::Error;

use crate::config::DaemonConfig;
use crate::engine::{Engine, Launch};
use crate::rnic_objects::{Caps, RnicKind, RnicObjects};
use soft::{SoftPath, SoftRnic};

/// Errors opening the RNIC the configuration names.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The host RDMA device of the `verbs` RNIC cannot be used.
    #[cfg(feature = "verbs")]
    #[error("--rnic verbs: {0}")]
    Verbs(#[from] verbs::device::VerbsError),
    /// `--rnic verbs` in a build without it.
    #[cfg(not(feature = "verbs"))]
    #[error(
        "--rnic verbs: this vhost-user-rdma was built without the verbs transport \
         (cargo feature `verbs`, on by default; it needs libibverbs and libclang to build)"
    )]
    NoVerbs,
    /// A thread could not be spawned, or the mapping budget read.
    #[error("cannot spawn a thread: {0}")]
    Spawn(std::io::Error),
}

/// The data path an [`Rnic`] starts on each engine thread.
enum Path {
    /// The software RNIC's, over whatever object half the RNIC has.
    Soft,
    /// The libibverbs RNIC's, over its own object half.
    #[cfg(feature = "verbs")]
    Verbs(Arc<verbs::VerbsRnic>),
}

/// An RNIC: its object half, which the control path uses, and the data
/// path the engine's threads run ([`Launch`]).
pub struct Rnic {
    objects: Arc<dyn RnicObjects>,
    path: Path,
}

impl Rnic {
    /// Opens the RNIC `config` names (`rnic`): the software RNIC, or the
    /// host device of the `verbs` one (with its event thread started).
    pub fn open(config: &DaemonConfig) -> Result<Rnic, OpenError> {
        match config.rnic {
            RnicKind::Soft => Ok(Rnic::soft(Arc::new(SoftRnic::new()))),
            #[cfg(not(feature = "verbs"))]
            RnicKind::Verbs => Err(OpenError::NoVerbs),
            #[cfg(feature = "verbs")]
            RnicKind::Verbs => open_verbs(config),
        }
    }

    /// The software RNIC's data path over `objects`: the software RNIC's
    /// object half, or a wrapper of it (tests and the fuzzing harness hand
    /// a freed QP number out again at once, or count host halves).
    pub fn soft(objects: Arc<dyn RnicObjects>) -> Rnic {
        Rnic {
            objects,
            path: Path::Soft,
        }
    }

    /// The object half.
    pub fn objects(&self) -> &Arc<dyn RnicObjects> {
        &self.objects
    }
}

impl Launch for Rnic {
    fn caps(&self) -> Caps {
        self.objects.caps()
    }

    fn run(&self, engine: &Engine) {
        match &self.path {
            Path::Soft => engine.run(&SoftPath::new(self.objects.as_ref(), engine.tenancy())),
            #[cfg(feature = "verbs")]
            Path::Verbs(rnic) => engine.run(&verbs::VerbsPath::new(rnic, engine.tenancy())),
        }
    }
}

/// Opens the host device `config.verbs` names and starts its event thread.
#[cfg(feature = "verbs")]
fn open_verbs(config: &DaemonConfig) -> Result<Rnic, OpenError> {
    use log::{info, warn};
    use verbs::{device::VerbsDevice, events, VerbsRnic};

    let v = &config.verbs;
    let dev = VerbsDevice::open(v.device.as_deref(), v.port, v.gid_index)?;
    if !dev.port_active() {
        warn!("{} port {}: not active (yet)", dev.name(), dev.port());
    }
    let budget = crate::memory::window::MapBudget::from_system().map_err(OpenError::Spawn)?;
    let plan = quota_plan(config);
    let mut rnic = VerbsRnic::new(dev, &plan, budget)?;
    let cm = config
        .vms
        .iter()
        .map(|v| verbs::cm_hub::VmCm {
            listen: v.cm_listen.clone(),
            connections: v.limits.cm_connections as usize,
        })
        .collect();
    // The GSI QP (F_GSI) needs the host's rdma_cm on the port's address.
    match rnic.enable_cm(cm) {
        Ok(()) => info!("rnic: GSI QPs offered, their CM bridged to the host's rdma_cm"),
        Err(e) => warn!(
            "rnic: GSI QPs (F_GSI) not offered: the host's rdma_cm cannot be used on GID {}: {e}",
            crate::config::gid_text(rnic.device().gid().0)
        ),
    }
    let rnic = Arc::new(rnic);
    events::start(&rnic).map_err(OpenError::Spawn)?;
    verbs::cm_events::start(&rnic).map_err(OpenError::Spawn)?;
    let (gid, index) = rnic.device().gid();
    info!(
        "rnic: libibverbs on {} port {}, GID {} (index {index})",
        rnic.device().name(),
        rnic.device().port(),
        crate::config::gid_text(gid)
    );
    Ok(Rnic {
        objects: rnic.clone(),
        path: Path::Verbs(rnic),
    })
}

/// What the `verbs` RNIC needs of the configuration to give each VM its
/// share of the host: tenants and their `nic_share`, the VMs' limits.
#[cfg(feature = "verbs")]
fn quota_plan(config: &DaemonConfig) -> verbs::quota::Plan {
    let tenant = |name: &str| {
        config
            .tenants
            .iter()
            .position(|t| t.name == name)
            .unwrap_or(0)
    };
    verbs::quota::Plan {
        vm_tenant: config.vms.iter().map(|v| tenant(&v.tenant)).collect(),
        tenant_weights: config.tenants.iter().map(|t| t.nic_share).collect(),
        configured: config
            .vms
            .iter()
            .map(|v| {
                let l = &v.limits;
                [l.max_qp, l.max_cq, l.max_mr, l.max_pd, l.max_ah, l.max_srq].map(u64::from)
            })
            .collect(),
        max_mappings: config
            .vms
            .iter()
            .map(|v| v.limits.max_host_mappings)
            .collect(),
    }
}
