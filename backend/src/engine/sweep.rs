//! One sweep of an engine thread: it reads every VM's doorbells, then
//! serves the VMs with work in one round of deficit round robin, a burst
//! per QP with work; and the parking re-check, which visits every QP of
//! every VM through the VMs' own tables.

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{QpState, QpType};

use virtio_rdma_abi::datapath::QpDoorbell;

use super::doorbell::{self, load_pi};
use super::flush::{drained, flush};
use super::poll::{refresh, DbList};
use super::scratch::Scratch;
use super::wqe::prefetch_send_head;
use super::Engine;
use crate::memory::HostMem;
use crate::qos::drr::{cost_ns, Drr, Turn};
use crate::rnic_path::{RnicPath, Serving};
use crate::stats::TrafficCounters;
use crate::vm::cell::{Locked, VmCell};
use crate::vm::VmState;

/// Doorbells of an anticipated VM read between two readings of the clock
/// (at most; at least one look per reading).
const READS_PER_CLOCK: u32 = 8;

/// A VM with more QPs is not anticipated: each look reads every doorbell
/// of the VM, and one look must stay far below the 2 µs window (64 cache
/// misses, a few µs at worst).
const ANTICIPATE_MAX_QPS: usize = 64;

/// Looks at the doorbells of a VM of `qps` QPs between two readings of
/// the clock: the wait overshoots its window by at most
/// [`READS_PER_CLOCK`] doorbell reads.
fn looks_per_clock(qps: usize) -> u32 {
    match u32::try_from(qps) {
        Ok(0) => READS_PER_CLOCK,
        Ok(q) => READS_PER_CLOCK.checked_div(q).unwrap_or(1).max(1),
        Err(_) => 1,
    }
}

impl Engine {
    /// One sweep: reads every VM's doorbells, then serves the VMs with
    /// work in one round of deficit round robin (a VM that a rate limit
    /// holds back is skipped without being locked until its tokens are
    /// due); true if any work was done.
    pub(super) fn sweep<P: RnicPath>(
        &self,
        path: &P,
        vms: &[Option<Arc<VmCell>>],
        lists: &mut [DbList],
        scratch: &mut Scratch<P::Scratch>,
        drr: &mut Drr,
        active: &mut Vec<usize>,
    ) -> bool {
        active.clear();
        path.sweep_started(&mut scratch.path);
        // The clock is read only when some VM is held back, or a parked
        // one waits for a deadline.
        let mut now = None;
        if P::WANTS_POLL {
            scratch.attention.visit_all();
        }
        let full = scratch.attention.all();
        let visit = scratch
            .attention
            .begin(&self.kicked_vms, lists.len(), &mut now);
        for &k in &visit {
            let Some(list) = lists.get_mut(k) else {
                continue;
            };
            if !list.parked && list.dev.kick_pending() {
                // Polled anyway: a kick taken now lets the next one, once
                // the VM is parked, name it again (`VmCell::kick`).
                list.dev.take_kick();
            }
            if list.parked {
                // Looked at only once kicked, at its retry deadline, or
                // when the RNIC has completions for it.
                let due = list
                    .timer
                    .is_some_and(|t| *now.get_or_insert_with(Instant::now) >= t);
                let wake = list.dev.take_kick()
                    || due
                    || (P::WANTS_POLL && path.wants_poll(list.dev.id()));
                if !wake || !self.unpark(list) {
                    scratch.contended |= wake;
                    // A rebuild put off by its spacing (`refresh_if_changed`)
                    // still happens while the VM stays parked: the list must
                    // let go of what its VM dropped, the memory of a VMM that
                    // left above all. One load while nothing changed.
                    list.refresh_if_changed(scratch);
                    drr.idle(k);
                    scratch.attention.visited(k, list, full);
                    continue;
                }
            }
            scratch.attention.visited(k, list, full);
            list.refresh_if_changed(scratch);
            let polls = P::WANTS_POLL && path.wants_poll(list.dev.id());
            if !list.pending() && !list.scan() && !polls {
                drr.idle(k);
                continue;
            }
            if let Some(until) = scratch.limits.blocked_until(list.dev.id()) {
                if *now.get_or_insert_with(Instant::now) < until {
                    scratch.timer(until);
                    continue;
                }
            }
            active.push(k);
            path.vm_active(&mut scratch.path, k);
        }
        scratch.attention.end(visit);
        // Anticipation needs a VM served last and another VM waiting.
        let anticipated = match scratch.anticipation.take_candidate() {
            Some(k) if !active.is_empty() => self.anticipate(path, lists, scratch, drr, active, k),
            _ => None,
        };
        let did = drr.round(active, |drr, turn| {
            let Some(list) = lists.get_mut(turn.vm) else {
                return false;
            };
            // Later passes of a turn look at the doorbells again once the
            // last scan's QPs are served.
            if !turn.first && !list.pending() && !list.scan() {
                return false;
            }
            self.pass(path, vms, list, scratch, drr, turn)
        });
        if active.len() > 1 {
            scratch.anticipation.served(drr.served_most(active));
        }
        if let Some((k, waited)) = anticipated {
            // The wait is the anticipated VM's, like its work.
            let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
            drr.charge_ns(k, ns);
            scratch.worked = scratch.worked.saturating_add(ns);
        }
        did
    }

    /// Anticipation (`super::anticipate`): if VM `k`, served in the last
    /// sweep that served several, is entitled to far more of the thread
    /// than every VM with work now but has not posted yet, watches its
    /// doorbells for its window. A VM that posts within it joins this
    /// sweep's `active`. Returns the VM watched and for how long. Out of
    /// line: the sweep of a VM alone does not carry it.
    #[cold]
    #[inline(never)]
    fn anticipate<P: RnicPath>(
        &self,
        path: &P,
        lists: &mut [DbList],
        scratch: &mut Scratch<P::Scratch>,
        drr: &mut Drr,
        active: &mut Vec<usize>,
        k: usize,
    ) -> Option<(usize, Duration)> {
        if active.contains(&k) || !drr.entitled(k, active) {
            return None;
        }
        let list = lists
            .get_mut(k)
            .filter(|l| !l.parked && l.qps.len() <= ANTICIPATE_MAX_QPS)?;
        let every = looks_per_clock(list.qps.len());
        let window = scratch.anticipation.window(k)?;
        let start = Instant::now();
        // The clock (~80 ns here) is read every so many looks, and not
        // after the post is seen: the wait counted is that of the last
        // reading.
        let mut waited = Duration::ZERO;
        let mut looks = 0u32;
        loop {
            if list.peek() {
                scratch.anticipation.hit(k, waited);
                TrafficCounters::add_single_writer(&self.counters.anticipated, 1);
                if list.scan() && scratch.limits.blocked_until(list.dev.id()).is_none() {
                    active.push(k);
                    path.vm_active(&mut scratch.path, k);
                    drr.anticipated(k);
                }
                return Some((k, waited));
            }
            looks = looks.wrapping_add(1);
            if looks.checked_rem(every) == Some(0) {
                waited = start.elapsed();
                if waited >= window {
                    scratch.anticipation.miss(k);
                    return Some((k, waited));
                }
            }
            std::hint::spin_loop();
        }
    }

    /// One pass over the QPs of a VM that showed work in the last scan, a
    /// burst each, starting where the last pass stopped. Each burst's cost
    /// ([`cost_ns`] of its work requests and bytes) is charged to the
    /// VM's deficit, and counted in the thread's work clock
    /// ([`Scratch::worked`]); the pass ends when the deficit runs out.
    fn pass<P: RnicPath>(
        &self,
        path: &P,
        vms: &[Option<Arc<VmCell>>],
        list: &mut DbList,
        scratch: &mut Scratch<P::Scratch>,
        drr: &mut Drr,
        turn: Turn,
    ) -> bool {
        let dev = list.dev.clone();
        let vm_id = dev.id();
        let DbList {
            qps,
            work,
            next,
            takes_receives,
            ..
        } = list;
        let takes_receives = *takes_receives;
        path.serving(&mut scratch.path, turn.vm);
        let done = work_on(&dev, |state, mem| {
            let mut did = false;
            let running = state.running();
            let mut cx = Serving {
                vms,
                vm: vm_id,
                state,
                mem,
            };
            if !running {
                // Stopped since the scan (checked under the lock): only
                // what the RNIC took before the stop completes.
                work.clear();
                *next = 0;
                return path.poll_stopped(&mut cx, &mut scratch.path);
            }
            // Completions of work the RNIC took earlier.
            did |= path.poll(&mut cx, &mut scratch.path);
            while let Some(&i) = work.get(*next) {
                *next = next.saturating_add(1);
                // While this QP is served, the CPU fetches the state of the
                // QP after the next one and the head WQE of the next one
                // (whose state it was asked for a QP earlier): with
                // thousands of QPs, each is otherwise a cache miss.
                if let Some(e) = work.get(next.saturating_add(1)).and_then(|&j| qps.get(j)) {
                    cx.state.res.qps.prefetch(e.handle);
                }
                if let Some(e) = work.get(*next).and_then(|&j| qps.get(j)) {
                    if let Some(qp) = cx.state.res.qps.get(e.handle) {
                        prefetch_send_head(cx.mem, qp);
                    }
                }
                let Some(e) = qps.get_mut(i) else {
                    continue;
                };
                scratch.executed = (0, 0);
                let busy = self.service_qp(path, &mut cx, e.handle, scratch);
                did |= busy;
                refresh(e, cx.state, cx.mem, takes_receives);
                // Work that executed no WQE (a flush, a failed QP) still
                // costs one work request, so every turn ends.
                let (wqes, bytes) = scratch.executed;
                let wqes = if busy { u64::from(wqes.max(1)) } else { 0 };
                let cost = cost_ns(wqes, bytes);
                scratch.worked = scratch.worked.saturating_add(cost);
                if !drr.charge_ns(turn.vm, cost) {
                    break;
                }
            }
            did
        });
        done.unwrap_or_else(|| {
            scratch.contended = true;
            false
        })
    }

    /// One pass over every QP of the VM of list `k` through the VM's
    /// tables (the re-check of the parking protocol); true if any work was
    /// done. Also notes the earliest retry deadline
    /// ([`Scratch::next_timer`]).
    pub(super) fn recheck<P: RnicPath>(
        &self,
        path: &P,
        vms: &[Option<Arc<VmCell>>],
        list: &DbList,
        k: usize,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let mut busy = false;
        // By the list's position, so a WRITE posted just before the engine
        // parks is split as in a sweep.
        {
            let vm = &list.dev;
            path.serving(&mut scratch.path, k);
            let done = work_on(vm, |state, mem| {
                let running = state.running();
                let mut cx = Serving {
                    vms,
                    vm: vm.id(),
                    state,
                    mem,
                };
                if !running {
                    return path.poll_stopped(&mut cx, &mut scratch.path);
                }
                let mut handles = std::mem::take(&mut scratch.handles);
                cx.state.res.qps.fill_handles(&mut handles);
                let mut did = false;
                did |= path.poll(&mut cx, &mut scratch.path);
                for &h in handles.iter() {
                    did |= self.service_qp(path, &mut cx, h, scratch);
                }
                scratch.handles = handles;
                did
            });
            match done {
                Some(did) => busy |= did,
                None => scratch.contended = true,
            }
        }
        busy
    }

    /// Takes send work of one QP, or flushes it in the error state.
    fn service_qp<P: RnicPath>(
        &self,
        path: &P,
        cx: &mut Serving<'_>,
        h: u32,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let (vm_id, mem) = (cx.vm, cx.mem);
        let Some(qp) = cx.state.res.qps.get_mut(h) else {
            return false;
        };
        // An XRC_TGT QP has no queues (nor a doorbell record to read).
        if qp.qp_type == QpType::XRC_TGT {
            return false;
        }
        let Some(sq_pi) = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::SQ) else {
            // The record left guest RAM (spec 18.18): a QP whose send
            // queue the device reads fails; in other states nothing reads
            // it (and in ERR nothing of the queue can be trusted).
            if matches!(qp.state, QpState::RTS | QpState::SQD) {
                cx.state.qp_enter_err(h, Some(EventKind::QP_FATAL));
                return true;
            }
            return false;
        };
        if P::TAKES_RECEIVES && qp.srq == 0 {
            if let QpState::INIT | QpState::RTR | QpState::RTS | QpState::SQD = qp.state {
                let rq_pi = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ);
                let taken = qp.rt.rq_ci.wrapping_add(qp.rt.recv_outstanding);
                if let Some(rq_pi) = rq_pi.filter(|&pi| pi != taken) {
                    let (max, _) = scratch.limits.grain(vm_id);
                    let did = path.post_recv(cx, &mut scratch.path, h, rq_pi, max);
                    scratch.limits.charge_ops(vm_id, u64::from(did));
                    // Send work of the same service follows.
                    return self.service_send(path, cx, h, sq_pi, scratch) || did;
                }
            }
        }
        self.service_send(path, cx, h, sq_pi, scratch)
    }

    /// Takes send work of QP `h` (whose `sq_pi` is `sq_pi`), or flushes it
    /// in the error state.
    fn service_send<P: RnicPath>(
        &self,
        path: &P,
        cx: &mut Serving<'_>,
        h: u32,
        sq_pi: u32,
        scratch: &mut Scratch<P::Scratch>,
    ) -> bool {
        let (vm_id, mem) = (cx.vm, cx.mem);
        let Some(qp) = cx.state.res.qps.get_mut(h) else {
            return false;
        };
        match qp.state {
            QpState::RESET => {
                // Nothing posted in RESET is ever executed.
                let rq_pi = load_pi(mem, qp.db_gpa, qp.db_slot.as_ref(), doorbell::RQ)
                    .unwrap_or(qp.rt.rq_ci);
                let changed = qp.rt.sq_ci != sq_pi || qp.rt.rq_ci != rq_pi;
                qp.rt.sq_ci = sq_pi;
                qp.rt.rq_ci = if qp.srq == 0 { rq_pi } else { qp.rt.rq_ci };
                qp.rt.wait = None;
                qp.rt.partial = None;
                // The RNIC dropped what it had taken with the reset.
                qp.rt.outstanding = 0;
                qp.rt.recv_outstanding = 0;
                if changed {
                    let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::SQ_CI, qp.rt.sq_ci);
                    let _ = doorbell::store(mem, qp.db_gpa, QpDoorbell::RQ_CI, qp.rt.rq_ci);
                }
                false
            }
            QpState::ERR => {
                // At most a burst's worth of WQEs per service, each charged
                // as a work request: a guest re-arms the flush for free by
                // bumping its producer index, without a control command.
                if scratch.limits.limited(vm_id) {
                    let traffic = self.tenancy.traffic(vm_id);
                    if let Some(at) = scratch.limits.admit(vm_id, Instant::now(), traffic) {
                        scratch.timer(at);
                        return false;
                    }
                }
                let (max, _) = scratch.limits.grain(vm_id);
                let n = flush(path, cx.state, mem, h, sq_pi, &mut scratch.wqe, max);
                scratch.executed.0 = scratch.executed.0.saturating_add(n);
                scratch.limits.charge_ops(vm_id, u64::from(n));
                n > 0
            }
            // In SQD only the head WQE already started goes on (spec 13.3).
            QpState::RTS => self.run_sq(path, cx, h, sq_pi, scratch),
            QpState::SQD if qp.rt.in_flight() => {
                let did = self.run_sq(path, cx, h, sq_pi, scratch);
                drained(cx.state, h);
                did
            }
            _ => false,
        }
    }
}

/// Runs `f` on a VM's objects and memory under its lock and hands the
/// events it queued to the VM's event worker; returns what `f` returned
/// (false while no VMM is connected).
///
/// The lock is only tried: while the VM's control path holds it, `f` does
/// not run (false), and the VM's work waits for the next sweep rather
/// than every VM of the thread waiting for its command.
/// `None` if the lock was busy.
fn work_on(dev: &VmCell, f: impl FnOnce(&mut VmState, &HostMem) -> bool) -> Option<bool> {
    let ran = dev.try_with_dataplane(|state, mem| {
        let before = state.events.len();
        let did = f(state, mem);
        // QPs that failed meanwhile (their own errors, or a responder's in
        // this VM) are flushed at the next scan (once per pass).
        dev.engine_changed(state);
        (did, state.events.len() != before)
    });
    let (did, events) = match ran {
        Locked::Ran(r) => r,
        Locked::Busy => return None,
        Locked::Gone => return Some(false),
    };
    if events {
        dev.wake_events();
    }
    Some(did)
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestAddress;

    use super::*;
    use crate::config::{DaemonConfig, Limits};
    use crate::engine::testing;
    use crate::rnic_objects::RnicObjects;
    use crate::rnic_path::RnicPath;
    use crate::tenancy::Tenancy;
    use crate::vm::PortIdentity;

    /// A path with nothing in flight: the sweep's own work only.
    struct Idle;

    impl RnicPath for Idle {
        type Scratch = ();
        type Burst<'a> = ();

        fn post_send(
            &self,
            _cx: &mut Serving<'_>,
            _burst: &mut (),
            _ts: &mut (),
            _moved: &mut u64,
            _msg: &crate::rnic_path::Outgoing<'_>,
        ) -> crate::rnic_path::Step {
            crate::rnic_path::Step::InFlight
        }

        fn poll(&self, _cx: &mut Serving<'_>, _ts: &mut ()) -> bool {
            false
        }
    }

    /// A parked VM whose VMM left while its last rebuild's spacing puts
    /// the next one off: the list lets go of the gone guest memory once
    /// the rebuild is due, without a kick (the VM is never kicked again
    /// once its VMM is gone). The fuzzer's `vhost` target found the memory
    /// of a gone VMM held until the VM's next kick (docs/fuzzing.md).
    #[test]
    fn a_parked_list_lets_go_of_a_gone_vmms_memory_when_its_rebuild_is_due() {
        let config = DaemonConfig::new(vec!["/nonexistent/vm0.sock".into()]);
        let tenancy = Arc::new(Tenancy::from_config(&config));
        let rnic: Arc<dyn RnicObjects> = Arc::new(testing::Numbers::default());
        let port = PortIdentity {
            gids: crate::gid_table::GidTable::single([0; 16]),
            guid: 1,
            vm: 0,
        };
        let vm = VmState::new(Limits::default(), rnic.clone(), port, tenancy.clone());
        let cell = Arc::new(VmCell::new(vm, 0, Arc::default()).unwrap());
        let gm = crate::memory::GuestRam::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap();
        let host = Arc::new(HostMem::new(Arc::new(gm)));
        let gone = Arc::downgrade(&host);
        cell.lock().host = Some(host);
        cell.bump_dp_gen();

        let engine = testing::engine(rnic.caps(), tenancy);
        let vms = [Some(cell.clone())];
        let mut lists = vec![DbList::new(cell.clone(), false)];
        let (mut scratch, mut drr, mut active) = (Scratch::new(), Drr::default(), Vec::new());
        drr.resize(1);
        lists[0].refresh_if_changed(&mut scratch);
        assert!(lists[0].host.is_some(), "built over the VM's memory");

        // The VMM leaves while the VM is parked and its last rebuild was
        // expensive: the next one is not due for an hour.
        cell.lock().host = None;
        cell.bump_dp_gen();
        lists[0].parked = true;
        let later = Instant::now() + Duration::from_secs(3600);
        lists[0].rebuild_after = Some(later);
        engine.sweep(&Idle, &vms, &mut lists, &mut scratch, &mut drr, &mut active);
        assert!(
            gone.upgrade().is_some(),
            "kept while the rebuild is put off"
        );
        assert_eq!(scratch.next_timer, Some(later), "a timer for the rebuild");
        assert!(lists[0].parked);

        // The rebuild is due; nobody kicks the VM.
        lists[0].rebuild_after = Some(Instant::now());
        engine.sweep(&Idle, &vms, &mut lists, &mut scratch, &mut drr, &mut active);
        assert!(
            gone.upgrade().is_none(),
            "the gone VMM's memory is unmapped"
        );
        assert!(lists[0].host.is_none() && lists[0].qps.is_empty());
        assert!(lists[0].parked, "still parked: nothing to serve");
        assert!(active.is_empty());
    }

    /// Between two readings of the clock an anticipating thread reads at
    /// most `READS_PER_CLOCK` doorbells, or one look's worth for a VM with
    /// more QPs than that, and a VM anticipated at all has few enough QPs
    /// for one look to stay within a few µs.
    #[test]
    fn an_anticipation_wait_reads_the_clock_within_a_few_doorbells() {
        for qps in 0..=ANTICIPATE_MAX_QPS {
            let every = looks_per_clock(qps) as usize;
            assert!(every >= 1, "{qps} QPs");
            assert!(
                every * qps.max(1) <= (READS_PER_CLOCK as usize).max(qps),
                "{qps} QPs: {every} looks per clock reading"
            );
        }
        assert_eq!(looks_per_clock(1), 8);
        assert_eq!(looks_per_clock(64), 1);
    }
}
