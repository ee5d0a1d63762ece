// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: memory regions of user memory (REG_MR, DEREG_MR).
 *
 * The pages are pinned with ib_umem and described to the device in the
 * largest block size both the umem and the device's page_size_cap allow,
 * with an INLINE page list when it fits in the request and an INDIRECT one
 * (list pages of 512 addresses) otherwise (spec 10.1, 10.2).
 */

#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>

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

void vrdma_free_list_pages(__le64 *tail, size_t nlist)
{
	size_t i;

	for (i = 0; i < nlist; i++)
		free_page((unsigned long)phys_to_virt(le64_to_cpu(tail[i])));
}

/*
 * Builds the page list of @umem in blocks of @pgsz: a request of
 * @fixed_len bytes (zeroed, for the caller to fill) followed by the list,
 * INLINE when it has at most max_inline_pages entries, INDIRECT otherwise.
 * Fills @buf except `addr`. The caller frees the list pages with
 * vrdma_free_list_pages() once the device has answered, then the request
 * with kvfree().
 */
void *vrdma_page_list(struct vrdma_dev *dev, struct ib_umem *umem,
		      unsigned long pgsz, size_t fixed_len,
		      struct virtio_rdma_buffer_desc *buf, size_t *req_len,
		      size_t *nlist_out)
{
	size_t npages, nlist = 0, tail_len, i;
	struct ib_block_iter biter;
	__le64 *tail, *list = NULL;
	void *req;

	npages = ib_umem_num_dma_blocks(umem, pgsz);
	if (!npages || npages > le32_to_cpu(dev->attr.max_mr_pages))
		return ERR_PTR(-EINVAL);
	if (npages <= le32_to_cpu(dev->config.max_inline_pages)) {
		tail_len = npages * sizeof(__le64);
	} else {
		nlist = DIV_ROUND_UP(npages, VIRTIO_RDMA_LIST_PAGE_ENTRIES);
		tail_len = nlist * sizeof(__le64);
	}
	req = kvzalloc(fixed_len + tail_len, GFP_KERNEL);
	if (!req)
		return ERR_PTR(-ENOMEM);
	tail = req + fixed_len;
	for (i = 0; i < nlist; i++) {
		unsigned long page = get_zeroed_page(GFP_KERNEL);

		if (!page) {
			vrdma_free_list_pages(tail, i);
			kvfree(req);
			return ERR_PTR(-ENOMEM);
		}
		tail[i] = cpu_to_le64(virt_to_phys((void *)page));
	}
	i = 0;
	/*
	 * No DMA device: the umem's DMA addresses are kernel virtual
	 * addresses of the pinned pages (ib_uses_virt_dma()).
	 */
	rdma_umem_for_each_dma_block(umem, &biter, pgsz) {
		u64 gpa = virt_to_phys((void *)(uintptr_t)
				       rdma_block_iter_dma_address(&biter));

		if (nlist) {
			size_t k = i / VIRTIO_RDMA_LIST_PAGE_ENTRIES;

			if (i % VIRTIO_RDMA_LIST_PAGE_ENTRIES == 0)
				list = phys_to_virt(le64_to_cpu(tail[k]));
			list[i % VIRTIO_RDMA_LIST_PAGE_ENTRIES] = cpu_to_le64(gpa);
		} else {
			tail[i] = cpu_to_le64(gpa);
		}
		i++;
	}
	buf->npages = cpu_to_le32(npages);
	buf->first_page_offset = cpu_to_le32(ib_umem_dma_offset(umem, pgsz));
	buf->page_shift = cpu_to_le32(__ffs(pgsz));
	buf->mode = cpu_to_le32(nlist ? VIRTIO_RDMA_PAGES_INDIRECT :
					VIRTIO_RDMA_PAGES_INLINE);
	*req_len = fixed_len + tail_len;
	*nlist_out = nlist;
	return req;
}

/*
 * Executes a command whose request vrdma_page_list() built, then frees its
 * list pages (the device copied them while it executed the command) and
 * the request. After a timeout the device may still read the list pages:
 * they are leaked rather than freed.
 */
int vrdma_exec_list(struct vrdma_dev *dev, u32 opcode, void *req,
		    size_t fixed_len, size_t req_len, size_t nlist, void *resp,
		    size_t resp_len)
{
	int ret;

	ret = vrdma_cmd_exec(dev, opcode, req, req_len, resp, resp_len);
	if (ret != -ETIMEDOUT)
		vrdma_free_list_pages(req + fixed_len, nlist);
	kvfree(req);
	return ret;
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
