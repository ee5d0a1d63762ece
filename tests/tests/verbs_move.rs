#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A VM with live RC connections moves between daemons on the libibverbs
//! transport (spec 20.8): its QP numbers and keys stay (virtual over the
//! destination's new host objects), its peer's daemon holds the
//! connection while it moves and points it at the new host QP from the
//! move record, and traffic goes on both ways with every byte checked and
//! no error completion.
//!
//! The move tests need a host RNIC (`VUR_TEST_RNIC`; `scripts/qemu-rxe.sh`
//! runs them on Linux soft-RoCE in a guest); both daemons run on the same
//! host device, so the GID stays and everything else of a move between
//! hosts happens: new host QP numbers and keys, PSNs carried over, the
//! peer's host QP pointed anew through RESET. The refusals of the
//! software RNIC run everywhere.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vhost_user_rdma::mgmt::api::handle_line;
use vhost_user_rdma::migration::{decode, encode, state_bound, MigrationError};
use vhost_user_rdma::relocation::{HostQpState, HostState};
use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::dp::{
    assert_quiet_for, assert_state, checked_round, ok, poll_one, rc_pair, wr, write_op, Buf, Vm,
};
use vhost_user_rdma_tests::harness::{on_host_rnic, TestDaemon, RNIC_ENV};
use vhost_user_rdma_tests::state_transfer::{load, migrating_vmm, save};
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_abi::qp::QpState;

/// One request to `d`'s management API, in process; its answer.
fn api(d: &TestDaemon, req: Value) -> Value {
    let answer = handle_line(&d.daemon().view(), req.to_string().as_bytes());
    serde_json::from_str(&answer).unwrap()
}

fn gid_text(gid: [u8; 16]) -> String {
    std::net::Ipv6Addr::from(gid).to_string()
}

#[test]
fn a_vm_moves_to_another_daemon_and_its_peer_keeps_the_connection() {
    if !on_host_rnic() {
        eprintln!("skipped: moves between daemons need a host RNIC ({RNIC_ENV})");
        return;
    }
    // The daemons' lines (the moves' PSNs and QP numbers) on stderr.
    vhost_user_rdma::logging::init(vhost_user_rdma::logging::LogFormat::Text);
    let da = TestDaemon::start(2).unwrap();
    let db = TestDaemon::start(1).unwrap();
    let m = Vm::open(&da, 0, migrating_vmm());
    let p = Vm::open(&da, 1, VmmOptions::default());
    let pair = rc_pair(&m, &p);
    let mbuf = Buf::new(&m, 16384);
    let pbuf = Buf::new(&p, 16384);
    for seq in 1..=5 {
        checked_round(&pair, &mbuf, &pbuf, seq);
    }
    let qpn = pair.qa.qpn();
    // How the moving VM's QPs are known on the wire: created on this
    // daemon, by the host's own numbers.
    let wire = api(&da, json!({"cmd": "wire_qps", "vm": "vm0"}));
    assert_eq!(wire["qps"], json!([[qpn, qpn]]), "{wire}");
    assert_eq!(wire["gid"], gid_text(m.dev.gid()));

    // The peer's daemon holds its connection to the moving QP.
    let held = api(
        &da,
        json!({"cmd": "peer_hold", "gid": wire["gid"], "qpns": [wire["qps"][0][1]]}),
    );
    assert_eq!(held["held"], 1, "{held}");

    // The source stops and saves; what the peer posts now waits.
    let stopped = Instant::now();
    let bases = m.t.vmm().stop_queues().unwrap();
    let state = save(&mut *m.t.vmm()).unwrap();
    let saved = stopped.elapsed();
    // A hand-over to a new daemon process cannot take host objects along
    // (spec 20.7): refused, and the migration's state is unaffected.
    let dev = da.daemon().device(0).unwrap().clone();
    assert!(
        matches!(dev.save_for_hand_over(), Err(MigrationError::NotSavable(m)) if m.contains("hand-over")),
        "a hand-over of host RNIC objects"
    );
    let mut decoded = decode(&state, u64::MAX).unwrap();
    let host = decoded.host.as_mut().expect("a state with host halves");
    let entry = host.qp(qpn).expect("the QP's host half").clone();
    assert_eq!(
        entry.host_qpn, qpn,
        "created on the source: its number is the host's"
    );
    assert_eq!(entry.dest, Some((p.dev.gid(), pair.qb.qpn())));
    // What a hostile front-end could change on the way: where the QP's
    // requests go and how its rkeys translate. The destination takes
    // neither from the state (the move below works only if so).
    for q in host.qps.iter_mut() {
        q.dest = Some(([0xaa; 16], 0x00ab_cdef));
        q.rkeys = vec![(pbuf.mr.rkey(), 0x1234_5678)];
    }
    let state = encode(&decoded).unwrap();
    pbuf.write(8192, b"from P, held while M moved");
    pair.qb
        .post_send(&[wr(100, write_op(&mbuf, 12288), &[pbuf.sge(8192, 26)])])
        .unwrap();
    assert_quiet_for(&pair.cqb, Duration::from_millis(300));

    // The destination loads it (the source's connection then closes).
    let loading = Instant::now();
    m.t.vmm()
        .move_to_via(db.socket(0), &bases, |conn| {
            assert!(load(conn, &state)?, "LOAD refused");
            Ok(())
        })
        .unwrap();
    let loaded = loading.elapsed();
    let rec = api(&db, json!({"cmd": "move_record", "vm": "vm0"}));
    assert_eq!(rec["ok"], true, "{rec}");
    let record = rec["record"].clone();
    let moved = record["qps"].as_array().unwrap();
    assert_eq!(moved.len(), 1, "{record}");
    assert_eq!(moved[0][0], qpn);
    assert!(!record["rkeys"].as_array().unwrap().is_empty(), "{record}");

    let wire = api(&db, json!({"cmd": "wire_qps", "vm": "vm0"}));
    assert_eq!(wire["qps"], json!([[qpn, moved[0][1]]]), "{wire}");

    // A record naming QPs no hold named re-points nothing.
    let bogus = json!({"vm": "vm0", "from_gid": gid_text(p.dev.gid()), "to_gid": wire["gid"],
        "qps": [[pair.qb.qpn(), moved[0][1]]], "rkeys": []});
    let r = api(&da, json!({"cmd": "peer_moved", "record": bogus}));
    assert_eq!(r["ok"], false, "a record for a destination never held: {r}");

    // The peer's daemon points the connection at the new host QP.
    let told = Instant::now();
    let r = api(&da, json!({"cmd": "peer_moved", "record": record}));
    assert_eq!(r["repointed"], 1, "{r}");
    ok(&poll_one(&pair.cqb), 100, WcOpcode::RDMA_WRITE);
    // What the peer saw, and its parts (the test's 300 ms of checking that
    // the held WRITE waits are in the blackout, not in the parts).
    eprintln!(
        "verbs-move: blackout {} ms (stop to the held WRITE's completion): stop and save {} ms, \
         load {} ms, record to completion {} ms",
        stopped.elapsed().as_millis(),
        saved.as_millis(),
        loaded.as_millis(),
        told.elapsed().as_millis()
    );
    assert_eq!(mbuf.read(12288, 26), b"from P, held while M moved");
    assert_eq!(pair.qa.qpn(), qpn, "the QP number the guest knows stays");

    // And both ways from then on, every byte checked.
    for seq in 6..=30 {
        checked_round(&pair, &mbuf, &pbuf, seq);
    }
    assert_state(&pair.qa, QpState::RTS);
    assert_state(&pair.qb, QpState::RTS);
    assert!(
        da.stats(0).device.resources.is_empty(),
        "the source kept objects"
    );
}

/// The software RNIC has no host halves: a state that has them is
/// refused, and the management API's move commands say why.
#[test]
fn the_software_rnic_refuses_host_halves_and_has_no_moves() {
    if on_host_rnic() {
        return;
    }
    let d = TestDaemon::start(2).unwrap();
    // The destination outlives the VM that moves to it.
    let d2 = TestDaemon::start(1).unwrap();
    let hold = api(&d, json!({"cmd": "peer_hold", "gid": "::1", "qpns": [17]}));
    assert_eq!(hold["held"], 0, "{hold}");
    let moved = api(
        &d,
        json!({"cmd": "peer_moved", "record": {"vm": "x", "from_gid": "::1",
            "to_gid": "::2", "qps": [[17, 18]], "rkeys": []}}),
    );
    assert_eq!(moved["ok"], false, "{moved}");
    let rec = api(&d, json!({"cmd": "move_record", "vm": "vm0"}));
    assert_eq!(rec["ok"], false, "{rec}");
    let wire = api(&d, json!({"cmd": "wire_qps", "vm": "vm0"}));
    assert_eq!(wire["ok"], false, "{wire}");
    for bad in [
        json!({"cmd": "peer_hold", "gid": "not a gid", "qpns": [17]}),
        json!({"cmd": "peer_hold", "gid": "::1", "qpns": []}),
        json!({"cmd": "peer_hold", "gid": "::1", "qpns": [17], "ms": 600_001}),
        json!({"cmd": "peer_hold", "gid": "::1", "qpns": [17], "extra": 1}),
        json!({"cmd": "peer_moved", "record": {"vm": "x", "from_gid": "::1", "to_gid": "::2",
            "qps": [[17, 18], [17, 19]], "rkeys": []}}),
    ] {
        let a = api(&d, bad.clone());
        assert_eq!(a["ok"], false, "{bad} -> {a}");
    }

    // A state saved here, given host halves, is refused by this daemon.
    let m = Vm::open(&d, 0, migrating_vmm());
    let b = Vm::open(&d, 1, VmmOptions::default());
    let _pair = rc_pair(&m, &b);
    let bases = m.t.vmm().stop_queues().unwrap();
    let bytes = save(&mut *m.t.vmm()).unwrap();
    let mut state = decode(&bytes, state_bound(&Limits::default())).unwrap();
    assert!(
        state.host.is_none(),
        "the software RNIC saves no host halves"
    );
    state.host = Some(HostState {
        gid: [1; 16],
        qps: vec![HostQpState {
            qpn: 17,
            host_qpn: 17,
            sq_psn: 0,
            rq_psn: 0,
            dest: None,
            rkeys: Vec::new(),
        }],
    });
    let forged = encode(&state).unwrap();
    let mut loaded = None;
    m.t.vmm()
        .move_to_via(d2.socket(0), &bases, |conn| {
            loaded = Some(load(conn, &forged)?);
            Ok(())
        })
        .unwrap();
    assert_eq!(
        loaded,
        Some(false),
        "a state with host halves loaded on the software RNIC"
    );
    assert!(d2.stats(0).device.resources.is_empty());
}
