//! Target `engine`: several VMs of one tenant on one real daemon.
//!
//! The process runs one daemon (the real [`Daemon`], one engine thread,
//! three VMs in the default tenant) with a QP-number allocator that hands a
//! freed number out again at once ([`RecyclingQpns`]: QP numbers come back,
//! which a random 24-bit allocator almost never does); each VM is a test
//! VMM (the in-process vhost-user frontend of the `tests` crate) with the
//! reference driver opened on it. An input uses two or all three VMs. The
//! fuzzer picks a sequence of
//! QP creations and destructions, connections (to live QPs, to destroyed
//! QP numbers, to raw numbers), receives and sends (SEND, WRITE, READ,
//! atomics; good, stale and raw keys; lengths in and beyond the buffers),
//! polls, device resets and VMM disconnects, with traffic in flight;
//! fast registration (`F_MEM_MGT`): `REG_MR` work requests of each VM's
//! buffer into an `ALLOC_MR` region, well formed or not, `LOCAL_INV`,
//! `SEND_WITH_INV`, and work requests through those keys and the local DMA
//! key; memory windows (`F_MW`): `BIND_MW` work requests of a window of
//! each VM over its buffer, well formed or not, and work requests through
//! the window's key; and each VM's GSI QP (QP 1) sending MADs (to QP 1 of any VM of the
//! input or to other QP numbers, from any index of its GID table, up to and
//! beyond 256 bytes) and taking them. After
//! the input, a device reset of each of its VMs brings the daemon back to
//! the state every input starts from ([`run_input`]).
//!
//! Invariants:
//! - the daemon keeps answering: every operation is bounded by a watchdog
//!   ([`HANG`]); past it the harness prints what hung and aborts (a hang is
//!   a finding), and a control command that times out is a finding;
//! - objects are released: after each operation the daemon holds exactly
//!   the QPs the driver holds; after a device reset or a disconnect the VM
//!   holds nothing (within 5 s); at the end, after the device reset of
//!   every VM of the input, no object and no QP number remain, and the
//!   daemon and guest RAM are as after a fresh start (objects, keys, work
//!   and events waiting);
//! - no completion names a QP destroyed earlier (its CQ is drained when the
//!   destroy returns; anything for it after that is a finding, until the
//!   number is given to a new QP of the VM);
//! - a MAD received is one: on QP 1, from QP 1, behind a GRH, at most 256
//!   bytes;
//! - at the end the data path still works: a SEND between two fresh QPs of
//!   two VMs completes on both sides.
//!
//! Setting `RDMA_FUZZ_NO_QPN_REUSE=1` makes the allocator never reuse a
//! number (to fuzz past a known QP-number-reuse bug).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use vhost_user_rdma::device::QueueDepths;
use vhost_user_rdma::engine::POLL_WINDOW;
use vhost_user_rdma::resources::ResourceCounts;
use vhost_user_rdma::rnic::Rnic;
use vhost_user_rdma::rnic_objects::RnicObjects;
use vhost_user_rdma::{Daemon, DaemonConfig, Limits};
use vhost_user_rdma_tests::guest_mem::{MemLayout, MIB};
use vhost_user_rdma_tests::rnics::RecyclingQpns;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vhost_user_rdma_tests::Error;
use virtio_rdma_abi::config::DeviceConfig;
use virtio_rdma_abi::datapath::{WcOpcode, WcStatus, UD_GRH_SIZE};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{AddressVector, QpType, GSI_QPN, MAX_MAD_BYTES};
use virtio_rdma_abi::verbs::{MW_TYPE_1, MW_TYPE_2, REREG_TRANSLATION};
use virtio_rdma_driver::{
    Ah, Cq, Device, DeviceOptions, DmaBuf, DmaRegion, Error as DrvError, FastMr, FastReg, Mr, Mw,
    MwBind, Pd, Qp, QpCap, QpInit, RcConnect, RecvWr, SendOp, SendWr, Sge, SharedMemory, Token,
    Transport as DrvTransport, TransportError, UdDest, WorkCompletion,
};

/// Longest time one operation of the harness may take.
pub const HANG: Duration = Duration::from_secs(30);
/// Most operations one input runs.
const MAX_OPS: usize = 48;
/// Most device starts (`Op::Reset`, `Op::Disconnect`) of one input; later
/// ones are skipped. A start costs ten times an average operation, and
/// each repetition moves the reset code's hit counters into a new bucket
/// (new features for libFuzzer), so without a bound a run's corpus drifts
/// to inputs of many resets that reach nothing new. Three allow a reset
/// or a disconnect after another one with traffic in flight between.
const MAX_STARTS: u8 = 2;
/// Most QPs the harness keeps per VM.
const MAX_QPS: usize = 6;
/// Bytes of each VM's registered buffer.
const BUF: u64 = 16 << 10;
/// Offsets in a buffer are taken modulo this (mostly inside it).
const SPAN: u64 = BUF + BUF / 4;
/// Lengths are taken modulo this (mostly fitting).
const LEN_SPAN: u32 = 6 << 10;
/// Remote rights of the harness's QPs.
const QP_ACCESS: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
/// Depth of each VM's CQ: more than the completions one input can cause
/// (MAX_OPS operations of at most 4 work requests, one completion each,
/// and the probe's), so that it never overflows, and no larger, since every
/// opening of the driver maps and zeroes it.
const CQ_DEPTH: u32 = 256;
/// How long an `Op::Sleep` lets an idle engine be (at most): past its poll
/// window it parks the VMs.
const PARK: Duration = POLL_WINDOW.saturating_add(Duration::from_micros(100));
/// How long the driver's wait for a control command, the test VMM's wait
/// for a vhost-user reply and [`wait_for`] yield the CPU before they sleep
/// ([`VmmTransport::set_wait_spin`], [`VmmOptions::reply_spin`]).
const WAIT_SPIN: Duration = Duration::from_micros(50);
/// DMA mappings each VM's transport keeps for regions of the same pages
/// to come ([`VmmTransport::set_kept_dma_views`]): more than the scattered
/// regions one input can free (an opening's two, two per QP, the probe's).
const KEPT_DMA_VIEWS: usize = 64;
/// wr_id of the final liveness probe's work requests.
const PROBE: u64 = 0xdead_beef_0000;

// ---------------------------------------------------------------------------
// QP numbers that come back

// ---------------------------------------------------------------------------
// Watchdog

type Armed = Mutex<Option<(Instant, String)>>;

fn watchdog() -> &'static Armed {
    static W: OnceLock<Arc<Armed>> = OnceLock::new();
    W.get_or_init(|| {
        let armed: Arc<Armed> = Arc::new(Mutex::new(None));
        let a = armed.clone();
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                let g = a.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((at, what)) = &*g {
                    if Instant::now() > *at {
                        eprintln!(
                            "engine harness: HANG: `{what}` did not finish within {HANG:?}; \
                             the daemon stopped answering"
                        );
                        std::process::abort();
                    }
                }
            })
            .expect("start the watchdog");
        armed
    })
}

fn arm(what: String) {
    *watchdog().lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now() + HANG, what));
}

fn disarm() {
    *watchdog().lock().unwrap_or_else(|p| p.into_inner()) = None;
}

// ---------------------------------------------------------------------------
// Input

/// A key in a work request.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Key {
    /// The right key.
    Good,
    /// A key of an MR registered earlier (perhaps gone).
    Stale(u8),
    /// Any value.
    Raw(u32),
}

/// Where a one-sided connection goes.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Target {
    /// A live QP (VM, QP).
    Live(u8, u8),
    /// A QP number destroyed earlier.
    Dead(u8),
    /// Any number.
    Raw(u32),
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// Create an RC QP.
    CreateQp(u8),
    /// Create a UC QP (`F_UC`): connected and used as the RC QPs are,
    /// with what RC would refuse dropped (and READ and atomics malformed).
    CreateUcQp(u8),
    /// Destroy a QP.
    DestroyQp(u8, u8),
    /// Connect two QPs to each other.
    Connect(u8, u8, u8, u8),
    /// Connect one QP.
    ConnectTo(u8, u8, Target),
    /// Post a receive.
    PostRecv {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Offset in the buffer.
        off: u16,
        /// Length.
        len: u16,
        /// Local key.
        key: Key,
    },
    /// Post a send work request.
    PostSend {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Operation (modulo 7).
        kind: u8,
        /// Offset in the local buffer.
        off: u16,
        /// Length.
        len: u16,
        /// Offset in the remote buffer.
        roff: u16,
        /// Local key.
        lkey: Key,
        /// Remote key.
        rkey: Key,
        /// Several copies of it.
        count: u8,
    },
    /// Poll a VM's CQ.
    Poll(u8),
    /// Let the engine run: until it has nothing left to do with the work
    /// posted, at most this many milliseconds (modulo 8).
    Sleep(u8),
    /// Device reset of a VM (then its driver opens it again).
    Reset(u8),
    /// The VMM of a VM disconnects (and reconnects).
    Disconnect(u8),
    /// Re-register a VM's buffer (new keys; the old ones go stale).
    Rereg(u8),
    /// Destroy a QP and create a new one at once (it gets the same QP
    /// number, and QPs connected to the old one now reach the new one).
    Recreate(u8, u8),
    /// Create a QP on each of two VMs and connect them to each other.
    Pair(u8, u8),
    /// Create the VM's GSI QP (QP 1) and bring it to RTS, if it has none.
    Gsi(u8),
    /// Post a receive of `len` (modulo 512) bytes at `off` on a VM's GSI
    /// QP.
    GsiRecv(u8, u16, u16),
    /// Send MADs from a VM's GSI QP.
    Mad {
        /// The sending VM.
        vm: u8,
        /// The VM whose GID is the destination.
        to: u8,
        /// Destination QP number: 1, unless this is 0xf0 or above (its low
        /// bits, QP 0 included).
        qpn: u8,
        /// Source GID index: the VM's own, unless this is 0xf0 or above
        /// (then its low bits: the default GID, unassigned entries, past
        /// the table).
        sgid: u8,
        /// Length (modulo 320: some beyond a MAD).
        len: u16,
        /// Offset in the local buffer.
        off: u16,
        /// SEND_WITH_IMM instead of SEND.
        imm: bool,
        /// Several copies of it.
        count: u8,
    },
    /// A `REG_MR` work request (`F_MEM_MGT`) on a QP: part of the VM's
    /// buffer into its `ALLOC_MR` region (made at first use), well formed
    /// (`how` 0 to 3) or not (a page outside RAM, another key, more pages
    /// than the region's room, the page array outside RAM).
    FastReg {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Which registration.
        how: u8,
        /// Offset of the part in the buffer.
        off: u16,
        /// Its length.
        len: u16,
    },
    /// A `LOCAL_INV` on a QP: of the VM's `ALLOC_MR` region's key (`Good`),
    /// an old key or any value.
    LocalInv {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// The key.
        key: Key,
    },
    /// A `SEND_WITH_INV` of the peer's `ALLOC_MR` region's key (`Good`), an
    /// old key or any value.
    SendInv {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// The key to invalidate.
        key: Key,
        /// Offset in the local buffer.
        off: u16,
        /// Length.
        len: u16,
    },
    /// A send work request whose local buffer and remote range are named
    /// through fast-registration keys or the local DMA key.
    Through {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Operation (modulo 7, as `PostSend`).
        kind: u8,
        /// Offset in the local buffer.
        off: u16,
        /// Length.
        len: u16,
        /// Offset in the remote buffer.
        roff: u16,
        /// How the local buffer is named.
        local: Via,
        /// How the remote range is named.
        remote: Via,
    },
    /// A `BIND_MW` work request (`F_MW`) on a QP: the VM's window (made at
    /// first use, type 2 if `type2`) over part of the VM's buffer, well
    /// formed (`how` 0 to 3) or not (other key bits, past the region, an
    /// unknown lkey, rights the window cannot grant, a zero length).
    BindMw {
        /// VM.
        vm: u8,
        /// QP.
        qp: u8,
        /// Which bind.
        how: u8,
        /// A type 2 window (when the VM has none yet).
        type2: bool,
        /// Offset of the window in the buffer.
        off: u16,
        /// Its length.
        len: u16,
    },
    /// `RESIZE_CQ` (`F_RESIZE`) of a VM's CQ while its QPs' work runs:
    /// to 16 << (`depth` % 6) entries, below what is outstanding too
    /// (refused) or below what is to come (the CQ may overflow later).
    ResizeCq(u8, u8),
    /// `REREG_MR` (`F_RESIZE`) of a VM's buffer region while work uses it:
    /// `flags` % 8 of translation (the same buffer again), PD (the same)
    /// and access (`access` % 4 picks rights, fewer than before too); the
    /// keys stay. A bound window makes it `BUSY`.
    ReregMr {
        /// VM.
        vm: u8,
        /// `REREG_*` flags (0: refused).
        flags: u8,
        /// Which rights.
        access: u8,
    },
}

/// How a buffer is named in an `Op::Through`.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Via {
    /// The buffer's registered region.
    Mr,
    /// The `ALLOC_MR` region's current key (if the VM has one).
    Fast,
    /// The local DMA key over the buffer's guest-physical pages (as an
    /// rkey: refused).
    Dma,
    /// The local DMA key over guest-physical addresses outside RAM.
    Hole,
    /// The memory window's current key (if the VM has one; as an lkey:
    /// refused).
    Window,
}

/// The whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// Three VMs instead of two.
    pub three: bool,
    /// The operations.
    pub ops: Vec<Op>,
}

// ---------------------------------------------------------------------------
// Waiting for the daemon

/// Polls `done` until it holds or `limit` has passed; returns whether it
/// held. Yields the CPU for [`WAIT_SPIN`] first (the daemon's threads share
/// the cores), then sleeps in steps growing to 200 µs: the daemon usually
/// gets there within microseconds, and a fixed 1 ms sleep made every such
/// wait cost 1 ms.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let deadline = start + limit;
    let mut pause = Duration::from_micros(10);
    loop {
        if done() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        if now < start + WAIT_SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }
}

// ---------------------------------------------------------------------------
// One opening of the device

/// The driver's transport for one opening of a VM's device: the VM's
/// transport until [`Session::close`], then `Disconnected` for every call.
/// At the end of an input the device is reset under the driver; the driver
/// objects of the old opening then free their memory on drop without
/// sending destroys (the reset device would refuse them, and the driver
/// keeps the memory of an object whose destroy failed).
struct Session {
    t: Arc<VmmTransport>,
    closed: AtomicBool,
}

impl Session {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn open(&self) -> Result<(), TransportError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(TransportError::Disconnected)
        } else {
            Ok(())
        }
    }
}

impl DrvTransport for Session {
    fn features(&self) -> u64 {
        self.t.features()
    }
    fn read_config(&self) -> Result<DeviceConfig, TransportError> {
        self.open()?;
        self.t.read_config()
    }
    fn dma_page_shift(&self) -> u32 {
        self.t.dma_page_shift()
    }
    fn alloc_dma(&self, len: usize, align: usize) -> Result<Box<dyn DmaRegion>, TransportError> {
        self.t.alloc_dma(len, align)
    }
    fn submit(&self, request: &[&[u8]], response_len: usize) -> Result<Token, TransportError> {
        self.open()?;
        self.t.submit(request, response_len)
    }
    fn wait(&self, token: Token, timeout: Option<Duration>) -> Result<Vec<u8>, TransportError> {
        self.open()?;
        self.t.wait(token, timeout)
    }
    fn notify(&self, queue: u16) -> Result<(), TransportError> {
        self.open()?;
        self.t.notify(queue)
    }
    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<Event>, TransportError> {
        self.open()?;
        self.t.next_event(timeout)
    }
    fn shared_memory(&self, id: u8) -> Option<Arc<dyn SharedMemory>> {
        self.t.shared_memory(id)
    }
}

// ---------------------------------------------------------------------------
// Harness state

struct QpS {
    qp: Qp,
    /// The VM of the QP it was connected to.
    peer: Option<usize>,
}

struct VmS {
    // Dropped in this order: QPs, the GSI QP and its AHs, fast region, MR,
    // buffer, CQ, PD, device, session, transport.
    qps: Vec<QpS>,
    /// The GSI QP, once created.
    gsi: Option<Qp>,
    /// Address handles of the MADs sent (kept while their WQEs may run).
    ahs: Vec<Ah>,
    /// The memory window, once an op made it (dropped before the MR it
    /// may be bound to).
    mw: Option<Mw>,
    /// The `ALLOC_MR` region over the buffer, once an op made it.
    fast: Option<FastMr>,
    mr: Mr,
    buf: Arc<DmaBuf>,
    cq: Arc<Cq>,
    pd: Arc<Pd>,
    dev: Device,
    session: Arc<Session>,
    t: Arc<VmmTransport>,
    /// QP numbers of destroyed QPs of this VM (no completion may name them).
    dead: HashSet<u32>,
}

/// Rights of each VM's buffer: all, and memory windows may be bound to it.
const BUF_ACCESS: u32 = access::ALL | access::MW_BIND;

/// VMs of the daemon; an input uses the first two or all three.
const VMS: usize = 3;

/// The daemon and its VMs, kept from one input to the next (see
/// [`run_input`] for the state every input starts from).
struct Harness {
    daemon: Option<Daemon>,
    dir: PathBuf,
    rnic: Arc<RecyclingQpns>,
    vms: Vec<Option<VmS>>,
    /// VMs of the current input (2 or 3).
    active: usize,
    /// What the daemon holds for a VM whose driver was just opened.
    canon: ResourceCounts,
    /// Memory keys in use when every VM's driver was just opened.
    canon_keys: usize,
    /// Free bytes of a VM's guest RAM then.
    canon_free: u64,
    /// Keys of earlier registrations (lkey, rkey).
    old_keys: Vec<(u32, u32)>,
    /// QP numbers destroyed so far.
    dead_qpns: Vec<u32>,
    seq: u64,
    /// Device starts left to the current input ([`MAX_STARTS`]).
    starts: u8,
}

/// A driver error that means the daemon did not answer.
fn no_answer(e: &DrvError) -> bool {
    !matches!(
        e,
        DrvError::Command { .. }
            | DrvError::QueueFull { .. }
            | DrvError::InvalidWr { .. }
            | DrvError::InvalidArgument(_)
            | DrvError::Mismatch(_)
            | DrvError::Unsupported(_)
    )
}

fn check<T>(what: &str, r: Result<T, DrvError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if no_answer(&e) => panic!("{what}: the daemon did not answer: {e}"),
        Err(_) => None,
    }
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 32,
    }
}

fn vmm_options() -> VmmOptions {
    VmmOptions {
        mem: MemLayout::two_regions(8 * MIB, 8 * MIB),
        timeout: Duration::from_secs(10),
        // No watchdog thread per VMM connection (started at every connect,
        // joined at every disconnect): the harness's own watchdog ([`HANG`])
        // bounds every operation, and names it.
        message_timeout: None,
        pipeline_setup: true,
        reply_spin: Some(WAIT_SPIN),
        ..VmmOptions::default()
    }
}

/// Connects a VMM to `socket`, with the guest RAM of `previous`, a VMM that
/// went away (and its DMA address space: the mappings it kept serve the new
/// one), or new RAM (the first connection of the process: it also asks for
/// an acknowledgement of every set-up message, the VMMs after it only sync
/// once per set-up, see [`VmmOptions::pipeline_setup`]).
fn connect_vm(socket: &Path, previous: Option<&VmmTransport>) -> Arc<VmmTransport> {
    let t = match previous {
        Some(p) => {
            TestVmm::connect_with_mem(socket, vmm_options(), p.mem().clone()).and_then(|vmm| {
                VmmTransport::with_dma_space_of(vmm, p).map_err(|source| Error::Io {
                    what: "transport",
                    source,
                })
            })
        }
        None => TestVmm::connect(
            socket,
            VmmOptions {
                pipeline_setup: false,
                ..vmm_options()
            },
        )
        .and_then(|mut vmm| {
            vmm.set_pipeline_setup(true);
            VmmTransport::new(vmm).map_err(|source| Error::Io {
                what: "transport",
                source,
            })
        }),
    }
    .unwrap_or_else(|e| panic!("connect a VMM to {}: {e}", socket.display()));
    // The process has more busy threads than the machine has cores (the
    // harness, and per VM a relay, a vhost-user thread and a polling vring
    // worker, and the engine): yielding while a control command runs lets
    // the daemon's threads have the core at once, and spares the harness a
    // sleep and a wake-up per command (inputs ran 30 % faster).
    t.set_wait_spin(Some(WAIT_SPIN));
    // Most of the driver's queues, headers and rings are one page or one
    // contiguous range: no mapping of their own each.
    t.set_dma_in_ram_mapping(true);
    // The others (the CQ's ring, the registered buffer, the QPs' queues:
    // scattered pages) come back with the same pages after each device
    // reset, the guest RAM's allocator being back where it was: they keep
    // their mappings (a `mmap` per page and a `munmap` with its TLB
    // shootdown on both cores saved each time).
    t.set_kept_dma_views(KEPT_DMA_VIEWS);
    t
}

/// Opens the driver on `t` with the harness's PD, CQ and registered buffer.
fn open_driver(t: Arc<VmmTransport>) -> VmS {
    let session = Arc::new(Session {
        t: t.clone(),
        closed: AtomicBool::new(false),
    });
    let opts = DeviceOptions {
        command_timeout: Some(Duration::from_secs(10)),
        ..DeviceOptions::default()
    };
    let dev = Device::open_with(session.clone(), opts).expect("open the device");
    // One round trip for both (of the three after the device's opening).
    let (pd, cq) = Pd::alloc_with_cq(&dev, CQ_DEPTH).expect("alloc PD and create CQ");
    let buf = Arc::new(dev.alloc_dma(BUF as usize, 8).expect("alloc DMA"));
    let mr = Mr::register(&pd, buf.clone(), BUF_ACCESS).expect("register MR");
    VmS {
        qps: Vec::new(),
        gsi: None,
        ahs: Vec::new(),
        mw: None,
        fast: None,
        mr,
        buf,
        cq,
        pd,
        dev,
        session,
        t,
        dead: HashSet::new(),
    }
}

/// Waits until VM `i` holds nothing (or panics after 5 s).
fn wait_empty(daemon: &Daemon, i: usize, why: &str) {
    let empty = || {
        daemon
            .vm_stats(i)
            .expect("statistics")
            .device
            .resources
            .is_empty()
    };
    if !wait_for(Duration::from_secs(5), empty) {
        panic!(
            "VM {i}: objects not released after {why}: {:?}",
            daemon.vm_stats(i).map(|s| s.device.resources)
        );
    }
}

/// Device reset of VM `i` under its driver (which frees its objects without
/// sending destroys), a check that the daemon released everything, and a
/// new opening of the driver.
fn restore(daemon: &Daemon, i: usize, vm: VmS, why: &str) -> VmS {
    let reset = start_restore(vm);
    finish_restore(daemon, i, reset, why)
}

/// A device reset sent by [`start_restore`] and not yet answered.
struct Restoring {
    t: Arc<VmmTransport>,
    sent: vhost_user_rdma_tests::Result<()>,
}

/// The first half of [`restore`]: the reset goes out, and the old opening's
/// memory is freed while the daemon handles it (nothing is allocated from
/// guest RAM before the reset is answered: the device may use that memory
/// until then).
fn start_restore(vm: VmS) -> Restoring {
    vm.session.close();
    let t = vm.t.clone();
    let sent = t.vmm().start_reset();
    drop(vm);
    Restoring { t, sent }
}

/// The second half of [`restore`].
fn finish_restore(daemon: &Daemon, i: usize, r: Restoring, why: &str) -> VmS {
    let Restoring { t, sent } = r;
    if let Err(e) = sent.and_then(|()| t.vmm().finish_reset()) {
        panic!("VM {i}: {why} failed: {e}");
    }
    wait_empty(daemon, i, why);
    open_driver(t)
}

/// What the device reset of every VM at the end of an input is called in
/// messages.
const END: &str = "the device reset at the end of the input";

/// The socket directory of the process's harness, removed at exit.
static SOCKET_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_socket_dir() {
    if let Some(dir) = SOCKET_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Harness {
    fn start() -> Harness {
        // One harness at a time in a process: one directory name.
        let dir = std::env::temp_dir().join(format!("rdma-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the socket directory");
        if SOCKET_DIR.set(dir.clone()).is_ok() {
            // The harness lives in a static until the process exits, and
            // statics are not dropped: remove its sockets then.
            // SAFETY: `remove_socket_dir` is an `extern "C"` function without
            // arguments that does not unwind (remove_dir_all returns errors).
            unsafe { libc::atexit(remove_socket_dir) };
        }
        let sockets: Vec<PathBuf> = (0..VMS).map(|i| dir.join(format!("vm{i}.sock"))).collect();
        let mut config = DaemonConfig::new(sockets.clone());
        // One context per VM is all the harness opens. Every device reset
        // zeroes the doorbell region, which has a page per context allowed:
        // 8 KiB instead of the default 256 KiB.
        config.set_limits(Limits {
            max_ctx: 2,
            ..Limits::default()
        });
        // QP numbers are reused as soon as they are freed, unless
        // `RDMA_FUZZ_NO_QPN_REUSE` is set.
        let reuse = std::env::var_os("RDMA_FUZZ_NO_QPN_REUSE").is_none();
        let rnic = Arc::new(RecyclingQpns::new(reuse));
        let dyn_rnic: Arc<dyn RnicObjects> = rnic.clone();
        let daemon =
            Daemon::start_with_rnic(config, Rnic::soft(dyn_rnic)).expect("start the daemon");
        let vms: Vec<Option<VmS>> = sockets
            .iter()
            .map(|s| Some(open_driver(connect_vm(s, None))))
            .collect();
        let canon = daemon
            .vm_stats(0)
            .expect("statistics of VM 0")
            .device
            .resources;
        let canon_free = vms[0]
            .as_ref()
            .map_or(0, |v| v.t.mem().allocator().free_bytes());
        let h = Harness {
            daemon: Some(daemon),
            dir,
            canon_keys: rnic.keys_in_use(),
            rnic,
            vms,
            active: VMS,
            canon,
            canon_free,
            old_keys: Vec::new(),
            dead_qpns: Vec::new(),
            seq: 0,
            starts: MAX_STARTS,
        };
        h.check_canonical();
        h
    }

    /// Starts an input on the first `n` VMs.
    fn begin(&mut self, n: usize) {
        self.active = n;
        self.old_keys.clear();
        self.dead_qpns.clear();
        self.seq = 0;
        self.starts = MAX_STARTS;
    }

    /// Takes one of the input's device starts; false once none is left.
    fn take_start(&mut self) -> bool {
        let left = self.starts > 0;
        self.starts = self.starts.saturating_sub(1);
        left
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("the daemon runs")
    }

    fn socket(&self, vm: usize) -> PathBuf {
        self.dir.join(format!("vm{vm}.sock"))
    }

    fn vm_index(&self, v: u8) -> usize {
        usize::from(v) % self.active
    }

    fn vm(&mut self, v: u8) -> (usize, &mut VmS) {
        let i = self.vm_index(v);
        (
            i,
            self.vms[i]
                .as_mut()
                .expect("every VM is open between steps"),
        )
    }

    /// Checks completions of VM `i`'s CQ (polls what is there).
    fn poll(&mut self, i: usize) {
        let Some(vm) = self.vms[i].as_ref() else {
            return;
        };
        let mut wc = [WorkCompletion::default(); 32];
        loop {
            let n = vm.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert!(
                    !vm.dead.contains(&c.qpn),
                    "VM {i}: completion {c:?} for QP number {:#x}, destroyed earlier",
                    c.qpn
                );
                if c.qpn == GSI_QPN && c.is_success() && c.opcode() == Some(WcOpcode::RECV) {
                    assert!(
                        c.src_qpn == GSI_QPN
                            && c.has_grh()
                            && c.byte_len <= UD_GRH_SIZE + MAX_MAD_BYTES,
                        "VM {i}: a MAD received that is none: {c:?}"
                    );
                }
            }
            if n < wc.len() {
                break;
            }
        }
    }

    /// The daemon holds exactly the QPs the driver holds.
    fn check_counts(&self) {
        for (i, vm) in self.vms.iter().enumerate().take(self.active) {
            let Some(vm) = vm else { continue };
            let s = self
                .daemon()
                .vm_stats(i)
                .expect("statistics of a configured VM");
            let held = vm.qps.len() + usize::from(vm.gsi.is_some());
            assert_eq!(
                s.device.resources.qp, held,
                "VM {i}: the daemon holds {} QPs, the driver {held}",
                s.device.resources.qp,
            );
            assert_eq!(
                s.device.resources.mr,
                1 + usize::from(vm.fast.is_some()),
                "VM {i}: the daemon's MRs"
            );
            // A fast registration counts its bytes while it is valid: at
            // most its region's room, the buffer.
            assert!(
                s.device.resources.registered_bytes <= 2 * BUF,
                "VM {i}: {} bytes registered",
                s.device.resources.registered_bytes
            );
        }
    }

    fn key(&self, k: Key, good: u32) -> u32 {
        match k {
            Key::Good => good,
            Key::Stale(i) if !self.old_keys.is_empty() => {
                let (l, r) = self.old_keys[usize::from(i) % self.old_keys.len()];
                if i % 2 == 0 {
                    l
                } else {
                    r
                }
            }
            Key::Stale(i) => u32::from(i),
            Key::Raw(v) => v,
        }
    }

    fn step(&mut self, op: &Op) {
        self.seq += 1;
        match *op {
            Op::CreateQp(v) | Op::CreateUcQp(v) => {
                let (_, vm) = self.vm(v);
                if vm.qps.len() >= MAX_QPS {
                    return;
                }
                let mut init = if matches!(op, Op::CreateUcQp(_)) {
                    QpInit::uc(&vm.cq)
                } else {
                    QpInit::rc(&vm.cq)
                };
                init.cap = cap();
                if let Some(qp) = check("CREATE_QP", Qp::create(&vm.pd, &init)) {
                    vm.dead.remove(&qp.qpn());
                    vm.qps.push(QpS { qp, peer: None });
                }
            }
            Op::DestroyQp(v, q) => {
                let (i, vm) = self.vm(v);
                if vm.qps.is_empty() {
                    return;
                }
                let qs = vm.qps.remove(usize::from(q) % vm.qps.len());
                let qpn = qs.qp.qpn();
                if let Err(e) = qs.qp.destroy() {
                    panic!("VM {i}: DESTROY_QP of a live QP failed: {e}");
                }
                // What is in the CQ now was written before the destroy.
                let mut wc = [WorkCompletion::default(); 32];
                while vm.cq.poll(&mut wc) > 0 {}
                vm.dead.insert(qpn);
                self.dead_qpns.push(qpn);
            }
            Op::Connect(va, qa, vb, qb) => {
                let (a, b) = (self.vm_index(va), self.vm_index(vb));
                let (Some(pa), Some(pb)) = (self.qp_of(a, qa), self.qp_of(b, qb)) else {
                    return;
                };
                if (a, pa) == (b, pb) {
                    return;
                }
                let (qpn_a, gid_a) = self.ident(a, pa);
                let (qpn_b, gid_b) = self.ident(b, pb);
                self.connect(a, pa, qpn_b, gid_b, Some(b));
                self.connect(b, pb, qpn_a, gid_a, Some(a));
            }
            Op::ConnectTo(v, q, target) => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, q) else { return };
                let (qpn, gid, peer) = match target {
                    Target::Live(vb, qb) => {
                        let b = self.vm_index(vb);
                        let Some(pb) = self.qp_of(b, qb) else { return };
                        let (qpn, gid) = self.ident(b, pb);
                        (qpn, gid, Some(b))
                    }
                    Target::Dead(k) if !self.dead_qpns.is_empty() => {
                        let qpn = self.dead_qpns[usize::from(k) % self.dead_qpns.len()];
                        let b = self.vm_index(k);
                        (qpn, self.gid(b), Some(b))
                    }
                    Target::Dead(k) => (u32::from(k), self.gid(a), None),
                    Target::Raw(n) => (n & 0x00ff_ffff, self.gid(a), None),
                };
                self.connect(a, pa, qpn, gid, peer);
            }
            Op::PostRecv {
                vm: v,
                qp,
                off,
                len,
                key,
            } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                let vm = self.vms[a].as_ref().expect("open");
                let lkey = self.key(key, vm.mr.lkey());
                let sge = Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: u32::from(len) % LEN_SPAN,
                    lkey,
                };
                let wr = RecvWr {
                    wr_id: self.seq,
                    sg_list: &[sge],
                };
                check("post_recv", vm.qps[pa].qp.post_recv(&[wr]));
            }
            Op::PostSend {
                vm: v,
                qp,
                kind,
                off,
                len,
                roff,
                lkey,
                rkey,
                count,
            } => {
                let Some((pa, vm, remote)) = self.sender(v, qp) else {
                    return;
                };
                let raddr = remote.mr.iova() + u64::from(roff) % SPAN;
                let rkey = self.key(rkey, remote.mr.rkey());
                let op = send_op(kind, raddr, rkey, self.seq);
                let len = op_len(kind, len);
                let sge = [Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: len,
                    lkey: self.key(lkey, vm.mr.lkey()),
                }];
                let n = usize::from(count % 4) + 1;
                let wrs: Vec<SendWr<'_>> = (0..n)
                    .map(|k| SendWr::signaled(self.seq * 8 + k as u64, op, &sge))
                    .collect();
                check("post_send", vm.qps[pa].qp.post_send(&wrs));
            }
            Op::Poll(v) => {
                let i = self.vm_index(v);
                self.poll(i);
            }
            Op::Sleep(ms) => {
                // Until the engine has done what it can with the work posted
                // (nothing left on a send queue: done, failed, or flushed),
                // at most `ms % 8` ms as before (a WQE waiting for a retry
                // keeps it waiting), then on a little longer than the
                // engine's poll window, so that it goes idle and parks its
                // VMs (the next work then wakes them). A fixed sleep spent
                // milliseconds after the engine was done in microseconds.
                let start = Instant::now();
                let limit = Duration::from_millis(u64::from(ms % 8));
                let daemon = self.daemon();
                let idle = || {
                    (0..self.active).all(|i| {
                        daemon
                            .vm_stats(i)
                            .is_none_or(|s| s.device.queues.send_wqes == 0)
                    })
                };
                wait_for(limit, idle);
                let park = limit.saturating_sub(start.elapsed()).min(PARK);
                if !park.is_zero() {
                    std::thread::sleep(park);
                }
            }
            Op::Reset(_) | Op::Disconnect(_) if !self.take_start() => {}
            Op::Reset(v) => {
                let i = self.vm_index(v);
                let vm = self.vms[i].take().expect("open");
                for q in &vm.qps {
                    self.dead_qpns.push(q.qp.qpn());
                }
                self.vms[i] = Some(restore(self.daemon(), i, vm, "a device reset"));
            }
            Op::Disconnect(v) => {
                let i = self.vm_index(v);
                let vm = self.vms[i].take().expect("open");
                self.reconnect(i, vm);
            }
            Op::Recreate(v, q) => {
                self.step(&Op::DestroyQp(v, q));
                self.step(&Op::CreateQp(v));
            }
            Op::Pair(va, vb) => {
                let (a, b) = (self.vm_index(va), self.vm_index(vb));
                let before = |h: &Self, i: usize| h.vms[i].as_ref().map_or(0, |v| v.qps.len());
                let (na, nb) = (before(self, a), before(self, b));
                self.step(&Op::CreateQp(va));
                self.step(&Op::CreateQp(vb));
                let (ma, mb) = (before(self, a), before(self, b));
                let created = if a == b {
                    ma >= na + 2
                } else {
                    ma > na && mb > nb
                };
                if created {
                    let (qa, qb) = if a == b {
                        (ma - 2, ma - 1)
                    } else {
                        (ma - 1, mb - 1)
                    };
                    let (qpn_a, gid_a) = self.ident(a, qa);
                    let (qpn_b, gid_b) = self.ident(b, qb);
                    self.connect(a, qa, qpn_b, gid_b, Some(b));
                    self.connect(b, qb, qpn_a, gid_a, Some(a));
                }
            }
            Op::Gsi(v) => {
                let (_, vm) = self.vm(v);
                if vm.gsi.is_some() {
                    return;
                }
                let mut init = QpInit::gsi(&vm.cq);
                init.cap = cap();
                let Some(qp) = check("CREATE_QP GSI", Qp::create(&vm.pd, &init)) else {
                    return;
                };
                assert_eq!(qp.qpn(), GSI_QPN, "the GSI QP is QP 1");
                check("activate the GSI QP", qp.gsi_activate());
                vm.gsi = Some(qp);
            }
            Op::GsiRecv(v, off, len) => {
                let seq = self.seq;
                let (_, vm) = self.vm(v);
                let Some(qp) = &vm.gsi else { return };
                let sge = Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: u32::from(len) % 512,
                    lkey: vm.mr.lkey(),
                };
                let wr = RecvWr {
                    wr_id: seq,
                    sg_list: &[sge],
                };
                check("post_recv (GSI)", qp.post_recv(&[wr]));
            }
            Op::Mad {
                vm: v,
                to,
                qpn,
                sgid,
                len,
                off,
                imm,
                count,
            } => {
                let dgid = self.gid(self.vm_index(to));
                let seq = self.seq;
                let (_, vm) = self.vm(v);
                if vm.gsi.is_none() {
                    return;
                }
                let av = AddressVector {
                    sgid_index: if sgid >= 0xf0 {
                        sgid % 0x12
                    } else {
                        vm.dev.gid_index()
                    },
                    ..vm.dev.av(dgid)
                };
                let Some(ah) = check("CREATE_AH", Ah::create(&vm.pd, &av)) else {
                    return;
                };
                if vm.ahs.len() >= 8 {
                    vm.ahs.remove(0);
                }
                vm.ahs.push(ah);
                let (Some(ah), Some(qp)) = (vm.ahs.last(), vm.gsi.as_ref()) else {
                    return;
                };
                let sge = [Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: u32::from(len) % 320,
                    lkey: vm.mr.lkey(),
                }];
                let op = if imm {
                    SendOp::SendWithImm { imm: 3 }
                } else {
                    SendOp::Send
                };
                let dest = UdDest {
                    remote_qpn: if qpn >= 0xf0 {
                        u32::from(qpn % 0x10)
                    } else {
                        GSI_QPN
                    },
                    ..UdDest::gsi(ah)
                };
                let n = usize::from(count % 4) + 1;
                let wrs: Vec<SendWr<'_>> = (0..n)
                    .map(|k| SendWr {
                        ud: Some(dest),
                        ..SendWr::signaled(seq * 8 + k as u64, op, &sge)
                    })
                    .collect();
                check("post_send (MAD)", qp.post_send(&wrs));
            }
            Op::Rereg(v) => {
                let (_, vm) = self.vm(v);
                let keys = (vm.mr.lkey(), vm.mr.rkey());
                // Its window goes first: it holds the region (spec 18.29).
                vm.mw = None;
                let Some(mr) = check("REG_MR", Mr::register(&vm.pd, vm.buf.clone(), BUF_ACCESS))
                else {
                    return;
                };
                let old = std::mem::replace(&mut vm.mr, mr);
                drop(old);
                self.old_keys.push(keys);
            }
            Op::FastReg { .. }
            | Op::LocalInv { .. }
            | Op::SendInv { .. }
            | Op::Through { .. }
            | Op::BindMw { .. } => {
                self.fast_step(op);
            }
            Op::ResizeCq(v, depth) => {
                let (_, vm) = self.vm(v);
                check("RESIZE_CQ", vm.cq.resize(16 << (depth % 6)));
            }
            Op::ReregMr {
                vm: v,
                flags,
                access: a,
            } => {
                let (_, vm) = self.vm(v);
                let rights = match a % 4 {
                    0 => BUF_ACCESS,
                    1 => access::LOCAL_WRITE,
                    2 => access::LOCAL_WRITE | access::REMOTE_READ,
                    _ => access::LOCAL_WRITE | access::REMOTE_WRITE | access::MW_BIND,
                };
                let flags = u32::from(flags % 8);
                let buf = (flags & REREG_TRANSLATION != 0).then(|| vm.buf.clone());
                let pd = vm.pd.clone();
                check("REREG_MR", vm.mr.rereg(flags, Some(&pd), rights, buf));
            }
        }
    }

    /// The fast-registration operations (`Op::FastReg` to `Op::Through`).
    fn fast_step(&mut self, op: &Op) {
        let hole = vmm_options().mem.regions[0].end();
        match *op {
            Op::FastReg {
                vm: v,
                qp,
                how,
                off,
                len,
            } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                // The key it replaces is an old key from now on.
                let old = self.vms[a]
                    .as_ref()
                    .and_then(|v| v.fast.as_ref().map(FastMr::key));
                if let Some(k) = old.filter(|_| self.old_keys.len() < 64) {
                    self.old_keys.push((k, k));
                }
                let vm = self.vms[a].as_mut().expect("open");
                if vm.fast.is_none() {
                    vm.fast = check("ALLOC_MR", FastMr::alloc(&vm.pd, 8));
                }
                let Some(fast) = vm.fast.as_mut() else { return };
                let off = usize::from(off) % BUF as usize;
                let len = (usize::from(len) % (BUF as usize - off)).max(1);
                let Some(r) = check("map", fast.map_buf(&vm.buf, off, len, access::ALL)) else {
                    return;
                };
                let r = match how % 8 {
                    0..=3 => r,
                    4 => {
                        let mut pages = vm.buf.pages().to_vec();
                        pages[0] = hole;
                        let Some(r) = check("map", fast.map(&pages, 12, r.iova, r.length, 0))
                        else {
                            return;
                        };
                        r
                    }
                    5 => FastReg {
                        key: r.key ^ 0x100,
                        ..r
                    },
                    6 => FastReg { npages: 9, ..r },
                    _ => FastReg {
                        pages_gpa: hole,
                        ..r
                    },
                };
                let wr = SendWr::signaled(self.seq * 8, SendOp::RegMr(r), &[]);
                check("post REG_MR", vm.qps[pa].qp.post_send(&[wr]));
            }
            Op::LocalInv { vm: v, qp, key } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                let vm = self.vms[a].as_ref().expect("open");
                let good = vm.fast.as_ref().map_or(vm.mr.lkey(), FastMr::key);
                let key = self.key(key, good);
                let wr = SendWr::signaled(self.seq * 8, SendOp::LocalInv { key }, &[]);
                check("post LOCAL_INV", vm.qps[pa].qp.post_send(&[wr]));
            }
            Op::SendInv {
                vm: v,
                qp,
                key,
                off,
                len,
            } => {
                let Some((pa, vm, remote)) = self.sender(v, qp) else {
                    return;
                };
                let good = remote.fast.as_ref().map_or(remote.mr.rkey(), FastMr::key);
                let key = self.key(key, good);
                let sge = [Sge {
                    addr: vm.mr.iova() + u64::from(off) % SPAN,
                    length: u32::from(len) % LEN_SPAN,
                    lkey: vm.mr.lkey(),
                }];
                let wr = SendWr::signaled(self.seq * 8, SendOp::SendWithInv { key }, &sge);
                check("post SEND_WITH_INV", vm.qps[pa].qp.post_send(&[wr]));
            }
            Op::Through {
                vm: v,
                qp,
                kind,
                off,
                len,
                roff,
                local,
                remote,
            } => {
                let Some((pa, vm, peer)) = self.sender(v, qp) else {
                    return;
                };
                let dma = vm.dev.local_dma_lkey().unwrap_or(0);
                let (off, roff) = (u64::from(off) % BUF, u64::from(roff) % SPAN);
                let mut length = op_len(kind, len);
                let (laddr, lkey) = match local {
                    Via::Mr => (vm.mr.iova() + off, vm.mr.lkey()),
                    Via::Window => (vm.mr.iova() + off, vm.mw.as_ref().map_or(0, Mw::key)),
                    Via::Fast => (vm.mr.iova() + off, vm.fast.as_ref().map_or(0, FastMr::key)),
                    Via::Dma => {
                        let gpa = vm.buf.gpa(off as usize).unwrap_or(hole);
                        // Within the page: the buffer's pages are scattered.
                        if kind % 7 < 5 {
                            length = length.min(4096 - (gpa % 4096) as u32);
                        }
                        (gpa, dma)
                    }
                    Via::Hole => (hole + off, dma),
                };
                let (raddr, rkey) = match remote {
                    Via::Mr => (peer.mr.iova() + roff, peer.mr.rkey()),
                    Via::Window => (peer.mr.iova() + roff, peer.mw.as_ref().map_or(0, Mw::key)),
                    Via::Fast => (
                        peer.mr.iova() + roff,
                        peer.fast.as_ref().map_or(0, FastMr::key),
                    ),
                    Via::Dma => (peer.buf.gpa(0).unwrap_or(hole) + roff, dma),
                    Via::Hole => (hole + roff, dma),
                };
                let op = send_op(kind, raddr, rkey, self.seq);
                let sge = [Sge {
                    addr: laddr,
                    length,
                    lkey,
                }];
                let wr = SendWr::signaled(self.seq * 8, op, &sge);
                check("post_send", vm.qps[pa].qp.post_send(&[wr]));
            }
            Op::BindMw {
                vm: v,
                qp,
                how,
                type2,
                off,
                len,
            } => {
                let a = self.vm_index(v);
                let Some(pa) = self.qp_of(a, qp) else { return };
                let vm = self.vms[a].as_mut().expect("open");
                if vm.mw.is_none() {
                    let t = if type2 { MW_TYPE_2 } else { MW_TYPE_1 };
                    vm.mw = check("ALLOC_MW", Mw::alloc(&vm.pd, t));
                }
                let (lkey, iova) = (vm.mr.lkey(), vm.mr.iova());
                let Some(mw) = vm.mw.as_mut() else { return };
                let off = u64::from(off) % BUF;
                let len = (u64::from(len) % (BUF - off)).max(1);
                let rights = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
                let b = mw.bind(lkey, iova + off, len, rights);
                let b = match how % 8 {
                    0..=3 => b,
                    4 => MwBind {
                        new_rkey: b.new_rkey ^ 0x100,
                        ..b
                    },
                    5 => MwBind {
                        length: BUF + 1,
                        ..b
                    },
                    6 => MwBind {
                        mr_lkey: b.mr_lkey ^ 0x100,
                        ..b
                    },
                    _ => MwBind {
                        access: access::ALL | access::MW_BIND,
                        length: 0,
                        ..b
                    },
                };
                let wr = SendWr::signaled(self.seq * 8, SendOp::BindMw(b), &[]);
                check("post BIND_MW", vm.qps[pa].qp.post_send(&[wr]));
            }
            _ => {}
        }
    }

    /// Disconnects VM `i`'s VMM (after a reset, or mid-traffic), checks
    /// that the daemon releases everything, and connects a new one (with
    /// the same guest RAM).
    fn reconnect(&mut self, i: usize, vm: VmS) {
        for q in &vm.qps {
            self.dead_qpns.push(q.qp.qpn());
        }
        let previous = vm.t.clone();
        vm.t.vmm().disconnect();
        // The destroys of the driver's objects fail at once (disconnected),
        // and the VMM's rings go back to the guest RAM's allocator.
        drop(vm);
        let released = || {
            let s = self.daemon().vm_stats(i).expect("statistics");
            !s.connected && s.device.resources.is_empty()
        };
        if !wait_for(Duration::from_secs(5), released) {
            panic!(
                "VM {i}: not released after its VMM disconnected: {:?}",
                self.daemon().vm_stats(i)
            );
        }
        self.vms[i] = Some(open_driver(connect_vm(&self.socket(i), Some(&previous))));
    }

    /// The sender of a work request on QP `q` of VM `v`: the VM's index,
    /// the QP's, the VM, and the VM the QP was connected to (itself if
    /// none).
    fn sender(&self, v: u8, q: u8) -> Option<(usize, &VmS, &VmS)> {
        let a = self.vm_index(v);
        let pa = self.qp_of(a, q)?;
        let vm = self.vms[a].as_ref()?;
        let peer = vm.qps[pa]
            .peer
            .and_then(|p| self.vms[p].as_ref())
            .unwrap_or(vm);
        Some((pa, vm, peer))
    }

    fn qp_of(&self, vm: usize, q: u8) -> Option<usize> {
        let n = self.vms[vm].as_ref()?.qps.len();
        (n > 0).then(|| usize::from(q) % n)
    }

    fn gid(&self, vm: usize) -> [u8; 16] {
        self.vms[vm].as_ref().map_or([0; 16], |v| v.dev.gid())
    }

    fn ident(&self, vm: usize, q: usize) -> (u32, [u8; 16]) {
        let v = self.vms[vm].as_ref().expect("open");
        (v.qps[q].qp.qpn(), v.dev.gid())
    }

    fn connect(&mut self, vm: usize, q: usize, dest: u32, gid: [u8; 16], peer: Option<usize>) {
        let v = self.vms[vm].as_mut().expect("open");
        let mut c = RcConnect::new(dest, gid);
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
        c.rnr_retry = 1;
        c.retry_cnt = 1;
        c.timeout = 8;
        let qs = &mut v.qps[q];
        let connected = if qs.qp.qp_type() == QpType::UC {
            qs.qp.uc_connect(QP_ACCESS, &c)
        } else {
            qs.qp.rc_connect(QP_ACCESS, &c)
        };
        if check("connect", connected).is_some() {
            qs.peer = peer;
        }
    }

    /// A SEND between fresh QPs of two VMs completes on both sides. The
    /// QPs join their VMs' QPs, for the device resets that follow. They
    /// complete into CQs of their own: the input may have left a VM's CQ
    /// in error (an overflow after `Op::ResizeCq` made it small).
    fn probe(&mut self) {
        let (a, b) = (0, 1);
        let mk = |vm: &VmS| {
            let cq = Cq::create(&vm.dev, 16).expect("probe: create CQ");
            let mut init = QpInit::rc(&cq);
            init.cap = cap();
            (Qp::create(&vm.pd, &init).expect("probe: create QP"), cq)
        };
        // Fresh numbers: no QP of the fuzzed traffic is connected to them.
        self.rnic.fresh_only(true);
        let (qa, cqa) = mk(self.vms[a].as_ref().expect("open"));
        let (qb, cqb) = mk(self.vms[b].as_ref().expect("open"));
        self.rnic.fresh_only(false);
        // (Fresh, so never in a VM's dead list; kept for safety.)
        for (i, q) in [(a, &qa), (b, &qb)] {
            if let Some(vm) = self.vms[i].as_mut() {
                vm.dead.remove(&q.qpn());
            }
        }
        let va = self.vms[a].as_ref().expect("open");
        let vb = self.vms[b].as_ref().expect("open");
        let conn = |dest: u32, gid| {
            let mut c = RcConnect::new(dest, gid);
            c.max_rd_atomic = 4;
            c.max_dest_rd_atomic = 4;
            c
        };
        qa.rc_connect(QP_ACCESS, &conn(qb.qpn(), vb.dev.gid()))
            .expect("probe: connect A");
        qb.rc_connect(QP_ACCESS, &conn(qa.qpn(), va.dev.gid()))
            .expect("probe: connect B");
        let rsge = [Sge {
            addr: vb.mr.iova(),
            length: 64,
            lkey: vb.mr.lkey(),
        }];
        qb.post_recv(&[RecvWr {
            wr_id: PROBE,
            sg_list: &rsge,
        }])
        .expect("probe: post receive");
        let ssge = [Sge {
            addr: va.mr.iova(),
            length: 64,
            lkey: va.mr.lkey(),
        }];
        qa.post_send(&[SendWr::signaled(PROBE, SendOp::Send, &ssge)])
            .expect("probe: post send");
        for (vm, q, cq, who) in [(va, &qa, &cqa, "sender"), (vb, &qb, &cqb, "receiver")] {
            let mut wc = [WorkCompletion::default(); 32];
            let done = || {
                let n = cq.poll(&mut wc);
                let mut found = false;
                for c in &wc[..n] {
                    assert!(!vm.dead.contains(&c.qpn), "completion {c:?} for a dead QP");
                    if c.qpn == q.qpn() && c.wr_id == PROBE {
                        assert_eq!(c.status(), Some(WcStatus::SUCCESS), "probe {who}: {c:?}");
                        found = true;
                    }
                }
                found
            };
            assert!(
                wait_for(Duration::from_secs(10), done),
                "probe: the {who}'s completion did not come: the data path stopped"
            );
        }
        // Not destroyed: the device resets at the end of the input release
        // them with the VMs' other QPs (DESTROY_QP of connected QPs is what
        // `Op::DestroyQp` does).
        for (i, peer, qp) in [(a, b, qa), (b, a, qb)] {
            if let Some(vm) = self.vms[i].as_mut() {
                vm.qps.push(QpS {
                    qp,
                    peer: Some(peer),
                });
            }
        }
    }

    /// The end of an input: the liveness probe, then every VM of the input
    /// back to the state of a fresh start. Every VM's reset goes out before
    /// the first answer is read, so the daemon's threads of different VMs
    /// overlap; the openings that follow are one after the other (a thread
    /// each was slower: the work is the CPU's).
    fn finish(&mut self) {
        arm("liveness probe".into());
        self.probe();
        arm("device reset of every VM".into());
        let resets: Vec<Restoring> = (0..self.active)
            .map(|i| start_restore(self.vms[i].take().expect("open")))
            .collect();
        for (i, r) in resets.into_iter().enumerate() {
            self.vms[i] = Some(finish_restore(self.daemon(), i, r, END));
        }
        // Opening a driver creates no QP.
        assert_eq!(
            self.rnic.qpns_in_use(),
            0,
            "QP numbers left after every VM was reset"
        );
        assert!(self.rnic.restart(), "restart the QP numbering");
        disarm();
    }

    /// Ends the harness as the end of every input did when each had its
    /// own daemon: every VMM disconnects, the daemon releases everything
    /// (no object, no QP number), and it shuts down (within [`HANG`]).
    fn teardown(mut self) {
        arm("disconnect every VM".into());
        for vm in self.vms.iter_mut().filter_map(Option::take) {
            vm.t.vmm().disconnect();
            drop(vm);
        }
        for i in 0..VMS {
            let daemon = self.daemon();
            let released = || {
                let s = daemon.vm_stats(i).expect("statistics");
                !s.connected && s.device.resources.is_empty()
            };
            assert!(
                wait_for(Duration::from_secs(5), released),
                "VM {i}: not released after every VMM disconnected: {:?}",
                daemon.vm_stats(i)
            );
        }
        assert_eq!(
            self.rnic.qpns_in_use(),
            0,
            "QP numbers left after every VM disconnected"
        );
        arm("daemon shutdown".into());
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        disarm();
    }

    /// Every VM is as a fresh start leaves it: connected, the objects of
    /// one opening of the driver and nothing else in the daemon, no work or
    /// event waiting, the keys of those openings only, no QP number in
    /// use, all of the guest RAM free but what the openings hold.
    fn check_canonical(&self) {
        for i in 0..VMS {
            // The daemon's serving thread marks a new connection connected
            // after it has handed it to the connection's own thread, which
            // may have served the whole set-up and driver opening by then
            // (seen under load after an `Op::Disconnect`).
            let connected = || self.daemon().vm_stats(i).is_some_and(|s| s.connected);
            assert!(
                wait_for(Duration::from_secs(5), connected),
                "VM {i}: not connected between inputs"
            );
            let s = self.daemon().vm_stats(i).expect("statistics");
            assert_eq!(
                s.device.resources, self.canon,
                "VM {i}: the daemon's objects between inputs"
            );
            assert_eq!(
                s.device.queues,
                QueueDepths::default(),
                "VM {i}: work or events waiting between inputs"
            );
            let vm = self.vms[i].as_ref().expect("open between inputs");
            assert!(vm.qps.is_empty() && vm.dead.is_empty() && vm.gsi.is_none());
            assert_eq!(
                vm.t.mem().allocator().free_bytes(),
                self.canon_free,
                "VM {i}: guest RAM in use between inputs"
            );
        }
        assert_eq!(self.rnic.qpns_in_use(), 0, "QP numbers between inputs");
        assert_eq!(
            self.rnic.keys_in_use(),
            self.canon_keys,
            "memory keys between inputs"
        );
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // On a panic (a finding), leave quickly: the VMs disconnect with
        // their transports, the daemon stops.
        for vm in self.vms.iter_mut().filter_map(Option::take) {
            vm.t.vmm().disconnect();
        }
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The send operation `kind` (modulo 7: SEND, SEND with immediate, WRITE,
/// WRITE with immediate, READ, compare-and-swap, fetch-and-add) at
/// `raddr` under `rkey`.
fn send_op(kind: u8, raddr: u64, rkey: u32, seq: u64) -> SendOp {
    match kind % 7 {
        0 => SendOp::Send,
        1 => SendOp::SendWithImm { imm: 7 },
        2 => SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey,
        },
        3 => SendOp::RdmaWriteWithImm {
            remote_addr: raddr,
            rkey,
            imm: 9,
        },
        4 => SendOp::RdmaRead {
            remote_addr: raddr,
            rkey,
        },
        5 => SendOp::AtomicCmpSwp {
            remote_addr: raddr & !7,
            rkey,
            compare: 0,
            swap: seq,
        },
        _ => SendOp::AtomicFetchAdd {
            remote_addr: raddr & !7,
            rkey,
            add: 1,
        },
    }
}

/// The local length of operation `kind` (as [`send_op`]): 8 for an
/// atomic, `len` (mostly fitting the buffer) otherwise.
fn op_len(kind: u8, len: u16) -> u32 {
    if kind % 7 >= 5 {
        8
    } else {
        u32::from(len) % LEN_SPAN
    }
}

/// Runs one input of the `engine` target.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// The harness of the process, between inputs (`None` before the first
/// and after a finding).
static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

/// Ends the harness of the process (every VMM disconnects, the daemon must
/// release everything, it shuts down), if one runs: for a process that
/// goes on with other work, such as the replay test, whose `vhost` harness
/// counts the process's descriptors.
pub fn release() {
    let h = HARNESS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(h) = h {
        h.teardown();
    }
}

/// Whether an input of this process has run.
static RAN: AtomicBool = AtomicBool::new(false);

/// Runs one decoded input of the `engine` target.
///
/// One daemon and three connected VMs serve the inputs of the process
/// (starting them took most of the time of an input). Every input starts
/// from the same state, that of a fresh start ([`Harness::check_canonical`]
/// checks it): each VM connected, its driver opened (context, PD, CQ, a
/// registered buffer) and nothing else, no work or event pending, no QP
/// number in use and the numbering at its start; the end of the input
/// brings its VMs back there with a device reset each (after the liveness
/// probe). So an input does the same wherever it runs: in a long fuzzing
/// process, in the replay test after other files, or alone in a new
/// process.
///
/// The first input of a process, and every input with `RDMA_FUZZ_FRESH=1`,
/// ends as each did when it had a daemon of its own: every VMM disconnects,
/// the daemon must release everything, and it shuts down; the next input
/// starts a new daemon. (`RDMA_FUZZ_FRESH=1` also rules out state the
/// checks do not see when a finding does not reproduce.)
pub fn run_input(input: &Input) {
    let mut slot = HARNESS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut h = match slot.take() {
        Some(h) => h,
        None => {
            arm("start the daemon and open the VMs".into());
            Harness::start()
        }
    };
    h.begin(if input.three { 3 } else { 2 });
    for (k, op) in input.ops.iter().take(MAX_OPS).enumerate() {
        arm(format!("operation {k}: {op:?}"));
        h.step(op);
        h.check_counts();
    }
    h.finish();
    h.check_canonical();
    let first = !RAN.swap(true, Ordering::Relaxed);
    if first || std::env::var_os("RDMA_FUZZ_FRESH").is_some() {
        h.teardown();
    } else {
        *slot = Some(h);
    }
}
