#!/usr/bin/env bash
# Builds the guest's user-space RDMA stack from one rdma-core tree (pinned in guest/versions.sh,
# verified by sha256, cached): libibverbs, our provider (guest-driver/rdma-core/virtio_rdma, copied
# into providers/) and the example tools, configured for /usr as a distribution would, and stages
# them as installed (a sysroot for scripts/build-guest.sh --sysroot):
#   usr/lib/x86_64-linux-gnu/libibverbs.so.1, librdmacm.so.1, libibumad.so.3, and libmlx5.so.1,
#     libefa.so.1 (Debian's perftest binaries link against those four too);
#   usr/lib/x86_64-linux-gnu/libibverbs/libvirtio_rdma-rdmav34.so, the provider, and
#   etc/libibverbs.d/virtio_rdma.driver, which names it to libibverbs;
#   usr/bin/ibv_devinfo, ibv_devices, ibv_rc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong;
#   usr/local/bin/: our own test programs (guest-driver/tests/*.c, *.sh).
# libibverbs' provider ABI is private to a release, so the guest gets exactly this set. Prints
# the staged directory.
#
# Usage: scripts/build-rdma-core.sh
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
provider="$(cd "$(dirname "$0")/../guest-driver/rdma-core/virtio_rdma" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"
guest_need_pkgs curl ca-certificates cmake ninja-build gcc libc6-dev pkg-config python3 \
  libnl-3-dev libnl-route-3-dev

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

# Configured for /usr, so that libibverbs looks for providers in /usr/lib/x86_64-linux-gnu/libibverbs
# and for their .driver files in /etc/libibverbs.d, where the guest has them.
libdir=lib/x86_64-linux-gnu
build="$top/build-usr"
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  (cd "$build" && cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
    -DCMAKE_INSTALL_LIBDIR="$libdir" -DCMAKE_INSTALL_SYSCONFDIR=/etc \
    "$src" >"$build/cmake.log" 2>&1) || {
    cat "$build/cmake.log" >&2
    guest_die "rdma-core: cmake failed"
  }
fi
# librdmacm, libibumad and the direct-verbs libraries of mlx5 and efa are what Debian's perftest
# binaries link against (scripts/qemu-pingpong.sh runs them on this tree's libibverbs).
targets=(lib/libibverbs.so.1 lib/libvirtio_rdma-rdmav34.so bin/ibv_devinfo bin/ibv_devices
  bin/ibv_rc_pingpong bin/ibv_ud_pingpong bin/ibv_srq_pingpong
  lib/librdmacm.so.1 lib/libibumad.so.3 lib/libmlx5.so.1 lib/libefa.so.1
  lib/librxe-rdmav34.so)
if ! ninja -C "$build" "${targets[@]}" >"$build/ninja.log" 2>&1; then
  cat "$build/ninja.log" >&2
  guest_die "rdma-core: build failed"
fi
if grep -n 'virtio_rdma.*warning:' "$build/ninja.log" >&2; then
  guest_die "the provider has compiler warnings (above)"
fi

# The install tree, staged afresh (a few files).
stage="$top/stage"
rm -rf "$stage"
mkdir -p "$stage/usr/$libdir/libibverbs" "$stage/etc/libibverbs.d" "$stage/usr/bin" \
  "$stage/usr/local/bin"
for l in libibverbs.so.1 librdmacm.so.1 libibumad.so.3 libmlx5.so.1 libefa.so.1; do
  cp -L "$build/lib/$l" "$stage/usr/$libdir/$l"
done
cp "$build/lib/libvirtio_rdma-rdmav34.so" "$stage/usr/$libdir/libibverbs/"
printf 'driver virtio_rdma\n' >"$stage/etc/libibverbs.d/virtio_rdma.driver"
for b in ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong ibv_srq_pingpong; do
  cp "$build/bin/$b" "$stage/usr/bin/"
done
# Our own test programs, against this tree's libibverbs.
tests="$(cd "$(dirname "$0")/../guest-driver/tests" && pwd)"
for t in "$tests"/*.c; do
  gcc -O2 -Wall -Wextra -Werror -I"$build/include" -L"$build/lib" \
    -o "$stage/usr/local/bin/$(basename "$t" .c)" "$t" -libverbs || guest_die "$t: build failed"
done
for t in "$tests"/*.sh; do
  install -m 0755 "$t" "$stage/usr/local/bin/"
done
# Linux soft-RoCE's provider, staged apart (the guests that play RDMA hosts add it:
# scripts/qemu-rxe.sh): STAGE-rxe beside STAGE.
rm -rf "$stage-rxe"
mkdir -p "$stage-rxe/usr/$libdir/libibverbs" "$stage-rxe/etc/libibverbs.d"
cp "$build/lib/librxe-rdmav34.so" "$stage-rxe/usr/$libdir/libibverbs/"
printf 'driver rxe\n' >"$stage-rxe/etc/libibverbs.d/rxe.driver"
printf '%s\n' "$stage"
