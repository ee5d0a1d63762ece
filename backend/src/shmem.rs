//! The doorbell region of the shared-memory doorbell mode (spec section
//! 18.7): a memfd the daemon maps itself and the VMM maps into the guest as
//! a VIRTIO shared memory region, divided into one 4 KiB doorbell page per
//! context.
//!
//! The guest writes the slots of a page at any time and with any value, so
//! the daemon never forms references into the region: every access is an
//! atomic load or store through a raw pointer whose offset is checked
//! against the region.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags, VhostUserShMemConfig};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use virtio_rdma_abi::datapath::{db_slot_offset, DB_PAGE_SIZE, DB_PAGE_SLOTS, SHMEM_ID_DOORBELL};

/// Errors setting up the doorbell region.
#[derive(Debug, Error)]
pub enum ShmemError {
    /// `memfd_create`, `ftruncate` or `mmap` failed.
    #[error("cannot create the doorbell region ({op}): {err}")]
    Os {
        /// The failing call.
        op: &'static str,
        /// The OS error.
        err: std::io::Error,
    },
    /// The region would not fit in the address space.
    #[error("doorbell region for {0} contexts is too large")]
    TooLarge(u32),
    /// A region handed over by another daemon is not one this daemon
    /// would have made for its configuration.
    #[error("the doorbell region handed over does not fit: {0}")]
    Foreign(String),
}

/// The seals of the doorbell memfd: its size is fixed for its life.
const DOORBELL_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Words of a page's slot bitmap.
const BITMAP_WORDS: usize = (DB_PAGE_SLOTS as usize).div_ceil(64);

/// The memfd and the daemon's own shared mapping of it.
#[derive(Debug)]
pub struct DoorbellRegion {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    pages: u32,
}

// SAFETY: the mapping is process-wide memory that lives as long as the
// region; all accesses go through atomics (see the module comment).
unsafe impl Send for DoorbellRegion {}
// SAFETY: as above; no method hands out references into the mapping.
unsafe impl Sync for DoorbellRegion {}

impl DoorbellRegion {
    /// Creates a zeroed region with at least `pages` doorbell pages; its
    /// length is the next power of two (a rule of QEMU's shared memory).
    pub fn new(pages: u32) -> Result<Self, ShmemError> {
        let pages = pages.max(1);
        let len = Self::len_for(pages)?;
        let os = |op| ShmemError::Os {
            op,
            err: std::io::Error::last_os_error(),
        };
        // SAFETY: the name is a NUL-terminated string; the call has no
        // memory effects on this process besides returning an fd.
        let raw = unsafe {
            libc::memfd_create(
                c"vhost-user-rdma-doorbells".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).map_err(|_| ShmemError::TooLarge(pages))?;
        // SAFETY: ftruncate on an fd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os("ftruncate"));
        }
        // QEMU 11.1 puts every SHMEM_MAP mapping into the memory table it
        // sends the back-end (SET_MEM_TABLE), so the region comes back as
        // a guest memory region, and guest memory must be sealed against
        // shrinking (spec 19.6.1). Its size never changes, so seal it.
        // SAFETY: F_ADD_SEALS on an fd we own; no memory effects.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, DOORBELL_SEALS) } != 0 {
            return Err(os("fcntl(F_ADD_SEALS)"));
        }
        Self::map(fd, len, pages)
    }

    /// The region's length for `pages` pages: the next power of two.
    fn len_for(pages: u32) -> Result<usize, ShmemError> {
        u64::from(pages)
            .checked_mul(DB_PAGE_SIZE)
            .and_then(u64::checked_next_power_of_two)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or(ShmemError::TooLarge(pages))
    }

    /// Takes over the region of a daemon that hands its instances to this
    /// one (spec 20.7): the memfd the VMM maps into the guest, contents
    /// and all. It must be what [`DoorbellRegion::new`] makes for `pages`
    /// pages: a memfd of that length, sealed the same way, so that its
    /// size can change under neither daemon.
    pub fn adopt(fd: OwnedFd, pages: u32) -> Result<Self, ShmemError> {
        let pages = pages.max(1);
        let len = Self::len_for(pages)?;
        let foreign = |why: String| Err(ShmemError::Foreign(why));
        // SAFETY: F_GET_SEALS reads the seals of a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return foreign(format!("not a memfd: {}", std::io::Error::last_os_error()));
        }
        if seals & DOORBELL_SEALS != DOORBELL_SEALS {
            return foreign(format!("seals {seals:#x}, {DOORBELL_SEALS:#x} wanted"));
        }
        let size = std::fs::File::from(
            fd.try_clone()
                .map_err(|err| ShmemError::Os { op: "dup", err })?,
        )
        .metadata()
        .map_err(|err| ShmemError::Os { op: "fstat", err })?
        .len();
        if size != len as u64 {
            return foreign(format!("{size} bytes, {len} for {pages} pages here"));
        }
        Self::map(fd, len, pages)
    }

    /// Maps `len` bytes of the region's memfd `fd`.
    fn map(fd: OwnedFd, len: usize, pages: u32) -> Result<Self, ShmemError> {
        let os = |op| ShmemError::Os {
            op,
            err: std::io::Error::last_os_error(),
        };
        // SAFETY: a new shared mapping of `len` bytes of our memfd; the
        // kernel chooses the address, so no existing mapping is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| os("mmap"))?;
        Ok(DoorbellRegion {
            fd,
            base,
            len,
            pages,
        })
    }

    /// The memfd, for `SHMEM_MAP`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes (a power of two).
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether the region is empty (never: it has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of usable doorbell pages.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// The 32-bit word at byte `off`, if it lies inside the region and is
    /// aligned.
    fn word(&self, off: u64) -> Option<&AtomicU32> {
        let off = usize::try_from(off).ok()?;
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: the word lies inside the live mapping (checked above) and
        // is 4-byte aligned (the mapping is page aligned). Shared memory
        // that the guest writes concurrently is exactly what atomics are
        // for; no non-atomic reference to these bytes is ever created.
        Some(unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() })
    }

    fn page_off(page: u32) -> u64 {
        // Cannot saturate (u32 pages of 4 KiB); `word` refuses what is
        // outside the region anyway.
        u64::from(page).saturating_mul(DB_PAGE_SIZE)
    }

    /// Byte offset of word `half & 1` of a slot; `None` past the last slot.
    fn slot_word(at: SlotRef, half: u32) -> Option<u64> {
        let word = if half & 1 == 0 { 0 } else { 4 };
        Self::page_off(at.page)
            .checked_add(db_slot_offset(at.slot)?)?
            .checked_add(word)
    }

    /// Zeroes a whole page.
    fn zero_page(&self, page: u32) {
        let base = Self::page_off(page);
        for i in (0..DB_PAGE_SIZE).step_by(4) {
            if let Some(w) = self.word(base.saturating_add(i)) {
                w.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Zeroes the whole region: every page's header and slots. The device
    /// calls it on VMM disconnect and on device reset, so that a new driver
    /// (or the same one after a reset) does not start from the previous
    /// one's producer indices and flags.
    pub fn clear(&self) {
        // The whole mapping, including the tail past `pages` (the length is
        // rounded up to a power of two) that the guest maps too.
        for off in (0..self.len as u64).step_by(4) {
            if let Some(w) = self.word(off) {
                w.store(0, Ordering::Relaxed);
            }
        }
        // Release: a driver that maps the region afterwards sees zeroes.
        std::sync::atomic::fence(Ordering::Release);
    }

    /// Zeroes one slot.
    fn zero_slot(&self, page: u32, slot: u32) {
        let at = SlotRef { page, slot };
        for half in [0, 1] {
            if let Some(w) = Self::slot_word(at, half).and_then(|off| self.word(off)) {
                w.store(0, Ordering::Release);
            }
        }
    }

    /// Stores the header `flags` of a page (release).
    fn set_flags(&self, page: u32, flags: u32) {
        if let Some(w) = self.word(Self::page_off(page)) {
            w.store(flags, Ordering::Release);
        }
    }

    /// The header `flags` of a page.
    pub fn flags(&self, page: u32) -> u32 {
        self.word(Self::page_off(page))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Acquire load of word `half` (0 or 1) of a slot: `sq_pi`/`rq_pi` of a
    /// QP slot, `pi` of an SRQ slot.
    pub fn load(&self, slot: SlotRef, half: u32) -> u32 {
        Self::slot_word(slot, half)
            .and_then(|off| self.word(off))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Stores word `half` of a slot; only tests, which play the driver,
    /// write slots.
    pub fn store(&self, slot: SlotRef, half: u32, value: u32) {
        if let Some(w) = Self::slot_word(slot, half).and_then(|off| self.word(off)) {
            w.store(value, Ordering::Release);
        }
    }
}

impl Drop for DoorbellRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference
        // into it outlives `self` (`word` borrows `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The doorbell slot of one queue: page (= its context's page) and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    /// Doorbell page index.
    pub page: u32,
    /// Slot index in the page.
    pub slot: u32,
}

/// A queue's slot together with the region it lives in, so the engine can
/// read producer indices without the allocation state.
#[derive(Debug, Clone)]
pub struct DbSlot {
    region: Arc<DoorbellRegion>,
    at: SlotRef,
}

impl DbSlot {
    /// Where the slot is.
    pub fn at(&self) -> SlotRef {
        self.at
    }

    /// Acquire load of producer index word `half` (QP: 0 `sq_pi`, 1
    /// `rq_pi`; SRQ: 0 `pi`).
    pub fn load(&self, half: u32) -> u32 {
        self.region.load(self.at, half)
    }

    /// Address of word 0 of the slot (word 1 follows): for pollers that
    /// keep the region alive themselves (`region()`) and access the words
    /// atomically only.
    pub fn pi_ptr(&self) -> *const AtomicU32 {
        DoorbellRegion::slot_word(self.at, 0)
            .and_then(|off| self.region.word(off))
            .map_or(std::ptr::null(), |w| w as *const AtomicU32)
    }

    /// The region the slot lives in.
    pub fn region(&self) -> &Arc<DoorbellRegion> {
        &self.region
    }
}

/// What a doorbell page is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    /// Free: the next `CREATE_CTX` may take it.
    Free,
    /// The page of a live context, with the bitmap of its used slots.
    InUse([u64; BITMAP_WORDS]),
    /// It was the page of a context when the VMM's connection closed: a
    /// guest process may still map it, so it is not handed out again
    /// before the driver resets the device (spec 15.2, 18.7).
    Quarantined,
}

/// Page and slot allocation of one device instance.
#[derive(Debug)]
pub struct DoorbellPages {
    region: Arc<DoorbellRegion>,
    /// Set by the device while the VMM has the region mapped.
    mapped: Arc<AtomicBool>,
    /// State of every page.
    used: Vec<Page>,
}

impl DoorbellPages {
    /// Allocation state over `region`; pages are handed out only while
    /// `mapped` is set.
    pub fn new(region: Arc<DoorbellRegion>, mapped: Arc<AtomicBool>) -> Self {
        let n = region.pages() as usize;
        DoorbellPages {
            region,
            mapped,
            used: vec![Page::Free; n],
        }
    }

    /// The region.
    pub fn region(&self) -> &Arc<DoorbellRegion> {
        &self.region
    }

    /// Allocates and zeroes a page for a new context; `None` if the region
    /// is not mapped into the guest or every page is in use or quarantined.
    pub fn alloc_page(&mut self) -> Option<u32> {
        if !self.mapped.load(Ordering::Acquire) {
            return None;
        }
        let index = self.used.iter().position(|p| *p == Page::Free)?;
        let page = u32::try_from(index).ok()?;
        self.region.zero_page(page);
        // The engine resumes polling after every control command, so a
        // new page starts without DB_FLAG_KICK (spec 18.7, parking).
        *self.used.get_mut(index)? = Page::InUse([0; BITMAP_WORDS]);
        Some(page)
    }

    /// Frees a context's page (a quarantined page stays quarantined).
    pub fn free_page(&mut self, page: u32) {
        if let Some(p) = self.used.get_mut(page as usize) {
            if matches!(p, Page::InUse(_)) {
                *p = Page::Free;
            }
        }
    }

    /// Allocates and zeroes a slot in `page` for a new queue.
    pub fn alloc_slot(&mut self, page: u32) -> Option<DbSlot> {
        let Page::InUse(bits) = self.used.get_mut(page as usize)? else {
            return None;
        };
        let slot = (0..DB_PAGE_SLOTS).find(|&s| {
            bits.get(s as usize / 64)
                .is_some_and(|w| w & (1 << (s % 64)) == 0)
        })?;
        *bits.get_mut(slot as usize / 64)? |= 1 << (slot % 64);
        self.region.zero_slot(page, slot);
        Some(DbSlot {
            region: self.region.clone(),
            at: SlotRef { page, slot },
        })
    }

    /// Takes `page` for a context of a state handed over by another
    /// daemon (spec 20.7): as [`DoorbellPages::alloc_page`], but the page
    /// keeps what the guest wrote. False unless the page is free.
    pub fn claim_page(&mut self, page: u32) -> bool {
        self.claim_free(page, Page::InUse([0; BITMAP_WORDS]))
    }

    /// Puts free page `page` into state `to`; false unless it was free.
    fn claim_free(&mut self, page: u32, to: Page) -> bool {
        match self.used.get_mut(page as usize) {
            Some(p @ Page::Free) => {
                *p = to;
                true
            }
            _ => false,
        }
    }

    /// Takes `slot` of `page` (claimed before) for a queue of a state
    /// handed over, keeping its producer indices. `None` unless the slot
    /// exists and is free.
    pub fn claim_slot(&mut self, page: u32, slot: u32) -> Option<DbSlot> {
        if slot >= DB_PAGE_SLOTS {
            return None;
        }
        let Page::InUse(bits) = self.used.get_mut(page as usize)? else {
            return None;
        };
        let word = bits.get_mut(slot as usize / 64)?;
        let bit = 1u64 << (slot % 64);
        if *word & bit != 0 {
            return None;
        }
        *word |= bit;
        Some(DbSlot {
            region: self.region.clone(),
            at: SlotRef { page, slot },
        })
    }

    /// Quarantines a free page, as a state handed over has it. False
    /// unless the page is free.
    pub fn claim_quarantined(&mut self, page: u32) -> bool {
        self.claim_free(page, Page::Quarantined)
    }

    /// The quarantined pages, in order.
    pub fn quarantined(&self) -> Vec<u32> {
        (0u32..)
            .zip(&self.used)
            .filter(|(_, p)| **p == Page::Quarantined)
            .map(|(i, _)| i)
            .collect()
    }

    /// Frees a queue's slot.
    pub fn free_slot(&mut self, s: SlotRef) {
        if let Some(Page::InUse(bits)) = self.used.get_mut(s.page as usize) {
            if s.slot < DB_PAGE_SLOTS {
                if let Some(w) = bits.get_mut(s.slot as usize / 64) {
                    *w &= !(1 << (s.slot % 64));
                }
            }
        }
    }

    /// Frees every page in use (device reset or disconnect); quarantined
    /// pages stay quarantined.
    pub fn clear(&mut self) {
        for p in &mut self.used {
            if matches!(p, Page::InUse(_)) {
                *p = Page::Free;
            }
        }
    }

    /// The VMM's connection closed: every page in use is quarantined (a
    /// guest process may still map it) until [`DoorbellPages::end_quarantine`].
    /// Returns how many pages are quarantined now.
    pub fn quarantine_in_use(&mut self) -> usize {
        for p in &mut self.used {
            if matches!(p, Page::InUse(_)) {
                *p = Page::Quarantined;
            }
        }
        self.pages_quarantined()
    }

    /// The driver reset the device, which it does only after every guest
    /// mapping of the pages is gone: quarantined pages are free again.
    /// Returns how many were quarantined.
    pub fn end_quarantine(&mut self) -> usize {
        let n = self.pages_quarantined();
        for p in &mut self.used {
            if *p == Page::Quarantined {
                *p = Page::Free;
            }
        }
        n
    }

    /// Number of pages in use.
    pub fn pages_in_use(&self) -> usize {
        self.used
            .iter()
            .filter(|p| matches!(p, Page::InUse(_)))
            .count()
    }

    /// Number of quarantined pages.
    pub fn pages_quarantined(&self) -> usize {
        self.used
            .iter()
            .filter(|p| **p == Page::Quarantined)
            .count()
    }

    /// Sets the device flags in the header of page `page` (a page just
    /// handed to a new context).
    pub fn set_page_flags(&self, page: u32, flags: u32) {
        self.region.set_flags(page, flags);
    }

    /// Sets the device flags (`DB_FLAG_KICK`, `DB_FLAG_POLLING` or none)
    /// in the header of every page in use.
    pub fn set_flags_all(&self, v: u32) {
        // At most `pages` (a u32) pages: the counter does not run out.
        for (p, i) in self.used.iter().zip(0u32..) {
            if matches!(p, Page::InUse(_)) {
                self.region.set_flags(i, v);
            }
        }
    }
}

/// The link between a device's doorbell region and the VMM: the back-end
/// request channel and whether the VMM currently maps the region.
///
/// QEMU accepts `SHMEM_MAP` only while the device is started and drops the
/// mappings on reset, so the device maps lazily (the first control request
/// after the driver negotiated `F_SHMEM_DOORBELL`) and forgets the mapping
/// on reset and disconnect. `epoch` makes a map that races with a reset
/// count as stale.
pub struct RegionLink {
    /// Replaced only when a hand-over brings the predecessor's region.
    region: Mutex<Arc<DoorbellRegion>>,
    mapped: Arc<AtomicBool>,
    /// The VMM refused a map: do not ask again until the next reset.
    refused: AtomicBool,
    epoch: AtomicU64,
    channel: Mutex<Option<Backend>>,
}

impl std::fmt::Debug for RegionLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionLink")
            .field("region", &self.region())
            .field("mapped", &self.is_mapped())
            .finish_non_exhaustive()
    }
}

impl RegionLink {
    /// A link for `region`; nothing is mapped yet.
    pub fn new(region: Arc<DoorbellRegion>) -> Self {
        RegionLink {
            region: Mutex::new(region),
            mapped: Arc::new(AtomicBool::new(false)),
            refused: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            channel: Mutex::new(None),
        }
    }

    /// The region.
    pub fn region(&self) -> Arc<DoorbellRegion> {
        lock(&self.region).clone()
    }

    /// Allocation state for the device's resources, sharing the mapped flag.
    pub fn pages(&self) -> DoorbellPages {
        DoorbellPages::new(self.region(), self.mapped.clone())
    }

    /// Allocation state over `region` (every page free), sharing the
    /// mapped flag: for a region a predecessor hands over, before
    /// [`RegionLink::install`].
    pub fn pages_over(&self, region: Arc<DoorbellRegion>) -> DoorbellPages {
        DoorbellPages::new(region, self.mapped.clone())
    }

    /// Serves from now on the region a predecessor handed over (spec
    /// 20.7), which the VMM maps into the guest if `mapped`. Only for an
    /// instance that holds no page of its own region.
    pub fn install(&self, region: Arc<DoorbellRegion>, mapped: bool) {
        *lock(&self.region) = region;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.refused.store(false, Ordering::Release);
        self.mapped.store(mapped, Ordering::Release);
    }

    /// The `GET_SHMEM_CONFIG` answer: one region, the doorbell region.
    pub fn shmem_config(&self) -> VhostUserShMemConfig {
        let mut sizes = [0u64; SHMEM_ID_DOORBELL as usize + 1];
        if let Some(s) = sizes.get_mut(usize::from(SHMEM_ID_DOORBELL)) {
            *s = self.region().len();
        }
        // Bounded: the array has SHMEM_ID_DOORBELL + 1 (= 1) entries.
        #[allow(clippy::cast_possible_truncation)]
        let n = sizes.len() as u32;
        VhostUserShMemConfig::new(n, &sizes)
    }

    /// The VMM's back-end request channel (a new connection).
    pub fn set_channel(&self, channel: Option<Backend>) {
        *lock(&self.channel) = channel;
    }

    /// The VMM dropped its mappings (device reset) or went away.
    pub fn forget(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.mapped.store(false, Ordering::Release);
        self.refused.store(false, Ordering::Release);
    }

    /// Zeroes the doorbell region ([`DoorbellRegion::clear`]); for the
    /// device's disconnect and reset handling.
    pub fn clear_region(&self) {
        self.region().clear();
    }

    /// Whether the VMM maps the region.
    pub fn is_mapped(&self) -> bool {
        self.mapped.load(Ordering::Acquire)
    }

    /// Maps the whole region into the guest with one `SHMEM_MAP`, unless it
    /// is mapped already or the VMM refused since the last reset. Returns whether it is mapped afterwards. Must not
    /// be called with the device state locked: the VMM may be waiting for
    /// the back-end while it has our map request queued.
    pub fn ensure_mapped(&self) -> bool {
        if self.is_mapped() {
            return true;
        }
        if self.refused.load(Ordering::Acquire) {
            return false;
        }
        let guard = lock(&self.channel);
        let Some(channel) = guard.as_ref() else {
            return false;
        };
        if self.is_mapped() {
            return true;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let region = self.region();
        let req = VhostUserMMap {
            shmid: SHMEM_ID_DOORBELL,
            fd_offset: 0,
            shm_offset: 0,
            len: region.len(),
            flags: VhostUserMMapFlags::WRITABLE.bits(),
            ..Default::default()
        };
        match channel.shmem_map(&req, &region.fd()) {
            Ok(_) => {
                if self.epoch.load(Ordering::Acquire) == epoch {
                    self.mapped.store(true, Ordering::Release);
                    info!("doorbell region mapped ({} bytes)", region.len());
                }
                self.is_mapped()
            }
            Err(e) => {
                self.refused.store(true, Ordering::Release);
                warn!("VMM refused to map the doorbell region: {e}; using guest-RAM doorbells");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_rdma_abi::datapath::DB_FLAG_KICK;

    #[test]
    fn region_is_a_power_of_two() {
        let r = DoorbellRegion::new(3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 4 * DB_PAGE_SIZE);
        let r = DoorbellRegion::new(64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 64 * DB_PAGE_SIZE);
        assert_eq!(r.pages(), 64);
    }

    /// QEMU 11.1 sends the mapped region back in SET_MEM_TABLE, where
    /// the daemon accepts only files sealed against shrinking.
    #[test]
    fn region_is_sealed_like_guest_ram() {
        let r = DoorbellRegion::new(2).unwrap_or_else(|e| panic!("{e}"));
        let f = std::fs::File::from(
            r.fd()
                .try_clone_to_owned()
                .unwrap_or_else(|e| panic!("{e}")),
        );
        assert!(crate::memory::table::shrink_sealed(&f));
        // SAFETY: F_GET_SEALS on an fd we own.
        let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
        assert_eq!(seals & DOORBELL_SEALS, DOORBELL_SEALS);
        // The size cannot change any more.
        assert!(f.set_len(0).is_err());
        assert!(f.set_len(r.len() * 2).is_err());
    }

    #[test]
    fn clear_zeroes_every_page() {
        let region = Arc::new(DoorbellRegion::new(4).unwrap_or_else(|e| panic!("{e}")));
        let mapped = Arc::new(AtomicBool::new(true));
        let mut p = DoorbellPages::new(region.clone(), mapped);
        let page = p.alloc_page().unwrap_or_else(|| panic!("no page"));
        let slot = p.alloc_slot(page).unwrap_or_else(|| panic!("no slot"));
        // The previous connection's driver left producer indices and flags.
        region.store(slot.at(), 0, 17);
        region.store(slot.at(), 1, 23);
        p.set_page_flags(page, DB_FLAG_KICK);
        let last = SlotRef {
            page: region.pages() - 1,
            slot: DB_PAGE_SLOTS - 1,
        };
        region.store(last, 1, 5);
        region.clear();
        assert_eq!(region.load(slot.at(), 0), 0);
        assert_eq!(region.load(slot.at(), 1), 0);
        assert_eq!(region.flags(page), 0);
        assert_eq!(region.load(last, 1), 0);
        // Every byte of the mapping, not only the slots handed out.
        let words = region.len() / 4;
        assert!((0..words).all(|i| region
            .word(i * 4)
            .is_some_and(|w| w.load(Ordering::Relaxed) == 0)));
    }

    #[test]
    fn pages_and_slots() {
        let region = Arc::new(DoorbellRegion::new(2).unwrap_or_else(|e| panic!("{e}")));
        let mapped = Arc::new(AtomicBool::new(false));
        let mut p = DoorbellPages::new(region.clone(), mapped.clone());
        assert_eq!(p.alloc_page(), None, "not mapped: no pages");
        mapped.store(true, Ordering::Release);
        assert_eq!(p.alloc_page(), Some(0));
        assert_eq!(p.alloc_page(), Some(1));
        assert_eq!(p.alloc_page(), None, "all pages taken");
        let mut slots = Vec::new();
        while let Some(s) = p.alloc_slot(1) {
            slots.push(s.at());
        }
        assert_eq!(slots.len(), DB_PAGE_SLOTS as usize);
        // A slot is zeroed when it is handed out again.
        region.store(slots[7], 0, 99);
        p.free_slot(slots[7]);
        let again = p.alloc_slot(1).map(|s| s.at());
        assert_eq!(again, Some(slots[7]));
        assert_eq!(region.load(slots[7], 0), 0);
        p.set_flags_all(DB_FLAG_KICK);
        assert_eq!(region.flags(0), DB_FLAG_KICK);
        p.free_page(0);
        p.set_flags_all(0);
        assert_eq!(region.flags(0), DB_FLAG_KICK, "free pages are left alone");
        assert_eq!(region.flags(1), 0);
        assert!(p.alloc_slot(0).is_none(), "free page has no slots");
        // A reused page comes back zeroed.
        assert_eq!(p.alloc_page(), Some(0));
        assert_eq!(region.flags(0), 0);
        p.clear();
        assert_eq!(p.pages_in_use(), 0);
    }

    #[test]
    fn quarantined_pages_wait_for_the_reset() {
        let region = Arc::new(DoorbellRegion::new(4).unwrap_or_else(|e| panic!("{e}")));
        let mapped = Arc::new(AtomicBool::new(true));
        let mut p = DoorbellPages::new(region, mapped);
        assert_eq!((p.alloc_page(), p.alloc_page()), (Some(0), Some(1)));
        // A disconnect: both pages quarantined, then everything freed.
        assert_eq!(p.quarantine_in_use(), 2);
        p.clear();
        assert_eq!((p.pages_in_use(), p.pages_quarantined()), (0, 2));
        assert!(p.alloc_slot(0).is_none(), "a quarantined page has no slots");
        p.free_page(1);
        assert_eq!(p.pages_quarantined(), 2, "freeing does not release it");
        // The next connection gets the other pages only.
        assert_eq!((p.alloc_page(), p.alloc_page()), (Some(2), Some(3)));
        assert_eq!(p.alloc_page(), None);
        // A second disconnect adds to the quarantine.
        assert_eq!(p.quarantine_in_use(), 4);
        p.clear();
        assert_eq!(p.alloc_page(), None);
        // A reset ends it.
        assert_eq!(p.end_quarantine(), 4);
        assert_eq!(p.pages_quarantined(), 0);
        let mut got: Vec<u32> = std::iter::from_fn(|| p.alloc_page()).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
    }

    #[test]
    fn an_adopted_region_keeps_its_contents_and_claims_are_exclusive() {
        let old = DoorbellRegion::new(4).unwrap_or_else(|e| panic!("{e}"));
        let at = SlotRef { page: 2, slot: 9 };
        old.store(at, 1, 0x1234);
        let dup = old
            .fd()
            .try_clone_to_owned()
            .unwrap_or_else(|e| panic!("{e}"));
        let region = Arc::new(DoorbellRegion::adopt(dup, 4).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(region.load(at, 1), 0x1234, "the same memory");
        let mut p = DoorbellPages::new(region, Arc::new(AtomicBool::new(true)));
        assert!(p.claim_page(2) && !p.claim_page(2));
        let slot = p.claim_slot(2, 9).unwrap_or_else(|| panic!("slot 9"));
        assert_eq!(slot.load(1), 0x1234, "a claimed slot is not zeroed");
        assert!(p.claim_slot(2, 9).is_none(), "claimed twice");
        assert!(p.claim_slot(2, DB_PAGE_SLOTS).is_none(), "past the page");
        assert!(p.claim_slot(1, 0).is_none(), "a page not claimed");
        assert!(p.claim_quarantined(3) && !p.claim_quarantined(2));
        assert_eq!(p.quarantined(), [3]);
        // Allocation goes on around the claims.
        assert_eq!(p.alloc_page(), Some(0));
        assert_eq!(p.alloc_slot(2).map(|s| s.at().slot), Some(0));
        // Another size (more contexts here) or an unsealed file is refused.
        let dup = old
            .fd()
            .try_clone_to_owned()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            DoorbellRegion::adopt(dup, 100),
            Err(ShmemError::Foreign(_))
        ));
        // SAFETY: creates a descriptor; the name is NUL-terminated.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(matches!(
            DoorbellRegion::adopt(plain, 4),
            Err(ShmemError::Foreign(_))
        ));
    }
}
