//! Out-of-band channel between the two peers, for what RDMA cannot carry
//! before a connection exists: QP numbers, GIDs, rkeys and addresses.
//!
//! Real guests use a serial port cabled to the other guest's (two QEMU
//! `-chardev socket` ends, one server and one client: a null modem); tests
//! use an in-process channel. Messages are text lines `VRDMA <body>`; other
//! lines (console noise) are ignored.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
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
    buf: Vec<u8>,
    lines: VecDeque<String>,
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
            buf: Vec::new(),
            lines: VecDeque::new(),
        })
    }

    fn split_lines(&mut self) {
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\r', '\n']);
            if let Some(body) = text.find(PREFIX).map(|p| &text[p + PREFIX.len()..]) {
                self.lines.push_back(body.to_string());
            }
        }
        if self.buf.len() > MAX_LINE {
            self.buf.clear();
        }
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
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines.pop_front() {
                return Ok(Some(l));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.file.as_raw_fd(),
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
            let mut chunk = [0u8; 512];
            match self.file.read(&mut chunk) {
                Ok(0) => std::thread::sleep(Duration::from_millis(5)),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.split_lines();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
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
}
