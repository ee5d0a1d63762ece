//! The common MAD header (IBTA 13.4.2) and the constants of the CM class.

use crate::bits::{put, u16_at, u32_at, u64_at, u8_at};
use crate::Error;

/// Bytes of every MAD.
pub const MAD_SIZE: usize = 256;
/// Bytes of the common MAD header.
pub const MAD_HEADER_SIZE: usize = 24;

/// `base_version` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of communication management.
pub const CLASS_CM: u8 = 0x07;
/// The CM class version of IBTA 1.2 and later, which Linux's `ib_cm` speaks.
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD methods the CM class uses.
pub mod method {
    /// Every CM message is a `Send`.
    pub const SEND: u8 = 0x03;
}

/// Attribute IDs of the CM messages (IBTA table 104).
pub mod attr {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
}

/// The common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeader {
    /// Always [`BASE_VERSION`].
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Version of the class.
    pub class_version: u8,
    /// Method (bit 7: a response).
    pub method: u8,
    /// Status (responses).
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID, chosen by the sender of a request.
    pub tid: u64,
    /// Attribute: which message.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// The header of a CM message `attr_id` of transaction `tid`.
    pub fn cm(attr_id: u16, tid: u64) -> Self {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            tid,
            attr_id,
            ..MadHeader::default()
        }
    }

    /// Reads the header at the start of `mad`.
    pub fn parse(mad: &[u8]) -> Result<Self, Error> {
        if mad.len() < MAD_HEADER_SIZE {
            return Err(Error::Truncated {
                need: MAD_HEADER_SIZE,
                got: mad.len(),
            });
        }
        Ok(MadHeader {
            base_version: u8_at(mad, 0),
            mgmt_class: u8_at(mad, 1),
            class_version: u8_at(mad, 2),
            method: u8_at(mad, 3),
            status: u16_at(mad, 4),
            class_specific: u16_at(mad, 6),
            tid: u64_at(mad, 8),
            attr_id: u16_at(mad, 16),
            attr_mod: u32_at(mad, 20),
        })
    }

    /// Writes the header at the start of `mad` (the reserved word zero).
    pub fn emit(&self, mad: &mut [u8]) {
        put(
            mad,
            0,
            &[
                self.base_version,
                self.mgmt_class,
                self.class_version,
                self.method,
            ],
        );
        put(mad, 4, &self.status.to_be_bytes());
        put(mad, 6, &self.class_specific.to_be_bytes());
        put(mad, 8, &self.tid.to_be_bytes());
        put(mad, 16, &self.attr_id.to_be_bytes());
        put(mad, 18, &[0, 0]);
        put(mad, 20, &self.attr_mod.to_be_bytes());
    }

    /// Whether this is a CM MAD of the class version this crate parses.
    pub fn is_cm(&self) -> bool {
        self.base_version == BASE_VERSION
            && self.mgmt_class == CLASS_CM
            && self.class_version == CM_CLASS_VERSION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_layout() {
        let h = MadHeader {
            status: 0x1234,
            class_specific: 0x5678,
            attr_mod: 0x9abc_def0,
            ..MadHeader::cm(attr::REP, 0x0102_0304_0506_0708)
        };
        let mut b = [0xffu8; MAD_HEADER_SIZE];
        h.emit(&mut b);
        assert_eq!(
            b,
            [
                1, 7, 2, 3, 0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0x13, 0, 0, 0x9a,
                0xbc, 0xde, 0xf0
            ]
        );
        assert_eq!(MadHeader::parse(&b), Ok(h));
        assert!(h.is_cm());
        assert_eq!(
            MadHeader::parse(&b[..23]),
            Err(Error::Truncated { need: 24, got: 23 })
        );
    }
}
