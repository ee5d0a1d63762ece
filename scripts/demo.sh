#!/usr/bin/env bash
# The main job: start the vhost-user-rdma daemon (built-in software RNIC)
# serving two VMs, and drive both VMs' RDMA devices through the test VMM.
# With --qemu the two VMs are real QEMU guests (patched QEMU built and cached
# on first use, Debian kernel + busybox initramfs) running the reference
# driver over virtio-pci.
#
# Usage: bash scripts/demo.sh [--qemu]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--qemu" ]; then
  bash scripts/setup.sh
  exec bash scripts/qemu-e2e.sh --demo
fi

bash scripts/setup.sh
echo "== building (release)"
cargo build --release --locked -p vhost-user-rdma -p vhost-user-rdma-tests --bins

dir=$(mktemp -d /tmp/vhost-user-rdma-demo.XXXXXX)
daemon_pid=""
cleanup() {
  # Keep the script's own exit status: a failing command in here (under
  # set -e) would otherwise replace it.
  local rc=$?
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && { wait "$daemon_pid" 2>/dev/null || true; }
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT

echo "== starting the daemon: one process, one socket per VM"
RUST_LOG=${RUST_LOG:-info} target/release/vhost-user-rdma \
  --socket-path "$dir/vm0.sock" --socket-path "$dir/vm1.sock" \
  --mgmt-socket "$dir/mgmt.sock" 2> "$dir/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$dir/vm0.sock" ] && [ -S "$dir/vm1.sock" ] && break
  sleep 0.05
done

echo "== two VMs (test VMM: in-process vhost-user frontends with memfd guest RAM)"
target/release/rdma-demo --socket "$dir/vm0.sock" --socket "$dir/vm1.sock"

sleep 0.2
echo "== the operator's view: vhost-user-rdma ctl (management socket)"
target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" vms | sed 's/^/  /'
target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" stats vm1 | sed 's/^/  /'

echo "== daemon log"
sed 's/^/  /' "$dir/daemon.log"
