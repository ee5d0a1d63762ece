//! Hostile-guest tests: a guest (VM A) sends malformed, inconsistent or
//! malicious control requests through the real vhost-user socket.
//!
//! Every case asserts the exact status and `detail` that
//! `docs/virtio-rdma-spec.md` documents, and that a failed command had no
//! effect (no object created or destroyed, no QP number consumed). After every
//! case, [`assert_unharmed`] checks that
//!
//! - VM A is still served: a valid command sequence succeeds and its
//!   pre-existing QP reads back exactly as before;
//! - VM B, on the same daemon, is unaffected: it never reconnected, holds the
//!   objects it created before the attack (its QP reads back exactly as
//!   before), saw no failed or malformed command, and can create, use and
//!   destroy new objects;
//! - the daemon holds exactly the QP numbers of the live QPs of both VMs.
//!
//! Each `#[test]` is one named case run by [`hostile`] (or [`hostile_in`]
//! for a daemon with small limits or a guest without some features), on a
//! daemon of its own.
//!
//! Cases marked `Regression` failed against an earlier daemon; the comment
//! says what it got wrong.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Debug;
use std::time::{Duration, Instant};

use vhost_user_rdma::ctrl::CtrlStats;
use vhost_user_rdma::device::DeviceStats;
use vhost_user_rdma::resources::ResourceCounts;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::ctrl::{Completion, RequestSpec, POISON};
use vhost_user_rdma_tests::guest_mem::{GIB, MIB, PAGE_SIZE};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{rc_transitions, status_of, MrSpec, QpInfo, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vhost_user_rdma_tests::vring::{RawDesc, RawNext, Seg, F_NEXT, F_WRITE};
use vhost_user_rdma_tests::Result as VmmResult;
use virtio_rdma_abi::ctrl::{
    Opcode, RequestHeader, Status, DETAIL_DB_RECORD, DETAIL_LIST_PAGE, MAX_REQUEST_BYTES,
};
use virtio_rdma_abi::mem::{access, BufferDesc, PageListMode, DB_RECORD_SIZE};
use virtio_rdma_abi::qp::{attr, AddressVector, QpAttr, QpState};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

// ---------------------------------------------------------------------------
// Offsets used in `detail` (payload offsets, spec chapters 10 and 12).
// ---------------------------------------------------------------------------

/// Offset of `buf` (the BufferDesc) in each request payload (spec 10.3, "B").
const CQ_BUF: u32 = 16;
const MR_BUF: u32 = 24;
const QP_BUF: u32 = 56;
/// Offsets of the BufferDesc fields.
const ADDR: u32 = 0;
const NPAGES: u32 = 8;
const FPO: u32 = 12;
const SHIFT: u32 = 16;
const MODE: u32 = 20;
/// Size of `RegMrReq` (the payload size reported for page-list length errors).
const REG_MR_SIZE: u32 = 48;
/// Offsets of `ModifyQpReq` attribute fields (8 + QpAttr offset; av at 80).
const M_ACCESS: u32 = 16;
const M_PKEY_INDEX: u32 = 20;
const M_PORT: u32 = 24;
const M_PATH_MTU: u32 = 32;
const M_TIMEOUT: u32 = 36;
const M_RETRY_CNT: u32 = 40;
const M_RNR_RETRY: u32 = 44;
const M_MIN_RNR_TIMER: u32 = 48;
const M_RQ_PSN: u32 = 52;
const M_SQ_PSN: u32 = 56;
const M_DEST_QPN: u32 = 60;
const M_MAX_RD_ATOMIC: u32 = 64;
const M_MAX_DEST_RD_ATOMIC: u32 = 68;
const M_EN_SQD: u32 = 72;
const M_AV_FLOW_LABEL: u32 = 96;
const M_AV_SGID_INDEX: u32 = 100;
const M_AV_SL: u32 = 103;

/// Access of ordinary test MRs.
const LW: u32 = access::LOCAL_WRITE;
/// Access of the baseline MRs (remote rights need LOCAL_WRITE).
const RW: u32 = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
/// The highest 4 KiB-aligned address: a page there ends at 2^64.
const TOP_PAGE: u64 = !(PAGE_SIZE - 1);
/// An iova for test MRs.
const IOVA: u64 = 0x7f12_3400_0000;

fn opts() -> VmmOptions {
    VmmOptions {
        timeout: Duration::from_secs(5),
        ..VmmOptions::default()
    }
}

// ---------------------------------------------------------------------------
// The world of one case: a daemon, the attacker A (VM 0), the bystander B
// (VM 1), and the objects both created before the attack.
// ---------------------------------------------------------------------------

/// Objects a VM creates before the attack.
#[derive(Debug, Clone, Copy)]
struct Base {
    ctx: u32,
    pd: u32,
    cq: u32,
    qp: QpInfo,
    mr: u32,
    /// QUERY_QP of `qp` once set up: it must read back exactly so.
    qp_attrs: QueryQpResp,
}

/// Handles of a baseline before its QP is connected: ctx, PD, CQ, QP, MR.
type BaseParts = (u32, u32, u32, QpInfo, u32);

/// Creates a context, a PD, a CQ, an RC QP (in RESET) and a one-page MR.
fn create_base(vm: &mut TestVmm) -> BaseParts {
    let mut v = Verbs::new(vm);
    let ctx = v.create_ctx().unwrap();
    let pd = v.alloc_pd(ctx).unwrap();
    let cq = v.create_cq(ctx, 16).unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    let mr = v.reg_mr(&MrSpec::new(pd, RW, IOVA, &pages)).unwrap();
    (ctx, pd, cq, qp, mr.mr_handle)
}

/// The GID of VM `i` (VM A is 0, VM B 1): the default configuration's.
fn gid(i: usize) -> [u8; 16] {
    vhost_user_rdma::config::default_gid(i)
}

/// Moves the baseline QP to RTS towards `connect` (QPN and GID, if given)
/// and records what QUERY_QP returns for it.
fn finish_base(vm: &mut TestVmm, b: BaseParts, connect: Option<(u32, [u8; 16])>) -> Base {
    let (ctx, pd, cq, qp, mr) = b;
    let mut v = Verbs::new(vm);
    if let Some((dest_qpn, gid)) = connect {
        v.connect_rc(qp.handle, dest_qpn, gid).unwrap();
    }
    let qp_attrs = v.query_qp(qp.handle).unwrap();
    Base {
        ctx,
        pd,
        cq,
        qp,
        mr,
        qp_attrs,
    }
}

struct World {
    d: TestDaemon,
    /// The attacker (VM 0).
    a: TestVmm,
    /// The bystander (VM 1).
    b: TestVmm,
    /// A's objects from before the attack (None after a reconnect that did
    /// not recreate them).
    a_base: Option<Base>,
    b_base: Base,
    /// B's live objects as they must stay.
    b_counts: ResourceCounts,
    /// The device limits, as VM A reads them (QUERY_DEVICE).
    dev: DeviceAttr,
}

impl World {
    fn new() -> Self {
        Self::build(Limits::default(), opts())
    }

    /// A daemon with `limits`, VM A connected with `a_opts`.
    fn build(limits: Limits, a_opts: VmmOptions) -> Self {
        let d = TestDaemon::with_limits(2, limits).unwrap();
        let mut a = d.connect_with(0, a_opts).unwrap();
        let mut b = d.connect_with(1, opts()).unwrap();
        let pa = create_base(&mut a);
        let pb = create_base(&mut b);
        // Connect the two baseline QPs to each other (RESET -> RTS).
        let a_base = finish_base(&mut a, pa, Some((pb.3.qpn, gid(1))));
        let b_base = finish_base(&mut b, pb, Some((pa.3.qpn, gid(0))));
        assert_eq!(a_base.qp_attrs.attr.qp_state, u32::from(QpState::RTS));
        let b_counts = d.stats(1).device.resources;
        let dev = Verbs::new(&mut a).query_device().unwrap();
        World {
            d,
            a,
            b,
            a_base: Some(a_base),
            b_base,
            b_counts,
            dev,
        }
    }

    /// Typed verbs of VM A.
    fn va(&mut self) -> Verbs<'_> {
        Verbs::new(&mut self.a)
    }

    /// Typed verbs of VM B.
    fn vb(&mut self) -> Verbs<'_> {
        Verbs::new(&mut self.b)
    }

    /// A's baseline objects.
    fn base(&self) -> Base {
        self.a_base.expect("VM A's baseline objects")
    }

    fn a_stats(&self) -> DeviceStats {
        self.d.stats(0).device
    }

    fn a_counts(&self) -> ResourceCounts {
        self.a_stats().resources
    }

    /// Records B's objects as they are now (after a case deliberately
    /// created objects in B).
    fn snapshot_b(&mut self) {
        self.b_counts = self.d.stats(1).device.resources;
    }

    /// Runs a valid command sequence on VM A.
    fn ok<T>(&mut self, what: &str, f: impl FnOnce(&mut Verbs<'_>) -> VmmResult<T>) -> T {
        f(&mut self.va()).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// Runs a valid command sequence on VM B.
    fn b_ok<T>(&mut self, what: &str, f: impl FnOnce(&mut Verbs<'_>) -> VmmResult<T>) -> T {
        f(&mut self.vb()).unwrap_or_else(|e| panic!("{what} (VM B): {e}"))
    }

    /// Checks that, since `before`, VM A's objects and QP numbers did not
    /// change and exactly `failed` commands failed and `malformed` chains
    /// were refused, with no command succeeding.
    fn assert_no_effect(
        &self,
        what: &str,
        before: DeviceStats,
        qpns: usize,
        failed: u64,
        malformed: u64,
    ) {
        let after = self.a_stats();
        assert_eq!(
            after.resources, before.resources,
            "{what}: the rejected command changed VM A's objects"
        );
        let want = CtrlStats {
            ok: before.ctrl.ok,
            failed: before.ctrl.failed + failed,
            malformed: before.ctrl.malformed + malformed,
        };
        assert_eq!(after.ctrl, want, "{what}: control counters");
        assert_eq!(
            self.d.daemon().qpns_in_use(),
            qpns,
            "{what}: QP numbers in use changed"
        );
    }

    /// Runs ONE command on VM A and expects it to fail with exactly
    /// `status` / `detail` and to have no effect.
    fn expect<T: Debug>(
        &mut self,
        what: &str,
        status: Status,
        detail: u32,
        f: impl FnOnce(&mut Verbs<'_>) -> VmmResult<T>,
    ) {
        let before = self.a_stats();
        let qpns = self.d.daemon().qpns_in_use();
        let r = f(&mut self.va());
        assert_eq!(
            status_of(&r),
            Some((status, detail)),
            "{what}: expected {} with detail {detail} ({detail:#x}), got {r:?}",
            status.name()
        );
        self.assert_no_effect(what, before, qpns, 1, 0);
    }

    /// Submits a request described in full on VM A and expects an answer
    /// with exactly `status` / `detail`, used length 16, the request id
    /// echoed, and no effect.
    fn expect_spec(
        &mut self,
        what: &str,
        spec: &RequestSpec<'_>,
        status: Status,
        detail: u32,
    ) -> Completion {
        let before = self.a_stats();
        let qpns = self.d.daemon().qpns_in_use();
        let ctrl = self.a.ctrl();
        let t = ctrl.submit_spec(spec).unwrap();
        let c = ctrl.wait(t).unwrap();
        assert_eq!(
            (c.status(), c.detail),
            (Some(status), detail),
            "{what}: expected {} with detail {detail} ({detail:#x}), got {c:?}",
            status.name()
        );
        assert_eq!(c.used_len, 16, "{what}: used length of an error response");
        assert_eq!(c.resp_request_id, c.request_id, "{what}: request id echo");
        self.assert_no_effect(what, before, qpns, 1, 0);
        c
    }

    /// Publishes a raw chain on VM A and expects it to come back unanswered:
    /// used length 0, nothing written into `resp`, the `malformed` counter
    /// up by one, nothing executed.
    fn expect_malformed(
        &mut self,
        what: &str,
        descs: &[RawDesc],
        resp: Option<(GuestAddress, usize)>,
    ) {
        let before = self.a_stats();
        let qpns = self.d.daemon().qpns_in_use();
        let mem = self.a.mem().clone();
        let ctrl = self.a.ctrl();
        let t = ctrl.submit_raw_chain(descs, resp).unwrap();
        let c = ctrl.wait(t).unwrap();
        assert_eq!(
            c.used_len, 0,
            "{what}: a malformed chain must be returned with used length 0, got {c:?}"
        );
        if let Some((gpa, len)) = resp {
            let bytes = mem.read_vec(gpa, len).unwrap();
            assert!(
                bytes.iter().all(|&b| b == POISON),
                "{what}: the device wrote into a chain it refused"
            );
        }
        self.assert_no_effect(what, before, qpns, 0, 1);
    }
}

/// Runs `case` on a fresh world with default limits, then checks that the
/// daemon is unharmed.
fn hostile(case: impl FnOnce(&mut World)) {
    hostile_in(World::new(), case);
}

/// Runs `case` on `w`, then checks that the daemon is unharmed.
fn hostile_in(mut w: World, case: impl FnOnce(&mut World)) {
    case(&mut w);
    assert_unharmed(&mut w);
}

/// The check every case ends with: VM A is still served, VM B is unaffected.
fn assert_unharmed(w: &mut World) {
    // --- VM A keeps being served. ---
    assert!(w.d.stats(0).connected, "VM A was disconnected");
    let a_before = w.a_counts();
    let b_qpn = w.b_base.qp.qpn;
    let a_base = w.a_base;
    let mut v = w.va();
    v.query_device()
        .expect("VM A: QUERY_DEVICE after the attack");
    if let Some(base) = a_base {
        let q = v
            .query_qp(base.qp.handle)
            .expect("VM A: QUERY_QP of its QP");
        assert_eq!(q, base.qp_attrs, "VM A: its pre-existing QP changed");
    }
    let ctx = v.create_ctx().expect("VM A: CREATE_CTX after the attack");
    let pd = v.alloc_pd(ctx).expect("VM A: ALLOC_PD after the attack");
    let cq = v
        .create_cq(ctx, 64)
        .expect("VM A: CREATE_CQ after the attack");
    let qp = v
        .create_qp(&QpInit::rc(pd, cq))
        .expect("VM A: CREATE_QP after the attack");
    v.connect_rc(qp.handle, b_qpn, gid(1))
        .expect("VM A: RESET -> RTS after the attack");
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    v.reg_mr(&MrSpec::new(pd, LW, IOVA, &pages))
        .expect("VM A: REG_MR after the attack");
    v.destroy_ctx(ctx)
        .expect("VM A: DESTROY_CTX after the attack");
    assert_eq!(w.a_counts(), a_before, "VM A: DESTROY_CTX left objects");

    // --- VM B is unaffected. ---
    let sb = w.d.stats(1);
    assert!(sb.connected, "VM B was disconnected");
    assert_eq!(sb.connections, 1, "VM B had to reconnect");
    assert_eq!(
        sb.device.resources, w.b_counts,
        "VM B's objects changed during the attack on VM A"
    );
    assert_eq!(
        (sb.device.ctrl.failed, sb.device.ctrl.malformed),
        (0, 0),
        "VM B saw failed commands"
    );
    let bb = w.b_base;
    let b_counts = w.b_counts;
    let a_qpn = w.a_base.map_or(0x12345, |b| b.qp.qpn);
    let mut v = w.vb();
    let q = v
        .query_qp(bb.qp.handle)
        .expect("VM B: QUERY_QP of its QP after the attack");
    assert_eq!(q, bb.qp_attrs, "VM B: its QP changed during the attack");
    let cq = v.create_cq(bb.ctx, 32).expect("VM B: CREATE_CQ");
    let qp = v
        .create_qp(&QpInit::rc(bb.pd, cq))
        .expect("VM B: CREATE_QP");
    v.connect_rc(qp.handle, a_qpn, gid(0))
        .expect("VM B: RESET -> RTS");
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    let mr = v
        .reg_mr(&MrSpec::new(bb.pd, RW, IOVA, &pages))
        .expect("VM B: REG_MR");
    v.destroy_qp(qp.handle).expect("VM B: DESTROY_QP");
    v.dereg_mr(mr.mr_handle).expect("VM B: DEREG_MR");
    v.destroy_cq(cq).expect("VM B: DESTROY_CQ");
    let sb = w.d.stats(1);
    assert_eq!(sb.device.resources, b_counts, "VM B: objects leaked");
    assert_eq!(sb.device.ctrl.failed, 0, "VM B: a valid command failed");

    // --- The shared engine holds exactly the live QPs' numbers. ---
    let live = w.d.stats(0).device.resources.qp + w.d.stats(1).device.resources.qp;
    assert_eq!(w.d.daemon().qpns_in_use(), live, "QP numbers leaked");
}

// ---------------------------------------------------------------------------
// Request builders.
// ---------------------------------------------------------------------------

fn desc(mode: PageListMode, addr: u64, npages: u32, page_shift: u32) -> BufferDesc {
    BufferDesc {
        addr,
        npages,
        first_page_offset: 0,
        page_shift,
        mode: mode.into(),
    }
}

fn inline(npages: u32) -> BufferDesc {
    desc(PageListMode::INLINE, 0, npages, 12)
}

fn le64s(addrs: &[u64]) -> Vec<u8> {
    addrs.iter().flat_map(|a| a.to_le_bytes()).collect()
}

/// A REG_MR request of `length` bytes on `pd` with local write access.
fn mr_req(pd: u32, length: u64, buf: BufferDesc) -> RegMrReq {
    RegMrReq {
        pd_handle: pd,
        access: LW,
        iova: IOVA,
        length,
        buf,
    }
}

/// `n` valid 4 KiB pages of VM A, as addresses.
fn pages(w: &World, n: usize) -> Vec<u64> {
    w.a.mem()
        .alloc_pages(n, PAGE_SIZE)
        .unwrap()
        .iter()
        .map(|p| p.0)
        .collect()
}

/// End of RAM region `i` of VM A.
fn region_end(w: &World, i: usize) -> u64 {
    w.a.mem().layout().regions[i].end()
}

/// A valid CREATE_CQ request of `depth` on A's baseline context, with an
/// inline page list.
fn cq_req(w: &mut World, depth: u32) -> (CreateCqReq, Vec<u8>) {
    let ctx = w.base().ctx;
    let v = w.va();
    let ring = v.alloc_ring(u64::from(depth) * 32).unwrap();
    let list = v.page_list(&ring.pages, 12, PageListMode::INLINE).unwrap();
    (
        CreateCqReq {
            ctx_handle: ctx,
            depth,
            db_gpa: ring.db.0,
            buf: list.desc,
        },
        list.tail,
    )
}

/// A valid CREATE_QP request for `init`, with freshly allocated rings.
fn qp_req(w: &mut World, init: &QpInit) -> (CreateQpReq, Vec<u8>) {
    w.va().qp_request(init).unwrap()
}

/// A fresh RC QP in RESET on A's baseline PD and CQ.
fn fresh_qp(w: &mut World) -> u32 {
    let b = w.base();
    w.ok("create QP", |v| v.create_qp(&QpInit::rc(b.pd, b.cq)))
        .handle
}

/// The RC transitions RESET -> INIT, INIT -> RTR, RTR -> RTS towards B.
fn rc_steps(w: &World) -> [(u32, QpAttr); 3] {
    rc_transitions(w.b_base.qp.qpn, gid(1))
}

/// A fresh RC QP moved through the first `n` transitions (0: RESET,
/// 1: INIT, 2: RTR, 3: RTS).
fn qp_in(w: &mut World, n: usize) -> u32 {
    let qp = fresh_qp(w);
    for (mask, a) in rc_steps(w).into_iter().take(n) {
        w.ok("modify QP", |v| v.modify_qp(qp, mask, &a));
    }
    qp
}

/// MODIFY_QP that must fail with `status` / `detail` and leave the QP
/// exactly as it was (all-or-nothing).
fn expect_modify(
    w: &mut World,
    what: &str,
    qp: u32,
    mask: u32,
    a: QpAttr,
    status: Status,
    detail: u32,
) {
    let before = w.ok("query QP", |v| v.query_qp(qp));
    w.expect(what, status, detail, |v| v.modify_qp(qp, mask, &a));
    let after = w.ok("query QP", |v| v.query_qp(qp));
    assert_eq!(after, before, "{what}: the failed MODIFY_QP changed the QP");
}

/// A valid CREATE_CTX payload: a fresh context doorbell header in VM A.
fn new_ctx_req(w: &World) -> Vec<u8> {
    let db_gpa = w.a.mem().alloc(64, 64).unwrap().0;
    CreateCtxReq { db_gpa }.to_bytes()
}

/// Writes a request (header with request id 0xABCD, then `payload`) into a
/// fresh page of A and returns its address and length.
fn raw_request(w: &World, opcode: Opcode, payload: &[u8]) -> (GuestAddress, u32) {
    let mem = w.a.mem();
    let mut bytes = RequestHeader {
        request_id: 0xABCD,
        opcode: opcode.into(),
        reserved: 0,
    }
    .to_bytes();
    bytes.extend_from_slice(payload);
    let gpa = mem.alloc(bytes.len() as u64, PAGE_SIZE).unwrap();
    mem.write(gpa, &bytes).unwrap();
    (gpa, bytes.len() as u32)
}

/// A fresh device-writable page of A.
fn resp_buf(w: &World) -> GuestAddress {
    w.a.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap()
}

// ===========================================================================
// Page lists: addresses outside RAM (spec 10.3 rules 10-12).
// ===========================================================================

#[test]
fn page_in_hole_between_regions() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[1] = w.a.mem().hole_gpa();
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect("REG_MR, page 1 in the hole", Status::BAD_ADDRESS, 1, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        // The same page in a CQ ring.
        let (mut cq, _) = cq_req(w, 128);
        let mut ring = pages(w, 1);
        ring[0] = w.a.mem().hole_gpa() + 16 * PAGE_SIZE;
        cq.buf = inline(1);
        w.expect(
            "CREATE_CQ, ring page in the hole",
            Status::BAD_ADDRESS,
            0,
            |v| v.create_cq_raw(&cq, &le64s(&ring)),
        );
    });
}

#[test]
fn page_past_end_of_ram() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[2] = region_end(w, 1);
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect(
            "REG_MR, page 2 past the end of RAM",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        p[2] = 1 << 52;
        w.expect(
            "REG_MR, page 2 far beyond RAM",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
    });
}

#[test]
fn page_address_overflows_u64() {
    hostile(|w| {
        // Aligned, but a + 4096 overflows 64 bits.
        let mut p = pages(w, 2);
        p[0] = TOP_PAGE;
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE, inline(2));
        w.expect(
            "REG_MR, page 0 at 2^64 - 4096",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // CONTIGUOUS: the page addresses themselves run past 2^64.
        let start = TOP_PAGE;
        let req = mr_req(
            w.base().pd,
            2 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 2, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS wrapping 2^64",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
    });
}

#[test]
fn contiguous_list_across_end_of_region0() {
    hostile(|w| {
        // Pages 0 and 1 are the last two pages of region 0; page 2 is the
        // first page of the hole.
        let start = region_end(w, 0) - 2 * PAGE_SIZE;
        let req = mr_req(
            w.base().pd,
            4 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 4, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS across the hole",
            Status::BAD_ADDRESS,
            2,
            |v| v.reg_mr_raw(&req, &[]),
        );
        // The same for a CQ ring of 4 pages (depth 512).
        let (mut cq, _) = cq_req(w, 512);
        cq.buf = desc(PageListMode::CONTIGUOUS, start, 4, 12);
        w.expect(
            "CREATE_CQ, CONTIGUOUS across the hole",
            Status::BAD_ADDRESS,
            2,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn large_page_crossing_end_of_region() {
    hostile(|w| {
        // One 512 MiB page at GPA 0: aligned, starts in RAM, but region 0
        // is only 256 MiB long.
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, 0, 1, 29),
        );
        w.expect(
            "REG_MR, 512 MiB page over the region end",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
        // A 512 MiB page at the start of region 1 (which is 256 MiB long).
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.buf.page_shift = 29;
        let region1 = w.a.mem().layout().regions[1].gpa;
        w.expect(
            "REG_MR, 512 MiB page over the end of region 1",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &le64s(&[region1])),
        );
    });
}

#[test]
fn misaligned_pages() {
    hostile(|w| {
        let mut p = pages(w, 3);
        p[1] += 0x800;
        let req = mr_req(w.base().pd, 3 * PAGE_SIZE, inline(3));
        w.expect("REG_MR, page 1 misaligned", Status::BAD_ADDRESS, 1, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        // 4 KiB aligned but not 2 MiB aligned with 2 MiB pages.
        let big = w.a.mem().alloc(4 * MIB, 2 * MIB).unwrap().0;
        let mut req = mr_req(w.base().pd, 4 * MIB, inline(2));
        req.buf.page_shift = 21;
        w.expect(
            "REG_MR, 2 MiB page at a 4 KiB boundary",
            Status::BAD_ADDRESS,
            1,
            |v| v.reg_mr_raw(&req, &le64s(&[big, big + 2 * MIB + PAGE_SIZE])),
        );
        // CONTIGUOUS with a misaligned start (rule 10: detail 0).
        let req = mr_req(
            w.base().pd,
            2 * PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, big + 8, 2, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS addr misaligned",
            Status::BAD_ADDRESS,
            0,
            |v| v.reg_mr_raw(&req, &[]),
        );
    });
}

#[test]
fn indirect_list_page_outside_ram() {
    hostile(|w| {
        let pd = w.base().pd;
        // 600 pages need two list pages.
        let backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        let lp0 = u64::from_le_bytes(list.tail[..8].try_into().unwrap());
        for (what, lp1) in [
            ("list page in the hole", w.a.mem().hole_gpa()),
            ("list page past the end of RAM", region_end(w, 1)),
            ("list page misaligned", lp0 + 8),
            ("list page overflowing", TOP_PAGE),
        ] {
            w.expect(what, Status::BAD_ADDRESS, DETAIL_LIST_PAGE, |v| {
                v.reg_mr_raw(&req, &le64s(&[lp0, lp1]))
            });
        }
        // The intact list registers fine.
        let mr = w.ok("REG_MR with the intact list", |v| {
            v.reg_mr_raw(&req, &list.tail)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
    });
}

#[test]
fn indirect_entry_outside_ram() {
    hostile(|w| {
        let pd = w.base().pd;
        let mut backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        // Entry 519 = entry 7 of the second list page.
        backing[519] = GuestAddress(w.a.mem().hole_gpa());
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        w.expect(
            "REG_MR, list entry 519 in the hole",
            Status::BAD_ADDRESS,
            519,
            |v| v.reg_mr_raw(&req, &list.tail),
        );
    });
}

#[test]
fn doorbell_record_bad() {
    hostile(|w| {
        let hole = w.a.mem().hole_gpa();
        let end = region_end(w, 1);
        for (what, db) in [
            ("doorbell misaligned", None),
            ("doorbell in the hole", Some(hole)),
            ("doorbell past the end of RAM", Some(end)),
            (
                "doorbell overflowing",
                Some(TOP_PAGE + (PAGE_SIZE - DB_RECORD_SIZE)),
            ),
        ] {
            let (mut cq, tail) = cq_req(w, 64);
            cq.db_gpa = db.unwrap_or(cq.db_gpa + 8);
            w.expect(
                &format!("CREATE_CQ, {what}"),
                Status::BAD_ADDRESS,
                DETAIL_DB_RECORD,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
        // The context's doorbell header (spec 12.4): 64-byte aligned, in RAM.
        for (what, db) in [
            ("misaligned", 8),
            ("in the hole", hole),
            ("past the end of RAM", end),
            ("overflowing", u64::MAX - 63),
        ] {
            w.expect(
                &format!("CREATE_CTX, doorbell header {what}"),
                Status::BAD_ADDRESS,
                DETAIL_DB_RECORD,
                |v| v.create_ctx_at(db),
            );
        }
        let b = w.base();
        let (mut qp, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        qp.db_gpa = hole + DB_RECORD_SIZE;
        w.expect(
            "CREATE_QP, doorbell in the hole",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| v.create_qp_raw(&qp, &tail),
        );
        qp.db_gpa = region_end(w, 0) - 32;
        w.expect(
            "CREATE_QP, doorbell misaligned at the region end",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| v.create_qp_raw(&qp, &tail),
        );
        // SRQ: build a valid request by hand.
        let ring = w.va().alloc_ring(16 << 5).unwrap();
        let list = w
            .va()
            .page_list(&ring.pages, 12, PageListMode::INLINE)
            .unwrap();
        let srq = CreateSrqReq {
            pd_handle: b.pd,
            depth: 16,
            max_sge: 1,
            limit: 0,
            db_gpa: end,
            buf: list.desc,
        };
        w.expect(
            "CREATE_SRQ, doorbell past the end of RAM",
            Status::BAD_ADDRESS,
            DETAIL_DB_RECORD,
            |v| {
                v.ctrl()
                    .call_typed::<_, CreateSrqResp>(Opcode::CREATE_SRQ, &srq, &list.tail)
            },
        );
    });
}

// ===========================================================================
// Page lists: shape of the description (spec 10.3 rules 1-9).
// ===========================================================================

#[test]
fn page_list_too_short() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = pages(w, 3);
        let req = mr_req(pd, 3 * PAGE_SIZE, inline(3));
        // INVALID, detail = the expected payload size (48 + 3 * 8).
        w.expect(
            "INLINE list with 2 of 3 entries",
            Status::INVALID,
            REG_MR_SIZE + 24,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
        w.expect(
            "INLINE list with 7 bytes of the third entry",
            Status::INVALID,
            REG_MR_SIZE + 24,
            |v| v.reg_mr_raw(&req, &le64s(&p)[..23]),
        );
        // INDIRECT: 600 pages need 2 list page addresses; give 1.
        let backing = w.a.mem().alloc_pages(600, PAGE_SIZE).unwrap();
        let list = w
            .va()
            .page_list(&backing, 12, PageListMode::INDIRECT)
            .unwrap();
        let req = mr_req(pd, 600 * PAGE_SIZE, list.desc);
        w.expect(
            "INDIRECT directory too short",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &list.tail[..8]),
        );
        // A CQ ring list: CreateCqReq is 40 bytes, one entry expected.
        let (cq, _) = cq_req(w, 64);
        w.expect(
            "CREATE_CQ, INLINE list missing",
            Status::INVALID,
            40 + 8,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn page_list_trailing_garbage() {
    hostile(|w| {
        let pd = w.base().pd;
        let mut p = pages(w, 2);
        let req = mr_req(pd, 2 * PAGE_SIZE, inline(2));
        p.push(0xdead_b000);
        w.expect(
            "INLINE list with an extra entry",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        let mut bytes = le64s(&p[..2]);
        bytes.push(0);
        w.expect(
            "INLINE list with one extra byte",
            Status::INVALID,
            REG_MR_SIZE + 16,
            |v| v.reg_mr_raw(&req, &bytes),
        );
        let start = p[0];
        let req = mr_req(pd, PAGE_SIZE, desc(PageListMode::CONTIGUOUS, start, 1, 12));
        w.expect(
            "CONTIGUOUS followed by bytes",
            Status::INVALID,
            REG_MR_SIZE,
            |v| v.reg_mr_raw(&req, &le64s(&[start])),
        );
    });
}

#[test]
fn npages_zero() {
    hostile(|w| {
        let req = mr_req(w.base().pd, PAGE_SIZE, inline(0));
        w.expect(
            "REG_MR, INLINE npages 0",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &[]),
        );
        let start = pages(w, 1)[0];
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, 0, 12),
        );
        w.expect(
            "REG_MR, CONTIGUOUS npages 0",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &[]),
        );
        let (mut cq, _) = cq_req(w, 64);
        cq.buf.npages = 0;
        w.expect(
            "CREATE_CQ, npages 0",
            Status::INVALID,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &[]),
        );
    });
}

#[test]
fn npages_absurd() {
    hostile(|w| {
        // npages = 2^32 - 1 with CONTIGUOUS (no list to send). This breaks
        // rule 4 (npages <= max_mr_pages: RANGE) and rule 9 (npages must
        // match the length: INVALID), both with detail B + 8; spec 7.5
        // lets the device report either (the SHOULD order of 10.3 checks
        // rule 9 first and gives INVALID).
        let start = pages(w, 1)[0];
        let req = mr_req(
            w.base().pd,
            PAGE_SIZE,
            desc(PageListMode::CONTIGUOUS, start, u32::MAX, 12),
        );
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let r = w.va().reg_mr_raw(&req, &[]);
        let got = status_of(&r);
        assert!(
            got == Some((Status::RANGE, MR_BUF + NPAGES))
                || got == Some((Status::INVALID, MR_BUF + NPAGES)),
            "REG_MR with npages 2^32-1: {r:?}"
        );
        w.assert_no_effect("npages 2^32-1", before, qpns, 1, 0);
        // A QP ring claiming 2^31 pages.
        let b = w.base();
        let (mut qp, _) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        qp.buf = desc(PageListMode::CONTIGUOUS, start, 1 << 31, 12);
        let before = w.a_stats();
        let r = w.va().create_qp_raw(&qp, &[]);
        let got = status_of(&r);
        assert!(
            got == Some((Status::RANGE, QP_BUF + NPAGES))
                || got == Some((Status::INVALID, QP_BUF + NPAGES)),
            "CREATE_QP with npages 2^31: {r:?}"
        );
        w.assert_no_effect("QP npages 2^31", before, qpns, 1, 0);
    });
}

#[test]
fn inline_list_over_max_inline_pages() {
    hostile(|w| {
        // max_inline_pages + 1 entries (the same page repeated, which is
        // allowed) with a consistent length.
        let max = w.dev.max_inline_pages;
        let n = max + 1;
        let p = pages(w, 1);
        let list = le64s(&vec![p[0]; n as usize]);
        let req = mr_req(w.base().pd, u64::from(n) * PAGE_SIZE, inline(n));
        w.expect(
            "REG_MR, max_inline_pages + 1 inline pages",
            Status::RANGE,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &list),
        );
        // max_inline_pages is fine.
        let req = mr_req(w.base().pd, u64::from(max) * PAGE_SIZE, inline(max));
        let mr = w.ok("REG_MR, max_inline_pages inline pages", |v| {
            v.reg_mr_raw(&req, &list[..max as usize * 8])
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
    });
}

#[test]
fn page_shift_out_of_range() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = pages(w, 2);
        // npages is consistent with the (invalid) page size where one exists.
        for (shift, npages) in [(11, 2), (0, 1), (31, 1), (63, 1), (64, 1), (u32::MAX, 1)] {
            let mut req = mr_req(pd, PAGE_SIZE, inline(npages));
            req.buf.page_shift = shift;
            w.expect(
                &format!("REG_MR, page_shift {shift}"),
                Status::INVALID,
                MR_BUF + SHIFT,
                |v| v.reg_mr_raw(&req, &le64s(&p[..npages as usize])),
            );
        }
        for shift in [11, 31, 64] {
            let (mut cq, tail) = cq_req(w, 64);
            cq.buf.page_shift = shift;
            w.expect(
                &format!("CREATE_CQ, page_shift {shift}"),
                Status::INVALID,
                CQ_BUF + SHIFT,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
    });
}

/// Regression: the daemon computed the QP buffer layout with the guest's
/// page_shift and reported RANGE, detail 24 (`sq_depth`), before the page
/// list rules ran. Spec 10.3 rule 2: INVALID, detail B + 16 = 72.
#[test]
fn qp_page_shift_out_of_range() {
    hostile(|w| {
        let b = w.base();
        for shift in [11, 31, 32, 40, 63] {
            let (mut qp, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
            qp.buf.page_shift = shift;
            w.expect(
                &format!("CREATE_QP, page_shift {shift}"),
                Status::INVALID,
                QP_BUF + SHIFT,
                |v| v.create_qp_raw(&qp, &tail),
            );
        }
    });
}

#[test]
fn unknown_page_list_mode() {
    hostile(|w| {
        let p = pages(w, 1);
        for mode in [0, 4, 0x8000_0001, u32::MAX] {
            let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
            req.buf.mode = mode;
            w.expect(
                &format!("REG_MR, mode {mode:#x}"),
                Status::INVALID,
                MR_BUF + MODE,
                |v| v.reg_mr_raw(&req, &le64s(&p)),
            );
        }
        let (mut cq, tail) = cq_req(w, 64);
        cq.buf.mode = 7;
        w.expect("CREATE_CQ, mode 7", Status::INVALID, CQ_BUF + MODE, |v| {
            v.create_cq_raw(&cq, &tail)
        });
    });
}

#[test]
fn addr_not_zero_for_list_modes() {
    hostile(|w| {
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.buf.addr = p[0];
        w.expect(
            "REG_MR, INLINE with addr",
            Status::INVALID,
            MR_BUF + ADDR,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
    });
}

#[test]
fn queue_buffer_shape_errors() {
    hostile(|w| {
        // first_page_offset must be 0 for a queue buffer.
        let (mut cq, tail) = cq_req(w, 64);
        cq.buf.first_page_offset = 64;
        w.expect(
            "CREATE_CQ, first_page_offset 64",
            Status::INVALID,
            CQ_BUF + FPO,
            |v| v.create_cq_raw(&cq, &tail),
        );
        // npages must be exactly what the ring needs: depth 64 -> 1 page.
        let (mut cq, mut tail) = cq_req(w, 64);
        cq.buf.npages = 2;
        tail.extend_from_slice(&tail.clone());
        w.expect(
            "CREATE_CQ, one page too many",
            Status::INVALID,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &tail),
        );
    });
}

// ===========================================================================
// Absurd lengths and counts.
// ===========================================================================

#[test]
fn mr_length_zero() {
    hostile(|w| {
        // length 0 with first_page_offset 100 still needs exactly one page,
        // so only the length rule is broken.
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, 0, inline(1));
        req.buf.first_page_offset = 100;
        w.expect("REG_MR, length 0", Status::INVALID, 16, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
    });
}

#[test]
fn mr_length_over_max_mr_size() {
    hostile(|w| {
        // max_mr_size + 4 KiB in pages of 256 MiB, each the whole of
        // region 0 (pages may repeat): everything but the length is valid.
        let max = w.dev.max_mr_size;
        assert_eq!(
            max % (256 * MIB),
            0,
            "test assumes a max_mr_size in 256 MiB units"
        );
        assert!(max + PAGE_SIZE <= w.dev.max_mr_bytes);
        let length = max + PAGE_SIZE;
        let n = length.div_ceil(256 * MIB) as u32;
        let mut req = mr_req(w.base().pd, length, inline(n));
        req.buf.page_shift = 28;
        w.expect(
            "REG_MR, length max_mr_size + 4096",
            Status::RANGE,
            16,
            |v| v.reg_mr_raw(&req, &le64s(&vec![0; n as usize])),
        );
        // Exactly max_mr_size is accepted (and counted).
        let n = (max / (256 * MIB)) as u32;
        let mut req = mr_req(w.base().pd, max, inline(n));
        req.buf.page_shift = 28;
        let mr = w.ok("REG_MR, length max_mr_size", |v| {
            v.reg_mr_raw(&req, &le64s(&vec![0; n as usize]))
        });
        assert_eq!(w.a_counts().registered_bytes, max + PAGE_SIZE);
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
    });
}

/// Regression: the daemon reported the overflow of `iova + length` with
/// detail 8 (the offset of `iova`); spec 12.10 says INVALID, detail 16.
#[test]
fn mr_iova_plus_length_overflows() {
    hostile(|w| {
        let p = pages(w, 1);
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(1));
        req.iova = u64::MAX - PAGE_SIZE + 1;
        w.expect("REG_MR, iova + length = 2^64", Status::INVALID, 16, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
    });
}

#[test]
fn mr_first_page_offset_and_npages_inconsistent() {
    hostile(|w| {
        let p = pages(w, 3);
        // first_page_offset must be below the page size.
        let mut req = mr_req(w.base().pd, PAGE_SIZE, inline(2));
        req.buf.first_page_offset = PAGE_SIZE as u32;
        w.expect(
            "REG_MR, first_page_offset 4096",
            Status::INVALID,
            MR_BUF + FPO,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
        // 2 pages of data described by 3 pages.
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE, inline(3));
        w.expect(
            "REG_MR, one page too many",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // 2 pages + 1 byte described by 2 pages.
        let req = mr_req(w.base().pd, 2 * PAGE_SIZE + 1, inline(2));
        w.expect(
            "REG_MR, one page too few",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &le64s(&p[..2])),
        );
    });
}

#[test]
fn cq_depth_not_power_of_two() {
    hostile(|w| {
        for depth in [3, 100, 65535] {
            let (cq, tail) = cq_req(w, depth);
            w.expect(
                &format!("CREATE_CQ, depth {depth}"),
                Status::INVALID,
                4,
                |v| v.create_cq_raw(&cq, &tail),
            );
        }
    });
}

#[test]
fn cq_depth_over_max_cqe() {
    hostile(|w| {
        // depth 2 * max_cqe (a power of two) with a correct contiguous ring.
        let max = w.dev.max_cqe;
        let ctx = w.base().ctx;
        let bytes = 2 * u64::from(max) * 32;
        let ring = w.a.mem().alloc(bytes, PAGE_SIZE).unwrap();
        let db = w.a.mem().alloc(64, 64).unwrap();
        let cq = CreateCqReq {
            ctx_handle: ctx,
            depth: 2 * max,
            db_gpa: db.0,
            buf: desc(
                PageListMode::CONTIGUOUS,
                ring.0,
                (bytes / PAGE_SIZE) as u32,
                12,
            ),
        };
        w.expect("CREATE_CQ, depth 2 * max_cqe", Status::RANGE, 4, |v| {
            v.create_cq_raw(&cq, &[])
        });
        // max_cqe with the same memory is fine.
        let cq = CreateCqReq {
            depth: max,
            buf: desc(
                PageListMode::CONTIGUOUS,
                ring.0,
                (bytes / PAGE_SIZE / 2) as u32,
                12,
            ),
            ..cq
        };
        let h = w.ok("CREATE_CQ, depth max_cqe", |v| v.create_cq_raw(&cq, &[]));
        w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
    });
}

#[test]
fn create_qp_values_out_of_domain() {
    hostile(|w| {
        let b = w.base();
        let d = w.dev;
        let base = QpInit::rc(b.pd, b.cq);
        let with = |f: &dyn Fn(&mut QpInit)| {
            let mut i = base;
            f(&mut i);
            i
        };
        // Each request gets a ring of exactly the size its values need.
        let cases: [(&str, QpInit, Status, u32); 7] = [
            ("sq_depth 3", with(&|i| i.sq_depth = 3), Status::INVALID, 24),
            (
                "sq_depth 2 * max",
                with(&|i| i.sq_depth = 2 * d.max_qp_wr),
                Status::RANGE,
                24,
            ),
            ("rq_depth 3", with(&|i| i.rq_depth = 3), Status::INVALID, 28),
            (
                "rq_depth 2 * max",
                with(&|i| i.rq_depth = 2 * d.max_qp_wr),
                Status::RANGE,
                28,
            ),
            (
                "max_send_sge max + 1",
                with(&|i| i.max_send_sge = d.max_send_sge + 1),
                Status::RANGE,
                32,
            ),
            (
                "max_recv_sge max + 1",
                with(&|i| i.max_recv_sge = d.max_recv_sge + 1),
                Status::RANGE,
                36,
            ),
            (
                "max_inline_data max + 1",
                with(&|i| i.max_inline_data = d.max_inline_data + 1),
                Status::RANGE,
                40,
            ),
        ];
        for (what, init, status, detail) in cases {
            let (req, tail) = qp_req(w, &init);
            w.expect(&format!("CREATE_QP, {what}"), status, detail, |v| {
                v.create_qp_raw(&req, &tail)
            });
        }
        for (what, qp_type, flags, status, detail) in [
            ("qp_type 0", 0, 0, Status::INVALID, 4),
            ("qp_type 3", 3, 0, Status::INVALID, 4),
            ("unknown flags", 1, 0x2, Status::INVALID, 20),
            ("unknown high flag", 1, 0x8000_0001, Status::INVALID, 20),
        ] {
            let (mut req, tail) = qp_req(w, &base);
            req.qp_type = qp_type;
            req.flags = flags;
            w.expect(&format!("CREATE_QP, {what}"), status, detail, |v| {
                v.create_qp_raw(&req, &tail)
            });
        }
        // A receive queue together with an SRQ.
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let (req, tail) = qp_req(w, &QpInit { srq, ..base });
        w.expect(
            "CREATE_QP, rq_depth 16 with an SRQ",
            Status::INVALID,
            28,
            |v| v.create_qp_raw(&req, &tail),
        );
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));
    });
}

/// Spec 12.12: `max_send_sge` 0 is accepted (a QP that posts only inline
/// or zero-length work requests, ABI version 2); the send stride is the one
/// of section 11.3 for 0 SGEs, and QUERY_QP reports the 0.
#[test]
fn create_qp_max_send_sge_zero() {
    hostile(|w| {
        let b = w.base();
        for (inline, shift) in [(0, 6), (64, 7)] {
            let init = QpInit {
                max_send_sge: 0,
                max_inline_data: inline,
                ..QpInit::rc(b.pd, b.cq)
            };
            let (req, tail) = qp_req(w, &init);
            let r = w.ok("CREATE_QP, max_send_sge 0", |v| {
                v.create_qp_raw(&req, &tail)
            });
            assert_eq!(r.sq_wqe_shift, shift, "max_inline_data {inline}");
            let q = w.ok("QUERY_QP", |v| v.query_qp(r.qp_handle));
            assert_eq!(q.max_send_sge, 0);
            w.ok("DESTROY_QP", |v| v.destroy_qp(r.qp_handle));
        }
    });
}

/// Regression: the daemon accepted `max_recv_sge` 0 for a QP with its own
/// receive queue. Spec 12.12: INVALID, detail 36.
#[test]
fn create_qp_max_recv_sge_zero_without_srq() {
    hostile(|w| {
        let b = w.base();
        let init = QpInit {
            max_recv_sge: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        let (req, tail) = qp_req(w, &init);
        w.expect(
            "CREATE_QP, max_recv_sge 0 without SRQ",
            Status::INVALID,
            36,
            |v| v.create_qp_raw(&req, &tail),
        );
        // With an SRQ, 0 is allowed.
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let init = QpInit {
            srq,
            rq_depth: 0,
            ..init
        };
        let qp = w.ok("CREATE_QP, max_recv_sge 0 with an SRQ", |v| {
            v.create_qp(&init)
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(qp.handle)?;
            v.destroy_srq(srq)
        });
    });
}

#[test]
fn srq_and_ah_values_out_of_domain() {
    hostile(|w| {
        let pd = w.base().pd;
        let d = w.dev;
        for (what, depth, max_sge, limit, status, detail) in [
            ("depth 3", 3, 1, 0, Status::INVALID, 4),
            ("depth 2 * max", 2 * d.max_srq_wr, 1, 0, Status::RANGE, 4),
            ("max_sge 0", 16, 0, 0, Status::INVALID, 8),
            (
                "max_sge max + 1",
                16,
                d.max_recv_sge + 1,
                0,
                Status::RANGE,
                8,
            ),
            ("limit = depth", 16, 1, 16, Status::RANGE, 12),
        ] {
            w.expect(&format!("CREATE_SRQ, {what}"), status, detail, |v| {
                v.create_srq(pd, depth, max_sge, limit)
            });
        }
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 4))
            .srq_handle;
        for (what, mask, limit, status, detail) in [
            ("mask 0", 0, 1, Status::INVALID, 0),
            ("unknown mask bit", 0x2 | 0x4, 1, Status::INVALID, 0x4),
            ("MAX_WR", 0x1, 1, Status::UNSUPPORTED, 0x1),
            ("limit = depth", 0x2, 16, Status::RANGE, 12),
        ] {
            w.expect(&format!("MODIFY_SRQ, {what}"), status, detail, |v| {
                v.modify_srq(srq, mask, 32, limit)
            });
        }
        let q = w.ok("QUERY_SRQ", |v| v.query_srq(srq));
        assert_eq!(
            (q.depth, q.max_sge, q.limit),
            (16, 1, 4),
            "failed MODIFY_SRQs changed the SRQ"
        );
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));

        let av = AddressVector::default();
        for (what, port, av, status, detail) in [
            ("port 2", 2, av, Status::RANGE, 4),
            (
                "flow_label 2^20",
                1,
                AddressVector {
                    flow_label: 1 << 20,
                    ..av
                },
                Status::INVALID,
                24,
            ),
            (
                "sgid_index 1",
                1,
                AddressVector {
                    sgid_index: 1,
                    ..av
                },
                Status::RANGE,
                28,
            ),
            (
                "sl 16",
                1,
                AddressVector { sl: 16, ..av },
                Status::INVALID,
                31,
            ),
        ] {
            let req = CreateAhReq {
                pd_handle: pd,
                port,
                av,
            };
            w.expect(&format!("CREATE_AH, {what}"), status, detail, |v| {
                v.ctrl()
                    .call_typed::<_, AhHandleResp>(Opcode::CREATE_AH, &req, &[])
            });
        }
        w.expect("QUERY_PORT 2", Status::RANGE, 0, |v| v.query_port(2));
        w.expect("QUERY_PORT 0", Status::RANGE, 0, |v| v.query_port(0));
        w.expect("QUERY_GID index 1", Status::RANGE, 4, |v| v.query_gid(1, 1));
        w.expect("QUERY_GID port 2", Status::RANGE, 0, |v| v.query_gid(2, 0));
    });
}

// ===========================================================================
// Framing (spec 7.4).
// ===========================================================================

#[test]
fn unknown_opcode() {
    hostile(|w| {
        for op in [0u32, 0x04, 0x12, 0x54, 0x74, 0x99, 0xffff_ffff] {
            let spec = RequestSpec::new(op, &[], 64);
            w.expect_spec(&format!("opcode {op:#x}"), &spec, Status::UNSUPPORTED, op);
        }
        // With a plausible payload too.
        let payload = CtxHandleReq {
            ctx_handle: w.base().ctx,
        }
        .to_bytes();
        let parts: [&[u8]; 1] = [&payload];
        let spec = RequestSpec::new(0x22u32, &parts, 4);
        w.expect_spec(
            "opcode 0x22 with a payload",
            &spec,
            Status::UNSUPPORTED,
            0x22,
        );
    });
}

#[test]
fn request_shorter_than_header() {
    hostile(|w| {
        let resp = resp_buf(w);
        // 12 readable bytes: a request id and an opcode, no reserved field.
        let (req, _) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        for len in [12u32, 8, 1] {
            let chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 64)]);
            let before = w.a_stats();
            let qpns = w.d.daemon().qpns_in_use();
            let ctrl = w.a.ctrl();
            let t = ctrl.submit_raw_chain(&chain, Some((resp, 64))).unwrap();
            let c = ctrl.wait(t).unwrap();
            assert_eq!(
                (c.status(), c.detail, c.resp_request_id, c.used_len),
                (Some(Status::INVALID), 0, 0, 16),
                "{len}-byte request: {c:?}"
            );
            w.assert_no_effect("short request", before, qpns, 1, 0);
        }
        // No readable descriptor at all.
        let chain = RawDesc::chain(&[Seg::writable(resp, 64)]);
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let ctrl = w.a.ctrl();
        let t = ctrl.submit_raw_chain(&chain, Some((resp, 64))).unwrap();
        let c = ctrl.wait(t).unwrap();
        assert_eq!(
            (c.status(), c.detail, c.resp_request_id, c.used_len),
            (Some(Status::INVALID), 0, 0, 16),
            "request without readable part: {c:?}"
        );
        w.assert_no_effect("no readable part", before, qpns, 1, 0);
    });
}

#[test]
fn reserved_header_field_not_zero() {
    hostile(|w| {
        for reserved in [1, 0x8000_0000, u32::MAX] {
            let spec = RequestSpec {
                reserved,
                ..RequestSpec::new(Opcode::CREATE_CTX, &[], CreateCtxResp::SIZE)
            };
            w.expect_spec(
                &format!("header reserved {reserved:#x}"),
                &spec,
                Status::INVALID,
                12,
            );
        }
    });
}

#[test]
fn reserved_payload_field_not_zero() {
    hostile(|w| {
        let b = w.base();
        let (mut req, tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        req.reserved = 1;
        w.expect("CREATE_QP, reserved = 1", Status::INVALID, 44, |v| {
            v.create_qp_raw(&req, &tail)
        });
        req.reserved = 0x8000_0000;
        w.expect("CREATE_QP, reserved = 2^31", Status::INVALID, 44, |v| {
            v.create_qp_raw(&req, &tail)
        });
    });
}

#[test]
fn payload_too_short() {
    hostile(|w| {
        let b = w.base();
        let pd = PdHandleReq { pd_handle: b.pd }.to_bytes();
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let (cq, _) = cq_req(w, 64);
        let cq = cq.to_bytes();
        let (qp, _) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        let qp = qp.to_bytes();
        let modify = ModifyQpReq::default().to_bytes();
        let cases: [(Opcode, &[u8], usize, u32); 7] = [
            (Opcode::ALLOC_PD, &ctx[..2], 4, 4),
            (Opcode::DEALLOC_PD, &[], 0, 4),
            (Opcode::QUERY_QP, &pd[..3], QueryQpResp::SIZE, 4),
            (Opcode::CREATE_CQ, &cq[..39], 4, 40),
            (Opcode::CREATE_QP, &qp[..56], CreateQpResp::SIZE, 80),
            (Opcode::MODIFY_QP, &modify[..103], 0, 104),
            (Opcode::QUERY_GID, &[1, 0, 0, 0], QueryGidResp::SIZE, 8),
        ];
        for (op, payload, resp, size) in cases {
            let parts: [&[u8]; 1] = [payload];
            let spec = RequestSpec::new(op, &parts, resp);
            w.expect_spec(
                &format!("{} with {} bytes", op.name(), payload.len()),
                &spec,
                Status::INVALID,
                size,
            );
        }
    });
}

#[test]
fn payload_too_long() {
    hostile(|w| {
        let b = w.base();
        let mut ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        ctx.extend_from_slice(&[0; 4]);
        let mut qp = QpHandleReq {
            qp_handle: b.qp.handle,
        }
        .to_bytes();
        qp.push(0);
        let mut modify = ModifyQpReq {
            qp_handle: b.qp.handle,
            attr_mask: 0,
            attr: QpAttr::default(),
        }
        .to_bytes();
        modify.extend_from_slice(&[0; 8]);
        let cases: [(Opcode, &[u8], usize, u32); 5] = [
            (Opcode::QUERY_DEVICE, &[0; 4], DeviceAttr::SIZE, 0),
            (Opcode::CREATE_CTX, &[0; 12], CreateCtxResp::SIZE, 8),
            (Opcode::ALLOC_PD, &ctx, PdHandleResp::SIZE, 4),
            (Opcode::QUERY_QP, &qp, QueryQpResp::SIZE, 4),
            (Opcode::MODIFY_QP, &modify, 0, 104),
        ];
        for (op, payload, resp, size) in cases {
            let parts: [&[u8]; 1] = [payload];
            let spec = RequestSpec::new(op, &parts, resp);
            w.expect_spec(
                &format!("{} with {} bytes", op.name(), payload.len()),
                &spec,
                Status::INVALID,
                size,
            );
        }
    });
}

#[test]
fn response_buffer_too_small() {
    hostile(|w| {
        let b = w.base();
        // Each request is valid; only the writable part is too small. The
        // command must not run: `expect_spec` checks that no object appeared.
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let p = pages(w, 1);
        let mr = mr_req(b.pd, PAGE_SIZE, inline(1)).to_bytes();
        let mr_list = le64s(&p);
        let (qp, qp_tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
        let qp = qp.to_bytes();
        let (cq, cq_tail) = cq_req(w, 64);
        let cq = cq.to_bytes();
        let header = w.a.mem().alloc(64, 64).unwrap().0;
        let new_ctx = CreateCtxReq { db_gpa: header }.to_bytes();
        let cases: [(Opcode, Vec<&[u8]>, usize, usize); 7] = [
            (Opcode::CREATE_CTX, vec![&new_ctx], 16 + 7, 24),
            (Opcode::CREATE_CTX, vec![&new_ctx], 16, 24),
            (Opcode::ALLOC_PD, vec![&ctx], 16 + 3, 20),
            (Opcode::CREATE_CQ, vec![&cq, &cq_tail], 16, 20),
            (Opcode::REG_MR, vec![&mr, &mr_list], 16 + 11, 28),
            (Opcode::CREATE_QP, vec![&qp, &qp_tail], 16 + 23, 40),
            (
                Opcode::QUERY_DEVICE,
                vec![],
                16 + DeviceAttr::SIZE - 1,
                16 + DeviceAttr::SIZE,
            ),
        ];
        for (op, parts, writable, need) in cases {
            let spec = RequestSpec {
                writable_len: Some(writable),
                ..RequestSpec::new(op, &parts, 0)
            };
            w.expect_spec(
                &format!("{} with {writable} writable bytes", op.name()),
                &spec,
                Status::INVALID,
                need as u32,
            );
        }
        // The same REG_MR with the response split over 4-byte descriptors
        // of exactly the right total size succeeds.
        let parts: [&[u8]; 2] = [&mr, &mr_list];
        let spec = RequestSpec {
            writable_split: Some(4),
            ..RequestSpec::new(Opcode::REG_MR, &parts, RegMrResp::SIZE)
        };
        let ctrl = w.a.ctrl();
        let t = ctrl.submit_spec(&spec).unwrap();
        let c = ctrl.wait(t).unwrap().ok().unwrap();
        assert_eq!(c.used_len, 28);
        let r: RegMrResp = c.parse().unwrap();
        w.ok("DEREG_MR", |v| v.dereg_mr(r.mr_handle));
    });
}

// ===========================================================================
// Malformed descriptor chains (spec 7.4: used length 0, not executed).
// ===========================================================================

#[test]
fn readable_descriptor_outside_ram() {
    hostile(|w| {
        let resp = resp_buf(w);
        let hole = w.a.mem().hole_gpa();
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        // The header in the hole.
        let chain = RawDesc::chain(&[
            Seg::readable(GuestAddress(hole), len),
            Seg::writable(resp, 24),
        ]);
        w.expect_malformed("readable descriptor in the hole", &chain, Some((resp, 24)));
        // Header fine, a second readable descriptor past the end of RAM.
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::readable(GuestAddress(region_end(w, 1)), 8),
            Seg::writable(resp, 24),
        ]);
        w.expect_malformed(
            "readable descriptor past the end of RAM",
            &chain,
            Some((resp, 24)),
        );
        // A readable descriptor straddling the end of region 0.
        let edge = GuestAddress(region_end(w, 0) - 8);
        let chain = RawDesc::chain(&[Seg::readable(edge, 16), Seg::writable(resp, 24)]);
        w.expect_malformed(
            "readable descriptor across the region end",
            &chain,
            Some((resp, 24)),
        );
    });
}

#[test]
fn writable_descriptor_outside_ram() {
    hostile(|w| {
        let resp = resp_buf(w);
        let hole = w.a.mem().hole_gpa();
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(GuestAddress(hole), 24),
        ]);
        w.expect_malformed("writable descriptor in the hole", &chain, None);
        // First writable part fine, the second across the region end.
        let edge = GuestAddress(region_end(w, 0) - 8);
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(resp, 16),
            Seg::writable(edge, 16),
        ]);
        w.expect_malformed(
            "writable descriptor across the region end",
            &chain,
            Some((resp, 16)),
        );
    });
}

#[test]
fn readable_after_writable() {
    hostile(|w| {
        let resp = resp_buf(w);
        let b = w.base();
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let (hdr, len) = raw_request(w, Opcode::ALLOC_PD, &[]);
        let payload = w.a.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        w.a.mem().write(payload, &ctx).unwrap();
        let chain = RawDesc::chain(&[
            Seg::readable(hdr, len),
            Seg::writable(resp, 20),
            Seg::readable(payload, 4),
        ]);
        w.expect_malformed(
            "ALLOC_PD payload after the response buffer",
            &chain,
            Some((resp, 20)),
        );
    });
}

#[test]
fn descriptor_loop() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        // The writable descriptor points back at the head.
        let mut chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 24)]);
        chain[1].flags |= F_NEXT;
        chain[1].next = RawNext::ListIndex(0);
        w.expect_malformed("loop back to the head", &chain, Some((resp, 24)));
        // A readable descriptor pointing at itself.
        let chain = [RawDesc {
            addr: req.0,
            len,
            flags: F_NEXT,
            next: RawNext::ListIndex(0),
        }];
        w.expect_malformed("readable self loop", &chain, None);
    });
}

/// Regression: a loop inside the writable part went undetected, because
/// virtio-queue's `DescriptorChain` iterator silently stops after
/// `queue_size` descriptors; the daemon executed the command. Spec 7.4: a
/// chain that loops is returned with used length 0 and not executed.
#[test]
fn descriptor_loop_in_writable_part() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = [
            RawDesc {
                addr: req.0,
                len,
                flags: F_NEXT,
                next: RawNext::Following,
            },
            RawDesc {
                addr: resp.0,
                len: 24,
                flags: F_WRITE | F_NEXT,
                next: RawNext::ListIndex(1),
            },
        ];
        w.expect_malformed("writable self loop", &chain, Some((resp, 24)));
    });
}

#[test]
fn writable_part_shorter_than_header() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 15)]);
        w.expect_malformed("15 writable bytes", &chain, Some((resp, 15)));
        let resp2 = resp_buf(w);
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(resp, 7),
            Seg::writable(resp2, 8),
        ]);
        w.expect_malformed("7 + 8 writable bytes", &chain, Some((resp, 7)));
        let chain = RawDesc::chain(&[Seg::readable(req, len)]);
        w.expect_malformed("no writable part", &chain, None);
    });
}

#[test]
fn readable_part_over_max_request_bytes() {
    hostile(|w| {
        let resp = resp_buf(w);
        let big = MAX_REQUEST_BYTES + 8;
        let (req, _) = raw_request(w, Opcode::REG_MR, &vec![0; big - 16]);
        let chain = RawDesc::chain(&[Seg::readable(req, big as u32), Seg::writable(resp, 28)]);
        w.expect_malformed("1 MiB + 8 readable bytes", &chain, Some((resp, 28)));
    });
}

/// Spec 7.4: an available-ring entry whose head index is at or past the
/// queue size names no chain. The device takes it, executes nothing,
/// returns no used element for it (none could name it) and counts it; the
/// requests around it are served. (The daemon used to try to return it,
/// which failed and logged a warning and an error per entry: a log flood
/// a guest could drive.)
#[test]
fn available_head_past_the_queue() {
    hostile(|w| {
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let size = w.a.ctrl().vring().size();
        let used_before = w.a.ctrl().vring().device_used_idx().unwrap();
        let published_before = w.a.ctrl().vring().avail_idx();
        {
            let v = w.a.ctrl().vring_mut();
            for head in [size, size + 1, u16::MAX] {
                v.push_avail_raw(head).unwrap();
            }
        }
        // A valid request behind them (its kick covers the three).
        let ctx = w.ok("CREATE_CTX behind bad heads", |v| v.create_ctx());
        let after = w.a_stats();
        assert_eq!(after.ctrl.malformed, before.ctrl.malformed + 3, "counted");
        assert_eq!(after.ctrl.ok, before.ctrl.ok + 1, "the valid request ran");
        assert_eq!(after.resources.ctx, before.resources.ctx + 1);
        let ctrl = w.a.ctrl();
        assert_eq!(ctrl.vring().avail_idx(), published_before.wrapping_add(4));
        assert_eq!(
            ctrl.vring().device_used_idx().unwrap(),
            used_before.wrapping_add(1),
            "only the valid request is returned"
        );
        assert!(ctrl.untracked().is_empty(), "{:?}", ctrl.untracked());
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        assert_eq!(w.d.daemon().qpns_in_use(), qpns);
    });
}

/// Spec 7.4: a descriptor of length 0 is not malformed. It carries no
/// bytes, so the device reads and writes nothing through it and looks at
/// neither its address nor its direction. Before, a zero-length readable
/// descriptor outside RAM, or one after the writable part, made the chain
/// malformed, and a zero-length writable one outside RAM had the command
/// executed but reported with used length 0 (its context leaked: the
/// driver was told nothing ran).
#[test]
fn zero_length_descriptors_are_ignored() {
    hostile(|w| {
        let hole = GuestAddress(w.a.mem().hole_gpa());
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let resp_len = 16 + CreateCtxResp::SIZE;
        let empty = |addr: GuestAddress, write: bool| RawDesc {
            addr: addr.0,
            len: 0,
            flags: F_NEXT | if write { F_WRITE } else { 0 },
            next: RawNext::Following,
        };
        let cases: Vec<(&str, Vec<RawDesc>, GuestAddress)> = {
            let r1 = resp_buf(w);
            let r2 = resp_buf(w);
            let r3 = resp_buf(w);
            let mut c1 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r1, resp_len as u32)]);
            c1.insert(1, empty(hole, true));
            let mut c2 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r2, resp_len as u32)]);
            c2.insert(0, empty(hole, false));
            let mut c3 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r3, resp_len as u32)]);
            c3[1].flags |= F_NEXT;
            c3[1].next = RawNext::Following;
            let mut last = empty(hole, false);
            last.flags &= !F_NEXT;
            c3.push(last);
            vec![
                ("empty writable descriptor in the hole", c1, r1),
                ("empty readable descriptor in the hole first", c2, r2),
                ("empty readable descriptor after the writable part", c3, r3),
            ]
        };
        for (what, chain, resp) in cases {
            let before = w.a_stats();
            let ctrl = w.a.ctrl();
            let t = ctrl
                .submit_raw_chain(&chain, Some((resp, resp_len)))
                .unwrap();
            let c = ctrl.wait(t).unwrap();
            assert_eq!(
                (c.status(), c.used_len as usize, c.resp_request_id),
                (Some(Status::OK), resp_len, 0xABCD),
                "{what}: {c:?}"
            );
            let ctx = CreateCtxResp::read(&c.payload).ctx_handle;
            let after = w.a_stats();
            assert_eq!(after.ctrl.malformed, before.ctrl.malformed, "{what}");
            assert_eq!(after.resources.ctx, before.resources.ctx + 1, "{what}");
            w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        }
        // Only empty descriptors: no room for a response, so unanswered.
        let resp = resp_buf(w);
        let mut chain = vec![empty(req, false), empty(resp, true)];
        chain[1].flags &= !F_NEXT;
        w.expect_malformed("only empty descriptors", &chain, Some((resp, 16)));
    });
}

/// The same two rules on the event queue (spec 14.1): heads past the
/// queue are taken and counted, nothing is returned for them, and the
/// event goes into the next buffer; a buffer with an empty readable
/// descriptor (outside RAM, too) is an ordinary 16-byte buffer. Before,
/// that buffer was refused with used length 0.
#[test]
fn event_queue_bad_heads_and_empty_descriptors() {
    use virtio_rdma_abi::event::{Event, EventKind};
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                event_buffers: 0,
                ..opts()
            },
        )
        .unwrap();
    let hole = vm.mem().hole_gpa();
    let buf = vm.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
    vm.mem().fill(buf, 16, POISON).unwrap();
    let ev = vm.events().vring_mut();
    let size = ev.size();
    ev.push_avail_raw(size).unwrap();
    ev.push_avail_raw(u16::MAX).unwrap();
    let head = ev
        .add_raw(&[
            RawDesc {
                addr: hole,
                len: 0,
                flags: F_NEXT,
                next: RawNext::Following,
            },
            RawDesc {
                addr: buf.0,
                len: 16,
                flags: F_WRITE,
                next: RawNext::Following,
            },
        ])
        .unwrap();
    ev.kick().unwrap();
    let used = ev.wait_used(Duration::from_secs(10)).unwrap();
    assert_eq!(used.len(), 1, "only the real buffer comes back: {used:?}");
    assert_eq!((used[0].id, used[0].len), (u32::from(head), 16));
    let raw = vm.mem().read_vec(buf, 16).unwrap();
    let e = Event::read(&raw);
    assert_eq!((e.kind, e.seq), (EventKind::PORT_ACTIVE as u32, 1));
    assert_eq!(d.stats(0).device.ctrl.malformed, 2, "the two bad heads");
    // Still served.
    Verbs::new(&mut vm).query_device().unwrap();
    assert!(d.stats(0).connected);
}

// ===========================================================================
// Handles (spec 9.1).
// ===========================================================================

#[test]
fn stale_handles_after_destroy() {
    hostile(|w| {
        let b = w.base();
        let p = pages(w, 1);
        // A PD, freed, its slot reused.
        let old_pd = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(old_pd));
        let new_pd = w.ok("ALLOC_PD again", |v| v.alloc_pd(b.ctx));
        assert_ne!(new_pd, old_pd, "a handle value was reused at once");
        w.expect("DEALLOC_PD of a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(old_pd)
        });
        let req = mr_req(old_pd, PAGE_SIZE, inline(1));
        w.expect("REG_MR on a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.reg_mr_raw(&req, &le64s(&p))
        });
        w.expect("CREATE_QP on a freed PD", Status::BAD_HANDLE, 0, |v| {
            v.create_qp(&QpInit::rc(old_pd, b.cq))
        });
        // The new PD is intact.
        let mr = w.ok("REG_MR on the new PD", |v| {
            v.reg_mr_raw(&mr_req(new_pd, PAGE_SIZE, inline(1)), &le64s(&p))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        w.expect("DEREG_MR twice", Status::BAD_HANDLE, 0, |v| {
            v.dereg_mr(mr.mr_handle)
        });
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(new_pd));

        // A QP, destroyed, its slot reused.
        let old_qp = fresh_qp(w);
        w.ok("DESTROY_QP", |v| v.destroy_qp(old_qp));
        let new_qp = fresh_qp(w);
        assert_ne!(new_qp, old_qp);
        w.expect("QUERY_QP of a destroyed QP", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(old_qp)
        });
        let (mask, a) = rc_steps(w)[0];
        w.expect("MODIFY_QP of a destroyed QP", Status::BAD_HANDLE, 0, |v| {
            v.modify_qp(old_qp, mask, &a)
        });
        w.expect("DESTROY_QP twice", Status::BAD_HANDLE, 0, |v| {
            v.destroy_qp(old_qp)
        });
        let q = w.ok("QUERY_QP of the new QP", |v| v.query_qp(new_qp));
        assert_eq!(q.attr.qp_state, u32::from(QpState::RESET));
        w.ok("DESTROY_QP", |v| v.destroy_qp(new_qp));

        // A whole context: its objects' handles die with it.
        let ctx = w.ok("CREATE_CTX", |v| v.create_ctx());
        let pd = w.ok("ALLOC_PD", |v| v.alloc_pd(ctx));
        let cq = w.ok("CREATE_CQ", |v| v.create_cq(ctx, 16));
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        w.expect(
            "ALLOC_PD in a destroyed context",
            Status::BAD_HANDLE,
            0,
            |v| v.alloc_pd(ctx),
        );
        w.expect(
            "DEALLOC_PD of a destroyed context's PD",
            Status::BAD_HANDLE,
            0,
            |v| v.dealloc_pd(pd),
        );
        w.expect(
            "DESTROY_CQ of a destroyed context's CQ",
            Status::BAD_HANDLE,
            0,
            |v| v.destroy_cq(cq),
        );
        w.expect("DESTROY_CTX twice", Status::BAD_HANDLE, 0, |v| {
            v.destroy_ctx(ctx)
        });
    });
}

#[test]
fn handle_zero_and_garbage_handles() {
    hostile(|w| {
        let b = w.base();
        let p = pages(w, 1);
        for h in [0, u32::MAX, 0x000f_ffff, 0xfff0_0000] {
            w.expect(
                &format!("ALLOC_PD ctx {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.alloc_pd(h),
            );
            w.expect(&format!("DESTROY_CTX {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_ctx(h)
            });
            w.expect(
                &format!("CREATE_CQ ctx {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_cq(h, 16),
            );
            w.expect(&format!("REG_MR pd {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.reg_mr_raw(&mr_req(h, PAGE_SIZE, inline(1)), &le64s(&p))
            });
            w.expect(
                &format!("CREATE_QP pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_qp(&QpInit::rc(h, b.cq)),
            );
            w.expect(
                &format!("CREATE_QP send_cq {h:#x}"),
                Status::BAD_HANDLE,
                8,
                |v| {
                    v.create_qp(&QpInit {
                        send_cq: h,
                        ..QpInit::rc(b.pd, b.cq)
                    })
                },
            );
            w.expect(
                &format!("CREATE_QP recv_cq {h:#x}"),
                Status::BAD_HANDLE,
                12,
                |v| {
                    v.create_qp(&QpInit {
                        recv_cq: h,
                        ..QpInit::rc(b.pd, b.cq)
                    })
                },
            );
            w.expect(&format!("QUERY_QP {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.query_qp(h)
            });
            w.expect(&format!("DESTROY_QP {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_qp(h)
            });
            w.expect(&format!("DEREG_MR {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.dereg_mr(h)
            });
            w.expect(&format!("DESTROY_CQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_cq(h)
            });
            w.expect(&format!("DEALLOC_PD {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.dealloc_pd(h)
            });
            w.expect(
                &format!("CREATE_AH pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_ah(h, AddressVector::default()),
            );
            w.expect(&format!("DESTROY_AH {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_ah(h)
            });
            w.expect(&format!("QUERY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.query_srq(h)
            });
            w.expect(&format!("MODIFY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.modify_srq(h, 0x2, 0, 0)
            });
            w.expect(&format!("DESTROY_SRQ {h:#x}"), Status::BAD_HANDLE, 0, |v| {
                v.destroy_srq(h)
            });
            w.expect(
                &format!("CREATE_SRQ pd {h:#x}"),
                Status::BAD_HANDLE,
                0,
                |v| v.create_srq(h, 16, 1, 0),
            );
        }
        // A non-zero srq_handle that names nothing.
        w.expect("CREATE_QP srq 0xfff00000", Status::BAD_HANDLE, 16, |v| {
            v.create_qp(&QpInit {
                srq: 0xfff0_0000,
                rq_depth: 0,
                ..QpInit::rc(b.pd, b.cq)
            })
        });
    });
}

#[test]
fn handles_of_another_vm() {
    hostile(|w| {
        let a = w.base();
        // Objects of B in slots A does not use: A holds exactly one object of
        // each kind (its baseline), so these values name nothing in A.
        let bb = w.b_base;
        let (b_ctx, b_pd, b_cq, b_qp, b_mr) = w.b_ok("B's extra objects", |v| {
            let ctx = v.create_ctx()?;
            let pd = v.alloc_pd(ctx)?;
            let cq = v.create_cq(ctx, 16)?;
            let qp = v.create_qp(&QpInit::rc(pd, cq))?;
            let pages = v.mem().alloc_pages(1, PAGE_SIZE)?;
            let mr = v.reg_mr(&MrSpec::new(pd, RW, IOVA, &pages))?;
            Ok((ctx, pd, cq, qp, mr.mr_handle))
        });
        for (kind, theirs, ours) in [
            ("ctx", b_ctx, a.ctx),
            ("pd", b_pd, a.pd),
            ("cq", b_cq, a.cq),
            ("qp", b_qp.handle, a.qp.handle),
            ("mr", b_mr, a.mr),
        ] {
            assert_ne!(
                theirs, ours,
                "B's {kind} handle equals A's: the test cannot tell them apart"
            );
        }
        let b_qp_before = w.b_ok("QUERY_QP", |v| v.query_qp(b_qp.handle));
        w.snapshot_b();
        let p = pages(w, 1);
        let (mask, init) = rc_steps(w)[0];
        w.expect("A: ALLOC_PD in B's context", Status::BAD_HANDLE, 0, |v| {
            v.alloc_pd(b_ctx)
        });
        w.expect(
            "A: DESTROY_CTX of B's context",
            Status::BAD_HANDLE,
            0,
            |v| v.destroy_ctx(b_ctx),
        );
        w.expect("A: DEALLOC_PD of B's PD", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(b_pd)
        });
        w.expect("A: REG_MR on B's PD", Status::BAD_HANDLE, 0, |v| {
            v.reg_mr_raw(&mr_req(b_pd, PAGE_SIZE, inline(1)), &le64s(&p))
        });
        w.expect("A: CREATE_QP with B's CQ", Status::BAD_HANDLE, 8, |v| {
            v.create_qp(&QpInit {
                send_cq: b_cq,
                ..QpInit::rc(a.pd, a.cq)
            })
        });
        w.expect("A: DESTROY_CQ of B's CQ", Status::BAD_HANDLE, 0, |v| {
            v.destroy_cq(b_cq)
        });
        w.expect("A: QUERY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(b_qp.handle)
        });
        w.expect("A: MODIFY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.modify_qp(b_qp.handle, mask, &init)
        });
        w.expect("A: DESTROY_QP of B's QP", Status::BAD_HANDLE, 0, |v| {
            v.destroy_qp(b_qp.handle)
        });
        w.expect("A: DEREG_MR of B's MR", Status::BAD_HANDLE, 0, |v| {
            v.dereg_mr(b_mr)
        });
        // B's objects are untouched and usable.
        let q = w.b_ok("QUERY_QP", |v| v.query_qp(b_qp.handle));
        assert_eq!(q, b_qp_before, "B's QP changed");
        w.b_ok("B uses and destroys its objects", |v| {
            v.modify_qp(b_qp.handle, mask, &init)?;
            v.dereg_mr(b_mr)?;
            v.destroy_qp(b_qp.handle)?;
            v.destroy_cq(b_cq)?;
            v.dealloc_pd(b_pd)?;
            v.destroy_ctx(b_ctx)
        });
        let q = w.b_ok("QUERY_QP of B's baseline QP", |v| v.query_qp(bb.qp.handle));
        assert_eq!(q, bb.qp_attrs);
        w.snapshot_b();
    });
}

#[test]
fn wrong_kind_of_handle() {
    hostile(|w| {
        let b = w.base();
        // A CQ handle and a QP handle whose values name no object of the
        // other kinds in A: three extra CQs (the last in a slot no other
        // table of A uses), and a QP whose slot was recycled once (a
        // generation no CQ of A has).
        let extra_cqs: Vec<u32> = (0..3)
            .map(|_| w.ok("CREATE_CQ", |v| v.create_cq(b.ctx, 16)))
            .collect();
        let cq = extra_cqs[2];
        let first = fresh_qp(w);
        w.ok("DESTROY_QP", |v| v.destroy_qp(first));
        let qp = fresh_qp(w);
        let c = w.a_counts();
        assert_eq!(
            (c.ctx, c.pd, c.cq, c.qp, c.mr, c.srq, c.ah),
            (1, 1, 4, 2, 1, 0, 0)
        );
        let live_cqs = [b.cq, extra_cqs[0], extra_cqs[1], cq];
        assert!(
            ![b.ctx, b.pd, b.qp.handle, qp, b.mr].contains(&cq)
                && !live_cqs.contains(&qp)
                && qp != b.pd
                && qp != b.mr,
            "handle values collide: the test cannot tell kinds apart"
        );
        let p = pages(w, 1);
        w.expect("DEALLOC_PD of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.dealloc_pd(cq)
        });
        w.expect(
            "REG_MR with a CQ handle as PD",
            Status::BAD_HANDLE,
            0,
            |v| v.reg_mr_raw(&mr_req(cq, PAGE_SIZE, inline(1)), &le64s(&p)),
        );
        w.expect(
            "ALLOC_PD with a CQ handle as context",
            Status::BAD_HANDLE,
            0,
            |v| v.alloc_pd(cq),
        );
        w.expect(
            "CREATE_QP with a QP handle as send CQ",
            Status::BAD_HANDLE,
            8,
            |v| {
                v.create_qp(&QpInit {
                    send_cq: qp,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect("DESTROY_CQ of a QP handle", Status::BAD_HANDLE, 0, |v| {
            v.destroy_cq(qp)
        });
        w.expect("QUERY_SRQ of a QP handle", Status::BAD_HANDLE, 0, |v| {
            v.query_srq(qp)
        });
        w.expect("DESTROY_AH of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.destroy_ah(cq)
        });
        w.expect("QUERY_QP of a CQ handle", Status::BAD_HANDLE, 0, |v| {
            v.query_qp(cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
        for h in extra_cqs {
            w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
        }
    });
}

// ===========================================================================
// Ownership (spec 9.3, MISMATCH) and dependencies (spec 9.4, BUSY).
// ===========================================================================

#[test]
fn qp_with_cq_of_another_context() {
    hostile(|w| {
        let b = w.base();
        let ctx2 = w.ok("CREATE_CTX", |v| v.create_ctx());
        let cq2 = w.ok("CREATE_CQ in ctx2", |v| v.create_cq(ctx2, 16));
        w.expect(
            "CREATE_QP, send CQ of another context",
            Status::MISMATCH,
            8,
            |v| {
                v.create_qp(&QpInit {
                    send_cq: cq2,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect(
            "CREATE_QP, recv CQ of another context",
            Status::MISMATCH,
            12,
            |v| {
                v.create_qp(&QpInit {
                    recv_cq: cq2,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        w.expect(
            "CREATE_QP, both CQs of another context",
            Status::MISMATCH,
            8,
            |v| v.create_qp(&QpInit::rc(b.pd, cq2)),
        );
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx2));
    });
}

#[test]
fn qp_with_srq_of_another_pd() {
    hostile(|w| {
        let b = w.base();
        let pd2 = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        let srq2 = w
            .ok("CREATE_SRQ on pd2", |v| v.create_srq(pd2, 16, 1, 0))
            .srq_handle;
        let srq_qp = |srq| QpInit {
            srq,
            rq_depth: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        w.expect("CREATE_QP, SRQ of another PD", Status::MISMATCH, 16, |v| {
            v.create_qp(&srq_qp(srq2))
        });
        // An SRQ of another context.
        let ctx3 = w.ok("CREATE_CTX", |v| v.create_ctx());
        let pd3 = w.ok("ALLOC_PD", |v| v.alloc_pd(ctx3));
        let srq3 = w
            .ok("CREATE_SRQ on pd3", |v| v.create_srq(pd3, 16, 1, 0))
            .srq_handle;
        w.expect(
            "CREATE_QP, SRQ of another context",
            Status::MISMATCH,
            16,
            |v| v.create_qp(&srq_qp(srq3)),
        );
        // On its own PD the SRQ works.
        let qp = w.ok("CREATE_QP with the SRQ of its PD", |v| {
            v.create_qp(&QpInit {
                pd: pd2,
                ..srq_qp(srq2)
            })
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(qp.handle)?;
            v.destroy_srq(srq2)?;
            v.dealloc_pd(pd2)?;
            v.destroy_ctx(ctx3)
        });
    });
}

#[test]
fn busy_dealloc_pd_with_dependents() {
    hostile(|w| {
        let b = w.base();
        let pd = w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx));
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        let mr = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(pd, LW, IOVA, &p)));
        w.expect("DEALLOC_PD with an MR", Status::BUSY, 1, |v| {
            v.dealloc_pd(pd)
        });
        let av = AddressVector {
            dgid: gid(0),
            ..AddressVector::default()
        };
        let ah = w.ok("CREATE_AH", |v| v.create_ah(pd, av));
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 0))
            .srq_handle;
        let qp = w.ok("CREATE_QP", |v| v.create_qp(&QpInit::rc(pd, b.cq)));
        w.expect("DEALLOC_PD with MR, AH, SRQ, QP", Status::BUSY, 4, |v| {
            v.dealloc_pd(pd)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        w.ok("DESTROY_AH", |v| v.destroy_ah(ah));
        w.expect("DEALLOC_PD with SRQ, QP", Status::BUSY, 2, |v| {
            v.dealloc_pd(pd)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp.handle));
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq));
        w.ok("DEALLOC_PD once free", |v| v.dealloc_pd(pd));
    });
}

#[test]
fn busy_destroy_cq_used_by_qp() {
    hostile(|w| {
        let b = w.base();
        let cq = w.ok("CREATE_CQ", |v| v.create_cq(b.ctx, 16));
        let q1 = w.ok("CREATE_QP on cq (send and recv)", |v| {
            v.create_qp(&QpInit::rc(b.pd, cq))
        });
        w.expect("DESTROY_CQ used twice by one QP", Status::BUSY, 2, |v| {
            v.destroy_cq(cq)
        });
        let q2 = w.ok("CREATE_QP on cq (send only)", |v| {
            v.create_qp(&QpInit {
                recv_cq: b.cq,
                ..QpInit::rc(b.pd, cq)
            })
        });
        w.expect("DESTROY_CQ used three times", Status::BUSY, 3, |v| {
            v.destroy_cq(cq)
        });
        w.expect("DESTROY_CQ of the baseline CQ", Status::BUSY, 3, |v| {
            v.destroy_cq(b.cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q1.handle));
        w.expect("DESTROY_CQ used once", Status::BUSY, 1, |v| {
            v.destroy_cq(cq)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q2.handle));
        w.ok("DESTROY_CQ once free", |v| v.destroy_cq(cq));
    });
}

#[test]
fn busy_destroy_srq_with_qp() {
    hostile(|w| {
        let b = w.base();
        let srq = w
            .ok("CREATE_SRQ", |v| v.create_srq(b.pd, 16, 1, 0))
            .srq_handle;
        let init = QpInit {
            srq,
            rq_depth: 0,
            ..QpInit::rc(b.pd, b.cq)
        };
        let q1 = w.ok("CREATE_QP on the SRQ", |v| v.create_qp(&init));
        w.expect("DESTROY_SRQ with one QP", Status::BUSY, 1, |v| {
            v.destroy_srq(srq)
        });
        let q2 = w.ok("CREATE_QP on the SRQ", |v| v.create_qp(&init));
        w.expect("DESTROY_SRQ with two QPs", Status::BUSY, 2, |v| {
            v.destroy_srq(srq)
        });
        let q = w.ok("QUERY_QP", |v| v.query_qp(q1.handle));
        assert_eq!(q.srq_handle, srq);
        w.ok("cleanup", |v| {
            v.destroy_qp(q1.handle)?;
            v.destroy_qp(q2.handle)?;
            v.destroy_srq(srq)
        });
    });
}

// ===========================================================================
// Quotas and limits (spec 9.5): a daemon with small limits.
// ===========================================================================

fn small_limits() -> Limits {
    Limits {
        max_ctx: 3,
        max_pd: 3,
        max_cq: 4,
        max_qp: 3,
        max_mr: 3,
        max_mr_bytes: 64 * 1024,
        // max_mr_pages = 1 MiB / 4 KiB + 1 = 257.
        max_mr_size: MIB,
        page_size_cap: (1 << 12) | (1 << 21),
        max_cqe: 65_536,
        max_inline_pages: 512,
        ..Limits::default()
    }
}

fn small_world() -> World {
    World::build(small_limits(), opts())
}

#[test]
fn quota_contexts_and_pds() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // A has 1 context and 1 PD; the quotas are 3 each.
        let ctxs: Vec<u32> = (0..2)
            .map(|_| w.ok("CREATE_CTX", |v| v.create_ctx()))
            .collect();
        w.expect("4th CREATE_CTX", Status::QUOTA, 1, |v| v.create_ctx());
        let pds: Vec<u32> = (0..2)
            .map(|_| w.ok("ALLOC_PD", |v| v.alloc_pd(b.ctx)))
            .collect();
        w.expect("4th ALLOC_PD", Status::QUOTA, 2, |v| v.alloc_pd(ctxs[0]));
        // B's quota is its own: it can still allocate.
        let b_ctx = w.b_base.ctx;
        w.b_ok("B: ALLOC_PD while A is at its quota", |v| {
            let pd = v.alloc_pd(b_ctx)?;
            v.dealloc_pd(pd)
        });
        // Freeing one gives the quota back.
        w.ok("DEALLOC_PD", |v| v.dealloc_pd(pds[0]));
        let pd = w.ok("ALLOC_PD after a free", |v| v.alloc_pd(b.ctx));
        w.expect("ALLOC_PD at the quota again", Status::QUOTA, 2, |v| {
            v.alloc_pd(b.ctx)
        });
        w.ok("cleanup", |v| {
            v.dealloc_pd(pd)?;
            v.dealloc_pd(pds[1])?;
            v.destroy_ctx(ctxs[0])?;
            v.destroy_ctx(ctxs[1])
        });
    });
}

#[test]
fn quota_qps() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        let qpns = w.d.daemon().qpns_in_use();
        let q1 = fresh_qp(w);
        let q2 = fresh_qp(w);
        assert_eq!(w.d.daemon().qpns_in_use(), qpns + 2);
        // `expect` also checks that the refused create consumed no QPN.
        w.expect("4th CREATE_QP", Status::QUOTA, 4, |v| {
            v.create_qp(&QpInit::rc(b.pd, b.cq))
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(q1));
        let q3 = fresh_qp(w);
        w.expect("CREATE_QP at the quota again", Status::QUOTA, 4, |v| {
            v.create_qp(&QpInit::rc(b.pd, b.cq))
        });
        w.ok("cleanup", |v| {
            v.destroy_qp(q2)?;
            v.destroy_qp(q3)
        });
        assert_eq!(w.d.daemon().qpns_in_use(), qpns);
    });
}

#[test]
fn quota_mrs() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        let m1 = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p)));
        let m2 = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p)));
        w.expect("4th REG_MR", Status::QUOTA, 5, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(m1.mr_handle));
        let m3 = w.ok("REG_MR after a free", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.ok("cleanup", |v| {
            v.dereg_mr(m2.mr_handle)?;
            v.dereg_mr(m3.mr_handle)
        });
    });
}

#[test]
fn quota_registered_bytes() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // A holds 4 KiB (baseline), B holds 4 KiB of its own; max_mr_bytes
        // is 64 KiB per VM.
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
        let p = w.a.mem().alloc_pages(14, PAGE_SIZE).unwrap();
        let big = w.ok("REG_MR 56 KiB", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p))
        });
        w.expect("REG_MR 8 KiB over max_mr_bytes", Status::QUOTA, 8, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        // Exactly up to the quota is fine (B's bytes do not count for A).
        let last = w.ok("REG_MR up to max_mr_bytes", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..1]))
        });
        assert_eq!(w.a_counts().registered_bytes, 64 * 1024);
        w.ok("DEREG_MR", |v| v.dereg_mr(last.mr_handle));
        w.expect("REG_MR 8 KiB, still over", Status::QUOTA, 8, |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        // Deregistering gives the bytes back.
        w.ok("DEREG_MR 56 KiB", |v| v.dereg_mr(big.mr_handle));
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
        let m = w.ok("REG_MR 8 KiB after the free", |v| {
            v.reg_mr(&MrSpec::new(b.pd, LW, IOVA, &p[..2]))
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(m.mr_handle));
    });
}

#[test]
fn limits_npages_and_page_size_cap() {
    hostile_in(small_world(), |w| {
        let b = w.base();
        // max_mr_pages is 257: a CQ of depth 65536 needs 512 pages.
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.max_mr_pages, 257);
        let ring = w.a.mem().alloc(2 * MIB, PAGE_SIZE).unwrap();
        let db = w.a.mem().alloc(64, 64).unwrap();
        let cq = CreateCqReq {
            ctx_handle: b.ctx,
            depth: 65_536,
            db_gpa: db.0,
            buf: desc(PageListMode::CONTIGUOUS, ring.0, 512, 12),
        };
        w.expect(
            "CREATE_CQ, 512 pages > max_mr_pages",
            Status::RANGE,
            CQ_BUF + NPAGES,
            |v| v.create_cq_raw(&cq, &[]),
        );
        // In 2 MiB pages (allowed by page_size_cap) it is one page.
        let big = w.a.mem().alloc(2 * MIB, 2 * MIB).unwrap();
        let cq = CreateCqReq {
            buf: desc(PageListMode::CONTIGUOUS, big.0, 1, 21),
            ..cq
        };
        let h = w.ok("CREATE_CQ in one 2 MiB page", |v| v.create_cq_raw(&cq, &[]));
        w.ok("DESTROY_CQ", |v| v.destroy_cq(h));
        // 8 KiB pages are in range but not in page_size_cap.
        let p = pages(w, 1);
        let mut req = mr_req(b.pd, PAGE_SIZE, inline(1));
        req.buf.page_shift = 13;
        w.expect(
            "REG_MR, 8 KiB pages not in page_size_cap",
            Status::INVALID,
            MR_BUF + SHIFT,
            |v| v.reg_mr_raw(&req, &le64s(&p)),
        );
        // MR length above the small max_mr_size.
        let list = le64s(&vec![p[0]; 257]);
        let req = mr_req(b.pd, MIB + PAGE_SIZE, inline(257));
        w.expect(
            "REG_MR, length max_mr_size + 4096",
            Status::RANGE,
            16,
            |v| v.reg_mr_raw(&req, &list),
        );
    });
}

/// Spec 10.3: rule 9 (`npages` is the count the buffer needs, INVALID)
/// comes before rule 4 (`npages` <= `max_mr_pages`, RANGE), so RANGE on
/// `npages` means "this buffer needs more pages than one list may have".
/// For a memory region that can only happen if `max_mr_pages` is too small
/// for a region of `max_mr_size` bytes: the device advertises enough for
/// one at any `first_page_offset`, so REG_MR never reports it, and a
/// count the length does not call for is INVALID.
///
/// Regression: `max_mr_pages` was `max_mr_size / 4096 + 1`, one page
/// short when `max_mr_size` is not a multiple of 4096; a region of the
/// largest size starting late in its first page got RANGE on `npages`
/// although its length was allowed.
#[test]
fn max_mr_pages_covers_the_largest_region_at_any_offset() {
    let limits = Limits {
        max_mr_size: MIB + 4095,
        ..Limits::default()
    };
    hostile_in(World::build(limits, opts()), |w| {
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.max_mr_size, MIB + 4095);
        // ceil((4095 + max_mr_size) / 4096)
        assert_eq!(dev.max_mr_pages, 258);
        let pd = w.base().pd;
        let p = pages(w, 1);
        let list = le64s(&vec![p[0]; 258]);
        let mut req = mr_req(pd, MIB + 4095, inline(258));
        req.buf.first_page_offset = 4095;
        let mr = w.ok("REG_MR of max_mr_size at offset 4095", |v| {
            v.reg_mr_raw(&req, &list)
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        // More pages than max_mr_pages that the length does not need:
        // rule 9 fires first.
        let list = le64s(&vec![p[0]; 300]);
        let req = mr_req(pd, PAGE_SIZE, inline(300));
        w.expect(
            "REG_MR, 300 pages for one page of data",
            Status::INVALID,
            MR_BUF + NPAGES,
            |v| v.reg_mr_raw(&req, &list),
        );
    });
}

// ===========================================================================
// Access flags (spec 10.5).
// ===========================================================================

#[test]
fn mr_access_flag_violations() {
    hostile(|w| {
        let pd = w.base().pd;
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        for (what, flags) in [
            ("REMOTE_WRITE without LOCAL_WRITE", access::REMOTE_WRITE),
            (
                "REMOTE_WRITE | REMOTE_READ without LOCAL_WRITE",
                access::REMOTE_WRITE | access::REMOTE_READ,
            ),
            ("REMOTE_ATOMIC without LOCAL_WRITE", access::REMOTE_ATOMIC),
            ("unknown bit 0x10", access::LOCAL_WRITE | 0x10),
            ("unknown bit 31", 1 << 31),
            ("every bit", u32::MAX),
        ] {
            w.expect(&format!("REG_MR, {what}"), Status::INVALID, 4, |v| {
                v.reg_mr(&MrSpec::new(pd, flags, IOVA, &p))
            });
        }
        // REMOTE_READ alone and REMOTE_ATOMIC with LOCAL_WRITE are fine.
        for flags in [
            access::REMOTE_READ,
            access::LOCAL_WRITE | access::REMOTE_ATOMIC,
        ] {
            let mr = w.ok("REG_MR", |v| v.reg_mr(&MrSpec::new(pd, flags, IOVA, &p)));
            assert_ne!(mr.rkey, 0);
            w.ok("DEREG_MR", |v| v.dereg_mr(mr.mr_handle));
        }
    });
}

#[test]
fn qp_access_flag_violations() {
    hostile(|w| {
        let qp = fresh_qp(w);
        let (mask, init) = rc_steps(w)[0];
        // LOCAL_WRITE is allowed on a QP (spec 10.5); unknown bits are not.
        for (what, flags) in [
            ("unknown bit 0x10", access::REMOTE_READ | 0x10),
            ("LOCAL_WRITE | unknown bit 0x10", access::LOCAL_WRITE | 0x10),
            ("every bit", u32::MAX),
        ] {
            expect_modify(
                w,
                &format!("RESET -> INIT, access {what}"),
                qp,
                mask,
                QpAttr {
                    access: flags,
                    ..init
                },
                Status::INVALID,
                M_ACCESS,
            );
        }
    });
}

// ===========================================================================
// QP state machine (spec 13).
// ===========================================================================

#[test]
fn qp_transition_not_allowed() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(w, "RESET -> RTR", qp, m_rtr, rtr, Status::BAD_STATE, 0);
        expect_modify(w, "RESET -> RTS", qp, m_rts, rts, Status::BAD_STATE, 0);
        let sqd = QpAttr {
            qp_state: QpState::SQD.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RESET -> SQD",
            qp,
            attr::STATE,
            sqd,
            Status::BAD_STATE,
            0,
        );
        let sqe = QpAttr {
            qp_state: QpState::SQE.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RESET -> SQE",
            qp,
            attr::STATE,
            sqe,
            Status::BAD_STATE,
            0,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        expect_modify(w, "INIT -> RTS", qp, m_rts, rts, Status::BAD_STATE, 1);
        expect_modify(w, "INIT -> SQE", qp, attr::STATE, sqe, Status::BAD_STATE, 1);
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTR",
            qp,
            m_rtr & !attr::AV,
            QpAttr { ..rtr },
            Status::BAD_STATE,
            2,
        );
        expect_modify(w, "RTR -> INIT", qp, m_init, init, Status::BAD_STATE, 2);
        w.ok("RTR -> RTS", |v| v.modify_qp(qp, m_rts, &rts));
        expect_modify(w, "RTS -> RTR", qp, m_rtr, rtr, Status::BAD_STATE, 3);
        expect_modify(
            w,
            "RC RTS -> SQE",
            qp,
            attr::STATE,
            sqe,
            Status::BAD_STATE,
            3,
        );
        let err = QpAttr {
            qp_state: QpState::ERR.into(),
            ..QpAttr::default()
        };
        w.ok("RTS -> ERR", |v| v.modify_qp(qp, attr::STATE, &err));
        expect_modify(w, "ERR -> INIT", qp, m_init, init, Status::BAD_STATE, 6);
        expect_modify(w, "ERR -> RTS", qp, m_rts, rts, Status::BAD_STATE, 6);
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_missing_required_attribute() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(
            w,
            "RESET -> INIT without PORT",
            qp,
            m_init & !attr::PORT,
            init,
            Status::INVALID,
            attr::PORT,
        );
        expect_modify(
            w,
            "RESET -> INIT without PKEY_INDEX and ACCESS",
            qp,
            attr::STATE | attr::PORT,
            init,
            Status::INVALID,
            attr::PKEY_INDEX | attr::ACCESS,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        expect_modify(
            w,
            "INIT -> RTR without DEST_QPN and RQ_PSN",
            qp,
            m_rtr & !(attr::DEST_QPN | attr::RQ_PSN),
            rtr,
            Status::INVALID,
            attr::DEST_QPN | attr::RQ_PSN,
        );
        expect_modify(
            w,
            "INIT -> RTR with only STATE",
            qp,
            attr::STATE,
            rtr,
            Status::INVALID,
            m_rtr & !attr::STATE,
        );
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTS without SQ_PSN",
            qp,
            m_rts & !attr::SQ_PSN,
            rts,
            Status::INVALID,
            attr::SQ_PSN,
        );
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_extra_attribute() {
    hostile(|w| {
        let [(m_init, init), (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let qp = fresh_qp(w);
        expect_modify(
            w,
            "RC RESET -> INIT with QKEY",
            qp,
            m_init | attr::QKEY,
            init,
            Status::INVALID,
            attr::QKEY,
        );
        expect_modify(
            w,
            "RESET -> INIT with CUR_STATE",
            qp,
            m_init | attr::CUR_STATE,
            init,
            Status::INVALID,
            attr::CUR_STATE,
        );
        expect_modify(
            w,
            "RESET -> INIT without PORT but with DEST_QPN",
            qp,
            (m_init & !attr::PORT) | attr::DEST_QPN,
            init,
            Status::INVALID,
            attr::PORT | attr::DEST_QPN,
        );
        w.ok("RESET -> INIT", |v| v.modify_qp(qp, m_init, &init));
        w.ok("INIT -> RTR", |v| v.modify_qp(qp, m_rtr, &rtr));
        expect_modify(
            w,
            "RTR -> RTS with DEST_QPN",
            qp,
            m_rts | attr::DEST_QPN,
            rts,
            Status::INVALID,
            attr::DEST_QPN,
        );
        expect_modify(
            w,
            "RTR -> RTS with AV and PATH_MTU",
            qp,
            m_rts | attr::AV | attr::PATH_MTU,
            rts,
            Status::INVALID,
            attr::AV | attr::PATH_MTU,
        );
        // Undefined mask bits.
        expect_modify(
            w,
            "mask bit 18",
            qp,
            m_rts | (1 << 18),
            rts,
            Status::INVALID,
            1 << 18,
        );
        expect_modify(
            w,
            "mask bits 18 and 31",
            qp,
            attr::STATE | (1 << 31) | (1 << 18),
            rts,
            Status::INVALID,
            (1 << 31) | (1 << 18),
        );
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_cur_state_mismatch() {
    hostile(|w| {
        let (m_rts, rts) = rc_steps(w)[2];
        let qp = qp_in(w, 2); // RTR
                              // RTR -> RTS claiming INIT.
        let claim = QpAttr {
            cur_qp_state: QpState::INIT.into(),
            ..rts
        };
        expect_modify(
            w,
            "RTR -> RTS claiming INIT",
            qp,
            m_rts | attr::CUR_STATE,
            claim,
            Status::BAD_STATE,
            2,
        );
        // -> ERR claiming RTS.
        let err = QpAttr {
            qp_state: QpState::ERR.into(),
            cur_qp_state: QpState::RTS.into(),
            ..QpAttr::default()
        };
        expect_modify(
            w,
            "RTR -> ERR claiming RTS",
            qp,
            attr::STATE | attr::CUR_STATE,
            err,
            Status::BAD_STATE,
            2,
        );
        // Values that are no QpState at all.
        let bad_cur = QpAttr {
            cur_qp_state: 7,
            ..rts
        };
        expect_modify(
            w,
            "cur_qp_state 7",
            qp,
            m_rts | attr::CUR_STATE,
            bad_cur,
            Status::INVALID,
            12,
        );
        let bad_target = QpAttr { qp_state: 9, ..rts };
        expect_modify(w, "qp_state 9", qp, m_rts, bad_target, Status::INVALID, 8);
        let bad_target = QpAttr {
            qp_state: u32::MAX,
            ..rts
        };
        expect_modify(
            w,
            "qp_state 2^32-1",
            qp,
            attr::STATE,
            bad_target,
            Status::INVALID,
            8,
        );
        // The right claim works.
        let claim = QpAttr {
            cur_qp_state: QpState::RTR.into(),
            ..rts
        };
        w.ok("RTR -> RTS claiming RTR", |v| {
            v.modify_qp(qp, m_rts | attr::CUR_STATE, &claim)
        });
        w.ok("DESTROY_QP", |v| v.destroy_qp(qp));
    });
}

#[test]
fn qp_path_mtu_9() {
    hostile(|w| {
        let (m_rtr, rtr) = rc_steps(w)[1];
        let qp = qp_in(w, 1); // INIT
        for mtu in [9, 0, 6] {
            expect_modify(
                w,
                &format!("INIT -> RTR, path_mtu {mtu}"),
                qp,
                m_rtr,
                QpAttr {
                    path_mtu: mtu,
                    ..rtr
                },
                Status::INVALID,
                M_PATH_MTU,
            );
        }
    });
}

#[test]
fn qp_timeout_32() {
    hostile(|w| {
        let (m_rts, rts) = rc_steps(w)[2];
        let qp = qp_in(w, 2); // RTR
        for timeout in [32, u32::MAX] {
            expect_modify(
                w,
                &format!("RTR -> RTS, timeout {timeout}"),
                qp,
                m_rts,
                QpAttr { timeout, ..rts },
                Status::INVALID,
                M_TIMEOUT,
            );
        }
    });
}

#[test]
fn qp_dest_qpn_over_24_bits() {
    hostile(|w| {
        let (m_rtr, rtr) = rc_steps(w)[1];
        let qp = qp_in(w, 1); // INIT
        for dest_qpn in [1 << 24, u32::MAX] {
            expect_modify(
                w,
                &format!("INIT -> RTR, dest_qpn {dest_qpn:#x}"),
                qp,
                m_rtr,
                QpAttr { dest_qpn, ..rtr },
                Status::INVALID,
                M_DEST_QPN,
            );
        }
    });
}

#[test]
fn qp_pkey_index_1() {
    hostile(|w| {
        let (m_init, init) = rc_steps(w)[0];
        let qp = fresh_qp(w);
        for pkey_index in [1, u32::MAX] {
            expect_modify(
                w,
                &format!("RESET -> INIT, pkey_index {pkey_index}"),
                qp,
                m_init,
                QpAttr { pkey_index, ..init },
                Status::RANGE,
                M_PKEY_INDEX,
            );
        }
        expect_modify(
            w,
            "RESET -> INIT, port 2",
            qp,
            m_init,
            QpAttr { port: 2, ..init },
            Status::RANGE,
            M_PORT,
        );
        expect_modify(
            w,
            "RESET -> INIT, port 0",
            qp,
            m_init,
            QpAttr { port: 0, ..init },
            Status::RANGE,
            M_PORT,
        );
    });
}

#[test]
fn qp_other_attribute_values() {
    hostile(|w| {
        let [_, (m_rtr, rtr), (m_rts, rts)] = rc_steps(w);
        let (init_rd, dest_rd) = (w.dev.max_qp_init_rd_atom, w.dev.max_qp_rd_atom);
        let edit = |base: QpAttr, f: &dyn Fn(&mut QpAttr)| {
            let mut a = base;
            f(&mut a);
            a
        };
        let in_init = qp_in(w, 1);
        let cases: [(&str, QpAttr, Status, u32); 6] = [
            (
                "min_rnr_timer 32",
                edit(rtr, &|a| a.min_rnr_timer = 32),
                Status::INVALID,
                M_MIN_RNR_TIMER,
            ),
            (
                "rq_psn 2^24",
                edit(rtr, &|a| a.rq_psn = 1 << 24),
                Status::INVALID,
                M_RQ_PSN,
            ),
            (
                "max_dest_rd_atomic max + 1",
                edit(rtr, &|a| a.max_dest_rd_atomic = dest_rd + 1),
                Status::RANGE,
                M_MAX_DEST_RD_ATOMIC,
            ),
            (
                "av.flow_label 2^20",
                edit(rtr, &|a| a.av.flow_label = 1 << 20),
                Status::INVALID,
                M_AV_FLOW_LABEL,
            ),
            (
                "av.sgid_index 1",
                edit(rtr, &|a| a.av.sgid_index = 1),
                Status::RANGE,
                M_AV_SGID_INDEX,
            ),
            (
                "av.sl 16",
                edit(rtr, &|a| a.av.sl = 16),
                Status::INVALID,
                M_AV_SL,
            ),
        ];
        for (what, a, status, detail) in cases {
            let what = format!("INIT -> RTR, {what}");
            expect_modify(w, &what, in_init, m_rtr, a, status, detail);
        }
        let in_rtr = qp_in(w, 2);
        let cases: [(&str, QpAttr, Status, u32); 4] = [
            (
                "retry_cnt 8",
                edit(rts, &|a| a.retry_cnt = 8),
                Status::INVALID,
                M_RETRY_CNT,
            ),
            (
                "rnr_retry 8",
                edit(rts, &|a| a.rnr_retry = 8),
                Status::INVALID,
                M_RNR_RETRY,
            ),
            (
                "sq_psn 2^24",
                edit(rts, &|a| a.sq_psn = 1 << 24),
                Status::INVALID,
                M_SQ_PSN,
            ),
            (
                "max_rd_atomic max + 1",
                edit(rts, &|a| a.max_rd_atomic = init_rd + 1),
                Status::RANGE,
                M_MAX_RD_ATOMIC,
            ),
        ];
        for (what, a, status, detail) in cases {
            let what = format!("RTR -> RTS, {what}");
            expect_modify(w, &what, in_rtr, m_rts, a, status, detail);
        }
        w.ok("RTR -> RTS", |v| v.modify_qp(in_rtr, m_rts, &rts));
        let sqd = QpAttr {
            qp_state: QpState::SQD.into(),
            en_sqd_async_notify: 2,
            ..QpAttr::default()
        };
        let mask = attr::STATE | attr::EN_SQD_ASYNC_NOTIFY;
        expect_modify(
            w,
            "RTS -> SQD, en_sqd_async_notify 2",
            in_rtr,
            mask,
            sqd,
            Status::INVALID,
            M_EN_SQD,
        );
    });
}

// ===========================================================================
// Features that were not negotiated (spec 4, 7.6).
// ===========================================================================

#[test]
fn features_not_negotiated() {
    let w = World::build(
        Limits::default(),
        VmmOptions {
            driver_features: 0,
            ..opts()
        },
    );
    hostile_in(w, |w| {
        let b = w.base();
        // Opcodes that need a feature: UNSUPPORTED, detail = the opcode,
        // before any look at the payload (here: an empty one).
        for op in [
            Opcode::CREATE_AH,
            Opcode::DESTROY_AH,
            Opcode::CREATE_SRQ,
            Opcode::MODIFY_SRQ,
            Opcode::QUERY_SRQ,
            Opcode::DESTROY_SRQ,
        ] {
            let spec = RequestSpec::new(op, &[], 64);
            w.expect_spec(
                &format!("{} without its feature", op.name()),
                &spec,
                Status::UNSUPPORTED,
                op.into(),
            );
        }
        // Values that need a feature: UNSUPPORTED, detail = the field offset.
        w.expect("UD QP without F_UD", Status::UNSUPPORTED, 4, |v| {
            v.create_qp(&QpInit::ud(b.pd, b.cq))
        });
        w.expect(
            "QP with an SRQ without F_SRQ",
            Status::UNSUPPORTED,
            16,
            |v| {
                v.create_qp(&QpInit {
                    srq: 0x0010_0000,
                    rq_depth: 0,
                    ..QpInit::rc(b.pd, b.cq)
                })
            },
        );
        let p = w.a.mem().alloc_pages(1, PAGE_SIZE).unwrap();
        w.expect(
            "REG_MR REMOTE_ATOMIC without F_ATOMIC",
            Status::UNSUPPORTED,
            4,
            |v| {
                v.reg_mr(&MrSpec::new(
                    b.pd,
                    access::LOCAL_WRITE | access::REMOTE_ATOMIC,
                    IOVA,
                    &p,
                ))
            },
        );
        let qp = fresh_qp(w);
        let (m_init, init) = rc_steps(w)[0];
        expect_modify(
            w,
            "QP access REMOTE_ATOMIC without F_ATOMIC",
            qp,
            m_init,
            QpAttr {
                access: access::REMOTE_ATOMIC,
                ..init
            },
            Status::UNSUPPORTED,
            M_ACCESS,
        );
        let dev = w.ok("QUERY_DEVICE", |v| v.query_device());
        assert_eq!(dev.atomic_caps, 0);
    });
}

// ===========================================================================
// Many requests in flight, garbage among them.
// ===========================================================================

#[derive(Debug)]
enum Want {
    /// A valid command of this kind ("pd", "cq" or "query").
    Ok(&'static str),
    Fails(Status, u32),
    Malformed,
}

#[test]
fn garbage_mixed_with_valid_requests_in_flight() {
    hostile(|w| {
        let b = w.base();
        let ctx = w.ok("CREATE_CTX", |v| v.create_ctx());
        let before = w.a_stats();
        let hole = w.a.mem().hole_gpa();
        let ctx_req = CtxHandleReq { ctx_handle: ctx }.to_bytes();
        let bad_ctx = CtxHandleReq {
            ctx_handle: 0xfff0_0007,
        }
        .to_bytes();
        let qp_req = QpHandleReq {
            qp_handle: b.qp.handle,
        }
        .to_bytes();
        // Prepare CQ rings and raw chains before submitting anything.
        let mut cq_reqs = Vec::new();
        for _ in 0..12 {
            let v = w.va();
            let ring = v.alloc_ring(64 * 32).unwrap();
            let list = v.page_list(&ring.pages, 12, PageListMode::INLINE).unwrap();
            let req = CreateCqReq {
                ctx_handle: ctx,
                depth: 64,
                db_gpa: ring.db.0,
                buf: list.desc,
            };
            cq_reqs.push((req.to_bytes(), list.tail));
        }
        let (raw_req, raw_len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));

        let mut tokens = Vec::new();
        {
            let v = &mut w.va();
            let ctrl = v.ctrl();
            ctrl.set_auto_kick(false);
            for (i, (cq, tail)) in cq_reqs.iter().enumerate() {
                let t = ctrl
                    .submit(Opcode::ALLOC_PD, &ctx_req, PdHandleResp::SIZE)
                    .unwrap();
                tokens.push((t, Want::Ok("pd")));
                let t = ctrl.submit(0x7fu32, &ctx_req, 4).unwrap();
                tokens.push((t, Want::Fails(Status::UNSUPPORTED, 0x7f)));
                let t = ctrl
                    .submit_parts(Opcode::CREATE_CQ, &[cq, tail], CqHandleResp::SIZE)
                    .unwrap();
                tokens.push((t, Want::Ok("cq")));
                let (t, want) = match i % 4 {
                    0 => (
                        ctrl.submit(Opcode::ALLOC_PD, &bad_ctx, PdHandleResp::SIZE)
                            .unwrap(),
                        Want::Fails(Status::BAD_HANDLE, 0),
                    ),
                    1 => (
                        ctrl.submit(Opcode::ALLOC_PD, &ctx_req[..3], PdHandleResp::SIZE)
                            .unwrap(),
                        Want::Fails(Status::INVALID, 4),
                    ),
                    2 => {
                        let resp = ctrl.vring().mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
                        let chain = RawDesc::chain(&[
                            Seg::readable(raw_req, raw_len),
                            Seg::writable(GuestAddress(hole), 24),
                            Seg::writable(resp, 24),
                        ]);
                        (
                            ctrl.submit_raw_chain(&chain, None).unwrap(),
                            Want::Malformed,
                        )
                    }
                    _ => (
                        ctrl.submit(Opcode::QUERY_QP, &qp_req, QueryQpResp::SIZE)
                            .unwrap(),
                        Want::Ok("query"),
                    ),
                };
                tokens.push((t, want));
            }
            ctrl.kick().unwrap();
            ctrl.set_auto_kick(true);
        }
        // Collect in whatever order they complete.
        let mut pds = Vec::new();
        let mut cqs = Vec::new();
        let (mut n_ok, mut n_failed, mut n_malformed) = (0u64, 0u64, 0u64);
        for (t, want) in &tokens {
            let c = w.a.ctrl().wait(*t).unwrap();
            match want {
                Want::Ok(kind) => {
                    n_ok += 1;
                    let c = c
                        .clone()
                        .ok()
                        .unwrap_or_else(|e| panic!("valid {kind} failed: {e}"));
                    match *kind {
                        "pd" => pds.push(c.parse::<PdHandleResp>().unwrap().pd_handle),
                        "cq" => cqs.push(c.parse::<CqHandleResp>().unwrap().cq_handle),
                        _ => assert_eq!(c.parse::<QueryQpResp>().unwrap(), b.qp_attrs),
                    }
                }
                Want::Fails(status, detail) => {
                    n_failed += 1;
                    assert_eq!(
                        (c.status(), c.detail, c.used_len),
                        (Some(*status), *detail, 16),
                        "{c:?}"
                    );
                    assert_eq!(c.resp_request_id, c.request_id);
                }
                Want::Malformed => {
                    n_malformed += 1;
                    assert_eq!(c.used_len, 0, "{c:?}");
                }
            }
        }
        let distinct = |v: &Vec<u32>| v.iter().collect::<std::collections::HashSet<_>>().len();
        assert_eq!((pds.len(), distinct(&pds)), (12, 12));
        assert_eq!((cqs.len(), distinct(&cqs)), (12, 12));
        let after = w.a_stats();
        assert_eq!(after.resources.pd, before.resources.pd + 12);
        assert_eq!(after.resources.cq, before.resources.cq + 12);
        assert_eq!(after.resources.ctx, before.resources.ctx);
        assert_eq!(
            after.ctrl,
            CtrlStats {
                ok: before.ctrl.ok + n_ok,
                failed: before.ctrl.failed + n_failed,
                malformed: before.ctrl.malformed + n_malformed,
            }
        );
        // Every object created in the storm is usable and goes away with its context.
        w.ok("QP on a PD and CQ from the storm", |v| {
            v.create_qp(&QpInit::rc(pds[5], cqs[7]))
        });
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        assert_eq!(w.a_counts().pd, before.resources.pd);
    });
}

// ===========================================================================
// VMM disconnect in the middle of a command (spec 15.2).
// ===========================================================================

/// Limits that allow several 4 GiB regions.
fn big_mr_limits() -> Limits {
    Limits {
        max_mr_size: 16 * GIB,
        max_mr_bytes: 64 * GIB,
        ..Limits::default()
    }
}

/// Small commands submitted in front of the huge registrations.
const STORM_SMALL: u16 = 8;

/// Publishes, without waiting, `STORM_SMALL` small commands, then `n`
/// REG_MRs of 2^20 pages (4 GiB each, all backed by four guest pages, in
/// 2048 indirect list pages), then a few more small commands.
fn submit_storm_with_huge_mrs(w: &mut World, n: usize) {
    let b = w.base();
    let backing = w.a.mem().alloc_pages(4, PAGE_SIZE).unwrap();
    let many: Vec<GuestAddress> = (0..1usize << 20).map(|i| backing[i % 4]).collect();
    let list = w.va().page_list(&many, 12, PageListMode::INDIRECT).unwrap();
    let fixed = RegMrReq {
        pd_handle: b.pd,
        access: RW,
        iova: IOVA,
        length: 4 * GIB,
        buf: list.desc,
    }
    .to_bytes();
    let (qp, qp_tail) = qp_req(w, &QpInit::rc(b.pd, b.cq));
    let qp = qp.to_bytes();
    let ctx_req = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
    let ctrl = w.a.ctrl();
    ctrl.set_auto_kick(false);
    for _ in 0..STORM_SMALL / 2 {
        ctrl.submit(Opcode::ALLOC_PD, &ctx_req, PdHandleResp::SIZE)
            .unwrap();
        ctrl.submit_parts(Opcode::CREATE_QP, &[&qp, &qp_tail], CreateQpResp::SIZE)
            .unwrap();
    }
    for _ in 0..n {
        ctrl.submit_parts(Opcode::REG_MR, &[&fixed, &list.tail], RegMrResp::SIZE)
            .unwrap();
    }
    for _ in 0..4 {
        ctrl.submit(Opcode::CREATE_CTX, &[], CreateCtxResp::SIZE)
            .unwrap();
    }
    ctrl.kick().unwrap();
}

/// VM A went away: VM B's baseline QP, connected to A's, failed with it
/// (spec 18.23); record ERR as the state it must keep from now on.
fn b_qp_failed_with_a(w: &mut World) {
    let err = u32::from(QpState::ERR);
    let q = Verbs::new(&mut w.b)
        .query_qp(w.b_base.qp.handle)
        .expect("VM B: QUERY_QP");
    assert_eq!(q.attr.qp_state, err, "VM B's QP connected to VM A: {q:?}");
    w.b_base.qp_attrs.attr.qp_state = err;
    w.b_base.qp_attrs.attr.cur_qp_state = err;
}

#[test]
fn vmm_disconnects_mid_command() {
    hostile_in(World::build(big_mr_limits(), opts()), |w| {
        let b_qps = w.d.stats(1).device.resources.qp;
        let start = w.a.ctrl().vring().device_used_idx().unwrap();
        submit_storm_with_huge_mrs(w, 3);
        // Wait (bounded) until the daemon has started on the batch: the
        // small commands in front have been returned in the used ring (the
        // daemon writes each used element as it finishes the command).
        let deadline = Instant::now() + Duration::from_secs(5);
        while w
            .a
            .ctrl()
            .vring()
            .device_used_idx()
            .unwrap()
            .wrapping_sub(start)
            < STORM_SMALL
        {
            assert!(
                Instant::now() < deadline,
                "the daemon never started the batch"
            );
            std::thread::yield_now();
        }
        // Pull the plug while the huge registrations are being validated.
        w.a.disconnect();
        let s = w.d.wait_released(0);
        assert!(
            !s.connected,
            "VM A still connected after the disconnect: {s:?}"
        );
        assert!(
            s.device.resources.is_empty(),
            "VM A's objects were not all released: {:?}",
            s.device.resources
        );
        assert_eq!(
            w.d.daemon().qpns_in_use(),
            b_qps,
            "QP numbers of VM A leaked"
        );
        b_qp_failed_with_a(w);
        // The socket accepts a new VMM, which starts from nothing and works.
        w.a = w.d.connect_with(0, opts()).unwrap();
        let s = w.d.stats_connected(0, 2);
        assert!(s.connected);
        assert_eq!(s.connections, 2);
        assert!(
            s.device.resources.is_empty(),
            "objects carried over: {:?}",
            s.device.resources
        );
        let base = create_base(&mut w.a);
        w.a_base = Some(finish_base(&mut w.a, base, Some((w.b_base.qp.qpn, gid(1)))));
    });
}

/// Regression: the daemon built fresh handle tables for every connection,
/// so after a disconnect the same handle values came back and a handle from
/// before it named a new object. Spec 9.1 and 15.2: generations keep
/// advancing; handles from before do not resolve.
#[test]
fn handles_from_before_a_reconnect_do_not_resolve() {
    hostile(|w| {
        let old = w.base();
        w.a.disconnect();
        let s = w.d.wait_released(0);
        assert!(!s.connected && s.device.resources.is_empty(), "{s:?}");
        b_qp_failed_with_a(w);
        w.a = w.d.connect_with(0, opts()).unwrap();
        // The new VMM creates the same sequence of objects.
        let new = create_base(&mut w.a);
        w.a_base = Some(finish_base(&mut w.a, new, Some((w.b_base.qp.qpn, gid(1)))));
        let (ctx, pd, cq, qp, mr) = new;
        for (kind, was, now) in [
            ("context", old.ctx, ctx),
            ("PD", old.pd, pd),
            ("CQ", old.cq, cq),
            ("QP", old.qp.handle, qp.handle),
            ("MR", old.mr, mr),
        ] {
            assert_ne!(
                was, now,
                "the {kind} handle {was:#x} from before the reset was handed out again"
            );
        }
        w.expect(
            "QUERY_QP with a QP handle from before the reset",
            Status::BAD_HANDLE,
            0,
            |v| v.query_qp(old.qp.handle),
        );
    });
}

// ===========================================================================
// Reference: a request the guest rewrites while it is in flight.
// ===========================================================================
//
// Not tested: the daemon copies every request (and every list page) out of
// guest memory before it looks at it (backend/src/device.rs handle_chain,
// backend/src/memory/pagelist.rs), but a test cannot time a rewrite to land
// between the daemon's reads without instrumenting the daemon.
