//! ATTACH_MCAST, DETACH_MCAST (spec 12.27).

use virtio_rdma_abi::config::F_MCAST;
use virtio_rdma_abi::ctrl::{quota, Opcode, Status};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::{is_multicast_gid, McastReq};

use super::parse::{field, fixed};
use super::{CmdError, CmdResult};
use crate::resources::mcast::AttachError;
use crate::vm::VmState;

impl VmState {
    /// The request's checks common to both commands: the feature, a UD QP
    /// of the VM, a multicast GID, the reserved field.
    fn mcast_request(&self, op: Opcode, payload: &[u8]) -> Result<McastReq, CmdError> {
        if !self.has(F_MCAST) {
            return Err(CmdError::new(Status::UNSUPPORTED, op.into()));
        }
        let req: McastReq = fixed(payload)?;
        let qp = self
            .res
            .qps
            .get(req.qp_handle)
            .ok_or_else(|| field::<McastReq>(Status::BAD_HANDLE, "qp_handle"))?;
        if qp.qp_type != QpType::UD {
            return Err(field::<McastReq>(Status::INVALID, "qp_handle"));
        }
        if req.reserved != 0 {
            return Err(field::<McastReq>(Status::INVALID, "reserved"));
        }
        if !is_multicast_gid(&req.mgid) {
            return Err(field::<McastReq>(Status::INVALID, "mgid"));
        }
        Ok(req)
    }

    pub(super) fn attach_mcast(&mut self, payload: &[u8]) -> CmdResult {
        let req = self.mcast_request(Opcode::ATTACH_MCAST, payload)?;
        self.res
            .attach_mcast(req.qp_handle, &req.mgid, self.rnic.as_ref())
            .map_err(|e| match e {
                AttachError::Groups => CmdError::new(Status::QUOTA, quota::MCAST_GROUPS),
                AttachError::Members => CmdError::new(Status::QUOTA, quota::MCAST_MEMBERS),
                AttachError::Rnic(_) => {
                    CmdError::new(Status::UNSUPPORTED, Opcode::ATTACH_MCAST.into())
                }
            })?;
        Ok(Vec::new())
    }

    pub(super) fn detach_mcast(&mut self, payload: &[u8]) -> CmdResult {
        let req = self.mcast_request(Opcode::DETACH_MCAST, payload)?;
        if !self
            .res
            .detach_mcast(req.qp_handle, &req.mgid, self.rnic.as_ref())
        {
            return Err(field::<McastReq>(Status::INVALID, "mgid"));
        }
        Ok(Vec::new())
    }
}
