//! Thread-per-connection service with a cap, shared by the management
//! socket and the metrics listener: each accepted connection runs on its
//! own thread, at most `max` at once, and all are joined at shutdown
//! ([`accept_loop`] is the listeners' whole accepting side).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::warn;

/// The connection threads of one listener.
pub struct ConnPool {
    name: &'static str,
    max: usize,
    active: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl ConnPool {
    /// A pool whose threads are named `name`, with at most `max` at once.
    pub fn new(name: &'static str, max: usize) -> Self {
        ConnPool {
            name,
            max,
            active: Arc::new(AtomicUsize::new(0)),
            threads: Vec::new(),
        }
    }

    /// Whether `max` connections are being served (the caller refuses the
    /// next one).
    pub fn full(&mut self) -> bool {
        self.threads.retain(|t| !t.is_finished());
        self.active.load(Ordering::Acquire) >= self.max
    }

    /// Serves one connection: `serve` runs on a new thread and counts
    /// against the cap until it returns.
    pub fn spawn(&mut self, serve: impl FnOnce() + Send + 'static) {
        self.active.fetch_add(1, Ordering::AcqRel);
        let active = self.active.clone();
        let spawned = thread::Builder::new()
            .name(self.name.into())
            .spawn(move || {
                serve();
                active.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(t) => self.threads.push(t),
            Err(e) => {
                self.active.fetch_sub(1, Ordering::AcqRel);
                warn!("{}: cannot spawn a connection thread: {e}", self.name);
            }
        }
    }

    /// Waits for every connection thread.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A connected stream of a listener ([`TcpStream`], [`UnixStream`]).
pub trait Conn: Read + Write + Send + 'static {
    /// Sets the socket's read timeout.
    fn read_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// Sets the socket's write timeout.
    fn write_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// Shuts the socket down for writing.
    fn shutdown_write(&self) -> std::io::Result<()>;
}

macro_rules! conn {
    ($t:ty) => {
        impl Conn for $t {
            fn read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
                self.set_read_timeout(t)
            }
            fn write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
                self.set_write_timeout(t)
            }
            fn shutdown_write(&self) -> std::io::Result<()> {
                self.shutdown(Shutdown::Write)
            }
        }
    };
}
conn!(TcpStream);
conn!(UnixStream);

/// Serves the connections of `incoming` until `stop` is set (the stopper
/// then connects once to wake the loop), then waits for them. `admit`
/// may turn a connection away (it answers it itself); beyond `max`
/// connections at once the next gets `busy` and is closed; every other
/// runs `serve` on a thread named `thread`. `what` names the listener in
/// the log.
pub fn accept_loop<S: Conn>(
    (what, thread, max): (&str, &'static str, usize),
    incoming: impl Iterator<Item = std::io::Result<S>>,
    stop: &AtomicBool,
    mut admit: impl FnMut(&mut S) -> bool,
    busy: &[u8],
    serve: impl FnOnce(S) + Clone + Send + 'static,
) {
    let mut pool = ConnPool::new(thread, max);
    for stream in incoming {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                warn!("{what}: accept failed: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if !admit(&mut stream) {
            continue;
        }
        if pool.full() {
            let _ = stream.write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(busy);
            continue;
        }
        let serve = serve.clone();
        pool.spawn(move || serve(stream));
    }
    pool.join();
}

/// Closes a connection whose peer may still be sending: stops writing,
/// then reads and drops what arrives for a moment, so that the peer gets
/// the answer and an orderly end instead of a reset.
pub fn linger_close(stream: &mut impl Conn) {
    let _ = stream.shutdown_write();
    let _ = stream.read_timeout(Some(Duration::from_millis(100)));
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut sink = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn caps_and_releases() {
        let mut pool = ConnPool::new("test-conn", 2);
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for _ in 0..2 {
            let rx = rx.clone();
            pool.spawn(move || {
                let _ = rx.lock().map(|r| r.recv());
            });
        }
        assert!(pool.full());
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pool.full() {
            assert!(std::time::Instant::now() < deadline);
            thread::yield_now();
        }
        pool.join();
    }
}
