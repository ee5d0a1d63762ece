// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * The extended send API (ibv_qp_ex, ibv_wr_*): each work request is built
 * in the send ring piece by piece (an operation, then its setters), and
 * the batch is published with one producer index store at ibv_wr_complete,
 * as post_send publishes a chain (spec 18.6 to 18.10). Until then the
 * device sees none of it, so ibv_wr_abort only forgets the slots.
 */

#include <errno.h>
#include <string.h>
#include <util/util.h>

#include "virtio_rdma.h"

#define SEND_FLAGS (IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | \
		    IBV_SEND_INLINE | IBV_SEND_FENCE)

static struct vrdma_qp *qpx_to_vqp(struct ibv_qp_ex *qpx)
{
	return container_of(qpx, struct vrdma_qp, vqp.qp_ex);
}

/* The bytes after a slot's 64-byte header: SGEs or inline data. */
static size_t slot_room(const struct vrdma_qp *qp)
{
	return ((size_t)1 << qp->sq_wqe_shift) -
	       sizeof(struct virtio_rdma_send_wqe);
}

static void close_open_wr(struct vrdma_qp *qp)
{
	if (qp->ex_slot)
		memcpy(qp->ex_slot, &qp->ex_wqe, sizeof(qp->ex_wqe));
	qp->ex_slot = NULL;
}

/*
 * Opens the batch's next work request with the caller's wr_id and wr_flags:
 * NULL once the batch has failed, or if the QP was not created for
 * @op_flag (EINVAL) or the ring is full (ENOMEM). The error is the batch's,
 * returned by ibv_wr_complete, which then publishes nothing.
 */
static struct virtio_rdma_send_wqe *open_wr(struct ibv_qp_ex *qpx,
					    uint8_t opcode, uint64_t op_flag)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *w = &qp->ex_wqe;
	uint32_t i = qp->sq_pi + qp->ex_posted;

	if (qp->ex_err)
		return NULL;
	close_open_wr(qp);
	if (!(qp->send_ops & op_flag) || (qpx->wr_flags & ~SEND_FLAGS)) {
		qp->ex_err = EINVAL;
		return NULL;
	}
	if (i - qp->ex_ci >= qp->sq_depth) {
		/* The device may have consumed some since ibv_wr_start. */
		qp->ex_ci = atomic_load_explicit(db_word(qp->db, DB_SQ_CI),
						 memory_order_acquire);
		if (i - qp->ex_ci >= qp->sq_depth) {
			qp->ex_err = ENOMEM;
			return NULL;
		}
	}
	qp->ex_slot = (uint8_t *)qp->buf +
		      ((size_t)(i & (qp->sq_depth - 1)) << qp->sq_wqe_shift);
	qp->ex_posted++;
	memset(w, 0, sizeof(*w));
	w->wr_id = htole64(qpx->wr_id);
	w->opcode = opcode;
	if (qpx->wr_flags & IBV_SEND_SIGNALED)
		w->flags |= VIRTIO_RDMA_WQE_SIGNALED;
	if (qpx->wr_flags & IBV_SEND_SOLICITED)
		w->flags |= VIRTIO_RDMA_WQE_SOLICITED;
	if (qpx->wr_flags & IBV_SEND_FENCE)
		w->flags |= VIRTIO_RDMA_WQE_FENCE;
	return w;
}

/* The open work request for a setter; NULL (and EINVAL) if there is none. */
static struct virtio_rdma_send_wqe *open_wr_for_setter(struct vrdma_qp *qp)
{
	if (qp->ex_err)
		return NULL;
	if (!qp->ex_slot) {
		qp->ex_err = EINVAL;
		return NULL;
	}
	return &qp->ex_wqe;
}

static void set_remote(struct virtio_rdma_send_wqe *w, uint32_t rkey,
		       uint64_t remote_addr)
{
	w->rkey = htole32(rkey);
	w->remote_addr = htole64(remote_addr);
}

static void vrdma_wr_send(struct ibv_qp_ex *qpx)
{
	open_wr(qpx, VIRTIO_RDMA_WR_SEND, IBV_QP_EX_WITH_SEND);
}

static void vrdma_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm_data)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_SEND_WITH_IMM,
		    IBV_QP_EX_WITH_SEND_WITH_IMM);
	/* Four opaque bytes, as the application keeps them (spec 18.8). */
	if (w)
		memcpy(&w->imm_data, &imm_data, sizeof(w->imm_data));
}

static void vrdma_wr_send_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_SEND_WITH_INV,
		    IBV_QP_EX_WITH_SEND_WITH_INV);
	/* The key travels where immediate data would (spec 18.27). */
	if (w)
		w->imm_data = htole32(invalidate_rkey);
}

static void vrdma_wr_local_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV);
	if (w)
		w->rkey = htole32(invalidate_rkey);
}

/*
 * A type 2 window bound under @rkey (spec 18.29): the slot's header is a
 * BindMwWqe, written now; no setter applies to it.
 */
static void vrdma_wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw,
			     uint32_t rkey,
			     const struct ibv_mw_bind_info *bind_info)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	uint8_t *slot;

	if (!open_wr(qpx, VIRTIO_RDMA_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW))
		return;
	slot = qp->ex_slot;
	/* Written here, not from ex_wqe when the next one opens. */
	qp->ex_slot = NULL;
	if (!mw || mw->type != IBV_MW_TYPE_2 ||
	    vrdma_encode_bind(qpx->wr_id, qpx->wr_flags, mw, rkey, bind_info,
			      slot))
		qp->ex_err = EINVAL;
	else
		mw->rkey = rkey;
}

static void vrdma_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey,
				uint64_t remote_addr)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE);
	if (w)
		set_remote(w, rkey, remote_addr);
}

static void vrdma_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey,
				    uint64_t remote_addr, __be32 imm_data)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM,
		    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);
	if (!w)
		return;
	set_remote(w, rkey, remote_addr);
	memcpy(&w->imm_data, &imm_data, sizeof(w->imm_data));
}

static void vrdma_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey,
			       uint64_t remote_addr)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ);
	if (w)
		set_remote(w, rkey, remote_addr);
}

static void vrdma_wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey,
				    uint64_t remote_addr, uint64_t compare,
				    uint64_t swap)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_ATOMIC_CMP_AND_SWP,
		    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
	if (!w)
		return;
	set_remote(w, rkey, remote_addr);
	w->compare_add = htole64(compare);
	w->swap = htole64(swap);
}

static void vrdma_wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey,
				      uint64_t remote_addr, uint64_t add)
{
	struct virtio_rdma_send_wqe *w;

	w = open_wr(qpx, VIRTIO_RDMA_WR_ATOMIC_FETCH_AND_ADD,
		    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
	if (!w)
		return;
	set_remote(w, rkey, remote_addr);
	w->compare_add = htole64(add);
}

static void vrdma_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge,
				  const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *w = open_wr_for_setter(qp);
	size_t i;

	if (!w)
		return;
	if (num_sge > qp->max_send_sge ||
	    num_sge * sizeof(struct virtio_rdma_sge) > slot_room(qp)) {
		qp->ex_err = EINVAL;
		return;
	}
	for (i = 0; i < num_sge; i++) {
		struct virtio_rdma_sge sge = {
			.addr = htole64(sg_list[i].addr),
			.length = htole32(sg_list[i].length),
			.lkey = htole32(sg_list[i].lkey),
		};

		memcpy(qp->ex_slot + sizeof(*w) + i * sizeof(sge), &sge,
		       sizeof(sge));
	}
	w->num_sge = htole16(num_sge);
	w->flags &= ~VIRTIO_RDMA_WQE_INLINE;
	w->inline_len = 0;
}

static void vrdma_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey,
			     uint64_t addr, uint32_t length)
{
	const struct ibv_sge sge = {
		.addr = addr,
		.length = length,
		.lkey = lkey,
	};

	vrdma_wr_set_sge_list(qpx, 1, &sge);
}

/* Only SENDs and WRITEs carry inline data (spec 18.10). */
static bool may_inline(uint8_t opcode)
{
	switch (opcode) {
	case VIRTIO_RDMA_WR_SEND:
	case VIRTIO_RDMA_WR_SEND_WITH_IMM:
	case VIRTIO_RDMA_WR_SEND_WITH_INV:
	case VIRTIO_RDMA_WR_RDMA_WRITE:
	case VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM:
		return true;
	default:
		return false;
	}
}

static void vrdma_wr_set_inline_data_list(struct ibv_qp_ex *qpx,
					  size_t num_buf,
					  const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *w = open_wr_for_setter(qp);
	size_t i, len = 0;

	if (!w)
		return;
	if (!may_inline(w->opcode)) {
		qp->ex_err = EINVAL;
		return;
	}
	for (i = 0; i < num_buf; i++) {
		if (buf_list[i].length > slot_room(qp) - len ||
		    buf_list[i].length > qp->max_inline_data - len) {
			qp->ex_err = EINVAL;
			return;
		}
		memcpy(qp->ex_slot + sizeof(*w) + len, buf_list[i].addr,
		       buf_list[i].length);
		len += buf_list[i].length;
	}
	w->flags |= VIRTIO_RDMA_WQE_INLINE;
	w->inline_len = htole32(len);
	w->num_sge = 0;
}

static void vrdma_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr,
				     size_t length)
{
	const struct ibv_data_buf buf = {
		.addr = addr,
		.length = length,
	};

	vrdma_wr_set_inline_data_list(qpx, 1, &buf);
}

static void vrdma_wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah,
				 uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *w = open_wr_for_setter(qp);

	if (!w)
		return;
	if (qp->vqp.qp.qp_type != IBV_QPT_UD || !ah) {
		qp->ex_err = EINVAL;
		return;
	}
	w->ah_handle = htole32(to_vah(ah)->handle);
	w->remote_qpn = htole32(remote_qpn);
	w->remote_qkey = htole32(remote_qkey);
}

/*
 * Operations no QP of this device is created with: they fail the batch
 * (EINVAL), as any operation outside the QP's send_ops_flags does.
 */
static void vrdma_wr_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey,
				  uint64_t remote_addr, const void *atomic_wr)
{
	open_wr(qpx, 0, IBV_QP_EX_WITH_ATOMIC_WRITE);
}

/*
 * FLUSH came with rdma-core 45: the provider built for an older libibverbs
 * (Debian 12's rdma-core 44, scripts/package-provider.sh) defines
 * VRDMA_NO_WR_FLUSH, as its struct ibv_qp_ex has no wr_flush.
 */
#ifndef VRDMA_NO_WR_FLUSH
static void vrdma_wr_flush(struct ibv_qp_ex *qpx, uint32_t rkey,
			   uint64_t remote_addr, size_t len, uint8_t type,
			   uint8_t level)
{
	open_wr(qpx, 0, IBV_QP_EX_WITH_FLUSH);
}
#endif

/* The XRC SRQ at the target a work request of an XRC_SEND QP goes to. */
static void vrdma_wr_set_xrc_srqn(struct ibv_qp_ex *qpx, uint32_t remote_srqn)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *w = open_wr_for_setter(qp);

	if (!w)
		return;
	if (qp->vqp.qp.qp_type != IBV_QPT_XRC_SEND) {
		qp->ex_err = EINVAL;
		return;
	}
	w->xrc_srqn = htole32(remote_srqn);
}

static void vrdma_wr_start(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	pthread_spin_lock(&qp->sq_lock);
	qp->ex_posted = 0;
	qp->ex_err = 0;
	qp->ex_slot = NULL;
	qp->ex_ci = atomic_load_explicit(db_word(qp->db, DB_SQ_CI),
					 memory_order_acquire);
}

static int vrdma_wr_complete(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	uint32_t posted = 0;
	int ret = qp->ex_err;

	if (!ret && qp->ex_posted && !vrdma_qp_may_send(qp))
		ret = EINVAL;
	if (!ret) {
		close_open_wr(qp);
		posted = qp->ex_posted;
	}
	if (posted) {
		qp->sq_pi += posted;
		atomic_store_explicit(qp->sq_pi_word, qp->sq_pi,
				      memory_order_release);
	}
	qp->ex_slot = NULL;
	pthread_spin_unlock(&qp->sq_lock);
	return vrdma_post_done(qpx->qp_base.context, posted, ret,
			       &qpx->qp_base);
}

static void vrdma_wr_abort(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	qp->ex_slot = NULL;
	pthread_spin_unlock(&qp->sq_lock);
}

/* The IBV_QP_EX_WITH_* operations a QP of @type may ask for. */
static uint64_t supported_ops(const struct vrdma_context *ctx,
			      enum ibv_qp_type type)
{
	uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

	if (type == IBV_QPT_UD)
		return ops;
	if (type == IBV_QPT_UC)
		return ops | IBV_QP_EX_WITH_RDMA_WRITE |
		       IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	/* An XRC initiator sends what RC sends (spec 18.11.8). */
	if (type != IBV_QPT_RC && type != IBV_QPT_XRC_SEND)
		return 0;
	ops |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
	       IBV_QP_EX_WITH_RDMA_READ;
	if (ctx->atomic_cap != IBV_ATOMIC_NONE)
		ops |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	if (ctx->device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS)
		ops |= IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV;
	if ((ctx->device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
	    type == IBV_QPT_RC)
		ops |= IBV_QP_EX_WITH_BIND_MW;
	return ops;
}

/*
 * Gives @qp the extended send API for @attr->send_ops_flags; EOPNOTSUPP if
 * it asks for an operation this QP type or the device does not run.
 */
int vrdma_qp_ex_init(struct vrdma_qp *qp, struct vrdma_context *ctx,
		     const struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp_ex *qpx = &qp->vqp.qp_ex;

	if (attr->send_ops_flags & ~supported_ops(ctx, attr->qp_type))
		return EOPNOTSUPP;
	qp->send_ops = attr->send_ops_flags;
	qpx->wr_start = vrdma_wr_start;
	qpx->wr_complete = vrdma_wr_complete;
	qpx->wr_abort = vrdma_wr_abort;
	qpx->wr_send = vrdma_wr_send;
	qpx->wr_send_imm = vrdma_wr_send_imm;
	qpx->wr_send_inv = vrdma_wr_send_inv;
	qpx->wr_rdma_write = vrdma_wr_rdma_write;
	qpx->wr_rdma_write_imm = vrdma_wr_rdma_write_imm;
	qpx->wr_rdma_read = vrdma_wr_rdma_read;
	qpx->wr_atomic_cmp_swp = vrdma_wr_atomic_cmp_swp;
	qpx->wr_atomic_fetch_add = vrdma_wr_atomic_fetch_add;
	qpx->wr_set_sge = vrdma_wr_set_sge;
	qpx->wr_set_sge_list = vrdma_wr_set_sge_list;
	qpx->wr_set_inline_data = vrdma_wr_set_inline_data;
	qpx->wr_set_inline_data_list = vrdma_wr_set_inline_data_list;
	qpx->wr_set_ud_addr = vrdma_wr_set_ud_addr;
	qpx->wr_atomic_write = vrdma_wr_atomic_write;
#ifndef VRDMA_NO_WR_FLUSH
	qpx->wr_flush = vrdma_wr_flush;
#endif
	qpx->wr_bind_mw = vrdma_wr_bind_mw;
	qpx->wr_local_inv = vrdma_wr_local_inv;
	qpx->wr_set_xrc_srqn = vrdma_wr_set_xrc_srqn;
	qp->vqp.comp_mask |= VERBS_QP_EX;
	return 0;
}
