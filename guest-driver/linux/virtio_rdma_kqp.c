// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the queue pairs of kernel consumers: their rings in kernel
 * memory (spec 11.3, 11.4), and the posting of work requests (spec 18.5,
 * 18.8 to 18.13, 18.27) from any context, under a spinlock per ring, with
 * the notification step after each post (spec 18.6).
 *
 * The device sees the index of a work request in its ring as the WQE's
 * wr_id, never the consumer's wr_id (a pointer, for ib_cq's users): the
 * CQ poll takes the consumer's value from the QP's own table by that
 * index (virtio_rdma_kcq.c), so a wr_id coming back from the device names
 * at most one of the values the consumer posted.
 *
 * A GSI QP's rings are at most MAX_GSI_DEPTH deep (spec 18.26), while
 * ib_mad posts 512 receives by default: receive WQEs beyond the ring wait
 * in a backlog in the driver and move into the ring as the device
 * consumes WQEs (vrdma_kqp_refill(), from the CQ poll and the next post).
 */

#include <linux/log2.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

/* Spec 11.3: log2 of the send and receive WQE strides. */
static u32 vrdma_send_wqe_shift(u32 max_sge, u32 max_inline)
{
	u32 slots = max(max_sge, DIV_ROUND_UP(max_inline,
					      VIRTIO_RDMA_SGE_SIZE));

	return max_t(u32, 6, order_base_2(VIRTIO_RDMA_SEND_WQE_HEADER +
					  slots * VIRTIO_RDMA_SGE_SIZE));
}

static u32 vrdma_recv_wqe_shift(u32 max_sge)
{
	return max_t(u32, 5, order_base_2(VIRTIO_RDMA_RECV_WQE_HEADER +
					  max_sge * VIRTIO_RDMA_SGE_SIZE));
}

/* The table of the consumer's wr_ids of a ring, @n entries (a power of 2). */
static int vrdma_kwq_init(struct vrdma_kwq *wq, u8 *slots, u32 depth,
			  u32 shift, u32 max_sge, u32 n)
{
	spin_lock_init(&wq->lock);
	wq->slots = slots;
	wq->depth = depth;
	wq->wqe_shift = shift;
	wq->max_sge = max_sge;
	wq->wr_id = kvcalloc(n, sizeof(*wq->wr_id), GFP_KERNEL);
	wq->wr_id_mask = n - 1;
	return wq->wr_id ? 0 : -ENOMEM;
}

/*
 * The rings of a kernel QP and its doorbell record, for @init's
 * capabilities (returned as the QP has them); the page list request of
 * CREATE_QP (vrdma_list_alloc()) with the ring's BufferDesc in @buf.
 */
void *vrdma_kqp_alloc(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
		      size_t fixed_len, struct virtio_rdma_buffer_desc *buf,
		      size_t *req_len, size_t *nlist)
{
	struct vrdma_dev *dev = to_vib(qp->ibqp.device)->dev;
	u32 max_wr = le32_to_cpu(dev->attr.max_qp_wr);
	u32 sq_depth, rq_depth, want_rq, sshift, rshift, backlog = 0;
	struct ib_qp_cap *cap = &init->cap;
	size_t sq_bytes, rq_bytes, rq_offset;
	void *req;
	int ret;

	if (init->srq)
		return ERR_PTR(-EOPNOTSUPP);
	if (!cap->max_send_wr || cap->max_send_wr > max_wr ||
	    !cap->max_recv_wr || cap->max_recv_wr > max_wr)
		return ERR_PTR(-EINVAL);
	/* A receive WQE has at least one SGE without an SRQ (spec 12.12). */
	cap->max_recv_sge = max(cap->max_recv_sge, 1U);
	sq_depth = roundup_pow_of_two(cap->max_send_wr);
	want_rq = roundup_pow_of_two(cap->max_recv_wr);
	rq_depth = want_rq;
	if (init->qp_type == IB_QPT_GSI) {
		if (sq_depth > VIRTIO_RDMA_MAX_GSI_DEPTH)
			return ERR_PTR(-EINVAL);
		rq_depth = min_t(u32, want_rq, VIRTIO_RDMA_MAX_GSI_DEPTH);
		backlog = want_rq - rq_depth;
	}
	if (sq_depth > max_wr || rq_depth > max_wr)
		return ERR_PTR(-EINVAL);
	sshift = vrdma_send_wqe_shift(cap->max_send_sge, cap->max_inline_data);
	rshift = vrdma_recv_wqe_shift(cap->max_recv_sge);
	sq_bytes = (size_t)sq_depth << sshift;
	rq_bytes = (size_t)rq_depth << rshift;
	rq_offset = PAGE_ALIGN(sq_bytes);
	qp->buf_len = rq_offset + rq_bytes;
	qp->rq_offset = rq_offset;

	qp->buf = vrdma_kring_alloc(qp->buf_len);
	qp->db = vrdma_kdb_alloc();
	ret = -ENOMEM;
	if (!qp->buf || !qp->db)
		goto err;
	if (vrdma_kwq_init(&qp->sq, qp->buf, sq_depth, sshift,
			   cap->max_send_sge, sq_depth) ||
	    vrdma_kwq_init(&qp->rq, qp->buf + rq_offset, rq_depth, rshift,
			   cap->max_recv_sge, rq_depth + backlog))
		goto err;
	qp->sq.pi_db = &qp->db->sq_pi;
	qp->sq.ci_db = &qp->db->sq_ci;
	qp->rq.pi_db = &qp->db->rq_pi;
	qp->rq.ci_db = &qp->db->rq_ci;
	if (backlog) {
		qp->backlog.depth = backlog;
		qp->backlog.wqes = kvcalloc(backlog, 1UL << rshift, GFP_KERNEL);
		qp->backlog.wr_id = kvcalloc(backlog, sizeof(u64), GFP_KERNEL);
		if (!qp->backlog.wqes || !qp->backlog.wr_id)
			goto err;
	}
	qp->max_inline = cap->max_inline_data;
	req = vrdma_kring_list(dev, qp->buf, qp->buf_len, fixed_len, buf,
			       req_len, nlist);
	if (IS_ERR(req)) {
		ret = PTR_ERR(req);
		goto err;
	}
	cap->max_send_wr = sq_depth;
	/* What the consumer may have posted at once: ring and backlog. */
	cap->max_recv_wr = want_rq;
	qp->kernel = true;
	return req;

err:
	vrdma_kqp_free(qp);
	return ERR_PTR(ret);
}

/*
 * After CREATE_QP: the device's layout must be the one allocated. A QP
 * with a doorbell slot stores its producer indices there (spec 18.7).
 */
int vrdma_kqp_check(struct vrdma_ib *vib, struct vrdma_qp *qp,
		    const struct virtio_rdma_create_qp_resp *resp)
{
	u32 slot = le32_to_cpu(resp->db_slot);
	__le32 *words;

	if (le32_to_cpu(resp->sq_wqe_shift) != qp->sq.wqe_shift ||
	    le32_to_cpu(resp->rq_wqe_shift) != qp->rq.wqe_shift ||
	    le32_to_cpu(resp->rq_offset) != qp->rq_offset ||
	    vrdma_dbslot_check(!!vib->kctx_page, slot))
		return -EIO;
	if (slot != VIRTIO_RDMA_DB_NONE) {
		words = vrdma_dbslot(vib->kctx_page, slot);
		qp->sq.pi_db = &words[0];
		qp->rq.pi_db = &words[1];
	}
	return 0;
}

/* Frees what vrdma_kqp_alloc() allocated, once the device has let go. */
void vrdma_kqp_free(struct vrdma_qp *qp)
{
	kvfree(qp->backlog.wqes);
	kvfree(qp->backlog.wr_id);
	kvfree(qp->sq.wr_id);
	kvfree(qp->rq.wr_id);
	kfree(qp->db);
	vrdma_kring_free(qp->buf);
}

/*
 * Makes the QP's completions findable by QP number in its CQs (the CQ poll
 * looks only there).
 */
int vrdma_kqp_attach(struct vrdma_qp *qp)
{
	struct vrdma_cq *scq = to_vcq(qp->ibqp.send_cq);
	struct vrdma_cq *rcq = to_vcq(qp->ibqp.recv_cq);
	int ret;

	ret = xa_insert_irq(&scq->qps, qp->ibqp.qp_num, qp, GFP_KERNEL);
	if (ret || rcq == scq)
		return ret;
	ret = xa_insert_irq(&rcq->qps, qp->ibqp.qp_num, qp, GFP_KERNEL);
	if (ret)
		xa_erase_irq(&scq->qps, qp->ibqp.qp_num);
	return ret;
}

/*
 * The reverse, under each CQ's lock: once it returns, no poll of either
 * CQ uses the QP any more.
 */
void vrdma_kqp_detach(struct vrdma_qp *qp)
{
	struct vrdma_cq *cqs[2] = { to_vcq(qp->ibqp.send_cq),
				    to_vcq(qp->ibqp.recv_cq) };
	unsigned long flags;
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(cqs); i++) {
		spin_lock_irqsave(&cqs[i]->lock, flags);
		xa_cmpxchg(&cqs[i]->qps, qp->ibqp.qp_num, qp, NULL, 0);
		spin_unlock_irqrestore(&cqs[i]->lock, flags);
	}
}

/*
 * An SGE of a kernel consumer as the device takes it: under the local DMA
 * key the address is a kernel virtual one (virtio_rdma_kq.c) and becomes
 * guest-physical; under any other key it is an address in the region's
 * iova space and stays.
 */
static int vrdma_sge(struct vrdma_ib *vib, const struct ib_sge *in,
		     struct virtio_rdma_sge *out)
{
	u64 addr = in->addr;

	if (in->lkey == vib->ibdev.local_dma_lkey &&
	    vrdma_kva_to_gpa(in->addr, in->length, &addr))
		return -EINVAL;
	out->addr = cpu_to_le64(addr);
	out->length = cpu_to_le32(in->length);
	out->lkey = cpu_to_le32(in->lkey);
	return 0;
}

static int vrdma_sges(struct vrdma_ib *vib, const struct ib_sge *sg, int n,
		      u8 *slot)
{
	struct virtio_rdma_sge sge;
	int i, ret;

	for (i = 0; i < n; i++) {
		ret = vrdma_sge(vib, &sg[i], &sge);
		if (ret)
			return ret;
		memcpy(slot + i * sizeof(sge), &sge, sizeof(sge));
	}
	return 0;
}

/* A verbs send opcode to the device's, if the QP's type may post it. */
static int vrdma_wr_opcode(struct vrdma_qp *qp, enum ib_wr_opcode op, u8 *out)
{
	struct vrdma_dev *dev = to_vib(qp->ibqp.device)->dev;
	enum ib_qp_type type = qp->ibqp.qp_type;
	bool rc = type == IB_QPT_RC;

	switch (op) {
	case IB_WR_SEND:
		*out = VIRTIO_RDMA_WR_SEND;
		return 0;
	case IB_WR_SEND_WITH_IMM:
		*out = VIRTIO_RDMA_WR_SEND_WITH_IMM;
		return 0;
	case IB_WR_RDMA_WRITE:
		*out = VIRTIO_RDMA_WR_RDMA_WRITE;
		return rc ? 0 : -EINVAL;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		*out = VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM;
		return rc ? 0 : -EINVAL;
	case IB_WR_RDMA_READ:
		*out = VIRTIO_RDMA_WR_RDMA_READ;
		return rc ? 0 : -EINVAL;
	case IB_WR_ATOMIC_CMP_AND_SWP:
		*out = VIRTIO_RDMA_WR_ATOMIC_CMP_AND_SWP;
		break;
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		*out = VIRTIO_RDMA_WR_ATOMIC_FETCH_AND_ADD;
		break;
	case IB_WR_SEND_WITH_INV:
		*out = VIRTIO_RDMA_WR_SEND_WITH_INV;
		return rc ? 0 : -EINVAL;
	case IB_WR_LOCAL_INV:
		*out = VIRTIO_RDMA_WR_LOCAL_INV;
		return type != IB_QPT_GSI ? 0 : -EINVAL;
	case IB_WR_REG_MR:
		*out = VIRTIO_RDMA_WR_REG_MR;
		return type != IB_QPT_GSI ? 0 : -EINVAL;
	default:
		return -EINVAL;
	}
	/* The atomics. */
	return rc && virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_ATOMIC) ?
	       0 : -EINVAL;
}

static u8 vrdma_wqe_flags(int send_flags)
{
	u8 flags = 0;

	if (send_flags & IB_SEND_SIGNALED)
		flags |= VIRTIO_RDMA_WQE_SIGNALED;
	if (send_flags & IB_SEND_SOLICITED)
		flags |= VIRTIO_RDMA_WQE_SOLICITED;
	if (send_flags & IB_SEND_FENCE)
		flags |= VIRTIO_RDMA_WQE_FENCE;
	return flags;
}

/* A REG_MR work request's slot: a RegMrWqe (spec 18.27). */
static int vrdma_encode_reg(struct vrdma_qp *qp, const struct ib_reg_wr *wr,
			    u64 index, u8 *slot)
{
	struct vrdma_mr *mr = to_vmr(wr->mr);
	struct virtio_rdma_reg_mr_wqe w = {};
	u32 access;

	if (wr->mr->device != qp->ibqp.device || !mr->pages || !mr->npages ||
	    !is_power_of_2(wr->mr->page_size) ||
	    wr->mr->page_size < BIT(VIRTIO_RDMA_REG_MR_MIN_PAGE_SHIFT) ||
	    wr->mr->page_size > BIT(VIRTIO_RDMA_REG_MR_MAX_PAGE_SHIFT) ||
	    (wr->wr.send_flags & (IB_SEND_INLINE | IB_SEND_SOLICITED)) ||
	    vrdma_access(wr->access, &access))
		return -EINVAL;
	w.wr_id = cpu_to_le64(index);
	w.opcode = VIRTIO_RDMA_WR_REG_MR;
	w.flags = vrdma_wqe_flags(wr->wr.send_flags);
	w.key = cpu_to_le32(wr->key);
	w.iova = cpu_to_le64(wr->mr->iova);
	w.length = cpu_to_le64(wr->mr->length);
	w.pages_gpa = cpu_to_le64(virt_to_phys(mr->pages));
	w.mr_handle = cpu_to_le32(mr->handle);
	w.access = cpu_to_le32(access);
	w.npages = cpu_to_le32(mr->npages);
	w.page_shift = cpu_to_le32(ilog2(wr->mr->page_size));
	memcpy(slot, &w, sizeof(w));
	return 0;
}

/* Copies the message of an inline work request into its slot (18.10). */
static int vrdma_encode_inline(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			       struct virtio_rdma_send_wqe *w, u8 *slot)
{
	size_t room = min_t(size_t, qp->max_inline,
			    (1UL << qp->sq.wqe_shift) - sizeof(*w));
	size_t len = 0;
	int i;

	if (w->opcode != VIRTIO_RDMA_WR_SEND &&
	    w->opcode != VIRTIO_RDMA_WR_SEND_WITH_IMM &&
	    w->opcode != VIRTIO_RDMA_WR_RDMA_WRITE &&
	    w->opcode != VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM)
		return -EINVAL;
	for (i = 0; i < wr->num_sge; i++) {
		if (wr->sg_list[i].length > room - len)
			return -EINVAL;
		memcpy(slot + sizeof(*w) + len,
		       (void *)(uintptr_t)wr->sg_list[i].addr,
		       wr->sg_list[i].length);
		len += wr->sg_list[i].length;
	}
	w->flags |= VIRTIO_RDMA_WQE_INLINE;
	w->inline_len = cpu_to_le32(len);
	return 0;
}

/*
 * Encodes one send work request into its slot (spec 18.8 to 18.11, 18.27),
 * with @index, its position in the ring, as the device's wr_id. In ERR
 * every WQE is flushed whatever it is (spec 18.19), so ib_drain_qp()'s
 * RDMA WRITE goes on any QP type then.
 */
static int vrdma_encode_send(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			     u64 index, u8 *slot)
{
	struct vrdma_ib *vib = to_vib(qp->ibqp.device);
	struct virtio_rdma_send_wqe w = {};
	bool ud = qp->ibqp.qp_type != IB_QPT_RC;
	int ret;

	ret = vrdma_wr_opcode(qp, wr->opcode, &w.opcode);
	if (ret && READ_ONCE(qp->state) != IB_QPS_ERR)
		return ret;
	if (wr->send_flags & ~(IB_SEND_SIGNALED | IB_SEND_SOLICITED |
			       IB_SEND_INLINE | IB_SEND_FENCE))
		return -EINVAL;
	if (wr->opcode == IB_WR_REG_MR)
		return vrdma_encode_reg(qp, reg_wr(wr), index, slot);
	w.wr_id = cpu_to_le64(index);
	w.flags = vrdma_wqe_flags(wr->send_flags);
	switch (wr->opcode) {
	case IB_WR_SEND_WITH_IMM:
	case IB_WR_RDMA_WRITE_WITH_IMM:
		/* Four opaque bytes, in the consumer's (network) order. */
		w.imm_data = (__force __le32)wr->ex.imm_data;
		break;
	case IB_WR_SEND_WITH_INV:
		w.imm_data = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_LOCAL_INV:
		w.rkey = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	default:
		break;
	}
	switch (wr->opcode) {
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_WRITE_WITH_IMM:
	case IB_WR_RDMA_READ:
		if (ud)
			break;
		w.remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		w.rkey = cpu_to_le32(rdma_wr(wr)->rkey);
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		if (ud)
			break;
		w.remote_addr = cpu_to_le64(atomic_wr(wr)->remote_addr);
		w.rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		w.compare_add = cpu_to_le64(atomic_wr(wr)->compare_add);
		w.swap = cpu_to_le64(atomic_wr(wr)->swap);
		break;
	default:
		break;
	}
	if (ud && (wr->opcode == IB_WR_SEND ||
		   wr->opcode == IB_WR_SEND_WITH_IMM)) {
		if (!ud_wr(wr)->ah)
			return -EINVAL;
		w.ah_handle = cpu_to_le32(to_vah(ud_wr(wr)->ah)->handle);
		w.remote_qpn = cpu_to_le32(ud_wr(wr)->remote_qpn);
		w.remote_qkey = cpu_to_le32(ud_wr(wr)->remote_qkey);
	}
	if (wr->num_sge < 0)
		return -EINVAL;
	if (wr->send_flags & IB_SEND_INLINE) {
		ret = vrdma_encode_inline(qp, wr, &w, slot);
	} else if (wr->opcode == IB_WR_LOCAL_INV) {
		ret = 0;
	} else {
		if ((u32)wr->num_sge > qp->sq.max_sge ||
		    sizeof(w) + wr->num_sge * VIRTIO_RDMA_SGE_SIZE >
		    (1UL << qp->sq.wqe_shift))
			return -EINVAL;
		w.num_sge = cpu_to_le16(wr->num_sge);
		ret = vrdma_sges(vib, wr->sg_list, wr->num_sge,
				 slot + sizeof(w));
	}
	if (ret)
		return ret;
	memcpy(slot, &w, sizeof(w));
	return 0;
}

static u8 *vrdma_slot(struct vrdma_kwq *wq, u32 index)
{
	return wq->slots + ((size_t)(index & (wq->depth - 1)) << wq->wqe_shift);
}

/*
 * Publishes a ring's new producer index with a release store, so that the
 * device, having read it, also sees the WQEs (spec 18.5).
 */
static void vrdma_kwq_publish(struct vrdma_kwq *wq)
{
	/* Release: the WQEs before the index. */
	smp_store_release(wq->pi_db, cpu_to_le32(wq->pi));
}

/* The free slots of a ring (spec 18.5: its consumer index, acquired). */
static u32 vrdma_kwq_room(struct vrdma_kwq *wq)
{
	/* Acquire: slots are written after the device copied them out. */
	u32 ci = le32_to_cpu(smp_load_acquire(wq->ci_db));

	/* A consumer index beyond the producer's: the device's, trusted not. */
	return wq->pi - ci <= wq->depth ? wq->depth - (wq->pi - ci) : 0;
}

/*
 * post_send: kernel QPs post into their ring; for a user space QP, whose
 * process cannot reach notifyq itself, a post of no work request is the
 * kick of spec 18.6.
 */
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr)
{
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_kwq *wq = &qp->sq;
	unsigned long flags;
	u32 room, posted = 0;
	int ret = 0;

	if (!qp->kernel) {
		if (wr) {
			*bad_wr = wr;
			return -EOPNOTSUPP;
		}
		virtqueue_notify(vib->dev->notifyq);
		return 0;
	}
	spin_lock_irqsave(&wq->lock, flags);
	room = vrdma_kwq_room(wq);
	for (; wr; wr = wr->next) {
		u32 index = wq->pi + posted;

		if (posted == room) {
			ret = -ENOMEM;
			break;
		}
		ret = vrdma_encode_send(qp, wr, index, vrdma_slot(wq, index));
		if (ret)
			break;
		wq->wr_id[index & wq->wr_id_mask] = wr->wr_id;
		posted++;
	}
	if (posted) {
		wq->pi += posted;
		vrdma_kwq_publish(wq);
	}
	spin_unlock_irqrestore(&wq->lock, flags);
	if (ret)
		*bad_wr = wr;
	if (posted)
		vrdma_kick(vib);
	return ret;
}

/* Encodes a receive work request (spec 18.13) into a slot of @wq's size. */
static int vrdma_encode_recv(struct vrdma_ib *vib, struct vrdma_kwq *wq,
			     const struct ib_recv_wr *wr, u8 *slot)
{
	struct virtio_rdma_recv_wqe w = {};
	int ret;

	if (wr->num_sge < 0 || (u32)wr->num_sge > wq->max_sge)
		return -EINVAL;
	w.num_sge = cpu_to_le32(wr->num_sge);
	ret = vrdma_sges(vib, wr->sg_list, wr->num_sge, slot + sizeof(w));
	if (ret)
		return ret;
	memcpy(slot, &w, sizeof(w));
	return 0;
}

/* Sets the device's wr_id of the WQE at ring index @index. */
static void vrdma_recv_set_index(u8 *slot, u32 index)
{
	__le64 id = cpu_to_le64(index);

	memcpy(slot + offsetof(struct virtio_rdma_recv_wqe, wr_id), &id,
	       sizeof(id));
}

/*
 * Moves backlogged receive WQEs of a GSI QP into its ring while there is
 * room (rq lock held); whether any moved (the caller publishes and kicks).
 */
static bool vrdma_backlog_move(struct vrdma_qp *qp)
{
	struct vrdma_backlog *bl = &qp->backlog;
	struct vrdma_kwq *wq = &qp->rq;
	size_t stride = 1UL << wq->wqe_shift;
	u32 room, moved = 0;

	if (bl->head == bl->tail)
		return false;
	room = vrdma_kwq_room(wq);
	while (bl->head != bl->tail && moved < room) {
		u32 b = bl->head & (bl->depth - 1);
		u8 *slot = vrdma_slot(wq, wq->pi);

		memcpy(slot, bl->wqes + b * stride, stride);
		vrdma_recv_set_index(slot, wq->pi);
		wq->wr_id[wq->pi & wq->wr_id_mask] = bl->wr_id[b];
		wq->pi++;
		bl->head++;
		moved++;
	}
	return moved;
}

/*
 * After receive completions of a GSI QP with a backlog (the CQ poll): the
 * device consumed ring WQEs, so backlogged ones move in. Any context.
 */
void vrdma_kqp_refill(struct vrdma_qp *qp)
{
	unsigned long flags;
	bool moved;

	spin_lock_irqsave(&qp->rq.lock, flags);
	moved = vrdma_backlog_move(qp);
	if (moved)
		vrdma_kwq_publish(&qp->rq);
	spin_unlock_irqrestore(&qp->rq.lock, flags);
	if (moved)
		vrdma_kick(to_vib(qp->ibqp.device));
}

/*
 * The QP went to RESET: its posted work requests are discarded without
 * completions (spec 13.3), the backlogged receives too.
 */
void vrdma_kqp_reset(struct vrdma_qp *qp)
{
	struct vrdma_cq *scq = to_vcq(qp->ibqp.send_cq);
	struct vrdma_cq *rcq = to_vcq(qp->ibqp.recv_cq);
	unsigned long flags;

	spin_lock_irqsave(&scq->lock, flags);
	qp->sq.done = READ_ONCE(qp->sq.pi);
	spin_unlock_irqrestore(&scq->lock, flags);
	spin_lock_irqsave(&rcq->lock, flags);
	spin_lock(&qp->rq.lock);
	qp->backlog.head = qp->backlog.tail;
	qp->rq.done = qp->rq.pi;
	spin_unlock(&qp->rq.lock);
	spin_unlock_irqrestore(&rcq->lock, flags);
}

/*
 * post_recv of a kernel QP: into the receive ring; for a GSI QP, behind
 * its backlog when there is one (receive WQEs are consumed in posting
 * order).
 */
int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr)
{
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_backlog *bl = &qp->backlog;
	struct vrdma_kwq *wq = &qp->rq;
	unsigned long flags;
	bool moved;
	u32 room;
	int ret = 0;

	if (!qp->kernel) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	spin_lock_irqsave(&wq->lock, flags);
	moved = vrdma_backlog_move(qp);
	room = vrdma_kwq_room(wq);
	for (; wr; wr = wr->next) {
		if (bl->head == bl->tail && room) {
			ret = vrdma_encode_recv(vib, wq, wr,
						vrdma_slot(wq, wq->pi));
			if (ret)
				break;
			vrdma_recv_set_index(vrdma_slot(wq, wq->pi), wq->pi);
			wq->wr_id[wq->pi & wq->wr_id_mask] = wr->wr_id;
			wq->pi++;
			room--;
			moved = true;
		} else if (bl->tail - bl->head < bl->depth) {
			u32 b = bl->tail & (bl->depth - 1);

			ret = vrdma_encode_recv(vib, wq, wr, bl->wqes +
						((size_t)b << wq->wqe_shift));
			if (ret)
				break;
			bl->wr_id[b] = wr->wr_id;
			bl->tail++;
		} else {
			ret = -ENOMEM;
			break;
		}
	}
	if (moved)
		vrdma_kwq_publish(wq);
	spin_unlock_irqrestore(&wq->lock, flags);
	if (ret)
		*bad_wr = wr;
	if (moved)
		vrdma_kick(vib);
	return ret;
}

/*
 * Draining (ib_drain_sq(), ib_drain_rq()): the QP goes to ERR and a marker
 * follows its work requests, as ib_core's own drain does; the marker's
 * completion, the last of the queue, ends the wait. Once the device is
 * stopped (a reset) nothing would complete it: the consumer's CQ is run
 * (vrdma_kcq_kick()) and its poll flushes the queue, the marker last
 * (vrdma_kcq_flush()); a marker that found no room in the ring is queued
 * for that flush. So nvmet or NFS tearing down their queues during a
 * reset neither fail nor wait forever.
 */
struct vrdma_drain {
	struct ib_cqe cqe;
	struct completion done;
};

static void vrdma_drain_done(struct ib_cq *cq, struct ib_wc *wc)
{
	complete(&container_of(wc->wr_cqe, struct vrdma_drain, cqe)->done);
}

static int vrdma_drain_post(struct vrdma_qp *qp, bool recv,
			    struct vrdma_drain *d)
{
	/* In ERR any WQE is flushed: the marker touches no memory. */
	struct ib_rdma_wr swr = {
		.wr = {
			.wr_cqe = &d->cqe,
			.opcode = IB_WR_RDMA_WRITE,
			.send_flags = IB_SEND_SIGNALED,
		},
	};
	struct ib_recv_wr rwr = { .wr_cqe = &d->cqe };
	const struct ib_send_wr *sbad;
	const struct ib_recv_wr *rbad;

	if (recv)
		return vrdma_post_recv(&qp->ibqp, &rwr, &rbad);
	return vrdma_post_send(&qp->ibqp, &swr.wr, &sbad);
}

static void vrdma_drain(struct vrdma_qp *qp, bool recv)
{
	struct vrdma_dev *dev = to_vib(qp->ibqp.device)->dev;
	struct ib_cq *cq = recv ? qp->ibqp.recv_cq : qp->ibqp.send_cq;
	struct vrdma_kwq *wq = recv ? &qp->rq : &qp->sq;
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };
	struct vrdma_drain d = { .cqe.done = vrdma_drain_done };
	unsigned long flags;
	int ret;

	if (!qp->kernel)
		return;
	init_completion(&d.done);
	ret = ib_modify_qp(&qp->ibqp, &attr, IB_QP_STATE);
	if (ret) {
		dev_warn(&qp->ibqp.device->dev,
			 "QP %u: not drained: the move to ERR failed: %d\n",
			 qp->ibqp.qp_num, ret);
		return;
	}
	ret = vrdma_drain_post(qp, recv, &d);
	if (ret) {
		if (!vrdma_dev_stopped(dev)) {
			dev_warn(&qp->ibqp.device->dev,
				 "QP %u: not drained: the marker was not posted: %d\n",
				 qp->ibqp.qp_num, ret);
			return;
		}
		spin_lock_irqsave(&wq->lock, flags);
		wq->drain = &d.cqe;
		spin_unlock_irqrestore(&wq->lock, flags);
	}
	while (!wait_for_completion_timeout(&d.done, HZ / 10)) {
		if (cq->poll_ctx == IB_POLL_DIRECT)
			ib_process_cq_direct(cq, -1);
		else if (vrdma_dev_stopped(dev))
			vrdma_kcq_kick(cq);
	}
}

void vrdma_drain_sq(struct ib_qp *ibqp)
{
	vrdma_drain(to_vqp(ibqp), false);
}

void vrdma_drain_rq(struct ib_qp *ibqp)
{
	vrdma_drain(to_vqp(ibqp), true);
}
