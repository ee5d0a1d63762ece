// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the control queue's commands (spec chapter 7), which every
 * verb and the device's start go through, and the device state they depend
 * on: whether the driver stopped the device, and the request for its
 * reset (virtio_rdma_main.c resets it).
 */

#include <linux/completion.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>

#include "virtio_rdma.h"

/* How long a control command may take before the driver gives up on it. */
#define VRDMA_CMD_TIMEOUT (10 * HZ)

/* One control command in flight. */
struct vrdma_cmd {
	struct completion done;
	/*
	 * ctrl_lock: the caller gave up waiting; whoever takes the buffers
	 * back from the device frees them.
	 */
	bool abandoned;
	struct virtio_rdma_request_header req;
	struct virtio_rdma_response_header resp;
	unsigned int used_len;
	/* The request, then room for the response. */
	u8 data[];
};

/* A command's buffers are back from the device (ctrl_lock held). */
static void vrdma_cmd_returned(struct vrdma_cmd *cmd, unsigned int len)
{
	if (cmd->abandoned) {
		kfree(cmd);
		return;
	}
	cmd->used_len = len;
	complete(&cmd->done);
}

/* The control queue's callback: commands the device returned. */
void vrdma_ctrl_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_cmd *cmd;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		while ((cmd = virtqueue_get_buf(vq, &len)))
			vrdma_cmd_returned(cmd, len);
	} while (!virtqueue_enable_cb(vq));
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
}

/*
 * The device was reset (spec 15.1): from now on it counts as stopped
 * (vrdma_dev_stopped()), and the commands it still held fail with -EIO
 * (used length 0: not executed, spec 7.3).
 */
void vrdma_ctrl_stop(struct vrdma_dev *dev)
{
	struct vrdma_cmd *cmd;

	spin_lock_irq(&dev->ctrl_lock);
	WRITE_ONCE(dev->stopped, true);
	while ((cmd = virtqueue_detach_unused_buf(dev->ctrlq)))
		vrdma_cmd_returned(cmd, 0);
	spin_unlock_irq(&dev->ctrl_lock);
}

/*
 * Whether the driver reset the device and has not started it again: the
 * device then holds no object and touches no guest memory (spec 15.1), so
 * a destroy whose command failed may release the object's memory anyway.
 */
bool vrdma_dev_stopped(struct vrdma_dev *dev)
{
	return READ_ONCE(dev->stopped);
}

/*
 * Executes one control command: header and request out, response header
 * and response in. Returns 0, or a negative errno; a device status other
 * than OK becomes an errno (the device's detail is logged at debug level),
 * and so does an OK whose used length is not that of the whole response
 * (-EIO: device input). While the device is being reset, or once it failed
 * to start again, no command is sent: -EIO; a command in flight at a reset
 * fails with -EIO too (used length 0: not executed, spec 7.3).
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
	if (dev->broken)
		ret = -EIO;
	else
		ret = virtqueue_add_sgs(dev->ctrlq, sgs, n_out, n_in, cmd,
					GFP_ATOMIC);
	if (!ret)
		virtqueue_kick(dev->ctrlq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (ret)
		goto out;

	if (!wait_for_completion_timeout(&cmd->done, VRDMA_CMD_TIMEOUT)) {
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		if (!completion_done(&cmd->done)) {
			/*
			 * The device still owns the buffers: they are freed
			 * when it returns them, or at its reset, not now.
			 */
			cmd->abandoned = true;
			spin_unlock_irqrestore(&dev->ctrl_lock, flags);
			dev_err(&dev->vdev->dev, "command %#x timed out\n",
				opcode);
			return -ETIMEDOUT;
		}
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	}
	if (cmd->used_len < sizeof(cmd->resp) ||
	    le64_to_cpu(cmd->resp.request_id) != le64_to_cpu(cmd->req.request_id)) {
		ret = -EIO;
		goto out;
	}
	status = le32_to_cpu(cmd->resp.status);
	switch (status) {
	case VIRTIO_RDMA_S_OK:
		/*
		 * The whole response or nothing (spec 7.3): a shorter one
		 * would leave the caller's structure partly unwritten.
		 */
		if (cmd->used_len != sizeof(cmd->resp) + resp_len) {
			dev_err_ratelimited(&dev->vdev->dev,
					    "command %#x: used length %u, expected %zu\n",
					    opcode, cmd->used_len,
					    sizeof(cmd->resp) + resp_len);
			ret = -EIO;
			goto out;
		}
		ret = 0;
		break;
	case VIRTIO_RDMA_S_NO_MEMORY:
	case VIRTIO_RDMA_S_QUOTA:
		/* Verbs users expect ENOMEM when objects run out. */
		ret = -ENOMEM;
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
	case VIRTIO_RDMA_S_INVALID:
	case VIRTIO_RDMA_S_RANGE: /* beyond a limit the device advertised */
	case VIRTIO_RDMA_S_BAD_STATE:
	case VIRTIO_RDMA_S_MISMATCH:
		ret = -EINVAL;
		break;
	default:
		/* INTERNAL, and any status this driver does not know. */
		ret = -EIO;
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

/*
 * Drops events from now on and queues the reset work, unless the device is
 * going away; during probe, once probe has finished. Called under the
 * event lock.
 */
void vrdma_queue_reset_locked(struct vrdma_dev *dev, const char *why)
{
	if (dev->removing)
		return;
	dev->ev_ignore = true;
	dev->reset_reason = why;
	if (dev->probed)
		queue_work(system_long_wq, &dev->reset_work);
	else
		dev->reset_deferred = true;
}
