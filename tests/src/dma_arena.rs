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

use std::io;
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bytes of a chunk.
pub(crate) const CHUNK: usize = 2 << 20;

/// The chunks of one transport.
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

    /// Gives a range back once its region no longer uses it (its mappings
    /// stay until the chunk has no region left).
    pub(crate) fn give_back(&self, slot: &Slot) {
        let mut st = self.state();
        let Some(ch) = st.chunks.get_mut(slot.chunk) else {
            return;
        };
        ch.live = ch.live.saturating_sub(1);
        let unused = ch.live == 0;
        if unused && st.current != Some(slot.chunk) {
            if let Err(e) = st.clear_chunk(slot.chunk) {
                log::warn!("clear a DMA chunk: {e}");
            }
        }
    }
}

impl State {
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
        for s in &first {
            a.give_back(s);
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
}
