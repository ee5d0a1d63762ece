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

use crate::config::{gid_text, mac_text};
use crate::qos::{QosSpec, MAX_WEIGHT};
use crate::snapshot::{self, Totals, VmSnapshot};
use crate::stats::{HistogramSnapshot, LATENCY_BOUNDS_US};
use crate::sync::lock;
use crate::view::DaemonView;

/// Commands of the API.
pub const COMMANDS: [&str; 13] = [
    "ping",
    "version",
    "list_vms",
    "list_tenants",
    "list_engines",
    "vm_stats",
    "get_qos",
    "set_qos",
    "wire_qps",
    "move_record",
    "peer_hold",
    "peer_moved",
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

/// A move record as the API carries it: GIDs as text.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RecordWire {
    vm: String,
    from_gid: String,
    to_gid: String,
    qps: Vec<(u32, u32)>,
    rkeys: Vec<(u32, u32)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerHoldArgs {
    gid: String,
    qpns: Vec<u32>,
    /// How long at most, in milliseconds (default 30 000).
    ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerMovedArgs {
    record: RecordWire,
}

/// The longest hold a `peer_hold` may ask (the largest `pause_hold_ms`).
const MAX_HOLD_MS: u64 = 600_000;

fn parse_gid(text: &str) -> Result<[u8; 16], String> {
    crate::config_file::parse_gid(text)
        .ok_or_else(|| format!("{text:?} is not a GID (an IPv6 or IPv4 address)"))
}

/// Serializes read-modify-write QoS updates from concurrent connections.
static SET_QOS: Mutex<()> = Mutex::new(());

/// How long `set_qos` waits for the engine to enforce a change before it
/// replies with `"applied": false` (the change still applies once the
/// engine runs).
const SYNC_QOS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

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
            let vms: Vec<Value> = snapshot::vms(view)
                .iter()
                .map(|s| vm_summary(view, s))
                .collect();
            Ok(one("vms", Value::from(vms)))
        }
        "list_tenants" => {
            args::<NoArgs>(obj, &cmd)?;
            let vms = snapshot::vms(view);
            let t: Vec<Value> = snapshot::tenant_totals(view, &vms)
                .iter()
                .enumerate()
                .map(|(i, sums)| tenant_summary(view, i, &vms, sums))
                .collect();
            Ok(one("tenants", Value::from(t)))
        }
        "list_engines" => {
            args::<NoArgs>(obj, &cmd)?;
            let e: Vec<Value> = view
                .engine_stats()
                .iter()
                .map(|e| {
                    json!({
                        "index": e.index,
                        "cpu": e.cpu,
                        "vms": e.vms,
                        "wqes": e.wqes,
                        "bytes": e.bytes,
                        "parks": e.parks,
                        "vm_parks": e.vm_parks,
                        "peeked": e.peeked,
                        "late_kicks": e.late_kicks,
                        "anticipated": e.anticipated,
                        "poll_window_us": e.poll_window_us,
                    })
                })
                .collect();
            Ok(one("engines", Value::from(e)))
        }
        "vm_stats" => {
            let a: VmArg = args(obj, &cmd)?;
            let i = resolve_vm(view, &a.vm)?;
            let s = snapshot::vm(view, i).ok_or("no such VM")?;
            Ok(vm_stats(&s))
        }
        "get_qos" => {
            let a: QosTarget = args(obj, &cmd)?;
            get_qos(view, a)
        }
        "set_qos" => {
            let a: SetQosArgs = args(obj, &cmd)?;
            set_qos(view, a)
        }
        "wire_qps" => {
            let a: VmArg = args(obj, &cmd)?;
            let i = resolve_vm(view, &a.vm)?;
            let w = view
                .wire_qps(i)
                .ok_or("wire_qps: this RNIC's QP numbers never leave the daemon")?;
            let mut m = one("gid", Value::from(gid_text(w.gid)));
            m.insert("qps".into(), json!(w.qps));
            Ok(m)
        }
        "move_record" => {
            let a: VmArg = args(obj, &cmd)?;
            let i = resolve_vm(view, &a.vm)?;
            let r = view
                .move_record(i)
                .ok_or("move_record: no state from another host was loaded into this VM")?;
            let wire = RecordWire {
                vm: r.vm,
                from_gid: gid_text(r.from_gid),
                to_gid: gid_text(r.to_gid),
                qps: r.qps,
                rkeys: r.rkeys,
            };
            let v = serde_json::to_value(wire).map_err(|e| format!("move_record: {e}"))?;
            Ok(one("record", v))
        }
        "peer_hold" => {
            let a: PeerHoldArgs = args(obj, &cmd)?;
            let gid = parse_gid(&a.gid)?;
            let ms = a.ms.unwrap_or(30_000);
            if ms > MAX_HOLD_MS || a.qpns.is_empty() {
                return Err(format!(
                    "peer_hold: ms at most {MAX_HOLD_MS}, and at least one QP number"
                ));
            }
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            let n = view.peer_hold(gid, &a.qpns, until);
            info!(
                "mgmt: peer_hold {} QPs of {}: {n} connections held",
                a.qpns.len(),
                a.gid
            );
            Ok(one("held", Value::from(n)))
        }
        "peer_moved" => {
            let a: PeerMovedArgs = args(obj, &cmd)?;
            let r = a.record;
            let record = crate::relocation::MoveRecord {
                vm: r.vm,
                from_gid: parse_gid(&r.from_gid)?,
                to_gid: parse_gid(&r.to_gid)?,
                qps: r.qps,
                rkeys: r.rkeys,
            };
            let n = view
                .peer_moved(&record)
                .map_err(|e| format!("peer_moved: {e}"))?;
            Ok(one("repointed", Value::from(n)))
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

/// Counters as a JSON object, by their names.
fn counters_json<const N: usize>(fields: [(&'static str, u64); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect(),
    )
}

/// A VM's part of the host: per line (`maps`, `qp`, ...) its configured,
/// share, effective and used values.
fn host_json(h: &crate::rnic_objects::HostUsage) -> Value {
    Value::Object(
        h.rows
            .iter()
            .map(|r| {
                (
                    r.kind.to_string(),
                    json!({
                        "configured": r.configured,
                        "share": r.share,
                        "effective": r.effective,
                        "used": r.used,
                    }),
                )
            })
            .collect(),
    )
}

fn histogram_json(h: &HistogramSnapshot) -> Value {
    json!({
        "bounds_us": LATENCY_BOUNDS_US.to_vec(),
        "buckets": h.buckets.to_vec(),
        "count": h.count,
        "sum_ns": h.sum_ns,
    })
}

fn vm_summary(view: &DaemonView, s: &VmSnapshot) -> Value {
    json!({
        "index": s.index,
        "name": s.name,
        "tenant": s.tenant_name,
        // The first GID the operator gave it, and its whole table
        // (index, GID) with the default GID of ABI version 3 at index 0.
        "gid": view.tenancy().vm(s.index).map(|v| gid_text(v.gids.primary())),
        "gids": view.tenancy().vm(s.index).map(|v| {
            v.gids
                .iter()
                .map(|(i, g)| json!({"index": i, "gid": gid_text(g)}))
                .collect::<Vec<_>>()
        }),
        "abi": view.tenancy().vm(s.index).map(|v| v.abi),
        // The guest interface its port is paired with; null: none.
        "mac": view.tenancy().vm(s.index).and_then(|v| v.mac).map(mac_text),
        "socket": view.vm_socket(s.index).map(|p| p.display().to_string()),
        "engine": view.engine_of(s.index),
        "connected": s.stats.connected,
        "connections": s.stats.connections,
        "stale_ms": s.stats.stale_ms,
        "resources": counters_json(s.stats.device.resources.fields()),
        "qos": s.qos.as_ref().map(qos_json),
    })
}

fn tenant_summary(view: &DaemonView, t: usize, vms: &[VmSnapshot], sums: &Totals) -> Value {
    let entry = view.tenancy().tenants().get(t);
    let names: Vec<&str> = vms
        .iter()
        .filter(|v| v.tenant == t)
        .map(|v| v.name.as_str())
        .collect();
    json!({
        "index": t,
        "name": entry.map(|e| e.name.clone()),
        "qos_class": entry.and_then(|e| e.qos_class.clone()),
        // The engine thread of its VMs (all share one); none without VMs.
        "engine": vms.iter().find(|v| v.tenant == t).map(|v| view.engine_of(v.index)),
        "vms": names,
        "connected_vms": sums.connected,
        "qos": view.qos().tenant(t).map(|q| qos_json(&q)),
        "resources": counters_json(sums.resources.fields()),
        "traffic": counters_json(sums.traffic.fields()),
        "isolation": counters_json(sums.isolation.fields()),
        "ctrl_latency": histogram_json(&sums.traffic.ctrl_latency),
    })
}

fn vm_stats(s: &VmSnapshot) -> Map<String, Value> {
    let d = &s.stats.device;
    let v = json!({
        "vm": s.name,
        "index": s.index,
        "tenant": s.tenant_name,
        "connected": s.stats.connected,
        "connections": s.stats.connections,
        "stale_ms": s.stats.stale_ms,
        "resources": counters_json(d.resources.fields()),
        "ctrl": counters_json(d.ctrl.fields()),
        "events_lost": d.events_lost,
        "queues": counters_json(d.queues.fields()),
        "traffic": counters_json(s.traffic.fields()),
        "isolation": counters_json(s.isolation.fields()),
        "ctrl_latency": histogram_json(&s.traffic.ctrl_latency),
        "qos": s.qos.as_ref().map(qos_json),
        "host_quota": s.host.as_ref().map(host_json),
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
    let _guard = lock(&SET_QOS);
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
    // The reply means "in force": work posted after it runs under the new
    // settings. Only a stopped or CPU-starved engine takes longer.
    let applied = view.sync_qos(SYNC_QOS_TIMEOUT);
    let mut m = qos_reply(view, &of, &new);
    m.insert("applied".into(), Value::from(applied));
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
