//! The data-path half of an RNIC: what the engine hands a checked send
//! work request to, and the hooks it calls while serving.
//!
//! The engine is the device model both RNICs share: it polls the
//! doorbells, schedules VMs, takes send WQEs from the guest rings and
//! checks them (format, opcode, lengths, address handle), writes CQEs and
//! flushes QPs in error. An [`RnicPath`] moves each checked work request
//! ([`Outgoing`]) and reports what became of it: done now (the software
//! RNIC, which performs the responder's part itself), or taken and
//! completed later ([`Step::InFlight`], then [`RnicPath::poll`]), as a
//! host NIC does. The engine thread is generic over it, so the hooks cost
//! no call through a pointer. Which one a thread runs is `crate::rnic`'s
//! choice, from the configuration; the object half is
//! [`crate::rnic_objects::RnicObjects`].
//!
//! An RNIC that completes later keeps the device's rules: each QP's
//! completions arrive in the order its WQEs were taken; a success only for
//! a signaled WQE; once a QP has failed, what it had taken completes with
//! `WR_FLUSH_ERR` (a host NIC flushes its own queue, and `poll` reports
//! those too); a QP moved to RESET has dropped what it had taken (the
//! engine forgets the count).

use std::sync::Arc;
use std::time::Instant;

use virtio_rdma_abi::datapath::{SendWqe, Sge, WcOpcode, WcStatus, WrOpcode};
use virtio_rdma_abi::qp::{AddressVector, QpType};

use crate::memory::HostMem;
use crate::resources::Qp;
use crate::vm::cell::VmCell;
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
    /// Taken by the RNIC, which completes it later ([`RnicPath::poll`],
    /// `engine::requester::complete_posted`); move on. Until then it counts as in
    /// flight (`QpRuntime::outstanding`). Only an RNIC that hands work to
    /// a NIC takes it so.
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

/// The head send WQE of a QP, as its RNIC sees it.
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
/// burst and the bytes moved so far (an RNIC sizes a piece of a large
/// message from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes the burst may move.
    pub max_bytes: u64,
    /// Bytes moved so far.
    pub moved: u64,
}

/// A VM the engine is serving, under its lock: what serving its QPs needs.
pub struct Serving<'a> {
    /// Every VM of the daemon, by id (a message's peer is looked up here).
    pub vms: &'a [Option<Arc<VmCell>>],
    /// The VM's id.
    pub vm: usize,
    /// Its state.
    pub state: &'a mut VmState,
    /// Its memory.
    pub mem: &'a HostMem,
}

/// A send work request, copied out of the ring and checked for shape.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The header.
    pub hdr: SendWqe,
    /// The opcode.
    pub opcode: WrOpcode,
    /// Scatter/gather list (empty with inline data).
    pub sges: &'a [Sge],
    /// Inline data.
    pub inline: Option<&'a [u8]>,
}

/// A send work request the requester has checked and addressed, ready for
/// the RNIC.
pub struct Outgoing<'a> {
    /// Its completion opcode.
    pub op: WcOpcode,
    /// The sending QP's handle.
    pub qp: u32,
    /// The WQE's index in its send queue.
    pub index: u32,
    /// The work request.
    pub wr: &'a SendWr<'a>,
    /// The PD of the sending QP.
    pub pd: u32,
    /// The sending QP's number.
    pub src_qpn: u32,
    /// The sending QP's type.
    pub qp_type: QpType,
    /// The destination QPN.
    pub dest_qpn: u32,
    /// The address vector: a UD message's AH, an RC QP's `av`.
    pub av: AddressVector,
    /// UD: the Q_Key the message carries.
    pub qkey: u32,
    /// The local buffers are written (RDMA READ, atomics): they need
    /// LOCAL_WRITE.
    pub writes_local: bool,
    /// Its completion is written on success too.
    pub signaled: bool,
    /// The message length.
    pub len: u64,
    /// What is left of the burst.
    pub room: Room,
}

impl Outgoing<'_> {
    /// Sent on a UD or GSI QP: a datagram.
    pub fn ud(&self) -> bool {
        self.qp_type.datagram()
    }
}

/// The data-path half of an RNIC (see the module documentation).
pub trait RnicPath: Send + Sync {
    /// The RNIC's reusable memory, one per engine thread.
    type Scratch: Default + Send;

    /// What the RNIC keeps for one burst of one QP's send work, from
    /// [`RnicPath::with_burst`] to the burst's end (the software RNIC: the
    /// VM an RC QP talks to, locked for the burst, and the route its
    /// messages were last checked on).
    type Burst<'a>: Default;

    /// The RNIC takes receive WQEs as the guest posts them (a host NIC
    /// needs them posted before a message arrives; the software RNIC reads
    /// them when one does): the engine then watches receive queues in INIT
    /// to SQD and hands new WQEs to [`RnicPath::post_recv`].
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

    /// [`RnicPath::wants_poll`] may be true of a VM: the sweep then looks
    /// at every VM, parked or not, each time. An RNIC without work the
    /// doorbells do not show leaves it false, and a sweep then visits only
    /// the VMs it polls and the parked ones kicked or due.
    const WANTS_POLL: bool = false;

    /// Whether VM `vm` has work in the RNIC that no doorbell shows
    /// (completions that may arrive): the sweep then serves it each time
    /// (only asked if [`RnicPath::WANTS_POLL`]).
    fn wants_poll(&self, _vm: usize) -> bool {
        false
    }

    /// The engine is about to park: the RNIC arms whatever makes the
    /// descriptors of [`RnicPath::park_fds`] readable when VM `vm` gets
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

    /// What the RNIC says of the head send WQE of `qp` before it is taken
    /// again.
    fn head(&self, _qp: &Qp) -> Head {
        Head::Ready
    }

    /// Runs `burst`, one burst of send work of QP `h`, with a fresh
    /// [`RnicPath::Burst`] and in whatever context the RNIC needs for it
    /// (the software RNIC locks the VM an RC QP talks to once for the
    /// burst); `scratch` is the engine's, passed through. `None` if the
    /// burst could not run now (a VM's lock was busy): the engine must not
    /// park on the QP.
    fn with_burst<S, F>(
        &self,
        cx: &mut Serving<'_>,
        _h: u32,
        scratch: &mut S,
        burst: F,
    ) -> Option<bool>
    where
        F: for<'s> FnOnce(&mut Serving<'s>, &mut Self::Burst<'s>, &mut S) -> bool,
    {
        Some(burst(cx, &mut Self::Burst::default(), scratch))
    }

    /// Moves a send WQE, checked and addressed (`msg`), in burst `burst`,
    /// and completes it (`engine::requester::complete_send`) or reports why not yet.
    /// Sets `moved` to the payload bytes it moved.
    fn post_send(
        &self,
        cx: &mut Serving<'_>,
        burst: &mut Self::Burst<'_>,
        ts: &mut Self::Scratch,
        moved: &mut u64,
        msg: &Outgoing<'_>,
    ) -> Step;

    /// Completions of work taken earlier ([`Step::InFlight`]) of the VM
    /// being served; true if there were any.
    fn poll(&self, _cx: &mut Serving<'_>, _ts: &mut Self::Scratch) -> bool {
        false
    }

    /// The VM being served is stopped (spec 15.1): nothing new of it is
    /// taken, but an RNIC whose NIC completes what it took after the stop
    /// (a host RNIC) applies those completions, so that a state saved
    /// next has them (spec 20.8); true if there were any.
    fn poll_stopped(&self, _cx: &mut Serving<'_>, _ts: &mut Self::Scratch) -> bool {
        false
    }

    /// QP `h` is in ERR: completes with `WR_FLUSH_ERR` a receive WQE the
    /// RNIC took and has not completed; true if there was one.
    fn flush_taken(&self, _vm: &mut VmState, _mem: &HostMem, _h: u32) -> bool {
        false
    }
}
