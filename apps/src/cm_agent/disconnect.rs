//! Disconnection: DREQ (retransmitted) until the DREP; a DREQ answered
//! with a DREP.

use std::time::Instant;

use ib_cm_wire::{CmMessage, Drep, Dreq};
use virtio_rdma_driver::Qp;

use super::{new_tid, BoxError, CmError, CmPort, Connection};

impl CmPort<'_> {
    /// Disconnects `conn` of `qp`: DREQ until the DREP; the QP goes to ERR.
    pub fn disconnect(&mut self, qp: &Qp, conn: &Connection) -> Result<(), CmError> {
        qp.to_error()?;
        let dreq = Dreq {
            local_comm_id: conn.local_comm_id,
            remote_comm_id: conn.remote_comm_id,
            remote_qpn: conn.remote_qpn,
            private_data: Vec::new(),
        };
        let tid = new_tid(conn.local_comm_id);
        for _ in 0..self.timers.max_sends {
            self.send(conn.peer_gid, CmMessage::Dreq(dreq.clone()), tid)?;
            let deadline = Instant::now() + self.timers.response_wait;
            while let Some(m) = self.next(deadline)? {
                let ours = m.from == conn.peer_gid;
                match m.msg {
                    CmMessage::Drep(d)
                        if ours && m.tid == tid && d.remote_comm_id == conn.local_comm_id =>
                    {
                        return Ok(());
                    }
                    // Both sides disconnecting at once: answer, and that is it.
                    CmMessage::Dreq(d) if ours && d.remote_comm_id == conn.local_comm_id => {
                        self.answer_dreq(conn, m.tid)?;
                        return Ok(());
                    }
                    other => self.stray(m.from, m.tid, &other),
                }
            }
        }
        Err(CmError::Timeout {
            what: "DREQ",
            sends: self.timers.max_sends,
        })
    }

    /// Looks for the peer's DREQ of `conn` until `deadline`: answers it
    /// with a DREP and moves `qp` to ERR; true if it came.
    pub fn poll_dreq(
        &mut self,
        qp: &Qp,
        conn: &Connection,
        deadline: Instant,
    ) -> Result<bool, CmError> {
        while let Some(m) = self.next(deadline)? {
            match m.msg {
                CmMessage::Dreq(d)
                    if m.from == conn.peer_gid
                        && d.remote_comm_id == conn.local_comm_id
                        && d.local_comm_id == conn.remote_comm_id =>
                {
                    qp.to_error()?;
                    self.answer_dreq(conn, m.tid)?;
                    return Ok(true);
                }
                // A duplicate RTU or REQ retransmission means nothing now.
                other => self.stray(m.from, m.tid, &other),
            }
        }
        Ok(false)
    }

    /// The DREP of `conn` to a DREQ of transaction `tid`.
    fn answer_dreq(&self, conn: &Connection, tid: u64) -> Result<(), BoxError> {
        self.send(
            conn.peer_gid,
            CmMessage::Drep(Drep {
                local_comm_id: conn.local_comm_id,
                remote_comm_id: conn.remote_comm_id,
                private_data: Vec::new(),
            }),
            tid,
        )
    }
}
