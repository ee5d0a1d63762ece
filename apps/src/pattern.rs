//! Reproducible test data: both peers derive the same bytes from a seed, so
//! the receiver can check what arrived without a second copy.

/// Fills `out` with the pattern of `seed` (xorshift64, eight bytes a step:
/// cheap enough for multi-megabyte buffers under instruction emulation).
pub fn fill(out: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// The pattern of `seed`, `len` bytes long.
pub fn make(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed);
    v
}

/// Index of the first byte of `got` that differs from the pattern of `seed`.
pub fn first_mismatch(got: &[u8], seed: u64) -> Option<usize> {
    let want = make(got.len(), seed);
    got.iter().zip(&want).position(|(a, b)| a != b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_and_repeat() {
        assert_eq!(make(100, 7), make(100, 7));
        assert_ne!(make(100, 7), make(100, 8));
        assert_eq!(first_mismatch(&make(13, 3), 3), None);
        let mut v = make(13, 3);
        v[11] ^= 1;
        assert_eq!(first_mismatch(&v, 3), Some(11));
    }
}
