//! A VM's GSI QP (QP 1) as the guest-side CM programs use it: created,
//! moved to RTS, receive slots of a GRH and a MAD posted, MADs sent to
//! QP 1 at a GID and received with their GRH (spec 18.26).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ib_cm_wire::CmMessage;
use virtio_rdma_abi::config::F_GSI;
use virtio_rdma_abi::datapath::{UdGrh, UD_GRH_SIZE};
use virtio_rdma_abi::mem::access;
use virtio_rdma_abi::qp::{QpState, GSI_QPN, MAX_MAD_BYTES};
use virtio_rdma_driver::{
    Ah, Cq, Device, DmaBuf, Mr, Pd, Qp, QpCap, QpInit, RecvWr, SendWr, UdDest, WorkCompletion,
};

type BoxError = Box<dyn std::error::Error>;

/// Bytes of one receive slot: the GRH and a MAD.
const SLOT: usize = UD_GRH_SIZE as usize + MAX_MAD_BYTES as usize;
/// Receive slots posted on QP 1.
const SLOTS: usize = 8;
/// The `wr_id` of MAD sends (receives carry their slot).
const SEND_WR_ID: u64 = u64::MAX;

/// A VM's GSI QP in RTS with its buffers.
pub struct Gsi {
    /// The protection domain of QP 1 (for the application's QPs too).
    pub pd: Arc<Pd>,
    /// The completion queue of QP 1's both queues.
    pub cq: Arc<Cq>,
    qp: Qp,
    buf: Arc<DmaBuf>,
    mr: Mr,
    /// The GID table index MADs are sent from.
    sgid_index: u8,
    /// Receives completed while a send was waited for.
    pending: RefCell<VecDeque<WorkCompletion>>,
}

/// What one look at QP 1 found.
pub enum Received {
    /// A CM message with the GRH it came with and its MAD's transaction
    /// ID.
    Cm(UdGrh, u64, CmMessage),
    /// A receive that was not a CM MAD (dropped, its slot posted again).
    Dropped(String),
}

impl Gsi {
    /// [`Gsi::open_from`] the device handle's own GID.
    pub fn open(dev: &Device) -> Result<Gsi, BoxError> {
        Gsi::open_from(dev, dev.gid_index())
    }

    /// Checks `F_GSI`, creates QP 1, moves it to RTS and posts receives;
    /// MADs go out from GID table entry `sgid_index`.
    pub fn open_from(dev: &Device, sgid_index: u8) -> Result<Gsi, BoxError> {
        if dev.features() & F_GSI == 0 {
            return Err("the device does not offer F_GSI".into());
        }
        let pd = Pd::alloc(dev)?;
        let cq = Cq::create(dev, 64)?;
        let qp = Qp::create(
            &pd,
            &QpInit {
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: SLOTS as u32,
                    ..QpCap::default()
                },
                ..QpInit::gsi(&cq)
            },
        )?;
        if qp.qpn() != GSI_QPN {
            return Err(format!("the GSI QP is QP {:#x}, not 1", qp.qpn()).into());
        }
        qp.gsi_activate()?;
        let state = qp.query()?.attr.qp_state;
        if state != QpState::RTS as u32 {
            return Err(format!("the GSI QP is in state {state}, not RTS").into());
        }
        let buf = Arc::new(dev.alloc_dma(SLOT * (SLOTS + 1), 8)?);
        let mr = Mr::register(&pd, buf.clone(), access::LOCAL_WRITE)?;
        let g = Gsi {
            pd,
            cq,
            qp,
            buf,
            mr,
            sgid_index,
            pending: RefCell::new(VecDeque::new()),
        };
        for i in 0..SLOTS {
            g.recv(i)?;
        }
        Ok(g)
    }

    fn recv(&self, slot: usize) -> Result<(), BoxError> {
        let sge = self.mr.sge((slot * SLOT) as u64, SLOT as u32)?;
        self.qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: &[sge],
        }])?;
        Ok(())
    }

    /// Sends `mad` to QP 1 at `dgid` and waits for its completion. A
    /// receive completed meanwhile is kept for the next look.
    pub fn send(
        &self,
        dev: &Device,
        dgid: [u8; 16],
        mad: &[u8],
        timeout: Duration,
    ) -> Result<(), BoxError> {
        let mut av = dev.av(dgid);
        av.sgid_index = self.sgid_index;
        let ah = Ah::create(&self.pd, &av)?;
        let at = SLOT * SLOTS;
        self.buf.write(at, mad)?;
        let sge = [self.mr.sge(at as u64, mad.len() as u32)?];
        let mut w = SendWr::send(SEND_WR_ID, &sge);
        w.ud = Some(UdDest::gsi(&ah));
        self.qp.post_send(&[w])?;
        let deadline = Instant::now() + timeout;
        loop {
            let wc = self.poll_until(deadline)?;
            if wc.wr_id != SEND_WR_ID {
                self.pending_push(wc);
                continue;
            }
            if !wc.is_success() {
                return Err(format!("the MAD's send completed {wc:?}").into());
            }
            return Ok(());
        }
    }

    fn pending_push(&self, wc: WorkCompletion) {
        self.pending.borrow_mut().push_back(wc);
    }

    fn poll_once(&self) -> Option<WorkCompletion> {
        if let Some(wc) = self.pending.borrow_mut().pop_front() {
            return Some(wc);
        }
        let mut wc = [WorkCompletion::default(); 1];
        (self.cq.poll(&mut wc) == 1).then_some(wc[0])
    }

    /// The CQ's next completion before `deadline`, past those kept in
    /// `pending` (which a send's wait would otherwise take back forever).
    fn poll_until(&self, deadline: Instant) -> Result<WorkCompletion, BoxError> {
        loop {
            let mut wc = [WorkCompletion::default(); 1];
            if self.cq.poll(&mut wc) == 1 {
                return Ok(wc[0]);
            }
            if Instant::now() >= deadline {
                return Err("no completion in time".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The next receive of QP 1 before `deadline`, `None` if none came.
    pub fn receive_until(&self, deadline: Instant) -> Result<Option<Received>, BoxError> {
        loop {
            if let Some(wc) = self.poll_once() {
                if wc.wr_id == SEND_WR_ID {
                    // A send's completion nobody waits for any more.
                    continue;
                }
                return self.take(wc).map(Some);
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Reads the receive of `wc`, posts its slot again, parses the MAD.
    fn take(&self, wc: WorkCompletion) -> Result<Received, BoxError> {
        if !wc.is_success() {
            return Err(format!("QP 1's receive failed: {wc:?}").into());
        }
        let slot = usize::try_from(wc.wr_id)?;
        if slot >= SLOTS {
            return Err(format!("a receive of an unknown slot: {wc:?}").into());
        }
        let mut raw = vec![0u8; SLOT];
        self.buf.read(slot * SLOT, &mut raw)?;
        self.recv(slot)?;
        if !wc.has_grh() || wc.src_qpn != GSI_QPN || wc.qpn != GSI_QPN {
            return Ok(Received::Dropped(format!(
                "not a MAD receive on QP 1: {wc:?}"
            )));
        }
        let Some(grh) = raw
            .get(..UD_GRH_SIZE as usize)
            .and_then(|g| <[u8; UD_GRH_SIZE as usize]>::try_from(g).ok())
            .and_then(|g| UdGrh::parse(&g))
        else {
            return Ok(Received::Dropped("no GRH".into()));
        };
        let len = usize::try_from(wc.byte_len)
            .unwrap_or(0)
            .saturating_sub(UD_GRH_SIZE as usize)
            .min(MAX_MAD_BYTES as usize);
        let mad = raw.get(UD_GRH_SIZE as usize..UD_GRH_SIZE as usize + len);
        match mad.map(CmMessage::parse) {
            Some(Ok((hdr, msg))) => Ok(Received::Cm(grh, hdr.tid, msg)),
            Some(Err(e)) => Ok(Received::Dropped(format!("not a CM message: {e}"))),
            None => Ok(Received::Dropped("a short receive".into())),
        }
    }

    /// The next CM MAD QP 1 receives within `timeout`: its GRH and the
    /// message; anything else is an error.
    pub fn receive(&self, timeout: Duration) -> Result<(UdGrh, CmMessage), BoxError> {
        match self.receive_until(Instant::now() + timeout)? {
            Some(Received::Cm(grh, _, msg)) => Ok((grh, msg)),
            Some(Received::Dropped(why)) => Err(why.into()),
            None => Err(format!("no MAD within {timeout:?}").into()),
        }
    }
}

/// The IP address of a RoCEv2 GID (IPv4 for an IPv4-mapped one).
pub fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The GID of an IP address (IPv4-mapped for IPv4).
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}
