//! The data-path engine of the software RNIC.
//!
//! One engine thread serves the QPs of every VM the daemon serves. It polls
//! the producer indices in the VMs' doorbell records while there is work
//! (adaptive polling), and when it has been idle for a while it parks: it
//! sets `DB_FLAG_KICK` in every doorbell record, re-checks once, and sleeps
//! until a driver notifies the notification queue or the control path
//! changes something (spec chapter 18).
//!
//! Requester, responder and completer are separate modules ([`exec`],
//! [`completer`]); [`wqe`] copies work requests out of guest rings.
//!
//! Locking: the engine locks a VM's device state while it works on that
//! VM, and the peer VM's state inside that for VM-to-VM operations. Control
//! threads only ever hold their own VM's lock and there is one engine
//! thread, so the nesting cannot deadlock.

pub mod completer;
pub mod doorbell;
pub mod exec;
pub mod wqe;

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, warn};
use virtio_rdma_abi::datapath::{
    Cqe, WcOpcode, WcStatus, DB_DEVICE_OFFSET, DB_FLAG_KICK, WQE_FENCE, WQE_SIGNALED,
};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType, QP_FLAG_SIG_ALL};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::ctrl::Ctrl;
use crate::device::RdmaDevice;
use crate::memory::access;
use crate::rnic::Rnic;
use doorbell::load_pi;
use exec::{local_segments, respond, wc_opcode, Request, RespOutcome};
use wqe::fetch_send;

/// How long the engine keeps polling after its last piece of work.
pub const POLL_WINDOW: Duration = Duration::from_micros(200);
/// Longest sleep while parked (timers such as RNR retries are checked at
/// least this often).
const MAX_PARK: Duration = Duration::from_millis(50);
/// Offsets in a QP doorbell record.
const SQ_CI: u64 = DB_DEVICE_OFFSET;
const RQ_CI: u64 = DB_DEVICE_OFFSET + 4;
const FLAGS: u64 = DB_DEVICE_OFFSET + 8;
/// Work requests taken from one QP before moving on (fairness).
const BURST: u32 = 32;

/// The engine: a thread and the VMs it serves.
pub struct Engine {
    vms: Mutex<Vec<Weak<RdmaDevice>>>,
    /// Bumped on every registration, so the thread refreshes its VM list.
    generation: AtomicUsize,
    rnic: Arc<dyn Rnic>,
    wake: EventFd,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread.
    pub fn start(rnic: Arc<dyn Rnic>) -> std::io::Result<Arc<Engine>> {
        let engine = Arc::new(Engine {
            vms: Mutex::new(Vec::new()),
            generation: AtomicUsize::new(0),
            rnic,
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let e = engine.clone();
        let t = thread::Builder::new()
            .name("rnic-engine".into())
            .spawn(move || e.run())?;
        *engine.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(engine)
    }

    /// Adds a VM; its id is its index.
    pub fn register(&self, id: usize, vm: &Arc<RdmaDevice>) {
        let mut vms = self.vms.lock().unwrap_or_else(|p| p.into_inner());
        if vms.len() <= id {
            vms.resize(id + 1, Weak::new());
        }
        vms[id] = Arc::downgrade(vm);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Wakes the engine (a doorbell kick, or a control-path change).
    pub fn wake(&self) {
        if let Err(e) = self.wake.write(1) {
            warn!("cannot wake the engine: {e}");
        }
    }

    /// Stops the engine thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }

    fn vm(&self, id: usize) -> Option<Arc<RdmaDevice>> {
        self.vms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)?
            .upgrade()
    }

    fn all_vms(&self) -> Vec<Arc<RdmaDevice>> {
        self.vms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    fn run(&self) {
        let mut last_work = Instant::now();
        let mut seen = usize::MAX;
        let mut vms = Vec::new();
        let mut scratch = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            let generation = self.generation.load(Ordering::Acquire);
            if generation != seen {
                vms = self.all_vms();
                seen = generation;
            }
            if self.sweep(&vms, &mut scratch) {
                last_work = Instant::now();
                continue;
            }
            if last_work.elapsed() < POLL_WINDOW {
                thread::yield_now();
                continue;
            }
            // Park: ask for kicks, then look once more so that a doorbell
            // rung before the flag became visible is not missed.
            set_kick(&vms, true);
            fence(Ordering::SeqCst);
            if self.sweep(&vms, &mut scratch) {
                set_kick(&vms, false);
                last_work = Instant::now();
                continue;
            }
            self.park();
            set_kick(&vms, false);
            last_work = Instant::now();
        }
    }

    fn park(&self) {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&self.wake),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = MAX_PARK.as_millis() as libc::c_int;
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and
        // the count is 1.
        let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
        let _ = self.wake.read();
    }
}

/// Sets or clears DB_FLAG_KICK in every QP and SRQ doorbell record of a
/// queue without a doorbell slot, and in every doorbell page header.
fn set_kick(vms: &[Arc<RdmaDevice>], on: bool) {
    let v = if on { DB_FLAG_KICK } else { 0 };
    for vm in vms {
        vm.with_dataplane(|ctrl, mem| {
            for (_, qp) in ctrl.res.qps.iter() {
                if qp.db_slot.is_none() {
                    let _ = access::store_u32_release(mem, qp.db_gpa + FLAGS, v);
                }
            }
            for (_, srq) in ctrl.res.srqs.iter() {
                if srq.db_slot.is_none() {
                    let _ = access::store_u32_release(mem, srq.db_gpa + FLAGS, v);
                }
            }
            if let Some(pages) = &ctrl.res.doorbells {
                pages.set_kick(on);
            }
        });
    }
}

impl Engine {
    /// One pass over every VM; true if any work was done.
    fn sweep(&self, vms: &[Arc<RdmaDevice>], scratch: &mut Vec<u32>) -> bool {
        let mut busy = false;
        for vm in vms {
            let (did, events) = vm
                .with_dataplane(|ctrl, mem| {
                    let before = ctrl.events.len();
                    let did = self.sweep_vm(vm.id(), ctrl, mem, scratch);
                    (did, ctrl.events.len() != before)
                })
                .unwrap_or((false, false));
            busy |= did;
            if events {
                vm.wake_events();
            }
        }
        busy
    }

    fn sweep_vm(
        &self,
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &GuestMemoryMmap<()>,
        scratch: &mut Vec<u32>,
    ) -> bool {
        let mut busy = false;
        ctrl.res.qps.fill_handles(scratch);
        for &h in scratch.iter() {
            busy |= self.service_qp(vm_id, ctrl, mem, h);
        }
        busy
    }

    /// Takes send work of one QP, or flushes it in the error state.
    fn service_qp(&self, vm_id: usize, ctrl: &mut Ctrl, mem: &GuestMemoryMmap<()>, h: u32) -> bool {
        let Some(qp) = ctrl.res.qps.get_mut(h) else {
            return false;
        };
        let Some(sq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::SQ) else {
            return false;
        };
        match qp.state {
            QpState::RESET => {
                // Nothing posted in RESET is ever executed.
                let rq_pi = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ)
                    .unwrap_or(qp.rt.rq_ci);
                let changed = qp.rt.sq_ci != sq_pi || qp.rt.rq_ci != rq_pi;
                qp.rt.sq_ci = sq_pi;
                qp.rt.rq_ci = if qp.srq == 0 { rq_pi } else { qp.rt.rq_ci };
                qp.rt.rnr = None;
                if changed {
                    let _ = access::store_u32_release(mem, qp.db_gpa + SQ_CI, qp.rt.sq_ci);
                    let _ = access::store_u32_release(mem, qp.db_gpa + RQ_CI, qp.rt.rq_ci);
                }
                false
            }
            QpState::ERR => flush(ctrl, mem, h, sq_pi),
            QpState::RTS => self.run_sq(vm_id, ctrl, mem, h, sq_pi),
            _ => false,
        }
    }

    fn run_sq(
        &self,
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &GuestMemoryMmap<()>,
        h: u32,
        sq_pi: u32,
    ) -> bool {
        let mut did = false;
        for _ in 0..BURST {
            let Some(qp) = ctrl.res.qps.get(h) else {
                return did;
            };
            if qp.state != QpState::RTS || qp.rt.sq_ci == sq_pi {
                return did;
            }
            if let Some((_, _, at)) = qp.rt.rnr {
                if Instant::now() < at {
                    return did;
                }
            }
            if sq_pi.wrapping_sub(qp.rt.sq_ci) > qp.sq_depth {
                // The driver claims more WQEs than the ring holds.
                fail(ctrl, h, Some(EventKind::QP_FATAL));
                return true;
            }
            did = true;
            let index = qp.rt.sq_ci;
            let outcome = self.execute(vm_id, ctrl, mem, h, index);
            let Some(qp) = ctrl.res.qps.get_mut(h) else {
                return did;
            };
            match outcome {
                Step::Retry(at, left) => {
                    qp.rt.rnr = Some((index, left, at));
                    return did;
                }
                Step::Done => {
                    qp.rt.rnr = None;
                    qp.rt.sq_ci = index.wrapping_add(1);
                    let _ = access::store_u32_release(mem, qp.db_gpa + SQ_CI, qp.rt.sq_ci);
                }
            }
        }
        did
    }

    /// Executes send WQE `index` of QP `h`, writing its completion.
    fn execute(
        &self,
        vm_id: usize,
        ctrl: &mut Ctrl,
        mem: &GuestMemoryMmap<()>,
        h: u32,
        index: u32,
    ) -> Step {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done;
        };
        let (pd, send_cq, qpn, qp_type, sig_all) = (
            qp.pd,
            qp.send_cq,
            qp.qpn,
            qp.qp_type,
            qp.flags & QP_FLAG_SIG_ALL != 0,
        );
        // The requester's completion for this WQE.
        let done = |ctrl: &mut Ctrl, wr_id: u64, op: WcOpcode, status: WcStatus, len: u32| {
            finish(ctrl, mem, h, send_cq, qpn, wr_id, op, status, len)
        };
        let wr = match fetch_send(mem, qp, index) {
            Ok(wr) => wr,
            Err((status, wr_id)) => {
                done(ctrl, wr_id, WcOpcode::SEND, status, 0);
                return Step::Done;
            }
        };
        let op = wc_opcode(wr.opcode);
        let signaled = sig_all || wr.hdr.flags & WQE_SIGNALED != 0;
        let _fence = wr.hdr.flags & WQE_FENCE != 0; // Operations complete in order here.
        let writes_local = matches!(
            op,
            WcOpcode::RDMA_READ | WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD
        );
        let local = match local_segments(ctrl, pd, &wr.sges, writes_local) {
            Ok(s) => s,
            Err(status) => {
                done(ctrl, wr.hdr.wr_id, op, status, 0);
                return Step::Done;
            }
        };
        let len = wr
            .inline
            .as_ref()
            .map_or_else(|| access::total(&local), |d| d.len() as u64);
        let ud = qp_type == QpType::UD;
        let bad_shape = (ud && !matches!(op, WcOpcode::SEND))
            || (matches!(op, WcOpcode::COMP_SWAP | WcOpcode::FETCH_ADD) && len != 8)
            || (wr.inline.is_some() && writes_local);
        if bad_shape {
            done(ctrl, wr.hdr.wr_id, op, WcStatus::LOC_QP_OP_ERR, 0);
            return Step::Done;
        }
        // Find the responder.
        let Some(qp) = ctrl.res.qps.get(h) else {
            return Step::Done;
        };
        let (dest_qpn, dgid) = if ud {
            let Some(ah) = ctrl.res.ahs.get(wr.hdr.ah_handle).filter(|a| a.pd == pd) else {
                done(ctrl, wr.hdr.wr_id, op, WcStatus::LOC_QP_OP_ERR, 0);
                return Step::Done;
            };
            (wr.hdr.remote_qpn, ah.av.dgid)
        } else {
            (qp.attr.dest_qpn, qp.attr.av.dgid)
        };
        let (rnr_retry, min_rnr) = (qp.attr.rnr_retry, qp.attr.min_rnr_timer);
        let src_gid = ctrl.port_gid();
        let req = Request {
            wr: &wr,
            src_qpn: qpn,
            src_gid,
            local: &local,
            len,
            mem,
        };
        let outcome = match self.rnic.lookup_qpn(dest_qpn) {
            Some((peer_vm, peer_qp)) if peer_vm == vm_id => {
                if ctrl.port_gid() != dgid {
                    RespOutcome::Nak(WcStatus::RETRY_EXC_ERR)
                } else {
                    respond_ud_checked(ctrl, mem, peer_qp, &req, ud)
                }
            }
            Some((peer_vm, peer_qp)) => match self.vm(peer_vm) {
                Some(peer) => peer
                    .with_dataplane(|pctrl, pmem| {
                        if pctrl.port_gid() != dgid {
                            return RespOutcome::Nak(WcStatus::RETRY_EXC_ERR);
                        }
                        let out = respond_ud_checked(pctrl, pmem, peer_qp, &req, ud);
                        if !pctrl.events.is_empty() {
                            peer.wake_events();
                        }
                        out
                    })
                    .unwrap_or(RespOutcome::Nak(WcStatus::RETRY_EXC_ERR)),
                None => RespOutcome::Nak(WcStatus::RETRY_EXC_ERR),
            },
            None => RespOutcome::Nak(WcStatus::RETRY_EXC_ERR),
        };
        let outcome = match outcome {
            RespOutcome::Nak(WcStatus::RETRY_EXC_ERR) if ud => RespOutcome::Dropped,
            o => o,
        };
        match outcome {
            RespOutcome::Done | RespOutcome::Dropped => {
                if signaled {
                    let byte_len = u32::try_from(len).unwrap_or(u32::MAX);
                    done(ctrl, wr.hdr.wr_id, op, WcStatus::SUCCESS, byte_len);
                }
                Step::Done
            }
            RespOutcome::Nak(status) => {
                done(ctrl, wr.hdr.wr_id, op, status, 0);
                Step::Done
            }
            RespOutcome::Rnr => {
                let left = match ctrl.res.qps.get(h).and_then(|q| q.rt.rnr) {
                    Some((i, left, _)) if i == index => left,
                    _ => rnr_retry,
                };
                // 7 means "retry forever".
                if left == 0 {
                    done(ctrl, wr.hdr.wr_id, op, WcStatus::RNR_RETRY_EXC_ERR, 0);
                    return Step::Done;
                }
                let next = if rnr_retry == 7 { 7 } else { left - 1 };
                debug!("QP {qpn:#x}: RNR, {next} retries left");
                Step::Retry(Instant::now() + rnr_delay(min_rnr), next)
            }
        }
    }
}

fn respond_ud_checked(
    ctrl: &mut Ctrl,
    mem: &GuestMemoryMmap<()>,
    peer_qp: u32,
    req: &Request<'_>,
    ud: bool,
) -> RespOutcome {
    if ud {
        let Some(q) = ctrl.res.qps.get(peer_qp) else {
            return RespOutcome::Dropped;
        };
        let qkey = if req.wr.hdr.remote_qkey & 0x8000_0000 != 0 {
            // Controlled Q_Keys are not sendable; the sender's own is used
            // in InfiniBand, which we cannot see here: drop.
            return RespOutcome::Dropped;
        } else {
            req.wr.hdr.remote_qkey
        };
        if q.qp_type != QpType::UD || q.attr.qkey != qkey {
            return RespOutcome::Dropped;
        }
    } else if ctrl
        .res
        .qps
        .get(peer_qp)
        .is_some_and(|q| q.qp_type != QpType::RC)
    {
        return RespOutcome::Nak(WcStatus::RETRY_EXC_ERR);
    }
    respond(ctrl, mem, peer_qp, req)
}

/// RNR NAK timer codes (IB table) in microseconds, indexed by code 0..=31.
fn rnr_delay(code: u32) -> Duration {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    Duration::from_micros(US.get(code as usize).copied().unwrap_or(10))
}

/// What to do with the WQE at the head of the send queue.
enum Step {
    /// Completed (successfully or not); move on.
    Done,
    /// Try again at the given time with this many retries left.
    Retry(Instant, u32),
}

/// Writes the requester's completion (always for errors) and fails the QP
/// on error.
#[allow(clippy::too_many_arguments)]
fn finish(
    ctrl: &mut Ctrl,
    mem: &GuestMemoryMmap<()>,
    qp: u32,
    cq: u32,
    qpn: u32,
    wr_id: u64,
    op: WcOpcode,
    status: WcStatus,
    byte_len: u32,
) {
    let cqe = Cqe {
        wr_id,
        opcode: op as u8,
        status: status as u8,
        flags: 0,
        owner: 0,
        byte_len,
        imm_data: 0,
        qpn,
        src_qpn: 0,
        vendor_err: 0,
    };
    let ok = completer::complete(ctrl, mem, cq, cqe);
    if status != WcStatus::SUCCESS || !ok {
        fail(ctrl, qp, None);
    }
}

fn fail(ctrl: &mut Ctrl, qp: u32, event: Option<EventKind>) {
    if let Some(q) = ctrl.res.qps.get_mut(qp) {
        if q.state != QpState::ERR {
            q.state = QpState::ERR;
            if let Some(e) = event {
                ctrl.events.push(e, qp, 0);
            }
        }
    }
}

/// Completes every outstanding WQE of a QP in the error state with
/// WR_FLUSH_ERR.
fn flush(ctrl: &mut Ctrl, mem: &GuestMemoryMmap<()>, h: u32, sq_pi: u32) -> bool {
    let mut did = false;
    loop {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return did;
        };
        if qp.rt.sq_ci == sq_pi || sq_pi.wrapping_sub(qp.rt.sq_ci) > qp.sq_depth {
            break;
        }
        let index = qp.rt.sq_ci;
        let (cq, qpn) = (qp.send_cq, qp.qpn);
        let (wr_id, op) = match fetch_send(mem, qp, index) {
            Ok(wr) => (wr.hdr.wr_id, wc_opcode(wr.opcode)),
            Err((_, wr_id)) => (wr_id, WcOpcode::SEND),
        };
        let _ = completer::complete(
            ctrl,
            mem,
            cq,
            Cqe {
                wr_id,
                opcode: op as u8,
                status: WcStatus::WR_FLUSH_ERR as u8,
                qpn,
                ..Cqe::default()
            },
        );
        if let Some(qp) = ctrl.res.qps.get_mut(h) {
            qp.rt.sq_ci = index.wrapping_add(1);
            qp.rt.rnr = None;
            let _ = access::store_u32_release(mem, qp.db_gpa + SQ_CI, qp.rt.sq_ci);
        }
        did = true;
    }
    // Receives of a QP with its own receive queue.
    loop {
        let Some(qp) = ctrl.res.qps.get(h) else {
            return did;
        };
        if qp.srq != 0 {
            break;
        }
        let Some(rq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ) else {
            break;
        };
        if qp.rt.rq_ci == rq_pi || rq_pi.wrapping_sub(qp.rt.rq_ci) > qp.rq_depth {
            break;
        }
        let index = qp.rt.rq_ci;
        let (cq, qpn) = (qp.recv_cq, qp.qpn);
        let wr_id = wqe::fetch_recv(
            mem,
            &qp.ring,
            qp.layout.rq_offset,
            qp.rq_depth,
            qp.layout.rq_wqe_shift,
            qp.max_recv_sge,
            index,
        )
        .map_or_else(|(_, id)| id, |w| w.wr_id);
        let _ = completer::complete(
            ctrl,
            mem,
            cq,
            Cqe {
                wr_id,
                opcode: WcOpcode::RECV as u8,
                status: WcStatus::WR_FLUSH_ERR as u8,
                qpn,
                ..Cqe::default()
            },
        );
        if let Some(qp) = ctrl.res.qps.get_mut(h) {
            qp.rt.rq_ci = index.wrapping_add(1);
            let _ = access::store_u32_release(mem, qp.db_gpa + RQ_CI, qp.rt.rq_ci);
        }
        did = true;
    }
    did
}
