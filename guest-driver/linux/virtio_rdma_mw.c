// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Memory windows (F_MW, spec 12.23, 12.24, 18.29): allocated and freed here;
 * user space binds them with BIND_MW work requests in its own send rings,
 * naming a window by the device handle it gets back.
 */

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibmw->device)->dev;
	struct virtio_rdma_alloc_mw_uresp uresp = {};
	struct virtio_rdma_alloc_mw_req req = {
		.pd_handle = cpu_to_le32(to_vpd(ibmw->pd)->handle),
		.mw_type = cpu_to_le32(ibmw->type),
	};
	struct virtio_rdma_mw_handle_req free_req;
	struct virtio_rdma_alloc_mw_resp resp;
	struct vrdma_mw *mw = to_vmw(ibmw);
	int ret;

	if (!virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_MW))
		return -EOPNOTSUPP;
	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_ALLOC_MW, &req, sizeof(req),
			     &resp, sizeof(resp));
	if (ret)
		return ret;
	mw->handle = le32_to_cpu(resp.mw_handle);
	ibmw->rkey = le32_to_cpu(resp.rkey);
	uresp.mw_handle = mw->handle;
	ret = ib_copy_to_udata(udata, &uresp,
			       min(udata->outlen, sizeof(uresp)));
	if (ret) {
		free_req.mw_handle = cpu_to_le32(mw->handle);
		vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DEALLOC_MW, &free_req,
			       sizeof(free_req), NULL, 0);
	}
	return ret;
}

int vrdma_dealloc_mw(struct ib_mw *ibmw)
{
	struct vrdma_dev *dev = to_vib(ibmw->device)->dev;
	struct virtio_rdma_mw_handle_req req = {
		.mw_handle = cpu_to_le32(to_vmw(ibmw)->handle),
	};

	int ret;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DEALLOC_MW, &req, sizeof(req),
			     NULL, 0);
	/* A stopped device holds no window any more (spec 15.1). */
	return ret && !vrdma_dev_stopped(dev) ? ret : 0;
}
