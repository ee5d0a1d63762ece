//! Starting this daemon's successor on `SIGUSR2` (what `systemctl reload`
//! sends, `dist/vhost-user-rdma.service`): the binary now at the path this
//! one was started from, with the same arguments and `--take-over`. It
//! runs in the same service (a child of this process), takes every VM
//! over through the hand-over socket and tells the service manager it is
//! the main process now; this process then exits. If it fails, it exits
//! and this daemon serves on.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};

use log::{info, warn};

/// How to start a successor, as this process was started.
#[derive(Debug, Clone)]
pub struct Successor {
    exe: PathBuf,
    args: Vec<OsString>,
}

impl Successor {
    /// Remembers this process's binary and arguments (call it first thing:
    /// once the binary is replaced on disk, `/proc/self/exe` names the
    /// deleted one).
    pub fn of_this_process() -> io::Result<Successor> {
        let exe = std::env::current_exe()?;
        let args = std::env::args_os()
            .skip(1)
            .filter(|a| a != "--take-over")
            .collect();
        Ok(Successor { exe, args })
    }

    /// Starts the successor; a thread reports how it ended if it ends
    /// while this process still runs (the hand-over failed).
    pub fn start(&self) -> io::Result<u32> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args).arg("--take-over");
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions (close_range, fcntl).
        unsafe {
            cmd.pre_exec(|| {
                close_on_exec_from(3);
                Ok(())
            });
        }
        let mut child: Child = cmd.spawn()?;
        let pid = child.id();
        info!("started the successor, pid {pid}: {}", self.exe.display());
        std::thread::Builder::new()
            .name("successor".into())
            .spawn(move || match child.wait() {
                Ok(s) => warn!("the successor (pid {pid}) ended ({s}): this daemon serves on"),
                Err(e) => warn!("the successor (pid {pid}): {e}"),
            })?;
        Ok(pid)
    }
}

/// Marks every descriptor from `first` on close-on-exec: the successor
/// must not inherit guest RAM, eventfds or connections this process holds
/// (it gets what it needs through the hand-over socket, and a descriptor
/// it kept by accident would keep a VM's memory allocated after the VM).
fn close_on_exec_from(first: u32) {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only changes flags of
    // this process's descriptors.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Before Linux 5.11: each descriptor up to the limit.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out parameter.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(1 << 20)
    } else {
        1024
    };
    for fd in u64::from(first)..max {
        let Ok(fd) = libc::c_int::try_from(fd) else {
            break;
        };
        // SAFETY: F_SETFD on a descriptor number; a closed one fails with
        // EBADF and nothing else happens.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}
