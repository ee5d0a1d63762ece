//! What a saved device state holds (spec 20.2).

use serde::{Deserialize, Serialize};

/// The device state of one VM's device instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// The name of the VM that saved it: a state loads only into that VM's
    /// instances (spec 20.5).
    pub vm: String,
    /// Chosen at random when it was saved; a daemon loads each id once,
    /// and only the last one the VM saved (spec 20.5).
    pub migration_id: u64,
    /// The virtio features the driver negotiated; the destination must have
    /// negotiated the same before it loads the state.
    pub features: u64,
    /// The instance's node GUID: a guest reads it once and keeps it.
    pub guid: u64,
    /// The event queue: the next sequence number and the events waiting
    /// for a buffer.
    pub events: EventsState,
    /// Every object.
    pub objects: Objects,
    /// The contexts' doorbell pages and the queues' slots in the
    /// shared-memory doorbell region: only in a state handed over to a new
    /// daemon with the region itself (spec 20.7), never in a migration's
    /// (20.2). Encoded after the rest, in format version 2 only
    /// ([`super::format`]).
    #[serde(skip)]
    pub doorbells: Option<DoorbellsState>,
    /// The host halves of the QPs, saved on the libibverbs transport
    /// (spec 20.8): their PSNs and where their requests went. Encoded
    /// after the rest, in format version 3 only ([`super::format`]).
    #[serde(skip)]
    pub host: Option<crate::relocation::HostState>,
}

/// Which doorbell page each context has and which slot each queue has
/// (spec 18.7): what the instance's allocation of its region was. The
/// contents (producer indices, page headers) stay in the region, which
/// travels as a file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoorbellsState {
    /// Context handle and its page.
    pub pages: Vec<(u32, u32)>,
    /// QP handle and its slot (in its context's page).
    pub qp_slots: Vec<(u32, u32)>,
    /// SRQ handle and its slot (in its context's page).
    pub srq_slots: Vec<(u32, u32)>,
    /// Pages of contexts of an earlier connection that the driver may
    /// still map (spec 15.2): not given to a new context before a reset.
    pub quarantined: Vec<u32>,
}

/// The event queue's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsState {
    /// Sequence number of the last event queued.
    pub last_seq: u32,
    /// Events lost in the current loss run, and the first one's sequence
    /// number.
    pub lost: u32,
    /// Sequence number of the first event of the current loss run.
    pub first_lost_seq: u32,
    /// Events waiting: kind, handle, detail, sequence number.
    pub pending: Vec<[u32; 4]>,
}

/// A handle table as saved: the generation of every slot (0 for a
/// retired one), the free slots in the order they are reused, and the
/// live objects with their handles. The layout is kept so that handles
/// given out after the load never equal a handle of the source (spec
/// 9.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table<T> {
    /// Generation of each slot.
    pub gens: Vec<u32>,
    /// Free slots, last reused first.
    pub free: Vec<u32>,
    /// Live objects: handle and object.
    pub live: Vec<(u32, T)>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            gens: Vec::new(),
            free: Vec::new(),
            live: Vec::new(),
        }
    }
}

/// A page list: the page size and the guest-physical address of every
/// page (one address and a count for a contiguous list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PagesState {
    /// `npages` pages from `base` on.
    Contiguous {
        /// log2 of the page size.
        page_shift: u32,
        /// Pages.
        npages: u32,
        /// First page.
        base: u64,
    },
    /// Each page.
    List {
        /// log2 of the page size.
        page_shift: u32,
        /// The pages.
        pages: Vec<u64>,
    },
}

/// Every object of the instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Objects {
    /// Contexts.
    pub ctxs: Table<CtxState>,
    /// Protection domains: their context.
    pub pds: Table<u32>,
    /// Completion queues.
    pub cqs: Table<CqState>,
    /// Memory regions.
    pub mrs: Table<MrState>,
    /// Memory windows.
    pub mws: Table<MwState>,
    /// Queue pairs.
    pub qps: Table<QpState>,
    /// Address handles.
    pub ahs: Table<AhState>,
    /// Shared receive queues.
    pub srqs: Table<SrqState>,
    /// XRC domains: their context.
    pub xrcds: Table<u32>,
    /// Multicast groups and the QP handles attached to each.
    pub mcast: Vec<([u8; 16], Vec<u32>)>,
    /// The GSI QP's handle.
    pub gsi: Option<u32>,
}

/// A context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtxState {
    /// Its doorbell header in guest RAM.
    pub db_gpa: u64,
}

/// A completion queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CqState {
    /// Owning context.
    pub ctx: u32,
    /// CQEs.
    pub depth: u32,
    /// Doorbell record.
    pub db_gpa: u64,
    /// Ring.
    pub ring: PagesState,
    /// Next CQE index to write.
    pub pi: u32,
    /// Last arm sequence consumed.
    pub armed_seq: u32,
    /// In error.
    pub overflowed: bool,
}

/// A memory region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrState {
    /// Protection domain.
    pub pd: u32,
    /// Access flags.
    pub access: u32,
    /// Address it is known by.
    pub iova: u64,
    /// Bytes.
    pub length: u64,
    /// Offset of `iova` in the first page.
    pub first_page_offset: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key (0: none).
    pub rkey: u32,
    /// Pages.
    pub pages: PagesState,
    /// Has an rkey whatever its access (`F_RESIZE`).
    pub keyed: bool,
    /// `ALLOC_MR` region: capacity and whether it is registered.
    pub fast: Option<(u32, bool)>,
}

/// A memory window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MwState {
    /// Protection domain.
    pub pd: u32,
    /// Type 1 or 2.
    pub mw_type: u32,
    /// Key.
    pub key: u32,
    /// Binding: MR handle, address, length, rights, binding QP (handle).
    pub binding: Option<(u32, u64, u64, u32, Option<u32>)>,
}

/// An address handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AhState {
    /// Protection domain.
    pub pd: u32,
    /// Port.
    pub port: u32,
    /// `AddressVector`, as on the wire.
    pub av: Vec<u8>,
}

/// A shared receive queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqState {
    /// Protection domain.
    pub pd: u32,
    /// WQEs.
    pub depth: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Armed limit.
    pub limit: u32,
    /// log2 of the WQE stride.
    pub wqe_shift: u32,
    /// Doorbell record.
    pub db_gpa: u64,
    /// Ring.
    pub ring: PagesState,
    /// XRC: domain, CQ, SRQ number.
    pub xrc: Option<(u32, u32, u32)>,
    /// Next WQE to consume.
    pub ci: u32,
    /// Failed.
    pub broken: bool,
}

/// A queue pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpState {
    /// Protection domain (0 for an XRC target).
    pub pd: u32,
    /// Its context.
    pub ctx: u32,
    /// `QpType` value.
    pub qp_type: u32,
    /// CQs for sends and receives.
    pub send_cq: u32,
    /// CQ for receives.
    pub recv_cq: u32,
    /// SRQ handle or 0.
    pub srq: u32,
    /// XRC domain of a target, else 0.
    pub xrcd: u32,
    /// `QP_FLAG_*`.
    pub flags: u32,
    /// QP number.
    pub qpn: u32,
    /// Its incarnation (its peers' QPs know it by it, spec 18.23).
    pub incarnation: u64,
    /// Depths, SGEs and inline bytes: sq, rq, send SGEs, recv SGEs, inline.
    pub caps: [u32; 5],
    /// Ring layout: send and receive WQE shifts, receive ring offset,
    /// total bytes.
    pub layout: (u32, u32, u64, u64),
    /// Doorbell record.
    pub db_gpa: u64,
    /// Ring.
    pub ring: PagesState,
    /// `QpState` value.
    pub state: u32,
    /// `QpAttr` as last applied, as on the wire.
    pub attr: Vec<u8>,
    /// Data-path state.
    pub rt: QpRuntimeState,
}

/// What the engine keeps of a QP besides its ring (spec 20.2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpRuntimeState {
    /// Next send WQE to take.
    pub sq_ci: u32,
    /// Next receive WQE to consume.
    pub rq_ci: u32,
    /// The head WQE waiting for a retry: index, microseconds left, RNR
    /// retries left, transport retries left, held for a stopped peer,
    /// exhausted (`wr_id`, completion opcode).
    pub wait: Option<WaitState>,
    /// The incarnation of the QP it is connected to, once known.
    pub dest_incarnation: Option<u64>,
    /// The destination was destroyed.
    pub dest_gone: bool,
    /// `COMM_EST` queued since RTR.
    pub comm_est: bool,
    /// A WRITE in pieces: index, bytes done, `wr_id`, length, opcode,
    /// rkey, remote address.
    pub partial: Option<(u32, u64, u64, u64, u32, u32, u64)>,
    /// `SQ_DRAINED` owed.
    pub drain_owed: bool,
    /// A message being received in pieces.
    pub inbound: Option<InboundState>,
    /// XRC target: the SRQ of the message being taken.
    pub xrc_srq: u32,
}

/// A message a responder QP is receiving in pieces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundState {
    /// The receive WQE's `wr_id`.
    pub wr_id: u64,
    /// Its SGEs (copied when the first piece took it): address, length,
    /// lkey.
    pub sges: Vec<(u64, u32, u32)>,
    /// The message length.
    pub len: u64,
    /// Bytes placed so far.
    pub placed: u64,
}

/// A send WQE's retry wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitState {
    /// WQE index.
    pub index: u32,
    /// Microseconds until the wait ends (0: it has ended).
    pub left_us: u64,
    /// RNR retries left.
    pub rnr_left: u32,
    /// Transport retries left.
    pub retry_left: u32,
    /// Held for a stopped peer since this many microseconds before the
    /// save.
    pub held_us: Option<u64>,
    /// Retries used up: `wr_id` and completion opcode.
    pub exhausted: Option<(u64, u32)>,
}
