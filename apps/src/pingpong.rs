//! An RC ping-pong that interoperates with rdma-core's unmodified
//! `ibv_rc_pingpong` (`libibverbs/examples/rc_pingpong.c`, rdma-core 56.1):
//! either side of a pair may be that tool, on another machine, while this
//! side runs on the virtio-rdma device through the reference driver.
//!
//! What has to match the tool, found by reading its source:
//!
//! - **The TCP exchange.** The client connects to the server's port
//!   (18515 by default) and writes one fixed-size message of 52 bytes:
//!   `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the GID as 32 hex digits,
//!   *including* the terminating NUL ([`MSG_LEN`]). The server reads it,
//!   connects its QP (to RTS) *before* answering with its own message of
//!   the same form, then waits for the 5 bytes `"done\0"` the client writes
//!   once it has read the answer. The tool reads each of these with a
//!   single `read()` and fails on a short one, so each is written here with
//!   one call. The GID is the 16 bytes in memory order as hex
//!   ([`gid_to_wire`]): `gid_to_wire_gid()` prints each 32-bit word after
//!   `htobe32()` of a host-order load, which on any host yields the bytes
//!   in order.
//! - **The QP.** RC; receives pre-posted in INIT before the exchange; RTR
//!   with the peer's QPN, the peer's PSN as `rq_psn`, the path MTU of `-m`,
//!   `max_dest_rd_atomic` 1, `min_rnr_timer` 12; RTS with a random 24-bit
//!   PSN, timeout 14, retry 7, RNR retry 7, `max_rd_atomic` 1. The tool
//!   uses a GRH (with the peer's GID) only when the peer's GID has a
//!   nonzero interface ID, else it addresses by LID; RoCE has no LIDs, so
//!   the tool must be given a GID index (`-g`) and a peer GID without an
//!   interface ID is refused here. Our LID is 0.
//! - **The traffic.** `rx_depth` receives of the whole buffer posted,
//!   refilled once at most one is left; the client posts the first SEND;
//!   each side posts its next SEND once both its previous SEND and the
//!   next receive have completed (the tool's `pending` bits
//!   [`SEND_WRID`] | [`RECV_WRID`]), until it has sent and received
//!   `iters` messages. So the two sides strictly alternate, which is what
//!   lets this side check each received message before its next SEND
//!   without racing the peer's next one.
//! - **The output.** The tool's `local address:` / `remote address:` lines
//!   and its two summary lines, `N bytes in T seconds = X Mbit/sec` (N =
//!   size × iters × 2) and `N iters in T seconds = Y usec/iter`.
//!
//! Beyond the tool: every message is validated (a malformed one is an
//! error naming what is wrong), every TCP step and every wait for a
//! completion has a timeout, the client retries connecting until the
//! server listens, and each received message is checked: its length is
//! the size, and (unless turned off) every byte is the tool's fill byte
//! `0x7b`, except that the first byte of each 4 KiB page may be 0 (the
//! tool's client with `-c` zeroes those before its first SEND). The tool
//! sends from the buffer it receives into, so it echoes what it got; this
//! side receives into a buffer of its own (so that a receive that wrote
//! nothing shows) and always sends the fill, which nothing in the tool
//! can tell apart except its `-c` check, see [`Options::chk`].

use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::Mtu;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Pd, Qp, QpCap, QpInit, RcConnect, RecvWr, SendOp, SendWr,
    WorkCompletion,
};

use crate::oob::{accept_one, connect_retry};
use crate::{Error, Result};

/// The tool's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Bytes of an address message on the wire: `LLLL:QQQQQQ:PPPPPP:` and 32
/// hex digits of GID, then a NUL (the tool sends its whole buffer).
pub const MSG_LEN: usize = 52;
/// What the client sends after reading the server's message (with the NUL).
pub const DONE: &[u8; 5] = b"done\0";
/// `wr_id` of every receive (the tool's `PINGPONG_RECV_WRID`).
pub const RECV_WRID: u64 = 1;
/// `wr_id` of every SEND (the tool's `PINGPONG_SEND_WRID`).
pub const SEND_WRID: u64 = 2;
/// The byte the tool fills its buffer with (and so sends, always).
pub const FILL: u8 = 0x7b;
/// What the receive buffer holds before a message lands in it, so a
/// receive that wrote nothing cannot pass for one that wrote the fill.
const NOT_RECEIVED: u8 = 0xee;
/// The tool's `-c` zeroes the first byte of each page of this size.
const CHK_PAGE: usize = 4096;
/// Positions of the `:` separators in a message.
const COLONS: [usize; 3] = [4, 11, 18];

/// One side's address as the tool exchanges it (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN the side sends (24 bits).
    pub psn: u32,
    /// GID, in memory (network) order.
    pub gid: [u8; 16],
}

impl Dest {
    /// The message the tool's `sprintf` would produce for this address,
    /// with its NUL. QPN and PSN are 24-bit fields: higher bits are
    /// dropped (they would otherwise widen the fixed-size message).
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            gid_to_wire(&self.gid)
        );
        let mut msg = [0u8; MSG_LEN];
        msg[..MSG_LEN - 1].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a message of the exact form [`Dest::encode`] (and the tool)
    /// writes: fixed field widths, hex digits (either case), `:` between
    /// the fields, a NUL at the end. Anything else is an error saying what
    /// is wrong; nothing about the message can make this panic.
    pub fn decode(msg: &[u8]) -> std::result::Result<Dest, String> {
        if msg.len() != MSG_LEN {
            return Err(format!("{} bytes, expected {MSG_LEN}", msg.len()));
        }
        if msg[MSG_LEN - 1] != 0 {
            return Err(format!(
                "byte {} is {:#04x}, not the terminating NUL",
                MSG_LEN - 1,
                msg[MSG_LEN - 1]
            ));
        }
        for &i in &COLONS {
            if msg[i] != b':' {
                return Err(format!(
                    "byte {i} is {:?}, expected ':'",
                    char::from(msg[i])
                ));
            }
        }
        let field = |name: &str, range: std::ops::Range<usize>| {
            let bytes = &msg[range.clone()];
            match bytes.iter().position(|b| !b.is_ascii_hexdigit()) {
                Some(i) => Err(format!(
                    "{name} has {:?} at byte {}, not a hex digit",
                    char::from(bytes[i]),
                    range.start + i
                )),
                // All hex digits, so ASCII.
                None => Ok(String::from_utf8_lossy(bytes).into_owned()),
            }
        };
        let lid = field("the LID", 0..4)?;
        let qpn = field("the QPN", 5..11)?;
        let psn = field("the PSN", 12..18)?;
        let gid = field("the GID", 19..51)?;
        let num = |name: &str, s: &str| {
            u32::from_str_radix(s, 16).map_err(|e| format!("{name} {s:?}: {e}"))
        };
        Ok(Dest {
            lid: u16::from_str_radix(&lid, 16).map_err(|e| format!("the LID {lid:?}: {e}"))?,
            qpn: num("the QPN", &qpn)?,
            psn: num("the PSN", &psn)?,
            gid: wire_to_gid(&gid).ok_or_else(|| format!("the GID {gid:?}"))?,
        })
    }

    /// The tool's `local address:` / `remote address:` line body.
    pub fn describe(&self) -> String {
        format!(
            "LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid)
        )
    }

    /// Why a peer with this address cannot be connected to, if it cannot.
    fn peer_problem(&self) -> Option<String> {
        if self.qpn < 2 {
            return Some(format!(
                "QPN {:#x} is a special QP, not an RC QP's number",
                self.qpn
            ));
        }
        if self.gid[8..] == [0; 8] {
            return Some(format!(
                "GID {} has no interface ID, so ibv_rc_pingpong addresses by LID ({:#x}), \
                 which RoCE does not have: give it a GID index (-g)",
                Ipv6Addr::from(self.gid),
                self.lid
            ));
        }
        None
    }
}

/// The GID as the tool puts it on the wire: 32 lowercase hex digits of
/// the 16 bytes in memory order.
pub fn gid_to_wire(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GID of 32 hex digits (either case) in memory order; `None` if the
/// text is anything else.
pub fn wire_to_gid(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(gid)
}

/// The path MTU for `-m` in bytes (the tool accepts these five).
pub fn mtu_from_bytes(bytes: u32) -> Option<Mtu> {
    Some(match bytes {
        256 => Mtu::MTU_256,
        512 => Mtu::MTU_512,
        1024 => Mtu::MTU_1024,
        2048 => Mtu::MTU_2048,
        4096 => Mtu::MTU_4096,
        _ => return None,
    })
}

/// Which side to play.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    /// Listen on the port (all addresses) and wait for the client.
    Server,
    /// Connect to the server at this host (name or address).
    Client(String),
}

/// Parameters, named after the tool's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Server or client.
    pub side: Side,
    /// TCP port (`-p`).
    pub port: u16,
    /// Bytes of each message (`-s`).
    pub size: usize,
    /// Messages each way (`-n`).
    pub iters: u32,
    /// Path MTU in bytes (`-m`).
    pub mtu: u32,
    /// Receives kept posted (`-r`).
    pub rx_depth: u32,
    /// Longest wait for the peer on TCP (connecting, each message) and for
    /// the next completion.
    pub timeout: Duration,
    /// Check every byte of every received message (the length is always
    /// checked).
    pub verify: bool,
    /// The tool's `-c` on the client: zero the first byte of each 4 KiB
    /// page of what we send, which a server running the tool with `-c`
    /// checks at its end (it prints `invalid data in page N` otherwise,
    /// and still succeeds). No effect on the server.
    pub chk: bool,
}

impl Default for Options {
    /// The tool's defaults, as a server; a 2-minute timeout; verifying.
    fn default() -> Self {
        Options {
            side: Side::Server,
            port: DEFAULT_PORT,
            size: 4096,
            iters: 1000,
            mtu: 1024,
            rx_depth: 500,
            timeout: Duration::from_secs(120),
            verify: true,
            chk: false,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Our address.
    pub local: Dest,
    /// The peer's address.
    pub remote: Dest,
    /// Messages sent (and received).
    pub iters: u32,
    /// Bytes moved both ways (size × iters × 2, as the tool counts).
    pub bytes: u64,
    /// From the first SEND (client) or the start of the loop (server) to
    /// the last completion.
    pub elapsed: Duration,
}

impl Summary {
    /// The tool's two result lines.
    pub fn lines(&self) -> [String; 2] {
        let usec = self.elapsed.as_secs_f64() * 1e6;
        // The tool divides by its float microseconds; a run too short to
        // measure would print inf there, here it prints 0.
        let per = |x: f64| if usec > 0.0 { x / usec } else { 0.0 };
        [
            format!(
                "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
                self.bytes,
                usec / 1e6,
                per(self.bytes as f64 * 8.0)
            ),
            format!(
                "{} iters in {:.2} seconds = {:.2} usec/iter",
                self.iters,
                usec / 1e6,
                if self.iters > 0 {
                    usec / f64::from(self.iters)
                } else {
                    0.0
                }
            ),
        ]
    }
}

/// Reads exactly `n` bytes of `what`; a closed connection or a timeout (the
/// stream's read timeout) is an error naming `what`.
fn read_exact_or(stream: &mut impl Read, n: usize, what: &str) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::Protocol(format!(
                    "the peer closed the connection after {got} of the {n} bytes of {what}"
                )))
            }
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout(format!("{what} ({got} of {n} bytes came)")))
            }
            Err(e) => return Err(Error::Oob(e)),
        }
    }
    Ok(buf)
}

fn decode_peer(msg: &[u8]) -> Result<Dest> {
    let peer = Dest::decode(msg).map_err(|e| {
        Error::Protocol(format!(
            "malformed address message from the peer: {e} (message \"{}\")",
            msg.escape_ascii()
        ))
    })?;
    match peer.peer_problem() {
        Some(p) => Err(Error::Protocol(format!("the peer's address: {p}"))),
        None => Ok(peer),
    }
}

/// The client's half of the tool's TCP exchange: sends `mine`, reads the
/// server's address, sends `done`. The server has connected its QP by the
/// time its answer arrives.
pub fn client_exchange(stream: &mut (impl Read + Write), mine: &Dest) -> Result<Dest> {
    stream.write_all(&mine.encode())?;
    let msg = read_exact_or(stream, MSG_LEN, "the server's address message")?;
    let peer = decode_peer(&msg)?;
    stream.write_all(DONE)?;
    stream.flush()?;
    Ok(peer)
}

/// The server's half of the tool's TCP exchange: reads the client's
/// address, calls `connect` with it (the QP must be ready to receive before
/// the client learns our address: the client sends as soon as it has
/// connected), sends `mine`, and waits for the client's `done`.
pub fn server_exchange(
    stream: &mut (impl Read + Write),
    mine: &Dest,
    connect: impl FnOnce(&Dest) -> Result<()>,
) -> Result<Dest> {
    let msg = read_exact_or(stream, MSG_LEN, "the client's address message")?;
    let peer = decode_peer(&msg)?;
    connect(&peer)?;
    stream.write_all(&mine.encode())?;
    stream.flush()?;
    let done = read_exact_or(stream, DONE.len(), "the client's \"done\"")?;
    if done != DONE {
        return Err(Error::Protocol(format!(
            "the client sent \"{}\" instead of \"done\\0\"",
            done.escape_ascii()
        )));
    }
    Ok(peer)
}

/// A PSN for our side: 24 random bits. Not for security (the tool uses
/// `lrand48()` seeded from pid and time); `RandomState` is seeded from
/// the operating system's randomness.
pub(crate) fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() & 0xff_ffff) as u32
}

/// Our QP and its buffers.
struct Ends {
    cq: Arc<Cq>,
    qp: Qp,
    send_mr: Mr,
    recv: Arc<DmaBuf>,
    recv_mr: Mr,
}

impl Ends {
    fn new(dev: &Device, opts: &Options) -> Result<Ends> {
        let pd = Pd::alloc(dev)?;
        // As the tool: rx_depth + 1 entries, one SEND outstanding at most.
        let cq = Cq::create(dev, opts.rx_depth.saturating_add(1))?;
        let mut init = QpInit::rc(&cq);
        init.cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: opts.rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = Qp::create(&pd, &init)?;
        let send = Arc::new(dev.alloc_dma(opts.size, 4096)?);
        send.fill(0, opts.size, FILL)?;
        if opts.chk && matches!(opts.side, Side::Client(_)) {
            for page in (0..opts.size).step_by(CHK_PAGE) {
                send.write(page, &[0])?;
            }
        }
        // The tool registers its one buffer with LOCAL_WRITE only: nothing
        // is remote-accessible in a ping-pong of SENDs.
        let send_mr = Mr::register(&pd, send, access::LOCAL_WRITE)?;
        let recv = Arc::new(dev.alloc_dma(opts.size, 4096)?);
        recv.fill(0, opts.size, NOT_RECEIVED)?;
        let recv_mr = Mr::register(&pd, recv.clone(), access::LOCAL_WRITE)?;
        Ok(Ends {
            cq,
            qp,
            send_mr,
            recv,
            recv_mr,
        })
    }

    fn post_recvs(&self, n: u32, size: usize) -> Result<()> {
        let sge = [self.recv_mr.sge(0, size as u32)?];
        let wrs: Vec<RecvWr<'_>> = (0..n)
            .map(|_| RecvWr {
                wr_id: RECV_WRID,
                sg_list: &sge,
            })
            .collect();
        self.qp.post_recv(&wrs)?;
        Ok(())
    }

    fn post_send(&self, size: usize) -> Result<()> {
        let sge = [self.send_mr.sge(0, size as u32)?];
        self.qp
            .post_send(&[SendWr::signaled(SEND_WRID, SendOp::Send, &sge)])?;
        Ok(())
    }

    /// INIT → RTR → RTS towards `peer`, with the tool's attributes.
    fn connect(&self, peer: &Dest, my_psn: u32, mtu: Mtu) -> Result<()> {
        let mut c = RcConnect::new(peer.qpn, peer.gid);
        // The tool's GRH: hop limit 1, from our GID (the device handle's,
        // at its index: `c.sgid_index` left to the driver).
        c.av.hop_limit = 1;
        c.path_mtu = mtu;
        c.rq_psn = peer.psn;
        c.sq_psn = my_psn;
        c.max_dest_rd_atomic = 1;
        c.max_rd_atomic = 1;
        c.min_rnr_timer = 12;
        c.timeout = 14;
        c.retry_cnt = 7;
        c.rnr_retry = 7;
        self.qp.rc_to_rtr(&c)?;
        self.qp.rc_to_rts(&c)?;
        Ok(())
    }

    /// Checks the message a receive completion reports, then marks the
    /// buffer as not received again (safe: the peer sends its next message
    /// only after our next SEND, which comes after this).
    fn check_received(&self, wc: &WorkCompletion, n: u32, opts: &Options) -> Result<()> {
        if wc.byte_len as usize != opts.size {
            return Err(Error::Check(format!(
                "message {n} has {} bytes, expected {} (do both sides use the same -s?)",
                wc.byte_len, opts.size
            )));
        }
        if opts.verify {
            let got = self.recv.to_vec(0, opts.size)?;
            let bad = got
                .iter()
                .enumerate()
                .position(|(i, &b)| b != FILL && !(b == 0 && i % CHK_PAGE == 0));
            if let Some(i) = bad {
                return Err(Error::Check(format!(
                    "message {n}: byte {i} is {:#04x}, expected {FILL:#04x}{}",
                    got[i],
                    if got[i] == NOT_RECEIVED {
                        " (never written)"
                    } else {
                        ""
                    }
                )));
            }
            self.recv.fill(0, opts.size, NOT_RECEIVED)?;
        }
        Ok(())
    }
}

fn validate(dev: &Device, opts: &Options) -> Result<Mtu> {
    let bad = |m: String| Err(Error::Check(format!("bad option: {m}")));
    let max = dev.port_attr().max_msg_size as usize;
    if opts.size == 0 || opts.size > max {
        return bad(format!(
            "size {} out of range 1..={max} (the port's largest message)",
            opts.size
        ));
    }
    if opts.iters == 0 {
        return bad("iters must be at least 1".into());
    }
    if opts.rx_depth == 0 {
        return bad("rx_depth must be at least 1".into());
    }
    mtu_from_bytes(opts.mtu).map_or_else(
        || {
            bad(format!(
                "MTU {} is not one of 256, 512, 1024, 2048, 4096",
                opts.mtu
            ))
        },
        Ok,
    )
}

/// A listener on `port` of every IPv4 address, as the tool's: it binds the
/// first wildcard address `getaddrinfo(NULL, port, AI_PASSIVE)` returns,
/// which glibc gives as IPv4 `0.0.0.0` first. IPv6 `::` only where IPv4
/// cannot be bound.
fn listen_any(port: u16) -> Result<TcpListener> {
    match TcpListener::bind(SocketAddr::from(([0u8, 0, 0, 0], port))) {
        Ok(l) => Ok(l),
        Err(e4) => {
            TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).map_err(|_| {
                Error::Oob(io::Error::new(
                    e4.kind(),
                    format!("listening on TCP port {port}: {e4}"),
                ))
            })
        }
    }
}

pub(crate) fn say(out: &mut dyn Write, line: &str) {
    // Output is best effort: a closed console must not fail the run.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// How the TCP exchange starts.
enum Tcp<'a> {
    /// Server: listening, not yet connected.
    Listening(TcpListener),
    /// Client: to connect to this host.
    To(&'a str),
}

/// Runs the ping-pong on `dev` as `opts.side` against a peer running this
/// or `ibv_rc_pingpong`; prints the tool's lines to `out`.
pub fn run(dev: &Device, opts: &Options, out: &mut dyn Write) -> Result<Summary> {
    let mtu = validate(dev, opts)?;
    let ends = Ends::new(dev, opts)?;
    // Receives can be posted once the QP has left RESET; the tool posts
    // them before the exchange, so the peer never finds none.
    ends.qp.rc_to_init(0)?;
    ends.post_recvs(opts.rx_depth, opts.size)?;
    let mine = Dest {
        lid: 0,
        qpn: ends.qp.qpn(),
        psn: random_psn(),
        gid: dev.gid(),
    };
    // The server listens before it prints its address (the tool does it
    // the other way round), so that a script may start the client as soon
    // as it sees the line: the tool's client does not retry.
    let tcp = match &opts.side {
        Side::Server => Tcp::Listening(listen_any(opts.port)?),
        Side::Client(host) => Tcp::To(host),
    };
    say(out, &format!("  local address:  {}", mine.describe()));

    let remote = match tcp {
        Tcp::Listening(listener) => {
            let mut stream = accept_one(&listener, opts.timeout)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(opts.timeout))?;
            stream.set_write_timeout(Some(opts.timeout))?;
            server_exchange(&mut stream, &mine, |peer| ends.connect(peer, mine.psn, mtu))?
        }
        Tcp::To(host) => {
            let mut stream: TcpStream = connect_retry((host, opts.port), opts.timeout)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(opts.timeout))?;
            stream.set_write_timeout(Some(opts.timeout))?;
            let peer = client_exchange(&mut stream, &mine)?;
            ends.connect(&peer, mine.psn, mtu)?;
            peer
        }
    };
    say(out, &format!("  remote address: {}", remote.describe()));

    let elapsed = ping_pong(&ends, opts)?;
    let s = Summary {
        local: mine,
        remote,
        iters: opts.iters,
        bytes: opts.size as u64 * u64::from(opts.iters) * 2,
        elapsed,
    };
    for l in s.lines() {
        say(out, &l);
    }
    Ok(s)
}

/// The tool's loop (`parse_single_wc`): returns the time it took.
fn ping_pong(ends: &Ends, opts: &Options) -> Result<Duration> {
    let iters = opts.iters;
    // Receives posted and not yet completed.
    let mut routs = opts.rx_depth;
    // Which of our SEND and the peer's next message we still wait for.
    let mut pending = RECV_WRID;
    if matches!(opts.side, Side::Client(_)) {
        ends.post_send(opts.size)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut last = start;
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < iters || scnt < iters {
        let n = ends.cq.poll(&mut wcs);
        if n == 0 {
            if last.elapsed() > opts.timeout {
                return Err(Error::Timeout(format!(
                    "a completion ({scnt} of {iters} messages sent, {rcnt} received)"
                )));
            }
            std::thread::yield_now();
            continue;
        }
        last = Instant::now();
        for wc in &wcs[..n] {
            if !wc.is_success() {
                return Err(Error::Check(format!(
                    "completion with status {} for wr_id {} ({scnt} sent, {rcnt} received)",
                    wc.status().map_or("unknown", |s| s.name()),
                    wc.wr_id
                )));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    ends.check_received(wc, rcnt + 1, opts)?;
                    routs = routs.saturating_sub(1);
                    if routs <= 1 {
                        ends.post_recvs(opts.rx_depth - routs, opts.size)?;
                        routs = opts.rx_depth;
                    }
                    rcnt += 1;
                }
                other => {
                    return Err(Error::Check(format!(
                        "completion for unknown wr_id {other}"
                    )))
                }
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                ends.post_send(opts.size)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ::ffff:10.43.0.2, the IPv4-mapped GID of a RoCE port with address
    /// 10.43.0.2.
    const MAPPED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 43, 0, 2];

    /// What rc_pingpong's `sprintf("%04x:%06x:%06x:%s")` writes for LID 0,
    /// QPN 0x11, PSN 0xabcdef and GID ::ffff:10.43.0.2: the GID words
    /// 0x00000000 0x00000000 0x0000ffff 0x0a2b0002 (big-endian loads of the
    /// bytes in order) as `%08x` each, then the NUL of the 52-byte buffer.
    const WIRE: &[u8; MSG_LEN] = b"0000:000011:abcdef:00000000000000000000ffff0a2b0002\0";

    #[test]
    fn encodes_as_rc_pingpong_writes_it() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: MAPPED,
        };
        assert_eq!(&d.encode(), WIRE);
        assert_eq!(gid_to_wire(&MAPPED), "00000000000000000000ffff0a2b0002");
        // A link-local GID: fe80::5054:ff:fe12:3456.
        let ll = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
        ];
        let d = Dest {
            lid: 0xbeef,
            qpn: 0xffffff,
            psn: 0,
            gid: ll,
        };
        assert_eq!(
            &d.encode(),
            b"beef:ffffff:000000:fe80000000000000505400fffe123456\0"
        );
        // QPN and PSN keep their 24 bits.
        let d = Dest {
            lid: 1,
            qpn: 0x1234_5678,
            psn: 0xff00_0001,
            gid: ll,
        };
        assert_eq!(&d.encode()[..19], b"0001:345678:000001:");
    }

    #[test]
    fn decodes_what_rc_pingpong_writes() {
        let d = Dest::decode(WIRE).unwrap();
        assert_eq!(
            d,
            Dest {
                lid: 0,
                qpn: 0x11,
                psn: 0xabcdef,
                gid: MAPPED
            }
        );
        assert_eq!(
            d.describe(),
            "LID 0x0000, QPN 0x000011, PSN 0xabcdef, GID ::ffff:10.43.0.2"
        );
        assert_eq!(
            wire_to_gid("00000000000000000000FFFF0A2B0002"),
            Some(MAPPED)
        );
        for d in [
            d,
            Dest {
                lid: 0xffff,
                qpn: 0xfffffe,
                psn: 0x800000,
                gid: [0xa5; 16],
            },
        ] {
            assert_eq!(Dest::decode(&d.encode()), Ok(d));
        }
    }

    #[test]
    fn refuses_malformed_messages() {
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (WIRE[..51].to_vec(), "51 bytes"),
            ([&WIRE[..], b"x"].concat(), "53 bytes"),
            (vec![0; MSG_LEN], "byte 4"),
            (
                b"hello, this is not an address message at all!!!!!!!\0".to_vec(),
                "byte 4",
            ),
        ];
        let mut no_nul = WIRE.to_vec();
        no_nul[51] = b'0';
        cases.push((no_nul, "terminating NUL"));
        let mut bad_hex = WIRE.to_vec();
        bad_hex[7] = b'g';
        cases.push((bad_hex, "the QPN has 'g' at byte 7"));
        let mut bad_gid = WIRE.to_vec();
        bad_gid[50] = b' ';
        cases.push((bad_gid, "the GID has ' ' at byte 50"));
        let mut sign = WIRE.to_vec();
        sign[0] = b'+';
        cases.push((sign, "the LID has '+'"));
        let mut short_gid = WIRE.to_vec();
        short_gid[50] = 0;
        cases.push((short_gid, "the GID"));
        for (msg, want) in cases {
            let e = Dest::decode(&msg).unwrap_err();
            assert!(
                e.contains(want),
                "{:?}: {e}",
                msg.escape_ascii().to_string()
            );
            assert!(decode_peer(&msg).is_err());
        }
        assert_eq!(wire_to_gid("00"), None);
        assert_eq!(wire_to_gid(&"0g".repeat(16)), None);
        // UTF-8 that is 32 bytes long but not 32 hex digits.
        assert_eq!(wire_to_gid(&"é".repeat(16)), None);
    }

    #[test]
    fn refuses_peers_it_cannot_reach() {
        // rc_pingpong without -g sends GID 0 (and then uses no GRH).
        let no_gid = b"0000:000011:abcdef:00000000000000000000000000000000\0";
        let e = decode_peer(no_gid).unwrap_err().to_string();
        assert!(e.contains("-g"), "{e}");
        let qp1 = b"0000:000001:abcdef:00000000000000000000ffff0a2b0002\0";
        let e = decode_peer(qp1).unwrap_err().to_string();
        assert!(e.contains("special QP"), "{e}");
        assert!(decode_peer(WIRE).is_ok());
    }

    #[test]
    fn mtus_are_the_tools_five() {
        assert_eq!(mtu_from_bytes(1024), Some(Mtu::MTU_1024));
        assert_eq!(mtu_from_bytes(4096), Some(Mtu::MTU_4096));
        assert_eq!(mtu_from_bytes(1500), None);
        assert_eq!(mtu_from_bytes(0), None);
    }

    #[test]
    fn summary_lines_have_the_tools_format() {
        let d = Dest::decode(WIRE).unwrap();
        let s = Summary {
            local: d,
            remote: d,
            iters: 1000,
            bytes: 4096 * 1000 * 2,
            elapsed: Duration::from_millis(2500),
        };
        assert_eq!(
            s.lines(),
            [
                "8192000 bytes in 2.50 seconds = 26.21 Mbit/sec".to_string(),
                "1000 iters in 2.50 seconds = 2500.00 usec/iter".to_string(),
            ]
        );
    }

    /// Both halves of the exchange over a socket pair, byte for byte as the
    /// tool reads them: 52 bytes each way, then `done\0`.
    #[test]
    fn exchange_halves_talk_to_each_other() {
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let client = Dest {
            lid: 0,
            qpn: 0x12,
            psn: 0x111111,
            gid: MAPPED,
        };
        let mut server = client;
        server.qpn = 0x13;
        server.psn = 0x222222;
        server.gid[15] = 3;
        let t = std::thread::spawn(move || client_exchange(&mut a, &client).map(|p| (p, a)));
        let mut connected = None;
        let got = server_exchange(&mut b, &server, |p| {
            connected = Some(*p);
            Ok(())
        })
        .unwrap();
        let (got_client, mut a) = t.join().unwrap().unwrap();
        assert_eq!(got, client);
        assert_eq!(connected, Some(client));
        assert_eq!(got_client, server);
        // Nothing more than `done\0` was sent.
        drop(b);
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    /// The server's reply waits for its QP to be connected, and a client
    /// that answers anything but `done\0` is an error.
    #[test]
    fn server_refuses_a_wrong_done() {
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let me = Dest::decode(WIRE).unwrap();
        a.write_all(WIRE).unwrap();
        a.write_all(b"DONE\0").unwrap();
        let e = server_exchange(&mut b, &me, |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("instead of"), "{e}");
        // A connect failure stops the exchange before the reply.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(WIRE).unwrap();
        let e = server_exchange(&mut b, &me, |_| Err(Error::Check("no".into()))).unwrap_err();
        assert!(e.to_string().contains("no"), "{e}");
        drop(b);
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
    }

    #[test]
    fn short_messages_and_timeouts_are_errors() {
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&WIRE[..20]).unwrap();
        drop(a);
        let me = Dest::decode(WIRE).unwrap();
        let e = server_exchange(&mut b, &me, |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("after 20 of the 52 bytes"), "{e}");
        let (_a, mut b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let e = client_exchange(&mut b, &me).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
    }

    #[test]
    fn psns_are_24_bits_and_vary() {
        let psns: Vec<u32> = (0..8).map(|_| random_psn()).collect();
        assert!(psns.iter().all(|&p| p <= 0xff_ffff));
        assert!(psns.windows(2).any(|w| w[0] != w[1]), "{psns:?}");
    }
}
