//! What a run means: per phase, each workload's throughput and latency
//! percentiles, each VM's and tenant's throughput and share against the
//! share its weight gives, Jain's fairness index, the verdict of every
//! expectation; and the time series the plot draws. Written as JSON and
//! Markdown.

use std::fmt::Write as _;

use serde::Serialize;

use crate::record::{merge, Interval};
use crate::run::{Environment, Outcome};
use crate::scenario::{Expect, Kind, Metric, Phase, Scenario, Subject, Target};

const MIB: f64 = 1_048_576.0;

/// One workload in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadStats {
    /// Its name.
    pub name: String,
    /// Its VM.
    pub vm: String,
    /// Its VM's tenant.
    pub tenant: String,
    /// What it runs ("write 64 B x1 deep on 1 QP, 1000/s", "attack hog").
    pub what: String,
    /// Completed work requests per second (none for an attack).
    pub ops_per_s: Option<f64>,
    /// Completed MiB per second (none for an attack).
    pub mib_per_s: Option<f64>,
    /// Post-to-completion latency percentiles, µs (none without
    /// completions).
    pub p50_us: Option<f64>,
    /// 99th percentile.
    pub p99_us: Option<f64>,
    /// 99.9th percentile.
    pub p999_us: Option<f64>,
    /// Largest.
    pub max_us: Option<f64>,
    /// Posts a paced workload missed because its queues were full.
    pub missed_posts: u64,
}

/// A VM or tenant in one phase, from the engine's counters.
#[derive(Debug, Clone, Serialize)]
pub struct RateStats {
    /// Its name.
    pub name: String,
    /// A VM's tenant (empty for a tenant).
    pub tenant: String,
    /// Send work requests executed per second.
    pub ops_per_s: f64,
    /// MiB those moved per second.
    pub mib_per_s: f64,
    /// Fraction of the bytes: a tenant's of all tenants', a VM's of its
    /// tenant's.
    pub share: f64,
    /// Its weight in force in the middle of the phase.
    pub weight: u32,
    /// The share its weight gives among the active ones (0 if it is not
    /// active: no workload through the whole phase).
    pub ideal_share: f64,
    /// Had a workload running through the whole phase.
    pub active: bool,
}

/// An engine thread in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    /// The thread's index.
    pub index: usize,
    /// Send work requests executed per second.
    pub wqes_per_s: f64,
    /// MiB moved per second.
    pub mib_per_s: f64,
    /// Times per second it parked (slept with no work).
    pub parks_per_s: f64,
    /// Work of a parked VM its idle re-check found before the VM's
    /// notification (a late or lost kick).
    pub late_kicks: u64,
}

/// One phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// Its name.
    pub name: String,
    /// Start, s.
    pub from_s: f64,
    /// End, s.
    pub to_s: f64,
    /// The workloads.
    pub workloads: Vec<WorkloadStats>,
    /// The VMs.
    pub vms: Vec<RateStats>,
    /// The tenants.
    pub tenants: Vec<RateStats>,
    /// The engine threads.
    pub engines: Vec<EngineReport>,
    /// Jain's fairness index of the active tenants' throughput divided by
    /// their ideal shares (1: exactly as weighted).
    pub jain: Option<f64>,
}

/// The verdict of one expectation.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Its label.
    pub label: String,
    /// The value measured.
    pub value: Option<f64>,
    /// The same metric in the `relative_to` phase.
    pub baseline: Option<f64>,
    /// `value / baseline` for an expectation relative to another phase.
    pub ratio: Option<f64>,
    /// The lower bound applied (after scaling by the baseline).
    pub min: Option<f64>,
    /// The upper bound applied.
    pub max: Option<f64>,
    /// Held.
    pub pass: bool,
}

/// A live change as it went.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeReport {
    /// When the scenario asked for it, s.
    pub planned_s: f64,
    /// When the daemon had it in force, s.
    pub at_s: f64,
    /// What it changed.
    pub what: String,
    /// The daemon's error, if it refused it.
    pub error: Option<String>,
}

/// A series of the plot.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// Its name.
    pub name: String,
    /// One value per interval (none: nothing measured).
    pub values: Vec<Option<f64>>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// What it asks.
    pub description: String,
    /// Its file.
    pub file: String,
    /// The command line.
    pub command: String,
    /// Run length, s.
    pub duration_s: f64,
    /// Sampling interval, ms.
    pub sample_ms: u64,
    /// Where it ran.
    pub environment: Environment,
    /// Per phase.
    pub phases: Vec<PhaseReport>,
    /// The live changes.
    pub changes: Vec<ChangeReport>,
    /// The expectations.
    pub expectations: Vec<Verdict>,
    /// Workloads that stopped with an error.
    pub failures: Vec<(String, String)>,
    /// Interval ends, s.
    pub t_s: Vec<f64>,
    /// MiB/s per tenant per interval (engine counters).
    pub tenant_mib_per_s: Vec<Series>,
    /// p99 latency per honest workload per interval, µs.
    pub workload_p99_us: Vec<Series>,
    /// Completed work requests per second per honest workload per interval.
    pub workload_ops_per_s: Vec<Series>,
    /// Every expectation held and no workload failed.
    pub passed: bool,
}

/// The report of `outcome`, a run of `s`.
pub fn analyse(s: &Scenario, outcome: &Outcome, command: &str) -> Report {
    let a = Analysis { s, o: outcome };
    let phases: Vec<PhaseReport> = s.phases.iter().map(|p| a.phase(p)).collect();
    let expectations: Vec<Verdict> = s.expects.iter().map(|e| a.verdict(e, &phases)).collect();
    let failures: Vec<(String, String)> = s
        .workloads
        .iter()
        .zip(&outcome.failures)
        .filter_map(|(w, f)| f.clone().map(|f| (w.name.clone(), f)))
        .collect();
    let changes = outcome
        .applied
        .iter()
        .map(|c| ChangeReport {
            planned_s: s.changes.get(c.index).map_or(0.0, |x| x.at_s),
            at_s: c.at_s,
            what: c.what.clone(),
            error: c.result.clone().err(),
        })
        .collect::<Vec<_>>();
    let passed = expectations.iter().all(|v| v.pass)
        && failures.is_empty()
        && changes.iter().all(|c| c.error.is_none());
    let secs = outcome.interval.as_secs_f64();
    let t_s = (1..=outcome.intervals).map(|i| i as f64 * secs).collect();
    let tenant_mib_per_s = a
        .tenants()
        .into_iter()
        .map(|t| Series {
            name: s.config.tenants[t].name.clone(),
            values: (0..outcome.intervals)
                .map(|i| Some(a.tenant_bytes(t, i, i + 1) as f64 / MIB / secs))
                .collect(),
        })
        .collect();
    let honest = || {
        s.workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| matches!(w.kind, Kind::Honest { .. }))
    };
    let workload_p99_us = honest()
        .map(|(k, w)| Series {
            name: w.name.clone(),
            values: outcome.recorders[k]
                .intervals
                .iter()
                .map(|iv| quantile_us(iv, 0.99))
                .collect(),
        })
        .collect();
    let workload_ops_per_s = honest()
        .map(|(k, w)| Series {
            name: w.name.clone(),
            values: outcome.recorders[k]
                .intervals
                .iter()
                .map(|iv| Some(iv.ops as f64 / secs))
                .collect(),
        })
        .collect();
    Report {
        scenario: s.lab.name.clone(),
        description: s.lab.description.clone(),
        file: s.file.display().to_string(),
        command: command.to_string(),
        duration_s: s.lab.duration_s,
        sample_ms: s.lab.sample_ms,
        environment: outcome.environment.clone(),
        phases,
        changes,
        expectations,
        failures,
        t_s,
        tenant_mib_per_s,
        workload_p99_us,
        workload_ops_per_s,
        passed,
    }
}

fn quantile_us(iv: &Interval, q: f64) -> Option<f64> {
    (!iv.latency.is_empty()).then(|| iv.latency.value_at_quantile(q) as f64 / 1000.0)
}

/// Jain's fairness index of `x` (1: all equal; 1/n: one has everything).
pub fn jain(x: &[f64]) -> Option<f64> {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    (!x.is_empty() && sq > 0.0).then(|| sum * sum / (x.len() as f64 * sq))
}

struct Analysis<'a> {
    s: &'a Scenario,
    o: &'a Outcome,
}

impl Analysis<'_> {
    /// The interval range of `[from_s, to_s)`.
    fn range(&self, from_s: f64, to_s: f64) -> (usize, usize) {
        let per = self.o.interval.as_secs_f64();
        let idx = |t: f64| ((t / per).round().max(0.0) as usize).min(self.o.intervals);
        let (a, b) = (idx(from_s), idx(to_s));
        (a, b.max(a + 1).min(self.o.intervals.max(a + 1)))
    }

    fn secs(&self, a: usize, b: usize) -> f64 {
        (b.saturating_sub(a)) as f64 * self.o.interval.as_secs_f64()
    }

    /// Tenants that have VMs, by index.
    fn tenants(&self) -> Vec<usize> {
        (0..self.s.config.tenants.len())
            .filter(|&t| (0..self.s.config.vms.len()).any(|v| self.s.tenant_of(v) == t))
            .collect()
    }

    fn vms_of(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.s.config.vms.len()).filter(move |&v| self.s.tenant_of(v) == t)
    }

    fn tenant_bytes(&self, t: usize, a: usize, b: usize) -> u64 {
        self.vms_of(t)
            .map(|v| self.o.samples.delta(v, a, b).bytes)
            .sum()
    }

    fn tenant_ops(&self, t: usize, a: usize, b: usize) -> u64 {
        self.vms_of(t)
            .map(|v| self.o.samples.delta(v, a, b).ops)
            .sum()
    }

    /// VM `v` has a workload through all of phase `p`.
    fn vm_active(&self, v: usize, p: &Phase) -> bool {
        self.s
            .workloads
            .iter()
            .any(|w| w.vm == v && w.start_s <= p.from_s && w.stop_s >= p.to_s)
    }

    /// The weights of the VMs and tenants in force at time `at`.
    fn weights(&self, at: f64) -> (Vec<u32>, Vec<u32>) {
        let c = &self.s.config;
        let mut vms: Vec<u32> = c
            .vms
            .iter()
            .map(|v| c.qos_spec(v.qos_class.as_deref()).weight)
            .collect();
        let mut tenants: Vec<u32> = c
            .tenants
            .iter()
            .map(|t| c.tenant_qos_spec(t.qos_class.as_deref()).weight)
            .collect();
        for ch in self.s.changes.iter().filter(|ch| ch.at_s <= at) {
            if let Some(w) = ch.weight {
                match ch.target {
                    Target::Vm(v) => vms[v] = w,
                    Target::Tenant(t) => tenants[t] = w,
                }
            }
        }
        (vms, tenants)
    }

    fn phase(&self, p: &Phase) -> PhaseReport {
        let (a, b) = self.range(p.from_s, p.to_s);
        let secs = self.secs(a, b).max(f64::MIN_POSITIVE);
        let (vw, tw) = self.weights((p.from_s + p.to_s) / 2.0);
        let c = &self.s.config;
        let workloads = self
            .s
            .workloads
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let m = merge(&self.o.recorders[k].intervals, a, b);
                let honest = matches!(w.kind, Kind::Honest { .. });
                let q = |x| if honest { quantile_us(&m, x) } else { None };
                WorkloadStats {
                    name: w.name.clone(),
                    vm: c.vms[w.vm].name.clone(),
                    tenant: c.vms[w.vm].tenant.clone(),
                    what: describe(&w.kind),
                    ops_per_s: honest.then(|| m.ops as f64 / secs),
                    mib_per_s: honest.then(|| m.bytes as f64 / MIB / secs),
                    p50_us: q(0.5),
                    p99_us: q(0.99),
                    p999_us: q(0.999),
                    max_us: (honest && !m.latency.is_empty())
                        .then(|| m.latency.max() as f64 / 1000.0),
                    missed_posts: m.missed,
                }
            })
            .collect();
        let tenants_idx = self.tenants();
        let tenant_active: Vec<bool> = tenants_idx
            .iter()
            .map(|&t| self.vms_of(t).any(|v| self.vm_active(v, p)))
            .collect();
        let total: u64 = tenants_idx
            .iter()
            .map(|&t| self.tenant_bytes(t, a, b))
            .sum();
        let active_weight: f64 = tenants_idx
            .iter()
            .zip(&tenant_active)
            .filter(|(_, on)| **on)
            .map(|(&t, _)| f64::from(tw[t]))
            .sum();
        let frac = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
        let tenants: Vec<RateStats> = tenants_idx
            .iter()
            .zip(&tenant_active)
            .map(|(&t, &on)| RateStats {
                name: c.tenants[t].name.clone(),
                tenant: String::new(),
                ops_per_s: self.tenant_ops(t, a, b) as f64 / secs,
                mib_per_s: self.tenant_bytes(t, a, b) as f64 / MIB / secs,
                share: frac(self.tenant_bytes(t, a, b), total),
                weight: tw[t],
                ideal_share: if on && active_weight > 0.0 {
                    f64::from(tw[t]) / active_weight
                } else {
                    0.0
                },
                active: on,
            })
            .collect();
        let vms = (0..c.vms.len())
            .map(|v| {
                let t = self.s.tenant_of(v);
                let on = self.vm_active(v, p);
                let siblings: f64 = self
                    .vms_of(t)
                    .filter(|&x| self.vm_active(x, p))
                    .map(|x| f64::from(vw[x]))
                    .sum();
                let d = self.o.samples.delta(v, a, b);
                RateStats {
                    name: c.vms[v].name.clone(),
                    tenant: c.vms[v].tenant.clone(),
                    ops_per_s: d.ops as f64 / secs,
                    mib_per_s: d.bytes as f64 / MIB / secs,
                    share: frac(d.bytes, self.tenant_bytes(t, a, b)),
                    weight: vw[v],
                    ideal_share: if on && siblings > 0.0 {
                        f64::from(vw[v]) / siblings
                    } else {
                        0.0
                    },
                    active: on,
                }
            })
            .collect();
        let normalized: Vec<f64> = tenants
            .iter()
            .filter(|t| t.active && t.ideal_share > 0.0)
            .map(|t| t.share / t.ideal_share)
            .collect();
        let engines = (0..self.o.samples.engine_count())
            .map(|e| {
                let d = self.o.samples.engine_delta(e, a, b);
                EngineReport {
                    index: d.index,
                    wqes_per_s: d.wqes as f64 / secs,
                    mib_per_s: d.bytes as f64 / MIB / secs,
                    parks_per_s: d.parks as f64 / secs,
                    late_kicks: d.late_kicks,
                }
            })
            .collect();
        PhaseReport {
            name: p.name.clone(),
            engines,
            from_s: a as f64 * self.o.interval.as_secs_f64(),
            to_s: b as f64 * self.o.interval.as_secs_f64(),
            workloads,
            vms,
            tenants,
            jain: if normalized.len() >= 2 {
                jain(&normalized)
            } else {
                None
            },
        }
    }

    fn value(&self, e: &Expect, p: &PhaseReport) -> Option<f64> {
        let c = &self.s.config;
        let rate = |r: &RateStats| match e.metric {
            Metric::MibPerS => Some(r.mib_per_s),
            Metric::OpsPerS => Some(r.ops_per_s),
            Metric::Share => Some(r.share),
            Metric::ShareError => Some((r.share - r.ideal_share).abs()),
            _ => None,
        };
        match e.subject {
            Subject::All => p.jain,
            Subject::Workload(k) => {
                let w = p.workloads.get(k)?;
                match e.metric {
                    Metric::P50Us => w.p50_us,
                    Metric::P99Us => w.p99_us,
                    Metric::P999Us => w.p999_us,
                    Metric::MibPerS => w.mib_per_s,
                    Metric::OpsPerS => w.ops_per_s,
                    _ => None,
                }
            }
            Subject::Vm(v) => p.vms.get(v).and_then(rate),
            Subject::Tenant(t) => p
                .tenants
                .iter()
                .find(|x| x.name == c.tenants[t].name)
                .and_then(rate),
        }
    }

    fn verdict(&self, e: &Expect, phases: &[PhaseReport]) -> Verdict {
        let value = phases.get(e.phase).and_then(|p| self.value(e, p));
        let baseline = e
            .relative_to
            .and_then(|r| phases.get(r))
            .and_then(|p| self.value(e, p));
        let scale = match e.relative_to {
            Some(_) => baseline,
            None => Some(1.0),
        };
        let (min, max) = match scale {
            Some(k) => (e.min.map(|m| m * k), e.max.map(|m| m * k)),
            None => (None, None),
        };
        let pass = match (value, scale) {
            (Some(v), Some(_)) => min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m),
            _ => false,
        };
        Verdict {
            label: e.label.clone(),
            value,
            baseline,
            ratio: match (e.relative_to, value, baseline) {
                (Some(_), Some(v), Some(b)) if b > 0.0 => Some(v / b),
                _ => None,
            },
            min,
            max,
            pass,
        }
    }
}

fn describe(k: &Kind) -> String {
    match k {
        Kind::Attack { name, msg } => format!("attack {name} ({} MiB messages)", msg >> 20),
        Kind::Honest {
            op,
            size,
            qps,
            depth,
            rate,
            ..
        } => {
            let op = match op {
                crate::scenario::Op::Write => "WRITE",
                crate::scenario::Op::Read => "READ",
                crate::scenario::Op::Send => "SEND",
            };
            let pace = rate.map_or("closed loop".into(), |r| format!("{r}/s"));
            format!(
                "{op} {} x {depth} deep on {qps} QP, {pace}",
                bytes(u64::from(*size))
            )
        }
    }
}

fn bytes(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1024 && b % 1024 == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// An expectation over every run.
#[derive(Debug, Clone, Serialize)]
pub struct Expectation {
    /// Its label.
    pub label: String,
    /// Its bounds are multiples of the same metric in another phase of the
    /// same run: the values are those ratios.
    pub relative: bool,
    /// Lower bound (a ratio if `relative`).
    pub min: Option<f64>,
    /// Upper bound (a ratio if `relative`).
    pub max: Option<f64>,
    /// Per run: the value, or its ratio to the baseline.
    pub values: Vec<Option<f64>>,
    /// Their median (none if a run has no value).
    pub median: Option<f64>,
    /// The median is within the bounds.
    pub pass: bool,
}

/// The runs of a scenario and the verdicts on their medians.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The scenario's name.
    pub scenario: String,
    /// What it asks.
    pub description: String,
    /// Its file.
    pub file: String,
    /// The command line.
    pub command: String,
    /// The expectations, judged on the median over the runs (of each
    /// run's ratio to its own baseline, for relative ones: this machine's
    /// speed changes between minutes).
    pub expectations: Vec<Expectation>,
    /// Every expectation held, and no workload or change failed in any run.
    pub passed: bool,
    /// The runs.
    pub runs: Vec<Report>,
}

/// The median of `v` (none for none).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied()
}

/// Judges `s`'s expectations on the medians over `runs`.
pub fn summarize(s: &Scenario, runs: Vec<Report>, command: &str) -> Summary {
    let expectations: Vec<Expectation> = s
        .expects
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let relative = e.relative_to.is_some();
            let values: Vec<Option<f64>> = runs
                .iter()
                .map(|r| {
                    r.expectations
                        .get(k)
                        .and_then(|v| if relative { v.ratio } else { v.value })
                })
                .collect();
            let all: Option<Vec<f64>> = values.iter().copied().collect();
            let med = all.as_deref().and_then(median);
            let pass =
                med.is_some_and(|v| e.min.is_none_or(|m| v >= m) && e.max.is_none_or(|m| v <= m));
            Expectation {
                label: e.label.clone(),
                relative,
                min: e.min,
                max: e.max,
                values,
                median: med,
                pass,
            }
        })
        .collect();
    let clean = runs
        .iter()
        .all(|r| r.failures.is_empty() && r.changes.iter().all(|c| c.error.is_none()));
    Summary {
        scenario: s.lab.name.clone(),
        description: s.lab.description.clone(),
        file: s.file.display().to_string(),
        command: command.to_string(),
        passed: clean && expectations.iter().all(|e| e.pass),
        expectations,
        runs,
    }
}

/// The summary as Markdown; `plots` are the runs' plot file names.
pub fn markdown(sum: &Summary, plots: &[String]) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# QoS lab: {}\n", sum.scenario);
    if !sum.description.is_empty() {
        let _ = writeln!(m, "{}\n", sum.description.trim());
    }
    let _ = writeln!(
        m,
        "- scenario: `{}`; {} run(s)\n- command: `{}`\n- verdict: **{}**\n",
        sum.file,
        sum.runs.len(),
        sum.command,
        if sum.passed { "PASS" } else { "MISS" }
    );
    if !sum.expectations.is_empty() {
        let _ = writeln!(
            m,
            "## Expectations\n\nJudged on the median over the runs; a bound marked x is a multiple of the same metric in the named phase of the same run.\n\n| expectation | per run | median | bound | verdict |\n|---|---|---:|---|---|"
        );
        for e in &sum.expectations {
            let x = if e.relative { " x" } else { "" };
            let bound = match (e.min, e.max) {
                (Some(a), Some(b)) => format!("{a}{x} ..= {b}{x}"),
                (Some(a), None) => format!(">= {a}{x}"),
                (None, Some(b)) => format!("<= {b}{x}"),
                (None, None) => String::new(),
            };
            let per: Vec<String> = e.values.iter().map(|v| opt(*v, 3)).collect();
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} |",
                e.label,
                per.join(", "),
                opt(e.median, 3),
                bound,
                if e.pass { "PASS" } else { "**MISS**" }
            );
        }
        m.push('\n');
    }
    for (k, r) in sum.runs.iter().enumerate() {
        run_markdown(&mut m, k + 1, r, plots.get(k).map(String::as_str));
    }
    m
}

fn run_markdown(m: &mut String, k: usize, r: &Report, plot: Option<&str>) {
    let _ = writeln!(
        m,
        "## Run {k}\n\n- {} s, sampled every {} ms\n- machine: {}; {} build\n- load average: {} before, {} after\n- threads: {}\n",
        r.duration_s,
        r.sample_ms,
        r.environment.machine,
        r.environment.build,
        r.environment.load_before,
        r.environment.load_after,
        r.environment.threads,
    );
    if let Some(p) = plot {
        let _ = writeln!(m, "![run {k}: throughput and latency over time]({p})\n");
    }
    if !r.expectations.is_empty() {
        let _ = writeln!(
            m,
            "| expectation | value | bound | baseline | verdict |\n|---|---:|---|---:|---|"
        );
        for v in &r.expectations {
            let bound = match (v.min, v.max) {
                (Some(a), Some(b)) => format!("{a:.3} ..= {b:.3}"),
                (Some(a), None) => format!(">= {a:.3}"),
                (None, Some(b)) => format!("<= {b:.3}"),
                (None, None) => "(no baseline)".into(),
            };
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} |",
                v.label,
                opt(v.value, 3),
                bound,
                opt(v.baseline, 3),
                if v.pass { "PASS" } else { "**MISS**" }
            );
        }
        m.push('\n');
    }
    if !r.failures.is_empty() {
        let _ = writeln!(m, "Failures:\n");
        for (w, e) in &r.failures {
            let _ = writeln!(m, "- workload {w}: {e}");
        }
        m.push('\n');
    }
    if !r.changes.is_empty() {
        let _ = writeln!(
            m,
            "| live QoS change | planned, s | in force, s | result |\n|---|---:|---:|---|"
        );
        for c in &r.changes {
            let _ = writeln!(
                m,
                "| {} | {:.2} | {:.3} | {} |",
                c.what,
                c.planned_s,
                c.at_s,
                c.error.as_deref().unwrap_or("ok")
            );
        }
        m.push('\n');
    }
    for p in &r.phases {
        phase_markdown(m, p);
    }
}

fn phase_markdown(m: &mut String, p: &PhaseReport) {
    let _ = writeln!(
        m,
        "### Phase {} ({:.2}–{:.2} s)\n",
        p.name, p.from_s, p.to_s
    );
    let _ = writeln!(m, "| workload | VM | tenant | what | ops/s | MiB/s | p50 µs | p99 µs | p99.9 µs | max µs | missed posts |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for w in &p.workloads {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            w.name,
            w.vm,
            w.tenant,
            w.what,
            opt(w.ops_per_s, 0),
            opt(w.mib_per_s, 1),
            opt(w.p50_us, 2),
            opt(w.p99_us, 2),
            opt(w.p999_us, 2),
            opt(w.max_us, 1),
            w.missed_posts
        );
    }
    let _ = writeln!(m, "\n| tenant | MiB/s | ops/s | share | weight | weight's share |\n|---|---:|---:|---:|---:|---:|");
    for t in &p.tenants {
        let _ = writeln!(
            m,
            "| {}{} | {:.1} | {:.0} | {:.3} | {} | {:.3} |",
            t.name,
            if t.active { "" } else { " (idle)" },
            t.mib_per_s,
            t.ops_per_s,
            t.share,
            t.weight,
            t.ideal_share
        );
    }
    let _ = writeln!(m, "\n| VM | tenant | MiB/s | ops/s | share of tenant | weight | weight's share |\n|---|---|---:|---:|---:|---:|---:|");
    for v in &p.vms {
        let _ = writeln!(
            m,
            "| {}{} | {} | {:.1} | {:.0} | {:.3} | {} | {:.3} |",
            v.name,
            if v.active { "" } else { " (idle)" },
            v.tenant,
            v.mib_per_s,
            v.ops_per_s,
            v.share,
            v.weight,
            v.ideal_share
        );
    }
    let _ = writeln!(
        m,
        "\n| engine thread | WQEs/s | MiB/s | parks/s | late kicks |\n|---|---:|---:|---:|---:|"
    );
    for e in &p.engines {
        let _ = writeln!(
            m,
            "| {} | {:.0} | {:.1} | {:.0} | {} |",
            e.index, e.wqes_per_s, e.mib_per_s, e.parks_per_s, e.late_kicks
        );
    }
    let _ = writeln!(
        m,
        "\nJain's fairness index of the active tenants' weighted throughput: {}\n",
        opt(p.jain, 3)
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), Some(1.0));
        let j = jain(&[1.0, 0.0]).unwrap();
        assert!((j - 0.5).abs() < 1e-12);
        let j = jain(&[3.0, 1.0]).unwrap();
        assert!((j - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(bytes(64), "64 B");
        assert_eq!(bytes(65536), "64 KiB");
        assert_eq!(bytes(1 << 20), "1 MiB");
        assert_eq!(bytes(1000), "1000 B");
    }
}
