//! Driver side of a split virtqueue (virtio 1.x, section 2.7) living in the
//! test VM's guest RAM.
//!
//! The descriptor table, available ring and used ring are each placed in
//! their own page-aligned allocation. Chains are added with [`Vring::add_chain`]
//! (well-formed) or [`Vring::add_raw`] (anything, for hostile tests), published
//! with a Release store of `avail.idx`, and completions are harvested after an
//! Acquire load of `used.idx`. Descriptor slots are recycled through a free
//! list, so many chains can be in flight at once.

use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vhost::vhost_user::message::VhostUserVringAddrFlags;
use vhost::VringConfigData;
use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    VRING_USED_F_NO_NOTIFY,
};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::error::{Error, Result};
use crate::guest_mem::{GuestMem, PAGE_SIZE};

/// Size of one descriptor in the descriptor table.
pub const DESC_SIZE: u64 = 16;
/// Descriptor flag: the chain continues at `next`.
pub const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
/// Descriptor flag: device-writable buffer.
pub const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
/// Largest queue size of a split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// One buffer of a well-formed chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Guest-physical address.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable (`VRING_DESC_F_WRITE`).
    pub writable: bool,
}

impl Seg {
    /// A device-readable buffer.
    pub fn readable(gpa: GuestAddress, len: u32) -> Self {
        Seg {
            gpa: gpa.0,
            len,
            writable: false,
        }
    }

    /// A device-writable buffer.
    pub fn writable(gpa: GuestAddress, len: u32) -> Self {
        Seg {
            gpa: gpa.0,
            len,
            writable: true,
        }
    }
}

/// Where the `next` field of a raw descriptor points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawNext {
    /// The slot of the following descriptor in the same list (0 for the last).
    Following,
    /// The slot of the descriptor at this index of the same list (a loop when
    /// it points back); an index past the list's end gives slot 0.
    ListIndex(usize),
    /// This absolute descriptor-table slot, allocated or not, in range or not.
    Slot(u16),
}

/// One descriptor written exactly as given (flags included): the `NEXT`
/// flag is NOT added automatically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDesc {
    /// `addr` field.
    pub addr: u64,
    /// `len` field.
    pub len: u32,
    /// `flags` field, written verbatim.
    pub flags: u16,
    /// `next` field.
    pub next: RawNext,
}

impl RawDesc {
    /// Raw descriptors forming the well-formed chain of `segs` (NEXT set on
    /// all but the last), to be modified by a hostile test.
    pub fn chain(segs: &[Seg]) -> Vec<RawDesc> {
        segs.iter()
            .enumerate()
            .map(|(i, s)| RawDesc {
                addr: s.gpa,
                len: s.len,
                flags: if s.writable { F_WRITE } else { 0 }
                    | if i + 1 < segs.len() { F_NEXT } else { 0 },
                next: RawNext::Following,
            })
            .collect()
    }
}

/// Encodes one descriptor (for building indirect tables by hand).
pub fn encode_desc(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..14].copy_from_slice(&flags.to_le_bytes());
    b[14..16].copy_from_slice(&next.to_le_bytes());
    b
}

/// One element taken from the used ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index as written by the device.
    pub id: u32,
    /// Bytes the device says it wrote.
    pub len: u32,
    /// The id named a chain this driver had in flight (its descriptors are
    /// now free again). False for ids the device should not have returned,
    /// or heads published with [`Vring::push_avail_raw`].
    pub tracked: bool,
}

/// Counters of a virtqueue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VringStats {
    /// Chains published.
    pub published: u64,
    /// Kicks sent (eventfd writes).
    pub kicks: u64,
    /// Notifications skipped because the device suppressed them.
    pub kicks_suppressed: u64,
    /// Used elements harvested.
    pub used: u64,
    /// Call eventfd wakeups consumed.
    pub calls: u64,
}

/// A [`Vring`] as a VM that moves takes it along ([`Vring::image`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VringImage {
    /// Queue index.
    pub index: u16,
    /// Number of entries.
    pub size: u16,
    /// Guest-physical addresses of the descriptor table, the available
    /// ring and the used ring.
    pub rings: [u64; 3],
    /// Free descriptor slots.
    pub free: Vec<u16>,
    /// For each head slot in flight, the slots of its chain.
    pub chains: Vec<Option<Vec<u16>>>,
    /// Free-running avail index.
    pub next_avail: u16,
    /// Avail index at the last notification decision.
    pub last_kick_avail: u16,
    /// Free-running used index.
    pub last_used: u16,
    /// Whether `VIRTIO_F_EVENT_IDX` is in use.
    pub event_idx: bool,
}

/// Driver side of one split virtqueue.
#[derive(Debug)]
pub struct Vring {
    mem: Arc<GuestMem>,
    index: u16,
    size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    kick: EventFd,
    call: EventFd,
    /// Free descriptor slots (a stack).
    free: Vec<u16>,
    /// For each head slot in flight, the slots of its chain.
    chains: Vec<Option<Vec<u16>>>,
    /// Free-running avail index (next entry to write).
    next_avail: u16,
    /// Avail index at the last notification decision.
    last_kick_avail: u16,
    /// Free-running used index (next entry to read).
    last_used: u16,
    event_idx: bool,
    stats: VringStats,
}

fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Vring {
    /// Allocates the rings of queue `index` with `size` entries (a power of
    /// two, at most 32768) in `mem`, zeroed, and creates its kick and call
    /// eventfds (non-blocking).
    pub fn new(mem: Arc<GuestMem>, index: u16, size: u16) -> Result<Self> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(Error::BadChain {
                queue: index,
                reason: format!("queue size {size} is not a power of two <= 32768"),
            });
        }
        let n = u64::from(size);
        let desc_len = DESC_SIZE * n;
        let avail_len = 6 + 2 * n;
        let used_len = 6 + 8 * n;
        let desc = mem.alloc(desc_len, PAGE_SIZE)?;
        let avail = mem.alloc(avail_len, PAGE_SIZE)?;
        let used = mem.alloc(used_len, PAGE_SIZE)?;
        for (gpa, len) in [(desc, desc_len), (avail, avail_len), (used, used_len)] {
            mem.fill(gpa, len as usize, 0)?;
        }
        Self::over(mem, index, size, [desc, avail, used])
    }

    /// The queue of `size` entries (checked by the caller) whose rings are
    /// at `rings` (descriptor table, available ring, used ring), with new
    /// eventfds and nothing in flight.
    fn over(mem: Arc<GuestMem>, index: u16, size: u16, rings: [GuestAddress; 3]) -> Result<Self> {
        let kick = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::io("eventfd (kick)", e))?;
        let call = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::io("eventfd (call)", e))?;
        let [desc, avail, used] = rings;
        Ok(Vring {
            mem,
            index,
            size,
            desc,
            avail,
            used,
            kick,
            call,
            free: (0..size).rev().collect(),
            chains: vec![None; usize::from(size)],
            next_avail: 0,
            last_kick_avail: 0,
            last_used: 0,
            event_idx: false,
            stats: VringStats::default(),
        })
    }

    /// The queue's image (for a VM that moves to another host with its
    /// RAM, [`crate::vm_image`]): where its rings are and how far the
    /// driver got.
    pub fn image(&self) -> VringImage {
        VringImage {
            index: self.index,
            size: self.size,
            rings: [self.desc.0, self.avail.0, self.used.0],
            free: self.free.clone(),
            chains: self.chains.clone(),
            next_avail: self.next_avail,
            last_kick_avail: self.last_kick_avail,
            last_used: self.last_used,
            event_idx: self.event_idx,
        }
    }

    /// The queue of `image` over `mem` (its rings as the RAM holds them),
    /// with new eventfds.
    pub fn restore(mem: Arc<GuestMem>, image: &VringImage) -> Result<Self> {
        let bad = |reason: String| Error::BadChain {
            queue: image.index,
            reason,
        };
        let size = image.size;
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(bad(format!("an image of queue size {size}")));
        }
        if image.chains.len() != usize::from(size) || image.free.iter().any(|&d| d >= size) {
            return Err(bad("an image whose chains do not fit the queue".into()));
        }
        let mut v = Self::over(mem, image.index, size, image.rings.map(GuestAddress))?;
        v.free.clone_from(&image.free);
        v.chains.clone_from(&image.chains);
        v.next_avail = image.next_avail;
        v.last_kick_avail = image.last_kick_avail;
        v.last_used = image.last_used;
        v.event_idx = image.event_idx;
        Ok(v)
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest memory the rings live in.
    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    /// Guest-physical address of the descriptor table.
    pub fn desc_table(&self) -> GuestAddress {
        self.desc
    }

    /// Guest-physical address of the available ring.
    pub fn avail_ring(&self) -> GuestAddress {
        self.avail
    }

    /// Guest-physical address of the used ring.
    pub fn used_ring(&self) -> GuestAddress {
        self.used
    }

    /// Uses the eventfds of `other` (duplicates) instead of its own: a VMM
    /// that restarts a queue keeps its notifier and interrupt, so whoever
    /// holds them keeps working.
    pub fn share_fds(&mut self, other: &Vring) -> Result<()> {
        self.kick = other
            .kick
            .try_clone()
            .map_err(|e| Error::io("eventfd (kick)", e))?;
        self.call = other
            .call
            .try_clone()
            .map_err(|e| Error::io("eventfd (call)", e))?;
        Ok(())
    }

    /// The eventfd the driver writes to notify the device.
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The eventfd the device writes to interrupt the driver.
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// Whether `VIRTIO_RING_F_EVENT_IDX` is in use.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// Turns `VIRTIO_RING_F_EVENT_IDX` handling on or off (must match the
    /// negotiated features).
    pub fn set_event_idx(&mut self, on: bool) {
        self.event_idx = on;
    }

    /// Free descriptor slots.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Chains published and not yet returned.
    pub fn in_flight(&self) -> usize {
        self.chains.iter().filter(|c| c.is_some()).count()
    }

    /// Counters.
    pub fn stats(&self) -> VringStats {
        self.stats
    }

    /// The free-running avail index (entries published so far).
    pub fn avail_idx(&self) -> u16 {
        self.next_avail
    }

    /// The free-running used index consumed so far.
    pub fn last_used_idx(&self) -> u16 {
        self.last_used
    }

    /// The `SET_VRING_ADDR` payload: ring addresses as this process's
    /// virtual addresses (vhost-user translates them back).
    pub fn config_data(&self) -> Result<VringConfigData> {
        Ok(VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: VhostUserVringAddrFlags::empty().bits(),
            desc_table_addr: self.mem.host_address(self.desc)?,
            used_ring_addr: self.mem.host_address(self.used)?,
            avail_ring_addr: self.mem.host_address(self.avail)?,
            log_addr: None,
        })
    }

    fn gpa(base: GuestAddress, off: u64) -> GuestAddress {
        GuestAddress(base.0 + off)
    }

    /// Writes descriptor-table slot `slot` (any slot, in flight or not:
    /// for tests that change a descriptor after publishing it).
    pub fn write_desc(&self, slot: u16, addr: u64, len: u32, flags: u16, next: u16) -> Result<()> {
        if slot >= self.size {
            return Err(self.bad_chain(format!("slot {slot} outside the table")));
        }
        self.mem.write(
            Self::gpa(self.desc, u64::from(slot) * DESC_SIZE),
            &encode_desc(addr, len, flags, next),
        )
    }

    fn bad_chain(&self, reason: String) -> Error {
        Error::BadChain {
            queue: self.index,
            reason,
        }
    }

    fn take_slots(&mut self, n: usize) -> Result<Vec<u16>> {
        if n == 0 {
            return Err(self.bad_chain("empty chain".into()));
        }
        if n > self.free.len() {
            return Err(Error::QueueFull {
                queue: self.index,
                need: n,
                free: self.free.len(),
            });
        }
        let at = self.free.len() - n;
        let mut slots = self.free.split_off(at);
        slots.reverse();
        Ok(slots)
    }

    /// Adds a well-formed chain and publishes it (no notification: call
    /// [`Vring::notify`]). Returns the head slot, which the device returns as
    /// the used element's id.
    pub fn add_chain(&mut self, segs: &[Seg]) -> Result<u16> {
        self.add_raw(&RawDesc::chain(segs))
    }

    /// Adds descriptors exactly as described (flags verbatim, `next` resolved
    /// as [`RawNext`] says) in freshly allocated slots and publishes the
    /// first one as a chain head. The slots are freed when the device returns
    /// that head.
    pub fn add_raw(&mut self, descs: &[RawDesc]) -> Result<u16> {
        let slots = self.take_slots(descs.len())?;
        for (i, d) in descs.iter().enumerate() {
            let next = match d.next {
                RawNext::Following => slots.get(i + 1).copied().unwrap_or(0),
                RawNext::ListIndex(j) => slots.get(j).copied().unwrap_or(0),
                RawNext::Slot(s) => s,
            };
            if let Err(e) = self.write_desc(slots[i], d.addr, d.len, d.flags, next) {
                self.free.extend(slots.iter().rev());
                return Err(e);
            }
        }
        let head = slots[0];
        self.chains[usize::from(head)] = Some(slots);
        self.publish(head)?;
        Ok(head)
    }

    /// Publishes `head` in the available ring without allocating or tracking
    /// anything (hostile tests: a head out of range, a slot never written, the
    /// same head twice). Nothing stops the caller from overflowing the ring.
    pub fn push_avail_raw(&mut self, head: u16) -> Result<()> {
        self.publish(head)
    }

    fn publish(&mut self, head: u16) -> Result<()> {
        let pos = u64::from(self.next_avail % self.size);
        self.mem
            .write(Self::gpa(self.avail, 4 + 2 * pos), &head.to_le_bytes())?;
        self.next_avail = self.next_avail.wrapping_add(1);
        // The ring entry and the descriptors must be visible before the index.
        self.mem
            .store(Self::gpa(self.avail, 2), self.next_avail, Ordering::Release)?;
        self.stats.published += 1;
        Ok(())
    }

    /// Notifies the device if it asked to be (used-ring `NO_NOTIFY` flag, or
    /// `avail_event` with EVENT_IDX). Returns whether a kick was sent.
    pub fn notify(&mut self) -> Result<bool> {
        // The avail idx store must be ordered before reading the device's
        // suppression state (virtio's "full memory barrier" here).
        fence(Ordering::SeqCst);
        let need = if self.event_idx {
            let pos = 4 + 8 * u64::from(self.size);
            let avail_event: u16 = self
                .mem
                .load(Self::gpa(self.used, pos), Ordering::Acquire)?;
            vring_need_event(avail_event, self.next_avail, self.last_kick_avail)
        } else {
            let flags: u16 = self.mem.load(self.used, Ordering::Acquire)?;
            flags & (VRING_USED_F_NO_NOTIFY as u16) == 0
        };
        self.last_kick_avail = self.next_avail;
        if need {
            self.kick()?;
        } else {
            self.stats.kicks_suppressed += 1;
        }
        Ok(need)
    }

    /// Writes the kick eventfd unconditionally.
    pub fn kick(&mut self) -> Result<()> {
        self.kick.write(1).map_err(|e| Error::io("kick", e))?;
        self.stats.kicks += 1;
        Ok(())
    }

    /// The device's current used index (Acquire).
    pub fn device_used_idx(&self) -> Result<u16> {
        self.mem.load(Self::gpa(self.used, 2), Ordering::Acquire)
    }

    /// The `avail_event` the device last wrote after the used ring's
    /// elements (`VIRTIO_RING_F_EVENT_IDX`; Acquire).
    pub fn device_avail_event(&self) -> Result<u16> {
        let at = 4 + 8 * u64::from(self.size);
        self.mem.load(Self::gpa(self.used, at), Ordering::Acquire)
    }

    /// Whether the used ring holds elements not yet harvested.
    pub fn has_used(&self) -> Result<bool> {
        Ok(self.device_used_idx()? != self.last_used)
    }

    /// Takes every new element from the used ring, freeing the descriptors of
    /// the chains they complete.
    pub fn harvest(&mut self) -> Result<Vec<UsedElem>> {
        let used_idx = self.device_used_idx()?;
        let n = used_idx.wrapping_sub(self.last_used);
        if n > self.size {
            return Err(Error::DeviceBug {
                queue: self.index,
                reason: format!(
                    "used idx jumped from {} to {used_idx} (queue size {})",
                    self.last_used, self.size
                ),
            });
        }
        let mut out = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let pos = u64::from(self.last_used % self.size);
            let mut b = [0u8; 8];
            self.mem.read(Self::gpa(self.used, 4 + 8 * pos), &mut b)?;
            let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let tracked = match usize::try_from(id)
                .ok()
                .and_then(|i| self.chains.get_mut(i))
            {
                Some(slot) => match slot.take() {
                    Some(slots) => {
                        self.free.extend(slots.iter().rev());
                        true
                    }
                    None => false,
                },
                None => false,
            };
            out.push(UsedElem { id, len, tracked });
            self.last_used = self.last_used.wrapping_add(1);
        }
        self.stats.used += u64::from(n);
        Ok(out)
    }

    /// Asks the device to interrupt on the next used element (EVENT_IDX:
    /// `used_event` = the next index we will read; otherwise clears
    /// `NO_INTERRUPT`). Returns true when used elements arrived meanwhile, in
    /// which case the caller should harvest instead of sleeping.
    pub fn enable_interrupts(&mut self) -> Result<bool> {
        if self.event_idx {
            let pos = 4 + 2 * u64::from(self.size);
            self.mem.store(
                Self::gpa(self.avail, pos),
                self.last_used,
                Ordering::Release,
            )?;
        } else {
            self.mem.store(self.avail, 0u16, Ordering::Release)?;
        }
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Asks the device not to interrupt (for polling drivers). Best effort,
    /// as in virtio: with EVENT_IDX the device may still interrupt once.
    pub fn disable_interrupts(&mut self) -> Result<()> {
        if self.event_idx {
            let pos = 4 + 2 * u64::from(self.size);
            self.mem.store(
                Self::gpa(self.avail, pos),
                self.last_used.wrapping_sub(1),
                Ordering::Release,
            )
        } else {
            self.mem.store(
                self.avail,
                VRING_AVAIL_F_NO_INTERRUPT as u16,
                Ordering::Release,
            )
        }
    }

    /// Waits up to `timeout` for the call eventfd and consumes it. Returns
    /// false on timeout.
    pub fn wait_call(&mut self, timeout: Duration) -> Result<bool> {
        if poll_readable(self.call.as_raw_fd(), timeout)? {
            match self.call.read() {
                Ok(_) => {
                    self.stats.calls += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(Error::io("read call eventfd", e)),
            }
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Harvests used elements, sleeping on the call eventfd until at least
    /// one arrives or `timeout` passes (then returns an empty vector).
    pub fn wait_used(&mut self, timeout: Duration) -> Result<Vec<UsedElem>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.harvest()?;
            if !got.is_empty() {
                return Ok(got);
            }
            if self.enable_interrupts()? {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            self.wait_call(left)?;
        }
    }
}

impl Drop for Vring {
    /// Returns the ring memory to the allocator (the device must no longer
    /// use it: after `GET_VRING_BASE`, or with the connection gone).
    fn drop(&mut self) {
        for gpa in [self.desc, self.avail, self.used] {
            let _ = self.mem.free(gpa);
        }
    }
}

/// `poll(2)` for `POLLIN` on `fd`, retrying on EINTR until `timeout`.
pub fn poll_readable(fd: i32, timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis().saturating_add(1)).unwrap_or(i32::MAX);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd array of length 1 that outlives the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("poll", e));
        }
        if r > 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_mem::MemLayout;

    /// Plays the device: returns every published head with `len`.
    fn device_complete_all(v: &Vring, len: u32, dev_used: &mut u16, dev_avail: &mut u16) {
        let mem = v.mem();
        let avail_idx: u16 = mem
            .load(GuestAddress(v.avail_ring().0 + 2), Ordering::Acquire)
            .unwrap();
        while *dev_avail != avail_idx {
            let pos = u64::from(*dev_avail % v.size());
            let head = u16::from_le_bytes(
                mem.read_vec(GuestAddress(v.avail_ring().0 + 4 + 2 * pos), 2)
                    .unwrap()
                    .try_into()
                    .unwrap(),
            );
            let upos = u64::from(*dev_used % v.size());
            let mut e = [0u8; 8];
            e[..4].copy_from_slice(&u32::from(head).to_le_bytes());
            e[4..].copy_from_slice(&len.to_le_bytes());
            mem.write(GuestAddress(v.used_ring().0 + 4 + 8 * upos), &e)
                .unwrap();
            *dev_used = dev_used.wrapping_add(1);
            *dev_avail = dev_avail.wrapping_add(1);
        }
        mem.store(
            GuestAddress(v.used_ring().0 + 2),
            *dev_used,
            Ordering::Release,
        )
        .unwrap();
    }

    #[test]
    fn chains_recycle_descriptors_across_wraparound() {
        let mem = Arc::new(GuestMem::new(&MemLayout::single(4 << 20)).unwrap());
        let mut v = Vring::new(mem.clone(), 0, 8).unwrap();
        let buf = mem.alloc(4096, 0).unwrap();
        let (mut du, mut da) = (0u16, 0u16);
        for round in 0..100_000u32 {
            let h1 = v
                .add_chain(&[Seg::readable(buf, 16), Seg::writable(buf, 16)])
                .unwrap();
            let h2 = v.add_chain(&[Seg::writable(buf, 1)]).unwrap();
            assert_ne!(h1, h2);
            assert_eq!(v.free_descriptors(), 5);
            device_complete_all(&v, round, &mut du, &mut da);
            let used = v.harvest().unwrap();
            assert_eq!(used.len(), 2);
            assert!(used.iter().all(|u| u.tracked && u.len == round));
            assert_eq!(v.free_descriptors(), 8);
        }
        assert!(v.add_chain(&[Seg::readable(buf, 1); 9]).is_err());
        assert!(v.add_chain(&[]).is_err());
    }

    #[test]
    fn raw_chain_loop_and_untracked_head() {
        let mem = Arc::new(GuestMem::new(&MemLayout::single(4 << 20)).unwrap());
        let mut v = Vring::new(mem.clone(), 0, 16).unwrap();
        let head = v
            .add_raw(&[RawDesc {
                addr: 0x1000,
                len: 16,
                flags: F_NEXT,
                next: RawNext::ListIndex(0),
            }])
            .unwrap();
        let raw = mem
            .read_vec(GuestAddress(v.desc_table().0 + u64::from(head) * 16), 16)
            .unwrap();
        assert_eq!(raw, encode_desc(0x1000, 16, F_NEXT, head));
        v.push_avail_raw(999).unwrap();
        let (mut du, mut da) = (0u16, 0u16);
        device_complete_all(&v, 0, &mut du, &mut da);
        let used = v.harvest().unwrap();
        assert_eq!(used.len(), 2);
        assert!(used[0].tracked);
        assert_eq!(used[1].id, 999);
        assert!(!used[1].tracked);
    }

    #[test]
    fn event_idx_suppresses_kicks() {
        let mem = Arc::new(GuestMem::new(&MemLayout::single(4 << 20)).unwrap());
        let mut v = Vring::new(mem.clone(), 0, 16).unwrap();
        v.set_event_idx(true);
        let buf = mem.alloc(4096, 0).unwrap();
        // avail_event = 0: the device wants a kick when entry 0 is published.
        v.add_chain(&[Seg::writable(buf, 8)]).unwrap();
        assert!(v.notify().unwrap());
        v.add_chain(&[Seg::writable(buf, 8)]).unwrap();
        assert!(!v.notify().unwrap());
        assert_eq!(v.stats().kicks, 1);
        assert_eq!(v.stats().kicks_suppressed, 1);
        // No event on the call fd yet.
        assert!(!v.wait_call(Duration::from_millis(1)).unwrap());
        v.call_fd().write(1).unwrap();
        assert!(v.wait_call(Duration::from_millis(100)).unwrap());
    }

    #[test]
    fn need_event_matches_virtio() {
        assert!(vring_need_event(0, 1, 0));
        assert!(!vring_need_event(5, 3, 2));
        assert!(vring_need_event(65535, 0, 65535));
    }
}
