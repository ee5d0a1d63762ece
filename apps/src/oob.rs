//! Out-of-band channel between the two peers, for what RDMA cannot carry
//! before a connection exists: QP numbers, GIDs, rkeys and addresses.
//!
//! Real guests use a serial port cabled to the other guest's (two QEMU
//! `-chardev socket` ends, one server and one client: a null modem); peers
//! on different machines use a TCP connection ([`TcpOob`]); tests use an
//! in-process channel. Messages are text lines `VRDMA <body>`; other lines
//! (console noise) are ignored.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Prefix of every message line.
const PREFIX: &str = "VRDMA ";
/// Longest line accepted (anything longer is noise).
const MAX_LINE: usize = 4096;

/// A line-oriented message channel to the peer.
pub trait Oob: Send {
    /// Sends one message (no newline inside).
    fn send(&mut self, msg: &str) -> io::Result<()>;
    /// Receives the next message, waiting at most `timeout`; `Ok(None)` on
    /// timeout.
    fn recv(&mut self, timeout: Duration) -> io::Result<Option<String>>;
}

/// A serial port (or any tty / character device) in raw mode.
#[derive(Debug)]
pub struct SerialOob {
    file: File,
    lines: Lines,
}

/// Splits received bytes into message lines: keeps the bodies of the lines
/// that carry [`PREFIX`] (anywhere in the line: console noise may precede
/// it), drops the rest, and a partial line that grows past [`MAX_LINE`].
#[derive(Debug, Default)]
struct Lines {
    buf: Vec<u8>,
    bodies: VecDeque<String>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\r', '\n']);
            if let Some(body) = text.find(PREFIX).map(|p| &text[p + PREFIX.len()..]) {
                self.bodies.push_back(body.to_string());
            }
        }
        if self.buf.len() > MAX_LINE {
            self.buf.clear();
        }
    }

    fn pop(&mut self) -> Option<String> {
        self.bodies.pop_front()
    }

    /// The next line, reading chunks with `read` (given the time left;
    /// `Ok(0)` for nothing yet) until one is complete or `timeout` passes.
    fn next_within(
        &mut self,
        timeout: Duration,
        mut read: impl FnMut(Duration, &mut [u8]) -> io::Result<usize>,
    ) -> io::Result<Option<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.pop() {
                return Ok(Some(l));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut chunk = [0u8; 512];
            let n = read(left, &mut chunk)?;
            self.push(chunk.get(..n).unwrap_or(&[]));
        }
    }
}

impl SerialOob {
    /// Opens `path` and puts it in raw mode (no echo, no line editing, no
    /// CR/LF translation), so the bytes arrive as the peer sent them.
    pub fn open(path: &Path) -> io::Result<SerialOob> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path)?;
        let fd = file.as_raw_fd();
        // SAFETY: an all-zero termios is a valid value to be filled in by
        // tcgetattr, which gets a valid fd and a pointer to it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, valid pointer (see above).
        if unsafe { libc::tcgetattr(fd, &mut t) } == 0 {
            // SAFETY: `t` was filled by tcgetattr.
            unsafe { libc::cfmakeraw(&mut t) };
            // SAFETY: valid fd and termios.
            if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Not a tty (a FIFO or socket in tests): raw already.
        Ok(SerialOob {
            file,
            lines: Lines::default(),
        })
    }
}

impl Oob for SerialOob {
    fn send(&mut self, msg: &str) -> io::Result<()> {
        let line = format!("{PREFIX}{msg}\n");
        let mut rest = line.as_bytes();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !rest.is_empty() {
            match self.file.write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv(&mut self, timeout: Duration) -> io::Result<Option<String>> {
        let file = &mut self.file;
        self.lines.next_within(timeout, |left, chunk| {
            let mut pfd = libc::pollfd {
                fd: file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            match file.read(chunk) {
                // End of file on a serial line or FIFO: the writer may
                // come back.
                Ok(0) => {
                    std::thread::sleep(Duration::from_millis(5));
                    Ok(0)
                }
                Ok(n) => Ok(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    Ok(0)
                }
                Err(e) => Err(e),
            }
        })
    }
}

/// One end of an in-process channel pair.
#[derive(Debug)]
pub struct ChannelOob {
    tx: Sender<String>,
    rx: Receiver<String>,
}

impl ChannelOob {
    /// Two connected ends.
    pub fn pair() -> (ChannelOob, ChannelOob) {
        let (ta, rb) = channel();
        let (tb, ra) = channel();
        (ChannelOob { tx: ta, rx: ra }, ChannelOob { tx: tb, rx: rb })
    }
}

impl Oob for ChannelOob {
    fn send(&mut self, msg: &str) -> io::Result<()> {
        // A peer that went away is the receiver's problem (it times out);
        // the sender cannot tell a slow peer from a gone one either.
        let _ = self.tx.send(msg.to_string());
        Ok(())
    }

    fn recv(&mut self, timeout: Duration) -> io::Result<Option<String>> {
        match self.rx.recv_timeout(timeout) {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed the channel",
            )),
        }
    }
}

/// How long [`TcpOob::connect`] waits between attempts while the server is
/// not listening yet, and [`TcpOob::listen`] between looks for a
/// connection.
const TCP_RETRY: Duration = Duration::from_millis(50);

/// A TCP connection to the peer on another machine: the server side
/// listens and takes the first connection, the client side connects.
///
/// TCP delivers what the peer sent, in order and only once, so the
/// repeats of [`sync`](crate::exchange::sync) are merely redundant; the
/// peer closing the connection is an error of [`Oob::recv`] (a serial
/// line cannot tell, a socket can).
#[derive(Debug)]
pub struct TcpOob {
    stream: TcpStream,
    lines: Lines,
}

impl TcpOob {
    /// Listens on `addr` and accepts one connection, waiting at most
    /// `timeout` for it. The listening socket is closed once the peer is
    /// connected (nobody else may join).
    pub fn listen(addr: impl ToSocketAddrs, timeout: Duration) -> io::Result<TcpOob> {
        let listener = TcpListener::bind(addr)?;
        Self::from_stream(accept_one(&listener, timeout)?)
    }

    /// Connects to the server at `addr`, retrying for at most `timeout`
    /// while it is not listening yet (the two sides start in any order).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> io::Result<TcpOob> {
        Self::from_stream(connect_retry(addr, timeout)?)
    }

    /// Wraps a connected stream.
    pub fn from_stream(stream: TcpStream) -> io::Result<TcpOob> {
        // An accepted socket must block (with the timeouts `recv` sets),
        // whatever the listener was.
        stream.set_nonblocking(false)?;
        // Messages are single short lines, each awaited by the peer.
        stream.set_nodelay(true)?;
        // A peer that stops reading fails a send instead of blocking it
        // forever (as the serial port's send gives up).
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(TcpOob {
            stream,
            lines: Lines::default(),
        })
    }

    /// The address of the peer.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }
}

/// Accepts one connection on `listener`, waiting at most `timeout` for it
/// (a peer that never comes is a timeout, not a hang). The stream returned
/// blocks.
pub fn accept_one(listener: &TcpListener, timeout: Duration) -> io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= deadline {
                    let at = listener
                        .local_addr()
                        .map_or_else(|_| "?".to_string(), |a| a.to_string());
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no peer connected to {at} within {timeout:?}"),
                    ));
                }
                std::thread::sleep(TCP_RETRY);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects a TCP stream to `addr`, retrying for at most `timeout` while
/// nobody listens there yet (connection refused, host unreachable while an
/// interface comes up). Every address `addr` resolves to is tried in turn.
pub fn connect_retry(addr: impl ToSocketAddrs, timeout: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing");
        match addr.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match TcpStream::connect_timeout(&a, left.max(TCP_RETRY)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = io::Error::new(e.kind(), format!("{a}: {e}")),
                    }
                }
            }
            // Name resolution may fail while the network comes up.
            Err(e) => last = e,
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                last.kind(),
                format!("could not connect within {timeout:?}: {last}"),
            ));
        }
        std::thread::sleep(TCP_RETRY);
    }
}

impl Oob for TcpOob {
    fn send(&mut self, msg: &str) -> io::Result<()> {
        self.stream.write_all(format!("{PREFIX}{msg}\n").as_bytes())
    }

    fn recv(&mut self, timeout: Duration) -> io::Result<Option<String>> {
        let stream = &mut self.stream;
        self.lines.next_within(timeout, |left, chunk| {
            // A zero read timeout would mean "block forever".
            stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match stream.read(chunk) {
                Ok(0) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                )),
                Ok(n) => Ok(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    Ok(0)
                }
                Err(e) => Err(e),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_lines_skip_noise_and_split() {
        let (r, w) = {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors pipe writes.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            (fds[0], fds[1])
        };
        let path = format!("/proc/self/fd/{r}");
        let mut s = SerialOob::open(Path::new(&path)).unwrap();
        let mut wf = {
            use std::os::fd::FromRawFd;
            // SAFETY: `w` is the pipe's write end, owned from here on.
            unsafe { File::from_raw_fd(w) }
        };
        wf.write_all(b"[  1.2] kernel noise\r\nVRDMA hello 1\nxxVRDMA hel")
            .unwrap();
        assert_eq!(
            s.recv(Duration::from_secs(1)).unwrap().as_deref(),
            Some("hello 1")
        );
        assert_eq!(s.recv(Duration::from_millis(20)).unwrap(), None);
        wf.write_all(b"lo 2\r\n").unwrap();
        assert_eq!(
            s.recv(Duration::from_secs(1)).unwrap().as_deref(),
            Some("hello 2")
        );
        // SAFETY: `r` was created above and is closed once.
        unsafe { libc::close(r) };
    }

    #[test]
    fn channel_pair_delivers_both_ways() {
        let (mut a, mut b) = ChannelOob::pair();
        a.send("x").unwrap();
        b.send("y").unwrap();
        assert_eq!(
            b.recv(Duration::from_secs(1)).unwrap().as_deref(),
            Some("x")
        );
        assert_eq!(
            a.recv(Duration::from_secs(1)).unwrap().as_deref(),
            Some("y")
        );
        drop(b);
        assert!(a.recv(Duration::from_millis(10)).is_err());
    }
    #[test]
    fn tcp_pair_delivers_both_ways_and_reports_a_closed_peer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        // The client starts first: it must retry until the server listens.
        let client = std::thread::spawn(move || {
            let mut c = TcpOob::connect(addr, Duration::from_secs(10)).unwrap();
            c.send("from client").unwrap();
            let got = c.recv(Duration::from_secs(5)).unwrap();
            (c, got)
        });
        std::thread::sleep(Duration::from_millis(200));
        let mut s = TcpOob::listen(addr, Duration::from_secs(10)).unwrap();
        assert_eq!(
            s.recv(Duration::from_secs(5)).unwrap().as_deref(),
            Some("from client")
        );
        // Noise and a message split over two writes.
        s.stream.write_all(b"noise\nVRDMA from ").unwrap();
        s.stream.write_all(b"server\n").unwrap();
        let (c, got) = client.join().unwrap();
        assert_eq!(got.as_deref(), Some("from server"));
        assert_eq!(s.recv(Duration::from_millis(50)).unwrap(), None);
        drop(c);
        let e = s.recv(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn tcp_listen_and_connect_time_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let t = Instant::now();
        let e = TcpOob::connect(addr, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        let e = TcpOob::listen(addr, Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    }
}
