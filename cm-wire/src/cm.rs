//! The CM messages (IBTA 12.6): connection establishment (REQ, MRA, REJ,
//! REP, RTU) and release (DREQ, DREP). Offsets are from the start of the
//! MAD; the message data starts after the 24-byte MAD header.

use crate::bits::{bits_at, bytes, put, put_bits, put_u24, u16_at, u24_at, u32_at, u64_at, u8_at};
use crate::mad::{attr, method, MadHeader, MAD_HEADER_SIZE, MAD_SIZE};
use crate::Error;

/// Start of the message data in the MAD.
const D: usize = MAD_HEADER_SIZE;

/// Private data bytes of each message.
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
}

/// Bytes of a REJ's additional rejection information.
pub const REJ_ARI_LEN: usize = 72;

/// `transport_service_type` of a REQ.
pub mod transport {
    /// Reliable connection.
    pub const RC: u8 = 0;
    /// Unreliable connection.
    pub const UC: u8 = 1;
}

/// Rejection reasons (IBTA table 109) a bridge or a test produces.
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// The peer did not answer in time.
    pub const TIMEOUT: u16 = 4;
    /// Nobody listens on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// The connection is stale.
    pub const STALE_CONN: u16 = 10;
    /// Rejected by the consumer (rdma_cm's `rdma_reject`).
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// `message_rejected` / `message_mraed`: which message a REJ or MRA answers.
pub mod which {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Something else (REJ only).
    pub const OTHER: u8 = 2;
}

/// One path of a REQ (44 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path {
    /// Local port LID (0xffff, "permissive", on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// GID of the sender's port.
    pub local_gid: [u8; 16],
    /// GID of the receiver's port.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Static rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Whether the path stays in the subnet.
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits).
    pub local_ack_timeout: u8,
}

impl Path {
    fn parse(b: &[u8], at: usize) -> Path {
        Path {
            local_lid: u16_at(b, at),
            remote_lid: u16_at(b, at + 2),
            local_gid: bytes(b, at + 4),
            remote_gid: bytes(b, at + 20),
            flow_label: u32_at(b, at + 36) >> 12,
            packet_rate: bits_at(b, at + 39, 2, 6),
            traffic_class: u8_at(b, at + 40),
            hop_limit: u8_at(b, at + 41),
            sl: bits_at(b, at + 42, 0, 4),
            subnet_local: bits_at(b, at + 42, 4, 1) != 0,
            local_ack_timeout: bits_at(b, at + 43, 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8], at: usize) {
        put(b, at, &self.local_lid.to_be_bytes());
        put(b, at + 2, &self.remote_lid.to_be_bytes());
        put(b, at + 4, &self.local_gid);
        put(b, at + 20, &self.remote_gid);
        // Flow label in the top 20 bits; the 6 reserved bits after it zero.
        put(
            b,
            at + 36,
            &((self.flow_label & 0xf_ffff) << 12).to_be_bytes(),
        );
        put_bits(b, at + 39, 2, 6, self.packet_rate);
        put(b, at + 40, &[self.traffic_class, self.hop_limit]);
        put_bits(b, at + 42, 0, 4, self.sl);
        put_bits(b, at + 42, 4, 1, u8::from(self.subnet_local));
        put_bits(b, at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// A connection request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Req {
    /// The requester's communication ID.
    pub local_comm_id: u32,
    /// Service the request is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// GUID of the requester's CA.
    pub local_ca_guid: u64,
    /// Q_Key (UD only).
    pub local_qkey: u32,
    /// The requester's QP number (24 bits).
    pub local_qpn: u32,
    /// RDMA READ / atomic requests the requester accepts as responder.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the requester will have outstanding.
    pub initiator_depth: u8,
    /// CM response timeout the requester asks of the remote (5 bits).
    pub remote_cm_response_timeout: u8,
    /// [`transport`] type (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The requester's first send PSN (24 bits).
    pub starting_psn: u32,
    /// The requester's own CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub partition_key: u16,
    /// Path MTU, IB encoding (4 bits).
    pub path_mtu: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The requester's QP uses an SRQ.
    pub srq: bool,
    /// The primary path.
    pub primary: Path,
    /// The alternate path (all zero when there is none).
    pub alternate: Path,
    /// Private data, at most [`private_len::REQ`] bytes.
    pub private_data: Vec<u8>,
}

/// Acknowledgement that a message arrived and its answer will take long.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged ([`which`]).
    pub message_mraed: u8,
    /// Service timeout exponent (5 bits).
    pub service_timeout: u8,
    /// Private data, at most [`private_len::MRA`] bytes.
    pub private_data: Vec<u8>,
}

/// A rejection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when rejecting a REQ unseen).
    pub remote_comm_id: u32,
    /// Which message is rejected ([`which`]).
    pub message_rejected: u8,
    /// Why ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information, at most [`REJ_ARI_LEN`] bytes.
    pub ari: Vec<u8>,
    /// Private data, at most [`private_len::REJ`] bytes.
    pub private_data: Vec<u8>,
}

/// The reply to a REQ.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rep {
    /// The replier's communication ID.
    pub local_comm_id: u32,
    /// The requester's communication ID.
    pub remote_comm_id: u32,
    /// Q_Key (UD only).
    pub local_qkey: u32,
    /// The replier's QP number (24 bits).
    pub local_qpn: u32,
    /// The replier's first send PSN (24 bits).
    pub starting_psn: u32,
    /// RDMA READ / atomic requests the replier accepts as responder.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the replier will have outstanding.
    pub initiator_depth: u8,
    /// The replier's ACK delay exponent (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// The replier's QP uses an SRQ.
    pub srq: bool,
    /// GUID of the replier's CA.
    pub local_ca_guid: u64,
    /// Private data, at most [`private_len::REP`] bytes.
    pub private_data: Vec<u8>,
}

/// Ready to use: the requester's QP is ready.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rtu {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, at most [`private_len::RTU`] bytes.
    pub private_data: Vec<u8>,
}

/// A disconnect request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP number (24 bits).
    pub remote_qpn: u32,
    /// Private data, at most [`private_len::DREQ`] bytes.
    pub private_data: Vec<u8>,
}

/// The reply to a DREQ.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, at most [`private_len::DREP`] bytes.
    pub private_data: Vec<u8>,
}

/// A CM message of one of the kinds this crate parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// Connection request.
    Req(Req),
    /// Message receipt acknowledgement.
    Mra(Mra),
    /// Reject.
    Rej(Rej),
    /// Reply.
    Rep(Rep),
    /// Ready to use.
    Rtu(Rtu),
    /// Disconnect request.
    Dreq(Dreq),
    /// Disconnect reply.
    Drep(Drep),
}

/// Reads `len` bytes at `off` as private data.
fn private(b: &[u8], off: usize, len: usize) -> Vec<u8> {
    off.checked_add(len)
        .and_then(|end| b.get(off..end))
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// Writes `data` at `off`, refusing more than `max` bytes; the rest of the
/// area stays zero.
fn put_private(b: &mut [u8], off: usize, max: usize, data: &[u8]) -> Result<(), Error> {
    if data.len() > max {
        return Err(Error::BadField("private_data"));
    }
    put(b, off, data);
    Ok(())
}

impl CmMessage {
    /// The MAD attribute ID of the message.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
        }
    }

    /// Parses a whole MAD: its header must be a CM `Send` of class version
    /// 2, and its attribute one of the messages above.
    pub fn parse(mad: &[u8]) -> Result<(MadHeader, CmMessage), Error> {
        if mad.len() < MAD_SIZE {
            return Err(Error::Truncated {
                need: MAD_SIZE,
                got: mad.len(),
            });
        }
        let h = MadHeader::parse(mad)?;
        if !h.is_cm() {
            return Err(Error::NotCm {
                class: h.mgmt_class,
                version: h.class_version,
            });
        }
        if h.method != method::SEND {
            return Err(Error::BadField("method"));
        }
        let b = mad;
        let msg = match h.attr_id {
            attr::REQ => CmMessage::Req(Req {
                local_comm_id: u32_at(b, D),
                service_id: u64_at(b, D + 8),
                local_ca_guid: u64_at(b, D + 16),
                local_qkey: u32_at(b, D + 28),
                local_qpn: u24_at(b, D + 32),
                responder_resources: u8_at(b, D + 35),
                initiator_depth: u8_at(b, D + 39),
                remote_cm_response_timeout: bits_at(b, D + 43, 0, 5),
                transport_service_type: bits_at(b, D + 43, 5, 2),
                end_to_end_flow_control: bits_at(b, D + 43, 7, 1) != 0,
                starting_psn: u24_at(b, D + 44),
                local_cm_response_timeout: bits_at(b, D + 47, 0, 5),
                retry_count: bits_at(b, D + 47, 5, 3),
                partition_key: u16_at(b, D + 48),
                path_mtu: bits_at(b, D + 50, 0, 4),
                rnr_retry_count: bits_at(b, D + 50, 5, 3),
                max_cm_retries: bits_at(b, D + 51, 0, 4),
                srq: bits_at(b, D + 51, 4, 1) != 0,
                primary: Path::parse(b, D + 52),
                alternate: Path::parse(b, D + 96),
                private_data: private(b, D + 140, private_len::REQ),
            }),
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: u32_at(b, D),
                remote_comm_id: u32_at(b, D + 4),
                message_mraed: bits_at(b, D + 8, 0, 2),
                service_timeout: bits_at(b, D + 9, 0, 5),
                private_data: private(b, D + 10, private_len::MRA),
            }),
            attr::REJ => {
                let ari_len = usize::from(bits_at(b, D + 9, 0, 7));
                if ari_len > REJ_ARI_LEN {
                    return Err(Error::BadField("rejected_info_length"));
                }
                CmMessage::Rej(Rej {
                    local_comm_id: u32_at(b, D),
                    remote_comm_id: u32_at(b, D + 4),
                    message_rejected: bits_at(b, D + 8, 0, 2),
                    reason: u16_at(b, D + 10),
                    ari: private(b, D + 12, ari_len),
                    private_data: private(b, D + 84, private_len::REJ),
                })
            }
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: u32_at(b, D),
                remote_comm_id: u32_at(b, D + 4),
                local_qkey: u32_at(b, D + 8),
                local_qpn: u24_at(b, D + 12),
                starting_psn: u24_at(b, D + 20),
                responder_resources: u8_at(b, D + 24),
                initiator_depth: u8_at(b, D + 25),
                target_ack_delay: bits_at(b, D + 26, 0, 5),
                failover_accepted: bits_at(b, D + 26, 5, 2),
                end_to_end_flow_control: bits_at(b, D + 26, 7, 1) != 0,
                rnr_retry_count: bits_at(b, D + 27, 0, 3),
                srq: bits_at(b, D + 27, 3, 1) != 0,
                local_ca_guid: u64_at(b, D + 28),
                private_data: private(b, D + 36, private_len::REP),
            }),
            attr::RTU => CmMessage::Rtu(Rtu {
                local_comm_id: u32_at(b, D),
                remote_comm_id: u32_at(b, D + 4),
                private_data: private(b, D + 8, private_len::RTU),
            }),
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: u32_at(b, D),
                remote_comm_id: u32_at(b, D + 4),
                remote_qpn: u24_at(b, D + 8),
                private_data: private(b, D + 12, private_len::DREQ),
            }),
            attr::DREP => CmMessage::Drep(Drep {
                local_comm_id: u32_at(b, D),
                remote_comm_id: u32_at(b, D + 4),
                private_data: private(b, D + 8, private_len::DREP),
            }),
            other => return Err(Error::UnknownAttribute(other)),
        };
        Ok((h, msg))
    }

    /// The whole MAD of this message in transaction `tid`; every byte the
    /// message does not set is zero. Fails when private data or the REJ's
    /// additional information is longer than the message holds.
    pub fn emit(&self, tid: u64) -> Result<[u8; MAD_SIZE], Error> {
        let mut b = [0u8; MAD_SIZE];
        MadHeader::cm(self.attr_id(), tid).emit(&mut b);
        match self {
            CmMessage::Req(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 8, &m.service_id.to_be_bytes());
                put(&mut b, D + 16, &m.local_ca_guid.to_be_bytes());
                put(&mut b, D + 28, &m.local_qkey.to_be_bytes());
                put_u24(&mut b, D + 32, m.local_qpn);
                put(&mut b, D + 35, &[m.responder_resources]);
                put(&mut b, D + 39, &[m.initiator_depth]);
                put_bits(&mut b, D + 43, 0, 5, m.remote_cm_response_timeout);
                put_bits(&mut b, D + 43, 5, 2, m.transport_service_type);
                put_bits(&mut b, D + 43, 7, 1, u8::from(m.end_to_end_flow_control));
                put_u24(&mut b, D + 44, m.starting_psn);
                put_bits(&mut b, D + 47, 0, 5, m.local_cm_response_timeout);
                put_bits(&mut b, D + 47, 5, 3, m.retry_count);
                put(&mut b, D + 48, &m.partition_key.to_be_bytes());
                put_bits(&mut b, D + 50, 0, 4, m.path_mtu);
                put_bits(&mut b, D + 50, 5, 3, m.rnr_retry_count);
                put_bits(&mut b, D + 51, 0, 4, m.max_cm_retries);
                put_bits(&mut b, D + 51, 4, 1, u8::from(m.srq));
                m.primary.emit(&mut b, D + 52);
                m.alternate.emit(&mut b, D + 96);
                put_private(&mut b, D + 140, private_len::REQ, &m.private_data)?;
            }
            CmMessage::Mra(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put_bits(&mut b, D + 8, 0, 2, m.message_mraed);
                put_bits(&mut b, D + 9, 0, 5, m.service_timeout);
                put_private(&mut b, D + 10, private_len::MRA, &m.private_data)?;
            }
            CmMessage::Rej(m) => {
                if m.ari.len() > REJ_ARI_LEN {
                    return Err(Error::BadField("ari"));
                }
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put_bits(&mut b, D + 8, 0, 2, m.message_rejected);
                let ari_len = u8::try_from(m.ari.len()).unwrap_or(0);
                put_bits(&mut b, D + 9, 0, 7, ari_len);
                put(&mut b, D + 10, &m.reason.to_be_bytes());
                put(&mut b, D + 12, &m.ari);
                put_private(&mut b, D + 84, private_len::REJ, &m.private_data)?;
            }
            CmMessage::Rep(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put(&mut b, D + 8, &m.local_qkey.to_be_bytes());
                put_u24(&mut b, D + 12, m.local_qpn);
                put_u24(&mut b, D + 20, m.starting_psn);
                put(&mut b, D + 24, &[m.responder_resources, m.initiator_depth]);
                put_bits(&mut b, D + 26, 0, 5, m.target_ack_delay);
                put_bits(&mut b, D + 26, 5, 2, m.failover_accepted);
                put_bits(&mut b, D + 26, 7, 1, u8::from(m.end_to_end_flow_control));
                put_bits(&mut b, D + 27, 0, 3, m.rnr_retry_count);
                put_bits(&mut b, D + 27, 3, 1, u8::from(m.srq));
                put(&mut b, D + 28, &m.local_ca_guid.to_be_bytes());
                put_private(&mut b, D + 36, private_len::REP, &m.private_data)?;
            }
            CmMessage::Rtu(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put_private(&mut b, D + 8, private_len::RTU, &m.private_data)?;
            }
            CmMessage::Dreq(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put_u24(&mut b, D + 8, m.remote_qpn);
                put_private(&mut b, D + 12, private_len::DREQ, &m.private_data)?;
            }
            CmMessage::Drep(m) => {
                put(&mut b, D, &m.local_comm_id.to_be_bytes());
                put(&mut b, D + 4, &m.remote_comm_id.to_be_bytes());
                put_private(&mut b, D + 8, private_len::DREP, &m.private_data)?;
            }
        }
        Ok(b)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn full(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    fn path(seed: u8) -> Path {
        Path {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: [seed; 16],
            remote_gid: [seed.wrapping_add(1); 16],
            flow_label: 0xa_bcde,
            packet_rate: 0x2a,
            traffic_class: 0x88,
            hop_limit: 64,
            sl: 0xb,
            subnet_local: true,
            local_ack_timeout: 0x13,
        }
    }

    fn every_message() -> Vec<CmMessage> {
        vec![
            CmMessage::Req(Req {
                local_comm_id: 0x1122_3344,
                service_id: 0x0106_1c06,
                local_ca_guid: 0x0102_0304_0506_0708,
                local_qkey: 0,
                local_qpn: 0x12_3456,
                responder_resources: 4,
                initiator_depth: 3,
                remote_cm_response_timeout: 20,
                transport_service_type: transport::RC,
                end_to_end_flow_control: true,
                starting_psn: 0xab_cdef,
                local_cm_response_timeout: 21,
                retry_count: 7,
                partition_key: 0xffff,
                path_mtu: 3,
                rnr_retry_count: 6,
                max_cm_retries: 15,
                srq: true,
                primary: path(1),
                alternate: path(9),
                private_data: full(private_len::REQ, 1),
            }),
            CmMessage::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: which::REP,
                service_timeout: 31,
                private_data: full(private_len::MRA, 2),
            }),
            CmMessage::Rej(Rej {
                local_comm_id: 3,
                remote_comm_id: 4,
                message_rejected: which::OTHER,
                reason: rej_reason::CONSUMER_DEFINED,
                ari: full(REJ_ARI_LEN, 9),
                private_data: full(private_len::REJ, 3),
            }),
            CmMessage::Rep(Rep {
                local_comm_id: 5,
                remote_comm_id: 6,
                local_qkey: 7,
                local_qpn: 0xfe_dcba,
                starting_psn: 0x65_4321,
                responder_resources: 1,
                initiator_depth: 2,
                target_ack_delay: 15,
                failover_accepted: 3,
                end_to_end_flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                local_ca_guid: 0x1111_2222_3333_4444,
                private_data: full(private_len::REP, 4),
            }),
            CmMessage::Rtu(Rtu {
                local_comm_id: 8,
                remote_comm_id: 9,
                private_data: full(private_len::RTU, 5),
            }),
            CmMessage::Dreq(Dreq {
                local_comm_id: 10,
                remote_comm_id: 11,
                remote_qpn: 0x1_0203,
                private_data: full(private_len::DREQ, 6),
            }),
            CmMessage::Drep(Drep {
                local_comm_id: 12,
                remote_comm_id: 13,
                private_data: full(private_len::DREP, 7),
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in every_message() {
            let mad = m.emit(0x55).unwrap();
            let (h, back) = CmMessage::parse(&mad).unwrap();
            assert_eq!((h.tid, h.attr_id), (0x55, m.attr_id()));
            assert_eq!(back, m);
        }
    }

    /// Fields land where IBTA table 106 puts them (offsets from the start
    /// of the MAD: 24 + the table's byte offset).
    #[test]
    fn req_layout() {
        let CmMessage::Req(r) = &every_message()[0] else {
            unreachable!()
        };
        let mad = CmMessage::Req(r.clone()).emit(1).unwrap();
        assert_eq!(&mad[..4], &[1, 7, 2, 3]);
        assert_eq!(&mad[16..18], &[0, 0x10]);
        assert_eq!(&mad[24..28], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&mad[32..40], &[0, 0, 0, 0, 1, 6, 0x1c, 6]);
        assert_eq!(
            &mad[56..60],
            &[0x12, 0x34, 0x56, 4],
            "QPN, responder resources"
        );
        assert_eq!(mad[63], 3, "initiator depth");
        // remote CM timeout 20 (10100), RC (00), flow control (1).
        assert_eq!(mad[67], 0b1010_0001);
        assert_eq!(&mad[68..72], &[0xab, 0xcd, 0xef, (21 << 3) | 7]);
        // MTU 3, RDC 0, RNR retry 6; CM retries 15, SRQ, extended 0.
        assert_eq!(&mad[72..76], &[0xff, 0xff, 0x36, 0xf8]);
        assert_eq!(&mad[76..80], &[0xff, 0xff, 0xff, 0xff], "LIDs");
        assert_eq!(&mad[80..96], &[1; 16]);
        assert_eq!(&mad[96..112], &[2; 16]);
        assert_eq!(&mad[112..116], &[0xab, 0xcd, 0xe0, 0x2a]);
        assert_eq!(&mad[116..120], &[0x88, 64, 0xb8, 0x13 << 3]);
        assert_eq!(&mad[164..], &full(private_len::REQ, 1)[..]);
    }

    #[test]
    fn rep_layout() {
        let CmMessage::Rep(r) = &every_message()[3] else {
            unreachable!()
        };
        let mad = CmMessage::Rep(r.clone()).emit(1).unwrap();
        assert_eq!(&mad[36..40], &[0xfe, 0xdc, 0xba, 0], "QPN");
        assert_eq!(&mad[44..48], &[0x65, 0x43, 0x21, 0], "PSN");
        assert_eq!(
            &mad[48..52],
            &[1, 2, (15 << 3) | (3 << 1) | 1, (7 << 5) | (1 << 4)]
        );
        assert_eq!(&mad[52..60], &0x1111_2222_3333_4444u64.to_be_bytes());
    }

    #[test]
    fn what_is_refused() {
        let mad = every_message()[4].emit(1).unwrap();
        assert!(matches!(
            CmMessage::parse(&mad[..255]),
            Err(Error::Truncated {
                need: 256,
                got: 255
            })
        ));
        let mut other = mad;
        other[1] = 0x03; // the SA's class
        assert_eq!(
            CmMessage::parse(&other),
            Err(Error::NotCm {
                class: 3,
                version: 2
            })
        );
        let mut lap = mad;
        lap[17] = 0x19;
        assert_eq!(CmMessage::parse(&lap), Err(Error::UnknownAttribute(0x19)));
        let mut resp = mad;
        resp[3] = 0x83;
        assert_eq!(CmMessage::parse(&resp), Err(Error::BadField("method")));
        let mut rej = every_message()[2].emit(1).unwrap();
        rej[33] = 73 << 1;
        assert_eq!(
            CmMessage::parse(&rej),
            Err(Error::BadField("rejected_info_length"))
        );
        let long = CmMessage::Rtu(Rtu {
            private_data: vec![0; private_len::RTU + 1],
            ..Rtu::default()
        });
        assert_eq!(long.emit(1), Err(Error::BadField("private_data")));
    }
}
