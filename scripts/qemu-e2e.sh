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
# Before their exchange, A is reset in the middle of traffic: B first
# streams RDMA WRITEs into A (rdma-guest exchange --stream-until-peer-reset)
# and A's machine gets a QMP system_reset, which the patched QEMU passes to
# the daemon as VHOST_USER_RESET_DEVICE. Checked: (a) the daemon holds no
# object of A's first boot any more (ctl stats); (b) B's QPs fail with
# QP_FATAL and all of B's outstanding work completes with errors (B's
# program checks and prints it); (c) no byte reaches A between the reset and
# its next boot's exchange (the daemon's count of bytes A received as
# responder stands still over A's whole reboot); (d) A's next boot runs the
# full exchange with B. Doorbells are the guest-RAM kind only: QEMU 10.2.2
# has no VIRTIO shared memory for vhost-user devices (its vhost-user
# protocol features end at F_DEVICE_STATE, 19; VHOST_USER_PROTOCOL_F_SHMEM
# and the SHMEM_MAP back-end request arrive in QEMU 11.1, and only
# virtio-gpu adds a shared memory capability), so the device shows no
# doorbell region and the driver uses doorbell records in guest RAM. The
# shared-memory doorbell mode of the same reset is covered over the test
# VMM (tests/tests/apps_reset.rs).
#
# Usage: [QEMU=path] bash scripts/qemu-e2e.sh [--demo] [--keep] [--generic] [--expect-shmem]
#   --demo     print the guests' output as the main job's demo (no hostile VM)
#   --keep     keep the work directory (logs) after success
#   --generic  QEMU's generic vhost-user-test-device-pci (virtio-id=39, at
#              00:10.0) instead of vhost-user-rdma-pci: for a QEMU without
#              our patches, e.g. Debian's QEMU 11.1 (scripts/build-qemu.sh
#              --qemu 11.1-stock), whose generic device has VIRTIO shared
#              memory. That device passes no reset to the daemon, so this
#              runs A and B's exchange only, as --demo does (no reset, no
#              VM C); ID 39 because every QEMU aborts on an unnamed 42.
#   --expect-shmem  also check the shared-memory doorbell mode: each guest
#              prints `rdma-guest info` first and its features must have
#              F_SHMEM_DOORBELL (bit 3), and the daemon must log the
#              SHMEM_MAP of each VM's doorbell region
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh

demo=0 keep=0 generic=0 expect_shmem=0
for a in "$@"; do
  case $a in
    --demo) demo=1 ;;
    --keep) keep=1 ;;
    --generic) generic=1 demo=1 ;;
    --expect-shmem) expect_shmem=1 ;;
    *) echo "usage: $0 [--demo] [--keep] [--generic] [--expect-shmem]" >&2; exit 2 ;;
  esac
done
# The device on each guest's command line, and how rdma-guest finds it.
# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
rdma_dev=(-device vhost-user-rdma-pci,chardev=rdma)
guest_opts=() rg='rdma-guest'
if [ "$generic" = 1 ]; then
  # shellcheck disable=SC2054
  rdma_dev=(-device vhost-user-test-device-pci,addr=0x10,chardev=rdma,virtio-id=39,num_vqs=3,config_size=96,vq_size=256)
  guest_opts=(--append guest.uio=0000:00:10.0) rg='rdma-guest --pci 0000:00:10.0'
fi
# With --expect-shmem each guest prints its device's features first.
pre=''
[ "$expect_shmem" = 0 ] || pre="$rg info && "

t_start=$(date +%s%N)
# Seconds (one decimal) since a `date +%s%N` stamp.
stamp() {
  local d=$(( $(date +%s%N) - $1 ))
  printf '%d.%d' $((d / 1000000000)) $((d / 100000000 % 10))
}

echo "== qemu-e2e: building the patched QEMU (cached after the first run)"
t=$(date +%s%N)
# $QEMU overrides (a QEMU with vhost-user-rdma-pci built elsewhere).
launch_need_qemu
echo "   $QEMU ($(stamp "$t") s)"

echo "== qemu-e2e: building the daemon and rdma-guest (release)"
t=$(date +%s%N)
cargo build --release --locked -q -p vhost-user-rdma -p virtio-rdma-apps
echo "   done ($(stamp "$t") s)"

echo "== qemu-e2e: building the guest image"
t=$(date +%s%N)
bash scripts/build-guest.sh --name rdma-e2e --bin target/release/rdma-guest >/dev/null
echo "   done ($(stamp "$t") s)"

launch_workdir e2e

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
waits=()
for i in $(seq 0 $((nvm - 1))); do waits+=(--wait "$dir/vm$i.sock"); done
launch_daemon "${waits[@]}" --wait "$dir/mgmt.sock" --config "$dir/config.toml"
daemon_pid=$launch_pid

# One guest: [--reboot] NAME SOCKET-INDEX CMD [QEMU ARGS...] (in the
# background, launch_pid); every guest has a QMP socket, $dir/NAME.qmp, and
# its QEMU's PID in $dir/NAME.pid.
guest() {
  local run_opts=()
  if [ "$1" = --reboot ]; then run_opts=(--reboot); shift; fi
  local name=$1 idx=$2 cmd=$3; shift 3
  launch_guest "$name" --image rdma-e2e "${run_opts[@]}" "${guest_opts[@]}" --cmd "$cmd" -- \
    -qmp "unix:$dir/$name.qmp,server=on,wait=off" \
    -chardev "socket,id=rdma,path=$dir/vm$idx.sock" "${rdma_dev[@]}" "$@"
}

show() {
  for f in "$dir"/*.console; do
    [ -e "$f" ] || continue
    show_log "$(basename "$f" .console) console" "$f"
  done
  show_log "daemon log" "$dir/daemon.log"
}

# One QMP command (JSON) to the monitor socket $1; prints QEMU's answer.
# Fails on an error answer or none within 30 s.
qmp() {
  python3 - "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
f = s.makefile("rw")
def answer():
    while True:  # events come in between; skip them
        line = f.readline()
        if not line:
            sys.exit("qmp: QEMU closed the monitor")
        msg = json.loads(line)
        if "return" in msg or "error" in msg:
            return msg
json.loads(f.readline())  # the greeting
f.write('{"execute":"qmp_capabilities"}\n')
f.flush()
answer()
f.write(sys.argv[2] + "\n")
f.flush()
msg = answer()
print(json.dumps(msg))
sys.exit(1 if "error" in msg else 0)
PY
}

# VM $1's counters from the management socket: "objects=N recv_bytes=N
# (ctx=.. pd=.. ...)", objects being every live object plus the bytes
# of live MRs (0 only when the VM holds nothing).
vm_counts() {
  target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" --json stats "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d["resources"]
detail = " ".join("%s=%s" % kv for kv in r.items())
print("objects=%d recv_bytes=%d (%s)" % (sum(r.values()), d["traffic"]["recv_bytes"], detail))'
}
# One field (objects, recv_bytes) of vm_counts' line.
field_of() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$2"; }

t=$(date +%s%N)
echo "== qemu-e2e: booting VM A (server) and VM B (client), serial cable between their ttyS1"
# Outside the demo, B first streams into A until A's reset (see the top).
reset_opts=() client_opts=''
[ "$demo" = 1 ] || { reset_opts=(--reboot); client_opts=' --stream-until-peer-reset'; }
guest "${reset_opts[@]}" A 0 "$pre$rg exchange --role server" \
  -chardev "socket,id=oob,path=$dir/oob.sock,server=on,wait=off" -serial mon:stdio -serial chardev:oob
pid_a=$launch_pid
wait_socket "$dir/oob.sock" "$pid_a" || true
guest B 1 "$pre$rg exchange --role client --rounds 2$client_opts" \
  -chardev "socket,id=oob,path=$dir/oob.sock" -serial mon:stdio -serial chardev:oob
pid_b=$launch_pid

# The reset of A in the middle of B's traffic. A is paused around its
# reset (stop, system_reset, cont: the reset itself is the same) so that
# the daemon's counts are read before A's next boot can create anything,
# and B is paused once it has seen the failure and waits for A's next
# boot, so that its next exchange cannot reach A before the byte count is
# read there.
# It runs in the background, next to VM C's part; its lines go to
# $dir/reset.log and are shown once it is over.
reset_scenario() {
  local c r0 r1 line end
  wait_lines "$dir/B.console" '^client: streaming' 1 "$pid_b" ||
    { echo "FAILED: VM B never streamed RDMA WRITEs to VM A"; return 1; }
  # Traffic is flowing into A right now: its received bytes grow.
  if ! { c=$(vm_counts vm0) && r0=$(field_of recv_bytes "$c"); }; then
    echo "FAILED: ctl stats vm0 failed"
    return 1
  fi
  end=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$end" ]; do
    c=$(vm_counts vm0) && r1=$(field_of recv_bytes "$c") && [ "$r1" -gt "$r0" ] && break
    sleep 0.1
  done
  [ "${r1:-0}" -gt "$r0" ] || { echo "FAILED: VM A receives no bytes from B's stream"; return 1; }
  echo "$(stamp "$t") s after boot: VM B streams into VM A (A received $r0 -> $r1 bytes); system_reset of VM A"
  qmp "$dir/A.qmp" '{"execute":"stop"}' >/dev/null || { echo "FAILED: QMP stop of VM A failed"; return 1; }
  qmp "$dir/A.qmp" '{"execute":"system_reset"}' >/dev/null ||
    { echo "FAILED: QMP system_reset of VM A failed"; return 1; }
  # (a) The daemon got VHOST_USER_RESET_DEVICE and dropped A's objects.
  end=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$end" ]; do
    c=$(vm_counts vm0) && [ "$(field_of objects "$c")" = 0 ] && break
    sleep 0.1
  done
  [ "$(field_of objects "$c")" = 0 ] ||
    { echo "FAILED: (a) the daemon still holds VM A's objects after its reset: $c"; return 1; }
  echo "(a) $(stamp "$t") s: after the reset the daemon holds nothing of VM A: $c"
  r0=$(field_of recv_bytes "$c")
  # (b) B's QPs failed and its outstanding work completed with errors.
  wait_lines "$dir/B.console" '^client: peer reset: QP_FATAL on both QPs' 1 "$pid_b" ||
    { echo "FAILED: (b) VM B did not report its QPs failed by A's reset"; return 1; }
  line=$(tr -d '\r' <"$dir/B.console" | grep -E '^client: peer reset' | head -n 1)
  echo "(b) $(stamp "$t") s: VM B: ${line#client: }"
  # B has made its objects for the next exchange and waits for A's boot
  # on the serial cable: pause it there.
  wait_lines "$dir/B.console" '^client: RC QPs' 2 "$pid_b" ||
    { echo "FAILED: VM B did not prepare its next exchange"; return 1; }
  qmp "$dir/B.qmp" '{"execute":"stop"}' >/dev/null || { echo "FAILED: QMP stop of VM B failed"; return 1; }
  qmp "$dir/A.qmp" '{"execute":"cont"}' >/dev/null || { echo "FAILED: QMP cont of VM A failed"; return 1; }
  # (c) A's next boot has its objects (its first program line is out) and
  # not one byte has reached it since the reset.
  wait_lines "$dir/A.console" '^server: RC QPs' 2 "$pid_a" ||
    { echo "FAILED: VM A's next boot did not open the device"; return 1; }
  c=$(vm_counts vm0) || { echo "FAILED: ctl stats vm0 failed"; return 1; }
  r1=$(field_of recv_bytes "$c")
  [ "$r1" = "$r0" ] ||
    { echo "FAILED: (c) $((r1 - r0)) bytes reached VM A between its reset and its next exchange"; return 1; }
  echo "(c) $(stamp "$t") s: VM A rebooted and received nothing meanwhile: $r1 bytes before and after"
  echo "$r1" >"$dir/reset.recv"
  qmp "$dir/B.qmp" '{"execute":"cont"}' >/dev/null || { echo "FAILED: QMP cont of VM B failed"; return 1; }
}
hostile_ok=1 reset_ok=1 recv_after=''
if [ "$demo" = 0 ]; then
  echo "== qemu-e2e: booting VM C (hostile)"
  guest C 2 'rdma-guest hostile --foreign-gid ::ffff:10.42.0.1 --foreign-gid ::ffff:10.42.0.2'
  pid_c=$launch_pid

  echo "== qemu-e2e: resetting VM A (QMP system_reset) while VM B streams RDMA WRITEs into it (in the background)"
  t_reset=$(date +%s%N)
  (
    reset_scenario && exit 0
    # Do not let A and B wait out their time limits.
    for g in A B; do [ -s "$dir/$g.pid" ] && kill "$(cat "$dir/$g.pid")" 2>/dev/null; done
    exit 1
  ) >"$dir/reset.log" 2>&1 &
  reset_pid=$!
  launch_register "$reset_pid"

  # Kill C's QEMU (SIGKILL, no goodbye to the daemon) once it streams.
  wait_lines "$dir/C.console" HOSTILE-BUSY 1 "$pid_c" || true
  if grep -q HOSTILE-BUSY "$dir/C.console" 2>/dev/null && [ -s "$dir/C.pid" ]; then
    sleep 1
    kill -9 "$(cat "$dir/C.pid")"
    echo "   VM C passed its checks, was streaming, and was killed with SIGKILL ($(stamp "$t") s after boot)"
  else
    echo "   VM C never reached its stream"
    hostile_ok=0
  fi
  launch_wait "$pid_c" 2>/dev/null || true
  # The same VM comes back (a fresh QEMU on the same socket) and finds a
  # working device with nothing of its earlier life in it.
  echo "== qemu-e2e: booting VM C again on the same socket"
  guest C2 2 'rdma-guest info'
  pid_c2=$launch_pid
fi

if [ "$demo" = 0 ]; then
  launch_wait "$reset_pid" || reset_ok=0
  sed 's/^/   /' "$dir/reset.log"
  recv_after=$(cat "$dir/reset.recv" 2>/dev/null || true)
fi

rc_a=0 rc_b=0 rc_c2=0
launch_wait "$pid_a" || rc_a=$?
launch_wait "$pid_b" || rc_b=$?
[ "$demo" = 1 ] || launch_wait "$pid_c2" || rc_c2=$?
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
  if grep -q '"denied":34' <<<"$stats"; then
    echo "   ctl stats vm2: 34 commands DENIED by the tenant policy, as attempted"
  else
    echo "   ctl stats vm2 does not show the 34 refused commands: $stats"; hostile_ok=0
  fi
fi

# For the record: how often the idle engine found work whose notification
# had not come (LATE_KICKS; the engine serves it within 50 ms either way).
echo "== qemu-e2e: engine threads"
target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" engines 2>&1 | sed 's/^/   /' || true
for r in "VM A (server):$rc_a" "VM B (client):$rc_b"; do
  if [ "${r##*:}" = 0 ]; then tally ok; else tally failed; echo "FAILED: ${r%:*} exit ${r##*:}"; fi
done
if [ "$demo" = 0 ]; then
  if [ "$hostile_ok" = 1 ]; then tally ok; else tally failed; echo "FAILED: VM C (hostile)"; fi
  if [ "$rc_c2" = 0 ] && grep -q 'VM 2: VMM connected (connection 2)' "$dir/daemon.log"; then
    tally ok
    echo "   VM C reconnected on its socket and opened the device again"
  else
    tally failed; echo "FAILED: VM C's reconnect (exit $rc_c2)"
  fi
fi
if [ "$demo" = 0 ]; then
  # (d) A's next boot ran the exchange (A and B passed above) with bytes
  # moving into A again; A booted exactly twice (a kernel panic would
  # reboot it too and rerun the program).
  if [ "$reset_ok" = 1 ]; then
    boots=$(tr -d '\r' <"$dir/A.console" | grep -c '^GUEST-READY' || true)
    c=$(vm_counts vm0 || true)
    if [ "$boots" != 2 ]; then
      reset_ok=0; echo "FAILED: VM A booted $boots times, not twice"
    elif [ "$rc_a" != 0 ] || [ "$rc_b" != 0 ] || ! grep -q '^client: done' "$dir/B.console"; then
      reset_ok=0; echo "FAILED: the exchange after VM A's reset"
    elif [ "$(field_of recv_bytes "$c")" -le "${recv_after:-0}" ] 2>/dev/null; then
      reset_ok=0; echo "FAILED: VM A received nothing in its exchange after the reset: $c"
    else
      echo "   (d) VM A's next boot passed the exchange with VM B (reset to done: $(stamp "$t_reset") s)"
    fi
  fi
  if [ "$reset_ok" = 1 ]; then tally ok; else tally failed; echo "FAILED: VM A's reset in the middle of traffic"; fi
fi
if [ "$daemon_ok" = 1 ]; then tally ok; else tally failed; echo "FAILED: the daemon died"; fi
if [ "$expect_shmem" = 1 ]; then
  # Each guest's `rdma-guest info` line: features with F_SHMEM_DOORBELL
  # (bit 3) accepted; and the daemon's SHMEM_MAP of each VM's region.
  for g in A B; do
    f=$(tr -d '\r' <"$dir/$g.console" | sed -n 's/^rdma-guest: ABI v[0-9]*, features \(0x[0-9a-f]*\),.*/\1/p' | head -n 1)
    if [ -n "$f" ] && [ $((f & 8)) = 8 ]; then
      tally ok; echo "   VM $g: features $f, F_SHMEM_DOORBELL accepted"
    else
      tally failed; echo "FAILED: VM $g did not accept F_SHMEM_DOORBELL (features ${f:-none})"
    fi
  done
  maps=$(grep -c 'doorbell region mapped' "$dir/daemon.log" || true)
  if [ "$maps" -ge 2 ]; then
    tally ok; echo "   the daemon mapped the doorbell regions into the guests ($maps SHMEM_MAPs)"
  else
    tally failed; echo "FAILED: the daemon logged $maps doorbell region mappings, not one per VM at least"
  fi
fi

echo "== qemu-e2e: guests ran $t_guests s; whole run $(stamp "$t_start") s"
[ "$fail" = 0 ] || show
verdict qemu-e2e
