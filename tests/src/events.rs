//! Event-queue client: keeps device-writable event buffers posted and turns
//! the ones the device fills into [`Event`]s.
//!
//! Each buffer is reposted as soon as it has been read (unless auto-repost
//! is turned off), so the device always has buffers while the test keeps
//! consuming events.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use crate::error::{Error, Result};
use crate::guest_mem::PAGE_SIZE;
use crate::vring::{Seg, UsedElem, Vring, VringImage};

/// Size of an event buffer the client posts by default.
pub const EVENT_BUF_SIZE: u32 = Event::SIZE as u32;

/// Counters of the event queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventStats {
    /// Events received.
    pub events: u64,
    /// Buffers returned with a used length below 16 (no event).
    pub short: u64,
    /// Used elements that matched no posted buffer.
    pub untracked: u64,
}

/// An [`EventQueue`] as a VM that moves takes it along.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsImage {
    /// The queue.
    pub vring: VringImage,
    /// Whether filled buffers are posted again.
    pub auto_repost: bool,
    /// The buffers posted: head slot, guest-physical address, length.
    pub posted: Vec<(u16, u64, u32)>,
    /// Free buffer slots.
    pub spare: Vec<u64>,
    /// Pages allocated for buffers.
    pub pages: Vec<u64>,
}

/// Event-queue client.
#[derive(Debug)]
pub struct EventQueue {
    vring: Vring,
    timeout: Duration,
    auto_repost: bool,
    /// Head slot -> (buffer, its length).
    posted: HashMap<u16, (GuestAddress, u32)>,
    /// Free event-buffer slots carved from pages.
    spare: Vec<GuestAddress>,
    /// Pages allocated for event buffers.
    pages: Vec<GuestAddress>,
    ready: VecDeque<Event>,
    stats: EventStats,
    /// Used elements the device returned that matched no posted buffer.
    untracked: Vec<UsedElem>,
}

impl EventQueue {
    /// A client over `vring` (the event queue); nothing is posted yet.
    pub fn new(vring: Vring, timeout: Duration) -> Self {
        EventQueue {
            vring,
            timeout,
            auto_repost: true,
            posted: HashMap::new(),
            spare: Vec::new(),
            pages: Vec::new(),
            ready: VecDeque::new(),
            stats: EventStats::default(),
            untracked: Vec::new(),
        }
    }

    /// The client's image ([`crate::vm_image`]); none while events were
    /// taken from the queue and not handed out yet.
    pub fn image(&self) -> Result<EventsImage> {
        if !self.ready.is_empty() {
            return Err(Error::Backend(format!(
                "an image of an event queue with {} events not taken",
                self.ready.len()
            )));
        }
        let mut posted: Vec<(u16, u64, u32)> = self
            .posted
            .iter()
            .map(|(&h, &(g, l))| (h, g.0, l))
            .collect();
        posted.sort_unstable();
        Ok(EventsImage {
            vring: self.vring.image(),
            auto_repost: self.auto_repost,
            posted,
            spare: self.spare.iter().map(|g| g.0).collect(),
            pages: self.pages.iter().map(|g| g.0).collect(),
        })
    }

    /// The client of `image` over `vring` (restored from the image's).
    pub fn restore(vring: Vring, image: &EventsImage, timeout: Duration) -> Self {
        let mut q = EventQueue::new(vring, timeout);
        q.auto_repost = image.auto_repost;
        q.posted = image
            .posted
            .iter()
            .map(|&(h, g, l)| (h, (GuestAddress(g), l)))
            .collect();
        q.spare = image.spare.iter().copied().map(GuestAddress).collect();
        q.pages = image.pages.iter().copied().map(GuestAddress).collect();
        q
    }

    /// The underlying virtqueue (raw access).
    pub fn vring_mut(&mut self) -> &mut Vring {
        &mut self.vring
    }

    /// The underlying virtqueue.
    pub fn vring(&self) -> &Vring {
        &self.vring
    }

    /// The pages of the event buffers (posted or spare).
    pub fn buffer_pages(&self) -> Vec<GuestAddress> {
        self.pages.clone()
    }

    /// Whether consumed buffers are reposted automatically (default true).
    pub fn set_auto_repost(&mut self, on: bool) {
        self.auto_repost = on;
    }

    /// Default timeout of [`EventQueue::wait_event`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Buffers currently posted to the device.
    pub fn posted(&self) -> usize {
        self.posted.len()
    }

    /// Counters.
    pub fn stats(&self) -> EventStats {
        self.stats
    }

    /// Used elements that matched no posted buffer.
    pub fn untracked(&self) -> &[UsedElem] {
        &self.untracked
    }

    fn buffer(&mut self) -> Result<GuestAddress> {
        if let Some(b) = self.spare.pop() {
            return Ok(b);
        }
        let page = self.vring.mem().alloc(PAGE_SIZE, PAGE_SIZE)?;
        self.pages.push(page);
        let per_page = PAGE_SIZE / u64::from(EVENT_BUF_SIZE);
        self.spare.extend(
            (1..per_page)
                .rev()
                .map(|i| GuestAddress(page.0 + i * u64::from(EVENT_BUF_SIZE))),
        );
        Ok(page)
    }

    fn post_one(&mut self, gpa: GuestAddress, len: u32) -> Result<()> {
        let head = self.vring.add_chain(&[Seg::writable(gpa, len)])?;
        self.posted.insert(head, (gpa, len));
        Ok(())
    }

    /// Posts `n` more 16-byte buffers and notifies the device.
    pub fn post_buffers(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            let b = self.buffer()?;
            self.post_one(b, EVENT_BUF_SIZE)?;
        }
        self.vring.notify()?;
        Ok(())
    }

    /// Posts one buffer of `len` bytes (at most 16; a shorter one is a
    /// hostile test: the device must return it with used length 0) and
    /// notifies the device.
    pub fn post_buffer_with_len(&mut self, len: u32) -> Result<()> {
        let b = self.buffer()?;
        self.post_one(b, len.min(EVENT_BUF_SIZE))?;
        self.vring.notify()?;
        Ok(())
    }

    /// Moves every filled buffer into the ready list (reposting buffers when
    /// auto-repost is on). Returns how many used elements were taken.
    fn process_used(&mut self) -> Result<usize> {
        let used = self.vring.harvest()?;
        let n = used.len();
        // Repost only after every element has been matched: a reposted
        // buffer may reuse the head slot of an element not processed yet.
        let mut repost = Vec::new();
        for u in used {
            let Some((gpa, len)) = u16::try_from(u.id)
                .ok()
                .filter(|_| u.tracked)
                .and_then(|h| self.posted.remove(&h))
            else {
                self.untracked.push(u);
                self.stats.untracked += 1;
                continue;
            };
            if u.len as usize >= Event::SIZE && len as usize >= Event::SIZE {
                let raw = self.vring.mem().read_vec(gpa, Event::SIZE)?;
                self.ready.push_back(Event::read(&raw));
                self.stats.events += 1;
            } else {
                self.stats.short += 1;
            }
            if self.auto_repost {
                repost.push((gpa, len));
            } else {
                self.spare.push(gpa);
            }
        }
        for &(gpa, len) in &repost {
            self.post_one(gpa, len)?;
        }
        if !repost.is_empty() {
            self.vring.notify()?;
        }
        Ok(n)
    }

    /// The next event if one is available now.
    pub fn try_next_event(&mut self) -> Result<Option<Event>> {
        if self.ready.is_empty() {
            self.process_used()?;
        }
        Ok(self.ready.pop_front())
    }

    /// The next event, waiting up to `timeout`; None on timeout.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_next_event()? {
                return Ok(Some(e));
            }
            if self.vring.enable_interrupts()? {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.vring.wait_call(left)?;
        }
    }

    /// The next event within the default timeout; None on timeout.
    pub fn wait_event(&mut self) -> Result<Option<Event>> {
        self.next_event(self.timeout)
    }

    /// Every event available now.
    pub fn drain(&mut self) -> Result<Vec<Event>> {
        self.process_used()?;
        Ok(self.ready.drain(..).collect())
    }

    /// Parses a raw 16-byte event buffer (for tests reading buffers by hand).
    pub fn parse(raw: &[u8]) -> Result<Event> {
        Ok(Event::parse(raw)?)
    }
}

impl Drop for EventQueue {
    /// Returns the event buffer pages to the guest memory allocator.
    fn drop(&mut self) {
        for gpa in self.pages.drain(..) {
            let _ = self.vring.mem().free(gpa);
        }
    }
}
