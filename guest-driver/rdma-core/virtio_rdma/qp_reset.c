// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
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
		vrdma_cq_consumed(cq);
	}
out:
	if (!cq->single_threaded)
		pthread_spin_unlock(&cq->lock);
}

void vrdma_qp_reset_cqs(struct ibv_qp *qp)
{
	if (qp->send_cq)
		cq_clean(to_vcq(qp->send_cq), qp->qp_num);
	if (qp->recv_cq && qp->recv_cq != qp->send_cq)
		cq_clean(to_vcq(qp->recv_cq), qp->qp_num);
}
