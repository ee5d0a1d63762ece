#!/usr/bin/env bash
# Debian bookworm's nvme-cli with libnvme1 and libjson-c5, pinned in guest/versions.sh: verified
# by sha256 and extracted once into the guest cache. The libraries libnvme1 links besides those
# (libdbus-1-3, libssl3) are the host's, installed here if missing: build-guest.sh adds them to
# the image as it finds them (ldd). Prints the directory, to add to a guest image with
# build-guest.sh --sysroot.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
guest_need_pkgs libdbus-1-3 libssl3
guest_extract_debs nvme-cli "nvme-cli $GUEST_NVME_CLI_VERSION $GUEST_NVME_CLI_SHA256" \
  "libnvme1 $GUEST_LIBNVME_VERSION $GUEST_LIBNVME_SHA256" \
  "libjson-c5 $GUEST_LIBJSONC_VERSION $GUEST_LIBJSONC_SHA256"
