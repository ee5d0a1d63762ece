//! A minimal vhost-user *backend* with the RDMA device's queue layout (3
//! queues) whose control queue echoes every request: it answers with a
//! [`ResponseHeader`] carrying status OK and the request's `request_id`
//! (copied from the first 8 readable bytes), used length 16.
//!
//! It is the baseline of the "raw vhost-user echo round trip" benchmark and
//! the backend the test VMM is tested against. Besides echoing it:
//! - delivers events injected with [`EchoHandle::inject_event`] into the
//!   event queue's buffers (held until buffers are posted);
//! - returns notification-queue chains with used length 0;
//! - serves its configuration space as a plausible [`DeviceConfig`].
//!
//! [`spawn`] binds the socket before returning, then serves one connection
//! after another in a background thread until the handle is stopped or
//! dropped. A frontend hanging up (`Disconnected`) is a normal end.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use vhost::vhost_user::{Listener, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VhostUserDaemon, VringT};
// The daemon's vring type: a kick reported for an eventfd the frontend has
// replaced meanwhile must not end the worker (see its documentation).
use vhost_user_rdma::vring::Vring;
use virtio_queue::{DescriptorChain, QueueT};
use virtio_rdma_abi::config::{self, DeviceConfig};
use virtio_rdma_abi::ctrl::{ResponseHeader, Status};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::error::{Error, Result};
use crate::vmm::{F_EVENT_IDX, F_VERSION_1};
use vhost_user_rdma::memory::dirty::RamBitmap;
use vhost_user_rdma::memory::GuestRam as GuestMemoryMmap;

/// Device-specific feature bits the echo backend offers (so feature
/// negotiation can be tested).
pub const ECHO_DEVICE_FEATURES: u64 = config::F_UD | config::F_SRQ;
/// Largest queue size the echo backend accepts.
pub const ECHO_MAX_QUEUE_SIZE: usize = 1024;
/// epoll id of the event-injection eventfd (ids up to the queue count are
/// reserved by vhost-user-backend).
const INJECT_ID: u64 = config::NUM_QUEUES as u64 + 1;

/// Counters of an echo backend, over all connections.
#[derive(Debug, Default)]
pub struct EchoStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Control requests answered with a header.
    pub echoed: AtomicU64,
    /// Control chains returned with used length 0 (unreadable, or writable
    /// part shorter than 16 bytes).
    pub refused: AtomicU64,
    /// Events written into event buffers.
    pub events_delivered: AtomicU64,
    /// Notification-queue chains consumed.
    pub notifications: AtomicU64,
}

/// State shared by the handle and every connection's backend.
#[derive(Debug)]
struct Shared {
    stats: EchoStats,
    events: Mutex<VecDeque<Event>>,
    inject: EventFd,
    config: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The configuration space the echo backend serves.
pub fn echo_config() -> DeviceConfig {
    DeviceConfig {
        abi_version: virtio_rdma_abi::ABI_VERSION,
        max_ctx: 16,
        max_pd: 64,
        max_cq: 256,
        max_qp: 256,
        max_mr: 1024,
        max_srq: 64,
        max_ah: 256,
        max_cqe: 65536,
        max_qp_wr: 16384,
        max_srq_wr: 16384,
        max_send_sge: 16,
        max_recv_sge: 16,
        max_inline_data: 256,
        max_inline_pages: 256,
        max_qp_rd_atom: 16,
        max_mr_size: 1 << 32,
        max_mr_bytes: 1 << 34,
        page_size_cap: (1 << 12) | (1 << 21) | (1 << 30),
        mac: [0; 6],
        reserved: 0,
    }
}

/// Backend of one connection.
struct EchoBackend {
    shared: Arc<Shared>,
    mem: Mutex<Option<GuestMemoryAtomic<GuestMemoryMmap>>>,
    event_idx: AtomicBool,
}

type Mem = GuestMemoryLoadGuard<GuestMemoryMmap>;
type Chain = DescriptorChain<Mem>;

impl EchoBackend {
    fn memory(&self) -> Option<Mem> {
        lock(&self.mem).as_ref().map(GuestAddressSpace::memory)
    }

    /// Runs `f` over the queue and signals the driver if needed. `f`
    /// returns whether it consumed every available chain; only then, with
    /// EVENT_IDX, is the queue re-checked for chains that arrived while
    /// notifications were off (the event queue leaves buffers posted when it
    /// has no event, and must not spin on them).
    fn drive(&self, vring: &Vring, mut f: impl FnMut(&Vring, &Mem) -> bool) -> std::io::Result<()> {
        let Some(mem) = self.memory() else {
            return Ok(());
        };
        if !vring.get_ref().get_queue().ready() {
            return Ok(());
        }
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        loop {
            if event_idx {
                vring
                    .disable_notification()
                    .map_err(std::io::Error::other)?;
            }
            let drained = f(vring, &mem);
            let more = event_idx && vring.enable_notification().map_err(std::io::Error::other)?;
            if !(more && drained) {
                break;
            }
        }
        if vring.needs_notification().map_err(std::io::Error::other)? {
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    fn pop(vring: &Vring, mem: &Mem) -> Option<Chain> {
        vring
            .get_mut()
            .get_queue_mut()
            .pop_descriptor_chain(mem.clone())
    }

    /// Echoes one control request; returns the used length.
    fn echo_one(mem: &Mem, chain: Chain) -> Option<u32> {
        let mut reader = chain.clone().reader(mem).ok()?;
        let mut writer = chain.writer(mem).ok()?;
        let mut head = [0u8; 8];
        let n = reader.available_bytes().min(head.len());
        reader.read_exact(&mut head[..n]).ok()?;
        if writer.available_bytes() < ResponseHeader::SIZE {
            return None;
        }
        let resp = ResponseHeader {
            request_id: u64::from_le_bytes(head),
            status: Status::OK.into(),
            detail: 0,
        };
        writer.write_all(&resp.to_bytes()).ok()?;
        Some(ResponseHeader::SIZE as u32)
    }

    fn process_ctrl(&self, vring: &Vring) -> std::io::Result<()> {
        let stats = &self.shared.stats;
        self.drive(vring, |vring, mem| {
            while let Some(chain) = Self::pop(vring, mem) {
                let head = chain.head_index();
                let len = match Self::echo_one(mem, chain) {
                    Some(len) => {
                        stats.echoed.fetch_add(1, Ordering::Relaxed);
                        len
                    }
                    None => {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        0
                    }
                };
                if let Err(e) = vring.add_used(head, len) {
                    log::warn!("echo: add_used: {e}");
                }
            }
            true
        })
    }

    fn deliver_events(&self, vring: &Vring) -> std::io::Result<()> {
        let shared = self.shared.clone();
        self.drive(vring, |vring, mem| {
            let mut pending = lock(&shared.events);
            while let Some(ev) = pending.front().copied() {
                let Some(chain) = Self::pop(vring, mem) else {
                    // Out of buffers with events pending: look again.
                    return true;
                };
                let head = chain.head_index();
                let written = chain
                    .writer(mem)
                    .ok()
                    .filter(|w| w.available_bytes() >= Event::SIZE)
                    .and_then(|mut w| w.write_all(&ev.to_bytes()).ok());
                let len = if written.is_some() {
                    pending.pop_front();
                    shared
                        .stats
                        .events_delivered
                        .fetch_add(1, Ordering::Relaxed);
                    Event::SIZE as u32
                } else {
                    0
                };
                if let Err(e) = vring.add_used(head, len) {
                    log::warn!("echo: add_used: {e}");
                }
            }
            // No event left: buffers stay posted.
            false
        })
    }

    fn process_notify(&self, vring: &Vring) -> std::io::Result<()> {
        let stats = &self.shared.stats;
        self.drive(vring, |vring, mem| {
            while let Some(chain) = Self::pop(vring, mem) {
                stats.notifications.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = vring.add_used(chain.head_index(), 0) {
                    log::warn!("echo: add_used: {e}");
                }
            }
            true
        })
    }
}

impl VhostUserBackend for EchoBackend {
    type Bitmap = RamBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        config::NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        ECHO_MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        F_VERSION_1
            | F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | ECHO_DEVICE_FEATURES
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        let end = start.saturating_add(size as usize);
        self.shared
            .config
            .get(start..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        *lock(&self.mem) = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        let q = |i: u16| {
            vrings
                .get(usize::from(i))
                .ok_or_else(|| std::io::Error::other("no vring"))
        };
        match device_event {
            config::CONTROLQ => self.process_ctrl(q(config::CONTROLQ)?),
            config::EVENTQ => self.deliver_events(q(config::EVENTQ)?),
            config::NOTIFYQ => self.process_notify(q(config::NOTIFYQ)?),
            e if u64::from(e) == INJECT_ID => {
                // Non-blocking: a spurious wakeup just finds nothing.
                let _ = self.shared.inject.read();
                self.deliver_events(q(config::EVENTQ)?)
            }
            _ => Ok(()),
        }
    }
}

/// A running echo backend; stops (and removes its socket) when dropped.
pub struct EchoHandle {
    path: PathBuf,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    current: Arc<Mutex<Option<ShutdownHandle>>>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for EchoHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoHandle")
            .field("path", &self.path)
            .field("stats", &self.shared.stats)
            .finish_non_exhaustive()
    }
}

impl EchoHandle {
    /// The socket path the backend listens on.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Counters, over all connections.
    pub fn stats(&self) -> &EchoStats {
        &self.shared.stats
    }

    /// Queues `ev` for delivery into the next event buffer the driver posts
    /// (immediately if one is posted).
    pub fn inject_event(&self, ev: Event) -> Result<()> {
        lock(&self.shared.events).push_back(ev);
        self.shared
            .inject
            .write(1)
            .map_err(|e| Error::io("inject event", e))
    }

    /// Events injected and not yet delivered.
    pub fn pending_events(&self) -> usize {
        lock(&self.shared.events).len()
    }

    /// Hangs up the current connection from the backend side (the next
    /// frontend can connect afterwards).
    pub fn drop_connection(&self) {
        if let Some(h) = lock(&self.current).as_ref() {
            h.shutdown();
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        {
            let cur = lock(&self.current);
            self.stop.store(true, Ordering::SeqCst);
            if let Some(h) = cur.as_ref() {
                h.shutdown();
            }
        }
        // Wake a thread blocked in accept(); it sees `stop` and quits.
        let _ = UnixStream::connect(&self.path);
        match thread.join() {
            Ok(r) => r,
            Err(_) => Err(Error::Daemon("echo thread panicked".into())),
        }
    }

    /// Stops serving, waits for the thread and removes the socket.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }
}

impl Drop for EchoHandle {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::warn!("echo backend: {e}");
        }
    }
}

/// Starts an echo backend listening on `socket_path` (an existing file there
/// is replaced). The socket exists when this returns.
pub fn spawn(socket_path: impl AsRef<Path>) -> Result<EchoHandle> {
    let path = socket_path.as_ref().to_path_buf();
    let listener = Listener::new(&path, true)
        .map_err(|e| Error::Daemon(format!("listen on {}: {e}", path.display())))?;
    let inject = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::io("eventfd", e))?;
    let shared = Arc::new(Shared {
        stats: EchoStats::default(),
        events: Mutex::new(VecDeque::new()),
        inject,
        config: echo_config().to_bytes(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let current = Arc::new(Mutex::new(None));
    let thread = {
        let (shared, stop, current) = (shared.clone(), stop.clone(), current.clone());
        std::thread::Builder::new()
            .name("echo-backend".into())
            .spawn(move || serve(listener, &shared, &stop, &current))
            .map_err(|e| Error::io("spawn echo thread", e))?
    };
    Ok(EchoHandle {
        path,
        shared,
        stop,
        current,
        thread: Some(thread),
    })
}

/// Serves connections until `stop`.
fn serve(
    mut listener: Listener,
    shared: &Arc<Shared>,
    stop: &AtomicBool,
    current: &Mutex<Option<ShutdownHandle>>,
) -> Result<()> {
    use vhost::vhost_user::Error as VuError;
    use vhost_user_backend::Error as DaemonError;

    while !stop.load(Ordering::SeqCst) {
        let backend = Arc::new(EchoBackend {
            shared: shared.clone(),
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
        });
        let mut daemon = VhostUserDaemon::new(
            "echo-vhost-user".into(),
            backend,
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(|e| Error::Daemon(e.to_string()))?;
        for h in daemon.get_epoll_handlers() {
            h.register_listener(shared.inject.as_raw_fd(), EventSet::IN, INJECT_ID)
                .map_err(|e| Error::io("register inject eventfd", e))?;
        }
        daemon
            .start(&mut listener)
            .map_err(|e| Error::Daemon(e.to_string()))?;
        {
            let mut cur = lock(current);
            if stop.load(Ordering::SeqCst) {
                break;
            }
            *cur = daemon.shutdown_handle();
        }
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        match daemon.wait() {
            Ok(())
            | Err(DaemonError::HandleRequest(VuError::Disconnected))
            | Err(DaemonError::HandleRequest(VuError::PartialMessage)) => {}
            Err(e) => log::warn!("echo backend: connection ended: {e}"),
        }
        *lock(current) = None;
        // Dropping the daemon stops and joins its vring worker threads.
    }
    Ok(())
}
