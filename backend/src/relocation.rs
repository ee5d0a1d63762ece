//! What a host RNIC's objects carry when their VM moves to another host
//! (spec 20.8): the transport state of each host QP, which a state saved
//! on the libibverbs transport holds besides the device's objects, and the
//! *move record* the destination gives for the VM's peers.
//!
//! On the libibverbs transport a guest's QP numbers and keys are, when its
//! objects are created, the host NIC's. Another host's NIC gives other
//! numbers, so a VM that moves keeps its numbers as *virtual* ones, each
//! mapped by the destination's RNIC onto its new host object, and every
//! daemon that serves a peer of the VM learns, from the move record, where
//! each connection now leads (GID and host QP number) and which host rkey
//! each virtual rkey now is. Nothing here talks to a NIC: these are the
//! plain values both daemons and the orchestrator between them exchange.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The transport state of one host QP, as the source's NIC had it once
/// every message in flight had completed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostQpState {
    /// The device's QP number (what the guest and its peers know it by).
    pub qpn: u32,
    /// The host QP's number at the source (what the peers' NICs sent to).
    pub host_qpn: u32,
    /// The PSN of the next request it sends.
    pub sq_psn: u32,
    /// The PSN of the next request it expects.
    pub rq_psn: u32,
    /// Where its requests went on the fabric (RC and UC from RTR on): the
    /// destination's GID and host QP number, after any move of the
    /// destination itself.
    pub dest: Option<([u8; 16], u32)>,
    /// The destination's rkeys, virtual to host, if the destination moved
    /// (its requests carry the guest's rkeys and are translated).
    pub rkeys: Vec<(u32, u32)>,
}

/// The host halves of a VM's QPs in a saved state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The GID the source's host QPs sent from.
    pub gid: [u8; 16],
    /// Every QP with a host half that had left RESET.
    pub qps: Vec<HostQpState>,
}

impl HostState {
    /// The entry of the device's QP number `qpn`.
    pub fn qp(&self, qpn: u32) -> Option<&HostQpState> {
        self.qps.iter().find(|q| q.qpn == qpn)
    }
}

/// How a VM's QPs are known on the wire now: what its peers' daemons
/// hold before it moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireQps {
    /// The GID they send from.
    pub gid: [u8; 16],
    /// Each QP's device number and host number.
    pub qps: Vec<(u32, u32)>,
}

/// Where the QPs and regions of a VM that moved are now: what the
/// destination's daemon gives (`ctl move-record`), and what every daemon
/// with a peer of the VM takes (`ctl peer-moved`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// The VM's name.
    pub vm: String,
    /// The GID its QPs sent from before the move.
    pub from_gid: [u8; 16],
    /// The GID they send from now.
    pub to_gid: [u8; 16],
    /// Per QP: its host QP number before the move and now.
    pub qps: Vec<(u32, u32)>,
    /// Per region with an rkey: the rkey the guest knows (virtual) and
    /// the host's now.
    pub rkeys: Vec<(u32, u32)>,
}

/// Where one connection's destination is now, as a peer's daemon keeps
/// it from a [`MoveRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedQp {
    /// The destination's GID now.
    pub gid: [u8; 16],
    /// Its host QP number now.
    pub qpn: u32,
    /// Its VM's rkeys, virtual to host.
    pub rkeys: std::sync::Arc<HashMap<u32, u32>>,
}

impl MoveRecord {
    /// Checks the record's shape: no QP or rkey listed twice, no zero
    /// number, at most `max` entries of each. A record comes from the
    /// operator's orchestrator, but a wrong one would re-point peers'
    /// connections: it is refused whole.
    pub fn check(&self, max: usize) -> Result<(), String> {
        if self.qps.len() > max || self.rkeys.len() > max {
            return Err(format!("more than {max} QPs or rkeys"));
        }
        let mut seen = std::collections::HashSet::new();
        for &(from, to) in &self.qps {
            if from == 0 || to == 0 || !seen.insert(from) {
                return Err(format!("QP {from:#x}: zero or listed twice"));
            }
        }
        seen.clear();
        for &(v, h) in &self.rkeys {
            if v == 0 || h == 0 || !seen.insert(v) {
                return Err(format!("rkey {v:#x}: zero or listed twice"));
            }
        }
        Ok(())
    }

    /// Each moved QP, by where it was (GID, host QP number), with where it
    /// is now.
    pub fn entries(&self) -> Vec<(([u8; 16], u32), MovedQp)> {
        let rkeys = std::sync::Arc::new(self.rkeys.iter().copied().collect::<HashMap<_, _>>());
        self.qps
            .iter()
            .map(|&(from, to)| {
                (
                    (self.from_gid, from),
                    MovedQp {
                        gid: self.to_gid,
                        qpn: to,
                        rkeys: rkeys.clone(),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> MoveRecord {
        MoveRecord {
            vm: "m".into(),
            from_gid: [1; 16],
            to_gid: [2; 16],
            qps: vec![(0x11, 0x13), (0x12, 0x11)],
            rkeys: vec![(0x100, 0x200)],
        }
    }

    #[test]
    fn a_record_names_each_connection_by_where_it_was() {
        let r = record();
        r.check(16).unwrap();
        let e = r.entries();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0, ([1; 16], 0x11));
        assert_eq!(e[0].1.gid, [2; 16]);
        assert_eq!(e[0].1.qpn, 0x13);
        assert_eq!(e[1].1.rkeys.get(&0x100), Some(&0x200));
    }

    #[test]
    fn a_record_with_a_repeat_a_zero_or_too_many_entries_is_refused() {
        let mut r = record();
        r.qps.push((0x11, 0x14));
        assert!(r.check(16).is_err());
        let mut r = record();
        r.rkeys.push((0, 5));
        assert!(r.check(16).is_err());
        let mut r = record();
        r.qps.push((0x20, 0));
        assert!(r.check(16).is_err());
        assert!(record().check(1).is_err());
    }
}
