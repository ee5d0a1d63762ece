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
