//! The management API: one JSON request in, one JSON response out.
//!
//! A request is an object with `cmd` (the command), an optional `id`
//! (echoed in the response) and the command's arguments. A response is an
//! object with `ok`: `{"ok":true, ...}` or `{"ok":false,"error":"..."}`.
//! VMs and tenants are named by name (a string) or index (a number; a
//! string of digits that is no name is taken as an index too).

use std::sync::Mutex;

use log::info;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::config::gid_text;
use crate::qos::{QosSpec, MAX_WEIGHT};
use crate::resources::ResourceCounts;
use crate::server::DaemonView;
use crate::stats::{HistogramSnapshot, TrafficStats, LATENCY_BOUNDS_US};
use crate::tenancy::IsolationStats;

/// Commands of the API.
pub const COMMANDS: [&str; 8] = [
    "ping",
    "version",
    "list_vms",
    "list_tenants",
    "vm_stats",
    "get_qos",
    "set_qos",
    "help",
];

/// A VM or tenant: its name or index.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Target {
    /// By index.
    Index(u64),
    /// By name (or index as decimal text).
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmArg {
    vm: Target,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QosTarget {
    vm: Option<Target>,
    tenant: Option<Target>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetQosArgs {
    vm: Option<Target>,
    tenant: Option<Target>,
    weight: Option<u32>,
    bytes_per_sec: Option<u64>,
    ops_per_sec: Option<u64>,
    ctrl_per_sec: Option<u64>,
}

/// Serializes read-modify-write QoS updates from concurrent connections.
static SET_QOS: Mutex<()> = Mutex::new(());

type Reply = Result<Map<String, Value>, String>;

/// Answers one request line (without its newline); the answer is one line
/// of JSON without a newline.
pub fn handle_line(view: &DaemonView, line: &[u8]) -> String {
    let (id, result) = match serde_json::from_slice::<Value>(line) {
        Err(e) => (None, Err(format!("invalid JSON: {e}"))),
        Ok(Value::Object(mut obj)) => {
            let id = obj.remove("id");
            (id, dispatch(view, obj))
        }
        Ok(_) => (None, Err("a request must be a JSON object".to_string())),
    };
    let mut out = Map::new();
    match result {
        Ok(m) => {
            out.insert("ok".into(), Value::Bool(true));
            out.extend(m);
        }
        Err(e) => {
            out.insert("ok".into(), Value::Bool(false));
            out.insert("error".into(), Value::String(e));
        }
    }
    if let Some(id) = id {
        out.insert("id".into(), id);
    }
    serde_json::to_string(&Value::Object(out))
        .unwrap_or_else(|_| r#"{"ok":false,"error":"internal error"}"#.to_string())
}

fn args<T: for<'de> Deserialize<'de>>(obj: Map<String, Value>, cmd: &str) -> Result<T, String> {
    serde_json::from_value(Value::Object(obj)).map_err(|e| format!("{cmd}: {e}"))
}

fn dispatch(view: &DaemonView, mut obj: Map<String, Value>) -> Reply {
    let cmd = match obj.remove("cmd") {
        Some(Value::String(s)) => s,
        Some(_) => return Err("\"cmd\" must be a string".into()),
        None => return Err("missing \"cmd\"".into()),
    };
    match cmd.as_str() {
        "ping" => {
            args::<NoArgs>(obj, &cmd)?;
            Ok(one("pong", Value::Bool(true)))
        }
        "version" => {
            args::<NoArgs>(obj, &cmd)?;
            let mut m = one("name", Value::from(env!("CARGO_PKG_NAME")));
            m.insert("version".into(), Value::from(env!("CARGO_PKG_VERSION")));
            m.insert(
                "abi_version".into(),
                Value::from(virtio_rdma_abi::ABI_VERSION),
            );
            Ok(m)
        }
        "help" => {
            args::<NoArgs>(obj, &cmd)?;
            Ok(one("commands", Value::from(COMMANDS.to_vec())))
        }
        "list_vms" => {
            args::<NoArgs>(obj, &cmd)?;
            let vms: Vec<Value> = (0..view.vm_count()).map(|i| vm_summary(view, i)).collect();
            Ok(one("vms", Value::from(vms)))
        }
        "list_tenants" => {
            args::<NoArgs>(obj, &cmd)?;
            let n = view.tenancy().tenants().len();
            let t: Vec<Value> = (0..n).map(|i| tenant_summary(view, i)).collect();
            Ok(one("tenants", Value::from(t)))
        }
        "vm_stats" => {
            let a: VmArg = args(obj, &cmd)?;
            let i = resolve_vm(view, &a.vm)?;
            Ok(vm_stats(view, i))
        }
        "get_qos" => {
            let a: QosTarget = args(obj, &cmd)?;
            get_qos(view, a)
        }
        "set_qos" => {
            let a: SetQosArgs = args(obj, &cmd)?;
            set_qos(view, a)
        }
        other => Err(format!(
            "unknown command {other:?} (commands: {})",
            COMMANDS.join(", ")
        )),
    }
}

fn one(key: &str, v: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(key.into(), v);
    m
}

fn resolve(
    t: &Target,
    what: &str,
    count: usize,
    by_name: impl Fn(&str) -> Option<usize>,
) -> Result<usize, String> {
    let found = match t {
        Target::Index(i) => usize::try_from(*i).ok().filter(|&i| i < count),
        Target::Name(n) => by_name(n).or_else(|| n.parse::<usize>().ok().filter(|&i| i < count)),
    };
    found.ok_or_else(|| match t {
        Target::Index(i) => format!("no {what} with index {i}"),
        Target::Name(n) => format!("no {what} named {n:?}"),
    })
}

/// The index of VM `t`.
fn resolve_vm(view: &DaemonView, t: &Target) -> Result<usize, String> {
    let tn = view.tenancy();
    resolve(t, "VM", view.vm_count().min(tn.vms().len()), |n| {
        tn.vm_index(n)
    })
}

fn resolve_tenant(view: &DaemonView, t: &Target) -> Result<usize, String> {
    let tn = view.tenancy();
    resolve(t, "tenant", tn.tenants().len(), |n| tn.tenant_index(n))
}

fn tenant_name(view: &DaemonView, tenant: usize) -> String {
    view.tenancy()
        .tenants()
        .get(tenant)
        .map(|t| t.name.clone())
        .unwrap_or_default()
}

/// A QoS spec as JSON.
pub fn qos_json(q: &QosSpec) -> Value {
    json!({
        "weight": q.weight,
        "bytes_per_sec": q.bytes_per_sec,
        "ops_per_sec": q.ops_per_sec,
        "ctrl_per_sec": q.ctrl_per_sec,
    })
}

fn resources_json(r: &ResourceCounts) -> Value {
    json!({
        "ctx": r.ctx, "pd": r.pd, "cq": r.cq, "qp": r.qp, "mr": r.mr,
        "srq": r.srq, "ah": r.ah, "registered_bytes": r.registered_bytes,
    })
}

fn traffic_json(t: &TrafficStats) -> Value {
    json!({
        "send_ops": t.send_ops, "send_bytes": t.send_bytes,
        "recv_ops": t.recv_ops, "recv_bytes": t.recv_bytes,
        "error_cqes": t.error_cqes, "flushed": t.flushed, "drops": t.drops,
        "throttled": t.throttled, "ctrl_cmds": t.ctrl_cmds, "ctrl_errors": t.ctrl_errors,
    })
}

fn isolation_json(s: &IsolationStats) -> Value {
    json!({
        "denied": s.denied, "foreign_drops": s.foreign_drops, "foreign_rc": s.foreign_rc,
        "unknown_qpn": s.unknown_qpn, "bad_rkey": s.bad_rkey, "gid_spoof": s.gid_spoof,
    })
}

fn histogram_json(h: &HistogramSnapshot) -> Value {
    json!({
        "bounds_us": LATENCY_BOUNDS_US.to_vec(),
        "buckets": h.buckets.to_vec(),
        "count": h.count,
        "sum_ns": h.sum_ns,
    })
}

fn vm_summary(view: &DaemonView, i: usize) -> Value {
    let tn = view.tenancy();
    let Some(vm) = tn.vm(i) else {
        return Value::Null;
    };
    let st = view.vm_stats(i).unwrap_or_default();
    json!({
        "index": i,
        "name": vm.name,
        "tenant": tenant_name(view, vm.tenant),
        "gid": gid_text(vm.gid),
        "socket": view.vm_socket(i).map(|p| p.display().to_string()),
        "connected": st.connected,
        "connections": st.connections,
        "resources": resources_json(&st.device.resources),
        "qos": view.qos().vm(i).map(|q| qos_json(&q)),
    })
}

/// Sums of per-VM values over a tenant.
#[derive(Default)]
struct Sums {
    res: ResourceCounts,
    traffic: TrafficStats,
    iso: IsolationStats,
    connected: u64,
}

fn add_traffic(a: &mut TrafficStats, b: &TrafficStats) {
    a.send_ops += b.send_ops;
    a.send_bytes += b.send_bytes;
    a.recv_ops += b.recv_ops;
    a.recv_bytes += b.recv_bytes;
    a.error_cqes += b.error_cqes;
    a.flushed += b.flushed;
    a.drops += b.drops;
    a.throttled += b.throttled;
    a.ctrl_cmds += b.ctrl_cmds;
    a.ctrl_errors += b.ctrl_errors;
    for (x, y) in a
        .ctrl_latency
        .buckets
        .iter_mut()
        .zip(b.ctrl_latency.buckets)
    {
        *x += y;
    }
    a.ctrl_latency.count += b.ctrl_latency.count;
    a.ctrl_latency.sum_ns += b.ctrl_latency.sum_ns;
}

fn tenant_sums(view: &DaemonView, tenant: usize) -> (Vec<String>, Sums) {
    let mut s = Sums::default();
    let mut names = Vec::new();
    for (i, vm) in view.tenancy().vms().iter().enumerate() {
        if vm.tenant != tenant {
            continue;
        }
        names.push(vm.name.clone());
        let st = view.vm_stats(i).unwrap_or_default();
        let r = &st.device.resources;
        s.res.ctx += r.ctx;
        s.res.pd += r.pd;
        s.res.cq += r.cq;
        s.res.qp += r.qp;
        s.res.mr += r.mr;
        s.res.srq += r.srq;
        s.res.ah += r.ah;
        s.res.registered_bytes += r.registered_bytes;
        s.connected += u64::from(st.connected);
        add_traffic(&mut s.traffic, &vm.traffic.snapshot());
        let c = vm.counters.snapshot();
        s.iso.denied += c.denied;
        s.iso.foreign_drops += c.foreign_drops;
        s.iso.foreign_rc += c.foreign_rc;
        s.iso.unknown_qpn += c.unknown_qpn;
        s.iso.bad_rkey += c.bad_rkey;
        s.iso.gid_spoof += c.gid_spoof;
    }
    (names, s)
}

fn tenant_summary(view: &DaemonView, t: usize) -> Value {
    let Some(entry) = view.tenancy().tenants().get(t) else {
        return Value::Null;
    };
    let (vms, s) = tenant_sums(view, t);
    json!({
        "index": t,
        "name": entry.name,
        "qos_class": entry.qos_class,
        "vms": vms,
        "connected_vms": s.connected,
        "qos": view.qos().tenant(t).map(|q| qos_json(&q)),
        "resources": resources_json(&s.res),
        "traffic": traffic_json(&s.traffic),
        "isolation": isolation_json(&s.iso),
        "ctrl_latency": histogram_json(&s.traffic.ctrl_latency),
    })
}

fn vm_stats(view: &DaemonView, i: usize) -> Map<String, Value> {
    let tn = view.tenancy();
    let st = view.vm_stats(i).unwrap_or_default();
    let (name, tenant, traffic, iso) = match tn.vm(i) {
        Some(vm) => (
            vm.name.clone(),
            tenant_name(view, vm.tenant),
            vm.traffic.snapshot(),
            vm.counters.snapshot(),
        ),
        None => Default::default(),
    };
    let v = json!({
        "vm": name,
        "index": i,
        "tenant": tenant,
        "connected": st.connected,
        "connections": st.connections,
        "resources": resources_json(&st.device.resources),
        "ctrl": {
            "ok": st.device.ctrl.ok,
            "failed": st.device.ctrl.failed,
            "malformed": st.device.ctrl.malformed,
        },
        "events_lost": st.device.events_lost,
        "traffic": traffic_json(&traffic),
        "isolation": isolation_json(&iso),
        "ctrl_latency": histogram_json(&traffic.ctrl_latency),
        "qos": view.qos().vm(i).map(|q| qos_json(&q)),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Which QoS entry a request is about.
enum QosOf {
    Vm(usize),
    Tenant(usize),
}

fn qos_of(view: &DaemonView, vm: Option<Target>, tenant: Option<Target>) -> Result<QosOf, String> {
    match (vm, tenant) {
        (Some(v), None) => resolve_vm(view, &v).map(QosOf::Vm),
        (None, Some(t)) => resolve_tenant(view, &t).map(QosOf::Tenant),
        (Some(_), Some(_)) => Err("give either \"vm\" or \"tenant\", not both".into()),
        (None, None) => Err("give \"vm\" or \"tenant\"".into()),
    }
}

fn qos_reply(view: &DaemonView, of: &QosOf, spec: &QosSpec) -> Map<String, Value> {
    let mut m = match of {
        QosOf::Vm(i) => {
            let tn = view.tenancy();
            let mut m = one(
                "vm",
                Value::from(tn.vm(*i).map(|v| v.name.clone()).unwrap_or_default()),
            );
            let tenant = tn.tenant_of(*i).map(|t| tenant_name(view, t));
            m.insert("tenant".into(), Value::from(tenant));
            m
        }
        QosOf::Tenant(t) => one("tenant", Value::from(tenant_name(view, *t))),
    };
    m.insert("qos".into(), qos_json(spec));
    m
}

fn get_qos(view: &DaemonView, a: QosTarget) -> Reply {
    let of = qos_of(view, a.vm, a.tenant)?;
    let spec = match of {
        QosOf::Vm(i) => view.qos().vm(i),
        QosOf::Tenant(t) => view.qos().tenant(t),
    }
    .ok_or("no QoS settings")?;
    Ok(qos_reply(view, &of, &spec))
}

fn set_qos(view: &DaemonView, a: SetQosArgs) -> Reply {
    let of = qos_of(view, a.vm, a.tenant)?;
    if a.weight.is_none()
        && a.bytes_per_sec.is_none()
        && a.ops_per_sec.is_none()
        && a.ctrl_per_sec.is_none()
    {
        return Err(
            "set_qos: nothing to set (weight, bytes_per_sec, ops_per_sec, ctrl_per_sec)".into(),
        );
    }
    if let Some(w) = a.weight {
        if w == 0 || w > MAX_WEIGHT {
            return Err(format!(
                "set_qos: weight {w} is out of range (1..={MAX_WEIGHT})"
            ));
        }
    }
    let _guard = SET_QOS.lock().unwrap_or_else(|e| e.into_inner());
    let table = view.qos();
    let old = match of {
        QosOf::Vm(i) => table.vm(i),
        QosOf::Tenant(t) => table.tenant(t),
    }
    .ok_or("no QoS settings")?;
    let new = QosSpec {
        weight: a.weight.unwrap_or(old.weight),
        bytes_per_sec: a.bytes_per_sec.unwrap_or(old.bytes_per_sec),
        ops_per_sec: a.ops_per_sec.unwrap_or(old.ops_per_sec),
        ctrl_per_sec: a.ctrl_per_sec.unwrap_or(old.ctrl_per_sec),
    };
    match of {
        QosOf::Vm(i) => table.set_vm(i, new),
        QosOf::Tenant(t) => table.set_tenant(t, new),
    }
    .map_err(|e| format!("set_qos: {e}"))?;
    let mut m = qos_reply(view, &of, &new);
    let vm = m.get("vm").and_then(Value::as_str).unwrap_or("");
    let tenant = m.get("tenant").and_then(Value::as_str).unwrap_or("");
    let change = format!(
        "weight {} -> {}, bytes/s {} -> {}, ops/s {} -> {}, ctrl/s {} -> {}",
        old.weight,
        new.weight,
        old.bytes_per_sec,
        new.bytes_per_sec,
        old.ops_per_sec,
        new.ops_per_sec,
        old.ctrl_per_sec,
        new.ctrl_per_sec
    );
    match of {
        QosOf::Vm(_) => info!(vm = vm, tenant = tenant; "QoS of VM {vm} changed: {change}"),
        QosOf::Tenant(_) => info!(tenant = tenant; "QoS of tenant {tenant} changed: {change}"),
    }
    m.insert("previous".into(), qos_json(&old));
    Ok(m)
}
