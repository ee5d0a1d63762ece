//! A mock transport: DMA memory from the heap (guest-physical address =
//! driver address), a device that answers control commands minimally and
//! records them, recorded notifications, and an event queue tests fill.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use virtio_rdma_abi::config::{DeviceConfig, F_ATOMIC, F_SRQ, F_UD};
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, ResponseHeader, Status};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::mem::{qp_buffer_layout, recv_wqe_shift, PageListMode};
use virtio_rdma_abi::verbs::*;
use virtio_rdma_abi::{Field, Wire, ABI_VERSION};

use crate::transport::{DmaRegion, Token, Transport, TransportError};

pub const PAGE_SHIFT: u32 = 12;
/// The MAC address the mock device reports (`DeviceConfig.mac`).
pub const MOCK_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x07];
const PAGE: usize = 1 << PAGE_SHIFT;

/// Heap memory posing as DMA memory.
#[derive(Debug)]
pub struct MockDma {
    ptr: *mut u8,
    layout: Layout,
    len: usize,
    pages: Vec<u64>,
}

// SAFETY: the allocation is owned by this value and only accessed through
// raw pointers by the driver.
unsafe impl Send for MockDma {}
// SAFETY: as above; the struct itself is immutable.
unsafe impl Sync for MockDma {}

// SAFETY: `ptr` is a live heap allocation of `len` bytes owned by this value
// and aligned as requested; pages are the identity addresses of the pages
// covering it.
unsafe impl DmaRegion for MockDma {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn page_shift(&self) -> u32 {
        PAGE_SHIFT
    }
    fn first_page_offset(&self) -> u32 {
        (self.ptr as usize % PAGE) as u32
    }
    fn pages(&self) -> &[u64] {
        &self.pages
    }
}

impl Drop for MockDma {
    fn drop(&mut self) {
        // SAFETY: allocated in `Mock::alloc_dma` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// One recorded control request.
#[derive(Debug, Clone)]
pub struct Request {
    pub opcode: Opcode,
    /// Bytes after the request header.
    pub payload: Vec<u8>,
}

/// The mock device.
#[derive(Debug)]
pub struct Mock {
    pub features: u64,
    pub config: DeviceConfig,
    pub requests: Mutex<Vec<Request>>,
    responses: Mutex<HashMap<Token, Vec<u8>>>,
    next: AtomicU32,
    pub notifies: Mutex<Vec<u16>>,
    pub events: Mutex<VecDeque<Event>>,
    /// Fail the next command with this opcode with (status, detail).
    pub fail: Mutex<Option<(Opcode, Status, u32)>>,
    /// Page addresses read from the indirect list pages of the last REG_MR.
    pub indirect: Mutex<Vec<u64>>,
    /// For every wait: how many requests had been submitted then.
    pub waits: Mutex<Vec<usize>>,
}

impl Mock {
    pub fn new() -> Self {
        Mock {
            features: F_UD | F_SRQ | F_ATOMIC,
            config: DeviceConfig {
                abi_version: ABI_VERSION,
                max_ctx: 4,
                max_pd: 16,
                max_cq: 16,
                max_qp: 16,
                max_mr: 16,
                max_srq: 4,
                max_ah: 4,
                max_cqe: 4096,
                max_qp_wr: 1024,
                max_srq_wr: 1024,
                max_send_sge: 8,
                max_recv_sge: 8,
                max_inline_data: 256,
                max_inline_pages: 4,
                max_qp_rd_atom: 4,
                max_mr_size: 1 << 30,
                max_mr_bytes: 1 << 32,
                page_size_cap: 1 << 12,
                mac: MOCK_MAC,
                reserved: 0,
            },
            requests: Mutex::new(Vec::new()),
            responses: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            notifies: Mutex::new(Vec::new()),
            events: Mutex::new(VecDeque::new()),
            fail: Mutex::new(None),
            indirect: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
        }
    }

    /// Opcodes of the recorded requests.
    pub fn opcodes(&self) -> Vec<Opcode> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.opcode)
            .collect()
    }

    /// The last request with `opcode`.
    pub fn last(&self, opcode: Opcode) -> Option<Request> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r.opcode == opcode)
            .cloned()
    }

    pub fn notify_count(&self) -> usize {
        self.notifies.lock().unwrap().len()
    }

    /// Entries of the mock's GID table: 2 for version 3, 1 for version 2.
    fn gid_tbl_len(&self) -> u32 {
        if self.config.abi_version >= 3 {
            2
        } else {
            1
        }
    }

    fn id(&self) -> u32 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The device's answer: (status, detail, response payload).
    fn answer(&self, opcode: Opcode, p: &[u8]) -> (Status, u32, Vec<u8>) {
        let fail = *self.fail.lock().unwrap();
        if let Some((op, st, d)) = fail {
            if op == opcode {
                *self.fail.lock().unwrap() = None;
                return (st, d, Vec::new());
            }
        }
        let c = &self.config;
        let payload = match opcode {
            Opcode::QUERY_DEVICE => DeviceAttr {
                max_cqe: c.max_cqe,
                max_qp_wr: c.max_qp_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
                phys_port_cnt: 1,
                local_ca_ack_delay: 15,
                ..DeviceAttr::default()
            }
            .to_bytes(),
            Opcode::QUERY_PORT => PortAttr {
                state: PORT_STATE_ACTIVE,
                max_mtu: 5,
                active_mtu: 3,
                gid_tbl_len: self.gid_tbl_len(),
                pkey_tbl_len: 1,
                link_rate_mbps: 100_000,
                phys_state: PHYS_STATE_LINK_UP,
                active_speed: SPEED_EDR,
                active_width: WIDTH_4X,
                ..PortAttr::default()
            }
            .to_bytes(),
            Opcode::QUERY_GID => {
                // Version 3: the default GID, then the operator's
                // (`::ffff:10.0.0.7`); version 2: the operator's alone.
                let index = QueryGidReq::parse(p).unwrap().index;
                let operator = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7];
                let gid = match (self.gid_tbl_len(), index) {
                    (2, 0) => [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0, 6],
                    (n, i) if i + 1 == n => operator,
                    _ => return (Status::RANGE, 4, Vec::new()),
                };
                QueryGidResp {
                    gid,
                    gid_type: GID_TYPE_ROCE_V2,
                    reserved: 0,
                }
                .to_bytes()
            }
            Opcode::CREATE_CTX => CreateCtxResp {
                ctx_handle: self.id(),
                doorbell_page: u32::MAX,
            }
            .to_bytes(),
            Opcode::ALLOC_PD => self.id().to_le_bytes().to_vec(),
            Opcode::CREATE_CQ | Opcode::CREATE_AH => self.id().to_le_bytes().to_vec(),
            Opcode::REG_MR => {
                let (r, tail) = RegMrReq::parse_prefix(p).unwrap();
                if r.buf.mode == u32::from(PageListMode::INDIRECT) {
                    let mut got = Vec::new();
                    let mut left = r.buf.npages as usize;
                    for lp in tail.chunks(8) {
                        let gpa = u64::from_le_bytes(lp.try_into().unwrap());
                        let n = left.min(512);
                        for i in 0..n {
                            // SAFETY: guest-physical addresses are driver
                            // addresses here, and the list page is alive
                            // until the response.
                            let v = unsafe { std::ptr::read_volatile((gpa as *const u64).add(i)) };
                            got.push(v);
                        }
                        left -= n;
                    }
                    *self.indirect.lock().unwrap() = got;
                }
                let h = self.id();
                RegMrResp {
                    mr_handle: h,
                    lkey: 0x1000 + h,
                    rkey: 0x2000 + h,
                }
                .to_bytes()
            }
            Opcode::CREATE_QP => {
                let (r, _) = CreateQpReq::parse_prefix(p).unwrap();
                let l = qp_buffer_layout(
                    r.sq_depth,
                    r.rq_depth,
                    r.max_send_sge,
                    r.max_recv_sge,
                    r.max_inline_data,
                    r.buf.page_shift,
                );
                let h = self.id();
                CreateQpResp {
                    qp_handle: h,
                    qpn: 0x100 + h,
                    sq_wqe_shift: l.sq_wqe_shift,
                    rq_wqe_shift: l.rq_wqe_shift,
                    rq_offset: l.rq_offset as u32,
                    db_slot: virtio_rdma_abi::datapath::DB_NONE,
                }
                .to_bytes()
            }
            Opcode::CREATE_SRQ => {
                let (r, _) = CreateSrqReq::parse_prefix(p).unwrap();
                CreateSrqResp {
                    srq_handle: self.id(),
                    wqe_shift: recv_wqe_shift(r.max_sge),
                    db_slot: virtio_rdma_abi::datapath::DB_NONE,
                    srqn: 0,
                }
                .to_bytes()
            }
            Opcode::QUERY_QP => QueryQpResp::default().to_bytes(),
            Opcode::QUERY_SRQ => QuerySrqResp::default().to_bytes(),
            _ => Vec::new(),
        };
        (Status::OK, 0, payload)
    }
}

impl Transport for Mock {
    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self) -> Result<DeviceConfig, TransportError> {
        Ok(self.config)
    }

    fn dma_page_shift(&self) -> u32 {
        PAGE_SHIFT
    }

    fn alloc_dma(&self, len: usize, align: usize) -> Result<Box<dyn DmaRegion>, TransportError> {
        let layout = Layout::from_size_align(len.max(1), align.max(8))
            .map_err(|e| TransportError::Other(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        let start = ptr as usize;
        let first = start & !(PAGE - 1);
        let n = (start + len).div_ceil(PAGE) - first / PAGE;
        let pages = (0..n).map(|i| (first + i * PAGE) as u64).collect();
        Ok(Box::new(MockDma {
            ptr,
            layout,
            len,
            pages,
        }))
    }

    fn submit(&self, request: &[&[u8]], response_len: usize) -> Result<Token, TransportError> {
        let bytes: Vec<u8> = request.concat();
        let (h, payload) = RequestHeader::parse_prefix(&bytes).unwrap();
        let opcode = Opcode::from_u32(h.opcode).unwrap();
        let shape = opcode.shape();
        let resp_size = all_layouts_size(shape.response);
        assert_eq!(response_len, ResponseHeader::SIZE + resp_size, "{opcode:?}");
        self.requests.lock().unwrap().push(Request {
            opcode,
            payload: payload.to_vec(),
        });
        let (status, detail, body) = self.answer(opcode, payload);
        let mut resp = ResponseHeader {
            request_id: h.request_id,
            status: status.into(),
            detail,
        }
        .to_bytes();
        if status == Status::OK {
            resp.extend_from_slice(&body);
        }
        let token = u64::from(self.id());
        self.responses.lock().unwrap().insert(token, resp);
        Ok(token)
    }

    fn wait(&self, token: Token, _timeout: Option<Duration>) -> Result<Vec<u8>, TransportError> {
        let submitted = self.requests.lock().unwrap().len();
        self.waits.lock().unwrap().push(submitted);
        self.responses
            .lock()
            .unwrap()
            .remove(&token)
            .ok_or(TransportError::UnknownToken(token))
    }

    fn notify(&self, queue: u16) -> Result<(), TransportError> {
        self.notifies.lock().unwrap().push(queue);
        Ok(())
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<Event>, TransportError> {
        if let Some(ev) = self.events.lock().unwrap().pop_front() {
            return Ok(Some(ev));
        }
        if let Some(t) = timeout {
            std::thread::sleep(t.min(Duration::from_millis(5)));
        }
        Ok(None)
    }
}

fn all_layouts_size(name: &str) -> usize {
    if name == "none" {
        return 0;
    }
    virtio_rdma_abi::all_layouts()
        .into_iter()
        .find(|l| l.0 == name)
        .map(|l| l.2)
        .unwrap()
}
