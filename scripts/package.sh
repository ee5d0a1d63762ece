#!/usr/bin/env bash
# Builds the daemon's Debian package: target/debian/vhost-user-rdma_<version>-1_<arch>.deb, the
# binary stripped, and its debug symbols as vhost-user-rdma-dbgsym_<version>-1_<arch>.ddeb
# (cargo-deb; what it holds: backend/Cargo.toml [package.metadata.deb] and
# docs/operations.md "Install"). The manual pages come from the binary
# itself (`vhost-user-rdma man`), so they always match its --help.
#
# Usage: bash scripts/package.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=guest/lib.sh
. guest/lib.sh

# dpkg-shlibdeps (dpkg-dev) fills in the libraries the binary links.
guest_need_pkgs dpkg-dev gzip

# cargo-deb is a cargo subcommand from crates.io, pinned.
CARGO_DEB_VERSION=3.8.0
if [ "$(cargo deb --version 2>/dev/null || true)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
  guest_log "installing cargo-deb $CARGO_DEB_VERSION"
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi

cargo build --release --locked -q -p vhost-user-rdma
mkdir -p target/man
bin=target/release/vhost-user-rdma
for page in "" ctl rnic-info; do
  name=vhost-user-rdma${page:+-$page}
  # shellcheck disable=SC2086 # an empty $page is no argument
  "$bin" man $page | gzip -9n >"target/man/$name.8.gz"
done
# Stripped, its debug symbols in a -dbgsym package beside it (Debian's way).
cargo deb --locked --no-build --dbgsym -p vhost-user-rdma --output target/debian/ 2>&1 | tail -n 1
