# shellcheck shell=bash
# What the scripts that start the daemon and QEMU guests share (scripts/qemu-*.sh,
# scripts/demo.sh): the work directory, launching the daemon and guests, waiting on their
# progress, one cleanup for everything they started, and the count of passed and failed checks.
# Source it; it sources guest/lib.sh (package installation, guest_script_args, guest_now, ...).
#
# Cleanup: every process a script starts is registered (launch_daemon, launch_guest and
# launch_bg do it; launch_register for others). On exit, whatever the cause (the end, a
# failure under set -e, SIGINT, SIGTERM, SIGHUP), exactly those processes still running are
# sent SIGTERM, those still there after $LAUNCH_GRACE s (default 15) SIGKILL, and all of them
# are reaped; then the commands of launch_on_exit run and the work directory is removed
# (kept, and named, with keep=1: the scripts' --keep). The script keeps its exit status
# (130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP).
#
# Waits are on progress, never on the clock alone: they end when what they wait for is there,
# fail when the process that should bring it is gone, and give up only once the log they watch
# has not grown for $LAUNCH_STALL s (default 300: a stall, not a time limit).

LAUNCH_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=guest/lib.sh
. "$LAUNCH_REPO/guest/lib.sh"

LAUNCH_STALL=${LAUNCH_STALL:-300}
LAUNCH_GRACE=${LAUNCH_GRACE:-15}
# The daemon's binary (where the scripts' `cargo build --release` puts it).
DAEMON=${DAEMON:-${CARGO_TARGET_DIR:-$LAUNCH_REPO/target}/release/vhost-user-rdma}

_launch_pids=() _launch_pidfiles=() _launch_dirs=() _launch_cmds=()
# launch_pid: the process the last launch_* started. launch_guests[NAME]: guest NAME's.
launch_pid=''
declare -gA launch_guests=()

# --- the cleanup registry -------------------------------------------------------------------

# launch_register PID...: background children of this shell, stopped on exit.
launch_register() { _launch_pids+=("$@"); }

# launch_register_pidfile FILE: the process whose PID FILE holds (a QEMU's -pidfile), stopped on
# exit if its command line names FILE (so never a process that took the PID over).
launch_register_pidfile() { _launch_pidfiles+=("$1"); }

# launch_on_exit CMD: CMD (a string, eval'd) runs on exit, after the processes are stopped.
launch_on_exit() { _launch_cmds+=("$1"); }

# launch_forget PID: PID has been waited for (its number may be reused): no longer stopped.
launch_forget() {
  local p keep_pids=()
  for p in "${_launch_pids[@]}"; do
    [ "$p" = "$1" ] || keep_pids+=("$p")
  done
  _launch_pids=("${keep_pids[@]}")
}

# launch_wait PID: waits for registered PID and forgets it; returns its exit status.
launch_wait() {
  local r=0
  wait "$1" || r=$?
  launch_forget "$1"
  return "$r"
}

# launch_bg CMD...: runs CMD in the background, registered; sets launch_pid. CMD reads the
# caller's standard input (redirect it: launch_bg CMD </dev/null), not /dev/null as a plain
# `CMD &` in a script would.
launch_bg() {
  "$@" <&0 &
  launch_pid=$!
  _launch_pids+=("$launch_pid")
}

# launch_alive PID: true while PID, a child of this shell, has not ended (a child that ended and
# has not been waited for yet does not count).
launch_alive() { _launch_child_alive "$1"; }

# True if PID is a child of this shell that has not ended.
_launch_child_alive() {
  local st state ppid
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  read -r state ppid _ <<<"$st"
  [ "${state:-Z}" != Z ] && [ "${ppid:-}" = "$$" ]
}

# The PID in pidfile $1 if that process is running and names the file on its command line.
_launch_pidfile_pid() {
  local p
  p=$(cat "$1" 2>/dev/null) || return 1
  [[ "$p" =~ ^[0-9]+$ ]] || return 1
  { tr '\0' '\n' <"/proc/$p/cmdline"; } 2>/dev/null | grep -xF -- "$1" >/dev/null || return 1
  echo "$p"
}

# The registered processes still running.
_launch_running() {
  local p f
  for p in "${_launch_pids[@]}"; do
    if _launch_child_alive "$p"; then echo "$p"; fi
  done
  for f in "${_launch_pidfiles[@]}"; do
    _launch_pidfile_pid "$f" || true
  done
}

# launch_stop: stops every registered process (SIGTERM; SIGKILL after $LAUNCH_GRACE s) and
# reaps them.
launch_stop() {
  local left i=0 p
  left=$(_launch_running)
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086 # one PID a word
    kill -TERM $left 2>/dev/null || true
    while [ -n "$left" ] && [ "$i" -lt $((LAUNCH_GRACE * 10)) ]; do
      sleep 0.1
      i=$((i + 1))
      left=$(_launch_running)
    done
    if [ -n "$left" ]; then
      guest_log "still running after SIGTERM and $LAUNCH_GRACE s: ${left//$'\n'/ }; SIGKILL"
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
    fi
  fi
  for p in "${_launch_pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  _launch_pids=() _launch_pidfiles=()
}

_launch_exit() {
  local rc=$? c d
  set +e
  trap '' INT TERM HUP
  launch_stop
  for c in "${_launch_cmds[@]}"; do
    eval "$c"
  done
  for d in "${_launch_dirs[@]}"; do
    if [ "${keep:-0}" = 1 ]; then echo "logs kept in $d"; else rm -rf "$d"; fi
  done
  exit "$rc"
}
trap _launch_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# launch_workdir NAME: sets dir to a new directory /tmp/vhost-user-rdma-NAME.XXXXXX, where the
# logs, sockets and consoles go; removed on exit unless keep=1.
launch_workdir() {
  dir=$(mktemp -d "/tmp/vhost-user-rdma-$1.XXXXXX")
  _launch_dirs+=("$dir")
}

# launch_need_qemu: sets and exports QEMU: $QEMU if set, else the patched QEMU of
# scripts/build-qemu.sh (built and cached on first use).
launch_need_qemu() {
  [ -n "${QEMU:-}" ] || QEMU=$(bash "$LAUNCH_REPO/scripts/build-qemu.sh" | tail -n 1)
  export QEMU
}

# --- launching ------------------------------------------------------------------------------

# launch_daemon [--log FILE] [--wait PATH]... ARGS...: starts $DAEMON ARGS (RUST_LOG info
# unless set) in the background, registered, its output into FILE (default $dir/daemon.log);
# sets launch_pid. Returns once every PATH (its VM and management sockets) is a socket; exits
# the script, showing the log, if the daemon ends first or its log stalls.
launch_daemon() {
  local log="$dir/daemon.log" paths=()
  while [ $# -gt 0 ]; do
    case "$1" in
    --log) log=$2; shift 2 ;;
    --wait) paths+=("$2"); shift 2 ;;
    *) break ;;
    esac
  done
  RUST_LOG=${RUST_LOG:-info} "$DAEMON" "$@" >"$log" 2>&1 &
  launch_pid=$!
  _launch_pids+=("$launch_pid")
  if ! wait_until "$launch_pid" "$log" _launch_sockets "${paths[@]}"; then
    guest_log "error: the daemon (pid $launch_pid, $DAEMON $*) did not create ${paths[*]}" \
      "($(kill -0 "$launch_pid" 2>/dev/null && echo "its log stalled" || echo "it exited")); its log:"
    sed 's/^/  /' "$log" >&2
    exit 1
  fi
}
_launch_sockets() {
  local p
  for p in "$@"; do
    [ -S "$p" ] || return 1
  done
}

# launch_guest NAME [RUN-GUEST OPTIONS...] [-- QEMU ARGS...]: boots a guest with
# scripts/run-guest.sh -q in the background, registered: its console in $dir/NAME.console,
# run-guest's output in $dir/NAME.out, QEMU's PID in $dir/NAME.pid (registered too: QEMU is
# stopped even if run-guest.sh could not stop it). Sets launch_pid and launch_guests[NAME].
launch_guest() {
  local name=$1 opts=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    opts+=("$1")
    shift
  done
  [ $# -eq 0 ] || shift
  bash "$LAUNCH_REPO/scripts/run-guest.sh" --log "$dir/$name.console" -q "${opts[@]}" -- "$@" \
    -pidfile "$dir/$name.pid" >"$dir/$name.out" 2>&1 &
  launch_pid=$!
  _launch_pids+=("$launch_pid")
  _launch_pidfiles+=("$dir/$name.pid")
  # shellcheck disable=SC2034 # read by the scripts
  launch_guests[$name]=$launch_pid
}

# launch_dgram_ports: sets port0 and port1 to two free UDP ports on the loopback, for a pair of
# guests joined by -netdev dgram (each sends to the other's port).
launch_dgram_ports() {
  # shellcheck disable=SC2034 # read by the scripts
  read -r port0 port1 < <(python3 -c 'import socket
s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
}

# --- waiting --------------------------------------------------------------------------------

# launch_wait_guests NAME...: waits for each guest NAME (launch_guest) to end; sets rcs to their
# exit statuses, in order.
launch_wait_guests() {
  local g r
  rcs=()
  for g in "$@"; do
    r=0
    launch_wait "${launch_guests[$g]}" || r=$?
    rcs+=("$r")
  done
}

# wait_until PID FILE CMD...: runs CMD every 0.1 s until it succeeds. Fails once PID (if not
# empty) is gone (CMD is tried a last time then) or FILE has not grown for $LAUNCH_STALL s.
wait_until() {
  local pid=$1 file=$2 size=-1 now since=$SECONDS
  shift 2
  while :; do
    "$@" && return 0
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      "$@"
      return
    fi
    now=$(stat -c %s "$file" 2>/dev/null || echo 0)
    if [ "$now" != "$size" ]; then
      size=$now since=$SECONDS
    elif [ $((SECONDS - since)) -ge "$LAUNCH_STALL" ]; then
      return 1
    fi
    sleep 0.1
  done
}

# wait_lines FILE REGEX [N [PID]]: until FILE (a console: carriage returns ignored) has at
# least N (default 1) lines matching REGEX (grep -E), while PID lives; see wait_until.
wait_lines() {
  wait_until "${4:-}" "$1" _launch_has_lines "$1" "$2" "${3:-1}"
}
_launch_has_lines() {
  [ -e "$1" ] && [ "$(tr -d '\r' <"$1" | grep -cE -- "$2")" -ge "$3" ]
}

# wait_socket PATH [PID]: until PATH is a socket (a QEMU's chardev server), while PID lives.
wait_socket() {
  wait_until "${2:-}" "$1" _launch_sockets "$1"
}

# --- results --------------------------------------------------------------------------------

# ok MESSAGE / failed MESSAGE: one check's verdict, printed ("   ok: ...", "   FAILED: ...") and
# counted in pass and fail. tally ok|failed: counts one the caller has printed itself.
pass=0 fail=0
ok() {
  echo "   ok: $*"
  pass=$((pass + 1))
}
failed() {
  echo "   FAILED: $*"
  fail=$((fail + 1))
}
tally() {
  case "$1" in
  ok) pass=$((pass + 1)) ;;
  failed) fail=$((fail + 1)) ;;
  *) guest_die "tally: ok or failed, not $1" ;;
  esac
}

# kernel_clean GUEST: one check: GUEST's console ($dir/GUEST.console) has the kernel log's verdict
# "KERNEL-WARNINGS: 0" (guest/checks.sh's klog prints it).
kernel_clean() {
  if grep -q '^KERNEL-WARNINGS: 0' "$dir/$1.console"; then
    ok "$1: no kernel warnings"
  else
    failed "$1: kernel warnings (or no kernel log)"
  fi
}

# verdict [NAME]: prints "NAME: N passed, M failed" (scripts/test.sh adds these up); fails if
# any check failed.
verdict() {
  echo "${1:+$1: }$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

# show_log TITLE FILE: FILE under a "----- TITLE" line, indented (the logs shown on failure).
show_log() {
  echo "----- $1"
  sed 's/^/  /' "$2"
}
