//! A VM's objects put together from a loaded device state (spec 20.5):
//! the tables come in as saved, every field this module derives from them
//! (reference counts, key maps, registered and host bytes) is computed
//! here as the `insert_*` functions would have left it, never read from
//! the state.

use virtio_rdma_abi::qp::QpType;

use super::handle::HandleTable;
use super::{inc, Ah, Context, Cq, HostCost, Mr, Mw, Pd, Qp, Srq, VmResources, Xrcd};

/// The handle tables of a loaded state, each object checked by itself and
/// against the others' handles by the caller.
pub struct Tables {
    /// Contexts.
    pub ctxs: HandleTable<Context>,
    /// Protection domains.
    pub pds: HandleTable<Pd>,
    /// Completion queues.
    pub cqs: HandleTable<Cq>,
    /// Memory regions.
    pub mrs: HandleTable<Mr>,
    /// Memory windows.
    pub mws: HandleTable<Mw>,
    /// Queue pairs.
    pub qps: HandleTable<Qp>,
    /// Address handles.
    pub ahs: HandleTable<Ah>,
    /// Shared receive queues.
    pub srqs: HandleTable<Srq>,
    /// XRC domains.
    pub xrcds: HandleTable<Xrcd>,
}

fn prefix(key: u32) -> u32 {
    key.checked_shr(8).unwrap_or(0)
}

impl VmResources {
    /// VM `vm`'s objects from `t`, with host budget `budget`; the
    /// multicast groups and the GSI QP as saved. Refuses two objects with
    /// one key or SRQ number, and objects that hold more host memory than
    /// the budget.
    pub fn assemble(
        vm: usize,
        budget: u64,
        t: Tables,
        mcast: super::mcast::Groups,
        gsi: Option<u32>,
    ) -> Result<Self, String> {
        let mut r = VmResources::new(vm, budget);
        r.ctxs = t.ctxs;
        r.pds = t.pds;
        r.cqs = t.cqs;
        r.mrs = t.mrs;
        r.mws = t.mws;
        r.qps = t.qps;
        r.ahs = t.ahs;
        r.srqs = t.srqs;
        r.xrcds = t.xrcds;
        r.mcast = mcast;
        r.gsi = gsi;
        r.count_users();
        r.map_keys()?;
        let host: u64 = r
            .ctxs
            .iter()
            .map(|(_, o)| o.host_cost())
            .chain(r.pds.iter().map(|(_, o)| o.host_cost()))
            .chain(r.cqs.iter().map(|(_, o)| o.host_cost()))
            .chain(r.mrs.iter().map(|(_, o)| o.host_cost()))
            .chain(r.mws.iter().map(|(_, o)| o.host_cost()))
            .chain(r.qps.iter().map(|(_, o)| o.host_cost()))
            .chain(r.ahs.iter().map(|(_, o)| o.host_cost()))
            .chain(r.srqs.iter().map(|(_, o)| o.host_cost()))
            .chain(r.xrcds.iter().map(|(_, o)| o.host_cost()))
            .fold(0u64, u64::saturating_add);
        if host > budget {
            return Err(format!(
                "the objects hold {host} bytes of host memory, the budget is {budget}"
            ));
        }
        r.host_bytes = host;
        Ok(r)
    }

    /// These objects as VM `vm`'s (a state moved back to the instance it
    /// was saved from, spec 20.5): the same handles, another owner.
    pub fn rehomed(mut self, vm: usize) -> Self {
        self.vm = vm;
        self
    }

    /// The QP numbers (but the GSI QP's) and XRC SRQ numbers of the
    /// objects, as the RNIC has them.
    pub fn numbers(&self) -> (Vec<u32>, Vec<u32>) {
        let qpns = self
            .qps
            .iter()
            .filter(|(_, q)| q.qp_type != QpType::GSI)
            .map(|(_, q)| q.qpn)
            .collect();
        let srqns = self
            .srqs
            .iter()
            .filter_map(|(_, s)| s.xrc.map(|x| x.srqn))
            .collect();
        (qpns, srqns)
    }

    /// The reference counts the `insert_*` functions keep.
    fn count_users(&mut self) {
        let mut pd_users: Vec<u32> = Vec::new();
        let mut cq_users: Vec<u32> = Vec::new();
        let mut srq_users: Vec<u32> = Vec::new();
        let mut xrcd_users: Vec<u32> = Vec::new();
        pd_users.extend(self.mrs.iter().map(|(_, m)| m.pd));
        pd_users.extend(self.mws.iter().map(|(_, w)| w.pd));
        pd_users.extend(self.ahs.iter().map(|(_, a)| a.pd));
        pd_users.extend(self.srqs.iter().map(|(_, s)| s.pd));
        for (_, q) in self.qps.iter() {
            pd_users.push(q.pd);
            cq_users.extend([q.send_cq, q.recv_cq]);
            if q.srq != 0 {
                srq_users.push(q.srq);
            }
            if q.qp_type == QpType::XRC_TGT {
                xrcd_users.push(q.xrcd);
            }
        }
        for (_, s) in self.srqs.iter() {
            if let Some(x) = s.xrc {
                xrcd_users.push(x.xrcd);
                cq_users.push(x.cq);
            }
        }
        for h in pd_users {
            if let Some(p) = self.pds.get_mut(h) {
                inc(&mut p.users);
            }
        }
        for h in cq_users {
            if let Some(c) = self.cqs.get_mut(h) {
                inc(&mut c.users);
            }
        }
        for h in srq_users {
            if let Some(s) = self.srqs.get_mut(h) {
                inc(&mut s.users);
            }
        }
        for h in xrcd_users {
            if let Some(x) = self.xrcds.get_mut(h) {
                inc(&mut x.users);
            }
        }
    }

    /// The key maps, SRQ numbers, bound windows and registered bytes.
    fn map_keys(&mut self) -> Result<(), String> {
        fn put(
            map: &mut crate::keys::KeyMap<u32>,
            key: u32,
            h: u32,
            what: &str,
        ) -> Result<(), String> {
            if map.insert(key, h).is_some() {
                return Err(format!("{what} {key:#x} is used twice"));
            }
            Ok(())
        }
        let mut registered = 0u64;
        for (h, m) in self.mrs.iter() {
            match m.fast {
                Some(f) => {
                    put(&mut self.fast_keys, prefix(m.lkey), h, "key prefix")?;
                    if f.valid {
                        put(&mut self.lkeys, m.lkey, h, "lkey")?;
                        put(&mut self.rkeys, m.lkey, h, "rkey")?;
                        registered = registered.saturating_add(m.length);
                    }
                }
                None => {
                    put(&mut self.lkeys, m.lkey, h, "lkey")?;
                    if m.rkey != 0 {
                        put(&mut self.rkeys, m.rkey, h, "rkey")?;
                    }
                    registered = registered.saturating_add(m.length);
                }
            }
        }
        for (h, w) in self.mws.iter() {
            put(&mut self.mw_keys, prefix(w.key), h, "window key prefix")?;
            if self.fast_keys.contains_key(&prefix(w.key)) {
                return Err(format!("window key {:#x} shares a region's prefix", w.key));
            }
            if let Some(b) = w.binding {
                let n = self.bound_windows.entry(b.mr).or_insert(0);
                inc(n);
            }
        }
        for (h, s) in self.srqs.iter() {
            if let Some(x) = s.xrc {
                put(&mut self.srqns, x.srqn, h, "SRQ number")?;
            }
        }
        self.registered_bytes = registered;
        Ok(())
    }
}
