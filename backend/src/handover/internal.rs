//! The connection between the relay and the VM's vhost-user handler in
//! this process. vhost-user-backend serves only a connection it accepts
//! or makes itself, so the handler connects to a socket in a directory
//! only this user may enter, and the connection is taken only from this
//! process.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use log::warn;

use crate::local_socket::peer_cred;
use thiserror::Error;

/// Errors connecting the relay to a handler.
#[derive(Debug, Error)]
pub enum InternalError {
    /// The socket could not be created or accepted on.
    #[error("the handler's socket: {0}")]
    Io(#[from] io::Error),
    /// The handler could not connect.
    #[error("the handler cannot connect: {0}")]
    Connect(String),
}

/// A directory (mode 0700) for the handlers' sockets, removed on drop.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates a new directory under the system's temporary directory.
    pub fn create() -> io::Result<PrivateDir> {
        let base = std::env::temp_dir();
        let mut n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for _ in 0..16 {
            let path = base.join(format!("vhost-user-rdma.{}.{n:08x}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(PrivateDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => n = n.wrapping_add(1),
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free name for the handlers' directory",
        ))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Has the handler connect (`start_client` with a socket path) and
/// returns this side of its connection.
pub fn connect_handler<E: std::fmt::Display>(
    dir: &PrivateDir,
    name: &str,
    start_client: impl FnOnce(&str) -> Result<(), E>,
) -> Result<UnixStream, InternalError> {
    let path = dir.path().join(name);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let text = path.to_string_lossy().into_owned();
    let started = start_client(&text);
    let _ = std::fs::remove_file(&path);
    started.map_err(|e| InternalError::Connect(e.to_string()))?;
    let me = std::process::id();
    loop {
        let (stream, _) = listener.accept()?;
        if peer_cred(&stream).is_some_and(|c| u32::try_from(c.pid) == Ok(me)) {
            return Ok(stream);
        }
        warn!("refused a connection to a handler's socket from another process");
    }
}
