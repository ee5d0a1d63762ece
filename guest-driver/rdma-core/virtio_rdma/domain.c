// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * Parent domains (ibv_alloc_parent_domain): a protection domain with the
 * application's allocators for the memory the provider gives the device,
 * the rings and doorbell records of QPs, CQs and SRQs. The device sees
 * only the protection domain: a parent domain carries its handle.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <util/util.h>

#include "virtio_rdma.h"

struct ibv_pd *vrdma_alloc_parent_domain(struct ibv_context *context,
					 struct ibv_parent_domain_init_attr *attr)
{
	const uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			       IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	struct vrdma_pd *dom, *pd;

	if (attr->comp_mask & ~known) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* No thread domains here (ibv_alloc_td is not offered). */
	if (!attr->pd || attr->pd->context != context || attr->td) {
		errno = EINVAL;
		return NULL;
	}
	pd = to_vpd(attr->pd);
	if (pd->protection) {
		errno = EINVAL;
		return NULL;
	}
	if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
	    (!attr->alloc || !attr->free)) {
		errno = EINVAL;
		return NULL;
	}
	dom = calloc(1, sizeof(*dom));
	if (!dom)
		return NULL;
	dom->ibv_pd.context = context;
	dom->ibv_pd.handle = pd->ibv_pd.handle;
	dom->protection = pd;
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		dom->alloc = attr->alloc;
		dom->free = attr->free;
	}
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		dom->pd_context = attr->pd_context;
	atomic_fetch_add(&pd->refs, 1);
	return &dom->ibv_pd;
}

/* The parent domain a queue's memory comes from, or NULL for a PD. */
struct vrdma_pd *vrdma_domain_get(struct ibv_pd *ibpd)
{
	struct vrdma_pd *pd = to_vpd(ibpd);

	if (!pd->protection)
		return NULL;
	atomic_fetch_add(&pd->refs, 1);
	return pd;
}

void vrdma_domain_put(struct vrdma_pd *dom)
{
	if (dom)
		atomic_fetch_sub(&dom->refs, 1);
}

/*
 * @len bytes aligned to @alignment, zeroed: from @dom's allocator if it
 * has one and does not defer to the provider, else the provider's own.
 * *@custom records which, for vrdma_free_buf.
 */
void *vrdma_alloc_buf(struct vrdma_pd *dom, size_t len, size_t alignment,
		      uint64_t type, bool *custom)
{
	void *p;

	*custom = false;
	if (dom && dom->alloc) {
		p = dom->alloc(&dom->ibv_pd, dom->pd_context, len, alignment,
			       type);
		if (!p) {
			errno = ENOMEM;
			return NULL;
		}
		if (p != IBV_ALLOCATOR_USE_DEFAULT) {
			*custom = true;
			if ((uintptr_t)p & (alignment - 1)) {
				vrdma_free_buf(dom, p, type, true);
				errno = EINVAL;
				return NULL;
			}
			memset(p, 0, len);
			return p;
		}
	}
	p = aligned_alloc(alignment, align(len, alignment));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	memset(p, 0, len);
	return p;
}

void vrdma_free_buf(struct vrdma_pd *dom, void *p, uint64_t type, bool custom)
{
	if (!p)
		return;
	if (custom)
		dom->free(&dom->ibv_pd, dom->pd_context, p, type);
	else
		free(p);
}

/*
 * A queue's page-aligned ring of @ring_len bytes and its 128-byte doorbell
 * record, both zeroed, for a queue of @pd (a PD or a parent domain).
 * Returns an errno.
 */
int vrdma_qmem_alloc(struct vrdma_qmem *m, struct ibv_pd *pd, void **ring,
		     size_t ring_len, uint64_t ring_type, void **db)
{
	long page = sysconf(_SC_PAGESIZE);
	int ret;

	*ring = NULL;
	*db = NULL;
	m->domain = pd ? vrdma_domain_get(pd) : NULL;
	m->ring_type = ring_type;
	*ring = vrdma_alloc_buf(m->domain, ring_len, page, ring_type,
				&m->ring_custom);
	if (!*ring)
		goto err;
	*db = vrdma_alloc_buf(m->domain, 128, 128, VRDMA_RES_TYPE_DBR,
			      &m->db_custom);
	if (!*db)
		goto err;
	return 0;
err:
	ret = errno ? errno : ENOMEM;
	vrdma_qmem_free(m, *ring, NULL);
	*ring = NULL;
	return ret;
}

void vrdma_qmem_free(struct vrdma_qmem *m, void *ring, void *db)
{
	vrdma_free_buf(m->domain, ring, m->ring_type, m->ring_custom);
	vrdma_free_buf(m->domain, db, VRDMA_RES_TYPE_DBR, m->db_custom);
	vrdma_domain_put(m->domain);
	m->domain = NULL;
}
