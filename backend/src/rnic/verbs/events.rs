//! The host device's asynchronous events (a QP or CQ failed, the port went
//! down or came back), read by one thread per RNIC and handed to the
//! VM they concern: queued in its `VmHost` and
//! signalled on its `notify` descriptor, which wakes the engine; the engine
//! applies them under the VM's lock ([`super::complete`]).

use std::io;
use std::ptr::addr_of;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::{debug, error, info, warn};
use rdma_sys::{
    ibv_ack_async_event, ibv_async_event, ibv_cq, ibv_get_async_event, ibv_qp, ibv_srq,
};
use virtio_rdma_abi::event::EventKind;

use super::attr::owner_of_context;
use super::readable::readable;
use super::rnic::{HostEvent, VerbsRnic};
use crate::rnic_objects::RnicObjects;

/// libibverbs' event types (`enum ibv_event_type`), read as integers: a
/// newer library may report a type the bindings' enum lacks.
mod kind {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const SRQ_ERR: u32 = 14;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

/// Starts the thread that reads `rnic`'s asynchronous events for as long as
/// anything else holds the RNIC (it holds it only while it handles
/// an event or waits a moment for one).
pub fn start(rnic: &Arc<VerbsRnic>) -> io::Result<JoinHandle<()>> {
    let fd = rnic.async_fd();
    // SAFETY: fcntl on the context's event descriptor, which the context
    // keeps open for as long as `rnic` lives.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let weak = Arc::downgrade(rnic);
    thread::Builder::new()
        .name("verbs-events".into())
        .spawn(move || {
            while let Some(rnic) = weak.upgrade() {
                wait_and_handle(&rnic);
            }
        })
}

/// Waits a while ([`readable`]) for events and handles those there are.
fn wait_and_handle(rnic: &VerbsRnic) {
    let fd = rnic.async_fd();
    {
        if !readable(fd) {
            return;
        }
        loop {
            // SAFETY: all-zero is a valid event structure to be filled.
            let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: a live context (non-blocking) and a structure to fill.
            if unsafe { ibv_get_async_event(rnic.device().context(), &mut ev) } != 0 {
                break;
            }
            handle(rnic, &ev);
            // SAFETY: `ev` was returned by ibv_get_async_event and is
            // acknowledged once (destroying its object waits for that).
            unsafe { ibv_ack_async_event(&mut ev) };
        }
    }
}

/// Hands one event to the VM it concerns (all of them for port events).
fn handle(rnic: &VerbsRnic, ev: &ibv_async_event) {
    // SAFETY: the event type is a C enum: read its integer value.
    let t = unsafe { addr_of!(ev.event_type).cast::<u32>().read() };
    let qp_event = |ev: &ibv_async_event| {
        // SAFETY: for QP events the element is the QP, alive until the
        // event is acknowledged.
        let qp: *mut ibv_qp = unsafe { ev.element.qp };
        // SAFETY: as above.
        let qpn = unsafe { (*qp).qp_num };
        rnic.lookup_qpn(rnic.device_qpn(qpn))
            .map(|o| (o.vm, o.handle))
    };
    let (targets, event) = match t {
        kind::QP_FATAL
        | kind::QP_REQ_ERR
        | kind::QP_ACCESS_ERR
        | kind::COMM_EST
        | kind::QP_LAST_WQE_REACHED => {
            let k = match t {
                kind::QP_FATAL => EventKind::QP_FATAL,
                kind::QP_REQ_ERR => EventKind::QP_REQ_ERROR,
                kind::QP_ACCESS_ERR => EventKind::QP_ACCESS_ERROR,
                kind::COMM_EST => EventKind::QP_COMM_EST,
                _ => EventKind::QP_LAST_WQE_REACHED,
            };
            match qp_event(ev) {
                Some((vm, h)) => (Some(vm), HostEvent::Qp(h, k)),
                None => return,
            }
        }
        kind::CQ_ERR => {
            // SAFETY: for CQ events the element is the CQ, alive until the
            // event is acknowledged; its context is the daemon's integer.
            let cq: *mut ibv_cq = unsafe { ev.element.cq };
            // SAFETY: as above.
            let (vm, h) = owner_of_context(unsafe { (*cq).cq_context } as usize);
            (Some(vm), HostEvent::CqError(h))
        }
        kind::SRQ_ERR => {
            // SAFETY: for SRQ events the element is the SRQ, alive until the
            // event is acknowledged; its context is the daemon's integer.
            let srq: *mut ibv_srq = unsafe { ev.element.srq };
            // SAFETY: as above.
            let (vm, h) = owner_of_context(unsafe { (*srq).srq_context } as usize);
            (Some(vm), HostEvent::SrqError(h))
        }
        kind::PORT_ERR => {
            warn!("{}: port down", rnic.device().name());
            (None, HostEvent::Port(true))
        }
        kind::PORT_ACTIVE => {
            info!("{}: port active", rnic.device().name());
            (None, HostEvent::Port(false))
        }
        kind::DEVICE_FATAL => {
            error!("{}: device fatal error", rnic.device().name());
            rnic.set_port_up(false);
            (None, HostEvent::DeviceFatal)
        }
        other => {
            debug!("{}: host event {other} ignored", rnic.device().name());
            return;
        }
    };
    if let HostEvent::Port(down) = event {
        rnic.set_port_up(!down);
    }
    match targets {
        Some(vm) => rnic.post_event(vm, event),
        None => {
            for vm in 0..rnic.vms().len() {
                rnic.post_event(vm, event);
            }
        }
    }
}
