#!/usr/bin/env bash
# Compares rdma_perf between two revisions in one run: builds both (release,
# each in its own worktree under $CACHE), then runs them alternately ROUNDS
# times and prints, per metric, the median of each side and the ratio B/A.
# Alternating on the same machine in the same minutes is what makes the
# ratio meaningful on a noisy machine (docs/benchmarks.md).
#
# Usage: bash scripts/perf-ab.sh [-r ROUNDS] [-e VAR=VALUE] [-x ARG] REV_A REV_B -- RDMA_PERF_ARGS...
#   -e and -x (repeatable) add an environment variable or an rdma_perf
#   argument to side B only (REV_A and REV_B may then be the same).
# Examples: bash scripts/perf-ab.sh -r 7 4cc07e1 HEAD -- write_lat -s 64 --shmem
#           bash scripts/perf-ab.sh -x --fence-elision HEAD HEAD -- write_bw -s 64
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=5
ENV_B=()
ARGS_B=()
while getopts "r:e:x:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    e) ENV_B+=("$OPTARG") ;;
    x) ARGS_B+=("$OPTARG") ;;
    *) echo "usage: $0 [-r ROUNDS] [-e VAR=VALUE] REV_A REV_B -- ARGS..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 3 ] && [ "$3" = "--" ] || { echo "usage: $0 [-r ROUNDS] REV_A REV_B -- ARGS..." >&2; exit 2; }
REV_A=$1 REV_B=$2
shift 3

CACHE=${PERF_AB_CACHE:-$HOME/.cache/vhost-user-rdma/perf-ab}
mkdir -p "$CACHE"

build() {
  local rev=$1 sha dir
  sha=$(git rev-parse --short=12 "$rev^{commit}")
  dir=$CACHE/$sha
  if [ ! -x "$dir/rdma_perf" ]; then
    rm -rf "$dir/src"
    git worktree add --detach -f "$dir/src" "$sha" >/dev/null
    (cd "$dir/src" && CARGO_TARGET_DIR=$CACHE/target cargo build --release --locked -q \
      -p vhost-user-rdma-tests --bin rdma_perf) >&2
    cp "$CACHE/target/release/rdma_perf" "$dir/rdma_perf"
    git worktree remove --force "$dir/src"
  fi
  echo "$dir/rdma_perf"
}

BIN_A=$(build "$REV_A")
BIN_B=$(build "$REV_B")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "A = $REV_A ($BIN_A)"
echo "B = $REV_B ($BIN_B) ${ENV_B[*]:-} ${ARGS_B[*]:-}"
echo "rdma_perf $*, $ROUNDS rounds, alternating"
for r in $(seq 1 "$ROUNDS"); do
  "$BIN_A" "$@" 2>&1 | awk 'f && NF == 2 { print } /^summary/ { f = 1 }' >>"$OUT/a"
  env "${ENV_B[@]}" "$BIN_B" "$@" "${ARGS_B[@]}" 2>&1 | awk 'f && NF == 2 { print } /^summary/ { f = 1 }' >>"$OUT/b"
done
python3 - "$OUT/a" "$OUT/b" <<'EOF'
import statistics, sys
def load(p):
    d = {}
    for line in open(p):
        k, v = line.split()
        d.setdefault(k, []).append(float(v))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"{'metric':44} {'A median':>10} {'B median':>10} {'B/A':>7}")
for k in a:
    if k not in b:
        continue
    ma, mb = statistics.median(a[k]), statistics.median(b[k])
    ratio = mb / ma if ma else float('nan')
    print(f"{k:44} {ma:10.4f} {mb:10.4f} {ratio:7.3f}")
EOF
