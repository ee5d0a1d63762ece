// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: shared receive queues of user space (spec 12.18 to 12.21),
 * pinned like CQs and QPs; the kick for SRQ receives is a post of no
 * receive work request.
 */

#include <linux/log2.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

#define VRDMA_SRQ_ATTR_MAX_WR 0x1
#define VRDMA_SRQ_ATTR_LIMIT 0x2

int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibsrq->device)->dev;
	struct virtio_rdma_create_srq_uresp uresp = {};
	struct virtio_rdma_create_srq_ureq ureq = {};
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_create_xrc_srq_req xrc_req = {}, *xreq;
	struct virtio_rdma_create_srq_resp resp;
	struct virtio_rdma_create_srq_req *req;
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	bool xrc = init->srq_type == IB_SRQT_XRC;
	size_t req_len, nlist, fixed;
	u64 db_gpa;
	int ret;

	if (!udata || (init->srq_type != IB_SRQT_BASIC && !xrc))
		return -EOPNOTSUPP;
	/* An XRC SRQ's request: CREATE_SRQ's with its domain and CQ. */
	fixed = xrc ? sizeof(*xreq) : sizeof(*req);
	if (xrc) {
		ret = vrdma_xrc_srq_req(ibsrq, init, &xrc_req);
		if (ret)
			return ret;
	}
	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)) || ureq.reserved ||
	    !is_power_of_2(ureq.depth) || ureq.depth < init->attr.max_wr)
		return -EINVAL;
	ret = vrdma_pin_queue(ibsrq->device, ureq.buf_va, ureq.buf_len,
			      ureq.db_va, &srq->q, &db_gpa);
	if (ret)
		return ret;
	req = vrdma_page_list(dev, srq->q.buf, PAGE_SIZE, fixed, &buf,
			      &req_len, &nlist);
	if (IS_ERR(req)) {
		ret = PTR_ERR(req);
		goto err_queue;
	}
	if (xrc) {
		xreq = (void *)req;
		xreq->xrcd_handle = xrc_req.xrcd_handle;
		xreq->cq_handle = xrc_req.cq_handle;
		xreq->pd_handle = cpu_to_le32(to_vpd(ibsrq->pd)->handle);
		xreq->depth = cpu_to_le32(ureq.depth);
		xreq->max_sge = cpu_to_le32(init->attr.max_sge);
		xreq->limit = cpu_to_le32(init->attr.srq_limit);
		xreq->db_gpa = cpu_to_le64(db_gpa);
		xreq->buf = buf;
	} else {
		req->pd_handle = cpu_to_le32(to_vpd(ibsrq->pd)->handle);
		req->depth = cpu_to_le32(ureq.depth);
		req->max_sge = cpu_to_le32(init->attr.max_sge);
		req->limit = cpu_to_le32(init->attr.srq_limit);
		req->db_gpa = cpu_to_le64(db_gpa);
		req->buf = buf;
	}
	ret = vrdma_exec_list(dev, xrc ? VIRTIO_RDMA_OP_CREATE_XRC_SRQ :
					 VIRTIO_RDMA_OP_CREATE_SRQ,
			      req, fixed, req_len, nlist, &resp, sizeof(resp));
	if (ret == -ETIMEDOUT)
		return ret; /* the device may use the pages: keep them pinned */
	if (ret)
		goto err_queue;
	srq->handle = le32_to_cpu(resp.srq_handle);
	/* What ib_core reports as the SRQ's number (ibv_get_srq_num). */
	if (xrc)
		ibsrq->ext.xrc.srq_num = le32_to_cpu(resp.srqn);
	srq->limit_armed = init->attr.srq_limit != 0;
	ret = xa_insert_irq(&to_vib(ibsrq->device)->srqs, srq->handle, srq,
			    GFP_KERNEL);
	if (ret) {
		vrdma_destroy_srq(ibsrq, udata);
		return ret;
	}
	uresp.srq_handle = srq->handle;
	uresp.wqe_shift = le32_to_cpu(resp.wqe_shift);
	uresp.db_slot = le32_to_cpu(resp.db_slot);
	ret = vrdma_dbslot_check(vrdma_udata_has_page(udata), uresp.db_slot);
	if (!ret)
		ret = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
	if (ret) {
		vrdma_destroy_srq(ibsrq, udata);
		return ret;
	}
	return 0;

err_queue:
	vrdma_release_queue(&srq->q);
	return ret;
}

int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct virtio_rdma_modify_srq_req req = {
		.srq_handle = cpu_to_le32(to_vsrq(ibsrq)->handle),
		.max_wr = cpu_to_le32(attr->max_wr),
		.limit = cpu_to_le32(attr->srq_limit),
	};
	u32 dev_mask = 0;
	int ret;

	if (mask & ~(IB_SRQ_MAX_WR | IB_SRQ_LIMIT))
		return -EOPNOTSUPP;
	if (mask & IB_SRQ_MAX_WR)
		dev_mask |= VRDMA_SRQ_ATTR_MAX_WR;
	if (mask & IB_SRQ_LIMIT)
		dev_mask |= VRDMA_SRQ_ATTR_LIMIT;
	req.attr_mask = cpu_to_le32(dev_mask);
	if (mask & IB_SRQ_MAX_WR)
		ret = vrdma_resize_srq(to_vsrq(ibsrq), attr, dev_mask, udata);
	else
		ret = vrdma_cmd_exec(to_vib(ibsrq->device)->dev,
				     VIRTIO_RDMA_OP_MODIFY_SRQ, &req,
				     sizeof(req), NULL, 0);
	/* What the EVENTS_LOST re-query compares with. */
	if (!ret && (mask & IB_SRQ_LIMIT))
		WRITE_ONCE(to_vsrq(ibsrq)->limit_armed, attr->srq_limit != 0);
	return ret;
}

int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct virtio_rdma_srq_handle_req req = {
		.srq_handle = cpu_to_le32(to_vsrq(ibsrq)->handle),
	};
	struct virtio_rdma_query_srq_resp resp;
	int ret;

	ret = vrdma_cmd_exec(to_vib(ibsrq->device)->dev,
			     VIRTIO_RDMA_OP_QUERY_SRQ, &req, sizeof(req), &resp,
			     sizeof(resp));
	if (ret)
		return ret;
	attr->max_wr = le32_to_cpu(resp.depth);
	attr->max_sge = le32_to_cpu(resp.max_sge);
	attr->srq_limit = le32_to_cpu(resp.limit);
	return 0;
}

int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_ib *vib = to_vib(ibsrq->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_srq_handle_req req = {
		.srq_handle = cpu_to_le32(srq->handle),
	};
	unsigned long flags;
	int ret;

	/* Its events (virtio_rdma_event.c) no longer find it. */
	spin_lock_irqsave(&dev->event_lock, flags);
	xa_cmpxchg(&vib->srqs, srq->handle, srq, NULL, 0);
	spin_unlock_irqrestore(&dev->event_lock, flags);

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_SRQ, &req, sizeof(req),
			     NULL, 0);
	if (ret && !vrdma_dev_stopped(dev))
		return ret;
	vrdma_release_queue(&srq->q);
	return 0;
}

/* The kick for SRQ receives (see vrdma_post_send). */
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr)
{
	if (wr) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	virtqueue_notify(to_vib(ibsrq->device)->dev->notifyq);
	return 0;
}
