//! Target `wqe`: taking work requests out of guest rings and resolving
//! their buffers.
//!
//! A VM gets a context, two PDs, a CQ, up to four MRs (fuzzer-chosen pages,
//! offsets, lengths and access) and a QP (fuzzer-chosen depths, SGE and
//! inline capacities, ring pages), optionally on an SRQ, all created with
//! real commands through [`vhost_user_rdma::vm::VmState::execute`]. The
//! fuzzer then writes WQEs into the rings (structured, with SGEs that name
//! the MRs' keys, or raw bytes) and the harness runs the engine's
//! [`fetch_send`] / [`fetch_recv`] on them, [`local_range`] on the SGEs they
//! carry, and [`access::resolve`] on remote ranges named by rkey.
//!
//! `ALLOC_MR` regions (fast registration) are registered directly in the
//! VM's tables, as a `REG_MR` work request does once the engine checked
//! it, or left free; SGEs name their keys, and the local DMA key over
//! guest-physical memory.
//!
//! Invariants:
//! - a parsed WQE is the one in guest memory: its SGEs (or inline bytes)
//!   are those written there, within the QP's capacities;
//! - every resolved segment lies inside this VM's RAM;
//! - [`local_range`] agrees with a reference model of the MRs: it succeeds
//!   exactly when every non-empty SGE names an MR of the QP's PD (with
//!   `LOCAL_WRITE` when writing) and lies inside it — a registered
//!   `ALLOC_MR` region under its current key, never a free one — or is a
//!   local DMA key SGE inside one RAM region, and then returns the total
//!   length and exactly the guest-physical segments the MRs' page lists
//!   (or the addresses themselves) give for the requested part;
//! - [`access::resolve`] of a range inside an MR gives exactly the
//!   segments of the model, and fails for one outside it.

use arbitrary::{Arbitrary, Unstructured};
use vhost_user_rdma::engine::sge::local_range;
use vhost_user_rdma::engine::wqe::{fetch_recv, fetch_send, RecvRing, WqeBuf, WqeError};
use vhost_user_rdma::keys::LOCAL_DMA_LKEY;
use vhost_user_rdma::memory::access::{self, Segment};
use vhost_user_rdma::memory::HostMem;
use vhost_user_rdma::resources::fast::Registration;
use virtio_rdma_abi::config::ALL_DEVICE_FEATURES;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{RecvWqe, SendWqe, Sge, WQE_INLINE};
use virtio_rdma_abi::mem::{
    access as acc, qp_buffer_layout, recv_wqe_shift, BufferDesc, PageListMode, CQE_SIZE,
    RECV_WQE_HEADER, SEND_WQE_HEADER, SGE_SIZE,
};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::{Bytes, GuestAddress};

use crate::ctrl::{Vm, Writable};
use crate::guest::{self, PAGE};

/// An MR to register.
#[derive(Debug, Clone, Arbitrary)]
pub struct MrIn {
    /// In the second PD.
    pub pd2: bool,
    /// Access flags (low 4 bits).
    pub access: u8,
    /// iova.
    pub iova: u64,
    /// Length (clamped to the pages).
    pub length: u16,
    /// Offset of the first byte in the first page.
    pub first_page_offset: u16,
    /// RAM pages (1..=8 of them).
    pub pages: Vec<u8>,
}

/// The QP (and SRQ) to create.
#[derive(Debug, Clone, Arbitrary)]
pub struct QpIn {
    /// In the second PD.
    pub pd2: bool,
    /// log2 of the send queue depth.
    pub sq_log: u8,
    /// log2 of the receive queue (or SRQ) depth.
    pub rq_log: u8,
    /// SGEs per send WQE.
    pub send_sge: u8,
    /// SGEs per receive WQE.
    pub recv_sge: u8,
    /// Inline bytes.
    pub inline: u8,
    /// Receive through an SRQ.
    pub srq: bool,
    /// Ring pages.
    pub pages: Vec<u8>,
}

/// An `ALLOC_MR` region (fast registration), registered or left free.
#[derive(Debug, Clone, Arbitrary)]
pub struct FastIn {
    /// In the second PD.
    pub pd2: bool,
    /// Access flags (low 4 bits).
    pub access: u8,
    /// iova.
    pub iova: u64,
    /// Length (clamped to the pages).
    pub length: u32,
    /// log2 of the page size minus 12 (modulo 3).
    pub shift: u8,
    /// RAM pages (1..=8 of them; the region has room for 8).
    pub pages: Vec<u8>,
    /// Registered (as a `REG_MR` work request would), or left free.
    pub register: bool,
}

/// An SGE of a structured WQE.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct SgeIn {
    /// MR number (modulo the MRs), or a raw key. MR numbers from 0xe0 name
    /// an `ALLOC_MR` region's key (registered or free), from 0xf0 the local
    /// DMA key over guest-physical memory.
    pub mr: Result<u8, u32>,
    /// Offset from the MR's iova (may run past its end).
    pub off: u16,
    /// Length.
    pub len: u16,
}

/// Which ring a WQE goes into.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Queue {
    /// Send queue.
    Send,
    /// Receive queue (the SRQ when the QP has one).
    Recv,
}

/// Contents of one ring slot.
#[derive(Debug, Clone, Arbitrary)]
pub enum Body {
    /// A structured WQE.
    Wqe {
        /// Opcode (valid ones are 0..=6).
        opcode: u8,
        /// Flags.
        flags: u8,
        /// SGEs.
        sges: Vec<SgeIn>,
        /// Inline bytes (used with `WQE_INLINE`).
        inline: Vec<u8>,
        /// Declared SGE count or inline length differs by this much.
        count_delta: i8,
        /// Non-zero reserved field.
        reserved: bool,
    },
    /// Raw bytes.
    Raw(Vec<u8>),
}

/// A WQE written into a ring and then taken.
#[derive(Debug, Clone, Arbitrary)]
pub struct SlotIn {
    /// Ring.
    pub queue: Queue,
    /// Slot index (masked with the depth by the engine).
    pub index: u16,
    /// Contents.
    pub body: Body,
    /// Part of the SGE list resolved: `(skip, limit)`.
    pub part: (u32, u32),
    /// Resolve for writing (`LOCAL_WRITE` needed).
    pub write: bool,
}

/// A remote range named by rkey.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct RemoteIn {
    /// MR number, or a raw rkey.
    pub mr: Result<u8, u32>,
    /// Offset from the MR's iova.
    pub off: u32,
    /// Length.
    pub len: u32,
}

/// The whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// MRs.
    pub mrs: Vec<MrIn>,
    /// The QP.
    pub qp: QpIn,
    /// Slots.
    pub slots: Vec<SlotIn>,
    /// Remote ranges.
    pub remote: Vec<RemoteIn>,
    /// `ALLOC_MR` regions (created after the MRs).
    pub fast: Vec<FastIn>,
}

/// The model of one registered MR.
#[derive(Debug, Clone)]
struct MrModel {
    pd: u32,
    access: u32,
    iova: u64,
    length: u64,
    fpo: u64,
    /// Page size.
    page: u64,
    pages: Vec<u64>,
    lkey: u32,
    rkey: u32,
    /// A registered `ALLOC_MR` region: its key is in the rkey map whatever
    /// its access.
    fast: bool,
}

impl MrModel {
    /// Segments of `[iova, iova + len)`, or `None` if outside the MR.
    fn segments(&self, iova: u64, len: u64, out: &mut Vec<Segment>) -> Option<()> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.length {
            return None;
        }
        let p = self.page;
        let mut at = off + self.fpo;
        let end = at + len;
        while at < end {
            let page = *self.pages.get((at / p) as usize)?;
            let take = (p - at % p).min(end - at);
            push(out, page + at % p, take);
            at += take;
        }
        Some(())
    }
}

fn push(out: &mut Vec<Segment>, gpa: u64, len: u64) {
    match out.last_mut() {
        Some(last) if last.gpa + last.len == gpa => last.len += len,
        _ => out.push(Segment { gpa, len }),
    }
}

fn inline_list(pages: &[u64]) -> (BufferDesc, Vec<u8>) {
    (
        BufferDesc {
            addr: 0,
            npages: pages.len() as u32,
            first_page_offset: 0,
            page_shift: 12,
            mode: PageListMode::INLINE.into(),
        },
        pages.iter().flat_map(|p| p.to_le_bytes()).collect(),
    )
}

fn ring_pages(pick: &[u8], bytes: u64, salt: u64) -> Vec<u64> {
    let n = bytes.div_ceil(PAGE).max(1);
    (0..n)
        .map(|i| match pick.get(i as usize) {
            Some(&p) => guest::page_gpa(u64::from(p)),
            None => guest::page_gpa(salt + i),
        })
        .collect()
}

fn create(vm: &mut Vm, op: Opcode, payload: &[u8]) -> Option<Vec<u8>> {
    let (status, resp) = vm.exec(op.into(), payload, Writable::Exact, false);
    (status == Status::OK).then_some(resp)
}

/// The fuzzed objects.
struct Setup {
    pds: [u32; 2],
    mrs: Vec<MrModel>,
    /// Current keys of the `ALLOC_MR` regions, registered or free.
    fast_keys: Vec<u32>,
    qp: u32,
    qp_pd: u32,
    srq: Option<u32>,
    /// Pages of the send ring, the receive ring (offset) and the SRQ ring.
    qp_pages: Vec<u64>,
    rq_offset: u64,
    srq_pages: Vec<u64>,
}

fn setup(vm: &mut Vm, input: &Input) -> Option<Setup> {
    // The context's doorbell header shares page 1 with the CQ's record.
    let req = CreateCtxReq {
        db_gpa: guest::page_gpa(1) + 2048,
    }
    .to_bytes();
    let ctx = CreateCtxResp::read(&create(vm, Opcode::CREATE_CTX, &req)?).ctx_handle;
    let mut pds = [0u32; 2];
    for pd in &mut pds {
        let req = CtxHandleReq { ctx_handle: ctx }.to_bytes();
        *pd = PdHandleResp::read(&create(vm, Opcode::ALLOC_PD, &req)?).pd_handle;
    }
    let cq_pages = [guest::page_gpa(0)];
    let (desc, tail) = inline_list(&cq_pages);
    let mut req = CreateCqReq {
        ctx_handle: ctx,
        depth: 4096 / CQE_SIZE,
        db_gpa: guest::page_gpa(1),
        buf: desc,
    }
    .to_bytes();
    req.extend_from_slice(&tail);
    let cq = CqHandleResp::read(&create(vm, Opcode::CREATE_CQ, &req)?).cq_handle;

    let mut mrs = Vec::new();
    for m in input.mrs.iter().take(4) {
        let n = m.pages.len().clamp(1, 8);
        let pages: Vec<u64> = (0..n)
            .map(|i| guest::page_gpa(u64::from(m.pages.get(i).copied().unwrap_or(i as u8))))
            .collect();
        let fpo = u64::from(m.first_page_offset) % PAGE;
        let length = u64::from(m.length).min(n as u64 * PAGE - fpo);
        let (mut desc, tail) = inline_list(&pages);
        desc.first_page_offset = fpo as u32;
        let pd = pds[usize::from(m.pd2)];
        let access = u32::from(m.access) & acc::ALL;
        let mut req = RegMrReq {
            pd_handle: pd,
            access,
            iova: m.iova,
            length,
            buf: desc,
        }
        .to_bytes();
        req.extend_from_slice(&tail);
        if let Some(resp) = create(vm, Opcode::REG_MR, &req) {
            let r = RegMrResp::read(&resp);
            mrs.push(MrModel {
                pd,
                access,
                iova: m.iova,
                length,
                fpo,
                page: PAGE,
                pages,
                lkey: r.lkey,
                rkey: r.rkey,
                fast: false,
            });
        }
    }
    let mut fast_keys = Vec::new();
    for f in input.fast.iter().take(4) {
        let pd = pds[usize::from(f.pd2)];
        let req = AllocMrReq {
            pd_handle: pd,
            max_num_sg: 8,
        }
        .to_bytes();
        let Some(resp) = create(vm, Opcode::ALLOC_MR, &req) else {
            continue;
        };
        let r = RegMrResp::read(&resp);
        assert_eq!(r.lkey, r.rkey);
        fast_keys.push(r.lkey);
        if !f.register {
            continue;
        }
        // Pages of the chosen size, aligned and in RAM (the engine checks
        // that before it registers; here the registration is made directly).
        let shift = 12 + u32::from(f.shift % 3);
        let page = 1u64 << shift;
        let n = f.pages.len().clamp(1, 8);
        let pages: Vec<u64> = (0..n)
            .map(|i| {
                guest::page_gpa(u64::from(f.pages.get(i).copied().unwrap_or(i as u8))) & !(page - 1)
            })
            .filter(|&g| guest::in_ram(g, page))
            .collect();
        if pages.is_empty() {
            continue;
        }
        let fpo = f.iova % page;
        let length = u64::from(f.length).clamp(1, pages.len() as u64 * page - fpo);
        if f.iova.checked_add(length).is_none() {
            continue;
        }
        let key = (r.lkey & !0xff) | u32::from(f.access).wrapping_mul(37) & 0xff;
        let access = u32::from(f.access) & acc::ALL;
        let reg = Registration {
            key,
            iova: f.iova,
            length,
            access,
            page_shift: shift,
        };
        assert!(
            vm.ctrl
                .res
                .fast_register(r.mr_handle, &reg, pages.iter().copied()),
            "registering a free region"
        );
        *fast_keys.last_mut().expect("pushed") = key;
        mrs.push(MrModel {
            pd,
            access,
            iova: f.iova,
            length,
            fpo,
            page,
            pages,
            lkey: key,
            rkey: key,
            fast: true,
        });
    }

    let q = &input.qp;
    let qp_pd = pds[usize::from(q.pd2)];
    let rdepth = 1u32 << (q.rq_log % 6);
    let rsge = u32::from(q.recv_sge % 5);
    let mut srq = None;
    let mut srq_pages = Vec::new();
    if q.srq {
        let bytes = u64::from(rdepth) << recv_wqe_shift(rsge);
        srq_pages = ring_pages(q.pages.get(8..).unwrap_or(&[]), bytes, 40);
        let (desc, tail) = inline_list(&srq_pages);
        let mut req = CreateSrqReq {
            pd_handle: qp_pd,
            depth: rdepth,
            max_sge: rsge,
            limit: 0,
            db_gpa: guest::page_gpa(2),
            buf: desc,
        }
        .to_bytes();
        req.extend_from_slice(&tail);
        srq = Some(CreateSrqResp::read(&create(vm, Opcode::CREATE_SRQ, &req)?).srq_handle);
    }
    let sq_depth = 1u32 << (q.sq_log % 6);
    let rq_depth = if srq.is_some() { 0 } else { rdepth };
    let (ssge, inline) = (u32::from(q.send_sge % 5), u32::from(q.inline % 72));
    let layout = qp_buffer_layout(sq_depth, rq_depth, ssge, rsge, inline, 12);
    let qp_pages = ring_pages(&q.pages, layout.total, 20);
    let (desc, tail) = inline_list(&qp_pages);
    let mut req = CreateQpReq {
        pd_handle: qp_pd,
        qp_type: QpType::RC.into(),
        send_cq: cq,
        recv_cq: cq,
        srq_handle: srq.unwrap_or(0),
        flags: 0,
        sq_depth,
        rq_depth,
        max_send_sge: ssge,
        max_recv_sge: rsge,
        max_inline_data: inline,
        xrcd_handle: 0,
        db_gpa: guest::page_gpa(3),
        buf: desc,
    }
    .to_bytes();
    req.extend_from_slice(&tail);
    let r = CreateQpResp::read(&create(vm, Opcode::CREATE_QP, &req)?);
    assert_eq!(u64::from(r.rq_offset), layout.rq_offset, "rq_offset");
    Some(Setup {
        pds,
        mrs,
        fast_keys,
        qp: r.qp_handle,
        qp_pd,
        srq,
        qp_pages,
        rq_offset: layout.rq_offset,
        srq_pages,
    })
}

/// Guest-physical address of byte `off` of a ring of `pages`.
fn ring_gpa(pages: &[u64], off: u64) -> u64 {
    pages[((off / PAGE) as usize) % pages.len()] + off % PAGE
}

fn sge_of(s: &Setup, x: &SgeIn) -> Sge {
    match x.mr {
        // Guest-physical memory through the local DMA key.
        Ok(i @ 0xf0..) => Sge {
            addr: guest::page_gpa(u64::from(i) + u64::from(x.off >> 12)) + u64::from(x.off & 0xfff),
            length: u32::from(x.len),
            lkey: LOCAL_DMA_LKEY,
        },
        Ok(i @ 0xe0..) if !s.fast_keys.is_empty() => {
            let key = s.fast_keys[usize::from(i) % s.fast_keys.len()];
            let iova = s.mrs.iter().find(|m| m.lkey == key).map_or(0, |m| m.iova);
            Sge {
                addr: iova.wrapping_add(u64::from(x.off)),
                length: u32::from(x.len),
                lkey: key,
            }
        }
        Ok(i) if !s.mrs.is_empty() => {
            let m = &s.mrs[usize::from(i) % s.mrs.len()];
            Sge {
                addr: m.iova.wrapping_add(u64::from(x.off)),
                length: u32::from(x.len),
                lkey: m.lkey,
            }
        }
        Ok(i) => Sge {
            addr: u64::from(x.off),
            length: u32::from(x.len),
            lkey: u32::from(i),
        },
        Err(key) => Sge {
            addr: u64::from(x.off),
            length: u32::from(x.len),
            lkey: key,
        },
    }
}

/// Encodes a slot's contents (`stride` bytes at most).
fn encode(s: &Setup, body: &Body, send: bool, stride: usize) -> Vec<u8> {
    let mut out = match body {
        Body::Raw(b) => b.clone(),
        Body::Wqe {
            opcode,
            flags,
            sges,
            inline,
            count_delta,
            reserved,
        } => {
            let list: Vec<Sge> = sges.iter().take(8).map(|x| sge_of(s, x)).collect();
            let is_inline = send && flags & WQE_INLINE != 0;
            let declared = |n: usize| (n as u64).saturating_add_signed(i64::from(*count_delta % 3));
            let mut b = if send {
                SendWqe {
                    wr_id: 0x1234_5678,
                    opcode: opcode % 9,
                    flags: flags & 0x1f,
                    num_sge: if is_inline {
                        0
                    } else {
                        declared(list.len()) as u16
                    },
                    imm_data: 0,
                    remote_addr: 0,
                    rkey: 0,
                    inline_len: if is_inline {
                        declared(inline.len()) as u32
                    } else {
                        0
                    },
                    compare_add: 0,
                    swap: 0,
                    ah_handle: 0,
                    remote_qpn: 0,
                    remote_qkey: 0,
                    xrc_srqn: u32::from(*reserved),
                }
                .to_bytes()
            } else {
                RecvWqe {
                    wr_id: 0x1234_5678,
                    num_sge: declared(list.len()) as u32,
                    reserved: u32::from(*reserved),
                }
                .to_bytes()
            };
            if is_inline {
                b.extend_from_slice(inline);
            } else {
                for sge in &list {
                    b.extend_from_slice(&sge.to_bytes());
                }
            }
            b
        }
    };
    out.truncate(stride);
    out
}

/// What [`local_range`] must return, from the model.
fn expected_range(
    s: &Setup,
    pd: u32,
    sges: &[Sge],
    write: bool,
    skip: u64,
    limit: u64,
) -> Option<(u64, Vec<Segment>)> {
    let mut out = Vec::new();
    let end = skip.saturating_add(limit);
    let mut total = 0u64;
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        let len = u64::from(sge.length);
        let from = skip.saturating_sub(total).min(len);
        let to = end.saturating_sub(total).min(len);
        match s.mrs.iter().find(|m| m.lkey == sge.lkey) {
            Some(mr) => {
                if mr.pd != pd || (write && mr.access & acc::LOCAL_WRITE == 0) {
                    return None;
                }
                mr.segments(sge.addr, len, &mut Vec::new())?;
                if to > from {
                    mr.segments(sge.addr + from, to - from, &mut out)?;
                }
            }
            // Spec 18.28: guest-physical memory in one RAM region, any PD,
            // read and write (the harness's VM has F_MEM_MGT).
            None if sge.lkey == LOCAL_DMA_LKEY => {
                if !guest::in_ram(sge.addr, len) {
                    return None;
                }
                if to > from {
                    push(&mut out, sge.addr + from, to - from);
                }
            }
            None => return None,
        }
        total += len;
    }
    Some((total, out))
}

fn check_range(s: &Setup, vm: &Vm, sges: &[Sge], write: bool, part: (u32, u32)) {
    let (skip, limit) = (u64::from(part.0), u64::from(part.1));
    let mut out = Vec::new();
    let got = local_range(&vm.ctrl, s.qp_pd, sges, write, skip, limit, &mut out);
    let want = expected_range(s, s.qp_pd, sges, write, skip, limit);
    match (got, want) {
        (Ok(total), Some((wtotal, wsegs))) => {
            assert_eq!(total, wtotal, "local_range total");
            for seg in &out {
                assert!(
                    guest::in_ram(seg.gpa, seg.len),
                    "segment {seg:?} outside the VM's RAM"
                );
            }
            assert_eq!(out, wsegs, "local_range segments for {sges:?}");
        }
        (Err(_), None) => {}
        (got, want) => panic!("local_range({sges:?}, write {write}) = {got:?}, model {want:?}"),
    }
}

fn read_sges(mem: &vhost_user_rdma::memory::GuestRam, gpa: u64, header: u32, n: usize) -> Vec<Sge> {
    (0..n)
        .map(|i| {
            let mut b = [0u8; 16];
            let at = gpa + u64::from(header) + (i as u64) * u64::from(SGE_SIZE);
            mem.read_slice(&mut b, GuestAddress(at))
                .expect("read back an SGE");
            Sge::read(&b)
        })
        .collect()
}

/// Runs one input of the `wqe` target.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one decoded input of the `wqe` target; returns how many WQEs were
/// parsed and had their SGEs resolved (0 when the objects could not be
/// created).
pub fn run_input(input: &Input) -> usize {
    let mut vm = Vm::new(ALL_DEVICE_FEATURES);
    let Some(s) = setup(&mut vm, input) else {
        return 0;
    };
    let mut parsed = 0;
    let host = HostMem::from_mmap(vm.mem.clone());
    let mut scratch = WqeBuf::new();
    for slot in input.slots.iter().take(16) {
        let qp = vm.ctrl.res.qps.get(s.qp).expect("the QP exists");
        let send = matches!(slot.queue, Queue::Send);
        let index = u32::from(slot.index);
        let (pages, base, depth, shift, max_sge) = if send {
            (
                &s.qp_pages,
                0,
                qp.sq_depth,
                qp.layout.sq_wqe_shift,
                qp.max_send_sge,
            )
        } else if let Some(srq) = s.srq.and_then(|h| vm.ctrl.res.srqs.get(h)) {
            (&s.srq_pages, 0, srq.depth, srq.wqe_shift, srq.max_sge)
        } else {
            (
                &s.qp_pages,
                s.rq_offset,
                qp.rq_depth,
                qp.layout.rq_wqe_shift,
                qp.max_recv_sge,
            )
        };
        if depth == 0 {
            continue;
        }
        let stride = 1u64 << shift;
        let gpa = ring_gpa(pages, base + u64::from(index & (depth - 1)) * stride);
        let bytes = encode(&s, &slot.body, send, stride as usize);
        vm.mem
            .write_slice(&bytes, GuestAddress(gpa))
            .expect("write a WQE into RAM");
        let mut b = [0u8; 64];
        vm.mem
            .read_slice(&mut b, GuestAddress(gpa))
            .expect("read back a WQE");
        if send {
            let max_inline = qp.max_inline_data;
            match fetch_send(&host, qp, index, &mut scratch) {
                Ok(wr) => {
                    let hdr = SendWqe::read(&b);
                    assert_eq!(wr.hdr, hdr, "parsed header differs from the ring's");
                    if let Some(data) = wr.inline {
                        assert!(hdr.flags & WQE_INLINE != 0);
                        assert_eq!(data.len(), hdr.inline_len as usize);
                        assert!(data.len() as u32 <= max_inline, "inline beyond capacity");
                        let mut want = vec![0u8; data.len()];
                        vm.mem
                            .read_slice(&mut want, GuestAddress(gpa + u64::from(SEND_WQE_HEADER)))
                            .expect("read back inline data");
                        assert_eq!(data, &want[..], "inline data");
                    } else {
                        assert!(wr.sges.len() as u32 <= max_sge, "SGEs beyond capacity");
                        assert_eq!(wr.sges.len(), usize::from(hdr.num_sge));
                        let want = read_sges(&vm.mem, gpa, SEND_WQE_HEADER, wr.sges.len());
                        assert_eq!(wr.sges, &want[..], "parsed SGEs differ from the ring's");
                        let sges = wr.sges.to_vec();
                        check_range(&s, &vm, &sges, slot.write, slot.part);
                        parsed += 1;
                    }
                }
                Err(WqeError::Unusable) => panic!("a slot in RAM was found unusable"),
                Err(WqeError::Malformed { .. }) => {}
            }
        } else {
            let ring = match s.srq.and_then(|h| vm.ctrl.res.srqs.get(h)) {
                Some(srq) => &srq.ring,
                None => &qp.ring,
            };
            let ring = RecvRing {
                ring,
                offset: base,
                depth,
                shift,
                max_sge,
            };
            match fetch_recv(&host, &ring, index, &mut scratch) {
                Ok(wr) => {
                    let hdr = RecvWqe::read(&b);
                    assert_eq!(wr.wr_id, hdr.wr_id);
                    assert!(wr.sges.len() as u32 <= max_sge, "SGEs beyond capacity");
                    assert_eq!(wr.sges.len(), hdr.num_sge as usize);
                    let want = read_sges(&vm.mem, gpa, RECV_WQE_HEADER, wr.sges.len());
                    assert_eq!(wr.sges, &want[..], "parsed SGEs differ from the ring's");
                    let sges = wr.sges.to_vec();
                    check_range(&s, &vm, &sges, true, slot.part);
                    parsed += 1;
                }
                Err(WqeError::Unusable) => panic!("a receive slot in RAM was found unusable"),
                Err(WqeError::Malformed { .. }) => {}
            }
        }
    }
    for r in input.remote.iter().take(8) {
        let (rkey, iova) = match r.mr {
            Ok(i) if !s.mrs.is_empty() => {
                let m = &s.mrs[usize::from(i) % s.mrs.len()];
                (m.rkey, m.iova.wrapping_add(u64::from(r.off)))
            }
            Ok(i) => (u32::from(i), u64::from(r.off)),
            Err(k) => (k, u64::from(r.off)),
        };
        let len = u64::from(r.len % (1 << 16));
        let model = s.mrs.iter().find(|m| m.rkey == rkey && rkey != 0);
        let mr = vm
            .ctrl
            .res
            .rkeys
            .get(&rkey)
            .and_then(|h| vm.ctrl.res.mrs.get(*h));
        assert_eq!(mr.is_some(), model.is_some(), "rkey {rkey:#x} lookup");
        let (Some(mr), Some(model)) = (mr, model) else {
            continue;
        };
        // With F_RESIZE every region has an rkey (spec 12.10): `keyed`.
        assert!(
            model.fast
                || mr.keyed
                || model.access & (acc::REMOTE_READ | acc::REMOTE_WRITE | acc::REMOTE_ATOMIC) != 0,
            "an rkey for an MR without remote access"
        );
        let mut got = Vec::new();
        let res = access::resolve(mr, iova, len, &mut got);
        let mut want = Vec::new();
        let ok = len == 0 || model.segments(iova, len, &mut want).is_some();
        assert_eq!(res.is_ok(), ok, "resolve({iova:#x}, {len}) = {res:?}");
        if res.is_ok() {
            assert_eq!(got, want, "resolve segments");
            for seg in &got {
                assert!(guest::in_ram(seg.gpa, seg.len), "segment {seg:?} not RAM");
            }
        }
    }
    // The second PD's handle is used only through the MRs and the QP.
    let _ = s.pds;
    parsed
}
