// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: Linux guest driver for the virtio RDMA device (ID 42).
 *
 * Device discovery, the control and event queues (spec chapters 6, 7 and
 * 14; the commands themselves are virtio_rdma_cmd.c's), and device resets
 * (chapter 15). The verbs device is registered on top of this.
 *
 * Reset. When the device reports DEVICE_FATAL, when it lost the driver's
 * objects without a reset of the driver's (its event numbering restarted:
 * a VMM reconnection, spec 15.2), when it sets DEVICE_NEEDS_RESET, or when
 * root writes 1 to the device's `reset` attribute, the reset work resets
 * it: commands in flight fail with -EIO and no new one is sent, the
 * virtio reset stops every access of the device to guest memory and
 * destroys its objects (spec 15.1), then the verbs device is unregistered
 * (ib_core disassociates every user context: each process gets
 * IB_EVENT_DEVICE_FATAL, its objects are destroyed without commands, and
 * its later verbs fail with EIO), and the device is initialised and
 * registered again as at probe. The virtio core (of 6.1 and of 6.12) has
 * no reset callbacks for drivers, so the driver re-negotiates the features
 * itself, as virtio_device_restore() does.
 */

#include <linux/etherdevice.h>
#include <linux/module.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include "virtio_rdma.h"
#include "compat.h"

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
		/* A used length of 0: no event (spec 14.1). */
		if (len >= sizeof(*ev))
			vrdma_event(dev, ev);
		/* A reset is coming: the queue is set up anew. */
		if (!dev->ev_ignore)
			vrdma_post_event(dev, ev - dev->events);
	}
	if (!dev->ev_ignore)
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

	ret = vrdma_virtio_find_vqs(dev->vdev, VIRTIO_RDMA_NUM_QUEUES, vqs,
				    callbacks, names);
	if (ret)
		return ret;
	dev->ctrlq = vqs[VIRTIO_RDMA_CONTROLQ];
	dev->eventq = vqs[VIRTIO_RDMA_EVENTQ];
	dev->notifyq = vqs[VIRTIO_RDMA_NOTIFYQ];
	return 0;
}

static bool vrdma_abi_ok(struct virtio_device *vdev)
{
	u32 abi = virtio_cread32(vdev, 0);

	/*
	 * The ABI version decides how the rest of the configuration space is
	 * laid out: check it before reading anything else (spec chapter 6).
	 */
	if (abi >= VIRTIO_RDMA_MIN_COMPATIBLE_ABI_VERSION &&
	    abi <= VIRTIO_RDMA_ABI_VERSION)
		return true;
	dev_err(&vdev->dev,
		"device ABI version %u, this driver implements %u to %u\n",
		abi, VIRTIO_RDMA_MIN_COMPATIBLE_ABI_VERSION,
		VIRTIO_RDMA_ABI_VERSION);
	return false;
}

/*
 * Stops the device: no command is sent any more, the device is reset (it
 * stops every access to guest memory and destroys its objects, spec 15.1)
 * and the commands in flight fail with -EIO. The queues stay until
 * vrdma_del_vqs().
 */
static void vrdma_stop(struct vrdma_dev *dev)
{
	spin_lock_irq(&dev->event_lock);
	dev->ev_ignore = true;
	spin_unlock_irq(&dev->event_lock);
	spin_lock_irq(&dev->ctrl_lock);
	dev->broken = true;
	spin_unlock_irq(&dev->ctrl_lock);
	if (dev->vqs_ready) {
		virtio_reset_device(dev->vdev);
		/* An event callback still running finishes under its lock. */
		spin_lock_irq(&dev->event_lock);
		spin_unlock_irq(&dev->event_lock);
		vrdma_ctrl_stop(dev);
	} else {
		WRITE_ONCE(dev->stopped, true);
	}
	/* Its commands fail now; no new one is queued (ev_ignore). */
	cancel_work_sync(&dev->requery_work);
}

static void vrdma_del_vqs(struct vrdma_dev *dev)
{
	if (!dev->vqs_ready)
		return;
	dev->vdev->config->del_vqs(dev->vdev);
	dev->vqs_ready = false;
}

/*
 * Brings the device up from FEATURES_OK: queues, DRIVER_OK, event buffers,
 * the device's and port's attributes (spec chapter 6); vrdma_pair() then
 * registers the verbs device. On failure the device is stopped and its
 * queues deleted.
 */
static int vrdma_start(struct vrdma_dev *dev)
{
	struct virtio_rdma_query_port_req port_req = {
		.port = cpu_to_le32(VRDMA_PORT_NUM),
	};
	struct virtio_device *vdev = dev->vdev;
	unsigned int i;
	int ret;

	if (!vrdma_abi_ok(vdev))
		return -ENODEV;
	vrdma_read_config(dev);
	/* Spec appendix A: no address, no guess. */
	if (is_zero_ether_addr(dev->config.mac)) {
		dev_err(&vdev->dev,
			"no paired network interface configured (DeviceConfig.mac is zero): not registering a RoCE port\n");
		return -ENODEV;
	}
	if (!ether_addr_equal(dev->mac, dev->config.mac)) {
		rtnl_lock();
		ether_addr_copy(dev->mac, dev->config.mac);
		rtnl_unlock();
	}
	ret = vrdma_dbpage_start(dev);
	if (ret)
		return ret;
	ret = vrdma_find_vqs(dev);
	if (ret)
		return ret;
	dev->vqs_ready = true;
	spin_lock_irq(&dev->ctrl_lock);
	dev->broken = false;
	WRITE_ONCE(dev->stopped, false);
	spin_unlock_irq(&dev->ctrl_lock);
	virtio_device_ready(vdev);

	spin_lock_irq(&dev->event_lock);
	dev->ev_ignore = false;
	dev->ev_seen = false;
	for (i = 0; i < VRDMA_EVENT_BUFS; i++) {
		ret = vrdma_post_event(dev, i);
		if (ret)
			break;
	}
	virtqueue_kick(dev->eventq);
	spin_unlock_irq(&dev->event_lock);
	if (ret)
		goto err;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_DEVICE, NULL, 0,
			     &dev->attr, sizeof(dev->attr));
	if (!ret)
		ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_PORT, &port_req,
				     sizeof(port_req), &dev->port,
				     sizeof(dev->port));
	if (ret) {
		dev_err(&vdev->dev, "cannot query the device: %d\n", ret);
		goto err;
	}
	spin_lock_irq(&dev->event_lock);
	dev->port_state = le32_to_cpu(dev->port.state) ==
			  VRDMA_PORT_STATE_ACTIVE ? IB_PORT_ACTIVE :
						    IB_PORT_DOWN;
	spin_unlock_irq(&dev->event_lock);
	dev_info(&vdev->dev,
		 "virtio-rdma ABI %u (driver %u), features%s%s%s%s%s%s%s%s%s: %u QPs, %u CQs, %u MRs, port %s, %u Mbit/s, paired MAC %pM\n",
		 le32_to_cpu(dev->config.abi_version), VIRTIO_RDMA_ABI_VERSION,
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_UD) ? " ud" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_SRQ) ? " srq" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_ATOMIC) ? " atomic" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_SHMEM_DOORBELL) ?
			" shmem_doorbell" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_GSI) ? " gsi" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_MEM_MGT) ? " mem_mgt" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_MW) ? " mw" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_RESIZE) ? " resize" : "",
		 virtio_has_feature(vdev, VIRTIO_RDMA_F_XRC) ? " xrc" : "",
		 le32_to_cpu(dev->attr.max_qp),
		 le32_to_cpu(dev->attr.max_cq), le32_to_cpu(dev->attr.max_mr),
		 dev->port_state == IB_PORT_ACTIVE ? "active" : "down",
		 le32_to_cpu(dev->port.link_rate_mbps), dev->config.mac);
	/* The caller registers the verbs device: vrdma_pair(). */
	mutex_lock(&dev->ib_lock);
	dev->running = true;
	mutex_unlock(&dev->ib_lock);
	return 0;

err:
	vrdma_stop(dev);
	vrdma_del_vqs(dev);
	return ret;
}

/*
 * Starts the reset device again: the status and feature negotiation that
 * virtio_dev_probe() does before calling probe (and virtio_device_restore()
 * after a resume), with the features negotiated at probe, then
 * vrdma_start().
 */
static int vrdma_restart(struct vrdma_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	int ret;

	/* Clears a FAILED status of an earlier attempt. */
	virtio_reset_device(vdev);
	virtio_add_status(vdev, VIRTIO_CONFIG_S_ACKNOWLEDGE);
	virtio_add_status(vdev, VIRTIO_CONFIG_S_DRIVER);
	ret = vdev->config->finalize_features(vdev);
	if (ret)
		return ret;
	virtio_add_status(vdev, VIRTIO_CONFIG_S_FEATURES_OK);
	if (!(vdev->config->get_status(vdev) & VIRTIO_CONFIG_S_FEATURES_OK))
		return -ENODEV;
	return vrdma_start(dev);
}

static void vrdma_reset_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev,
					     reset_work);
	int ret;

	dev_warn(&dev->vdev->dev, "resetting the device: %s\n",
		 dev->reset_reason);
	vrdma_stop(dev);
	/* User contexts see IB_EVENT_DEVICE_FATAL; their objects go. */
	vrdma_ib_down(dev);
	vrdma_del_vqs(dev);
	ret = vrdma_restart(dev);
	if (ret) {
		dev_err(&dev->vdev->dev,
			"the device did not come back after its reset: %d\n",
			ret);
		virtio_add_status(dev->vdev, VIRTIO_CONFIG_S_FAILED);
		return;
	}
	vrdma_pair(dev, true);
	dev_info(&dev->vdev->dev, "the device is back after its reset\n");
}

static void vrdma_schedule_reset(struct vrdma_dev *dev, const char *why)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->event_lock, flags);
	vrdma_queue_reset_locked(dev, why);
	spin_unlock_irqrestore(&dev->event_lock, flags);
}

/*
 * A configuration change: the device may have set DEVICE_NEEDS_RESET
 * (virtio 1.x, 2.1.2). Run-time changes of the quotas (spec chapter 5)
 * apply to the device's later commands; the driver keeps reporting the
 * values it read at start.
 */
static void vrdma_config_changed(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	if (vdev->config->get_status(vdev) & VIRTIO_CONFIG_S_NEEDS_RESET)
		vrdma_schedule_reset(dev, "the device needs a reset");
}

/* Writing 1 resets the device, as a DEVICE_FATAL event would. */
static ssize_t reset_store(struct device *d, struct device_attribute *attr,
			   const char *buf, size_t count)
{
	struct vrdma_dev *dev = dev_to_virtio(d)->priv;
	bool reset;
	int ret;

	ret = kstrtobool(buf, &reset);
	if (ret)
		return ret;
	if (reset)
		vrdma_schedule_reset(dev, "requested through sysfs");
	return count;
}
static DEVICE_ATTR_WO(reset);

static struct attribute *vrdma_attrs[] = {
	&dev_attr_reset.attr,
	NULL,
};
ATTRIBUTE_GROUPS(vrdma);

static int vrdma_probe(struct virtio_device *vdev)
{
	struct vrdma_dev *dev;
	int ret;

	if (!vrdma_abi_ok(vdev))
		return -ENODEV;
	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	vdev->priv = dev;
	spin_lock_init(&dev->ctrl_lock);
	spin_lock_init(&dev->event_lock);
	mutex_init(&dev->ib_lock);
	INIT_WORK(&dev->reset_work, vrdma_reset_work);
	INIT_WORK(&dev->requery_work, vrdma_requery_work);
	INIT_WORK(&dev->pair_work, vrdma_pair_work);
	dev->netdev_nb.notifier_call = vrdma_netdev_event;
	dev->events = kcalloc(VRDMA_EVENT_BUFS, sizeof(*dev->events),
			      GFP_KERNEL);
	if (!dev->events) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = vrdma_start(dev);
	if (ret)
		goto err_free;
	/*
	 * Before the first look for the interface, so that one going away
	 * after it is seen (the notifier and the look both run under RTNL).
	 */
	ret = register_netdevice_notifier(&dev->netdev_nb);
	if (ret)
		goto err_stop;
	vrdma_pair(dev, true);
	spin_lock_irq(&dev->event_lock);
	dev->probed = true;
	if (dev->reset_deferred)
		queue_work(system_long_wq, &dev->reset_work);
	spin_unlock_irq(&dev->event_lock);
	return 0;

err_stop:
	cancel_work_sync(&dev->pair_work);
	vrdma_stop(dev);
	vrdma_ib_down(dev);
	vrdma_del_vqs(dev);
err_free:
	mutex_destroy(&dev->ib_lock);
	kfree(dev->events);
	kfree(dev);
	return ret;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	spin_lock_irq(&dev->event_lock);
	dev->removing = true;
	spin_unlock_irq(&dev->event_lock);
	cancel_work_sync(&dev->reset_work);
	unregister_netdevice_notifier(&dev->netdev_nb);
	cancel_work_sync(&dev->pair_work);
	/*
	 * The reset destroys every object of the device (spec 15.1): the
	 * verbs objects that ib_core destroys next need no command.
	 */
	vrdma_stop(dev);
	vrdma_ib_down(dev);
	vrdma_del_vqs(dev);
	mutex_destroy(&dev->ib_lock);
	kfree(dev->events);
	kfree(dev);
}

/* Before FEATURES_OK: the features the driver cannot use go. */
static int vrdma_validate(struct virtio_device *vdev)
{
	vrdma_dbpage_validate(vdev);
	return 0;
}

/*
 * Test builds for a VMM that cannot give the device ID 42 (no released
 * QEMU names it; its generic vhost-user device aborts on an unnamed ID)
 * bind another (scripts/build-kmod.sh --device-id).
 */
#ifndef VRDMA_DEVICE_ID
#define VRDMA_DEVICE_ID VIRTIO_RDMA_DEVICE_ID
#endif

static const struct virtio_device_id vrdma_id_table[] = {
	{ VRDMA_DEVICE_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vrdma_id_table);

/*
 * F_SHMEM_DOORBELL only where the transport shows the doorbell region
 * (vrdma_validate). F_GSI, F_MEM_MGT, F_RESIZE, F_MW, F_UC, F_XRC and
 * F_MCAST exist from ABI version 3 on; a version 2 device offers none of
 * them.
 */
static unsigned int vrdma_features[] = {
	VIRTIO_RDMA_F_UD,
	VIRTIO_RDMA_F_SRQ,
	VIRTIO_RDMA_F_ATOMIC,
	VIRTIO_RDMA_F_SHMEM_DOORBELL,
	VIRTIO_RDMA_F_GSI,
	VIRTIO_RDMA_F_MEM_MGT,
	VIRTIO_RDMA_F_MW,
	VIRTIO_RDMA_F_UC,
	VIRTIO_RDMA_F_XRC,
	VIRTIO_RDMA_F_MCAST,
	VIRTIO_RDMA_F_RESIZE,
};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = vrdma_id_table,
	.validate = vrdma_validate,
	.feature_table = vrdma_features,
	.feature_table_size = ARRAY_SIZE(vrdma_features),
	.driver.dev_groups = vrdma_groups,
	.probe = vrdma_probe,
	.remove = vrdma_remove,
	.config_changed = vrdma_config_changed,
};
module_virtio_driver(vrdma_driver);

MODULE_DESCRIPTION("Virtio RDMA device driver");
MODULE_LICENSE("Dual BSD/GPL");
