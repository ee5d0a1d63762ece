//! The relay between a VMM's connection and the in-process vhost-user
//! handler that serves it: every message goes through unchanged, the
//! front-end's requests update the connection's [`SessionRecord`], and the
//! relay can be paused between two messages with the handler idle, so that
//! the hand-over may speak to the handler itself ([`super::rings`]) and
//! then either resume the relay or pass the connection on.
//!
//! Pausing: the relay stops reading the VMM, sends the handler a
//! `GET_FEATURES` of its own and forwards every reply until that one's.
//! Replies come in request order and `GET_FEATURES` always has one, so
//! the handler has then answered everything the VMM sent. The VMM's own
//! `GET_FEATURES` in flight are counted so that their replies are not
//! taken for the probe's.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use log::{debug, warn};
use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::frame::{read_frame, write_frame, Frame, FrameError};
use super::record::{code, SessionRecord};

/// A VMM's connection and the handler's, with what the VMM configured.
#[derive(Debug)]
pub struct Link {
    /// The VMM's connection.
    pub vmm: UnixStream,
    /// The connection to this daemon's handler of the VM.
    pub handler: UnixStream,
    /// What the VMM configured.
    pub record: SessionRecord,
    /// The VMM's `GET_FEATURES` the handler has not answered yet.
    vmm_get_features: u32,
}

impl Link {
    /// A link with an empty record (a new connection).
    pub fn new(vmm: UnixStream, handler: UnixStream) -> Link {
        Link::with_record(vmm, handler, SessionRecord::default())
    }

    /// A link whose VMM configured `record` already (a connection taken
    /// over from another daemon).
    pub fn with_record(vmm: UnixStream, handler: UnixStream, record: SessionRecord) -> Link {
        Link {
            vmm,
            handler,
            record,
            vmm_get_features: 0,
        }
    }

    /// Sends `frame` to the handler and reads its reply (the relay is
    /// paused: nothing else speaks on the connection).
    pub fn ask(&mut self, frame: &Frame) -> Result<Frame, FrameError> {
        write_frame(&mut self.handler, frame)?;
        read_frame(&mut self.handler)?.ok_or(FrameError::Partial)
    }

    /// Sends `frame` to the handler without waiting for a reply.
    pub fn tell(&mut self, frame: &Frame) -> Result<(), FrameError> {
        write_frame(&mut self.handler, frame)
    }
}

/// Errors pausing a relay.
#[derive(Debug, Error)]
pub enum PauseError {
    /// The VMM or the handler closed the connection.
    #[error("the connection ended")]
    Closed,
    /// The relay did not reach a pause in time (a message the VMM has not
    /// finished sending, or a handler busy with one).
    #[error("no pause between two messages within {0:?}")]
    Timeout(Duration),
}

/// [`Control::state`]: relaying.
const RUN: u8 = 0;
/// A pause is asked for.
const PAUSE: u8 = 1;
/// The relay thread paused and hands the link over.
const PAUSED: u8 = 2;

struct Control {
    state: AtomicU8,
    wake: EventFd,
}

impl Control {
    fn pause_asked(&self) -> bool {
        self.state.load(Ordering::Acquire) == PAUSE
    }
}

/// A running relay.
pub struct Relay {
    control: Arc<Control>,
    /// A second descriptor of the VMM's connection: shutting it down
    /// wakes the relay thread from a read.
    vmm: UnixStream,
    paused: Receiver<Link>,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("state", &self.control.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Starts relaying on `link`.
    pub fn spawn(link: Link, name: &str) -> io::Result<Relay> {
        let control = Arc::new(Control {
            state: AtomicU8::new(RUN),
            wake: EventFd::new(EFD_NONBLOCK)?,
        });
        let vmm = link.vmm.try_clone()?;
        let (tx, paused) = sync_channel(1);
        let c = control.clone();
        let thread = thread::Builder::new()
            .name(name.into())
            .spawn(move || run(link, &c, &tx))?;
        Ok(Relay {
            control,
            vmm,
            paused,
            thread,
        })
    }

    /// Pauses the relay with the handler idle and returns the link; on
    /// failure the relay goes on as before.
    pub fn pause(self, wait: Duration) -> Result<Link, (Relay, PauseError)> {
        self.control.state.store(PAUSE, Ordering::Release);
        let _ = self.control.wake.write(1);
        let got = match self.paused.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {
                let given_up = self.control.state.compare_exchange(
                    PAUSE,
                    RUN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if given_up.is_ok() {
                    let _ = self.control.wake.write(1);
                    return Err((self, PauseError::Timeout(wait)));
                }
                // The relay paused just now: the link is on its way.
                self.paused.recv().ok()
            }
            r => r.ok(),
        };
        match got {
            Some(link) => {
                let _ = self.thread.join();
                Ok(link)
            }
            // The relay thread ended; `close` joins it.
            None => Err((self, PauseError::Closed)),
        }
    }

    /// Closes the VMM's connection (the relay then closes the handler's)
    /// and waits for the relay thread.
    pub fn close(self) {
        let _ = self.vmm.shutdown(Shutdown::Both);
        let _ = self.control.wake.write(1);
        let _ = self.thread.join();
    }
}

/// Which of `fds` are readable (or closed), waiting as long as it takes.
pub fn readable(fds: &[RawFd]) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `p` is a valid array of `p.len()` pollfds that poll(2)
        // may write for the duration of the call.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, -1) };
        if r >= 0 {
            return Ok(p.iter().map(|x| x.revents != 0).collect());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What the relay does next.
enum Step {
    Go,
    Paused,
    End,
}

fn run(mut link: Link, control: &Control, paused: &SyncSender<Link>) {
    let mut probing = false;
    let step = loop {
        let pause = control.pause_asked();
        if pause && !probing {
            // Everything the VMM sent is with the handler; the probe goes
            // after it.
            if let Err(e) = link.tell(&Frame::request(code::GET_FEATURES, Vec::new())) {
                debug!("relay: the handler's connection failed: {e}");
                break Step::End;
            }
            probing = true;
        }
        let watch_vmm = !pause && !probing;
        let fds = [
            control.wake.as_raw_fd(),
            link.handler.as_raw_fd(),
            if watch_vmm { link.vmm.as_raw_fd() } else { -1 },
        ];
        let ready = match readable(&fds) {
            Ok(r) => r,
            Err(e) => {
                warn!("relay: poll failed: {e}");
                break Step::End;
            }
        };
        if ready[0] {
            let _ = control.wake.read();
        }
        if ready[1] {
            match from_handler(&mut link, &mut probing, control) {
                Step::Go => {}
                other => break other,
            }
        }
        if ready[2] {
            match from_vmm(&mut link) {
                Step::Go => {}
                other => break other,
            }
        }
    };
    match step {
        Step::Paused => {
            if let Err(e) = paused.send(link) {
                // Nobody waits any more: close the connection.
                let _ = e.0.vmm.shutdown(Shutdown::Both);
                let _ = e.0.handler.shutdown(Shutdown::Both);
            }
        }
        _ => {
            let _ = link.vmm.shutdown(Shutdown::Both);
            let _ = link.handler.shutdown(Shutdown::Both);
        }
    }
}

/// A reply from the handler: to the VMM, or the probe's.
fn from_handler(link: &mut Link, probing: &mut bool, control: &Control) -> Step {
    let f = match read_frame(&mut link.handler) {
        Ok(Some(f)) => f,
        Ok(None) => return Step::End,
        Err(e) => {
            debug!("relay: the handler's connection failed: {e}");
            return Step::End;
        }
    };
    if f.code == code::GET_FEATURES && f.is_reply() {
        if link.vmm_get_features > 0 {
            link.vmm_get_features -= 1;
        } else if *probing {
            *probing = false;
            let took =
                control
                    .state
                    .compare_exchange(PAUSE, PAUSED, Ordering::AcqRel, Ordering::Acquire);
            return if took.is_ok() {
                Step::Paused
            } else {
                // A pause given up meanwhile: the probe's reply is nobody's.
                Step::Go
            };
        }
    }
    match write_frame(&mut link.vmm, &f) {
        Ok(()) => Step::Go,
        Err(e) => {
            debug!("relay: the VMM's connection failed: {e}");
            Step::End
        }
    }
}

/// A request from the VMM: recorded, then to the handler.
fn from_vmm(link: &mut Link) -> Step {
    let f = match read_frame(&mut link.vmm) {
        Ok(Some(f)) => f,
        Ok(None) => return Step::End,
        Err(e) => {
            // What the handler would have done with it: close.
            warn!("relay: the VMM sent a bad message: {e}");
            return Step::End;
        }
    };
    if f.code == code::GET_FEATURES && !f.is_reply() {
        link.vmm_get_features += 1;
    }
    if let Err(e) = link.record.apply(&f) {
        warn!("relay: cannot keep the VMM's descriptors: {e}");
        return Step::End;
    }
    match write_frame(&mut link.handler, &f) {
        Ok(()) => Step::Go,
        Err(e) => {
            debug!("relay: the handler's connection failed: {e}");
            Step::End
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handover::frame::{NEED_REPLY, REPLY, VERSION};
    use std::io::Write;

    /// A handler that answers `GET_FEATURES` with 7 (after `delay`, and
    /// telling `got` of each) and acknowledges what asks for it; it counts
    /// the `GET_FEATURES` it saw.
    fn slow_handler(
        mut s: UnixStream,
        delay: Duration,
        got: std::sync::mpsc::Sender<()>,
    ) -> JoinHandle<u32> {
        thread::spawn(move || {
            let mut seen = 0;
            while let Ok(Some(f)) = read_frame(&mut s) {
                let value = if f.code == code::GET_FEATURES {
                    seen += 1;
                    let _ = got.send(());
                    thread::sleep(delay);
                    7u64
                } else if f.flags & NEED_REPLY != 0 {
                    0
                } else {
                    continue;
                };
                let reply = Frame {
                    code: f.code,
                    flags: VERSION | REPLY,
                    body: value.to_ne_bytes().to_vec(),
                    fds: Vec::new(),
                };
                if write_frame(&mut s, &reply).is_err() {
                    break;
                }
            }
            seen
        })
    }

    fn fake_handler(s: UnixStream) -> JoinHandle<u32> {
        slow_handler(s, Duration::ZERO, std::sync::mpsc::channel().0)
    }

    fn setup() -> (UnixStream, Relay, JoinHandle<u32>) {
        let (vmm, relay_vmm) = UnixStream::pair().unwrap();
        let (relay_handler, handler) = UnixStream::pair().unwrap();
        let h = fake_handler(handler);
        let r = Relay::spawn(Link::new(relay_vmm, relay_handler), "test-relay").unwrap();
        (vmm, r, h)
    }

    fn get_features(vmm: &mut UnixStream) -> u64 {
        write_frame(vmm, &Frame::request(code::GET_FEATURES, Vec::new())).unwrap();
        read_frame(vmm).unwrap().unwrap().u64_at(0).unwrap()
    }

    #[test]
    fn messages_pass_are_recorded_and_the_probe_reply_stays_inside() {
        let (mut vmm, relay, h) = setup();
        write_frame(&mut vmm, &Frame::request(code::SET_OWNER, Vec::new())).unwrap();
        assert_eq!(get_features(&mut vmm), 7);
        let mut link = relay.pause(Duration::from_secs(60)).unwrap();
        assert!(link.record.owner);
        // Paused: the hand-over speaks to the handler itself.
        let r = link
            .ask(&Frame::request(code::GET_FEATURES, Vec::new()))
            .unwrap();
        assert_eq!(r.u64_at(0), Some(7));
        // Resumed: the VMM goes on, and got no stray reply meanwhile.
        let relay = Relay::spawn(link, "test-relay").unwrap();
        assert_eq!(get_features(&mut vmm), 7);
        relay.close();
        // The VMM's two, the probe and the paused link's own.
        assert_eq!(h.join().unwrap(), 4);
    }

    #[test]
    fn a_get_features_in_flight_is_answered_to_the_vmm_not_taken_for_the_probe() {
        let (mut vmm, relay_vmm) = UnixStream::pair().unwrap();
        let (relay_handler, handler) = UnixStream::pair().unwrap();
        let (tx, got) = std::sync::mpsc::channel();
        let h = slow_handler(handler, Duration::from_millis(100), tx);
        let relay = Relay::spawn(Link::new(relay_vmm, relay_handler), "test-relay").unwrap();
        write_frame(&mut vmm, &Frame::request(code::GET_FEATURES, Vec::new())).unwrap();
        // The handler has it and answers late: the probe goes after it.
        got.recv().unwrap();
        let link = relay.pause(Duration::from_secs(60)).unwrap();
        let r = read_frame(&mut vmm).unwrap().unwrap();
        assert!(r.is_reply() && r.code == code::GET_FEATURES);
        // Nothing else came to the VMM.
        vmm.set_nonblocking(true).unwrap();
        assert!(read_frame(&mut vmm).is_err());
        drop(link);
        assert_eq!(h.join().unwrap(), 2);
    }

    #[test]
    fn a_vmm_stopped_inside_a_message_delays_the_pause_which_gives_up() {
        let (mut vmm, relay, _h) = setup();
        // Half a header: the relay waits for the rest.
        vmm.write_all(&code::GET_FEATURES.to_ne_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let Err((relay, PauseError::Timeout(_))) = relay.pause(Duration::from_millis(200)) else {
            panic!("paused inside a message");
        };
        // The rest comes: relayed and answered, and a pause works again.
        vmm.write_all(&[VERSION as u8, 0, 0, 0, 0, 0, 0, 0])
            .unwrap();
        let r = read_frame(&mut vmm).unwrap().unwrap();
        assert_eq!(r.u64_at(0), Some(7));
        let link = relay.pause(Duration::from_secs(60)).unwrap();
        drop(link);
    }

    #[test]
    fn a_vmm_that_hangs_up_ends_the_relay_and_closes_the_handler() {
        let (vmm, relay, h) = setup();
        drop(vmm);
        // The relay closed the handler's side.
        assert_eq!(h.join().unwrap(), 0);
        assert!(matches!(
            relay.pause(Duration::from_secs(60)),
            Err((_, PauseError::Closed))
        ));
    }
}
