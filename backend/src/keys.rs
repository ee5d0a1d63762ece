//! Random numbers for keys and QP numbers, and the map keyed by them.
//!
//! lkeys, rkeys and QPNs must not be predictable: a peer that could guess an
//! rkey could reach memory it was never given. Values come from the kernel's
//! CSPRNG (`getrandom(2)`), drawn in batches so a burst of registrations does
//! not cost a system call each.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;

const POOL: usize = 512;

/// The local DMA key (`DeviceAttr.local_dma_lkey`, `F_MEM_MGT`, spec
/// 18.28): an lkey whose SGEs name guest-physical addresses. Fixed for every
/// instance: it grants nothing remotely, so there is nothing to guess. Its
/// consumer byte is 0 (a driver may not change it) and RNICs that offer
/// `F_MEM_MGT` never hand it, or its bits 31 to 8, to a memory region.
pub const LOCAL_DMA_LKEY: u32 = 0x0000_0100;

/// A buffered source of random 32-bit values.
pub struct KeySource {
    pool: [u8; POOL],
    pos: usize,
}

impl Default for KeySource {
    fn default() -> Self {
        Self::new()
    }
}

impl KeySource {
    /// Creates an empty source; the first draw fills it.
    pub fn new() -> Self {
        KeySource {
            pool: [0; POOL],
            pos: POOL,
        }
    }

    fn refill(&mut self) -> io::Result<()> {
        let mut filled = 0;
        while filled < POOL {
            let rest = &mut self.pool[filled..];
            // SAFETY: the pointer and length describe `rest`, a live, writable
            // slice owned by `self`; getrandom writes at most that many bytes.
            let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            filled += n.unsigned_abs();
        }
        self.pos = 0;
        Ok(())
    }

    /// Returns a random 32-bit value.
    pub fn next_u32(&mut self) -> io::Result<u32> {
        if self.pos + 4 > POOL {
            self.refill()?;
        }
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.pool[self.pos..self.pos + 4]);
        self.pos += 4;
        Ok(u32::from_le_bytes(b))
    }
}

/// A hasher for the 32-bit keys the data path looks up per work request
/// (lkeys, rkeys, QP numbers): one multiply instead of SipHash.
///
/// The keys are drawn by the device from a random source, never chosen by
/// a guest, so a guest cannot aim many keys at one bucket; a keyed hash that
/// resists such flooding is not needed here.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

const KEY_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(KEY_MUL);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(n)).wrapping_mul(KEY_MUL);
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(KEY_MUL);
    }

    fn finish(&self) -> u64 {
        // The table indexes buckets with the low bits: fold the well-mixed
        // high half of the product into them.
        self.0 ^ (self.0 >> 29)
    }
}

/// A map keyed by device-drawn 32-bit keys, hashed with [`KeyHasher`].
pub type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ() {
        let mut k = KeySource::new();
        let v: Vec<u32> = (0..1000).map(|_| k.next_u32().unwrap_or(0)).collect();
        let mut d = v.clone();
        d.sort_unstable();
        d.dedup();
        // 1000 random 32-bit values collide with probability ~1e-4.
        assert!(d.len() >= 999, "too many repeats: {}", d.len());
        assert!(v.iter().any(|&x| x > u32::MAX / 2));
    }
}
