#!/usr/bin/env bash
# Builds QEMU with the vhost-user-rdma device (qemu-configs/patches/) from
# Debian's source package, for x86_64 system emulation only, and installs it
# into a cache directory outside the checkout.
#
#   bash scripts/build-qemu.sh [--force] [--keep-build] [--no-deps] [--jobs N]
#   bash scripts/build-qemu.sh --print-prefix   # where the build goes; builds nothing
#   bash scripts/build-qemu.sh --qemu 11.1-stock  # Debian's QEMU 11.1.3, unpatched
#
# --qemu SERIES (or QEMU_SERIES=SERIES) chooses what: 10.2 (the default) is
# the build described here; 11.1-stock builds nothing but installs Debian's
# own QEMU 11.1.3 binary package (trixie-backports, pinned by digest) into
# a Debian 13 root in the cache and prints a wrapper that runs it on this
# host. That QEMU has VIRTIO shared memory for vhost-user devices but not
# our device: use -device vhost-user-test-device-pci,virtio-id=39,... (see
# qemu-configs/README.md). A patched 11.1 build needs Debian's 11.1 source,
# which the Debian mirror reachable here does not serve.
#
# Progress and timings go to stderr; the last line on stdout is the path of
# the installed qemu-system-x86_64, so
#
#   QEMU=$(bash scripts/build-qemu.sh | tail -n 1)
#
# works. The install directory is keyed by the QEMU version and a hash of the
# patch series and of this build recipe: a second run with the same inputs
# is a cache hit and returns at once.
#
# Environment:
#   VHOST_USER_RDMA_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma)
#   DEBIAN_MIRROR          Debian archive (default https://deb.debian.org/debian)
#   QEMU_BUILD_JOBS        parallel compile jobs (default: number of cores)
#
# On a fresh Debian 12 machine it installs its own build dependencies with
# apt-get (through sudo when not root) and meson from PyPI into a private
# virtual environment in the cache.
set -euo pipefail

# ---------------------------------------------------------------------------
# What we build. Debian sid's QEMU 10.2.2 source package, pinned by digest.
QEMU_VERSION=10.2.2
DEB_VERSION=1:10.2.2+ds-1        # Debian version (epoch 1)
DSC=qemu_10.2.2+ds-1.dsc
DSC_SHA256=f1684b3aa5ec500c3389d346c6501dee45041ea91656c6556d4da9023b7987dd
ORIG=qemu_10.2.2+ds.orig.tar.xz
ORIG_SHA256=be05230fe47a6937cd29f28f562932c8125f9c93c2a82c625198f7a4aa601dfb
DEBIAN_TAR=qemu_10.2.2+ds-1.debian.tar.xz
DEBIAN_TAR_SHA256=ddf75aceab4f8f77374f3cb34fc97b41514895aeb293ce8b2ddd5e072bb0f5c0
POOL_DIR=pool/main/q/qemu

# Debian's +ds tarball has the prebuilt firmware blobs and the bundled
# Python wheels stripped out. These Debian patches make the build cope with
# that; the rest of Debian's series is packaging or other targets.
DEBIAN_PATCHES=(
  skip-unpack-edk2-blobs.patch
  skip-install-dtb.patch
  disable-pycotap.patch
)

MESON_VERSION=1.9.0               # QEMU 10.2 needs >= 1.5; Debian 12 has 1.0

CONFIGURE_ARGS=(
  --target-list=x86_64-softmmu
  --without-default-features
  --enable-kvm
  --enable-tcg
  --enable-vhost-user
  --enable-pixman
  --enable-fdt=system
  --disable-docs
  --disable-tools
  --disable-guest-agent
  --disable-werror
  --disable-download
  --disable-install-blobs
)

# gcc-multilib: configure builds the x86 option ROMs (linuxboot_dma.bin for
# -kernel, pvh.bin, ...) only if the host compiler links -m32 code.
APT_PACKAGES=(
  gcc libc6-dev gcc-multilib make patch pkg-config ninja-build xz-utils ca-certificates
  libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev
  python3 python3-venv
  seabios ipxe-qemu
  curl util-linux
)

# ---------------------------------------------------------------------------
FORCE=0
KEEP_BUILD=0
INSTALL_DEPS=1
PRINT_PREFIX=0
JOBS=${QEMU_BUILD_JOBS:-$(nproc)}
SERIES=${QEMU_SERIES:-10.2}
while [ $# -gt 0 ]; do
  case "$1" in
    --qemu) SERIES=$2; shift ;;
    --qemu=*) SERIES=${1#--qemu=} ;;
    --force) FORCE=1 ;;
    --keep-build) KEEP_BUILD=1 ;;
    --no-deps) INSTALL_DEPS=0 ;;
    --print-prefix) PRINT_PREFIX=1 ;;
    --jobs) JOBS=$2; shift ;;
    --jobs=*) JOBS=${1#--jobs=} ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-qemu.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH_DIR=$REPO/qemu-configs/patches
MIRROR=${DEBIAN_MIRROR:-https://deb.debian.org/debian}
CACHE_ROOT=${VHOST_USER_RDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma}

# shellcheck source=guest/lib.sh
. "$REPO/guest/lib.sh" # guest_pkg_installed
log() { printf '[build-qemu] %s\n' "$*" >&2; }
die() { printf '[build-qemu] error: %s\n' "$*" >&2; exit 1; }

case "$SERIES" in
  10.2|11.1-stock) ;;
  *) die "unknown --qemu $SERIES (10.2 or 11.1-stock)" ;;
esac

T_START=$(date +%s.%N)
declare -a TIMINGS=()
step_start() { STEP_NAME=$1; STEP_T0=$(date +%s.%N); log "== $STEP_NAME"; }
step_end() {
  local dt
  dt=$(awk -v a="$STEP_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  TIMINGS+=("$(printf '%-10s %8s s' "$STEP_NAME" "$dt")")
  log "   $STEP_NAME took ${dt} s"
}
print_timings() {
  local total
  total=$(awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  log "timings:"
  for t in "${TIMINGS[@]}"; do log "  $t"; done
  log "  $(printf '%-10s %8s s' total "$total")"
}

if [ "$SERIES" = 11.1-stock ]; then
  # shellcheck source=scripts/lib/qemu-stock.sh
  . "$REPO/scripts/lib/qemu-stock.sh"
  qemu_stock_main
  exit 0
fi

shopt -s nullglob
PATCHES=("$PATCH_DIR"/*.patch)
shopt -u nullglob
[ ${#PATCHES[@]} -gt 0 ] || die "no patches in $PATCH_DIR"

# The cache key: version, Debian patches, configure arguments, firmware
# sources and every byte of our patch series.
KEY=$(
  {
    echo "qemu $DEB_VERSION $ORIG_SHA256 $DEBIAN_TAR_SHA256"
    echo "debian-patches ${DEBIAN_PATCHES[*]}"
    echo "configure ${CONFIGURE_ARGS[*]}"
    echo "meson $MESON_VERSION"
    echo "recipe 2 (option ROMs from this build)"
    for p in "${PATCHES[@]}"; do
      printf '%s ' "$(basename "$p")"
      sha256sum < "$p"
    done
  } | sha256sum | cut -c1-12
)
PREFIX=$CACHE_ROOT/qemu-$QEMU_VERSION-$KEY
QEMU_BIN=$PREFIX/bin/qemu-system-x86_64
if [ $PRINT_PREFIX -eq 1 ]; then
  echo "$PREFIX"
  exit 0
fi
if [ -n "${RDMA_PKG_PLAN:-}" ]; then # scripts/check-prereqs.sh: what would be installed
  for p in "${APT_PACKAGES[@]}"; do
    guest_pkg_installed "$p" || echo "$p" >>"$RDMA_PKG_PLAN"
  done
  exit 0
fi

if [ $FORCE -eq 0 ] && [ -f "$PREFIX/BUILD-INFO" ] && [ -x "$QEMU_BIN" ]; then
  log "cache hit: $PREFIX"
  print_timings
  echo "$QEMU_BIN"
  exit 0
fi

mkdir -p "$CACHE_ROOT/downloads"
exec 9>"$CACHE_ROOT/.lock-$KEY"
if ! flock -n 9; then
  log "another build of $KEY is running; waiting for it"
  flock 9
  if [ $FORCE -eq 0 ] && [ -f "$PREFIX/BUILD-INFO" ] && [ -x "$QEMU_BIN" ]; then
    log "cache hit after waiting: $PREFIX"
    echo "$QEMU_BIN"
    exit 0
  fi
fi

log "building QEMU $QEMU_VERSION (Debian $DEB_VERSION) with ${#PATCHES[@]} patches"
log "install prefix: $PREFIX"

# ---------------------------------------------------------------------------
step_start deps
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || SUDO_MISSING=1
  SUDO=(sudo)
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  guest_pkg_installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ $INSTALL_DEPS -eq 1 ] || die "missing packages (run without --no-deps): ${missing[*]}"
  [ -z "${SUDO_MISSING:-}" ] || die "not root and no sudo; install: ${missing[*]}"
  log "apt-get install ${missing[*]}"
  "${SUDO[@]}" apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2
fi
# meson from PyPI in a private venv, on the system Python (QEMU's configure
# nests its own venv inside it and finds meson there).
SYS_PYTHON=/usr/bin/python3
[ -x "$SYS_PYTHON" ] || SYS_PYTHON=$(command -v python3)
VENV=$CACHE_ROOT/pyvenv-meson-$MESON_VERSION
if ! "$VENV/bin/python3" -c 'import mesonbuild' 2>/dev/null; then
  log "creating $VENV with meson==$MESON_VERSION"
  rm -rf "$VENV"
  "$SYS_PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "meson==$MESON_VERSION" >&2
fi
step_end

# ---------------------------------------------------------------------------
step_start fetch
fetch() { # url dest
  curl -fsSL --retry 3 -o "$2.part" "$1"
  mv "$2.part" "$2"
}
verify() { # file sha256
  echo "$2  $1" | sha256sum -c --status
}
for spec in "$DSC:$DSC_SHA256" "$ORIG:$ORIG_SHA256" "$DEBIAN_TAR:$DEBIAN_TAR_SHA256"; do
  f=${spec%%:*}; sum=${spec#*:}
  dest=$CACHE_ROOT/downloads/$f
  if [ -f "$dest" ] && verify "$dest" "$sum"; then
    log "   $f: cached, sha256 ok"
    continue
  fi
  log "   downloading $MIRROR/$POOL_DIR/$f"
  fetch "$MIRROR/$POOL_DIR/$f" "$dest" || die "download of $f failed"
  verify "$dest" "$sum" || { rm -f "$dest"; die "sha256 mismatch for $f (expected $sum)"; }
  log "   $f: sha256 ok"
done
# The .dsc must list the same tarball digests we pinned.
for spec in "$ORIG:$ORIG_SHA256" "$DEBIAN_TAR:$DEBIAN_TAR_SHA256"; do
  grep -q "^ ${spec#*:} [0-9]* ${spec%%:*}\$" "$CACHE_ROOT/downloads/$DSC" \
    || die "$DSC does not list ${spec%%:*} with sha256 ${spec#*:}"
done
step_end

# ---------------------------------------------------------------------------
# The build tree of this key survives a failed run, and a rerun goes on
# from the last step that completed (stamps in $WORK); --force starts over.
WORK=$CACHE_ROOT/build/qemu-$QEMU_VERSION-$KEY
SRC=$WORK/src
BUILD=$WORK/build
[ $FORCE -eq 0 ] || rm -rf "$WORK"

unpack() {
  rm -rf "$WORK"
  mkdir -p "$SRC"
  tar -xf "$CACHE_ROOT/downloads/$ORIG" -C "$SRC" --strip-components=1
  tar -xf "$CACHE_ROOT/downloads/$DEBIAN_TAR" -C "$SRC"
  for p in "${DEBIAN_PATCHES[@]}"; do
    log "   debian/patches/$p"
    patch -d "$SRC" -p1 -s --no-backup-if-mismatch -i "$SRC/debian/patches/$p"
  done
  for p in "${PATCHES[@]}"; do
    log "   $(basename "$p")"
    patch -d "$SRC" -p1 -s --no-backup-if-mismatch -i "$p"
  done
}

configure() {
  mkdir -p "$BUILD"
  (
    cd "$BUILD"
    nice -n 10 "$SRC/configure" --prefix="$PREFIX" --python="$VENV/bin/python3" \
      "${CONFIGURE_ARGS[@]}"
  ) > "$WORK/configure.log" 2>&1 \
    || { tail -n 40 "$WORK/configure.log" >&2; die "configure failed (log: $WORK/configure.log)"; }
  [ -f "$BUILD/pc-bios/optionrom/config.mak" ] \
    || die "configure found no compiler for the x86 option ROMs (is gcc-multilib installed?)"
}

step_start unpack
if [ -f "$WORK/.unpacked" ]; then
  log "   reusing $SRC"
else
  unpack
  touch "$WORK/.unpacked"
fi
step_end

# ---------------------------------------------------------------------------
step_start configure
if [ -f "$WORK/.configured" ]; then
  log "   reusing $BUILD"
else
  configure
  touch "$WORK/.configured"
fi
step_end

# ---------------------------------------------------------------------------
step_start ninja
log "   ninja -j$JOBS (log: $WORK/ninja.log)"
nice -n 10 ninja -C "$BUILD" -j"$JOBS" > "$WORK/ninja.log" 2>&1 &
NINJA_PID=$!
while kill -0 "$NINJA_PID" 2>/dev/null; do
  for _ in $(seq 60); do kill -0 "$NINJA_PID" 2>/dev/null || break; sleep 1; done
  kill -0 "$NINJA_PID" 2>/dev/null && log "   $(grep -o '^\[[0-9]*/[0-9]*\]' "$WORK/ninja.log" | tail -n 1)"
done
wait "$NINJA_PID" || { tail -n 40 "$WORK/ninja.log" >&2; die "ninja failed (log: $WORK/ninja.log)"; }
# The x86 option ROMs (linuxboot_dma.bin for -kernel, pvh.bin, ...) are
# built by make, not ninja.
nice -n 10 make -C "$BUILD/pc-bios/optionrom" >> "$WORK/ninja.log" 2>&1 \
  || { tail -n 20 "$WORK/ninja.log" >&2; die "option ROM build failed"; }
step_end

# ---------------------------------------------------------------------------
step_start install
rm -rf "$PREFIX"
ninja -C "$BUILD" install > "$WORK/install.log" 2>&1 \
  || { tail -n 20 "$WORK/install.log" >&2; die "install failed (log: $WORK/install.log)"; }
DATADIR=$PREFIX/share/qemu
mkdir -p "$DATADIR"
# Firmware: option ROMs from this build, SeaBIOS and iPXE from Debian. They
# are copied, not linked, so the tree keeps working if the packages change;
# the binary is relocatable and finds them in ../share/qemu by itself.
for f in "$BUILD"/pc-bios/optionrom/*.bin; do cp "$f" "$DATADIR/"; done
for f in /usr/share/seabios/*.bin; do cp -L "$f" "$DATADIR/"; done
for f in /usr/lib/ipxe/qemu/*.rom; do cp -L "$f" "$DATADIR/"; done
[ -f "$DATADIR/bios-256k.bin" ] || die "no SeaBIOS image (package seabios)"
[ -f "$DATADIR/linuxboot_dma.bin" ] || die "no linuxboot_dma.bin option ROM"
step_end

# ---------------------------------------------------------------------------
step_start check
"$QEMU_BIN" -device help 2>&1 | grep '"vhost-user-rdma-pci"' >/dev/null \
  || die "vhost-user-rdma-pci missing from -device help"
# Start a q35 machine far enough to load the firmware, then quit over QMP.
printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-status"}' '{"execute":"quit"}' \
  | timeout 60 "$QEMU_BIN" -machine q35 -accel tcg -m 64M -nodefaults -display none -S \
      -qmp stdio > "$WORK/check.log" 2>&1 \
  || { cat "$WORK/check.log" >&2; die "QEMU failed to start a q35 machine"; }
grep -q '"status": "prelaunch"' "$WORK/check.log" \
  || { cat "$WORK/check.log" >&2; die "unexpected QMP answer"; }
"$QEMU_BIN" --version | head -n 1 >&2
step_end

{
  echo "qemu $QEMU_VERSION (Debian source $DEB_VERSION)"
  echo "orig $ORIG sha256 $ORIG_SHA256"
  echo "debian $DEBIAN_TAR sha256 $DEBIAN_TAR_SHA256"
  echo "debian patches: ${DEBIAN_PATCHES[*]}"
  echo "patches:"
  for p in "${PATCHES[@]}"; do echo "  $(sha256sum < "$p" | cut -c1-16) $(basename "$p")"; done
  echo "configure: ${CONFIGURE_ARGS[*]}"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "timings:"
  for t in "${TIMINGS[@]}"; do echo "  $t"; done
} > "$PREFIX/BUILD-INFO"

if [ $KEEP_BUILD -eq 0 ]; then
  rm -rf "$WORK"
else
  log "build tree kept: $WORK"
fi
print_timings
echo "$QEMU_BIN"
