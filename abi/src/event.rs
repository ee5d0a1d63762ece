//! Asynchronous events delivered on the event queue.

use crate::ctrl::code_enum;
use crate::wire_struct;

wire_struct! {
    /// One event, written by the device into a device-writable event buffer.
    pub struct Event {
        /// One of [`EventKind`].
        kind: u32,
        /// Handle of the object concerned (CQ, QP or SRQ), or 0.
        handle: u32,
        /// Kind-specific detail (for `EVENTS_LOST`: how many were lost).
        detail: u32,
        /// Sequence number, incremented for every event generated; a gap
        /// means events were lost.
        seq: u32,
    }
}

code_enum! {
    /// Kinds of asynchronous event.
    pub enum EventKind {
        /// A completion was added to an armed CQ.
        CQ_COMPLETION = 1,
        /// A CQ overflowed or its memory became unusable.
        CQ_ERROR = 2,
        /// A QP entered the error state for a reason local to it.
        QP_FATAL = 3,
        /// The responder detected an invalid request.
        QP_REQ_ERROR = 4,
        /// The responder detected an access violation.
        QP_ACCESS_ERROR = 5,
        /// First packet received on a QP in RTR.
        QP_COMM_EST = 6,
        /// A QP in SQD has no outstanding send work.
        QP_SQ_DRAINED = 7,
        /// A QP attached to an SRQ in error has consumed its last WQE.
        QP_LAST_WQE_REACHED = 8,
        /// The number of posted SRQ WQEs fell below the armed limit.
        SRQ_LIMIT_REACHED = 9,
        /// An SRQ failed.
        SRQ_ERROR = 10,
        /// The port became active.
        PORT_ACTIVE = 11,
        /// The port went down.
        PORT_ERROR = 12,
        /// The GID table changed.
        GID_CHANGE = 13,
        /// The device failed; the driver must reset it.
        DEVICE_FATAL = 14,
        /// Events were dropped because no event buffer was available.
        EVENTS_LOST = 15,
    }
}
