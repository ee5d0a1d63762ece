// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Sharing a context between processes (ibv_import_device, ibv_import_pd,
 * ibv_import_mr): the importing process gets its own view of objects the
 * kernel keeps for the context's file. The device sees nothing new.
 */

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <util/util.h>

#include "virtio_rdma.h"

/*
 * A context over @cmd_fd, a file another context opened. Its doorbell
 * header stays the original's (its mapping key comes with GET_CONTEXT
 * only): posts through this context always kick, which spec 18.6 allows.
 * A doorbell page (spec 18.7) is at a fixed key, and needed: the queues
 * this process creates may get slots of it.
 */
struct verbs_context *vrdma_import_context(struct ibv_device *ibdev,
					   int cmd_fd)
{
	struct vrdma_context *ctx;
	void *page;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	if (ibv_cmd_query_context(&ctx->ibv_ctx.context, NULL) ||
	    vrdma_query_caps(ctx))
		goto err;
	page = mmap(NULL, VIRTIO_RDMA_DB_PAGE_SIZE, PROT_READ | PROT_WRITE,
		    MAP_SHARED, cmd_fd, VIRTIO_RDMA_MMAP_DB_PAGE);
	if (page != MAP_FAILED) {
		ctx->db_page = page;
		/* The flags too: the page's header is the context's. */
		ctx->db_flags = page;
	} else if (errno != EINVAL) {
		/* EINVAL: the context has no page. */
		verbs_err(&ctx->ibv_ctx,
			  "virtio_rdma: mapping the doorbell page failed: %s\n",
			  strerror(errno));
		goto err;
	}
	vrdma_set_ops(ctx);
	return &ctx->ibv_ctx;

err:
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

/*
 * The PD @pd_handle of the shared file: the kernel has no query for a PD,
 * so a handle that names none fails the first command that uses it.
 */
struct ibv_pd *vrdma_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	struct vrdma_pd *pd;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	pd->ibv_pd.context = context;
	pd->ibv_pd.handle = pd_handle;
	return &pd->ibv_pd;
}

void vrdma_unimport_pd(struct ibv_pd *pd)
{
	free(to_vpd(pd));
}

/* The MR @mr_handle of the shared file, as the kernel describes it. */
struct ibv_mr *vrdma_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	struct verbs_mr *vmr;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;
	if (ibv_cmd_query_mr(pd, vmr, mr_handle)) {
		free(vmr);
		return NULL;
	}
	return &vmr->ibv_mr;
}

void vrdma_unimport_mr(struct ibv_mr *mr)
{
	free(verbs_get_mr(mr));
}
