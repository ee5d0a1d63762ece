// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: user memory as the device sees it: the page lists that
 * describe pinned memory in a command, INLINE when they fit in the request
 * and INDIRECT (list pages of 512 addresses) otherwise (spec 10.1, 10.2),
 * and the ring buffers and doorbell records of CQs, QPs and SRQs, pinned
 * in the owner's memory for the queue's lifetime (spec 10.4, 11).
 */

#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>

#include "virtio_rdma.h"

void vrdma_free_list_pages(__le64 *tail, size_t nlist)
{
	size_t i;

	for (i = 0; i < nlist; i++)
		free_page((unsigned long)phys_to_virt(le64_to_cpu(tail[i])));
}

/*
 * Allocates a request of @fixed_len bytes (zeroed, for the caller to fill)
 * followed by room for the list of @npages pages: INLINE when it has at
 * most max_inline_pages entries, INDIRECT (with zeroed list pages)
 * otherwise. Fills @buf except `addr`, `first_page_offset` and
 * `page_shift`; vrdma_list_set() then enters the pages. The caller frees
 * the list pages with vrdma_free_list_pages() once the device has
 * answered, then the request with kvfree().
 */
void *vrdma_list_alloc(struct vrdma_dev *dev, size_t npages, size_t fixed_len,
		       struct virtio_rdma_buffer_desc *buf, size_t *req_len,
		       size_t *nlist_out)
{
	size_t nlist = 0, tail_len, i;
	__le64 *tail;
	void *req;

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
	buf->npages = cpu_to_le32(npages);
	buf->mode = cpu_to_le32(nlist ? VIRTIO_RDMA_PAGES_INDIRECT :
					VIRTIO_RDMA_PAGES_INLINE);
	*req_len = fixed_len + tail_len;
	*nlist_out = nlist;
	return req;
}

/* Enters page @i at @gpa into the list vrdma_list_alloc() made. */
void vrdma_list_set(void *req, size_t fixed_len, size_t nlist, size_t i,
		    u64 gpa)
{
	__le64 *tail = req + fixed_len, *list;

	if (!nlist) {
		tail[i] = cpu_to_le64(gpa);
		return;
	}
	list = phys_to_virt(le64_to_cpu(tail[i / VIRTIO_RDMA_LIST_PAGE_ENTRIES]));
	list[i % VIRTIO_RDMA_LIST_PAGE_ENTRIES] = cpu_to_le64(gpa);
}

/*
 * Builds the page list of @umem in blocks of @pgsz (vrdma_list_alloc()),
 * with the offset of its first byte in the first block.
 */
void *vrdma_page_list(struct vrdma_dev *dev, struct ib_umem *umem,
		      unsigned long pgsz, size_t fixed_len,
		      struct virtio_rdma_buffer_desc *buf, size_t *req_len,
		      size_t *nlist)
{
	struct ib_block_iter biter;
	size_t i = 0;
	void *req;

	req = vrdma_list_alloc(dev, ib_umem_num_dma_blocks(umem, pgsz),
			       fixed_len, buf, req_len, nlist);
	if (IS_ERR(req))
		return req;
	/*
	 * No DMA device: the umem's DMA addresses are kernel virtual
	 * addresses of the pinned pages (ib_uses_virt_dma()).
	 */
	rdma_umem_for_each_dma_block(umem, &biter, pgsz)
		vrdma_list_set(req, fixed_len, *nlist, i++,
			       virt_to_phys((void *)(uintptr_t)
					    rdma_block_iter_dma_address(&biter)));
	buf->first_page_offset = cpu_to_le32(ib_umem_dma_offset(umem, pgsz));
	buf->page_shift = cpu_to_le32(__ffs(pgsz));
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

/* Pins the doorbell record at @va and returns its guest-physical address. */
static int vrdma_pin_db(struct ib_device *ibdev, u64 va, struct ib_umem **umem,
			u64 *gpa)
{
	struct ib_block_iter biter;

	if (va % VIRTIO_RDMA_DB_RECORD_SIZE)
		return -EINVAL;
	*umem = ib_umem_get(ibdev, va, VIRTIO_RDMA_DB_RECORD_SIZE,
			    IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(*umem))
		return PTR_ERR(*umem);
	/* 128 bytes at a 128-byte boundary: inside one page. */
	rdma_umem_for_each_dma_block(*umem, &biter, PAGE_SIZE) {
		*gpa = virt_to_phys((void *)(uintptr_t)
				    rdma_block_iter_dma_address(&biter)) +
		       offset_in_page(va);
		return 0;
	}
	ib_umem_release(*umem);
	return -EINVAL;
}

/*
 * Pins a queue's ring buffer (@buf_len bytes at the page-aligned @buf_va)
 * and its doorbell record at @db_va (spec 10.4, 11).
 */
int vrdma_pin_queue(struct ib_device *ibdev, u64 buf_va, size_t buf_len,
		    u64 db_va, struct vrdma_queue *q, u64 *db_gpa)
{
	int ret;

	if (!PAGE_ALIGNED(buf_va) || !buf_len)
		return -EINVAL;
	q->buf = ib_umem_get(ibdev, buf_va, buf_len, IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(q->buf))
		return PTR_ERR(q->buf);
	ret = vrdma_pin_db(ibdev, db_va, &q->db, db_gpa);
	if (ret)
		ib_umem_release(q->buf);
	return ret;
}

void vrdma_release_queue(struct vrdma_queue *q)
{
	ib_umem_release(q->db);
	ib_umem_release(q->buf);
}
