#!/usr/bin/env bash
# Builds the guest kernel module virtio_rdma.ko (guest-driver/linux/) for a guest kernel, out of
# tree, from Debian's header packages: nothing installed on the host. The headers, their -common
# part and linux-kbuild are pinned together with the guest kernel (guest/versions.sh), verified by
# sha256, extracted once and cached. W=1 warnings fail the build.
#   6.1   Debian 12 (bookworm)'s kernel, the test guest's: built with the host's gcc-12.
#   6.12  Debian 13 (trixie)'s kernel: its linux-kbuild tools and gcc-14 need trixie's C library,
#         so the module is built in a trixie build root (debootstrap --variant=minbase with what
#         trixie's linux-headers and linux-kbuild depend on to build a module; ~30 s once, then
#         cached beside the extracted headers), with the compiler the kernel was built with.
#
# Usage: scripts/build-kmod.sh [--kernel 6.1|6.12] [--out DIR] [--device-id N]
#   --kernel K     the guest kernel to build for (default 6.1)
#   --out DIR      where virtio_rdma.ko goes (default: $GUEST_CACHE/kmod, for 6.12 .../kmod-6.12)
#   --device-id N  a test build that binds virtio device ID N instead of 42 (default directory
#                  ...-idN): for QEMU's generic vhost-user device, which cannot be 42
# Prints the path of the module.
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
src="$(cd "$(dirname "$0")/../guest-driver/linux" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"

out="" kernel=6.1 device_id=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) kernel="${2:?--kernel needs 6.1 or 6.12}"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --device-id) device_id="${2:?--device-id needs a number}"; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) guest_die "unknown argument: $1" ;;
  esac
done
guest_select_kernel "$kernel" || guest_die "--kernel: 6.1 or 6.12, not $kernel"
case "$device_id" in
"" | 42) device_id="" ;;
*[!0-9]* | ???*) guest_die "--device-id: a virtio device ID (1..99), not $device_id" ;;
esac
if [ -z "$out" ]; then
  out="$GUEST_CACHE/kmod"
  [ "$kernel" = 6.1 ] || out="$GUEST_CACHE/kmod-$kernel"
  [ -z "$device_id" ] || out="$out-id$device_id"
fi
# A test build that binds another device ID: only for a VMM whose generic vhost-user device
# cannot have ID 42 (no released QEMU names it), e.g. stock QEMU 11.1 in scripts/qemu-shmem.sh.
id_flags=()
[ -z "$device_id" ] || id_flags=("ccflags-y=-DVRDMA_DEVICE_ID=$device_id")
# What the trixie build root holds besides minbase: the compiler and make, perl (W=1 runs
# kernel-doc), and what trixie's linux-kbuild depends on (libelf1t64, libssl3t64, zlib1g; pahole,
# in dwarves, for the module's BTF).
broot_pkgs=gcc-14,make,perl,libelf1t64,libssl3t64,zlib1g,dwarves
if [ "$GUEST_KERNEL_SUITE" = trixie ]; then
  guest_need_pkgs apt dpkg coreutils util-linux debootstrap debian-archive-keyring
else
  guest_need_pkgs apt dpkg coreutils make gcc-12 flex bison
fi

# One extracted tree per pinned set (for trixie, in its build root).
set_id=$(printf '%s\n' "$GUEST_KHEADERS_SHA256" "$GUEST_KHEADERS_COMMON_SHA256" \
  "$GUEST_KBUILD_SHA256" | sha256sum | cut -c1-12)
[ "$GUEST_KERNEL_SUITE" != trixie ] ||
  set_id=$(printf '%s\n' "$set_id" "$broot_pkgs" | sha256sum | cut -c1-12)
root="$GUEST_CACHE/kheaders/$set_id"

# in_root CMD...: runs CMD on the extracted tree: as root for trixie's build root (debootstrap
# makes it root's), as the user otherwise.
in_root() {
  if [ "$GUEST_KERNEL_SUITE" = trixie ]; then guest_as_root "$@"; else "$@"; fi
}

# unmount_under DIR: unmounts what a failed debootstrap may have left mounted in DIR.
unmount_under() {
  local m
  while read -r m; do
    guest_as_root umount -l "$m" || true
  done < <(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
}

if [ ! -f "$root/.done" ]; then
  if [ -d "$root" ]; then
    unmount_under "$root"
    in_root rm -rf "$root"
  fi
  mkdir -p "$root" "$GUEST_CACHE/tmp"
  if [ "$GUEST_KERNEL_SUITE" = trixie ]; then
    uri=$(_guest_bookworm_uri) || guest_die "no apt source for Debian found; cannot reach trixie"
    guest_log "creating a Debian trixie build root in $root ($broot_pkgs)"
    log="$GUEST_CACHE/tmp/debootstrap.log"
    if ! guest_as_root nice debootstrap --variant=minbase --include="$broot_pkgs" \
      --keyring=/usr/share/keyrings/debian-archive-keyring.gpg trixie "$root" "$uri" >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      unmount_under "$root"
      guest_die "debootstrap of the trixie build root failed (whole log: $log)"
    fi
    unmount_under "$root"
  fi
  for p in KHEADERS KHEADERS_COMMON KBUILD; do
    pkg_var="GUEST_${p}_PKG"
    sum_var="GUEST_${p}_SHA256"
    deb=$(fetch_deb "${!pkg_var}" "$GUEST_KERNEL_VERSION" "${!sum_var}" "$GUEST_KERNEL_SUITE")
    in_root dpkg-deb -x "$deb" "$root"
  done
  if [ "$GUEST_KERNEL_SUITE" != trixie ]; then
    # The arch Makefile includes the -common tree by absolute path (in the build root, as is).
    mk="$root/usr/src/$GUEST_KHEADERS_PKG/Makefile"
    sed -i "s|^include /usr/src/|include $root/usr/src/|" "$mk"
  fi
  in_root touch "$root/.done"
  guest_log "kernel headers extracted into $root"
fi

# Build in a copy: kbuild writes its objects next to the sources.
if [ "$GUEST_KERNEL_SUITE" = trixie ]; then
  build="$root/build/kmod"
  guest_as_root rm -rf "$build"
  guest_as_root mkdir -p "$build"
  guest_as_root cp -r "$src"/*.c "$src"/*.h "$src"/Kbuild "$src"/uapi "$build"/
  make_cmd=(guest_as_root nice chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8
    make -C "/usr/src/$GUEST_KHEADERS_PKG" M=/build/kmod W=1 "${id_flags[@]}" modules)
else
  build="$GUEST_CACHE/tmp/kmod-build"
  rm -rf "$build"
  mkdir -p "$build"
  cp -r "$src"/*.c "$src"/*.h "$src"/Kbuild "$src"/uapi "$build"/
  make_cmd=(nice make -C "$root/usr/src/$GUEST_KHEADERS_PKG" M="$build" W=1 "${id_flags[@]}" modules)
fi
mkdir -p "$out"
log="$GUEST_CACHE/tmp/kmod-$kernel-make.log"
if ! "${make_cmd[@]}" >"$log" 2>&1; then
  cat "$log" >&2
  guest_die "virtio_rdma.ko for $GUEST_KHEADERS_PKG: build failed"
fi
if grep -E 'warning:' "$log" | grep -v 'Skipping BTF generation' >&2; then
  guest_die "virtio_rdma.ko for $GUEST_KHEADERS_PKG: W=1 warnings (above)"
fi
cp "$build/virtio_rdma.ko" "$out/virtio_rdma.ko"
printf '%s\n' "$out/virtio_rdma.ko"
