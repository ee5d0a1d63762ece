//! How the data-path engine touches guest memory.
//!
//! Everything the engine reads or writes in a guest goes through here:
//! scatter/gather segments resolved through a memory region's translation,
//! copies between two guests' RAM (VM-to-VM delivery is one copy, as a NIC's
//! DMA engine would do), and the atomic operations of RDMA atomics and
//! doorbell records. Guest memory is shared with a running guest, so every
//! access is a volatile copy or an atomic operation; nothing here ever
//! creates a Rust reference into guest RAM. Every write marks the pages it
//! touched in the VMM's dirty log while logging is on ([`HostMem::dirty`]).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::volatile;
use super::HostMem;
use thiserror::Error;

/// A guest-physical range of RAM. It may span RAM regions that touch in
/// guest-physical space (`resolve` merges by guest-physical adjacency and
/// does not know the regions); the accessors here split it at region
/// boundaries, where the host mappings are separate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Start address.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Why an access failed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// The range is not inside the memory region (or overflows).
    #[error("range outside the memory region")]
    OutOfRegion,
    /// The address is not in guest RAM (the memory map changed under us).
    #[error("guest-physical address {0:#x} is not RAM")]
    NotRam(u64),
    /// An atomic or index access is not naturally aligned.
    #[error("address {0:#x} is misaligned")]
    Misaligned(u64),
    /// Source and destination lengths differ.
    #[error("length mismatch: {src} bytes into {dst}")]
    LengthMismatch {
        /// Source bytes.
        src: u64,
        /// Destination bytes.
        dst: u64,
    },
}

/// A region of I/O virtual addresses backed by guest pages (a memory
/// region).
pub trait Translate {
    /// Guest-physical address of `iova`, with the bytes contiguous from
    /// there; `None` when `[iova, iova + len)` is not inside the region.
    fn translate(&self, iova: u64, len: u64) -> Option<(u64, u64)>;

    /// Calls `f(gpa, len)` for the guest-physical pieces of
    /// `[iova, iova + len)` in order (a page or more each); `None`, having
    /// called nothing, when the range is not inside the region.
    fn walk(&self, iova: u64, len: u64, f: impl FnMut(u64, u64)) -> Option<()>;
}

/// Resolves `[iova, iova + len)` of `mr` into guest-physical segments,
/// appending them to `out` (merging physically adjacent pages, also across
/// the boundary of two RAM regions that touch: see [`Segment`]).
pub fn resolve(
    mr: &impl Translate,
    iova: u64,
    len: u64,
    out: &mut Vec<Segment>,
) -> Result<(), AccessError> {
    if len == 0 {
        return Ok(());
    }
    mr.walk(iova, len, |gpa, n| push_merged(out, gpa, n))
        .ok_or(AccessError::OutOfRegion)
}

/// Appends `[gpa, gpa + len)` to `out`, merged into the last segment when
/// it continues it.
#[inline]
fn push_merged(out: &mut Vec<Segment>, gpa: u64, len: u64) {
    if let Some(last) = out.last_mut() {
        if last.gpa.checked_add(last.len) == Some(gpa) {
            if let Some(sum) = last.len.checked_add(len) {
                last.len = sum;
                return;
            }
        }
    }
    out.push(Segment { gpa, len });
}

/// Total bytes of a segment list.
pub fn total(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| s.len).sum()
}

/// Walks a segment list as host address ranges: pieces of a segment that
/// lie in one RAM region, merged with the following pieces when they are
/// contiguous in the host's address space (pages of one RAM region that
/// are adjacent, whatever their order in the MR's page list).
struct HostRuns<'a> {
    mem: &'a HostMem,
    segs: std::slice::Iter<'a, Segment>,
    /// The part of the current segment not handed out yet.
    gpa: u64,
    left: u64,
}

impl<'a> HostRuns<'a> {
    fn new(mem: &'a HostMem, segs: &'a [Segment]) -> Self {
        HostRuns {
            mem,
            segs: segs.iter(),
            gpa: 0,
            left: 0,
        }
    }

    /// The next piece: the rest of the current segment inside the RAM
    /// region where it continues; and whether it ends at that region's end
    /// (only then can the next piece continue it in the host: within a
    /// region, host order is guest-physical order, and `resolve` merged
    /// what is adjacent there).
    #[inline]
    fn piece(&mut self) -> Result<Option<(*mut u8, u64, bool)>, AccessError> {
        while self.left == 0 {
            let Some(s) = self.segs.next() else {
                return Ok(None);
            };
            (self.gpa, self.left) = (s.gpa, s.len);
        }
        let gpa = self.gpa;
        let (p, avail) = self.mem.range(gpa, 1).ok_or(AccessError::NotRam(gpa))?;
        let n = avail.min(self.left);
        // `n <= left`, and `gpa + n` is at most the region's end.
        self.left = self.left.saturating_sub(n);
        self.gpa = gpa.wrapping_add(n);
        Ok(Some((p, n, n == avail)))
    }

    /// The next run: host address and length, `Ok(None)` at the end.
    #[inline]
    fn next_run(&mut self) -> Result<Option<(*mut u8, u64)>, AccessError> {
        let Some((start, len, at_end)) = self.piece()? else {
            return Ok(None);
        };
        // Pieces of scattered pages never continue each other: looking
        // at the next one would cost a lookup per page for nothing.
        if !at_end {
            return Ok(Some((start, len)));
        }
        self.merge_next(start, len).map(Some)
    }

    /// A run that ends at the end of a RAM region, extended by the pieces
    /// that continue it in the host (the next region mapped right after).
    #[cold]
    fn merge_next(&mut self, start: *mut u8, mut len: u64) -> Result<(*mut u8, u64), AccessError> {
        loop {
            let saved = (self.segs.clone(), self.gpa, self.left);
            match self.piece() {
                Ok(Some((p, n, end)))
                    if usize::try_from(len)
                        .is_ok_and(|l| p as usize == (start as usize).wrapping_add(l)) =>
                {
                    len = len.checked_add(n).ok_or(AccessError::OutOfRegion)?;
                    if !end {
                        return Ok((start, len));
                    }
                }
                _ => {
                    // Not contiguous (or not RAM: reported when it is
                    // reached): leave it for the next run.
                    (self.segs, self.gpa, self.left) = saved;
                    return Ok((start, len));
                }
            }
        }
    }
}

/// Marks the first `len` bytes of `segs` dirty (after writing them; a
/// write that failed midway marks all of them, which is harmless).
#[inline]
fn dirty_segs(mem: &HostMem, segs: &[Segment], len: u64) {
    if mem.log().is_none() {
        return;
    }
    let mut left = len;
    for s in segs {
        if left == 0 {
            break;
        }
        let n = s.len.min(left);
        mem.dirty(s.gpa, n);
        left = left.saturating_sub(n);
    }
}

/// Copies `len` bytes from `src` segments in `src_mem` to `dst` segments in
/// `dst_mem` (the two memories may be the same guest or two guests). Pages
/// that are contiguous in the host are copied in one piece.
pub fn copy(
    src_mem: &HostMem,
    src: &[Segment],
    dst_mem: &HostMem,
    dst: &[Segment],
    len: u64,
) -> Result<(), AccessError> {
    let r = copy_unlogged(src_mem, src, dst_mem, dst, len);
    dirty_segs(dst_mem, dst, len);
    r
}

/// [`copy`] without the dirty log.
#[inline]
fn copy_unlogged(
    src_mem: &HostMem,
    src: &[Segment],
    dst_mem: &HostMem,
    dst: &[Segment],
    len: u64,
) -> Result<(), AccessError> {
    if total(src) < len || total(dst) < len {
        return Err(AccessError::LengthMismatch {
            src: total(src),
            dst: total(dst),
        });
    }
    // One segment on each side, each inside one RAM region (small
    // messages): one copy, without walking runs.
    if let ([s], [d]) = (src, dst) {
        if let (Some(sp), Some(dp)) = (src_mem.ptr(s.gpa, len), dst_mem.ptr(d.gpa, len)) {
            let n = usize::try_from(len).map_err(|_| AccessError::OutOfRegion)?;
            // SAFETY: `sp` and `dp` are host ranges of `len` bytes inside RAM
            // regions of `src_mem` and `dst_mem` (checked by `HostMem::ptr`),
            // mapped while the borrows live; `guest_to_guest` allows overlap.
            unsafe { volatile::guest_to_guest(sp, dp, n) };
            return Ok(());
        }
    }
    let mut from = HostRuns::new(src_mem, src);
    let mut to = HostRuns::new(dst_mem, dst);
    let (mut s, mut d) = (
        (std::ptr::null_mut::<u8>(), 0u64),
        (std::ptr::null_mut::<u8>(), 0u64),
    );
    let mut left = len;
    while left > 0 {
        if s.1 == 0 {
            match from.next_run()? {
                Some(r) => s = r,
                None => break,
            }
        }
        if d.1 == 0 {
            match to.next_run()? {
                Some(r) => d = r,
                None => break,
            }
        }
        let n = s.1.min(d.1).min(left);
        let chunk = usize::try_from(n).map_err(|_| AccessError::OutOfRegion)?;
        // SAFETY: `s` and `d` are host ranges of at least `n` bytes inside
        // RAM regions of `src_mem` and `dst_mem` (checked by `HostMem::range`),
        // whose mappings live while the borrows do. The ranges may overlap (a
        // guest may copy within its own memory); `guest_to_guest` allows it.
        unsafe { volatile::guest_to_guest(s.0, d.0, chunk) };
        // `n` is the minimum of the three: none of these saturates.
        left = left.saturating_sub(n);
        // SAFETY: advancing by `chunk <= s.1` (resp. `d.1`) bytes stays
        // inside the run or one past its end.
        unsafe {
            s = (s.0.add(chunk), s.1.saturating_sub(n));
            d = (d.0.add(chunk), d.1.saturating_sub(n));
        }
    }
    Ok(())
}

/// Reads the bytes of `segs` (in order) into `buf`, which must be exactly
/// as long as the segments.
pub fn read(mem: &HostMem, segs: &[Segment], buf: &mut [u8]) -> Result<(), AccessError> {
    if total(segs) != buf.len() as u64 {
        return Err(AccessError::LengthMismatch {
            src: total(segs),
            dst: buf.len() as u64,
        });
    }
    let mut runs = HostRuns::new(mem, segs);
    let mut rest = buf;
    while let Some((p, n)) = runs.next_run()? {
        let n = usize::try_from(n).map_err(|_| AccessError::OutOfRegion)?;
        let (dst, tail) = std::mem::take(&mut rest)
            .split_at_mut_checked(n)
            .ok_or(AccessError::OutOfRegion)?;
        // SAFETY: `p` points to `n` bytes of mapped guest RAM (checked by
        // `HostMem::range`) that stay mapped while `mem` is borrowed; `dst`
        // is our own memory, so the ranges do not overlap.
        unsafe { volatile::from_guest(p, dst) };
        rest = tail;
    }
    Ok(())
}

/// Writes `data` across `segs` (in order); `data` may be shorter than the
/// segments, never longer.
pub fn write(mem: &HostMem, segs: &[Segment], data: &[u8]) -> Result<(), AccessError> {
    let r = write_unlogged(mem, segs, data);
    // A length mismatch is found before anything is written.
    if !matches!(r, Err(AccessError::LengthMismatch { .. })) {
        dirty_segs(mem, segs, data.len() as u64);
    }
    r
}

/// [`write`] without the dirty log.
#[inline]
fn write_unlogged(mem: &HostMem, segs: &[Segment], data: &[u8]) -> Result<(), AccessError> {
    if (data.len() as u64) > total(segs) {
        return Err(AccessError::LengthMismatch {
            src: data.len() as u64,
            dst: total(segs),
        });
    }
    let mut runs = HostRuns::new(mem, segs);
    let mut rest = data;
    while !rest.is_empty() {
        let Some((p, n)) = runs.next_run()? else {
            break;
        };
        let n = usize::try_from(n).unwrap_or(usize::MAX).min(rest.len());
        let (src, tail) = rest.split_at(n);
        // SAFETY: as in `read`, in the other direction.
        unsafe { volatile::to_guest(src, p) };
        rest = tail;
    }
    Ok(())
}

/// Copies `buf.len()` bytes at `gpa` (inside one RAM region) into `buf`.
#[inline]
pub fn read_bytes(mem: &HostMem, gpa: u64, buf: &mut [u8]) -> Result<(), AccessError> {
    let p = mem
        .ptr(gpa, buf.len() as u64)
        .ok_or(AccessError::NotRam(gpa))?;
    // SAFETY: `p` points to `buf.len()` bytes of a mapped RAM region
    // (checked above) that stays mapped while `mem` is borrowed; `buf` is
    // our own memory, so the ranges do not overlap.
    unsafe { volatile::from_guest(p, buf) };
    Ok(())
}

/// Copies `data` to `gpa` (inside one RAM region).
#[inline]
pub fn write_bytes(mem: &HostMem, gpa: u64, data: &[u8]) -> Result<(), AccessError> {
    write_bytes_unlogged(mem, gpa, data)?;
    mem.dirty(gpa, data.len() as u64);
    Ok(())
}

/// [`write_bytes`] without the dirty log: for a writer that makes several
/// writes into one page and marks it once after the last
/// ([`HostMem::dirty`]).
#[inline]
pub fn write_bytes_unlogged(mem: &HostMem, gpa: u64, data: &[u8]) -> Result<(), AccessError> {
    let p = mem
        .ptr(gpa, data.len() as u64)
        .ok_or(AccessError::NotRam(gpa))?;
    // SAFETY: as in `read_bytes`, in the other direction.
    unsafe { volatile::to_guest(data, p) };
    Ok(())
}

/// Host pointer of a naturally aligned `size`-byte object at `gpa`.
#[inline]
fn host_ptr(mem: &HostMem, gpa: u64, size: usize) -> Result<*mut u8, AccessError> {
    // A zero size (`checked_rem` is None) is refused too.
    if gpa.checked_rem(size as u64) != Some(0) {
        return Err(AccessError::Misaligned(gpa));
    }
    // `ptr` checks that all `size` bytes are inside one mapped region.
    mem.ptr(gpa, size as u64).ok_or(AccessError::NotRam(gpa))
}

/// An 8-byte atomic in guest memory.
fn atomic_u64(mem: &HostMem, gpa: u64) -> Result<&AtomicU64, AccessError> {
    let p = host_ptr(mem, gpa, 8)?;
    // SAFETY: `p` is 8-byte aligned (host mappings are page aligned and
    // `gpa` is 8-byte aligned) and points to 8 bytes of a guest RAM mapping
    // that stays mapped while `mem` is borrowed, which bounds the returned
    // lifetime. The guest may access the same bytes concurrently; that is
    // why every device-side access to them is atomic.
    Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
}

/// Atomic compare-and-swap of the 8-byte little-endian value at `gpa`;
/// returns the value found there.
pub fn compare_swap(mem: &HostMem, gpa: u64, compare: u64, swap: u64) -> Result<u64, AccessError> {
    let a = atomic_u64(mem, gpa)?;
    let found = match a.compare_exchange(
        compare.to_le(),
        swap.to_le(),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(v) | Err(v) => v,
    };
    mem.dirty(gpa, 8);
    Ok(u64::from_le(found))
}

/// Atomic fetch-and-add of the 8-byte little-endian value at `gpa`;
/// returns the previous value.
pub fn fetch_add(mem: &HostMem, gpa: u64, add: u64) -> Result<u64, AccessError> {
    let a = atomic_u64(mem, gpa)?;
    // Little-endian host (x86_64, aarch64): the in-memory value is native.
    let old = a.fetch_add(add, Ordering::AcqRel);
    mem.dirty(gpa, 8);
    Ok(u64::from_le(old))
}

/// Loads a driver-written 32-bit index with acquire semantics.
#[inline]
pub fn load_u32_acquire(mem: &HostMem, gpa: u64) -> Result<u32, AccessError> {
    let p = host_ptr(mem, gpa, 4)?;
    // SAFETY: as in `atomic_u64`, for a 4-byte aligned object.
    let a = unsafe { AtomicU32::from_ptr(p.cast()) };
    Ok(u32::from_le(a.load(Ordering::Acquire)))
}

/// Stores a device-written 32-bit value with release semantics.
#[inline]
pub fn store_u32_release(mem: &HostMem, gpa: u64, v: u32) -> Result<(), AccessError> {
    let p = host_ptr(mem, gpa, 4)?;
    // SAFETY: as in `atomic_u64`, for a 4-byte aligned object.
    let a = unsafe { AtomicU32::from_ptr(p.cast()) };
    a.store(v.to_le(), Ordering::Release);
    mem.dirty(gpa, 4);
    Ok(())
}

/// Stores one byte with release semantics (a CQE's owner byte, written
/// after the rest of the entry).
#[inline]
pub fn store_u8_release(mem: &HostMem, gpa: u64, v: u8) -> Result<(), AccessError> {
    store_u8_release_unlogged(mem, gpa, v)?;
    mem.dirty(gpa, 1);
    Ok(())
}

/// [`store_u8_release`] without the dirty log (see
/// [`write_bytes_unlogged`]).
#[inline]
pub fn store_u8_release_unlogged(mem: &HostMem, gpa: u64, v: u8) -> Result<(), AccessError> {
    let p = host_ptr(mem, gpa, 1)?;
    // SAFETY: as in `atomic_u64`, for a 1-byte object.
    let a = unsafe { AtomicU8::from_ptr(p) };
    a.store(v, Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::pagelist::PageListLimits;
    use crate::memory::GuestRam;
    use crate::memory::{PageList, RamMap};
    use crate::resources::Mr;
    use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
    use vm_memory::{Bytes, GuestAddress};

    fn mmap() -> GuestRam {
        GuestRam::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x100_0000), 0x10_0000),
        ])
        .unwrap()
    }

    fn mem() -> HostMem {
        HostMem::from_mmap(mmap())
    }

    fn mr(mem: &GuestRam, pages: &[u64], iova: u64, offset: u32, length: u64) -> Mr {
        let ram = RamMap::from_guest_memory(mem);
        let desc = BufferDesc {
            addr: 0,
            npages: pages.len() as u32,
            first_page_offset: offset,
            page_shift: 12,
            mode: PageListMode::INLINE as u32,
        };
        let list: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        let limits = PageListLimits {
            max_pages: 1024,
            max_inline: 1024,
            page_size_cap: 1 << 12,
            max_list_bytes: u64::MAX,
        };
        Mr {
            pd: 1,
            ctx: 1,
            access: 0,
            iova,
            length,
            first_page_offset: offset,
            lkey: 1,
            rkey: 0,
            pages: PageList::resolve(&desc, &list, &limits, &ram, mem).unwrap(),
            host_lost: false,
            keyed: false,
            fast: None,
        }
    }

    #[test]
    fn resolve_merges_and_bounds() {
        let m = mmap();
        // Pages 0x1000, 0x2000 (adjacent), then 0x100_0000.
        let r = mr(
            &m,
            &[0x1000, 0x2000, 0x100_0000],
            0x5000_0010,
            0x10,
            3 * 4096 - 0x10,
        );
        let mut segs = Vec::new();
        resolve(&r, 0x5000_0010, 3 * 4096 - 0x10, &mut segs).unwrap();
        assert_eq!(
            segs,
            vec![
                Segment {
                    gpa: 0x1010,
                    len: 2 * 4096 - 0x10
                },
                Segment {
                    gpa: 0x100_0000,
                    len: 4096
                }
            ]
        );
        let mut segs = Vec::new();
        assert_eq!(
            resolve(&r, 0x5000_0000, 16, &mut segs),
            Err(AccessError::OutOfRegion)
        );
        assert_eq!(
            resolve(&r, 0x5000_0010, 3 * 4096, &mut segs),
            Err(AccessError::OutOfRegion)
        );
        assert_eq!(
            resolve(&r, u64::MAX, 2, &mut segs),
            Err(AccessError::OutOfRegion)
        );
        assert!(resolve(&r, 0x5000_0010, 0, &mut segs).is_ok());
    }

    #[test]
    fn copy_between_guests_across_pages() {
        let a = mem();
        let b = mem();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let src = [
            Segment {
                gpa: 0x100_0000 + 100,
                len: 6000,
            },
            Segment {
                gpa: 0x3000,
                len: 4000,
            },
        ];
        write(&a, &src, &data).unwrap();
        let dst = [
            Segment {
                gpa: 0x8000,
                len: 1,
            },
            Segment {
                gpa: 0x100_4000,
                len: 9999,
            },
        ];
        copy(&a, &src, &b, &dst, 10_000).unwrap();
        let mut out = vec![0u8; 10_000];
        read(&b, &dst, &mut out).unwrap();
        assert_eq!(out, data);
        // Too short a destination.
        assert!(matches!(
            copy(&a, &src, &b, &dst[..1], 10),
            Err(AccessError::LengthMismatch { .. })
        ));
        // A segment outside RAM.
        let bad = [Segment {
            gpa: 0x20_0000,
            len: 16,
        }];
        assert_eq!(
            copy(&a, &bad, &b, &dst, 16),
            Err(AccessError::NotRam(0x20_0000))
        );
    }

    #[test]
    fn atomics_and_indices() {
        let m = mem();
        m.mmap().write_obj(5u64, GuestAddress(0x40)).unwrap();
        assert_eq!(fetch_add(&m, 0x40, 3).unwrap(), 5);
        assert_eq!(
            compare_swap(&m, 0x40, 7, 100).unwrap(),
            8,
            "no swap: 8 != 7"
        );
        assert_eq!(compare_swap(&m, 0x40, 8, 100).unwrap(), 8);
        assert_eq!(m.mmap().read_obj::<u64>(GuestAddress(0x40)).unwrap(), 100);
        assert_eq!(fetch_add(&m, 0x44, 1), Err(AccessError::Misaligned(0x44)));
        assert_eq!(
            fetch_add(&m, 0x20_0000, 1),
            Err(AccessError::NotRam(0x20_0000))
        );
        // The last 8 bytes of region 0 are fine; straddling the end is not RAM.
        assert!(fetch_add(&m, 0xf_fff8, 1).is_ok());
        store_u32_release(&m, 0x100, 0xdead_beef).unwrap();
        assert_eq!(load_u32_acquire(&m, 0x100).unwrap(), 0xdead_beef);
        store_u8_release(&m, 0x10b, 1).unwrap();
        assert_eq!(m.mmap().read_obj::<u8>(GuestAddress(0x10b)).unwrap(), 1);
        assert_eq!(
            load_u32_acquire(&m, 0x102),
            Err(AccessError::Misaligned(0x102))
        );
    }

    #[test]
    fn segments_across_adjacent_regions() {
        // Two RAM regions that touch in guest-physical space: separate
        // mappings, so the host addresses of 0xf_f000 and 0x10_0000 are
        // not contiguous.
        let gm = GuestRam::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x10_0000), 0x10_0000),
        ])
        .unwrap();
        let r = mr(&gm, &[0xf_f000, 0x10_0000], 0x9000, 0, 2 * 4096);
        let a = HostMem::from_mmap(gm);
        let b = mem();
        let mut segs = Vec::new();
        resolve(&r, 0x9000 + 100, 8000, &mut segs).unwrap();
        let data: Vec<u8> = (0..8000u32).map(|i| (i % 253) as u8).collect();
        write(&a, &segs, &data).unwrap();
        let mut back = vec![0u8; 8000];
        read(&a, &segs, &mut back).unwrap();
        assert_eq!(back, data);
        // The bytes landed on both sides of the region boundary.
        let mut edge = [0u8; 2];
        read_bytes(&a, 0xf_ffff, &mut edge[..1]).unwrap();
        read_bytes(&a, 0x10_0000, &mut edge[1..]).unwrap();
        assert_eq!(edge, [data[4096 - 100 - 1], data[4096 - 100]]);
        // Copies from and to such a segment, in both directions.
        let other = [Segment {
            gpa: 0x5000,
            len: 8000,
        }];
        copy(&a, &segs, &b, &other, 8000).unwrap();
        let mut out = vec![0u8; 8000];
        read(&b, &other, &mut out).unwrap();
        assert_eq!(out, data);
        write(&a, &segs, &[0u8; 8000]).unwrap();
        copy(&b, &other, &a, &segs, 8000).unwrap();
        read(&a, &segs, &mut back).unwrap();
        assert_eq!(back, data);
        // A segment that runs from RAM into a hole still fails.
        let bad = [Segment {
            gpa: 0x1f_f000,
            len: 0x2000,
        }];
        assert_eq!(
            read(&a, &bad, &mut [0u8; 0x2000]),
            Err(AccessError::NotRam(0x20_0000))
        );
    }

    #[test]
    fn concurrent_fetch_add_is_atomic() {
        let m = std::sync::Arc::new(mem());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        fetch_add(&m, 0x80, 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            m.mmap().read_obj::<u64>(GuestAddress(0x80)).unwrap(),
            40_000
        );
    }
}
