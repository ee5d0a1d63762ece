//! The framing of a saved device state (spec 20.3).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "VRDMAST\0"
//!      8     4  format version (le32)
//!     12     4  flags (le32, 0)
//!     16     8  body length in bytes (le64)
//!     24     4  CRC-32 (IEEE) of the body (le32)
//!     28     4  reserved (0)
//!     32     …  body: the `DeviceState`, postcard-encoded; in version 2
//!               followed by its `DoorbellsState`, postcard-encoded
//! ```
//!
//! A state without doorbell pages is written as version 1, which older
//! daemons read; only a hand-over's state with doorbell pages needs 2.
//!
//! postcard (a maintained serde format with a frozen 1.0 wire format) does
//! the body: the state is a tree of plain integers, vectors and enums, and
//! a hand-written encoder would repeat what serde derives. The frame around
//! it is ours so that a reader can refuse a state by its version and
//! length before decoding anything, and can bound what it reads from a
//! front-end's file descriptor.

use crate::config::Limits;

use super::state::DeviceState;
use super::MigrationError;

/// The first eight bytes of every saved state.
pub const MAGIC: [u8; 8] = *b"VRDMAST\0";
/// The newest format version, which this daemon reads with every older
/// one.
pub const FORMAT_VERSION: u32 = 2;
/// The version of a state without doorbell pages.
pub const FORMAT_VERSION_PLAIN: u32 = 1;
/// Size of the frame header.
pub const HEADER_LEN: usize = 32;

/// Encodes a state with its frame: version 2 if it has doorbell pages,
/// else version 1.
pub fn encode(state: &DeviceState) -> Result<Vec<u8>, MigrationError> {
    let malformed = |e: postcard::Error| MigrationError::Malformed(e.to_string());
    let mut body = postcard::to_allocvec(state).map_err(malformed)?;
    let version = match &state.doorbells {
        None => FORMAT_VERSION_PLAIN,
        Some(d) => {
            body.extend(postcard::to_allocvec(d).map_err(malformed)?);
            FORMAT_VERSION
        }
    };
    Ok(frame_version(version, &body))
}

/// `body` with the frame of version 1 around it (its length and checksum).
pub fn frame(body: &[u8]) -> Vec<u8> {
    frame_version(FORMAT_VERSION_PLAIN, body)
}

/// `body` with the frame of `version` around it.
pub fn frame_version(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN.saturating_add(body.len()));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Checks a frame header alone: magic, version, flags and the declared
/// length against `bound`. Returns the body length it declares, so that a
/// reader knows how much more to read before it reads it.
pub fn check_header(header: &[u8], bound: u64) -> Result<u64, MigrationError> {
    let field = |range: std::ops::Range<usize>| {
        header.get(range).ok_or(MigrationError::Length {
            found: header.len() as u64,
            declared: HEADER_LEN as u64,
        })
    };
    if field(0..8)? != MAGIC {
        return Err(MigrationError::BadMagic);
    }
    let le32 = |range| -> Result<u32, MigrationError> {
        let mut word = [0u8; 4];
        word.copy_from_slice(field(range)?);
        Ok(u32::from_le_bytes(word))
    };
    let version = le32(8..12)?;
    if !(FORMAT_VERSION_PLAIN..=FORMAT_VERSION).contains(&version) {
        return Err(MigrationError::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if le32(12..16)? != 0 || le32(28..32)? != 0 {
        return Err(MigrationError::Invalid("reserved header bits set".into()));
    }
    let len_bytes = field(16..24)?;
    let mut len = [0u8; 8];
    len.copy_from_slice(len_bytes);
    let len = u64::from_le_bytes(len);
    let total = len.saturating_add(HEADER_LEN as u64);
    if total > bound {
        return Err(MigrationError::TooLarge { len: total, bound });
    }
    Ok(len)
}

/// Decodes a whole framed state, refusing anything larger than `bound`.
pub fn decode(bytes: &[u8], bound: u64) -> Result<DeviceState, MigrationError> {
    if bytes.len() as u64 > bound {
        return Err(MigrationError::TooLarge {
            len: bytes.len() as u64,
            bound,
        });
    }
    let declared = check_header(bytes, bound)?;
    let (header, body) = bytes.split_at(HEADER_LEN);
    if body.len() as u64 != declared {
        return Err(MigrationError::Length {
            found: body.len() as u64,
            declared,
        });
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(header.get(24..28).unwrap_or(&[0; 4]));
    let crc = u32::from_le_bytes(crc);
    if crc32fast::hash(body) != crc {
        return Err(MigrationError::Checksum);
    }
    let malformed = |e: postcard::Error| MigrationError::Malformed(e.to_string());
    let (mut state, mut rest): (DeviceState, &[u8]) =
        postcard::take_from_bytes(body).map_err(malformed)?;
    // Checked by `check_header`: 1 or 2.
    if header.get(8..12) == Some(&FORMAT_VERSION.to_le_bytes()[..]) {
        let (doorbells, after) = postcard::take_from_bytes(rest).map_err(malformed)?;
        state.doorbells = Some(doorbells);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(MigrationError::Malformed(format!(
            "{} bytes after the state",
            rest.len()
        )));
    }
    Ok(state)
}

/// The largest state an instance with these limits can save, frame
/// included: what a reader accepts from a front-end at most.
///
/// Per object a generous fixed size, plus eight bytes per page of every
/// memory region the limits allow (`max_mr_bytes` in pages of the smallest
/// size a guest may use).
pub fn state_bound(limits: &Limits) -> u64 {
    const PER_OBJECT: u64 = 512;
    const MIN_PAGE: u64 = 4096;
    let objects = [
        limits.max_ctx,
        limits.max_pd,
        limits.max_cq,
        limits.max_qp,
        limits.max_srq,
        limits.max_mr,
        limits.max_ah,
    ]
    .iter()
    .map(|&n| u64::from(n))
    .sum::<u64>();
    let pages = limits.max_mr_bytes / MIN_PAGE;
    (HEADER_LEN as u64)
        .saturating_add(64 * 1024)
        .saturating_add(objects.saturating_mul(PER_OBJECT))
        .saturating_add(pages.saturating_mul(8))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::state::EventsState;

    fn sample() -> DeviceState {
        DeviceState {
            vm: "vm0".into(),
            migration_id: 0x5eed,
            features: 0x1234,
            guid: 0x0200_0000_dead_beef,
            events: EventsState {
                last_seq: 7,
                lost: 0,
                first_lost_seq: 0,
                pending: vec![[1, 2, 3, 7]],
            },
            objects: Default::default(),
            doorbells: None,
        }
    }

    #[test]
    fn a_state_survives_its_encoding() {
        let bytes = encode(&sample()).unwrap();
        assert_eq!(&bytes[..8], &MAGIC);
        assert_eq!(bytes[8..12], FORMAT_VERSION_PLAIN.to_le_bytes());
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), sample());
    }

    #[test]
    fn doorbell_pages_make_a_version_2_state_and_come_back() {
        let mut state = sample();
        state.doorbells = Some(crate::migration::state::DoorbellsState {
            pages: vec![(0x0001_0002, 3)],
            qp_slots: vec![(0x0001_0005, 0), (0x0002_0005, 503)],
            srq_slots: vec![(0x0001_0001, 7)],
            quarantined: vec![1, 2],
        });
        let bytes = encode(&state).unwrap();
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), state);
        // The same body under version 1: bytes after the state.
        let body = &bytes[HEADER_LEN..];
        assert!(matches!(
            decode(&frame_version(1, body), 1 << 20),
            Err(MigrationError::Malformed(_))
        ));
        // A version 2 frame without the doorbell part.
        let plain = encode(&sample()).unwrap();
        assert!(matches!(
            decode(&frame_version(2, &plain[HEADER_LEN..]), 1 << 20),
            Err(MigrationError::Malformed(_))
        ));
    }

    #[test]
    fn every_damage_to_the_frame_is_refused() {
        let good = encode(&sample()).unwrap();
        let mut b = good.clone();
        b[0] ^= 1;
        assert_eq!(decode(&b, 1 << 20), Err(MigrationError::BadMagic));
        let mut b = good.clone();
        b[8] = 9;
        assert!(matches!(
            decode(&b, 1 << 20),
            Err(MigrationError::Version { found: 9, .. })
        ));
        let mut b = good.clone();
        b[12] = 1;
        assert!(matches!(
            decode(&b, 1 << 20),
            Err(MigrationError::Invalid(_))
        ));
        let mut b = good.clone();
        let last = b.len() - 1;
        b[last] ^= 0x40;
        assert_eq!(decode(&b, 1 << 20), Err(MigrationError::Checksum));
        let b = &good[..good.len() - 1];
        assert!(matches!(
            decode(b, 1 << 20),
            Err(MigrationError::Length { .. })
        ));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(
            decode(&b, 1 << 20),
            Err(MigrationError::Length { .. })
        ));
        assert!(matches!(
            decode(&good[..10], 1 << 20),
            Err(MigrationError::Length { .. })
        ));
        assert!(matches!(
            decode(&good, good.len() as u64 - 1),
            Err(MigrationError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_declared_length_beyond_the_bound_is_refused_from_the_header_alone() {
        let mut b = encode(&sample()).unwrap();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            check_header(&b[..HEADER_LEN], 1 << 20),
            Err(MigrationError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_body_that_checks_but_does_not_decode_is_malformed() {
        let body = [0xffu8; 3];
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&FORMAT_VERSION_PLAIN.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&body);
        assert!(matches!(
            decode(&b, 1 << 20),
            Err(MigrationError::Malformed(_))
        ));
    }

    #[test]
    fn the_bound_of_the_default_limits_is_finite_and_holds_their_objects() {
        let bound = state_bound(&Limits::default());
        assert!(bound > 1 << 20 && bound < 1 << 30, "{bound}");
    }
}
