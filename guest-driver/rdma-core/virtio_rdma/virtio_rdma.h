/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * rdma-core provider for the virtio RDMA device (virtio_rdma.ko).
 */
#ifndef __VIRTIO_RDMA_H__
#define __VIRTIO_RDMA_H__

#include <stdatomic.h>
#include <stdbool.h>
#include <infiniband/driver.h>
#include <rdma/virtio_rdma-abi.h>
#include <kernel-abi/virtio_rdma-abi.h>

#include "virtio_rdma_abi.h"

DECLARE_DRV_CMD(vrdma_get_context_cmd, IB_USER_VERBS_CMD_GET_CONTEXT,
		virtio_rdma_alloc_ucontext_ureq, virtio_rdma_alloc_ucontext_uresp);
DECLARE_DRV_CMD(vrdma_create_cq_cmd, IB_USER_VERBS_CMD_CREATE_CQ,
		virtio_rdma_create_cq_ureq, virtio_rdma_create_cq_uresp);
DECLARE_DRV_CMD(vrdma_create_cq_ex_cmd, IB_USER_VERBS_EX_CMD_CREATE_CQ,
		virtio_rdma_create_cq_ureq, virtio_rdma_create_cq_uresp);
DECLARE_DRV_CMD(vrdma_create_qp_cmd, IB_USER_VERBS_CMD_CREATE_QP,
		virtio_rdma_create_qp_ureq, virtio_rdma_create_qp_uresp);
DECLARE_DRV_CMD(vrdma_create_ah_cmd, IB_USER_VERBS_CMD_CREATE_AH, empty,
		virtio_rdma_create_ah_uresp);
DECLARE_DRV_CMD(vrdma_alloc_mw_cmd, IB_USER_VERBS_CMD_ALLOC_MW, empty,
		virtio_rdma_alloc_mw_uresp);
DECLARE_DRV_CMD(vrdma_create_srq_cmd, IB_USER_VERBS_CMD_CREATE_SRQ,
		virtio_rdma_create_srq_ureq, virtio_rdma_create_srq_uresp);
DECLARE_DRV_CMD(vrdma_create_xsrq_cmd, IB_USER_VERBS_CMD_CREATE_XSRQ,
		virtio_rdma_create_srq_ureq, virtio_rdma_create_srq_uresp);

/*
 * A protection domain, or a parent domain (domain.c) resting on one. The
 * references: a PD's from its parent domains, a parent domain's from the
 * queues whose memory its allocators gave; neither goes while referenced.
 */
struct vrdma_pd {
	struct ibv_pd ibv_pd;
	atomic_int refs;
	/* A parent domain's protection domain; NULL for a PD. */
	struct vrdma_pd *protection;
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size,
		       size_t alignment, uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr,
		     uint64_t resource_type);
	void *pd_context;
};

static inline struct vrdma_pd *to_vpd(struct ibv_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibv_pd);
}

/*
 * The resource_type of a parent domain's allocator calls, in the range of
 * RDMA_DRIVER_UNKNOWN (the kernel driver has no driver id of its own).
 */
#define VRDMA_RES_TYPE_QP ((uint64_t)RDMA_DRIVER_UNKNOWN << 32 | 1)
#define VRDMA_RES_TYPE_DBR ((uint64_t)RDMA_DRIVER_UNKNOWN << 32 | 2)
#define VRDMA_RES_TYPE_SRQ ((uint64_t)RDMA_DRIVER_UNKNOWN << 32 | 3)
#define VRDMA_RES_TYPE_CQ ((uint64_t)RDMA_DRIVER_UNKNOWN << 32 | 4)

/*
 * A queue's memory: its ring and its doorbell record, from the parent
 * domain's allocators (@domain, referenced) or the provider's own.
 */
struct vrdma_qmem {
	struct vrdma_pd *domain;
	bool ring_custom;
	bool db_custom;
	uint64_t ring_type;
};

struct vrdma_srq {
	/* A verbs_srq: an XRC SRQ's number is ibv_get_srq_num's (xrc.c). */
	struct verbs_srq vsrq;
	void *buf;
	void *db;
	struct vrdma_qmem mem;
	uint32_t depth;
	uint32_t wqe_shift;
	/* What the SRQ was created with: receives beyond it are refused. */
	uint32_t max_sge;
	uint32_t pi;
	/* Where the producer index goes: the record or the SRQ's slot. */
	_Atomic uint32_t *pi_word;
	uint32_t handle;
	pthread_spinlock_t lock;
};

static inline struct vrdma_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, vsrq.srq);
}

struct vrdma_ah {
	struct ibv_ah ibv_ah;
	/* The device's handle, named by UD send WQEs. */
	uint32_t handle;
};

static inline struct vrdma_ah *to_vah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibv_ah);
}

struct vrdma_mw {
	struct ibv_mw ibv_mw;
	/* The device's handle, named by BIND_MW work requests. */
	uint32_t handle;
};

static inline struct vrdma_mw *to_vmw(struct ibv_mw *ibmw)
{
	return container_of(ibmw, struct vrdma_mw, ibv_mw);
}

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	/* From QUERY_DEVICE at open: which send operations the device runs. */
	enum ibv_atomic_cap atomic_cap;
	uint64_t device_cap_flags;
	/* 0: the device has no SRQs (no F_SRQ). */
	uint32_t max_srq;
	/*
	 * The context's doorbell header (spec 18.4), mapped read-only; its
	 * flags say whether a post needs the kick. NULL: always kick.
	 */
	void *db_header;
	size_t db_header_len;
	/*
	 * Or its doorbell page (spec 18.7), mapped read-write: the header
	 * with the flags, then the slots of the queues that have one.
	 */
	void *db_page;
	/* The flags word: the page's header, the header page's, or NULL. */
	_Atomic uint32_t *db_flags;
};

struct vrdma_cq {
	/* A verbs_cq: ibv_create_cq_ex hands out its ibv_cq_ex. */
	struct verbs_cq vcq;
	/* depth * 32 bytes, page aligned, and the 128-byte doorbell record. */
	void *ring;
	void *db;
	struct vrdma_qmem mem;
	uint32_t depth;
	uint32_t handle;
	/* Consumer index (spec 18.15), under the lock. */
	uint32_t ci;
	pthread_spinlock_t lock;
	/* IBV_CREATE_CQ_ATTR_SINGLE_THREADED: the caller serialises polls. */
	bool single_threaded;
	/*
	 * ibv_start_poll .. ibv_end_poll (cq_ex.c): a copy of the entry at
	 * ci, which the caller reads; @cur_valid says ci is to be consumed.
	 */
	struct virtio_rdma_cqe cur;
	bool cur_valid;
};

static inline struct vrdma_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, vcq.cq);
}

struct vrdma_qp {
	/* A verbs_qp: libibverbs reads its comp_mask (ibv_qp_to_qp_ex). */
	struct verbs_qp vqp;
	/* Send ring at 0, receive ring at rq_offset (spec 11.4). */
	void *buf;
	size_t buf_len;
	void *db;
	struct vrdma_qmem mem;
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint32_t sq_wqe_shift;
	uint32_t rq_wqe_shift;
	uint32_t rq_offset;
	/*
	 * What the QP was created with: the device fails a WQE beyond them
	 * (and the QP with it), so posts beyond them are refused.
	 */
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t handle;
	/*
	 * The state the application last set (enum ibv_qp_state): posts to a
	 * QP that cannot take them yet fail with EINVAL, as on other devices.
	 * The device may have moved it to ERR since; posts are fine there.
	 */
	atomic_int state;
	/* Producer indices and the last consumer indices seen, under the locks. */
	uint32_t sq_pi;
	uint32_t rq_pi;
	/*
	 * Where they are stored for the device: the doorbell record, or the
	 * QP's slot of the context's doorbell page (spec 18.7).
	 */
	_Atomic uint32_t *sq_pi_word;
	_Atomic uint32_t *rq_pi_word;
	pthread_spinlock_t sq_lock;
	pthread_spinlock_t rq_lock;
	/*
	 * The extended send API (qp_ex.c): the IBV_QP_EX_WITH_* operations
	 * asked for at creation, and the batch between ibv_wr_start and
	 * ibv_wr_complete, which holds sq_lock: the open work request's header
	 * (copied into its slot when the next one opens or the batch
	 * completes), its slot, the work requests written, the consumer index
	 * seen and the batch's first error.
	 */
	uint64_t send_ops;
	struct virtio_rdma_send_wqe ex_wqe;
	uint8_t *ex_slot;
	uint32_t ex_posted;
	uint32_t ex_ci;
	int ex_err;
};

static inline struct vrdma_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp);
}

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

/* Doorbell record fields (spec 18.4). */
#define DB_SQ_PI 0
#define DB_RQ_PI 4
#define DB_SQ_CI VIRTIO_RDMA_DB_DEVICE_OFFSET
#define DB_RQ_CI (VIRTIO_RDMA_DB_DEVICE_OFFSET + 4)
#define DB_CQ_CI 0
#define DB_CQ_ARM 4
#define DB_CQ_ARMED_SEQ (VIRTIO_RDMA_DB_DEVICE_OFFSET + 4)

static inline _Atomic uint32_t *db_word(void *db, size_t off)
{
	return (_Atomic uint32_t *)((char *)db + off);
}

/*
 * The producer index words of a queue created with @slot: the slot in
 * the context's doorbell page, or @record's words (no slot). NULL if the
 * slot is one the kernel should never have passed.
 */
_Atomic uint32_t *vrdma_pi_words(struct vrdma_context *ctx, uint32_t slot,
				 void *record);

/* virtio_rdma.c */
int vrdma_query_caps(struct vrdma_context *ctx);
int vrdma_map_db_page(struct vrdma_context *ctx, uint64_t key);
void vrdma_set_ops(struct vrdma_context *ctx);
bool vrdma_qp_may_send(struct vrdma_qp *qp);
int vrdma_post_bind_type1(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad_wr);
uint8_t vrdma_wc_opcode(uint8_t opcode);
int vrdma_post_done(struct ibv_context *ibctx, uint32_t posted, int ret,
		    struct ibv_qp *qp);
int vrdma_create_cq_common(struct ibv_context *context,
			   struct ibv_cq_init_attr_ex *attr, bool ex,
			   struct ibv_pd *parent_domain, struct vrdma_cq **out);
bool vrdma_cq_next(struct vrdma_cq *cq, struct virtio_rdma_cqe *e);
void vrdma_cq_consumed(struct vrdma_cq *cq);
enum ibv_wc_status vrdma_wc_status(uint8_t status);
struct ibv_srq *vrdma_create_srq_common(struct ibv_context *context,
					struct ibv_srq_init_attr_ex *attr,
					bool xrc);

/* domain.c */
struct ibv_pd *vrdma_alloc_parent_domain(struct ibv_context *context,
					 struct ibv_parent_domain_init_attr *attr);
struct vrdma_pd *vrdma_domain_get(struct ibv_pd *ibpd);
void vrdma_domain_put(struct vrdma_pd *dom);
void *vrdma_alloc_buf(struct vrdma_pd *dom, size_t len, size_t alignment,
		      uint64_t type, bool *custom);
void vrdma_free_buf(struct vrdma_pd *dom, void *p, uint64_t type, bool custom);
int vrdma_qmem_alloc(struct vrdma_qmem *m, struct ibv_pd *pd, void **ring,
		     size_t ring_len, uint64_t ring_type, void **db);
void vrdma_qmem_free(struct vrdma_qmem *m, void *ring, void *db);

/* import.c */
struct verbs_context *vrdma_import_context(struct ibv_device *ibdev,
					   int cmd_fd);
struct ibv_pd *vrdma_import_pd(struct ibv_context *context, uint32_t pd_handle);
void vrdma_unimport_pd(struct ibv_pd *pd);
struct ibv_mr *vrdma_import_mr(struct ibv_pd *pd, uint32_t mr_handle);
void vrdma_unimport_mr(struct ibv_mr *mr);

/* mw.c */
struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int vrdma_dealloc_mw(struct ibv_mw *ibmw);
int vrdma_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind);
int vrdma_encode_bind(uint64_t wr_id, unsigned int send_flags,
		      struct ibv_mw *mw, uint32_t rkey,
		      const struct ibv_mw_bind_info *info, uint8_t *slot);

/* xrc.c */
struct ibv_xrcd *vrdma_open_xrcd(struct ibv_context *context,
				 struct ibv_xrcd_init_attr *attr);
int vrdma_close_xrcd(struct ibv_xrcd *ibxrcd);
struct ibv_srq *vrdma_create_srq_ex(struct ibv_context *context,
				    struct ibv_srq_init_attr_ex *attr);
int vrdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num);
struct ibv_qp *vrdma_create_xrc_recv_qp(struct ibv_context *context,
					struct ibv_qp_init_attr_ex *attr);
struct ibv_qp *vrdma_open_qp(struct ibv_context *context,
			     struct ibv_qp_open_attr *attr);

/* qp_ex.c */
int vrdma_qp_ex_init(struct vrdma_qp *qp, struct vrdma_context *ctx,
		     const struct ibv_qp_init_attr_ex *attr);

/* resize.c */
int vrdma_resize_cq(struct ibv_cq *ibcq, int cqe);
int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		     int mask);
int vrdma_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
		   void *addr, size_t length, int access);

/* qp_state.c */
int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		    int attr_mask);

/* cq_ex.c */
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr);

#endif /* __VIRTIO_RDMA_H__ */
