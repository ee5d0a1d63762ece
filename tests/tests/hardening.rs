#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Regression tests for the findings of the hostile-guest review (issue
//! 11): each scenario is one an attacker could drive, and each test fails
//! on the daemon as it was before its fix.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vhost_user_rdma::rnic::soft::SoftRnic;
use vhost_user_rdma::rnic::{Rnic, RnicCaps, RnicError};
use vhost_user_rdma_tests::dp::{conn, ok, poll_one, rc_pair, rc_qp, wr, Buf, Vm, QP_ACCESS};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_driver::{Cq, RecvWr, SendOp};

/// Runs `f` on its own thread and fails the test if it has not finished
/// within `limit` — a hung engine must fail the test, not hang it (the
/// stuck thread is left behind; the process ends after the tests).
fn bounded(limit: Duration, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => t.join().expect("scenario thread"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The scenario panicked: report its message.
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no progress in {limit:?}"),
    }
}

/// A host RNIC engine that hands back the QP number freed last, so that a
/// test can make a QP number come back at once (the software RNIC draws
/// them at random: an attacker needs thousands of creates for the same).
struct ReuseRnic {
    caps: RnicCaps,
    inner: Mutex<ReuseInner>,
}

#[derive(Default)]
struct ReuseInner {
    used: HashMap<u32, Option<(usize, u32)>>,
    freed: Vec<u32>,
    next: u32,
}

impl ReuseRnic {
    fn new() -> Self {
        ReuseRnic {
            caps: SoftRnic::new().expect("soft RNIC").caps(),
            inner: Mutex::new(ReuseInner {
                next: 0x100,
                ..ReuseInner::default()
            }),
        }
    }
}

impl Rnic for ReuseRnic {
    fn name(&self) -> &'static str {
        "reuse"
    }
    fn caps(&self) -> RnicCaps {
        self.caps
    }
    fn alloc_qpn(&self) -> Result<u32, RnicError> {
        let mut i = self.inner.lock().unwrap();
        let qpn = match i.freed.pop() {
            Some(q) => q,
            None => {
                i.next += 1;
                i.next
            }
        };
        i.used.insert(qpn, None);
        Ok(qpn)
    }
    fn bind_qpn(&self, qpn: u32, vm: usize, handle: u32) {
        if let Some(s) = self.inner.lock().unwrap().used.get_mut(&qpn) {
            *s = Some((vm, handle));
        }
    }
    fn lookup_qpn(&self, qpn: u32) -> Option<(usize, u32)> {
        self.inner.lock().unwrap().used.get(&qpn).copied().flatten()
    }
    fn free_qpn(&self, qpn: u32) {
        let mut i = self.inner.lock().unwrap();
        if i.used.remove(&qpn).is_some() {
            i.freed.push(qpn);
        }
    }
    fn qpns_in_use(&self) -> usize {
        self.inner.lock().unwrap().used.len()
    }
}

/// Finding 2: A's RC QP has sent to B's QP, so the engine routes its next
/// message to that QP of VM B and locks B for the burst. B destroys the QP
/// and its number comes back on a new QP of B. The route is stale, the
/// number is looked up afresh — and belongs to VM B again, whose lock the
/// engine already holds. It must deliver through that lock (the engine
/// locked B a second time and hung for good, with every VM's data path,
/// the control paths that wait on it, metrics and shutdown).
#[test]
fn qpn_reused_by_the_held_peer_vm_does_not_deadlock_the_engine() {
    bounded(Duration::from_secs(60), "engine", || {
        let d = TestDaemon::with_rnic(2, Arc::new(ReuseRnic::new())).unwrap();
        let a = Vm::open(&d, 0, VmmOptions::default());
        let b = Vm::open(&d, 1, VmmOptions::default());
        let p = rc_pair(&a, &b);
        let src = Buf::new(&a, 4096);
        let dst = Buf::new(&b, 4096);
        src.write(0, b"first");
        // One message, so the engine has a route to B's QP.
        p.qb.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[dst.sge(0, 64)],
        }])
        .unwrap();
        p.qa.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 5)])])
            .unwrap();
        ok(&poll_one(&p.cqa), 1, WcOpcode::SEND);
        ok(&poll_one(&p.cqb), 1, WcOpcode::RECV);

        // B's QP goes; a new QP of B gets its number.
        let old = p.qb.qpn();
        p.qb.destroy().unwrap();
        let cq2 = Cq::create(&b.dev, 64).unwrap();
        let qb2 = rc_qp(&b, &cq2);
        assert_eq!(qb2.qpn(), old, "the test engine reuses the number");
        qb2.rc_connect(QP_ACCESS, &conn(&p.qa, &a)).unwrap();
        qb2.post_recv(&[RecvWr {
            wr_id: 2,
            sg_list: &[dst.sge(64, 64)],
        }])
        .unwrap();

        // A's next SEND goes to the QP that has the number now.
        src.write(0, b"second");
        p.qa.post_send(&[wr(2, SendOp::Send, &[src.sge(0, 6)])])
            .unwrap();
        ok(&poll_one(&p.cqa), 2, WcOpcode::SEND);
        ok(&poll_one(&cq2), 2, WcOpcode::RECV);
        assert_eq!(dst.read(64, 6), b"second");
        // The daemon still answers control commands of both VMs.
        assert!(d.stats(0).connected && d.stats(1).connected);
        drop(qb2);
        drop(p.qa);
    });
}
