//! The CM bridge's decisions, without I/O: CM MADs from guests' GSI QPs
//! and the host `rdma_cm`'s events go in, actions on the host CM and MADs
//! for guests come out ([`ToHost`], [`ToGuest`]). The caller executes them
//! (with [`super::host`]) and hands back what the host reports.
//!
//! One connection is one host `rdma_cm_id` with no QP: the guest's own
//! host QP is named by number. Active side: a guest's REQ becomes address
//! and route resolution and `rdma_connect`; the host's
//! `CONNECT_RESPONSE` becomes a REP to the guest, the guest's RTU
//! `rdma_establish`. Passive side: a listener on a port the operator gave
//! the VM turns each `CONNECT_REQUEST` into a REQ to the guest, its REP
//! into `rdma_accept`, `ESTABLISHED` into an RTU. DREQ/DREP map onto
//! `rdma_disconnect` and `DISCONNECTED`. Everything a guest sends is
//! checked against the connections it owns; what does not fit is dropped
//! and counted, never answered with another guest's state.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ib_cm_wire::cm::{rej_reason, transport, which};
use ib_cm_wire::cma::{self, CmaHeader};
use ib_cm_wire::{CmMessage, Path, Rej, Rep, Req, Rtu, MAD_SIZE};

pub use super::conn::{ConnParams, HostKind, QpParams};

/// A VM, by its index in the daemon.
pub type VmId = usize;
/// A connection (or listener) of the bridge: the key its host id carries.
pub type ConnKey = u64;

/// CM response timeout put in REQs to guests (4.096 µs × 2^20: 4.3 s).
const CM_RESPONSE_TIMEOUT: u8 = 20;
/// CM retries put in REQs to guests.
const MAX_CM_RETRIES: u8 = 15;
/// Local ACK timeout of the path in REQs to guests (4.096 µs × 2^18: 1 s).
const ACK_TIMEOUT: u8 = 18;
/// Hop limit of the path in REQs to guests (routed RoCEv2).
const HOP_LIMIT: u8 = 64;
/// LID of a RoCE port in CM paths (permissive).
const ROCE_LID: u16 = 0xffff;
/// The default P_Key.
const PKEY: u16 = 0xffff;

/// An action on the host CM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToHost {
    /// Create an id keyed `key` and resolve `dst` from the host's address.
    Resolve {
        /// The new connection.
        key: ConnKey,
        /// The peer's address and port.
        dst: SocketAddr,
    },
    /// Resolve the route of `key`.
    ResolveRoute {
        /// The connection.
        key: ConnKey,
    },
    /// Send the REQ of `key`.
    Connect {
        /// The connection.
        key: ConnKey,
        /// Its parameters (the guest's host QP in `qp_num`).
        params: ConnParams,
    },
    /// Create an id keyed `key` listening on the host's address and `port`.
    Listen {
        /// The listener.
        key: ConnKey,
        /// The TCP port-space port.
        port: u16,
    },
    /// Send the REP of `key`.
    Accept {
        /// The connection.
        key: ConnKey,
        /// Its parameters.
        params: ConnParams,
    },
    /// Send a REJ on `key`.
    Reject {
        /// The connection.
        key: ConnKey,
        /// Private data for the peer.
        private_data: Vec<u8>,
    },
    /// Send the RTU of `key`.
    Establish {
        /// The connection.
        key: ConnKey,
    },
    /// Send a DREQ (or the DREP answering one) on `key`.
    Disconnect {
        /// The connection.
        key: ConnKey,
    },
    /// Destroy the id of `key`.
    Destroy {
        /// The connection or listener.
        key: ConnKey,
    },
}

/// A MAD for a guest's GSI QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToGuest {
    /// The VM.
    pub vm: VmId,
    /// Source GID of the MAD: the peer's port.
    pub sgid: [u8; 16],
    /// The MAD.
    pub mad: [u8; MAD_SIZE],
}

/// What became of a guest's MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestVerdict {
    /// Acted on.
    Taken,
    /// Dropped: why, for the VM's counters and the debug log.
    Dropped(&'static str),
}

/// One host CM event, as the caller read it from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEvent {
    /// The connection or listener it concerns.
    pub key: ConnKey,
    /// Its kind.
    pub kind: HostKind,
    /// Its status (for `Rejected`: the REJ reason).
    pub status: i32,
    /// Connection parameters of the event (the peer's QPN, private data).
    pub conn: ConnParams,
    /// What the connection's QP needs (`ConnectResponse`, `ConnectRequest`).
    pub qp: Option<QpParams>,
    /// `ConnectRequest`: the key the caller gave the request's new id.
    pub new_key: Option<ConnKey>,
    /// `ConnectRequest`: the peer's address and port.
    pub peer: Option<SocketAddr>,
    /// `ConnectRequest`: the peer's GID.
    pub peer_gid: [u8; 16],
}

/// What a bridged QP's `MODIFY_QP` must match and use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The peer's QP number (the RTR's `dest_qpn`).
    pub dest_qpn: u32,
    /// The peer's GID (the RTR's destination).
    pub peer_gid: [u8; 16],
    /// The first PSN the peer sends (the RTR's `rq_psn`).
    pub rq_psn: u32,
    /// The first PSN the host CM told the peer (replaces the RTS's `sq_psn`).
    pub sq_psn: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: resolving the peer's address.
    Resolving,
    /// Active: resolving the route.
    Routing,
    /// Active: the REQ is out.
    Connecting,
    /// Active: the REP went to the guest; waiting for its RTU.
    RepToGuest,
    /// Passive: the REQ went to the guest; waiting for its REP.
    ReqToGuest,
    /// Passive: the host sent the REP; waiting for the peer's RTU.
    Accepted,
    /// Both: connected.
    Established,
    /// The guest sent a DREQ; the host's DREQ is out.
    Disconnecting,
    /// The peer sent a DREQ; it went to the guest as a DREQ.
    DreqToGuest,
}

#[derive(Debug, Clone)]
struct Conn {
    vm: VmId,
    state: State,
    /// The guest CM's communication ID (0 until its REP, passive side).
    guest_comm_id: u32,
    /// The bridge's communication ID towards the guest.
    our_comm_id: u32,
    /// The guest's host QP.
    guest_qpn: u32,
    /// Transaction ID of the connection's REQ/REP/RTU MADs.
    tid: u64,
    peer_gid: [u8; 16],
    qp: Option<QpParams>,
    /// The REQ's parameters (active) or the guest's REP's (passive).
    params: ConnParams,
}

/// Limits of the bridge per VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections a VM may have in the bridge at once.
    pub conns_per_vm: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { conns_per_vm: 64 }
    }
}

/// The bridge of one host port: every VM of the daemon shares its GID.
#[derive(Debug)]
pub struct Bridge {
    /// The host port's GID: every VM's on this transport.
    gid: [u8; 16],
    limits: Limits,
    conns: HashMap<ConnKey, Conn>,
    /// (VM, the bridge's comm ID) → connection.
    by_ours: HashMap<(VmId, u32), ConnKey>,
    /// (VM, the guest's comm ID) → connection.
    by_guest: HashMap<(VmId, u32), ConnKey>,
    /// Listener → (VM, port).
    listeners: HashMap<ConnKey, (VmId, u16)>,
    /// VMs whose connection limit is not [`Limits::conns_per_vm`].
    vm_limits: HashMap<VmId, usize>,
    next_key: ConnKey,
    next_comm: u32,
    next_tid: u64,
    to_host: Vec<ToHost>,
    to_guest: Vec<ToGuest>,
}

/// The IP address of a RoCEv2 GID (IPv4-mapped or IPv6).
pub fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The RoCEv2 GID of an IP address.
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl Bridge {
    /// A bridge for the host port of `gid`; `seed` starts its
    /// communication and transaction IDs (random in the daemon, so that a
    /// guest cannot predict another's).
    pub fn new(gid: [u8; 16], limits: Limits, seed: u32) -> Self {
        Bridge {
            gid,
            limits,
            conns: HashMap::new(),
            by_ours: HashMap::new(),
            by_guest: HashMap::new(),
            listeners: HashMap::new(),
            vm_limits: HashMap::new(),
            next_key: 1,
            next_comm: seed | 1,
            next_tid: u64::from(seed) << 32,
            to_host: Vec::new(),
            to_guest: Vec::new(),
        }
    }

    /// Actions for the host CM, in order.
    pub fn take_to_host(&mut self) -> Vec<ToHost> {
        std::mem::take(&mut self.to_host)
    }

    /// MADs for guests, in order.
    pub fn take_to_guest(&mut self) -> Vec<ToGuest> {
        std::mem::take(&mut self.to_guest)
    }

    /// Connections of `vm` in the bridge.
    pub fn conns_of(&self, vm: VmId) -> usize {
        self.conns.values().filter(|c| c.vm == vm).count()
    }

    /// What `MODIFY_QP` of `vm`'s QP `qpn` must match, if the bridge
    /// connected it.
    pub fn binding(&self, vm: VmId, qpn: u32) -> Option<Binding> {
        self.conns
            .values()
            .filter(|c| c.vm == vm && c.guest_qpn == qpn)
            .find_map(|c| {
                c.qp.map(|q| Binding {
                    dest_qpn: q.dest_qpn,
                    peer_gid: c.peer_gid,
                    rq_psn: q.rq_psn,
                    sq_psn: q.sq_psn,
                })
            })
    }

    /// What `MODIFY_QP` to RTR of `vm`'s QP `qpn`, aimed at `dest_qpn` at
    /// `dgid`, must match and use: the QP's own binding if the bridge
    /// connected it; else a connection the bridge handed the guest as a
    /// REQ and that it has not answered yet, from that very peer QP and
    /// GID (the guest's `rdma_cm` moves its QP to RTR and RTS before it
    /// sends the REP that names the QP).
    pub fn binding_for(
        &self,
        vm: VmId,
        qpn: u32,
        dest_qpn: u32,
        dgid: [u8; 16],
    ) -> Option<Binding> {
        self.binding(vm, qpn).or_else(|| {
            self.conns
                .values()
                .filter(|c| c.vm == vm && c.state == State::ReqToGuest)
                .filter(|c| c.peer_gid == dgid)
                .find_map(|c| {
                    c.qp.filter(|q| q.dest_qpn == dest_qpn).map(|q| Binding {
                        dest_qpn: q.dest_qpn,
                        peer_gid: c.peer_gid,
                        rq_psn: q.rq_psn,
                        sq_psn: q.sq_psn,
                    })
                })
        })
    }

    /// Sets `vm`'s connection limit (its `cm_connections`).
    pub fn set_conn_limit(&mut self, vm: VmId, n: usize) {
        self.vm_limits.insert(vm, n);
    }

    fn conn_limit(&self, vm: VmId) -> usize {
        self.vm_limits
            .get(&vm)
            .copied()
            .unwrap_or(self.limits.conns_per_vm)
    }

    /// The ports `vm` listens on.
    pub fn ports_of(&self, vm: VmId) -> Vec<u16> {
        let mut p: Vec<u16> = self
            .listeners
            .values()
            .filter(|(v, _)| *v == vm)
            .map(|(_, port)| *port)
            .collect();
        p.sort_unstable();
        p
    }

    fn key(&mut self) -> ConnKey {
        let k = self.next_key;
        self.next_key = self.next_key.wrapping_add(1).max(1);
        k
    }

    fn comm_id(&mut self, vm: VmId) -> u32 {
        loop {
            // An odd step over the 32-bit space visits every value.
            self.next_comm = self.next_comm.wrapping_add(0x9e37_79b9);
            let c = self.next_comm;
            if c != 0 && !self.by_ours.contains_key(&(vm, c)) {
                return c;
            }
        }
    }

    fn tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }

    /// Listens for `vm` on `port`; refused when another VM has the port.
    pub fn listen(&mut self, vm: VmId, port: u16) -> Result<ConnKey, VmId> {
        if let Some(&(other, _)) = self.listeners.values().find(|(_, p)| *p == port) {
            return Err(other);
        }
        let key = self.key();
        self.listeners.insert(key, (vm, port));
        self.to_host.push(ToHost::Listen { key, port });
        Ok(key)
    }

    /// Stops listening for `vm`: its listeners' ids are destroyed (the
    /// requests they queued are rejected by the host CM).
    pub fn unlisten(&mut self, vm: VmId) {
        let mut keys: Vec<ConnKey> = self
            .listeners
            .iter()
            .filter(|(_, (v, _))| *v == vm)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for key in keys {
            self.listeners.remove(&key);
            self.to_host.push(ToHost::Destroy { key });
        }
    }

    /// `vm` is gone (reset, disconnect): its connections are released and
    /// its ids destroyed; its listeners stay with the VM's configuration.
    pub fn vm_gone(&mut self, vm: VmId) {
        let keys = self.keys_where(|c| c.vm == vm);
        self.release(keys);
    }

    /// `vm`'s QP `qpn` was destroyed: the connections the bridge made for
    /// it are released (the peer hears a DREQ or a REJ) and their ids
    /// destroyed.
    pub fn qp_gone(&mut self, vm: VmId, qpn: u32) {
        let keys = self.keys_where(|c| c.vm == vm && c.guest_qpn == qpn && qpn != 0);
        self.release(keys);
    }

    /// The keys of the connections `pick` picks, in key order (the actions
    /// come out in a stable order).
    fn keys_where(&self, pick: impl Fn(&Conn) -> bool) -> Vec<ConnKey> {
        let mut keys: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| pick(c))
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Tells the peers of connections `keys` that they are over and
    /// forgets them.
    fn release(&mut self, keys: Vec<ConnKey>) {
        for key in keys {
            if let Some(c) = self.conns.get(&key) {
                match c.state {
                    State::Established | State::DreqToGuest => {
                        self.to_host.push(ToHost::Disconnect { key })
                    }
                    State::ReqToGuest => self.to_host.push(ToHost::Reject {
                        key,
                        private_data: Vec::new(),
                    }),
                    _ => {}
                }
            }
            self.remove(key);
        }
    }

    /// Forgets connection `key` and destroys its id.
    fn remove(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.remove(&key) {
            self.by_ours.remove(&(c.vm, c.our_comm_id));
            if c.guest_comm_id != 0 {
                self.by_guest.remove(&(c.vm, c.guest_comm_id));
            }
            self.to_host.push(ToHost::Destroy { key });
        }
    }

    fn send(&mut self, vm: VmId, sgid: [u8; 16], msg: CmMessage, tid: u64) {
        match msg.emit(tid) {
            Ok(mad) => self.to_guest.push(ToGuest { vm, sgid, mad }),
            // Only over-long private data fails, and the bridge copies at
            // most what each message holds.
            Err(e) => log::warn!("CM bridge: a MAD for VM {vm} did not encode: {e}"),
        }
    }

    /// A REJ to the guest for connection `c`.
    fn reject_guest(&mut self, c: &Conn, message: u8, reason: u16, private: &[u8]) {
        let private_data = private
            .get(..private.len().min(ib_cm_wire::cm::private_len::REJ))
            .unwrap_or_default()
            .to_vec();
        let rej = Rej {
            local_comm_id: c.our_comm_id,
            remote_comm_id: c.guest_comm_id,
            message_rejected: message,
            reason,
            ari: Vec::new(),
            private_data,
        };
        self.send(c.vm, c.peer_gid, CmMessage::Rej(rej), c.tid);
    }

    /// A CM MAD that `vm`'s GSI QP sent to `dgid`. `owns_qp` says whether
    /// a QP number is one of the VM's RC QPs.
    pub fn guest_mad(
        &mut self,
        vm: VmId,
        dgid: [u8; 16],
        mad: &[u8],
        owns_qp: impl Fn(u32) -> bool,
    ) -> GuestVerdict {
        let Ok((hdr, msg)) = CmMessage::parse(mad) else {
            return GuestVerdict::Dropped("not a CM message the bridge handles");
        };
        match msg {
            CmMessage::Req(r) => self.guest_req(vm, dgid, hdr.tid, r, owns_qp),
            CmMessage::Rep(r) => self.guest_rep(vm, r, owns_qp),
            CmMessage::Rtu(r) => self.guest_rtu(vm, r),
            CmMessage::Rej(r) => self.guest_rej(vm, r),
            CmMessage::Dreq(r) => self.guest_dreq(vm, hdr.tid, r.local_comm_id, r.remote_comm_id),
            CmMessage::Drep(r) => self.guest_drep(vm, r.remote_comm_id),
            // The host CM keeps its own timers; a guest's MRA asks nothing
            // of it.
            CmMessage::Mra(_) => GuestVerdict::Taken,
        }
    }

    fn guest_req(
        &mut self,
        vm: VmId,
        dgid: [u8; 16],
        tid: u64,
        r: Req,
        owns_qp: impl Fn(u32) -> bool,
    ) -> GuestVerdict {
        if self.by_guest.contains_key(&(vm, r.local_comm_id)) {
            // A retransmission: the host CM already works on it.
            return GuestVerdict::Taken;
        }
        if r.transport_service_type != transport::RC || r.primary.remote_gid != dgid {
            return GuestVerdict::Dropped("REQ: not RC, or its path is not where it was sent");
        }
        let Some((cma::ps::TCP, port)) = cma::split_service_id(r.service_id) else {
            return GuestVerdict::Dropped("REQ: not an rdma_cm TCP port-space service");
        };
        let Ok(cma_hdr) = CmaHeader::parse(&r.private_data) else {
            return GuestVerdict::Dropped("REQ: no rdma_cm header");
        };
        if ip_gid(cma_hdr.dst) != dgid {
            return GuestVerdict::Dropped("REQ: rdma_cm header names another address");
        }
        let our_comm_id = self.comm_id(vm);
        let c = Conn {
            vm,
            state: State::Resolving,
            guest_comm_id: r.local_comm_id,
            our_comm_id,
            guest_qpn: r.local_qpn,
            tid,
            peer_gid: dgid,
            qp: None,
            params: ConnParams {
                private_data: r
                    .private_data
                    .get(cma::CMA_HEADER_SIZE..)
                    .unwrap_or_default()
                    .to_vec(),
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry_count,
                srq: r.srq,
                qp_num: r.local_qpn,
            },
        };
        if !owns_qp(r.local_qpn) {
            self.reject_guest(&c, which::REQ, rej_reason::NO_QP, &[]);
            return GuestVerdict::Dropped("REQ: names a QP that is not the VM's");
        }
        if self.conns_of(vm) >= self.conn_limit(vm) {
            self.reject_guest(&c, which::REQ, rej_reason::NO_RESOURCES, &[]);
            return GuestVerdict::Dropped("REQ: the VM's connection limit");
        }
        let key = self.key();
        self.by_guest.insert((vm, c.guest_comm_id), key);
        self.by_ours.insert((vm, our_comm_id), key);
        self.conns.insert(key, c);
        self.to_host.push(ToHost::Resolve {
            key,
            dst: SocketAddr::new(cma_hdr.dst, port),
        });
        GuestVerdict::Taken
    }

    /// The connection of `vm` that the guest names by the bridge's comm ID.
    fn ours(&self, vm: VmId, comm_id: u32) -> Option<ConnKey> {
        self.by_ours.get(&(vm, comm_id)).copied()
    }

    fn guest_rep(&mut self, vm: VmId, r: Rep, owns_qp: impl Fn(u32) -> bool) -> GuestVerdict {
        let Some(key) = self.ours(vm, r.remote_comm_id) else {
            return GuestVerdict::Dropped("REP: no such connection");
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return GuestVerdict::Dropped("REP: no such connection");
        };
        if c.state != State::ReqToGuest {
            return if c.state == State::Accepted && c.guest_comm_id == r.local_comm_id {
                GuestVerdict::Taken // a retransmission
            } else {
                GuestVerdict::Dropped("REP: connection not waiting for one")
            };
        }
        if !owns_qp(r.local_qpn) {
            let c = c.clone();
            self.to_host.push(ToHost::Reject {
                key,
                private_data: Vec::new(),
            });
            self.reject_guest(&c, which::REP, rej_reason::NO_QP, &[]);
            self.remove(key);
            return GuestVerdict::Dropped("REP: names a QP that is not the VM's");
        }
        c.guest_comm_id = r.local_comm_id;
        c.guest_qpn = r.local_qpn;
        c.state = State::Accepted;
        c.params = ConnParams {
            private_data: r.private_data,
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: c.params.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: r.local_qpn,
        };
        let params = c.params.clone();
        self.by_guest.insert((vm, r.local_comm_id), key);
        self.to_host.push(ToHost::Accept { key, params });
        GuestVerdict::Taken
    }

    fn guest_rtu(&mut self, vm: VmId, r: Rtu) -> GuestVerdict {
        let Some(key) = self.ours(vm, r.remote_comm_id) else {
            return GuestVerdict::Dropped("RTU: no such connection");
        };
        match self.conns.get_mut(&key) {
            Some(c) if c.state == State::RepToGuest => {
                c.state = State::Established;
                self.to_host.push(ToHost::Establish { key });
                GuestVerdict::Taken
            }
            Some(c) if c.state == State::Established => GuestVerdict::Taken,
            _ => GuestVerdict::Dropped("RTU: connection not waiting for one"),
        }
    }

    fn guest_rej(&mut self, vm: VmId, r: Rej) -> GuestVerdict {
        let key = self
            .ours(vm, r.remote_comm_id)
            .or_else(|| self.by_guest.get(&(vm, r.local_comm_id)).copied());
        let Some(key) = key else {
            return GuestVerdict::Dropped("REJ: no such connection");
        };
        let Some(state) = self.conns.get(&key).map(|c| c.state) else {
            return GuestVerdict::Dropped("REJ: no such connection");
        };
        match state {
            State::ReqToGuest | State::RepToGuest => {
                let private_data = r.private_data;
                self.to_host.push(ToHost::Reject { key, private_data });
            }
            State::Established | State::Accepted => self.to_host.push(ToHost::Disconnect { key }),
            // Before the host CM has sent anything, destroying the id is
            // the whole answer.
            _ => {}
        }
        self.remove(key);
        GuestVerdict::Taken
    }

    fn guest_dreq(&mut self, vm: VmId, tid: u64, local: u32, remote: u32) -> GuestVerdict {
        let Some(key) = self.ours(vm, remote) else {
            return GuestVerdict::Dropped("DREQ: no such connection");
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return GuestVerdict::Dropped("DREQ: no such connection");
        };
        if c.guest_comm_id != local {
            return GuestVerdict::Dropped("DREQ: not the guest's connection");
        }
        match c.state {
            State::Established | State::Accepted | State::RepToGuest => {
                c.state = State::Disconnecting;
                self.to_host.push(ToHost::Disconnect { key });
            }
            State::Disconnecting => {}
            // Both sides asked at once: the peer's DREQ is answered by
            // this one's disconnect.
            State::DreqToGuest => {
                self.to_host.push(ToHost::Disconnect { key });
                self.remove(key);
            }
            _ => return GuestVerdict::Dropped("DREQ: connection not established"),
        }
        // The guest's CM waits for a DREP; the host's time-wait is the
        // bridge's business.
        let drep = ib_cm_wire::Drep {
            local_comm_id: remote,
            remote_comm_id: local,
            private_data: Vec::new(),
        };
        let sgid = self.conns.get(&key).map_or(self.gid, |c| c.peer_gid);
        self.send(vm, sgid, CmMessage::Drep(drep), tid);
        GuestVerdict::Taken
    }

    fn guest_drep(&mut self, vm: VmId, remote: u32) -> GuestVerdict {
        let Some(key) = self.ours(vm, remote) else {
            return GuestVerdict::Dropped("DREP: no such connection");
        };
        match self.conns.get(&key).map(|c| c.state) {
            Some(State::DreqToGuest) => {
                self.to_host.push(ToHost::Disconnect { key });
                self.remove(key);
                GuestVerdict::Taken
            }
            _ => GuestVerdict::Dropped("DREP: no DREQ outstanding"),
        }
    }

    /// An event of the host CM.
    pub fn host_event(&mut self, ev: HostEvent) {
        if ev.kind == HostKind::ConnectRequest {
            self.connect_request(ev);
            return;
        }
        let key = ev.key;
        let Some(c) = self.conns.get(&key).cloned() else {
            // A listener's error, or an event of an id already released.
            return;
        };
        match (ev.kind, c.state) {
            (HostKind::AddrResolved, State::Resolving) => {
                self.set_state(key, State::Routing);
                self.to_host.push(ToHost::ResolveRoute { key });
            }
            (HostKind::RouteResolved, State::Routing) => {
                self.set_state(key, State::Connecting);
                let params = c.params.clone();
                self.to_host.push(ToHost::Connect { key, params });
            }
            (HostKind::ConnectResponse, State::Connecting) => match ev.qp {
                Some(qp) => self.rep_to_guest(key, &c, &ev.conn, qp),
                None => {
                    self.reject_guest(&c, which::REQ, rej_reason::NO_RESOURCES, &[]);
                    self.to_host.push(ToHost::Reject {
                        key,
                        private_data: Vec::new(),
                    });
                    self.remove(key);
                }
            },
            (HostKind::Rejected, State::Connecting | State::Accepted) => {
                let reason = u16::try_from(ev.status)
                    .ok()
                    .filter(|r| (1..=35).contains(r))
                    .unwrap_or(rej_reason::CONSUMER_DEFINED);
                let msg = if c.state == State::Connecting {
                    which::REQ
                } else {
                    which::REP
                };
                self.reject_guest(&c, msg, reason, &ev.conn.private_data);
                self.remove(key);
            }
            (HostKind::Established, State::Accepted) => {
                self.set_state(key, State::Established);
                let rtu = Rtu {
                    local_comm_id: c.our_comm_id,
                    remote_comm_id: c.guest_comm_id,
                    private_data: Vec::new(),
                };
                self.send(c.vm, c.peer_gid, CmMessage::Rtu(rtu), c.tid);
            }
            (HostKind::Disconnected, State::Established) => {
                self.set_state(key, State::DreqToGuest);
                let tid = self.tid();
                let dreq = ib_cm_wire::Dreq {
                    local_comm_id: c.our_comm_id,
                    remote_comm_id: c.guest_comm_id,
                    remote_qpn: c.guest_qpn,
                    private_data: Vec::new(),
                };
                self.send(c.vm, c.peer_gid, CmMessage::Dreq(dreq), tid);
            }
            (HostKind::Disconnected | HostKind::TimewaitExit, State::Disconnecting) => {
                self.remove(key)
            }
            (HostKind::TimewaitExit | HostKind::Other, _) => {}
            // Any other failure before the connection was established: the
            // guest's CM hears a timeout, the id goes.
            (_, State::Resolving | State::Routing | State::Connecting | State::Accepted) => {
                let msg = if c.state == State::Accepted {
                    which::REP
                } else {
                    which::REQ
                };
                self.reject_guest(&c, msg, rej_reason::TIMEOUT, &[]);
                self.remove(key);
            }
            (
                HostKind::Disconnected | HostKind::DeviceRemoval,
                State::RepToGuest | State::ReqToGuest,
            ) => {
                self.reject_guest(&c, which::OTHER, rej_reason::TIMEOUT, &[]);
                self.remove(key);
            }
            _ => {}
        }
    }

    fn set_state(&mut self, key: ConnKey, state: State) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.state = state;
        }
    }

    fn rep_to_guest(&mut self, key: ConnKey, c: &Conn, peer: &ConnParams, qp: QpParams) {
        let rep = Rep {
            local_comm_id: c.our_comm_id,
            remote_comm_id: c.guest_comm_id,
            local_qkey: 0,
            local_qpn: peer.qp_num,
            starting_psn: qp.rq_psn,
            responder_resources: peer.responder_resources,
            initiator_depth: peer.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: peer.rnr_retry_count,
            srq: peer.srq,
            local_ca_guid: 0,
            private_data: peer
                .private_data
                .get(
                    ..peer
                        .private_data
                        .len()
                        .min(ib_cm_wire::cm::private_len::REP),
                )
                .unwrap_or_default()
                .to_vec(),
        };
        if let Some(conn) = self.conns.get_mut(&key) {
            conn.state = State::RepToGuest;
            conn.qp = Some(qp);
        }
        self.send(c.vm, c.peer_gid, CmMessage::Rep(rep), c.tid);
    }

    fn connect_request(&mut self, ev: HostEvent) {
        let Some(new_key) = ev.new_key else {
            return;
        };
        let listener = self.listeners.get(&ev.key).copied();
        let (Some((vm, port)), Some(peer), Some(qp)) = (listener, ev.peer, ev.qp) else {
            self.to_host.push(ToHost::Reject {
                key: new_key,
                private_data: Vec::new(),
            });
            self.to_host.push(ToHost::Destroy { key: new_key });
            return;
        };
        if self.conns_of(vm) >= self.conn_limit(vm) {
            self.to_host.push(ToHost::Reject {
                key: new_key,
                private_data: Vec::new(),
            });
            self.to_host.push(ToHost::Destroy { key: new_key });
            return;
        }
        let our_comm_id = self.comm_id(vm);
        let tid = self.tid();
        let cma_hdr = CmaHeader {
            src_port: peer.port(),
            src: peer.ip(),
            dst: match peer.ip() {
                IpAddr::V4(_) => gid_ip(self.gid),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(self.gid)),
            },
        };
        let user = ev
            .conn
            .private_data
            .get(
                ..ev.conn
                    .private_data
                    .len()
                    .min(ib_cm_wire::cm::private_len::REQ.saturating_sub(cma::CMA_HEADER_SIZE)),
            )
            .unwrap_or_default();
        let private_data = cma_hdr
            .with_user_data(user)
            .unwrap_or_else(|_| vec![0; cma::CMA_HEADER_SIZE]);
        let path = Path {
            local_lid: ROCE_LID,
            remote_lid: ROCE_LID,
            local_gid: ev.peer_gid,
            remote_gid: self.gid,
            hop_limit: HOP_LIMIT,
            local_ack_timeout: ACK_TIMEOUT,
            ..Path::default()
        };
        let req = Req {
            local_comm_id: our_comm_id,
            service_id: cma::service_id(cma::ps::TCP, port),
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: ev.conn.qp_num,
            responder_resources: ev.conn.responder_resources,
            initiator_depth: ev.conn.initiator_depth,
            remote_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            transport_service_type: transport::RC,
            end_to_end_flow_control: true,
            starting_psn: qp.rq_psn,
            local_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            retry_count: ev.conn.retry_count,
            partition_key: PKEY,
            path_mtu: u8::try_from(qp.path_mtu).unwrap_or(0),
            rnr_retry_count: ev.conn.rnr_retry_count,
            max_cm_retries: MAX_CM_RETRIES,
            srq: ev.conn.srq,
            primary: path,
            alternate: Path::default(),
            private_data,
        };
        let c = Conn {
            vm,
            state: State::ReqToGuest,
            guest_comm_id: 0,
            our_comm_id,
            guest_qpn: 0,
            tid,
            peer_gid: ev.peer_gid,
            qp: Some(qp),
            params: ev.conn.clone(),
        };
        self.by_ours.insert((vm, our_comm_id), new_key);
        self.conns.insert(new_key, c);
        self.send(vm, ev.peer_gid, CmMessage::Req(req), tid);
    }
}

#[cfg(test)]
#[path = "bridge_tests.rs"]
mod tests;
