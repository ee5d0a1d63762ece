// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * rdma-core provider for the virtio RDMA device: device matching, contexts,
 * queries, protection domains and memory regions, all through the kernel's
 * common uverbs commands.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ccan/minmax.h>
#include <util/util.h>

#include "virtio_rdma.h"

static int vrdma_query_device_ex(struct ibv_context *context,
				 const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);

	return ibv_cmd_query_device_any(context, input, attr, attr_size, &resp,
					&resp_size);
}

static int vrdma_query_port(struct ibv_context *context, uint8_t port,
			    struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context)
{
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_alloc_pd cmd;
	struct ibv_pd *pd;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	if (ibv_cmd_alloc_pd(context, pd, &cmd, sizeof(cmd), &resp,
			     sizeof(resp))) {
		free(pd);
		return NULL;
	}
	return pd;
}

static int vrdma_dealloc_pd(struct ibv_pd *pd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(pd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

static struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr,
				   size_t length, uint64_t hca_va, int access)
{
	struct ib_uverbs_reg_mr_resp resp;
	struct ibv_reg_mr cmd;
	struct verbs_mr *vmr;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;
	if (ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd,
			   sizeof(cmd), &resp, sizeof(resp))) {
		free(vmr);
		return NULL;
	}
	return &vmr->ibv_mr;
}

static int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;
	free(vmr);
	return 0;
}

static struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe,
				      struct ibv_comp_channel *channel,
				      int comp_vector)
{
	long page = sysconf(_SC_PAGESIZE);
	struct vrdma_create_cq_cmd cmd = {};
	struct vrdma_create_cq_cmd_resp resp = {};
	struct vrdma_cq *cq;
	uint32_t depth = 1;

	if (cqe < 1) {
		errno = EINVAL;
		return NULL;
	}
	while (depth < (uint32_t)cqe && depth < (1U << 31))
		depth <<= 1;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	cq->depth = depth;
	cq->ring = aligned_alloc(page, align((size_t)depth * 32, page));
	cq->db = aligned_alloc(128, 128);
	if (!cq->ring || !cq->db) {
		errno = ENOMEM;
		goto err;
	}
	memset(cq->ring, 0, (size_t)depth * 32);
	memset(cq->db, 0, 128);
	cmd.ring_va = (uintptr_t)cq->ring;
	cmd.db_va = (uintptr_t)cq->db;
	cmd.depth = depth;
	if (ibv_cmd_create_cq(context, cqe, channel, comp_vector, &cq->ibv_cq,
			      &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp,
			      sizeof(resp)))
		goto err;
	cq->handle = resp.cq_handle;
	return &cq->ibv_cq;
err:
	free(cq->ring);
	free(cq->db);
	free(cq);
	return NULL;
}

static int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	free(cq->ring);
	free(cq->db);
	free(cq);
	return 0;
}

static uint32_t pow2_at_least(uint32_t v)
{
	uint32_t p = 1;

	while (p < v && p < (1U << 31))
		p <<= 1;
	return p;
}

static uint32_t ceil_log2(uint64_t v)
{
	uint32_t s = 0;

	while (s < 63 && (1ULL << s) < v)
		s++;
	return s;
}

/* Spec 11.3: the strides of the send and receive rings. */
static uint32_t send_wqe_shift(uint32_t max_sge, uint32_t max_inline)
{
	uint64_t slots = max_sge;

	if ((max_inline + 15) / 16 > slots)
		slots = (max_inline + 15) / 16;
	return max(6U, ceil_log2(64 + slots * 16));
}

static uint32_t recv_wqe_shift(uint32_t max_sge)
{
	return max(5U, ceil_log2(16 + (uint64_t)max_sge * 16));
}

static struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
				      struct ibv_qp_init_attr *attr)
{
	long page = sysconf(_SC_PAGESIZE);
	struct vrdma_create_qp_cmd cmd = {};
	struct vrdma_create_qp_cmd_resp resp = {};
	uint64_t sq_bytes, rq_bytes, rq_offset;
	struct vrdma_qp *qp;

	if (attr->srq) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	qp->sq_depth = pow2_at_least(max(attr->cap.max_send_wr, 1U));
	qp->rq_depth = pow2_at_least(max(attr->cap.max_recv_wr, 1U));
	qp->sq_wqe_shift = send_wqe_shift(attr->cap.max_send_sge,
					  attr->cap.max_inline_data);
	qp->rq_wqe_shift = recv_wqe_shift(attr->cap.max_recv_sge);
	sq_bytes = (uint64_t)qp->sq_depth << qp->sq_wqe_shift;
	rq_bytes = (uint64_t)qp->rq_depth << qp->rq_wqe_shift;
	rq_offset = align(sq_bytes, page);
	qp->rq_offset = rq_offset;
	qp->buf_len = align(rq_offset + rq_bytes, page);
	qp->buf = aligned_alloc(page, qp->buf_len);
	qp->db = aligned_alloc(128, 128);
	if (!qp->buf || !qp->db) {
		errno = ENOMEM;
		goto err;
	}
	memset(qp->buf, 0, qp->buf_len);
	memset(qp->db, 0, 128);
	cmd.buf_va = (uintptr_t)qp->buf;
	cmd.buf_len = rq_offset + rq_bytes;
	cmd.db_va = (uintptr_t)qp->db;
	cmd.sq_depth = qp->sq_depth;
	cmd.rq_depth = qp->rq_depth;
	if (ibv_cmd_create_qp(pd, &qp->ibv_qp, attr, &cmd.ibv_cmd, sizeof(cmd),
			      &resp.ibv_resp, sizeof(resp)))
		goto err;
	/* The device's layout must be the one the buffer was sized for. */
	if (resp.sq_wqe_shift != qp->sq_wqe_shift ||
	    resp.rq_wqe_shift != qp->rq_wqe_shift ||
	    resp.rq_offset != qp->rq_offset) {
		ibv_cmd_destroy_qp(&qp->ibv_qp);
		errno = EPROTO;
		goto err;
	}
	qp->handle = resp.qp_handle;
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	return &qp->ibv_qp;
err:
	free(qp->buf);
	free(qp->db);
	free(qp);
	return NULL;
}

static int vrdma_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			   int attr_mask)
{
	struct ibv_modify_qp cmd;

	return ibv_cmd_modify_qp(qp, attr, attr_mask, &cmd, sizeof(cmd));
}

static int vrdma_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			  int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(qp, attr, attr_mask, init_attr, &cmd,
				sizeof(cmd));
}

static int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	int ret;

	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;
	free(qp->buf);
	free(qp->db);
	free(qp);
	return 0;
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_context_ops = {
	.alloc_pd = vrdma_alloc_pd,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.dealloc_pd = vrdma_dealloc_pd,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.free_context = vrdma_free_context,
	.modify_qp = vrdma_modify_qp,
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.reg_mr = vrdma_reg_mr,
};

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev,
						 int cmd_fd, void *private_data)
{
	struct ib_uverbs_get_context_resp resp;
	struct ibv_get_context cmd;
	struct vrdma_context *ctx;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd), &resp,
				sizeof(resp))) {
		verbs_uninit_context(&ctx->ibv_ctx);
		free(ctx);
		return NULL;
	}
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_context_ops);
	return &ctx->ibv_ctx;
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vrdma_device_free(struct verbs_device *vdev)
{
	free(container_of(vdev, struct vrdma_device, ibv_dev));
}

/* The kernel driver has no driver id of its own: match by name and bus. */
static const struct verbs_match_ent vrdma_match_table[] = {
	VERBS_NAME_MATCH("virtio_rdma", NULL),
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	{}
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "virtio_rdma",
	.match_min_abi_version = VIRTIO_RDMA_UVERBS_ABI_VERSION,
	.match_max_abi_version = VIRTIO_RDMA_UVERBS_ABI_VERSION,
	.match_table = vrdma_match_table,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_device_free,
	.alloc_context = vrdma_alloc_context,
};

PROVIDER_DRIVER(virtio_rdma, vrdma_dev_ops);
