// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * XRC (F_XRC, spec 12.28, 12.29, 18.11.8): domains, XRC SRQs and their
 * numbers, XRC_RECV QPs (the device's XRC_TGT: no rings, the kernel makes
 * them) and ibv_open_qp of one. XRC_SEND QPs are RC-like QPs without a
 * receive ring (virtio_rdma.c); their work requests name the target SRQ.
 */

#include <errno.h>
#include <stdlib.h>

#include "virtio_rdma.h"

struct ibv_xrcd *vrdma_open_xrcd(struct ibv_context *context,
				 struct ibv_xrcd_init_attr *attr)
{
	struct ib_uverbs_open_xrcd_resp resp;
	struct verbs_xrcd *xrcd;
	struct ibv_open_xrcd cmd;
	int ret;

	xrcd = calloc(1, sizeof(*xrcd));
	if (!xrcd)
		return NULL;
	ret = ibv_cmd_open_xrcd(context, xrcd, sizeof(*xrcd), attr, &cmd,
				sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(xrcd);
		errno = ret;
		return NULL;
	}
	return &xrcd->xrcd;
}

int vrdma_close_xrcd(struct ibv_xrcd *ibxrcd)
{
	struct verbs_xrcd *xrcd = container_of(ibxrcd, struct verbs_xrcd, xrcd);
	int ret;

	ret = ibv_cmd_close_xrcd(xrcd);
	if (ret)
		return ret;
	free(xrcd);
	return 0;
}

/* ibv_create_srq_ex: a basic SRQ as ibv_create_srq, or an XRC SRQ. */
struct ibv_srq *vrdma_create_srq_ex(struct ibv_context *context,
				    struct ibv_srq_init_attr_ex *attr)
{
	const uint32_t basic = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
	const uint32_t xrc = basic | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ;
	bool is_xrc = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) &&
		      attr->srq_type == IBV_SRQT_XRC;

	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd ||
	    (attr->comp_mask & ~(is_xrc ? xrc : basic)) ||
	    ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) &&
	     attr->srq_type != IBV_SRQT_BASIC && !is_xrc)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (is_xrc && ((attr->comp_mask & xrc) != xrc || !attr->xrcd ||
		       !attr->cq)) {
		errno = EINVAL;
		return NULL;
	}
	return vrdma_create_srq_common(context, attr, is_xrc);
}

int vrdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);

	if (srq->vsrq.srq_type != IBV_SRQT_XRC)
		return EOPNOTSUPP;
	*srq_num = srq->vsrq.srq_num;
	return 0;
}

/* An XRC_RECV QP: its domain, no PD, CQs or rings; nothing to post. */
struct ibv_qp *vrdma_create_xrc_recv_qp(struct ibv_context *context,
					struct ibv_qp_init_attr_ex *attr)
{
	struct ib_uverbs_create_qp_resp resp;
	struct ibv_create_qp cmd;
	struct vrdma_qp *qp;
	int ret;

	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	ret = ibv_cmd_create_qp_ex(context, &qp->vqp, attr, &cmd, sizeof(cmd),
				   &resp, sizeof(resp));
	if (ret) {
		free(qp);
		errno = ret;
		return NULL;
	}
	return &qp->vqp.qp;
}

/* ibv_open_qp: another handle on an XRC_RECV QP of a domain. */
struct ibv_qp *vrdma_open_qp(struct ibv_context *context,
			     struct ibv_qp_open_attr *attr)
{
	struct ib_uverbs_create_qp_resp resp;
	struct ibv_open_qp cmd;
	struct vrdma_qp *qp;
	int ret;

	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	ret = ibv_cmd_open_qp(context, &qp->vqp, sizeof(qp->vqp), attr, &cmd,
			      sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(qp);
		errno = ret;
		return NULL;
	}
	return &qp->vqp.qp;
}
