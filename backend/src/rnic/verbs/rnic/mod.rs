//! The libibverbs RNIC's object half ([`VerbsRnic`]): one host object
//! per device object (PD, CQ, QP, SRQ, AH), one host memory region per
//! guest memory region (registered over a window of the guest's pages at
//! the guest's iova), and the per-VM state the data path shares with it
//! (`VmHost`).
//!
//! QP numbers and memory keys are the host NIC's when the objects are
//! created: they travel on the wire. Those of a VM that moved here from
//! another host (a loaded state, spec 20.8) are the source's, kept as
//! *virtual* numbers over the new host objects ([`super::moves`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use log::{debug, warn};
use rdma_sys::{
    ibv_alloc_pd, ibv_create_ah, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp,
    ibv_create_srq, ibv_modify_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state,
    ibv_qp_type, ibv_reg_mr_iova2, ibv_resize_cq, ibv_srq_attr, ibv_srq_init_attr,
};
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType, GSI_QPN};
use vmm_sys_util::eventfd::EventFd;

pub mod moves;

use super::attr::{self, Source};
use super::cm::bridge::Binding;
use super::cm::service::CmService;
use super::cm_gate;
use super::cm_hub::{CmHub, VmCm};
use super::device::{VerbsDevice, VerbsError};
use super::objects::{errno_of, Ah, Channel, Cq, Mr, MrHandle, Pd, Qp, Srq};
use super::quota::{map_error, Charge, Kind, MapCosts, Plan, VmQuota};
use crate::memory::window::{MapBudget, Window};
use crate::memory::HOST_PAGE_SIZE;
use crate::rnic_objects::{
    Caps, HostUsage, MrKeys, MrSpec, Owner, QpChange, QpSpec, RnicError, RnicKind, RnicObjects,
    SrqSpec,
};
use crate::sync::{lock, read, write};

/// A send work request posted to a host QP, in posting order: what its
/// completion needs (the host reports a success only with the `wr_id`, an
/// error without a valid opcode). Only some are signaled on the host
/// (`chain`): a host completion stands for those before it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Its host `wr_id`: the QP's count of send work requests.
    pub seq: u64,
    /// False if the host refused its post: it fails once those before it
    /// have completed.
    pub posted: bool,
    /// The guest's `wr_id`.
    pub wr_id: u64,
    /// Its completion opcode.
    pub op: WcOpcode,
    /// Whether the guest asked for a completion on success.
    pub signaled: bool,
    /// The message length (the CQE's `byte_len` of a READ or atomic).
    pub len: u32,
}

/// The host half of a CQ.
pub(crate) struct HostCq {
    pub cq: Cq,
    /// Entries the host CQ has.
    size: u32,
    /// Entries the work that may complete into it needs: the guest's depth
    /// and the depths of the queues that complete into it.
    need: u32,
}

/// Host `wr_id` bit 63: a receive (sends carry 0: their completions come
/// in posting order, [`HostQp::sent`]).
pub(crate) const RECV_WR: u64 = 1 << 63;
/// Host `wr_id` bit 62: a receive of an SRQ; the low 32 bits are its slot
/// in [`HostSrq::wr_ids`] (an SRQ's receives may complete in any order).
pub(crate) const RECV_SRQ: u64 = 1 << 62;

/// The host half of an SRQ.
pub(crate) struct HostSrq {
    pub srq: Srq,
    /// Its depth.
    pub depth: u32,
    /// The guest `wr_id` and ring index of the receive posted in each slot.
    pub wr_ids: Vec<(u64, u32)>,
    /// Slots free.
    pub free: Vec<u32>,
}

/// The host half of a QP.
pub(crate) struct HostQp {
    pub qp: Qp,
    /// The device's handle.
    pub handle: u32,
    pub qp_type: QpType,
    /// The device handles of its CQs and SRQ (0: none).
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: u32,
    /// Send WQE ring depth: the most sends posted and not completed.
    pub sq_depth: u32,
    /// Receive ring depth.
    pub rq_depth: u32,
    /// Sends posted and not completed, oldest first.
    pub sent: VecDeque<Sent>,
    /// The `seq` of the next send work request.
    pub next_seq: u64,
    /// The guest `wr_id`s of the receives posted to its own receive queue
    /// and not completed, oldest first.
    pub recvd: VecDeque<u64>,
    /// The daemon moved the host QP to ERR itself (the device's QP failed
    /// for a reason the host NIC did not see).
    pub failed: bool,
    /// The QP's `timeout` and `retry_cnt` (the watchdog's budget).
    pub timeout: u32,
    pub retry_cnt: u32,
    /// When the oldest send now outstanding was posted, or the last send
    /// completed since: the watchdog's clock.
    pub progress: Option<std::time::Instant>,
    /// The watchdog failed the QP: its first flushed send completes with
    /// `RETRY_EXC_ERR`, as the NIC's retries running out would have.
    pub timed_out: bool,
    /// The CM bridge's connection of the QP, from its RTR on: its RTS
    /// sends from the host CM's first PSN.
    pub bridged: Option<Binding>,
    /// Where its requests go on the fabric (RC, UC: from RTR on): GID and
    /// host QP number, after the moves of the destination the RNIC knows.
    pub dest: Option<([u8; 16], u32)>,
    /// The destination's rkeys, virtual to host, if it moved.
    pub rkeys: Option<Arc<HashMap<u32, u32>>>,
    /// Its destination is moving: no new request is posted until then
    /// (the hold of spec 20.8; at most its VM's `pause_hold_ms`).
    pub held_until: Option<std::time::Instant>,
    /// Its destination moved: the data path points the host QP at the
    /// new place once nothing of it is in flight.
    pub repoint: Option<crate::relocation::MovedQp>,
    /// The GID its host address vector last named (kept across resets):
    /// a new one needs the kernel's cached routes forgotten
    /// ([`HostQp::route_to`]).
    pub route_gid: Option<[u8; 16]>,
}

impl HostQp {
    /// The host QP's number (the device's may be another: [`Tables::renamed`]).
    pub fn host_qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// Moves the host QP to ERR, once: it flushes what it took, each
    /// request with a completion.
    pub fn fail(&mut self) {
        if self.failed {
            return;
        }
        // SAFETY: all-zero is a valid attribute structure.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        let mask = i32::try_from(ibv_qp_attr_mask::IBV_QP_STATE.0).unwrap_or(1);
        // SAFETY: a live QP (owned by `self`) and a filled attribute
        // structure.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut a, mask) };
        if rc != 0 {
            debug!("host QPN {:#x}: to ERR refused: {rc}", self.host_qpn());
        }
        self.failed = true;
    }

    /// Notes that the host QP was just given an address vector to `gid`;
    /// if it had one to another GID before, the kernel's cached routes
    /// are flushed (soft-RoCE keeps an RC QP's first route,
    /// [`super::routes`]).
    pub fn route_to(&mut self, gid: [u8; 16]) {
        if self.route_gid.replace(gid).is_some_and(|old| old != gid) {
            super::routes::forget_cached(self.host_qpn());
        }
    }
}

/// A VM's host objects, by the device's handles (QPs by number).
#[derive(Default)]
pub(crate) struct Tables {
    pub pds: HashMap<u32, Pd>,
    pub cqs: HashMap<u32, HostCq>,
    pub srqs: HashMap<u32, HostSrq>,
    pub ahs: HashMap<u32, Ah>,
    pub qps: HashMap<u32, HostQp>,
    /// When the engine's watchdog last looked at the QPs.
    pub watched: Option<std::time::Instant>,
    /// What each host object (but MRs: [`HostMr`]) holds of the VM's
    /// quota, by kind and device handle.
    charges: HashMap<(Kind, u32), Charge>,
    /// Host QP number to the device's, for the QPs whose numbers are
    /// virtual (the VM moved here); empty for a VM created here.
    pub renamed: HashMap<u32, u32>,
    /// The device's lkey to the host's, for the regions whose keys are
    /// virtual; empty for a VM created here.
    pub lkeys: HashMap<u32, u32>,
    /// What the VM's load from another host moved: the record its peers'
    /// daemons take ([`crate::relocation::MoveRecord`]).
    pub arrived: Option<crate::relocation::MoveRecord>,
}

impl Tables {
    /// The device's QP number of host QP `host_qpn` of the VM.
    pub fn device_qpn(&self, host_qpn: u32) -> u32 {
        if self.renamed.is_empty() {
            return host_qpn;
        }
        self.renamed.get(&host_qpn).copied().unwrap_or(host_qpn)
    }

    /// The host's lkey of the device's `lkey` (unknown keys pass: the
    /// host refuses them).
    pub fn host_lkey(&self, lkey: u32) -> u32 {
        if self.lkeys.is_empty() {
            return lkey;
        }
        self.lkeys.get(&lkey).copied().unwrap_or(lkey)
    }
}

/// A host event for a VM, delivered by the engine under the VM's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostEvent {
    /// A QP's host half failed (`QP_FATAL`, `QP_REQ_ERROR`,
    /// `QP_ACCESS_ERROR`) or was established (`QP_COMM_EST`).
    Qp(u32, virtio_rdma_abi::event::EventKind),
    /// A CQ's host half overflowed or failed.
    CqError(u32),
    /// An SRQ's host half failed.
    SrqError(u32),
    /// The port went down (true) or came back.
    Port(bool),
    /// The host device failed for good: every QP fails.
    DeviceFatal,
}

/// What the RNIC keeps for one VM.
pub(crate) struct VmHost {
    pub tables: Mutex<Tables>,
    /// The completion channel of all the VM's CQs.
    pub channel: Channel,
    /// Readable when host events wait in `events` (the async-event thread
    /// writes it; the engine waits on it while parked).
    pub notify: EventFd,
    pub events: Mutex<Vec<HostEvent>>,
    /// Host QPs of the VM: the engine polls its host CQs on every sweep
    /// while it has any (completions come without a doorbell), and parks
    /// on its completion channel.
    pub qps: AtomicU32,
    /// The VM's SRQs (the engine looks for new receives in them).
    pub srqs: AtomicU32,
    /// Guest RAM now (`None`: unmapped); windows are made over it.
    mem: Mutex<Option<crate::memory::GuestRam>>,
    /// When the data path last found the stopped VM's host CQs empty
    /// (a state may be saved once it has since the save began).
    pub rested: Mutex<Option<std::time::Instant>>,
    /// Host QPs waiting to be pointed at a moved destination.
    pub repoints: AtomicU32,
    /// Host QPs whose requests are held for a destination's move.
    pub holding: AtomicU32,
    /// Its part of the host NIC and of the daemon's mappings.
    quota: Arc<VmQuota>,
}

/// A registered region.
struct HostMr {
    vm: usize,
    /// `None` once its window no longer maps the guest's pages (a memory
    /// table update moved them): the keys stay reserved until the guest
    /// deregisters the region, but the host knows them no more.
    mr: Option<Mr>,
    /// Its span (whole host pages from the first page).
    span: u64,
    /// What it holds of the VM's quota (its window's mappings are the
    /// window's).
    _charge: Charge,
}

/// The most entries a host CQ is given (rxe allows 32767 by default; the
/// device attribute says what the host allows).
const MIN_CQE: u32 = 1;

/// The libibverbs RNIC's object half.
pub struct VerbsRnic {
    dev: VerbsDevice,
    src: Source,
    caps: Caps,
    max_cqe: u32,
    /// The mappings the provider makes for each host queue.
    costs: MapCosts,
    vms: Vec<VmHost>,
    /// The owner of each device QP number.
    qpns: RwLock<HashMap<u32, Owner>>,
    /// Host QP number to the device's, for QPs whose numbers are virtual.
    renamed: RwLock<HashMap<u32, u32>>,
    /// Connections' destinations that moved, by where they were (GID,
    /// host QP number): where they are now (spec 20.8).
    pub(crate) moves: RwLock<HashMap<([u8; 16], u32), crate::relocation::MovedQp>>,
    /// Regions by the device's lkey.
    mrs: Mutex<HashMap<u32, HostMr>>,
    keys: AtomicU32,
    /// The host port is up (`PORT_ACTIVE`/`PORT_ERR` events keep it).
    port_up: std::sync::atomic::AtomicBool,
    /// The CM bridge that serves the VMs' GSI QPs, if the host's
    /// `rdma_cm` could be opened ([`VerbsRnic::enable_cm`]).
    cm: Option<CmHub>,
}

/// The tables of `host`, locked (by the engine while it serves the VM, by
/// the control path under the VM's lock: never contended).
pub(crate) fn lock_tables(host: &VmHost) -> MutexGuard<'_, Tables> {
    lock(&host.tables)
}

/// The error of a verb that failed with `rc`: the host out of memory (or
/// of locked memory, for a region) is `Exhausted` (`NO_MEMORY` to the
/// guest), anything else the host's errno (`INTERNAL`).
fn host(rc: libc::c_int) -> RnicError {
    match errno_of(rc) {
        libc::ENOMEM | libc::EAGAIN | libc::ENOSPC => RnicError::Exhausted,
        e => RnicError::Host(e),
    }
}

impl VerbsRnic {
    /// Opens the RNIC on `dev` for the VMs of `plan`, each given its
    /// share of the device's objects and of `budget`, the daemon's
    /// mappings (windows and host queues).
    pub fn new(
        dev: VerbsDevice,
        plan: &Plan,
        budget: Arc<MapBudget>,
    ) -> Result<VerbsRnic, VerbsError> {
        let quotas = plan.quotas(&dev.capacity(), &budget);
        let (_, gid_index) = dev.gid();
        let up = dev.port_active();
        let src = Source {
            port: dev.port(),
            gid_index: u8::try_from(gid_index).unwrap_or(u8::MAX),
        };
        let mut hosts = Vec::with_capacity(quotas.len());
        for quota in quotas {
            // SAFETY: a live context.
            let channel = Channel::from_raw(unsafe { ibv_create_comp_channel(dev.context()) })
                .ok_or_else(|| {
                    dev.error("ibv_create_comp_channel", std::io::Error::last_os_error())
                })?;
            channel
                .nonblocking()
                .map_err(|e| dev.error("completion channel", e))?;
            let notify = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| dev.error("eventfd", e))?;
            hosts.push(VmHost {
                tables: Mutex::new(Tables::default()),
                channel,
                notify,
                events: Mutex::new(Vec::new()),
                qps: AtomicU32::new(0),
                srqs: AtomicU32::new(0),
                mem: Mutex::new(None),
                rested: Mutex::new(None),
                repoints: AtomicU32::new(0),
                holding: AtomicU32::new(0),
                quota,
            });
        }
        Ok(VerbsRnic {
            caps: dev.caps(),
            max_cqe: dev.max_cqe(),
            costs: MapCosts::of_device(dev.name()),
            src,
            dev,
            vms: hosts,
            qpns: RwLock::new(HashMap::new()),
            renamed: RwLock::new(HashMap::new()),
            moves: RwLock::new(HashMap::new()),
            mrs: Mutex::new(HashMap::new()),
            keys: AtomicU32::new(0),
            port_up: std::sync::atomic::AtomicBool::new(up),
            cm: None,
        })
    }

    /// Opens the CM bridge for the VMs (`vms`, in the daemon's order) on
    /// the host port's address: from then on the device offers the GSI
    /// QP (`F_GSI`). Fails, and the device offers none, when the host's
    /// `rdma_cm` cannot be used there.
    pub fn enable_cm(&mut self, vms: Vec<VmCm>) -> std::io::Result<()> {
        let hub = CmHub::open(self.dev.gid().0, vms)?;
        self.cm = Some(hub);
        self.caps.gsi = true;
        Ok(())
    }

    /// The CM bridge, if it is open.
    pub(crate) fn cm(&self) -> Option<&CmHub> {
        self.cm.as_ref()
    }

    /// Runs `f` on the CM bridge's service, if it is open, and wakes the
    /// engine of each VM that got MADs from it.
    pub(crate) fn with_cm<R>(&self, f: impl FnOnce(&mut CmService) -> R) -> Option<R> {
        let hub = self.cm.as_ref()?;
        Some(hub.with(|vm| self.wake(vm), f))
    }

    /// Wakes the engine of VM `vm` (it has host work: events, MADs).
    pub(crate) fn wake(&self, vm: usize) {
        if let Some(v) = self.vms.get(vm) {
            let _ = v.notify.write(1);
        }
    }

    /// The host device.
    pub fn device(&self) -> &VerbsDevice {
        &self.dev
    }

    /// The port and GID index everything is sent from.
    pub fn source(&self) -> Source {
        self.src
    }

    /// The descriptor of the device's asynchronous events.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: a live context; `async_fd` is set when it is opened.
        unsafe { (*self.dev.context()).async_fd }
    }

    /// Records the host port's state.
    pub(crate) fn set_port_up(&self, up: bool) {
        self.port_up.store(up, Ordering::Relaxed);
    }

    /// Queues host event `ev` for VM `vm` and wakes its engine.
    pub(crate) fn post_event(&self, vm: usize, ev: HostEvent) {
        if let Some(v) = self.vms.get(vm) {
            lock(&v.events).push(ev);
            let _ = v.notify.write(1);
        }
    }

    /// VM `vm`'s share of the RNIC.
    pub(crate) fn vm(&self, vm: usize) -> Option<&VmHost> {
        self.vms.get(vm)
    }

    /// The VMs' shares.
    pub(crate) fn vms(&self) -> &[VmHost] {
        &self.vms
    }

    fn tables(&self, vm: usize) -> Result<MutexGuard<'_, Tables>, RnicError> {
        self.vms
            .get(vm)
            .map(|v| lock(&v.tables))
            .ok_or(RnicError::Exhausted)
    }

    /// Grows host CQ `h` of `t` so that `more` more entries fit.
    fn reserve_cqes(&self, t: &mut Tables, h: u32, more: u32) -> Result<(), RnicError> {
        let cq = t.cqs.get_mut(&h).ok_or(RnicError::Host(libc::EINVAL))?;
        let need = cq.need.saturating_add(more);
        if need > self.max_cqe {
            return Err(RnicError::Exhausted);
        }
        if need > cq.size {
            let want = libc::c_int::try_from(need).map_err(|_| RnicError::Exhausted)?;
            // SAFETY: a live CQ of this table.
            let rc = unsafe { ibv_resize_cq(cq.cq.as_ptr(), want) };
            if rc != 0 {
                return Err(host(rc));
            }
            cq.size = need;
        }
        cq.need = need;
        Ok(())
    }

    fn release_cqes(t: &mut Tables, h: u32, n: u32) {
        if let Some(cq) = t.cqs.get_mut(&h) {
            cq.need = cq.need.saturating_sub(n);
        }
    }

    /// The entries a QP may complete into its CQs: its send queue into the
    /// send CQ; its receive queue (or, with an SRQ, the SRQ's depth) into
    /// the receive CQ.
    fn qp_cqes(spec: &QpSpec, srq_depth: u32) -> (u32, u32) {
        let recv = if spec.srq != 0 {
            srq_depth
        } else {
            spec.rq_depth
        };
        (spec.sq_depth, recv)
    }

    /// Makes the window (its mappings from `maps`, the VM's budget) and
    /// the host region of `mr` over `mem`.
    fn register(
        &self,
        pd: &Pd,
        mem: &crate::memory::GuestRam,
        mr: &MrSpec<'_>,
        span: u64,
        maps: &Arc<MapBudget>,
    ) -> Result<Mr, RnicError> {
        let window = Window::map(mem, mr.pages, span, maps).map_err(|e| {
            let status = map_error(&e);
            // A VM past its own budget is a quota like any other (the guest
            // may repeat it at will); the daemon's spent is the operator's.
            if matches!(status, RnicError::Quota(_)) {
                debug!("cannot map a window for a memory region: {e}");
            } else {
                warn!("cannot map a window for a memory region: {e}");
            }
            status
        })?;
        let offset = usize::try_from(mr.first_page_offset).map_err(|_| RnicError::Exhausted)?;
        let len = usize::try_from(mr.length).map_err(|_| RnicError::Exhausted)?;
        let access = attr::mr_access(mr.access);
        // SAFETY: `[window + offset, + len)` lies inside the window (`span`
        // covers the first-page offset and the length), which stays mapped
        // for as long as the region (`Mr` deregisters before it unmaps).
        let raw = unsafe {
            ibv_reg_mr_iova2(
                pd.as_ptr(),
                window.as_ptr().wrapping_add(offset).cast::<c_void>(),
                len,
                mr.iova,
                access,
            )
        };
        let handle = MrHandle::from_raw(raw).ok_or_else(|| host(-1))?;
        Ok(Mr::new(handle, window))
    }

    /// Makes a host QP of `spec` in `t` (its PD, CQs and SRQ there).
    fn make_qp(t: &Tables, spec: &QpSpec) -> Result<Qp, RnicError> {
        let pd = t.pds.get(&spec.pd).ok_or(RnicError::Host(libc::EINVAL))?;
        let cq = |h: u32| {
            t.cqs
                .get(&h)
                .map(|c| c.cq.as_ptr())
                .ok_or(RnicError::Host(libc::EINVAL))
        };
        let srq = match spec.srq {
            0 => std::ptr::null_mut(),
            h => t
                .srqs
                .get(&h)
                .map(|s| s.srq.as_ptr())
                .ok_or(RnicError::Host(libc::EINVAL))?,
        };
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq(spec.send_cq)?,
            recv_cq: cq(spec.recv_cq)?,
            srq,
            cap: rdma_sys::ibv_qp_cap {
                max_send_wr: spec.sq_depth.max(1),
                max_recv_wr: if spec.srq != 0 {
                    0
                } else {
                    spec.rq_depth.max(1)
                },
                max_send_sge: spec.max_send_sge.max(1),
                max_recv_sge: spec.max_recv_sge.max(1),
                max_inline_data: spec.max_inline_data,
            },
            qp_type: match spec.qp_type {
                QpType::UD => ibv_qp_type::IBV_QPT_UD,
                QpType::UC => ibv_qp_type::IBV_QPT_UC,
                _ => ibv_qp_type::IBV_QPT_RC,
            },
            // The data path signals the work requests whose end it must
            // learn (`chain`); `Sent::signaled` says whether the guest
            // sees one.
            sq_sig_all: 0,
        };
        // SAFETY: a live PD, CQs and SRQ of this VM, and a filled
        // attribute structure.
        Qp::from_raw(unsafe { ibv_create_qp(pd.as_ptr(), &mut init) }).ok_or_else(|| host(-1))
    }

    /// Makes the host half of QP `owner` and gives it its number on the
    /// device: the host QP's own (`virtual_qpn` `None`, a QP created
    /// here), or `virtual_qpn` (a QP of a VM that moved here, spec 20.8).
    /// Device numbers are unique on the RNIC: a host number that is a
    /// moved QP's device number already is not used (the host gives
    /// another, [`RENAME_TRIES`] at most), and a virtual number in use is
    /// refused.
    pub(crate) fn add_qp(
        &self,
        owner: Owner,
        spec: &QpSpec,
        virtual_qpn: Option<u32>,
    ) -> Result<u32, RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let mut t = lock(&vm.tables);
        let srq_depth = match spec.srq {
            0 => 0,
            h => t
                .srqs
                .get(&h)
                .map(|s| s.depth)
                .ok_or(RnicError::Host(libc::EINVAL))?,
        };
        // Refused before anything is reserved; given back with the QP.
        let charge = vm.quota.take(Kind::Qp, self.costs.qp)?;
        let (send_more, recv_more) = Self::qp_cqes(spec, srq_depth);
        self.reserve_cqes(&mut t, spec.send_cq, send_more)?;
        if let Err(e) = self.reserve_cqes(&mut t, spec.recv_cq, recv_more) {
            Self::release_cqes(&mut t, spec.send_cq, send_more);
            return Err(e);
        }
        let release = |t: &mut Tables| {
            Self::release_cqes(t, spec.send_cq, send_more);
            Self::release_cqes(t, spec.recv_cq, recv_more);
        };
        // The directory's lock is taken for the number's check and kept
        // until the QP is in it: two claims of one number cannot both pass.
        let mut made = None;
        let mut spares = Vec::new();
        let mut dir = write(&self.qpns);
        for _ in 0..RENAME_TRIES {
            let qp = match Self::make_qp(&t, spec) {
                Ok(qp) => qp,
                Err(e) => {
                    drop(dir);
                    release(&mut t);
                    return Err(e);
                }
            };
            let number = virtual_qpn.unwrap_or(qp.qpn());
            if dir.contains_key(&number) || number == GSI_QPN {
                if virtual_qpn.is_some() {
                    drop(dir);
                    drop(qp);
                    release(&mut t);
                    return Err(RnicError::Invalid);
                }
                // Held until a free one comes, so the host gives another.
                spares.push(qp);
                continue;
            }
            made = Some((qp, number));
            break;
        }
        drop(spares);
        let Some((qp, qpn)) = made else {
            drop(dir);
            release(&mut t);
            return Err(RnicError::Exhausted);
        };
        dir.insert(qpn, owner);
        let host_qpn = qp.qpn();
        if host_qpn != qpn {
            write(&self.renamed).insert(host_qpn, qpn);
            t.renamed.insert(host_qpn, qpn);
        }
        drop(dir);
        vm.qps.fetch_add(1, Ordering::Relaxed);
        t.charges.insert((Kind::Qp, owner.handle), charge);
        t.qps.insert(
            qpn,
            HostQp {
                qp,
                handle: owner.handle,
                qp_type: spec.qp_type,
                send_cq: spec.send_cq,
                recv_cq: spec.recv_cq,
                srq: spec.srq,
                sq_depth: spec.sq_depth,
                rq_depth: if spec.srq != 0 {
                    srq_depth
                } else {
                    spec.rq_depth
                },
                sent: VecDeque::new(),
                next_seq: 0,
                recvd: VecDeque::new(),
                failed: false,
                timeout: 0,
                retry_cnt: 0,
                progress: None,
                timed_out: false,
                bridged: None,
                dest: None,
                rkeys: None,
                held_until: None,
                repoint: None,
                route_gid: None,
            },
        );
        Ok(qpn)
    }

    /// Registers region `owner` and gives it its keys on the device: the
    /// host region's own (`virtual_keys` `None`, a region registered here)
    /// or `virtual_keys` (a region of a VM that moved here, spec 20.8).
    /// Device lkeys are unique on the RNIC, as device QP numbers are
    /// ([`VerbsRnic::add_qp`]).
    pub(crate) fn add_mr(
        &self,
        owner: Owner,
        mr: &MrSpec<'_>,
        virtual_keys: Option<MrKeys>,
    ) -> Result<MrKeys, RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let span = span_of(mr).ok_or(RnicError::Exhausted)?;
        if let Some(k) = virtual_keys {
            if k.lkey == 0 || (k.rkey != 0) != mr.remote || lock(&self.mrs).contains_key(&k.lkey) {
                return Err(RnicError::Invalid);
            }
        }
        let charge = vm.quota.take(Kind::Mr, 0)?;
        let mem = lock(&vm.mem).clone().ok_or(RnicError::Host(libc::EFAULT))?;
        let mut spares = Vec::new();
        for _ in 0..RENAME_TRIES {
            let region = {
                let t = lock(&vm.tables);
                let pd = t.pds.get(&mr.pd).ok_or(RnicError::Host(libc::EINVAL))?;
                self.register(pd, &mem, mr, span, vm.quota.maps())?
            };
            let (lkey, rkey) = region.keys();
            let host_keys = MrKeys {
                lkey,
                rkey: if mr.remote { rkey } else { 0 },
            };
            let keys = virtual_keys.unwrap_or(host_keys);
            let mut mrs = lock(&self.mrs);
            if mrs.contains_key(&keys.lkey) {
                drop(mrs);
                if virtual_keys.is_some() {
                    return Err(RnicError::Invalid);
                }
                // Held until a free key comes, so the host gives another.
                spares.push(region);
                continue;
            }
            mrs.insert(
                keys.lkey,
                HostMr {
                    vm: owner.vm,
                    mr: Some(region),
                    span,
                    _charge: charge,
                },
            );
            drop(mrs);
            if virtual_keys.is_some() {
                let mut t = lock(&vm.tables);
                if keys.lkey != lkey {
                    t.lkeys.insert(keys.lkey, lkey);
                }
                if keys.rkey != 0 {
                    t.arrived
                        .get_or_insert_with(Default::default)
                        .rkeys
                        .push((keys.rkey, host_keys.rkey));
                }
            }
            self.keys
                .fetch_add(1 + u32::from(keys.rkey != 0), Ordering::Relaxed);
            return Ok(keys);
        }
        Err(RnicError::Exhausted)
    }

    /// The device's QP number of host QP `host_qpn` (any VM's).
    pub(crate) fn device_qpn(&self, host_qpn: u32) -> u32 {
        read(&self.renamed)
            .get(&host_qpn)
            .copied()
            .unwrap_or(host_qpn)
    }
}

/// How many host QPs (or regions) the RNIC makes at most to find a host
/// number that is not a moved object's device number: each try holds the
/// ones before, so the host gives another number each time.
const RENAME_TRIES: usize = 8;

/// The span of a region: its first-page offset and length rounded up to
/// whole host pages.
fn span_of(mr: &MrSpec<'_>) -> Option<u64> {
    let end = u64::from(mr.first_page_offset).checked_add(mr.length)?;
    end.checked_next_multiple_of(HOST_PAGE_SIZE)
}

impl RnicObjects for VerbsRnic {
    fn kind(&self) -> RnicKind {
        RnicKind::Verbs
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn port_active(&self) -> bool {
        self.port_up.load(Ordering::Relaxed)
    }

    fn port_gid(&self, _vm: usize) -> Option<[u8; 16]> {
        Some(self.dev.gid().0)
    }

    fn create_pd(&self, owner: Owner) -> Result<(), RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let charge = vm.quota.take(Kind::Pd, 0)?;
        let mut t = lock(&vm.tables);
        // SAFETY: a live context.
        let pd =
            Pd::from_raw(unsafe { ibv_alloc_pd(self.dev.context()) }).ok_or_else(|| host(-1))?;
        t.pds.insert(owner.handle, pd);
        t.charges.insert((Kind::Pd, owner.handle), charge);
        Ok(())
    }

    fn destroy_pd(&self, owner: Owner) {
        if let Ok(mut t) = self.tables(owner.vm) {
            t.pds.remove(&owner.handle);
            t.charges.remove(&(Kind::Pd, owner.handle));
        }
    }

    fn create_qp(&self, owner: Owner, spec: &QpSpec) -> Result<u32, RnicError> {
        self.add_qp(owner, spec, None)
    }

    fn modify_qp(&self, change: &QpChange<'_>) -> Result<(), RnicError> {
        if change.qpn == GSI_QPN {
            // The daemon's QP 1 (no host half; host QP numbers are never
            // 1): its state is the device's alone.
            return Ok(());
        }
        let Some(owner) = self.lookup_qpn(change.qpn) else {
            return Err(RnicError::Host(libc::EINVAL));
        };
        // What the CM bridge says of the QP, asked before the tables are
        // locked (the bridge's lock is never taken under them).
        let rtr = change.to == QpState::RTR && change.from != QpState::RTR;
        let asked = if rtr {
            let a = change.attr;
            self.with_cm(|s| {
                let b = s.bridge();
                let own = b.binding(owner.vm, change.qpn);
                let any = b.binding_for(owner.vm, change.qpn, a.dest_qpn, a.av.dgid);
                (own, any)
            })
        } else {
            None
        };
        let mut t = self.tables(owner.vm)?;
        let q = t
            .qps
            .get_mut(&change.qpn)
            .ok_or(RnicError::Host(libc::EINVAL))?;
        if q.failed && change.to == QpState::ERR {
            return Ok(());
        }
        let mut bridged = q.bridged;
        if let Some((own, any)) = asked.filter(|_| q.qp_type == QpType::RC) {
            if let Some(b) = own {
                if !cm_gate::rtr_matches(&b, change.attr) {
                    debug!(
                        "QPN {:#x}: RTR to {:#x} is not its CM connection's peer",
                        change.qpn, change.attr.dest_qpn
                    );
                    return Err(RnicError::Invalid);
                }
            }
            bridged = any;
        }
        let mut fixed = cm_gate::rts_attr(bridged.as_ref(), change).unwrap_or(*change.attr);
        // A connection to a QP that moved to another host goes where it
        // is now, and its rkeys are translated (spec 20.8).
        let connected = matches!(q.qp_type, QpType::RC | QpType::UC);
        let moved = connected
            .then(|| {
                read(&self.moves)
                    .get(&(fixed.av.dgid, fixed.dest_qpn))
                    .cloned()
            })
            .flatten();
        if let Some(m) = &moved {
            fixed.av.dgid = m.gid;
            fixed.dest_qpn = m.qpn;
        }
        let change = &QpChange {
            attr: &fixed,
            ..*change
        };
        let (mut a, mask) = attr::modify(change, q.qp_type, self.src);
        // SAFETY: a live QP and a filled attribute structure.
        let rc = unsafe { ibv_modify_qp(q.qp.as_ptr(), &mut a, mask) };
        if rc != 0 {
            debug!(
                "QPN {:#x}: host modify {:?} -> {:?} (mask {mask:#x}) refused: errno {}",
                change.qpn,
                change.from,
                change.to,
                errno_of(rc)
            );
            return Err(host(rc));
        }
        q.timeout = change.attr.timeout;
        q.retry_cnt = change.attr.retry_cnt;
        if connected && rtr {
            q.dest = Some((fixed.av.dgid, fixed.dest_qpn));
            q.rkeys = moved.map(|m| m.rkeys);
            q.route_to(fixed.av.dgid);
        }
        q.bridged = if change.to == QpState::RESET {
            None
        } else {
            bridged
        };
        if change.to == QpState::RESET {
            // The host dropped what it had taken; the engine forgets it too.
            q.sent.clear();
            q.recvd.clear();
            q.failed = false;
            q.progress = None;
            q.timed_out = false;
            q.dest = None;
            q.rkeys = None;
            if let Some(vm) = self.vms.get(owner.vm) {
                if q.held_until.take().is_some() {
                    moves::dec(&vm.holding);
                }
                if q.repoint.take().is_some() {
                    moves::dec(&vm.repoints);
                }
            }
        }
        Ok(())
    }

    fn destroy_qp(&self, qpn: u32) {
        // The directory's lock is released before the tables' is taken (the
        // engine takes them in the other order).
        let removed = write(&self.qpns).remove(&qpn);
        let Some(owner) = removed else {
            return;
        };
        let Some(vm) = self.vms.get(owner.vm) else {
            return;
        };
        let mut t = lock(&vm.tables);
        if let Some(q) = t.qps.remove(&qpn) {
            if q.held_until.is_some() {
                moves::dec(&vm.holding);
            }
            if q.repoint.is_some() {
                moves::dec(&vm.repoints);
            }
            let host_qpn = q.host_qpn();
            if t.renamed.remove(&host_qpn).is_some() {
                write(&self.renamed).remove(&host_qpn);
            }
            vm.qps.fetch_sub(1, Ordering::Relaxed);
            let charge = t.charges.remove(&(Kind::Qp, q.handle));
            let (s, r) = (q.sq_depth, q.rq_depth);
            let (send_cq, recv_cq) = (q.send_cq, q.recv_cq);
            // The host QP's mappings are gone once it is: only then are
            // they given back.
            drop(q);
            drop(charge);
            Self::release_cqes(&mut t, send_cq, s);
            Self::release_cqes(&mut t, recv_cq, r);
        }
        drop(t);
        // Its CM connections end with it (the peer hears a DREQ or REJ).
        self.with_cm(|s| s.qp_gone(owner.vm, qpn));
    }

    fn gsi_created(&self, vm: usize) {
        if let Some(hub) = &self.cm {
            hub.gsi_created(vm, |v| self.wake(v));
        }
    }

    fn gsi_destroyed(&self, vm: usize) {
        if let Some(hub) = &self.cm {
            hub.gsi_destroyed(vm, |v| self.wake(v));
        }
    }

    fn lookup_qpn(&self, qpn: u32) -> Option<Owner> {
        read(&self.qpns).get(&qpn).copied()
    }

    fn claim_qp(&self, owner: Owner, qpn: u32, spec: &QpSpec) -> Result<(), RnicError> {
        self.add_qp(owner, spec, Some(qpn)).map(|_| ())
    }

    fn host_at_rest(&self, vm: usize, since: std::time::Instant) -> bool {
        moves::at_rest(self, vm, since)
    }

    fn save_host(&self, vm: usize) -> Result<Option<crate::relocation::HostState>, RnicError> {
        moves::save(self, vm).map(Some)
    }

    fn loads_host_state(&self) -> bool {
        true
    }

    fn restore_qp(
        &self,
        vm: usize,
        qpn: u32,
        to: QpState,
        attr: &virtio_rdma_abi::qp::QpAttr,
        host: Option<&crate::relocation::HostState>,
    ) -> Result<(), RnicError> {
        moves::restore_qp(self, vm, qpn, to, attr, host)
    }

    fn move_record(&self, vm: usize, name: &str) -> Option<crate::relocation::MoveRecord> {
        moves::record(self, vm, name)
    }

    fn wire_qps(&self, vm: usize) -> Option<crate::relocation::WireQps> {
        let host = self.vms.get(vm)?;
        let t = lock(&host.tables);
        let mut qps: Vec<(u32, u32)> = t.qps.iter().map(|(&d, q)| (d, q.host_qpn())).collect();
        qps.sort_unstable();
        Some(crate::relocation::WireQps {
            gid: self.dev.gid().0,
            qps,
        })
    }

    fn peer_hold(&self, gid: [u8; 16], qpns: &[u32], until: std::time::Instant) -> usize {
        moves::hold(self, gid, qpns, until)
    }

    fn peer_moved(&self, record: &crate::relocation::MoveRecord) -> Result<usize, String> {
        moves::moved(self, record)
    }

    fn qpns_in_use(&self) -> usize {
        read(&self.qpns).len()
    }

    fn create_cq(&self, owner: Owner, depth: u32) -> Result<(), RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let charge = vm.quota.take(Kind::Cq, self.costs.cq)?;
        let size = depth.clamp(MIN_CQE, self.max_cqe.max(MIN_CQE));
        let cqe = libc::c_int::try_from(size).map_err(|_| RnicError::Exhausted)?;
        let context = attr::context_of(owner.vm, owner.handle);
        // SAFETY: a live context and channel; the context value is an
        // integer the daemon reads back, never dereferenced.
        let cq = Cq::from_raw(unsafe {
            ibv_create_cq(
                self.dev.context(),
                cqe,
                context as *mut c_void,
                vm.channel.as_ptr(),
                0,
            )
        })
        .ok_or_else(|| host(-1))?;
        let mut t = lock(&vm.tables);
        t.cqs.insert(
            owner.handle,
            HostCq {
                cq,
                size,
                need: size,
            },
        );
        t.charges.insert((Kind::Cq, owner.handle), charge);
        Ok(())
    }

    fn destroy_cq(&self, owner: Owner) {
        if let Ok(mut t) = self.tables(owner.vm) {
            t.cqs.remove(&owner.handle);
            t.charges.remove(&(Kind::Cq, owner.handle));
        }
    }

    fn create_srq(&self, owner: Owner, spec: &SrqSpec) -> Result<(), RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let charge = vm.quota.take(Kind::Srq, self.costs.srq)?;
        let mut t = lock(&vm.tables);
        let pd = t.pds.get(&spec.pd).ok_or(RnicError::Host(libc::EINVAL))?;
        let mut init = ibv_srq_init_attr {
            // An integer the async-event thread reads back.
            srq_context: attr::context_of(owner.vm, owner.handle) as *mut c_void,
            attr: ibv_srq_attr {
                max_wr: spec.depth.max(1),
                max_sge: spec.max_sge.max(1),
                // The device's limit event is the engine's (spec 18.21).
                srq_limit: 0,
            },
        };
        // SAFETY: a live PD and a filled attribute structure.
        let srq = Srq::from_raw(unsafe { ibv_create_srq(pd.as_ptr(), &mut init) })
            .ok_or_else(|| host(-1))?;
        t.srqs.insert(
            owner.handle,
            HostSrq {
                srq,
                depth: spec.depth,
                wr_ids: vec![(0, 0); spec.depth as usize],
                free: (0..spec.depth).rev().collect(),
            },
        );
        t.charges.insert((Kind::Srq, owner.handle), charge);
        vm.srqs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn destroy_srq(&self, owner: Owner) {
        if let Some(vm) = self.vms.get(owner.vm) {
            let mut t = lock(&vm.tables);
            if t.srqs.remove(&owner.handle).is_some() {
                vm.srqs.fetch_sub(1, Ordering::Relaxed);
            }
            t.charges.remove(&(Kind::Srq, owner.handle));
        }
    }

    fn create_ah(&self, owner: Owner, pd: u32, av: &AddressVector) -> Result<(), RnicError> {
        let vm = self.vms.get(owner.vm).ok_or(RnicError::Exhausted)?;
        let charge = vm.quota.take(Kind::Ah, 0)?;
        let mut t = lock(&vm.tables);
        let pd = t.pds.get(&pd).ok_or(RnicError::Host(libc::EINVAL))?;
        let mut a = attr::ah_attr(av, self.src);
        // SAFETY: a live PD and a filled attribute structure. Resolving the
        // destination's MAC may take a moment: this is the control path.
        let ah =
            Ah::from_raw(unsafe { ibv_create_ah(pd.as_ptr(), &mut a) }).ok_or_else(|| host(-1))?;
        t.ahs.insert(owner.handle, ah);
        t.charges.insert((Kind::Ah, owner.handle), charge);
        Ok(())
    }

    fn destroy_ah(&self, owner: Owner) {
        if let Ok(mut t) = self.tables(owner.vm) {
            t.ahs.remove(&owner.handle);
            t.charges.remove(&(Kind::Ah, owner.handle));
        }
    }

    fn reg_mr(&self, owner: Owner, mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        self.add_mr(owner, mr, None)
    }

    fn claim_mr(&self, owner: Owner, keys: MrKeys, mr: &MrSpec<'_>) -> Result<(), RnicError> {
        self.add_mr(owner, mr, Some(keys)).map(|_| ())
    }

    fn dereg_mr(&self, keys: MrKeys) {
        let removed = lock(&self.mrs).remove(&keys.lkey);
        if let Some(m) = removed {
            self.keys
                .fetch_sub(1 + u32::from(keys.rkey != 0), Ordering::Relaxed);
            if let Some(vm) = self.vms.get(m.vm) {
                lock(&vm.tables).lkeys.remove(&keys.lkey);
            }
        }
    }

    fn alloc_fast_mr(&self, _owner: Owner) -> Result<u32, RnicError> {
        // Fast registration through a host NIC is not designed yet
        // (docs/abi-v3-design.md section 6): the device does not offer
        // `F_MEM_MGT`, so `ALLOC_MR` never gets here.
        Err(RnicError::Host(libc::EOPNOTSUPP))
    }

    fn free_fast_mr(&self, _key: u32) {}

    fn keys_in_use(&self) -> usize {
        self.keys.load(Ordering::Relaxed) as usize
    }

    fn host_usage(&self, vm: usize) -> Option<HostUsage> {
        self.vms.get(vm).map(|v| v.quota.usage())
    }

    fn set_memory(&self, vm: usize, mem: Option<&crate::memory::GuestRam>) {
        if let Some(v) = self.vms.get(vm) {
            *lock(&v.mem) = mem.cloned();
        }
    }

    fn remap_mr(&self, keys: MrKeys, mr: &MrSpec<'_>) -> bool {
        let mut mrs = lock(&self.mrs);
        let Some(host) = mrs.get_mut(&keys.lkey) else {
            return false;
        };
        let Some(vm) = self.vms.get(host.vm) else {
            return false;
        };
        let mem = lock(&vm.mem).clone();
        let still = match (&host.mr, &mem) {
            (Some(r), Some(mem)) => r.window().same_backing(mem, mr.pages, host.span),
            _ => false,
        };
        if !still && host.mr.is_some() {
            // The pages the host region pinned are not the guest's any
            // more: it must not keep them (nor let a peer reach them).
            warn!(
                "memory region {:#x}: guest RAM under it changed; the host region is dropped",
                keys.lkey
            );
            host.mr = None;
        }
        still
    }
}
