//! The PCI function through Linux sysfs: finding the device, handing it to
//! `uio_pci_generic`, its configuration space, and BAR mappings.
//!
//! Everything here needs root (configuration space beyond the first 64
//! bytes, `driver_override`, mapping `resourceN`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

/// PCI vendor ID of virtio devices.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// PCI device ID of a modern (virtio 1.x) virtio-rdma function: 0x1040 plus
/// the virtio device ID 42.
pub const VIRTIO_RDMA_DEVICE: u16 = 0x1040 + 42;

/// Where Linux lists PCI functions.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// The driver the transport binds the function to.
const UIO_DRIVER: &str = "uio_pci_generic";
/// How long a bind may take to produce its `uio` node.
const BIND_TIMEOUT: Duration = Duration::from_secs(5);

/// PCI command register and its bits.
const COMMAND: u64 = 0x04;
const CMD_MEMORY: u16 = 1 << 1;
const CMD_BUS_MASTER: u16 = 1 << 2;
const CMD_INTX_DISABLE: u16 = 1 << 10;

fn read_hex(path: &Path) -> io::Result<u32> {
    let text = fs::read_to_string(path)?;
    let t = text.trim();
    u32::from_str_radix(t.trim_start_matches("0x"), 16).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {t:?}", path.display()),
        )
    })
}

/// Addresses (`0000:00:03.0`) of every function with the given IDs, sorted.
pub fn find_functions(vendor: u16, device: u16) -> io::Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(PCI_DEVICES)? {
        let entry = entry?;
        let dir = entry.path();
        let ids = (read_hex(&dir.join("vendor")), read_hex(&dir.join("device")));
        if let (Ok(v), Ok(d)) = ids {
            if v == u32::from(vendor) && d == u32::from(device) {
                found.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// A PCI function bound to `uio_pci_generic`.
#[derive(Debug)]
pub struct PciFunction {
    addr: String,
    dir: PathBuf,
    config: File,
    uio: File,
}

impl PciFunction {
    /// Takes the function `addr` from whatever driver has it (normally
    /// `virtio-pci`), binds it to `uio_pci_generic` (loading the module if
    /// needed) and opens its configuration space and `/dev/uioN`.
    pub fn claim(addr: &str) -> io::Result<PciFunction> {
        let dir = Path::new(PCI_DEVICES).join(addr);
        if !dir.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no PCI function {addr}"),
            ));
        }
        let current = fs::read_link(dir.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        if current.as_deref() != Some(UIO_DRIVER) {
            if current.is_some() {
                fs::write(dir.join("driver/unbind"), addr)?;
            }
            load_uio_module();
            // driver_override binds exactly this function, unlike new_id,
            // which would grab every device with these IDs.
            fs::write(dir.join("driver_override"), UIO_DRIVER)?;
            // drivers_probe fails with ENODEV-like errors when the module is
            // missing; the uio node check below reports that better.
            let _ = fs::write("/sys/bus/pci/drivers_probe", addr);
        }
        let uio = wait_for_uio(&dir)?;
        let config = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("config"))?;
        // Non-blocking: several threads may wait for the one interrupt line,
        // and only one of them gets the count.
        let uio = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(Path::new("/dev").join(uio))?;
        Ok(PciFunction {
            addr: addr.to_string(),
            dir,
            config,
            uio,
        })
    }

    /// The function's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Reads the configuration space (all the kernel lets us read).
    pub fn config_space(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        let mut n = 0;
        while n < buf.len() {
            match self.config.read_at(&mut buf[n..], n as u64)? {
                0 => break,
                k => n += k,
            }
        }
        buf.truncate(n);
        Ok(buf)
    }

    fn command(&self) -> io::Result<u16> {
        let mut b = [0u8; 2];
        self.config.read_exact_at(&mut b, COMMAND)?;
        Ok(u16::from_le_bytes(b))
    }

    fn set_command(&self, value: u16) -> io::Result<()> {
        self.config.write_all_at(&value.to_le_bytes(), COMMAND)
    }

    /// Enables memory decoding and bus mastering (DMA), which
    /// `uio_pci_generic` leaves to user space.
    pub fn enable_dma(&self) -> io::Result<()> {
        let cmd = self.command()?;
        self.set_command(cmd | CMD_MEMORY | CMD_BUS_MASTER)
    }

    /// Stops the function's DMA (on close, after the device was reset).
    pub fn disable_dma(&self) -> io::Result<()> {
        let cmd = self.command()?;
        self.set_command(cmd & !CMD_BUS_MASTER)
    }

    /// Unmasks INTx: `uio_pci_generic` masks the line in the command
    /// register each time it fires.
    pub fn unmask_intx(&self) -> io::Result<()> {
        let cmd = self.command()?;
        if cmd & CMD_INTX_DISABLE != 0 {
            self.set_command(cmd & !CMD_INTX_DISABLE)?;
        }
        Ok(())
    }

    /// Waits at most `timeout` for an interrupt. Returns whether one came
    /// (consumed; the caller acknowledges it at the device and unmasks).
    pub fn wait_interrupt(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.uio.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and
        // the count is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        if r == 0 || pfd.revents & libc::POLLIN == 0 {
            return Ok(false);
        }
        let mut count = [0u8; 4];
        // Reading consumes the event count; another waiter may have taken it
        // first (EAGAIN), which still means an interrupt came.
        match std::io::Read::read(&mut &self.uio, &mut count) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Maps BAR `bar` (the whole `resourceN` file).
    pub fn map_bar(&self, bar: u8) -> io::Result<BarMap> {
        BarMap::new(&self.dir.join(format!("resource{bar}")))
    }
}

fn load_uio_module() {
    if Path::new("/sys/bus/pci/drivers").join(UIO_DRIVER).exists() {
        return;
    }
    // modprobe comes from busybox or kmod; a failure shows up as "no uio
    // node" with the hint below.
    let _ = std::process::Command::new("modprobe")
        .arg(UIO_DRIVER)
        .status();
}

fn wait_for_uio(dir: &Path) -> io::Result<String> {
    let start = Instant::now();
    loop {
        if let Ok(mut it) = fs::read_dir(dir.join("uio")) {
            if let Some(Ok(e)) = it.next() {
                return Ok(e.file_name().to_string_lossy().into_owned());
            }
        }
        if start.elapsed() > BIND_TIMEOUT {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} did not bind to {UIO_DRIVER} (is the module available? modprobe {UIO_DRIVER})",
                    dir.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A BAR mapped into this process (device memory: accessed only with
/// volatile loads and stores of the width the register has).
#[derive(Debug)]
pub struct BarMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is process-wide device memory; `BarMap` hands out only
// raw pointers, and the registers are accessed with volatile operations,
// which are thread-agnostic.
unsafe impl Send for BarMap {}
// SAFETY: as for `Send`.
unsafe impl Sync for BarMap {}

impl BarMap {
    fn new(path: &Path) -> io::Result<BarMap> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "BAR too large"))?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is empty", path.display()),
            ));
        }
        // SAFETY: a new shared mapping of a sysfs resource file chosen by the
        // kernel replaces nothing; the result is checked.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(BarMap { base, len })
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of byte `offset`, if `offset .. offset + size` lies inside the
    /// BAR and is aligned to `align`.
    pub fn at(&self, offset: u64, size: u64, align: u64) -> Option<*mut u8> {
        let end = offset.checked_add(size)?;
        if end > self.len as u64 || offset % align != 0 {
            return None;
        }
        // SAFETY: offset < len, so the result stays inside the mapping.
        Some(unsafe { self.base.as_ptr().add(usize::try_from(offset).ok()?) })
    }
}

impl Drop for BarMap {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` and is unmapped once; every
        // register view borrowed from it is gone (they borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
