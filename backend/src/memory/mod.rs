//! Guest memory: which guest-physical ranges are RAM, and the validation
//! and translation of the page lists a guest sends with REG_MR and the
//! queue-creating commands, and the dirty log of a migrating VMM (`dirty`).

pub mod access;
pub mod dirty;
pub mod host;
pub mod pagelist;
pub mod ram;
pub mod table;
pub mod volatile;
pub mod window;

pub use dirty::GuestRam;
pub use host::HostMem;
pub use pagelist::{PageList, PageListError};
pub use ram::RamMap;

/// The host page size windows and host memory regions are made of
/// (`memory::window`); guest page lists are made of the guest's, which a
/// window maps whole host pages of.
pub const HOST_PAGE_SIZE: u64 = 4096;
