//! Starting the real daemon for a test: one in-process [`Daemon`] serving
//! a socket per VM in a private temporary directory, and test VMs connected
//! to it over the real vhost-user protocol.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vhost_user_rdma::config::TenantConfig;
use vhost_user_rdma::qos::QosSpec;
use vhost_user_rdma::rnic::Rnic;
use vhost_user_rdma::rnic_objects::RnicObjects;
use vhost_user_rdma::stats::TrafficStats;
use vhost_user_rdma::tenancy::IsolationStats;
use vhost_user_rdma::Daemon;
use vhost_user_rdma::{DaemonConfig, Limits, VmStats};

use crate::error::{Error, Result};
use crate::vmm::{TestVmm, VmmOptions};

/// The environment variable that runs the tests' daemons on a host RDMA
/// device instead of the software RNIC: `verbs:DEVICE:GID_INDEX`
/// (`scripts/qemu-rxe.sh` runs the data-path tests so, on Linux
/// soft-RoCE in a guest).
pub const RNIC_ENV: &str = "VUR_TEST_RNIC";

/// Whether the tests' daemons run on a host RDMA device ([`RNIC_ENV`]):
/// where the spec lets behaviour depend on the RNIC (appendix D), a
/// test checks the software RNIC's only there.
pub fn on_host_rnic() -> bool {
    std::env::var_os(RNIC_ENV).is_some()
}

/// Applies [`RNIC_ENV`] to `config`.
fn rnic_from_env(config: &mut DaemonConfig) -> Result<()> {
    let Ok(spec) = std::env::var(RNIC_ENV) else {
        return Ok(());
    };
    let bad = || Error::Backend(format!("{RNIC_ENV}={spec:?}: want verbs:DEVICE:GID_INDEX"));
    let mut parts = spec.split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("verbs"), Some(device), Some(index), None) => {
            config.rnic = vhost_user_rdma::rnic_objects::RnicKind::Verbs;
            config.verbs.device = Some(device.to_string());
            config.verbs.gid_index = index.parse().map_err(|_| bad())?;
            Ok(())
        }
        _ => Err(bad()),
    }
}

/// A running daemon with its sockets.
pub struct TestDaemon {
    daemon: Option<Daemon>,
    dir: PathBuf,
    sockets: Vec<PathBuf>,
}

impl TestDaemon {
    /// Starts a daemon serving `vms` sockets with default limits.
    pub fn start(vms: usize) -> Result<Self> {
        Self::with_limits(vms, Limits::default())
    }

    /// Starts a daemon serving `vms` sockets with `limits`.
    pub fn with_limits(vms: usize, limits: Limits) -> Result<Self> {
        Self::with_config(vms, |c| c.set_limits(limits))
    }

    /// Starts a daemon serving `vms` sockets; `configure` may change the
    /// configuration (limits, polling) before it starts.
    pub fn with_config(vms: usize, configure: impl FnOnce(&mut DaemonConfig)) -> Result<Self> {
        Self::from_config(|dir| {
            let sockets = (0..vms).map(|i| dir.join(format!("vm{i}.sock"))).collect();
            let mut config = DaemonConfig::new(sockets);
            configure(&mut config);
            Ok(config)
        })
    }

    /// Starts a daemon serving `vms` sockets and, as its last instance
    /// (socket `vms`), a standby of VM 0 (spec 20.5) on `vm0.standby`.
    pub fn with_standby(vms: usize) -> Result<Self> {
        Self::with_config(vms, |c| {
            let socket = c.vms[0].socket.with_extension("standby");
            c.add_standby(0, socket);
        })
    }

    /// Starts a daemon with the configuration `make` returns; `make` gets
    /// the private directory to put sockets (and files) in.
    pub fn from_config(make: impl FnOnce(&Path) -> Result<DaemonConfig>) -> Result<Self> {
        Self::from_config_on(make, None)
    }

    /// Starts a daemon serving `vms` sockets of one tenant on the software
    /// RNIC's data path over `objects` (a wrapper of its object half)
    /// instead of the RNIC its configuration names.
    pub fn with_soft_rnic(vms: usize, objects: Arc<dyn RnicObjects>) -> Result<Self> {
        Self::from_config_on(
            |dir| {
                let sockets = (0..vms).map(|i| dir.join(format!("vm{i}.sock"))).collect();
                Ok(DaemonConfig::new(sockets))
            },
            Some(Rnic::soft(objects)),
        )
    }

    fn from_config_on(
        make: impl FnOnce(&Path) -> Result<DaemonConfig>,
        rnic: Option<Rnic>,
    ) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "vhost-user-rdma-test-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: "create socket directory",
            source,
        })?;
        let started = make(&dir).and_then(|mut config| {
            if rnic.is_none() {
                rnic_from_env(&mut config)?;
            }
            let sockets: Vec<PathBuf> = config.vms.iter().map(|v| v.socket.clone()).collect();
            let daemon = match rnic {
                Some(r) => Daemon::start_with_rnic(config, r),
                None => Daemon::start(config),
            }
            .map_err(|e| Error::Backend(e.to_string()))?;
            Ok((daemon, sockets))
        });
        match started {
            Ok((daemon, sockets)) => Ok(TestDaemon {
                daemon: Some(daemon),
                dir,
                sockets,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Private directory of this daemon (its sockets are in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Socket of VM `i`.
    pub fn socket(&self, i: usize) -> &Path {
        &self.sockets[i.min(self.sockets.len().saturating_sub(1))]
    }

    /// Connects a test VM to socket `i` with default options.
    pub fn connect(&self, i: usize) -> Result<TestVmm> {
        TestVmm::connect(self.socket(i), VmmOptions::default())
    }

    /// Connects a test VM to socket `i` with `opts`.
    pub fn connect_with(&self, i: usize, opts: VmmOptions) -> Result<TestVmm> {
        TestVmm::connect(self.socket(i), opts)
    }

    /// The daemon.
    pub fn daemon(&self) -> &Daemon {
        // Present until drop.
        self.daemon.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// Changes VM `vm`'s QoS settings and returns once the engine enforces
    /// them, so that work posted next runs under them.
    pub fn set_vm_qos(&self, vm: usize, spec: QosSpec) -> Result<()> {
        self.daemon()
            .qos()
            .set_vm(vm, spec)
            .map_err(|e| Error::Daemon(format!("set_vm({vm}): {e}")))?;
        self.sync_qos()
    }

    /// Changes tenant `tenant`'s QoS settings and returns once the engine
    /// enforces them.
    pub fn set_tenant_qos(&self, tenant: usize, spec: QosSpec) -> Result<()> {
        self.daemon()
            .qos()
            .set_tenant(tenant, spec)
            .map_err(|e| Error::Daemon(format!("set_tenant({tenant}): {e}")))?;
        self.sync_qos()
    }

    fn sync_qos(&self) -> Result<()> {
        if self.daemon().sync_qos(Duration::from_secs(10)) {
            Ok(())
        } else {
            Err(Error::Daemon(
                "the engine did not apply a QoS change within 10 s".into(),
            ))
        }
    }

    /// Statistics of VM `i`.
    pub fn stats(&self, i: usize) -> VmStats {
        self.daemon().vm_stats(i).unwrap_or_default()
    }

    /// Isolation counters of VM `i` (zero for a VM outside the table).
    pub fn isolation(&self, i: usize) -> IsolationStats {
        self.daemon()
            .tenancy()
            .counters(i)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    /// Traffic and control counters of VM `i`.
    pub fn traffic(&self, i: usize) -> TrafficStats {
        self.daemon()
            .tenancy()
            .traffic(i)
            .map(|t| t.snapshot())
            .unwrap_or_default()
    }

    /// Statistics of VM `i` once the daemon shows it connected with at
    /// least `n` connections counted (waits up to 5 s).
    pub fn stats_connected(&self, i: usize, n: u64) -> VmStats {
        // The daemon marks a VM connected and counts the connection right
        // after its accept, while the connection's own thread may already
        // be answering the VMM: a VMM can finish its handshake first.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = self.stats(i);
            if (s.connected && s.connections >= n) || std::time::Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Waits (up to 5 s) until the daemon counts VM `i` as connected: its
    /// serving thread records the connection after the connection's
    /// workers started, so a VMM may already be talking to the device
    /// before. Returns the statistics then.
    pub fn wait_connected(&self, i: usize) -> VmStats {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = self.stats(i);
            if s.connected || std::time::Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Waits (up to 5 s) until VM `i` is disconnected and its resources are
    /// released; returns the final statistics.
    pub fn wait_released(&self, i: usize) -> VmStats {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = self.stats(i);
            if (!s.connected && s.device.resources.is_empty())
                || std::time::Instant::now() > deadline
            {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Adds tenant `name` to `config` (no QoS class, engine thread chosen by
/// the daemon) and moves VMs `vms` into it; returns the tenant, for settings
/// beyond those.
pub fn add_tenant<'c>(
    config: &'c mut DaemonConfig,
    name: &str,
    vms: &[usize],
) -> &'c mut TenantConfig {
    for &i in vms {
        config.vms[i].tenant = name.into();
    }
    config.tenants.push(TenantConfig {
        nic_share: 1,
        name: name.into(),
        qos_class: None,
        engine: None,
        remote_gids: Vec::new(),
        fabric: Default::default(),
    });
    let last = config.tenants.len() - 1;
    &mut config.tenants[last]
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
