//! What a front-end has configured on its connection, kept from the
//! messages as they pass the relay: enough to configure a fresh back-end
//! handler the same way (the hand-over's replay, [`super::rings`]).
//!
//! The record follows requests, not replies: a request the handler
//! refused without closing the connection (only with `REPLY_ACK`) is in
//! the record all the same. A front-end that does that gets a replay its
//! handler would have refused too; the replay then fails, and the
//! hand-over with it (the old daemon serves on).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use super::frame::Frame;

/// Request codes (vhost-user, front-end to back-end).
pub mod code {
    /// `GET_FEATURES`.
    pub const GET_FEATURES: u32 = 1;
    /// `SET_FEATURES`.
    pub const SET_FEATURES: u32 = 2;
    /// `SET_OWNER`.
    pub const SET_OWNER: u32 = 3;
    /// `RESET_OWNER`.
    pub const RESET_OWNER: u32 = 4;
    /// `SET_MEM_TABLE`.
    pub const SET_MEM_TABLE: u32 = 5;
    /// `SET_LOG_BASE`.
    pub const SET_LOG_BASE: u32 = 6;
    /// `SET_VRING_NUM`.
    pub const SET_VRING_NUM: u32 = 8;
    /// `SET_VRING_ADDR`.
    pub const SET_VRING_ADDR: u32 = 9;
    /// `SET_VRING_BASE`.
    pub const SET_VRING_BASE: u32 = 10;
    /// `GET_VRING_BASE`.
    pub const GET_VRING_BASE: u32 = 11;
    /// `SET_VRING_KICK`.
    pub const SET_VRING_KICK: u32 = 12;
    /// `SET_VRING_CALL`.
    pub const SET_VRING_CALL: u32 = 13;
    /// `SET_VRING_ERR`.
    pub const SET_VRING_ERR: u32 = 14;
    /// `GET_PROTOCOL_FEATURES`.
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    /// `SET_PROTOCOL_FEATURES`.
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    /// `GET_QUEUE_NUM`.
    pub const GET_QUEUE_NUM: u32 = 17;
    /// `SET_VRING_ENABLE`.
    pub const SET_VRING_ENABLE: u32 = 18;
    /// `SET_BACKEND_REQ_FD`.
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    /// `GET_CONFIG`.
    pub const GET_CONFIG: u32 = 24;
    /// `SET_CONFIG`.
    pub const SET_CONFIG: u32 = 25;
    /// `RESET_DEVICE`.
    pub const RESET_DEVICE: u32 = 34;
    /// `GET_MAX_MEM_SLOTS`.
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    /// `SET_DEVICE_STATE_FD`.
    pub const SET_DEVICE_STATE_FD: u32 = 42;
    /// `CHECK_DEVICE_STATE`.
    pub const CHECK_DEVICE_STATE: u32 = 43;
    /// `GET_SHMEM_CONFIG`.
    pub const GET_SHMEM_CONFIG: u32 = 44;
}

/// `VHOST_F_LOG_ALL`: the front-end logs dirty pages (a migration runs).
pub const F_LOG_ALL: u64 = 1 << 26;
/// `VHOST_USER_PROTOCOL_F_REPLY_ACK`.
pub const PF_REPLY_ACK: u64 = 1 << 3;
/// Rings recorded: the device's. A VMM naming rings the handler refuses
/// must not grow the record (each holds up to three of its descriptors).
pub const MAX_RINGS: u32 = virtio_rdma_abi::config::NUM_QUEUES as u32;
/// In a `SET_VRING_KICK/CALL/ERR` body: no descriptor comes with it.
const NO_FD: u64 = 0x100;

/// A request as recorded: its body and descriptors.
#[derive(Debug)]
pub struct Kept {
    /// The body.
    pub body: Vec<u8>,
    /// The descriptors.
    pub fds: Vec<OwnedFd>,
}

impl Kept {
    fn of(frame: &Frame) -> std::io::Result<Kept> {
        Ok(Kept {
            body: frame.body.clone(),
            fds: frame
                .fds
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<std::io::Result<_>>()?,
        })
    }
}

/// One virtqueue's configuration.
#[derive(Debug, Default)]
pub struct Ring {
    /// The last `SET_VRING_NUM`.
    pub num: Option<Kept>,
    /// The last `SET_VRING_ADDR`.
    pub addr: Option<Kept>,
    /// The last `SET_VRING_KICK`, `SET_VRING_CALL`, `SET_VRING_ERR`.
    pub kick: Option<Kept>,
    /// See `kick`.
    pub call: Option<Kept>,
    /// See `kick`.
    pub err: Option<Kept>,
    /// The last `SET_VRING_ENABLE`'s value.
    pub enable: Option<u32>,
    /// Started (a kick descriptor set) and not stopped since
    /// (`GET_VRING_BASE`).
    pub running: bool,
}

/// What a connection's front-end has configured.
#[derive(Debug, Default)]
pub struct SessionRecord {
    /// `SET_OWNER` was sent.
    pub owner: bool,
    /// The acknowledged virtio features.
    pub features: Option<u64>,
    /// The acknowledged protocol features.
    pub protocol: Option<u64>,
    /// The last memory table.
    pub memory: Option<Kept>,
    /// The back-end request channel.
    pub backend_req: Option<Kept>,
    /// The virtqueues by index.
    pub rings: BTreeMap<u32, Ring>,
    /// A request the record cannot carry to another handler (its code).
    pub unsupported: Option<u32>,
}

impl SessionRecord {
    /// Whether replies to requests with `NEED_REPLY` are due.
    pub fn reply_ack(&self) -> bool {
        self.protocol.is_some_and(|p| p & PF_REPLY_ACK != 0)
    }

    /// Takes in a request on its way to the handler.
    pub fn apply(&mut self, f: &Frame) -> std::io::Result<()> {
        use code::*;
        let ring_of_state = |f: &Frame| f.u32_at(0).filter(|&i| i < MAX_RINGS);
        // KICK/CALL/ERR: the index in the low byte of the u64.
        let ring_of_fd = |f: &Frame| {
            f.u64_at(0)
                .map(|v| (v & 0xff) as u32)
                .filter(|&i| i < MAX_RINGS)
        };
        match f.code {
            GET_FEATURES
            | GET_PROTOCOL_FEATURES
            | GET_QUEUE_NUM
            | GET_CONFIG
            | GET_MAX_MEM_SLOTS
            | GET_SHMEM_CONFIG
            | SET_VRING_BASE
            | SET_CONFIG
            | SET_DEVICE_STATE_FD
            | CHECK_DEVICE_STATE
            | SET_LOG_BASE => {
                // Reads; writes the device ignores; a base the hand-over
                // takes from the stopped ring; migration's messages, whose
                // effect is in the device (a migrating VM, whose log is on,
                // is not handed over).
            }
            SET_OWNER => self.owner = true,
            RESET_OWNER => *self = SessionRecord::default(),
            RESET_DEVICE => {
                self.features = None;
                for r in self.rings.values_mut() {
                    r.enable = Some(0);
                }
            }
            SET_FEATURES => self.features = f.u64_at(0),
            SET_PROTOCOL_FEATURES => self.protocol = f.u64_at(0),
            SET_MEM_TABLE => self.memory = Some(Kept::of(f)?),
            SET_BACKEND_REQ_FD => self.backend_req = Some(Kept::of(f)?),
            SET_VRING_NUM => {
                if let Some(i) = ring_of_state(f) {
                    self.rings.entry(i).or_default().num = Some(Kept::of(f)?);
                }
            }
            SET_VRING_ADDR => {
                if let Some(i) = ring_of_state(f) {
                    self.rings.entry(i).or_default().addr = Some(Kept::of(f)?);
                }
            }
            SET_VRING_ENABLE => {
                if let Some(i) = ring_of_state(f) {
                    self.rings.entry(i).or_default().enable = f.u32_at(4);
                }
            }
            GET_VRING_BASE => {
                if let Some(r) = ring_of_state(f).and_then(|i| self.rings.get_mut(&i)) {
                    r.running = false;
                    r.kick = None;
                    r.call = None;
                }
            }
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
                if let Some(i) = ring_of_fd(f) {
                    let kept = Kept::of(f)?;
                    let r = self.rings.entry(i).or_default();
                    match f.code {
                        SET_VRING_KICK => {
                            r.running = f.u64_at(0).is_some_and(|v| v & NO_FD == 0);
                            r.kick = Some(kept);
                        }
                        SET_VRING_CALL => r.call = Some(kept),
                        _ => r.err = Some(kept),
                    }
                }
            }
            other => self.unsupported = Some(other),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::code::*;
    use super::*;
    use std::os::unix::net::UnixStream;

    fn frame(code: u32, body: Vec<u8>, fd: bool) -> Frame {
        let mut f = Frame::request(code, body);
        if fd {
            f.fds.push(OwnedFd::from(UnixStream::pair().unwrap().0));
        }
        f
    }

    fn state(i: u32, n: u32) -> Vec<u8> {
        [i.to_ne_bytes(), n.to_ne_bytes()].concat()
    }

    #[test]
    fn a_ring_runs_from_its_kick_to_its_stop() {
        let mut r = SessionRecord::default();
        r.apply(&frame(SET_OWNER, vec![], false)).unwrap();
        r.apply(&frame(
            SET_PROTOCOL_FEATURES,
            PF_REPLY_ACK.to_ne_bytes().to_vec(),
            false,
        ))
        .unwrap();
        r.apply(&frame(SET_VRING_NUM, state(1, 256), false))
            .unwrap();
        r.apply(&frame(SET_VRING_KICK, 1u64.to_ne_bytes().to_vec(), true))
            .unwrap();
        r.apply(&frame(SET_VRING_ENABLE, state(1, 1), false))
            .unwrap();
        assert!(r.owner && r.reply_ack());
        let ring = &r.rings[&1];
        assert!(ring.running && ring.num.is_some() && ring.enable == Some(1));
        assert_eq!(ring.kick.as_ref().map(|k| k.fds.len()), Some(1));
        r.apply(&frame(GET_VRING_BASE, state(1, 0), false)).unwrap();
        assert!(!r.rings[&1].running && r.rings[&1].kick.is_none());
        // A polled ring (no descriptor) does not count as started.
        r.apply(&frame(
            SET_VRING_KICK,
            (1u64 | NO_FD).to_ne_bytes().to_vec(),
            false,
        ))
        .unwrap();
        assert!(!r.rings[&1].running);
        assert!(r.unsupported.is_none());
    }

    #[test]
    fn resets_and_unknown_requests() {
        let mut r = SessionRecord::default();
        r.apply(&frame(SET_FEATURES, 5u64.to_ne_bytes().to_vec(), false))
            .unwrap();
        r.apply(&frame(SET_VRING_ENABLE, state(0, 1), false))
            .unwrap();
        r.apply(&frame(RESET_DEVICE, vec![], false)).unwrap();
        assert_eq!((r.features, r.rings[&0].enable), (None, Some(0)));
        r.apply(&frame(SET_MEM_TABLE, vec![0; 8], true)).unwrap();
        r.apply(&frame(RESET_OWNER, vec![], false)).unwrap();
        assert!(r.memory.is_none() && r.rings.is_empty());
        // A short body records nothing rather than failing.
        r.apply(&frame(SET_VRING_NUM, vec![1], false)).unwrap();
        assert!(r.rings.is_empty());
        r.apply(&frame(SET_VRING_NUM, state(MAX_RINGS, 1), false))
            .unwrap();
        let mut call = frame(
            SET_VRING_CALL,
            u64::from(MAX_RINGS).to_ne_bytes().to_vec(),
            true,
        );
        r.apply(&call).unwrap();
        call.body = 0u64.to_ne_bytes().to_vec();
        assert!(r.rings.is_empty(), "a ring past the bound is not kept");
        r.apply(&call).unwrap();
        assert_eq!(r.rings.len(), 1);
        r.apply(&frame(32, vec![], true)).unwrap();
        assert_eq!(r.unsupported, Some(32));
    }
}
