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
//! UD may drop messages; on the quiet point-to-point links this runs on
//! it should not, so a message that has not arrived within [`GRACE`] of
//! the sender's `UD SENT` is a failure naming the missing indices. A side
//! that fails tells the other (`FAIL <reason>`), which stops with that
//! reason instead of waiting for its timeout.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::datapath::{UdGrh, WcOpcode, UD_GRH_SIZE};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::AddressVector;
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, Mr, Payload, Pd, Qp, QpCap, QpInit, RecvWr, SendFlags, SendOp, SendWr,
    UdDest, WorkCompletion,
};

use crate::exchange::{sync, Role};
use crate::oob::Oob;
use crate::pattern;
use crate::perf::{expect_line, quote, send_line, telling_peer, Fields};
use crate::pingpong::{gid_to_wire, say};
use crate::{Error, Result};

/// Messages per window: the receives posted at a time, and the largest
/// burst the sender sends.
pub const WINDOW: u32 = 32;
/// The Q_Key `rdma-peer ud` uses unless told otherwise.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;
/// How long after the sender's `UD SENT` the receiver waits for messages
/// still missing before it declares them lost.
pub const GRACE: Duration = Duration::from_secs(5);
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
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Messages each way.
    pub count: u32,
    /// The largest message, in bytes.
    pub max_len: usize,
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
    fn new(dev: &'a Device, max: usize, qkey: u32, timeout: Duration) -> Result<Ud<'a>> {
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
        qp.ud_activate(qkey, 0)?;
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
            timeout,
        })
    }

    /// Sends `count` messages going `dir` to `peer`, window by window as
    /// the peer asks for them.
    fn send_all(&self, oob: &mut dyn Oob, peer: &UdInfo, dir: Dir, count: u32) -> Result<()> {
        let ah = Ah::create(
            &self.pd,
            &AddressVector {
                dgid: peer.gid,
                hop_limit: 64,
                ..AddressVector::default()
            },
        )?;
        let dest = UdDest {
            ah: &ah,
            remote_qpn: peer.qpn,
            remote_qkey: peer.qkey,
        };
        let mut next = 0u32;
        while next < count {
            let msg = expect_line(oob, "UD READY", "the peer's receives", self.timeout)?;
            let (first, k) = window_of(&msg, "UD READY")?;
            if first != next || k == 0 || k > WINDOW.min(count - next) {
                return Err(Error::Protocol(format!(
                    "the peer is ready for messages {first}..{} of {count}; the next are {next}..{}",
                    u64::from(first) + u64::from(k),
                    next + WINDOW.min(count - next)
                )));
            }
            let mut sges = Vec::with_capacity(k as usize);
            for j in 0..k {
                let i = next + j;
                let len = msg_len(i, self.max);
                let off = j as usize * self.max;
                self.send.write(off, &pattern::make(len, seed(dir, i)))?;
                sges.push(self.send_mr.sge(off as u64, len as u32)?);
            }
            let wrs: Vec<SendWr<'_>> = sges
                .iter()
                .zip(next..)
                .map(|(sge, i)| SendWr {
                    wr_id: K_SEND | u64::from(i),
                    op: SendOp::SendWithImm { imm: i },
                    payload: Payload::Sges(std::slice::from_ref(sge)),
                    flags: SendFlags::SIGNALED,
                    ud: Some(dest),
                })
                .collect();
            self.qp.post_send(&wrs)?;
            // A UD send completes once the message has left: then the
            // receiver may look for it.
            let mut done = 0;
            let deadline = Instant::now() + self.timeout;
            let mut wcs = [WorkCompletion::default(); 16];
            while done < k {
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
                if n == 0 {
                    if Instant::now() > deadline {
                        return Err(Error::Timeout(format!(
                            "the send completions of UD messages {next}..{} ({done} came)",
                            next + k
                        )));
                    }
                    std::thread::yield_now();
                }
            }
            send_line(oob, &format!("UD SENT {next} {k}"))?;
            next += k;
        }
        let msg = expect_line(
            oob,
            "UD RECEIVED",
            "the peer's receipt of all messages",
            self.timeout,
        )?;
        if msg != count.to_string() {
            return Err(Error::Protocol(format!(
                "the peer received \"{}\" messages, we sent {count}",
                quote(&msg)
            )));
        }
        Ok(())
    }

    /// Receives and checks `count` messages going `dir` from `peer`.
    fn receive_all(&self, oob: &mut dyn Oob, peer: &UdInfo, dir: Dir, count: u32) -> Result<()> {
        let at = At { dir, count };
        let mut next = 0u32;
        while next < count {
            let k = WINDOW.min(count - next);
            // Zeroed, so that a GRH or bytes left from an earlier window
            // cannot pass for this one's.
            self.recv.fill(0, k as usize * self.slot, 0)?;
            let sges = (0..k as usize)
                .map(|s| self.recv_mr.sge((s * self.slot) as u64, self.slot as u32))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let wrs: Vec<RecvWr<'_>> = sges
                .iter()
                .zip(0u64..)
                .map(|(sge, s)| RecvWr {
                    wr_id: K_RECV | s,
                    sg_list: std::slice::from_ref(sge),
                })
                .collect();
            self.qp.post_recv(&wrs)?;
            send_line(oob, &format!("UD READY {next} {k}"))?;
            let msg = expect_line(oob, "UD SENT", "the peer's sends", self.timeout)?;
            if window_of(&msg, "UD SENT")? != (next, k) {
                return Err(Error::Protocol(format!(
                    "the peer sent messages \"{}\", we expected {next} {k}",
                    quote(&msg)
                )));
            }
            self.collect(peer, at, next, k)?;
            next += k;
        }
        send_line(oob, &format!("UD RECEIVED {count}"))
    }

    /// Takes the receive completions of messages `first..first + k`,
    /// checking each; those that do not come within [`GRACE`] are lost.
    fn collect(&self, peer: &UdInfo, at: At, first: u32, k: u32) -> Result<()> {
        let mut got = vec![false; k as usize];
        let mut n = 0u32;
        let deadline = Instant::now() + GRACE.min(self.timeout);
        let mut wcs = [WorkCompletion::default(); 16];
        while n < k {
            let c = self.cq.poll(&mut wcs);
            for wc in &wcs[..c] {
                self.check(wc, peer, at, first, &mut got)?;
                n += 1;
            }
            if c == 0 {
                if Instant::now() > deadline {
                    let missing: Vec<String> = got
                        .iter()
                        .zip(first..)
                        .filter(|(g, _)| !**g)
                        .map(|(_, i)| i.to_string())
                        .collect();
                    let shown = missing.iter().take(20).cloned().collect::<Vec<_>>();
                    return Err(Error::Check(format!(
                        "UD {}: message{} {}{} of {} never arrived ({n} of the {k} sent as {first}..{} did, \
                         within {:?} of the sender's last send completion); \
                         UD may drop, but this point-to-point link should not",
                        at.dir.name(),
                        if missing.len() == 1 { "" } else { "s" },
                        shown.join(", "),
                        if missing.len() > shown.len() { ", ..." } else { "" },
                        at.count,
                        first + k,
                        GRACE.min(self.timeout)
                    )));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Checks one receive completion of the window starting at `first`
    /// and marks its message in `got`.
    fn check(
        &self,
        wc: &WorkCompletion,
        peer: &UdInfo,
        at: At,
        first: u32,
        got: &mut [bool],
    ) -> Result<()> {
        let slot = usize::try_from(wc.wr_id & !KIND_MASK).unwrap_or(usize::MAX);
        if wc.wr_id & KIND_MASK != K_RECV || slot >= got.len() {
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
        match got.get_mut(j) {
            None => {
                return Err(at.err(
                    i,
                    format!(
                        "arrived in the window of messages {first}..{}",
                        u64::from(first) + got.len() as u64
                    ),
                ))
            }
            Some(true) => return Err(at.err(i, "arrived twice".into())),
            Some(seen) => *seen = true,
        }
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
        Ok(())
    }
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
    let u = Ud::new(dev, own_max, opts.qkey, opts.timeout)?;
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
    let checked = |dir: Dir| {
        format!(
            "ud: {}: {} messages received, each checked (status, length, source QPN, GRH, bytes)",
            dir.name(),
            opts.count
        )
    };
    let sent = |dir: Dir| {
        format!(
            "ud: {}: {} messages sent, all received",
            dir.name(),
            opts.count
        )
    };
    match role {
        Role::Client => {
            u.send_all(oob, &peer, Dir::ToServer, opts.count)?;
            say(out, &sent(Dir::ToServer));
            u.receive_all(oob, &peer, Dir::ToClient, opts.count)?;
            say(out, &checked(Dir::ToClient));
        }
        Role::Server => {
            u.receive_all(oob, &peer, Dir::ToServer, opts.count)?;
            say(out, &checked(Dir::ToServer));
            u.send_all(oob, &peer, Dir::ToClient, opts.count)?;
            say(out, &sent(Dir::ToClient));
        }
    }
    Ok(Summary {
        count: opts.count,
        max_len: max,
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
}
