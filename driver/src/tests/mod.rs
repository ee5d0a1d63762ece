//! Unit tests of the driver's encoding and ring logic against a mock
//! transport (no device: the end-to-end tests through the daemon live in the
//! tests crate).

mod control;
mod datapath;
mod mock;

use std::sync::Arc;

use crate::device::Device;
use mock::Mock;

/// A mock and a device opened on it.
fn setup() -> (Arc<Mock>, Device) {
    let mock = Arc::new(Mock::new());
    let dev = Device::open(mock.clone()).unwrap();
    (mock, dev)
}

/// `DmaBuf::fill` sets exactly the bytes of its range, whatever their
/// alignment (it writes words where it can).
#[test]
fn dma_fill_sets_exactly_its_range() {
    let (_mock, dev) = setup();
    let buf = dev.alloc_dma(64, 8).unwrap();
    for (offset, len) in [(0, 64), (3, 0), (1, 7), (5, 20), (8, 16), (9, 55), (63, 1)] {
        buf.write(0, &[0xaa; 64]).unwrap();
        buf.fill(offset, len, 0x5c).unwrap();
        let got = buf.to_vec(0, 64).unwrap();
        for (i, b) in got.iter().enumerate() {
            let want = if (offset..offset + len).contains(&i) {
                0x5c
            } else {
                0xaa
            };
            assert_eq!(*b, want, "fill({offset}, {len}): byte {i}");
        }
    }
    assert!(
        buf.fill(60, 5, 0).is_err(),
        "a range past the end is refused"
    );
}
