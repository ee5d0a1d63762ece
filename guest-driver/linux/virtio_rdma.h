/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * virtio-rdma: Linux guest driver for the virtio RDMA device (ID 42).
 */
#ifndef _VIRTIO_RDMA_H
#define _VIRTIO_RDMA_H

#include <linux/if_ether.h>
#include <linux/mutex.h>
#include <linux/notifier.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

#include "virtio_rdma_abi.h"
#include "compat.h"

/* Event buffers kept on the event queue. */
#define VRDMA_EVENT_BUFS 64
/* Device GIDs the driver keeps (the reference device has one). */
#define VRDMA_MAX_GIDS 16
#define VRDMA_NO_GID 0xff
/* Entries of the page array of a REG_MR work request (spec 18.27). */
#define VRDMA_MAX_FAST_REG_PAGES (VIRTIO_RDMA_LIST_PAGE_SIZE / sizeof(__le64))
/* The device's one port (PORT_NUM), and its state "active" (spec 12.2). */
#define VRDMA_PORT_NUM 1
#define VRDMA_PORT_STATE_ACTIVE 4

struct vrdma_ib;

struct vrdma_dev {
	struct virtio_device *vdev;
	struct virtqueue *ctrlq;
	struct virtqueue *eventq;
	struct virtqueue *notifyq;
	/* The queues exist (between find_vqs and del_vqs). */
	bool vqs_ready;
	/* Serialises adding to, kicking and taking back the control queue. */
	spinlock_t ctrl_lock;
	u64 next_request_id;
	/* ctrl_lock: no command is sent (the device is being reset). */
	bool broken;
	/*
	 * The driver reset the device and it has not been started again: the
	 * device destroyed every object and accesses no guest memory any more
	 * (spec 15.1), so objects may release their memory without a command.
	 */
	bool stopped;
	/* Event buffers, device-writable. */
	struct virtio_rdma_event *events;
	/*
	 * Serialises taking and re-posting event buffers with the handling of
	 * events and the destruction of the objects they name.
	 */
	spinlock_t event_lock;
	/* event_lock: events are dropped (a reset is coming or under way). */
	bool ev_ignore;
	/* event_lock: an event arrived since the start; the next seq. */
	bool ev_seen;
	u32 ev_next;
	/* event_lock: the device is going away: no work is queued any more. */
	bool removing;
	/* event_lock: probe has finished; a reset asked for before waits. */
	bool probed;
	bool reset_deferred;
	/* Why the device is reset (for the log). */
	const char *reset_reason;
	/* Resets the device and registers the verbs device again. */
	struct work_struct reset_work;
	/* Re-reads the state whose events were lost (EVENTS_LOST). */
	struct work_struct requery_work;
	struct virtio_rdma_device_config config;
	struct virtio_rdma_device_attr attr;
	struct virtio_rdma_port_attr port;
	/* event_lock: the port's state, IB_PORT_ACTIVE or IB_PORT_DOWN. */
	enum ib_port_state port_state;
	/*
	 * The registered verbs device, once there is one: set under ib_lock
	 * and event_lock.
	 */
	struct vrdma_ib *ib;
	/*
	 * Serialises registering and unregistering the verbs device (probe,
	 * the reset work, the pairing work, remove).
	 */
	struct mutex ib_lock;
	/* ib_lock: the device is started; a verbs device may be registered. */
	bool running;
	/*
	 * F_SHMEM_DOORBELL: the doorbell region (spec 18.7), guest-physical;
	 * dbr_len 0 without the feature. A context's page is mapped only
	 * where it is used: the kernel context's here, a process's into it.
	 */
	phys_addr_t dbr_addr;
	u64 dbr_len;
	/* RTNL: the paired interface's permanent address (DeviceConfig.mac). */
	u8 mac[ETH_ALEN];
	/* RTNL and ib_lock to change: the paired interface, held. */
	struct net_device *ndev;
	/* Interfaces appearing and going (vrdma_netdev_event). */
	struct notifier_block netdev_nb;
	/* Pairs the port with its interface again (vrdma_pair). */
	struct work_struct pair_work;
};

/* The largest max_num_sg of ALLOC_MR (spec 12.22) the driver allows. */
static inline u32 vrdma_max_fast_reg_pages(struct vrdma_dev *dev)
{
	return min_t(u32, le32_to_cpu(dev->attr.max_fast_reg_pages),
		     VRDMA_MAX_FAST_REG_PAGES);
}

struct vrdma_ib {
	struct ib_device ibdev;
	struct vrdma_dev *dev;
	/* The device's GID table (QUERY_GID at registration). */
	union ib_gid gids[VRDMA_MAX_GIDS];
	unsigned int num_gids;
	/*
	 * ib_core's GID table: the device's, or one slot more when the
	 * device has no link-local default GID at its index 0 (ABI version
	 * 2's table), for the one ib_core puts into its slot 0.
	 */
	unsigned int gid_tbl_len;
	/* ib_core's GID index to the device's, or VRDMA_NO_GID. */
	u8 gid_map[VRDMA_MAX_GIDS + 1];
	/*
	 * CQs, QPs and SRQs by device handle, for the events that name them:
	 * removed under dev->event_lock before they are destroyed.
	 */
	struct xarray cqs;
	struct xarray qps;
	struct xarray srqs;
	/*
	 * Kernel consumers may create objects: F_MEM_MGT, whose local DMA key
	 * their work requests need, is negotiated, and the driver's own
	 * context exists (virtio_rdma_kq.c).
	 */
	bool kverbs;
	/* And the port has a GSI QP for ib_mad and ib_cm: F_GSI, F_UD too. */
	bool gsi;
	/* The driver's context for kernel consumers, and its doorbell header. */
	u32 kctx_handle;
	struct virtio_rdma_ctx_doorbell *kctx_db;
	/*
	 * And its doorbell page, if the device gave it one (spec 18.7),
	 * mapped write-back: its header replaces kctx_db's, and the kernel
	 * QPs' producer indices go into their slots of it.
	 */
	void *kctx_page;
};

struct vrdma_ucontext {
	struct ib_ucontext ibucontext;
	u32 handle;
	/* The page of the context's doorbell header (CreateCtxReq.db_gpa). */
	struct vrdma_mmap_entry *db_header;
	/* Its doorbell page in the doorbell region, or NULL (spec 18.7). */
	struct vrdma_mmap_entry *db_page;
};

/*
 * A page that user space may map (vrdma_mmap): kernel memory the device
 * writes (@page, mapped read-only), or a page of the doorbell region
 * (@page NULL, mapped read-write).
 */
struct vrdma_mmap_entry {
	struct rdma_user_mmap_entry rdma_entry;
	struct page *page;
	unsigned long pfn;
	/* Still named by the device (a destroy command failed): never free. */
	bool device_owned;
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 handle;
};

/* A queue's ring buffer and doorbell record, pinned in the owner's memory. */
struct vrdma_queue {
	struct ib_umem *buf;
	struct ib_umem *db;
};

struct vrdma_cq {
	struct ib_cq ibcq;
	u32 handle;
	u32 depth;
	/* A user space CQ's ring and record, pinned. */
	struct vrdma_queue q;
	/* A kernel consumer's CQ (virtio_rdma_kcq.c): */
	bool kernel;
	/* Serialises polling and arming, and kernel QPs leaving @qps. */
	spinlock_t lock;
	struct virtio_rdma_cqe *ring;
	struct virtio_rdma_cq_doorbell *db;
	/* lock: CQEs consumed. */
	u32 ci;
	/* The kernel QPs that complete here, by QP number. */
	struct xarray qps;
};

static inline struct vrdma_cq *to_vcq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, ibcq);
}

/* A kernel QP's send or receive ring (spec 18.3, 18.5). */
struct vrdma_kwq {
	/* Serialises posting. */
	spinlock_t lock;
	u8 *slots;
	u32 depth;
	u32 wqe_shift;
	u32 max_sge;
	/* lock: WQEs posted (the producer index). */
	u32 pi;
	/*
	 * The consumer's wr_id of each WQE, by its ring index (the device's
	 * wr_id) masked with wr_id_mask: at least as many entries as the
	 * consumer may have outstanding.
	 */
	u64 *wr_id;
	u32 wr_id_mask;
	/* The ring's indices in the QP's doorbell record. */
	__le32 *pi_db;
	const __le32 *ci_db;
	/*
	 * The poll of the queue's CQ (its lock): the index after the last WQE
	 * a CQE completed; WQEs from here on are flushed in software once the
	 * device is stopped (vrdma_kcq_flush()).
	 */
	u32 done;
	/* lock: the drain marker completed in software after the WQEs. */
	struct ib_cqe *drain;
};

/* Receive WQEs of a GSI QP waiting for room in its ring (rq lock). */
struct vrdma_backlog {
	/* Encoded WQEs of the ring's stride, and their consumer's wr_ids. */
	u8 *wqes;
	u64 *wr_id;
	/* Entries (a power of 2, or 0: no backlog); free-running indices. */
	u32 depth;
	u32 head;
	u32 tail;
};

struct vrdma_qp {
	struct ib_qp ibqp;
	u32 handle;
	/* A user space QP's buffer and record, pinned. */
	struct vrdma_queue q;
	/* The state modify_qp last moved the QP to. */
	enum ib_qp_state state;
	/* An error event was reported since the QP left RESET. */
	bool err_reported;
	/* Created with IB_SIGNAL_ALL_WR (CREATE_QP's QP_FLAG_SIG_ALL). */
	bool sig_all;
	/* An XRC_TGT QP (virtio_rdma_xrc.c): no rings. */
	bool tgt;
	/* A kernel consumer's QP (virtio_rdma_kqp.c): */
	bool kernel;
	void *buf;
	size_t buf_len;
	u32 rq_offset;
	struct virtio_rdma_qp_doorbell *db;
	struct vrdma_kwq sq;
	struct vrdma_kwq rq;
	u32 max_inline;
	struct vrdma_backlog backlog;
};

static inline struct vrdma_qp *to_vqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, ibqp);
}

struct vrdma_srq {
	struct ib_srq ibsrq;
	u32 handle;
	struct vrdma_queue q;
	/* The limit is armed and its event not reported yet. */
	bool limit_armed;
};

static inline struct vrdma_srq *to_vsrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, ibsrq);
}

struct vrdma_ah {
	struct ib_ah ibah;
	u32 handle;
};

static inline struct vrdma_ah *to_vah(struct ib_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibah);
}

struct vrdma_mr {
	struct ib_mr ibmr;
	/* REG_MR: the user memory, pinned. */
	struct ib_umem *umem;
	u32 handle;
	/*
	 * ALLOC_MR: the page array of the next REG_MR work request, a page of
	 * guest RAM (ib_map_mr_sg(), spec 18.27), its used and usable entries.
	 */
	__le64 *pages;
	u32 npages;
	u32 max_pages;
	/* get_dma_mr: the local DMA key, no device object (spec 18.28). */
	bool dma;
	/* REG_MR: the IB access flags, which a re-registration pins with. */
	int access;
};

/* A memory window: the device's handle, which BIND_MW names (spec 18.29). */
struct vrdma_mw {
	struct ib_mw ibmw;
	u32 handle;
};

static inline struct vrdma_mw *to_vmw(struct ib_mw *ibmw)
{
	return container_of(ibmw, struct vrdma_mw, ibmw);
}

/* An XRC domain (F_XRC, spec 12.28): the device's handle. */
struct vrdma_xrcd {
	struct ib_xrcd ibxrcd;
	u32 handle;
};

static inline struct vrdma_xrcd *to_vxrcd(struct ib_xrcd *ibxrcd)
{
	return container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);
}

static inline struct vrdma_mr *to_vmr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct vrdma_mr, ibmr);
}

static inline struct vrdma_ib *to_vib(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vrdma_ib, ibdev);
}

static inline struct vrdma_ucontext *to_vuc(struct ib_ucontext *ibuc)
{
	return container_of(ibuc, struct vrdma_ucontext, ibucontext);
}

static inline struct vrdma_pd *to_vpd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibpd);
}

/*
 * The functions of each file, from the bottom layer up: a file calls only
 * those listed before its own.
 */

/* virtio_rdma_cmd.c: the control queue's commands */
void vrdma_ctrl_done(struct virtqueue *vq);
void vrdma_ctrl_stop(struct vrdma_dev *dev);
bool vrdma_dev_stopped(struct vrdma_dev *dev);
int vrdma_cmd_exec(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len, void *resp, size_t resp_len);
int vrdma_cmd_exec_atomic(struct vrdma_dev *dev, u32 opcode, const void *req,
			  size_t req_len, void *resp, size_t resp_len);
int vrdma_cmd_post(struct vrdma_dev *dev, u32 opcode, const void *req,
		   size_t req_len);
void vrdma_queue_reset_locked(struct vrdma_dev *dev, const char *why);

/* virtio_rdma_umem.c: page lists and pinned queues */
struct ib_umem;
void vrdma_free_list_pages(__le64 *tail, size_t nlist);
void *vrdma_list_alloc(struct vrdma_dev *dev, size_t npages, size_t fixed_len,
		       struct virtio_rdma_buffer_desc *buf, size_t *req_len,
		       size_t *nlist_out);
void vrdma_list_set(void *req, size_t fixed_len, size_t nlist, size_t i,
		    u64 gpa);
void *vrdma_page_list(struct vrdma_dev *dev, struct ib_umem *umem,
		      unsigned long pgsz, size_t fixed_len,
		      struct virtio_rdma_buffer_desc *buf, size_t *req_len,
		      size_t *nlist);
int vrdma_exec_list(struct vrdma_dev *dev, u32 opcode, void *req,
		    size_t fixed_len, size_t req_len, size_t nlist, void *resp,
		    size_t resp_len);
int vrdma_pin_queue(struct ib_device *ibdev, u64 buf_va, size_t buf_len,
		    u64 db_va, struct vrdma_queue *q, u64 *db_gpa);
void vrdma_release_queue(struct vrdma_queue *q);

/* virtio_rdma_dbpage.c: the shared-memory doorbell mode (spec 18.7) */
void vrdma_dbpage_validate(struct virtio_device *vdev);
int vrdma_dbpage_start(struct vrdma_dev *dev);
int vrdma_dbpage_check(struct vrdma_dev *dev, u32 page);
unsigned long vrdma_dbpage_pfn(struct vrdma_dev *dev, u32 page);
int vrdma_dbslot_check(bool has_page, u32 slot);
bool vrdma_udata_has_page(struct ib_udata *udata);
void *vrdma_dbpage_map(struct vrdma_dev *dev, u32 page);
__le32 *vrdma_dbslot(void *page, u32 slot);

/* virtio_rdma_kq.c: the kernel context, rings in kernel memory, the kick */
int vrdma_kctx_create(struct vrdma_ib *vib);
void vrdma_kctx_destroy(struct vrdma_ib *vib);
void vrdma_kick(struct vrdma_ib *vib);
void *vrdma_kring_alloc(size_t len);
void vrdma_kring_free(void *ring);
void *vrdma_kring_list(struct vrdma_dev *dev, void *ring, size_t len,
		       size_t fixed_len, struct virtio_rdma_buffer_desc *buf,
		       size_t *req_len, size_t *nlist);
void *vrdma_kdb_alloc(void);
int vrdma_kva_to_gpa(u64 addr, u32 len, u64 *gpa);

/* IB_UVERBS_ACCESS_FLUSH_GLOBAL and _PERSISTENT (uapi since 6.2). */
#define VRDMA_ACCESS_FLUSH (BIT(8) | BIT(9))

/* virtio_rdma_mr.c */
int vrdma_access(int ib_access, u32 *access);
struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int ib_access,
				struct ib_udata *udata);
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int ib_access);
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg);
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset);
int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);

/* virtio_rdma_mw.c */
int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int vrdma_dealloc_mw(struct ib_mw *ibmw);

/* virtio_rdma_kqp.c: kernel QPs and their work requests */
void *vrdma_kqp_alloc(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
		      size_t fixed_len, struct virtio_rdma_buffer_desc *buf,
		      size_t *req_len, size_t *nlist);
int vrdma_kqp_check(struct vrdma_ib *vib, struct vrdma_qp *qp,
		    const struct virtio_rdma_create_qp_resp *resp);
void vrdma_kqp_free(struct vrdma_qp *qp);
int vrdma_kqp_attach(struct vrdma_qp *qp);
void vrdma_kqp_detach(struct vrdma_qp *qp);
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr);
void vrdma_kqp_refill(struct vrdma_qp *qp);
void vrdma_kqp_reset(struct vrdma_qp *qp);
int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr);

/* virtio_rdma_kcq.c: kernel CQs, polled and armed */
int vrdma_kcq_alloc(struct vrdma_cq *cq, u32 cqe, u32 max_cqe);
void vrdma_kcq_free(struct vrdma_cq *cq);
int vrdma_poll_cq(struct ib_cq *ibcq, int n, struct ib_wc *wc);
void vrdma_kcq_kick(struct ib_cq *ibcq);
void vrdma_drain_sq(struct ib_qp *ibqp);
void vrdma_drain_rq(struct ib_qp *ibqp);
int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);

/* virtio_rdma_cq.c */
int vrdma_ops_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
			VRDMA_CREATE_CQ_ATTRS *attrs);
int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);

/* virtio_rdma_ah.c: address vectors and handles */
int vrdma_av(struct vrdma_ib *vib, const struct rdma_ah_attr *ah,
	     struct virtio_rdma_address_vector *av);
int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
		    struct ib_udata *udata);
int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags);

/* virtio_rdma_xrc.c */
int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata);
int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata);
int vrdma_xrc_srq_req(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		      struct virtio_rdma_create_xrc_srq_req *req);
int vrdma_create_tgt_qp(struct vrdma_qp *qp, struct ib_qp_init_attr *init);

/* virtio_rdma_qp.c */
int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata);
int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		    struct ib_udata *udata);
int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init);
int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);

/* virtio_rdma_mcast.c */
int vrdma_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);
int vrdma_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);
/* virtio_rdma_resize.c */
int vrdma_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata);
int vrdma_resize_srq(struct vrdma_srq *srq, const struct ib_srq_attr *attr,
		     u32 dev_mask, struct ib_udata *udata);
struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				  u64 length, u64 virt_addr, int ib_access,
				  struct ib_pd *ibpd, struct ib_udata *udata);

/* virtio_rdma_srq.c */
int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata);
int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata);
int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr);

/* virtio_rdma_event.c */
void vrdma_event(struct vrdma_dev *dev, const struct virtio_rdma_event *ev);
void vrdma_requery_work(struct work_struct *work);
void vrdma_lost_locked(struct vrdma_dev *dev, const char *why);

/* virtio_rdma_ib.c: the verbs device */
void vrdma_pair(struct vrdma_dev *dev, bool start);
void vrdma_pair_work(struct work_struct *work);
int vrdma_netdev_event(struct notifier_block *nb, unsigned long event,
		       void *ptr);
void vrdma_ib_down(struct vrdma_dev *dev);

#endif /* _VIRTIO_RDMA_H */
