#!/usr/bin/env bash
# The guest packages in a real Debian 12: the DKMS package of the guest driver
# (scripts/package-dkms.sh) and the provider package (scripts/package-provider.sh), installed with
# dpkg in a Debian 12 system that boots in QEMU/TCG with systemd as PID 1, with the virtio RDMA
# device on a running daemon. The system is on an ext4 disk image (virtio-blk, QEMU's snapshot
# mode: each run starts from the same image): debootstrap minbase with systemd, dkms, gcc,
# libibverbs1 and ibverbs-utils, and Debian's pinned 6.1 kernel (guest/versions.sh) installed
# with its headers from the same verified packages, made once per package set and cached. The
# test image's busybox initramfs (scripts/build-guest.sh, with virtio_blk and ext4) mounts it and
# hands over to its systemd (guest/rootfs/init's guest.root=), after copying this run's files
# onto it. guest/dkms-check.sh runs the steps there, each with its own verdict:
#   - dpkg -i virtio-rdma-dkms: DKMS builds virtio_rdma.ko in the guest, `dkms status` installed;
#   - modprobe virtio_rdma binds the device, a RoCE port active on the paired interface;
#   - no verbs device for libibverbs before the provider package, one after it: Debian's
#     ibv_devices and ibv_devinfo (port active, Ethernet) through the packaged provider;
#   - ibv_rc_pingpong, server and client in the guest, RC traffic through the device;
#   - dpkg -r of the provider (the device gone from libibverbs; its .driver conffile stays until
#     dpkg -P) and of the DKMS package (module gone from DKMS and the kernel's module tree).
# Prints "qemu-dkms: N passed, M failed".
#
# Usage: bash scripts/qemu-dkms.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh

guest_script_args "$@"
[ "$kernel" = 6.1 ] || guest_die "--kernel: the guest is Debian 12, with its 6.1 kernel"

guest_need_pkgs debootstrap debian-archive-keyring e2fsprogs cpio gzip
launch_need_qemu
launch_workdir dkms
t_start=$SECONDS

cargo build --release --locked -q -p vhost-user-rdma
dkms_deb=$(bash scripts/package-dkms.sh | tail -n 1)
provider_deb=$(bash scripts/package-provider.sh | tail -n 1)
if [ ! -f "$dkms_deb" ] || [ ! -f "$provider_deb" ]; then guest_die "the packages were not built"; fi
# The kernel, and a busybox initramfs that mounts the disk and hands over to its systemd.
bash scripts/build-guest.sh --name dkms-boot --load virtio_pci --load virtio_blk \
  --load crc32c_generic --load ext4 >/dev/null
t_packages=$SECONDS

# The Debian system, once per package set and pinned kernel: an ext4 image of the debootstrap
# tree with the kernel, its headers (-common, linux-kbuild) installed from the pinned packages.
sys_pkgs=systemd,systemd-sysv,procps,kmod,iproute2,initramfs-tools,linux-base,dkms,gcc,make,libc6-dev
sys_pkgs+=,linux-compiler-gcc-12-x86,libelf1,libssl3,libibverbs1,ibverbs-utils
kdebs=("$GUEST_KERNEL_PKG $GUEST_KERNEL_VERSION $GUEST_KERNEL_SHA256"
  "$GUEST_KHEADERS_COMMON_PKG $GUEST_KERNEL_VERSION $GUEST_KHEADERS_COMMON_SHA256"
  "$GUEST_KBUILD_PKG $GUEST_KERNEL_VERSION $GUEST_KBUILD_SHA256"
  "$GUEST_KHEADERS_PKG $GUEST_KERNEL_VERSION $GUEST_KHEADERS_SHA256")
id=$(printf '%s\n' bookworm "$sys_pkgs" "${kdebs[@]}" ext4-1 | sha256sum | cut -c1-12)
base="$GUEST_CACHE/systemd-disk/$id"
if [ ! -f "$base/root.img" ]; then
  t_image=$SECONDS
  uri=$(_guest_bookworm_uri) || guest_die "no apt source for Debian bookworm found"
  tree="$base/tree"
  guest_as_root rm -rf "$base"
  mkdir -p "$base"
  guest_log "creating a Debian 12 system with systemd, DKMS and Linux $GUEST_KERNEL_VERSION in $tree"
  if ! guest_as_root nice debootstrap --variant=minbase --include="$sys_pkgs" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg bookworm "$tree" "$uri" \
    >"$base/debootstrap.log" 2>&1; then
    tail -n 30 "$base/debootstrap.log" >&2
    guest_die "debootstrap failed (whole log: $base/debootstrap.log)"
  fi
  guest_as_root mkdir -p "$tree/tmp/kernel"
  for d in "${kdebs[@]}"; do
    # shellcheck disable=SC2086 # PKG VERSION SHA256
    guest_as_root cp "$(fetch_deb $d)" "$tree/tmp/kernel/"
  done
  # dpkg as on an installed system (DKMS's kernel hooks want /proc).
  guest_as_root mount -t proc proc "$tree/proc"
  rc=0
  guest_as_root chroot "$tree" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive sh -c 'dpkg -i /tmp/kernel/*.deb' >"$base/dpkg.log" 2>&1 || rc=$?
  guest_as_root umount "$tree/proc"
  if [ "$rc" != 0 ]; then
    tail -n 30 "$base/dpkg.log" >&2
    guest_die "installing the kernel packages failed (whole log: $base/dpkg.log)"
  fi
  # No login prompt on the console the checks print to; no package caches; no initrd of its own
  # (the test image's boots it). The kernel's image stays, as installed.
  guest_as_root ln -sf /dev/null "$tree/etc/systemd/system/serial-getty@ttyS0.service"
  guest_as_root rm -rf "$tree/tmp/kernel" "$tree/var/cache/apt/archives"/*.deb \
    "$tree/var/lib/apt/lists"/* "$tree"/boot/initrd.img-* "$tree/initrd.img" "$tree/initrd.img.old"
  printf 'guest\n' | guest_as_root tee "$tree/etc/hostname" >/dev/null
  # Room for DKMS's build and the packages: a quarter more than the tree, at least 512 MiB.
  used=$(guest_as_root du -sm "$tree" | cut -f1)
  size=$((used + (used / 4 > 512 ? used / 4 : 512)))
  rm -f "$base/root.img.tmp"
  truncate -s "${size}M" "$base/root.img.tmp"
  guest_as_root mkfs.ext4 -q -F -L debian12 -d "$tree" "$base/root.img.tmp" ||
    guest_die "mkfs.ext4 -d $tree failed"
  mv "$base/root.img.tmp" "$base/root.img"
  guest_as_root rm -rf "$tree"
  guest_log "image $base/root.img: $size MiB, made in $((SECONDS - t_image)) s"
fi

# This run's files, copied onto the root by the initramfs (a second cpio after the first).
over="$dir/overlay/overlay"
mkdir -p "$over/root" "$over/etc" "$over/usr/local/sbin"
cp "$dkms_deb" "$over/root/virtio-rdma-dkms.deb"
cp "$provider_deb" "$over/root/ibverbs-providers-virtio-rdma.deb"
guest_tools virtio_rdma0 >"$over/etc/tools.sh"
install -m 0755 guest/dkms-check.sh "$over/usr/local/sbin/dkms-check"
# SIGPIPE as in an administrator's shell: dkms's `[ -e <(echo) ]` prints "write error: Broken
# pipe" under systemd's default of ignoring it.
guest_check_unit "$over" dkms-check "Checks of the guest packages (scripts/qemu-dkms.sh)" \
  /usr/local/sbin/dkms-check IgnoreSIGPIPE=no
(cd "$dir/overlay" && find . | cpio -o -H newc -R 0:0 --quiet) | gzip -1 >"$dir/overlay.cpio.gz"
cat "$GUEST_CACHE/images/dkms-boot/initramfs.img" "$dir/overlay.cpio.gz" >"$dir/initrd.gz"

# The daemon, its VM paired with the guest's virtio-net MAC (the RoCE port's interface).
mac=52:54:00:12:34:56
printf '[[tenant]]\nname = "t"\n\n[[vm]]\nname = "vm0"\nsocket = "%s"\ntenant = "t"\nmac = "%s"\n' \
  "$dir/vm0.sock" "$mac" >"$dir/config.toml"
launch_daemon --wait "$dir/vm0.sock" --config "$dir/config.toml"

echo "== qemu-dkms: booting Debian 12 from its disk, installing $(basename "$dkms_deb") and $(basename "$provider_deb")"
t_boot=$SECONDS
rc=0
launch_guest guest --image dkms-boot --initrd "$dir/initrd.gz" --disk "$base/root.img" \
  --mem 2G --smp 2 --append 'guest.root=/dev/vda systemd.show_status=0' -- \
  -chardev "socket,id=rdma,path=$dir/vm0.sock" -device vhost-user-rdma-pci,chardev=rdma \
  -netdev "stream,id=n0,server=on,addr.type=unix,addr.path=$dir/net.sock" \
  -device "virtio-net-pci,netdev=n0,mac=$mac"
launch_wait "$launch_pid" || rc=$?
console="$dir/guest.console"

# Every step's verdict, in the order the guest ran them.
labels=("dpkg -i virtio-rdma-dkms" "modprobe virtio_rdma" "no provider yet" "dpkg -i the provider"
  "ibv_devices, ibv_devinfo" "ibv_rc_pingpong" "dpkg -r the provider" "dpkg -P the provider"
  "dpkg -r virtio-rdma-dkms")
check_steps "$console" "${labels[@]}"
warnings=$(tr -d '\r' <"$console" | sed -n 's/^KERNEL-WARNINGS: \([0-9]*\)$/\1/p')
if [ "${warnings:-x}" = 0 ]; then ok "no kernel warnings"; else failed "kernel warnings: ${warnings:-?}"; fi
if [ "$rc" = 0 ]; then ok "the guest's checks (exit 0)"; else failed "the guest's checks (exit $rc)"; fi
if [ "$fail" -gt 0 ] || [ "$keep" = 1 ]; then
  show_log "guest console" "$console"
  show_log "run-guest.sh" "$dir/guest.out"
  show_log "daemon log" "$dir/daemon.log"
fi
echo "== qemu-dkms: packages and images $((t_packages - t_start)) s, disk image and guest" \
  "$((SECONDS - t_packages)) s (the guest $((SECONDS - t_boot)) s); whole run $((SECONDS - t_start)) s"
verdict qemu-dkms
