//! The daemon's configuration file (`--config FILE`, TOML): daemon settings,
//! default limits, tenants and VMs. See `docs/vhost-user-rdma.example.toml`.
//!
//! Every error names the file and the line of the offending table or field
//! (`config.toml:14: VM "vm1": tenant "red" is not defined`); syntax and
//! type errors also name the column.
//!
//! Precedence of limits, lowest first: built-in defaults, `[defaults.limits]`,
//! the `--max-*` options of the command line, a VM's own `[vm.limits]`.

use std::fmt;
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;
use virtio_rdma_abi::config::{F_ATOMIC, F_GSI, F_SHMEM_DOORBELL, F_SRQ, F_UD};

use crate::config::{
    mac_text, parse_mac, ConfigError, DaemonConfig, FabricPolicy, FieldRule, LimitOverrides,
    Limits, MacError, TenantConfig, VmConfig, MAX_CTRL_POLL, MAX_ENGINE_THREADS,
};
use crate::qos::{QosClass, QosSpec};

/// Where in the file something is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loc {
    /// The file as named on the command line.
    pub file: String,
    /// 1-based line.
    pub line: usize,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A configuration file that cannot be used.
#[derive(Debug, Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, a wrong type, an unknown or missing field.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the TOML parser says.
        message: String,
    },
    /// A tenant name is not 1 to 32 of `a-z`, `0-9`, `_`, `-`.
    #[error("{at}: tenant name {name:?} is invalid (1 to 32 of a-z, 0-9, _ and -)")]
    BadTenantName {
        /// Its line.
        at: Loc,
        /// The name.
        name: String,
    },
    /// A VM name is not 1 to 32 of `a-z`, `0-9`, `_`, `-`.
    #[error("{at}: VM name {name:?} is invalid (1 to 32 of a-z, 0-9, _ and -)")]
    BadVmName {
        /// Its line.
        at: Loc,
        /// The name.
        name: String,
    },
    /// Two tenants have the same name.
    #[error("{at}: tenant {name:?} is already defined at line {first}")]
    DuplicateTenant {
        /// The second definition.
        at: Loc,
        /// The name.
        name: String,
        /// Line of the first definition.
        first: usize,
    },
    /// Two VMs have the same name.
    #[error("{at}: VM {name:?} is already defined at line {first}")]
    DuplicateVm {
        /// The second definition.
        at: Loc,
        /// The name.
        name: String,
        /// Line of the first definition.
        first: usize,
    },
    /// Two VMs have the same socket.
    #[error("{at}: VM {vm:?}: socket {socket:?} is already the socket of VM {other:?}")]
    DuplicateSocket {
        /// The second use.
        at: Loc,
        /// The VM.
        vm: String,
        /// The socket path.
        socket: String,
        /// The VM that has it already.
        other: String,
    },
    /// A VM names a tenant that is not defined.
    #[error("{at}: VM {vm:?}: tenant {tenant:?} is not defined")]
    UnknownTenant {
        /// The `tenant` field.
        at: Loc,
        /// The VM.
        vm: String,
        /// The tenant it names.
        tenant: String,
    },
    /// A standby VM (`standby_for`) names no VM it can stand in for, or
    /// gives what it takes from that VM.
    #[error("{at}: VM {vm:?}: {why}")]
    Standby {
        /// The `standby_for` field.
        at: Loc,
        /// The standby.
        vm: String,
        /// What is wrong.
        why: String,
    },
    /// A GID is not IPv6 (or IPv4) address text.
    #[error("{at}: VM {vm:?}: gid {text:?} is not an IPv6 or IPv4 address")]
    BadGid {
        /// The `gid` field or the entry of `gids`.
        at: Loc,
        /// The VM.
        vm: String,
        /// The text.
        text: String,
    },
    /// A tenant's rule for an address vector field is not a value, a list
    /// of values or "any", or names a value out of the field's range.
    #[error("{at}: tenant {tenant:?}: {key} = {text}: expected \"any\", a value or a list of values in 0..={max}")]
    BadFieldRule {
        /// The entry.
        at: Loc,
        /// The tenant.
        tenant: String,
        /// The key (`traffic_class`, `service_level`, `flow_label`).
        key: &'static str,
        /// What the file says.
        text: String,
        /// The field's largest value.
        max: u32,
    },
    /// A tenant's remote GID is not IPv6 (or IPv4) address text.
    #[error("{at}: tenant {tenant:?}: remote GID {text:?} is not an IPv6 or IPv4 address")]
    BadRemoteGid {
        /// The entry.
        at: Loc,
        /// The tenant.
        tenant: String,
        /// The text.
        text: String,
    },
    /// Two VMs (or one twice) would have the same GID.
    #[error("{at}: VM {vm:?}: GID {gid} is already a GID of VM {other:?}")]
    DuplicateGid {
        /// The `gid` or `gids` field (or the VM whose default GID
        /// collides).
        at: Loc,
        /// The VM.
        vm: String,
        /// The GID.
        gid: String,
        /// The VM that has it already.
        other: String,
    },
    /// A MAC address is not text of a unicast, non-zero address.
    #[error("{at}: VM {vm:?}: mac {text:?} {source}")]
    BadMac {
        /// The `mac` field.
        at: Loc,
        /// The VM.
        vm: String,
        /// The text.
        text: String,
        /// What is wrong.
        source: MacError,
    },
    /// Two VMs of one tenant have the same MAC address.
    #[error("{at}: VM {vm:?}: MAC address {mac} is already the MAC address of VM {other:?} in the same tenant")]
    DuplicateMac {
        /// The second `mac` field.
        at: Loc,
        /// The VM.
        vm: String,
        /// The address.
        mac: String,
        /// The VM of the same tenant that has it already.
        other: String,
    },
    /// `gid` and `gids` are both given.
    #[error("{at}: VM {vm:?}: give either gid or gids, not both")]
    GidAndGids {
        /// The `gids` field.
        at: Loc,
        /// The VM.
        vm: String,
    },
    /// A VM's `cm_listen` port is 0, listed twice, or another VM's
    /// ([`ConfigError::CmListen`]).
    #[error("{at}: {source}")]
    CmListen {
        /// The entry.
        at: Loc,
        /// What is wrong.
        source: Box<ConfigError>,
    },
    /// A VM's `abi` or GIDs break a rule of the configuration
    /// ([`ConfigError::BadAbi`], [`ConfigError::TooManyGids`]).
    #[error("{at}: {source}")]
    VmGids {
        /// The `abi` or `gids` field.
        at: Loc,
        /// What is wrong.
        source: Box<ConfigError>,
    },
    /// A limit is invalid.
    #[error("{at}: {context}: {source}")]
    Limit {
        /// The offending field (or its table).
        at: Loc,
        /// `[defaults.limits]` or `VM "vm0"`.
        context: String,
        /// What is wrong.
        source: Box<ConfigError>,
    },
    /// `engine_threads` is 0 or too large.
    #[error("{at}: engine_threads = {value} is out of range (1..={max})")]
    EngineThreads {
        /// The field.
        at: Loc,
        /// Its value.
        value: usize,
        /// Largest value.
        max: usize,
    },
    /// `engine_cpus` does not list one CPU per engine thread.
    #[error("{at}: engine_cpus lists {cpus} CPUs for {threads} engine threads (one each)")]
    EngineCpus {
        /// The field.
        at: Loc,
        /// CPUs listed.
        cpus: usize,
        /// `engine_threads`.
        threads: usize,
    },
    /// A tenant's `engine` names a thread that does not exist.
    #[error("{at}: tenant {tenant:?}: engine = {engine}, but there are {threads} engine threads (0..{threads})")]
    TenantEngine {
        /// The field.
        at: Loc,
        /// The tenant.
        tenant: String,
        /// Its `engine`.
        engine: usize,
        /// `engine_threads`.
        threads: usize,
    },
    /// `ctrl_poll_us` is too large.
    #[error("{at}: ctrl_poll_us = {value} is out of range (0..={max})")]
    CtrlPoll {
        /// The field.
        at: Loc,
        /// Its value.
        value: u64,
        /// Largest value.
        max: u64,
    },
    /// A QoS class name is not 1 to 32 of `a-z`, `0-9`, `_`, `-`.
    #[error("{at}: QoS class name {name:?} is invalid (1 to 32 of a-z, 0-9, _ and -)")]
    BadQosClassName {
        /// Its line.
        at: Loc,
        /// The name.
        name: String,
    },
    /// Two QoS classes have the same name.
    #[error("{at}: QoS class {name:?} is already defined at line {first}")]
    DuplicateQosClass {
        /// The second definition.
        at: Loc,
        /// The name.
        name: String,
        /// Line of the first definition.
        first: usize,
    },
    /// A QoS class has invalid settings.
    #[error("{at}: QoS class {name:?}: {source}")]
    QosClass {
        /// The offending field.
        at: Loc,
        /// The class.
        name: String,
        /// What is wrong.
        source: crate::qos::QosError,
    },
    /// A tenant or VM names a QoS class that is not defined.
    #[error("{at}: {owner}: QoS class {class:?} is not defined")]
    UnknownQosClass {
        /// The `qos_class` field.
        at: Loc,
        /// `tenant "blue"` or `VM "vm0"`.
        owner: String,
        /// The class it names.
        class: String,
    },
    /// `metrics_listen` is not a socket address.
    #[error("{at}: metrics_listen = {text:?} is not an address:port")]
    BadListen {
        /// The field.
        at: Loc,
        /// The text.
        text: String,
    },
    /// A `--max-*` option of the command line is invalid.
    #[error("command line: {0}")]
    Cli(Box<ConfigError>),
}

/// Generates the `limits` tables: every [`Limits`] field by its name (from
/// the list of limits in [`crate::config`]).
macro_rules! limits_table {
    ($($field:ident: $ty:ty),* $(,)?) => {
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct LimitsTable {
            $(#[serde(default)] $field: Option<Spanned<$ty>>,)*
        }

        impl LimitsTable {
            fn apply(&self, limits: &mut Limits) {
                $(if let Some(v) = &self.$field {
                    limits.$field = *v.get_ref();
                })*
            }

            fn span_of(&self, name: &str) -> Option<Range<usize>> {
                match name {
                    $(stringify!($field) => self.$field.as_ref().map(Spanned::span),)*
                    _ => None,
                }
            }
        }
    };
}

crate::config::limit_fields!(limits_table);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonTable {
    rnic: Option<crate::rnic_objects::RnicKind>,
    rnic_device: Option<String>,
    rnic_port: Option<u8>,
    gid_index: Option<u32>,
    ctrl_poll_us: Option<Spanned<u64>>,
    shmem_doorbell: Option<bool>,
    ud: Option<bool>,
    srq: Option<bool>,
    atomics: Option<bool>,
    gsi: Option<bool>,
    fence_elision: Option<bool>,
    allow_unsealed_memory: Option<bool>,
    engine_threads: Option<Spanned<usize>>,
    engine_cpus: Option<Spanned<Vec<usize>>>,
    mgmt_socket: Option<PathBuf>,
    handover_socket: Option<PathBuf>,
    metrics_listen: Option<Spanned<String>>,
    log_format: Option<crate::logging::LogFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QosClassTable {
    name: Spanned<String>,
    weight: Option<Spanned<u32>>,
    bytes_per_sec: Option<u64>,
    ops_per_sec: Option<u64>,
    ctrl_per_sec: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsTable {
    limits: Option<Spanned<LimitsTable>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantTable {
    name: Spanned<String>,
    qos_class: Option<Spanned<String>>,
    engine: Option<Spanned<usize>>,
    nic_share: Option<Spanned<u32>>,
    #[serde(default)]
    remote_gids: Vec<Spanned<String>>,
    traffic_class: Option<Spanned<RuleValue>>,
    service_level: Option<Spanned<RuleValue>>,
    flow_label: Option<Spanned<RuleValue>>,
}

/// A tenant's rule for an address vector field as written: a value
/// (forced), a list (allowed) or "any".
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RuleValue {
    Value(i64),
    List(Vec<i64>),
    Word(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmTable {
    name: Spanned<String>,
    socket: Spanned<PathBuf>,
    tenant: Spanned<String>,
    gid: Option<Spanned<String>>,
    gids: Option<Spanned<Vec<Spanned<String>>>>,
    abi: Option<Spanned<u32>>,
    mac: Option<Spanned<String>>,
    qos_class: Option<Spanned<String>>,
    cm_listen: Option<Spanned<Vec<Spanned<u16>>>>,
    limits: Option<Spanned<LimitsTable>>,
    standby_for: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTables {
    #[serde(default)]
    daemon: DaemonTable,
    #[serde(default)]
    defaults: DefaultsTable,
    #[serde(default)]
    qos_class: Vec<Spanned<QosClassTable>>,
    #[serde(default)]
    tenant: Vec<Spanned<TenantTable>>,
    #[serde(default)]
    vm: Vec<Spanned<VmTable>>,
}

/// A loaded configuration file.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The daemon configuration it describes (validated).
    pub config: DaemonConfig,
    /// Its default limits (with the command line's applied): the limits of
    /// VMs added on the command line.
    pub default_limits: Limits,
    /// `[daemon] log_format`, if given.
    pub log_format: Option<crate::logging::LogFormat>,
}

/// Reads and checks the configuration file `path`; `cli` are the `--max-*`
/// options, which replace the file's `[defaults.limits]`.
pub fn load(path: &Path, cli: &LimitOverrides) -> Result<LoadedConfig, FileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        file: file.clone(),
        source,
    })?;
    parse(&text, &file, cli)
}

/// Checks configuration `text`; `file` names it in errors.
pub fn parse(text: &str, file: &str, cli: &LimitOverrides) -> Result<LoadedConfig, FileError> {
    parse_embedded(text, file, cli, &Embedding::default())
}

/// How a configuration sits inside a larger document (the QoS lab's
/// scenarios): errors still name the document's lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct Embedding<'a> {
    /// Top-level tables that belong to the document, not to the daemon.
    pub foreign: &'a [&'a str],
    /// Where the VMs' sockets go: each VM's is `<dir>/<name>.sock`, and a
    /// VM that names a socket of its own is an error.
    pub socket_dir: Option<&'a Path>,
}

/// Checks the configuration in document `text` as `embedding` says;
/// `file` names it in errors.
pub fn parse_embedded(
    text: &str,
    file: &str,
    cli: &LimitOverrides,
    embedding: &Embedding<'_>,
) -> Result<LoadedConfig, FileError> {
    let parse_error = |e: toml::de::Error| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        FileError::Parse {
            file: file.into(),
            line,
            column,
            message: e.message().trim_end().to_string(),
        }
    };
    let mut root = toml::de::DeTable::parse(text).map_err(parse_error)?;
    for name in embedding.foreign {
        root.get_mut().remove(*name);
    }
    if let Some(dir) = embedding.socket_dir {
        place_sockets(root.get_mut(), dir).map_err(|(span, message)| {
            let (line, column) = line_col(text, span.start);
            FileError::Parse {
                file: file.into(),
                line,
                column,
                message,
            }
        })?;
    }
    let tables =
        FileTables::deserialize(toml::de::Deserializer::from(root)).map_err(parse_error)?;
    let src = Source {
        text,
        file,
        tables: &tables,
    };
    // In this order: tenants name QoS classes and engine threads, VMs
    // tenants, and VM limits start from the defaults.
    let mut config = DaemonConfig::new(Vec::new());
    src.daemon(&mut config)?;
    src.qos_classes(&mut config)?;
    let defaults = src.default_limits(cli)?;
    for (i, t) in tables.tenant.iter().enumerate() {
        let tenant = src.tenant(i, t, &config)?;
        config.tenants.push(tenant);
    }
    for (i, v) in tables.vm.iter().enumerate() {
        let vm = src.vm(i, v, &config, &defaults)?;
        config.vms.push(vm);
    }
    Ok(LoadedConfig {
        config,
        default_limits: defaults,
        log_format: tables.daemon.log_format,
    })
}

/// Gives every `[[vm]]` of `root` the socket `<dir>/<name>.sock`; the span
/// and message of a VM that has a socket already.
fn place_sockets(
    root: &mut toml::de::DeTable<'_>,
    dir: &Path,
) -> Result<(), (Range<usize>, String)> {
    use std::borrow::Cow;
    use toml::de::DeValue;
    let Some(vms) = root.get_mut("vm") else {
        return Ok(());
    };
    let DeValue::Array(vms) = vms.get_mut() else {
        // Not an array of tables: deserializing says so.
        return Ok(());
    };
    for vm in vms.iter_mut() {
        let span = vm.span();
        let DeValue::Table(t) = vm.get_mut() else {
            continue;
        };
        if let Some((key, _)) = t.get_key_value("socket") {
            return Err((
                key.span(),
                "`socket` is not set here: every VM's socket is made for the run".into(),
            ));
        }
        let Some(name) = t.get("name").and_then(|n| n.get_ref().as_str()) else {
            continue;
        };
        let path = dir.join(format!("{name}.sock")).display().to_string();
        t.insert(
            Spanned::new(span.clone(), Cow::Borrowed("socket")),
            Spanned::new(span, DeValue::String(Cow::Owned(path))),
        );
    }
    Ok(())
}

/// The parsed tables with the text they came from, to name lines in errors.
struct Source<'a> {
    text: &'a str,
    file: &'a str,
    tables: &'a FileTables,
}

impl Source<'_> {
    /// Where the text at `span` is.
    fn at(&self, span: Range<usize>) -> Loc {
        Loc {
            file: self.file.into(),
            line: line_col(self.text, span.start).0,
        }
    }

    /// `[daemon]`: device features, the RNIC, engine threads, interfaces.
    fn daemon(&self, config: &mut DaemonConfig) -> Result<(), FileError> {
        let d = &self.tables.daemon;
        if let Some(us) = &d.ctrl_poll_us {
            let poll = std::time::Duration::from_micros(*us.get_ref());
            if poll > MAX_CTRL_POLL {
                return Err(FileError::CtrlPoll {
                    at: self.at(us.span()),
                    value: *us.get_ref(),
                    max: u64::try_from(MAX_CTRL_POLL.as_micros()).unwrap_or(u64::MAX),
                });
            }
            config.ctrl_poll = poll;
        }
        for (on, bit) in [
            (d.shmem_doorbell, F_SHMEM_DOORBELL),
            (d.ud, F_UD),
            (d.srq, F_SRQ),
            (d.atomics, F_ATOMIC),
            (d.gsi, F_GSI),
        ] {
            if on == Some(false) {
                config.device_features &= !bit;
            }
        }
        if let Some(on) = d.fence_elision {
            config.fence_elision = on;
        }
        if let Some(on) = d.allow_unsealed_memory {
            config.allow_unsealed_memory = on;
        }
        if let Some(kind) = d.rnic {
            config.rnic = kind;
        }
        if let Some(dev) = &d.rnic_device {
            config.verbs.device = Some(dev.clone());
        }
        if let Some(p) = d.rnic_port {
            config.verbs.port = p;
        }
        if let Some(g) = d.gid_index {
            config.verbs.gid_index = g;
        }
        if let Some(n) = &d.engine_threads {
            let value = *n.get_ref();
            if value == 0 || value > MAX_ENGINE_THREADS {
                return Err(FileError::EngineThreads {
                    at: self.at(n.span()),
                    value,
                    max: MAX_ENGINE_THREADS,
                });
            }
            config.engine_threads = value;
        }
        if let Some(cpus) = &d.engine_cpus {
            if cpus.get_ref().len() != config.engine_threads {
                return Err(FileError::EngineCpus {
                    at: self.at(cpus.span()),
                    cpus: cpus.get_ref().len(),
                    threads: config.engine_threads,
                });
            }
            config.engine_cpus = cpus.get_ref().clone();
        }
        config.mgmt_socket = d.mgmt_socket.clone();
        config.handover_socket = d.handover_socket.clone();
        if let Some(l) = &d.metrics_listen {
            let addr = l.get_ref().parse().map_err(|_| FileError::BadListen {
                at: self.at(l.span()),
                text: l.get_ref().clone(),
            })?;
            config.metrics_listen = Some(addr);
        }
        Ok(())
    }

    /// `[[qos_class]]`: unique valid names, valid specifications.
    fn qos_classes(&self, config: &mut DaemonConfig) -> Result<(), FileError> {
        let classes = &self.tables.qos_class;
        for (i, c) in classes.iter().enumerate() {
            let ct = c.get_ref();
            let name = ct.name.get_ref();
            if !valid_name(name) {
                return Err(FileError::BadQosClassName {
                    at: self.at(ct.name.span()),
                    name: name.clone(),
                });
            }
            if let Some(first) = classes[..i]
                .iter()
                .find(|o| o.get_ref().name.get_ref() == name)
            {
                return Err(FileError::DuplicateQosClass {
                    at: self.at(ct.name.span()),
                    name: name.clone(),
                    first: self.at(first.get_ref().name.span()).line,
                });
            }
            let d = QosSpec::default();
            let spec = QosSpec {
                weight: ct.weight.as_ref().map_or(d.weight, |w| *w.get_ref()),
                bytes_per_sec: ct.bytes_per_sec.unwrap_or(0),
                ops_per_sec: ct.ops_per_sec.unwrap_or(0),
                ctrl_per_sec: ct.ctrl_per_sec.unwrap_or(d.ctrl_per_sec),
            };
            if let Err(source) = spec.validate() {
                let span = ct.weight.as_ref().map_or_else(|| c.span(), Spanned::span);
                return Err(FileError::QosClass {
                    at: self.at(span),
                    name: name.clone(),
                    source,
                });
            }
            config.qos_classes.push(QosClass {
                name: name.clone(),
                spec,
            });
        }
        Ok(())
    }

    /// The QoS class `c` that `owner` names, which the file must define.
    fn class_of(
        &self,
        c: &Option<Spanned<String>>,
        owner: String,
    ) -> Result<Option<String>, FileError> {
        let Some(c) = c else {
            return Ok(None);
        };
        let name = c.get_ref();
        if !self
            .tables
            .qos_class
            .iter()
            .any(|q| q.get_ref().name.get_ref() == name)
        {
            return Err(FileError::UnknownQosClass {
                at: self.at(c.span()),
                owner,
                class: name.clone(),
            });
        }
        Ok(Some(name.clone()))
    }

    /// The default limits: built-in, then `[defaults.limits]`, then the
    /// command line's `cli`; an invalid value names its origin.
    fn default_limits(&self, cli: &LimitOverrides) -> Result<Limits, FileError> {
        let mut defaults = Limits::default();
        let table = self.tables.defaults.limits.as_ref();
        if let Some(t) = table {
            t.get_ref().apply(&mut defaults);
        }
        cli.apply(&mut defaults);
        if let Err(e) = defaults.validate() {
            let field = e.limit_field().unwrap_or_default();
            if cli.is_set(&field) {
                return Err(FileError::Cli(Box::new(e)));
            }
            let span = table
                .and_then(|t| t.get_ref().span_of(&field).or(Some(t.span())))
                .unwrap_or(0..0);
            return Err(FileError::Limit {
                at: self.at(span),
                context: "[defaults.limits]".into(),
                source: Box::new(e),
            });
        }
        Ok(defaults)
    }

    /// `[[tenant]]` number `i`, checked against the tenants before it and
    /// the daemon settings of `config`.
    fn tenant(
        &self,
        i: usize,
        t: &Spanned<TenantTable>,
        config: &DaemonConfig,
    ) -> Result<TenantConfig, FileError> {
        let tt = t.get_ref();
        let name = tt.name.get_ref();
        if !valid_name(name) {
            return Err(FileError::BadTenantName {
                at: self.at(tt.name.span()),
                name: name.clone(),
            });
        }
        if let Some(first) = self.tables.tenant[..i]
            .iter()
            .find(|o| o.get_ref().name.get_ref() == name)
        {
            return Err(FileError::DuplicateTenant {
                at: self.at(tt.name.span()),
                name: name.clone(),
                first: self.at(first.get_ref().name.span()).line,
            });
        }
        if let Some(e) = tt
            .engine
            .as_ref()
            .filter(|e| *e.get_ref() >= config.engine_threads)
        {
            return Err(FileError::TenantEngine {
                at: self.at(e.span()),
                tenant: name.clone(),
                engine: *e.get_ref(),
                threads: config.engine_threads,
            });
        }
        let at = |span| self.at(span);
        Ok(TenantConfig {
            nic_share: tt.nic_share.as_ref().map_or(1, |s| *s.get_ref()),
            name: name.clone(),
            qos_class: self.class_of(&tt.qos_class, format!("tenant {name:?}"))?,
            engine: tt.engine.as_ref().map(|e| *e.get_ref()),
            remote_gids: tt
                .remote_gids
                .iter()
                .map(|g| {
                    parse_gid(g.get_ref()).ok_or_else(|| FileError::BadRemoteGid {
                        at: self.at(g.span()),
                        tenant: name.clone(),
                        text: g.get_ref().clone(),
                    })
                })
                .collect::<Result<_, _>>()?,
            fabric: FabricPolicy {
                traffic_class: field_rule(&tt.traffic_class, "traffic_class", 0xff, name, &at)?,
                service_level: field_rule(&tt.service_level, "service_level", 15, name, &at)?,
                flow_label: field_rule(&tt.flow_label, "flow_label", 0xf_ffff, name, &at)?,
            },
        })
    }

    /// `[[vm]]` number `i`, checked against the VMs before it (names,
    /// sockets, GIDs, MACs within a tenant) and the tenants of `config`;
    /// its limits start from `defaults`.
    fn vm(
        &self,
        i: usize,
        v: &Spanned<VmTable>,
        config: &DaemonConfig,
        defaults: &Limits,
    ) -> Result<VmConfig, FileError> {
        let vt = v.get_ref();
        let name = vt.name.get_ref();
        let before = &self.tables.vm[..i];
        if !valid_name(name) {
            return Err(FileError::BadVmName {
                at: self.at(vt.name.span()),
                name: name.clone(),
            });
        }
        if let Some(first) = before.iter().find(|o| o.get_ref().name.get_ref() == name) {
            return Err(FileError::DuplicateVm {
                at: self.at(vt.name.span()),
                name: name.clone(),
                first: self.at(first.get_ref().name.span()).line,
            });
        }
        if let Some(other) = before
            .iter()
            .find(|o| o.get_ref().socket.get_ref() == vt.socket.get_ref())
        {
            return Err(FileError::DuplicateSocket {
                at: self.at(vt.socket.span()),
                vm: name.clone(),
                socket: vt.socket.get_ref().display().to_string(),
                other: other.get_ref().name.get_ref().clone(),
            });
        }
        let tenant = vt.tenant.get_ref();
        if !config.tenants.iter().any(|t| &t.name == tenant) {
            return Err(FileError::UnknownTenant {
                at: self.at(vt.tenant.span()),
                vm: name.clone(),
                tenant: tenant.clone(),
            });
        }
        if let Some(p) = &vt.standby_for {
            return self.standby(vt, p, config);
        }
        let mac = self.vm_mac(vt, config)?;
        let gids = self.vm_gids(i, v, config, mac)?;
        let cm_listen = self.vm_cm_listen(i, vt, config)?;
        let mut limits = *defaults;
        if let Some(t) = &vt.limits {
            t.get_ref().apply(&mut limits);
        }
        if let Err(e) = limits.validate() {
            let field = e.limit_field().unwrap_or_default();
            let defaults_table = self.tables.defaults.limits.as_ref();
            let span = vt
                .limits
                .as_ref()
                .and_then(|t| t.get_ref().span_of(&field))
                .or_else(|| defaults_table.and_then(|t| t.get_ref().span_of(&field)))
                .or_else(|| vt.limits.as_ref().map(Spanned::span))
                .unwrap_or_else(|| v.span());
            return Err(FileError::Limit {
                at: self.at(span),
                context: format!("VM {name:?}"),
                source: Box::new(e),
            });
        }
        Ok(VmConfig {
            name: name.clone(),
            socket: vt.socket.get_ref().clone(),
            tenant: tenant.clone(),
            gids,
            abi: vt
                .abi
                .as_ref()
                .map_or(virtio_rdma_abi::ABI_VERSION, |a| *a.get_ref()),
            mac,
            limits,
            qos_class: self.class_of(&vt.qos_class, format!("VM {name:?}"))?,
            cm_listen,
            standby_for: None,
        })
    }

    /// A `[[vm]]` with `standby_for = "P"` (spec 20.5): VM P, listed
    /// before it, gives its tenant, GIDs, MAC, ABI version, limits and QoS
    /// class; the standby may not give them itself, nor `cm_listen`.
    fn standby(
        &self,
        vt: &VmTable,
        primary: &Spanned<String>,
        config: &DaemonConfig,
    ) -> Result<VmConfig, FileError> {
        let name = vt.name.get_ref().clone();
        let bad = |why: String| FileError::Standby {
            at: self.at(primary.span()),
            vm: name.clone(),
            why,
        };
        let given = [
            ("gid", vt.gid.is_some()),
            ("gids", vt.gids.is_some()),
            ("abi", vt.abi.is_some()),
            ("mac", vt.mac.is_some()),
            ("qos_class", vt.qos_class.is_some()),
            ("cm_listen", vt.cm_listen.is_some()),
            ("limits", vt.limits.is_some()),
        ];
        if let Some((field, _)) = given.iter().find(|(_, g)| *g) {
            return Err(bad(format!(
                "a standby takes `{field}` from the VM it stands in for; give it there"
            )));
        }
        let p = primary.get_ref();
        let Some(pi) = config.vms.iter().position(|o| &o.name == p) else {
            return Err(bad(format!(
                "standby_for {p:?}: no VM of that name before it"
            )));
        };
        let mut trial = config.clone();
        trial.add_standby(pi, vt.socket.get_ref().clone());
        let i = trial.vms.len() - 1;
        if let Some(s) = trial.vms.get_mut(i) {
            s.name = name.clone();
            s.tenant = vt.tenant.get_ref().clone();
        }
        trial.check_standby(i, p).map_err(|e| bad(e.to_string()))?;
        trial.vms.pop().ok_or_else(|| bad("no standby".into()))
    }

    /// VM `i`'s `cm_listen` ports, checked as the configuration checks
    /// them against the VMs before it (`config`), so that the error names
    /// the entry.
    fn vm_cm_listen(
        &self,
        i: usize,
        vt: &VmTable,
        config: &DaemonConfig,
    ) -> Result<Vec<u16>, FileError> {
        let Some(list) = &vt.cm_listen else {
            return Ok(Vec::new());
        };
        let ports: Vec<u16> = list.get_ref().iter().map(|p| *p.get_ref()).collect();
        let mut trial = config.clone();
        trial.vms.truncate(i);
        trial.add_default_vm(vt.socket.get_ref().clone(), Limits::default());
        if let Some(vm) = trial.vms.last_mut() {
            vm.name = vt.name.get_ref().clone();
            vm.cm_listen = ports.clone();
        }
        match trial.check_cm_listen(i) {
            Ok(()) => Ok(ports),
            Err(e) => {
                let port = match &e {
                    ConfigError::CmListen { port, .. } => *port,
                    _ => 0,
                };
                // The last entry with that port: the one that collides.
                let span = list
                    .get_ref()
                    .iter()
                    .rev()
                    .find(|p| *p.get_ref() == port)
                    .map_or_else(|| list.span(), Spanned::span);
                Err(FileError::CmListen {
                    at: self.at(span),
                    source: Box::new(e),
                })
            }
        }
    }

    /// VM `i`'s GIDs (`gids`, or `gid` as a list of one; none given:
    /// empty, the default), checked with its `abi` and `mac` as the
    /// configuration checks them: against the VMs before it (`config`),
    /// every entry of its table (the default GID of its MAC too).
    fn vm_gids(
        &self,
        i: usize,
        v: &Spanned<VmTable>,
        config: &DaemonConfig,
        mac: Option<[u8; 6]>,
    ) -> Result<Vec<[u8; 16]>, FileError> {
        let vt = v.get_ref();
        let name = vt.name.get_ref();
        if let (Some(_), Some(list)) = (&vt.gid, &vt.gids) {
            return Err(FileError::GidAndGids {
                at: self.at(list.span()),
                vm: name.clone(),
            });
        }
        let texts: Vec<&Spanned<String>> = match (&vt.gid, &vt.gids) {
            (Some(g), _) => vec![g],
            (None, Some(list)) => list.get_ref().iter().collect(),
            (None, None) => Vec::new(),
        };
        let gids = texts
            .iter()
            .map(|g| {
                parse_gid(g.get_ref()).ok_or_else(|| FileError::BadGid {
                    at: self.at(g.span()),
                    vm: name.clone(),
                    text: g.get_ref().clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The rules of `DaemonConfig::validate` on this VM and the ones
        // before it, so that the error can name its line.
        let mut trial = config.clone();
        trial.vms.push(VmConfig {
            name: name.clone(),
            socket: vt.socket.get_ref().clone(),
            tenant: vt.tenant.get_ref().clone(),
            gids: gids.clone(),
            abi: vt
                .abi
                .as_ref()
                .map_or(virtio_rdma_abi::ABI_VERSION, |a| *a.get_ref()),
            mac,
            limits: Limits::default(),
            qos_class: None,
            cm_listen: Vec::new(),
            standby_for: None,
        });
        let gids_span = || {
            vt.gid
                .as_ref()
                .map(Spanned::span)
                .or_else(|| vt.gids.as_ref().map(Spanned::span))
        };
        match trial.check_vm_gids(i) {
            Ok(()) => Ok(gids),
            Err(ConfigError::DuplicateGid { gid, other, .. }) => {
                // Point at an explicit GID: this VM's, else the other VM's.
                let other_span = || {
                    let j = self
                        .tables
                        .vm
                        .iter()
                        .position(|o| o.get_ref().name.get_ref() == &other)?;
                    let ot = self.tables.vm.get(j)?.get_ref();
                    ot.gid
                        .as_ref()
                        .map(Spanned::span)
                        .or_else(|| ot.gids.as_ref().map(Spanned::span))
                };
                let span = gids_span()
                    .or_else(|| vt.mac.as_ref().map(Spanned::span))
                    .or_else(other_span)
                    .unwrap_or_else(|| v.span());
                Err(FileError::DuplicateGid {
                    at: self.at(span),
                    vm: name.clone(),
                    gid,
                    other,
                })
            }
            Err(e) => {
                let span = match &e {
                    ConfigError::BadAbi { .. } => vt.abi.as_ref().map(Spanned::span),
                    _ => gids_span().or_else(|| vt.abi.as_ref().map(Spanned::span)),
                };
                Err(FileError::VmGids {
                    at: self.at(span.unwrap_or_else(|| v.span())),
                    source: Box::new(e),
                })
            }
        }
    }

    /// A VM's `mac`, if given: valid, and unique within its tenant.
    fn vm_mac(&self, vt: &VmTable, config: &DaemonConfig) -> Result<Option<[u8; 6]>, FileError> {
        let Some(m) = &vt.mac else {
            return Ok(None);
        };
        let name = vt.name.get_ref();
        let mac = parse_mac(m.get_ref()).map_err(|source| FileError::BadMac {
            at: self.at(m.span()),
            vm: name.clone(),
            text: m.get_ref().clone(),
            source,
        })?;
        let tenant = vt.tenant.get_ref();
        if let Some(other) = config
            .vms
            .iter()
            .find(|o| o.mac == Some(mac) && &o.tenant == tenant)
        {
            return Err(FileError::DuplicateMac {
                at: self.at(m.span()),
                vm: name.clone(),
                mac: mac_text(mac),
                other: other.name.clone(),
            });
        }
        Ok(Some(mac))
    }
}

/// Tenant and VM names: 1 to 32 of `a-z`, `0-9`, `_`, `-`.
fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A GID from IPv6 text; IPv4 text gives the IPv4-mapped GID.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    match text.trim().parse::<IpAddr>().ok()? {
        IpAddr::V6(a) => Some(a.octets()),
        IpAddr::V4(a) => Some(a.to_ipv6_mapped().octets()),
    }
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// A tenant's rule for address vector field `key` (values 0..=`max`) as
/// the file writes it, checked.
fn field_rule(
    v: &Option<Spanned<RuleValue>>,
    key: &'static str,
    max: u32,
    tenant: &str,
    at: &impl Fn(Range<usize>) -> Loc,
) -> Result<Option<FieldRule>, FileError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let bad = |text: String| FileError::BadFieldRule {
        at: at(v.span()),
        tenant: tenant.to_string(),
        key,
        text,
        max,
    };
    let value = |n: i64| {
        u32::try_from(n)
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| bad(n.to_string()))
    };
    Ok(Some(match v.get_ref() {
        RuleValue::Value(n) => FieldRule::Force(value(*n)?),
        RuleValue::List(list) if !list.is_empty() => {
            FieldRule::Allow(list.iter().map(|&n| value(n)).collect::<Result<_, _>>()?)
        }
        RuleValue::List(_) => return Err(bad("[]".into())),
        RuleValue::Word(w) if w == "any" => FieldRule::Any,
        RuleValue::Word(w) => return Err(bad(format!("{w:?}"))),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::gid_text;

    const GOOD: &str = r#"# example
[daemon]
ctrl_poll_us = 20
shmem_doorbell = false

[defaults.limits]
max_qp = 4096
max_mr_bytes = 1073741824

[[tenant]]
name = "blue"
qos_class = "gold"

[[tenant]]
name = "red"

[[vm]]
name = "vm0"
socket = "/run/a.sock"
tenant = "blue"
gid = "::ffff:10.99.0.7"
[vm.limits]
max_qp = 128

[[vm]]
name = "vm1"
socket = "/run/b.sock"
tenant = "red"
qos_class = "gold"

[[qos_class]]
name = "gold"
weight = 400
bytes_per_sec = 1000000000
"#;

    fn parse_str(text: &str) -> Result<LoadedConfig, FileError> {
        parse(text, "config.toml", &LimitOverrides::default())
    }

    fn err(text: &str) -> String {
        match parse_str(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    /// `GOOD` with `from` replaced by `to`.
    fn good_with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from}");
        GOOD.replacen(from, to, 1)
    }

    #[test]
    fn parses_a_full_file() {
        let l = parse_str(GOOD).unwrap();
        let c = &l.config;
        c.validate().unwrap();
        assert_eq!(c.ctrl_poll, std::time::Duration::from_micros(20));
        assert_eq!(c.device_features & F_SHMEM_DOORBELL, 0);
        assert_eq!(
            c.device_features & (F_UD | F_SRQ | F_ATOMIC),
            F_UD | F_SRQ | F_ATOMIC
        );
        assert_eq!(l.default_limits.max_qp, 4096);
        assert_eq!(l.default_limits.max_mr_bytes, 1 << 30);
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(c.tenants[0].qos_class.as_deref(), Some("gold"));
        assert_eq!(c.tenants[1].qos_class, None);
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[0].name, "vm0");
        assert_eq!(c.vms[0].tenant, "blue");
        assert_eq!(c.vms[0].socket, PathBuf::from("/run/a.sock"));
        assert_eq!(c.vms[0].limits.max_qp, 128);
        assert_eq!(c.vms[0].limits.max_mr_bytes, 1 << 30);
        assert_eq!(gid_text(c.gid(0)), "::ffff:10.99.0.7");
        assert_eq!(c.vms[1].limits.max_qp, 4096);
        assert_eq!(c.vms[1].gids, Vec::<[u8; 16]>::new());
        assert_eq!(gid_text(c.gid(1)), "::ffff:10.42.0.2");
    }

    #[test]
    fn example_file_is_valid() {
        let text = include_str!("../../docs/vhost-user-rdma.example.toml");
        let l = parse_str(text).unwrap();
        l.config.validate().unwrap();
        assert_eq!(l.config.vms.len(), 3);
        // vm0, its standby, vm1.
        let standby = &l.config.vms[1];
        assert_eq!(standby.standby_for.as_deref(), Some("vm0"));
        assert_eq!(l.config.gid_table(1), l.config.gid_table(0));
        assert_eq!(l.config.vms[0].limits.max_qp, 128);
        assert_eq!(l.config.vms[2].limits.max_qp, 4096);
        assert_eq!(l.default_limits.max_host_bytes, 128 << 20);
        assert_eq!(l.config.vms[2].limits.max_host_bytes, 128 << 20);
        assert_eq!(l.config.vms[0].mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(l.config.vms[2].mac, None);
        assert_eq!(gid_text(l.config.gid(0)), "::ffff:10.42.0.1");
        assert_eq!(
            gid_text(l.config.gid_table(0).get(0).unwrap()),
            "fe80::5054:ff:fe00:1"
        );
        assert_eq!((l.config.vms[0].abi, l.config.vms[2].abi), (3, 3));
        assert_eq!(l.config.vms[0].cm_listen, [7174]);
    }

    /// The mapping limit and a tenant's share of the host NIC are read.
    #[test]
    fn host_mappings_and_nic_share_are_read() {
        let l = parse_str(
            "[defaults.limits]\nmax_host_mappings = 512\n[[tenant]]\nname = \"a\"\nnic_share = 3\n[[tenant]]\nname = \"b\"\n",
        )
        .unwrap();
        assert_eq!(l.default_limits.max_host_mappings, 512);
        let shares: Vec<u32> = l.config.tenants.iter().map(|t| t.nic_share).collect();
        assert_eq!(shares, [3, 1]);
    }

    #[test]
    fn host_bytes_budget_is_read_and_checked() {
        let l = parse_str("[defaults.limits]\nmax_host_bytes = 1048576\n").unwrap();
        assert_eq!(l.default_limits.max_host_bytes, 1 << 20);
        let bad = Limits {
            max_host_bytes: 4096,
            ..Limits::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(crate::config::ConfigError::LimitOutOfRange {
                name: "max-host-bytes",
                ..
            })
        ));
    }

    #[test]
    fn fabric_rules_are_read_and_checked() {
        let l = parse_str(
            "[[tenant]]\nname = \"blue\"\ntraffic_class = 96\nservice_level = [0, 3]\nflow_label = \"any\"\n\n[[tenant]]\nname = \"red\"\n",
        )
        .unwrap();
        let blue = &l.config.tenants[0].fabric;
        assert_eq!(blue.traffic_class, Some(FieldRule::Force(96)));
        assert_eq!(blue.service_level, Some(FieldRule::Allow(vec![0, 3])));
        assert_eq!(blue.flow_label, Some(FieldRule::Any));
        assert_eq!(l.config.tenants[1].fabric, FabricPolicy::default());
        for (line, want) in [
            ("traffic_class = 256", "traffic_class = 256"),
            ("service_level = 16", "service_level = 16"),
            ("service_level = [0, -1]", "service_level = -1"),
            ("flow_label = 1048576", "flow_label = 1048576"),
            ("flow_label = []", "flow_label = []"),
            ("traffic_class = \"all\"", "traffic_class = \"all\""),
        ] {
            let e = parse_str(&format!("[[tenant]]\nname = \"blue\"\n{line}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.contains("tenant \"blue\""),
                "{line}: {e}"
            );
        }
    }

    #[test]
    fn empty_file_has_defaults_and_no_vms() {
        let l = parse_str("").unwrap();
        assert!(l.config.vms.is_empty());
        assert_eq!(l.default_limits, Limits::default());
        assert_eq!(l.config.ctrl_poll, crate::config::DEFAULT_CTRL_POLL);
        assert_ne!(l.config.device_features & F_SHMEM_DOORBELL, 0);
    }

    #[test]
    fn cli_limits_override_defaults_but_not_vm_limits() {
        let cli = LimitOverrides {
            max_qp: Some(64),
            max_cq: Some(32),
            ..LimitOverrides::default()
        };
        let l = parse(GOOD, "c", &cli).unwrap();
        assert_eq!(l.default_limits.max_qp, 64);
        assert_eq!(l.config.vms[0].limits.max_qp, 128);
        assert_eq!(l.config.vms[1].limits.max_qp, 64);
        assert_eq!(l.config.vms[1].limits.max_cq, 32);
        let cli = LimitOverrides {
            max_cqe: Some(1000),
            ..LimitOverrides::default()
        };
        let e = parse(GOOD, "c", &cli).unwrap_err();
        assert!(matches!(e, FileError::Cli(_)), "{e}");
        assert!(e.to_string().starts_with("command line: max-cqe"), "{e}");
    }

    #[test]
    fn ipv4_and_plain_ipv6_gids() {
        let l = parse_str(&good_with("::ffff:10.99.0.7", "10.1.2.3")).unwrap();
        assert_eq!(gid_text(l.config.gid(0)), "::ffff:10.1.2.3");
        let l = parse_str(&good_with("::ffff:10.99.0.7", "fe80::1")).unwrap();
        assert_eq!(gid_text(l.config.gid(0)), "fe80::1");
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let e = err(&good_with("max_qp = 128", "max_qp = = 128"));
        assert!(e.starts_with("config.toml:23:"), "{e}");
    }

    #[test]
    fn unknown_field_has_line_and_column() {
        let e = err(&good_with("max_qp = 128", "max_qpp = 128"));
        assert!(
            e.starts_with("config.toml:23:1: unknown field `max_qpp`"),
            "{e}"
        );
        let e = err(&good_with("qos_class", "qos_klass"));
        assert!(
            e.starts_with("config.toml:12:1: unknown field `qos_klass`"),
            "{e}"
        );
        let e = err(&good_with("[daemon]", "[demon]"));
        assert!(e.starts_with("config.toml:2:"), "{e}");
        assert!(e.contains("unknown field `demon`"), "{e}");
    }

    #[test]
    fn wrong_type_and_missing_field() {
        let e = err(&good_with("max_qp = 128", "max_qp = \"many\""));
        assert!(e.starts_with("config.toml:23:10:"), "{e}");
        let e = err(&good_with("max_qp = 128", "max_qp = -1"));
        assert!(e.starts_with("config.toml:23:10:"), "{e}");
        let e = err(&good_with("tenant = \"red\"\n", ""));
        assert!(e.starts_with("config.toml:25:"), "{e}");
        assert!(e.contains("missing field `tenant`"), "{e}");
    }

    #[test]
    fn unknown_tenant() {
        let e = err(&good_with("tenant = \"red\"", "tenant = \"green\""));
        assert_eq!(
            e,
            "config.toml:28: VM \"vm1\": tenant \"green\" is not defined"
        );
    }

    #[test]
    fn engine_threads_and_tenant_placement() {
        // Tenants without `engine` take the threads in turn.
        let two = good_with("shmem_doorbell = false", "engine_threads = 2");
        let c = parse_str(&two).unwrap().config;
        c.validate().unwrap();
        assert_eq!(c.engine_thread_cpus(), vec![None, None]);
        assert_eq!(c.vm_engines(), vec![0, 1], "blue on 0, red on 1");
        // An explicit placement.
        let c = parse_str(&two.replacen("name = \"red\"", "name = \"red\"\nengine = 0", 1))
            .unwrap()
            .config;
        assert_eq!(c.vm_engines(), vec![0, 0]);
        // Errors name the line.
        let e = err(&two.replacen("name = \"red\"", "name = \"red\"\nengine = 2", 1));
        assert_eq!(
            e,
            "config.toml:16: tenant \"red\": engine = 2, but there are 2 engine threads (0..2)"
        );
        let e = err(&good_with("shmem_doorbell = false", "engine_threads = 0"));
        assert_eq!(
            e,
            "config.toml:4: engine_threads = 0 is out of range (1..=64)"
        );
        let e = err(&good_with(
            "shmem_doorbell = false",
            "engine_threads = 2\nengine_cpus = [1]",
        ));
        assert_eq!(
            e,
            "config.toml:5: engine_cpus lists 1 CPUs for 2 engine threads (one each)"
        );
        let e = err(&good_with("shmem_doorbell = false", "engine = 1"));
        assert!(e.contains("unknown field `engine`"), "{e}");
    }

    #[test]
    fn qos_classes_and_daemon_settings() {
        let l = parse_str(&good_with(
            "shmem_doorbell = false",
            "rnic = \"soft\"\nshmem_doorbell = false\nfence_elision = true\nengine_threads = 2\nengine_cpus = [1, 0]\nmgmt_socket = \"/run/m.sock\"\nhandover_socket = \"/run/h.sock\"\nmetrics_listen = \"127.0.0.1:9842\"\nlog_format = \"json\"",
        ))
        .unwrap();
        let c = &l.config;
        assert!(c.fence_elision);
        assert!(!parse_str(&good_with("", "")).unwrap().config.fence_elision);
        assert_eq!((c.engine_threads, &c.engine_cpus[..]), (2, &[1, 0][..]));
        assert_eq!(c.mgmt_socket.as_deref(), Some(Path::new("/run/m.sock")));
        assert_eq!(c.handover_socket.as_deref(), Some(Path::new("/run/h.sock")));
        assert_eq!(c.metrics_listen.map(|a| a.port()), Some(9842));
        assert_eq!(l.log_format, Some(crate::logging::LogFormat::Json));
        assert_eq!(c.vms[1].qos_class.as_deref(), Some("gold"));
        assert_eq!(c.vms[0].qos_class, None);
        let gold = c.qos_spec(Some("gold"));
        assert_eq!(
            (gold.weight, gold.bytes_per_sec, gold.ops_per_sec),
            (400, 1_000_000_000, 0)
        );
        assert_eq!(c.qos_spec(None), QosSpec::default());

        let e = err(&good_with(
            "qos_class = \"gold\"\n\n[[qos",
            "qos_class = \"silver\"\n\n[[qos",
        ));
        assert_eq!(
            e,
            "config.toml:29: VM \"vm1\": QoS class \"silver\" is not defined"
        );
        let e = err(&good_with("weight = 400", "weight = 0"));
        assert_eq!(
            e,
            "config.toml:33: QoS class \"gold\": weight 0 is out of range (1..=1000)"
        );
        let e = err(&format!("{GOOD}\n[[qos_class]]\nname = \"gold\"\n"));
        assert_eq!(
            e,
            "config.toml:37: QoS class \"gold\" is already defined at line 32"
        );
        let e = err(&good_with(
            "shmem_doorbell = false",
            "metrics_listen = \"localhost\"",
        ));
        assert_eq!(
            e,
            "config.toml:4: metrics_listen = \"localhost\" is not an address:port"
        );
    }

    /// `ud`, `srq` and `atomics` take their feature bit out of the offer;
    /// absent, they keep it.
    #[test]
    fn device_feature_switches() {
        for (set, bit) in [("ud", F_UD), ("srq", F_SRQ), ("atomics", F_ATOMIC)] {
            let text = good_with(
                "shmem_doorbell = false",
                &format!("shmem_doorbell = true\n{set} = false"),
            );
            let c = parse_str(&text).unwrap().config;
            let all = F_SHMEM_DOORBELL | F_UD | F_SRQ | F_ATOMIC;
            assert_eq!(c.device_features & all, all & !bit, "{set}");
        }
    }

    #[test]
    fn duplicate_names_and_sockets() {
        let e = err(&good_with("name = \"vm1\"", "name = \"vm0\""));
        assert_eq!(
            e,
            "config.toml:26: VM \"vm0\" is already defined at line 18"
        );
        let e = err(&good_with("name = \"red\"", "name = \"blue\""));
        assert_eq!(
            e,
            "config.toml:15: tenant \"blue\" is already defined at line 11"
        );
        let e = err(&good_with("/run/b.sock", "/run/a.sock"));
        assert_eq!(
            e,
            "config.toml:27: VM \"vm1\": socket \"/run/a.sock\" is already the socket of VM \"vm0\""
        );
    }

    #[test]
    fn bad_names() {
        let e = err(&good_with("name = \"red\"", "name = \"Red\""));
        assert!(
            e.starts_with("config.toml:15: tenant name \"Red\" is invalid"),
            "{e}"
        );
        let e = err(&good_with("name = \"vm1\"", "name = \"\""));
        assert!(
            e.starts_with("config.toml:26: VM name \"\" is invalid"),
            "{e}"
        );
        let long = "a".repeat(33);
        let e = err(&good_with("name = \"vm1\"", &format!("name = \"{long}\"")));
        assert!(e.starts_with("config.toml:26: VM name"), "{e}");
    }

    #[test]
    fn bad_and_duplicate_gids() {
        let e = err(&good_with("::ffff:10.99.0.7", "10.99.0.777"));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm0\": gid \"10.99.0.777\" is not an IPv6 or IPv4 address"
        );
        let text = good_with(
            "tenant = \"red\"",
            "tenant = \"red\"\ngid = \"::ffff:10.99.0.7\"",
        );
        let e = err(&text);
        assert_eq!(
            e,
            "config.toml:29: VM \"vm1\": GID ::ffff:10.99.0.7 is already a GID of VM \"vm0\""
        );
        // vm0 takes the default GID of vm1 (index 1).
        let e = err(&good_with("::ffff:10.99.0.7", "::ffff:10.42.0.2"));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm1\": GID ::ffff:10.42.0.2 is already a GID of VM \"vm0\""
        );
    }

    /// `gids` (or `gid`, a list of one) and `abi`, with the errors that
    /// name their lines.
    #[test]
    fn gids_and_abi() {
        let l = parse_str(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gids = [\"fd00::7\", \"10.99.0.7\"]\nabi = 3",
        ))
        .unwrap();
        let c = &l.config;
        c.validate().unwrap();
        assert_eq!(c.vms[0].gids.len(), 2);
        assert_eq!(gid_text(c.gid(0)), "::ffff:10.99.0.7", "IPv4 first");
        assert_eq!(gid_text(c.gid_table(0).get(2).unwrap()), "fd00::7");
        assert_eq!((c.vms[0].abi, c.vms[1].abi), (3, 3));
        let e = err(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gid = \"::ffff:10.99.0.7\"\ngids = [\"fd00::7\"]",
        ));
        assert_eq!(
            e,
            "config.toml:22: VM \"vm0\": give either gid or gids, not both"
        );
        let e = err(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gids = [\"fd00::7\", \"fd00::x\"]",
        ));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm0\": gid \"fd00::x\" is not an IPv6 or IPv4 address"
        );
        let e = err(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gids = [\"fd00::7\", \"10.0.0.1\"]\nabi = 2",
        ));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm0\": 2 GIDs, but its GID table holds 1 besides the default GID (abi = 2: 1 in all)"
        );
        let e = err(&good_with("gid = \"::ffff:10.99.0.7\"", "abi = 1"));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm0\": abi = 1, but the daemon implements ABI versions 2 and 3"
        );
        let e = err(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gids = [\"fd00::7\", \"fd00::7\"]",
        ));
        assert_eq!(
            e,
            "config.toml:21: VM \"vm0\": GID fd00::7 is already a GID of VM \"vm0\""
        );
    }

    /// `standby_for` (spec 20.5): the standby has its VM's tenant, GIDs,
    /// MAC, ABI version and limits, the same GID table, and no GID of its
    /// own in the daemon's GID map; what it may not give or name is refused
    /// at its line.
    #[test]
    fn a_standby_takes_its_vms_identity() {
        let standby = "[[vm]]\nname = \"vm0-in\"\nsocket = \"/run/a-in.sock\"\ntenant = \"blue\"\nstandby_for = \"vm0\"\n";
        let text = format!("{GOOD}\n{standby}");
        let l = parse_str(&text).unwrap();
        let c = &l.config;
        c.validate().unwrap();
        let s = &c.vms[2];
        assert_eq!(s.standby_for.as_deref(), Some("vm0"));
        assert_eq!(
            (&s.tenant, &s.gids, s.mac, s.limits),
            (
                &c.vms[0].tenant,
                &c.vms[0].gids,
                c.vms[0].mac,
                c.vms[0].limits
            )
        );
        assert_eq!(c.gid_table(2), c.gid_table(0));
        assert_eq!(c.identity(2), 0);
        let t = crate::tenancy::Tenancy::from_config(c);
        assert_eq!(t.vm_by_gid(&c.gid(0)), Some(0));
        t.set_active(0, 2);
        assert_eq!(
            t.vm_by_gid(&c.gid(0)),
            Some(2),
            "GIDs lead to the instance holding them"
        );
        let bad = |extra: &str, want: &str| {
            let e = err(&format!(
                "{GOOD}\n{}",
                standby.replace("standby_for", &format!("{extra}standby_for"))
            ));
            assert!(e.contains(want), "{extra}: {e}");
        };
        bad("gid = \"::ffff:10.99.0.9\"\n", "takes `gid`");
        bad("cm_listen = [7174]\n", "takes `cm_listen`");
        bad("[vm.limits]\nmax_qp = 1\n", "unknown field");
        let e = err(&format!(
            "{GOOD}\n{}",
            standby.replace("\"vm0\"\n", "\"vm9\"\n")
        ));
        assert!(e.contains("no VM of that name before it"), "{e}");
        let e = err(&format!(
            "{GOOD}\n{}",
            standby.replace("\"blue\"", "\"red\"")
        ));
        assert!(e.contains("tenant"), "{e}");
        let twice = format!(
            "{GOOD}\n{standby}\n{}",
            standby
                .replace("a-in", "a-in2")
                .replace("vm0-in", "vm0-in2")
        );
        assert!(err(&twice).contains("already has a standby"));
        let chain = format!(
            "{GOOD}\n{standby}\n{}",
            standby
                .replace("a-in", "a-in2")
                .replace("\"vm0-in\"", "\"vm0-in2\"")
                .replace("\"vm0\"\n", "\"vm0-in\"\n")
        );
        assert!(
            err(&chain).contains("is a standby itself"),
            "{}",
            err(&chain)
        );
    }

    /// `cm_listen` and `cm_connections`: a port is one VM's, and the
    /// error names the entry.
    #[test]
    fn cm_listen_ports_and_connections() {
        let vm0 = "gid = \"::ffff:10.99.0.7\"";
        let listen = |ports: &str| format!("{vm0}\ncm_listen = [{ports}]");
        let l = parse_str(
            &good_with(vm0, &listen("7174, 4420")).replace("max_qp = 128", "cm_connections = 8"),
        )
        .unwrap();
        let c = &l.config;
        c.validate().unwrap();
        assert_eq!(c.vms[0].cm_listen, [7174, 4420]);
        assert!(c.vms[1].cm_listen.is_empty());
        assert_eq!(
            (
                c.vms[0].limits.cm_connections,
                c.vms[1].limits.cm_connections
            ),
            (8, 64)
        );
        let both = good_with(vm0, &listen("7174")).replacen(
            "tenant = \"red\"\nqos_class",
            "tenant = \"red\"\ncm_listen = [4420, 7174]\nqos_class",
            1,
        );
        assert_eq!(
            err(&both),
            "config.toml:30: VM \"vm1\": cm_listen port 7174 is already VM \"vm0\"'s"
        );
        assert_eq!(
            err(&good_with(vm0, &listen("4420, 4420"))),
            "config.toml:22: VM \"vm0\": cm_listen port 4420 is listed twice"
        );
        assert_eq!(
            err(&good_with(vm0, &listen("0"))),
            "config.toml:22: VM \"vm0\": cm_listen port 0 is not a port"
        );
        assert!(err(&good_with(vm0, &listen("70000"))).contains("config.toml:22"));
        let e = err(&good_with("max_qp = 128", "cm_connections = 0"));
        assert!(
            e.contains("config.toml:23") && e.contains("cm-connections"),
            "{e}"
        );
    }

    #[test]
    fn mac_addresses() {
        let l = parse_str(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gid = \"::ffff:10.99.0.7\"\nmac = \"52:54:00:0A:0b:07\"",
        ))
        .unwrap();
        l.config.validate().unwrap();
        assert_eq!(l.config.vms[0].mac, Some([0x52, 0x54, 0, 0x0a, 0x0b, 7]));
        assert_eq!(l.config.vms[1].mac, None, "optional");
        let with = |mac: &str| {
            good_with(
                "gid = \"::ffff:10.99.0.7\"",
                &format!("gid = \"::ffff:10.99.0.7\"\nmac = \"{mac}\""),
            )
        };
        assert_eq!(
            err(&with("52:54:00:0a:0b")),
            "config.toml:22: VM \"vm0\": mac \"52:54:00:0a:0b\" is not a MAC address \
             (six two-digit hexadecimal bytes separated by ':', e.g. 52:54:00:12:34:56)"
        );
        assert_eq!(
            err(&with("00:00:00:00:00:00")),
            "config.toml:22: VM \"vm0\": mac \"00:00:00:00:00:00\" is all zero; \
             leave the MAC address out to pair no interface"
        );
        assert!(err(&with("33:33:00:00:00:01")).starts_with(
            "config.toml:22: VM \"vm0\": mac \"33:33:00:00:00:01\" is a multicast address"
        ),);
        // Not a string.
        let e = err(&good_with(
            "gid = \"::ffff:10.99.0.7\"",
            "gid = \"::ffff:10.99.0.7\"\nmac = 5",
        ));
        assert!(e.starts_with("config.toml:22:7:"), "{e}");
        // Twice in one tenant: the second VM's line. Other tenants may reuse it.
        let twice = |tenant: &str| {
            with("52:54:00:00:00:01").replacen(
                "tenant = \"red\"",
                &format!("tenant = \"{tenant}\"\nmac = \"52:54:00:00:00:01\""),
                1,
            )
        };
        assert_eq!(
            err(&twice("blue")),
            "config.toml:30: VM \"vm1\": MAC address 52:54:00:00:00:01 is already the MAC \
             address of VM \"vm0\" in the same tenant"
        );
        // In another tenant too: the MAC's default GID would be in both
        // GID tables; a VM of ABI version 2 has no default GID.
        assert_eq!(
            err(&twice("red")),
            "config.toml:30: VM \"vm1\": GID fe80::5054:ff:fe00:1 is already a GID of VM \"vm0\""
        );
        let l =
            parse_str(&twice("red").replacen("tenant = \"red\"", "tenant = \"red\"\nabi = 2", 1))
                .unwrap();
        l.config.validate().unwrap();
        assert_eq!(l.config.vms[1].mac, l.config.vms[0].mac);
        assert_eq!(l.config.vms[1].abi, 2);
    }

    #[test]
    fn invalid_limits_name_their_line() {
        let e = err(&good_with("max_qp = 4096", "max_qp = 0"));
        assert!(
            e.starts_with("config.toml:7: [defaults.limits]: max-qp = 0 is out of range"),
            "{e}"
        );
        let e = err(&good_with("max_qp = 128", "max_cqe = 1000"));
        assert_eq!(
            e,
            "config.toml:23: VM \"vm0\": max-cqe = 1000 must be a power of two"
        );
        // The combination fails only in the VM; the field is in the defaults.
        let text = good_with("max_qp = 4096", "max_qp = 4096\nmax_qp_wr = 4194304").replacen(
            "max_qp = 128",
            "max_send_sge = 30",
            1,
        );
        let e = err(&text);
        assert!(e.starts_with("config.toml:8: VM \"vm0\": max-qp-wr"), "{e}");
    }

    #[test]
    fn ctrl_poll_out_of_range() {
        let e = err(&good_with("ctrl_poll_us = 20", "ctrl_poll_us = 20000"));
        assert_eq!(
            e,
            "config.toml:3: ctrl_poll_us = 20000 is out of range (0..=10000)"
        );
    }

    #[test]
    fn missing_file() {
        let e = load(
            Path::new("/nonexistent/vhost-user-rdma.toml"),
            &LimitOverrides::default(),
        )
        .unwrap_err();
        assert!(matches!(e, FileError::Read { .. }));
        assert!(e
            .to_string()
            .starts_with("/nonexistent/vhost-user-rdma.toml: "));
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 1), (1, 1));
        assert_eq!(line_col("ab", 99), (1, 3));
    }
}
