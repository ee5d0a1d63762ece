//! The passive side: a REQ for the port listened on (any other rejected),
//! the QP to RTR and RTS with its values, the REP (retransmitted) until
//! the RTU.

use std::time::{Duration, Instant};

use ib_cm_wire::cm::{rej_reason, transport, which};
use ib_cm_wire::cma::{self, CmaHeader};
use ib_cm_wire::{CmMessage, Rep};
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{Qp, RcConnect};

use super::{mtu, random_u32, CmError, CmPort, ConnParam, Connection};

impl CmPort<'_> {
    /// Waits up to `timeout` for a connection request to `port` and
    /// connects RC `qp` (in RESET or INIT) to it.
    pub fn accept(
        &mut self,
        qp: &Qp,
        port: u16,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<Connection, CmError> {
        let wanted = cma::service_id(cma::ps::TCP, port);
        let until = Instant::now() + timeout;
        let (from, tid, req) = loop {
            let Some(m) = self.next(until)? else {
                return Err(CmError::Other(format!(
                    "no connection request for port {port} within {timeout:?}"
                )));
            };
            match m.msg {
                CmMessage::Req(req) if req.service_id == wanted => {
                    if self.known.contains(&(m.from, req.local_comm_id)) {
                        // A retransmission of a connection already made.
                        self.dropped += 1;
                        continue;
                    }
                    if req.transport_service_type != transport::RC
                        || req.local_qpn <= 1
                        || CmaHeader::parse(&req.private_data).is_err()
                    {
                        self.reject(m.from, m.tid, &req, rej_reason::CONSUMER_DEFINED)?;
                        continue;
                    }
                    break (m.from, m.tid, req);
                }
                other => self.stray(m.from, m.tid, &other),
            }
        };
        let user = req
            .private_data
            .get(cma::CMA_HEADER_SIZE..)
            .unwrap_or_default()
            .to_vec();
        let comm_id = random_u32();
        let psn = random_u32() & 0xff_ffff;
        let port_mtu = self.dev.port_attr().active_mtu;
        let mut c = RcConnect::new(req.local_qpn, from);
        c.sgid_index = Some(self.sgid_index);
        c.path_mtu = mtu(req.path_mtu, port_mtu);
        c.rq_psn = req.starting_psn;
        c.sq_psn = psn;
        let responder = param.responder_resources.min(req.initiator_depth);
        let initiator = param.initiator_depth.min(req.responder_resources);
        c.max_dest_rd_atomic = u32::from(responder);
        c.max_rd_atomic = u32::from(initiator);
        c.timeout = u32::from(req.primary.local_ack_timeout.max(1));
        c.retry_cnt = u32::from(req.retry_count);
        c.rnr_retry = u32::from(param.rnr_retry_count);
        qp.rc_connect(
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
            &c,
        )?;
        let rep = Rep {
            local_comm_id: comm_id,
            remote_comm_id: req.local_comm_id,
            local_qpn: qp.qpn(),
            starting_psn: psn,
            responder_resources: responder,
            initiator_depth: initiator,
            target_ack_delay: 15,
            end_to_end_flow_control: true,
            rnr_retry_count: param.rnr_retry_count,
            private_data: param.private_data.clone(),
            ..Rep::default()
        };
        let mut sends = 0;
        'rtu: loop {
            if sends == self.timers.max_sends {
                return Err(CmError::Timeout { what: "REP", sends });
            }
            self.send(from, CmMessage::Rep(rep.clone()), tid)?;
            sends += 1;
            let mut deadline = Instant::now() + self.timers.response_wait;
            while let Some(m) = self.next(deadline)? {
                let ours = |remote_comm_id: u32| {
                    m.from == from && m.tid == tid && remote_comm_id == comm_id
                };
                match m.msg {
                    CmMessage::Rtu(rtu) if ours(rtu.remote_comm_id) => break 'rtu,
                    CmMessage::Rej(rej) if ours(rej.remote_comm_id) => {
                        return Err(CmError::Rejected { reason: rej.reason });
                    }
                    CmMessage::Mra(mra)
                        if ours(mra.remote_comm_id) && mra.message_mraed == which::REP =>
                    {
                        let t = 4096u64 << u32::from(mra.service_timeout.min(31));
                        deadline =
                            Instant::now() + self.timers.response_wait + Duration::from_nanos(t);
                    }
                    // The peer did not see the REP: it sends its REQ again.
                    CmMessage::Req(r)
                        if m.from == from
                            && m.tid == tid
                            && r.local_comm_id == req.local_comm_id =>
                    {
                        continue 'rtu;
                    }
                    other => self.stray(m.from, m.tid, &other),
                }
            }
        }
        self.known.push((from, req.local_comm_id));
        Ok(Connection {
            local_comm_id: comm_id,
            remote_comm_id: req.local_comm_id,
            peer_gid: from,
            remote_qpn: req.local_qpn,
            private_data: user,
        })
    }
}
