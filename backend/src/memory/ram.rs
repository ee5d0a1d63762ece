//! A compact, sorted view of the guest's RAM regions.
//!
//! Built once per memory-table update; lookups are a cached region check
//! followed by a binary search, so validating a million pages is cheap.

use std::cell::Cell;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// Up to this many regions, lookups scan them all without branching.
const SCAN_REGIONS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    start: u64,
    /// One past the last byte.
    end: u64,
}

/// Guest RAM as a sorted list of non-overlapping `[start, end)` ranges.
#[derive(Debug, Default, Clone)]
pub struct RamMap {
    regions: Vec<Region>,
    last_hit: Cell<usize>,
}

impl RamMap {
    /// Builds the map from explicit `(start, len)` ranges.
    pub fn from_ranges(ranges: &[(u64, u64)]) -> Self {
        let mut regions: Vec<Region> = ranges
            .iter()
            .filter(|(_, len)| *len > 0)
            .map(|&(start, len)| Region {
                start,
                end: start.saturating_add(len),
            })
            .collect();
        regions.sort_by_key(|r| r.start);
        RamMap {
            regions,
            last_hit: Cell::new(0),
        }
    }

    /// Builds the map from a vm-memory guest memory object.
    pub fn from_guest_memory<M: GuestMemoryBackend>(mem: &M) -> Self {
        let ranges: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
        Self::from_ranges(&ranges)
    }

    /// Total bytes of RAM.
    pub fn total_bytes(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| r.end.saturating_sub(r.start))
            .fold(0, u64::saturating_add)
    }

    /// Whether `[gpa, gpa + len)` lies entirely inside one RAM region.
    /// A zero-length range is never valid; an overflowing one neither.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        if self.regions.len() <= SCAN_REGIONS {
            // Guests typically have RAM below and above 4 GiB, and page
            // lists alternate between them unpredictably: a branch-free scan
            // of a few regions beats a cached binary search that keeps
            // mispredicting.
            return self
                .regions
                .iter()
                .fold(false, |ok, r| ok | ((r.start <= gpa) & (end <= r.end)));
        }
        if let Some(r) = self.regions.get(self.last_hit.get()) {
            if r.start <= gpa && end <= r.end {
                return true;
            }
        }
        // First region whose end is beyond gpa.
        let idx = self.regions.partition_point(|r| r.end <= gpa);
        match self.regions.get(idx) {
            Some(r) if r.start <= gpa && end <= r.end => {
                self.last_hit.set(idx);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_and_edges() {
        let m = RamMap::from_ranges(&[(0x1_0000_0000, 0x1000_0000), (0, 0x1000_0000)]);
        assert!(m.contains(0, 4096));
        assert!(m.contains(0x1000_0000 - 4096, 4096));
        assert!(!m.contains(0x1000_0000 - 4096, 8192)); // runs into the hole
        assert!(!m.contains(0x1000_0000, 4096)); // in the hole
        assert!(m.contains(0x1_0000_0000, 4096));
        assert!(!m.contains(0x1_0000_0000 - 1, 2)); // straddles hole/region
        assert!(!m.contains(u64::MAX - 10, 4096)); // overflow
        assert!(!m.contains(0, 0));
        assert!(!m.contains(0x2_0000_0000, 1));
        assert_eq!(m.total_bytes(), 0x2000_0000);
    }

    #[test]
    fn many_regions_use_the_search() {
        // 20 regions of 1 MiB with 1 MiB holes: beyond the scan threshold.
        let ranges: Vec<(u64, u64)> = (0..20).map(|i| (i * 0x20_0000, 0x10_0000)).collect();
        let m = RamMap::from_ranges(&ranges);
        for i in 0..20u64 {
            let base = i * 0x20_0000;
            assert!(m.contains(base, 0x10_0000));
            assert!(!m.contains(base + 0x10_0000, 1));
            assert!(!m.contains(base + 0xf_f000, 0x2000));
        }
        assert!(m.contains(0x13 * 0x20_0000 + 0x1000, 4096));
    }
}
