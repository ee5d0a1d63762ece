//! Dirty logging of the daemon's writes into guest RAM (spec 20.4), for a
//! VMM that migrates the VM: `VHOST_F_LOG_ALL`, `LOG_SHMFD` and
//! `SET_LOG_BASE`.
//!
//! The log is a bitmap in a file the VMM shares (a memfd): bit `p % 8` of
//! byte `p / 8` stands for the 4 KiB page `p` of guest-physical address
//! space. While the VMM has acknowledged `VHOST_F_LOG_ALL` and a log is
//! set, every write of the daemon into guest RAM sets the bits of the pages
//! it touched, after the write, with an atomic OR (the VMM reads and clears
//! the bits concurrently).
//!
//! Two kinds of writes reach guest RAM, and both mark the same [`LogMap`]:
//!
//! - the data path's, through [`super::HostMem`] (`access`, the soft RNIC's
//!   lanes): its `log` is the current log while logging is on and `None`
//!   otherwise, so that a write with logging off costs one predicted
//!   branch. The device rebuilds the engine's `HostMem` whenever logging
//!   turns on or off or the log changes ([`DirtyLog::set_hook`]);
//! - the vhost-user library's and the control path's (used rings, control
//!   responses, event buffers, doorbell halves, ring copies), through
//!   vm-memory's bitmap of each RAM region: [`RamBitmap`], the device's
//!   `VhostUserBackend::Bitmap`.
//!
//! The library (vhost-user-backend 0.24) handles `SET_LOG_BASE` itself: it
//! maps the file as it comes, with no check of its size or seals, and hands
//! the mapping to the bitmap type of each region ([`PendingLog`]). A log
//! file shorter than the mapping, or one the VMM truncates later, would
//! raise `SIGBUS` in the daemon at the first mark, as guest RAM would
//! (spec 19.6.1). So the daemon never touches the library's mapping: while
//! the library still holds the message's descriptor, [`PendingLog`] finds
//! it among the process's descriptors (the mapping's device and inode, from
//! `/proc/self/maps`), checks the file as strictly as a memory table's
//! (regular, sealed against shrinking unless `allow_unsealed_memory`, long
//! enough, at most [`MAX_LOG_BYTES`]) and maps it again; a log that fails
//! is refused, which fails the request and closes the connection.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use log::warn;
use thiserror::Error;
use vhost_user_backend::bitmap::{BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::NewBitmap;
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion};

/// The page size of the log (`VHOST_LOG_PAGE`).
pub const LOG_PAGE: u64 = 4096;

/// Largest log the daemon maps: 1 GiB, one bit per page of 32 TiB of
/// guest-physical address space.
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// The virtio feature bit of dirty logging (`VHOST_F_LOG_ALL`).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

/// The guest RAM of a device: vm-memory's mapping with [`RamBitmap`].
pub type GuestRam = GuestMemoryMmap<RamBitmap>;

/// Why a log is refused.
#[derive(Debug, Error)]
pub enum LogError {
    /// The library's mapping of the log is not in `/proc/self/maps`, or
    /// no descriptor of the process refers to its file.
    #[error("cannot find the log's file: {0}")]
    NoFile(String),
    /// The file cannot be examined.
    #[error("cannot stat the log's file: {0}")]
    Stat(io::Error),
    /// Not a regular file (memfd, tmpfs, hugetlbfs).
    #[error("the log's file is not a regular file")]
    NotRegular,
    /// The file may shrink under the mapping.
    #[error(
        "the log's file is not sealed against shrinking (F_SEAL_SHRINK); seal the memfd or \
         allow_unsealed_memory"
    )]
    Unsealed,
    /// `mmap_offset` is not a multiple of the host page size.
    #[error("log mmap offset {0:#x} is not page aligned")]
    Misaligned(u64),
    /// The log is larger than [`MAX_LOG_BYTES`].
    #[error("log of {0:#x} bytes is larger than the {MAX_LOG_BYTES:#x} the daemon maps")]
    TooLarge(u64),
    /// The log runs past the end of its file.
    #[error(
        "log mmap offset {offset:#x} + size {size:#x} is past the end of its {file_size:#x}-byte \
         file"
    )]
    PastEnd {
        /// `mmap_offset`.
        offset: u64,
        /// `mmap_size`.
        size: u64,
        /// The file's size.
        file_size: u64,
    },
    /// The log has no bit for some page of guest RAM.
    #[error(
        "the log's {size:#x} bytes do not cover guest RAM up to {end:#x} ({need:#x} bytes needed)"
    )]
    TooSmall {
        /// The log's size.
        size: u64,
        /// One past the last guest-physical address of RAM.
        end: u64,
        /// The bytes a log covering it has.
        need: u64,
    },
    /// `mmap` failed.
    #[error("cannot map the log: {0}")]
    Map(io::Error),
}

impl From<LogError> for io::Error {
    fn from(e: LogError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// Bytes of log that cover guest-physical addresses below `end`.
pub fn log_bytes_for(end: u64) -> u64 {
    end.div_ceil(LOG_PAGE).div_ceil(8)
}

/// A VMM's log, mapped by the daemon after its file was checked.
#[derive(Debug)]
pub struct LogMap {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the value and unmapped only when it is
// dropped; every access to it is an atomic operation on a byte inside it,
// so sharing it between threads is sound.
unsafe impl Send for LogMap {}
// SAFETY: as for `Send`.
unsafe impl Sync for LogMap {}

impl LogMap {
    /// Checks `file` and maps `[offset, offset + size)` of it.
    pub fn open(
        file: &File,
        offset: u64,
        size: u64,
        allow_unsealed: bool,
    ) -> Result<Self, LogError> {
        let meta = file.metadata().map_err(LogError::Stat)?;
        if !meta.file_type().is_file() {
            return Err(LogError::NotRegular);
        }
        if size > MAX_LOG_BYTES {
            return Err(LogError::TooLarge(size));
        }
        if offset % super::HOST_PAGE_SIZE != 0 {
            return Err(LogError::Misaligned(offset));
        }
        let file_size = meta.len();
        match offset.checked_add(size) {
            Some(end) if end <= file_size && size > 0 => {}
            _ => {
                return Err(LogError::PastEnd {
                    offset,
                    size,
                    file_size,
                })
            }
        }
        if !allow_unsealed && !super::table::shrink_sealed(file) {
            return Err(LogError::Unsealed);
        }
        let len = usize::try_from(size).map_err(|_| LogError::TooLarge(size))?;
        let off = libc::off_t::try_from(offset).map_err(|_| LogError::Misaligned(offset))?;
        // SAFETY: a new shared mapping of a file we checked: no address of
        // ours is given, so nothing existing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(LogError::Map(io::Error::last_os_error()));
        }
        Ok(LogMap {
            base: p.cast(),
            len,
        })
    }

    /// The log's size in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether the log is empty (never: a log of 0 bytes is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the log has a bit for every page below `end`.
    pub fn covers(&self, end: u64) -> bool {
        log_bytes_for(end) <= self.len()
    }

    /// The byte `i` of the log, if the log has it.
    #[inline]
    fn byte(&self, i: u64) -> Option<&AtomicU8> {
        let i = usize::try_from(i).ok().filter(|&i| i < self.len)?;
        // SAFETY: `i < len`, inside the mapping, which lives as long as
        // `self`; the file cannot shrink under it (checked when mapped);
        // the VMM changes the bytes concurrently, which is why they are
        // only accessed atomically.
        Some(unsafe { AtomicU8::from_ptr(self.base.add(i)) })
    }

    /// Marks the pages of `[gpa, gpa + len)` dirty. Call after the write:
    /// the release ordering makes the data visible before the bit to a VMM
    /// that clears the bit and then reads the page. Pages past the end of
    /// the log are not marked (the device refuses memory tables the log
    /// does not cover while logging is on).
    pub fn mark(&self, gpa: u64, len: u64) {
        let Some(last_byte) = len.checked_sub(1) else {
            return;
        };
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(last_byte) / LOG_PAGE;
        let mut page = first;
        while page <= last {
            let i = page / 8;
            let lo = page % 8;
            // The pages of this byte that the range covers: bits lo..=hi,
            // both below 8.
            let hi = if last / 8 == i { last % 8 } else { 7 };
            let width = hi.saturating_sub(lo);
            let mask = (0xffu8 >> 7u64.saturating_sub(width)) << lo;
            let Some(b) = self.byte(i) else {
                return;
            };
            b.fetch_or(mask, Ordering::Release);
            page = match i.checked_add(1).and_then(|n| n.checked_mul(8)) {
                Some(p) => p,
                None => return,
            };
        }
    }

    /// Whether the page of `gpa` is marked (tests, `dirty_at`).
    pub fn is_marked(&self, gpa: u64) -> bool {
        let page = gpa / LOG_PAGE;
        self.byte(page / 8)
            .is_some_and(|b| b.load(Ordering::Acquire) & (1 << (page % 8)) != 0)
    }
}

impl Drop for LogMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once, here; no
        // reference into it outlives `self`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// What a device does when its engine's view of the log must change: it
/// rebuilds the engine's `HostMem` with [`DirtyLog::engine_log`].
type Hook = Box<dyn Fn() + Send + Sync>;

/// One device's dirty logging: the log the VMM set and whether the VMM
/// asked for logging (`VHOST_F_LOG_ALL`).
#[derive(Default)]
pub struct DirtyLog {
    /// `VHOST_F_LOG_ALL` acknowledged and a log set: what the control
    /// path's writes check first (a plain load while off).
    on: AtomicBool,
    /// The log, and whether `VHOST_F_LOG_ALL` is acknowledged.
    state: Mutex<(Option<Arc<LogMap>>, bool)>,
    /// The log while `on`, for the control path's writes.
    active: RwLock<Option<Arc<LogMap>>>,
    /// Tells the device the engine's view must change.
    hook: OnceLock<Hook>,
}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog")
            .field("on", &self.on.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DirtyLog {
    /// A device's log state: off, no log.
    pub fn new() -> Arc<Self> {
        Arc::new(DirtyLog::default())
    }

    /// Sets what runs whenever [`DirtyLog::engine_log`] changes (once).
    pub fn set_hook(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.hook.set(Box::new(hook));
    }

    /// Whether logging is on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// The log the data path marks: `Some` while logging is on.
    pub fn engine_log(&self) -> Option<Arc<LogMap>> {
        match self.active.read() {
            Ok(g) => g.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }

    /// The log set last, on or off (tests, checks of a new memory table).
    pub fn current(&self) -> Option<Arc<LogMap>> {
        self.lock_state().0.clone()
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, (Option<Arc<LogMap>>, bool)> {
        match self.state.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    /// Applies a change of the log or of `VHOST_F_LOG_ALL`.
    fn update(&self, f: impl FnOnce(&mut (Option<Arc<LogMap>>, bool))) {
        let changed = {
            let mut st = self.lock_state();
            f(&mut st);
            let now = if st.1 { st.0.clone() } else { None };
            let mut active = match self.active.write() {
                Ok(g) => g,
                Err(e) => e.into_inner(),
            };
            let was = active.clone();
            *active = now.clone();
            self.on.store(now.is_some(), Ordering::Release);
            let same = match (&was, &now) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            !same
        };
        // Without our locks: the hook takes the VM's lock, under which the
        // control path marks through `active`.
        if changed {
            if let Some(h) = self.hook.get() {
                h();
            }
        }
    }

    /// `SET_FEATURES`: whether `VHOST_F_LOG_ALL` is acknowledged.
    pub fn set_log_all(&self, on: bool) {
        self.update(|st| st.1 = on);
    }

    /// `SET_LOG_BASE`: the new log (replacing any earlier one).
    pub fn install(&self, log: Arc<LogMap>) {
        self.update(|st| {
            if !st.0.as_ref().is_some_and(|l| Arc::ptr_eq(l, &log)) {
                st.0 = Some(log);
            }
        });
    }

    /// The VMM went away: logging off, the log unmapped.
    pub fn clear(&self) {
        self.update(|st| *st = (None, false));
    }

    /// Checks that the log covers guest RAM below `end` while logging is
    /// on (a new memory table; spec 20.4).
    pub fn check_covers(&self, end: u64) -> Result<(), LogError> {
        match self.engine_log() {
            Some(l) if !l.covers(end) => Err(LogError::TooSmall {
                size: l.len(),
                end,
                need: log_bytes_for(end),
            }),
            _ => Ok(()),
        }
    }

    /// Marks `[gpa, gpa + len)` for the control path (a write through
    /// vm-memory).
    #[inline]
    fn mark(&self, gpa: u64, len: u64) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        self.mark_on(gpa, len);
    }

    #[cold]
    fn mark_on(&self, gpa: u64, len: u64) {
        let g = match self.active.read() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        if let Some(l) = g.as_ref() {
            l.mark(gpa, len);
        }
    }

    fn is_marked(&self, gpa: u64) -> bool {
        self.engine_log().is_some_and(|l| l.is_marked(gpa))
    }
}

/// Where one RAM region lies and whose log its writes mark (set by the
/// device when it accepts a memory table).
#[derive(Debug, Default)]
struct RegionLog {
    /// The region's first guest-physical address.
    gpa: AtomicU64,
    /// The device's log state (a strong reference: marking with logging
    /// off must not cost an atomic operation, as upgrading would).
    owner: OnceLock<Arc<DirtyLog>>,
}

/// vm-memory's dirty bitmap of one guest RAM region: marks the device's
/// log (see the module documentation). Creating one costs an allocation;
/// an access through vm-memory borrows it (no reference count changes),
/// and marking with logging off costs a load and a branch.
#[derive(Debug, Clone, Default)]
pub struct RamBitmap {
    region: Arc<RegionLog>,
}

impl RamBitmap {
    /// Makes the region's writes mark `log`, the region starting at `gpa`.
    /// A region belongs to one device: a second owner is ignored.
    pub fn attach(&self, gpa: u64, log: &Arc<DirtyLog>) {
        self.region.gpa.store(gpa, Ordering::Release);
        let _ = self.region.owner.set(log.clone());
    }

    fn owner(&self) -> Option<&Arc<DirtyLog>> {
        self.region.owner.get()
    }

    /// The guest-physical address of `offset` into the region.
    fn gpa(&self, offset: usize) -> u64 {
        self.region
            .gpa
            .load(Ordering::Acquire)
            .saturating_add(offset as u64)
    }
}

impl<'a> WithBitmapSlice<'a> for RamBitmap {
    type S = RefSlice<'a, RamBitmap>;
}

impl Bitmap for RamBitmap {
    #[inline]
    fn mark_dirty(&self, offset: usize, len: usize) {
        if let Some(d) = self.region.owner.get() {
            d.mark(self.gpa(offset), len as u64);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.owner().is_some_and(|d| d.is_marked(self.gpa(offset)))
    }

    fn slice_at(&self, offset: usize) -> RefSlice<'_, RamBitmap> {
        RefSlice::new(self, offset)
    }
}

impl NewBitmap for RamBitmap {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}

/// Attaches every region of a memory table to `log` (before the table is
/// used, so that no write through it goes unlogged).
pub fn attach_table(mem: &GuestRam, log: &Arc<DirtyLog>) {
    for r in mem.iter() {
        // The region's own bitmap (the trait's `bitmap` is a slice of it).
        MmapRegion::bitmap(r).attach(r.start_addr().raw_value(), log);
    }
}

/// One past the last guest-physical address of `mem`'s RAM.
pub fn ram_end(mem: &GuestRam) -> u64 {
    mem.iter()
        .map(|r| r.start_addr().raw_value().saturating_add(r.len()))
        .max()
        .unwrap_or(0)
}

/// What the library hands each region at `SET_LOG_BASE`: the checked log
/// (see the module documentation).
#[derive(Debug)]
pub struct PendingLog(Arc<LogMap>);

thread_local! {
    /// The log checked for the library's mapping being handed to the
    /// regions on this thread now (one `SET_LOG_BASE`: the library calls
    /// [`PendingLog::new`] once per region with the same mapping).
    static CHECKED: std::cell::RefCell<Option<(Weak<MmapLogReg>, Arc<LogMap>)>> =
        const { std::cell::RefCell::new(None) };
}

impl MemRegionBitmap for PendingLog {
    fn new<R: GuestMemoryRegion>(region: &R, logmem: Arc<MmapLogReg>) -> io::Result<Self> {
        let start = region.start_addr().raw_value();
        let end = start.saturating_add(region.len());
        let cached = CHECKED.with(|c| {
            c.borrow()
                .as_ref()
                .filter(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&logmem)))
                .filter(|(w, _)| w.strong_count() > 0)
                .map(|(_, l)| l.clone())
        });
        let log = match cached {
            Some(l) => l,
            None => {
                let l = Arc::new(check_library_log(&logmem).inspect_err(|e| {
                    warn!("SET_LOG_BASE refused: {e}");
                })?);
                CHECKED.with(|c| *c.borrow_mut() = Some((Arc::downgrade(&logmem), l.clone())));
                l
            }
        };
        if !log.covers(end) {
            let e = LogError::TooSmall {
                size: log.len(),
                end,
                need: log_bytes_for(end),
            };
            warn!("SET_LOG_BASE refused: {e}");
            return Err(e.into());
        }
        Ok(PendingLog(log))
    }
}

impl BitmapReplace for RamBitmap {
    type InnerBitmap = PendingLog;

    fn replace(&self, log: PendingLog) {
        // Every region has been checked by now: the next request starts
        // afresh (and the log is not kept alive by the cache).
        CHECKED.with(|c| c.borrow_mut().take());
        if let Some(d) = self.owner() {
            d.install(log.0);
        }
    }
}

/// Finds the file of the library's mapping of a log and maps it again
/// after checking it.
fn check_library_log(logmem: &MmapLogReg) -> Result<LogMap, LogError> {
    // The library refuses a log of 0 bytes, so byte 0 exists; taking its
    // address reads nothing.
    let addr = std::ptr::from_ref(&logmem[0]) as usize;
    let m = mapping_at(addr)?;
    let file = fd_of(m.dev_major, m.dev_minor, m.inode)?;
    let allow = CONN_ALLOW_UNSEALED.with(std::cell::Cell::get);
    // The mapping's length is `mmap_size` rounded up to a page (the
    // library keeps the size to itself): a file that ends within that
    // last page may be exactly as long as the log; one that ends before
    // it is shorter than the log the VMM announced.
    let file_size = file.metadata().map_err(LogError::Stat)?.len();
    let room = file_size.saturating_sub(m.offset);
    if room.saturating_add(super::HOST_PAGE_SIZE - 1) < m.len || room == 0 {
        return Err(LogError::PastEnd {
            offset: m.offset,
            size: m.len,
            file_size,
        });
    }
    LogMap::open(&file, m.offset, m.len.min(room), allow)
}

thread_local! {
    /// `allow_unsealed_memory` of the device whose vhost-user connection
    /// this thread serves: the library's call at `SET_LOG_BASE` has no
    /// device to ask, but it runs on the connection's thread, where the
    /// device's `update_memory` ran before (the library hands a log only
    /// to the regions of a memory table).
    static CONN_ALLOW_UNSEALED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets `allow_unsealed_memory` for the logs of the connection this thread
/// serves (see `CONN_ALLOW_UNSEALED`).
pub fn set_conn_allow_unsealed(on: bool) {
    CONN_ALLOW_UNSEALED.with(|c| c.set(on));
}

/// A line of `/proc/self/maps`.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    len: u64,
    offset: u64,
    dev_major: u32,
    dev_minor: u32,
    inode: u64,
}

/// Parses a line of `/proc/self/maps` that starts at `addr`.
fn parse_maps_line(line: &str, addr: usize) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    if start != addr as u64 {
        return None;
    }
    let end = u64::from_str_radix(end, 16).ok()?;
    let _perms = f.next()?;
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let (maj, min) = f.next()?.split_once(':')?;
    let inode = f.next()?.parse().ok()?;
    Some(Mapping {
        len: end.checked_sub(start)?,
        offset,
        dev_major: u32::from_str_radix(maj, 16).ok()?,
        dev_minor: u32::from_str_radix(min, 16).ok()?,
        inode,
    })
}

/// The mapping of the process that starts at `addr`.
fn mapping_at(addr: usize) -> Result<Mapping, LogError> {
    let maps = File::open("/proc/self/maps")
        .map_err(|e| LogError::NoFile(format!("/proc/self/maps: {e}")))?;
    for line in BufReader::new(maps).lines() {
        let line = line.map_err(|e| LogError::NoFile(format!("/proc/self/maps: {e}")))?;
        if let Some(m) = parse_maps_line(&line, addr) {
            return Ok(m);
        }
    }
    Err(LogError::NoFile(format!("no mapping at {addr:#x}")))
}

/// `fstat` of a descriptor: its device and inode.
fn dev_ino(fd: libc::c_int) -> Option<(libc::dev_t, libc::ino_t)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `struct stat` into the buffer we own and
    // reads nothing of ours; an unknown descriptor fails with EBADF.
    let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled the structure.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// A new descriptor of the file with this device and inode, found among
/// the process's descriptors (the library holds the log's while it maps
/// it).
fn fd_of(major: u32, minor: u32, inode: u64) -> Result<File, LogError> {
    let want = (libc::makedev(major, minor), inode);
    let dir = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| LogError::NoFile(format!("/proc/self/fd: {e}")))?;
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::c_int>().ok())
        else {
            continue;
        };
        if dev_ino(fd) != Some(want) {
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor of whatever `fd`
        // refers to now; it touches no memory of ours.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            continue;
        }
        // SAFETY: `dup` is a new descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(dup) };
        // `fd` may have been closed and reused since the fstat: check the
        // duplicate itself.
        if dev_ino(file.as_raw_fd()) == Some(want) {
            return Ok(file);
        }
    }
    Err(LogError::NoFile(format!(
        "no descriptor of the file {major:x}:{minor:x} inode {inode}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::memory::table::tests::memfd;

    #[test]
    fn marks_whole_pages_and_stops_at_the_end() {
        let f = memfd(4096, libc::F_SEAL_SHRINK);
        let l = LogMap::open(&f, 0, 2, false).unwrap();
        l.mark(0x1fff, 2); // pages 1 and 2
        assert!(!l.is_marked(0) && l.is_marked(0x1000) && l.is_marked(0x2000));
        assert!(!l.is_marked(0x3000));
        l.mark(0x5000, 0x6000); // pages 5..=10, across bytes 0 and 1
        for p in 5..=10u64 {
            assert!(l.is_marked(p * 4096), "page {p}");
        }
        assert!(!l.is_marked(11 * 4096));
        // Past the log's 16 pages: nothing written, nothing fails.
        l.mark(15 * 4096, 1 << 30);
        assert!(l.is_marked(15 * 4096));
        l.mark(u64::MAX - 10, 100);
        assert!(!l.covers(17 * 4096) && l.covers(16 * 4096));
    }

    #[test]
    fn bad_log_files_are_refused() {
        let sealed = memfd(8192, libc::F_SEAL_SHRINK);
        assert!(matches!(
            LogMap::open(&sealed, 0, 8193, false),
            Err(LogError::PastEnd { .. })
        ));
        assert!(matches!(
            LogMap::open(&sealed, 4096, 8192, false),
            Err(LogError::PastEnd { .. })
        ));
        assert!(matches!(
            LogMap::open(&sealed, 100, 10, false),
            Err(LogError::Misaligned(100))
        ));
        assert!(matches!(
            LogMap::open(&sealed, 0, MAX_LOG_BYTES + 1, false),
            Err(LogError::TooLarge(_))
        ));
        let open = memfd(8192, 0);
        assert!(matches!(
            LogMap::open(&open, 0, 8192, false),
            Err(LogError::Unsealed)
        ));
        LogMap::open(&open, 0, 8192, true).unwrap();
    }

    #[test]
    fn finds_the_file_of_a_mapping() {
        let f = memfd(8192, libc::F_SEAL_SHRINK);
        // SAFETY: a new shared mapping of our memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let m = mapping_at(p as usize).unwrap();
        assert_eq!((m.len, m.offset), (8192, 0));
        let found = fd_of(m.dev_major, m.dev_minor, m.inode).unwrap();
        assert_eq!(
            dev_ino(found.as_raw_fd()),
            dev_ino(f.as_raw_fd()),
            "the same file"
        );
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, 8192) };
    }

    #[test]
    fn control_path_writes_mark_only_while_on() {
        use vm_memory::{Bytes, GuestAddress};
        let mem = GuestRam::from_ranges(&[(GuestAddress(0x10_0000), 0x10_0000)]).unwrap();
        let d = DirtyLog::new();
        attach_table(&mem, &d);
        let f = memfd(4096, libc::F_SEAL_SHRINK);
        let log = Arc::new(LogMap::open(&f, 0, 4096, false).unwrap());
        d.install(log.clone());
        mem.write_slice(&[1; 10], GuestAddress(0x10_3000)).unwrap();
        assert!(!log.is_marked(0x10_3000), "LOG_ALL not acked");
        d.set_log_all(true);
        mem.write_slice(&[1; 10], GuestAddress(0x10_3ffc)).unwrap();
        assert!(log.is_marked(0x10_3000) && log.is_marked(0x10_4000));
        assert!(!log.is_marked(0x10_5000));
        d.set_log_all(false);
        mem.write_slice(&[1; 10], GuestAddress(0x10_8000)).unwrap();
        assert!(!log.is_marked(0x10_8000));
    }

    #[test]
    fn maps_lines_parse() {
        let l = "7f12a000-7f12c000 rw-s 00002000 00:01 1234   /memfd:log (deleted)";
        assert_eq!(
            parse_maps_line(l, 0x7f12_a000),
            Some(Mapping {
                len: 0x2000,
                offset: 0x2000,
                dev_major: 0,
                dev_minor: 1,
                inode: 1234
            })
        );
        assert_eq!(parse_maps_line(l, 0x7f12_b000), None);
    }
}
