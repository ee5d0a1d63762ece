#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A hostile VMM (issue 26): the front-end of a vhost-user socket is not
//! trusted. Whatever one VMM sends on its socket, the daemon must survive
//! and every other VM must keep working. Each attack runs on VM 0 while
//! VMs 1 and 2 exchange RDMA traffic through the same daemon the whole
//! time; the traffic is checked to go on during and after the attack.
//!
//! Each test failed against the daemon as it was before its fix (see the
//! comment on each).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use vhost_user_rdma_tests::dp::{pattern, rc_pair, write_and_send_back, Buf, Vm};
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::verbs::Verbs;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions, F_VERSION_1};

/// The VM whose VMM attacks.
const HOSTILE: usize = 0;

/// A fake VMM address space base for the hostile tables (the daemon only
/// translates ring addresses through it).
const VMM_VA: u64 = 0x7f00_0000_0000;

/// Sets the flag when dropped (also when unwinding).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `attack` while VMs 1 and 2 exchange RDMA WRITEs and SENDs
/// through the daemon; fails unless their traffic went on during the
/// attack and still works after it.
fn with_bystanders(d: &TestDaemon, attack: impl FnOnce()) {
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, rounds) = (&stop, &rounds);
        let t = s.spawn(move || {
            let a = Vm::open(d, 1, VmmOptions::default());
            let b = Vm::open(d, 2, VmmOptions::default());
            let p = rc_pair(&a, &b);
            let src = Buf::new(&a, 4096);
            let dst = Buf::new(&b, 4096);
            ready_tx.send(()).unwrap();
            let mut seq = 0;
            while !stop.load(Ordering::Acquire) {
                seq += 1;
                write_and_send_back(&p, &src, &dst, &pattern(256, seq), 2048, seq);
                rounds.fetch_add(1, Ordering::AcqRel);
            }
        });
        // A failing attack must stop the traffic too, or the scope never
        // ends.
        let guard = StopOnDrop(stop);
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the bystander VMs start");
        attack();
        // The bystanders' traffic still flows after the attack.
        let after = rounds.load(Ordering::Acquire);
        let deadline = Instant::now() + Duration::from_secs(30);
        while rounds.load(Ordering::Acquire) < after + 20 {
            assert!(
                Instant::now() < deadline,
                "the other VMs' traffic stopped after the attack"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(guard);
        t.join().expect("the other VMs' traffic");
    });
}

/// After the attack: the hostile VM's socket serves a well-behaved VMM.
fn hostile_socket_still_serves(d: &TestDaemon) {
    d.wait_released(HOSTILE);
    let mut vm = d
        .connect(HOSTILE)
        .expect("a new VMM on the attacked socket");
    Verbs::new(&mut vm).query_port(1).expect("QUERY_PORT");
}

/// A memfd of `size` bytes, sealed against shrinking if `sealed`.
fn memfd(size: u64, sealed: bool) -> File {
    // SAFETY: a valid NUL-terminated name; the call retains nothing.
    let fd = unsafe {
        libc::memfd_create(
            c"hostile-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a new descriptor nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    if sealed {
        // SAFETY: F_ADD_SEALS on our descriptor; no memory passed.
        let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(r, 0, "F_ADD_SEALS");
    }
    f
}

/// A VMM that did the handshake (owner, features, protocol features with
/// `REPLY_ACK`, so that every request is acknowledged) and nothing else.
fn hostile_frontend(path: &Path) -> Frontend {
    hostile_frontend_of(path, 3)
}

/// [`hostile_frontend`] that may name `queues` queues (the device has 3).
fn hostile_frontend_of(path: &Path, queues: u64) -> Frontend {
    let mut fe = Frontend::connect(path, queues).unwrap();
    fe.set_owner().unwrap();
    let f = fe.get_features().unwrap();
    let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    assert_ne!(f & proto, 0);
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(
        pf & (VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK),
    )
    .unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    fe.set_features(F_VERSION_1 | proto).unwrap();
    fe
}

/// One region of `size` bytes at guest address 0 over `file` from offset
/// `offset`.
fn region(file: &File, offset: u64, size: u64) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: VMM_VA,
        mmap_offset: offset,
        mmap_handle: file.as_raw_fd(),
    }
}

/// Sets queue 0 up with its rings at guest address `gpa` (what makes the
/// back-end read the used ring there, spec 19.6).
fn place_ring(fe: &mut Frontend, gpa: u64) -> vhost::Result<()> {
    fe.set_vring_num(0, 256)?;
    let va = VMM_VA + gpa;
    let cfg = VringConfigData {
        queue_max_size: 256,
        queue_size: 256,
        flags: 0,
        desc_table_addr: va,
        used_ring_addr: va + 0x2000,
        avail_ring_addr: va + 0x1000,
        log_addr: None,
    };
    fe.set_vring_addr(0, &cfg)
}

/// Regression: a 1 GiB region over a 4 MiB memfd was accepted, and
/// `SET_VRING_ADDR` with a ring past the end of the file killed the daemon
/// (and every VM) with SIGBUS when the library read the used index. The
/// table must be refused at `SET_MEM_TABLE`.
#[test]
fn a_region_larger_than_its_file_is_refused() {
    let d = TestDaemon::start(3).unwrap();
    with_bystanders(&d, || {
        let file = memfd(4 << 20, true);
        let mut fe = hostile_frontend(d.socket(HOSTILE));
        let refused = fe.set_mem_table(&[region(&file, 0, 1 << 30)]);
        assert!(refused.is_err(), "SET_MEM_TABLE of a region past its file");
        // The ring past the end of the file: the connection is gone, or at
        // worst the request fails; the daemon lives.
        assert!(place_ring(&mut fe, 512 << 20).is_err());
        // Also with the offset: 4 MiB at offset 4 KiB ends past the file.
        let mut fe = hostile_frontend(d.socket(HOSTILE));
        let off = fe.set_mem_table(&[region(&file, 4096, 4 << 20)]);
        assert!(
            off.is_err(),
            "SET_MEM_TABLE of a region ending past its file"
        );
        assert!(place_ring(&mut fe, (4 << 20) - 0x2000).is_err());
    });
    hostile_socket_still_serves(&d);
}

/// Regression: a memfd without `F_SEAL_SHRINK` was accepted; its VMM could
/// truncate it later, and the daemon's next access to guest RAM raised
/// SIGBUS. It must be refused (unless the operator allows it).
#[test]
fn an_unsealed_memfd_is_refused() {
    let d = TestDaemon::start(3).unwrap();
    with_bystanders(&d, || {
        let file = memfd(4 << 20, false);
        let mut fe = hostile_frontend(d.socket(HOSTILE));
        let r = fe.set_mem_table(&[region(&file, 0, 4 << 20)]);
        assert!(r.is_err(), "SET_MEM_TABLE over an unsealed memfd");
        // What the refusal prevents: the VMM truncates its file, then
        // has the back-end touch a ring in it.
        file.set_len(0).unwrap();
        assert!(place_ring(&mut fe, 0x10_0000).is_err());
    });
    hostile_socket_still_serves(&d);
}

/// The file of a daemon's doorbell region (spec 18.7), as a VMM gets it
/// with `SHMEM_MAP`: the test's daemons run in this process, so it is one
/// of this process's descriptors.
fn doorbell_file() -> File {
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        let doorbells = target
            .to_string_lossy()
            .contains("memfd:vhost-user-rdma-doorbells");
        // Another test's daemon may close its own meanwhile: the next one.
        if let Some(f) = doorbells.then(|| File::open(e.path()).ok()).flatten() {
            return f;
        }
    }
    panic!("no doorbell region in this process");
}

/// Spec 19.6.1, 18.27, 18.28: the doorbell region never becomes guest RAM.
/// A VMM that hands the file it got with `SHMEM_MAP` back as RAM, so that
/// a page list, a fast registration or a local DMA key could name the
/// doorbell pages, is refused: the region's file cannot be sealed against
/// shrinking. Everything that names guest RAM is checked against the
/// memory table in force, so the region stays out of reach.
#[test]
fn the_doorbell_region_is_never_guest_ram() {
    let d = TestDaemon::start(3).unwrap();
    with_bystanders(&d, || {
        let file = doorbell_file();
        let size = file.metadata().unwrap().len();
        assert!(size >= 4096, "a doorbell region of {size} bytes");
        let fe = hostile_frontend(d.socket(HOSTILE));
        let r = fe.set_mem_table(&[region(&file, 0, size)]);
        assert!(r.is_err(), "SET_MEM_TABLE over the doorbell region");
    });
    hostile_socket_still_serves(&d);
}

/// The operator's opt-in: unsealed files are accepted.
#[test]
fn unsealed_memory_is_accepted_when_allowed() {
    let d = TestDaemon::with_config(1, |c| c.allow_unsealed_memory = true).unwrap();
    let file = memfd(4 << 20, false);
    let mut fe = hostile_frontend(d.socket(HOSTILE));
    fe.set_mem_table(&[region(&file, 0, 4 << 20)]).unwrap();
    place_ring(&mut fe, 0x10_0000).unwrap();
}

/// A sealed guest RAM file cannot shrink under the daemon's mapping, so
/// its VMM cannot make the daemon fault on it: the truncation fails and
/// the VM keeps working. (Before the fix the test VMM's memfd was not
/// sealed: the truncation succeeded, and the VM's next command killed the
/// daemon with SIGBUS.)
#[test]
fn a_sealed_file_cannot_shrink_under_the_daemon() {
    let d = TestDaemon::start(3).unwrap();
    let mut vm: Option<TestVmm> = None;
    with_bystanders(&d, || {
        let mut v = d.connect(HOSTILE).unwrap();
        Verbs::new(&mut v).query_port(1).expect("QUERY_PORT before");
        let file = v.mem().file();
        let size = file.metadata().unwrap().len();
        let e = file.set_len(4096).expect_err("shrinking sealed guest RAM");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        assert_eq!(file.metadata().unwrap().len(), size);
        // The daemon reads and writes the rings all over guest RAM.
        for _ in 0..50 {
            Verbs::new(&mut v).query_port(1).expect("QUERY_PORT after");
        }
        vm = Some(v);
    });
    assert!(vm.is_some());
}

/// The inode of `file`.
fn inode(file: &File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.metadata().unwrap().ino()
}

/// Lines of `/proc/self/maps` that map a memfd with inode `ino`.
fn memfd_mappings(ino: u64) -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(4).and_then(|i| i.parse::<u64>().ok()) == Some(ino)
                && f.get(5).is_some_and(|p| p.starts_with("/memfd:"))
        })
        .map(str::to_owned)
        .collect()
}

/// Open descriptors of this process on a memfd with inode `ino`.
fn memfd_descriptors(ino: u64) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            target.to_string_lossy().starts_with("/memfd:")
                && std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == ino)
        })
        .map(|e| e.path().display().to_string())
        .collect()
}

/// Regression: after a VMM disconnected, the daemon kept its guest RAM
/// mapped and the memfds open until the next VMM connected to that socket
/// (the memory stayed allocated for a VM that was gone). At the disconnect
/// the daemon must release every mapping and descriptor of that memory.
#[test]
fn a_disconnect_releases_the_guest_ram() {
    let d = TestDaemon::start(3).unwrap();
    with_bystanders(&d, || {
        let mut vm = d.connect(HOSTILE).unwrap();
        Verbs::new(&mut vm).query_port(1).expect("QUERY_PORT");
        let ino = inode(vm.mem().file());
        // The test VMM's mapping and the daemon's.
        assert!(memfd_mappings(ino).len() >= 2, "{:?}", memfd_mappings(ino));
        // An idle VM, as most are when their VMM goes: the engine parks it.
        std::thread::sleep(Duration::from_millis(500));
        vm.disconnect();
        d.wait_released(HOSTILE);
        // The test VMM lets go of its own mapping and descriptor: what is
        // left is the daemon's.
        drop(vm);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (maps, fds) = (memfd_mappings(ino), memfd_descriptors(ino));
            if maps.is_empty() && fds.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon still holds the guest RAM of a gone VMM: maps {maps:?}, fds {fds:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    hostile_socket_still_serves(&d);
}

/// The most a `GET_CONFIG` may read: a message body is at most 4096 bytes,
/// 12 of them the request's own fields.
const MAX_CONFIG_READ: u32 = 4096 - 12;

/// A raw vhost-user connection, for messages the front-end library will
/// not send.
struct RawVmm(std::os::unix::net::UnixStream);

impl RawVmm {
    /// Connects and negotiates `CONFIG` (no `REPLY_ACK`).
    fn open(path: &Path) -> RawVmm {
        let s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = RawVmm(s);
        c.send(3, &[]); // SET_OWNER
        let features = c.get_u64(1); // GET_FEATURES
        let protocol = c.get_u64(15); // GET_PROTOCOL_FEATURES
        assert_ne!(protocol & VhostUserProtocolFeatures::CONFIG.bits(), 0);
        let acked = protocol & !VhostUserProtocolFeatures::REPLY_ACK.bits();
        c.send(16, &acked.to_le_bytes()); // SET_PROTOCOL_FEATURES
        c.send(2, &features.to_le_bytes()); // SET_FEATURES
        c
    }

    fn send(&mut self, request: u32, body: &[u8]) {
        use std::io::Write;
        let mut m = Vec::with_capacity(12 + body.len());
        for v in [request, 1, u32::try_from(body.len()).unwrap()] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(body);
        self.0.write_all(&m).unwrap();
    }

    /// The reply's body, or `None` once the back-end closed the connection.
    fn reply(&mut self) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut hdr = [0u8; 12];
        self.0.read_exact(&mut hdr).ok()?;
        let len = u32::from_le_bytes(hdr[8..].try_into().unwrap());
        let mut body = vec![0u8; len as usize];
        self.0.read_exact(&mut body).ok()?;
        Some(body)
    }

    fn get_u64(&mut self, request: u32) -> u64 {
        self.send(request, &[]);
        let r = self.reply().expect("a reply");
        u64::from_le_bytes(r[..8].try_into().unwrap())
    }

    /// `GET_CONFIG` of `size` bytes at `offset` with a payload of
    /// `payload` bytes (the protocol wants `size`).
    fn get_config(&mut self, offset: u32, size: u32, payload: usize) -> Option<(u32, Vec<u8>)> {
        let mut b = Vec::new();
        for v in [offset, size, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.resize(12 + payload, 0);
        self.send(24, &b);
        let r = self.reply()?;
        let got = u32::from_le_bytes(r[4..8].try_into().unwrap());
        Some((got, r[12..].to_vec()))
    }
}

/// Spec 19.5, the whole range of `GET_CONFIG`: a read within the 96-byte
/// structure gets its bytes (zeros past byte 96); a read starting at or
/// past 96 and ending within 4096 gets a reply of `size` 0; a malformed
/// request — `size` 0 or over 4084 (a message body is at most 4096 bytes),
/// `offset + size` past 4096 or overflowing, a payload whose length is not
/// `size` — closes that
/// front-end's connection, and the daemon goes on serving every VM, that
/// socket included.
#[test]
fn get_config_over_the_whole_offset_and_size_range() {
    let d = TestDaemon::start(3).unwrap();
    let want = d.connect(1).unwrap().config_bytes(0, 96).unwrap();
    let path = d.socket(HOSTILE);
    with_bystanders(&d, || {
        let mut cases = Vec::new();
        for offset in [0u32, 1, 50, 95, 96, 97, 4000, 4095, 4096, u32::MAX] {
            for size in [0u32, 1, 46, 96, 4000, 4084, 4085, 4096, u32::MAX] {
                cases.push((offset, size, size.min(4096) as usize));
            }
        }
        // A payload that is not `size` bytes long.
        cases.push((0, 8, 4));
        cases.push((0, 8, 16));
        for (offset, size, payload) in cases {
            let mut c = RawVmm::open(path);
            let got = c.get_config(offset, size, payload);
            let well_formed = size != 0
                && size <= MAX_CONFIG_READ
                && offset.checked_add(size).is_some_and(|end| end <= 4096)
                && payload == size as usize;
            let case = format!("offset {offset}, size {size}, payload {payload}");
            match got {
                None => assert!(!well_formed, "{case}: connection closed"),
                Some((n, bytes)) => {
                    assert!(well_formed, "{case}: answered ({n} bytes)");
                    if offset < 96 {
                        let mut expect = want[offset as usize..].to_vec();
                        expect.resize(size as usize, 0);
                        assert_eq!((n, bytes), (size, expect), "{case}");
                    } else {
                        assert_eq!((n, bytes.len()), (0, 0), "{case}");
                    }
                }
            }
            drop(c);
            d.wait_released(HOSTILE);
        }
    });
    hostile_socket_still_serves(&d);
}

/// A VMM that did the handshake with `LOG_SHMFD` (dirty logging, spec
/// 20.4) and set a memory table of `ram` bytes over a sealed memfd.
fn logging_frontend(path: &Path, ram: &File, size: u64) -> Frontend {
    let mut fe = Frontend::connect(path, 3).unwrap();
    fe.set_owner().unwrap();
    let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    let f = fe.get_features().unwrap();
    assert_ne!(f & (1 << 26), 0, "VHOST_F_LOG_ALL offered: {f:#x}");
    let pf = fe.get_protocol_features().unwrap();
    assert!(pf.contains(VhostUserProtocolFeatures::LOG_SHMFD), "{pf:?}");
    fe.set_protocol_features(
        pf & (VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::LOG_SHMFD),
    )
    .unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    fe.set_features(F_VERSION_1 | proto).unwrap();
    fe.set_mem_table(&[region(ram, 0, size)]).unwrap();
    fe
}

/// `SET_LOG_BASE` of `size` bytes at `offset` of `log`.
fn set_log(fe: &Frontend, log: &File, size: u64, offset: u64) -> vhost::Result<()> {
    fe.set_log_base(
        0,
        Some(VhostUserDirtyLogRegion {
            mmap_size: size,
            mmap_offset: offset,
            mmap_handle: log.as_raw_fd(),
        }),
    )
}

/// Spec 20.4: a log the back-end could not use safely is refused (the
/// request fails and the connection closes, as for any refused message):
/// one with no bit for some page of RAM, one whose file can shrink (a
/// truncation would raise SIGBUS at the next mark), one announced longer
/// than its file (its end is past the file: SIGBUS at once), an empty
/// file, and an `mmap_size` of 0. The bystander VMs never notice, and the
/// socket serves a well-behaved VMM afterwards.
#[test]
fn bad_dirty_logs_are_refused() {
    let d = TestDaemon::start(3).unwrap();
    let ram_size = 4 << 20;
    // 4 MiB of RAM: 1,024 pages, 128 bytes of log.
    let need = 128;
    let cases: [(&str, File, u64); 5] = [
        ("too small for RAM", memfd(need - 8, true), need - 8),
        ("unsealed", memfd(4096, false), 4096),
        ("announced past its file", memfd(need, true), 64 << 10),
        ("an empty file", memfd(0, true), 4096),
        ("mmap_size 0", memfd(4096, true), 0),
    ];
    let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    with_bystanders(&d, || {
        for (what, log, size) in &cases {
            d.wait_released(HOSTILE);
            let ram = memfd(ram_size, true);
            let mut fe = logging_frontend(d.socket(HOSTILE), &ram, ram_size);
            let r = set_log(&fe, log, *size, 0);
            let next = fe.set_features(F_VERSION_1 | proto | (1 << 26));
            assert!(
                r.is_err() || next.is_err(),
                "{what}: the log was accepted and the connection goes on"
            );
            // The connection is gone: nothing more is served on it.
            assert!(place_ring(&mut fe, 0x10_0000).is_err(), "{what}");
        }
    });
    hostile_socket_still_serves(&d);
    // A good log on the same socket is accepted.
    d.wait_released(HOSTILE);
    let ram = memfd(ram_size, true);
    let fe = logging_frontend(d.socket(HOSTILE), &ram, ram_size);
    set_log(&fe, &memfd(need, true), need, 0).unwrap();
    fe.set_features(F_VERSION_1 | proto | (1 << 26)).unwrap();
}

/// Spec 20.4: while logging is on, a memory table with RAM past the end of
/// the log is refused (a VMM grows its log first); before logging is on,
/// it is accepted.
#[test]
fn memory_past_the_log_is_refused_while_logging() {
    let d = TestDaemon::start(1).unwrap();
    let small = 4 << 20;
    let big = 64 << 20;
    let ram = memfd(big, true);
    let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    // Logging off: any table goes.
    let fe = logging_frontend(d.socket(HOSTILE), &ram, small);
    set_log(&fe, &memfd(128, true), 128, 0).unwrap();
    fe.set_mem_table(&[region(&ram, 0, big)]).unwrap();
    drop(fe);
    d.wait_released(HOSTILE);
    let fe = logging_frontend(d.socket(HOSTILE), &ram, small);
    set_log(&fe, &memfd(128, true), 128, 0).unwrap();
    fe.set_features(F_VERSION_1 | proto | (1 << 26)).unwrap();
    assert!(
        fe.set_mem_table(&[region(&ram, 0, big)]).is_err(),
        "64 MiB of RAM with a log for 4 MiB"
    );
    hostile_socket_still_serves(&d);
}

/// The operator's opt-in covers log files too.
#[test]
fn an_unsealed_log_is_accepted_when_allowed() {
    let d = TestDaemon::with_config(1, |c| c.allow_unsealed_memory = true).unwrap();
    let ram = memfd(4 << 20, false);
    let fe = logging_frontend(d.socket(HOSTILE), &ram, 4 << 20);
    set_log(&fe, &memfd(4096, false), 4096, 0).unwrap();
}

/// Descriptors this process has open.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A VMM that sends call descriptors again and again: the daemon keeps
/// (for a later hand-over, spec 20.7) the last one of each queue only, so
/// its descriptors do not grow with the attack; a queue the device lacks
/// ends the connection.
#[test]
fn call_descriptors_sent_again_and_again_are_not_hoarded() {
    let d = TestDaemon::start(3).unwrap();
    with_bystanders(&d, || {
        let mut fe = hostile_frontend_of(d.socket(HOSTILE), 256);
        let call = |fe: &mut Frontend, q| {
            let fd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
            fe.set_vring_call(q, &fd)
        };
        for q in 0..3 {
            call(&mut fe, q).unwrap();
        }
        let before = open_descriptors();
        for i in 0..3000 {
            call(&mut fe, i % 3).unwrap();
        }
        let after = open_descriptors();
        assert!(
            after <= before + 4,
            "{} descriptors more after 3,000 call descriptors",
            after.saturating_sub(before)
        );
        assert!(call(&mut fe, 200).is_err(), "queue 200 accepted");
    });
    hostile_socket_still_serves(&d);
}
