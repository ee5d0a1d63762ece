#!/usr/bin/env bash
# The Debian package under a real systemd: a Debian 12 system (debootstrap minbase with the
# package's dependencies) boots in QEMU/TCG with systemd as PID 1, installs the package that
# scripts/package.sh builds with dpkg, and checks what an operator would (each a step of its
# own, with its own verdict):
#   - dpkg -i: postinst creates the user (systemd-sysusers), enables and starts the unit;
#   - the user vhost-user-rdma in group kvm; the unit enabled, active (Type=notify: READY=1
#     came), its sockets in /run/vhost-user-rdma with the unit's modes;
#   - two VMs connect (the test VMM's rdma-demo: RC traffic between them, a hostile request
#     refused) after a second VM is added to the configuration and the service restarted;
#   - `vhost-user-rdma ctl vms` and the metrics endpoint while they are connected;
#   - `systemctl reload`: a live upgrade (the main PID changes, the service stays active, the
#     journal has the hand-over), and a VM connects afterwards;
#   - `systemctl stop`: inactive, sockets removed; dpkg -r stops nothing more and leaves the
#     configuration; dpkg -P removes it; the manual pages are installed and removed with it.
#
# Usage: bash scripts/qemu-package.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh

keep=0
for a in "$@"; do
  case $a in
    --keep) keep=1 ;;
    *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
  esac
done

guest_need_pkgs debootstrap debian-archive-keyring cpio gzip
launch_need_qemu
launch_workdir package
t_start=$SECONDS

deb=$(bash scripts/package.sh | tail -n 1)
[ -f "$deb" ] || guest_die "scripts/package.sh made no package"
cargo build --release --locked -q -p vhost-user-rdma-tests --bin rdma-demo
# The kernel: the test image's (its initramfs is not used).
bash scripts/build-guest.sh --name package-kernel >/dev/null

# The Debian system, once per package set: a cached cpio of the debootstrap tree.
sys_pkgs=systemd,systemd-sysv,libibverbs1,librdmacm1,procps
id=$(printf '%s\n' bookworm "$sys_pkgs" | sha256sum | cut -c1-12)
base="$GUEST_CACHE/systemd-root/$id"
if [ ! -f "$base/root.cpio.gz" ]; then
  uri=$(_guest_bookworm_uri) || guest_die "no apt source for Debian bookworm found"
  guest_as_root rm -rf "$base"
  mkdir -p "$base"
  guest_log "creating a Debian 12 system with systemd in $base/tree ($sys_pkgs)"
  if ! guest_as_root nice debootstrap --variant=minbase --include="$sys_pkgs" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg bookworm "$base/tree" "$uri" \
    >"$base/debootstrap.log" 2>&1; then
    tail -n 30 "$base/debootstrap.log" >&2
    guest_die "debootstrap failed (whole log: $base/debootstrap.log)"
  fi
  # No login prompt on the console the checks print to; no apt caches in the image.
  guest_as_root ln -sf /dev/null "$base/tree/etc/systemd/system/serial-getty@ttyS0.service"
  guest_as_root rm -rf "$base/tree/var/cache/apt/archives"/*.deb "$base/tree/var/lib/apt/lists"/*
  (cd "$base/tree" && guest_as_root find . -xdev | guest_as_root cpio -o -H newc --quiet) |
    gzip -1 >"$base/root.cpio.gz.tmp"
  mv "$base/root.cpio.gz.tmp" "$base/root.cpio.gz"
  guest_as_root rm -rf "$base/tree"
fi

# What this run adds on top (a second cpio: the kernel unpacks both, in order).
over="$dir/overlay"
mkdir -p "$over/root" "$over/etc" "$over/usr/local/bin" "$over/usr/local/sbin"
cp "$deb" "$over/root/vhost-user-rdma.deb"
cp target/release/rdma-demo "$over/usr/local/bin/"
guest_tools vhost-user-rdma >"$over/etc/tools.sh"
cp guest/package-check.sh "$over/usr/local/sbin/package-check"
chmod 0755 "$over/usr/local/sbin/package-check"
guest_check_unit "$over" package-check \
  "Checks of the vhost-user-rdma package (scripts/qemu-package.sh)" /usr/local/sbin/package-check
(cd "$over" && find . | cpio -o -H newc -R 0:0 --quiet) | gzip -1 >"$dir/overlay.cpio.gz"
cat "$base/root.cpio.gz" "$dir/overlay.cpio.gz" >"$dir/initrd.gz"

echo "== qemu-package: booting Debian 12 with systemd as PID 1, installing $(basename "$deb")"
rc=0
bash scripts/run-guest.sh --image package-kernel --initrd "$dir/initrd.gz" --mem 2G \
  --append 'rdinit=/sbin/init systemd.show_status=0' --log "$dir/console" -q || rc=$?

# Every step's verdict, in the order the guest ran them.
labels=("dpkg -i" "the user" "the unit" "the sockets" "two VMs" "ctl vms" "metrics"
  "systemctl reload" "a VM after the reload" "systemctl stop" "dpkg -r" "dpkg -P")
check_steps "$dir/console" "${labels[@]}"
if [ "$rc" = 0 ]; then ok "the guest's checks (exit 0)"; else failed "the guest's checks (exit $rc)"; fi
if [ "$fail" -gt 0 ] || [ "$keep" = 1 ]; then
  echo "== qemu-package: console"
  tr -d '\r' <"$dir/console" | sed 's/^/   /'
fi
echo "== qemu-package: whole run $((SECONDS - t_start)) s"
verdict qemu-package
