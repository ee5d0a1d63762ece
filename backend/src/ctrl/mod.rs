//! The control-verb dispatcher.
//!
//! One [`Ctrl`] per VM executes control commands: it parses the request
//! (copied out of guest memory beforehand), validates every field against
//! the VM's objects, limits and RAM, applies the command, and produces the
//! response. Nothing here trusts the guest: every failure is a status code.

mod cq;
mod ctx;
mod mr;
mod parse;
mod policy;
mod qp;
mod query;
mod queue_mem;
mod srq;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use log::debug;
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, ResponseHeader, Status, DETAIL_NONE};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use crate::config::Limits;
use crate::events::EventQueue;
use crate::keys::KeySource;
use crate::memory::pagelist::PageListLimits;
use crate::memory::RamMap;
use crate::resources::handle::HandleTable;
use crate::resources::{HostCost, VmResources};
use crate::rnic::Rnic;
use crate::shmem::DbSlot;
use crate::tenancy::Tenancy;

/// A failed command: its status and detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdError {
    /// Status code.
    pub status: Status,
    /// Detail value (see the spec's status table).
    pub detail: u32,
}

impl CmdError {
    /// An error with a detail.
    pub fn new(status: Status, detail: u32) -> Self {
        CmdError { status, detail }
    }

    /// Host resources ran out (a table is full).
    pub fn no_memory() -> Self {
        CmdError::new(Status::NO_MEMORY, DETAIL_NONE)
    }
}

/// Result of a command handler: the response payload.
pub type CmdResult = Result<Vec<u8>, CmdError>;

pub use mr::{Prepared, Preparer};
pub use virtio_rdma_abi::ctrl::{quota, DETAIL_DB_RECORD, DETAIL_LIST_PAGE};

crate::stats::sums! {
/// Counters of control-path activity of one VM.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CtrlStats {
    /// Commands that completed with OK.
    pub ok: u64,
    /// Commands that completed with an error status.
    pub failed: u64,
    /// Chains that could not be answered at all (used length 0).
    pub malformed: u64,
}
}

/// Identity of the VM's port (its GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortIdentity {
    /// The VM's GID (table index 0).
    pub gid: [u8; 16],
    /// GUID of this device instance (node and system image GUID): one per
    /// VM, so guests cannot tell that they share a host.
    pub guid: u64,
    /// Index of the VM in the daemon (its socket's position).
    pub vm: usize,
}

/// Per-VM control state.
pub struct Ctrl {
    /// The VM's objects.
    pub res: VmResources,
    /// Pending asynchronous events.
    pub events: EventQueue,
    /// Activity counters.
    pub stats: CtrlStats,
    limits: Limits,
    features: u64,
    rnic: Arc<dyn Rnic>,
    keys: KeySource,
    ram: RamMap,
    /// Advances with every [`Ctrl::set_ram`]: a translation prepared
    /// against an older map is built again (see [`Prepared`]).
    ram_gen: u64,
    port: PortIdentity,
    tenancy: Arc<Tenancy>,
    /// The doorbell flags of the engine serving the VM (`DB_FLAG_KICK`
    /// while it sleeps, `DB_FLAG_POLLING` while it polls and lets drivers
    /// skip the fence): queues created meanwhile start with them.
    db_flags: Arc<AtomicU32>,
    /// A command changed something the engine must act on (see
    /// [`Ctrl::take_engine_work`]).
    engine_work: bool,
    /// The device is started (spec 15.1): only then does the engine
    /// execute the VM's work and do peers' messages reach it. Changed by
    /// the device under the VM's lock.
    running: bool,
}

/// Most GIDs a port has: index 0, assigned by the operator.
pub const GID_TABLE_LEN: u32 = 1;

impl Ctrl {
    /// Creates the control state of one VM.
    pub fn new(
        limits: Limits,
        rnic: Arc<dyn Rnic>,
        port: PortIdentity,
        tenancy: Arc<Tenancy>,
    ) -> Self {
        Ctrl {
            res: VmResources::default(),
            events: EventQueue::default(),
            stats: CtrlStats::default(),
            limits,
            features: 0,
            rnic,
            keys: KeySource::new(),
            ram: RamMap::default(),
            ram_gen: 0,
            port,
            tenancy,
            db_flags: Arc::new(AtomicU32::new(0)),
            engine_work: false,
            running: false,
        }
    }

    /// Shares the engine's doorbell flags ([`crate::engine::Engine`]).
    pub fn set_doorbell_flags(&mut self, flags: Arc<AtomicU32>) {
        self.db_flags = flags;
    }

    /// The device flags a new doorbell record or page starts with: those
    /// the engine gives the existing ones — kicks while it sleeps, so a
    /// post to the new queue wakes it. Read under the VM's lock, which
    /// orders it with the engine's updates.
    pub(crate) fn new_doorbell_flags(&self) -> u32 {
        self.db_flags.load(Ordering::SeqCst)
    }

    /// Whether a command since the last call may have made posted work
    /// startable or in need of a flush (a QP state change, a QP failed by
    /// the control path): the engine must look even if no doorbell rings.
    /// Creating objects needs no wake-up: new queues have no work yet, and
    /// ask for kicks themselves ([`Ctrl::new_doorbell_flags`]).
    pub fn take_engine_work(&mut self) -> bool {
        std::mem::take(&mut self.engine_work)
    }

    /// Index of the VM in the daemon.
    pub fn vm_index(&self) -> usize {
        self.port.vm
    }

    /// The daemon's tenancy table (isolation policy and counters).
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// The VM's GID.
    pub fn port_gid(&self) -> [u8; 16] {
        self.port.gid
    }

    /// Sets the device features the driver negotiated.
    pub fn set_features(&mut self, features: u64) {
        self.features = features;
    }

    /// Replaces the view of guest RAM (after a memory table update).
    pub fn set_ram(&mut self, ram: RamMap) {
        self.ram = ram;
        // Only compared for equality: wrapping is harmless.
        self.ram_gen = self.ram_gen.wrapping_add(1);
    }

    /// Whether the device is started (see `running`).
    pub fn running(&self) -> bool {
        self.running
    }

    /// Marks the device started or stopped.
    pub fn set_running(&mut self, on: bool) {
        self.running = on;
    }

    /// Writes the engine's current doorbell flags into the header of every
    /// context (spec 18.4): at a start, since the engine leaves a stopped
    /// device's memory alone and its headers may show a state it has left.
    pub fn refresh_doorbell_flags(&self, mem: &crate::memory::HostMem) {
        let v = self.new_doorbell_flags();
        for (_, ctx) in self.res.ctxs.iter() {
            if ctx.db_page.is_none() {
                let _ = crate::memory::access::store_u32_release(mem, ctx.db_gpa, v);
            }
        }
        if let Some(pages) = &self.res.doorbells {
            pages.set_flags_all(v);
        }
    }

    /// Destroys every object and drops pending events (device reset or
    /// disconnect). Returns the QP numbers of the RC QPs it destroyed, so
    /// that the QPs of other VMs connected to them can be failed.
    pub fn reset(&mut self) -> Vec<u32> {
        let rc: Vec<u32> = self
            .res
            .qps
            .iter()
            .filter(|(_, q)| q.qp_type == virtio_rdma_abi::qp::QpType::RC)
            .map(|(_, q)| q.qpn)
            .collect();
        self.res.clear(self.rnic.as_ref());
        // Freed here, under the lock, as before: reset and disconnect are
        // rare, and nothing drains them afterwards.
        drop(self.res.take_released());
        self.events.reset();
        rc
    }

    /// The RC QPs of this VM connected to one of `qpns` at `gid` (QPs of a
    /// device instance that went away) move to `ERR` with `QP_FATAL`; the
    /// engine then flushes their work (spec 18.23). Returns how many.
    pub fn fail_peers_of(&mut self, gid: [u8; 16], qpns: &[u32]) -> usize {
        use virtio_rdma_abi::qp::{QpState, QpType};
        let hit: Vec<u32> = self
            .res
            .qps
            .iter()
            .filter(|(_, q)| {
                q.qp_type == QpType::RC
                    && matches!(
                        q.state,
                        QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE
                    )
                    && q.attr.av.dgid == gid
                    && qpns.binary_search(&q.attr.dest_qpn).is_ok()
            })
            .map(|(h, _)| h)
            .collect();
        for &h in &hit {
            self.qp_enter_err(h, Some(virtio_rdma_abi::event::EventKind::QP_FATAL));
        }
        hit.len()
    }

    /// Notes a chain that could not be answered.
    pub fn count_malformed(&mut self) {
        self.stats.malformed = self.stats.malformed.saturating_add(1);
    }

    /// The context of PD `pd`, or `BAD_HANDLE` naming the `pd_handle`
    /// field of `T`.
    fn pd_ctx<T: Wire>(&self, pd: u32) -> Result<u32, CmdError> {
        self.res
            .pds
            .get(pd)
            .map(|p| p.ctx)
            .ok_or_else(|| parse::field::<T>(Status::BAD_HANDLE, "pd_handle"))
    }

    /// A doorbell slot for a new queue of context `ctx`, if the context
    /// has a doorbell page with a free slot.
    fn alloc_db_slot(&mut self, ctx: u32) -> Option<DbSlot> {
        let page = self.res.ctxs.get(ctx)?.db_page?;
        self.res.doorbells.as_mut()?.alloc_slot(page)
    }

    fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    /// Whether the driver negotiated `F_ATOMIC`: without it an atomic send
    /// WQE is malformed (spec 18.8).
    pub fn atomics_negotiated(&self) -> bool {
        self.has(virtio_rdma_abi::config::F_ATOMIC)
    }

    fn page_list_limits(&self) -> PageListLimits {
        PageListLimits {
            max_pages: self.limits.max_mr_pages(),
            max_inline: self.limits.max_inline_pages,
            page_size_cap: self.limits.page_size_cap,
            max_list_bytes: self.host_bytes_left(),
        }
    }

    /// What is left of the VM's host memory budget (`max_host_bytes`).
    fn host_bytes_left(&self) -> u64 {
        self.limits
            .max_host_bytes
            .saturating_sub(self.res.host_bytes)
    }

    /// `QUOTA` (detail `HOST_BYTES`) unless the budget can take `cost`.
    fn host_room(&self, cost: u64) -> Result<(), CmdError> {
        if cost > self.host_bytes_left() {
            return Err(CmdError::new(Status::QUOTA, quota::HOST_BYTES));
        }
        Ok(())
    }

    /// Inserts `obj` into the table `table` picks and charges its host
    /// memory: `QUOTA` when the budget cannot take it, `NO_MEMORY` when the
    /// table has no free slot.
    fn insert_charged<T: HostCost>(
        &mut self,
        table: fn(&mut VmResources) -> &mut HandleTable<T>,
        obj: T,
    ) -> Result<u32, CmdError> {
        let cost = obj.host_cost();
        let refused = match self.host_room(cost) {
            Ok(()) => match table(&mut self.res).insert(obj) {
                Ok(handle) => {
                    self.res.charge(cost);
                    return Ok(handle);
                }
                Err(obj) => (obj, CmdError::no_memory()),
            },
            Err(e) => (obj, e),
        };
        // Its translation is freed after the VM's lock is released.
        if let Some(pages) = refused.0.into_pages() {
            self.res.release(pages);
        }
        Err(refused.1)
    }

    /// Executes one request. `writable` is the size of the device-writable
    /// part of the chain; the returned bytes (header + payload) never
    /// exceed it when it is at least a header.
    pub fn execute<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
    ) -> Vec<u8> {
        self.execute_prepared(mem, request, writable, None)
    }

    /// [`Ctrl::execute`] with the expensive part of the command done
    /// beforehand, without the VM's lock ([`Preparer::prepare`] on the same
    /// request bytes). The response is the one `execute` would give.
    pub fn execute_prepared<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
        prepared: Option<Prepared>,
    ) -> Vec<u8> {
        let (request_id, result) = self.dispatch(mem, request, writable, prepared);
        let (status, detail, payload) = match result {
            Ok(p) => (Status::OK, 0, p),
            Err(e) => (e.status, e.detail, Vec::new()),
        };
        if status == Status::OK {
            self.stats.ok = self.stats.ok.saturating_add(1);
        } else {
            self.stats.failed = self.stats.failed.saturating_add(1);
            debug!(
                "request {request_id:#x}: {} (detail {detail:#x})",
                status.name()
            );
        }
        let mut out = ResponseHeader {
            request_id,
            status: status.into(),
            detail,
        }
        .to_bytes();
        out.extend_from_slice(&payload);
        out
    }

    fn dispatch<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        request: &[u8],
        writable: usize,
        prepared: Option<Prepared>,
    ) -> (u64, CmdResult) {
        let Some(head) = request.get(..RequestHeader::SIZE) else {
            return (0, Err(CmdError::new(Status::INVALID, 0)));
        };
        let hdr = RequestHeader::read(head);
        let payload = request.get(RequestHeader::SIZE..).unwrap_or(&[]);
        if let Err(e) = RequestHeader::parse(head) {
            return (hdr.request_id, Err(parse::wire_error::<RequestHeader>(e)));
        }
        let Some(op) = Opcode::from_u32(hdr.opcode) else {
            return (
                hdr.request_id,
                Err(CmdError::new(Status::UNSUPPORTED, hdr.opcode)),
            );
        };
        let need = ResponseHeader::SIZE.saturating_add(response_size(op));
        if writable < need {
            // Not executed: the driver could not learn the outcome.
            let n = u32::try_from(need).unwrap_or(DETAIL_NONE);
            return (hdr.request_id, Err(CmdError::new(Status::INVALID, n)));
        }
        let result = match op {
            Opcode::QUERY_DEVICE => self.query_device(payload),
            Opcode::QUERY_PORT => self.query_port(payload),
            Opcode::QUERY_GID => self.query_gid(payload),
            Opcode::CREATE_CTX => self.create_ctx(mem, payload),
            Opcode::DESTROY_CTX => self.destroy_ctx(payload),
            Opcode::ALLOC_PD => self.alloc_pd(payload),
            Opcode::DEALLOC_PD => self.dealloc_pd(payload),
            Opcode::CREATE_CQ => self.create_cq(mem, payload),
            Opcode::DESTROY_CQ => self.destroy_cq(payload),
            Opcode::REG_MR => {
                let mut prepared = prepared;
                let r = self.reg_mr(mem, payload, &mut prepared);
                // Prepared but not used (an earlier check failed): freed
                // after the VM's lock is released, like the translations
                // of destroyed objects.
                if let Some(Prepared { pages: Ok(p), .. }) = prepared {
                    self.res.release(p);
                }
                r
            }
            Opcode::DEREG_MR => self.dereg_mr(payload),
            Opcode::CREATE_QP => self.create_qp(mem, payload),
            Opcode::MODIFY_QP => self.modify_qp(mem, payload),
            Opcode::QUERY_QP => self.query_qp(payload),
            Opcode::DESTROY_QP => self.destroy_qp(payload),
            Opcode::CREATE_AH => self.create_ah(payload),
            Opcode::DESTROY_AH => self.destroy_ah(payload),
            Opcode::CREATE_SRQ => self.create_srq(mem, payload),
            Opcode::MODIFY_SRQ => self.modify_srq(payload),
            Opcode::QUERY_SRQ => self.query_srq(payload),
            Opcode::DESTROY_SRQ => self.destroy_srq(payload),
        };
        (hdr.request_id, result)
    }
}

/// Size of the response payload of `op`.
pub fn response_size(op: Opcode) -> usize {
    use Opcode::*;
    match op {
        QUERY_DEVICE => DeviceAttr::SIZE,
        QUERY_PORT => PortAttr::SIZE,
        QUERY_GID => QueryGidResp::SIZE,
        CREATE_CTX => CreateCtxResp::SIZE,
        ALLOC_PD => PdHandleResp::SIZE,
        CREATE_CQ => CqHandleResp::SIZE,
        REG_MR => RegMrResp::SIZE,
        CREATE_QP => CreateQpResp::SIZE,
        QUERY_QP => QueryQpResp::SIZE,
        CREATE_AH => AhHandleResp::SIZE,
        CREATE_SRQ => CreateSrqResp::SIZE,
        QUERY_SRQ => QuerySrqResp::SIZE,
        DESTROY_CTX | DEALLOC_PD | DESTROY_CQ | DEREG_MR | MODIFY_QP | DESTROY_QP | DESTROY_AH
        | MODIFY_SRQ | DESTROY_SRQ => 0,
    }
}
