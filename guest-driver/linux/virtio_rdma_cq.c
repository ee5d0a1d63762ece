// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: completion queues (CREATE_CQ, DESTROY_CQ).
 *
 * A user space CQ's ring and doorbell record are in the process's memory,
 * allocated by the provider, which passes their virtual addresses; the
 * kernel pins both for the CQ's lifetime and hands the device their
 * guest-physical pages (spec 10.4, 11.2). Nothing physical goes back to
 * user space. A kernel consumer's CQ has them in kernel memory, in the
 * driver's own context (virtio_rdma_kcq.c polls and arms it).
 */

#include <linux/log2.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "compat.h"
#include "uapi/virtio_rdma-abi.h"

/*
 * A user space CQ's ring and record, pinned; the page list request of
 * CREATE_CQ and the depth the provider chose.
 */
static void *vrdma_ucq_prepare(struct vrdma_cq *cq,
			       const struct ib_cq_init_attr *attr,
			       struct ib_udata *udata, size_t fixed_len,
			       struct virtio_rdma_buffer_desc *buf,
			       size_t *req_len, size_t *nlist, u64 *db_gpa)
{
	struct vrdma_dev *dev = to_vib(cq->ibcq.device)->dev;
	struct virtio_rdma_create_cq_ureq ureq = {};
	void *req;
	int ret;

	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)) || ureq.reserved)
		return ERR_PTR(-EINVAL);
	if (!ureq.depth || !is_power_of_2(ureq.depth) ||
	    ureq.depth < attr->cqe ||
	    ureq.depth > le32_to_cpu(dev->attr.max_cqe))
		return ERR_PTR(-EINVAL);
	cq->depth = ureq.depth;
	ret = vrdma_pin_queue(cq->ibcq.device, ureq.ring_va,
			      (size_t)cq->depth * VIRTIO_RDMA_CQE_SIZE,
			      ureq.db_va, &cq->q, db_gpa);
	if (ret)
		return ERR_PTR(ret);
	/* Queue buffers are described in base pages, starting a page. */
	req = vrdma_page_list(dev, cq->q.buf, PAGE_SIZE, fixed_len, buf,
			      req_len, nlist);
	if (IS_ERR(req))
		vrdma_release_queue(&cq->q);
	return req;
}

/* Releases a CQ's ring and record once the device no longer uses them. */
static void vrdma_cq_release(struct vrdma_cq *cq)
{
	if (cq->kernel)
		vrdma_kcq_free(cq);
	else
		vrdma_release_queue(&cq->q);
}

static int vrdma_create_cq(struct ib_cq *ibcq,
			   const struct ib_cq_init_attr *attr,
			   struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);
	struct vrdma_ib *vib = to_vib(ibcq->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_create_cq_uresp uresp = {};
	struct virtio_rdma_cq_handle_resp resp;
	struct virtio_rdma_create_cq_req *req;
	struct vrdma_cq *cq = to_vcq(ibcq);
	size_t req_len, nlist;
	u64 db_gpa;
	int ret;

	/* One completion vector: the event queue's (spec 1.6). */
	if (attr->flags || attr->comp_vector)
		return -EOPNOTSUPP;
	if (uc) {
		req = vrdma_ucq_prepare(cq, attr, udata, sizeof(*req), &buf,
					&req_len, &nlist, &db_gpa);
	} else if (vib->kverbs) {
		ret = vrdma_kcq_alloc(cq, attr->cqe,
				      le32_to_cpu(dev->attr.max_cqe));
		if (ret)
			return ret;
		db_gpa = virt_to_phys(cq->db);
		req = vrdma_kring_list(dev, cq->ring, (size_t)cq->depth *
				       VIRTIO_RDMA_CQE_SIZE, sizeof(*req), &buf,
				       &req_len, &nlist);
		if (IS_ERR(req))
			vrdma_kcq_free(cq);
	} else {
		/* Kernel consumers need F_MEM_MGT (the local DMA key). */
		return -EOPNOTSUPP;
	}
	if (IS_ERR(req))
		return PTR_ERR(req);
	req->ctx_handle = cpu_to_le32(uc ? uc->handle : vib->kctx_handle);
	req->depth = cpu_to_le32(cq->depth);
	req->db_gpa = cpu_to_le64(db_gpa);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_CREATE_CQ, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	if (ret == -ETIMEDOUT)
		return ret; /* the device may use the pages: keep them */
	if (ret) {
		vrdma_cq_release(cq);
		return ret;
	}
	cq->handle = le32_to_cpu(resp.cq_handle);
	ibcq->cqe = cq->depth;
	ret = xa_insert_irq(&vib->cqs, cq->handle, cq, GFP_KERNEL);
	if (ret) {
		vrdma_destroy_cq(ibcq, udata);
		return ret;
	}
	if (!uc)
		return 0;
	uresp.cq_handle = cq->handle;
	uresp.depth = cq->depth;
	ret = ib_copy_to_udata(udata, &uresp, min(udata->outlen, sizeof(uresp)));
	if (ret) {
		vrdma_destroy_cq(ibcq, udata);
		return ret;
	}
	return 0;
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
	vrdma_cq_release(cq);
	return 0;
}
