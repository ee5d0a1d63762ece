#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Live migration's device-state transfer through the real vhost-user
//! socket (spec 20.1): a front-end saves a VM's state with
//! `SET_DEVICE_STATE_FD` `SAVE` and `CHECK_DEVICE_STATE`, and loads it into
//! the VM's instance under a new front-end with `LOAD`, as QEMU does
//! (`vhost_save_backend_state`, `vhost_load_backend_state`). What the
//! state carries is `RdmaDevice::save_state`'s business; these tests are
//! about the transfer. The hostile cases are in `migration_hostile.rs`.

use std::sync::Mutex;

use vhost::vhost_user::message::VhostTransferStateDirection;
use vhost::vhost_user::VhostUserProtocolFeatures;
use vhost_user_rdma::migration::{decode, state_bound, MAGIC};
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{
    fast, ok, pattern, poll_one, rc_pair, rc_pair_with, wr, write_and_send_back, write_op, Buf,
    Pair, Vm,
};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::state_transfer::{
    check, inode, load, migrating_vmm, pipe, pipe_descriptors, save, set_state_fd, transfer_threads,
};
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::datapath::WcOpcode;

/// The tests look at the process's transfer threads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// VMs 1 and 2 with a connected RC pair: the VMs that must not notice.
struct Bystanders {
    p: Pair,
    src: Buf,
    dst: Buf,
    seq: u64,
    _a: Vm,
    _b: Vm,
}

impl Bystanders {
    fn new(d: &TestDaemon) -> Self {
        let a = Vm::open(d, 1, VmmOptions::default());
        let b = Vm::open(d, 2, VmmOptions::default());
        let p = rc_pair(&a, &b);
        let src = Buf::new(&a, 4096);
        let dst = Buf::new(&b, 4096);
        Bystanders {
            p,
            src,
            dst,
            seq: 0,
            _a: a,
            _b: b,
        }
    }

    /// One checked WRITE and SEND between them.
    fn round(&mut self) {
        self.seq += 1;
        let data = pattern(512, self.seq);
        write_and_send_back(&self.p, &self.src, &self.dst, &data, 2048, self.seq);
    }
}

fn vm0(d: &TestDaemon) -> TestVmm {
    d.connect_with(0, migrating_vmm())
        .expect("a migrating VMM on VM 0")
}

#[test]
fn the_daemon_offers_the_device_state_transfer() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::start(1).unwrap();
    let vmm = vm0(&d);
    assert!(
        vmm.protocol_features()
            .contains(VhostUserProtocolFeatures::DEVICE_STATE),
        "DEVICE_STATE negotiated: {:?}",
        vmm.protocol_features()
    );
}

/// The round trip QEMU makes: save on the source's front-end, which could
/// still resume (a cancelled migration), then load into the VM's instance
/// under the next front-end, which then runs.
#[test]
fn a_saved_state_loads_into_the_next_front_end_of_the_vm() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::start(3).unwrap();
    let mut others = Bystanders::new(&d);
    others.round();

    let mut src = vm0(&d);
    let bases = src.stop_queues().unwrap();
    let state = save(&mut src).unwrap();
    assert_eq!(state.get(..8), Some(&MAGIC[..]), "a framed state");
    let saved = decode(&state, state_bound(&Limits::default())).expect("the state decodes");
    assert!(!saved.vm.is_empty(), "the state names its VM");
    // CHECK_DEVICE_STATE again reports the same transfer.
    assert!(check(&mut src).unwrap());
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
    others.round();

    // A cancelled migration: the source resumes and works.
    src.resume(&bases).unwrap();
    Verbs::new(&mut src)
        .query_port(1)
        .expect("the source after resuming");
    drop(src);
    d.wait_released(0);

    let mut dst = vm0(&d);
    let bases = dst.stop_queues().unwrap();
    assert!(load(&mut dst, &state).unwrap(), "LOAD of the saved state");
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
    dst.resume(&bases).unwrap();
    Verbs::new(&mut dst)
        .query_port(1)
        .expect("the destination after LOAD");
    others.round();

    // The destination saves again what it loaded (a migration back).
    let bases = dst.stop_queues().unwrap();
    let again = save(&mut dst).unwrap();
    let resaved = decode(&again, state_bound(&Limits::default())).unwrap();
    assert_eq!(resaved.vm, saved.vm);
    assert_eq!(resaved.guid, saved.guid);
    assert_eq!(resaved.features, saved.features);
    dst.resume(&bases).unwrap();
    Verbs::new(&mut dst).query_port(1).unwrap();
}

#[test]
fn a_state_loads_only_into_the_vm_that_saved_it() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::start(2).unwrap();
    let mut a = vm0(&d);
    a.stop_queues().unwrap();
    let state = save(&mut a).unwrap();

    let mut b = d.connect_with(1, migrating_vmm()).unwrap();
    let bases = b.stop_queues().unwrap();
    assert!(!load(&mut b, &state).unwrap(), "VM 0's state into VM 1");
    assert!(!check(&mut b).unwrap(), "the failure stays the last result");
    b.resume(&bases).unwrap();
    Verbs::new(&mut b).query_port(1).expect("VM 1 unchanged");
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
}

/// Spec 20.1: `SAVE` and `LOAD` only while the device is stopped.
#[test]
fn a_started_device_is_neither_saved_nor_loaded() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::start(3).unwrap();
    let mut others = Bystanders::new(&d);
    let mut vmm = vm0(&d);
    Verbs::new(&mut vmm).query_port(1).unwrap();

    let (r, w) = pipe().unwrap();
    let ino = inode(&r);
    assert!(!set_state_fd(&mut vmm, VhostTransferStateDirection::SAVE, w).unwrap());
    assert!(!check(&mut vmm).unwrap());
    // Refused without keeping the descriptor.
    assert_eq!(pipe_descriptors(ino), 1);
    drop(r);

    let (r, w) = pipe().unwrap();
    let ino = inode(&w);
    assert!(!set_state_fd(&mut vmm, VhostTransferStateDirection::LOAD, r).unwrap());
    assert!(!check(&mut vmm).unwrap());
    assert_eq!(pipe_descriptors(ino), 1);

    // The device still runs, and so do the others.
    Verbs::new(&mut vmm).query_port(1).unwrap();
    others.round();
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
}

/// The migration within one daemon as QEMU's front-ends carry it (spec
/// 20.1, 20.5): the source's front-end saves VM A's state through its
/// socket, the destination's front-end loads it through the standby's
/// socket, and A's RC connection to B goes on: B's WRITE posted in the
/// blackout lands, A's QP keeps its number, the old instance keeps nothing.
#[test]
fn a_vm_moves_to_its_standby_through_the_sockets() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::with_standby(2).unwrap();
    let a = Vm::open(&d, 0, migrating_vmm());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let p = rc_pair_with(&a, &b, fast);
    let abuf = Buf::new(&a, 8192);
    let bbuf = Buf::new(&b, 8192);
    bbuf.write(0, b"from B, held");
    abuf.write(0, b"from A, moved");
    let qpn = p.qa.qpn();

    let bases = a.t.vmm().stop_queues().unwrap();
    let state = save(&mut *a.t.vmm()).unwrap();
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
    p.qb.post_send(&[wr(2, write_op(&abuf, 4096), &[bbuf.sge(0, 12)])])
        .unwrap();
    let mut loaded = None;
    a.t.vmm()
        .move_to_via(d.socket(2), &bases, |conn| {
            loaded = Some(load(conn, &state)?);
            Ok(())
        })
        .unwrap();
    assert_eq!(loaded, Some(true), "LOAD into the standby");
    ok(&poll_one(&p.cqb), 2, WcOpcode::RDMA_WRITE);
    assert_eq!(abuf.read(4096, 12), b"from B, held");
    assert_eq!(p.qa.qpn(), qpn);
    assert!(
        d.stats(0).device.resources.is_empty(),
        "the old instance kept objects"
    );
    p.qa.post_send(&[wr(3, write_op(&bbuf, 6000), &[abuf.sge(0, 13)])])
        .unwrap();
    ok(&poll_one(&p.cqa), 3, WcOpcode::RDMA_WRITE);
    assert_eq!(bbuf.read(6000, 13), b"from A, moved");
    assert!(transfer_threads().is_empty(), "{:?}", transfer_threads());
}

#[test]
fn check_without_a_transfer_fails() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = TestDaemon::start(1).unwrap();
    let mut vmm = vm0(&d);
    assert!(!check(&mut vmm).unwrap());
    Verbs::new(&mut vmm).query_port(1).unwrap();
}
