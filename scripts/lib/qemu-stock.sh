# shellcheck shell=bash
# scripts/build-qemu.sh --qemu 11.1-stock: Debian's own QEMU 11.1 binary, unpatched, installed
# into a Debian 13 (trixie) root in the cache, with a wrapper that runs it on this host.
#
# Why a root: Debian 13's qemu-system-x86 needs trixie's C library (>= 2.38) and libraries, and
# the host is Debian 12. The wrapper starts the binary through the root's dynamic loader with
# the root's library path, so QEMU runs as an ordinary host process (same file system, same
# sockets, no chroot); -L points it at the root's firmware and QEMU_MODULE_DIR at its modules.
# Sourced by build-qemu.sh, whose log, die, step_start, step_end, print_timings, FORCE,
# INSTALL_DEPS, PRINT_PREFIX and CACHE_ROOT it uses.

# What we install: trixie-backports' QEMU 11.1.3, pinned by the digest of its binary package.
STOCK_QEMU_VERSION=11.1.3
STOCK_DEB_VERSION=1:11.1.3+ds-1~bpo13+1
STOCK_DEB_SHA256=447decc4b3c245edc1d0940bdf97c87e07b2e3bd4b24c4d0c7155d860d52bd5f
STOCK_SUITE=trixie
STOCK_APT_PACKAGES=(debootstrap debian-archive-keyring util-linux)

qemu_stock_main() {
  local key prefix root bin uri log deb got
  key=$(
    {
      echo "stock qemu-system-x86 $STOCK_DEB_VERSION $STOCK_DEB_SHA256 $STOCK_SUITE"
      echo "recipe 1 (debootstrap minbase, loader wrapper)"
    } | sha256sum | cut -c1-12
  )
  prefix=$CACHE_ROOT/qemu-$STOCK_QEMU_VERSION-stock-$key
  root=$prefix/root
  bin=$prefix/bin/qemu-system-x86_64
  if [ "$PRINT_PREFIX" -eq 1 ]; then
    echo "$prefix"
    return 0
  fi
  if [ -n "${RDMA_PKG_PLAN:-}" ]; then
    local p
    for p in "${STOCK_APT_PACKAGES[@]}"; do
      guest_pkg_installed "$p" || echo "$p" >>"$RDMA_PKG_PLAN"
    done
    return 0
  fi
  if [ "$FORCE" -eq 0 ] && [ -f "$prefix/BUILD-INFO" ] && [ -x "$bin" ]; then
    log "cache hit: $prefix"
    print_timings
    echo "$bin"
    return 0
  fi
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock-$key"
  flock 9
  log "installing Debian's QEMU $STOCK_DEB_VERSION (unpatched) into $prefix"

  step_start deps
  local missing=() p
  for p in "${STOCK_APT_PACKAGES[@]}"; do
    guest_pkg_installed "$p" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$INSTALL_DEPS" -eq 1 ] || die "missing packages (run without --no-deps): ${missing[*]}"
    guest_apt_install "${missing[@]}"
  fi
  step_end

  step_start root
  uri=$(_guest_bookworm_uri) || die "no apt source for Debian found; cannot reach $STOCK_SUITE"
  log="$CACHE_ROOT/qemu-stock-debootstrap.log"
  _qemu_stock_umount "$prefix"
  guest_as_root rm -rf "$prefix"
  mkdir -p "$prefix/bin"
  if ! guest_as_root nice debootstrap --variant=minbase \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg "$STOCK_SUITE" "$root" "$uri" \
    >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    _qemu_stock_umount "$prefix"
    die "debootstrap of $STOCK_SUITE failed (log: $log)"
  fi
  _qemu_stock_umount "$prefix"
  step_end

  step_start install
  printf 'deb %s %s-backports main\n' "$uri" "$STOCK_SUITE" \
    | guest_as_root tee "$root/etc/apt/sources.list.d/backports.list" >/dev/null
  guest_as_root chroot "$root" apt-get update -q >>"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; die "apt-get update in the $STOCK_SUITE root failed"; }
  guest_as_root chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends -t "$STOCK_SUITE-backports" "qemu-system-x86=$STOCK_DEB_VERSION" \
    >>"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; die "qemu-system-x86=$STOCK_DEB_VERSION did not install" \
      "(if the mirror dropped it, pin the newer one: apt-cache show in the root)"; }
  deb=$(find "$root/var/cache/apt/archives" -name 'qemu-system-x86_*.deb' | head -n 1)
  [ -n "$deb" ] || die "apt kept no qemu-system-x86 package to check"
  got=$(sha256sum "$deb" | cut -d' ' -f1)
  [ "$got" = "$STOCK_DEB_SHA256" ] \
    || die "$(basename "$deb"): sha256 $got, expected $STOCK_DEB_SHA256"
  guest_as_root chroot "$root" apt-get clean
  # The wrapper: the root's loader and libraries, firmware and modules.
  cat >"$bin" <<EOF
#!/bin/sh
# Debian's QEMU $STOCK_DEB_VERSION from $root (scripts/build-qemu.sh --qemu 11.1-stock).
R='$root'
QEMU_MODULE_DIR=\$R/usr/lib/x86_64-linux-gnu/qemu
export QEMU_MODULE_DIR
exec "\$R/lib64/ld-linux-x86-64.so.2" --library-path "\$R/lib/x86_64-linux-gnu:\$R/usr/lib/x86_64-linux-gnu" \\
  "\$R/usr/bin/qemu-system-x86_64" -L "\$R/usr/share/qemu" -L "\$R/usr/share/seabios" "\$@"
EOF
  chmod +x "$bin"
  step_end

  step_start check
  "$bin" -device help 2>&1 | grep '"vhost-user-test-device-pci"' >/dev/null \
    || die "vhost-user-test-device-pci missing from -device help"
  printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-status"}' '{"execute":"quit"}' \
    | timeout 60 "$bin" -machine q35 -accel tcg -m 64M -nodefaults -display none -S \
      -qmp stdio >"$prefix/check.log" 2>&1 \
    || { cat "$prefix/check.log" >&2; die "QEMU failed to start a q35 machine"; }
  grep -q '"status": "prelaunch"' "$prefix/check.log" \
    || { cat "$prefix/check.log" >&2; die "unexpected QMP answer"; }
  "$bin" --version | head -n 1 >&2
  step_end

  {
    echo "qemu $STOCK_QEMU_VERSION: Debian's binary package qemu-system-x86 $STOCK_DEB_VERSION"
    echo "  ($STOCK_SUITE-backports, sha256 $STOCK_DEB_SHA256), unpatched"
    echo "root: $root (debootstrap --variant=minbase $STOCK_SUITE)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "timings:"
    for t in "${TIMINGS[@]}"; do echo "  $t"; done
  } >"$prefix/BUILD-INFO"
  print_timings
  echo "$bin"
}

# _qemu_stock_umount DIR: unmounts what debootstrap may have left mounted under DIR.
_qemu_stock_umount() {
  local m
  while read -r m; do
    guest_as_root umount -l "$m" || true
  done < <(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
}
