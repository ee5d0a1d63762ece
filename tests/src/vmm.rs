//! The test VMM: an in-process vhost-user frontend with memfd guest RAM and
//! the three virtqueues of the RDMA device driven from this process.
//!
//! [`TestVmm::connect`] performs the handshake QEMU would (owner, features,
//! protocol features, queue count, memory table, every vring), reads the
//! device configuration and posts event buffers. The control queue is then
//! used through [`TestVmm::ctrl`], the event queue through
//! [`TestVmm::events`], and the notification queue as a raw [`Vring`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vhost::vhost_user::message::{
    FrontendReq, VhostUserConfig, VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserU64,
    VhostUserVringState,
};
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserDirtyLogRegion};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_rdma_abi::config::{self, DeviceConfig};
use virtio_rdma_abi::{Field, Wire};
use vm_memory::ByteValued;

use crate::conn::Conn;
use crate::ctrl::{CtrlImage, CtrlQueue};
use crate::dirty_log::DirtyLogFile;
use crate::error::{Error, Result};
use crate::events::{EventQueue, EventsImage};
use crate::guest_mem::{GuestMem, MemImage, MemLayout, PAGE_SIZE};
use crate::shmem::{BackendChannel, ShmemWindow};
use crate::vring::{Vring, VringImage};

/// Feature bit `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// Feature bit `VIRTIO_RING_F_EVENT_IDX`.
pub const F_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// Feature bit `VHOST_F_LOG_ALL` (dirty logging, spec 20.4).
pub const F_LOG_ALL: u64 = 1 << 26;

/// How the test VMM sets the device up.
#[derive(Debug, Clone)]
pub struct VmmOptions {
    /// Guest RAM layout.
    pub mem: MemLayout,
    /// Entries of each virtqueue (power of two).
    pub queue_size: u16,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX` if the device offers it.
    pub event_idx: bool,
    /// Device-specific feature bits the driver accepts (intersected with
    /// what the device offers).
    pub driver_features: u64,
    /// Protocol features to ack if offered. CONFIG, MQ and REPLY_ACK are the
    /// ones this frontend handles; others are passed through for tests.
    pub protocol_features: VhostUserProtocolFeatures,
    /// How long to retry connecting while the socket does not exist yet or
    /// refuses connections.
    pub connect_timeout: Duration,
    /// Event buffers posted during connect (0: none; post them later with
    /// [`EventQueue::post_buffers`]).
    pub event_buffers: u16,
    /// Default timeout of blocking waits on the control and event queues.
    pub timeout: Duration,
    /// Longest time one vhost-user exchange may take; past it the socket is
    /// shut down and the call fails with [`Error::MessageTimeout`], so that
    /// a backend that stops answering fails the test instead of hanging it
    /// (None: wait forever).
    pub message_timeout: Option<Duration>,
    /// Offer VIRTIO shared memory like QEMU >= 11.1: negotiate
    /// `BACKEND_REQ` and `SHMEM`, read the regions with
    /// `GET_SHMEM_CONFIG` and serve `SHMEM_MAP` (see [`crate::shmem`]).
    /// Without it the VMM behaves like older QEMU and the driver does not
    /// accept `F_SHMEM_DOORBELL`.
    pub shmem: bool,
    /// With `shmem`: refuse every `SHMEM_MAP` (a VMM that cannot map).
    pub shmem_refuse_map: bool,
    /// Offer the guest only the transport feature bits, never the device's
    /// bits 0 to 23, as a generic vhost-user front-end does that does not
    /// know the device type (cloud-hypervisor's `--generic-vhost-user`,
    /// `qemu-configs/cloud-hypervisor.md`): the driver then negotiates
    /// device features 0, whatever `driver_features` says.
    pub transport_features_only: bool,
    /// Start every queue (`SET_VRING_BASE`) at the avail index its ring
    /// holds when the driver sets `DRIVER_OK`, as cloud-hypervisor does,
    /// instead of at 0. The same for fresh rings, unless buffers were made
    /// available before the start (`events_before_start`).
    pub base_from_avail_idx: bool,
    /// Make the event buffers available before the queues are started
    /// (before `DRIVER_OK`, spec chapter 6 step 5) instead of after.
    pub events_before_start: bool,
    /// Stop a queue with `SET_VRING_ENABLE` 0 before its `GET_VRING_BASE`
    /// (cloud-hypervisor's `reset_vhost_user`).
    pub disable_before_stop: bool,
    /// With `BACKEND_REQ` negotiated but not `SHMEM`: open the back-end
    /// channel anyway (`SET_BACKEND_REQ_FD`) and refuse whatever the
    /// back-end asks on it, counting the requests
    /// ([`TestVmm::backend_map_requests`]); cloud-hypervisor opens it for
    /// configuration change notifications.
    pub backend_channel_without_shmem: bool,
    /// Send the messages that start the queues (`SET_FEATURES`,
    /// `SET_MEM_TABLE`, every vring's set-up) without asking for each one's
    /// `REPLY_ACK`, then one `GET_CONFIG` (`GET_FEATURES` without the
    /// `CONFIG` protocol feature), whose answer shows that the back-end
    /// handled them all (it handles a connection's messages in order); QEMU
    /// syncs so where it needs no answer to each message. The configuration
    /// read so is what the guest then reads ([`TestVmm::start_config`]). A
    /// [`TestVmm::reset`] also sends its stops (`GET_VRING_BASE`) and
    /// `RESET_DEVICE` without waiting, and reads the stops' answers with the
    /// sync's. Saves a round trip per message on every connect and reset.
    pub pipeline_setup: bool,
    /// A wait for a reply on the vhost-user socket first yields the CPU for
    /// up to this long (None: it blocks at once): with more busy threads
    /// than cores, the back-end's threads then get the core at once and the
    /// waiter is spared a sleep and a wake-up. For the fuzz harness.
    pub reply_spin: Option<Duration>,
}

impl VmmOptions {
    /// A front-end that never sends `RESET_DEVICE` (QEMU's generic
    /// vhost-user device, for one): it asks for the protocol features
    /// `CONFIG`, `MQ` and `REPLY_ACK` only, so the device recognises a reset
    /// from the restart of the queues (spec 15.1).
    pub fn without_reset_device() -> Self {
        VmmOptions {
            protocol_features: VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK,
            ..VmmOptions::default()
        }
    }

    /// A front-end that behaves towards the back-end as cloud-hypervisor's
    /// generic vhost-user device (v52, v53; see
    /// `qemu-configs/cloud-hypervisor.md` for the source lines): it asks for
    /// the protocol features `CONFIG`, `MQ`, `REPLY_ACK`, `BACKEND_REQ`,
    /// `CONFIGURE_MEM_SLOTS`, `INFLIGHT_SHMFD`, `LOG_SHMFD` and
    /// `DEVICE_STATE` (never `RESET_DEVICE` or `SHMEM`), offers the guest
    /// `VERSION_1` and `EVENT_IDX` but no device feature, starts queues at
    /// the ring's avail index, and stops them with `SET_VRING_ENABLE` 0
    /// and `GET_VRING_BASE` without `RESET_DEVICE`.
    pub fn cloud_hypervisor() -> Self {
        VmmOptions {
            event_idx: true,
            protocol_features: VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::INFLIGHT_SHMFD
                | VhostUserProtocolFeatures::LOG_SHMFD
                | VhostUserProtocolFeatures::DEVICE_STATE
                | VhostUserProtocolFeatures::BACKEND_REQ,
            transport_features_only: true,
            base_from_avail_idx: true,
            disable_before_stop: true,
            backend_channel_without_shmem: true,
            ..VmmOptions::default()
        }
    }
}

impl Default for VmmOptions {
    fn default() -> Self {
        VmmOptions {
            mem: MemLayout::default(),
            queue_size: 256,
            event_idx: false,
            driver_features: config::ALL_DEVICE_FEATURES,
            protocol_features: VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::RESET_DEVICE,
            connect_timeout: Duration::from_secs(5),
            event_buffers: 32,
            timeout: Duration::from_secs(10),
            message_timeout: Some(Duration::from_secs(10)),
            shmem: false,
            shmem_refuse_map: false,
            transport_features_only: false,
            base_from_avail_idx: false,
            events_before_start: false,
            disable_before_stop: false,
            backend_channel_without_shmem: false,
            pipeline_setup: false,
            reply_spin: None,
        }
    }
}

/// A [`TestVmm`] as a VM that moves to another host takes it along
/// ([`TestVmm::image`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmImage {
    /// The guest RAM's layout and allocator.
    pub mem: MemImage,
    /// The features the device offered.
    pub device_features: u64,
    /// The features negotiated.
    pub features: u64,
    /// The protocol features negotiated.
    pub protocol: u64,
    /// The back-end's queue count.
    pub backend_queues: u64,
    /// The control queue.
    pub ctrl: CtrlImage,
    /// The event queue.
    pub events: EventsImage,
    /// The notification queue.
    pub notify: VringImage,
}

/// A connected test VM.
pub struct TestVmm {
    conn: Option<Conn>,
    socket: PathBuf,
    mem: Arc<GuestMem>,
    device_features: u64,
    features: u64,
    protocol: VhostUserProtocolFeatures,
    backend_queues: u64,
    opts: VmmOptions,
    ctrl: CtrlQueue,
    events: EventQueue,
    notify: Vring,
    shmem: Option<Arc<ShmemWindow>>,
    backend_channel: Option<BackendChannel>,
    refusing_window: Option<Arc<ShmemWindow>>,
    /// The configuration read as the sync of the last pipelined start.
    start_config: Option<DeviceConfig>,
    /// Between [`TestVmm::start_reset`] and [`TestVmm::finish_reset`].
    pending_reset: Option<PendingReset>,
}

/// A reset between [`TestVmm::start_reset`] and [`TestVmm::finish_reset`].
enum PendingReset {
    /// Sent (pipelined): the new queues, and whether the sync is
    /// `GET_CONFIG`.
    Answers {
        queues: Box<(CtrlQueue, EventQueue, Vring)>,
        config: bool,
    },
    /// Done (one message after the other): the bases.
    Done(Vec<u32>),
}

impl std::fmt::Debug for TestVmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestVmm")
            .field("socket", &self.socket)
            .field("connected", &self.conn.is_some())
            .field("features", &format_args!("{:#x}", self.features))
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// Connects, retrying while the socket is missing or refuses connections.
fn connect_retry(path: &Path, timeout: Duration) -> Result<Frontend> {
    let deadline = Instant::now() + timeout;
    loop {
        match Frontend::connect(path, config::NUM_QUEUES as u64) {
            Ok(f) => return Ok(f),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(Error::Connect {
                        path: path.display().to_string(),
                        timeout,
                        last: e.to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Sends the memory table and sets up every virtqueue with fresh rings
/// (with the eventfds of `prev`'s queues, if given: a restart keeps them);
/// returns the three queue clients (event buffers posted only with
/// `events_before_start`).
/// With `pipeline_setup`, the messages ask for no acknowledgement: the
/// caller then syncs ([`sync_setup`]).
fn start_queues(
    c: &mut Conn,
    mem: &Arc<GuestMem>,
    opts: &VmmOptions,
    features: u64,
    prev: Option<[&Vring; 3]>,
) -> Result<(CtrlQueue, EventQueue, Vring)> {
    let event_idx = features & F_EVENT_IDX != 0;
    let mut vrings = Vec::with_capacity(config::NUM_QUEUES);
    for q in 0..config::NUM_QUEUES {
        let index = u16::try_from(q).map_err(|_| Error::Backend("queue index".into()))?;
        let mut v = Vring::new(mem.clone(), index, opts.queue_size)?;
        v.set_event_idx(event_idx);
        if let Some(old) = prev.as_ref().and_then(|p| p.get(q)) {
            v.share_fds(old)?;
        }
        vrings.push(v);
    }
    let mut it = vrings.into_iter();
    let (Some(ctrl), Some(events), Some(notify)) = (it.next(), it.next(), it.next()) else {
        return Err(Error::Backend("queue setup".into()));
    };
    let ctrl = CtrlQueue::new(ctrl, opts.timeout);
    let mut events = EventQueue::new(events, opts.timeout);
    if opts.events_before_start && opts.event_buffers > 0 {
        // The driver's buffers are in the ring before DRIVER_OK; the
        // device holds no kick descriptor yet, so the notification only
        // becomes pending on it.
        events.post_buffers(usize::from(opts.event_buffers))?;
    }

    if opts.pipeline_setup {
        ask_acks(c, false);
    }
    c.call("SET_FEATURES", |fe| fe.set_features(features))?;
    let regions = mem.region_infos()?;
    c.call("SET_MEM_TABLE", |fe| fe.set_mem_table(&regions))?;
    let queues: [&Vring; 3] = [ctrl.vring(), events.vring(), &notify];
    for (q, v) in queues.into_iter().enumerate() {
        let base = if opts.base_from_avail_idx {
            v.avail_idx()
        } else {
            0
        };
        let addr = v.config_data()?;
        c.call("SET_VRING_NUM", |fe| fe.set_vring_num(q, v.size()))?;
        c.call("SET_VRING_BASE", |fe| fe.set_vring_base(q, base))?;
        c.call("SET_VRING_ADDR", |fe| fe.set_vring_addr(q, &addr))?;
        c.call("SET_VRING_CALL", |fe| fe.set_vring_call(q, v.call_fd()))?;
        c.call("SET_VRING_KICK", |fe| fe.set_vring_kick(q, v.kick_fd()))?;
        c.call("SET_VRING_ENABLE", |fe| fe.set_vring_enable(q, true))?;
    }
    Ok((ctrl, events, notify))
}

/// Ends a pipelined set-up: asks for acknowledgements again (if
/// `reply_ack`) and sends one request that has an answer, which shows that
/// the back-end handled everything before it. `GET_CONFIG` when the
/// `CONFIG` protocol feature was negotiated: its answer is the
/// configuration as of this start ([`TestVmm::start_config`]); otherwise
/// `GET_FEATURES`.
fn sync_setup(c: &mut Conn, protocol: VhostUserProtocolFeatures) -> Result<Option<DeviceConfig>> {
    ask_acks(c, protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
    if !protocol.contains(VhostUserProtocolFeatures::CONFIG) {
        c.call("GET_FEATURES (sync)", |fe| fe.get_features())?;
        return Ok(None);
    }
    let size = config_size()?;
    let zeros = vec![0u8; DeviceConfig::SIZE];
    let (_, payload) = c.call("GET_CONFIG (sync)", |fe| {
        fe.get_config(0, size, VhostUserConfigFlags::empty(), &zeros)
    })?;
    Ok(Some(DeviceConfig::parse(&payload)?))
}

/// [`DeviceConfig::SIZE`] as a vhost-user size.
fn config_size() -> Result<u32> {
    u32::try_from(DeviceConfig::SIZE).map_err(|_| Error::Backend("config size".into()))
}

/// Whether the frontend's messages ask for an acknowledgement
/// (`NEED_REPLY`, with `REPLY_ACK` negotiated).
fn ask_acks(c: &mut Conn, on: bool) {
    c.frontend().set_hdr_flags(if on {
        VhostUserHeaderFlag::NEED_REPLY
    } else {
        VhostUserHeaderFlag::empty()
    });
}

/// Posts the event buffers after the start (the default; with
/// `events_before_start` they were posted by [`start_queues`]).
fn post_events_after_start(events: &mut EventQueue, opts: &VmmOptions) -> Result<()> {
    if opts.event_buffers > 0 && !opts.events_before_start {
        events.post_buffers(usize::from(opts.event_buffers))?;
    }
    Ok(())
}

/// What [`setup_shmem`] set up.
#[derive(Default)]
struct Shmem {
    /// The doorbell region as the guest sees it.
    window: Option<Arc<ShmemWindow>>,
    /// The back-end request channel.
    channel: Option<BackendChannel>,
    /// The window of a channel opened without `SHMEM`, which refuses every
    /// map (`backend_channel_without_shmem`).
    refusing: Option<Arc<ShmemWindow>>,
}

/// With `SHMEM` and `BACKEND_REQ` negotiated: reads the back-end's regions
/// and opens the back-end request channel that carries `SHMEM_MAP`.
fn setup_shmem(
    c: &mut Conn,
    protocol: VhostUserProtocolFeatures,
    opts: &VmmOptions,
) -> Result<Shmem> {
    let need = VhostUserProtocolFeatures::BACKEND_REQ | VhostUserProtocolFeatures::SHMEM;
    if !protocol.contains(need) {
        if opts.backend_channel_without_shmem
            && protocol.contains(VhostUserProtocolFeatures::BACKEND_REQ)
        {
            // No region to map into: a window that refuses every map and
            // counts the requests.
            let window = ShmemWindow::new(PAGE_SIZE, true)?;
            let reply_ack = protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
            let channel = BackendChannel::spawn(window.clone(), reply_ack)?;
            c.call("SET_BACKEND_REQ_FD", |fe| {
                fe.set_backend_request_fd(&channel.peer_fd())
            })?;
            return Ok(Shmem {
                window: None,
                channel: Some(channel),
                refusing: Some(window),
            });
        }
        return Ok(Shmem::default());
    }
    let cfg = c.call("GET_SHMEM_CONFIG", |fe| fe.get_shmem_config())?;
    let nregions = cfg.nregions;
    let sizes = cfg.memory_sizes;
    if nregions == 0 || sizes[0] == 0 {
        return Ok(Shmem::default());
    }
    let window = ShmemWindow::new(sizes[0], opts.shmem_refuse_map)?;
    let reply_ack = protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
    let channel = BackendChannel::spawn(window.clone(), reply_ack)?;
    c.call("SET_BACKEND_REQ_FD", |fe| {
        fe.set_backend_request_fd(&channel.peer_fd())
    })?;
    Ok(Shmem {
        window: Some(window),
        channel: Some(channel),
        refusing: None,
    })
}

impl TestVmm {
    /// Connects to the vhost-user socket at `socket_path` and sets the
    /// device up as described by `opts`.
    pub fn connect(socket_path: impl AsRef<Path>, opts: VmmOptions) -> Result<Self> {
        let mem = Arc::new(GuestMem::new(&opts.mem)?);
        Self::connect_with_mem(socket_path, opts, mem)
    }

    /// [`TestVmm::connect`] with existing guest RAM instead of new RAM of
    /// `opts.mem`'s layout: a VM whose VMM reconnects keeps its memory (a
    /// harness that reconnects often saves the new file and its mappings).
    /// What an earlier VMM allocated in it must have been freed; the
    /// contents are left as they are (rings are zeroed when allocated).
    pub fn connect_with_mem(
        socket_path: impl AsRef<Path>,
        opts: VmmOptions,
        mem: Arc<GuestMem>,
    ) -> Result<Self> {
        let socket = socket_path.as_ref().to_path_buf();
        let fe = connect_retry(&socket, opts.connect_timeout)?;
        let mut c = Conn::new(fe, opts.message_timeout)?;
        c.set_reply_spin(opts.reply_spin);

        c.call("SET_OWNER", |fe| fe.set_owner())?;
        let device_features = c.call("GET_FEATURES", |fe| fe.get_features())?;
        let proto_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if device_features & proto_bit == 0 {
            return Err(Error::Backend(
                "does not offer VHOST_USER_F_PROTOCOL_FEATURES".into(),
            ));
        }
        if device_features & F_VERSION_1 == 0 {
            return Err(Error::Backend("does not offer VIRTIO_F_VERSION_1".into()));
        }

        let offered = c.call("GET_PROTOCOL_FEATURES", |fe| fe.get_protocol_features())?;
        let mut wanted_protocol = opts.protocol_features;
        if opts.shmem {
            wanted_protocol |=
                VhostUserProtocolFeatures::BACKEND_REQ | VhostUserProtocolFeatures::SHMEM;
        }
        let protocol = offered & wanted_protocol;
        c.call("SET_PROTOCOL_FEATURES", |fe| {
            fe.set_protocol_features(protocol)
        })?;
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            c.frontend().set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }

        let backend_queues = if protocol.contains(VhostUserProtocolFeatures::MQ) {
            c.call("GET_QUEUE_NUM", |fe| fe.get_queue_num())?
        } else {
            config::NUM_QUEUES as u64
        };
        if backend_queues < config::NUM_QUEUES as u64 {
            return Err(Error::Backend(format!(
                "has {backend_queues} queues, the RDMA device needs {}",
                config::NUM_QUEUES
            )));
        }

        let Shmem {
            window: shmem,
            channel: backend_channel,
            refusing: refusing_window,
        } = setup_shmem(&mut c, protocol, &opts)?;

        let guest_device_features = if opts.transport_features_only {
            0
        } else {
            opts.driver_features
        };
        let mut wanted = F_VERSION_1 | proto_bit | guest_device_features;
        if shmem.is_none() {
            // The guest sees no doorbell region, so its driver does not
            // accept the mode (spec chapter 4).
            wanted &= !config::F_SHMEM_DOORBELL;
        }
        if opts.event_idx {
            wanted |= F_EVENT_IDX;
        }
        let features = device_features & wanted;
        let (ctrl, events, notify) = start_queues(&mut c, &mem, &opts, features, None)?;
        let start_config = if opts.pipeline_setup {
            sync_setup(&mut c, protocol)?
        } else {
            None
        };
        if let Some(w) = &shmem {
            w.set_started(true);
        }

        let mut vmm = TestVmm {
            conn: Some(c),
            socket,
            mem,
            device_features,
            features,
            protocol,
            backend_queues,
            opts,
            ctrl,
            events,
            notify,
            shmem,
            backend_channel,
            refusing_window,
            start_config,
            pending_reset: None,
        };
        post_events_after_start(&mut vmm.events, &vmm.opts)?;
        Ok(vmm)
    }

    /// The VMM's image ([`crate::vm_image`]): the guest RAM's layout and
    /// allocator, what was negotiated, and the queues' driver sides. Taken
    /// between commands (nothing in flight) and not with the doorbell
    /// region, whose pages belong to the connection.
    pub fn image(&self) -> Result<VmmImage> {
        if self.shmem.is_some() {
            return Err(Error::Backend(
                "an image of a VM with a doorbell region".into(),
            ));
        }
        if self.pending_reset.is_some() {
            return Err(Error::Backend("an image of a VM being reset".into()));
        }
        Ok(VmmImage {
            mem: self.mem.image(),
            device_features: self.device_features,
            features: self.features,
            protocol: self.protocol.bits(),
            backend_queues: self.backend_queues,
            ctrl: self.ctrl.image()?,
            events: self.events.image()?,
            notify: self.notify.image(),
        })
    }

    /// The VMM of `image` over `mem` (restored from the image's, its
    /// contents written), not connected: [`TestVmm::move_to_via`] connects
    /// it to its new device, where the device state is loaded and the
    /// queues start where they stopped.
    pub fn restore(mem: Arc<GuestMem>, image: &VmmImage, opts: VmmOptions) -> Result<Self> {
        let protocol = VhostUserProtocolFeatures::from_bits(image.protocol)
            .ok_or_else(|| Error::Backend(format!("protocol features {:#x}", image.protocol)))?;
        let ctrl = Vring::restore(mem.clone(), &image.ctrl.vring)?;
        let events = Vring::restore(mem.clone(), &image.events.vring)?;
        let notify = Vring::restore(mem.clone(), &image.notify)?;
        Ok(TestVmm {
            conn: None,
            socket: PathBuf::new(),
            mem,
            device_features: image.device_features,
            features: image.features,
            protocol,
            backend_queues: image.backend_queues,
            ctrl: CtrlQueue::restore(ctrl, &image.ctrl, opts.timeout),
            events: EventQueue::restore(events, &image.events, opts.timeout),
            notify,
            opts,
            shmem: None,
            backend_channel: None,
            refusing_window: None,
            start_config: None,
            pending_reset: None,
        })
    }

    fn conn(&mut self) -> Result<&mut Conn> {
        self.conn
            .as_mut()
            .ok_or_else(|| Error::Backend("disconnected".into()))
    }

    /// Sends one vhost-user exchange by hand, under the message timeout
    /// (for tests of the vhost-user layer itself).
    pub fn vhost_call<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T> {
        self.conn()?.call(what, f)
    }

    /// Sends `SET_LOG_BASE` (needs `LOG_SHMFD`) with `log`'s file, `size`
    /// bytes from `offset` (spec 20.4). The back-end refuses a bad log by
    /// closing the connection: then this fails.
    pub fn set_log_base(&mut self, log: &DirtyLogFile, size: u64, offset: u64) -> Result<()> {
        let region = VhostUserDirtyLogRegion {
            mmap_size: size,
            mmap_offset: offset,
            mmap_handle: log.raw_fd(),
        };
        self.conn()?
            .call("SET_LOG_BASE", |fe| fe.set_log_base(0, Some(region)))
    }

    /// Turns dirty logging on or off: `SET_FEATURES` with the negotiated
    /// features plus or minus `VHOST_F_LOG_ALL` (kept for later starts).
    pub fn set_log_all(&mut self, on: bool) -> Result<()> {
        if on {
            self.features |= F_LOG_ALL;
        } else {
            self.features &= !F_LOG_ALL;
        }
        let features = self.features;
        self.conn()?
            .call("SET_FEATURES", |fe| fe.set_features(features))
    }

    /// Reads the device configuration space (`GET_CONFIG`, the whole
    /// [`DeviceConfig`]).
    pub fn config(&mut self) -> Result<DeviceConfig> {
        let raw = self.config_bytes(0, DeviceConfig::SIZE)?;
        Ok(DeviceConfig::parse(&raw)?)
    }

    /// Reads `len` bytes of configuration space at `offset`.
    pub fn config_bytes(&mut self, offset: u32, len: usize) -> Result<Vec<u8>> {
        let size = u32::try_from(len).map_err(|_| Error::Backend("config size".into()))?;
        let zeros = vec![0u8; len];
        let (_, payload) = self.vhost_call("GET_CONFIG", |fe| {
            fe.get_config(offset, size, VhostUserConfigFlags::empty(), &zeros)
        })?;
        Ok(payload)
    }

    /// The control queue client.
    pub fn ctrl(&mut self) -> &mut CtrlQueue {
        &mut self.ctrl
    }

    /// The event queue client.
    pub fn events(&mut self) -> &mut EventQueue {
        &mut self.events
    }

    /// The notification queue (raw).
    pub fn notify_vring(&mut self) -> &mut Vring {
        &mut self.notify
    }

    /// All three queue clients at once.
    pub fn queues(&mut self) -> (&mut CtrlQueue, &mut EventQueue, &mut Vring) {
        (&mut self.ctrl, &mut self.events, &mut self.notify)
    }

    /// Guest RAM (and its allocator).
    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    /// Socket path this VM connected to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Feature bits the device offered.
    pub fn device_features(&self) -> u64 {
        self.device_features
    }

    /// Feature bits acked (virtio and device-specific).
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Protocol features acked.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.protocol
    }

    /// Queue count the backend reported (`GET_QUEUE_NUM`).
    pub fn backend_queues(&self) -> u64 {
        self.backend_queues
    }

    /// The vhost-user frontend, for sending messages by hand without the
    /// message timeout (None after [`TestVmm::disconnect`]); see also
    /// [`TestVmm::vhost_call`].
    pub fn frontend(&mut self) -> Option<&mut Frontend> {
        self.conn.as_mut().map(Conn::frontend)
    }

    /// Whether the vhost-user connection is still open (from our side).
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Stops every queue with `GET_VRING_BASE` (what a VMM does on device
    /// reset or stop) and returns the avail indices the backend reports.
    pub fn stop_queues(&mut self) -> Result<Vec<u32>> {
        if let Some(w) = &self.shmem {
            w.set_started(false);
        }
        let disable = self.opts.disable_before_stop;
        let c = self.conn()?;
        (0..config::NUM_QUEUES)
            .map(|q| {
                if disable {
                    c.call("SET_VRING_ENABLE", |fe| fe.set_vring_enable(q, false))?;
                }
                c.call("GET_VRING_BASE", |fe| fe.get_vring_base(q))
            })
            .collect()
    }

    /// Resumes after [`TestVmm::stop_queues`] as a VMM does when a paused
    /// VM continues: `SET_FEATURES`, `SET_MEM_TABLE`, then every queue
    /// again with its rings where they were and its avail index at
    /// `bases` (what `GET_VRING_BASE` reported). Nothing is reposted.
    pub fn resume(&mut self, bases: &[u32]) -> Result<()> {
        let features = self.features;
        let regions = self.mem.region_infos()?;
        let c = self.conn()?;
        c.call("SET_FEATURES", |fe| fe.set_features(features))?;
        c.call("SET_MEM_TABLE", |fe| fe.set_mem_table(&regions))?;
        self.resume_queues(bases)?;
        if let Some(w) = &self.shmem {
            w.set_started(true);
        }
        Ok(())
    }

    /// Moves the VM to the device at `socket` as the destination VMM of a
    /// migration does, once [`TestVmm::stop_queues`] stopped the device
    /// here (and returned `bases`): the same guest RAM and rings, a new
    /// connection that negotiates what this one did and sends the memory
    /// table; then `before_start` (where a state is loaded, spec 20.1);
    /// then every queue starts where it stopped. The old connection is
    /// closed after `before_start`, as a source VMM exits once the
    /// destination took over. Not with the doorbell region.
    pub fn move_to(
        &mut self,
        socket: impl AsRef<Path>,
        bases: &[u32],
        before_start: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.move_to_via(socket, bases, |_| before_start())
    }

    /// [`TestVmm::move_to`] whose `before_start` gets the new connection,
    /// to load the state through it (`SET_DEVICE_STATE_FD`).
    pub fn move_to_via(
        &mut self,
        socket: impl AsRef<Path>,
        bases: &[u32],
        before_start: impl FnOnce(&mut Conn) -> Result<()>,
    ) -> Result<()> {
        self.move_to_ordered(socket, bases, false, before_start)
    }

    /// [`TestVmm::move_to_via`] in QEMU's order: the state is loaded
    /// (`load`) before `SET_FEATURES` and `SET_MEM_TABLE`, as QEMU 10.2's
    /// destination does (it starts the device only when the guest runs).
    pub fn move_to_qemu_order(
        &mut self,
        socket: impl AsRef<Path>,
        bases: &[u32],
        load: impl FnOnce(&mut Conn) -> Result<()>,
    ) -> Result<()> {
        self.move_to_ordered(socket, bases, true, load)
    }

    fn move_to_ordered(
        &mut self,
        socket: impl AsRef<Path>,
        bases: &[u32],
        load_first: bool,
        before_start: impl FnOnce(&mut Conn) -> Result<()>,
    ) -> Result<()> {
        if self.shmem.is_some() {
            return Err(Error::Backend("moving a VM with a doorbell region".into()));
        }
        let socket = socket.as_ref().to_path_buf();
        let fe = connect_retry(&socket, self.opts.connect_timeout)?;
        let mut c = Conn::new(fe, self.opts.message_timeout)?;
        c.set_reply_spin(self.opts.reply_spin);
        c.call("SET_OWNER", |fe| fe.set_owner())?;
        let offered = c.call("GET_FEATURES", |fe| fe.get_features())?;
        if offered & self.features != self.features {
            return Err(Error::Backend(format!(
                "the destination lacks features {:#x}",
                self.features & !offered
            )));
        }
        let protocol = self.protocol;
        let offered = c.call("GET_PROTOCOL_FEATURES", |fe| fe.get_protocol_features())?;
        if !offered.contains(protocol) {
            return Err(Error::Backend(
                "the destination lacks protocol features".into(),
            ));
        }
        c.call("SET_PROTOCOL_FEATURES", |fe| {
            fe.set_protocol_features(protocol)
        })?;
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            c.frontend().set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        if protocol.contains(VhostUserProtocolFeatures::MQ) {
            c.call("GET_QUEUE_NUM", |fe| fe.get_queue_num())?;
        }
        let features = self.features;
        let regions = self.mem.region_infos()?;
        let mut before_start = Some(before_start);
        if load_first {
            if let Some(f) = before_start.take() {
                f(&mut c)?;
            }
        }
        c.call("SET_FEATURES", |fe| fe.set_features(features))?;
        c.call("SET_MEM_TABLE", |fe| fe.set_mem_table(&regions))?;
        if let Some(f) = before_start.take() {
            f(&mut c)?;
        }
        if let Some(old) = self.conn.replace(c) {
            old.shutdown();
        }
        self.socket = socket;
        self.resume_queues(bases)
    }

    /// Starts every queue again with its rings where they were and its
    /// avail index at `bases` (the second half of [`TestVmm::resume`]).
    fn resume_queues(&mut self, bases: &[u32]) -> Result<()> {
        let TestVmm {
            conn,
            ctrl,
            events,
            notify,
            ..
        } = self;
        let c = conn
            .as_mut()
            .ok_or_else(|| Error::Backend("disconnected".into()))?;
        let vrings: [&Vring; 3] = [ctrl.vring(), events.vring(), notify];
        for (q, v) in vrings.into_iter().enumerate() {
            let base = *bases
                .get(q)
                .ok_or_else(|| Error::Backend("a base per queue".into()))?;
            let addr = v.config_data()?;
            c.call("SET_VRING_NUM", |fe| fe.set_vring_num(q, v.size()))?;
            let base = u16::try_from(base).map_err(|_| Error::Backend("base".into()))?;
            c.call("SET_VRING_BASE", |fe| fe.set_vring_base(q, base))?;
            c.call("SET_VRING_ADDR", |fe| fe.set_vring_addr(q, &addr))?;
            c.call("SET_VRING_CALL", |fe| fe.set_vring_call(q, v.call_fd()))?;
            c.call("SET_VRING_KICK", |fe| fe.set_vring_kick(q, v.kick_fd()))?;
            c.call("SET_VRING_ENABLE", |fe| fe.set_vring_enable(q, true))?;
        }
        Ok(())
    }

    /// Resets the device: stops every queue (`GET_VRING_BASE`), sends
    /// `RESET_DEVICE` when that protocol feature was negotiated (the signal
    /// that the device state is to be discarded), then starts again with `SET_FEATURES`,
    /// `SET_MEM_TABLE` and freshly allocated, zeroed rings at new addresses,
    /// and reposts the event buffers. Every request in flight is forgotten.
    /// Returns the avail indices reported when stopping.
    ///
    /// With [`VmmOptions::pipeline_setup`] all of it costs one round trip:
    /// the stops, the reset and the new start are sent at once, and then
    /// the answers to the stops and to one `GET_FEATURES` are read.
    pub fn reset(&mut self) -> Result<Vec<u32>> {
        self.start_reset()?;
        self.finish_reset()
    }

    /// [`TestVmm::reset`], one message after the other.
    fn reset_now(&mut self) -> Result<Vec<u32>> {
        let bases = self.stop_queues()?;
        if self
            .protocol_features()
            .contains(VhostUserProtocolFeatures::RESET_DEVICE)
        {
            self.conn()?.call("RESET_DEVICE", |fe| fe.reset_device())?;
        }
        if let Some(w) = &self.shmem {
            w.reset();
        }
        let (features, opts, mem) = (self.features, self.opts.clone(), self.mem.clone());
        let prev = [self.ctrl.vring(), self.events.vring(), &self.notify];
        let c = self
            .conn
            .as_mut()
            .ok_or(Error::Backend("not connected".into()))?;
        let (ctrl, events, notify) = start_queues(c, &mem, &opts, features, Some(prev))?;
        if let Some(w) = &self.shmem {
            w.set_started(true);
        }
        self.ctrl = ctrl;
        self.events = events;
        self.notify = notify;
        post_events_after_start(&mut self.events, &opts)?;
        Ok(bases)
    }

    /// The first half of [`TestVmm::reset`]: with
    /// [`VmmOptions::pipeline_setup`] it sends the stops, the reset, the new
    /// start and the sync, and returns without waiting for the back-end;
    /// [`TestVmm::finish_reset`] reads the answers. Meanwhile the caller can
    /// do other work, such as freeing what the device used before the
    /// reset: nothing is allocated from guest RAM until `finish_reset`
    /// (the device may still read and write that memory until then).
    /// Without `pipeline_setup` it is the whole reset.
    pub fn start_reset(&mut self) -> Result<()> {
        if self.pending_reset.is_some() {
            return Err(Error::Backend("a reset is already under way".into()));
        }
        let pending = if self.opts.pipeline_setup {
            self.send_reset()?
        } else {
            PendingReset::Done(self.reset_now()?)
        };
        self.pending_reset = Some(pending);
        Ok(())
    }

    /// The second half of [`TestVmm::reset`] after
    /// [`TestVmm::start_reset`]: returns the avail indices reported when
    /// stopping.
    pub fn finish_reset(&mut self) -> Result<Vec<u32>> {
        let (new_queues, config) = match self.pending_reset.take() {
            None => return Err(Error::Backend("no reset under way".into())),
            Some(PendingReset::Done(bases)) => return Ok(bases),
            Some(PendingReset::Answers { queues, config }) => (queues, config),
        };
        let opts = self.opts.clone();
        let c = self
            .conn
            .as_mut()
            .ok_or_else(|| Error::Backend("not connected".into()))?;
        let mut bases = Vec::with_capacity(config::NUM_QUEUES);
        for q in 0..config::NUM_QUEUES {
            let s: VhostUserVringState =
                c.recv_reply("GET_VRING_BASE", FrontendReq::GET_VRING_BASE)?;
            let (index, num) = (s.index, s.num);
            if usize::try_from(index).ok() != Some(q) {
                return Err(Error::Backend(format!(
                    "GET_VRING_BASE of queue {q} answered for queue {index}"
                )));
            }
            bases.push(num);
        }
        self.start_config = if config {
            let head = std::mem::size_of::<VhostUserConfig>();
            let reply = c.recv_reply_bytes(
                "GET_CONFIG (sync)",
                FrontendReq::GET_CONFIG,
                head + DeviceConfig::SIZE,
            )?;
            Some(DeviceConfig::parse(reply.get(head..).unwrap_or_default())?)
        } else {
            let _: VhostUserU64 = c.recv_reply("GET_FEATURES (sync)", FrontendReq::GET_FEATURES)?;
            None
        };
        if let Some(w) = &self.shmem {
            w.set_started(true);
        }
        (self.ctrl, self.events, self.notify) = *new_queues;
        post_events_after_start(&mut self.events, &opts)?;
        Ok(bases)
    }

    /// The sending half of a pipelined reset ([`TestVmm::start_reset`]).
    fn send_reset(&mut self) -> Result<PendingReset> {
        if let Some(w) = &self.shmem {
            w.set_started(false);
        }
        let (features, opts, mem) = (self.features, self.opts.clone(), self.mem.clone());
        let protocol = self.protocol;
        let TestVmm {
            conn,
            ctrl,
            events,
            notify,
            shmem,
            ..
        } = self;
        let c = conn
            .as_mut()
            .ok_or_else(|| Error::Backend("not connected".into()))?;
        ask_acks(c, false);
        for q in 0..config::NUM_QUEUES {
            if opts.disable_before_stop {
                c.call("SET_VRING_ENABLE", |fe| fe.set_vring_enable(q, false))?;
            }
            let index = u32::try_from(q).map_err(|_| Error::Backend("queue index".into()))?;
            c.post(
                FrontendReq::GET_VRING_BASE,
                VhostUserVringState::new(index, 0).as_slice(),
            )?;
        }
        if protocol.contains(VhostUserProtocolFeatures::RESET_DEVICE) {
            c.call("RESET_DEVICE", |fe| fe.reset_device())?;
        }
        if let Some(w) = shmem.as_ref() {
            w.reset();
        }
        let prev = [ctrl.vring(), events.vring(), &*notify];
        let queues = start_queues(c, &mem, &opts, features, Some(prev))?;
        // The sync of `sync_setup`, posted.
        let config = protocol.contains(VhostUserProtocolFeatures::CONFIG);
        if config {
            let size = config_size()?;
            let mut body = VhostUserConfig::new(0, size, VhostUserConfigFlags::empty())
                .as_slice()
                .to_vec();
            body.resize(body.len() + DeviceConfig::SIZE, 0);
            c.post(FrontendReq::GET_CONFIG, &body)?;
        } else {
            c.post(FrontendReq::GET_FEATURES, &[])?;
        }
        ask_acks(c, protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
        Ok(PendingReset::Answers {
            queues: Box::new(queues),
            config,
        })
    }

    /// With [`VmmOptions::pipeline_setup`] and the `CONFIG` protocol
    /// feature: the configuration read at the last start (connect or
    /// reset), as a VMM keeps it to answer the guest's reads of the
    /// configuration space (QEMU's vhost-user-blk reads it once). The
    /// device's configuration does not change while it runs.
    pub fn start_config(&self) -> Option<&DeviceConfig> {
        self.start_config.as_ref()
    }

    /// The options this VM was created with.
    pub fn options(&self) -> &VmmOptions {
        &self.opts
    }

    /// Changes [`VmmOptions::pipeline_setup`] for the resets to come.
    pub fn set_pipeline_setup(&mut self, on: bool) {
        self.opts.pipeline_setup = on;
    }

    /// Drops the vhost-user connection abruptly (shutdown of the socket,
    /// then close), as when a VMM is killed. Guest memory and the queue
    /// clients stay usable for inspection; nothing will complete any more.
    pub fn disconnect(&mut self) {
        if let Some(w) = &self.shmem {
            w.set_started(false);
        }
        if let Some(c) = self.conn.take() {
            c.shutdown();
        }
        self.backend_channel = None;
    }

    /// `SHMEM_MAP` requests the back-end sent on a channel opened without
    /// `SHMEM` (`backend_channel_without_shmem`; None: no such channel).
    pub fn backend_map_requests(&self) -> Option<u64> {
        self.refusing_window.as_ref().map(|w| w.map_requests())
    }

    /// The device's doorbell shared memory region as the guest sees it
    /// (None unless `shmem` was negotiated).
    pub fn shmem_window(&self) -> Option<&Arc<ShmemWindow>> {
        self.shmem.as_ref()
    }
}

impl Drop for TestVmm {
    fn drop(&mut self) {
        self.disconnect();
    }
}
