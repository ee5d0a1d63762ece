//! The vhost-user connection of a test VM, with a watchdog so that a
//! backend that stops answering fails the message instead of hanging the
//! test.
//!
//! vhost 0.18's endpoint retries `EAGAIN` in a loop, so socket timeouts
//! (`SO_RCVTIMEO`) would turn a hang into a busy spin. Instead, a watchdog
//! thread shuts the socket down when a message takes longer than the
//! timeout; the blocked receive then sees end-of-file and returns an error.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::FrontendReq;
use vhost::vhost_user::Frontend;
use vm_memory::ByteValued;

use crate::error::{Error, Result};

/// Bytes of a vhost-user message header (request, flags, size).
const HEADER_SIZE: usize = 12;
/// Header flags: protocol version 1.
const VERSION_1: u32 = 0x1;
/// Header flags: the version bits.
const VERSION_MASK: u32 = 0x3;
/// Header flags: a reply.
const REPLY: u32 = 0x4;

/// Reads exactly `buf.len()` bytes from the socket `fd`.
fn recv_exact(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        // SAFETY: `fd` is an open socket of the caller's; `rest` is valid
        // for writes of its length.
        let n = unsafe { libc::recv(fd, rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(_) => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[derive(Debug, Default)]
struct WdState {
    deadline: Option<Instant>,
    /// When the thread wakes up by itself next (None: only when notified).
    wake: Option<Instant>,
    fired: bool,
    quit: bool,
}

type WdShared = Arc<(Mutex<WdState>, Condvar)>;

fn lock(m: &Mutex<WdState>) -> MutexGuard<'_, WdState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shuts the socket down when an armed deadline passes.
#[derive(Debug)]
struct Watchdog {
    shared: WdShared,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn spawn(sock: OwnedFd) -> Result<Self> {
        let shared: WdShared = Arc::new((Mutex::new(WdState::default()), Condvar::new()));
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vmm-watchdog".into())
            .spawn(move || Self::run(&s2, &sock))
            .map_err(|e| Error::io("spawn watchdog", e))?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    fn run(shared: &WdShared, sock: &OwnedFd) {
        let (m, cv) = &**shared;
        let mut st = lock(m);
        loop {
            if st.quit {
                return;
            }
            st = match st.deadline {
                None => {
                    st.wake = None;
                    cv.wait(st).unwrap_or_else(|e| e.into_inner())
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        // SAFETY: `sock` is an fd we own (a dup of the
                        // vhost-user socket); shutdown has no memory effects.
                        unsafe {
                            libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR);
                        }
                        st.fired = true;
                        st.deadline = None;
                        continue;
                    }
                    st.wake = Some(d);
                    cv.wait_timeout(st, d - now)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            };
        }
    }

    fn arm(&self, timeout: Duration) {
        let (m, cv) = &*self.shared;
        let deadline = Instant::now() + timeout;
        let mut st = lock(m);
        st.deadline = Some(deadline);
        // Deadlines only move later (the same timeout from a later now): a
        // thread that wakes up by itself before this one looks again then.
        // Waking it for every message cost a thread switch per message.
        if st.wake.is_none_or(|w| w > deadline) {
            cv.notify_one();
        }
    }

    /// Disarms; returns whether the watchdog fired since it was armed.
    fn disarm(&self) -> bool {
        let (m, _) = &*self.shared;
        let mut st = lock(m);
        st.deadline = None;
        std::mem::take(&mut st.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (m, cv) = &*self.shared;
        lock(m).quit = true;
        cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A vhost-user frontend connection with per-message timeout.
pub struct Conn {
    fe: Frontend,
    timeout: Option<Duration>,
    watchdog: Option<Watchdog>,
    /// How long a wait for a reply yields before it blocks
    /// ([`Conn::set_reply_spin`]).
    reply_spin: Option<Duration>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("fd", &self.fe.as_raw_fd())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Wraps `fe`; every message sent through [`Conn::call`] must complete
    /// within `timeout` (None: no limit).
    pub fn new(fe: Frontend, timeout: Option<Duration>) -> Result<Self> {
        let watchdog = match timeout {
            Some(_) => {
                // SAFETY: the fd is the frontend's open socket, alive while
                // borrowed here; it is immediately duplicated into an OwnedFd.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fe.as_raw_fd()) };
                let dup = fd
                    .try_clone_to_owned()
                    .map_err(|e| Error::io("dup vhost-user socket", e))?;
                Some(Watchdog::spawn(dup)?)
            }
            None => None,
        };
        Ok(Conn {
            fe,
            timeout,
            watchdog,
            reply_spin: None,
        })
    }

    /// A wait for a reply ([`Conn::recv_reply_bytes`]) first yields the CPU
    /// for up to `spin` while no byte of it has come (None: it blocks at
    /// once); see [`VmmOptions::reply_spin`](crate::vmm::VmmOptions::reply_spin).
    pub fn set_reply_spin(&mut self, spin: Option<Duration>) {
        self.reply_spin = spin;
    }

    /// Yields the CPU until the socket is readable or the reply spin has
    /// passed.
    fn spin_for_reply(&self) {
        let Some(spin) = self.reply_spin else {
            return;
        };
        let until = Instant::now() + spin;
        let mut pfd = libc::pollfd {
            fd: self.fe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        while Instant::now() < until {
            pfd.revents = 0;
            // SAFETY: `pfd` is a valid pollfd array of length 1 that
            // outlives the call; a zero timeout does not block.
            if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
                // Readable, hung up, or an error the blocking read reports.
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Runs one vhost-user exchange under the watchdog.
    pub fn call<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T> {
        self.watched(what, |c| f(&mut c.fe).map_err(|e| Error::vhost(what, e)))
    }

    /// Runs `f` under the watchdog: a message timeout if it fired.
    fn watched<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if let (Some(wd), Some(t)) = (&self.watchdog, self.timeout) {
            wd.arm(t);
        }
        let r = f(self);
        let fired = self.watchdog.as_ref().is_some_and(Watchdog::disarm);
        match r {
            Ok(v) => Ok(v),
            Err(_) if fired => Err(Error::MessageTimeout {
                what,
                timeout: self.timeout.unwrap_or_default(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends a request without file descriptors and without asking for an
    /// acknowledgement, and returns without reading anything: requests
    /// that have a reply anyway (the `GET_*` ones) are answered in order,
    /// and [`Conn::recv_reply`] reads those answers later. So several
    /// requests cost one round trip (the back-end handles a connection's
    /// messages in order). The frontend's own calls must not expect a reply
    /// while answers of posted requests are unread.
    pub fn post(&mut self, req: FrontendReq, body: &[u8]) -> Result<()> {
        let size = u32::try_from(body.len()).map_err(|_| Error::Backend("message size".into()))?;
        let mut msg = Vec::with_capacity(HEADER_SIZE + body.len());
        msg.extend_from_slice(&u32::from(req).to_le_bytes());
        msg.extend_from_slice(&VERSION_1.to_le_bytes());
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(body);
        let fd = self.fe.as_raw_fd();
        let mut sent = 0;
        while sent < msg.len() {
            let rest = &msg[sent..];
            // SAFETY: `fd` is the frontend's open socket; `rest` is valid for
            // reads of its length; MSG_NOSIGNAL: a gone peer is an error,
            // not SIGPIPE.
            let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
            match usize::try_from(n) {
                Ok(n) => sent += n,
                Err(_) => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(Error::io("post a vhost-user request", e));
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads the reply to a request sent with [`Conn::post`] (the next
    /// message on the socket), under the watchdog: a reply to `req` with a
    /// payload of exactly `T`'s size.
    pub fn recv_reply<T: ByteValued + Default>(
        &mut self,
        what: &'static str,
        req: FrontendReq,
    ) -> Result<T> {
        let size = std::mem::size_of::<T>();
        let body = self.recv_reply_bytes(what, req, size)?;
        if body.len() != size {
            return Err(Error::Backend(format!(
                "{what}: a reply of {} bytes, expected {size}",
                body.len()
            )));
        }
        let mut v = T::default();
        v.as_mut_slice().copy_from_slice(&body);
        Ok(v)
    }

    /// [`Conn::recv_reply`] for a payload of up to `max` bytes, returned
    /// as they came.
    pub fn recv_reply_bytes(
        &mut self,
        what: &'static str,
        req: FrontendReq,
        max: usize,
    ) -> Result<Vec<u8>> {
        self.spin_for_reply();
        self.watched(what, |c| {
            let fd = c.fe.as_raw_fd();
            let mut hdr = [0u8; HEADER_SIZE];
            recv_exact(fd, &mut hdr).map_err(|e| Error::io(what, e))?;
            let word = |i: usize| {
                let mut w = [0u8; 4];
                w.copy_from_slice(&hdr[4 * i..4 * i + 4]);
                u32::from_le_bytes(w)
            };
            let (code, flags, size) = (word(0), word(1), word(2));
            let len = usize::try_from(size).unwrap_or(usize::MAX);
            if code != u32::from(req)
                || flags & (VERSION_MASK | REPLY) != VERSION_1 | REPLY
                || len > max
            {
                return Err(Error::Backend(format!(
                    "{what}: reply {code} (flags {flags:#x}, {size} bytes) to request {}",
                    u32::from(req)
                )));
            }
            let mut body = vec![0u8; len];
            recv_exact(fd, &mut body).map_err(|e| Error::io(what, e))?;
            Ok(body)
        })
    }

    /// The frontend itself (messages sent directly are not timed).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    /// Shuts the socket down (both directions); the backend sees a hangup.
    pub fn shutdown(&self) {
        // SAFETY: the fd is the frontend's open socket, alive for the call;
        // shutdown does not close it and has no memory effects.
        unsafe {
            libc::shutdown(self.fe.as_raw_fd(), libc::SHUT_RDWR);
        }
    }
}
