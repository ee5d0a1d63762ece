//! Guest RAM for the test VMM: memfd-backed, several regions with holes
//! between them, plus a simple page-granular allocator of guest-physical
//! ranges.
//!
//! One memfd backs every region (region *i* starts at the file offset equal to
//! the sum of the sizes before it), so the backend exercises `mmap_offset`.
//! The file is sized with `ftruncate` and mapped `MAP_SHARED | MAP_NORESERVE`
//! by vm-memory: pages that nobody touches cost nothing, so a benchmark can
//! ask for gigabytes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{
    AtomicAccess, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion,
};

use crate::error::{Error, Result};

/// The guest memory type used everywhere in this crate (no dirty bitmap: the
/// frontend never tracks dirty pages).
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Allocation granularity and minimum alignment of the allocator.
pub const PAGE_SIZE: u64 = 4096;

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// One guest RAM region: guest-physical start and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSpec {
    /// Guest-physical address of the first byte.
    pub gpa: u64,
    /// Size in bytes (a multiple of [`PAGE_SIZE`]).
    pub size: u64,
}

impl RegionSpec {
    /// One past the last guest-physical address of the region.
    pub fn end(&self) -> u64 {
        self.gpa.saturating_add(self.size)
    }
}

/// Layout of guest RAM: regions sorted by address, not overlapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemLayout {
    /// The regions, in increasing address order.
    pub regions: Vec<RegionSpec>,
}

impl Default for MemLayout {
    /// Region 0 at GPA 0 of 256 MiB, region 1 at 4 GiB of 256 MiB.
    fn default() -> Self {
        Self::two_regions(256 * MIB, 256 * MIB)
    }
}

impl MemLayout {
    /// Region 0 at GPA 0 of `size0` bytes, region 1 of `size1` bytes at GPA
    /// 4 GiB, or at the first multiple of 4 GiB that leaves a hole of at least
    /// 1 GiB after region 0 when region 0 is larger than 3 GiB.
    pub fn two_regions(size0: u64, size1: u64) -> Self {
        // Region 1 starts at 4 GiB unless region 0 is too large for a hole
        // to remain below it; then at the first 4 GiB multiple that leaves one.
        let mut gpa1 = 4 * GIB;
        while gpa1 < size0.saturating_add(GIB) {
            gpa1 = gpa1.saturating_add(4 * GIB);
        }
        MemLayout {
            regions: vec![
                RegionSpec {
                    gpa: 0,
                    size: size0,
                },
                RegionSpec {
                    gpa: gpa1,
                    size: size1,
                },
            ],
        }
    }

    /// A single region at GPA 0.
    pub fn single(size: u64) -> Self {
        MemLayout {
            regions: vec![RegionSpec { gpa: 0, size }],
        }
    }

    /// Checks that regions are non-empty, page aligned, sorted and disjoint.
    pub fn validate(&self) -> Result<()> {
        if self.regions.is_empty() {
            return Err(Error::Layout("no regions".into()));
        }
        let mut prev_end = 0u64;
        for (i, r) in self.regions.iter().enumerate() {
            if r.size == 0 || r.size % PAGE_SIZE != 0 || r.gpa % PAGE_SIZE != 0 {
                return Err(Error::Layout(format!(
                    "region {i} ({:#x}+{:#x}) is empty or not page aligned",
                    r.gpa, r.size
                )));
            }
            if r.gpa.checked_add(r.size).is_none() {
                return Err(Error::Layout(format!("region {i} overflows")));
            }
            if i > 0 && r.gpa < prev_end {
                return Err(Error::Layout(format!(
                    "region {i} starts at {:#x}, before the end of region {} ({prev_end:#x})",
                    r.gpa,
                    i - 1
                )));
            }
            prev_end = r.end();
        }
        Ok(())
    }

    /// Total bytes of RAM.
    pub fn total_size(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }
}

/// Free ranges of one region (start -> length), coalesced.
#[derive(Debug)]
struct RegionFree {
    spec: RegionSpec,
    free: BTreeMap<u64, u64>,
}

impl RegionFree {
    fn new(spec: RegionSpec) -> Self {
        let mut free = BTreeMap::new();
        free.insert(spec.gpa, spec.size);
        RegionFree { spec, free }
    }

    /// First fit: the lowest aligned range of `size` bytes.
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        let mut found = None;
        for (&start, &len) in &self.free {
            let aligned = start.checked_next_multiple_of(align)?;
            let pad = aligned - start;
            if pad.checked_add(size).is_some_and(|need| need <= len) {
                found = Some((start, len, aligned));
                break;
            }
        }
        let (start, len, aligned) = found?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let end = aligned + size;
        let free_end = start + len;
        if free_end > end {
            self.free.insert(end, free_end - end);
        }
        Some(aligned)
    }

    /// Takes `start .. start + size` out of the free ranges, if it lies
    /// inside one of them.
    fn take(&mut self, start: u64, size: u64) -> bool {
        let Some((&free, &len)) = self.free.range(..=start).next_back() else {
            return false;
        };
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        if size == 0 || size % PAGE_SIZE != 0 || end > free + len {
            return false;
        }
        self.free.remove(&free);
        if start > free {
            self.free.insert(free, start - free);
        }
        if free + len > end {
            self.free.insert(end, free + len - end);
        }
        true
    }

    fn release(&mut self, start: u64, size: u64) {
        let mut start = start;
        let mut size = size;
        // Merge with the following free range.
        if let Some(&next_len) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            size += next_len;
        }
        // Merge with the preceding free range.
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                start = prev;
                size += prev_len;
            }
        }
        self.free.insert(start, size);
    }

    fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

/// Page-granular first-fit allocator of guest-physical ranges.
#[derive(Debug)]
pub struct Allocator {
    regions: Vec<RegionFree>,
    allocated: HashMap<u64, u64>,
    /// Region the next single page of `alloc_pages` comes from.
    next_region: usize,
}

impl Allocator {
    /// An allocator owning all of `layout`.
    pub fn new(layout: &MemLayout) -> Self {
        Allocator {
            regions: layout
                .regions
                .iter()
                .copied()
                .map(RegionFree::new)
                .collect(),
            allocated: HashMap::new(),
            next_region: 0,
        }
    }

    fn normalize(size: u64, align: u64) -> Result<(u64, u64)> {
        let align = align.max(PAGE_SIZE);
        if !align.is_power_of_two() || size == 0 {
            return Err(Error::OutOfGuestMemory { size, align });
        }
        let size = size
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(Error::OutOfGuestMemory { size, align })?;
        Ok((size, align))
    }

    fn alloc_in(&mut self, region: usize, size: u64, align: u64) -> Option<u64> {
        let gpa = self.regions.get_mut(region)?.alloc(size, align)?;
        self.allocated.insert(gpa, size);
        Some(gpa)
    }

    /// The allocations `pages` (page addresses) lie in, each named once
    /// by its start: what a region adopted over them gives back when it
    /// is freed. Every page must lie in an allocation whose start is one
    /// of `pages` (a region owns its allocations whole).
    pub fn allocations_covering(&self, pages: &[u64]) -> Result<Vec<GuestAddress>> {
        let starts: Vec<(u64, u64)> = pages
            .iter()
            .filter_map(|p| self.allocated.get(p).map(|&size| (*p, size)))
            .collect();
        for &p in pages {
            if p % PAGE_SIZE != 0 || !starts.iter().any(|&(s, size)| p >= s && p - s < size) {
                return Err(Error::Layout(format!(
                    "page {p:#x} is not in an allocation the region starts"
                )));
            }
        }
        let mut seen = std::collections::HashSet::new();
        Ok(starts
            .into_iter()
            .filter(|&(s, _)| seen.insert(s))
            .map(|(s, _)| GuestAddress(s))
            .collect())
    }

    /// Allocates `size` bytes (rounded up to whole pages) aligned to
    /// `max(align, PAGE_SIZE)` (a power of two), from the lowest region that
    /// has room. The contents are whatever was there before (zero for memory
    /// never used).
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<GuestAddress> {
        let (size, align) = Self::normalize(size, align)?;
        (0..self.regions.len())
            .find_map(|r| self.alloc_in(r, size, align))
            .map(GuestAddress)
            .ok_or(Error::OutOfGuestMemory { size, align })
    }

    /// Allocates `n` separate pages of `page_size` bytes (a power of two,
    /// at least [`PAGE_SIZE`]), each aligned to `page_size`, taken round-robin
    /// from the regions so that consecutive pages are deliberately NOT
    /// contiguous (with one region, a one-page gap separates them).
    /// Each page can be freed on its own.
    pub fn alloc_pages(&mut self, n: usize, page_size: u64) -> Result<Vec<GuestAddress>> {
        let (size, align) = Self::normalize(page_size, page_size)?;
        let mut pages = Vec::with_capacity(n);
        let single = self.regions.len() == 1;
        let mut spacers = Vec::new();
        for _ in 0..n {
            let mut got = None;
            for k in 0..self.regions.len() {
                let r = (self.next_region + k) % self.regions.len();
                if let Some(gpa) = self.alloc_in(r, size, align) {
                    self.next_region = (r + 1) % self.regions.len();
                    got = Some(gpa);
                    break;
                }
            }
            let Some(gpa) = got else {
                for p in pages.into_iter().chain(spacers) {
                    let _ = self.free(p);
                }
                return Err(Error::OutOfGuestMemory { size, align });
            };
            pages.push(GuestAddress(gpa));
            if single {
                // Keep the next page away from this one.
                if let Some(spacer) = self.alloc_in(0, PAGE_SIZE, PAGE_SIZE) {
                    spacers.push(GuestAddress(spacer));
                }
            }
        }
        for s in spacers {
            let _ = self.free(s);
        }
        Ok(pages)
    }

    /// Returns a range handed out by [`Allocator::alloc`] or
    /// [`Allocator::alloc_pages`].
    pub fn free(&mut self, gpa: GuestAddress) -> Result<()> {
        let size = self.allocated.remove(&gpa.0).ok_or(Error::BadFree(gpa.0))?;
        if let Some(r) = self
            .regions
            .iter_mut()
            .find(|r| gpa.0 >= r.spec.gpa && gpa.0 < r.spec.end())
        {
            r.release(gpa.0, size);
        }
        Ok(())
    }

    /// Frees everything.
    pub fn reset(&mut self) {
        for r in &mut self.regions {
            *r = RegionFree::new(r.spec);
        }
        self.allocated.clear();
        self.next_region = 0;
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.regions.iter().map(RegionFree::free_bytes).sum()
    }

    /// The allocated ranges (start, size), in address order.
    pub fn allocated(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.allocated.iter().map(|(&s, &n)| (s, n)).collect();
        v.sort_unstable();
        v
    }
}

/// Guest RAM as a VM that moves to another host takes it along: its
/// layout, its allocator, and the contents of what is allocated (the rest
/// is free; the allocator promises nothing of its contents).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemImage {
    /// The regions (guest-physical start, size).
    pub regions: Vec<(u64, u64)>,
    /// The allocated ranges (start, size), in address order.
    pub allocated: Vec<(u64, u64)>,
    /// Region the next single page comes from.
    pub next_region: usize,
}

/// Guest RAM of one test VM, with its allocator.
#[derive(Debug)]
pub struct GuestMem {
    layout: MemLayout,
    mem: GuestMemoryMmap,
    file: Arc<File>,
    alloc: Mutex<Allocator>,
}

/// Creates an anonymous memory file of `size` bytes.
fn memfd(name: &std::ffi::CStr, size: u64) -> Result<File> {
    // SAFETY: `name` is a valid NUL-terminated string; memfd_create does not
    // retain the pointer. The returned fd is checked before use.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)
        .map_err(|e| Error::io("ftruncate guest memory file", e))?;
    // The daemon maps only RAM that cannot shrink under it (spec 19.6.1),
    // as QEMU's memory-backend-memfd seals its files.
    seal_shrink(&file)?;
    Ok(file)
}

/// Adds `F_SEAL_SHRINK` (and `F_SEAL_GROW`, as QEMU does) to a memfd.
pub fn seal_shrink(file: &File) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_ADD_SEALS on a descriptor we own; no memory is passed.
    let r = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    if r < 0 {
        return Err(Error::last_os("F_ADD_SEALS"));
    }
    Ok(())
}

impl GuestMem {
    /// Creates guest RAM with the given layout (all zero, sparse).
    pub fn new(layout: &MemLayout) -> Result<Self> {
        layout.validate()?;
        let file = Arc::new(memfd(c"vhost-user-rdma-guest-ram", layout.total_size())?);
        let mut offset = 0u64;
        let mut ranges = Vec::with_capacity(layout.regions.len());
        for r in &layout.regions {
            let size = usize::try_from(r.size)
                .map_err(|_| Error::Layout(format!("region size {:#x} too large", r.size)))?;
            ranges.push((
                GuestAddress(r.gpa),
                size,
                Some(FileOffset::from_arc(file.clone(), offset)),
            ));
            offset += r.size;
        }
        let mem = GuestMemoryMmap::from_ranges_with_files(ranges)?;
        Ok(GuestMem {
            layout: layout.clone(),
            mem,
            file,
            alloc: Mutex::new(Allocator::new(layout)),
        })
    }

    /// The image of this memory; the contents of its allocated ranges
    /// are read separately (`read_vec`).
    pub fn image(&self) -> MemImage {
        let a = self.allocator();
        MemImage {
            regions: self
                .layout
                .regions
                .iter()
                .map(|r| (r.gpa, r.size))
                .collect(),
            allocated: a.allocated(),
            next_region: a.next_region,
        }
    }

    /// New guest RAM (all zero) of `image`'s layout whose allocator has
    /// allocated what `image` says; the caller writes the contents.
    pub fn restore(image: &MemImage) -> Result<Self> {
        let layout = MemLayout {
            regions: image
                .regions
                .iter()
                .map(|&(gpa, size)| RegionSpec { gpa, size })
                .collect(),
        };
        let mem = Self::new(&layout)?;
        {
            let mut a = mem.allocator();
            for &(start, size) in &image.allocated {
                let region = a
                    .regions
                    .iter_mut()
                    .find(|r| start >= r.spec.gpa && start < r.spec.end())
                    .ok_or_else(|| Error::Layout(format!("allocation at {start:#x} not in RAM")))?;
                if !region.take(start, size) {
                    return Err(Error::Layout(format!(
                        "allocation {start:#x}+{size:#x} is not free in the new RAM"
                    )));
                }
                a.allocated.insert(start, size);
            }
            a.next_region = image.next_region.min(a.regions.len().saturating_sub(1));
        }
        Ok(mem)
    }

    /// The layout this memory was created with.
    pub fn layout(&self) -> &MemLayout {
        &self.layout
    }

    /// The vm-memory object (for `Bytes` access and region iteration).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The memfd backing every region.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Offset in [`GuestMem::file`] of the byte at guest-physical address
    /// `gpa` (None outside RAM).
    pub fn file_offset(&self, gpa: GuestAddress) -> Option<u64> {
        let r = self.mem.find_region(gpa)?;
        let base = r.file_offset()?.start();
        Some(base + (gpa.0 - r.start_addr().0))
    }

    /// The regions as vhost-user `SET_MEM_TABLE` entries.
    pub fn region_infos(&self) -> Result<Vec<VhostUserMemoryRegionInfo>> {
        self.mem
            .iter()
            .map(|r| {
                VhostUserMemoryRegionInfo::from_guest_region(r)
                    .map_err(|e| Error::vhost("describe memory region", e))
            })
            .collect()
    }

    /// Address in this process of guest-physical address `gpa`.
    pub fn host_address(&self, gpa: GuestAddress) -> Result<u64> {
        self.mem
            .get_host_address(gpa)
            .map(|p| p as u64)
            .map_err(|source| Error::Memory {
                gpa: gpa.0,
                len: 0,
                source,
            })
    }

    /// Whether `[gpa, gpa + len)` lies inside one RAM region.
    pub fn is_ram(&self, gpa: u64, len: u64) -> bool {
        self.layout
            .regions
            .iter()
            .any(|r| gpa >= r.gpa && gpa.checked_add(len).is_some_and(|e| e <= r.end()))
    }

    /// A page-aligned guest-physical address in the hole after region 0
    /// (never RAM), for hostile tests.
    pub fn hole_gpa(&self) -> u64 {
        self.layout.regions.first().map_or(0, RegionSpec::end)
    }

    /// Writes `data` at `gpa`.
    pub fn write(&self, gpa: GuestAddress, data: &[u8]) -> Result<()> {
        self.mem
            .write_slice(data, gpa)
            .map_err(|source| Error::Memory {
                gpa: gpa.0,
                len: data.len(),
                source,
            })
    }

    /// Reads `buf.len()` bytes at `gpa`.
    pub fn read(&self, gpa: GuestAddress, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        self.mem
            .read_slice(buf, gpa)
            .map_err(|source| Error::Memory {
                gpa: gpa.0,
                len,
                source,
            })
    }

    /// Reads `len` bytes at `gpa` into a new vector.
    pub fn read_vec(&self, gpa: GuestAddress, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(gpa, &mut v)?;
        Ok(v)
    }

    /// Fills `len` bytes at `gpa` with `byte`.
    pub fn fill(&self, gpa: GuestAddress, len: usize, byte: u8) -> Result<()> {
        const CHUNK: usize = 64 * 1024;
        let buf = vec![byte; len.min(CHUNK)];
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(CHUNK);
            self.write(GuestAddress(gpa.0 + done as u64), &buf[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Atomic store of a naturally aligned integer.
    pub fn store<T: AtomicAccess>(&self, gpa: GuestAddress, v: T, order: Ordering) -> Result<()> {
        self.mem
            .store(v, gpa, order)
            .map_err(|source| Error::Memory {
                gpa: gpa.0,
                len: std::mem::size_of::<T>(),
                source,
            })
    }

    /// Atomic load of a naturally aligned integer.
    pub fn load<T: AtomicAccess>(&self, gpa: GuestAddress, order: Ordering) -> Result<T> {
        self.mem.load(gpa, order).map_err(|source| Error::Memory {
            gpa: gpa.0,
            len: std::mem::size_of::<T>(),
            source,
        })
    }

    /// Locks the allocator (for several operations in a row).
    pub fn allocator(&self) -> MutexGuard<'_, Allocator> {
        // A panic while holding the lock leaves the allocator consistent
        // (every method updates it in one step), so poisoning is ignored.
        self.alloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`Allocator::alloc`].
    pub fn alloc(&self, size: u64, align: u64) -> Result<GuestAddress> {
        self.allocator().alloc(size, align)
    }

    /// See [`Allocator::alloc_pages`].
    pub fn alloc_pages(&self, n: usize, page_size: u64) -> Result<Vec<GuestAddress>> {
        self.allocator().alloc_pages(n, page_size)
    }

    /// See [`Allocator::free`].
    pub fn free(&self, gpa: GuestAddress) -> Result<()> {
        self.allocator().free(gpa)
    }

    /// Region of guest RAM containing `gpa`, if any.
    pub fn region_of(&self, gpa: u64) -> Option<RegionSpec> {
        self.mem.find_region(GuestAddress(gpa)).map(|r| RegionSpec {
            gpa: r.start_addr().0,
            size: r.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_has_a_hole() {
        let m = GuestMem::new(&MemLayout::default()).unwrap();
        assert_eq!(m.memory().num_regions(), 2);
        assert!(m.is_ram(0, 4096));
        assert!(m.is_ram(4 * GIB, 4096));
        assert!(!m.is_ram(m.hole_gpa(), 1));
        assert!(!m.is_ram(256 * MIB - 8, 16));
        let infos = m.region_infos().unwrap();
        assert_eq!(infos[1].guest_phys_addr, 4 * GIB);
        assert_eq!(infos[1].mmap_offset, 256 * MIB);
        m.write(GuestAddress(4 * GIB + 10), b"hello").unwrap();
        assert_eq!(m.read_vec(GuestAddress(4 * GIB + 10), 5).unwrap(), b"hello");
        assert!(m.write(GuestAddress(m.hole_gpa()), b"x").is_err());
    }

    #[test]
    fn big_region_is_sparse() {
        let m = GuestMem::new(&MemLayout::two_regions(2 * GIB, 64 * MIB)).unwrap();
        assert_eq!(m.layout().regions[1].gpa, 4 * GIB);
        let big = m.alloc(GIB + GIB / 2, 2 * MIB).unwrap();
        m.write(GuestAddress(big.0 + GIB), &[1, 2, 3]).unwrap();
        let l = MemLayout::two_regions(4 * GIB, MIB);
        assert!(l.regions[1].gpa >= 5 * GIB);
        l.validate().unwrap();
    }

    #[test]
    fn allocator_alloc_free_coalesce() {
        let layout = MemLayout::two_regions(16 * PAGE_SIZE, 16 * PAGE_SIZE);
        let mut a = Allocator::new(&layout);
        let total = a.free_bytes();
        let x = a.alloc(1, 0).unwrap();
        let y = a.alloc(3 * PAGE_SIZE, 2 * PAGE_SIZE).unwrap();
        assert_eq!(x.0 % PAGE_SIZE, 0);
        assert_eq!(y.0 % (2 * PAGE_SIZE), 0);
        assert!(a.alloc(64 * PAGE_SIZE, 0).is_err());
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert!(a.free(y).is_err());
        assert_eq!(a.free_bytes(), total);
        // Fully coalesced: a whole region fits again.
        let all = a.alloc(16 * PAGE_SIZE, 0).unwrap();
        assert_eq!(all.0, 0);
    }

    #[test]
    fn pages_are_not_contiguous() {
        let mut a = Allocator::new(&MemLayout::default());
        let pages = a.alloc_pages(8, PAGE_SIZE).unwrap();
        for w in pages.windows(2) {
            assert_ne!(w[0].0 + PAGE_SIZE, w[1].0);
        }
        assert!(pages.iter().any(|p| p.0 >= 4 * GIB));
        assert!(pages.iter().any(|p| p.0 < 4 * GIB));
        let mut one = Allocator::new(&MemLayout::single(MIB));
        let pages = one.alloc_pages(8, PAGE_SIZE).unwrap();
        for w in pages.windows(2) {
            assert_ne!(w[0].0 + PAGE_SIZE, w[1].0);
        }
        let huge = one.alloc_pages(2, 64 * 1024).unwrap();
        assert!(huge.iter().all(|p| p.0 % (64 * 1024) == 0));
    }
}
