//! Taking a VM's objects into a [`super::state::Objects`] (spec 20.2).

use std::time::Instant;

use virtio_rdma_abi::Wire;

use super::state::{
    AhState, CqState, CtxState, MrState, MwState, Objects, PagesState, QpRuntimeState, QpState,
    SrqState, Table, WaitState,
};
use super::state::{DoorbellsState, EventsState, InboundState};
use super::MigrationError;
use crate::events::EventQueue;
use crate::memory::PageList;
use crate::resources::handle::HandleTable;
use crate::resources::{Qp, VmResources};

/// The instance's objects as a state holds them. `now` is the moment the
/// state is taken: waits are saved as the time they have left.
///
/// The doorbell pages and slots of the shared-memory mode are not part of
/// it: [`doorbells`] takes them, for a hand-over only.
pub fn objects(res: &VmResources, now: Instant) -> Result<Objects, MigrationError> {
    Ok(Objects {
        ctxs: table(&res.ctxs, |c| Ok(CtxState { db_gpa: c.db_gpa }))?,
        pds: table(&res.pds, |p| Ok(p.ctx))?,
        cqs: table(&res.cqs, |c| {
            Ok(CqState {
                ctx: c.ctx,
                depth: c.depth,
                db_gpa: c.db_gpa,
                ring: pages(&c.ring)?,
                pi: c.rt.pi,
                armed_seq: c.rt.armed_seq,
                overflowed: c.rt.overflowed,
            })
        })?,
        mrs: table(&res.mrs, |m| {
            if m.host_lost {
                return Err(MigrationError::NotSavable(
                    "a memory region lost its host registration".into(),
                ));
            }
            Ok(MrState {
                pd: m.pd,
                access: m.access,
                iova: m.iova,
                length: m.length,
                first_page_offset: m.first_page_offset,
                lkey: m.lkey,
                rkey: m.rkey,
                pages: pages(&m.pages)?,
                keyed: m.keyed,
                fast: m.fast.map(|f| (f.max_num_sg, f.valid)),
            })
        })?,
        mws: table(&res.mws, |w| {
            Ok(MwState {
                pd: w.pd,
                mw_type: w.mw_type,
                key: w.key,
                binding: w
                    .binding
                    .map(|b| (b.mr, b.addr, b.length, b.access, b.qp.map(|(h, _)| h))),
            })
        })?,
        qps: table(&res.qps, |q| qp(q, now))?,
        ahs: table(&res.ahs, |a| {
            Ok(AhState {
                pd: a.pd,
                port: a.port,
                av: a.av.to_bytes(),
            })
        })?,
        srqs: table(&res.srqs, |s| {
            Ok(SrqState {
                pd: s.pd,
                depth: s.depth,
                max_sge: s.max_sge,
                limit: s.limit,
                wqe_shift: s.wqe_shift,
                db_gpa: s.db_gpa,
                ring: pages(&s.ring)?,
                xrc: s.xrc.map(|x| (x.xrcd, x.cq, x.srqn)),
                ci: s.rt.ci,
                broken: s.rt.broken,
            })
        })?,
        xrcds: table(&res.xrcds, |x| Ok(x.ctx))?,
        mcast: res
            .mcast
            .iter()
            .map(|(mgid, qps)| (*mgid, qps.clone()))
            .collect(),
        gsi: res.gsi_qp(),
    })
}

fn table<T, S>(
    t: &HandleTable<T>,
    mut f: impl FnMut(&T) -> Result<S, MigrationError>,
) -> Result<Table<S>, MigrationError> {
    let live = t
        .iter()
        .map(|(h, v)| f(v).map(|s| (h, s)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Table {
        gens: t.slot_gens(),
        free: t.free_slots().to_vec(),
        live,
    })
}

fn pages(p: &PageList) -> Result<PagesState, MigrationError> {
    let page_shift = p.page_shift();
    if let Some(base) = p.contiguous_base() {
        return Ok(PagesState::Contiguous {
            page_shift,
            npages: p.npages(),
            base,
        });
    }
    let pages = (0..p.npages())
        .map(|i| p.page(i))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| MigrationError::NotSavable("a page list is inconsistent".into()))?;
    Ok(PagesState::List { page_shift, pages })
}

fn qp(q: &Qp, now: Instant) -> Result<QpState, MigrationError> {
    let rt = &q.rt;
    if rt.outstanding != 0 || rt.recv_outstanding != 0 {
        // Only a host NIC takes WQEs ahead of their completion.
        return Err(MigrationError::NotSavable(format!(
            "QP {:#x} has WQEs a host NIC holds",
            q.qpn
        )));
    }
    let wait = rt.wait.map(|w| WaitState {
        index: w.index,
        left_us: micros(w.at.saturating_duration_since(now)),
        rnr_left: w.rnr_left,
        retry_left: w.retry_left,
        held_us: w
            .held_since
            .map(|s| micros(now.saturating_duration_since(s))),
        exhausted: w.exhausted.map(|(id, op)| (id, op as u32)),
    });
    Ok(QpState {
        pd: q.pd,
        ctx: q.ctx,
        qp_type: q.qp_type as u32,
        send_cq: q.send_cq,
        recv_cq: q.recv_cq,
        srq: q.srq,
        xrcd: q.xrcd,
        flags: q.flags,
        qpn: q.qpn,
        incarnation: q.incarnation,
        caps: [
            q.sq_depth,
            q.rq_depth,
            q.max_send_sge,
            q.max_recv_sge,
            q.max_inline_data,
        ],
        layout: (
            q.layout.sq_wqe_shift,
            q.layout.rq_wqe_shift,
            q.layout.rq_offset,
            q.layout.total,
        ),
        db_gpa: q.db_gpa,
        ring: pages(&q.ring)?,
        state: q.state as u32,
        attr: q.attr.to_bytes(),
        rt: QpRuntimeState {
            sq_ci: rt.sq_ci,
            rq_ci: rt.rq_ci,
            wait,
            dest_incarnation: rt.dest_incarnation,
            dest_gone: rt.dest_gone,
            comm_est: rt.comm_est,
            partial: rt.partial.map(|p| {
                (
                    p.index,
                    p.done,
                    p.wr_id,
                    p.len,
                    p.opcode as u32,
                    p.rkey,
                    p.remote_addr,
                )
            }),
            drain_owed: rt.drain_owed,
            inbound: rt.inbound.as_ref().map(|i| InboundState {
                wr_id: i.wr_id,
                sges: i.sges.iter().map(|s| (s.addr, s.length, s.lkey)).collect(),
                len: i.len,
                placed: i.placed,
            }),
            xrc_srq: rt.xrc_srq,
        },
    })
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The event queue as a state holds it.
pub fn events(q: &EventQueue) -> EventsState {
    let (last_seq, lost, first_lost_seq, pending) = q.parts();
    EventsState {
        last_seq,
        lost,
        first_lost_seq,
        pending: pending
            .iter()
            .map(|e| [e.kind, e.handle, e.detail, e.seq])
            .collect(),
    }
}

/// Which doorbell page each context has and which slot each queue
/// (spec 18.7), and the quarantined pages; `None` if the instance has
/// none of them (the state is then the same as without the mode).
pub fn doorbells(res: &VmResources) -> Option<DoorbellsState> {
    let pages: Vec<(u32, u32)> = res
        .ctxs
        .iter()
        .filter_map(|(h, c)| Some((h, c.db_page?)))
        .collect();
    let qp_slots: Vec<(u32, u32)> = res
        .qps
        .iter()
        .filter_map(|(h, q)| Some((h, q.db_slot.as_ref()?.at().slot)))
        .collect();
    let srq_slots: Vec<(u32, u32)> = res
        .srqs
        .iter()
        .filter_map(|(h, s)| Some((h, s.db_slot.as_ref()?.at().slot)))
        .collect();
    let quarantined = res
        .doorbells
        .as_ref()
        .map(|d| d.quarantined())
        .unwrap_or_default();
    if pages.is_empty() && quarantined.is_empty() {
        // Queues have slots only in contexts with pages.
        return None;
    }
    Some(DoorbellsState {
        pages,
        qp_slots,
        srq_slots,
        quarantined,
    })
}
