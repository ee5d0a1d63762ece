//! The tenant policy on the control path: which destinations a VM may name
//! in `MODIFY_QP` (an RC QP's address vector and destination QPN) and
//! `CREATE_AH`, and the isolation counters those refusals move.
//!
//! A VM may name only GIDs of VMs of its own tenant (its own included).
//! Anything else is refused with `DENIED`, whether the GID belongs to a VM
//! of another tenant or to nobody: the answer is the same, so refusals teach
//! a guest nothing about other tenants. A destination QPN is checked only
//! against VMs the requester may reach anyway: a QPN of a same-tenant VM
//! other than the one the GID names is a contradiction and refused; a QPN of
//! another tenant's VM is treated exactly as a QPN that does not exist
//! (accepted, and unreachable on the data path), for the same reason.

use virtio_rdma_abi::config::F_MCAST;
use virtio_rdma_abi::ctrl::{Status, DETAIL_NONE};
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::is_multicast_gid;

/// Bit 31 of a Q_Key: a privileged Q_Key, which only privileged consumers
/// of a fabric may use (InfiniBand Architecture, 10.2.4; Linux refuses it
/// to unprivileged users in `ibv_modify_qp`).
pub(crate) const PRIVILEGED_QKEY: u32 = 1 << 31;

use super::CmdError;
use crate::config::FabricPolicy;
use crate::rnic_objects::{Owner, RnicKind};
use crate::tenancy::IsolationCounters;
use crate::vm::VmState;

impl VmState {
    /// Counts a source GID index that names no GID of the VM (past its
    /// table, or an unassigned entry) as a spoofing attempt; the address
    /// vector's check refuses it.
    pub(super) fn note_gid_spoof(&self) {
        if let Some(c) = self.tenancy.counters(self.port.vm) {
            IsolationCounters::bump(&c.gid_spoof);
        }
    }

    /// `DENIED` (detail `DETAIL_NONE`) for a privileged Q_Key (bit 31),
    /// counted in the VM's `privileged`: such a key would let the guest
    /// address the management QPs of the fabric (the GSI's Q_Key is
    /// 0x8001_0000), and a host RNIC would send it as the daemon's.
    pub(super) fn privileged_qkey(&self, qkey: u32) -> Result<(), CmdError> {
        if qkey & PRIVILEGED_QKEY == 0 {
            return Ok(());
        }
        if let Some(c) = self.tenancy.counters(self.port.vm) {
            IsolationCounters::bump(&c.privileged);
        }
        Err(CmdError::new(Status::DENIED, DETAIL_NONE))
    }

    /// `DENIED` (detail `DETAIL_NONE`), counted in the VM's `denied`.
    fn denied(&self) -> CmdError {
        if let Some(c) = self.tenancy.counters(self.port.vm) {
            IsolationCounters::bump(&c.denied);
        }
        CmdError::new(Status::DENIED, DETAIL_NONE)
    }

    /// Applies the tenant's fabric rules to an address vector (spec
    /// 12.16): a forced value replaces the guest's, a value the rules do
    /// not allow is `DENIED` (counted in `denied`). On a host RNIC the
    /// defaults force traffic class and service level 0.
    pub(super) fn fabric_av(&self, av: &mut AddressVector) -> Result<(), CmdError> {
        let fabric = self.rnic.kind() == RnicKind::Verbs;
        let [tc, sl, flow] = self.tenancy.fabric_of(self.port.vm).map_or_else(
            || FabricPolicy::default().rules(fabric),
            |p| p.rules(fabric),
        );
        let (Some(tc), Some(sl), Some(flow)) = (
            tc.apply(av.traffic_class.into())
                .and_then(|v| u8::try_from(v).ok()),
            sl.apply(av.sl.into()).and_then(|v| u8::try_from(v).ok()),
            flow.apply(av.flow_label),
        ) else {
            return Err(self.denied());
        };
        av.traffic_class = tc;
        av.sl = sl;
        av.flow_label = flow;
        Ok(())
    }

    /// Whether this VM may name `dgid` in an address handle, else `DENIED`.
    /// With a host RNIC (whose VMs all have the host's GID) that is the
    /// host's own GID, where the QP number decides on the data path, or a
    /// remote GID the VM's tenant lists.
    pub(super) fn allowed_ah_gid(&self, dgid: &[u8; 16]) -> Result<(), CmdError> {
        // A multicast group reaches the QPs of the VM's tenant only (the
        // data path's fan-out filters by tenant, spec 18.11.7).
        if self.has(F_MCAST) && is_multicast_gid(dgid) {
            return Ok(());
        }
        if self.rnic.kind() == RnicKind::Verbs {
            if self.port.gids.contains(dgid) || self.tenancy.may_reach_remote(self.port.vm, dgid) {
                return Ok(());
            }
            return Err(self.denied());
        }
        self.allowed_gid(dgid).map(|_| ())
    }

    /// The VM with GID `dgid` if this VM may reach it, else `DENIED`.
    pub(super) fn allowed_gid(&self, dgid: &[u8; 16]) -> Result<usize, CmdError> {
        let me = self.port.vm;
        self.tenancy
            .vm_by_gid(dgid)
            .filter(|&peer| self.tenancy.may_reach(me, peer))
            .ok_or_else(|| self.denied())
    }

    /// The incarnation of the QP an RC QP of this VM addresses with
    /// `dest_qpn` at `dgid`, if that QP is live and in reach (of a VM this
    /// VM may reach, with that GID): what the QP is connected to (spec
    /// 18.23). Nothing is learnt of a QP out of reach: for the requester
    /// it does not exist.
    pub(super) fn dest_incarnation(&self, dgid: &[u8; 16], dest_qpn: u32) -> Option<u64> {
        let me = self.port.vm;
        let o = self.rnic.lookup_qpn(dest_qpn)?;
        if !self.tenancy.may_reach(me, o.vm) {
            return None;
        }
        // A host RNIC gives every VM of the daemon the host's GID.
        let at_gid = if o.vm == me || self.rnic.kind() == RnicKind::Verbs {
            self.port.gids.contains(dgid)
        } else {
            self.tenancy.vm(o.vm).is_some_and(|v| v.gids.contains(dgid))
        };
        at_gid.then_some(o.incarnation)
    }

    /// Checks an RC destination: GID `dgid` must be reachable, and QPN
    /// `dest_qpn`, if a reachable VM owns it, must belong to the VM with that
    /// GID. One hash lookup in the RNIC's QPN table (a shared read lock).
    ///
    /// With a host RNIC: a destination on this host (its GID) must be a
    /// live QP of a VM this VM may reach (the host NIC would deliver to any
    /// QP, of any tenant); a remote one, a GID the tenant lists.
    pub(super) fn allowed_route(&self, dgid: &[u8; 16], dest_qpn: u32) -> Result<(), CmdError> {
        if self.rnic.kind() == RnicKind::Verbs {
            let ok = if self.port.gids.contains(dgid) {
                self.rnic
                    .lookup_qpn(dest_qpn)
                    .is_some_and(|o| self.tenancy.may_reach(self.port.vm, o.vm))
            } else {
                self.tenancy.may_reach_remote(self.port.vm, dgid)
            };
            return if ok { Ok(()) } else { Err(self.denied()) };
        }
        let peer = self.allowed_gid(dgid)?;
        if let Some(Owner { vm: owner, .. }) = self.rnic.lookup_qpn(dest_qpn) {
            if owner != peer && self.tenancy.may_reach(self.port.vm, owner) {
                return Err(self.denied());
            }
        }
        Ok(())
    }
}
