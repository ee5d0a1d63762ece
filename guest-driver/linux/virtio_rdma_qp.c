// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: queue pairs (CREATE_QP, MODIFY_QP, QUERY_QP, DESTROY_QP).
 * For user space the provider allocates the queue buffer and the doorbell
 * record, and the kernel pins them; a kernel consumer's QP has them in
 * kernel memory (virtio_rdma_kqp.c, which also posts its work requests).
 * Verbs attributes are translated to the device's (spec 12.12 to 12.15).
 */

#include <linux/log2.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

/* The QP_FLAG_SIG_ALL flag of CREATE_QP. */
#define VRDMA_QP_FLAG_SIG_ALL 0x1

/*
 * The device's type of a verbs QP type: RC, UD, for user space UC and
 * XRC_INI (the device refuses them without F_UC, F_XRC; XRC_TGT QPs are
 * virtio_rdma_xrc.c's), and for kernel consumers (ib_mad) GSI,
 * which the driver offers only with F_GSI (spec 18.26).
 */
static int vrdma_qp_type(struct vrdma_ib *vib, enum ib_qp_type ib_type,
			 bool user, u32 *type)
{
	switch (ib_type) {
	case IB_QPT_RC:
		*type = VIRTIO_RDMA_QPT_RC;
		return 0;
	case IB_QPT_UD:
		*type = VIRTIO_RDMA_QPT_UD;
		return 0;
	case IB_QPT_UC:
		/* User space only: kernel ULPs have no use for UC. */
		*type = VIRTIO_RDMA_QPT_UC;
		return user ? 0 : -EOPNOTSUPP;
	case IB_QPT_XRC_INI:
		/* User space only, as UC; the device refuses it without F_XRC. */
		*type = VIRTIO_RDMA_QPT_XRC_INI;
		return user ? 0 : -EOPNOTSUPP;
	case IB_QPT_GSI:
		*type = VIRTIO_RDMA_QPT_GSI;
		return !user && vib->gsi ? 0 : -EOPNOTSUPP;
	default:
		return -EOPNOTSUPP;
	}
}

/*
 * A user space QP's buffer and record, pinned; the page list request of
 * CREATE_QP and the depths the provider chose.
 */
static void *vrdma_uqp_prepare(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
			       struct ib_udata *udata, size_t fixed_len,
			       struct virtio_rdma_buffer_desc *buf,
			       size_t *req_len, size_t *nlist, u64 *db_gpa,
			       u32 *sq_depth, u32 *rq_depth)
{
	struct vrdma_dev *dev = to_vib(qp->ibqp.device)->dev;
	struct virtio_rdma_create_qp_ureq ureq = {};
	void *req;
	int ret;

	if (udata->inlen < sizeof(ureq) ||
	    ib_copy_from_udata(&ureq, udata, sizeof(ureq)))
		return ERR_PTR(-EINVAL);
	/* With an SRQ, or as an XRC initiator, no receive ring of its own. */
	if (!is_power_of_2(ureq.sq_depth) ||
	    (init->srq || init->qp_type == IB_QPT_XRC_INI ?
			 ureq.rq_depth != 0 :
			 !is_power_of_2(ureq.rq_depth) ||
			 ureq.rq_depth < init->cap.max_recv_wr) ||
	    ureq.sq_depth < init->cap.max_send_wr)
		return ERR_PTR(-EINVAL);
	ret = vrdma_pin_queue(qp->ibqp.device, ureq.buf_va, ureq.buf_len,
			      ureq.db_va, &qp->q, db_gpa);
	if (ret)
		return ERR_PTR(ret);
	req = vrdma_page_list(dev, qp->q.buf, PAGE_SIZE, fixed_len, buf,
			      req_len, nlist);
	if (IS_ERR(req))
		vrdma_release_queue(&qp->q);
	*sq_depth = ureq.sq_depth;
	*rq_depth = ureq.rq_depth;
	return req;
}

/* Releases a QP's rings and record once the device no longer uses them. */
static void vrdma_qp_release(struct vrdma_qp *qp)
{
	if (qp->kernel) {
		vrdma_kqp_detach(qp);
		vrdma_kqp_free(qp);
	} else {
		vrdma_release_queue(&qp->q);
	}
}

/* What a new QP has beside its handle (kernel QPs: checked, findable). */
static int vrdma_qp_created(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
			    const struct virtio_rdma_create_qp_resp *resp)
{
	bool gsi, qp1;
	int ret;

	qp->handle = le32_to_cpu(resp->qp_handle);
	qp->ibqp.qp_num = le32_to_cpu(resp->qpn) & 0xffffff;
	qp->state = IB_QPS_RESET;
	qp->sig_all = init->sq_sig_type == IB_SIGNAL_ALL_WR;
	if (!qp->kernel)
		return 0;
	ret = vrdma_kqp_check(to_vib(qp->ibqp.device), qp, resp);
	if (ret)
		return ret;
	/* QP 1 is the GSI QP's number, and only its (spec 18.26). */
	gsi = init->qp_type == IB_QPT_GSI;
	qp1 = qp->ibqp.qp_num == VIRTIO_RDMA_GSI_QPN;
	if (gsi != qp1)
		return -EIO;
	return vrdma_kqp_attach(qp);
}

int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_create_qp_uresp uresp = {};
	struct virtio_rdma_buffer_desc buf = {};
	struct virtio_rdma_create_qp_resp resp;
	struct virtio_rdma_create_qp_req *req;
	struct vrdma_qp *qp = to_vqp(ibqp);
	u32 type, sq_depth, rq_depth;
	size_t req_len, nlist;
	u64 db_gpa;
	int ret;

	if (init->qp_type == IB_QPT_XRC_TGT)
		return vrdma_create_tgt_qp(qp, init);
	ret = vrdma_qp_type(vib, init->qp_type, uc, &type);
	if (ret)
		return ret;
	if (init->create_flags)
		return -EOPNOTSUPP;
	if (uc) {
		req = vrdma_uqp_prepare(qp, init, udata, sizeof(*req), &buf,
					&req_len, &nlist, &db_gpa, &sq_depth,
					&rq_depth);
	} else if (vib->kverbs) {
		req = vrdma_kqp_alloc(qp, init, sizeof(*req), &buf, &req_len,
				      &nlist);
		db_gpa = virt_to_phys(qp->db);
		sq_depth = qp->sq.depth;
		rq_depth = qp->rq.depth;
	} else {
		/* Kernel consumers need F_MEM_MGT (the local DMA key). */
		return -EOPNOTSUPP;
	}
	if (IS_ERR(req))
		return PTR_ERR(req);
	req->pd_handle = cpu_to_le32(to_vpd(ibqp->pd)->handle);
	req->qp_type = cpu_to_le32(type);
	req->send_cq = cpu_to_le32(to_vcq(init->send_cq)->handle);
	/* An XRC initiator has none. */
	if (init->recv_cq)
		req->recv_cq = cpu_to_le32(to_vcq(init->recv_cq)->handle);
	if (init->srq)
		req->srq_handle = cpu_to_le32(to_vsrq(init->srq)->handle);
	req->flags = cpu_to_le32(init->sq_sig_type == IB_SIGNAL_ALL_WR ?
				 VRDMA_QP_FLAG_SIG_ALL : 0);
	req->sq_depth = cpu_to_le32(sq_depth);
	req->rq_depth = cpu_to_le32(rq_depth);
	req->max_send_sge = cpu_to_le32(init->cap.max_send_sge);
	req->max_recv_sge = cpu_to_le32(init->cap.max_recv_sge);
	req->max_inline_data = cpu_to_le32(init->cap.max_inline_data);
	req->db_gpa = cpu_to_le64(db_gpa);
	req->buf = buf;
	ret = vrdma_exec_list(dev, VIRTIO_RDMA_OP_CREATE_QP, req, sizeof(*req),
			      req_len, nlist, &resp, sizeof(resp));
	if (ret == -ETIMEDOUT)
		return ret; /* the device may use the pages: keep them */
	if (ret) {
		vrdma_qp_release(qp);
		return ret;
	}
	ret = vrdma_qp_created(qp, init, &resp);
	if (!ret)
		ret = xa_insert_irq(&vib->qps, qp->handle, qp, GFP_KERNEL);
	if (ret) {
		vrdma_destroy_qp(ibqp, udata);
		return ret;
	}
	if (!uc)
		return 0;
	uresp.qp_handle = qp->handle;
	uresp.sq_wqe_shift = le32_to_cpu(resp.sq_wqe_shift);
	uresp.rq_wqe_shift = le32_to_cpu(resp.rq_wqe_shift);
	uresp.rq_offset = le32_to_cpu(resp.rq_offset);
	uresp.db_slot = le32_to_cpu(resp.db_slot);
	ret = vrdma_dbslot_check(!!uc->db_page, uresp.db_slot);
	if (!ret)
		ret = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
	if (ret) {
		vrdma_destroy_qp(ibqp, udata);
		return ret;
	}
	return 0;
}

int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_qp_handle_req req = {
		.qp_handle = cpu_to_le32(qp->handle),
	};
	unsigned long flags;
	int ret;

	/* Its events (virtio_rdma_event.c) no longer find it. */
	spin_lock_irqsave(&dev->event_lock, flags);
	xa_cmpxchg(&vib->qps, qp->handle, qp, NULL, 0);
	spin_unlock_irqrestore(&dev->event_lock, flags);

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_QP, &req, sizeof(req),
			     NULL, 0);
	if (ret && !vrdma_dev_stopped(dev))
		return ret;
	vrdma_qp_release(qp);
	return 0;
}

/* verbs attribute mask bit -> device attribute mask bit */
static const struct {
	int ib;
	u32 dev;
} vrdma_attr_bits[] = {
	{ IB_QP_STATE, VIRTIO_RDMA_ATTR_STATE },
	{ IB_QP_CUR_STATE, VIRTIO_RDMA_ATTR_CUR_STATE },
	{ IB_QP_EN_SQD_ASYNC_NOTIFY, VIRTIO_RDMA_ATTR_EN_SQD_ASYNC_NOTIFY },
	{ IB_QP_ACCESS_FLAGS, VIRTIO_RDMA_ATTR_ACCESS },
	{ IB_QP_PKEY_INDEX, VIRTIO_RDMA_ATTR_PKEY_INDEX },
	{ IB_QP_PORT, VIRTIO_RDMA_ATTR_PORT },
	{ IB_QP_QKEY, VIRTIO_RDMA_ATTR_QKEY },
	{ IB_QP_AV, VIRTIO_RDMA_ATTR_AV },
	{ IB_QP_PATH_MTU, VIRTIO_RDMA_ATTR_PATH_MTU },
	{ IB_QP_TIMEOUT, VIRTIO_RDMA_ATTR_TIMEOUT },
	{ IB_QP_RETRY_CNT, VIRTIO_RDMA_ATTR_RETRY_CNT },
	{ IB_QP_RNR_RETRY, VIRTIO_RDMA_ATTR_RNR_RETRY },
	{ IB_QP_RQ_PSN, VIRTIO_RDMA_ATTR_RQ_PSN },
	{ IB_QP_MAX_QP_RD_ATOMIC, VIRTIO_RDMA_ATTR_MAX_RD_ATOMIC },
	{ IB_QP_MIN_RNR_TIMER, VIRTIO_RDMA_ATTR_MIN_RNR_TIMER },
	{ IB_QP_SQ_PSN, VIRTIO_RDMA_ATTR_SQ_PSN },
	{ IB_QP_MAX_DEST_RD_ATOMIC, VIRTIO_RDMA_ATTR_MAX_DEST_RD_ATOMIC },
	{ IB_QP_DEST_QPN, VIRTIO_RDMA_ATTR_DEST_QPN },
};

int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		    struct ib_udata *udata)
{
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct virtio_rdma_modify_qp_req req = {};
	struct virtio_rdma_qp_attr *a = &req.attr;
	int known = 0;
	u32 dev_mask = 0;
	unsigned int i;
	int ret;

	for (i = 0; i < ARRAY_SIZE(vrdma_attr_bits); i++) {
		known |= vrdma_attr_bits[i].ib;
		if (mask & vrdma_attr_bits[i].ib)
			dev_mask |= vrdma_attr_bits[i].dev;
	}
	if (mask & ~known)
		return -EOPNOTSUPP;
	if (mask & IB_QP_ACCESS_FLAGS) {
		u32 access;

		/*
		 * Remote FLUSH rights are dropped: the device runs no FLUSH,
		 * so they grant nothing (rdma-core's tests ask for them).
		 */
		ret = vrdma_access(attr->qp_access_flags & ~VRDMA_ACCESS_FLUSH,
				   &access);
		if (ret)
			return ret;
		a->access = cpu_to_le32(access);
	}
	if (mask & IB_QP_AV) {
		ret = vrdma_av(vib, &attr->ah_attr, &a->av);
		if (ret)
			return ret;
	}
	req.qp_handle = cpu_to_le32(to_vqp(ibqp)->handle);
	/* Only the selected fields; the others stay 0 (spec 12.13). */
	if (mask & IB_QP_STATE)
		a->qp_state = cpu_to_le32(attr->qp_state);
	if (mask & IB_QP_CUR_STATE)
		a->cur_qp_state = cpu_to_le32(attr->cur_qp_state);
	if (mask & IB_QP_PKEY_INDEX)
		a->pkey_index = cpu_to_le32(attr->pkey_index);
	if (mask & IB_QP_PORT)
		a->port = cpu_to_le32(attr->port_num);
	/*
	 * ib_core gives a GSI QP its port at creation, and ib_mad moves it to
	 * INIT without one; the device wants it as for any UD QP (13.2).
	 */
	if (ibqp->qp_type == IB_QPT_GSI && (mask & IB_QP_STATE) &&
	    attr->qp_state == IB_QPS_INIT &&
	    READ_ONCE(to_vqp(ibqp)->state) == IB_QPS_RESET &&
	    !(mask & IB_QP_PORT)) {
		dev_mask |= VIRTIO_RDMA_ATTR_PORT;
		a->port = cpu_to_le32(VRDMA_PORT_NUM);
	}
	if (mask & IB_QP_QKEY)
		a->qkey = cpu_to_le32(attr->qkey);
	if (mask & IB_QP_PATH_MTU)
		a->path_mtu = cpu_to_le32(attr->path_mtu);
	if (mask & IB_QP_TIMEOUT)
		a->timeout = cpu_to_le32(attr->timeout);
	if (mask & IB_QP_RETRY_CNT)
		a->retry_cnt = cpu_to_le32(attr->retry_cnt);
	if (mask & IB_QP_RNR_RETRY)
		a->rnr_retry = cpu_to_le32(attr->rnr_retry);
	if (mask & IB_QP_MIN_RNR_TIMER)
		a->min_rnr_timer = cpu_to_le32(attr->min_rnr_timer);
	if (mask & IB_QP_RQ_PSN)
		a->rq_psn = cpu_to_le32(attr->rq_psn);
	if (mask & IB_QP_SQ_PSN)
		a->sq_psn = cpu_to_le32(attr->sq_psn);
	if (mask & IB_QP_DEST_QPN)
		a->dest_qpn = cpu_to_le32(attr->dest_qp_num);
	if (mask & IB_QP_MAX_QP_RD_ATOMIC)
		a->max_rd_atomic = cpu_to_le32(attr->max_rd_atomic);
	if (mask & IB_QP_MAX_DEST_RD_ATOMIC)
		a->max_dest_rd_atomic = cpu_to_le32(attr->max_dest_rd_atomic);
	if (mask & IB_QP_EN_SQD_ASYNC_NOTIFY)
		a->en_sqd_async_notify = cpu_to_le32(attr->en_sqd_async_notify);
	req.attr_mask = cpu_to_le32(dev_mask);
	ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_MODIFY_QP, &req,
			     sizeof(req), NULL, 0);
	/*
	 * A stopped device destroyed the QP (spec 15.1): for its consumer that
	 * is ERR already, and a drain's move to ERR must not fail (the flush
	 * is the poll's, vrdma_kcq_flush()).
	 */
	if (ret && (mask & IB_QP_STATE) && attr->qp_state == IB_QPS_ERR &&
	    vrdma_dev_stopped(vib->dev))
		ret = 0;
	if (!ret && (mask & IB_QP_STATE)) {
		/* What the EVENTS_LOST re-query compares with. */
		WRITE_ONCE(to_vqp(ibqp)->state, attr->qp_state);
		if (attr->qp_state == IB_QPS_RESET) {
			WRITE_ONCE(to_vqp(ibqp)->err_reported, false);
			if (to_vqp(ibqp)->kernel)
				vrdma_kqp_reset(to_vqp(ibqp));
		}
	}
	return ret;
}

/* The device's access flags (spec 10.5) to ib_core's; unknown bits go. */
static int vrdma_ib_access(u32 access)
{
	int ib_access = 0;

	if (access & VIRTIO_RDMA_ACCESS_LOCAL_WRITE)
		ib_access |= IB_ACCESS_LOCAL_WRITE;
	if (access & VIRTIO_RDMA_ACCESS_REMOTE_WRITE)
		ib_access |= IB_ACCESS_REMOTE_WRITE;
	if (access & VIRTIO_RDMA_ACCESS_REMOTE_READ)
		ib_access |= IB_ACCESS_REMOTE_READ;
	if (access & VIRTIO_RDMA_ACCESS_REMOTE_ATOMIC)
		ib_access |= IB_ACCESS_REMOTE_ATOMIC;
	return ib_access;
}

/*
 * The device's address vector to a verbs one (the reverse of vrdma_av).
 * An all-zero destination GID is the address of a QP that has none (never
 * set, or reset: spec 12.14): the attribute stays empty. The source GID
 * index goes back to ib_core's: the lowest entry of ib_core's table that
 * add_gid mapped to the device's index, or 0 when ib_core holds none any
 * more.
 */
static void vrdma_ah_attr(struct vrdma_ib *vib,
			  const struct virtio_rdma_address_vector *av,
			  struct rdma_ah_attr *ah)
{
	union ib_gid dgid;
	u8 index = 0;
	unsigned int i;

	if (!memchr_inv(av->dgid, 0, sizeof(av->dgid)))
		return;
	memcpy(dgid.raw, av->dgid, sizeof(dgid.raw));
	for (i = 0; i < ARRAY_SIZE(vib->gid_map); i++) {
		if (vib->gid_map[i] == av->sgid_index) {
			index = i;
			break;
		}
	}
	ah->type = rdma_ah_find_type(&vib->ibdev, VRDMA_PORT_NUM);
	rdma_ah_set_port_num(ah, VRDMA_PORT_NUM);
	rdma_ah_set_sl(ah, av->sl & 0xf);
	rdma_ah_set_grh(ah, &dgid, le32_to_cpu(av->flow_label) & 0xfffff,
			index, av->hop_limit, av->traffic_class);
}

int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init)
{
	struct vrdma_ib *vib = to_vib(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct virtio_rdma_qp_handle_req req = {
		.qp_handle = cpu_to_le32(qp->handle),
	};
	struct virtio_rdma_query_qp_resp resp;
	struct virtio_rdma_qp_attr *a = &resp.attr;
	int ret;

	ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_QUERY_QP, &req,
			     sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = le32_to_cpu(a->qp_state);
	attr->cur_qp_state = attr->qp_state;
	attr->path_mtu = le32_to_cpu(a->path_mtu);
	attr->qkey = le32_to_cpu(a->qkey);
	attr->rq_psn = le32_to_cpu(a->rq_psn);
	attr->sq_psn = le32_to_cpu(a->sq_psn);
	attr->dest_qp_num = le32_to_cpu(a->dest_qpn);
	attr->qp_access_flags = vrdma_ib_access(le32_to_cpu(a->access));
	vrdma_ah_attr(vib, &a->av, &attr->ah_attr);
	attr->pkey_index = le32_to_cpu(a->pkey_index);
	attr->en_sqd_async_notify = !!le32_to_cpu(a->en_sqd_async_notify);
	attr->sq_draining = le32_to_cpu(a->sq_draining);
	attr->port_num = le32_to_cpu(a->port);
	attr->timeout = le32_to_cpu(a->timeout);
	attr->retry_cnt = le32_to_cpu(a->retry_cnt);
	attr->rnr_retry = le32_to_cpu(a->rnr_retry);
	attr->min_rnr_timer = le32_to_cpu(a->min_rnr_timer);
	attr->max_rd_atomic = le32_to_cpu(a->max_rd_atomic);
	attr->max_dest_rd_atomic = le32_to_cpu(a->max_dest_rd_atomic);
	attr->cap.max_send_wr = le32_to_cpu(resp.sq_depth);
	attr->cap.max_recv_wr = le32_to_cpu(resp.rq_depth);
	attr->cap.max_send_sge = le32_to_cpu(resp.max_send_sge);
	attr->cap.max_recv_sge = le32_to_cpu(resp.max_recv_sge);
	attr->cap.max_inline_data = le32_to_cpu(resp.max_inline_data);
	init->cap = attr->cap;
	init->qp_type = ibqp->qp_type;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	/* CREATE_QP's QP_FLAG_SIG_ALL, which the device does not report. */
	init->sq_sig_type = qp->sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
	return 0;
}
