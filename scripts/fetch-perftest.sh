#!/usr/bin/env bash
# Debian bookworm's perftest and what it needs besides rdma-core's libraries (libpci3, libudev1,
# zlib1g), pinned in guest/versions.sh: verified by sha256 and extracted once into the guest
# cache. Prints the directory, to add to a guest image with build-guest.sh --sysroot.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
guest_extract_debs perftest "perftest $GUEST_PERFTEST_VERSION $GUEST_PERFTEST_SHA256" \
  "libpci3 $GUEST_LIBPCI_VERSION $GUEST_LIBPCI_SHA256" \
  "libudev1 $GUEST_LIBUDEV_VERSION $GUEST_LIBUDEV_SHA256" \
  "zlib1g $GUEST_ZLIB_VERSION $GUEST_ZLIB_SHA256"
