//! Address space for the DMA mappings of a
//! [`VmmTransport`](crate::transport::VmmTransport).
//!
//! A DMA region maps its guest pages side by side into a range of this
//! process's address space. Unmapping a range whose pages were touched
//! costs a TLB shootdown on every CPU that runs a thread of the process
//! (the daemon's threads too, in a test), and regions come and go with
//! every queue and buffer of the driver. So the ranges come from chunks: a
//! chunk is filled front to back, and once no region placed in it is left,
//! all of its mappings go at once (one shootdown for many regions) and the
//! chunk is filled again.
//!
//! On request ([`DmaArena::set_kept_views`]) the arena also keeps the
//! mappings of the last regions given back, each with its list of guest
//! pages, and hands one out again for a new region of the same pages
//! ([`DmaArena::take_view`]): no `mmap` per page now and no `munmap` later.
//! A driver that frees its queues and opens the device again (a device
//! reset) asks its allocator for the same sizes in the same order, and gets
//! the same pages back.

use std::collections::VecDeque;
use std::io;
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bytes of a chunk.
pub(crate) const CHUNK: usize = 2 << 20;

/// The chunks of one transport (or of several in turn, over the same
/// guest RAM: [`crate::transport::VmmTransport::with_dma_space_of`]).
#[derive(Debug, Default)]
pub(crate) struct DmaArena {
    st: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    chunks: Vec<Chunk>,
    /// The chunk being filled.
    current: Option<usize>,
    /// Chunks without mappings, to be filled again.
    clear: Vec<usize>,
    /// Mappings of regions given back, oldest first, at most `keep` of
    /// them; each still counts as a region of its chunk.
    kept: VecDeque<View>,
    /// How many mappings to keep ([`DmaArena::set_kept_views`]).
    keep: usize,
}

/// A slot whose pages are still mapped after its region was given back.
#[derive(Debug)]
struct View {
    /// The guest-physical page addresses mapped side by side at the slot.
    pages: Vec<u64>,
    slot: Slot,
}

#[derive(Debug)]
struct Chunk {
    base: usize,
    /// Bytes from the start taken so far (never given back one by one).
    used: usize,
    /// Regions placed in it and not given back.
    live: usize,
}

/// A range of a chunk, for one region.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Its first byte.
    pub(crate) start: usize,
    chunk: usize,
}

/// Reserves `len` bytes of address space, mapped to nothing (`PROT_NONE`);
/// at `at` (replacing what is there) if given.
fn reserve(at: Option<usize>, len: usize) -> io::Result<usize> {
    let (addr, fixed) = match at {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (ptr::null_mut(), 0),
    };
    // SAFETY: an anonymous PROT_NONE mapping; without MAP_FIXED the kernel
    // picks a free range, with it `at .. at + len` is a chunk of this arena
    // whose regions are all gone (see `DmaArena::give_back`), so nothing
    // uses what it replaces. The result is checked.
    let p = unsafe {
        libc::mmap(
            addr,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

impl DmaArena {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent.
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A range of `span` bytes aligned to `align` (a power of two, at least
    /// the page size) and mapped to nothing, or `None` when that does not
    /// fit in a chunk.
    pub(crate) fn take(&self, span: usize, align: usize) -> io::Result<Option<Slot>> {
        if span.saturating_add(align) > CHUNK {
            return Ok(None);
        }
        let mut st = self.state();
        loop {
            if let Some(c) = st.current {
                let ch = &mut st.chunks[c];
                let start = (ch.base + ch.used).next_multiple_of(align);
                if start + span <= ch.base + CHUNK {
                    ch.used = start + span - ch.base;
                    ch.live += 1;
                    return Ok(Some(Slot { start, chunk: c }));
                }
                // Full: cleared once its regions are gone.
                st.current = None;
                if st.chunks[c].live == 0 {
                    st.clear_chunk(c)?;
                }
            }
            let c = match st.clear.pop() {
                Some(c) => c,
                None => {
                    let base = reserve(None, CHUNK)?;
                    st.chunks.push(Chunk {
                        base,
                        used: 0,
                        live: 0,
                    });
                    st.chunks.len() - 1
                }
            };
            st.chunks[c].used = 0;
            st.current = Some(c);
        }
    }

    /// Keeps the mappings of up to `n` regions given back for regions of
    /// the same pages to come ([`DmaArena::take_view`]); 0 (the default)
    /// keeps none, and drops those kept so far.
    pub(crate) fn set_kept_views(&self, n: usize) {
        let mut st = self.state();
        st.keep = n;
        st.trim();
    }

    /// A slot aligned to `align` whose pages are mapped already, exactly
    /// `pages` side by side (kept from a region given back), if one is
    /// kept. The caller maps nothing into it; it gives it back as any slot.
    pub(crate) fn take_view(&self, pages: &[u64], align: usize) -> Option<Slot> {
        let mut st = self.state();
        let i = st
            .kept
            .iter()
            .position(|v| v.slot.start % align == 0 && v.pages == pages)?;
        st.kept.remove(i).map(|v| v.slot)
    }

    /// Gives a range back once its region no longer uses it. Its mappings
    /// stay until the chunk has no region left; with
    /// [`DmaArena::set_kept_views`], `pages` (what the range maps) is kept
    /// for a region of the same pages.
    pub(crate) fn give_back(&self, slot: Slot, pages: &[u64]) {
        let mut st = self.state();
        if st.keep > 0 {
            st.kept.push_back(View {
                pages: pages.to_vec(),
                slot,
            });
            st.trim();
        } else {
            st.release(&slot);
        }
    }
}

impl State {
    /// Gives back the oldest kept mappings beyond `keep`.
    fn trim(&mut self) {
        while self.kept.len() > self.keep {
            if let Some(v) = self.kept.pop_front() {
                self.release(&v.slot);
            }
        }
    }

    /// `slot`'s region is gone: its chunk is cleared once it holds none.
    fn release(&mut self, slot: &Slot) {
        let Some(ch) = self.chunks.get_mut(slot.chunk) else {
            return;
        };
        ch.live = ch.live.saturating_sub(1);
        let unused = ch.live == 0;
        if unused && self.current != Some(slot.chunk) {
            if let Err(e) = self.clear_chunk(slot.chunk) {
                log::warn!("clear a DMA chunk: {e}");
            }
        }
    }

    /// Drops every mapping of chunk `c`, which no region uses any more, and
    /// lists it for filling again.
    fn clear_chunk(&mut self, c: usize) -> io::Result<()> {
        let base = self.chunks[c].base;
        reserve(Some(base), CHUNK)?;
        self.chunks[c].used = 0;
        self.clear.push(c);
        Ok(())
    }
}

impl Drop for DmaArena {
    fn drop(&mut self) {
        let st = self.state();
        for ch in &st.chunks {
            // SAFETY: the chunk was reserved by this arena and is unmapped
            // once, here; every region holds the arena, so none is left.
            if unsafe { libc::munmap(ch.base as *mut libc::c_void, CHUNK) } != 0 {
                log::warn!("munmap a DMA chunk: {}", io::Error::last_os_error());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PAGE: usize = 4096;

    #[test]
    fn slots_are_aligned_and_apart() {
        let a = DmaArena::default();
        let s1 = a.take(3 * PAGE, PAGE).unwrap().unwrap();
        let s2 = a.take(PAGE, 16 * PAGE).unwrap().unwrap();
        let s3 = a.take(PAGE, PAGE).unwrap().unwrap();
        assert_eq!(s2.start % (16 * PAGE), 0);
        assert!(s1.start + 3 * PAGE <= s2.start);
        assert!(s2.start + PAGE <= s3.start);
        assert!(
            a.take(CHUNK, PAGE).unwrap().is_none(),
            "larger than a chunk"
        );
    }

    #[test]
    fn a_chunk_whose_regions_are_gone_is_filled_again() {
        let a = DmaArena::default();
        let per_chunk = CHUNK / (64 * PAGE);
        let first: Vec<Slot> = (0..per_chunk)
            .map(|_| a.take(64 * PAGE, PAGE).unwrap().unwrap())
            .collect();
        let base = first[0].start;
        // The first chunk is full: the next region opens a second one.
        let second = a.take(64 * PAGE, PAGE).unwrap().unwrap();
        assert!(second.start < base || second.start >= base + CHUNK);
        for s in first {
            a.give_back(s, &[]);
        }
        // Fill the second chunk: the one after it is the first, cleared.
        let rest: Vec<Slot> = (1..per_chunk)
            .map(|_| a.take(64 * PAGE, PAGE).unwrap().unwrap())
            .collect();
        assert!(rest.iter().all(|s| s.chunk == second.chunk));
        let again = a.take(64 * PAGE, PAGE).unwrap().unwrap();
        assert_eq!(again.start, base);
        assert_eq!(a.state().chunks.len(), 2);
    }

    #[test]
    fn kept_views_come_back_for_the_same_pages_only() {
        let a = DmaArena::default();
        a.set_kept_views(2);
        let s1 = a.take(2 * PAGE, PAGE).unwrap().unwrap();
        let start = s1.start;
        a.give_back(s1, &[0x1000, 0x3000]);
        // Other pages, or an alignment the slot does not have: none.
        assert!(a.take_view(&[0x1000, 0x5000], PAGE).is_none());
        assert!(a.take_view(&[0x1000], PAGE).is_none());
        // An alignment the start lacks: twice its lowest set bit.
        let odd = (start & start.wrapping_neg()) << 1;
        assert!(a.take_view(&[0x1000, 0x3000], odd).is_none());
        let again = a.take_view(&[0x1000, 0x3000], PAGE).unwrap();
        assert_eq!(again.start, start);
        // Handed out once.
        assert!(a.take_view(&[0x1000, 0x3000], PAGE).is_none());
        a.give_back(again, &[0x1000, 0x3000]);
        // The oldest goes beyond the bound, and with it the chunk's last
        // region: the chunk is cleared once it is not the one being filled.
        let s2 = a.take(PAGE, PAGE).unwrap().unwrap();
        let s3 = a.take(PAGE, PAGE).unwrap().unwrap();
        a.give_back(s2, &[0x7000]);
        a.give_back(s3, &[0x9000]);
        assert!(a.take_view(&[0x1000, 0x3000], PAGE).is_none());
        assert_eq!(a.state().kept.len(), 2);
        assert_eq!(a.state().chunks[0].live, 2);
        a.set_kept_views(0);
        assert!(a.state().kept.is_empty());
        assert_eq!(a.state().chunks[0].live, 0);
    }
}
