// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: completion queues of user space (CREATE_CQ, DESTROY_CQ).
 *
 * The provider allocates the ring and the doorbell record in its own memory
 * and passes their virtual addresses; the kernel pins both for the CQ's
 * lifetime and hands the device their guest-physical pages (spec 10.4,
 * 11.2). Nothing physical goes back to user space.
 */

#include <linux/log2.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "compat.h"
#include "uapi/virtio_rdma-abi.h"

static int vrdma_create_cq(struct ib_cq *ibcq,
			   const struct ib_cq_init_attr *attr,
			   struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);
	struct vrdma_dev *dev = to_vib(ibcq->device)->dev;
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_create_cq_uresp uresp = {};
	struct virtio_rdma_create_cq_ureq ureq = {};
	struct virtio_rdma_cq_handle_resp resp;
	struct virtio_rdma_create_cq_req *req;
	struct vrdma_cq *cq = to_vcq(ibcq);
	size_t req_len, nlist;
	u32 depth;
	u64 db_gpa;
	int ret;

	/* Kernel consumers have no context: ABI version 2 serves user space. */
	if (!uc)
		return -EOPNOTSUPP;
	if (attr->flags || attr->comp_vector)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)) || ureq.reserved)
		return -EINVAL;
	depth = ureq.depth;
	if (!depth || !is_power_of_2(depth) || depth < attr->cqe ||
	    depth > le32_to_cpu(dev->attr.max_cqe))
		return -EINVAL;

	ret = vrdma_pin_queue(ibcq->device, ureq.ring_va,
			      (size_t)depth * VIRTIO_RDMA_CQE_SIZE, ureq.db_va,
			      &cq->q, &db_gpa);
	if (ret)
		return ret;
	/* Queue buffers are described in base pages, starting a page. */
	req = vrdma_page_list(dev, cq->q.buf, PAGE_SIZE, sizeof(*req), &buf,
			      &req_len, &nlist);
	if (IS_ERR(req)) {
		ret = PTR_ERR(req);
		goto err_queue;
	}
	req->ctx_handle = cpu_to_le32(uc->handle);
	req->depth = cpu_to_le32(depth);
	req->db_gpa = cpu_to_le64(db_gpa);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_CREATE_CQ, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	if (ret == -ETIMEDOUT)
		return ret; /* the device may use the pages: keep them pinned */
	if (ret)
		goto err_queue;
	cq->handle = le32_to_cpu(resp.cq_handle);
	ibcq->cqe = depth;
	ret = xa_insert_irq(&to_vib(ibcq->device)->cqs, cq->handle, cq,
			    GFP_KERNEL);
	if (ret) {
		vrdma_destroy_cq(ibcq, udata);
		return ret;
	}
	uresp.cq_handle = cq->handle;
	uresp.depth = depth;
	ret = ib_copy_to_udata(udata, &uresp, min(udata->outlen, sizeof(uresp)));
	if (ret) {
		vrdma_destroy_cq(ibcq, udata);
		return ret;
	}
	return 0;

err_queue:
	vrdma_release_queue(&cq->q);
	return ret;
}

/* The create_cq verb, whose last parameter depends on the kernel (compat.h). */
int vrdma_ops_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
			VRDMA_CREATE_CQ_ATTRS *attrs)
{
	return vrdma_create_cq(ibcq, attr, vrdma_create_cq_udata(attrs));
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_ib *vib = to_vib(ibcq->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_cq_handle_req req = {
		.cq_handle = cpu_to_le32(cq->handle),
	};
	unsigned long flags;
	int ret;

	/* Its events (virtio_rdma_event.c) no longer find it. */
	spin_lock_irqsave(&dev->event_lock, flags);
	xa_cmpxchg(&vib->cqs, cq->handle, cq, NULL, 0);
	spin_unlock_irqrestore(&dev->event_lock, flags);

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_CQ, &req, sizeof(req),
			     NULL, 0);
	if (ret && !vrdma_dev_stopped(dev))
		return ret;
	vrdma_release_queue(&cq->q);
	return 0;
}
