// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * XRC (F_XRC, spec 12.28, 12.29, 18.11.8): domains, the request of an XRC
 * SRQ, and target QPs. ib_core shares a domain between processes (one
 * file, one ib_xrcd) and creates target QPs without a user context, so
 * domains belong to the driver's own context when it has one: a process
 * that exits then takes nothing of another's with it.
 */

#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

static bool vrdma_has_xrc(struct vrdma_dev *dev)
{
	return virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_XRC) &&
	       virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_SRQ);
}

int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);
	struct vrdma_ib *vib = to_vib(ibxrcd->device);
	struct virtio_rdma_ctx_handle_req req;
	struct virtio_rdma_xrcd_handle resp;
	int ret;

	if (!vrdma_has_xrc(vib->dev))
		return -EOPNOTSUPP;
	if (vib->kverbs)
		req.ctx_handle = cpu_to_le32(vib->kctx_handle);
	else if (uc)
		req.ctx_handle = cpu_to_le32(uc->handle);
	else
		return -EOPNOTSUPP;
	ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_OPEN_XRCD, &req,
			     sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	to_vxrcd(ibxrcd)->handle = le32_to_cpu(resp.xrcd_handle);
	return 0;
}

int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vib(ibxrcd->device)->dev;
	struct virtio_rdma_xrcd_handle req = {
		.xrcd_handle = cpu_to_le32(to_vxrcd(ibxrcd)->handle),
	};
	int ret;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_CLOSE_XRCD, &req, sizeof(req),
			     NULL, 0);
	/* A stopped device has closed it (spec 15.1). */
	return ret && !vrdma_dev_stopped(dev) ? ret : 0;
}

/* The fields of CREATE_XRC_SRQ beyond those CREATE_SRQ has. */
int vrdma_xrc_srq_req(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		      struct virtio_rdma_create_xrc_srq_req *req)
{
	if (!vrdma_has_xrc(to_vib(ibsrq->device)->dev) || !init->ext.cq ||
	    !init->ext.xrc.xrcd)
		return -EOPNOTSUPP;
	req->xrcd_handle = cpu_to_le32(to_vxrcd(init->ext.xrc.xrcd)->handle);
	req->cq_handle = cpu_to_le32(to_vcq(init->ext.cq)->handle);
	return 0;
}

/*
 * An XRC_TGT QP: its domain and nothing else (no PD, CQs or rings). ib_core
 * creates it without udata, for user space too.
 */
int vrdma_create_tgt_qp(struct vrdma_qp *qp, struct ib_qp_init_attr *init)
{
	struct vrdma_ib *vib = to_vib(qp->ibqp.device);
	struct virtio_rdma_create_qp_resp resp;
	struct virtio_rdma_create_qp_req req = {
		.qp_type = cpu_to_le32(VIRTIO_RDMA_QPT_XRC_TGT),
	};
	struct virtio_rdma_qp_handle_req destroy;
	int ret;

	if (!vrdma_has_xrc(vib->dev) || !init->xrcd || init->create_flags)
		return -EOPNOTSUPP;
	req.xrcd_handle = cpu_to_le32(to_vxrcd(init->xrcd)->handle);
	ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_CREATE_QP, &req,
			     sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	qp->tgt = true;
	qp->handle = le32_to_cpu(resp.qp_handle);
	qp->ibqp.qp_num = le32_to_cpu(resp.qpn) & 0xffffff;
	qp->state = IB_QPS_RESET;
	ret = xa_insert_irq(&vib->qps, qp->handle, qp, GFP_KERNEL);
	if (ret) {
		destroy.qp_handle = resp.qp_handle;
		vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_DESTROY_QP, &destroy,
			       sizeof(destroy), NULL, 0);
	}
	return ret;
}
