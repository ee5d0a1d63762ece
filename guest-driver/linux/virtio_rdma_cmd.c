// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the control queue's commands (spec chapter 7), which every
 * verb and the device's start go through, and the device state they depend
 * on: whether the driver stopped the device, and the request for its
 * reset (virtio_rdma_main.c resets it).
 */

#include <linux/completion.h>
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>

#include "virtio_rdma.h"

/* How long a control command may take before the driver gives up on it. */
#define VRDMA_CMD_TIMEOUT (10 * HZ)
/*
 * How long a command of a caller that cannot sleep is polled for: short
 * enough for a spin with interrupts off, long enough for a device that
 * executes the commands queued before it (they run in order, spec 7.2).
 */
#define VRDMA_CMD_POLL_US USEC_PER_SEC

/* One control command in flight. */
struct vrdma_cmd {
	struct completion done;
	/* ctrl_lock: the device gave the buffers back (used_len is set). */
	bool returned;
	/*
	 * ctrl_lock: nobody waits for the command (it timed out, or was
	 * posted without waiting); whoever takes the buffers back from the
	 * device frees them.
	 */
	bool abandoned;
	u32 opcode;
	size_t req_len;
	size_t resp_len;
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
		if (len < sizeof(cmd->resp) ||
		    le32_to_cpu(cmd->resp.status) != VIRTIO_RDMA_S_OK)
			pr_debug("virtio_rdma: unawaited command %#x failed: used length %u status %u\n",
				 cmd->opcode, len, le32_to_cpu(cmd->resp.status));
		kfree(cmd);
		return;
	}
	cmd->used_len = len;
	cmd->returned = true;
	complete(&cmd->done);
}

/* Takes back every command the device returned (ctrl_lock held). */
static void vrdma_ctrl_reap(struct vrdma_dev *dev)
{
	struct vrdma_cmd *cmd;
	unsigned int len;

	while ((cmd = virtqueue_get_buf(dev->ctrlq, &len)))
		vrdma_cmd_returned(cmd, len);
}

/* The control queue's callback: commands the device returned. */
void vrdma_ctrl_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		vrdma_ctrl_reap(dev);
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
 * A command with its header, its request and room for its response in one
 * allocation: callers may pass stack memory, which cannot be given to a
 * device.
 */
static struct vrdma_cmd *vrdma_cmd_alloc(u32 opcode, const void *req,
					 size_t req_len, size_t resp_len,
					 gfp_t gfp)
{
	struct vrdma_cmd *cmd;

	cmd = kzalloc(sizeof(*cmd) + req_len + resp_len, gfp);
	if (!cmd)
		return NULL;
	init_completion(&cmd->done);
	cmd->opcode = opcode;
	cmd->req_len = req_len;
	cmd->resp_len = resp_len;
	cmd->req.opcode = cpu_to_le32(opcode);
	if (req_len)
		memcpy(cmd->data, req, req_len);
	return cmd;
}

/*
 * Makes the command available to the device and kicks it (ctrl_lock
 * held). -EIO while no command is sent (a reset); -ENOSPC when the queue
 * is full.
 */
static int vrdma_cmd_add_locked(struct vrdma_dev *dev, struct vrdma_cmd *cmd)
{
	struct scatterlist hdr_out, req_out, hdr_in, resp_in;
	struct scatterlist *sgs[4];
	unsigned int n_out = 0, n_in = 0;
	int ret;

	if (dev->broken)
		return -EIO;
	sg_init_one(&hdr_out, &cmd->req, sizeof(cmd->req));
	sgs[n_out++] = &hdr_out;
	if (cmd->req_len) {
		sg_init_one(&req_out, cmd->data, cmd->req_len);
		sgs[n_out++] = &req_out;
	}
	sg_init_one(&hdr_in, &cmd->resp, sizeof(cmd->resp));
	sgs[n_out + n_in++] = &hdr_in;
	if (cmd->resp_len) {
		sg_init_one(&resp_in, cmd->data + cmd->req_len, cmd->resp_len);
		sgs[n_out + n_in++] = &resp_in;
	}
	cmd->req.request_id = cpu_to_le64(++dev->next_request_id);
	ret = virtqueue_add_sgs(dev->ctrlq, sgs, n_out, n_in, cmd, GFP_ATOMIC);
	if (!ret)
		virtqueue_kick(dev->ctrlq);
	return ret;
}

/*
 * The device's answer to a returned command: 0, or a negative errno; a
 * device status other than OK becomes an errno (the device's detail is
 * logged at debug level), and so does an OK whose used length is not that
 * of the whole response (-EIO: device input).
 */
static int vrdma_cmd_result(struct vrdma_dev *dev, struct vrdma_cmd *cmd,
			    void *resp)
{
	u32 status;
	int ret;

	if (cmd->used_len < sizeof(cmd->resp) ||
	    le64_to_cpu(cmd->resp.request_id) != le64_to_cpu(cmd->req.request_id))
		return -EIO;
	status = le32_to_cpu(cmd->resp.status);
	switch (status) {
	case VIRTIO_RDMA_S_OK:
		/*
		 * The whole response or nothing (spec 7.3): a shorter one
		 * would leave the caller's structure partly unwritten.
		 */
		if (cmd->used_len != sizeof(cmd->resp) + cmd->resp_len) {
			dev_err_ratelimited(&dev->vdev->dev,
					    "command %#x: used length %u, expected %zu\n",
					    cmd->opcode, cmd->used_len,
					    sizeof(cmd->resp) + cmd->resp_len);
			return -EIO;
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
			cmd->opcode, status, le32_to_cpu(cmd->resp.detail));
	else if (cmd->resp_len)
		memcpy(resp, cmd->data + cmd->req_len, cmd->resp_len);
	return ret;
}

/*
 * Executes one control command: header and request out, response header
 * and response in. Returns 0, or a negative errno (vrdma_cmd_result()).
 * While the device is being reset, or once it failed to start again, no
 * command is sent: -EIO; a command in flight at a reset fails with -EIO too
 * (used length 0: not executed, spec 7.3). Sleeps.
 */
int vrdma_cmd_exec(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len, void *resp, size_t resp_len)
{
	struct vrdma_cmd *cmd;
	unsigned long flags;
	int ret;

	cmd = vrdma_cmd_alloc(opcode, req, req_len, resp_len, GFP_KERNEL);
	if (!cmd)
		return -ENOMEM;
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	ret = vrdma_cmd_add_locked(dev, cmd);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (ret)
		goto out;

	if (!wait_for_completion_timeout(&cmd->done, VRDMA_CMD_TIMEOUT)) {
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		if (!cmd->returned) {
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
	ret = vrdma_cmd_result(dev, cmd, resp);
out:
	kfree(cmd);
	return ret;
}

/*
 * Adds @cmd to the control queue for a caller that cannot sleep: while the
 * queue is full, takes back what the device returned until there is room,
 * for at most VRDMA_CMD_POLL_US from @start.
 */
static int vrdma_cmd_add_polled(struct vrdma_dev *dev, struct vrdma_cmd *cmd,
				ktime_t start)
{
	unsigned long flags;
	int ret;

	for (;;) {
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		ret = vrdma_cmd_add_locked(dev, cmd);
		if (ret == -ENOSPC)
			vrdma_ctrl_reap(dev);
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		if (ret != -ENOSPC ||
		    ktime_us_delta(ktime_get(), start) > VRDMA_CMD_POLL_US)
			return ret;
		udelay(1);
	}
}

/*
 * vrdma_cmd_exec() for a caller that cannot sleep (atomic context, spec
 * 7.2 allows any number of commands in flight): the command is added
 * under the control queue's lock, and the caller takes back what the
 * device returned itself, in a bounded spin, instead of waiting for the
 * interrupt. After VRDMA_CMD_POLL_US without an answer it gives up:
 * -ETIMEDOUT, and the buffers are freed when the device returns them.
 */
int vrdma_cmd_exec_atomic(struct vrdma_dev *dev, u32 opcode, const void *req,
			  size_t req_len, void *resp, size_t resp_len)
{
	ktime_t start = ktime_get();
	struct vrdma_cmd *cmd;
	unsigned long flags;
	bool returned, gave_up;
	int ret;

	cmd = vrdma_cmd_alloc(opcode, req, req_len, resp_len, GFP_ATOMIC);
	if (!cmd)
		return -ENOMEM;
	ret = vrdma_cmd_add_polled(dev, cmd, start);
	if (ret)
		goto out;
	for (;;) {
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		/* Once returned (also by a reset) the queue is not touched. */
		if (!cmd->returned)
			vrdma_ctrl_reap(dev);
		returned = cmd->returned;
		gave_up = !returned &&
			  ktime_us_delta(ktime_get(), start) > VRDMA_CMD_POLL_US;
		/* From now on the command is the reaper's to free. */
		cmd->abandoned = gave_up;
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		if (returned)
			break;
		if (gave_up) {
			dev_err_ratelimited(&dev->vdev->dev,
					    "command %#x timed out (polled)\n",
					    opcode);
			return -ETIMEDOUT;
		}
		udelay(1);
	}
	ret = vrdma_cmd_result(dev, cmd, resp);
out:
	kfree(cmd);
	return ret;
}

/*
 * Sends a command without waiting for it, from any context: its buffers
 * are freed when the device returns them (or at a reset), and its outcome
 * is only logged at debug level. For destroys that must not sleep; the
 * device executes commands in the order they were made available (spec
 * 7.2), so a later command sees the destroy done.
 */
int vrdma_cmd_post(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len)
{
	struct vrdma_cmd *cmd;
	int ret;

	cmd = vrdma_cmd_alloc(opcode, req, req_len, 0, GFP_ATOMIC);
	if (!cmd)
		return -ENOMEM;
	/* Set before the device can see it: the reaper frees it. */
	cmd->abandoned = true;
	ret = vrdma_cmd_add_polled(dev, cmd, ktime_get());
	if (ret)
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
