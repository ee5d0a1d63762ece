//! Resizing commands out of their domains (`F_RESIZE`, spec 12.19, 12.25,
//! 12.26): bad handles, depths that are not powers of two or beyond the
//! device's limits, rings and regions outside guest RAM, flags that name
//! nothing, regions that cannot be re-registered. Each is refused with
//! its status and detail and changes nothing.

use vhost_user_rdma::Limits;
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::MrSpec;
use vhost_user_rdma_tests::vmm::VmmOptions;
use virtio_rdma_abi::config::{ALL_DEVICE_FEATURES, F_RESIZE};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::mem::{access, BufferDesc, PageListMode, CQE_SIZE};
use virtio_rdma_abi::verbs::*;
use vm_memory::GuestAddress;

use crate::world::{hostile, hostile_in, opts, World};

/// A guest address far beyond the test VM's RAM.
const NOWHERE: GuestAddress = GuestAddress(1 << 46);

/// Offsets of the fields the details name.
const D_DEPTH: u32 = 4;
const D_FLAGS: u32 = 4;
const D_PD: u32 = 8;
const D_ACCESS: u32 = 12;
const D_LENGTH: u32 = 24;
const D_MAX_WR: u32 = 8;

#[test]
fn resize_cq_refusals() {
    hostile(|w| {
        let cq = w.base().cq;
        let max = w.dev.max_cqe;
        let ring = |v: &vhost_user_rdma_tests::verbs::Verbs<'_>, depth: u32| {
            let pages = v
                .mem()
                .alloc_pages(
                    (u64::from(depth) * u64::from(CQE_SIZE)).div_ceil(PAGE_SIZE) as usize,
                    PAGE_SIZE,
                )
                .unwrap();
            v.page_list(&pages, 12, PageListMode::INLINE).unwrap()
        };
        let call = |v: &mut vhost_user_rdma_tests::verbs::Verbs<'_>,
                    cq_handle,
                    depth,
                    list: &vhost_user_rdma_tests::verbs::PageListReq| {
            let req = ResizeCqReq {
                cq_handle,
                depth,
                buf: list.desc,
            };
            v.ctrl()
                .call_typed::<_, CqHandleResp>(Opcode::RESIZE_CQ, &req, &list.tail)
        };
        w.expect("RESIZE_CQ, no such CQ", Status::BAD_HANDLE, 0, |v| {
            let l = ring(v, 16);
            call(v, 0xdead_beef, 16, &l)
        });
        w.expect("RESIZE_CQ, depth 24", Status::INVALID, D_DEPTH, |v| {
            let l = ring(v, 24);
            call(v, cq, 24, &l)
        });
        w.expect(
            "RESIZE_CQ, depth 2 * max_cqe",
            Status::RANGE,
            D_DEPTH,
            |v| {
                let l = ring(v, 16);
                call(v, cq, max.saturating_mul(2), &l)
            },
        );
        w.expect("RESIZE_CQ, ring outside RAM", Status::BAD_ADDRESS, 0, |v| {
            let l = v.page_list(&[NOWHERE], 12, PageListMode::INLINE).unwrap();
            call(v, cq, 16, &l)
        });
        // The CQ still works as it was: it can be resized for real.
        w.ok("RESIZE_CQ to 64", |v| {
            let l = ring(v, 64);
            call(v, cq, 64, &l)
        });
    });
}

#[test]
fn rereg_mr_refusals() {
    hostile(|w| {
        let (pd, mr) = (w.base().pd, w.base().mr);
        let rereg =
            |v: &mut vhost_user_rdma_tests::verbs::Verbs<'_>, req: ReregMrReq, tail: &[u8]| {
                v.ctrl()
                    .call_typed::<_, RegMrResp>(Opcode::REREG_MR, &req, tail)
            };
        let base = ReregMrReq {
            mr_handle: mr,
            flags: REREG_ACCESS,
            pd_handle: 0,
            access: access::LOCAL_WRITE,
            iova: 0,
            length: 0,
            buf: BufferDesc::default(),
        };
        w.expect("REREG_MR, no such MR", Status::BAD_HANDLE, 0, |v| {
            rereg(
                v,
                ReregMrReq {
                    mr_handle: 0xdead_beef,
                    ..base
                },
                &[],
            )
        });
        w.expect("REREG_MR, flags 0", Status::INVALID, D_FLAGS, |v| {
            rereg(v, ReregMrReq { flags: 0, ..base }, &[])
        });
        w.expect("REREG_MR, unknown flag", Status::INVALID, D_FLAGS, |v| {
            rereg(
                v,
                ReregMrReq {
                    flags: 1 << 3,
                    ..base
                },
                &[],
            )
        });
        w.expect(
            "REREG_MR, unknown access bit",
            Status::INVALID,
            D_ACCESS,
            |v| {
                rereg(
                    v,
                    ReregMrReq {
                        access: 1 << 20,
                        ..base
                    },
                    &[],
                )
            },
        );
        w.expect("REREG_MR, no such PD", Status::BAD_HANDLE, D_PD, |v| {
            rereg(
                v,
                ReregMrReq {
                    flags: REREG_PD,
                    pd_handle: 0xdead_beef,
                    ..base
                },
                &[],
            )
        });
        // A PD of another context of the same VM: the region's context
        // is fixed.
        let (_, other_pd) = w.ok("CREATE_CTX, ALLOC_PD", |v| v.ctx_pd());
        w.expect(
            "REREG_MR, PD of another context",
            Status::BAD_HANDLE,
            D_PD,
            |v| {
                rereg(
                    v,
                    ReregMrReq {
                        flags: REREG_PD,
                        pd_handle: other_pd,
                        ..base
                    },
                    &[],
                )
            },
        );
        w.expect("REREG_MR, length 0", Status::INVALID, D_LENGTH, |v| {
            let l = v.page_list(&[NOWHERE], 12, PageListMode::INLINE).unwrap();
            rereg(
                v,
                ReregMrReq {
                    flags: REREG_TRANSLATION,
                    iova: 0x1000,
                    length: 0,
                    buf: l.desc,
                    ..base
                },
                &l.tail,
            )
        });
        w.expect("REREG_MR, pages outside RAM", Status::BAD_ADDRESS, 0, |v| {
            let l = v.page_list(&[NOWHERE], 12, PageListMode::INLINE).unwrap();
            rereg(
                v,
                ReregMrReq {
                    flags: REREG_TRANSLATION,
                    iova: 0x1000,
                    length: PAGE_SIZE,
                    buf: l.desc,
                    ..base
                },
                &l.tail,
            )
        });
        // A fast-registration region changes by work requests only.
        let fast = w.ok("ALLOC_MR", |v| v.alloc_mr(pd, 4));
        w.expect("REREG_MR of an ALLOC_MR region", Status::INVALID, 0, |v| {
            rereg(
                v,
                ReregMrReq {
                    mr_handle: fast.mr_handle,
                    ..base
                },
                &[],
            )
        });
        w.ok("DEREG_MR", |v| v.dereg_mr(fast.mr_handle));
        // The region itself is re-registered with its lkey kept.
        let again = w.ok("REREG_MR, access", |v| rereg(v, base, &[]));
        assert_eq!(again.mr_handle, mr);
    });
}

#[test]
fn resize_srq_refusals() {
    hostile(|w| {
        let pd = w.base().pd;
        let max = w.dev.max_srq_wr;
        let srq = w.ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 0));
        let call = |v: &mut vhost_user_rdma_tests::verbs::Verbs<'_>,
                    max_wr: u32,
                    pages: &[GuestAddress]| {
            let l = v.page_list(pages, 12, PageListMode::INLINE).unwrap();
            let req = ModifySrqResizeReq {
                srq_handle: srq.srq_handle,
                attr_mask: SRQ_ATTR_MAX_WR,
                max_wr,
                limit: 0,
                buf: l.desc,
            };
            v.ctrl()
                .call_typed_unit(Opcode::MODIFY_SRQ, &req, &l.tail)
                .map(drop)
        };
        let page = |v: &vhost_user_rdma_tests::verbs::Verbs<'_>| {
            v.mem().alloc_pages(1, PAGE_SIZE).unwrap()
        };
        w.expect("MODIFY_SRQ, max_wr 24", Status::INVALID, D_MAX_WR, |v| {
            let p = page(v);
            call(v, 24, &p)
        });
        w.expect(
            "MODIFY_SRQ, max_wr 2 * max_srq_wr",
            Status::RANGE,
            D_MAX_WR,
            |v| {
                let p = page(v);
                call(v, max.saturating_mul(2), &p)
            },
        );
        w.expect(
            "MODIFY_SRQ, ring outside RAM",
            Status::BAD_ADDRESS,
            0,
            |v| call(v, 32, &[NOWHERE]),
        );
        // SRQ_ATTR_MAX_WR in the version 2 form: too short for the ring.
        w.expect(
            "MODIFY_SRQ, MAX_WR without a ring",
            Status::INVALID,
            40,
            |v| v.modify_srq(srq.srq_handle, SRQ_ATTR_MAX_WR, 32, 0),
        );
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq.srq_handle));
    });
}

/// Spec 12.10, 12.19, 12.25, 12.26: without `F_RESIZE` negotiated the
/// resizing commands are `UNSUPPORTED` before anything else is looked at,
/// and a region without remote access has no rkey (with it, every region
/// has one).
#[test]
fn without_the_feature_nothing_resizes() {
    let a_opts = VmmOptions {
        driver_features: ALL_DEVICE_FEATURES & !F_RESIZE,
        ..opts()
    };
    hostile_in(World::build(Limits::default(), a_opts), |w| {
        let (pd, cq, mr) = (w.base().pd, w.base().cq, w.base().mr);
        w.expect("RESIZE_CQ", Status::UNSUPPORTED, 0x32, |v| {
            let p = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
            let l = v.page_list(&p, 12, PageListMode::INLINE).unwrap();
            let req = ResizeCqReq {
                cq_handle: cq,
                depth: 64,
                buf: l.desc,
            };
            v.ctrl()
                .call_typed::<_, CqHandleResp>(Opcode::RESIZE_CQ, &req, &l.tail)
        });
        w.expect("REREG_MR", Status::UNSUPPORTED, 0x43, |v| {
            let req = ReregMrReq {
                mr_handle: mr,
                flags: REREG_ACCESS,
                pd_handle: 0,
                access: access::LOCAL_WRITE,
                iova: 0,
                length: 0,
                buf: BufferDesc::default(),
            };
            v.ctrl()
                .call_typed::<_, RegMrResp>(Opcode::REREG_MR, &req, &[])
        });
        let srq = w.ok("CREATE_SRQ", |v| v.create_srq(pd, 16, 1, 0));
        // The version 2 form asking for a depth: the feature is missing.
        w.expect(
            "MODIFY_SRQ with SRQ_ATTR_MAX_WR",
            Status::UNSUPPORTED,
            SRQ_ATTR_MAX_WR,
            |v| {
                let req = ModifySrqReq {
                    srq_handle: srq.srq_handle,
                    attr_mask: SRQ_ATTR_MAX_WR,
                    max_wr: 32,
                    limit: 0,
                };
                v.ctrl()
                    .call_typed_unit(Opcode::MODIFY_SRQ, &req, &[])
                    .map(drop)
            },
        );
        // The version 3 form is not a request of this device: too long.
        w.expect("MODIFY_SRQ with a new ring", Status::INVALID, 16, |v| {
            let p = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
            let l = v.page_list(&p, 12, PageListMode::INLINE).unwrap();
            let req = ModifySrqResizeReq {
                srq_handle: srq.srq_handle,
                attr_mask: SRQ_ATTR_MAX_WR,
                max_wr: 32,
                limit: 0,
                buf: l.desc,
            };
            v.ctrl()
                .call_typed_unit(Opcode::MODIFY_SRQ, &req, &l.tail)
                .map(drop)
        });
        w.ok("DESTROY_SRQ", |v| v.destroy_srq(srq.srq_handle));
        let local = w.ok("REG_MR, local access only", |v| {
            let p = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
            v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0x1000, &p))
        });
        assert_eq!(local.rkey, 0, "no rkey without F_RESIZE and remote access");
        w.ok("DEREG_MR", |v| v.dereg_mr(local.mr_handle));
    });
    // With the feature, the same registration has an rkey.
    hostile(|w| {
        let pd = w.base().pd;
        let local = w.ok("REG_MR, local access only", |v| {
            let p = v.mem().alloc_pages(1, PAGE_SIZE).unwrap();
            v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0x1000, &p))
        });
        assert_ne!(local.rkey, 0, "every region has an rkey with F_RESIZE");
        w.ok("DEREG_MR", |v| v.dereg_mr(local.mr_handle));
    });
}

/// Spec 12.26: a re-registration's new length counts against
/// `max_mr_bytes` by its growth only; a refused one changes nothing, a
/// shrink gives bytes back.
#[test]
fn rereg_translation_is_charged_by_its_growth() {
    let limits = Limits {
        max_mr_bytes: 64 * 1024,
        ..Limits::default()
    };
    hostile_in(World::build(limits, opts()), |w| {
        let (pd, mr) = (w.base().pd, w.base().mr);
        let rereg = |v: &mut vhost_user_rdma_tests::verbs::Verbs<'_>, handle: u32, n: usize| {
            let p = v.mem().alloc_pages(n, PAGE_SIZE).unwrap();
            let l = v.page_list(&p, 12, PageListMode::INLINE).unwrap();
            let req = ReregMrReq {
                mr_handle: handle,
                flags: REREG_TRANSLATION,
                pd_handle: 0,
                access: 0,
                iova: 0x1000,
                length: n as u64 * PAGE_SIZE,
                buf: l.desc,
            };
            v.ctrl()
                .call_typed::<_, RegMrResp>(Opcode::REREG_MR, &req, &l.tail)
        };
        // The baseline region holds 4 KiB; 56 KiB more leaves 4 KiB free.
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
        let big = w.ok("REG_MR 56 KiB", |v| {
            let p = v.mem().alloc_pages(14, PAGE_SIZE).unwrap();
            v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0x1000, &p))
        });
        w.ok("REREG_MR 4 -> 8 KiB (grows by the 4 KiB left)", |v| {
            rereg(v, mr, 2)
        });
        assert_eq!(w.a_counts().registered_bytes, 64 * 1024);
        w.expect(
            "REREG_MR 8 -> 12 KiB over max_mr_bytes",
            Status::QUOTA,
            8,
            |v| rereg(v, mr, 3),
        );
        assert_eq!(w.a_counts().registered_bytes, 64 * 1024);
        w.ok("REREG_MR 56 -> 4 KiB", |v| rereg(v, big.mr_handle, 1));
        assert_eq!(w.a_counts().registered_bytes, 12 * 1024);
        w.ok("REREG_MR 8 -> 12 KiB after the shrink", |v| rereg(v, mr, 3));
        assert_eq!(w.a_counts().registered_bytes, 16 * 1024);
        w.ok("DEREG_MR", |v| v.dereg_mr(big.mr_handle));
        w.ok("REREG_MR back to 4 KiB", |v| rereg(v, mr, 1));
        assert_eq!(w.a_counts().registered_bytes, PAGE_SIZE);
    });
}
