//! Typed, bounds-checked access to little-endian wire structures.
//!
//! Every structure of the spec is declared with [`wire_struct!`], which generates
//! a plain Rust struct (the parsed representation), its exact wire size, a field
//! layout table (used to check the spec's tables against the code), and
//! parse/emit functions that never panic: a buffer of the wrong length, or a
//! reserved field that is not zero, is an error.

use std::fmt;

/// Why a byte buffer could not be parsed as a wire structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the structure.
    Truncated {
        /// Bytes the structure needs.
        need: usize,
        /// Bytes that were supplied.
        got: usize,
    },
    /// The buffer is longer than the structure (trailing bytes).
    Trailing {
        /// Bytes the structure needs.
        need: usize,
        /// Bytes that were supplied.
        got: usize,
    },
    /// A reserved field is not zero.
    ReservedNotZero {
        /// Byte offset of the field within the structure.
        offset: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { need, got } => {
                write!(f, "truncated: {got} bytes, structure needs {need}")
            }
            WireError::Trailing { need, got } => {
                write!(f, "trailing bytes: {got} bytes, structure has {need}")
            }
            WireError::ReservedNotZero { offset } => {
                write!(f, "reserved field at offset {offset} is not zero")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// One field of a wire structure: its name, byte offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    /// Field name as written in the spec.
    pub name: &'static str,
    /// Byte offset from the start of the structure.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Required alignment in bytes.
    pub align: usize,
}

/// A value with a fixed little-endian wire encoding.
pub trait Field: Sized + Copy + Default {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Required alignment of the field within its structure.
    const ALIGN: usize;
    /// Decodes from the first `SIZE` bytes of `b`; missing bytes read as zero
    /// (callers check the length first, this only keeps the function total).
    fn read(b: &[u8]) -> Self;
    /// Encodes into the first `SIZE` bytes of `b` (bytes past its end are dropped).
    fn write(&self, b: &mut [u8]);
    /// Whether the value is all zero (used for reserved fields).
    fn is_zero(&self) -> bool;
}

macro_rules! scalar_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const ALIGN: usize = std::mem::size_of::<$t>();
            fn read(b: &[u8]) -> Self {
                // A whole value is one load; a copy of unknown length
                // would be a call to `memcpy` per field (the data path
                // reads every WQE this way).
                if let Some(raw) = b.first_chunk() {
                    return <$t>::from_le_bytes(*raw);
                }
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                // `zip` stops at the shorter of the two: no length to check.
                for (d, s) in raw.iter_mut().zip(b) {
                    *d = *s;
                }
                <$t>::from_le_bytes(raw)
            }
            fn write(&self, b: &mut [u8]) {
                // One store, as `read` is one load.
                if let Some(raw) = b.first_chunk_mut() {
                    *raw = self.to_le_bytes();
                    return;
                }
                for (d, s) in b.iter_mut().zip(self.to_le_bytes()) {
                    *d = s;
                }
            }
            fn is_zero(&self) -> bool {
                *self == 0
            }
        }
    )*};
}
scalar_field!(u8, u16, u32, u64);

/// A 128-bit global identifier (GID), in network byte order as on the wire of
/// RoCE; placed at 8-byte aligned offsets in every structure.
impl Field for [u8; 16] {
    const SIZE: usize = 16;
    const ALIGN: usize = 8;
    fn read(b: &[u8]) -> Self {
        let mut raw = [0u8; 16];
        for (d, s) in raw.iter_mut().zip(b) {
            *d = *s;
        }
        raw
    }
    fn write(&self, b: &mut [u8]) {
        for (d, s) in b.iter_mut().zip(self) {
            *d = *s;
        }
    }
    fn is_zero(&self) -> bool {
        self.iter().all(|&x| x == 0)
    }
}

/// A MAC address (48-bit IEEE 802 address), in transmission order: byte 0
/// is the first byte on the wire, the one printed first in `52:54:00:…`.
impl Field for [u8; 6] {
    const SIZE: usize = 6;
    const ALIGN: usize = 1;
    fn read(b: &[u8]) -> Self {
        let mut raw = [0u8; 6];
        for (d, s) in raw.iter_mut().zip(b) {
            *d = *s;
        }
        raw
    }
    fn write(&self, b: &mut [u8]) {
        for (d, s) in b.iter_mut().zip(self) {
            *d = *s;
        }
    }
    fn is_zero(&self) -> bool {
        self.iter().all(|&x| x == 0)
    }
}

/// A complete wire structure.
pub trait Wire: Field {
    /// Name of the structure as used in the spec.
    const NAME: &'static str;
    /// Layout of every field, in order.
    const LAYOUT: &'static [FieldLayout];
    /// The Rust type of every field, in order, as written in the
    /// declaration (`u32`, `[u8; 16]`, `BufferDesc`): for generating the C
    /// header of the ABI.
    const FIELD_TYPES: &'static [&'static str];

    /// Parses exactly `Self::SIZE` bytes. Shorter or longer input, or a
    /// non-zero reserved field, is an error.
    fn parse(buf: &[u8]) -> Result<Self, WireError>;

    /// Parses the leading `Self::SIZE` bytes and returns the rest.
    fn parse_prefix(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if buf.len() < Self::SIZE {
            return Err(WireError::Truncated {
                need: Self::SIZE,
                got: buf.len(),
            });
        }
        let (head, rest) = buf.split_at(Self::SIZE);
        Ok((Self::parse(head)?, rest))
    }

    /// Encodes into a new vector of exactly `Self::SIZE` bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; Self::SIZE];
        self.write(&mut v);
        v
    }
}

/// Computes field offsets from sizes and alignments; used by [`wire_struct!`]
/// in constant context. Alignment violations are reported by
/// [`layout_is_natural`], also at compile time.
// Bounded: `i < N` indexes arrays of length N; `off` and `i` are at most
// the sum of the field sizes and N (a structure's size), far from
// usize::MAX. wire_struct! calls this in constant context only, where an
// overflow would be a compile error anyway.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
pub const fn compute_layout<const N: usize>(
    names: [&'static str; N],
    sizes: [usize; N],
    aligns: [usize; N],
) -> [FieldLayout; N] {
    let mut out = [FieldLayout {
        name: "",
        offset: 0,
        size: 0,
        align: 1,
    }; N];
    let mut off = 0;
    let mut i = 0;
    while i < N {
        out[i] = FieldLayout {
            name: names[i],
            offset: off,
            size: sizes[i],
            align: aligns[i],
        };
        off += sizes[i];
        i += 1;
    }
    out
}

/// True when every field sits at a multiple of its alignment and the total
/// size is a multiple of the largest alignment (no implicit padding anywhere).
pub const fn layout_is_natural(layout: &[FieldLayout], size: usize) -> bool {
    let mut max_align = 1;
    let mut rest = layout;
    while let [f, tail @ ..] = rest {
        // A zero alignment (`checked_rem` is None) is not natural either.
        if !matches!(f.offset.checked_rem(f.align), Some(0)) {
            return false;
        }
        if f.align > max_align {
            max_align = f.align;
        }
        rest = tail;
    }
    matches!(size.checked_rem(max_align), Some(0))
}

/// Largest field alignment of a layout (1 for an empty structure).
pub const fn max_align(layout: &[FieldLayout]) -> usize {
    let mut max_align = 1;
    let mut rest = layout;
    while let [f, tail @ ..] = rest {
        if f.align > max_align {
            max_align = f.align;
        }
        rest = tail;
    }
    max_align
}

/// Byte offset of field `name` in `layout`, for constants that name a
/// field's place (`QpDoorbell::SQ_CI`) instead of writing its offset by
/// hand. Meant for constant context, where a name the layout lacks fails
/// the build.
// The panic is reached only for a misspelt field name, and in constant
// context that is a compile error, never a run-time panic.
#[allow(clippy::panic)]
pub const fn field_offset(layout: &[FieldLayout], name: &str) -> u64 {
    let mut rest = layout;
    while let [f, tail @ ..] = rest {
        if str_eq(f.name, name) {
            return f.offset as u64;
        }
        rest = tail;
    }
    panic!("no field of that name in the layout")
}

/// `a == b`, in constant context.
const fn str_eq(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a, b) {
            ([], []) => return true,
            ([x, xs @ ..], [y, ys @ ..]) if *x == *y => {
                a = xs;
                b = ys;
            }
            _ => return false,
        }
    }
}

/// Declares a wire structure. Fields are laid out in declaration order with no
/// implicit padding; a compile-time check rejects any misaligned field. Fields
/// whose name starts with `reserved` must be zero when parsed.
#[macro_export]
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty ),*
        }

        impl $name {
            const FIELD_NAMES: [&'static str; [$(stringify!($field)),*].len()] =
                [$(stringify!($field)),*];
            const FIELD_LAYOUT: [$crate::wire::FieldLayout; [$(stringify!($field)),*].len()] =
                $crate::wire::compute_layout(
                    Self::FIELD_NAMES,
                    [$(<$ty as $crate::wire::Field>::SIZE),*],
                    [$(<$ty as $crate::wire::Field>::ALIGN),*],
                );
        }

        const _: () = assert!(
            $crate::wire::layout_is_natural(
                &$name::FIELD_LAYOUT,
                0 $(+ <$ty as $crate::wire::Field>::SIZE)*
            ),
            concat!("wire structure ", stringify!($name), " is not naturally aligned")
        );

        impl $crate::wire::Field for $name {
            const SIZE: usize = 0 $(+ <$ty as $crate::wire::Field>::SIZE)*;
            const ALIGN: usize = $crate::wire::max_align(&$name::FIELD_LAYOUT);
            fn read(b: &[u8]) -> Self {
                #[inline(always)]
                #[allow(unused_variables, unused_mut, unused_assignments)]
                fn fields(b: &[u8]) -> $name {
                    let mut off = 0usize;
                    $(
                        let $field = <$ty as $crate::wire::Field>::read(b.get(off..).unwrap_or(&[]));
                        off = off.saturating_add(<$ty as $crate::wire::Field>::SIZE);
                    )*
                    $name { $($field),* }
                }
                // A whole structure's bytes: with the length known, every
                // field is one load at a constant offset (the data path
                // reads every WQE this way).
                match b.first_chunk::<{ <$name as $crate::wire::Field>::SIZE }>() {
                    Some(whole) => fields(whole),
                    None => fields(b),
                }
            }
            #[allow(unused_variables, unused_mut, unused_assignments)]
            fn write(&self, b: &mut [u8]) {
                let mut off = 0usize;
                $(
                    if let Some(dst) = b.get_mut(off..) {
                        $crate::wire::Field::write(&self.$field, dst);
                    }
                    off = off.saturating_add(<$ty as $crate::wire::Field>::SIZE);
                )*
            }
            fn is_zero(&self) -> bool {
                true $(&& $crate::wire::Field::is_zero(&self.$field))*
            }
        }

        impl $crate::wire::Wire for $name {
            const NAME: &'static str = stringify!($name);
            const LAYOUT: &'static [$crate::wire::FieldLayout] = &$name::FIELD_LAYOUT;
            const FIELD_TYPES: &'static [&'static str] = &[$(stringify!($ty)),*];

            #[allow(unused_variables, unused_mut, unused_assignments)]
            fn parse(buf: &[u8]) -> Result<Self, $crate::wire::WireError> {
                use $crate::wire::Field as _;
                if buf.len() < Self::SIZE {
                    return Err($crate::wire::WireError::Truncated { need: Self::SIZE, got: buf.len() });
                }
                if buf.len() > Self::SIZE {
                    return Err($crate::wire::WireError::Trailing { need: Self::SIZE, got: buf.len() });
                }
                let v = Self::read(buf);
                let mut off = 0usize;
                $(
                    if stringify!($field).starts_with("reserved")
                        && !$crate::wire::Field::is_zero(&v.$field)
                    {
                        return Err($crate::wire::WireError::ReservedNotZero { offset: off });
                    }
                    off = off.saturating_add(<$ty as $crate::wire::Field>::SIZE);
                )*
                Ok(v)
            }
        }
    };
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    crate::wire_struct! {
        /// Test structure.
        pub struct Sample {
            /// a
            a: u64,
            /// b
            b: u32,
            /// reserved
            reserved: u16,
            /// c
            c: u16,
            /// gid
            gid: [u8; 16],
        }
    }

    /// A scalar reads its bytes when there are enough, the bytes there are
    /// (the rest zero) when not; writes likewise.
    #[test]
    fn scalars_of_whole_and_short_buffers() {
        let b = [1u8, 2, 3, 4, 5];
        assert_eq!(u32::read(&b), 0x0403_0201);
        assert_eq!(u32::read(&b[..3]), 0x03_0201);
        assert_eq!(u64::read(&b), 0x05_0403_0201);
        assert_eq!(u16::read(&[]), 0);
        let mut out = [0xffu8; 5];
        0x0403_0201u32.write(&mut out);
        assert_eq!(out, [1, 2, 3, 4, 0xff]);
        let mut short = [0xffu8; 2];
        0x0403_0201u32.write(&mut short);
        assert_eq!(short, [1, 2]);
    }

    #[test]
    fn field_offsets_come_from_the_layout() {
        const B: u64 = field_offset(Sample::LAYOUT, "b");
        const GID: u64 = field_offset(Sample::LAYOUT, "gid");
        assert_eq!((B, GID), (8, 16));
        // A name is matched whole, not as a prefix.
        assert!(!str_eq("reserved", "reserved0") && !str_eq("a", "") && str_eq("", ""));
    }

    #[test]
    fn roundtrip_and_layout() {
        assert_eq!(Sample::SIZE, 32);
        let offs: Vec<_> = Sample::LAYOUT.iter().map(|f| (f.name, f.offset)).collect();
        assert_eq!(
            offs,
            vec![("a", 0), ("b", 8), ("reserved", 12), ("c", 14), ("gid", 16)]
        );
        let s = Sample {
            a: 0x0102_0304_0506_0708,
            b: 7,
            reserved: 0,
            c: 0xbeef,
            gid: [9; 16],
        };
        let bytes = s.to_bytes();
        assert_eq!(&bytes[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(Sample::parse(&bytes), Ok(s));
    }

    #[test]
    fn rejects_bad_lengths_and_reserved() {
        let mut bytes = Sample::default().to_bytes();
        assert!(matches!(
            Sample::parse(&bytes[..31]),
            Err(WireError::Truncated { need: 32, got: 31 })
        ));
        bytes.push(0);
        assert!(matches!(
            Sample::parse(&bytes),
            Err(WireError::Trailing { .. })
        ));
        bytes.pop();
        bytes[13] = 1;
        assert_eq!(
            Sample::parse(&bytes),
            Err(WireError::ReservedNotZero { offset: 12 })
        );
        assert!(Sample::parse(&[]).is_err());
    }
}
