//! The control-verb dispatcher.
//!
//! [`VmState::execute`] runs one control command on a VM's state: it
//! parses the request (copied out of guest memory beforehand), validates
//! every field against the VM's objects, limits and RAM, applies the
//! command through the VM's resource tables and its RNIC, and
//! produces the response. Nothing here trusts the guest: every failure is a
//! status code. One file per object family.

mod cq;
mod ctx;
mod mcast;
mod mr;
mod mw;
mod parse;
mod policy;
mod qp;
mod query;
mod queue_mem;
mod ring_copy;
mod srq;
mod xrc;

use log::debug;
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, ResponseHeader, Status, DETAIL_NONE};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use crate::memory::pagelist::PageListLimits;
use crate::resources::InsertError;
use crate::rnic_objects::RnicError;
use crate::shmem::DbSlot;
use crate::vm::VmState;

/// A failed command: its status and detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdError {
    /// Status code.
    pub status: Status,
    /// Detail value (see the spec's status table).
    pub detail: u32,
}

impl CmdError {
    /// An error with a detail.
    pub fn new(status: Status, detail: u32) -> Self {
        CmdError { status, detail }
    }

    /// Host resources ran out (a table is full).
    pub fn no_memory() -> Self {
        CmdError::new(Status::NO_MEMORY, DETAIL_NONE)
    }
}

impl From<RnicError> for CmdError {
    fn from(e: RnicError) -> Self {
        match e {
            RnicError::Exhausted => CmdError::no_memory(),
            RnicError::Quota(detail) => CmdError::new(Status::QUOTA, detail),
            RnicError::Invalid => CmdError::new(Status::INVALID, DETAIL_NONE),
            RnicError::Random | RnicError::Host(_) => CmdError::new(Status::INTERNAL, u32::MAX),
        }
    }
}

impl From<InsertError> for CmdError {
    fn from(e: InsertError) -> Self {
        match e {
            InsertError::OverBudget => CmdError::new(Status::QUOTA, quota::HOST_BYTES),
            InsertError::Full => CmdError::no_memory(),
            InsertError::Rnic(t) => t.into(),
        }
    }
}

/// Result of a command handler: the response payload.
pub type CmdResult = Result<Vec<u8>, CmdError>;

pub use mr::{Prepared, Preparer};
pub use virtio_rdma_abi::ctrl::{quota, DETAIL_DB_RECORD, DETAIL_LIST_PAGE};

impl VmState {
    /// The context of PD `pd`, or `BAD_HANDLE` naming the `pd_handle`
    /// field of `T`.
    fn pd_ctx<T: Wire>(&self, pd: u32) -> Result<u32, CmdError> {
        self.res
            .pds
            .get(pd)
            .map(|p| p.ctx)
            .ok_or_else(|| parse::field::<T>(Status::BAD_HANDLE, "pd_handle"))
    }

    /// A doorbell slot for a new queue of context `ctx`, if the context
    /// has a doorbell page with a free slot.
    fn alloc_db_slot(&mut self, ctx: u32) -> Option<DbSlot> {
        let page = self.res.ctxs.get(ctx)?.db_page?;
        self.res.doorbells.as_mut()?.alloc_slot(page)
    }

    fn page_list_limits(&self) -> PageListLimits {
        PageListLimits {
            max_pages: self.limits.max_mr_pages(),
            max_inline: self.limits.max_inline_pages,
            page_size_cap: self.limits.page_size_cap,
            max_list_bytes: self.res.host_bytes_left(),
        }
    }

    /// Executes one request. `writable` is the size of the device-writable
    /// part of the chain; the returned bytes (header + payload) never
    /// exceed it when it is at least a header.
    pub fn execute<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
    ) -> Vec<u8> {
        self.execute_prepared(mem, request, writable, None)
    }

    /// [`VmState::execute`] with the expensive part of the command done
    /// beforehand, without the VM's lock ([`Preparer::prepare`] on the same
    /// request bytes). The response is the one `execute` would give.
    pub fn execute_prepared<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
        prepared: Option<Prepared>,
    ) -> Vec<u8> {
        let (request_id, result) = self.dispatch(mem, request, writable, prepared);
        let (status, detail, payload) = match result {
            Ok(p) => (Status::OK, 0, p),
            Err(e) => (e.status, e.detail, Vec::new()),
        };
        if status == Status::OK {
            self.stats.ok = self.stats.ok.saturating_add(1);
        } else {
            self.stats.failed = self.stats.failed.saturating_add(1);
            debug!(
                "request {request_id:#x}: {} (detail {detail:#x})",
                status.name()
            );
        }
        let mut out = ResponseHeader {
            request_id,
            status: status.into(),
            detail,
        }
        .to_bytes();
        out.extend_from_slice(&payload);
        out
    }

    fn dispatch<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
        prepared: Option<Prepared>,
    ) -> (u64, CmdResult) {
        let Some(head) = request.get(..RequestHeader::SIZE) else {
            return (0, Err(CmdError::new(Status::INVALID, 0)));
        };
        let hdr = RequestHeader::read(head);
        let payload = request.get(RequestHeader::SIZE..).unwrap_or(&[]);
        if let Err(e) = RequestHeader::parse(head) {
            return (hdr.request_id, Err(parse::wire_error::<RequestHeader>(e)));
        }
        let Some(op) = Opcode::from_u32(hdr.opcode) else {
            return (
                hdr.request_id,
                Err(CmdError::new(Status::UNSUPPORTED, hdr.opcode)),
            );
        };
        let need = ResponseHeader::SIZE.saturating_add(response_size(op));
        if writable < need {
            // Not executed: the driver could not learn the outcome.
            let n = u32::try_from(need).unwrap_or(DETAIL_NONE);
            return (hdr.request_id, Err(CmdError::new(Status::INVALID, n)));
        }
        if reshapes_data_plane(op) {
            self.dp_changed = true;
        }
        let result = match op {
            Opcode::QUERY_DEVICE => self.query_device(payload),
            Opcode::QUERY_PORT => self.query_port(payload),
            Opcode::QUERY_GID => self.query_gid(payload),
            Opcode::CREATE_CTX => self.create_ctx(mem, payload),
            Opcode::DESTROY_CTX => self.destroy_ctx(payload),
            Opcode::ALLOC_PD => self.alloc_pd(payload),
            Opcode::DEALLOC_PD => self.dealloc_pd(payload),
            Opcode::OPEN_XRCD => self.open_xrcd(payload),
            Opcode::CLOSE_XRCD => self.close_xrcd(payload),
            Opcode::CREATE_CQ => self.create_cq(mem, payload),
            Opcode::DESTROY_CQ => self.destroy_cq(payload),
            Opcode::RESIZE_CQ => self.resize_cq(mem, payload),
            Opcode::REG_MR => {
                let mut prepared = prepared;
                let r = self.reg_mr(mem, payload, &mut prepared);
                // Prepared but not used (an earlier check failed): freed
                // after the VM's lock is released, like the translations
                // of destroyed objects.
                if let Some(Prepared { pages: Ok(p), .. }) = prepared {
                    self.res.release(p);
                }
                r
            }
            Opcode::DEREG_MR => self.dereg_mr(payload),
            Opcode::ALLOC_MR => self.alloc_mr(payload),
            Opcode::REREG_MR => self.rereg_mr(mem, payload),
            Opcode::ALLOC_MW => self.alloc_mw(payload),
            Opcode::DEALLOC_MW => self.dealloc_mw(payload),
            Opcode::CREATE_QP => self.create_qp(mem, payload),
            Opcode::MODIFY_QP => self.modify_qp(mem, payload),
            Opcode::QUERY_QP => self.query_qp(payload),
            Opcode::DESTROY_QP => self.destroy_qp(payload),
            Opcode::CREATE_AH => self.create_ah(payload),
            Opcode::DESTROY_AH => self.destroy_ah(payload),
            Opcode::ATTACH_MCAST => self.attach_mcast(payload),
            Opcode::DETACH_MCAST => self.detach_mcast(payload),
            Opcode::CREATE_SRQ => self.create_srq(mem, payload),
            Opcode::MODIFY_SRQ => self.modify_srq(mem, payload),
            Opcode::QUERY_SRQ => self.query_srq(payload),
            Opcode::DESTROY_SRQ => self.destroy_srq(payload),
            Opcode::CREATE_XRC_SRQ => self.create_xrc_srq(mem, payload),
        };
        (hdr.request_id, result)
    }
}

/// Whether `op` can change what the engine's polling list of a VM is built
/// from (engine::poll): the VM's QPs, their states and doorbells, and the
/// contexts that hold those doorbells. Memory regions, CQs, SRQs, PDs and
/// AHs are looked up by the data path when a WQE names them, so commands
/// on them leave the list as it is.
fn reshapes_data_plane(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::CREATE_CTX
            | Opcode::DESTROY_CTX
            | Opcode::CREATE_QP
            | Opcode::MODIFY_QP
            | Opcode::DESTROY_QP
    )
}

/// Size of the response payload of `op`.
pub fn response_size(op: Opcode) -> usize {
    use Opcode::*;
    match op {
        QUERY_DEVICE => DeviceAttr::SIZE,
        QUERY_PORT => PortAttr::SIZE,
        QUERY_GID => QueryGidResp::SIZE,
        CREATE_CTX => CreateCtxResp::SIZE,
        ALLOC_PD => PdHandleResp::SIZE,
        CREATE_CQ | RESIZE_CQ => CqHandleResp::SIZE,
        REG_MR | ALLOC_MR | REREG_MR => RegMrResp::SIZE,
        ALLOC_MW => AllocMwResp::SIZE,
        CREATE_QP => CreateQpResp::SIZE,
        QUERY_QP => QueryQpResp::SIZE,
        CREATE_AH => AhHandleResp::SIZE,
        CREATE_SRQ | CREATE_XRC_SRQ => CreateSrqResp::SIZE,
        OPEN_XRCD => XrcdHandle::SIZE,
        QUERY_SRQ => QuerySrqResp::SIZE,
        DESTROY_CTX | DEALLOC_PD | DESTROY_CQ | DEREG_MR | MODIFY_QP | DESTROY_QP | DESTROY_AH
        | MODIFY_SRQ | DESTROY_SRQ | DEALLOC_MW | ATTACH_MCAST | DETACH_MCAST | CLOSE_XRCD => 0,
    }
}
