//! The two-peer RDMA exchange: the demo and the end-to-end test.
//!
//! Each peer opens the device, creates a PD, one CQ and two RC QPs: `ctl`
//! carries small command messages (SEND/RECV of at most [`MSG`] bytes), `dat`
//! carries the data under test, so that the receive queue of one never mixes
//! with the other's. The peers swap QP numbers, GID and their data buffer's
//! address and rkey over the out-of-band channel, connect, and then the
//! client drives and the server answers over `ctl`:
//!
//! 1. ping-pong of command messages (round-trip time);
//! 2. SEND/RECV of sizes from 0 bytes to the whole buffer, checked at the
//!    server;
//! 3. RDMA WRITE of the same sizes at odd offsets, the server checking the
//!    data and guard bytes around it; one RDMA WRITE with immediate;
//! 4. RDMA READ of server-filled data, checked at the client;
//! 5. FETCH_AND_ADD and CMP_AND_SWP (when the device has `F_ATOMIC`);
//! 6. a pipelined RDMA WRITE stream (throughput, for the record).
//!
//! Every step prints one line; any mismatch is an error naming the step.
//!
//! [`stream_until_peer_reset`] is a prelude for the client of a test that
//! resets the server's machine: it streams RDMA WRITEs into the server
//! until the server's device is reset, and checks that its own QPs fail
//! with `QP_FATAL` and that every outstanding work request completes
//! with an error. The server side needs nothing special: it runs the
//! ordinary exchange, is reset while it waits for a command, and its next
//! boot runs the exchange again with the same client.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::config::F_ATOMIC;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Pd, Qp, QpCap, QpInit, RcConnect, RecvWr, SendOp, SendWr, Sge,
    WorkCompletion,
};

use crate::oob::Oob;
use crate::pattern;
use crate::{Error, Result};

/// Bytes of each RDMA WRITE of [`stream_until_peer_reset`].
const RESET_STREAM_CHUNK: usize = 64 << 10;
/// RDMA WRITEs [`stream_until_peer_reset`] keeps outstanding.
const RESET_STREAM_DEPTH: u32 = 8;
/// Successful WRITEs before [`stream_until_peer_reset`] announces that it
/// streams (the line a test waits for before it resets the server).
const RESET_STREAM_ANNOUNCE: u64 = 16;

/// Bytes of a command message.
pub const MSG: usize = 64;
/// Command messages kept posted as receives.
const CTL_RECVS: usize = 16;
/// Guard bytes checked around each RDMA WRITE.
const GUARD: usize = 64;
/// Guard byte value.
const GUARD_BYTE: u8 = 0xEE;
/// How often the out-of-band handshake repeats its message.
const RESEND: Duration = Duration::from_millis(200);

/// Work request id kinds (top byte).
const K_CTL_RECV: u64 = 1 << 56;
const K_CTL_SEND: u64 = 2 << 56;
const K_DAT_SEND: u64 = 3 << 56;
const K_DAT_RECV: u64 = 4 << 56;
const KIND_MASK: u64 = 0xff << 56;

/// Which side this peer plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Answers commands.
    Server,
    /// Drives the exchange.
    Client,
}

/// Parameters of the exchange.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bytes of the data buffer (the largest transfer).
    pub buf_len: usize,
    /// Ping-pong round trips.
    pub pingpongs: u32,
    /// RDMA WRITEs of `buf_len` in the throughput step (0: skip the step).
    pub stream_writes: u32,
    /// How many times to run steps 2 to 5 (a longer run, for tests that
    /// disturb the daemon meanwhile).
    pub rounds: u32,
    /// Longest wait for anything (the peer, a completion).
    pub timeout: Duration,
    /// The RC QPs' local ACK timeout exponent (4.096 µs × 2^N per try, 7
    /// retries; spec 12.16): 14 (67 ms) as `RcConnect` has it; longer
    /// between guests whose host starves them for longer than the NIC
    /// retries (`exchange` between TCG guests on a loaded machine).
    pub ack_timeout: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            buf_len: 4 << 20,
            pingpongs: 200,
            stream_writes: 32,
            rounds: 1,
            timeout: Duration::from_secs(60),
            ack_timeout: 14,
        }
    }
}

/// What the exchange measured (client side; the server reports zeros).
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Checks that passed.
    pub checks: u32,
    /// Bytes moved by the checked transfers.
    pub bytes: u64,
    /// Median command round trip, in microseconds.
    pub rtt_p50_us: f64,
    /// 99th percentile command round trip, in microseconds.
    pub rtt_p99_us: f64,
    /// RDMA WRITE stream throughput in MB/s (10^6 bytes per second).
    pub write_mbps: f64,
}

/// What a peer tells the other before connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerInfo {
    ctl_qpn: u32,
    dat_qpn: u32,
    gid: [u8; 16],
    addr: u64,
    rkey: u32,
    len: u64,
}

impl PeerInfo {
    fn encode(&self) -> String {
        let mut gid = String::new();
        for b in self.gid {
            let _ = write!(gid, "{b:02x}");
        }
        format!(
            "ctl={:x} dat={:x} gid={gid} addr={:x} rkey={:x} len={:x}",
            self.ctl_qpn, self.dat_qpn, self.addr, self.rkey, self.len
        )
    }

    fn decode(s: &str) -> Option<PeerInfo> {
        let mut info = PeerInfo {
            ctl_qpn: 0,
            dat_qpn: 0,
            gid: [0; 16],
            addr: 0,
            rkey: 0,
            len: 0,
        };
        let mut seen = 0;
        for kv in s.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "ctl" => info.ctl_qpn = u32::from_str_radix(v, 16).ok()?,
                "dat" => info.dat_qpn = u32::from_str_radix(v, 16).ok()?,
                "addr" => info.addr = u64::from_str_radix(v, 16).ok()?,
                "rkey" => info.rkey = u32::from_str_radix(v, 16).ok()?,
                "len" => info.len = u64::from_str_radix(v, 16).ok()?,
                "gid" => {
                    if v.len() != 32 {
                        return None;
                    }
                    for (i, b) in info.gid.iter_mut().enumerate() {
                        *b = u8::from_str_radix(v.get(2 * i..2 * i + 2)?, 16).ok()?;
                    }
                }
                _ => continue,
            }
            seen += 1;
        }
        (seen == 6).then_some(info)
    }
}

/// Swaps `mine` for the peer's payload of the same `tag` over `oob`.
///
/// Messages sent before the peer listens are lost (a serial cable with
/// nobody at the other end), so each side repeats `SYNC tag id seen payload`
/// until it has the peer's payload *and* knows the peer has its own; it
/// then sends once more with `seen=1`, which reaches a peer that is still
/// waiting because the line is up by then. `id` tells our own messages
/// apart: a serial port the peer has not yet put in raw mode echoes what
/// it receives, and an echo must not pass for the peer's answer. Every
/// message ends with ` ~checksum`: while one side's port still echoes,
/// the two sides' lines can interleave on the wire, and a line that does
/// not check out is ignored (the next repeat arrives whole).
pub fn sync(oob: &mut dyn Oob, tag: &str, mine: &str, timeout: Duration) -> Result<String> {
    let id = sender_id();
    let deadline = Instant::now() + timeout;
    let mut peer: Option<String> = None;
    let mut peer_has_mine = false;
    let mut next_send = Instant::now();
    loop {
        if peer.is_some() && peer_has_mine {
            oob.send(&sync_line(&format!("{tag} {id:x} 1 {mine}")))?;
            return peer.ok_or_else(|| Error::Protocol("sync".into()));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(format!("the peer's {tag} message")));
        }
        if now >= next_send {
            let seen = u8::from(peer.is_some());
            oob.send(&sync_line(&format!("{tag} {id:x} {seen} {mine}")))?;
            next_send = now + RESEND;
        }
        let wait = next_send
            .min(deadline)
            .saturating_duration_since(Instant::now());
        let Some(line) = oob.recv(wait)? else {
            continue;
        };
        let Some(body) = sync_body(&line) else {
            continue; // not a SYNC line, or garbled on the wire
        };
        let mut parts = body.splitn(4, ' ');
        if parts.next() != Some(tag) {
            continue;
        }
        if parts.next() == Some(format!("{id:x}").as_str()) {
            continue; // our own message, echoed back
        }
        let seen = parts.next() == Some("1");
        let payload = parts.next().unwrap_or("").to_string();
        peer_has_mine |= seen;
        if peer.is_none() {
            peer = Some(payload);
            // Answer at once so the peer need not wait for our next resend.
            next_send = Instant::now();
        }
    }
}

/// FNV-1a of `text`: the checksum of a SYNC line.
fn checksum(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// `SYNC <body> ~<checksum of body>`.
fn sync_line(body: &str) -> String {
    format!("SYNC {body} ~{:08x}", checksum(body))
}

/// The body of a well-formed SYNC line whose checksum matches.
fn sync_body(line: &str) -> Option<&str> {
    let rest = line.trim_end().strip_prefix("SYNC ")?;
    let (body, sum) = rest.rsplit_once(" ~")?;
    (u32::from_str_radix(sum, 16).ok()? == checksum(body)).then_some(body)
}

/// A number that differs between the two peers (and between runs): the
/// process id mixed with the clock and a stack address.
fn sender_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let local = 0u8;
    let addr = std::ptr::addr_of!(local) as u64;
    (u64::from(std::process::id()) << 32) ^ t ^ addr.rotate_left(17)
}

/// One peer's RDMA resources and the command-message machinery.
struct Peer<'a> {
    dev: &'a Device,
    cq: Arc<Cq>,
    ctl: Qp,
    dat: Qp,
    data: Arc<DmaBuf>,
    data_mr: Mr,
    msgs: Arc<DmaBuf>,
    msgs_mr: Mr,
    stash: VecDeque<WorkCompletion>,
    next_id: u64,
    timeout: Duration,
    out: &'a mut dyn Write,
}

fn qp_caps() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    }
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::Check(what()))
    }
}

fn field<T: std::str::FromStr>(parts: &[&str], i: usize, msg: &str) -> Result<T> {
    parts
        .get(i)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Protocol(format!("bad command {msg:?}")))
}

impl<'a> Peer<'a> {
    fn new(dev: &'a Device, opts: &Options, out: &'a mut dyn Write) -> Result<Peer<'a>> {
        let pd = Pd::alloc(dev)?;
        let cq = Cq::create(dev, 512)?;
        let mut init = QpInit::rc(&cq);
        init.cap = qp_caps();
        let ctl = Qp::create(&pd, &init)?;
        let dat = Qp::create(&pd, &init)?;
        let data = Arc::new(dev.alloc_dma(opts.buf_len.max(4096), 4096)?);
        let data_mr = Mr::register(&pd, data.clone(), access::ALL)?;
        let msgs = Arc::new(dev.alloc_dma(2 * CTL_RECVS * MSG, 64)?);
        let msgs_mr = Mr::register(&pd, msgs.clone(), access::LOCAL_WRITE)?;
        Ok(Peer {
            dev,
            cq,
            ctl,
            dat,
            data,
            data_mr,
            msgs,
            msgs_mr,
            stash: VecDeque::new(),
            next_id: 1,
            timeout: opts.timeout,
            out,
        })
    }

    fn say(&mut self, line: &str) {
        // Output is best effort: a closed console must not fail the test.
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    fn info(&self) -> PeerInfo {
        PeerInfo {
            ctl_qpn: self.ctl.qpn(),
            dat_qpn: self.dat.qpn(),
            gid: self.dev.gid(),
            addr: self.data_mr.iova(),
            rkey: self.data_mr.rkey(),
            len: self.data.len() as u64,
        }
    }

    /// Connects both QPs to the peer's with local ACK timeout exponent
    /// `ack_timeout`; 0 retries without end (spec 18.20): a peer that is
    /// paused for a while — around its reset, however long a loaded host
    /// takes for it — does not fail them; only its reset does.
    fn connect(&self, peer: &PeerInfo, ack_timeout: u32) -> Result<()> {
        let attr = self.dev.attr();
        for (qp, dest) in [(&self.ctl, peer.ctl_qpn), (&self.dat, peer.dat_qpn)] {
            let mut c = RcConnect::new(dest, peer.gid);
            c.timeout = ack_timeout;
            c.max_rd_atomic = attr.max_qp_init_rd_atom.clamp(1, 16);
            c.max_dest_rd_atomic = attr.max_qp_rd_atom.clamp(1, 16);
            qp.rc_connect(
                access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC,
                &c,
            )?;
        }
        Ok(())
    }

    /// Posts the command receives (a receive queue takes work requests
    /// only once its QP has left RESET).
    fn post_ctl_recvs(&mut self) -> Result<()> {
        for slot in 0..CTL_RECVS {
            self.post_ctl_recv(slot)?;
        }
        Ok(())
    }

    fn id(&mut self, kind: u64) -> u64 {
        self.next_id += 1;
        kind | (self.next_id & !KIND_MASK)
    }

    fn post_ctl_recv(&mut self, slot: usize) -> Result<()> {
        let sge = self.msgs_mr.sge((slot * MSG) as u64, MSG as u32)?;
        self.ctl.post_recv(&[RecvWr {
            wr_id: K_CTL_RECV | slot as u64,
            sg_list: &[sge],
        }])?;
        Ok(())
    }

    /// Waits for the completion `pred` picks; completions of other
    /// requests are kept for later waits. A failed completion of any
    /// request is an error (nothing here expects one).
    fn wait(
        &mut self,
        what: &str,
        pred: impl Fn(&WorkCompletion) -> bool,
    ) -> Result<WorkCompletion> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(i) = self.stash.iter().position(&pred) {
                if let Some(wc) = self.stash.remove(i) {
                    return Ok(wc);
                }
            }
            let mut wc = [WorkCompletion::default(); 16];
            let n = self.cq.poll(&mut wc);
            for w in &wc[..n] {
                if !w.is_success() {
                    return Err(Error::Check(format!(
                        "completion with status {:?} (wr_id {:#x}) while waiting for {what}",
                        w.status().map(|s| s.name()).unwrap_or("?"),
                        w.wr_id
                    )));
                }
            }
            self.stash.extend(&wc[..n]);
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(Error::Timeout(format!("{what} ({})", self.rings())));
                }
                std::thread::yield_now();
            }
        }
    }

    /// Where the rings stand, for a timeout's message: whether the device
    /// took the work requests, and completed them.
    fn rings(&self) -> String {
        let sq = |q: &Qp| {
            let s = q.send_queue_state();
            format!("posted {} taken {}", s.posted, s.taken)
        };
        let (ci, pi) = self.cq.indices();
        format!(
            "send queues: ctl {}, dat {}; CQ polled {ci} of {pi}; context flags {:#x}",
            sq(&self.ctl),
            sq(&self.dat),
            self.dat.send_queue_state().ctx_flags
        )
    }

    fn wait_id(&mut self, what: &str, id: u64) -> Result<WorkCompletion> {
        self.wait(what, |w| w.wr_id == id)
    }

    fn send_msg(&mut self, msg: &str) -> Result<()> {
        let bytes = msg.as_bytes();
        check(bytes.len() <= MSG, || format!("message {msg:?} too long"))?;
        let off = CTL_RECVS * MSG;
        self.msgs.write(off, bytes)?;
        let sge = [self.msgs_mr.sge(off as u64, bytes.len() as u32)?];
        let id = self.id(K_CTL_SEND);
        self.ctl
            .post_send(&[SendWr::signaled(id, SendOp::Send, &sge)])?;
        self.wait_id("a command message to be sent", id)?;
        Ok(())
    }

    fn recv_msg(&mut self) -> Result<String> {
        let wc = self.wait("a command message", |w| w.wr_id & KIND_MASK == K_CTL_RECV)?;
        let slot = (wc.wr_id & 0xffff) as usize;
        let len = (wc.byte_len as usize).min(MSG);
        let text = self.msgs.to_vec(slot * MSG, len)?;
        self.post_ctl_recv(slot)?;
        String::from_utf8(text).map_err(|_| Error::Protocol("a command message is not text".into()))
    }

    /// Sends `msg` and expects `OK` back.
    fn command(&mut self, msg: &str) -> Result<()> {
        self.send_msg(msg)?;
        let r = self.recv_msg()?;
        check(r == "OK", || format!("{msg}: the server answered {r:?}"))
    }

    fn data_sge(&self, off: usize, len: usize) -> Result<Sge> {
        Ok(self.data_mr.sge(off as u64, len as u32)?)
    }
}

/// Runs the exchange as `role` on `dev`, peering over `oob`; prints a line
/// per step to `out`.
pub fn run(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<Summary> {
    let mut p = Peer::new(dev, opts, out)?;
    let me = p.info();
    let who = match role {
        Role::Server => "server",
        Role::Client => "client",
    };
    p.say(&format!(
        "{who}: RC QPs ctl {:#x} dat {:#x}, {} KiB buffer rkey {:#x}",
        me.ctl_qpn,
        me.dat_qpn,
        me.len >> 10,
        me.rkey
    ));
    let peer_text = sync(oob, "info", &me.encode(), opts.timeout)?;
    let peer = PeerInfo::decode(&peer_text)
        .ok_or_else(|| Error::Protocol(format!("bad peer info {peer_text:?}")))?;
    p.connect(&peer, opts.ack_timeout)?;
    p.post_ctl_recvs()?;
    // Both sides must be ready to receive before the client sends.
    sync(oob, "up", "", opts.timeout)?;
    p.say(&format!(
        "{who}: connected to QPs {:#x}/{:#x}",
        peer.ctl_qpn, peer.dat_qpn
    ));
    match role {
        Role::Server => serve(&mut p).map(|()| Summary::default()),
        Role::Client => drive(&mut p, &peer, opts),
    }
}

/// What [`stream_until_peer_reset`] saw when the server went away.
#[derive(Debug, Clone, Default)]
pub struct PeerReset {
    /// RDMA WRITEs that completed successfully before the failure.
    pub writes_ok: u64,
    /// RDMA WRITEs that were outstanding when the QP failed (all of them
    /// completed with an error).
    pub writes_failed: u32,
    /// Command receives flushed from the `ctl` QP.
    pub recvs_flushed: u32,
    /// Error statuses of the failed completions, by name, with counts.
    pub statuses: BTreeMap<&'static str, u32>,
}

/// Connects to the server as the client of the exchange does, then
/// streams RDMA WRITEs into the server's buffer until the server's device
/// is reset (the test resets its machine once the `streaming` line is
/// out). Checks that both QPs then fail with a `QP_FATAL` event and that
/// every outstanding work request (the WRITEs, the posted command
/// receives) completes with an error status; a successful completion
/// after the first failure, or no failure within the timeout, is an
/// error. Everything is destroyed on return, so [`run`] can follow with
/// the server's next boot.
pub fn stream_until_peer_reset(
    dev: &Device,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<PeerReset> {
    let mut p = Peer::new(dev, opts, out)?;
    let me = p.info();
    p.say(&format!(
        "client: RC QPs ctl {:#x} dat {:#x} for a stream until the server resets",
        me.ctl_qpn, me.dat_qpn
    ));
    let peer_text = sync(oob, "info", &me.encode(), opts.timeout)?;
    let peer = PeerInfo::decode(&peer_text)
        .ok_or_else(|| Error::Protocol(format!("bad peer info {peer_text:?}")))?;
    p.connect(&peer, 0)?;
    p.post_ctl_recvs()?;
    sync(oob, "up", "", opts.timeout)?;

    let len = RESET_STREAM_CHUNK.min(p.data.len()).min(peer.len as usize);
    check(len > 0, || "the server's buffer is empty".into())?;
    let sge = [p.data_sge(0, len)?];
    let (ctl_h, dat_h) = (p.ctl.handle(), p.dat.handle());
    let mut r = PeerReset::default();
    let mut outstanding = 0u32;
    // An error completion on the send queue; completions are in order, so
    // a success after it is a device bug.
    let mut sq_error = false;
    let (mut ctl_fatal, mut dat_fatal) = (false, false);
    let deadline = Instant::now() + opts.timeout;
    loop {
        // Post until the QP is seen failing; WRs posted to a QP that has
        // already failed unseen are flushed like the others.
        while !sq_error && !dat_fatal && outstanding < RESET_STREAM_DEPTH {
            let id = p.id(K_DAT_SEND);
            let op = SendOp::RdmaWrite {
                remote_addr: peer.addr,
                rkey: peer.rkey,
            };
            p.dat.post_send(&[SendWr::signaled(id, op, &sge)])?;
            outstanding += 1;
        }
        let mut wc = [WorkCompletion::default(); 16];
        let n = p.cq.poll(&mut wc);
        for w in &wc[..n] {
            let kind = w.wr_id & KIND_MASK;
            let name = || w.status().map(|s| s.name()).unwrap_or("unknown status");
            match (kind, w.is_success()) {
                (K_DAT_SEND, true) if !sq_error => {
                    outstanding = outstanding.saturating_sub(1);
                    r.writes_ok += 1;
                    if r.writes_ok == RESET_STREAM_ANNOUNCE {
                        p.say(&format!(
                            "client: streaming {} KiB RDMA WRITEs to the server until its QPs go away",
                            len >> 10
                        ));
                    }
                }
                (K_DAT_SEND, false) => {
                    outstanding = outstanding.saturating_sub(1);
                    sq_error = true;
                    r.writes_failed += 1;
                    *r.statuses.entry(name()).or_default() += 1;
                }
                (K_CTL_RECV, false) => {
                    r.recvs_flushed += 1;
                    *r.statuses.entry(name()).or_default() += 1;
                }
                _ => {
                    return Err(Error::Check(format!(
                        "unexpected completion while streaming to a server being reset: {w:?}"
                    )))
                }
            }
        }
        while let Some(ev) = p.dev.next_async_event(Some(Duration::ZERO))? {
            if EventKind::from_u32(ev.kind) == Some(EventKind::QP_FATAL) {
                ctl_fatal |= ev.handle == ctl_h;
                dat_fatal |= ev.handle == dat_h;
            }
        }
        if outstanding == 0 && ctl_fatal && dat_fatal && r.recvs_flushed as usize == CTL_RECVS {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "the server's reset to fail the stream ({} WRITEs done, {outstanding} outstanding, \
                 QP_FATAL on ctl {ctl_fatal} dat {dat_fatal}, {} of {CTL_RECVS} receives flushed)",
                r.writes_ok, r.recvs_flushed
            )));
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    // Work posted to a failed QP completes too, flushed: the stream may
    // have had nothing outstanding at the moment of the reset.
    let id = p.id(K_DAT_SEND);
    let op = SendOp::RdmaWrite {
        remote_addr: peer.addr,
        rkey: peer.rkey,
    };
    p.dat.post_send(&[SendWr::signaled(id, op, &sge)])?;
    let wc = loop {
        let mut wc = [WorkCompletion::default(); 1];
        if p.cq.poll(&mut wc) == 1 {
            break wc[0];
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(
                "a WRITE posted to the failed QP to complete".into(),
            ));
        }
        std::thread::yield_now();
    };
    check(
        wc.wr_id == id && wc.status() == Some(WcStatus::WR_FLUSH_ERR),
        || format!("a WRITE posted to the failed QP completed as {wc:?}, not flushed"),
    )?;
    let statuses: Vec<String> = r
        .statuses
        .iter()
        .map(|(k, v)| format!("{k} x{v}"))
        .collect();
    p.say(&format!(
        "client: peer reset: QP_FATAL on both QPs; {} outstanding RDMA WRITEs and {} posted receives completed with errors ({}) after {} WRITEs succeeded; a WRITE posted afterwards was flushed",
        r.writes_failed,
        r.recvs_flushed,
        statuses.join(", "),
        r.writes_ok
    ));
    Ok(r)
}

/// Bytes `len` at `off` of the data buffer hold the pattern of `seed`, with
/// intact guard bytes around them (where they fit in the buffer).
fn verify_data(p: &Peer<'_>, off: usize, len: usize, seed: u64, guards: bool) -> Result<()> {
    let got = p.data.to_vec(off, len)?;
    if let Some(i) = pattern::first_mismatch(&got, seed) {
        return Err(Error::Check(format!(
            "{len} bytes at offset {off}: byte {i} differs"
        )));
    }
    if guards {
        let lo = off.saturating_sub(GUARD);
        let hi = (off + len + GUARD).min(p.data.len());
        let before = p.data.to_vec(lo, off - lo)?;
        let after = p.data.to_vec(off + len, hi - off - len)?;
        check(
            before.iter().chain(&after).all(|&b| b == GUARD_BYTE),
            || format!("guard bytes around {len} bytes at offset {off} were overwritten"),
        )?;
    }
    Ok(())
}

/// The server: answers commands until `DONE`.
fn serve(p: &mut Peer<'_>) -> Result<()> {
    loop {
        let msg = p.recv_msg()?;
        let parts: Vec<&str> = msg.split_whitespace().collect();
        let reply = match parts.first().copied() {
            Some("PING") => "PONG".to_string(),
            // Fill around a coming WRITE with guard bytes.
            Some("PREP") => {
                let (off, len): (usize, usize) = (field(&parts, 1, &msg)?, field(&parts, 2, &msg)?);
                let lo = off.saturating_sub(GUARD);
                let hi = off
                    .saturating_add(len)
                    .saturating_add(GUARD)
                    .min(p.data.len());
                check(lo <= hi, || format!("bad range in {msg:?}"))?;
                p.data.fill(lo, hi - lo, GUARD_BYTE)?;
                "OK".into()
            }
            Some("EXPECT") => {
                let (len, seed): (usize, u64) = (field(&parts, 1, &msg)?, field(&parts, 2, &msg)?);
                let sge = [p.data_sge(0, len)?];
                let id = p.id(K_DAT_RECV);
                p.dat.post_recv(&[RecvWr {
                    wr_id: id,
                    sg_list: &sge[..usize::from(len > 0)],
                }])?;
                p.send_msg("OK")?;
                let wc = p.wait_id("the SEND", id)?;
                check(wc.opcode() == Some(WcOpcode::RECV), || format!("{wc:?}"))?;
                check(wc.byte_len as usize == len, || {
                    format!("received {} of {len} bytes", wc.byte_len)
                })?;
                match verify_data(p, 0, len, seed, false) {
                    Ok(()) => "OK".into(),
                    Err(e) => format!("BAD {e}"),
                }
            }
            Some("EXPECT_IMM") => {
                let id = p.id(K_DAT_RECV);
                p.dat.post_recv(&[RecvWr {
                    wr_id: id,
                    sg_list: &[],
                }])?;
                p.send_msg("OK")?;
                let (off, len, seed, imm): (usize, usize, u64, u32) = (
                    field(&parts, 1, &msg)?,
                    field(&parts, 2, &msg)?,
                    field(&parts, 3, &msg)?,
                    field(&parts, 4, &msg)?,
                );
                let wc = p.wait_id("the WRITE with immediate", id)?;
                if wc.opcode() != Some(WcOpcode::RECV_RDMA_WITH_IMM) || wc.imm() != Some(imm) {
                    format!("BAD completion {wc:?}")
                } else {
                    match verify_data(p, off, len, seed, true) {
                        Ok(()) => "OK".into(),
                        Err(e) => format!("BAD {e}"),
                    }
                }
            }
            Some("CHECK") => {
                let (off, len, seed): (usize, usize, u64) = (
                    field(&parts, 1, &msg)?,
                    field(&parts, 2, &msg)?,
                    field(&parts, 3, &msg)?,
                );
                match verify_data(p, off, len, seed, true) {
                    Ok(()) => "OK".into(),
                    Err(e) => format!("BAD {e}"),
                }
            }
            Some("FILL") => {
                let (off, len, seed): (usize, usize, u64) = (
                    field(&parts, 1, &msg)?,
                    field(&parts, 2, &msg)?,
                    field(&parts, 3, &msg)?,
                );
                p.data.write(off, &pattern::make(len, seed))?;
                "OK".into()
            }
            Some("U64") => {
                let (off, value): (usize, u64) = (field(&parts, 1, &msg)?, field(&parts, 2, &msg)?);
                p.data.write(off, &value.to_le_bytes())?;
                "OK".into()
            }
            Some("IS_U64") => {
                let (off, want): (usize, u64) = (field(&parts, 1, &msg)?, field(&parts, 2, &msg)?);
                let got = p.data.to_vec(off, 8)?;
                let got = u64::from_le_bytes(got.try_into().unwrap_or([0; 8]));
                if got == want {
                    "OK".into()
                } else {
                    format!("BAD value {got}, expected {want}")
                }
            }
            Some("DONE") => {
                p.send_msg("BYE")?;
                p.say("server: done");
                return Ok(());
            }
            _ => return Err(Error::Protocol(format!("unknown command {msg:?}"))),
        };
        let reply: String = reply.chars().take(MSG).collect();
        p.send_msg(&reply)?;
    }
}

/// Transfer sizes for a buffer of `max` bytes: edge cases, then powers of
/// four up to the whole buffer.
fn sizes(max: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 7, 4095, 4096, 4097];
    let mut s = 16384;
    while s < max {
        v.push(s + 3);
        s *= 4;
    }
    v.push(max);
    v.retain(|&s| s <= max);
    v.dedup();
    v
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The client: runs the steps of the module documentation.
fn drive(p: &mut Peer<'_>, peer: &PeerInfo, opts: &Options) -> Result<Summary> {
    let mut s = Summary::default();
    let max = (p.data.len() as u64).min(peer.len) as usize;
    let remote = |off: usize| peer.addr + off as u64;

    // 1. Ping-pong.
    let mut rtts = Vec::with_capacity(opts.pingpongs as usize);
    for _ in 0..opts.pingpongs {
        let t = Instant::now();
        p.send_msg("PING")?;
        let r = p.recv_msg()?;
        check(r == "PONG", || format!("PING answered {r:?}"))?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    rtts.sort_by(f64::total_cmp);
    s.rtt_p50_us = percentile(&rtts, 0.5);
    s.rtt_p99_us = percentile(&rtts, 0.99);
    s.checks += opts.pingpongs;
    p.say(&format!(
        "client: {} SEND/RECV ping-pongs: round trip p50 {:.1} us, p99 {:.1} us",
        opts.pingpongs, s.rtt_p50_us, s.rtt_p99_us
    ));

    let mut seed = 1u64;
    for round in 0..opts.rounds.max(1) {
        let tag = if opts.rounds > 1 {
            format!(" (round {})", round + 1)
        } else {
            String::new()
        };
        // 2. SEND/RECV.
        for &len in &sizes(max) {
            seed += 1;
            p.data.write(0, &pattern::make(len, seed))?;
            p.command(&format!("EXPECT {len} {seed}"))?;
            // The server answered OK to EXPECT: its receive is posted.
            let sge = [p.data_sge(0, len)?];
            let id = p.id(K_DAT_SEND);
            p.dat.post_send(&[SendWr::signaled(
                id,
                SendOp::Send,
                &sge[..usize::from(len > 0)],
            )])?;
            p.wait_id("the SEND completion", id)?;
            let r = p.recv_msg()?;
            check(r == "OK", || {
                format!("SEND of {len} bytes: server says {r:?}")
            })?;
            s.checks += 1;
            s.bytes += len as u64;
        }
        p.say(&format!(
            "client: SEND/RECV {:?} bytes: all received intact{tag}",
            sizes(max)
        ));

        // 3. RDMA WRITE at odd offsets, guards checked.
        for &len in &sizes(max) {
            seed += 1;
            let off = if len + 2 * GUARD + 13 <= max {
                GUARD + 13
            } else {
                0
            };
            p.data.write(0, &pattern::make(len, seed))?;
            p.command(&format!("PREP {off} {len}"))?;
            let sge = [p.data_sge(0, len)?];
            let id = p.id(K_DAT_SEND);
            let op = SendOp::RdmaWrite {
                remote_addr: remote(off),
                rkey: peer.rkey,
            };
            p.dat
                .post_send(&[SendWr::signaled(id, op, &sge[..usize::from(len > 0)])])?;
            p.wait_id("the RDMA WRITE completion", id)?;
            p.command(&format!("CHECK {off} {len} {seed}"))
                .map_err(|e| Error::Check(format!("RDMA WRITE of {len} bytes at {off}: {e}")))?;
            s.checks += 1;
            s.bytes += len as u64;
        }
        p.say(&format!(
            "client: RDMA WRITE {:?} bytes at odd offsets: data and guard bytes intact{tag}",
            sizes(max)
        ));
        {
            seed += 1;
            let (off, len, imm) = (
                GUARD + 5,
                1000.min(max.saturating_sub(2 * GUARD + 5)),
                0xC0DE_0000 | (seed as u32 & 0xffff),
            );
            p.data.write(0, &pattern::make(len, seed))?;
            p.command(&format!("PREP {off} {len}"))?;
            p.send_msg(&format!("EXPECT_IMM {off} {len} {seed} {imm}"))?;
            let r = p.recv_msg()?;
            check(r == "OK", || format!("EXPECT_IMM answered {r:?}"))?;
            let sge = [p.data_sge(0, len)?];
            let id = p.id(K_DAT_SEND);
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: remote(off),
                rkey: peer.rkey,
                imm,
            };
            p.dat
                .post_send(&[SendWr::signaled(id, op, &sge[..usize::from(len > 0)])])?;
            p.wait_id("the RDMA WRITE with immediate completion", id)?;
            let r = p.recv_msg()?;
            check(r == "OK", || {
                format!("RDMA WRITE with immediate: server says {r:?}")
            })?;
            s.checks += 1;
            p.say(&format!(
                "client: RDMA WRITE with immediate {imm:#x}: delivered with its data{tag}"
            ));
        }

        // 4. RDMA READ of server-filled data.
        for &len in &sizes(max) {
            seed += 1;
            let off = if len + 7 <= max { 7 } else { 0 };
            p.command(&format!("FILL {off} {len} {seed}"))?;
            p.data.fill(0, len, 0)?;
            let sge = [p.data_sge(0, len)?];
            let id = p.id(K_DAT_SEND);
            let op = SendOp::RdmaRead {
                remote_addr: remote(off),
                rkey: peer.rkey,
            };
            p.dat
                .post_send(&[SendWr::signaled(id, op, &sge[..usize::from(len > 0)])])?;
            p.wait_id("the RDMA READ completion", id)?;
            let got = p.data.to_vec(0, len)?;
            if let Some(i) = pattern::first_mismatch(&got, seed) {
                return Err(Error::Check(format!(
                    "RDMA READ of {len} bytes: byte {i} differs"
                )));
            }
            s.checks += 1;
            s.bytes += len as u64;
        }
        p.say(&format!(
            "client: RDMA READ {:?} bytes: all read intact{tag}",
            sizes(max)
        ));

        // 5. Atomics.
        if p.dev.features() & F_ATOMIC != 0 && max >= 4096 {
            let off = 4096 - 8;
            p.command(&format!("U64 {off} 1000"))?;
            let n = 50u64;
            for i in 0..n {
                let sge = [p.data_sge(8, 8)?];
                let id = p.id(K_DAT_SEND);
                let op = SendOp::AtomicFetchAdd {
                    remote_addr: remote(off),
                    rkey: peer.rkey,
                    add: 3,
                };
                p.dat.post_send(&[SendWr::signaled(id, op, &sge)])?;
                let wc = p.wait_id("FETCH_AND_ADD", id)?;
                check(wc.opcode() == Some(WcOpcode::FETCH_ADD), || {
                    format!("{wc:?}")
                })?;
                let old = u64::from_le_bytes(p.data.to_vec(8, 8)?.try_into().unwrap_or([0; 8]));
                check(old == 1000 + 3 * i, || {
                    format!("FETCH_AND_ADD {i} returned {old}")
                })?;
            }
            let sge = [p.data_sge(8, 8)?];
            let id = p.id(K_DAT_SEND);
            let op = SendOp::AtomicCmpSwp {
                remote_addr: remote(off),
                rkey: peer.rkey,
                compare: 1000 + 3 * n,
                swap: 7,
            };
            p.dat.post_send(&[SendWr::signaled(id, op, &sge)])?;
            p.wait_id("CMP_AND_SWP", id)?;
            p.command(&format!("IS_U64 {off} 7"))?;
            s.checks += n as u32 + 1;
            p.say(&format!("client: {n} FETCH_AND_ADD and one CMP_AND_SWP: every old value and the final value exact{tag}"));
        }
    }

    // 6. WRITE stream.
    if opts.stream_writes > 0 && max > 0 {
        let depth = 8;
        let sge = [p.data_sge(0, max)?];
        let t = Instant::now();
        let mut posted = 0u32;
        let mut done = 0u32;
        while done < opts.stream_writes {
            while posted < opts.stream_writes && posted - done < depth {
                let id = p.id(K_DAT_SEND);
                let op = SendOp::RdmaWrite {
                    remote_addr: remote(0),
                    rkey: peer.rkey,
                };
                p.dat.post_send(&[SendWr::signaled(id, op, &sge)])?;
                posted += 1;
            }
            p.wait("an RDMA WRITE of the stream", |w| {
                w.wr_id & KIND_MASK == K_DAT_SEND
            })?;
            done += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        s.write_mbps = f64::from(opts.stream_writes) * max as f64 / secs / 1e6;
        p.say(&format!(
            "client: RDMA WRITE stream: {} x {} KiB in {:.3} s = {:.1} MB/s",
            opts.stream_writes,
            max >> 10,
            secs,
            s.write_mbps
        ));
    }

    p.send_msg("DONE")?;
    let r = p.recv_msg()?;
    check(r == "BYE", || format!("DONE answered {r:?}"))?;
    p.say(&format!(
        "client: done: {} checks passed, {} bytes moved and checked",
        s.checks, s.bytes
    ));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_info_round_trips() {
        let i = PeerInfo {
            ctl_qpn: 0x11,
            dat_qpn: 0xabcdef,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            addr: 0x7f00_0000_1000,
            rkey: 0xdead_beef,
            len: 4 << 20,
        };
        assert_eq!(PeerInfo::decode(&i.encode()), Some(i));
        assert_eq!(PeerInfo::decode("ctl=1 dat=2"), None);
        assert_eq!(
            PeerInfo::decode(&i.encode().replace("gid=fe80", "gid=fe8")),
            None
        );
    }

    #[test]
    fn sizes_cover_edges_and_the_whole_buffer() {
        let s = sizes(4 << 20);
        assert_eq!(s[0], 0);
        assert!(s.contains(&4097));
        assert_eq!(*s.last().unwrap(), 4 << 20);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sizes(4096), vec![0, 1, 7, 4095, 4096]);
    }

    /// A line that echoes everything back to its sender (a serial port whose
    /// far end is not in raw mode yet) and also delivers it.
    struct Echoing(crate::oob::ChannelOob, std::collections::VecDeque<String>);

    impl Oob for Echoing {
        fn send(&mut self, msg: &str) -> std::io::Result<()> {
            self.1.push_back(msg.to_string());
            self.0.send(msg)
        }
        fn recv(&mut self, timeout: Duration) -> std::io::Result<Option<String>> {
            if let Some(m) = self.1.pop_front() {
                return Ok(Some(m));
            }
            self.0.recv(timeout)
        }
    }

    #[test]
    fn sync_ignores_its_own_echo() {
        use crate::oob::ChannelOob;
        let (a, mut b) = ChannelOob::pair();
        let mut a = Echoing(a, Default::default());
        let t = std::thread::spawn(move || sync(&mut a, "x", "from-a", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(300));
        let got_b = sync(&mut b, "x", "from-b", Duration::from_secs(5)).unwrap();
        assert_eq!(got_b, "from-a");
        assert_eq!(t.join().unwrap().unwrap(), "from-b");
    }

    /// Lines mangled on the wire (two messages run together, a cut line,
    /// a flipped character) are ignored; the repeat gets through.
    #[test]
    fn sync_ignores_garbled_lines() {
        use crate::oob::ChannelOob;
        let (mut a, mut b) = ChannelOob::pair();
        let good = sync_line("x 1234 0 ctl=1 dat=2");
        for bad in [
            format!("SYNC x 99 0 {}", good),
            good.replace("ctl=1", "ctl=7"),
            good[..good.len() - 3].to_string(),
            "SYNC x 5 0 no checksum".to_string(),
        ] {
            assert_eq!(sync_body(&bad), None, "{bad:?}");
            a.send(&bad).unwrap();
        }
        assert_eq!(sync_body(&good), Some("x 1234 0 ctl=1 dat=2"));
        let t = std::thread::spawn(move || sync(&mut a, "x", "from-a", Duration::from_secs(5)));
        let got_b = sync(&mut b, "x", "from-b", Duration::from_secs(5)).unwrap();
        assert_eq!(got_b, "from-a");
        assert_eq!(t.join().unwrap().unwrap(), "from-b");
    }

    #[test]
    fn sync_survives_lost_first_messages() {
        use crate::oob::ChannelOob;
        let (mut a, mut b) = ChannelOob::pair();
        // b starts late: a's first messages sit unread, which is fine; what
        // matters is both sides end with the other's payload.
        let t = std::thread::spawn(move || sync(&mut a, "x", "from-a", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(300));
        let got_b = sync(&mut b, "x", "from-b", Duration::from_secs(5)).unwrap();
        assert_eq!(got_b, "from-a");
        assert_eq!(t.join().unwrap().unwrap(), "from-b");
    }
}
