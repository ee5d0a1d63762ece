//! The bridge's exchanges, both sides, against what ib_cm expects: each
//! test drives the decisions with the MADs a guest CM sends and the events
//! a host CM reports, and checks the actions and MADs that come out.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ib_cm_wire::cm::{rej_reason, transport, which};
use ib_cm_wire::cma::{self, CmaHeader};
use ib_cm_wire::{CmMessage, Drep, Dreq, Path, Rej, Rep, Req, Rtu};

use super::*;

const HOST: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 1];
const PEER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 2];
const PEER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 7, 2);
const VM: VmId = 3;
const GUEST_QPN: u32 = 0x11;
const PEER_QPN: u32 = 0x2a;

fn bridge() -> Bridge {
    Bridge::new(HOST, Limits { conns_per_vm: 2 }, 0x1234_5678)
}

fn owns(q: u32) -> bool {
    q == GUEST_QPN || q == GUEST_QPN + 1 || q == GUEST_QPN + 2
}

/// The REQ a guest's rdma_cm sends to rping's port on the peer.
fn guest_req(comm: u32, qpn: u32) -> Req {
    let hdr = CmaHeader {
        src_port: 40000,
        src: IpAddr::V4(Ipv4Addr::new(192, 168, 7, 1)),
        dst: IpAddr::V4(PEER_IP),
    };
    Req {
        local_comm_id: comm,
        service_id: cma::service_id(cma::ps::TCP, 7174),
        local_qpn: qpn,
        responder_resources: 1,
        initiator_depth: 1,
        transport_service_type: transport::RC,
        starting_psn: 0x77,
        retry_count: 7,
        rnr_retry_count: 7,
        partition_key: 0xffff,
        primary: Path {
            local_gid: HOST,
            remote_gid: PEER,
            ..Path::default()
        },
        private_data: hdr.with_user_data(b"user").unwrap_or_default(),
        ..Req::default()
    }
}

fn mad(m: CmMessage) -> [u8; 256] {
    m.emit(0x99).unwrap_or_else(|e| panic!("{e}"))
}

fn parse(t: &ToGuest) -> CmMessage {
    CmMessage::parse(&t.mad).unwrap_or_else(|e| panic!("{e}")).1
}

fn qp() -> QpParams {
    QpParams {
        dest_qpn: PEER_QPN,
        rq_psn: 0xabc,
        sq_psn: 0xdef,
        path_mtu: 3,
        max_dest_rd_atomic: 1,
        max_rd_atomic: 1,
    }
}

fn ev(key: ConnKey, kind: HostKind) -> HostEvent {
    HostEvent {
        key,
        kind,
        ..HostEvent::default()
    }
}

/// Runs the active side up to the REP the guest receives; returns the
/// connection's key and the bridge's comm ID.
fn active_to_rep(b: &mut Bridge) -> (ConnKey, u32) {
    let v = b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(5, GUEST_QPN))),
        owns,
    );
    assert_eq!(v, GuestVerdict::Taken);
    let dst = SocketAddr::new(IpAddr::V4(PEER_IP), 7174);
    let key = match b.take_to_host().as_slice() {
        [ToHost::Resolve { key, dst: d }] if *d == dst => *key,
        other => panic!("{other:?}"),
    };
    b.host_event(ev(key, HostKind::AddrResolved));
    assert_eq!(b.take_to_host(), [ToHost::ResolveRoute { key }]);
    b.host_event(ev(key, HostKind::RouteResolved));
    match b.take_to_host().as_slice() {
        [ToHost::Connect { key: k, params }] => {
            assert_eq!(*k, key);
            assert_eq!(params.qp_num, GUEST_QPN, "the guest's host QP");
            assert_eq!(&params.private_data[..4], b"user", "rdma_cm header removed");
            assert_eq!((params.responder_resources, params.initiator_depth), (1, 1));
        }
        other => panic!("{other:?}"),
    }
    assert!(b.binding(VM, GUEST_QPN).is_none(), "no peer yet");
    let mut resp = ev(key, HostKind::ConnectResponse);
    resp.conn = ConnParams {
        private_data: b"peer".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        qp_num: PEER_QPN,
        ..ConnParams::default()
    };
    resp.qp = Some(qp());
    b.host_event(resp);
    let out = b.take_to_guest();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].vm, out[0].sgid), (VM, PEER));
    let CmMessage::Rep(rep) = parse(&out[0]) else {
        panic!("not a REP")
    };
    assert_eq!(rep.remote_comm_id, 5);
    assert_eq!((rep.local_qpn, rep.starting_psn), (PEER_QPN, 0xabc));
    assert_eq!(&rep.private_data[..4], b"peer");
    (key, rep.local_comm_id)
}

#[test]
fn active_side_connects_and_disconnects() {
    let mut b = bridge();
    let (key, ours) = active_to_rep(&mut b);
    assert_eq!(
        b.binding(VM, GUEST_QPN),
        Some(Binding {
            dest_qpn: PEER_QPN,
            peer_gid: PEER,
            rq_psn: 0xabc,
            sq_psn: 0xdef
        }),
        "MODIFY_QP of the guest's QP is checked against the REP and uses the host's PSN"
    );
    let rtu = Rtu {
        local_comm_id: 5,
        remote_comm_id: ours,
        private_data: Vec::new(),
    };
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Rtu(rtu.clone())), owns),
        GuestVerdict::Taken
    );
    assert_eq!(b.take_to_host(), [ToHost::Establish { key }]);
    // A retransmitted RTU changes nothing.
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Rtu(rtu)), owns),
        GuestVerdict::Taken
    );
    assert!(b.take_to_host().is_empty());
    // The guest disconnects: the host sends the DREQ, the guest gets its DREP.
    let dreq = Dreq {
        local_comm_id: 5,
        remote_comm_id: ours,
        remote_qpn: PEER_QPN,
        private_data: Vec::new(),
    };
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Dreq(dreq)), owns),
        GuestVerdict::Taken
    );
    assert_eq!(b.take_to_host(), [ToHost::Disconnect { key }]);
    let out = b.take_to_guest();
    assert!(
        matches!(parse(&out[0]), CmMessage::Drep(Drep { local_comm_id, remote_comm_id: 5, .. }) if local_comm_id == ours)
    );
    b.host_event(ev(key, HostKind::Disconnected));
    assert_eq!(b.take_to_host(), [ToHost::Destroy { key }]);
    assert_eq!(b.conns_of(VM), 0);
    assert!(b.binding(VM, GUEST_QPN).is_none());
}

#[test]
fn peer_disconnects() {
    let mut b = bridge();
    let (key, ours) = active_to_rep(&mut b);
    let rtu = Rtu {
        local_comm_id: 5,
        remote_comm_id: ours,
        private_data: Vec::new(),
    };
    b.guest_mad(VM, PEER, &mad(CmMessage::Rtu(rtu)), owns);
    b.take_to_host();
    b.host_event(ev(key, HostKind::Disconnected));
    let out = b.take_to_guest();
    let CmMessage::Dreq(d) = parse(&out[0]) else {
        panic!("not a DREQ")
    };
    assert_eq!((d.remote_comm_id, d.remote_qpn), (5, GUEST_QPN));
    let drep = Drep {
        local_comm_id: 5,
        remote_comm_id: ours,
        private_data: Vec::new(),
    };
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Drep(drep)), owns),
        GuestVerdict::Taken
    );
    assert_eq!(
        b.take_to_host(),
        [ToHost::Disconnect { key }, ToHost::Destroy { key }]
    );
    assert_eq!(b.conns_of(VM), 0);
}

#[test]
fn peer_rejects_and_unreachable_peers_time_out() {
    let mut b = bridge();
    b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(5, GUEST_QPN))),
        owns,
    );
    let key = match b.take_to_host().as_slice() {
        [ToHost::Resolve { key, .. }] => *key,
        other => panic!("{other:?}"),
    };
    b.host_event(ev(key, HostKind::AddrResolved));
    b.host_event(ev(key, HostKind::RouteResolved));
    b.take_to_host();
    let mut rej = ev(key, HostKind::Rejected);
    rej.status = i32::from(rej_reason::INVALID_SERVICE_ID);
    b.host_event(rej);
    let out = b.take_to_guest();
    let CmMessage::Rej(r) = parse(&out[0]) else {
        panic!("not a REJ")
    };
    assert_eq!(
        (r.remote_comm_id, r.reason, r.message_rejected),
        (5, 8, which::REQ)
    );
    assert_eq!(b.take_to_host(), [ToHost::Destroy { key }]);

    b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(6, GUEST_QPN))),
        owns,
    );
    let key = match b.take_to_host().as_slice() {
        [ToHost::Resolve { key, .. }] => *key,
        other => panic!("{other:?}"),
    };
    b.host_event(ev(key, HostKind::AddrError));
    let CmMessage::Rej(r) = parse(&b.take_to_guest()[0]) else {
        panic!("not a REJ")
    };
    assert_eq!((r.remote_comm_id, r.reason), (6, rej_reason::TIMEOUT));
    assert_eq!(b.take_to_host(), [ToHost::Destroy { key }]);
    assert_eq!(b.conns_of(VM), 0);
}

#[test]
fn passive_side_hands_requests_to_the_listening_vm() {
    let mut b = bridge();
    let lkey = b
        .listen(VM, 7174)
        .unwrap_or_else(|o| panic!("VM {o} has the port"));
    assert_eq!(
        b.take_to_host(),
        [ToHost::Listen {
            key: lkey,
            port: 7174
        }]
    );
    assert_eq!(b.listen(VM + 1, 7174), Err(VM), "one VM per port");
    let mut req = ev(lkey, HostKind::ConnectRequest);
    req.new_key = Some(900);
    req.peer = Some(SocketAddr::new(IpAddr::V4(PEER_IP), 51000));
    req.peer_gid = PEER;
    req.qp = Some(qp());
    req.conn = ConnParams {
        private_data: b"hi".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        qp_num: PEER_QPN,
        ..ConnParams::default()
    };
    b.host_event(req);
    let out = b.take_to_guest();
    assert_eq!((out[0].vm, out[0].sgid), (VM, PEER));
    let CmMessage::Req(r) = parse(&out[0]) else {
        panic!("not a REQ")
    };
    assert_eq!(r.service_id, cma::service_id(cma::ps::TCP, 7174));
    assert_eq!((r.local_qpn, r.starting_psn), (PEER_QPN, 0xabc));
    assert_eq!((r.primary.local_gid, r.primary.remote_gid), (PEER, HOST));
    let hdr = CmaHeader::parse(&r.private_data).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hdr.src, IpAddr::V4(PEER_IP));
    assert_eq!(hdr.dst, IpAddr::V4(Ipv4Addr::new(192, 168, 7, 1)));
    assert_eq!(hdr.src_port, 51000);
    assert_eq!(&r.private_data[36..38], b"hi");
    // The guest accepts with one of its QPs.
    let rep = Rep {
        local_comm_id: 44,
        remote_comm_id: r.local_comm_id,
        local_qpn: GUEST_QPN + 1,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        private_data: b"ok".to_vec(),
        ..Rep::default()
    };
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Rep(rep)), owns),
        GuestVerdict::Taken
    );
    match b.take_to_host().as_slice() {
        [ToHost::Accept { key: 900, params }] => {
            assert_eq!(params.qp_num, GUEST_QPN + 1);
            assert_eq!(&params.private_data[..2], b"ok");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(b.binding(VM, GUEST_QPN + 1).map(|x| x.sq_psn), Some(0xdef));
    b.host_event(ev(900, HostKind::Established));
    let CmMessage::Rtu(rtu) = parse(&b.take_to_guest()[0]) else {
        panic!("not an RTU")
    };
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (r.local_comm_id, 44)
    );
}

#[test]
fn passive_side_guest_rejects_and_unknown_listeners() {
    let mut b = bridge();
    let lkey = b.listen(VM, 4420).unwrap_or_else(|o| panic!("{o}"));
    b.take_to_host();
    let request = |key, new| HostEvent {
        key,
        kind: HostKind::ConnectRequest,
        new_key: Some(new),
        peer: Some(SocketAddr::new(IpAddr::V4(PEER_IP), 1)),
        peer_gid: PEER,
        qp: Some(qp()),
        ..HostEvent::default()
    };
    b.host_event(request(lkey, 901));
    let CmMessage::Req(r) = parse(&b.take_to_guest()[0]) else {
        panic!("not a REQ")
    };
    let rej = Rej {
        local_comm_id: 0,
        remote_comm_id: r.local_comm_id,
        message_rejected: which::REQ,
        reason: rej_reason::CONSUMER_DEFINED,
        private_data: b"no".to_vec(),
        ..Rej::default()
    };
    assert_eq!(
        b.guest_mad(VM, PEER, &mad(CmMessage::Rej(rej)), owns),
        GuestVerdict::Taken
    );
    match b.take_to_host().as_slice() {
        [ToHost::Reject {
            key: 901,
            private_data,
        }, ToHost::Destroy { key: 901 }] => {
            assert_eq!(&private_data[..2], b"no")
        }
        other => panic!("{other:?}"),
    }
    // A request on a key that is no listener is refused by the host.
    b.host_event(request(12345, 902));
    assert_eq!(
        b.take_to_host(),
        [
            ToHost::Reject {
                key: 902,
                private_data: Vec::new()
            },
            ToHost::Destroy { key: 902 }
        ]
    );
    assert!(b.take_to_guest().is_empty());
}

/// What a hostile guest may send: nothing of it reaches the host CM
/// beyond its own connections, and nothing of another VM's comes back.
#[test]
fn hostile_guests() {
    let mut b = bridge();
    let (key, ours) = active_to_rep(&mut b);
    // Another VM names the connection by its comm IDs: not found.
    let rtu = Rtu {
        local_comm_id: 5,
        remote_comm_id: ours,
        private_data: Vec::new(),
    };
    let other = VM + 1;
    assert!(matches!(
        b.guest_mad(other, PEER, &mad(CmMessage::Rtu(rtu.clone())), owns),
        GuestVerdict::Dropped(_)
    ));
    let dreq = Dreq {
        local_comm_id: 5,
        remote_comm_id: ours,
        ..Dreq::default()
    };
    assert!(matches!(
        b.guest_mad(other, PEER, &mad(CmMessage::Dreq(dreq)), owns),
        GuestVerdict::Dropped(_)
    ));
    assert!(b.take_to_host().is_empty() && b.take_to_guest().is_empty());
    // A REQ for a QP the VM does not own is rejected to the guest, and the
    // host hears nothing.
    let v = b.guest_mad(VM, PEER, &mad(CmMessage::Req(guest_req(7, 0x999))), owns);
    assert!(matches!(v, GuestVerdict::Dropped(_)));
    assert!(b.take_to_host().is_empty());
    let CmMessage::Rej(r) = parse(&b.take_to_guest()[0]) else {
        panic!("not a REJ")
    };
    assert_eq!(r.reason, rej_reason::NO_QP);
    // A REQ whose path or rdma_cm header points elsewhere than where it was
    // sent, or that is not RC, or not rdma_cm's TCP port space.
    let mut elsewhere = guest_req(8, GUEST_QPN);
    elsewhere.primary.remote_gid = HOST;
    let mut ud = guest_req(9, GUEST_QPN);
    ud.transport_service_type = transport::UC;
    let mut ib_ps = guest_req(10, GUEST_QPN);
    ib_ps.service_id = 0x1000_0000_0000_1c06;
    let mut no_hdr = guest_req(11, GUEST_QPN);
    no_hdr.private_data = vec![0x42; 92];
    for r in [elsewhere, ud, ib_ps, no_hdr] {
        let v = b.guest_mad(VM, PEER, &mad(CmMessage::Req(r)), owns);
        assert!(matches!(v, GuestVerdict::Dropped(_)), "{v:?}");
    }
    assert!(b.take_to_host().is_empty());
    // Junk is dropped.
    assert!(matches!(
        b.guest_mad(VM, PEER, &[0u8; 256], owns),
        GuestVerdict::Dropped(_)
    ));
    assert!(matches!(
        b.guest_mad(VM, PEER, &[1u8; 12], owns),
        GuestVerdict::Dropped(_)
    ));
    // A retransmitted REQ is not a second connection.
    assert_eq!(
        b.guest_mad(
            VM,
            PEER,
            &mad(CmMessage::Req(guest_req(5, GUEST_QPN))),
            owns
        ),
        GuestVerdict::Taken
    );
    assert!(b.take_to_host().is_empty());
    // The per-VM limit (2): one connection is live; a second is taken, a
    // third is rejected to the guest without reaching the host.
    b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(20, GUEST_QPN + 1))),
        owns,
    );
    assert_eq!(b.take_to_host().len(), 1);
    let v = b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(21, GUEST_QPN + 2))),
        owns,
    );
    assert!(matches!(v, GuestVerdict::Dropped(_)));
    assert!(b.take_to_host().is_empty());
    let CmMessage::Rej(r) = parse(&b.take_to_guest()[0]) else {
        panic!("not a REJ")
    };
    assert_eq!(r.reason, rej_reason::NO_RESOURCES);
    // The VM goes: both connections are released on the host.
    b.vm_gone(VM);
    let acts = b.take_to_host();
    assert!(acts.contains(&ToHost::Destroy { key }), "{acts:?}");
    assert_eq!(
        acts.iter()
            .filter(|a| matches!(a, ToHost::Destroy { .. }))
            .count(),
        2
    );
    assert_eq!(b.conns_of(VM), 0);
    // Events for released connections change nothing.
    b.host_event(ev(key, HostKind::Disconnected));
    assert!(b.take_to_host().is_empty() && b.take_to_guest().is_empty());
}

/// The passive side's binding before the guest's REP: the guest's
/// `rdma_cm` moves its QP to RTR and RTS before it answers, so `MODIFY_QP`
/// finds the connection by its peer; only that peer, only for its VM.
#[test]
fn a_passive_qp_is_bound_before_the_guest_answers() {
    let mut b = bridge();
    let lkey = b.listen(VM, 7174).unwrap_or_else(|o| panic!("{o}"));
    b.take_to_host();
    let mut req = ev(lkey, HostKind::ConnectRequest);
    req.new_key = Some(900);
    req.peer = Some(SocketAddr::new(IpAddr::V4(PEER_IP), 51000));
    req.peer_gid = PEER;
    req.qp = Some(qp());
    req.conn.qp_num = PEER_QPN;
    b.host_event(req);
    assert_eq!(b.take_to_guest().len(), 1, "the REQ");
    assert!(b.binding(VM, GUEST_QPN).is_none(), "no QP named yet");
    let found = b.binding_for(VM, GUEST_QPN, PEER_QPN, PEER);
    assert_eq!(
        found.map(|x| (x.dest_qpn, x.sq_psn)),
        Some((PEER_QPN, 0xdef))
    );
    assert!(b.binding_for(VM, GUEST_QPN, PEER_QPN + 1, PEER).is_none());
    assert!(b.binding_for(VM, GUEST_QPN, PEER_QPN, HOST).is_none());
    assert!(b.binding_for(VM + 1, GUEST_QPN, PEER_QPN, PEER).is_none());
}

/// A destroyed QP releases its own connections (the peer hears a DREQ),
/// not the VM's others; closing a VM's listeners frees their ports.
#[test]
fn a_destroyed_qp_and_closed_listeners_release_what_they_hold() {
    let mut b = bridge();
    let (key, ours) = active_to_rep(&mut b);
    let rtu = Rtu {
        local_comm_id: 5,
        remote_comm_id: ours,
        private_data: Vec::new(),
    };
    b.guest_mad(VM, PEER, &mad(CmMessage::Rtu(rtu)), owns);
    b.take_to_host();
    b.qp_gone(VM, GUEST_QPN + 1);
    b.qp_gone(VM + 1, GUEST_QPN);
    assert!(b.take_to_host().is_empty(), "other QPs hold nothing");
    b.qp_gone(VM, GUEST_QPN);
    assert_eq!(
        b.take_to_host(),
        [ToHost::Disconnect { key }, ToHost::Destroy { key }]
    );
    assert_eq!(b.conns_of(VM), 0);
    assert!(b.binding(VM, GUEST_QPN).is_none());

    let l1 = b.listen(VM, 4420).unwrap_or_else(|o| panic!("{o}"));
    let l2 = b.listen(VM, 7174).unwrap_or_else(|o| panic!("{o}"));
    b.take_to_host();
    assert_eq!(b.ports_of(VM), [4420, 7174]);
    b.unlisten(VM + 1);
    assert!(b.take_to_host().is_empty());
    b.unlisten(VM);
    assert_eq!(
        b.take_to_host(),
        [ToHost::Destroy { key: l1 }, ToHost::Destroy { key: l2 }]
    );
    assert!(b.ports_of(VM).is_empty());
    assert!(b.listen(VM + 1, 4420).is_ok(), "the port is free again");
}

/// `cm_connections` per VM: one VM's limit is not another's.
#[test]
fn connection_limits_are_per_vm() {
    let mut b = bridge();
    b.set_conn_limit(VM, 1);
    let first = b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(1, GUEST_QPN))),
        owns,
    );
    assert_eq!(first, GuestVerdict::Taken);
    let second = b.guest_mad(
        VM,
        PEER,
        &mad(CmMessage::Req(guest_req(2, GUEST_QPN + 1))),
        owns,
    );
    assert!(matches!(second, GuestVerdict::Dropped(_)));
    let other = VM + 1;
    for comm in [3, 4] {
        let v = b.guest_mad(
            other,
            PEER,
            &mad(CmMessage::Req(guest_req(comm, GUEST_QPN))),
            owns,
        );
        assert_eq!(v, GuestVerdict::Taken, "the default limit (2)");
    }
    assert_eq!((b.conns_of(VM), b.conns_of(other)), (1, 2));
}
