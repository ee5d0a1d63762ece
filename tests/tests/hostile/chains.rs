//! Malformed descriptor chains, answered with used length 0 and not executed
//! (spec 7.4), and bad heads and empty descriptors on the event queue (spec
//! 14.1).

use std::time::Duration;

use vhost_user_rdma_tests::ctrl::POISON;
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::VmmOptions;
use vhost_user_rdma_tests::vring::{RawDesc, RawNext, Seg, F_NEXT, F_WRITE};
use virtio_rdma_abi::ctrl::{Opcode, Status, MAX_REQUEST_BYTES};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use crate::requests::{new_ctx_req, raw_request, region_end, resp_buf};
use crate::world::{hostile, opts};

#[test]
fn readable_descriptor_outside_ram() {
    hostile(|w| {
        let resp = resp_buf(w);
        let hole = w.a.mem().hole_gpa();
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        // The header in the hole.
        let chain = RawDesc::chain(&[
            Seg::readable(GuestAddress(hole), len),
            Seg::writable(resp, 24),
        ]);
        w.expect_malformed("readable descriptor in the hole", &chain, Some((resp, 24)));
        // Header fine, a second readable descriptor past the end of RAM.
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::readable(GuestAddress(region_end(w, 1)), 8),
            Seg::writable(resp, 24),
        ]);
        w.expect_malformed(
            "readable descriptor past the end of RAM",
            &chain,
            Some((resp, 24)),
        );
        // A readable descriptor straddling the end of region 0.
        let edge = GuestAddress(region_end(w, 0) - 8);
        let chain = RawDesc::chain(&[Seg::readable(edge, 16), Seg::writable(resp, 24)]);
        w.expect_malformed(
            "readable descriptor across the region end",
            &chain,
            Some((resp, 24)),
        );
    });
}

#[test]
fn writable_descriptor_outside_ram() {
    hostile(|w| {
        let resp = resp_buf(w);
        let hole = w.a.mem().hole_gpa();
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(GuestAddress(hole), 24),
        ]);
        w.expect_malformed("writable descriptor in the hole", &chain, None);
        // First writable part fine, the second across the region end.
        let edge = GuestAddress(region_end(w, 0) - 8);
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(resp, 16),
            Seg::writable(edge, 16),
        ]);
        w.expect_malformed(
            "writable descriptor across the region end",
            &chain,
            Some((resp, 16)),
        );
    });
}

#[test]
fn readable_after_writable() {
    hostile(|w| {
        let resp = resp_buf(w);
        let b = w.base();
        let ctx = CtxHandleReq { ctx_handle: b.ctx }.to_bytes();
        let (hdr, len) = raw_request(w, Opcode::ALLOC_PD, &[]);
        let payload = w.a.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        w.a.mem().write(payload, &ctx).unwrap();
        let chain = RawDesc::chain(&[
            Seg::readable(hdr, len),
            Seg::writable(resp, 20),
            Seg::readable(payload, 4),
        ]);
        w.expect_malformed(
            "ALLOC_PD payload after the response buffer",
            &chain,
            Some((resp, 20)),
        );
    });
}

#[test]
fn descriptor_loop() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        // The writable descriptor points back at the head.
        let mut chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 24)]);
        chain[1].flags |= F_NEXT;
        chain[1].next = RawNext::ListIndex(0);
        w.expect_malformed("loop back to the head", &chain, Some((resp, 24)));
        // A readable descriptor pointing at itself.
        let chain = [RawDesc {
            addr: req.0,
            len,
            flags: F_NEXT,
            next: RawNext::ListIndex(0),
        }];
        w.expect_malformed("readable self loop", &chain, None);
    });
}

/// Regression: a loop inside the writable part went undetected, because
/// virtio-queue's `DescriptorChain` iterator silently stops after
/// `queue_size` descriptors; the daemon executed the command. Spec 7.4: a
/// chain that loops is returned with used length 0 and not executed.
#[test]
fn descriptor_loop_in_writable_part() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = [
            RawDesc {
                addr: req.0,
                len,
                flags: F_NEXT,
                next: RawNext::Following,
            },
            RawDesc {
                addr: resp.0,
                len: 24,
                flags: F_WRITE | F_NEXT,
                next: RawNext::ListIndex(1),
            },
        ];
        w.expect_malformed("writable self loop", &chain, Some((resp, 24)));
    });
}

#[test]
fn writable_part_shorter_than_header() {
    hostile(|w| {
        let resp = resp_buf(w);
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let chain = RawDesc::chain(&[Seg::readable(req, len), Seg::writable(resp, 15)]);
        w.expect_malformed("15 writable bytes", &chain, Some((resp, 15)));
        let resp2 = resp_buf(w);
        let chain = RawDesc::chain(&[
            Seg::readable(req, len),
            Seg::writable(resp, 7),
            Seg::writable(resp2, 8),
        ]);
        w.expect_malformed("7 + 8 writable bytes", &chain, Some((resp, 7)));
        let chain = RawDesc::chain(&[Seg::readable(req, len)]);
        w.expect_malformed("no writable part", &chain, None);
    });
}

#[test]
fn readable_part_over_max_request_bytes() {
    hostile(|w| {
        let resp = resp_buf(w);
        let big = MAX_REQUEST_BYTES + 8;
        let (req, _) = raw_request(w, Opcode::REG_MR, &vec![0; big - 16]);
        let chain = RawDesc::chain(&[Seg::readable(req, big as u32), Seg::writable(resp, 28)]);
        w.expect_malformed("1 MiB + 8 readable bytes", &chain, Some((resp, 28)));
    });
}

/// Spec 7.4: an available-ring entry whose head index is at or past the
/// queue size names no chain. The device takes it, executes nothing,
/// returns no used element for it (none could name it) and counts it; the
/// requests around it are served. (The daemon used to try to return it,
/// which failed and logged a warning and an error per entry: a log flood
/// a guest could drive.)
#[test]
fn available_head_past_the_queue() {
    hostile(|w| {
        let before = w.a_stats();
        let qpns = w.d.daemon().qpns_in_use();
        let size = w.a.ctrl().vring().size();
        let used_before = w.a.ctrl().vring().device_used_idx().unwrap();
        let published_before = w.a.ctrl().vring().avail_idx();
        {
            let v = w.a.ctrl().vring_mut();
            for head in [size, size + 1, u16::MAX] {
                v.push_avail_raw(head).unwrap();
            }
        }
        // A valid request behind them (its kick covers the three).
        let ctx = w.ok("CREATE_CTX behind bad heads", |v| v.create_ctx());
        let after = w.a_stats();
        assert_eq!(after.ctrl.malformed, before.ctrl.malformed + 3, "counted");
        assert_eq!(after.ctrl.ok, before.ctrl.ok + 1, "the valid request ran");
        assert_eq!(after.resources.ctx, before.resources.ctx + 1);
        let ctrl = w.a.ctrl();
        assert_eq!(ctrl.vring().avail_idx(), published_before.wrapping_add(4));
        assert_eq!(
            ctrl.vring().device_used_idx().unwrap(),
            used_before.wrapping_add(1),
            "only the valid request is returned"
        );
        assert!(ctrl.untracked().is_empty(), "{:?}", ctrl.untracked());
        w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        assert_eq!(w.d.daemon().qpns_in_use(), qpns);
    });
}

/// Spec 7.4: a descriptor of length 0 is not malformed. It carries no
/// bytes, so the device reads and writes nothing through it and looks at
/// neither its address nor its direction. Before, a zero-length readable
/// descriptor outside RAM, or one after the writable part, made the chain
/// malformed, and a zero-length writable one outside RAM had the command
/// executed but reported with used length 0 (its context leaked: the
/// driver was told nothing ran).
#[test]
fn zero_length_descriptors_are_ignored() {
    hostile(|w| {
        let hole = GuestAddress(w.a.mem().hole_gpa());
        let (req, len) = raw_request(w, Opcode::CREATE_CTX, &new_ctx_req(w));
        let resp_len = 16 + CreateCtxResp::SIZE;
        let empty = |addr: GuestAddress, write: bool| RawDesc {
            addr: addr.0,
            len: 0,
            flags: F_NEXT | if write { F_WRITE } else { 0 },
            next: RawNext::Following,
        };
        let cases: Vec<(&str, Vec<RawDesc>, GuestAddress)> = {
            let r1 = resp_buf(w);
            let r2 = resp_buf(w);
            let r3 = resp_buf(w);
            let mut c1 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r1, resp_len as u32)]);
            c1.insert(1, empty(hole, true));
            let mut c2 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r2, resp_len as u32)]);
            c2.insert(0, empty(hole, false));
            let mut c3 =
                RawDesc::chain(&[Seg::readable(req, len), Seg::writable(r3, resp_len as u32)]);
            c3[1].flags |= F_NEXT;
            c3[1].next = RawNext::Following;
            let mut last = empty(hole, false);
            last.flags &= !F_NEXT;
            c3.push(last);
            vec![
                ("empty writable descriptor in the hole", c1, r1),
                ("empty readable descriptor in the hole first", c2, r2),
                ("empty readable descriptor after the writable part", c3, r3),
            ]
        };
        for (what, chain, resp) in cases {
            let before = w.a_stats();
            let ctrl = w.a.ctrl();
            let t = ctrl
                .submit_raw_chain(&chain, Some((resp, resp_len)))
                .unwrap();
            let c = ctrl.wait(t).unwrap();
            assert_eq!(
                (c.status(), c.used_len as usize, c.resp_request_id),
                (Some(Status::OK), resp_len, 0xABCD),
                "{what}: {c:?}"
            );
            let ctx = CreateCtxResp::read(&c.payload).ctx_handle;
            let after = w.a_stats();
            assert_eq!(after.ctrl.malformed, before.ctrl.malformed, "{what}");
            assert_eq!(after.resources.ctx, before.resources.ctx + 1, "{what}");
            w.ok("DESTROY_CTX", |v| v.destroy_ctx(ctx));
        }
        // Only empty descriptors: no room for a response, so unanswered.
        let resp = resp_buf(w);
        let mut chain = vec![empty(req, false), empty(resp, true)];
        chain[1].flags &= !F_NEXT;
        w.expect_malformed("only empty descriptors", &chain, Some((resp, 16)));
    });
}

/// The same two rules on the event queue (spec 14.1): heads past the
/// queue are taken and counted, nothing is returned for them, and the
/// event goes into the next buffer; a buffer with an empty readable
/// descriptor (outside RAM, too) is an ordinary 16-byte buffer. Before,
/// that buffer was refused with used length 0.
#[test]
fn event_queue_bad_heads_and_empty_descriptors() {
    use virtio_rdma_abi::event::{Event, EventKind};
    let d = TestDaemon::start(1).unwrap();
    let mut vm = d
        .connect_with(
            0,
            VmmOptions {
                event_buffers: 0,
                ..opts()
            },
        )
        .unwrap();
    let hole = vm.mem().hole_gpa();
    let buf = vm.mem().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
    vm.mem().fill(buf, 16, POISON).unwrap();
    let ev = vm.events().vring_mut();
    let size = ev.size();
    ev.push_avail_raw(size).unwrap();
    ev.push_avail_raw(u16::MAX).unwrap();
    let head = ev
        .add_raw(&[
            RawDesc {
                addr: hole,
                len: 0,
                flags: F_NEXT,
                next: RawNext::Following,
            },
            RawDesc {
                addr: buf.0,
                len: 16,
                flags: F_WRITE,
                next: RawNext::Following,
            },
        ])
        .unwrap();
    ev.kick().unwrap();
    let used = ev.wait_used(Duration::from_secs(10)).unwrap();
    assert_eq!(used.len(), 1, "only the real buffer comes back: {used:?}");
    assert_eq!((used[0].id, used[0].len), (u32::from(head), 16));
    let raw = vm.mem().read_vec(buf, 16).unwrap();
    let e = Event::read(&raw);
    assert_eq!((e.kind, e.seq), (EventKind::PORT_ACTIVE as u32, 1));
    assert_eq!(d.stats(0).device.ctrl.malformed, 2, "the two bad heads");
    // Still served.
    Verbs::new(&mut vm).query_device().unwrap();
    assert!(d.stats(0).connected);
}
