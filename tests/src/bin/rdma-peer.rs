//! One VM of a running `vhost-user-rdma` daemon (through the test VMM)
//! against a peer on another machine, reached over TCP: the counterpart of
//! `rdma-guest` for a VM that is not a QEMU guest. Run one on each side,
//! each on its own daemon (daemons that move RDMA traffic between
//! machines), or both against two sockets of one daemon (its software
//! RNIC) to test the programs locally.
//!
//! ```text
//! rdma-peer exchange --socket PATH --role server|client --tcp ADDR:PORT
//!           [--buf-len BYTES] [--pingpongs N] [--stream-writes N] [--rounds N]
//!           [--ack-timeout N] [--timeout-secs N]
//! rdma-peer pingpong --socket PATH (--server | --client HOST) [-p PORT]
//!           [-s SIZE] [-n ITERS] [-m MTU] [-r RX_DEPTH] [-c] [--timeout-secs N]
//!           [--no-verify]
//! rdma-peer ud --socket PATH --role server|client --tcp ADDR:PORT [-n N]
//!           [-s SIZE] [--qkey Q] [--timeout-secs N]
//! rdma-peer write-lat --socket PATH --role server|client --tcp ADDR:PORT
//!           [-s SIZE] [-n ITERS] [--uc] [--timeout-secs N]
//! rdma-peer write-bw --socket PATH --role server|client --tcp ADDR:PORT
//!           [-s SIZE] [-n ITERS] [--tx-depth D] [--timeout-secs N]
//! rdma-peer fill --socket PATH [--max N] [--hold-secs S]
//! rdma-peer rping-server --socket PATH --port P [--size S] [--count N]
//!           [--gid-index I | --src-ip IP] [--cm-response-ms T] [--cm-sends N]
//! rdma-peer rping-client --socket PATH --addr IP --port P [--count N]
//!           [--size S] [--verify] [--retry-rejected-secs T]
//!           [--gid-index I | --src-ip IP] [--cm-response-ms T] [--cm-sends N]
//! rdma-peer cm-probe --socket PATH --role server|client --tcp ADDR:PORT
//!           --port CM_PORT [--timeout-secs N]
//! rdma-peer move-out --socket PATH --peer-socket PATH --mgmt PATH [--name VM]
//!           --tcp ADDR:PORT [--rounds N] [--timeout-secs N]
//! rdma-peer move-in --socket PATH --mgmt PATH [--name VM] --tcp ADDR:PORT
//!           [--timeout-secs N]
//! ```
//!
//! - `exchange`: the checked two-peer exchange of
//!   `virtio_rdma_apps::exchange` (SEND/RECV, WRITE, WRITE with immediate,
//!   READ, atomics, every byte checked), its addresses swapped over a TCP
//!   connection (`TcpOob`): the server listens on ADDR:PORT and takes one
//!   connection, the client connects to it (retrying until the server
//!   listens). Ends with `rdma-peer: exchange ok`.
//! - `pingpong`: `virtio_rdma_apps::pingpong`, which speaks the protocol of
//!   rdma-core's `ibv_rc_pingpong`, so the other side may be that tool
//!   (with `-g`, a GID index: RoCE). Prints the tool's lines, then
//!   `rdma-peer: pingpong ok`.
//! - `ud`: `virtio_rdma_apps::ud`, N UD messages each way (sizes cycling
//!   up to SIZE or the ports' largest UD payload), every one checked at its
//!   receiver (status, length, source QPN, GRH, bytes). Ends with
//!   `rdma-peer: ud ok (N messages each way)`.
//! - `write-lat`, `write-bw`: `virtio_rdma_apps::perf`, `ib_write_lat`'s
//!   and `ib_write_bw`'s measurements over one RC connection (`write-lat
//!   --uc`: UC, the QP line then names `write_lat_uc`). Print
//!   `write_lat: size S iters N t_min X t_typical Y t_avg Z t_p99 W usec`
//!   and `write_bw: size S iters N MB/s X Mmsg/s Y` on both sides, then
//!   `rdma-peer: write-lat ok` / `rdma-peer: write-bw ok`.
//!
//! - `fill`: creates CQs (one entry each) until the device refuses one or
//!   N exist, prints `rdma-peer: fill: N CQs` and, if refused, `, then
//!   STATUS detail D`; keeps them S seconds, then `rdma-peer: fill ok`.
//!   A VM taking its whole share of the host (`max_host_mappings`, the
//!   NIC's CQs) while another goes on working.
//!
//! - `cm-probe`: `vhost_user_rdma_tests::cm_probe`: checks `F_GSI` and
//!   QP 1 in RTS (`rdma-peer: cm-probe: F_GSI offered, QP 1 in RTS`),
//!   then the client's GSI QP sends a CM REQ for rdma_cm port CM_PORT of
//!   the server's host, which the server's VM (whose daemon listens on it
//!   for it) receives and rejects; the client checks the REJ. Ends with
//!   `rdma-peer: cm-probe ok (...)` on both sides.
//!
//! - `rping-server`, `rping-client`: `virtio_rdma_apps::rping` over
//!   the VM's own CM (`virtio_rdma_apps::cm_agent`, IB CM on QP 1 as
//!   rdma_cm speaks it): rping's protocol, so that the other side may be
//!   the unmodified `rping -c`/`rping -s` on another host. The client
//!   prints rping's `ping data: ...` lines and ends with
//!   `rdma-peer: rping-client: N pings verified` (`--verify`); the server
//!   prints `server ping data: ...` and `rdma-peer: rping-server: N pings
//!   served` once the client disconnected.
//!
//! - `move-out`, `move-in`: `vhost_user_rdma_tests::vm_move`. On the
//!   source host, the moving VM (`--socket`) and its peer (`--peer-socket`)
//!   on one daemon run 5 checked rounds over RC; the daemon holds the
//!   peer's connection, the VM stops and its image (guest RAM, queues,
//!   driver objects, the device state its daemon saved) goes to `move-in`
//!   on the destination host, which brings it up on its daemon and sends
//!   back that daemon's move record; the source daemon re-points the
//!   peer, whose held WRITE lands. Then `--rounds` checked rounds across
//!   the hosts. The source prints `move-hosts: blackout ...` and
//!   `rdma-peer: move-out ok (...)`, the destination `rdma-peer: move-in
//!   ok (...)`. Both daemons run on the libibverbs transport.
//!
//! `exchange`, `ud`, `write-lat`, `write-bw` and `cm-probe` share the TCP set-up: the
//! server listens on ADDR:PORT and takes one connection, the client
//! connects to it (retrying until the server listens).
//!
//! Exit status 0 when everything passed; 1 with `rdma-peer: error: ...` on
//! standard error otherwise (2 for a bad command line).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use vhost_user_rdma_tests::cm_probe;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vm_move;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_apps::exchange::{self, Options, Role};
use virtio_rdma_apps::oob::TcpOob;
use virtio_rdma_apps::perf;
use virtio_rdma_apps::pingpong::{self, Side};
use virtio_rdma_apps::ud;
use virtio_rdma_apps::{cm_agent, rping};
use virtio_rdma_driver::Device;

type BoxError = Box<dyn std::error::Error>;

#[derive(Debug, Parser)]
#[command(
    name = "rdma-peer",
    about = "One VM of a vhost-user-rdma daemon against a peer on another machine (over TCP)"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, ClapArgs)]
struct Vm {
    /// The daemon's vhost-user socket of the VM to play.
    #[arg(long)]
    socket: PathBuf,
    /// Longest wait for the daemon's socket, the peer (TCP) and each RDMA
    /// step, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
}

/// The VM's CM (rping-server, rping-client).
#[derive(Debug, ClapArgs)]
struct CmArgs {
    /// Speak from this entry of the VM's GID table (0: the MAC-derived
    /// default GID; 1..: the VM's configured `gids`; on the verbs
    /// transport the host port's IPv4-mapped GID). Default: the first
    /// configured GID, else the default one.
    #[arg(long, conflicts_with = "src_ip")]
    gid_index: Option<u8>,
    /// Speak from the GID of this IP address (IPv4-mapped for IPv4), which
    /// must be in the VM's GID table.
    #[arg(long)]
    src_ip: Option<std::net::IpAddr>,
    /// How long a REQ, REP or DREQ waits for its answer before it is sent
    /// again, in milliseconds (rdma_cm's: 4300).
    #[arg(long, default_value_t = 4300)]
    cm_response_ms: u64,
    /// Sends of a REQ, REP or DREQ before the exchange is given up
    /// (rdma_cm's: 15).
    #[arg(long, default_value_t = 15)]
    cm_sends: u32,
}

impl CmArgs {
    /// rping's options for `dev`.
    fn options(
        &self,
        dev: &Device,
        size: usize,
        count: u64,
        verify: bool,
        timeout: Duration,
    ) -> Result<rping::Options, BoxError> {
        let gid_index = match (self.gid_index, self.src_ip) {
            (_, Some(ip)) => Some(cm_agent::gid_index_of(dev, ip)?),
            (i, None) => i,
        };
        Ok(rping::Options {
            size,
            count,
            verify,
            timeout,
            gid_index,
            timers: cm_agent::Timers {
                response_wait: Duration::from_millis(self.cm_response_ms.max(1)),
                max_sends: self.cm_sends.max(1),
            },
        })
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    Server,
    Client,
}

/// The side to play and the TCP connection to the peer.
#[derive(Debug, ClapArgs)]
struct Peer {
    /// Which side to play.
    #[arg(long, value_enum)]
    role: RoleArg,
    /// Server: the address to listen on; client: the server's address
    /// (host:port).
    #[arg(long)]
    tcp: String,
}

impl Peer {
    /// Listens (server) or connects (client), each for at most `timeout`.
    fn connect(&self, timeout: Duration) -> Result<(Role, TcpOob), BoxError> {
        let tcp = self.tcp.as_str();
        let r = match self.role {
            RoleArg::Server => (
                Role::Server,
                TcpOob::listen(tcp, timeout).map_err(|e| format!("listening on {tcp}: {e}"))?,
            ),
            RoleArg::Client => (
                Role::Client,
                TcpOob::connect(tcp, timeout).map_err(|e| format!("connecting to {tcp}: {e}"))?,
            ),
        };
        if let Ok(a) = r.1.peer_addr() {
            println!("rdma-peer: TCP peer {a}");
        }
        Ok(r)
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The checked two-peer exchange, addresses swapped over TCP.
    Exchange {
        #[command(flatten)]
        vm: Vm,
        /// Which side to play (the client drives the steps).
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Server: the address to listen on; client: the server's address
        /// (host:port).
        #[arg(long)]
        tcp: String,
        /// Bytes of the data buffer (the largest transfer).
        #[arg(long, default_value_t = 1 << 20)]
        buf_len: usize,
        /// SEND/RECV ping-pong round trips.
        #[arg(long, default_value_t = 200)]
        pingpongs: u32,
        /// RDMA WRITEs of the whole buffer in the throughput step.
        #[arg(long, default_value_t = 16)]
        stream_writes: u32,
        /// Repetitions of the checked transfers.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// The RC QPs' local ACK timeout exponent (4.096 µs × 2^N per try,
        /// 7 retries; 0: retry for ever).
        #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u32).range(0..=31))]
        ack_timeout: u32,
    },
    /// A ping-pong compatible with rdma-core's ibv_rc_pingpong.
    Pingpong {
        #[command(flatten)]
        vm: Vm,
        /// Listen for the client (as the tool without a host name).
        #[arg(long, conflicts_with = "client", required_unless_present = "client")]
        server: bool,
        /// Connect to the server on this host.
        #[arg(long, value_name = "HOST")]
        client: Option<String>,
        /// TCP port.
        #[arg(short = 'p', long, default_value_t = pingpong::DEFAULT_PORT)]
        port: u16,
        /// Bytes of each message (at least 1).
        #[arg(short = 's', long, default_value_t = 4096, value_parser = at_least_one)]
        size: usize,
        /// Messages each way.
        #[arg(short = 'n', long, default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        iters: u32,
        /// Path MTU: 256, 512, 1024, 2048 or 4096.
        #[arg(short = 'm', long, default_value_t = 1024, value_parser = mtu)]
        mtu: u32,
        /// Receives kept posted.
        #[arg(short = 'r', long, default_value_t = 500,
              value_parser = clap::value_parser!(u32).range(1..))]
        rx_depth: u32,
        /// Check only the length of received messages, not their bytes.
        #[arg(long)]
        no_verify: bool,
        /// Client: zero the first byte of each 4 KiB page sent, for a server
        /// running ibv_rc_pingpong -c (which checks those bytes).
        #[arg(short = 'c', long)]
        chk: bool,
    },
    /// UD messages both ways, every one checked; addresses swapped over TCP.
    Ud {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        peer: Peer,
        /// Messages each way.
        #[arg(short = 'n', long, default_value_t = 100,
              value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        /// The largest message (sizes cycle from 1 up to this or the ports'
        /// largest UD payload, whichever is smaller).
        #[arg(short = 's', long, default_value_t = 1024, value_parser = at_least_one)]
        size: usize,
        /// Our QP's Q_Key (decimal or 0x hex; bit 31 clear).
        #[arg(long, default_value = "0x11111111", value_parser = qkey)]
        qkey: u32,
        /// Rounds of asking the sender again for messages that never came,
        /// per window (UD may drop; 0: a lost message fails the run).
        #[arg(long, default_value_t = ud::DEFAULT_RESEND_ROUNDS)]
        resend_rounds: u32,
        /// Message numbers to leave out the first time they are sent, as if
        /// lost (tests the loss handling).
        #[arg(long, value_delimiter = ',', hide = true)]
        drop_first: Vec<u32>,
    },
    /// ib_write_lat's RDMA WRITE latency; addresses swapped over TCP.
    WriteLat {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        peer: Peer,
        /// Bytes of each WRITE.
        #[arg(short = 's', long, default_value_t = 64, value_parser = at_least_one)]
        size: usize,
        /// Measured round trips (after a few unmeasured ones).
        #[arg(short = 'n', long, default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        iters: u32,
        /// Over a UC QP instead of RC (the peer must say so too).
        #[arg(long)]
        uc: bool,
    },
    /// ib_write_bw's RDMA WRITE bandwidth; addresses swapped over TCP.
    WriteBw {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        peer: Peer,
        /// Bytes of each WRITE.
        #[arg(short = 's', long, default_value_t = 65536, value_parser = at_least_one)]
        size: usize,
        /// WRITEs in all.
        #[arg(short = 'n', long, default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        iters: u32,
        /// Client: WRITEs kept outstanding.
        #[arg(long, default_value_t = 128,
              value_parser = clap::value_parser!(u32).range(1..))]
        tx_depth: u32,
    },
    /// One CM exchange between the GSI QPs of two VMs (a REQ, the
    /// server's REJ): `F_GSI`, QP 1 in RTS, MADs across hosts.
    CmProbe {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        peer: Peer,
        /// The rdma_cm port (TCP port space) the REQ is for: the server's
        /// daemon listens on it for the server's VM (`cm_listen`).
        #[arg(long)]
        port: u16,
        /// Client: the server host's address the REQ goes to (default:
        /// the TCP server's).
        #[arg(long)]
        peer_addr: Option<std::net::IpAddr>,
    },
    /// `rping -s` on the VM: takes one rdma_cm connection on PORT through
    /// the VM's CM (QP 1) and serves rping's protocol until the client
    /// disconnects.
    RpingServer {
        #[command(flatten)]
        vm: Vm,
        /// The rdma_cm port (TCP port space) to accept on.
        #[arg(long)]
        port: u16,
        /// Buffer size (rping's -S).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Stop waiting for more after this many pings (0: until the
        /// client disconnects).
        #[arg(long, default_value_t = 0)]
        count: u64,
        #[command(flatten)]
        cm: CmArgs,
    },
    /// `rping -c` on the VM: connects through the VM's CM to an rdma_cm
    /// listener at ADDR:PORT (for instance a native `rping -s`) and pings.
    RpingClient {
        #[command(flatten)]
        vm: Vm,
        /// The server's IP address.
        #[arg(long)]
        addr: std::net::IpAddr,
        /// Its rdma_cm port (TCP port space).
        #[arg(long)]
        port: u16,
        /// Pings (rping's -C).
        #[arg(long, default_value_t = 10)]
        count: u64,
        /// Buffer size (rping's -S).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Compare each ping's data (rping's -V).
        #[arg(long)]
        verify: bool,
        /// Retry a connection the peer rejects for having no listener on
        /// the port, for up to this many seconds (a script that starts
        /// both sides at once).
        #[arg(long, default_value_t = 0)]
        retry_rejected_secs: u64,
        #[command(flatten)]
        cm: CmArgs,
    },
    /// CQs until the device refuses one: a VM taking its share.
    Fill {
        #[command(flatten)]
        vm: Vm,
        /// Stop at this many CQs.
        #[arg(long, default_value_t = 100_000)]
        max: u32,
        /// Seconds to keep them before exiting.
        #[arg(long, default_value_t = 0)]
        hold_secs: u64,
    },
    /// The source host of a VM that moves with its live RC connection to
    /// another host's daemon (`vhost_user_rdma_tests::vm_move`).
    MoveOut {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        at: MoveAt,
        /// The moving VM's peer's socket (the same daemon).
        #[arg(long)]
        peer_socket: PathBuf,
        /// Checked rounds after the move.
        #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// The destination host of `move-out`.
    MoveIn {
        #[command(flatten)]
        vm: Vm,
        #[command(flatten)]
        at: MoveAt,
    },
}

/// Where a moving VM is (`move-out`, `move-in`).
#[derive(Debug, ClapArgs)]
struct MoveAt {
    /// The daemon's management socket.
    #[arg(long)]
    mgmt: PathBuf,
    /// The VM's name in the daemon.
    #[arg(long, default_value = "vm0")]
    name: String,
    /// move-out: the destination's address; move-in: the address to
    /// listen on (host:port).
    #[arg(long)]
    tcp: String,
}

/// A size of at least one byte.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A path MTU ibv_rc_pingpong accepts for `-m`.
fn mtu(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|&m| pingpong::mtu_from_bytes(m).is_some())
        .ok_or_else(|| "must be 256, 512, 1024, 2048 or 4096".into())
}

/// A Q_Key: decimal or `0x` hex, bit 31 clear (a controlled Q_Key would
/// make the peer's sends use its own QP's Q_Key instead).
fn qkey(text: &str) -> Result<u32, String> {
    let v = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .map_err(|e| e.to_string())?;
    if v & (1 << 31) != 0 {
        return Err("bit 31 is set (a controlled Q_Key)".into());
    }
    Ok(v)
}

/// Connects to the daemon as one VM and opens its RDMA device.
fn open(socket: &Path, timeout: Duration) -> Result<Device, BoxError> {
    let vmm = TestVmm::connect(
        socket,
        VmmOptions {
            connect_timeout: timeout,
            ..VmmOptions::default()
        },
    )
    .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let dev = Device::open(VmmTransport::new(vmm)?)?;
    println!(
        "rdma-peer: VM on {}: GID {}",
        socket.display(),
        std::net::Ipv6Addr::from(dev.gid())
    );
    Ok(dev)
}

/// A VM's device and the TCP connection its peer's parameters come over.
struct Session {
    timeout: Duration,
    dev: Device,
    role: Role,
    oob: TcpOob,
}

fn session(vm: &Vm, peer: &Peer) -> Result<Session, BoxError> {
    let timeout = Duration::from_secs(vm.timeout_secs);
    let dev = open(&vm.socket, timeout)?;
    let (role, oob) = peer.connect(timeout)?;
    Ok(Session {
        timeout,
        dev,
        role,
        oob,
    })
}

fn run(args: Args) -> Result<(), BoxError> {
    let mut out = std::io::stdout();
    match args.cmd {
        Cmd::Exchange {
            vm,
            role,
            tcp,
            buf_len,
            pingpongs,
            stream_writes,
            rounds,
            ack_timeout,
        } => {
            let mut s = session(&vm, &Peer { role, tcp })?;
            let opts = Options {
                buf_len,
                pingpongs,
                stream_writes,
                rounds,
                timeout: s.timeout,
                ack_timeout,
            };
            exchange::run(&s.dev, s.role, &mut s.oob, &opts, &mut out)?;
            println!("rdma-peer: exchange ok");
        }
        Cmd::Pingpong {
            vm,
            server,
            client,
            port,
            size,
            iters,
            mtu,
            rx_depth,
            no_verify,
            chk,
        } => {
            let side = match (server, client) {
                (_, Some(host)) => Side::Client(host),
                (true, None) => Side::Server,
                (false, None) => return Err("give --server or --client HOST".into()),
            };
            let timeout = Duration::from_secs(vm.timeout_secs);
            let dev = open(&vm.socket, timeout)?;
            let opts = pingpong::Options {
                side,
                port,
                size,
                iters,
                mtu,
                rx_depth,
                timeout,
                verify: !no_verify,
                chk,
            };
            pingpong::run(&dev, &opts, &mut out)?;
            println!("rdma-peer: pingpong ok");
        }
        Cmd::Ud {
            vm,
            peer,
            count,
            size,
            qkey,
            resend_rounds,
            drop_first,
        } => {
            let mut s = session(&vm, &peer)?;
            let opts = ud::Options {
                count,
                size,
                qkey,
                timeout: s.timeout,
                resend_rounds,
                drop_first,
            };
            let sum = ud::run(&s.dev, s.role, &mut s.oob, &opts, &mut out)?;
            if sum.asked_again == 0 {
                println!("rdma-peer: ud ok ({count} messages each way)");
            } else {
                // Said by the receiver, which alone knows what was lost.
                println!(
                    "rdma-peer: ud ok ({count} messages each way; {} lost and sent again)",
                    sum.asked_again
                );
            }
        }
        Cmd::WriteLat {
            vm,
            peer,
            size,
            iters,
            uc,
        } => {
            let mut s = session(&vm, &peer)?;
            let opts = perf::Options {
                size,
                iters,
                tx_depth: 1,
                timeout: s.timeout,
                uc,
            };
            perf::write_lat(&s.dev, s.role, &mut s.oob, &opts, &mut out)?;
            println!("rdma-peer: write-lat ok");
        }
        Cmd::WriteBw {
            vm,
            peer,
            size,
            iters,
            tx_depth,
        } => {
            let mut s = session(&vm, &peer)?;
            let opts = perf::Options {
                size,
                iters,
                tx_depth,
                timeout: s.timeout,
                uc: false,
            };
            perf::write_bw(&s.dev, s.role, &mut s.oob, &opts, &mut out)?;
            println!("rdma-peer: write-bw ok");
        }
        Cmd::CmProbe {
            vm,
            peer,
            port,
            peer_addr,
        } => {
            let timeout = Duration::from_secs(vm.timeout_secs);
            let dev = open(&vm.socket, timeout)?;
            let (_, mut oob) = peer.connect(timeout)?;
            match peer.role {
                RoleArg::Server => cm_probe::server(&dev, port, &mut oob, timeout)?,
                RoleArg::Client => {
                    let ip = match peer_addr {
                        Some(ip) => ip,
                        None => std::net::ToSocketAddrs::to_socket_addrs(peer.tcp.as_str())?
                            .next()
                            .ok_or("the server's address does not resolve")?
                            .ip(),
                    };
                    cm_probe::client(&dev, ip, port, &mut oob, timeout)?;
                }
            }
        }
        Cmd::RpingServer {
            vm,
            port,
            size,
            count,
            cm,
        } => {
            let timeout = Duration::from_secs(vm.timeout_secs);
            let dev = open(&vm.socket, timeout)?;
            let opts = cm.options(&dev, size, count, false, timeout)?;
            rping::server(&dev, port, &opts)?;
        }
        Cmd::RpingClient {
            vm,
            addr,
            port,
            count,
            size,
            verify,
            retry_rejected_secs,
            cm,
        } => {
            let timeout = Duration::from_secs(vm.timeout_secs);
            let dev = open(&vm.socket, timeout)?;
            let opts = cm.options(&dev, size, count, verify, timeout)?;
            rping::client(
                &dev,
                addr,
                port,
                &opts,
                Duration::from_secs(retry_rejected_secs),
            )?;
        }
        Cmd::Fill { vm, max, hold_secs } => {
            let dev = open(&vm.socket, Duration::from_secs(vm.timeout_secs))?;
            let mut cqs = Vec::new();
            let mut refused = None;
            while cqs.len() < max as usize {
                match virtio_rdma_driver::cq::Cq::create(&dev, 1) {
                    Ok(cq) => cqs.push(cq),
                    Err(e) => {
                        refused = Some(e.status().ok_or(e)?);
                        break;
                    }
                }
            }
            match refused {
                Some((status, detail)) => println!(
                    "rdma-peer: fill: {} CQs, then {status:?} detail {detail}",
                    cqs.len()
                ),
                None => println!("rdma-peer: fill: {} CQs", cqs.len()),
            }
            let _ = out.flush();
            std::thread::sleep(Duration::from_secs(hold_secs));
            drop(cqs);
            println!("rdma-peer: fill ok");
        }
        Cmd::MoveOut {
            vm,
            at,
            peer_socket,
            rounds,
        } => {
            let o = vm_move::MoveOut {
                socket: vm.socket,
                peer_socket,
                mgmt: at.mgmt,
                vm: at.name,
                tcp: at.tcp,
                rounds,
                timeout: Duration::from_secs(vm.timeout_secs),
            };
            checked(|| vm_move::move_out(&o, &mut std::io::stdout()))?;
        }
        Cmd::MoveIn { vm, at } => {
            let o = vm_move::MoveIn {
                socket: vm.socket,
                mgmt: at.mgmt,
                vm: at.name,
                tcp: at.tcp,
                timeout: Duration::from_secs(vm.timeout_secs),
            };
            checked(|| vm_move::move_in(&o, &mut std::io::stdout()))?;
        }
    }
    let _ = out.flush();
    Ok(())
}

/// Runs `f`, whose test helpers panic on a failed check, turning a panic
/// into an error (its message was printed by the panic hook).
fn checked(f: impl FnOnce() -> Result<(), BoxError>) -> Result<(), BoxError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(format!("a check failed: {what}").into())
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("rdma-peer: error: {e}");
            ExitCode::FAILURE
        }
    }
}
