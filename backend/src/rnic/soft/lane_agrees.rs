//! Tests: the small-WRITE lane and the general path, run on the same small
//! RDMA WRITEs, agree. Each case builds two identical pairs of VMs (the
//! requester, and the responder held for the burst), changes one thing in
//! both, and sends the same WRITE down the lane in one and down the general
//! path in the other: the lane takes exactly the WRITEs the general path
//! completes, leaves the responder's memory alone when it declines, and
//! when both complete, memory and the responder's events are the same.

use std::sync::Arc;

use virtio_rdma_abi::datapath::{SendWqe, Sge, WcOpcode, WcStatus, WrOpcode};
use virtio_rdma_abi::mem::access as acc;
use virtio_rdma_abi::qp::{AddressVector, QpState, QpType};
use vm_memory::{Bytes, GuestAddress};

use super::burst::{Burst, Held};
use super::lane::small_write;
use super::pieces::Span;
use super::request::{RespOutcome, RespScratch};
use super::route::Router;
use super::SoftRnic;
use crate::config::{DaemonConfig, Limits};
use crate::engine::testing;
use crate::memory::HostMem;
use crate::resources::Mr;
use crate::rnic_objects::RnicObjects;
use crate::rnic_path::{Outgoing, Room, SendWr, Serving};
use crate::tenancy::Tenancy;
use crate::vm::cell::VmCell;
use crate::vm::{PortIdentity, VmState};

/// Where each VM's region starts in its iova space, and the guest page
/// behind it.
const IOVA: u64 = 0x10_0000;
const PAGE: u64 = 0x4000;
/// The WRITE's length.
const LEN: u32 = 256;

/// One VM of a pair: its memory, state, one RC QP and one region.
struct Side {
    gm: crate::memory::GuestRam,
    host: HostMem,
    vm: VmState,
    qp: u32,
    qpn: u32,
    mr: u32,
    lkey: u32,
    rkey: u32,
}

/// What a case may change before the WRITE is sent.
struct Setup {
    /// The responder region's access flags.
    mr_access: u32,
    /// The responder QP's access flags.
    qp_access: u32,
    /// The responder QP's state.
    qp_state: QpState,
    /// The responder QP's PD (the region's is 1).
    qp_pd: u32,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mr_access: acc::LOCAL_WRITE | acc::REMOTE_WRITE,
            qp_access: acc::REMOTE_WRITE,
            qp_state: QpState::RTS,
            qp_pd: 1,
        }
    }
}

fn gid(vm: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[15] = u8::try_from(vm).unwrap();
    g
}

fn side(vm: usize, rnic: &Arc<dyn RnicObjects>, tenancy: &Arc<Tenancy>, setup: &Setup) -> Side {
    let gm = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
    let host = HostMem::new(Arc::new(gm.clone()));
    let port = PortIdentity {
        gids: crate::gid_table::GidTable::single(gid(vm)),
        guid: 1 + vm as u64,
        vm,
    };
    let mut state = VmState::new(Limits::default(), rnic.clone(), port, tenancy.clone());
    state.set_running(true);
    let responder = vm == 1;
    let region = Mr {
        pd: 1,
        ctx: 1,
        access: if responder {
            setup.mr_access
        } else {
            acc::LOCAL_WRITE
        },
        iova: IOVA,
        length: 0x1000,
        first_page_offset: 0,
        lkey: 0,
        rkey: 0,
        pages: testing::one_page(PAGE, &gm),
        host_lost: false,
        keyed: false,
        fast: None,
    };
    let (mr, keys) = state.res.insert_mr(region, rnic.as_ref()).unwrap();
    let mut qp = testing::qp(QpType::RC);
    if responder {
        qp.attr.access = setup.qp_access;
        qp.state = setup.qp_state;
        qp.pd = setup.qp_pd;
    }
    let (qp, qpn) = state.res.insert_qp(qp, rnic.as_ref()).unwrap();
    Side {
        gm,
        host,
        vm: state,
        qp,
        qpn,
        mr,
        lkey: keys.lkey,
        rkey: keys.rkey,
    }
}

/// A requester (VM 0) and a responder (VM 1) of one tenant.
struct Pair {
    rnic: Arc<dyn RnicObjects>,
    tenancy: Arc<Tenancy>,
    a: Side,
    b: Side,
    /// The responder's cell, for its event wake-ups.
    cell: VmCell,
}

fn pair(setup: &Setup) -> Pair {
    let rnic: Arc<dyn RnicObjects> = Arc::new(SoftRnic::new());
    let config = DaemonConfig::new(vec![
        "/nonexistent/a.sock".into(),
        "/nonexistent/b.sock".into(),
    ]);
    let tenancy = Arc::new(Tenancy::from_config(&config));
    let a = side(0, &rnic, &tenancy, setup);
    let b = side(1, &rnic, &tenancy, setup);
    // The source bytes.
    let bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 + 1).collect();
    a.gm.write_slice(&bytes, GuestAddress(PAGE)).unwrap();
    let port = PortIdentity {
        gids: crate::gid_table::GidTable::single(gid(1)),
        guid: 9,
        vm: 1,
    };
    let spare = VmState::new(Limits::default(), rnic.clone(), port, tenancy.clone());
    let cell = VmCell::new(spare, 0, Default::default()).unwrap();
    Pair {
        rnic,
        tenancy,
        a,
        b,
        cell,
    }
}

/// The WRITE a case sends, as the requester checked and addressed it.
#[derive(Clone, Copy)]
struct Write {
    sge: Sge,
    rkey: u32,
    remote_addr: u64,
    dest_qpn: u32,
    dgid: [u8; 16],
}

impl Write {
    fn of(p: &Pair) -> Write {
        Write {
            sge: Sge {
                addr: IOVA,
                length: LEN,
                lkey: p.a.lkey,
            },
            rkey: p.b.rkey,
            remote_addr: IOVA + 0x100,
            dest_qpn: p.b.qpn,
            dgid: gid(1),
        }
    }
}

/// Sends `w` from the requester of `p` down the lane (`lane`: `Done` if
/// it took the WRITE, `Dropped` for "not in the lane") or the general
/// path.
fn send(p: &mut Pair, w: Write, lane: bool) -> Result<RespOutcome, WcStatus> {
    let sges = [w.sge];
    let wr = SendWr {
        hdr: SendWqe {
            wr_id: 7,
            opcode: WrOpcode::RDMA_WRITE as u8,
            num_sge: 1,
            rkey: w.rkey,
            remote_addr: w.remote_addr,
            ..SendWqe::default()
        },
        opcode: WrOpcode::RDMA_WRITE,
        sges: &sges,
        inline: None,
    };
    let len = u64::from(w.sge.length);
    let msg = Outgoing {
        op: WcOpcode::RDMA_WRITE,
        qp: p.a.qp,
        index: 0,
        wr: &wr,
        pd: 1,
        src_qpn: p.a.qpn,
        qp_type: QpType::RC,
        dest_qpn: w.dest_qpn,
        av: AddressVector {
            dgid: w.dgid,
            ..AddressVector::default()
        },
        qkey: 0,
        writes_local: false,
        signaled: true,
        len,
        room: Room {
            max_bytes: 1 << 20,
            moved: 0,
        },
    };
    let route = (1, p.b.qp);
    let mut cx = Serving {
        vms: &[],
        vm: 0,
        state: &mut p.a.vm,
        mem: &p.a.host,
    };
    let mut burst = Burst {
        held: Some(Held {
            vm: 1,
            dev: &p.cell,
            state: &mut p.b.vm,
            mem: &p.b.host,
        }),
        reached: None,
    };
    if lane {
        return Ok(match small_write(&mut cx, &mut burst, &msg, route) {
            Some(_) => RespOutcome::Done,
            None => RespOutcome::Dropped,
        });
    }
    let router = Router {
        objects: p.rnic.as_ref(),
        tenancy: &p.tenancy,
    };
    let span = Span {
        start: 0,
        limit: len,
        part: (0, len),
    };
    let (mut local, mut resp) = (Vec::new(), RespScratch::new());
    router.general(
        &mut cx,
        &mut burst,
        &msg,
        span,
        Some(route),
        &mut local,
        &mut resp,
    )
}

/// The responder's page.
fn target(p: &Pair) -> Vec<u8> {
    let mut b = vec![0u8; 0x1000];
    p.b.gm.read_slice(&mut b, GuestAddress(PAGE)).unwrap();
    b
}

#[test]
fn the_lane_takes_exactly_the_small_writes_the_general_path_completes() {
    type Tweak = fn(&mut Write);
    let keep: Tweak = |_| {};
    let cases: Vec<(&str, Setup, Tweak)> = vec![
        ("a valid WRITE", Setup::default(), keep),
        (
            "into a QP in RTR (COMM_EST)",
            Setup {
                qp_state: QpState::RTR,
                ..Setup::default()
            },
            keep,
        ),
        ("an rkey of no region", Setup::default(), |w| {
            w.rkey ^= 0x100
        }),
        ("past the region's end", Setup::default(), |w| {
            w.remote_addr = IOVA + 0x1000 - u64::from(LEN) / 2
        }),
        (
            "a region without REMOTE_WRITE",
            Setup {
                mr_access: acc::REMOTE_READ,
                ..Setup::default()
            },
            keep,
        ),
        (
            "a QP without REMOTE_WRITE",
            Setup {
                qp_access: acc::REMOTE_READ,
                ..Setup::default()
            },
            keep,
        ),
        (
            "a region of another PD",
            Setup {
                qp_pd: 2,
                ..Setup::default()
            },
            keep,
        ),
        (
            "a QP in INIT",
            Setup {
                qp_state: QpState::INIT,
                ..Setup::default()
            },
            keep,
        ),
        ("another QPN", Setup::default(), |w| w.dest_qpn ^= 1),
        ("another GID", Setup::default(), |w| w.dgid[15] = 7),
        ("an lkey of no region", Setup::default(), |w| {
            w.sge.lkey ^= 0x100
        }),
        ("past the local region's end", Setup::default(), |w| {
            w.sge.addr = IOVA + 0x1000 - u64::from(LEN) / 2
        }),
    ];
    let mut completed = 0;
    for (name, setup, tweak) in &cases {
        // Keys and QP numbers are random: each pair's own, changed alike.
        let (mut lane, mut general) = (pair(setup), pair(setup));
        let (mut w_lane, mut w_general) = (Write::of(&lane), Write::of(&general));
        tweak(&mut w_lane);
        tweak(&mut w_general);
        let before = target(&lane);
        let by_lane = send(&mut lane, w_lane, true);
        let by_general = send(&mut general, w_general, false);
        let took = matches!(by_lane, Ok(RespOutcome::Done));
        let done = matches!(by_general, Ok(RespOutcome::Done));
        assert_eq!(took, done, "{name}: general path {by_general:?}");
        if took {
            completed += 1;
            assert_eq!(target(&lane), target(&general), "{name}: the bytes");
            assert_ne!(target(&lane), before, "{name}: something was written");
            assert_eq!(
                lane.b.vm.events.len(),
                general.b.vm.events.len(),
                "{name}: the responder's events"
            );
        } else {
            assert_eq!(target(&lane), before, "{name}: the lane wrote nothing");
        }
        // Neither changed the regions themselves.
        assert!(lane.b.vm.res.mrs.get(lane.b.mr).is_some());
    }
    // The cases hold both outcomes.
    assert_eq!(completed, 2);
}
