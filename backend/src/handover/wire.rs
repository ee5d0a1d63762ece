//! The hand-over protocol between the running daemon and its successor,
//! on the running daemon's hand-over socket (spec 20.7). Each message is
//! one JSON document and an opaque blob (a device state), length-prefixed,
//! with its descriptors attached to the prefix.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::record::{Kept, Ring, SessionRecord};

/// The protocol's version; both daemons must speak the same.
pub const VERSION: u32 = 1;
/// Longest JSON document.
const MAX_JSON: usize = 1 << 20;
/// Longest blob: larger than any device state the limits allow.
const MAX_BLOB: usize = 1 << 30;
/// Most descriptors with one message (the kernel's SCM_MAX_FD).
pub const MAX_FDS: usize = 253;

/// Errors on the hand-over connection.
#[derive(Debug, Error)]
pub enum WireError {
    /// The socket failed or closed.
    #[error("hand-over connection: {0}")]
    Io(#[from] std::io::Error),
    /// A message that does not parse or is out of bounds.
    #[error("hand-over message: {0}")]
    Bad(String),
}

/// A request's body and how many of the message's descriptors are its.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeptWire {
    body: Vec<u8>,
    fds: usize,
}

/// A ring's configuration on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct RingWire {
    index: u32,
    num: Option<KeptWire>,
    addr: Option<KeptWire>,
    kick: Option<KeptWire>,
    call: Option<KeptWire>,
    err: Option<KeptWire>,
    enable: Option<u32>,
    running: bool,
}

/// A [`SessionRecord`] on the wire; its descriptors follow in order.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecordWire {
    owner: bool,
    features: Option<u64>,
    protocol: Option<u64>,
    memory: Option<KeptWire>,
    backend_req: Option<KeptWire>,
    rings: Vec<RingWire>,
}

fn kept_out(k: &Option<Kept>, fds: &mut Vec<RawFd>) -> Option<KeptWire> {
    use std::os::fd::AsRawFd;
    k.as_ref().map(|k| {
        fds.extend(k.fds.iter().map(AsRawFd::as_raw_fd));
        KeptWire {
            body: k.body.clone(),
            fds: k.fds.len(),
        }
    })
}

fn kept_in(
    k: Option<KeptWire>,
    fds: &mut impl Iterator<Item = OwnedFd>,
) -> Result<Option<Kept>, WireError> {
    let Some(k) = k else { return Ok(None) };
    let mine: Vec<OwnedFd> = fds.take(k.fds).collect();
    if mine.len() != k.fds {
        return Err(WireError::Bad(
            "fewer descriptors than the record names".into(),
        ));
    }
    Ok(Some(Kept {
        body: k.body,
        fds: mine,
    }))
}

impl RecordWire {
    /// The wire form of `r` and its descriptors (borrowed from `r`).
    pub fn of(r: &SessionRecord) -> (RecordWire, Vec<RawFd>) {
        let mut fds = Vec::new();
        let memory = kept_out(&r.memory, &mut fds);
        let backend_req = kept_out(&r.backend_req, &mut fds);
        let rings = r
            .rings
            .iter()
            .map(|(&index, g)| RingWire {
                index,
                num: kept_out(&g.num, &mut fds),
                addr: kept_out(&g.addr, &mut fds),
                kick: kept_out(&g.kick, &mut fds),
                call: kept_out(&g.call, &mut fds),
                err: kept_out(&g.err, &mut fds),
                enable: g.enable,
                running: g.running,
            })
            .collect();
        let w = RecordWire {
            owner: r.owner,
            features: r.features,
            protocol: r.protocol,
            memory,
            backend_req,
            rings,
        };
        (w, fds)
    }

    /// The record again, taking its descriptors from `fds` in order.
    pub fn into_record(
        self,
        fds: &mut impl Iterator<Item = OwnedFd>,
    ) -> Result<SessionRecord, WireError> {
        let memory = kept_in(self.memory, fds)?;
        let backend_req = kept_in(self.backend_req, fds)?;
        let mut rings = BTreeMap::new();
        for g in self.rings {
            let ring = Ring {
                num: kept_in(g.num, fds)?,
                addr: kept_in(g.addr, fds)?,
                kick: kept_in(g.kick, fds)?,
                call: kept_in(g.call, fds)?,
                err: kept_in(g.err, fds)?,
                enable: g.enable,
                running: g.running,
            };
            rings.insert(g.index, ring);
        }
        Ok(SessionRecord {
            owner: self.owner,
            features: self.features,
            protocol: self.protocol,
            memory,
            backend_req,
            rings,
            unsupported: None,
        })
    }
}

/// A connected VM's connection: its descriptors are the VMM's socket,
/// then the record's, then the doorbell region's memfd if one comes.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConnWire {
    /// What the VMM configured.
    pub record: RecordWire,
    /// Where each running ring stopped.
    pub bases: BTreeMap<u32, u32>,
    /// The instance's shared-memory doorbell region comes (spec 20.7).
    /// Absent from a daemon that does not hand regions over.
    #[serde(default)]
    pub doorbells: Option<RegionWire>,
}

/// The doorbell region of a connection handed over.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RegionWire {
    /// The VMM maps it into the guest.
    pub mapped: bool,
}

/// The messages, in the order they go.
#[derive(Debug, Serialize, Deserialize)]
pub enum Msg {
    /// Successor: the protocol version it speaks.
    Hello {
        /// [`VERSION`].
        version: u32,
    },
    /// Running daemon: one VM. Descriptors: its listening socket, then
    /// the connection's (if any); the blob is its device state.
    Vm {
        /// The VM's name.
        name: String,
        /// Its tenant, GIDs and MAC, as text: the successor must have the
        /// same.
        identity: String,
        /// Its socket's path.
        socket: PathBuf,
        /// Its VMM's connection, if one is connected.
        conn: Option<Box<ConnWire>>,
    },
    /// Running daemon: every VM was sent. Descriptors: its hand-over
    /// socket, then its management socket and metrics listener, if it has
    /// them.
    Sent {
        /// A management socket comes.
        mgmt: bool,
        /// A metrics listener comes.
        metrics: bool,
    },
    /// Either: the hand-over is off, and why.
    Abort {
        /// Why.
        reason: String,
    },
    /// Successor: every VM is configured and loaded; it waits for
    /// [`Msg::Commit`].
    Ready,
    /// Running daemon: it stops now; the successor serves.
    Commit,
}

/// Sends `msg` with `blob` and `fds`.
pub fn send(s: &mut UnixStream, msg: &Msg, blob: &[u8], fds: &[RawFd]) -> Result<(), WireError> {
    if fds.len() > MAX_FDS {
        return Err(WireError::Bad(format!(
            "{} descriptors in one message (at most {MAX_FDS})",
            fds.len()
        )));
    }
    let json = serde_json::to_vec(msg).map_err(|e| WireError::Bad(e.to_string()))?;
    let len = |n: usize| u32::try_from(n).map_err(|_| WireError::Bad("too long".into()));
    let mut prefix = Vec::with_capacity(8);
    prefix.extend_from_slice(&len(json.len())?.to_le_bytes());
    prefix.extend_from_slice(&len(blob.len())?.to_le_bytes());
    let sent = loop {
        match s.send_with_fds(&[prefix.as_slice()], fds) {
            Ok(n) => break n,
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno()).into()),
        }
    };
    if let Some(rest) = prefix.get(sent..) {
        s.write_all(rest)?;
    }
    s.write_all(&json)?;
    s.write_all(blob)?;
    Ok(())
}

/// Receives the next message, its blob and its descriptors.
pub fn recv(s: &mut UnixStream) -> Result<(Msg, Vec<u8>, Vec<OwnedFd>), WireError> {
    let mut prefix = [0u8; 8];
    let mut raw: Vec<RawFd> = vec![-1; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: prefix.as_mut_ptr().cast(),
        iov_len: prefix.len(),
    }];
    let (got, n) = loop {
        // SAFETY: the iovec points at `prefix`, writable for its length
        // and alive during the call; `raw` receives descriptors.
        match unsafe { s.recv_with_fds(&mut iov, &mut raw) } {
            Ok(r) => break r,
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno()).into()),
        }
    };
    let fds: Vec<OwnedFd> = raw
        .iter()
        .take(n)
        // SAFETY: recvmsg installed these descriptors for this process.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if got == 0 {
        return Err(
            std::io::Error::new(ErrorKind::UnexpectedEof, "the other daemon closed").into(),
        );
    }
    s.read_exact(&mut prefix[got..])?;
    let json_len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    let blob_len = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
    if json_len > MAX_JSON || blob_len > MAX_BLOB {
        return Err(WireError::Bad(format!(
            "a message of {json_len} + {blob_len} bytes"
        )));
    }
    let mut json = vec![0u8; json_len];
    s.read_exact(&mut json)?;
    let mut blob = vec![0u8; blob_len];
    s.read_exact(&mut blob)?;
    let msg = serde_json::from_slice(&json).map_err(|e| WireError::Bad(e.to_string()))?;
    Ok((msg, blob, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handover::frame::Frame;
    use crate::handover::record::code;

    #[test]
    fn a_record_and_its_descriptors_cross_the_wire() {
        let mut r = SessionRecord::default();
        let mut f = Frame::request(code::SET_VRING_KICK, 1u64.to_ne_bytes().to_vec());
        f.fds.push(OwnedFd::from(UnixStream::pair().unwrap().0));
        r.apply(&f).unwrap();
        r.apply(&Frame::request(code::SET_OWNER, vec![])).unwrap();
        let (w, fds) = RecordWire::of(&r);
        let msg = Msg::Vm {
            name: "a".into(),
            identity: "tenant t".into(),
            socket: "/s".into(),
            conn: Some(Box::new(ConnWire {
                record: w,
                bases: BTreeMap::from([(1, 7)]),
                doorbells: None,
            })),
        };
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send(&mut a, &msg, b"state", &fds).unwrap();
        let (got, blob, fds) = recv(&mut b).unwrap();
        assert_eq!(blob, b"state");
        let Msg::Vm { conn: Some(c), .. } = got else {
            panic!("not a VM with a connection");
        };
        assert_eq!(c.bases.get(&1), Some(&7));
        let back = c.record.into_record(&mut fds.into_iter()).unwrap();
        assert!(back.owner && back.rings[&1].running);
        assert_eq!(back.rings[&1].kick.as_ref().map(|k| k.fds.len()), Some(1));
    }

    #[test]
    fn a_connection_from_a_daemon_that_hands_no_region_over_reads_as_without_one() {
        let json = r#"{"Vm":{"name":"a","identity":"t","socket":"/s","conn":{"record":
            {"owner":true,"features":null,"protocol":null,"memory":null,"backend_req":null,
            "rings":[]},"bases":{}}}}"#;
        let msg: Msg = serde_json::from_str(json).unwrap();
        let Msg::Vm { conn: Some(c), .. } = msg else {
            panic!("not a VM with a connection");
        };
        assert!(c.doorbells.is_none());
    }

    #[test]
    fn a_record_naming_more_descriptors_than_came_is_refused() {
        let mut r = SessionRecord::default();
        let mut f = Frame::request(code::SET_MEM_TABLE, vec![0; 8]);
        f.fds.push(OwnedFd::from(UnixStream::pair().unwrap().0));
        r.apply(&f).unwrap();
        let (w, _) = RecordWire::of(&r);
        assert!(w.into_record(&mut std::iter::empty()).is_err());
    }
}
