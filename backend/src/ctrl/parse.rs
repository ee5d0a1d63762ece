//! Payload parsing and the mapping of parse failures to statuses.

use virtio_rdma_abi::ctrl::{Status, DETAIL_NONE};
use virtio_rdma_abi::mem::{BufferDesc, MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};
use virtio_rdma_abi::{Wire, WireError};

use super::{quota, CmdError, DETAIL_LIST_PAGE};
use crate::memory::PageListError;
use crate::resources::DestroyError;

/// Maps a parse failure of `T` to `INVALID` with the spec's detail.
pub fn wire_error<T: Wire>(e: WireError) -> CmdError {
    match e {
        WireError::Truncated { .. } | WireError::Trailing { .. } => {
            CmdError::new(Status::INVALID, detail(T::SIZE))
        }
        WireError::ReservedNotZero { offset } => CmdError::new(Status::INVALID, detail(offset)),
    }
}

/// A byte offset or size as a `detail` (structures are far smaller than
/// 4 GiB; `DETAIL_NONE` if one were not).
fn detail(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(DETAIL_NONE)
}

/// Parses a fixed-size payload.
pub fn fixed<T: Wire>(payload: &[u8]) -> Result<T, CmdError> {
    T::parse(payload).map_err(wire_error::<T>)
}

/// Parses the fixed part of a payload that carries a page list.
pub fn with_list<T: Wire>(payload: &[u8]) -> Result<(T, &[u8]), CmdError> {
    T::parse_prefix(payload).map_err(wire_error::<T>)
}

/// Byte offset of a field of `T` (nested fields as "outer.inner"), for
/// `detail`. Only called on error paths.
pub fn off<T: Wire>(path: &str) -> u32 {
    let (outer, inner) = path.split_once('.').unwrap_or((path, ""));
    let base = T::LAYOUT
        .iter()
        .find(|f| f.name == outer)
        .map_or(0, |f| f.offset);
    let nested = match (outer, inner) {
        (_, "") => 0,
        ("buf", i) => find::<BufferDesc>(i),
        ("attr", i) => attr_off(i),
        ("av", i) => find::<virtio_rdma_abi::qp::AddressVector>(i),
        _ => 0,
    };
    detail(base.saturating_add(nested))
}

fn find<T: Wire>(name: &str) -> usize {
    T::LAYOUT
        .iter()
        .find(|f| f.name == name)
        .map_or(0, |f| f.offset)
}

fn attr_off(path: &str) -> usize {
    use virtio_rdma_abi::qp::{AddressVector, QpAttr};
    match path.split_once('.') {
        Some(("av", i)) => find::<QpAttr>("av").saturating_add(find::<AddressVector>(i)),
        _ => find::<QpAttr>(path),
    }
}

/// Shorthand for an error whose detail is the offset of a field of `T`.
pub fn field<T: Wire>(status: Status, path: &str) -> CmdError {
    CmdError::new(status, off::<T>(path))
}

/// Maps a page-list failure of the `buf` field of `T`.
pub fn page_list_error<T: Wire>(e: PageListError) -> CmdError {
    use PageListError::*;
    match e {
        BadMode(_) => field::<T>(Status::INVALID, "buf.mode"),
        BadPageShift(_) => field::<T>(Status::INVALID, "buf.page_shift"),
        NoPages => field::<T>(Status::INVALID, "buf.npages"),
        TooManyPages(_) | TooManyInline(_) => field::<T>(Status::RANGE, "buf.npages"),
        AddrNotZero => field::<T>(Status::INVALID, "buf.addr"),
        ListLength { expected, .. } => CmdError::new(
            Status::INVALID,
            u32::try_from((T::SIZE as u64).saturating_add(expected)).unwrap_or(u32::MAX),
        ),
        BadPage { index } => CmdError::new(Status::BAD_ADDRESS, index),
        BadListPage { .. } => CmdError::new(Status::BAD_ADDRESS, DETAIL_LIST_PAGE),
        OverBudget(_) => CmdError::new(Status::QUOTA, quota::HOST_BYTES),
    }
}

/// Whether a page shift is one the page-list code could accept (the full
/// check, including the device's page size set, happens there).
pub fn shift_plausible(shift: u32) -> bool {
    (MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift)
}

/// Maps a destroy failure; `handle_field` names the handle field of `T`.
pub fn destroy_error<T: Wire>(e: DestroyError, handle_field: &str) -> CmdError {
    match e {
        DestroyError::BadHandle => field::<T>(Status::BAD_HANDLE, handle_field),
        DestroyError::Busy(n) => CmdError::new(Status::BUSY, n),
    }
}

/// Checks a power-of-two depth in `1..=max`: not a power of two is
/// `INVALID`, above the limit `RANGE`.
pub fn depth<T: Wire>(value: u32, max: u32, name: &str) -> Result<(), CmdError> {
    if !value.is_power_of_two() {
        return Err(field::<T>(Status::INVALID, name));
    }
    if value > max {
        return Err(field::<T>(Status::RANGE, name));
    }
    Ok(())
}
