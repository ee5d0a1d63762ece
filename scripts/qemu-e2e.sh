#!/usr/bin/env bash
# End-to-end test in real QEMU guests: one vhost-user-rdma daemon (built-in
# software RNIC) serves three VMs of the patched QEMU (vhost-user-rdma-pci):
#
#   VM A  rdma-guest exchange --role server
#   VM B  rdma-guest exchange --role client   (serial cable ttyS1 <-> VM A's)
#   VM C  rdma-guest hostile                  (another tenant; bad addresses,
#                                              keys, bounds, connects to A and B;
#                                              then streams WRITEs and is
#                                              killed with SIGKILL mid-transfer,
#                                              then booted again: rdma-guest info)
#
# A and B connect RC QPs through the guest driver's virtio-pci transport and
# check every byte of SEND/RECV, RDMA WRITE (+ immediate), RDMA READ and
# atomics; C misbehaves and dies while they work. The test fails if any guest
# program fails, if C's checks fail, or if the daemon dies; on failure it
# prints the guest consoles and the daemon log.
#
# Usage: [QEMU=path] bash scripts/qemu-e2e.sh [--demo] [--keep]
#   --demo  print the guests' output as the main job's demo (no hostile VM)
#   --keep  keep the work directory (logs) after success
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0 keep=0
for a in "$@"; do
  case $a in
    --demo) demo=1 ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--demo] [--keep]" >&2; exit 2 ;;
  esac
done

t_start=$(date +%s%N)
# Seconds (one decimal) since a `date +%s%N` stamp.
stamp() {
  local d=$(( $(date +%s%N) - $1 ))
  printf '%d.%d' $((d / 1000000000)) $((d / 100000000 % 10))
}

echo "== qemu-e2e: building the patched QEMU (cached after the first run)"
t=$(date +%s%N)
# $QEMU overrides (a QEMU with vhost-user-rdma-pci built elsewhere).
[ -n "${QEMU:-}" ] || QEMU=$(bash scripts/build-qemu.sh | tail -n 1)
export QEMU
echo "   $QEMU ($(stamp "$t") s)"

echo "== qemu-e2e: building the daemon and rdma-guest (release)"
t=$(date +%s%N)
cargo build --release --locked -q -p vhost-user-rdma -p virtio-rdma-apps
echo "   done ($(stamp "$t") s)"

echo "== qemu-e2e: building the guest image"
t=$(date +%s%N)
bash scripts/build-guest.sh --name rdma-e2e --bin target/release/rdma-guest >/dev/null
echo "   done ($(stamp "$t") s)"

dir=$(mktemp -d /tmp/vhost-user-rdma-e2e.XXXXXX)
daemon_pid="" pids=()
cleanup() {
  # Keep the script's own exit status: a failing command in here (under
  # set -e) would otherwise replace it.
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && { wait "$daemon_pid" 2>/dev/null || true; }
  if [ "$keep" = 1 ]; then echo "logs kept in $dir"; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT

# A and B are tenant "blue"; C is alone in tenant "red" and tries to reach
# A and B (their GIDs are the defaults, ::ffff:10.42.0.1 and .2).
nvm=3; [ "$demo" = 1 ] && nvm=2
{
  printf '[daemon]\nmgmt_socket = "%s"\n\n' "$dir/mgmt.sock"
  printf '[[tenant]]\nname = "blue"\n\n[[tenant]]\nname = "red"\n\n'
  for i in $(seq 0 $((nvm - 1))); do
    tenant=blue; [ "$i" = 2 ] && tenant=red
    printf '[[vm]]\nname = "vm%d"\nsocket = "%s"\ntenant = "%s"\n\n' "$i" "$dir/vm$i.sock" "$tenant"
  done
} > "$dir/config.toml"
RUST_LOG=${RUST_LOG:-info} target/release/vhost-user-rdma --config "$dir/config.toml" 2> "$dir/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$dir/vm$((nvm - 1)).sock" ] && break; sleep 0.05; done

# One guest: NAME SOCKET-INDEX CMD [QEMU ARGS...] (in the background).
guest() {
  local name=$1 idx=$2 cmd=$3; shift 3
  bash scripts/run-guest.sh --image rdma-e2e --timeout 600 --log "$dir/$name.console" -q \
    --cmd "$cmd" -- \
    -chardev "socket,id=rdma,path=$dir/vm$idx.sock" -device vhost-user-rdma-pci,chardev=rdma \
    -pidfile "$dir/$name.pid" "$@" > "$dir/$name.out" 2>&1 &
  pids+=($!)
}

show() {
  for f in "$dir"/*.console; do
    [ -e "$f" ] || continue
    echo "----- $(basename "$f" .console) console"
    sed 's/^/  /' "$f"
  done
  echo "----- daemon log"
  sed 's/^/  /' "$dir/daemon.log"
}

t=$(date +%s%N)
echo "== qemu-e2e: booting VM A (server) and VM B (client), serial cable between their ttyS1"
guest A 0 'rdma-guest exchange --role server' \
  -chardev "socket,id=oob,path=$dir/oob.sock,server=on,wait=off" -serial mon:stdio -serial chardev:oob
pid_a=${pids[-1]}
for _ in $(seq 200); do [ -S "$dir/oob.sock" ] && break; sleep 0.05; done
guest B 1 'rdma-guest exchange --role client --rounds 2' \
  -chardev "socket,id=oob,path=$dir/oob.sock" -serial mon:stdio -serial chardev:oob
pid_b=${pids[-1]}

hostile_ok=1
if [ "$demo" = 0 ]; then
  echo "== qemu-e2e: booting VM C (hostile)"
  guest C 2 'rdma-guest hostile --foreign-gid ::ffff:10.42.0.1 --foreign-gid ::ffff:10.42.0.2'
  pid_c=${pids[-1]}
  # Kill C's QEMU (SIGKILL, no goodbye to the daemon) once it streams.
  for _ in $(seq 1200); do
    grep -q HOSTILE-BUSY "$dir/C.console" 2>/dev/null && break
    kill -0 "$pid_c" 2>/dev/null || break
    sleep 0.1
  done
  if grep -q HOSTILE-BUSY "$dir/C.console" 2>/dev/null && [ -s "$dir/C.pid" ]; then
    sleep 1
    kill -9 "$(cat "$dir/C.pid")"
    echo "   VM C passed its checks, was streaming, and was killed with SIGKILL ($(stamp "$t") s after boot)"
  else
    echo "   VM C never reached its stream"
    hostile_ok=0
  fi
  wait "$pid_c" 2>/dev/null || true
  # The same VM comes back (a fresh QEMU on the same socket) and finds a
  # working device with nothing of its earlier life in it.
  echo "== qemu-e2e: booting VM C again on the same socket"
  guest C2 2 'rdma-guest info'
  pid_c2=${pids[-1]}
fi

rc_a=0 rc_b=0 rc_c2=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$demo" = 1 ] || wait "$pid_c2" || rc_c2=$?
t_guests=$(stamp "$t")
daemon_ok=1
kill -0 "$daemon_pid" 2>/dev/null || daemon_ok=0

echo "== qemu-e2e: VM B (client) output"
grep -E '^(client|rdma-guest)' "$dir/B.console" | sed 's/^/  /' || true
if [ "$demo" = 0 ]; then
  echo "== qemu-e2e: VM C (hostile) output"
  grep -E '^(hostile|rdma-guest)' "$dir/C.console" | sed 's/^/  /' || true
  grep -q 'VM 2: VMM disconnected, resources released' "$dir/daemon.log" || {
    echo "   the daemon did not report VM C's resources released"; hostile_ok=0; }
  # The operator sees C's attempts on the other tenant: per foreign VM, 16
  # refused connects and one refused address handle.
  stats=$(target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" --json stats vm2 || true)
  if echo "$stats" | grep -q '"denied":34'; then
    echo "   ctl stats vm2: 34 commands DENIED by the tenant policy, as attempted"
  else
    echo "   ctl stats vm2 does not show the 34 refused commands: $stats"; hostile_ok=0
  fi
fi

passed=0 failed=0
for r in "VM A (server):$rc_a" "VM B (client):$rc_b"; do
  if [ "${r##*:}" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: ${r%:*} exit ${r##*:}"; fi
done
if [ "$demo" = 0 ]; then
  if [ "$hostile_ok" = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: VM C (hostile)"; fi
  if [ "$rc_c2" = 0 ] && grep -q 'VM 2: VMM connected (connection 2)' "$dir/daemon.log"; then
    passed=$((passed + 1))
    echo "   VM C reconnected on its socket and opened the device again"
  else
    failed=$((failed + 1)); echo "FAILED: VM C's reconnect (exit $rc_c2)"
  fi
fi
if [ "$daemon_ok" = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: the daemon died"; fi

echo "== qemu-e2e: guests ran $t_guests s; whole run $(stamp "$t_start") s"
if [ "$failed" != 0 ]; then
  show
  echo "qemu-e2e: $passed passed, $failed failed"
  exit 1
fi
echo "qemu-e2e: $passed passed, $failed failed"
