//! The client side of the management socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

/// Longest response accepted, in bytes.
pub const MAX_RESPONSE: u64 = 64 << 20;

/// Errors talking to the management socket.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot connect to the management socket {path}: {source} (is the daemon running with --mgmt-socket?)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Sending or receiving failed.
    #[error("management socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon closed the connection without an answer.
    #[error("the daemon closed the connection without answering")]
    NoAnswer,
    /// The answer is not JSON.
    #[error("the daemon's answer is not JSON: {0}")]
    BadAnswer(serde_json::Error),
}

/// A connection to the management socket.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to `path`; every request waits at most `timeout` for its
    /// answer.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, ClientError> {
        let s = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let writer = s.try_clone()?;
        Ok(Client {
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends one request line (a newline is appended) and returns the
    /// answer line, parsed.
    pub fn request_line(&mut self, line: &str) -> Result<Value, ClientError> {
        let mut msg = line.trim_end_matches(['\r', '\n']).to_string();
        msg.push('\n');
        // The daemon may have answered and closed already (a refused
        // connection): its answer is still readable after a failed write.
        let sent = self.writer.write_all(msg.as_bytes());
        let mut answer = String::new();
        let read = (&mut self.reader).take(MAX_RESPONSE).read_line(&mut answer);
        match (sent, read) {
            (_, Ok(n)) if n > 0 => {}
            (Err(e), _) | (Ok(()), Err(e)) => return Err(e.into()),
            (Ok(()), Ok(_)) => return Err(ClientError::NoAnswer),
        }
        serde_json::from_str(&answer).map_err(ClientError::BadAnswer)
    }

    /// Sends `request` and returns the answer.
    pub fn request(&mut self, request: &Value) -> Result<Value, ClientError> {
        self.request_line(&request.to_string())
    }
}
