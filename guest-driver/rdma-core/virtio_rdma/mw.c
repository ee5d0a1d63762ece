// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Memory windows (spec 18.29): allocated through the kernel, bound by
 * BIND_MW work requests in the QP's send ring. A type 1 window is bound
 * with ibv_bind_mw, which posts the work request here and gives the window
 * its next key; a type 2 window by IBV_WR_BIND_MW or ibv_wr_bind_mw, with
 * the key the application chose.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <util/util.h>

#include "virtio_rdma.h"

struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct vrdma_alloc_mw_cmd_resp resp = {};
	struct ibv_alloc_mw cmd;
	struct vrdma_mw *mw;

	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return NULL;
	if (ibv_cmd_alloc_mw(pd, type, &mw->ibv_mw, &cmd, sizeof(cmd),
			     &resp.ibv_resp, sizeof(resp))) {
		free(mw);
		return NULL;
	}
	mw->handle = resp.mw_handle;
	return &mw->ibv_mw;
}

int vrdma_dealloc_mw(struct ibv_mw *ibmw)
{
	int ret;

	ret = ibv_cmd_dealloc_mw(ibmw);
	if (ret)
		return ret;
	free(to_vmw(ibmw));
	return 0;
}

/*
 * The rights a window grants, in the device's flags: remote ones only.
 * LOCAL_WRITE, which applications pass along (it is the MR's business),
 * is dropped; anything else cannot be granted (EINVAL).
 */
static int window_access(unsigned int flags, uint32_t *out)
{
	if (flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
		return EINVAL;
	*out = 0;
	if (flags & IBV_ACCESS_REMOTE_READ)
		*out |= VIRTIO_RDMA_ACCESS_REMOTE_READ;
	if (flags & IBV_ACCESS_REMOTE_WRITE)
		*out |= VIRTIO_RDMA_ACCESS_REMOTE_WRITE;
	if (flags & IBV_ACCESS_REMOTE_ATOMIC)
		*out |= VIRTIO_RDMA_ACCESS_REMOTE_ATOMIC;
	return 0;
}

/*
 * Writes the BIND_MW work request that binds @mw under @rkey as @info
 * says (no MR and length 0: unbinds a type 1 window) into @slot.
 */
int vrdma_encode_bind(uint64_t wr_id, unsigned int send_flags,
		      struct ibv_mw *mw, uint32_t rkey,
		      const struct ibv_mw_bind_info *info, uint8_t *slot)
{
	struct virtio_rdma_bind_mw_wqe w = {};
	uint32_t access = 0;

	if (!mw || (send_flags & ~(IBV_SEND_SIGNALED | IBV_SEND_FENCE)))
		return EINVAL;
	if (info->mr) {
		if (window_access(info->mw_access_flags, &access))
			return EINVAL;
		w.mr_lkey = htole32(info->mr->lkey);
	} else if (info->length) {
		return EINVAL;
	}
	w.wr_id = htole64(wr_id);
	w.opcode = VIRTIO_RDMA_WR_BIND_MW;
	if (send_flags & IBV_SEND_SIGNALED)
		w.flags |= VIRTIO_RDMA_WQE_SIGNALED;
	if (send_flags & IBV_SEND_FENCE)
		w.flags |= VIRTIO_RDMA_WQE_FENCE;
	w.new_rkey = htole32(rkey);
	w.addr = htole64(info->addr);
	w.length = htole64(info->length);
	w.mw_handle = htole32(to_vmw(mw)->handle);
	w.access = htole32(access);
	memcpy(slot, &w, sizeof(w));
	return 0;
}

/* ibv_bind_mw: a type 1 window under its next key, once posted. */
int vrdma_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind)
{
	struct ibv_send_wr wr = {
		.wr_id = mw_bind->wr_id,
		.opcode = IBV_WR_BIND_MW,
		.send_flags = mw_bind->send_flags,
		.bind_mw = {
			.mw = mw,
			.rkey = ibv_inc_rkey(mw->rkey),
			.bind_info = mw_bind->bind_info,
		},
	};
	struct ibv_send_wr *bad;
	int ret;

	if (mw->type != IBV_MW_TYPE_1)
		return EINVAL;
	ret = vrdma_post_bind_type1(qp, &wr, &bad);
	if (!ret)
		mw->rkey = wr.bind_mw.rkey;
	return ret;
}
