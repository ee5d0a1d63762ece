//! The control-queue worker: it takes requests off the control queue
//! within the VM's rate limits, copies each out of its chain, executes it on
//! the VM's state and writes the response back.

use std::io;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use log::{debug, warn};
use vhost_user_backend::VringT;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use virtio_rdma_abi::ctrl::{ResponseHeader, MAX_REQUEST_BYTES};
use virtio_rdma_abi::Field;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{signal, Mem, RdmaDevice};
use crate::ctrl::{Prepared, Preparer};
use crate::memory::pagelist::release_all;
use crate::stats::TrafficCounters;
use crate::vm::VmState;
use crate::vring::Vring;

/// Longest single sleep of a rate-limited control worker: it re-checks
/// that its queue still runs this often, so a stop or reset is not held up
/// by a long wait.
const RATE_SLICE: Duration = Duration::from_millis(5);

impl RdmaDevice {
    /// Takes up to `want` control-command tokens from the VM's and its
    /// tenant's rate limits. Returns the number taken, or how long to wait
    /// for the next batch.
    fn ctrl_tokens(&self, want: u64) -> Result<u64, Duration> {
        self.ctrl_limits
            .take(want, Instant::now(), &self.qos, self.tenancy.as_ref())
    }

    /// Sleeps `wait` (the VM's control rate limit), in slices, without any
    /// lock held. Returns false if the queue stopped meanwhile.
    fn rate_wait(&self, vring: &Vring, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        loop {
            if !vring.get_ref().get_queue().ready() {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(RATE_SLICE));
        }
    }

    pub(super) fn process_controlq(
        &self,
        vring: &Vring,
        eventq: &Vring,
        mem: &Mem,
    ) -> io::Result<()> {
        // Rounds in a row that found no request although the avail index
        // said there were some (a queue the VMM stopped): give up rather
        // than spin.
        let mut empty_rounds = 0;
        // Requests taken per pass: the lock is released and the CPU offered
        // to others between passes (`max_ctrl_outstanding`).
        let per_pass = u16::try_from(self.limits.max_ctrl_outstanding.max(1)).unwrap_or(u16::MAX);
        loop {
            // No kicks while we are awake and looking at the ring anyway.
            vring.disable_notification().map_err(io::Error::other)?;
            let want = pending(vring, mem).min(per_pass);
            // The VM's rate limit: requests beyond it wait in the ring, and
            // only this VM's worker waits for them.
            let take = match self.ctrl_tokens(u64::from(want)) {
                Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
                Err(wait) => {
                    if !self.rate_wait(vring, wait) {
                        return Ok(());
                    }
                    continue;
                }
            };
            // Taken under the state lock, so that a reset or disconnect is
            // either before all of them or after (see `epoch`).
            let st = self.lock();
            let epoch = self.epoch.load(Ordering::Acquire);
            let taken = vring.get_mut().get_queue_mut().iter(mem.clone()).map(|it| {
                let now = Instant::now();
                it.take(take).map(|c| (c, now)).collect::<Vec<_>>()
            });
            drop(st);
            let chains: Vec<(DescriptorChain<Mem>, Instant)> = match taken {
                Ok(c) => c,
                Err(e) => {
                    // The guest corrupted its avail ring; nothing in it can be
                    // trusted. Leave the queue alone until the driver resets.
                    // Every kick finds it so: warn once per breakage (a guest
                    // must not flood the log), count every time.
                    if self.ctrlq_unusable.swap(true, Ordering::AcqRel) {
                        debug!("control queue still unusable: {e}");
                    } else {
                        warn!("VM {}: control queue unusable: {e}", self.id);
                    }
                    self.lock().vm.count_malformed();
                    return Ok(());
                }
            };
            if !chains.is_empty() {
                // Usable again (restarted or repaired): warn anew next time.
                self.ctrlq_unusable.store(false, Ordering::Release);
            }
            let full = chains.len() >= usize::from(per_pass);
            if chains.is_empty() {
                empty_rounds += 1;
                if empty_rounds > 2 {
                    debug!("control queue shows requests it does not hand out; waiting for a kick");
                    break;
                }
            } else {
                empty_rounds = 0;
                self.map_doorbells();
                let mut engine_work = false;
                let queue_size = vring.get_ref().get_queue().size();
                for (chain, taken) in chains {
                    let head = chain.head_index();
                    // A head past the descriptor table names no chain, and
                    // a used element cannot name it either (spec 7.4): the
                    // entry is counted as malformed and returns nothing.
                    let named = head < queue_size;
                    // Copy the request, and do the expensive part of the
                    // command (an MR's translation), before taking the
                    // state lock for it: the engine waits on that lock.
                    let request = if named {
                        read_chain(mem, chain)
                    } else {
                        debug!("control queue: available head {head} is not a descriptor");
                        None
                    };
                    let prepared = match &request {
                        Some(r) if Preparer::wanted(&r.bytes) => {
                            let preparer = self.lock().vm.preparer();
                            preparer.prepare(&**mem, &r.bytes)
                        }
                        _ => None,
                    };
                    // The state lock is held per command, not per pass: the
                    // engine locks this VM too (to rebuild its polling list
                    // after a change), and must never wait for a whole pass
                    // of one VM's commands while every VM's data waits.
                    let (used, ok, released) = {
                        let mut st = self.lock();
                        if self.epoch.load(Ordering::Acquire) != epoch {
                            // Reset or disconnected since these were taken:
                            // the ring they came from is gone.
                            return Ok(());
                        }
                        let ok_before = st.vm.stats.ok;
                        let used = execute_chain(&mut st.vm, mem, request, prepared);
                        let wake = st.vm.take_engine_work();
                        engine_work |= wake;
                        if st.vm.take_dp_changed() || wake {
                            // QPs may have come, gone or changed state.
                            self.bump_dp_gen();
                        }
                        // Translations of destroyed objects are freed below,
                        // without the lock and in steps (milliseconds of
                        // kernel time for a large MR: `release_all`).
                        let released = st.vm.res.take_released();
                        (used, st.vm.stats.ok != ok_before, released)
                    };
                    release_all(released);
                    if named {
                        if let Err(e) = vring.add_used(head, used) {
                            warn!("cannot return control buffer {head}: {e}");
                        }
                    }
                    if let Some(t) = self.traffic() {
                        TrafficCounters::add(&t.ctrl_cmds, 1);
                        if !ok {
                            // An error status, or a chain not answered.
                            TrafficCounters::add(&t.ctrl_errors, 1);
                        }
                        t.ctrl_latency.observe(taken.elapsed());
                    }
                }
                signal(vring)?;
                if engine_work {
                    // Posted work may have become startable, or need a
                    // flush. Other commands need no wake-up: a sleeping
                    // engine would look, find nothing and sleep again, at
                    // a cost that grows with the VM's QPs.
                    self.cell.kick();
                    self.engine.wake();
                }
                // Commands may have raised events; deliver them now rather
                // than when the worker stops polling.
                self.deliver_events(eventq, mem)?;
            }
            if full {
                // A full pass: let other VMs' workers (and the engine) have
                // the CPU before taking more.
                std::thread::yield_now();
                continue;
            }
            if self.poll_for_more(vring, mem) {
                continue;
            }
            // Re-arm kicks; if requests slipped in meanwhile, go round again.
            if !vring.enable_notification().map_err(io::Error::other)? {
                break;
            }
        }
        Ok(())
    }

    /// Adaptive polling: after a batch, watch the avail ring for
    /// `ctrl_poll` before going back to sleep. A driver that issues
    /// commands back to back then needs no kick and the worker no wakeup,
    /// which on separate CPUs is most of a round trip. Yielding lets a
    /// driver that shares our CPU run.
    fn poll_for_more(&self, vring: &Vring, mem: &Mem) -> bool {
        if self.ctrl_poll.is_zero() {
            return false;
        }
        let deadline = Instant::now() + self.ctrl_poll;
        loop {
            if has_requests(vring, mem) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

/// How many requests the driver has made available that are not taken
/// yet (as the avail index claims: a hostile value is only an upper bound
/// for the iterator, which checks it).
fn pending(vring: &Vring, mem: &Mem) -> u16 {
    let st = vring.get_ref();
    let q = st.get_queue();
    q.avail_idx(&**mem, AtomicOrdering::Acquire)
        .map(|a| a.0.wrapping_sub(q.next_avail()))
        .unwrap_or(0)
}

/// Whether the driver has made requests available that are not taken yet.
fn has_requests(vring: &Vring, mem: &Mem) -> bool {
    let st = vring.get_ref();
    let q = st.get_queue();
    q.avail_idx(&**mem, AtomicOrdering::Acquire)
        .map(|a| a.0 != q.next_avail())
        .unwrap_or(false)
}
/// A control request copied out of its chain.
struct ChainRequest {
    bytes: Vec<u8>,
    /// The device-writable descriptors, for the response.
    writable: Vec<(GuestAddress, usize)>,
    total_w: usize,
}

/// Executes a request read by [`read_chain`] and writes the response.
/// Returns the used length (0 when the chain was unusable: `None`).
fn execute_chain(
    ctrl: &mut VmState,
    mem: &Mem,
    request: Option<ChainRequest>,
    prepared: Option<Prepared>,
) -> u32 {
    let Some(r) = request else {
        ctrl.count_malformed();
        return 0;
    };
    let response = ctrl.execute_prepared(&**mem, &r.bytes, r.total_w, prepared);
    scatter(mem, &r.writable, &response)
}

/// Copies a control request out of guest memory; `None` when the chain is
/// unusable (it is then answered with used length 0).
fn read_chain(mem: &Mem, chain: DescriptorChain<Mem>) -> Option<ChainRequest> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut total_r = 0usize;
    let mut total_w = 0usize;
    let mut truncated = false;
    for desc in chain {
        // The iterator ends silently on a loop (its TTL runs out), an index
        // past the table or an unreadable descriptor; a chain whose last
        // descriptor still says NEXT was cut short that way.
        truncated = desc.has_next();
        let len = desc.len() as usize;
        // No bytes: nothing is read or written through it, so neither its
        // address nor its direction matters (spec 7.4).
        if len == 0 {
            continue;
        }
        if desc.is_write_only() {
            total_w = total_w.saturating_add(len);
            writable.push((desc.addr(), len));
        } else {
            if !writable.is_empty() {
                debug!("readable descriptor after a writable one");
                return None;
            }
            total_r = total_r.saturating_add(len);
            readable.push((desc.addr(), len));
        }
    }
    if truncated || total_r > MAX_REQUEST_BYTES || total_w < ResponseHeader::SIZE {
        return None;
    }
    if writable.iter().any(|&(a, l)| !mem.check_range(a, l)) {
        return None;
    }
    // Copy the whole request first: the guest may rewrite it while we parse.
    let mut request = vec![0u8; total_r];
    let mut off = 0;
    for (addr, len) in readable {
        let dst = request.get_mut(off..off + len)?;
        if mem.read_slice(dst, addr).is_err() {
            return None;
        }
        off += len;
    }
    Some(ChainRequest {
        bytes: request,
        writable,
        total_w,
    })
}

/// Writes `data` across the writable descriptors; returns bytes written.
pub(super) fn scatter(mem: &Mem, writable: &[(GuestAddress, usize)], data: &[u8]) -> u32 {
    let mut rest = data;
    let mut written = 0usize;
    for &(addr, len) in writable {
        if rest.is_empty() {
            break;
        }
        let n = len.min(rest.len());
        if mem.write_slice(&rest[..n], addr).is_err() {
            return 0;
        }
        rest = &rest[n..];
        written += n;
    }
    u32::try_from(written).unwrap_or(0)
}
