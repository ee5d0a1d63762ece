//! Serving vhost-user sockets: one listener thread per VM socket, all in one
//! process and sharing the RNIC engine threads (a tenant's VMs on one).
//! When a VMM disconnects, everything
//! its VM held is released and the socket accepts the next connection.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use log::{error, info, warn};
use thiserror::Error;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as BackendError, VhostUserDaemon};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;

use crate::config::{ConfigError, DaemonConfig};
use crate::device::{RdmaDevice, Shared, EVENT_WAKE};
use crate::engine::{EnginePlan, Engines};
use crate::gid_table::GidTable;
use crate::handover::give::{give, OpsPorts, VmPort};
use crate::handover::hold::AcceptHold;
use crate::handover::internal::{connect_handler, InternalError, PrivateDir};
use crate::handover::listen::Giver;
use crate::handover::relay::{Link, Relay};
use crate::handover::{rings, take, HandoverServer};
use crate::keys::KeySource;
use crate::qos::QosTable;
use crate::rnic::{OpenError, Rnic};
use crate::rnic_objects::{Caps, PortGids, RnicError, RnicObjects};
use crate::sync::lock;
use crate::tenancy::Tenancy;
use crate::view::{DaemonView, VmSlot, VmStats};
use crate::vm::PortIdentity;
use crate::vring::{observe_new_vrings, QueueObserver};

/// Errors starting the daemon.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The RNIC behind the devices could not start.
    #[error("cannot start the RNIC: {0}")]
    Rnic(#[from] RnicError),
    /// The RNIC the configuration names cannot be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: VhostUserError,
    },
    /// A thread could not be spawned.
    #[error("cannot spawn a thread: {0}")]
    Spawn(std::io::Error),
    /// The management socket could not be set up.
    #[error(transparent)]
    Mgmt(#[from] crate::mgmt::MgmtError),
    /// The metrics listener could not be set up.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The hand-over socket could not be set up.
    #[error(transparent)]
    HandoverSocket(#[from] crate::handover::HandoverError),
    /// Taking the VMs over from the running daemon failed (it serves on).
    #[error("hand-over: {0}")]
    HandOver(String),
}

/// A running daemon.
pub struct Daemon {
    slots: Vec<Arc<VmSlot>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    objects: Arc<dyn RnicObjects>,
    engines: Arc<Engines>,
    shared: Shared,
    mgmt: Option<crate::mgmt::MgmtServer>,
    metrics: Option<crate::metrics::MetricsServer>,
    handover: Option<HandoverServer>,
    dir: Arc<PrivateDir>,
    /// Each VM's name and identity ([`vm_identity`]), for a hand-over.
    names: Vec<(String, String)>,
}

/// The port identity of VM `index`: its GID table and a random GUID.
fn port_identity(
    index: usize,
    gids: GidTable,
    keys: &mut KeySource,
) -> Result<PortIdentity, RnicError> {
    let hi = keys.next_u32().map_err(|_| RnicError::Random)?;
    let lo = keys.next_u32().map_err(|_| RnicError::Random)?;
    // A locally administered, unicast EUI-64.
    let guid = ((u64::from(hi) << 32) | u64::from(lo)) & !(1 << 56) | (1 << 57);
    Ok(PortIdentity {
        gids,
        guid,
        vm: index,
    })
}

/// The GID table of VM `index`'s port on the RNIC of `objects`: the
/// configured one, or the GID the RNIC sends from (its `caps` say which).
fn port_gids(
    config: &DaemonConfig,
    objects: &dyn RnicObjects,
    caps: &Caps,
    index: usize,
) -> GidTable {
    match (caps.gids, objects.port_gid(index)) {
        (PortGids::Host, Some(gid)) => GidTable::single(gid),
        _ => config.gid_table(index),
    }
}

/// VM `index`'s name, and what else the VMs it talks to and its guest know
/// it by (tenant, configured GIDs, paired MAC): a successor must have the
/// same for each VM it takes over.
fn vm_identity(config: &DaemonConfig, index: usize) -> (String, String) {
    let Some(vm) = config.vms.get(index) else {
        return (String::new(), String::new());
    };
    let identity = format!(
        "tenant {}, GIDs {}, MAC {}",
        vm.tenant,
        gids_text(&config.gid_table(index)),
        vm.mac
            .map_or_else(|| "none".into(), crate::config::mac_text)
    );
    (vm.name.clone(), identity)
}

/// The assigned entries of a GID table as text, `index=gid` each.
fn gids_text(t: &GidTable) -> String {
    let all: Vec<String> = t
        .iter()
        .map(|(i, g)| format!("{i}={}", crate::config::gid_text(g)))
        .collect();
    all.join(" ")
}

impl Daemon {
    /// Validates the configuration, binds every socket and starts serving
    /// on the RNIC the configuration names (`rnic`).
    pub fn start(config: DaemonConfig) -> Result<Daemon, ServerError> {
        let rnic = Rnic::open(&config)?;
        Self::start_with_rnic(config, rnic)
    }

    /// [`Daemon::start`] on `rnic` (tests and the fuzzing harness run the
    /// software RNIC's data path over a wrapper of its object half, e.g.
    /// to hand a freed QP number out again at once: [`Rnic::soft`]).
    pub fn start_with_rnic(config: DaemonConfig, rnic: Rnic) -> Result<Daemon, ServerError> {
        let mut daemon = Self::start_serving(&config, rnic, (Vec::new(), None))?;
        if let Err(e) = daemon.start_operations(&config, None) {
            daemon.shutdown();
            return Err(e);
        }
        Ok(daemon)
    }

    /// Takes every VM over from the daemon serving the configuration's
    /// hand-over socket (a live upgrade, spec 20.7): the same VMs, sockets
    /// and connections, each device's state loaded and its rings started
    /// where they stopped. Until this daemon says it is ready, a failure
    /// leaves the running daemon serving.
    pub fn take_over(config: DaemonConfig) -> Result<Daemon, ServerError> {
        config.validate()?;
        let path = config
            .handover_socket
            .clone()
            .ok_or_else(|| ServerError::HandOver("no hand-over socket configured".into()))?;
        let began = std::time::Instant::now();
        let mut s = UnixStream::connect(&path)
            .map_err(|e| ServerError::HandOver(format!("cannot reach {}: {e}", path.display())))?;
        let vms: Vec<take::Expected> = config
            .vms
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let (name, identity) = vm_identity(&config, i);
                take::Expected {
                    name,
                    socket: v.socket.clone(),
                    identity,
                }
            })
            .collect();
        let _ = s.set_read_timeout(Some(crate::handover::listen::STALL));
        let _ = s.set_write_timeout(Some(crate::handover::listen::STALL));
        let (inherited, gate, ops) = take::receive(&mut s, &vms).map_err(ServerError::HandOver)?;
        let connected = inherited.iter().filter(|i| i.adoption.is_some()).count();
        let started = Rnic::open(&config)
            .map_err(ServerError::from)
            .and_then(|rnic| Self::start_serving(&config, rnic, (inherited, Some(gate.clone()))));
        let mut daemon = match started {
            Ok(d) => d,
            Err(e) => {
                take::abandon(&mut s, &gate, &e.to_string());
                return Err(e);
            }
        };
        take::finish(&mut s, &gate).map_err(ServerError::HandOver)?;
        // From the request to the commit: the VMs' rings stopped within
        // it (the blackout guests and peers see, at most).
        let blackout = began.elapsed();
        info!(
            "took over {} VMs ({connected} connected) from the daemon on {} in {} ms",
            vms.len(),
            path.display(),
            blackout.as_millis()
        );
        daemon.start_operations(&config, Some(ops))?;
        Ok(daemon)
    }

    /// Starts the engines and a serving thread per VM: on a new listening
    /// socket, or on the one `inherited` gives for it (a hand-over).
    fn start_serving(
        config: &DaemonConfig,
        rnic: Rnic,
        (inherited, gate): (Vec<take::Inherited>, Option<Arc<take::Gate>>),
    ) -> Result<Daemon, ServerError> {
        config.validate()?;
        let objects = rnic.objects().clone();
        let caps = objects.caps();
        let tables: Vec<GidTable> = (0..config.vms.len())
            .map(|i| port_gids(config, objects.as_ref(), &caps, i))
            .collect();
        let tenancy = Arc::new(Tenancy::with_gid_tables(config, &tables));
        crate::logging::register_vms(&tenancy);
        let mut shared = Shared::new(
            tenancy,
            Arc::new(QosTable::new(
                config
                    .vms
                    .iter()
                    .map(|v| config.qos_spec(v.qos_class.as_deref()))
                    .collect(),
                config
                    .tenants
                    .iter()
                    .map(|t| config.tenant_qos_spec(t.qos_class.as_deref()))
                    .collect(),
            )),
        );
        shared.allow_unsealed_memory = config.allow_unsealed_memory;
        let engines = Arc::new(
            Engines::start(
                Arc::new(rnic),
                shared.tenancy.clone(),
                shared.qos.clone(),
                EnginePlan::from_config(config),
            )
            .map_err(ServerError::Spawn)?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let dir = Arc::new(PrivateDir::create().map_err(ServerError::Spawn)?);
        let mut keys = KeySource::new();
        let mut slots = Vec::new();
        let mut threads = Vec::new();
        let mut inherited = inherited.into_iter();
        for (index, vm) in config.vms.iter().enumerate() {
            let path = &vm.socket;
            let (listener, adoption) = match inherited.next() {
                Some(i) => (
                    Listener::from(std::os::unix::net::UnixListener::from(i.listener)),
                    i.adoption,
                ),
                None => (
                    Listener::new(path, true).map_err(|source| ServerError::Listen {
                        path: path.clone(),
                        source,
                    })?,
                    None,
                ),
            };
            let gids = tables
                .get(index)
                .copied()
                .unwrap_or_else(|| config.gid_table(index));
            let device = RdmaDevice::new(
                vm.limits,
                config.vm_features(index, &caps),
                config.ctrl_poll,
                objects.clone(),
                engines.for_vm(index).clone(),
                port_identity(index, gids, &mut keys)?,
                &shared,
            )
            .map_err(ServerError::Spawn)?;
            // SAFETY: `listener` owns this descriptor and outlives the call,
            // which duplicates it.
            let listen_wake = unsafe { BorrowedFd::borrow_raw(listener.as_raw_fd()) }
                .try_clone_to_owned()
                .map_err(ServerError::Spawn)?;
            let hold = AcceptHold::new().map_err(ServerError::Spawn)?;
            // Accepting polls first (a hand-over holds it), and a successor
            // shares the socket: a connection another took is no reason to
            // block.
            listener
                .set_nonblocking(true)
                .map_err(|source| ServerError::Listen {
                    path: path.clone(),
                    source,
                })?;
            let slot = Arc::new(VmSlot::new(
                path.clone(),
                Arc::new(device),
                listen_wake,
                hold,
            ));
            engines.register(index, slot.device.cell());
            let ctx = ServeCtx {
                slot: slot.clone(),
                dir: dir.clone(),
                stop: stop.clone(),
                index,
                gate: gate.clone(),
            };
            let t = thread::Builder::new()
                .name(format!("vm{index}"))
                .spawn(move || ctx.serve(listener, adoption))
                .map_err(ServerError::Spawn)?;
            info!(
                vm = vm.name.as_str(), tenant = vm.tenant.as_str();
                "serving VM {index} ({}, tenant {}, ABI {}, GIDs {}, paired MAC {}, engine thread {}) on {}",
                vm.name,
                vm.tenant,
                vm.abi,
                gids_text(&gids),
                vm.mac.map_or_else(|| "none".into(), crate::config::mac_text),
                engines.for_vm(index).index(),
                path.display()
            );
            slots.push(slot);
            threads.push(t);
        }
        Ok(Daemon {
            slots,
            threads,
            stop,
            objects,
            engines,
            shared,
            mgmt: None,
            metrics: None,
            handover: None,
            dir,
            names: (0..config.vms.len())
                .map(|i| vm_identity(config, i))
                .collect(),
        })
    }

    /// Starts the management socket, the metrics listener and the
    /// hand-over socket, if configured: on the running daemon's listening
    /// sockets in `inherited` (a hand-over), else on new ones.
    fn start_operations(
        &mut self,
        config: &DaemonConfig,
        inherited: Option<take::OpsInherited>,
    ) -> Result<(), ServerError> {
        let (mut handover, mut mgmt, mut metrics) = match inherited {
            Some(o) => (Some(o.handover), o.mgmt, o.metrics),
            None => (None, None, None),
        };
        if let Some(path) = &config.mgmt_socket {
            let m = match mgmt.take() {
                Some(fd) => crate::mgmt::MgmtServer::adopt(path, fd.into(), self.view())?,
                None => crate::mgmt::MgmtServer::start(path, self.view())?,
            };
            self.mgmt = Some(m);
            info!("management socket on {}", path.display());
        }
        if let Some(addr) = config.metrics_listen {
            let m = match metrics.take() {
                Some(fd) => crate::metrics::MetricsServer::adopt(fd.into(), self.view())?,
                None => crate::metrics::MetricsServer::start(addr, self.view())?,
            };
            info!("metrics on http://{}/metrics", m.local_addr());
            self.metrics = Some(m);
        }
        if let Some(path) = &config.handover_socket {
            let give = self.giver()?;
            let h = match handover.take() {
                Some(fd) => HandoverServer::adopt(path, fd.into(), give, self.dir.clone())?,
                None => HandoverServer::start(path, give, self.dir.clone())?,
            };
            info!("hand-over socket on {}", path.display());
            self.handover = Some(h);
        }
        Ok(())
    }

    /// What runs a hand-over of this daemon's VMs and listening sockets.
    fn giver(&self) -> Result<Giver, ServerError> {
        let slots = self.slots.clone();
        let names = self.names.clone();
        let dup = |fd: Option<BorrowedFd>| fd.map(|f| f.try_clone_to_owned()).transpose();
        let mgmt = dup(self.mgmt.as_ref().map(|m| m.listener())).map_err(ServerError::Spawn)?;
        let metrics =
            dup(self.metrics.as_ref().map(|m| m.listener())).map_err(ServerError::Spawn)?;
        Ok(Box::new(move |s: &mut UnixStream, own: BorrowedFd| {
            let ports: Vec<VmPort> = slots
                .iter()
                .zip(&names)
                .map(|(slot, (name, identity))| VmPort {
                    name,
                    identity,
                    path: &slot.path,
                    listener: slot.listen_wake.as_fd(),
                    accept: &slot.accept,
                    relay: &slot.relay,
                    connected: slot.conn.connected(),
                    device: &slot.device,
                })
                .collect();
            let ops = OpsPorts {
                handover: own,
                mgmt: mgmt.as_ref().map(AsFd::as_fd),
                metrics: metrics.as_ref().map(AsFd::as_fd),
            };
            give(&ports, &ops, s)
        }))
    }

    /// The hand-over socket's path, if the daemon has one.
    pub fn handover_socket(&self) -> Option<&Path> {
        self.handover.as_ref().map(|h| h.path())
    }

    /// What the operator interfaces see of the daemon.
    pub fn view(&self) -> DaemonView {
        DaemonView::new(
            self.slots.clone(),
            self.shared.clone(),
            self.engines.clone(),
            self.objects.clone(),
        )
    }

    /// Statistics of the VM on socket `index`.
    pub fn vm_stats(&self, index: usize) -> Option<VmStats> {
        self.slots.get(index).map(|s| s.stats())
    }

    /// Tenants, VMs and their isolation counters.
    pub fn tenancy(&self) -> &Arc<Tenancy> {
        &self.shared.tenancy
    }

    /// The live QoS settings; changes take effect at once.
    pub fn qos(&self) -> &Arc<QosTable> {
        &self.shared.qos
    }

    /// Number of VMs (sockets) served.
    pub fn vm_count(&self) -> usize {
        self.slots.len()
    }

    /// The device of VM `index` (tests and tools: e.g. to hold its lock).
    pub fn device(&self, index: usize) -> Option<&Arc<RdmaDevice>> {
        self.slots.get(index).map(|s| &s.device)
    }

    /// The RNIC engine threads.
    pub fn engines(&self) -> &Engines {
        &self.engines
    }

    /// Waits until every engine thread enforces every QoS change made so
    /// far ([`Engines::sync_qos`]).
    pub fn sync_qos(&self, timeout: std::time::Duration) -> bool {
        self.engines.sync_qos(self.shared.qos.generation(), timeout)
    }

    /// QP numbers allocated across all VMs.
    pub fn qpns_in_use(&self) -> usize {
        self.objects.qpns_in_use()
    }

    /// Memory keys (lkeys and rkeys) in use across all VMs.
    pub fn keys_in_use(&self) -> usize {
        self.objects.keys_in_use()
    }

    /// Waits until every serving thread ends (they end only on shutdown).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Disconnects every VMM, stops serving and removes the sockets
    /// (the management socket too).
    pub fn shutdown(mut self) {
        if let Some(m) = self.mgmt.take() {
            m.stop();
        }
        if let Some(h) = self.handover.take() {
            h.stop();
        }
        if let Some(m) = self.metrics.take() {
            m.stop();
        }
        self.stop.store(true, Ordering::Release);
        for slot in &self.slots {
            if let Some(h) = lock(&slot.shutdown).take() {
                h.shutdown();
            }
            // A thread waiting to accept, or held, then sees the stop flag.
            slot.accept.notify_stop();
        }
        for t in self.threads {
            let _ = t.join();
        }
        self.engines.stop();
        for slot in &self.slots {
            let _ = std::fs::remove_file(&slot.path);
        }
    }
}

struct ServeCtx {
    slot: Arc<VmSlot>,
    dir: Arc<PrivateDir>,
    stop: Arc<AtomicBool>,
    index: usize,
    /// A hand-over this daemon takes part in as the successor: nothing is
    /// accepted before it went through, and nothing at all if it did not.
    gate: Option<Arc<take::Gate>>,
}

impl ServeCtx {
    fn serve(self, mut listener: Listener, adoption: Option<take::Adoption>) {
        if let Some(a) = adoption {
            if let Err(e) = self.serve_connection(a.vmm, Some(a.rest)) {
                error!("VM {}: {e}", self.index);
            }
        }
        if self.gate.as_ref().is_some_and(|g| !g.wait_decision()) {
            // The running daemon serves on: its sockets are not ours.
            return;
        }
        while !self.stop.load(Ordering::Acquire) {
            if let Err(e) = self.serve_one(&mut listener) {
                if self.stop.load(Ordering::Acquire) {
                    // accept() woken for the shutdown.
                    break;
                }
                error!("VM {}: {e}", self.index);
                // Avoid a hot loop if accept keeps failing.
                thread::sleep(Duration::from_millis(100));
            }
        }
        info!(
            "VM {}: stopped serving {}",
            self.index,
            self.slot.path.display()
        );
    }

    fn serve_one(&self, listener: &mut Listener) -> Result<(), ServeError> {
        let hold = &self.slot.accept;
        let vmm = loop {
            if !hold.may_accept(&self.stop) {
                return Ok(());
            }
            hold.idle();
            let fds = [listener.as_raw_fd(), hold.wake_fd()];
            let ready = crate::handover::relay::readable(&fds).map_err(ServeError::Poll)?;
            if ready[1] {
                // A hold or the stop: decided at the top.
                hold.woken();
                continue;
            }
            if !hold.may_accept(&self.stop) {
                return Ok(());
            }
            match listener.accept().map_err(ServeError::Accept)? {
                Some(s) => break s,
                // Another took it (a successor sharing the socket).
                None => hold.idle(),
            }
        };
        let r = self.serve_connection(vmm, None);
        hold.idle();
        r
    }

    /// The hand-over's part of a connection taken over: configure the
    /// fresh handler as the VMM configured the old one, load the device
    /// state, and once every VM is ready and the running daemon stopped,
    /// start the rings where they stopped.
    fn adopt(
        &self,
        vmm: UnixStream,
        handler: UnixStream,
        taken: take::Taken,
    ) -> Result<Link, ServeError> {
        let take::Taken {
            record,
            bases,
            state,
            doorbells,
            gate,
        } = taken;
        let mut link = Link::with_record(vmm, handler, record);
        let prepared = rings::configure(&mut link)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                self.slot
                    .device
                    .load_handed_over(&state, doorbells)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| format!("VM {}: {e}", self.index));
        let ok = prepared.is_ok();
        gate.prepared(prepared);
        if !ok || !gate.wait_decision() {
            return Err(ServeError::HandOver);
        }
        rings::start(&mut link, &bases).map_err(|e| ServeError::Rings(e.to_string()))?;
        Ok(link)
    }

    /// Serves one VMM connection until it ends (`taken`: one taken over
    /// from the running daemon).
    fn serve_connection(
        &self,
        vmm: UnixStream,
        taken: Option<take::Taken>,
    ) -> Result<(), ServeError> {
        let device = self.slot.device.clone();
        // The device learns of its queues' starts and stops (spec 15.1).
        let device_dyn: Arc<dyn QueueObserver> = device.clone();
        let observer = Arc::downgrade(&device_dyn);
        let mut daemon = observe_new_vrings(observer, || {
            VhostUserDaemon::new(
                format!("vhost-user-rdma-vm{}", self.index),
                device.clone(),
                GuestMemoryAtomic::new(crate::memory::GuestRam::new()),
            )
        })
        .map_err(ServeError::Backend)?;
        // The engine wakes this connection's worker to deliver its events.
        if let Some(h) = daemon.get_epoll_handlers().first() {
            if let Err(e) = h.register_listener(
                device.event_wake_fd().as_raw_fd(),
                EventSet::IN,
                u64::from(EVENT_WAKE),
            ) {
                warn!("VM {}: cannot watch the event wake fd: {e}", self.index);
            }
        }
        let name = format!("vm{}", self.index);
        let relay = connect_handler(&self.dir, &name, |p| daemon.start_client(p))
            .map_err(ServeError::Handler)
            .and_then(|handler| match taken {
                None => Ok(Link::new(vmm, handler)),
                Some(t) => self.adopt(vmm, handler, t),
            })
            .and_then(|link| {
                Relay::spawn(link, &format!("{name}-relay")).map_err(ServeError::Relay)
            });
        let relay = match relay {
            Ok(r) => r,
            Err(e) => {
                daemon.request_shutdown();
                let _ = daemon.wait();
                device.stop_workers();
                drop(daemon);
                device.close_exit_consumers();
                return Err(e);
            }
        };
        *lock(&self.slot.relay) = Some(relay);
        self.slot.accept.serving();
        *lock(&self.slot.shutdown) = daemon.shutdown_handle();
        let n = self.slot.conn.begin();
        info!("VM {}: VMM connected (connection {n})", self.index);
        match daemon.wait() {
            Ok(()) => {}
            Err(BackendError::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => {}
            Err(e) => warn!("VM {}: connection ended: {e}", self.index),
        }
        lock(&self.slot.shutdown).take();
        if let Some(r) = lock(&self.slot.relay).take() {
            r.close();
        }
        device.stop_workers();
        // Joins the connection's workers.
        drop(daemon);
        device.close_exit_consumers();
        device.disconnected();
        self.slot.conn.end();
        info!("VM {}: VMM disconnected, resources released", self.index);
        Ok(())
    }
}

/// Why serving one connection failed.
#[derive(Debug, Error)]
enum ServeError {
    /// Accepting a connection failed.
    #[error("accept: {0}")]
    Accept(VhostUserError),
    /// Waiting for a connection failed.
    #[error("poll: {0}")]
    Poll(std::io::Error),
    /// The vhost-user handler could not be set up.
    #[error("{0}")]
    Backend(BackendError),
    /// The handler could not connect to the relay.
    #[error("{0}")]
    Handler(InternalError),
    /// The relay could not start.
    #[error("cannot start the relay: {0}")]
    Relay(std::io::Error),
    /// A hand-over this connection was part of did not go through.
    #[error("the hand-over did not go through")]
    HandOver,
    /// The rings of a connection taken over did not start.
    #[error("cannot start the rings taken over: {0}")]
    Rings(String),
}
