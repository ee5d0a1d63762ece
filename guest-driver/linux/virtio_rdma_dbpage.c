// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the shared-memory doorbell mode (F_SHMEM_DOORBELL, spec
 * 18.7). The device's doorbell region is a VIRTIO shared memory region,
 * one 4 KiB page per context; a context's queues store their producer
 * indices into slots of its page instead of their doorbell records. The
 * driver accepts the mode only where each process can be given exactly
 * its own context's page: 4 KiB pages, and a transport that shows the
 * region. It maps a process's page into that process (vrdma_mmap), the
 * kernel context's page into the kernel, and checks every page and slot
 * number the device returns before it uses it.
 *
 * The region is ordinary write-back memory (spec 18.7, "Memory type"):
 * the kernel maps it with memremap(MEMREMAP_WB) and processes with the
 * default protection of a shared mapping.
 */

#include <linux/io.h>
#include <linux/log2.h>
#include <linux/module.h>
#include <linux/virtio_config.h>

#include "virtio_rdma.h"

static bool shmem_doorbell = true;
module_param(shmem_doorbell, bool, 0444);
MODULE_PARM_DESC(shmem_doorbell,
		 "Accept the shared-memory doorbell mode when the device offers it (default true)");

/* Can one guest page hold exactly one doorbell page? */
static bool vrdma_pages_fit(void)
{
	unsigned long page = PAGE_SIZE;

	return page == VIRTIO_RDMA_DB_PAGE_SIZE;
}

/*
 * Before FEATURES_OK: drops F_SHMEM_DOORBELL where the driver cannot use
 * it, so that the device keeps every context in guest-RAM mode.
 */
void vrdma_dbpage_validate(struct virtio_device *vdev)
{
	struct virtio_shm_region region;

	if (!virtio_has_feature(vdev, VIRTIO_RDMA_F_SHMEM_DOORBELL))
		return;
	/* A larger guest page would give a process its neighbours' slots. */
	if (!vrdma_pages_fit() || !shmem_doorbell ||
	    !virtio_get_shm_region(vdev, &region,
				   VIRTIO_RDMA_SHMEM_ID_DOORBELL))
		__virtio_clear_bit(vdev, VIRTIO_RDMA_F_SHMEM_DOORBELL);
}

/*
 * At each start: where the doorbell region is. It must hold a page for
 * every context (a power of two of at least max_ctx pages).
 */
int vrdma_dbpage_start(struct vrdma_dev *dev)
{
	struct virtio_shm_region region = {};
	u64 need;

	dev->dbr_len = 0;
	if (!virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_SHMEM_DOORBELL))
		return 0;
	need = (u64)le32_to_cpu(dev->config.max_ctx) * VIRTIO_RDMA_DB_PAGE_SIZE;
	if (!virtio_get_shm_region(dev->vdev, &region,
				   VIRTIO_RDMA_SHMEM_ID_DOORBELL) ||
	    region.len < need || !is_power_of_2(region.len) ||
	    !PAGE_ALIGNED(region.addr)) {
		dev_err(&dev->vdev->dev,
			"F_SHMEM_DOORBELL without a usable doorbell region (%llu bytes at %#llx, need %llu)\n",
			region.len, region.addr, need);
		return -EIO;
	}
	dev->dbr_addr = region.addr;
	dev->dbr_len = region.len;
	return 0;
}

/*
 * Is @page, from CREATE_CTX, a page of the region? -EIO if not: the
 * device broke the spec, and the context is not used.
 */
int vrdma_dbpage_check(struct vrdma_dev *dev, u32 page)
{
	if (page == VIRTIO_RDMA_DB_NONE)
		return 0;
	if (!dev->dbr_len || page >= le32_to_cpu(dev->config.max_ctx) ||
	    ((u64)page + 1) * VIRTIO_RDMA_DB_PAGE_SIZE > dev->dbr_len) {
		dev_warn_ratelimited(&dev->vdev->dev,
				     "CREATE_CTX returned doorbell page %u outside the region\n",
				     page);
		return -EIO;
	}
	return 0;
}

/* The page frame of doorbell page @page (checked by vrdma_dbpage_check). */
unsigned long vrdma_dbpage_pfn(struct vrdma_dev *dev, u32 page)
{
	return PHYS_PFN(dev->dbr_addr) + page;
}

/*
 * Is @slot, from CREATE_QP or CREATE_SRQ, usable for a queue of a context
 * that has a page (@has_page) or not? A slot without a page, or past the
 * page's last slot, is the device's error.
 */
int vrdma_dbslot_check(bool has_page, u32 slot)
{
	if (slot == VIRTIO_RDMA_DB_NONE)
		return 0;
	return has_page && slot < VIRTIO_RDMA_DB_PAGE_SLOTS ? 0 : -EIO;
}

/* Maps the kernel context's page @page; NULL if it cannot. */
void *vrdma_dbpage_map(struct vrdma_dev *dev, u32 page)
{
	return memremap(dev->dbr_addr + (phys_addr_t)page *
			VIRTIO_RDMA_DB_PAGE_SIZE,
			VIRTIO_RDMA_DB_PAGE_SIZE, MEMREMAP_WB);
}

/* The producer index words of slot @slot of the mapped page @page. */
__le32 *vrdma_dbslot(void *page, u32 slot)
{
	return page + VIRTIO_RDMA_DB_SLOT_OFFSET +
	       (size_t)slot * VIRTIO_RDMA_DB_SLOT_SIZE;
}

/* Does the user context of @udata have a doorbell page? */
bool vrdma_udata_has_page(struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);

	return uc && uc->db_page;
}
