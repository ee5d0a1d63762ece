#!/usr/bin/env bash
# Live upgrade of the daemon under two QEMU guests running RDMA traffic (issue 30 item 3, spec
# 20.7). One daemon (VMs A and B, a management socket, a hand-over socket) serves guests A and B,
# each with virtio_rdma.ko loaded; A runs ibv_rc_pingpong against B ($PAIR_PINGPONG_ITERS
# iterations of 4 KiB, default 200000),
# or with --tool write_bw Debian's unmodified ib_write_bw (A writes into B, 64 KiB messages for
# $UPGRADE_TOOL_SECONDS s, default 60, measured from 3 s after the start to 3 s before the end).
# Once the tool runs:
#   1. a successor whose configuration lacks VM B (--take-over) must exit non-zero, and the
#      running daemon must log the refusal and serve on;
#   2. a successor with the same configuration (--take-over; the binary $DAEMON_NEW, default
#      the same one) takes both VMs over: the old daemon exits with status 0, the new one logs
#      "took over 2 VMs (2 connected)";
#   3. that successor is upgraded by a third process that it starts itself on SIGUSR2 (what
#      `systemctl reload` sends, dist/vhost-user-rdma.service), which logs into the same file;
#   4. the tool still runs; `vhost-user-rdma ctl vms` answers on the management socket (now the
#      third process's): both VMs connected, with the objects they had before the upgrades.
# Before step 1 and after each step, B's count of messages received (`ctl stats vmb`) must grow
# on the daemon serving then: the traffic goes through it.
# Then both sides of the tool must print their result row and exit 0, with no kernel warnings
# in either guest. Each upgrade's blackout (the successor's figure: from its request to the
# commit, the longest the VMs' rings were stopped) is printed on an "UPGRADE-BLACKOUT: X ms"
# line.
# Prints "qemu-upgrade: N passed, M failed".
#
# DAEMON=PATH DAEMON_PREBUILT=1: another daemon binary, not built here; DAEMON_NEW=PATH: the
# successors' binary.
#
# Usage: bash scripts/qemu-upgrade.sh [--tool write_bw] [--kernel 6.1|6.12] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
# shellcheck source=scripts/lib/pair.sh
. scripts/lib/pair.sh
tool=pingpong
args=()
while [ $# -gt 0 ]; do
  case "$1" in
  --tool) tool=${2:?--tool needs write_bw}; shift 2 ;;
  *) args+=("$1"); shift ;;
  esac
done
guest_script_args "${args[@]}"
case "$tool" in
pingpong | write_bw) ;;
*) guest_die "--tool: write_bw, not $tool" ;;
esac
name=qemu-upgrade
t_start=$(date +%s)

launch_need_qemu
if [ -z "${DAEMON_PREBUILT:-}" ]; then
  cargo build --release --locked -q -p vhost-user-rdma
fi
DAEMON_NEW=${DAEMON_NEW:-$DAEMON}
kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
rc=$(bash scripts/build-rdma-core.sh)

launch_workdir upgrade
pair_tools >"$dir/tools.sh"
pair_image rdma-upgrade "$dir/tools.sh" "$kmod" "$rc" "$tool"
pair_tool "$tool" 65536 "${UPGRADE_TOOL_SECONDS:-60}"

# VMs "vma" (A, 10.42.0.1) and "vmb" (B, 10.42.0.3) in tenant "t". wrong.toml: the same daemon
# without B, which a successor must refuse to take over with.
daemon_conf() {
  printf '[daemon]\nmgmt_socket = "%s"\nhandover_socket = "%s"\n\n[[tenant]]\nname = "t"\n\n' \
    "$dir/mgmt.sock" "$dir/handover.sock"
  printf '[[vm]]\nname = "vma"\nsocket = "%s"\ntenant = "t"\n%s\n%s\n\n' "$dir/a.sock" \
    'mac = "52:54:00:00:00:01"' 'gids = ["::ffff:10.42.0.1"]'
}
{
  daemon_conf
  printf '[[vm]]\nname = "vmb"\nsocket = "%s"\ntenant = "t"\n%s\n%s\n\n' "$dir/b.sock" \
    'mac = "52:54:00:00:00:02"' 'gids = ["::ffff:10.42.0.3"]'
} >"$dir/config.toml"
daemon_conf >"$dir/wrong.toml"
launch_daemon --wait "$dir/a.sock" --wait "$dir/b.sock" --wait "$dir/mgmt.sock" \
  --wait "$dir/handover.sock" --config "$dir/config.toml"
# The daemon serving now and its log.
cur_pid=$launch_pid cur_log=$dir/daemon.log

# guest NAME SOCKET CMD [QEMU ARGS...]
guest() {
  local gname=$1 sock=$2 cmd=$3
  shift 3
  launch_guest "$gname" --image "$image" --append 'guest.uio=none' --cmd "$cmd" -- \
    -chardev "socket,id=rdma,path=$sock" -device vhost-user-rdma-pci,chardev=rdma "$@"
}
# show_logs: every console and daemon log. show_logs_and_stop: and the verdict, failed.
show_logs() {
  local f
  for f in "$dir"/*.console; do
    show_log "$(basename "$f" .console) console" "$f"
  done
  for f in "$dir"/daemon*.log; do
    show_log "$(basename "$f" .log)" "$f"
  done
}
show_logs_and_stop() {
  show_logs
  verdict "$name"
  exit 1
}

# B the server, A the client; A's interface connects to B's.
t=$(date +%s)
# shellcheck disable=SC2046 # pair_nic's words are QEMU arguments
guest B "$dir/b.sock" "$(pair_cmd 3 '' "run $label $tool_line")" \
  $(pair_nic B 52:54:00:00:00:02)
wait_socket "$dir/B-net.sock" "$launch_pid" || true
# shellcheck disable=SC2046
guest A "$dir/a.sock" "$(pair_cmd 1 10.42.0.3 "run $label $tool_line")" \
  $(pair_nic A 52:54:00:00:00:01 B)
if wait_lines "$dir/A.console" '^BEFORE-OK' 1 "${launch_guests[A]}" &&
  wait_lines "$dir/B.console" '^BEFORE-OK' 1 "${launch_guests[B]}"; then
  ok "A and B booted, their drivers found their devices ($(($(date +%s) - t)) s)"
else
  failed "A or B did not come up"
  show_logs_and_stop
fi
# The upgrades start once the transfer runs: the pingpong's sides have exchanged their
# addresses; perftest's client has printed its result header.
started='^ *remote address:' on=(A B)
[ "$tool" = pingpong ] || started='#bytes +#iterations' on=(A)
for g in "${on[@]}"; do
  if ! wait_lines "$dir/$g.console" "$started" 1 "${launch_guests[$g]}"; then
    failed "$tool_name did not start on $g"
    show_logs_and_stop
  fi
done
ok "$tool_name runs (A the client, B the server)"
# Seen running at (the upgrades' times are given from there).
t_tool=$(guest_now)
# perftest counts from 3 s after its start (-f 3): the upgrades begin 4 s after its header was
# seen (shown up to a second late), inside the measured window.
_past_margin() { awk -v e="$(guest_elapsed "$t_tool" "$(guest_now)")" 'BEGIN { exit !(e >= 4) }'; }
[[ "$tool" != *_bw ]] || wait_until "${launch_guests[A]}" "$dir/A.console" _past_margin || true

# ctl_vms: the management socket's `vms` (JSON), from the serving binary.
ctl_vms() { "$DAEMON_NEW" ctl -s "$dir/mgmt.sock" --json vms; }
# vm_objects: per VM "name connected qp cq mr pd", one a line, read fresh: a VM whose state
# lock was busy (its driver posting) comes with its last counters, stale (or zeros), and is
# asked again.
_fresh_objects() {
  objects=$(ctl_vms | python3 -c 'import json, sys
stale = False
for v in json.load(sys.stdin).get("vms", []):
    r = v.get("resources") or {}
    print(v.get("name"), v.get("connected"), *(r.get(k) for k in ("qp", "cq", "mr", "pd")))
    stale = stale or v.get("stale_ms") is not None
sys.exit(1 if stale else 0)')
}
vm_objects() {
  objects=''
  wait_until "$cur_pid" "$dir/B.console" _fresh_objects || true
  echo "$objects"
}
before=$(vm_objects)
# recv_ops: the messages delivered to B's QPs, as the serving daemon counts them.
recv_ops() {
  "$DAEMON_NEW" ctl -s "$dir/mgmt.sock" --json stats vmb |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["traffic"]["recv_ops"])'
}
_grown() { [ "$(recv_ops || echo 0)" -gt "$1" ]; }
# flows WHEN: B's count of messages received grows on the daemon serving now: the traffic goes
# through it.
flows() {
  local n0
  n0=$(recv_ops || echo 0)
  if wait_until "$cur_pid" "$dir/B.console" _grown "$n0"; then
    ok "$1: the traffic goes through the daemon serving now (B's messages received: $n0 -> $(recv_ops))"
  else
    failed "$1: B receives nothing (the count stays at $n0)"
  fi
}
flows "before the upgrades"

# not_alive PID: PID, a child, has ended.
not_alive() { ! launch_alive "$1"; }

# 1. A successor that cannot take over: it says why and exits, the running daemon serves on.
DAEMON=$DAEMON_NEW launch_daemon --log "$dir/daemon-wrong.log" --config "$dir/wrong.toml" \
  --take-over
wrong=$launch_pid st=0
if ! wait_until '' "$dir/daemon-wrong.log" not_alive "$wrong"; then
  failed "the successor without VM B did not exit (its log stalled); stopped"
  kill -TERM "$wrong" 2>/dev/null || true
fi
launch_wait "$wrong" || st=$?
if [ "$st" != 0 ]; then
  ok "a successor configured without VM B exits with status $st:" \
    "$(grep -m1 -o 'the running daemon serves more VMs.*' "$dir/daemon-wrong.log" || tail -n 1 "$dir/daemon-wrong.log")"
else
  failed "the successor without VM B exited with status 0"
fi
if wait_lines "$cur_log" 'hand-over refused, serving on' 1 "$cur_pid" &&
  launch_alive "$cur_pid"; then
  ok "the running daemon refused the hand-over and serves on:" \
    "$(grep -m1 -o 'hand-over refused.*' "$cur_log")"
else
  failed "the running daemon: no refusal logged, or it died"
  show_logs_and_stop
fi
flows "after the refused hand-over"

# upgrade N: the daemon serving now is upgraded to a new process of $DAEMON_NEW, logging into
# $dir/daemon-N.log: the old one must exit 0 having handed both VMs over, the new one must log
# that it took both over (its blackout printed). Sets cur_pid and cur_log to the new one's.
blackouts=()
upgrade() {
  local log=$dir/daemon-$1.log new st=0 ms
  DAEMON=$DAEMON_NEW launch_daemon --log "$log" --config "$dir/config.toml" --take-over
  new=$launch_pid
  # Until the old daemon ends (the successor failing ends the wait too).
  wait_until "$new" "$log" not_alive "$cur_pid" || true
  if launch_alive "$cur_pid"; then
    failed "upgrade $1: the old daemon still serves" \
      "(the successor $(launch_alive "$new" && echo runs || echo exited))"
    show_logs_and_stop
  fi
  launch_wait "$cur_pid" || st=$?
  if [ "$st" = 0 ] && grep -q 'handed 2 VMs (2 connected) over to the successor' "$cur_log"; then
    ok "upgrade $1: the old daemon handed both VMs over and exited with status 0"
  else
    failed "upgrade $1: the old daemon exited with status $st" \
      "$(grep -c 'handed 2 VMs (2 connected)' "$cur_log") hand-over lines"
  fi
  if wait_lines "$log" 'took over 2 VMs \(2 connected\)' 1 "$new"; then
    ok "upgrade $1: $(grep -m1 -o 'took over 2 VMs.*' "$log")"
    ms=$(sed -n 's/.*took over 2 VMs (2 connected) from .* in \([0-9]*\) ms.*/\1/p' "$log" | head -n 1)
    echo "   UPGRADE-BLACKOUT: ${ms:-?} ms (upgrade $1, $tool_name;" \
      "$(guest_elapsed "$t_tool" "$(guest_now)") s after the tool was seen running)"
    blackouts+=("${ms:-?}")
  else
    failed "upgrade $1: the successor did not log that it took both VMs over"
    show_logs_and_stop
  fi
  cur_pid=$new cur_log=$log
}
# upgrade_by_signal N: the daemon serving now gets SIGUSR2 and starts its successor itself (the
# binary at its own path, --take-over), whose log goes to the same file: the old one must exit 0
# having handed both VMs over, the new one (not a child of this shell: stopped at the end) must
# log that it took both over. Sets cur_pid to the new one's.
upgrade_by_signal() {
  local st=0 new ms took
  took=$(grep -c 'took over 2 VMs (2 connected)' "$cur_log" || true)
  kill -USR2 "$cur_pid"
  if ! wait_lines "$cur_log" 'started the successor, pid [0-9]+' 1 "$cur_pid"; then
    failed "upgrade $1 (SIGUSR2): the daemon started no successor"
    show_logs_and_stop
  fi
  new=$(sed -n 's/.*started the successor, pid \([0-9]*\):.*/\1/p' "$cur_log" | tail -n 1)
  launch_on_exit "kill -TERM $new 2>/dev/null || true"
  wait_until "$new" "$cur_log" not_alive "$cur_pid" || true
  if launch_alive "$cur_pid"; then
    failed "upgrade $1 (SIGUSR2): the old daemon still serves"
    show_logs_and_stop
  fi
  launch_wait "$cur_pid" || st=$?
  if [ "$st" = 0 ] && grep -q 'handed 2 VMs (2 connected) over to the successor' "$cur_log"; then
    ok "upgrade $1 (SIGUSR2): the old daemon started its successor, pid $new, handed both VMs" \
      "over and exited with status 0"
  else
    failed "upgrade $1 (SIGUSR2): the old daemon exited with status $st"
  fi
  if wait_lines "$cur_log" 'took over 2 VMs \(2 connected\)' $((took + 1)) "$new"; then
    ok "upgrade $1 (SIGUSR2): $(grep -o 'took over 2 VMs.*' "$cur_log" | tail -n 1)"
    ms=$(sed -n 's/.*took over 2 VMs (2 connected) from .* in \([0-9]*\) ms.*/\1/p' "$cur_log" |
      tail -n 1)
    echo "   UPGRADE-BLACKOUT: ${ms:-?} ms (upgrade $1 by SIGUSR2, $tool_name;" \
      "$(guest_elapsed "$t_tool" "$(guest_now)") s after the tool was seen running)"
    blackouts+=("${ms:-?}")
  else
    failed "upgrade $1 (SIGUSR2): the successor did not log that it took both VMs over"
    show_logs_and_stop
  fi
  cur_pid=$new
}
# 2. and 3.
upgrade 1
flows "after upgrade 1"
upgrade_by_signal 2
flows "after upgrade 2"

# 4. The tool was still running (no result row yet on either side), and the management socket
# answers from the last daemon.
if ! cat "$dir/A.console" "$dir/B.console" | tr -d '\r' | grep -qE "$row"; then
  ok "$tool_name still runs after both upgrades"
else
  failed "$tool_name ended before the second upgrade: the upgrades did not happen under traffic"
fi
after=$(vm_objects)
echo "   ctl vms (name connected qp cq mr pd): before the upgrades: ${before//$'\n'/, }; after:" \
  "${after//$'\n'/, }"
if [ "$(grep -c ' True ' <<<"$after")" = 2 ] && [ "$after" = "$before" ]; then
  ok "ctl vms on the management socket after the upgrades: both VMs connected, the same objects"
else
  failed "ctl vms after the upgrades: '$after', before: '$before'"
fi
"$DAEMON_NEW" ctl -s "$dir/mgmt.sock" vms | sed 's/^/   /' || true

# The tool's end: each guest's command ends (its kernel log last).
for g in A B; do
  wait_lines "$dir/$g.console" '^KERNEL-WARNINGS:' 1 "${launch_guests[$g]}" || true
done
launch_wait_guests A B
if [ "${rcs[0]}" = 0 ] && [ "${rcs[1]}" = 0 ]; then
  ok "A and B ended their commands with 0"
else
  failed "exit codes: A ${rcs[0]}, B ${rcs[1]}"
fi
for g in A B; do
  check_after "$label" "$tool_name across the upgrades ($g)" "$row" "$g"
  if grep -q "^STEP $label exit 0" <(tr -d '\r' <"$dir/$g.console"); then
    ok "$g: $tool_name exited with 0"
  else
    failed "$g: $tool_name: $(tr -d '\r' <"$dir/$g.console" | grep -m1 "^STEP $label exit" || echo 'no exit')"
  fi
  kernel_clean "$g"
done
# (Not a child of this shell: it was started by the daemon before it.)
if kill -0 "$cur_pid" 2>/dev/null; then ok "the last daemon serves on"; else failed "the last daemon died"; fi
echo "   UPGRADE: $tool_name; blackouts ${blackouts[*]} ms;" \
  "A's row: $(after "$label" "$row" A)"

[ "$fail" = 0 ] || show_logs
echo "== $name: whole run $(($(date +%s) - t_start)) s"
verdict "$name"
