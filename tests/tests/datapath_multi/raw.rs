//! Queues made with raw verbs. The reference driver writes only
//! well-formed WQEs and in-range indices; to see what the device does with
//! anything else, these queues are made with raw verbs — in the driver's
//! context and PD, on the driver's CQs where that helps, so that the driver
//! still polls their completions — and the tests ([`crate::broken_queues`])
//! write their rings and doorbell records themselves. Also a VMM that takes
//! guest pages out of the daemon's memory table.

use std::sync::atomic::Ordering;

use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vhost_user_rdma_tests::dp::{Vm, QKEY};
use vhost_user_rdma_tests::verbs::{QpInit as RawQpInit, Verbs};
use virtio_rdma_abi::config::NOTIFYQ;
use virtio_rdma_abi::datapath::{RecvWqe, SendWqe, Sge as WireSge, DB_NONE, WQE_SIGNALED};
use virtio_rdma_abi::qp::QpType;
use virtio_rdma_abi::Wire;
use virtio_rdma_driver::Transport;
use vm_memory::GuestAddress;

/// Ring memory of a raw queue: its 4 KiB pages in ring order and its
/// doorbell record.
pub struct RawRing {
    pub pages: Vec<GuestAddress>,
    pub db: GuestAddress,
}

impl RawRing {
    /// The ring of a create request with an inline page list (`tail`).
    pub fn new(tail: &[u8], db_gpa: u64) -> Self {
        let pages = tail
            .chunks_exact(8)
            .map(|c| GuestAddress(u64::from_le_bytes(c.try_into().unwrap())))
            .collect();
        RawRing {
            pages,
            db: GuestAddress(db_gpa),
        }
    }

    /// Guest-physical address of byte `off` of the queue buffer.
    pub fn at(&self, off: u64) -> GuestAddress {
        GuestAddress(self.pages[(off / 4096) as usize].0 + off % 4096)
    }

    /// Guest-physical address of byte `off` of the doorbell record.
    pub fn db_at(&self, off: u64) -> GuestAddress {
        GuestAddress(self.db.0 + off)
    }
}

/// A QP made with raw verbs (queue depths 16, 2 SGEs per receive WQE).
pub struct RawQp {
    pub handle: u32,
    pub qpn: u32,
    pub ring: RawRing,
    pub rq_offset: u64,
    pub rq_shift: u32,
    pub sq_shift: u32,
}

/// Depth of the rings of raw queues.
pub const RAW_DEPTH: u32 = 16;

/// A raw QP of `qp_type` in `vm`'s PD, completing into CQs `send_cq` and
/// `recv_cq` (handles), receiving through SRQ `srq` (0: its own receive
/// queue).
pub fn raw_qp(vm: &Vm, qp_type: QpType, send_cq: u32, recv_cq: u32, srq: u32) -> RawQp {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let mut init = RawQpInit::rc(vm.pd.handle(), send_cq);
    init.qp_type = qp_type;
    init.recv_cq = recv_cq;
    init.srq = srq;
    if srq != 0 {
        init.rq_depth = 0;
    }
    let (req, tail) = v.qp_request(&init).unwrap();
    let r = v.create_qp_raw(&req, &tail).unwrap();
    assert_eq!(r.db_slot, DB_NONE, "guest-RAM doorbell mode");
    RawQp {
        handle: r.qp_handle,
        qpn: r.qpn,
        ring: RawRing::new(&tail, req.db_gpa),
        rq_offset: u64::from(r.rq_offset),
        rq_shift: r.rq_wqe_shift,
        sq_shift: r.sq_wqe_shift,
    }
}

/// A raw CQ of `depth` entries in `vm`'s context: its handle and ring.
pub fn raw_cq(vm: &Vm, depth: u32) -> (u32, RawRing) {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let (req, tail) = v.cq_request(vm.dev.ctx_handle(), depth).unwrap();
    let cq = v.create_cq_raw(&req, &tail).unwrap();
    (cq, RawRing::new(&tail, req.db_gpa))
}

/// A raw SRQ of [`RAW_DEPTH`] one-SGE WQEs in `vm`'s PD: its handle and
/// ring.
pub fn raw_srq(vm: &Vm) -> (u32, RawRing) {
    let mut vmm = vm.t.vmm();
    let mut v = Verbs::new(&mut vmm);
    let (req, tail) = v.srq_request(vm.pd.handle(), RAW_DEPTH, 1, 0).unwrap();
    let r = v.create_srq_raw(&req, &tail).unwrap();
    assert_eq!(r.db_slot, DB_NONE, "guest-RAM doorbell mode");
    (r.srq_handle, RawRing::new(&tail, req.db_gpa))
}

/// Moves raw RC QP `q` to RTS towards QP number `dest_qpn` on `peer`.
pub fn raw_connect(vm: &Vm, q: &RawQp, dest_qpn: u32, peer: &Vm) {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm)
        .connect_rc(q.handle, dest_qpn, peer.dev.gid())
        .unwrap();
}

/// Moves raw UD QP `q` to RTS with [`QKEY`].
pub fn raw_ud_activate(vm: &Vm, q: &RawQp) {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm).activate_ud(q.handle, QKEY).unwrap();
}

/// The state of raw QP `q`.
pub fn raw_state(vm: &Vm, q: &RawQp) -> u32 {
    let mut vmm = vm.t.vmm();
    Verbs::new(&mut vmm)
        .query_qp(q.handle)
        .unwrap()
        .attr
        .qp_state
}

/// Stores a 32-bit index (release) at `gpa`.
pub fn store_index(vm: &Vm, gpa: GuestAddress, v: u32) {
    vm.t.mem().store(gpa, v, Ordering::Release).unwrap();
}

/// Loads a 32-bit index (acquire) at `gpa`.
pub fn load_index(vm: &Vm, gpa: GuestAddress) -> u32 {
    vm.t.mem().load(gpa, Ordering::Acquire).unwrap()
}

/// Doorbell offsets: `rq_pi`, the device half's first word (`sq_ci` of a QP,
/// `ci` of an SRQ) and `rq_ci`.
pub const RQ_PI: u64 = 4;
pub const DEVICE_CI: u64 = virtio_rdma_abi::datapath::DB_DEVICE_OFFSET;
pub const RQ_CI: u64 = DEVICE_CI + 4;

/// Writes receive WQE `wqe` with `sges` into slot `index` of raw QP `q`'s
/// receive queue and posts it (`rq_pi` = `index + 1`).
pub fn raw_post_recv(vm: &Vm, q: &RawQp, index: u32, wqe: RecvWqe, sges: &[WireSge]) {
    let mut bytes = wqe.to_bytes();
    for s in sges {
        bytes.extend(s.to_bytes());
    }
    let slot = q.rq_offset + (u64::from(index % RAW_DEPTH) << q.rq_shift);
    vm.t.mem().write(q.ring.at(slot), &bytes).unwrap();
    store_index(vm, q.ring.db_at(RQ_PI), index + 1);
}

/// Writes send WQE `wqe` into slot `index` of raw QP `q`'s send queue,
/// posts it (`sq_pi` = `index + 1`) and notifies.
pub fn raw_post_send(vm: &Vm, q: &RawQp, index: u32, wqe: SendWqe) {
    let slot = u64::from(index % RAW_DEPTH) << q.sq_shift;
    vm.t.mem().write(q.ring.at(slot), &wqe.to_bytes()).unwrap();
    store_index(vm, q.ring.db, index + 1);
    vm.t.notify(NOTIFYQ).unwrap();
}

/// Sends `regions` to the back-end as its memory table (`SET_MEM_TABLE`).
pub fn set_mem_table(vm: &Vm, regions: &[VhostUserMemoryRegionInfo]) {
    vm.t.vmm()
        .vhost_call("SET_MEM_TABLE", |fe| fe.set_mem_table(regions))
        .unwrap();
}

/// Takes the 4 KiB page at `page` out of the memory table the back-end
/// sees — as a VMM that unplugs memory — so that whatever the device keeps
/// there becomes unusable; the rest of guest RAM stays where it was. The
/// guest itself keeps its mapping.
pub fn unmap_page(vm: &Vm, page: GuestAddress) {
    let mut regions = vm.t.mem().region_infos().unwrap();
    let i = regions
        .iter()
        .position(|r| (r.guest_phys_addr..r.guest_phys_addr + r.memory_size).contains(&page.0))
        .unwrap();
    let r = regions.remove(i);
    let (start, end, cut) = (
        r.guest_phys_addr,
        r.guest_phys_addr + r.memory_size,
        page.0 + 4096,
    );
    if page.0 > start {
        regions.push(VhostUserMemoryRegionInfo {
            memory_size: page.0 - start,
            ..r
        });
    }
    if cut < end {
        let skip = cut - start;
        regions.push(VhostUserMemoryRegionInfo {
            guest_phys_addr: cut,
            memory_size: end - cut,
            userspace_addr: r.userspace_addr + skip,
            mmap_offset: r.mmap_offset + skip,
            ..r
        });
    }
    // The back-end wants them in address order.
    regions.sort_by_key(|r| r.guest_phys_addr);
    set_mem_table(vm, &regions);
}

/// Gives the back-end the whole of guest RAM again.
pub fn restore_mem(vm: &Vm) {
    set_mem_table(vm, &vm.t.mem().region_infos().unwrap());
}

/// A signaled send WQE with an opcode that does not exist: malformed.
pub fn bad_opcode_wqe(wr_id: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: 0x7f,
        flags: WQE_SIGNALED,
        ..SendWqe::default()
    }
}
