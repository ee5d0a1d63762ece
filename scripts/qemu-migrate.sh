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
# ibv_rc_pingpong against B ($PAIR_PINGPONG_ITERS iterations of 4 KiB, default 200000) across
# step 3, and both sides' result lines are checked.
# --tool write_bw|read_bw|atomic_bw (implies --driver): instead of the pingpong, Debian's
# unmodified perftest (ib_write_bw ... over GID 1, -x 1, the TCP exchange), A the client and B
# the server, 64 KiB messages for $MIGRATE_TOOL_SECONDS s (-D, default 60, measured from 3 s
# after the start to 3 s before the end); the migrations start once the client printed its
# result header, and both sides must print their result row after it (the migrating side's on
# its destination's console: the run spanned the migration) and exit 0.
# --migrate-b: B migrates (to its standby, "vmb-standby") instead of A, while A writes into it
# (ib_write_bw unless --tool or --traffic says otherwise); steps 1 to 4 apply to B.
# --load: the migrating VM under its peer's full write load: the other VM writes into it with
# ib_write_bw (unless --tool says otherwise), $MIGRATE_LOAD_SIZE-byte messages (default 64 MiB:
# the written range, rewritten as fast as the device copies, is the dirty set), and step 3 runs
# with QEMU's own max-bandwidth and downtime-limit (read at the start) instead of no bandwidth
# limit. If it has not converged after $MIGRATE_LOAD_ROUNDS dirty-sync rounds (default 20), the
# downtime limit is raised to twice QEMU's expected downtime, and so on each further such
# number of rounds, up to 30 s (the peer's hold, pause_hold_ms); what was needed is reported.
# auto-converge would not help here: it throttles the migrating VM's vCPUs, and the writes
# come from its peer through the device.
# Measurements go to lines beginning "MIGRATE-" (QEMU's figures, the device's blackout, the
# tool's row, the load's convergence).
# Prints "qemu-migrate: N passed, M failed".
#
# Needs a daemon that offers dirty logging (VHOST_F_LOG_ALL, LOG_SHMFD: QEMU refuses to migrate
# a vhost device without) and DEVICE_STATE, and the QEMU series with patch 0007
# (scripts/build-qemu.sh). DAEMON=PATH DAEMON_PREBUILT=1: another daemon binary, not built here.
# MIGRATE_DST=plain: the destination is a VM of its own rather than A's standby (not with
# --migrate-b).
#
# Usage: bash scripts/qemu-migrate.sh [--driver] [--traffic | --tool TOOL] [--migrate-b]
#   [--load] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
# shellcheck source=scripts/lib/pair.sh
. scripts/lib/pair.sh
# tool: what runs between A and B across the migration ('' nothing, pingpong, or a perftest
# bandwidth test); mig: the guest that migrates, stay: the other.
tool='' driver=0 mig=A load=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
  --traffic) tool=pingpong driver=1; shift ;;
  --tool) tool=${2:?--tool needs write_bw, read_bw or atomic_bw}; driver=1; shift 2 ;;
  --migrate-b) mig=B driver=1; shift ;;
  --load) load=1 driver=1; shift ;;
  --driver) driver=1; shift ;;
  *) args+=("$1"); shift ;;
  esac
done
guest_script_args "${args[@]}"
if [ "$mig" = B ] || [ "$load" = 1 ]; then tool=${tool:-write_bw}; fi
case "$tool" in
'' | pingpong | write_bw | read_bw | atomic_bw) ;;
*) guest_die "--tool: write_bw, read_bw or atomic_bw, not $tool" ;;
esac
[ "$load" = 0 ] || [ "$tool" != pingpong ] ||
  guest_die "--load needs a perftest tool, not the pingpong"
[ "$mig" = A ] || [ "${MIGRATE_DST:-standby}" = standby ] ||
  guest_die "--migrate-b: B's destination is its standby"
# the_other G: the guest that is not G.
the_other() { if [ "$1" = A ]; then echo B; else echo A; fi; }
stay=$(the_other "$mig")
# The tool's server: B, the side written into (ib_write_bw's client writes into the server's
# memory); with --load the migrating VM, which its peer writes into.
server=B
[ "$load" = 0 ] || server=$mig
client=$(the_other "$server")
name=qemu-migrate
t_start=$(date +%s)

launch_need_qemu
if [ -z "${DAEMON_PREBUILT:-}" ]; then
  cargo build --release --locked -q -p vhost-user-rdma
fi
kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
rc=$(bash scripts/build-rdma-core.sh)

launch_workdir migrate

# What the guests source first: pair_tools (net_up, wait_dev, wait_gid), wait_probe, gate
# (prints GATE, then waits for a line on the second serial port) and ticker (TICK n, five a
# second).
{
  pair_tools
  cat <<'EOF'
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
# With a perftest tool, Debian's perftest too (an image of its own).
pair_image rdma-migrate "$dir/tools.sh" "$kmod" "$rc" "$tool"

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
  # With --migrate-b, B's standby too.
  [ "$mig" = A ] || printf '[[vm]]\nname = "vmb-standby"\nsocket = "%s"\ntenant = "t"\n%s\n\n' \
    "$dir/b-dst.sock" 'standby_for = "vmb"'
} >"$dir/config.toml"
# Each guest's socket (its source's), MAC and interface address (10.42.0.N); dst_sock: the
# migrating guest's destination's socket.
declare -A src_sock=([A]="$dir/a-src.sock" [B]="$dir/b.sock")
declare -A mac=([A]=52:54:00:00:00:01 [B]=52:54:00:00:00:02) addr=([A]=1 [B]=3)
dst_sock=$dir/a-dst.sock waits=()
[ "$mig" = A ] || dst_sock=$dir/b-dst.sock waits=(--wait "$dir/b-dst.sock")
launch_daemon --wait "$dir/a-src.sock" --wait "$dir/a-dst.sock" --wait "$dir/b.sock" \
  "${waits[@]}" --wait "$dir/mgmt.sock" --config "$dir/config.toml"
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
# or cancelled (or, with UNTIL=active, until some RAM has gone; with UNTIL=rounds:N, until QEMU
# has synced the dirty log N times and is still copying); prints the last answer's "return",
# with the highest ram.dirty-pages-rate seen as "peak-dirty-pages-rate". Gives up only when
# neither the status nor the bytes sent changed for $LAUNCH_STALL s. Each dirty-sync round it
# sees goes to QMP.rounds (kept with --keep): status, total-time, dirty-sync-count, remaining,
# transferred, dirty-pages-rate, mbps, expected-downtime.
migrate_wait() {
  python3 - "$1" "${2:-}" "$LAUNCH_STALL" <<'PY'
import json, socket, sys, time
path, until, stall = sys.argv[1], sys.argv[2], float(sys.argv[3])
rounds = open(path + ".rounds", "a")
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
last, since, peak, seen_round = None, time.monotonic(), 0, None
while True:
    r = call({"execute": "query-migrate"}).get("return", {})
    st = r.get("status")
    ram = r.get("ram", {})
    seen = (st, ram.get("transferred"))
    peak = max(peak, ram.get("dirty-pages-rate") or 0)
    r["peak-dirty-pages-rate"] = peak
    if (st, ram.get("dirty-sync-count")) != seen_round:
        seen_round = (st, ram.get("dirty-sync-count"))
        print(st, r.get("total-time"), *(ram.get(k) for k in ("dirty-sync-count", "remaining",
              "transferred", "dirty-pages-rate", "mbps")), r.get("expected-downtime"),
              file=rounds, flush=True)
    if st in ("completed", "failed", "cancelled"):
        break
    if until == "active" and st == "active" and (ram.get("transferred") or 0) > 0:
        break
    if until.startswith("rounds:") and st == "active" and \
            (ram.get("dirty-sync-count") or 0) >= int(until[7:]):
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
  launch_guest "$gname" --image "$image" --append 'guest.uio=none' --cmd "$cmd" -- \
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

# The tool: its step's label, command line, result row (pair_tool); 64 KiB messages, with
# --load $MIGRATE_LOAD_SIZE.
size=65536
[ "$load" = 0 ] || size=${MIGRATE_LOAD_SIZE:-67108864}
[ -z "$tool" ] || pair_tool "$tool" "$size" "${MIGRATE_TOOL_SECONDS:-60}"
# tool_cmd G: guest G's command with a tool (A is 10.42.0.1, B 10.42.0.3; they find each other
# over -netdev stream): the client first reaches the server's interface, then each runs the
# tool in a step; the migrating guest counts (ticker) meanwhile.
tool_cmd() {
  local g=$1 peer='' body="run $label $tool_line"
  [ "$g" != "$client" ] || peer=10.42.0.${addr[$server]}
  # shellcheck disable=SC2016 # the guest's shell expands them
  [ "$g" != "$mig" ] || body='ticker & t=$!; '"$body"'; kill $t'
  pair_cmd "${addr[$g]}" "$peer" "$body"
}
if [ -n "$tool" ]; then
  a_cmd=$(tool_cmd A) b_cmd=$(tool_cmd B)
fi
declare -A guest_cmd=([A]="$a_cmd" [B]="$b_cmd")
# What the MIGRATE- lines say the run was.
mode="$mig migrates"
[ "$driver" = 0 ] || mode="$mode (driver loaded)"
[ -z "$tool" ] || mode="$mode; $tool_name $client -> $server"
[[ "$tool" != *_bw ]] || mode="$mode, $size B, -D ${MIGRATE_TOOL_SECONDS:-60} -f 3"
[ "$load" = 0 ] || mode="$mode; QEMU's own max-bandwidth and downtime-limit"

# nic NAME MAC: the guest's interface, paired with its RDMA device by MAC. Alone, a stream
# server nobody connects to; with a tool, the migrating guest (and its destinations) connect to
# the other's, for the tool's TCP exchange.
nic() {
  if [ -n "$tool" ] && [ "$1" != "$stay" ]; then pair_nic "$1" "$2" "$stay"; else pair_nic "$1" "$2"; fi
}

t=$(date +%s)
# shellcheck disable=SC2046 # nic's words are QEMU arguments
guest "$stay" "${src_sock[$stay]}" "${guest_cmd[$stay]}" $(nic "$stay" "${mac[$stay]}")
[ -z "$tool" ] || wait_socket "$dir/$stay-net.sock" "$launch_pid" || true
# shellcheck disable=SC2046
guest "$mig" "${src_sock[$mig]}" "${guest_cmd[$mig]}" $(nic "$mig" "${mac[$mig]}")
# Both sides use the return path: the destination tells the source whether it loaded
# everything (the device's state included), and a source whose destination failed resumes
# instead of staying paused.
return_path='{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"return-path","state":true}]}}'
# dest NAME: a destination QEMU for the migrating guest, waiting for the migration on
# $dir/NAME.mig.
dest() {
  # shellcheck disable=SC2046
  guest "$1" "$dst_sock" "${guest_cmd[$mig]}" $(nic "$1" "${mac[$mig]}") -incoming defer
  wait_socket "$dir/$1.qmp" "${launch_guests[$1]}"
  qmp "$dir/$1.qmp" "$return_path" >/dev/null
  qmp "$dir/$1.qmp" "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"unix:$dir/$1.mig\"}}" >/dev/null
  wait_socket "$dir/$1.mig" "${launch_guests[$1]}"
}
m_pid() { cat "$dir/$mig.pid" 2>/dev/null; }
# m_qmp CMD: a QMP command to the migrating guest's (source) QEMU. set_params MEMBERS:
# migrate-set-parameters with these JSON members. migrate_to NAME: migrates to $dir/NAME.mig.
m_qmp() { qmp "$dir/$mig.qmp" "$1"; }
set_params() { m_qmp "{\"execute\":\"migrate-set-parameters\",\"arguments\":{$1}}" >/dev/null; }
migrate_to() { m_qmp "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/$1.mig\"}}"; }
# show_logs_and_stop: every console and the daemon's log; the verdict.
show_logs_and_stop() {
  for f in "$dir"/*.console; do
    show_log "$(basename "$f" .console) console" "$f"
  done
  show_log "daemon log" "$dir/daemon.log"
  verdict "$name"
}

if wait_lines "$dir/A.console" '^BEFORE-OK' 1 "${launch_guests[A]}" &&
  wait_lines "$dir/B.console" '^BEFORE-OK' 1 "${launch_guests[B]}" &&
  wait_lines "$dir/$mig.console" '^TICK 5$' 1 "${launch_guests[$mig]}"; then
  ok "A and B booted (B's driver found its device; $mig $(($(date +%s) - t)) s)"
else
  failed "A or B did not come up"
  show_logs_and_stop
fi
# perftest: the migrations start once the client has printed its result header (the transfer
# runs).
if [[ "$tool" == *_bw ]]; then
  if wait_lines "$dir/$client.console" '#bytes +#iterations' 1 "${launch_guests[$client]}"; then
    ok "$tool_name runs ($client the client, $server the server)"
  else
    failed "$tool_name did not start"
    show_logs_and_stop
  fi
fi
# The migrating guest's QEMU runs (status "running") and its counter goes on past N.
m_runs() { # WHAT
  local n s
  n=$(last_tick "$dir/$mig.console")
  s=$(m_qmp '{"execute":"query-status"}' || true)
  if [ "$(field "$s" return status)" = running ] &&
    ticks_after "$dir/$mig.console" "${n:-0}" "$(m_pid)"; then
    ok "$1: $mig still runs (counter past $n)"
  else
    failed "$1: $mig does not run ($s)"
  fi
}

m_qmp "$return_path" >/dev/null
if [ "$load" = 1 ]; then
  # QEMU's own settings, before step 2 changes the bandwidth.
  p=$(m_qmp '{"execute":"query-migrate-parameters"}')
  qemu_bw=$(field "$p" return max-bandwidth) qemu_dl=$(field "$p" return downtime-limit)
fi

# 1. Nobody listening.
r=$(migrate_to nobody || true)
m=$(migrate_wait "$dir/$mig.qmp" || true)
if [ "$(field "$m" status)" = failed ] || grep -q '"error"' <<<"$r"; then
  ok "migration to a destination that never started fails ($(field "$m" error-desc)$(field "$r" error desc))"
else
  failed "migration to nobody: $r $m"
fi
m_runs "after the failed migration"

# 2. Cancelled midway: the bandwidth held at 4 MiB/s, cancelled once RAM flows.
dest D1
set_params '"max-bandwidth":4194304'
migrate_to D1 >/dev/null
m=$(migrate_wait "$dir/$mig.qmp" active || true)
c=$(m_qmp '{"execute":"migrate_cancel"}' || true)
m2=$(migrate_wait "$dir/$mig.qmp" || true)
# QEMU reports a cancel as "cancelled", or, when the channel's shutdown that the cancel makes
# reaches the RAM save first, as "failed" with a channel error (seen once in CI, QEMU 10.2:
# "failed to save SaveStateEntry ... ram: -5"): either is the cancel taking effect.
st2=$(field "$m2" status) err2=$(field "$m2" error-desc)
if [ "$(field "$m" status)" = active ] && ! grep -q '"error"' <<<"$c" &&
  { [ "$st2" = cancelled ] || { [ "$st2" = failed ] && [[ "$err2" == "Channel error"* ]]; }; }; then
  ok "migration cancelled midway (after $(field "$m" ram transferred) bytes of RAM; $st2)"
else
  failed "cancel: $m / $c / $m2"
fi
m_runs "after the cancelled migration"
d1=0
launch_wait "${launch_guests[D1]}" || d1=$?
echo "   the cancelled destination's QEMU ended (run-guest exit $d1)"

# 2b. The destination dies midway (SIGKILL to its QEMU while RAM flows): the source runs on.
dest D3
migrate_to D3 >/dev/null
m=$(migrate_wait "$dir/$mig.qmp" active || true)
kill -KILL "$(cat "$dir/D3.pid")" 2>/dev/null || true
m2=$(migrate_wait "$dir/$mig.qmp" || true)
if [ "$(field "$m" status)" = active ] && [ "$(field "$m2" status)" = failed ]; then
  ok "migration to a destination killed midway fails ($(field "$m2" error-desc))"
else
  failed "killed destination: $m / $m2"
fi
m_runs "after the destination died"
launch_wait "${launch_guests[D3]}" || true

# 3. The migration: no bandwidth limit; with --load, QEMU's own limits.
dest D2
if [ "$load" = 1 ]; then
  set_params "\"max-bandwidth\":$qemu_bw,\"downtime-limit\":$qemu_dl"
else
  set_params '"max-bandwidth":1099511627776'
fi
src_tick=$(last_tick "$dir/$mig.console")
tm=$(date +%s)
migrate_to D2 >/dev/null
# --load: every $MIGRATE_LOAD_ROUNDS dirty-sync rounds without convergence, the downtime limit
# goes up (twice QEMU's expected downtime, at least twice the last limit), up to the peer's
# 30 s hold.
remedy=none peak=0
if [ "$load" = 1 ]; then
  rounds=${MIGRATE_LOAD_ROUNDS:-20} limit=$qemu_dl
  next=$rounds
  while :; do
    m=$(migrate_wait "$dir/$mig.qmp" "rounds:$next" || true)
    p=$(field "$m" peak-dirty-pages-rate)
    [ "${p:-0}" -le "$peak" ] || peak=$p
    [ "$(field "$m" status)" = active ] || break
    expected=$(field "$m" expected-downtime)
    limit=$((2 * (${expected:-0} > limit ? ${expected:-0} : limit)))
    if [ "$limit" -gt 30000 ]; then
      echo "   not converged after $next dirty-sync rounds with downtime-limit" \
        "$((limit / 2)) ms: cancelled"
      remedy="none sufficed (downtime-limit up to $((limit / 2)) ms)"
      m_qmp '{"execute":"migrate_cancel"}' >/dev/null || true
      break
    fi
    echo "   not converged after $next dirty-sync rounds (expected downtime ${expected:-?} ms," \
      "$(field "$m" ram remaining) bytes left, $(field "$m" ram dirty-pages-rate) dirty pages/s):" \
      "downtime-limit raised to $limit ms"
    set_params "\"downtime-limit\":$limit"
    remedy="downtime-limit raised to $limit ms (after $next dirty-sync rounds,"
    remedy="$remedy at $(field "$m" total-time) ms)"
    next=$((next + rounds))
  done
fi
m=$(migrate_wait "$dir/$mig.qmp" || true)
if [ "$(field "$m" status)" = completed ]; then
  downtime=$(field "$m" downtime) total=$(field "$m" total-time)
  ok "migration completed: downtime $downtime ms, total $total ms (setup $(field "$m" setup-time) ms," \
    "$(field "$m" ram transferred) bytes of RAM, $(($(date +%s) - tm)) s wall)"
  p=$(field "$m" peak-dirty-pages-rate)
  [ "${p:-0}" -le "${peak:-0}" ] || peak=$p
  echo "   MIGRATE-QEMU: $mode: downtime $downtime ms, total $total ms, setup $(field "$m" setup-time) ms," \
    "RAM $(field "$m" ram transferred) bytes, $(field "$m" ram dirty-sync-count) dirty-sync rounds," \
    "peak dirty-pages-rate $peak pages/s"
  if [ "$load" = 1 ]; then
    echo "   MIGRATE-LOAD: QEMU's max-bandwidth $qemu_bw B/s, downtime-limit $qemu_dl ms;" \
      "converged after $(field "$m" ram dirty-sync-count) dirty-sync rounds; needed: $remedy"
  fi
else
  failed "migration: $m"
  [ "$load" = 0 ] || echo "   MIGRATE-LOAD: did not complete; tried: $remedy"
  # A migration that failed in its last phase (the back-end refused its state, the
  # destination refused it): the source resumes.
  m_runs "after the failed migration"
  open_gate "$mig"
  if wait_lines "$dir/$mig.console" '^AFTER-OK' 1 "${launch_guests[$mig]}"; then
    ok "$mig's device answers at the source after the failed migration"
  else
    failed "$mig's device at the source after the failed migration"
  fi
  show_logs_and_stop
fi
src_tick=$(last_tick "$dir/$mig.console")
s=$(qmp "$dir/D2.qmp" '{"execute":"query-status"}' || true)
if [ "$(field "$s" return status)" = running ] &&
  ticks_after "$dir/D2.console" "${src_tick:-0}" "${launch_guests[D2]}"; then
  ok "the guest runs on at the destination: its counter went from $src_tick (source) to $(last_tick "$dir/D2.console")"
else
  failed "the destination does not run: $s, counter ${src_tick:-?} -> $(last_tick "$dir/D2.console")"
fi
m_qmp '{"execute":"quit"}' >/dev/null || true
ra=0
launch_wait "${launch_guests[$mig]}" || ra=$?
if ! kill -0 "$(m_pid)" 2>/dev/null; then
  ok "the source QEMU exited after the migration (quit; run-guest exit $ra: no guest exit code there)"
else
  failed "the source QEMU still runs"
fi
# With a tool, A and B run it to its end with no gate: its result lines, checked below, say
# that both devices worked across the migration. (Without one, A migrates.)
if [ -z "$tool" ]; then
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
launch_wait_guests D2 "$stay"
if [ "${rcs[0]}" = 0 ] && [ "${rcs[1]}" = 0 ]; then
  ok "$mig (at the destination) and $stay ended their commands with 0"
else
  failed "exit codes: $mig at the destination ${rcs[0]}, $stay ${rcs[1]}"
fi
for g in D2 "$stay"; do
  kernel_clean "$g"
done
if [ -n "$tool" ]; then
  # The migrating guest's step started on the source's console and ends on the destination's
  # (a tool that ended before the migration fails here).
  line=$(tr -d '\r' <"$dir/D2.console" | grep -m1 -E "$row" || true)
  if [ -n "$line" ] && tr -d '\r' <"$dir/D2.console" | grep -c "^STEP $label exit 0" >/dev/null; then
    ok "$tool_name across the migration ($mig, ended at the destination): $line"
  else
    failed "$tool_name across the migration ($mig): no result line and exit 0 on the destination's console" \
      "$(tr -d '\r' <"$dir/D2.console" | grep -m1 -e "Can't produce a report" -e 'Correlation coefficient' || true)"
  fi
  check_after "$label" "$tool_name across the migration ($stay)" "$row" "$stay"
  if [[ "$tool" == *_bw ]]; then
    # The client's row (the server prints the client's figures too).
    con=$client
    [ "$client" != "$mig" ] || con=D2
    echo "   MIGRATE-TOOL: $mode: $(tr -d '\r' <"$dir/$con.console" | grep -m1 -E "$row" || echo '?')" \
      "(#bytes #iterations BW-peak BW-average[MB/s] MsgRate[Mpps])"
  fi
fi
if grep -q 'device state saved' "$dir/daemon.log" && grep -q 'device state loaded' "$dir/daemon.log"; then
  ok "the daemon saved $mig's state and loaded it into the destination's instance"
else
  failed "the daemon's log has no save and load of the state"
fi
# The device's blackout, the most the migrating guest's RC peers were held: from the source's
# save to the destination's start (a measurement, printed, not a verdict).
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
