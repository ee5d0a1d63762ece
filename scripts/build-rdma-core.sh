#!/usr/bin/env bash
# Builds the guest's user-space RDMA stack from one rdma-core tree (pinned in guest/versions.sh,
# verified by sha256, cached): libibverbs, our provider (guest-driver/rdma-core/virtio_rdma, copied
# into providers/) and the example tools. Prints the build directory; the guest needs
# lib/libibverbs.so.1, lib/libvirtio_rdma-rdmav34.so (RDMAV_DRIVERS=<dir>/libvirtio_rdma) and
# bin/ibv_* (and our own test programs from guest-driver/tests/, in bin/ too); perftest also
# librdmacm.so.1, libibumad.so.3, libmlx5.so.1 and libefa.so.1 from lib/.
#
# Usage: scripts/build-rdma-core.sh
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
provider="$(cd "$(dirname "$0")/../guest-driver/rdma-core/virtio_rdma" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"
guest_need_cmds curl:curl cmake:cmake ninja:ninja-build gcc:gcc pkg-config:pkg-config python3:python3
pkg-config --exists libnl-3.0 libnl-route-3.0 || guest_apt_install libnl-3-dev libnl-route-3-dev

ver=$GUEST_RDMA_CORE_VERSION
tarball="$GUEST_CACHE/downloads/rdma-core_$ver.orig.tar.gz"
mkdir -p "$GUEST_CACHE/downloads" "$GUEST_CACHE/tmp"
if [ ! -f "$tarball" ]; then
  guest_log "downloading $GUEST_RDMA_CORE_URL"
  curl -sSfL -o "$tarball.part" "$GUEST_RDMA_CORE_URL"
  got=$(sha256sum "$tarball.part" | cut -d' ' -f1)
  [ "$got" = "$GUEST_RDMA_CORE_SHA256" ] || {
    rm -f "$tarball.part"
    guest_die "rdma-core $ver: sha256 $got, expected $GUEST_RDMA_CORE_SHA256"
  }
  mv "$tarball.part" "$tarball"
fi

top="$GUEST_CACHE/rdma-core/$ver"
src="$top/src"
if [ ! -f "$src/.prepared-2" ]; then
  rm -rf "$src"
  mkdir -p "$src"
  tar -xzf "$tarball" -C "$src" --strip-components=1
  # One line registers the provider with the build.
  sed -i 's|^add_subdirectory(providers/siw)$|&\nadd_subdirectory(providers/virtio_rdma)|' \
    "$src/CMakeLists.txt"
  grep -q 'providers/virtio_rdma' "$src/CMakeLists.txt" || guest_die "cannot add the provider"
  # ... and one its kernel driver-data header (uapi of virtio_rdma.ko).
  sed -i 's|^  rdma/siw-abi.h$|&\n  rdma/virtio_rdma-abi.h|' "$src/kernel-headers/CMakeLists.txt"
  grep -q 'virtio_rdma-abi.h' "$src/kernel-headers/CMakeLists.txt" ||
    guest_die "cannot add the provider's kernel ABI header"
  touch "$src/.prepared-2"
fi
rm -rf "$src/providers/virtio_rdma"
cp -r "$provider" "$src/providers/virtio_rdma"
cp "$provider/../../linux/uapi/virtio_rdma-abi.h" "$src/kernel-headers/rdma/virtio_rdma-abi.h"
# The device ABI (generated from the abi crate), shared with the kernel driver.
cp "$provider/../../linux/virtio_rdma_abi.h" "$src/providers/virtio_rdma/virtio_rdma_abi.h"

build="$top/build"
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  (cd "$build" && cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "$src" >"$build/cmake.log" 2>&1) || {
    cat "$build/cmake.log" >&2
    guest_die "rdma-core: cmake failed"
  }
fi
# librdmacm, libibumad and the direct-verbs libraries of mlx5 and efa are what Debian's perftest
# binaries link against (scripts/qemu-pingpong.sh runs them on this tree's libibverbs).
targets=(lib/libibverbs.so.1 lib/libvirtio_rdma-rdmav34.so bin/ibv_devinfo bin/ibv_devices
  bin/ibv_rc_pingpong bin/ibv_ud_pingpong bin/ibv_srq_pingpong
  lib/librdmacm.so.1 lib/libibumad.so.3 lib/libmlx5.so.1 lib/libefa.so.1)
if ! ninja -C "$build" "${targets[@]}" >"$build/ninja.log" 2>&1; then
  cat "$build/ninja.log" >&2
  guest_die "rdma-core: build failed"
fi
if grep -n 'virtio_rdma.*warning:' "$build/ninja.log" >&2; then
  guest_die "the provider has compiler warnings (above)"
fi
# Our own test programs, against this tree's libibverbs.
tests="$(cd "$(dirname "$0")/../guest-driver/tests" && pwd)"
for t in "$tests"/*.c; do
  gcc -O2 -Wall -Wextra -Werror -I"$build/include" -L"$build/lib" -Wl,-rpath,"$build/lib" \
    -o "$build/bin/$(basename "$t" .c)" "$t" -libverbs || guest_die "$t: build failed"
done
printf '%s\n' "$build"
