// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * The extended CQ (ibv_create_cq_ex, ibv_start_poll .. ibv_end_poll): the
 * ring of spec 18.15 read one entry at a time, each field on request. The
 * entry at the consumer index is copied when polled, so a reader sees the
 * values the device wrote even after the slot is handed back.
 */

#include <errno.h>
#include <string.h>
#include <util/util.h>

#include "virtio_rdma.h"

/* Fields of struct virtio_rdma_cqe: what ibv_cq_ex may read here. */
#define WC_FLAGS_SUPPORTED (IBV_WC_STANDARD_FLAGS)

static struct vrdma_cq *cqx_to_vcq(struct ibv_cq_ex *cqx)
{
	return container_of(cqx, struct vrdma_cq, vcq.cq_ex);
}

/* The entry at ci into cur, with the two fields libibverbs reads itself. */
static int read_current(struct vrdma_cq *cq)
{
	struct ibv_cq_ex *cqx = &cq->vcq.cq_ex;

	if (!vrdma_cq_next(cq, &cq->cur)) {
		cq->cur_valid = false;
		return ENOENT;
	}
	cq->cur_valid = true;
	cqx->wr_id = le64toh(cq->cur.wr_id);
	cqx->status = vrdma_wc_status(cq->cur.status);
	return 0;
}

static int vrdma_start_poll(struct ibv_cq_ex *cqx,
			    struct ibv_poll_cq_attr *attr)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);
	int ret;

	if (attr->comp_mask)
		return EINVAL;
	if (!cq->single_threaded)
		pthread_spin_lock(&cq->lock);
	ret = read_current(cq);
	/* On ENOENT the caller does not call ibv_end_poll. */
	if (ret && !cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
	return ret;
}

static int vrdma_next_poll(struct ibv_cq_ex *cqx)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);

	if (cq->cur_valid)
		cq->ci++;
	return read_current(cq);
}

static void vrdma_end_poll(struct ibv_cq_ex *cqx)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);

	if (cq->cur_valid)
		cq->ci++;
	cq->cur_valid = false;
	vrdma_cq_consumed(cq);
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
}

static enum ibv_wc_opcode vrdma_read_opcode(struct ibv_cq_ex *cqx)
{
	return vrdma_wc_opcode(cqx_to_vcq(cqx)->cur.opcode);
}

static uint32_t vrdma_read_vendor_err(struct ibv_cq_ex *cqx)
{
	return le32toh(cqx_to_vcq(cqx)->cur.vendor_err);
}

static uint32_t vrdma_read_byte_len(struct ibv_cq_ex *cqx)
{
	return le32toh(cqx_to_vcq(cqx)->cur.byte_len);
}

static __be32 vrdma_read_imm_data(struct ibv_cq_ex *cqx)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);
	__be32 imm;

	/* The invalidated key of a SEND_WITH_INV shares the field (18.14). */
	if (cq->cur.flags & VIRTIO_RDMA_CQE_WITH_INV)
		return htobe32(le32toh(cq->cur.imm_data));
	memcpy(&imm, &cq->cur.imm_data, sizeof(imm));
	return imm;
}

static uint32_t vrdma_read_qp_num(struct ibv_cq_ex *cqx)
{
	return le32toh(cqx_to_vcq(cqx)->cur.qpn);
}

static uint32_t vrdma_read_src_qp(struct ibv_cq_ex *cqx)
{
	return le32toh(cqx_to_vcq(cqx)->cur.src_qpn);
}

static unsigned int vrdma_read_wc_flags(struct ibv_cq_ex *cqx)
{
	uint8_t flags = cqx_to_vcq(cqx)->cur.flags;
	unsigned int wc_flags = 0;

	if (flags & VIRTIO_RDMA_CQE_WITH_IMM)
		wc_flags |= IBV_WC_WITH_IMM;
	else if (flags & VIRTIO_RDMA_CQE_WITH_INV)
		wc_flags |= IBV_WC_WITH_INV;
	if (flags & VIRTIO_RDMA_CQE_GRH)
		wc_flags |= IBV_WC_GRH;
	return wc_flags;
}

/* RoCE has no LIDs or service levels: zero, as rxe and siw report. */
static uint32_t vrdma_read_slid(struct ibv_cq_ex *cqx)
{
	return 0;
}

static uint8_t vrdma_read_sl(struct ibv_cq_ex *cqx)
{
	return 0;
}

static uint8_t vrdma_read_dlid_path_bits(struct ibv_cq_ex *cqx)
{
	return 0;
}

/*
 * ibv_create_cq_ex. The entry fields of IBV_WC_STANDARD_FLAGS are offered;
 * timestamps, VLANs, flow tags and tag matching are not (EOPNOTSUPP), nor
 * is IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN (the device never overruns a CQ: it
 * stops the QP instead, spec 18.15). SINGLE_THREADED drops the lock.
 */
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_pd *parent_domain = NULL;
	struct ibv_cq_init_attr_ex attr_ex;
	struct ibv_cq_ex *cqx;
	struct vrdma_cq *cq;
	uint32_t flags = 0;
	int ret;

	if (attr->comp_mask &
	    ~(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* The CQ's memory from a parent domain's allocators (domain.c). */
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		parent_domain = attr->parent_domain;
		if (!parent_domain || parent_domain->context != context ||
		    !to_vpd(parent_domain)->protection) {
			errno = EINVAL;
			return NULL;
		}
	}
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS)
		flags = attr->flags;
	if ((attr->wc_flags & ~WC_FLAGS_SUPPORTED) ||
	    (flags & ~IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* Nothing the kernel needs to see. */
	attr_ex = *attr;
	attr_ex.comp_mask = 0;
	attr_ex.flags = 0;
	ret = vrdma_create_cq_common(context, &attr_ex, true, parent_domain,
				     &cq);
	if (ret) {
		errno = ret;
		return NULL;
	}
	cq->single_threaded = flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cqx = &cq->vcq.cq_ex;
	cqx->start_poll = vrdma_start_poll;
	cqx->next_poll = vrdma_next_poll;
	cqx->end_poll = vrdma_end_poll;
	cqx->read_opcode = vrdma_read_opcode;
	cqx->read_vendor_err = vrdma_read_vendor_err;
	cqx->read_byte_len = vrdma_read_byte_len;
	cqx->read_imm_data = vrdma_read_imm_data;
	cqx->read_qp_num = vrdma_read_qp_num;
	cqx->read_src_qp = vrdma_read_src_qp;
	cqx->read_wc_flags = vrdma_read_wc_flags;
	cqx->read_slid = vrdma_read_slid;
	cqx->read_sl = vrdma_read_sl;
	cqx->read_dlid_path_bits = vrdma_read_dlid_path_bits;
	return cqx;
}
