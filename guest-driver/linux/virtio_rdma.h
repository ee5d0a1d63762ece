/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * virtio-rdma: Linux guest driver for the virtio RDMA device (ID 42).
 */
#ifndef _VIRTIO_RDMA_H
#define _VIRTIO_RDMA_H

#include <linux/completion.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>

#include "virtio_rdma_abi.h"

/* Event buffers kept on the event queue. */
#define VRDMA_EVENT_BUFS 64

struct vrdma_dev {
	struct virtio_device *vdev;
	struct virtqueue *ctrlq;
	struct virtqueue *eventq;
	struct virtqueue *notifyq;
	/* Serialises adding to and kicking the control queue. */
	spinlock_t ctrl_lock;
	u64 next_request_id;
	/* Event buffers, device-writable. */
	struct virtio_rdma_event *events;
	/* Serialises taking and re-posting event buffers. */
	spinlock_t event_lock;
	struct virtio_rdma_device_config config;
	struct virtio_rdma_device_attr attr;
	struct virtio_rdma_port_attr port;
};

/* One control command in flight. */
struct vrdma_cmd {
	struct completion done;
	struct virtio_rdma_request_header req;
	struct virtio_rdma_response_header resp;
	unsigned int used_len;
	/* The request, then room for the response. */
	u8 data[];
};

int vrdma_cmd_exec(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len, void *resp, size_t resp_len);

#endif /* _VIRTIO_RDMA_H */
