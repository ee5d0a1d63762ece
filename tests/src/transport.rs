//! The driver's [`Transport`] over the test VMM, so that the reference guest
//! driver (`virtio-rdma-driver`) runs against the real daemon.
//!
//! DMA memory is made the way a real guest driver makes it from hugepages
//! and `/proc/self/pagemap`: guest pages that are deliberately *not*
//! contiguous in guest-physical space (the allocator's
//! [`alloc_pages`](crate::guest_mem::Allocator::alloc_pages) interleaves
//! them) are mapped side by side into one reserved virtual range of this
//! process (a `PROT_NONE` reservation, then one `MAP_FIXED | MAP_SHARED`
//! mapping of the guest memfd per page, at that page's file offset). The
//! driver sees contiguous bytes; the device sees a scattered page list.
//! On request ([`VmmTransport::set_dma_in_ram_mapping`]) a region of one
//! page, or of one contiguous guest-physical range, gets no mapping of its
//! own: it is used where the guest RAM is mapped already. On request too
//! ([`VmmTransport::set_kept_dma_views`]) the mappings of the last regions
//! freed are kept, and a new region of exactly the same pages gets one of
//! them back instead of mappings of its own.
//!
//! The VMM sits behind one mutex that is never held while sleeping: waits on
//! the control and event queues release it and sleep on (duplicates of) the
//! queues' call eventfds, so a thread waiting for an event does not hold up
//! control commands, and notifications only write a duplicate of the
//! notification queue's kick eventfd.

use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use virtio_rdma_abi::config::{DeviceConfig, NOTIFYQ};
use virtio_rdma_abi::ctrl::{RequestHeader, ResponseHeader};
use virtio_rdma_abi::datapath::SHMEM_ID_DOORBELL;
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::{Field, Wire};
use virtio_rdma_driver::{DmaRegion, SharedMemory, Token, Transport, TransportError};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use crate::ctrl::RequestSpec;
use crate::dma_arena::{DmaArena, Slot};
use crate::error::Error;
use crate::guest_mem::{GuestMem, PAGE_SIZE};
use crate::shmem::ShmemWindow;
use crate::vmm::TestVmm;
use crate::vring::poll_readable;

/// Longest single sleep on a call eventfd: another thread may consume a
/// wakeup meant for this one, so sleeps are bounded and the queue rechecked.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// [`Transport`] of the test VMM (see the module documentation).
pub struct VmmTransport {
    vmm: Mutex<TestVmm>,
    mem: Arc<GuestMem>,
    features: u64,
    /// Duplicate of the control queue's call eventfd.
    ctrl_call: EventFd,
    /// Duplicate of the event queue's call eventfd.
    event_call: EventFd,
    /// Duplicate of the notification queue's kick eventfd.
    notify_kick: EventFd,
    /// Notifications of notifyq are held back ([`VmmTransport::hold_notifications`]).
    notify_held: AtomicBool,
    /// Notifications held back so far.
    held: AtomicU64,
    /// The doorbell shared memory region, if the VMM negotiated it.
    shmem: Option<Arc<ShmemWindow>>,
    /// Address space for the DMA mappings.
    arena: Arc<DmaArena>,
    /// How long a wait for a control command yields the CPU before it
    /// sleeps on the call eventfd, in microseconds (0: it sleeps at once).
    wait_spin_us: AtomicU64,
    /// DMA regions of one guest-physical range use the guest RAM's own
    /// mapping ([`VmmTransport::set_dma_in_ram_mapping`]).
    dma_in_ram: AtomicBool,
}

impl std::fmt::Debug for VmmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmTransport")
            .field("features", &format_args!("{:#x}", self.features))
            .finish_non_exhaustive()
    }
}

fn io_err(e: std::io::Error) -> TransportError {
    TransportError::Io(e)
}

fn map_err(e: Error) -> TransportError {
    match e {
        Error::Timeout(_) => TransportError::Timeout,
        Error::UnknownRequest(t) => TransportError::UnknownToken(t),
        Error::MessageTimeout { .. } => TransportError::Disconnected,
        e => TransportError::Other(e.to_string()),
    }
}

/// Consumes a pending count of a (non-blocking) eventfd, if any.
fn drain(fd: &EventFd) {
    // EAGAIN (nothing pending) is the normal case; any other error will show
    // up again on the next poll.
    let _ = fd.read();
}

impl VmmTransport {
    /// Wraps a connected VM (virtio initialization done, event buffers
    /// posted, which [`TestVmm::connect`] does by default).
    pub fn new(vmm: TestVmm) -> std::io::Result<Arc<VmmTransport>> {
        Self::with_arena(vmm, Arc::new(DmaArena::default()))
    }

    /// [`VmmTransport::new`] for a VMM that took over the guest RAM of
    /// `previous`'s (a VMM that reconnects, [`TestVmm::connect_with_mem`]):
    /// its DMA regions are mapped into the same address space as
    /// `previous`'s, mappings kept included
    /// ([`VmmTransport::set_kept_dma_views`], which carries over), instead
    /// of into a new one (and `previous`'s is not unmapped when the last
    /// of its regions goes). With other guest RAM, the same as `new`.
    pub fn with_dma_space_of(
        vmm: TestVmm,
        previous: &VmmTransport,
    ) -> std::io::Result<Arc<VmmTransport>> {
        let arena = if Arc::ptr_eq(vmm.mem(), &previous.mem) {
            previous.arena.clone()
        } else {
            Arc::new(DmaArena::default())
        };
        Self::with_arena(vmm, arena)
    }

    fn with_arena(mut vmm: TestVmm, arena: Arc<DmaArena>) -> std::io::Result<Arc<VmmTransport>> {
        let ctrl_call = vmm.ctrl().vring().call_fd().try_clone()?;
        let event_call = vmm.events().vring_mut().call_fd().try_clone()?;
        let notify_kick = vmm.notify_vring().kick_fd().try_clone()?;
        Ok(Arc::new(VmmTransport {
            mem: vmm.mem().clone(),
            features: vmm.features(),
            shmem: vmm.shmem_window().cloned(),
            vmm: Mutex::new(vmm),
            ctrl_call,
            event_call,
            notify_kick,
            notify_held: AtomicBool::new(false),
            held: AtomicU64::new(0),
            arena,
            wait_spin_us: AtomicU64::new(0),
            dma_in_ram: AtomicBool::new(false),
        }))
    }

    /// With `on`, a DMA region of one page, or of one contiguous
    /// guest-physical range, is used where the guest RAM is mapped already
    /// instead of in a mapping of its own (a `mmap` per page now and a
    /// `munmap` with its TLB shootdown later); the scattered pages of
    /// larger regions are mapped side by side as always. Off by default:
    /// then every region has mappings of its own, as a real guest
    /// driver's pages would be placed anywhere in its address space.
    pub fn set_dma_in_ram_mapping(&self, on: bool) {
        self.dma_in_ram.store(on, Ordering::Relaxed);
    }

    /// Keeps the mappings of the last `n` DMA regions freed (of scattered
    /// pages, mapped side by side), each with its page list; a new region
    /// of exactly the same pages gets one of them back instead of a `mmap`
    /// per page now and a `munmap` later. The driver of a harness that
    /// frees its queues and buffers and allocates them again after each
    /// device reset gets the same pages from the allocator every time.
    /// 0 (the default) keeps none. A kept mapping still maps pages that may
    /// belong to other regions meanwhile; nothing reads or writes through
    /// it until a region of those very pages takes it.
    pub fn set_kept_dma_views(&self, n: usize) {
        self.arena.set_kept_views(n);
    }

    /// A wait for a control command's completion first yields the CPU for
    /// up to `spin` (None: it sleeps on the call eventfd at once), checking
    /// the used ring between yields. On a machine with fewer cores than
    /// busy threads the daemon's threads then run at once where the waiter
    /// runs, and the waiter goes on without being woken: a sleep and a
    /// wake-up cost more than most commands take.
    pub fn set_wait_spin(&self, spin: Option<Duration>) {
        let us = spin.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.wait_spin_us.store(us, Ordering::Relaxed);
    }

    /// Holds back (`on`) the driver's notifications of notifyq, as a VMM
    /// whose notification reaches the device arbitrarily late would (its
    /// thread gets no CPU): they are counted, not delivered. Releasing
    /// delivers one if any was held (notifications coalesce, spec 18.6).
    pub fn hold_notifications(&self, on: bool) -> std::io::Result<()> {
        self.notify_held.store(on, Ordering::SeqCst);
        if !on && self.held.load(Ordering::SeqCst) > 0 {
            self.notify_kick.write(1)?;
        }
        Ok(())
    }

    /// Notifications of notifyq held back so far.
    pub fn held_notifications(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// The VMM (for tests that go around the driver). Do not sleep while
    /// holding it.
    pub fn vmm(&self) -> MutexGuard<'_, TestVmm> {
        // Every VMM operation leaves the queue clients consistent between
        // steps; a panicking test thread is no reason to fail the others.
        self.vmm.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Guest RAM of the VM.
    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    /// Allocates `npages` guest pages and maps them contiguously
    /// (`contiguous_align`: one guest-physical range aligned to it, else
    /// scattered pages).
    fn map_pages(
        &self,
        len: usize,
        align: usize,
        contiguous_align: Option<u64>,
    ) -> Result<VmmDma, TransportError> {
        let page = PAGE_SIZE as usize;
        let npages = len.div_ceil(page).max(1);
        let oom = || TransportError::OutOfMemory { size: len, align };
        let (pages, allocs): (Vec<u64>, Vec<GuestAddress>) = match contiguous_align {
            Some(a) => {
                let gpa = self
                    .mem
                    .alloc(npages as u64 * PAGE_SIZE, a)
                    .map_err(|_| oom())?;
                (
                    (0..npages as u64).map(|i| gpa.0 + i * PAGE_SIZE).collect(),
                    vec![gpa],
                )
            }
            None => {
                let v = self.mem.alloc_pages(npages, PAGE_SIZE).map_err(|_| oom())?;
                (v.iter().map(|g| g.0).collect(), v)
            }
        };
        self.map_given(len, align, pages, allocs)
    }

    /// Maps `pages` (of `len` bytes, allocated already: `allocs` are
    /// given back to the allocator on drop) contiguously at an address
    /// aligned to `align` (at least a page).
    fn map_given(
        &self,
        len: usize,
        align: usize,
        pages: Vec<u64>,
        allocs: Vec<GuestAddress>,
    ) -> Result<VmmDma, TransportError> {
        let page = PAGE_SIZE as usize;
        let npages = pages.len();
        let mut dma = VmmDma {
            mem: self.mem.clone(),
            va: Va::None,
            base: ptr::null_mut(),
            len,
            pages,
            allocs,
        };
        let va_align = align.max(page);
        let span = npages * page;
        // Pages that are one guest-physical range (a single page, or a
        // contiguous allocation) inside one RAM region are already side by
        // side in the guest RAM's own mapping: no mapping of their own (a
        // `mmap` and later a `munmap` with its TLB shootdown saved, for
        // most queues and headers), if the user asked for it
        // ([`VmmTransport::set_dma_in_ram_mapping`]).
        let first = dma.pages[0];
        let contiguous = dma
            .pages
            .iter()
            .enumerate()
            .all(|(i, &p)| p == first + i as u64 * PAGE_SIZE);
        if self.dma_in_ram.load(Ordering::Relaxed)
            && contiguous
            && self.mem.is_ram(first, span as u64)
        {
            if let Ok(host) = self.mem.host_address(GuestAddress(first)) {
                if host as usize % va_align == 0 {
                    dma.va = Va::Ram;
                    dma.base = host as *mut u8;
                    return Ok(dma);
                }
            }
        }
        if let Some(slot) = self.arena.take_view(&dma.pages, va_align) {
            // These very pages, mapped side by side at the slot already.
            dma.base = slot.start as *mut u8;
            dma.va = Va::Arena(self.arena.clone(), slot);
            return Ok(dma);
        }
        let start = match self.arena.take(span, va_align).map_err(io_err)? {
            Some(slot) => {
                let start = slot.start;
                dma.va = Va::Arena(self.arena.clone(), slot);
                start
            }
            None => {
                // Larger than a chunk: room of its own for the pages, plus
                // enough slack to align the start.
                let reservation_len = span + (va_align - page);
                // SAFETY: an anonymous PROT_NONE mapping chosen by the
                // kernel touches no existing memory; the result is checked.
                let res = unsafe {
                    libc::mmap(
                        ptr::null_mut(),
                        reservation_len,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if res == libc::MAP_FAILED {
                    return Err(io_err(std::io::Error::last_os_error()));
                }
                dma.va = Va::Own(res.cast::<u8>(), reservation_len);
                (res as usize).next_multiple_of(va_align)
            }
        };
        dma.base = start as *mut u8;
        let fd = self.mem.file().as_raw_fd();
        for (i, &gpa) in dma.pages.iter().enumerate() {
            let off = self
                .mem
                .file_offset(GuestAddress(gpa))
                .ok_or_else(|| TransportError::Other(format!("page {gpa:#x} is not RAM")))?;
            let off = libc::off_t::try_from(off)
                .map_err(|_| TransportError::Other(format!("file offset {off:#x}")))?;
            let at = start + i * page;
            // SAFETY: `at .. at + page` lies inside our own reservation
            // (start + span <= res + reservation_len) or arena slot (a range
            // of a chunk not handed out before since the chunk was last
            // cleared), which no other code uses, so MAP_FIXED replaces
            // nothing but our PROT_NONE pages;
            // the memfd is valid for the lifetime of `self.mem` and `off`
            // is a page-aligned offset inside it. The result is checked.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io_err(std::io::Error::last_os_error()));
            }
        }
        Ok(dma)
    }

    /// Waits for the call eventfd `fd` for at most `left` (bounded by
    /// [`WAIT_SLICE`]) and consumes it.
    fn sleep_on(fd: &EventFd, left: Duration) -> Result<(), TransportError> {
        if poll_readable(fd.as_raw_fd(), left.min(WAIT_SLICE)).map_err(map_err)? {
            drain(fd);
        }
        Ok(())
    }
}

/// DMA memory of a [`VmmTransport`]: guest pages mapped contiguously into
/// this process; freed on drop (and unmapped, at once or with the rest of
/// its chunk, [`crate::dma_arena`]).
#[derive(Debug)]
pub struct VmmDma {
    mem: Arc<GuestMem>,
    va: Va,
    base: *mut u8,
    len: usize,
    pages: Vec<u64>,
    /// What to give back to the guest allocator.
    allocs: Vec<GuestAddress>,
}

// SAFETY: the region is plain shared memory owned by this value; the raw
// pointers are only handed out for raw/volatile/atomic access (the
// `DmaRegion` contract), which is thread-agnostic.
unsafe impl Send for VmmDma {}
// SAFETY: as for `Send`: `&VmmDma` only exposes the pointer and page list.
unsafe impl Sync for VmmDma {}

// SAFETY: `base` is aligned to max(requested alignment, page size) and
// valid for reads and writes of `len` bytes (every page of
// `base .. base + npages * page` is a MAP_SHARED mapping of guest RAM: one
// of its own — made for it, or kept from a freed region of exactly these
// pages in this order, so mapping the same file offsets — or for one
// guest-physical range of one region the guest RAM's own mapping, which
// `mem` keeps alive) until drop; nothing else in this process references
// those pages (the test VMM uses the guest RAM's mapping only for rings it
// owns, never for these pages, which the allocator handed out to this
// region alone; a kept mapping of a freed region that includes some of them
// is not read or written through until a region of its exact pages takes
// it); `pages` has exactly
// ceil(len / page) entries (first page offset 0), page-aligned, and
// `pages[i]` is the guest-physical address of bytes `i * page ..`; with a
// requested alignment above the page size the pages are one guest-physical
// range aligned to it, and below it every page address is aligned.
unsafe impl DmaRegion for VmmDma {
    fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }

    fn page_shift(&self) -> u32 {
        PAGE_SIZE.trailing_zeros()
    }

    fn first_page_offset(&self) -> u32 {
        0
    }

    fn pages(&self) -> &[u64] {
        &self.pages
    }
}

/// Where a [`VmmDma`]'s pages are mapped.
#[derive(Debug)]
enum Va {
    /// Nowhere yet.
    None,
    /// In the guest RAM's own mapping ([`GuestMem::host_address`]): pages
    /// that are one range of one region.
    Ram,
    /// In a slot of the transport's arena.
    Arena(Arc<DmaArena>, Slot),
    /// In a reservation of its own (start, length).
    Own(*mut u8, usize),
}

impl Drop for VmmDma {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.va, Va::None) {
            Va::None | Va::Ram => {}
            Va::Arena(arena, slot) => arena.give_back(slot, &self.pages),
            Va::Own(reservation, len) => {
                // SAFETY: the reservation (with the fixed page mappings
                // inside it) was created by `map_pages` and is unmapped
                // exactly once, here; the driver no longer uses it (the
                // region is being dropped).
                let r = unsafe { libc::munmap(reservation.cast(), len) };
                if r != 0 {
                    log::warn!("munmap DMA region: {}", std::io::Error::last_os_error());
                }
            }
        }
        for &gpa in &self.allocs {
            let _ = self.mem.free(gpa);
        }
    }
}

/// The guest's view of the doorbell region.
#[derive(Debug)]
struct GuestShmem(Arc<ShmemWindow>);

// SAFETY: the window is a page-aligned mapping of `len()` bytes that lives
// as long as the `Arc` held here; the VMM only ever replaces pages inside
// it (MAP_FIXED), never unmaps it, and nothing forms Rust references to it.
unsafe impl SharedMemory for GuestShmem {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

impl Transport for VmmTransport {
    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self) -> Result<DeviceConfig, TransportError> {
        let mut vmm = self.vmm();
        match vmm.start_config() {
            Some(c) => Ok(*c),
            None => vmm.config().map_err(map_err),
        }
    }

    fn dma_page_shift(&self) -> u32 {
        PAGE_SIZE.trailing_zeros()
    }

    fn alloc_dma(&self, len: usize, align: usize) -> Result<Box<dyn DmaRegion>, TransportError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(TransportError::OutOfMemory { size: len, align });
        }
        let contiguous = (align as u64 > PAGE_SIZE).then_some(align as u64);
        Ok(Box::new(self.map_pages(len, align, contiguous)?))
    }

    fn adopt_dma(
        &self,
        pages: &[u64],
        first_page_offset: u32,
        len: usize,
    ) -> Result<Box<dyn DmaRegion>, TransportError> {
        let bad = |what: String| TransportError::Other(format!("adopting DMA pages: {what}"));
        if first_page_offset != 0 || len == 0 || pages.len() != len.div_ceil(PAGE_SIZE as usize) {
            return Err(bad(format!(
                "{} pages for {len} bytes at page offset {first_page_offset}",
                pages.len()
            )));
        }
        let allocs = self
            .mem
            .allocator()
            .allocations_covering(pages)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Box::new(self.map_given(
            len,
            PAGE_SIZE as usize,
            pages.to_vec(),
            allocs,
        )?))
    }

    fn submit(&self, request: &[&[u8]], response_len: usize) -> Result<Token, TransportError> {
        if !self.vmm().is_connected() {
            return Err(TransportError::Disconnected);
        }
        // The driver's header is the start of the request: split it off so
        // the control-queue client writes it back unchanged.
        let all: Vec<u8> = request.concat();
        if all.len() < RequestHeader::SIZE {
            return Err(TransportError::Other(format!(
                "request of {} bytes has no header",
                all.len()
            )));
        }
        let header = RequestHeader::read(&all[..RequestHeader::SIZE]);
        // Keep the driver's part boundaries after the header.
        let mut parts: Vec<&[u8]> = Vec::with_capacity(request.len());
        let mut skip = RequestHeader::SIZE;
        for p in request {
            if skip >= p.len() {
                skip -= p.len();
                if parts.is_empty() && skip == 0 {
                    // The header was a part of its own: say so with an
                    // empty first part.
                    parts.push(&[]);
                }
                continue;
            }
            parts.push(&p[skip..]);
            skip = 0;
        }
        let spec = RequestSpec {
            request_id: Some(header.request_id),
            opcode: header.opcode,
            reserved: header.reserved,
            parts: &parts,
            resp_payload_len: response_len.saturating_sub(ResponseHeader::SIZE),
            writable_split: None,
            writable_len: Some(response_len.max(ResponseHeader::SIZE)),
        };
        self.vmm().ctrl().submit_spec(&spec).map_err(map_err)
    }

    fn wait(&self, token: Token, timeout: Option<Duration>) -> Result<Vec<u8>, TransportError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let spin = self.wait_spin_us.load(Ordering::Relaxed);
        let spin_until = (spin > 0).then(|| Instant::now() + Duration::from_micros(spin));
        loop {
            let r = {
                let mut vmm = self.vmm();
                if !vmm.is_connected() {
                    // The back end dropped the VM with everything it held:
                    // no answer will come.
                    return Err(TransportError::Disconnected);
                }
                vmm.ctrl().wait_timeout(token, Duration::ZERO)
            };
            match r {
                Ok(c) => {
                    let mut bytes = ResponseHeader {
                        request_id: c.resp_request_id,
                        status: c.status,
                        detail: c.detail,
                    }
                    .to_bytes()
                    .to_vec();
                    bytes.extend_from_slice(&c.payload);
                    bytes.truncate(c.used_len as usize);
                    return Ok(bytes);
                }
                Err(Error::Timeout(_)) => {}
                Err(e) => return Err(map_err(e)),
            }
            if spin_until.is_some_and(|u| Instant::now() < u) {
                std::thread::yield_now();
                continue;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Err(TransportError::Timeout);
            }
            Self::sleep_on(&self.ctrl_call, left)?;
        }
    }

    fn notify(&self, queue: u16) -> Result<(), TransportError> {
        if queue == NOTIFYQ {
            if self.notify_held.load(Ordering::SeqCst) {
                self.held.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            // Unconditionally: the driver decided from DB_FLAG_KICK.
            return self.notify_kick.write(1).map_err(io_err);
        }
        let mut vmm = self.vmm();
        match queue {
            0 => vmm.ctrl().kick(),
            1 => vmm.events().vring_mut().kick().map(|()| true),
            q => return Err(TransportError::Other(format!("no virtqueue {q}"))),
        }
        .map(drop)
        .map_err(map_err)
    }

    fn shared_memory(&self, id: u8) -> Option<Arc<dyn SharedMemory>> {
        if id != SHMEM_ID_DOORBELL {
            return None;
        }
        self.shmem
            .clone()
            .map(|w| Arc::new(GuestShmem(w)) as Arc<dyn SharedMemory>)
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<Event>, TransportError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut vmm = self.vmm();
                let ev = vmm.events();
                if let Some(e) = ev.try_next_event().map_err(map_err)? {
                    return Ok(Some(e));
                }
                if ev.vring_mut().enable_interrupts().map_err(map_err)? {
                    continue;
                }
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Ok(None);
            }
            Self::sleep_on(&self.event_call, left)?;
        }
    }
}
