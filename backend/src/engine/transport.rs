//! The data-path half of a transport: what the device model hands a
//! checked send work request to, and the hooks it calls while serving.
//!
//! The engine is the device model every transport shares: it polls the
//! doorbells, schedules VMs, takes send WQEs from the guest rings and
//! checks them (format, opcode, lengths, address handle), writes CQEs and
//! flushes QPs in error. A [`TransportPath`] moves each checked work
//! request and reports what became of it: done now (the software RNIC,
//! which performs the responder's part itself), or taken and completed
//! later ([`Step::InFlight`], then [`TransportPath::poll`]), as a host NIC
//! does. The engine thread is generic over it, so the hooks cost no call
//! through a pointer.
//!
//! Which one a thread runs follows the transport's object half
//! ([`crate::transport::Transport::kind`]); the software RNIC's is
//! `soft::SoftPath`.
//!
//! A transport that completes later keeps the device's rules: each QP's
//! completions arrive in the order its WQEs were taken; a success only for
//! a signaled WQE; once a QP has failed, what it had taken completes with
//! `WR_FLUSH_ERR` (a host NIC flushes its own queue, and `poll` reports
//! those too); a QP moved to RESET has dropped what it had taken (the
//! engine forgets the count).

use std::time::Instant;

use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};

use super::requester::Outgoing;
use super::sweep::Serving;
use super::scratch::Scratch;
use super::Engine;
use crate::memory::HostMem;
use crate::resources::Qp;
use crate::vm::VmState;

/// What became of the send WQE at the head of a send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Completed (successfully or not); move on.
    Done {
        /// Whether `sq_ci` past this WQE has been stored already (before
        /// its completion).
        published: bool,
    },
    /// Taken by the transport, which completes it later
    /// ([`TransportPath::poll`], [`super::requester::complete_posted`]);
    /// move on. Until then it counts as in flight
    /// (`QpRuntime::outstanding`). Only transports that hand work to a
    /// NIC take it so.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    InFlight,
    /// Not yet: the WQE stays at the head until then (a retry wait, spec
    /// 18.20).
    Wait(Instant),
    /// A piece of a message was moved; the WQE stays at the head until its
    /// last piece.
    Piece,
    /// The send queue is unusable and the QP failed; the WQE was not taken.
    Broken,
    /// Another VM's lock was busy: the WQE stays at the head, untouched,
    /// for the next service.
    Busy,
}

/// The head send WQE of a QP, as its transport sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// It may be taken.
    Ready,
    /// It waits until then (a retry).
    WaitUntil(Instant),
    /// It has failed without being tried again (retries used up, spec
    /// 18.20): its `wr_id`, completion opcode and status.
    Failed(u64, WcOpcode, WcStatus),
}

/// How much of its burst a QP's service has left: the most bytes of the
/// burst and the bytes moved so far (a transport sizes a piece of a large
/// message from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes the burst may move.
    pub max_bytes: u64,
    /// Bytes moved so far.
    pub moved: u64,
}

/// The data-path half of a transport (see the module documentation).
pub trait TransportPath: Send + Sync {
    /// The transport's reusable memory, one per engine thread.
    type Scratch: Default + Send;

    /// The transport takes receive WQEs as the guest posts them (a host NIC
    /// needs them posted before a message arrives; the software RNIC reads
    /// them when one does): the engine then watches receive queues in INIT
    /// to SQD and hands new WQEs to [`TransportPath::post_recv`].
    const TAKES_RECEIVES: bool = false;

    /// Takes the receive WQEs of QP `h`'s own receive queue posted up to
    /// producer index `rq_pi` that it has not taken yet (at most `max`);
    /// true if it did anything.
    fn post_recv(
        &self,
        _cx: &mut Serving<'_>,
        _ts: &mut Self::Scratch,
        _h: u32,
        _rq_pi: u32,
        _max: u32,
    ) -> bool {
        false
    }

    /// Whether VM `vm` has work in the transport that no doorbell shows
    /// (completions that may arrive): the sweep then serves it each time.
    fn wants_poll(&self, _vm: usize) -> bool {
        false
    }

    /// The engine is about to park: the transport arms whatever makes the
    /// descriptors of [`TransportPath::park_fds`] readable when VM `vm` gets
    /// work (the re-check that follows polls once more).
    fn arm(&self, _vm: usize) {}

    /// Descriptors that wake the parked engine for VM `vm`.
    fn park_fds(&self, _vm: usize, _out: &mut Vec<std::os::fd::RawFd>) {}

    /// A sweep over the thread's VMs starts.
    fn sweep_started(&self, _ts: &mut Self::Scratch) {}

    /// VM `k` (a position in the thread's polling lists) has work in this
    /// sweep.
    fn vm_active(&self, _ts: &mut Self::Scratch, _k: usize) {}

    /// The engine starts serving VM `k`'s QPs.
    fn serving(&self, _ts: &mut Self::Scratch, _k: usize) {}

    /// What the transport says of the head send WQE of `qp` before it is
    /// taken again.
    fn head(&self, _qp: &Qp) -> Head {
        Head::Ready
    }

    /// Runs `burst`, one burst of send work of QP `h`, in whatever context
    /// the transport needs for it (the software RNIC locks the VM an RC
    /// QP talks to once for the burst).
    fn with_burst<F>(
        &self,
        _engine: &Engine,
        cx: &mut Serving<'_>,
        _h: u32,
        scratch: &mut Scratch<Self::Scratch>,
        burst: F,
    ) -> bool
    where
        F: for<'s> FnOnce(&mut Serving<'s>, &mut Scratch<Self::Scratch>) -> bool,
    {
        burst(cx, scratch)
    }

    /// Moves a send WQE, checked and addressed (`msg`), and completes it
    /// ([`super::requester::complete_send`]) or reports why not yet. Sets
    /// `moved` to the payload bytes it moved.
    fn post_send(
        &self,
        engine: &Engine,
        cx: &mut Serving<'_>,
        ts: &mut Self::Scratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step;

    /// Completions of work taken earlier ([`Step::InFlight`]) of the VM
    /// being served; true if there were any.
    fn poll(&self, _engine: &Engine, _cx: &mut Serving<'_>, _ts: &mut Self::Scratch) -> bool {
        false
    }

    /// QP `h` is in ERR: completes with `WR_FLUSH_ERR` a receive WQE the
    /// transport took and has not completed; true if there was one.
    fn flush_taken(&self, _vm: &mut VmState, _mem: &HostMem, _h: u32) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    use std::sync::{Arc, Mutex};

    use virtio_rdma_abi::datapath::{
        Cqe, QpDoorbell, SendWqe, WcOpcode, WcStatus, WrOpcode, WQE_SIGNALED,
    };
    use virtio_rdma_abi::mem::CQE_SIZE;
    use virtio_rdma_abi::qp::{QpState, QpType};
    use virtio_rdma_abi::{Field, Wire};
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    use vmm_sys_util::eventfd::EventFd;

    use super::*;
    use crate::config::{DaemonConfig, Limits};
    use crate::engine::flush::flush;
    use crate::engine::placement::Registry;
    use crate::engine::poll::owes_flush;
    use crate::engine::requester::{complete_posted, Completion};
    use crate::engine::wqe::WqeBuf;
    use crate::engine::{doorbell, testing, EngineCounters, SoftRnic};
    use crate::memory::volatile::{read_guest, write_guest};
    use crate::qos::QosTable;
    use crate::resources::Cq;
    use crate::tenancy::Tenancy;
    use crate::vm::PortIdentity;

    /// A transport that takes every work request and completes it only
    /// when polled, as a host NIC does.
    struct Deferred;

    impl TransportPath for Deferred {
        type Scratch = Vec<(u32, u64, WcOpcode)>;

        fn post_send(
            &self,
            _engine: &Engine,
            _cx: &mut Serving<'_>,
            ts: &mut Self::Scratch,
            moved: &mut u64,
            msg: &Outgoing<'_>,
        ) -> Step {
            ts.push((msg.qp, msg.wr.hdr.wr_id, msg.op));
            *moved = msg.len;
            Step::InFlight
        }

        fn poll(&self, _engine: &Engine, cx: &mut Serving<'_>, ts: &mut Self::Scratch) -> bool {
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
        gm: GuestMemoryMmap,
        host: Arc<HostMem>,
        vm: VmState,
        engine: Engine,
        qp: u32,
        cq: u32,
    }

    impl World {
        fn new(posted: u32) -> World {
            let gm = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
            let host = Arc::new(HostMem::new(Arc::new(gm.clone())));
            let config = DaemonConfig::new(vec!["/nonexistent/vm0.sock".into()]);
            let tenancy = Arc::new(Tenancy::from_config(&config));
            let transport: Arc<dyn crate::transport::Transport> = Arc::new(SoftRnic::new());
            let port = PortIdentity {
                gid: [0; 16],
                guid: 1,
                vm: 0,
            };
            let mut vm = VmState::new(Limits::default(), transport.clone(), port, tenancy.clone());
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
                    transport.as_ref(),
                )
                .unwrap();
            let mut qp = testing::qp(QpType::RC);
            (qp.send_cq, qp.recv_cq) = (cq, cq);
            let (h, _) = vm.res.insert_qp(qp, transport.as_ref()).unwrap();
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
            let engine = Engine {
                index: 0,
                registry: Arc::new(Registry::new(vec![0])),
                qos_applied: AtomicU64::new(0),
                db_flags: Arc::new(AtomicU32::new(0)),
                counters: EngineCounters::default(),
                caps: transport.caps(),
                transport,
                wake: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
                stop: AtomicBool::new(false),
                hold: AtomicBool::new(false),
                held: AtomicBool::new(false),
                thread: Mutex::new(None),
                tenancy,
                qos: Arc::new(QosTable::new(Vec::new(), Vec::new())),
                fence_elision: false,
            };
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

    /// The VM being served, as a sweep hands it to the transport.
    fn serving<'a>(vm: &'a mut VmState, host: &'a HostMem) -> Serving<'a> {
        Serving {
            vms: &[],
            vm: 0,
            state: vm,
            mem: host,
            held: None,
            reached: None,
        }
    }

    /// The first `n` CQEs of the CQ: `wr_id` and status.
    fn cqes(gm: &GuestMemoryMmap, n: u64) -> Vec<(u64, u8)> {
        (0..n)
            .map(|i| {
                let mut b = [0u8; CQE_SIZE as usize];
                read_guest(gm, GuestAddress(CQ_RING + i * u64::from(CQE_SIZE)), &mut b).unwrap();
                let c = Cqe::read(&b);
                (c.wr_id, c.status)
            })
            .collect()
    }

    /// Work a transport takes and completes later: the send queue moves
    /// on at once (`sq_ci`, the slots released), the WQEs count as in
    /// flight (SQD waits for them), and their CQEs appear, in order, when
    /// the transport reports them.
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

        assert!(path.poll(engine, &mut cx, &mut scratch.transport));
        let qp = cx.state.res.qps.get(h).unwrap();
        assert_eq!(qp.rt.outstanding, 0);
        assert!(!qp.rt.in_flight(), "drained");
        assert_eq!(cx.state.res.cqs.get(cq).unwrap().rt.pi, 3);
        let ok = WcStatus::SUCCESS as u8;
        assert_eq!(cqes(&w.gm, 3), [(100, ok), (101, ok), (102, ok)], "in order");
        assert!(!path.poll(engine, &mut cx, &mut scratch.transport));
    }

    /// A QP that fails with work taken by the transport: the WQEs behind
    /// it are flushed only after the transport has completed (or flushed)
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
        // The transport reports the two it took; then the third flushes.
        assert!(path.poll(engine, &mut cx, &mut scratch.transport));
        assert_eq!(flush(&path, cx.state, host, h, 3, &mut buf, 32), 1);
        let (ok, flushed) = (WcStatus::SUCCESS as u8, WcStatus::WR_FLUSH_ERR as u8);
        assert_eq!(cqes(&w.gm, 3), [(100, ok), (101, ok), (102, flushed)]);
    }
}
