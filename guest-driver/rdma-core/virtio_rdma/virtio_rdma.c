// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * rdma-core provider for the virtio RDMA device: device matching and the
 * control verbs through the kernel's uverbs commands, and the data path
 * (posting, polling) straight on the rings in this process's memory
 * (spec chapter 18).
 */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <ccan/array_size.h>
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
	struct vrdma_pd *pd;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	if (ibv_cmd_alloc_pd(context, &pd->ibv_pd, &cmd, sizeof(cmd), &resp,
			     sizeof(resp))) {
		free(pd);
		return NULL;
	}
	return &pd->ibv_pd;
}

/* A PD or a parent domain; EBUSY while a parent domain or queue uses it. */
static int vrdma_dealloc_pd(struct ibv_pd *ibpd)
{
	struct vrdma_pd *pd = to_vpd(ibpd);
	int ret;

	if (atomic_load(&pd->refs))
		return EBUSY;
	if (pd->protection) {
		atomic_fetch_sub(&pd->protection->refs, 1);
	} else {
		ret = ibv_cmd_dealloc_pd(ibpd);
		if (ret)
			return ret;
	}
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

/*
 * The notification step of spec 18.6, after a producer index store: no
 * fence while the engine polls with DB_FLAG_POLLING; otherwise a full
 * fence, then the kick only if the engine is parked (DB_FLAG_KICK). The
 * kick is a system call (@kick), since only the kernel reaches notifyq.
 * Without the header mapped the engine's flags are unknown: always kick,
 * which the spec allows.
 */
static int vrdma_notify(struct vrdma_context *ctx, int (*kick)(void *),
			void *obj)
{
	_Atomic uint32_t *flags = ctx->db_flags;

	if (flags) {
		/* The load must not move above the store (compiler only). */
		atomic_signal_fence(memory_order_seq_cst);
		if (le32toh(atomic_load_explicit(flags, memory_order_relaxed)) &
		    VIRTIO_RDMA_DB_FLAG_POLLING)
			return 0;
	}
	atomic_thread_fence(memory_order_seq_cst);
	if (flags &&
	    !(le32toh(atomic_load_explicit(flags, memory_order_relaxed)) &
	      VIRTIO_RDMA_DB_FLAG_KICK))
		return 0;
	return kick(obj);
}

/* The kick for a QP's queues: a post_send of no work request. */
static int vrdma_kick_qp(void *qp)
{
	struct ibv_send_wr *bad;

	return ibv_cmd_post_send(qp, NULL, &bad);
}

/* The kick for an SRQ: a post_srq_recv of no work request. */
static int vrdma_kick_srq(void *srq)
{
	struct ibv_recv_wr *bad;

	return ibv_cmd_post_srq_recv(srq, NULL, &bad);
}

/*
 * After a post of @posted work requests that ended with @ret: the
 * notification step (spec 18.6) if anything was posted. The post's own
 * error comes first.
 */
static int post_done(struct ibv_context *ibctx, uint32_t posted, int ret,
		     int (*kick)(void *), void *obj)
{
	int notify;

	if (!posted)
		return ret;
	notify = vrdma_notify(to_vctx(ibctx), kick, obj);
	return ret ? ret : notify;
}

/* post_done for a QP's send or receive ring. */
int vrdma_post_done(struct ibv_context *ibctx, uint32_t posted, int ret,
		    struct ibv_qp *qp)
{
	return post_done(ibctx, posted, ret, vrdma_kick_qp, qp);
}

static int wr_opcode(enum ibv_wr_opcode op, uint8_t *out)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		*out = VIRTIO_RDMA_WR_RDMA_WRITE;
		return 0;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		*out = VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM;
		return 0;
	case IBV_WR_SEND:
		*out = VIRTIO_RDMA_WR_SEND;
		return 0;
	case IBV_WR_SEND_WITH_IMM:
		*out = VIRTIO_RDMA_WR_SEND_WITH_IMM;
		return 0;
	case IBV_WR_RDMA_READ:
		*out = VIRTIO_RDMA_WR_RDMA_READ;
		return 0;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		*out = VIRTIO_RDMA_WR_ATOMIC_CMP_AND_SWP;
		return 0;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		*out = VIRTIO_RDMA_WR_ATOMIC_FETCH_AND_ADD;
		return 0;
	case IBV_WR_LOCAL_INV:
		*out = VIRTIO_RDMA_WR_LOCAL_INV;
		return 0;
	case IBV_WR_SEND_WITH_INV:
		*out = VIRTIO_RDMA_WR_SEND_WITH_INV;
		return 0;
	default:
		return EINVAL;
	}
}

/*
 * Encodes one send work request into slot @slot (spec 18.8 to 18.10,
 * 18.27, 18.29). A BIND_MW of a type 1 window comes from ibv_bind_mw only
 * (@bind_type1), never from the application's post_send.
 */
static int encode_send(struct vrdma_qp *qp, struct ibv_send_wr *wr,
		       uint8_t *slot, bool bind_type1)
{
	size_t room = ((size_t)1 << qp->sq_wqe_shift) -
		      sizeof(struct virtio_rdma_send_wqe);
	struct virtio_rdma_send_wqe w = {};
	uint8_t *data = slot + sizeof(w);
	size_t len = 0;
	int i;

	if (wr->opcode == IBV_WR_BIND_MW) {
		if (qp->vqp.qp.qp_type != IBV_QPT_RC || !wr->bind_mw.mw ||
		    wr->bind_mw.mw->type !=
		    (bind_type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2))
			return EINVAL;
		return vrdma_encode_bind(wr->wr_id, wr->send_flags,
					 wr->bind_mw.mw, wr->bind_mw.rkey,
					 &wr->bind_mw.bind_info, slot);
	}
	if (wr_opcode(wr->opcode, &w.opcode))
		return EINVAL;
	if (wr->send_flags & ~(IBV_SEND_SIGNALED | IBV_SEND_SOLICITED |
			       IBV_SEND_INLINE | IBV_SEND_FENCE))
		return EINVAL;
	if (qp->vqp.qp.qp_type == IBV_QPT_UD &&
	    wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
	    wr->opcode != IBV_WR_LOCAL_INV)
		return EINVAL;
	/* UC: SENDs and WRITEs (spec 18.11.6). */
	if (qp->vqp.qp.qp_type == IBV_QPT_UC &&
	    (wr->opcode == IBV_WR_RDMA_READ ||
	     wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
	     wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
	     wr->opcode == IBV_WR_SEND_WITH_INV))
		return EINVAL;
	if (wr->opcode == IBV_WR_LOCAL_INV) {
		/* The key to invalidate; no data (spec 18.27). */
		if (wr->send_flags & (IBV_SEND_INLINE | IBV_SEND_SOLICITED))
			return EINVAL;
		w.wr_id = htole64(wr->wr_id);
		w.opcode = VIRTIO_RDMA_WR_LOCAL_INV;
		if (wr->send_flags & IBV_SEND_SIGNALED)
			w.flags |= VIRTIO_RDMA_WQE_SIGNALED;
		if (wr->send_flags & IBV_SEND_FENCE)
			w.flags |= VIRTIO_RDMA_WQE_FENCE;
		w.rkey = htole32(wr->invalidate_rkey);
		memcpy(slot, &w, sizeof(w));
		return 0;
	}
	if (qp->vqp.qp.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		w.ah_handle = htole32(to_vah(wr->wr.ud.ah)->handle);
		w.remote_qpn = htole32(wr->wr.ud.remote_qpn);
		w.remote_qkey = htole32(wr->wr.ud.remote_qkey);
	}
	/* The XRC SRQ at the target the message goes to (spec 18.11.8). */
	if (qp->vqp.qp.qp_type == IBV_QPT_XRC_SEND)
		w.xrc_srqn = htole32(wr->qp_type.xrc.remote_srqn);
	w.wr_id = htole64(wr->wr_id);
	if (wr->send_flags & IBV_SEND_SIGNALED)
		w.flags |= VIRTIO_RDMA_WQE_SIGNALED;
	if (wr->send_flags & IBV_SEND_SOLICITED)
		w.flags |= VIRTIO_RDMA_WQE_SOLICITED;
	if (wr->send_flags & IBV_SEND_FENCE)
		w.flags |= VIRTIO_RDMA_WQE_FENCE;
	/*
	 * Four opaque bytes, as the application keeps them (spec 18.8); or
	 * the key a SEND_WITH_INV invalidates, in the same place (18.27).
	 */
	if (wr->opcode == IBV_WR_SEND_WITH_INV)
		w.imm_data = htole32(wr->invalidate_rkey);
	else
		memcpy(&w.imm_data, &wr->imm_data, sizeof(w.imm_data));
	w.remote_addr = htole64(wr->wr.rdma.remote_addr);
	w.rkey = htole32(wr->wr.rdma.rkey);
	if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
	    wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		w.remote_addr = htole64(wr->wr.atomic.remote_addr);
		w.rkey = htole32(wr->wr.atomic.rkey);
		w.compare_add = htole64(wr->wr.atomic.compare_add);
		w.swap = htole64(wr->wr.atomic.swap);
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		/* Only SENDs and WRITEs carry inline data (spec 18.10). */
		if (wr->opcode == IBV_WR_RDMA_READ ||
		    wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		    wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			return EINVAL;
		w.flags |= VIRTIO_RDMA_WQE_INLINE;
		for (i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > room - len ||
			    wr->sg_list[i].length > qp->max_inline_data - len)
				return EINVAL;
			memcpy(data + len, (void *)(uintptr_t)wr->sg_list[i].addr,
			       wr->sg_list[i].length);
			len += wr->sg_list[i].length;
		}
		w.inline_len = htole32(len);
	} else {
		if (wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge > qp->max_send_sge ||
		    (size_t)wr->num_sge * sizeof(struct virtio_rdma_sge) > room)
			return EINVAL;
		w.num_sge = htole16(wr->num_sge);
		for (i = 0; i < wr->num_sge; i++) {
			struct virtio_rdma_sge sge = {
				.addr = htole64(wr->sg_list[i].addr),
				.length = htole32(wr->sg_list[i].length),
				.lkey = htole32(wr->sg_list[i].lkey),
			};

			memcpy(data + i * sizeof(sge), &sge, sizeof(sge));
		}
	}
	memcpy(slot, &w, sizeof(w));
	return 0;
}

/* IB's rule: a send queue takes work from RTS on (SQD, SQE, ERR too). */
bool vrdma_qp_may_send(struct vrdma_qp *qp)
{
	switch (atomic_load_explicit(&qp->state, memory_order_relaxed)) {
	case IBV_QPS_RESET:
	case IBV_QPS_INIT:
	case IBV_QPS_RTR:
		return false;
	default:
		return true;
	}
}

static int post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		     struct ibv_send_wr **bad_wr, bool bind_type1)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	uint32_t ci, posted = 0;
	int ret = 0;

	/* An XRC_RECV QP has no send queue. */
	if (!vrdma_qp_may_send(qp) || !qp->sq_depth) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->sq_lock);
	ci = atomic_load_explicit(db_word(qp->db, DB_SQ_CI),
				  memory_order_acquire);
	for (; wr; wr = wr->next) {
		uint32_t i = qp->sq_pi + posted;
		uint8_t *slot = (uint8_t *)qp->buf +
				((size_t)(i & (qp->sq_depth - 1)) << qp->sq_wqe_shift);

		if (i - ci >= qp->sq_depth) {
			ret = ENOMEM;
			break;
		}
		ret = encode_send(qp, wr, slot, bind_type1);
		if (ret)
			break;
		posted++;
	}
	if (posted) {
		qp->sq_pi += posted;
		atomic_store_explicit(qp->sq_pi_word, qp->sq_pi,
				      memory_order_release);
	}
	pthread_spin_unlock(&qp->sq_lock);
	if (ret)
		*bad_wr = wr;
	return post_done(ibqp->context, posted, ret, vrdma_kick_qp, ibqp);
}

static int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			   struct ibv_send_wr **bad_wr)
{
	return post_send(ibqp, wr, bad_wr, false);
}

/* ibv_bind_mw's work request: the BIND_MW of a type 1 window. */
int vrdma_post_bind_type1(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad_wr)
{
	return post_send(ibqp, wr, bad_wr, true);
}

/*
 * Encodes one receive work request into a slot of @stride bytes (18.13),
 * if it has at most @max_sge entries.
 */
static int encode_recv(struct ibv_recv_wr *wr, uint8_t *slot, size_t stride,
		       uint32_t max_sge)
{
	struct virtio_rdma_recv_wqe w = {
		.wr_id = htole64(wr->wr_id),
		.num_sge = htole32(wr->num_sge),
	};
	int k;

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge ||
	    sizeof(w) + (size_t)wr->num_sge * sizeof(struct virtio_rdma_sge) >
	    stride)
		return EINVAL;
	memcpy(slot, &w, sizeof(w));
	for (k = 0; k < wr->num_sge; k++) {
		struct virtio_rdma_sge sge = {
			.addr = htole64(wr->sg_list[k].addr),
			.length = htole32(wr->sg_list[k].length),
			.lkey = htole32(wr->sg_list[k].lkey),
		};

		memcpy(slot + sizeof(w) + k * sizeof(sge), &sge, sizeof(sge));
	}
	return 0;
}

/* A receive ring: a QP's own or an SRQ's (spec 18.5, 18.13). */
struct recv_ring {
	uint8_t *base;
	_Atomic uint32_t *pi_word;
	_Atomic uint32_t *ci_word;
	uint32_t depth;
	uint32_t wqe_shift;
	uint32_t max_sge;
	/* The producer index, under the ring's lock. */
	uint32_t *pi;
};

/*
 * Posts @wr onto @r, whose lock the caller holds: as many work requests as
 * fit and are valid (their number in @posted), then publishes the new
 * producer index. On an error, *@bad_wr is the first one not posted.
 */
static int post_recvs(const struct recv_ring *r, struct ibv_recv_wr *wr,
		      struct ibv_recv_wr **bad_wr, uint32_t *posted)
{
	uint32_t ci = atomic_load_explicit(r->ci_word, memory_order_acquire);
	int ret = 0;

	*posted = 0;
	for (; wr; wr = wr->next) {
		uint32_t i = *r->pi + *posted;
		uint8_t *slot = r->base +
				((size_t)(i & (r->depth - 1)) << r->wqe_shift);

		if (i - ci >= r->depth) {
			ret = ENOMEM;
			break;
		}
		ret = encode_recv(wr, slot, (size_t)1 << r->wqe_shift,
				  r->max_sge);
		if (ret)
			break;
		(*posted)++;
	}
	if (*posted) {
		*r->pi += *posted;
		atomic_store_explicit(r->pi_word, *r->pi, memory_order_release);
	}
	if (ret)
		*bad_wr = wr;
	return ret;
}

static int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	const struct recv_ring r = {
		.base = (uint8_t *)qp->buf + qp->rq_offset,
		.pi_word = qp->rq_pi_word,
		.ci_word = db_word(qp->db, DB_RQ_CI),
		.depth = qp->rq_depth,
		.wqe_shift = qp->rq_wqe_shift,
		.max_sge = qp->max_recv_sge,
		.pi = &qp->rq_pi,
	};
	uint32_t posted;
	int ret;

	/*
	 * A receive queue takes work from INIT on; a QP on an SRQ, and XRC
	 * QPs, have none.
	 */
	if (atomic_load_explicit(&qp->state, memory_order_relaxed) ==
	    IBV_QPS_RESET || !qp->rq_depth) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->rq_lock);
	ret = post_recvs(&r, wr, bad_wr, &posted);
	pthread_spin_unlock(&qp->rq_lock);
	return post_done(ibqp->context, posted, ret, vrdma_kick_qp, ibqp);
}

#define DB_SRQ_CI VIRTIO_RDMA_DB_DEVICE_OFFSET

/*
 * An SRQ of @attr (its PD set), an XRC SRQ of its domain and CQ with @xrc;
 * what libibverbs and create_srq_ex checked.
 */
struct ibv_srq *vrdma_create_srq_common(struct ibv_context *context,
					struct ibv_srq_init_attr_ex *attr,
					bool xrc)
{
	struct vrdma_create_xsrq_cmd xcmd = {};
	struct vrdma_create_xsrq_cmd_resp xresp = {};
	struct vrdma_create_srq_cmd cmd = {};
	struct vrdma_create_srq_cmd_resp resp = {};
	struct virtio_rdma_create_srq_ureq *ureq;
	struct virtio_rdma_create_srq_uresp *uresp;
	struct ibv_srq_init_attr basic = {
		.srq_context = attr->srq_context,
		.attr = attr->attr,
	};
	struct vrdma_srq *srq;
	size_t len;
	int ret;

	/* Nothing is allocated (nor a parent domain's allocator called). */
	if (!to_vctx(context)->max_srq) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	pthread_spin_init(&srq->lock, PTHREAD_PROCESS_PRIVATE);
	srq->depth = pow2_at_least(max(attr->attr.max_wr, 1U));
	srq->wqe_shift = recv_wqe_shift(attr->attr.max_sge);
	srq->max_sge = attr->attr.max_sge;
	len = (size_t)srq->depth << srq->wqe_shift;
	ret = vrdma_qmem_alloc(&srq->mem, attr->pd, &srq->buf, len,
			       VRDMA_RES_TYPE_SRQ, &srq->db);
	if (ret) {
		free(srq);
		errno = ret;
		return NULL;
	}
	ureq = xrc ? &xcmd.drv_payload : &cmd.drv_payload;
	uresp = xrc ? &xresp.drv_payload : &resp.drv_payload;
	ureq->buf_va = (uintptr_t)srq->buf;
	ureq->buf_len = len;
	ureq->db_va = (uintptr_t)srq->db;
	ureq->depth = srq->depth;
	if (xrc)
		ret = ibv_cmd_create_srq_ex(context, &srq->vsrq, attr,
					    &xcmd.ibv_cmd, sizeof(xcmd),
					    &xresp.ibv_resp, sizeof(xresp));
	else
		ret = ibv_cmd_create_srq(attr->pd, &srq->vsrq.srq, &basic,
					 &cmd.ibv_cmd, sizeof(cmd),
					 &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err;
	}
	if (uresp->wqe_shift != srq->wqe_shift) {
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		errno = EPROTO;
		goto err;
	}
	srq->handle = uresp->srq_handle;
	srq->pi_word = vrdma_pi_words(to_vctx(attr->pd->context),
				      uresp->db_slot, srq->db);
	if (!srq->pi_word) {
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		errno = EPROTO;
		goto err;
	}
	/*
	 * libibverbs sets the number from the ioctl's attribute; the write()
	 * path has it in the response only.
	 */
	srq->vsrq.srq_type = xrc ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	if (xrc && !srq->vsrq.srq_num)
		srq->vsrq.srq_num = xresp.ibv_resp.srqn;
	attr->attr.max_wr = srq->depth;
	return &srq->vsrq.srq;
err:
	ret = errno;
	vrdma_qmem_free(&srq->mem, srq->buf, srq->db);
	free(srq);
	errno = ret;
	return NULL;
}

static struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd,
					struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex ex = {
		.srq_context = attr->srq_context,
		.attr = attr->attr,
		.comp_mask = IBV_SRQ_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_srq *srq;

	srq = vrdma_create_srq_common(pd->context, &ex, false);
	if (srq)
		attr->attr.max_wr = ex.attr.max_wr;
	return srq;
}

static int vrdma_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(srq, attr, &cmd, sizeof(cmd));
}

static int vrdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	vrdma_qmem_free(&srq->mem, srq->buf, srq->db);
	free(srq);
	return 0;
}

static int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			       struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	const struct recv_ring r = {
		.base = srq->buf,
		.pi_word = srq->pi_word,
		.ci_word = db_word(srq->db, DB_SRQ_CI),
		.depth = srq->depth,
		.wqe_shift = srq->wqe_shift,
		.max_sge = srq->max_sge,
		.pi = &srq->pi,
	};
	uint32_t posted;
	int ret;

	pthread_spin_lock(&srq->lock);
	ret = post_recvs(&r, wr, bad_wr, &posted);
	pthread_spin_unlock(&srq->lock);
	return post_done(ibsrq->context, posted, ret, vrdma_kick_srq, ibsrq);
}

/* Device completion status -> verbs (spec 18.18). */
static const enum ibv_wc_status wc_status[] = {
	[VIRTIO_RDMA_WC_SUCCESS] = IBV_WC_SUCCESS,
	[VIRTIO_RDMA_WC_LOC_LEN_ERR] = IBV_WC_LOC_LEN_ERR,
	[VIRTIO_RDMA_WC_LOC_QP_OP_ERR] = IBV_WC_LOC_QP_OP_ERR,
	[VIRTIO_RDMA_WC_LOC_PROT_ERR] = IBV_WC_LOC_PROT_ERR,
	[VIRTIO_RDMA_WC_WR_FLUSH_ERR] = IBV_WC_WR_FLUSH_ERR,
	[VIRTIO_RDMA_WC_BAD_RESP_ERR] = IBV_WC_BAD_RESP_ERR,
	[VIRTIO_RDMA_WC_LOC_ACCESS_ERR] = IBV_WC_LOC_ACCESS_ERR,
	[VIRTIO_RDMA_WC_REM_INV_REQ_ERR] = IBV_WC_REM_INV_REQ_ERR,
	[VIRTIO_RDMA_WC_REM_ACCESS_ERR] = IBV_WC_REM_ACCESS_ERR,
	[VIRTIO_RDMA_WC_REM_OP_ERR] = IBV_WC_REM_OP_ERR,
	[VIRTIO_RDMA_WC_RETRY_EXC_ERR] = IBV_WC_RETRY_EXC_ERR,
	[VIRTIO_RDMA_WC_RNR_RETRY_EXC_ERR] = IBV_WC_RNR_RETRY_EXC_ERR,
	[VIRTIO_RDMA_WC_FATAL_ERR] = IBV_WC_FATAL_ERR,
	[VIRTIO_RDMA_WC_MW_BIND_ERR] = IBV_WC_MW_BIND_ERR,
};

/*
 * Device completion opcode -> verbs (spec 18.14): the same numbers but for
 * BIND_MW (REG_MR, the kernel's, never reaches user space).
 */
uint8_t vrdma_wc_opcode(uint8_t opcode)
{
	return opcode == VIRTIO_RDMA_WC_BIND_MW ? IBV_WC_BIND_MW : opcode;
}

enum ibv_wc_status vrdma_wc_status(uint8_t status)
{
	return status < ARRAY_SIZE(wc_status) ? wc_status[status] :
						IBV_WC_GENERAL_ERR;
}

/* Spec 18.15: valid entries have owner 1 on even passes, 0 on odd ones. */
static uint8_t cqe_owner(uint32_t i, uint32_t depth)
{
	return ((i / depth) & 1) ? 0 : 1;
}

/*
 * Copies the entry at the consumer index into @e if the device wrote it;
 * the caller holds the CQ's lock (or polls single-threaded).
 */
bool vrdma_cq_next(struct vrdma_cq *cq, struct virtio_rdma_cqe *e)
{
	struct virtio_rdma_cqe *slot = (struct virtio_rdma_cqe *)cq->ring +
				       (cq->ci & (cq->depth - 1));
	uint8_t owner;

	owner = atomic_load_explicit((_Atomic uint8_t *)&slot->owner,
				     memory_order_acquire);
	if (owner != cqe_owner(cq->ci, cq->depth))
		return false;
	memcpy(e, slot, sizeof(*e));
	return true;
}

/* Hands the entries before the consumer index back to the device. */
void vrdma_cq_consumed(struct vrdma_cq *cq)
{
	atomic_store_explicit(db_word(cq->db, DB_CQ_CI), cq->ci,
			      memory_order_release);
}

static void cqe_to_wc(const struct virtio_rdma_cqe *e, struct ibv_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(e->wr_id);
	wc->status = vrdma_wc_status(e->status);
	wc->opcode = vrdma_wc_opcode(e->opcode);
	wc->vendor_err = le32toh(e->vendor_err);
	wc->byte_len = le32toh(e->byte_len);
	wc->qp_num = le32toh(e->qpn);
	wc->src_qp = le32toh(e->src_qpn);
	if (e->flags & VIRTIO_RDMA_CQE_WITH_IMM) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		/* The sender's four bytes, as they are (18.14). */
		memcpy(&wc->imm_data, &e->imm_data, sizeof(wc->imm_data));
	} else if (e->flags & VIRTIO_RDMA_CQE_WITH_INV) {
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = le32toh(e->imm_data);
	}
	if (e->flags & VIRTIO_RDMA_CQE_GRH)
		wc->wc_flags |= IBV_WC_GRH;
}

static int vrdma_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct virtio_rdma_cqe e;
	int got = 0;

	if (!cq->single_threaded)
		pthread_spin_lock(&cq->lock);
	while (got < n && vrdma_cq_next(cq, &e)) {
		cqe_to_wc(&e, &wc[got]);
		cq->ci++;
		got++;
	}
	if (got)
		vrdma_cq_consumed(cq);
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
	return got;
}

/*
 * Arms the CQ (spec 18.16): a new arm_seq with the kind, then a full fence
 * so that a completion written meanwhile is either seen by the caller's
 * next poll or raises the event.
 */
static int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	uint32_t armed, seq;

	armed = atomic_load_explicit(db_word(cq->db, DB_CQ_ARMED_SEQ),
				     memory_order_acquire);
	seq = (armed + 1) & 0x3fffffff;
	atomic_store_explicit(db_word(cq->db, DB_CQ_ARM),
			      seq << 2 | (solicited_only ? 2 : 1),
			      memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	return 0;
}

static struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd,
				      struct ibv_ah_attr *attr)
{
	struct vrdma_create_ah_cmd_resp resp = {};
	struct vrdma_ah *ah;

	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return NULL;
	if (ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp,
			      sizeof(resp))) {
		free(ah);
		return NULL;
	}
	ah->handle = resp.ah_handle;
	return &ah->ibv_ah;
}

static int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	int ret;

	ret = ibv_cmd_destroy_ah(ibah);
	if (ret)
		return ret;
	free(to_vah(ibah));
	return 0;
}

/*
 * A CQ of @attr->cqe entries or more: the ring and the doorbell record in
 * this process (from @parent_domain's allocators if not NULL), given to
 * the kernel with ibv_create_cq or, for @ex, ibv_create_cq_ex (whose
 * attributes the caller checked). Returns an errno.
 */
int vrdma_create_cq_common(struct ibv_context *context,
			   struct ibv_cq_init_attr_ex *attr, bool ex,
			   struct ibv_pd *parent_domain, struct vrdma_cq **out)
{
	struct vrdma_create_cq_ex_cmd_resp resp_ex = {};
	struct vrdma_create_cq_cmd_resp resp = {};
	struct vrdma_create_cq_ex_cmd cmd_ex = {};
	struct vrdma_create_cq_cmd cmd = {};
	struct virtio_rdma_create_cq_ureq *ureq;
	struct vrdma_cq *cq;
	uint32_t depth = 1;
	int ret;

	if (attr->cqe < 1)
		return EINVAL;
	while (depth < attr->cqe && depth < (1U << 31))
		depth <<= 1;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return ENOMEM;
	cq->depth = depth;
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	ret = vrdma_qmem_alloc(&cq->mem, parent_domain, &cq->ring,
			       (size_t)depth * 32, VRDMA_RES_TYPE_CQ, &cq->db);
	if (ret) {
		free(cq);
		return ret;
	}
	ureq = ex ? &cmd_ex.drv_payload : &cmd.drv_payload;
	ureq->ring_va = (uintptr_t)cq->ring;
	ureq->db_va = (uintptr_t)cq->db;
	ureq->depth = depth;
	if (ex) {
		ret = ibv_cmd_create_cq_ex(context, attr, &cq->vcq,
					   &cmd_ex.ibv_cmd, sizeof(cmd_ex),
					   &resp_ex.ibv_resp, sizeof(resp_ex),
					   0);
		cq->handle = resp_ex.cq_handle;
	} else {
		ret = ibv_cmd_create_cq(context, attr->cqe, attr->channel,
					attr->comp_vector, &cq->vcq.cq,
					&cmd.ibv_cmd, sizeof(cmd),
					&resp.ibv_resp, sizeof(resp));
		cq->handle = resp.cq_handle;
	}
	if (ret)
		goto err;
	*out = cq;
	return 0;
err:
	vrdma_qmem_free(&cq->mem, cq->ring, cq->db);
	free(cq);
	return ret;
}

static struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe,
				      struct ibv_comp_channel *channel,
				      int comp_vector)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = cqe < 0 ? 0 : cqe,
		.channel = channel,
		.comp_vector = comp_vector,
	};
	struct vrdma_cq *cq;
	int ret;

	ret = vrdma_create_cq_common(context, &attr, false, NULL, &cq);
	if (ret) {
		errno = ret;
		return NULL;
	}
	return &cq->vcq.cq;
}

static int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	vrdma_qmem_free(&cq->mem, cq->ring, cq->db);
	free(cq);
	return 0;
}

static int vrdma_destroy_qp(struct ibv_qp *ibqp);

/* The QP of attr, whose comp_mask libibverbs and create_qp_ex checked. */
static struct ibv_qp *vrdma_create_qp_common(struct ibv_context *context,
					     struct ibv_qp_init_attr_ex *attr)
{
	long page = sysconf(_SC_PAGESIZE);
	struct vrdma_create_qp_cmd cmd = {};
	struct vrdma_create_qp_cmd_resp resp = {};
	uint64_t sq_bytes, rq_bytes, rq_offset;
	struct vrdma_qp *qp;
	int ret;

	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq_lock, PTHREAD_PROCESS_PRIVATE);
	qp->sq_depth = pow2_at_least(max(attr->cap.max_send_wr, 1U));
	/*
	 * With an SRQ the QP has no receive ring of its own (spec 11.4), nor
	 * has an XRC initiator (12.12).
	 */
	if (attr->qp_type == IBV_QPT_XRC_SEND) {
		attr->cap.max_recv_wr = 0;
		attr->cap.max_recv_sge = 0;
	}
	qp->rq_depth = attr->srq || attr->qp_type == IBV_QPT_XRC_SEND ? 0 :
		       pow2_at_least(max(attr->cap.max_recv_wr, 1U));
	qp->sq_wqe_shift = send_wqe_shift(attr->cap.max_send_sge,
					  attr->cap.max_inline_data);
	qp->rq_wqe_shift = recv_wqe_shift(attr->cap.max_recv_sge);
	sq_bytes = (uint64_t)qp->sq_depth << qp->sq_wqe_shift;
	rq_bytes = (uint64_t)qp->rq_depth << qp->rq_wqe_shift;
	rq_offset = qp->rq_depth ? align(sq_bytes, page) : 0;
	qp->rq_offset = rq_offset;
	qp->buf_len = align(max(rq_offset, sq_bytes) + rq_bytes, page);
	ret = vrdma_qmem_alloc(&qp->mem, attr->pd, &qp->buf, qp->buf_len,
			       VRDMA_RES_TYPE_QP, &qp->db);
	if (ret) {
		free(qp);
		errno = ret;
		return NULL;
	}
	cmd.buf_va = (uintptr_t)qp->buf;
	cmd.buf_len = max(rq_offset, sq_bytes) + rq_bytes;
	cmd.db_va = (uintptr_t)qp->db;
	cmd.sq_depth = qp->sq_depth;
	cmd.rq_depth = qp->rq_depth;
	if (ibv_cmd_create_qp_ex(context, &qp->vqp, attr, &cmd.ibv_cmd,
				 sizeof(cmd), &resp.ibv_resp, sizeof(resp)))
		goto err;
	/* The device's layout must be the one the buffer was sized for. */
	if (resp.sq_wqe_shift != qp->sq_wqe_shift ||
	    resp.rq_wqe_shift != qp->rq_wqe_shift ||
	    resp.rq_offset != qp->rq_offset) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		errno = EPROTO;
		goto err;
	}
	qp->handle = resp.qp_handle;
	qp->sq_pi_word = vrdma_pi_words(to_vctx(context), resp.db_slot, qp->db);
	if (!qp->sq_pi_word) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		errno = EPROTO;
		goto err;
	}
	/* The slot's second word, or the record's (DB_RQ_PI). */
	qp->rq_pi_word = qp->sq_pi_word + 1;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	qp->max_inline_data = attr->cap.max_inline_data;
	attr->cap.max_send_wr = qp->sq_depth;
	if (!attr->srq && attr->qp_type != IBV_QPT_XRC_SEND)
		attr->cap.max_recv_wr = qp->rq_depth;
	return &qp->vqp.qp;
err:
	ret = errno;
	vrdma_qmem_free(&qp->mem, qp->buf, qp->db);
	free(qp);
	errno = ret;
	return NULL;
}

static struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
				      struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex attr_ex = {
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_qp *qp;

	qp = vrdma_create_qp_common(pd->context, &attr_ex);
	if (qp)
		attr->cap = attr_ex.cap;
	return qp;
}

/*
 * ibv_create_qp_ex: a QP as ibv_create_qp makes it, with the extended send
 * API (ibv_qp_ex) when IBV_QP_INIT_ATTR_SEND_OPS_FLAGS asks for it; an
 * XRC_RECV QP of its domain (xrc.c). TSO, RSS and the like are refused
 * with EOPNOTSUPP, create flags (none is implemented) with EINVAL, as
 * other providers do.
 */
static struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context,
					 struct ibv_qp_init_attr_ex *attr)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD |
			       IBV_QP_INIT_ATTR_CREATE_FLAGS |
			       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_qp_init_attr_ex attr_ex;
	struct ibv_qp *ibqp;
	int ret;

	if (attr->qp_type == IBV_QPT_XRC_RECV) {
		if (attr->comp_mask & ~(IBV_QP_INIT_ATTR_XRCD |
					IBV_QP_INIT_ATTR_PD)) {
			errno = EOPNOTSUPP;
			return NULL;
		}
		return vrdma_create_xrc_recv_qp(context, attr);
	}
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    (attr->comp_mask & ~known)) {
		errno = attr->comp_mask & IBV_QP_INIT_ATTR_PD ? EOPNOTSUPP :
								EINVAL;
		return NULL;
	}
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	    attr->create_flags) {
		errno = EINVAL;
		return NULL;
	}
	if (!attr->pd || attr->pd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	attr_ex = *attr;
	attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	attr_ex.create_flags = 0;
	ibqp = vrdma_create_qp_common(context, &attr_ex);
	if (!ibqp)
		return NULL;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		ret = vrdma_qp_ex_init(to_vqp(ibqp), to_vctx(context), attr);
		if (ret) {
			vrdma_destroy_qp(ibqp);
			errno = ret;
			return NULL;
		}
	}
	attr->cap = attr_ex.cap;
	return ibqp;
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
	/* An XRC_RECV QP, created or opened, has no memory of its own. */
	if (qp->buf)
		vrdma_qmem_free(&qp->mem, qp->buf, qp->db);
	free(qp);
	return 0;
}

/* What the extended send API offers depends on the device (qp_ex.c). */
int vrdma_query_caps(struct vrdma_context *ctx)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	struct ibv_device_attr_ex attr;
	int ret;

	ret = ibv_cmd_query_device_any(&ctx->ibv_ctx.context, NULL, &attr,
				       sizeof(attr), &resp, &resp_size);
	if (ret) {
		verbs_err(&ctx->ibv_ctx,
			  "virtio_rdma: querying the device failed: %s\n",
			  strerror(ret));
		return ret;
	}
	ctx->atomic_cap = attr.orig_attr.atomic_cap;
	ctx->device_cap_flags = attr.orig_attr.device_cap_flags;
	ctx->max_srq = attr.orig_attr.max_srq;
	return 0;
}

/*
 * Maps the context's doorbell page (spec 18.7) at @key; its header then
 * holds the engine's flags for every queue of the context.
 */
int vrdma_map_db_page(struct vrdma_context *ctx, uint64_t key)
{
	void *page;

	page = mmap(NULL, VIRTIO_RDMA_DB_PAGE_SIZE, PROT_READ | PROT_WRITE,
		    MAP_SHARED, ctx->ibv_ctx.context.cmd_fd, key);
	if (page == MAP_FAILED) {
		verbs_err(&ctx->ibv_ctx,
			  "virtio_rdma: mapping the doorbell page failed: %s\n",
			  strerror(errno));
		return errno;
	}
	ctx->db_page = page;
	ctx->db_flags = page;
	return 0;
}

_Atomic uint32_t *vrdma_pi_words(struct vrdma_context *ctx, uint32_t slot,
				 void *record)
{
	if (slot == VIRTIO_RDMA_NO_SLOT)
		return db_word(record, DB_SQ_PI);
	if (!ctx->db_page || slot >= VIRTIO_RDMA_DB_PAGE_SLOTS)
		return NULL;
	return db_word(ctx->db_page, VIRTIO_RDMA_DB_SLOT_OFFSET +
				     (size_t)slot * VIRTIO_RDMA_DB_SLOT_SIZE);
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	if (ctx->db_header)
		munmap(ctx->db_header, ctx->db_header_len);
	if (ctx->db_page)
		munmap(ctx->db_page, VIRTIO_RDMA_DB_PAGE_SIZE);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_context_ops = {
	.alloc_parent_domain = vrdma_alloc_parent_domain,
	.alloc_mw = vrdma_alloc_mw,
	.attach_mcast = ibv_cmd_attach_mcast,
	.alloc_pd = vrdma_alloc_pd,
	.bind_mw = vrdma_bind_mw,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_cq_ex = vrdma_create_cq_ex,
	.close_xrcd = vrdma_close_xrcd,
	.create_srq = vrdma_create_srq,
	.create_srq_ex = vrdma_create_srq_ex,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.dealloc_mw = vrdma_dealloc_mw,
	.detach_mcast = ibv_cmd_detach_mcast,
	.dealloc_pd = vrdma_dealloc_pd,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.free_context = vrdma_free_context,
	.get_srq_num = vrdma_get_srq_num,
	.import_mr = vrdma_import_mr,
	.import_pd = vrdma_import_pd,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.open_qp = vrdma_open_qp,
	.open_xrcd = vrdma_open_xrcd,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.req_notify_cq = vrdma_req_notify_cq,
	.resize_cq = vrdma_resize_cq,
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_mr = vrdma_reg_mr,
	.rereg_mr = vrdma_rereg_mr,
	.unimport_mr = vrdma_unimport_mr,
	.unimport_pd = vrdma_unimport_pd,
};

void vrdma_set_ops(struct vrdma_context *ctx)
{
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_context_ops);
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev,
						 int cmd_fd, void *private_data)
{
	struct vrdma_get_context_cmd_resp resp = {};
	struct vrdma_get_context_cmd cmd = {
		.flags = VIRTIO_RDMA_UCTX_REQ_DB_PAGE,
	};
	struct vrdma_context *ctx;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp)))
		goto err;
	if (vrdma_query_caps(ctx))
		goto err;
	if (resp.flags & VIRTIO_RDMA_UCTX_DB_PAGE) {
		if (resp.page_mmap_len != VIRTIO_RDMA_DB_PAGE_SIZE ||
		    vrdma_map_db_page(ctx, resp.page_mmap_key))
			goto err;
	} else if (resp.flags & VIRTIO_RDMA_UCTX_DB_HEADER) {
		ctx->db_header_len = resp.db_mmap_len;
		ctx->db_header = mmap(NULL, ctx->db_header_len, PROT_READ,
				      MAP_SHARED, cmd_fd, resp.db_mmap_key);
		if (ctx->db_header == MAP_FAILED) {
			ctx->db_header = NULL;
			verbs_err(&ctx->ibv_ctx,
				  "virtio_rdma: mapping the doorbell header failed: %s\n",
				  strerror(errno));
			goto err;
		}
		ctx->db_flags = ctx->db_header;
	}
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_context_ops);
	return &ctx->ibv_ctx;

err:
	if (ctx->db_page)
		munmap(ctx->db_page, VIRTIO_RDMA_DB_PAGE_SIZE);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
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
	.import_context = vrdma_import_context,
};

PROVIDER_DRIVER(virtio_rdma, vrdma_dev_ops);
