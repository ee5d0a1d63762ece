//! `vhost-user-rdma-lab SCENARIO.toml`: runs a QoS scenario and writes
//! `<out>/<name>.json`, `<name>.md` and `<name>.svg` (docs/qos-lab.md).
//! Exit status: 0 if every expectation held, 1 if one missed or a workload
//! failed, 2 if the scenario could not be run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vhost_user_rdma_lab::report::{analyse, markdown, summarize};
use vhost_user_rdma_lab::scenario::Scenario;
use vhost_user_rdma_lab::{plot, run};

#[derive(Parser, Debug)]
#[command(
    name = "vhost-user-rdma-lab",
    version,
    about = "Runs a QoS scenario against vhost-user-rdma's engine and reports throughput, latency, shares and fairness (docs/qos-lab.md)"
)]
struct Args {
    /// The scenario file (TOML: the daemon's configuration tables plus the
    /// lab's [lab], [[workload]], [[change]], [[phase]], [[expect]]).
    scenario: PathBuf,
    /// Directory of the results (created if missing).
    #[arg(long, short, default_value = "lab-results")]
    out: PathBuf,
    /// Runs (default: the scenario's `[lab] runs`, else 1); expectations
    /// are judged on the medians.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: Option<u32>,
    /// Only check the scenario; run nothing.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    match lab(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("vhost-user-rdma-lab: {e}");
            ExitCode::from(2)
        }
    }
}

fn lab(args: &Args) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let s = Scenario::load(&args.scenario)?;
    if args.check {
        println!(
            "{}: {} workloads, {} VMs in {} tenants, {} changes, {} phases, {} expectations: ok",
            s.file.display(),
            s.workloads.len(),
            s.config.vms.len(),
            s.config.tenants.len(),
            s.changes.len(),
            s.phases.len(),
            s.expects.len()
        );
        return Ok(true);
    }
    if cfg!(debug_assertions) {
        eprintln!("vhost-user-rdma-lab: a debug build: the numbers are not meaningful (cargo build --release)");
    }
    let runs = args.runs.map_or(s.lab.runs, |r| r as usize);
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let command: Vec<String> = std::env::args().collect();
    let command = command.join(" ");
    let base = args.out.join(&s.lab.name);
    let mut reports = Vec::new();
    let mut plots = Vec::new();
    for k in 1..=runs {
        let outcome = run::run(&s)?;
        let report = analyse(&s, &outcome, &command);
        let svg = if runs == 1 {
            base.with_extension("svg")
        } else {
            args.out.join(format!("{}-run{k}.svg", s.lab.name))
        };
        plot::draw(&report, &svg)?;
        plots.push(
            svg.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        for v in &report.expectations {
            println!(
                "run {k}/{runs}: {} {}: {}",
                if v.pass { "PASS" } else { "MISS" },
                v.label,
                v.value.map_or("no value".into(), |x| format!("{x:.3}"))
            );
        }
        for (w, e) in &report.failures {
            println!("run {k}/{runs}: FAILED workload {w}: {e}");
        }
        for c in &report.changes {
            if let Some(e) = &c.error {
                println!("run {k}/{runs}: FAILED change {}: {e}", c.what);
            }
        }
        reports.push(report);
    }
    let summary = summarize(&s, reports, &command);
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(base.with_extension("json"), json + "\n")?;
    std::fs::write(base.with_extension("md"), markdown(&summary, &plots))?;
    if runs > 1 {
        for e in &summary.expectations {
            println!(
                "median of {runs}: {} {}: {}",
                if e.pass { "PASS" } else { "MISS" },
                e.label,
                e.median.map_or("no value".into(), |x| format!("{x:.3}"))
            );
        }
    }
    println!(
        "{}: {} -> {}.{{json,md}} and {}",
        s.lab.name,
        if summary.passed { "PASS" } else { "MISS" },
        base.display(),
        plots.join(", ")
    );
    Ok(summary.passed)
}
