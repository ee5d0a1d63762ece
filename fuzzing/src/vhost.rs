//! Target `vhost`: a hostile VMM on the vhost-user socket (issue 26).
//!
//! One daemon per process serves two VMs. VM 1 is a well-behaved test VMM
//! connected for the whole run; VM 0's socket gets, per input, one or more
//! raw connections that send arbitrary sequences of vhost-user messages:
//! memory tables over odd files (regions larger than the file, offsets,
//! overlaps, zero sizes, an unsealed memfd), vring numbers, addresses,
//! bases, kicks and calls, GET/SET_CONFIG at any offset and size, feature
//! sequences, resets, the back-end channel and shared-memory messages, raw
//! messages, and writes into the files (rings full of junk) followed by
//! kicks.
//!
//! Invariants, after every input: the daemon is alive (a crash such as
//! SIGBUS ends the process: a finding); it has seen every connection of the
//! input end and released VM 0 (no objects); the process holds exactly the
//! descriptors it held before the input (the daemon keeps no file of a gone
//! VMM); VM 1 answers a control command and reads its configuration
//! unchanged.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::TestVmm;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Most operations of one input.
const MAX_OPS: usize = 48;
/// Most connections of one input (a refused message closes one).
const MAX_CONNECTIONS: u64 = 4;
/// A fake VMM virtual address of guest address 0.
const VMM_VA: u64 = 0x7f00_0000_0000;
/// The sizes of the input's files: two sealed memfds and an unsealed one.
const FILE_SIZES: [u64; 3] = [1 << 20, 64 << 10, 1 << 20];

/// One input of the target.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// The messages and actions, in order.
    pub ops: Vec<Op>,
}

/// One region of a memory table.
#[derive(Debug, Arbitrary)]
pub struct Region {
    /// Which of the input's files (modulo 3; 2 is the unsealed one).
    pub file: u8,
    /// Guest-physical page number.
    pub gpa_page: u16,
    /// Size in pages (0 allowed).
    pub pages: u16,
    /// mmap offset in pages.
    pub offset_page: u16,
    /// Added to the offset (an unaligned offset unless 0).
    pub offset_bytes: u16,
    /// Use a VMM address unrelated to the guest address.
    pub odd_va: Option<u64>,
}

/// One operation of the hostile VMM.
// Each variant's comment says what its fields are: the fields are the
// message's, named as in the vhost-user protocol.
#[allow(missing_docs)]
#[derive(Debug, Arbitrary)]
pub enum Op {
    /// The usual opening: owner, features and protocol features, all
    /// offered ones acked.
    Handshake,
    /// `SET_FEATURES` with these bits.
    SetFeatures(u64),
    /// `SET_PROTOCOL_FEATURES` with these bits.
    SetProtocolFeatures(u64),
    /// `SET_MEM_TABLE` with these regions (at most 8 sent).
    MemTable(Vec<Region>),
    /// `SET_VRING_NUM`.
    VringNum { index: u8, num: u16 },
    /// `SET_VRING_ADDR` with guest addresses (VMM addresses sent).
    VringAddr {
        index: u8,
        desc: u32,
        avail: u32,
        used: u32,
        flags: u8,
    },
    /// `SET_VRING_BASE`.
    VringBase { index: u8, base: u16 },
    /// `GET_VRING_BASE` (a stop).
    GetVringBase { index: u8 },
    /// `SET_VRING_KICK` (with a new eventfd unless `no_fd`).
    VringKick { index: u8, no_fd: bool },
    /// `SET_VRING_CALL`.
    VringCall { index: u8, no_fd: bool },
    /// `SET_VRING_ENABLE`.
    VringEnable { index: u8, on: bool },
    /// Signals the kick eventfd of a queue.
    Kick { index: u8 },
    /// `GET_CONFIG` at any offset and size.
    GetConfig { offset: u16, size: u16, flags: u8 },
    /// `SET_CONFIG`.
    SetConfig { offset: u16, data: Vec<u8> },
    /// `RESET_DEVICE`.
    ResetDevice,
    /// `RESET_OWNER`.
    ResetOwner,
    /// `GET_QUEUE_NUM`.
    GetQueueNum,
    /// `GET_SHMEM_CONFIG`.
    GetShmemConfig,
    /// `SET_BACKEND_REQ_FD` with a socket the harness never answers on.
    BackendReqFd,
    /// Writes bytes into a file (rings, descriptors, requests).
    WriteRam {
        file: u8,
        offset: u32,
        data: Vec<u8>,
    },
    /// Shrinks (or grows) a file; the sealed ones refuse.
    Truncate { file: u8, len: u32 },
    /// Any message: request code, flags, body (no descriptors).
    Raw {
        request: u8,
        flags: u8,
        body: Vec<u8>,
    },
    /// Closes the connection and opens a new one.
    Reconnect,
}

/// The daemon of the process and its well-behaved VM.
struct World {
    daemon: TestDaemon,
    bystander: Mutex<TestVmm>,
    config: Vec<u8>,
    socket: PathBuf,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let daemon = TestDaemon::start(2).expect("start the daemon");
        let mut vm = daemon.connect(1).expect("connect VM 1");
        let config = vm.config_bytes(0, 96).expect("VM 1's configuration");
        let socket = daemon.socket(0).to_path_buf();
        World {
            daemon,
            bystander: Mutex::new(vm),
            config,
            socket,
        }
    })
}

/// A memfd of `size` bytes, sealed against shrinking if `sealed`.
fn memfd(size: u64, sealed: bool) -> File {
    // SAFETY: a valid NUL-terminated name; the call retains nothing.
    let fd = unsafe {
        libc::memfd_create(
            c"fuzz-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a new descriptor nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).expect("size a memfd");
    if sealed {
        // SAFETY: F_ADD_SEALS on our own descriptor; no memory is passed.
        let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(r, 0, "F_ADD_SEALS");
    }
    f
}

/// An eventfd.
fn eventfd() -> File {
    // SAFETY: creates a descriptor; no memory is passed.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd");
    // SAFETY: a new descriptor nothing else owns.
    unsafe { File::from_raw_fd(fd) }
}

/// Descriptors the process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The process's descriptors with what each refers to (`/proc/self/fd`),
/// to name the ones an input left behind.
fn fd_targets() -> std::collections::BTreeMap<u32, String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Default::default();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd = e.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        Some((fd, target.display().to_string()))
    })
    .collect()
}

/// For each of `fds`, the epoll descriptors of the process that watch it
/// (`tfd` lines of `/proc/self/fdinfo`): names the worker a leaked kick or
/// exit event belongs to.
fn watchers(
    all: &std::collections::BTreeMap<u32, String>,
    fds: impl Iterator<Item = u32>,
) -> Vec<(u32, Vec<u32>)> {
    let epolls: Vec<(u32, Vec<u32>)> = all
        .iter()
        .filter(|(_, t)| t.contains("eventpoll"))
        .map(|(&ep, _)| {
            let info =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{ep}")).unwrap_or_default();
            let watched = info
                .lines()
                .filter_map(|l| l.strip_prefix("tfd:"))
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect();
            (ep, watched)
        })
        .collect();
    fds.map(|fd| {
        let by = epolls
            .iter()
            .filter(|(_, w)| w.contains(&fd))
            .map(|(ep, _)| *ep)
            .collect();
        (fd, by)
    })
    .collect()
}

/// The mappings of the inputs' memory files (`/proc/self/maps`): tells a
/// descriptor kept with its guest RAM mapped from one kept alone.
fn ram_mappings() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("fuzz-ram"))
        .map(str::to_string)
        .collect()
}

/// The names of the process's threads.
fn threads() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

/// Waits until the daemon has counted `seen` connections of VM 0, the last
/// has ended and VM 0 holds no objects. VM 0's serving thread clears
/// `connected` only after it released everything of its connection (relay,
/// handler, vring workers and their exit events, memory table) and then
/// only waits for the next VMM: the descriptors are then those of between
/// two inputs. The number of `vring_worker` threads, which this harness
/// waited for instead, marks no such point: a connection's teardown starts
/// closing its descriptors while its worker lives (docs/fuzzing.md,
/// campaign of 2026-11-28, item 3).
fn released(w: &World, seen: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = w.daemon.stats(0);
        if st.connections >= seen && !st.connected && st.device.resources.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "VM 0 not released: {st:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One input's state.
struct Session<'w> {
    w: &'w World,
    conn: Option<UnixStream>,
    connections: u64,
    files: Vec<File>,
    kicks: Vec<Option<File>>,
    keep: Vec<File>,
    backend: Vec<UnixStream>,
}

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

impl Session<'_> {
    /// The connection, opening one if there is none (and the input may).
    fn conn(&mut self) -> Option<&UnixStream> {
        if self.conn.is_none() && self.connections < MAX_CONNECTIONS {
            let s = UnixStream::connect(&self.w.socket).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            self.connections += 1;
            self.conn = Some(s);
        }
        self.conn.as_ref()
    }

    /// Sends one message; returns its reply if `reply` (None if the daemon
    /// closed the connection, which it does for every message it refuses).
    fn send(
        &mut self,
        request: u32,
        flags: u32,
        body: &[u8],
        fds: &[RawFd],
        reply: bool,
    ) -> Option<Vec<u8>> {
        let size = u32::try_from(body.len()).ok()?;
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&le32(request));
        msg.extend_from_slice(&le32(flags));
        msg.extend_from_slice(&le32(size));
        msg.extend_from_slice(body);
        let c = self.conn()?;
        if c.send_with_fds(&[&msg[..]], fds).is_err() {
            self.conn = None;
            return None;
        }
        if !reply {
            return Some(Vec::new());
        }
        let mut hdr = [0u8; 12];
        let got = (&*c).read_exact(&mut hdr).ok().and_then(|()| {
            let len = u32::from_le_bytes(hdr[8..12].try_into().ok()?);
            let mut body = vec![0u8; usize::try_from(len).ok()?.min(1 << 16)];
            (&*c).read_exact(&mut body).ok()?;
            Some(body)
        });
        if got.is_none() {
            self.conn = None;
        }
        got
    }

    fn send_u64(&mut self, request: u32, v: u64) {
        self.send(request, 1, &le64(v), &[], false);
    }

    fn get_u64(&mut self, request: u32) -> Option<u64> {
        let r = self.send(request, 1, &[], &[], true)?;
        Some(u64::from_le_bytes(r.get(..8)?.try_into().ok()?))
    }

    fn vring_state(&mut self, request: u32, index: u8, num: u32, reply: bool) {
        let mut b = le32(u32::from(index % 4)).to_vec();
        b.extend_from_slice(&le32(num));
        self.send(request, 1, &b, &[], reply);
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Handshake => {
                self.send(3, 1, &[], &[], false);
                let f = self.get_u64(1).unwrap_or(0);
                let pf = self.get_u64(15).unwrap_or(0);
                // REPLY_ACK left out: replies would interleave with the
                // harness's reads.
                self.send_u64(16, pf & !0x8);
                self.send_u64(2, f);
            }
            Op::SetFeatures(f) => self.send_u64(2, *f),
            Op::SetProtocolFeatures(f) => self.send_u64(16, *f & !0x8),
            Op::MemTable(regions) => {
                let regions: Vec<&Region> = regions.iter().take(8).collect();
                let mut b = le32(u32::try_from(regions.len()).unwrap_or(0)).to_vec();
                b.extend_from_slice(&le32(0));
                let mut fds = Vec::new();
                for r in &regions {
                    let gpa = u64::from(r.gpa_page) << 12;
                    let off = (u64::from(r.offset_page) << 12) + u64::from(r.offset_bytes);
                    b.extend_from_slice(&le64(gpa));
                    b.extend_from_slice(&le64(u64::from(r.pages) << 12));
                    b.extend_from_slice(&le64(r.odd_va.unwrap_or(VMM_VA + gpa)));
                    b.extend_from_slice(&le64(off));
                    let file = &self.files[usize::from(r.file % 3)];
                    fds.push(file.as_raw_fd());
                }
                self.send(5, 1, &b, &fds, false);
            }
            Op::VringNum { index, num } => self.vring_state(8, *index, u32::from(*num), false),
            Op::VringBase { index, base } => self.vring_state(10, *index, u32::from(*base), false),
            Op::GetVringBase { index } => self.vring_state(11, *index, 0, true),
            Op::VringAddr {
                index,
                desc,
                avail,
                used,
                flags,
            } => {
                let mut b = le32(u32::from(index % 4)).to_vec();
                b.extend_from_slice(&le32(u32::from(*flags & 1)));
                for a in [desc, used, avail] {
                    b.extend_from_slice(&le64(VMM_VA + u64::from(*a)));
                }
                b.extend_from_slice(&le64(0));
                self.send(9, 1, &b, &[], false);
            }
            Op::VringKick { index, no_fd } | Op::VringCall { index, no_fd } => {
                let request = if matches!(op, Op::VringKick { .. }) {
                    12
                } else {
                    13
                };
                let q = u64::from(index % 4);
                if *no_fd {
                    self.send_u64(request, q | 0x100);
                } else {
                    let e = eventfd();
                    let mut b = le64(q).to_vec();
                    b.truncate(8);
                    self.send(request, 1, &b, &[e.as_raw_fd()], false);
                    if request == 12 {
                        if let Some(slot) = self.kicks.get_mut(usize::from(index % 3)) {
                            *slot = Some(e);
                        }
                    } else {
                        self.keep.push(e);
                    }
                }
            }
            Op::VringEnable { index, on } => self.vring_state(18, *index, u32::from(*on), false),
            Op::Kick { index } => {
                if let Some(Some(k)) = self.kicks.get(usize::from(index % 3)) {
                    let _ = (&*k).write(&le64(1));
                }
            }
            Op::GetConfig {
                offset,
                size,
                flags,
            } => {
                let size = u32::from(*size);
                let mut b = le32(u32::from(*offset)).to_vec();
                b.extend_from_slice(&le32(size));
                b.extend_from_slice(&le32(u32::from(*flags & 3)));
                b.resize(12 + usize::try_from(size).unwrap_or(0), 0);
                if let Some(r) = self.send(24, 1, &b, &[], true) {
                    check_config_reply(&self.w.config, *offset, size, &r);
                }
            }
            Op::SetConfig { offset, data } => {
                let mut b = le32(u32::from(*offset)).to_vec();
                b.extend_from_slice(&le32(u32::try_from(data.len()).unwrap_or(0)));
                b.extend_from_slice(&le32(0));
                b.extend_from_slice(data);
                self.send(25, 1, &b, &[], false);
            }
            Op::ResetDevice => {
                self.send(34, 1, &[], &[], false);
            }
            Op::ResetOwner => {
                self.send(4, 1, &[], &[], false);
            }
            Op::GetQueueNum => {
                self.get_u64(17);
            }
            Op::GetShmemConfig => {
                self.send(44, 1, &[], &[], true);
            }
            Op::BackendReqFd => {
                if let Ok((mine, theirs)) = UnixStream::pair() {
                    self.send(21, 1, &[], &[theirs.as_raw_fd()], false);
                    self.backend.push(mine);
                }
            }
            Op::WriteRam { file, offset, data } => {
                let f = &self.files[usize::from(file % 3)];
                let _ = f.write_at(data, u64::from(*offset) % FILE_SIZES[usize::from(file % 3)]);
            }
            Op::Truncate { file, len } => {
                let _ = self.files[usize::from(file % 3)].set_len(u64::from(*len));
            }
            Op::Raw {
                request,
                flags,
                body,
            } => {
                // Replies of a raw message are not read: the connection is
                // used for nothing else afterwards.
                self.send(u32::from(*request), u32::from(*flags), body, &[], false);
                self.conn = None;
            }
            Op::Reconnect => self.conn = None,
        }
    }
}

/// A `GET_CONFIG` reply: the header echoes the offset; a payload of the
/// requested size holds the configuration bytes (zero past them); any
/// other size is 0 (spec 19.5).
fn check_config_reply(config: &[u8], offset: u16, size: u32, reply: &[u8]) {
    assert!(
        reply.len() >= 12,
        "GET_CONFIG reply of {} bytes",
        reply.len()
    );
    let got_off = u32::from_le_bytes(reply[0..4].try_into().unwrap_or_default());
    let got_size = u32::from_le_bytes(reply[4..8].try_into().unwrap_or_default());
    assert_eq!(got_off, u32::from(offset), "GET_CONFIG reply offset");
    let payload = &reply[12..];
    if got_size == 0 {
        return;
    }
    assert_eq!(got_size, size, "GET_CONFIG reply size");
    assert_eq!(payload.len(), usize::try_from(size).unwrap_or(0));
    for (i, b) in payload.iter().enumerate() {
        let want = config.get(usize::from(offset) + i).copied().unwrap_or(0);
        assert_eq!(*b, want, "GET_CONFIG byte {}", usize::from(offset) + i);
    }
}

/// Runs one input given as bytes.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one decoded input.
pub fn run_input(input: &Input) {
    let w = world();
    let before = w.daemon.stats(0).connections;
    released(w, before);
    let fds_before = open_fds();
    let targets_before = fd_targets();
    {
        let mut s = Session {
            w,
            conn: None,
            connections: 0,
            files: FILE_SIZES
                .iter()
                .enumerate()
                .map(|(i, &size)| memfd(size, i != 2))
                .collect(),
            kicks: vec![None, None, None],
            keep: Vec::new(),
            backend: Vec::new(),
        };
        for op in input.ops.iter().take(MAX_OPS) {
            s.step(op);
        }
        let seen = before + s.connections;
        drop(s);
        // Every connection of the input ended and VM 0 is released.
        released(w, seen);
    }
    // The daemon holds no descriptor of the gone VMM (memfds, eventfds,
    // sockets); the engine lets go of its view of the memory at its next
    // pass.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() > fds_before {
        if Instant::now() >= deadline {
            let now = fd_targets();
            let new: Vec<_> = now
                .iter()
                .filter(|(fd, t)| targets_before.get(fd) != Some(t))
                .collect();
            panic!(
                "{} descriptors left behind by the VMM's connections; new or changed: {new:?}; \
                 epolls watching them: {:?}; threads: {:?}; guest RAM still mapped: {:?}",
                open_fds() - fds_before,
                watchers(&now, new.iter().map(|(fd, _)| **fd)),
                threads(),
                ram_mappings()
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // The other VM is unaffected.
    let mut vm = w.bystander.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        vm.config_bytes(0, 96).expect("VM 1's configuration"),
        w.config,
        "VM 1's configuration"
    );
    Verbs::new(&mut vm).query_port(1).expect("VM 1: QUERY_PORT");
}
