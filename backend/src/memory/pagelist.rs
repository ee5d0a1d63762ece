//! Page lists: validation of guest-supplied page addresses and the
//! resulting guest-physical translation.
//!
//! The guest describes memory as equally sized pages (see `BufferDesc` in
//! the spec). Every page must be aligned and lie wholly inside one RAM
//! region; the result is the per-page translation the data path uses.

use thiserror::Error;
use virtio_rdma_abi::mem::{
    indirect_list_pages, BufferDesc, PageListMode, LIST_PAGE_ENTRIES, LIST_PAGE_SIZE,
    MAX_PAGE_SHIFT, MIN_PAGE_SHIFT,
};
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::volatile::read_guest;
use super::RamMap;

/// Why a page list was rejected.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum PageListError {
    /// `mode` is not a defined page list mode.
    #[error("unknown page list mode {0}")]
    BadMode(u32),
    /// `page_shift` is out of range or not in the device's page size set.
    #[error("unsupported page shift {0}")]
    BadPageShift(u32),
    /// `npages` is zero.
    #[error("empty page list")]
    NoPages,
    /// More pages than the device allows.
    #[error("{0} pages exceed the device limit")]
    TooManyPages(u32),
    /// An inline list longer than the device allows.
    #[error("{0} inline pages exceed the device limit")]
    TooManyInline(u32),
    /// `addr` is not zero for a mode that does not use it.
    #[error("addr must be 0 for this mode")]
    AddrNotZero,
    /// The bytes following the fixed part do not have the size the mode needs.
    #[error("page list is {got} bytes, expected {expected}")]
    ListLength {
        /// Bytes the mode requires.
        expected: u64,
        /// Bytes supplied.
        got: usize,
    },
    /// A page is misaligned or not inside guest RAM.
    #[error("page {index} is misaligned or outside guest RAM")]
    BadPage {
        /// Index of the page in the list.
        index: u32,
    },
    /// The translation would take more host memory than the VM has left of
    /// its budget (`max_host_bytes`).
    #[error("a translation of {0} bytes exceeds the host memory budget")]
    OverBudget(u64),
    /// An indirect list page is misaligned, outside RAM or unreadable.
    #[error("indirect list page {index} is misaligned or outside guest RAM")]
    BadListPage {
        /// Index of the list page.
        index: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pages {
    Contiguous(u64),
    List(Vec<u64>),
}

/// A validated page list: guest-physical address of every page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageList {
    page_shift: u32,
    npages: u32,
    pages: Pages,
}

/// Limits that apply to a page list.
#[derive(Debug, Clone, Copy)]
pub struct PageListLimits {
    /// Most pages in one list.
    pub max_pages: u32,
    /// Most pages in an inline list.
    pub max_inline: u32,
    /// Allowed page sizes (bit n = 2^n bytes).
    pub page_size_cap: u64,
    /// Host bytes the translation may take (what is left of the VM's
    /// budget): checked before anything is allocated.
    pub max_list_bytes: u64,
}

impl PageList {
    /// No pages: the ring of a queue that has none (an XRC_TGT QP).
    pub fn none() -> Self {
        PageList {
            page_shift: MIN_PAGE_SHIFT,
            npages: 0,
            pages: Pages::Contiguous(0),
        }
    }

    /// Validates `desc` and the list bytes that followed it in the request,
    /// reading indirect list pages from guest memory.
    pub fn resolve<M: GuestMemoryBackend>(
        desc: &BufferDesc,
        trailing: &[u8],
        limits: &PageListLimits,
        ram: &RamMap,
        mem: &M,
    ) -> Result<PageList, PageListError> {
        let mode = PageListMode::from_u32(desc.mode).ok_or(PageListError::BadMode(desc.mode))?;
        let shift = desc.page_shift;
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift)
            || limits.page_size_cap & (1u64 << shift) == 0
        {
            return Err(PageListError::BadPageShift(shift));
        }
        let npages = desc.npages;
        if npages == 0 {
            return Err(PageListError::NoPages);
        }
        if npages > limits.max_pages {
            return Err(PageListError::TooManyPages(npages));
        }
        let page = 1u64 << shift;
        let check = |index: u32, gpa: u64| -> Result<(), PageListError> {
            // Aligned: the low `shift` bits are zero.
            if gpa.trailing_zeros() < shift || !ram.contains(gpa, page) {
                return Err(PageListError::BadPage { index });
            }
            Ok(())
        };
        let pages = match mode {
            PageListMode::CONTIGUOUS => {
                expect_len(trailing, 0)?;
                // Check page by page: consecutive GPAs may span adjacent regions.
                let mut gpa = desc.addr;
                let mut pace = Pace::default();
                for index in 0..npages {
                    pace.page();
                    check(index, gpa)?;
                    gpa = gpa
                        .checked_add(page)
                        .ok_or(PageListError::BadPage { index })?;
                }
                Pages::Contiguous(desc.addr)
            }
            PageListMode::INLINE => {
                if desc.addr != 0 {
                    return Err(PageListError::AddrNotZero);
                }
                if npages > limits.max_inline {
                    return Err(PageListError::TooManyInline(npages));
                }
                expect_len(trailing, u64::from(npages).saturating_mul(8))?;
                budget(limits, desc.mode, npages)?;
                let mut list = Vec::with_capacity(npages as usize);
                for (index, raw) in (0u32..).zip(trailing.chunks_exact(8)) {
                    let gpa = le64(raw);
                    check(index, gpa)?;
                    list.push(gpa);
                }
                Pages::List(list)
            }
            PageListMode::INDIRECT => {
                if desc.addr != 0 {
                    return Err(PageListError::AddrNotZero);
                }
                let nlist = indirect_list_pages(npages);
                expect_len(trailing, nlist.saturating_mul(8))?;
                budget(limits, desc.mode, npages)?;
                let mut list = Vec::with_capacity(npages as usize);
                // Bounded: LIST_PAGE_SIZE is the constant 4096.
                #[allow(clippy::cast_possible_truncation)]
                let mut buf = vec![0u8; LIST_PAGE_SIZE as usize];
                let mut index = 0u32;
                let mut pace = Pace::default();
                for (li, raw) in (0u32..).zip(trailing.chunks_exact(8)) {
                    let lp = le64(raw);
                    if lp % LIST_PAGE_SIZE != 0 || !ram.contains(lp, LIST_PAGE_SIZE) {
                        return Err(PageListError::BadListPage { index: li });
                    }
                    // Copy the list page out first: the guest may change it
                    // while we look at it.
                    read_guest(mem, GuestAddress(lp), &mut buf)
                        .map_err(|_| PageListError::BadListPage { index: li })?;
                    // `index <= npages`: each list page takes at most the
                    // pages still missing.
                    let left = u64::from(npages.saturating_sub(index)).min(LIST_PAGE_ENTRIES);
                    let take = usize::try_from(left).unwrap_or(usize::MAX);
                    for raw in buf.chunks_exact(8).take(take) {
                        pace.page();
                        let gpa = le64(raw);
                        check(index, gpa)?;
                        list.push(gpa);
                        index = index.saturating_add(1);
                    }
                }
                Pages::List(list)
            }
        };
        Ok(PageList {
            page_shift: shift,
            npages,
            pages,
        })
    }

    /// A contiguous list of a loaded device state (spec 20.3), checked as
    /// [`PageList::resolve`] checks one against this RAM: `npages` pages
    /// of `2^page_shift` bytes from `base` on. No page at all is the ring of
    /// a queue that has none.
    pub fn restore_contiguous(
        page_shift: u32,
        base: u64,
        npages: u32,
        ram: &RamMap,
        page_size_cap: u64,
    ) -> Result<PageList, PageListError> {
        if npages == 0 {
            return if base == 0 && page_shift == MIN_PAGE_SHIFT {
                Ok(PageList::none())
            } else {
                Err(PageListError::AddrNotZero)
            };
        }
        let pages = (0..npages).map(|i| {
            u64::from(i)
                .checked_shl(page_shift)
                .and_then(|off| base.checked_add(off))
                .unwrap_or(u64::MAX)
        });
        check_restored(page_shift, pages, ram, page_size_cap)?;
        Ok(PageList {
            page_shift,
            npages,
            pages: Pages::Contiguous(base),
        })
    }

    /// A list of pages of a loaded device state, checked as
    /// [`PageList::restore_contiguous`] checks.
    pub fn restore_list(
        page_shift: u32,
        pages: Vec<u64>,
        ram: &RamMap,
        page_size_cap: u64,
    ) -> Result<PageList, PageListError> {
        let npages =
            u32::try_from(pages.len()).map_err(|_| PageListError::TooManyPages(u32::MAX))?;
        if npages == 0 {
            return Err(PageListError::NoPages);
        }
        check_restored(page_shift, pages.iter().copied(), ram, page_size_cap)?;
        Ok(PageList {
            page_shift,
            npages,
            pages: Pages::List(pages),
        })
    }

    /// An empty translation with room for `max_pages` pages, which
    /// [`PageList::refill`] fills later without allocating (the
    /// translation space of a fast-registration region, spec 12.22).
    pub fn reserved(max_pages: u32) -> PageList {
        PageList {
            page_shift: MIN_PAGE_SHIFT,
            npages: 0,
            pages: Pages::List(Vec::with_capacity(max_pages as usize)),
        }
    }

    /// Makes this a list of `pages` of `2^page_shift` bytes (the caller
    /// validated them) in the room [`PageList::reserved`] made; false,
    /// with nothing changed, if they do not fit in it. Allocates nothing,
    /// so [`PageList::host_bytes`] stays what it was.
    pub fn refill(&mut self, page_shift: u32, pages: impl ExactSizeIterator<Item = u64>) -> bool {
        let Pages::List(list) = &mut self.pages else {
            return false;
        };
        let Ok(n) = u32::try_from(pages.len()) else {
            return false;
        };
        if pages.len() > list.capacity() {
            return false;
        }
        list.clear();
        list.extend(pages);
        self.npages = n;
        self.page_shift = page_shift;
        true
    }

    /// The first page of a contiguous list (`None` for a list of pages).
    pub fn contiguous_base(&self) -> Option<u64> {
        match self.pages {
            Pages::Contiguous(base) => Some(base),
            Pages::List(_) => None,
        }
    }

    /// The number of pages.
    pub fn npages(&self) -> u32 {
        self.npages
    }

    /// log2 of the page size.
    pub fn page_shift(&self) -> u32 {
        self.page_shift
    }

    /// Guest-physical address of page `index`.
    pub fn page(&self, index: u32) -> Option<u64> {
        if index >= self.npages {
            return None;
        }
        match &self.pages {
            Pages::Contiguous(base) => base.checked_add(u64::from(index) << self.page_shift),
            Pages::List(list) => list.get(index as usize).copied(),
        }
    }

    /// Guest-physical address of byte `offset` of the described memory, and
    /// how many bytes are contiguous from there to the end of its page.
    pub fn translate(&self, offset: u64) -> Option<(u64, u64)> {
        let page = 1u64 << self.page_shift;
        let index = u32::try_from(offset >> self.page_shift).ok()?;
        // The low `page_shift` bits.
        let within = offset & !(u64::MAX << self.page_shift);
        Some((
            self.page(index)?.checked_add(within)?,
            page.checked_sub(within)?,
        ))
    }

    /// Calls `f(gpa, len)` for the pieces of `[offset, offset + len)` of
    /// the described memory in order: a piece per page, or one piece for
    /// a contiguous description. `None` when the range is not inside the
    /// pages (nothing is called then). A walk over the list itself: the
    /// data path resolves a large message's pages with it.
    #[inline]
    pub fn walk(&self, offset: u64, len: u64, mut f: impl FnMut(u64, u64)) -> Option<()> {
        let end = offset.checked_add(len)?;
        let size = u64::from(self.npages) << self.page_shift;
        if end > size || len == 0 {
            return (end <= size).then_some(());
        }
        match &self.pages {
            Pages::Contiguous(base) => f(base.checked_add(offset)?, len),
            Pages::List(list) => {
                let first = usize::try_from(offset >> self.page_shift).ok()?;
                let page = 1u64 << self.page_shift;
                // The low `page_shift` bits.
                let mut within = offset & !(u64::MAX << self.page_shift);
                let mut left = len;
                for &gpa in list.get(first..)? {
                    // `within < page`, and every page lies inside RAM
                    // (validated): neither operation wraps or saturates.
                    let take = page.saturating_sub(within).min(left);
                    f(gpa.wrapping_add(within), take);
                    left = left.saturating_sub(take);
                    if left == 0 {
                        break;
                    }
                    within = 0;
                }
            }
        }
        Some(())
    }

    /// Host memory used by the translation, in bytes (fixed once the list
    /// is built).
    pub fn host_bytes(&self) -> u64 {
        match &self.pages {
            Pages::Contiguous(_) => 0,
            Pages::List(l) => (l.capacity() as u64).saturating_mul(8),
        }
    }

    /// Frees the translation. A large one is given back to the kernel in
    /// steps of [`RELEASE_STEP`] with the CPU offered between them, rather
    /// than in one `munmap` of up to `max_mr_pages` × 8 bytes: freeing the
    /// 32 MiB of a 16 GiB region took ~2.5 ms of kernel time in one system
    /// call, during which threads woken on the same CPU — the engine,
    /// another VM's notification — waited (issue 26, N1; docs/isolation.md).
    pub fn release(self) {
        if let Pages::List(list) = self.pages {
            release_list(list);
        }
    }

    /// Host bytes the translation of a list of `npages` pages in `mode`
    /// takes, before it is built.
    pub fn host_bytes_for(mode: u32, npages: u32) -> u64 {
        if mode == PageListMode::CONTIGUOUS as u32 {
            0
        } else {
            u64::from(npages).saturating_mul(8)
        }
    }
}

/// The checks of [`PageList::resolve`] for the pages of a loaded state.
fn check_restored(
    shift: u32,
    pages: impl Iterator<Item = u64>,
    ram: &RamMap,
    page_size_cap: u64,
) -> Result<(), PageListError> {
    if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift) || page_size_cap & (1u64 << shift) == 0 {
        return Err(PageListError::BadPageShift(shift));
    }
    let page = 1u64 << shift;
    for (index, gpa) in (0u32..).zip(pages) {
        if gpa.trailing_zeros() < shift || !ram.contains(gpa, page) {
            return Err(PageListError::BadPage { index });
        }
    }
    Ok(())
}

/// Pages needed to hold `bytes` bytes at the given page size.
pub fn pages_for(bytes: u64, page_shift: u32) -> u64 {
    bytes.div_ceil(1u64 << page_shift.min(63))
}

/// Frees `lists` (translations of destroyed objects), each as
/// [`PageList::release`] does.
pub fn release_all(lists: Vec<PageList>) {
    for l in lists {
        l.release();
    }
}

/// Bytes of a translation given back to the kernel between two offers of
/// the CPU (64 pages of 4 KiB: tens of microseconds of `madvise`).
pub const RELEASE_STEP: usize = 256 << 10;

/// A translation this large is released in steps; smaller ones are freed
/// at once (a few steps' worth of kernel time).
const RELEASE_PACED_FROM: usize = 4 * RELEASE_STEP;

/// Frees `list`, a large one in steps: its whole pages are discarded
/// (`MADV_DONTNEED`) [`RELEASE_STEP`] bytes at a time, with the CPU offered
/// in between, and then the allocation, now without pages, is freed.
fn release_list(mut list: Vec<u64>) {
    let bytes = list.capacity().saturating_mul(std::mem::size_of::<u64>());
    if bytes >= RELEASE_PACED_FROM {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        for (at, n) in release_steps(list.as_mut_ptr() as usize, bytes, page) {
            // SAFETY: `[at, at + n)` lies inside `list`'s allocation
            // (`release_steps`), which this function owns and frees below
            // without reading it again; MADV_DONTNEED only discards the
            // contents of its pages (they read as zeros if touched again,
            // as by the allocator's free).
            let rc = unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_DONTNEED) };
            if rc != 0 {
                break;
            }
            std::thread::yield_now();
        }
    }
    drop(list);
}

/// The steps in which [`release_list`] discards an allocation of `bytes`
/// bytes at address `base`: the whole pages (of `page` bytes, a power of
/// two) inside it, in order, at most [`RELEASE_STEP`] bytes each.
fn release_steps(base: usize, bytes: usize, page: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut at = base.checked_next_multiple_of(page).unwrap_or(usize::MAX);
    let end = base.saturating_add(bytes) & !page.wrapping_sub(1);
    std::iter::from_fn(move || {
        let n = end.checked_sub(at).filter(|&n| n > 0)?.min(RELEASE_STEP);
        let step = (at, n);
        at = at.saturating_add(n);
        Some(step)
    })
}

/// Pages a translation checks between two offers of the CPU.
const PAGES_PER_YIELD: u32 = 2048;

/// Paces a long translation: a guest may register up to `max_mr_pages`
/// pages in one command (16 GiB of 4 KiB pages take the control path
/// 100 ms and more), and a thread of the daemon's data path that wakes
/// meanwhile on the same CPU — the engine, another VM's notification —
/// should not wait for the scheduler's time slice to run out. Every
/// [`PAGES_PER_YIELD`] pages (tens of microseconds) the thread yields; no
/// lock is held while a page list is resolved. A yield with nothing else
/// to run returns at once.
#[derive(Default)]
struct Pace {
    pages: u32,
}

impl Pace {
    #[inline]
    fn page(&mut self) {
        // Wraps back to 0 at PAGES_PER_YIELD: never overflows.
        self.pages = self.pages.wrapping_add(1);
        if self.pages >= PAGES_PER_YIELD {
            self.pages = 0;
            std::thread::yield_now();
        }
    }
}

/// Refuses a translation that would exceed the VM's host memory budget.
fn budget(limits: &PageListLimits, mode: u32, npages: u32) -> Result<(), PageListError> {
    let bytes = PageList::host_bytes_for(mode, npages);
    if bytes > limits.max_list_bytes {
        return Err(PageListError::OverBudget(bytes));
    }
    Ok(())
}

fn expect_len(trailing: &[u8], expected: u64) -> Result<(), PageListError> {
    if trailing.len() as u64 != expected {
        return Err(PageListError::ListLength {
            expected,
            got: trailing.len(),
        });
    }
    Ok(())
}

fn le64(raw: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    for (d, s) in b.iter_mut().zip(raw) {
        *d = *s;
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    const LIMITS: PageListLimits = PageListLimits {
        max_pages: 1 << 24,
        max_inline: 512,
        page_size_cap: 0x7fff_f000,
        max_list_bytes: u64::MAX,
    };

    fn setup() -> (crate::memory::GuestRam, RamMap) {
        let mem = crate::memory::GuestRam::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x100_0000), 0x10_0000),
        ])
        .unwrap_or_default();
        let ram = RamMap::from_guest_memory(&mem);
        (mem, ram)
    }

    fn desc(mode: PageListMode, npages: u32, addr: u64) -> BufferDesc {
        BufferDesc {
            addr,
            npages,
            first_page_offset: 0,
            page_shift: 12,
            mode: mode as u32,
        }
    }

    fn list(pages: &[u64]) -> Vec<u8> {
        pages.iter().flat_map(|p| p.to_le_bytes()).collect()
    }

    /// An inline list of three scattered pages, over both regions.
    fn three_pages() -> PageList {
        let (mem, ram) = setup();
        let bytes = list(&[0x3000, 0x100_0000, 0x1000]);
        PageList::resolve(
            &desc(PageListMode::INLINE, 3, 0),
            &bytes,
            &LIMITS,
            &ram,
            &mem,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn inline_ok_and_translate() {
        let pl = three_pages();
        assert_eq!(pl.translate(0x1004), Some((0x100_0004, 4092)));
        assert_eq!(pl.translate(3 * 4096), None);
    }

    #[test]
    fn walk_visits_the_pages_of_a_range() {
        let pl = three_pages();
        let walk = |off, len| {
            let mut seen = Vec::new();
            pl.walk(off, len, |g, n| seen.push((g, n))).map(|()| seen)
        };
        assert_eq!(
            walk(0xff0, 0x1020),
            Some(vec![(0x3ff0, 0x10), (0x100_0000, 0x1000), (0x1000, 0x10)])
        );
        assert_eq!(walk(0x1004, 8), Some(vec![(0x100_0004, 8)]));
        assert_eq!(walk(0x2000, 0x1000), Some(vec![(0x1000, 0x1000)]));
        assert_eq!(walk(0x3000, 0), Some(vec![]));
        // Past the end, or wrapping: nothing is visited.
        assert_eq!(walk(0x2001, 0x1000), None);
        assert_eq!(walk(0x3001, 0), None);
        assert_eq!(walk(u64::MAX, 2), None);
        let (mem, ram) = setup();
        let pl = PageList::resolve(
            &desc(PageListMode::CONTIGUOUS, 4, 0x8000),
            &[],
            &LIMITS,
            &ram,
            &mem,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut seen = Vec::new();
        assert_eq!(pl.walk(0x10, 0x3000, |g, n| seen.push((g, n))), Some(()));
        assert_eq!(seen, vec![(0x8010, 0x3000)]);
        assert_eq!(pl.walk(0x10, 0x4000, |_, _| {}), None);
    }

    #[test]
    fn inline_rejects_bad_pages() {
        let (mem, ram) = setup();
        for (pages, bad) in [
            (vec![0x1000, 0x1001], 1),           // misaligned
            (vec![0x1000, 0x20_0000], 1),        // in the hole
            (vec![0xff000 + 0x1000, 0x1000], 0), // first byte past region 0
            (vec![!0xfffu64], 0),                // overflow
        ] {
            let r = PageList::resolve(
                &desc(PageListMode::INLINE, pages.len() as u32, 0),
                &list(&pages),
                &LIMITS,
                &ram,
                &mem,
            );
            assert_eq!(r, Err(PageListError::BadPage { index: bad }), "{pages:x?}");
        }
        // Wrong trailing length.
        let r = PageList::resolve(
            &desc(PageListMode::INLINE, 2, 0),
            &list(&[0]),
            &LIMITS,
            &ram,
            &mem,
        );
        assert!(matches!(
            r,
            Err(PageListError::ListLength {
                expected: 16,
                got: 8
            })
        ));
    }

    #[test]
    fn contiguous_cannot_cross_hole() {
        let (mem, ram) = setup();
        let ok = PageList::resolve(
            &desc(PageListMode::CONTIGUOUS, 256, 0),
            &[],
            &LIMITS,
            &ram,
            &mem,
        );
        assert!(ok.is_ok());
        let bad = PageList::resolve(
            &desc(PageListMode::CONTIGUOUS, 257, 0),
            &[],
            &LIMITS,
            &ram,
            &mem,
        );
        assert_eq!(bad, Err(PageListError::BadPage { index: 256 }));
    }

    #[test]
    fn indirect_reads_list_pages() {
        let (mem, ram) = setup();
        // 600 pages: two list pages at 0x8000 and 0x9000, all entries -> page 0x2000.
        let entries = list(&vec![0x2000u64; 512]);
        mem.write_slice(&entries, GuestAddress(0x8000))
            .unwrap_or(());
        mem.write_slice(&entries[..88 * 8], GuestAddress(0x9000))
            .unwrap_or(());
        let dir = list(&[0x8000, 0x9000]);
        let pl = PageList::resolve(
            &desc(PageListMode::INDIRECT, 600, 0),
            &dir,
            &LIMITS,
            &ram,
            &mem,
        );
        let pl = pl.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pl.npages(), 600);
        assert_eq!(pl.page(599), Some(0x2000));
        // A bad list page address.
        let dir = list(&[0x8000, 0x20_0000]);
        let r = PageList::resolve(
            &desc(PageListMode::INDIRECT, 600, 0),
            &dir,
            &LIMITS,
            &ram,
            &mem,
        );
        assert_eq!(r, Err(PageListError::BadListPage { index: 1 }));
        // A bad entry inside the second list page.
        mem.write_slice(&0x1234u64.to_le_bytes(), GuestAddress(0x9000 + 8 * 7))
            .unwrap_or(());
        let dir = list(&[0x8000, 0x9000]);
        let r = PageList::resolve(
            &desc(PageListMode::INDIRECT, 600, 0),
            &dir,
            &LIMITS,
            &ram,
            &mem,
        );
        assert_eq!(r, Err(PageListError::BadPage { index: 519 }));
    }

    #[test]
    fn translation_over_budget_is_refused_before_allocating() {
        let (mem, ram) = setup();
        let limits = PageListLimits {
            max_list_bytes: 2 * 8,
            ..LIMITS
        };
        let d = desc(PageListMode::INLINE, 3, 0);
        let pages = list(&[0x1000, 0x2000, 0x3000]);
        assert_eq!(
            PageList::resolve(&d, &pages, &limits, &ram, &mem),
            Err(PageListError::OverBudget(24))
        );
        let d = desc(PageListMode::INLINE, 2, 0);
        let pl = PageList::resolve(&d, &pages[..16], &limits, &ram, &mem);
        assert_eq!(pl.map(|p| p.host_bytes()), Ok(16));
        // Indirect: refused on the count, before any list page is read.
        let d = desc(PageListMode::INDIRECT, 3, 0);
        assert_eq!(
            PageList::resolve(&d, &list(&[0x20_0000]), &limits, &ram, &mem),
            Err(PageListError::OverBudget(24))
        );
        // Contiguous descriptions cost nothing.
        let d = desc(PageListMode::CONTIGUOUS, 64, 0);
        let pl = PageList::resolve(&d, &[], &limits, &ram, &mem);
        assert_eq!(pl.map(|p| p.host_bytes()), Ok(0));
    }

    /// A reserved translation is refilled in place: what it costs never
    /// changes, and a list longer than its room is refused untouched.
    #[test]
    fn a_reserved_translation_is_refilled_without_growing() {
        let mut pl = PageList::reserved(4);
        let cost = pl.host_bytes();
        assert!(cost >= 32);
        assert_eq!(pl.npages(), 0);
        assert_eq!(pl.translate(0), None);
        assert!(pl.refill(13, [0x4000u64, 0x10000].into_iter()));
        assert_eq!((pl.npages(), pl.page_shift()), (2, 13));
        assert_eq!(pl.translate(0x2004), Some((0x10004, 0x2000 - 4)));
        assert!(!pl.refill(12, [0u64; 5].into_iter()), "more than its room");
        assert_eq!((pl.npages(), pl.page_shift()), (2, 13));
        assert!(pl.refill(12, [0x1000u64].into_iter()));
        assert_eq!(pl.translate(0x1000), None);
        assert_eq!(pl.host_bytes(), cost);
    }

    #[test]
    fn header_checks() {
        let (mem, ram) = setup();
        let mut d = desc(PageListMode::INLINE, 1, 0);
        d.mode = 9;
        assert_eq!(
            PageList::resolve(&d, &list(&[0]), &LIMITS, &ram, &mem),
            Err(PageListError::BadMode(9))
        );
        let mut d = desc(PageListMode::INLINE, 1, 0);
        d.page_shift = 11;
        assert_eq!(
            PageList::resolve(&d, &list(&[0]), &LIMITS, &ram, &mem),
            Err(PageListError::BadPageShift(11))
        );
        d.page_shift = 31;
        assert_eq!(
            PageList::resolve(&d, &list(&[0]), &LIMITS, &ram, &mem),
            Err(PageListError::BadPageShift(31))
        );
        let d = desc(PageListMode::INLINE, 0, 0);
        assert_eq!(
            PageList::resolve(&d, &[], &LIMITS, &ram, &mem),
            Err(PageListError::NoPages)
        );
        let d = desc(PageListMode::INLINE, 513, 0);
        assert_eq!(
            PageList::resolve(&d, &vec![0; 513 * 8], &LIMITS, &ram, &mem),
            Err(PageListError::TooManyInline(513))
        );
        let d = desc(PageListMode::INLINE, 1, 0x1000);
        assert_eq!(
            PageList::resolve(&d, &list(&[0]), &LIMITS, &ram, &mem),
            Err(PageListError::AddrNotZero)
        );
    }

    /// A large translation goes back to the kernel in steps of at most
    /// `RELEASE_STEP`, page-aligned, covering exactly the whole pages
    /// inside its allocation and nothing outside it: the 32 MiB of a
    /// 16 GiB region take 128 steps, each a short system call (issue 26,
    /// N1), where one `munmap` took milliseconds.
    #[test]
    fn a_large_translation_is_released_in_bounded_steps() {
        let page = 4096;
        for (base, bytes) in [
            (0x7f00_0000_0010usize, 32usize << 20),
            (0x7f00_0000_0000, 32 << 20),
            (0x1000_0ff0, RELEASE_STEP * 3 + 17),
            (0x1000_0000, 100),
        ] {
            let steps: Vec<(usize, usize)> = release_steps(base, bytes, page).collect();
            let first = base.next_multiple_of(page);
            let end = (base + bytes) & !(page - 1);
            let mut at = first;
            for &(a, n) in &steps {
                assert_eq!(a, at, "contiguous, in order");
                assert_eq!(a % page, 0);
                assert!(n > 0 && n <= RELEASE_STEP && n % page == 0, "{n}");
                at += n;
            }
            assert_eq!(at, end.max(first), "every whole page, nothing past the end");
            assert!(first >= base && at <= base + bytes);
        }
        assert_eq!(release_steps(0x7f00_0000_0010, 32 << 20, page).count(), 128);
        // A 16 GiB region's translation, released for real.
        let list = PageList {
            page_shift: 12,
            npages: 1 << 22,
            pages: Pages::List(vec![0x1000; 1 << 22]),
        };
        assert_eq!(list.host_bytes(), 32 << 20);
        release_all(vec![list.clone(), list]);
    }
}
