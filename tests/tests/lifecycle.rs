#![allow(clippy::unwrap_used)]
//! Connections, disconnects, resets, and the daemon binary itself.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::{on_host_rnic, TestDaemon};
use vhost_user_rdma_tests::verbs::{status_of, MrSpec, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::mem::access;

/// Creates a little of everything; returns the QP handle.
fn populate(vm: &mut TestVmm) -> u32 {
    let mut v = Verbs::new(vm);
    let (_, pd, cq) = v.ctx_pd_cq(64).unwrap();
    let pages = v.mem().alloc_pages(16, PAGE_SIZE).unwrap();
    v.reg_mr(&MrSpec::new(
        pd,
        access::LOCAL_WRITE | access::REMOTE_WRITE,
        0,
        &pages,
    ))
    .unwrap();
    let srq = v.create_srq(pd, 16, 1, 0).unwrap();
    v.create_qp(&QpInit {
        srq: srq.srq_handle,
        rq_depth: 0,
        ..QpInit::rc(pd, cq)
    })
    .unwrap();
    let qp = v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    let (_, gid) = v.own_gid().unwrap();
    v.connect_rc(qp.handle, 5, gid).unwrap();
    qp.handle
}

#[test]
fn disconnect_releases_everything_and_socket_is_reused() {
    let d = TestDaemon::start(2).unwrap();
    let mut other = d.connect(1).unwrap();
    let other_qp = populate(&mut other);
    let other_qpns = d.daemon().qpns_in_use();

    for round in 1..=20u64 {
        let mut vm = d.connect(0).unwrap();
        populate(&mut vm);
        let s = d.stats_connected(0, round);
        assert!(s.connected);
        assert_eq!(s.connections, round);
        assert_eq!(s.device.resources.qp, 2);
        assert_eq!(d.daemon().qpns_in_use(), other_qpns + 2);
        if round % 2 == 0 {
            vm.disconnect();
        } else {
            drop(vm);
        }
        let s = d.wait_released(0);
        assert!(!s.connected, "round {round}: still connected");
        assert!(s.device.resources.is_empty(), "round {round}: {s:?}");
        assert_eq!(d.daemon().qpns_in_use(), other_qpns);
    }
    // The other VM never noticed.
    let mut v = Verbs::new(&mut other);
    assert_eq!(v.query_qp(other_qp).unwrap().attr.qp_state, 3);
    assert_eq!(d.stats(1).connections, 1);
}

#[test]
fn disconnect_with_commands_in_flight() {
    let d = TestDaemon::start(1).unwrap();
    for _ in 0..5 {
        let mut vm = d.connect(0).unwrap();
        populate(&mut vm);
        let ctx = Verbs::new(&mut vm).create_ctx().unwrap();
        let req = virtio_rdma_abi::Wire::to_bytes(&virtio_rdma_abi::verbs::CtxHandleReq {
            ctx_handle: ctx,
        });
        let ctrl = vm.ctrl();
        ctrl.set_auto_kick(false);
        for _ in 0..100 {
            ctrl.submit(virtio_rdma_abi::ctrl::Opcode::ALLOC_PD, &req, 4)
                .unwrap();
        }
        ctrl.kick().unwrap();
        vm.disconnect();
        let s = d.wait_released(0);
        assert!(s.device.resources.is_empty(), "{s:?}");
        assert_eq!(d.daemon().qpns_in_use(), 0);
        assert_eq!(d.daemon().keys_in_use(), 0, "memory keys leaked");
    }
    // Still serving.
    let mut vm = d.connect(0).unwrap();
    populate(&mut vm);
}

/// Each start of the device after a reset sends the same memory table
/// again (QEMU does at every reset of the guest): the daemon keeps its
/// mapping of the guest's RAM (the same host addresses; the new mapping
/// would have been made while the old one was still in use, elsewhere),
/// and the device works on it. A new VMM's RAM is mapped anew.
#[test]
fn a_table_sent_again_at_a_reset_keeps_its_mapping() {
    use std::os::unix::fs::MetadataExt;
    use vhost_user_rdma::vring::QueueObserver;
    use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};

    let d = TestDaemon::start(1).unwrap();
    let device = d.daemon().device(0).unwrap().clone();
    // Host address and file inode of each region the device maps.
    let mapped = || -> Vec<(usize, u64)> {
        let mem = device.queue_memory().unwrap().memory();
        mem.iter()
            .map(|r| {
                let ino = r.file_offset().unwrap().file().metadata().unwrap().ino();
                (r.as_ptr() as usize, ino)
            })
            .collect()
    };
    // (Its replies waited for with yields first, as the fuzz harness does.)
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                pipeline_setup: true,
                reply_spin: Some(Duration::from_micros(50)),
                ..VmmOptions::default()
            },
        )
        .unwrap();
    populate(&mut vm);
    let first = mapped();
    assert_eq!(first.len(), vm.mem().layout().regions.len());
    let ino = vm.mem().file().metadata().unwrap().ino();
    assert!(first.iter().all(|&(_, i)| i == ino));
    for round in 0..3 {
        if round == 1 {
            vm.set_pipeline_setup(false);
        }
        vm.reset().unwrap();
        assert_eq!(mapped(), first, "round {round}: guest RAM mapped anew");
        // The control queue's answers are written through it.
        populate(&mut vm);
        assert_eq!(d.stats(0).device.resources.qp, 2);
    }
    drop(vm);
    d.wait_released(0);
    let mut vm = d.connect(0).unwrap();
    populate(&mut vm);
    let ino = vm.mem().file().metadata().unwrap().ino();
    let again = mapped();
    assert_eq!(again.len(), first.len());
    assert!(
        again.iter().all(|&(_, i)| i == ino),
        "a new VMM's RAM is its own file"
    );
}

#[test]
fn device_reset_destroys_objects_and_invalidates_handles() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d.connect(0).unwrap();
    let qp = populate(&mut vm);
    assert_eq!(d.stats(0).device.resources.qp, 2);
    vm.reset().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.stats(0).device.resources.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(d.stats(0).device.resources.is_empty());
    assert_eq!(d.daemon().qpns_in_use(), 0);
    let mut v = Verbs::new(&mut vm);
    assert_eq!(status_of(&v.query_qp(qp)), Some((Status::BAD_HANDLE, 0)));
    // The device works after the reset, and new handles differ from old ones.
    let new_qp = populate(&mut vm);
    assert_ne!(new_qp, qp);
}

/// A pipelined reset (`VmmOptions::pipeline_setup`: the stops, the reset
/// and the new start sent at once, one sync; whole or in two halves) is a
/// reset like the one message after the other: every object goes, the
/// stops report where the queues were, and the configuration read by the
/// sync is the device's.
#[test]
fn a_pipelined_reset_is_a_reset() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                pipeline_setup: true,
                ..VmmOptions::default()
            },
        )
        .unwrap();
    let config = vm.config().unwrap();
    assert_eq!(vm.start_config(), Some(&config));
    for round in 0..2 {
        let qp = populate(&mut vm);
        assert_eq!(d.stats(0).device.resources.qp, 2);
        let ctrl_avail = u32::from(vm.ctrl().vring().avail_idx());
        let bases = if round == 0 {
            vm.reset().unwrap()
        } else {
            // In two halves, as the engine fuzz harness does.
            vm.start_reset().unwrap();
            assert!(vm.start_reset().is_err(), "one reset at a time");
            vm.finish_reset().unwrap()
        };
        assert!(vm.finish_reset().is_err(), "no reset under way");
        assert_eq!(bases.len(), 3);
        assert_eq!(bases[0], ctrl_avail, "round {round}: control queue base");
        // The sync's answer came after the reset was handled.
        assert!(d.stats(0).device.resources.is_empty(), "round {round}");
        assert_eq!(d.daemon().qpns_in_use(), 0);
        assert_eq!(vm.start_config(), Some(&config));
        let mut v = Verbs::new(&mut vm);
        assert_eq!(status_of(&v.query_qp(qp)), Some((Status::BAD_HANDLE, 0)));
    }
}

/// Path of the daemon binary, built if it is not there yet.
fn daemon_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/lifecycle-xxxx -> target/<profile>/vhost-user-rdma
    let profile_dir = exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf();
    let bin = profile_dir.join("vhost-user-rdma");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = profile_dir.ends_with("release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "vhost-user-rdma", "--bin", "vhost-user-rdma"]);
        if release {
            cmd.arg("--release");
        }
        assert!(cmd.status().unwrap().success(), "cannot build the daemon");
    }
    bin
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn binary_serves_two_vms() {
    let dir = std::env::temp_dir().join(format!("vur-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s0 = dir.join("vm0.sock");
    let s1 = dir.join("vm1.sock");
    let child = Child(
        Command::new(daemon_binary())
            .arg("--socket-path")
            .arg(&s0)
            .arg("--socket-path")
            .arg(&s1)
            .args(["--max-qp", "3", "--mac", "vm1=52:54:00:00:01:02"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut a = TestVmm::connect(&s0, VmmOptions::default()).unwrap();
    let mut b = TestVmm::connect(&s1, VmmOptions::default()).unwrap();
    assert_eq!(a.config().unwrap().max_qp, 3);
    assert_eq!(b.config().unwrap().max_qp, 3);
    // The paired MAC of the command line (spec chapter 5), for vm1 only.
    assert_eq!(a.config().unwrap().mac, [0; 6]);
    assert_eq!(b.config().unwrap().mac, [0x52, 0x54, 0, 0, 1, 2]);
    let mut v = Verbs::new(&mut a);
    let (_, pd, cq) = v.ctx_pd_cq(16).unwrap();
    for _ in 0..3 {
        v.create_qp(&QpInit::rc(pd, cq)).unwrap();
    }
    let over = v.create_qp(&QpInit::rc(pd, cq));
    assert_eq!(status_of(&over), Some((Status::QUOTA, 4)));
    populate(&mut b);
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn binary_rejects_bad_configuration() {
    let out = Command::new(daemon_binary())
        .args(["--socket-path", "/tmp/x.sock", "--max-cqe", "1000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max-cqe") && err.contains("power of two"),
        "{err}"
    );

    let out = Command::new(daemon_binary())
        .args([
            "--socket-path",
            "/tmp/x.sock",
            "--mac",
            "vm0=01:00:5e:00:00:01",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--mac") && err.contains("multicast"), "{err}");
    let out = Command::new(daemon_binary())
        .args([
            "--socket-path",
            "/tmp/x.sock",
            "--mac",
            "vm1=52:54:00:00:00:01",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no VM named \"vm1\""), "{err}");

    let out = Command::new(daemon_binary()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--socket-path"));

    let out = Command::new(daemon_binary())
        .args(["--socket-path", "/nonexistent-dir/x.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot listen on /nonexistent-dir/x.sock")
    );
}

/// Stopping the queues and restarting them where they stopped is what a
/// VMM does around a VM pause: objects survive it (spec 15.1).
#[test]
fn stopping_and_resuming_queues_is_a_pause_not_a_reset() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(0, VmmOptions::without_reset_device())
        .unwrap();
    let qp = populate(&mut vm);
    let bases = vm.stop_queues().unwrap();
    assert_ne!(bases[0], 0, "commands were taken");
    vm.resume(&bases).unwrap();
    assert_eq!(d.stats(0).device.resources.qp, 2);
    let mut v = Verbs::new(&mut vm);
    assert_eq!(v.query_qp(qp).unwrap().attr.qp_state, 3);
}

/// Spec chapter 19's feature tables, as the back-end offers them: the
/// virtio bits (no ACCESS_PLATFORM, no packed ring, no indirect
/// descriptors; dirty logging on the software RNIC), the protocol features with and without
/// the doorbell region (the front-end acks every bit, so what it holds
/// afterwards is exactly what was offered), three queues, and the 88-byte
/// configuration space.
#[test]
fn vhost_user_features_are_those_of_chapter_19() {
    use vhost::vhost_user::VhostUserProtocolFeatures as P;
    use vhost_user_rdma::config::IMPLEMENTED_FEATURES;
    use virtio_rdma_abi::config::F_SHMEM_DOORBELL;
    for shmem in [true, false] {
        let d = TestDaemon::with_config(1, |c| {
            if !shmem {
                c.device_features &= !F_SHMEM_DOORBELL;
            }
        })
        .unwrap();
        let opts = VmmOptions {
            protocol_features: P::all(),
            shmem: true,
            ..VmmOptions::default()
        };
        let mut vm = d.connect_with(0, opts).unwrap();
        let device_bits = if shmem {
            IMPLEMENTED_FEATURES
        } else {
            IMPLEMENTED_FEATURES & !F_SHMEM_DOORBELL
        };
        // VHOST_F_LOG_ALL and LOG_SHMFD: dirty logging (spec 20.4), where
        // the daemon makes every write into guest RAM itself.
        let log_all = if on_host_rnic() { 0 } else { 1 << 26 };
        let want = (1u64 << 32) | (1 << 30) | (1 << 29) | log_all | device_bits;
        assert_eq!(
            vm.device_features(),
            want,
            "virtio features (shmem {shmem})"
        );
        assert_eq!(vm.device_features() & (1 << 33), 0, "ACCESS_PLATFORM");
        let mut want = P::MQ | P::REPLY_ACK | P::CONFIG | P::RESET_DEVICE | P::DEVICE_STATE;
        if !on_host_rnic() {
            want |= P::LOG_SHMFD;
        }
        if shmem {
            want |= P::BACKEND_REQ | P::SHMEM;
        }
        assert_eq!(
            vm.protocol_features(),
            want,
            "protocol features (shmem {shmem})"
        );
        assert_eq!(P::SHMEM.bits(), 1 << 22);
        assert_eq!(vm.backend_queues(), 3);
        let size = <virtio_rdma_abi::config::DeviceConfig as virtio_rdma_abi::Field>::SIZE;
        let all = vm.config_bytes(0, size).unwrap();
        assert_eq!(all.len(), size);
        let cfg = vm.config().unwrap();
        assert_eq!(cfg.abi_version, virtio_rdma_abi::ABI_VERSION);
        let tail = vm.config_bytes(size as u32 - 8, 16).unwrap();
        assert_eq!(&tail[..8], &all[size - 8..]);
        assert_eq!(&tail[8..], &[0u8; 8], "past the structure reads as 0");
    }
}

/// Spec 15.1, "While stopped": nothing is written into a stopped device's
/// memory, not even the engine's doorbell flags in a context's doorbell
/// header (spec 18.4). The engine parks and unparks every 50 ms at most and
/// rewrites the flags of every header then: a value the test leaves in the
/// field must survive several park cycles. At the start the device writes
/// the engine's flags of the moment there (the stopped header may show a
/// state the engine has left since).
#[test]
fn a_stopped_device_has_its_doorbell_headers_left_alone() {
    use std::sync::atomic::Ordering;
    use virtio_rdma_abi::datapath::{DB_FLAG_KICK, DB_FLAG_POLLING};
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(0, VmmOptions::without_reset_device())
        .unwrap();
    let header = vm.mem().alloc(64, 64).unwrap();
    let mut v = Verbs::new(&mut vm);
    let ctx = v.create_ctx_at(header.0).unwrap().ctx_handle;
    let pd = v.alloc_pd(ctx).unwrap();
    let cq = v.create_cq(ctx, 64).unwrap();
    let (req, tail) = v.qp_request(&QpInit::rc(pd, cq)).unwrap();
    let qp = v.create_qp_raw(&req, &tail).unwrap();
    let bases = vm.stop_queues().unwrap();
    const MARK: u32 = 0x5a5a_0000;
    vm.mem().store(header, MARK, Ordering::Release).unwrap();
    // Several park cycles of an idle engine.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let now: u32 = vm.mem().load(header, Ordering::Acquire).unwrap();
        assert_eq!(now, MARK, "the device wrote a stopped device's header");
        std::thread::sleep(Duration::from_millis(10));
    }
    vm.resume(&bases).unwrap();
    let now: u32 = vm.mem().load(header, Ordering::Acquire).unwrap();
    assert!(
        [0, DB_FLAG_KICK, DB_FLAG_POLLING].contains(&now),
        "after the start the header holds the engine's flags, not {now:#x}"
    );
    assert_eq!(
        Verbs::new(&mut vm)
            .query_qp(qp.qp_handle)
            .unwrap()
            .attr
            .qp_state,
        0,
        "paused, not reset"
    );
}

/// Finding 1: a VMM that never sends `RESET_DEVICE` shows a guest reset
/// only as a restart of the queues from index 0. The device recognises it
/// and releases every object of the previous boot (it kept them all, and
/// the reset guest's next boot found them alive).
#[test]
fn a_restart_from_fresh_rings_without_reset_device_is_a_reset() {
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(0, VmmOptions::without_reset_device())
        .unwrap();
    let qp = populate(&mut vm);
    let before = d.stats(0).device.resources;
    assert_eq!(before.qp, 2);
    vm.reset().unwrap();
    let after = d.stats(0).device.resources;
    assert_eq!(
        (after.ctx, after.pd, after.cq, after.mr, after.qp, after.srq),
        (0, 0, 0, 0, 0, 0),
        "{after:?}"
    );
    assert_eq!(after.registered_bytes, 0);
    let mut v = Verbs::new(&mut vm);
    assert!(v.query_qp(qp).is_err(), "the old handle resolves no more");
    // The new boot works as a fresh device.
    populate(&mut vm);
    assert_eq!(d.stats(0).device.resources.qp, 2);
}

/// A device reset while the vring worker is still busy with a batch of
/// kicks: the kicks later in the batch are handled after the VMM has
/// replaced those queues' kick eventfds with fresh, empty ones
/// (`SET_VRING_KICK`). The worker must take them as spurious wakeups and
/// keep serving. It used to die on the failed read of an empty eventfd
/// (`EAGAIN`), and every later control command timed out although the
/// connection stayed up.
///
/// The daemon polls the control queue for `ctrl_poll` (10 ms here) after
/// each batch, so a kick of the empty control queue keeps the worker in
/// the first event of its batch while the whole reset runs, and the event
/// and notification queue kicks behind it are stale by the time it gets to
/// them. The control ring is fresh (a first reset) because on a ring with
/// requests the reset's `SET_VRING_BASE` rewinds the avail index, which
/// ends the polling before the other queues get new eventfds. No event
/// buffers are posted, so nothing writes the new eventfds first.
#[test]
fn reset_during_a_batch_of_kicks_keeps_the_worker_alive() {
    const POLL: Duration = Duration::from_millis(10);
    let d = TestDaemon::with_config(1, |c| c.ctrl_poll = POLL).unwrap();
    let opts = VmmOptions {
        event_buffers: 0,
        timeout: Duration::from_secs(2),
        ..VmmOptions::default()
    };
    let mut vm = d.connect_with(0, opts).unwrap();
    let start = Instant::now();
    let mut rounds = 0u32;
    while rounds < 100 && start.elapsed() < Duration::from_secs(3) {
        rounds += 1;
        vm.reset().unwrap();
        // Let the worker finish with the restarted queues.
        std::thread::sleep(POLL + POLL / 2);
        {
            let (ctrl, events, notify) = vm.queues();
            // Unconditional writes, the control queue first so that its
            // slow event comes first in the worker's batch.
            ctrl.vring_mut().kick().unwrap();
            events.vring_mut().kick().unwrap();
            notify.kick().unwrap();
        }
        let kicked = Instant::now();
        // Let the worker collect the batch and start polling.
        std::thread::sleep(Duration::from_micros(500));
        vm.reset().unwrap();
        // Let it finish the batch before asking anything.
        std::thread::sleep((kicked + POLL + POLL / 2).saturating_duration_since(Instant::now()));
        let mut v = Verbs::new(&mut vm);
        let ctx = v.create_ctx();
        assert!(ctx.is_ok(), "round {rounds}: {ctx:?}");
    }
}

/// A device reset (what a VMM does when the guest reboots) destroys the
/// VM's QPs at once; the QPs of other VMs connected to them fail with
/// `QP_FATAL` and flush, and connections that do not involve the reset VM
/// keep their state.
#[test]
fn device_reset_fails_connected_peers() {
    use vhost_user_rdma_tests::dp::{connect, poll_one, rc_pair, rc_qp, Buf, Vm, WAIT};
    use virtio_rdma_abi::datapath::WcStatus;
    use virtio_rdma_abi::event::EventKind;
    use virtio_rdma_abi::qp::QpState;
    use virtio_rdma_driver::{Cq, RecvWr};

    let d = TestDaemon::start(3).unwrap();
    let vm0 = Vm::open(&d, 0, VmmOptions::default());
    let vm1 = Vm::open(&d, 1, VmmOptions::default());
    let vm2 = Vm::open(&d, 2, VmmOptions::default());
    let cq0 = Cq::create(&vm0.dev, 64).unwrap();
    let cq1 = Cq::create(&vm1.dev, 64).unwrap();
    let (q0, q1) = (rc_qp(&vm0, &cq0), rc_qp(&vm1, &cq1));
    connect(&vm0, &q0, &vm1, &q1);
    let other = rc_pair(&vm0, &vm2);
    let rbuf = Buf::new(&vm0, 4096);
    q0.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[rbuf.sge(0, 4096)],
    }])
    .unwrap();

    vm1.t.vmm().reset().unwrap();

    let deadline = Instant::now() + WAIT;
    while q0.query().unwrap().attr.qp_state != u32::from(QpState::ERR) {
        assert!(Instant::now() < deadline, "VM 0's QP did not fail");
        std::thread::sleep(Duration::from_millis(1));
    }
    let wc = poll_one(&cq0);
    assert_eq!((wc.wr_id, wc.status()), (7, Some(WcStatus::WR_FLUSH_ERR)));
    let ev = loop {
        let ev = vm0.dev.next_async_event(Some(WAIT)).unwrap().unwrap();
        if EventKind::from_u32(ev.kind) != Some(EventKind::PORT_ACTIVE) {
            break ev;
        }
    };
    assert_eq!(EventKind::from_u32(ev.kind), Some(EventKind::QP_FATAL));
    assert_eq!(ev.handle, q0.handle());
    for q in [&other.qa, &other.qb] {
        assert_eq!(q.query().unwrap().attr.qp_state, u32::from(QpState::RTS));
    }
    assert_eq!(d.stats(1).device.resources.qp, 0);
    // VM 1's driver objects refer to the device before the reset; their
    // destroys fail harmlessly.
    drop((q1, cq1, vm1));
}

/// The statistics report the work waiting in a VM's queues (what the
/// metrics export as queue depths).
#[test]
fn queue_depths_are_reported() {
    use vhost_user_rdma_tests::dp::{rc_pair, Buf, Vm};
    use virtio_rdma_driver::RecvWr;

    let d = TestDaemon::start(2).unwrap();
    let vm0 = Vm::open(&d, 0, VmmOptions::default());
    let vm1 = Vm::open(&d, 1, VmmOptions::default());
    let p = rc_pair(&vm0, &vm1);
    let buf = Buf::new(&vm1, 4096);
    assert_eq!(d.stats(1).device.queues.recv_wqes, 0);
    for i in 0..5 {
        p.qb.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[buf.sge(0, 4096)],
        }])
        .unwrap();
    }
    let q = d.stats(1).device.queues;
    assert_eq!((q.recv_wqes, q.send_wqes, q.srq_wqes), (5, 0, 0), "{q:?}");
    assert_eq!(d.stats(0).device.queues.recv_wqes, 0);
}

/// Shutdown ends even when the socket's path was removed under the daemon:
/// the serving threads' `accept()` is woken through the listening socket
/// itself, not by connecting to its path (which then fails). It used to
/// hang, and the daemon with it after SIGTERM.
#[test]
fn shutdown_after_the_socket_path_was_removed() {
    let d = TestDaemon::start(2).unwrap();
    std::fs::remove_file(d.socket(0)).unwrap();
    std::fs::remove_file(d.socket(1)).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(d);
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(10))
        .expect("shutdown still running after 10 s");
}
