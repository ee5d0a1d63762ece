// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Creates objects through libibverbs on the first RDMA device and checks
 * what the driver stack (virtio_rdma.ko, the provider, the device) returns:
 * memory regions whose sizes take an INLINE and an INDIRECT page list, an
 * unaligned start, requests the device or the kernel must refuse,
 * completion queues of several depths up to the device's largest, and RC
 * and UD queue pairs taken through their states (an RC QP connected to
 * itself through GID index 1, the VM's GID), and the device's async events
 * through ibv_get_async_event.
 * Prints "VRDMA-CHECK: N passed, M failed"; exits non-zero on a failure.
 *
 *   vrdma-check         everything
 *   vrdma-check rc      the RC QP only (a quick check of a device)
 *   vrdma-check transport-only   on a device without UD, SRQs and atomics
 *                       (no device feature bits): those refused, RC works
 *   vrdma-check fatal   objects, "READY", then waits for the device's reset
 *                       (IBV_EVENT_DEVICE_FATAL) and checks what follows
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <infiniband/verbs.h>

static int passed, failed;

static void result(int ok, const char *what)
{
	printf("VRDMA-CHECK %s: %s\n", ok ? "ok" : "FAILED", what);
	if (ok)
		passed++;
	else
		failed++;
}

/*
 * With F_RESIZE every region has an rkey, granting nothing without remote
 * access, so that a later ibv_rereg_mr can grant remote access under it
 * (spec 12.10, 12.26). User space sees the negotiated feature bits in the
 * virtio device's sysfs "features" string; F_RESIZE is bit 6 (spec 4).
 */
static int rkey_always(struct ibv_context *ctx)
{
	char path[128], bits[80] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/features",
		 ibv_get_device_name(ctx->device));
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (!fgets(bits, sizeof(bits), f))
		bits[0] = 0;
	fclose(f);
	return strlen(bits) > 6 && bits[6] == '1';
}

static void reg(struct ibv_pd *pd, size_t len, size_t offset, int access,
		const char *what)
{
	char msg[160];
	struct ibv_mr *mr;
	char *buf;

	buf = mmap(NULL, len + offset, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		result(0, "mmap");
		return;
	}
	/* 4 KiB pages, so that the page counts (and list modes) are known. */
	madvise(buf, len + offset, MADV_NOHUGEPAGE);
	memset(buf, 0x5a, len + offset);
	mr = ibv_reg_mr(pd, buf + offset, len, access);
	snprintf(msg, sizeof(msg), "%s: %zu bytes at +%zu -> %s lkey %#x rkey %#x",
		 what, len, offset, mr ? "registered" : strerror(errno),
		 mr ? mr->lkey : 0, mr ? mr->rkey : 0);
	result(mr && mr->lkey != 0 &&
	       (!!mr->rkey == (!!(access & (IBV_ACCESS_REMOTE_READ |
					    IBV_ACCESS_REMOTE_WRITE)) ||
			       rkey_always(pd->context))), msg);
	if (mr)
		result(ibv_dereg_mr(mr) == 0, "  deregistered");
	munmap(buf, len + offset);
}

static void refused(struct ibv_pd *pd, int access, const char *what)
{
	static char buf[4096] __attribute__((aligned(4096)));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), access);
	char msg[160];

	snprintf(msg, sizeof(msg), "%s: %s", what,
		 mr ? "registered (should not be)" : strerror(errno));
	result(!mr, msg);
	if (mr)
		ibv_dereg_mr(mr);
}

static void cq(struct ibv_context *ctx, int cqe, int expect_ok)
{
	struct ibv_cq *c = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
	char msg[160];

	snprintf(msg, sizeof(msg), "CQ of %d entries: %s (%d)", cqe,
		 c ? "created" : strerror(errno), c ? c->cqe : 0);
	result(expect_ok ? c && c->cqe >= cqe : !c, msg);
	if (c)
		result(ibv_destroy_cq(c) == 0, "  destroyed");
}

/* Polls @cq until @n completions arrived or 10 s passed; returns how many. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	time_t end = time(NULL) + 10;
	int got = 0, r;

	while (got < n && time(NULL) < end) {
		r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return got;
		got += r;
	}
	return got;
}

static int state_of(struct ibv_qp *qp)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init))
		return -1;
	return a.qp_state;
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };

	if (qp->qp_type == IBV_QPT_RC) {
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	}
	a.qkey = 0x11111111;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			     IBV_QP_PORT | IBV_QP_QKEY);
}

/* RC: towards QP @dest of this VM's GID (index 1). */
static int to_rtr(struct ibv_context *ctx, struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	union ibv_gid gid;

	if (qp->qp_type != IBV_QPT_RC)
		return ibv_modify_qp(qp, &a, IBV_QP_STATE);
	if (ibv_query_gid(ctx, 1, 1, &gid))
		memset(&gid, 0, sizeof(gid));
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
			     IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = 1 };

	if (qp->qp_type != IBV_QPT_RC)
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* An RC QP on @cq (and @srq, if any), in INIT. */
static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq,
			    struct ibv_srq *srq)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC, .send_cq = cq, .recv_cq = cq, .srq = srq,
		.cap = { .max_send_wr = 16, .max_recv_wr = srq ? 0 : 16,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	if (qp && to_init(qp)) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* The object an async event names, or NULL for port and device events. */
static void *event_object(const struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		return ev->element.cq;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return ev->element.srq;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
	case IBV_EVENT_DEVICE_FATAL:
		return NULL;
	default:
		return ev->element.qp;
	}
}

/*
 * Reads async events (ibv_get_async_event, acking each) until one of
 * @type naming @obj (NULL: a device event) came, or @ms milliseconds
 * passed; any other event is a failure.
 */
static int expect_event(struct ibv_context *ctx, enum ibv_event_type type,
			void *obj, int ms, const char *what)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	char msg[200];
	int got = 0;

	while (!got && poll(&p, 1, ms) == 1 && !ibv_get_async_event(ctx, &ev)) {
		got = ev.event_type == type && event_object(&ev) == obj;
		snprintf(msg, sizeof(msg), "  %s: async event %s%s", what,
			 ibv_event_type_str(ev.event_type),
			 got ? "" : " (not the one expected)");
		ibv_ack_async_event(&ev);
		result(got, msg);
	}
	if (!got) {
		snprintf(msg, sizeof(msg), "  %s: no async event %s", what,
			 ibv_event_type_str(type));
		result(0, msg);
	}
	return got;
}

/*
 * Data through an RC QP connected to itself: a SEND into a posted receive,
 * then an RDMA WRITE, each checked by its completions and the bytes; then
 * an RDMA WRITE with an rkey that names no region, which fails with
 * REM_ACCESS_ERR, moves the QP to ERR and makes the device report
 * QP_ACCESS_ERROR for the responder, the QP itself (spec 18.18).
 */
/*
 * Work requests beyond what the QP was created with (1 SGE each way, 64
 * bytes inline) are refused at post with EINVAL and bad_wr, and post
 * nothing: the device would fail them and the QP with them.
 */
static void refused_posts(struct ibv_qp *qp, struct ibv_mr *mr, char *buf)
{
	struct ibv_sge two[2] = {
		{ (uintptr_t)buf, 8, mr->lkey },
		{ (uintptr_t)buf + 8, 8, mr->lkey },
	};
	struct ibv_send_wr swr = { .wr_id = 20, .sg_list = two, .num_sge = 2,
				   .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr rwr = { .wr_id = 21, .sg_list = two, .num_sge = 2 };
	struct ibv_send_wr *sbad = NULL;
	struct ibv_recv_wr *rbad = NULL;
	struct ibv_sge big = { (uintptr_t)buf, 65, 0 };
	char msg[200];
	int a, b, c, d;

	swr.wr.rdma.remote_addr = (uintptr_t)buf + 5000;
	swr.wr.rdma.rkey = mr->rkey;
	a = ibv_post_send(qp, &swr, &sbad);
	a = a == EINVAL && sbad == &swr;
	b = ibv_post_recv(qp, &rwr, &rbad);
	b = b == EINVAL && rbad == &rwr;
	swr.sg_list = &big;
	swr.num_sge = 1;
	swr.send_flags |= IBV_SEND_INLINE;
	sbad = NULL;
	c = ibv_post_send(qp, &swr, &sbad);
	c = c == EINVAL && sbad == &swr;
	big.length = 8;
	swr.opcode = IBV_WR_RDMA_READ;
	sbad = NULL;
	d = ibv_post_send(qp, &swr, &sbad);
	d = d == EINVAL && sbad == &swr;
	snprintf(msg, sizeof(msg),
		 "  refused at post: 2 send SGEs %s, 2 receive SGEs %s, 65 inline bytes %s, an inline READ %s; QP state %d",
		 a ? "EINVAL" : "not refused", b ? "EINVAL" : "not refused",
		 c ? "EINVAL" : "not refused", d ? "EINVAL" : "not refused",
		 state_of(qp));
	result(a && b && c && d && state_of(qp) == IBV_QPS_RTS, msg);
}

static void rc_loopback(struct ibv_pd *pd, struct ibv_qp *qp,
			struct ibv_cq *cq)
{
	static char buf[8192] __attribute__((aligned(4096)));
	struct ibv_sge sge, rsge;
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 };
	struct ibv_send_wr swr = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr *rbad;
	struct ibv_send_wr *sbad;
	struct ibv_wc wc[2];
	struct ibv_mr *mr;
	char msg[200];
	int n, i;

	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE);
	if (!mr) {
		result(0, "  data: reg_mr");
		return;
	}
	for (i = 0; i < 64; i++)
		buf[i] = (char)(i * 7 + 1);
	sge = (struct ibv_sge){ (uintptr_t)buf, 64, mr->lkey };
	rsge = (struct ibv_sge){ (uintptr_t)buf + 4096, 64, mr->lkey };
	n = ibv_post_recv(qp, &rwr, &rbad);
	if (n) {
		snprintf(msg, sizeof(msg), "  post_recv: %s", strerror(n));
		result(0, msg);
		goto out;
	}
	n = ibv_post_send(qp, &swr, &sbad);
	if (n) {
		snprintf(msg, sizeof(msg), "  post_send: %s", strerror(n));
		result(0, msg);
		goto out;
	}
	n = poll_n(qp->send_cq, wc, 2);
	snprintf(msg, sizeof(msg),
		 "  SEND to itself: %d completions (%s/%s, %s/%s), %u bytes, data %s",
		 n, n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
		 n > 0 ? (wc[0].opcode == IBV_WC_RECV ? "RECV" : "SEND") : "-",
		 n > 1 ? ibv_wc_status_str(wc[1].status) : "-",
		 n > 1 ? (wc[1].opcode == IBV_WC_RECV ? "RECV" : "SEND") : "-",
		 n > 1 ? (wc[0].opcode == IBV_WC_RECV ? wc[0].byte_len :
			  wc[1].byte_len) : 0,
		 memcmp(buf, buf + 4096, 64) ? "differs" : "equal");
	result(n == 2 && wc[0].status == IBV_WC_SUCCESS &&
	       wc[1].status == IBV_WC_SUCCESS &&
	       !memcmp(buf, buf + 4096, 64), msg);
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.wr_id = 9;
	swr.wr.rdma.remote_addr = (uintptr_t)buf + 6000;
	swr.wr.rdma.rkey = mr->rkey;
	sge.length = 100;
	n = ibv_post_send(qp, &swr, &sbad) ? -1 : poll_n(cq, wc, 1);
	snprintf(msg, sizeof(msg), "  RDMA WRITE to itself: %s, data %s",
		 n == 1 ? ibv_wc_status_str(wc[0].status) : "no completion",
		 memcmp(buf, buf + 6000, 100) ? "differs" : "equal");
	result(n == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 9 &&
	       !memcmp(buf, buf + 6000, 100), msg);

	/* Inline data (spec 18.10): from memory of no region, copied at post. */
	{
		char src[48];

		for (i = 0; i < (int)sizeof(src); i++)
			src[i] = (char)(i * 13 + 5);
		sge = (struct ibv_sge){ (uintptr_t)src, sizeof(src), 0 };
		swr.wr_id = 11;
		swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		swr.wr.rdma.remote_addr = (uintptr_t)buf + 7000;
		n = ibv_post_send(qp, &swr, &sbad);
		memset(src, 0, sizeof(src));
		n = n ? -1 : poll_n(cq, wc, 1);
		for (i = 0; i < (int)sizeof(src); i++)
			src[i] = (char)(i * 13 + 5);
		snprintf(msg, sizeof(msg),
			 "  inline RDMA WRITE (48 bytes) to itself: %s, data %s",
			 n == 1 ? ibv_wc_status_str(wc[0].status) :
				  "no completion",
			 memcmp(src, buf + 7000, sizeof(src)) ? "differs" :
								"equal");
		result(n == 1 && wc[0].status == IBV_WC_SUCCESS &&
		       wc[0].wr_id == 11 &&
		       !memcmp(src, buf + 7000, sizeof(src)), msg);
		sge = (struct ibv_sge){ (uintptr_t)buf, 100, mr->lkey };
		swr.send_flags = IBV_SEND_SIGNALED;
	}

	/* Immediate data: four opaque bytes, received as sent (18.8). */
	rwr.wr_id = 12;
	swr.wr_id = 13;
	swr.opcode = IBV_WR_SEND_WITH_IMM;
	swr.imm_data = htobe32(0x12345678);
	sge.length = 16;
	n = ibv_post_recv(qp, &rwr, &rbad) || ibv_post_send(qp, &swr, &sbad) ?
	    -1 : poll_n(cq, wc, 2);
	i = n == 2 && wc[1].opcode == IBV_WC_RECV;
	snprintf(msg, sizeof(msg),
		 "  SEND with immediate 0x12345678 to itself: %d completions, immediate %s 0x%08x",
		 n, n == 2 && (wc[i].wc_flags & IBV_WC_WITH_IMM) ? "flagged" :
								  "missing",
		 n == 2 ? be32toh(wc[i].imm_data) : 0);
	result(n == 2 && wc[i].opcode == IBV_WC_RECV &&
	       wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 12 &&
	       (wc[i].wc_flags & IBV_WC_WITH_IMM) &&
	       be32toh(wc[i].imm_data) == 0x12345678, msg);
	swr.opcode = IBV_WR_RDMA_WRITE;

	refused_posts(qp, mr, buf);

	swr.wr_id = 10;
	swr.wr.rdma.remote_addr = (uintptr_t)buf + 6000;
	swr.wr.rdma.rkey = mr->rkey ^ 0x5a5a00;
	n = ibv_post_send(qp, &swr, &sbad) ? -1 : poll_n(cq, wc, 1);
	snprintf(msg, sizeof(msg),
		 "  RDMA WRITE with an rkey of no region: %s, QP state %d",
		 n == 1 ? ibv_wc_status_str(wc[0].status) : "no completion",
		 state_of(qp));
	result(n == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR &&
	       wc[0].wr_id == 10 && state_of(qp) == IBV_QPS_ERR, msg);
	expect_event(qp->context, IBV_EVENT_QP_ACCESS_ERR, qp, 10000,
		     "the responder's access error");
out:
	ibv_dereg_mr(mr);
}

static void qp_states(struct ibv_context *ctx, struct ibv_pd *pd,
		      enum ibv_qp_type type)
{
	const char *name = type == IBV_QPT_RC ? "RC" : "UD";
	struct ibv_qp_init_attr init = {
		.qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	struct ibv_qp *qp;
	char msg[160];
	struct ibv_cq *c;
	int ret;

	c = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	init.send_cq = c;
	init.recv_cq = c;
	qp = c ? ibv_create_qp(pd, &init) : NULL;
	snprintf(msg, sizeof(msg), "%s QP: %s, QPN %#x, state %d", name,
		 qp ? "created" : strerror(errno), qp ? qp->qp_num : 0,
		 qp ? state_of(qp) : -1);
	result(qp && qp->qp_num > 1 && state_of(qp) == IBV_QPS_RESET, msg);
	if (!qp)
		goto out;
	ret = to_init(qp);
	result(!ret && state_of(qp) == IBV_QPS_INIT, "  to INIT");
	ret = to_rtr(ctx, qp, qp->qp_num);
	snprintf(msg, sizeof(msg), "  to RTR: %s", ret ? strerror(ret) : "ok");
	result(!ret && state_of(qp) == IBV_QPS_RTR, msg);
	ret = to_rts(qp);
	snprintf(msg, sizeof(msg), "  to RTS: %s", ret ? strerror(ret) : "ok");
	result(!ret && state_of(qp) == IBV_QPS_RTS, msg);
	if (type == IBV_QPT_RC && !ret)
		rc_loopback(pd, qp, c);
	result(ibv_destroy_qp(qp) == 0, "  destroyed");
out:
	if (c)
		ibv_destroy_cq(c);
}

/* @n signaled SENDs (@imm 0) or RDMA WRITEs of 8 bytes to itself. */
static int post_n(struct ibv_qp *qp, struct ibv_mr *mr, int n, int write)
{
	struct ibv_sge sge = { (uintptr_t)mr->addr, 8, mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1,
		.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	int i, ret = 0;

	wr.wr.rdma.remote_addr = (uintptr_t)mr->addr + 2048;
	wr.wr.rdma.rkey = mr->rkey;
	for (i = 0; i < n && !ret; i++) {
		wr.wr_id = 100 + i;
		ret = ibv_post_send(qp, &wr, &bad);
	}
	return ret;
}

/* @n receives of 64 bytes on @srq, or on @qp's receive queue. */
static int recv_n(struct ibv_qp *qp, struct ibv_srq *srq, struct ibv_mr *mr,
		  int n)
{
	struct ibv_sge sge = { (uintptr_t)mr->addr + 1024, 64, mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	int i, ret = 0;

	for (i = 0; i < n && !ret; i++) {
		wr.wr_id = 200 + i;
		ret = srq ? ibv_post_srq_recv(srq, &wr, &bad) :
			    ibv_post_recv(qp, &wr, &bad);
	}
	return ret;
}

/*
 * Async events of the device's data path, each as spec 18.18 to 18.22
 * says the device generates them, through ibv_get_async_event:
 * - COMM_EST: a SEND reaches a QP in RTR;
 * - CQ_ERR and QP_FATAL: a CQ of 2 entries gets a third completion;
 * - SRQ_LIMIT_REACHED: the posted receives of an SRQ fall below its limit;
 * - QP_LAST_WQE_REACHED: a QP with an SRQ moves to ERR.
 */
static void async_events(struct ibv_context *ctx, struct ibv_pd *pd)
{
	static char buf[4096] __attribute__((aligned(4096)));
	struct ibv_srq_init_attr sinit = { .attr = { .max_wr = 8,
						     .max_sge = 1 } };
	struct ibv_qp *a = NULL, *b = NULL, *c = NULL;
	struct ibv_cq *cq, *small = NULL;
	struct ibv_srq *srq = NULL;
	struct ibv_srq_attr sattr;
	struct ibv_qp_attr attr;
	struct ibv_wc wc[4];
	struct ibv_mr *mr;
	char msg[200];
	int n;

	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE);
	cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	if (!mr || !cq) {
		result(0, "async events: MR and CQ");
		goto out;
	}

	/* COMM_EST: a SEND from A (RTS) to B (RTR). */
	a = rc_qp(pd, cq, NULL);
	b = rc_qp(pd, cq, NULL);
	n = !a || !b || to_rtr(ctx, b, a->qp_num) ||
	    to_rtr(ctx, a, b->qp_num) || to_rts(a) || recv_n(b, NULL, mr, 1) ||
	    post_n(a, mr, 1, 0) ? -1 : poll_n(cq, wc, 2);
	snprintf(msg, sizeof(msg),
		 "async events: SEND to a QP in RTR: %d completions (%s, %s)",
		 n, n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
		 n > 1 ? ibv_wc_status_str(wc[1].status) : "-");
	result(n == 2 && wc[0].status == IBV_WC_SUCCESS &&
	       wc[1].status == IBV_WC_SUCCESS, msg);
	if (b)
		expect_event(ctx, IBV_EVENT_COMM_EST, b, 10000,
			     "the first message in RTR");

	/* CQ_ERR and QP_FATAL: a third completion into a CQ of 2. */
	small = ibv_create_cq(ctx, 2, NULL, NULL, 0);
	c = small ? rc_qp(pd, small, NULL) : NULL;
	n = !c || small->cqe != 2 || to_rtr(ctx, c, c->qp_num) || to_rts(c) ||
	    post_n(c, mr, 3, 1);
	result(!n, "async events: 3 RDMA WRITEs into a CQ of 2 entries");
	if (!n) {
		expect_event(ctx, IBV_EVENT_CQ_ERR, small, 10000,
			     "the CQ overflowed");
		expect_event(ctx, IBV_EVENT_QP_FATAL, c, 10000,
			     "its QP failed");
	}
	if (c)
		ibv_destroy_qp(c);
	c = NULL;

	/* SRQ_LIMIT_REACHED: 4 receives, limit 3, two SENDs. */
	srq = ibv_create_srq(pd, &sinit);
	c = srq ? rc_qp(pd, cq, srq) : NULL;
	sattr.srq_limit = 3;
	n = !c || recv_n(NULL, srq, mr, 4) ||
	    ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT) ||
	    to_rtr(ctx, c, c->qp_num) || to_rts(c) || post_n(c, mr, 2, 0) ?
	    -1 : poll_n(cq, wc, 4);
	snprintf(msg, sizeof(msg),
		 "async events: 2 SENDs into an SRQ of 4 receives, limit 3: %d completions",
		 n);
	result(n == 4, msg);
	if (n == 4)
		expect_event(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq, 10000,
			     "the SRQ fell below its limit");
	/* QP_LAST_WQE_REACHED: the QP with the SRQ moves to ERR. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_ERR;
	if (c && !ibv_modify_qp(c, &attr, IBV_QP_STATE))
		expect_event(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, c, 10000,
			     "the QP with an SRQ moved to ERR");
	else
		result(0, "async events: QP with an SRQ to ERR");
out:
	if (c)
		ibv_destroy_qp(c);
	if (srq)
		ibv_destroy_srq(srq);
	if (small)
		ibv_destroy_cq(small);
	if (a)
		ibv_destroy_qp(a);
	if (b)
		ibv_destroy_qp(b);
	if (cq)
		ibv_destroy_cq(cq);
	if (mr)
		ibv_dereg_mr(mr);
}

/* A GUID as ibv_devinfo prints it (network order, first octet first). */
static void guid_str(__be64 guid, char *out, size_t len)
{
	const uint8_t *b = (const uint8_t *)&guid;

	snprintf(out, len, "%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1],
		 b[2], b[3], b[4], b[5], b[6], b[7]);
}

/*
 * What the kernel driver reports of the device and its port:
 * - the GUIDs in ib_core's byte order: the reference device's node GUID is
 *   a locally administered unicast EUI-64 (first octet: U/L bit set, I/G
 *   bit clear) and its system image GUID the same value;
 * - device_cap_flags: exactly what the device does (RNR NAKs for RC,
 *   CUR_STATE checked, port active events, a system image GUID; with
 *   F_MEM_MGT, which user space cannot see, fast registration too; with
 *   F_MW memory windows of both types, type 2 tied to QP and PD; with
 *   F_RESIZE and SRQs, SRQ resizing; with F_XRC and SRQs, XRC);
 * - the port: active with the physical state LINK_UP, and a GID table of
 *   ib_core's default entry plus at most the 16 device GIDs the driver
 *   reads;
 * - a device quota as ENOMEM: PDs beyond max_pd (the device's QUOTA).
 */
static void device_attrs(struct ibv_context *ctx)
{
	const unsigned int want = IBV_DEVICE_RC_RNR_NAK_GEN |
				  IBV_DEVICE_CURR_QP_STATE_MOD |
				  IBV_DEVICE_PORT_ACTIVE_EVENT |
				  IBV_DEVICE_SYS_IMAGE_GUID;
	struct ibv_device_attr attr;
	struct ibv_port_attr port;
	char node[24], sys[24], msg[200];
	struct ibv_pd **pds;
	int n, err = 0, i;

	if (ibv_query_device(ctx, &attr) || ibv_query_port(ctx, 1, &port)) {
		result(0, "attributes: query_device, query_port");
		return;
	}
	guid_str(attr.node_guid, node, sizeof(node));
	guid_str(attr.sys_image_guid, sys, sizeof(sys));
	snprintf(msg, sizeof(msg),
		 "attributes: node GUID %s (locally administered unicast), system image GUID %s",
		 node, sys);
	result((((const uint8_t *)&attr.node_guid)[0] & 3) == 2 &&
	       attr.sys_image_guid == attr.node_guid &&
	       ibv_get_device_guid(ctx->device) == attr.node_guid, msg);
	snprintf(msg, sizeof(msg),
		 "attributes: device_cap_flags %#x (RC_RNR_NAK_GEN, CURR_QP_STATE_MOD, PORT_ACTIVE_EVENT, SYS_IMAGE_GUID: %#x)",
		 attr.device_cap_flags, want);
	result((attr.device_cap_flags & ~(IBV_DEVICE_MEM_MGT_EXTENSIONS |
					  IBV_DEVICE_MEM_WINDOW |
					  IBV_DEVICE_MEM_WINDOW_TYPE_2B |
					  IBV_DEVICE_SRQ_RESIZE |
					  IBV_DEVICE_XRC)) == want &&
	       (!(attr.device_cap_flags & IBV_DEVICE_XRC) || attr.max_srq) &&
	       !(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ==
	       !(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) &&
	       (!(attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE) ||
		rkey_always(ctx)),
	       msg);
	snprintf(msg, sizeof(msg),
		 "attributes: port state %d, physical state %u, GID table %d",
		 port.state, port.phys_state, port.gid_tbl_len);
	result(port.state == IBV_PORT_ACTIVE && port.phys_state == 5 &&
	       port.gid_tbl_len >= 2 && port.gid_tbl_len <= 17, msg);

	/* The PD quota; this process holds one PD already. */
	if (attr.max_pd < 1 || attr.max_pd > 65536) {
		result(0, "attributes: max_pd out of the range tried");
		return;
	}
	pds = calloc(attr.max_pd + 1, sizeof(*pds));
	for (n = 0; pds && n <= attr.max_pd; n++) {
		pds[n] = ibv_alloc_pd(ctx);
		if (!pds[n]) {
			err = errno;
			break;
		}
	}
	snprintf(msg, sizeof(msg),
		 "attributes: PDs beyond the quota of %d: %d more allocated, then %s",
		 attr.max_pd, n, err ? strerror(err) : "no failure");
	result(pds && n < attr.max_pd && err == ENOMEM, msg);
	for (i = 0; pds && i < n; i++)
		ibv_dealloc_pd(pds[i]);
	free(pds);
}

/*
 * ibv_query_qp of RC QPs as the kernel driver fills it from QUERY_QP, and
 * device statuses seen through ibv_modify_qp: a QP with an SRQ and
 * sq_sig_all 0 taken to RTR with an address of GID index 1 (traffic
 * class, flow label and SL of their own) reads back its access flags, the
 * address with the GRH, and sq_sig_all 0; to RTS, a max_rd_atomic above
 * the device's limit (RANGE) and a cur_state that is not the QP's
 * (BAD_STATE) fail with EINVAL, the right cur_state is taken; to SQD with
 * en_sqd_async_notify, which brings IBV_EVENT_SQ_DRAINED. A QP in RESET
 * created with sq_sig_all 1 reads it back, and no address.
 */
static void qp_attrs(struct ibv_context *ctx, struct ibv_pd *pd)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ;
	struct ibv_srq_init_attr sinit = { .attr = { .max_wr = 8,
						     .max_sge = 1 } };
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	}, qinit;
	struct ibv_qp *qp = NULL, *sig = NULL;
	struct ibv_device_attr dattr;
	struct ibv_srq *srq = NULL;
	struct ibv_qp_attr a, q;
	struct ibv_cq *cq;
	union ibv_gid gid;
	char msg[240];
	int ret;

	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	srq = ibv_create_srq(pd, &sinit);
	init.send_cq = cq;
	init.recv_cq = cq;
	init.srq = srq;
	qp = cq && srq ? ibv_create_qp(pd, &init) : NULL;
	if (!qp || ibv_query_gid(ctx, 1, 1, &gid) ||
	    ibv_query_device(ctx, &dattr)) {
		result(0, "QP attributes: CQ, SRQ, RC QP, GID 1");
		goto out;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.grh.traffic_class = 0x48;
	a.ah_attr.grh.flow_label = 0x12345;
	a.ah_attr.sl = 3;
	a.ah_attr.port_num = 1;
	ret = ret ? ret : ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
					IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					IBV_QP_RQ_PSN |
					IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER);
	memset(&q, 0, sizeof(q));
	memset(&qinit, 0, sizeof(qinit));
	ret = ret ? ret : ibv_query_qp(qp, &q, IBV_QP_STATE, &qinit);
	snprintf(msg, sizeof(msg),
		 "QP attributes in RTR: %s, access %#x, GRH %d, GID index %u, dgid %s, hop limit %u, traffic class %#x, flow label %#x, SL %u, port %u, sq_sig_all %d",
		 ret ? strerror(ret) : "ok", q.qp_access_flags,
		 q.ah_attr.is_global, q.ah_attr.grh.sgid_index,
		 memcmp(&q.ah_attr.grh.dgid, &gid, sizeof(gid)) ? "differs" :
								  "GID 1",
		 q.ah_attr.grh.hop_limit, q.ah_attr.grh.traffic_class,
		 q.ah_attr.grh.flow_label, q.ah_attr.sl, q.ah_attr.port_num,
		 qinit.sq_sig_all);
	result(!ret && q.qp_state == IBV_QPS_RTR && q.qp_access_flags == access &&
	       q.ah_attr.is_global && q.ah_attr.grh.sgid_index == 1 &&
	       !memcmp(&q.ah_attr.grh.dgid, &gid, sizeof(gid)) &&
	       q.ah_attr.grh.hop_limit && q.ah_attr.grh.traffic_class == 0x48 &&
	       q.ah_attr.grh.flow_label == 0x12345 && q.ah_attr.sl == 3 &&
	       q.ah_attr.port_num == 1 && !qinit.sq_sig_all &&
	       qinit.srq == srq, msg);
	if (ret)
		goto out;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = dattr.max_qp_init_rd_atom + 1;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	snprintf(msg, sizeof(msg),
		 "  to RTS with max_rd_atomic %u, above the device's %d: %s",
		 a.max_rd_atomic, dattr.max_qp_init_rd_atom,
		 ret ? strerror(ret) : "succeeded");
	result(ret == EINVAL, msg);
	a.max_rd_atomic = 1;
	a.cur_qp_state = IBV_QPS_INIT;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE |
			    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			    IBV_QP_MAX_QP_RD_ATOMIC);
	snprintf(msg, sizeof(msg), "  to RTS with cur_state INIT (it is RTR): %s",
		 ret ? strerror(ret) : "succeeded");
	result(ret == EINVAL, msg);
	a.cur_qp_state = IBV_QPS_RTR;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE |
			    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			    IBV_QP_MAX_QP_RD_ATOMIC);
	snprintf(msg, sizeof(msg), "  to RTS with cur_state RTR: %s",
		 ret ? strerror(ret) : "ok");
	result(!ret, msg);

	/* uverbs' query_qp response has no en_sqd_async_notify: the event. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_SQD;
	a.en_sqd_async_notify = 1;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
	memset(&q, 0, sizeof(q));
	ret = ret ? ret : ibv_query_qp(qp, &q, IBV_QP_STATE, &qinit);
	snprintf(msg, sizeof(msg),
		 "  to SQD with en_sqd_async_notify: %s, state %d",
		 ret ? strerror(ret) : "ok", q.qp_state);
	result(!ret && q.qp_state == IBV_QPS_SQD, msg);
	if (!ret)
		expect_event(ctx, IBV_EVENT_SQ_DRAINED, qp, 10000,
			     "SQD with nothing in flight");

	init.srq = NULL;
	init.cap.max_recv_wr = 16;
	init.sq_sig_all = 1;
	sig = ibv_create_qp(pd, &init);
	memset(&q, 0, sizeof(q));
	ret = sig ? ibv_query_qp(sig, &q, IBV_QP_STATE, &qinit) : errno;
	snprintf(msg, sizeof(msg),
		 "QP attributes in RESET: %s, sq_sig_all %d, GRH %d, access %#x",
		 ret ? strerror(ret) : "ok", qinit.sq_sig_all,
		 q.ah_attr.is_global, q.qp_access_flags);
	result(!ret && qinit.sq_sig_all == 1 && !q.ah_attr.is_global &&
	       !q.qp_access_flags, msg);
out:
	if (sig)
		ibv_destroy_qp(sig);
	if (qp)
		ibv_destroy_qp(qp);
	if (srq)
		ibv_destroy_srq(srq);
	if (cq)
		ibv_destroy_cq(cq);
}

/*
 * "fatal": objects are created and used, "READY" is printed, and then the
 * device is reset (by the caller): the process must get
 * IBV_EVENT_DEVICE_FATAL, its later verbs must fail (EIO) rather than
 * hang, and its objects must still be destroyable.
 */
static int fatal(struct ibv_context *ctx, struct ibv_pd *pd)
{
	static char buf[4096] __attribute__((aligned(4096)));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *qp = cq ? rc_qp(pd, cq, NULL) : NULL;
	struct ibv_pd *pd2;
	struct ibv_wc wc;
	char msg[200];
	int ok;

	result(mr && qp && !to_rtr(ctx, qp, qp->qp_num) && !to_rts(qp) &&
	       !post_n(qp, mr, 1, 1) && poll_n(cq, &wc, 1) == 1 &&
	       wc.status == IBV_WC_SUCCESS,
	       "fatal: MR, CQ and an RC QP that works");
	printf("READY\n");
	fflush(stdout);
	expect_event(ctx, IBV_EVENT_DEVICE_FATAL, NULL, 120000,
		     "the device was reset");
	pd2 = ibv_alloc_pd(ctx);
	snprintf(msg, sizeof(msg), "fatal: alloc_pd afterwards: %s",
		 pd2 ? "succeeded" : strerror(errno));
	result(!pd2 && errno == EIO, msg);
	ok = qp ? state_of(qp) : 0;
	result(ok < 0, "fatal: query_qp afterwards fails");
	ok = (!qp || !ibv_destroy_qp(qp)) && (!cq || !ibv_destroy_cq(cq)) &&
	     (!mr || !ibv_dereg_mr(mr)) && !ibv_dealloc_pd(pd);
	result(ok, "fatal: the objects are destroyed");
	return 0;
}

/*
 * A device whose VMM offers the guest no device feature bits (as
 * cloud-hypervisor's generic vhost-user device does): no UD, SRQs or
 * atomics, and the driver says so; RC QPs and their data path work.
 */
static void transport_only(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_srq_init_attr sattr = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	static char buf[4096] __attribute__((aligned(4096)));
	struct ibv_device_attr attr;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_cq *c;
	char msg[200];
	int ud_err, srq_err, mr_err;

	if (ibv_query_device(ctx, &attr)) {
		result(0, "query_device");
		return;
	}
	snprintf(msg, sizeof(msg),
		 "transport features only: atomic_cap %d, max_srq %d",
		 attr.atomic_cap, attr.max_srq);
	result(attr.atomic_cap == IBV_ATOMIC_NONE && attr.max_srq == 0, msg);

	c = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	init.send_cq = c;
	init.recv_cq = c;
	qp = c ? ibv_create_qp(pd, &init) : NULL;
	ud_err = qp ? 0 : errno;
	if (qp)
		ibv_destroy_qp(qp);
	srq = ibv_create_srq(pd, &sattr);
	srq_err = srq ? 0 : errno;
	if (srq)
		ibv_destroy_srq(srq);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_ATOMIC);
	mr_err = mr ? 0 : errno;
	if (mr)
		ibv_dereg_mr(mr);
	snprintf(msg, sizeof(msg),
		 "  refused: a UD QP (%s), an SRQ (%s), a region with remote atomic access (%s)",
		 strerror(ud_err), strerror(srq_err), strerror(mr_err));
	result(ud_err == EOPNOTSUPP && srq_err == EOPNOTSUPP &&
	       mr_err == EOPNOTSUPP, msg);
	if (c)
		ibv_destroy_cq(c);
	qp_states(ctx, pd, IBV_QPT_RC);
}

/*
 * ibv_create_qp_ex: PD and CREATE_FLAGS with no flag create a QP (without
 * the extended send API: ibv_qp_to_qp_ex gives none); SEND_OPS_FLAGS with
 * SEND one with it; an operation the device does not run (ATOMIC_WRITE) is
 * refused with EOPNOTSUPP, a create flag with EINVAL.
 */
static void create_qp_ex(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_qp *qp, *ops, *bad_ops, *flags;
	struct ibv_qp_init_attr_ex a = {};
	int ops_err, bad_err, flags_err, ex, ops_ex;
	struct ibv_cq *cq;
	char msg[200];

	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq) {
		result(0, "create_qp_ex: create_cq");
		return;
	}
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.pd = pd;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	qp = ibv_create_qp_ex(ctx, &a);
	ex = qp && ibv_qp_to_qp_ex(qp) != NULL;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND;
	errno = 0;
	ops = ibv_create_qp_ex(ctx, &a);
	ops_err = errno;
	ops_ex = ops && ibv_qp_to_qp_ex(ops) != NULL;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE;
	errno = 0;
	bad_ops = ibv_create_qp_ex(ctx, &a);
	bad_err = errno;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	flags = ibv_create_qp_ex(ctx, &a);
	flags_err = errno;
	snprintf(msg, sizeof(msg),
		 "create_qp_ex: PD|CREATE_FLAGS, no flag: %s (qp_ex %s); SEND_OPS_FLAGS SEND: %s (qp_ex %s); ATOMIC_WRITE: %s; a create flag: %s",
		 qp ? "created" : strerror(errno), ex ? "yes" : "none",
		 ops ? "created" : strerror(ops_err), ops_ex ? "yes" : "none",
		 bad_ops ? "created" : strerror(bad_err),
		 flags ? "created" : strerror(flags_err));
	result(qp && !ex && ops && ops_ex && !bad_ops && bad_err == EOPNOTSUPP &&
	       !flags && flags_err == EINVAL, msg);
	if (qp)
		ibv_destroy_qp(qp);
	if (ops)
		ibv_destroy_qp(ops);
	if (bad_ops)
		ibv_destroy_qp(bad_ops);
	if (flags)
		ibv_destroy_qp(flags);
	ibv_destroy_cq(cq);
}

int main(int argc, char **argv)
{
	struct ibv_device_attr attr;
	const int local = IBV_ACCESS_LOCAL_WRITE;
	const int remote = local | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_WRITE;
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int n;

	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("VRDMA-CHECK FAILED: no RDMA device\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("VRDMA-CHECK FAILED: open %s / alloc_pd: %s\n",
		       ibv_get_device_name(list[0]), strerror(errno));
		return 1;
	}
	if (argc > 1 && !strcmp(argv[1], "fatal")) {
		fatal(ctx, pd);
		goto done;
	}
	if (argc > 1 && !strcmp(argv[1], "transport-only")) {
		transport_only(ctx, pd);
		goto close;
	}
	if (argc > 1 && !strcmp(argv[1], "rc")) {
		qp_states(ctx, pd, IBV_QPT_RC);
		goto close;
	}
	reg(pd, 4096, 0, local, "one page, local only");
	reg(pd, 65536, 100, remote, "unaligned start, remote access");
	reg(pd, 2 << 20, 0, remote, "2 MiB (512 pages: inline list)");
	reg(pd, 8 << 20, 0, remote, "8 MiB (2048 pages: indirect list)");
	refused(pd, IBV_ACCESS_REMOTE_WRITE, "remote write without local write");
	/* F_MW: windows may be bound; no remote right, so no rkey. */
	reg(pd, 4096, 0, local | IBV_ACCESS_MW_BIND, "memory-window binding");
	device_attrs(ctx);
	qp_attrs(ctx, pd);
	create_qp_ex(ctx, pd);
	if (ibv_query_device(ctx, &attr)) {
		result(0, "query_device");
	} else {
		cq(ctx, 1, 1);
		cq(ctx, 100, 1);
		cq(ctx, 65536, 1);
		cq(ctx, attr.max_cqe, 1);
		cq(ctx, attr.max_cqe + 1, 0);
	}
	qp_states(ctx, pd, IBV_QPT_RC);
	qp_states(ctx, pd, IBV_QPT_UD);
	async_events(ctx, pd);
close:
	ibv_dealloc_pd(pd);
done:
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("VRDMA-CHECK: %d passed, %d failed\n", passed, failed);
	return failed != 0;
}
