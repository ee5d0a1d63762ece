//! Putting a VM's objects back from a loaded state (spec 20.3, 20.5).
//!
//! A state from a front-end is as hostile as a control command: every
//! object is checked as the command that created it checks it (page lists
//! against this VM's RAM, queue memory against its depth, references
//! against the tables, counts against the limits), every derived field is
//! recomputed (`resources::restore`), and the QP numbers, keys and SRQ
//! numbers are claimed from the RNIC only if nobody holds them. A refused
//! state leaves nothing behind: what was claimed is given back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use virtio_rdma_abi::datapath::{Sge, WcOpcode, WrOpcode};
use virtio_rdma_abi::mem::{qp_buffer_layout, QpBufferLayout, CQE_SIZE, DB_RECORD_SIZE};
use virtio_rdma_abi::qp::{AddressVector, QpAttr, QpState as QpStateCode, QpType, GSI_QPN};
use virtio_rdma_abi::verbs::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH};
use virtio_rdma_abi::{Field, Wire};

use super::state::{self, DoorbellsState, Objects, PagesState, Table};
use super::MigrationError;
use crate::config::Limits;
use crate::events::EventQueue;
use crate::memory::{PageList, RamMap};
use crate::resources::handle::HandleTable;
use crate::resources::restore::Tables;
use crate::resources::{
    Ah, Binding, Context, Cq, CqRuntime, FastReg, Inbound, Mr, Mw, Pd, Qp, QpRuntime, SendPartial,
    SendWait, Srq, SrqRuntime, VmResources, XrcSrq, Xrcd,
};
use crate::rnic_objects::{MrKeys, Owner, QpSpec, RnicObjects};
use crate::shmem::DoorbellPages;
use virtio_rdma_abi::event::Event;

/// Where the objects go.
pub struct Target<'a> {
    /// Index of the VM in the daemon.
    pub vm: usize,
    /// Its limits.
    pub limits: &'a Limits,
    /// Its guest RAM (a map of all addresses when the memory table is not
    /// known yet: [`check_ram`] checks them at the start).
    pub ram: &'a RamMap,
    /// The RNIC that gives out QP numbers and keys.
    pub rnic: &'a dyn RnicObjects,
    /// Where the numbers and keys come from.
    pub numbers: Numbers<'a>,
    /// Checks a QP's attributes as `MODIFY_QP` would (against this VM's
    /// GID table, features and limits).
    pub check_attr: &'a dyn Fn(QpType, &QpAttr) -> Result<(), String>,
    /// The host halves' state of a state saved on a host RNIC (spec
    /// 20.8), which one loading on a host RNIC needs.
    pub host: Option<&'a crate::relocation::HostState>,
}

/// Where a loaded state's QP numbers, keys and SRQ numbers come from.
pub enum Numbers<'a> {
    /// From the RNIC, free (a state from another daemon).
    Claim,
    /// From the stopped instance `from` of the same VM in this daemon,
    /// which saved the state and whose objects `source` are (spec 20.5).
    Rehome {
        /// Its index.
        from: usize,
        /// Its objects.
        source: &'a VmResources,
    },
}

/// What was claimed from the RNIC, to give back if the load fails.
#[derive(Default)]
struct Claims {
    /// Host halves made for PDs, CQs, SRQs and AHs (a host RNIC's).
    pds: Vec<Owner>,
    cqs: Vec<Owner>,
    srqs: Vec<Owner>,
    ahs: Vec<Owner>,
    qpns: Vec<u32>,
    mr_keys: Vec<MrKeys>,
    fast: Vec<u32>,
    srqns: Vec<u32>,
    mcast: Vec<(Owner, [u8; 16])>,
    gsi: bool,
}

impl Claims {
    fn release(self, t: &Target<'_>) {
        for (owner, mgid) in self.mcast {
            t.rnic.mcast_detach(owner, &mgid);
        }
        for q in self.qpns {
            t.rnic.destroy_qp(q);
        }
        for k in self.mr_keys {
            t.rnic.dereg_mr(k);
        }
        for k in self.fast {
            t.rnic.free_fast_mr(k);
        }
        for s in self.srqns {
            t.rnic.free_srqn(s);
        }
        if self.gsi {
            t.rnic.gsi_destroyed(t.vm);
        }
        for o in self.ahs {
            t.rnic.destroy_ah(o);
        }
        for o in self.srqs {
            t.rnic.destroy_srq(o);
        }
        for o in self.cqs {
            t.rnic.destroy_cq(o);
        }
        for o in self.pds {
            t.rnic.destroy_pd(o);
        }
    }
}

fn bad(what: impl Into<String>) -> MigrationError {
    MigrationError::Invalid(what.into())
}

/// The VM's objects from `saved`, their numbers and keys claimed from the
/// RNIC. `now` is the moment of the load: saved waits count from it.
pub fn objects(
    saved: &Objects,
    t: &Target<'_>,
    now: Instant,
) -> Result<VmResources, MigrationError> {
    let mut claims = Claims::default();
    match build(saved, t, now, &mut claims) {
        Ok(r) => Ok(r),
        Err(e) => {
            claims.release(t);
            Err(e)
        }
    }
}

/// A number or key the RNIC would not give: taken by another object (or
/// this RNIC does not let a state choose them).
fn taken(what: String, e: crate::rnic_objects::RnicError) -> MigrationError {
    match e {
        crate::rnic_objects::RnicError::Invalid => bad(format!(
            "{what} is taken, or this RNIC does not give out chosen ones"
        )),
        e => bad(format!("{what}: {e}")),
    }
}

fn count_within(n: usize, max: u32, what: &str) -> Result<(), MigrationError> {
    if n > max as usize {
        return Err(bad(format!("{n} {what}, the limit is {max}")));
    }
    Ok(())
}

fn build(
    saved: &Objects,
    t: &Target<'_>,
    now: Instant,
    claims: &mut Claims,
) -> Result<VmResources, MigrationError> {
    let l = t.limits;
    count_within(saved.ctxs.live.len(), l.max_ctx, "contexts")?;
    count_within(saved.pds.live.len(), l.max_pd, "PDs")?;
    count_within(saved.cqs.live.len(), l.max_cq, "CQs")?;
    count_within(saved.qps.live.len(), l.max_qp, "QPs")?;
    count_within(saved.srqs.live.len(), l.max_srq, "SRQs")?;
    count_within(saved.ahs.live.len(), l.max_ah, "AHs")?;
    count_within(
        saved.mrs.live.len().saturating_add(saved.mws.live.len()),
        l.max_mr,
        "MRs and windows",
    )?;
    count_within(
        saved.xrcds.live.len(),
        virtio_rdma_abi::verbs::MAX_XRCD,
        "XRC domains",
    )?;

    let ctxs = table(&saved.ctxs, |c| {
        const SIZE: u64 = <virtio_rdma_abi::datapath::CtxDoorbell as Field>::SIZE as u64;
        if c.db_gpa % SIZE != 0 || !t.ram.contains(c.db_gpa, SIZE) {
            return Err(bad("a context's doorbell header is outside RAM"));
        }
        Ok(Context {
            db_page: None,
            db_gpa: c.db_gpa,
        })
    })?;
    let pds = table(&saved.pds, |&ctx| {
        live(&ctxs, ctx, "a PD's context")?;
        Ok(Pd { ctx, users: 0 })
    })?;
    let xrcds = table(&saved.xrcds, |&ctx| {
        live(&ctxs, ctx, "an XRC domain's context")?;
        Ok(Xrcd { ctx, users: 0 })
    })?;
    let cqs = table(&saved.cqs, |c| {
        live(&ctxs, c.ctx, "a CQ's context")?;
        depth(c.depth, l.max_cqe, "CQ")?;
        db_record(t.ram, c.db_gpa)?;
        let ring = pages(&c.ring, t, false)?;
        covers(
            &ring,
            u64::from(c.depth).saturating_mul(u64::from(CQE_SIZE)),
            "CQ",
        )?;
        Ok(Cq {
            ctx: c.ctx,
            depth: c.depth,
            db_gpa: c.db_gpa,
            ring,
            users: 0,
            rt: CqRuntime {
                pi: c.pi,
                armed_seq: c.armed_seq,
                overflowed: c.overflowed,
            },
        })
    })?;
    let pd_ctx = |pd: u32, what: &str| -> Result<u32, MigrationError> {
        pds.get(pd)
            .map(|p| p.ctx)
            .ok_or_else(|| bad(format!("{what}: no such PD")))
    };
    let srqs = table(&saved.srqs, |s| {
        let ctx = pd_ctx(s.pd, "an SRQ")?;
        depth(s.depth, l.max_srq_wr, "SRQ")?;
        if s.max_sge == 0 || s.max_sge > l.max_recv_sge || !(4..=16).contains(&s.wqe_shift) {
            return Err(bad("an SRQ's SGEs or stride are out of range"));
        }
        db_record(t.ram, s.db_gpa)?;
        let ring = pages(&s.ring, t, false)?;
        covers(&ring, u64::from(s.depth) << s.wqe_shift, "SRQ")?;
        let xrc = match s.xrc {
            None => None,
            Some((xrcd, cq, srqn)) => {
                live(&xrcds, xrcd, "an XRC SRQ's domain")?;
                if cqs.get(cq).is_none_or(|c| c.ctx != ctx) {
                    return Err(bad("an XRC SRQ's CQ is not of its context"));
                }
                Some(XrcSrq { xrcd, cq, srqn })
            }
        };
        Ok(Srq {
            pd: s.pd,
            ctx,
            depth: s.depth,
            max_sge: s.max_sge,
            limit: s.limit,
            wqe_shift: s.wqe_shift,
            db_gpa: s.db_gpa,
            db_slot: None,
            ring,
            users: 0,
            xrc,
            rt: SrqRuntime {
                ci: s.ci,
                outstanding: 0,
                broken: s.broken,
            },
        })
    })?;
    let mrs = table(&saved.mrs, |m| {
        let ctx = pd_ctx(m.pd, "an MR")?;
        if m.length > l.max_mr_size {
            return Err(bad("an MR is longer than max_mr_size"));
        }
        let (pages, fast) = match m.fast {
            Some((max_num_sg, valid)) => {
                if max_num_sg == 0 || max_num_sg > t.rnic.caps().max_fast_reg_pages {
                    return Err(bad("a fast-registration region's capacity is out of range"));
                }
                // A region keeps the pages of its last registration when it
                // is invalidated (its length becomes 0); one never
                // registered has none.
                if m.lkey != m.rkey || (!valid && m.length != 0) {
                    return Err(bad(
                        "a fast-registration region's key or length is inconsistent",
                    ));
                }
                let mut room = PageList::reserved(max_num_sg);
                let empty = match &m.pages {
                    PagesState::List { pages, page_shift } if pages.is_empty() => {
                        if *page_shift != 12 {
                            return Err(bad("an empty page list of another page size"));
                        }
                        true
                    }
                    _ => false,
                };
                if !empty {
                    let list = pages(&m.pages, t, valid)?;
                    let listed: Vec<u64> =
                        (0..list.npages()).filter_map(|i| list.page(i)).collect();
                    if !room.refill(list.page_shift(), listed.into_iter()) {
                        return Err(bad(
                            "a fast-registration region holds more pages than its room",
                        ));
                    }
                } else if valid {
                    return Err(bad("a registered fast-registration region without pages"));
                }
                (room, Some(FastReg { max_num_sg, valid }))
            }
            None => (pages(&m.pages, t, false)?, None),
        };
        let span = u64::from(m.first_page_offset).saturating_add(m.length);
        if (fast.is_none() || fast.is_some_and(|f| f.valid))
            && (u64::from(m.first_page_offset) >= 1u64 << pages.page_shift().min(63)
                || span > u64::from(pages.npages()) << pages.page_shift().min(63))
        {
            return Err(bad("an MR is longer than its pages"));
        }
        Ok(Mr {
            pd: m.pd,
            ctx,
            access: m.access,
            iova: m.iova,
            length: m.length,
            first_page_offset: m.first_page_offset,
            lkey: m.lkey,
            rkey: m.rkey,
            pages,
            host_lost: false,
            keyed: m.keyed,
            fast,
        })
    })?;
    let ahs = table(&saved.ahs, |a| {
        let ctx = pd_ctx(a.pd, "an AH")?;
        let av = AddressVector::parse(&a.av).map_err(|e| bad(format!("an AH: {e}")))?;
        Ok(Ah {
            pd: a.pd,
            ctx,
            port: a.port,
            av,
        })
    })?;
    let mut incarnations = 0u64;
    let mut gsi_seen = None;
    let qps = table(&saved.qps, |q| {
        let qp = qp(q, t, now, &pds, &cqs, &srqs, &xrcds)?;
        if qp.qp_type == QpType::GSI {
            if gsi_seen.is_some() || qp.qpn != GSI_QPN {
                return Err(bad("a second GSI QP, or one not numbered 1"));
            }
            gsi_seen = Some(());
        } else if qp.qpn == GSI_QPN || qp.qpn == 0 {
            return Err(bad("a QP numbered 0 or 1 that is not the GSI QP"));
        }
        incarnations = incarnations.max(qp.incarnation);
        Ok(qp)
    })?;
    let mws = table(&saved.mws, |w| {
        let ctx = pd_ctx(w.pd, "a window")?;
        if ![
            virtio_rdma_abi::verbs::MW_TYPE_1,
            virtio_rdma_abi::verbs::MW_TYPE_2,
        ]
        .contains(&w.mw_type)
        {
            return Err(bad("a window of an unknown type"));
        }
        let binding = match w.binding {
            None => None,
            Some((mr, addr, length, access, qp)) => {
                let m = mrs.get(mr).ok_or_else(|| bad("a window bound to no MR"))?;
                if m.pd != w.pd || m.fast.is_some() {
                    return Err(bad("a window bound to an MR of another PD, or a fast one"));
                }
                let end = addr
                    .checked_add(length)
                    .ok_or_else(|| bad("a window's range wraps"))?;
                if addr < m.iova || end > m.iova.saturating_add(m.length) {
                    return Err(bad("a window's range is outside its MR"));
                }
                let qp = match qp {
                    None => None,
                    Some(h) => Some((
                        h,
                        qps.get(h)
                            .map(|q| q.incarnation)
                            .ok_or_else(|| bad("a window bound by no QP"))?,
                    )),
                };
                if (w.mw_type == virtio_rdma_abi::verbs::MW_TYPE_2) != qp.is_some() {
                    return Err(bad("a window's binding QP does not match its type"));
                }
                Some(Binding {
                    mr,
                    addr,
                    length,
                    access,
                    qp,
                })
            }
        };
        Ok(Mw {
            pd: w.pd,
            ctx,
            mw_type: w.mw_type,
            key: w.key,
            binding,
        })
    })?;
    // The same QP incarnation must never be handed out again (spec 18.23).
    crate::resources::note_incarnation(incarnations);

    let mut groups: crate::resources::mcast::Groups = HashMap::new();
    if saved.mcast.len() > MAX_MCAST_GRP as usize {
        return Err(bad("too many multicast groups"));
    }
    for (mgid, members) in &saved.mcast {
        if members.is_empty() || members.len() > MAX_MCAST_QP_ATTACH as usize {
            return Err(bad("a multicast group's members are out of range"));
        }
        for &h in members {
            if qps.get(h).is_none_or(|q| q.qp_type != QpType::UD) {
                return Err(bad("a multicast member that is not a UD QP"));
            }
        }
        if groups.insert(*mgid, members.clone()).is_some() {
            return Err(bad("a multicast group listed twice"));
        }
    }
    let gsi = saved.gsi;
    if gsi.map(|h| qps.get(h).map(|q| q.qp_type)) != gsi_seen.map(|()| Some(QpType::GSI))
        && !(gsi.is_none() && gsi_seen.is_none())
    {
        return Err(bad("the GSI QP's handle does not name the GSI QP"));
    }

    match t.numbers {
        Numbers::Claim => {
            host_halves(t, &pds, &cqs, &srqs, &ahs, claims)?;
            claim_all(t, &qps, &mrs, &mws, &srqs, &groups, claims)?;
            host_states(t, &qps)?;
        }
        Numbers::Rehome { from, source } => {
            rehome_all(t, from, source, &qps, &mrs, &mws, &srqs, &groups)?;
        }
    }
    let res = VmResources::assemble(
        t.vm,
        l.max_host_bytes,
        Tables {
            ctxs,
            pds,
            cqs,
            mrs,
            mws,
            qps,
            ahs,
            srqs,
            xrcds,
        },
        groups,
        gsi,
    )
    .map_err(bad)?;
    if res.registered_bytes > l.max_mr_bytes {
        return Err(bad(format!(
            "{} bytes registered, max_mr_bytes is {}",
            res.registered_bytes, l.max_mr_bytes
        )));
    }
    // Nothing to give back from here on.
    *claims = Claims::default();
    Ok(res)
}

fn owner(t: &Target<'_>, handle: u32) -> Owner {
    Owner {
        vm: t.vm,
        handle,
        incarnation: 0,
    }
}

/// Makes the host halves of the PDs, CQs, SRQs and AHs (a host RNIC's; the
/// software RNIC has none), before the QPs and regions that use them.
fn host_halves(
    t: &Target<'_>,
    pds: &HandleTable<crate::resources::Pd>,
    cqs: &HandleTable<crate::resources::Cq>,
    srqs: &HandleTable<Srq>,
    ahs: &HandleTable<crate::resources::Ah>,
    claims: &mut Claims,
) -> Result<(), MigrationError> {
    let host = |what: &str, e| bad(format!("{what}: host RNIC: {e}"));
    for (h, _) in pds.iter() {
        t.rnic.create_pd(owner(t, h)).map_err(|e| host("a PD", e))?;
        claims.pds.push(owner(t, h));
    }
    for (h, c) in cqs.iter() {
        t.rnic
            .create_cq(owner(t, h), c.depth)
            .map_err(|e| host("a CQ", e))?;
        claims.cqs.push(owner(t, h));
    }
    for (h, s) in srqs.iter() {
        let spec = crate::rnic_objects::SrqSpec {
            pd: s.pd,
            depth: s.depth,
            max_sge: s.max_sge,
        };
        t.rnic
            .create_srq(owner(t, h), &spec)
            .map_err(|e| host("an SRQ", e))?;
        claims.srqs.push(owner(t, h));
    }
    for (h, a) in ahs.iter() {
        t.rnic
            .create_ah(owner(t, h), a.pd, &a.av)
            .map_err(|e| host("an AH", e))?;
        claims.ahs.push(owner(t, h));
    }
    Ok(())
}

/// Brings each claimed QP's host half into the QP's state, with the
/// source's transport state (a host RNIC's, spec 20.8). A state saved on
/// the software RNIC has no host halves: on a host RNIC it loads only if
/// none of its connected QPs is past INIT.
fn host_states(t: &Target<'_>, qps: &HandleTable<Qp>) -> Result<(), MigrationError> {
    if t.host.is_some() && !t.rnic.loads_host_state() {
        return Err(bad(
            "the state was saved on a host RNIC (libibverbs), this daemon's is the software RNIC",
        ));
    }
    for (_, q) in qps.iter() {
        if q.qp_type == QpType::GSI {
            continue;
        }
        t.rnic
            .restore_qp(t.vm, q.qpn, q.state, &q.attr, t.host)
            .map_err(|e| {
                bad(format!(
                    "QP {:#x}: its host half cannot take its state ({e}): a state from \
                     another RNIC, or the host refused",
                    q.qpn
                ))
            })?;
    }
    Ok(())
}

/// Claims every QP number, key and SRQ number of the objects from the RNIC
/// (a state from another daemon): each must be free.
#[allow(clippy::too_many_arguments)]
fn claim_all(
    t: &Target<'_>,
    qps: &HandleTable<Qp>,
    mrs: &HandleTable<Mr>,
    mws: &HandleTable<Mw>,
    srqs: &HandleTable<Srq>,
    groups: &crate::resources::mcast::Groups,
    claims: &mut Claims,
) -> Result<(), MigrationError> {
    for (h, q) in qps.iter() {
        if q.qp_type == QpType::GSI {
            t.rnic.gsi_created(t.vm);
            claims.gsi = true;
            continue;
        }
        let owner = Owner {
            vm: t.vm,
            handle: h,
            incarnation: q.incarnation,
        };
        let spec = QpSpec {
            qp_type: q.qp_type,
            pd: q.pd,
            send_cq: q.send_cq,
            recv_cq: q.recv_cq,
            srq: q.srq,
            sq_depth: q.sq_depth,
            rq_depth: q.rq_depth,
            max_send_sge: q.max_send_sge,
            max_recv_sge: q.max_recv_sge,
            max_inline_data: q.max_inline_data,
        };
        t.rnic
            .claim_qp(owner, q.qpn, &spec)
            .map_err(|e| taken(format!("QP number {:#x}", q.qpn), e))?;
        claims.qpns.push(q.qpn);
    }
    for (h, m) in mrs.iter() {
        let owner = Owner {
            vm: t.vm,
            handle: h,
            incarnation: 0,
        };
        if m.fast.is_some() {
            t.rnic
                .claim_fast_mr(owner, m.lkey)
                .map_err(|e| taken(format!("key {:#x}", m.lkey), e))?;
            claims.fast.push(m.lkey);
        } else {
            let keys = MrKeys {
                lkey: m.lkey,
                rkey: m.rkey,
            };
            if (m.rkey != 0) != (m.remote() || m.keyed) {
                return Err(bad("an MR's rkey does not match its access"));
            }
            t.rnic
                .claim_mr(owner, keys, &m.spec())
                .map_err(|e| taken(format!("keys {:#x}/{:#x}", m.lkey, m.rkey), e))?;
            claims.mr_keys.push(keys);
        }
    }
    for (h, w) in mws.iter() {
        let owner = Owner {
            vm: t.vm,
            handle: h,
            incarnation: 0,
        };
        t.rnic
            .claim_fast_mr(owner, w.key)
            .map_err(|e| taken(format!("window key {:#x}", w.key), e))?;
        claims.fast.push(w.key);
    }
    for (h, s) in srqs.iter() {
        if let Some(x) = s.xrc {
            let owner = Owner {
                vm: t.vm,
                handle: h,
                incarnation: 0,
            };
            t.rnic
                .claim_srqn(owner, x.srqn)
                .map_err(|e| taken(format!("SRQ number {:#x}", x.srqn), e))?;
            claims.srqns.push(x.srqn);
        }
    }
    for (mgid, members) in groups {
        for &h in members {
            let Some(q) = qps.get(h) else { continue };
            let owner = Owner {
                vm: t.vm,
                handle: h,
                incarnation: q.incarnation,
            };
            t.rnic
                .mcast_attach(owner, mgid)
                .map_err(|e| bad(format!("multicast group: {e}")))?;
            claims.mcast.push((owner, *mgid));
        }
    }
    Ok(())
}

/// Moves every QP number, SRQ number and multicast membership of the
/// objects from instance `from` of the same VM in this daemon, whose
/// objects `source` are: each number and key of the state must be one of
/// `source`'s, on the object with the same handle (a state that names
/// anything else is refused), and the keys need no move (they are the
/// RNIC's, not an instance's).
#[allow(clippy::too_many_arguments)]
fn rehome_all(
    t: &Target<'_>,
    from: usize,
    source: &VmResources,
    qps: &HandleTable<Qp>,
    mrs: &HandleTable<Mr>,
    mws: &HandleTable<Mw>,
    srqs: &HandleTable<Srq>,
    groups: &crate::resources::mcast::Groups,
) -> Result<(), MigrationError> {
    let not_theirs = |what: &str| bad(format!("{what} is not the source instance's"));
    let mut qpns = Vec::new();
    for (h, q) in qps.iter() {
        let same = source
            .qps
            .get(h)
            .is_some_and(|s| s.qpn == q.qpn && s.incarnation == q.incarnation);
        if !same {
            return Err(not_theirs(&format!("QP {:#x}", q.qpn)));
        }
        if q.qp_type != QpType::GSI {
            qpns.push(q.qpn);
        }
    }
    for (h, m) in mrs.iter() {
        let same = source.mrs.get(h).is_some_and(|s| {
            s.lkey == m.lkey && s.rkey == m.rkey && s.fast.is_some() == m.fast.is_some()
        });
        if !same {
            return Err(not_theirs(&format!("key {:#x}", m.lkey)));
        }
    }
    for (h, w) in mws.iter() {
        if source.mws.get(h).is_none_or(|s| s.key >> 8 != w.key >> 8) {
            return Err(not_theirs(&format!("window key {:#x}", w.key)));
        }
    }
    let mut srqns = Vec::new();
    for (h, x) in srqs.iter() {
        if let Some(x) = x.xrc {
            if source.srqs.get(h).and_then(|s| s.xrc).map(|s| s.srqn) != Some(x.srqn) {
                return Err(not_theirs(&format!("SRQ number {:#x}", x.srqn)));
            }
            srqns.push(x.srqn);
        }
    }
    for (mgid, members) in groups {
        if source.mcast.get(mgid) != Some(members) {
            return Err(not_theirs("a multicast group"));
        }
    }
    t.rnic
        .rehome(from, t.vm, &qpns, &srqns)
        .map_err(|e| taken("a QP or SRQ number".into(), e))?;
    if qps.iter().any(|(_, q)| q.qp_type == QpType::GSI) {
        t.rnic.gsi_destroyed(from);
        t.rnic.gsi_created(t.vm);
    }
    Ok(())
}

fn table<S, T>(
    saved: &Table<S>,
    mut f: impl FnMut(&S) -> Result<T, MigrationError>,
) -> Result<HandleTable<T>, MigrationError> {
    let live = saved
        .live
        .iter()
        .map(|(h, s)| f(s).map(|v| (*h, v)))
        .collect::<Result<Vec<_>, _>>()?;
    HandleTable::restore(&saved.gens, &saved.free, live).map_err(bad)
}

fn live<T>(table: &HandleTable<T>, h: u32, what: &str) -> Result<(), MigrationError> {
    table
        .get(h)
        .map(|_| ())
        .ok_or_else(|| bad(format!("{what}: no such object")))
}

fn depth(d: u32, max: u32, what: &str) -> Result<(), MigrationError> {
    if d == 0 || d > max || !d.is_power_of_two() {
        return Err(bad(format!("a {what}'s depth {d} is out of range")));
    }
    Ok(())
}

fn db_record(ram: &RamMap, gpa: u64) -> Result<(), MigrationError> {
    if gpa % DB_RECORD_SIZE != 0 || !ram.contains(gpa, DB_RECORD_SIZE) {
        return Err(bad("a doorbell record is outside RAM"));
    }
    Ok(())
}

fn covers(ring: &PageList, bytes: u64, what: &str) -> Result<(), MigrationError> {
    let have = u64::from(ring.npages()) << ring.page_shift().min(63);
    if have < bytes {
        return Err(bad(format!("a {what}'s ring is smaller than its depth")));
    }
    Ok(())
}

/// A page list of the state, each page checked against the VM's RAM and
/// page sizes. `may_be_empty`: a list with no page is allowed (an XRC
/// target's ring, a registered fast region's list is never empty).
fn pages(p: &PagesState, t: &Target<'_>, _registered: bool) -> Result<PageList, MigrationError> {
    let cap = t.limits.page_size_cap;
    match p {
        PagesState::Contiguous {
            page_shift,
            npages,
            base,
        } => PageList::restore_contiguous(*page_shift, *base, *npages, t.ram, cap),
        PagesState::List { page_shift, pages } => {
            PageList::restore_list(*page_shift, pages.clone(), t.ram, cap)
        }
    }
    .map_err(|e| bad(format!("a page list: {e}")))
}

#[allow(clippy::too_many_arguments)]
fn qp(
    q: &state::QpState,
    t: &Target<'_>,
    now: Instant,
    pds: &HandleTable<Pd>,
    cqs: &HandleTable<Cq>,
    srqs: &HandleTable<Srq>,
    xrcds: &HandleTable<Xrcd>,
) -> Result<Qp, MigrationError> {
    let l = t.limits;
    let qp_type = QpType::from_u32(q.qp_type).ok_or_else(|| bad("a QP of an unknown type"))?;
    let state = QpStateCode::from_u32(q.state).ok_or_else(|| bad("a QP in an unknown state"))?;
    let attr = QpAttr::parse(&q.attr).map_err(|e| bad(format!("a QP's attributes: {e}")))?;
    (t.check_attr)(qp_type, &attr).map_err(bad)?;
    let [sq_depth, rq_depth, max_send_sge, max_recv_sge, max_inline_data] = q.caps;
    let tgt = qp_type == QpType::XRC_TGT;
    if tgt {
        if xrcds.get(q.xrcd).is_none() || q.pd != 0 || q.srq != 0 {
            return Err(bad("an XRC target without its domain, or with a PD or SRQ"));
        }
    } else {
        let ctx = pds
            .get(q.pd)
            .map(|p| p.ctx)
            .ok_or_else(|| bad("a QP's PD"))?;
        if ctx != q.ctx || q.xrcd != 0 {
            return Err(bad("a QP's PD is of another context"));
        }
        for cq in [q.send_cq, q.recv_cq] {
            if cqs.get(cq).is_none_or(|c| c.ctx != ctx) {
                return Err(bad("a QP's CQ is not of its context"));
            }
        }
        if q.srq != 0
            && srqs
                .get(q.srq)
                .is_none_or(|s| s.ctx != ctx || s.xrc.is_some())
        {
            return Err(bad("a QP's SRQ is not of its context"));
        }
        if sq_depth > l.max_qp_wr
            || rq_depth > l.max_qp_wr
            || max_send_sge > l.max_send_sge
            || max_recv_sge > l.max_recv_sge
            || max_inline_data > l.max_inline_data
        {
            return Err(bad("a QP's capacities are beyond the limits"));
        }
    }
    let ring = pages(&q.ring, t, false)?;
    let layout = if tgt {
        QpBufferLayout {
            sq_wqe_shift: q.layout.0,
            rq_wqe_shift: q.layout.1,
            rq_offset: q.layout.2,
            total: q.layout.3,
        }
    } else {
        qp_buffer_layout(
            sq_depth,
            rq_depth,
            max_send_sge,
            max_recv_sge,
            max_inline_data,
            ring.page_shift(),
        )
    };
    if (
        layout.sq_wqe_shift,
        layout.rq_wqe_shift,
        layout.rq_offset,
        layout.total,
    ) != q.layout
        || (tgt && (ring.npages() != 0 || layout.total != 0))
    {
        return Err(bad(
            "a QP's ring layout does not follow from its capacities",
        ));
    }
    covers(&ring, layout.total, "QP")?;
    if !tgt {
        db_record(t.ram, q.db_gpa)?;
    }
    let rt = &q.rt;
    let wait = match &rt.wait {
        None => None,
        Some(w) if w.rnr_left > 7 || w.retry_left > 7 => {
            return Err(bad("a wait with more retries left than a QP has"));
        }
        Some(w) => Some(SendWait {
            index: w.index,
            at: now
                .checked_add(Duration::from_micros(w.left_us.min(3_600_000_000)))
                .unwrap_or(now),
            rnr_left: w.rnr_left,
            retry_left: w.retry_left,
            held_since: w
                .held_us
                .map(|us| now.checked_sub(Duration::from_micros(us)).unwrap_or(now)),
            exhausted: match w.exhausted {
                None => None,
                Some((id, op)) => Some((
                    id,
                    WcOpcode::from_u32(op).ok_or_else(|| bad("a wait's completion opcode"))?,
                )),
            },
        }),
    };
    let partial = match rt.partial {
        None => None,
        Some((index, done, wr_id, len, opcode, rkey, remote_addr)) => {
            if done > len {
                return Err(bad("a WRITE in pieces done past its length"));
            }
            Some(SendPartial {
                index,
                done,
                wr_id,
                len,
                opcode: WrOpcode::from_u32(opcode).ok_or_else(|| bad("a WRITE's opcode"))?,
                rkey,
                remote_addr,
            })
        }
    };
    let inbound = match &rt.inbound {
        None => None,
        Some(i) => {
            if i.sges.len() > 30 || i.placed > i.len {
                return Err(bad("a message in pieces is out of range"));
            }
            Some(Box::new(Inbound {
                wr_id: i.wr_id,
                sges: i
                    .sges
                    .iter()
                    .map(|&(addr, length, lkey)| Sge { addr, length, lkey })
                    .collect(),
                len: i.len,
                placed: i.placed,
            }))
        }
    };
    Ok(Qp {
        pd: q.pd,
        ctx: q.ctx,
        qp_type,
        send_cq: q.send_cq,
        recv_cq: q.recv_cq,
        srq: q.srq,
        xrcd: q.xrcd,
        flags: q.flags,
        qpn: q.qpn,
        incarnation: q.incarnation,
        sq_depth,
        rq_depth,
        max_send_sge,
        max_recv_sge,
        max_inline_data,
        layout,
        db_gpa: q.db_gpa,
        db_slot: None,
        ring,
        state,
        attr,
        rt: QpRuntime {
            sq_ci: rt.sq_ci,
            rq_ci: rt.rq_ci,
            wait,
            outstanding: 0,
            recv_outstanding: 0,
            peer: None,
            dest_incarnation: rt.dest_incarnation,
            dest_gone: rt.dest_gone,
            comm_est: rt.comm_est,
            partial,
            drain_owed: rt.drain_owed,
            inbound,
            xrc_srq: rt.xrc_srq,
        },
    })
}

/// The event queue of a state.
pub fn events(saved: &state::EventsState) -> Result<EventQueue, MigrationError> {
    let pending = saved
        .pending
        .iter()
        .map(|&[kind, handle, detail, seq]| Event {
            kind,
            handle,
            detail,
            seq,
        })
        .collect();
    EventQueue::from_parts(saved.last_seq, saved.lost, saved.first_lost_seq, pending).map_err(bad)
}

/// Checks that every guest-physical address the objects hold lies in
/// `ram` (a state loaded before the memory table, checked at the start,
/// spec 20.1): contexts' doorbell headers, queues' doorbell records and
/// rings, regions' pages.
pub fn check_ram(res: &VmResources, ram: &RamMap) -> Result<(), MigrationError> {
    const CTX: u64 = <virtio_rdma_abi::datapath::CtxDoorbell as Field>::SIZE as u64;
    let list = |p: &PageList| -> Result<(), MigrationError> {
        let size = 1u64 << p.page_shift().min(63);
        for i in 0..p.npages() {
            if p.page(i).is_none_or(|gpa| !ram.contains(gpa, size)) {
                return Err(bad(format!("page {i} of a list is outside guest RAM")));
            }
        }
        Ok(())
    };
    for (_, c) in res.ctxs.iter() {
        if !ram.contains(c.db_gpa, CTX) {
            return Err(bad("a context's doorbell header is outside guest RAM"));
        }
    }
    for (_, c) in res.cqs.iter() {
        db_record(ram, c.db_gpa)?;
        list(&c.ring)?;
    }
    for (_, s) in res.srqs.iter() {
        db_record(ram, s.db_gpa)?;
        list(&s.ring)?;
    }
    for (_, q) in res.qps.iter().filter(|(_, q)| q.qp_type != QpType::XRC_TGT) {
        db_record(ram, q.db_gpa)?;
        list(&q.ring)?;
    }
    for (_, m) in res.mrs.iter() {
        list(&m.pages)?;
    }
    Ok(())
}

/// Puts the doorbell pages and slots of a state handed over (spec 20.7)
/// in place in `res`, built by [`objects`] from the same state, claiming
/// them from `pages`: the allocation state over the region that came with
/// the state, whose contents (the guest's producer indices) stay as they
/// are. Refused: a page at or above `max_ctx`, a page or slot given twice,
/// a queue whose context has no page, a handle that names no live object.
/// On a refusal the caller drops `res` and `pages`.
pub fn doorbells(
    saved: &DoorbellsState,
    res: &mut VmResources,
    mut pages: DoorbellPages,
    max_ctx: u32,
) -> Result<(), MigrationError> {
    let usable = max_ctx.min(pages.region().pages());
    for &(h, page) in &saved.pages {
        let ctx = res
            .ctxs
            .get_mut(h)
            .ok_or_else(|| bad("a doorbell page of no live context"))?;
        if page >= usable {
            return Err(bad(format!(
                "doorbell page {page}, this instance has {usable}"
            )));
        }
        if ctx.db_page.is_some() || !pages.claim_page(page) {
            return Err(bad(format!("doorbell page {page} given twice")));
        }
        ctx.db_page = Some(page);
    }
    for &(h, slot) in &saved.qp_slots {
        let qp = res
            .qps
            .get(h)
            .ok_or_else(|| bad("a doorbell slot of no live QP"))?;
        let db = claim_queue_slot(res, &mut pages, qp.ctx, slot)?;
        if res
            .qps
            .get_mut(h)
            .and_then(|q| q.db_slot.replace(db))
            .is_some()
        {
            return Err(bad("a QP with two doorbell slots"));
        }
    }
    for &(h, slot) in &saved.srq_slots {
        let srq = res
            .srqs
            .get(h)
            .ok_or_else(|| bad("a doorbell slot of no live SRQ"))?;
        let db = claim_queue_slot(res, &mut pages, srq.ctx, slot)?;
        if res
            .srqs
            .get_mut(h)
            .and_then(|q| q.db_slot.replace(db))
            .is_some()
        {
            return Err(bad("an SRQ with two doorbell slots"));
        }
    }
    for &page in &saved.quarantined {
        if page >= usable || !pages.claim_quarantined(page) {
            return Err(bad(format!(
                "quarantined doorbell page {page} in use, given twice or past the pages"
            )));
        }
    }
    res.doorbells = Some(pages);
    Ok(())
}

/// Claims `slot` in the page of context `ctx` for one of its queues.
fn claim_queue_slot(
    res: &VmResources,
    pages: &mut DoorbellPages,
    ctx: u32,
    slot: u32,
) -> Result<crate::shmem::DbSlot, MigrationError> {
    let page = res
        .ctxs
        .get(ctx)
        .and_then(|c| c.db_page)
        .ok_or_else(|| bad("a queue's slot in a context without a page"))?;
    pages.claim_slot(page, slot).ok_or_else(|| {
        bad(format!(
            "doorbell slot {slot} of page {page} given twice or past the page"
        ))
    })
}
