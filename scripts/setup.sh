#!/usr/bin/env bash
# Installs what the build and tests need on a fresh Debian 12 machine that
# has only the Rust toolchain. Safe to run again: it skips what is present.
set -euo pipefail

need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# libibverbs for the host-RNIC transport (rdma-sys generates its bindings
# from the headers with libclang at build time; the daemon links libibverbs).
[ -f /usr/include/infiniband/verbs.h ] || need_apt+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need_apt+=(librdmacm-dev)
compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null || need_apt+=(libclang-dev)
# `rdma` (iproute2) goes into the guests that play RDMA hosts (qemu-rxe.sh).
command -v rdma >/dev/null || need_apt+=(iproute2)
if ! rustup component list --installed 2>/dev/null | grep -q '^clippy'; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
