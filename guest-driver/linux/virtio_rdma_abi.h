/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * virtio-rdma device ABI: the wire structures and constants of
 * docs/virtio-rdma-spec.md. Generated from the virtio-rdma-abi crate by
 * abi/tests/c_header.rs; do not edit. Used by the kernel driver and the
 * rdma-core provider alike.
 */
#ifndef _VIRTIO_RDMA_ABI_H
#define _VIRTIO_RDMA_ABI_H

#ifdef __KERNEL__
#include <linux/build_bug.h>
#else
#include <assert.h>
#endif
#include <linux/types.h>

#define VIRTIO_RDMA_ABI_VERSION 3
#define VIRTIO_RDMA_MIN_COMPATIBLE_ABI_VERSION 2
#define VIRTIO_RDMA_DEVICE_ID 42

#define VIRTIO_RDMA_CONTROLQ 0
#define VIRTIO_RDMA_EVENTQ 1
#define VIRTIO_RDMA_NOTIFYQ 2
#define VIRTIO_RDMA_NUM_QUEUES 3

/* Device feature bit numbers (chapter 4). */
#define VIRTIO_RDMA_F_UD 0
#define VIRTIO_RDMA_F_SRQ 1
#define VIRTIO_RDMA_F_ATOMIC 2
#define VIRTIO_RDMA_F_SHMEM_DOORBELL 3
#define VIRTIO_RDMA_F_GSI 4
#define VIRTIO_RDMA_F_MEM_MGT 5
#define VIRTIO_RDMA_F_RESIZE 6
#define VIRTIO_RDMA_F_MW 7
#define VIRTIO_RDMA_F_UC 8
#define VIRTIO_RDMA_F_XRC 9
#define VIRTIO_RDMA_F_MCAST 10

/* Sizes, doorbell constants and WQE/CQE flags (sections 11.1, 18.4, 18.7, 18.8, 18.14). */
#define VIRTIO_RDMA_CQE_SIZE 32
#define VIRTIO_RDMA_SEND_WQE_HEADER 64
#define VIRTIO_RDMA_RECV_WQE_HEADER 16
#define VIRTIO_RDMA_SGE_SIZE 16
#define VIRTIO_RDMA_DB_RECORD_SIZE 128
#define VIRTIO_RDMA_LIST_PAGE_SIZE 4096
#define VIRTIO_RDMA_LIST_PAGE_ENTRIES 512
#define VIRTIO_RDMA_MIN_PAGE_SHIFT 12
#define VIRTIO_RDMA_MAX_PAGE_SHIFT 30
#define VIRTIO_RDMA_ACCESS_LOCAL_WRITE 1
#define VIRTIO_RDMA_ACCESS_REMOTE_READ 2
#define VIRTIO_RDMA_ACCESS_REMOTE_WRITE 4
#define VIRTIO_RDMA_ACCESS_REMOTE_ATOMIC 8
#define VIRTIO_RDMA_ACCESS_MW_BIND 16
#define VIRTIO_RDMA_MW_TYPE_1 1
#define VIRTIO_RDMA_MW_TYPE_2 2
#define VIRTIO_RDMA_MCAST_QPN 16777215
#define VIRTIO_RDMA_MAX_XRCD 64
#define VIRTIO_RDMA_MAX_MCAST_GRP 64
#define VIRTIO_RDMA_MAX_MCAST_QP_ATTACH 16
#define VIRTIO_RDMA_REREG_TRANSLATION 1
#define VIRTIO_RDMA_REREG_PD 2
#define VIRTIO_RDMA_REREG_ACCESS 4
#define VIRTIO_RDMA_SRQ_ATTR_MAX_WR 1
#define VIRTIO_RDMA_SRQ_ATTR_LIMIT 2
#define VIRTIO_RDMA_DB_DRIVER_OFFSET 0
#define VIRTIO_RDMA_DB_DEVICE_OFFSET 64
#define VIRTIO_RDMA_DB_FLAG_KICK 1
#define VIRTIO_RDMA_DB_FLAG_POLLING 2
#define VIRTIO_RDMA_SHMEM_ID_DOORBELL 0
#define VIRTIO_RDMA_DB_PAGE_SIZE 4096
#define VIRTIO_RDMA_DB_SLOT_OFFSET 64
#define VIRTIO_RDMA_DB_SLOT_SIZE 8
#define VIRTIO_RDMA_DB_PAGE_SLOTS 504
#define VIRTIO_RDMA_WQE_SIGNALED 1
#define VIRTIO_RDMA_WQE_SOLICITED 2
#define VIRTIO_RDMA_WQE_INLINE 4
#define VIRTIO_RDMA_WQE_FENCE 8
#define VIRTIO_RDMA_CQE_WITH_IMM 1
#define VIRTIO_RDMA_CQE_GRH 2
#define VIRTIO_RDMA_CQE_SOLICITED 4
#define VIRTIO_RDMA_CQE_WITH_INV 8
#define VIRTIO_RDMA_REG_MR_MIN_PAGE_SHIFT 12
#define VIRTIO_RDMA_REG_MR_MAX_PAGE_SHIFT 30
#define VIRTIO_RDMA_GSI_QPN 1
#define VIRTIO_RDMA_GSI_QKEY 2147549184
#define VIRTIO_RDMA_MAX_MAD_BYTES 256
#define VIRTIO_RDMA_MAX_GSI_DEPTH 256
#define VIRTIO_RDMA_DB_NONE 0xffffffffU

/* MODIFY_QP attribute mask bits (section 12.13). */
#define VIRTIO_RDMA_ATTR_STATE 0x1
#define VIRTIO_RDMA_ATTR_CUR_STATE 0x2
#define VIRTIO_RDMA_ATTR_ACCESS 0x4
#define VIRTIO_RDMA_ATTR_PKEY_INDEX 0x8
#define VIRTIO_RDMA_ATTR_PORT 0x10
#define VIRTIO_RDMA_ATTR_QKEY 0x20
#define VIRTIO_RDMA_ATTR_AV 0x40
#define VIRTIO_RDMA_ATTR_PATH_MTU 0x80
#define VIRTIO_RDMA_ATTR_TIMEOUT 0x100
#define VIRTIO_RDMA_ATTR_RETRY_CNT 0x200
#define VIRTIO_RDMA_ATTR_RNR_RETRY 0x400
#define VIRTIO_RDMA_ATTR_RQ_PSN 0x800
#define VIRTIO_RDMA_ATTR_MAX_RD_ATOMIC 0x1000
#define VIRTIO_RDMA_ATTR_MIN_RNR_TIMER 0x2000
#define VIRTIO_RDMA_ATTR_SQ_PSN 0x4000
#define VIRTIO_RDMA_ATTR_MAX_DEST_RD_ATOMIC 0x8000
#define VIRTIO_RDMA_ATTR_DEST_QPN 0x10000
#define VIRTIO_RDMA_ATTR_EN_SQD_ASYNC_NOTIFY 0x20000

enum virtio_rdma_opcode {
	VIRTIO_RDMA_OP_QUERY_DEVICE = 0x1,
	VIRTIO_RDMA_OP_QUERY_PORT = 0x2,
	VIRTIO_RDMA_OP_QUERY_GID = 0x3,
	VIRTIO_RDMA_OP_CREATE_CTX = 0x10,
	VIRTIO_RDMA_OP_DESTROY_CTX = 0x11,
	VIRTIO_RDMA_OP_ALLOC_PD = 0x20,
	VIRTIO_RDMA_OP_DEALLOC_PD = 0x21,
	VIRTIO_RDMA_OP_OPEN_XRCD = 0x22,
	VIRTIO_RDMA_OP_CLOSE_XRCD = 0x23,
	VIRTIO_RDMA_OP_CREATE_CQ = 0x30,
	VIRTIO_RDMA_OP_DESTROY_CQ = 0x31,
	VIRTIO_RDMA_OP_RESIZE_CQ = 0x32,
	VIRTIO_RDMA_OP_REG_MR = 0x40,
	VIRTIO_RDMA_OP_DEREG_MR = 0x41,
	VIRTIO_RDMA_OP_ALLOC_MR = 0x42,
	VIRTIO_RDMA_OP_REREG_MR = 0x43,
	VIRTIO_RDMA_OP_ALLOC_MW = 0x44,
	VIRTIO_RDMA_OP_DEALLOC_MW = 0x45,
	VIRTIO_RDMA_OP_CREATE_QP = 0x50,
	VIRTIO_RDMA_OP_MODIFY_QP = 0x51,
	VIRTIO_RDMA_OP_QUERY_QP = 0x52,
	VIRTIO_RDMA_OP_DESTROY_QP = 0x53,
	VIRTIO_RDMA_OP_CREATE_AH = 0x60,
	VIRTIO_RDMA_OP_DESTROY_AH = 0x61,
	VIRTIO_RDMA_OP_ATTACH_MCAST = 0x62,
	VIRTIO_RDMA_OP_DETACH_MCAST = 0x63,
	VIRTIO_RDMA_OP_CREATE_SRQ = 0x70,
	VIRTIO_RDMA_OP_MODIFY_SRQ = 0x71,
	VIRTIO_RDMA_OP_QUERY_SRQ = 0x72,
	VIRTIO_RDMA_OP_DESTROY_SRQ = 0x73,
	VIRTIO_RDMA_OP_CREATE_XRC_SRQ = 0x74,
};

enum virtio_rdma_page_list_mode {
	VIRTIO_RDMA_PAGES_INLINE = 0x1,
	VIRTIO_RDMA_PAGES_INDIRECT = 0x2,
	VIRTIO_RDMA_PAGES_CONTIGUOUS = 0x3,
};

enum virtio_rdma_qp_state {
	VIRTIO_RDMA_QPS_RESET = 0x0,
	VIRTIO_RDMA_QPS_INIT = 0x1,
	VIRTIO_RDMA_QPS_RTR = 0x2,
	VIRTIO_RDMA_QPS_RTS = 0x3,
	VIRTIO_RDMA_QPS_SQD = 0x4,
	VIRTIO_RDMA_QPS_SQE = 0x5,
	VIRTIO_RDMA_QPS_ERR = 0x6,
};

enum virtio_rdma_qp_type {
	VIRTIO_RDMA_QPT_RC = 0x1,
	VIRTIO_RDMA_QPT_UD = 0x2,
	VIRTIO_RDMA_QPT_GSI = 0x3,
	VIRTIO_RDMA_QPT_UC = 0x4,
	VIRTIO_RDMA_QPT_XRC_INI = 0x5,
	VIRTIO_RDMA_QPT_XRC_TGT = 0x6,
};

enum virtio_rdma_mtu {
	VIRTIO_RDMA_MTU_256 = 0x1,
	VIRTIO_RDMA_MTU_512 = 0x2,
	VIRTIO_RDMA_MTU_1024 = 0x3,
	VIRTIO_RDMA_MTU_2048 = 0x4,
	VIRTIO_RDMA_MTU_4096 = 0x5,
};

enum virtio_rdma_status {
	VIRTIO_RDMA_S_OK = 0x0,
	VIRTIO_RDMA_S_UNSUPPORTED = 0x1,
	VIRTIO_RDMA_S_INVALID = 0x2,
	VIRTIO_RDMA_S_BAD_HANDLE = 0x3,
	VIRTIO_RDMA_S_BUSY = 0x4,
	VIRTIO_RDMA_S_QUOTA = 0x5,
	VIRTIO_RDMA_S_BAD_ADDRESS = 0x6,
	VIRTIO_RDMA_S_RANGE = 0x7,
	VIRTIO_RDMA_S_BAD_STATE = 0x8,
	VIRTIO_RDMA_S_MISMATCH = 0x9,
	VIRTIO_RDMA_S_NO_MEMORY = 0xa,
	VIRTIO_RDMA_S_DENIED = 0xb,
	VIRTIO_RDMA_S_INTERNAL = 0xc,
};

enum virtio_rdma_event_kind {
	VIRTIO_RDMA_EV_CQ_COMPLETION = 0x1,
	VIRTIO_RDMA_EV_CQ_ERROR = 0x2,
	VIRTIO_RDMA_EV_QP_FATAL = 0x3,
	VIRTIO_RDMA_EV_QP_REQ_ERROR = 0x4,
	VIRTIO_RDMA_EV_QP_ACCESS_ERROR = 0x5,
	VIRTIO_RDMA_EV_QP_COMM_EST = 0x6,
	VIRTIO_RDMA_EV_QP_SQ_DRAINED = 0x7,
	VIRTIO_RDMA_EV_QP_LAST_WQE_REACHED = 0x8,
	VIRTIO_RDMA_EV_SRQ_LIMIT_REACHED = 0x9,
	VIRTIO_RDMA_EV_SRQ_ERROR = 0xa,
	VIRTIO_RDMA_EV_PORT_ACTIVE = 0xb,
	VIRTIO_RDMA_EV_PORT_ERROR = 0xc,
	VIRTIO_RDMA_EV_GID_CHANGE = 0xd,
	VIRTIO_RDMA_EV_DEVICE_FATAL = 0xe,
	VIRTIO_RDMA_EV_EVENTS_LOST = 0xf,
};

enum virtio_rdma_wr_opcode {
	VIRTIO_RDMA_WR_RDMA_WRITE = 0x0,
	VIRTIO_RDMA_WR_RDMA_WRITE_WITH_IMM = 0x1,
	VIRTIO_RDMA_WR_SEND = 0x2,
	VIRTIO_RDMA_WR_SEND_WITH_IMM = 0x3,
	VIRTIO_RDMA_WR_RDMA_READ = 0x4,
	VIRTIO_RDMA_WR_ATOMIC_CMP_AND_SWP = 0x5,
	VIRTIO_RDMA_WR_ATOMIC_FETCH_AND_ADD = 0x6,
	VIRTIO_RDMA_WR_REG_MR = 0x7,
	VIRTIO_RDMA_WR_LOCAL_INV = 0x8,
	VIRTIO_RDMA_WR_SEND_WITH_INV = 0x9,
	VIRTIO_RDMA_WR_BIND_MW = 0xa,
};

enum virtio_rdma_wc_opcode {
	VIRTIO_RDMA_WC_SEND = 0x0,
	VIRTIO_RDMA_WC_RDMA_WRITE = 0x1,
	VIRTIO_RDMA_WC_RDMA_READ = 0x2,
	VIRTIO_RDMA_WC_COMP_SWAP = 0x3,
	VIRTIO_RDMA_WC_FETCH_ADD = 0x4,
	VIRTIO_RDMA_WC_REG_MR = 0x5,
	VIRTIO_RDMA_WC_LOCAL_INV = 0x6,
	VIRTIO_RDMA_WC_BIND_MW = 0x7,
	VIRTIO_RDMA_WC_RECV = 0x80,
	VIRTIO_RDMA_WC_RECV_RDMA_WITH_IMM = 0x81,
};

enum virtio_rdma_wc_status {
	VIRTIO_RDMA_WC_SUCCESS = 0x0,
	VIRTIO_RDMA_WC_LOC_LEN_ERR = 0x1,
	VIRTIO_RDMA_WC_LOC_QP_OP_ERR = 0x2,
	VIRTIO_RDMA_WC_LOC_PROT_ERR = 0x3,
	VIRTIO_RDMA_WC_WR_FLUSH_ERR = 0x4,
	VIRTIO_RDMA_WC_BAD_RESP_ERR = 0x5,
	VIRTIO_RDMA_WC_LOC_ACCESS_ERR = 0x6,
	VIRTIO_RDMA_WC_REM_INV_REQ_ERR = 0x7,
	VIRTIO_RDMA_WC_REM_ACCESS_ERR = 0x8,
	VIRTIO_RDMA_WC_REM_OP_ERR = 0x9,
	VIRTIO_RDMA_WC_RETRY_EXC_ERR = 0xa,
	VIRTIO_RDMA_WC_RNR_RETRY_EXC_ERR = 0xb,
	VIRTIO_RDMA_WC_FATAL_ERR = 0xc,
	VIRTIO_RDMA_WC_MW_BIND_ERR = 0xd,
};

struct virtio_rdma_device_config {
	__le32 abi_version;
	__le32 max_ctx;
	__le32 max_pd;
	__le32 max_cq;
	__le32 max_qp;
	__le32 max_mr;
	__le32 max_srq;
	__le32 max_ah;
	__le32 max_cqe;
	__le32 max_qp_wr;
	__le32 max_srq_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 max_inline_pages;
	__le32 max_qp_rd_atom;
	__le64 max_mr_size;
	__le64 max_mr_bytes;
	__le64 page_size_cap;
	__u8 mac[6];
	__le16 reserved;
};

static_assert(sizeof(struct virtio_rdma_device_config) == 96);

struct virtio_rdma_request_header {
	__le64 request_id;
	__le32 opcode;
	__le32 reserved;
};

static_assert(sizeof(struct virtio_rdma_request_header) == 16);

struct virtio_rdma_response_header {
	__le64 request_id;
	__le32 status;
	__le32 detail;
};

static_assert(sizeof(struct virtio_rdma_response_header) == 16);

struct virtio_rdma_event {
	__le32 kind;
	__le32 handle;
	__le32 detail;
	__le32 seq;
};

static_assert(sizeof(struct virtio_rdma_event) == 16);

struct virtio_rdma_buffer_desc {
	__le64 addr;
	__le32 npages;
	__le32 first_page_offset;
	__le32 page_shift;
	__le32 mode;
};

static_assert(sizeof(struct virtio_rdma_buffer_desc) == 24);

struct virtio_rdma_address_vector {
	__u8 dgid[16];
	__le32 flow_label;
	__u8 sgid_index;
	__u8 hop_limit;
	__u8 traffic_class;
	__u8 sl;
};

static_assert(sizeof(struct virtio_rdma_address_vector) == 24);

struct virtio_rdma_qp_attr {
	__le32 qp_state;
	__le32 cur_qp_state;
	__le32 access;
	__le32 pkey_index;
	__le32 port;
	__le32 qkey;
	__le32 path_mtu;
	__le32 timeout;
	__le32 retry_cnt;
	__le32 rnr_retry;
	__le32 min_rnr_timer;
	__le32 rq_psn;
	__le32 sq_psn;
	__le32 dest_qpn;
	__le32 max_rd_atomic;
	__le32 max_dest_rd_atomic;
	__le32 en_sqd_async_notify;
	__le32 sq_draining;
	struct virtio_rdma_address_vector av;
};

static_assert(sizeof(struct virtio_rdma_qp_attr) == 96);

struct virtio_rdma_device_attr {
	__le64 fw_version;
	__le64 node_guid;
	__le64 sys_image_guid;
	__le64 max_mr_size;
	__le64 max_mr_bytes;
	__le64 page_size_cap;
	__le32 vendor_id;
	__le32 vendor_part_id;
	__le32 hw_version;
	__le32 phys_port_cnt;
	__le32 max_ctx;
	__le32 max_pd;
	__le32 max_cq;
	__le32 max_qp;
	__le32 max_mr;
	__le32 max_srq;
	__le32 max_ah;
	__le32 max_cqe;
	__le32 max_qp_wr;
	__le32 max_srq_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 max_inline_pages;
	__le32 max_qp_rd_atom;
	__le32 max_qp_init_rd_atom;
	__le32 max_mr_pages;
	__le32 atomic_caps;
	__le32 local_ca_ack_delay;
	__le32 local_dma_lkey;
	__le32 max_fast_reg_pages;
	__le32 reserved;
};

static_assert(sizeof(struct virtio_rdma_device_attr) == 152);

struct virtio_rdma_query_port_req {
	__le32 port;
};

static_assert(sizeof(struct virtio_rdma_query_port_req) == 4);

struct virtio_rdma_port_attr {
	__le32 state;
	__le32 max_mtu;
	__le32 active_mtu;
	__le32 gid_tbl_len;
	__le32 pkey_tbl_len;
	__le32 max_msg_size;
	__le32 link_rate_mbps;
	__le32 max_ud_payload;
	__le32 phys_state;
	__le32 active_speed;
	__le32 active_width;
};

static_assert(sizeof(struct virtio_rdma_port_attr) == 44);

struct virtio_rdma_query_gid_req {
	__le32 port;
	__le32 index;
};

static_assert(sizeof(struct virtio_rdma_query_gid_req) == 8);

struct virtio_rdma_query_gid_resp {
	__u8 gid[16];
	__le32 gid_type;
	__le32 reserved;
};

static_assert(sizeof(struct virtio_rdma_query_gid_resp) == 24);

struct virtio_rdma_create_ctx_req {
	__le64 db_gpa;
};

static_assert(sizeof(struct virtio_rdma_create_ctx_req) == 8);

struct virtio_rdma_create_ctx_resp {
	__le32 ctx_handle;
	__le32 doorbell_page;
};

static_assert(sizeof(struct virtio_rdma_create_ctx_resp) == 8);

struct virtio_rdma_ctx_handle_req {
	__le32 ctx_handle;
};

static_assert(sizeof(struct virtio_rdma_ctx_handle_req) == 4);

struct virtio_rdma_pd_handle_req {
	__le32 pd_handle;
};

static_assert(sizeof(struct virtio_rdma_pd_handle_req) == 4);

struct virtio_rdma_pd_handle_resp {
	__le32 pd_handle;
};

static_assert(sizeof(struct virtio_rdma_pd_handle_resp) == 4);

struct virtio_rdma_xrcd_handle {
	__le32 xrcd_handle;
};

static_assert(sizeof(struct virtio_rdma_xrcd_handle) == 4);

struct virtio_rdma_create_cq_req {
	__le32 ctx_handle;
	__le32 depth;
	__le64 db_gpa;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_create_cq_req) == 40);

struct virtio_rdma_cq_handle_req {
	__le32 cq_handle;
};

static_assert(sizeof(struct virtio_rdma_cq_handle_req) == 4);

struct virtio_rdma_cq_handle_resp {
	__le32 cq_handle;
};

static_assert(sizeof(struct virtio_rdma_cq_handle_resp) == 4);

struct virtio_rdma_resize_cq_req {
	__le32 cq_handle;
	__le32 depth;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_resize_cq_req) == 32);

struct virtio_rdma_reg_mr_req {
	__le32 pd_handle;
	__le32 access;
	__le64 iova;
	__le64 length;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_reg_mr_req) == 48);

struct virtio_rdma_reg_mr_resp {
	__le32 mr_handle;
	__le32 lkey;
	__le32 rkey;
};

static_assert(sizeof(struct virtio_rdma_reg_mr_resp) == 12);

struct virtio_rdma_mr_handle_req {
	__le32 mr_handle;
};

static_assert(sizeof(struct virtio_rdma_mr_handle_req) == 4);

struct virtio_rdma_alloc_mr_req {
	__le32 pd_handle;
	__le32 max_num_sg;
};

static_assert(sizeof(struct virtio_rdma_alloc_mr_req) == 8);

struct virtio_rdma_mcast_req {
	__le32 qp_handle;
	__le32 reserved;
	__u8 mgid[16];
};

static_assert(sizeof(struct virtio_rdma_mcast_req) == 24);

struct virtio_rdma_rereg_mr_req {
	__le32 mr_handle;
	__le32 flags;
	__le32 pd_handle;
	__le32 access;
	__le64 iova;
	__le64 length;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_rereg_mr_req) == 56);

struct virtio_rdma_alloc_mw_req {
	__le32 pd_handle;
	__le32 mw_type;
};

static_assert(sizeof(struct virtio_rdma_alloc_mw_req) == 8);

struct virtio_rdma_alloc_mw_resp {
	__le32 mw_handle;
	__le32 rkey;
};

static_assert(sizeof(struct virtio_rdma_alloc_mw_resp) == 8);

struct virtio_rdma_mw_handle_req {
	__le32 mw_handle;
};

static_assert(sizeof(struct virtio_rdma_mw_handle_req) == 4);

struct virtio_rdma_create_qp_req {
	__le32 pd_handle;
	__le32 qp_type;
	__le32 send_cq;
	__le32 recv_cq;
	__le32 srq_handle;
	__le32 flags;
	__le32 sq_depth;
	__le32 rq_depth;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 xrcd_handle;
	__le64 db_gpa;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_create_qp_req) == 80);

struct virtio_rdma_create_qp_resp {
	__le32 qp_handle;
	__le32 qpn;
	__le32 sq_wqe_shift;
	__le32 rq_wqe_shift;
	__le32 rq_offset;
	__le32 db_slot;
};

static_assert(sizeof(struct virtio_rdma_create_qp_resp) == 24);

struct virtio_rdma_modify_qp_req {
	__le32 qp_handle;
	__le32 attr_mask;
	struct virtio_rdma_qp_attr attr;
};

static_assert(sizeof(struct virtio_rdma_modify_qp_req) == 104);

struct virtio_rdma_qp_handle_req {
	__le32 qp_handle;
};

static_assert(sizeof(struct virtio_rdma_qp_handle_req) == 4);

struct virtio_rdma_query_qp_resp {
	struct virtio_rdma_qp_attr attr;
	__le32 qp_type;
	__le32 qpn;
	__le32 sq_depth;
	__le32 rq_depth;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 srq_handle;
};

static_assert(sizeof(struct virtio_rdma_query_qp_resp) == 128);

struct virtio_rdma_create_ah_req {
	__le32 pd_handle;
	__le32 port;
	struct virtio_rdma_address_vector av;
};

static_assert(sizeof(struct virtio_rdma_create_ah_req) == 32);

struct virtio_rdma_ah_handle_req {
	__le32 ah_handle;
};

static_assert(sizeof(struct virtio_rdma_ah_handle_req) == 4);

struct virtio_rdma_ah_handle_resp {
	__le32 ah_handle;
};

static_assert(sizeof(struct virtio_rdma_ah_handle_resp) == 4);

struct virtio_rdma_create_srq_req {
	__le32 pd_handle;
	__le32 depth;
	__le32 max_sge;
	__le32 limit;
	__le64 db_gpa;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_create_srq_req) == 48);

struct virtio_rdma_create_srq_resp {
	__le32 srq_handle;
	__le32 wqe_shift;
	__le32 db_slot;
	__le32 srqn;
};

static_assert(sizeof(struct virtio_rdma_create_srq_resp) == 16);

struct virtio_rdma_create_xrc_srq_req {
	__le32 pd_handle;
	__le32 depth;
	__le32 max_sge;
	__le32 limit;
	__le32 xrcd_handle;
	__le32 cq_handle;
	__le64 db_gpa;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_create_xrc_srq_req) == 56);

struct virtio_rdma_modify_srq_req {
	__le32 srq_handle;
	__le32 attr_mask;
	__le32 max_wr;
	__le32 limit;
};

static_assert(sizeof(struct virtio_rdma_modify_srq_req) == 16);

struct virtio_rdma_modify_srq_resize_req {
	__le32 srq_handle;
	__le32 attr_mask;
	__le32 max_wr;
	__le32 limit;
	struct virtio_rdma_buffer_desc buf;
};

static_assert(sizeof(struct virtio_rdma_modify_srq_resize_req) == 40);

struct virtio_rdma_srq_handle_req {
	__le32 srq_handle;
};

static_assert(sizeof(struct virtio_rdma_srq_handle_req) == 4);

struct virtio_rdma_query_srq_resp {
	__le32 depth;
	__le32 max_sge;
	__le32 limit;
};

static_assert(sizeof(struct virtio_rdma_query_srq_resp) == 12);

struct virtio_rdma_qp_doorbell {
	__le32 sq_pi;
	__le32 rq_pi;
	__le64 reserved0;
	__le64 reserved1;
	__le64 reserved2;
	__le64 reserved3;
	__le64 reserved4;
	__le64 reserved5;
	__le64 reserved6;
	__le32 sq_ci;
	__le32 rq_ci;
	__le64 reserved7;
	__le64 reserved8;
	__le64 reserved9;
	__le64 reserved10;
	__le64 reserved11;
	__le64 reserved12;
	__le64 reserved13;
};

static_assert(sizeof(struct virtio_rdma_qp_doorbell) == 128);

struct virtio_rdma_cq_doorbell {
	__le32 ci;
	__le32 arm;
	__le64 reserved0;
	__le64 reserved1;
	__le64 reserved2;
	__le64 reserved3;
	__le64 reserved4;
	__le64 reserved5;
	__le64 reserved6;
	__le32 pi;
	__le32 armed_seq;
	__le64 reserved7;
	__le64 reserved8;
	__le64 reserved9;
	__le64 reserved10;
	__le64 reserved11;
	__le64 reserved12;
	__le64 reserved13;
};

static_assert(sizeof(struct virtio_rdma_cq_doorbell) == 128);

struct virtio_rdma_srq_doorbell {
	__le32 pi;
	__le32 reserved0;
	__le64 reserved1;
	__le64 reserved2;
	__le64 reserved3;
	__le64 reserved4;
	__le64 reserved5;
	__le64 reserved6;
	__le64 reserved7;
	__le32 ci;
	__le32 reserved8;
	__le64 reserved9;
	__le64 reserved10;
	__le64 reserved11;
	__le64 reserved12;
	__le64 reserved13;
	__le64 reserved14;
	__le64 reserved15;
};

static_assert(sizeof(struct virtio_rdma_srq_doorbell) == 128);

struct virtio_rdma_ctx_doorbell {
	__le32 flags;
	__le32 reserved0;
	__le64 reserved1;
	__le64 reserved2;
	__le64 reserved3;
	__le64 reserved4;
	__le64 reserved5;
	__le64 reserved6;
	__le64 reserved7;
};

static_assert(sizeof(struct virtio_rdma_ctx_doorbell) == 64);

struct virtio_rdma_db_page_header {
	__le32 flags;
	__le32 reserved0;
	__le64 reserved1;
	__le64 reserved2;
	__le64 reserved3;
	__le64 reserved4;
	__le64 reserved5;
	__le64 reserved6;
	__le64 reserved7;
};

static_assert(sizeof(struct virtio_rdma_db_page_header) == 64);

struct virtio_rdma_qp_db_slot {
	__le32 sq_pi;
	__le32 rq_pi;
};

static_assert(sizeof(struct virtio_rdma_qp_db_slot) == 8);

struct virtio_rdma_srq_db_slot {
	__le32 pi;
	__le32 reserved;
};

static_assert(sizeof(struct virtio_rdma_srq_db_slot) == 8);

struct virtio_rdma_send_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 num_sge;
	__le32 imm_data;
	__le64 remote_addr;
	__le32 rkey;
	__le32 inline_len;
	__le64 compare_add;
	__le64 swap;
	__le32 ah_handle;
	__le32 remote_qpn;
	__le32 remote_qkey;
	__le32 xrc_srqn;
};

static_assert(sizeof(struct virtio_rdma_send_wqe) == 64);

struct virtio_rdma_sge {
	__le64 addr;
	__le32 length;
	__le32 lkey;
};

static_assert(sizeof(struct virtio_rdma_sge) == 16);

struct virtio_rdma_reg_mr_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 reserved0;
	__le32 key;
	__le64 iova;
	__le64 length;
	__le64 pages_gpa;
	__le32 mr_handle;
	__le32 access;
	__le32 npages;
	__le32 page_shift;
	__le64 reserved1;
};

static_assert(sizeof(struct virtio_rdma_reg_mr_wqe) == 64);

struct virtio_rdma_bind_mw_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 reserved0;
	__le32 new_rkey;
	__le64 addr;
	__le64 length;
	__le32 mw_handle;
	__le32 mr_lkey;
	__le32 access;
	__le32 reserved1;
	__le64 reserved2;
	__le64 reserved3;
};

static_assert(sizeof(struct virtio_rdma_bind_mw_wqe) == 64);

struct virtio_rdma_recv_wqe {
	__le64 wr_id;
	__le32 num_sge;
	__le32 reserved;
};

static_assert(sizeof(struct virtio_rdma_recv_wqe) == 16);

struct virtio_rdma_cqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 status;
	__u8 flags;
	__u8 owner;
	__le32 byte_len;
	__le32 imm_data;
	__le32 qpn;
	__le32 src_qpn;
	__le32 vendor_err;
};

static_assert(sizeof(struct virtio_rdma_cqe) == 32);

#endif /* _VIRTIO_RDMA_ABI_H */
