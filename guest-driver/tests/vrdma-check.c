// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Creates objects through libibverbs on the first RDMA device and checks
 * what the driver stack (virtio_rdma.ko, the provider, the device) returns:
 * memory regions whose sizes take an INLINE and an INDIRECT page list, an
 * unaligned start, requests the device or the kernel must refuse,
 * completion queues of several depths up to the device's largest, and RC
 * and UD queue pairs taken through their states (an RC QP connected to
 * itself through GID index 1, the VM's GID).
 * Prints "VRDMA-CHECK: N passed, M failed"; exits non-zero on a failure.
 */
#include <errno.h>
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
	       (!!mr->rkey == !!(access & (IBV_ACCESS_REMOTE_READ |
					   IBV_ACCESS_REMOTE_WRITE))), msg);
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

/*
 * Data through an RC QP connected to itself: a SEND into a posted receive,
 * then an RDMA WRITE, each checked by its completions and the bytes.
 */
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
out:
	ibv_dereg_mr(mr);
}

static int state_of(struct ibv_qp *qp)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init))
		return -1;
	return a.qp_state;
}

static void qp_states(struct ibv_context *ctx, struct ibv_pd *pd,
		      enum ibv_qp_type type)
{
	const char *name = type == IBV_QPT_RC ? "RC" : "UD";
	struct ibv_qp_init_attr init = {
		.qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a;
	struct ibv_qp *qp;
	union ibv_gid gid;
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
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if (type == IBV_QPT_RC) {
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE;
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	} else {
		a.qkey = 0x11111111;
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				    IBV_QP_PORT | IBV_QP_QKEY);
	}
	result(!ret && state_of(qp) == IBV_QPS_INIT, "  to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	if (type == IBV_QPT_RC) {
		if (ibv_query_gid(ctx, 1, 1, &gid))
			memset(&gid, 0, sizeof(gid));
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = qp->qp_num;
		a.rq_psn = 1;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = 1;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.port_num = 1;
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
				    IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
	} else {
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
	snprintf(msg, sizeof(msg), "  to RTR: %s", ret ? strerror(ret) : "ok");
	result(!ret && state_of(qp) == IBV_QPS_RTR, msg);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	if (type == IBV_QPT_RC) {
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
				    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	} else {
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	snprintf(msg, sizeof(msg), "  to RTS: %s", ret ? strerror(ret) : "ok");
	result(!ret && state_of(qp) == IBV_QPS_RTS, msg);
	if (type == IBV_QPT_RC && !ret)
		rc_loopback(pd, qp, c);
	result(ibv_destroy_qp(qp) == 0, "  destroyed");
out:
	if (c)
		ibv_destroy_cq(c);
}

int main(void)
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
	reg(pd, 4096, 0, local, "one page, local only");
	reg(pd, 65536, 100, remote, "unaligned start, remote access");
	reg(pd, 2 << 20, 0, remote, "2 MiB (512 pages: inline list)");
	reg(pd, 8 << 20, 0, remote, "8 MiB (2048 pages: indirect list)");
	refused(pd, IBV_ACCESS_REMOTE_WRITE, "remote write without local write");
	refused(pd, local | IBV_ACCESS_MW_BIND, "memory-window binding");
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
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("VRDMA-CHECK: %d passed, %d failed\n", passed, failed);
	return failed != 0;
}
