//! An engine thread: its loop, its parking and its scratch memory.
//!
//! A thread polls the producer indices of its VMs' doorbells while they
//! have work. A VM idle for a while is parked on its own (spec 18.6, per
//! device instance): `DB_FLAG_KICK` in its doorbell headers, one look at
//! its QPs, and from then on the thread neither reads its doorbells nor
//! takes its lock until the VM is kicked ([`VmCell::kick`]: a notification,
//! a control command that made work startable, a memory change) or a retry
//! deadline of its QPs comes. Once every VM is parked the thread sleeps.
//! While it has been busy for a while it sets `DB_FLAG_POLLING` instead, so
//! that drivers publish without a fence; VMs then park only with the whole
//! thread, which first clears that flag and waits for a system-wide
//! barrier ([`super::barrier`]) before it asks for kicks.
//!
//! **Peeks.** A VM parked while the thread stays busy with others is not
//! left to its kick alone: a kick crosses the VMM's thread first, which a
//! busy host may not run for a time slice (ms), and an idle tenant's
//! request then waited milliseconds behind another tenant's work (issue
//! 26, N1). So every [`PEEK_WORK`] of work
//! (the DRR's cost model, no clock), plus [`PEEK_PER_QP`] per QP of the
//! VM so that peeking stays a small part of the work, the thread reads a
//! parked VM's producer indices without changing anything
//! ([`DbList::peek`]) and treats new work as a kick. A kick still wakes a
//! sleeping thread; peeks only bound the wait while it is busy.
//!
//! **Kicks.** The thread waits on its VMs' notification kicks itself
//! ([`super::kicks`]) and reads which VMs were kicked when it wakes, while
//! it polls after work (every so many idle sweeps) and with each round of
//! peeks while it is busy.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::warn;
use virtio_rdma_abi::datapath::{DB_FLAG_KICK, DB_FLAG_POLLING};

use super::barrier;
use super::poll::{set_flags, DbList};
use super::poll_window::{self, PollWindow};
use super::scratch::Scratch;
use super::Engine;
use crate::qos::drr::Drr;
use crate::qos::DEFAULT_WEIGHT;
use crate::rnic_path::RnicPath;
use crate::stats::TrafficCounters;
use crate::vm::cell::VmCell;

/// The longest the engine keeps polling after its last piece of work (the
/// window adapts to the traffic below it: [`super::poll_window`]).
pub const POLL_WINDOW: Duration = poll_window::POLL_MAX;

/// Longest sleep while parked. Retry timers (spec 18.20) shorten the
/// sleep to their deadline, so parking never delays them.
const MAX_PARK: Duration = Duration::from_millis(50);

/// A VM's polling list is looked at for parking every this many scans
/// that found no work.
const IDLE_SCANS: u32 = 64;

/// After this long awake with work the engine sets `DB_FLAG_POLLING`: a
/// stream of work, not one request after a sleep. Short bursts do not pay
/// for the barrier the flag costs at the next park.
const PROMOTE_AFTER: Duration = Duration::from_millis(1);

/// A busy thread takes its VMs' kicks, and peeks at parked VMs, after at
/// least this much work (modelled engine time,
/// [`crate::qos::drr::cost_ns`]): an idle VM's new request waits about
/// this long behind others' work, not a scheduler slice (docs/isolation.md,
/// "Parked VMs next to a busy tenant").
pub(super) const PEEK_WORK: u64 = 20_000;

/// A round of peeks looks at this many parked VMs at most, the next
/// round at the next ones: a round stalls the VMs with work for a few µs
/// however many VMs are parked.
pub(super) const PEEK_BATCH: usize = 16;

/// The work between two rounds grows by this much per VM peeked (a peek
/// of a VM reads its list and cell, a few cache misses, ~0.3 µs) ...
pub(super) const PEEK_PER_VM: u64 = 3_000;

/// ... and by this much per QP (a doorbell read, at worst a cache miss,
/// ~0.1 µs): peeking costs at most about a tenth of the thread's time
/// however many VMs and QPs are parked.
pub(super) const PEEK_PER_QP: u64 = 1_000;

/// A re-check before a sleep reads at least this many parked VMs (all of
/// them, if the thread has no more) ...
const RECHECK_BATCH: usize = 32;

/// ... or this share of them, so that every parked VM is re-checked at
/// least every `RECHECK_ROUNDS` × [`MAX_PARK`] (1 s): an idle thread's
/// re-checks cost about the same with 32 parked VMs or 1,000.
const RECHECK_ROUNDS: usize = 20;

/// A round of peeks stops after this long (having read one VM at
/// least): the VMs with work wait no longer, however slow the parked ones'
/// memory is to reach (on a virtual machine whose host pages idle guest
/// memory out lazily, one VM's first read after a while took ~25 µs).
const PEEK_TIME: Duration = Duration::from_micros(20);

/// A re-check stops after this long (one VM at least): an idle thread
/// spends at most about this every [`MAX_PARK`] on re-checks, 0.2 % of a
/// core, however many VMs it has and however slow their memory is.
const RECHECK_TIME: Duration = Duration::from_micros(100);

/// Which round over the parked lists `look_at_parked` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Peeks while the thread is busy.
    Peek,
    /// The re-check before a sleep.
    Recheck,
}

/// What a round over the parked lists read, and how long it took.
#[derive(Debug, Default)]
struct Looked {
    vms: usize,
    qps: usize,
    took: Duration,
}

/// Work a sweep that did any is counted as at least (ns), so that peeks
/// also come while the work is of a kind the cost model does not charge.
const SWEEP_WORK: u64 = 100;

/// The work after a round of peeks at `vms` parked VMs with `qps` QPs
/// in all before the next round (ns of modelled engine time).
pub(super) fn peek_spacing(vms: usize, qps: usize) -> u64 {
    let vms = u64::try_from(vms).unwrap_or(u64::MAX);
    let qps = u64::try_from(qps).unwrap_or(u64::MAX);
    PEEK_WORK
        .saturating_add(vms.saturating_mul(PEEK_PER_VM))
        .saturating_add(qps.saturating_mul(PEEK_PER_QP))
}

/// How many parked VMs (of `parked`) one re-check before a sleep reads.
fn recheck_batch(parked: usize) -> usize {
    RECHECK_BATCH.max(parked.div_ceil(RECHECK_ROUNDS))
}

/// Whether the thread's doorbells may carry `DB_FLAG_POLLING`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polling {
    /// None does: drivers fence.
    Off,
    /// They may: drivers that saw it did not fence.
    On,
    /// Cleared everywhere; the barrier with this ticket makes the stores
    /// of drivers that saw it before visible.
    Draining(u64),
}

impl Engine {
    /// Makes `flags` (0 or `DB_FLAG_POLLING`) the doorbell flags of the
    /// VMs the thread polls, and writes them into every doorbell of those
    /// of `lists` that are not parked (parked ones keep `DB_FLAG_KICK`
    /// and get `flags` when they are woken); false if a VM's lock was
    /// busy, so its doorbells may keep the old value.
    pub(super) fn publish_flags(&self, lists: &[DbList], flags: u32) -> bool {
        self.db_flags.store(flags, Ordering::SeqCst);
        let mut all = true;
        for list in lists.iter().filter(|l| !l.parked) {
            all &= set_flags(list, flags);
        }
        all
    }

    /// Wakes parked list `list`: its VM gets the flags of polled VMs again
    /// (no more kicks); false if its lock was busy (the kick is kept for
    /// the next sweep).
    pub(super) fn unpark(&self, list: &mut DbList) -> bool {
        if !set_flags(list, self.db_flags.load(Ordering::SeqCst)) {
            list.dev.kick();
            return false;
        }
        list.parked = false;
        list.timer = None;
        list.idle_scans = 0;
        list.idle_since = None;
        true
    }

    /// Parks list `k` (spec 18.6, for one VM): asks its VM for kicks, then
    /// looks at every QP of the VM once more through its tables, so that a
    /// doorbell rung before the flag was visible is not missed. False if
    /// that found work, or the VM's lock was busy: the VM stays polled.
    fn park_list<P: RnicPath>(
        &self,
        path: &P,
        vms: &[Option<Arc<VmCell>>],
        lists: &mut [DbList],
        k: usize,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let Some(list) = lists.get(k) else {
            return false;
        };
        path.arm(list.dev.id());
        if !set_flags(list, DB_FLAG_KICK) {
            scratch.contended = true;
            return false;
        }
        fence(Ordering::SeqCst);
        let timers = scratch.next_timer.take();
        let contended = std::mem::take(&mut scratch.contended);
        let found = self.recheck(path, vms, list, k, scratch);
        let busy = std::mem::replace(&mut scratch.contended, contended);
        let timer = std::mem::replace(&mut scratch.next_timer, timers);
        let Some(list) = lists.get_mut(k) else {
            return false;
        };
        if found || busy {
            // Polled on: back to the polled VMs' flags (if the lock is busy
            // now, the VM kicks for a while, which costs only time).
            set_flags(list, self.db_flags.load(Ordering::SeqCst));
            scratch.contended |= busy;
            list.idle_scans = 0;
            list.idle_since = None;
            return false;
        }
        list.parked = true;
        list.timer = timer;
        list.work.clear();
        list.next = 0;
        true
    }

    /// Peeks at the next [`PEEK_BATCH`] parked lists (see the module
    /// documentation), for [`PEEK_TIME`] at most: a list whose doorbells
    /// show work is kicked, so the next sweep wakes it as if its VM had
    /// notified. Returns the work clock of the next round: later the more
    /// VMs and QPs this one read, and at least ten times as long as it
    /// took, so that peeking stays about a tenth of the thread's time even
    /// where an idle VM's memory is slow to reach.
    fn peek_parked<T>(&self, lists: &mut [DbList], scratch: &mut Scratch<T>) -> u64 {
        let round = self.look_at_parked(lists, scratch, PEEK_BATCH, PEEK_TIME, Round::Peek);
        let took = u64::try_from(round.took.as_nanos()).unwrap_or(u64::MAX);
        let spacing = peek_spacing(round.vms, round.qps).max(took.saturating_mul(10));
        scratch.worked.saturating_add(spacing)
    }

    /// Looks at the next parked lists, at most `batch` of them and for
    /// about `budget` (at least one list), going on from where the last
    /// round of its kind stopped. A list the VM changed since it was built
    /// (QPs created or connected while it was parked) is rebuilt first, as
    /// a sweep would; one whose doorbells show work is kicked.
    fn look_at_parked<T>(
        &self,
        lists: &mut [DbList],
        scratch: &mut Scratch<T>,
        batch: usize,
        budget: Duration,
        kind: Round,
    ) -> Looked {
        let start = Instant::now();
        let recheck = kind == Round::Recheck;
        let round = scratch.attention.next_parked(lists, batch, recheck);
        let mut looked = Looked::default();
        for (i, &k) in round.iter().enumerate() {
            if i > 0 && start.elapsed() >= budget {
                // The rest of the batch comes first next time.
                scratch.attention.resume_at(k, recheck);
                break;
            }
            let Some(list) = lists.get_mut(k) else {
                continue;
            };
            looked.vms = looked.vms.saturating_add(1);
            // A VM with a deadline (a retry, or the end of a rate limit's
            // wait) is visited when it comes, all its QPs scanned: its work
            // waits for the clock, not for a notification.
            if recheck && list.timer.is_some() {
                continue;
            }
            list.refresh_if_changed(scratch);
            if list.stale() {
                scratch.attention.look_at(k);
            }
            looked.qps = looked.qps.saturating_add(list.qps.len());
            if recheck && list.dev.kick_pending() {
                continue;
            }
            if list.peek() {
                list.dev.kick();
                if recheck {
                    TrafficCounters::add_single_writer(&self.counters.late_kicks, 1);
                    log::debug!(
                        "VM {}: work found by the idle re-check, its notification had not come",
                        list.dev.id()
                    );
                } else {
                    TrafficCounters::add_single_writer(&self.counters.peeked, 1);
                }
            }
        }
        scratch.attention.end_round(round);
        looked.took = start.elapsed();
        looked
    }

    /// Parks the lists that have been idle for [`POLL_WINDOW`] while the
    /// thread polls others (not while drivers may skip their fence: their
    /// stores need the barrier of a whole-thread park).
    fn park_idle_lists<P: RnicPath>(
        &self,
        path: &P,
        vms: &[Option<Arc<VmCell>>],
        lists: &mut [DbList],
        scratch: &mut Scratch<P::Scratch>,
    ) {
        let mut now = None;
        let mut parked = false;
        for i in 0..scratch.attention.polled().len() {
            let Some(&k) = scratch.attention.polled().get(i) else {
                break;
            };
            let Some(list) = lists.get_mut(k) else {
                continue;
            };
            // The clock is read every so many idle scans.
            if list.parked
                || list.pending()
                || list.idle_scans < IDLE_SCANS
                || list.idle_scans % IDLE_SCANS != 0
                || (P::WANTS_POLL && path.wants_poll(list.dev.id()))
            {
                continue;
            }
            let now = *now.get_or_insert_with(Instant::now);
            let since = *list.idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= POLL_WINDOW
                && self.park_list(path, vms, lists, k, scratch)
            {
                TrafficCounters::add_single_writer(&self.counters.vm_parks, 1);
                parked = true;
            }
        }
        if parked {
            scratch.attention.parked(lists);
        }
    }

    pub(crate) fn run<P: RnicPath>(&self, path: &P) {
        let mut last_work = Instant::now();
        let mut idle_sweeps = 0u64;
        let mut seen = usize::MAX;
        let mut vms: Vec<Option<Arc<VmCell>>> = Vec::new();
        let mut lists: Vec<DbList> = Vec::new();
        let mut scratch = Scratch::<P::Scratch>::new();
        let mut drr = Drr::default();
        // The QoS generation and VM list the weights in `drr` are from.
        let mut weights_seen = None;
        let mut active = Vec::new();
        // Just back from parking, no work found since.
        let mut woke = false;
        // Since when the thread has been awake (for `PROMOTE_AFTER`).
        let mut awake_since = Instant::now();
        let barrier = if self.fence_elision {
            barrier::SystemBarrier::get()
        } else {
            None
        };
        let mut polling = Polling::Off;
        // The transport's descriptors the parked thread also waits on.
        let mut park_fds = Vec::new();
        // The work clock at which kicks are taken, and parked lists
        // peeked, next.
        let mut next_kicks = 0u64;
        let mut next_peek = 0u64;
        // When the parked lists were last re-checked.
        let mut rechecked = Instant::now();
        // How long to poll after work before parking.
        let mut window = if self.pinned {
            PollWindow::default()
        } else {
            PollWindow::fixed()
        };
        self.counters.poll_window_us.store(
            u64::try_from(window.get().as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        while !self.stop.load(Ordering::Acquire) {
            if self.hold.load(Ordering::Acquire) {
                self.held.store(true, Ordering::Release);
                thread::sleep(Duration::from_micros(200));
                continue;
            }
            self.held.store(false, Ordering::Release);
            let generation = self.registry.generation.load(Ordering::Acquire);
            if generation != seen {
                // Every VM (peers are looked up by id), but the polling
                // lists only of the VMs this thread serves.
                vms = self.registry.all_vms();
                // A VM's list survives (parked or not); a new one starts
                // parked and kicked, so the first sweep gives its VM the
                // polled VMs' flags and looks at it.
                let mut old = std::mem::take(&mut lists);
                lists = vms
                    .iter()
                    .flatten()
                    .filter(|d| self.serves(d.id()))
                    .cloned()
                    .map(|d| match old.iter().position(|l| Arc::ptr_eq(&l.dev, &d)) {
                        Some(i) => old.swap_remove(i),
                        None => {
                            let mut l = DbList::new(d, P::TAKES_RECEIVES);
                            l.parked = true;
                            l.dev.kick();
                            l
                        }
                    })
                    .collect();
                scratch.attention.reset(&lists);
                seen = generation;
            }
            // QoS changes apply at the next sweep (one atomic load each).
            let qos = &self.qos;
            let qos_gen = qos.generation();
            scratch.limits.refresh(qos, self.tenancy.as_ref());
            if weights_seen != Some((qos_gen, seen)) {
                weights_seen = Some((qos_gen, seen));
                // Parked VMs held back by a rate limit wait for a deadline
                // of the old settings: look at them under the new ones.
                for list in lists.iter().filter(|l| l.parked) {
                    list.dev.kick();
                }
                drr = Drr::default();
                drr.resize(lists.len());
                scratch.anticipation.reset(lists.len());
                for (k, list) in lists.iter().enumerate() {
                    let id = list.dev.id();
                    let w = qos.vm(id).map_or(DEFAULT_WEIGHT, |s| s.weight);
                    drr.set_weight(k, w);
                    if let Some(t) = self.tenancy.tenant_of(id) {
                        let tw = qos.tenant(t).map_or(DEFAULT_WEIGHT, |s| s.weight);
                        drr.set_group(k, t, tw);
                    }
                }
                // Both were read after `qos_gen` was: everything up to it
                // is now enforced.
                self.qos_applied.store(qos_gen, Ordering::Release);
            }
            let did = self.sweep(path, &vms, &mut lists, &mut scratch, &mut drr, &mut active);
            // VMs idle for a while stop being polled while others are.
            if polling == Polling::Off {
                self.park_idle_lists(path, &vms, &mut lists, &mut scratch);
            }
            if did {
                if std::mem::take(&mut woke) {
                    // Back from parking to work: was the window right?
                    // (`last_work` is still when the thread last worked.)
                    if window.woke_to_work(last_work.elapsed()) {
                        self.counters.poll_window_us.store(
                            u64::try_from(window.get().as_micros()).unwrap_or(u64::MAX),
                            Ordering::Relaxed,
                        );
                    }
                }
                idle_sweeps = 0;
                // Busy: parked VMs are peeked by the work clock, not left
                // to kicks that may wait for this CPU (module docs).
                scratch.worked = scratch.worked.saturating_add(SWEEP_WORK);
                if scratch.worked >= next_kicks {
                    // Swept next: the loop goes on after work.
                    let _ = self.take_kicks(&vms);
                    next_kicks = scratch.worked.saturating_add(PEEK_WORK);
                }
                if scratch.worked >= next_peek {
                    next_peek = self.peek_parked(&mut lists, &mut scratch);
                }
                // Not while a drain is pending: work that comes and goes
                // faster than a barrier would otherwise keep the engine
                // from ever parking. A finished drain leaves every flag
                // clear.
                if let (Polling::Draining(t), Some(b)) = (polling, barrier) {
                    if b.passed(t) {
                        polling = Polling::Off;
                    }
                }
                if polling == Polling::Off
                    && barrier.is_some()
                    && awake_since.elapsed() >= PROMOTE_AFTER
                {
                    self.publish_flags(&lists, DB_FLAG_POLLING);
                    polling = Polling::On;
                }
                continue;
            }
            // Polling pays off after work, when more tends to follow. A wake
            // that found none (a control command, a QoS change, a timer)
            // parks again at once: spinning then would only take the CPU
            // from the control workers, O(QPs) per sweep.
            if !std::mem::take(&mut woke) {
                if idle_sweeps == 0 {
                    last_work = Instant::now();
                }
                // Only looked at modulo 32 (and 0 restarts the idle
                // clock): wrapping after 2^64 sweeps is harmless.
                idle_sweeps = idle_sweeps.wrapping_add(1);
                // Reading the clock costs as much as a sweep of a few QPs:
                // only every so often while spinning.
                if idle_sweeps % 32 != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                // A parked VM kicked while the thread polls: to the sweep,
                // not to sleep with its kick taken.
                if self.take_kicks(&vms) {
                    continue;
                }
                // Polling spins, never yields: a thread that gave its CPU
                // to a busy vCPU would get it back only after the vCPU's
                // time slice (ms), whatever came meanwhile, while a parked
                // one is woken by the kick at once. Past `POLL_MIN` only on
                // a CPU of its own (`poll_window`).
                if last_work.elapsed() < window.get() {
                    continue;
                }
            }
            // Drivers that saw DB_FLAG_POLLING did not fence: clear it, and
            // poll on until a system-wide barrier has made their stores
            // visible (spec 18.6).
            match (polling, barrier) {
                (Polling::On, Some(b)) => {
                    if self.publish_flags(&lists, 0) {
                        polling = Polling::Draining(b.request());
                    }
                    thread::yield_now();
                    continue;
                }
                (Polling::Draining(ticket), Some(b)) if !b.passed(ticket) => {
                    thread::yield_now();
                    continue;
                }
                _ => polling = Polling::Off,
            }
            // Park every VM still polled (each asks for kicks, then is
            // looked at once more through its own tables, so that a
            // doorbell rung before the flag became visible is not missed);
            // the thread sleeps once all are parked.
            scratch.next_timer = None;
            scratch.contended = false;
            let mut all = true;
            for i in 0..scratch.attention.polled().len() {
                if let Some(&k) = scratch.attention.polled().get(i) {
                    all &= self.park_list(path, &vms, &mut lists, k, &mut scratch);
                }
            }
            scratch.attention.parked(&lists);
            if !all || std::mem::take(&mut scratch.contended) {
                // Work, or a VM whose lock was busy: poll on.
                idle_sweeps = 0;
                thread::yield_now();
                continue;
            }
            // Before the sleep rather than after it, so that the work that
            // woke the thread does not wait for it; whatever ended the last
            // sleep: a VM retrying without end keeps the sleeps short, and
            // must not keep the re-check away.
            if rechecked.elapsed() >= MAX_PARK {
                self.recheck_parked(&mut lists, &mut scratch);
                rechecked = Instant::now();
            }
            // A VM kicked since the last sweep (a kick taken while the
            // thread polled, one set by the control path, or the re-check's):
            // nothing would wake the thread for it.
            if self.kicked_vms.pending() {
                continue;
            }
            TrafficCounters::add_single_writer(&self.counters.parks, 1);
            park_fds.clear();
            for list in &lists {
                path.park_fds(list.dev.id(), &mut park_fds);
            }
            let timer = scratch
                .attention
                .earliest()
                .into_iter()
                .chain(scratch.next_timer)
                .min();
            self.park(timer, &park_fds);
            // Swept next, whatever ended the sleep.
            let _ = self.take_kicks(&vms);
            idle_sweeps = 0;
            woke = true;
            awake_since = Instant::now();
        }
    }

    /// Before a sleep, at most every [`MAX_PARK`]: reads the producer
    /// indices of the next parked VMs ([`recheck_batch`]: all of them
    /// while there are at most [`RECHECK_BATCH`]), and serves the VM whose
    /// doorbells show work without a kick pending as if it had been
    /// kicked. A driver notifies
    /// after it saw `DB_FLAG_KICK` (spec 18.6), but its notification
    /// crosses the VMM and a vhost-user worker, threads that a loaded host
    /// may not run for a long while, and a notification lost anywhere on
    /// that way would leave the VM's work unserved for good: this bounds
    /// the wait to about [`MAX_PARK`] with up to [`RECHECK_BATCH`] parked
    /// VMs on the thread, and to `RECHECK_ROUNDS` × [`MAX_PARK`] (1 s)
    /// with more, whatever happens to it, on a host where reading an idle
    /// VM's memory is quick enough for a batch to fit in [`RECHECK_TIME`]
    /// (the bound grows where it is slower: the cost does not). Costs a
    /// read per QP of a batch at most every [`MAX_PARK`], nothing while
    /// the thread is busy (peeks cover that).
    fn recheck_parked<T>(&self, lists: &mut [DbList], scratch: &mut Scratch<T>) {
        let batch = recheck_batch(scratch.attention.parked_count(lists.len()));
        self.look_at_parked(lists, scratch, batch, RECHECK_TIME, Round::Recheck);
    }

    /// Marks the VMs whose drivers kicked the notification queue (among
    /// `vms`, every VM by id) for the next sweep, and counts the kicks.
    /// Returns whether it marked any: the thread must then sweep before it
    /// sleeps, since nothing else will wake it for them.
    fn take_kicks(&self, vms: &[Option<Arc<VmCell>>]) -> bool {
        let mut any = false;
        self.kicks.take(|id| {
            // Only this thread's VMs are registered; a kick that raced
            // with its VM's removal finds no VM, or one it does not serve.
            if let Some(Some(dev)) = vms.get(id) {
                if self.serves(id) {
                    dev.kick();
                    any = true;
                    if let Some(t) = self.tenancy.traffic(id) {
                        TrafficCounters::add(&t.notifications, 1);
                    }
                }
            }
        });
        any
    }

    /// Sleeps until woken, kicked (or one of the transport's `fds` is readable),
    /// [`MAX_PARK`] passes, or `timer` (the earliest retry deadline)
    /// arrives.
    fn park(&self, timer: Option<Instant>, fds: &[std::os::fd::RawFd]) {
        let mut sleep = MAX_PARK;
        if let Some(at) = timer {
            sleep = sleep.min(at.saturating_duration_since(Instant::now()));
        }
        let pfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds: Vec<libc::pollfd> =
            [std::os::fd::AsRawFd::as_raw_fd(&self.wake), self.kicks.fd()]
                .into_iter()
                .chain(fds.iter().copied())
                .map(pfd)
                .collect();
        // Nanosecond resolution: retry waits can be a few microseconds.
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(sleep.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(sleep.subsec_nanos()),
        };
        // SAFETY: `pfds` and `ts` are valid for the duration of the call,
        // the count is their number and a null signal mask leaves the mask
        // unchanged.
        let _ = unsafe {
            libc::ppoll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        let _ = self.wake.read();
    }
}

/// Pins the calling thread to `cpu` (logs and carries on if it cannot).
pub(super) fn pin_to(cpu: usize) {
    // SAFETY: `cpu_set_t` is plain data for which all-zero is a valid
    // (empty) set; CPU_SET writes inside it (it ignores indices past its
    // size) and sched_setaffinity only reads `size_of` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        warn!(
            "cannot pin the engine to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    } else {
        log::info!("engine pinned to CPU {cpu}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round of peeks comes after `PEEK_WORK` of work, later the more
    /// VMs and QPs the last one read: reading them (at worst ~0.3 µs a VM
    /// and ~0.1 µs a doorbell, cache misses) stays within about a tenth of
    /// the work in between, and a round reads `PEEK_BATCH` VMs at most.
    #[test]
    fn peeks_are_spaced_by_what_they_read() {
        assert_eq!(peek_spacing(0, 0), PEEK_WORK);
        assert_eq!(peek_spacing(1, 1), PEEK_WORK + PEEK_PER_VM + PEEK_PER_QP);
        for vms in [1usize, PEEK_BATCH] {
            for qps in [vms, 64, 2_500, 1 << 20] {
                let reads_ns = vms as u64 * 300 + qps as u64 * 100;
                assert!(
                    reads_ns * 10 <= peek_spacing(vms, qps),
                    "{vms} VMs, {qps} QPs"
                );
            }
        }
        let most = peek_spacing(usize::MAX, usize::MAX);
        assert!(most >= PEEK_WORK, "saturates, never wraps");
        // A thread with a few idle VMs of a QP or two looks at them within
        // tens of µs of work: far below a scheduler time slice (ms).
        assert!(peek_spacing(2, 4) <= 30_000);
    }

    /// A re-check reads every parked VM while there are few, and then a
    /// share that brings every VM's turn within `RECHECK_ROUNDS` rounds.
    #[test]
    fn rechecks_read_a_bounded_batch_that_comes_round_in_time() {
        for parked in [0usize, 1, RECHECK_BATCH] {
            assert!(recheck_batch(parked) >= parked, "{parked}: all at once");
        }
        for parked in [RECHECK_BATCH + 1, 1_000, 1_280, 1_281, 100_000] {
            let b = recheck_batch(parked);
            assert!(
                b.saturating_mul(RECHECK_ROUNDS) >= parked,
                "{parked}: round in time"
            );
            assert!(
                b <= RECHECK_BATCH.max(parked / RECHECK_ROUNDS + 1),
                "{parked}: bounded"
            );
        }
    }
}
