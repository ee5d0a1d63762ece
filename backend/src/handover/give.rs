//! The running daemon's side of a hand-over: pause every VM's relay,
//! stop its rings, save its device state, send it all to the successor
//! and, once the successor is ready, stop for good. Until the successor
//! says it is ready, any failure resumes every VM where it stopped: a
//! failed upgrade leaves this daemon serving.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use log::{info, warn};

use super::hold::AcceptHold;
use super::relay::{Link, Relay};
use super::rings::{self, Bases};
use super::wire::{recv, send, ConnWire, Msg, RecordWire, RegionWire, VERSION};
use crate::device::RdmaDevice;
use crate::sync::lock;

/// What the hand-over needs of one VM of this daemon.
pub struct VmPort<'a> {
    /// The VM's name.
    pub name: &'a str,
    /// Its tenant, GIDs and MAC, as text.
    pub identity: &'a str,
    /// Its socket's path.
    pub path: &'a Path,
    /// Its listening socket.
    pub listener: BorrowedFd<'a>,
    /// Its accepting thread.
    pub accept: &'a AcceptHold,
    /// The relay of its VMM's connection, while one runs.
    pub relay: &'a Mutex<Option<Relay>>,
    /// Whether a VMM is connected.
    pub connected: bool,
    /// Its device.
    pub device: &'a RdmaDevice,
}

/// How long a relay may take to reach a pause (a VMM in the middle of
/// sending a message).
const PAUSE_WAIT: Duration = Duration::from_secs(5);

/// A VM stopped for the hand-over.
struct Paused {
    index: usize,
    link: Link,
    bases: Bases,
}

/// The listening sockets besides the VMs' that go to the successor.
pub struct OpsPorts<'a> {
    /// The hand-over socket.
    pub handover: BorrowedFd<'a>,
    /// The management socket.
    pub mgmt: Option<BorrowedFd<'a>>,
    /// The metrics listener.
    pub metrics: Option<BorrowedFd<'a>>,
}

/// The stopped VMs' connections to their handlers, kept open until the
/// process exits: closing one would have its handler release the VM's
/// objects, which are the successor's now.
pub struct Held(#[allow(dead_code)] Vec<Paused>);

/// How a hand-over ended.
pub enum Given {
    /// The successor serves every VM; this daemon must stop without
    /// touching them, holding on to what it gets here until it exits.
    Committed(Held),
    /// Nothing changed hands; every VM runs on here.
    Refused(String),
}

/// Resumes the stopped VMs (their rings where they stopped, their relays).
fn resume(slots: &[VmPort], paused: Vec<Paused>) {
    for mut p in paused {
        if let Err(e) = rings::start(&mut p.link, &p.bases) {
            warn!(
                "VM {}: cannot restart its rings after the hand-over: {e}",
                p.index
            );
        }
        let Some(slot) = slots.get(p.index) else {
            continue;
        };
        match Relay::spawn(p.link, &format!("vm{}-relay", p.index)) {
            Ok(r) => *lock(slot.relay) = Some(r),
            Err(e) => warn!("VM {}: cannot restart its relay: {e}", p.index),
        }
    }
}

/// Stops VM `index` for the hand-over.
fn pause(index: usize, slot: &VmPort) -> Result<Option<Paused>, String> {
    let Some(relay) = lock(slot.relay).take() else {
        if slot.connected {
            return Err(format!("VM {index}'s VMM is connecting or leaving"));
        }
        return Ok(None);
    };
    let mut link = match relay.pause(PAUSE_WAIT) {
        Ok(link) => link,
        Err((relay, e)) => {
            *lock(slot.relay) = Some(relay);
            return Err(format!("VM {index}: {e}"));
        }
    };
    let respawn = |link: Link| match Relay::spawn(link, &format!("vm{index}-relay")) {
        Ok(r) => *lock(slot.relay) = Some(r),
        Err(e) => warn!("VM {index}: cannot restart its relay: {e}"),
    };
    if let Some(why) = rings::refusal(&link.record) {
        respawn(link);
        return Err(format!("VM {index}: {why}"));
    }
    match rings::stop(&mut link) {
        Ok(bases) => Ok(Some(Paused { index, link, bases })),
        Err(e) => {
            respawn(link);
            Err(format!("VM {index}: cannot stop its rings: {e}"))
        }
    }
}

/// Hands every VM of `slots` over to the successor on `s`.
pub fn give(slots: &[VmPort], ops: &OpsPorts, s: &mut UnixStream) -> Given {
    match recv(s) {
        Ok((Msg::Hello { version }, _, _)) if version == VERSION => {}
        Ok((Msg::Hello { version }, _, _)) => {
            let why =
                format!("the successor speaks hand-over version {version}, this daemon {VERSION}");
            let _ = send(
                s,
                &Msg::Abort {
                    reason: why.clone(),
                },
                &[],
                &[],
            );
            return Given::Refused(why);
        }
        Ok(_) => return Given::Refused("the successor did not say hello".into()),
        Err(e) => return Given::Refused(e.to_string()),
    }
    let mut paused = Vec::new();
    let began = std::time::Instant::now();
    let outcome = hand_over(slots, ops, s, &mut paused);
    match outcome {
        Ok(()) => Given::Committed(Held(paused)),
        Err(why) => {
            let stopped = paused.len();
            resume(slots, paused);
            for slot in slots {
                slot.accept.release();
            }
            info!(
                "{stopped} VMs resumed {} ms after the hand-over began",
                began.elapsed().as_millis()
            );
            let _ = send(
                s,
                &Msg::Abort {
                    reason: why.clone(),
                },
                &[],
                &[],
            );
            Given::Refused(why)
        }
    }
}

fn hand_over(
    slots: &[VmPort],
    ops: &OpsPorts,
    s: &mut UnixStream,
    paused: &mut Vec<Paused>,
) -> Result<(), String> {
    // No VMM gets accepted here from now on: one that connects waits for
    // whichever daemon serves next.
    for (index, slot) in slots.iter().enumerate() {
        if !slot.accept.hold(PAUSE_WAIT) {
            return Err(format!("VM {index}'s socket is taking a connection"));
        }
    }
    for (index, slot) in slots.iter().enumerate() {
        if let Some(p) = pause(index, slot)? {
            paused.push(p);
        }
    }
    let mut states = Vec::new();
    for p in paused.iter() {
        let slot = slots.get(p.index).ok_or("no such VM")?;
        let state = slot
            .device
            .save_for_hand_over()
            .map_err(|e| format!("VM {}: cannot save its state: {e}", p.index))?;
        states.push(state);
    }
    for (index, slot) in slots.iter().enumerate() {
        let mut fds = vec![slot.listener.as_raw_fd()];
        let k = paused.iter().position(|p| p.index == index);
        // Held until the message is sent: its descriptor goes with it.
        let region = slot.device.doorbell_region();
        let (conn, blob) = match k.and_then(|k| Some((paused.get(k)?, states.get(k)?))) {
            Some((p, state)) => {
                fds.push(p.link.vmm.as_raw_fd());
                let (record, rfds) = RecordWire::of(&p.link.record);
                fds.extend(rfds);
                let bases = p.bases.clone();
                let doorbells = region.as_ref().map(|(r, mapped)| {
                    fds.push(r.fd().as_raw_fd());
                    RegionWire { mapped: *mapped }
                });
                let conn = ConnWire {
                    record,
                    bases,
                    doorbells,
                };
                (Some(Box::new(conn)), state.as_slice())
            }
            None => (None, &[][..]),
        };
        let msg = Msg::Vm {
            name: slot.name.into(),
            identity: slot.identity.into(),
            socket: slot.path.into(),
            conn,
        };
        send(s, &msg, blob, &fds).map_err(|e| e.to_string())?;
    }
    let mut fds = vec![ops.handover.as_raw_fd()];
    fds.extend(ops.mgmt.iter().chain(&ops.metrics).map(AsRawFd::as_raw_fd));
    let sent = Msg::Sent {
        mgmt: ops.mgmt.is_some(),
        metrics: ops.metrics.is_some(),
    };
    send(s, &sent, &[], &fds).map_err(|e| e.to_string())?;
    match recv(s) {
        Ok((Msg::Ready, _, _)) => {}
        Ok((Msg::Abort { reason }, _, _)) => {
            return Err(format!("the successor refused: {reason}"))
        }
        Ok(_) => return Err("the successor sent something else than Ready".into()),
        Err(e) => return Err(e.to_string()),
    }
    send(s, &Msg::Commit, &[], &[]).map_err(|e| e.to_string())?;
    info!(
        "handed {} VMs ({} connected) over to the successor",
        slots.len(),
        paused.len()
    );
    Ok(())
}
