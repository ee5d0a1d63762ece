# Shared by the QEMU scripts that run RDMA tools in two guests (scripts/qemu-pingpong.sh,
# scripts/qemu-rxe.sh). Sourced on the host, after scripts/lib/launch.sh (its ok and failed
# count the checks, its $dir holds the consoles); guest_tools prints what the guests' commands
# source first.
# shellcheck shell=bash

# guest_tools DEVICE: the guest-side helpers, for RDMA device DEVICE.
# step LABEL CMD...: prints LABEL on a line of its own, runs CMD (a command or a function), its
# output after the label, and prints "STEP LABEL exit N". A step that prints nothing for $STALL
# seconds (default 120) is stopped, with its children, and exits 124: a step waiting for a peer
# whose own step failed ends instead of holding up the rest. A step never fails the script:
# each is judged on its own, and the next one runs whatever this one did ($steps_failed lists
# the labels of those that failed).
# run LABEL TOOL ARGS...: a step running TOOL (line-buffered) on DEVICE (with the server's address $peer on the
# client); the client tries again while the server's tool is not listening yet (the tools do
# not retry).
# klog: the kernel's warnings (the console shows only its errors) and how many there are.
guest_tools() {
  cat <<EOF2
steps_failed=
# kill_tree PID: PID and its descendants (busybox has no pgrep: their parents from /proc).
kill_tree() {
  local c
  for c in \$(awk -v p="\$1" '\$4 == p { print \$1 }' /proc/[0-9]*/stat 2>/dev/null); do kill_tree "\$c"; done
  kill "\$1" 2>/dev/null
}
# step_watch PID: while PID runs, once a second, shows the step's new output (the host's
# watchdog sees progress) and stops PID with its children once it has printed nothing for
# \$STALL seconds. What it has shown goes to /tmp/step.shown.
step_watch() {
  local shown=0 idle=0 now
  while kill -0 "\$1" 2>/dev/null; do
    sleep 1
    now=\$(wc -c </tmp/step.out)
    if [ "\$now" -gt "\$shown" ]; then
      tail -c +\$((shown + 1)) /tmp/step.out | head -c \$((now - shown))
      shown=\$now idle=0
      echo \$shown >/tmp/step.shown
    else
      idle=\$((idle + 1))
    fi
    if [ \$idle -ge \${STALL:-120} ]; then
      echo stalled >/tmp/step.stalled
      echo "STEP: no output for \${STALL:-120} s, stopped"
      kill_tree "\$1"
      return
    fi
  done
}
step() {
  local label=\$1 pid watch r shown
  shift
  echo "\$label"
  # A developer's run of some steps only (STEPS_ONLY, space-separated labels).
  if [ -n "\${STEPS_ONLY:-}" ] && ! echo " \$STEPS_ONLY " | grep -q " \$label "; then
    echo "STEP \$label skipped"
    return 0
  fi
  # Emptied here, not by the command's redirection: that happens in the child, after the
  # watcher may have looked at the last step's output.
  : >/tmp/step.out
  echo 0 >/tmp/step.shown
  rm -f /tmp/step.stalled
  "\$@" >>/tmp/step.out 2>&1 &
  pid=\$!
  step_watch \$pid &
  watch=\$!
  wait \$pid
  r=\$?
  kill \$watch 2>/dev/null
  wait \$watch 2>/dev/null
  shown=\$(cat /tmp/step.shown)
  tail -c +\$((shown + 1)) /tmp/step.out
  [ ! -f /tmp/step.stalled ] || r=124
  echo "STEP \$label exit \$r"
  [ \$r = 0 ] || steps_failed="\$steps_failed \$label"
  return 0
}
# The C tools' stdout goes to a file in a step: line-buffered through coreutils' libstdbuf
# (the images carry it as /lib/libstdbuf.so), so that their progress shows as it happens.
linebuf() {
  if [ -f /lib/libstdbuf.so ]; then
    LD_PRELOAD=/lib/libstdbuf.so _STDBUF_O=L "\$@"
  else
    "\$@"
  fi
}
connect() {
  local i=0
  until linebuf "\$@" -d $1 \$peer 2>/tmp/err; do
    grep -q "Couldn't connect to" /tmp/err && [ \$i -lt 150 ] || { cat /tmp/err; return 1; }
    i=\$((i + 1))
    sleep 0.2
  done
  cat /tmp/err
}
run() {
  local label=\$1
  shift
  step "\$label" connect "\$@"
}
# steps_verdict: one line naming the failed steps; fails if there are any.
steps_verdict() {
  if [ -z "\$steps_failed" ]; then echo "STEPS: all passed"; else echo "STEPS-FAILED:\$steps_failed"; return 1; fi
}
klog() {
  dmesg | grep -E 'WARNING:|BUG:|Oops|Call Trace' >/tmp/klog
  echo "KERNEL-WARNINGS: \$(wc -l </tmp/klog)"
  cat /tmp/klog
}
EOF2
}

# For build-guest.sh --file: coreutils' libstdbuf.so, which `linebuf` (above) preloads.
# shellcheck disable=SC2034 # used by the scripts that source this file
GUEST_STDBUF_FILE=/usr/libexec/coreutils/libstdbuf.so:/lib/libstdbuf.so

# guest_check_unit ROOT NAME DESCRIPTION PROGRAM [DIRECTIVE...]: a oneshot systemd service NAME
# in the tree ROOT, enabled in multi-user.target, that runs PROGRAM with its output on the serial
# console (a systemd guest's checks: scripts/qemu-package.sh, scripts/qemu-dkms.sh); DIRECTIVEs
# are more lines of its [Service] section.
guest_check_unit() {
  local root=$1 name=$2 desc=$3 program=$4
  shift 4
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  {
    printf '[Unit]\nDescription=%s\nAfter=basic.target\n\n[Service]\nType=oneshot\n' "$desc"
    printf 'ExecStart=%s\nStandardOutput=tty\nStandardError=tty\nTTYPath=/dev/ttyS0\n' "$program"
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; fi
  } >"$root/etc/systemd/system/$name.service"
  ln -s "../$name.service" "$root/etc/systemd/system/multi-user.target.wants/"
}

# check_steps CONSOLE LABEL...: the verdict of each step LABEL of guest_tools' `step` on the
# console file CONSOLE, in order: ok for "STEP LABEL exit 0", failed with the step's exit line
# (or "not run") otherwise.
check_steps() {
  local console=$1 l line
  shift
  for l in "$@"; do
    line=$(tr -d '\r' <"$console" | grep -F -x -m1 -e "STEP $l exit 0" || true)
    if [ -n "$line" ]; then
      ok "$l"
    else
      failed "$l: $(tr -d '\r' <"$console" | grep -F -m1 -e "STEP $l exit" || echo 'not run')"
    fi
  done
}

# after MARKER PATTERN GUEST: the first line matching PATTERN after the line MARKER on the
# console of GUEST ($dir/GUEST.console).
after() {
  # shellcheck disable=SC2154 # dir: scripts/lib/launch.sh's launch_workdir
  awk -v m="$1" -v p="$2" '$0 == m || $0 == m "\r" { f = 1; next } f && $0 ~ p { print; exit }' \
    "$dir/$3.console" 2>/dev/null | tr -d '\r'
}
# check_after MARKER DESCRIPTION PATTERN GUEST: PATTERN on a line after the line MARKER.
check_after() {
  local line
  line=$(after "$1" "$3" "$4")
  if [ -n "$line" ]; then ok "$2: $line"; else failed "$2 (no '$3' after '$1' on the $4 console)"; fi
}
