#!/usr/bin/env bash
# Installs what the build and tests need on a fresh Debian 12 machine that
# has only the Rust toolchain. Safe to run again: it skips what is present.
# Each prerequisite is a Debian package, decided by its name (guest/lib.sh,
# guest_need_pkgs); scripts/check-prereqs.sh checks the list against a fresh
# machine's packages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=guest/lib.sh
. "$here/../guest/lib.sh"

pkgs=(
  # C compiler and pkg-config for the -sys crates.
  gcc libc6-dev pkg-config
  # rdma-sys generates its bindings from libibverbs' and librdmacm's headers
  # with bindgen, which loads libclang (libclang-dev: libclang1-N and clang's
  # own headers); the daemon links libibverbs.
  libibverbs-dev librdmacm-dev libclang-dev
  # `rdma` (iproute2) goes into the guests that play RDMA hosts (qemu-rxe.sh).
  iproute2
)
guest_need_pkgs "${pkgs[@]}"

if ! rustup component list --installed 2>/dev/null | grep '^clippy' >/dev/null; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
