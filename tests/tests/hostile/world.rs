//! The world of one case: a daemon, the attacker A (VM 0), the bystander B
//! (VM 1) and the objects both created before the attack; [`hostile`] runs a
//! case in it and [`assert_unharmed`] checks afterwards that A is still served
//! and B unaffected.

use std::fmt::Debug;
use std::time::Duration;

use vhost_user_rdma::device::DeviceStats;
use vhost_user_rdma::resources::ResourceCounts;
use vhost_user_rdma::vm::CtrlStats;
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::ctrl::{Completion, RequestSpec, POISON};
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::{status_of, MrSpec, QpInfo, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vhost_user_rdma_tests::vring::RawDesc;
use vhost_user_rdma_tests::Result as VmmResult;
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_abi::verbs::*;
use vm_memory::GuestAddress;

/// Access of ordinary test MRs.
pub const LW: u32 = access::LOCAL_WRITE;
/// Access of the baseline MRs (remote rights need LOCAL_WRITE).
pub const RW: u32 = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
/// The highest 4 KiB-aligned address: a page there ends at 2^64.
pub const TOP_PAGE: u64 = !(PAGE_SIZE - 1);
/// An iova for test MRs.
pub const IOVA: u64 = 0x7f12_3400_0000;

pub fn opts() -> VmmOptions {
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
pub struct Base {
    pub ctx: u32,
    pub pd: u32,
    pub cq: u32,
    pub qp: QpInfo,
    pub mr: u32,
    /// QUERY_QP of `qp` once set up: it must read back exactly so.
    pub qp_attrs: QueryQpResp,
}

/// Handles of a baseline before its QP is connected: ctx, PD, CQ, QP, MR.
pub type BaseParts = (u32, u32, u32, QpInfo, u32);

/// Creates a context, a PD, a CQ, an RC QP (in RESET) and a one-page MR.
pub fn create_base(vm: &mut TestVmm) -> BaseParts {
    let mut v = Verbs::new(vm);
    let (ctx, pd, cq) = v.ctx_pd_cq(16).unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    let pages = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
    let mr = v.reg_mr(&MrSpec::new(pd, RW, IOVA, &pages)).unwrap();
    (ctx, pd, cq, qp, mr.mr_handle)
}

/// The GID of VM `i` (VM A is 0, VM B 1): the default configuration's.
pub fn gid(i: usize) -> [u8; 16] {
    vhost_user_rdma::config::default_gid(i)
}

/// The index of a VM's GID in its table (ABI version 3 without a MAC:
/// index 0, the default GID, is unassigned; the operator's is at 1).
pub const OWN_GID_INDEX: u8 = 1;

/// Moves the baseline QP to RTS towards `connect` (QPN and GID, if given)
/// and records what QUERY_QP returns for it.
pub fn finish_base(vm: &mut TestVmm, b: BaseParts, connect: Option<(u32, [u8; 16])>) -> Base {
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

pub struct World {
    pub d: TestDaemon,
    /// The attacker (VM 0).
    pub a: TestVmm,
    /// The bystander (VM 1).
    pub b: TestVmm,
    /// A's objects from before the attack (None after a reconnect that did
    /// not recreate them).
    pub a_base: Option<Base>,
    pub b_base: Base,
    /// B's live objects as they must stay.
    pub b_counts: ResourceCounts,
    /// The device limits, as VM A reads them (QUERY_DEVICE).
    pub dev: DeviceAttr,
}

impl World {
    pub fn new() -> Self {
        Self::build(Limits::default(), opts())
    }

    /// A daemon with `limits`, VM A connected with `a_opts`.
    pub fn build(limits: Limits, a_opts: VmmOptions) -> Self {
        let d = TestDaemon::with_limits(2, limits).unwrap();
        let mut a = d.connect_with(0, a_opts).unwrap();
        let mut b = d.connect_with(1, opts()).unwrap();
        let pa = create_base(&mut a);
        let pb = create_base(&mut b);
        // Connect the two baseline QPs to each other (RESET -> RTS).
        let a_base = finish_base(&mut a, pa, Some((pb.3.qpn, gid(1))));
        let b_base = finish_base(&mut b, pb, Some((pa.3.qpn, gid(0))));
        assert_eq!(a_base.qp_attrs.attr.qp_state, u32::from(QpState::RTS));
        // The checks after an attack compare with A and B connected once.
        for vm in [0, 1] {
            assert!(
                d.wait_connected(vm).connected,
                "VM {vm} never counted as connected"
            );
        }
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
    pub fn va(&mut self) -> Verbs<'_> {
        Verbs::new(&mut self.a)
    }

    /// Typed verbs of VM B.
    pub fn vb(&mut self) -> Verbs<'_> {
        Verbs::new(&mut self.b)
    }

    /// A's baseline objects.
    pub fn base(&self) -> Base {
        self.a_base.expect("VM A's baseline objects")
    }

    pub fn a_stats(&self) -> DeviceStats {
        self.d.stats(0).device
    }

    pub fn a_counts(&self) -> ResourceCounts {
        self.a_stats().resources
    }

    /// Records B's objects as they are now (after a case deliberately
    /// created objects in B).
    pub fn snapshot_b(&mut self) {
        self.b_counts = self.d.stats(1).device.resources;
    }

    /// Runs a valid command sequence on VM A.
    pub fn ok<T>(&mut self, what: &str, f: impl FnOnce(&mut Verbs<'_>) -> VmmResult<T>) -> T {
        f(&mut self.va()).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// Runs a valid command sequence on VM B.
    pub fn b_ok<T>(&mut self, what: &str, f: impl FnOnce(&mut Verbs<'_>) -> VmmResult<T>) -> T {
        f(&mut self.vb()).unwrap_or_else(|e| panic!("{what} (VM B): {e}"))
    }

    /// Checks that, since `before`, VM A's objects and QP numbers did not
    /// change and exactly `failed` commands failed and `malformed` chains
    /// were refused, with no command succeeding.
    pub fn assert_no_effect(
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
    pub fn expect<T: Debug>(
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
    pub fn expect_spec(
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
    pub fn expect_malformed(
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
pub fn hostile(case: impl FnOnce(&mut World)) {
    hostile_in(World::new(), case);
}

/// Runs `case` on `w`, then checks that the daemon is unharmed.
pub fn hostile_in(mut w: World, case: impl FnOnce(&mut World)) {
    case(&mut w);
    assert_unharmed(&mut w);
}

/// The check every case ends with: VM A is still served, VM B is unaffected.
pub fn assert_unharmed(w: &mut World) {
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
