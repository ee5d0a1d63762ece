// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: memory regions (REG_MR, ALLOC_MR, DEREG_MR).
 *
 * User memory is pinned with ib_umem and described to the device in the
 * largest block size both the umem and the device's page_size_cap allow,
 * in an INLINE or INDIRECT page list (vrdma_page_list(), spec 10.1, 10.2).
 *
 * Kernel consumers (with F_MEM_MGT) get the device's local DMA key as
 * their DMA MR (spec 18.28), and fast-registration regions: ALLOC_MR
 * (spec 12.22), whose pages ib_map_mr_sg() enters into a page array of
 * the region's own, which a REG_MR work request names (spec 18.27,
 * virtio_rdma_kqp.c).
 */

#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

/* Page sizes the spec allows: 4 KiB to 1 GiB. */
#define VRDMA_PAGE_SIZES GENMASK_ULL(VIRTIO_RDMA_MAX_PAGE_SHIFT, \
				     VIRTIO_RDMA_MIN_PAGE_SHIFT)

int vrdma_access(int ib_access, u32 *access)
{
	if (ib_access & ~(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC |
			  IB_ACCESS_MW_BIND | IB_ACCESS_RELAXED_ORDERING))
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
	/* The device refuses it without F_MW (UNSUPPORTED, spec 10.5). */
	if (ib_access & IB_ACCESS_MW_BIND)
		*access |= VIRTIO_RDMA_ACCESS_MW_BIND;
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
	mr->access = ib_access;
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

/*
 * The DMA MR of a kernel PD: the local DMA key, local access only (spec
 * 18.28), no device object. With IBK_LOCAL_DMA_LKEY ib_core asks for one
 * only for an unsafe global rkey, which the device does not have.
 */
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int ib_access)
{
	struct vrdma_ib *vib = to_vib(ibpd->device);
	struct vrdma_mr *mr;

	if (!vib->kverbs)
		return ERR_PTR(-EOPNOTSUPP);
	if (ib_access & ~IB_ACCESS_LOCAL_WRITE)
		return ERR_PTR(-EOPNOTSUPP);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dma = true;
	mr->ibmr.lkey = le32_to_cpu(vib->dev->attr.local_dma_lkey);
	return &mr->ibmr;
}

/*
 * A region for fast registration (ALLOC_MR, spec 12.22): free until a
 * REG_MR work request registers pages into it. Its page array is one
 * zeroed 4 KiB page of guest RAM (spec 18.27: within one 4 KiB page), so
 * at most 512 pages, and at most the device's max_fast_reg_pages.
 */
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg)
{
	struct vrdma_ib *vib = to_vib(ibpd->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_alloc_mr_req req = {
		.pd_handle = cpu_to_le32(to_vpd(ibpd)->handle),
		.max_num_sg = cpu_to_le32(max_num_sg),
	};
	struct virtio_rdma_reg_mr_resp resp;
	struct vrdma_mr *mr;
	int ret;

	if (!vib->kverbs || type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_num_sg || max_num_sg > vrdma_max_fast_reg_pages(dev))
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->pages = (__le64 *)get_zeroed_page(GFP_KERNEL);
	if (!mr->pages) {
		ret = -ENOMEM;
		goto err_free;
	}
	mr->max_pages = max_num_sg;
	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_ALLOC_MR, &req, sizeof(req),
			     &resp, sizeof(resp));
	if (ret)
		goto err_pages;
	mr->handle = le32_to_cpu(resp.mr_handle);
	/* One key in both name spaces (spec 12.22). */
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.lkey);
	return &mr->ibmr;

err_pages:
	free_page((unsigned long)mr->pages);
err_free:
	kfree(mr);
	return ERR_PTR(ret);
}

/* ib_sg_to_pages()'s callback: one page-aligned "DMA address" more. */
static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = to_vmr(ibmr);
	u64 gpa;

	if (mr->npages >= mr->max_pages ||
	    vrdma_kva_to_gpa(addr, ibmr->page_size, &gpa))
		return -ENOMEM;
	mr->pages[mr->npages++] = cpu_to_le64(gpa);
	return 0;
}

/*
 * Enters the pages of @sg into the region's page array for the next
 * REG_MR work request; ib_sg_to_pages() sets the region's iova and length.
 * The array is the device's from the post of that work request until it
 * executes: consumers map a region again only after its registration was
 * invalidated.
 */
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset)
{
	struct vrdma_mr *mr = to_vmr(ibmr);

	if (!mr->pages)
		return -EINVAL;
	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = to_vmr(ibmr);
	struct vrdma_dev *dev = to_vib(ibmr->device)->dev;
	struct virtio_rdma_mr_handle_req req = {
		.mr_handle = cpu_to_le32(mr->handle),
	};
	int ret;

	if (!mr->dma) {
		ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DEREG_MR, &req,
				     sizeof(req), NULL, 0);
		if (ret && !vrdma_dev_stopped(dev))
			return ret;
	}
	ib_umem_release(mr->umem);
	if (mr->pages)
		free_page((unsigned long)mr->pages);
	kfree(mr);
	return 0;
}
