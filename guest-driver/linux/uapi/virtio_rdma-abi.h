/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * The uverbs driver data of virtio_rdma.ko: what the rdma-core provider and
 * the kernel driver exchange beside the common uverbs commands. User space
 * passes virtual addresses only; the kernel pins and translates them and
 * never returns a guest-physical address.
 */
#ifndef VIRTIO_RDMA_ABI_USER_H
#define VIRTIO_RDMA_ABI_USER_H

#include <linux/types.h>

/* The uverbs ABI version: the device ABI version it passes through. */
#define VIRTIO_RDMA_UVERBS_ABI_VERSION 2

/*
 * GET_CONTEXT request. A provider that sets VIRTIO_RDMA_UCTX_REQ_DB_PAGE
 * handles the shared-memory doorbell mode (spec 18.7). On a device in
 * that mode every context has a doorbell page and its queues doorbell
 * slots, so the kernel refuses a context to a provider that does not set
 * it (it would write its producer indices where the device no longer
 * reads them). A request shorter than this struct, or none, has flags 0.
 */
#define VIRTIO_RDMA_UCTX_REQ_DB_PAGE 1

struct virtio_rdma_alloc_ucontext_ureq {
	__u32 flags;
	__u32 reserved;
};

/*
 * GET_CONTEXT: the context's doorbell header (spec 18.4), a page that only
 * the device writes, for the provider to map read-only with mmap() at
 * db_mmap_key on the uverbs file when flags has
 * VIRTIO_RDMA_UCTX_DB_HEADER. Its first word is the engine's flags
 * (VIRTIO_RDMA_DB_FLAG_KICK, VIRTIO_RDMA_DB_FLAG_POLLING of the device ABI),
 * which say whether a post needs the kick (spec 18.6).
 *
 * With VIRTIO_RDMA_UCTX_DB_PAGE the context has a doorbell page instead
 * (spec 18.7): page_mmap_len bytes to map read-write at page_mmap_key,
 * which is always VIRTIO_RDMA_MMAP_DB_PAGE (so that a process that
 * imported the context finds it too). Its header holds the engine's
 * flags for every queue of the context, and the queues whose CREATE_QP or
 * CREATE_SRQ returned a db_slot other than VIRTIO_RDMA_NO_SLOT store
 * their producer indices into that slot of the page.
 */
#define VIRTIO_RDMA_UCTX_DB_HEADER 1
#define VIRTIO_RDMA_UCTX_DB_PAGE 2
#define VIRTIO_RDMA_MMAP_DB_PAGE 0x100000000ULL
#define VIRTIO_RDMA_NO_SLOT 0xffffffffU

struct virtio_rdma_alloc_ucontext_uresp {
	__aligned_u64 db_mmap_key;
	__u32 db_mmap_len;
	__u32 flags;
	__aligned_u64 page_mmap_key;
	__u32 page_mmap_len;
	__u32 reserved;
};

/*
 * CREATE_CQ: the ring (depth * 32 bytes, page aligned) and the 128-byte
 * doorbell record (128-byte aligned) in the caller's memory; the depth is
 * the requested number of entries rounded up to a power of two.
 */
struct virtio_rdma_create_cq_ureq {
	__aligned_u64 ring_va;
	__aligned_u64 db_va;
	__u32 depth;
	__u32 reserved;
};

struct virtio_rdma_create_cq_uresp {
	__u32 cq_handle;
	__u32 depth;
};

/*
 * CREATE_QP: the queue buffer (send ring at 0, receive ring at rq_offset, as
 * spec 11.4 lays them out for these depths and capabilities; page aligned,
 * buf_len bytes) and the 128-byte doorbell record. Depths are powers of two.
 */
struct virtio_rdma_create_qp_ureq {
	__aligned_u64 buf_va;
	__aligned_u64 buf_len;
	__aligned_u64 db_va;
	__u32 sq_depth;
	__u32 rq_depth;
};

/* db_slot: the QP's doorbell slot, or VIRTIO_RDMA_NO_SLOT (spec 18.7). */
struct virtio_rdma_create_qp_uresp {
	__u32 qp_handle;
	__u32 sq_wqe_shift;
	__u32 rq_wqe_shift;
	__u32 rq_offset;
	__u32 db_slot;
	__u32 reserved;
};

/* ALLOC_MW: the device's handle of the window, which BIND_MW names. */
struct virtio_rdma_alloc_mw_uresp {
	__u32 mw_handle;
	__u32 reserved;
};

/* CREATE_SRQ: the ring (depth WQEs, page aligned) and the doorbell record. */
struct virtio_rdma_create_srq_ureq {
	__aligned_u64 buf_va;
	__aligned_u64 buf_len;
	__aligned_u64 db_va;
	__u32 depth;
	__u32 reserved;
};

/* db_slot: the SRQ's doorbell slot, or VIRTIO_RDMA_NO_SLOT (spec 18.7). */
struct virtio_rdma_create_srq_uresp {
	__u32 srq_handle;
	__u32 wqe_shift;
	__u32 db_slot;
	__u32 reserved;
};

/*
 * RESIZE_CQ (device feature F_RESIZE): the new ring, depth * 32 bytes, page
 * aligned, depth a power of two; the doorbell record stays. The kernel
 * refuses a CQ whose provider passes none.
 */
struct virtio_rdma_resize_cq_ureq {
	__aligned_u64 ring_va;
	__u32 depth;
	__u32 reserved;
};

struct virtio_rdma_resize_cq_uresp {
	__u32 depth;
	__u32 reserved;
};

/*
 * MODIFY_SRQ with IB_SRQ_MAX_WR (F_RESIZE): the new ring, depth WQEs of the
 * stride CREATE_SRQ returned, page aligned, buf_len bytes.
 */
struct virtio_rdma_modify_srq_ureq {
	__aligned_u64 buf_va;
	__aligned_u64 buf_len;
	__u32 depth;
	__u32 reserved;
};

/* CREATE_AH: the device's handle, which UD send WQEs name (spec 18.11.5). */
struct virtio_rdma_create_ah_uresp {
	__u32 ah_handle;
	__u32 reserved;
};

#endif /* VIRTIO_RDMA_ABI_USER_H */
