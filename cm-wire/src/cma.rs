//! What `rdma_cm` adds to IB CM on an IP-addressed port: the service ID
//! that names a port space and port, and the header at the start of a
//! REQ's private data that carries the IP addresses and port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bits::{bytes, put, u16_at, u8_at};
use crate::Error;

/// Port spaces (`enum rdma_ucm_port_space`).
pub mod ps {
    /// IPoIB-style.
    pub const IPOIB: u16 = 0x0002;
    /// Connected, reliable (what `rping` and most applications use).
    pub const TCP: u16 = 0x0106;
    /// Datagram.
    pub const UDP: u16 = 0x0111;
    /// Native IB service IDs.
    pub const IB: u16 = 0x013f;
}

/// Bytes of the header.
pub const CMA_HEADER_SIZE: usize = 36;
/// Its `cma_version`.
pub const CMA_VERSION: u8 = 0x00;

/// The service ID of `port` in port space `ps` (`RDMA_PS_TCP` port 7174
/// is 0x0000_0000_0106_1c06).
pub fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The port space and port of an `rdma_cm` service ID, or `None` for one
/// outside the IP port spaces' range (its upper 32 bits set).
pub fn split_service_id(id: u64) -> Option<(u16, u16)> {
    if id >> 32 != 0 {
        return None;
    }
    let ps = u16::try_from((id >> 16) & 0xffff).ok()?;
    let port = u16::try_from(id & 0xffff).ok()?;
    Some((ps, port))
}

/// The `rdma_cm` header of a REQ's private data: where the connection
/// comes from and goes to, in IP terms. The consumer's private data
/// follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The requester's source port.
    pub src_port: u16,
    /// The requester's address.
    pub src: IpAddr,
    /// The address the request is for.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Parses the header at the start of `private_data`.
    pub fn parse(private_data: &[u8]) -> Result<Self, Error> {
        if private_data.len() < CMA_HEADER_SIZE {
            return Err(Error::Truncated {
                need: CMA_HEADER_SIZE,
                got: private_data.len(),
            });
        }
        if u8_at(private_data, 0) != CMA_VERSION {
            return Err(Error::BadField("cma_version"));
        }
        let addr = |off: usize, v4: bool| -> IpAddr {
            let raw: [u8; 16] = bytes(private_data, off);
            if v4 {
                IpAddr::V4(Ipv4Addr::from(bytes::<4>(&raw, 12)))
            } else {
                IpAddr::V6(Ipv6Addr::from(raw))
            }
        };
        let v4 = match u8_at(private_data, 1) >> 4 {
            4 => true,
            6 => false,
            _ => return Err(Error::BadField("ip_version")),
        };
        Ok(CmaHeader {
            src_port: u16_at(private_data, 2),
            src: addr(4, v4),
            dst: addr(20, v4),
        })
    }

    /// The header followed by `user` (the consumer's private data), as a
    /// REQ's private data; fails when the two addresses differ in family
    /// or `user` does not fit the REQ.
    pub fn with_user_data(&self, user: &[u8]) -> Result<Vec<u8>, Error> {
        let max = crate::cm::private_len::REQ.saturating_sub(CMA_HEADER_SIZE);
        if user.len() > max {
            return Err(Error::BadField("private_data"));
        }
        let mut out = vec![0u8; CMA_HEADER_SIZE];
        let (version, src, dst) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut a = [0u8; 16];
                let mut b = [0u8; 16];
                put(&mut a, 12, &s.octets());
                put(&mut b, 12, &d.octets());
                (4u8, a, b)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => (6u8, s.octets(), d.octets()),
            _ => return Err(Error::BadField("ip_version")),
        };
        put(&mut out, 0, &[CMA_VERSION, version << 4]);
        put(&mut out, 2, &self.src_port.to_be_bytes());
        put(&mut out, 4, &src);
        put(&mut out, 20, &dst);
        out.extend_from_slice(user);
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn service_ids() {
        assert_eq!(service_id(ps::TCP, 7174), 0x0106_1c06);
        assert_eq!(split_service_id(0x0106_1c06), Some((ps::TCP, 7174)));
        assert_eq!(split_service_id(1 << 32), None);
    }

    #[test]
    fn header_round_trip_v4_and_v6() {
        let h = CmaHeader {
            src_port: 0xbeef,
            src: IpAddr::V4(Ipv4Addr::new(10, 42, 0, 1)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 42, 0, 2)),
        };
        let pd = h.with_user_data(b"hello").unwrap_or_default();
        assert_eq!(pd.len(), 41);
        assert_eq!(&pd[..4], &[0, 0x40, 0xbe, 0xef]);
        assert_eq!(&pd[16..20], &[10, 42, 0, 1]);
        assert_eq!(&pd[32..36], &[10, 42, 0, 2]);
        assert_eq!(&pd[36..], b"hello");
        assert_eq!(CmaHeader::parse(&pd), Ok(h));
        let h6 = CmaHeader {
            src_port: 1,
            src: IpAddr::V6(Ipv6Addr::LOCALHOST),
            dst: IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2)),
        };
        let pd6 = h6.with_user_data(&[]).unwrap_or_default();
        assert_eq!(CmaHeader::parse(&pd6), Ok(h6));
        let mixed = CmaHeader { dst: h.dst, ..h6 };
        assert_eq!(
            mixed.with_user_data(&[]),
            Err(Error::BadField("ip_version"))
        );
        assert_eq!(
            h.with_user_data(&[0; 57]),
            Err(Error::BadField("private_data"))
        );
        let mut bad = pd.clone();
        bad[1] = 0x50;
        assert_eq!(CmaHeader::parse(&bad), Err(Error::BadField("ip_version")));
        assert!(CmaHeader::parse(&pd[..35]).is_err());
    }
}
