#!/usr/bin/env bash
# Checks that a fresh machine gets everything the build and the tests need.
#
# Every script that installs something decides by Debian package name (guest_need_pkgs in
# guest/lib.sh). This check asks each of them what it would install on a fresh machine (its
# decision taken against the fresh image's package list instead of this machine's dpkg
# database), then looks at what the build really uses on this machine — the headers rdma-sys
# generates its bindings from, the libclang bindgen loads, the libraries the daemon links — and
# fails if the Debian package that owns any of them is neither on the fresh image nor planned
# for install. It also fails if an install decision is made by a command or a file glob, which
# another package may satisfy (a glob for libclang matched libclang-cpp14, which a fresh
# machine ships, and both README commands then failed there).
#
# Run after scripts/setup.sh (scripts/test.sh does). Usage: bash scripts/check-prereqs.sh
# Environment: RDMA_FRESH_PACKAGES  the fresh image's list (name<TAB>version per line); default
#   ../shared/design/fresh-image-packages.txt if present, else scripts/fresh-image-packages.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh

fresh=${RDMA_FRESH_PACKAGES:-}
if [ -z "$fresh" ]; then
  fresh=scripts/fresh-image-packages.txt
  [ ! -f ../shared/design/fresh-image-packages.txt ] || fresh=../shared/design/fresh-image-packages.txt
fi
[ -s "$fresh" ] || guest_die "$fresh: no fresh-image package list"

failed=0
fail() {
  echo "check-prereqs: FAILED: $*"
  failed=$((failed + 1))
}

# 1. No install decision by command or glob.
while IFS= read -r hit; do
  fail "install decided by a command or a file glob, not a package name: $hit"
done < <(grep -nE 'guest_need_cmds|compgen -G|command -v [a-z0-9_.+-]+ *(>/dev/null)? *\|\| *(need|pkgs|missing)' \
  scripts/*.sh guest/*.sh 2>/dev/null | grep -v '^scripts/check-prereqs.sh:' || true)

# 2. What each installing script would install on a fresh machine.
plan=$(mktemp)
trap 'rm -f "$plan"' EXIT
for s in setup.sh build-qemu.sh "build-qemu.sh --qemu 11.1-stock" build-guest.sh build-kmod.sh \
  "build-kmod.sh --kernel 6.12" \
  build-rdma-core.sh fetch-nvme-cli.sh checkpatch.sh qemu-kmod.sh qemu-rxe.sh qemu-cm.sh \
  test-guest.sh package.sh qemu-package.sh package-dkms.sh package-provider.sh qemu-dkms.sh; do
  before=$(wc -l <"$plan")
  read -ra cmd <<<"$s"
  if ! RDMA_PKG_STATE=$fresh RDMA_PKG_PLAN=$plan bash "scripts/${cmd[0]}" "${cmd[@]:1}" \
    >/dev/null 2>&1 </dev/null; then
    fail "scripts/$s: asking it for its install plan failed"
  fi
  echo "check-prereqs: $s would install on a fresh machine: $(tail -n +"$((before + 1))" "$plan" | tr '\n' ' ')"
done

# What installing the plan brings: the planned packages and everything they depend on.
closure=$(mktemp)
trap 'rm -f "$plan" "$closure"' EXIT
if [ -s "$plan" ]; then
  # shellcheck disable=SC2046 # one package name a word
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances $(sort -u "$plan") 2>/dev/null |
    sed -n 's/^\([a-z0-9][a-z0-9.+-]*\).*/\1/p' | sort -u >"$closure"
fi
cat "$plan" >>"$closure"

on_fresh_or_planned() {
  guest_pkg_installed "$1" && return 0 # with RDMA_PKG_STATE set below
  grep -qx "$1" "$closure"
}

# 3. What the build uses here, and the package that owns each file.
owner() { dpkg-query -S "$1" 2>/dev/null | head -n1 | cut -d: -f1; }
uses=()
uses+=(/usr/include/infiniband/verbs.h /usr/include/rdma/rdma_cma.h)
for l in libibverbs.so librdmacm.so; do
  uses+=("$(readlink -f "/usr/lib/x86_64-linux-gnu/$l" 2>/dev/null || echo "/usr/lib/x86_64-linux-gnu/$l")")
done
# The libclang bindgen loads (clang-sys looks for libclang.so* and libclang-N.so*; never
# libclang-cpp) and clang's own headers next to it.
libclang=$(find /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu -maxdepth 1 \
  \( -name 'libclang.so*' -o -name 'libclang-[0-9]*.so*' \) 2>/dev/null | head -n1 || true)
if [ -z "$libclang" ]; then
  fail "no libclang for bindgen (rdma-sys would panic: Unable to find libclang)"
else
  uses+=("$(readlink -f "$libclang")")
  stddef=$(find /usr/lib/llvm-*/lib/clang -path '*/include/stddef.h' 2>/dev/null | head -n1 || true)
  if [ -n "$stddef" ]; then
    uses+=("$(readlink -f "$stddef")")
  else
    fail "no clang builtin headers for bindgen"
  fi
fi
uses+=("$(readlink -f "$(command -v cc)")" "$(readlink -f "$(command -v pkg-config)")" /usr/bin/rdma)
for f in "${uses[@]}"; do
  if [ ! -e "$f" ]; then
    fail "$f: missing after scripts/setup.sh"
    continue
  fi
  p=$(owner "$f")
  if [ -z "$p" ]; then
    fail "$f: no Debian package owns it"
  elif RDMA_PKG_STATE=$fresh on_fresh_or_planned "$p"; then
    echo "check-prereqs: ok: $f ($p)"
  else
    fail "$f belongs to $p, which a fresh machine lacks and no script installs"
  fi
done

# 4. Every planned package exists in the archive (a typo would fail only on a fresh machine).
if find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name lock ! -name partial 2>/dev/null |
  grep -q .; then
  while read -r p; do
    [ -n "$(apt-cache show --no-all-versions "$p" 2>/dev/null)" ] ||
      fail "package $p is planned but unknown to apt"
  done < <(sort -u "$plan")
else
  echo "check-prereqs: apt has no package lists: skipped checking the planned names"
fi

if [ "$failed" -eq 0 ]; then
  echo "check-prereqs: 1 passed, 0 failed"
else
  echo "check-prereqs: 0 passed, 1 failed ($failed problems)"
  exit 1
fi
