# shellcheck shell=bash
# Helpers shared by scripts/build-guest.sh and scripts/run-guest.sh. Source it; it defines
# functions and variables only.

# shellcheck disable=SC2034 # used by the scripts that source this file
# Where images, downloads and console logs go: outside the checkout.
GUEST_CACHE="${VHOST_USER_RDMA_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma/guest}"

guest_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
guest_die() {
  guest_log "error: $*"
  exit "${GUEST_DIE_CODE:-1}"
}

# guest_script_args ARGS...: the options of the QEMU test scripts that run on either guest
# kernel: --keep (sets keep=1: keep the logs) and --kernel 6.1|6.12 (sets kernel; default 6.1).
guest_script_args() {
  keep=0 kernel=6.1
  while [ $# -gt 0 ]; do
    case "$1" in
    --keep) keep=1; shift ;;
    --kernel) kernel=${2:?--kernel needs 6.1 or 6.12}; shift 2 ;;
    *) guest_die "unknown argument: $1" ;;
    esac
  done
  case "$kernel" in
  6.1 | 6.12) ;;
  *) guest_die "--kernel: 6.1 or 6.12, not $kernel" ;;
  esac
}

# Seconds since the epoch with milliseconds, and the difference of two such stamps.
guest_now() { date +%s.%N | cut -c1-14; }
guest_elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Runs a command as root: directly when we are root, through sudo otherwise.
guest_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    command -v sudo >/dev/null || guest_die "need root for: $* (no sudo)"
    sudo "$@"
  fi
}

_guest_apt_updated=0
guest_apt_update() {
  if [ "$_guest_apt_updated" -eq 0 ]; then
    guest_as_root apt-get update -q >&2
    _guest_apt_updated=1
  fi
}

# guest_apt_install [-t SUITE] PKG...: installs Debian packages (non-interactively).
guest_apt_install() {
  local target=()
  if [ "${1:-}" = -t ]; then
    target=(-t "$2")
    shift 2
  fi
  guest_apt_update
  guest_as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${target[@]}" "$@" >&2
}

# Every prerequisite is decided by its Debian package name, never by a file glob or a command
# that another package may also provide (a glob for libclang once matched libclang-cpp14, which a
# fresh machine ships, and the build failed there while it passed on machines with history).
#
# Two knobs let scripts/check-prereqs.sh ask a script what it would install on a fresh machine:
#   RDMA_PKG_STATE=FILE  decide "installed" from FILE (name<TAB>version lines, e.g.
#                        ../shared/design/fresh-image-packages.txt) instead of dpkg's database;
#   RDMA_PKG_PLAN=FILE   append each package that would be installed to FILE, install nothing,
#                        and stop the script there (exit 0): the dependency step comes first.

# guest_pkg_installed PKG: true if Debian package PKG is installed.
guest_pkg_installed() {
  if [ -n "${RDMA_PKG_STATE:-}" ]; then
    awk -F'\t' -v p="$1" '{ sub(/:.*/, "", $1) } $1 == p { found = 1 } END { exit !found }' \
      "$RDMA_PKG_STATE"
  else
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
  fi
}

# guest_need_pkgs PKG...: installs every PKG that is not installed. In a script, call it once,
# before any other work (see RDMA_PKG_PLAN above).
guest_need_pkgs() {
  local p pkgs=()
  for p in "$@"; do
    guest_pkg_installed "$p" || pkgs+=("$p")
  done
  if [ -n "${RDMA_PKG_PLAN:-}" ]; then
    [ ${#pkgs[@]} -eq 0 ] || printf '%s\n' "${pkgs[@]}" >>"$RDMA_PKG_PLAN"
    exit 0
  fi
  if [ ${#pkgs[@]} -gt 0 ]; then
    guest_log "installing ${pkgs[*]}"
    guest_apt_install "${pkgs[@]}"
  fi
}

# The archive URI that serves Debian bookworm, read from the configured apt sources
# (deb822 .sources files or one-line .list files).
_guest_bookworm_uri() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
      {
        uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, u, /[ \t]+/); uri = u[2] }
          if ($i ~ /^Suites:/ && $i ~ /[ \t]bookworm([ \t]|$)/) ok = 1
          if ($i ~ /^Enabled:[ \t]*no/) ok = 0
        }
        if (ok && uri != "") { print uri; exit }
      }' "$f"
  done | head -n1 | grep . && return 0
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { if ($(i + 1) == "bookworm") { print $i; exit } } }' |
    head -n1 | grep .
}

# Makes sure apt knows bookworm-backports (adds a source beside the bookworm one if not).
guest_ensure_backports() {
  if apt-cache policy 2>/dev/null | grep -q 'bookworm-backports'; then
    return 0
  fi
  local uri
  uri=$(_guest_bookworm_uri) || guest_die "no apt source for bookworm found; cannot add bookworm-backports"
  guest_log "adding bookworm-backports ($uri) to the apt sources"
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
    guest_as_root tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
  _guest_apt_updated=0
  guest_apt_update
}

# Sets QEMU to a usable qemu-system-x86_64. An explicit $QEMU must exist; otherwise Debian's
# (package qemu-system-x86) is used, installed if missing: bookworm-backports' 10.0, else
# bookworm's own.
guest_ensure_qemu() {
  if [ -n "${QEMU:-}" ]; then
    command -v "$QEMU" >/dev/null || guest_die "QEMU=$QEMU: not found or not executable"
    return 0
  fi
  QEMU=/usr/bin/qemu-system-x86_64
  guest_pkg_installed qemu-system-x86 && [ -x "$QEMU" ] && return 0
  guest_log "package qemu-system-x86 is not installed: installing Debian's"
  if guest_ensure_backports && guest_apt_install -t bookworm-backports qemu-system-x86; then
    :
  else
    guest_log "bookworm-backports' QEMU failed to install; trying bookworm's"
    guest_apt_install qemu-system-x86
  fi
  [ -x "$QEMU" ] || guest_die "installing qemu-system-x86 gave no $QEMU"
}

# Debian trixie's packages (the 6.12 guest kernel of guest/versions.sh) come through an apt of
# their own: its source list (the configured mirror, suite trixie), package lists and cache are in
# $GUEST_CACHE/apt-trixie, with no package database. The host's apt sources stay as they are: a
# trixie source there would let the host's own installs take trixie's packages.
# guest_trixie_apt apt-get|apt-cache ARGS...: runs that tool on trixie's lists.
guest_trixie_apt() {
  local d="$GUEST_CACHE/apt-trixie" tool=$1
  shift
  "$tool" -o "Dir::Etc::SourceList=$d/trixie.list" -o "Dir::Etc::SourceParts=$d/none" \
    -o Dir::Etc::Preferences=/dev/null -o "Dir::Etc::PreferencesParts=$d/none" \
    -o "Dir::State::Lists=$d/lists" -o "Dir::State::status=$d/status" -o "Dir::Cache=$d/cache" \
    -o "APT::Sandbox::User=$(id -un)" "$@"
}

# guest_trixie_update: writes the source list and fetches trixie's package lists (once a run).
_guest_trixie_updated=0
guest_trixie_update() {
  [ "$_guest_trixie_updated" -eq 0 ] || return 0
  local d="$GUEST_CACHE/apt-trixie" uri
  uri=$(_guest_bookworm_uri) || guest_die "no apt source for Debian found; cannot reach trixie"
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/none"
  : >"$d/status"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie main\n' \
    "$uri" >"$d/trixie.list"
  guest_log "fetching Debian trixie's package lists ($uri) into $d"
  guest_trixie_apt apt-get update -q >&2
  _guest_trixie_updated=1
}

# fetch_deb PKG VERSION SHA256 [SUITE]: prints the path of the verified .deb, downloading it with
# apt (from the configured Debian mirror; SUITE trixie: through guest_trixie_apt) if it is not in
# the cache ($GUEST_CACHE/downloads).
fetch_deb() {
  local pkg=$1 ver=$2 sum=$3 suite=${4:-bookworm} file tmp got apt=(apt-get) update=guest_apt_update
  if [ "$suite" = trixie ]; then
    apt=(guest_trixie_apt apt-get)
    update=guest_trixie_update
  fi
  mkdir -p "$GUEST_CACHE/downloads" "$GUEST_CACHE/tmp"
  file="$GUEST_CACHE/downloads/${pkg}_${ver#*:}_amd64.deb"
  if [ ! -f "$file" ]; then
    tmp=$(mktemp -d "$GUEST_CACHE/tmp/dl.XXXXXX")
    guest_log "downloading $pkg=$ver"
    if [ "$suite" = trixie ] && [ ! -f "$GUEST_CACHE/apt-trixie/trixie.list" ]; then
      guest_trixie_update
    fi
    if ! (cd "$tmp" && "${apt[@]}" download -q "$pkg=$ver" >"$tmp/apt.log" 2>&1); then
      # A fresh machine may have no package lists yet, or old ones.
      "$update"
      (cd "$tmp" && "${apt[@]}" download -q "$pkg=$ver" >"$tmp/apt.log" 2>&1) || {
        cat "$tmp/apt.log" >&2
        rm -rf "$tmp"
        guest_die "cannot download $pkg=$ver; if the mirror dropped it, pin a newer one in" \
          "guest/versions.sh (apt-cache show $pkg | grep -E '^(Version|SHA256)';" \
          "for trixie's: guest_trixie_apt apt-cache show ...)"
      }
    fi
    mv "$tmp"/*.deb "$file.part"
    rm -rf "$tmp"
    got=$(sha256sum "$file.part" | cut -d' ' -f1)
    if [ "$got" != "$sum" ]; then
      rm -f "$file.part"
      guest_die "$pkg=$ver: sha256 $got, expected $sum"
    fi
    mv "$file.part" "$file"
  fi
  printf '%s\n' "$file"
}

# guest_extract_debs NAME "PKG VERSION SHA256"...: prints a directory holding the pinned Debian
# packages extracted together (fetch_deb each, then dpkg-deb -x), made once and cached by the
# set ($GUEST_CACHE/NAME/HASH): a sysroot for build-guest.sh --sysroot.
guest_extract_debs() {
  local name=$1 d deb out
  shift
  out="$GUEST_CACHE/$name/$(printf '%s\n' "$@" | sha256sum | cut -c1-12)"
  if [ ! -f "$out/.done" ]; then
    rm -rf "$out"
    mkdir -p "$out"
    for d in "$@"; do
      # shellcheck disable=SC2086 # PKG VERSION SHA256
      deb=$(fetch_deb $d)
      dpkg-deb -x "$deb" "$out"
    done
    touch "$out/.done"
  fi
  printf '%s\n' "$out"
}
