//! Telling the service manager (systemd's `Type=notify`) that the daemon
//! is ready, and which process is the daemon after a live upgrade: one
//! datagram to `$NOTIFY_SOCKET`, as `sd_notify(3)` sends it. Without that
//! variable (not started by systemd) nothing is sent.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use log::warn;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// How long [`main_pid_is`] waits for the manager to confirm.
const BARRIER_WAIT: Duration = Duration::from_secs(5);

/// A datagram socket connected to `$NOTIFY_SOCKET`; `None` without it.
fn connect() -> Option<std::io::Result<UnixDatagram>> {
    let path = std::env::var_os("NOTIFY_SOCKET")?;
    Some(UnixDatagram::unbound().and_then(|s| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                s.connect_addr(&addr)?;
            }
            None => s.connect(&path)?,
        }
        Ok(s)
    }))
}

/// Sends `state` (newline-separated `KEY=value` assignments).
fn send(state: &str) {
    let sent = match connect() {
        None => return,
        Some(s) => s.and_then(|s| s.send(state.as_bytes())),
    };
    if let Err(e) = sent {
        warn!("cannot notify the service manager: {e}");
    }
}

/// After a live upgrade's commit, in the process that hands the VMs over:
/// `pid`, the successor, is the service's main process from now on. The
/// successor says so itself once it serves, but this process exits first,
/// and a manager that saw its main process exit before hearing of another
/// would take the service for stopped and kill the successor with it. So
/// this says it, then waits until the manager has read it (`BARRIER=1`:
/// the manager closes the pipe end sent along once it has processed every
/// message before; at most [`BARRIER_WAIT`]).
pub fn main_pid_is(pid: u32) {
    let Some(sock) = connect() else {
        return;
    };
    let done = sock.and_then(|s| {
        s.send(format!("MAINPID={pid}").as_bytes())?;
        let mut ends = [0; 2];
        // SAFETY: `ends` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both are open descriptors owned by
        // nothing else.
        let (read, write) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        s.send_with_fds(&[&b"BARRIER=1"[..]], &[write.as_raw_fd()])
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        drop(write);
        let mut pfd = libc::pollfd {
            fd: read.as_fd().as_raw_fd(),
            events: 0,
            revents: 0,
        };
        let ms = libc::c_int::try_from(BARRIER_WAIT.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 1 && pfd.revents & libc::POLLHUP != 0 {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the manager did not confirm MAINPID",
            ))
        }
    });
    if let Err(e) = done {
        warn!("cannot tell the service manager that the successor (pid {pid}) is the main process: {e}");
    }
}

/// The daemon serves; `main_pid`: this process is the daemon now (a
/// successor that took the VMs over from the service's main process).
pub fn ready(main_pid: bool) {
    if main_pid {
        send(&format!("MAINPID={}\nREADY=1", std::process::id()));
    } else {
        send("READY=1");
    }
}

/// The daemon stops.
pub fn stopping() {
    send("STOPPING=1");
}
