//! A memory table that takes pages out from under a memory region (spec
//! 19.6.2, appendix D "Memory table changes"): the device never reaches
//! guest RAM the table no longer has, whatever a key allowed before; on a
//! host RNIC the host registration of such a region is dropped, so the
//! host keeps none of the old pages pinned and the keys fail from then on.

use std::sync::Arc;

use vhost_user_rdma_tests::dp::{
    failed, ok, poll_one, recv, vms, wr, write_op, Buf, Pair, Vm, GUARD,
};
use vhost_user_rdma_tests::harness::on_host_rnic;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{Mr, SendOp};
use vm_memory::GuestAddress;

use crate::fixtures::rc_pair;
use crate::raw::{restore_mem, unmap_page};

const PAGE: usize = 4096;

/// `pages` pages of `vm`'s RAM that nothing else uses (page-aligned, so
/// that taking one out of the table breaks no queue of the driver), filled
/// with [`GUARD`] and registered with every access right.
fn own_pages(vm: &Vm, pages: usize) -> Buf {
    let buf = Arc::new(vm.dev.alloc_dma(pages * PAGE, PAGE).unwrap());
    buf.fill(0, pages * PAGE, GUARD).unwrap();
    let mr = Mr::register(&vm.pd, buf.clone(), access::ALL).unwrap();
    Buf { buf, mr }
}

/// The guest-physical page under byte `off` of `b`.
fn page_of(b: &Buf, off: usize) -> GuestAddress {
    GuestAddress(b.buf.gpa(off).unwrap() & !(PAGE as u64 - 1))
}

/// An RDMA WRITE of `data` from `src` to byte `off` of `dst` over a fresh
/// pair (an error moves a pair to ERR); returns its completion.
fn write(a: &Vm, b: &Vm, src: &Buf, dst: &Buf, off: usize, data: &[u8], wr_id: u64) -> Pair {
    let p = rc_pair(a, b);
    src.write(0, data);
    p.qa.post_send(&[wr(wr_id, write_op(dst, off), &[src.sge(0, data.len())])])
        .unwrap();
    p
}

/// The responder's region: a page of the VM taken out of the table that is
/// not under the region leaves it working; taking one of its pages out
/// fails a remote WRITE to that page with `REM_ACCESS_ERR` and writes
/// nothing (the page is still the guest's: its VMM only stopped showing it
/// to the back-end). The rest of the region keeps working on the software
/// RNIC, which translates at every access; on a host RNIC the whole host
/// registration is gone, for good: the same key fails even after the page
/// comes back, and a new registration works.
#[test]
fn a_region_loses_the_pages_the_table_no_longer_has() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let src = own_pages(a, 1);
    let dst = own_pages(b, 2);
    let elsewhere = own_pages(b, 1);

    unmap_page(b, page_of(&elsewhere, 0));
    let p = write(a, b, &src, &dst, PAGE, b"kept", 1);
    ok(&poll_one(&p.cqa), 1, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(PAGE, 4), b"kept");
    restore_mem(b);

    unmap_page(b, page_of(&dst, PAGE));
    let p = write(a, b, &src, &dst, PAGE + 8, b"gone", 2);
    failed(&poll_one(&p.cqa), 2, WcStatus::REM_ACCESS_ERR);
    dst.assert_untouched(PAGE + 8, 4, "a page the table no longer has");
    let p = write(a, b, &src, &dst, 16, b"still", 3);
    let wc = poll_one(&p.cqa);
    if on_host_rnic() {
        failed(&wc, 3, WcStatus::REM_ACCESS_ERR);
        dst.assert_untouched(16, 5, "a region whose host registration is gone");
    } else {
        ok(&wc, 3, WcOpcode::RDMA_WRITE);
        assert_eq!(dst.read(16, 5), b"still");
    }

    restore_mem(b);
    let p = write(a, b, &src, &dst, PAGE + 32, b"back", 4);
    let wc = poll_one(&p.cqa);
    if on_host_rnic() {
        failed(&wc, 4, WcStatus::REM_ACCESS_ERR);
        dst.assert_untouched(PAGE + 32, 4, "the old key after the page came back");
    } else {
        ok(&wc, 4, WcOpcode::RDMA_WRITE);
        assert_eq!(dst.read(PAGE + 32, 4), b"back");
    }
    let again = Mr::register(&b.pd, dst.buf.clone(), access::ALL).unwrap();
    let dst2 = Buf {
        buf: dst.buf.clone(),
        mr: again,
    };
    let p = write(a, b, &src, &dst2, PAGE + 48, b"anew", 5);
    ok(&poll_one(&p.cqa), 5, WcOpcode::RDMA_WRITE);
    assert_eq!(dst.read(PAGE + 48, 4), b"anew");
}

/// The requester's region: a WRITE whose source page the table no longer
/// has fails locally with `LOC_PROT_ERR` and sends nothing.
#[test]
fn a_local_key_over_a_page_the_table_no_longer_has_fails() {
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let src = own_pages(a, 1);
    let dst = own_pages(b, 1);
    unmap_page(a, page_of(&src, 0));
    // The guest still maps the page: `write` fills it, the device must not read it.
    let p = write(a, b, &src, &dst, 0, b"source", 6);
    failed(&poll_one(&p.cqa), 6, WcStatus::LOC_PROT_ERR);
    dst.assert_untouched(0, PAGE, "a WRITE from a page the table no longer has");
    restore_mem(a);
}

/// The responder's receive buffer over a page the table no longer has: the
/// receive completes with `LOC_PROT_ERR`, the SEND with `REM_OP_ERR`
/// (spec 18.18, an SGE of the responder's receive WQE). On a host RNIC the
/// statuses are the NIC's (appendix D): checked on the software RNIC.
#[test]
fn a_receive_buffer_over_a_page_the_table_no_longer_has_fails() {
    if on_host_rnic() {
        return;
    }
    let (_d, vm) = vms(2);
    let (a, b) = (&vm[0], &vm[1]);
    let src = own_pages(a, 1);
    let dst = own_pages(b, 1);
    let p = rc_pair(a, b);
    recv(&p.qb, 7, &[dst.sge(0, PAGE)]);
    unmap_page(b, page_of(&dst, 0));
    src.write(0, b"message");
    p.qa.post_send(&[wr(8, SendOp::Send, &[src.sge(0, 7)])])
        .unwrap();
    failed(&poll_one(&p.cqa), 8, WcStatus::REM_OP_ERR);
    failed(&poll_one(&p.cqb), 7, WcStatus::LOC_PROT_ERR);
    restore_mem(b);
    dst.assert_untouched(0, PAGE, "a receive buffer the table no longer has");
}
