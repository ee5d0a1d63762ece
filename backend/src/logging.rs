//! Log output: env_logger's text lines (the default) or JSON lines for log
//! collectors. `RUST_LOG` filters both (default `info`).
//!
//! A JSON line has `ts` (RFC 3339, UTC), `level`, `target`, `message`, and
//! the record's key-values (`vm`, `tenant`, ...). Messages about one VM
//! carry `vm` and `tenant` either as key-values (`info!(vm = name; ...)`) or
//! by starting with `VM <index>: `; the index is turned into the names
//! [`register_vms`] recorded.
//!
//! The JSON lines are our own formatter on env_logger's format hook (some
//! 70 lines; serde_json does the escaping), not a crate: env_logger
//! already gives the `RUST_LOG` filter and the timestamp, and what is left
//! is the field order and the `VM <index>: ` lookup, which no logging
//! crate knows. The JSON layers on offer (`tracing-subscriber`'s `json`,
//! for one) would mean moving every call site from `log` to `tracing` and
//! bringing that stack in, for the same lines.

use std::io::Write;
use std::sync::RwLock;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::sync::{read, write};
use crate::tenancy::Tenancy;

/// Format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (env_logger's format; key-values appended).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Names of the VMs (and their tenants) by index, for JSON log lines.
static VM_NAMES: RwLock<Vec<(String, String)>> = RwLock::new(Vec::new());

/// Records the names of the daemon's VMs and tenants so that messages
/// starting with `VM <index>: ` get `vm` and `tenant` fields (one daemon per
/// process: the last one started names them).
pub fn register_vms(tenancy: &Tenancy) {
    let names = tenancy
        .vms()
        .iter()
        .map(|v| {
            let tenant = tenancy
                .tenants()
                .get(v.tenant)
                .map(|t| t.name.clone())
                .unwrap_or_default();
            (v.name.clone(), tenant)
        })
        .collect();
    *write(&VM_NAMES) = names;
}

/// The VM index of a message that starts with `VM <index>: `.
fn vm_prefix(message: &str) -> Option<usize> {
    let rest = message.strip_prefix("VM ")?;
    let end = rest.find(':')?;
    rest.get(..end)?.parse().ok()
}

/// Collects a record's key-values into a JSON object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl<'kvs> log::kv::VisitSource<'kvs> for Fields<'_> {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        let v = if let Some(n) = value.to_u64() {
            Value::from(n)
        } else if let Some(n) = value.to_i64() {
            Value::from(n)
        } else if let Some(b) = value.to_bool() {
            Value::from(b)
        } else {
            Value::from(value.to_string())
        };
        self.0.insert(key.as_str().to_string(), v);
        Ok(())
    }
}

/// The JSON object of one record (without the timestamp).
pub fn json_fields(record: &log::Record<'_>) -> Map<String, Value> {
    let mut m = Map::new();
    let message = record.args().to_string();
    m.insert("level".into(), Value::from(record.level().as_str()));
    m.insert("target".into(), Value::from(record.target()));
    let mut kv = Map::new();
    // Visiting never fails (the visitor does not).
    let _ = record.key_values().visit(&mut Fields(&mut kv));
    if !kv.contains_key("vm") {
        if let Some(i) = vm_prefix(&message) {
            let names = read(&VM_NAMES);
            if let Some((vm, tenant)) = names.get(i) {
                kv.insert("vm".into(), Value::from(vm.as_str()));
                kv.entry("tenant")
                    .or_insert_with(|| Value::from(tenant.as_str()));
            }
        }
    }
    m.insert("message".into(), Value::from(message));
    for (k, v) in kv {
        // Key-values never replace the fixed fields.
        m.entry(k).or_insert(v);
    }
    m
}

/// One JSON log line (without the newline): `ts`, `level`, `target`,
/// `message` first, then the key-values in name order.
pub fn json_line(ts: &str, record: &log::Record<'_>) -> String {
    let mut m = json_fields(record);
    let mut line = format!("{{\"ts\":{}", Value::from(ts));
    for key in ["level", "target", "message"] {
        if let Some(v) = m.remove(key) {
            line.push_str(&format!(",\"{key}\":{v}"));
        }
    }
    for (k, v) in m {
        line.push_str(&format!(",{}:{v}", Value::from(k)));
    }
    line.push('}');
    line
}

/// Installs the global logger writing `format` lines to stderr, filtered
/// by `RUST_LOG` (default `info`). Does nothing if a logger is installed.
pub fn init(format: LogFormat) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if format == LogFormat::Json {
        b.format(|buf, record| {
            let ts = buf.timestamp_micros().to_string();
            writeln!(buf, "{}", json_line(&ts, record))
        });
    }
    let _ = b.try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DaemonConfig, TenantConfig};

    #[test]
    fn json_fields_from_key_values_and_prefix() {
        let mut c = DaemonConfig::new(vec!["/a".into(), "/b".into()]);
        c.tenants.push(TenantConfig {
            nic_share: 1,
            name: "red".into(),
            qos_class: None,
            engine: None,
            remote_gids: Vec::new(),
            fabric: Default::default(),
        });
        c.vms[1].tenant = "red".into();
        c.vms[1].name = "web".into();
        register_vms(&Tenancy::from_config(&c));

        let kvs: [(&str, &str); 2] = [("vm", "x"), ("tenant", "t")];
        let r = log::Record::builder()
            .args(format_args!("QoS changed"))
            .level(log::Level::Info)
            .target("vhost_user_rdma::mgmt")
            .key_values(&kvs)
            .build();
        let m = json_fields(&r);
        assert_eq!(m["level"], "INFO");
        assert_eq!(m["target"], "vhost_user_rdma::mgmt");
        assert_eq!(m["message"], "QoS changed");
        assert_eq!(m["vm"], "x");
        assert_eq!(m["tenant"], "t");

        let r = log::Record::builder()
            .args(format_args!("VM 1: VMM connected (connection 3)"))
            .level(log::Level::Warn)
            .target("t")
            .build();
        let line = json_line("2026-01-01T00:00:00Z", &r);
        assert_eq!(
            line,
            r#"{"ts":"2026-01-01T00:00:00Z","level":"WARN","target":"t","message":"VM 1: VMM connected (connection 3)","tenant":"red","vm":"web"}"#
        );
        let m = json_fields(&r);
        assert_eq!(m["vm"], "web");
        assert_eq!(m["tenant"], "red");
        assert_eq!(m["level"], "WARN");

        // No VM 7, and a message that only looks like a prefix.
        for text in ["VM 7: gone", "VM x: no", "VMs: none"] {
            let m = json_fields(
                &log::Record::builder()
                    .args(format_args!("{text}"))
                    .level(log::Level::Info)
                    .build(),
            );
            assert!(!m.contains_key("vm"), "{text}");
        }
    }
}
