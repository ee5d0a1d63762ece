#!/usr/bin/env bash
# Builds the rdma-core provider of the virtio RDMA device as a Debian 12 package:
# target/debian/ibverbs-providers-virtio-rdma_<version>-1_amd64.deb, holding
#   /usr/lib/x86_64-linux-gnu/libibverbs/libvirtio_rdma-rdmav34.so  the provider, and
#   /etc/libibverbs.d/virtio_rdma.driver                            which names it to libibverbs,
# for Debian 12's own libibverbs1 (rdma-core 44.0-2): no libibverbs of ours goes with it.
#
# A provider uses libibverbs' private interface (infiniband/driver.h, the IBVERBS_PRIVATE_34
# symbols), so it is built for the libibverbs it will load into. The build runs in a Debian 12
# build root (debootstrap --variant=minbase with the compiler, cmake and bookworm's
# libibverbs-dev; made once, cached), where:
#   - libibverbs' public headers (infiniband/verbs.h, ...) are bookworm's, from libibverbs-dev
#     44.0-2, so every structure the provider shares with libibverbs has 44's layout;
#   - the private headers (driver.h, kern-abi.h, util/, ccan/) and config.h come from the rdma-core
#     tree of scripts/build-rdma-core.sh (56.1, guest/versions.sh; configured in the build root),
#     because the Debian archive no longer serves rdma-core 44.0's upstream tarball. Between 44.0
#     and 56.1 driver.h changed no structure; it gained functions (ibv_cmd_create_cq_ex2,
#     ibv_cmd_modify_cq, ...) and ibv_cmd_reg_dmabuf_mr gained a parameter, none of which the
#     provider uses;
#   - it is linked against bookworm's libibverbs.so.1 with --no-undefined, so any symbol that 44's
#     library lacks fails the build, and the script checks that the provider imports nothing but
#     libibverbs' and the C library's symbols;
#   - the FLUSH work request (rdma-core 45) is left out: VRDMA_NO_WR_FLUSH (virtio_rdma/qp_ex.c).
# Depends: from dpkg-shlibdeps in the build root, libibverbs1 raised to (>= 44.0). Prints the
# package's path. scripts/qemu-dkms.sh installs it in a Debian 12 guest and runs verbs through it.
#
# Usage: bash scripts/package-provider.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh

guest_need_pkgs curl ca-certificates debootstrap debian-archive-keyring dpkg coreutils
provider=guest-driver/rdma-core/virtio_rdma
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || guest_die "no version in Cargo.toml"
pkg=ibverbs-providers-virtio-rdma
# The rdma-core release whose libibverbs the package is for (Debian 12's).
target_rdma_core=44.0-2

# The build root, once per package set.
root_pkgs="gcc,libc6-dev,cmake,ninja-build,pkg-config,python3,dpkg-dev,libibverbs-dev,libnl-3-dev,libnl-route-3-dev"
root="$GUEST_CACHE/build-root/bookworm-$(printf '%s\n' bookworm "$root_pkgs" | sha256sum | cut -c1-12)"
if [ ! -f "$root/.done" ]; then
  uri=$(_guest_bookworm_uri) || guest_die "no apt source for Debian bookworm found"
  guest_as_root rm -rf "$root"
  mkdir -p "$(dirname "$root")" "$GUEST_CACHE/tmp"
  guest_log "creating a Debian 12 build root in $root ($root_pkgs)"
  log="$GUEST_CACHE/tmp/debootstrap-provider.log"
  if ! guest_as_root nice debootstrap --variant=minbase --include="$root_pkgs" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg bookworm "$root" "$uri" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    guest_die "debootstrap of the build root failed (whole log: $log)"
  fi
  guest_as_root rm -rf "$root/var/cache/apt/archives"/*.deb
  guest_as_root touch "$root/.done"
fi
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
got=$(guest_as_root chroot "$root" dpkg-query -W -f='${Version}' libibverbs-dev)
[ "$got" = "$target_rdma_core" ] ||
  guest_die "the build root has libibverbs-dev $got, not $target_rdma_core: update target_rdma_core"

# The rdma-core tree (the tarball scripts/build-rdma-core.sh builds, pinned and verified).
ver=$GUEST_RDMA_CORE_VERSION
tarball="$GUEST_CACHE/downloads/rdma-core_$ver.orig.tar.gz"
mkdir -p "$GUEST_CACHE/downloads"
if [ ! -f "$tarball" ]; then
  guest_log "downloading $GUEST_RDMA_CORE_URL"
  curl -sSfL -o "$tarball.part" "$GUEST_RDMA_CORE_URL"
  mv "$tarball.part" "$tarball"
fi
[ "$(sha256sum "$tarball" | cut -d' ' -f1)" = "$GUEST_RDMA_CORE_SHA256" ] ||
  guest_die "$tarball: not rdma-core $ver's (sha256 differs from guest/versions.sh)"

b="$root/build/provider"
guest_as_root rm -rf "$b"
guest_as_root mkdir -p "$b/src"
guest_as_root tar -xzf "$tarball" -C "$b/src" --strip-components=1
# The provider registered with the tree as scripts/build-rdma-core.sh does it.
guest_as_root sed -i 's|^add_subdirectory(providers/siw)$|&\nadd_subdirectory(providers/virtio_rdma)|' \
  "$b/src/CMakeLists.txt"
guest_as_root sed -i 's|^  rdma/siw-abi.h$|&\n  rdma/virtio_rdma-abi.h|' "$b/src/kernel-headers/CMakeLists.txt"
guest_as_root cp -r "$provider" "$b/src/providers/virtio_rdma"
guest_as_root cp guest-driver/linux/uapi/virtio_rdma-abi.h "$b/src/kernel-headers/rdma/"
guest_as_root cp guest-driver/linux/virtio_rdma_abi.h "$b/src/providers/virtio_rdma/"

# In the build root: configure the tree, build what the provider's headers are generated by and
# the static helpers it links (ccan, util), then the provider itself against bookworm's
# libibverbs: its public headers first on the include path, its library to link.
guest_as_root tee "$b/build.sh" >/dev/null <<'EOF'
set -eu
cd /build/provider
mkdir build
cd build
cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu \
  -DCMAKE_INSTALL_SYSCONFDIR=/etc ../src >cmake.log
ninja ccan/libccan_pic.a util/librdma_util_pic.a \
  $(ninja -t targets all | sed -n 's|^\(include/kernel-abi/[^:]*[.]h\): .*|\1|p') >ninja.log
# The tree's headers, with libibverbs' public ones replaced by bookworm's (libibverbs-dev).
cp -rL include ../include
for h in $(dpkg-query -L libibverbs-dev | grep '^/usr/include/infiniband/[^/]*[.]h$'); do
  cp "$h" ../include/infiniband/
done
mkdir ../obj
for c in ../src/providers/virtio_rdma/*.c; do
  cc -DVRDMA_NO_WR_FLUSH -I../include -I/usr/include/libnl3 -std=gnu11 -O2 -g -fPIC \
    -Wall -Wextra -Werror -Wno-sign-compare -Wno-unused-parameter -Wmissing-prototypes \
    -Wmissing-declarations -Wwrite-strings -Wformat=2 -Wshadow -Wstrict-prototypes \
    -Wold-style-definition -Wredundant-decls -c "$c" -o "../obj/$(basename "$c" .c).o"
done
cc -shared -fPIC -Wl,--as-needed -Wl,--no-undefined -Wl,-z,relro -Wl,-z,now \
  -Wl,--version-script,../src/buildlib/provider.map -o ../libvirtio_rdma-rdmav34.so \
  ../obj/*.o ccan/libccan_pic.a util/librdma_util_pic.a -libverbs
EOF
log="$GUEST_CACHE/tmp/package-provider.log"
if ! guest_as_root nice chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
  sh /build/provider/build.sh >"$log" 2>&1; then
  cat "$log" >&2
  for f in cmake.log ninja.log; do
    [ ! -f "$b/build/$f" ] || tail -n 30 "$b/build/$f" >&2
  done
  guest_die "the provider's build against bookworm's libibverbs failed"
fi
so="$b/libvirtio_rdma-rdmav34.so"

# What it imports: libibverbs' public (IBVERBS_1.x) and private (IBVERBS_PRIVATE_34) symbols
# and the C library's, nothing else (weak references aside: the C runtime's).
imports=$(guest_as_root chroot "$root" objdump -T /build/provider/libvirtio_rdma-rdmav34.so |
  awk '/[*]UND[*]/ && $2 != "w" { v = $(NF - 1); gsub(/[()]/, "", v); print v }' | sort -u)
bad=$(grep -vE '^(IBVERBS_1\.[0-9]+|IBVERBS_PRIVATE_34|GLIBC_[0-9.]+)$' <<<"$imports" | grep . || true)
[ -z "$bad" ] || guest_die "the provider imports symbols of other versions: $bad"
guest_log "provider imports: $(tr '\n' ' ' <<<"$imports")"

stage=target/provider/$pkg
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage/usr/lib/x86_64-linux-gnu/libibverbs" "$stage/etc/libibverbs.d" \
  "$stage/usr/share/doc/$pkg"
install -m 0644 "$so" "$stage/usr/lib/x86_64-linux-gnu/libibverbs/"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$stage/usr/lib/x86_64-linux-gnu/libibverbs/libvirtio_rdma-rdmav34.so"
printf 'driver virtio_rdma\n' >"$stage/etc/libibverbs.d/virtio_rdma.driver"
cp dist/guest-copyright "$stage/usr/share/doc/$pkg/copyright"
printf '/etc/libibverbs.d/virtio_rdma.driver\n' >"$stage/DEBIAN/conffiles"
# The libraries the provider needs, as Debian's symbols files of the build root state them.
guest_as_root mkdir -p "$b/pkg/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: amd64\n' "$pkg" "$pkg" |
  guest_as_root tee "$b/pkg/debian/control" >/dev/null
guest_as_root cp "$so" "$b/pkg/"
shlibs=$(guest_as_root chroot "$root" sh -c \
  'cd /build/provider/pkg && dpkg-shlibdeps -O libvirtio_rdma-rdmav34.so 2>/dev/null' |
  sed -n 's/^shlibs:Depends=//p')
grep -q 'libibverbs1 (' <<<"$shlibs" || guest_die "dpkg-shlibdeps: no libibverbs1 in '$shlibs'"
# Its libibverbs1 version: the one the provider was built for (shlibdeps knows only when the
# private symbols appeared, not that the public structures are 44's).
# shellcheck disable=SC2001 # a bracket expression
shlibs=$(sed 's/libibverbs1 ([^)]*)/libibverbs1 (>= 44.0)/' <<<"$shlibs")
chmod -R u=rwX,go=rX "$stage"
cat >"$stage/DEBIAN/control" <<EOF
Package: $pkg
Version: $version-1
Architecture: amd64
Section: libs
Priority: optional
Maintainer: vhost-user-rdma maintainers <maintainers@vhost-user-rdma.invalid>
Depends: $shlibs
Suggests: virtio-rdma-dkms, ibverbs-utils
Installed-Size: $(du -sk "$stage/usr" "$stage/etc" | awk '{ s += $1 } END { print s }')
Description: rdma-core provider of the virtio RDMA device (libibverbs plugin)
 The user-space half of the virtio RDMA device (virtio device type 42) that
 vhost-user-rdma gives virtual machines: the libibverbs provider that drives
 the verbs devices of the guest driver virtio_rdma.ko (package
 virtio-rdma-dkms), so that unmodified RDMA software runs on them.
 .
 Built for Debian 12's libibverbs (rdma-core $target_rdma_core, provider ABI 34).
EOF
deb="target/debian/${pkg}_${version}-1_amd64.deb"
mkdir -p target/debian
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
printf '%s\n' "$deb"
