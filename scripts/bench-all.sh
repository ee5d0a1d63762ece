#!/usr/bin/env bash
# Runs every in-process benchmark that docs/benchmarks.md reports, one after
# the other on an otherwise idle machine, each with its baselines of the
# same run, and keeps each command's full output (with the command line and
# the load average) in OUT_DIR. The guest-driver and soft-RoCE rows come
# from the QEMU scripts (`scripts/test.sh` runs them; their logs print the
# numbers).
#
# Usage: bash scripts/bench-all.sh [OUT_DIR] [quick]
#   quick: one short run of each (a smoke test of the script, ~2 minutes)
#
# Takes about 5 minutes on the 2-core build machines. The rows of the
# issue-16 targets are repeated (RUNS times) so that medians can be quoted.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-target/bench-all/$(date +%Y%m%d-%H%M%S)}
QUICK=${2:-}
mkdir -p "$OUT"
cargo build --release --locked --bin rdma_perf --bin ctrl_bench --bin idle_bench >/dev/null
cargo build --release --locked -p vhost-user-rdma >/dev/null
PERF=target/release/rdma_perf
CTRL=target/release/ctrl_bench
IDLE=target/release/idle_bench
RUNS=5
Q=()
if [ "$QUICK" = quick ]; then
  RUNS=1
  Q=(--quick)
fi

n=0
run() {
  local name=$1
  shift
  n=$((n + 1))
  local f
  f=$(printf '%s/%02d-%s.txt' "$OUT" "$n" "$name")
  {
    echo "\$ $*"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$@" 2>&1
  } >"$f" || echo "FAILED: $*" | tee -a "$f"
  echo "$(date +%T) $name -> $f"
}

# Control path (section "Machine and runs"): round trips, QP setup, REG_MR,
# and 100,000 QPs and MRs on one VM (issue 16).
run ctrl "$CTRL" "${Q[@]}"
# Setup under traffic (issue 16).
for qps in 1000 10000 100000; do
  [ "$QUICK" = quick ] && [ "$qps" != 1000 ] && continue
  run ctrl-traffic-$qps "$CTRL" --only qp --placement split --traffic --qps "$qps"
done

# Data path, every size, both doorbell modes, and scattered pages.
run perf-all "$PERF" all -a "${Q[@]}"
run perf-all-shmem "$PERF" all -a --shmem "${Q[@]}"
run perf-scattered "$PERF" write_bw -a --scattered "${Q[@]}"
# Scaling and setup with many QPs.
if [ "$QUICK" = quick ]; then
  run scale "$PERF" --qps 100 --vms 4 --quick
else
  run scale "$PERF" --qps 10000 --vms 4 --secs 3
  for qps in 1000 2000 4000; do
    run setup-$qps "$PERF" --qps "$qps" --vms 2 --secs 0.3 --no-baselines
  done
fi

# Per-engine-thread scaling (issue 32, target 5; docs/scaling.md): the engine
# threads drain send queues filled while they were held, with 1 and then 2
# threads, while the client sleeps.
if [ "$QUICK" = quick ]; then
  run scale-threads "$PERF" --drain --quick
else
  run scale-threads "$PERF" --drain --reps 5
fi

# Idle VMs (issue 32): the daemon's CPU with 1,000 connected idle VMs (fewer if
# the descriptor limit is short: the output says so and scales), and a WRITE
# after idle against warm and against a thread's wake-up.
if [ "$QUICK" = quick ]; then
  run idle "$IDLE" --vms 20 --idle-secs 1 --wakes 5
else
  run idle "$IDLE" --vms 1000
fi

# The issue-16 target rows, repeated: latency and message rate in both
# doorbell modes, bandwidth with scattered pages.
for i in $(seq "$RUNS"); do
  for mode in "" --shmem; do
    for s in 64 512; do
      run "lat-$s${mode:+-shmem}-$i" "$PERF" write_lat -s "$s" -n 20000 $mode "${Q[@]}"
    done
    run "rate${mode:+-shmem}-$i" "$PERF" write_bw -s 64 --reps 3 $mode "${Q[@]}"
  done
  [ "$i" -le 3 ] || continue
  for s in 65536 1048576; do
    run "scattered-$s-$i" "$PERF" write_bw -s "$s" --scattered --reps 3 "${Q[@]}"
  done
done
echo "results in $OUT"
