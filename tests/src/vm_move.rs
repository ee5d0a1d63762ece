//! A test-VMM VM with a live RC connection moves to another host (spec
//! 20.8), as `rdma-peer move-out` and `move-in` play it on two hosts whose
//! daemons run on the libibverbs transport.
//!
//! - **Source host** ([`move_out`]): the moving VM *m* and its peer *p*
//!   on one daemon, connected by RC and checked with rounds both ways.
//!   The daemon holds *p*'s connection (`peer_hold`, the numbers from
//!   `wire_qps`), *m* stops and its daemon saves its state, and *m*'s
//!   image ([`crate::vm_image`]) goes to the destination over TCP.
//!   Meanwhile *p* posts a WRITE into *m*, which must wait. The
//!   destination answers with its daemon's move record, the source VMM
//!   exits, the record goes to the source daemon (`peer_moved`), and the
//!   held WRITE lands.
//! - **Destination host** ([`move_in`]): listens, reads the image, brings
//!   *m* up on its daemon over a copy of its RAM, and sends back the
//!   daemon's `move_record`.
//!
//! Then more rounds run across the hosts, each byte checked on its
//! receiver's side; both QPs end in RTS and every object is destroyed
//! through its device. Each side reports `rdma-peer: move-out ok` or
//! `rdma-peer: move-in ok`; the source also reports the blackout its peer
//! saw.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vhost_user_rdma::mgmt::client::Client;
use virtio_rdma_abi::datapath::WcOpcode;
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{Cq, Qp, RecvWr, SendOp, WorkCompletion};

use crate::dp::{checked_round, pattern, rc_pair, wr, Buf, Pair, Vm};
use crate::state_transfer::{migrating_vmm, save};
use crate::vm_image::VmImage;
use crate::vmm::VmmOptions;

type BoxError = Box<dyn std::error::Error>;
type Result<T> = std::result::Result<T, BoxError>;

/// Bytes of each VM's buffer: WRITEs land at 0, SENDs at 4096, the held
/// WRITE at [`HELD_AT`].
const BUF_LEN: usize = 16384;
const HELD_AT: usize = 12288;
const HELD_TEXT: &[u8] = b"from P, held while M moved to another host";
/// Checked rounds before the move (on one host).
const ROUNDS_BEFORE: u64 = 5;
/// The held WRITE's id.
const HELD_ID: u64 = 1000;
/// How long the held WRITE must be seen waiting.
const HELD_QUIET: Duration = Duration::from_millis(300);

/// The source host's side.
#[derive(Debug, Clone)]
pub struct MoveOut {
    /// The moving VM's vhost-user socket.
    pub socket: PathBuf,
    /// Its peer's socket (the same daemon).
    pub peer_socket: PathBuf,
    /// The daemon's management socket.
    pub mgmt: PathBuf,
    /// The moving VM's name in the daemon.
    pub vm: String,
    /// The destination's address (host:port).
    pub tcp: String,
    /// Checked rounds after the move.
    pub rounds: u64,
    /// Longest wait for the destination, an answer or a completion.
    pub timeout: Duration,
}

/// The destination host's side.
#[derive(Debug, Clone)]
pub struct MoveIn {
    /// The vhost-user socket the VM comes to.
    pub socket: PathBuf,
    /// The daemon's management socket.
    pub mgmt: PathBuf,
    /// The VM's name in the daemon.
    pub vm: String,
    /// The address to listen on (host:port).
    pub tcp: String,
    /// Longest wait for an answer or a completion (the source may take
    /// longer to come: the wait for it prints a line every 10 s).
    pub timeout: Duration,
}

/// A line-per-message link between the hosts, after the image.
struct Link {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Link {
    fn new(s: TcpStream, timeout: Duration) -> Result<Link> {
        s.set_read_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        Ok(Link {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    fn send(&mut self, v: &Value) -> Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes())?;
        Ok(())
    }

    /// The next message; one that carries `error` is the other side's
    /// failure.
    fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err("the other host closed the connection".into());
        }
        let v: Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error") {
            return Err(format!("the other host failed: {e}").into());
        }
        Ok(v)
    }

    /// Waits for `{key: seq}`.
    fn expect(&mut self, key: &str, seq: u64) -> Result<()> {
        let v = self.recv()?;
        if v[key] != seq {
            return Err(format!("expected {key} {seq}, got {v}").into());
        }
        Ok(())
    }
}

fn mgmt(path: &std::path::Path, timeout: Duration, req: &Value) -> Result<Value> {
    let answer = Client::connect(path, timeout)?.request(req)?;
    if answer["ok"] != true {
        return Err(format!("{req} -> {answer}").into());
    }
    Ok(answer)
}

/// The next completion of `cq` within `timeout`, which must be a success
/// of `wr_id` with `op`.
fn completion(cq: &Cq, wr_id: u64, op: WcOpcode, timeout: Duration) -> Result<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(wc) = cq.poll_one() {
            if !wc.is_success() || wc.wr_id != wr_id || wc.opcode() != Some(op) {
                return Err(format!("expected {op:?} of {wr_id}, got {wc:?}").into());
            }
            return Ok(wc);
        }
        if Instant::now() >= deadline {
            return Err(format!("no completion of {wr_id} ({op:?}) in {timeout:?}").into());
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn round_len(seq: u64) -> usize {
    1500 + (seq as usize * 97) % 2000
}

/// The sending half of a round: a WRITE of `data` to the peer's buffer
/// (`remote`: its address and rkey) and a SEND of the same bytes.
fn give(q: &Qp, cq: &Cq, src: &Buf, remote: (u64, u32), seq: u64, timeout: Duration) -> Result<()> {
    let data = pattern(round_len(seq), seq);
    src.write(0, &data);
    let sg = [src.sge(0, data.len())];
    let write = SendOp::RdmaWrite {
        remote_addr: remote.0,
        rkey: remote.1,
    };
    for (op, wc) in [
        (write, WcOpcode::RDMA_WRITE),
        (SendOp::Send, WcOpcode::SEND),
    ] {
        q.post_send(&[wr(seq, op, &sg)])?;
        completion(cq, seq, wc, timeout)?;
    }
    Ok(())
}

/// The receiving half's receive, posted before the peer sends.
fn expect_recv(q: &Qp, dst: &Buf, seq: u64) -> Result<()> {
    let sg = [dst.sge(4096, round_len(seq))];
    q.post_recv(&[RecvWr {
        wr_id: seq,
        sg_list: &sg,
    }])?;
    Ok(())
}

/// The receiving half's check once the peer said it sent.
fn check_recv(cq: &Cq, dst: &Buf, seq: u64, timeout: Duration) -> Result<()> {
    let data = pattern(round_len(seq), seq);
    let wc = completion(cq, seq, WcOpcode::RECV, timeout)?;
    if wc.byte_len as usize != data.len() {
        return Err(format!(
            "round {seq}: RECV of {} bytes, sent {}",
            wc.byte_len,
            data.len()
        )
        .into());
    }
    if dst.read(0, data.len()) != data {
        return Err(format!("round {seq}: the WRITE's bytes differ").into());
    }
    if dst.read(4096, data.len()) != data {
        return Err(format!("round {seq}: the SEND's bytes differ").into());
    }
    Ok(())
}

/// One side of the rounds across the hosts. Odd sequence numbers go from
/// the moved VM to its peer, even ones back; `sends_odd` says which side
/// this is.
#[allow(clippy::too_many_arguments)]
fn rounds(
    link: &mut Link,
    sends_odd: bool,
    q: &Qp,
    cq: &Cq,
    buf: &Buf,
    remote: (u64, u32),
    seqs: std::ops::RangeInclusive<u64>,
    timeout: Duration,
) -> Result<()> {
    for seq in seqs {
        if (seq % 2 == 1) == sends_odd {
            link.expect("ready", seq)?;
            give(q, cq, buf, remote, seq, timeout)?;
            link.send(&json!({ "sent": seq }))?;
        } else {
            expect_recv(q, buf, seq)?;
            link.send(&json!({ "ready": seq }))?;
            link.expect("sent", seq)?;
            check_recv(cq, buf, seq, timeout)?;
        }
    }
    Ok(())
}

fn qp_state(q: &Qp) -> Result<u32> {
    Ok(q.query()?.attr.qp_state)
}

/// The source host's side (see the module documentation); its lines go
/// to `out`.
pub fn move_out(o: &MoveOut, out: &mut impl Write) -> Result<()> {
    let connect = |socket: &PathBuf, opts: VmmOptions| {
        let opts = VmmOptions {
            connect_timeout: o.timeout,
            ..opts
        };
        Vm::try_open_path(socket, opts)
            .map_err(|e| format!("opening the VM on {}: {e}", socket.display()))
    };
    let m = connect(&o.socket, migrating_vmm())?;
    let p = connect(&o.peer_socket, VmmOptions::default())?;
    let pair = rc_pair(&m, &p);
    let mbuf = Buf::new(&m, BUF_LEN);
    let pbuf = Buf::new(&p, BUF_LEN);
    for seq in 1..=ROUNDS_BEFORE {
        checked_round(&pair, &mbuf, &pbuf, seq);
    }
    writeln!(
        out,
        "rdma-peer: move-out: QP {:#x} of {} and its peer QP {:#x}: {ROUNDS_BEFORE} rounds checked",
        pair.qa.qpn(),
        o.vm,
        pair.qb.qpn()
    )?;

    let link_stream = connect_retry(&o.tcp, o.timeout, out)?;
    let wire = mgmt(&o.mgmt, o.timeout, &json!({"cmd": "wire_qps", "vm": o.vm}))?;
    let host_qpns: Vec<Value> = wire["qps"]
        .as_array()
        .ok_or("wire_qps without qps")?
        .iter()
        .map(|e| e[1].clone())
        .collect();
    let held = mgmt(
        &o.mgmt,
        o.timeout,
        &json!({"cmd": "peer_hold", "gid": wire["gid"], "qpns": host_qpns}),
    )?;
    writeln!(
        out,
        "rdma-peer: move-out: wire {wire}, held {}",
        held["held"]
    )?;

    let stopped = Instant::now();
    let bases = m.t.vmm().stop_queues()?;
    let state = save(&mut *m.t.vmm())?;
    let saved = stopped.elapsed();
    let app = json!({
        "peer_buf": [pbuf.addr(0), pbuf.mr.rkey()],
        "rounds": o.rounds,
    });
    let image = VmImage::capture(&m, bases, state, &[&pair.cqa], &[&pair.qa], &[&mbuf], app)?;
    let mut w = std::io::BufWriter::new(link_stream.try_clone()?);
    image.write_to(&mut w)?;
    drop(w);
    let ram: usize = image.ram.iter().map(Vec::len).sum();
    let sent = stopped.elapsed();

    // What the peer posts now waits for the move.
    pbuf.write(8192, HELD_TEXT);
    let held_sg = [pbuf.sge(8192, HELD_TEXT.len())];
    pair.qb.post_send(&[wr(
        HELD_ID,
        SendOp::RdmaWrite {
            remote_addr: mbuf.addr(HELD_AT),
            rkey: mbuf.mr.rkey(),
        },
        &held_sg,
    )])?;
    std::thread::sleep(HELD_QUIET);
    if let Some(wc) = pair.cqb.poll_one() {
        return Err(format!("the held WRITE completed during the move: {wc:?}").into());
    }

    let mut link = Link::new(link_stream, o.timeout)?;
    let answer = link.recv()?;
    let recorded = stopped.elapsed();
    // The destination runs: the source VMM exits, its driver's objects
    // with it (their destroys find the device gone).
    m.t.vmm().disconnect();
    let record = answer["record"].clone();
    let told = Instant::now();
    let moved = mgmt(
        &o.mgmt,
        o.timeout,
        &json!({"cmd": "peer_moved", "record": record}),
    )?;
    if moved["repointed"] != 1 {
        return Err(format!("peer_moved re-pointed {}", moved["repointed"]).into());
    }
    if let Err(e) = completion(&pair.cqb, HELD_ID, WcOpcode::RDMA_WRITE, o.timeout) {
        return Err(format!("{e} (the move record: {record})").into());
    }
    let blackout = stopped.elapsed();
    writeln!(
        out,
        "move-hosts: blackout {} ms (stop to the held WRITE's completion): stop and save {} ms, \
         image of {} KiB sent {} ms, destination up and its record back {} ms, record to \
         completion {} ms",
        blackout.as_millis(),
        saved.as_millis(),
        ram / 1024,
        (sent - saved).as_millis(),
        (recorded - sent).as_millis(),
        told.elapsed().as_millis()
    )?;
    writeln!(out, "rdma-peer: move-out: record {record}")?;
    link.send(&json!({"held": HELD_AT, "text": String::from_utf8_lossy(HELD_TEXT)}))?;
    link.expect("held_checked", HELD_AT as u64)?;

    let Pair { qa, cqa, qb, cqb } = pair;
    drop((qa, cqa, mbuf, m));
    let last = ROUNDS_BEFORE + o.rounds;
    let m_buf = (answer["buf"][0].as_u64(), answer["buf"][1].as_u64());
    let (Some(addr), Some(rkey)) = m_buf else {
        return Err(format!("the destination's answer names no buffer: {answer}").into());
    };
    let rkey = u32::try_from(rkey)?;
    rounds(
        &mut link,
        false,
        &qb,
        &cqb,
        &pbuf,
        (addr, rkey),
        ROUNDS_BEFORE + 1..=last,
        o.timeout,
    )?;
    link.expect("done", last)?;
    let state = qp_state(&qb)?;
    if state != u32::from(QpState::RTS) {
        return Err(format!("the peer's QP ended in state {state}").into());
    }
    writeln!(
        out,
        "rdma-peer: move-out ok ({} rounds after the move, every byte checked; the peer's QP in RTS)",
        o.rounds
    )?;
    Ok(())
}

/// A wait for the other host that says every 10 s that it goes on (the
/// step watchdogs of the scripts stop a step that prints nothing).
struct Waiting {
    start: Instant,
    said: Instant,
}

impl Waiting {
    fn new() -> Self {
        let now = Instant::now();
        Waiting {
            start: now,
            said: now,
        }
    }

    /// Says that it waits for `what`, if the last time was 10 s ago.
    fn tick(&mut self, what: &str, out: &mut impl Write) -> Result<()> {
        if self.said.elapsed() >= Duration::from_secs(10) {
            let waited = self.start.elapsed().as_secs();
            writeln!(out, "rdma-peer: waiting for {what} ({waited} s)")?;
            self.said = Instant::now();
        }
        Ok(())
    }
}

/// Connects to `addr`, retrying while nothing listens (`timeout` at most).
fn connect_retry(addr: &str, timeout: Duration, out: &mut impl Write) -> Result<TcpStream> {
    let mut waiting = Waiting::new();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if waiting.start.elapsed() >= timeout => {
                return Err(format!("connecting to {addr}: {e}").into())
            }
            Err(_) => waiting.tick(addr, out)?,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Accepts one connection on `listener`.
fn accept_waiting(listener: &TcpListener, out: &mut impl Write) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let mut waiting = Waiting::new();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                waiting.tick("the source host", out)?;
            }
            Err(e) => return Err(e.into()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The destination host's side (see the module documentation).
pub fn move_in(o: &MoveIn, out: &mut impl Write) -> Result<()> {
    let listener = TcpListener::bind(&o.tcp)?;
    writeln!(out, "rdma-peer: move-in: listening on {}", o.tcp)?;
    let stream = accept_waiting(&listener, out)?;
    let mut link = Link::new(stream, o.timeout)?;
    let image = match VmImage::read_from(&mut link.r) {
        Ok(i) => i,
        Err(e) => {
            let _ = link.send(&json!({"error": e.to_string()}));
            return Err(e.into());
        }
    };
    let arrived = Instant::now();
    let moved = image.move_in(
        &o.socket,
        VmmOptions {
            connect_timeout: o.timeout,
            ..migrating_vmm()
        },
    );
    let mut moved = match moved {
        Ok(m) => m,
        Err(e) => {
            let _ = link.send(&json!({"error": e.to_string()}));
            return Err(e.into());
        }
    };
    let up = arrived.elapsed();
    let record = mgmt(
        &o.mgmt,
        o.timeout,
        &json!({"cmd": "move_record", "vm": o.vm}),
    )?;
    let (Some(buf), Some(cq), Some(q)) = (moved.bufs.pop(), moved.cqs.pop(), moved.qps.pop())
    else {
        return Err("the image has no QP, CQ or buffer".into());
    };
    link.send(&json!({"record": record["record"], "buf": [buf.addr(0), buf.mr.rkey()]}))?;
    writeln!(
        out,
        "rdma-peer: move-in: QP {:#x} up on {} {} ms after its image arrived ({} KiB of RAM)",
        q.qpn(),
        o.socket.display(),
        up.as_millis(),
        image.ram.iter().map(Vec::len).sum::<usize>() / 1024
    )?;

    let held = link.recv()?;
    let text = held["text"]
        .as_str()
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    if text.is_empty() || buf.read(HELD_AT, text.len()) != text {
        let e = "the held WRITE's bytes are not in the moved VM's memory";
        let _ = link.send(&json!({ "error": e }));
        return Err(e.into());
    }
    link.send(&json!({ "held_checked": HELD_AT }))?;

    let rounds_after = image.app["rounds"].as_u64().ok_or("no round count")?;
    let peer = (
        image.app["peer_buf"][0].as_u64().ok_or("no peer buffer")?,
        u32::try_from(image.app["peer_buf"][1].as_u64().ok_or("no peer rkey")?)?,
    );
    let last = ROUNDS_BEFORE + rounds_after;
    let result = rounds(
        &mut link,
        true,
        &q,
        &cq,
        &buf,
        peer,
        ROUNDS_BEFORE + 1..=last,
        o.timeout,
    );
    if let Err(e) = result {
        let _ = link.send(&json!({"error": e.to_string()}));
        return Err(e);
    }
    let state = qp_state(&q)?;
    if state != u32::from(QpState::RTS) {
        return Err(format!("the moved QP ended in state {state}").into());
    }
    link.send(&json!({ "done": last }))?;
    let qpn = q.qpn();
    // Destroyed through the restored driver's control queue.
    drop((q, cq, buf, moved));
    writeln!(
        out,
        "rdma-peer: move-in ok (QP {qpn:#x}: the held WRITE landed, {rounds_after} rounds checked, \
         in RTS, its objects destroyed)"
    )?;
    Ok(())
}
