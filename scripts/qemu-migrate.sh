#!/usr/bin/env bash
# Live migration of a QEMU guest with the RDMA device between two QEMU processes on one host and
# one daemon (issue 30, spec chapter 20): the daemon serves three sockets, VM A's (the source),
# A's standby (the destination's, `standby_for`, spec 20.5) and VM B's. Guest A prints a counter
# ("TICK n", five a second) until a line arrives on its second serial port; guest B, with
# virtio_rdma.ko loaded, runs meanwhile on the same daemon. Then, with QMP on A's QEMU (the
# return path on on both sides, so that a destination that cannot load resumes the source):
#   1. a migration to a destination that never starts (nobody listens): it fails, A runs on;
#   2. a migration to a real destination (QEMU -incoming on the standby socket), cancelled
#      midway (migrate_cancel, with the bandwidth held low so that there is a midway): A runs
#      on; the destination QEMU ends; then one whose destination QEMU is killed (SIGKILL)
#      midway: it fails, A runs on;
#   3. the migration, to a new destination: query-migrate is polled until "completed" (waiting
#      on progress, not a fixed time); the downtime and total time QEMU reports are printed;
#      the source QEMU is quit and exits; on the destination the counter goes on past the
#      source's last value, and after its gate virtio_rdma.ko probes the device and registers
#      virtio_rdma0 with its port active;
#   4. guest B's device still answers, and the daemon is alive and logged the state's save and
#      load.
# If the migration fails in step 3 (the daemon refused to save or load the state), A must run on
# with a working device (ibv_devinfo after its gate), and the run stops there.
# --driver: A loads virtio_rdma.ko before the migration, so the state carries the kernel
# driver's objects (its context, the GSI QP). --traffic (implies --driver): A runs
# ibv_rc_pingpong against B (20000 iterations of 4 KiB) across step 3, and both sides' result
# lines are checked.
# Prints "qemu-migrate: N passed, M failed".
#
# Needs a daemon that offers dirty logging (VHOST_F_LOG_ALL, LOG_SHMFD: QEMU refuses to migrate
# a vhost device without) and DEVICE_STATE, and the QEMU series with patch 0007
# (scripts/build-qemu.sh). DAEMON=PATH DAEMON_PREBUILT=1: another daemon binary, not built here.
# MIGRATE_DST=plain: the destination is a VM of its own rather than A's standby.
#
# Usage: bash scripts/qemu-migrate.sh [--driver] [--traffic] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
traffic=0 driver=0
args=()
for a in "$@"; do
  case "$a" in
  --traffic) traffic=1 driver=1 ;;
  --driver) driver=1 ;;
  *) args+=("$a") ;;
  esac
done
guest_script_args "${args[@]}"
name=qemu-migrate
t_start=$(date +%s)

launch_need_qemu
if [ -z "${DAEMON_PREBUILT:-}" ]; then
  cargo build --release --locked -q -p vhost-user-rdma
fi
kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
rc=$(bash scripts/build-rdma-core.sh)

launch_workdir migrate

# What the guests source first: wait_dev (until the driver registered virtio_rdma0 with its
# GID 1, the interface address), gate (prints GATE, then waits for a line on the second
# serial port) and ticker (TICK n, five a second).
{
  guest_tools virtio_rdma0
  cat <<'EOF'
# net_up N: the paired interface up as 10.42.0.N (the driver registers its verbs device on it).
net_up() {
  modprobe virtio_net && ip link set eth0 up && ip addr add 10.42.0.$1/24 dev eth0
}
wait_dev() {
  local i=0
  until ibv_devinfo -d virtio_rdma0 2>/dev/null | grep -q PORT_ACTIVE; do
    [ $i -lt 300 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
}
wait_gid() {
  local i=0
  until grep -q ffff /sys/class/infiniband/virtio_rdma0/ports/1/gids/1 2>/dev/null; do
    [ $i -lt 100 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
}
# wait_probe: until the driver has queried the device (QUERY_DEVICE, QUERY_PORT) and printed
# its summary line.
wait_probe() {
  local i=0
  until dmesg | grep -q 'virtio-rdma ABI .* port active'; do
    [ $i -lt 300 ] || { dmesg | grep -i -e rdma -e virtio | tail -n 8; return 1; }
    i=$((i + 1))
    sleep 0.1
  done
  dmesg | grep -m1 'virtio-rdma ABI' | sed 's/^.*virtio-rdma ABI/PROBE: virtio-rdma ABI/'
}
gate() {
  exec 3</dev/ttyS1
  echo GATE
  read -r _ <&3
  exec 3<&-
}
ticker() {
  local i=0
  while :; do
    i=$((i + 1))
    echo "TICK $i"
    sleep 0.2
  done
}
EOF
} >"$dir/tools.sh"
bash scripts/build-guest.sh --kernel "$kernel" --name rdma-migrate --load virtio_pci \
  --load virtio_net --load ib_uverbs --file "$kmod:/lib/virtio_rdma.ko" \
  --file "$dir/tools.sh:/etc/tools.sh" --file "$GUEST_STDBUF_FILE" --sysroot "$rc" >/dev/null

# VM "vma" (A) and "vmb" (B) in tenant "t"; the destination's socket is A's standby (spec 20.5),
# the same VM. MIGRATE_DST=plain, for a daemon without standby instances: the destination is a
# VM of its own, "vma-dst", whose LOAD refuses A's state unless the daemon loads a state into any
# VM; A's identity (MAC and GID, which a VM's driver needs to register its port) goes to the
# side where the driver is loaded: the destination without --driver, the source with it.
ident='mac = "52:54:00:00:00:01"\ngids = ["::ffff:10.42.0.1"]\n'
other='gids = ["::ffff:10.42.0.11"]\n'
if [ "${MIGRATE_DST:-standby}" = standby ]; then
  a_identity=$ident
  dst_stanza='[[vm]]\nname = "vma-standby"\nsocket = "%s"\ntenant = "t"\nstandby_for = "vma"\n\n'
else
  a_identity=$other dst_identity=$ident
  [ "$driver" = 0 ] || a_identity=$ident dst_identity=$other
  dst_stanza="[[vm]]\nname = \"vma-dst\"\nsocket = \"%s\"\ntenant = \"t\"\n$dst_identity\n"
fi
{
  printf '[daemon]\nmgmt_socket = "%s"\n\n[[tenant]]\nname = "t"\n\n' "$dir/mgmt.sock"
  # shellcheck disable=SC2059 # the formats are ours
  printf "[[vm]]\nname = \"vma\"\nsocket = \"%s\"\ntenant = \"t\"\n$a_identity\n" "$dir/a-src.sock"
  # shellcheck disable=SC2059
  printf "$dst_stanza" "$dir/a-dst.sock"
  printf '[[vm]]\nname = "vmb"\nsocket = "%s"\ntenant = "t"\nmac = "52:54:00:00:00:02"\n\n' "$dir/b.sock"
} >"$dir/config.toml"
launch_daemon --wait "$dir/a-src.sock" --wait "$dir/a-dst.sock" --wait "$dir/b.sock" \
  --wait "$dir/mgmt.sock" --config "$dir/config.toml"
daemon_pid=$launch_pid

# One QMP command (JSON) to monitor socket $1; prints the answer; fails on an error answer.
qmp() {
  python3 - "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
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
json.loads(f.readline())
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

# migrate_wait QMP [UNTIL]: polls query-migrate on QMP until the status is completed, failed
# or cancelled (or, with UNTIL=active, until some RAM has gone); prints the last answer's
# "return". Gives up only when neither the status nor the bytes sent changed for
# $LAUNCH_STALL s.
migrate_wait() {
  python3 - "$1" "${2:-}" "$LAUNCH_STALL" <<'PY'
import json, socket, sys, time
path, until, stall = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(path)
f = s.makefile("rw")
def call(cmd):
    f.write(json.dumps(cmd) + "\n")
    f.flush()
    while True:
        line = f.readline()
        if not line:
            sys.exit("qmp: QEMU closed the monitor")
        msg = json.loads(line)
        if "return" in msg or "error" in msg:
            return msg
json.loads(f.readline())
call({"execute": "qmp_capabilities"})
last, since = None, time.monotonic()
while True:
    r = call({"execute": "query-migrate"}).get("return", {})
    st = r.get("status")
    seen = (st, r.get("ram", {}).get("transferred"))
    if st in ("completed", "failed", "cancelled"):
        break
    if until == "active" and st == "active" and (r.get("ram", {}).get("transferred") or 0) > 0:
        break
    if seen != last:
        last, since = seen, time.monotonic()
    elif time.monotonic() - since > stall:
        print(json.dumps(r))
        sys.exit("migrate_wait: no progress for %d s" % stall)
    time.sleep(0.05)
print(json.dumps(r))
PY
}
# field JSON KEY...: a field of a JSON object (empty if absent).
field() {
  python3 -c 'import json, sys
try:
    v = json.loads(sys.argv[1])
except ValueError:
    v = {}
for k in sys.argv[2:]:
    v = v.get(k, {}) if isinstance(v, dict) else {}
print("" if v == {} else v)' "$@"
}

# guest NAME SOCKET CMD [QEMU ARGS...]: a guest with its QMP socket $dir/NAME.qmp and its gate
# (second serial port) at $dir/NAME-gate.sock.
guest() {
  local gname=$1 sock=$2 cmd=$3
  shift 3
  launch_guest "$gname" --image rdma-migrate --append 'guest.uio=none' --cmd "$cmd" -- \
    -qmp "unix:$dir/$gname.qmp,server=on,wait=off" \
    -chardev "socket,id=rdma,path=$sock" -device vhost-user-rdma-pci,chardev=rdma \
    -chardev "socket,id=gate,path=$dir/$gname-gate.sock,server=on,wait=off" \
    -serial mon:stdio -serial chardev:gate "$@"
}
# open_gate NAME: the line guest NAME's gate waits for.
open_gate() {
  python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"go\n")
time.sleep(0.5)' "$dir/$1-gate.sock"
}
# last_tick CONSOLE: the highest counter value on a console.
last_tick() {
  tr -d '\r' <"$1" 2>/dev/null | sed -n 's/^TICK \([0-9][0-9]*\)$/\1/p' | tail -n 1
}
# ticks_after CONSOLE N: until CONSOLE shows a counter value past N, while its guest runs.
_past() { [ "$(last_tick "$1")" -gt "$2" ] 2>/dev/null; }
ticks_after() { wait_until "${3:-}" "$1" _past "$1" "$2"; }

# A: without --driver, its driver is loaded only after the migration (the kernel driver holds
# objects from the start: its GSI QP and the kernel's context); with it, before. At the
# destination the driver probes the device (QUERY_DEVICE, QUERY_PORT) and, with the standby's
# identity (A's MAC and GIDs), registers its verbs device with the port active.
full_dev=true
[ "${MIGRATE_DST:-standby}" != standby ] || full_dev='wait_gid && wait_dev'
# shellcheck disable=SC2016 # the guest's shell expands them
a_cmd='. /etc/tools.sh && net_up 1 && echo BEFORE-OK &&
  { ticker & t=$!; gate; kill $t; insmod /lib/virtio_rdma.ko && wait_probe && '"$full_dev"' &&
    echo AFTER-OK; }; r=$?; klog; exit $r'
if [ "$driver" = 1 ]; then
  # shellcheck disable=SC2016
  a_cmd='. /etc/tools.sh && net_up 1 && insmod /lib/virtio_rdma.ko && wait_gid && wait_dev &&
    echo BEFORE-OK && { ticker & t=$!; gate; kill $t; ibv_devinfo -d virtio_rdma0 |
    grep -q PORT_ACTIVE && echo AFTER-OK; }; r=$?; klog; exit $r'
fi
# B, VM 2 of the daemon: its GID 1 is ::ffff:10.42.0.3.
# shellcheck disable=SC2016
b_cmd='. /etc/tools.sh && net_up 3 && insmod /lib/virtio_rdma.ko && wait_gid && wait_dev &&
  echo BEFORE-OK && gate && ibv_devinfo -d virtio_rdma0 | grep -q PORT_ACTIVE && echo AFTER-OK;
  r=$?; klog; exit $r'
if [ "$traffic" = 1 ]; then
  # A is the pingpong's client, B its server; they find each other over -netdev stream.
  # shellcheck disable=SC2016
  a_cmd='. /etc/tools.sh && net_up 1 &&
    insmod /lib/virtio_rdma.ko && wait_dev && wait_gid && echo BEFORE-OK && peer=10.42.0.3 &&
    until ping -c 1 -W 1 $peer >/dev/null; do sleep 1; done &&
    { ticker & t=$!; run RC ibv_rc_pingpong -g 1 -n 20000 -s 4096; kill $t; steps_verdict; };
    r=$?; klog; exit $r'
  # shellcheck disable=SC2016
  b_cmd='. /etc/tools.sh && net_up 3 &&
    insmod /lib/virtio_rdma.ko && wait_dev && wait_gid && echo BEFORE-OK && peer= &&
    { run RC ibv_rc_pingpong -g 1 -n 20000 -s 4096; steps_verdict; }; r=$?; klog; exit $r'
fi
# nic NAME MAC: the guest's interface, paired with its RDMA device by MAC. Alone, a stream
# server nobody connects to; with --traffic, A (and its destinations) connect to B's, for the
# pingpong's TCP exchange.
nic() {
  local net="server=on,addr.type=unix,addr.path=$dir/$1-net.sock"
  if [ "$traffic" = 1 ] && [ "$1" != B ]; then
    net="server=off,addr.type=unix,addr.path=$dir/B-net.sock,reconnect-ms=500"
  fi
  echo "-netdev stream,id=n0,$net -device virtio-net-pci,netdev=n0,mac=$2"
}

t=$(date +%s)
# shellcheck disable=SC2046 # nic's words are QEMU arguments
guest B "$dir/b.sock" "$b_cmd" $(nic B 52:54:00:00:00:02)
[ "$traffic" = 0 ] || wait_socket "$dir/B-net.sock" "$launch_pid" || true
# shellcheck disable=SC2046
guest A "$dir/a-src.sock" "$a_cmd" $(nic A 52:54:00:00:00:01)
# Both sides use the return path: the destination tells the source whether it loaded
# everything (the device's state included), and a source whose destination failed resumes
# instead of staying paused.
return_path='{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"return-path","state":true}]}}'
# dest NAME: a destination QEMU for A, waiting for the migration on $dir/NAME.mig.
dest() {
  # shellcheck disable=SC2046
  guest "$1" "$dir/a-dst.sock" "$a_cmd" $(nic "$1" 52:54:00:00:00:01) -incoming defer
  wait_socket "$dir/$1.qmp" "${launch_guests[$1]}"
  qmp "$dir/$1.qmp" "$return_path" >/dev/null
  qmp "$dir/$1.qmp" "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"unix:$dir/$1.mig\"}}" >/dev/null
  wait_socket "$dir/$1.mig" "${launch_guests[$1]}"
}
a_pid() { cat "$dir/A.pid" 2>/dev/null; }

if wait_lines "$dir/A.console" '^BEFORE-OK' 1 "${launch_guests[A]}" &&
  wait_lines "$dir/B.console" '^BEFORE-OK' 1 "${launch_guests[B]}" &&
  wait_lines "$dir/A.console" '^TICK 5$' 1 "${launch_guests[A]}"; then
  ok "A and B booted (B's driver found its device; A $(($(date +%s) - t)) s)"
else
  failed "A or B did not come up"
  for f in "$dir"/*.console; do
    show_log "$(basename "$f" .console) console" "$f"
  done
  show_log "daemon log" "$dir/daemon.log"
  verdict "$name"
fi
# A's QEMU runs (status "running") and its counter goes on past N.
a_runs() { # WHAT
  local n s
  n=$(last_tick "$dir/A.console")
  s=$(qmp "$dir/A.qmp" '{"execute":"query-status"}' || true)
  if [ "$(field "$s" return status)" = running ] && ticks_after "$dir/A.console" "${n:-0}" "$(a_pid)"; then
    ok "$1: A still runs (counter past $n)"
  else
    failed "$1: A does not run ($s)"
  fi
}

qmp "$dir/A.qmp" "$return_path" >/dev/null

# 1. Nobody listening.
r=$(qmp "$dir/A.qmp" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/nobody.mig\"}}" || true)
m=$(migrate_wait "$dir/A.qmp" || true)
if [ "$(field "$m" status)" = failed ] || grep -q '"error"' <<<"$r"; then
  ok "migration to a destination that never started fails ($(field "$m" error-desc)$(field "$r" error desc))"
else
  failed "migration to nobody: $r $m"
fi
a_runs "after the failed migration"

# 2. Cancelled midway: the bandwidth held at 4 MiB/s, cancelled once RAM flows.
dest D1
qmp "$dir/A.qmp" '{"execute":"migrate-set-parameters","arguments":{"max-bandwidth":4194304}}' >/dev/null
qmp "$dir/A.qmp" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/D1.mig\"}}" >/dev/null
m=$(migrate_wait "$dir/A.qmp" active || true)
qmp "$dir/A.qmp" '{"execute":"migrate_cancel"}' >/dev/null || true
m2=$(migrate_wait "$dir/A.qmp" || true)
if [ "$(field "$m" status)" = active ] && [ "$(field "$m2" status)" = cancelled ]; then
  ok "migration cancelled midway (after $(field "$m" ram transferred) bytes of RAM)"
else
  failed "cancel: $m / $m2"
fi
a_runs "after the cancelled migration"
d1=0
launch_wait "${launch_guests[D1]}" || d1=$?
echo "   the cancelled destination's QEMU ended (run-guest exit $d1)"

# 2b. The destination dies midway (SIGKILL to its QEMU while RAM flows): the source runs on.
dest D3
qmp "$dir/A.qmp" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/D3.mig\"}}" >/dev/null
m=$(migrate_wait "$dir/A.qmp" active || true)
kill -KILL "$(cat "$dir/D3.pid")" 2>/dev/null || true
m2=$(migrate_wait "$dir/A.qmp" || true)
if [ "$(field "$m" status)" = active ] && [ "$(field "$m2" status)" = failed ]; then
  ok "migration to a destination killed midway fails ($(field "$m2" error-desc))"
else
  failed "killed destination: $m / $m2"
fi
a_runs "after the destination died"
launch_wait "${launch_guests[D3]}" || true

# 3. The migration.
dest D2
qmp "$dir/A.qmp" '{"execute":"migrate-set-parameters","arguments":{"max-bandwidth":1099511627776}}' >/dev/null
src_tick=$(last_tick "$dir/A.console")
tm=$(date +%s)
qmp "$dir/A.qmp" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/D2.mig\"}}" >/dev/null
m=$(migrate_wait "$dir/A.qmp" || true)
if [ "$(field "$m" status)" = completed ]; then
  downtime=$(field "$m" downtime) total=$(field "$m" total-time)
  ok "migration completed: downtime $downtime ms, total $total ms (setup $(field "$m" setup-time) ms," \
    "$(field "$m" ram transferred) bytes of RAM, $(($(date +%s) - tm)) s wall)"
else
  failed "migration: $m"
  # A migration that failed in its last phase (the back-end refused its state, the
  # destination refused it): the source resumes.
  a_runs "after the failed migration"
  open_gate A
  if wait_lines "$dir/A.console" '^AFTER-OK' 1 "${launch_guests[A]}"; then
    ok "A's device answers at the source after the failed migration"
  else
    failed "A's device at the source after the failed migration"
  fi
  for f in "$dir"/*.console; do
    show_log "$(basename "$f" .console) console" "$f"
  done
  show_log "daemon log" "$dir/daemon.log"
  verdict "$name"
fi
src_tick=$(last_tick "$dir/A.console")
s=$(qmp "$dir/D2.qmp" '{"execute":"query-status"}' || true)
if [ "$(field "$s" return status)" = running ] &&
  ticks_after "$dir/D2.console" "${src_tick:-0}" "${launch_guests[D2]}"; then
  ok "the guest runs on at the destination: its counter went from $src_tick (source) to $(last_tick "$dir/D2.console")"
else
  failed "the destination does not run: $s, counter ${src_tick:-?} -> $(last_tick "$dir/D2.console")"
fi
qmp "$dir/A.qmp" '{"execute":"quit"}' >/dev/null || true
ra=0
launch_wait "${launch_guests[A]}" || ra=$?
if ! kill -0 "$(a_pid)" 2>/dev/null; then
  ok "the source QEMU exited after the migration (quit; run-guest exit $ra: no guest exit code there)"
else
  failed "the source QEMU still runs"
fi
# With --traffic, A and B run the pingpong to its end with no gate: its result lines, checked
# below, say that both devices worked across the migration.
if [ "$traffic" = 0 ]; then
  open_gate D2
  if wait_lines "$dir/D2.console" '^AFTER-OK' 1 "${launch_guests[D2]}"; then
    ok "A's device answers at the destination (ibv_devinfo: port active)"
  else
    failed "A's device at the destination"
  fi
  open_gate B
  if wait_lines "$dir/B.console" '^AFTER-OK' 1 "${launch_guests[B]}"; then
    ok "B's device still answers"
  else
    failed "B's device"
  fi
fi
launch_wait_guests D2 B
if [ "${rcs[0]}" = 0 ] && [ "${rcs[1]}" = 0 ]; then
  ok "A (at the destination) and B ended their commands with 0"
else
  failed "exit codes: A at the destination ${rcs[0]}, B ${rcs[1]}"
fi
for g in D2 B; do
  if grep -q '^KERNEL-WARNINGS: 0' "$dir/$g.console"; then
    ok "$g: no kernel warnings"
  else
    failed "$g: kernel warnings (or no kernel log)"
  fi
done
if [ "$traffic" = 1 ]; then
  # A's step started on the source's console and ends on the destination's.
  line=$(tr -d '\r' <"$dir/D2.console" | grep -m1 '^20000 iters in .* seconds' || true)
  if [ -n "$line" ] && tr -d '\r' <"$dir/D2.console" | grep -q '^STEP RC exit 0'; then
    ok "ibv_rc_pingpong across the migration (A, ended at the destination): $line"
  else
    failed "ibv_rc_pingpong across the migration (A): no result line and exit 0 on the destination's console"
  fi
  check_after RC "ibv_rc_pingpong across the migration (B)" "^20000 iters in .* seconds" B
fi
if grep -q 'device state saved' "$dir/daemon.log" && grep -q 'device state loaded' "$dir/daemon.log"; then
  ok "the daemon saved A's state and loaded it into the destination's instance"
else
  failed "the daemon's log has no save and load of the state"
fi
# The device's blackout, the most A's RC peers were held: from the source's save to the
# destination's start (a measurement, printed, not a verdict).
blackout=$(sed -n 's/.*running at instance [0-9]*, \([0-9]*\) ms after instance.*/\1/p' \
  "$dir/daemon.log" | tail -n 1)
echo "   MIGRATE-BLACKOUT: ${blackout:-?} ms from the source's save to the destination's start (daemon)"
if kill -0 "$daemon_pid" 2>/dev/null; then ok "the daemon is alive"; else failed "the daemon died"; fi

if [ "$fail" != 0 ]; then
  for f in "$dir"/*.console; do
    show_log "$(basename "$f" .console) console" "$f"
  done
  show_log "daemon log" "$dir/daemon.log"
fi
echo "== $name: whole run $(($(date +%s) - t_start)) s"
verdict "$name"
