//! The software RNIC's memory keys: one space for the lkeys and rkeys of
//! every VM of the daemon. A fast-registration region (`ALLOC_MR`) owns all
//! 256 keys that share its bits 31 to 8, since its guest picks bits 7 to 0
//! at each registration (spec 12.22); the local DMA key is never a region's.

use crate::keys::{KeyMap, KeySource, LOCAL_DMA_LKEY};
use crate::rnic::directory::Directory;
use crate::rnic_objects::RnicError;

/// Bits 31 to 8 of a key.
fn prefix(key: u32) -> u32 {
    key.checked_shr(8).unwrap_or(0)
}

/// The keys of the software RNIC.
pub struct KeySpace {
    /// Keys of regions registered by `REG_MR` (lkeys and rkeys alike).
    keys: Directory<()>,
    /// How many of `keys` have each value of bits 31 to 8.
    prefixes: KeyMap<u32>,
    /// Bits 31 to 8 of the keys of fast-registration regions.
    fast: Directory<()>,
    /// The first consumer byte of a fast-registration region's key.
    bytes: KeySource,
}

impl Default for KeySpace {
    fn default() -> Self {
        Self::new()
    }
}

impl KeySpace {
    /// No key in use: keys are non-zero 32-bit values.
    pub fn new() -> Self {
        Self::with_masks(u32::MAX, 0x00ff_ffff)
    }

    /// Keys drawn from `key_mask`'s bits, fast-registration prefixes from
    /// `prefix_mask`'s (tests use small spaces to force collisions).
    fn with_masks(key_mask: u32, prefix_mask: u32) -> Self {
        KeySpace {
            keys: Directory::new(key_mask, 1),
            prefixes: KeyMap::default(),
            // Prefix 0 would give key 0 to consumer byte 0.
            fast: Directory::new(prefix_mask, 1),
            bytes: KeySource::new(),
        }
    }

    /// Draws a key for a region registered by `REG_MR`: not the local DMA
    /// key, and not one of the 256 keys of a fast-registration region.
    pub fn alloc(&mut self) -> Result<u32, RnicError> {
        let fast = &self.fast;
        let key = self
            .keys
            .alloc_if((), |k| k != LOCAL_DMA_LKEY && !fast.contains(prefix(k)))?;
        let n = self.prefixes.entry(prefix(key)).or_insert(0);
        *n = n.saturating_add(1);
        Ok(key)
    }

    /// Takes `key` for a region as [`KeySpace::alloc`] would have drawn it
    /// (a loaded device state's key): refused if it is in use, the local
    /// DMA key, or one of a fast-registration region's keys.
    pub fn claim(&mut self, key: u32) -> Result<(), RnicError> {
        let fast = &self.fast;
        self.keys.claim(key, (), |k| {
            k != LOCAL_DMA_LKEY && !fast.contains(prefix(k))
        })?;
        let n = self.prefixes.entry(prefix(key)).or_insert(0);
        *n = n.saturating_add(1);
        Ok(())
    }

    /// Takes the key of a fast-registration region or window as
    /// [`KeySpace::alloc_fast`] would have drawn it: refused if any key
    /// shares its bits 31 to 8.
    pub fn claim_fast(&mut self, key: u32) -> Result<(), RnicError> {
        let prefixes = &self.prefixes;
        let dma = prefix(LOCAL_DMA_LKEY);
        self.fast
            .claim(prefix(key), (), |p| p != dma && !prefixes.contains_key(&p))
    }

    /// Frees a key [`KeySpace::alloc`] drew.
    pub fn free(&mut self, key: u32) {
        if !self.keys.contains(key) {
            return;
        }
        self.keys.free(key);
        let p = prefix(key);
        if let Some(n) = self.prefixes.get_mut(&p) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.prefixes.remove(&p);
            }
        }
    }

    /// Draws the key of a fast-registration region: bits 31 to 8 that no
    /// live key has, nor the local DMA key, and a random first consumer
    /// byte (the guest's later ones follow from it: they add nothing a
    /// peer would have to guess, but this one does).
    pub fn alloc_fast(&mut self) -> Result<u32, RnicError> {
        let byte = self.bytes.next_u32().map_err(|_| RnicError::Random)? & 0xff;
        let prefixes = &self.prefixes;
        let dma = prefix(LOCAL_DMA_LKEY);
        let p = self
            .fast
            .alloc_if((), |p| p != dma && !prefixes.contains_key(&p))?;
        Ok(p.checked_shl(8).unwrap_or(0) | byte)
    }

    /// Frees the key of a fast-registration region (any consumer byte).
    pub fn free_fast(&mut self, key: u32) {
        self.fast.free(prefix(key));
    }

    /// Keys in use: those of `REG_MR` regions, and one per
    /// fast-registration region.
    pub fn len(&self) -> usize {
        self.keys.len().saturating_add(self.fast.len())
    }

    /// Whether no key is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a space small enough that every draw collides: a fast region's
    /// 256 keys are never another region's, whichever is drawn first, and
    /// the local DMA key and its prefix are never handed out.
    #[test]
    fn fast_regions_own_their_prefix() {
        // Keys 1..=0x3ff (prefixes 0 to 3); fast prefixes 1 to 3, of which
        // 1 is the local DMA key's.
        assert_eq!(prefix(LOCAL_DMA_LKEY), 1);
        for round in 0..200 {
            let mut s = KeySpace::with_masks(0x3ff, 0x3);
            let mut keys = Vec::new();
            let mut fast = Vec::new();
            for i in 0..40 {
                if (i + round) % 3 == 0 {
                    if let Ok(k) = s.alloc_fast() {
                        fast.push(k);
                    }
                } else if let Ok(k) = s.alloc() {
                    keys.push(k);
                }
            }
            for &f in &fast {
                assert_ne!(prefix(f), prefix(LOCAL_DMA_LKEY));
                assert!(keys.iter().all(|&k| prefix(k) != prefix(f)), "{f:#x}");
            }
            assert!(!keys.contains(&LOCAL_DMA_LKEY));
            let mut p: Vec<u32> = fast.iter().map(|&f| prefix(f)).collect();
            p.dedup();
            assert_eq!(p.len(), fast.len(), "two fast regions share a prefix");
            assert_eq!(s.len(), keys.len() + fast.len());
            for k in keys {
                s.free(k);
            }
            for f in fast {
                s.free_fast(f | 0x5a);
            }
            assert!(s.is_empty());
        }
    }

    /// A prefix comes free for fast regions once its last key is freed.
    #[test]
    fn a_prefix_is_free_once_its_keys_are() {
        let mut s = KeySpace::with_masks(0x3ff, 0x3);
        // Take every key of prefixes 2 and 3 (and 0, 1 where drawn).
        let mut keys = Vec::new();
        while let Ok(k) = s.alloc() {
            keys.push(k);
        }
        assert_eq!(s.alloc_fast(), Err(RnicError::Exhausted));
        let in_3: Vec<u32> = keys.iter().copied().filter(|&k| prefix(k) == 3).collect();
        assert!(!in_3.is_empty());
        for &k in &in_3 {
            s.free(k);
        }
        assert_eq!(s.alloc_fast().map(prefix), Ok(3));
        // And no REG_MR key gets prefix 3 while the fast region lives.
        for _ in 0..100 {
            if let Ok(k) = s.alloc() {
                assert_ne!(prefix(k), 3);
                s.free(k);
            }
        }
    }

    #[test]
    fn full_size_keys_are_non_zero_and_distinct() {
        let mut s = KeySpace::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..5000 {
            let k = s.alloc().unwrap();
            assert!(k != 0 && k != LOCAL_DMA_LKEY);
            assert!(seen.insert(k));
            let f = s.alloc_fast().unwrap();
            assert!(prefix(f) != 0);
            assert!(seen.insert(f));
        }
        assert_eq!(s.len(), 10_000);
    }
}
