//! `vhost-user-rdma`: serve virtio-rdma devices to VMMs over vhost-user.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use log::{error, info, warn};
use vhost_user_rdma::config::{ConfigError, LimitOverrides};
use vhost_user_rdma::handover::successor::Successor;
use vhost_user_rdma::logging::{self, LogFormat};
use vhost_user_rdma::mgmt::ctl::{self, CtlArgs};
use vhost_user_rdma::notify;
use vhost_user_rdma::{config_file, DaemonConfig, Limits};
use virtio_rdma_abi::config::{F_ATOMIC, F_GSI, F_SHMEM_DOORBELL, F_SRQ, F_UD};

/// vhost-user daemon giving VMs an RDMA device (virtio-rdma, device ID 42),
/// backed by the built-in software RNIC.
///
/// With --config, the file describes daemon settings, default limits,
/// tenants and VMs; the options here override it: --max-* replace the
/// file's [defaults.limits] (a VM's own [vm.limits] still win),
/// --ctrl-poll-us and --no-shmem-doorbell replace its [daemon] settings, and
/// each --socket-path adds a VM named vm<N> (N: its position among all VMs)
/// in the tenant "default".
///
/// `vhost-user-rdma ctl ...` is the client of a running daemon's
/// management socket (see `vhost-user-rdma ctl --help`).
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    /// A command instead of running the daemon.
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML); see docs/vhost-user-rdma.example.toml.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// vhost-user socket to serve; repeat for more VMs (one socket per VM).
    #[arg(short, long = "socket-path", required_unless_present = "config")]
    socket_path: Vec<PathBuf>,
    /// The per-VM limits (--max-qp and so on), from the list of limits.
    #[command(flatten)]
    limits: LimitOverrides,
    /// Number of RNIC engine threads (1..=64); a tenant's VMs share one.
    /// Replaces the file's [daemon] engine_threads.
    #[arg(long)]
    engine_threads: Option<usize>,
    /// Pin the engine threads to these CPUs, one each, in order (e.g.
    /// `2,3`). Replaces the file's [daemon] engine_cpus.
    #[arg(long, value_delimiter = ',')]
    engine_cpus: Option<Vec<usize>>,
    /// Microseconds a control-queue worker keeps polling for more requests
    /// after a batch before it sleeps (0 disables polling).
    #[arg(long)]
    ctrl_poll_us: Option<u64>,
    /// Do not offer the shared-memory doorbell mode (F_SHMEM_DOORBELL);
    /// every queue then uses doorbell records in guest RAM.
    #[arg(long)]
    no_shmem_doorbell: bool,
    /// The RNIC behind the devices: `soft`, the built-in software RNIC
    /// (RDMA between the VMs of this daemon), or `verbs`, a host RDMA
    /// device through libibverbs (RDMA across hosts); replaces the file's
    /// [daemon] rnic.
    #[arg(long, value_name = "KIND")]
    rnic: Option<vhost_user_rdma::rnic_objects::RnicKind>,
    /// `verbs`: the host RDMA device (default: the first one).
    #[arg(long, value_name = "NAME")]
    rnic_device: Option<String>,
    /// `verbs`: the device's port.
    #[arg(long, value_name = "PORT")]
    rnic_port: Option<u8>,
    /// `verbs`: a remote host's GID the VMs may name (repeat for more;
    /// added to every tenant's `remote_gids`).
    #[arg(long = "remote-gid", value_name = "GID", value_parser = parse_remote_gid)]
    remote_gids: Vec<[u8; 16]>,
    /// `verbs`: the index of the port's GID everything is sent from (on
    /// Linux soft-RoCE over IPv4: 1, the interface's address).
    #[arg(long, value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Do not offer UD queue pairs (F_UD): drivers see RC only.
    #[arg(long)]
    no_ud: bool,
    /// Do not offer shared receive queues (F_SRQ).
    #[arg(long)]
    no_srq: bool,
    /// Do not offer atomic operations (F_ATOMIC).
    #[arg(long)]
    no_atomics: bool,
    /// Do not offer the GSI QP and its management datagrams (F_GSI, ABI
    /// version 3; never offered without F_UD, nor on the verbs RNIC when
    /// the host's rdma_cm cannot be used).
    #[arg(long)]
    no_gsi: bool,
    /// Let drivers post without a memory fence while an engine thread polls
    /// (DB_FLAG_POLLING, spec 18.6; needs membarrier(2)). Off by default:
    /// it measured no gain here (docs/benchmarks.md).
    #[arg(long)]
    fence_elision: bool,
    /// Accept guest RAM whose file is not sealed against shrinking
    /// (hugetlbfs or tmpfs files of QEMU's memory-backend-file). RISK: a
    /// VMM that truncates such a file crashes the daemon and every VM it
    /// serves (SIGBUS); use only when every VMM is trusted (spec 19.6.1).
    #[arg(long)]
    allow_unsealed_memory: bool,
    /// Management socket (JSON API for `vhost-user-rdma ctl`); replaces
    /// the file's [daemon] mgmt_socket.
    #[arg(long, value_name = "PATH")]
    mgmt_socket: Option<PathBuf>,
    /// Hand-over socket, where a successor daemon (`--take-over`) takes
    /// every VM over for a live upgrade; replaces the file's [daemon]
    /// handover_socket.
    #[arg(long, value_name = "PATH")]
    handover_socket: Option<PathBuf>,
    /// Take every VM over from the daemon serving the hand-over socket,
    /// which exits once this one serves them (a live upgrade, spec 20.7);
    /// the configuration must name the same VMs and sockets.
    #[arg(long)]
    take_over: bool,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics);
    /// replaces the file's [daemon] metrics_listen.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Log line format; replaces the file's [daemon] log_format (default
    /// text). RUST_LOG filters either.
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Pair VM's RDMA port with the guest network interface whose MAC
    /// address is MAC (reported to the guest in the device configuration;
    /// e.g. `vm0=52:54:00:12:34:56`). VM is a VM name: vm<N> for the
    /// --socket-path VMs, or a [[vm]] of the file, whose `mac` it replaces.
    /// Repeat for more VMs.
    #[arg(long = "mac", value_name = "VM=MAC", value_parser = parse_vm_mac)]
    macs: Vec<VmMac>,
    /// `verbs`: listen for VM's connection manager on `rdma_cm` port PORT
    /// (TCP port space) of the host's address (e.g. `vm0=7174`): added to
    /// the VM's `cm_listen`. A port is one VM's. Repeat for more.
    #[arg(long = "cm-listen", value_name = "VM=PORT", value_parser = parse_vm_port)]
    cm_listen: Vec<(String, u16)>,
}

/// Parses `VM=PORT`.
fn parse_vm_port(text: &str) -> Result<(String, u16), String> {
    let (vm, port) = text
        .split_once('=')
        .ok_or_else(|| "expected VM=PORT, e.g. vm0=7174".to_string())?;
    if vm.is_empty() {
        return Err("the VM name before '=' is empty".into());
    }
    let port = port.parse::<u16>().map_err(|e| format!("{port:?}: {e}"))?;
    Ok((vm.into(), port))
}

/// A `--mac VM=MAC` option.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VmMac {
    vm: String,
    mac: [u8; 6],
}

/// Parses `VM=MAC` (the address checked as in the configuration file).
fn parse_remote_gid(text: &str) -> Result<[u8; 16], String> {
    config_file::parse_gid(text).ok_or_else(|| format!("{text:?} is not an IPv6 or IPv4 address"))
}

fn parse_vm_mac(text: &str) -> Result<VmMac, String> {
    let (vm, mac) = text
        .split_once('=')
        .ok_or_else(|| "expected VM=MAC, e.g. vm0=52:54:00:12:34:56".to_string())?;
    if vm.is_empty() {
        return Err("the VM name before '=' is empty".into());
    }
    let mac = vhost_user_rdma::config::parse_mac(mac).map_err(|e| format!("{mac:?} {e}"))?;
    Ok(VmMac { vm: vm.into(), mac })
}

/// Commands of the binary besides running the daemon.
#[derive(Debug, Subcommand)]
enum Command {
    /// Query or control a running daemon through its management socket.
    Ctl(CtlArgs),
    /// Show a host RDMA device as the libibverbs RNIC would use it:
    /// its port, the GID it sends from, and what guests would be offered.
    RnicInfo(RnicInfoArgs),
    /// Print the manual page (roff, section 8) of this program or of one
    /// of its commands to standard output: `vhost-user-rdma man | man -l -`.
    Man(ManArgs),
}

/// Arguments of `man`.
#[derive(Debug, clap::Args)]
struct ManArgs {
    /// The command whose page to print (`ctl`, `rnic-info`); the
    /// daemon's page without it. Pages are named `vhost-user-rdma-COMMAND`.
    command: Option<String>,
}

/// `man`: a manual page, from the same definitions as `--help`.
fn man_page(a: &ManArgs) -> ExitCode {
    use clap::CommandFactory;
    let root = Args::command().name("vhost-user-rdma");
    let page = match &a.command {
        None => Some(root),
        Some(name) => root
            .find_subcommand(name)
            .filter(|s| s.get_name() != "man")
            .map(|s| s.clone().name(format!("vhost-user-rdma-{name}"))),
    };
    let Some(page) = page else {
        eprintln!(
            "vhost-user-rdma man: no command {:?}",
            a.command.as_deref().unwrap_or("")
        );
        return ExitCode::from(2);
    };
    let mut out = Vec::new();
    let written = clap_mangen::Man::new(page)
        .section("8")
        .render(&mut out)
        .and_then(|()| std::io::Write::write_all(&mut std::io::stdout(), &out));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vhost-user-rdma man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Arguments of `rnic-info`.
#[derive(Debug, clap::Args)]
struct RnicInfoArgs {
    /// The RDMA device (default: the first one).
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// Its port.
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// The index of the GID to send from (RoCEv2 over IPv4: usually 1).
    #[arg(long, value_name = "N", default_value_t = 0)]
    gid_index: u32,
}

/// `rnic-info` in a build without the verbs RNIC: says so.
#[cfg(not(feature = "verbs"))]
fn rnic_info(_: &RnicInfoArgs) -> ExitCode {
    eprintln!(
        "rnic-info: this vhost-user-rdma was built without the verbs transport (cargo feature `verbs`)"
    );
    ExitCode::from(1)
}

/// `rnic-info`: prints the device, or why it cannot be used (exit status 1).
#[cfg(feature = "verbs")]
fn rnic_info(a: &RnicInfoArgs) -> ExitCode {
    use vhost_user_rdma::rnic::verbs::device::VerbsDevice;
    match VerbsDevice::open(a.device.as_deref(), a.port, a.gid_index) {
        Ok(d) => {
            let caps = d.caps();
            let (gid, index) = d.gid();
            println!("device: {} (firmware {})", d.name(), d.fw_ver());
            println!(
                "port: {} ({})",
                d.port(),
                if d.port_active() {
                    "active"
                } else {
                    "not active"
                }
            );
            println!(
                "gid: {} (index {index})",
                vhost_user_rdma::config::gid_text(gid)
            );
            println!(
                "offered: max_mtu {} ({} bytes), link {} Mbit/s, atomics {}, max_msg_size {}, local_ca_ack_delay {}",
                caps.max_mtu,
                128u64 << caps.max_mtu.min(5),
                caps.link_rate_mbps,
                if caps.atomics { "yes" } else { "no" },
                caps.max_msg_size,
                caps.local_ca_ack_delay
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rnic-info: {e}");
            ExitCode::from(1)
        }
    }
}

/// Why the command line and configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
enum ArgsError {
    #[error(transparent)]
    File(#[from] config_file::FileError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl TryFrom<Args> for DaemonConfig {
    type Error = ArgsError;

    fn try_from(a: Args) -> Result<Self, Self::Error> {
        daemon_config(a).map(|(config, _)| config)
    }
}

/// The daemon configuration of the command line and configuration file,
/// and the log format they ask for (`None`: not given).
fn daemon_config(a: Args) -> Result<(DaemonConfig, Option<LogFormat>), ArgsError> {
    let mut log_format = a.log_format;
    let cli = a.limits;
    let (mut config, limits) = match &a.config {
        Some(path) => {
            let loaded = config_file::load(path, &cli)?;
            log_format = log_format.or(loaded.log_format);
            (loaded.config, loaded.default_limits)
        }
        None => {
            let mut limits = Limits::default();
            cli.apply(&mut limits);
            (DaemonConfig::new(Vec::new()), limits)
        }
    };
    for socket in a.socket_path {
        config.add_default_vm(socket, limits);
    }
    for (i, m) in a.macs.iter().enumerate() {
        if a.macs[..i].iter().any(|o| o.vm == m.vm) {
            return Err(ConfigError::MacGivenTwice(m.vm.clone()).into());
        }
        let vm = config
            .vms
            .iter_mut()
            .find(|v| v.name == m.vm)
            .ok_or_else(|| ConfigError::MacForUnknownVm(m.vm.clone()))?;
        vm.mac = Some(m.mac);
    }
    for (name, port) in &a.cm_listen {
        let vm = config
            .vms
            .iter_mut()
            .find(|v| &v.name == name)
            .ok_or_else(|| ConfigError::CmListenForUnknownVm(name.clone()))?;
        vm.cm_listen.push(*port);
    }
    for (off, bit) in [
        (a.no_shmem_doorbell, F_SHMEM_DOORBELL),
        (a.no_ud, F_UD),
        (a.no_srq, F_SRQ),
        (a.no_atomics, F_ATOMIC),
        (a.no_gsi, F_GSI),
    ] {
        if off {
            config.device_features &= !bit;
        }
    }
    if a.fence_elision {
        config.fence_elision = true;
    }
    if a.allow_unsealed_memory {
        config.allow_unsealed_memory = true;
    }
    if let Some(kind) = a.rnic {
        config.rnic = kind;
    }
    if let Some(d) = &a.rnic_device {
        config.verbs.device = Some(d.clone());
    }
    if let Some(p) = a.rnic_port {
        config.verbs.port = p;
    }
    if let Some(g) = a.gid_index {
        config.verbs.gid_index = g;
    }
    if let Some(us) = a.ctrl_poll_us {
        config.ctrl_poll = std::time::Duration::from_micros(us);
    }
    if let Some(n) = a.engine_threads {
        config.engine_threads = n;
    }
    if let Some(cpus) = a.engine_cpus {
        config.engine_cpus = cpus;
    }
    if a.mgmt_socket.is_some() {
        config.mgmt_socket = a.mgmt_socket;
    }
    if a.handover_socket.is_some() {
        config.handover_socket = a.handover_socket;
    }
    if a.metrics_listen.is_some() {
        config.metrics_listen = a.metrics_listen;
    }
    for t in &mut config.tenants {
        for g in &a.remote_gids {
            if !t.remote_gids.contains(g) {
                t.remote_gids.push(*g);
            }
        }
    }
    config.validate()?;
    Ok((config, log_format))
}

/// Blocks SIGINT, SIGTERM and SIGUSR2 in the calling thread (and so in
/// every thread it spawns afterwards), so that [`wait_for_signal`] can take
/// them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value to initialize.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the calls
    // only write it (and the thread's signal mask).
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Waits for one of the signals in `set` (blocked by [`block_signals`]).
fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` is a valid sigset_t and `sig` a valid out pointer.
        let r = unsafe { libc::sigwait(set, &mut sig) };
        if r == 0 {
            return sig;
        }
    }
}

/// Descriptors a connected VM holds, about (its sockets, the relay's pair,
/// the rings' eventfds, its memory's files, epoll instances): 34 measured
/// with the test VMM; counted generously.
const FDS_PER_VM: u64 = 48;

/// Raises the soft descriptor limit to the hard one, as a daemon holding
/// a few dozen descriptors per VM must (the soft limit is often 1024), and
/// warns if even the hard limit is short for `vms` VMs: VMs past it fail
/// to connect with "Too many open files".
fn raise_descriptor_limit(vms: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    let need = u64::try_from(vms)
        .unwrap_or(u64::MAX)
        .saturating_mul(FDS_PER_VM)
        .saturating_add(256);
    if lim.rlim_cur < need {
        warn!(
            "the descriptor limit is {} and {vms} VMs need about {need}: VMs past about {} \
             will fail to connect (raise LimitNOFILE, or ulimit -n)",
            lim.rlim_cur,
            lim.rlim_cur.saturating_sub(256) / FDS_PER_VM
        );
    }
}

fn main() -> ExitCode {
    // Before anything else: the binary's path while it is still this one's.
    let successor = Successor::of_this_process();
    let args = Args::parse();
    match &args.command {
        Some(Command::Ctl(c)) => {
            let code = ctl::run(c, &mut std::io::stdout(), &mut std::io::stderr());
            return ExitCode::from(code);
        }
        Some(Command::RnicInfo(a)) => return rnic_info(a),
        Some(Command::Man(a)) => return man_page(a),
        None => {}
    }
    let cli_format = args.log_format;
    let take_over = args.take_over;
    let (config, format) = match daemon_config(args) {
        Ok(c) => c,
        Err(e) => {
            logging::init(cli_format.unwrap_or_default());
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    logging::init(format.unwrap_or_default());
    raise_descriptor_limit(config.vms.len());
    let signals = block_signals();
    let started = if take_over {
        vhost_user_rdma::Daemon::take_over(config)
    } else {
        vhost_user_rdma::Daemon::start(config)
    };
    match started {
        Ok(d) => {
            notify::ready(take_over);
            loop {
                let sig = wait_for_signal(&signals);
                if sig != libc::SIGUSR2 {
                    info!("signal {sig}: shutting down");
                    break;
                }
                // A live upgrade (`systemctl reload`); the hand-over socket's
                // thread exits this process once the successor serves.
                match (&successor, d.handover_socket()) {
                    (Ok(s), Some(_)) => {
                        if let Err(e) = s.start() {
                            error!("SIGUSR2: cannot start the successor: {e}");
                        }
                    }
                    (Err(e), _) => error!("SIGUSR2: this binary's path is unknown: {e}"),
                    (_, None) => warn!("SIGUSR2: no hand-over socket configured, no upgrade"),
                }
            }
            notify::stopping();
            d.shutdown();
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses_and_validates() {
        let a = Args::try_parse_from([
            "x",
            "-s",
            "/tmp/a.sock",
            "--socket-path",
            "/tmp/b.sock",
            "--max-qp",
            "8",
        ])
        .unwrap();
        let c = DaemonConfig::try_from(a).unwrap();
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[1].name, "vm1");
        assert_eq!(c.vms[1].tenant, "default");
        assert_eq!(c.vms[0].limits.max_qp, 8);
        assert_eq!(c.vms[1].limits.max_qp, 8);
        // Every limit has its option.
        let a = Args::try_parse_from([
            "x",
            "-s",
            "/tmp/a.sock",
            "--max-send-sge",
            "4",
            "--page-size-cap",
            "2101248",
            "--max-ctrl-outstanding",
            "5",
        ])
        .unwrap();
        let c = DaemonConfig::try_from(a).unwrap();
        let l = c.vms[0].limits;
        assert_eq!((l.max_send_sge, l.page_size_cap), (4, 0x20_1000));
        assert_eq!(
            (l.max_ctrl_outstanding, l.max_qp),
            (5, Limits::default().max_qp)
        );
        let a = Args::try_parse_from(["x", "-s", "/tmp/a.sock", "--max-cqe", "1000"]).unwrap();
        assert!(DaemonConfig::try_from(a).is_err());
        assert!(Args::try_parse_from(["x"]).is_err());
    }

    #[test]
    fn cm_listen_option_gives_vms_ports() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "-s", "/tmp/a.sock", "-s", "/tmp/b.sock"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let c = DaemonConfig::try_from(
            parse(&["--cm-listen", "vm1=7174", "--cm-listen", "vm1=4420"]).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (c.vms[0].cm_listen.len(), &c.vms[1].cm_listen[..]),
            (0, &[7174, 4420][..])
        );
        for bad in ["7174", "=7174", "vm0=70000", "vm0=x"] {
            assert!(parse(&["--cm-listen", bad]).is_err(), "{bad}");
        }
        let e = DaemonConfig::try_from(parse(&["--cm-listen", "vm7=7174"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("no VM named \"vm7\""), "{e}");
        let twice = parse(&["--cm-listen", "vm0=7174", "--cm-listen", "vm1=7174"]).unwrap();
        let e = DaemonConfig::try_from(twice).unwrap_err();
        assert!(e.to_string().contains("already VM \"vm0\"'s"), "{e}");
    }

    #[test]
    fn mac_option_pairs_vms_by_name() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "-s", "/tmp/a.sock", "-s", "/tmp/b.sock"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let c = DaemonConfig::try_from(
            parse(&[
                "--mac",
                "vm1=52:54:00:12:34:56",
                "--mac",
                "vm0=02:00:00:00:00:01",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(c.vms[0].mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(c.vms[1].mac, Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        let c = DaemonConfig::try_from(parse(&[]).unwrap()).unwrap();
        assert_eq!((c.vms[0].mac, c.vms[1].mac), (None, None));
        // Malformed values are refused by the parser, with the reason.
        for bad in [
            "52:54:00:12:34:56",
            "=52:54:00:12:34:56",
            "vm0=52:54:00:12:34",
            "vm0=00:00:00:00:00:00",
            "vm0=01:00:5e:00:00:01",
        ] {
            assert!(parse(&["--mac", bad]).is_err(), "{bad}");
        }
        let e = parse(&["--mac", "vm0=ff:ff:ff:ff:ff:ff"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a multicast address"), "{e}");
        // Unknown VM, and one VM given twice.
        let e = DaemonConfig::try_from(parse(&["--mac", "vm2=52:54:00:12:34:56"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--mac vm2=...: there is no VM named \"vm2\""),
            "{e}"
        );
        let e = DaemonConfig::try_from(
            parse(&[
                "--mac",
                "vm0=52:54:00:12:34:56",
                "--mac",
                "vm0=52:54:00:12:34:57",
            ])
            .unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "--mac is given more than once for VM \"vm0\"");
        // Two VMs of one tenant with one address.
        let e = DaemonConfig::try_from(
            parse(&[
                "--mac",
                "vm0=52:54:00:12:34:56",
                "--mac",
                "vm1=52:54:00:12:34:56",
            ])
            .unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("is already the MAC address of VM \"vm0\""),
            "{e}"
        );
    }

    #[test]
    fn ctl_subcommand_and_operations_flags() {
        // The daemon's flags are unchanged and take the new ones.
        let a = Args::try_parse_from([
            "x",
            "--socket-path",
            "/tmp/a.sock",
            "--mgmt-socket",
            "/tmp/m.sock",
            "--metrics-listen",
            "127.0.0.1:9842",
            "--log-format",
            "json",
        ])
        .unwrap();
        assert!(a.command.is_none());
        let (c, format) = daemon_config(a).unwrap();
        assert_eq!(c.vms.len(), 1);
        assert_eq!(
            c.mgmt_socket.as_deref(),
            Some(std::path::Path::new("/tmp/m.sock"))
        );
        assert_eq!(c.metrics_listen.map(|a| a.port()), Some(9842));
        assert_eq!(format, Some(LogFormat::Json));
        let (_, format) =
            daemon_config(Args::try_parse_from(["x", "-s", "/tmp/a.sock"]).unwrap()).unwrap();
        assert_eq!(format, None);
        assert!(Args::try_parse_from(["x", "-s", "/a", "--metrics-listen", "localhost"]).is_err());
        assert!(Args::try_parse_from(["x", "-s", "/a", "--log-format", "xml"]).is_err());
        // ctl needs no socket path, and does not mix with daemon flags.
        let a = Args::try_parse_from(["x", "ctl", "stats", "web", "--json"]).unwrap();
        match a.command {
            Some(Command::Ctl(c)) => {
                assert!(c.json);
                assert!(matches!(c.command, ctl::CtlCommand::Stats { ref vm } if vm == "web"));
            }
            other => panic!("not a ctl command: {other:?}"),
        }
        let a = Args::try_parse_from(["x", "rnic-info", "--device", "rxe0", "--gid-index", "1"])
            .unwrap();
        match a.command {
            Some(Command::RnicInfo(r)) => {
                assert_eq!(
                    (r.device.as_deref(), r.port, r.gid_index),
                    (Some("rxe0"), 1, 1)
                );
            }
            other => panic!("not rnic-info: {other:?}"),
        }
        assert!(Args::try_parse_from(["x", "-s", "/a", "ctl", "vms"]).is_err());
        assert!(Args::try_parse_from(["x", "ctl"]).is_err());
        assert!(Args::try_parse_from(["x", "ctl", "qos", "set", "web"]).is_err());
        assert!(Args::try_parse_from(["x", "ctl", "qos", "get", "web", "--tenant", "t"]).is_err());
        assert!(
            Args::try_parse_from(["x", "ctl", "qos", "set", "--tenant", "t", "--weight", "2"])
                .is_ok()
        );
    }

    #[test]
    fn config_file_with_cli_overrides() {
        let dir = std::env::temp_dir().join(format!("vur-main-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "[daemon]\nctrl_poll_us = 5\natomics = false\n[defaults.limits]\nmax_qp = 100\nmax_cq = 50\n\
             [[tenant]]\nname = \"blue\"\n\
             [[vm]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\ntenant = \"blue\"\n\
             [vm.limits]\nmax_cq = 7\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        // The file alone.
        let c = DaemonConfig::try_from(Args::try_parse_from(["x", "-c", p]).unwrap()).unwrap();
        assert_eq!(c.vms.len(), 1);
        assert_eq!(c.vms[0].limits.max_qp, 100);
        assert_eq!(c.ctrl_poll, std::time::Duration::from_micros(5));
        assert_eq!(c.vms[0].mac, None);
        // --mac names a VM of the file too.
        let a = Args::try_parse_from(["x", "-c", p, "--mac", "a=52:54:00:00:00:09"]).unwrap();
        let c = DaemonConfig::try_from(a).unwrap();
        assert_eq!(c.vms[0].mac, Some([0x52, 0x54, 0, 0, 0, 9]));
        // The command line overrides defaults and daemon settings and adds VMs.
        let a = Args::try_parse_from([
            "x",
            "--config",
            p,
            "-s",
            "/tmp/b.sock",
            "--max-qp",
            "8",
            "--max-cq",
            "9",
            "--ctrl-poll-us",
            "0",
            "--no-shmem-doorbell",
            "--no-ud",
            "--no-srq",
        ])
        .unwrap();
        let c = DaemonConfig::try_from(a).unwrap();
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[0].limits.max_qp, 8);
        assert_eq!(c.vms[0].limits.max_cq, 7);
        assert_eq!(c.vms[1].name, "vm1");
        assert_eq!(c.vms[1].tenant, "default");
        assert_eq!(c.vms[1].limits.max_qp, 8);
        assert_eq!(c.vms[1].limits.max_cq, 9);
        assert_eq!(c.ctrl_poll, std::time::Duration::ZERO);
        // Off from the file (atomics) and from the command line.
        assert_eq!(
            c.device_features & (F_SHMEM_DOORBELL | F_UD | F_SRQ | F_ATOMIC),
            0
        );
        // A socket given twice, once in the file and once on the command line.
        let a = Args::try_parse_from(["x", "-c", p, "-s", "/tmp/a.sock"]).unwrap();
        assert!(matches!(
            DaemonConfig::try_from(a),
            Err(ArgsError::Config(_))
        ));
        // A file without VMs and no --socket-path.
        std::fs::write(&path, "").unwrap();
        let a = Args::try_parse_from(["x", "-c", p]).unwrap();
        assert!(DaemonConfig::try_from(a).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
