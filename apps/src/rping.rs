//! `rping`'s protocol (librdmacm's `examples/rping.c`) over a connection
//! of [`crate::cm_agent`], so that either side may be the unmodified tool
//! on another host. Found by reading the tool:
//!
//! - One RC QP, buffers of `size` bytes (64 by default); the client's
//!   source buffer (`start`, remote READ) and sink (`rdma`, remote WRITE),
//!   the server's one buffer (`rdma`). Control messages are SENDs of 16
//!   bytes, `rping_rdma_info`: a buffer's address (big-endian u64), rkey
//!   and size (big-endian u32s); a receive of any other length is an
//!   error on both sides. Each side keeps one receive posted.
//! - Per ping, the client fills `start` with `"rdma-ping-%d: "` and then
//!   the letters from a starting letter on (`A`..`z`, wrapping), the
//!   starting letter one further each ping, and a NUL last; sends
//!   `start`'s description; the server RDMA-READs it into its buffer,
//!   prints it (`server ping data: ...` with `-v`) and SENDs a go-ahead;
//!   the client sends `rdma`'s description; the server RDMA-WRITEs its
//!   buffer there (`strlen + 1` bytes) and SENDs a go-ahead; the client
//!   compares `rdma` with `start` (`-V`) and prints `ping data: ...`.
//! - The client disconnects after its `count` pings; the server serves
//!   until the disconnection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Qp, QpCap, QpInit, RecvWr, SendOp, SendWr, WorkCompletion,
};

use crate::cm_agent::{CmError, CmPort, ConnParam, Timers};

type BoxError = Box<dyn std::error::Error>;

/// Bytes of `rping_rdma_info`.
const INFO: usize = 16;
/// rping's send queue depth.
const SQ_DEPTH: u32 = 16;
/// The smallest buffer rping accepts (`RPING_MIN_BUFSIZE`: the sizes,
/// NUL included, of `stringify(INT_MAX)` and of `"rdma-ping-%d: "`, 11 + 15).
pub const MIN_SIZE: usize = 26;
/// The largest (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: usize = 64 * 1024 - 1;

/// wr_ids.
const RECV: u64 = 1;
const SEND: u64 = 2;
const RDMA: u64 = 3;

/// The contents of `start` for ping `n` whose letters begin at `first`.
pub fn ping_data(n: u64, first: u8, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{n}: ").into_bytes();
    let mut c = first;
    while b.len() < size {
        b.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    b.truncate(size);
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// One side's RC QP and buffers.
struct Side {
    cq: Arc<Cq>,
    qp: Qp,
    buf: Arc<DmaBuf>,
    mr: Mr,
    size: usize,
    timeout: Duration,
}

// Layout of `buf`: [recv info][send info][rdma buffer][start buffer].
const RECV_AT: usize = 0;
const SEND_AT: usize = INFO;
const RDMA_AT: usize = 2 * INFO;

impl Side {
    fn new(
        cm: &CmPort<'_>,
        dev: &Device,
        size: usize,
        timeout: Duration,
    ) -> Result<Side, BoxError> {
        let cq = Cq::create(dev, 64)?;
        let qp = Qp::create(
            cm.pd(),
            &QpInit {
                cap: QpCap {
                    max_send_wr: SQ_DEPTH,
                    max_recv_wr: 2,
                    ..QpCap::default()
                },
                ..QpInit::rc(&cq)
            },
        )?;
        let buf = Arc::new(dev.alloc_dma(2 * INFO + 2 * size, 8)?);
        let mr = Mr::register(
            cm.pd(),
            buf.clone(),
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
        )?;
        // As rdma_create_qp(): in INIT, so that the receive can be posted
        // before the connection.
        qp.rc_to_init(access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE)?;
        let s = Side {
            cq,
            qp,
            buf,
            mr,
            size,
            timeout,
        };
        s.post_recv()?;
        Ok(s)
    }

    fn start_at(&self) -> usize {
        RDMA_AT + self.size
    }

    fn post_recv(&self) -> Result<(), BoxError> {
        let sge = [self.mr.sge(RECV_AT as u64, INFO as u32)?];
        self.qp.post_recv(&[RecvWr {
            wr_id: RECV,
            sg_list: &sge,
        }])?;
        Ok(())
    }

    /// Sends the description of `len` bytes at `at` of the buffer.
    fn send_info(&self, at: usize, len: usize) -> Result<(), BoxError> {
        let mut info = [0u8; INFO];
        info[..8].copy_from_slice(&(self.mr.iova() + at as u64).to_be_bytes());
        info[8..12].copy_from_slice(&self.mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&u32::try_from(len)?.to_be_bytes());
        self.buf.write(SEND_AT, &info)?;
        let sge = [self.mr.sge(SEND_AT as u64, INFO as u32)?];
        self.qp.post_send(&[SendWr::send(SEND, &sge)])?;
        Ok(())
    }

    /// The next completion of the QP (its status checked).
    fn completion(
        &self,
        mut idle: impl FnMut() -> Result<bool, BoxError>,
    ) -> Result<Option<WorkCompletion>, BoxError> {
        let deadline = Instant::now() + self.timeout;
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            if self.cq.poll(&mut wc) == 1 {
                if !wc[0].is_success() {
                    return Err(format!("a work request failed: {:?}", wc[0]).into());
                }
                return Ok(Some(wc[0]));
            }
            if idle()? {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                return Err(format!("no completion within {:?}", self.timeout).into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits for the receive of a control message: (addr, rkey, size).
    /// `None` if `idle` said to stop first.
    fn recv_info(
        &self,
        mut idle: impl FnMut() -> Result<bool, BoxError>,
    ) -> Result<Option<(u64, u32, u32)>, BoxError> {
        loop {
            let Some(wc) = self.completion(&mut idle)? else {
                return Ok(None);
            };
            if wc.wr_id != RECV {
                // A SEND's or RDMA's completion: already accounted for.
                continue;
            }
            if wc.byte_len as usize != INFO {
                return Err(
                    format!("a control message of {} bytes, not {INFO}", wc.byte_len).into(),
                );
            }
            let mut info = [0u8; INFO];
            self.buf.read(RECV_AT, &mut info)?;
            self.post_recv()?;
            let addr = u64::from_be_bytes(info[..8].try_into()?);
            let rkey = u32::from_be_bytes(info[8..12].try_into()?);
            let len = u32::from_be_bytes(info[12..].try_into()?);
            return Ok(Some((addr, rkey, len)));
        }
    }

    /// Waits for the completion of the RDMA operation posted last.
    fn wait_rdma(&self) -> Result<(), BoxError> {
        loop {
            let wc = self.completion(|| Ok(false))?.ok_or("stopped")?;
            if wc.wr_id == RDMA {
                return Ok(());
            }
            if wc.wr_id == RECV {
                return Err("a control message before the RDMA completed".into());
            }
        }
    }

    fn text(&self, at: usize) -> Result<String, BoxError> {
        let mut b = vec![0u8; self.size];
        self.buf.read(at, &mut b)?;
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        Ok(String::from_utf8_lossy(&b[..end]).into_owned())
    }
}

/// Options of both roles.
#[derive(Debug, Clone)]
pub struct Options {
    /// Buffer size (rping's `-S`, 64 by default).
    pub size: usize,
    /// Pings (client), or pings after which the server stops waiting for
    /// more (0: until the client disconnects).
    pub count: u64,
    /// Client: compare each ping's data (`-V`).
    pub verify: bool,
    /// Longest wait for a connection and for each step.
    pub timeout: Duration,
    /// The GID table index to speak from (`None`: the device handle's).
    pub gid_index: Option<u8>,
    /// The CM's retransmission timers.
    pub timers: Timers,
}

impl Options {
    /// The VM's CM endpoint as these options say.
    fn cm<'d>(&self, dev: &'d Device) -> Result<CmPort<'d>, BoxError> {
        let mut cm = match self.gid_index {
            Some(i) => CmPort::open_from(dev, i)?,
            None => CmPort::open(dev)?,
        };
        cm.set_timers(self.timers);
        Ok(cm)
    }
}

/// The client: connects to `peer`:`port`, pings `count` times, disconnects.
pub fn client(
    dev: &Device,
    peer: std::net::IpAddr,
    port: u16,
    opts: &Options,
    retry_rejected: Duration,
) -> Result<u64, BoxError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&opts.size) {
        return Err(format!("a size of {MIN_SIZE} to {MAX_SIZE} bytes, as rping's").into());
    }
    let mut cm = opts.cm(dev)?;
    let side = Side::new(&cm, dev, opts.size, opts.timeout)?;
    let until = Instant::now() + retry_rejected;
    let conn = loop {
        match cm.connect(&side.qp, peer, port, &ConnParam::default()) {
            Ok(c) => break c,
            Err(CmError::Rejected { reason })
                if reason == ib_cm_wire::cm::rej_reason::INVALID_SERVICE_ID
                    && Instant::now() < until =>
            {
                // Nothing listens yet: as a script starting both sides.
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connecting to {peer} port {port}: {e}").into()),
        }
    };
    println!(
        "rdma-peer: rping-client: connected to {peer} port {port} (QP {:#x})",
        conn.remote_qpn
    );
    let mut first = b'A';
    for n in 0..opts.count {
        let data = ping_data(n, first, opts.size);
        first = if first >= b'z' { b'A' } else { first + 1 };
        side.buf.write(side.start_at(), &data)?;
        side.buf.write(RDMA_AT, &vec![0u8; opts.size])?;
        side.send_info(side.start_at(), opts.size)?;
        // Each go-ahead, or the server's disconnection.
        let mut go_ahead = || -> Result<(), BoxError> {
            side.recv_info(|| Ok(cm.poll_dreq(&side.qp, &conn, Instant::now())?))?
                .ok_or_else(|| format!("the server disconnected during ping {n}"))?;
            Ok(())
        };
        go_ahead()?;
        side.send_info(RDMA_AT, opts.size)?;
        go_ahead()?;
        let mut got = vec![0u8; opts.size];
        side.buf.read(RDMA_AT, &mut got)?;
        if opts.verify && got != data {
            return Err(format!(
                "ping {n}: data mismatch: sent {:?}, got back {:?}",
                String::from_utf8_lossy(&data),
                String::from_utf8_lossy(&got)
            )
            .into());
        }
        println!("ping data: {}", side.text(RDMA_AT)?);
    }
    cm.disconnect(&side.qp, &conn)?;
    println!(
        "rdma-peer: rping-client: {} pings {}",
        opts.count,
        if opts.verify { "verified" } else { "done" }
    );
    Ok(opts.count)
}

/// The server: takes one connection on `port` and serves pings until the
/// client disconnects (or after `count` pings, its disconnection).
pub fn server(dev: &Device, port: u16, opts: &Options) -> Result<u64, BoxError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&opts.size) {
        return Err(format!("a size of {MIN_SIZE} to {MAX_SIZE} bytes, as rping's").into());
    }
    let mut cm = opts.cm(dev)?;
    let side = Side::new(&cm, dev, opts.size, opts.timeout)?;
    println!("rdma-peer: rping-server: listening on port {port}");
    let conn = cm.accept(&side.qp, port, &ConnParam::default(), opts.timeout)?;
    println!(
        "rdma-peer: rping-server: connection from {} (QP {:#x})",
        conn.peer_ip(),
        conn.remote_qpn
    );
    let mut served = 0u64;
    let mut gone = false;
    loop {
        // The client's source, or its disconnection.
        let got = side.recv_info(|| {
            let now = Instant::now();
            Ok(cm.poll_dreq(&side.qp, &conn, now)?)
        })?;
        let Some((addr, rkey, len)) = got else {
            gone = true;
            break;
        };
        let len = (len as usize).min(opts.size);
        let sge = [side.mr.sge(RDMA_AT as u64, u32::try_from(len)?)?];
        side.qp.post_send(&[SendWr::signaled(
            RDMA,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            &sge,
        )])?;
        side.wait_rdma()?;
        println!("server ping data: {}", side.text(RDMA_AT)?);
        side.send_info(RDMA_AT, opts.size)?;
        let (addr, rkey, _) = side.recv_info(|| Ok(false))?.ok_or("stopped")?;
        let text_len = side.text(RDMA_AT)?.len() + 1;
        let sge = [side
            .mr
            .sge(RDMA_AT as u64, u32::try_from(text_len.min(opts.size))?)?];
        side.qp.post_send(&[SendWr::signaled(
            RDMA,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            &sge,
        )])?;
        side.wait_rdma()?;
        side.send_info(RDMA_AT, opts.size)?;
        served += 1;
        if opts.count != 0 && served == opts.count {
            break;
        }
    }
    if !gone && !cm.poll_dreq(&side.qp, &conn, Instant::now() + opts.timeout)? {
        return Err("the client did not disconnect".into());
    }
    println!("rdma-peer: rping-server: {served} pings served");
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_data_is_rpings_text() {
        // rping.c: the prefix, letters from `first` up to `size - 1`, a NUL.
        assert_eq!(ping_data(0, b'A', MIN_SIZE), b"rdma-ping-0: ABCDEFGHIJKL\0");
        // The letters run 'A'..='z' and wrap to 'A'.
        let d = ping_data(7, b'x', 20);
        assert_eq!(&d[..], b"rdma-ping-7: xyzABC\0");
        // A prefix longer than the buffer is cut as snprintf cuts it.
        let d = ping_data(1_000_000_000_000, b'A', MIN_SIZE);
        assert_eq!(&d[..], b"rdma-ping-1000000000000: \0");
    }
}
