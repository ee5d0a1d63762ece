// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * UD multicast (F_MCAST, spec 12.27, 18.11.7): a UD QP attached to a group
 * receives the sends to that group's GID (to QP number 0xffffff) of the
 * VMs of its tenant. rdma_cm joins a group over the paired interface and
 * the application (librdmacm) attaches its QP here.
 */

#include "virtio_rdma.h"

static int vrdma_mcast(struct ib_qp *ibqp, union ib_gid *gid, u32 opcode)
{
	struct vrdma_dev *dev = to_vib(ibqp->device)->dev;
	struct virtio_rdma_mcast_req req = {
		.qp_handle = cpu_to_le32(to_vqp(ibqp)->handle),
	};

	if (!virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_MCAST))
		return -EOPNOTSUPP;
	memcpy(req.mgid, gid->raw, sizeof(req.mgid));
	return vrdma_cmd_exec(dev, opcode, &req, sizeof(req), NULL, 0);
}

int vrdma_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return vrdma_mcast(ibqp, gid, VIRTIO_RDMA_OP_ATTACH_MCAST);
}

int vrdma_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	struct vrdma_dev *dev = to_vib(ibqp->device)->dev;
	int ret;

	ret = vrdma_mcast(ibqp, gid, VIRTIO_RDMA_OP_DETACH_MCAST);
	/* A stopped device holds no attachment any more (spec 15.1). */
	return ret && !vrdma_dev_stopped(dev) ? ret : 0;
}
