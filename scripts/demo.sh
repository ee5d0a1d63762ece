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
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh

if [ "${1:-}" = "--qemu" ]; then
  bash scripts/setup.sh
  exec bash scripts/qemu-e2e.sh --demo
fi

bash scripts/setup.sh
echo "== building (release)"
cargo build --release --locked -p vhost-user-rdma -p vhost-user-rdma-tests --bins

launch_workdir demo
echo "== starting the daemon: one process, one socket per VM"
launch_daemon --wait "$dir/vm0.sock" --wait "$dir/vm1.sock" --wait "$dir/mgmt.sock" \
  --socket-path "$dir/vm0.sock" --socket-path "$dir/vm1.sock" --mgmt-socket "$dir/mgmt.sock"
daemon_pid=$launch_pid

echo "== two VMs (test VMM: in-process vhost-user frontends with memfd guest RAM)"
target/release/rdma-demo --socket "$dir/vm0.sock" --socket "$dir/vm1.sock"

# Every VMM connection's goodbye in the daemon's log, so that the view below shows the VMs gone.
all_gone() {
  [ "$(grep -c 'VMM connected' "$dir/daemon.log")" = "$(grep -c 'VMM disconnected' "$dir/daemon.log")" ]
}
wait_until "$daemon_pid" "$dir/daemon.log" all_gone || true
echo "== the operator's view: vhost-user-rdma ctl (management socket)"
target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" vms | sed 's/^/  /'
target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" stats vm1 | sed 's/^/  /'

echo "== daemon log"
sed 's/^/  /' "$dir/daemon.log"
