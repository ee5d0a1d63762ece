//! vhost-user's device-state transfer (`SET_DEVICE_STATE_FD`,
//! `CHECK_DEVICE_STATE`; spec 20.1): moving the saved state through the
//! file the front-end hands over, on a thread of its own, so that a
//! front-end that reads or writes slowly, or never, holds up neither its
//! own vhost-user connection nor any other VM.
//!
//! - `SAVE`: the state is taken at once (the device is stopped) and a
//!   writer thread puts it into the file, then closes it: the front-end
//!   reads until end of file.
//! - `LOAD`: a reader thread reads the frame header first, refuses a
//!   declared length past the instance's bound before reading any more,
//!   then reads exactly the declared body and expects end of file right
//!   after it. `CHECK_DEVICE_STATE` takes what it read and loads it.
//!
//! How a transfer ends, whatever the front-end does:
//!
//! - end of file (LOAD) or the last byte written (SAVE): done;
//! - more bytes than the frame declares, or a header past the bound:
//!   refused at once, without reading further;
//! - `CHECK_DEVICE_STATE` is the front-end saying it is done: a LOAD whose
//!   file is still open (its writer never closed it) or a SAVE whose
//!   state was not read whole fails then, after taking what is already
//!   there, and the check reports the error;
//! - no byte moving either way for [`STALL_LIMIT`]: the thread gives up;
//! - the VMM disconnecting, or a new `SET_DEVICE_STATE_FD` replacing the
//!   transfer: the thread is told to stop and joined.
//!
//! A thread holds only its file and at most the state bound of bytes;
//! every end closes the file. vhost-user-backend 0.24 answers the
//! front-end a fixed failure code for any error (`0x101` to
//! `SET_DEVICE_STATE_FD`, `1` to `CHECK_DEVICE_STATE`); the errors below
//! go to the log with the VM's name.

// What this module reads comes from the front-end: the same lints as the
// guest-facing modules (`lib.rs`).
#![cfg_attr(
    not(test),
    deny(
        clippy::arithmetic_side_effects,
        clippy::indexing_slicing,
        clippy::cast_possible_truncation
    )
)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::migration::format::{check_header, HEADER_LEN};
use crate::migration::MigrationError;
use crate::sync::lock;

use super::RdmaDevice;

/// How long a transfer may go without a byte moving before its thread
/// gives up. Generous: QEMU moves the state from its migration thread
/// without pausing; this is only for a front-end that left the file
/// alone and stays connected.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Bytes moved per read or write call.
const CHUNK: usize = 64 * 1024;

/// Why a device-state transfer failed.
#[derive(Debug, Error)]
pub enum StateFdError {
    /// `LOAD` while the device is started.
    #[error("LOAD while the device is started")]
    Running,
    /// The state could not be taken, or was refused when loading.
    #[error(transparent)]
    State(#[from] MigrationError),
    /// A read or write on the front-end's file failed.
    #[error("{op} the state file: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The file ended before the frame did.
    #[error("the state ended after {got} bytes; {want} expected")]
    Truncated {
        /// Bytes read.
        got: u64,
        /// Bytes the frame has (or the header's size, before it was read).
        want: u64,
    },
    /// The front-end wrote past the end of the frame.
    #[error("the front-end sent more than the {declared} bytes the state's header declares")]
    TooLong {
        /// The frame's size, header included.
        declared: u64,
    },
    /// `CHECK_DEVICE_STATE` while the `LOAD` file was still open.
    #[error("CHECK_DEVICE_STATE with the state file still open ({got} bytes read): the front-end did not close its end")]
    NotClosed {
        /// Bytes read so far.
        got: u64,
    },
    /// `CHECK_DEVICE_STATE` before the front-end read the whole state.
    #[error(
        "CHECK_DEVICE_STATE before the front-end read the whole state ({done} of {total} bytes)"
    )]
    NotRead {
        /// Bytes written.
        done: u64,
        /// The state's size.
        total: u64,
    },
    /// The front-end closed its end of a `SAVE` file early.
    #[error("the front-end closed the state file after {done} of {total} bytes")]
    Closed {
        /// Bytes written.
        done: u64,
        /// The state's size.
        total: u64,
    },
    /// Nothing moved for [`STALL_LIMIT`].
    #[error("no byte of the state moved for {} s ({done} bytes so far)", STALL_LIMIT.as_secs())]
    Stalled {
        /// Bytes moved.
        done: u64,
    },
    /// The transfer was abandoned (disconnect, replaced by a new one).
    #[error("the transfer was abandoned: {0}")]
    Abandoned(&'static str),
    /// The transfer failed before (at `SET_DEVICE_STATE_FD`, or at an
    /// earlier check).
    #[error("{0}")]
    Earlier(String),
    /// `CHECK_DEVICE_STATE` with no transfer since the VMM connected.
    #[error("CHECK_DEVICE_STATE without a transfer")]
    NoTransfer,
    /// The transfer thread could not be started or failed.
    #[error("transfer thread: {0}")]
    Thread(String),
}

impl StateFdError {
    /// The `io::Error` vhost-user-backend gets (its kind and errno are
    /// for the log; see the module documentation).
    fn to_io(&self) -> io::Error {
        let errno = match self {
            StateFdError::Running => libc::EBUSY,
            StateFdError::State(MigrationError::TooLarge { .. }) | StateFdError::TooLong { .. } => {
                libc::EFBIG
            }
            StateFdError::State(MigrationError::NotSavable(_)) => libc::EBUSY,
            StateFdError::State(_) | StateFdError::Truncated { .. } => libc::EINVAL,
            StateFdError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            StateFdError::Closed { .. } => libc::EPIPE,
            StateFdError::NotClosed { .. } | StateFdError::NotRead { .. } => libc::EPROTO,
            StateFdError::Stalled { .. } => libc::ETIMEDOUT,
            StateFdError::Abandoned(_) => libc::ECANCELED,
            StateFdError::NoTransfer => libc::ENOENT,
            StateFdError::Thread(_) | StateFdError::Earlier(_) => libc::EIO,
        };
        io::Error::from_raw_os_error(errno)
    }
}

/// What the transfer thread is asked to do.
const GO: u8 = 0;
/// The front-end sent `CHECK_DEVICE_STATE`: finish with what is there.
const CHECK: u8 = 1;
/// Stop now (disconnect, replaced).
const ABANDON: u8 = 2;

/// The stop request shared with a transfer thread.
struct Signal {
    what: AtomicU8,
    wake: EventFd,
}

impl Signal {
    fn new() -> io::Result<Self> {
        Ok(Signal {
            what: AtomicU8::new(GO),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    fn raise(&self, what: u8) {
        self.what.fetch_max(what, Ordering::AcqRel);
        // A full counter still wakes the thread.
        let _ = self.wake.write(1);
    }

    fn get(&self) -> u8 {
        self.what.load(Ordering::Acquire)
    }
}

/// What a finished transfer thread hands back: for a `LOAD` the frame
/// read.
type Outcome = Result<Option<Vec<u8>>, StateFdError>;

struct Worker {
    direction: VhostTransferStateDirection,
    signal: Arc<Signal>,
    thread: JoinHandle<Outcome>,
}

impl Worker {
    /// Tells the thread to finish (`CHECK`) or stop (`ABANDON`) and waits
    /// for it.
    fn finish(self, how: u8) -> Outcome {
        self.signal.raise(how);
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => Err(StateFdError::Thread("it panicked".into())),
        }
    }
}

#[derive(Default)]
enum Last {
    #[default]
    None,
    Running(Worker),
    Done(Result<(), String>),
}

/// The device's current or last state transfer.
#[derive(Default)]
pub(super) struct StateTransfer {
    last: Mutex<Last>,
}

impl StateTransfer {
    /// Stops a running transfer and forgets the last result (the VMM
    /// went away).
    pub(super) fn abandon(&self) -> Option<StateFdError> {
        let last = std::mem::take(&mut *lock(&self.last));
        match last {
            Last::Running(w) => w.finish(ABANDON).err(),
            _ => None,
        }
    }
}

impl Drop for StateTransfer {
    fn drop(&mut self) {
        let _ = self.abandon();
    }
}

impl RdmaDevice {
    /// "VM 3 (web1)": how the transfer's log lines name the VM.
    fn state_label(&self) -> String {
        match self.tenancy.vm(self.id) {
            Some(v) => format!("VM {} ({})", self.id, v.name),
            None => format!("VM {}", self.id),
        }
    }

    /// `SET_DEVICE_STATE_FD`: starts a transfer in `direction` through
    /// `file`. Never blocks on the file.
    pub(super) fn set_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        // The one phase vhost-user defines; the library refuses a message
        // naming another before it reaches us (the connection ends).
        match phase {
            VhostTransferStatePhase::STOPPED => {}
        }
        let label = self.state_label();
        let mut last = lock(&self.state_transfer.last);
        if let Last::Running(w) = std::mem::take(&mut *last) {
            let was = w.direction;
            if let Err(e) = w.finish(ABANDON) {
                info!("{label}: state transfer ({was:?}) replaced by a new one: {e}");
            }
        }
        let started = self.start_transfer(direction, file, &label);
        match started {
            Ok(w) => {
                info!("{label}: device state transfer started ({direction:?})");
                *last = Last::Running(w);
                Ok(None)
            }
            Err(e) => {
                warn!("{label}: SET_DEVICE_STATE_FD ({direction:?}) refused: {e}");
                let io = e.to_io();
                *last = Last::Done(Err(e.to_string()));
                Err(io)
            }
        }
    }

    fn start_transfer(
        &self,
        direction: VhostTransferStateDirection,
        file: File,
        label: &str,
    ) -> Result<Worker, StateFdError> {
        let signal = Arc::new(Signal::new().map_err(|e| StateFdError::Thread(e.to_string()))?);
        set_nonblocking(&file).map_err(|source| StateFdError::Io {
            op: "setting O_NONBLOCK on",
            source,
        })?;
        let thread_signal = signal.clone();
        let builder = std::thread::Builder::new();
        let spawned = match direction {
            VhostTransferStateDirection::SAVE => {
                let state = self.save_state()?;
                builder
                    .name(format!("vm{}-state-save", self.id))
                    .spawn(move || write_state(file, &state, &thread_signal).map(|()| None))
            }
            VhostTransferStateDirection::LOAD => {
                if self.running() {
                    return Err(StateFdError::Running);
                }
                let bound = self.state_bound();
                builder
                    .name(format!("vm{}-state-load", self.id))
                    .spawn(move || read_state(file, bound, &thread_signal).map(Some))
            }
        };
        let thread = spawned.map_err(|e| StateFdError::Thread(format!("{label}: {e}")))?;
        Ok(Worker {
            direction,
            signal,
            thread,
        })
    }

    /// `CHECK_DEVICE_STATE`: the result of the last transfer. Waits for
    /// its thread, which finishes with what it has (see the module
    /// documentation); a `LOAD` is loaded here.
    pub(super) fn check_state_fd(&self) -> io::Result<()> {
        let label = self.state_label();
        let mut last = lock(&self.state_transfer.last);
        let result = match std::mem::take(&mut *last) {
            Last::None => Err(StateFdError::NoTransfer),
            Last::Done(Ok(())) => Ok(()),
            Last::Done(Err(e)) => Err(StateFdError::Earlier(e)),
            Last::Running(w) => {
                let direction = w.direction;
                match w.finish(CHECK) {
                    Ok(Some(bytes)) => self
                        .load_state(&bytes)
                        .map(|()| {
                            info!("{label}: device state loaded ({} bytes)", bytes.len());
                        })
                        .map_err(StateFdError::from),
                    Ok(None) => {
                        info!("{label}: device state saved ({direction:?} done)");
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(()) => {
                *last = Last::Done(Ok(()));
                Ok(())
            }
            Err(e) => {
                warn!("{label}: CHECK_DEVICE_STATE: the transfer failed: {e}");
                let io = e.to_io();
                *last = Last::Done(Err(e.to_string()));
                Err(io)
            }
        }
    }

    /// The VMM went away: a transfer still running stops and closes its
    /// file.
    pub(super) fn abandon_state_fd(&self) {
        if let Some(e) = self.state_transfer.abandon() {
            info!("{}: device state transfer ended: {e}", self.state_label());
        }
    }
}

fn set_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an integer argument on a descriptor we own.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What waiting for the file gave.
enum Ready {
    /// The file is ready (or has an error or hang-up to report).
    File,
    /// The signal was raised.
    Signal,
    /// Nothing for [`STALL_LIMIT`].
    Stalled,
}

/// Waits until `file` is ready for `events` or `signal` is raised.
fn wait(file: BorrowedFd<'_>, events: libc::c_short, signal: &Signal) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            fd: file.as_raw_fd(),
            events,
            revents: 0,
        },
        libc::pollfd {
            fd: signal.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let timeout = i32::try_from(STALL_LIMIT.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the duration of
        // the call, both descriptors are open (borrowed and owned).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(Ready::Stalled);
        }
        if fds[1].revents != 0 {
            return Ok(Ready::Signal);
        }
        return Ok(Ready::File);
    }
}

/// The writer thread of a `SAVE`: puts `state` into `file`, then closes
/// it (by dropping it).
fn write_state(mut file: File, state: &[u8], signal: &Signal) -> Result<(), StateFdError> {
    let total = state.len() as u64;
    let mut done = 0usize;
    while let Some(rest) = state.get(done..).filter(|r| !r.is_empty()) {
        let chunk = rest.get(..CHUNK).unwrap_or(rest);
        match file.write(chunk) {
            Ok(0) => {
                return Err(StateFdError::Closed {
                    done: done as u64,
                    total,
                })
            }
            Ok(n) => {
                done = done.saturating_add(n);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                return Err(StateFdError::Closed {
                    done: done as u64,
                    total,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(StateFdError::Io {
                    op: "writing",
                    source,
                })
            }
        }
        // The front-end has not read enough yet.
        match signal.get() {
            GO => {}
            CHECK => {
                return Err(StateFdError::NotRead {
                    done: done as u64,
                    total,
                })
            }
            _ => return Err(StateFdError::Abandoned("stopped")),
        }
        match wait(file.as_fd(), libc::POLLOUT, signal) {
            Ok(Ready::File | Ready::Signal) => {}
            Ok(Ready::Stalled) => return Err(StateFdError::Stalled { done: done as u64 }),
            Err(source) => {
                return Err(StateFdError::Io {
                    op: "waiting for",
                    source,
                })
            }
        }
    }
    Ok(())
}

/// The reader thread of a `LOAD`: reads the frame from `file` (header,
/// then the declared body, then end of file), at most `bound` bytes.
fn read_state(mut file: File, bound: u64, signal: &Signal) -> Result<Vec<u8>, StateFdError> {
    let mut buf: Vec<u8> = Vec::new();
    // The frame's size once the header is read; the header's size before.
    let mut want: Option<u64> = None;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        // Looked at before the read: a CHECK seen here came after the
        // front-end closed its end, so the read that follows sees all it
        // wrote. (Looked at after a read that found nothing, a CHECK sent
        // right after that read would end the transfer with the bytes
        // still in the pipe.)
        let told = signal.get();
        let need = want.unwrap_or(HEADER_LEN as u64);
        let got = buf.len() as u64;
        // One byte more than the frame needs shows a front-end that sends
        // past its end (the read that finds end of file reads nothing).
        let room = usize::try_from(need.saturating_sub(got).saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(CHUNK);
        let Some(window) = chunk.get_mut(..room) else {
            return Err(StateFdError::Thread("read window".into()));
        };
        match file.read(window) {
            Ok(0) => {
                return match want {
                    Some(total) if got == total => Ok(buf),
                    _ => Err(StateFdError::Truncated { got, want: need }),
                };
            }
            Ok(n) => {
                let Some(bytes) = window.get(..n) else {
                    return Err(StateFdError::Thread("read past its window".into()));
                };
                if got.saturating_add(n as u64) > need && want.is_some() {
                    return Err(StateFdError::TooLong { declared: need });
                }
                buf.extend_from_slice(bytes);
                if want.is_none() && buf.len() >= HEADER_LEN {
                    let header = buf.get(..HEADER_LEN).unwrap_or_default();
                    let body = check_header(header, bound)?;
                    let total = body.saturating_add(HEADER_LEN as u64);
                    if buf.len() as u64 > total {
                        return Err(StateFdError::TooLong { declared: total });
                    }
                    // Once, for the declared frame (at most the bound): no
                    // doubling past it; pages are touched only as bytes come.
                    let more = usize::try_from(total)
                        .unwrap_or(usize::MAX)
                        .saturating_sub(buf.len());
                    buf.try_reserve_exact(more).map_err(|e| {
                        StateFdError::Thread(format!("buffer of {total} bytes: {e}"))
                    })?;
                    want = Some(total);
                }
                // A CHECK first takes what the front-end wrote; only an
                // abandon stops a file that still has bytes.
                if signal.get() == ABANDON {
                    return Err(StateFdError::Abandoned("stopped"));
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(StateFdError::Io {
                    op: "reading",
                    source,
                })
            }
        }
        match told {
            GO => {}
            CHECK => return Err(StateFdError::NotClosed { got }),
            _ => return Err(StateFdError::Abandoned("stopped")),
        }
        match wait(file.as_fd(), libc::POLLIN, signal) {
            Ok(Ready::File | Ready::Signal) => {}
            Ok(Ready::Stalled) => return Err(StateFdError::Stalled { done: got }),
            Err(source) => {
                return Err(StateFdError::Io {
                    op: "waiting for",
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    fn pipe() -> (File, File) {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(r, 0);
        // SAFETY: two new descriptors nothing else owns.
        let (r, w) = unsafe {
            (
                File::from(OwnedFd::from_raw_fd(fds[0])),
                File::from(OwnedFd::from_raw_fd(fds[1])),
            )
        };
        (r, w)
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&crate::migration::MAGIC);
        b.extend_from_slice(&crate::migration::FORMAT_VERSION_PLAIN.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(body);
        b
    }

    fn reader(file: File, bound: u64) -> (Arc<Signal>, JoinHandle<Result<Vec<u8>, StateFdError>>) {
        set_nonblocking(&file).unwrap();
        let signal = Arc::new(Signal::new().unwrap());
        let s = signal.clone();
        (
            signal,
            std::thread::spawn(move || read_state(file, bound, &s)),
        )
    }

    #[test]
    fn a_frame_is_read_whole_up_to_end_of_file() {
        let body = vec![7u8; 300_000];
        let f = frame(&body);
        let (r, mut w) = pipe();
        let (_s, t) = reader(r, 1 << 20);
        w.write_all(&f).unwrap();
        drop(w);
        assert_eq!(t.join().unwrap().unwrap(), f);
    }

    #[test]
    fn bytes_past_the_frame_are_refused() {
        let mut f = frame(&[1, 2, 3]);
        f.push(0);
        let (r, mut w) = pipe();
        let (_s, t) = reader(r, 1 << 20);
        w.write_all(&f).unwrap();
        drop(w);
        assert!(matches!(
            t.join().unwrap(),
            Err(StateFdError::TooLong { declared: 35 })
        ));
    }

    #[test]
    fn a_declared_length_past_the_bound_is_refused_from_the_header() {
        let mut f = frame(&[1, 2, 3]);
        f[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let (r, mut w) = pipe();
        let (_s, t) = reader(r, 1 << 20);
        // Only the header: the reader must decide without the body, and
        // the write end stays open.
        w.write_all(&f[..HEADER_LEN]).unwrap();
        assert!(matches!(
            t.join().unwrap(),
            Err(StateFdError::State(MigrationError::TooLarge { .. }))
        ));
        drop(w);
    }

    #[test]
    fn a_check_with_the_file_open_ends_the_reader_after_taking_what_is_there() {
        let f = frame(&[9; 10]);
        let (r, mut w) = pipe();
        let (s, t) = reader(r, 1 << 20);
        w.write_all(&f).unwrap();
        s.raise(CHECK);
        assert!(matches!(
            t.join().unwrap(),
            Err(StateFdError::NotClosed { got: 42 })
        ));
        drop(w);
    }

    /// A front-end that wrote its state, closed its end and then sent
    /// CHECK gets it loaded, however the reader's reads fall around the
    /// check (seen under TCG: the reader found the pipe empty just before
    /// the write, and CHECK was raised before it looked at the signal).
    #[test]
    fn a_state_written_and_closed_before_the_check_is_always_taken() {
        for i in 0..300u32 {
            let f = frame(&[7; 300]);
            let (r, mut w) = pipe();
            let (s, t) = reader(r, 1 << 20);
            if i % 2 == 0 {
                std::thread::yield_now();
            }
            w.write_all(&f).unwrap();
            drop(w);
            s.raise(CHECK);
            assert_eq!(t.join().unwrap().unwrap(), f, "round {i}");
        }
    }

    #[test]
    fn a_truncated_frame_is_refused() {
        let f = frame(&[9; 10]);
        let (r, mut w) = pipe();
        let (_s, t) = reader(r, 1 << 20);
        w.write_all(&f[..20]).unwrap();
        drop(w);
        assert!(matches!(
            t.join().unwrap(),
            Err(StateFdError::Truncated { got: 20, want: 32 })
        ));
    }

    #[test]
    fn the_writer_stops_when_told_and_when_the_reader_goes() {
        let state = vec![5u8; 1 << 20];
        let (r, w) = pipe();
        set_nonblocking(&w).unwrap();
        let signal = Arc::new(Signal::new().unwrap());
        let s = signal.clone();
        let st = state.clone();
        let t = std::thread::spawn(move || write_state(w, &st, &s));
        signal.raise(CHECK);
        assert!(matches!(
            t.join().unwrap(),
            Err(StateFdError::NotRead { total, .. }) if total == 1 << 20
        ));
        drop(r);

        let (r, w) = pipe();
        set_nonblocking(&w).unwrap();
        let s = Arc::new(Signal::new().unwrap());
        drop(r);
        assert!(matches!(
            write_state(w, &state, &s),
            Err(StateFdError::Closed { done: 0, .. })
        ));
    }

    #[test]
    fn the_writer_writes_everything_and_closes() {
        let state: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
        let (mut r, w) = pipe();
        set_nonblocking(&w).unwrap();
        let s = Arc::new(Signal::new().unwrap());
        let st = state.clone();
        let t = std::thread::spawn(move || write_state(w, &st, &s));
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(got, state);
    }
}
