//! The engine's view of one guest's RAM: the host address of every RAM
//! region, kept next to the mapping it came from.
//!
//! `vm-memory` looks a region up (and builds a `VolatileSlice`) on every
//! access. The data path makes several accesses per work request, so it
//! translates through this small table instead: a linear scan of a handful
//! of regions (guests have one or two) and a pointer offset. The table owns
//! a reference to the mapping, so every pointer it hands out stays mapped
//! for as long as the table lives — even after the VMM replaces its memory
//! table, in which case the owner drops the table and builds a new one.
//!
//! The table also carries the VMM's dirty log while logging is on
//! ([`super::dirty`]): every writer of guest RAM calls [`HostMem::dirty`]
//! after its write, which costs one predicted branch while logging is off.

use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::dirty::LogMap;
use super::GuestRam;

#[derive(Debug, Clone, Copy)]
struct HostRegion {
    /// First guest-physical address.
    start: u64,
    /// One past the last guest-physical address.
    end: u64,
    /// Host address of `start`.
    host: *mut u8,
}

/// Guest RAM regions with their host addresses.
#[derive(Debug)]
pub struct HostMem {
    regions: Vec<HostRegion>,
    mem: Arc<GuestRam>,
    /// The dirty log while logging is on.
    log: Option<Arc<LogMap>>,
}

// SAFETY: the raw pointers point into the mappings owned by `mem` (an
// `Arc` of a `Send + Sync` mapping), which live as long as `self`. The
// table itself is immutable after construction; every access to the
// pointed-to guest memory goes through `access`, which uses atomics or
// raw copies as for any memory shared with a running guest.
unsafe impl Send for HostMem {}
// SAFETY: as for `Send`; shared references only read the immutable table.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// Builds the table for `mem` (kept alive by the table).
    pub fn new(mem: Arc<GuestRam>) -> Self {
        let mut regions: Vec<HostRegion> = mem
            .iter()
            .filter_map(|r| {
                let start = r.start_addr().0;
                let end = start.checked_add(r.len())?;
                let host = r.get_host_address(MemoryRegionAddress(0)).ok()?;
                Some(HostRegion { start, end, host })
            })
            .collect();
        regions.sort_by_key(|r| r.start);
        HostMem {
            regions,
            mem,
            log: None,
        }
    }

    /// The same table marking `log` (`None`: logging off).
    pub fn with_log(&self, log: Option<Arc<LogMap>>) -> Self {
        HostMem {
            regions: self.regions.clone(),
            mem: self.mem.clone(),
            log,
        }
    }

    /// Builds the table for a mapping of its own (tests, tools).
    pub fn from_mmap(mem: GuestRam) -> Self {
        Self::new(Arc::new(mem))
    }

    /// The mapping behind the table.
    pub fn mmap(&self) -> &GuestRam {
        &self.mem
    }

    /// The dirty log this table marks, if logging is on.
    pub fn log(&self) -> Option<&Arc<LogMap>> {
        self.log.as_ref()
    }

    /// Marks `[gpa, gpa + len)` dirty in the VMM's log if logging is on;
    /// call after writing there.
    #[inline]
    pub fn dirty(&self, gpa: u64, len: u64) {
        if let Some(l) = &self.log {
            mark_cold(l, gpa, len);
        }
    }

    /// Host address of `gpa` when `[gpa, gpa + len)` lies inside one RAM
    /// region, and how many bytes of that region follow `gpa`.
    #[inline]
    pub fn range(&self, gpa: u64, len: u64) -> Option<(*mut u8, u64)> {
        let end = gpa.checked_add(len)?;
        for r in &self.regions {
            if gpa >= r.start && end <= r.end {
                // Neither subtraction can fail (`r.start <= gpa <= r.end`).
                let off = usize::try_from(gpa.checked_sub(r.start)?).ok()?;
                // SAFETY: `off` is less than or equal to the region's length
                // (`gpa + len <= end`), so the result is inside the region's
                // mapping or one past its end; no memory is accessed here.
                let p = unsafe { r.host.add(off) };
                return Some((p, r.end.checked_sub(gpa)?));
            }
        }
        None
    }

    /// Whether every byte of `[gpa, gpa + len)` is guest RAM (it may span
    /// RAM regions that touch). Regions are sorted and do not overlap.
    pub fn covers(&self, gpa: u64, len: u64) -> bool {
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        let mut at = gpa;
        for r in &self.regions {
            if at >= end {
                break;
            }
            if r.end <= at {
                continue;
            }
            if r.start > at {
                return false;
            }
            at = r.end;
        }
        at >= end
    }

    /// Host address of `[gpa, gpa + len)`, which must lie inside one RAM
    /// region.
    #[inline]
    pub fn ptr(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        self.range(gpa, len).map(|(p, _)| p)
    }
}

/// Out of line: the data path's code stays as it was with logging off.
#[cold]
#[inline(never)]
fn mark_cold(log: &LogMap, gpa: u64, len: u64) {
    log.mark(gpa, len);
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestAddress;

    use super::*;

    #[test]
    fn covers_ranges_across_touching_regions_only() {
        let mem = GuestRam::from_ranges(&[
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x2000), 0x1000),
            (GuestAddress(0x5000), 0x1000),
        ])
        .unwrap();
        let host = HostMem::from_mmap(mem);
        assert!(host.covers(0x1000, 0x2000), "two regions that touch");
        assert!(host.covers(0x1800, 0x1000));
        assert!(host.covers(0x5000, 0x1000));
        assert!(host.covers(0x5fff, 0));
        assert!(!host.covers(0x2800, 0x1000), "runs into a hole");
        assert!(!host.covers(0x0, 0x1001), "starts in a hole");
        assert!(!host.covers(0x5800, 0x1000), "past the end");
        assert!(!host.covers(u64::MAX, 2), "overflow");
    }
}
