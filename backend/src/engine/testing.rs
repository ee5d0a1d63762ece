//! Fixtures of the engine's unit tests.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_rdma_abi::datapath::{SendWqe, WrOpcode};
use virtio_rdma_abi::mem::{qp_buffer_layout, BufferDesc, PageListMode};
use virtio_rdma_abi::qp::{Mtu, QpAttr, QpState, QpType};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::placement::Registry;
use super::{Engine, EngineCounters};

use crate::memory::pagelist::PageListLimits;
use crate::memory::{PageList, RamMap};
use crate::qos::QosTable;
use crate::resources::{Qp, QpRuntime};
use crate::rnic_objects::{
    Caps, MrKeys, MrSpec, Owner, PortGids, QpChange, QpSpec, RnicError, RnicKind, RnicObjects,
};
use crate::rnic_path::SendWr;
use crate::tenancy::Tenancy;

/// A QP of type `qp_type` in RTS with default attributes, its one-page
/// ring at guest address 0 of a 64 KiB guest (nothing here reads it).
pub(crate) fn qp(qp_type: QpType) -> Qp {
    let mem =
        crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).expect("guest memory");
    let ring = one_page(0, &mem);
    Qp {
        pd: 1,
        ctx: 1,
        qp_type,
        send_cq: 1,
        recv_cq: 1,
        srq: 0,
        xrcd: 0,
        flags: 0,
        qpn: 0x11,
        incarnation: 0,
        sq_depth: 16,
        rq_depth: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        layout: qp_buffer_layout(16, 16, 1, 1, 0, 12),
        db_gpa: 0x1000,
        db_slot: None,
        ring,
        state: QpState::RTS,
        attr: QpAttr::default(),
        rt: QpRuntime::default(),
    }
}

/// The translation of the one page at `gpa` of `mem` (a ring).
pub(crate) fn one_page(gpa: u64, mem: &crate::memory::GuestRam) -> PageList {
    let desc = BufferDesc {
        addr: 0,
        npages: 1,
        first_page_offset: 0,
        page_shift: 12,
        mode: PageListMode::INLINE as u32,
    };
    let limits = PageListLimits {
        max_pages: 1,
        max_inline: 1,
        page_size_cap: 1 << 12,
        max_list_bytes: u64::MAX,
    };
    let ram = RamMap::from_guest_memory(mem);
    PageList::resolve(&desc, &gpa.to_le_bytes(), &limits, &ram, mem).expect("a one-page ring")
}

/// A send work request `opcode` with `inline` data or no SGE, `wr_id` 9,
/// `rkey` 0x55 and `remote_addr` 0x1000.
pub(crate) fn send_wr(opcode: WrOpcode, inline: Option<&[u8]>) -> SendWr<'_> {
    let hdr = SendWqe {
        wr_id: 9,
        rkey: 0x55,
        remote_addr: 0x1000,
        ..SendWqe::default()
    };
    SendWr {
        hdr,
        opcode,
        sges: &[],
        inline,
    }
}

/// The object half of an RNIC for the engine's own tests: QP numbers
/// counted up from 2, keys from 1, nothing behind the other objects (the
/// engine's tests run a data path of their own over it).
#[derive(Default)]
pub(crate) struct Numbers {
    next: AtomicU32,
}

impl Numbers {
    fn draw(&self) -> u32 {
        self.next.fetch_add(1, Ordering::Relaxed).saturating_add(2)
    }
}

impl RnicObjects for Numbers {
    fn kind(&self) -> RnicKind {
        RnicKind::Soft
    }
    fn caps(&self) -> Caps {
        // A small port: the tests' messages are of a few bytes.
        Caps {
            max_mtu: Mtu::MTU_1024 as u32,
            link_rate_mbps: 10_000,
            atomics: false,
            max_msg_size: 1 << 20,
            local_ca_ack_delay: 0,
            max_fast_reg_pages: 0,
            windows: true,
            uc: true,
            mcast: true,
            xrc: true,
            resize: true,
            gids: PortGids::PerVm,
            gsi: true,
            dirty_log: true,
        }
    }
    fn create_qp(&self, _owner: Owner, _spec: &QpSpec) -> Result<u32, RnicError> {
        Ok(self.draw())
    }
    fn modify_qp(&self, _change: &QpChange<'_>) -> Result<(), RnicError> {
        Ok(())
    }
    fn destroy_qp(&self, _qpn: u32) {}
    fn lookup_qpn(&self, _qpn: u32) -> Option<Owner> {
        None
    }
    fn qpns_in_use(&self) -> usize {
        0
    }
    fn reg_mr(&self, _owner: Owner, _mr: &MrSpec<'_>) -> Result<MrKeys, RnicError> {
        let key = self.draw();
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }
    fn dereg_mr(&self, _keys: MrKeys) {}
    fn alloc_fast_mr(&self, _owner: Owner) -> Result<u32, RnicError> {
        Err(RnicError::Exhausted)
    }
    fn free_fast_mr(&self, _key: u32) {}
    fn keys_in_use(&self) -> usize {
        0
    }
}

/// An engine (index 0) that is not running: its methods are called
/// directly by the tests.
pub(crate) fn engine(caps: Caps, tenancy: Arc<Tenancy>) -> Engine {
    Engine {
        index: 0,
        registry: Arc::new(Registry::new(vec![0])),
        qos_applied: AtomicU64::new(0),
        db_flags: Arc::new(AtomicU32::new(0)),
        counters: EngineCounters::default(),
        caps,
        wake: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        kicks: super::kicks::KickWatch::new().unwrap(),
        kicked_vms: Arc::default(),
        stop: AtomicBool::new(false),
        hold: AtomicBool::new(false),
        held: AtomicBool::new(false),
        thread: Mutex::new(None),
        tenancy,
        qos: Arc::new(QosTable::new(Vec::new(), Vec::new())),
        fence_elision: false,
        pinned: false,
    }
}

/// `n` VM cells (ids 0 to `n - 1`, one tenant, nothing mapped) whose kicks
/// go to `kicked`.
pub(crate) fn cells(
    n: usize,
    kicked: &Arc<crate::vm::cell::KickedVms>,
) -> Vec<Arc<crate::vm::cell::VmCell>> {
    let paths = (0..n)
        .map(|i| format!("/nonexistent/vm{i}.sock").into())
        .collect();
    let config = crate::config::DaemonConfig::new(paths);
    let tenancy = Arc::new(Tenancy::from_config(&config));
    let rnic: Arc<dyn RnicObjects> = Arc::new(Numbers::default());
    (0..n)
        .map(|vm| {
            let port = crate::vm::PortIdentity {
                gids: crate::gid_table::GidTable::single([0; 16]),
                guid: 1,
                vm,
            };
            let state = crate::vm::VmState::new(
                crate::config::Limits::default(),
                rnic.clone(),
                port,
                tenancy.clone(),
            );
            Arc::new(crate::vm::cell::VmCell::new(state, 0, kicked.clone()).unwrap())
        })
        .collect()
}
