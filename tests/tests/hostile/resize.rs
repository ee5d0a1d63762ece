//! Resizing commands out of their domains (`F_RESIZE`, spec 12.19, 12.25,
//! 12.26): bad handles, depths that are not powers of two or beyond the
//! device's limits, rings and regions outside guest RAM, flags that name
//! nothing, regions that cannot be re-registered. Each is refused with
//! its status and detail and changes nothing.

use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::mem::{access, BufferDesc, PageListMode, CQE_SIZE};
use virtio_rdma_abi::verbs::*;
use vm_memory::GuestAddress;

use crate::world::hostile;

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
