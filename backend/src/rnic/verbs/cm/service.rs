//! The CM bridge at work: the decisions of [`super::bridge`] executed on
//! the host's `rdma_cm` ([`super::host`]). The caller polls [`CmService::fd`]
//! and calls [`CmService::poll`] when it is readable, hands in the guests'
//! CM MADs, and delivers [`CmService::take_to_guest`] to the guests' GSI QPs.
//! A host call that fails is answered as the host CM would have answered
//! it (an address, route or connection error), so the guest's CM always
//! hears back.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

use log::{debug, warn};

use super::bridge::{
    gid_ip, ip_gid, Bridge, ConnKey, GuestVerdict, HostEvent, Limits, ToGuest, ToHost, VmId,
};
use super::conn::HostKind;
use super::host::{CmEvent, CmId, EventChannel};

/// Milliseconds the host CM has to resolve an address or a route.
const RESOLVE_TIMEOUT_MS: i32 = 2000;
/// Connection requests a listener queues.
const BACKLOG: i32 = 16;

/// The bridge with its host CM.
#[derive(Debug)]
pub struct CmService {
    bridge: Bridge,
    /// Every live host id, by key (dropped before the channel).
    ids: HashMap<ConnKey, CmId>,
    channel: EventChannel,
    /// The host port's address: the local end of every bridged connection.
    host_ip: IpAddr,
    /// Keys of the ids of incoming requests (above the bridge's own).
    next_request_key: ConnKey,
}

impl CmService {
    /// A bridge for the host port of `gid` (a RoCEv2 GID: its IP address
    /// is where listeners listen).
    pub fn new(gid: [u8; 16], limits: Limits, seed: u32) -> io::Result<Self> {
        Ok(CmService {
            bridge: Bridge::new(gid, limits, seed),
            ids: HashMap::new(),
            channel: EventChannel::new()?,
            host_ip: gid_ip(gid),
            next_request_key: 1 << 63,
        })
    }

    /// The descriptor that becomes readable when the host CM has events.
    pub fn fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// The bridge's decisions, for what `MODIFY_QP` checks.
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// MADs for guests.
    pub fn take_to_guest(&mut self) -> Vec<ToGuest> {
        self.bridge.take_to_guest()
    }

    /// Listens for `vm` on `port`.
    pub fn listen(&mut self, vm: VmId, port: u16) -> Result<(), VmId> {
        self.bridge.listen(vm, port)?;
        self.run();
        Ok(())
    }

    /// `vm` is gone: its connections are released.
    pub fn vm_gone(&mut self, vm: VmId) {
        self.bridge.vm_gone(vm);
        self.run();
    }

    /// `vm` listens no more: its listeners' ids are destroyed.
    pub fn unlisten(&mut self, vm: VmId) {
        self.bridge.unlisten(vm);
        self.run();
    }

    /// `vm`'s QP `qpn` was destroyed: its connections are released.
    pub fn qp_gone(&mut self, vm: VmId, qpn: u32) {
        self.bridge.qp_gone(vm, qpn);
        self.run();
    }

    /// Sets `vm`'s connection limit.
    pub fn set_conn_limit(&mut self, vm: VmId, n: usize) {
        self.bridge.set_conn_limit(vm, n);
    }

    /// Checks that the host CM can use the host port's address (the
    /// device has it, `rdma_cm` is loaded): binds an id to it.
    pub fn probe(&self) -> io::Result<()> {
        let id = CmId::new(&self.channel, 0)?;
        id.bind(SocketAddr::new(self.host_ip, 0))
    }

    /// A CM MAD `vm`'s GSI QP sent to `dgid`.
    pub fn guest_mad(
        &mut self,
        vm: VmId,
        dgid: [u8; 16],
        mad: &[u8],
        owns_qp: impl Fn(u32) -> bool,
    ) -> GuestVerdict {
        let v = self.bridge.guest_mad(vm, dgid, mad, owns_qp);
        if let GuestVerdict::Dropped(why) = v {
            debug!("VM {vm}: CM MAD dropped: {why}");
        }
        self.run();
        v
    }

    /// Reads and handles at most `max` of the events the host CM has now;
    /// true if it may have more.
    pub fn poll(&mut self, max: usize) -> io::Result<bool> {
        for _ in 0..max {
            let Some(ev) = self.channel.next_event()? else {
                return Ok(false);
            };
            let ev = self.event(ev);
            self.bridge.host_event(ev);
            self.run();
        }
        Ok(true)
    }

    /// The bridge's form of a host event: a request's new id is kept under
    /// a key of its own, with what the bridge needs to know of it.
    fn event(&mut self, ev: CmEvent) -> HostEvent {
        let mut out = HostEvent {
            key: ev.key,
            kind: ev.kind,
            status: ev.status,
            conn: ev.conn,
            ..HostEvent::default()
        };
        if let Some(mut id) = ev.new_id {
            let key = self.next_request_key;
            self.next_request_key = self.next_request_key.wrapping_add(1) | (1 << 63);
            id.set_key(key);
            out.peer = id.peer_addr();
            out.peer_gid = out.peer.map(|p| ip_gid(p.ip())).unwrap_or_default();
            out.qp = id.qp_params().ok();
            out.new_key = Some(key);
            self.ids.insert(key, id);
        } else if ev.kind == HostKind::ConnectResponse {
            out.qp = self.ids.get(&ev.key).and_then(|id| id.qp_params().ok());
        }
        out
    }

    /// Executes the bridge's actions; a failed one comes back to the
    /// bridge as the host event that failure stands for.
    fn run(&mut self) {
        loop {
            let actions = self.bridge.take_to_host();
            if actions.is_empty() {
                return;
            }
            for a in actions {
                if let Some(kind) = self.execute(&a) {
                    let key = key_of(&a);
                    self.bridge.host_event(HostEvent {
                        key,
                        kind,
                        ..HostEvent::default()
                    });
                }
            }
        }
    }

    /// Runs one action; `Some(kind)` when it failed, the kind of host event
    /// that failure amounts to.
    fn execute(&mut self, a: &ToHost) -> Option<HostKind> {
        let r = match a {
            ToHost::Resolve { key, dst } => match CmId::new(&self.channel, *key) {
                Ok(id) => {
                    // From the host port's address: the id must be on
                    // the device of the guest's host QP.
                    let src = SocketAddr::new(self.host_ip, 0);
                    let r = id.resolve_addr(Some(src), *dst, RESOLVE_TIMEOUT_MS);
                    self.ids.insert(*key, id);
                    r.map_err(|e| (e, HostKind::AddrError))
                }
                Err(e) => Err((e, HostKind::AddrError)),
            },
            ToHost::Listen { key, port } => match CmId::new(&self.channel, *key) {
                Ok(id) => match id.listen(SocketAddr::new(self.host_ip, *port), BACKLOG) {
                    Ok(()) => {
                        self.ids.insert(*key, id);
                        Ok(())
                    }
                    Err(e) => {
                        warn!("CM bridge: cannot listen on port {port}: {e}");
                        return None;
                    }
                },
                Err(e) => {
                    warn!("CM bridge: cannot listen on port {port}: {e}");
                    return None;
                }
            },
            ToHost::Destroy { key } => {
                self.ids.remove(key);
                Ok(())
            }
            other => {
                let key = key_of(other);
                let id = self.ids.get(&key)?;
                match other {
                    ToHost::ResolveRoute { .. } => id
                        .resolve_route(RESOLVE_TIMEOUT_MS)
                        .map_err(|e| (e, HostKind::RouteError)),
                    ToHost::Connect { params, .. } => {
                        id.connect(params).map_err(|e| (e, HostKind::ConnectError))
                    }
                    ToHost::Accept { params, .. } => {
                        id.accept(params).map_err(|e| (e, HostKind::ConnectError))
                    }
                    ToHost::Reject { private_data, .. } => {
                        id.reject(private_data).map_err(|e| (e, HostKind::Other))
                    }
                    ToHost::Establish { .. } => {
                        id.establish().map_err(|e| (e, HostKind::ConnectError))
                    }
                    ToHost::Disconnect { .. } => {
                        id.disconnect().map_err(|e| (e, HostKind::Disconnected))
                    }
                    _ => Ok(()),
                }
            }
        };
        match r {
            Ok(()) => None,
            Err((e, kind)) => {
                debug!("CM bridge: {a:?}: {e}");
                (kind != HostKind::Other).then_some(kind)
            }
        }
    }
}

impl Drop for CmService {
    fn drop(&mut self) {
        // Ids before their channel.
        self.ids.clear();
    }
}

fn key_of(a: &ToHost) -> ConnKey {
    match a {
        ToHost::Resolve { key, .. }
        | ToHost::ResolveRoute { key }
        | ToHost::Connect { key, .. }
        | ToHost::Listen { key, .. }
        | ToHost::Accept { key, .. }
        | ToHost::Reject { key, .. }
        | ToHost::Establish { key }
        | ToHost::Disconnect { key }
        | ToHost::Destroy { key } => *key,
    }
}
