//! A scenario file: the daemon's own configuration tables (`[daemon]`,
//! `[defaults]`, `[[qos_class]]`, `[[tenant]]`, `[[vm]]` without `socket`)
//! plus the lab's: `[lab]`, `[[workload]]`, `[[change]]`, `[[phase]]` and
//! `[[expect]]`. docs/qos-lab.md describes every field.
//!
//! Everything is checked before anything runs, and every error names the
//! file and line.

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;
use vhost_user_rdma::config::{DaemonConfig, LimitOverrides};
use vhost_user_rdma::config_file::{self, line_col, Embedding, FileError};
use vhost_user_rdma_tests::attack::{ATTACKS, MAX_MSG, TWO_VM_ATTACKS};

/// The lab's top-level tables; the others are the daemon's.
pub const LAB_TABLES: [&str; 5] = ["lab", "workload", "change", "phase", "expect"];

/// Longest run.
pub const MAX_DURATION_S: f64 = 3600.0;
/// Most runs of one scenario.
pub const MAX_RUNS: usize = 50;
/// Largest message of an honest workload: its buffers live in the VM's
/// 512 MiB of test-VMM RAM.
pub const MAX_SIZE: u32 = 64 << 20;
/// Most QPs of one workload.
pub const MAX_QPS: u32 = 1024;
/// Most outstanding work requests of one QP.
pub const MAX_DEPTH: u32 = 4096;
/// Most outstanding work requests of one workload (its CQ holds them all).
pub const MAX_OUTSTANDING: u32 = 32_768;

/// A scenario that cannot be run.
#[derive(Debug, Error)]
pub enum ScenarioError {
    /// The file cannot be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// The daemon's part of it is not a valid configuration.
    #[error(transparent)]
    Config(#[from] FileError),
    /// Not TOML, a wrong type, an unknown or missing field of the lab.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A lab table that does not make sense.
    #[error("{file}:{line}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// What an honest workload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// RDMA WRITE into the peer.
    Write,
    /// RDMA READ from the peer.
    Read,
    /// SEND into receives the peer keeps posted.
    Send,
}

/// What a workload runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Work requests of one operation.
    Honest {
        /// The operation.
        op: Op,
        /// Bytes per work request.
        size: u32,
        /// RC QPs, each to its own QP in the peer VM.
        qps: u32,
        /// Outstanding work requests per QP (the closed loop's window, the
        /// paced workload's bound).
        depth: u32,
        /// Work requests per second over all QPs (open loop); `None`: a
        /// closed loop that keeps every QP `depth` deep.
        rate: Option<f64>,
        /// Sleep of a closed-loop poller with nothing to do; zero spins.
        nap_us: u64,
    },
    /// An attack of the catalogue (`vhost_user_rdma_tests::attack`).
    Attack {
        /// Its name.
        name: String,
        /// Size of its huge messages, bytes.
        msg: u64,
    },
}

/// One `[[workload]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Unique name.
    pub name: String,
    /// Index of its VM in the configuration.
    pub vm: usize,
    /// Index of the peer VM (the same as `vm` for a loopback).
    pub peer: usize,
    /// What it runs.
    pub kind: Kind,
    /// Seconds from the run's start.
    pub start_s: f64,
    /// Seconds from the run's start.
    pub stop_s: f64,
    /// Nice value of its thread.
    pub nice: i32,
}

/// What a `[[change]]` applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A VM, by index.
    Vm(usize),
    /// A tenant, by index.
    Tenant(usize),
}

/// One `[[change]]`: a live QoS change through the management API.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Seconds from the run's start.
    pub at_s: f64,
    /// What it changes.
    pub target: Target,
    /// New weight.
    pub weight: Option<u32>,
    /// New bytes/s limit (0: none).
    pub bytes_per_sec: Option<u64>,
    /// New send work requests/s limit (0: none).
    pub ops_per_sec: Option<u64>,
    /// New control commands/s limit (0: none).
    pub ctrl_per_sec: Option<u64>,
}

impl Change {
    /// "tenant red: weight 1000" and the like.
    pub fn describe(&self, config: &DaemonConfig) -> String {
        let who = match self.target {
            Target::Vm(i) => format!("VM {}", config.vms[i].name),
            Target::Tenant(t) => format!("tenant {}", config.tenants[t].name),
        };
        let mut what = Vec::new();
        if let Some(w) = self.weight {
            what.push(format!("weight {w}"));
        }
        for (name, v) in [
            ("bytes/s", self.bytes_per_sec),
            ("ops/s", self.ops_per_sec),
            ("ctrl/s", self.ctrl_per_sec),
        ] {
            match v {
                Some(0) => what.push(format!("{name} unlimited")),
                Some(v) => what.push(format!("{name} {v}")),
                None => {}
            }
        }
        format!("{who}: {}", what.join(", "))
    }
}

/// One `[[phase]]`: a named window the report and expectations refer to.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Unique name.
    pub name: String,
    /// Seconds from the run's start.
    pub from_s: f64,
    /// Seconds from the run's start.
    pub to_s: f64,
}

/// What an expectation measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Median latency of a workload, µs.
    P50Us,
    /// 99th percentile latency of a workload, µs.
    P99Us,
    /// 99.9th percentile latency of a workload, µs.
    P999Us,
    /// Throughput, MiB/s (workload: completed; VM, tenant: executed by
    /// the engine).
    MibPerS,
    /// Work requests per second (as `mib_per_s`).
    OpsPerS,
    /// Fraction of the bytes a tenant's VMs (a VM: its tenant's) moved.
    Share,
    /// |share − the share its weight gives| among the active subjects.
    ShareError,
    /// Jain's fairness index of the active tenants' weight-normalized
    /// throughput (no subject).
    Jain,
}

impl Metric {
    /// Its name in the scenario.
    pub fn name(self) -> &'static str {
        match self {
            Metric::P50Us => "p50_us",
            Metric::P99Us => "p99_us",
            Metric::P999Us => "p999_us",
            Metric::MibPerS => "mib_per_s",
            Metric::OpsPerS => "ops_per_s",
            Metric::Share => "share",
            Metric::ShareError => "share_error",
            Metric::Jain => "jain",
        }
    }
}

/// What an expectation is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A workload, by index.
    Workload(usize),
    /// A VM, by index.
    Vm(usize),
    /// A tenant, by index.
    Tenant(usize),
    /// The whole run (Jain's index).
    All,
}

/// One `[[expect]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    /// What the report calls it.
    pub label: String,
    /// The metric.
    pub metric: Metric,
    /// Its subject.
    pub subject: Subject,
    /// The phase it is measured in (index).
    pub phase: usize,
    /// Lower bound.
    pub min: Option<f64>,
    /// Upper bound.
    pub max: Option<f64>,
    /// Bounds are multiples of the same metric in this phase (index).
    pub relative_to: Option<usize>,
}

/// `[lab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LabSettings {
    /// The scenario's name (file names of the outputs).
    pub name: String,
    /// What it asks.
    pub description: String,
    /// Seconds the run takes.
    pub duration_s: f64,
    /// Sampling interval of the time series, ms.
    pub sample_ms: u64,
    /// CPUs of the workloads' threads (none: not pinned).
    pub client_cpus: Vec<usize>,
    /// CPU of the daemon's threads (none: not pinned).
    pub daemon_cpu: Option<usize>,
    /// Runs (expectations are judged on their medians).
    pub runs: usize,
}

/// A checked scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The file it came from.
    pub file: PathBuf,
    /// `[lab]`.
    pub lab: LabSettings,
    /// The daemon's configuration (sockets in a placeholder directory
    /// until [`Scenario::config_in`]).
    pub config: DaemonConfig,
    /// The workloads.
    pub workloads: Vec<Workload>,
    /// The live QoS changes, by time.
    pub changes: Vec<Change>,
    /// The phases.
    pub phases: Vec<Phase>,
    /// The expectations.
    pub expects: Vec<Expect>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LabTable {
    name: Option<String>,
    description: Option<String>,
    duration_s: Option<Spanned<f64>>,
    sample_ms: Option<Spanned<u64>>,
    client_cpus: Option<Vec<usize>>,
    daemon_cpu: Option<usize>,
    runs: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadTable {
    name: Option<String>,
    vm: Spanned<String>,
    peer: Option<Spanned<String>>,
    op: Option<Op>,
    attack: Option<Spanned<String>>,
    size: Option<u32>,
    qps: Option<u32>,
    depth: Option<u32>,
    rate: Option<f64>,
    nap_us: Option<u64>,
    msg_mib: Option<u64>,
    start_s: Option<f64>,
    stop_s: Option<f64>,
    nice: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeTable {
    at_s: f64,
    vm: Option<Spanned<String>>,
    tenant: Option<Spanned<String>>,
    weight: Option<u32>,
    bytes_per_sec: Option<u64>,
    ops_per_sec: Option<u64>,
    ctrl_per_sec: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseTable {
    name: String,
    from_s: f64,
    to_s: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectTable {
    label: Option<String>,
    metric: Metric,
    workload: Option<String>,
    vm: Option<String>,
    tenant: Option<String>,
    phase: Option<String>,
    min: Option<f64>,
    max: Option<f64>,
    relative_to: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LabTables {
    #[serde(default)]
    lab: LabTable,
    #[serde(default)]
    workload: Vec<Spanned<WorkloadTable>>,
    #[serde(default)]
    change: Vec<Spanned<ChangeTable>>,
    #[serde(default)]
    phase: Vec<Spanned<PhaseTable>>,
    #[serde(default)]
    expect: Vec<Spanned<ExpectTable>>,
}

/// The placeholder socket directory of a checked scenario.
const PLACEHOLDER: &str = "/nonexistent/vhost-user-rdma-lab";

impl Scenario {
    /// Reads and checks the scenario file `path`.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            file: file.clone(),
            source,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        Self::parse(&text, &file, &stem)
    }

    /// Checks scenario `text`; `file` names it in errors, `stem` is the
    /// default name.
    pub fn parse(text: &str, file: &str, stem: &str) -> Result<Scenario, ScenarioError> {
        let config = parse_config(text, file, Path::new(PLACEHOLDER))?;
        let parse_error = |e: toml::de::Error| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            ScenarioError::Parse {
                file: file.into(),
                line,
                column,
                message: e.message().trim_end().to_string(),
            }
        };
        let mut root = toml::de::DeTable::parse(text).map_err(parse_error)?;
        let daemons: Vec<String> = root
            .get_ref()
            .keys()
            .map(|k| k.get_ref().to_string())
            .filter(|k| !LAB_TABLES.contains(&k.as_str()))
            .collect();
        for k in daemons {
            root.get_mut().remove(k.as_str());
        }
        let tables =
            LabTables::deserialize(toml::de::Deserializer::from(root)).map_err(parse_error)?;
        let c = Checker {
            text,
            file,
            config: &config,
        };
        let lab = c.lab(&tables.lab, stem)?;
        let mut workloads = Vec::new();
        for (i, w) in tables.workload.iter().enumerate() {
            let w = c.workload(i, w, &lab, &workloads)?;
            workloads.push(w);
        }
        if workloads.is_empty() {
            return Err(c.invalid(0..0, "the scenario has no [[workload]]".into()));
        }
        let mut changes = Vec::new();
        for ch in &tables.change {
            changes.push(c.change(ch, &lab)?);
        }
        changes.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let mut phases = Vec::new();
        for p in &tables.phase {
            let ph = c.phase(p, &lab)?;
            if phases.iter().any(|x: &Phase| x.name == ph.name) {
                return Err(c.invalid(p.span(), format!("phase {:?} is defined twice", ph.name)));
            }
            phases.push(ph);
        }
        if phases.is_empty() {
            // The whole run but its first tenth (set-up and warm-up).
            phases.push(Phase {
                name: "all".into(),
                from_s: (lab.duration_s / 10.0).min(1.0),
                to_s: lab.duration_s,
            });
        }
        let mut expects = Vec::new();
        for e in &tables.expect {
            expects.push(c.expect(e, &workloads, &phases)?);
        }
        Ok(Scenario {
            file: PathBuf::from(file),
            lab,
            config,
            workloads,
            changes,
            phases,
            expects,
        })
    }

    /// The daemon's configuration with its sockets (and management
    /// socket) in `dir`; no hand-over socket.
    pub fn config_in(&self, dir: &Path) -> DaemonConfig {
        let mut config = self.config.clone();
        // As parse_embedded named them: after the VM (names are unique).
        for vm in &mut config.vms {
            vm.socket = dir.join(format!("{}.sock", vm.name));
        }
        config.mgmt_socket = Some(dir.join("mgmt.sock"));
        config.handover_socket = None;
        config
    }

    /// Index of the tenant of VM `vm`.
    pub fn tenant_of(&self, vm: usize) -> usize {
        let name = &self.config.vms[vm].tenant;
        self.config
            .tenants
            .iter()
            .position(|t| &t.name == name)
            .unwrap_or(0)
    }
}

fn parse_config(text: &str, file: &str, dir: &Path) -> Result<DaemonConfig, ScenarioError> {
    let embedding = Embedding {
        foreign: &LAB_TABLES,
        socket_dir: Some(dir),
    };
    let loaded = config_file::parse_embedded(text, file, &LimitOverrides::default(), &embedding)?;
    Ok(loaded.config)
}

/// Checks the lab's tables against the configuration.
struct Checker<'a> {
    text: &'a str,
    file: &'a str,
    config: &'a DaemonConfig,
}

impl Checker<'_> {
    fn invalid(&self, span: Range<usize>, message: String) -> ScenarioError {
        ScenarioError::Invalid {
            file: self.file.into(),
            line: line_col(self.text, span.start).0,
            message,
        }
    }

    fn vm(&self, name: &Spanned<String>) -> Result<usize, ScenarioError> {
        self.config
            .vms
            .iter()
            .position(|v| &v.name == name.get_ref())
            .ok_or_else(|| {
                self.invalid(
                    name.span(),
                    format!("VM {:?} is not a [[vm]] of the scenario", name.get_ref()),
                )
            })
    }

    fn tenant(&self, name: &Spanned<String>) -> Result<usize, ScenarioError> {
        self.config
            .tenants
            .iter()
            .position(|t| &t.name == name.get_ref())
            .ok_or_else(|| {
                self.invalid(
                    name.span(),
                    format!(
                        "tenant {:?} is not a [[tenant]] of the scenario",
                        name.get_ref()
                    ),
                )
            })
    }

    fn time(
        &self,
        span: &Range<usize>,
        what: &str,
        v: f64,
        lab: &LabSettings,
    ) -> Result<f64, ScenarioError> {
        if !(0.0..=lab.duration_s).contains(&v) {
            return Err(self.invalid(
                span.clone(),
                format!("{what} = {v} is outside the run (0..={} s)", lab.duration_s),
            ));
        }
        Ok(v)
    }

    fn lab(&self, t: &LabTable, stem: &str) -> Result<LabSettings, ScenarioError> {
        let duration_s = t.duration_s.as_ref().ok_or_else(|| {
            self.invalid(
                0..0,
                "[lab] duration_s is required (seconds the run takes)".into(),
            )
        })?;
        let d = *duration_s.get_ref();
        if !(0.1..=MAX_DURATION_S).contains(&d) {
            return Err(self.invalid(
                duration_s.span(),
                format!("duration_s = {d} is out of range (0.1..={MAX_DURATION_S})"),
            ));
        }
        let sample_ms = match &t.sample_ms {
            Some(s) if !(10..=10_000).contains(s.get_ref()) => {
                return Err(self.invalid(
                    s.span(),
                    format!("sample_ms = {} is out of range (10..=10000)", s.get_ref()),
                ))
            }
            Some(s) => *s.get_ref(),
            None => 100,
        };
        // SAFETY: sysconf has no memory-safety preconditions.
        let cpus =
            usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(1);
        let (client_cpus, daemon_cpu) = match (&t.client_cpus, t.daemon_cpu) {
            (None, None) if cpus >= 2 => (vec![0], Some(1)),
            (c, d) => (c.clone().unwrap_or_default(), d),
        };
        if let Some(bad) = client_cpus
            .iter()
            .chain(daemon_cpu.iter())
            .find(|c| **c >= cpus)
        {
            return Err(self.invalid(
                0..0,
                format!("[lab]: CPU {bad} does not exist (this machine has {cpus})"),
            ));
        }
        let runs = match &t.runs {
            Some(r) if !(1..=MAX_RUNS).contains(r.get_ref()) => {
                return Err(self.invalid(
                    r.span(),
                    format!("runs = {} is out of range (1..={MAX_RUNS})", r.get_ref()),
                ))
            }
            Some(r) => *r.get_ref(),
            None => 1,
        };
        let name = t.name.clone().unwrap_or_else(|| stem.to_string());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(self.invalid(
                0..0,
                format!("[lab] name {name:?} is not a file name (a-z, A-Z, 0-9, - and _)"),
            ));
        }
        Ok(LabSettings {
            name,
            description: t.description.clone().unwrap_or_default(),
            duration_s: d,
            sample_ms,
            client_cpus,
            daemon_cpu,
            runs,
        })
    }

    fn workload(
        &self,
        i: usize,
        w: &Spanned<WorkloadTable>,
        lab: &LabSettings,
        before: &[Workload],
    ) -> Result<Workload, ScenarioError> {
        let span = w.span();
        let w = w.get_ref();
        let name = w.name.clone().unwrap_or_else(|| format!("w{i}"));
        if before.iter().any(|x| x.name == name) {
            return Err(self.invalid(span, format!("workload {name:?} is defined twice")));
        }
        let bad = |m: String| self.invalid(span.clone(), format!("workload {name:?}: {m}"));
        let vm = self.vm(&w.vm)?;
        let peer = match &w.peer {
            Some(p) => self.vm(p)?,
            None => vm,
        };
        if self.config.vms[vm].tenant != self.config.vms[peer].tenant {
            return Err(bad(format!(
                "VMs {} and {} are in different tenants, which are separate networks",
                self.config.vms[vm].name, self.config.vms[peer].name
            )));
        }
        let start_s = self.time(&span, "start_s", w.start_s.unwrap_or(0.0), lab)?;
        let stop_s = self.time(&span, "stop_s", w.stop_s.unwrap_or(lab.duration_s), lab)?;
        if stop_s <= start_s {
            return Err(bad(format!(
                "stop_s {stop_s} is not after start_s {start_s}"
            )));
        }
        let nice = w.nice.unwrap_or(0);
        if !(-20..=19).contains(&nice) {
            return Err(bad(format!("nice {nice} is out of range (-20..=19)")));
        }
        let kind = match (&w.attack, w.op) {
            (Some(_), Some(_)) => return Err(bad("give either op or attack, not both".into())),
            (None, None) => return Err(bad("give op (write, read, send) or attack".into())),
            (Some(a), None) => {
                let name_a = a.get_ref();
                if !ATTACKS.contains(&name_a.as_str()) {
                    return Err(self.invalid(
                        a.span(),
                        format!("unknown attack {name_a:?} (known: {})", ATTACKS.join(", ")),
                    ));
                }
                if TWO_VM_ATTACKS.contains(&name_a.as_str()) && peer == vm {
                    return Err(bad(format!(
                        "attack {name_a} needs the attacker's second VM as peer"
                    )));
                }
                for (field, set) in [
                    ("size", w.size.is_some()),
                    ("qps", w.qps.is_some()),
                    ("depth", w.depth.is_some()),
                    ("rate", w.rate.is_some()),
                    ("nap_us", w.nap_us.is_some()),
                ] {
                    if set {
                        return Err(bad(format!("{field} is for op workloads, not attacks")));
                    }
                }
                let mib = w.msg_mib.unwrap_or(1024);
                let msg = mib.saturating_mul(1 << 20);
                if mib == 0 || msg > MAX_MSG {
                    return Err(bad(format!("msg_mib {mib} is out of range (1..=2048)")));
                }
                Kind::Attack {
                    name: name_a.clone(),
                    msg,
                }
            }
            (None, Some(op)) => {
                if w.msg_mib.is_some() {
                    return Err(bad("msg_mib is for attacks".into()));
                }
                let size = w.size.unwrap_or(64);
                let qps = w.qps.unwrap_or(1);
                let depth = w.depth.unwrap_or(1);
                if size == 0 || size > MAX_SIZE {
                    return Err(bad(format!("size {size} is out of range (1..={MAX_SIZE})")));
                }
                if qps == 0 || qps > MAX_QPS {
                    return Err(bad(format!("qps {qps} is out of range (1..={MAX_QPS})")));
                }
                if depth == 0 || depth > MAX_DEPTH {
                    return Err(bad(format!(
                        "depth {depth} is out of range (1..={MAX_DEPTH})"
                    )));
                }
                if qps.saturating_mul(depth) > MAX_OUTSTANDING {
                    return Err(bad(format!(
                        "qps × depth = {} is more than {MAX_OUTSTANDING} outstanding",
                        u64::from(qps) * u64::from(depth)
                    )));
                }
                if let Some(r) = w.rate {
                    if !(r > 0.0 && r <= 10_000_000.0) {
                        return Err(bad(format!(
                            "rate {r} is out of range (0 < rate <= 1e7 per s)"
                        )));
                    }
                }
                let nap_us = w.nap_us.unwrap_or(if qps * depth > 1 { 200 } else { 0 });
                if nap_us > 1_000_000 {
                    return Err(bad(format!(
                        "nap_us {nap_us} is out of range (0..=1000000)"
                    )));
                }
                Kind::Honest {
                    op,
                    size,
                    qps,
                    depth,
                    rate: w.rate,
                    nap_us,
                }
            }
        };
        Ok(Workload {
            name,
            vm,
            peer,
            kind,
            start_s,
            stop_s,
            nice,
        })
    }

    fn change(
        &self,
        ch: &Spanned<ChangeTable>,
        lab: &LabSettings,
    ) -> Result<Change, ScenarioError> {
        let span = ch.span();
        let c = ch.get_ref();
        let at_s = self.time(&span, "at_s", c.at_s, lab)?;
        let target = match (&c.vm, &c.tenant) {
            (Some(v), None) => Target::Vm(self.vm(v)?),
            (None, Some(t)) => Target::Tenant(self.tenant(t)?),
            _ => return Err(self.invalid(span, "a [[change]] names one vm or one tenant".into())),
        };
        if c.weight.is_none()
            && c.bytes_per_sec.is_none()
            && c.ops_per_sec.is_none()
            && c.ctrl_per_sec.is_none()
        {
            return Err(self.invalid(
                span,
                "a [[change]] sets weight, bytes_per_sec, ops_per_sec or ctrl_per_sec".into(),
            ));
        }
        if let Some(w) = c.weight {
            if !(1..=vhost_user_rdma::qos::MAX_WEIGHT).contains(&w) {
                return Err(self.invalid(
                    span,
                    format!(
                        "weight {w} is out of range (1..={})",
                        vhost_user_rdma::qos::MAX_WEIGHT
                    ),
                ));
            }
        }
        Ok(Change {
            at_s,
            target,
            weight: c.weight,
            bytes_per_sec: c.bytes_per_sec,
            ops_per_sec: c.ops_per_sec,
            ctrl_per_sec: c.ctrl_per_sec,
        })
    }

    fn phase(&self, p: &Spanned<PhaseTable>, lab: &LabSettings) -> Result<Phase, ScenarioError> {
        let span = p.span();
        let t = p.get_ref();
        let from_s = self.time(&span, "from_s", t.from_s, lab)?;
        let to_s = self.time(&span, "to_s", t.to_s, lab)?;
        if to_s <= from_s {
            return Err(self.invalid(
                span,
                format!(
                    "phase {:?}: to_s {to_s} is not after from_s {from_s}",
                    t.name
                ),
            ));
        }
        Ok(Phase {
            name: t.name.clone(),
            from_s,
            to_s,
        })
    }

    fn expect(
        &self,
        e: &Spanned<ExpectTable>,
        workloads: &[Workload],
        phases: &[Phase],
    ) -> Result<Expect, ScenarioError> {
        let span = e.span();
        let t = e.get_ref();
        let m = t.metric.name();
        let bad = |msg: String| self.invalid(span.clone(), format!("[[expect]] {m}: {msg}"));
        let named = |n: &String| Spanned::new(span.clone(), n.clone());
        let subject = match (&t.workload, &t.vm, &t.tenant) {
            (Some(w), None, None) => Subject::Workload(
                workloads
                    .iter()
                    .position(|x| &x.name == w)
                    .ok_or_else(|| bad(format!("workload {w:?} is not a [[workload]]")))?,
            ),
            (None, Some(v), None) => Subject::Vm(self.vm(&named(v))?),
            (None, None, Some(tn)) => Subject::Tenant(self.tenant(&named(tn))?),
            (None, None, None) => Subject::All,
            _ => return Err(bad("name one of workload, vm, tenant".into())),
        };
        match (t.metric, &subject) {
            (Metric::Jain, Subject::All) => {}
            (Metric::Jain, _) => return Err(bad("is over all tenants: name no subject".into())),
            (_, Subject::All) => return Err(bad("needs a workload, vm or tenant".into())),
            (Metric::P50Us | Metric::P99Us | Metric::P999Us, Subject::Workload(w)) => {
                if matches!(workloads[*w].kind, Kind::Attack { .. }) {
                    return Err(bad("latency is measured for op workloads only".into()));
                }
            }
            (Metric::P50Us | Metric::P99Us | Metric::P999Us, _) => {
                return Err(bad("latency is measured per workload".into()))
            }
            (Metric::Share | Metric::ShareError, Subject::Workload(_)) => {
                return Err(bad("shares are of VMs and tenants".into()))
            }
            _ => {}
        }
        let phase_index = |name: &str| {
            phases
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| bad(format!("phase {name:?} is not a [[phase]]")))
        };
        let phase = match &t.phase {
            Some(p) => phase_index(p)?,
            None if phases.len() == 1 => 0,
            None => return Err(bad("name its phase (the scenario has several)".into())),
        };
        let relative_to = t.relative_to.as_deref().map(phase_index).transpose()?;
        if t.min.is_none() && t.max.is_none() {
            return Err(bad("give min, max or both".into()));
        }
        if let (Some(a), Some(b)) = (t.min, t.max) {
            if a > b {
                return Err(bad(format!("min {a} is above max {b}")));
            }
        }
        let label = t.label.clone().unwrap_or_else(|| {
            let who = match &subject {
                Subject::Workload(w) => workloads[*w].name.clone(),
                Subject::Vm(v) => self.config.vms[*v].name.clone(),
                Subject::Tenant(x) => self.config.tenants[*x].name.clone(),
                Subject::All => "tenants".into(),
            };
            let bound = match (t.min, t.max) {
                (Some(a), Some(b)) => format!("in {a}..={b}"),
                (Some(a), None) => format!(">= {a}"),
                (None, Some(b)) => format!("<= {b}"),
                (None, None) => String::new(),
            };
            let rel = t
                .relative_to
                .as_deref()
                .map(|r| format!(" x {r}"))
                .unwrap_or_default();
            format!("{who} {m} in {} {bound}{rel}", phases[phase].name)
        });
        Ok(Expect {
            label,
            metric: t.metric,
            subject,
            phase,
            min: t.min,
            max: t.max,
            relative_to,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const BASE: &str = r#"
[lab]
duration_s = 4

[[tenant]]
name = "blue"
[[tenant]]
name = "red"

[[vm]]
name = "b0"
tenant = "blue"
[[vm]]
name = "b1"
tenant = "blue"
[[vm]]
name = "r0"
tenant = "red"
[[vm]]
name = "r1"
tenant = "red"
"#;

    fn parse(extra: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(&format!("{BASE}{extra}"), "s.toml", "s")
    }

    #[test]
    fn a_scenario_parses_with_the_daemons_tables() {
        let s = parse(
            r#"
[[workload]]
name = "lat"
vm = "b0"
peer = "b1"
op = "write"
rate = 1000
[[workload]]
vm = "r0"
peer = "r1"
attack = "huge-send"
msg_mib = 64
start_s = 1
nice = 19
[[change]]
at_s = 2
tenant = "red"
weight = 5
[[phase]]
name = "alone"
from_s = 0.5
to_s = 1
[[phase]]
name = "attacked"
from_s = 1.5
to_s = 4
[[expect]]
metric = "p99_us"
workload = "lat"
phase = "attacked"
max = 2
relative_to = "alone"
"#,
        )
        .unwrap();
        assert_eq!(s.config.vms.len(), 4);
        assert!(s.config.vms[0]
            .socket
            .starts_with("/nonexistent/vhost-user-rdma-lab"));
        assert_eq!(s.workloads.len(), 2);
        assert_eq!(s.workloads[1].name, "w1");
        assert_eq!(
            s.workloads[1].kind,
            Kind::Attack {
                name: "huge-send".into(),
                msg: 64 << 20
            }
        );
        assert_eq!(s.changes[0].target, Target::Tenant(1));
        assert_eq!(s.expects[0].relative_to, Some(0));
        assert_eq!(s.expects[0].phase, 1);
        let dir = Path::new("/tmp/x");
        let c = s.config_in(dir);
        assert_eq!(c.vms[2].socket, dir.join("r0.sock"));
        assert_eq!(
            c.mgmt_socket.as_deref(),
            Some(dir.join("mgmt.sock").as_path())
        );
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("[[workload]]\nvm = \"nope\"\nop = \"write\"\n", ":23: VM \"nope\" is not"),
            (
                "[[workload]]\nvm = \"b0\"\npeer = \"r0\"\nop = \"write\"\n",
                "different tenants",
            ),
            ("[[workload]]\nvm = \"b0\"\nop = \"fly\"\n", ":24:6: unknown variant `fly`"),
            ("[[workload]]\nvm = \"b0\"\nattack = \"nuke\"\n", "unknown attack \"nuke\""),
            ("[[workload]]\nvm = \"b0\"\nattack = \"hog\"\n", "needs the attacker's second VM"),
            (
                "[[workload]]\nvm = \"b0\"\nop = \"write\"\nstop_s = 9\n",
                "stop_s = 9 is outside the run",
            ),
            (
                "[[workload]]\nvm = \"b0\"\nop = \"write\"\nqps = 1024\ndepth = 4096\n",
                "outstanding",
            ),
            (
                "[[workload]]\nvm = \"b0\"\nop = \"write\"\n[[expect]]\nmetric = \"p99_us\"\nvm = \"b0\"\nmax = 1\n",
                "latency is measured per workload",
            ),
            (
                "[[workload]]\nvm = \"b0\"\nop = \"write\"\n[[expect]]\nmetric = \"jain\"\nmin = 1\nmax = 0.5\n",
                "min 1 is above max 0.5",
            ),
            ("[[workload]]\nvm = \"b0\"\nop = \"write\"\nbogus = 1\n", "unknown field `bogus`"),
            ("", "no [[workload]]"),
        ];
        for (extra, want) in cases {
            let e = parse(extra).unwrap_err().to_string();
            assert!(e.contains(want), "{extra:?}: {e} (wanted {want:?})");
            assert!(e.starts_with("s.toml:"), "{e}");
        }
    }

    #[test]
    fn the_daemons_errors_keep_their_lines() {
        let text = format!("{BASE}[[vm]]\nname = \"x\"\ntenant = \"green\"\n");
        let e = Scenario::parse(&text, "s.toml", "s")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml:24:"), "{e}");
        let text = format!("{BASE}[[vm]]\nname = \"x\"\ntenant = \"red\"\nsocket = \"/a\"\n");
        let e = Scenario::parse(&text, "s.toml", "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("s.toml:25:") && e.contains("socket"), "{e}");
    }
}
