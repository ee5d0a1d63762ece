//! Copying the entries of a queue's ring into the ring that replaces it
//! (`RESIZE_CQ`, `MODIFY_SRQ` with `SRQ_ATTR_MAX_WR`; spec 12.19, 12.25).
//! Entries keep their indices: entry `i` moves from slot `i mod old depth`
//! to slot `i mod new depth`.

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

    /// Reads entry `index` into `buf` (`stride` bytes), page by page.
    pub fn read<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        index: u32,
        buf: &mut [u8],
    ) -> Result<(), Unusable> {
        let mut at = self.offset(index);
        let mut rest = buf;
        while !rest.is_empty() {
            let (gpa, len) = self.pages.translate(at).ok_or(Unusable)?;
            let n = usize::try_from(len).map_or(rest.len(), |l| l.min(rest.len()));
            if n == 0 {
                return Err(Unusable);
            }
            let (head, tail) = rest.split_at_mut(n);
            read_guest(mem, GuestAddress(gpa), head).map_err(|_| Unusable)?;
            rest = tail;
            at = at.saturating_add(n as u64);
        }
        Ok(())
    }

    /// Writes `data` (`stride` bytes) as entry `index`, page by page.
    pub fn write<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        index: u32,
        data: &[u8],
    ) -> Result<(), Unusable> {
        let mut at = self.offset(index);
        let mut rest = data;
        while !rest.is_empty() {
            let (gpa, len) = self.pages.translate(at).ok_or(Unusable)?;
            let n = usize::try_from(len).map_or(rest.len(), |l| l.min(rest.len()));
            if n == 0 {
                return Err(Unusable);
            }
            let (head, tail) = rest.split_at(n);
            write_guest(mem, GuestAddress(gpa), head).map_err(|_| Unusable)?;
            rest = tail;
            at = at.saturating_add(n as u64);
        }
        Ok(())
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
