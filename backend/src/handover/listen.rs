//! The hand-over socket: a successor daemon connects here to take every
//! VM over (mode 0600, this user or root only, one hand-over at a time).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use log::{info, warn};
use thiserror::Error;

use super::give::Given;
use super::internal::PrivateDir;
use crate::local_socket::{bind, peer_allowed, peer_cred, BindError};

/// Errors setting up the hand-over socket.
#[derive(Debug, Error)]
pub enum HandoverError {
    /// The socket could not be bound.
    #[error("hand-over socket: {0}")]
    Socket(#[from] BindError),
    /// Its thread could not start.
    #[error("cannot start the hand-over thread: {0}")]
    Spawn(std::io::Error),
}

/// How long either daemon waits for the other to make progress.
pub const STALL: Duration = Duration::from_secs(10);

/// The running hand-over socket.
pub struct HandoverServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// A second descriptor of the listening socket, to wake `accept()`.
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl HandoverServer {
    /// Serves hand-overs on `path`, each run by `give`. After one went
    /// through, the process exits at once: the successor serves every VM,
    /// and nothing here may touch them any more (`dir`, the handlers'
    /// directory, is removed first).
    pub fn start(
        path: &Path,
        give: Giver,
        dir: Arc<PrivateDir>,
    ) -> Result<HandoverServer, HandoverError> {
        Self::adopt(path, bind(path)?, give, dir)
    }

    /// [`HandoverServer::start`] on `listener`, bound at `path` by the
    /// daemon this one took over from.
    pub fn adopt(
        path: &Path,
        listener: UnixListener,
        give: Giver,
        dir: Arc<PrivateDir>,
    ) -> Result<HandoverServer, HandoverError> {
        let wake = listener.try_clone().map_err(HandoverError::Spawn)?.into();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::Builder::new()
            .name("handover".into())
            .spawn(move || serve(&listener, &give, &dir, &s))
            .map_err(HandoverError::Spawn)?;
        Ok(HandoverServer {
            path: path.into(),
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving and removes the socket.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // SAFETY: a valid descriptor this server owns; shutdown(2) changes
        // no memory. It wakes the thread's accept() (Linux fails it).
        let _ = unsafe { libc::shutdown(self.wake.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs one hand-over on a successor's connection.
/// It gets the hand-over socket, which goes to the successor too.
pub type Giver = Box<dyn Fn(&mut UnixStream, BorrowedFd) -> Given + Send>;

fn serve(listener: &UnixListener, give: &Giver, dir: &PrivateDir, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("hand-over socket: {e}");
                continue;
            }
        };
        // A successor that stops making progress must not keep the VMs
        // stopped: the hand-over fails and they resume.
        let _ = s.set_read_timeout(Some(STALL));
        let _ = s.set_write_timeout(Some(STALL));
        if !peer_allowed(&s) {
            warn!("hand-over socket: refused a connection from another user");
            continue;
        }
        info!("a successor asks for the VMs");
        match give(&mut s, listener.as_fd()) {
            Given::Committed(held) => {
                let _ = std::fs::remove_dir_all(dir.path());
                info!("the successor serves every VM; exiting");
                // Under systemd, the successor is the service from now on.
                if let Some(pid) = peer_cred(&s)
                    .and_then(|c| u32::try_from(c.pid).ok())
                    .filter(|&p| p > 0)
                {
                    crate::notify::main_pid_is(pid);
                }
                // Without running a destructor: `held` stays open to the
                // end, and nothing of the VMs is released here.
                let _held = held;
                std::process::exit(0);
            }
            Given::Refused(why) => warn!("hand-over refused, serving on: {why}"),
        }
    }
}
