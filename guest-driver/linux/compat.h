/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * virtio-rdma: the kernel interfaces that differ between the kernels the
 * driver builds for (Debian 12's 6.1 and Debian 13's 6.12), in one place.
 * Each helper uses the interface of the kernel it is built for, as that
 * kernel's in-tree drivers do; the rest of the driver calls the helpers
 * only.
 */
#ifndef _VIRTIO_RDMA_COMPAT_H
#define _VIRTIO_RDMA_COMPAT_H

#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/version.h>
#include <linux/virtio_config.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

/*
 * Clears flags of a VMA being mapped. Since 6.3 vma->vm_flags is read-only
 * and changes go through vm_flags_clear(), which also asserts the mmap
 * lock that the caller (the mmap handler) holds.
 */
static inline void vrdma_vm_flags_clear(struct vm_area_struct *vma,
					vm_flags_t flags)
{
#if KERNEL_VERSION(6, 3, 0) <= LINUX_VERSION_CODE
	vm_flags_clear(vma, flags);
#else
	vma->vm_flags &= ~flags;
#endif
}

/*
 * virtio_find_vqs() for queues given by callback and name, no context and
 * no interrupt affinity. Since 6.11 it takes one struct virtqueue_info per
 * queue; before, an array of callbacks and one of names. The virtio core
 * keeps neither array.
 */
static inline int vrdma_virtio_find_vqs(struct virtio_device *vdev,
					unsigned int nvqs,
					struct virtqueue *vqs[],
					vq_callback_t *callbacks[],
					const char * const names[])
{
#if KERNEL_VERSION(6, 11, 0) <= LINUX_VERSION_CODE
	struct virtqueue_info *info;
	unsigned int i;
	int ret;

	info = kcalloc(nvqs, sizeof(*info), GFP_KERNEL);
	if (!info)
		return -ENOMEM;
	for (i = 0; i < nvqs; i++) {
		info[i].name = names[i];
		info[i].callback = callbacks[i];
	}
	ret = virtio_find_vqs(vdev, nvqs, vqs, info, NULL);
	kfree(info);
	return ret;
#else
	return virtio_find_vqs(vdev, nvqs, vqs, callbacks, names, NULL);
#endif
}

/*
 * The last parameter of the create_cq verb of struct ib_device_ops, a
 * VRDMA_CREATE_CQ_ATTRS pointer, and the udata it gives. Since 6.11 ib_core
 * passes the whole uverbs attribute bundle (NULL for a kernel consumer's
 * CQ), whose driver_udata is what it passed before.
 */
#if KERNEL_VERSION(6, 11, 0) <= LINUX_VERSION_CODE
#define VRDMA_CREATE_CQ_ATTRS struct uverbs_attr_bundle
static inline struct ib_udata *
vrdma_create_cq_udata(struct uverbs_attr_bundle *attrs)
{
	return attrs ? &attrs->driver_udata : NULL;
}
#else
#define VRDMA_CREATE_CQ_ATTRS struct ib_udata
static inline struct ib_udata *vrdma_create_cq_udata(struct ib_udata *udata)
{
	return udata;
}
#endif

#endif /* _VIRTIO_RDMA_COMPAT_H */
