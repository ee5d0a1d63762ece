//! The host's connection manager through librdmacm: one event channel and
//! `rdma_cm_id`s that have no QP of their own (the guest's host QP is named
//! by number in the connection parameters). Every id is owned and destroyed
//! when dropped; events are copied out and acknowledged at once, so no
//! library memory outlives the call that read it.

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use log::warn;
use rdma_sys::{
    ibv_qp_attr, ibv_qp_state, rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_cm_event,
    rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_connect, rdma_create_event_channel,
    rdma_create_id, rdma_destroy_event_channel, rdma_destroy_id, rdma_disconnect, rdma_establish,
    rdma_event_channel, rdma_get_cm_event, rdma_init_qp_attr, rdma_listen, rdma_port_space,
    rdma_reject, rdma_resolve_addr, rdma_resolve_route,
};

use super::conn::{ConnParams, HostKind, QpParams};
use crate::rnic::verbs::objects::errno_of;

/// The kind of a host CM event (`enum rdma_cm_event_type`, read as an
/// integer: a newer library may report one the bindings lack).
fn host_kind(raw: u32) -> HostKind {
    use rdma_cm_event_type as t;
    match raw {
        t::RDMA_CM_EVENT_ADDR_RESOLVED => HostKind::AddrResolved,
        t::RDMA_CM_EVENT_ADDR_ERROR => HostKind::AddrError,
        t::RDMA_CM_EVENT_ROUTE_RESOLVED => HostKind::RouteResolved,
        t::RDMA_CM_EVENT_ROUTE_ERROR => HostKind::RouteError,
        t::RDMA_CM_EVENT_CONNECT_REQUEST => HostKind::ConnectRequest,
        t::RDMA_CM_EVENT_CONNECT_RESPONSE => HostKind::ConnectResponse,
        t::RDMA_CM_EVENT_CONNECT_ERROR => HostKind::ConnectError,
        t::RDMA_CM_EVENT_UNREACHABLE => HostKind::Unreachable,
        t::RDMA_CM_EVENT_REJECTED => HostKind::Rejected,
        t::RDMA_CM_EVENT_ESTABLISHED => HostKind::Established,
        t::RDMA_CM_EVENT_DISCONNECTED => HostKind::Disconnected,
        t::RDMA_CM_EVENT_DEVICE_REMOVAL => HostKind::DeviceRemoval,
        t::RDMA_CM_EVENT_TIMEWAIT_EXIT => HostKind::TimewaitExit,
        _ => HostKind::Other,
    }
}

/// One host CM event, copied out of the library.
#[derive(Debug)]
pub struct CmEvent {
    /// Its kind.
    pub kind: HostKind,
    /// Its status (0, or a negative errno / a REJ reason for `REJECTED`).
    pub status: i32,
    /// The key of the id it concerns: for `CONNECT_REQUEST`, the listener's.
    pub key: u64,
    /// For `CONNECT_REQUEST`: the new id of the request, now the caller's.
    pub new_id: Option<CmId>,
    /// The event's connection parameters (private data copied).
    pub conn: ConnParams,
}

/// The host CM's event channel; its descriptor is non-blocking.
#[derive(Debug)]
pub struct EventChannel(NonNull<rdma_event_channel>);

// SAFETY: librdmacm's channel may be read from any thread; this value is
// its only owner.
unsafe impl Send for EventChannel {}

impl EventChannel {
    /// Opens a channel.
    pub fn new() -> io::Result<Self> {
        // SAFETY: no arguments; a null return is an error with errno set.
        let raw = unsafe { rdma_create_event_channel() };
        let ch = NonNull::new(raw)
            .map(EventChannel)
            .ok_or_else(io::Error::last_os_error)?;
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's descriptor, open while `ch` lives.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ch)
    }

    /// The descriptor to poll for events.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { (*self.0.as_ptr()).fd }
    }

    /// The next event, `None` when there is none now.
    pub fn next_event(&self) -> io::Result<Option<CmEvent>> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: a live channel and a place for the event pointer.
        let rc = unsafe { rdma_get_cm_event(self.0.as_ptr(), &mut ev) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        let Some(ev) = NonNull::new(ev) else {
            return Ok(None);
        };
        // SAFETY: the library handed us a live event until we acknowledge
        // it below; everything kept is copied first.
        let out = unsafe { copy_event(ev.as_ptr()) };
        // SAFETY: acknowledged once; the event is not used afterwards.
        let rc = unsafe { rdma_ack_cm_event(ev.as_ptr()) };
        if rc != 0 {
            warn!("rdma_ack_cm_event: {}", io::Error::last_os_error());
        }
        Ok(Some(out))
    }

    fn as_ptr(&self) -> *mut rdma_event_channel {
        self.0.as_ptr()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id of the channel is destroyed before it (the
        // bridge owns both and drops ids first); destroyed once, here.
        unsafe { rdma_destroy_event_channel(self.0.as_ptr()) };
    }
}

/// Copies what the bridge keeps out of a live event.
///
/// # Safety
/// `ev` is a live event of librdmacm, not yet acknowledged.
unsafe fn copy_event(ev: *mut rdma_cm_event) -> CmEvent {
    // SAFETY: the caller's contract.
    let e = unsafe { &*ev };
    let kind = host_kind(e.event);
    // The listener's key for a request; the id's own otherwise.
    let keyed = if kind == HostKind::ConnectRequest && !e.listen_id.is_null() {
        e.listen_id
    } else {
        e.id
    };
    let key = if keyed.is_null() {
        0
    } else {
        // SAFETY: a live id of the event; `context` is a plain field.
        unsafe { (*keyed).context as u64 }
    };
    let new_id = if kind == HostKind::ConnectRequest {
        NonNull::new(e.id).map(|raw| CmId { raw })
    } else {
        None
    };
    // SAFETY: for connection events `param.conn` is the active member; for
    // the others its bytes are zero or unused, and only plain fields are
    // read. The private data pointer is valid for its length until the ack.
    let conn = unsafe {
        let c = &e.param.conn;
        let private_data = if c.private_data.is_null() || c.private_data_len == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
                .to_vec()
        };
        ConnParams {
            private_data,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq != 0,
            qp_num: c.qp_num,
        }
    };
    CmEvent {
        kind,
        status: e.status,
        key,
        new_id,
        conn,
    }
}

/// A host `rdma_cm_id` in the TCP port space with no QP of its own.
#[derive(Debug)]
pub struct CmId {
    raw: NonNull<rdma_cm_id>,
}

// SAFETY: librdmacm ids may be used from any thread (the library locks
// what they share); this value is the only owner.
unsafe impl Send for CmId {}

/// A socket address in the form librdmacm takes.
fn sockaddr_of(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and
            // suitably aligned for it.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(errno_of(rc)))
    }
}

impl CmId {
    /// Creates an id on `channel` whose events carry `key`.
    pub fn new(channel: &EventChannel, key: u64) -> io::Result<Self> {
        let mut raw: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a live channel and a place for the id; the context is an
        // integer the library only hands back.
        let rc = unsafe {
            rdma_create_id(
                channel.as_ptr(),
                &mut raw,
                key as usize as *mut libc::c_void,
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(rc)?;
        NonNull::new(raw)
            .map(|raw| CmId { raw })
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
    }

    /// Gives the id's later events `key` (for ids of connection requests,
    /// which start with their listener's).
    pub fn set_key(&mut self, key: u64) {
        // SAFETY: a live id owned by this value; `context` is a plain
        // field the library only hands back.
        unsafe { (*self.raw.as_ptr()).context = key as usize as *mut libc::c_void };
    }

    /// Starts resolving `dst` from `src` (`ADDR_RESOLVED` or `ADDR_ERROR`).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> io::Result<()> {
        let mut s = src.map(sockaddr_of);
        let mut d = sockaddr_of(dst);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast::<libc::sockaddr>()
        });
        // SAFETY: a live id; the addresses live across the call, which
        // copies them.
        check(unsafe {
            rdma_resolve_addr(
                self.raw.as_ptr(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        })
    }

    /// Starts resolving the route (`ROUTE_RESOLVED` or `ROUTE_ERROR`).
    pub fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: a live id.
        check(unsafe { rdma_resolve_route(self.raw.as_ptr(), timeout_ms) })
    }

    /// Binds to `addr` (a local address of an RDMA device).
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        let mut a = sockaddr_of(addr);
        // SAFETY: a live id; the address lives across the call.
        check(unsafe {
            rdma_bind_addr(
                self.raw.as_ptr(),
                (&mut a as *mut libc::sockaddr_storage).cast(),
            )
        })
    }

    /// Binds to `addr` and listens.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> io::Result<()> {
        self.bind(addr)?;
        // SAFETY: a live, bound id.
        check(unsafe { rdma_listen(self.raw.as_ptr(), backlog) })
    }

    /// Sends the REQ for `p.qp_num` (`CONNECT_RESPONSE`, `REJECTED`, ...).
    pub fn connect(&self, p: &ConnParams) -> io::Result<()> {
        let mut c = raw_params(p)?;
        // SAFETY: a live id; `c` and the private data it points to live
        // across the call, which copies them.
        check(unsafe { rdma_connect(self.raw.as_ptr(), &mut c) })
    }

    /// Sends the REP of a request for `p.qp_num`.
    pub fn accept(&self, p: &ConnParams) -> io::Result<()> {
        let mut c = raw_params(p)?;
        // SAFETY: as for `connect`.
        check(unsafe { rdma_accept(self.raw.as_ptr(), &mut c) })
    }

    /// Sends a REJ with `private_data`.
    pub fn reject(&self, private_data: &[u8]) -> io::Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: a live id; the data lives across the call, which copies it.
        check(unsafe { rdma_reject(self.raw.as_ptr(), ptr, len) })
    }

    /// Sends the RTU (active side, after `CONNECT_RESPONSE`).
    pub fn establish(&self) -> io::Result<()> {
        // SAFETY: a live id.
        check(unsafe { rdma_establish(self.raw.as_ptr()) })
    }

    /// Sends a DREQ (or answers one with a DREP).
    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: a live id.
        check(unsafe { rdma_disconnect(self.raw.as_ptr()) })
    }

    /// The peer's address (an id of a connection request, or a resolved
    /// one); `None` for an address family the bridge does not serve.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; the route's destination is a plain
        // sockaddr_storage-sized union the library filled, read by family.
        unsafe {
            let dst = &(*self.raw.as_ptr()).route.addr.dst_addr_union;
            match i32::from(dst.dst_addr.sa_family) {
                libc::AF_INET => {
                    let sin = dst.dst_sin;
                    let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
                }
                libc::AF_INET6 => {
                    let sin6 = dst.dst_sin6;
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    Some(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
                }
                _ => None,
            }
        }
    }

    /// What a QP of the connection needs in RTR and RTS.
    pub fn qp_params(&self) -> io::Result<QpParams> {
        let get = |state| -> io::Result<ibv_qp_attr> {
            let mut attr = MaybeUninit::<ibv_qp_attr>::zeroed();
            let mut mask: libc::c_int = 0;
            // SAFETY: all-zero is a valid ibv_qp_attr; `qp_state` is set
            // before the call, which fills the rest.
            unsafe {
                (*attr.as_mut_ptr()).qp_state = state;
                check(rdma_init_qp_attr(
                    self.raw.as_ptr(),
                    attr.as_mut_ptr(),
                    &mut mask,
                ))?;
                Ok(attr.assume_init())
            }
        };
        let rtr = get(ibv_qp_state::IBV_QPS_RTR)?;
        let rts = get(ibv_qp_state::IBV_QPS_RTS)?;
        Ok(QpParams {
            dest_qpn: rtr.dest_qp_num,
            rq_psn: rtr.rq_psn,
            sq_psn: rts.sq_psn,
            path_mtu: rtr.path_mtu,
            max_dest_rd_atomic: rtr.max_dest_rd_atomic,
            max_rd_atomic: rts.max_rd_atomic,
        })
    }
}

/// librdmacm's form of `p`; its private data pointer borrows `p`.
fn raw_params(p: &ConnParams) -> io::Result<rdma_conn_param> {
    let len = u8::try_from(p.private_data.len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rdma_conn_param {
        private_data: if p.private_data.is_empty() {
            std::ptr::null()
        } else {
            p.private_data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: 1,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: p.qp_num,
    })
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: a live id owned by this value only, destroyed once; the
        // library waits for its outstanding events to be acknowledged,
        // which `next_event` does before returning.
        let rc = unsafe { rdma_destroy_id(self.raw.as_ptr()) };
        if rc != 0 {
            warn!(
                "rdma_destroy_id: {}",
                io::Error::from_raw_os_error(errno_of(rc))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    #[test]
    fn addresses_in_librdmacm_form() {
        let v4 = sockaddr_of(SocketAddr::from((Ipv4Addr::new(10, 42, 0, 2), 7174)));
        // SAFETY: sockaddr_of wrote a sockaddr_in for an IPv4 address.
        let sin: libc::sockaddr_in =
            unsafe { std::ptr::read((&v4 as *const libc::sockaddr_storage).cast()) };
        assert_eq!(i32::from(sin.sin_family), libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 7174);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 42, 0, 2]);
        let a6 = SocketAddrV6::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1), 4420, 0, 3);
        let v6 = sockaddr_of(SocketAddr::V6(a6));
        // SAFETY: as above, a sockaddr_in6.
        let sin6: libc::sockaddr_in6 =
            unsafe { std::ptr::read((&v6 as *const libc::sockaddr_storage).cast()) };
        assert_eq!(i32::from(sin6.sin6_family), libc::AF_INET6);
        assert_eq!(u16::from_be(sin6.sin6_port), 4420);
        assert_eq!(sin6.sin6_addr.s6_addr, a6.ip().octets());
        assert_eq!(sin6.sin6_scope_id, 3);
    }

    #[test]
    fn connection_parameters() {
        let p = ConnParams {
            private_data: vec![1, 2, 3],
            responder_resources: 4,
            initiator_depth: 2,
            retry_count: 7,
            rnr_retry_count: 6,
            srq: true,
            qp_num: 0x12_3456,
        };
        let c = raw_params(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.private_data_len, 3);
        assert_eq!(c.private_data, p.private_data.as_ptr().cast());
        assert_eq!((c.responder_resources, c.initiator_depth), (4, 2));
        assert_eq!((c.retry_count, c.rnr_retry_count, c.srq), (7, 6, 1));
        assert_eq!(c.qp_num, 0x12_3456);
        let empty = raw_params(&ConnParams::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(empty.private_data.is_null());
        let long = ConnParams {
            private_data: vec![0; 256],
            ..ConnParams::default()
        };
        assert!(
            raw_params(&long).is_err(),
            "librdmacm takes at most 255 bytes"
        );
    }
}
