#!/usr/bin/env bash
# Unmodified RDMA tools between two QEMU guests on one daemon: each guest loads virtio_rdma.ko
# (scripts/build-kmod.sh) and the provider set (scripts/build-rdma-core.sh), the guests are
# networked with -netdev stream for the tools' TCP exchange, and their IP addresses are their
# device GIDs (::ffff:10.42.0.1 and .2, the daemon's defaults), so GID index 1 is usable
# (spec appendix A). They run, server and client:
#   - rdma-core's ibv_rc_pingpong (polling, then -e: completion events), ibv_ud_pingpong (UD,
#     address handles) and ibv_srq_pingpong (4 QPs on an SRQ);
#   - Debian bookworm's perftest binaries as they are (pinned in guest/versions.sh) on that
#     tree's libibverbs, librdmacm and libibumad (libpci3 and what it needs from Debian too),
#     all with -x 1 and the TCP exchange: ib_write_bw for 4 s, then ib_write_lat, ib_read_bw,
#     ib_send_bw and ib_atomic_bw with 100 iterations each.
# Meanwhile a third guest, alone in another tenant, runs the Rust userspace driver's hostile
# program (rdma-guest hostile, through uio: bad addresses, keys and bounds, connects to the
# first tenant's GIDs, then an endless RDMA WRITE stream). The client waits at a gate (a line on
# its second serial port) before perftest until that guest streams, and the hostile guest's
# QEMU is killed with SIGKILL in the middle of ib_write_bw's transfer. Checked: every tool's
# result line on both sides, no kernel warnings in the two guests, the hostile guest's checks
# passed before it was killed, the daemon released all of its objects (its log, ctl stats)
# and is still alive.
# Prints "qemu-pingpong: N passed, M failed".
#
# With --kernel 6.12, a short pass on Debian 13's 6.12 kernel (module and guest image built for
# it): the two guests on the same daemon run ibv_rc_pingpong, polling and with completion
# events, and nothing else (no hostile guest, no perftest); checked: both sides' result lines,
# no kernel warnings, both guests' exit, the daemon alive. Prints
# "qemu-pingpong-6.12: N passed, M failed".
#
# Usage: bash scripts/qemu-pingpong.sh [--kernel 6.1|6.12] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
# shellcheck source=scripts/lib/pair.sh
. scripts/lib/pair.sh
guest_script_args "$@"
# full: the whole run (6.1); otherwise the short pass.
case "$kernel" in
6.1) full=1 name=qemu-pingpong image=rdma-pingpong ;;
6.12) full=0 name=qemu-pingpong-6.12 image=rdma-pingpong-6.12 ;;
esac
t_start=$(date +%s)

launch_need_qemu
cargo build --release --locked -q -p vhost-user-rdma -p virtio-rdma-apps
kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
rc=$(bash scripts/build-rdma-core.sh)

# What the image holds besides the module and rdma-core: perftest and the hostile guest's program.
extra=()
[ "$full" = 0 ] || extra=(--sysroot "$(bash scripts/fetch-perftest.sh)" --bin target/release/rdma-guest)

launch_workdir pingpong

# What both guests' commands source first: pair_tools (scripts/lib/pair.sh: run and klog of
# guest/checks.sh on virtio_rdma0, wait_gid until ib_core has taken the interface's address as
# GID 1), and gate: prints GATE and waits for a line from the host on the second serial port.
{
  pair_tools
  cat <<'EOF'
gate() {
  exec 3</dev/ttyS1
  echo GATE
  read -r _ <&3
  exec 3<&-
}
EOF
} >"$dir/tools.sh"
# The guests get the rdma-core set and Debian's packages installed (--sysroot).
bash scripts/build-guest.sh --kernel "$kernel" --name "$image" --load virtio_pci --load virtio_net \
  --load ib_uverbs --file "$kmod:/lib/virtio_rdma.ko" --file "$dir/tools.sh:/etc/tools.sh" \
  --file "$GUEST_STDBUF_FILE" --sysroot "$rc" "${extra[@]}" >/dev/null

# vm0 and vm1 are tenant "t", the hostile vm2 is alone in tenant "other".
{
  printf '[daemon]\nmgmt_socket = "%s"\n\n' "$dir/mgmt.sock"
  printf '[[tenant]]\nname = "t"\n\n[[tenant]]\nname = "other"\n\n'
  for i in 0 1; do
    printf '[[vm]]\nname = "vm%d"\nsocket = "%s"\ntenant = "t"\nmac = "52:54:00:00:00:0%d"\n\n' \
      "$i" "$dir/vm$i.sock" "$((i + 1))"
  done
  printf '[[vm]]\nname = "vm2"\nsocket = "%s"\ntenant = "other"\n' "$dir/vm2.sock"
} >"$dir/config.toml"
launch_daemon --wait "$dir/vm0.sock" --wait "$dir/vm1.sock" --wait "$dir/vm2.sock" \
  --wait "$dir/mgmt.sock" --config "$dir/config.toml"
daemon_pid=$launch_pid

# guest NAME INDEX NETDEV-OPTS CMD [QEMU ARGS...]
guest() {
  local name=$1 i=$2 net=$3 cmd=$4
  shift 4
  launch_guest "$name" --image "$image" --append 'guest.uio=none' \
    --cmd ". /etc/tools.sh && ip link set eth0 up && ip addr add 10.42.0.$((i + 1))/24 dev eth0 &&
      insmod /lib/virtio_rdma.ko && wait_gid && { $cmd; steps_verdict; }; r=\$?; klog; exit \$r" -- \
    -chardev "socket,id=rdma,path=$dir/vm$i.sock" -device vhost-user-rdma-pci,chardev=rdma \
    -netdev "stream,id=n0,$net" -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0$((i + 1))" \
    "$@"
}
# wait_for GUEST PATTERN [MARKER]: until GUEST's console has a line matching PATTERN (after
# the line MARKER), while the guest runs (scripts/lib/launch.sh's wait_until).
wait_for() {
  if [ -n "${3:-}" ]; then
    wait_until "${launch_guests[$1]}" "$dir/$1.console" _after_seen "$3" "$2" "$1"
  else
    wait_lines "$dir/$1.console" "$2" 1 "${launch_guests[$1]}"
  fi
}
_after_seen() { [ -n "$(after "$@")" ]; }

# The tools, in order, for both sides: rdma-core's pingpongs polling and then sleeping on
# completion events (-e: CQ arming, CQ_COMPLETION events, ibv_get_cq_event), UD with address
# handles, 4 QPs on an SRQ; then perftest (GID index 1, the TCP exchange): RDMA WRITEs for 4 s,
# the hostile guest being killed meanwhile (below), then the others with few iterations.
pingpongs='run RC ibv_rc_pingpong -g 1 -n 50 && run EVENTS ibv_rc_pingpong -g 1 -n 20 -e &&
  run UD ibv_ud_pingpong -g 1 -n 20 && run SRQ ibv_srq_pingpong -g 1 -n 20 -q 4'
perftests='run WRITE_BW ib_write_bw -x 1 -D 4 && run WRITE_LAT ib_write_lat -x 1 -n 100 &&
  run READ_BW ib_read_bw -x 1 -n 100 && run SEND_BW ib_send_bw -x 1 -n 100 &&
  run ATOMIC_BW ib_atomic_bw -x 1 -n 100'
# The short pass: the RC pingpong, polling and with completion events; no gate, no perftest.
client_tail="gate && $perftests"
if [ "$full" = 0 ]; then
  pingpongs='run RC ibv_rc_pingpong -g 1 -n 50 && run EVENTS ibv_rc_pingpong -g 1 -n 20 -e'
  perftests=true client_tail=true
fi
t=$(date +%s)
guest server 0 "server=on,addr.type=unix,addr.path=$dir/net.sock" \
  "peer=; $pingpongs && $perftests"
wait_socket "$dir/net.sock" "$launch_pid" || true
# The client waits at its gate before perftest until the hostile guest streams.
guest client 1 "server=off,addr.type=unix,addr.path=$dir/net.sock,reconnect-ms=1000" \
  "peer=10.42.0.1; until ping -c 1 -W 1 \$peer >/dev/null; do sleep 1; done;
   $pingpongs && $client_tail" \
  -chardev "socket,id=gate,path=$dir/gate.sock,server=on,wait=off" \
  -serial mon:stdio -serial chardev:gate
n='[0-9]+[.][0-9]+' s='[ \t]+'
# A latency: a number, or inf when perftest's cycle clock is uncalibrated (see WRITE_LAT below).
lat='([0-9]+[.][0-9]+|inf)'
bw_row="^ *65536${s}[0-9]+$s$n$s$n$s$n"
hostile_busy='' hostile_killed=''
if [ "$full" = 1 ]; then
  # The hostile guest: the Rust userspace driver through uio (the image's default binding).
  launch_guest hostile --image "$image" \
    --cmd 'rdma-guest hostile --foreign-gid ::ffff:10.42.0.1 --foreign-gid ::ffff:10.42.0.2' -- \
    -chardev "socket,id=rdma,path=$dir/vm2.sock" -device vhost-user-rdma-pci,chardev=rdma

  # Once the hostile guest streams and the client is at its gate, the client goes on, and the
  # hostile guest's QEMU is killed (SIGKILL: no goodbye to the daemon) in the middle of
  # ib_write_bw's transfer, 1 s after the client printed its result header.
  wait_for hostile 'HOSTILE-BUSY' && hostile_busy="$(($(date +%s) - t)) s"
  if wait_for client '^GATE$'; then
    echo "   hostile guest streaming: ${hostile_busy:-no}; client at its gate: $(($(date +%s) - t)) s"
    python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"go\n")
time.sleep(1)' "$dir/gate.sock" || echo "   could not open the client's gate"
  fi
  if [ -n "$hostile_busy" ] && wait_for client '^ *#bytes' WRITE_BW; then
    sleep 1
    kill -9 "$(cat "$dir/hostile.pid")"
    if [ -z "$(after WRITE_BW "$bw_row" client)" ]; then
      hostile_killed="$(($(date +%s) - t)) s"
      echo "   killed the hostile guest's QEMU during ib_write_bw's transfer ($hostile_killed)"
    fi
  fi
  # (Not killed above: something failed. Do not wait for its time limit.)
  [ -n "$hostile_killed" ] || [ ! -s "$dir/hostile.pid" ] || kill -9 "$(cat "$dir/hostile.pid")" 2>/dev/null || true
fi
rc_server=0 rc_client=0
launch_wait "${launch_guests[server]}" || rc_server=$?
launch_wait "${launch_guests[client]}" || rc_client=$?
[ "$full" = 0 ] || launch_wait "${launch_guests[hostile]}" || true
echo "== $name: guests ran $(($(date +%s) - t)) s, exit $rc_server $rc_client"
for g in server client; do
  check_after RC "ibv_rc_pingpong $g" "^50 iters in .* seconds" $g
  check_after EVENTS "ibv_rc_pingpong -e (completion events) $g" "^20 iters in .* seconds" $g
  [ "$full" = 1 ] || continue
  check_after UD "ibv_ud_pingpong $g (UD, address handles, GRH)" "^20 iters in .* seconds" $g
  check_after SRQ "ibv_srq_pingpong $g (4 QPs sharing an SRQ)" "^20 iters in .* seconds" $g
done
# perftest's result rows (both sides print them): "#bytes #iterations BW-peak BW-average
# MsgRate" and "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%", in MB/s and
# microseconds.
for g in $([ "$full" = 0 ] || echo server client); do
  check_after WRITE_BW "ib_write_bw $g (4 s)" "$bw_row" "$g"
  # The latency row's times are "inf" (and the deviation "-nan") when perftest could not
  # calibrate its cycle counter ("Correlation coefficient r^2 ... < 0.9", a loaded host under
  # TCG): the row still says the 100 iterations completed, which is what is checked here.
  check_after WRITE_LAT "ib_write_lat $g" "^ *2${s}100$s$lat$s$lat$s$lat$s$lat$s($n|-?nan)" "$g"
  check_after READ_BW "ib_read_bw $g" "^ *65536${s}100$s$n$s$n$s$n" "$g"
  check_after SEND_BW "ib_send_bw $g" "^ *65536${s}100$s$n$s$n$s$n" "$g"
  check_after ATOMIC_BW "ib_atomic_bw $g (fetch and add)" "^ *8${s}100$s$n$s$n$s$n" "$g"
done
for g in server client; do
  kernel_clean "$g"
done
if [ "$rc_server" = 0 ] && [ "$rc_client" = 0 ]; then
  ok "both guests ran all their tools (exit 0)"
else
  failed "the guests' tools: exit $rc_server (server) and $rc_client (client)"
fi

if [ "$full" = 1 ]; then
  # The hostile guest passed its checks and was killed during ib_write_bw ...
  line=$(tr -d '\r' <"$dir/hostile.console" | grep -m1 'HOSTILE-BUSY' || true)
  if [ -n "$hostile_killed" ] && [ -n "$line" ]; then
    ok "hostile guest (tenant other): ${line#hostile: } ($hostile_busy after boot);" \
      "killed with SIGKILL during ib_write_bw's transfer ($hostile_killed)"
  else
    failed "the hostile guest did not pass its checks and stream, or was not killed during ib_write_bw"
  fi
  # ... the daemon released everything it had ...
  if grep -q 'VM 2: VMM disconnected, resources released' "$dir/daemon.log" &&
    stats=$(target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" --json stats vm2); then
    held=$(python3 -c 'import json, sys; r = json.load(sys.stdin)["resources"]; print(sum(r.values()))' <<<"$stats")
    if [ "$held" = 0 ] && grep -q '"denied":34' <<<"$stats"; then
      ok "the daemon released the hostile guest's resources (ctl stats vm2: nothing held;" \
        "34 commands DENIED by the tenant policy, as attempted)"
    else
      failed "ctl stats vm2 after the kill: $stats"
    fi
  else
    failed "the daemon did not report the hostile guest's resources released"
  fi
  # The provider kicked the engine only when it had parked (spec 18.6): the client's ib_write_bw
  # streams tens of thousands of WRITEs to a busy engine, so its VM's notifications (each a VM exit)
  # stay far below its send work requests. (The pingpongs, one message per millisecond under TCG,
  # find the engine parked every time.)
  if stats=$(target/release/vhost-user-rdma ctl --socket "$dir/mgmt.sock" --json stats vm1); then
    read -r sends kicks < <(python3 -c 'import json, sys; t = json.load(sys.stdin)["traffic"]
print(t["send_ops"], t["notifications"])' <<<"$stats")
    if [ "$sends" -gt 10000 ] && [ $((kicks * 4)) -lt "$sends" ]; then
      ok "kicks only for a parked engine: the client's VM sent $kicks notifications for $sends send WQEs"
    else
      failed "the client's VM sent $kicks notifications for $sends send WQEs"
    fi
  else
    failed "ctl stats vm1"
  fi
fi
# ... and lived on.
if kill -0 "$daemon_pid" 2>/dev/null; then ok "the daemon is alive"; else failed "the daemon died"; fi

if [ "$fail" != 0 ]; then
  for n in server client hostile; do
    [ -e "$dir/$n.console" ] || continue
    show_log "$n console" "$dir/$n.console"
  done
  show_log "daemon log" "$dir/daemon.log"
fi
echo "== $name: whole run $(($(date +%s) - t_start)) s"
verdict "$name"
