//! The guest program: runs the driver's programs on the virtio-rdma device of
//! a real (QEMU) guest, over the virtio-pci transport.
//!
//! ```text
//! rdma-guest info
//! rdma-guest exchange --role server --oob /dev/ttyS1
//! rdma-guest exchange --role client --oob /dev/ttyS1 --buf-mib 4
//! rdma-guest exchange --role client --stream-until-peer-reset
//! rdma-guest hostile [--busy-secs N] [--foreign-gid GID]...
//! ```
//!
//! Exit status 0 when every check passed; 1 with a message otherwise.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use virtio_rdma_apps::exchange::{self, Options, Role};
use virtio_rdma_apps::hostile;
use virtio_rdma_apps::oob::SerialOob;
use virtio_rdma_driver::pci::{PciOptions, PciTransport};
use virtio_rdma_driver::Device;

#[derive(Debug, Parser)]
#[command(about = "virtio-rdma guest programs over virtio-pci")]
struct Args {
    /// PCI address of the device (default: the first virtio-rdma function).
    #[arg(long, global = true)]
    pci: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    Server,
    Client,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Open the device and print what it offers.
    Info,
    /// The two-peer exchange (one guest runs the server, the other the client).
    Exchange {
        /// Which side to play.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Serial port cabled to the peer.
        #[arg(long, default_value = "/dev/ttyS1")]
        oob: PathBuf,
        /// Data buffer size in MiB (the largest transfer).
        #[arg(long, default_value_t = 4)]
        buf_mib: usize,
        /// Ping-pong round trips.
        #[arg(long, default_value_t = 200)]
        pingpongs: u32,
        /// Repetitions of the checked transfers.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// WRITEs of the whole buffer in the throughput step.
        #[arg(long, default_value_t = 16)]
        stream_writes: u32,
        /// Longest wait for the peer or a completion, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
        /// Client only: first stream RDMA WRITEs to the server until its
        /// machine is reset (the QPs must fail with QP_FATAL and all
        /// outstanding work complete with errors), then run the exchange
        /// with the server's next boot.
        #[arg(long)]
        stream_until_peer_reset: bool,
    },
    /// Misbehave, then stream WRITEs until killed.
    Hostile {
        /// Stop streaming after this many seconds (default: never).
        #[arg(long)]
        busy_secs: Option<u64>,
        /// GID (IPv6 or IPv4 text) of a VM of another tenant to try to
        /// reach; every attempt must be refused with DENIED. Repeatable.
        #[arg(long = "foreign-gid", value_parser = parse_gid)]
        foreign_gid: Vec<[u8; 16]>,
    },
}

/// A GID from IPv6 text, or IPv4 text for its IPv4-mapped GID.
fn parse_gid(text: &str) -> Result<[u8; 16], String> {
    match text.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(a)) => Ok(a.octets()),
        Ok(std::net::IpAddr::V4(a)) => Ok(a.to_ipv6_mapped().octets()),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

fn open(pci: Option<String>) -> Result<Device, Box<dyn std::error::Error>> {
    let t = PciTransport::open(&PciOptions {
        addr: pci,
        ..PciOptions::default()
    })?;
    println!("rdma-guest: virtio-rdma device at {}", t.pci_addr());
    Ok(Device::open(t)?)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout();
    match args.cmd {
        Cmd::Info => {
            let dev = open(args.pci)?;
            let c = dev.config();
            let port = dev.port_attr();
            println!(
                "rdma-guest: ABI v{}, features {:#x}, max_qp {}, max_mr {}, max_mr_bytes {} MiB",
                c.abi_version,
                dev.features(),
                c.max_qp,
                c.max_mr,
                c.max_mr_bytes >> 20
            );
            println!(
                "rdma-guest: port state {}, GID {:02x?}",
                port.state,
                dev.gid()
            );
        }
        Cmd::Exchange {
            role,
            oob,
            buf_mib,
            pingpongs,
            rounds,
            stream_writes,
            timeout_secs,
            stream_until_peer_reset,
        } => {
            let dev = open(args.pci)?;
            let mut oob = SerialOob::open(&oob)?;
            let opts = Options {
                buf_len: buf_mib.max(1) << 20,
                pingpongs,
                stream_writes,
                rounds,
                timeout: Duration::from_secs(timeout_secs),
                ..Options::default()
            };
            let role = match role {
                RoleArg::Server => Role::Server,
                RoleArg::Client => Role::Client,
            };
            if stream_until_peer_reset {
                if role != Role::Client {
                    return Err("--stream-until-peer-reset is for the client".into());
                }
                exchange::stream_until_peer_reset(&dev, &mut oob, &opts, &mut out)?;
            }
            exchange::run(&dev, role, &mut oob, &opts, &mut out)?;
        }
        Cmd::Hostile {
            busy_secs,
            foreign_gid,
        } => {
            let dev = open(args.pci)?;
            hostile::run(
                &dev,
                busy_secs.map(Duration::from_secs),
                &foreign_gid,
                &mut out,
            )?;
        }
    }
    let _ = out.flush();
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-guest: error: {e}");
            println!("rdma-guest: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
