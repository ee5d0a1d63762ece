//! The multicast groups a VM's UD QPs are attached to (`F_MCAST`, spec
//! 12.27, 18.11.7): kept here for the limits and for the QP's destruction,
//! and in the RNIC's registry, which the data path reads to fan a message
//! out.

use std::collections::HashMap;

use virtio_rdma_abi::verbs::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH};

use super::VmResources;
use crate::rnic_objects::{Owner, RnicError, RnicObjects};

/// Why an attach was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachError {
    /// The VM's QPs are in `MAX_MCAST_GRP` groups already.
    Groups,
    /// `MAX_MCAST_QP_ATTACH` QPs of the VM are in the group already.
    Members,
    /// The RNIC refused.
    Rnic(RnicError),
}

/// Group -> the handles of the VM's QPs attached to it.
pub type Groups = HashMap<[u8; 16], Vec<u32>>;

impl VmResources {
    fn qp_owner(&self, h: u32) -> Option<Owner> {
        let q = self.qps.get(h)?;
        Some(Owner {
            incarnation: q.incarnation,
            ..self.owner(h)
        })
    }

    /// Attaches QP `h` (a UD QP, checked) to `mgid`; attaching it again
    /// changes nothing.
    pub fn attach_mcast(
        &mut self,
        h: u32,
        mgid: &[u8; 16],
        t: &dyn RnicObjects,
    ) -> Result<(), AttachError> {
        let owner = self
            .qp_owner(h)
            .ok_or(AttachError::Rnic(RnicError::Invalid))?;
        match self.mcast.get(mgid) {
            Some(qps) if qps.contains(&h) => return Ok(()),
            Some(qps) if qps.len() >= MAX_MCAST_QP_ATTACH as usize => {
                return Err(AttachError::Members)
            }
            None if self.mcast.len() >= MAX_MCAST_GRP as usize => return Err(AttachError::Groups),
            _ => {}
        }
        t.mcast_attach(owner, mgid).map_err(AttachError::Rnic)?;
        self.mcast.entry(*mgid).or_default().push(h);
        Ok(())
    }

    /// Detaches QP `h` from `mgid`; false if it was not attached.
    pub fn detach_mcast(&mut self, h: u32, mgid: &[u8; 16], t: &dyn RnicObjects) -> bool {
        let Some(qps) = self.mcast.get_mut(mgid) else {
            return false;
        };
        let Some(i) = qps.iter().position(|&q| q == h) else {
            return false;
        };
        qps.swap_remove(i);
        if qps.is_empty() {
            self.mcast.remove(mgid);
        }
        if let Some(owner) = self.qp_owner(h) {
            t.mcast_detach(owner, mgid);
        }
        true
    }

    /// Whether QP `h` is attached to `mgid`.
    pub fn mcast_attached(&self, h: u32, mgid: &[u8; 16]) -> bool {
        self.mcast.get(mgid).is_some_and(|qps| qps.contains(&h))
    }

    /// Detaches QP `h` from every group (it is being destroyed).
    pub(super) fn detach_all_mcast(&mut self, h: u32, t: &dyn RnicObjects) {
        if self.mcast.is_empty() {
            return;
        }
        let groups: Vec<[u8; 16]> = self
            .mcast
            .iter()
            .filter(|(_, qps)| qps.contains(&h))
            .map(|(g, _)| *g)
            .collect();
        for g in groups {
            self.detach_mcast(h, &g, t);
        }
    }
}
