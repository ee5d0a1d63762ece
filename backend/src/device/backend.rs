//! The `VhostUserBackend` implementation: features, configuration space,
//! memory table updates, the device reset and queue starts and stops.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use log::{debug, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserShMemConfig, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use virtio_rdma_abi::config::{CONTROLQ, EVENTQ, F_SHMEM_DOORBELL, NOTIFYQ, NUM_QUEUES};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::verbs::PORT_NUM;

use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::{DeviceError, RdmaDevice, EVENT_WAKE, MAX_QUEUE_SIZE};
use crate::memory::dirty::{self, RamBitmap, VHOST_F_LOG_ALL};
use crate::memory::table::{check_table, same_mapping};
use crate::memory::{GuestRam, HostMem, RamMap};
use crate::restart::{RestartTracker, Verdict};
use crate::sync::lock;
use crate::vring::{QueueObserver, Vring};

impl VhostUserBackend for RdmaDevice {
    type Bitmap = RamBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    /// One worker for the control and event queues; the notification
    /// queue's kicks go to the engine thread itself (`queue_kick`).
    fn queues_per_thread(&self) -> Vec<u64> {
        vec![(1u64 << CONTROLQ) | (1u64 << EVENTQ)]
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | if self.can_log { VHOST_F_LOG_ALL } else { 0 }
            | self.device_features
    }

    fn acked_features(&self, features: u64) {
        self.shmem_acked.store(
            features & self.device_features & F_SHMEM_DOORBELL != 0,
            Ordering::Release,
        );
        self.lock().vm.set_features(features & self.device_features);
        // Not under the VM's lock: the change rebuilds the engine's view
        // under it.
        self.dirty.set_log_all(features & VHOST_F_LOG_ALL != 0);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let base = VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::DEVICE_STATE;
        // Dirty logging only where every write into guest RAM is ours.
        let base = if self.can_log {
            base | VhostUserProtocolFeatures::LOG_SHMFD
        } else {
            base
        };
        if self.shmem.is_some() {
            base | VhostUserProtocolFeatures::BACKEND_REQ | VhostUserProtocolFeatures::SHMEM
        } else {
            base
        }
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        if let Some(link) = &self.shmem {
            link.set_channel(Some(backend));
        }
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        match &self.shmem {
            Some(link) => Ok(link.shmem_config()),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no shared memory regions without F_SHMEM_DOORBELL",
            )),
        }
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.set_state_fd(direction, phase, file)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.check_state_fd()
    }

    fn reset_device(&self) {
        debug!("VM {}: RESET_DEVICE", self.id);
        // The next start is a fresh one; whether the device runs meanwhile
        // is up to the queues (a VMM stops them before it resets).
        self.restart_lock().forget_history();
        self.reset_objects();
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        // vhost-user carries at most a page of configuration space.
        let size = size.min(4096);
        if start >= self.config.len() {
            return Vec::new();
        }
        let mut out: Vec<u8> = self.config[start..]
            .iter()
            .take(size as usize)
            .copied()
            .collect();
        out.resize(size as usize, 0);
        out
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestRam>) -> io::Result<()> {
        let mut snapshot = mem.memory().into_inner();
        // A region past the end of its file, or over a file that may
        // shrink, would raise SIGBUS in the daemon at the first access
        // (spec 19.6.1): refuse the table; the library then fails the
        // request and closes the connection. The queues and the control
        // path never saw it: they use `guest_mem`, still the last table
        // accepted.
        if let Err(e) = check_table(&snapshot, self.allow_unsealed_memory) {
            warn!("VM {}: SET_MEM_TABLE refused: {e}", self.id);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        // While logging is on, every page of RAM must have its bit: a VMM
        // grows its log before its memory (spec 20.4).
        if let Err(e) = self.dirty.check_covers(dirty::ram_end(&snapshot)) {
            warn!("VM {}: SET_MEM_TABLE refused: {e}", self.id);
            return Err(e.into());
        }
        // The table in use sent again (every start of the device after a
        // reset sends it): that mapping serves on, for the library's queues
        // too, and the one just made goes unused. No remapping of the
        // guest's RAM, no unmapping of the old one (a TLB shootdown on
        // every core running a thread of the daemon), and no page faults to
        // fill the new one's page tables again.
        let current = self.guest_mem.memory().into_inner();
        if same_mapping(&current, &snapshot) {
            match mem.lock() {
                Ok(g) => g.replace((*current).clone()),
                Err(e) => e.into_inner().replace((*current).clone()),
            }
            snapshot = current;
        }
        // Writes through the table mark the log from the start; and a log
        // the VMM sets on this connection's thread is checked with the
        // device's setting for files.
        dirty::attach_table(&snapshot, &self.dirty);
        dirty::set_conn_allow_unsealed(self.allow_unsealed_memory);
        match self.guest_mem.lock() {
            Ok(g) => g.replace((*snapshot).clone()),
            Err(e) => e.into_inner().replace((*snapshot).clone()),
        }
        let mem = self.guest_mem.clone();
        let ram = RamMap::from_guest_memory(&*snapshot);
        let mut st = self.lock();
        let host = Arc::new(HostMem::new(snapshot.clone()).with_log(self.dirty.engine_log()));
        st.vm.memory_changed(Some(&snapshot));
        st.vm.set_ram(ram);
        st.mem = Some(mem);
        st.host = Some(host);
        self.bump_dp_gen();
        drop(st);
        // Records and rings may have moved or left RAM: the engine must
        // look at the VM's QPs even if it does not poll it now.
        self.cell.kick();
        self.engine.wake();
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(p) => p,
            Err(e) => {
                warn!("{}", DeviceError::ExitEvent(e));
                return None;
            }
        };
        let keep = notifier.try_clone().ok()?;
        lock(&self.exit_notifiers).push(keep);
        lock(&self.exit_consumers).push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        // vhost-user-backend ends the worker thread on an error, and with
        // it the service of every queue of the VM until the VMM reconnects:
        // report, and keep serving.
        if let Err(e) = self.serve_event(device_event, evset, vrings) {
            warn!("VM {}: event {device_event}: {e}", self.id);
        }
        Ok(())
    }
}

impl RdmaDevice {
    pub(super) fn restart_lock(&self) -> MutexGuard<'_, RestartTracker> {
        lock(&self.restart)
    }

    /// The device reset (spec 15.1), however it was recognised: every
    /// object goes, the RC QPs of other VMs connected to it fail, and the
    /// doorbell region is mapped again at the next start (the VMM dropped
    /// the mapping).
    fn reset_objects(&self) {
        if let Some(link) = &self.shmem {
            link.forget();
        }
        let mut st = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        *crate::sync::lock(&self.pending) = None;
        let identity = self.tenancy.vm(self.id).map_or(self.id, |v| v.identity);
        if let Some(from) = self.board.give_back(identity, self.id, &mut st) {
            self.tenancy.set_active(identity, from);
        }
        let before = st.vm.res.counts();
        let mut gone = st.vm.reset();
        self.keep_moved_peers(identity, &st, &mut gone);
        // A VMM resets the device at every driver probe too: an empty
        // device's reset is not news.
        let level = if before.is_empty() {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        log::log!(
            level,
            "VM {}: device reset: released {} QPs, {} MRs ({} bytes), {} CQs, {} contexts",
            self.id,
            before.qp,
            before.mr,
            before.registered_bytes,
            before.cq,
            before.ctx
        );
        // Spec 15.1 item 6: nothing of before the reset survives in it.
        // The driver resets only after every guest mapping of the pages is
        // gone, so the pages of earlier connections are free again.
        if let Some(pages) = st.vm.res.doorbells.as_mut() {
            let n = pages.end_quarantine();
            if n > 0 {
                log::info!(
                    "VM {}: device reset: {n} doorbell pages of earlier connections usable again",
                    self.id
                );
            }
        }
        if let Some(link) = &self.shmem {
            link.clear_region();
        }
        let gids = *st.vm.gids();
        st.vm.events.push(EventKind::PORT_ACTIVE, PORT_NUM, 0);
        self.bump_dp_gen();
        drop(st);
        self.engine.peers_gone(self.id, &gids, gone);
    }

    /// Marks the device started or stopped, under its lock: once this
    /// returns, no engine pass that saw it running is still working on it.
    fn set_running(&self, on: bool) {
        let mut st = self.lock();
        let misfit = if on { self.start_loaded(&mut st) } else { None };
        self.cell.set_running(&mut st, on);
        if on {
            let identity = self.tenancy.vm(self.id).map_or(self.id, |v| v.identity);
            self.board.started(identity, self.id, &mut st);
            if self
                .tenancy
                .vm(identity)
                .is_some_and(|v| v.active() != self.id)
                && !st.vm.res.counts().is_empty()
            {
                self.tenancy.set_active(identity, self.id);
            }
            if let Some(host) = st.host.as_ref() {
                st.vm.refresh_doorbell_flags(host);
            }
        }
        self.bump_dp_gen();
        drop(st);
        if let Some((gids, gone)) = misfit {
            self.engine.peers_gone(self.id, &gids, gone);
        }
    }

    /// One event of the vring worker (a queue kick, or [`EVENT_WAKE`]).
    fn serve_event(&self, device_event: u16, evset: EventSet, vrings: &[Vring]) -> io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        let Some(mem) = self.lock().mem.as_ref().map(|m| m.memory()) else {
            return Ok(());
        };
        let (Some(ctrlq), Some(eventq)) = (
            vrings.get(usize::from(CONTROLQ)),
            vrings.get(usize::from(EVENTQ)),
        ) else {
            return Ok(());
        };
        match device_event {
            CONTROLQ => self.process_controlq(ctrlq, eventq, &mem)?,
            // New event buffers: delivery below.
            EVENTQ => {}
            // The engine queued events.
            EVENT_WAKE => {
                let _ = self.cell.event_wake_fd().read();
            }
            other => return Err(DeviceError::UnknownQueue(other).into()),
        }
        self.deliver_events(eventq, &mem)
    }
}

impl QueueObserver for RdmaDevice {
    fn queue_kick(&self, index: usize, kick: Option<&std::fs::File>) {
        if index == usize::from(NOTIFYQ) {
            self.set_notify_kick(kick);
        }
    }

    fn queue_started(&self, index: usize, base: u16) {
        let verdict = self.restart_lock().started(index, base);
        match verdict {
            None => return,
            Some(Verdict::Reset) => {
                log::info!(
                    "VM {}: the device restarted without RESET_DEVICE from a fresh \
                     queue: reset",
                    self.id
                );
                self.reset_objects();
            }
            Some(Verdict::Resume) => debug!("VM {}: resumed", self.id),
            Some(Verdict::Fresh) => {}
        }
        self.set_running(true);
        self.cell.kick();
        self.engine.wake();
    }

    fn queue_memory(&self) -> Option<crate::vring::Gm> {
        Some(self.guest_mem.clone())
    }

    fn queue_stopped(&self, index: usize, base: u16) {
        let running = {
            let mut t = self.restart_lock();
            t.stopped(index, base);
            t.running()
        };
        if !running && self.running() {
            debug!("VM {}: stopped", self.id);
            self.set_running(false);
        }
    }
}
