//! A directory of randomly drawn numbers and their owners: QP numbers and
//! memory keys, which must be unique across the VMs of an RNIC and
//! unpredictable (a peer that could guess an rkey could reach memory it was
//! never given).

use crate::keys::{KeyMap, KeySource};

use crate::rnic_objects::RnicError;

/// Give up finding a free random number after this many draws (only when
/// the space is nearly full).
const DRAWS: usize = 64;

/// Numbers drawn from `mask`'s bits, at least `first`, with an owner each.
pub struct Directory<V> {
    used: KeyMap<V>,
    keys: KeySource,
    mask: u32,
    first: u32,
}

impl<V> Directory<V> {
    /// An empty directory of numbers `first..=mask` (`mask` all ones in
    /// its low bits).
    pub fn new(mask: u32, first: u32) -> Self {
        Directory {
            used: KeyMap::default(),
            keys: KeySource::new(),
            mask,
            first,
        }
    }

    /// Draws a free number and records `owner` for it.
    pub fn alloc(&mut self, owner: V) -> Result<u32, RnicError> {
        self.alloc_if(owner, |_| true)
    }

    /// Draws a free number that `allowed` accepts and records `owner` for
    /// it.
    pub fn alloc_if(&mut self, owner: V, allowed: impl Fn(u32) -> bool) -> Result<u32, RnicError> {
        for _ in 0..DRAWS {
            let n = self.keys.next_u32().map_err(|_| RnicError::Random)? & self.mask;
            if n >= self.first && !self.used.contains_key(&n) && allowed(n) {
                self.used.insert(n, owner);
                return Ok(n);
            }
        }
        Err(RnicError::Exhausted)
    }

    /// Records `owner` for number `n` chosen by the caller (a loaded
    /// device state's, spec 20.5): refused if `n` is outside the
    /// directory's numbers, not `allowed` or in use.
    pub fn claim(
        &mut self,
        n: u32,
        owner: V,
        allowed: impl Fn(u32) -> bool,
    ) -> Result<(), RnicError> {
        if n & !self.mask != 0 || n < self.first || !allowed(n) || self.used.contains_key(&n) {
            return Err(RnicError::Invalid);
        }
        self.used.insert(n, owner);
        Ok(())
    }

    /// The owner of `n`, to change.
    pub fn get_mut(&mut self, n: u32) -> Option<&mut V> {
        self.used.get_mut(&n)
    }

    /// Whether `n` is in use.
    pub fn contains(&self, n: u32) -> bool {
        self.used.contains_key(&n)
    }

    /// The owner of `n`.
    pub fn get(&self, n: u32) -> Option<&V> {
        self.used.get(&n)
    }

    /// Releases `n`.
    pub fn free(&mut self, n: u32) {
        self.used.remove(&n);
    }

    /// Numbers in use.
    pub fn len(&self) -> usize {
        self.used.len()
    }

    /// Whether no number is in use.
    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_in_range() {
        let mut d = Directory::new(0x00ff_ffff, 2);
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000u32 {
            let n = d.alloc(i).unwrap();
            assert!((2..=0x00ff_ffff).contains(&n));
            assert!(seen.insert(n));
            assert_eq!(d.get(n), Some(&i));
        }
        assert_eq!(d.len(), 10_000);
        for n in seen {
            d.free(n);
        }
        assert!(d.is_empty());
    }

    #[test]
    fn a_full_space_is_reported() {
        // Two usable numbers: 2 and 3.
        let mut d = Directory::new(3, 2);
        assert!(d.alloc(()).is_ok());
        assert!(d.alloc(()).is_ok());
        assert_eq!(d.alloc(()), Err(RnicError::Exhausted));
    }
}
