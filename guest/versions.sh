# shellcheck shell=bash
# Pinned Debian packages the guest image is built from. Each may be overridden from the
# environment (then give the matching digest too: `apt-cache show PKG=VERSION | grep SHA256`).
# The kernel is bookworm's point-release kernel (also in bookworm-security).

: "${GUEST_KERNEL_PKG:=linux-image-6.1.0-50-amd64}"
: "${GUEST_KERNEL_VERSION:=6.1.176-1}"
: "${GUEST_KERNEL_SHA256:=7b5597492a0a65aee61985a492e6bcc3f2cde830072a0e3b3d8c7e1b90279bd3}"

: "${GUEST_BUSYBOX_PKG:=busybox-static}"
: "${GUEST_BUSYBOX_VERSION:=1:1.35.0-4+deb12u1+b1}"
: "${GUEST_BUSYBOX_SHA256:=3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744}"
