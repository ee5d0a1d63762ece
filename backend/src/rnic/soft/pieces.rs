//! Large messages in pieces: an RC message from or into memory regions
//! (WRITE, SEND, READ) is executed in pieces — of what is left of the
//! burst (at least [`PIECE`]) while another VM had work in a recent sweep,
//! of [`ALONE_PIECE`] otherwise — so that other VMs' work runs between
//! them. The requester QP keeps the partly executed head WQE in
//! `rt.partial`, a receiving QP the receive WQE it took in `rt.inbound`,
//! and both complete after the last piece (docs/isolation.md, "Large
//! messages in pieces").

use virtio_rdma_abi::datapath::WrOpcode;
use virtio_rdma_abi::qp::QpType;

use crate::resources::SendPartial;
use crate::rnic_path::SendWr;

/// The smallest piece of a message executed in pieces while other VMs
/// have work: another VM's work waits at most about one piece. Chosen by
/// measurement (`qos_bench lat`, see docs/isolation.md).
pub const PIECE: u64 = 8 << 10;
/// A VM's large messages are executed in pieces of its burst while another
/// VM had work in one of the last this many sweeps. While pieces run, a
/// sweep takes about a piece; an engine left with one VM returns to pieces
/// of [`ALONE_PIECE`] after this many sweeps.
pub(in crate::rnic) const RECENT_SWEEPS: u64 = 256;
/// The piece of a VM that had the engine to itself lately: large, so that
/// the per-piece checks cost nothing measurable, yet bounded — a guest
/// must not be able to wait until the others pause for a moment and then
/// occupy the engine with a whole 2 GiB message.
pub const ALONE_PIECE: u64 = 256 << 10;

/// How large the pieces of the VM an engine thread serves are: which VMs
/// had work lately, and the piece of the next execution.
#[derive(Debug, Clone)]
pub(in crate::rnic) struct Pieces {
    /// Another VM than the one being served had work in a recent sweep:
    /// its large messages run in pieces of what is left of its burst.
    split: bool,
    /// The most bytes the next execution of a message may move, set by
    /// the burst ([`Pieces::size_next`]).
    piece: u64,
    /// Sweeps so far.
    sweeps: u64,
    /// The last two VMs (list positions) that had work, with the sweep
    /// they last had it in, most recent first.
    recent: [(usize, u64); 2],
}

impl Pieces {
    /// No VM has had work yet.
    pub(in crate::rnic) fn new() -> Self {
        Pieces {
            split: false,
            piece: u64::MAX,
            sweeps: 0,
            recent: [(usize::MAX, 0); 2],
        }
    }

    /// A sweep starts.
    pub(in crate::rnic) fn next_sweep(&mut self) {
        self.sweeps = self.sweeps.wrapping_add(1);
    }

    /// VM `vm` (a list position) has work in the current sweep.
    pub(in crate::rnic) fn note_active(&mut self, vm: usize) {
        let now = (vm, self.sweeps);
        match self.recent {
            [(v, _), _] if v == vm => self.recent[0] = now,
            [first, _] => self.recent = [now, first],
        }
    }

    /// Whether a VM other than `vm` had work in one of the last
    /// [`RECENT_SWEEPS`] sweeps.
    fn others_active(&self, vm: usize) -> bool {
        let [a, b] = self.recent;
        let (v, at) = if a.0 != vm { a } else { b };
        v != usize::MAX && self.sweeps.wrapping_sub(at) <= RECENT_SWEEPS
    }

    /// The engine starts serving VM `vm` (a list position).
    pub(in crate::rnic) fn serve(&mut self, vm: usize) {
        self.split = self.others_active(vm);
    }

    /// Sizes the piece of the next execution in a burst that may move
    /// `max_bytes` and has moved `bytes`. Split, the piece takes what is
    /// left of the burst's bytes, and at least [`PIECE`] (a message that
    /// fits runs whole). Alone, a message still runs in pieces of
    /// [`ALONE_PIECE`]: whoever starts work next waits for one piece, not
    /// for up to 2 GiB.
    pub(in crate::rnic) fn size_next(&mut self, max_bytes: u64, bytes: u64) {
        self.piece = if self.split {
            max_bytes.saturating_sub(bytes).max(PIECE)
        } else {
            ALONE_PIECE.max(max_bytes)
        };
    }

    /// The most bytes one execution of a message may move: of a message
    /// executed in pieces (`piecewise`), the piece; else all of it.
    pub(in crate::rnic) fn limit(&self, piecewise: bool) -> u64 {
        if piecewise {
            self.piece
        } else {
            u64::MAX
        }
    }
}

/// The part of a message one execution moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::rnic) struct Span {
    /// The bytes of the message moved before this execution.
    pub(in crate::rnic) start: u64,
    /// The most bytes this execution may move (`u64::MAX`: all).
    pub(in crate::rnic) limit: u64,
    /// The part it moves: offset and length.
    pub(in crate::rnic) part: (u64, u64),
}

/// Whether send WQE `wr` of a QP of type `qp_type` is executed in pieces:
/// every RC or UC message from or into local buffers (SEND, WRITE, READ;
/// not inline data, atomics or UD, which are small). XRC messages go
/// whole: an XRC_TGT QP has no rings for the engine to flush a message
/// half received from.
pub(in crate::rnic) fn piecewise(qp_type: QpType, wr: &SendWr<'_>) -> bool {
    matches!(qp_type, QpType::RC | QpType::UC)
        && wr.inline.is_none()
        && !matches!(
            wr.opcode,
            WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
        )
}

/// Whether send WQE `wr` (`total` bytes in its SGEs) is still the message
/// whose first pieces `p` describes. The guest may have rewritten a WQE the
/// device had started: it then fails rather than resume with other checks
/// than its first piece had.
pub(in crate::rnic) fn resumes(
    p: &SendPartial,
    wr: &SendWr<'_>,
    piecewise: bool,
    total: u64,
) -> bool {
    let hdr = &wr.hdr;
    piecewise
        && wr.opcode == p.opcode
        && hdr.rkey == p.rkey
        && hdr.remote_addr == p.remote_addr
        && p.len == total
        && p.wr_id == hdr.wr_id
        && p.done < total
}

/// The part of a message of `len` bytes one execution moves, as (offset,
/// length): all of it, or for a message in pieces (`piecewise`) at most
/// `limit` bytes from `start`; `None` if `start` is past the end (a
/// rewritten WQE).
pub(in crate::rnic) fn part(
    piecewise: bool,
    len: u64,
    start: u64,
    limit: u64,
) -> Option<(u64, u64)> {
    if !piecewise {
        return Some((0, len));
    }
    let left = len.checked_sub(start)?;
    Some((start, limit.min(left)))
}

/// What QP keeps of send WQE `index` (`wr`, `len` bytes) once its first
/// `done` bytes have moved.
pub(in crate::rnic) fn started(index: u32, wr: &SendWr<'_>, len: u64, done: u64) -> SendPartial {
    SendPartial {
        index,
        done,
        wr_id: wr.hdr.wr_id,
        len,
        opcode: wr.opcode,
        rkey: wr.hdr.rkey,
        remote_addr: wr.hdr.remote_addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::send_wr as wr;
    use virtio_rdma_abi::datapath::SendWqe;

    /// RC messages from or into memory regions run in pieces; atomics,
    /// inline data and UD messages run whole.
    #[test]
    fn which_messages_run_in_pieces() {
        use WrOpcode::*;
        for op in [
            RDMA_WRITE,
            RDMA_WRITE_WITH_IMM,
            SEND,
            SEND_WITH_IMM,
            RDMA_READ,
        ] {
            assert!(piecewise(QpType::RC, &wr(op, None)), "{op:?}");
            assert!(!piecewise(QpType::RC, &wr(op, Some(&[1]))), "inline {op:?}");
            assert!(!piecewise(QpType::UD, &wr(op, None)), "UD {op:?}");
        }
        for op in [ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD] {
            assert!(!piecewise(QpType::RC, &wr(op, None)), "{op:?}");
        }
    }

    /// Each execution moves at most its limit from where the last ended;
    /// a start past the end is a rewritten WQE.
    #[test]
    fn parts_of_a_message() {
        assert_eq!(part(true, 100, 0, 40), Some((0, 40)));
        assert_eq!(part(true, 100, 80, 40), Some((80, 20)));
        assert_eq!(part(true, 100, 100, 40), Some((100, 0)));
        assert_eq!(part(true, 100, 101, 40), None);
        assert_eq!(part(true, 100, 0, u64::MAX), Some((0, 100)));
        assert_eq!(part(false, 100, 60, 40), Some((0, 100)), "whole");
    }

    /// A started WQE resumes only while it is the message its first piece
    /// checked.
    #[test]
    fn a_rewritten_wqe_does_not_resume() {
        let w = wr(WrOpcode::RDMA_WRITE, None);
        let p = started(3, &w, 1 << 20, 8 << 10);
        assert_eq!((p.index, p.done, p.wr_id, p.len), (3, 8 << 10, 9, 1 << 20));
        assert!(resumes(&p, &w, true, 1 << 20));
        assert!(!resumes(&p, &w, false, 1 << 20), "no longer piecewise");
        assert!(!resumes(&p, &w, true, 1 << 19), "other length");
        let mut other = w;
        other.opcode = WrOpcode::SEND;
        assert!(!resumes(&p, &other, true, 1 << 20), "other opcode");
        for change in [
            |h: &mut SendWqe| h.rkey = 0x56,
            |h: &mut SendWqe| h.remote_addr = 0x2000,
            |h: &mut SendWqe| h.wr_id = 10,
        ] {
            let mut other = w;
            change(&mut other.hdr);
            assert!(!resumes(&p, &other, true, 1 << 20), "{:?}", other.hdr);
        }
        let done = SendPartial { done: 1 << 20, ..p };
        assert!(!resumes(&done, &w, true, 1 << 20), "nothing left to move");
    }

    /// Split, a piece is what is left of the burst but at least `PIECE`;
    /// alone, `ALONE_PIECE` or the burst, whichever is larger.
    #[test]
    fn piece_sizes() {
        let mut s = Pieces::new();
        assert_eq!(s.limit(false), u64::MAX);
        s.size_next(256 << 10, 0);
        assert_eq!(s.limit(true), ALONE_PIECE, "alone");
        s.size_next(1 << 20, 0);
        assert_eq!(s.limit(true), 1 << 20, "alone, a larger burst");
        s.next_sweep();
        s.note_active(1);
        s.serve(0);
        s.size_next(256 << 10, 100 << 10);
        assert_eq!(s.limit(true), 156 << 10, "what is left of the burst");
        s.size_next(256 << 10, 252 << 10);
        assert_eq!(s.limit(true), PIECE, "at least a piece");
        assert_eq!(s.limit(false), u64::MAX, "a message that is not piecewise");
    }

    /// Messages are split while another VM had work in one of the last
    /// `RECENT_SWEEPS` sweeps, never for a VM alone.
    #[test]
    fn split_only_while_another_vm_was_recently_active() {
        let mut s = Pieces::new();
        let sweep = |s: &mut Pieces, active: &[usize]| {
            s.next_sweep();
            for &k in active {
                s.note_active(k);
            }
        };
        sweep(&mut s, &[0]);
        assert!(!s.others_active(0), "alone");
        sweep(&mut s, &[0, 1]);
        assert!(s.others_active(0) && s.others_active(1));
        assert!(s.others_active(2), "two others");
        for _ in 0..=RECENT_SWEEPS {
            sweep(&mut s, &[0]);
        }
        assert!(!s.others_active(0), "VM 1 idle for RECENT_SWEEPS sweeps");
        assert!(s.others_active(1), "VM 0 is active");
        // Alternating VMs that never share a sweep still see each other.
        sweep(&mut s, &[2]);
        sweep(&mut s, &[0]);
        assert!(s.others_active(0) && s.others_active(2));
    }
}
