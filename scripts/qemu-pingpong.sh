#!/usr/bin/env bash
# Unmodified rdma-core tools between two QEMU guests on one daemon: each guest loads virtio_rdma.ko
# (scripts/build-kmod.sh) and the provider set (scripts/build-rdma-core.sh), the guests are
# networked with -netdev stream for the tools' TCP exchange, and their IP addresses are their
# device GIDs (::ffff:10.42.0.1 and .2, the daemon's defaults), so GID index 1 is usable
# (spec appendix A). Runs ibv_rc_pingpong (polling and -e), ibv_ud_pingpong and ibv_srq_pingpong.
# Prints "qemu-pingpong: N passed, M failed".
#
# Usage: bash scripts/qemu-pingpong.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh
keep=0
[ "${1:-}" = --keep ] && keep=1

[ -n "${QEMU:-}" ] || QEMU=$(bash scripts/build-qemu.sh | tail -n 1)
export QEMU
cargo build --release --locked -q -p vhost-user-rdma
kmod=$(bash scripts/build-kmod.sh)
rc=$(bash scripts/build-rdma-core.sh)
bash scripts/build-guest.sh --name rdma-pingpong --load virtio_pci --load virtio_net \
  --load ib_uverbs --file "$kmod:/lib/virtio_rdma.ko" \
  --bin "$rc/bin/ibv_rc_pingpong" --bin "$rc/bin/ibv_ud_pingpong" --bin "$rc/bin/ibv_srq_pingpong" \
  --bin "$rc/bin/ibv_devinfo" \
  --lib "$rc/lib/libvirtio_rdma-rdmav34.so:/lib/libvirtio_rdma-rdmav34.so" >/dev/null

dir=$(mktemp -d /tmp/vhost-user-rdma-pingpong.XXXXXX)
daemon_pid="" pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && { wait "$daemon_pid" 2>/dev/null || true; }
  if [ "$keep" = 1 ]; then echo "logs kept in $dir"; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT

{
  printf '[[tenant]]\nname = "t"\n\n'
  for i in 0 1; do
    printf '[[vm]]\nname = "vm%d"\nsocket = "%s"\ntenant = "t"\nmac = "52:54:00:00:00:0%d"\n\n' \
      "$i" "$dir/vm$i.sock" "$((i + 1))"
  done
} >"$dir/config.toml"
RUST_LOG=${RUST_LOG:-info} target/release/vhost-user-rdma --config "$dir/config.toml" 2>"$dir/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$dir/vm1.sock" ] && break; sleep 0.05; done

# guest NAME INDEX NETDEV-OPTS CMD
guest() {
  local name=$1 i=$2 net=$3 cmd=$4
  bash scripts/run-guest.sh --image rdma-pingpong --timeout 300 --log "$dir/$name.console" -q \
    --append 'guest.uio=none' \
    --cmd "ip link set eth0 up && ip addr add 10.42.0.$((i + 1))/24 dev eth0 &&
      insmod /lib/virtio_rdma.ko && sleep 1 && export RDMAV_DRIVERS=/lib/libvirtio_rdma && $cmd" -- \
    -chardev "socket,id=rdma,path=$dir/vm$i.sock" -device vhost-user-rdma-pci,chardev=rdma \
    -netdev "stream,id=n0,$net" -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0$((i + 1))" \
    >"$dir/$name.out" 2>&1 &
  pids+=($!)
}
t=$(date +%s)
# Polling first, then sleeping on completion events (-e: CQ arming, CQ_COMPLETION events,
# ibv_get_cq_event).
guest server 0 "server=on,addr.type=unix,addr.path=$dir/net.sock" \
  'ibv_rc_pingpong -d virtio_rdma0 -g 1 -n 50 && echo EVENTS &&
   ibv_rc_pingpong -d virtio_rdma0 -g 1 -n 20 -e && echo UD &&
   ibv_ud_pingpong -d virtio_rdma0 -g 1 -n 20 && echo SRQ &&
   ibv_srq_pingpong -d virtio_rdma0 -g 1 -n 20 -q 4'
for _ in $(seq 100); do [ -S "$dir/net.sock" ] && break; sleep 0.1; done
guest client 1 "server=off,addr.type=unix,addr.path=$dir/net.sock,reconnect-ms=1000" \
  'until ping -c 1 -W 1 10.42.0.1 >/dev/null; do sleep 1; done; sleep 3;
   ibv_rc_pingpong -d virtio_rdma0 -g 1 -n 50 10.42.0.1 && echo EVENTS && sleep 3 &&
   ibv_rc_pingpong -d virtio_rdma0 -g 1 -n 20 -e 10.42.0.1 && echo UD && sleep 3 &&
   ibv_ud_pingpong -d virtio_rdma0 -g 1 -n 20 10.42.0.1 && echo SRQ && sleep 3 &&
   ibv_srq_pingpong -d virtio_rdma0 -g 1 -n 20 -q 4 10.42.0.1'
rcs=()
for p in "${pids[@]}"; do
  r=0
  wait "$p" || r=$?
  rcs+=("$r")
done
pids=()
echo "== qemu-pingpong: guests ran $(($(date +%s) - t)) s, exit ${rcs[*]}"
pass=0 fail=0
check() {
  if grep -q -- "$2" "$dir/$3.console"; then
    echo "   ok: $1: $(grep -m1 -- "$2" "$dir/$3.console" | tr -d '\r')"
    pass=$((pass + 1))
  else
    echo "   FAILED: $1 (no '$2' on the $3 console)"
    fail=$((fail + 1))
  fi
}
# check_after MARKER DESCRIPTION PATTERN GUEST: PATTERN on a line after the line MARKER.
check_after() {
  local line
  line=$(awk -v m="$1" -v p="$3" '$0 == m || $0 == m "\r" { f = 1; next } f && $0 ~ p { print; exit }' \
    "$dir/$4.console" | tr -d '\r')
  if [ -n "$line" ]; then
    echo "   ok: $2: $line"
    pass=$((pass + 1))
  else
    echo "   FAILED: $2 (no '$3' after '$1' on the $4 console)"
    fail=$((fail + 1))
  fi
}
check "ibv_rc_pingpong server" "^50 iters in .* seconds" server
check "ibv_rc_pingpong client" "^50 iters in .* seconds" client
check_after EVENTS "ibv_rc_pingpong -e (completion events) server" "^20 iters in .* seconds" server
check_after EVENTS "ibv_rc_pingpong -e (completion events) client" "^20 iters in .* seconds" client
check_after UD "ibv_ud_pingpong server (UD, address handles, GRH)" "^20 iters in .* seconds" server
check_after UD "ibv_ud_pingpong client" "^20 iters in .* seconds" client
check_after SRQ "ibv_srq_pingpong server (4 QPs sharing an SRQ)" "^20 iters in .* seconds" server
check_after SRQ "ibv_srq_pingpong client" "^20 iters in .* seconds" client
if [ "$fail" != 0 ]; then
  for n in server client; do
    echo "----- $n console"
    sed 's/^/  /' "$dir/$n.console"
  done
  echo "----- daemon log"
  sed 's/^/  /' "$dir/daemon.log"
fi
echo "qemu-pingpong: $pass passed, $fail failed"
[ "$fail" = 0 ]
