#!/usr/bin/env bash
# rdma-core's own test suite (tests/ of the pinned rdma-core, Python over pyverbs, built by
# scripts/build-rdma-core.sh --pyverbs) in one QEMU guest on its RDMA device: virtio_rdma0
# (virtio_rdma.ko on a daemon), or with --device rxe Linux soft-RoCE (rxe0 on the guest's
# virtio-net interface, no daemon), which runs the same suite and so checks this harness. The
# suite needs no peer: its traffic tests open both ends on the one device, rdma_cm's tests run
# their two sides as processes of the guest. run_tests.py picks the device's first GID with an
# IP address on its interface (index 0, the default GID) unless told otherwise; so does this.
# With --bare the daemon offers no UD, SRQs or atomics (cloud-hypervisor's generic vhost-user
# device shows no device feature bits): those tests must skip, not fail.
# The suite runs as run_tests.py runs it, through guest/tests/rdma-core-tests.py, which adds
# one line per outcome. Prints the counts, every failure and error with its last line, and every
# skip grouped by its reason (the vendor modules - mlx5, EFA, CUDA - apart); each passed test is
# a passed check, each failed or erroring one a failed check, skips count as neither. Also
# checked: the port came up, no kernel warning, and (virtio) that the daemon released the VM's
# objects and lives. Prints "qemu-rdma-core-tests: N passed, M failed" (-rxe, -bare with the
# options) and fails on any failure or error.
# Waits are on progress: the suite's step is stopped once it printed nothing for 600 s.
#
# With --kernel 6.12 the guest runs Debian 13's 6.12 kernel (the module built for it): the same
# user space on the newer kernel's uverbs (its FLUSH and ATOMIC WRITE verbs among them).
#
# Usage: bash scripts/qemu-rdma-core-tests.sh [--device virtio|rxe] [--bare] [--kernel 6.1|6.12]
#          [--keep] [TEST...]
#   TEST: run_tests.py's test names (e.g. tests.test_device), default all.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
keep=0 device=virtio bare=0 kernel=6.1 only=()
while [ $# -gt 0 ]; do
  case "$1" in
  --keep) keep=1; shift ;;
  --bare) bare=1; shift ;;
  --device) device=${2:?--device needs virtio or rxe}; shift 2 ;;
  --kernel) kernel=${2:?--kernel needs 6.1 or 6.12}; shift 2 ;;
  -*) guest_die "usage: scripts/qemu-rdma-core-tests.sh [--device virtio|rxe] [--bare] [--kernel 6.1|6.12] [--keep] [TEST...]" ;;
  *) only+=("$1"); shift ;;
  esac
done
case "$device" in
virtio) name=qemu-rdma-core-tests dev=virtio_rdma0 image=rdma-core-tests ;;
rxe) name=qemu-rdma-core-tests-rxe dev=rxe0 image=rdma-core-tests-rxe ;;
*) guest_die "--device: virtio or rxe, not $device" ;;
esac
[ "$bare" = 0 ] || [ "$device" = virtio ] || guest_die "--bare is a setting of the daemon (virtio)"
[ "$bare" = 0 ] || name=$name-bare
case "$kernel" in
6.1) ;;
6.12)
  [ "$device" = virtio ] || guest_die "--kernel 6.12: the virtio device only"
  name=$name-6.12 image=$image-6.12
  ;;
*) guest_die "--kernel: 6.1 or 6.12, not $kernel" ;;
esac
guest_need_pkgs iproute2
t_start=$(date +%s)

launch_need_qemu
rc=$(bash scripts/build-rdma-core.sh --pyverbs)
extra=()
if [ "$device" = virtio ]; then
  cargo build --release --locked -q -p vhost-user-rdma
  kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
  extra=(--file "$kmod:/lib/virtio_rdma.ko")
else
  # rxe's ICRC needs a crc32 that modules.dep does not name (scripts/qemu-rxe.sh).
  extra=(--sysroot "$rc-rxe" --load crc32_generic --load rdma_rxe)
fi
t_built=$(date +%s)

launch_workdir rct

# shellcheck disable=SC2016 # the guest's shell expands them
{
  guest_tools "$dev"
  printf 'DEV=%s MODE=%s BARE=%s ONLY="%s"\n' "$dev" "$device" "$bare" "${only[*]}"
  cat <<'EOF'
up() {
  ulimit -l unlimited
  # Four 2 MiB huge pages for the tests that place queues on one (parent domain allocators).
  echo 4 >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages || return 1
  ip link set eth0 up && ip addr add 10.42.0.1/24 dev eth0 || return 1
  if [ "$MODE" = rxe ]; then
    rdma link add rxe0 type rxe netdev eth0 || return 1
  else
    insmod /lib/virtio_rdma.ko || return 1
  fi
  modprobe rdma_ucm && modprobe ib_umad || return 1
  # The port active with the interface's IPv4 GID (rdma_cm's tests bind that address).
  until grep -qs 0a2a:0001 /sys/class/infiniband/$DEV/ports/1/gids/* &&
    grep -q ACTIVE /sys/class/infiniband/$DEV/ports/1/state 2>/dev/null; do
    sleep 0.1
  done
  # ... and eth0's link-local address past duplicate address detection: it is GID 0, and an
  # address handle to a tentative address cannot be resolved (ETIMEDOUT).
  until ip -6 addr show dev eth0 scope link | grep -q 'inet6 fe80' &&
    ! ip -6 addr show dev eth0 | grep -q tentative; do
    sleep 0.1
  done
  echo "PORT-UP $DEV"
  ibv_devinfo -v -d "$DEV"
  for g in 0 1; do
    echo "GID $g: $(cat /sys/class/infiniband/$DEV/ports/1/gids/$g) $(cat /sys/class/infiniband/$DEV/ports/1/gid_attrs/types/$g 2>/dev/null)"
  done
}
# Whether rdma_cm has a device for the interface's address (pyverbs: a passive rdma_create_ep).
cm_bind() {
  python3 -c 'from pyverbs.cmid import AddrInfo, CMID
import pyverbs.cm_enums as ce
CMID(creator=AddrInfo(src="10.42.0.1", src_service="7999", port_space=ce.RDMA_PS_TCP,
                      flags=ce.RAI_PASSIVE)).close()'
}
suite() {
  # Without F_UD the device has no GSI QP (spec 4), so no rdma_cm: with --bare, and only if
  # rdma_cm indeed finds no device, its tests are skipped for that reason (the suite would try
  # to connect regardless). On the full device they must run.
  if [ "$BARE" = 1 ] && ! cm_bind 2>/tmp/cm.err; then
    export RCT_NO_RDMA_CM="no rdma_cm: without F_UD the device has no GSI QP (spec 4, 18.26): $(tail -n1 /tmp/cm.err)"
    echo "$RCT_NO_RDMA_CM"
  fi
  # shellcheck disable=SC2086 # the test names, one a word
  python3 /etc/rdma-core-tests.py --dev "$DEV" -v $ONLY
}
EOF
} >"$dir/tools.sh"

# The image: the rdma-core set with pyverbs and its tests, the host's iproute2 `ip` and `rdma`
# (the tests read both with -j; busybox has neither), and the modules of the rdma_cm stack.
bash scripts/build-guest.sh --kernel "$kernel" --name "$image" --load virtio_pci --load virtio_net --load ib_uverbs \
  --module rdma_ucm --module ib_umad "${extra[@]}" --sysroot "$rc" --sysroot "$rc-py" \
  --bin "$(command -v rdma):/usr/local/bin/rdma" --bin "$(command -v ip):/usr/local/bin/ip" \
  --file "$GUEST_STDBUF_FILE" --file "$dir/tools.sh:/etc/tools.sh" \
  --file guest/tests/rdma-core-tests.py:/etc/rdma-core-tests.py \
  --lib /lib/x86_64-linux-gnu/libgcc_s.so.1 >/dev/null
echo "== $name: image $(du -k "$GUEST_CACHE/images/$image/initramfs.img" | cut -f1) KiB;" \
  "built in $((t_built - t_start)) s, image $(($(date +%s) - t_built)) s"

mac=52:54:00:00:00:01
daemon_pid='' dev_args=()
if [ "$device" = virtio ]; then
  {
    printf '[daemon]\nmgmt_socket = "%s"\n' "$dir/mgmt.sock"
    [ "$bare" = 0 ] || printf 'ud = false\nsrq = false\natomics = false\n'
    printf '\n'
    printf '[[tenant]]\nname = "t"\n\n[[vm]]\nname = "vm0"\nsocket = "%s"\ntenant = "t"\nmac = "%s"\n' \
      "$dir/vm0.sock" "$mac"
  } >"$dir/config.toml"
  launch_daemon --wait "$dir/vm0.sock" --wait "$dir/mgmt.sock" --config "$dir/config.toml"
  daemon_pid=$launch_pid
  # shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
  dev_args=(-chardev "socket,id=rdma,path=$dir/vm0.sock" -device vhost-user-rdma-pci,chardev=rdma)
fi
# The interface only carries the device's GIDs: its frames go to a loopback UDP port nobody
# reads (-netdev dgram is up from the start, unlike a stream without its peer).
launch_dgram_ports
t=$(date +%s)
# shellcheck disable=SC2016 # the guest's shell expands them
launch_guest guest --image "$image" --mem 2G --append 'guest.uio=none' \
  --cmd '. /etc/tools.sh; step UP up; STALL=600 step SUITE suite; steps_verdict; r=$?; klog; exit $r' -- \
  "${dev_args[@]}" \
  -netdev "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$port0,remote.type=inet,remote.host=127.0.0.1,remote.port=$port1" \
  -device "virtio-net-pci,netdev=n0,mac=$mac"
grc=0
launch_wait "$launch_pid" || grc=$?
t_guest=$(($(date +%s) - t))
echo "== $name: guest ran $t_guest s, exit $grc"
console="$dir/guest.console"

if grep -q "^PORT-UP $dev" "$console"; then ok "$dev: port active with the interface's IPv4 GID"; else failed "$dev: the port did not come up"; fi
tr -d '\r' <"$console" | grep -E '^\s+(vendor_id|vendor_part_id|max_vl_num|max_inline_data):|^GID [01]:' |
  sed 's/^[[:space:]]*/   /' || true

# The outcomes: one RCT line each (a test with failing subtests may have several).
tr -d '\r' <"$console" | grep '^RCT ' >"$dir/rct" || true
count() { awk -v k="$1" '$2 == k { print $3 }' "$dir/rct" | sort -u | wc -l; }
np=$(count pass) nf=$(count fail) ne=$(count error) ns=$(count skip)
nx=$(($(count xfail) + $(count xpass)))
ran=$(tr -d '\r' <"$console" | sed -n 's/^Ran \([0-9]*\) tests\? in .*/\1/p' | tail -n1)
summary=$(tr -d '\r' <"$console" | grep -E '^(OK|FAILED)( \(.*\))?$' | tail -n1 || true)
echo "   rdma-core tests on $dev: ${ran:-?} run: $np passed, $nf failed, $ne errors, $ns skipped$(
  [ "$nx" = 0 ] || echo ", $nx expected failures or unexpected successes") (unittest: ${summary:-no summary})"
if [ -n "$ran" ] && [ -n "$summary" ]; then
  ok "the suite ran to its end: $ran tests, $summary"
else
  failed "the suite did not run to its end (no 'Ran N tests' and verdict on the console)"
fi
# Each passed test a passed check (counted, listed on one line).
for _ in $(seq "$np"); do tally ok; done
echo "   passed: $(awk '$2 == "pass" { sub(/^tests[.]/, "", $3); print $3 }' "$dir/rct" | sort -u | tr '\n' ' ')"
while read -r kind id why; do
  failed "$kind: $id: $why"
done < <(awk '$2 == "fail" || $2 == "error" || $2 == "xpass" { k = $2; id = $3; sub(/^tests[.]/, "", id)
  $1 = $2 = $3 = $4 = ""; sub(/^ +/, ""); print k, id, $0 }' "$dir/rct")
# The skips, grouped: the vendor modules (their tests need that vendor's device or GPU) by
# module, the others by reason.
echo "   skipped, by reason:"
awk '$2 == "skip" { id = $3; sub(/^tests[.]/, "", id); split(id, p, "."); mod = p[1]
    why = $0; sub(/^[^:]*:: ?/, "", why)
    if (mod ~ /^test_(mlx5|efa|cuda)/) { key = "vendor module " mod }
    else { key = why == "" ? "(no reason given)" : why }
    n[key]++; t[key] = t[key] " " p[2] "." p[3] }
  END { for (k in n) printf "%5d  %s:%s\n", n[k], k, t[k] }' "$dir/rct" |
  sort -t: -k1,1 | sort -s -k2,2 -k3,3 | sed 's/^/     /'

if grep -q '^KERNEL-WARNINGS: 0' "$console"; then
  ok "no kernel warnings"
else
  failed "kernel warnings (or no kernel log)"
fi
if [ -n "$daemon_pid" ]; then
  if stats=$(target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" --json stats vm0); then
    held=$(python3 -c 'import json, sys; r = json.load(sys.stdin)["resources"]; print(sum(r.values()))' <<<"$stats")
    if [ "$held" = 0 ]; then
      ok "the daemon holds no object of the VM once it left (ctl stats)"
    else
      failed "the daemon holds $held objects of the VM after it left: $stats"
    fi
  else
    failed "ctl stats vm0"
  fi
  if kill -0 "$daemon_pid" 2>/dev/null; then ok "the daemon is alive"; else failed "the daemon died"; fi
fi
if [ "$fail" != 0 ]; then
  # From unittest's first report of a failure or error to the end; the last lines without one.
  tr -d '\r' <"$console" | awk '/^=====/ { f = 1 } f' | head -n 400 >"$dir/console.tail"
  [ -s "$dir/console.tail" ] || tr -d '\r' <"$console" | tail -n 60 >"$dir/console.tail"
  show_log "guest console (the suite's failures and errors, the end)" "$dir/console.tail"
  [ -z "$daemon_pid" ] || { tail -n 100 "$dir/daemon.log" >"$dir/daemon.tail" &&
    show_log "daemon log (the last 100 lines)" "$dir/daemon.tail"; }
fi
echo "== $name: whole run $(($(date +%s) - t_start)) s (guest $t_guest s)"
verdict "$name"
