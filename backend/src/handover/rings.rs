//! Speaking to a VM's handler while its relay is paused: stopping the
//! rings the VMM started (as a VMM does before it saves a device's state),
//! starting them again where they stopped, and configuring a fresh
//! handler from a [`SessionRecord`] as the VMM configured the old one.

use std::collections::BTreeMap;

use thiserror::Error;

use super::frame::{Frame, FrameError, NEED_REPLY};
use super::record::{code, Kept, SessionRecord, F_LOG_ALL};
use super::relay::Link;

/// `VHOST_USER_F_PROTOCOL_FEATURES`.
const F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Errors speaking to the handler.
#[derive(Debug, Error)]
pub enum RingError {
    /// The connection failed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The handler refused a request.
    #[error("the handler refused request {0} (status {1})")]
    Refused(u32, u64),
    /// A reply that is not one.
    #[error("a malformed reply to request {0}")]
    BadReply(u32),
    /// The session cannot be carried to another handler.
    #[error("{0}")]
    NotCarried(String),
}

/// Where each stopped ring stopped (its next available index).
pub type Bases = BTreeMap<u32, u32>;

fn state(index: u32, num: u32) -> Vec<u8> {
    [index.to_ne_bytes(), num.to_ne_bytes()].concat()
}

fn kept(code: u32, k: &Kept) -> Result<Frame, RingError> {
    let mut f = Frame::request(code, k.body.clone());
    f.fds = k
        .fds
        .iter()
        .map(std::os::fd::OwnedFd::try_clone)
        .collect::<std::io::Result<_>>()
        .map_err(FrameError::Io)?;
    Ok(f)
}

/// Sends a request that changes the handler, with `NEED_REPLY` when the
/// session acknowledges replies, and checks the acknowledgement.
fn set(link: &mut Link, mut f: Frame) -> Result<(), RingError> {
    if !link.record.reply_ack() {
        return Ok(link.tell(&f)?);
    }
    f.flags |= NEED_REPLY;
    let r = link.ask(&f)?;
    match r.u64_at(0) {
        Some(0) if r.code == f.code && r.is_reply() => Ok(()),
        Some(s) if r.code == f.code => Err(RingError::Refused(f.code, s)),
        _ => Err(RingError::BadReply(f.code)),
    }
}

/// Sends a request that has a reply and returns the reply's `u64`.
fn get(link: &mut Link, f: &Frame) -> Result<u64, RingError> {
    let r = link.ask(f)?;
    if r.code != f.code || !r.is_reply() {
        return Err(RingError::BadReply(f.code));
    }
    r.u64_at(0).ok_or(RingError::BadReply(f.code))
}

/// Why the session cannot be handed over, if it cannot.
pub fn refusal(record: &SessionRecord) -> Option<String> {
    if let Some(c) = record.unsupported {
        return Some(format!(
            "the VMM used request {c}, which a hand-over cannot carry"
        ));
    }
    if record.features.is_some_and(|f| f & F_LOG_ALL != 0) {
        return Some("a migration is logging the VM's dirty pages".into());
    }
    None
}

/// Stops every running ring (`GET_VRING_BASE`) and returns where each
/// stopped. The record still says they run: [`start`] starts them again.
pub fn stop(link: &mut Link) -> Result<Bases, RingError> {
    let running: Vec<u32> = link
        .record
        .rings
        .iter()
        .filter(|(_, r)| r.running)
        .map(|(&i, _)| i)
        .collect();
    let mut bases = Bases::new();
    for i in running {
        let r = link.ask(&Frame::request(code::GET_VRING_BASE, state(i, 0)))?;
        match (
            r.is_reply() && r.code == code::GET_VRING_BASE,
            r.u32_at(0),
            r.u32_at(4),
        ) {
            (true, Some(ri), Some(base)) if ri == i => {
                bases.insert(i, base);
            }
            _ => return Err(RingError::BadReply(code::GET_VRING_BASE)),
        }
    }
    Ok(bases)
}

/// Starts every ring the record says runs at its base in `bases`, in the
/// order a VMM does.
pub fn start(link: &mut Link, bases: &Bases) -> Result<(), RingError> {
    let mut frames = Vec::new();
    for (&i, ring) in link.record.rings.iter().filter(|(_, r)| r.running) {
        let base = bases.get(&i).copied().unwrap_or(0);
        if let Some(k) = &ring.num {
            frames.push(kept(code::SET_VRING_NUM, k)?);
        }
        frames.push(Frame::request(code::SET_VRING_BASE, state(i, base)));
        if let Some(k) = &ring.addr {
            frames.push(kept(code::SET_VRING_ADDR, k)?);
        }
        for (c, k) in [
            (code::SET_VRING_CALL, &ring.call),
            (code::SET_VRING_ERR, &ring.err),
            (code::SET_VRING_KICK, &ring.kick),
        ] {
            if let Some(k) = k {
                frames.push(kept(c, k)?);
            }
        }
        if let Some(e) = ring.enable {
            frames.push(Frame::request(code::SET_VRING_ENABLE, state(i, e)));
        }
    }
    for f in frames {
        set(link, f)?;
    }
    Ok(())
}

/// Configures a fresh handler as the record says (everything but the
/// rings: [`start`] starts those), and checks that it offers every feature
/// the VMM acknowledged.
pub fn configure(link: &mut Link) -> Result<(), RingError> {
    let offered = get(link, &Frame::request(code::GET_FEATURES, Vec::new()))?;
    let acked = link.record.features.unwrap_or(0);
    if acked & !offered != 0 {
        return Err(RingError::NotCarried(format!(
            "this daemon does not offer features {:#x} the VM acknowledged",
            acked & !offered
        )));
    }
    if let Some(p) = link.record.protocol {
        if offered & F_PROTOCOL_FEATURES == 0 {
            return Err(RingError::NotCarried(
                "this daemon offers no protocol features".into(),
            ));
        }
        let have = get(
            link,
            &Frame::request(code::GET_PROTOCOL_FEATURES, Vec::new()),
        )?;
        if p & !have != 0 {
            return Err(RingError::NotCarried(format!(
                "this daemon does not offer protocol features {:#x} the VM acknowledged",
                p & !have
            )));
        }
        // Acknowledged only from this request on.
        link.tell(&Frame::request(
            code::SET_PROTOCOL_FEATURES,
            p.to_ne_bytes().to_vec(),
        ))?;
    }
    if link.record.owner {
        set(link, Frame::request(code::SET_OWNER, Vec::new()))?;
    }
    if let Some(f) = link.record.features {
        set(
            link,
            Frame::request(code::SET_FEATURES, f.to_ne_bytes().to_vec()),
        )?;
    }
    let mut frames = Vec::new();
    if let Some(k) = &link.record.backend_req {
        frames.push(kept(code::SET_BACKEND_REQ_FD, k)?);
    }
    if let Some(k) = &link.record.memory {
        frames.push(kept(code::SET_MEM_TABLE, k)?);
    }
    for f in frames {
        set(link, f)?;
    }
    Ok(())
}
