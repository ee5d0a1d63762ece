//! perftest's RDMA WRITE measurements between two peers that swap their
//! addresses over an out-of-band channel ([`Oob`]; a TCP connection
//! between machines in `rdma-peer`): [`write_lat`] measures as
//! `ib_write_lat` does, [`write_bw`] as `ib_write_bw` does. Neither
//! interoperates with the perftest tools (their exchange is their own);
//! the methods are theirs, so the numbers compare.
//!
//! Both connect one RC QP per side at the path MTU both ports have active
//! (each side's `QUERY_PORT`, the smaller of the two), and each side
//! registers a buffer the other may write into and sends its address and
//! rkey. The messages of the handshake are `key=value` text, every field
//! validated: both sides must run the same test with the same
//! size and iteration count, and a peer that does not is an error saying
//! so.
//!
//! **`write_lat`** (perftest's `run_iter_lat_write`): the client RDMA
//! WRITEs SIZE bytes into the server's buffer, the last byte carrying the
//! iteration's marker; the server polls that byte in its own memory
//! (volatile reads of the DMA buffer) until the marker shows, then WRITEs
//! back the same way into the client's buffer, which the client polls.
//! The marker of iteration `k` is `k % 255 + 1` ([`marker`]): never 0, so
//! the zeroed buffer never passes for an arrival, and never the previous
//! iteration's, so the byte left from it never does either. A WRITE is
//! placed in order, so when the last byte shows the whole message has
//! landed (perftest relies on the same). [`LAT_WARMUP`] round trips run
//! first, unmeasured; then each of the ITERS round trips is timed from just
//! before the client's post to the moment it sees the server's marker, and
//! the latency is half of it (perftest's round-trip factor of 2 for
//! WRITE). The server times its own half the same way (from its post to
//! the client's next marker). [`LatReport`] has perftest's statistics:
//! minimum, median ("typical"), average and 99th percentile.
//!
//! **`write_bw`** (perftest's `run_iter_bw`): the client keeps up to
//! `tx_depth` RDMA WRITEs of SIZE bytes outstanding into the server's
//! buffer, ITERS in all, timed from the first post to the last completion;
//! MB/s counts 10^6 bytes. It then tells the server it is done and the
//! time it took; the server checks that its buffer holds the bytes the
//! client sent (a pattern), and both print the result.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::Mtu;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpCap, QpInit, RcConnect, SendFlags, SendOp, SendWr,
    WorkCompletion,
};

use crate::exchange::{sync, Role};
use crate::oob::Oob;
use crate::pattern;
use crate::pingpong::{gid_to_wire, random_psn, say, wire_to_gid};
use crate::{Error, Result};

/// Unmeasured round trips of [`write_lat`] before the measured ones: the
/// first touch of the buffers and the device's first WQEs are not the
/// steady state.
pub const LAT_WARMUP: u32 = 16;
/// Send queue depth of [`write_lat`].
const LAT_SQ_DEPTH: u32 = 64;
/// [`write_lat`] signals one WRITE in this many (and the last); the rest
/// are unsignaled, and the CQ is polled without waiting after each round
/// trip, outside its timing. perftest's `run_iter_lat_write` signals every
/// WRITE and polls for its completion inside the loop instead; an RC
/// WRITE completes on the responder's ACK, which comes about when its
/// answer does, so either way the round trip is the WRITEs', and this way
/// costs a CQE per 16 rather than per iteration. A signaled completion
/// tells that the WRITEs before it are done too (a send queue completes in
/// order), which frees their slots.
const LAT_SIGNAL_EVERY: u64 = 16;
/// [`write_bw`] signals at most one WRITE in this many (fewer with a small
/// `tx_depth`), as perftest's default `cq_mod`.
const BW_MAX_SIGNAL_EVERY: u32 = 64;
/// Seed of the pattern [`write_bw`]'s client writes (the server checks it).
const BW_SEED: u64 = 0xB0B0;
/// Characters of a peer's message quoted in an error.
const QUOTE: usize = 160;
/// What a peer that gives up sends before it closes: `FAIL <reason>`.
pub(crate) const FAIL: &str = "FAIL";

/// The first characters of `text`, for an error message.
pub(crate) fn quote(text: &str) -> String {
    let mut q: String = text.chars().take(QUOTE).collect();
    if q.len() < text.len() {
        q.push_str("...");
    }
    q
}

/// The `key=value` fields of a message from the peer. Every accessor
/// validates (the key is there once, the value has the expected form), so
/// nothing the peer sends can make the caller panic; an error names the
/// message, the field and what is wrong with it.
pub(crate) struct Fields<'a> {
    what: &'a str,
    msg: &'a str,
}

impl<'a> Fields<'a> {
    /// The fields of `msg`, `what` being its name in errors ("the peer's
    /// address message").
    pub(crate) fn new(what: &'a str, msg: &'a str) -> Self {
        Fields { what, msg }
    }

    fn bad(&self, why: &str) -> Error {
        Error::Protocol(format!(
            "malformed {}: {why} (message \"{}\")",
            self.what,
            quote(self.msg)
        ))
    }

    /// The value of `key`.
    pub(crate) fn raw(&self, key: &str) -> Result<&'a str> {
        let mut found = None;
        for (k, v) in self
            .msg
            .split_whitespace()
            .filter_map(|t| t.split_once('='))
        {
            if k == key {
                if found.is_some() {
                    return Err(self.bad(&format!("{key} given twice")));
                }
                found = Some(v);
            }
        }
        found.ok_or_else(|| self.bad(&format!("no {key}=")))
    }

    /// `key` as hex digits (no sign, no `0x`, at most 16 digits).
    pub(crate) fn hex_u64(&self, key: &str) -> Result<u64> {
        let v = self.raw(key)?;
        if v.is_empty() || v.len() > 16 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.bad(&format!("{key} {v:?} is not a hex number")));
        }
        u64::from_str_radix(v, 16).map_err(|e| self.bad(&format!("{key} {v:?}: {e}")))
    }

    /// `key` as hex digits of at most 32 bits.
    pub(crate) fn hex_u32(&self, key: &str) -> Result<u32> {
        let v = self.hex_u64(key)?;
        u32::try_from(v).map_err(|_| self.bad(&format!("{key} {v:#x} is wider than 32 bits")))
    }

    /// `key` as decimal digits (no sign).
    pub(crate) fn dec_u64(&self, key: &str) -> Result<u64> {
        let v = self.raw(key)?;
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.bad(&format!("{key} {v:?} is not a decimal number")));
        }
        v.parse()
            .map_err(|e| self.bad(&format!("{key} {v:?}: {e}")))
    }

    /// `key` as a GID: 32 hex digits, the bytes in memory order.
    pub(crate) fn gid(&self, key: &str) -> Result<[u8; 16]> {
        let v = self.raw(key)?;
        wire_to_gid(v).ok_or_else(|| self.bad(&format!("{key} {v:?} is not 32 hex digits")))
    }

    /// `key` as a 24-bit QP number of an ordinary QP (not QP0 or QP1).
    pub(crate) fn qpn(&self, key: &str) -> Result<u32> {
        let v = self.hex_u32(key)?;
        if !(2..=0xff_ffff).contains(&v) {
            return Err(self.bad(&format!(
                "{key} {v:#x} is not the number of an ordinary QP (2 to 0xffffff)"
            )));
        }
        Ok(v)
    }
}

/// Sends one line of a program's own protocol to the peer.
pub(crate) fn send_line(oob: &mut dyn Oob, line: &str) -> Result<()> {
    oob.send(line)?;
    Ok(())
}

/// Waits at most `timeout` for the peer's next protocol line, which must
/// begin with the word(s) `head`; returns the rest of it. Repeats of a
/// finished [`sync`] still in the channel are skipped; `FAIL <reason>` is
/// an error carrying the peer's reason; any other line is a protocol error
/// naming `what` was expected.
pub(crate) fn expect_line(
    oob: &mut dyn Oob,
    head: &str,
    what: &str,
    timeout: Duration,
) -> Result<String> {
    expect_one_of(oob, &[head], what, timeout).map(|(_, rest)| rest)
}

/// [`expect_line`] for a line that may begin with any of `heads`: returns
/// the head it began with and the rest of it.
pub(crate) fn expect_one_of<'h>(
    oob: &mut dyn Oob,
    heads: &[&'h str],
    what: &str,
    timeout: Duration,
) -> Result<(&'h str, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(what.to_string()));
        }
        let Some(line) = oob.recv(left)? else {
            continue;
        };
        if line.starts_with("SYNC ") {
            continue;
        }
        let after = |h: &str| {
            line.strip_prefix(h)
                .filter(|r| r.is_empty() || r.starts_with(' '))
                .map(|r| r.trim_start().to_string())
        };
        if let Some(reason) = after(FAIL) {
            return Err(Error::Protocol(format!(
                "the peer gave up: {}",
                quote(&reason)
            )));
        }
        return heads
            .iter()
            .find_map(|&h| after(h).map(|rest| (h, rest)))
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "expected {what} (\"{} ...\"), the peer sent \"{}\"",
                    heads.join(" ...\" or \""),
                    quote(&line)
                ))
            });
    }
}

/// Runs `body`; if it fails, tells the peer why (best effort: it may be
/// the channel that failed) so that it stops with the reason instead of
/// waiting for its timeout.
pub(crate) fn telling_peer<T>(
    oob: &mut dyn Oob,
    body: impl FnOnce(&mut dyn Oob) -> Result<T>,
) -> Result<T> {
    body(oob).inspect_err(|e| {
        let reason = e.to_string().replace(['\r', '\n'], " ");
        let _ = oob.send(&format!("{FAIL} {reason}"));
    })
}

/// The port's active MTU, read from the device now.
pub(crate) fn active_mtu(dev: &Device) -> Result<Mtu> {
    let port = dev.query_port()?;
    Mtu::from_u32(port.active_mtu).ok_or_else(|| {
        Error::Check(format!(
            "the port's active MTU has the unknown code {}",
            port.active_mtu
        ))
    })
}

/// The path MTU in bytes.
fn mtu_bytes(m: Mtu) -> u32 {
    128 << u32::from(m)
}

/// The marker byte of `write_lat` iteration `k`: 1 to 255, never 0 (the
/// zeroed buffer) and never the previous iteration's.
pub fn marker(k: u64) -> u8 {
    u8::try_from(k % 255).map_or(1, |m| m + 1)
}

/// Which measurement a peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    WriteLat,
    WriteBw,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::WriteBw => "write_bw",
        }
    }
}

/// What a peer tells the other before connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RcInfo {
    /// `write_lat` or `write_bw`.
    test: String,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    /// The port's active MTU, an `Mtu` code.
    mtu: u32,
    /// The buffer the peer may write into.
    addr: u64,
    rkey: u32,
    len: u64,
    /// Bytes of each WRITE.
    size: u64,
    iters: u64,
}

impl RcInfo {
    const WHAT: &'static str = "the peer's address message";

    fn encode(&self) -> String {
        format!(
            "test={} qpn={:x} psn={:x} gid={} mtu={} addr={:x} rkey={:x} len={:x} size={} iters={}",
            self.test,
            self.qpn,
            self.psn,
            gid_to_wire(&self.gid),
            self.mtu,
            self.addr,
            self.rkey,
            self.len,
            self.size,
            self.iters
        )
    }

    fn decode(msg: &str) -> Result<RcInfo> {
        let f = Fields::new(Self::WHAT, msg);
        // In the order of the message, so that the first fault is named.
        let test = f.raw("test")?.to_string();
        let qpn = f.qpn("qpn")?;
        let psn = f.hex_u32("psn")?;
        if psn > 0xff_ffff {
            return Err(f.bad(&format!("psn {psn:#x} is wider than 24 bits")));
        }
        let gid = f.gid("gid")?;
        let mtu = u32::try_from(f.dec_u64("mtu")?).unwrap_or(0);
        if Mtu::from_u32(mtu).is_none() {
            return Err(f.bad(&format!("mtu {mtu} is not an MTU code (1 to 5)")));
        }
        Ok(RcInfo {
            test,
            qpn,
            psn,
            gid,
            mtu,
            addr: f.hex_u64("addr")?,
            rkey: f.hex_u32("rkey")?,
            len: f.hex_u64("len")?,
            size: f.dec_u64("size")?,
            iters: f.dec_u64("iters")?,
        })
    }

    /// Whether `peer` runs the same measurement as we do, with a buffer
    /// that takes our WRITEs.
    fn check_peer(&self, peer: &RcInfo) -> Result<()> {
        let differ = |what: &str, ours: &dyn std::fmt::Display, theirs: &dyn std::fmt::Display| {
            Err(Error::Protocol(format!(
                "the peer runs {what} {theirs}, we run {ours}: give both sides the same test, -s and -n"
            )))
        };
        if peer.test != self.test {
            return differ("the test", &self.test, &quote(&peer.test));
        }
        if peer.size != self.size {
            return differ("-s", &self.size, &peer.size);
        }
        if peer.iters != self.iters {
            return differ("-n", &self.iters, &peer.iters);
        }
        if peer.len < self.size {
            return Err(Error::Protocol(format!(
                "the peer's buffer has {} bytes, fewer than the {} of a WRITE",
                peer.len, self.size
            )));
        }
        Ok(())
    }
}

/// One side's QP and buffers: `src` is written from, `dst` is where the
/// peer writes into.
struct Rc {
    cq: Arc<Cq>,
    qp: Qp,
    src: Arc<DmaBuf>,
    src_mr: Mr,
    dst: Arc<DmaBuf>,
    dst_mr: Mr,
    psn: u32,
    mtu: Mtu,
    /// The QP is UC.
    uc: bool,
}

impl Rc {
    fn new(dev: &Device, sq_depth: u32, size: usize, uc: bool) -> Result<Rc> {
        let pd = Pd::alloc(dev)?;
        // Room for a completion of every WRITE the send queue can hold.
        let cq = Cq::create(dev, sq_depth.saturating_add(1))?;
        let mut init = if uc { QpInit::uc(&cq) } else { QpInit::rc(&cq) };
        init.cap = QpCap {
            max_send_wr: sq_depth,
            // Nothing is received (WRITEs without immediate), but a QP
            // without an SRQ has a receive queue of at least one.
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = Qp::create(&pd, &init)?;
        let src = Arc::new(dev.alloc_dma(size, 4096)?);
        src.fill(0, size, 0)?;
        let src_mr = Mr::register(&pd, src.clone(), access::LOCAL_WRITE)?;
        let dst = Arc::new(dev.alloc_dma(size, 4096)?);
        dst.fill(0, size, 0)?;
        let dst_mr = Mr::register(&pd, dst.clone(), access::LOCAL_WRITE | access::REMOTE_WRITE)?;
        Ok(Rc {
            cq,
            qp,
            src,
            src_mr,
            dst,
            dst_mr,
            psn: random_psn(),
            mtu: active_mtu(dev)?,
            uc,
        })
    }

    fn info(&self, dev: &Device, test: Test, size: usize, iters: u32) -> RcInfo {
        RcInfo {
            // Both sides must run the same QP type too.
            test: format!("{}{}", test.name(), if self.uc { "_uc" } else { "" }),
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: dev.gid(),
            mtu: u32::from(self.mtu),
            addr: self.dst_mr.iova(),
            rkey: self.dst_mr.rkey(),
            len: self.dst.len() as u64,
            size: size as u64,
            iters: u64::from(iters),
        }
    }

    /// Swaps addresses with the peer, connects at the smaller of the two
    /// ports' active MTUs, and waits until the peer is connected too (a
    /// WRITE must not reach a QP still in RESET).
    fn handshake(
        &self,
        oob: &mut dyn Oob,
        mine: &RcInfo,
        timeout: Duration,
        out: &mut dyn Write,
    ) -> Result<RcInfo> {
        let peer = RcInfo::decode(&sync(oob, "perf", &mine.encode(), timeout)?)?;
        mine.check_peer(&peer)?;
        // Both MTU codes were checked to be valid; the smaller one is.
        let mtu = Mtu::from_u32(mine.mtu.min(peer.mtu)).unwrap_or(Mtu::MTU_256);
        let mut c = RcConnect::new(peer.qpn, peer.gid);
        c.path_mtu = mtu;
        c.rq_psn = peer.psn;
        c.sq_psn = self.psn;
        if self.uc {
            self.qp.uc_connect(access::REMOTE_WRITE, &c)?;
        } else {
            self.qp.rc_connect(access::REMOTE_WRITE, &c)?;
        }
        say(
            out,
            &format!(
                "{} QP: QPN {:#08x} connected to QPN {:#08x} at {}, path MTU {}",
                mine.test,
                self.qp.qpn(),
                peer.qpn,
                std::net::Ipv6Addr::from(peer.gid),
                mtu_bytes(mtu)
            ),
        );
        // Lines, not another `sync`: a peer that failed to connect says
        // so (`FAIL ...`), which `sync` would pass over until its timeout.
        send_line(oob, "PERF CONNECTED")?;
        expect_line(oob, "PERF CONNECTED", "the peer's connection", timeout)?;
        Ok(peer)
    }
}

/// Posts RDMA WRITEs from `src`, one in `every` signaled (and the last),
/// keeping at most `depth` of them not known to be complete. Unsignaled
/// WRITEs are known complete once a later signaled one completes (a send
/// queue completes in order); their slots are then free again.
struct Writer<'a> {
    rc: &'a Rc,
    depth: u64,
    every: u64,
    posted: u64,
    retired: u64,
    timeout: Duration,
}

impl<'a> Writer<'a> {
    fn new(rc: &'a Rc, depth: u32, every: u64, timeout: Duration) -> Self {
        Writer {
            rc,
            depth: u64::from(depth.max(1)),
            every: every.max(1),
            posted: 0,
            retired: 0,
            timeout,
        }
    }

    /// Posts one WRITE of `len` bytes to `remote_addr`; `last` signals it
    /// whatever its number.
    fn post(&mut self, len: usize, remote_addr: u64, rkey: u32, last: bool) -> Result<()> {
        while self.posted - self.retired >= self.depth {
            self.reap(true)?;
        }
        let len = u32::try_from(len)
            .map_err(|_| Error::Check(format!("a WRITE of {len} bytes is too long")))?;
        let sge = [self.rc.src_mr.sge(0, len)?];
        let signaled = last || (self.posted + 1) % self.every == 0;
        self.rc.qp.post_send(&[SendWr {
            // The WRITE's number: a completion retires it and all before.
            wr_id: self.posted,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            payload: Payload::Sges(&sge),
            flags: if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            },
            ud: None,
        }])?;
        self.posted += 1;
        Ok(())
    }

    /// Takes the completions there are; with `wait`, waits (at most the
    /// timeout) until there is at least one. A failed WRITE is an error
    /// (failures complete whether signaled or not).
    fn reap(&mut self, wait: bool) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let n = self.rc.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                if !wc.is_success() {
                    return Err(Error::Check(format!(
                        "RDMA WRITE {} of {} completed with status {} (vendor error {:#x})",
                        wc.wr_id,
                        self.posted,
                        wc.status().map_or("unknown", |s| s.name()),
                        wc.vendor_err
                    )));
                }
                if wc.wr_id < self.retired || wc.wr_id >= self.posted {
                    return Err(Error::Check(format!(
                        "completion for WRITE {} while {} to {} were outstanding",
                        wc.wr_id, self.retired, self.posted
                    )));
                }
                self.retired = wc.wr_id + 1;
            }
            if n > 0 || !wait {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "the completion of RDMA WRITE {} ({} posted)",
                    self.retired, self.posted
                )));
            }
            std::thread::yield_now();
        }
    }

    /// Waits until every WRITE posted has completed.
    fn finish(&mut self) -> Result<()> {
        while self.retired < self.posted {
            self.reap(true)?;
        }
        Ok(())
    }

    /// Polls the byte at `at` of `dst` (volatile reads: the peer's WRITE
    /// lands there behind the compiler's back) until it is `want`; also
    /// reaps our own completions now and then, so that a WRITE of ours
    /// that failed ends the wait with its error rather than a timeout.
    fn wait_marker(&mut self, at: usize, want: u8, k: u64) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut b = [0u8; 1];
        let mut spins = 0u32;
        loop {
            self.rc.dst.read(at, &mut b)?;
            if b[0] == want {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                self.reap(false)?;
                if Instant::now() > deadline {
                    return Err(Error::Timeout(format!(
                        "the peer's WRITE of iteration {k} (marker {want}; the byte is {})",
                        b[0]
                    )));
                }
            }
            // Two peers and the daemon may share few CPUs (two QEMU
            // guests, or this machine's two cores): spin politely.
            std::thread::yield_now();
        }
    }
}

/// Parameters of [`write_lat`] and [`write_bw`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Bytes of each RDMA WRITE (at least 1, at most the port's largest
    /// message).
    pub size: usize,
    /// Measured iterations (round trips of `write_lat`, WRITEs of
    /// `write_bw`).
    pub iters: u32,
    /// `write_bw`'s client: WRITEs kept outstanding.
    pub tx_depth: u32,
    /// Longest wait for anything: the peer's messages, a completion, the
    /// peer's WRITE, `write_bw`'s whole run on the server.
    pub timeout: Duration,
    /// A UC QP instead of an RC one (both sides must say so). UC has no
    /// acknowledgements and may lose a WRITE; `write_lat` keeps one in
    /// flight each way, so a loss (none on an idle link) ends the run at
    /// `timeout` as an error rather than going unnoticed.
    pub uc: bool,
}

impl Options {
    fn validate(&self, dev: &Device) -> Result<()> {
        let max = dev.port_attr().max_msg_size as usize;
        let bad = |m: String| Err(Error::Check(format!("bad option: {m}")));
        if self.size == 0 || self.size > max {
            return bad(format!(
                "size {} out of range 1..={max} (the port's largest message)",
                self.size
            ));
        }
        if self.iters == 0 {
            return bad("iters must be at least 1".into());
        }
        if self.tx_depth == 0 {
            return bad("tx_depth must be at least 1".into());
        }
        Ok(())
    }
}

/// What [`write_lat`] measured, in microseconds (one way: half a round
/// trip).
#[derive(Debug, Clone, PartialEq)]
pub struct LatReport {
    /// Bytes of each WRITE.
    pub size: usize,
    /// Measured iterations.
    pub iters: usize,
    /// The shortest.
    pub t_min: f64,
    /// The median (perftest's "typical").
    pub t_typical: f64,
    /// The mean.
    pub t_avg: f64,
    /// The 99th percentile (nearest rank).
    pub t_p99: f64,
}

impl LatReport {
    /// The statistics of `samples` (microseconds), perftest's way: the
    /// median of an even count is the mean of the middle two.
    pub fn from_samples(size: usize, samples: &[f64]) -> LatReport {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let at = |i: usize| s.get(i).copied().unwrap_or(0.0);
        let median = if n % 2 == 0 && n > 0 {
            (at(n / 2 - 1) + at(n / 2)) / 2.0
        } else {
            at(n / 2)
        };
        // Nearest rank: the smallest sample with at least 99 % of all at
        // or below it.
        let p99 = at((n * 99).div_ceil(100).saturating_sub(1));
        LatReport {
            size,
            iters: n,
            t_min: at(0),
            t_typical: median,
            t_avg: if n > 0 {
                s.iter().sum::<f64>() / n as f64
            } else {
                0.0
            },
            t_p99: p99,
        }
    }

    /// `write_lat: size S iters N t_min X t_typical Y t_avg Z t_p99 W usec`.
    pub fn line(&self) -> String {
        format!(
            "write_lat: size {} iters {} t_min {:.2} t_typical {:.2} t_avg {:.2} t_p99 {:.2} usec",
            self.size, self.iters, self.t_min, self.t_typical, self.t_avg, self.t_p99
        )
    }
}

/// What [`write_bw`] measured (the client's clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwReport {
    /// Bytes of each WRITE.
    pub size: usize,
    /// WRITEs.
    pub iters: u32,
    /// From the first post to the last completion.
    pub elapsed: Duration,
}

impl BwReport {
    /// Megabytes (10^6 bytes) per second; 0 for a run too short to time.
    pub fn mb_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.size as f64 * f64::from(self.iters) / secs / 1e6
        } else {
            0.0
        }
    }

    /// Millions of WRITEs per second; 0 for a run too short to time.
    pub fn mmsg_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            f64::from(self.iters) / secs / 1e6
        } else {
            0.0
        }
    }

    /// `write_bw: size S iters N MB/s X Mmsg/s Y`.
    pub fn line(&self) -> String {
        format!(
            "write_bw: size {} iters {} MB/s {:.2} Mmsg/s {:.6}",
            self.size,
            self.iters,
            self.mb_per_s(),
            self.mmsg_per_s()
        )
    }
}

/// `ib_write_lat`'s measurement (module documentation) as `role`, against
/// a peer running it as the other role; prints [`LatReport::line`] on both
/// sides.
pub fn write_lat(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<LatReport> {
    // A bad option fails the peer too, with the reason.
    telling_peer(oob, |oob| {
        opts.validate(dev)?;
        lat(dev, role, oob, opts, out)
    })
}

fn lat(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<LatReport> {
    let rc = Rc::new(dev, LAT_SQ_DEPTH, opts.size, opts.uc)?;
    let mine = rc.info(dev, Test::WriteLat, opts.size, opts.iters);
    let peer = rc.handshake(oob, &mine, opts.timeout, out)?;
    let mut w = Writer::new(&rc, LAT_SQ_DEPTH, LAT_SIGNAL_EVERY, opts.timeout);
    let last = opts.size - 1;
    let total = u64::from(LAT_WARMUP) + u64::from(opts.iters);
    let mut samples = Vec::with_capacity(opts.iters as usize);
    let half_us = |t: Instant| t.elapsed().as_secs_f64() * 1e6 / 2.0;
    match role {
        Role::Client => {
            for k in 0..total {
                let t = Instant::now();
                rc.src.write(last, &[marker(k)])?;
                w.post(opts.size, peer.addr, peer.rkey, k + 1 == total)?;
                w.wait_marker(last, marker(k), k)?;
                if k >= u64::from(LAT_WARMUP) {
                    samples.push(half_us(t));
                }
                // Outside the timed part: retire what has completed.
                w.reap(false)?;
            }
        }
        Role::Server => {
            // When our previous answer was posted: the round trip is from
            // there to the client's next WRITE.
            let mut answered: Option<Instant> = None;
            for k in 0..total {
                w.wait_marker(last, marker(k), k)?;
                if let Some(t) = answered.filter(|_| k >= u64::from(LAT_WARMUP)) {
                    samples.push(half_us(t));
                }
                let t = Instant::now();
                rc.src.write(last, &[marker(k)])?;
                w.post(opts.size, peer.addr, peer.rkey, k + 1 == total)?;
                answered = Some(t);
                w.reap(false)?;
            }
        }
    }
    // Our last WRITE must have landed before the peer may tear down.
    w.finish()?;
    send_line(oob, "LAT END")?;
    expect_line(oob, "LAT END", "the peer's end of write_lat", opts.timeout)?;
    let r = LatReport::from_samples(opts.size, &samples);
    say(out, &r.line());
    Ok(r)
}

/// `ib_write_bw`'s measurement (module documentation) as `role`, against
/// a peer running it as the other role; prints [`BwReport::line`] on both
/// sides (the server with the client's time).
pub fn write_bw(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<BwReport> {
    // A bad option fails the peer too, with the reason.
    telling_peer(oob, |oob| {
        opts.validate(dev)?;
        bw(dev, role, oob, opts, out)
    })
}

/// How many of `write_bw`'s WRITEs are signaled: one in `min(tx_depth /
/// 2, 64)`, so that at least two are in flight among the `tx_depth`
/// outstanding and the queue refills before it drains.
pub fn bw_signal_every(tx_depth: u32) -> u32 {
    (tx_depth / 2).clamp(1, BW_MAX_SIGNAL_EVERY)
}

fn bw(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<BwReport> {
    let depth = match role {
        Role::Client => opts.tx_depth,
        Role::Server => 1,
    };
    let rc = Rc::new(dev, depth, opts.size, opts.uc)?;
    let mine = rc.info(dev, Test::WriteBw, opts.size, opts.iters);
    let peer = rc.handshake(oob, &mine, opts.timeout, out)?;
    let report = |ns: u64| BwReport {
        size: opts.size,
        iters: opts.iters,
        elapsed: Duration::from_nanos(ns),
    };
    match role {
        Role::Client => {
            rc.src.write(0, &pattern::make(opts.size, BW_SEED))?;
            let every = u64::from(bw_signal_every(depth));
            let mut w = Writer::new(&rc, depth, every, opts.timeout);
            let t = Instant::now();
            for i in 0..opts.iters {
                w.post(opts.size, peer.addr, peer.rkey, i + 1 == opts.iters)?;
            }
            w.finish()?;
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            send_line(oob, &format!("BW DONE ns={ns}"))?;
            expect_line(
                oob,
                "BW CHECKED",
                "the server's check of the data",
                opts.timeout,
            )?;
            let r = report(ns);
            say(out, &r.line());
            Ok(r)
        }
        Role::Server => {
            let msg = expect_line(oob, "BW DONE", "the client's end of write_bw", opts.timeout)?;
            let ns = Fields::new("the client's end of write_bw", &msg).dec_u64("ns")?;
            let got = rc.dst.to_vec(0, opts.size)?;
            if let Some(i) = pattern::first_mismatch(&got, BW_SEED) {
                return Err(Error::Check(format!(
                    "after the client's {} WRITEs of {} bytes, byte {i} of the buffer differs from what it wrote",
                    opts.iters, opts.size
                )));
            }
            send_line(oob, "BW CHECKED")?;
            let r = report(ns);
            say(out, &r.line());
            Ok(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::ChannelOob;

    fn info() -> RcInfo {
        RcInfo {
            test: "write_lat".into(),
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 43, 0, 2],
            mtu: 3,
            addr: 0x7f00_0000_1000,
            rkey: 0xdead_beef,
            len: 4096,
            size: 64,
            iters: 1000,
        }
    }

    #[test]
    fn rc_info_round_trips() {
        let i = info();
        assert_eq!(
            i.encode(),
            "test=write_lat qpn=11 psn=abcdef gid=00000000000000000000ffff0a2b0002 mtu=3 \
             addr=7f0000001000 rkey=deadbeef len=1000 size=64 iters=1000"
        );
        assert_eq!(RcInfo::decode(&i.encode()).unwrap(), i);
    }

    #[test]
    fn rc_info_refuses_malformed_messages() {
        let good = info().encode();
        for (bad, want) in [
            (
                good.replace("qpn=11", "qpn=1"),
                "not the number of an ordinary QP",
            ),
            (good.replace("qpn=11", "qpn=1000000"), "ordinary QP"),
            (good.replace("qpn=11", "qpn=+11"), "not a hex number"),
            (good.replace("qpn=11 ", ""), "no qpn="),
            (format!("{good} qpn=12"), "qpn given twice"),
            (good.replace("psn=abcdef", "psn=1abcdef"), "24 bits"),
            (good.replace("rkey=deadbeef", "rkey=1deadbeef"), "32 bits"),
            (good.replace("mtu=3", "mtu=6"), "not an MTU code"),
            (good.replace("mtu=3", "mtu=-3"), "not a decimal"),
            (good.replace("ffff0a2b", "ffff0a2"), "not 32 hex digits"),
            (good.replace("size=64", "size=6x"), "not a decimal"),
            (
                good.replace("addr=7f0000001000", "addr=12345678901234567"),
                "not a hex",
            ),
            ("GET / HTTP/1.1".to_string(), "no test="),
            (String::new(), "no "),
        ] {
            let e = RcInfo::decode(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad:?}: {e}");
            assert!(e.contains("malformed the peer's address message"), "{e}");
        }
    }

    #[test]
    fn peers_must_run_the_same_test() {
        let mine = info();
        assert!(mine.check_peer(&info()).is_ok());
        let mut p = info();
        p.test = "write_bw".into();
        let e = mine.check_peer(&p).unwrap_err().to_string();
        assert!(
            e.contains("the peer runs the test write_bw, we run write_lat"),
            "{e}"
        );
        let mut p = info();
        p.size = 65;
        p.len = 65;
        let e = mine.check_peer(&p).unwrap_err().to_string();
        assert!(e.contains("-s 65, we run 64"), "{e}");
        let mut p = info();
        p.iters = 7;
        assert!(mine
            .check_peer(&p)
            .unwrap_err()
            .to_string()
            .contains("-n 7"));
        let mut p = info();
        p.len = 63;
        let e = mine.check_peer(&p).unwrap_err().to_string();
        assert!(e.contains("63 bytes"), "{e}");
    }

    #[test]
    fn markers_are_never_zero_nor_repeated_in_a_row() {
        assert_eq!(marker(0), 1);
        assert_eq!(marker(254), 255);
        assert_eq!(marker(255), 1);
        for k in 0..2000u64 {
            assert_ne!(marker(k), 0);
            assert_ne!(marker(k), marker(k + 1));
        }
    }

    #[test]
    fn latency_statistics() {
        let r = LatReport::from_samples(64, &[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            (r.t_min, r.t_typical, r.t_avg, r.t_p99, r.iters),
            (1.0, 3.0, 3.0, 5.0, 5)
        );
        // An even count: the median is the mean of the middle two.
        let r = LatReport::from_samples(64, &[4.0, 1.0, 2.0, 3.0]);
        assert_eq!(r.t_typical, 2.5);
        // 200 samples 1..=200: the 99th percentile is the 198th.
        let s: Vec<f64> = (1..=200).map(f64::from).collect();
        let r = LatReport::from_samples(1, &s);
        assert_eq!((r.t_min, r.t_typical, r.t_p99), (1.0, 100.5, 198.0));
        assert_eq!(
            r.line(),
            "write_lat: size 1 iters 200 t_min 1.00 t_typical 100.50 t_avg 100.50 t_p99 198.00 usec"
        );
        let r = LatReport::from_samples(1, &[]);
        assert_eq!(
            (r.t_min, r.t_typical, r.t_avg, r.t_p99),
            (0.0, 0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn bandwidth_line() {
        let r = BwReport {
            size: 65536,
            iters: 1000,
            elapsed: Duration::from_millis(500),
        };
        assert_eq!(
            r.line(),
            "write_bw: size 65536 iters 1000 MB/s 131.07 Mmsg/s 0.002000"
        );
        let r = BwReport {
            elapsed: Duration::ZERO,
            ..r
        };
        assert_eq!(r.mb_per_s(), 0.0);
        assert_eq!(bw_signal_every(128), 64);
        assert_eq!(bw_signal_every(256), 64);
        assert_eq!(bw_signal_every(16), 8);
        assert_eq!(bw_signal_every(1), 1);
        assert_eq!(bw_signal_every(3), 1);
    }

    #[test]
    fn protocol_lines() {
        let (mut a, mut b) = ChannelOob::pair();
        let t = Duration::from_secs(1);
        // Repeats of a finished sync are skipped.
        a.send("SYNC x 1 1 payload ~00000000").unwrap();
        send_line(&mut a, "UD READY 0 32").unwrap();
        assert_eq!(expect_line(&mut b, "UD READY", "r", t).unwrap(), "0 32");
        send_line(&mut a, "UD RECEIVED").unwrap();
        assert_eq!(expect_line(&mut b, "UD RECEIVED", "r", t).unwrap(), "");
        // A different line is an error naming what was expected.
        send_line(&mut a, "UD READYX 1").unwrap();
        let e = expect_line(&mut b, "UD READY", "the receives", t).unwrap_err();
        assert!(e.to_string().contains("expected the receives"), "{e}");
        // The peer's reason for giving up is passed on.
        let r: Result<()> = telling_peer(&mut a, |_| Err(Error::Check("bad\nthing".into())));
        assert!(r.is_err());
        let e = expect_line(&mut b, "UD READY", "r", t).unwrap_err();
        assert!(
            e.to_string()
                .contains("the peer gave up: check failed: bad thing"),
            "{e}"
        );
        let e = expect_line(&mut b, "X", "the thing", Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
    }

    #[test]
    fn fields_quote_long_messages() {
        let long = "x".repeat(1000);
        let e = Fields::new("m", &long).raw("k").unwrap_err().to_string();
        assert!(e.len() < 300, "{e}");
        assert!(e.ends_with("...\")"), "{e}");
    }
}
