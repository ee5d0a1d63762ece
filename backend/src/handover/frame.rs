//! vhost-user messages as whole frames on a Unix stream socket: the
//! 12-byte header (request, flags, size), the body and the descriptors
//! that came with the header. The relay forwards them without interpreting
//! more than the header; the session record and the ring control read
//! the bodies they need.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use thiserror::Error;
use vhost::vhost_user::message::{MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Bytes in a message header.
pub const HEADER: usize = 12;
/// The protocol version every message carries in its flags.
pub const VERSION: u32 = 0x1;
/// The flag of a reply.
pub const REPLY: u32 = 0x4;
/// The flag of a request that wants an acknowledgement (`REPLY_ACK`).
pub const NEED_REPLY: u32 = 0x8;

/// Errors reading or writing a frame.
#[derive(Debug, Error)]
pub enum FrameError {
    /// The peer closed the connection inside a message.
    #[error("the connection ended inside a message")]
    Partial,
    /// A body larger than vhost-user allows.
    #[error("a message of {0} bytes (at most {MAX_MSG_SIZE})")]
    TooLarge(u32),
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

/// One vhost-user message.
#[derive(Debug, Default)]
pub struct Frame {
    /// The request code.
    pub code: u32,
    /// The header flags (version, reply, need-reply).
    pub flags: u32,
    /// The body (at most [`MAX_MSG_SIZE`] bytes).
    pub body: Vec<u8>,
    /// The descriptors sent with the message.
    pub fds: Vec<OwnedFd>,
}

impl Frame {
    /// A request without descriptors.
    pub fn request(code: u32, body: Vec<u8>) -> Frame {
        Frame {
            code,
            flags: VERSION,
            body,
            fds: Vec::new(),
        }
    }

    /// Whether this is a reply.
    pub fn is_reply(&self) -> bool {
        self.flags & REPLY != 0
    }

    /// The `u64` at byte `offset` of the body.
    pub fn u64_at(&self, offset: usize) -> Option<u64> {
        let b = self.body.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }

    /// The `u32` at byte `offset` of the body.
    pub fn u32_at(&self, offset: usize) -> Option<u32> {
        let b = self.body.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_ne_bytes(b.try_into().ok()?))
    }
}

/// Reads exactly `buf.len()` bytes; false if the stream ended before the
/// first of them.
fn read_full(stream: &mut UnixStream, buf: &mut [u8]) -> Result<bool, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(FrameError::Partial),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Reads the next message; `None` when the peer closed the connection
/// between messages.
pub fn read_frame(stream: &mut UnixStream) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; HEADER];
    let mut raw: [RawFd; MAX_ATTACHED_FD_ENTRIES] = [-1; MAX_ATTACHED_FD_ENTRIES];
    let mut iov = [libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: HEADER,
    }];
    let (got, nfds) = loop {
        // SAFETY: the iovec points at `header`, which is writable for its
        // whole length and outlives the call; `raw` receives descriptors.
        match unsafe { stream.recv_with_fds(&mut iov, &mut raw) } {
            Ok(r) => break r,
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno()).into()),
        }
    };
    let fds: Vec<OwnedFd> = raw
        .iter()
        .take(nfds)
        // SAFETY: recvmsg installed these descriptors for this process and
        // nothing else owns them.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER && !read_full(stream, &mut header[got..])? {
        return Err(FrameError::Partial);
    }
    let word =
        |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let (code, flags, size) = (word(0), word(4), word(8));
    if size as usize > MAX_MSG_SIZE {
        return Err(FrameError::TooLarge(size));
    }
    let mut body = vec![0u8; size as usize];
    if !body.is_empty() && !read_full(stream, &mut body)? {
        return Err(FrameError::Partial);
    }
    Ok(Some(Frame {
        code,
        flags,
        body,
        fds,
    }))
}

/// Writes `frame`, its descriptors with the header.
pub fn write_frame(stream: &mut UnixStream, frame: &Frame) -> Result<(), FrameError> {
    let size = u32::try_from(frame.body.len())
        .ok()
        .filter(|&s| s as usize <= MAX_MSG_SIZE)
        .ok_or(FrameError::TooLarge(u32::MAX))?;
    let mut bytes = Vec::with_capacity(HEADER + frame.body.len());
    bytes.extend_from_slice(&frame.code.to_ne_bytes());
    bytes.extend_from_slice(&frame.flags.to_ne_bytes());
    bytes.extend_from_slice(&size.to_ne_bytes());
    bytes.extend_from_slice(&frame.body);
    let fds: Vec<RawFd> = frame.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let sent = loop {
        match stream.send_with_fds(&[bytes.as_slice()], &fds) {
            Ok(n) => break n,
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno()).into()),
        }
    };
    if let Some(rest) = bytes.get(sent..) {
        stream.write_all(rest)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_with_descriptors_goes_through_whole() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let (r, _w) = UnixStream::pair().unwrap();
        let f = Frame {
            code: 12,
            flags: VERSION | NEED_REPLY,
            body: 7u64.to_ne_bytes().to_vec(),
            fds: vec![OwnedFd::from(r)],
        };
        write_frame(&mut a, &f).unwrap();
        let g = read_frame(&mut b).unwrap().unwrap();
        assert_eq!(
            (g.code, g.flags, g.body.as_slice()),
            (12, f.flags, f.body.as_slice())
        );
        assert_eq!(g.fds.len(), 1);
        assert_eq!(g.u64_at(0), Some(7));
        assert_eq!(g.u64_at(1), None);
        drop(a);
        assert!(read_frame(&mut b).unwrap().is_none());
    }

    #[test]
    fn oversized_and_cut_messages_are_errors() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut h = Vec::new();
        for w in [1u32, VERSION, (MAX_MSG_SIZE + 1) as u32] {
            h.extend_from_slice(&w.to_ne_bytes());
        }
        a.write_all(&h).unwrap();
        assert!(matches!(read_frame(&mut b), Err(FrameError::TooLarge(_))));
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut h = Vec::new();
        for w in [1u32, VERSION, 8] {
            h.extend_from_slice(&w.to_ne_bytes());
        }
        h.extend_from_slice(&[0; 3]);
        a.write_all(&h).unwrap();
        drop(a);
        assert!(matches!(read_frame(&mut b), Err(FrameError::Partial)));
    }
}
