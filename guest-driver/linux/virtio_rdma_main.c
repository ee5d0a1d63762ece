// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: Linux guest driver for the virtio RDMA device (ID 42).
 *
 * Device discovery and the control and event queues (spec chapters 6, 7
 * and 14). The verbs device is registered on top of this.
 */

#include <linux/module.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include "virtio_rdma.h"

/* How long a control command may take before the driver gives up on it. */
#define VRDMA_CMD_TIMEOUT (10 * HZ)

static void vrdma_ctrl_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_cmd *cmd;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		while ((cmd = virtqueue_get_buf(vq, &len))) {
			cmd->used_len = len;
			complete(&cmd->done);
		}
	} while (!virtqueue_enable_cb(vq));
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
}

/*
 * Executes one control command: header and request out, response header
 * and response in. Returns 0, or a negative errno; a device status other
 * than OK becomes an errno (the device's detail is logged at debug level).
 */
int vrdma_cmd_exec(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len, void *resp, size_t resp_len)
{
	struct scatterlist hdr_out, req_out, hdr_in, resp_in;
	struct scatterlist *sgs[4];
	unsigned int n_out = 0, n_in = 0;
	struct vrdma_cmd *cmd;
	unsigned long flags;
	u32 status;
	int ret;

	/*
	 * Request and response are copied into one allocation: callers may
	 * pass stack memory, which cannot be given to a device.
	 */
	cmd = kzalloc(sizeof(*cmd) + req_len + resp_len, GFP_KERNEL);
	if (!cmd)
		return -ENOMEM;
	init_completion(&cmd->done);
	cmd->req.opcode = cpu_to_le32(opcode);
	if (req_len)
		memcpy(cmd->data, req, req_len);

	sg_init_one(&hdr_out, &cmd->req, sizeof(cmd->req));
	sgs[n_out++] = &hdr_out;
	if (req_len) {
		sg_init_one(&req_out, cmd->data, req_len);
		sgs[n_out++] = &req_out;
	}
	sg_init_one(&hdr_in, &cmd->resp, sizeof(cmd->resp));
	sgs[n_out + n_in++] = &hdr_in;
	if (resp_len) {
		sg_init_one(&resp_in, cmd->data + req_len, resp_len);
		sgs[n_out + n_in++] = &resp_in;
	}

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	cmd->req.request_id = cpu_to_le64(++dev->next_request_id);
	ret = virtqueue_add_sgs(dev->ctrlq, sgs, n_out, n_in, cmd, GFP_ATOMIC);
	if (!ret)
		virtqueue_kick(dev->ctrlq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (ret)
		goto out;

	if (!wait_for_completion_timeout(&cmd->done, VRDMA_CMD_TIMEOUT)) {
		/*
		 * The device still owns the buffers: leak them rather than
		 * let it write into freed memory.
		 */
		dev_err(&dev->vdev->dev, "command %#x timed out\n", opcode);
		return -ETIMEDOUT;
	}
	if (cmd->used_len < sizeof(cmd->resp) ||
	    le64_to_cpu(cmd->resp.request_id) != le64_to_cpu(cmd->req.request_id)) {
		ret = -EIO;
		goto out;
	}
	status = le32_to_cpu(cmd->resp.status);
	switch (status) {
	case VIRTIO_RDMA_S_OK:
		ret = 0;
		break;
	case VIRTIO_RDMA_S_NO_MEMORY:
		ret = -ENOMEM;
		break;
	case VIRTIO_RDMA_S_QUOTA:
		ret = -EDQUOT;
		break;
	case VIRTIO_RDMA_S_UNSUPPORTED:
		ret = -EOPNOTSUPP;
		break;
	case VIRTIO_RDMA_S_BAD_HANDLE:
		ret = -ENOENT;
		break;
	case VIRTIO_RDMA_S_BUSY:
		ret = -EBUSY;
		break;
	case VIRTIO_RDMA_S_DENIED:
		ret = -EACCES;
		break;
	case VIRTIO_RDMA_S_BAD_ADDRESS:
		ret = -EFAULT;
		break;
	case VIRTIO_RDMA_S_RANGE:
		ret = -ERANGE;
		break;
	default:
		ret = -EINVAL;
		break;
	}
	if (ret)
		dev_dbg(&dev->vdev->dev, "command %#x: status %u detail %#x\n",
			opcode, status, le32_to_cpu(cmd->resp.detail));
	else if (resp_len)
		memcpy(resp, cmd->data + req_len, resp_len);
out:
	kfree(cmd);
	return ret;
}

static int vrdma_post_event(struct vrdma_dev *dev, unsigned int i)
{
	struct scatterlist sg;

	sg_init_one(&sg, &dev->events[i], sizeof(dev->events[i]));
	return virtqueue_add_inbuf(dev->eventq, &sg, 1, &dev->events[i],
				   GFP_ATOMIC);
}

static void vrdma_event_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct virtio_rdma_event *ev;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&dev->event_lock, flags);
	while ((ev = virtqueue_get_buf(vq, &len))) {
		if (len >= sizeof(*ev)) {
			dev_dbg(&dev->vdev->dev,
				"event %u handle %#x detail %#x seq %u\n",
				le32_to_cpu(ev->kind), le32_to_cpu(ev->handle),
				le32_to_cpu(ev->detail), le32_to_cpu(ev->seq));
			if (le32_to_cpu(ev->kind) == VIRTIO_RDMA_EV_CQ_COMPLETION)
				vrdma_cq_event(dev, le32_to_cpu(ev->handle));
		}
		vrdma_post_event(dev, ev - dev->events);
	}
	virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->event_lock, flags);
}

static void vrdma_read_config(struct vrdma_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	u8 *cfg = (u8 *)&dev->config;
	unsigned int i;

	/* Byte by byte: the structure is little-endian on the wire. */
	for (i = 0; i < sizeof(dev->config); i++)
		cfg[i] = virtio_cread8(vdev, i);
}

static int vrdma_find_vqs(struct vrdma_dev *dev)
{
	vq_callback_t *callbacks[VIRTIO_RDMA_NUM_QUEUES] = {
		vrdma_ctrl_done, vrdma_event_done, NULL
	};
	static const char * const names[VIRTIO_RDMA_NUM_QUEUES] = {
		"control", "event", "notify"
	};
	struct virtqueue *vqs[VIRTIO_RDMA_NUM_QUEUES];
	int ret;

	ret = virtio_find_vqs(dev->vdev, VIRTIO_RDMA_NUM_QUEUES, vqs, callbacks,
			      names, NULL);
	if (ret)
		return ret;
	dev->ctrlq = vqs[VIRTIO_RDMA_CONTROLQ];
	dev->eventq = vqs[VIRTIO_RDMA_EVENTQ];
	dev->notifyq = vqs[VIRTIO_RDMA_NOTIFYQ];
	return 0;
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct virtio_rdma_query_port_req port_req = {
		.port = cpu_to_le32(1),
	};
	struct vrdma_dev *dev;
	unsigned int i;
	u32 abi;
	int ret;

	/*
	 * The ABI version decides how the rest of the configuration space is
	 * laid out: check it before reading anything else (spec chapter 6).
	 */
	abi = virtio_cread32(vdev, 0);
	if (abi != VIRTIO_RDMA_ABI_VERSION) {
		dev_err(&vdev->dev,
			"device ABI version %u, this driver implements %u\n",
			abi, VIRTIO_RDMA_ABI_VERSION);
		return -ENODEV;
	}

	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	vdev->priv = dev;
	spin_lock_init(&dev->ctrl_lock);
	spin_lock_init(&dev->event_lock);
	vrdma_read_config(dev);

	dev->events = kcalloc(VRDMA_EVENT_BUFS, sizeof(*dev->events),
			      GFP_KERNEL);
	if (!dev->events) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = vrdma_find_vqs(dev);
	if (ret)
		goto err_free;
	virtio_device_ready(vdev);

	spin_lock_irq(&dev->event_lock);
	for (i = 0; i < VRDMA_EVENT_BUFS; i++) {
		ret = vrdma_post_event(dev, i);
		if (ret)
			break;
	}
	virtqueue_kick(dev->eventq);
	spin_unlock_irq(&dev->event_lock);
	if (ret)
		goto err_reset;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_DEVICE, NULL, 0,
			     &dev->attr, sizeof(dev->attr));
	if (!ret)
		ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_PORT, &port_req,
				     sizeof(port_req), &dev->port,
				     sizeof(dev->port));
	if (ret) {
		dev_err(&vdev->dev, "cannot query the device: %d\n", ret);
		goto err_reset;
	}
	dev_info(&vdev->dev,
		 "virtio-rdma ABI %u: %u QPs, %u CQs, %u MRs, port %s, %u Mbit/s, paired MAC %pM\n",
		 abi, le32_to_cpu(dev->attr.max_qp), le32_to_cpu(dev->attr.max_cq),
		 le32_to_cpu(dev->attr.max_mr),
		 le32_to_cpu(dev->port.state) == 4 ? "active" : "down",
		 le32_to_cpu(dev->port.link_rate_mbps), dev->config.mac);
	ret = vrdma_register_ib(dev);
	if (ret)
		goto err_reset;
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
err_free:
	kfree(dev->events);
	kfree(dev);
	return ret;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	vrdma_unregister_ib(dev);
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	kfree(dev->events);
	kfree(dev);
}

static const struct virtio_device_id vrdma_id_table[] = {
	{ VIRTIO_RDMA_DEVICE_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vrdma_id_table);

static unsigned int vrdma_features[] = {
	VIRTIO_RDMA_F_UD,
	VIRTIO_RDMA_F_SRQ,
	VIRTIO_RDMA_F_ATOMIC,
};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = vrdma_id_table,
	.feature_table = vrdma_features,
	.feature_table_size = ARRAY_SIZE(vrdma_features),
	.probe = vrdma_probe,
	.remove = vrdma_remove,
};
module_virtio_driver(vrdma_driver);

MODULE_DESCRIPTION("Virtio RDMA device driver");
MODULE_LICENSE("Dual BSD/GPL");
