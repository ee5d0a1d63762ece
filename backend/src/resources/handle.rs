//! Per-VM handle tables.
//!
//! A handle is `generation << 20 | slot`. The generation of a slot advances
//! every time its object is destroyed, so a stale handle never names the
//! object that later reuses the slot. A slot whose generation is used up
//! (4095 objects) is retired rather than wrapped: a wrap would make the
//! handles of its first objects resolve again. Handle 0 is never issued.

const SLOT_BITS: u32 = virtio_rdma_abi::ctrl::HANDLE_SLOT_BITS;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
const MAX_GEN: u32 = (1 << (32 - SLOT_BITS)) - 1;

/// Most cache lines of a slot [`HandleTable::prefetch`] asks for.
pub const PREFETCH_LINES: usize = 16;

/// Most objects of one kind a table can hold.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;

struct Slot<T> {
    gen: u32,
    value: Option<T>,
}

/// Generation of a retired slot: never matches a handle (handles carry
/// 1..=MAX_GEN), so nothing resolves through the slot again.
const RETIRED: u32 = 0;

/// A table of objects of one kind, addressed by generation-checked handles.
pub struct HandleTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> HandleTable<T> {
    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table holds no live object.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Stores `value` and returns its handle, or gives the value back when
    /// every slot is in use.
    pub fn insert(&mut self, value: T) -> Result<u32, T> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slots.len() >= MAX_SLOTS {
                    return Err(value);
                }
                // Fits: bounded by MAX_SLOTS above.
                let Ok(i) = u32::try_from(self.slots.len()) else {
                    return Err(value);
                };
                self.slots.push(Slot {
                    gen: 1,
                    value: None,
                });
                i
            }
        };
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return Err(value);
        };
        slot.value = Some(value);
        // At most the number of slots.
        self.live = self.live.saturating_add(1);
        Ok((slot.gen << SLOT_BITS) | index)
    }

    fn slot(&self, handle: u32) -> Option<&Slot<T>> {
        let slot = self.slots.get((handle & SLOT_MASK) as usize)?;
        (slot.gen == handle >> SLOT_BITS && slot.value.is_some()).then_some(slot)
    }

    /// Asks the CPU to bring the slot of `handle` into its caches (at most
    /// its first [`PREFETCH_LINES`] cache lines), without reading it: the
    /// engine does this for the next QP it will serve, whose state is
    /// otherwise a cache miss per line when a VM has thousands of QPs.
    #[inline]
    pub fn prefetch(&self, handle: u32) {
        #[cfg(target_arch = "x86_64")]
        if let Some(slot) = self.slots.get((handle & SLOT_MASK) as usize) {
            let p = std::ptr::from_ref(slot).cast::<i8>();
            let lines = std::mem::size_of::<Slot<T>>()
                .div_ceil(64)
                .min(PREFETCH_LINES);
            for k in 0..lines {
                // SAFETY: SSE is part of the x86_64 baseline; a prefetch
                // only hints the cache (it never faults and reads nothing
                // into the program), and the address stays inside the slot.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(k.saturating_mul(64)),
                    );
                }
            }
        }
    }

    /// The object named by `handle`, if it is live.
    pub fn get(&self, handle: u32) -> Option<&T> {
        self.slot(handle).and_then(|s| s.value.as_ref())
    }

    /// Mutable access to the object named by `handle`, if it is live.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        let slot = self.slots.get_mut((handle & SLOT_MASK) as usize)?;
        if slot.gen != handle >> SLOT_BITS {
            return None;
        }
        slot.value.as_mut()
    }

    /// Removes and returns the object named by `handle`.
    pub fn remove(&mut self, handle: u32) -> Option<T> {
        let index = handle & SLOT_MASK;
        let slot = self.slots.get_mut(index as usize)?;
        if slot.gen != handle >> SLOT_BITS {
            return None;
        }
        let value = slot.value.take()?;
        if slot.gen >= MAX_GEN {
            // Every handle of this slot has been issued: retire it. This
            // costs one slot per 4095 objects, so a table runs out only
            // after some 4·10^9 creations (`insert` then fails).
            slot.gen = RETIRED;
        } else {
            // Below MAX_GEN (checked above).
            slot.gen = slot.gen.saturating_add(1);
            self.free.push(index);
        }
        // The slot held a value, so `live >= 1`.
        self.live = self.live.saturating_sub(1);
        Some(value)
    }

    /// Handles of every live object.
    pub fn handles(&self) -> Vec<u32> {
        self.iter().map(|(h, _)| h).collect()
    }

    /// Replaces the contents of `out` with the handles of every live object
    /// (no allocation once `out` is large enough).
    pub fn fill_handles(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend(self.iter().map(|(h, _)| h));
    }

    /// Iterates over live objects with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        // At most MAX_SLOTS slots: the u32 counter does not run out.
        self.slots
            .iter()
            .zip(0u32..)
            .filter_map(|(s, i)| s.value.as_ref().map(|v| ((s.gen << SLOT_BITS) | i, v)))
    }

    /// The generation of every slot (0: retired), for a saved state.
    pub fn slot_gens(&self) -> Vec<u32> {
        self.slots.iter().map(|s| s.gen).collect()
    }

    /// The free slots, the next one to reuse last.
    pub fn free_slots(&self) -> &[u32] {
        &self.free
    }

    /// A table with the slot layout of a saved one and `live` in it:
    /// every slot's generation, the free list, the live objects at their
    /// handles. Refuses a layout that is not one a table can have (a
    /// handle whose slot or generation does not match, a slot both free
    /// and live or listed twice, a live or free slot that is retired, a
    /// slot neither free, live nor retired, too many slots).
    pub fn restore(gens: &[u32], free: &[u32], live: Vec<(u32, T)>) -> Result<Self, String> {
        if gens.len() > MAX_SLOTS {
            return Err(format!("{} slots, at most {MAX_SLOTS}", gens.len()));
        }
        let mut slots: Vec<Slot<T>> = gens.iter().map(|&gen| Slot { gen, value: None }).collect();
        let mut seen = vec![false; gens.len()];
        for &i in free {
            match (slots.get(i as usize), seen.get_mut(i as usize)) {
                (Some(s), Some(mark)) if !*mark && s.gen != RETIRED && s.gen <= MAX_GEN => {
                    *mark = true;
                }
                _ => return Err(format!("free slot {i} is not a free slot")),
            }
        }
        let count = live.len();
        for (handle, value) in live {
            let i = (handle & SLOT_MASK) as usize;
            match (slots.get_mut(i), seen.get_mut(i)) {
                (Some(s), Some(mark))
                    if !*mark && s.gen != RETIRED && s.gen == handle >> SLOT_BITS =>
                {
                    *mark = true;
                    s.value = Some(value);
                }
                _ => return Err(format!("handle {handle:#x} does not fit its slot")),
            }
        }
        if let Some(i) = slots
            .iter()
            .zip(&seen)
            .position(|(s, &mark)| !mark && s.gen != RETIRED)
        {
            return Err(format!("slot {i} is neither free, live nor retired"));
        }
        Ok(HandleTable {
            slots,
            free: free.to_vec(),
            live: count,
        })
    }

    /// Removes every object; generations advance so old handles stay invalid.
    pub fn clear(&mut self) {
        for h in self.handles() {
            self.remove(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table restored from its saved layout hands out what the original
    /// would have next, resolves exactly the live handles, and a layout no
    /// table can have is refused.
    #[test]
    fn a_restored_table_continues_where_the_saved_one_was() {
        let mut t = HandleTable::default();
        let hs: Vec<u32> = (0..4).map(|i| t.insert(i).unwrap_or(0)).collect();
        t.remove(hs[1]);
        t.remove(hs[3]);
        let live: Vec<(u32, i32)> = t.iter().map(|(h, v)| (h, *v)).collect();
        let mut r = HandleTable::restore(&t.slot_gens(), t.free_slots(), live.clone()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r.get(hs[0]), r.get(hs[1]), r.get(hs[2])),
            (Some(&0), None, Some(&2))
        );
        assert_eq!(r.insert(9).ok(), t.insert(9).ok(), "the same next handle");
        let gens = t.slot_gens();
        let free = t.free_slots().to_vec();
        // A slot both free and live; listed free twice; a handle whose
        // generation is not its slot's; a slot neither free nor live.
        let live: Vec<(u32, i32)> = t.iter().map(|(h, v)| (h, *v)).collect();
        let slot = |h: u32| h & SLOT_MASK;
        let mut both = free.clone();
        both.push(slot(live[0].0));
        assert!(HandleTable::restore(&gens, &both, live.clone()).is_err());
        let mut twice = free.clone();
        twice.extend_from_slice(&free);
        assert!(free.is_empty() || HandleTable::restore(&gens, &twice, live.clone()).is_err());
        let mut off = live.clone();
        off[0].0 = off[0].0.wrapping_add(1 << SLOT_BITS);
        assert!(HandleTable::restore(&gens, &free, off).is_err());
        assert!(HandleTable::restore(&gens, &free, live[1..].to_vec()).is_err());
        assert!(HandleTable::<i32>::restore(&vec![1; MAX_SLOTS + 1], &[], vec![]).is_err());
    }

    #[test]
    fn stale_handles_do_not_resolve() {
        let mut t = HandleTable::default();
        let a = t.insert("a").unwrap_or(0);
        assert_ne!(a, 0);
        assert_eq!(t.get(a), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        let b = t.insert("b").unwrap_or(0);
        // Same slot, new generation.
        assert_eq!(a & SLOT_MASK, b & SLOT_MASK);
        assert_ne!(a, b);
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&"b"));
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(u32::MAX), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn exhausted_slot_is_retired_not_wrapped() {
        let mut t = HandleTable::default();
        let mut issued = std::collections::HashSet::new();
        let first = t.insert(0u32).unwrap_or(0);
        assert_ne!(first, 0);
        issued.insert(first);
        t.remove(first);
        // Reuse the slot past its last generation: every handle is new.
        for i in 1..(MAX_GEN + 5) {
            let h = t.insert(i).unwrap_or(0);
            assert_ne!(h, 0);
            assert!(issued.insert(h), "handle {h:#x} issued twice (round {i})");
            assert_eq!(
                t.get(first),
                None,
                "stale first handle resolves (round {i})"
            );
            assert_eq!(t.get(h), Some(&i));
            assert_eq!(t.remove(h), Some(i));
        }
        // Slot 0 was retired after its 4095th object; the table moved on.
        assert_eq!(t.slots.len(), 2);
        assert!(t.slots.first().is_some_and(|s| s.gen == RETIRED));
        let h = t.insert(7).unwrap_or(0);
        assert_eq!(h & SLOT_MASK, 1);
        assert_eq!(t.get(first), None);
        assert_eq!(t.len(), 1);
    }
}
