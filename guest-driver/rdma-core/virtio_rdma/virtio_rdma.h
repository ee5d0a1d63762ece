/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * rdma-core provider for the virtio RDMA device (virtio_rdma.ko).
 */
#ifndef __VIRTIO_RDMA_H__
#define __VIRTIO_RDMA_H__

#include <infiniband/driver.h>
#include <rdma/virtio_rdma-abi.h>
#include <kernel-abi/virtio_rdma-abi.h>

#include "virtio_rdma_abi.h"

DECLARE_DRV_CMD(vrdma_get_context_cmd, IB_USER_VERBS_CMD_GET_CONTEXT, empty,
		virtio_rdma_alloc_ucontext_uresp);
DECLARE_DRV_CMD(vrdma_create_cq_cmd, IB_USER_VERBS_CMD_CREATE_CQ,
		virtio_rdma_create_cq_ureq, virtio_rdma_create_cq_uresp);
DECLARE_DRV_CMD(vrdma_create_qp_cmd, IB_USER_VERBS_CMD_CREATE_QP,
		virtio_rdma_create_qp_ureq, virtio_rdma_create_qp_uresp);
DECLARE_DRV_CMD(vrdma_create_ah_cmd, IB_USER_VERBS_CMD_CREATE_AH, empty,
		virtio_rdma_create_ah_uresp);
DECLARE_DRV_CMD(vrdma_create_srq_cmd, IB_USER_VERBS_CMD_CREATE_SRQ,
		virtio_rdma_create_srq_ureq, virtio_rdma_create_srq_uresp);

struct vrdma_srq {
	struct ibv_srq ibv_srq;
	void *buf;
	void *db;
	uint32_t depth;
	uint32_t wqe_shift;
	/* What the SRQ was created with: receives beyond it are refused. */
	uint32_t max_sge;
	uint32_t pi;
	uint32_t handle;
	pthread_spinlock_t lock;
};

static inline struct vrdma_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, ibv_srq);
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

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	/*
	 * The context's doorbell header (spec 18.4), mapped read-only; its
	 * flags say whether a post needs the kick. NULL: always kick.
	 */
	void *db_header;
	size_t db_header_len;
};

struct vrdma_cq {
	struct ibv_cq ibv_cq;
	/* depth * 32 bytes, page aligned, and the 128-byte doorbell record. */
	void *ring;
	void *db;
	uint32_t depth;
	uint32_t handle;
	/* Consumer index (spec 18.15), under the lock. */
	uint32_t ci;
	pthread_spinlock_t lock;
};

static inline struct vrdma_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, ibv_cq);
}

struct vrdma_qp {
	/* A verbs_qp: libibverbs reads its comp_mask (ibv_qp_to_qp_ex). */
	struct verbs_qp vqp;
	/* Send ring at 0, receive ring at rq_offset (spec 11.4). */
	void *buf;
	size_t buf_len;
	void *db;
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
	/* Producer indices and the last consumer indices seen, under the locks. */
	uint32_t sq_pi;
	uint32_t rq_pi;
	pthread_spinlock_t sq_lock;
	pthread_spinlock_t rq_lock;
};

static inline struct vrdma_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp);
}

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

#endif /* __VIRTIO_RDMA_H__ */
