//! `vhost-user-rdma`: serve virtio-rdma devices to VMMs over vhost-user.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use log::error;
use vhost_user_rdma::{DaemonConfig, Limits};
use virtio_rdma_abi::config::F_SHMEM_DOORBELL;

/// vhost-user daemon giving VMs an RDMA device (virtio-rdma, device ID 42),
/// backed by the built-in software RNIC.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// vhost-user socket to serve; repeat for more VMs (one socket per VM).
    #[arg(short, long = "socket-path", required = true)]
    socket_path: Vec<PathBuf>,
    /// Per-VM maximum number of contexts.
    #[arg(long)]
    max_ctx: Option<u32>,
    /// Per-VM maximum number of protection domains.
    #[arg(long)]
    max_pd: Option<u32>,
    /// Per-VM maximum number of completion queues.
    #[arg(long)]
    max_cq: Option<u32>,
    /// Per-VM maximum number of queue pairs.
    #[arg(long)]
    max_qp: Option<u32>,
    /// Per-VM maximum number of memory regions.
    #[arg(long)]
    max_mr: Option<u32>,
    /// Per-VM maximum number of shared receive queues.
    #[arg(long)]
    max_srq: Option<u32>,
    /// Per-VM maximum number of address handles.
    #[arg(long)]
    max_ah: Option<u32>,
    /// Maximum CQ depth (power of two).
    #[arg(long)]
    max_cqe: Option<u32>,
    /// Maximum send/receive queue depth (power of two).
    #[arg(long)]
    max_qp_wr: Option<u32>,
    /// Maximum SRQ depth (power of two).
    #[arg(long)]
    max_srq_wr: Option<u32>,
    /// Maximum bytes of one memory region.
    #[arg(long)]
    max_mr_size: Option<u64>,
    /// Per-VM maximum of registered bytes over all memory regions.
    #[arg(long)]
    max_mr_bytes: Option<u64>,
    /// Microseconds a control-queue worker keeps polling for more requests
    /// after a batch before it sleeps (0 disables polling).
    #[arg(long)]
    ctrl_poll_us: Option<u64>,
    /// Do not offer the shared-memory doorbell mode (F_SHMEM_DOORBELL);
    /// every queue then uses doorbell records in guest RAM.
    #[arg(long)]
    no_shmem_doorbell: bool,
}

impl TryFrom<Args> for DaemonConfig {
    type Error = vhost_user_rdma::config::ConfigError;

    fn try_from(a: Args) -> Result<Self, Self::Error> {
        let d = Limits::default();
        let limits = Limits {
            max_ctx: a.max_ctx.unwrap_or(d.max_ctx),
            max_pd: a.max_pd.unwrap_or(d.max_pd),
            max_cq: a.max_cq.unwrap_or(d.max_cq),
            max_qp: a.max_qp.unwrap_or(d.max_qp),
            max_mr: a.max_mr.unwrap_or(d.max_mr),
            max_srq: a.max_srq.unwrap_or(d.max_srq),
            max_ah: a.max_ah.unwrap_or(d.max_ah),
            max_cqe: a.max_cqe.unwrap_or(d.max_cqe),
            max_qp_wr: a.max_qp_wr.unwrap_or(d.max_qp_wr),
            max_srq_wr: a.max_srq_wr.unwrap_or(d.max_srq_wr),
            max_mr_size: a.max_mr_size.unwrap_or(d.max_mr_size),
            max_mr_bytes: a.max_mr_bytes.unwrap_or(d.max_mr_bytes),
            ..d
        };
        let mut config = DaemonConfig {
            limits,
            ..DaemonConfig::new(a.socket_path)
        };
        if a.no_shmem_doorbell {
            config.device_features &= !F_SHMEM_DOORBELL;
        }
        if let Some(us) = a.ctrl_poll_us {
            config.ctrl_poll = std::time::Duration::from_micros(us);
        }
        config.validate()?;
        Ok(config)
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let config = match DaemonConfig::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    match vhost_user_rdma::Daemon::start(config) {
        Ok(d) => {
            d.join();
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
        assert_eq!(c.sockets.len(), 2);
        assert_eq!(c.limits.max_qp, 8);
        let a = Args::try_parse_from(["x", "-s", "/tmp/a.sock", "--max-cqe", "1000"]).unwrap();
        assert!(DaemonConfig::try_from(a).is_err());
        assert!(Args::try_parse_from(["x"]).is_err());
    }
}
