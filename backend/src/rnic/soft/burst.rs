//! What the software RNIC keeps for one burst of a QP's send work
//! (`RnicPath::Burst`): the VM an RC QP talks to, locked once for the
//! whole burst, and the route its messages were last checked on.

use crate::memory::HostMem;
use crate::vm::cell::VmCell;
use crate::vm::VmState;

/// The other VM of an RC QP's burst, locked once for the whole burst.
pub(super) struct Held<'p> {
    pub(super) vm: usize,
    pub(super) dev: &'p VmCell,
    pub(super) state: &'p mut VmState,
    pub(super) mem: &'p HostMem,
}

/// What the software RNIC keeps for one burst of a QP's send work.
#[derive(Default)]
pub struct Burst<'p> {
    /// The VM an RC QP talks to, locked for the burst
    /// (`SoftPath::with_burst`); `None` for the same VM, one out of
    /// reach, one gone, or a UD QP.
    pub(super) held: Option<Held<'p>>,
    /// An RC QP of the burst whose route (VM, QP handle) was checked and
    /// took its last message: its next messages in the burst skip the
    /// check (the locks held for the burst keep it valid). Any other
    /// outcome, and the end of the burst, forget it.
    pub(super) reached: Option<(u32, (usize, u32))>,
}
