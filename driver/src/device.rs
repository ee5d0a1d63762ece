//! [`Device`]: an opened device with one context, and the control-command
//! plumbing every object uses.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtio_rdma_abi::config::{DeviceConfig, F_ATOMIC, F_MEM_MGT, F_SRQ, F_UD};
use virtio_rdma_abi::ctrl::{Opcode, RequestHeader, ResponseHeader, Status};
use virtio_rdma_abi::datapath::{DB_NONE, SHMEM_ID_DOORBELL};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_abi::verbs::{
    CreateCtxReq, CreateCtxResp, CtxHandleReq, DeviceAttr, PortAttr, QueryGidReq, QueryGidResp,
    QueryPortReq,
};
use virtio_rdma_abi::{Field, Wire, ABI_VERSION, MIN_COMPATIBLE_ABI_VERSION};

use crate::dma::DmaBuf;
use crate::doorbell::{CtxFlags, DoorbellPage, DoorbellSlot};
use crate::error::{Error, Result};
use crate::event::EventDemux;
use crate::image::DeviceImage;
use crate::transport::{Token, Transport, TransportError};

/// The device's only port.
pub const PORT: u32 = virtio_rdma_abi::verbs::PORT_NUM;

/// Options of [`Device::open_with`].
#[derive(Debug, Clone, Copy)]
pub struct DeviceOptions {
    /// How long a control command may take (`None`: no limit).
    pub command_timeout: Option<Duration>,
    /// GID table index of the device handle's own GID ([`Device::gid`],
    /// the source GID of the address vectors it builds). `None`: the
    /// first GID the operator assigned — index 1 of a version-3 table,
    /// whose index 0 is the default GID, else index 0 (spec appendix A).
    pub gid_index: Option<u8>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            command_timeout: Some(Duration::from_secs(30)),
            gid_index: None,
        }
    }
}

/// An opened device: its configuration, attributes, port and GID, and one
/// context (`CREATE_CTX`) under which every object of this handle lives.
///
/// `Device` is a cheap, clonable handle. Every object created from it keeps
/// a clone, so the context is destroyed (`DESTROY_CTX`) only after the last
/// object and the last `Device` clone are dropped.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) config: DeviceConfig,
    pub(crate) features: u64,
    pub(crate) attr: DeviceAttr,
    pub(crate) port: PortAttr,
    pub(crate) gid: QueryGidResp,
    /// The index of `gid` in the device's table.
    pub(crate) gid_index: u8,
    pub(crate) ctx: u32,
    /// The context's doorbell page (shared-memory doorbell mode).
    pub(crate) db_page: Option<Arc<DoorbellPage>>,
    /// The context's doorbell header in DMA memory (`CREATE_CTX`).
    pub(crate) ctx_header: Option<Arc<DmaBuf>>,
    pub(crate) events: EventDemux,
    next_id: AtomicU64,
    timeout: Option<Duration>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("ctx", &self.inner.ctx)
            .field("features", &self.inner.features)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens the device with default options: reads the configuration,
    /// checks the ABI version, sends QUERY_DEVICE, QUERY_PORT and QUERY_GID
    /// (index 0) and creates a context (the four commands in one batch).
    pub fn open(transport: Arc<dyn Transport>) -> Result<Device> {
        Self::open_with(transport, DeviceOptions::default())
    }

    /// Opens the device with `opts` (see [`Device::open`]).
    pub fn open_with(transport: Arc<dyn Transport>, opts: DeviceOptions) -> Result<Device> {
        let config = transport.read_config()?;
        if !(MIN_COMPATIBLE_ABI_VERSION..=ABI_VERSION).contains(&config.abi_version) {
            return Err(Error::AbiVersion(config.abi_version));
        }
        let mut inner = DeviceInner {
            features: transport.features(),
            transport,
            config,
            attr: DeviceAttr::default(),
            port: PortAttr::default(),
            gid: QueryGidResp::default(),
            gid_index: 0,
            ctx: 0,
            db_page: None,
            ctx_header: None,
            events: EventDemux::default(),
            next_id: AtomicU64::new(1),
            timeout: opts.command_timeout,
        };
        let header = CtxFlags::alloc_header(&*inner.transport)?;
        let db_gpa = header.gpa(0).ok_or_else(|| {
            Error::InvalidArgument("context doorbell header without an address".into())
        })?;
        // The queries and the context need nothing from each other: one
        // wait for all of them instead of a round trip each. Without a
        // given GID index a version-3 device's entries 0 and 1 are read
        // (index 0 is its default GID, index 1 the operator's first GID
        // when it has one).
        let port_req = QueryPortReq { port: PORT }.to_bytes();
        let probe = opts.gid_index.is_none() && inner.config.abi_version >= 3;
        let gid_req = |index: u8| {
            QueryGidReq {
                port: PORT,
                index: u32::from(index),
            }
            .to_bytes()
        };
        let (first_req, second_req) = (gid_req(opts.gid_index.unwrap_or(0)), gid_req(1));
        let ctx_req = CreateCtxReq { db_gpa }.to_bytes();
        let query = |index: u8, r: Result<Vec<u8>>| r.map(|b| (index, QueryGidResp::read(&b)));
        let (attr, port, gid, ctx) = if probe {
            let [attr, port, gid0, gid1, ctx] = inner.execute_all([
                (Opcode::QUERY_DEVICE, &[], DeviceAttr::SIZE),
                (Opcode::QUERY_PORT, &[&port_req], PortAttr::SIZE),
                (Opcode::QUERY_GID, &[&first_req], QueryGidResp::SIZE),
                (Opcode::QUERY_GID, &[&second_req], QueryGidResp::SIZE),
                (Opcode::CREATE_CTX, &[&ctx_req], CreateCtxResp::SIZE),
            ]);
            // A table of one entry refuses index 1 (RANGE): index 0 then.
            let gid = match query(1, gid1) {
                Ok((i, g)) if g.gid != [0; 16] => Ok((i, g)),
                _ => query(0, gid0),
            };
            (attr, port, gid, ctx)
        } else {
            let [attr, port, gid, ctx] = inner.execute_all([
                (Opcode::QUERY_DEVICE, &[], DeviceAttr::SIZE),
                (Opcode::QUERY_PORT, &[&port_req], PortAttr::SIZE),
                (Opcode::QUERY_GID, &[&first_req], QueryGidResp::SIZE),
                (Opcode::CREATE_CTX, &[&ctx_req], CreateCtxResp::SIZE),
            ]);
            (attr, port, query(opts.gid_index.unwrap_or(0), gid), ctx)
        };
        let ctx = match ctx {
            Ok(r) => CreateCtxResp::read(&r),
            Err(e) => {
                if outcome_unknown(&e) {
                    std::mem::forget(header);
                }
                // A failed query is the first error.
                attr.and(port).and(gid)?;
                return Err(e);
            }
        };
        inner.ctx = ctx.ctx_handle;
        inner.ctx_header = Some(header);
        // A failed query after all: the context goes again (with the
        // header, when the device confirms; `DeviceInner::drop`).
        inner.attr = DeviceAttr::read(&attr?);
        inner.port = PortAttr::read(&port?);
        (inner.gid_index, inner.gid) = gid?;
        if ctx.doorbell_page != DB_NONE {
            // The device ignores the records' producer indices of queues
            // with slots, so a page the driver cannot reach is fatal; so is
            // an index the spec does not allow (12.4: below max_ctx).
            let page = if ctx.doorbell_page >= inner.config.max_ctx {
                Err(Error::InvalidArgument(format!(
                    "device returned doorbell page {}, max_ctx is {}",
                    ctx.doorbell_page, inner.config.max_ctx
                )))
            } else {
                inner
                    .transport
                    .shared_memory(SHMEM_ID_DOORBELL)
                    .ok_or_else(|| {
                        Error::InvalidArgument(
                            "device returned a doorbell page but the transport has no doorbell \
                             region"
                                .into(),
                        )
                    })
            }
            .and_then(|shm| DoorbellPage::new(shm, ctx.doorbell_page));
            match page {
                Ok(p) => inner.db_page = Some(Arc::new(p)),
                Err(e) => {
                    let _ = inner.cmd_unit(
                        Opcode::DESTROY_CTX,
                        &CtxHandleReq {
                            ctx_handle: inner.ctx,
                        },
                    );
                    return Err(e);
                }
            }
        }
        log::debug!("virtio-rdma: context {:#x} created", inner.ctx);
        Ok(Device {
            inner: Arc::new(inner),
        })
    }

    /// The device handle's image ([`crate::image`]). A device in the
    /// shared-memory doorbell mode has none: its doorbell page belongs to
    /// the connection, not to guest RAM.
    pub fn image(&self) -> Result<DeviceImage> {
        let inner = &self.inner;
        if inner.db_page.is_some() {
            return Err(Error::Unsupported("an image of a doorbell-page context"));
        }
        let header = inner
            .ctx_header
            .as_ref()
            .ok_or(Error::Unsupported("an image of a context without a header"))?;
        Ok(DeviceImage {
            config: inner.config.to_bytes().to_vec(),
            features: inner.features,
            attr: inner.attr.to_bytes().to_vec(),
            port: inner.port.to_bytes().to_vec(),
            gid: inner.gid.to_bytes().to_vec(),
            gid_index: inner.gid_index,
            ctx: inner.ctx,
            ctx_header: header.image(),
            next_id: inner.next_id.load(Ordering::Relaxed),
        })
    }

    /// The device handle of `image` over `transport`, whose device took
    /// over the context (a loaded device state, spec 20): nothing is sent.
    /// The features must be the transport's.
    pub fn restore(
        transport: Arc<dyn Transport>,
        image: &DeviceImage,
        opts: DeviceOptions,
    ) -> Result<Device> {
        let wire = |what: &str, bytes: &[u8], size: usize| {
            if bytes.len() == size {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!(
                    "{what} of {} bytes in a device image, expected {size}",
                    bytes.len()
                )))
            }
        };
        wire("a configuration", &image.config, DeviceConfig::SIZE)?;
        wire("device attributes", &image.attr, DeviceAttr::SIZE)?;
        wire("port attributes", &image.port, PortAttr::SIZE)?;
        wire("a GID", &image.gid, QueryGidResp::SIZE)?;
        if transport.features() != image.features {
            return Err(Error::InvalidArgument(format!(
                "features {:#x} in the image, {:#x} negotiated",
                image.features,
                transport.features()
            )));
        }
        let config = DeviceConfig::read(&image.config);
        if !(MIN_COMPATIBLE_ABI_VERSION..=ABI_VERSION).contains(&config.abi_version) {
            return Err(Error::AbiVersion(config.abi_version));
        }
        let header = Arc::new(DmaBuf::adopt(&*transport, &image.ctx_header)?);
        Ok(Device {
            inner: Arc::new(DeviceInner {
                features: image.features,
                transport,
                config,
                attr: DeviceAttr::read(&image.attr),
                port: PortAttr::read(&image.port),
                gid: QueryGidResp::read(&image.gid),
                gid_index: image.gid_index,
                ctx: image.ctx,
                db_page: None,
                ctx_header: Some(header),
                events: EventDemux::default(),
                next_id: AtomicU64::new(image.next_id),
                timeout: opts.command_timeout,
            }),
        })
    }

    /// The device configuration read at open time.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.config
    }

    /// MAC address of the guest network interface the port is paired with
    /// (`DeviceConfig.mac`, spec appendix A); `None` when the operator
    /// configured none. The library needs no interface itself: an
    /// application uses this to find the interface that carries the
    /// port's GIDs as IP addresses.
    pub fn paired_mac(&self) -> Option<[u8; 6]> {
        self.inner.config.paired_mac()
    }

    /// The QUERY_DEVICE response.
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// The QUERY_PORT response of port 1.
    pub fn port_attr(&self) -> &PortAttr {
        &self.inner.port
    }

    /// The device handle's own GID, read at open time
    /// ([`DeviceOptions::gid_index`]): what peers address it by.
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid.gid
    }

    /// The index of [`Device::gid`] in the device's GID table: the
    /// `sgid_index` of the address vectors built for this handle.
    pub fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }

    /// An address vector to `dgid` from [`Device::gid`], hop limit 64.
    pub fn av(&self, dgid: [u8; 16]) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index: self.gid_index(),
            hop_limit: 64,
            ..AddressVector::default()
        }
    }

    /// Reads the whole GID table of port 1 (`gid_tbl_len` entries; an
    /// unassigned one is all zero).
    pub fn gid_table(&self) -> Result<Vec<[u8; 16]>> {
        (0..self.inner.port.gid_tbl_len)
            .map(|i| self.query_gid(i))
            .collect()
    }

    /// Reads GID table entry `index` of port 1.
    pub fn query_gid(&self, index: u32) -> Result<[u8; 16]> {
        let r: QueryGidResp =
            self.inner
                .cmd(Opcode::QUERY_GID, &QueryGidReq { port: PORT, index }, &[])?;
        Ok(r.gid)
    }

    /// Reads the port attributes again.
    pub fn query_port(&self) -> Result<PortAttr> {
        self.inner
            .cmd(Opcode::QUERY_PORT, &QueryPortReq { port: PORT }, &[])
    }

    /// The negotiated device feature bits.
    pub fn features(&self) -> u64 {
        self.inner.features
    }

    /// Index of the context's doorbell page when the device runs it in the
    /// shared-memory doorbell mode (spec 18.7); `None`: guest-RAM mode.
    pub fn doorbell_page(&self) -> Option<u32> {
        self.inner.db_page.as_ref().map(|p| p.index())
    }

    /// The context's device flags as the device last wrote them (spec
    /// 18.6): `DB_FLAG_POLLING` while the engine polls, `DB_FLAG_KICK`
    /// while it is parked; for diagnostics.
    pub fn doorbell_flags(&self) -> u32 {
        self.inner
            .ctx_flags()
            .map_or(0, |f| f.word().load(std::sync::atomic::Ordering::Acquire))
    }

    /// Guest-physical address of the context's doorbell header in guest
    /// RAM (spec 18.4), where the device writes its flags; `None` with a
    /// doorbell page. Dirty-logging tests expect the device's writes there.
    pub fn ctx_header_gpa(&self) -> Option<u64> {
        self.inner.ctx_header.as_ref().and_then(|h| h.gpa(0))
    }

    /// Handle of this device's context.
    pub fn ctx_handle(&self) -> u32 {
        self.inner.ctx
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    /// Allocates DMA memory from the transport, zeroed (for user buffers:
    /// register it with [`Mr::register`](crate::Mr::register)).
    pub fn alloc_dma(&self, len: usize, align: usize) -> Result<DmaBuf> {
        let buf = DmaBuf::new(self.inner.transport.alloc_dma(len, align.max(8))?)?;
        buf.fill(0, len, 0)?;
        Ok(buf)
    }

    /// Takes the next asynchronous event (every kind but `CQ_COMPLETION`,
    /// which goes to [`Cq::wait_event`](crate::Cq::wait_event)), waiting at
    /// most `timeout` (`None`: forever; zero: poll). Events may name objects
    /// that were destroyed meanwhile; ignore those.
    pub fn next_async_event(&self, timeout: Option<Duration>) -> Result<Option<Event>> {
        self.inner
            .events
            .wait(&*self.inner.transport, timeout, |st| st.take_async())
    }

    /// Asynchronous events dropped because nobody read them (beyond
    /// [`MAX_ASYNC_EVENTS`](crate::event::MAX_ASYNC_EVENTS)).
    pub fn async_events_dropped(&self) -> u64 {
        self.inner.events.dropped()
    }
}

impl DeviceInner {
    /// Whether feature `bit` was negotiated.
    pub(crate) fn has(&self, bit: u64) -> bool {
        self.features & bit != 0
    }

    /// Fails with [`Error::Unsupported`] unless `bit` was negotiated.
    pub(crate) fn require(&self, bit: u64) -> Result<()> {
        if self.has(bit) {
            return Ok(());
        }
        Err(Error::Unsupported(match bit {
            F_UD => "F_UD",
            F_SRQ => "F_SRQ",
            F_ATOMIC => "F_ATOMIC",
            F_MEM_MGT => "F_MEM_MGT",
            _ => "device feature",
        }))
    }

    /// Executes a command: `parts` after the header, room for `resp_size`
    /// payload bytes. Returns the response payload (`resp_size` bytes).
    pub(crate) fn execute(
        &self,
        opcode: Opcode,
        parts: &[&[u8]],
        resp_size: usize,
    ) -> Result<Vec<u8>> {
        let sent = self.submit(opcode, parts, resp_size)?;
        self.finish(sent)
    }

    /// Executes `cmds` (opcode, request parts, response payload size) with
    /// one wait for all: every command is made available before the first
    /// answer is waited for. The device executes them in that order (spec
    /// 7.2), so a command may depend on the *effect* of an earlier one (a
    /// QP's state), not on its result (a handle). One result per command,
    /// in order; a command whose submission failed is not executed, nor
    /// those after it (their result is [`Error::NotExecuted`]).
    pub(crate) fn execute_all<const N: usize>(
        &self,
        cmds: [(Opcode, &[&[u8]], usize); N],
    ) -> [Result<Vec<u8>>; N] {
        let mut sent = Vec::with_capacity(N);
        for &(opcode, parts, resp_size) in &cmds {
            let s = self.submit(opcode, parts, resp_size);
            let failed = s.is_err();
            sent.push(s);
            if failed {
                break;
            }
        }
        let mut answers = sent.into_iter().map(|s| s.and_then(|s| self.finish(s)));
        std::array::from_fn(|i| {
            answers
                .next()
                .unwrap_or(Err(Error::NotExecuted { opcode: cmds[i].0 }))
        })
    }

    /// Makes a command available (see [`DeviceInner::execute`]).
    fn submit(&self, opcode: Opcode, parts: &[&[u8]], resp_size: usize) -> Result<Submitted> {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader {
            request_id,
            opcode: opcode.into(),
            reserved: 0,
        }
        .to_bytes();
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&header);
        all.extend(parts.iter().copied().filter(|p| !p.is_empty()));
        let token = self
            .transport
            .submit(&all, ResponseHeader::SIZE + resp_size)
            .map_err(transport_error)?;
        Ok(Submitted {
            opcode,
            request_id,
            token,
            resp_size,
        })
    }

    /// Waits for the answer to a submitted command and checks it; returns
    /// its response payload.
    fn finish(&self, sent: Submitted) -> Result<Vec<u8>> {
        let Submitted {
            opcode,
            request_id,
            token,
            resp_size,
        } = sent;
        let resp = self
            .transport
            .wait(token, self.timeout)
            .map_err(transport_error)?;
        if resp.is_empty() {
            return Err(Error::NotExecuted { opcode });
        }
        let bad = |reason: String| Error::BadResponse { opcode, reason };
        let (head, payload) = ResponseHeader::parse_prefix(&resp)
            .map_err(|e| bad(format!("response header: {e}")))?;
        if head.request_id != request_id {
            return Err(bad(format!(
                "request id {} in the response to request {request_id}",
                head.request_id
            )));
        }
        match Status::from_u32(head.status) {
            Some(Status::OK) => {}
            Some(status) => {
                return Err(Error::Command {
                    opcode,
                    status,
                    detail: head.detail,
                })
            }
            None => {
                return Err(Error::UnknownStatus {
                    opcode,
                    code: head.status,
                    detail: head.detail,
                })
            }
        }
        if payload.len() < resp_size {
            return Err(bad(format!(
                "{} payload bytes, expected {resp_size}",
                payload.len()
            )));
        }
        Ok(payload[..resp_size].to_vec())
    }

    /// Executes a command with a request structure (and page list `tail`)
    /// and a response structure.
    pub(crate) fn cmd<R: Wire>(&self, opcode: Opcode, req: &impl Wire, tail: &[u8]) -> Result<R> {
        let bytes = req.to_bytes();
        let payload = self.execute(opcode, &[&bytes, tail], R::SIZE)?;
        // Lenient on reserved fields: a later revision may give them meaning.
        Ok(R::read(&payload))
    }

    /// Where the context's device flags are: its doorbell page's header, or
    /// its doorbell header in guest RAM (spec 18.4).
    pub(crate) fn ctx_flags(&self) -> Result<CtxFlags> {
        match (&self.db_page, &self.ctx_header) {
            (Some(page), _) => Ok(CtxFlags::Page(page.clone())),
            (None, Some(header)) => Ok(CtxFlags::Header(header.clone())),
            (None, None) => Err(Error::InvalidArgument(
                "context without a doorbell header".into(),
            )),
        }
    }

    /// The doorbell slot a create command returned (`None` for `DB_NONE`:
    /// guest-RAM mode).
    pub(crate) fn doorbell_slot(&self, db_slot: u32) -> Result<Option<DoorbellSlot>> {
        if db_slot == DB_NONE {
            return Ok(None);
        }
        let page = self.db_page.clone().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device returned doorbell slot {db_slot} for a context without a doorbell page"
            ))
        })?;
        DoorbellSlot::new(page, db_slot).map(Some)
    }

    /// Executes a command with a request structure and no response payload.
    pub(crate) fn cmd_unit(&self, opcode: Opcode, req: &impl Wire) -> Result<()> {
        let bytes = req.to_bytes();
        self.execute(opcode, &[&bytes], 0).map(drop)
    }

    /// Sends a destroy command from a `Drop` implementation. Returns whether
    /// the memory of the object may be freed: the device confirmed the
    /// destroy, or it is gone (disconnected: the back end released every
    /// object and mapping of the VM). Otherwise the caller must not free
    /// memory the device may still access.
    pub(crate) fn destroy(&self, opcode: Opcode, req: &impl Wire, what: &str) -> bool {
        match self.cmd_unit(opcode, req) {
            Ok(()) => true,
            Err(Error::Transport(TransportError::Disconnected)) => {
                log::debug!("virtio-rdma: {what}: device gone");
                true
            }
            Err(e) => {
                log::warn!("virtio-rdma: {what}: {e}");
                false
            }
        }
    }
}

/// A command made available and not yet answered.
struct Submitted {
    opcode: Opcode,
    request_id: u64,
    token: Token,
    resp_size: usize,
}

fn transport_error(e: TransportError) -> Error {
    match e {
        TransportError::Timeout => Error::Timeout,
        e => Error::Transport(e),
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        if self.ctx != 0 {
            let done = self.destroy(
                Opcode::DESTROY_CTX,
                &CtxHandleReq {
                    ctx_handle: self.ctx,
                },
                "DESTROY_CTX",
            );
            // The device may still write the header of a context it has
            // not destroyed.
            if !done {
                std::mem::forget(self.ctx_header.take());
            }
        }
    }
}

/// Whether a failed command may still have been executed (or may still be
/// executed later): memory it describes must then be leaked, not freed.
/// A device that is gone (`Disconnected`: the back end lost the VM and
/// with it every object and mapping) will execute nothing any more.
pub(crate) fn outcome_unknown(e: &Error) -> bool {
    match e {
        Error::Transport(TransportError::Disconnected) => false,
        Error::Timeout | Error::Transport(_) | Error::BadResponse { .. } => true,
        _ => false,
    }
}
