//! Completion queues: polling by owner phase, arming, completion events.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use virtio_rdma_abi::config::F_RESIZE;
use virtio_rdma_abi::ctrl::Opcode;
use virtio_rdma_abi::datapath::{cqe_owner, Cqe, ARM_NEXT, ARM_SOLICITED, CQE_OWNER_OFFSET};
use virtio_rdma_abi::mem::CQE_SIZE;
use virtio_rdma_abi::verbs::{CqHandleReq, CqHandleResp, CreateCqReq, ResizeCqReq};
use virtio_rdma_abi::{Field, Wire};

use crate::device::{outcome_unknown, Device};
use crate::dma::DmaBuf;
use crate::doorbell::off;
#[cfg(test)]
use crate::doorbell::DoorbellRecord;
use crate::error::{Error, Result};
use crate::image::CqImage;
use crate::page_list;
use crate::ring::QueueMem;
use crate::wr::WorkCompletion;

/// Arm sequence numbers are 30 bits (`arm = seq << 2 | kind`).
const ARM_SEQ_MASK: u32 = (1 << 30) - 1;

#[derive(Debug, Default)]
struct CqState {
    /// Consumer index: the next CQE to poll.
    ci: u32,
    /// Sequence number of the last arm request written.
    arm_seq: u32,
    /// Number of entries.
    depth: u32,
    /// The ring `RESIZE_CQ` gave the CQ last, if any (the first one is
    /// `Cq::mem`'s).
    ring: Option<DmaBuf>,
}

/// A completion queue (`CREATE_CQ`), destroyed on drop. QPs hold an
/// `Arc<Cq>`, so a CQ outlives the QPs completing into it.
///
/// Polling and arming take an internal lock; a CQ may be shared between
/// threads.
#[derive(Debug)]
pub struct Cq {
    dev: Device,
    handle: u32,
    mem: ManuallyDrop<QueueMem>,
    state: Mutex<CqState>,
}

/// A CQ's ring and `CREATE_CQ` request, made ready to be sent alone
/// ([`Cq::create`]) or together with other commands
/// ([`Pd::alloc_with_cq`](crate::Pd::alloc_with_cq)).
pub(crate) struct NewCq {
    depth: u32,
    mem: QueueMem,
    list: page_list::PageList,
    req: Vec<u8>,
}

impl NewCq {
    /// Allocates the ring of a CQ of at least `cqe` entries and builds its
    /// request.
    pub(crate) fn prepare(dev: &Device, cqe: u32) -> Result<NewCq> {
        let inner = &dev.inner;
        let depth = depth_for(cqe, inner.config.max_cqe)?;
        let t = &*inner.transport;
        let mem = QueueMem::alloc(t, depth as usize * CQE_SIZE as usize)?;
        let list = page_list::build(
            t,
            mem.pages(),
            mem.buf.page_shift(),
            0,
            inner.config.max_inline_pages,
            CreateCqReq::SIZE,
        )?;
        let req = CreateCqReq {
            ctx_handle: inner.ctx,
            depth,
            buf: list.desc,
            db_gpa: mem.db.gpa(),
        }
        .to_bytes()
        .to_vec();
        Ok(NewCq {
            depth,
            mem,
            list,
            req,
        })
    }

    /// The request after its header: the structure and the page list.
    pub(crate) fn parts(&self) -> [&[u8]; 2] {
        [&self.req, &self.list.tail]
    }

    /// The CQ, from the device's `answer` (the response payload) to the
    /// request; on an error whose outcome is unknown (the device may have
    /// created the CQ and use its ring) the ring is leaked, not freed.
    pub(crate) fn finish(self, dev: &Device, answer: Result<Vec<u8>>) -> Result<Arc<Cq>> {
        let payload = match answer {
            Ok(p) => p,
            Err(e) => {
                if outcome_unknown(&e) {
                    std::mem::forget((self.mem, self.list));
                }
                return Err(e);
            }
        };
        // Lenient on reserved fields, as every response.
        let r = CqHandleResp::read(&payload);
        dev.inner.events.register_cq(r.cq_handle);
        Ok(Arc::new(Cq {
            dev: dev.clone(),
            handle: r.cq_handle,
            mem: ManuallyDrop::new(self.mem),
            state: Mutex::new(CqState {
                depth: self.depth,
                ..CqState::default()
            }),
        }))
    }
}

/// The depth of a CQ of at least `cqe` entries on a device whose maximum
/// is `max`.
fn depth_for(cqe: u32, max: u32) -> Result<u32> {
    cqe.max(1)
        .checked_next_power_of_two()
        .filter(|d| *d <= max)
        .ok_or_else(|| {
            Error::InvalidArgument(format!("CQ of {cqe} entries (device maximum {max})"))
        })
}

impl Cq {
    /// Creates a CQ of at least `cqe` entries (rounded up to a power of two).
    pub fn create(dev: &Device, cqe: u32) -> Result<Arc<Cq>> {
        let new = NewCq::prepare(dev, cqe)?;
        let answer = dev
            .inner
            .execute(Opcode::CREATE_CQ, &new.parts(), CqHandleResp::SIZE);
        new.finish(dev, answer)
    }

    /// `RESIZE_CQ` (needs `F_RESIZE`): a new ring of at least `cqe`
    /// entries (a power of two), into which the device copies the
    /// completions not polled yet. Polls wait meanwhile; none is lost.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        let inner = &self.dev.inner;
        inner.require(F_RESIZE)?;
        let depth = depth_for(cqe, inner.config.max_cqe)?;
        let t = &*inner.transport;
        let shift = t.dma_page_shift();
        let bytes = depth as usize * CQE_SIZE as usize;
        let buf = DmaBuf::new(t.alloc_dma(bytes, 1usize << shift)?)?;
        buf.fill(0, bytes, 0)?;
        let list = page_list::build(
            t,
            buf.pages(),
            buf.page_shift(),
            0,
            inner.config.max_inline_pages,
            ResizeCqReq::SIZE,
        )?;
        let mut st = self.lock();
        // The device copies from the consumer index in the record.
        self.mem.db.store(off::CQ_CI, st.ci);
        let req = ResizeCqReq {
            cq_handle: self.handle,
            depth,
            buf: list.desc,
        };
        if let Err(e) = inner.cmd::<CqHandleResp>(Opcode::RESIZE_CQ, &req, &list.tail) {
            if outcome_unknown(&e) {
                // The device may use either ring.
                std::mem::forget((buf, list));
            }
            return Err(e);
        }
        st.depth = depth;
        // The previous replacement ring is no longer the device's.
        drop(st.ring.replace(buf));
        Ok(())
    }

    /// The CQ's image ([`crate::image`]); none for a resized CQ.
    pub fn image(&self) -> Result<CqImage> {
        let st = self.lock();
        if st.ring.is_some() {
            return Err(Error::Unsupported("an image of a resized CQ"));
        }
        Ok(CqImage {
            handle: self.handle,
            depth: st.depth,
            ci: st.ci,
            arm_seq: st.arm_seq,
            ring: self.mem.buf.image(),
            npages: self.mem.npages,
            db: self.mem.db.image(),
        })
    }

    /// The CQ of `image` on `dev` (restored from its image, over the same
    /// guest RAM): nothing is sent.
    pub fn restore(dev: &Device, image: &CqImage) -> Result<Arc<Cq>> {
        let t = &*dev.inner.transport;
        let mem = QueueMem::adopt(t, &image.ring, &image.db, image.npages)?;
        if !image.depth.is_power_of_two()
            || (image.depth as usize).saturating_mul(CQE_SIZE as usize) > mem.buf.len()
        {
            return Err(Error::InvalidArgument(format!(
                "a CQ image of {} entries over a {}-byte ring",
                image.depth,
                mem.buf.len()
            )));
        }
        dev.inner.events.register_cq(image.handle);
        Ok(Arc::new(Cq {
            dev: dev.clone(),
            handle: image.handle,
            mem: ManuallyDrop::new(mem),
            state: Mutex::new(CqState {
                ci: image.ci,
                arm_seq: image.arm_seq,
                depth: image.depth,
                ring: None,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Number of entries.
    pub fn depth(&self) -> u32 {
        self.lock().depth
    }

    /// The device the CQ belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The driver's consumer index and the device's producer index, for
    /// diagnostics.
    pub fn indices(&self) -> (u32, u32) {
        let ci = self.lock().ci;
        (ci, self.mem.db.load(off::CQ_PI))
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    ///
    /// For each entry: read `owner` of slot `ci` (acquire); when it equals
    /// the phase of `ci`, copy the CQE out and advance `ci`. The new `ci` is
    /// stored in the doorbell record (release) once per call, handing the
    /// slots back to the device.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut st = self.lock();
        let CqState {
            ci, depth, ring, ..
        } = &mut *st;
        let ring = ring.as_ref().unwrap_or(&self.mem.buf);
        let depth = *depth;
        let mut n = 0;
        while n < out.len() {
            let slot = ((*ci & (depth - 1)) * CQE_SIZE) as usize;
            let owner = ring
                .atomic_u8(slot + CQE_OWNER_OFFSET as usize)
                .load(Ordering::Acquire);
            if owner != cqe_owner(*ci, depth) {
                break;
            }
            let mut raw = [0u8; CQE_SIZE as usize];
            if ring.read(slot, &mut raw).is_err() {
                break;
            }
            out[n] = WorkCompletion::from_cqe(&Cqe::read(&raw));
            *ci = ci.wrapping_add(1);
            n += 1;
        }
        if n > 0 {
            self.mem.db.store(off::CQ_CI, *ci);
        }
        n
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        let mut wc = [WorkCompletion::default()];
        (self.poll(&mut wc) == 1).then_some(wc[0])
    }

    /// Arms the CQ: the next completion (`solicited_only`: the next solicited
    /// or failed one) written after this call queues one `CQ_COMPLETION`
    /// event. Writes `arm = seq << 2 | kind` with a `seq` different from the
    /// device's `armed_seq`. Poll again after arming: completions that
    /// arrived before it raise no event.
    pub fn req_notify(&self, solicited_only: bool) {
        let mut st = self.lock();
        let armed = self.mem.db.load(off::CQ_ARMED_SEQ) & ARM_SEQ_MASK;
        let mut seq = st.arm_seq.wrapping_add(1) & ARM_SEQ_MASK;
        if seq == armed {
            seq = seq.wrapping_add(1) & ARM_SEQ_MASK;
        }
        st.arm_seq = seq;
        let kind = if solicited_only {
            ARM_SOLICITED
        } else {
            ARM_NEXT
        };
        self.mem.db.store(off::CQ_ARM, seq << 2 | kind);
    }

    /// Waits at most `timeout` (`None`: forever; zero: poll) for a
    /// `CQ_COMPLETION` event of this CQ; consumes one and returns true, or
    /// false on timeout. Re-arm with [`Cq::req_notify`] and poll afterwards.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<bool> {
        let inner = &self.dev.inner;
        let handle = self.handle;
        let got = inner
            .events
            .wait(&*inner.transport, timeout, |st| st.take_cq(handle))?;
        Ok(got.is_some())
    }

    /// Guest-physical addresses of the pages of the ring the device writes
    /// completions into now (the one `RESIZE_CQ` gave last, else the
    /// first); dirty-logging tests check which the device marked.
    pub fn ring_pages(&self) -> Vec<u64> {
        let st = self.lock();
        st.ring.as_ref().unwrap_or(&self.mem.buf).pages().to_vec()
    }

    /// The doorbell record (tests inspect it).
    #[cfg(test)]
    pub(crate) fn db(&self) -> &DoorbellRecord {
        &self.mem.db
    }

    /// The ring (tests inspect it).
    #[cfg(test)]
    pub(crate) fn ring(&self) -> &DmaBuf {
        &self.mem.buf
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.dev.inner.events.unregister_cq(self.handle);
        let ok = self.dev.inner.destroy(
            Opcode::DESTROY_CQ,
            &CqHandleReq {
                cq_handle: self.handle,
            },
            "DESTROY_CQ",
        );
        if ok {
            // SAFETY: `mem` is dropped exactly once, here, and not used
            // afterwards.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        } else {
            // The device may still write the rings: leak them.
            let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            std::mem::forget(st.ring.take());
        }
    }
}
