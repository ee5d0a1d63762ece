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
