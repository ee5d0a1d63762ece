//! Event demultiplexing: one event queue, many waiters.
//!
//! `CQ_COMPLETION` events are counted per live CQ (a CQ's
//! [`wait_event`](crate::Cq::wait_event) consumes one); every other event goes
//! to a bounded queue read by
//! [`Device::next_async_event`](crate::Device::next_async_event). One thread
//! at a time reads the transport; the others wait on a condition variable and
//! are woken after every event.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use virtio_rdma_abi::event::{Event, EventKind};

use crate::error::Result;
use crate::transport::{Transport, TransportError};

/// Most asynchronous events held for [`crate::Device::next_async_event`];
/// older ones are dropped (and counted) beyond it.
pub const MAX_ASYNC_EVENTS: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct EventState {
    reader: bool,
    /// Pending CQ_COMPLETION events per live CQ handle.
    cq_pending: HashMap<u32, u32>,
    /// Other events, oldest first.
    async_events: VecDeque<Event>,
    /// Asynchronous events dropped because the queue was full.
    pub dropped: u64,
}

impl EventState {
    fn dispatch(&mut self, ev: Event) {
        if EventKind::from_u32(ev.kind) == Some(EventKind::CQ_COMPLETION) {
            // Events for CQs that are gone (or never were ours) are ignored.
            if let Some(n) = self.cq_pending.get_mut(&ev.handle) {
                *n = n.saturating_add(1);
            }
            return;
        }
        if self.async_events.len() >= MAX_ASYNC_EVENTS {
            self.async_events.pop_front();
            self.dropped += 1;
        }
        self.async_events.push_back(ev);
    }

    /// Takes one pending completion event of CQ `handle`.
    pub(crate) fn take_cq(&mut self, handle: u32) -> Option<()> {
        let n = self.cq_pending.get_mut(&handle)?;
        if *n == 0 {
            return None;
        }
        *n -= 1;
        Some(())
    }

    /// Takes the oldest asynchronous event.
    pub(crate) fn take_async(&mut self) -> Option<Event> {
        self.async_events.pop_front()
    }
}

/// The event demultiplexer of a device.
#[derive(Debug, Default)]
pub(crate) struct EventDemux {
    state: Mutex<EventState>,
    cv: Condvar,
}

impl EventDemux {
    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts counting completion events of CQ `handle`.
    pub(crate) fn register_cq(&self, handle: u32) {
        self.lock().cq_pending.insert(handle, 0);
    }

    /// Stops counting completion events of CQ `handle`.
    pub(crate) fn unregister_cq(&self, handle: u32) {
        self.lock().cq_pending.remove(&handle);
    }

    /// Number of asynchronous events dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Waits until `take` finds something, reading events from the
    /// transport, for at most `timeout` (`None`: forever; zero: poll once).
    pub(crate) fn wait<T>(
        &self,
        transport: &dyn Transport,
        timeout: Option<Duration>,
        mut take: impl FnMut(&mut EventState) -> Option<T>,
    ) -> Result<Option<T>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut polled = false;
        let mut st = self.lock();
        loop {
            if let Some(v) = take(&mut st) {
                return Ok(Some(v));
            }
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if polled && remaining == Some(Duration::ZERO) {
                return Ok(None);
            }
            if !st.reader {
                st.reader = true;
                drop(st);
                let r = transport.next_event(remaining);
                st = self.lock();
                st.reader = false;
                polled = true;
                let r = match r {
                    Ok(Some(ev)) => {
                        st.dispatch(ev);
                        Ok(())
                    }
                    Ok(None) | Err(TransportError::Timeout) => Ok(()),
                    Err(e) => Err(e),
                };
                self.cv.notify_all();
                r?;
            } else {
                if remaining == Some(Duration::ZERO) {
                    return Ok(None);
                }
                let slice = remaining.unwrap_or(Duration::from_secs(3600));
                st = self
                    .cv
                    .wait_timeout(st, slice)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                polled = true;
            }
        }
    }
}
