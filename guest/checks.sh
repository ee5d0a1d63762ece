# Shared by the QEMU scripts that run RDMA tools in two guests (scripts/qemu-pingpong.sh,
# scripts/qemu-rxe.sh). Sourced on the host; guest_tools prints what the guests' commands
# source first.
# shellcheck shell=bash

# guest_tools DEVICE: the guest-side helpers, for RDMA device DEVICE. run LABEL TOOL ARGS...:
# prints LABEL on a line of its own, then runs TOOL on DEVICE (with the server's address $peer
# on the client), its standard output straight to the console and its errors after it; the
# client tries again while the server's tool is not listening yet (the tools do not retry).
# klog: the kernel's warnings (the console shows only its errors) and how many there are.
guest_tools() {
  cat <<EOF2
run() {
  echo "\$1"
  shift
  local i=0
  until "\$@" -d $1 \$peer 2>/tmp/err; do
    grep -q "Couldn't connect to" /tmp/err && [ \$i -lt 150 ] || { cat /tmp/err; return 1; }
    i=\$((i + 1))
    sleep 0.2
  done
  cat /tmp/err
}
klog() {
  dmesg | grep -E 'WARNING:|BUG:|Oops|Call Trace' >/tmp/klog
  echo "KERNEL-WARNINGS: \$(wc -l </tmp/klog)"
  cat /tmp/klog
}
EOF2
}

pass=0 fail=0
ok() {
  echo "   ok: $*"
  pass=$((pass + 1))
}
failed() {
  echo "   FAILED: $*"
  fail=$((fail + 1))
}
# after MARKER PATTERN GUEST: the first line matching PATTERN after the line MARKER on the
# console of GUEST ($dir/GUEST.console).
after() {
  awk -v m="$1" -v p="$2" '$0 == m || $0 == m "\r" { f = 1; next } f && $0 ~ p { print; exit }' \
    "$dir/$3.console" 2>/dev/null | tr -d '\r'
}
# check_after MARKER DESCRIPTION PATTERN GUEST: PATTERN on a line after the line MARKER.
check_after() {
  local line
  line=$(after "$1" "$3" "$4")
  if [ -n "$line" ]; then ok "$2: $line"; else failed "$2 (no '$3' after '$1' on the $4 console)"; fi
}
