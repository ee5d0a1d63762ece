#!/usr/bin/env bash
# Builds the guest kernel module virtio_rdma.ko (guest-driver/linux/) for the test guest's kernel,
# out of tree, from Debian's header packages: no root, nothing installed. The headers, their
# -common part and linux-kbuild are pinned together with the guest kernel (guest/versions.sh),
# verified by sha256, extracted once and cached. W=1 warnings fail the build.
#
# Usage: scripts/build-kmod.sh [--out DIR]
#   --out DIR      where virtio_rdma.ko goes (default: $GUEST_CACHE/kmod)
# Prints the path of the module.
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
src="$(cd "$(dirname "$0")/../guest-driver/linux" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"

out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) guest_die "unknown argument: $1" ;;
  esac
done
[ -n "$out" ] || out="$GUEST_CACHE/kmod"
guest_need_pkgs apt dpkg coreutils make gcc-12 flex bison

# One extracted tree per pinned set.
set_id=$(printf '%s\n' "$GUEST_KHEADERS_SHA256" "$GUEST_KHEADERS_COMMON_SHA256" \
  "$GUEST_KBUILD_SHA256" | sha256sum | cut -c1-12)
root="$GUEST_CACHE/kheaders/$set_id"
if [ ! -f "$root/.done" ]; then
  rm -rf "$root"
  mkdir -p "$root"
  for p in KHEADERS KHEADERS_COMMON KBUILD; do
    pkg_var="GUEST_${p}_PKG"
    sum_var="GUEST_${p}_SHA256"
    deb=$(fetch_deb "${!pkg_var}" "$GUEST_KERNEL_VERSION" "${!sum_var}")
    dpkg-deb -x "$deb" "$root"
  done
  # The arch Makefile includes the -common tree by absolute path.
  mk="$root/usr/src/$GUEST_KHEADERS_PKG/Makefile"
  sed -i "s|^include /usr/src/|include $root/usr/src/|" "$mk"
  touch "$root/.done"
  guest_log "kernel headers extracted into $root"
fi
kdir="$root/usr/src/$GUEST_KHEADERS_PKG"

# Build in a copy: kbuild writes its objects next to the sources.
build="$GUEST_CACHE/tmp/kmod-build"
rm -rf "$build"
mkdir -p "$build" "$out"
cp -r "$src"/*.c "$src"/*.h "$src"/Kbuild "$src"/uapi "$build"/
log="$build/make.log"
if ! make -C "$kdir" M="$build" W=1 modules >"$log" 2>&1; then
  cat "$log" >&2
  guest_die "virtio_rdma.ko: build failed"
fi
if grep -E 'warning:' "$log" | grep -v 'Skipping BTF generation' >&2; then
  guest_die "virtio_rdma.ko: W=1 warnings (above)"
fi
cp "$build/virtio_rdma.ko" "$out/virtio_rdma.ko"
printf '%s\n' "$out/virtio_rdma.ko"
