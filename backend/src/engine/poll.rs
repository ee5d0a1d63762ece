//! The engine's polling lists: per VM, the host addresses of its QPs'
//! doorbell records (or slots) with the producer indices the engine last
//! acted on, read without any lock ([`DbList`]); and the doorbell flags the
//! engine writes into every context's doorbell header.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::mem::DB_RECORD_SIZE;
use virtio_rdma_abi::qp::{QpState, QpType};

use super::attention::Listed;
use super::doorbell::{self, load_pi};
use super::scratch::Scratch;
use crate::memory::HostMem;
use crate::resources::Qp;
use crate::shmem::DoorbellRegion;
use crate::vm::cell::{Locked, VmCell};
use crate::vm::VmState;

/// A polling-list rebuild that took at most this long is not rate-limited
/// (a VM with up to some hundreds of QPs): changes show at the next sweep.
const REBUILD_FREE: Duration = Duration::from_micros(20);

/// After a longer rebuild, the next one waits this many times as long, so
/// rebuilding takes at most a tenth of the engine's time (and of the VM's
/// lock) however fast the VM's control commands come.
const REBUILD_SPACING: u32 = 9;

/// One QP in a [`DbList`].
pub(super) struct DbEntry {
    /// Host address of the QP's doorbell record (`sq_pi`, then `rq_pi`),
    /// or of its doorbell slot (the same two words): valid as long as the
    /// entry, because the list holding it keeps the memory mapped.
    db: *const AtomicU32,
    /// The QP's handle.
    pub(super) handle: u32,
    /// `sq_pi` up to which the engine has acted.
    seen_sq: u32,
    /// `rq_pi` up to which the engine has acted (when `watch_rq`).
    seen_rq: u32,
    /// The QP's state makes `rq_pi` matter (RESET and ERR, own RQ; and
    /// INIT to SQD when the transport takes receives as they are posted).
    watch_rq: bool,
    /// A QP in ERR owes the completion of a message it was receiving in
    /// pieces: work, whatever the indices say.
    owed: bool,
    /// The QP's head WQE waits for a retry until then: no work before.
    due: Option<Instant>,
}

impl DbEntry {
    /// Whether the QP has something to do: a producer index the engine has
    /// not acted on, or a flush it owes; and once its retry is due, whatever
    /// the indices say. `now` is the time, read at most once per scan and
    /// only if a QP waits for a retry.
    #[inline]
    fn has_work(&mut self, now: &mut Option<Instant>) -> bool {
        // A QP whose head WQE waits for a retry is not work before its
        // time, whatever its indices say: a guest with thousands of QPs
        // retrying without end must not make every sweep visit them.
        if let Some(at) = self.due {
            if *now.get_or_insert_with(Instant::now) < at {
                return false;
            }
            self.due = None;
            return true;
        }
        self.moved()
    }

    /// Whether a producer index moved past what the engine acted on, or
    /// the QP owes a flush (`has_work` without the retry wait).
    #[inline]
    fn moved(&self) -> bool {
        // SAFETY: `self.db` is either the host address of a 64-byte,
        // 64-byte aligned doorbell record inside a RAM region of the
        // mapping the list's `host` keeps alive (checked by `HostMem::ptr`
        // when the list was built), or of an 8-byte slot inside the
        // doorbell region the list's `region` keeps alive; in both cases the
        // 4-byte atomics at offsets 0 and 4 are valid and aligned. The
        // guest writes them concurrently; they are only ever accessed
        // atomically by the device.
        let (sq, rq) = unsafe {
            let sq = (*self.db).load(Ordering::Acquire);
            let rq = if self.watch_rq {
                (*self.db.add(1)).load(Ordering::Acquire)
            } else {
                self.seen_rq
            };
            (u32::from_le(sq), u32::from_le(rq))
        };
        sq != self.seen_sq || rq != self.seen_rq || self.owed
    }

    /// The current `sq_pi` of the entry's record.
    fn sq_pi_now(&self) -> u32 {
        // SAFETY: as in `has_work`: `self.db` points into a mapping the
        // list keeps alive, aligned for a 4-byte atomic.
        u32::from_le(unsafe { (*self.db).load(Ordering::Acquire) })
    }
}

/// The engine's polling list of one VM: the host addresses of its QPs'
/// doorbell records with the last producer indices the engine acted on.
///
/// A sweep reads those without taking any lock and locks the VM only when
/// one of its QPs shows work, so idle QPs cost a load each. The list is
/// rebuilt whenever the VM's data-path generation changes (any control
/// command, memory update, reset or disconnect), but a VM whose rebuild is
/// expensive (thousands of QPs) is rebuilt at most so often that rebuilding
/// takes a tenth of the time ([`REBUILD_FREE`]): a VM creating QPs one
/// command after another would otherwise cost a rebuild of all its QPs per
/// command, under its lock. A stale list is safe: it keeps the mappings it
/// points into alive, and the engine looks every QP up afresh in the VM's
/// tables before it acts; a QP it does not list yet is found at the next
/// rebuild or by the parking re-check. Parking does not rely on the list:
/// it sets `DB_FLAG_KICK` and re-checks through the VM's authoritative
/// tables under its lock (spec section 18.6).
pub(super) struct DbList {
    pub(super) dev: Arc<VmCell>,
    /// The VM's data-path generation the list was built for.
    pub(super) gen: Option<u64>,
    /// Keeps the memory behind the `db` pointers mapped (records in guest
    /// RAM, slots in the doorbell region).
    pub(super) host: Option<Arc<HostMem>>,
    pub(super) region: Option<Arc<DoorbellRegion>>,
    /// The transport takes receive WQEs as they are posted
    /// (`RnicPath::TAKES_RECEIVES`).
    pub(super) takes_receives: bool,
    /// No rebuild before this (see [`REBUILD_SPACING`]).
    pub(super) rebuild_after: Option<Instant>,
    pub(super) qps: Vec<DbEntry>,
    /// Indices into `qps` that showed work in the last scan.
    pub(super) work: Vec<usize>,
    /// Index into `work` of the next QP to serve: a pass that ends early
    /// (the VM's deficit ran out) leaves the rest for the next one, and the
    /// doorbells are read again only when `work` is used up (a read costs
    /// a load per QP: with thousands of QPs, rescanning after every short
    /// pass would cost more than the work).
    pub(super) next: usize,
    /// The VM is parked: its contexts carry `DB_FLAG_KICK` and a look at
    /// every QP after that found no work, so the engine neither reads its
    /// doorbells nor takes its lock until it is kicked ([`VmCell::kick`])
    /// or `timer` is due. An engine thread with many VMs polls only those
    /// with work: the cost of a sweep does not grow with idle QPs.
    pub(super) parked: bool,
    /// The earliest retry deadline of the parked VM's QPs.
    pub(super) timer: Option<Instant>,
    /// Consecutive scans that found no work.
    pub(super) idle_scans: u32,
    /// Since when the VM has had no work (read every so many idle scans).
    pub(super) idle_since: Option<Instant>,
}

impl Listed for DbList {
    fn vm(&self) -> usize {
        self.dev.id()
    }

    fn parked(&self) -> bool {
        self.parked
    }

    fn stale(&self) -> bool {
        DbList::stale(self)
    }

    fn deadline(&self) -> Option<Instant> {
        self.timer
    }
}

// The sweep calls `refresh_if_changed`, `pending` and `scan` (and this
// `has_work` per QP) for every VM on every turn of the engine's loop, idle
// or not: `#[inline]` keeps them in the loop, as they were before they had
// a file of their own (a call each cost 20-30 ns of write latency).
impl DbList {
    /// Whether QPs of the last scan are still waiting for their burst.
    #[inline]
    pub(super) fn pending(&self) -> bool {
        self.next < self.work.len()
    }

    pub(super) fn new(dev: Arc<VmCell>, takes_receives: bool) -> Self {
        DbList {
            dev,
            gen: None,
            host: None,
            region: None,
            takes_receives,
            rebuild_after: None,
            qps: Vec::new(),
            work: Vec::new(),
            next: 0,
            parked: false,
            timer: None,
            idle_scans: 0,
            idle_since: None,
        }
    }

    /// Whether the VM changed since the list was built.
    #[inline]
    pub(super) fn stale(&self) -> bool {
        self.gen != Some(self.dev.dp_generation())
    }

    /// Rebuilds the list if the VM changed, unless the last rebuild was
    /// expensive and recent (then `scratch` gets a timer for it).
    #[inline]
    pub(super) fn refresh_if_changed<T>(&mut self, scratch: &mut Scratch<T>) {
        if !self.stale() {
            return;
        }
        let now = Instant::now();
        if let Some(at) = self.rebuild_after.filter(|&at| now < at) {
            scratch.timer(at);
            return;
        }
        if !self.rebuild() {
            scratch.contended = true;
            return;
        }
        let took = now.elapsed();
        self.rebuild_after = (took > REBUILD_FREE)
            .then(|| now.checked_add(took.saturating_mul(REBUILD_SPACING)))
            .flatten();
    }

    /// Rebuilds the list from the VM's tables (under its lock); false if
    /// the lock was busy (the list stays as it was).
    fn rebuild(&mut self) -> bool {
        // Indices into the old `qps` mean nothing now.
        self.work.clear();
        self.next = 0;
        let dev = self.dev.clone();
        let takes_receives = self.takes_receives;
        let built = dev.try_with_dataplane(|state, host| {
            let gen = dev.dp_generation();
            self.qps.clear();
            self.region = state.res.doorbells.as_ref().map(|d| d.region().clone());
            for (handle, qp) in state.res.qps.iter() {
                // An XRC_TGT QP has no rings and no doorbell: nothing to
                // watch (its messages go whole, so no flush is owed).
                if qp.qp_type == QpType::XRC_TGT {
                    continue;
                }
                // A slot has the layout of a record's driver half: `sq_pi`,
                // then `rq_pi` (spec 18.7).
                let db = match &qp.db_slot {
                    Some(slot) => {
                        let p = slot.pi_ptr();
                        if p.is_null() {
                            continue;
                        }
                        p
                    }
                    None => {
                        if qp.db_gpa % DB_RECORD_SIZE != 0 {
                            continue;
                        }
                        let Some(db) = host.ptr(qp.db_gpa, DB_RECORD_SIZE) else {
                            continue;
                        };
                        db.cast_const().cast()
                    }
                };
                // Whatever was posted beyond what the engine has acted on
                // shows up as work in the next scan.
                let (watch_rq, seen_rq) = rq_watch(qp, takes_receives);
                self.qps.push(DbEntry {
                    db,
                    handle,
                    seen_sq: qp.rt.sq_ci,
                    seen_rq,
                    watch_rq,
                    owed: owes_flush(qp),
                    due: None,
                });
            }
            (gen, host.clone())
        });
        match built {
            Locked::Ran((gen, host)) => {
                self.gen = Some(gen);
                self.host = Some(host);
            }
            // The control path holds the lock: the next sweep rebuilds.
            Locked::Busy => return false,
            Locked::Gone => {
                // No memory: nothing to poll until the next generation.
                self.qps.clear();
                self.host = None;
                self.gen = Some(self.dev.dp_generation());
            }
        }
        true
    }

    /// Whether a QP of the parked list shows new work: a scan that changes
    /// nothing, so that a busy thread finds a parked VM's posts without
    /// waiting for its notification ([`super::thread`], "peeks"). QPs that
    /// wait for a retry are left to the list's timer. The caller rebuilds
    /// a stale list first: a QP created or connected while its VM was
    /// parked is not in it.
    pub(super) fn peek(&self) -> bool {
        self.host.is_some()
            && self.dev.running()
            && self.qps.iter().any(|e| e.due.is_none() && e.moved())
    }

    /// Reads every doorbell and collects the QPs with something to do.
    #[inline]
    pub(super) fn scan(&mut self) -> bool {
        self.work.clear();
        self.next = 0;
        // A stopped device's work waits for its start (spec 15.1), which
        // changes the VM's generation and so rebuilds this list.
        if self.host.is_none() || !self.dev.running() {
            return false;
        }
        // Read once, and only if a QP waits for a retry.
        let mut now = None;
        for (i, e) in self.qps.iter_mut().enumerate() {
            if e.has_work(&mut now) {
                self.work.push(i);
            }
        }
        if self.work.is_empty() {
            self.idle_scans = self.idle_scans.saturating_add(1);
            false
        } else {
            self.idle_scans = 0;
            self.idle_since = None;
            true
        }
    }
}

/// Writes `v` into `flags` of the doorbell header of every context of the
/// list's VM: in guest RAM, or its doorbell page's header (spec 18.4,
/// 18.6); new contexts start with it.
///
/// Returns false if the VM's lock was busy, so its headers may keep the
/// old value: the engine must not park the VM then (it would sleep through
/// its posts), nor count on a cleared `DB_FLAG_POLLING`.
///
/// A stopped VM's memory is left alone (spec 15.1): its start writes the
/// flags of the moment into its headers and kicks the engine.
pub(super) fn set_flags(list: &DbList, v: u32) -> bool {
    let ran = list
        .dev
        .try_with_dataplane(|state, mem| state.set_doorbell_flags(mem, v));
    ran != Locked::Busy
}

/// Updates a polling-list entry after its QP was serviced (under the VM's
/// lock): the indices up to which the engine has acted.
pub(super) fn refresh(e: &mut DbEntry, state: &VmState, mem: &HostMem, takes_receives: bool) {
    let Some(qp) = state.res.qps.get(e.handle) else {
        // Gone: never look again (the list is rebuilt with the next
        // generation anyway).
        e.watch_rq = false;
        e.owed = false;
        e.due = None;
        e.seen_sq = e.sq_pi_now();
        e.seen_rq = 0;
        return;
    };
    e.owed = owes_flush(qp);
    // Its retry timer brings it back (the sweep that parks, or the first
    // scan after it).
    e.due = match qp.state {
        QpState::RTS | QpState::SQD => qp.rt.wait.filter(|w| w.index == qp.rt.sq_ci).map(|w| w.at),
        _ => None,
    };
    let own_rq = qp.srq == 0;
    match qp.state {
        QpState::RTS | QpState::ERR | QpState::RESET => e.seen_sq = qp.rt.sq_ci,
        // Draining: the started WQE is still work.
        QpState::SQD if qp.rt.in_flight() => e.seen_sq = qp.rt.sq_ci,
        // States that take no send work: act again only on a new post.
        _ => {
            e.seen_sq =
                load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::SQ).unwrap_or(qp.rt.sq_ci)
        }
    }
    let _ = own_rq;
    (e.watch_rq, e.seen_rq) = rq_watch(qp, takes_receives);
}

/// Whether a QP's `rq_pi` is work, and the index up to which the engine
/// has acted on it: in RESET and ERR (posts are dropped or flushed), and,
/// for a transport that takes receives as they are posted, in the states
/// a host QP accepts them (INIT to SQD). Only a QP's own receive queue.
fn rq_watch(qp: &Qp, takes_receives: bool) -> (bool, u32) {
    let watch = qp.srq == 0
        && match qp.state {
            QpState::RESET | QpState::ERR => true,
            QpState::INIT | QpState::RTR | QpState::RTS | QpState::SQD => takes_receives,
            _ => false,
        };
    let seen = match qp.state {
        _ if !watch => 0,
        QpState::RESET | QpState::ERR => qp.rt.rq_ci,
        _ => qp.rt.rq_ci.wrapping_add(qp.rt.recv_outstanding),
    };
    (watch, seen)
}

/// Whether QP `qp` is in ERR with work the flush still owes: a message it
/// was receiving in pieces, whose receive WQE the flush completes, or send
/// WQEs the transport has taken, behind which the rest waits.
pub(super) fn owes_flush(qp: &Qp) -> bool {
    qp.state == QpState::ERR
        && (qp.rt.inbound.is_some() || qp.rt.outstanding > 0 || qp.rt.recv_outstanding > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry over `words` (`sq_pi`, `rq_pi`) that has acted on both
    /// indices at 0.
    fn entry(words: &[AtomicU32; 2]) -> DbEntry {
        DbEntry {
            db: words.as_ptr(),
            handle: 1,
            seen_sq: 0,
            seen_rq: 0,
            watch_rq: false,
            owed: false,
            due: None,
        }
    }

    /// A QP is work when a producer index moved past what the engine acted
    /// on — `rq_pi` only while it is watched — or when it owes a flush.
    #[test]
    fn work_is_a_new_producer_index_or_an_owed_flush() {
        let words = [AtomicU32::new(0), AtomicU32::new(0)];
        let mut now = None;
        let mut e = entry(&words);
        assert!(!e.has_work(&mut now));
        words[1].store(3, Ordering::Release);
        assert!(!e.has_work(&mut now), "rq_pi is not watched");
        e.watch_rq = true;
        assert!(e.has_work(&mut now), "rq_pi watched");
        e.seen_rq = 3;
        assert!(!e.has_work(&mut now));
        words[0].store(1u32.to_le(), Ordering::Release);
        assert!(e.has_work(&mut now), "a new sq_pi");
        assert_eq!(e.sq_pi_now(), 1);
        e.seen_sq = 1;
        assert!(!e.has_work(&mut now));
        e.owed = true;
        assert!(e.has_work(&mut now), "an owed flush");
        assert!(now.is_none(), "no clock read without a retry");
    }

    /// A peek sees what a scan would see — a new producer index, an owed
    /// flush — but not a QP waiting for a retry (its timer brings it
    /// back), and it changes nothing.
    #[test]
    fn a_peek_sees_posts_and_leaves_retry_waits_to_their_timer() {
        let words = [AtomicU32::new(0), AtomicU32::new(0)];
        let mut e = entry(&words);
        assert!(!e.moved());
        words[0].store(1u32.to_le(), Ordering::Release);
        assert!(e.moved(), "a new sq_pi");
        assert!(e.moved(), "still: a peek changes nothing");
        assert_eq!(e.seen_sq, 0);
        let mut now = None;
        assert!(e.has_work(&mut now), "the scan after the peek sees it too");
        e.seen_sq = 1;
        e.owed = true;
        assert!(e.moved(), "an owed flush");
    }

    /// A QP whose head WQE waits for a retry is not work before its time,
    /// whatever its indices say; at its time it is, once.
    #[test]
    fn a_retry_wait_hides_the_qp_until_due() {
        let words = [AtomicU32::new(5), AtomicU32::new(0)];
        let mut e = entry(&words);
        let t = Instant::now();
        e.due = Some(t + Duration::from_secs(60));
        let mut now = Some(t);
        assert!(!e.has_work(&mut now), "not due, sq_pi moved");
        assert!(e.due.is_some());
        let mut now = Some(t + Duration::from_secs(61));
        assert!(e.has_work(&mut now), "due");
        assert!(e.due.is_none());
        e.seen_sq = 5;
        assert!(!e.has_work(&mut now), "no more work once the retry ran");
        e.due = Some(t);
        let mut now = None;
        assert!(e.has_work(&mut now), "due now");
        assert!(now.is_some(), "the clock was read for it");
    }
}
