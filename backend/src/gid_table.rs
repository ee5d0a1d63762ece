//! A port's GID table (spec appendix A): what `QUERY_GID` reads, what an
//! address vector's `sgid_index` names, and the GIDs a message may be
//! addressed to.
//!
//! ABI version 3 on the software RNIC: index 0 is the default GID, the
//! link-local address derived from the VM's MAC as on every RoCE port
//! (unassigned without a MAC); then the operator's GIDs, IPv4-mapped ones
//! first. ABI version 2, and a host RNIC: one entry, index 0.

/// Entries of a version-3 table (`gid_tbl_len`): the default GID and up
/// to 15 of the operator's.
pub const GID_TABLE_LEN: u32 = 16;

/// The GIDs of one port. Fixed for the life of the device instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidTable {
    entries: [[u8; 16]; GID_TABLE_LEN as usize],
    /// `gid_tbl_len`: 1 or [`GID_TABLE_LEN`].
    len: u32,
    /// One past the last assigned entry: lookups stop there.
    used: usize,
}

impl GidTable {
    /// A table of one entry, `gid` at index 0 (ABI version 2, or the GID
    /// a host RNIC sends from).
    pub fn single(gid: [u8; 16]) -> Self {
        let mut entries = [[0; 16]; GID_TABLE_LEN as usize];
        entries[0] = gid;
        GidTable {
            entries,
            len: 1,
            used: 1,
        }
    }

    /// The version-3 table: the default GID of `mac` at index 0 (none:
    /// unassigned), then `operator`'s GIDs in [`operator_order`], at most
    /// [`GID_TABLE_LEN`] − 1 of them (the rest are left out; the
    /// configuration refuses more).
    pub fn v3(mac: Option<[u8; 6]>, operator: &[[u8; 16]]) -> Self {
        let mut entries = [[0; 16]; GID_TABLE_LEN as usize];
        entries[0] = mac.map_or([0; 16], default_gid_of_mac);
        for (slot, gid) in entries[1..].iter_mut().zip(operator_order(operator)) {
            *slot = gid;
        }
        let used = entries
            .iter()
            .rposition(|g| *g != [0; 16])
            .map_or(0, |i| i + 1);
        GidTable {
            entries,
            len: GID_TABLE_LEN,
            used,
        }
    }

    /// `gid_tbl_len`: how many indices the table has.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the table has no index at all (never: at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry `index` as `QUERY_GID` reads it: `None` past the table, all
    /// zero for an unassigned index.
    pub fn get(&self, index: u32) -> Option<[u8; 16]> {
        if index >= self.len {
            return None;
        }
        self.entries.get(usize::try_from(index).ok()?).copied()
    }

    /// Entry `index` if it is assigned (what a message may be sent from).
    pub fn assigned(&self, index: u32) -> Option<[u8; 16]> {
        self.get(index).filter(|g| *g != [0; 16])
    }

    /// Whether `gid` is an assigned entry (a message to it is this port's).
    #[inline]
    pub fn contains(&self, gid: &[u8; 16]) -> bool {
        *gid != [0; 16] && self.entries.iter().take(self.used).any(|g| g == gid)
    }

    /// The assigned entries with their indices, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, [u8; 16])> + '_ {
        (0..self.len).filter_map(|i| self.assigned(i).map(|g| (i, g)))
    }

    /// The port's first operator-assigned GID, the one the operator knows
    /// the VM by (logs, the management API): index 1 of a version-3
    /// table, else index 0; all zero if there is none.
    pub fn primary(&self) -> [u8; 16] {
        let first = u32::from(self.len > 1);
        self.assigned(first).unwrap_or([0; 16])
    }
}

/// Whether `gid` is an IPv4-mapped address (`::ffff:a.b.c.d`).
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff]
}

/// The operator's GIDs in table order: IPv4-mapped ones first, then the
/// others, each group in the order given.
pub fn operator_order(gids: &[[u8; 16]]) -> impl Iterator<Item = [u8; 16]> + '_ {
    let v4 = gids.iter().filter(|g| is_ipv4_mapped(g));
    let v6 = gids.iter().filter(|g| !is_ipv4_mapped(g));
    v4.chain(v6).copied()
}

/// The default GID of a RoCE port whose interface has `mac`: `fe80::`
/// followed by the modified EUI-64 of the address (the universal/local bit
/// inverted, `ff:fe` in the middle), the IPv6 link-local address of the
/// interface.
pub fn default_gid_of_mac(mac: [u8; 6]) -> [u8; 16] {
    let [a, b, c, d, e, f] = mac;
    [
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        a ^ 0x02,
        b,
        c,
        0xff,
        0xfe,
        d,
        e,
        f,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        std::net::Ipv4Addr::new(a, b, c, d)
            .to_ipv6_mapped()
            .octets()
    }

    fn v6(text: &str) -> [u8; 16] {
        text.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    /// The link-local address Linux gives an interface with this MAC
    /// (`ip -6 addr` on a QEMU NIC of 52:54:00:12:34:56).
    #[test]
    fn default_gid_is_the_modified_eui64_link_local_address() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(default_gid_of_mac(mac), v6("fe80::5054:ff:fe12:3456"));
        // The universal/local bit is inverted, not set.
        let mac = [0x02, 0, 0, 0, 0, 1];
        assert_eq!(default_gid_of_mac(mac), v6("fe80::ff:fe00:1"));
    }

    #[test]
    fn v3_table_has_the_default_gid_then_ipv4_first() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let ops = [
            v6("2001:db8::7"),
            v4(10, 0, 0, 1),
            v6("fd00::1"),
            v4(10, 0, 0, 2),
        ];
        let t = GidTable::v3(Some(mac), &ops);
        assert_eq!(t.len(), GID_TABLE_LEN);
        assert_eq!(t.get(0), Some(default_gid_of_mac(mac)));
        assert_eq!(t.get(1), Some(v4(10, 0, 0, 1)));
        assert_eq!(t.get(2), Some(v4(10, 0, 0, 2)));
        assert_eq!(t.get(3), Some(v6("2001:db8::7")));
        assert_eq!(t.get(4), Some(v6("fd00::1")));
        assert_eq!(t.get(5), Some([0; 16]), "unassigned reads as zero");
        assert_eq!(t.assigned(5), None);
        assert_eq!(t.get(16), None);
        assert_eq!(t.primary(), v4(10, 0, 0, 1));
        assert!(t.contains(&v6("fd00::1")));
        assert!(t.contains(&default_gid_of_mac(mac)));
        assert!(!t.contains(&[0; 16]), "an unassigned entry is no address");
        assert!(!t.contains(&v6("fd00::2")));
        assert_eq!(
            t.iter().map(|(i, _)| i).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn without_a_mac_index_0_is_unassigned() {
        let t = GidTable::v3(None, &[v4(10, 42, 0, 1)]);
        assert_eq!(t.get(0), Some([0; 16]));
        assert_eq!(t.assigned(0), None);
        assert_eq!(t.assigned(1), Some(v4(10, 42, 0, 1)));
        assert!(!t.contains(&[0; 16]));
    }

    #[test]
    fn a_single_table_has_one_entry() {
        let t = GidTable::single(v4(10, 42, 0, 1));
        assert_eq!(
            (t.len(), t.get(0), t.get(1)),
            (1, Some(v4(10, 42, 0, 1)), None)
        );
        assert_eq!(t.primary(), v4(10, 42, 0, 1));
        // At most 15 of the operator's fit a version-3 table.
        let many: Vec<[u8; 16]> = (0..20).map(|i| v4(10, 0, 0, i)).collect();
        let t = GidTable::v3(None, &many);
        assert_eq!(t.assigned(15), Some(v4(10, 0, 0, 14)));
        assert!(!t.contains(&v4(10, 0, 0, 15)));
    }
}
