//! The management socket: a Unix stream socket (mode 0600) speaking a small
//! JSON API, one request per line and one response per line, several
//! requests per connection ([`api`] has the commands, [`client`] the client
//! side that `vhost-user-rdma ctl` uses).
//!
//! Only the daemon's user and root may connect (mode 0600, and the peer's
//! credentials are checked). The socket is for the local operator, but its
//! input is still checked: a
//! request line longer than [`MAX_REQUEST`] bytes is answered with an error
//! and the connection is closed, at most [`MAX_CONNECTIONS`] connections
//! are served at once (more are told so and closed), and a connection idle
//! for [`IDLE_TIMEOUT`] is closed.

pub mod api;
pub mod client;
pub mod ctl;

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, warn};
use thiserror::Error;

use crate::conn_pool::{self, linger_close};
use crate::local_socket::{bind, peer_allowed, BindError};
use crate::view::DaemonView;

/// Longest request line in bytes (without the newline).
pub const MAX_REQUEST: usize = 64 * 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// A connection without a complete request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often blocked connection threads look at the stop flag.
const POLL: Duration = Duration::from_millis(200);

/// Errors setting up the management socket.
#[derive(Debug, Error)]
pub enum MgmtError {
    /// The socket could not be set up.
    #[error("management socket: {0}")]
    Socket(#[from] BindError),
    /// The accepting thread could not be spawned.
    #[error("cannot spawn the management thread: {0}")]
    Spawn(std::io::Error),
}

/// A running management socket server.
pub struct MgmtServer {
    path: PathBuf,
    /// A second descriptor of the listening socket, for a hand-over.
    listener: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MgmtServer {
    /// Creates the socket at `path` and serves `view` on it.
    pub fn start(path: &Path, view: DaemonView) -> Result<MgmtServer, MgmtError> {
        Self::adopt(path, bind(path)?, view)
    }

    /// Serves `view` on `listener`, bound at `path` (by the daemon this one
    /// took over from).
    pub fn adopt(
        path: &Path,
        listener: UnixListener,
        view: DaemonView,
    ) -> Result<MgmtServer, MgmtError> {
        let dup = listener.try_clone().map_err(MgmtError::Spawn)?.into();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::Builder::new()
            .name("mgmt".into())
            .spawn(move || accept_loop(listener, view, s))
            .map_err(|e| {
                let _ = std::fs::remove_file(path);
                MgmtError::Spawn(e)
            })?;
        Ok(MgmtServer {
            path: path.into(),
            listener: dup,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listening socket.
    pub fn listener(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Stops serving, waits for the connection threads and removes the
    /// socket.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accepting thread; it then sees the stop flag.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: UnixListener, view: DaemonView, stop: Arc<AtomicBool>) {
    let s = stop.clone();
    conn_pool::accept_loop(
        ("management socket", "mgmt-conn", MAX_CONNECTIONS),
        listener.incoming(),
        &stop,
        |stream| {
            if peer_allowed(stream) {
                return true;
            }
            warn!("management socket: refused a connection from another user");
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(b"{\"ok\":false,\"error\":\"permission denied\"}\n");
            false
        },
        b"{\"ok\":false,\"error\":\"too many connections\"}\n",
        move |stream| {
            if let Err(e) = serve_conn(stream, &view, &s) {
                debug!("management connection ended: {e}");
            }
        },
    );
}

/// Answers an oversized request with an error and closes the connection
/// (the rest of the request cannot be told from the next one).
fn refuse_oversized(stream: &mut UnixStream) -> std::io::Result<()> {
    let reply = format!("{{\"ok\":false,\"error\":\"request longer than {MAX_REQUEST} bytes\"}}\n");
    stream.write_all(reply.as_bytes())?;
    linger_close(stream);
    Ok(())
}

/// Serves requests on one connection until EOF, an oversized request, the
/// idle timeout or the daemon's stop.
fn serve_conn(mut stream: UnixStream, view: &DaemonView, stop: &AtomicBool) -> std::io::Result<()> {
    stream.set_read_timeout(Some(POLL))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let mut last = Instant::now();
    loop {
        // Answer every complete line in the buffer.
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            if nl > MAX_REQUEST {
                return refuse_oversized(&mut stream);
            }
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = line.get(..nl).unwrap_or(&[]);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let mut reply = api::handle_line(view, line);
            reply.push('\n');
            stream.write_all(reply.as_bytes())?;
            last = Instant::now();
        }
        if buf.len() > MAX_REQUEST {
            return refuse_oversized(&mut stream);
        }
        if stop.load(Ordering::Acquire) || last.elapsed() > IDLE_TIMEOUT {
            return Ok(());
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or(&[])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
