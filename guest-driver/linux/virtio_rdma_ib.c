// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * virtio-rdma: the verbs device (ib_device) over the control queue.
 *
 * The port is a RoCEv2 port paired with the guest network interface whose
 * permanent MAC address the device reports (spec appendix A). The verbs
 * device is registered while that interface exists: at the start, or when
 * the interface appears later (a netdev notifier), and it is unregistered
 * when the interface goes away (vrdma_pair). ib_core builds the GID table
 * from that interface's IP addresses and its link-local default GID; the
 * driver accepts only the GIDs the device's own table holds and remembers
 * the device's index for each (add_gid). A version 3 device has the
 * default GID at its index 0 too (docs/abi-v3-design.md section 3).
 *
 * Kernel consumers (ib_mad, ib_cm, rdma_cm, NVMe over Fabrics) get verbs
 * objects with F_MEM_MGT, in a context of the driver's own, and a GSI QP
 * with F_GSI (virtio_rdma_kq.c and the files on top of it).
 */

#include <linux/etherdevice.h>
#include <linux/if_arp.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <net/net_namespace.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "virtio_rdma.h"
#include "compat.h"
#include "uapi/virtio_rdma-abi.h"

/*
 * A GUID of the device (spec 12.1) as ib_core keeps it: the 64-bit value,
 * an EUI-64 whose first octet is the most significant byte, big-endian.
 */
static __be64 vrdma_guid(__le64 guid)
{
	return cpu_to_be64(le64_to_cpu(guid));
}

/* The prefix of the link-local default GID (docs/abi-v3-design.md 3). */
#define VRDMA_LINK_LOCAL_PREFIX 0xfe80000000000000ULL

/*
 * Whether the device's entry 0 is the default GID (fe80::/64), as version 3
 * has it, which is ib_core's default GID too (slot 0).
 */
static bool vrdma_has_default_gid(const struct vrdma_ib *vib)
{
	return vib->num_gids && vib->gids[0].global.subnet_prefix ==
				cpu_to_be64(VRDMA_LINK_LOCAL_PREFIX);
}

/* The number of device GIDs the driver reads and maps (vrdma_query_gids). */
static unsigned int vrdma_num_gids(struct vrdma_dev *dev)
{
	return min_t(u32, le32_to_cpu(dev->port.gid_tbl_len), VRDMA_MAX_GIDS);
}

static int vrdma_query_device(struct ib_device *ibdev,
			      struct ib_device_attr *props,
			      struct ib_udata *uhw)
{
	struct virtio_device *vdev = to_vib(ibdev)->dev->vdev;
	struct virtio_rdma_device_attr *a = &to_vib(ibdev)->dev->attr;

	if (uhw->inlen || uhw->outlen)
		return -EINVAL;
	memset(props, 0, sizeof(*props));
	props->fw_ver = le64_to_cpu(a->fw_version);
	props->sys_image_guid = vrdma_guid(a->sys_image_guid);
	props->max_mr_size = le64_to_cpu(a->max_mr_size);
	props->page_size_cap = le64_to_cpu(a->page_size_cap);
	props->vendor_id = le32_to_cpu(a->vendor_id);
	props->vendor_part_id = le32_to_cpu(a->vendor_part_id);
	props->hw_ver = le32_to_cpu(a->hw_version);
	props->max_qp = le32_to_cpu(a->max_qp);
	props->max_qp_wr = le32_to_cpu(a->max_qp_wr);
	props->max_send_sge = le32_to_cpu(a->max_send_sge);
	props->max_recv_sge = le32_to_cpu(a->max_recv_sge);
	props->max_sge_rd = le32_to_cpu(a->max_send_sge);
	props->max_cq = le32_to_cpu(a->max_cq);
	props->max_cqe = le32_to_cpu(a->max_cqe);
	props->max_mr = le32_to_cpu(a->max_mr);
	props->max_pd = le32_to_cpu(a->max_pd);
	props->max_qp_rd_atom = le32_to_cpu(a->max_qp_rd_atom);
	props->max_qp_init_rd_atom = le32_to_cpu(a->max_qp_init_rd_atom);
	props->max_res_rd_atom = props->max_qp * props->max_qp_rd_atom;
	props->max_srq = le32_to_cpu(a->max_srq);
	props->max_srq_wr = le32_to_cpu(a->max_srq_wr);
	props->max_srq_sge = le32_to_cpu(a->max_recv_sge);
	props->max_ah = le32_to_cpu(a->max_ah);
	props->max_pkeys = 1;
	props->atomic_cap = le32_to_cpu(a->atomic_caps) ? IB_ATOMIC_HCA :
							  IB_ATOMIC_NONE;
	props->local_ca_ack_delay = le32_to_cpu(a->local_ca_ack_delay);
	/*
	 * Without their feature (spec 4; a VMM may offer the guest no device
	 * feature bits at all) SRQs and address handles cannot be created.
	 */
	if (!virtio_has_feature(vdev, VIRTIO_RDMA_F_SRQ)) {
		props->max_srq = 0;
		props->max_srq_wr = 0;
		props->max_srq_sge = 0;
	}
	if (!virtio_has_feature(vdev, VIRTIO_RDMA_F_UD))
		props->max_ah = 0;
	/*
	 * What the device does: RNR NAKs for RC (spec 18.20), CUR_STATE in
	 * MODIFY_QP checked against the QP's state (12.13), PORT_ACTIVE
	 * events (14.2), and a system image GUID when it reports one.
	 */
	props->device_cap_flags = IB_DEVICE_RC_RNR_NAK_GEN |
				  IB_DEVICE_CURR_QP_STATE_MOD |
				  IB_DEVICE_PORT_ACTIVE_EVENT;
	if (props->sys_image_guid)
		props->device_cap_flags |= IB_DEVICE_SYS_IMAGE_GUID;
	/* F_MCAST: the device's limits per instance (spec 12.27). */
	if (virtio_has_feature(vdev, VIRTIO_RDMA_F_MCAST) &&
	    virtio_has_feature(vdev, VIRTIO_RDMA_F_UD)) {
		props->max_mcast_grp = VIRTIO_RDMA_MAX_MCAST_GRP;
		props->max_mcast_qp_attach = VIRTIO_RDMA_MAX_MCAST_QP_ATTACH;
		props->max_total_mcast_qp_attach = VIRTIO_RDMA_MAX_MCAST_GRP *
						   VIRTIO_RDMA_MAX_MCAST_QP_ATTACH;
	}
	/*
	 * F_MW: windows of both types, a type 2 one tied to its QP and PD
	 * (spec 18.29); windows count as MRs against max_mr.
	 */
	if (virtio_has_feature(vdev, VIRTIO_RDMA_F_MW)) {
		props->device_cap_flags |= IB_DEVICE_MEM_WINDOW |
					   IB_DEVICE_MEM_WINDOW_TYPE_2B;
		props->max_mw = props->max_mr;
	}
	/* F_XRC: domains, XRC SRQs, XRC_INI and XRC_TGT QPs (spec 18.11.8). */
	if (virtio_has_feature(vdev, VIRTIO_RDMA_F_XRC) &&
	    virtio_has_feature(vdev, VIRTIO_RDMA_F_SRQ))
		props->device_cap_flags |= IB_DEVICE_XRC;
	/*
	 * F_RESIZE: user CQs, SRQs and MRs (spec 12.19, 12.25, 12.26). Not
	 * RESIZE_MAX_WR: a QP's queues keep their depth (IB_QP_CAP).
	 */
	if (virtio_has_feature(vdev, VIRTIO_RDMA_F_RESIZE) &&
	    virtio_has_feature(vdev, VIRTIO_RDMA_F_SRQ))
		props->device_cap_flags |= IB_DEVICE_SRQ_RESIZE;
	/*
	 * F_MEM_MGT: fast registration and invalidation (spec 18.27), and
	 * the local DMA key in every PD (spec 18.28), which ib_core then
	 * gives kernel PDs instead of asking for a DMA MR.
	 */
	if (to_vib(ibdev)->kverbs) {
		props->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
		props->kernel_cap_flags |= IBK_LOCAL_DMA_LKEY;
		props->max_fast_reg_page_list_len =
			vrdma_max_fast_reg_pages(to_vib(ibdev)->dev);
	}
	return 0;
}

static int vrdma_query_port(struct ib_device *ibdev, u32 port,
			    struct ib_port_attr *props)
{
	struct vrdma_dev *dev = to_vib(ibdev)->dev;
	struct virtio_rdma_port_attr *p = &dev->port;

	/* ib_core zeroes *props before calling. */
	props->state = READ_ONCE(dev->port_state);
	/* As QUERY_PORT pairs them (spec 12.2), also after port events. */
	props->phys_state = props->state == IB_PORT_ACTIVE ?
			    IB_PORT_PHYS_STATE_LINK_UP :
			    IB_PORT_PHYS_STATE_DISABLED;
	props->max_mtu = le32_to_cpu(p->max_mtu);
	props->active_mtu = le32_to_cpu(p->active_mtu);
	props->gid_tbl_len = to_vib(ibdev)->gid_tbl_len;
	props->pkey_tbl_len = 1;
	/* ib_cm's connections through the GSI QP (spec 18.26). */
	if (to_vib(ibdev)->gsi)
		props->port_cap_flags = IB_PORT_CM_SUP;
	props->max_msg_sz = le32_to_cpu(p->max_msg_size);
	props->active_speed = le32_to_cpu(p->active_speed);
	props->active_width = le32_to_cpu(p->active_width);
	/* VL0 only (encoding 1): RoCE has no VLs, and 0 is no valid value. */
	props->max_vl_num = 1;
	props->ip_gids = true;
	return 0;
}

static int vrdma_get_port_immutable(struct ib_device *ibdev, u32 port,
				    struct ib_port_immutable *immutable)
{
	struct ib_port_attr attr;
	int ret;

	ret = ib_query_port(ibdev, port, &attr);
	if (ret)
		return ret;
	/*
	 * RoCEv2. Management datagrams and connection management only with
	 * a GSI QP: without one ib_mad and ib_cm leave the port alone, and
	 * rdma_cm connects nothing on it.
	 */
	immutable->core_cap_flags = to_vib(ibdev)->gsi ?
				    RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP :
				    RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP |
				    RDMA_CORE_CAP_ETH_AH;
	immutable->gid_tbl_len = attr.gid_tbl_len;
	immutable->pkey_tbl_len = attr.pkey_tbl_len;
	/* ib_core wants no MAD size on a port without MADs. */
	immutable->max_mad_size = to_vib(ibdev)->gsi ? IB_MGMT_MAD_SIZE : 0;
	return 0;
}

static enum rdma_link_layer vrdma_get_link_layer(struct ib_device *ibdev,
						 u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			    u16 *pkey)
{
	if (index)
		return -EINVAL;
	*pkey = 0xffff;
	return 0;
}

/*
 * ib_core offers every GID of the paired interface and its default GID;
 * only those the device assigned to this VM are usable (the device sends
 * from no other address). A version 3 device has the default GID at its
 * index 0, which ib_core's slot 0 (its only default slot on a RoCEv2-only
 * port) maps to, and only that slot: ib_core also offers the interface's
 * link-local address, the same GID, as an ordinary one, and puts it into
 * the first free slot after 0 when its address event comes while slot 0
 * holds no default GID for the interface (not yet, or no more: the
 * interface's address changed). Taken there, it would hold the slot the
 * VM's first IP address has (spec appendix A), and that address would get
 * whichever index the order of events left it. Refused, it stays out of
 * ib_core's table until ib_core's default GID events (the interface
 * registered, up, or its address changed) put it into slot 0.
 */
static int vrdma_add_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_ib *vib = to_vib(attr->device);
	unsigned int i;

	if (attr->gid_type != IB_GID_TYPE_ROCE_UDP_ENCAP ||
	    attr->index >= ARRAY_SIZE(vib->gid_map))
		return -EINVAL;
	for (i = 0; i < vib->num_gids; i++) {
		if (memcmp(&vib->gids[i], &attr->gid, sizeof(attr->gid)))
			continue;
		if (!i && attr->index && vrdma_has_default_gid(vib))
			return -EINVAL;
		vib->gid_map[attr->index] = i;
		return 0;
	}
	return -EINVAL;
}

static int vrdma_del_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_ib *vib = to_vib(attr->device);

	if (attr->index < ARRAY_SIZE(vib->gid_map))
		vib->gid_map[attr->index] = VRDMA_NO_GID;
	return 0;
}

static void vrdma_mmap_free(struct rdma_user_mmap_entry *rentry)
{
	struct vrdma_mmap_entry *entry =
		container_of(rentry, struct vrdma_mmap_entry, rdma_entry);

	if (entry->page && !entry->device_owned)
		__free_page(entry->page);
	kfree(entry);
}

static int vrdma_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rentry;
	struct vrdma_mmap_entry *entry;
	int ret;

	rentry = rdma_user_mmap_entry_get(ibuc, vma);
	if (!rentry)
		return -EINVAL;
	entry = container_of(rentry, struct vrdma_mmap_entry, rdma_entry);
	/*
	 * Only the device writes the doorbell header. Without VM_MAYWRITE
	 * ib_core also maps the zero page in its place after a
	 * disassociation. A doorbell page is the process's to write (its
	 * slots); after a disassociation ib_core gives the mapping a page of
	 * its own, so nothing the process writes reaches the device then.
	 * Both are ordinary write-back memory (spec 18.7): the default
	 * protection of a shared mapping.
	 */
	if (entry->page) {
		if (vma->vm_flags & VM_WRITE) {
			ret = -EPERM;
			goto out;
		}
		vrdma_vm_flags_clear(vma, VM_MAYWRITE);
	}
	ret = rdma_user_mmap_io(ibuc, vma, entry->pfn, PAGE_SIZE,
				vma->vm_page_prot, rentry);
out:
	rdma_user_mmap_entry_put(rentry);
	return ret;
}

/* DESTROY_CTX; on a timeout the device may still write the header page. */
static void vrdma_destroy_ctx(struct vrdma_dev *dev, u32 handle,
			      struct vrdma_mmap_entry *header)
{
	struct virtio_rdma_ctx_handle_req req = {
		.ctx_handle = cpu_to_le32(handle),
	};

	if (vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DESTROY_CTX, &req, sizeof(req),
			   NULL, 0) == -ETIMEDOUT)
		header->device_owned = true;
}

/*
 * A context's doorbell page (spec 18.7) as a mapping at the fixed offset
 * VIRTIO_RDMA_MMAP_DB_PAGE, so that a process that imported the context
 * finds it without GET_CONTEXT's answer. 0, or why the context cannot be
 * used.
 */
static int vrdma_ucontext_page(struct vrdma_ucontext *uc, u32 page,
			       u32 req_flags)
{
	struct vrdma_dev *dev = to_vib(uc->ibucontext.device)->dev;
	struct vrdma_mmap_entry *entry;
	int ret;

	ret = vrdma_dbpage_check(dev, page);
	if (ret || page == VIRTIO_RDMA_DB_NONE)
		return ret;
	if (!(req_flags & VIRTIO_RDMA_UCTX_REQ_DB_PAGE)) {
		dev_warn_once(&dev->vdev->dev,
			      "the device uses shared-memory doorbells, which this process's rdma-core provider does not know: update the virtio_rdma provider (or load virtio_rdma with shmem_doorbell=0)\n");
		return -EPROTONOSUPPORT;
	}
	entry = kzalloc(sizeof(*entry), GFP_KERNEL);
	if (!entry)
		return -ENOMEM;
	entry->pfn = vrdma_dbpage_pfn(dev, page);
	ret = rdma_user_mmap_entry_insert_exact(&uc->ibucontext,
						&entry->rdma_entry, PAGE_SIZE,
						VIRTIO_RDMA_MMAP_DB_PAGE >>
						PAGE_SHIFT);
	if (ret) {
		kfree(entry);
		return ret;
	}
	uc->db_page = entry;
	return 0;
}

/*
 * The context's doorbell header lives in a page of its own, which the
 * provider maps read-only to learn whether a post needs the kick (spec
 * 18.6): one page per context, and no guest-physical address leaves the
 * kernel. With a doorbell page the provider maps that page instead.
 */
static int vrdma_alloc_ucontext(struct ib_ucontext *ibuc,
				struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = to_vuc(ibuc);
	struct vrdma_dev *dev = to_vib(ibuc->device)->dev;
	struct virtio_rdma_alloc_ucontext_ureq ureq = {};
	struct virtio_rdma_alloc_ucontext_uresp uresp = {};
	struct virtio_rdma_create_ctx_req req = {};
	struct virtio_rdma_create_ctx_resp resp;
	struct vrdma_mmap_entry *header;
	int ret;

	if (ib_copy_from_udata(&ureq, udata,
			       min_t(size_t, sizeof(ureq), udata->inlen)))
		return -EFAULT;
	if (ureq.flags & ~VIRTIO_RDMA_UCTX_REQ_DB_PAGE || ureq.reserved)
		return -EINVAL;
	header = kzalloc(sizeof(*header), GFP_KERNEL);
	if (!header)
		return -ENOMEM;
	header->page = alloc_page(GFP_KERNEL | __GFP_ZERO);
	if (!header->page) {
		kfree(header);
		return -ENOMEM;
	}
	header->pfn = page_to_pfn(header->page);
	req.db_gpa = cpu_to_le64(page_to_phys(header->page));
	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_CREATE_CTX, &req, sizeof(req),
			     &resp, sizeof(resp));
	if (ret) {
		header->device_owned = ret == -ETIMEDOUT;
		vrdma_mmap_free(&header->rdma_entry);
		return ret;
	}
	uc->handle = le32_to_cpu(resp.ctx_handle);

	ret = vrdma_ucontext_page(uc, le32_to_cpu(resp.doorbell_page),
				  ureq.flags);
	if (ret) {
		vrdma_destroy_ctx(dev, uc->handle, header);
		vrdma_mmap_free(&header->rdma_entry);
		return ret;
	}
	ret = rdma_user_mmap_entry_insert(ibuc, &header->rdma_entry,
					  PAGE_SIZE);
	if (ret) {
		vrdma_destroy_ctx(dev, uc->handle, header);
		vrdma_mmap_free(&header->rdma_entry);
		goto err_page;
	}
	uresp.db_mmap_key = rdma_user_mmap_get_offset(&header->rdma_entry);
	uresp.db_mmap_len = PAGE_SIZE;
	uresp.flags = VIRTIO_RDMA_UCTX_DB_HEADER;
	if (uc->db_page) {
		uresp.flags |= VIRTIO_RDMA_UCTX_DB_PAGE;
		uresp.page_mmap_key =
			rdma_user_mmap_get_offset(&uc->db_page->rdma_entry);
		uresp.page_mmap_len = PAGE_SIZE;
	}
	ret = ib_copy_to_udata(udata, &uresp,
			       min_t(size_t, sizeof(uresp), udata->outlen));
	if (ret) {
		vrdma_destroy_ctx(dev, uc->handle, header);
		rdma_user_mmap_entry_remove(&header->rdma_entry);
		goto err_page;
	}
	uc->db_header = header;
	return 0;

err_page:
	if (uc->db_page)
		rdma_user_mmap_entry_remove(&uc->db_page->rdma_entry);
	uc->db_page = NULL;
	return ret;
}

/*
 * ibv_import_device(): the core answers for the context; the driver adds
 * nothing (the doorbell header's mapping key stays with GET_CONTEXT, and
 * an importing process kicks every post, spec 18.6).
 */
static int vrdma_query_ucontext(struct ib_ucontext *ibuc,
				struct uverbs_attr_bundle *attrs)
{
	return 0;
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *ibuc)
{
	struct vrdma_ucontext *uc = to_vuc(ibuc);

	/*
	 * No process maps the doorbell page any more (spec 18.7): the file
	 * is released, or ib_core zapped the mappings when it disassociated.
	 */
	vrdma_destroy_ctx(to_vib(ibuc->device)->dev, uc->handle, uc->db_header);
	/* The page goes when the last mapping of it does (vrdma_mmap_free). */
	rdma_user_mmap_entry_remove(&uc->db_header->rdma_entry);
	if (uc->db_page)
		rdma_user_mmap_entry_remove(&uc->db_page->rdma_entry);
}

/*
 * Processes map only the doorbell header page, which ib_core itself
 * replaces by the zero page at disassociation, and their doorbell page,
 * which it replaces by a page of its own (vrdma_mmap): once it has
 * destroyed a disassociated context's objects, nothing of the process
 * reaches the device. Having this lets unregistration (at remove or
 * reset) proceed while processes keep their files open.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}

static int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata,
			struct vrdma_ucontext, ibucontext);
	struct vrdma_ib *vib = to_vib(ibpd->device);
	struct virtio_rdma_ctx_handle_req req;
	struct virtio_rdma_pd_handle_resp resp;
	int ret;

	/* Kernel consumers' PDs are the driver's context's, with F_MEM_MGT. */
	if (!uc && !vib->kverbs)
		return -EOPNOTSUPP;
	req.ctx_handle = cpu_to_le32(uc ? uc->handle : vib->kctx_handle);
	ret = vrdma_cmd_exec(to_vib(ibpd->device)->dev, VIRTIO_RDMA_OP_ALLOC_PD,
			     &req, sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	to_vpd(ibpd)->handle = le32_to_cpu(resp.pd_handle);
	return 0;
}

static int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct virtio_rdma_pd_handle_req req = {
		.pd_handle = cpu_to_le32(to_vpd(ibpd)->handle),
	};
	struct vrdma_dev *dev = to_vib(ibpd->device)->dev;
	int ret;

	ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_DEALLOC_PD, &req, sizeof(req),
			     NULL, 0);
	return vrdma_dev_stopped(dev) ? 0 : ret;
}

static const struct ib_device_ops vrdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VIRTIO_RDMA_UVERBS_ABI_VERSION,

	.add_gid = vrdma_add_gid,
	.alloc_mr = vrdma_alloc_mr,
	.alloc_mw = vrdma_alloc_mw,
	.alloc_xrcd = vrdma_alloc_xrcd,
	.attach_mcast = vrdma_attach_mcast,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_ops_create_cq,
	.create_srq = vrdma_create_srq,
	.create_user_ah = vrdma_create_ah,
	.create_qp = vrdma_create_qp,
	.alloc_pd = vrdma_alloc_pd,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_xrcd = vrdma_dealloc_xrcd,
	.dealloc_pd = vrdma_dealloc_pd,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.del_gid = vrdma_del_gid,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.detach_mcast = vrdma_detach_mcast,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.get_dma_mr = vrdma_get_dma_mr,
	.get_link_layer = vrdma_get_link_layer,
	.get_port_immutable = vrdma_get_port_immutable,
	.map_mr_sg = vrdma_map_mr_sg,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.drain_rq = vrdma_drain_rq,
	.drain_sq = vrdma_drain_sq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device = vrdma_query_device,
	.query_pkey = vrdma_query_pkey,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.query_ucontext = vrdma_query_ucontext,
	.reg_user_mr = vrdma_reg_user_mr,
	.rereg_user_mr = vrdma_rereg_user_mr,
	.req_notify_cq = vrdma_req_notify_cq,
	.resize_cq = vrdma_resize_cq,

	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vrdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibucontext),
	INIT_RDMA_OBJ_SIZE(ib_xrcd, vrdma_xrcd, ibxrcd),
};

static int vrdma_query_gids(struct vrdma_ib *vib)
{
	struct vrdma_dev *dev = vib->dev;
	struct virtio_rdma_query_gid_req req = { .port = cpu_to_le32(1) };
	struct virtio_rdma_query_gid_resp resp;
	unsigned int i, n;
	int ret;

	n = vrdma_num_gids(dev);
	for (i = 0; i < n; i++) {
		req.index = cpu_to_le32(i);
		ret = vrdma_cmd_exec(dev, VIRTIO_RDMA_OP_QUERY_GID, &req,
				     sizeof(req), &resp, sizeof(resp));
		if (ret)
			return ret;
		memcpy(&vib->gids[i], resp.gid, sizeof(vib->gids[i]));
	}
	vib->num_gids = n;
	/*
	 * A device with the default GID (fe80::/64) at index 0, as version 3
	 * has it, shares ib_core's slot 0; otherwise ib_core's default GID
	 * takes a slot of its own, and the device's GIDs fit after it.
	 */
	vib->gid_tbl_len = n;
	if (!vrdma_has_default_gid(vib))
		vib->gid_tbl_len++;
	for (i = 0; i < ARRAY_SIZE(vib->gid_map); i++)
		vib->gid_map[i] = VRDMA_NO_GID;
	return 0;
}

/*
 * Registers the verbs device on the paired interface, dev->ndev (ib_lock
 * held).
 */
static int vrdma_register_ib(struct vrdma_dev *dev)
{
	struct net_device *ndev = dev->ndev;
	struct vrdma_ib *vib;
	int ret;

	vib = ib_alloc_device(vrdma_ib, ibdev);
	if (!vib)
		return -ENOMEM;
	vib->dev = dev;
	xa_init_flags(&vib->cqs, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&vib->qps, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&vib->srqs, XA_FLAGS_LOCK_IRQ);
	ret = vrdma_query_gids(vib);
	if (ret)
		goto err_dealloc;
	/*
	 * Kernel consumers' objects belong to a context of the driver's own,
	 * and their work requests need the local DMA key (F_MEM_MGT); on a
	 * device without it, user space alone has verbs, as with version 2.
	 */
	if (virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_MEM_MGT)) {
		ret = vrdma_kctx_create(vib);
		if (ret)
			dev_warn(&dev->vdev->dev,
				 "no context for kernel consumers (%d): user space only\n",
				 ret);
	}
	if (vib->kctx_db) {
		vib->kverbs = true;
		vib->ibdev.local_dma_lkey = le32_to_cpu(dev->attr.local_dma_lkey);
		/* ib_mad's QP 1 sends MADs through address handles. */
		vib->gsi = virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_GSI) &&
			   virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_UD);
	}

	vib->ibdev.node_type = RDMA_NODE_IB_CA;
	vib->ibdev.phys_port_cnt = 1;
	vib->ibdev.num_comp_vectors = 1;
	vib->ibdev.dev.parent = &dev->vdev->dev;
	vib->ibdev.node_guid = vrdma_guid(dev->attr.node_guid);
	ib_set_device_ops(&vib->ibdev, &vrdma_dev_ops);
	/* Not in ib_core's default set: the kicks (vrdma_post_send, ...). */
	vib->ibdev.uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND) |
				      BIT_ULL(IB_USER_VERBS_CMD_POST_SRQ_RECV);
	/*
	 * ib_core takes its own reference to the interface and keeps it
	 * until the verbs device is unregistered, which vrdma_pair() does
	 * when the interface is unregistered.
	 */
	ret = ib_device_set_netdev(&vib->ibdev, ndev, VRDMA_PORT_NUM);
	if (ret)
		goto err_kctx;
	/* No DMA device: ib_core hands out kernel virtual addresses. */
	ret = ib_register_device(&vib->ibdev, "virtio_rdma%d", NULL);
	if (ret)
		goto err_kctx;
	spin_lock_irq(&dev->event_lock);
	dev->ib = vib;
	spin_unlock_irq(&dev->event_lock);
	dev_info(&dev->vdev->dev, "registered %s on %s\n",
		 dev_name(&vib->ibdev.dev), netdev_name(ndev));
	return 0;

err_kctx:
	vrdma_kctx_destroy(vib);
err_dealloc:
	ib_dealloc_device(&vib->ibdev);
	return ret;
}

/*
 * Unregisters the verbs device (ib_lock held): ib_core disassociates the
 * user contexts (IB_EVENT_DEVICE_FATAL to each, their objects destroyed),
 * waits for no process, and drops its reference to the interface.
 */
static void vrdma_unregister_ib(struct vrdma_dev *dev)
{
	struct vrdma_ib *vib = dev->ib;

	lockdep_assert_held(&dev->ib_lock);
	if (!vib)
		return;
	spin_lock_irq(&dev->event_lock);
	dev->ib = NULL;
	spin_unlock_irq(&dev->event_lock);
	/* An EVENTS_LOST re-query that still uses it finishes first. */
	flush_work(&dev->requery_work);
	ib_unregister_device(&vib->ibdev);
	/* Kernel consumers' objects went with the registration. */
	vrdma_kctx_destroy(vib);
	ib_dealloc_device(&vib->ibdev);
}

/* Whether @ndev may be the paired interface (spec appendix A); RTNL held. */
static bool vrdma_netdev_matches(struct vrdma_dev *dev,
				 struct net_device *ndev)
{
	return ndev->type == ARPHRD_ETHER && !is_zero_ether_addr(dev->mac) &&
	       ether_addr_equal(ndev->perm_addr, dev->mac);
}

/*
 * The paired interface, held, or NULL: in any network namespace, the
 * registered Ethernet interface whose permanent address is the device's
 * `mac` and that is stacked on no other (VLAN, macvlan or ipvlan
 * interfaces on top of it can carry the same permanent address). RTNL
 * held, as ib_core's RoCE GID code walks the namespaces.
 */
static struct net_device *vrdma_find_netdev(struct vrdma_dev *dev)
{
	struct net_device *ndev, *found = NULL;
	struct net *net;

	ASSERT_RTNL();
	down_read(&net_rwsem);
	for_each_net(net) {
		for_each_netdev(net, ndev) {
			if (ndev->reg_state == NETREG_REGISTERED &&
			    vrdma_netdev_matches(dev, ndev) &&
			    list_empty(&ndev->adj_list.lower)) {
				found = ndev;
				dev_hold(found);
				goto out;
			}
		}
	}
out:
	up_read(&net_rwsem);
	return found;
}

/*
 * Pairs the port with its interface and keeps the verbs device registered
 * on that interface while the device runs (spec appendix A): registers it
 * once the interface exists (at start, or when it appears later: the
 * netdev notifier), unregisters it when the interface goes away (ib_core
 * holds the interface until then, and its unregistration waits for that)
 * or when another interface becomes the paired one. @start: called when
 * the device started, to say that it waits for the interface.
 */
void vrdma_pair(struct vrdma_dev *dev, bool start)
{
	struct net_device *ndev, *old;
	int ret;

	mutex_lock(&dev->ib_lock);
	rtnl_lock();
	ndev = vrdma_find_netdev(dev);
	old = dev->ndev;
	dev->ndev = ndev;
	rtnl_unlock();
	if (old != ndev && dev->ib) {
		if (ndev)
			dev_info(&dev->vdev->dev,
				 "network interface %s is the paired one now, not %s: unregistering %s\n",
				 netdev_name(ndev), netdev_name(old),
				 dev_name(&dev->ib->ibdev.dev));
		else
			dev_info(&dev->vdev->dev,
				 "network interface %s went away: unregistering %s\n",
				 netdev_name(old), dev_name(&dev->ib->ibdev.dev));
		vrdma_unregister_ib(dev);
	}
	if (old)
		dev_put(old);
	if (!ndev) {
		if (start)
			dev_info(&dev->vdev->dev,
				 "no network interface with permanent address %pM yet: the verbs device is registered when it appears\n",
				 dev->mac);
	} else if (!dev->ib && dev->running && !vrdma_dev_stopped(dev)) {
		ret = vrdma_register_ib(dev);
		if (ret)
			dev_err(&dev->vdev->dev,
				"cannot register the verbs device on %s: %d\n",
				netdev_name(ndev), ret);
	}
	mutex_unlock(&dev->ib_lock);
}

void vrdma_pair_work(struct work_struct *work)
{
	vrdma_pair(container_of(work, struct vrdma_dev, pair_work), false);
}

/*
 * Interfaces appearing and going, in any namespace (RTNL held): a
 * candidate that registers while the port has none, or the paired one
 * unregistering, makes the pairing work look again once RTNL is released
 * (by then the interface's stacking is known, and the verbs device can be
 * registered or unregistered without RTNL). A move to another namespace
 * unregisters and registers the interface again: it stays paired.
 */
int vrdma_netdev_event(struct notifier_block *nb, unsigned long event,
		       void *ptr)
{
	struct vrdma_dev *dev = container_of(nb, struct vrdma_dev, netdev_nb);
	struct net_device *ndev = netdev_notifier_info_to_dev(ptr);

	switch (event) {
	case NETDEV_REGISTER:
		if (!dev->ndev && vrdma_netdev_matches(dev, ndev))
			queue_work(system_long_wq, &dev->pair_work);
		break;
	case NETDEV_UNREGISTER:
		if (ndev == dev->ndev)
			queue_work(system_long_wq, &dev->pair_work);
		break;
	default:
		break;
	}
	return NOTIFY_DONE;
}

/*
 * The device stops (reset, remove): no verbs device is registered until
 * vrdma_start() and vrdma_pair() again, the current one is unregistered,
 * and the interface is let go.
 */
void vrdma_ib_down(struct vrdma_dev *dev)
{
	struct net_device *ndev;

	mutex_lock(&dev->ib_lock);
	dev->running = false;
	vrdma_unregister_ib(dev);
	rtnl_lock();
	ndev = dev->ndev;
	dev->ndev = NULL;
	rtnl_unlock();
	if (ndev)
		dev_put(ndev);
	mutex_unlock(&dev->ib_lock);
}
