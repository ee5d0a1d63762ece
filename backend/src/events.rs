//! Asynchronous events waiting for the driver's event buffers.

use std::collections::VecDeque;

use virtio_rdma_abi::event::{Event, EventKind};

/// Events held while the driver has no event buffer posted.
pub const MAX_PENDING_EVENTS: usize = 1024;

/// Per-VM event state: pending events, sequence numbers, losses.
#[derive(Debug, Default)]
pub struct EventQueue {
    pending: VecDeque<Event>,
    next_seq: u32,
    lost: u32,
    /// Sequence number of the first event of the current loss run.
    first_lost_seq: u32,
    /// Total events dropped since the last reset (statistics).
    pub lost_total: u64,
}

impl EventQueue {
    /// Queues an event; past the limit it is counted as lost instead.
    pub fn push(&mut self, kind: EventKind, handle: u32, detail: u32) {
        self.next_seq = self.next_seq.wrapping_add(1);
        if self.pending.len() >= MAX_PENDING_EVENTS {
            // While the queue is full every new event is dropped, so a loss
            // run is a contiguous range of sequence numbers.
            if self.lost == 0 {
                self.first_lost_seq = self.next_seq;
            }
            self.lost = self.lost.saturating_add(1);
            self.lost_total += 1;
            return;
        }
        self.pending.push_back(Event {
            kind: kind.into(),
            handle,
            detail,
            seq: self.next_seq,
        });
    }

    /// The next event to deliver: a loss report first if events were lost.
    pub fn pop(&mut self) -> Option<Event> {
        if self.lost > 0 {
            let lost = std::mem::take(&mut self.lost);
            return Some(Event {
                kind: EventKind::EVENTS_LOST.into(),
                handle: 0,
                detail: lost,
                seq: self.first_lost_seq,
            });
        }
        self.pending.pop_front()
    }

    /// Puts an event back at the front (no buffer could take it).
    pub fn unpop(&mut self, ev: Event) {
        if ev.kind == u32::from(EventKind::EVENTS_LOST) {
            self.lost = self.lost.saturating_add(ev.detail);
        } else {
            self.pending.push_front(ev);
        }
    }

    /// Number of events waiting.
    pub fn len(&self) -> usize {
        self.pending.len() + usize::from(self.lost > 0)
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue's parts, as a saved device state holds them (spec
    /// 20.2): the last sequence number, the current loss run (count and
    /// first sequence number) and the waiting events.
    pub fn parts(&self) -> (u32, u32, u32, Vec<Event>) {
        (
            self.next_seq,
            self.lost,
            self.first_lost_seq,
            self.pending.iter().copied().collect(),
        )
    }

    /// A queue from [`EventQueue::parts`]; refuses more waiting events than
    /// a queue holds.
    pub fn from_parts(
        last_seq: u32,
        lost: u32,
        first_lost_seq: u32,
        pending: Vec<Event>,
    ) -> Result<Self, String> {
        if pending.len() > MAX_PENDING_EVENTS {
            return Err(format!(
                "{} events waiting, at most {MAX_PENDING_EVENTS}",
                pending.len()
            ));
        }
        Ok(EventQueue {
            pending: pending.into(),
            next_seq: last_seq,
            lost,
            first_lost_seq,
            lost_total: 0,
        })
    }

    /// Drops everything (device reset).
    pub fn reset(&mut self) {
        *self = EventQueue::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_reports_loss_first() {
        let mut q = EventQueue::default();
        for i in 0..(MAX_PENDING_EVENTS + 5) {
            q.push(EventKind::CQ_COMPLETION, i as u32, 0);
        }
        let first = q.pop().unwrap();
        assert_eq!(first.kind, EventKind::EVENTS_LOST as u32);
        assert_eq!(first.detail, 5);
        assert_eq!(first.seq, MAX_PENDING_EVENTS as u32 + 1);
        let next = q.pop().unwrap();
        assert_eq!(next.seq, 1);
        assert_eq!(q.len(), MAX_PENDING_EVENTS - 1);
    }
}
