//! The frontend side of VIRTIO shared memory for the test VMM: the window a
//! real VMM would expose as a PCI BAR, and the handler of the back-end's
//! `SHMEM_MAP` / `SHMEM_UNMAP` requests.
//!
//! The window enforces QEMU 11.1's rules so that the daemon is tested
//! against them: a map is accepted only while the device is started, the
//! region size must be a power of two, mappings must lie inside the region
//! and must not overlap, and a device reset drops every mapping. A request
//! that breaks a rule is refused and recorded as a violation (QEMU would
//! crash or fail); tests assert there are none.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{FrontendReqHandler, HandlerResult, VhostUserFrontendReqHandler};

use crate::error::{Error, Result};

/// One shared memory region as the guest sees it: a fixed range of this
/// process's address space into which the back-end's mappings are placed.
#[derive(Debug)]
pub struct ShmemWindow {
    base: NonNull<u8>,
    len: usize,
    state: Mutex<WindowState>,
    started: AtomicBool,
    refuse: bool,
    maps: AtomicU64,
    requests: AtomicU64,
}

#[derive(Debug, Default)]
struct WindowState {
    /// Live mappings: (offset, length).
    mapped: Vec<(u64, u64)>,
    violations: Vec<String>,
}

// SAFETY: the window is a process-wide mapping that lives as long as the
// value; it is only handed out as a raw pointer (the guest's view).
unsafe impl Send for ShmemWindow {}
// SAFETY: as above; the bookkeeping is behind a mutex.
unsafe impl Sync for ShmemWindow {}

/// Replaces `[addr, addr + len)` with fresh zero pages that belong to
/// nobody: what the guest sees where nothing is mapped.
///
/// # Safety
/// The range must lie inside a mapping this process owns exclusively (the
/// window), and nothing may hold references into it.
unsafe fn blank(addr: *mut u8, len: usize) -> bool {
    // SAFETY: by the caller's contract MAP_FIXED only replaces pages of the
    // window.
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

impl ShmemWindow {
    /// Reserves a window of `len` bytes (the region size the back-end
    /// announced). With `refuse`, every map request is refused, as by a VMM
    /// that offers the protocol feature but cannot map.
    pub fn new(len: u64, refuse: bool) -> Result<Arc<Self>> {
        if !len.is_power_of_two() {
            return Err(Error::Backend(format!(
                "shared memory region of {len:#x} bytes: not a power of two (QEMU refuses it)"
            )));
        }
        let len = usize::try_from(len).map_err(|_| Error::Backend("region size".into()))?;
        // SAFETY: a fresh anonymous mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "reserve shared memory window",
                std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Backend("mmap returned null".into()))?;
        Ok(Arc::new(ShmemWindow {
            base,
            len,
            state: Mutex::new(WindowState::default()),
            started: AtomicBool::new(false),
            refuse,
            maps: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }))
    }

    /// Start of the window in this process (the guest's BAR mapping).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Size of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Atomic (acquire) load of the 32-bit word at byte `off` of the
    /// region, as the guest would read it; `None` outside the region.
    pub fn load_u32(&self, off: usize) -> Option<u32> {
        self.word(off).map(|w| w.load(Ordering::Acquire))
    }

    /// Atomic (release) store of a 32-bit word at byte `off`, as the guest
    /// would write it; false outside the region.
    pub fn store_u32(&self, off: usize, value: u32) -> bool {
        self.word(off)
            .map(|w| w.store(value, Ordering::Release))
            .is_some()
    }

    fn word(&self, off: usize) -> Option<&std::sync::atomic::AtomicU32> {
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: the word lies inside the window, which is valid for the
        // lifetime of `self` and page aligned; it is shared with the
        // back-end, so it is only ever accessed atomically.
        Some(unsafe {
            &*self
                .base
                .as_ptr()
                .add(off)
                .cast::<std::sync::atomic::AtomicU32>()
        })
    }

    /// Number of successful `SHMEM_MAP` requests so far.
    pub fn map_count(&self) -> u64 {
        self.maps.load(Ordering::Acquire)
    }

    /// Number of `SHMEM_MAP` requests received, refused ones included.
    pub fn map_requests(&self) -> u64 {
        self.requests.load(Ordering::Acquire)
    }

    /// Live mappings (offset, length).
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        self.lock().mapped.clone()
    }

    /// Rule violations the back-end committed.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device was started (queues set up) or stopped.
    pub fn set_started(&self, started: bool) {
        self.started.store(started, Ordering::Release);
    }

    /// A device reset: every mapping disappears (QEMU's behaviour).
    pub fn reset(&self) {
        let mut st = self.lock();
        for (off, len) in std::mem::take(&mut st.mapped) {
            // SAFETY: the range was checked to lie inside the window when it
            // was mapped; the window is ours.
            unsafe { blank(self.base.as_ptr().add(off as usize), len as usize) };
        }
    }

    fn refuse(&self, st: &mut WindowState, why: String) -> HandlerResult<u64> {
        st.violations.push(why.clone());
        Err(std::io::Error::other(why))
    }

    fn map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        self.requests.fetch_add(1, Ordering::AcqRel);
        let mut st = self.lock();
        let (shmid, off, len, fd_off) = (req.shmid, req.shm_offset, req.len, req.fd_offset);
        if !self.started.load(Ordering::Acquire) {
            return self.refuse(
                &mut st,
                format!("SHMEM_MAP before the device was started (offset {off:#x})"),
            );
        }
        if shmid != 0 {
            return self.refuse(&mut st, format!("SHMEM_MAP of unknown region {shmid}"));
        }
        let page = 4096;
        if off % page != 0 || len % page != 0 || fd_off % page != 0 || len == 0 {
            return self.refuse(
                &mut st,
                format!("SHMEM_MAP not page aligned: {off:#x}+{len:#x}"),
            );
        }
        if off.checked_add(len).is_none_or(|end| end > self.len as u64) {
            return self.refuse(
                &mut st,
                format!("SHMEM_MAP outside the region: {off:#x}+{len:#x}"),
            );
        }
        if st.mapped.iter().any(|&(o, l)| off < o + l && o < off + len) {
            return self.refuse(
                &mut st,
                format!("SHMEM_MAP overlaps a mapping: {off:#x}+{len:#x}"),
            );
        }
        if self.refuse {
            return Err(std::io::Error::other("this VMM refuses shared memory maps"));
        }
        let Ok(fd_off) = libc::off_t::try_from(fd_off) else {
            return self.refuse(
                &mut st,
                format!("SHMEM_MAP file offset {fd_off:#x} too large"),
            );
        };
        let prot = if req.flags & VhostUserMMapFlags::WRITABLE.bits() != 0 {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: the target range lies inside the window (checked above),
        // which this process owns; MAP_FIXED replaces only those pages.
        let p = unsafe {
            libc::mmap(
                self.base.as_ptr().add(off as usize).cast(),
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                fd_off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        st.mapped.push((off, len));
        self.maps.fetch_add(1, Ordering::AcqRel);
        Ok(0)
    }

    fn unmap(&self, req: &VhostUserMMap) -> HandlerResult<u64> {
        let mut st = self.lock();
        let (off, len) = (req.shm_offset, req.len);
        let Some(i) = st.mapped.iter().position(|&m| m == (off, len)) else {
            return self.refuse(
                &mut st,
                format!("SHMEM_UNMAP of nothing mapped: {off:#x}+{len:#x}"),
            );
        };
        st.mapped.swap_remove(i);
        // SAFETY: the range was mapped inside the window.
        unsafe { blank(self.base.as_ptr().add(off as usize), len as usize) };
        Ok(0)
    }
}

impl Drop for ShmemWindow {
    fn drop(&mut self) {
        // SAFETY: unmaps the window created in `new`; the guest view (raw
        // pointers) must not be used after the VMM is gone.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Handles the back-end's requests for one window.
struct Handler {
    window: Arc<ShmemWindow>,
}

impl VhostUserFrontendReqHandler for Handler {
    fn shmem_map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        self.window.map(req, fd)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> HandlerResult<u64> {
        self.window.unmap(req)
    }
}

/// The thread serving the back-end request channel.
#[derive(Debug)]
pub struct BackendChannel {
    /// Our duplicate of the back-end's end, to shut the channel down.
    peer: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl BackendChannel {
    /// Creates the channel and its serving thread; returns it with the fd
    /// to send in `SET_BACKEND_REQ_FD`.
    pub fn spawn(window: Arc<ShmemWindow>, reply_ack: bool) -> Result<Self> {
        let mut h = FrontendReqHandler::new(Arc::new(Handler { window }))
            .map_err(|e| Error::Backend(format!("backend channel: {e}")))?;
        h.set_reply_ack_flag(reply_ack);
        // SAFETY: the handler owns this fd and keeps it open while it lives;
        // it is duplicated into an OwnedFd right away.
        let peer = unsafe { BorrowedFd::borrow_raw(h.get_tx_raw_fd()) }
            .try_clone_to_owned()
            .map_err(|e| Error::io("dup backend channel", e))?;
        let thread = std::thread::Builder::new()
            .name("vmm-backend-req".into())
            .spawn(move || {
                // A refused request was answered with a failure; only a
                // broken channel ends the loop.
                while let Ok(_) | Err(vhost::vhost_user::Error::ReqHandlerError(_)) =
                    h.handle_request()
                {}
            })
            .map_err(|e| Error::io("spawn backend channel", e))?;
        Ok(BackendChannel {
            peer,
            thread: Some(thread),
        })
    }

    /// The back-end's end of the channel.
    pub fn peer_fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.peer.as_fd()
    }
}

impl Drop for BackendChannel {
    fn drop(&mut self) {
        // Shutting down the back-end's end makes our blocked receive see
        // end-of-file, whatever the back-end does with its copy.
        // SAFETY: shutdown of a socket fd we own; no memory effects.
        unsafe { libc::shutdown(self.peer.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
