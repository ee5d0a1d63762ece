//! Wire formats of InfiniBand connection management (IBTA volume 1,
//! chapters 12 and 13) as a RoCE port carries them over its GSI QP: the
//! common MAD header, the CM messages, and the header `rdma_cm` puts at the
//! start of a connection request's private data.
//!
//! The daemon's libibverbs transport terminates a guest's connection
//! management with these types (the guest's QP 1 MADs in, the host's
//! `rdma_cm` events out as MADs); tests use them to speak CM through a
//! virtio-rdma GSI QP. Each message has a plain representation with
//! `parse` and `emit`: parsing never panics and checks what the receiver of
//! the message relies on; emitting writes every byte of the MAD.
//!
//! Multi-byte fields are big-endian, and bit fields are numbered from the
//! most significant bit of their byte, as in the IBTA tables.

// Offsets are sums of small constants inside a 256-byte MAD, so plain
// arithmetic is used; every access goes through `bits`, which never panics.
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

mod bits;
pub mod cm;
pub mod cma;
pub mod mad;

pub use cm::{CmMessage, Drep, Dreq, Mra, Path, Rej, Rep, Req, Rtu};
pub use mad::{MadHeader, MAD_SIZE};

use std::fmt;

/// Why bytes could not be parsed as a MAD or a CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than the format needs.
    Truncated {
        /// Bytes the format needs.
        need: usize,
        /// Bytes supplied.
        got: usize,
    },
    /// The MAD is not a CM MAD of the version this crate implements
    /// (`base_version` 1, class 0x07, class version 2).
    NotCm {
        /// The MAD's management class.
        class: u8,
        /// Its class version.
        version: u8,
    },
    /// A CM attribute this crate does not parse (LAP, APR, SIDR, ...).
    UnknownAttribute(u16),
    /// A field holds a value outside its domain.
    BadField(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated { need, got } => write!(f, "truncated: {got} bytes of {need}"),
            Error::NotCm { class, version } => {
                write!(f, "not a CM MAD: class {class:#04x} version {version}")
            }
            Error::UnknownAttribute(a) => write!(f, "CM attribute {a:#06x} is not parsed"),
            Error::BadField(name) => write!(f, "field {name} holds a value outside its domain"),
        }
    }
}

impl std::error::Error for Error {}
