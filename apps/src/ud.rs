//! UD datagrams between two peers, every one checked at the receiver.
//!
//! Each peer creates a UD QP with its Q_Key; the peers swap QP number, GID,
//! Q_Key and the port's largest UD payload over the out-of-band channel
//! ([`sync`]), and each creates an address handle for the other's GID.
//! Then the client sends `count` messages to the server, and the server
//! as many back. Message `i` has `1 + i % max` bytes ([`msg_len`]; `max`
//! is the smaller of the size asked for and both ports' largest UD
//! payload) of a pattern derived from `i` and the direction, and carries
//! `i` as its immediate data, so that the receiver knows which message
//! each completion is whatever its length and order, and can name the
//! ones that never came.
//!
//! The receiver checks each message: a successful receive completion with
//! the immediate, `byte_len` = 40 + the message's length (the GRH room
//! in front of the data), the sender's QP number as `src_qpn`, the GRH
//! flag, a GRH that parses ([`UdGrh::parse`]) with the sender's GID as
//! source and its own as destination, and every byte of the payload.
//!
//! UD delivers nothing to a QP without a posted receive, so the sender
//! sends in windows of at most [`WINDOW`] messages, each only once the
//! receiver has posted its receives for it, over the out-of-band channel:
//!
//! ```text
//! receiver: UD READY <first> <count>    (receives posted for first..first+count)
//! sender:   UD SENT <first> <count>     (all of them sent: their send completions came)
//! ... next window ...
//! receiver: UD RECEIVED <total>         (every message arrived and checked)
//! ```
//!
//! UD may drop messages (soft-RoCE does on a loaded host), so a window
//! whose messages have not all arrived once none has come for [`GRACE`]
//! is completed by asking the sender for the missing ones again, at most
//! `resend_rounds` times; the receives for them are still posted:
//!
//! ```text
//! receiver: UD RESEND <i> <j> ...       (these never arrived)
//! sender:   UD RESENT <n>               (sent again: their send completions came)
//! ```
//!
//! Every message that arrives is checked in full, a repeat of one asked
//! for again (the first copy was late, not lost) included; a message still
//! missing after the last round is a failure naming the missing indices.
//! The summary counts the messages asked for again, so that a caller on a
//! link that must not drop (the software RNIC) can require none. A side
//! that fails tells the other (`FAIL <reason>`), which stops with that
//! reason instead of waiting for its timeout.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::datapath::{UdGrh, WcOpcode, UD_GRH_SIZE};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpCap, QpInit, RecvWr, SendFlags, SendOp, SendWr,
    UdDest, WorkCompletion,
};

use crate::exchange::{sync, Role};
use crate::oob::Oob;
use crate::pattern;
use crate::perf::{expect_line, expect_one_of, quote, send_line, telling_peer, Fields};
use crate::pingpong::{gid_to_wire, say};
use crate::{Error, Result};

/// Messages per window: the receives posted at a time, and the largest
/// burst the sender sends.
pub const WINDOW: u32 = 32;
/// The Q_Key `rdma-peer ud` uses unless told otherwise.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;
/// How long the receiver waits without any message arriving before it
/// takes the ones still missing as lost (and asks for them again).
pub const GRACE: Duration = Duration::from_secs(5);
/// Rounds of asking for lost messages again that `rdma-peer ud` allows
/// unless told otherwise.
pub const DEFAULT_RESEND_ROUNDS: u32 = 3;
/// Bytes of the GRH in front of each received message.
const GRH: usize = UD_GRH_SIZE as usize;
/// Q_Keys with this bit set are controlled Q_Keys: a send with one uses the
/// sending QP's own Q_Key instead.
const QKEY_CONTROLLED: u32 = 1 << 31;
/// Work request id kinds (top byte); the rest is a slot or an index.
const K_SEND: u64 = 1 << 56;
const K_RECV: u64 = 2 << 56;
const KIND_MASK: u64 = 0xff << 56;

/// Parameters of [`run`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Messages each way (at least 1).
    pub count: u32,
    /// The largest message in bytes (at least 1; the ports' largest UD
    /// payload caps it).
    pub size: usize,
    /// Our QP's Q_Key (without the controlled bit, 1 << 31).
    pub qkey: u32,
    /// Longest wait for the peer's messages and for a completion.
    pub timeout: Duration,
    /// Rounds of asking for lost messages again, per window (0: a lost
    /// message fails the run at once).
    pub resend_rounds: u32,
    /// For tests of the loss handling: message numbers the sender leaves
    /// out the first time it sends them, as if the link had lost them.
    pub drop_first: Vec<u32>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Messages each way.
    pub count: u32,
    /// The largest message, in bytes.
    pub max_len: usize,
    /// Messages this side received only after asking for them again.
    pub asked_again: u32,
    /// Messages this side sent again because the peer asked.
    pub sent_again: u32,
}

/// Which way messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToServer = 1,
    ToClient = 2,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::ToServer => "client -> server",
            Dir::ToClient => "server -> client",
        }
    }
}

/// Bytes of message `i` when messages have at most `max` bytes: 1, 2, ...
/// `max`, 1, 2, ...
pub fn msg_len(i: u32, max: usize) -> usize {
    1 + (i as usize) % max.max(1)
}

/// The pattern seed of message `i` going `dir`.
fn seed(dir: Dir, i: u32) -> u64 {
    ((dir as u64) << 32) | u64::from(i)
}

/// What a peer tells the other: its QP, GID, Q_Key, its port's largest UD
/// payload, and the run's parameters (which must match).
#[derive(Debug, Clone, PartialEq, Eq)]
struct UdInfo {
    qpn: u32,
    gid: [u8; 16],
    qkey: u32,
    max_payload: u32,
    count: u64,
    size: u64,
}

impl UdInfo {
    fn encode(&self) -> String {
        format!(
            "qpn={:x} gid={} qkey={:x} payload={} n={} size={}",
            self.qpn,
            gid_to_wire(&self.gid),
            self.qkey,
            self.max_payload,
            self.count,
            self.size
        )
    }

    fn decode(msg: &str) -> Result<UdInfo> {
        let f = Fields::new("the peer's UD address message", msg);
        let info = UdInfo {
            qpn: f.qpn("qpn")?,
            gid: f.gid("gid")?,
            qkey: f.hex_u32("qkey")?,
            max_payload: u32::try_from(f.dec_u64("payload")?).unwrap_or(u32::MAX),
            count: f.dec_u64("n")?,
            size: f.dec_u64("size")?,
        };
        if info.qkey & QKEY_CONTROLLED != 0 {
            return Err(Error::Protocol(format!(
                "the peer's Q_Key {:#x} is a controlled one (bit 31 set)",
                info.qkey
            )));
        }
        if info.max_payload == 0 {
            return Err(Error::Protocol(
                "the peer's port takes no UD payload (payload=0)".into(),
            ));
        }
        Ok(info)
    }

    fn check_peer(&self, peer: &UdInfo) -> Result<()> {
        if (peer.count, peer.size) != (self.count, self.size) {
            return Err(Error::Protocol(format!(
                "the peer runs -n {} -s {}, we run -n {} -s {}: give both sides the same",
                peer.count, peer.size, self.count, self.size
            )));
        }
        Ok(())
    }
}

/// Our UD QP and buffers: `WINDOW` send slots of `max` bytes, `WINDOW`
/// receive slots of the GRH and `max` bytes.
struct Ud<'a> {
    dev: &'a Device,
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    qp: Qp,
    send: Arc<DmaBuf>,
    send_mr: Mr,
    recv: Arc<DmaBuf>,
    recv_mr: Mr,
    /// Bytes of the largest message.
    max: usize,
    /// Bytes of a receive slot (the GRH and `max`).
    slot: usize,
    timeout: Duration,
    resend_rounds: u32,
    drop_first: Vec<u32>,
}

/// Which run a message belongs to, for errors: its direction and the
/// number of messages.
#[derive(Clone, Copy)]
struct At {
    dir: Dir,
    count: u32,
}

impl At {
    fn err(&self, i: u32, what: String) -> Error {
        Error::Check(format!(
            "UD {}: message {i} of {}: {what}",
            self.dir.name(),
            self.count
        ))
    }
}

impl<'a> Ud<'a> {
    fn new(dev: &'a Device, max: usize, opts: &Options) -> Result<Ud<'a>> {
        let pd = Pd::alloc(dev)?;
        // Both directions of a window and one to spare.
        let cq = Cq::create(dev, 2 * WINDOW + 1)?;
        let mut init = QpInit::ud(&cq);
        init.cap = QpCap {
            max_send_wr: WINDOW,
            max_recv_wr: WINDOW,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = Qp::create(&pd, &init)?;
        qp.ud_activate(opts.qkey, 0)?;
        let slot = (GRH + max).next_multiple_of(64);
        let window = WINDOW as usize;
        let send = Arc::new(dev.alloc_dma(window * max, 4096)?);
        let send_mr = Mr::register(&pd, send.clone(), access::LOCAL_WRITE)?;
        let recv = Arc::new(dev.alloc_dma(window * slot, 4096)?);
        let recv_mr = Mr::register(&pd, recv.clone(), access::LOCAL_WRITE)?;
        Ok(Ud {
            dev,
            pd,
            cq,
            qp,
            send,
            send_mr,
            recv,
            recv_mr,
            max,
            slot,
            timeout: opts.timeout,
            resend_rounds: opts.resend_rounds,
            drop_first: opts.drop_first.clone(),
        })
    }

    /// Sends `count` messages going `dir` to `peer`, window by window as
    /// the peer asks for them, and again those it asks for again; returns
    /// how many it sent again.
    fn send_all(&self, oob: &mut dyn Oob, peer: &UdInfo, dir: Dir, count: u32) -> Result<u32> {
        let ah = Ah::create(&self.pd, &self.dev.av(peer.gid))?;
        let dest = UdDest {
            ah: &ah,
            remote_qpn: peer.qpn,
            remote_qkey: peer.qkey,
        };
        let mut next = 0u32;
        // The window last sent, which a `UD RESEND` may name messages of.
        let mut window = 0..0u32;
        let mut sent_again = 0u32;
        loop {
            let (head, msg) = expect_one_of(
                oob,
                &["UD READY", "UD RESEND", "UD RECEIVED"],
                "the peer's receives",
                self.timeout,
            )?;
            match head {
                "UD READY" => {
                    let (first, k) = window_of(&msg, "UD READY")?;
                    if first != next || k == 0 || k > WINDOW.min(count - next) {
                        return Err(Error::Protocol(format!(
                            "the peer is ready for messages {first}..{} of {count}; the next are {next}..{}",
                            u64::from(first) + u64::from(k),
                            next + WINDOW.min(count - next)
                        )));
                    }
                    let all: Vec<u32> = (next..next + k)
                        .filter(|i| !self.drop_first.contains(i))
                        .collect();
                    self.send_some(dest, dir, next, &all)?;
                    send_line(oob, &format!("UD SENT {next} {k}"))?;
                    window = next..next + k;
                    next += k;
                }
                "UD RESEND" => {
                    let again = resend_list(&msg, &window)?;
                    self.send_some(dest, dir, window.start, &again)?;
                    sent_again += again.len() as u32;
                    send_line(oob, &format!("UD RESENT {}", again.len()))?;
                }
                _ => {
                    if next != count || msg != count.to_string() {
                        return Err(Error::Protocol(format!(
                            "the peer received \"{}\" messages, we sent {next} of {count}",
                            quote(&msg)
                        )));
                    }
                    return Ok(sent_again);
                }
            }
        }
    }

    /// Sends messages `which` (numbers in the window from `first`) and
    /// waits for their send completions: a UD send completes once the
    /// message has left, and then the receiver may look for it.
    fn send_some(&self, dest: UdDest<'_>, dir: Dir, first: u32, which: &[u32]) -> Result<()> {
        let mut sges = Vec::with_capacity(which.len());
        for &i in which {
            let len = msg_len(i, self.max);
            let off = (i - first) as usize * self.max;
            self.send.write(off, &pattern::make(len, seed(dir, i)))?;
            sges.push(self.send_mr.sge(off as u64, len as u32)?);
        }
        let wrs: Vec<SendWr<'_>> = sges
            .iter()
            .zip(which)
            .map(|(sge, &i)| SendWr {
                wr_id: K_SEND | u64::from(i),
                op: SendOp::SendWithImm { imm: i },
                payload: Payload::Sges(std::slice::from_ref(sge)),
                flags: SendFlags::SIGNALED,
                ud: Some(dest),
            })
            .collect();
        self.qp.post_send(&wrs)?;
        let mut done = 0;
        let mut deadline = Instant::now() + self.timeout;
        let mut wcs = [WorkCompletion::default(); 16];
        while done < which.len() {
            let n = self.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                let i = wc.wr_id & !KIND_MASK;
                if wc.wr_id & KIND_MASK != K_SEND || !wc.is_success() {
                    return Err(Error::Check(format!(
                        "UD {}: the send of message {i} completed with status {} (wr_id {:#x}, vendor error {:#x})",
                        dir.name(),
                        wc.status().map_or("unknown", |s| s.name()),
                        wc.wr_id,
                        wc.vendor_err
                    )));
                }
                done += 1;
            }
            if n > 0 {
                // The limit is on a stall, not on the whole window.
                deadline = Instant::now() + self.timeout;
            } else if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "the send completions of UD messages {which:?} ({done} came)"
                )));
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Receives and checks `count` messages going `dir` from `peer`;
    /// returns how many it had to ask for again.
    fn receive_all(&self, oob: &mut dyn Oob, peer: &UdInfo, dir: Dir, count: u32) -> Result<u32> {
        let at = At { dir, count };
        let mut next = 0u32;
        let mut asked_again = 0u32;
        while next < count {
            let k = WINDOW.min(count - next);
            // Zeroed, so that a GRH or bytes left from an earlier window
            // cannot pass for this one's.
            self.recv.fill(0, k as usize * self.slot, 0)?;
            self.post_recvs(0..k as usize)?;
            send_line(oob, &format!("UD READY {next} {k}"))?;
            let msg = expect_line(oob, "UD SENT", "the peer's sends", self.timeout)?;
            if window_of(&msg, "UD SENT")? != (next, k) {
                return Err(Error::Protocol(format!(
                    "the peer sent messages \"{}\", we expected {next} {k}",
                    quote(&msg)
                )));
            }
            let mut got = Got {
                seen: vec![false; k as usize],
                asked: vec![false; k as usize],
            };
            let mut round = 0;
            loop {
                let missing = self.collect(peer, at, next, &mut got)?;
                if missing.is_empty() {
                    break;
                }
                if round == self.resend_rounds {
                    return Err(lost(at, next, k, &missing, round));
                }
                round += 1;
                asked_again += missing.len() as u32;
                for &i in &missing {
                    got.asked[(i - next) as usize] = true;
                }
                let list: Vec<String> = missing.iter().map(u32::to_string).collect();
                send_line(oob, &format!("UD RESEND {}", list.join(" ")))?;
                let msg = expect_line(oob, "UD RESENT", "the peer's sends again", self.timeout)?;
                if msg != missing.len().to_string() {
                    return Err(Error::Protocol(format!(
                        "the peer sent \"{}\" messages again, we asked for {}",
                        quote(&msg),
                        missing.len()
                    )));
                }
            }
            next += k;
        }
        send_line(oob, &format!("UD RECEIVED {count}"))?;
        Ok(asked_again)
    }

    /// Posts a receive into each of `slots`.
    fn post_recvs(&self, slots: std::ops::Range<usize>) -> Result<()> {
        let sges = slots
            .clone()
            .map(|s| self.recv_mr.sge((s * self.slot) as u64, self.slot as u32))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let wrs: Vec<RecvWr<'_>> = sges
            .iter()
            .zip(slots)
            .map(|(sge, s)| RecvWr {
                wr_id: K_RECV | s as u64,
                sg_list: std::slice::from_ref(sge),
            })
            .collect();
        self.qp.post_recv(&wrs)?;
        Ok(())
    }

    /// Takes the receive completions of the window of messages from
    /// `first`, checking each, until every message has come or none has
    /// for [`GRACE`]; returns the numbers of those still missing.
    fn collect(&self, peer: &UdInfo, at: At, first: u32, got: &mut Got) -> Result<Vec<u32>> {
        let grace = GRACE.min(self.timeout);
        let mut deadline = Instant::now() + grace;
        let mut wcs = [WorkCompletion::default(); 16];
        while got.seen.iter().any(|s| !s) {
            let c = self.cq.poll(&mut wcs);
            for wc in &wcs[..c] {
                if let Some(slot) = self.check(wc, peer, at, first, got)? {
                    // A late first copy and its repeat both came: the
                    // repeat took the receive of a message still missing.
                    self.recv.fill(slot * self.slot, self.slot, 0)?;
                    self.post_recvs(slot..slot + 1)?;
                }
            }
            if c > 0 {
                deadline = Instant::now() + grace;
            } else if Instant::now() > deadline {
                break;
            } else {
                std::thread::yield_now();
            }
        }
        Ok(got
            .seen
            .iter()
            .zip(first..)
            .filter(|(s, _)| !**s)
            .map(|(_, i)| i)
            .collect())
    }

    /// Checks one receive completion of the window starting at `first`
    /// and marks its message in `got`. Returns the receive slot when the
    /// message was a second copy of one asked for again (checked all the
    /// same), whose receive the caller posts anew.
    fn check(
        &self,
        wc: &WorkCompletion,
        peer: &UdInfo,
        at: At,
        first: u32,
        got: &mut Got,
    ) -> Result<Option<usize>> {
        let slot = usize::try_from(wc.wr_id & !KIND_MASK).unwrap_or(usize::MAX);
        if wc.wr_id & KIND_MASK != K_RECV || slot >= got.seen.len() {
            return Err(Error::Check(format!(
                "UD {}: completion for an unknown work request (wr_id {:#x})",
                at.dir.name(),
                wc.wr_id
            )));
        }
        if !wc.is_success() {
            return Err(Error::Check(format!(
                "UD {}: the receive into slot {slot} (window from message {first}) completed with status {} (vendor error {:#x})",
                at.dir.name(),
                wc.status().map_or("unknown", |s| s.name()),
                wc.vendor_err
            )));
        }
        let Some(i) = wc.imm() else {
            return Err(Error::Check(format!(
                "UD {}: a message in slot {slot} came without its immediate (its number); completion {wc:?}",
                at.dir.name()
            )));
        };
        let j = i.wrapping_sub(first) as usize;
        let again = match (got.seen.get(j), got.asked.get(j)) {
            (None, _) | (_, None) => {
                return Err(at.err(
                    i,
                    format!(
                        "arrived in the window of messages {first}..{}",
                        u64::from(first) + got.seen.len() as u64
                    ),
                ))
            }
            (Some(true), Some(false)) => return Err(at.err(i, "arrived twice".into())),
            (Some(seen), Some(_)) => *seen,
        };
        got.seen[j] = true;
        if wc.opcode() != Some(WcOpcode::RECV) {
            return Err(at.err(
                i,
                format!("completion opcode {:#x}, not RECV", wc.raw_opcode),
            ));
        }
        let len = msg_len(i, self.max);
        if wc.byte_len as usize != GRH + len {
            return Err(at.err(
                i,
                format!(
                    "byte_len {}, expected {} (the {GRH}-byte GRH and {len} bytes)",
                    wc.byte_len,
                    GRH + len
                ),
            ));
        }
        if wc.src_qpn != peer.qpn {
            return Err(at.err(
                i,
                format!(
                    "source QPN {:#x}, the sender's is {:#x}",
                    wc.src_qpn, peer.qpn
                ),
            ));
        }
        if !wc.has_grh() {
            return Err(at.err(i, "the completion does not flag a GRH".into()));
        }
        let bytes = self.recv.to_vec(slot * self.slot, GRH + len)?;
        let mut raw = [0u8; GRH];
        raw.copy_from_slice(&bytes[..GRH]);
        let Some(grh) = UdGrh::parse(&raw) else {
            return Err(at.err(
                i,
                format!("the GRH does not parse as IPv6/UDP: {}", hex(&raw)),
            ));
        };
        let gid = |g: [u8; 16]| std::net::Ipv6Addr::from(g);
        if grh.sgid != peer.gid {
            return Err(at.err(
                i,
                format!(
                    "the GRH's source GID is {}, the sender's is {}",
                    gid(grh.sgid),
                    gid(peer.gid)
                ),
            ));
        }
        if grh.dgid != self.dev.gid() {
            return Err(at.err(
                i,
                format!(
                    "the GRH's destination GID is {}, ours is {}",
                    gid(grh.dgid),
                    gid(self.dev.gid())
                ),
            ));
        }
        if let Some(b) = pattern::first_mismatch(&bytes[GRH..], seed(at.dir, i)) {
            return Err(at.err(i, format!("byte {b} of {len} differs from what was sent")));
        }
        Ok(again.then_some(slot))
    }
}

/// The messages of a window seen so far, and those asked for again (of
/// which a second copy may come).
struct Got {
    seen: Vec<bool>,
    asked: Vec<bool>,
}

/// The error for messages `missing` of the window `first..first + k` that
/// never came, after `rounds` rounds of asking for them again.
fn lost(at: At, first: u32, k: u32, missing: &[u32], rounds: u32) -> Error {
    let shown: Vec<String> = missing.iter().take(20).map(u32::to_string).collect();
    Error::Check(format!(
        "UD {}: message{} {}{} of {} never arrived ({} of the {k} sent as {first}..{} did, \
         none came for {GRACE:?} at the end, {rounds} time{} asked for again); \
         UD may drop, but not this often",
        at.dir.name(),
        if missing.len() == 1 { "" } else { "s" },
        shown.join(", "),
        if missing.len() > shown.len() {
            ", ..."
        } else {
            ""
        },
        at.count,
        k as usize - missing.len(),
        first + k,
        if rounds == 1 { "" } else { "s" },
    ))
}

/// The message numbers of a `UD RESEND` line: each in `window`, none twice,
/// at least one.
fn resend_list(msg: &str, window: &std::ops::Range<u32>) -> Result<Vec<u32>> {
    let bad = |why: &str| {
        Error::Protocol(format!(
            "malformed \"UD RESEND\" message from the peer: \"{}\" ({why}; the last window was {}..{})",
            quote(msg),
            window.start,
            window.end
        ))
    };
    let mut out: Vec<u32> = Vec::new();
    for v in msg.split(' ') {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("not a list of numbers"));
        }
        let i: u32 = v.parse().map_err(|_| bad("a number too large"))?;
        if !window.contains(&i) {
            return Err(bad("a message outside the last window"));
        }
        if out.contains(&i) {
            return Err(bad("a message named twice"));
        }
        out.push(i);
    }
    if out.is_empty() {
        return Err(bad("no message"));
    }
    Ok(out)
}

/// Hex of `bytes`, for an error message.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `<first> <count>` of a window message (after `head`).
fn window_of(msg: &str, head: &str) -> Result<(u32, u32)> {
    let bad = || {
        Error::Protocol(format!(
            "malformed \"{head}\" message from the peer: \"{}\" (expected two numbers)",
            quote(msg)
        ))
    };
    let mut it = msg.split(' ');
    let mut num = || -> Result<u32> {
        let v = it.next().ok_or_else(bad)?;
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        v.parse().map_err(|_| bad())
    };
    let w = (num()?, num()?);
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(w)
}

/// Runs the UD exchange as `role` against a peer running it as the other
/// role: `opts.count` messages each way, every one checked at its
/// receiver (module documentation).
pub fn run(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<Summary> {
    // A bad option fails the peer too, with the reason.
    telling_peer(oob, |oob| ud(dev, role, oob, opts, out))
}

fn ud(
    dev: &Device,
    role: Role,
    oob: &mut dyn Oob,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<Summary> {
    if opts.count == 0 || opts.size == 0 {
        return Err(Error::Check(
            "bad option: the count and the size must be at least 1".into(),
        ));
    }
    if opts.qkey & QKEY_CONTROLLED != 0 {
        return Err(Error::Check(format!(
            "bad option: Q_Key {:#x} has bit 31 set (a controlled Q_Key)",
            opts.qkey
        )));
    }
    let payload = dev.query_port()?.max_ud_payload;
    if payload == 0 {
        return Err(Error::Check("the port takes no UD payload".into()));
    }
    // The buffers are sized for the largest message our port takes; the
    // messages are cut to what the peer's takes too once it has said.
    let own_max = opts.size.min(payload as usize);
    let u = Ud::new(dev, own_max, opts)?;
    let mine = UdInfo {
        qpn: u.qp.qpn(),
        gid: dev.gid(),
        qkey: opts.qkey,
        max_payload: payload,
        count: u64::from(opts.count),
        size: opts.size as u64,
    };
    let peer = UdInfo::decode(&sync(oob, "ud", &mine.encode(), opts.timeout)?)?;
    mine.check_peer(&peer)?;
    let max = own_max.min(peer.max_payload as usize);
    let u = Ud { max, ..u };
    say(
        out,
        &format!(
            "ud: QPN {:#08x} Q_Key {:#x}, peer QPN {:#08x} Q_Key {:#x} at {}; {} messages of 1..={max} bytes each way",
            mine.qpn,
            mine.qkey,
            peer.qpn,
            peer.qkey,
            std::net::Ipv6Addr::from(peer.gid),
            opts.count
        ),
    );
    // The loss, if any, ends each line: a caller that allows none looks
    // for the lines without it.
    let again = |n: u32, what: &str| {
        if n == 0 {
            String::new()
        } else {
            format!("; {n} lost, {what} again")
        }
    };
    let checked = |dir: Dir, n: u32| {
        format!(
            "ud: {}: {} messages received, each checked (status, length, source QPN, GRH, bytes){}",
            dir.name(),
            opts.count,
            again(n, "asked for")
        )
    };
    let sent = |dir: Dir, n: u32| {
        format!(
            "ud: {}: {} messages sent, all received{}",
            dir.name(),
            opts.count,
            again(n, "sent")
        )
    };
    let (sent_again, asked_again) = match role {
        Role::Client => {
            let a = u.send_all(oob, &peer, Dir::ToServer, opts.count)?;
            say(out, &sent(Dir::ToServer, a));
            let b = u.receive_all(oob, &peer, Dir::ToClient, opts.count)?;
            say(out, &checked(Dir::ToClient, b));
            (a, b)
        }
        Role::Server => {
            let b = u.receive_all(oob, &peer, Dir::ToServer, opts.count)?;
            say(out, &checked(Dir::ToServer, b));
            let a = u.send_all(oob, &peer, Dir::ToClient, opts.count)?;
            say(out, &sent(Dir::ToClient, a));
            (a, b)
        }
    };
    Ok(Summary {
        count: opts.count,
        max_len: max,
        asked_again,
        sent_again,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> UdInfo {
        UdInfo {
            qpn: 0x12,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            qkey: DEFAULT_QKEY,
            max_payload: 1024,
            count: 100,
            size: 1024,
        }
    }

    #[test]
    fn ud_info_round_trips() {
        let i = info();
        assert_eq!(
            i.encode(),
            "qpn=12 gid=fe800000000000000102030405060708 qkey=11111111 payload=1024 n=100 size=1024"
        );
        assert_eq!(UdInfo::decode(&i.encode()).unwrap(), i);
    }

    #[test]
    fn ud_info_refuses_malformed_messages() {
        let good = info().encode();
        for (bad, want) in [
            (good.replace("qpn=12", "qpn=1"), "ordinary QP"),
            (good.replace("qkey=11111111", "qkey=91111111"), "controlled"),
            (good.replace("qkey=11111111", "qkey=111111111"), "32 bits"),
            (good.replace("payload=1024", "payload=0"), "no UD payload"),
            (good.replace("payload=1024", "payload=x"), "not a decimal"),
            (good.replace(" n=100", ""), "no n="),
            (good.replace("gid=fe80", "gid=fe8"), "32 hex digits"),
        ] {
            let e = UdInfo::decode(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
        let mut p = info();
        p.count = 5;
        let e = info().check_peer(&p).unwrap_err().to_string();
        assert!(e.contains("-n 5 -s 1024, we run -n 100 -s 1024"), "{e}");
    }

    #[test]
    fn lengths_cycle_up_to_the_largest() {
        let l: Vec<usize> = (0..7).map(|i| msg_len(i, 3)).collect();
        assert_eq!(l, [1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(msg_len(1023, 1024), 1024);
        assert_eq!(msg_len(1024, 1024), 1);
        assert_eq!(msg_len(5, 1), 1);
        assert_eq!(msg_len(5, 0), 1);
        assert_ne!(seed(Dir::ToServer, 7), seed(Dir::ToClient, 7));
    }

    #[test]
    fn window_messages() {
        assert_eq!(window_of("0 32", "UD READY").unwrap(), (0, 32));
        assert_eq!(window_of("96 4", "UD SENT").unwrap(), (96, 4));
        for bad in ["", "1", "1 2 3", "-1 2", "1  2", "x y", "1 99999999999"] {
            let e = window_of(bad, "UD READY").unwrap_err().to_string();
            assert!(e.contains("malformed \"UD READY\""), "{bad:?}: {e}");
        }
    }

    #[test]
    fn resend_lists_name_messages_of_the_last_window_once() {
        let w = 32..64;
        assert_eq!(resend_list("32", &w).unwrap(), vec![32]);
        assert_eq!(resend_list("40 33 63", &w).unwrap(), vec![40, 33, 63]);
        for (bad, why) in [
            ("", "not a list of numbers"),
            ("31", "outside the last window"),
            ("64", "outside the last window"),
            ("33 33", "named twice"),
            ("33  34", "not a list of numbers"),
            ("-1", "not a list of numbers"),
            ("99999999999", "too large"),
        ] {
            let e = resend_list(bad, &w).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
