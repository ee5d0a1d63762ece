//! A VM that drops its vhost-user connection in the middle of traffic fails
//! its peers' QPs towards it and no other (spec 15.2, 18.20, 18.24).

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::dp::{
    assert_no_event, assert_quiet, assert_state, collect_events, failed, ok, open, pattern,
    poll_one, recv, sges, sorted, vms, wait_state, wr, write_op, Buf, Pair, Vm, GUARD, WAIT,
};
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{SendOp, SendWr};

use crate::fixtures::rc_pair;

/// WRITE then SEND back and forth on `p` until `stop`; every byte checked.
/// Returns (rounds, rounds started after `gone` was set).
fn ping_pong_until(
    a: &Vm,
    b: &Vm,
    p: &Pair,
    seed: u64,
    stop: &AtomicBool,
    gone: &AtomicBool,
) -> (u64, u64) {
    let (ba, bb) = (Buf::guarded(a, 65536), Buf::guarded(b, 65536));
    let (mut i, mut after) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        if gone.load(Ordering::Relaxed) {
            after += 1;
        }
        let len = 1 + (i as usize * 7919) % 65535;
        let data = pattern(len, seed * 1_000_000 + i);
        ba.write(0, &data);
        let sg = sges(&ba, 0, len);
        p.qa.post_send(&[wr(i, write_op(&bb, 0), &sg)]).unwrap();
        ok(&poll_one(&p.cqa), i, WcOpcode::RDMA_WRITE);
        assert_eq!(bb.read(0, len), data, "round {i}");
        recv(&p.qa, i, &[ba.sge(0, 65536)]);
        let n = len.min(4096);
        let sg = sges(&bb, 0, n);
        p.qb.post_send(&[wr(i, SendOp::Send, &sg)]).unwrap();
        ok(&poll_one(&p.cqb), i, WcOpcode::SEND);
        let r = poll_one(&p.cqa);
        ok(&r, i, WcOpcode::RECV);
        assert_eq!(r.byte_len as usize, n);
        assert_eq!(ba.read(0, n), data[..n]);
    }
    (i, after)
}

/// Five VMs: pairs (0,1) and (2,3) exchange checked traffic while VM 4 —
/// with big RDMA WRITEs into VMs 0 and 2 just posted, and VM 0 writing into
/// it — drops its vhost-user connection. The pairs keep exchanging correct
/// data; VM 0's QP towards the vanished VM fails with `RETRY_EXC_ERR` (its
/// peer QP no longer exists, spec 15.2, 18.20, 18.24) and only that QP; the
/// bytes around the region VM 4 was writing are untouched; the daemon
/// releases VM 4 and a new VM on the same socket works with the others.
#[test]
fn vm_disconnect_mid_transfer() {
    const BIG: usize = 1 << 20;
    let (d, mut vm) = vms(5);
    // Nothing of VM 4 is ever dropped: once it is disconnected, destroy
    // commands could only time out. Its objects (and the pairs that have
    // a side on it) stay leaked.
    let victim = ManuallyDrop::new(vm.pop().unwrap());
    let p01 = rc_pair(&vm[0], &vm[1]);
    let p23 = rc_pair(&vm[2], &vm[3]);
    // VM 0 -> VM 4 (VM 0 is the requester), VM 4 -> VMs 0 and 2.
    let p04 = ManuallyDrop::new(rc_pair(&vm[0], &victim));
    let p40 = ManuallyDrop::new(rc_pair(&victim, &vm[0]));
    let p42 = ManuallyDrop::new(rc_pair(&victim, &vm[2]));
    let sink0 = Buf::guarded(&vm[0], BIG + 4096);
    let sink2 = Buf::guarded(&vm[2], BIG + 4096);
    let vsrc = ManuallyDrop::new(Buf::guarded(&victim, BIG));
    vsrc.write(0, &pattern(BIG, 4));
    let vdst = ManuallyDrop::new(Buf::guarded(&victim, 65536));
    let probe = Buf::guarded(&vm[0], 65536);
    let (stop, gone) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let (stop, gone, vm) = (&stop, &gone, &vm);
        let h01 = s.spawn(|| ping_pong_until(&vm[0], &vm[1], &p01, 1, stop, gone));
        let h23 = s.spawn(|| ping_pong_until(&vm[2], &vm[3], &p23, 2, stop, gone));
        // VM 0 keeps writing into VM 4 until that fails.
        let prober = s.spawn(|| {
            let deadline = Instant::now() + WAIT;
            let mut i = 0u64;
            loop {
                assert!(Instant::now() < deadline, "writes into VM 4 never failed");
                i += 1;
                let len = 1 + (i as usize * 4099) % 65535;
                let data = pattern(len, 50_000 + i);
                probe.write(0, &data);
                let sg = sges(&probe, 0, len);
                p04.qa.post_send(&[wr(i, write_op(&vdst, 0), &sg)]).unwrap();
                let wc = poll_one(&p04.cqa);
                if wc.is_success() {
                    ok(&wc, i, WcOpcode::RDMA_WRITE);
                    assert_eq!(vdst.read(0, len), data, "write {i} into VM 4");
                    continue;
                }
                assert!(
                    gone.load(Ordering::Acquire),
                    "write {i} failed early: {wc:?}"
                );
                // The device knows VM 4 is gone: the QP fails and its
                // work is flushed rather than retried (spec 18.23).
                failed(&wc, i, WcStatus::WR_FLUSH_ERR);
                return i;
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        // VM 4: a burst of big writes, then the connection goes away.
        let sg = sges(&vsrc, 0, BIG);
        let burst: Vec<SendWr<'_>> = (0..8).map(|k| wr(k, write_op(&sink0, 0), &sg)).collect();
        p40.qa.post_send(&burst).unwrap();
        let burst: Vec<SendWr<'_>> = (0..8).map(|k| wr(k, write_op(&sink2, 0), &sg)).collect();
        p42.qa.post_send(&burst).unwrap();
        gone.store(true, Ordering::Release);
        victim.t.vmm().disconnect();
        let probes = prober.join().unwrap();
        assert!(probes > 1, "VM 0 never reached VM 4");
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        for (name, h) in [("0-1", h01), ("2-3", h23)] {
            let (rounds, after) = h.join().unwrap();
            assert!(rounds > 10, "pair {name}: {rounds} rounds");
            assert!(
                after > 3,
                "pair {name}: {after} rounds after the disconnect"
            );
        }
    });
    // Exactly the QPs connected to VM 4 failed, each with QP_FATAL, and
    // work posted to them now is flushed.
    for q in [&p04.qa, &p40.qb, &p42.qb] {
        wait_state(q, QpState::ERR);
    }
    p04.qa
        .post_send(&[wr(99, write_op(&probe, 0), &[])])
        .unwrap();
    failed(&poll_one(&p04.cqa), 99, WcStatus::WR_FLUSH_ERR);
    for q in [&p01.qa, &p01.qb, &p23.qa, &p23.qb] {
        assert_state(q, QpState::RTS);
    }
    let fatal = Some(EventKind::QP_FATAL);
    assert_eq!(
        collect_events(&vm[0].dev, 2),
        sorted(vec![(fatal, p04.qa.handle()), (fatal, p40.qb.handle())])
    );
    assert_eq!(
        collect_events(&vm[2].dev, 1),
        vec![(fatal, p42.qb.handle())]
    );
    // The victim's writes touched nothing past their range; its targets
    // completed nothing.
    sink0.assert_untouched(BIG, 4096, "past VM 4's writes into VM 0");
    sink2.assert_untouched(BIG, 4096, "past VM 4's writes into VM 2");
    assert_quiet(&p40.cqb);
    assert_quiet(&p42.cqb);
    for (i, v) in vm.iter().enumerate() {
        assert_no_event(&v.dev, &format!("VM {i}"));
    }
    // The daemon released VM 4 and serves a new VM on its socket.
    let s = d.wait_released(4);
    assert!(!s.connected, "{s:?}");
    assert!(s.device.resources.is_empty(), "{s:?}");
    let fresh = open(&d, 4);
    assert_eq!(d.stats_connected(4, 2).connections, 2);
    for peer in [0, 2] {
        let p = rc_pair(&vm[peer], &fresh);
        let (bp, bf) = (Buf::guarded(&vm[peer], 8192), Buf::guarded(&fresh, 8192));
        let data = pattern(6000, 600 + peer as u64);
        bp.write(0, &data);
        p.qa.post_send(&[wr(2, write_op(&bf, 100), &sges(&bp, 0, 6000))])
            .unwrap();
        ok(&poll_one(&p.cqa), 2, WcOpcode::RDMA_WRITE);
        assert_eq!(bf.read(100, 6000), data);
        bp.write(0, &[GUARD; 6000]);
        recv(&p.qa, 1, &sges(&bp, 0, 8192));
        p.qb.post_send(&[wr(3, SendOp::Send, &sges(&bf, 100, 6000))])
            .unwrap();
        ok(&poll_one(&p.cqb), 3, WcOpcode::SEND);
        let r = poll_one(&p.cqa);
        ok(&r, 1, WcOpcode::RECV);
        assert_eq!(r.byte_len, 6000);
        assert_eq!(bp.read(0, 6000), data);
    }
}
