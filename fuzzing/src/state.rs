//! Target `state`: a hostile VMM's device state (issue 30, spec 20.3).
//!
//! One daemon per process. VM 1 runs with objects of its own (so that QP
//! numbers and keys are taken on the RNIC); VM 0 is connected by a test VMM
//! and stopped, with no object: a destination before it loads a state. Each
//! input is the *body* of a state: the harness frames it with a correct
//! header and checksum, so that libFuzzer's mutations reach the decoder and
//! every check behind it rather than die at the checksum, and loads it into
//! VM 0 (`RdmaDevice::load_state`, what `SET_DEVICE_STATE_FD` runs).
//!
//! Invariants: a refused state leaves VM 0 without objects and the RNIC's
//! QP numbers and keys as they were; a loaded one saves again to the same
//! objects (the load kept what it checked, and invented nothing); the
//! device then starts and serves whatever the state holds (its rings are
//! in VM 0's zeroed RAM, its indices the state's) until a reset, after
//! which every number and key is back and VM 1 still answers.

use std::sync::{Mutex, MutexGuard, PoisonError};

use vhost_user_rdma::migration::decode;
use vhost_user_rdma::migration::format::{frame, HEADER_LEN};
use vhost_user_rdma::migration::state::DeviceState;
use vhost_user_rdma_tests::dp::{connect, rc_qp, Buf, Vm};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_driver::Cq;

/// The daemon of the process, the destination's VMM and VM 1 (whose
/// driver objects go before the daemon).
struct World {
    _bystander: (virtio_rdma_driver::Qp, Buf, std::sync::Arc<Cq>, Vm),
    dest: (TestVmm, Vec<u32>),
    daemon: TestDaemon,
}

/// The world of the process, made by the first input; [`release`] ends it.
static WORLD: Mutex<Option<World>> = Mutex::new(None);

fn make_world() -> World {
    {
        let daemon = TestDaemon::start(2).expect("start the daemon");
        let b = Vm::open(&daemon, 1, VmmOptions::default());
        let cq = Cq::create(&b.dev, 16).expect("VM 1's CQ");
        let qp = rc_qp(&b, &cq);
        let buf = Buf::new(&b, 4096);
        let mut dest = daemon.connect(0).expect("connect VM 0");
        let bases = dest.stop_queues().expect("stop VM 0");
        World {
            _bystander: (qp, buf, cq, b),
            dest: (dest, bases),
            daemon,
        }
    }
}

/// Ends the process's world (its daemon and VMMs): the replay test's
/// other harnesses count the process's threads and descriptors.
pub fn release() {
    drop(lock(&WORLD).take());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The objects of a state, with the times of retry waits left out (they
/// run between a load and a save).
fn objects_of(mut s: DeviceState) -> vhost_user_rdma::migration::state::Objects {
    for (_, q) in &mut s.objects.qps.live {
        if let Some(w) = &mut q.rt.wait {
            w.left_us = 0;
            w.held_us = w.held_us.map(|_| 0);
        }
    }
    s.objects
}

/// Runs one input: the body of a state.
pub fn run(body: &[u8]) {
    run_loaded(body);
}

/// [`run`], telling whether the state loaded.
pub fn run_loaded(body: &[u8]) -> bool {
    let mut guard = lock(&WORLD);
    let w = guard.get_or_insert_with(make_world);
    let d = w.daemon.daemon();
    let dev = d.device(0).expect("VM 0's device").clone();
    let (qpns, keys) = (d.qpns_in_use(), d.keys_in_use());
    let bytes = frame(body);
    let dest = &mut w.dest;
    let loaded = dev.load_state(&bytes).is_ok();
    match loaded {
        false => {
            let left = w.daemon.stats(0).device.resources;
            assert!(left.is_empty(), "a refused state left objects: {left:?}");
            assert_eq!(
                (d.qpns_in_use(), d.keys_in_use()),
                (qpns, keys),
                "a refused state left QP numbers or keys taken"
            );
        }
        true => {
            let loaded = decode(&bytes, dev.state_bound()).expect("a loaded state decodes");
            let again = dev.save_state().expect("a loaded state saves again");
            let again = decode(&again, dev.state_bound()).expect("a saved state decodes");
            assert_eq!(
                objects_of(again),
                objects_of(loaded),
                "the instance does not hold what it loaded"
            );
            // Serve it: the engine meets the state's queues and indices.
            let (vmm, bases) = dest;
            vmm.resume(bases).expect("start VM 0 with the loaded state");
            let mut v = Verbs::new(vmm);
            let _ = v.query_device();
            drop(v);
            *bases = vmm.reset().expect("reset VM 0");
            *bases = vmm.stop_queues().expect("stop VM 0 again");
            let left = w.daemon.stats(0).device.resources;
            assert!(left.is_empty(), "a reset left objects: {left:?}");
            assert_eq!(
                (d.qpns_in_use(), d.keys_in_use()),
                (qpns, keys),
                "a reset of a loaded state left QP numbers or keys taken"
            );
        }
    }
    // VM 1 is unharmed.
    assert_eq!(w.daemon.stats(1).device.resources.qp, 1, "VM 1 lost its QP");
    loaded
}

/// Bodies of valid states, for the seed corpus: VM 0 of a daemon like the
/// harness's, saved with its objects (RC QPs connected to each other, a
/// registered buffer, a posted receive).
pub fn seed_bodies() -> Vec<Vec<u8>> {
    let daemon = TestDaemon::start(2).expect("start a daemon");
    let a = Vm::open(&daemon, 0, VmmOptions::default());
    let cq = Cq::create(&a.dev, 64).expect("a CQ");
    let (q1, q2) = (rc_qp(&a, &cq), rc_qp(&a, &cq));
    connect(&a, &q1, &a, &q2);
    let buf = Buf::new(&a, 8192);
    q2.post_recv(&[virtio_rdma_driver::RecvWr {
        wr_id: 1,
        sg_list: &[buf.sge(0, 64)],
    }])
    .expect("post a receive");
    let mut out = Vec::new();
    let dev = daemon.daemon().device(0).expect("VM 0").clone();
    let bases = a.t.vmm().stop_queues().expect("stop");
    let state = dev.save_state().expect("save");
    out.push(state[HEADER_LEN..].to_vec());
    a.t.vmm().resume(&bases).expect("resume");
    // A second one with fewer objects.
    drop((q1, q2));
    let bases = a.t.vmm().stop_queues().expect("stop");
    let state = dev.save_state().expect("save");
    out.push(state[HEADER_LEN..].to_vec());
    a.t.vmm().resume(&bases).expect("resume");
    drop((buf, cq));
    out
}
