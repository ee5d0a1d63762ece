// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Resizing (device feature F_RESIZE, spec 12.19, 12.25, 12.26): a CQ or
 * SRQ gets a new ring from the queue's allocator (a parent domain's, if
 * it was made with one); the kernel pins it and the device copies the
 * entries not consumed yet across, at the same indices. The CQ's or
 * SRQ's lock is held from before the command until the ring pointer is
 * swapped, so that nothing is polled from or posted into the old ring
 * after the device took its entries. A memory region is re-registered
 * in place; the device keeps its keys.
 */

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <util/util.h>

#include "virtio_rdma.h"

DECLARE_DRV_CMD(vrdma_resize_cq_cmd, IB_USER_VERBS_CMD_RESIZE_CQ,
		virtio_rdma_resize_cq_ureq, virtio_rdma_resize_cq_uresp);
DECLARE_DRV_CMD(vrdma_modify_srq_cmd, IB_USER_VERBS_CMD_MODIFY_SRQ,
		virtio_rdma_modify_srq_ureq, empty);

/* The smallest power of two >= @v (@v at most 2^31). */
static uint32_t depth_for(uint32_t v)
{
	uint32_t d = 1;

	while (d < v && d < (1U << 31))
		d <<= 1;
	return d;
}

/* A ring from a queue's allocator. */
struct new_ring {
	void *p;
	bool custom;
};

static int ring_alloc(struct vrdma_qmem *m, size_t len, struct new_ring *r)
{
	r->p = vrdma_alloc_buf(m->domain, len, sysconf(_SC_PAGESIZE),
			       m->ring_type, &r->custom);
	if (!r->p)
		return errno ? errno : ENOMEM;
	return 0;
}

/* Makes @r the queue's ring (*@ring of @m); @r holds the old one then. */
static void ring_swap(struct vrdma_qmem *m, void **ring, struct new_ring *r)
{
	struct new_ring old = { .p = *ring, .custom = m->ring_custom };

	*ring = r->p;
	m->ring_custom = r->custom;
	*r = old;
}

static void ring_free(struct vrdma_qmem *m, struct new_ring *r)
{
	vrdma_free_buf(m->domain, r->p, m->ring_type, r->custom);
}

int vrdma_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_resize_cq_cmd_resp resp = {};
	struct vrdma_resize_cq_cmd cmd = {};
	struct new_ring r;
	uint32_t depth;
	int ret;

	if (cqe < 1)
		return EINVAL;
	depth = depth_for(cqe);
	ret = ring_alloc(&cq->mem, (size_t)depth * 32, &r);
	if (ret)
		return ret;
	if (!cq->single_threaded)
		pthread_spin_lock(&cq->lock);
	/* The device copies from the consumer index it reads. */
	atomic_store_explicit(db_word(cq->db, DB_CQ_CI), cq->ci,
			      memory_order_release);
	cmd.drv_payload.ring_va = (uintptr_t)r.p;
	cmd.drv_payload.depth = depth;
	ret = ibv_cmd_resize_cq(ibcq, cqe, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (!ret) {
		ring_swap(&cq->mem, &cq->ring, &r);
		cq->depth = depth;
	}
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
	/* The old ring, or the new one the device refused. */
	ring_free(&cq->mem, &r);
	return ret;
}

/* IBV_SRQ_MAX_WR: a new ring of at least @attr->max_wr WQEs. */
static int resize_srq(struct vrdma_srq *srq, struct ibv_srq_attr *attr,
		      int mask)
{
	struct vrdma_modify_srq_cmd cmd = {};
	struct new_ring r;
	uint32_t depth;
	size_t len;
	int ret;

	if (attr->max_wr < 1 || attr->max_wr > (1U << 31))
		return EINVAL;
	depth = depth_for(attr->max_wr);
	len = (size_t)depth << srq->wqe_shift;
	ret = ring_alloc(&srq->mem, len, &r);
	if (ret)
		return ret;
	pthread_spin_lock(&srq->lock);
	cmd.drv_payload.buf_va = (uintptr_t)r.p;
	cmd.drv_payload.buf_len = len;
	cmd.drv_payload.depth = depth;
	ret = ibv_cmd_modify_srq(&srq->vsrq.srq, attr, mask, &cmd.ibv_cmd,
				 sizeof(cmd));
	if (!ret) {
		ring_swap(&srq->mem, &srq->buf, &r);
		srq->depth = depth;
	}
	pthread_spin_unlock(&srq->lock);
	ring_free(&srq->mem, &r);
	return ret;
}

int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		     int mask)
{
	struct ibv_modify_srq cmd;

	if (mask & IBV_SRQ_MAX_WR)
		return resize_srq(to_vsrq(ibsrq), attr, mask);
	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

int vrdma_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
		   void *addr, size_t length, int access)
{
	struct ib_uverbs_rereg_mr_resp resp;
	struct ibv_rereg_mr cmd;

	/* In place: the kernel and the device keep the region's keys. */
	return ibv_cmd_rereg_mr(vmr, flags, addr, length, (uintptr_t)addr,
				access, pd, &cmd, sizeof(cmd), &resp,
				sizeof(resp));
}
