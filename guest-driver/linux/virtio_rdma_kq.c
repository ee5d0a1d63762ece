// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: what the queues of kernel consumers rest on: the driver's
 * own context (CREATE_CTX for the kernel, with its doorbell page if the
 * device gives it one), the
 * rings in kernel memory with their page lists, the doorbell records, the
 * notification step after a post (spec 18.6), and the translation of the
 * addresses kernel consumers give under the local DMA key (spec 18.28).
 *
 * The verbs device has no DMA device (ib_uses_virt_dma()): the "DMA
 * addresses" ib_core hands kernel consumers are kernel virtual addresses
 * of the direct map, which the driver turns into guest-physical ones
 * wherever the device needs them.
 */

#include <linux/io.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

/*
 * Creates the driver's context for kernel consumers: their PDs and CQs
 * belong to it. Its doorbell header is kernel memory the device writes
 * (spec 18.4); with F_SHMEM_DOORBELL the device may give it a doorbell
 * page instead (spec 18.7), which the driver maps: the page's header is
 * then the context's, and the kernel QPs' producer indices go into their
 * slots.
 */
int vrdma_kctx_create(struct vrdma_ib *vib)
{
	struct virtio_rdma_create_ctx_req req = {};
	struct virtio_rdma_create_ctx_resp resp;
	u32 page;
	int ret;

	/* 64 bytes, naturally aligned (kmalloc of a power of two). */
	vib->kctx_db = kzalloc(sizeof(*vib->kctx_db), GFP_KERNEL);
	if (!vib->kctx_db)
		return -ENOMEM;
	req.db_gpa = cpu_to_le64(virt_to_phys(vib->kctx_db));
	ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_CREATE_CTX, &req,
			     sizeof(req), &resp, sizeof(resp));
	if (ret) {
		/* On a timeout the device may still write the header. */
		if (ret != -ETIMEDOUT)
			kfree(vib->kctx_db);
		vib->kctx_db = NULL;
		return ret;
	}
	vib->kctx_handle = le32_to_cpu(resp.ctx_handle);
	page = le32_to_cpu(resp.doorbell_page);
	ret = vrdma_dbpage_check(vib->dev, page);
	if (!ret && page != VIRTIO_RDMA_DB_NONE) {
		vib->kctx_page = vrdma_dbpage_map(vib->dev, page);
		if (!vib->kctx_page)
			ret = -ENOMEM;
	}
	if (ret) {
		vrdma_kctx_destroy(vib);
		return ret;
	}
	return 0;
}

/* DESTROY_CTX of the kernel context, once its objects are gone. */
void vrdma_kctx_destroy(struct vrdma_ib *vib)
{
	struct virtio_rdma_ctx_handle_req req = {
		.ctx_handle = cpu_to_le32(vib->kctx_handle),
	};
	struct vrdma_dev *dev = vib->dev;

	if (!vib->kctx_db)
		return;
	if (vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_CTX, &req, sizeof(req),
			   NULL, 0) && !vrdma_dev_stopped(dev))
		return; /* the device may still write the header: keep it */
	if (vib->kctx_page)
		memunmap(vib->kctx_page);
	vib->kctx_page = NULL;
	kfree(vib->kctx_db);
	vib->kctx_db = NULL;
}

/*
 * The notification step of spec 18.6 after a producer index store of a
 * kernel queue: nothing while the engine polls (DB_FLAG_POLLING, read
 * after a compiler barrier only); otherwise a full fence, and a
 * notification of notifyq if the engine is parked (DB_FLAG_KICK). Any
 * context.
 */
void vrdma_kick(struct vrdma_ib *vib)
{
	/* A doorbell page's header is the context's (spec 18.7). */
	const __le32 *flags = vib->kctx_page ? vib->kctx_page :
					       &vib->kctx_db->flags;

	/* Not before the producer index store in program order. */
	barrier();
	if (le32_to_cpu(READ_ONCE(*flags)) & VIRTIO_RDMA_DB_FLAG_POLLING)
		return;
	/* The store before the load: pairs with the parking engine's fence. */
	smp_mb();
	if (le32_to_cpu(READ_ONCE(*flags)) & VIRTIO_RDMA_DB_FLAG_KICK)
		virtqueue_notify(vib->dev->notifyq);
}

/*
 * A ring of @len bytes for the device, zeroed (a CQ's owner bits, spec
 * 18.15), in whole pages of the guest's memory: vmalloc, so that a deep
 * ring needs no contiguous memory.
 */
void *vrdma_kring_alloc(size_t len)
{
	return vzalloc(PAGE_ALIGN(len));
}

void vrdma_kring_free(void *ring)
{
	vfree(ring);
}

/*
 * The page list of a ring from vrdma_kring_alloc() (vrdma_list_alloc()):
 * queue buffers are described in base pages from offset 0 (spec 10.3).
 */
void *vrdma_kring_list(struct vrdma_dev *dev, void *ring, size_t len,
		       size_t fixed_len, struct virtio_rdma_buffer_desc *buf,
		       size_t *req_len, size_t *nlist)
{
	size_t npages = PAGE_ALIGN(len) >> PAGE_SHIFT, i;
	void *req;

	req = vrdma_list_alloc(dev, npages, fixed_len, buf, req_len, nlist);
	if (IS_ERR(req))
		return req;
	for (i = 0; i < npages; i++)
		vrdma_list_set(req, fixed_len, *nlist, i,
			       PFN_PHYS(vmalloc_to_pfn(ring + i * PAGE_SIZE)));
	buf->page_shift = cpu_to_le32(PAGE_SHIFT);
	return req;
}

/*
 * A doorbell record: 128 bytes at a multiple of 128 (kmalloc aligns a
 * power of two naturally), zeroed as the driver half must be before the
 * create command (spec 10.4).
 */
void *vrdma_kdb_alloc(void)
{
	return kzalloc(VIRTIO_RDMA_DB_RECORD_SIZE, GFP_KERNEL);
}

/*
 * The guest-physical address of @len bytes at the kernel address @addr,
 * which a kernel consumer got from ib_dma_map_*() (a direct-map address:
 * physically contiguous): -EINVAL if it is not one.
 */
int vrdma_kva_to_gpa(u64 addr, u32 len, u64 *gpa)
{
	void *va = (void *)(uintptr_t)addr;

	if (!len) {
		*gpa = 0;
		return 0;
	}
	if (addr + len < addr || !virt_addr_valid(va) ||
	    !virt_addr_valid(va + len - 1))
		return -EINVAL;
	*gpa = virt_to_phys(va);
	return 0;
}
