//! Demo client: two test VMs talk to a running `vhost-user-rdma` daemon over
//! its vhost-user sockets, set up RDMA resources, connect RC queue pairs to
//! each other, and show a hostile request being refused while the other VM
//! keeps working.
//!
//! Usage: `rdma-demo --socket VM0.sock --socket VM1.sock`

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use vhost_user_rdma_tests::guest_mem::PAGE_SIZE;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::verbs::{status_of, MrSpec, QpInit as RawQpInit, Verbs};
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use vhost_user_rdma_tests::Result;
use virtio_rdma_abi::mem::{access, PageListMode};
use virtio_rdma_abi::qp::QpState;
use virtio_rdma_driver::{
    Cq, Device, DmaBuf, Mr, Pd, Qp, QpInit, RcConnect, RecvWr, SendOp, SendWr, WorkCompletion,
};
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
    let (_, gid) = v.own_gid()?;
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
    let qp = v.create_qp(&RawQpInit::rc(pd, cq))?;
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
    drop(b);
    Ok(())
}

/// A 1 MiB registered buffer on scattered guest pages.
struct Buf {
    dma: Arc<DmaBuf>,
    mr: Mr,
}

fn buffer(dev: &Device, pd: &Arc<Pd>) -> std::result::Result<Buf, Box<dyn Error>> {
    let dma = Arc::new(dev.alloc_dma(1 << 20, 8)?);
    let mr = Mr::register(pd, dma.clone(), access::ALL)?;
    Ok(Buf { dma, mr })
}

fn wait_one(cq: &Cq, what: &str) -> std::result::Result<WorkCompletion, Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll_one() {
            if !wc.is_success() {
                return Err(format!("{what}: completion status {:?}", wc.status()).into());
            }
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: no completion").into());
        }
        std::hint::spin_loop();
    }
}

/// RDMA between the two VMs through the reference guest driver: the
/// daemon's software RNIC copies straight from one guest's RAM into the
/// other's.
fn data_path(p0: &PathBuf, p1: &PathBuf) -> std::result::Result<(), Box<dyn Error>> {
    let open = |p: &PathBuf| -> std::result::Result<(Device, Arc<Pd>), Box<dyn Error>> {
        let t = VmmTransport::new(TestVmm::connect(p, VmmOptions::default())?)?;
        let dev = Device::open(t)?;
        let pd = Pd::alloc(&dev)?;
        Ok((dev, pd))
    };
    let (da, pda) = open(p0)?;
    let (db, pdb) = open(p1)?;
    let (ba, bb) = (buffer(&da, &pda)?, buffer(&db, &pdb)?);
    let (cqa, cqb) = (Cq::create(&da, 64)?, Cq::create(&db, 64)?);
    let (qa, qb) = (
        Qp::create(&pda, &QpInit::rc(&cqa))?,
        Qp::create(&pdb, &QpInit::rc(&cqb))?,
    );
    let remote = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
    qa.rc_connect(remote, &RcConnect::new(qb.qpn(), db.gid()))?;
    qb.rc_connect(remote, &RcConnect::new(qa.qpn(), da.gid()))?;
    println!(
        "\n== data path: reference guest driver, RC QP {:#08x} (VM0) <-> {:#08x} (VM1), 1 MiB buffers on scattered guest pages",
        qa.qpn(),
        qb.qpn()
    );

    // RDMA WRITE 1 MiB from VM0 into VM1.
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    ba.dma.write(0, &data)?;
    let sge = [ba.mr.sge(0, 1 << 20)?];
    let t = Instant::now();
    qa.post_send(&[SendWr::signaled(
        1,
        SendOp::RdmaWrite {
            remote_addr: bb.mr.iova(),
            rkey: bb.mr.rkey(),
        },
        &sge,
    )])?;
    let wc = wait_one(&cqa, "RDMA WRITE")?;
    let dt = t.elapsed();
    let same = bb.dma.to_vec(0, 1 << 20)? == data;
    println!(
        "VM0: RDMA WRITE of {} bytes into VM1 completed in {:?} ({:.1} GB/s); VM1's buffer {}",
        wc.byte_len,
        dt,
        f64::from(wc.byte_len) / dt.as_secs_f64() / 1e9,
        if same {
            "holds exactly the data"
        } else {
            "DIFFERS"
        }
    );
    if !same {
        return Err("RDMA WRITE data mismatch".into());
    }

    // RDMA READ 64 KiB back from VM1 into another part of VM0's buffer.
    bb.dma.write(0, b"VM1 was here")?;
    let sge = [ba.mr.sge(512 << 10, 64 << 10)?];
    qa.post_send(&[SendWr::signaled(
        2,
        SendOp::RdmaRead {
            remote_addr: bb.mr.iova(),
            rkey: bb.mr.rkey(),
        },
        &sge,
    )])?;
    let wc = wait_one(&cqa, "RDMA READ")?;
    let got = ba.dma.to_vec(512 << 10, 12)?;
    println!(
        "VM0: RDMA READ of {} bytes from VM1 -> {:?}",
        wc.byte_len,
        String::from_utf8_lossy(&got)
    );

    // SEND with immediate data from VM1 to VM0.
    let rsge = [ba.mr.sge(0, 4096)?];
    qa.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &rsge,
    }])?;
    let msg = b"hello VM0, this is VM1 over RDMA SEND";
    bb.dma.write(4096, msg)?;
    let ssge = [bb.mr.sge(4096, msg.len() as u32)?];
    qb.post_send(&[SendWr::signaled(
        3,
        SendOp::SendWithImm { imm: 0x1234_5678 },
        &ssge,
    )])?;
    wait_one(&cqb, "SEND")?;
    let wc = wait_one(&cqa, "RECV")?;
    let text = ba.dma.to_vec(0, wc.byte_len as usize)?;
    println!(
        "VM0: received {} bytes with immediate {} from QPN {:#08x}: {:?}",
        wc.byte_len,
        wc.imm()
            .map_or_else(|| "none".to_string(), |i| format!("{i:#x}")),
        wc.src_qpn,
        String::from_utf8_lossy(&text)
    );

    // Atomic fetch-and-add by VM1 on a counter in VM0's memory.
    ba.dma.write(8192, &41u64.to_le_bytes())?;
    let asge = [bb.mr.sge(8192, 8)?];
    qb.post_send(&[SendWr::signaled(
        4,
        SendOp::AtomicFetchAdd {
            remote_addr: ba.mr.iova() + 8192,
            rkey: ba.mr.rkey(),
            add: 1,
        },
        &asge,
    )])?;
    wait_one(&cqb, "FETCH_AND_ADD")?;
    let old = u64::from_le_bytes(
        bb.dma
            .to_vec(8192, 8)?
            .try_into()
            .map_err(|_| "short read")?,
    );
    let now = u64::from_le_bytes(
        ba.dma
            .to_vec(8192, 8)?
            .try_into()
            .map_err(|_| "short read")?,
    );
    println!("VM1: ATOMIC FETCH_AND_ADD on VM0's counter: fetched {old}, counter is now {now}");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let sockets = args.sockets.clone();
    if let Err(e) = run(args) {
        eprintln!("rdma-demo: {e}");
        return ExitCode::FAILURE;
    }
    if let [p0, p1] = sockets.as_slice() {
        if let Err(e) = data_path(p0, p1) {
            eprintln!("rdma-demo: data path: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
