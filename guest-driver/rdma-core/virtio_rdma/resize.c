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

int vrdma_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_resize_cq_cmd_resp resp = {};
	struct vrdma_resize_cq_cmd cmd = {};
	long page = sysconf(_SC_PAGESIZE);
	bool custom, old_custom;
	uint32_t depth;
	void *ring, *old;
	int ret;

	if (cqe < 1)
		return EINVAL;
	depth = depth_for(cqe);
	ring = vrdma_alloc_buf(cq->mem.domain, (size_t)depth * 32, page,
			       cq->mem.ring_type, &custom);
	if (!ring)
		return errno ? errno : ENOMEM;
	if (!cq->single_threaded)
		pthread_spin_lock(&cq->lock);
	/* The device copies from the consumer index it reads. */
	vrdma_cq_consumed(cq);
	cmd.drv_payload.ring_va = (uintptr_t)ring;
	cmd.drv_payload.depth = depth;
	ret = ibv_cmd_resize_cq(ibcq, cqe, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (!ret && resp.depth != depth)
		ret = EPROTO;
	if (ret) {
		if (!cq->single_threaded)
			pthread_spin_unlock(&cq->lock);
		vrdma_free_buf(cq->mem.domain, ring, cq->mem.ring_type, custom);
		return ret;
	}
	old = cq->ring;
	old_custom = cq->mem.ring_custom;
	cq->ring = ring;
	cq->depth = depth;
	cq->mem.ring_custom = custom;
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
	vrdma_free_buf(cq->mem.domain, old, cq->mem.ring_type, old_custom);
	return 0;
}

/* IBV_SRQ_MAX_WR: a new ring of at least @attr->max_wr WQEs. */
static int resize_srq(struct vrdma_srq *srq, struct ibv_srq_attr *attr,
		      int mask)
{
	struct vrdma_modify_srq_cmd cmd = {};
	long page = sysconf(_SC_PAGESIZE);
	bool custom, old_custom;
	uint32_t depth;
	void *ring, *old;
	size_t len;
	int ret;

	if (attr->max_wr < 1 || attr->max_wr > (1U << 31))
		return EINVAL;
	depth = depth_for(attr->max_wr);
	len = (size_t)depth << srq->wqe_shift;
	ring = vrdma_alloc_buf(srq->mem.domain, len, page, srq->mem.ring_type,
			       &custom);
	if (!ring)
		return errno ? errno : ENOMEM;
	pthread_spin_lock(&srq->lock);
	cmd.drv_payload.buf_va = (uintptr_t)ring;
	cmd.drv_payload.buf_len = len;
	cmd.drv_payload.depth = depth;
	ret = ibv_cmd_modify_srq(&srq->ibv_srq, attr, mask, &cmd.ibv_cmd,
				 sizeof(cmd));
	if (ret) {
		pthread_spin_unlock(&srq->lock);
		vrdma_free_buf(srq->mem.domain, ring, srq->mem.ring_type,
			       custom);
		return ret;
	}
	old = srq->buf;
	old_custom = srq->mem.ring_custom;
	srq->buf = ring;
	srq->depth = depth;
	srq->mem.ring_custom = custom;
	pthread_spin_unlock(&srq->lock);
	vrdma_free_buf(srq->mem.domain, old, srq->mem.ring_type, old_custom);
	return 0;
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
