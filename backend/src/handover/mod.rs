//! Serving a VMM's connection through a relay, and handing every VM over
//! to a new daemon process (a live upgrade, spec 20.7).
//!
//! Each VMM connection reaches its in-process vhost-user handler through
//! a [`relay::Relay`] that keeps a [`record::SessionRecord`] of what the
//! VMM configured. A hand-over pauses the relays, stops the rings and
//! saves each device's state as a migration would; the new daemon gets
//! the VMM connections, the listening sockets and every descriptor the
//! VMMs sent, configures fresh handlers from the records, loads the
//! states and starts the rings where they stopped. The VMMs go on talking
//! to the same connections and notice nothing but the pause.
//!
//! [`give`] is the running daemon's side, [`take`] the successor's,
//! [`wire`] their messages and [`listen`] the socket they meet on; [`hold`]
//! keeps a socket's accepting thread still meanwhile, [`rings`] speaks to
//! a paused handler, and [`successor`] starts the successor on `SIGUSR2`.

pub mod frame;
pub mod give;
pub mod hold;
pub mod internal;
pub mod listen;
pub mod record;
pub mod relay;
pub mod rings;
pub mod successor;
pub mod take;
pub mod wire;

pub use listen::{HandoverError, HandoverServer};
