//! A probe of the GSI QP across hosts (`rdma-peer cm-probe`): one CM
//! exchange, a REQ answered by a REJ, between the GSI QPs of two VMs on
//! daemons of two hosts — on the `verbs` transport through each daemon's CM
//! bridge and the hosts' `rdma_cm`. Not a connection manager: it checks
//! that the device offers `F_GSI`, that QP 1 reaches RTS, and that MADs
//! get through both ways with their GRH, without connecting any QP.
//!
//! The server's VM listens (its daemon has `cm_listen` for the port): it
//! takes the REQ that the client's REQ becomes on its host, checks it and
//! rejects it ("consumer defined", private data [`REJ_DATA`]); the client
//! checks that the REJ names its REQ and carries that reason and data.

use std::net::IpAddr;
use std::time::Duration;

use ib_cm_wire::cm::{rej_reason, transport, which};
use ib_cm_wire::cma::{self, CmaHeader};
use ib_cm_wire::{CmMessage, Path, Rej, Req};
use virtio_rdma_apps::oob::Oob;
use virtio_rdma_driver::{Device, Qp, QpInit};

use virtio_rdma_apps::gsi_port::{gid_ip, ip_gid, Gsi};

type BoxError = Box<dyn std::error::Error>;

/// The user's private data of the probe's REQ.
pub const REQ_DATA: &[u8] = b"cm-probe";
/// The private data of the server's REJ.
pub const REJ_DATA: &[u8] = b"cm-probe-rej";
/// Opens QP 1 and tells the peer over `oob` whether it could, hearing the
/// same from it: a failure on either side stops both at once (their next
/// steps stay paired).
fn open_both(dev: &Device, oob: &mut dyn Oob, timeout: Duration) -> Result<Gsi, BoxError> {
    let mine = Gsi::open(dev);
    match &mine {
        Ok(_) => {
            println!("rdma-peer: cm-probe: F_GSI offered, QP 1 in RTS");
            oob.send("cm-probe ready")?
        }
        Err(e) => oob.send(&format!("cm-probe failed: {e}"))?,
    }
    let theirs = oob.recv(timeout)?;
    let g = mine?;
    match theirs {
        Some(m) if m == "cm-probe ready" => Ok(g),
        other => Err(format!("the peer: {other:?}").into()),
    }
}

/// The server's side: takes one REQ for `port` and rejects it.
pub fn server(
    dev: &Device,
    port: u16,
    oob: &mut dyn Oob,
    timeout: Duration,
) -> Result<(), BoxError> {
    let g = open_both(dev, oob, timeout)?;
    let (grh, msg) = g.receive(timeout)?;
    let CmMessage::Req(req) = msg else {
        return Err(format!("expected a REQ, got {msg:?}").into());
    };
    if req.service_id != cma::service_id(cma::ps::TCP, port) {
        return Err(format!("REQ for service {:#x}, not port {port}", req.service_id).into());
    }
    let hdr = CmaHeader::parse(&req.private_data).map_err(|e| format!("REQ: {e}"))?;
    let user = req
        .private_data
        .get(cma::CMA_HEADER_SIZE..)
        .unwrap_or_default();
    if hdr.src != gid_ip(grh.sgid) || hdr.dst != gid_ip(dev.gid()) || !user.starts_with(REQ_DATA) {
        return Err(format!("REQ from {}: {hdr:?}, data {user:?}", gid_ip(grh.sgid)).into());
    }
    if req.primary.local_gid != grh.sgid || req.primary.remote_gid != dev.gid() {
        return Err(format!("REQ's path {:?}", req.primary).into());
    }
    println!(
        "rdma-peer: cm-probe: REQ for port {port} from {} (QP {:#x})",
        hdr.src, req.local_qpn
    );
    let rej = Rej {
        local_comm_id: 0x5eed_0001,
        remote_comm_id: req.local_comm_id,
        message_rejected: which::REQ,
        reason: rej_reason::CONSUMER_DEFINED,
        ari: Vec::new(),
        private_data: REJ_DATA.to_vec(),
    };
    let mad = CmMessage::Rej(rej).emit(0x0c0f_fee0)?;
    g.send(dev, grh.sgid, &mad, timeout)?;
    println!("rdma-peer: cm-probe ok (REQ taken, REJ sent)");
    Ok(())
}

/// The client's side: sends a REQ for `port` at `peer` (an IP address of
/// the server's host) and expects the server's REJ.
pub fn client(
    dev: &Device,
    peer: IpAddr,
    port: u16,
    oob: &mut dyn Oob,
    timeout: Duration,
) -> Result<(), BoxError> {
    let g = open_both(dev, oob, timeout)?;
    // A REQ names an RC QP of the VM (it is never connected).
    let rc = Qp::create(&g.pd, &QpInit::rc(&g.cq))?;
    let peer_gid = ip_gid(peer);
    let me = gid_ip(dev.gid());
    let hdr = CmaHeader {
        src_port: 40_000,
        src: me,
        dst: peer,
    };
    let comm_id = 0x0c1e_0001;
    let req = Req {
        local_comm_id: comm_id,
        service_id: cma::service_id(cma::ps::TCP, port),
        local_qpn: rc.qpn(),
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 20,
        transport_service_type: transport::RC,
        end_to_end_flow_control: true,
        starting_psn: 0x123,
        local_cm_response_timeout: 20,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        primary: Path {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: dev.gid(),
            remote_gid: peer_gid,
            hop_limit: 64,
            local_ack_timeout: 18,
            ..Path::default()
        },
        private_data: hdr.with_user_data(REQ_DATA).map_err(|e| format!("{e}"))?,
        ..Req::default()
    };
    let mad = CmMessage::Req(req).emit(0x0c0f_fee1)?;
    g.send(dev, peer_gid, &mad, timeout)?;
    let (grh, msg) = g.receive(timeout)?;
    let CmMessage::Rej(rej) = msg else {
        return Err(format!("expected a REJ, got {msg:?}").into());
    };
    if grh.sgid != peer_gid {
        return Err(format!("the REJ comes from {}, not {peer}", gid_ip(grh.sgid)).into());
    }
    if rej.remote_comm_id != comm_id || rej.message_rejected != which::REQ {
        return Err(format!("the REJ does not answer the REQ: {rej:?}").into());
    }
    println!("rdma-peer: cm-probe: REJ reason {}", rej.reason);
    if rej.reason != rej_reason::CONSUMER_DEFINED || !rej.private_data.starts_with(REJ_DATA) {
        return Err(format!(
            "not the server's REJ: reason {}, data {:?}",
            rej.reason,
            rej.private_data.escape_ascii().to_string()
        )
        .into());
    }
    drop(rc);
    println!("rdma-peer: cm-probe ok (REQ across hosts answered by the server's REJ)");
    Ok(())
}
