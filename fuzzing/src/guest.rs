//! A small guest RAM with holes, and fuzzer-chosen addresses in it.

use arbitrary::Arbitrary;
use vm_memory::GuestAddress;

/// Guest page size the harnesses use.
pub const PAGE: u64 = 4096;

/// RAM regions `(start, length)`: two below 4 GiB with a hole between
/// them, and one above 4 GiB.
pub const REGIONS: [(u64, u64); 3] = [
    (0, 0x4_0000),
    (0x10_0000, 0x4_0000),
    (0x1_0000_0000, 0x2_0000),
];

/// Number of 4 KiB pages of RAM.
pub fn pages() -> u64 {
    REGIONS.iter().map(|(_, len)| len / PAGE).sum()
}

/// Guest-physical address of RAM page `index` (taken modulo [`pages`]).
pub fn page_gpa(index: u64) -> u64 {
    let mut i = index % pages();
    for (start, len) in REGIONS {
        let n = len / PAGE;
        if i < n {
            return start + i * PAGE;
        }
        i -= n;
    }
    0
}

/// Whether `[gpa, gpa + len)` lies inside one RAM region.
pub fn in_ram(gpa: u64, len: u64) -> bool {
    let Some(end) = gpa.checked_add(len) else {
        return false;
    };
    REGIONS
        .iter()
        .any(|&(start, rlen)| gpa >= start && end <= start + rlen)
}

/// A fresh, zeroed guest memory with [`REGIONS`].
pub fn memory() -> vhost_user_rdma::memory::GuestRam {
    let ranges: Vec<(GuestAddress, usize)> = REGIONS
        .iter()
        .map(|&(start, len)| (GuestAddress(start), len as usize))
        .collect();
    vhost_user_rdma::memory::GuestRam::from_ranges(&ranges).expect("map the fuzzing guest's RAM")
}

/// A fuzzer-chosen guest-physical address: mostly a RAM page (plus an
/// offset), sometimes anything at all.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Addr {
    /// RAM page `.0` at byte offset `.1` (modulo the page size).
    Page(u8, u16),
    /// Page `.0` of RAM, at offset 0.
    Aligned(u8),
    /// A raw address (holes, past the end, overflowing ranges).
    Raw(u64),
}

impl Addr {
    /// The address.
    pub fn gpa(self) -> u64 {
        match self {
            Addr::Page(p, off) => page_gpa(u64::from(p)) + u64::from(off) % PAGE,
            Addr::Aligned(p) => page_gpa(u64::from(p)),
            Addr::Raw(a) => a,
        }
    }

    /// The address rounded down to `align` (a power of two).
    pub fn aligned(self, align: u64) -> u64 {
        match self {
            Addr::Raw(a) => a,
            _ => self.gpa() & !(align - 1),
        }
    }
}
