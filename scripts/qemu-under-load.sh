#!/usr/bin/env bash
# Runs every QEMU test script several times in a row with CPU hogs beside it (`yes` at nice 0,
# one per --hogs), to show the suite holds on a busy machine: its waits are on progress, UD
# allows what UD allows, and each step reports its own verdict. Prints one line per run and a
# closing "qemu-under-load: N passed, M failed"; the hogs are stopped on exit.
#
# Usage: bash scripts/qemu-under-load.sh [--rounds N] [--hogs N] [SCRIPT...]
#   SCRIPT: qemu-e2e, qemu-kmod, qemu-pingpong, qemu-rxe, qemu-kmod-6.12, qemu-pingpong-6.12
#   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh

rounds=3 hogs=2 scripts=()
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
  --hogs) hogs=${2:?--hogs needs a number}; shift 2 ;;
  -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
  qemu-*) scripts+=("$1"); shift ;;
  *) guest_die "unknown argument: $1" ;;
  esac
done
[ ${#scripts[@]} -gt 0 ] ||
  scripts=(qemu-e2e qemu-kmod qemu-pingpong qemu-rxe qemu-kmod-6.12 qemu-pingpong-6.12)

# The logs stay (the library stops the hogs and a running script on exit).
logs=$(mktemp -d /tmp/vhost-user-rdma-load.XXXXXX)
launch_on_exit "echo 'logs in $logs'"
# A script stopped on exit first stops its own guests and daemon, within its own grace.
LAUNCH_GRACE=$((LAUNCH_GRACE * 2 + 10))
for _ in $(seq "$hogs"); do
  launch_bg nice -n 0 yes >/dev/null
done

for r in $(seq "$rounds"); do
  for s in "${scripts[@]}"; do
    args=()
    case "$s" in *-6.12) args=(--kernel 6.12) ;; esac
    log="$logs/$s.$r.log"
    t=$SECONDS
    rc=0
    # In the background, so that a signal here ends it (and its guests) at once.
    launch_bg bash "scripts/${s%-6.12}.sh" "${args[@]}" >"$log" 2>&1
    launch_wait "$launch_pid" || rc=$?
    line=$(grep -E "^$s: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -n1 || true)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    if [ "$rc" = 0 ]; then
      tally ok
      echo "round $r $s: ok in $((SECONDS - t)) s (${line:-no count}; load $load)"
    else
      tally failed
      echo "round $r $s: FAILED, exit $rc in $((SECONDS - t)) s (${line:-no count}; load $load): $log"
    fi
  done
done
verdict qemu-under-load
