//! The VMM's side of dirty logging (spec 20.4): a log file shared with the
//! back-end (`SET_LOG_BASE` with `LOG_SHMFD`), mapped here too, whose bits
//! the test reads and clears as a migrating VMM does.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

/// Bytes of guest-physical address space one bit stands for.
pub const LOG_PAGE: u64 = 4096;

/// Bytes of log that cover guest-physical addresses below `end`.
pub fn log_bytes_for(end: u64) -> u64 {
    end.div_ceil(LOG_PAGE).div_ceil(8)
}

/// How the log's file is made (the hostile tests make bad ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFile {
    /// A memfd sealed against growing and shrinking, as QEMU's
    /// `vhost_log_alloc` makes it.
    Sealed,
    /// A memfd without seals.
    Unsealed,
}

/// A dirty log the test VMM owns: a memfd of `len` bytes mapped here.
#[derive(Debug)]
pub struct DirtyLogFile {
    file: File,
    map: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the value and only accessed atomically.
unsafe impl Send for DirtyLogFile {}
// SAFETY: as for `Send`.
unsafe impl Sync for DirtyLogFile {}

impl DirtyLogFile {
    /// A log of `len` bytes (at least 1) in a file of `file_len` bytes.
    pub fn with_file_len(len: usize, file_len: u64, kind: LogFile) -> Result<Self> {
        // SAFETY: a valid NUL-terminated name; the call retains nothing.
        let fd = unsafe {
            libc::memfd_create(
                c"vhost-log".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: a new descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(file_len)
            .map_err(|e| Error::io("size the log", e))?;
        if kind == LogFile::Sealed {
            // SAFETY: F_ADD_SEALS on our descriptor; no memory passed.
            let r = unsafe {
                libc::fcntl(
                    fd,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
                )
            };
            if r != 0 {
                return Err(Error::last_os("seal the log"));
            }
        }
        // Our own view: the bytes the file has (none past its end).
        let view = usize::try_from(file_len).unwrap_or(usize::MAX).min(len);
        let map = if view == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: a new shared mapping of our memfd, inside the file.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    view,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::last_os("map the log"));
            }
            p.cast()
        };
        Ok(DirtyLogFile {
            file,
            map,
            len: view,
        })
    }

    /// A sealed log of `len` bytes.
    pub fn new(len: usize) -> Result<Self> {
        Self::with_file_len(len, len as u64, LogFile::Sealed)
    }

    /// The log's file (for `SET_LOG_BASE`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The log's length in bytes (as mapped here).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the log has no bytes here.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn byte(&self, i: usize) -> &AtomicU8 {
        assert!(i < self.len, "log byte {i} of {}", self.len);
        // SAFETY: `i < len`, inside our mapping, which lives as long as
        // `self`; the back-end sets bits concurrently, so every access is
        // atomic.
        unsafe { AtomicU8::from_ptr(self.map.add(i)) }
    }

    /// The guest-physical page numbers marked, clearing their bits as a
    /// VMM's log sync does (an atomic exchange per byte).
    pub fn take(&self) -> BTreeSet<u64> {
        self.collect(|b| b.swap(0, Ordering::AcqRel))
    }

    /// The page numbers marked, leaving them marked.
    pub fn peek(&self) -> BTreeSet<u64> {
        self.collect(|b| b.load(Ordering::Acquire))
    }

    fn collect(&self, f: impl Fn(&AtomicU8) -> u8) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        for i in 0..self.len {
            let v = f(self.byte(i));
            for bit in 0..8 {
                if v & (1 << bit) != 0 {
                    out.insert(i as u64 * 8 + bit);
                }
            }
        }
        out
    }

    /// The raw descriptor (for `VhostUserDirtyLogRegion`).
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

impl Drop for DirtyLogFile {
    fn drop(&mut self) {
        if !self.map.is_null() {
            // SAFETY: the mapping made in `with_file_len`, unmapped once.
            unsafe { libc::munmap(self.map.cast(), self.len) };
        }
    }
}

/// The page numbers of `[gpa, gpa + len)`.
pub fn pages_of(gpa: u64, len: u64) -> BTreeSet<u64> {
    if len == 0 {
        return BTreeSet::new();
    }
    (gpa / LOG_PAGE..=(gpa + len - 1) / LOG_PAGE).collect()
}
