//! Copies to and from guest memory that the guest may change while they run.
//!
//! A `memcpy` on memory another thread writes concurrently is a data race,
//! undefined behaviour for the Rust abstract machine even though it works
//! in practice; volatile accesses are what the language offers for memory
//! shared with an outside agent. A byte-wise volatile loop would cost ~20x
//! a `memcpy`, so the guest side is accessed in aligned 8-byte words (and,
//! on x86_64, 16-byte SSE2 words): as fast as `memcpy` when both sides
//! share their alignment modulo 8. Between two guest mappings, x86_64
//! copies of 128 bytes to 16 KiB are a loop of unaligned 32-byte AVX moves
//! and longer ones one `rep movsb`, both in inline assembly, which the
//! compiler cannot look into either (each as fast as `memcpy` where it is
//! used); shorter copies, and all on CPUs without AVX below 512 bytes, use
//! the words, spliced when the two sides disagree modulo 8 (about a third
//! of `memcpy`'s throughput; docs/benchmarks.md, "Volatile guest copies").
//!
//! Every function takes raw host pointers into guest mappings. The word
//! loops rely on guest mappings being page aligned (mmap), so an aligned
//! word that holds one byte of a mapped range is itself mapped.

use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryError};

/// Width of the guest-side words.
const W: usize = 8;

/// Shortest copy between guest mappings done with `rep movsb` (its start-up
/// cost beats the word loops from about here).
#[cfg(target_arch = "x86_64")]
const MOVSB_MIN: usize = 512;

/// Copies between guest mappings from this length up to [`AVX_MAX`] are a
/// loop of unaligned 32-byte AVX moves where the CPU has AVX: faster than
/// the word loops, and than `rep movsb` for page-sized pieces (scattered
/// 64 KiB WRITEs: 0.80 x `memcpy` against 0.64 x with `rep movsb`;
/// docs/benchmarks.md).
#[cfg(target_arch = "x86_64")]
const AVX_MIN: usize = 128;

/// Longest copy done with the AVX loop; longer ones are `rep movsb`, as
/// fast and without a loop's bookkeeping.
#[cfg(target_arch = "x86_64")]
const AVX_MAX: usize = 16 << 10;

/// One byte, volatile on both sides.
///
/// # Safety
/// `src` valid for a read and `dst` for a write of one byte.
#[inline(always)]
unsafe fn byte(src: *const u8, dst: *mut u8) {
    // SAFETY: by the caller's contract.
    unsafe { dst.write_volatile(src.read_volatile()) }
}

/// Copies `dst.len()` bytes from guest memory at `src` into our own buffer.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes, inside one guest
/// mapping that stays mapped for the call.
pub(crate) unsafe fn from_guest(src: *const u8, dst: &mut [u8]) {
    let n = dst.len();
    let d = dst.as_mut_ptr();
    let head = src.align_offset(W).min(n);
    let mut i = 0;
    // SAFETY: every access below is at an offset `< n` of both ranges; the
    // guest-side word reads are aligned (`src + head` is 8-byte aligned)
    // and inside the range; our side is written unaligned (plain memory).
    // Bounded: `i <= n`, a slice length (at most isize::MAX), so `i + W`
    // cannot overflow; checked arithmetic would slow the hottest copy loop.
    #[allow(clippy::arithmetic_side_effects)]
    unsafe {
        while i < head {
            byte(src.add(i), d.add(i));
            i += 1;
        }
        while i + W <= n {
            let v = src.add(i).cast::<u64>().read_volatile();
            d.add(i).cast::<u64>().write_unaligned(v);
            i += W;
        }
        while i < n {
            byte(src.add(i), d.add(i));
            i += 1;
        }
    }
}

/// Reads `N` little-endian 8-byte words of guest memory at `src`, each
/// with one volatile load, for a caller that decodes them in registers.
///
/// # Safety
/// `src` must be 8-byte aligned and valid for reads of `N * 8` bytes,
/// inside one guest mapping that stays mapped for the call.
#[inline(always)]
pub(crate) unsafe fn words<const N: usize>(src: *const u8) -> [u64; N] {
    let mut w = [0u64; N];
    let s = src.cast::<u64>();
    for (i, v) in w.iter_mut().enumerate() {
        // SAFETY: word `i < N` of the range, aligned, by the caller's
        // contract.
        *v = u64::from_le(unsafe { s.add(i).read_volatile() });
    }
    w
}

/// Copies `src` (our own buffer) to guest memory at `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes, inside one guest
/// mapping that stays mapped for the call.
pub(crate) unsafe fn to_guest(src: &[u8], dst: *mut u8) {
    let n = src.len();
    let s = src.as_ptr();
    let head = dst.align_offset(W).min(n);
    let mut i = 0;
    // SAFETY: as in `from_guest`, with the guest on the writing side.
    // Bounded: as in `from_guest`.
    #[allow(clippy::arithmetic_side_effects)]
    unsafe {
        while i < head {
            byte(s.add(i), dst.add(i));
            i += 1;
        }
        while i + W <= n {
            let v = s.add(i).cast::<u64>().read_unaligned();
            dst.add(i).cast::<u64>().write_volatile(v);
            i += W;
        }
        while i < n {
            byte(s.add(i), dst.add(i));
            i += 1;
        }
    }
}

/// Copies `n` bytes between guest mappings (of one guest or two); the
/// ranges may overlap.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `n` bytes, each inside
/// one page-aligned guest mapping that stays mapped for the call.
pub(crate) unsafe fn guest_to_guest(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if s < d.wrapping_add(n) && d < s.wrapping_add(n) {
        // Overlap (a guest copying within its own memory, rare): byte by
        // byte in the direction that reads every byte before it is
        // overwritten.
        // SAFETY: offsets `< n` of both ranges.
        unsafe {
            if d <= s {
                for i in 0..n {
                    byte(src.add(i), dst.add(i));
                }
            } else {
                for i in (0..n).rev() {
                    byte(src.add(i), dst.add(i));
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if (AVX_MIN..=AVX_MAX).contains(&n) && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked); the ranges are valid for `n >=
        // AVX_MIN` bytes (the caller's contract) and do not overlap
        // (checked above).
        unsafe { avx_copy(src, dst, n) };
        return;
    }
    let head = dst.align_offset(W).min(n);
    let mut i = 0;
    // SAFETY: byte accesses are at offsets `< n`. Word writes are aligned
    // (`dst + head` is) and inside the destination range. Word reads are
    // aligned and each holds at least one byte of the source range, so
    // they lie in the same page of the mapping (see the module comment).
    // Bounded: `i <= n` and `words * W <= n - i`, where `n` is the length of
    // a mapped range (at most isize::MAX); `shift < W`, so the shift amounts
    // are in 8..=56 and fit a u32.
    #[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
    unsafe {
        while i < head {
            byte(src.add(i), dst.add(i));
            i += 1;
        }
        let words = (n - i) / W;
        let (s0, d0) = (src.add(i), dst.add(i).cast::<u64>());
        let shift = s0 as usize % W;
        // From MOVSB_MIN bytes on, one `rep movsb` whatever the alignment:
        // with ERMS/FSRM it is as fast as `memcpy` (rdma_perf write_bw
        // 64 KiB: 33.9 GB/s against 32.9 with the SSE2 word loop).
        #[cfg(target_arch = "x86_64")]
        if n - i >= MOVSB_MIN {
            // SAFETY: `rep movsb` copies `n - i` bytes forward from `s0`
            // to `dst + i`, both inside their ranges, which do not overlap
            // (checked above). The direction flag is clear on entry to an
            // asm block (Rust's x86 asm rules); rcx, rsi and rdi are
            // declared clobbered, no flags change.
            std::arch::asm!(
                "rep movsb",
                inout("rcx") n - i => _,
                inout("rsi") s0 => _,
                inout("rdi") dst.add(i) => _,
                options(nostack, preserves_flags)
            );
            return;
        }
        if shift == 0 {
            aligned_words(s0.cast::<u64>(), d0, words);
        } else {
            // Source and destination disagree modulo 8: read aligned source
            // words and splice neighbours (little-endian byte order).
            let sw = s0.sub(shift).cast::<u64>();
            let (lo_shift, hi_shift) = ((shift * 8) as u32, (64 - shift * 8) as u32);
            let mut lo = sw.read_volatile();
            for k in 0..words {
                let hi = sw.add(k + 1).read_volatile();
                d0.add(k)
                    .write_volatile((lo >> lo_shift) | (hi << hi_shift));
                lo = hi;
            }
        }
        i += words * W;
        while i < n {
            byte(src.add(i), dst.add(i));
            i += 1;
        }
    }
}

/// Copies `buf.len()` bytes of guest memory at `gpa`, which must lie in
/// one region of `mem`, into `buf` (the control path's view of guest
/// memory: vm-memory's own copies are `memcpy`s above 8 bytes).
pub fn read_guest<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    gpa: GuestAddress,
    buf: &mut [u8],
) -> Result<(), GuestMemoryError> {
    let slice = mem.get_slice(gpa, buf.len())?;
    let guard = slice.ptr_guard();
    // SAFETY: `get_slice` checked that `buf.len()` bytes at `gpa` lie in
    // one mapped region; `guard` keeps the mapping alive for the copy.
    unsafe { from_guest(guard.as_ptr(), buf) };
    Ok(())
}

/// Copies `data` to guest memory at `gpa`, which must lie in one region of
/// `mem`, and marks the bytes dirty for the VMM's dirty-page log.
pub fn write_guest<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    gpa: GuestAddress,
    data: &[u8],
) -> Result<(), GuestMemoryError> {
    let slice = mem.get_slice(gpa, data.len())?;
    let guard = slice.ptr_guard_mut();
    // SAFETY: as in `read_guest`, in the other direction.
    unsafe { to_guest(data, guard.as_ptr()) };
    slice.bitmap().mark_dirty(0, data.len());
    Ok(())
}

/// Copies `n >= 128` bytes from `src` to `dst` in 128-byte blocks of four
/// unaligned 32-byte moves, the last block ending at the last byte (it may
/// copy some bytes twice). Inline assembly: the compiler can neither look
/// into nor elide the accesses, as with the volatile word loops.
///
/// # Safety
/// The CPU has AVX; `src` valid for reads and `dst` for writes of `n >=
/// 128` bytes; the ranges do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn avx_copy(src: *const u8, dst: *mut u8, n: usize) {
    const BLOCK: usize = 128;
    /// One block at `s` to `d`, then both advance by a block.
    macro_rules! block {
        () => {
            "vmovdqu {a}, ymmword ptr [{s}]
             vmovdqu {b}, ymmword ptr [{s} + 32]
             vmovdqu {c}, ymmword ptr [{s} + 64]
             vmovdqu {e}, ymmword ptr [{s} + 96]
             vmovdqu ymmword ptr [{d}], {a}
             vmovdqu ymmword ptr [{d} + 32], {b}
             vmovdqu ymmword ptr [{d} + 64], {c}
             vmovdqu ymmword ptr [{d} + 96], {e}"
        };
    }
    let whole = n & !(BLOCK - 1);
    // `n >= BLOCK` (the caller's contract).
    let last = n.saturating_sub(BLOCK);
    // SAFETY: `whole` is a non-zero multiple of BLOCK no larger than `n`
    // (`n >= BLOCK`): the loop reads `[src, src + whole)` and writes
    // `[dst, dst + whole)`, inside the ranges; then one block ending at
    // byte `n` (starting at `n - BLOCK >= 0`). Only the declared registers
    // and flags change; no stack is used.
    unsafe {
        std::arch::asm!(
            "2:",
            block!(),
            "add {s}, 128",
            "add {d}, 128",
            "sub {k}, 128",
            "jnz 2b",
            s = inout(reg) src => _,
            d = inout(reg) dst => _,
            k = inout(reg) whole => _,
            a = out(ymm_reg) _,
            b = out(ymm_reg) _,
            c = out(ymm_reg) _,
            e = out(ymm_reg) _,
            options(nostack),
        );
        if whole != n {
            std::arch::asm!(
                block!(),
                s = in(reg) src.add(last),
                d = in(reg) dst.add(last),
                a = out(ymm_reg) _,
                b = out(ymm_reg) _,
                c = out(ymm_reg) _,
                e = out(ymm_reg) _,
                options(nostack, preserves_flags),
            );
        }
        // No dirty upper halves left behind for SSE code to pay for.
        std::arch::x86_64::_mm256_zeroupper();
    }
}

/// `words` aligned 8-byte words from `s` to `d`, volatile on both sides.
///
/// # Safety
/// Both 8-byte aligned, valid for `words` words.
#[inline(always)]
unsafe fn aligned_words(s: *const u64, d: *mut u64, words: usize) {
    let mut k = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__m128i;
        // SAFETY: by the caller's contract. Taken only when `s` and `d`
        // agree modulo 16; after at most one single word both are 16-byte
        // aligned, as SSE2 words must be. SSE2 is part of the x86_64
        // baseline.
        // Bounded: `k` is 1 only when `words > 0`, so `words - k` does not
        // wrap, and `k + pairs * 2 <= words`, a count of words of a range.
        #[allow(clippy::arithmetic_side_effects)]
        unsafe {
            if (s as usize) % 16 == (d as usize) % 16 {
                if (d as usize) % 16 != 0 && words > 0 {
                    d.write_volatile(s.read_volatile());
                    k = 1;
                }
                let pairs = (words - k) / 2;
                let (s2, d2) = (s.add(k).cast::<__m128i>(), d.add(k).cast::<__m128i>());
                for j in 0..pairs {
                    d2.add(j).write_volatile(s2.add(j).read_volatile());
                }
                k += pairs * 2;
            }
        }
    }
    // SAFETY: by the caller's contract.
    // Bounded: `k < words`.
    #[allow(clippy::arithmetic_side_effects)]
    unsafe {
        while k < words {
            d.add(k).write_volatile(s.add(k).read_volatile());
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment pair and a range of lengths, against a plain copy.
    #[test]
    fn copies_match_plain_copies() {
        let src: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for so in 0..17 {
            for d_off in 0..17 {
                for n in [
                    0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 127, 128, 129, 255, 256, 257, 383,
                    511, 512, 513, 560,
                ] {
                    let want = &src[so..so + n];
                    let mut a = vec![0u8; 600];
                    // SAFETY: in-bounds ranges of live vectors.
                    unsafe { guest_to_guest(src.as_ptr().add(so), a.as_mut_ptr().add(d_off), n) };
                    assert_eq!(&a[d_off..d_off + n], want, "g2g {so} {d_off} {n}");
                    assert!(a[..d_off].iter().all(|&b| b == 0));
                    assert!(a[d_off + n..].iter().all(|&b| b == 0));
                    let mut b = vec![0u8; n];
                    // SAFETY: as above.
                    unsafe { from_guest(src.as_ptr().add(so), &mut b) };
                    assert_eq!(&b[..], want);
                    let mut c = vec![0u8; 600];
                    // SAFETY: as above.
                    unsafe { to_guest(want, c.as_mut_ptr().add(d_off)) };
                    assert_eq!(&c[d_off..d_off + n], want);
                }
            }
        }
    }

    /// Lengths around the thresholds of the AVX loop and `rep movsb`.
    #[test]
    fn long_copies_match_plain_copies() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + i / 256) as u8).collect();
        for n in [
            AVX_MIN - 1,
            AVX_MIN,
            1000,
            4096,
            4097,
            AVX_MAX - 1,
            AVX_MAX,
            AVX_MAX + 1,
            39_000,
        ] {
            for (so, d_off) in [(0, 0), (3, 0), (0, 5), (64, 32), (17, 1)] {
                let mut a = vec![0u8; 40_100];
                // SAFETY: in-bounds ranges of live vectors.
                unsafe { guest_to_guest(src.as_ptr().add(so), a.as_mut_ptr().add(d_off), n) };
                assert_eq!(&a[d_off..d_off + n], &src[so..so + n], "{so} {d_off} {n}");
                assert!(a[..d_off].iter().all(|&b| b == 0));
                assert!(a[d_off + n..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn guest_reads_and_writes_stay_in_one_region() {
        use vm_memory::Bytes;
        let mem = crate::memory::GuestRam::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x10_0000), 0x10_0000),
        ])
        .unwrap();
        let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        write_guest(&mem, GuestAddress(0x1003), &data).unwrap();
        let mut back = vec![0u8; 300];
        mem.read_slice(&mut back, GuestAddress(0x1003)).unwrap();
        assert_eq!(back, data);
        let mut again = vec![0u8; 300];
        read_guest(&mem, GuestAddress(0x1003), &mut again).unwrap();
        assert_eq!(again, data);
        // Across the boundary of two regions, or outside RAM: refused.
        assert!(read_guest(&mem, GuestAddress(0xf_ff00), &mut again).is_err());
        assert!(write_guest(&mem, GuestAddress(0x20_0000), &data).is_err());
    }

    #[test]
    fn overlapping_copies_move_like_memmove() {
        for (from, to) in [(0usize, 5usize), (5, 0), (3, 11), (11, 3)] {
            let mut v: Vec<u8> = (0..64u8).collect();
            let mut want = v.clone();
            want.copy_within(from..from + 40, to);
            let p = v.as_mut_ptr();
            // SAFETY: both ranges inside `v`.
            unsafe { guest_to_guest(p.add(from), p.add(to), 40) };
            assert_eq!(v, want, "{from} -> {to}");
        }
    }
}
