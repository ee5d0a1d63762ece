// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * MODIFY_QP in the provider: the state the application set, which posts
 * check, and on a move to RESET the QP's completions taken out of its
 * CQs.
 *
 * A QP moved to RESET leaves no completions behind: its entries not
 * polled yet (the flushes of its error state, typically) are taken out of
 * its CQs, as mlx4 and mlx5 do, so that the QP brought up again does not
 * report its previous life's work requests. After MODIFY_QP to RESET the
 * device writes no more completions of the QP (spec 18.22); other QPs'
 * keep arriving past the entries this looks at.
 */

#include <string.h>

#include "virtio_rdma.h"

/* Spec 18.15: valid entries have owner 1 on even passes, 0 on odd ones. */
static uint8_t owner_of(uint32_t i, uint32_t depth)
{
	return ((i / depth) & 1) ? 0 : 1;
}

static struct virtio_rdma_cqe *cqe_at(struct vrdma_cq *cq, uint32_t i)
{
	return (struct virtio_rdma_cqe *)cq->ring + (i & (cq->depth - 1));
}

/*
 * Removes QP @qpn's entries from the unpolled ones of @cq: the others move
 * towards the producer end, keeping their order, and the consumer index
 * skips the freed slots.
 */
static void cq_clean(struct vrdma_cq *cq, uint32_t qpn)
{
	uint32_t end, nfreed = 0, k, n;

	if (!cq->single_threaded)
		pthread_spin_lock(&cq->lock);
	/* An entry being read by ibv_start_poll .. ibv_end_poll stays. */
	if (cq->cur_valid)
		goto out;
	end = cq->ci;
	while (end - cq->ci < cq->depth &&
	       atomic_load_explicit((_Atomic uint8_t *)&cqe_at(cq, end)->owner,
				    memory_order_acquire) ==
		       owner_of(end, cq->depth))
		end++;
	n = end - cq->ci;
	for (k = 1; k <= n; k++) {
		uint32_t i = end - k;
		struct virtio_rdma_cqe e;

		memcpy(&e, cqe_at(cq, i), sizeof(e));
		if (le32toh(e.qpn) == qpn) {
			nfreed++;
			continue;
		}
		if (!nfreed)
			continue;
		e.owner = owner_of(i + nfreed, cq->depth);
		memcpy(cqe_at(cq, i + nfreed), &e, sizeof(e));
	}
	if (nfreed) {
		cq->ci += nfreed;
		/* The freed slots go back to the device. */
		atomic_store_explicit(db_word(cq->db, DB_CQ_CI), cq->ci,
				      memory_order_release);
	}
out:
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
}

/* The QP's completions not polled yet leave its CQs. */
static void reset_cqs(struct ibv_qp *qp)
{
	if (qp->send_cq)
		cq_clean(to_vcq(qp->send_cq), qp->qp_num);
	if (qp->recv_cq && qp->recv_cq != qp->send_cq)
		cq_clean(to_vcq(qp->recv_cq), qp->qp_num);
}

int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		    int attr_mask)
{
	struct ibv_modify_qp cmd;
	int ret;

	ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
	if (ret || !(attr_mask & IBV_QP_STATE))
		return ret;
	atomic_store_explicit(&to_vqp(ibqp)->state, attr->qp_state,
			      memory_order_relaxed);
	if (attr->qp_state == IBV_QPS_RESET)
		reset_cqs(ibqp);
	return 0;
}
