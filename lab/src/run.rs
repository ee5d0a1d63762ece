//! One run of a scenario: the real daemon in this process with the
//! scenario's configuration, every VM connected over its vhost-user socket
//! by the test VMM, each workload on a thread of its own, the engine's
//! counters sampled every interval, and the live QoS changes sent to the
//! management socket at their times, as an operator's `ctl qos` would.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde_json::{json, Value};
use vhost_user_rdma::mgmt::client::Client;
use vhost_user_rdma_tests::bench::{loadavg, machine, pin_current, thread_placement};
use vhost_user_rdma_tests::dp::Vm;
use vhost_user_rdma_tests::harness::TestDaemon;
use vhost_user_rdma_tests::transport::VmmTransport;
use vhost_user_rdma_tests::vmm::{TestVmm, VmmOptions};
use virtio_rdma_driver::{Device, Pd};

use crate::record::{Recorder, Samples, VmCounters};
use crate::scenario::{Change, Scenario, Target};
use crate::workload::Runner;

type BoxError = Box<dyn StdError + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Time between setting up and the run's start, for the threads to be
/// scheduled and parked at their start times.
const LEAD: Duration = Duration::from_millis(200);
/// How long a management request may take.
const MGMT_TIMEOUT: Duration = Duration::from_secs(10);

/// A live QoS change as it happened.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Index in the scenario's changes.
    pub index: usize,
    /// Seconds from the start when the daemon answered.
    pub at_s: f64,
    /// What it changed.
    pub what: String,
    /// The daemon's answer said it was in force (or the error).
    pub result: Result<(), String>,
}

/// What a run measured.
pub struct Outcome {
    /// Per workload, in the scenario's order.
    pub recorders: Vec<Recorder>,
    /// Per workload: why it stopped early.
    pub failures: Vec<Option<String>>,
    /// The engine's per-VM counters at every interval boundary.
    pub samples: Samples,
    /// The live changes.
    pub applied: Vec<Applied>,
    /// Intervals of the run.
    pub intervals: usize,
    /// Their length.
    pub interval: Duration,
    /// The machine, load and thread placement, for the record.
    pub environment: Environment,
}

/// Where a run ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Environment {
    /// CPUs, model, kernel.
    pub machine: String,
    /// Load average before the run.
    pub load_before: String,
    /// Load average after it.
    pub load_after: String,
    /// The threads by CPU during the run.
    pub threads: String,
    /// Release or debug build.
    pub build: String,
}

/// Runs scenario `s`.
pub fn run(s: &Scenario) -> Res<Outcome> {
    let load_before = loadavg();
    let d = start_daemon(s)?;
    if let Some(&cpu) = s.lab.client_cpus.first() {
        pin_current(cpu)?;
    }
    let mut vms = Vec::new();
    for i in 0..s.config.vms.len() {
        vms.push(open_vm(&d, i).map_err(|e| format!("VM {}: {e}", s.config.vms[i].name))?);
    }
    let mut runners = Vec::new();
    for w in &s.workloads {
        runners.push(Runner::new(w, &vms).map_err(|e| format!("workload {}: {e}", w.name))?);
    }
    let interval = Duration::from_millis(s.lab.sample_ms);
    let intervals = usize::try_from(
        (s.lab.duration_s * 1000.0 / s.lab.sample_ms as f64)
            .ceil()
            .max(1.0) as u64,
    )?;
    let mgmt = s
        .config_in(d.dir())
        .mgmt_socket
        .ok_or("the daemon has no management socket")?;
    let mut client = Client::connect(&mgmt, MGMT_TIMEOUT)?;
    let abort = AtomicBool::new(false);
    let t0 = Instant::now() + LEAD;
    let end = t0 + interval * u32::try_from(intervals)?;
    info!(
        "{}: {} workloads on {} VMs, {:.1} s",
        s.lab.name,
        s.workloads.len(),
        vms.len(),
        s.lab.duration_s
    );
    let mut threads = String::new();
    let (recorders, failures, samples, applied) = std::thread::scope(|sc| -> Res<_> {
        let mut handles = Vec::new();
        for (k, (w, mut r)) in s.workloads.iter().zip(runners).enumerate() {
            let cpu = (!s.lab.client_cpus.is_empty())
                .then(|| s.lab.client_cpus[k % s.lab.client_cpus.len()]);
            let abort = &abort;
            handles.push(
                std::thread::Builder::new()
                    .name(format!("lab-{}", w.name))
                    .spawn_scoped(sc, move || {
                        let mut rec = Recorder::new(t0, interval, intervals);
                        let res = prepare_thread(cpu, w.nice)
                            .and_then(|()| r.run(w, t0, abort, &mut rec));
                        // The runner (its QPs) goes before the VMs do.
                        drop(r);
                        (rec, res.err().map(|e| e.to_string()))
                    })?,
            );
        }
        let daemon = &d;
        let n_vms = vms.len();
        let sampler = std::thread::Builder::new()
            .name("lab-sampler".into())
            .spawn_scoped(sc, move || sample(daemon, n_vms, t0, interval, intervals))?;
        let applied = apply_changes(s, &mut client, t0, &abort);
        std::thread::sleep(end.saturating_duration_since(Instant::now()) / 2);
        threads = thread_placement();
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        abort.store(true, Ordering::Relaxed);
        let mut recorders = Vec::new();
        let mut failures = Vec::new();
        for h in handles {
            let (rec, err) = h.join().map_err(|_| "a workload thread panicked")?;
            recorders.push(rec);
            failures.push(err);
        }
        let samples = sampler.join().map_err(|_| "the sampler panicked")?;
        Ok((recorders, failures, samples, applied))
    })?;
    for (w, f) in s.workloads.iter().zip(&failures) {
        if let Some(f) = f {
            warn!("workload {} stopped: {f}", w.name);
        }
    }
    drop(vms);
    drop(d);
    Ok(Outcome {
        recorders,
        failures,
        samples,
        applied,
        intervals,
        interval,
        environment: Environment {
            machine: machine(),
            load_before,
            load_after: loadavg(),
            threads,
            build: if cfg!(debug_assertions) {
                "debug (numbers are not meaningful)".into()
            } else {
                "release".into()
            },
        },
    })
}

/// The daemon, started from a thread pinned to the daemon's CPU so that
/// its threads inherit that placement.
fn start_daemon(s: &Scenario) -> Res<TestDaemon> {
    let cpu = s.lab.daemon_cpu;
    std::thread::scope(|sc| {
        sc.spawn(move || -> Res<TestDaemon> {
            if let Some(cpu) = cpu {
                pin_current(cpu)?;
            }
            Ok(TestDaemon::from_config(|dir| Ok(s.config_in(dir)))?)
        })
        .join()
        .map_err(|_| BoxError::from("the daemon's launcher panicked"))?
    })
}

fn open_vm(d: &TestDaemon, i: usize) -> Res<Arc<Vm>> {
    let vmm = TestVmm::connect(d.socket(i), VmmOptions::default())?;
    let t = VmmTransport::new(vmm)?;
    let dev = Device::open(t.clone())?;
    let pd = Pd::alloc(&dev)?;
    Ok(Arc::new(Vm { t, dev, pd }))
}

/// Pins the calling thread and sets its nice value.
fn prepare_thread(cpu: Option<usize>, nice: i32) -> Res<()> {
    if let Some(cpu) = cpu {
        pin_current(cpu)?;
    }
    if nice != 0 {
        // SAFETY: plain system calls on the calling thread (Linux keeps the
        // nice value per thread); no memory is passed.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid)?, nice)
        };
        if rc != 0 {
            return Err(format!("nice {nice}: {}", std::io::Error::last_os_error()).into());
        }
    }
    Ok(())
}

/// Every VM's counters at each of the `intervals + 1` boundaries.
fn sample(
    d: &TestDaemon,
    vms: usize,
    t0: Instant,
    interval: Duration,
    intervals: usize,
) -> Samples {
    let mut out = Samples::default();
    for i in 0..=intervals {
        let at = t0 + interval * u32::try_from(i).unwrap_or(u32::MAX);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        out.at.push(
            (0..vms)
                .map(|v| {
                    d.daemon()
                        .tenancy()
                        .traffic(v)
                        .map(|t| {
                            let s = t.snapshot();
                            VmCounters {
                                bytes: s.send_bytes,
                                ops: s.send_ops,
                            }
                        })
                        .unwrap_or_default()
                })
                .collect(),
        );
        out.engines.push(d.daemon().view().engine_stats());
    }
    out
}

/// Sends each change to the management socket at its time.
fn apply_changes(
    s: &Scenario,
    client: &mut Client,
    t0: Instant,
    abort: &AtomicBool,
) -> Vec<Applied> {
    let mut out = Vec::new();
    for (index, ch) in s.changes.iter().enumerate() {
        let at = t0 + Duration::from_secs_f64(ch.at_s);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        if abort.load(Ordering::Relaxed) {
            break;
        }
        let result = client
            .request(&request(s, ch))
            .map_err(|e| e.to_string())
            .and_then(|v| answer(&v));
        if let Err(e) = &result {
            warn!("change {}: {e}", ch.describe(&s.config));
        }
        out.push(Applied {
            index,
            at_s: t0.elapsed().as_secs_f64(),
            what: ch.describe(&s.config),
            result,
        });
    }
    out
}

/// The management API's `set_qos` for `ch`.
fn request(s: &Scenario, ch: &Change) -> Value {
    let mut r = match ch.target {
        Target::Vm(v) => json!({"cmd": "set_qos", "vm": s.config.vms[v].name}),
        Target::Tenant(t) => json!({"cmd": "set_qos", "tenant": s.config.tenants[t].name}),
    };
    for (k, v) in [
        ("weight", ch.weight.map(u64::from)),
        ("bytes_per_sec", ch.bytes_per_sec),
        ("ops_per_sec", ch.ops_per_sec),
        ("ctrl_per_sec", ch.ctrl_per_sec),
    ] {
        if let (Some(v), Some(m)) = (v, r.as_object_mut()) {
            m.insert(k.into(), Value::from(v));
        }
    }
    r
}

fn answer(v: &Value) -> Result<(), String> {
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        return Err(v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the daemon refused the change")
            .to_string());
    }
    if v.get("applied").and_then(Value::as_bool) == Some(false) {
        return Err("the engine had not applied it after 1 s".into());
    }
    Ok(())
}
