#!/usr/bin/env bash
# Builds the guest's user-space RDMA stack from one rdma-core tree (pinned in guest/versions.sh,
# verified by sha256, cached): libibverbs, our provider (guest-driver/rdma-core/virtio_rdma, copied
# into providers/) and the example tools, configured for /usr as a distribution would, and stages
# them as installed (a sysroot for scripts/build-guest.sh --sysroot):
#   usr/lib/x86_64-linux-gnu/libibverbs.so.1, librdmacm.so.1, libibumad.so.3, and libmlx5.so.1,
#     libefa.so.1 (Debian's perftest binaries link against those four too);
#   usr/lib/x86_64-linux-gnu/libibverbs/libvirtio_rdma-rdmav34.so, the provider, and
#   etc/libibverbs.d/virtio_rdma.driver, which names it to libibverbs;
#   usr/bin/ibv_devinfo, ibv_devices, ibv_rc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong, and
#     librdmacm's examples rping, ucmatose, udaddy, rdma_server, rdma_client;
#   usr/local/bin/: our own test programs (guest-driver/tests/*.c, *.sh).
# libibverbs' provider ABI is private to a release, so the guest gets exactly this set. Prints
# the staged directory. Linux soft-RoCE's provider is staged apart, in STAGE-rxe.
#
# With --pyverbs, also pyverbs (rdma-core's Cython bindings) and rdma-core's Python tests, with
# the Python they run on, in STAGE-py (scripts/qemu-cm.sh runs tests/test_rdmacm.py from it):
#   usr/bin/python3.11 (and python3) with its standard library: the host's Debian packages
#     python3.11-minimal, libpython3.11-minimal and libpython3.11-stdlib, less what no test
#     imports (test/, idlelib, tkinter, ...), compiled to .pyc once (cached apart);
#   usr/lib/python3/dist-packages/pyverbs, built against the host's python3-dev;
#   usr/share/rdma-core/tests: tests/*.py and run_tests.py, as the tarball has them.
# pyverbs' modules are built only then (about a minute from cold on two cores).
#
# Usage: scripts/build-rdma-core.sh [--pyverbs]
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
provider="$(cd "$(dirname "$0")/../guest-driver/rdma-core/virtio_rdma" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"
pyverbs=0
case "${1:-}" in
--pyverbs) pyverbs=1 ;;
"") ;;
*) guest_die "usage: scripts/build-rdma-core.sh [--pyverbs]" ;;
esac
# The tree is configured with pyverbs (cython3, python3-dev) whether or not this run builds it,
# so that one build directory serves both. Bookworm's python3 is 3.11: pyverbs is built against
# python3-dev's 3.11 and runs on that interpreter, python3.11-minimal and libpython3.11-stdlib.
guest_need_pkgs curl ca-certificates cmake ninja-build gcc libc6-dev pkg-config python3 patch \
  libnl-3-dev libnl-route-3-dev cython3 python3-dev python3.11-minimal libpython3.11-stdlib
python=/usr/bin/python3.11
[ -x "$python" ] || guest_die "$python: missing although python3.11-minimal is installed"

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
patches="$provider/../patches"
if [ ! -f "$src/.prepared-3" ]; then
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
  # Fixes for the upstream tree (guest-driver/rdma-core/patches/: what each fixes is in it).
  for p in "$patches"/*.patch; do
    patch -s -d "$src" -p1 <"$p" || guest_die "$p does not apply"
  done
  touch "$src/.prepared-3"
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
# Debian's Python, not whichever python3 comes first on PATH.
config=(-GNinja -DNO_PYVERBS=0 -DPYTHON_EXECUTABLE="$python" -DNO_MAN_PAGES=1 -DENABLE_STATIC=0
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr
  -DCMAKE_INSTALL_LIBDIR="$libdir" -DCMAKE_INSTALL_SYSCONFDIR=/etc)
# A build directory configured otherwise (an older version of this script) starts afresh.
if [ "$(cat "$build/.config" 2>/dev/null)" != "${config[*]}" ]; then
  rm -rf "$build"
  mkdir -p "$build"
  (cd "$build" && cmake "${config[@]}" "$src" >"$build/cmake.log" 2>&1) || {
    cat "$build/cmake.log" >&2
    guest_die "rdma-core: cmake failed"
  }
  grep -q 'Found cython' "$build/cmake.log" || {
    cat "$build/cmake.log" >&2
    guest_die "rdma-core: cmake found no cython (pyverbs)"
  }
  printf '%s\n' "${config[*]}" >"$build/.config"
fi
# librdmacm, libibumad and the direct-verbs libraries of mlx5 and efa are what Debian's perftest
# binaries link against (scripts/qemu-pingpong.sh runs them on this tree's libibverbs).
tools=(ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong ibv_srq_pingpong
  rping ucmatose udaddy rdma_server rdma_client)
targets=(lib/libibverbs.so.1 lib/libvirtio_rdma-rdmav34.so "${tools[@]/#/bin/}"
  lib/librdmacm.so.1 lib/libibumad.so.3 lib/libmlx5.so.1 lib/libefa.so.1
  lib/librxe-rdmav34.so)
# pyverbs' modules (python/pyverbs/**.so), as the build names them.
[ "$pyverbs" = 0 ] || mapfile -t -O "${#targets[@]}" targets < <(ninja -C "$build" -t targets all |
  sed -n 's|^\(python/pyverbs/[^:]*[.]so\): .*|\1|p')
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
for b in "${tools[@]}"; do
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

if [ "$pyverbs" = 1 ]; then
  # The interpreter and its standard library from the host's packages, compiled once per set of
  # package versions (unchecked-hash .pyc: the image's files get new mtimes).
  pypkgs=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib)
  pyvers=$(dpkg-query -W -f='${Package}=${Version} ' "${pypkgs[@]}")
  pytree="$GUEST_CACHE/python/$(printf '%s 1\n' "$pyvers" | sha256sum | cut -c1-12)"
  if [ ! -f "$pytree/.done" ]; then
    guest_log "staging $pyvers"
    rm -rf "$pytree"
    mkdir -p "$pytree"
    # Not imported by the tests: the standard library's own tests, GUIs, packaging tools, and
    # extension modules for terminals, databases and tests.
    skip='^/usr/lib/python3[.]11/(test|idlelib|tkinter|turtledemo|ensurepip|lib2to3|pydoc_data|config-3[.]11-[^/]*)/'
    skip="$skip|/lib-dynload/(_test|xx|_xx|_ctypes_test|_curses|readline|_dbm|_gdbm|_sqlite3|nis|ossaudiodev)"
    while IFS= read -r f; do
      [ -f "$f" ] || [ -L "$f" ] || continue
      case "$f" in /usr/bin/python3.11 | /usr/lib/python3.11/*) ;; *) continue ;; esac
      mkdir -p "$pytree$(dirname "$f")"
      cp -P "$f" "$pytree$f"
    done < <(dpkg-query -L "${pypkgs[@]}" | grep -Ev "$skip")
    ln -s python3.11 "$pytree/usr/bin/python3"
    nice "$python" -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$pytree" -p / \
      "$pytree/usr/lib/python3.11" >/dev/null || guest_die "compiling the standard library failed"
    touch "$pytree/.done"
  fi
  # Staged anew only when its inputs changed, and then beside the old tree, which is replaced
  # in one rename: another script's image build may be reading it at this moment.
  pystamp="$pytree $(find -L "$build/python/pyverbs" "$src/tests" -type f -printf '%p %s %T@\n' |
    sort | sha256sum | cut -c1-16)"
  if [ ! -d "$stage-py" ] || [ "$(cat "$stage-py.stamp" 2>/dev/null)" != "$pystamp" ]; then
    next="$stage-py.new.$$"
    rm -rf "$next"
    mkdir -p "$next"
    cp -al "$pytree/usr" "$next/"
    site="$next/usr/lib/python3/dist-packages"
    mkdir -p "$site" "$next/usr/share/rdma-core"
    # pyverbs: the build's modules and the Python files it links there.
    cp -rL "$build/python/pyverbs" "$site/"
    cp -r "$src/tests" "$next/usr/share/rdma-core/tests"
    rm -f "$next/usr/share/rdma-core/tests/CMakeLists.txt"
    nice "$python" -m compileall -q --invalidation-mode unchecked-hash -s "$next" -p / \
      "$site/pyverbs" "$next/usr/share/rdma-core/tests" >/dev/null ||
      guest_die "compiling pyverbs and the tests failed"
    if [ -d "$stage-py" ]; then mv "$stage-py" "$stage-py.old.$$"; fi
    mv "$next" "$stage-py"
    printf '%s\n' "$pystamp" >"$stage-py.stamp"
    rm -rf "$stage-py.old.$$"
  fi
fi
printf '%s\n' "$stage"
