// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the events of the event queue (spec chapter 14), handed to
 * ib_core.
 *
 * Events are handled in the event queue's interrupt, under the event lock.
 * The object an event names is looked up by handle in the xarray of its
 * kind (CQs, QPs, SRQs); objects leave their xarray under the same lock
 * before they are destroyed, so an event never reaches an object being
 * destroyed, and a handle that names no live object of the kind is ignored
 * (spec 14.2). Everything in an event is device input and checked: unknown
 * kinds and port events for another port are ignored.
 *
 * The sequence numbers tell the driver when the device lost its state
 * without a reset of the driver's (a VMM reconnection, spec 15.2): an
 * event with seq 1 after other events, or an EVENTS_LOST whose lost range
 * starts at 1 (spec 14.3). That, and DEVICE_FATAL, make the
 * driver reset the device (virtio_rdma_main.c). EVENTS_LOST makes it
 * re-read what the lost events could have said (vrdma_requery_work).
 */

#include <rdma/ib_verbs.h>

#include "virtio_rdma.h"

static void vrdma_cq_event(struct vrdma_ib *vib, u32 kind, u32 handle)
{
	struct vrdma_cq *cq = xa_load(&vib->cqs, handle);
	struct ib_event ev = {};

	if (!cq)
		return;
	if (kind == VIRTIO_RDMA_EV_CQ_COMPLETION) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
		return;
	}
	if (!cq->ibcq.event_handler)
		return;
	ev.device = &vib->ibdev;
	ev.event = IB_EVENT_CQ_ERR;
	ev.element.cq = &cq->ibcq;
	cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
}

static void vrdma_qp_dispatch(struct vrdma_ib *vib, struct vrdma_qp *qp,
			      enum ib_event_type type)
{
	struct ib_event ev = {};

	if (type == IB_EVENT_QP_FATAL || type == IB_EVENT_QP_REQ_ERR ||
	    type == IB_EVENT_QP_ACCESS_ERR)
		qp->err_reported = true;
	if (!qp->ibqp.event_handler)
		return;
	ev.device = &vib->ibdev;
	ev.event = type;
	ev.element.qp = &qp->ibqp;
	qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
}

static void vrdma_srq_dispatch(struct vrdma_ib *vib, struct vrdma_srq *srq,
			       enum ib_event_type type)
{
	struct ib_event ev = {};

	if (type == IB_EVENT_SRQ_LIMIT_REACHED)
		srq->limit_armed = false;
	if (!srq->ibsrq.event_handler)
		return;
	ev.device = &vib->ibdev;
	ev.event = type;
	ev.element.srq = &srq->ibsrq;
	srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
}

static void vrdma_port_event(struct vrdma_dev *dev, enum ib_port_state state)
{
	struct ib_event ev = {};

	dev->port_state = state;
	if (!dev->ib)
		return;
	ev.device = &dev->ib->ibdev;
	ev.event = state == IB_PORT_ACTIVE ? IB_EVENT_PORT_ACTIVE :
					     IB_EVENT_PORT_ERR;
	ev.element.port_num = VRDMA_PORT_NUM;
	ib_dispatch_event(&ev);
}

/*
 * The device lost the driver's objects, or must be reset: drop events
 * from now on and have the reset work reset it. Called under the event
 * lock.
 */
void vrdma_lost_locked(struct vrdma_dev *dev, const char *why)
{
	if (!dev->ev_ignore)
		vrdma_queue_reset_locked(dev, why);
}

/* The events of the device concerning its objects, to ib_core's types. */
static const enum ib_event_type vrdma_qp_events[] = {
	[VIRTIO_RDMA_EV_QP_FATAL] = IB_EVENT_QP_FATAL,
	[VIRTIO_RDMA_EV_QP_REQ_ERROR] = IB_EVENT_QP_REQ_ERR,
	[VIRTIO_RDMA_EV_QP_ACCESS_ERROR] = IB_EVENT_QP_ACCESS_ERR,
	[VIRTIO_RDMA_EV_QP_COMM_EST] = IB_EVENT_COMM_EST,
	[VIRTIO_RDMA_EV_QP_SQ_DRAINED] = IB_EVENT_SQ_DRAINED,
	[VIRTIO_RDMA_EV_QP_LAST_WQE_REACHED] = IB_EVENT_QP_LAST_WQE_REACHED,
};

/*
 * Whether the sequence numbers say the device restarted (spec 15.2): seq 1
 * after other events, unless 1 is the number that follows (the numbering
 * wrapped through 0). The first event of a new numbering may be an
 * EVENTS_LOST whose range starts at 1 (the first events of the new
 * connection were dropped, spec 14.3): its seq counts as well.
 */
static bool vrdma_seq_restarted(struct vrdma_dev *dev, u32 kind, u32 seq,
				u32 detail)
{
	if (seq == 1 && dev->ev_seen && dev->ev_next != 1)
		return true;
	if (dev->ev_seen && seq != dev->ev_next)
		dev_dbg(&dev->vdev->dev, "event seq %u, expected %u\n", seq,
			dev->ev_next);
	/* EVENTS_LOST takes no number: the lost ones are [seq, seq + detail). */
	dev->ev_next = kind == VIRTIO_RDMA_EV_EVENTS_LOST ? seq + detail :
							    seq + 1;
	dev->ev_seen = true;
	return false;
}

/* One event from the event queue, under the event lock. */
void vrdma_event(struct vrdma_dev *dev, const struct virtio_rdma_event *ev)
{
	u32 kind = le32_to_cpu(ev->kind), handle = le32_to_cpu(ev->handle);
	u32 detail = le32_to_cpu(ev->detail), seq = le32_to_cpu(ev->seq);
	struct vrdma_ib *vib = dev->ib;
	struct vrdma_srq *srq;
	struct vrdma_qp *qp;
	unsigned long i;
	struct vrdma_cq *cq;

	dev_dbg(&dev->vdev->dev, "event %u handle %#x detail %#x seq %u\n",
		kind, handle, detail, seq);
	if (dev->ev_ignore)
		return;
	if (vrdma_seq_restarted(dev, kind, seq, detail)) {
		vrdma_lost_locked(dev, "its events restarted at seq 1: it lost its objects");
		return;
	}

	switch (kind) {
	case VIRTIO_RDMA_EV_CQ_COMPLETION:
	case VIRTIO_RDMA_EV_CQ_ERROR:
		if (vib)
			vrdma_cq_event(vib, kind, handle);
		return;
	case VIRTIO_RDMA_EV_QP_FATAL:
	case VIRTIO_RDMA_EV_QP_REQ_ERROR:
	case VIRTIO_RDMA_EV_QP_ACCESS_ERROR:
	case VIRTIO_RDMA_EV_QP_COMM_EST:
	case VIRTIO_RDMA_EV_QP_SQ_DRAINED:
	case VIRTIO_RDMA_EV_QP_LAST_WQE_REACHED:
		qp = vib ? xa_load(&vib->qps, handle) : NULL;
		/* Only a QP with an SRQ has a last WQE (spec 14.2). */
		if (qp && (kind != VIRTIO_RDMA_EV_QP_LAST_WQE_REACHED ||
			   qp->ibqp.srq))
			vrdma_qp_dispatch(vib, qp, vrdma_qp_events[kind]);
		return;
	case VIRTIO_RDMA_EV_SRQ_LIMIT_REACHED:
	case VIRTIO_RDMA_EV_SRQ_ERROR:
		srq = vib ? xa_load(&vib->srqs, handle) : NULL;
		if (srq)
			vrdma_srq_dispatch(vib, srq,
					   kind == VIRTIO_RDMA_EV_SRQ_ERROR ?
					   IB_EVENT_SRQ_ERR :
					   IB_EVENT_SRQ_LIMIT_REACHED);
		return;
	case VIRTIO_RDMA_EV_PORT_ACTIVE:
	case VIRTIO_RDMA_EV_PORT_ERROR:
	case VIRTIO_RDMA_EV_GID_CHANGE:
		if (handle != VRDMA_PORT_NUM)
			break;
		if (kind == VIRTIO_RDMA_EV_GID_CHANGE) {
			struct ib_event gev = {
				.event = IB_EVENT_GID_CHANGE,
				.element.port_num = VRDMA_PORT_NUM,
			};

			dev_info(&dev->vdev->dev,
				 "the device's GID table changed; the driver keeps the one it read at registration\n");
			if (vib) {
				gev.device = &vib->ibdev;
				ib_dispatch_event(&gev);
			}
			return;
		}
		vrdma_port_event(dev, kind == VIRTIO_RDMA_EV_PORT_ACTIVE ?
				 IB_PORT_ACTIVE : IB_PORT_DOWN);
		return;
	case VIRTIO_RDMA_EV_DEVICE_FATAL:
		if (handle)
			break;
		vrdma_lost_locked(dev, "the device reported DEVICE_FATAL");
		return;
	case VIRTIO_RDMA_EV_EVENTS_LOST:
		if (handle)
			break;
		dev_warn_ratelimited(&dev->vdev->dev,
				     "%u events lost (from seq %u): re-reading the port, QPs and SRQs\n",
				     detail, seq);
		/* A lost CQ_COMPLETION must not leave a waiter asleep. */
		if (vib) {
			xa_for_each(&vib->cqs, i, cq)
				if (cq->ibcq.comp_handler)
					cq->ibcq.comp_handler(&cq->ibcq,
							      cq->ibcq.cq_context);
		}
		if (!dev->removing)
			queue_work(system_long_wq, &dev->requery_work);
		return;
	default:
		break;
	}
	dev_warn_ratelimited(&dev->vdev->dev,
			     "ignoring event %u with handle %#x\n", kind,
			     handle);
}

/*
 * The next live object of @xa at or after *@index, by handle, or 0: the
 * caller queries the device by handle, without holding the object, and
 * looks it up again before it reports anything.
 */
static bool vrdma_next_handle(struct vrdma_dev *dev, struct xarray *xa,
			      unsigned long *index)
{
	bool found;

	spin_lock_irq(&dev->event_lock);
	found = xa_find(xa, index, U32_MAX, XA_PRESENT);
	spin_unlock_irq(&dev->event_lock);
	return found;
}

static void vrdma_requery_port(struct vrdma_dev *dev)
{
	struct virtio_rdma_query_port_req req = {
		.port = cpu_to_le32(VRDMA_PORT_NUM),
	};
	struct virtio_rdma_port_attr port;
	enum ib_port_state state;

	if (vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_PORT, &req, sizeof(req),
			   &port, sizeof(port)))
		return;
	state = le32_to_cpu(port.state) == VRDMA_PORT_STATE_ACTIVE ? IB_PORT_ACTIVE :
							     IB_PORT_DOWN;
	spin_lock_irq(&dev->event_lock);
	if (!dev->ev_ignore && state != dev->port_state)
		vrdma_port_event(dev, state);
	spin_unlock_irq(&dev->event_lock);
}

/*
 * A QP the device has in ERR that the driver neither moved there nor
 * reported an error for lost its event: report QP_FATAL.
 */
static void vrdma_requery_qps(struct vrdma_dev *dev, struct vrdma_ib *vib)
{
	struct virtio_rdma_query_qp_resp resp;
	struct virtio_rdma_qp_handle_req req;
	unsigned long index = 0;
	struct vrdma_qp *qp;

	for (; vrdma_next_handle(dev, &vib->qps, &index); index++) {
		req.qp_handle = cpu_to_le32(index);
		if (vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_QP, &req,
				   sizeof(req), &resp, sizeof(resp)) ||
		    le32_to_cpu(resp.attr.qp_state) != VIRTIO_RDMA_QPS_ERR)
			continue;
		spin_lock_irq(&dev->event_lock);
		qp = xa_load(&vib->qps, index);
		if (qp && !dev->ev_ignore && !qp->err_reported &&
		    READ_ONCE(qp->state) != IB_QPS_ERR)
			vrdma_qp_dispatch(vib, qp, IB_EVENT_QP_FATAL);
		spin_unlock_irq(&dev->event_lock);
	}
}

/* An armed SRQ limit the device reads as 0 fired: report it. */
static void vrdma_requery_srqs(struct vrdma_dev *dev, struct vrdma_ib *vib)
{
	struct virtio_rdma_srq_handle_req req;
	struct virtio_rdma_query_srq_resp resp;
	unsigned long index = 0;
	struct vrdma_srq *srq;

	for (; vrdma_next_handle(dev, &vib->srqs, &index); index++) {
		req.srq_handle = cpu_to_le32(index);
		if (vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_SRQ, &req,
				   sizeof(req), &resp, sizeof(resp)) ||
		    resp.limit)
			continue;
		spin_lock_irq(&dev->event_lock);
		srq = xa_load(&vib->srqs, index);
		if (srq && !dev->ev_ignore && READ_ONCE(srq->limit_armed))
			vrdma_srq_dispatch(vib, srq,
					   IB_EVENT_SRQ_LIMIT_REACHED);
		spin_unlock_irq(&dev->event_lock);
	}
}

/*
 * After EVENTS_LOST (spec 14.3): the port's state, QPs that failed and
 * SRQ limits that fired are read from the device again and reported as
 * their events would have. A lost CQ_ERROR shows as the QP_FATAL of the
 * CQ's QPs, a lost COMM_EST or SQ_DRAINED is not recovered (neither
 * changes what the consumer may do), and CQ waiters were woken in the
 * interrupt. The reset and remove paths cancel this work, and
 * unregistering the verbs device waits for it, before the verbs device
 * goes away.
 */
void vrdma_requery_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev,
					     requery_work);
	struct vrdma_ib *vib;

	/* Unregistering the verbs device waits for this work to finish. */
	spin_lock_irq(&dev->event_lock);
	vib = dev->ib;
	spin_unlock_irq(&dev->event_lock);
	vrdma_requery_port(dev);
	if (!vib)
		return;
	vrdma_requery_qps(dev, vib);
	vrdma_requery_srqs(dev, vib);
}
