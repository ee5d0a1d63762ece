//! The virtio-pci transport for a real Linux guest, entirely in user space.
//!
//! [`PciTransport::open`] finds the device's PCI function (vendor `0x1af4`,
//! device `0x106a`: virtio ID 42), takes it from `virtio-pci` and binds it to
//! `uio_pci_generic`, maps its BARs through sysfs, and does the virtio 1.x
//! initialization: reset, feature negotiation, the three virtqueues, event
//! buffers, `DRIVER_OK`. DMA memory comes from 2 MiB hugepages translated
//! through `/proc/self/pagemap` ([`hugepages`]).
//!
//! Interrupts: `uio_pci_generic` offers INTx only (MSI-X stays disabled), so
//! waits sleep on `/dev/uioN`, acknowledge at the ISR byte and unmask INTx
//! in the command register. Every sleep is bounded, because several threads
//! share the one line and any of them may consume the wakeup.
//!
//! Requirements in the guest: root, `uio_pci_generic`, hugepages
//! (`hugepages=N` on the kernel command line), and a device that is not in
//! use by anyone else.

pub mod caps;
pub mod hugepages;
pub mod regs;
pub mod split;
pub mod sysfs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use virtio_rdma_abi::config::{
    DeviceConfig, CONTROLQ, EVENTQ, F_ATOMIC, F_SHMEM_DOORBELL, F_SRQ, F_UD, NOTIFYQ, NUM_QUEUES,
};
use virtio_rdma_abi::datapath::SHMEM_ID_DOORBELL;
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::{Field, ABI_VERSION, MIN_COMPATIBLE_ABI_VERSION};

use crate::transport::{DmaRegion, SharedMemory, Token, Transport, TransportError};
use caps::VirtioCaps;
use hugepages::{HugeDma, HugePool, HUGE_SHIFT};
use regs::{status, CommonCfg, Mmio, NO_VECTOR};
use split::{queue_bytes, Buf, SplitQueue};
use sysfs::{BarMap, PciFunction, VIRTIO_RDMA_DEVICE, VIRTIO_VENDOR};

/// `VIRTIO_F_VERSION_1`.
const F_VERSION_1: u64 = 1 << 32;
/// Longest single sleep on the interrupt line (see the module docs).
const WAIT_SLICE: Duration = Duration::from_millis(10);
/// How long a reset may take.
const RESET_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes of one event buffer.
const EVENT_BUF: usize = 64;

/// How to open the device.
#[derive(Debug, Clone)]
pub struct PciOptions {
    /// PCI address (`0000:00:04.0`); `None`: the first virtio-rdma function.
    pub addr: Option<String>,
    /// Entries of the control queue (rounded down to a power of two and to
    /// what the device allows).
    pub ctrl_queue_size: u16,
    /// Buffers kept posted on the event queue.
    pub event_buffers: u16,
    /// Hugepages mapped at open (more are mapped as needed).
    pub initial_hugepages: usize,
}

impl Default for PciOptions {
    fn default() -> Self {
        PciOptions {
            addr: None,
            ctrl_queue_size: 64,
            event_buffers: 64,
            initial_hugepages: 4,
        }
    }
}

fn other(msg: impl Into<String>) -> TransportError {
    TransportError::Other(msg.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Queue state is consistent between statements; a panicking thread is no
    // reason to stop the others.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Guest-physical segments of `region[off .. off + len]`, merging pages
/// that are physically adjacent.
fn segments(region: &dyn DmaRegion, off: usize, len: usize) -> Vec<Buf> {
    let shift = region.page_shift();
    let page = 1usize << shift;
    let mut out: Vec<Buf> = Vec::new();
    let mut at = region.first_page_offset() as usize + off;
    let end = at + len;
    while at < end {
        let n = (page - at % page).min(end - at);
        let gpa = region.pages()[at >> shift] + (at % page) as u64;
        match out.last_mut() {
            Some(b)
                if b.gpa + u64::from(b.len) == gpa
                    && u64::from(b.len) + n as u64 <= u64::from(u32::MAX) =>
            {
                b.len += n as u32;
            }
            _ => out.push(Buf {
                gpa,
                len: n as u32,
                writable: false,
            }),
        }
        at += n;
    }
    out
}

/// A control request in flight.
#[derive(Debug)]
struct InFlight {
    token: Token,
    /// The readable part; the device may read it until the request is used.
    _request: HugeDma,
    response: HugeDma,
    response_len: usize,
}

#[derive(Debug)]
struct CtrlState {
    q: SplitQueue,
    in_flight: HashMap<u16, InFlight>,
    done: HashMap<Token, Vec<u8>>,
    next_token: Token,
}

impl CtrlState {
    fn harvest(&mut self) {
        while let Some((head, used)) = self.q.pop_used() {
            let Some(r) = self.in_flight.remove(&head) else {
                continue;
            };
            let n = (used as usize).min(r.response_len);
            let mut bytes = vec![0u8; n];
            // SAFETY: the response region holds at least `response_len >= n`
            // bytes and the device is done with it (the request is used).
            unsafe { std::ptr::copy_nonoverlapping(r.response.as_ptr(), bytes.as_mut_ptr(), n) };
            self.done.insert(r.token, bytes);
        }
    }
}

#[derive(Debug)]
struct EventState {
    q: SplitQueue,
    bufs: HugeDma,
    /// Buffer slot of each posted chain, by head.
    posted: HashMap<u16, usize>,
}

impl EventState {
    fn post(&mut self, slot: usize) -> Result<(), TransportError> {
        let mut seg = segments(&self.bufs, slot * EVENT_BUF, EVENT_BUF);
        for b in &mut seg {
            b.writable = true;
        }
        let head = self.q.push(&seg).ok_or_else(|| other("event queue full"))?;
        self.posted.insert(head, slot);
        Ok(())
    }
}

/// A shared memory region of the device (a window of a BAR).
#[derive(Debug)]
struct PciShm {
    /// Keeps the BAR mapped.
    _bar: Arc<BarMap>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: device memory handed out as a raw pointer for atomic access only.
unsafe impl Send for PciShm {}
// SAFETY: as for `Send`.
unsafe impl Sync for PciShm {}

// SAFETY: `ptr .. ptr + len` lies inside the BAR mapping held by `bar`
// (checked by `BarMap::at`), 4096-aligned (checked at open), and the driver
// accesses it atomically only.
unsafe impl SharedMemory for PciShm {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The virtio-pci transport (see the module documentation).
#[derive(Debug)]
pub struct PciTransport {
    func: PciFunction,
    /// Every mapped BAR, by index.
    _bars: HashMap<u8, Arc<BarMap>>,
    common: CommonCfg,
    isr: Mmio,
    device_cfg: Mmio,
    /// Notification register of each queue.
    notify: Vec<Mmio>,
    features: u64,
    pool: Arc<HugePool>,
    ctrl: Mutex<CtrlState>,
    events: Mutex<EventState>,
    shm: Option<Arc<PciShm>>,
}

impl PciTransport {
    /// Opens the device (see the module documentation).
    pub fn open(opts: &PciOptions) -> Result<Arc<PciTransport>, TransportError> {
        let addr = match &opts.addr {
            Some(a) => a.clone(),
            None => sysfs::find_functions(VIRTIO_VENDOR, VIRTIO_RDMA_DEVICE)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    other(format!(
                        "no virtio-rdma PCI function ({VIRTIO_VENDOR:04x}:{VIRTIO_RDMA_DEVICE:04x}) in /sys/bus/pci/devices"
                    ))
                })?,
        };
        let func = PciFunction::claim(&addr)?;
        let caps =
            VirtioCaps::parse(&func.config_space()?).map_err(|e| other(format!("{addr}: {e}")))?;
        let mut bars = HashMap::new();
        for b in caps.bars() {
            if let std::collections::hash_map::Entry::Vacant(v) = bars.entry(b) {
                v.insert(Arc::new(func.map_bar(b)?));
            }
        }
        let bar = |w: caps::BarWindow| -> Result<&Arc<BarMap>, TransportError> {
            bars.get(&w.bar)
                .ok_or_else(|| other(format!("BAR {} not mapped", w.bar)))
        };
        let bad = |what: &str| other(format!("{addr}: the {what} structure does not fit its BAR"));
        let common = CommonCfg::new(bar(caps.common)?, caps.common.offset, caps.common.length)
            .ok_or_else(|| bad("common configuration"))?;
        let isr = Mmio::new(bar(caps.isr)?, caps.isr.offset, 4).ok_or_else(|| bad("ISR"))?;
        let dev = caps
            .device
            .ok_or_else(|| other(format!("{addr}: no device configuration")))?;
        let cfg_len = DeviceConfig::SIZE as u64;
        if dev.length < cfg_len {
            return Err(bad("device configuration"));
        }
        let device_cfg =
            Mmio::new(bar(dev)?, dev.offset, cfg_len).ok_or_else(|| bad("device configuration"))?;
        let shm = caps
            .shm
            .iter()
            .find(|s| s.id == SHMEM_ID_DOORBELL)
            .and_then(|s| {
                let b = bars.get(&s.window.bar)?.clone();
                let len = usize::try_from(s.window.length).ok()?;
                let ptr = b.at(s.window.offset, s.window.length, 4096)?;
                Some(Arc::new(PciShm { _bar: b, ptr, len }))
            });

        func.enable_dma()?;
        // Start from a clean device: reset and wait for it to take effect.
        common.set_status(0);
        let t0 = Instant::now();
        while common.status() != 0 {
            if t0.elapsed() > RESET_TIMEOUT {
                return Err(other(format!("{addr}: device does not reset")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        common.set_status(status::ACKNOWLEDGE);
        common.set_status(status::ACKNOWLEDGE | status::DRIVER);
        let fail = |msg: String| {
            common.set_status(common.status() | status::FAILED);
            other(format!("{addr}: {msg}"))
        };
        let offered = common.device_features();
        if offered & F_VERSION_1 == 0 {
            return Err(fail("the device does not offer VIRTIO_F_VERSION_1".into()));
        }
        let mut features = F_VERSION_1 | (offered & (F_UD | F_SRQ | F_ATOMIC));
        if offered & F_SHMEM_DOORBELL != 0 && shm.is_some() {
            features |= F_SHMEM_DOORBELL;
        }
        common.set_driver_features(features);
        common.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        if common.status() & status::FEATURES_OK == 0 {
            return Err(fail(format!("the device refused features {features:#x}")));
        }
        common.set_config_vector(NO_VECTOR);
        if usize::from(common.num_queues()) < NUM_QUEUES {
            return Err(fail(format!(
                "the device has {} virtqueues, not {NUM_QUEUES}",
                common.num_queues()
            )));
        }

        // The ABI version decides the layout of the rest (spec chapter 6).
        let cfg = Self::read_device_config(&common, &device_cfg);
        if !(MIN_COMPATIBLE_ABI_VERSION..=ABI_VERSION).contains(&cfg.abi_version) {
            return Err(fail(format!(
                "device ABI version {}, driver implements {MIN_COMPATIBLE_ABI_VERSION} to {ABI_VERSION}",
                cfg.abi_version
            )));
        }
        let pool = HugePool::new(opts.initial_hugepages)?;
        let mut queues = Vec::new();
        let mut notify = Vec::new();
        for (q, want) in [
            (CONTROLQ, opts.ctrl_queue_size),
            (EVENTQ, opts.event_buffers),
            (NOTIFYQ, 2),
        ] {
            common.select_queue(q);
            let max = common.queue_size();
            if max == 0 {
                return Err(fail(format!("virtqueue {q} is not available")));
            }
            let n = want.clamp(1, max);
            let n = 1u16 << (15 - n.leading_zeros().min(15));
            let n = if n > max { n / 2 } else { n };
            common.set_queue_size(n);
            let bytes = queue_bytes(n);
            let queue = SplitQueue::new(Box::new(pool.alloc(bytes, bytes)?), n)?;
            let (d, a, u) = queue.addrs();
            common.set_queue_addrs(d, a, u);
            common.set_queue_vector(NO_VECTOR);
            let off = u64::from(common.queue_notify_off()) * u64::from(caps.notify_off_multiplier);
            let reg = Mmio::new(bar(caps.notify)?, caps.notify.offset + off, 2)
                .filter(|_| off + 2 <= caps.notify.length)
                .ok_or_else(|| bad("notification"))?;
            notify.push(reg);
            common.enable_queue();
            queues.push(queue);
        }
        let mut it = queues.into_iter();
        let (Some(cq), Some(eq)) = (it.next(), it.next()) else {
            return Err(other("virtqueue setup"));
        };
        let nbuf = usize::from(eq.size());
        let mut events = EventState {
            bufs: pool.alloc(nbuf * EVENT_BUF, EVENT_BUF)?,
            q: eq,
            posted: HashMap::new(),
        };
        func.unmask_intx()?;
        common.set_status(
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
        // After DRIVER_OK: front-ends that start the queue at the index they
        // find then would never show earlier buffers (spec chapter 6).
        for slot in 0..nbuf {
            events.post(slot)?;
        }
        notify[usize::from(EVENTQ)].write16(0, EVENTQ);
        log::info!(
            "virtio-rdma at {addr}: features {features:#x}, shared memory {}",
            shm.is_some()
        );
        Ok(Arc::new(PciTransport {
            func,
            _bars: bars,
            common,
            isr,
            device_cfg,
            notify,
            features,
            pool,
            ctrl: Mutex::new(CtrlState {
                q: cq,
                in_flight: HashMap::new(),
                done: HashMap::new(),
                next_token: 1,
            }),
            events: Mutex::new(events),
            shm,
        }))
    }

    /// The PCI address of the function.
    pub fn pci_addr(&self) -> &str {
        self.func.addr()
    }

    fn read_device_config(common: &CommonCfg, cfg: &Mmio) -> DeviceConfig {
        // Retry while the generation changes under the read (virtio 4.1.4.3).
        loop {
            let before = common.config_generation();
            let mut bytes = vec![0u8; DeviceConfig::SIZE];
            for (i, c) in bytes.chunks_mut(4).enumerate() {
                let v = cfg.read32(4 * i).to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
            if common.config_generation() == before {
                return DeviceConfig::read(&bytes);
            }
        }
    }

    /// Sleeps until an interrupt or `left` (at most [`WAIT_SLICE`]) passes;
    /// acknowledges the interrupt at the device and unmasks the line.
    fn sleep(&self, left: Duration) -> Result<(), TransportError> {
        if self.func.wait_interrupt(left.min(WAIT_SLICE))? {
            // Reading ISR acknowledges (and lowers) the line.
            let _ = self.isr.read8(0);
            self.func.unmask_intx()?;
        }
        Ok(())
    }

    fn check_alive(&self) -> Result<(), TransportError> {
        if self.common.status() & status::DEVICE_NEEDS_RESET != 0 {
            return Err(TransportError::Disconnected);
        }
        Ok(())
    }
}

impl Drop for PciTransport {
    fn drop(&mut self) {
        // Reset before the rings and buffers are unmapped, so the device
        // stops using them, then stop DMA altogether.
        self.common.set_status(0);
        let t0 = Instant::now();
        while self.common.status() != 0 && t0.elapsed() < RESET_TIMEOUT {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Err(e) = self.func.disable_dma() {
            log::warn!("{}: disabling DMA: {e}", self.func.addr());
        }
    }
}

impl Transport for PciTransport {
    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self) -> Result<DeviceConfig, TransportError> {
        Ok(Self::read_device_config(&self.common, &self.device_cfg))
    }

    fn dma_page_shift(&self) -> u32 {
        HUGE_SHIFT
    }

    fn alloc_dma(&self, len: usize, align: usize) -> Result<Box<dyn DmaRegion>, TransportError> {
        Ok(Box::new(self.pool.alloc(len, align)?))
    }

    fn submit(&self, request: &[&[u8]], response_len: usize) -> Result<Token, TransportError> {
        self.check_alive()?;
        let total: usize = request.iter().map(|p| p.len()).sum();
        let req = self.pool.alloc(total.max(1), 64)?;
        let mut at = 0;
        for p in request {
            // SAFETY: `req` holds `total` bytes, the parts add up to `total`,
            // and nothing else references the fresh region.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), req.as_ptr().add(at), p.len()) };
            at += p.len();
        }
        let resp = self.pool.alloc(response_len.max(1), 64)?;
        // SAFETY: fresh region of at least `response_len` bytes; zeroed so
        // that nothing stale is returned if the device writes less.
        unsafe { std::ptr::write_bytes(resp.as_ptr(), 0, response_len.max(1)) };
        let mut chain = segments(&req, 0, total.max(1));
        chain.extend(
            segments(&resp, 0, response_len.max(1))
                .into_iter()
                .map(|b| Buf {
                    writable: true,
                    ..b
                }),
        );
        let mut st = lock(&self.ctrl);
        st.harvest();
        let head =
            st.q.push(&chain)
                .ok_or_else(|| other("control queue full"))?;
        let token = st.next_token;
        st.next_token += 1;
        st.in_flight.insert(
            head,
            InFlight {
                token,
                _request: req,
                response: resp,
                response_len,
            },
        );
        drop(st);
        self.notify[usize::from(CONTROLQ)].write16(0, CONTROLQ);
        Ok(token)
    }

    fn wait(&self, token: Token, timeout: Option<Duration>) -> Result<Vec<u8>, TransportError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut st = lock(&self.ctrl);
                st.harvest();
                if let Some(bytes) = st.done.remove(&token) {
                    return Ok(bytes);
                }
                if !st.in_flight.values().any(|r| r.token == token) {
                    return Err(TransportError::UnknownToken(token));
                }
            }
            self.check_alive()?;
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Err(TransportError::Timeout);
            }
            self.sleep(left)?;
        }
    }

    fn notify(&self, queue: u16) -> Result<(), TransportError> {
        let reg = self
            .notify
            .get(usize::from(queue))
            .ok_or_else(|| other(format!("no virtqueue {queue}")))?;
        reg.write16(0, queue);
        Ok(())
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<Event>, TransportError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut st = lock(&self.events);
                if let Some((head, len)) = st.q.pop_used() {
                    let slot = st
                        .posted
                        .remove(&head)
                        .ok_or_else(|| other("event buffer lost"))?;
                    let mut raw = [0u8; Event::SIZE];
                    // SAFETY: slot `slot` of `bufs` holds EVENT_BUF >= Event::SIZE
                    // bytes and the device is done with it (it is used).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            st.bufs.as_ptr().add(slot * EVENT_BUF),
                            raw.as_mut_ptr(),
                            Event::SIZE,
                        )
                    };
                    st.post(slot)?;
                    drop(st);
                    self.notify[usize::from(EVENTQ)].write16(0, EVENTQ);
                    if len as usize >= Event::SIZE {
                        return Ok(Some(Event::read(&raw)));
                    }
                    log::warn!("short event of {len} bytes ignored");
                    continue;
                }
            }
            self.check_alive()?;
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Ok(None);
            }
            self.sleep(left)?;
        }
    }

    fn shared_memory(&self, id: u8) -> Option<Arc<dyn SharedMemory>> {
        (id == SHMEM_ID_DOORBELL && self.features & F_SHMEM_DOORBELL != 0)
            .then(|| self.shm.clone().map(|s| s as Arc<dyn SharedMemory>))
            .flatten()
    }
}
