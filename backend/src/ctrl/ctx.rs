//! CREATE_CTX, DESTROY_CTX, ALLOC_PD, DEALLOC_PD, CREATE_AH, DESTROY_AH.

use virtio_rdma_abi::config::{F_SHMEM_DOORBELL, F_UD};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{CtxDoorbell, DB_NONE};
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use super::parse::{destroy_error, field, fixed};
use super::queue_mem::init_ctx_header;
use super::{quota, CmdError, CmdResult, DETAIL_DB_RECORD};
use crate::resources::{Ah, Context, Pd};
use crate::vm::VmState;

/// Bytes (and alignment) of a context's doorbell header.
const CTX_DB_SIZE: u64 = CtxDoorbell::SIZE as u64;

/// Largest service level.
const MAX_SL: u8 = 15;
/// Flow labels are 20 bits.
const FLOW_LABEL_LIMIT: u32 = 1 << 20;

impl VmState {
    /// Checks an address vector; `prefix` is the path of the `av` field in
    /// `T`. Its source GID index must name an assigned entry of the port's
    /// table: past the table is `RANGE`, an unassigned entry `INVALID`
    /// (spec 12.13, 12.16), each counted as a spoofing attempt.
    pub(super) fn check_av<T: Wire>(
        &self,
        av: &AddressVector,
        prefix: &str,
    ) -> Result<(), CmdError> {
        let index = u32::from(av.sgid_index);
        if index >= self.port.gids.len() {
            self.note_gid_spoof();
            return Err(field::<T>(Status::RANGE, &format!("{prefix}.sgid_index")));
        }
        if self.port.gids.assigned(index).is_none() {
            self.note_gid_spoof();
            return Err(field::<T>(Status::INVALID, &format!("{prefix}.sgid_index")));
        }
        if av.sl > MAX_SL {
            return Err(field::<T>(Status::INVALID, &format!("{prefix}.sl")));
        }
        if av.flow_label >= FLOW_LABEL_LIMIT {
            return Err(field::<T>(Status::INVALID, &format!("{prefix}.flow_label")));
        }
        Ok(())
    }
}

impl VmState {
    pub(super) fn create_ctx<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        payload: &[u8],
    ) -> CmdResult {
        let req: CreateCtxReq = fixed(payload)?;
        if req.db_gpa % CTX_DB_SIZE != 0 || !self.ram.contains(req.db_gpa, CTX_DB_SIZE) {
            return Err(CmdError::new(Status::BAD_ADDRESS, DETAIL_DB_RECORD));
        }
        if self.res.ctxs.len() >= self.limits.max_ctx as usize {
            return Err(CmdError::new(Status::QUOTA, quota::CTX));
        }
        let ctx_handle = self.res.insert_ctx(Context {
            db_page: None,
            db_gpa: req.db_gpa,
        })?;
        // Without a mapped doorbell region the context works in guest-RAM
        // mode (spec 18.7); that is not an error.
        let db_page = if self.has(F_SHMEM_DOORBELL) {
            self.res.doorbells.as_mut().and_then(|d| d.alloc_page())
        } else {
            None
        };
        let flags = self.new_doorbell_flags();
        if let (Some(page), Some(pages)) = (db_page, self.res.doorbells.as_ref()) {
            pages.set_page_flags(page, flags);
        }
        // Written either way (spec 12.4): the driver finds a defined header.
        init_ctx_header(mem, req.db_gpa, if db_page.is_some() { 0 } else { flags });
        if let Some(ctx) = self.res.ctxs.get_mut(ctx_handle) {
            ctx.db_page = db_page;
        }
        Ok(CreateCtxResp {
            ctx_handle,
            doorbell_page: db_page.unwrap_or(DB_NONE),
        }
        .to_bytes())
    }

    pub(super) fn destroy_ctx(&mut self, payload: &[u8]) -> CmdResult {
        let req: CtxHandleReq = fixed(payload)?;
        self.res
            .destroy_ctx(req.ctx_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<CtxHandleReq>(e, "ctx_handle"))?;
        Ok(Vec::new())
    }

    pub(super) fn alloc_pd(&mut self, payload: &[u8]) -> CmdResult {
        let req: CtxHandleReq = fixed(payload)?;
        if self.res.ctxs.get(req.ctx_handle).is_none() {
            return Err(field::<CtxHandleReq>(Status::BAD_HANDLE, "ctx_handle"));
        }
        if self.res.pds.len() >= self.limits.max_pd as usize {
            return Err(CmdError::new(Status::QUOTA, quota::PD));
        }
        let pd_handle = self.res.insert_pd(
            Pd {
                ctx: req.ctx_handle,
                users: 0,
            },
            self.rnic.as_ref(),
        )?;
        Ok(PdHandleResp { pd_handle }.to_bytes())
    }

    pub(super) fn dealloc_pd(&mut self, payload: &[u8]) -> CmdResult {
        let req: PdHandleReq = fixed(payload)?;
        self.res
            .dealloc_pd(req.pd_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<PdHandleReq>(e, "pd_handle"))?;
        Ok(Vec::new())
    }

    pub(super) fn create_ah(&mut self, payload: &[u8]) -> CmdResult {
        if !self.has(F_UD) {
            return Err(CmdError::new(Status::UNSUPPORTED, Opcode::CREATE_AH.into()));
        }
        let req: CreateAhReq = fixed(payload)?;
        let ctx = self.pd_ctx::<CreateAhReq>(req.pd_handle)?;
        if self.res.ahs.len() >= self.limits.max_ah as usize {
            return Err(CmdError::new(Status::QUOTA, quota::AH));
        }
        if req.port != PORT_NUM {
            return Err(field::<CreateAhReq>(Status::RANGE, "port"));
        }
        self.check_av::<CreateAhReq>(&req.av, "av")?;
        // The tenant policy, after every other check (spec 12.16).
        self.allowed_ah_gid(&req.av.dgid)?;
        let mut av = req.av;
        self.fabric_av(&mut av)?;
        let ah_handle = self.res.insert_ah(
            Ah {
                pd: req.pd_handle,
                ctx,
                port: req.port,
                av,
            },
            self.rnic.as_ref(),
        )?;
        Ok(AhHandleResp { ah_handle }.to_bytes())
    }

    pub(super) fn destroy_ah(&mut self, payload: &[u8]) -> CmdResult {
        if !self.has(F_UD) {
            return Err(CmdError::new(
                Status::UNSUPPORTED,
                Opcode::DESTROY_AH.into(),
            ));
        }
        let req: AhHandleReq = fixed(payload)?;
        self.res
            .destroy_ah(req.ah_handle, self.rnic.as_ref())
            .map_err(|e| destroy_error::<AhHandleReq>(e, "ah_handle"))?;
        Ok(Vec::new())
    }
}
