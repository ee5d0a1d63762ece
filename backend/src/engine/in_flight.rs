//! Tests of work an RNIC takes now and completes later (a host NIC's way):
//! the requester moves the send queue on at once and writes the CQEs in
//! order when the RNIC reports them; the flush waits for what it took.

use std::sync::Arc;

use virtio_rdma_abi::datapath::{
    Cqe, QpDoorbell, SendWqe, WcOpcode, WcStatus, WrOpcode, WQE_SIGNALED,
};
use virtio_rdma_abi::mem::CQE_SIZE;
use virtio_rdma_abi::qp::{QpState, QpType};
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use super::flush::flush;
use super::poll::owes_flush;
use super::requester::{complete_posted, Completion};
use super::scratch::Scratch;
use super::wqe::WqeBuf;
use super::{doorbell, testing, Engine};
use crate::config::{DaemonConfig, Limits};
use crate::memory::volatile::{read_guest, write_guest};
use crate::memory::HostMem;
use crate::resources::Cq;
use crate::rnic_objects::RnicObjects;
use crate::rnic_path::{Outgoing, RnicPath, Serving, Step};
use crate::tenancy::Tenancy;
use crate::vm::{PortIdentity, VmState};

/// An RNIC data path that takes every work request and completes it only
/// when polled, as a host NIC does.
struct Deferred;

impl RnicPath for Deferred {
    type Scratch = Vec<(u32, u64, WcOpcode)>;
    type Burst<'a> = ();

    fn post_send(
        &self,
        _cx: &mut Serving<'_>,
        _burst: &mut (),
        ts: &mut Self::Scratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step {
        ts.push((msg.qp, msg.wr.hdr.wr_id, msg.op));
        *moved = msg.len;
        Step::InFlight
    }

    fn poll(&self, cx: &mut Serving<'_>, ts: &mut Self::Scratch) -> bool {
        let any = !ts.is_empty();
        for (h, wr_id, op) in ts.drain(..) {
            complete_posted(cx.state, cx.mem, h, Completion::ok(wr_id, op, 0));
        }
        any
    }
}

const CQ_RING: u64 = 0x4000;
const CQ_DB: u64 = 0x8000;

/// A VM with an RC QP in RTS whose send CQ is `cq`, three signaled
/// SENDs of no bytes (`wr_id` 100 to 102) written into its send queue,
/// the first `posted` of them posted, and an engine to serve it.
struct World {
    gm: crate::memory::GuestRam,
    host: Arc<HostMem>,
    vm: VmState,
    engine: Engine,
    qp: u32,
    cq: u32,
}

impl World {
    fn new(posted: u32) -> World {
        let gm = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
        let host = Arc::new(HostMem::new(Arc::new(gm.clone())));
        let config = DaemonConfig::new(vec!["/nonexistent/vm0.sock".into()]);
        let tenancy = Arc::new(Tenancy::from_config(&config));
        let rnic: Arc<dyn RnicObjects> = Arc::new(testing::Numbers::default());
        let port = PortIdentity {
            gids: crate::gid_table::GidTable::single([0; 16]),
            guid: 1,
            vm: 0,
        };
        let mut vm = VmState::new(Limits::default(), rnic.clone(), port, tenancy.clone());
        let cq = vm
            .res
            .insert_cq(
                Cq {
                    ctx: 1,
                    depth: 16,
                    db_gpa: CQ_DB,
                    ring: testing::one_page(CQ_RING, &gm),
                    users: 0,
                    rt: Default::default(),
                },
                rnic.as_ref(),
            )
            .unwrap();
        let mut qp = testing::qp(QpType::RC);
        (qp.send_cq, qp.recv_cq) = (cq, cq);
        let (h, _) = vm.res.insert_qp(qp, rnic.as_ref()).unwrap();
        // The send queue starts the ring (page 0).
        let stride = 1u64 << vm.res.qps.get(h).unwrap().layout.sq_wqe_shift;
        for i in 0..3u64 {
            let wqe = SendWqe {
                wr_id: 100 + i,
                opcode: WrOpcode::SEND as u8,
                flags: WQE_SIGNALED,
                ..SendWqe::default()
            };
            write_guest(&gm, GuestAddress(i * stride), &wqe.to_bytes()).unwrap();
        }
        let db = vm.res.qps.get(h).unwrap().db_gpa;
        doorbell::store(&host, db, QpDoorbell::SQ_PI, posted).unwrap();
        let engine = testing::engine(rnic.caps(), tenancy);
        World {
            gm,
            host,
            vm,
            engine,
            qp: h,
            cq,
        }
    }
}

/// The VM being served, as a sweep hands it to the RNIC.
fn serving<'a>(vm: &'a mut VmState, host: &'a HostMem) -> Serving<'a> {
    Serving {
        vms: &[],
        vm: 0,
        state: vm,
        mem: host,
    }
}

/// The first `n` CQEs of the CQ: `wr_id` and status.
fn cqes(gm: &crate::memory::GuestRam, n: u64) -> Vec<(u64, u8)> {
    (0..n)
        .map(|i| {
            let mut b = [0u8; CQE_SIZE as usize];
            read_guest(gm, GuestAddress(CQ_RING + i * u64::from(CQE_SIZE)), &mut b).unwrap();
            let c = Cqe::read(&b);
            (c.wr_id, c.status)
        })
        .collect()
}

/// Work an RNIC takes and completes later: the send queue moves
/// on at once (`sq_ci`, the slots released), the WQEs count as in
/// flight (SQD waits for them), and their CQEs appear, in order, when
/// the RNIC reports them.
#[test]
fn work_taken_now_completes_when_the_transport_reports_it() {
    let mut w = World::new(3);
    let (h, cq, engine, host) = (w.qp, w.cq, &w.engine, &w.host);
    let db = w.vm.res.qps.get(h).unwrap().db_gpa;
    let (path, mut scratch) = (Deferred, Scratch::new());
    let mut cx = serving(&mut w.vm, host);
    assert!(engine.run_sq(&path, &mut cx, h, 3, &mut scratch));
    let qp = cx.state.res.qps.get(h).unwrap();
    assert_eq!((qp.rt.sq_ci, qp.rt.outstanding), (3, 3));
    assert_eq!(doorbell::load(host, db, QpDoorbell::SQ_CI), Ok(3));
    assert_eq!(cx.state.res.cqs.get(cq).unwrap().rt.pi, 0, "no CQE yet");
    // Taken and not completed: a QP moved to SQD is still draining.
    cx.state.res.qps.get_mut(h).unwrap().state = QpState::SQD;
    assert!(cx.state.res.qps.get(h).unwrap().rt.in_flight());

    assert!(path.poll(&mut cx, &mut scratch.path));
    let qp = cx.state.res.qps.get(h).unwrap();
    assert_eq!(qp.rt.outstanding, 0);
    assert!(!qp.rt.in_flight(), "drained");
    assert_eq!(cx.state.res.cqs.get(cq).unwrap().rt.pi, 3);
    let ok = WcStatus::SUCCESS as u8;
    assert_eq!(
        cqes(&w.gm, 3),
        [(100, ok), (101, ok), (102, ok)],
        "in order"
    );
    assert!(!path.poll(&mut cx, &mut scratch.path));
}

/// A QP that fails with work taken by the RNIC: the WQEs behind
/// it are flushed only after the RNIC has completed (or flushed)
/// those, so the CQ sees the queue's order.
#[test]
fn the_flush_waits_for_work_the_transport_has_taken() {
    let mut w = World::new(2);
    let (h, cq, engine, host) = (w.qp, w.cq, &w.engine, &w.host);
    let db = w.vm.res.qps.get(h).unwrap().db_gpa;
    let (path, mut scratch) = (Deferred, Scratch::new());
    let mut cx = serving(&mut w.vm, host);
    assert!(engine.run_sq(&path, &mut cx, h, 2, &mut scratch));
    // The QP fails; a third WQE was posted meanwhile.
    cx.state.qp_enter_err(h, None);
    doorbell::store(host, db, QpDoorbell::SQ_PI, 3).unwrap();
    let qp = cx.state.res.qps.get(h).unwrap();
    assert!(owes_flush(qp), "the QP stays on the polling list");
    let mut buf = WqeBuf::new();
    assert_eq!(flush(&path, cx.state, host, h, 3, &mut buf, 32), 0);
    assert_eq!(cx.state.res.cqs.get(cq).unwrap().rt.pi, 0);
    // The RNIC reports the two it took; then the third flushes.
    assert!(path.poll(&mut cx, &mut scratch.path));
    assert_eq!(flush(&path, cx.state, host, h, 3, &mut buf, 32), 1);
    let (ok, flushed) = (WcStatus::SUCCESS as u8, WcStatus::WR_FLUSH_ERR as u8);
    assert_eq!(cqes(&w.gm, 3), [(100, ok), (101, ok), (102, flushed)]);
}
