//! The front-end side of vhost-user's device-state transfer
//! (`SET_DEVICE_STATE_FD`, `CHECK_DEVICE_STATE`) for the migration tests:
//! saving and loading a device state through a pipe as QEMU does, and the
//! probes that show the daemon let go of a transfer (its file and its
//! thread).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost::vhost_user::{VhostUserFrontend, VhostUserProtocolFeatures};

use vhost::vhost_user::Frontend;

use crate::conn::Conn;
use crate::vmm::{TestVmm, VmmOptions};
use crate::{Error, Result};

/// A front-end connection the transfer's messages go through: a test VM's,
/// or a new one of a VM moving ([`TestVmm::move_to_via`]).
pub trait Link {
    /// One vhost-user exchange under the message timeout.
    fn exchange<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T>;
}

impl Link for TestVmm {
    fn exchange<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T> {
        self.vhost_call(what, f)
    }
}

impl Link for Conn {
    fn exchange<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> Result<T> {
        self.call(what, f)
    }
}

/// Whether `e` is the back-end's failure answer (not a broken connection).
fn refused(e: &Error) -> bool {
    matches!(
        e,
        Error::Vhost {
            source: vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::BackendInternalError),
            ..
        }
    )
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// Default options plus `DEVICE_STATE`, as a migrating QEMU negotiates.
pub fn migrating_vmm() -> VmmOptions {
    let mut o = VmmOptions::default();
    o.protocol_features |= VhostUserProtocolFeatures::DEVICE_STATE;
    o
}

/// A pipe: (read end, write end), both close-on-exec.
pub fn pipe() -> Result<(File, File)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(io("pipe2")(std::io::Error::last_os_error()));
    }
    // SAFETY: two new descriptors nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((File::from(r), File::from(w)))
}

/// The inode of a pipe (or any file), to find its other descriptors.
pub fn inode(f: &File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    f.metadata().map(|m| m.ino()).unwrap_or(0)
}

/// How many descriptors of this process (the in-process daemon's
/// included) refer to the pipe with inode `ino`.
pub fn pipe_descriptors(ino: u64) -> usize {
    let want = format!("pipe:[{ino}]");
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .map(|t| t.to_string_lossy() == want)
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Threads of this process whose name ends in `-state-save` or
/// `-state-load`: the daemon's transfer threads.
pub fn transfer_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .filter(|n| n.ends_with("-state-save") || n.ends_with("-state-load"))
                .collect()
        })
        .unwrap_or_default()
}

/// `SET_DEVICE_STATE_FD` with `file`; `Ok(false)`: the back-end refused.
pub fn set_state_fd(
    vmm: &mut impl Link,
    direction: VhostTransferStateDirection,
    file: File,
) -> Result<bool> {
    let fd = OwnedFd::from(file);
    match vmm.exchange("SET_DEVICE_STATE_FD", |fe| {
        fe.set_device_state_fd(direction, VhostTransferStatePhase::STOPPED, fd)
    }) {
        Ok(None) => Ok(true),
        Ok(Some(_)) => Err(Error::Backend(
            "the back-end answered with a file of its own".into(),
        )),
        Err(e) if refused(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `CHECK_DEVICE_STATE`: `Ok(true)` if the back-end reports success.
pub fn check(vmm: &mut impl Link) -> Result<bool> {
    match vmm.exchange("CHECK_DEVICE_STATE", |fe| fe.check_device_state()) {
        Ok(()) => Ok(true),
        Err(e) if refused(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Saves the device state as QEMU does: a pipe, `SET_DEVICE_STATE_FD`
/// `SAVE` with its write end, read to end of file, `CHECK_DEVICE_STATE`.
/// The device must be stopped.
pub fn save(vmm: &mut impl Link) -> Result<Vec<u8>> {
    let (mut r, w) = pipe()?;
    if !set_state_fd(vmm, VhostTransferStateDirection::SAVE, w)? {
        return Err(Error::Backend("SET_DEVICE_STATE_FD SAVE refused".into()));
    }
    let mut state = Vec::new();
    r.read_to_end(&mut state).map_err(io("reading the state"))?;
    if !check(vmm)? {
        return Err(Error::Backend(
            "CHECK_DEVICE_STATE after SAVE failed".into(),
        ));
    }
    Ok(state)
}

/// Loads `state` as QEMU does: a pipe, `SET_DEVICE_STATE_FD` `LOAD` with
/// its read end, write everything, close, `CHECK_DEVICE_STATE`. Returns
/// the check's verdict (`Ok(false)` also when the back-end refused the
/// transfer or closed the pipe before taking everything).
pub fn load(vmm: &mut impl Link, state: &[u8]) -> Result<bool> {
    let (r, mut w) = pipe()?;
    if !set_state_fd(vmm, VhostTransferStateDirection::LOAD, r)? {
        return Ok(false);
    }
    let wrote = w.write_all(state);
    drop(w);
    let checked = check(vmm)?;
    match wrote {
        Ok(()) => Ok(checked),
        // The back-end closed its end early: it refused the state.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe && !checked => Ok(false),
        Err(e) => Err(io("writing the state")(e)),
    }
}
