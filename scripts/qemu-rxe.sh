#!/usr/bin/env bash
# Two QEMU guests that play RDMA hosts: Debian's 6.1 kernel with Linux soft-RoCE (rdma_rxe) on
# their virtio-net interface, joined by `-netdev dgram` (UDP on the loopback; RoCEv2 over
# `-netdev stream` takes ~40 ms per round trip). This is where the libibverbs transport is
# tested, on a real RNIC stack: here, the stack itself is checked first, natively, with the
# tools of this tree's rdma-core (libibverbs and the rxe provider) and Debian's perftest:
#   - `rdma link add rxe0 type rxe netdev eth0` and `ibv_devinfo` (port active, RoCE);
#   - ibv_rc_pingpong -g 1 (GID 1: the interface's IPv4 address), server and client;
#   - ib_write_lat and ib_write_bw -x 1, the native figures the daemon's are compared with;
#   - the daemon's view of the device (`vhost-user-rdma rnic-info`: libibverbs through rdma-sys);
#   - the daemon and test-VMM guests inside a host guest (`rdma_perf --quick write_lat`: RDMA
#     WRITEs between two VMs on the software RNIC), as the transport's tests will run there.
# (On 6.1, rxe works neither across a veth pair between namespaces nor between two rxe devices
# of one guest: two guests it is.)
# Prints "qemu-rxe: N passed, M failed".
#
# Usage: bash scripts/qemu-rxe.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
keep=0
[ "${1:-}" = --keep ] && keep=1
t_start=$(date +%s)

[ -n "${QEMU:-}" ] || QEMU=$(bash scripts/build-qemu.sh | tail -n 1)
export QEMU
cargo build --release --locked -q -p vhost-user-rdma -p vhost-user-rdma-tests --bin rdma_perf
rc=$(bash scripts/build-rdma-core.sh)
pt=$(bash scripts/fetch-perftest.sh)
guest_need_cmds rdma:iproute2

dir=$(mktemp -d /tmp/vhost-user-rdma-rxe.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then echo "logs kept in $dir"; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT

# What both guests' commands source first: up ADDR brings the interface up with ADDR, puts an
# rxe device on it and waits for its GID 1 (the IPv4-mapped address); run and klog as in
# guest/checks.sh, on rxe0.
{
  cat <<'EOF'
up() {
  ip link set eth0 up && ip addr add "$1/24" dev eth0 &&
    /usr/local/bin/rdma link add rxe0 type rxe netdev eth0 || return 1
  local i=0
  until grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null; do
    [ $i -lt 100 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
  ulimit -l unlimited
}
EOF
  guest_tools rxe0
} >"$dir/tools.sh"
# The rxe provider and its .driver file come from STAGE-rxe (scripts/build-rdma-core.sh);
# `ip` stays busybox's, `rdma` is the host's iproute2 (busybox has none).
bash scripts/build-guest.sh --name rxe-host --load crc32_generic --load virtio_pci \
  --load virtio_net --load ib_uverbs --load rdma_rxe --file "$dir/tools.sh:/etc/tools.sh" \
  --sysroot "$rc" --sysroot "$rc-rxe" --sysroot "$pt" \
  --bin "$(command -v rdma):/usr/local/bin/rdma" --bin target/release/vhost-user-rdma \
  --bin target/release/rdma_perf >/dev/null

# Two free UDP ports on the loopback for -netdev dgram.
read -r port0 port1 < <(python3 -c 'import socket
s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

# guest NAME INDEX CMD: host guest INDEX (10.43.0.INDEX+1) running CMD.
guest() {
  local name=$1 i=$2 cmd=$3 mine theirs
  mine=$([ "$i" = 0 ] && echo "$port0" || echo "$port1")
  theirs=$([ "$i" = 0 ] && echo "$port1" || echo "$port0")
  bash scripts/run-guest.sh --image rxe-host --timeout 600 --log "$dir/$name.console" -q \
    --append 'guest.uio=none' \
    --cmd ". /etc/tools.sh && up 10.43.0.$((i + 1)) && { $cmd; }; r=\$?; klog; exit \$r" -- \
    -netdev "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$mine,remote.type=inet,remote.host=127.0.0.1,remote.port=$theirs" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:01:0$((i + 1))" \
    >"$dir/$name.out" 2>&1 &
  pids+=($!)
}
tools='run RC ibv_rc_pingpong -g 1 -n 50 && run WRITE_LAT ib_write_lat -x 1 -n 200 &&
  run WRITE_BW ib_write_bw -x 1 -n 200'
t=$(date +%s)
guest server 0 "ibv_devinfo -d rxe0 && echo RNIC-INFO &&
  vhost-user-rdma rnic-info --device rxe0 --gid-index 1 && echo IN-GUEST &&
  rdma_perf --quick --no-baselines --client-cpu 0 --engine-cpu 0 write_lat && peer=; $tools"
guest client 1 "peer=10.43.0.1; until ping -c 1 -W 1 \$peer >/dev/null; do sleep 1; done; $tools"
rcs=()
for p in "${pids[@]}"; do
  r=0
  wait "$p" || r=$?
  rcs+=("$r")
done
pids=()
echo "== qemu-rxe: guests ran $(($(date +%s) - t)) s, exit ${rcs[0]} ${rcs[1]}"

if tr -d '\r' <"$dir/server.console" | grep -q 'state:.*PORT_ACTIVE' &&
  tr -d '\r' <"$dir/server.console" | grep -q 'link_layer:.*Ethernet'; then
  ok "ibv_devinfo: rxe0 $(tr -d '\r' <"$dir/server.console" | grep -m1 -o 'state:.*PORT_ACTIVE.*'), Ethernet"
else
  failed "ibv_devinfo does not show an active Ethernet port on rxe0"
fi
check_after RNIC-INFO "rnic-info: the device" '^device: rxe0' server
check_after RNIC-INFO "rnic-info: port 1 active" '^port: 1 [(]active[)]' server
check_after RNIC-INFO "rnic-info: GID 1 is the interface's address" '^gid: ::ffff:10[.]43[.]0[.]1 [(]index 1[)]' server
check_after RNIC-INFO "rnic-info: what guests would be offered" '^offered: max_mtu [1-5] ' server
check_after IN-GUEST "the daemon and two test-VMM VMs inside the host guest (rdma_perf, µs)" \
  '^ *write_lat[.]2[.]t_typical_us [0-9]' server
n='[0-9]+[.][0-9]+' s='[ \t]+'
for g in server client; do
  check_after RC "ibv_rc_pingpong $g" "^50 iters in .* seconds" $g
  check_after WRITE_LAT "ib_write_lat $g (2 B, 200 iterations, µs)" "^ *2${s}200$s$n$s$n$s$n" $g
  check_after WRITE_BW "ib_write_bw $g (65536 B, 200 iterations, MB/s)" "^ *65536${s}200$s$n$s$n$s$n" $g
  if grep -q '^KERNEL-WARNINGS: 0' "$dir/$g.console"; then
    ok "$g: no kernel warnings"
  else
    failed "$g: kernel warnings (or no kernel log)"
  fi
done
if [ "${rcs[0]}" = 0 ] && [ "${rcs[1]}" = 0 ]; then
  ok "both guests ran all their tools (exit 0)"
else
  failed "the guests' tools: exit ${rcs[0]} (server) and ${rcs[1]} (client)"
fi
if [ "$fail" != 0 ]; then
  for g in server client; do
    echo "----- $g console"
    sed 's/^/  /' "$dir/$g.console"
  done
fi
echo "== qemu-rxe: whole run $(($(date +%s) - t_start)) s"
echo "qemu-rxe: $pass passed, $fail failed"
[ "$fail" = 0 ]
