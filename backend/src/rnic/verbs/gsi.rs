//! Each VM's GSI QP on the libibverbs transport: QP 1 of the device, with
//! no host QP (the host port's QP 1 is the host kernel's). Its rings are
//! the guest's and the engine serves them as on the software RNIC: a CM
//! MAD the guest sends goes to the CM bridge ([`super::cm`]), within the
//! VM's MAD rate; the MADs the bridge answers with wait in the VM's inbox
//! ([`super::cm_hub`]) and are placed in QP 1's receive queue as a UD
//! receive is (the engine's ring, SGE and completion pieces), behind a GRH
//! whose source is the peer's GID. Whatever the bridge does not take
//! (another class, a CM message that fits no connection of the VM) is
//! dropped and counted in `mad_dropped` and `cm_dropped`.

use std::time::Instant;

use virtio_rdma_abi::datapath::{
    ud_grh_payload_length, Cqe, QpDoorbell, Sge, UdGrh, WcOpcode, WcStatus, CQE_GRH, UD_GRH_SIZE,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType, GSI_QPN, MAX_MAD_BYTES};

use super::cm::bridge::GuestVerdict;
use super::rnic::VerbsRnic;
use super::scratch::Scratch;
use crate::engine::completer::{complete, error_cqe};
use crate::engine::doorbell::{self, load_pi};
use crate::engine::requester::{complete_send, Completion};
use crate::engine::sge::{local_range, local_segments};
use crate::engine::wqe::{fetch_recv, posted, RecvRing, WqeBuf, WqeError};
use crate::memory::{access, HostMem};
use crate::rnic_path::{Outgoing, Serving, Step};
use crate::stats::TrafficCounters;
use crate::tenancy::Tenancy;
use crate::vm::VmState;

/// MADs placed in one VM's GSI QP per service (the rest wait for the
/// next: the engine's fairness between VMs).
const DELIVER_BATCH: usize = 16;

/// Sends GSI WQE `msg` (checked by the engine: SEND, to QP 1, at most a
/// MAD) of the VM being served: its MAD goes to the CM bridge. The WQE
/// completes now: successfully whether the bridge took the MAD or not (a
/// fabric drops MADs too), with the requester's error if its buffers fail
/// their checks.
pub(super) fn send(
    rnic: &VerbsRnic,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    ts: &mut Scratch,
    moved: &mut u64,
    msg: &Outgoing<'_>,
) -> Step {
    let (wr, mem, vm) = (msg.wr, cx.mem, cx.vm);
    let mut buf = [0u8; MAX_MAD_BYTES as usize];
    let read = match usize::try_from(msg.len).ok().and_then(|n| buf.get_mut(..n)) {
        None => Err(WcStatus::LOC_LEN_ERR),
        Some(out) => match wr.inline {
            Some(data) if data.len() == out.len() => {
                out.copy_from_slice(data);
                Ok(out.len())
            }
            Some(_) => Err(WcStatus::LOC_LEN_ERR),
            None => gather(cx.state, msg, &mut ts.segs, out, mem).map(|()| out.len()),
        },
    };
    let n = match read {
        Ok(n) => n,
        Err(status) => {
            let c = Completion::failed(wr.hdr.wr_id, msg.op, status);
            return complete_send(cx.state, mem, msg.qp, msg.index, c);
        }
    };
    *moved = msg.len;
    let mad = buf.get(..n).unwrap_or_default();
    let verdict = if cx.state.take_mad(Instant::now()) {
        let state: &VmState = cx.state;
        let owns = |qpn: u32| owns_rc(rnic, state, vm, qpn);
        let dgid = msg.av.dgid;
        rnic.with_cm(|s| s.guest_mad(vm, dgid, mad, owns))
    } else {
        None
    };
    if verdict != Some(GuestVerdict::Taken) {
        dropped(tenancy, vm, 1);
    }
    if let (Some(GuestVerdict::Dropped(_)), Some(t)) = (verdict, tenancy.traffic(vm)) {
        TrafficCounters::add_single_writer(&t.cm_dropped, 1);
    }
    if !msg.signaled {
        return Step::Done { published: false };
    }
    let byte_len = u32::try_from(msg.len).unwrap_or(u32::MAX);
    let c = Completion::ok(wr.hdr.wr_id, msg.op, byte_len);
    complete_send(cx.state, mem, msg.qp, msg.index, c)
}

/// Reads the MAD of `msg` from its scatter list into `out`, after the
/// requester's checks of the local buffers (keys, rights, bounds, RAM).
fn gather(
    state: &VmState,
    msg: &Outgoing<'_>,
    segs: &mut Vec<access::Segment>,
    out: &mut [u8],
    mem: &HostMem,
) -> Result<(), WcStatus> {
    local_range(state, msg.pd, msg.wr.sges, false, 0, msg.len, segs)?;
    if !segs.iter().all(|s| mem.covers(s.gpa, s.len)) {
        return Err(WcStatus::LOC_PROT_ERR);
    }
    access::read(mem, segs, out).map_err(|_| WcStatus::LOC_PROT_ERR)
}

/// Whether `qpn` is an RC QP of VM `vm` (a REQ or REP may name only those).
fn owns_rc(rnic: &VerbsRnic, state: &VmState, vm: usize, qpn: u32) -> bool {
    use crate::rnic_objects::RnicObjects;
    rnic.lookup_qpn(qpn).is_some_and(|o| {
        o.vm == vm
            && state
                .res
                .qps
                .get(o.handle)
                .is_some_and(|q| q.qpn == qpn && q.qp_type == QpType::RC)
    })
}

/// Places the MADs the CM bridge queued for the VM being served in its
/// GSI QP (at most [`DELIVER_BATCH`]); true if there was anything to do.
pub(super) fn deliver(
    rnic: &VerbsRnic,
    tenancy: &Tenancy,
    cx: &mut Serving<'_>,
    ts: &mut Scratch,
) -> bool {
    let Some(hub) = rnic.cm() else {
        return false;
    };
    let vm = cx.vm;
    let inbox = hub.inboxes();
    let lost = inbox.take_lost(vm);
    if lost > 0 {
        dropped(tenancy, vm, lost);
    }
    let Scratch {
        mads, wqe, segs, ..
    } = ts;
    mads.clear();
    inbox.take(vm, DELIVER_BATCH, mads);
    if mads.is_empty() {
        return lost > 0;
    }
    // Sent to the VM's GID: the host port's, every VM's on this RNIC.
    let dgid = rnic.device().gid().0;
    for m in mads.drain(..) {
        let grh = UdGrh {
            traffic_class: 0,
            flow_label: 0,
            payload_length: ud_grh_payload_length(m.mad.len() as u64, false),
            hop_limit: MAD_HOP_LIMIT,
            sgid: m.sgid,
            dgid,
        };
        if !place(cx.state, cx.mem, &grh, &m.mad, wqe, segs) {
            dropped(tenancy, vm, 1);
        }
    }
    if inbox.pending(vm) {
        rnic.wake(vm);
    }
    true
}

/// Hop limit of the GRH of a MAD from another host (routed RoCEv2).
const MAD_HOP_LIMIT: u8 = 64;

/// Places `mad` behind `grh` in the head receive WQE of the VM's GSI QP
/// and writes its completion (`CQE_GRH`, `src_qpn` 1: spec 18.26), as a
/// UD QP receives (spec 18.13). False when it is dropped: no GSI QP, the
/// device stopped, the QP not receiving (RTR, RTS, SQD), no receive WQE
/// posted; or a WQE that cannot take it, which completes with its error
/// and fails the QP (a broken receive queue fails it with `QP_FATAL`).
fn place(
    state: &mut VmState,
    mem: &HostMem,
    grh: &UdGrh,
    mad: &[u8],
    wqe: &mut WqeBuf,
    segs: &mut Vec<access::Segment>,
) -> bool {
    let Some(h) = state.res.gsi_qp() else {
        return false;
    };
    let Some(q) = state.res.qps.get(h) else {
        return false;
    };
    if !state.running() || !matches!(q.state, QpState::RTR | QpState::RTS | QpState::SQD) {
        return false;
    }
    let (pd, cq, index) = (q.pd, q.recv_cq, q.rt.rq_ci);
    let pi = load_pi(mem, q.db_gpa, q.db_slot.as_ref(), doorbell::RQ);
    let Some(n) = pi.and_then(|pi| posted(pi, index, q.rq_depth)) else {
        // Its record left guest RAM, or the driver claims more than the
        // ring holds: nothing of the queue can be trusted (spec 18.18).
        state.qp_enter_err(h, Some(EventKind::QP_FATAL));
        return false;
    };
    if n == 0 {
        return false;
    }
    let (wr_id, placed) = match fetch_recv(mem, &RecvRing::of_qp(q), index, wqe) {
        Ok(wr) => (wr.wr_id, write(state, mem, pd, wr.sges, grh, mad, segs)),
        Err(WqeError::Malformed { wr_id, .. }) => (wr_id, Err(WcStatus::LOC_QP_OP_ERR)),
        Err(WqeError::Unusable) => {
            state.qp_enter_err(h, Some(EventKind::QP_FATAL));
            return false;
        }
    };
    if let Some(q) = state.res.qps.get_mut(h) {
        q.rt.rq_ci = q.rt.rq_ci.wrapping_add(1);
        let _ = doorbell::store(mem, q.db_gpa, QpDoorbell::RQ_CI, q.rt.rq_ci);
    }
    let cqe = match placed {
        Ok(len) => Cqe {
            wr_id,
            opcode: WcOpcode::RECV as u8,
            status: WcStatus::SUCCESS as u8,
            flags: CQE_GRH,
            owner: 0,
            byte_len: len,
            imm_data: 0,
            qpn: GSI_QPN,
            src_qpn: GSI_QPN,
            vendor_err: 0,
        },
        Err(status) => error_cqe(wr_id, WcOpcode::RECV, status, GSI_QPN),
    };
    let ok = placed.is_ok();
    if !complete(state, mem, cq, cqe) || !ok {
        state.qp_enter_err(h, None);
    }
    ok
}

/// Writes `grh` and `mad` into the buffers `sges` of a receive WQE of a
/// QP in PD `pd`, after the checks of every SGE and of the room; the bytes
/// written.
fn write(
    state: &VmState,
    mem: &HostMem,
    pd: u32,
    sges: &[Sge],
    grh: &UdGrh,
    mad: &[u8],
    segs: &mut Vec<access::Segment>,
) -> Result<u32, WcStatus> {
    let header = grh.to_bytes();
    let needed = header.len().saturating_add(mad.len());
    let want = u64::try_from(needed).map_err(|_| WcStatus::LOC_LEN_ERR)?;
    if local_segments(state, pd, sges, true, want, segs)? < want {
        return Err(WcStatus::LOC_LEN_ERR);
    }
    let mut msg = [0u8; UD_GRH_SIZE as usize + MAX_MAD_BYTES as usize];
    let out = msg.get_mut(..needed).ok_or(WcStatus::LOC_LEN_ERR)?;
    let (head, body) = out.split_at_mut(header.len());
    head.copy_from_slice(&header);
    body.copy_from_slice(mad);
    access::write(mem, segs, out).map_err(|_| WcStatus::LOC_PROT_ERR)?;
    u32::try_from(needed).map_err(|_| WcStatus::LOC_LEN_ERR)
}

/// `n` MADs of VM `vm` dropped: counted in its `mad_dropped` and `drops`.
fn dropped(tenancy: &Tenancy, vm: usize, n: u64) {
    if let Some(t) = tenancy.traffic(vm) {
        TrafficCounters::add_single_writer(&t.mad_dropped, n);
        TrafficCounters::add_single_writer(&t.drops, n);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use virtio_rdma_abi::datapath::RecvWqe;
    use virtio_rdma_abi::mem::{access as acc, CQE_SIZE};
    use virtio_rdma_abi::qp::GSI_QKEY;
    use virtio_rdma_abi::{Field, Wire};
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::config::{DaemonConfig, Limits};
    use crate::engine::testing;
    use crate::resources::{Cq, Mr};
    use crate::rnic_objects::RnicObjects;
    use crate::tenancy::Tenancy;
    use crate::vm::PortIdentity;

    const CQ_RING: u64 = 0x4000;
    const CQ_DB: u64 = 0x8000;
    const PAGE: u64 = 0xa000;
    const IOVA: u64 = 0x10_0000;
    const PEER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
    const ME: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];

    /// The QP's ring: two pages (the receive queue starts the second).
    const SQ_PAGE: u64 = 0x2000;
    const RQ_PAGE: u64 = 0x3000;

    fn two_pages(gm: &crate::memory::GuestRam) -> crate::memory::PageList {
        use crate::memory::pagelist::PageListLimits;
        use virtio_rdma_abi::mem::{BufferDesc, PageListMode};
        let desc = BufferDesc {
            addr: 0,
            npages: 2,
            first_page_offset: 0,
            page_shift: 12,
            mode: PageListMode::INLINE as u32,
        };
        let limits = PageListLimits {
            max_pages: 2,
            max_inline: 2,
            page_size_cap: 1 << 12,
            max_list_bytes: u64::MAX,
        };
        let mut list = SQ_PAGE.to_le_bytes().to_vec();
        list.extend_from_slice(&RQ_PAGE.to_le_bytes());
        let ram = crate::memory::RamMap::from_guest_memory(gm);
        crate::memory::PageList::resolve(&desc, &list, &limits, &ram, gm).unwrap()
    }

    /// A running VM with its GSI QP in RTS (one CQ, a region at [`IOVA`]
    /// over the guest page [`PAGE`]).
    struct World {
        gm: crate::memory::GuestRam,
        host: HostMem,
        vm: VmState,
        qp: u32,
        lkey: u32,
        posted: u32,
    }

    impl World {
        fn new() -> World {
            let gm = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
            let host = HostMem::new(Arc::new(gm.clone()));
            let config = DaemonConfig::new(vec!["/nonexistent/vm0.sock".into()]);
            let tenancy = Arc::new(Tenancy::from_config(&config));
            let rnic: Arc<dyn RnicObjects> = Arc::new(testing::Numbers::default());
            let port = PortIdentity {
                gids: crate::gid_table::GidTable::single(ME),
                guid: 1,
                vm: 0,
            };
            let mut vm = VmState::new(Limits::default(), rnic.clone(), port, tenancy);
            vm.set_running(true);
            let cq = Cq {
                ctx: 1,
                depth: 16,
                db_gpa: CQ_DB,
                ring: testing::one_page(CQ_RING, &gm),
                users: 0,
                rt: Default::default(),
            };
            let cq = vm.res.insert_cq(cq, rnic.as_ref()).unwrap();
            let region = Mr {
                pd: 1,
                ctx: 1,
                access: acc::LOCAL_WRITE,
                iova: IOVA,
                length: 0x1000,
                first_page_offset: 0,
                lkey: 0,
                rkey: 0,
                pages: testing::one_page(PAGE, &gm),
                host_lost: false,
                keyed: false,
                fast: None,
            };
            let (_, keys) = vm.res.insert_mr(region, rnic.as_ref()).unwrap();
            let mut qp = testing::qp(QpType::GSI);
            (qp.send_cq, qp.recv_cq) = (cq, cq);
            qp.ring = two_pages(&gm);
            qp.attr.qkey = GSI_QKEY;
            let (qp, qpn) = vm.res.insert_qp(qp, rnic.as_ref()).unwrap();
            assert_eq!((qpn, vm.res.gsi_qp()), (GSI_QPN, Some(qp)));
            World {
                gm,
                host,
                vm,
                qp,
                lkey: keys.lkey,
                posted: 0,
            }
        }

        /// Posts a receive WQE (`wr_id`) of one SGE of `len` bytes at
        /// `off` in the region.
        fn post(&mut self, wr_id: u64, off: u64, len: u32) {
            let q = self.vm.res.qps.get(self.qp).unwrap();
            let stride = 1u64 << q.layout.rq_wqe_shift;
            // The receive queue starts the ring's second page.
            assert_eq!(q.layout.rq_offset, 0x1000);
            let at = RQ_PAGE + u64::from(self.posted % q.rq_depth) * stride;
            let hdr = RecvWqe {
                wr_id,
                num_sge: 1,
                reserved: 0,
            };
            let sge = Sge {
                addr: IOVA + off,
                length: len,
                lkey: self.lkey,
            };
            let mut b = hdr.to_bytes().to_vec();
            b.extend_from_slice(&sge.to_bytes());
            self.gm.write_slice(&b, GuestAddress(at)).unwrap();
            self.posted += 1;
            doorbell::store(&self.host, q.db_gpa, QpDoorbell::RQ_PI, self.posted).unwrap();
        }

        fn place(&mut self, mad: &[u8]) -> bool {
            let grh = UdGrh {
                traffic_class: 0,
                flow_label: 0,
                payload_length: ud_grh_payload_length(mad.len() as u64, false),
                hop_limit: MAD_HOP_LIMIT,
                sgid: PEER,
                dgid: ME,
            };
            let (mut wqe, mut segs) = (WqeBuf::new(), Vec::new());
            place(&mut self.vm, &self.host, &grh, mad, &mut wqe, &mut segs)
        }

        fn cqe(&self, i: u64) -> Cqe {
            let mut b = [0u8; CQE_SIZE as usize];
            let at = GuestAddress(CQ_RING + i * u64::from(CQE_SIZE));
            self.gm.read_slice(&mut b, at).unwrap();
            Cqe::read(&b)
        }

        fn state(&self) -> QpState {
            self.vm.res.qps.get(self.qp).unwrap().state
        }
    }

    /// A MAD lands behind its GRH in the head receive WQE, which completes
    /// as a GSI receive; without a receive WQE it is dropped and nothing
    /// moves.
    #[test]
    fn a_mad_arrives_behind_its_grh_with_the_gsi_receives_cqe() {
        let mut w = World::new();
        let mad: Vec<u8> = (0..256u32).map(|i| (i * 7 % 251) as u8).collect();
        assert!(!w.place(&mad), "no receive posted");
        assert_eq!(w.vm.res.qps.get(w.qp).unwrap().rt.rq_ci, 0);
        w.post(0x77, 0, 296);
        assert!(w.place(&mad));
        let mut got = [0u8; 296];
        w.gm.read_slice(&mut got, GuestAddress(PAGE)).unwrap();
        let grh = UdGrh::parse(got[..40].try_into().unwrap()).unwrap();
        assert_eq!((grh.sgid, grh.dgid, grh.hop_limit), (PEER, ME, 64));
        assert_eq!(&got[40..], &mad[..]);
        let c = w.cqe(0);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (0x77, 0, WcOpcode::RECV as u8)
        );
        assert_eq!(
            (c.flags, c.byte_len, c.qpn, c.src_qpn),
            (CQE_GRH, 296, 1, 1)
        );
        let q = w.vm.res.qps.get(w.qp).unwrap();
        assert_eq!(q.rt.rq_ci, 1);
        assert_eq!(doorbell::load(&w.host, q.db_gpa, QpDoorbell::RQ_CI), Ok(1));
        assert!(!w.place(&mad), "its one receive is used");
        assert_eq!(w.state(), QpState::RTS);
    }

    /// A receive WQE too small for the GRH and the MAD completes with
    /// `LOC_LEN_ERR` and fails the QP, as a UD receive does; a QP that
    /// does not receive (INIT) or a stopped device takes nothing.
    #[test]
    fn what_cannot_take_a_mad() {
        let mut w = World::new();
        let mad = [5u8; 256];
        w.post(1, 0, 100);
        w.vm.res.qps.get_mut(w.qp).unwrap().state = QpState::INIT;
        assert!(!w.place(&mad), "INIT does not receive");
        w.vm.res.qps.get_mut(w.qp).unwrap().state = QpState::RTS;
        w.vm.set_running(false);
        assert!(!w.place(&mad), "stopped");
        w.vm.set_running(true);
        assert_eq!(
            w.vm.res.qps.get(w.qp).unwrap().rt.rq_ci,
            0,
            "nothing consumed"
        );
        assert!(!w.place(&mad));
        let c = w.cqe(0);
        assert_eq!((c.wr_id, c.status), (1, WcStatus::LOC_LEN_ERR as u8));
        assert_eq!(w.state(), QpState::ERR);
        let mut first = [0u8; 8];
        w.gm.read_slice(&mut first, GuestAddress(PAGE)).unwrap();
        assert_eq!(first, [0; 8], "nothing written");
    }
}
