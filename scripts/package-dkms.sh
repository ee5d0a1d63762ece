#!/usr/bin/env bash
# Builds the DKMS package of the Linux guest driver: target/debian/virtio-rdma-dkms_<version>-1_all.deb
# (the version is the workspace's, Cargo.toml). It holds the sources of guest-driver/linux in
# /usr/src/virtio-rdma-<version>/ with the dkms.conf of dist/dkms/; its postinst adds them to
# DKMS, which builds and installs virtio_rdma.ko for every installed kernel that has its headers
# (and, through DKMS's kernel hooks, for kernels installed later); its prerm removes the module
# from every kernel. Kernels: Linux 6.1 (Debian 12) and 6.12 (Debian 13), the two the driver is
# built and tested on (dkms.conf's BUILD_EXCLUSIVE_KERNEL; DKMS skips others). Depends: dkms;
# the kernel's headers package (linux-headers-amd64) is the user's to install, as for any DKMS
# package. scripts/qemu-dkms.sh installs it in a Debian 12 guest. Prints the package's path.
#
# Usage: bash scripts/package-dkms.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh

guest_need_pkgs dpkg xz-utils

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || guest_die "no version in Cargo.toml"
# DKMS's BUILD_EXCLUSIVE_KERNEL: a regular expression on the kernel release (uname -r).
kernels='^6\.(1|12)\.'
pkg=virtio-rdma-dkms
out_dir=target/debian
stage=target/dkms/$pkg
rm -rf "$stage"
src="$stage/usr/src/virtio-rdma-$version"
doc="$stage/usr/share/doc/$pkg"
mkdir -p "$src/uapi" "$stage/DEBIAN" "$doc" "$out_dir"
# The module's sources as build-kmod.sh builds them: the C files, headers and Kbuild.
cp guest-driver/linux/*.c guest-driver/linux/*.h guest-driver/linux/Kbuild "$src/"
cp guest-driver/linux/uapi/*.h "$src/uapi/"
sed -e "s/@VERSION@/$version/" -e "s/@KERNELS@/${kernels//\\/\\\\}/" dist/dkms/dkms.conf.in \
  >"$src/dkms.conf"
grep -qF "BUILD_EXCLUSIVE_KERNEL=\"$kernels\"" "$src/dkms.conf" || guest_die "dkms.conf: kernels not set"
for s in postinst prerm; do
  sed "s/@VERSION@/$version/" "dist/dkms/$s" >"$stage/DEBIAN/$s"
  chmod 0755 "$stage/DEBIAN/$s"
done
cp dist/guest-copyright "$doc/copyright"
cp guest-driver/README.md "$doc/"
chmod -R u=rwX,go=rX "$stage"
cat >"$stage/DEBIAN/control" <<EOF
Package: $pkg
Version: $version-1
Architecture: all
Section: kernel
Priority: optional
Maintainer: vhost-user-rdma maintainers <maintainers@vhost-user-rdma.invalid>
Depends: dkms (>= 3.0)
Recommends: linux-headers-amd64 | linux-headers-generic | linux-headers
Suggests: ibverbs-providers-virtio-rdma
Installed-Size: $(du -sk "$stage/usr" | cut -f1)
Description: virtio RDMA device driver (virtio_rdma.ko) in DKMS source form
 The Linux guest driver of the virtio RDMA device (virtio device type 42) that
 vhost-user-rdma gives virtual machines: an ib_core verbs device, so that
 unmodified RDMA software runs in the guest through the virtio_rdma provider
 of rdma-core (package ibverbs-providers-virtio-rdma).
 .
 DKMS builds the module for every installed kernel with its headers, and for
 each new kernel after: Linux 6.1 (Debian 12) and 6.12 (Debian 13), the
 kernels the driver is built and tested on; DKMS skips other kernels.
EOF
deb="$out_dir/${pkg}_${version}-1_all.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
printf '%s\n' "$deb"
