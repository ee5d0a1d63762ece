# shellcheck shell=bash
# Pinned Debian packages the guest image is built from. Each may be overridden from the
# environment (then give the matching digest too: `apt-cache show PKG=VERSION | grep SHA256`).
# The kernel is bookworm's point-release kernel (also in bookworm-security).

: "${GUEST_KERNEL_PKG:=linux-image-6.1.0-50-amd64}"
: "${GUEST_KERNEL_VERSION:=6.1.176-1}"
: "${GUEST_KERNEL_SHA256:=7b5597492a0a65aee61985a492e6bcc3f2cde830072a0e3b3d8c7e1b90279bd3}"

# What out-of-tree modules for that kernel build against (scripts/build-kmod.sh): pinned as one
# set with the image. The headers of an ABI are only published for some (bookworm point
# releases, not every security update), so never move one without the others.
: "${GUEST_KHEADERS_PKG:=linux-headers-6.1.0-50-amd64}"
: "${GUEST_KHEADERS_SHA256:=91a7929ce639f4199e9ff7f929236cdfdcb5511dba613af5094369e95ca241da}"
: "${GUEST_KHEADERS_COMMON_PKG:=linux-headers-6.1.0-50-common}"
: "${GUEST_KHEADERS_COMMON_SHA256:=7f6f7bee50efbc36dc02c976be5982b96cf36abe544f03f09368e98cfcc5ac3b}"
: "${GUEST_KBUILD_PKG:=linux-kbuild-6.1}"
: "${GUEST_KBUILD_SHA256:=667d2e1e94047031c3bcefa4bb67c2520bbc3cc1cce0aa592e67b108dbbead03}"
# The kernel source of the same release, for scripts/checkpatch.sh only (139 MB, cached).
: "${GUEST_KSOURCE_PKG:=linux-source-6.1}"
: "${GUEST_KSOURCE_SHA256:=9305d1a151b8e83dcb88aa11361e7b9513f0c252bdf7f5647e4542762d99c094}"

# Debian 13 (trixie)'s kernel, for the driver on the kernel trixie users run
# (scripts/build-kmod.sh --kernel 6.12, scripts/build-guest.sh --kernel 6.12): the image, its
# headers, -common and linux-kbuild of trixie's point release, pinned as one set like the 6.1
# ones above. They come from the Debian archive through an apt of their own (guest_trixie_apt in
# guest/lib.sh; the host's apt sources stay as they are): `guest_trixie_apt show PKG`. Trixie's
# kbuild tools and gcc-14 need trixie's C library, so the module is built in a trixie build root
# (debootstrap, cached; see build-kmod.sh). guest_select_kernel 6.12 makes these the GUEST_K*
# variables the scripts use.
: "${GUEST612_KERNEL_PKG:=linux-image-6.12.117+deb13-amd64}"
: "${GUEST612_KERNEL_VERSION:=6.12.117-1}"
: "${GUEST612_KERNEL_SHA256:=ca712d36790184f6ac125ce2b20ea4e2202ae6bb7817b7de268f1f0115ccda73}"
: "${GUEST612_KHEADERS_PKG:=linux-headers-6.12.117+deb13-amd64}"
: "${GUEST612_KHEADERS_SHA256:=e6b8a30d6c834fad8e5bd83d7bbe319279ed45f01d663926f886e353e004871a}"
: "${GUEST612_KHEADERS_COMMON_PKG:=linux-headers-6.12.117+deb13-common}"
: "${GUEST612_KHEADERS_COMMON_SHA256:=ac1203a8778a01e09c0ef94d87a3607672c0fc3d5369540c3f1580269b277611}"
: "${GUEST612_KBUILD_PKG:=linux-kbuild-6.12.117+deb13}"
: "${GUEST612_KBUILD_SHA256:=821ae105a5e2d04c68ddc1a446b8b3554cb4e4581bf009c4165f94612047e3eb}"

# guest_select_kernel 6.1|6.12: the guest kernel the sourcing script builds for. 6.1 (the
# default) leaves the variables above as they are; 6.12 sets GUEST_KERNEL_*, GUEST_KHEADERS_*
# and GUEST_KBUILD_* to the GUEST612_* set. GUEST_KERNEL_SUITE is the suite the packages come
# from (bookworm: the host's own apt; trixie: guest_trixie_apt).
GUEST_KERNEL_SUITE=bookworm
guest_select_kernel() {
  case "$1" in
  6.1) GUEST_KERNEL_SUITE=bookworm ;;
  6.12)
    GUEST_KERNEL_SUITE=trixie
    GUEST_KERNEL_PKG=$GUEST612_KERNEL_PKG
    GUEST_KERNEL_VERSION=$GUEST612_KERNEL_VERSION
    GUEST_KERNEL_SHA256=$GUEST612_KERNEL_SHA256
    GUEST_KHEADERS_PKG=$GUEST612_KHEADERS_PKG
    GUEST_KHEADERS_SHA256=$GUEST612_KHEADERS_SHA256
    GUEST_KHEADERS_COMMON_PKG=$GUEST612_KHEADERS_COMMON_PKG
    GUEST_KHEADERS_COMMON_SHA256=$GUEST612_KHEADERS_COMMON_SHA256
    GUEST_KBUILD_PKG=$GUEST612_KBUILD_PKG
    GUEST_KBUILD_SHA256=$GUEST612_KBUILD_SHA256
    ;;
  *) return 1 ;;
  esac
}

: "${GUEST_BUSYBOX_PKG:=busybox-static}"
: "${GUEST_BUSYBOX_VERSION:=1:1.35.0-4+deb12u1+b1}"
: "${GUEST_BUSYBOX_SHA256:=3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744}"

# rdma-core for the guest (scripts/build-rdma-core.sh): libibverbs, our provider and the example
# tools are built from one tree, since the provider ABI of libibverbs is private. The Debian
# archive serves the upstream tarball (the .dsc is gone); the digest is that of trixie's Sources.
: "${GUEST_RDMA_CORE_VERSION:=56.1}"
: "${GUEST_RDMA_CORE_URL:=http://deb.debian.org/debian/pool/main/r/rdma-core/rdma-core_56.1.orig.tar.gz}"
: "${GUEST_RDMA_CORE_SHA256:=63ce7f2baa7242c2dbc76375dac957c420187dd27f8c5e148efc07971ee522a8}"

# perftest (scripts/qemu-pingpong.sh): Debian's unmodified binaries, run against the libibverbs,
# librdmacm and libibumad of the rdma-core tree above, and libpci3 with the libraries it needs
# (its pci.ids dependency is data for names only, which perftest does not print).
: "${GUEST_PERFTEST_VERSION:=4.5+0.17-1}"
: "${GUEST_PERFTEST_SHA256:=d5bb8f968762295021e89548b983953787047676a406cc38f98559cc5332fcdb}"
: "${GUEST_LIBPCI_VERSION:=1:3.9.0-4}"
: "${GUEST_LIBPCI_SHA256:=75519023eb1f0cdc556709b109765e2ea36f6e5c66b8ca94cec45843b3e3bee7}"
: "${GUEST_LIBUDEV_VERSION:=252.39-1~deb12u2}"
: "${GUEST_LIBUDEV_SHA256:=6f7e08f11c4809d2e5998c775f7b423ab5ec2ce0309494b4a2615037052245e2}"
: "${GUEST_ZLIB_VERSION:=1:1.2.13.dfsg-1}"
: "${GUEST_ZLIB_SHA256:=d7dd1d1411fedf27f5e27650a6eff20ef294077b568f4c8c5e51466dc7c08ce4}"

# nvme-cli (scripts/qemu-cm.sh's NVMe over Fabrics initiator): Debian bookworm's binary as it is,
# with libnvme1 and libjson-c5; the other libraries it links (libdbus-1-3, libssl3) come from the
# host's packages of those names (scripts/fetch-nvme-cli.sh). Its uuid-runtime dependency only
# writes /etc/nvme/hostnqn at install time: the guests pass --hostnqn instead.
: "${GUEST_NVME_CLI_VERSION:=2.4+really2.3-3}"
: "${GUEST_NVME_CLI_SHA256:=2ccd90667466894f13b343818a64b47af72ce905cfe34ef583763f1d4877a4b2}"
: "${GUEST_LIBNVME_VERSION:=1.3-1+deb12u1}"
: "${GUEST_LIBNVME_SHA256:=5f64622b7d8024293bc07919abcd554ed7c62110c1fac5fcc4f595275153e8de}"
: "${GUEST_LIBJSONC_VERSION:=0.16-2}"
: "${GUEST_LIBJSONC_SHA256:=d0e1ed8637d1c26b9720f6057d6355f18378bba5cc2553e459d1632783c00d70}"
