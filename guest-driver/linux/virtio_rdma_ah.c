// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: address vectors and address handles (CREATE_AH, DESTROY_AH,
 * spec 12.16, 12.17).
 *
 * ib_cm and ib_mad create address handles in atomic context (without
 * RDMA_CREATE_AH_SLEEPABLE: from timers, receive handlers, under
 * spinlocks) and destroy them there too, while the device's address handle
 * is a control command. Such a create polls the control queue for its
 * answer (vrdma_cmd_exec_atomic()), and such a destroy sends its command
 * without waiting (vrdma_cmd_post()): the device executes commands in
 * order, so nothing sent later finds the handle alive.
 */

#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "uapi/virtio_rdma-abi.h"

/*
 * A verbs address to the device's (spec 12.13): RoCE needs the GRH, and the
 * source GID index is ib_core's, mapped to the device's own table.
 */
int vrdma_av(struct vrdma_ib *vib, const struct rdma_ah_attr *ah,
	     struct virtio_rdma_address_vector *av)
{
	const struct ib_global_route *grh = rdma_ah_read_grh(ah);
	u8 index;

	if (!(rdma_ah_get_ah_flags(ah) & IB_AH_GRH) ||
	    grh->sgid_index >= ARRAY_SIZE(vib->gid_map))
		return -EINVAL;
	index = READ_ONCE(vib->gid_map[grh->sgid_index]);
	if (index == VRDMA_NO_GID)
		return -EINVAL;
	memcpy(av->dgid, grh->dgid.raw, sizeof(av->dgid));
	av->flow_label = cpu_to_le32(grh->flow_label);
	av->sgid_index = index;
	av->hop_limit = grh->hop_limit;
	av->traffic_class = grh->traffic_class;
	av->sl = rdma_ah_get_sl(ah);
	return 0;
}

int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
		    struct ib_udata *udata)
{
	struct vrdma_ib *vib = to_vib(ibah->device);
	struct virtio_rdma_create_ah_uresp uresp = {};
	struct virtio_rdma_create_ah_req req = {};
	struct virtio_rdma_ah_handle_resp resp;
	int ret;

	/* A kernel consumer's AH is for a kernel QP: F_MEM_MGT too. */
	if (!udata && !vib->kverbs)
		return -EOPNOTSUPP;
	ret = vrdma_av(vib, init->ah_attr, &req.av);
	if (ret)
		return ret;
	req.pd_handle = cpu_to_le32(to_vpd(ibah->pd)->handle);
	req.port = cpu_to_le32(VRDMA_PORT_NUM);
	if (init->flags & RDMA_CREATE_AH_SLEEPABLE)
		ret = vrdma_cmd_exec(vib->dev, VIRTIO_RDMA_OP_CREATE_AH, &req,
				     sizeof(req), &resp, sizeof(resp));
	else
		ret = vrdma_cmd_exec_atomic(vib->dev, VIRTIO_RDMA_OP_CREATE_AH,
					    &req, sizeof(req), &resp,
					    sizeof(resp));
	if (ret)
		return ret;
	to_vah(ibah)->handle = le32_to_cpu(resp.ah_handle);
	if (!udata)
		return 0;
	uresp.ah_handle = to_vah(ibah)->handle;
	ret = ib_copy_to_udata(udata, &uresp, min(udata->outlen, sizeof(uresp)));
	if (ret)
		vrdma_destroy_ah(ibah, RDMA_DESTROY_AH_SLEEPABLE);
	return ret;
}

int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	struct virtio_rdma_ah_handle_req req = {
		.ah_handle = cpu_to_le32(to_vah(ibah)->handle),
	};
	struct vrdma_dev *dev = to_vib(ibah->device)->dev;
	int ret;

	if (flags & RDMA_DESTROY_AH_SLEEPABLE)
		ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_AH, &req,
				     sizeof(req), NULL, 0);
	else
		ret = vrdma_cmd_post(dev, VIRTIO_RDMA_OP_DESTROY_AH, &req,
				     sizeof(req));
	return vrdma_dev_stopped(dev) ? 0 : ret;
}
