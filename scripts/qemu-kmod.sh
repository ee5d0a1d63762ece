#!/usr/bin/env bash
# The Linux guest driver in a real guest: builds virtio_rdma.ko (scripts/build-kmod.sh) for the
# test guest's kernel, boots one QEMU guest with our vhost-user-rdma-pci device on a running
# daemon, loads the module through the kernel's own virtio_pci, and checks that it bound the
# device: ABI version accepted, control queue answering (QUERY_DEVICE, QUERY_PORT), the paired
# MAC from the daemon's configuration. Prints "qemu-kmod: N passed, M failed".
#
# Usage: bash scripts/qemu-kmod.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[ "${1:-}" = --keep ] && keep=1

[ -n "${QEMU:-}" ] || QEMU=$(bash scripts/build-qemu.sh | tail -n 1)
export QEMU
cargo build --release --locked -q -p vhost-user-rdma
kmod=$(bash scripts/build-kmod.sh)
echo "== qemu-kmod: $kmod"
echo "   $(modinfo -F vermagic "$kmod" 2>/dev/null || strings "$kmod" | grep -m1 '^vermagic=')"
bash scripts/build-guest.sh --name rdma-kmod --load virtio_pci \
  --file "$kmod:/lib/virtio_rdma.ko" >/dev/null

dir=$(mktemp -d /tmp/vhost-user-rdma-kmod.XXXXXX)
daemon_pid=""
cleanup() {
  local rc=$?
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && { wait "$daemon_pid" 2>/dev/null || true; }
  if [ "$keep" = 1 ]; then echo "logs kept in $dir"; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT

mac=52:54:00:12:34:56
printf '[[tenant]]\nname = "t"\n\n[[vm]]\nname = "vm0"\nsocket = "%s"\ntenant = "t"\nmac = "%s"\n' "$dir/vm0.sock" "$mac" >"$dir/config.toml"
RUST_LOG=${RUST_LOG:-info} target/release/vhost-user-rdma --config "$dir/config.toml" 2>"$dir/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$dir/vm0.sock" ] && break; sleep 0.05; done

pass=0 fail=0
check() {
  if grep -q -- "$2" "$dir/guest.console"; then
    echo "   ok: $1"
    pass=$((pass + 1))
  else
    echo "   FAILED: $1 (no '$2' on the console)"
    fail=$((fail + 1))
  fi
}
t=$(date +%s)
rc=0
bash scripts/run-guest.sh --image rdma-kmod --timeout 300 --log "$dir/guest.console" -q \
  --append 'guest.uio=none' \
  --cmd 'insmod /lib/virtio_rdma.ko && sleep 1 && dmesg | grep -i virtio' -- \
  -chardev "socket,id=rdma,path=$dir/vm0.sock" -device vhost-user-rdma-pci,chardev=rdma \
  >"$dir/guest.out" 2>&1 || rc=$?
echo "== qemu-kmod: guest ran $(($(date +%s) - t)) s, exit $rc"
[ "$rc" = 0 ] && { echo "   ok: insmod and the guest command succeeded"; pass=$((pass + 1)); } ||
  { echo "   FAILED: guest exit $rc"; fail=$((fail + 1)); }
check "the driver bound device ID 42 with ABI version 2" "virtio-rdma ABI 2:"
check "QUERY_PORT: the port is active" "port active"
check "the paired MAC came from the daemon's configuration" "paired MAC $mac"
if [ "$fail" != 0 ]; then
  echo "----- guest console"
  sed 's/^/  /' "$dir/guest.console"
  echo "----- daemon log"
  sed 's/^/  /' "$dir/daemon.log"
fi
echo "qemu-kmod: $pass passed, $fail failed"
[ "$fail" = 0 ]
