//! Helpers shared by the benchmark binaries: thread placement and a
//! description of the machine, printed with every result.

use std::collections::BTreeMap;
use std::io;

/// Pins the calling thread to `cpu` (threads it creates inherit it).
pub fn pin_current(cpu: usize) -> io::Result<()> {
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(1024);
    if cpu >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} out of range"),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (checked above), so the bit lies in `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; the pointer and size describe a
    // live cpu_set_t that the kernel only reads.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("sched_setaffinity(CPU {cpu}): {e}"),
        ));
    }
    Ok(())
}

/// Threads of this process grouped by the CPUs they may run on, read from
/// /proc (shows that the placement took effect).
pub fn thread_placement() -> String {
    let mut by_cpus: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return "(no /proc/self/task)".into();
    };
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpus = std::fs::read_to_string(p.join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| "?".into());
        *by_cpus.entry(cpus).or_default().entry(comm).or_default() += 1;
    }
    by_cpus
        .iter()
        .map(|(cpus, names)| {
            let list: Vec<String> = names
                .iter()
                .map(|(n, k)| {
                    if *k > 1 {
                        format!("{n}x{k}")
                    } else {
                        n.clone()
                    }
                })
                .collect();
            format!("CPU {cpus}: {}", list.join(", "))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Prints what every benchmark prints first: `tool`'s command line, the
/// build profile, the machine and the load average.
pub fn print_header(tool: &str) {
    let cmdline: Vec<String> = std::env::args().collect();
    println!("{tool}: {}", cmdline.join(" "));
    println!(
        "  build: {}",
        if cfg!(debug_assertions) {
            "debug (numbers are not meaningful)"
        } else {
            "release"
        }
    );
    println!("  machine: {}", machine());
    println!("  load average at start: {}", loadavg());
}

/// The machine: CPU count, model and kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "?".into());
    // SAFETY: sysconf has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "nproc {online}, model name \"{model}\", kernel {}",
        kernel.trim()
    )
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
