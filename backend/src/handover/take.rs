//! The successor's side of a hand-over: receive every VM from the running
//! daemon, have each VM's serving thread configure a fresh handler and
//! load the state ([`Gate`] collects their verdicts), say ready, and on
//! the commit let them start the rings where they stopped.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

use super::record::SessionRecord;
use super::rings::Bases;
use super::wire::{recv, send, Msg, VERSION};
use crate::sync::lock;

/// A VM of the successor's configuration, which the running daemon's
/// must match.
pub struct Expected {
    /// Its name.
    pub name: String,
    /// Its socket.
    pub socket: PathBuf,
    /// Its tenant, GIDs and MAC, as text.
    pub identity: String,
}

/// A VMM's connection taken over, for the VM's serving thread.
pub struct Adoption {
    /// The VMM's connection.
    pub vmm: UnixStream,
    /// The rest.
    pub rest: Taken,
}

/// What goes with a connection taken over.
pub struct Taken {
    /// What the VMM configured.
    pub record: SessionRecord,
    /// Where each running ring stopped.
    pub bases: Bases,
    /// The device state.
    pub state: Vec<u8>,
    /// The instance's doorbell region, and whether the VMM maps it.
    pub doorbells: Option<(OwnedFd, bool)>,
    /// Where the serving thread reports and waits for the commit.
    pub gate: Arc<Gate>,
}

/// One VM as the running daemon handed it over.
pub struct Inherited {
    /// Its listening socket.
    pub listener: OwnedFd,
    /// Its VMM's connection, if one was connected.
    pub adoption: Option<Adoption>,
}

/// The running daemon's other listening sockets.
pub struct OpsInherited {
    /// Its hand-over socket.
    pub handover: OwnedFd,
    /// Its management socket.
    pub mgmt: Option<OwnedFd>,
    /// Its metrics listener.
    pub metrics: Option<OwnedFd>,
}

#[derive(Default)]
struct GateState {
    reported: usize,
    failures: Vec<String>,
    decision: Option<bool>,
}

/// The serving threads' verdicts on their VMs, and the commit.
#[derive(Default)]
pub struct Gate {
    expected: usize,
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    /// A VM's serving thread configured its handler and loaded the state,
    /// or failed to.
    pub fn prepared(&self, r: Result<(), String>) {
        let mut st = lock(&self.state);
        st.reported += 1;
        if let Err(e) = r {
            st.failures.push(e);
        }
        self.changed.notify_all();
    }

    /// Waits for every VM's verdict.
    fn wait_prepared(&self) -> Result<(), String> {
        let mut st = lock(&self.state);
        while st.reported < self.expected {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match st.failures.is_empty() {
            true => Ok(()),
            false => Err(st.failures.join("; ")),
        }
    }

    /// Whether the hand-over goes through (the serving threads wait here).
    pub fn wait_decision(&self) -> bool {
        let mut st = lock(&self.state);
        loop {
            if let Some(d) = st.decision {
                return d;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn decide(&self, go: bool) {
        lock(&self.state).decision = Some(go);
        self.changed.notify_all();
    }
}

/// Tells the running daemon why this one gives up, and waits until it has
/// read that (it then closes the connection and serves on).
fn refuse(s: &mut UnixStream, why: &str) {
    if send(s, &Msg::Abort { reason: why.into() }, &[], &[]).is_ok() {
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = std::io::copy(s, &mut std::io::sink());
    }
}

/// Receives every VM from the running daemon on `s`; `vms` are this
/// daemon's VMs (name, socket) in order, which must be the same. On a
/// refusal the running daemon is told why.
pub fn receive(
    s: &mut UnixStream,
    vms: &[Expected],
) -> Result<(Vec<Inherited>, Arc<Gate>, OpsInherited), String> {
    let r = receive_all(s, vms);
    if let Err(why) = &r {
        refuse(s, why);
    }
    r
}

fn receive_all(
    s: &mut UnixStream,
    vms: &[Expected],
) -> Result<(Vec<Inherited>, Arc<Gate>, OpsInherited), String> {
    send(s, &Msg::Hello { version: VERSION }, &[], &[]).map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let ops = loop {
        let (msg, blob, fds) = recv(s).map_err(|e| e.to_string())?;
        match msg {
            Msg::Vm {
                name,
                identity,
                socket,
                conn,
            } => {
                let Some(want) = vms.get(got.len()) else {
                    return Err(format!(
                        "the running daemon serves more VMs than the {} configured here",
                        vms.len()
                    ));
                };
                if want.name != name || want.socket != socket {
                    return Err(format!(
                        "VM {} is {name:?} on {} there, {:?} on {} here",
                        got.len(),
                        socket.display(),
                        want.name,
                        want.socket.display()
                    ));
                }
                if want.identity != identity {
                    return Err(format!(
                        "VM {name:?} has {identity} there, {} here",
                        want.identity
                    ));
                }
                let mut fds = fds.into_iter();
                let listener = fds.next().ok_or("no listening socket")?;
                let adoption = match conn {
                    None => None,
                    Some(c) => {
                        let vmm = UnixStream::from(fds.next().ok_or("no VMM connection")?);
                        let record = c.record.into_record(&mut fds).map_err(|e| e.to_string())?;
                        let doorbells = match c.doorbells {
                            None => None,
                            Some(r) => Some((fds.next().ok_or("no doorbell region")?, r.mapped)),
                        };
                        Some((vmm, record, c.bases, blob, doorbells))
                    }
                };
                got.push((listener, adoption));
            }
            Msg::Sent { mgmt, metrics } => {
                let mut fds = fds.into_iter();
                let handover = fds.next().ok_or("no hand-over socket")?;
                let mgmt = match mgmt {
                    true => Some(fds.next().ok_or("no management socket")?),
                    false => None,
                };
                let metrics = match metrics {
                    true => Some(fds.next().ok_or("no metrics listener")?),
                    false => None,
                };
                break OpsInherited {
                    handover,
                    mgmt,
                    metrics,
                };
            }
            Msg::Abort { reason } => return Err(format!("the running daemon refused: {reason}")),
            _ => return Err("an unexpected message".into()),
        }
    };
    if got.len() != vms.len() {
        return Err(format!(
            "the running daemon serves {} VMs, {} are configured here",
            got.len(),
            vms.len()
        ));
    }
    let gate = Arc::new(Gate {
        expected: got.iter().filter(|g| g.1.is_some()).count(),
        ..Gate::default()
    });
    let inherited = got
        .into_iter()
        .map(|(listener, a)| Inherited {
            listener,
            adoption: a.map(|(vmm, record, bases, state, doorbells)| Adoption {
                vmm,
                rest: Taken {
                    record,
                    bases,
                    state,
                    doorbells,
                    gate: gate.clone(),
                },
            }),
        })
        .collect();
    Ok((inherited, gate, ops))
}

/// Once every VM is prepared: tells the running daemon, waits for its
/// commit and lets the serving threads go on (or give up).
pub fn finish(s: &mut UnixStream, gate: &Gate) -> Result<(), String> {
    let r = gate.wait_prepared().and_then(|()| {
        send(s, &Msg::Ready, &[], &[]).map_err(|e| e.to_string())?;
        match recv(s) {
            Ok((Msg::Commit, _, _)) => Ok(()),
            Ok((Msg::Abort { reason }, _, _)) => {
                Err(format!("the running daemon gave up: {reason}"))
            }
            Ok(_) => Err("an unexpected message instead of the commit".into()),
            Err(e) => Err(format!("no commit: {e}")),
        }
    });
    if let Err(why) = &r {
        let _ = send(
            s,
            &Msg::Abort {
                reason: why.clone(),
            },
            &[],
            &[],
        );
    }
    gate.decide(r.is_ok());
    r
}

/// Gives up before any VM was prepared (the successor could not start).
pub fn abandon(s: &mut UnixStream, gate: &Gate, why: &str) {
    let _ = send(s, &Msg::Abort { reason: why.into() }, &[], &[]);
    gate.decide(false);
}
