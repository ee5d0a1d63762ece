//! DMA memory for a real guest: 2 MiB hugepages of this process, whose
//! guest-physical addresses come from `/proc/self/pagemap`.
//!
//! Hugepages from the hugetlb pool are never swapped or migrated, so the
//! address read once stays valid while the mapping lives. The pool maps
//! hugepages in chunks as needed and carves regions out of them first-fit;
//! a region may span several hugepages (its page list then names each).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use crate::transport::{DmaRegion, TransportError};

/// log2 of the hugepage size.
pub const HUGE_SHIFT: u32 = 21;
/// The hugepage size.
pub const HUGE_SIZE: usize = 1 << HUGE_SHIFT;
/// Granularity of allocations (a cache line, also the doorbell record
/// alignment).
const GRAIN: usize = 64;
/// Hugepages mapped at least per chunk.
const MIN_CHUNK_PAGES: usize = 4;
/// The base page size `/proc/self/pagemap` is indexed by.
const BASE_PAGE: usize = 4096;

/// One mapping of hugepages.
#[derive(Debug)]
struct Chunk {
    base: NonNull<u8>,
    len: usize,
    /// Guest-physical address of each hugepage.
    gpas: Vec<u64>,
}

// SAFETY: the chunk is plain memory owned by the pool; it is handed out only
// as raw pointers (the `DmaRegion` contract), usable from any thread.
unsafe impl Send for Chunk {}
// SAFETY: as for `Send`.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: mapped in `Chunk::map`, unmapped once; every region of the
        // chunk holds the pool (and thus the chunk) alive, so none is left.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl Chunk {
    fn map(pages: usize, pagemap: &File) -> io::Result<Chunk> {
        let len = pages * HUGE_SIZE;
        // SAFETY: a new private anonymous mapping chosen by the kernel
        // replaces nothing; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot map {pages} hugepages of 2 MiB ({e}); reserve more with \
                     `hugepages=N` on the kernel command line or /proc/sys/vm/nr_hugepages"
                ),
            ));
        }
        let base =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        let mut chunk = Chunk {
            base,
            len,
            gpas: Vec::with_capacity(pages),
        };
        // A child process must not share (or copy-on-write) DMA memory the
        // device writes.
        // SAFETY: advice on our own mapping; failure only loses the advice.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        for i in 0..pages {
            // SAFETY: inside the mapping just created; a volatile write
            // makes sure the page is faulted in before its frame is read.
            let at = unsafe { base.as_ptr().add(i * HUGE_SIZE) };
            // SAFETY: as above, `at` is the start of hugepage `i`.
            unsafe { at.write_volatile(0) };
            let mut entry = [0u8; 8];
            pagemap.read_exact_at(&mut entry, (at as usize / BASE_PAGE * 8) as u64)?;
            let entry = u64::from_le_bytes(entry);
            let present = entry >> 63 == 1;
            let pfn = entry & ((1 << 55) - 1);
            if !present || pfn == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "/proc/self/pagemap shows no page frame numbers (needs root / CAP_SYS_ADMIN)",
                ));
            }
            let gpa = pfn * BASE_PAGE as u64;
            if gpa % HUGE_SIZE as u64 != 0 {
                return Err(io::Error::other(format!(
                    "hugepage at {gpa:#x} is not 2 MiB aligned"
                )));
            }
            chunk.gpas.push(gpa);
        }
        Ok(chunk)
    }
}

#[derive(Debug, Default)]
struct PoolState {
    chunks: Vec<Arc<Chunk>>,
    /// Free ranges `(offset, len)` of each chunk, sorted and coalesced.
    free: Vec<Vec<(usize, usize)>>,
}

/// Hugepage DMA memory (see the module documentation).
#[derive(Debug)]
pub struct HugePool {
    pagemap: File,
    state: Mutex<PoolState>,
}

impl HugePool {
    /// Opens `/proc/self/pagemap` and maps `initial_pages` hugepages (0: on
    /// first use), so that a missing hugepage reservation shows at start.
    pub fn new(initial_pages: usize) -> io::Result<Arc<HugePool>> {
        let pool = Arc::new(HugePool {
            pagemap: File::open("/proc/self/pagemap")?,
            state: Mutex::new(PoolState::default()),
        });
        if initial_pages > 0 {
            let chunk = Chunk::map(initial_pages, &pool.pagemap)?;
            pool.lock().add(chunk);
        }
        Ok(pool)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // The state is consistent between statements; a panic elsewhere is
        // no reason to stop handing out memory.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocates `len` bytes aligned to `align` (a power of two, at most the
    /// hugepage size).
    pub fn alloc(self: &Arc<Self>, len: usize, align: usize) -> Result<HugeDma, TransportError> {
        let oom = || TransportError::OutOfMemory { size: len, align };
        if len == 0 || !align.is_power_of_two() || align > HUGE_SIZE {
            return Err(oom());
        }
        let size = len.checked_next_multiple_of(GRAIN).ok_or_else(oom)?;
        let align = align.max(GRAIN);
        let mut st = self.lock();
        let found = st.take(size, align);
        let (chunk, offset) = match found {
            Some(x) => x,
            None => {
                let pages = size.div_ceil(HUGE_SIZE).max(MIN_CHUNK_PAGES);
                let c = Chunk::map(pages, &self.pagemap).map_err(TransportError::Io)?;
                st.add(c);
                st.take(size, align).ok_or_else(oom)?
            }
        };
        let c = st.chunks[chunk].clone();
        drop(st);
        let first = offset / HUGE_SIZE;
        let last = (offset + len - 1) / HUGE_SIZE;
        Ok(HugeDma {
            pool: self.clone(),
            // SAFETY: offset + size <= chunk length (from the free list).
            ptr: unsafe { c.base.as_ptr().add(offset) },
            pages: c.gpas[first..=last].to_vec(),
            chunk,
            offset,
            size,
            len,
        })
    }

    fn free(&self, chunk: usize, offset: usize, size: usize) {
        let mut st = self.lock();
        st.give(chunk, offset, size);
    }
}

impl PoolState {
    fn add(&mut self, c: Chunk) {
        self.free.push(vec![(0, c.len)]);
        self.chunks.push(Arc::new(c));
    }

    /// First fit: (chunk, offset) of `size` bytes aligned to `align`.
    fn take(&mut self, size: usize, align: usize) -> Option<(usize, usize)> {
        for (ci, list) in self.free.iter_mut().enumerate() {
            for i in 0..list.len() {
                let (off, len) = list[i];
                let start = off.next_multiple_of(align);
                let end = start.checked_add(size)?;
                if end > off + len {
                    continue;
                }
                // Split into the part before, the allocation, the part after.
                let before = (off, start - off);
                let after = (end, off + len - end);
                list.remove(i);
                let mut at = i;
                for piece in [before, after] {
                    if piece.1 > 0 {
                        list.insert(at, piece);
                        at += 1;
                    }
                }
                return Some((ci, start));
            }
        }
        None
    }

    fn give(&mut self, chunk: usize, offset: usize, size: usize) {
        let list = &mut self.free[chunk];
        let i = list.partition_point(|&(o, _)| o < offset);
        list.insert(i, (offset, size));
        // Coalesce with the neighbours.
        if i + 1 < list.len() && list[i].0 + list[i].1 == list[i + 1].0 {
            list[i].1 += list[i + 1].1;
            list.remove(i + 1);
        }
        if i > 0 && list[i - 1].0 + list[i - 1].1 == list[i].0 {
            list[i - 1].1 += list[i].1;
            list.remove(i);
        }
    }
}

/// A region of hugepage DMA memory; given back to the pool on drop.
#[derive(Debug)]
pub struct HugeDma {
    pool: Arc<HugePool>,
    ptr: *mut u8,
    pages: Vec<u64>,
    chunk: usize,
    offset: usize,
    size: usize,
    len: usize,
}

// SAFETY: plain memory handed out as raw pointers only (the `DmaRegion`
// contract), usable from any thread.
unsafe impl Send for HugeDma {}
// SAFETY: as for `Send`.
unsafe impl Sync for HugeDma {}

// SAFETY: `ptr .. ptr + len` lies inside a live hugepage mapping (the pool,
// which this region holds, owns the chunk until it is dropped) and belongs to this region only (the pool's free list no longer has
// it); it is aligned to the requested alignment (offset is, and the chunk
// base is 2 MiB aligned), and so is its guest-physical address (hugepage
// addresses are 2 MiB aligned and alignment is at most 2 MiB); `pages` names
// the hugepages from the one holding byte 0 to the one holding the last byte,
// each 2 MiB aligned, and `first_page_offset` is below 2 MiB.
unsafe impl DmaRegion for HugeDma {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn page_shift(&self) -> u32 {
        HUGE_SHIFT
    }

    fn first_page_offset(&self) -> u32 {
        (self.offset % HUGE_SIZE) as u32
    }

    fn pages(&self) -> &[u64] {
        &self.pages
    }
}

impl Drop for HugeDma {
    fn drop(&mut self) {
        self.pool.free(self.chunk, self.offset, self.size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_splits_and_coalesces() {
        let mut st = PoolState {
            free: vec![vec![(0, 4096)]],
            ..PoolState::default()
        };
        assert_eq!(st.take(64, 64), Some((0, 0)));
        assert_eq!(st.take(64, 1024), Some((0, 1024)));
        assert_eq!(st.free[0], vec![(64, 960), (1088, 3008)]);
        assert_eq!(st.take(4096, 64), None);
        st.give(0, 0, 64);
        st.give(0, 1024, 64);
        assert_eq!(st.free[0], vec![(0, 4096)]);
    }

    #[test]
    fn allocations_never_overlap() {
        let mut st = PoolState {
            free: vec![vec![(0, 1 << 16)]],
            ..PoolState::default()
        };
        let mut live: Vec<(usize, usize)> = Vec::new();
        for i in 0..200usize {
            let size = 64 * (1 + i % 7);
            let align = 64 << (i % 4);
            if i % 3 == 2 && !live.is_empty() {
                let (o, s) = live.remove(i % live.len());
                st.give(0, o, s);
            }
            if let Some((_, o)) = st.take(size, align) {
                assert_eq!(o % align, 0);
                assert!(live.iter().all(|&(lo, ls)| o + size <= lo || lo + ls <= o));
                live.push((o, size));
            }
        }
        for (o, s) in live.drain(..) {
            st.give(0, o, s);
        }
        assert_eq!(st.free[0], vec![(0, 1 << 16)]);
    }
}
