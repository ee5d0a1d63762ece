//! A split virtqueue, driver side, in DMA memory (virtio 1.x section 2.7).
//!
//! The driver keeps its own record of every chain it made available and
//! trusts nothing it reads back but the used ring's `id` and `len`, which it
//! checks against that record.

use std::sync::atomic::{fence, AtomicU16, Ordering};

use crate::transport::{DmaRegion, TransportError};

/// Descriptor flags.
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
/// Largest queue size virtio allows.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// One buffer of a chain: guest-physical address, length, device-writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest-physical address.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u32,
    /// Whether the device writes it.
    pub writable: bool,
}

/// Byte offsets of the three parts for a queue of `n` entries.
fn layout(n: usize) -> (usize, usize, usize) {
    let avail = 16 * n;
    let used = (avail + 6 + 2 * n).next_multiple_of(4);
    (avail, used, used + 6 + 8 * n)
}

/// Bytes (and alignment, so that the queue never straddles a page) a queue of
/// `n` entries needs.
pub fn queue_bytes(n: u16) -> usize {
    layout(usize::from(n)).2.next_power_of_two()
}

/// The driver side of a split virtqueue.
#[derive(Debug)]
pub struct SplitQueue {
    mem: Box<dyn DmaRegion>,
    size: u16,
    /// Free descriptor indices.
    free: Vec<u16>,
    /// Descriptors of each chain in flight, by head.
    chains: Vec<Option<Vec<u16>>>,
    avail_idx: u16,
    last_used: u16,
    gpa: u64,
}

impl SplitQueue {
    /// A queue of `size` entries (a power of two) in `mem`, which must be
    /// [`queue_bytes`] long, aligned to that, and inside one page.
    pub fn new(mem: Box<dyn DmaRegion>, size: u16) -> Result<SplitQueue, TransportError> {
        let need = queue_bytes(size);
        let page = 1usize << mem.page_shift();
        let off = mem.first_page_offset() as usize;
        if !size.is_power_of_two()
            || size > MAX_QUEUE_SIZE
            || mem.len() < need
            || off % need.min(page) != 0
            || off + need > page
        {
            return Err(TransportError::Other(format!(
                "virtqueue of {size} entries does not fit its memory"
            )));
        }
        let gpa = mem.pages()[0] + off as u64;
        // SAFETY: `mem` is valid for `len() >= need` bytes and not referenced
        // elsewhere (DmaRegion contract).
        unsafe { std::ptr::write_bytes(mem.as_ptr(), 0, need) };
        Ok(SplitQueue {
            mem,
            size,
            free: (0..size).rev().collect(),
            chains: vec![None; usize::from(size)],
            avail_idx: 0,
            last_used: 0,
            gpa,
        })
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest-physical addresses of the descriptor table, the driver area
    /// (avail ring) and the device area (used ring).
    pub fn addrs(&self) -> (u64, u64, u64) {
        let (a, u, _) = layout(usize::from(self.size));
        (self.gpa, self.gpa + a as u64, self.gpa + u as u64)
    }

    fn at<T>(&self, off: usize) -> *mut T {
        // SAFETY: callers pass offsets inside the layout, which `new`
        // checked fits the region.
        unsafe { self.mem.as_ptr().add(off).cast::<T>() }
    }

    fn avail_idx_atomic(&self) -> &AtomicU16 {
        let (a, _, _) = layout(usize::from(self.size));
        // SAFETY: 2-aligned u16 inside the region (the region is at least
        // 64-aligned and the offset even); the device reads it concurrently,
        // so it is only accessed atomically.
        unsafe { &*self.at::<AtomicU16>(a + 2) }
    }

    fn used_idx_atomic(&self) -> &AtomicU16 {
        let (_, u, _) = layout(usize::from(self.size));
        // SAFETY: as above, for the used ring's idx which the device writes.
        unsafe { &*self.at::<AtomicU16>(u + 2) }
    }

    /// Free descriptors.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Makes the chain `bufs` (readable ones first) available. Returns its
    /// head, or `None` if there are not enough free descriptors.
    pub fn push(&mut self, bufs: &[Buf]) -> Option<u16> {
        if bufs.is_empty() || bufs.len() > self.free.len() {
            return None;
        }
        let ids: Vec<u16> = (0..bufs.len()).filter_map(|_| self.free.pop()).collect();
        for (i, (b, &id)) in bufs.iter().zip(&ids).enumerate() {
            let mut flags = if b.writable { DESC_F_WRITE } else { 0 };
            let next = ids.get(i + 1).copied();
            if next.is_some() {
                flags |= DESC_F_NEXT;
            }
            let d = 16 * usize::from(id);
            // SAFETY: descriptor `id < size` lies inside the table; the device
            // does not read it until the avail index below publishes it.
            unsafe {
                self.at::<u64>(d).write_volatile(b.gpa.to_le());
                self.at::<u32>(d + 8).write_volatile(b.len.to_le());
                self.at::<u16>(d + 12).write_volatile(flags.to_le());
                self.at::<u16>(d + 14)
                    .write_volatile(next.unwrap_or(0).to_le());
            }
        }
        let head = ids[0];
        let (a, _, _) = layout(usize::from(self.size));
        let slot = usize::from(self.avail_idx % self.size);
        // SAFETY: avail ring entry `slot < size`, inside the region.
        unsafe {
            self.at::<u16>(a + 4 + 2 * slot)
                .write_volatile(head.to_le())
        };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The descriptors and ring entry must be visible before the index.
        fence(Ordering::Release);
        self.avail_idx_atomic()
            .store(self.avail_idx.to_le(), Ordering::Release);
        self.chains[usize::from(head)] = Some(ids);
        Some(head)
    }

    /// Takes the next used element: `(head, written length)`. Elements that
    /// name no chain in flight are skipped (and logged): the device is not
    /// trusted to be correct.
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        loop {
            let used = u16::from_le(self.used_idx_atomic().load(Ordering::Acquire));
            if used == self.last_used {
                return None;
            }
            let (_, u, _) = layout(usize::from(self.size));
            let slot = usize::from(self.last_used % self.size);
            // SAFETY: used ring element `slot < size`, inside the region; the
            // acquire load above orders it after the device's write.
            let (id, len) = unsafe {
                (
                    u32::from_le(self.at::<u32>(u + 4 + 8 * slot).read_volatile()),
                    u32::from_le(self.at::<u32>(u + 8 + 8 * slot).read_volatile()),
                )
            };
            self.last_used = self.last_used.wrapping_add(1);
            let chain = usize::try_from(id)
                .ok()
                .and_then(|i| self.chains.get_mut(i))
                .and_then(Option::take);
            match chain {
                Some(ids) => {
                    self.free.extend(ids);
                    return Some((id as u16, len));
                }
                None => log::warn!("device used descriptor {id}, which is not in flight"),
            }
        }
    }

    /// Whether used elements are waiting.
    pub fn has_used(&self) -> bool {
        u16::from_le(self.used_idx_atomic().load(Ordering::Acquire)) != self.last_used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heap memory whose "guest-physical" address is its own address, so
    /// the test can play the device.
    #[derive(Debug)]
    struct Heap {
        ptr: *mut u8,
        layout: std::alloc::Layout,
        pages: Vec<u64>,
    }

    // SAFETY: test memory owned by the value.
    unsafe impl Send for Heap {}
    // SAFETY: as for `Send`.
    unsafe impl Sync for Heap {}

    impl Drop for Heap {
        fn drop(&mut self) {
            // SAFETY: allocated in `queue` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr, self.layout) }
        }
    }

    // SAFETY: the allocation lives as long as the value; one "page" of
    // 2 MiB at the allocation's own address (the allocation is aligned to
    // its size, a power of two far below 2 MiB, so it never straddles one).
    unsafe impl DmaRegion for Heap {
        fn as_ptr(&self) -> *mut u8 {
            self.ptr
        }
        fn len(&self) -> usize {
            self.layout.size()
        }
        fn page_shift(&self) -> u32 {
            21
        }
        fn first_page_offset(&self) -> u32 {
            (self.ptr as usize % (1 << 21)) as u32
        }
        fn pages(&self) -> &[u64] {
            &self.pages
        }
    }

    fn queue(n: u16) -> SplitQueue {
        let size = queue_bytes(n);
        let layout = std::alloc::Layout::from_size_align(size, size).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null());
        let pages = vec![(ptr as usize & !((1 << 21) - 1)) as u64];
        SplitQueue::new(Box::new(Heap { ptr, layout, pages }), n).unwrap()
    }

    fn rd<T: Copy>(addr: u64) -> T {
        // SAFETY: the tests only pass addresses inside the queue's own heap
        // memory ("guest-physical" = host address here), naturally aligned.
        unsafe { (addr as *const T).read_volatile() }
    }

    fn wr<T>(addr: u64, v: T) {
        // SAFETY: as for `rd`.
        unsafe { (addr as *mut T).write_volatile(v) }
    }

    /// The device: uses the next available chain, writing `len`.
    fn device_use(q: &SplitQueue, next: &mut u16, len: u32) -> Vec<Buf> {
        let (d, a, u) = q.addrs();
        let rd16 = rd::<u16>;
        let head = rd16(a + 4 + 2 * u64::from(*next % q.size()));
        let mut bufs = Vec::new();
        let mut i = head;
        loop {
            let e = d + 16 * u64::from(i);
            let flags = rd16(e + 12);
            bufs.push(Buf {
                gpa: rd::<u64>(e),
                len: rd::<u32>(e + 8),
                writable: flags & DESC_F_WRITE != 0,
            });
            if flags & DESC_F_NEXT == 0 {
                break;
            }
            i = rd16(e + 14);
        }
        let used_idx = rd16(u + 2);
        let slot = u + 4 + 8 * u64::from(used_idx % q.size());
        wr::<u32>(slot, u32::from(head));
        wr::<u32>(slot + 4, len);
        wr::<u16>(u + 2, used_idx.wrapping_add(1));
        *next = next.wrapping_add(1);
        bufs
    }

    #[test]
    fn chains_round_trip_and_descriptors_are_recycled() {
        let mut q = queue(4);
        let mut dev_next = 0;
        for round in 0..10u32 {
            let bufs = [
                Buf {
                    gpa: 0x1000,
                    len: 16 + round,
                    writable: false,
                },
                Buf {
                    gpa: 0x2000,
                    len: 32,
                    writable: true,
                },
            ];
            let h1 = q.push(&bufs).unwrap();
            let h2 = q.push(&bufs[..1]).unwrap();
            assert_ne!(h1, h2);
            assert_eq!(q.push(&[bufs[0]; 2]), None, "only one descriptor left");
            assert_eq!(device_use(&q, &mut dev_next, 7), bufs.to_vec());
            assert_eq!(device_use(&q, &mut dev_next, 0), bufs[..1].to_vec());
            assert_eq!(q.pop_used(), Some((h1, 7)));
            assert_eq!(q.pop_used(), Some((h2, 0)));
            assert_eq!(q.pop_used(), None);
            assert_eq!(q.free_descriptors(), 4);
        }
    }

    #[test]
    fn bogus_used_ids_are_skipped() {
        let mut q = queue(4);
        let (_, _, u) = q.addrs();
        let h = q
            .push(&[Buf {
                gpa: 1,
                len: 1,
                writable: true,
            }])
            .unwrap();
        // The device reports ids 3 (not in flight) and 999 (out of range)
        // before the real one.
        for (i, id) in [3u32, 999, u32::from(h)].into_iter().enumerate() {
            let slot = u + 4 + 8 * i as u64;
            wr::<u32>(slot, id);
        }
        wr::<u16>(u + 2, 3);
        assert_eq!(q.pop_used(), Some((h, 0)));
        assert_eq!(q.pop_used(), None);
    }
}
