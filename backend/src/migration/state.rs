//! What a saved device state holds (spec 20.2).

use serde::{Deserialize, Serialize};

/// The device state of one VM's device instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// The name of the VM that saved it: a state loads only into that VM's
    /// instances (spec 20.5).
    pub vm: String,
    /// Chosen at random when it was saved; a daemon loads each id once,
    /// and only the last one the VM saved (spec 20.5).
    pub migration_id: u64,
    /// The virtio features the driver negotiated; the destination must have
    /// negotiated the same before it loads the state.
    pub features: u64,
    /// The instance's node GUID: a guest reads it once and keeps it.
    pub guid: u64,
    /// The event queue: the next sequence number and the events waiting
    /// for a buffer.
    pub events: EventsState,
}

/// The event queue's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsState {
    /// Sequence number of the last event queued.
    pub last_seq: u32,
    /// Events lost in the current loss run, and the first one's sequence
    /// number.
    pub lost: u32,
    /// Sequence number of the first event of the current loss run.
    pub first_lost_seq: u32,
    /// Events waiting: kind, handle, detail, sequence number.
    pub pending: Vec<[u32; 4]>,
}
