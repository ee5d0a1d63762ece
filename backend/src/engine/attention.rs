//! Which of an engine thread's polling lists a sweep visits: every list it
//! polls, and of the parked ones only those with a reason to be looked at
//! (kicked, a deadline come, a rebuild owed). A sweep then costs the same
//! next to ten idle VMs or a thousand, and so does a kick: the thread
//! finds the kicked VM by its id, not by asking every parked one.
//!
//! The peeks of parked VMs while the thread is busy and the re-checks
//! before a sleep go round the parked lists a batch at a time
//! ([`Attention::next_parked`]), so neither stalls the VMs with work for
//! longer than a batch, however many VMs are parked.

use std::time::Instant;

use crate::vm::cell::KickedVms;

/// What [`Attention`] reads of a thread's polling list (`DbList`).
pub(super) trait Listed {
    /// The VM's id.
    fn vm(&self) -> usize;
    /// Whether the list is parked.
    fn parked(&self) -> bool;
    /// Whether the VM changed since the list was built.
    fn stale(&self) -> bool;
    /// The parked list's earliest deadline.
    fn deadline(&self) -> Option<Instant>;
}

/// No list (in [`Attention::index_of`]).
const NONE: usize = usize::MAX;

/// Which lists the next sweep visits, and the thread's rounds over its
/// parked lists. Indices are into the thread's `lists`; any change of
/// those (VMs added or gone) calls [`Attention::reset`].
#[derive(Debug)]
pub(super) struct Attention {
    /// The lists not parked, ascending.
    polled: Vec<usize>,
    /// Parked lists the next sweep visits besides `polled`: a rebuild
    /// they owe was put off, or their lock was busy.
    look: Vec<usize>,
    /// The next sweep visits every list (after a reset, or when the RNIC
    /// may want parked VMs polled: `RnicPath::WANTS_POLL`).
    all: bool,
    /// Deadlines of parked lists (a retry, a rate limit's hold).
    timers: Vec<(Instant, usize)>,
    /// The earliest of `timers`.
    earliest: Option<Instant>,
    /// The lists of the sweep under way, ascending.
    visit: Vec<usize>,
    /// The lists still polled after it.
    still_polled: Vec<usize>,
    /// Ids of kicked VMs, drained from the thread's [`KickedVms`].
    ids: Vec<usize>,
    /// The list of each VM id the thread serves, or [`NONE`].
    index_of: Vec<usize>,
    /// Where the next round of peeks, and of re-checks, starts.
    peek_at: usize,
    recheck_at: usize,
    /// The lists of the round under way.
    round: Vec<usize>,
}

impl Default for Attention {
    fn default() -> Self {
        Attention {
            polled: Vec::new(),
            look: Vec::new(),
            all: true,
            timers: Vec::new(),
            earliest: None,
            visit: Vec::new(),
            still_polled: Vec::new(),
            ids: Vec::new(),
            index_of: Vec::new(),
            peek_at: 0,
            recheck_at: 0,
            round: Vec::new(),
        }
    }
}

impl Attention {
    /// The thread's lists are now `lists`: the next sweep visits all of
    /// them.
    pub(super) fn reset<L: Listed>(&mut self, lists: &[L]) {
        self.index_of.clear();
        self.polled.clear();
        for (k, list) in lists.iter().enumerate() {
            let id = list.vm();
            if self.index_of.len() <= id {
                self.index_of.resize(id.saturating_add(1), NONE);
            }
            if let Some(slot) = self.index_of.get_mut(id) {
                *slot = k;
            }
            if !list.parked() {
                self.polled.push(k);
            }
        }
        self.look.clear();
        self.timers.clear();
        self.earliest = None;
        self.all = true;
        self.peek_at = 0;
        self.recheck_at = 0;
    }

    /// Whether the next sweep visits every list.
    pub(super) fn all(&self) -> bool {
        self.all
    }

    /// The next sweep visits every list.
    pub(super) fn visit_all(&mut self) {
        self.all = true;
    }

    /// Lists not parked.
    pub(super) fn polled(&self) -> &[usize] {
        &self.polled
    }

    /// How many of the `lists` are parked.
    pub(super) fn parked_count(&self, lists: usize) -> usize {
        lists.saturating_sub(self.polled.len())
    }

    /// The earliest deadline of a parked list.
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.earliest
    }

    /// Starts a sweep over `n` lists: the lists it visits, ascending. The
    /// kicked VMs are drained from `kicked`; `now` is read if a parked
    /// list has a deadline.
    pub(super) fn begin(
        &mut self,
        kicked: &KickedVms,
        n: usize,
        now: &mut Option<Instant>,
    ) -> Vec<usize> {
        let mut visit = std::mem::take(&mut self.visit);
        visit.clear();
        self.still_polled.clear();
        if std::mem::take(&mut self.all) {
            // Every list is visited: the parked ones' deadlines are noted
            // again as they are (`visited`).
            let _ = kicked.drain_into(&mut self.ids);
            self.ids.clear();
            self.look.clear();
            self.timers.clear();
            self.earliest = None;
            visit.extend(0..n);
            return visit;
        }
        visit.extend_from_slice(&self.polled);
        let before = visit.len();
        visit.append(&mut self.look);
        if kicked.drain_into(&mut self.ids) {
            for &id in &self.ids {
                if let Some(&k) = self.index_of.get(id).filter(|&&k| k != NONE) {
                    visit.push(k);
                }
            }
            self.ids.clear();
        }
        if let Some(at) = self.earliest {
            if *now.get_or_insert_with(Instant::now) >= at {
                let now = now.unwrap_or(at);
                let mut earliest = None::<Instant>;
                self.timers.retain(|&(t, k)| {
                    if t <= now {
                        visit.push(k);
                        false
                    } else {
                        earliest = Some(earliest.map_or(t, |e| e.min(t)));
                        true
                    }
                });
                self.earliest = earliest;
            }
        }
        if visit.len() > before {
            visit.retain(|&k| k < n);
            visit.sort_unstable();
            visit.dedup();
        }
        visit
    }

    /// The sweep visited list `k`: notes whether it is still polled, and
    /// what a parked one needs to be visited again.
    pub(super) fn visited<L: Listed>(&mut self, k: usize, list: &L, full: bool) {
        if !list.parked() {
            self.still_polled.push(k);
            return;
        }
        if list.stale() {
            self.look.push(k);
        }
        if full {
            if let Some(t) = list.deadline() {
                self.add_timer(t, k);
            }
        }
    }

    /// Ends the sweep whose lists `begin` gave.
    pub(super) fn end(&mut self, visit: Vec<usize>) {
        std::mem::swap(&mut self.polled, &mut self.still_polled);
        self.visit = visit;
    }

    /// Lists were parked outside a sweep: they leave `polled`, with
    /// their deadlines noted.
    pub(super) fn parked<L: Listed>(&mut self, lists: &[L]) {
        let mut timers = Vec::new();
        self.polled.retain(|&k| match lists.get(k) {
            Some(l) if l.parked() => {
                if let Some(t) = l.deadline() {
                    timers.push((t, k));
                }
                false
            }
            _ => true,
        });
        for (t, k) in timers {
            self.add_timer(t, k);
        }
        // A list parked again and again before its deadline (kicked, then
        // idle) leaves an entry each time: keep at most one per parked
        // list, so a guest cannot grow the thread's memory or sweeps.
        if self.timers.len() > lists.len().saturating_mul(2) {
            self.timers.retain(|&(t, k)| {
                lists
                    .get(k)
                    .is_some_and(|l| l.parked() && l.deadline() == Some(t))
            });
            self.timers.sort_unstable_by_key(|&(_, k)| k);
            self.timers.dedup_by_key(|e| e.1);
            self.earliest = self.timers.iter().map(|&(t, _)| t).min();
        }
    }

    /// A parked list the next sweep must visit (it was found stale).
    pub(super) fn look_at(&mut self, k: usize) {
        self.look.push(k);
    }

    fn add_timer(&mut self, t: Instant, k: usize) {
        self.timers.push((t, k));
        self.earliest = Some(self.earliest.map_or(t, |e| e.min(t)));
    }

    /// The next parked lists of a round (of peeks, or of re-checks:
    /// `recheck`), at most `batch`, going on from where the last round of
    /// that kind stopped: every parked list's turn comes once in
    /// `parked / batch` rounds. Give the list back with
    /// [`Attention::end_round`].
    pub(super) fn next_parked<L: Listed>(
        &mut self,
        lists: &[L],
        batch: usize,
        recheck: bool,
    ) -> Vec<usize> {
        let mut out = std::mem::take(&mut self.round);
        out.clear();
        let n = lists.len();
        let cursor = if recheck {
            &mut self.recheck_at
        } else {
            &mut self.peek_at
        };
        let mut k = cursor.checked_rem(n).unwrap_or(0);
        for _ in 0..n {
            if out.len() >= batch {
                break;
            }
            if lists.get(k).is_some_and(|l| l.parked()) {
                out.push(k);
            }
            k = k.saturating_add(1);
            if k >= n {
                k = 0;
            }
        }
        *cursor = k;
        out
    }

    /// The next round of its kind (`recheck`) starts at list `k` (the
    /// rest of a round cut short).
    pub(super) fn resume_at(&mut self, k: usize, recheck: bool) {
        if recheck {
            self.recheck_at = k;
        } else {
            self.peek_at = k;
        }
    }

    /// Ends the round whose lists `next_parked` gave.
    pub(super) fn end_round(&mut self, round: Vec<usize>) {
        self.round = round;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::engine::poll::DbList;
    use crate::engine::testing;

    /// `n` lists of cells 0 to `n - 1`, built (not stale), those of `parked`
    /// parked, with the attention of a thread that has visited them all.
    fn setup(n: usize, parked: &[usize]) -> (Arc<KickedVms>, Vec<DbList>, Attention) {
        let kicked = Arc::new(KickedVms::default());
        let mut lists: Vec<DbList> = testing::cells(n, &kicked)
            .into_iter()
            .map(|c| DbList::new(c, false))
            .collect();
        let mut scratch = crate::engine::scratch::Scratch::<()>::new();
        for (k, l) in lists.iter_mut().enumerate() {
            l.refresh_if_changed(&mut scratch);
            l.parked = parked.contains(&k);
        }
        let mut attn = Attention::default();
        attn.reset(&lists);
        let visit = attn.begin(&kicked, n, &mut None);
        assert_eq!(
            visit,
            (0..n).collect::<Vec<_>>(),
            "a reset visits every list"
        );
        for &k in &visit {
            attn.visited(k, &lists[k], true);
        }
        attn.end(visit);
        (kicked, lists, attn)
    }

    fn sweep(attn: &mut Attention, kicked: &KickedVms, lists: &[DbList]) -> Vec<usize> {
        let visit = attn.begin(kicked, lists.len(), &mut None);
        for &k in &visit {
            attn.visited(k, &lists[k], false);
        }
        let seen = visit.clone();
        attn.end(visit);
        seen
    }

    /// A sweep visits the polled lists and, of a thousand parked ones,
    /// only those kicked: a kick names its VM, whoever gives it.
    #[test]
    fn a_sweep_visits_the_polled_lists_and_only_the_kicked_parked_ones() {
        let parked: Vec<usize> = (0..1000).filter(|&k| k != 3 && k != 500).collect();
        let (kicked, lists, mut attn) = setup(1000, &parked);
        assert_eq!(attn.polled(), &[3, 500]);
        assert_eq!(attn.parked_count(lists.len()), 998);
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![3, 500]);

        lists[700].dev.kick();
        lists[10].dev.kick();
        lists[700].dev.kick(); // pending already: named once
        assert!(kicked.pending());
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![3, 10, 500, 700]);
        assert!(!kicked.pending());
        assert_eq!(
            sweep(&mut attn, &kicked, &lists),
            vec![3, 500],
            "one visit per kick"
        );
    }

    /// A VM kicked while it is polled has its flag taken by the sweep
    /// (`Engine::sweep`); the next kick, once parked, names it again.
    #[test]
    fn a_vm_is_named_again_once_its_kick_was_taken() {
        let (kicked, lists, mut attn) = setup(4, &[0, 1, 2, 3]);
        lists[2].dev.kick();
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![2]);
        assert!(lists[2].dev.take_kick());
        lists[2].dev.kick();
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![2]);
    }

    /// Parked lists with a deadline are visited once it has come, and
    /// lists parked outside a sweep leave the polled ones with theirs.
    #[test]
    fn parked_lists_are_visited_when_their_deadline_comes() {
        let (kicked, mut lists, mut attn) = setup(6, &[]);
        assert_eq!(attn.polled(), &[0, 1, 2, 3, 4, 5]);
        let soon = Instant::now();
        let later = soon + Duration::from_secs(3600);
        for (k, t) in [(1, Some(soon)), (2, Some(later)), (4, None)] {
            lists[k].parked = true;
            lists[k].timer = t;
        }
        attn.parked(&lists);
        assert_eq!(attn.polled(), &[0, 3, 5]);
        assert_eq!(attn.earliest(), Some(soon));
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![0, 1, 3, 5]);
        assert_eq!(attn.earliest(), Some(later), "a deadline is visited once");
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![0, 3, 5]);

        // Parked again and again before its deadline: one entry per list.
        for _ in 0..100 {
            lists[2].parked = false;
            lists[2].dev.kick();
            assert!(sweep(&mut attn, &kicked, &lists).contains(&2));
            assert!(lists[2].dev.take_kick(), "as the engine's sweep does");
            assert!(attn.polled().contains(&2));
            lists[2].parked = true;
            attn.parked(&lists);
        }
        assert!(
            attn.timers.len() <= 2 * lists.len(),
            "{} entries",
            attn.timers.len()
        );
        assert_eq!(attn.earliest(), Some(later));
    }

    /// A parked list whose VM changed since it was built is visited again
    /// until it is rebuilt (a gone VMM's memory is let go of that way).
    #[test]
    fn a_stale_parked_list_is_visited_until_rebuilt() {
        let (kicked, mut lists, mut attn) = setup(3, &[0, 1, 2]);
        lists[1].dev.bump_dp_gen();
        attn.visit_all();
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![0, 1, 2]);
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![1]);
        lists[1].refresh_if_changed(&mut crate::engine::scratch::Scratch::<()>::new());
        assert_eq!(sweep(&mut attn, &kicked, &lists), vec![1]);
        assert!(sweep(&mut attn, &kicked, &lists).is_empty());
    }

    /// Rounds of peeks (or re-checks) read at most a batch of parked
    /// lists each and come round to every one, skipping polled lists.
    #[test]
    fn rounds_come_round_to_every_parked_list_a_batch_at_a_time() {
        let parked: Vec<usize> = (0..100).filter(|k| k % 10 != 0).collect();
        let (_, lists, mut attn) = setup(100, &parked);
        let mut seen = vec![0usize; 100];
        for _ in 0..90 / 15 {
            let batch = attn.next_parked(&lists, 15, false);
            assert_eq!(batch.len(), 15);
            for &k in &batch {
                seen[k] += 1;
            }
            attn.end_round(batch);
        }
        for (k, n) in seen.iter().enumerate() {
            let want = usize::from(k % 10 != 0);
            assert_eq!(*n, want, "list {k}");
        }
        // The re-checks go round on their own.
        assert_eq!(attn.next_parked(&lists, 2, true), vec![1, 2]);
        // A round cut short after list 1: the next starts at 2.
        attn.resume_at(2, true);
        assert_eq!(attn.next_parked(&lists, 2, true), vec![2, 3]);
        assert!(attn.next_parked(&lists, 0, true).is_empty());
        let (_, empty, mut attn) = setup(0, &[]);
        assert!(attn.next_parked(&empty, 4, false).is_empty());
    }
}
