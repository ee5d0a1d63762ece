//! The object types of the RDMA resource model.

use virtio_rdma_abi::datapath::{Sge, WrOpcode};
use virtio_rdma_abi::mem::QpBufferLayout;
use virtio_rdma_abi::qp::{AddressVector, QpAttr, QpState, QpType};

use crate::memory::access::Translate;
use crate::memory::PageList;
use crate::shmem::DbSlot;

/// A context: one per guest process; owns PDs and CQs.
#[derive(Debug, Default)]
pub struct Context {
    /// Doorbell page (shared-memory doorbell mode), if it has one.
    pub db_page: Option<u32>,
    /// Guest-physical address of its doorbell header in guest RAM (spec
    /// 18.4), used while it has no doorbell page.
    pub db_gpa: u64,
}

/// A protection domain.
#[derive(Debug)]
pub struct Pd {
    /// Owning context.
    pub ctx: u32,
    /// MRs, QPs, AHs and SRQs in this PD.
    pub users: u32,
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    /// Owning context.
    pub ctx: u32,
    /// Number of CQEs.
    pub depth: u32,
    /// Doorbell record address.
    pub db_gpa: u64,
    /// Ring memory.
    pub ring: PageList,
    /// QPs completing into this CQ (a QP using it for send and receive counts twice).
    pub users: u32,
    /// Data-path state.
    pub rt: CqRuntime,
}

/// Data-path state of a CQ, kept by the engine.
#[derive(Debug, Default, Clone, Copy)]
pub struct CqRuntime {
    /// Next CQE index to write.
    pub pi: u32,
    /// `arm_seq` of the last arm request consumed.
    pub armed_seq: u32,
    /// The CQ is in error — it overflowed, or its ring or doorbell record
    /// became unusable (spec 18.17); it accepts no more CQEs.
    pub overflowed: bool,
}

/// Data-path state of a QP, kept by the engine.
#[derive(Debug, Default, Clone)]
pub struct QpRuntime {
    /// Next send WQE index to take.
    pub sq_ci: u32,
    /// Next receive WQE index to consume.
    pub rq_ci: u32,
    /// The send WQE at the head of the queue waits for a retry (spec
    /// 18.20).
    pub wait: Option<SendWait>,
    /// Send WQEs the RNIC has taken and not yet completed (a host
    /// NIC's; the software RNIC completes each as it takes it).
    pub outstanding: u32,
    /// Receive WQEs of its own receive queue the RNIC has taken (a
    /// host NIC's, posted ahead of any message) and not yet completed: the
    /// next one to take is `rq_ci + recv_outstanding`.
    pub recv_outstanding: u32,
    /// The last resolution of an RC destination QPN: (QPN, VM, QP handle,
    /// incarnation). A hint only: the engine checks that the QP behind the
    /// handle still has that QPN and incarnation before it uses it.
    pub peer: Option<(u32, usize, u32, u64)>,
    /// RC: the incarnation of the QP this QP is connected to (its
    /// `dest_qpn` at `av.dgid`), once known — from `MODIFY_QP` if that QP
    /// was live and in reach then, else from the first message that found
    /// it. A send to a destination whose incarnation is no longer live
    /// fails at once with `RETRY_EXC_ERR` (spec 18.23): that QP was
    /// destroyed, and a QP that got its number since is another one.
    pub dest_incarnation: Option<u64>,
    /// The QP failed at a send because that QP was destroyed. Should that
    /// QP have gone with its device instance, the `QP_FATAL` its peers get
    /// is still owed: a send may find it gone between the instance's reset
    /// and the failure of its peers (`VmState::fail_peers_of`).
    pub dest_gone: bool,
    /// `QP_COMM_EST` has been queued since the QP last entered RTR
    /// (cleared by `MODIFY_QP` into RTR).
    pub comm_est: bool,
    /// The send WQE at the head of the queue is an RDMA WRITE executed in
    /// pieces and partly done (the engine interleaves other VMs' work
    /// between pieces).
    pub partial: Option<SendPartial>,
    /// The QP entered `SQD` with `en_sqd_async_notify` while send work was
    /// in flight: `QP_SQ_DRAINED` is owed once that work completes.
    pub drain_owed: bool,
    /// As a responder: the message that arrives in pieces into the
    /// receive WQE it consumed with its first piece.
    pub inbound: Option<Box<Inbound>>,
    /// XRC_TGT: the XRC SRQ the message it takes now names (0: none yet).
    pub xrc_srq: u32,
}

/// A message an RC responder QP is receiving in pieces (a SEND, or an RDMA
/// WRITE with immediate): the receive WQE its first piece consumed, kept
/// until the last piece completes it. The WQE's SGEs are a copy: the guest
/// may rewrite its ring meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The receive WQE's `wr_id`.
    pub wr_id: u64,
    /// Its scatter list (empty for an RDMA WRITE with immediate, whose
    /// data goes to the RDMA target).
    pub sges: Vec<Sge>,
    /// The message length.
    pub len: u64,
    /// Bytes placed so far.
    pub placed: u64,
}

impl QpRuntime {
    /// Whether send work has been started and not completed: WQEs the
    /// RNIC took and completes later, an RDMA WRITE partly executed
    /// in pieces, or a WQE waiting for a retry.
    /// In `SQD` such a WQE still completes (spec 13.3, 18.22).
    pub fn in_flight(&self) -> bool {
        self.outstanding > 0
            || self.partial.is_some_and(|p| p.index == self.sq_ci)
            || self.wait.is_some_and(|w| w.index == self.sq_ci)
    }
}

/// A send WQE (a plain RDMA WRITE) that the engine executes in pieces and
/// has partly done. Its completion is written after the last piece; until
/// then it stays at the head of the send queue. The fields besides `done`
/// are what the first piece checked: a WQE the guest rewrote meanwhile
/// fails instead of resuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendPartial {
    /// Index of the WQE (the head of the send queue).
    pub index: u32,
    /// Bytes written so far (the first `done` bytes of the message).
    pub done: u64,
    /// The WQE's `wr_id`.
    pub wr_id: u64,
    /// The message length (the local SGE list's total).
    pub len: u64,
    /// The WQE's opcode.
    pub opcode: WrOpcode,
    /// The remote key of the whole range.
    pub rkey: u32,
    /// The remote address of the whole range.
    pub remote_addr: u64,
}

/// A send WQE waiting to be tried again: the responder had no receive WQE
/// (RNR) or the destination was unreachable (spec 18.20). Both counters
/// belong to this WQE: the next one starts afresh.
#[derive(Debug, Clone, Copy)]
pub struct SendWait {
    /// Index of the waiting WQE (the head of the send queue).
    pub index: u32,
    /// When the wait ends.
    pub at: std::time::Instant,
    /// RNR retries left (7 when `rnr_retry` is 7: without limit).
    pub rnr_left: u32,
    /// Transport retries left.
    pub retry_left: u32,
    /// When the WQE started waiting for a stopped destination (spec 20.6):
    /// it holds without spending retries until the VM's `pause_hold_ms`
    /// have passed since.
    pub held_since: Option<std::time::Instant>,
    /// The last try found the destination unreachable with no retry left:
    /// when the wait ends the WQE fails with `RETRY_EXC_ERR`, untried. Holds
    /// its `wr_id` and completion opcode.
    pub exhausted: Option<(u64, virtio_rdma_abi::datapath::WcOpcode)>,
}

/// Data-path state of an SRQ, kept by the engine.
#[derive(Debug, Default, Clone, Copy)]
pub struct SrqRuntime {
    /// Next WQE index to consume.
    pub ci: u32,
    /// WQEs the RNIC has taken and not yet completed (the next one to
    /// take is `ci + outstanding`).
    pub outstanding: u32,
    /// The SRQ failed (ring or doorbell record unusable, producer index out
    /// of range): the device consumes no more of its WQEs (spec 18.21).
    pub broken: bool,
}

/// A memory region.
#[derive(Debug)]
pub struct Mr {
    /// Protection domain.
    pub pd: u32,
    /// Context of the PD.
    pub ctx: u32,
    /// Access flags.
    pub access: u32,
    /// Address the region is known by.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Offset of `iova` within the first page.
    pub first_page_offset: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key (0: no remote access).
    pub rkey: u32,
    /// Translation of the region's pages.
    pub pages: PageList,
    /// The RNIC dropped the region's host registration because guest
    /// RAM under it moved or left (spec 19.6.2): its keys fail from now on.
    pub host_lost: bool,
    /// The region has an rkey whatever its access (`F_RESIZE`: a later
    /// `REREG_MR` may grant remote access under a key a peer already
    /// holds; spec 12.10).
    pub keyed: bool,
    /// An `ALLOC_MR` region (fast registration, spec 18.27): its `lkey`
    /// and `rkey` are its one key, and `pages` the translation space
    /// allocated for it, which each `REG_MR` work request fills.
    pub fast: Option<FastReg>,
}

/// What an `ALLOC_MR` region has besides an MR's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastReg {
    /// Most pages one registration may give it (the capacity of its
    /// translation).
    pub max_num_sg: u32,
    /// Registered by a `REG_MR` work request and not invalidated since:
    /// its key is in the VM's key maps. A free region has `length` 0 and
    /// none.
    pub valid: bool,
}

impl Translate for Mr {
    fn translate(&self, iova: u64, len: u64) -> Option<(u64, u64)> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.length {
            return None;
        }
        self.pages
            .translate(off.checked_add(u64::from(self.first_page_offset))?)
    }

    #[inline]
    fn walk(&self, iova: u64, len: u64, f: impl FnMut(u64, u64)) -> Option<()> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.length {
            return None;
        }
        self.pages
            .walk(off.checked_add(u64::from(self.first_page_offset))?, len, f)
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    /// Protection domain.
    pub pd: u32,
    /// Context of the PD.
    pub ctx: u32,
    /// Transport type.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: u32,
    /// CQ for receive completions.
    pub recv_cq: u32,
    /// SRQ handle or 0.
    pub srq: u32,
    /// XRC_TGT: its XRC domain; 0 for every other type.
    pub xrcd: u32,
    /// `QP_FLAG_*` bits.
    pub flags: u32,
    /// QP number.
    pub qpn: u32,
    /// Its incarnation: unique among all QPs the process ever had, unlike
    /// its number, which the RNIC may give to a later QP (spec
    /// 18.23). Set with the number.
    pub incarnation: u64,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
    /// SGEs per send WQE.
    pub max_send_sge: u32,
    /// SGEs per receive WQE.
    pub max_recv_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline_data: u32,
    /// Ring layout.
    pub layout: QpBufferLayout,
    /// Doorbell record address.
    pub db_gpa: u64,
    /// Doorbell slot (shared-memory doorbell mode), if it has one.
    pub db_slot: Option<DbSlot>,
    /// Ring memory.
    pub ring: PageList,
    /// Current state.
    pub state: QpState,
    /// Current attributes (as last applied).
    pub attr: QpAttr,
    /// Data-path state.
    pub rt: QpRuntime,
}

/// An address handle.
#[derive(Debug)]
pub struct Ah {
    /// Protection domain.
    pub pd: u32,
    /// Context of the PD.
    pub ctx: u32,
    /// Port.
    pub port: u32,
    /// Destination.
    pub av: AddressVector,
}

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    /// Protection domain.
    pub pd: u32,
    /// Context of the PD.
    pub ctx: u32,
    /// Number of WQEs.
    pub depth: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Armed limit (0: disarmed).
    pub limit: u32,
    /// log2 of the WQE stride.
    pub wqe_shift: u32,
    /// Doorbell record address.
    pub db_gpa: u64,
    /// Doorbell slot (shared-memory doorbell mode), if it has one.
    pub db_slot: Option<DbSlot>,
    /// Ring memory.
    pub ring: PageList,
    /// QPs attached.
    pub users: u32,
    /// An XRC SRQ's domain, CQ and number (`CREATE_XRC_SRQ`).
    pub xrc: Option<XrcSrq>,
    /// Data-path state.
    pub rt: SrqRuntime,
}

/// Host memory an object holds for its VM while it lives, in bytes: the
/// object itself (it lives in a handle-table slot) and what it owns on the
/// heap — the page-list translation of an MR or a queue ring, an MR's key
/// map entries, the engine's per-QP state. Charged against the VM's
/// `max_host_bytes` when the object is created and given back when it is
/// destroyed. A deterministic function of the object, so the charge and
/// the refund are always equal.
pub trait HostCost {
    /// Bytes held.
    fn host_cost(&self) -> u64;

    /// The object's translation, if it has one (for freeing it outside the
    /// VM's lock when the object is dropped without being created).
    fn into_pages(self) -> Option<PageList>
    where
        Self: Sized,
    {
        None
    }
}

/// A handle-table slot's own bytes besides the object (its generation).
const SLOT_BYTES: u64 = 8;
/// One entry of an lkey or rkey map (key, handle, control byte, rounded up
/// for the table's spare capacity).
const KEY_ENTRY_BYTES: u64 = 16;
/// Key-map entries of an `ALLOC_MR` region: its key as lkey and rkey while
/// registered, and its bits 31 to 8 in the map of fast regions.
const FAST_KEY_ENTRIES: u64 = 3;
/// What the heap grows by per MR beyond the object, its translation and
/// its key entries: the allocator's rounding of a short page list (a
/// one-page list is an 8-byte allocation in a 32-byte chunk), the key
/// tables' spare buckets and the daemon-wide key directory. Set from
/// `ctrl_bench --only objects` (100,000 one-page MRs: 172–178 bytes
/// measured per MR against 104 charged without it), with some margin.
const MR_EXTRA_BYTES: u64 = 80;
/// What the engine keeps per QP outside the object (its entry in the
/// serving thread's polling list and scheduler), an upper estimate.
const ENGINE_QP_BYTES: u64 = 128;
/// The most a QP receiving a message in pieces holds ([`Inbound`] with the
/// SGEs of a receive WQE, at most 30 by the `max_recv_sge` range).
const INBOUND_BYTES: u64 = std::mem::size_of::<Inbound>() as u64 + 30 * 16;

fn own<T>() -> u64 {
    (std::mem::size_of::<T>() as u64).saturating_add(SLOT_BYTES)
}

impl HostCost for Context {
    fn host_cost(&self) -> u64 {
        own::<Self>()
    }
}

impl HostCost for Pd {
    fn host_cost(&self) -> u64 {
        own::<Self>()
    }
}

impl HostCost for Ah {
    fn host_cost(&self) -> u64 {
        own::<Self>()
    }
}

impl HostCost for Cq {
    fn host_cost(&self) -> u64 {
        own::<Self>().saturating_add(self.ring.host_bytes())
    }

    fn into_pages(self) -> Option<PageList> {
        Some(self.ring)
    }
}

impl HostCost for Srq {
    fn host_cost(&self) -> u64 {
        own::<Self>().saturating_add(self.ring.host_bytes())
    }

    fn into_pages(self) -> Option<PageList> {
        Some(self.ring)
    }
}

impl Qp {
    /// The [`HostCost`] of a QP whose ring is `ring` (known before the QP
    /// is built, to check the budget before a QP number is taken).
    pub fn cost_with_ring(ring: &PageList) -> u64 {
        own::<Self>()
            .saturating_add(ring.host_bytes())
            .saturating_add(ENGINE_QP_BYTES + INBOUND_BYTES)
    }
}

impl HostCost for Qp {
    fn host_cost(&self) -> u64 {
        Qp::cost_with_ring(&self.ring)
    }

    fn into_pages(self) -> Option<PageList> {
        Some(self.ring)
    }
}

/// A memory window (spec 12.23, 18.29).
#[derive(Debug)]
pub struct Mw {
    /// Protection domain.
    pub pd: u32,
    /// Context of the PD.
    pub ctx: u32,
    /// `MW_TYPE_1` or `MW_TYPE_2`.
    pub mw_type: u32,
    /// Its key: bits 31 to 8 drawn at `ALLOC_MW`, bits 7 to 0 the last
    /// bind's consumer byte.
    pub key: u32,
    /// What it grants while bound; `None` while free.
    pub binding: Option<Binding>,
}

/// A bound window's grant: a range of an MR with remote rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The MR's handle.
    pub mr: u32,
    /// First byte, in the MR's address space.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// Remote rights (`ACCESS_REMOTE_*`).
    pub access: u32,
    /// Type 2: the QP that bound it (handle and incarnation), the only one
    /// it may be accessed through. `None` for type 1.
    pub qp: Option<(u32, u64)>,
}

impl HostCost for Mw {
    fn host_cost(&self) -> u64 {
        // The object and its entry in the key map.
        own::<Self>().saturating_add(KEY_ENTRY_BYTES)
    }
}

impl Mr {
    /// An `ALLOC_MR` region of PD `pd` (context `ctx`), free, with room
    /// for `max_num_sg` pages; its key comes from the RNIC.
    pub fn fast(pd: u32, ctx: u32, max_num_sg: u32) -> Mr {
        Mr {
            pd,
            ctx,
            access: 0,
            iova: 0,
            length: 0,
            first_page_offset: 0,
            lkey: 0,
            rkey: 0,
            pages: PageList::reserved(max_num_sg),
            host_lost: false,
            keyed: false,
            fast: Some(FastReg {
                max_num_sg,
                valid: false,
            }),
        }
    }

    /// The [`HostCost`] of an `ALLOC_MR` region of `max_num_sg` pages,
    /// before it is built (to check the budget before anything is
    /// allocated).
    pub fn fast_cost(max_num_sg: u32) -> u64 {
        own::<Self>()
            .saturating_add(u64::from(max_num_sg).saturating_mul(8))
            .saturating_add(FAST_KEY_ENTRIES * KEY_ENTRY_BYTES)
            .saturating_add(MR_EXTRA_BYTES)
    }

    /// Whether the region grants any remote access (and so has an rkey).
    pub fn remote(&self) -> bool {
        Mr::remote_access(self.access)
    }

    /// Whether access flags `access` grant any remote access.
    pub fn remote_access(access: u32) -> bool {
        use virtio_rdma_abi::mem::access;
        access & (access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
    }

    /// The [`HostCost`] of a `REG_MR` region whose translation holds
    /// `pages_bytes` and which has an rkey if `remote`.
    pub fn reg_cost(pages_bytes: u64, remote: bool) -> u64 {
        let keys = if remote {
            2 * KEY_ENTRY_BYTES
        } else {
            KEY_ENTRY_BYTES
        };
        own::<Self>()
            .saturating_add(pages_bytes)
            .saturating_add(keys)
            .saturating_add(MR_EXTRA_BYTES)
    }

    /// The region as an RNIC registers it.
    pub fn spec(&self) -> crate::rnic_objects::MrSpec<'_> {
        crate::rnic_objects::MrSpec {
            pd: self.pd,
            access: self.access,
            iova: self.iova,
            length: self.length,
            remote: self.remote() || self.keyed,
            first_page_offset: self.first_page_offset,
            pages: &self.pages,
        }
    }
}

impl HostCost for Mr {
    fn host_cost(&self) -> u64 {
        if self.fast.is_some() {
            // Fixed for the region's life, whatever it registers: its
            // translation never grows past what `ALLOC_MR` allocated.
            return own::<Self>()
                .saturating_add(self.pages.host_bytes())
                .saturating_add(FAST_KEY_ENTRIES * KEY_ENTRY_BYTES)
                .saturating_add(MR_EXTRA_BYTES);
        }
        Mr::reg_cost(self.pages.host_bytes(), self.remote() || self.keyed)
    }

    fn into_pages(self) -> Option<PageList> {
        Some(self.pages)
    }
}

/// An XRC domain. Scoped to its VM: SRQs and XRC_TGT QPs of any context
/// of the VM may belong to it (a guest kernel shares one domain between
/// processes); it goes with the context that opened it.
#[derive(Debug)]
pub struct Xrcd {
    /// Owning context.
    pub ctx: u32,
    /// XRC SRQs and XRC_TGT QPs in this domain.
    pub users: u32,
}

impl HostCost for Xrcd {
    fn host_cost(&self) -> u64 {
        own::<Self>()
    }
}

/// What makes an SRQ an XRC SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrq {
    /// Its XRC domain.
    pub xrcd: u32,
    /// The CQ its receive completions go to.
    pub cq: u32,
    /// Its number on the RNIC (24 bits, never 0).
    pub srqn: u32,
}
