#!/usr/bin/env bash
# Checks the test-guest image end to end and prints the time of each step: builds two small C
# programs, builds an image with them (downloading the kernel on first use), boots it under
# QEMU/TCG and checks that
#   - the guest command's exit code comes out of run-guest.sh (3, the image's --run command),
#   - uio_pci_generic is loaded, 2 MiB hugepages are reserved, /sys/bus/pci/devices is there,
#   - a PCI function bound to uio_pci_generic can DMA to and from a hugepage whose
#     guest-physical address comes from /proc/self/pagemap (QEMU's edu device),
#   - a time-out gives 124 and a QEMU that fails to start gives 125,
#   - with a QEMU that has vhost-user-rdma-pci and a built daemon (target/release, or
#     $VHOST_USER_RDMA_BIN): the RDMA device is bound to uio_pci_generic with bus mastering on.
#
# Usage: scripts/test-guest.sh      (QEMU=/path/to/qemu-system-x86_64 to test another QEMU)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest_dir=$(cd "$here/../guest" && pwd)
# shellcheck source-path=SCRIPTDIR/..
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"

guest_need_pkgs gcc libc6-dev
guest_ensure_qemu
export QEMU

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 skipped=0 timings=()
indent() { sed "s/^/  /"; }
check() { # check NAME CONDITION-EXIT-STATUS
  if [ "$2" = 0 ]; then
    echo "ok: $1"
    passed=$((passed + 1))
  else
    echo "FAILED: $1"
    failed=$((failed + 1))
  fi
}
step() { # step NAME START END
  timings+=("$(printf '%-40s %6s s' "$1" "$(guest_elapsed "$2" "$3")")")
}

t0=$(guest_now)
for p in exit-code uio-dma; do
  gcc -O2 -Wall -Wextra -Werror -o "$work/$p" "$guest_dir/tests/$p.c"
done
t1=$(guest_now)
step "compile test programs" "$t0" "$t1"

"$here/build-guest.sh" --name selftest --bin "$work/exit-code" --bin "$work/uio-dma" \
  --run 'exit-code' 2>&1 | sed 's/^/  /'
t2=$(guest_now)
step "build image (kernel cached after 1st)" "$t1" "$t2"
# The initramfs alone, as when only the guest binaries changed.
"$here/build-guest.sh" --name selftest --bin "$work/exit-code" --bin "$work/uio-dma" \
  --run 'exit-code' >/dev/null 2>&1
t3=$(guest_now)
step "rebuild image (binaries changed)" "$t2" "$t3"

run() { "$here/run-guest.sh" --image selftest "$@"; }

set +e
out=$(run --log "$work/exit.log" 2>&1)
rc=$?
set -e
t4=$(guest_now)
step "boot + exit code (QEMU wall time)" "$t3" "$t4"
indent <<<"$out"
check "run-guest.sh exits with the guest command's code (3; got $rc)" "$([ "$rc" = 3 ]; echo $?)"
check "console has 'GUEST-EXIT: 3'" "$(tr -d '\r' <"$work/exit.log" | grep -x 'GUEST-EXIT: 3' >/dev/null; echo $?)"

# shellcheck disable=SC2016 # expanded in the guest
probe='lsmod; grep -E "^HugePages_(Total|Free)" /proc/meminfo; echo "pci: $(ls /sys/bus/pci/devices | wc -l)"
lspci -v; grep -q hugetlbfs /proc/mounts && echo hugetlbfs-mounted
for d in /sys/bus/pci/devices/*; do
  if [ "$(cat $d/vendor):$(cat $d/device)" = 0x1234:0x11e8 ]; then uio-dma ${d##*/} || exit; fi
done'
set +e
out=$(run --log "$work/probe.log" --append 'guest.uio=1234:11e8' --cmd "$probe" \
  -- -device edu,dma_mask=0xffffffffffffffff 2>&1)
rc=$?
set -e
t5=$(guest_now)
step "boot + probes + DMA (QEMU wall time)" "$t4" "$t5"
indent <<<"$out"
check "probe command exits 0 (got $rc)" "$([ "$rc" = 0 ]; echo $?)"
check "uio_pci_generic loaded" "$(grep -q '^uio_pci_generic' <<<"$out"; echo $?)"
check "64 hugepages of 2 MiB reserved" "$(grep -Eq '^HugePages_Total: +64$' <<<"$out"; echo $?)"
check "hugetlbfs mounted" "$(grep -q '^hugetlbfs-mounted$' <<<"$out"; echo $?)"
check "/sys/bus/pci/devices populated" "$(grep -Eq '^pci: [1-9]' <<<"$out"; echo $?)"
check "edu device bound to uio_pci_generic" \
  "$(grep -Eq '1234:11e8 .*driver=uio_pci_generic' <<<"$out"; echo $?)"
check "uio BAR mmap + hugepage + pagemap DMA" "$(grep -q 'RAM -> device -> RAM .*: OK' <<<"$out"; echo $?)"

set +e
run -q --append '-- exit-code 5 "two words"' >/dev/null 2>&1
rc=$?
set -e
check "command after ' -- ' on the kernel command line (exit 5; got $rc)" "$([ "$rc" = 5 ]; echo $?)"
set +e
run -q --timeout 5 --cmd 'sleep 60' >/dev/null 2>&1
rc=$?
set -e
check "time-out gives 124 (got $rc)" "$([ "$rc" = 124 ]; echo $?)"
set +e
run -q --stall 20 --cmd 'sleep 600' >/dev/null 2>&1
rc=$?
set -e
check "a silent guest is stopped as stalled: 124 (got $rc)" "$([ "$rc" = 124 ]; echo $?)"
set +e
run -q --stall 8 --cmd 'for i in 1 2 3 4 5 6 7 8 9 10; do echo tick; sleep 3; done; exit 7' >/dev/null 2>&1
rc=$?
set -e
check "a guest that keeps printing runs past the stall limit (exit 7; got $rc)" "$([ "$rc" = 7 ]; echo $?)"
set +e
run -q -- -device no-such-device >/dev/null 2>&1
rc=$?
set -e
check "QEMU failing to start gives 125 (got $rc)" "$([ "$rc" = 125 ]; echo $?)"
t6=$(guest_now)
step "failure paths" "$t5" "$t6"

# With a QEMU that has our device and a built daemon: the RDMA device is bound to
# uio_pci_generic at boot, with bus mastering on.
daemon=${VHOST_USER_RDMA_BIN:-$here/../target/release/vhost-user-rdma}
if ! "$QEMU" -device help 2>/dev/null | grep '"vhost-user-rdma-pci"' >/dev/null; then
  echo "skipped: RDMA device test ($QEMU has no vhost-user-rdma-pci)"
  skipped=$((skipped + 1))
elif [ ! -x "$daemon" ]; then
  echo "skipped: RDMA device test (no daemon at $daemon: cargo build --release)"
  skipped=$((skipped + 1))
else
  sock="$work/vm0.sock"
  "$daemon" --socket-path "$sock" >"$work/daemon.log" 2>&1 &
  dpid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  # shellcheck disable=SC2016 # expanded in the guest
  rdma_probe='lspci; d=/sys/bus/pci/devices/$(basename "$(readlink /sys/class/uio/uio0/device)")
echo "uio0: $(cat $d/vendor):$(cat $d/device) command=$(od -An -tx2 -j4 -N2 $d/config | tr -d " ")"'
  set +e
  out=$(run --cmd "$rdma_probe" -- -chardev "socket,id=rdma0,path=$sock"     -device vhost-user-rdma-pci,chardev=rdma0 2>&1)
  rc=$?
  set -e
  kill "$dpid" 2>/dev/null || true
  wait "$dpid" 2>/dev/null || true
  indent <<<"$out"
  check "RDMA device 1af4:106a bound to uio_pci_generic, bus master on" \
    "$([ "$rc" = 0 ] && grep -Eq '^uio0: 0x1af4:0x106a command=0*[0-9a-f]*[4-7]$' <<<"$out"; echo $?)"
fi
t7=$(guest_now)
step "RDMA device (daemon + QEMU)" "$t6" "$t7"

echo "QEMU: $("$QEMU" --version | head -n1)"
printf '%s\n' "${timings[@]}"
echo "guest-image: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
