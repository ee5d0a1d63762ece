//! Management datagrams (spec 18.26): what a GSI QP sends. A MAD goes to
//! the GSI QP — QP 1 — of the VM whose GID table holds its destination
//! GID, if that VM is in the sender's tenant network and the sender's MAD
//! rate (`mad_per_sec`) allows; it is otherwise dropped, and every drop is
//! counted in the sender's `mad_dropped`. QP 1 is found in the
//! destination VM, under its lock: its number is every VM's, not one of
//! the RNIC's.

use std::time::Instant;

use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::qp::{GSI_QKEY, GSI_QPN};

use super::request::{Request, RespOutcome, RespScratch};
use super::responder::respond;
use super::route::{respond_in, same_thread, source_gid};
use crate::engine::sge::local_range;
use crate::memory::access::Segment;
use crate::rnic_path::{Outgoing, Serving};
use crate::stats::TrafficCounters;
use crate::tenancy::{IsolationCounters, Tenancy};
use crate::vm::cell::Locked;
use crate::vm::VmState;

/// Sends MAD `msg` of VM `cx.vm`'s GSI QP and returns the outcome: `Done`,
/// `Dropped` (counted), or `Busy` (the destination's lock was busy: the
/// WQE is tried again and its MAD was not charged to the rate); or the
/// requester's error status when its local buffers fail their checks
/// (keys, rights, bounds), which a message that goes nowhere fails too.
pub(super) fn transmit(
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    msg: &Outgoing<'_>,
    local: &mut Vec<Segment>,
    resp: &mut RespScratch,
) -> Result<RespOutcome, WcStatus> {
    local_range(cx.state, msg.pd, msg.wr.sges, false, 0, msg.len, local)?;
    // The pages may have left the memory table since the key was made
    // (spec 19.6.2): the sender's protection error.
    if !local.iter().all(|s| cx.mem.covers(s.gpa, s.len)) {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    let Some(peer) = destination(tenancy, cx, &msg.av.dgid) else {
        return Ok(dropped(tenancy, cx.vm));
    };
    if !cx.state.take_mad(Instant::now()) {
        return Ok(dropped(tenancy, cx.vm));
    }
    let req = Request {
        admitted: false,
        wr: msg.wr,
        qp_type: msg.qp_type,
        vm: cx.vm,
        src_qpn: GSI_QPN,
        // The entry of the sender's own table its AH names: a MAD cannot
        // claim another VM's GID.
        src_gid: source_gid(cx.state, &msg.av),
        av: msg.av,
        local,
        len: msg.len,
        part: (0, msg.len),
        mem: cx.mem,
        dest_qpn: GSI_QPN,
        qkey: GSI_QKEY,
    };
    Ok(match deliver(cx, peer, &req, resp) {
        RespOutcome::Done => RespOutcome::Done,
        RespOutcome::Busy => {
            cx.state.give_back_mad();
            RespOutcome::Busy
        }
        // No GSI QP there, not receiving, no receive WQE posted, a
        // receive WQE that cannot take it: dropped, as UD drops.
        _ => dropped(tenancy, cx.vm),
    })
}

/// The VM a MAD to `dgid` goes to: the one whose table holds it, if it is
/// of the sender's tenant (a MAD to another tenant's GID also counts in
/// the sender's `foreign_drops`) and served by the same engine thread.
fn destination(tenancy: &Tenancy, cx: &Serving<'_>, dgid: &[u8; 16]) -> Option<usize> {
    let me = cx.vm;
    let peer = tenancy.vm_by_gid(dgid)?;
    if !tenancy.may_reach(me, peer) {
        if let Some(c) = tenancy.counters(me) {
            IsolationCounters::bump(&c.foreign_drops);
        }
        return None;
    }
    // A tenant's VMs share a thread: this only guards that invariant (the
    // engine never locks a VM of another thread).
    same_thread(cx.vms, me, peer).then_some(peer)
}

/// Hands MAD `req` to the GSI QP of VM `peer` (this VM itself, or another
/// locked for it).
fn deliver(
    cx: &mut Serving<'_>,
    peer: usize,
    req: &Request<'_>,
    resp: &mut RespScratch,
) -> RespOutcome {
    if peer == cx.vm {
        return match cx.state.res.gsi_qp() {
            Some(h) => respond(cx.state, cx.mem, h, req, true, resp),
            None => RespOutcome::Dropped,
        };
    }
    let Some(dev) = cx.vms.get(peer).and_then(Option::as_ref) else {
        return RespOutcome::Dropped;
    };
    // A stopped device takes no message (spec 15.1); checked again under
    // its lock.
    if !dev.running() {
        return RespOutcome::Dropped;
    }
    let gsi_qp = |pstate: &VmState| pstate.res.gsi_qp().ok_or(RespOutcome::Dropped);
    match respond_in(dev, gsi_qp, req, true, resp) {
        Locked::Ran(out) => out,
        Locked::Busy => RespOutcome::Busy,
        Locked::Gone => RespOutcome::Dropped,
    }
}

/// A MAD of VM `vm` dropped: counted in its `mad_dropped` (the engine adds
/// it to `drops` as every dropped datagram).
fn dropped(tenancy: &Tenancy, vm: usize) -> RespOutcome {
    if let Some(t) = tenancy.traffic(vm) {
        TrafficCounters::add_single_writer(&t.mad_dropped, 1);
    }
    RespOutcome::Dropped
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use virtio_rdma_abi::datapath::{SendWqe, WcOpcode, WrOpcode};
    use virtio_rdma_abi::qp::{AddressVector, QpType};
    use vm_memory::GuestAddress;

    use super::*;
    use crate::config::{DaemonConfig, Limits, TenantConfig};
    use crate::memory::HostMem;
    use crate::rnic::soft::SoftRnic;
    use crate::rnic_objects::RnicObjects;
    use crate::rnic_path::{Room, SendWr};
    use crate::vm::{PortIdentity, VmState};

    /// What the control path never lets a guest build — an AH to another
    /// tenant's GID (`CREATE_AH` refuses it with `DENIED`) — still takes a
    /// MAD nowhere on the data path, and is counted; so is a MAD to a GID
    /// of nobody.
    #[test]
    fn a_mad_outside_the_tenant_is_dropped_and_counted() {
        let mut config = DaemonConfig::new(vec!["/n/a.sock".into(), "/n/b.sock".into()]);
        config.tenants.push(TenantConfig {
            nic_share: 1,
            name: "red".into(),
            qos_class: None,
            engine: None,
            remote_gids: Vec::new(),
            fabric: Default::default(),
        });
        config.vms[1].tenant = "red".into();
        let tenancy = Tenancy::from_config(&config);
        let rnic: Arc<dyn RnicObjects> = Arc::new(SoftRnic::new());
        let port = PortIdentity {
            gids: config.gid_table(0),
            guid: 1,
            vm: 0,
        };
        let mut state = VmState::new(Limits::default(), rnic, port, Arc::new(Tenancy::default()));
        state.set_running(true);
        let gm = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
        let host = HostMem::new(Arc::new(gm));
        let mad = [7u8; 256];
        let wr = SendWr {
            hdr: SendWqe {
                opcode: WrOpcode::SEND as u8,
                remote_qpn: GSI_QPN,
                ..SendWqe::default()
            },
            opcode: WrOpcode::SEND,
            sges: &[],
            inline: Some(&mad),
        };
        let mut local = Vec::new();
        let mut resp = RespScratch::new();
        let mut send = |state: &mut VmState, dgid: [u8; 16]| {
            let msg = Outgoing {
                op: WcOpcode::SEND,
                qp: 1,
                index: 0,
                wr: &wr,
                pd: 1,
                src_qpn: GSI_QPN,
                qp_type: QpType::GSI,
                dest_qpn: GSI_QPN,
                av: AddressVector {
                    dgid,
                    sgid_index: 1,
                    ..AddressVector::default()
                },
                qkey: GSI_QKEY,
                writes_local: false,
                signaled: true,
                len: 256,
                room: Room {
                    max_bytes: 1 << 20,
                    moved: 0,
                },
            };
            let mut cx = Serving {
                vms: &[],
                vm: 0,
                state,
                mem: &host,
            };
            transmit(&tenancy, &mut cx, &msg, &mut local, &mut resp)
        };
        // VM 1 of tenant "red".
        let r = send(&mut state, config.gid(1));
        assert!(matches!(r, Ok(RespOutcome::Dropped)), "{r:?}");
        let counts = |t: &Tenancy| {
            (
                t.traffic(0).map(|c| c.snapshot().mad_dropped),
                t.counters(0).map(|c| c.snapshot().foreign_drops),
            )
        };
        assert_eq!(counts(&tenancy), (Some(1), Some(1)));
        // A GID nobody has.
        let r = send(&mut state, [0xfd; 16]);
        assert!(matches!(r, Ok(RespOutcome::Dropped)), "{r:?}");
        assert_eq!(counts(&tenancy), (Some(2), Some(1)));
        // Nothing of the MAD rate was spent on them.
        assert!((0..64).all(|_| state.take_mad(Instant::now())));
    }
}
