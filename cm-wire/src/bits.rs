//! Big-endian fields and bit fields of a MAD, read and written without
//! panicking: an offset past the end reads as zero and writes nothing (the
//! callers use constant offsets inside the 256-byte MAD).

/// Reads `N` bytes at `off`.
pub(crate) fn bytes<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| b.get(off..end)) {
        out.copy_from_slice(s);
    }
    out
}

/// Writes `v` at `off`.
pub(crate) fn put(b: &mut [u8], off: usize, v: &[u8]) {
    if let Some(d) = off.checked_add(v.len()).and_then(|end| b.get_mut(off..end)) {
        d.copy_from_slice(v);
    }
}

pub(crate) fn u8_at(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(bytes(b, off))
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(bytes(b, off))
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(bytes(b, off))
}

/// The upper 24 bits of the 32-bit word at `off` (a QPN, EECN or PSN).
pub(crate) fn u24_at(b: &[u8], off: usize) -> u32 {
    u32_at(b, off) >> 8
}

/// Stores `v`'s low 24 bits in the upper 24 bits of the word at `off`,
/// keeping its last byte.
pub(crate) fn put_u24(b: &mut [u8], off: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    put(b, off, &[x, y, z]);
}

/// Bits `from` to `from + width - 1` of byte `off`, counted from its most
/// significant bit.
pub(crate) fn bits_at(b: &[u8], off: usize, from: u32, width: u32) -> u8 {
    let shift = 8u32.saturating_sub(from.saturating_add(width));
    let mask = (1u16 << width.min(8)).wrapping_sub(1);
    let v = (u16::from(u8_at(b, off)) >> shift) & mask;
    u8::try_from(v).unwrap_or(0)
}

/// Sets the bits [`bits_at`] reads to the low `width` bits of `v`.
pub(crate) fn put_bits(b: &mut [u8], off: usize, from: u32, width: u32, v: u8) {
    let shift = 8u32.saturating_sub(from.saturating_add(width));
    let mask = u8::try_from(((1u16 << width.min(8)).wrapping_sub(1)) << shift).unwrap_or(0);
    if let Some(byte) = b.get_mut(off) {
        let shifted = u8::try_from((u16::from(v) << shift) & u16::from(mask)).unwrap_or(0);
        *byte = (*byte & !mask) | shifted;
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_count_from_the_top() {
        let mut b = [0u8; 4];
        put_bits(&mut b, 1, 0, 5, 0b10110);
        put_bits(&mut b, 1, 5, 2, 0b01);
        put_bits(&mut b, 1, 7, 1, 1);
        assert_eq!(b[1], 0b1011_0011);
        assert_eq!(bits_at(&b, 1, 0, 5), 0b10110);
        assert_eq!(bits_at(&b, 1, 5, 2), 0b01);
        assert_eq!(bits_at(&b, 1, 7, 1), 1);
        // Out of range: nothing written, zero read.
        put_bits(&mut b, 9, 0, 8, 0xff);
        assert_eq!(bits_at(&b, 9, 0, 8), 0);
        b[3] = 0x5a;
        put_u24(&mut b, 0, 0xab_cdef);
        assert_eq!(b, [0xab, 0xcd, 0xef, 0x5a], "the word's last byte kept");
        assert_eq!(u24_at(&b, 0), 0xab_cdef);
    }
}
