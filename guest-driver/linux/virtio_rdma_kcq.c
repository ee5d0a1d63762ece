// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the completion queues of kernel consumers: the ring and
 * doorbell record in kernel memory, polling by the owner bit (spec 18.14,
 * 18.15) and arming (spec 18.16), from any context under the CQ's
 * spinlock. CQ_COMPLETION events reach the consumer's comp_handler through
 * the event queue (virtio_rdma_event.c).
 *
 * Everything in a CQE is device input: its QP number is looked up among
 * the kernel QPs that complete into this CQ (vrdma_kqp_attach()), its
 * wr_id is an index into that QP's table of the consumer's wr_ids, and
 * unknown opcodes and statuses become errors, not guesses.
 *
 * Once the device is stopped (a reset: it destroyed every QP, spec 15.1)
 * nothing completes the work it had not completed, so the poll does, as a
 * QP in ERR would (spec 18.19): after the CQEs the device wrote, every WQE
 * from the last one a CQE completed on is flushed, in posting order.
 */

#include <linux/bottom_half.h>
#include <linux/log2.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

/* The kinds of CqDoorbell.arm (spec 18.16). */
#define VRDMA_ARM_NEXT 1
#define VRDMA_ARM_SOLICITED 2
#define VRDMA_ARM_SEQ_MASK 0x3fffffff

/* The ring of a kernel CQ of at least @cqe entries, and its record. */
int vrdma_kcq_alloc(struct vrdma_cq *cq, u32 cqe, u32 max_cqe)
{
	if (!cqe || cqe > max_cqe)
		return -EINVAL;
	cq->depth = roundup_pow_of_two(cqe);
	if (cq->depth > max_cqe)
		return -EINVAL;
	spin_lock_init(&cq->lock);
	xa_init_flags(&cq->qps, XA_FLAGS_LOCK_IRQ);
	cq->ring = vrdma_kring_alloc((size_t)cq->depth * VIRTIO_RDMA_CQE_SIZE);
	cq->db = vrdma_kdb_alloc();
	if (!cq->ring || !cq->db) {
		vrdma_kcq_free(cq);
		return -ENOMEM;
	}
	cq->kernel = true;
	return 0;
}

/* Frees what vrdma_kcq_alloc() allocated, once the device has let go. */
void vrdma_kcq_free(struct vrdma_cq *cq)
{
	xa_destroy(&cq->qps);
	kfree(cq->db);
	vrdma_kring_free(cq->ring);
}

/* Spec 18.15: valid entries have owner 1 on even passes, 0 on odd ones. */
static u8 vrdma_cqe_owner(struct vrdma_cq *cq, u32 index)
{
	return !((index >> ilog2(cq->depth)) & 1);
}

/* Whether the entry at the consumer index is valid (CQ lock held). */
static bool vrdma_kcq_ready(struct vrdma_cq *cq)
{
	struct virtio_rdma_cqe *cqe = &cq->ring[cq->ci & (cq->depth - 1)];

	/* Acquire: the rest of the entry is read after its owner (18.15). */
	return smp_load_acquire(&cqe->owner) == vrdma_cqe_owner(cq, cq->ci);
}

static const enum ib_wc_status vrdma_wc_status[] = {
	[VIRTIO_RDMA_WC_SUCCESS] = IB_WC_SUCCESS,
	[VIRTIO_RDMA_WC_LOC_LEN_ERR] = IB_WC_LOC_LEN_ERR,
	[VIRTIO_RDMA_WC_LOC_QP_OP_ERR] = IB_WC_LOC_QP_OP_ERR,
	[VIRTIO_RDMA_WC_LOC_PROT_ERR] = IB_WC_LOC_PROT_ERR,
	[VIRTIO_RDMA_WC_WR_FLUSH_ERR] = IB_WC_WR_FLUSH_ERR,
	[VIRTIO_RDMA_WC_BAD_RESP_ERR] = IB_WC_BAD_RESP_ERR,
	[VIRTIO_RDMA_WC_LOC_ACCESS_ERR] = IB_WC_LOC_ACCESS_ERR,
	[VIRTIO_RDMA_WC_REM_INV_REQ_ERR] = IB_WC_REM_INV_REQ_ERR,
	[VIRTIO_RDMA_WC_REM_ACCESS_ERR] = IB_WC_REM_ACCESS_ERR,
	[VIRTIO_RDMA_WC_REM_OP_ERR] = IB_WC_REM_OP_ERR,
	[VIRTIO_RDMA_WC_RETRY_EXC_ERR] = IB_WC_RETRY_EXC_ERR,
	[VIRTIO_RDMA_WC_RNR_RETRY_EXC_ERR] = IB_WC_RNR_RETRY_EXC_ERR,
	[VIRTIO_RDMA_WC_FATAL_ERR] = IB_WC_FATAL_ERR,
	[VIRTIO_RDMA_WC_MW_BIND_ERR] = IB_WC_MW_BIND_ERR,
};

static const enum ib_wc_opcode vrdma_wc_send_opcode[] = {
	[VIRTIO_RDMA_WC_SEND] = IB_WC_SEND,
	[VIRTIO_RDMA_WC_RDMA_WRITE] = IB_WC_RDMA_WRITE,
	[VIRTIO_RDMA_WC_RDMA_READ] = IB_WC_RDMA_READ,
	[VIRTIO_RDMA_WC_COMP_SWAP] = IB_WC_COMP_SWAP,
	[VIRTIO_RDMA_WC_FETCH_ADD] = IB_WC_FETCH_ADD,
	[VIRTIO_RDMA_WC_REG_MR] = IB_WC_REG_MR,
	[VIRTIO_RDMA_WC_LOCAL_INV] = IB_WC_LOCAL_INV,
	[VIRTIO_RDMA_WC_BIND_MW] = IB_WC_BIND_MW,
};

/* The receive side of a work completion (spec 18.13, 18.14, 18.26). */
static void vrdma_wc_recv(struct vrdma_qp *qp, const struct virtio_rdma_cqe *e,
			  struct ib_wc *wc)
{
	wc->opcode = e->opcode == VIRTIO_RDMA_WC_RECV_RDMA_WITH_IMM ?
		     IB_WC_RECV_RDMA_WITH_IMM : IB_WC_RECV;
	if (e->flags & VIRTIO_RDMA_CQE_WITH_IMM) {
		wc->wc_flags |= IB_WC_WITH_IMM;
		/* The sender's four bytes, as they are (spec 18.14). */
		wc->ex.imm_data = (__force __be32)e->imm_data;
	} else if (e->flags & VIRTIO_RDMA_CQE_WITH_INV) {
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = le32_to_cpu(e->imm_data);
	}
	if (qp->ibqp.qp_type != IB_QPT_RC) {
		wc->src_qp = le32_to_cpu(e->src_qpn) & 0xffffff;
		/* The GRH is always in the IPv6 form (spec 18.13). */
		if (e->flags & VIRTIO_RDMA_CQE_GRH)
			wc->wc_flags |= IB_WC_GRH;
		wc->wc_flags |= IB_WC_WITH_NETWORK_HDR_TYPE;
		wc->network_hdr_type = RDMA_NETWORK_IPV6;
	}
}

/*
 * A CQE as a work completion of one of the CQ's kernel QPs; false for a
 * CQE that names none (it is consumed and dropped).
 */
static bool vrdma_kcq_wc(struct vrdma_cq *cq, const struct virtio_rdma_cqe *e,
			 struct ib_wc *wc, struct vrdma_qp **refill)
{
	bool recv = e->opcode & VIRTIO_RDMA_WC_RECV;
	struct vrdma_qp *qp;
	struct vrdma_kwq *wq;
	u32 index;

	qp = xa_load(&cq->qps, le32_to_cpu(e->qpn));
	if (!qp || (recv ? qp->ibqp.recv_cq : qp->ibqp.send_cq) != &cq->ibcq) {
		dev_warn_ratelimited(&cq->ibcq.device->dev,
				     "CQ %#x: completion for QP %u, which does not complete here: dropped\n",
				     cq->handle, le32_to_cpu(e->qpn));
		return false;
	}
	wq = recv ? &qp->rq : &qp->sq;
	index = le64_to_cpu(e->wr_id);
	/* Completions come in ring order; an index out of range moves none. */
	if (index - wq->done < READ_ONCE(wq->pi) - wq->done)
		wq->done = index + 1;
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wq->wr_id[index & wq->wr_id_mask];
	wc->status = e->status < ARRAY_SIZE(vrdma_wc_status) ?
		     vrdma_wc_status[e->status] : IB_WC_GENERAL_ERR;
	wc->qp = &qp->ibqp;
	wc->vendor_err = le32_to_cpu(e->vendor_err);
	wc->byte_len = le32_to_cpu(e->byte_len);
	wc->port_num = VRDMA_PORT_NUM;
	if (recv) {
		vrdma_wc_recv(qp, e, wc);
		if (qp->backlog.depth)
			*refill = qp;
	} else if (e->opcode < ARRAY_SIZE(vrdma_wc_send_opcode)) {
		wc->opcode = vrdma_wc_send_opcode[e->opcode];
	} else if (wc->status == IB_WC_SUCCESS) {
		wc->status = IB_WC_GENERAL_ERR;
	}
	return true;
}

/* A flushed work request (spec 18.19: only wr_id, status, opcode, qp). */
static void vrdma_flush_wc(struct ib_wc *wc, struct vrdma_qp *qp, bool recv,
			   u64 wr_id)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = IB_WC_WR_FLUSH_ERR;
	wc->opcode = recv ? IB_WC_RECV : IB_WC_SEND;
	wc->qp = &qp->ibqp;
	wc->port_num = VRDMA_PORT_NUM;
}

/*
 * Flushes up to @n work requests of one queue of @qp into @wc (CQ lock
 * held; the device is stopped): the ring's from wq->done on, then a GSI
 * QP's backlogged receives, then the queue's drain marker.
 */
static int vrdma_kwq_flush(struct vrdma_qp *qp, bool recv, struct ib_wc *wc,
			   int n)
{
	struct vrdma_kwq *wq = recv ? &qp->rq : &qp->sq;
	struct vrdma_backlog *bl = &qp->backlog;
	int got = 0;

	spin_lock(&wq->lock);
	for (; got < n && wq->done != wq->pi; wq->done++)
		vrdma_flush_wc(&wc[got++], qp, recv,
			       wq->wr_id[wq->done & wq->wr_id_mask]);
	for (; recv && got < n && bl->head != bl->tail; bl->head++)
		vrdma_flush_wc(&wc[got++], qp, recv,
			       bl->wr_id[bl->head & (bl->depth - 1)]);
	if (got < n && wq->drain) {
		vrdma_flush_wc(&wc[got], qp, recv, 0);
		wc[got++].wr_cqe = wq->drain;
		wq->drain = NULL;
	}
	spin_unlock(&wq->lock);
	return got;
}

/* The flush of every kernel QP that completes into @cq (its lock held). */
static int vrdma_kcq_flush(struct vrdma_cq *cq, struct ib_wc *wc, int n)
{
	struct vrdma_qp *qp;
	unsigned long i;
	int got = 0;

	xa_for_each(&cq->qps, i, qp) {
		if (got < n && qp->ibqp.send_cq == &cq->ibcq)
			got += vrdma_kwq_flush(qp, false, wc + got, n - got);
		if (got < n && qp->ibqp.recv_cq == &cq->ibcq && !qp->ibqp.srq)
			got += vrdma_kwq_flush(qp, true, wc + got, n - got);
	}
	return got;
}

/*
 * Runs the consumer's handler of @ibcq as a completion event would, so
 * that it polls what the device will not report any more (a stopped
 * device). A CQ polled directly has none: its owner polls. Called in
 * process context: with bottom halves off around it, a softirq CQ's poll
 * the handler raises runs when they are on again, not left pending.
 */
void vrdma_kcq_kick(struct ib_cq *ibcq)
{
	if (ibcq->poll_ctx == IB_POLL_DIRECT || !ibcq->comp_handler)
		return;
	local_bh_disable();
	ibcq->comp_handler(ibcq, ibcq->cq_context);
	local_bh_enable();
}

int vrdma_poll_cq(struct ib_cq *ibcq, int n, struct ib_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_qp *refill = NULL;
	struct virtio_rdma_cqe e;
	unsigned long flags;
	u32 ci;
	int got = 0;

	if (!cq->kernel)
		return -EOPNOTSUPP;
	spin_lock_irqsave(&cq->lock, flags);
	ci = cq->ci;
	while (got < n && vrdma_kcq_ready(cq)) {
		/* One copy: the device may write the slot meanwhile. */
		memcpy(&e, &cq->ring[cq->ci & (cq->depth - 1)], sizeof(e));
		cq->ci++;
		if (vrdma_kcq_wc(cq, &e, &wc[got], &refill))
			got++;
		/* The GSI backlog, while the QP is known to be alive. */
		if (refill) {
			vrdma_kqp_refill(refill);
			refill = NULL;
		}
	}
	if (cq->ci != ci)
		/* Release: the entries were read before the device reuses them. */
		smp_store_release(&cq->db->ci, cpu_to_le32(cq->ci));
	if (got < n && vrdma_dev_stopped(to_vib(ibcq->device)->dev))
		got += vrdma_kcq_flush(cq, wc + got, n - got);
	spin_unlock_irqrestore(&cq->lock, flags);
	return got;
}

/*
 * Arms the CQ (spec 18.16): a new arm_seq with the kind, then a full fence,
 * so that a CQE written meanwhile is either seen by the check that
 * IB_CQ_REPORT_MISSED_EVENTS asks for (and the consumer's next poll) or
 * raises the event.
 */
int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	unsigned long irqflags;
	u32 seq, kind;
	int ret = 0;

	if (!cq->kernel)
		return -EOPNOTSUPP;
	kind = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ?
	       VRDMA_ARM_SOLICITED : VRDMA_ARM_NEXT;
	spin_lock_irqsave(&cq->lock, irqflags);
	seq = (le32_to_cpu(READ_ONCE(cq->db->armed_seq)) + 1) &
	      VRDMA_ARM_SEQ_MASK;
	WRITE_ONCE(cq->db->arm, cpu_to_le32(seq << 2 | kind));
	/* Orders the arm store before the check, as the device's fence. */
	smp_mb();
	if ((flags & IB_CQ_REPORT_MISSED_EVENTS) && vrdma_kcq_ready(cq))
		ret = 1;
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return ret;
}
