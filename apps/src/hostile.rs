//! A misbehaving guest: it hands the device addresses outside its RAM, keys
//! it does not own and lengths past the end of its regions, tries to connect
//! to VMs of other tenants, and expects each to be refused with the status
//! the spec names, its own QPs to recover, and nothing else to happen. Then it keeps an RDMA WRITE stream running
//! between two of its own QPs until it is killed (or `busy` runs out), so a
//! test can kill it mid-transfer while other guests keep working.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_rdma_abi::ctrl::Status;
use virtio_rdma_abi::datapath::WcStatus;
use virtio_rdma_abi::mem::access;
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, DmaRegion, Mr, Payload, Pd, Qp, QpInit, RcConnect, SendFlags, SendOp,
    SendWr, Sge, WorkCompletion,
};

use crate::{Error, Result};

/// Line printed once the endless transfer is running (a test waits for it
/// before killing the guest).
pub const BUSY_MARKER: &str = "HOSTILE-BUSY";

/// Memory the driver can use, with a page list that lies: the pages it names
/// are not the memory behind the pointer but addresses far outside any
/// guest's RAM.
#[derive(Debug)]
struct LyingRegion {
    mem: Vec<u64>,
    pages: Vec<u64>,
}

// SAFETY: `as_ptr` is a live, 8-aligned heap allocation of `len()` bytes owned
// by the value and referenced nowhere else, which is all the driver relies on
// (it never dereferences guest-physical addresses). The page list names
// addresses beyond guest RAM on purpose: it only reaches the device, whose
// job is to refuse it; `pages().len()` matches `len()` as the contract asks.
unsafe impl DmaRegion for LyingRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.mem.len() * 8
    }
    fn page_shift(&self) -> u32 {
        12
    }
    fn first_page_offset(&self) -> u32 {
        0
    }
    fn pages(&self) -> &[u64] {
        &self.pages
    }
}

fn expect_status(what: &str, r: virtio_rdma_driver::Result<Mr>, want: Status) -> Result<String> {
    match r {
        Err(virtio_rdma_driver::Error::Command { status, .. }) if status == want => {
            Ok(format!("{what}: refused with {}", want.name()))
        }
        Err(e) => Err(Error::Check(format!(
            "{what}: expected {}, got {e}",
            want.name()
        ))),
        Ok(_) => Err(Error::Check(format!("{what}: the device accepted it"))),
    }
}

fn poll(cq: &Cq, timeout: Duration) -> Result<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout("a completion".into()));
        }
        std::thread::yield_now();
    }
}

/// Two QPs of this guest connected to each other.
struct Loop {
    cq: Arc<Cq>,
    a: Qp,
    b: Qp,
}

fn loopback(dev: &Device, pd: &Arc<Pd>) -> Result<Loop> {
    let cq = Cq::create(dev, 256)?;
    let a = Qp::create(pd, &QpInit::rc(&cq))?;
    let b = Qp::create(pd, &QpInit::rc(&cq))?;
    let rights = access::REMOTE_READ | access::REMOTE_WRITE;
    a.rc_connect(rights, &RcConnect::new(b.qpn(), dev.gid()))?;
    b.rc_connect(rights, &RcConnect::new(a.qpn(), dev.gid()))?;
    Ok(Loop { cq, a, b })
}

fn write_wr(sges: &[Sge], remote_addr: u64, rkey: u32) -> SendWr<'_> {
    SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite { remote_addr, rkey },
        payload: Payload::Sges(sges),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// Posts `wr` on a fresh loopback pair and expects a completion with
/// `want`; returns the line describing it.
fn expect_wc(
    dev: &Device,
    pd: &Arc<Pd>,
    what: &str,
    wr: &SendWr<'_>,
    want: WcStatus,
) -> Result<String> {
    let l = loopback(dev, pd)?;
    l.a.post_send(std::slice::from_ref(wr))?;
    let wc = poll(&l.cq, Duration::from_secs(30))?;
    let got = wc.status();
    if got != Some(want) {
        return Err(Error::Check(format!(
            "{what}: expected {}, got {:?}",
            want.name(),
            got.map(|s| s.name())
        )));
    }
    drop(l.b);
    Ok(format!("{what}: completed with {}", want.name()))
}

/// QP numbers tried per foreign GID.
const QPN_GUESSES: u32 = 16;

/// Tries to reach the VM with GID `gid` of another tenant: RC connections to
/// [`QPN_GUESSES`] guessed QP numbers, and an address handle. Each must be
/// refused with `DENIED` (the tenant policy, spec appendix A).
fn probe_foreign(dev: &Device, pd: &Arc<Pd>, gid: [u8; 16]) -> Result<Vec<String>> {
    let text = std::net::Ipv6Addr::from(gid);
    let cq = Cq::create(dev, 16)?;
    let mut seed = u32::from_le_bytes([gid[12], gid[13], gid[14], gid[15]]) | 1;
    for i in 0..QPN_GUESSES {
        // xorshift: guesses spread over the 24-bit QPN space.
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let qpn = (seed & 0x00ff_ffff).max(2);
        let qp = Qp::create(pd, &QpInit::rc(&cq))?;
        match qp.rc_connect(access::REMOTE_WRITE, &RcConnect::new(qpn, gid)) {
            Err(virtio_rdma_driver::Error::Command {
                status: Status::DENIED,
                ..
            }) => {}
            Err(e) => {
                return Err(Error::Check(format!(
                    "connect to {text} QPN {qpn:#x} (guess {i}): expected DENIED, got {e}"
                )))
            }
            Ok(()) => {
                return Err(Error::Check(format!(
                    "connect to {text} QPN {qpn:#x}: the device accepted it"
                )))
            }
        }
    }
    let mut lines = vec![format!(
        "RC connect to a foreign tenant's GID {text} ({QPN_GUESSES} QPN guesses): refused with DENIED"
    )];
    if dev.features() & virtio_rdma_abi::config::F_UD != 0 {
        match Ah::create(pd, &dev.av(gid)) {
            Err(virtio_rdma_driver::Error::Command {
                status: Status::DENIED,
                ..
            }) => {
                lines.push(format!(
                    "address handle for the foreign GID {text}: refused with DENIED"
                ));
            }
            Err(e) => {
                return Err(Error::Check(format!(
                    "address handle for {text}: expected DENIED, got {e}"
                )))
            }
            Ok(_) => {
                return Err(Error::Check(format!(
                    "address handle for {text}: the device accepted it"
                )))
            }
        }
    }
    Ok(lines)
}

/// Runs the misbehaviour (see the module documentation) — including
/// attempts to reach the VMs of other tenants whose GIDs are `foreign` —
/// then the endless transfer for `busy` (`None`: until killed).
pub fn run(
    dev: &Device,
    busy: Option<Duration>,
    foreign: &[[u8; 16]],
    out: &mut dyn Write,
) -> Result<u32> {
    let mut say = |s: &str| {
        let _ = writeln!(out, "hostile: {s}");
        let _ = out.flush();
    };
    let pd = Pd::alloc(dev)?;
    let mut checks = 0;

    // Memory registration naming pages outside guest RAM.
    for (what, gpa) in [
        ("MR over a page at 1 PiB", 1u64 << 50),
        ("MR over the last page of the address space", !0xfffu64),
    ] {
        let region = LyingRegion {
            mem: vec![0; 512],
            pages: vec![gpa],
        };
        let buf = Arc::new(DmaBuf::new(Box::new(region))?);
        say(&expect_status(
            what,
            Mr::register(&pd, buf, access::ALL),
            Status::BAD_ADDRESS,
        )?);
        checks += 1;
    }

    let buf = Arc::new(dev.alloc_dma(1 << 20, 4096)?);
    let mr = Mr::register(&pd, buf.clone(), access::ALL)?;
    let good = [mr.sge(0, 4096)?];

    // A local key that is not ours (the MR's key with other key bits).
    let bad_lkey = [Sge {
        addr: mr.iova(),
        length: 4096,
        lkey: mr.lkey() ^ 0x5a5a_0000,
    }];
    say(&expect_wc(
        dev,
        &pd,
        "WRITE from a foreign lkey",
        &write_wr(&bad_lkey, mr.iova(), mr.rkey()),
        WcStatus::LOC_PROT_ERR,
    )?);
    // Our own lkey, but a range running past the MR's end.
    let past = [Sge {
        addr: mr.iova() + (1 << 20) - 100,
        length: 4096,
        lkey: mr.lkey(),
    }];
    say(&expect_wc(
        dev,
        &pd,
        "WRITE from past the MR's end",
        &write_wr(&past, mr.iova(), mr.rkey()),
        WcStatus::LOC_PROT_ERR,
    )?);
    // A remote key nobody handed out.
    say(&expect_wc(
        dev,
        &pd,
        "WRITE to a guessed rkey",
        &write_wr(&good, mr.iova(), mr.rkey() ^ 0x0102_0300),
        WcStatus::REM_ACCESS_ERR,
    )?);
    // Remote range past the end of the target MR.
    say(&expect_wc(
        dev,
        &pd,
        "WRITE past the remote MR's end",
        &write_wr(&good, mr.iova() + (1 << 20) - 8, mr.rkey()),
        WcStatus::REM_ACCESS_ERR,
    )?);
    // Remote address below the MR.
    say(&expect_wc(
        dev,
        &pd,
        "WRITE below the remote MR",
        &write_wr(&good, mr.iova().wrapping_sub(4096), mr.rkey()),
        WcStatus::REM_ACCESS_ERR,
    )?);
    checks += 5;

    for &gid in foreign {
        for line in probe_foreign(dev, &pd, gid)? {
            say(&line);
            checks += 1;
        }
    }

    // And the device still works for us afterwards.
    let l = loopback(dev, &pd)?;
    let whole = [mr.sge(0, 1 << 19)?];
    l.a.post_send(&[write_wr(&whole, mr.iova() + (1 << 19), mr.rkey())])?;
    let wc = poll(&l.cq, Duration::from_secs(30))?;
    if !wc.is_success() {
        return Err(Error::Check(format!(
            "a correct WRITE after the bad ones failed: {wc:?}"
        )));
    }
    checks += 1;
    say("a correct WRITE afterwards: completed");

    // The endless transfer.
    let deadline = busy.map(|d| Instant::now() + d);
    let mut n = 0u64;
    loop {
        l.a.post_send(&[write_wr(&whole, mr.iova() + (1 << 19), mr.rkey())])?;
        let wc = poll(&l.cq, Duration::from_secs(30))?;
        if !wc.is_success() {
            return Err(Error::Check(format!("stream WRITE {n} failed: {wc:?}")));
        }
        n += 1;
        if n == 1 {
            say(&format!(
                "{checks} checks passed; {BUSY_MARKER}: streaming 512 KiB WRITEs until killed"
            ));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            say(&format!("{n} stream WRITEs done, stopping"));
            return Ok(checks);
        }
    }
}
