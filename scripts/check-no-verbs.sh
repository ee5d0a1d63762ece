#!/usr/bin/env bash
# The daemon without its host-RNIC transport (cargo feature `verbs`, on by default): the build
# needs neither libibverbs nor libclang (rdma-sys is not in its dependency graph), it is
# warning-free, and asking it for `--rnic verbs` fails with a message that says why.
# Builds into target/no-verbs (debug), beside the default build.
#
# Usage: bash scripts/check-no-verbs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

passed=0 failed=0
check() { # check DESCRIPTION CMD...: CMD's status is the verdict
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
    passed=$((passed + 1))
  else
    echo "FAILED: $what"
    failed=$((failed + 1))
  fi
}
export CARGO_TARGET_DIR=target/no-verbs
graph=$(cargo tree --locked -p vhost-user-rdma --no-default-features -e normal,build --prefix none)
check "no rdma-sys, bindgen or clang-sys in the dependency graph" \
  bash -c '! grep -qE "^(rdma-sys|bindgen|clang-sys) " <<<"$1"' _ "$graph"
check "cargo clippy -p vhost-user-rdma --no-default-features -D warnings" \
  cargo clippy --locked -q -p vhost-user-rdma --no-default-features -- -D warnings
check "cargo build -p vhost-user-rdma --no-default-features" \
  cargo build --locked -q -p vhost-user-rdma --no-default-features
bin=$CARGO_TARGET_DIR/debug/vhost-user-rdma
sock=$(mktemp -u /tmp/vhost-user-rdma-no-verbs.XXXXXX.sock)
refuses() { # refuses CMD...: CMD exits non-zero and names the missing feature
  local out
  if out=$("$@" 2>&1); then
    echo "  unexpectedly succeeded: $out"
    return 1
  fi
  echo "  $out" | tail -n 1
  grep -q "built without the verbs transport (cargo feature \`verbs\`" <<<"$out"
}
check "--rnic verbs is refused, naming the cargo feature" refuses "$bin" --rnic verbs --socket-path "$sock"
check "rnic-info says the same" refuses "$bin" rnic-info
rm -f "$sock"
echo "check-no-verbs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
