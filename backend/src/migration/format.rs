//! The framing of a saved device state (spec 20.3).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "VRDMAST\0"
//!      8     4  format version (le32)
//!     12     4  flags (le32): 0 in versions 1 and 2; in version 3, the
//!               sections after the state (`SECTION_*`)
//!     16     8  body length in bytes (le64)
//!     24     4  CRC-32 (IEEE) of the body (le32)
//!     28     4  reserved (0)
//!     32     …  body: the `DeviceState`, postcard-encoded; in version 2
//!               followed by its `DoorbellsState`, postcard-encoded; in
//!               version 3 followed by the sections its flags name, in
//!               the order of their bits, each postcard-encoded
//! ```
//!
//! A state without doorbell pages or host halves is written as version 1,
//! which older daemons read; a hand-over's state with doorbell pages alone
//! as version 2; one with host halves (the libibverbs transport, spec
//! 20.8) as version 3.
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
pub const FORMAT_VERSION: u32 = 3;
/// The version of a state without doorbell pages or host halves.
pub const FORMAT_VERSION_PLAIN: u32 = 1;
/// The version of a state with doorbell pages alone.
pub const FORMAT_VERSION_DOORBELLS: u32 = 2;
/// Version 3 flag: a `DoorbellsState` section follows the state.
pub const SECTION_DOORBELLS: u32 = 1 << 0;
/// Version 3 flag: a `HostState` section follows (after the doorbells').
pub const SECTION_HOST: u32 = 1 << 1;
/// Size of the frame header.
pub const HEADER_LEN: usize = 32;

/// Encodes a state with its frame: version 3 if it has host halves, else
/// version 2 if it has doorbell pages, else version 1.
pub fn encode(state: &DeviceState) -> Result<Vec<u8>, MigrationError> {
    let malformed = |e: postcard::Error| MigrationError::Malformed(e.to_string());
    let mut body = postcard::to_allocvec(state).map_err(malformed)?;
    if let Some(d) = &state.doorbells {
        body.extend(postcard::to_allocvec(d).map_err(malformed)?);
    }
    let Some(host) = &state.host else {
        let version = match state.doorbells {
            None => FORMAT_VERSION_PLAIN,
            Some(_) => FORMAT_VERSION_DOORBELLS,
        };
        return Ok(frame_version(version, &body));
    };
    body.extend(postcard::to_allocvec(host).map_err(malformed)?);
    let mut flags = SECTION_HOST;
    if state.doorbells.is_some() {
        flags |= SECTION_DOORBELLS;
    }
    Ok(frame_with(FORMAT_VERSION, flags, &body))
}

/// `body` with the frame of version 1 around it (its length and checksum).
pub fn frame(body: &[u8]) -> Vec<u8> {
    frame_version(FORMAT_VERSION_PLAIN, body)
}

/// `body` with the frame of `version` around it (no flags).
pub fn frame_version(version: u32, body: &[u8]) -> Vec<u8> {
    frame_with(version, 0, body)
}

/// `body` with the frame of `version` and `flags` around it.
pub fn frame_with(version: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN.saturating_add(body.len()));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
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
    let known = match version {
        FORMAT_VERSION => SECTION_DOORBELLS | SECTION_HOST,
        _ => 0,
    };
    if le32(12..16)? & !known != 0 || le32(28..32)? != 0 {
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
    // Checked by `check_header`: a version this daemon reads, and flags
    // only in version 3.
    let word = |range: std::ops::Range<usize>| {
        let mut w = [0u8; 4];
        w.copy_from_slice(header.get(range).unwrap_or(&[0; 4]));
        u32::from_le_bytes(w)
    };
    let sections = match word(8..12) {
        FORMAT_VERSION_DOORBELLS => SECTION_DOORBELLS,
        FORMAT_VERSION => word(12..16),
        _ => 0,
    };
    if sections & SECTION_DOORBELLS != 0 {
        let (doorbells, after) = postcard::take_from_bytes(rest).map_err(malformed)?;
        state.doorbells = Some(doorbells);
        rest = after;
    }
    if sections & SECTION_HOST != 0 {
        let (host, after) = postcard::take_from_bytes(rest).map_err(malformed)?;
        state.host = Some(host);
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
            host: None,
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
        assert_eq!(bytes[8..12], FORMAT_VERSION_DOORBELLS.to_le_bytes());
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

    /// Host halves make a version 3 state, with or without doorbell pages;
    /// a flag whose section is missing, or a section no flag names, is
    /// refused, and so are flags in versions 1 and 2 and unknown flags.
    #[test]
    fn host_halves_make_a_version_3_state_with_its_sections_flagged() {
        let host = crate::relocation::HostState {
            gid: [7; 16],
            qps: vec![crate::relocation::HostQpState {
                qpn: 0x11,
                host_qpn: 0x13,
                sq_psn: 0x123,
                rq_psn: 0x456,
                dest: Some(([9; 16], 0x22)),
                rkeys: vec![(0x100, 0x200)],
            }],
        };
        let mut state = sample();
        state.host = Some(host.clone());
        let bytes = encode(&state).unwrap();
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        assert_eq!(bytes[12..16], SECTION_HOST.to_le_bytes());
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), state);
        state.doorbells = Some(Default::default());
        let both = encode(&state).unwrap();
        assert_eq!(
            both[12..16],
            (SECTION_HOST | SECTION_DOORBELLS).to_le_bytes()
        );
        assert_eq!(decode(&both, 1 << 20).unwrap(), state);
        // The body of one under the flags of the other.
        let body = &bytes[HEADER_LEN..];
        for flags in [0, SECTION_DOORBELLS, SECTION_DOORBELLS | SECTION_HOST] {
            assert!(
                decode(&frame_with(3, flags, body), 1 << 20).is_err(),
                "{flags}"
            );
        }
        assert!(matches!(
            decode(&frame_with(3, 1 << 5, body), 1 << 20),
            Err(MigrationError::Invalid(_))
        ));
        assert!(matches!(
            decode(&frame_with(1, SECTION_HOST, body), 1 << 20),
            Err(MigrationError::Invalid(_))
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
