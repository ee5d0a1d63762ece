#!/usr/bin/env bash
# Runs the kernel's checkpatch.pl (from Debian's linux-source-6.1 of the guest kernel's release,
# pinned in guest/versions.sh, extracted once and cached) over the guest kernel driver's sources
# (guest-driver/linux/). Fails on any error, warning or check it reports (in compat.h, the
# driver's one place for version checks, all but the LINUX_VERSION_CODE warning: see below).
#
# Usage: scripts/checkpatch.sh [FILE...]
set -euo pipefail
guest_dir="$(cd "$(dirname "$0")/../guest" && pwd)"
src="$(cd "$(dirname "$0")/../guest-driver/linux" && pwd)"
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"
# perl, not perl-base alone: checkpatch.pl uses modules perl-base lacks.
guest_need_pkgs apt dpkg coreutils xz-utils perl

tools="$GUEST_CACHE/checkpatch/$GUEST_KERNEL_VERSION"
if [ ! -f "$tools/.done" ]; then
  rm -rf "$tools"
  mkdir -p "$tools"
  deb=$(fetch_deb "$GUEST_KSOURCE_PKG" "$GUEST_KERNEL_VERSION" "$GUEST_KSOURCE_SHA256")
  tmp=$(mktemp -d "$GUEST_CACHE/tmp/ksrc.XXXXXX")
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards './usr/src/linux-source-*.tar.xz'
  tar -xJf "$tmp"/usr/src/linux-source-*.tar.xz -C "$tools" --strip-components=1 \
    --wildcards '*/scripts/checkpatch.pl' '*/scripts/spelling.txt' \
    '*/scripts/const_structs.checkpatch'
  rm -rf "$tmp"
  touch "$tools/.done"
fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$src"/*.c "$src"/*.h "$src"/uapi/*.h)
# compat.h is where the driver's version checks are (it builds for Debian 12's 6.1 and
# Debian 13's 6.12): checkpatch's LINUX_VERSION_CODE warning ("code should be for the version
# to which it is merged") is about in-tree code and is left out for that file alone; everything
# else of checkpatch applies to it as to the other files.
rest=() status=0
for f in "${files[@]}"; do
  if [ "$(basename "$f")" = compat.h ]; then
    "$tools/scripts/checkpatch.pl" --no-tree --strict --show-types --terse \
      --ignore LINUX_VERSION_CODE -f "$f" || status=1
  else
    rest+=("$f")
  fi
done
if [ ${#rest[@]} -gt 0 ]; then
  "$tools/scripts/checkpatch.pl" --no-tree --strict --show-types --terse -f "${rest[@]}" || status=1
fi
exit "$status"
