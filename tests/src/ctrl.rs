//! Control-queue client: places requests (RequestHeader + payload + optional
//! page list) in guest memory as device-readable descriptors followed by a
//! device-writable response buffer, and matches completions to requests.
//!
//! Framing follows `docs/control-semantics.md`. The response buffer is
//! filled with `0xFF` before submission, so a header the device did not write
//! reads as status `0xFFFF_FFFF`.
//!
//! Requests complete in any order; [`CtrlQueue::wait`] waits for one id,
//! [`CtrlQueue::poll`] / [`CtrlQueue::wait_any`] return whatever completed.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use virtio_rdma_abi::ctrl::{RequestHeader, ResponseHeader, Status};
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestAddress;

use crate::error::{Error, Result};
use crate::guest_mem::PAGE_SIZE;
use crate::vring::{RawDesc, Seg, UsedElem, Vring, VringImage};

/// Byte the response buffer is filled with before submission.
pub const POISON: u8 = 0xFF;

/// A finished control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The handle returned at submission, unique among this client's
    /// requests (equal to `request_id` unless an explicit id was given).
    pub token: u64,
    /// `request_id` put in the request header (0 for raw chains).
    pub request_id: u64,
    /// Opcode submitted (0 for raw chains).
    pub opcode: u32,
    /// `request_id` as written in the response header by the device.
    pub resp_request_id: u64,
    /// `status` of the response header.
    pub status: u32,
    /// `detail` of the response header.
    pub detail: u32,
    /// Response bytes after the header, up to the used length (clipped to
    /// the writable size).
    pub payload: Vec<u8>,
    /// Used length reported by the device.
    pub used_len: u32,
    /// Head descriptor slot of the chain.
    pub head: u16,
}

impl Completion {
    /// The status as an ABI value (None if unknown).
    pub fn status(&self) -> Option<Status> {
        Status::from_u32(self.status)
    }

    /// Whether the device answered OK, with the right id and a header.
    pub fn is_ok(&self) -> bool {
        self.status == u32::from(Status::OK)
            && self.used_len as usize >= ResponseHeader::SIZE
            && self.resp_request_id == self.request_id
    }

    /// `Ok(self)` when [`Completion::is_ok`], otherwise [`Error::Status`].
    pub fn ok(self) -> Result<Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Status {
                opcode: self.opcode,
                status: self.status,
                name: self.status().map_or("?", Status::name),
                detail: self.detail,
            })
        }
    }

    /// Parses the payload as exactly one `T`.
    pub fn parse<T: Wire>(&self) -> Result<T> {
        Ok(T::parse(&self.payload)?)
    }
}

/// Everything about a request to submit; [`CtrlQueue::submit`] and friends
/// fill it in for the common cases.
#[derive(Debug, Clone)]
pub struct RequestSpec<'a> {
    /// `request_id` to put in the header; None picks the next free one.
    pub request_id: Option<u64>,
    /// `opcode` (any value, known or not).
    pub opcode: u32,
    /// The header's reserved field (must be 0 for a valid request).
    pub reserved: u32,
    /// Readable bytes after the header. The first part shares a descriptor
    /// with the header; every further part gets its own descriptor (an empty
    /// first part puts the header alone in the first descriptor).
    pub parts: &'a [&'a [u8]],
    /// Bytes of the writable buffer beyond the 16-byte response header.
    pub resp_payload_len: usize,
    /// Split the writable buffer into descriptors of at most this many bytes
    /// (None: one descriptor).
    pub writable_split: Option<usize>,
    /// Total writable bytes, overriding `16 + resp_payload_len` (to offer
    /// too small a buffer, for instance).
    pub writable_len: Option<usize>,
}

impl<'a> RequestSpec<'a> {
    /// A request with `opcode`, the readable `parts` and room for a response
    /// payload of `resp_payload_len` bytes.
    pub fn new(opcode: impl Into<u32>, parts: &'a [&'a [u8]], resp_payload_len: usize) -> Self {
        RequestSpec {
            request_id: None,
            opcode: opcode.into(),
            reserved: 0,
            parts,
            resp_payload_len,
            writable_split: None,
            writable_len: None,
        }
    }
}

/// One guest buffer of a request.
#[derive(Debug, Clone, Copy)]
struct Buf {
    gpa: GuestAddress,
    /// One pooled page (true) or an allocation of its own (false).
    pooled: bool,
}

#[derive(Debug)]
struct Pending {
    token: u64,
    request_id: u64,
    opcode: u32,
    bufs: Vec<Buf>,
    /// Writable area(s) in order, to read the response back.
    resp: Vec<(GuestAddress, usize)>,
}

/// A [`CtrlQueue`] as a VM that moves takes it along.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtrlImage {
    /// The queue.
    pub vring: VringImage,
    /// The next request id.
    pub next_id: u64,
    /// Spare single pages for small buffers.
    pub page_pool: Vec<u64>,
    /// Whether submissions notify the device at once.
    pub auto_kick: bool,
}

/// Control-queue client.
#[derive(Debug)]
pub struct CtrlQueue {
    vring: Vring,
    timeout: Duration,
    busy_poll: Option<Duration>,
    auto_kick: bool,
    next_id: u64,
    /// Head slot -> request in flight.
    pending: HashMap<u16, Pending>,
    /// Token -> head slot, for requests in flight.
    ids: HashMap<u64, u16>,
    /// Finished and not yet claimed, by token.
    done: HashMap<u64, Completion>,
    /// Tokens of `done`, in completion order.
    done_order: VecDeque<u64>,
    /// Used elements that matched nothing in flight.
    untracked: Vec<UsedElem>,
    /// Spare single pages for small buffers.
    page_pool: Vec<GuestAddress>,
}

impl CtrlQueue {
    /// A client over `vring` (the control queue) with the given default
    /// timeout for blocking calls.
    pub fn new(vring: Vring, timeout: Duration) -> Self {
        CtrlQueue {
            vring,
            timeout,
            busy_poll: None,
            auto_kick: true,
            next_id: 1,
            pending: HashMap::new(),
            ids: HashMap::new(),
            done: HashMap::new(),
            done_order: VecDeque::new(),
            untracked: Vec::new(),
            page_pool: Vec::new(),
        }
    }

    /// The client's image ([`crate::vm_image`]); none while a request is
    /// in flight or a completion was not taken (a VM moves between
    /// commands).
    pub fn image(&self) -> Result<CtrlImage> {
        if !self.pending.is_empty() || !self.done.is_empty() {
            return Err(Error::Backend(format!(
                "an image of a control queue with {} requests in flight and {} completions not \
                 taken",
                self.pending.len(),
                self.done.len()
            )));
        }
        Ok(CtrlImage {
            vring: self.vring.image(),
            next_id: self.next_id,
            page_pool: self.page_pool.iter().map(|g| g.0).collect(),
            auto_kick: self.auto_kick,
        })
    }

    /// The client of `image` over `vring` (restored from the image's).
    pub fn restore(vring: Vring, image: &CtrlImage, timeout: Duration) -> Self {
        let mut c = CtrlQueue::new(vring, timeout);
        c.next_id = image.next_id;
        c.page_pool = image.page_pool.iter().copied().map(GuestAddress).collect();
        c.auto_kick = image.auto_kick;
        c
    }

    /// The underlying virtqueue (for raw access).
    pub fn vring_mut(&mut self) -> &mut Vring {
        &mut self.vring
    }

    /// The underlying virtqueue.
    pub fn vring(&self) -> &Vring {
        &self.vring
    }

    /// Default timeout of [`CtrlQueue::wait`] and [`CtrlQueue::call`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Before sleeping on the call eventfd, spin on the used ring for up to
    /// this long (None: never spin). For latency benchmarks.
    pub fn set_busy_poll(&mut self, spin: Option<Duration>) {
        self.busy_poll = spin;
    }

    /// Spins on the used ring for the busy-poll time; true if something
    /// arrived.
    fn spin(&self) -> Result<bool> {
        let Some(spin) = self.busy_poll else {
            return Ok(false);
        };
        let until = Instant::now() + spin;
        loop {
            if self.vring.has_used()? {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// With auto-kick off, submissions are published but the device is only
    /// notified by [`CtrlQueue::kick`] (to batch many requests per kick).
    pub fn set_auto_kick(&mut self, on: bool) {
        self.auto_kick = on;
    }

    /// Notifies the device (subject to its notification suppression).
    pub fn kick(&mut self) -> Result<bool> {
        self.vring.notify()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Used elements the device returned that matched no request in flight.
    pub fn untracked(&self) -> &[UsedElem] {
        &self.untracked
    }

    /// Allocates the next request id / token (never reused by this client).
    pub fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    fn get_buf(&mut self, len: usize) -> Result<Buf> {
        if len as u64 <= PAGE_SIZE {
            if let Some(gpa) = self.page_pool.pop() {
                return Ok(Buf { gpa, pooled: true });
            }
            let gpa = self.vring.mem().alloc(PAGE_SIZE, PAGE_SIZE)?;
            return Ok(Buf { gpa, pooled: true });
        }
        let gpa = self.vring.mem().alloc(len as u64, PAGE_SIZE)?;
        Ok(Buf { gpa, pooled: false })
    }

    fn put_bufs(&mut self, bufs: Vec<Buf>) {
        for b in bufs {
            if b.pooled {
                self.page_pool.push(b.gpa);
            } else {
                let _ = self.vring.mem().free(b.gpa);
            }
        }
    }

    fn desc_len(&self, len: usize) -> Result<u32> {
        u32::try_from(len).map_err(|_| Error::BadChain {
            queue: self.vring.index(),
            reason: format!("buffer of {len} bytes"),
        })
    }

    /// Submits `opcode` with `payload` (header and payload in one readable
    /// descriptor) and room for `resp_payload_len` response bytes.
    /// Returns the request id.
    pub fn submit(
        &mut self,
        opcode: impl Into<u32>,
        payload: &[u8],
        resp_payload_len: usize,
    ) -> Result<u64> {
        self.submit_spec(&RequestSpec::new(opcode, &[payload], resp_payload_len))
    }

    /// Submits `opcode` with readable `parts` (see [`RequestSpec::parts`]),
    /// e.g. `&[fixed_part, page_list]` or a page list split in several.
    pub fn submit_parts(
        &mut self,
        opcode: impl Into<u32>,
        parts: &[&[u8]],
        resp_payload_len: usize,
    ) -> Result<u64> {
        self.submit_spec(&RequestSpec::new(opcode, parts, resp_payload_len))
    }

    /// Submits a request described in full. Returns its token: the header's
    /// request id when the spec leaves it to the client, otherwise a fresh
    /// unique value (so duplicate or odd explicit ids are possible).
    pub fn submit_spec(&mut self, spec: &RequestSpec<'_>) -> Result<u64> {
        let token = self.next_request_id();
        let request_id = spec.request_id.unwrap_or(token);
        let header = RequestHeader {
            request_id,
            opcode: spec.opcode,
            reserved: spec.reserved,
        }
        .to_bytes();

        let mut bufs = Vec::new();
        let mut segs = Vec::new();
        let mut resp = Vec::new();
        let r = self.build(spec, &header, &mut bufs, &mut segs, &mut resp);
        let head = match r.and_then(|()| self.vring.add_chain(&segs)) {
            Ok(h) => h,
            Err(e) => {
                self.put_bufs(bufs);
                return Err(e);
            }
        };
        self.pending.insert(
            head,
            Pending {
                token,
                request_id,
                opcode: spec.opcode,
                bufs,
                resp,
            },
        );
        self.ids.insert(token, head);
        if self.auto_kick {
            self.vring.notify()?;
        }
        Ok(token)
    }

    fn build(
        &mut self,
        spec: &RequestSpec<'_>,
        header: &[u8],
        bufs: &mut Vec<Buf>,
        segs: &mut Vec<Seg>,
        resp: &mut Vec<(GuestAddress, usize)>,
    ) -> Result<()> {
        let mem = self.vring.mem().clone();
        // Readable: header + first part, then one descriptor per further part.
        let first = spec.parts.first().copied().unwrap_or(&[]);
        let mut readable: Vec<Vec<u8>> = vec![[header, first].concat()];
        readable.extend(spec.parts.iter().skip(1).map(|p| p.to_vec()));
        for bytes in readable {
            let b = self.get_buf(bytes.len())?;
            bufs.push(b);
            mem.write(b.gpa, &bytes)?;
            segs.push(Seg::readable(b.gpa, self.desc_len(bytes.len())?));
        }
        // Writable.
        let total = spec
            .writable_len
            .unwrap_or(ResponseHeader::SIZE + spec.resp_payload_len);
        let chunk = spec.writable_split.unwrap_or(total).max(1);
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk);
            let b = self.get_buf(n)?;
            bufs.push(b);
            mem.fill(b.gpa, n, POISON)?;
            segs.push(Seg::writable(b.gpa, self.desc_len(n)?));
            resp.push((b.gpa, n));
            left -= n;
        }
        Ok(())
    }

    /// Publishes arbitrary descriptors as one chain (hostile tests). The
    /// caller owns every buffer the descriptors name. `response`, if given,
    /// is filled with [`POISON`] now and read back as the response when the
    /// chain completes. Returns a token to [`CtrlQueue::wait`] for (taken
    /// from the request-id sequence).
    pub fn submit_raw_chain(
        &mut self,
        descs: &[RawDesc],
        response: Option<(GuestAddress, usize)>,
    ) -> Result<u64> {
        let mem = self.vring.mem().clone();
        if let Some((gpa, len)) = response {
            mem.fill(gpa, len, POISON)?;
        }
        let token = self.next_request_id();
        let head = self.vring.add_raw(descs)?;
        self.pending.insert(
            head,
            Pending {
                token,
                request_id: 0,
                opcode: 0,
                bufs: Vec::new(),
                resp: response.into_iter().collect(),
            },
        );
        self.ids.insert(token, head);
        if self.auto_kick {
            self.vring.notify()?;
        }
        Ok(token)
    }

    /// Harvests the used ring into completions; returns how many finished.
    fn process_used(&mut self) -> Result<usize> {
        let used = self.vring.harvest()?;
        let n = used.len();
        for u in used {
            let p = u16::try_from(u.id)
                .ok()
                .filter(|_| u.tracked)
                .and_then(|h| self.pending.remove(&h).map(|p| (h, p)));
            let Some((head, p)) = p else {
                self.untracked.push(u);
                continue;
            };
            self.ids.remove(&p.token);
            let c = self.read_completion(head, &p, u.len);
            self.put_bufs(p.bufs);
            let c = c?;
            self.done_order.push_back(c.token);
            self.done.insert(c.token, c);
        }
        Ok(n)
    }

    fn read_completion(&self, head: u16, p: &Pending, used_len: u32) -> Result<Completion> {
        let mem = self.vring.mem();
        let mut bytes = Vec::new();
        for &(gpa, len) in &p.resp {
            bytes.extend(mem.read_vec(gpa, len)?);
        }
        let hdr = ResponseHeader::read(&bytes);
        let end = (used_len as usize).min(bytes.len());
        let payload = bytes
            .get(ResponseHeader::SIZE..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let (resp_request_id, status, detail) = if bytes.len() >= ResponseHeader::SIZE {
            (hdr.request_id, hdr.status, hdr.detail)
        } else {
            (0, u32::MAX, u32::MAX)
        };
        Ok(Completion {
            token: p.token,
            request_id: p.request_id,
            opcode: p.opcode,
            resp_request_id,
            status,
            detail,
            payload,
            used_len,
            head,
        })
    }

    fn take_done(&mut self, token: u64) -> Option<Completion> {
        let c = self.done.remove(&token)?;
        if let Some(pos) = self.done_order.iter().position(|&t| t == token) {
            self.done_order.remove(pos);
        }
        Some(c)
    }

    /// Returns every completion available now, without blocking, in
    /// completion order.
    pub fn poll(&mut self) -> Result<Vec<Completion>> {
        self.process_used()?;
        let mut out = Vec::new();
        while let Some(token) = self.done_order.pop_front() {
            if let Some(c) = self.done.remove(&token) {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// Waits (default timeout) until at least one request completes and
    /// returns everything completed, in completion order.
    pub fn wait_any(&mut self) -> Result<Vec<Completion>> {
        self.wait_any_timeout(self.timeout)
    }

    /// [`CtrlQueue::wait_any`] with an explicit timeout.
    pub fn wait_any_timeout(&mut self, timeout: Duration) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.poll()?;
            if !got.is_empty() {
                return Ok(got);
            }
            if self.spin()? || self.vring.enable_interrupts()? {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            self.vring.wait_call(left)?;
        }
    }

    /// Waits (default timeout) for the request with this token (the value
    /// returned by a submit function) to complete.
    pub fn wait(&mut self, token: u64) -> Result<Completion> {
        self.wait_timeout(token, self.timeout)
    }

    /// [`CtrlQueue::wait`] with an explicit timeout.
    pub fn wait_timeout(&mut self, token: u64, timeout: Duration) -> Result<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.take_done(token) {
                return Ok(c);
            }
            if !self.ids.contains_key(&token) {
                return Err(Error::UnknownRequest(token));
            }
            if self.process_used()? > 0 {
                continue;
            }
            if self.spin()? || self.vring.enable_interrupts()? {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            self.vring.wait_call(left)?;
        }
    }

    /// Submits and waits: `submit(opcode, payload, resp_payload_len)` then
    /// `wait`. Any status is returned as a completion.
    pub fn call(
        &mut self,
        opcode: impl Into<u32>,
        payload: &[u8],
        resp_payload_len: usize,
    ) -> Result<Completion> {
        let id = self.submit(opcode, payload, resp_payload_len)?;
        self.wait(id)
    }

    /// Submits and waits for a request with readable `parts`.
    pub fn call_parts(
        &mut self,
        opcode: impl Into<u32>,
        parts: &[&[u8]],
        resp_payload_len: usize,
    ) -> Result<Completion> {
        let id = self.submit_parts(opcode, parts, resp_payload_len)?;
        self.wait(id)
    }

    /// Like [`CtrlQueue::call`] but a status other than OK is an error.
    pub fn call_ok(
        &mut self,
        opcode: impl Into<u32>,
        payload: &[u8],
        resp_payload_len: usize,
    ) -> Result<Completion> {
        self.call(opcode, payload, resp_payload_len)?.ok()
    }

    /// Typed call: sends `req` (plus `tail`, e.g. an inline page list, in a
    /// second descriptor if not empty) and parses an OK response as `Resp`.
    pub fn call_typed<Req: Wire, Resp: Wire>(
        &mut self,
        opcode: impl Into<u32>,
        req: &Req,
        tail: &[u8],
    ) -> Result<Resp> {
        let fixed = req.to_bytes();
        let c = if tail.is_empty() {
            self.call(opcode, &fixed, Resp::SIZE)?
        } else {
            self.call_parts(opcode, &[&fixed, tail], Resp::SIZE)?
        };
        c.ok()?.parse()
    }

    /// Typed call for commands without a response payload.
    pub fn call_typed_unit<Req: Wire>(
        &mut self,
        opcode: impl Into<u32>,
        req: &Req,
        tail: &[u8],
    ) -> Result<Completion> {
        let fixed = req.to_bytes();
        let c = if tail.is_empty() {
            self.call(opcode, &fixed, 0)?
        } else {
            self.call_parts(opcode, &[&fixed, tail], 0)?
        };
        c.ok()
    }
}

impl Drop for CtrlQueue {
    /// Returns every buffer to the guest memory allocator.
    fn drop(&mut self) {
        let mem = self.vring.mem().clone();
        for gpa in self.page_pool.drain(..) {
            let _ = mem.free(gpa);
        }
        for (_, p) in self.pending.drain() {
            for b in p.bufs {
                let _ = mem.free(b.gpa);
            }
        }
    }
}

/// Splits `bytes` into chunks of at most `chunk` bytes (for
/// [`RequestSpec::parts`]).
pub fn split_bytes(bytes: &[u8], chunk: usize) -> Vec<&[u8]> {
    bytes.chunks(chunk.max(1)).collect()
}

/// Encodes guest-physical page addresses as an inline page list
/// (little-endian u64 each).
pub fn page_list_bytes(pages: &[GuestAddress]) -> Vec<u8> {
    pages.iter().flat_map(|p| p.0.to_le_bytes()).collect()
}
