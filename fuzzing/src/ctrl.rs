//! Target `ctrl`: control-command sequences through the real dispatcher.
//!
//! Drives [`VmState::execute`] exactly as `device.rs::handle_chain` calls it
//! (the request bytes copied out of the chain, the size of the writable
//! part) against a real `GuestMemoryMmap` of three RAM regions with holes.
//! The input is a sequence of [`Step`]s: mostly well-formed commands whose
//! handles come from earlier responses, some of them with one field
//! overwritten, plus raw requests and writes into guest memory (indirect
//! page lists, rings).
//!
//! Invariants, checked after every command:
//! - no panic;
//! - the response is well-formed: at least a header, no longer than the
//!   writable part, the request id echoed, a status code of the spec, and
//!   exactly the response payload of the opcode on `OK` (none otherwise);
//! - a created object gets a non-zero handle no live object of its kind has;
//! - the live objects are exactly those the responses said were created
//!   and not destroyed since (per kind, with `DESTROY_CTX` taking its
//!   context's objects), never more than the limits allow;
//! - registered bytes equal the sum of the lengths of the live MRs;
//! - at most one live QP is the GSI QP, numbered 1 and the one the VM
//!   knows as such, and every other live QP holds a QP number of the RNIC
//!   (QP 1 is none of the RNIC's).
//!
//! At the end everything is destroyed with commands (each destroy of a
//! live object must succeed) or with [`VmState::reset`]; then no object, no
//! registered byte and no QP number remain.

use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use vhost_user_rdma::config::DaemonConfig;
use vhost_user_rdma::ctrl::response_size;
use vhost_user_rdma::keys::LOCAL_DMA_LKEY;
use vhost_user_rdma::memory::RamMap;
use vhost_user_rdma::rnic::soft::SoftRnic;
use vhost_user_rdma::rnic_objects::RnicObjects;
use vhost_user_rdma::tenancy::Tenancy;
use vhost_user_rdma::vm::{PortIdentity, VmState};
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::verbs::{rc_transitions, ud_transitions};
use virtio_rdma_abi::config::ALL_DEVICE_FEATURES;
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, ResponseHeader, Status};
use virtio_rdma_abi::datapath::CtxDoorbell;
use virtio_rdma_abi::mem::{
    indirect_list_pages, qp_buffer_layout, recv_wqe_shift, BufferDesc, PageListMode, CQE_SIZE,
    DB_RECORD_SIZE, LIST_PAGE_ENTRIES, LIST_PAGE_SIZE,
};
use virtio_rdma_abi::qp::{attr, AddressVector, QpAttr, QpState, QpType, GSI_QKEY, GSI_QPN};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::{Bytes, GuestAddress};

use crate::guest::{self, Addr, PAGE};

/// Most steps one input runs.
const MAX_STEPS: usize = 96;
/// GID of the fuzzed VM (VM 0 of a default configuration).
fn gid() -> [u8; 16] {
    vhost_user_rdma::config::default_gid(0)
}

/// Small limits, so that the fuzzer reaches every one of them.
pub fn limits() -> Limits {
    Limits {
        max_ctx: 3,
        max_pd: 4,
        max_cq: 6,
        max_qp: 6,
        max_mr: 8,
        max_srq: 3,
        max_ah: 4,
        max_cqe: 256,
        max_qp_wr: 64,
        max_srq_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
        max_inline_pages: 32,
        max_mr_size: 1 << 20,
        max_mr_bytes: 3 << 19,
        ..Limits::default()
    }
}

/// A handle in a command: mostly one a response returned.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum H {
    /// Live object number `.0` (modulo how many there are) of the kind.
    Live(u8),
    /// A raw value.
    Raw(u32),
}

/// How a page list is sent.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum ListMode {
    /// Page addresses in the request.
    Inline,
    /// List pages in guest memory.
    Indirect,
    /// One contiguous run of pages.
    Contiguous,
    /// An undefined mode.
    Raw(u32),
}

/// How many pages a page list declares.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Count {
    /// As many as the buffer needs.
    Exact,
    /// One more or one less than needed.
    OffByOne(bool),
    /// Any number.
    Raw(u16),
}

/// A fuzzer-described page list.
#[derive(Debug, Clone, Arbitrary)]
pub struct ListIn {
    /// Mode.
    pub mode: ListMode,
    /// Pages (cycled when more are needed; RAM pages when empty).
    pub pages: Vec<Addr>,
    /// Page count.
    pub count: Count,
    /// Extra page shift (mostly 0: 4 KiB pages).
    pub shift: u8,
    /// Where the indirect list pages go.
    pub list_at: Addr,
    /// Garbage in the tail of the request (wrong lengths).
    pub tail_cut: Option<u8>,
}

/// One control operation.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// QUERY_DEVICE.
    QueryDevice,
    /// QUERY_PORT.
    QueryPort(u32),
    /// QUERY_GID.
    QueryGid(u32, u32),
    /// CREATE_CTX, with its doorbell header.
    CreateCtx(Addr),
    /// DESTROY_CTX.
    DestroyCtx(H),
    /// ALLOC_PD.
    AllocPd(H),
    /// DEALLOC_PD.
    DeallocPd(H),
    /// CREATE_CQ.
    CreateCq {
        /// Context.
        ctx: H,
        /// log2 of the depth.
        depth_log: u8,
        /// Doorbell record.
        db: Addr,
        /// Ring.
        buf: ListIn,
    },
    /// DESTROY_CQ.
    DestroyCq(H),
    /// REG_MR.
    RegMr {
        /// PD.
        pd: H,
        /// Access flags (low bits).
        access: u8,
        /// iova.
        iova: u64,
        /// Length.
        length: u32,
        /// Offset in the first page.
        first_page_offset: u16,
        /// Pages.
        buf: ListIn,
    },
    /// DEREG_MR.
    DeregMr(H),
    /// ALLOC_MR (`F_MEM_MGT`): a fast-registration region.
    AllocMr {
        /// PD.
        pd: H,
        /// Pages of one registration (modulo 600: mostly in range).
        max_num_sg: u16,
    },
    /// ALLOC_MW (`F_MW`): a memory window.
    AllocMw {
        /// PD.
        pd: H,
        /// Type (modulo 4: 1 and 2 valid, 0 and 3 not).
        mw_type: u8,
    },
    /// DEALLOC_MW.
    DeallocMw(H),
    /// ATTACH_MCAST (`F_MCAST`) of a QP to group `group` (modulo 8:
    /// 239.1.1.x; 7: a unicast GID).
    AttachMcast {
        /// QP.
        qp: H,
        /// Group.
        group: u8,
    },
    /// DETACH_MCAST.
    DetachMcast {
        /// QP.
        qp: H,
        /// Group.
        group: u8,
    },
    /// CREATE_QP.
    CreateQp {
        /// PD.
        pd: H,
        /// UD rather than RC (GSI when `sq_log` is 0xc0 or above; without
        /// `ud`, UC when it is 0x80 or above).
        ud: bool,
        /// Send CQ.
        send_cq: H,
        /// Receive CQ.
        recv_cq: H,
        /// SRQ.
        srq: Option<H>,
        /// log2 of the send queue depth.
        sq_log: u8,
        /// log2 of the receive queue depth.
        rq_log: u8,
        /// SGEs per send WQE.
        send_sge: u8,
        /// SGEs per receive WQE.
        recv_sge: u8,
        /// Inline bytes.
        inline: u8,
        /// Doorbell record.
        db: Addr,
        /// Rings.
        buf: ListIn,
    },
    /// MODIFY_QP, a step of the usual transitions.
    ModifyQp {
        /// QP.
        qp: H,
        /// Which transition.
        step: u8,
        /// Destination QP (by QP, or a raw number).
        dest: H,
        /// Bits flipped in the mask (rarely).
        mask_xor: Option<u32>,
    },
    /// QUERY_QP.
    QueryQp(H),
    /// DESTROY_QP.
    DestroyQp(H),
    /// CREATE_AH.
    CreateAh {
        /// PD.
        pd: H,
        /// Port (1 unless set).
        port: Option<u8>,
        /// Own GID (else zero).
        own_gid: bool,
        /// sgid index, hop limit, traffic class, SL.
        av: [u8; 4],
    },
    /// DESTROY_AH.
    DestroyAh(H),
    /// CREATE_SRQ.
    CreateSrq {
        /// PD.
        pd: H,
        /// log2 of the depth.
        depth_log: u8,
        /// SGEs.
        max_sge: u8,
        /// Limit.
        limit: u8,
        /// Doorbell record.
        db: Addr,
        /// Ring.
        buf: ListIn,
    },
    /// MODIFY_SRQ.
    ModifySrq {
        /// SRQ.
        srq: H,
        /// Mask.
        mask: u8,
        /// max_wr.
        max_wr: u16,
        /// limit.
        limit: u16,
        /// With `SRQ_ATTR_MAX_WR`, the new ring (`F_RESIZE`; without it
        /// the version 2 form, which the device refuses then).
        buf: Option<ListIn>,
    },
    /// RESIZE_CQ (`F_RESIZE`).
    ResizeCq {
        /// CQ.
        cq: H,
        /// log2 of the new depth.
        depth_log: u8,
        /// New ring.
        buf: ListIn,
    },
    /// REREG_MR (`F_RESIZE`).
    ReregMr {
        /// MR.
        mr: H,
        /// `REREG_*` flags (modulo 16: 0 and 8 invalid).
        flags: u8,
        /// New PD.
        pd: H,
        /// New access flags (low bits).
        access: u8,
        /// New iova.
        iova: u64,
        /// New length.
        length: u32,
        /// Offset in the first page.
        first_page_offset: u16,
        /// New pages.
        buf: ListIn,
    },
    /// QUERY_SRQ.
    QuerySrq(H),
    /// DESTROY_SRQ.
    DestroySrq(H),
    /// A raw request.
    Raw {
        /// Opcode (an index into the known ones when small).
        opcode: u16,
        /// Payload.
        payload: Vec<u8>,
    },
    /// Bytes written into guest memory (rings, list pages).
    Write {
        /// Where.
        at: Addr,
        /// What.
        data: Vec<u8>,
    },
    /// Device reset in the middle.
    Reset,
    /// OPEN_XRCD (`F_XRC`) in a context.
    OpenXrcd(H),
    /// CLOSE_XRCD.
    CloseXrcd(H),
    /// CREATE_XRC_SRQ (`F_XRC`).
    CreateXrcSrq {
        /// PD.
        pd: H,
        /// XRC domain.
        xrcd: H,
        /// CQ of its receive completions.
        cq: H,
        /// log2 of the depth.
        depth_log: u8,
        /// SGEs.
        max_sge: u8,
        /// Doorbell record.
        db: Addr,
        /// Ring.
        buf: ListIn,
    },
    /// CREATE_QP of an XRC_TGT QP in a domain (with a PD as well when
    /// `pd` is set: refused).
    CreateTgtQp {
        /// XRC domain.
        xrcd: H,
        /// A PD it must not have.
        pd: Option<H>,
    },
}

/// Size of the writable part of the chain.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Writable {
    /// Exactly header plus payload.
    Exact,
    /// Plenty.
    Large,
    /// Plenty (a second variant, so that most sizes are right).
    Large2,
    /// Any size.
    Raw(u8),
}

/// One step: an operation, perhaps with one payload field overwritten.
#[derive(Debug, Clone, Arbitrary)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// `(when, offset, value)`: 4 bytes of the payload overwritten when
    /// `when` is a multiple of 4.
    pub tweak: Option<(u8, u8, u32)>,
    /// Writable size.
    pub writable: Writable,
    /// Header: the reserved word (only 0xff makes it non-zero, 1).
    pub reserved: u8,
}

/// The whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// Features negotiated: all, unless this is 0xf0 or above (then its
    /// low bits).
    pub features: u8,
    /// Finish with a device reset instead of destroy commands.
    pub finish_reset: bool,
    /// The steps.
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy)]
struct Obj {
    h: u32,
    ctx: u32,
    /// QPN (QPs), length (MRs).
    extra: u64,
}

/// The harness's model: the objects the responses created.
#[derive(Default, Debug)]
struct Model {
    ctx: Vec<Obj>,
    pd: Vec<Obj>,
    cq: Vec<Obj>,
    mr: Vec<Obj>,
    mw: Vec<Obj>,
    qp: Vec<Obj>,
    ah: Vec<Obj>,
    srq: Vec<Obj>,
    xrcd: Vec<Obj>,
    /// XRC_TGT QPs and XRC SRQs: (handle, is a QP, domain).
    in_domain: Vec<(u32, bool, u32)>,
}

impl Model {
    fn clear(&mut self) {
        *self = Model::default();
    }

    fn all_mut(&mut self) -> [&mut Vec<Obj>; 7] {
        [
            &mut self.pd,
            &mut self.cq,
            &mut self.mr,
            &mut self.mw,
            &mut self.qp,
            &mut self.ah,
            &mut self.srq,
        ]
    }

    fn drop_ctx(&mut self, ctx: u32) {
        // Its domains go, and with them their target QPs and XRC SRQs, of
        // whatever context (spec 12.28).
        let domains: Vec<u32> = self
            .xrcd
            .iter()
            .filter(|o| o.ctx == ctx)
            .map(|o| o.h)
            .collect();
        for &(h, is_qp, x) in &self.in_domain {
            if domains.contains(&x) {
                remove(if is_qp { &mut self.qp } else { &mut self.srq }, h);
            }
        }
        self.xrcd.retain(|o| o.ctx != ctx);
        self.ctx.retain(|o| o.h != ctx);
        for list in self.all_mut() {
            list.retain(|o| o.ctx != ctx);
        }
        self.forget_gone();
    }

    /// Drops the domain entries of destroyed QPs and SRQs.
    fn forget_gone(&mut self) {
        let (qp, srq) = (&self.qp, &self.srq);
        self.in_domain.retain(|&(h, is_qp, _)| {
            let list = if is_qp { qp } else { srq };
            list.iter().any(|o| o.h == h)
        });
    }

    fn registered(&self) -> u64 {
        self.mr.iter().map(|o| o.extra).sum()
    }
}

fn pick(list: &[Obj], h: H) -> u32 {
    match h {
        H::Live(i) if !list.is_empty() => list[usize::from(i) % list.len()].h,
        H::Live(i) => u32::from(i),
        H::Raw(v) => v,
    }
}

fn ctx_of(list: &[Obj], h: u32) -> u32 {
    list.iter().find(|o| o.h == h).map_or(0, |o| o.ctx)
}

fn remove(list: &mut Vec<Obj>, h: u32) {
    list.retain(|o| o.h != h);
}

/// Builds the page list of a buffer of `bytes` bytes (plus
/// `first_page_offset`), writing indirect list pages into `mem`.
fn page_list(
    mem: &vhost_user_rdma::memory::GuestRam,
    l: &ListIn,
    bytes: u64,
    first_page_offset: u32,
) -> (BufferDesc, Vec<u8>) {
    let shift = 12 + u32::from(if l.shift % 4 == 3 { l.shift % 3 } else { 0 });
    let size = 1u64 << shift;
    let need = (bytes + u64::from(first_page_offset)).div_ceil(size).max(1);
    let npages = match l.count {
        Count::Exact => need,
        Count::OffByOne(more) => {
            if more {
                need + 1
            } else {
                need - 1
            }
        }
        Count::Raw(n) => u64::from(n),
    };
    // At most one list page worth of real entries; a larger declared count
    // is still sent (the device must refuse it without reading far).
    let real = npages.min(LIST_PAGE_ENTRIES);
    let addrs: Vec<u64> = (0..real)
        .map(|i| match l.pages.get(i as usize % l.pages.len().max(1)) {
            Some(a) if !l.pages.is_empty() => {
                a.aligned(size)
                    .wrapping_add(if l.pages.len() == 1 { i * size } else { 0 })
            }
            _ => guest::page_gpa(i * (size / PAGE)) & !(size - 1),
        })
        .collect();
    let mode = match l.mode {
        ListMode::Inline => u32::from(PageListMode::INLINE),
        ListMode::Indirect => u32::from(PageListMode::INDIRECT),
        ListMode::Contiguous => u32::from(PageListMode::CONTIGUOUS),
        ListMode::Raw(m) => m,
    };
    let npages32 = u32::try_from(npages).unwrap_or(u32::MAX);
    let mut desc = BufferDesc {
        addr: 0,
        npages: npages32,
        first_page_offset,
        page_shift: shift,
        mode,
    };
    let mut tail = Vec::new();
    match PageListMode::from_u32(mode) {
        Some(PageListMode::INLINE) => {
            tail = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
        }
        Some(PageListMode::CONTIGUOUS) => {
            desc.addr = match l.pages.first() {
                Some(a) => a.aligned(size),
                None => 0,
            };
        }
        Some(PageListMode::INDIRECT) => {
            let lists = indirect_list_pages(npages32).min(4);
            for k in 0..lists {
                let at = l
                    .list_at
                    .aligned(LIST_PAGE_SIZE)
                    .wrapping_add(k * LIST_PAGE_SIZE);
                let from = (k * LIST_PAGE_ENTRIES) as usize;
                let entries: Vec<u8> = addrs
                    .iter()
                    .skip(from)
                    .take(LIST_PAGE_ENTRIES as usize)
                    .flat_map(|a| a.to_le_bytes())
                    .collect();
                // Outside RAM the write fails: the device must then refuse
                // the list page, which is what is being tested.
                let _ = mem.write_slice(&entries, GuestAddress(at));
                tail.extend_from_slice(&at.to_le_bytes());
            }
        }
        None => tail = addrs.iter().take(4).flat_map(|a| a.to_le_bytes()).collect(),
    }
    if let Some(cut) = l.tail_cut {
        tail.truncate(usize::from(cut) % (tail.len() + 1));
    }
    (desc, tail)
}

fn depth(log: u8) -> u32 {
    1u32 << (log % 10)
}

/// See [`Vm::data_plane_view`].
type DataPlaneView = (
    Vec<(u32, u32, String, u32, u64, Option<String>)>,
    Vec<u32>,
    bool,
);

/// The fuzzed VM: its dispatcher, memory and the model.
pub(crate) struct Vm {
    pub(crate) ctrl: VmState,
    pub(crate) mem: vhost_user_rdma::memory::GuestRam,
    rnic: Arc<SoftRnic>,
    model: Model,
    next_id: u64,
    limits: Limits,
}

impl Vm {
    pub(crate) fn new(features: u64) -> Vm {
        let mem = guest::memory();
        let rnic = Arc::new(SoftRnic::new());
        let config = DaemonConfig::new(vec!["/nonexistent/fuzz.sock".into()]);
        let tenancy = Arc::new(Tenancy::from_config(&config));
        let port = PortIdentity {
            gids: config.gid_table(0),
            guid: 0x0200_0000_0000_0001,
            vm: 0,
        };
        let limits = limits();
        let dyn_rnic: Arc<dyn RnicObjects> = rnic.clone();
        let mut ctrl = VmState::new(limits, dyn_rnic, port, tenancy);
        ctrl.set_ram(RamMap::from_guest_memory(&mem));
        ctrl.set_features(features);
        Vm {
            ctrl,
            mem,
            rnic,
            model: Model::default(),
            next_id: 1,
            limits,
        }
    }

    /// Executes one request and checks the response; returns its status and
    /// payload.
    pub(crate) fn exec(
        &mut self,
        opcode: u32,
        payload: &[u8],
        writable: Writable,
        bad_reserved: bool,
    ) -> (Status, Vec<u8>) {
        let request_id = self.next_id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.next_id += 1;
        let mut request = RequestHeader {
            request_id,
            opcode,
            reserved: u32::from(bad_reserved),
        }
        .to_bytes();
        request.extend_from_slice(payload);
        let op = Opcode::from_u32(opcode);
        let full = ResponseHeader::SIZE + op.map_or(0, response_size);
        let writable = match writable {
            Writable::Exact => full,
            Writable::Large | Writable::Large2 => 4096,
            Writable::Raw(n) => usize::from(n),
        };
        let before = self.data_plane_view();
        let out = self.ctrl.execute(&self.mem, &request, writable);
        check_response(&out, request_id, op, writable);
        // The engine rebuilds its polling list of a VM only when told: a
        // command that changed what the list is built from must say so.
        let told = self.ctrl.take_dp_changed();
        assert!(
            told || self.data_plane_view() == before,
            "{} changed the VM's QPs or doorbells without telling the engine",
            op.map_or("unknown", Opcode::name)
        );
        let hdr = ResponseHeader::read(&out);
        let status = Status::from_u32(hdr.status).expect("checked status");
        if trace() {
            eprintln!(
                "ctrl: {} -> {}",
                op.map_or("unknown", Opcode::name),
                status.name()
            );
        }
        (status, out[ResponseHeader::SIZE..].to_vec())
    }

    /// What the engine's polling list of the VM is built from: each QP's
    /// handle, number, state, SRQ and doorbell, and the contexts.
    fn data_plane_view(&self) -> DataPlaneView {
        let res = &self.ctrl.res;
        let qps = res
            .qps
            .iter()
            .map(|(h, qp)| {
                let slot = qp.db_slot.as_ref().map(|s| format!("{:?}", s.at()));
                (
                    h,
                    qp.qpn,
                    format!("{:?}", qp.state),
                    qp.srq,
                    qp.db_gpa,
                    slot,
                )
            })
            .collect();
        let ctxs = res.ctxs.iter().map(|(h, _)| h).collect();
        (qps, ctxs, res.doorbells.is_some())
    }

    fn check_state(&self) {
        let c = self.ctrl.res.counts();
        let m = &self.model;
        let got = [c.ctx, c.pd, c.cq, c.mr + c.mw, c.qp, c.ah, c.srq];
        let want = [
            m.ctx.len(),
            m.pd.len(),
            m.cq.len(),
            m.mr.len() + m.mw.len(),
            m.qp.len(),
            m.ah.len(),
            m.srq.len(),
        ];
        assert_eq!(
            got, want,
            "live objects (ctx pd cq mr+mw qp ah srq) differ from what the responses said"
        );
        assert_eq!(c.mw, m.mw.len(), "live memory windows");
        assert_eq!(c.xrcd, m.xrcd.len(), "live XRC domains");
        assert!(c.xrcd <= MAX_XRCD as usize, "{} XRC domains", c.xrcd);
        // Spec 12.29: every XRC SRQ has a number of its own, in the map,
        // and a live domain and CQ; every target QP a live domain.
        let res = &self.ctrl.res;
        let mut numbers = Vec::new();
        for (h, srq) in res.srqs.iter() {
            if let Some(x) = srq.xrc {
                assert!(
                    x.srqn != 0 && x.srqn <= 0x00ff_ffff,
                    "SRQ number {:#x}",
                    x.srqn
                );
                assert_eq!(res.srqns.get(&x.srqn), Some(&h), "SRQ number map");
                assert!(
                    res.xrcds.get(x.xrcd).is_some(),
                    "XRC SRQ of a closed domain"
                );
                assert!(res.cqs.get(x.cq).is_some(), "XRC SRQ of a destroyed CQ");
                numbers.push(x.srqn);
            }
        }
        assert_eq!(numbers.len(), res.srqns.len(), "stale SRQ numbers");
        for (_, q) in res.qps.iter() {
            assert_eq!(
                q.qp_type == QpType::XRC_TGT,
                q.xrcd != 0 && res.xrcds.get(q.xrcd).is_some(),
                "a target QP and only one has a live domain"
            );
        }
        // Spec 12.27: only live UD QPs are attached to groups, within the
        // limits.
        let groups = &self.ctrl.res.mcast;
        assert!(
            groups.len() <= MAX_MCAST_GRP as usize,
            "{} groups",
            groups.len()
        );
        for (g, qps) in groups {
            assert!(is_multicast_gid(g) && !qps.is_empty(), "group {g:?}");
            assert!(qps.len() <= MAX_MCAST_QP_ATTACH as usize);
            for h in qps {
                let q = self.ctrl.res.qps.get(*h).expect("an attached QP is live");
                assert_eq!(q.qp_type, QpType::UD, "only UD QPs are attached");
            }
        }
        // Windows count against max_mr with the MRs (spec 12.23).
        let l = &self.limits;
        let max = [
            l.max_ctx, l.max_pd, l.max_cq, l.max_mr, l.max_qp, l.max_ah, l.max_srq,
        ];
        for (n, lim) in got.iter().zip(max) {
            assert!(*n <= lim as usize, "{got:?} exceeds limits {max:?}");
        }
        assert_eq!(
            c.registered_bytes,
            m.registered(),
            "registered bytes differ from the sum of the live MRs' lengths"
        );
        let sum: u64 = self.ctrl.res.mrs.iter().map(|(_, mr)| mr.length).sum();
        assert_eq!(
            c.registered_bytes, sum,
            "registered-bytes accounting drifted"
        );
        assert!(
            c.registered_bytes <= l.max_mr_bytes,
            "registered bytes beyond max_mr_bytes"
        );
        let gsi: Vec<&Obj> =
            m.qp.iter()
                .filter(|o| o.extra == u64::from(GSI_QPN))
                .collect();
        assert!(gsi.len() <= 1, "more than one GSI QP: {gsi:?}");
        assert_eq!(
            self.ctrl.res.gsi_qp(),
            gsi.first().map(|o| o.h),
            "the VM's GSI QP is not the one the responses created"
        );
        // Spec 12.22: an ALLOC_MR region's key is its lkey and rkey, and no
        // other live key of the VM (or the local DMA key) shares its bits
        // 31 to 8.
        let mrs = &self.ctrl.res.mrs;
        // Memory windows own their bits 31 to 8 as fast regions do (spec
        // 12.23): one list.
        let fast: Vec<u32> = mrs
            .iter()
            .filter(|(_, mr)| mr.fast.is_some())
            .map(|(_, mr)| {
                assert_eq!(mr.lkey, mr.rkey, "a fast region with two keys");
                mr.lkey >> 8
            })
            .chain(self.ctrl.res.mws.iter().map(|(_, mw)| mw.key >> 8))
            .collect();
        for (i, p) in fast.iter().enumerate() {
            assert_ne!(
                *p,
                LOCAL_DMA_LKEY >> 8,
                "a fast region has the local DMA key's bits"
            );
            assert!(
                !fast[..i].contains(p),
                "two fast regions or windows share bits 31..8"
            );
        }
        for (_, mr) in mrs.iter().filter(|(_, mr)| mr.fast.is_none()) {
            for k in [mr.lkey, mr.rkey].into_iter().filter(|&k| k != 0) {
                assert!(
                    !fast.contains(&(k >> 8)) && k != LOCAL_DMA_LKEY,
                    "key {k:#x} shares bits 31..8 with a fast region"
                );
            }
        }
        assert_eq!(
            self.rnic.qpns_in_use() + gsi.len(),
            c.qp,
            "QP numbers allocated differ from live QPs (QP 1 is the VM's own)"
        );
        for o in &m.qp {
            let q = self.ctrl.res.qps.get(o.h).expect("a live QP");
            assert_eq!(
                q.qp_type == QpType::GSI,
                o.extra == u64::from(GSI_QPN),
                "QP 1 is the GSI QP and only it: {o:?}"
            );
            assert!(
                q.qp_type == QpType::GSI || q.attr.qkey & 0x8000_0000 == 0,
                "a QP other than the GSI QP has a privileged Q_Key: {:#x}",
                q.attr.qkey
            );
            // Never set (0, as after RESET) or the GSI's.
            if q.qp_type == QpType::GSI {
                assert!(
                    matches!(q.attr.qkey, 0 | GSI_QKEY),
                    "the GSI QP has another Q_Key: {:#x}",
                    q.attr.qkey
                );
            }
        }
    }

    fn step(&mut self, s: &Step) {
        let m = &self.model;
        let (opcode, mut payload): (Opcode, Vec<u8>) = match &s.op {
            Op::QueryDevice => (Opcode::QUERY_DEVICE, Vec::new()),
            Op::QueryPort(port) => (Opcode::QUERY_PORT, QueryPortReq { port: *port }.to_bytes()),
            Op::QueryGid(port, index) => (
                Opcode::QUERY_GID,
                QueryGidReq {
                    port: *port,
                    index: *index,
                }
                .to_bytes(),
            ),
            Op::CreateCtx(db) => (
                Opcode::CREATE_CTX,
                CreateCtxReq {
                    db_gpa: db.aligned(CtxDoorbell::SIZE as u64),
                }
                .to_bytes(),
            ),
            Op::DestroyCtx(h) => (
                Opcode::DESTROY_CTX,
                CtxHandleReq {
                    ctx_handle: pick(&m.ctx, *h),
                }
                .to_bytes(),
            ),
            Op::AllocPd(h) => (
                Opcode::ALLOC_PD,
                CtxHandleReq {
                    ctx_handle: pick(&m.ctx, *h),
                }
                .to_bytes(),
            ),
            Op::DeallocPd(h) => (
                Opcode::DEALLOC_PD,
                PdHandleReq {
                    pd_handle: pick(&m.pd, *h),
                }
                .to_bytes(),
            ),
            Op::CreateCq {
                ctx,
                depth_log,
                db,
                buf,
            } => {
                let depth = depth(*depth_log);
                let (desc, tail) =
                    page_list(&self.mem, buf, u64::from(depth) * u64::from(CQE_SIZE), 0);
                let mut p = CreateCqReq {
                    ctx_handle: pick(&m.ctx, *ctx),
                    depth,
                    db_gpa: db.aligned(DB_RECORD_SIZE),
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::CREATE_CQ, p)
            }
            Op::DestroyCq(h) => (
                Opcode::DESTROY_CQ,
                CqHandleReq {
                    cq_handle: pick(&m.cq, *h),
                }
                .to_bytes(),
            ),
            Op::RegMr {
                pd,
                access,
                iova,
                length,
                first_page_offset,
                buf,
            } => {
                let fpo = u32::from(*first_page_offset) % 4096;
                let length = u64::from(*length % (3 << 18));
                let (desc, tail) = page_list(&self.mem, buf, length, fpo);
                let mut p = RegMrReq {
                    pd_handle: pick(&m.pd, *pd),
                    access: u32::from(*access % 32),
                    iova: *iova,
                    length,
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::REG_MR, p)
            }
            Op::AllocMr { pd, max_num_sg } => (
                Opcode::ALLOC_MR,
                AllocMrReq {
                    pd_handle: pick(&m.pd, *pd),
                    max_num_sg: u32::from(*max_num_sg) % 600,
                }
                .to_bytes(),
            ),
            Op::AllocMw { pd, mw_type } => (
                Opcode::ALLOC_MW,
                AllocMwReq {
                    pd_handle: pick(&m.pd, *pd),
                    mw_type: u32::from(*mw_type % 4),
                }
                .to_bytes(),
            ),
            Op::AttachMcast { qp, group } | Op::DetachMcast { qp, group } => {
                let mut mgid = [0u8; 16];
                mgid[10] = 0xff;
                mgid[11] = 0xff;
                let n = *group % 8;
                // 7: 10.42.0.7, a unicast address.
                mgid[12..].copy_from_slice(&if n == 7 {
                    [10, 42, 0, 7]
                } else {
                    [239, 1, 1, n]
                });
                let op = if matches!(s.op, Op::AttachMcast { .. }) {
                    Opcode::ATTACH_MCAST
                } else {
                    Opcode::DETACH_MCAST
                };
                (
                    op,
                    McastReq {
                        qp_handle: pick(&m.qp, *qp),
                        reserved: 0,
                        mgid,
                    }
                    .to_bytes(),
                )
            }
            Op::DeallocMw(h) => (
                Opcode::DEALLOC_MW,
                MwHandleReq {
                    mw_handle: pick(&m.mw, *h),
                }
                .to_bytes(),
            ),
            Op::DeregMr(h) => (
                Opcode::DEREG_MR,
                MrHandleReq {
                    mr_handle: pick(&m.mr, *h),
                }
                .to_bytes(),
            ),
            Op::CreateQp {
                pd,
                ud,
                send_cq,
                recv_cq,
                srq,
                sq_log,
                rq_log,
                send_sge,
                recv_sge,
                inline,
                db,
                buf,
            } => {
                let sq_depth = depth(*sq_log % 8);
                let qp_type = match (*ud, *sq_log >= 0xc0, *sq_log >= 0x80) {
                    (false, _, true) => QpType::UC,
                    // An XRC initiator: no receive side.
                    (false, _, false) if *sq_log >= 0x60 => QpType::XRC_INI,
                    (false, _, false) => QpType::RC,
                    (true, false, _) => QpType::UD,
                    (true, true, _) => QpType::GSI,
                };
                let ini = qp_type == QpType::XRC_INI;
                let srq_handle = srq.map_or(0, |h| pick(&m.srq, h));
                let rq_depth = if srq.is_some() || ini {
                    0
                } else {
                    depth(*rq_log % 8)
                };
                let (ssge, rsge, inl) = (
                    u32::from(*send_sge % 6),
                    if ini { 0 } else { u32::from(*recv_sge % 6) },
                    u32::from(*inline % 80),
                );
                let layout = qp_buffer_layout(sq_depth, rq_depth, ssge, rsge, inl, 12);
                let (desc, tail) = page_list(&self.mem, buf, layout.total, 0);
                let mut p = CreateQpReq {
                    pd_handle: pick(&m.pd, *pd),
                    qp_type: qp_type.into(),
                    send_cq: pick(&m.cq, *send_cq),
                    recv_cq: if ini { 0 } else { pick(&m.cq, *recv_cq) },
                    srq_handle: if ini { 0 } else { srq_handle },
                    flags: 0,
                    sq_depth,
                    rq_depth,
                    max_send_sge: ssge,
                    max_recv_sge: rsge,
                    max_inline_data: inl,
                    xrcd_handle: 0,
                    db_gpa: db.aligned(DB_RECORD_SIZE),
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::CREATE_QP, p)
            }
            Op::ModifyQp {
                qp,
                step,
                dest,
                mask_xor,
            } => {
                let dest_qpn = match dest {
                    H::Live(i) if !m.qp.is_empty() => {
                        m.qp[usize::from(*i) % m.qp.len()].extra as u32
                    }
                    H::Live(i) => u32::from(*i),
                    H::Raw(v) => *v,
                };
                // Mostly the VM's GID (index 1: index 0, the default GID,
                // is unassigned without a MAC); rarely another index.
                let sgid_index = if *step < 200 { 1 } else { step % 20 };
                let rc = rc_transitions(dest_qpn, gid(), sgid_index);
                // Mostly an ordinary Q_Key; with bit 6 of `step` the GSI's,
                // which only the GSI QP may have.
                let qkey = if step & 0x40 != 0 { GSI_QKEY } else { 0x1111 };
                let ud = ud_transitions(qkey);
                let (mask, a) = match step % 10 {
                    0..=2 => rc[usize::from(step % 10)],
                    3..=5 => ud[usize::from(step % 10 - 3)],
                    s => {
                        let state = [QpState::ERR, QpState::RESET, QpState::SQD, QpState::RTS]
                            [usize::from(s - 6)];
                        (
                            attr::STATE,
                            QpAttr {
                                qp_state: state.into(),
                                av: AddressVector::default(),
                                ..QpAttr::default()
                            },
                        )
                    }
                };
                (
                    Opcode::MODIFY_QP,
                    ModifyQpReq {
                        qp_handle: pick(&m.qp, *qp),
                        attr_mask: mask ^ (mask_xor.unwrap_or(0) & attr::ALL),
                        attr: a,
                    }
                    .to_bytes(),
                )
            }
            Op::QueryQp(h) => (
                Opcode::QUERY_QP,
                QpHandleReq {
                    qp_handle: pick(&m.qp, *h),
                }
                .to_bytes(),
            ),
            Op::DestroyQp(h) => (
                Opcode::DESTROY_QP,
                QpHandleReq {
                    qp_handle: pick(&m.qp, *h),
                }
                .to_bytes(),
            ),
            Op::CreateAh {
                pd,
                port,
                own_gid,
                av,
            } => (
                Opcode::CREATE_AH,
                CreateAhReq {
                    pd_handle: pick(&m.pd, *pd),
                    port: port.map_or(1, u32::from),
                    av: AddressVector {
                        dgid: if *own_gid { gid() } else { [0; 16] },
                        flow_label: 0,
                        // Mostly the VM's GID (index 1); sometimes the
                        // unassigned default GID or past the table.
                        sgid_index: if av[0] < 192 { 1 } else { av[0] % 20 },
                        hop_limit: av[1],
                        traffic_class: av[2],
                        sl: av[3] % 20,
                    },
                }
                .to_bytes(),
            ),
            Op::DestroyAh(h) => (
                Opcode::DESTROY_AH,
                AhHandleReq {
                    ah_handle: pick(&m.ah, *h),
                }
                .to_bytes(),
            ),
            Op::CreateSrq {
                pd,
                depth_log,
                max_sge,
                limit,
                db,
                buf,
            } => {
                let depth = depth(*depth_log % 8);
                let max_sge = u32::from(*max_sge % 6);
                let bytes = u64::from(depth) << recv_wqe_shift(max_sge);
                let (desc, tail) = page_list(&self.mem, buf, bytes, 0);
                let mut p = CreateSrqReq {
                    pd_handle: pick(&m.pd, *pd),
                    depth,
                    max_sge,
                    limit: u32::from(*limit),
                    db_gpa: db.aligned(DB_RECORD_SIZE),
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::CREATE_SRQ, p)
            }
            Op::ModifySrq {
                srq,
                mask,
                max_wr,
                limit,
                buf,
            } => {
                let srq_handle = pick(&m.srq, *srq);
                let attr_mask = u32::from(*mask % 8);
                match buf {
                    Some(buf) if attr_mask & SRQ_ATTR_MAX_WR != 0 => {
                        // Mostly a power of two, the stride the SRQ has.
                        let max_wr = if *max_wr < 0xf000 {
                            depth((*max_wr % 9) as u8)
                        } else {
                            u32::from(*max_wr)
                        };
                        let shift = m
                            .srq
                            .iter()
                            .find(|o| o.h == srq_handle)
                            .map_or(5, |o| o.extra as u32);
                        let bytes = u64::from(max_wr) << shift.min(16);
                        let (desc, tail) = page_list(&self.mem, buf, bytes, 0);
                        let mut p = ModifySrqResizeReq {
                            srq_handle,
                            attr_mask,
                            max_wr,
                            limit: u32::from(*limit),
                            buf: desc,
                        }
                        .to_bytes();
                        p.extend_from_slice(&tail);
                        (Opcode::MODIFY_SRQ, p)
                    }
                    _ => (
                        Opcode::MODIFY_SRQ,
                        ModifySrqReq {
                            srq_handle,
                            attr_mask,
                            max_wr: u32::from(*max_wr),
                            limit: u32::from(*limit),
                        }
                        .to_bytes(),
                    ),
                }
            }
            Op::ResizeCq { cq, depth_log, buf } => {
                let depth = depth(*depth_log);
                let (desc, tail) =
                    page_list(&self.mem, buf, u64::from(depth) * u64::from(CQE_SIZE), 0);
                let mut p = ResizeCqReq {
                    cq_handle: pick(&m.cq, *cq),
                    depth,
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::RESIZE_CQ, p)
            }
            Op::ReregMr {
                mr,
                flags,
                pd,
                access,
                iova,
                length,
                first_page_offset,
                buf,
            } => {
                let fpo = u32::from(*first_page_offset) % 4096;
                let length = u64::from(*length % (3 << 18));
                let flags = u32::from(*flags % 16);
                let (desc, tail) = if flags & REREG_TRANSLATION != 0 {
                    page_list(&self.mem, buf, length, fpo)
                } else {
                    (BufferDesc::default(), Vec::new())
                };
                let mut p = ReregMrReq {
                    mr_handle: pick(&m.mr, *mr),
                    flags,
                    pd_handle: pick(&m.pd, *pd),
                    access: u32::from(*access % 32),
                    iova: *iova,
                    length,
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::REREG_MR, p)
            }
            Op::QuerySrq(h) => (
                Opcode::QUERY_SRQ,
                SrqHandleReq {
                    srq_handle: pick(&m.srq, *h),
                }
                .to_bytes(),
            ),
            Op::DestroySrq(h) => (
                Opcode::DESTROY_SRQ,
                SrqHandleReq {
                    srq_handle: pick(&m.srq, *h),
                }
                .to_bytes(),
            ),
            Op::OpenXrcd(ctx) => (
                Opcode::OPEN_XRCD,
                CtxHandleReq {
                    ctx_handle: pick(&m.ctx, *ctx),
                }
                .to_bytes(),
            ),
            Op::CloseXrcd(x) => (
                Opcode::CLOSE_XRCD,
                XrcdHandle {
                    xrcd_handle: pick(&m.xrcd, *x),
                }
                .to_bytes(),
            ),
            Op::CreateXrcSrq {
                pd,
                xrcd,
                cq,
                depth_log,
                max_sge,
                db,
                buf,
            } => {
                let depth = depth(*depth_log % 8);
                let max_sge = u32::from(*max_sge % 6);
                let bytes = u64::from(depth) << recv_wqe_shift(max_sge);
                let (desc, tail) = page_list(&self.mem, buf, bytes, 0);
                let mut p = CreateXrcSrqReq {
                    pd_handle: pick(&m.pd, *pd),
                    depth,
                    max_sge,
                    limit: 0,
                    xrcd_handle: pick(&m.xrcd, *xrcd),
                    cq_handle: pick(&m.cq, *cq),
                    db_gpa: db.aligned(DB_RECORD_SIZE),
                    buf: desc,
                }
                .to_bytes();
                p.extend_from_slice(&tail);
                (Opcode::CREATE_XRC_SRQ, p)
            }
            Op::CreateTgtQp { xrcd, pd } => (
                Opcode::CREATE_QP,
                CreateQpReq {
                    qp_type: QpType::XRC_TGT.into(),
                    xrcd_handle: pick(&m.xrcd, *xrcd),
                    pd_handle: pd.map_or(0, |h| pick(&m.pd, h)),
                    ..CreateQpReq::default()
                }
                .to_bytes(),
            ),
            Op::Raw { opcode, payload } => {
                let op = match Opcode::ALL.get(usize::from(*opcode)) {
                    Some(op) => u32::from(*op),
                    None => u32::from(*opcode),
                };
                return self.raw(op, payload, s);
            }
            Op::Write { at, data } => {
                let n = data.len().min(4096);
                let _ = self.mem.write_slice(&data[..n], GuestAddress(at.gpa()));
                return;
            }
            Op::Reset => {
                self.ctrl.reset();
                self.model.clear();
                self.check_state();
                return;
            }
        };
        if let Some((when, off, v)) = s.tweak {
            if when % 4 == 0 && !payload.is_empty() {
                let off = usize::from(off) % payload.len();
                let end = (off + 4).min(payload.len());
                payload[off..end].copy_from_slice(&v.to_le_bytes()[..end - off]);
            }
        }
        let req = payload.clone();
        let (status, resp) = self.exec(opcode.into(), &payload, s.writable, s.reserved == 0xff);
        if status == Status::OK {
            self.apply(opcode, &req, &resp);
        }
        self.check_state();
    }

    fn raw(&mut self, opcode: u32, payload: &[u8], s: &Step) {
        let (status, resp) = self.exec(opcode, payload, s.writable, s.reserved == 0xff);
        if status == Status::OK {
            if let Some(op) = Opcode::from_u32(opcode) {
                self.apply(op, payload, &resp);
            }
        }
        self.check_state();
    }

    /// Updates the model after a successful command (`req` is its payload).
    fn apply(&mut self, op: Opcode, req: &[u8], resp: &[u8]) {
        let m = &mut self.model;
        let u32_at = |b: &[u8], off: usize| u32::read(b.get(off..).unwrap_or(&[]));
        let new = |list: &Vec<Obj>, h: u32, what: &str| {
            assert_ne!(h, 0, "{what}: handle 0 returned");
            assert!(
                !list.iter().any(|o| o.h == h),
                "{what}: handle {h:#x} returned while still live"
            );
        };
        match op {
            Opcode::CREATE_CTX => {
                let h = CreateCtxResp::read(resp).ctx_handle;
                new(&m.ctx, h, "CREATE_CTX");
                m.ctx.push(Obj {
                    h,
                    ctx: h,
                    extra: 0,
                });
            }
            Opcode::DESTROY_CTX => m.drop_ctx(u32_at(req, 0)),
            Opcode::ALLOC_PD => {
                let h = PdHandleResp::read(resp).pd_handle;
                new(&m.pd, h, "ALLOC_PD");
                m.pd.push(Obj {
                    h,
                    ctx: u32_at(req, 0),
                    extra: 0,
                });
            }
            Opcode::DEALLOC_PD => remove(&mut m.pd, u32_at(req, 0)),
            Opcode::CREATE_CQ => {
                let h = CqHandleResp::read(resp).cq_handle;
                new(&m.cq, h, "CREATE_CQ");
                m.cq.push(Obj {
                    h,
                    ctx: u32_at(req, 0),
                    extra: 0,
                });
            }
            Opcode::DESTROY_CQ => remove(&mut m.cq, u32_at(req, 0)),
            Opcode::REG_MR => {
                let r = RegMrResp::read(resp);
                new(&m.mr, r.mr_handle, "REG_MR");
                let q = RegMrReq::read(req);
                m.mr.push(Obj {
                    h: r.mr_handle,
                    ctx: ctx_of(&m.pd, q.pd_handle),
                    extra: q.length,
                });
            }
            Opcode::ALLOC_MR => {
                let r = RegMrResp::read(resp);
                new(&m.mr, r.mr_handle, "ALLOC_MR");
                assert_eq!(r.lkey, r.rkey, "ALLOC_MR: one key");
                let q = AllocMrReq::read(req);
                assert!(
                    (1..=512).contains(&q.max_num_sg),
                    "ALLOC_MR of {} pages",
                    q.max_num_sg
                );
                // Free: nothing registered.
                m.mr.push(Obj {
                    h: r.mr_handle,
                    ctx: ctx_of(&m.pd, q.pd_handle),
                    extra: 0,
                });
            }
            Opcode::DEREG_MR => remove(&mut m.mr, u32_at(req, 0)),
            Opcode::ALLOC_MW => {
                let r = AllocMwResp::read(resp);
                new(&m.mw, r.mw_handle, "ALLOC_MW");
                let q = AllocMwReq::read(req);
                assert!(
                    q.mw_type == MW_TYPE_1 || q.mw_type == MW_TYPE_2,
                    "ALLOC_MW of type {}",
                    q.mw_type
                );
                m.mw.push(Obj {
                    h: r.mw_handle,
                    ctx: ctx_of(&m.pd, q.pd_handle),
                    extra: u64::from(r.rkey),
                });
            }
            Opcode::DEALLOC_MW => remove(&mut m.mw, u32_at(req, 0)),
            Opcode::CREATE_QP => {
                let r = CreateQpResp::read(resp);
                new(&m.qp, r.qp_handle, "CREATE_QP");
                let q = CreateQpReq::read(req);
                // A target QP is its domain's context's (spec 12.12).
                let tgt = q.qp_type == u32::from(QpType::XRC_TGT);
                let ctx = if tgt {
                    m.in_domain.push((r.qp_handle, true, q.xrcd_handle));
                    ctx_of(&m.xrcd, q.xrcd_handle)
                } else {
                    ctx_of(&m.pd, q.pd_handle)
                };
                m.qp.push(Obj {
                    h: r.qp_handle,
                    ctx,
                    extra: u64::from(r.qpn),
                });
            }
            Opcode::DESTROY_QP => {
                remove(&mut m.qp, u32_at(req, 0));
                m.forget_gone();
            }
            Opcode::OPEN_XRCD => {
                let h = XrcdHandle::read(resp).xrcd_handle;
                new(&m.xrcd, h, "OPEN_XRCD");
                m.xrcd.push(Obj {
                    h,
                    ctx: u32_at(req, 0),
                    extra: 0,
                });
            }
            Opcode::CLOSE_XRCD => {
                let h = u32_at(req, 0);
                assert!(
                    !m.in_domain.iter().any(|&(_, _, x)| x == h),
                    "CLOSE_XRCD of a domain in use succeeded"
                );
                remove(&mut m.xrcd, h);
            }
            Opcode::CREATE_XRC_SRQ => {
                let r = CreateSrqResp::read(resp);
                new(&m.srq, r.srq_handle, "CREATE_XRC_SRQ");
                let q = CreateXrcSrqReq::read(req);
                m.in_domain.push((r.srq_handle, false, q.xrcd_handle));
                m.srq.push(Obj {
                    h: r.srq_handle,
                    ctx: ctx_of(&m.pd, q.pd_handle),
                    extra: u64::from(r.wqe_shift),
                });
            }
            Opcode::CREATE_AH => {
                let h = AhHandleResp::read(resp).ah_handle;
                new(&m.ah, h, "CREATE_AH");
                m.ah.push(Obj {
                    h,
                    ctx: ctx_of(&m.pd, u32_at(req, 0)),
                    extra: 0,
                });
            }
            Opcode::DESTROY_AH => remove(&mut m.ah, u32_at(req, 0)),
            Opcode::CREATE_SRQ => {
                let r = CreateSrqResp::read(resp);
                new(&m.srq, r.srq_handle, "CREATE_SRQ");
                m.srq.push(Obj {
                    h: r.srq_handle,
                    ctx: ctx_of(&m.pd, u32_at(req, 0)),
                    // Its WQE stride, which a resize's ring needs.
                    extra: u64::from(r.wqe_shift),
                });
            }
            Opcode::REREG_MR => {
                let r = RegMrResp::read(resp);
                let q = ReregMrReq::read(req);
                assert_eq!(r.mr_handle, q.mr_handle, "REREG_MR answered for another MR");
                let o =
                    m.mr.iter_mut()
                        .find(|o| o.h == q.mr_handle)
                        .expect("REREG_MR of an MR the model does not know succeeded");
                assert_ne!(o.extra, 0, "REREG_MR of a free ALLOC_MR region succeeded");
                if q.flags & REREG_TRANSLATION != 0 {
                    o.extra = q.length;
                }
            }
            Opcode::RESIZE_CQ => {
                let r = CqHandleResp::read(resp);
                assert_eq!(
                    r.cq_handle,
                    u32_at(req, 0),
                    "RESIZE_CQ answered for another CQ"
                );
                assert!(
                    m.cq.iter().any(|o| o.h == r.cq_handle),
                    "RESIZE_CQ of a CQ the model does not know succeeded"
                );
            }
            Opcode::DESTROY_SRQ => {
                remove(&mut m.srq, u32_at(req, 0));
                m.forget_gone();
            }
            _ => {}
        }
    }

    /// Destroys every object with commands, children first; each must
    /// succeed.
    fn destroy_all(&mut self) {
        let kinds: [(Opcode, Kind); 9] = [
            (Opcode::DESTROY_QP, |m| &m.qp),
            (Opcode::DESTROY_AH, |m| &m.ah),
            (Opcode::DEALLOC_MW, |m| &m.mw),
            (Opcode::DEREG_MR, |m| &m.mr),
            (Opcode::DESTROY_SRQ, |m| &m.srq),
            (Opcode::DESTROY_CQ, |m| &m.cq),
            (Opcode::DEALLOC_PD, |m| &m.pd),
            (Opcode::CLOSE_XRCD, |m| &m.xrcd),
            (Opcode::DESTROY_CTX, |m| &m.ctx),
        ];
        for (op, list) in kinds {
            let handles: Vec<u32> = list(&self.model).iter().map(|o| o.h).collect();
            for h in handles {
                let req = h.to_le_bytes();
                let (status, resp) = self.exec(op.into(), &req, Writable::Exact, false);
                assert_eq!(
                    status,
                    Status::OK,
                    "{} of live handle {h:#x} failed",
                    op.name()
                );
                self.apply(op, &req, &resp);
                self.check_state();
            }
        }
    }
}

/// Picks one kind of object out of the model.
type Kind = fn(&Model) -> &Vec<Obj>;

/// Whether `RDMA_FUZZ_TRACE` is set: every command and its status go to
/// stderr (to see how deep a corpus gets).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("RDMA_FUZZ_TRACE").is_some())
}

/// Checks one response of [`VmState::execute`].
fn check_response(out: &[u8], request_id: u64, op: Option<Opcode>, writable: usize) {
    assert!(
        out.len() >= ResponseHeader::SIZE,
        "response shorter than its header"
    );
    if writable >= ResponseHeader::SIZE {
        assert!(
            out.len() <= writable,
            "response of {} bytes for {writable} writable",
            out.len()
        );
    }
    let hdr = ResponseHeader::read(out);
    assert_eq!(hdr.request_id, request_id, "request id not echoed");
    let status = Status::from_u32(hdr.status)
        .unwrap_or_else(|| panic!("status {} is not in the spec", hdr.status));
    let payload = out.len() - ResponseHeader::SIZE;
    if status == Status::OK {
        let op = op.expect("OK for an unknown opcode");
        assert_eq!(
            payload,
            response_size(op),
            "{}: OK with a payload of the wrong size",
            op.name()
        );
    } else {
        assert_eq!(payload, 0, "{}: payload with an error", status.name());
    }
}

/// Runs one input of the `ctrl` target.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one decoded input of the `ctrl` target.
pub fn run_input(input: &Input) {
    let features = match input.features {
        f @ 0xf0.. => u64::from(f) & ALL_DEVICE_FEATURES,
        _ => ALL_DEVICE_FEATURES,
    };
    let mut vm = Vm::new(features);
    for s in input.steps.iter().take(MAX_STEPS) {
        vm.step(s);
    }
    if input.finish_reset {
        vm.ctrl.reset();
        vm.model.clear();
    } else {
        vm.destroy_all();
    }
    vm.check_state();
    let c = vm.ctrl.res.counts();
    assert!(
        c.is_empty(),
        "objects left after destroying everything: {c:?}"
    );
    assert_eq!(vm.rnic.qpns_in_use(), 0, "QP numbers leaked");
    assert_eq!(vm.rnic.keys_in_use(), 0, "memory keys leaked");
}
