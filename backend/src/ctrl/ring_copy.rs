//! Copying the entries of a queue's ring into the ring that replaces it
//! (`RESIZE_CQ`, `MODIFY_SRQ` with `SRQ_ATTR_MAX_WR`; spec 12.19, 12.25).
//! Entries keep their indices: entry `i` moves from slot `i mod old depth`
//! to slot `i mod new depth`.

use std::ops::Range;

use vm_memory::{GuestAddress, GuestMemoryBackend};

use crate::memory::volatile::{read_guest, write_guest};
use crate::memory::PageList;

/// A ring: its pages, its depth (a power of two) and its entry stride.
#[derive(Clone, Copy)]
pub(super) struct Ring<'a> {
    /// The ring's memory.
    pub pages: &'a PageList,
    /// Entries, a power of two.
    pub depth: u32,
    /// Bytes per entry.
    pub stride: usize,
}

/// A ring entry could not be read or written: the ring left guest RAM.
#[derive(Debug)]
pub(super) struct Unusable;

impl Ring<'_> {
    /// Byte offset of entry `index`'s slot.
    fn offset(&self, index: u32) -> u64 {
        // `depth` is a power of two: the index wraps.
        let slot = index & self.depth.wrapping_sub(1);
        u64::from(slot).saturating_mul(self.stride as u64)
    }

    /// Calls `f` on the pieces of entry `index`'s `len` bytes, page by
    /// page: their guest address and their range in the entry.
    fn each_piece(
        &self,
        index: u32,
        len: usize,
        mut f: impl FnMut(GuestAddress, Range<usize>) -> Result<(), Unusable>,
    ) -> Result<(), Unusable> {
        let mut at = self.offset(index);
        let mut done = 0usize;
        while done < len {
            let (gpa, room) = self.pages.translate(at).ok_or(Unusable)?;
            let left = len.saturating_sub(done);
            let n = usize::try_from(room).map_or(left, |r| r.min(left));
            if n == 0 {
                return Err(Unusable);
            }
            let end = done.saturating_add(n);
            f(GuestAddress(gpa), done..end)?;
            done = end;
            at = at.saturating_add(n as u64);
        }
        Ok(())
    }

    /// Reads entry `index` into `buf` (`stride` bytes).
    pub fn read<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        index: u32,
        buf: &mut [u8],
    ) -> Result<(), Unusable> {
        self.each_piece(index, buf.len(), |gpa, r| {
            let piece = buf.get_mut(r).ok_or(Unusable)?;
            read_guest(mem, gpa, piece).map_err(|_| Unusable)
        })
    }

    /// Writes `data` (`stride` bytes) as entry `index`.
    pub fn write<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        index: u32,
        data: &[u8],
    ) -> Result<(), Unusable> {
        self.each_piece(index, data.len(), |gpa, r| {
            let piece = data.get(r).ok_or(Unusable)?;
            write_guest(mem, gpa, piece).map_err(|_| Unusable)
        })
    }
}

/// Copies entries `first .. first + count` from `from` to `to` in index
/// order, passing each through `fix` (with its index) on the way.
pub(super) fn copy_entries<M: GuestMemoryBackend>(
    mem: &M,
    from: Ring<'_>,
    to: Ring<'_>,
    first: u32,
    count: u32,
    mut fix: impl FnMut(u32, &mut [u8]),
) -> Result<(), Unusable> {
    let mut entry = vec![0u8; from.stride];
    for i in 0..count {
        let index = first.wrapping_add(i);
        from.read(mem, index, &mut entry)?;
        fix(index, &mut entry);
        to.write(mem, index, &entry)?;
    }
    Ok(())
}
