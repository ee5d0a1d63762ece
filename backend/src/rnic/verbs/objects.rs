//! Owned host verbs objects: each wraps the pointer libibverbs returned and
//! destroys the object when dropped, so that no path (an error half-way
//! through a creation, a VM reset, the daemon stopping) can leak one.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use log::warn;
use rdma_sys::{
    ibv_ack_cq_events, ibv_ah, ibv_comp_channel, ibv_cq, ibv_dealloc_pd, ibv_dereg_mr,
    ibv_destroy_ah, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_qp, ibv_destroy_srq,
    ibv_get_cq_event, ibv_mr, ibv_pd, ibv_qp, ibv_srq,
};

use crate::memory::window::Window;

/// The errno of a verb that failed: the value it returned, or `errno` when
/// it returned a null pointer or -1 (libibverbs does both).
pub fn errno_of(rc: libc::c_int) -> i32 {
    if rc > 0 {
        rc
    } else {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    }
}

macro_rules! host_object {
    ($(#[$doc:meta])* $name:ident, $raw:ty, $destroy:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(NonNull<$raw>);

        // SAFETY: libibverbs objects may be used and destroyed from any
        // thread (the library locks what they share); the wrapper is the
        // only owner of the pointer.
        unsafe impl Send for $name {}
        // SAFETY: as above; `&self` only hands the pointer to verbs.
        unsafe impl Sync for $name {}

        impl $name {
            /// Takes ownership of `raw`, the result of the verb that
            /// created it; `None` (with errno set) if that failed.
            pub fn from_raw(raw: *mut $raw) -> Option<Self> {
                NonNull::new(raw).map($name)
            }

            /// The pointer, for verbs.
            pub fn as_ptr(&self) -> *mut $raw {
                self.0.as_ptr()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the object was created by libibverbs, is owned by
                // this value only and is destroyed once, here.
                let rc = unsafe { $destroy(self.0.as_ptr()) };
                if rc != 0 {
                    warn!(
                        concat!(stringify!($destroy), " failed: {}"),
                        io::Error::from_raw_os_error(errno_of(rc))
                    );
                }
            }
        }
    };
}

host_object!(
    /// A host protection domain.
    Pd,
    ibv_pd,
    ibv_dealloc_pd
);
host_object!(
    /// A host completion queue.
    Cq,
    ibv_cq,
    ibv_destroy_cq
);
host_object!(
    /// A host queue pair.
    Qp,
    ibv_qp,
    ibv_destroy_qp
);
host_object!(
    /// A host shared receive queue.
    Srq,
    ibv_srq,
    ibv_destroy_srq
);
host_object!(
    /// A host address handle.
    Ah,
    ibv_ah,
    ibv_destroy_ah
);
host_object!(
    /// A completion channel: the file descriptor that becomes readable when
    /// an armed CQ of it gets a completion.
    Channel,
    ibv_comp_channel,
    ibv_destroy_comp_channel
);

impl Qp {
    /// The QP's number (on the wire).
    pub fn qpn(&self) -> u32 {
        // SAFETY: a live QP; `qp_num` is set at creation and never changes.
        unsafe { (*self.0.as_ptr()).qp_num }
    }
}

impl Channel {
    /// Its file descriptor, made non-blocking by [`Channel::nonblocking`].
    pub fn fd(&self) -> RawFd {
        // SAFETY: a live channel; `fd` is set at creation.
        unsafe { (*self.0.as_ptr()).fd }
    }

    /// Makes reading events non-blocking (the engine drains the channel
    /// without ever waiting on it there).
    pub fn nonblocking(&self) -> io::Result<()> {
        let fd = self.fd();
        // SAFETY: fcntl on a descriptor this channel owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads and acknowledges every completion event waiting; how many.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: a live, non-blocking channel and two out-pointers.
            if unsafe { ibv_get_cq_event(self.0.as_ptr(), &mut cq, &mut ctx) } != 0 {
                return n;
            }
            // SAFETY: `cq` was just returned by ibv_get_cq_event, so it is
            // alive (a CQ with unacknowledged events cannot be destroyed).
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

/// A host memory region over a window of guest pages; the region is
/// deregistered before the window is unmapped.
#[derive(Debug)]
pub struct Mr {
    // Field order is drop order: the registration goes first.
    mr: MrHandle,
    window: Window,
}

host_object!(
    /// A bare host memory region.
    MrHandle,
    ibv_mr,
    ibv_dereg_mr
);

impl Mr {
    /// A region `mr` registered over `window`.
    pub fn new(mr: MrHandle, window: Window) -> Self {
        Mr { mr, window }
    }

    /// Its keys (`lkey`, `rkey`).
    pub fn keys(&self) -> (u32, u32) {
        // SAFETY: a live region; the keys are set at registration.
        unsafe {
            let m = &*self.mr.as_ptr();
            (m.lkey, m.rkey)
        }
    }

    /// The window it is registered over.
    pub fn window(&self) -> &Window {
        &self.window
    }
}
