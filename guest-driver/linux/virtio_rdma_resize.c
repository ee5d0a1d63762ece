// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: resizing (F_RESIZE, spec 12.19, 12.25, 12.26).
 *
 * A user CQ or SRQ gets a new ring from its provider, which pins nothing
 * itself: the kernel pins the new ring, hands the device its pages, and
 * releases the old ring once the device uses the new one (the device
 * copies the unconsumed entries across). The provider holds its CQ or
 * SRQ lock around the call and swaps its ring pointer before releasing
 * it. A kernel consumer's CQ is not resized (-EOPNOTSUPP): ib_core's
 * users size their CQs at creation.
 *
 * A user MR is re-registered in place: the device keeps its keys, so
 * ib_core's MR object stays (rereg_user_mr returns NULL).
 */

#include <linux/log2.h>
#include <linux/virtio_config.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

/* Page sizes the spec allows for regions: 4 KiB to 1 GiB. */
#define VRDMA_RESIZE_PAGE_SIZES GENMASK_ULL(VIRTIO_RDMA_MAX_PAGE_SHIFT, \
					    VIRTIO_RDMA_MIN_PAGE_SHIFT)

static bool vrdma_can_resize(struct ib_device *ibdev)
{
	return virtio_has_feature(to_vib(ibdev)->dev->vdev,
				  VIRTIO_RDMA_F_RESIZE);
}

/*
 * Pins a new ring of @len bytes at @va (page aligned) and builds a request
 * of @fixed_len bytes with its page list.
 */
static void *vrdma_new_ring(struct ib_device *ibdev, u64 va, size_t len,
			    size_t fixed_len, struct ib_umem **ring,
			    struct virtio_rdma_buffer_desc *buf,
			    size_t *req_len, size_t *nlist)
{
	void *req;

	if (!PAGE_ALIGNED(va) || !len)
		return ERR_PTR(-EINVAL);
	*ring = ib_umem_get(ibdev, va, len, IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(*ring))
		return ERR_CAST(*ring);
	req = vrdma_page_list(to_vib(ibdev)->dev, *ring, PAGE_SIZE, fixed_len,
			      buf, req_len, nlist);
	if (IS_ERR(req))
		ib_umem_release(*ring);
	return req;
}

/*
 * After the command @ret: @ring replaces *@old, whose pages the device no
 * longer uses; a refused @ring is released; after a timeout the device
 * may use either, and both stay pinned.
 */
static int vrdma_ring_done(int ret, struct ib_umem *ring, struct ib_umem **old)
{
	if (ret == -ETIMEDOUT)
		return ret;
	if (ret) {
		ib_umem_release(ring);
		return ret;
	}
	ib_umem_release(*old);
	*old = ring;
	return 0;
}

int vrdma_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibcq->device)->dev;
	struct virtio_rdma_resize_cq_uresp uresp = {};
	struct virtio_rdma_resize_cq_ureq ureq = {};
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_cq_handle_resp resp;
	struct virtio_rdma_resize_cq_req *req;
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct ib_umem *ring;
	size_t req_len, nlist;
	int ret;

	if (!vrdma_can_resize(ibcq->device) || cq->kernel || !udata)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)) || ureq.reserved)
		return -EINVAL;
	if (cqe < 1 || !is_power_of_2(ureq.depth) || ureq.depth < cqe ||
	    ureq.depth > le32_to_cpu(dev->attr.max_cqe))
		return -EINVAL;
	req = vrdma_new_ring(ibcq->device, ureq.ring_va,
			     (size_t)ureq.depth * VIRTIO_RDMA_CQE_SIZE,
			     sizeof(*req), &ring, &buf, &req_len, &nlist);
	if (IS_ERR(req))
		return PTR_ERR(req);
	req->cq_handle = cpu_to_le32(cq->handle);
	req->depth = cpu_to_le32(ureq.depth);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_RESIZE_CQ, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	ret = vrdma_ring_done(ret, ring, &cq->q.buf);
	if (ret)
		return ret;
	cq->depth = ureq.depth;
	ibcq->cqe = ureq.depth;
	uresp.depth = ureq.depth;
	return ib_copy_to_udata(udata, &uresp,
				min(udata->outlen, sizeof(uresp)));
}

int vrdma_resize_srq(struct vrdma_srq *srq, const struct ib_srq_attr *attr,
		     u32 dev_mask, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(srq->ibsrq.device)->dev;
	struct virtio_rdma_modify_srq_ureq ureq = {};
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_modify_srq_resize_req *req;
	struct ib_umem *ring;
	size_t req_len, nlist;
	int ret;

	if (!vrdma_can_resize(srq->ibsrq.device) || !udata)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)) || ureq.reserved)
		return -EINVAL;
	if (!is_power_of_2(ureq.depth) || ureq.depth < attr->max_wr)
		return -EINVAL;
	req = vrdma_new_ring(srq->ibsrq.device, ureq.buf_va, ureq.buf_len,
			     sizeof(*req), &ring, &buf, &req_len, &nlist);
	if (IS_ERR(req))
		return PTR_ERR(req);
	req->srq_handle = cpu_to_le32(srq->handle);
	req->attr_mask = cpu_to_le32(dev_mask);
	req->max_wr = cpu_to_le32(ureq.depth);
	req->limit = cpu_to_le32(attr->srq_limit);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_MODIFY_SRQ, req, sizeof(*req),
			      req_len, nlist, NULL, 0);
	return vrdma_ring_done(ret, ring, &srq->q.buf);
}

/* The device's REREG_MR flags for ib_core's IB_MR_REREG_* ones. */
static u32 vrdma_rereg_flags(int flags)
{
	u32 f = 0;

	if (flags & IB_MR_REREG_TRANS)
		f |= VIRTIO_RDMA_REREG_TRANSLATION;
	if (flags & IB_MR_REREG_PD)
		f |= VIRTIO_RDMA_REREG_PD;
	if (flags & IB_MR_REREG_ACCESS)
		f |= VIRTIO_RDMA_REREG_ACCESS;
	return f;
}

struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				  u64 length, u64 virt_addr, int ib_access,
				  struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibmr->device)->dev;
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_rereg_mr_req *req;
	struct virtio_rdma_reg_mr_resp resp;
	struct vrdma_mr *mr = to_vmr(ibmr);
	struct ib_umem *umem = NULL;
	size_t req_len = sizeof(*req), nlist = 0;
	unsigned long pgsz = 0;
	int access = mr->access;
	u32 dev_access = 0;
	int ret;

	if (!vrdma_can_resize(ibmr->device) || !mr->umem)
		return ERR_PTR(-EOPNOTSUPP);
	if (flags & ~(IB_MR_REREG_TRANS | IB_MR_REREG_PD | IB_MR_REREG_ACCESS))
		return ERR_PTR(-EOPNOTSUPP);
	if (flags & IB_MR_REREG_ACCESS) {
		ret = vrdma_access(ib_access, &dev_access);
		if (ret)
			return ERR_PTR(ret);
		access = ib_access;
		/*
		 * Pages pinned for reading only are not the device's to
		 * write: a region that becomes writable is pinned again.
		 */
		if (ib_access_writable(access) && !mr->umem->writable &&
		    !(flags & IB_MR_REREG_TRANS)) {
			flags |= IB_MR_REREG_TRANS;
			start = mr->umem->address;
			length = mr->umem->length;
			virt_addr = ibmr->iova;
		}
	}
	if (flags & IB_MR_REREG_TRANS) {
		umem = ib_umem_get(ibmr->device, start, length, access);
		if (IS_ERR(umem))
			return ERR_CAST(umem);
		pgsz = ib_umem_find_best_pgsz(umem,
					      le64_to_cpu(dev->attr.page_size_cap) &
					      VRDMA_RESIZE_PAGE_SIZES, virt_addr);
		req = pgsz ? vrdma_page_list(dev, umem, pgsz, sizeof(*req),
					     &buf, &req_len, &nlist) :
			     ERR_PTR(-EINVAL);
		if (IS_ERR(req)) {
			ib_umem_release(umem);
			return ERR_CAST(req);
		}
	} else {
		req = kvzalloc(sizeof(*req), GFP_KERNEL);
		if (!req)
			return ERR_PTR(-ENOMEM);
	}
	req->mr_handle = cpu_to_le32(mr->handle);
	req->flags = cpu_to_le32(vrdma_rereg_flags(flags));
	if (flags & IB_MR_REREG_PD)
		req->pd_handle = cpu_to_le32(to_vpd(ibpd)->handle);
	req->access = cpu_to_le32(dev_access);
	if (flags & IB_MR_REREG_TRANS) {
		req->iova = cpu_to_le64(virt_addr);
		req->length = cpu_to_le64(length);
		req->buf = buf;
	}
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_REREG_MR, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	if (ret) {
		/* After a timeout the device may use the new pages. */
		if (umem && ret != -ETIMEDOUT)
			ib_umem_release(umem);
		return ERR_PTR(ret);
	}
	if (umem) {
		ib_umem_release(mr->umem);
		mr->umem = umem;
		ibmr->page_size = pgsz;
	}
	mr->access = access;
	ibmr->lkey = le32_to_cpu(resp.lkey);
	ibmr->rkey = le32_to_cpu(resp.rkey);
	/* In place: ib_core keeps this MR and updates its PD and range. */
	return NULL;
}
