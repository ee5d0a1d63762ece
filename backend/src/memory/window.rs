//! Host-virtual windows over guest pages.
//!
//! A guest memory region is scattered over guest pages, and those over
//! the files behind guest RAM. A host RNIC registers a region as one
//! contiguous range of the daemon's address space; a window is that range:
//! the region's pages mapped again, in order, from the files behind guest
//! RAM (`MAP_SHARED | MAP_FIXED`), so that the RNIC reads and writes guest
//! RAM itself. Pages that follow each other in a file share one mapping.
//!
//! Every mapping counts against `vm.max_map_count` for the whole process
//! (guest RAM, libraries and thread stacks too); a [`MapBudget`] hands out
//! what is left to windows (and to what libibverbs providers map for host
//! queues), so that a guest registering fragmented memory gets an error
//! instead of taking the daemon's last mappings. Each VM draws from a
//! budget of its own ([`MapBudget::child`]), a share of the daemon's: one
//! VM cannot take what another needs.
//!
//! A page list may name one page many times, so a region's mappings are
//! not bounded by anything but its page count (a 16 GiB region over one
//! page repeated needs 4·10^6). They are counted first, in one pass that
//! allocates nothing and stops as soon as the budget is exceeded: a refusal
//! costs no more than the mappings the VM has left.
//!
//! A window holds the pages the guest RAM map had when it was made: after a
//! memory table update it must be made again.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::PageList;

/// The host page size the windows' mappings are made of.
const HOST_PAGE: u64 = super::HOST_PAGE_SIZE;

/// Why a window could not be made.
#[derive(Debug, Error)]
pub enum WindowError {
    /// The region is empty, or its span does not fit the address space.
    #[error("a window of {0} bytes cannot be mapped")]
    Size(u64),
    /// A page of the region is not guest RAM (any more).
    #[error("guest address {0:#x} is not RAM")]
    NotRam(u64),
    /// The RAM at a page is not backed by a file (it cannot be mapped twice).
    #[error("guest RAM at {0:#x} is not backed by a file")]
    NoFile(u64),
    /// A page's place in its file is not host-page aligned.
    #[error("guest address {0:#x} is not host-page aligned in its file")]
    Misaligned(u64),
    /// More mappings are needed than a budget has left.
    #[error("{needed} mappings needed (at least), {left} of {} budget of {limit} are left (vm.max_map_count)", if *.daemon { "the daemon's" } else { "the VM's" })]
    MapCount {
        /// Mappings needed (a window's count stops at `left + 1`).
        needed: usize,
        /// What is left of the budget.
        left: usize,
        /// The budget.
        limit: usize,
        /// The daemon's budget refused (false: the VM's own).
        daemon: bool,
    },
    /// `mmap(2)` failed.
    #[error("mmap: {0}")]
    Mmap(#[source] io::Error),
}

/// Mappings the rest of the daemon may need (guest RAM regions, libraries,
/// thread stacks and their guard pages, sockets' buffers): left out of the
/// windows' budget.
const RESERVED_MAPPINGS: usize = 4096;

/// What is left of the process's mappings for windows and host queues:
/// the daemon's, or a VM's share of it.
#[derive(Debug)]
pub struct MapBudget {
    limit: usize,
    used: AtomicUsize,
    /// The daemon's budget, for a VM's: every mapping taken here is taken
    /// there too.
    parent: Option<Arc<MapBudget>>,
}

impl MapBudget {
    /// A budget of `limit` mappings (the daemon's).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(MapBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: None,
        })
    }

    /// A VM's budget of `limit` mappings, each also taken from `parent`.
    pub fn child(parent: &Arc<MapBudget>, limit: usize) -> Arc<Self> {
        Arc::new(MapBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: Some(parent.clone()),
        })
    }

    /// Its limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What can be taken now: what is left of it and of its parent.
    pub fn left(&self) -> usize {
        let own = self.limit.saturating_sub(self.used());
        self.parent.as_ref().map_or(own, |p| own.min(p.left()))
    }

    /// Takes `n` mappings (from the parent too), given back when the
    /// charge is dropped.
    pub fn charge(self: &Arc<Self>, n: usize) -> Result<MapCharge, WindowError> {
        self.reserve(n)?;
        if let Some(p) = &self.parent {
            if let Err(e) = p.reserve(n) {
                self.used.fetch_sub(n, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(MapCharge {
            budget: self.clone(),
            n,
        })
    }

    /// The budget this system allows: `vm.max_map_count` less
    /// `RESERVED_MAPPINGS` for everything else (65530 − 4096 by default).
    pub fn from_system() -> io::Result<Arc<Self>> {
        let text = std::fs::read_to_string("/proc/sys/vm/max_map_count")?;
        let max: usize = text
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Self::new(max.saturating_sub(RESERVED_MAPPINGS)))
    }

    /// Mappings windows hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` mappings of this budget alone.
    fn reserve(&self, n: usize) -> Result<(), WindowError> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let left = self.limit.saturating_sub(cur);
            if n > left {
                return Err(WindowError::MapCount {
                    needed: n,
                    left,
                    limit: self.limit,
                    daemon: self.parent.is_none(),
                });
            }
            match self.used.compare_exchange_weak(
                cur,
                cur.saturating_add(n),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }
}

/// Mappings taken from a budget (and its parent), returned when dropped.
#[derive(Debug)]
pub struct MapCharge {
    budget: Arc<MapBudget>,
    n: usize,
}

impl MapCharge {
    /// The mappings it holds.
    pub fn mappings(&self) -> usize {
        self.n
    }
}

impl Drop for MapCharge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::Relaxed);
        if let Some(p) = &self.budget.parent {
            p.used.fetch_sub(self.n, Ordering::Relaxed);
        }
    }
}

/// A piece of a window: `len` bytes at `offset` of the window are `len`
/// bytes of file `fd` at `file_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    offset: u64,
    len: u64,
    fd: i32,
    file_offset: u64,
}

/// Calls `each(run)` for the runs of the first `span` bytes of `pages` (a
/// multiple of the host page size), merged where they follow each other in
/// one file, in order; a run is passed once it can grow no more. Stops
/// with `Ok(false)` when `each` returns false. Allocates nothing.
fn walk_runs(
    mem: &crate::memory::GuestRam,
    pages: &PageList,
    span: u64,
    mut each: impl FnMut(Run) -> bool,
) -> Result<bool, WindowError> {
    let mut cur: Option<Run> = None;
    let mut at = 0u64;
    while at < span {
        let (gpa, in_page) = pages.translate(at).ok_or(WindowError::Size(span))?;
        let region = mem
            .find_region(GuestAddress(gpa))
            .ok_or(WindowError::NotRam(gpa))?;
        let in_region = gpa
            .checked_sub(region.start_addr().0)
            .ok_or(WindowError::NotRam(gpa))?;
        let file = region.file_offset().ok_or(WindowError::NoFile(gpa))?;
        let file_offset = file
            .start()
            .checked_add(in_region)
            .ok_or(WindowError::NotRam(gpa))?;
        if file_offset % HOST_PAGE != 0 || in_page % HOST_PAGE != 0 {
            return Err(WindowError::Misaligned(gpa));
        }
        let len = in_page
            .min(span.saturating_sub(at))
            .min(region.len().saturating_sub(in_region));
        if len == 0 {
            return Err(WindowError::NotRam(gpa));
        }
        let fd = file.file().as_raw_fd();
        match cur.as_mut() {
            Some(last)
                if last.fd == fd && last.file_offset.checked_add(last.len) == Some(file_offset) =>
            {
                last.len = last.len.saturating_add(len);
            }
            _ => {
                let next = Run {
                    offset: at,
                    len,
                    fd,
                    file_offset,
                };
                if let Some(done) = cur.replace(next) {
                    if !each(done) {
                        return Ok(false);
                    }
                }
            }
        }
        at = at.saturating_add(len);
    }
    Ok(cur.is_none_or(each))
}

/// The number of runs of the first `span` bytes of `pages`, counted up to
/// `most + 1` (where the count stops: more than `most` is all a refusal
/// needs to know).
fn count_runs(
    mem: &crate::memory::GuestRam,
    pages: &PageList,
    span: u64,
    most: usize,
) -> Result<usize, WindowError> {
    let mut n = 0usize;
    walk_runs(mem, pages, span, |_| {
        n = n.saturating_add(1);
        n <= most
    })?;
    Ok(n)
}

/// The runs of the first `span` bytes of `pages` (`n` of them, counted
/// before).
fn runs(
    mem: &crate::memory::GuestRam,
    pages: &PageList,
    span: u64,
    n: usize,
) -> Result<Vec<Run>, WindowError> {
    let mut out = Vec::with_capacity(n);
    walk_runs(mem, pages, span, |r| {
        out.push(r);
        true
    })?;
    Ok(out)
}

/// A window: guest pages mapped again, in order, into one range of the
/// daemon's address space. Unmapped when dropped.
#[derive(Debug)]
pub struct Window {
    base: *mut u8,
    len: usize,
    maps: MapCharge,
    /// What each run maps: its place in the window, the file (device and
    /// inode) and the offset there.
    backing: Vec<Backing>,
}

/// One run of a window by file identity (a descriptor number may be
/// reused for another file after a memory table update).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backing {
    offset: u64,
    len: u64,
    dev: u64,
    ino: u64,
    file_offset: u64,
}

/// The identity (device, inode) of open file `fd`.
fn file_id(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid `stat`, which fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor guest RAM keeps open, into `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

fn backing_of(runs: &[Run]) -> Option<Vec<Backing>> {
    // Most runs are of one file or a few: one fstat per change of file.
    let mut last: Option<(i32, (u64, u64))> = None;
    runs.iter()
        .map(|r| {
            let (dev, ino) = match last {
                Some((fd, id)) if fd == r.fd => id,
                _ => {
                    let id = file_id(r.fd)?;
                    last = Some((r.fd, id));
                    id
                }
            };
            Some(Backing {
                offset: r.offset,
                len: r.len,
                dev,
                ino,
                file_offset: r.file_offset,
            })
        })
        .collect()
}

// SAFETY: the window is a shared mapping of guest RAM that only this value
// unmaps; the pointer is an address, handed to the RNIC, not dereferenced
// here. Guest RAM is accessed by many threads anyway (with volatile
// accesses, `memory::volatile`).
unsafe impl Send for Window {}
// SAFETY: as above; `&Window` only reads the address and length.
unsafe impl Sync for Window {}

impl Window {
    /// Maps the first `span` bytes of the region whose pages are `pages`
    /// (`span`: its first-page offset plus its length, rounded up to
    /// whole pages) from the files behind `mem`, taking its mappings from
    /// `budget`. The mappings are counted first: a window over more than
    /// the budget has left is refused before anything is built.
    pub fn map(
        mem: &crate::memory::GuestRam,
        pages: &PageList,
        span: u64,
        budget: &Arc<MapBudget>,
    ) -> Result<Window, WindowError> {
        if span == 0 || span % HOST_PAGE != 0 {
            return Err(WindowError::Size(span));
        }
        let len = usize::try_from(span).map_err(|_| WindowError::Size(span))?;
        let needed = count_runs(mem, pages, span, budget.left())?;
        let maps = budget.charge(needed)?;
        let runs = runs(mem, pages, span, needed)?;
        let backing =
            backing_of(&runs).ok_or_else(|| WindowError::Mmap(io::Error::last_os_error()))?;
        // A range of addresses nobody else gets, then each run over its part.
        // SAFETY: a new anonymous mapping at an address the kernel chooses;
        // it touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(WindowError::Mmap(io::Error::last_os_error()));
        }
        let window = Window {
            base: base.cast(),
            len,
            maps,
            backing,
        };
        for run in &runs {
            let (Ok(offset), Ok(run_len), Ok(file_offset)) = (
                usize::try_from(run.offset),
                usize::try_from(run.len),
                libc::off_t::try_from(run.file_offset),
            ) else {
                return Err(WindowError::Size(span));
            };
            // `offset + run_len <= len`: the runs tile `[0, span)`.
            let at = window.base.wrapping_add(offset);
            // SAFETY: `[at, at + run_len)` lies inside the window reserved
            // above, which this function owns: MAP_FIXED replaces only its
            // own reservation. `fd` is the file behind guest RAM, open for
            // as long as `mem` is borrowed; the kernel takes its own
            // reference for the mapping.
            let p = unsafe {
                libc::mmap(
                    at.cast(),
                    run_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    run.fd,
                    file_offset,
                )
            };
            if p == libc::MAP_FAILED {
                // `window` unmaps everything on the way out.
                return Err(WindowError::Mmap(io::Error::last_os_error()));
            }
        }
        Ok(window)
    }

    /// The window's first byte (the region's first page).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: a window has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the first `span` bytes of `pages` are, in `mem`, exactly the
    /// file pages this window maps (after a memory table update: a region
    /// whose RAM was left in place keeps its window and registration).
    pub fn same_backing(&self, mem: &crate::memory::GuestRam, pages: &PageList, span: u64) -> bool {
        if usize::try_from(span).ok() != Some(self.len) {
            return false;
        }
        // More runs than this window has cannot be the same backing.
        match count_runs(mem, pages, span, self.backing.len()) {
            Ok(n) if n == self.backing.len() => runs(mem, pages, span, n)
                .ok()
                .and_then(|r| backing_of(&r))
                .is_some_and(|b| b == self.backing),
            _ => false,
        }
    }

    /// The mappings it holds.
    pub fn mappings(&self) -> usize {
        self.maps.n
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the range `map` reserved, owned by this
        // value alone; nothing of it is used after this.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::FromRawFd;

    use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
    use vm_memory::{Bytes, FileOffset};

    use super::*;
    use crate::memory::pagelist::PageListLimits;
    use crate::memory::RamMap;

    const PAGE: u64 = 4096;
    /// The second region's guest address; its pages are 32.. of the file.
    const HIGH: u64 = 0x10_0000;

    /// Guest RAM as a VMM gives it: one memfd of 64 pages behind two
    /// regions (pages 0..32 at guest address 0, pages 32..64 at `HIGH`),
    /// every page filled with its file page number.
    fn guest() -> crate::memory::GuestRam {
        // SAFETY: a valid NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = Arc::new(unsafe { File::from_raw_fd(fd) });
        file.set_len(64 * PAGE).unwrap();
        let mem = crate::memory::GuestRam::from_ranges_with_files([
            (
                GuestAddress(0),
                32 * PAGE as usize,
                Some(FileOffset::from_arc(file.clone(), 0)),
            ),
            (
                GuestAddress(HIGH),
                32 * PAGE as usize,
                Some(FileOffset::from_arc(file, 32 * PAGE)),
            ),
        ])
        .unwrap();
        for p in 0..64u64 {
            let gpa = if p < 32 {
                p * PAGE
            } else {
                HIGH + (p - 32) * PAGE
            };
            mem.write_slice(&[p as u8; PAGE as usize], GuestAddress(gpa))
                .unwrap();
        }
        mem
    }

    fn list(mem: &crate::memory::GuestRam, gpas: &[u64]) -> PageList {
        let desc = BufferDesc {
            addr: 0,
            npages: gpas.len() as u32,
            first_page_offset: 0,
            page_shift: 12,
            mode: PageListMode::INLINE as u32,
        };
        let bytes: Vec<u8> = gpas.iter().flat_map(|g| g.to_le_bytes()).collect();
        let limits = PageListLimits {
            max_pages: 64,
            max_inline: 64,
            page_size_cap: 1 << 12,
            max_list_bytes: u64::MAX,
        };
        PageList::resolve(&desc, &bytes, &limits, &RamMap::from_guest_memory(mem), mem).unwrap()
    }

    /// The window shows the region's pages in the region's order, and a
    /// write through it lands in guest RAM.
    #[test]
    fn a_window_is_the_scattered_pages_in_order() {
        let mem = guest();
        let budget = MapBudget::new(100);
        let gpas = [7 * PAGE, 3 * PAGE, HIGH + 12 * PAGE, 5 * PAGE];
        let w = Window::map(&mem, &list(&mem, &gpas), 4 * PAGE, &budget).unwrap();
        assert_eq!(
            (w.len(), w.mappings(), budget.used()),
            (4 * PAGE as usize, 4, 4)
        );
        // SAFETY: the window is 4 pages of readable, writable shared memory.
        let view = unsafe { std::slice::from_raw_parts_mut(w.as_ptr(), w.len()) };
        for (i, page) in [7u8, 3, 44, 5].into_iter().enumerate() {
            let at = i * PAGE as usize;
            assert!(
                view[at..at + PAGE as usize].iter().all(|&b| b == page),
                "page {i}"
            );
        }
        view[PAGE as usize + 100] = 0xab;
        let mut b = [0u8; 1];
        mem.read_slice(&mut b, GuestAddress(3 * PAGE + 100))
            .unwrap();
        assert_eq!(b[0], 0xab, "written through the window");
        drop(w);
        assert_eq!(budget.used(), 0, "the mappings went back");
    }

    /// Pages that follow each other in the file share a mapping, also
    /// across the boundary of two regions of one file.
    #[test]
    fn pages_in_file_order_share_one_mapping() {
        let mem = guest();
        let budget = MapBudget::new(100);
        let w = Window::map(
            &mem,
            &list(&mem, &[4 * PAGE, 5 * PAGE, 6 * PAGE]),
            3 * PAGE,
            &budget,
        )
        .unwrap();
        assert_eq!(w.mappings(), 1);
        let across = [30 * PAGE, 31 * PAGE, HIGH, HIGH + PAGE];
        let w = Window::map(&mem, &list(&mem, &across), 4 * PAGE, &budget).unwrap();
        assert_eq!(w.mappings(), 1, "file pages 30..34");
    }

    /// A window that needs more mappings than are left fails, and says so;
    /// mappings given back are available again.
    #[test]
    fn the_mapping_budget_is_enforced() {
        let mem = guest();
        let budget = MapBudget::new(5);
        let scattered = list(&mem, &[9 * PAGE, PAGE, 20 * PAGE, 2 * PAGE]);
        let w = Window::map(&mem, &scattered, 4 * PAGE, &budget).unwrap();
        match Window::map(&mem, &scattered, 4 * PAGE, &budget) {
            Err(WindowError::MapCount {
                needed: 2,
                left: 1,
                limit: 5,
                daemon: true,
            }) => {}
            other => panic!("{other:?}"),
        }
        drop(w);
        assert!(Window::map(&mem, &scattered, 4 * PAGE, &budget).is_ok());
    }

    /// Each VM draws from a budget of its own: one VM out of mappings
    /// leaves another's untouched, and both draw from the daemon's.
    #[test]
    fn each_vm_draws_from_its_own_share() {
        let mem = guest();
        let daemon = MapBudget::new(10);
        let (a, b) = (MapBudget::child(&daemon, 5), MapBudget::child(&daemon, 5));
        let scattered = list(&mem, &[9 * PAGE, PAGE, 20 * PAGE, 2 * PAGE]);
        let wa = Window::map(&mem, &scattered, 4 * PAGE, &a).unwrap();
        match Window::map(&mem, &scattered, 4 * PAGE, &a) {
            Err(WindowError::MapCount {
                left: 1,
                limit: 5,
                daemon: false,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let wb = Window::map(&mem, &scattered, 4 * PAGE, &b).unwrap();
        assert_eq!((a.used(), b.used(), daemon.used()), (4, 4, 8));
        // A daemon budget smaller than the VMs' together refuses itself.
        let c = MapBudget::child(&daemon, 5);
        match c.charge(3) {
            Err(WindowError::MapCount {
                left: 2,
                limit: 10,
                daemon: true,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (c.used(), daemon.used()),
            (0, 8),
            "nothing kept of a refusal"
        );
        drop((wa, wb));
        assert_eq!((a.used(), b.used(), daemon.used()), (0, 0, 0));
    }

    /// A maximum-size region (16 GiB) over two guest pages repeated needs
    /// a mapping per page; with a budget of 1000 it is refused after
    /// looking at about 1000 pages, not 4·10^6: no allocation, no system
    /// call per page (it took seconds and ~300 MB of host memory).
    /// Run with `--release --nocapture` for the time and memory.
    #[test]
    fn a_window_over_a_repeated_page_is_refused_cheaply() {
        let mem = guest();
        let npages: u32 = 4 << 20;
        let desc = BufferDesc {
            addr: 0,
            npages,
            first_page_offset: 0,
            page_shift: 12,
            mode: PageListMode::INLINE as u32,
        };
        let bytes: Vec<u8> = (0..u64::from(npages))
            .flat_map(|i| ((i % 2) * PAGE).to_le_bytes())
            .collect();
        let limits = PageListLimits {
            max_pages: npages,
            max_inline: npages,
            page_size_cap: 1 << 12,
            max_list_bytes: u64::MAX,
        };
        let pages = PageList::resolve(
            &desc,
            &bytes,
            &limits,
            &RamMap::from_guest_memory(&mem),
            &mem,
        )
        .unwrap();
        drop(bytes);
        let budget = MapBudget::new(1000);
        let rss = max_rss_kib();
        let t = std::time::Instant::now();
        let r = Window::map(&mem, &pages, u64::from(npages) * PAGE, &budget);
        let took = t.elapsed();
        let grew = max_rss_kib().saturating_sub(rss);
        println!("refused in {took:?}, peak RSS +{grew} KiB");
        assert!(matches!(r, Err(WindowError::MapCount { .. })), "{r:?}");
        assert_eq!(budget.used(), 0);
        // The count stops one run past the budget: the walk ended there,
        // not after the 4·10^6 runs of the whole region (the time and RSS
        // above are for the record; a loaded machine makes them no test).
        let span = u64::from(npages) * PAGE;
        assert_eq!(count_runs(&mem, &pages, span, 1000).unwrap(), 1001);
        // Pages 0 and 1 follow each other in the file: a run per pair.
        assert_eq!(count_runs(&mem, &pages, 64 * PAGE, 1000).unwrap(), 32);
    }

    /// The process's peak resident set, KiB.
    fn max_rss_kib() -> u64 {
        // SAFETY: all-zero is a valid `rusage`, which getrusage fills.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF into `u`.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        u64::try_from(u.ru_maxrss).unwrap_or(0)
    }

    /// RAM without a file behind it cannot be mapped twice.
    #[test]
    fn anonymous_ram_is_refused() {
        let mem =
            crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 16 * PAGE as usize)]).unwrap();
        let budget = MapBudget::new(100);
        assert!(matches!(
            Window::map(&mem, &list(&mem, &[PAGE]), PAGE, &budget),
            Err(WindowError::NoFile(0x1000))
        ));
        assert!(matches!(
            Window::map(&mem, &list(&mem, &[PAGE]), 100, &budget),
            Err(WindowError::Size(100))
        ));
    }

    #[test]
    fn the_system_budget_is_below_max_map_count() {
        let b = MapBudget::from_system().unwrap();
        let max: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(b.limit, max.saturating_sub(RESERVED_MAPPINGS));
    }
}
