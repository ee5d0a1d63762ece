//! The test VMM against the echo backend: handshake, configuration, many
//! requests in flight, framing variants, hostile chains, events, reconnects.

// A test file: helpers panic on failure like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost::vhost_user::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_rdma_tests::ctrl::{Completion, RequestSpec, POISON};
use vhost_user_rdma_tests::echo::{self, echo_config, ECHO_DEVICE_FEATURES};
use vhost_user_rdma_tests::guest_mem::{MemLayout, GIB, MIB};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions, F_EVENT_IDX, F_VERSION_1};
use vhost_user_rdma_tests::vring::{RawDesc, RawNext, Seg, F_NEXT, F_WRITE};
use vhost_user_rdma_tests::Error;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::event::{Event, EventKind};
use vm_memory::GuestAddress;

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vur-tests-{}-{name}.sock", std::process::id()))
}

fn quick() -> VmmOptions {
    VmmOptions {
        timeout: Duration::from_secs(5),
        ..VmmOptions::default()
    }
}

fn assert_echo(c: &Completion) {
    assert_eq!(c.used_len, 16, "{c:?}");
    assert_eq!(c.status, u32::from(Status::OK), "{c:?}");
    assert_eq!(c.detail, 0);
    assert_eq!(c.resp_request_id, c.request_id);
    assert!(c.payload.is_empty());
    assert!(c.is_ok());
}

#[test]
fn handshake_features_and_config() {
    let be = echo::spawn(sock("handshake")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    assert_eq!(vm.backend_queues(), 3);
    let f = vm.features();
    assert_ne!(f & F_VERSION_1, 0);
    assert_ne!(f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
    assert_eq!(f & F_EVENT_IDX, 0, "event_idx is off by default");
    assert_eq!(f & ECHO_DEVICE_FEATURES, ECHO_DEVICE_FEATURES);
    assert!(vm.protocol_features().contains(
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
    ));
    assert_eq!(vm.config().unwrap(), echo_config());
    // A partial read of configuration space.
    let part = vm.config_bytes(4, 8).unwrap();
    assert_eq!(part, echo_config_bytes()[4..12]);
    assert_eq!(vm.events().posted(), 32);
    assert_eq!(be.stats().connections.load(Ordering::Relaxed), 1);
}

fn echo_config_bytes() -> Vec<u8> {
    use virtio_rdma_abi::Wire;
    echo_config().to_bytes()
}

/// Keeps `depth` requests in flight until `total` have completed; checks
/// every completion echoes its own id exactly once.
fn pipelined(vm: &mut TestVmm, total: usize, depth: usize) -> Duration {
    let ctrl = vm.ctrl();
    let mut submitted = 0usize;
    let mut seen = HashSet::new();
    let mut outstanding = HashSet::new();
    let start = Instant::now();
    while seen.len() < total {
        while submitted < total && outstanding.len() < depth {
            // Vary the payload size and the response room a little.
            let payload = vec![submitted as u8; submitted % 97];
            let id = ctrl
                .submit(Opcode::QUERY_DEVICE, &payload, submitted % 3 * 8)
                .unwrap();
            outstanding.insert(id);
            submitted += 1;
        }
        for c in ctrl.wait_any().unwrap() {
            assert_echo(&c);
            assert!(outstanding.remove(&c.token), "unexpected {c:?}");
            assert!(seen.insert(c.request_id), "duplicate {c:?}");
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(ctrl.in_flight(), 0);
    assert!(ctrl.untracked().is_empty());
    assert_eq!(
        ctrl.vring().free_descriptors(),
        usize::from(ctrl.vring().size())
    );
    elapsed
}

#[test]
fn thousand_requests_32_in_flight() {
    let be = echo::spawn(sock("thousand")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    let t = pipelined(&mut vm, 1000, 32);
    eprintln!("1000 echo requests, 32 in flight: {t:?}");
    assert_eq!(be.stats().echoed.load(Ordering::Relaxed), 1000);
    assert_eq!(be.stats().refused.load(Ordering::Relaxed), 0);
}

#[test]
fn thousand_requests_with_event_idx_and_small_ring() {
    let be = echo::spawn(sock("eventidx")).unwrap();
    let opts = VmmOptions {
        event_idx: true,
        queue_size: 64,
        ..quick()
    };
    let mut vm = TestVmm::connect(be.socket_path(), opts).unwrap();
    assert_ne!(vm.features() & F_EVENT_IDX, 0);
    // More in flight than half the ring, with wraparound many times over.
    pipelined(&mut vm, 1000, 32);
    let stats = vm.ctrl().vring().stats();
    assert_eq!(stats.used, 1000);
    eprintln!("event_idx ring stats: {stats:?}");
}

#[test]
fn sequential_calls_and_batched_kick() {
    let be = echo::spawn(sock("sequential")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    let start = Instant::now();
    for _ in 0..200 {
        let c = vm.ctrl().call(Opcode::ALLOC_PD, &[0u8; 8], 0).unwrap();
        assert_echo(&c);
    }
    eprintln!(
        "200 sequential echo calls: {:?} each",
        start.elapsed() / 200
    );

    // Batch: publish 16, one kick.
    let ctrl = vm.ctrl();
    ctrl.set_auto_kick(false);
    let ids: Vec<u64> = (0..16)
        .map(|_| ctrl.submit(Opcode::QUERY_PORT, &[], 0).unwrap())
        .collect();
    ctrl.kick().unwrap();
    for id in ids {
        assert_echo(&ctrl.wait(id).unwrap());
    }
    ctrl.set_auto_kick(true);
    assert!(matches!(
        ctrl.wait(12345),
        Err(Error::UnknownRequest(12345))
    ));
}

#[test]
fn framing_variants_parts_split_and_explicit_ids() {
    let be = echo::spawn(sock("framing")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    let mem = vm.mem().clone();
    let pages = mem.alloc_pages(300, 4096).unwrap();
    let list = vhost_user_rdma_tests::ctrl::page_list_bytes(&pages);
    let ctrl = vm.ctrl();

    // Fixed part + inline page list split across several descriptors.
    let fixed = [7u8; 40];
    let mut parts: Vec<&[u8]> = vec![&fixed];
    parts.extend(vhost_user_rdma_tests::ctrl::split_bytes(&list, 1000));
    assert_echo(&ctrl.call_parts(Opcode::REG_MR, &parts, 8).unwrap());

    // Header alone in the first descriptor, writable split in 4-byte pieces.
    let spec = RequestSpec {
        writable_split: Some(4),
        ..RequestSpec::new(Opcode::CREATE_CQ, &[&[], &[1, 2, 3]], 12)
    };
    let t = ctrl.submit_spec(&spec).unwrap();
    let c = ctrl.wait(t).unwrap();
    assert_echo(&c);

    // Explicit, duplicate and zero request ids.
    let a = RequestSpec {
        request_id: Some(0),
        ..RequestSpec::new(0xdead_u32, &[], 0)
    };
    let b = RequestSpec {
        request_id: Some(0),
        reserved: 5,
        ..RequestSpec::new(Opcode::QUERY_GID, &[], 0)
    };
    let ta = ctrl.submit_spec(&a).unwrap();
    let tb = ctrl.submit_spec(&b).unwrap();
    assert_ne!(ta, tb);
    for t in [tb, ta] {
        let c = ctrl.wait(t).unwrap();
        assert_eq!(c.request_id, 0);
        assert_echo(&c);
    }

    // Writable part too small: the echo returns it with used length 0 and
    // writes nothing.
    let small = RequestSpec {
        writable_len: Some(15),
        ..RequestSpec::new(Opcode::QUERY_DEVICE, &[], 0)
    };
    let t = ctrl.submit_spec(&small).unwrap();
    let c = ctrl.wait(t).unwrap();
    assert_eq!(c.used_len, 0);
    assert_eq!(c.status, u32::MAX, "only 15 poisoned bytes: no header");
    assert!(c.clone().ok().is_err());

    // Large request (several pages in one descriptor).
    let big = vec![0x5a; 3 * 4096 + 5];
    assert_echo(&ctrl.call(Opcode::REG_MR, &big, 4096).unwrap());
    assert_eq!(be.stats().refused.load(Ordering::Relaxed), 1);
}

#[test]
fn hostile_raw_chains_do_not_break_the_queue() {
    let be = echo::spawn(sock("hostile")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    let mem = vm.mem().clone();
    let hole = mem.hole_gpa();
    let req = mem.alloc(4096, 0).unwrap();
    let resp = mem.alloc(4096, 0).unwrap();
    let mut hdr = Vec::new();
    hdr.extend(77u64.to_le_bytes());
    hdr.extend(1u32.to_le_bytes());
    hdr.extend(0u32.to_le_bytes());
    mem.write(req, &hdr).unwrap();
    let ctrl = vm.ctrl();

    // A well-formed raw chain first.
    let good = RawDesc::chain(&[Seg::readable(req, 16), Seg::writable(resp, 16)]);
    let t = ctrl.submit_raw_chain(&good, Some((resp, 16))).unwrap();
    let c = ctrl.wait(t).unwrap();
    assert_eq!((c.used_len, c.resp_request_id, c.status), (16, 77, 0));

    // Readable descriptor in the hole between RAM regions.
    let mut bad = good.clone();
    bad[0].addr = hole;
    // Writable descriptor pointing outside RAM.
    let mut bad_w = good.clone();
    bad_w[1].addr = hole + 0x1000;
    // Writable before readable (the echo does not care, the real device must).
    let swapped = vec![
        RawDesc {
            addr: resp.0,
            len: 16,
            flags: F_WRITE | F_NEXT,
            next: RawNext::Following,
        },
        RawDesc {
            addr: req.0,
            len: 16,
            flags: 0,
            next: RawNext::Following,
        },
    ];
    // A descriptor whose NEXT points to itself.
    let looped = vec![RawDesc {
        addr: req.0,
        len: 16,
        flags: F_NEXT,
        next: RawNext::ListIndex(0),
    }];
    // Length overflowing past the end of a region.
    let mut overflow = good.clone();
    overflow[0].addr = 256 * MIB - 8;
    // NEXT to a slot outside the table.
    let mut out_of_table = good.clone();
    out_of_table[0].next = RawNext::Slot(60000);

    for (name, chain) in [
        ("hole", bad),
        ("writable in hole", bad_w),
        ("swapped", swapped),
        ("loop", looped),
        ("overflow", overflow),
        ("out of table", out_of_table),
    ] {
        let t = ctrl.submit_raw_chain(&chain, Some((resp, 16))).unwrap();
        let c = ctrl.wait(t).unwrap();
        eprintln!("{name}: used_len {} status {:#x}", c.used_len, c.status);
        if name != "swapped" {
            assert_eq!(c.used_len, 0, "{name}");
        }
    }
    // The queue still works.
    pipelined(&mut vm, 100, 8);
    assert!(vm.ctrl().untracked().is_empty());
}

#[test]
fn events_are_delivered_in_order_and_held_without_buffers() {
    let be = echo::spawn(sock("events")).unwrap();
    let opts = VmmOptions {
        event_buffers: 0,
        ..quick()
    };
    let mut vm = TestVmm::connect(be.socket_path(), opts).unwrap();
    let ev = |seq: u32| Event {
        kind: EventKind::CQ_COMPLETION.into(),
        handle: 0x100 + seq,
        detail: 0,
        seq,
    };
    // Injected before any buffer is posted: held by the backend.
    for seq in 1..=5 {
        be.inject_event(ev(seq)).unwrap();
    }
    assert_eq!(
        vm.events().next_event(Duration::from_millis(50)).unwrap(),
        None
    );
    assert_eq!(be.pending_events(), 5);
    vm.events().post_buffers(2).unwrap();
    // Two buffers: with auto-repost, all five arrive, in order.
    for seq in 1..=5 {
        let e = vm.events().next_event(Duration::from_secs(5)).unwrap();
        assert_eq!(e, Some(ev(seq)));
    }
    // More events while buffers are posted.
    for seq in 6..=100 {
        be.inject_event(ev(seq)).unwrap();
    }
    for seq in 6..=100 {
        assert_eq!(
            vm.events().next_event(Duration::from_secs(5)).unwrap(),
            Some(ev(seq))
        );
    }
    assert_eq!(vm.events().posted(), 2);
    assert_eq!(vm.events().stats().events, 100);
    assert_eq!(be.stats().events_delivered.load(Ordering::Relaxed), 100);

    // A short buffer comes back empty.
    vm.events().set_auto_repost(false);
    let _ = vm.events().drain().unwrap();
    // Consume the two full buffers with events, then offer a short one.
    be.inject_event(ev(101)).unwrap();
    be.inject_event(ev(102)).unwrap();
    assert!(vm
        .events()
        .next_event(Duration::from_secs(5))
        .unwrap()
        .is_some());
    assert!(vm
        .events()
        .next_event(Duration::from_secs(5))
        .unwrap()
        .is_some());
    assert_eq!(vm.events().posted(), 0);
    vm.events().post_buffer_with_len(8).unwrap();
    be.inject_event(ev(103)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while vm.events().stats().short == 0 && Instant::now() < deadline {
        assert_eq!(
            vm.events().next_event(Duration::from_millis(20)).unwrap(),
            None
        );
    }
    assert_eq!(vm.events().stats().short, 1);
}

#[test]
fn notify_queue_chains_are_returned() {
    let be = echo::spawn(sock("notify")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    let buf = vm.mem().alloc(4096, 0).unwrap();
    let nq = vm.notify_vring();
    nq.add_chain(&[Seg::readable(buf, 8)]).unwrap();
    nq.notify().unwrap();
    let used = nq.wait_used(Duration::from_secs(5)).unwrap();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].len, 0);
    assert!(used[0].tracked);
}

#[test]
fn reconnect_after_disconnect_and_mid_command_kill() {
    let be = echo::spawn(sock("reconnect")).unwrap();
    for round in 0..5 {
        let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
        assert_echo(&vm.ctrl().call(Opcode::CREATE_CTX, &[], 8).unwrap());
        if round % 2 == 0 {
            // Kill the VM with requests in flight.
            for _ in 0..10 {
                vm.ctrl().submit(Opcode::QUERY_DEVICE, &[], 0).unwrap();
            }
            vm.disconnect();
            assert!(!vm.is_connected());
            assert!(vm.config().is_err());
        }
        // Otherwise just drop it.
    }
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    pipelined(&mut vm, 100, 16);
    assert_eq!(be.stats().connections.load(Ordering::Relaxed), 6);
}

#[test]
fn backend_side_hangup_then_reconnect() {
    let be = echo::spawn(sock("hangup")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    assert_echo(&vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0).unwrap());
    be.drop_connection();
    // The socket is gone: vhost-user messages fail.
    let deadline = Instant::now() + Duration::from_secs(5);
    while vm.config().is_ok() {
        assert!(Instant::now() < deadline, "connection still alive");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(vm);
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    assert_echo(&vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0).unwrap());
}

#[test]
fn connect_waits_for_the_socket() {
    let path = sock("late");
    let _ = std::fs::remove_file(&path);
    let p2 = path.clone();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        echo::spawn(p2).unwrap()
    });
    let mut vm = TestVmm::connect(&path, quick()).unwrap();
    let be = starter.join().unwrap();
    assert_echo(&vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0).unwrap());
    drop(vm);
    be.stop().unwrap();
    assert!(!path.exists(), "socket removed on stop");

    // Nobody listening: a clear error after the timeout.
    let opts = VmmOptions {
        connect_timeout: Duration::from_millis(100),
        ..quick()
    };
    assert!(matches!(
        TestVmm::connect(sock("nobody"), opts),
        Err(Error::Connect { .. })
    ));
}

#[test]
fn stop_with_a_connected_vm() {
    let be = echo::spawn(sock("stopconn")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    assert_echo(&vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0).unwrap());
    let t = Instant::now();
    be.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    let id = vm.ctrl().submit(Opcode::QUERY_DEVICE, &[], 0).unwrap();
    assert!(matches!(
        vm.ctrl().wait_timeout(id, Duration::from_millis(100)),
        Err(Error::Timeout(_))
    ));
}

#[test]
fn big_guest_memory_and_stop_queues() {
    let be = echo::spawn(sock("bigmem")).unwrap();
    let opts = VmmOptions {
        mem: MemLayout::two_regions(2 * GIB, 256 * MIB),
        ..quick()
    };
    let mut vm = TestVmm::connect(be.socket_path(), opts).unwrap();
    let big = vm.mem().alloc(3 * GIB / 2, 2 * MIB).unwrap();
    vm.mem()
        .write(GuestAddress(big.0 + GIB), b"far away")
        .unwrap();
    // A request buffer at the far end of the big allocation.
    let req = GuestAddress(big.0 + 3 * GIB / 2 - 4096);
    let resp = GuestAddress(4 * GIB + 0x10_0000);
    vm.mem().write(req, &42u64.to_le_bytes()).unwrap();
    let chain = RawDesc::chain(&[Seg::readable(req, 16), Seg::writable(resp, 16)]);
    let t = vm
        .ctrl()
        .submit_raw_chain(&chain, Some((resp, 16)))
        .unwrap();
    let c = vm.ctrl().wait(t).unwrap();
    assert_eq!((c.used_len, c.resp_request_id), (16, 42));
    assert_eq!(vm.mem().read_vec(resp, 1).unwrap(), [42]);
    assert_ne!(POISON, 42);
    // GET_VRING_BASE on every queue reports how far the device got.
    let bases = vm.stop_queues().unwrap();
    // One control request consumed; the echo leaves event buffers posted
    // until it has an event.
    assert_eq!(bases, [1, 0, 0]);
}

#[test]
fn reset_restarts_queues_at_new_addresses() {
    for event_idx in [false, true] {
        let be = echo::spawn(sock(&format!("reset-{event_idx}"))).unwrap();
        let opts = VmmOptions {
            event_idx,
            ..quick()
        };
        let mut vm = TestVmm::connect(be.socket_path(), opts).unwrap();
        let free_before = vm.mem().allocator().free_bytes();
        for round in 0..3 {
            let old_desc = vm.ctrl().vring().desc_table();
            pipelined(&mut vm, 100, 16);
            // Leave some in flight: a reset forgets them.
            vm.ctrl().set_auto_kick(false);
            vm.ctrl().submit(Opcode::QUERY_DEVICE, &[], 0).unwrap();
            let bases = vm.reset().unwrap();
            // The 100 answered, and the unkicked one if the backend
            // happened to look at the ring again before the stop.
            assert!(matches!(bases[0], 100 | 101), "round {round}: {bases:?}");
            assert_ne!(vm.ctrl().vring().desc_table(), old_desc);
            assert_eq!(vm.ctrl().in_flight(), 0);
            // Events still flow after the reset.
            be.inject_event(Event {
                kind: EventKind::PORT_ACTIVE.into(),
                handle: 0,
                detail: 0,
                seq: round + 1,
            })
            .unwrap();
            let e = vm.events().next_event(Duration::from_secs(5)).unwrap();
            assert_eq!(e.map(|e| e.seq), Some(round + 1));
        }
        pipelined(&mut vm, 100, 16);
        // Old rings and buffers went back to the allocator.
        let free_after = vm.mem().allocator().free_bytes();
        assert!(
            free_before - free_after < 64 * 4096,
            "{free_before} {free_after}"
        );
    }
}

#[test]
fn busy_poll_completes_calls() {
    let be = echo::spawn(sock("busypoll")).unwrap();
    let mut vm = TestVmm::connect(be.socket_path(), quick()).unwrap();
    vm.ctrl().set_busy_poll(Some(Duration::from_micros(200)));
    let start = Instant::now();
    for _ in 0..200 {
        assert_echo(&vm.ctrl().call(Opcode::QUERY_DEVICE, &[], 0).unwrap());
    }
    eprintln!(
        "200 busy-polled echo calls: {:?} each",
        start.elapsed() / 200
    );
}

#[test]
fn silent_backend_fails_the_handshake_instead_of_hanging() {
    let path = sock("silent");
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let holder = std::thread::spawn(move || {
        // Read requests, never answer, until the frontend shuts down.
        let (mut conn, _) = listener.accept().unwrap();
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut conn, &mut sink);
        sink.len()
    });
    let opts = VmmOptions {
        message_timeout: Some(Duration::from_millis(200)),
        ..quick()
    };
    let t = Instant::now();
    let r = TestVmm::connect(&path, opts);
    assert!(matches!(r, Err(Error::MessageTimeout { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // SET_OWNER (no reply expected) and GET_FEATURES reached the backend.
    assert_eq!(holder.join().unwrap(), 24);
    let _ = std::fs::remove_file(&path);
}
