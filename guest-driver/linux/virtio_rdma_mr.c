// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: memory regions of user memory (REG_MR, DEREG_MR).
 *
 * The pages are pinned with ib_umem and described to the device in the
 * largest block size both the umem and the device's page_size_cap allow,
 * in an INLINE or INDIRECT page list (vrdma_page_list(), spec 10.1, 10.2).
 */

#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

/* Page sizes the spec allows: 4 KiB to 1 GiB. */
#define VRDMA_PAGE_SIZES GENMASK_ULL(VIRTIO_RDMA_MAX_PAGE_SHIFT, \
				     VIRTIO_RDMA_MIN_PAGE_SHIFT)

struct vrdma_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;
	u32 handle;
};

static struct vrdma_mr *to_vmr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct vrdma_mr, ibmr);
}

int vrdma_access(int ib_access, u32 *access)
{
	if (ib_access & ~(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC |
			  IB_ACCESS_RELAXED_ORDERING))
		return -EOPNOTSUPP;
	*access = 0;
	if (ib_access & IB_ACCESS_LOCAL_WRITE)
		*access |= VIRTIO_RDMA_ACCESS_LOCAL_WRITE;
	if (ib_access & IB_ACCESS_REMOTE_WRITE)
		*access |= VIRTIO_RDMA_ACCESS_REMOTE_WRITE;
	if (ib_access & IB_ACCESS_REMOTE_READ)
		*access |= VIRTIO_RDMA_ACCESS_REMOTE_READ;
	if (ib_access & IB_ACCESS_REMOTE_ATOMIC)
		*access |= VIRTIO_RDMA_ACCESS_REMOTE_ATOMIC;
	return 0;
}

struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int ib_access,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibpd->device)->dev;
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_reg_mr_resp resp;
	struct virtio_rdma_reg_mr_req *req;
	size_t req_len, nlist;
	unsigned long pgsz;
	struct vrdma_mr *mr;
	u32 access;
	int ret;

	ret = vrdma_access(ib_access, &access);
	if (ret)
		return ERR_PTR(ret);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->umem = ib_umem_get(ibpd->device, start, length, ib_access);
	if (IS_ERR(mr->umem)) {
		ret = PTR_ERR(mr->umem);
		goto err_free;
	}
	pgsz = ib_umem_find_best_pgsz(mr->umem,
				      le64_to_cpu(dev->attr.page_size_cap) &
				      VRDMA_PAGE_SIZES, virt_addr);
	req = pgsz ? vrdma_page_list(dev, mr->umem, pgsz, sizeof(*req), &buf,
				     &req_len, &nlist) : ERR_PTR(-EINVAL);
	if (IS_ERR(req)) {
		ret = PTR_ERR(req);
		goto err_umem;
	}
	req->pd_handle = cpu_to_le32(to_vpd(ibpd)->handle);
	req->access = cpu_to_le32(access);
	req->iova = cpu_to_le64(virt_addr);
	req->length = cpu_to_le64(length);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_REG_MR, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	if (ret)
		goto err_umem_keep;
	mr->handle = le32_to_cpu(resp.mr_handle);
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	mr->ibmr.page_size = pgsz;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(ret);
err_umem_keep:
	/* The device may have registered the pages after all: keep them. */
	if (ret != -ETIMEDOUT)
		ib_umem_release(mr->umem);
	kfree(mr);
	return ERR_PTR(ret);
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = to_vmr(ibmr);
	struct vrdma_dev *dev = to_vib(ibmr->device)->dev;
	struct virtio_rdma_mr_handle_req req = {
		.mr_handle = cpu_to_le32(mr->handle),
	};
	int ret;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DEREG_MR, &req, sizeof(req),
			     NULL, 0);
	if (ret && !vrdma_dev_stopped(dev))
		return ret;
	ib_umem_release(mr->umem);
	kfree(mr);
	return 0;
}
