//! Thread-per-connection service with a cap, shared by the management
//! socket and the metrics listener: each accepted connection runs on its
//! own thread, at most `max` at once, and all are joined at shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

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
