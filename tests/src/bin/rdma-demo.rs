//! Demo client: two test VMs talk to a running `vhost-user-rdma` daemon over
//! its vhost-user sockets, set up RDMA resources, connect RC queue pairs to
//! each other, and show a hostile request being refused while the other VM
//! keeps working.
//!
//! Usage: `rdma-demo --socket VM0.sock --socket VM1.sock`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::verbs::{status_of, MrSpec, QpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vhost_user_rdma_tests::Result;
use virtio_rdma_abi::mem::{access, PageListMode};
use virtio_rdma_abi::qp::QpState;
use vm_memory::GuestAddress;

/// Drive two VMs' RDMA devices through a running daemon.
#[derive(Debug, Parser)]
struct Args {
    /// vhost-user socket of a VM (give two).
    #[arg(long = "socket", num_args = 1, required = true)]
    sockets: Vec<PathBuf>,
}

fn gid_text(gid: &[u8; 16]) -> String {
    if gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        return format!("::ffff:{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
    }
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

struct Vm {
    name: String,
    vmm: TestVmm,
    gid: [u8; 16],
    qp: u32,
    qpn: u32,
}

fn setup(name: &str, path: &PathBuf) -> Result<Vm> {
    let mut vmm = TestVmm::connect(path, VmmOptions::default())?;
    let cfg = vmm.config()?;
    println!(
        "{name}: connected to {} — device config: ABI v{}, max_qp {}, max_mr {}, max_mr_bytes {} GiB",
        path.display(),
        cfg.abi_version,
        cfg.max_qp,
        cfg.max_mr,
        cfg.max_mr_bytes >> 30
    );
    let mut v = Verbs::new(&mut vmm);
    let port = v.query_port(1)?;
    let gid = v.query_gid(1, 0)?.gid;
    println!(
        "{name}: port 1 state {} (4 = ACTIVE), MTU {} bytes, GID {}",
        port.state,
        port.max_ud_payload,
        gid_text(&gid)
    );
    let ctx = v.create_ctx()?;
    let pd = v.alloc_pd(ctx)?;
    let cq = v.create_cq(ctx, 256)?;
    // 1 MiB buffer in 256 scattered guest pages, registered for remote access.
    let pages = v.mem().alloc_pages(256, PAGE_SIZE)?;
    let mr = v.reg_mr(&MrSpec {
        mode: PageListMode::INDIRECT,
        ..MrSpec::new(
            pd,
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
            0x7f00_0000_0000,
            &pages,
        )
    })?;
    let qp = v.create_qp(&QpInit::rc(pd, cq))?;
    println!(
        "{name}: ctx {ctx:#x}, pd {pd:#x}, cq {cq:#x}; MR of 1 MiB over 256 scattered pages: lkey {:#010x} rkey {:#010x}; RC QP {:#x} = QPN {:#08x}",
        mr.lkey, mr.rkey, qp.handle, qp.qpn
    );
    drop(v);
    Ok(Vm {
        name: name.to_string(),
        vmm,
        gid,
        qp: qp.handle,
        qpn: qp.qpn,
    })
}

fn run(args: Args) -> Result<()> {
    let [p0, p1] = match args.sockets.as_slice() {
        [a, b] => [a.clone(), b.clone()],
        _ => {
            return Err(vhost_user_rdma_tests::Error::Backend(
                "give exactly two --socket paths".into(),
            ))
        }
    };
    let mut a = setup("VM0", &p0)?;
    let mut b = setup("VM1", &p1)?;

    let (peer_of_a, peer_of_b) = ((b.qpn, b.gid), (a.qpn, a.gid));
    for (me, peer) in [(&mut a, peer_of_a), (&mut b, peer_of_b)] {
        let mut v = Verbs::new(&mut me.vmm);
        v.connect_rc(me.qp, peer.0, peer.1)?;
        let q = v.query_qp(me.qp)?;
        println!(
            "{}: QP {:#08x} RESET -> INIT -> RTR -> RTS: state {} ({}), connected to QPN {:#08x} at {}",
            me.name,
            me.qpn,
            q.attr.qp_state,
            QpState::from_u32(q.attr.qp_state).map_or("?", QpState::name),
            q.attr.dest_qpn,
            gid_text(&q.attr.av.dgid)
        );
    }

    // A hostile guest: VM0 registers a page in the hole between its RAM
    // regions. The device refuses it; VM1 is unaffected.
    let hole = a.vmm.mem().hole_gpa();
    let mut v = Verbs::new(&mut a.vmm);
    let ctx = v.create_ctx()?;
    let pd = v.alloc_pd(ctx)?;
    let bad = [GuestAddress(hole)];
    let r = v.reg_mr(&MrSpec::new(pd, access::LOCAL_WRITE, 0, &bad));
    match status_of(&r) {
        Some((s, detail)) => println!(
            "VM0: REG_MR of guest-physical page {hole:#x} (not RAM) -> {} (detail {detail}: page index)",
            s.name()
        ),
        None => println!("VM0: REG_MR of a non-RAM page unexpectedly returned {r:?}"),
    }
    let q = Verbs::new(&mut b.vmm).query_qp(b.qp)?;
    println!(
        "VM1: still serving — QUERY_QP: state {}",
        QpState::from_u32(q.attr.qp_state).map_or("?", QpState::name)
    );
    a.vmm.disconnect();
    println!("VM0: disconnected (the daemon releases everything VM0 held)");
    let mut v = Verbs::new(&mut b.vmm);
    let ctx = v.create_ctx()?;
    println!("VM1: still serving — CREATE_CTX -> {ctx:#x}");
    println!("The data path (RDMA WRITE/READ/SEND between the VMs) arrives with the software RNIC engine.");
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
