#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, unit and integration tests
# (the integration tests start the real daemon and talk to it over real
# vhost-user sockets through the test VMM), and the end-to-end test in real
# QEMU guests (patched QEMU built and cached on first use; see
# scripts/qemu-e2e.sh). RDMA_SKIP_QEMU=1 skips the QEMU part; RDMA_SKIP_CM=1
# skips scripts/qemu-cm.sh (rdma_cm, NVMe-oF, NFS over RDMA between two guests);
# RDMA_CM_TESTS=1 adds qemu-cm's own check on soft-RoCE (rxe). Every part runs
# whatever the others did; the script fails at the end naming those that failed.
#
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

t_start=$SECONDS
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Every part runs whatever the ones before it did, so that one failure hides
# no other verdict; the script fails at the end, naming the parts that did.
failed_parts=()
part() { # part TITLE CMD...: runs CMD, its output also into $out
  local title=$1
  shift
  echo "== $title"
  if ! "$@" 2>&1 | tee -a "$out"; then
    failed_parts+=("$title")
  fi
}
# Setup and the static checks come first: without them nothing else means much.
bash scripts/setup.sh
part "prerequisites: what a fresh machine has or gets installed covers what the build uses" \
  bash scripts/check-prereqs.sh
part "cargo fmt --check" cargo fmt --all -- --check
# cargo fmt does not reach modules declared inside a macro (the daemon's guest-facing ones,
# `guest_facing!` in backend/src/lib.rs): every file of the daemon, one by one.
part "rustfmt --check, every file of the daemon" \
  bash -c 'git ls-files "backend/src/*.rs" | xargs rustfmt --edition 2021 --check'
part "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
part "guest kernel driver: checkpatch.pl --no-tree --strict" bash scripts/checkpatch.sh
part "the daemon without its verbs transport: no libibverbs or libclang in the build" \
  bash scripts/check-no-verbs.sh
part "cargo test" cargo test --workspace --locked
part "data path again, shared-memory doorbell mode, drivers posting without fences (DB_FLAG_POLLING)" \
  env RDMA_TEST_DOORBELL=shmem RDMA_TEST_FENCE_ELISION=1 \
  cargo test --locked -p vhost-user-rdma-tests --test datapath
t_qemu=$SECONDS
if [ "${RDMA_SKIP_QEMU:-0}" != 1 ]; then
  part "end to end: two QEMU guests and a hostile one on one daemon" bash scripts/qemu-e2e.sh
  part "the Linux guest driver (virtio_rdma.ko) in a QEMU guest" bash scripts/qemu-kmod.sh
  part "rdma-core's own test suite (pyverbs) in a QEMU guest on virtio_rdma0" \
    bash scripts/qemu-rdma-core-tests.sh
  part "rdma-core's own test suite on a device without UD, SRQs and atomics (cloud-hypervisor's case)" \
    bash scripts/qemu-rdma-core-tests.sh --bare
  part "unmodified pingpongs and perftest between two QEMU guests, a hostile third one killed" \
    bash scripts/qemu-pingpong.sh
  part "two QEMU guests as RDMA hosts: Linux soft-RoCE (rxe) between them, natively" \
    bash scripts/qemu-rxe.sh
  part "the Linux guest driver on Debian 13's 6.12 kernel: the kmod checks" \
    bash scripts/qemu-kmod.sh --kernel 6.12
  part "the Linux guest driver on Debian 13's 6.12 kernel: an RC pingpong" \
    bash scripts/qemu-pingpong.sh --kernel 6.12
  part "rdma-core's own test suite on Debian 13's 6.12 kernel" \
    bash scripts/qemu-rdma-core-tests.sh --kernel 6.12
  part "live migration of a guest running an RC pingpong to its standby on the same daemon" \
    bash scripts/qemu-migrate.sh --traffic
  part "live migration of the written side: B migrates while A runs ib_write_bw into it" \
    bash scripts/qemu-migrate.sh --migrate-b
  part "live upgrade: the daemon replaced twice under two QEMU guests running an RC pingpong" \
    bash scripts/qemu-upgrade.sh
  part "the Debian package under systemd as PID 1: install, VMs, ctl, metrics, reload, stop, purge" \
    bash scripts/qemu-package.sh
  part "the guest packages in Debian 12: DKMS builds virtio_rdma.ko, the packaged provider runs verbs" \
    bash scripts/qemu-dkms.sh
  part "QEMU 11.1: the Rust driver's exchange in the shared-memory doorbell mode (generic device)" \
    env QEMU="$(bash scripts/build-qemu.sh --qemu 11.1-stock | tail -n 1)" \
    bash scripts/qemu-e2e.sh --generic --expect-shmem
  part "QEMU 11.1: virtio_rdma.ko and the provider in both doorbell modes, pingpongs and perftest" \
    bash scripts/qemu-shmem.sh
  # rdma_cm, NVMe over Fabrics and NFS over RDMA between two guests (issue 28); with
  # RDMA_CM_TESTS=1 first the same harness on soft-RoCE (its own check).
  if [ "${RDMA_CM_TESTS:-0}" = 1 ]; then
    part "rdma_cm tools, perftest -R, NVMe over Fabrics: the harness on soft-RoCE (rxe)" \
      bash scripts/qemu-cm.sh --device rxe
  fi
  if [ "${RDMA_SKIP_CM:-0}" != 1 ]; then
    part "rdma_cm tools, perftest -R, NVMe-oF, NFS over RDMA between two QEMU guests on one daemon" \
      bash scripts/qemu-cm.sh
  fi
fi
echo "== times: everything $((SECONDS - t_start)) s, of which the QEMU part $((SECONDS - t_qemu)) s"
# One line of totals for humans and CI.
awk '/^test result:/ { p += $4; f += $6 }
     /^(qemu-(e2e|kmod|pingpong|rxe|cm|migrate|upgrade|package|dkms|shmem|rdma-core-tests)(-6\.12|-rxe|-bare)?|check-prereqs|check-no-verbs): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     END { printf "%d passed, %d failed\n", p, f }' "$out"
if [ ${#failed_parts[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed_parts[@]}"
  exit 1
fi
