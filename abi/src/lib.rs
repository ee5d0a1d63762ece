//! Wire types of the virtio-rdma device (virtio device ID 42).
//!
//! This crate is the executable form of `docs/virtio-rdma-spec.md`: every
//! structure, constant and formula the spec defines is here, with explicit
//! little-endian encoding and compile-time layout checks. It has no
//! dependencies, so a guest driver can use it without pulling in vhost-user.
//!
//! Parsing never panics: requests from a guest are untrusted bytes.

#![deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

pub mod config;
pub mod ctrl;
pub mod datapath;
pub mod event;
pub mod mem;
pub mod qp;
pub mod verbs;
pub mod wire;

pub use wire::{Field, FieldLayout, Wire, WireError};

/// Virtio device ID of the RDMA device.
pub const VIRTIO_ID_RDMA: u32 = 42;

/// Version of the device ABI described by this crate (device configuration
/// field `abi_version`).
pub const ABI_VERSION: u32 = 3;

/// Oldest device ABI version a driver of this version also drives: version
/// 3 kept every structure of version 2 and added features behind feature
/// bits, so a version-3 driver uses a version-2 device by not using them.
pub const MIN_COMPATIBLE_ABI_VERSION: u32 = 2;

/// One wire structure of the spec: its name, field layout, field types and
/// size.
#[derive(Debug, Clone, Copy)]
pub struct WireInfo {
    /// Name as used in the spec.
    pub name: &'static str,
    /// Every field, in order.
    pub layout: &'static [FieldLayout],
    /// The Rust type of every field, in order ([`Wire::FIELD_TYPES`]).
    pub types: &'static [&'static str],
    /// Size in bytes.
    pub size: usize,
}

/// Every wire structure of the spec, by name, with its layout and size. The
/// spec test checks each table of the document against this list.
pub fn all_layouts() -> Vec<(&'static str, &'static [FieldLayout], usize)> {
    all_structs()
        .into_iter()
        .map(|w| (w.name, w.layout, w.size))
        .collect()
}

/// Every wire structure of the spec, in the order of the document.
pub fn all_structs() -> Vec<WireInfo> {
    macro_rules! l {
        ($($t:ty),* $(,)?) => {
            vec![$(WireInfo {
                name: <$t as Wire>::NAME,
                layout: <$t as Wire>::LAYOUT,
                types: <$t as Wire>::FIELD_TYPES,
                size: <$t as Field>::SIZE,
            }),*]
        };
    }
    use config::DeviceConfig;
    use ctrl::{RequestHeader, ResponseHeader};
    use datapath::{
        BindMwWqe, CqDoorbell, Cqe, CtxDoorbell, DbPageHeader, QpDbSlot, QpDoorbell, RecvWqe,
        RegMrWqe, SendWqe, Sge, SrqDbSlot, SrqDoorbell,
    };
    use event::Event;
    use mem::BufferDesc;
    use qp::{AddressVector, QpAttr};
    use verbs::*;
    l![
        DeviceConfig,
        RequestHeader,
        ResponseHeader,
        Event,
        BufferDesc,
        AddressVector,
        QpAttr,
        DeviceAttr,
        QueryPortReq,
        PortAttr,
        QueryGidReq,
        QueryGidResp,
        CreateCtxReq,
        CreateCtxResp,
        CtxHandleReq,
        PdHandleReq,
        PdHandleResp,
        XrcdHandle,
        CreateCqReq,
        CqHandleReq,
        CqHandleResp,
        ResizeCqReq,
        RegMrReq,
        RegMrResp,
        MrHandleReq,
        AllocMrReq,
        McastReq,
        ReregMrReq,
        AllocMwReq,
        AllocMwResp,
        MwHandleReq,
        CreateQpReq,
        CreateQpResp,
        ModifyQpReq,
        QpHandleReq,
        QueryQpResp,
        CreateAhReq,
        AhHandleReq,
        AhHandleResp,
        CreateSrqReq,
        CreateSrqResp,
        CreateXrcSrqReq,
        ModifySrqReq,
        ModifySrqResizeReq,
        SrqHandleReq,
        QuerySrqResp,
        QpDoorbell,
        CqDoorbell,
        SrqDoorbell,
        CtxDoorbell,
        DbPageHeader,
        QpDbSlot,
        SrqDbSlot,
        SendWqe,
        Sge,
        RegMrWqe,
        BindMwWqe,
        RecvWqe,
        Cqe,
    ]
}
