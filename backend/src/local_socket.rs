//! Unix sockets for the local operator and the daemon's own successor (the
//! management and hand-over sockets): bound with mode 0600, a stale socket
//! replaced, and the peer's credentials checked.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Errors binding a socket.
#[derive(Debug, Error)]
pub enum BindError {
    /// Another process serves the socket already.
    #[error("{0} is in use by another process")]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// The socket could not be created.
    #[error("cannot create {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Binds `path` with mode 0600, replacing a stale socket (one nobody
/// accepts on).
pub fn bind(path: &Path) -> Result<UnixListener, BindError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.into()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse(path.into()));
        }
        let _ = std::fs::remove_file(path);
    }
    let bind_err = |source| BindError::Bind {
        path: path.into(),
        source,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(bind_err(e));
    }
    Ok(listener)
}

/// The peer credentials of a connected Unix socket.
pub fn peer_cred(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid, exclusively borrowed out
    // parameters of the size given; the fd is the open socket `stream`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// Whether the peer of `stream` runs as the daemon's user or root. The
/// socket's mode already keeps others out; this also covers a connection
/// made in the moment between creating the socket and restricting its mode.
pub fn peer_allowed(stream: &UnixStream) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    peer_cred(stream).is_some_and(|c| c.uid == me || c.uid == 0)
}
