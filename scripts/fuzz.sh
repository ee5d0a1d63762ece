#!/usr/bin/env bash
# Runs the cargo-fuzz targets (libFuzzer, nightly) for a while each, then
# minimizes each target's corpus (`cargo fuzz cmin`) into the committed
# corpus directory fuzz/corpus/<target>/, and prints the executions per
# target. See fuzz/README.md.
#
# Usage: scripts/fuzz.sh [--time SECONDS] [--target NAME] [--no-cmin]
#   --time SECONDS  fuzzing time per target (default 60)
#   --target NAME   one target (ctrl, wqe, engine, vhost or state; default: all)
#   --no-cmin       skip the minimization
# Environment: FUZZ_SANITIZER (default none: guest RAM is mmap(2)ed, which
#   AddressSanitizer does not watch; "address" is ~2x slower),
#   FUZZ_ARGS (extra libFuzzer arguments), RDMA_FUZZ_NO_QPN_REUSE=1 (the
#   engine harness does not reuse QP numbers), RDMA_FUZZ_FRESH=1 (a new
#   daemon for every engine input, as before issue 26; for triage).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

time_per=60
targets=(ctrl wqe engine vhost state)
cmin=1
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_per="$2"; shift 2 ;;
    --target) targets=("$2"); shift 2 ;;
    --no-cmin) cmin=0; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

sanitizer="${FUZZ_SANITIZER:-none}"
fuzz=(cargo +nightly fuzz)
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz missing: cargo install cargo-fuzz --locked" >&2
  exit 1
fi

# Per target: longest input, and the per-input timeout of libFuzzer (the
# engine harness has its own watchdog, which aborts with a message first).
max_len() { case "$1" in engine) echo 768 ;; *) echo 4096 ;; esac; }
per_input_timeout() { case "$1" in engine) echo 90 ;; vhost) echo 40 ;; *) echo 10 ;; esac; }
# The engine target is slow (tens of executions per second): long inputs
# from the start, and a corpus minimized on edges only (hit counts ignored),
# so that its replay on every test run stays in seconds.
run_args() { case "$1" in engine) echo -len_control=0 ;; *) echo ;; esac; }
cmin_args() { case "$1" in engine | state) echo -use_counters=0 ;; *) echo ;; esac; }
# The engine target without comparison tracing: 20 % more executions; the
# values it compares are keys and QP numbers drawn anew in every execution,
# which the fuzzer's comparison hints could not reuse anyway. In its own
# target directory, since other flags rebuild everything.
build_args() {
  case "$1" in
    engine) echo --no-trace-compares --target-dir target/engine ;;
    state) echo --target-dir target/state ;;
    *) echo ;;
  esac
}

for t in "${targets[@]}"; do
  # shellcheck disable=SC2046
  nice -n 10 "${fuzz[@]}" build -s "$sanitizer" $(build_args "$t") "$t"
done

mkdir -p logs
summary=()
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  before=$(ls "corpus/$t" | wc -l)
  log="logs/$t.log"
  echo "== fuzzing $t for ${time_per}s (corpus: $before files)"
  start=$(date +%s)
  set +e
  # shellcheck disable=SC2086
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  nice -n 10 "${fuzz[@]}" run -s "$sanitizer" $(build_args "$t") "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$time_per" -print_final_stats=1 \
    -max_len="$(max_len "$t")" -timeout="$(per_input_timeout "$t")" \
    $(run_args "$t") ${FUZZ_ARGS:-} >"$log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  if [ $rc -ne 0 ]; then
    status=1
    echo "!! $t: libFuzzer exited with $rc; see fuzz/$log and fuzz/artifacts/$t/"
    grep -E 'panicked at|HANG|ERROR: libFuzzer|Test unit written' "$log" | head -5 || true
  fi
  if [ $cmin = 1 ]; then
    echo "== minimizing the $t corpus"
    # shellcheck disable=SC2046
    nice -n 10 "${fuzz[@]}" cmin -s "$sanitizer" $(build_args "$t") "$t" "corpus/$t" -- \
      -timeout="$(per_input_timeout "$t")" $(cmin_args "$t") >"logs/$t.cmin.log" 2>&1 ||
      echo "!! $t: cmin failed, see fuzz/logs/$t.cmin.log"
  fi
  after=$(ls "corpus/$t" | wc -l)
  size=$(du -sk "corpus/$t" | cut -f1)
  summary+=("$(printf '%-7s %12s executions in %6ss (%s/s); corpus %s -> %s files, %s KiB' \
    "$t" "$execs" "$secs" "$(( execs / (secs > 0 ? secs : 1) ))" "$before" "$after" "$size")")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
