/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * rdma-core provider for the virtio RDMA device (virtio_rdma.ko).
 */
#ifndef __VIRTIO_RDMA_H__
#define __VIRTIO_RDMA_H__

#include <infiniband/driver.h>

/* uverbs ABI version of virtio_rdma.ko: the device ABI version. */
#define VIRTIO_RDMA_UVERBS_ABI_VERSION 2

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

#endif /* __VIRTIO_RDMA_H__ */
