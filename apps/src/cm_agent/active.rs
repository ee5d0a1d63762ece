//! The active side: REQ (retransmitted; an MRA lengthens the wait) until
//! the REP, the QP to RTR and RTS with its values, RTU.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ib_cm_wire::cm::{transport, which};
use ib_cm_wire::cma::{self, CmaHeader};
use ib_cm_wire::{CmMessage, Path, Req, Rtu};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{Qp, RcConnect};

use super::{
    mtu, new_tid, random_u32, CmError, CmPort, ConnParam, Connection, ACK_TIMEOUT,
    CM_RESPONSE_TIMEOUT,
};
use crate::gsi_port::ip_gid;

impl CmPort<'_> {
    /// Connects RC `qp` (in RESET or INIT, of [`CmPort::pd`]'s device) to the
    /// rdma_cm listener at `peer`:`port`.
    pub fn connect(
        &mut self,
        qp: &Qp,
        peer: IpAddr,
        port: u16,
        param: &ConnParam,
    ) -> Result<Connection, CmError> {
        let peer_gid = ip_gid(peer);
        let hdr = CmaHeader {
            src_port: u16::try_from(random_u32() % 28_000 + 32_768).unwrap_or(40_000),
            src: self.ip(),
            dst: peer,
        };
        let comm_id = random_u32();
        let tid = new_tid(comm_id);
        let psn = random_u32() & 0xff_ffff;
        let port_mtu = self.dev.port_attr().active_mtu;
        let req = Req {
            local_comm_id: comm_id,
            service_id: cma::service_id(cma::ps::TCP, port),
            local_qpn: qp.qpn(),
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            remote_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            transport_service_type: transport::RC,
            end_to_end_flow_control: true,
            starting_psn: psn,
            local_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            retry_count: param.retry_count,
            partition_key: 0xffff,
            path_mtu: mtu(5, port_mtu) as u8,
            rnr_retry_count: param.rnr_retry_count,
            max_cm_retries: u8::try_from(self.timers.max_sends.min(15)).unwrap_or(15),
            primary: Path {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: self.sgid,
                remote_gid: peer_gid,
                hop_limit: 64,
                local_ack_timeout: ACK_TIMEOUT,
                ..Path::default()
            },
            private_data: hdr
                .with_user_data(&param.private_data)
                .map_err(|e| CmError::Other(e.to_string()))?,
            ..Req::default()
        };
        let mut sends = 0;
        let rep = 'exchange: loop {
            if sends == self.timers.max_sends {
                return Err(CmError::Timeout { what: "REQ", sends });
            }
            self.send(peer_gid, CmMessage::Req(req.clone()), tid)?;
            sends += 1;
            let mut deadline = Instant::now() + self.timers.response_wait;
            while let Some(m) = self.next(deadline)? {
                // Only answers to this REQ: from its peer, in its transaction.
                let ours = |remote_comm_id: u32| {
                    m.from == peer_gid && m.tid == tid && remote_comm_id == comm_id
                };
                match m.msg {
                    CmMessage::Rep(rep) if ours(rep.remote_comm_id) && rep.local_qpn > 1 => {
                        break 'exchange rep;
                    }
                    CmMessage::Rej(rej) if ours(rej.remote_comm_id) => {
                        return Err(CmError::Rejected { reason: rej.reason });
                    }
                    CmMessage::Mra(mra)
                        if ours(mra.remote_comm_id) && mra.message_mraed == which::REQ =>
                    {
                        // The peer needs longer: 4.096 µs × 2^timeout more.
                        let t = 4096u64 << u32::from(mra.service_timeout.min(31));
                        deadline =
                            Instant::now() + self.timers.response_wait + Duration::from_nanos(t);
                    }
                    other => self.stray(m.from, m.tid, &other),
                }
            }
        };
        let mut c = RcConnect::new(rep.local_qpn, peer_gid);
        c.sgid_index = Some(self.sgid_index);
        c.path_mtu = mtu(req.path_mtu, port_mtu);
        c.rq_psn = rep.starting_psn;
        c.sq_psn = psn;
        // What the peer accepts as responder bounds what this side issues.
        c.max_rd_atomic = u32::from(param.initiator_depth.min(rep.responder_resources));
        c.max_dest_rd_atomic = u32::from(param.responder_resources);
        c.timeout = u32::from(ACK_TIMEOUT);
        c.retry_cnt = u32::from(param.retry_count);
        c.rnr_retry = u32::from(rep.rnr_retry_count);
        qp.rc_connect(
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
            &c,
        )?;
        self.send(
            peer_gid,
            CmMessage::Rtu(Rtu {
                local_comm_id: comm_id,
                remote_comm_id: rep.local_comm_id,
                private_data: Vec::new(),
            }),
            tid,
        )?;
        self.known.push((peer_gid, rep.local_comm_id));
        Ok(Connection {
            local_comm_id: comm_id,
            remote_comm_id: rep.local_comm_id,
            peer_gid,
            remote_qpn: rep.local_qpn,
            private_data: rep.private_data,
        })
    }
}
