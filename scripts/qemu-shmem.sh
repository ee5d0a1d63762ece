#!/usr/bin/env bash
# The Linux guest driver and the rdma-core provider in both doorbell modes (spec 18.7), in one run:
# two QEMU guests on one daemon, on Debian's unpatched QEMU 11.1.3 (scripts/build-qemu.sh --qemu
# 11.1-stock), whose generic vhost-user device has VIRTIO shared memory. Our named device's
# patches do not exist for 11.1 yet (qemu-configs/README.md), and the generic device cannot have
# ID 42, so the device is vhost-user-test-device-pci with virtio-id=39 and the module a test build
# that binds 39 (scripts/build-kmod.sh --device-id 39); everything else is the real thing.
# In each guest, in this order, in one boot:
#   1. the shared-memory mode: virtio_rdma.ko loaded as it ships; the kernel's features line must
#      name shmem_doorbell; the kmod check (guest-driver/tests/vrdma-check.c: objects, data,
#      async events), ibv_rc_pingpong (polling, then -e), ibv_srq_pingpong (4 QPs on an
#      SRQ: SRQ slots), ibv_ud_pingpong, then perftest's ib_read_lat (RDMA READ, post to
#      completion, 1000 iterations), ib_write_lat and ib_write_bw (2 s); during ib_write_bw the
#      server looks for its doorbell page in the process's mappings (the provider maps it at the
#      fixed offset VIRTIO_RDMA_MMAP_DB_PAGE);
#   2. still in the shared-memory mode, a live upgrade of the daemon (spec 20.7) under traffic:
#      while both guests run ibv_rc_pingpong (30000 × 4 KiB), SIGUSR2 has the daemon start its
#      successor, which takes both VMs over with their doorbell region (the guests' mappings of
#      it stay; nothing is mapped again); the messages VM 1 receives must grow on the new
#      daemon, and the pingpong must complete on both sides;
#   3. the guest-RAM mode: the module reloaded with shmem_doorbell=0 (the device is reset); the
#      features line must not name it, the page must not be mapped; the same tools.
# Checked: every tool's result on both sides in both modes, the daemon mapped the doorbell region
# for both VMs, no kernel warnings, both guests' exit, the daemon alive; and printed: the READ
# and WRITE latencies and the WRITE bandwidth of both modes side by side (same run, same boot).
# Prints "qemu-shmem: N passed, M failed".
#
# Usage: [QEMU=path-to-qemu-11.1] bash scripts/qemu-shmem.sh [--keep]
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
[ "$kernel" = 6.1 ] || guest_die "qemu-shmem runs on the 6.1 guest kernel only"
name=qemu-shmem image=rdma-shmem
t_start=$(date +%s)

[ -n "${QEMU:-}" ] || QEMU=$(bash scripts/build-qemu.sh --qemu 11.1-stock | tail -n 1)
export QEMU
cargo build --release --locked -q -p vhost-user-rdma
kmod=$(bash scripts/build-kmod.sh --device-id 39)
rc=$(bash scripts/build-rdma-core.sh)
launch_workdir shmem

# pagecheck CMD...: runs CMD; meanwhile looks for its context's doorbell page among its
# mappings (offset VIRTIO_RDMA_MMAP_DB_PAGE of the uverbs file) and says whether it saw it.
# mode LABEL: the driver's features line after a (re)load, under LABEL.
{
  pair_tools
  cat <<'EOF'
pagecheck() {
  local p found=0 r=0
  "$@" &
  p=$!
  while kill -0 $p 2>/dev/null; do
    grep -q ' 100000000 .*uverbs' /proc/$p/maps 2>/dev/null && found=1
    sleep 0.2
  done
  wait $p || r=$?
  echo "DB-PAGE-MAPPED: $found"
  return $r
}
mode() {
  echo "MODE $1: $(dmesg | grep 'virtio-rdma ABI' | tail -n 1)"
}
EOF
} >"$dir/tools.sh"
bash scripts/build-guest.sh --name "$image" --load virtio_pci --load virtio_net --load ib_uverbs \
  --file "$kmod:/lib/virtio_rdma.ko" --file "$dir/tools.sh:/etc/tools.sh" \
  --file "$GUEST_STDBUF_FILE" --sysroot "$rc" --sysroot "$(bash scripts/fetch-perftest.sh)" \
  >/dev/null

{
  printf '[daemon]\nmgmt_socket = "%s"\nhandover_socket = "%s"\n\n[[tenant]]\nname = "t"\n\n' \
    "$dir/mgmt.sock" "$dir/handover.sock"
  for i in 0 1; do
    printf '[[vm]]\nname = "vm%d"\nsocket = "%s"\ntenant = "t"\nmac = "52:54:00:00:00:0%d"\n\n' \
      "$i" "$dir/vm$i.sock" "$((i + 1))"
  done
} >"$dir/config.toml"
launch_daemon --wait "$dir/vm0.sock" --wait "$dir/vm1.sock" --wait "$dir/mgmt.sock" \
  --wait "$dir/handover.sock" --config "$dir/config.toml"
daemon_pid=$launch_pid

# tools M [WRAP]: the tools of mode M (labels end in _M); WRAP runs the bandwidth test.
tools() {
  local upgrade=''
  # The upgrade's window (step 2), in the shared-memory mode only.
  [ "$1" != SHMEM ] ||
    upgrade=" && echo UPGRADE-WINDOW && run UPG_SHMEM ibv_rc_pingpong -g 1 -n 30000 -s 4096"
  echo "step CHECK_$1 vrdma-check && run RC_$1 ibv_rc_pingpong -g 1 -n 50 &&
    run EV_$1 ibv_rc_pingpong -g 1 -n 20 -e &&
    run SRQ_$1 ibv_srq_pingpong -g 1 -n 20 -q 4 && run UD_$1 ibv_ud_pingpong -g 1 -n 20 &&
    run RLAT_$1 ib_read_lat -x 1 -n 1000 && run WLAT_$1 ib_write_lat -x 1 -n 1000 &&
    run WBW_$1 ${2:-} ib_write_bw -x 1 -D 2$upgrade"
}
# Both modes, the module reloaded in between (the device is reset: its objects are gone).
modes() {
  echo "insmod /lib/virtio_rdma.ko && wait_gid && mode SHMEM && $(tools SHMEM "${1:-}") &&
    rmmod virtio_rdma && insmod /lib/virtio_rdma.ko shmem_doorbell=0 && wait_gid && mode RAM &&
    $(tools RAM "${1:-}")"
}
# guest NAME INDEX NETDEV-OPTS CMD
guest() {
  launch_guest "$1" --image "$image" --append 'guest.uio=none' \
    --cmd ". /etc/tools.sh && ip link set eth0 up && ip addr add 10.42.0.$(($2 + 1))/24 dev eth0 &&
      { $4; steps_verdict; }; r=\$?; klog; exit \$r" -- \
    -chardev "socket,id=rdma,path=$dir/vm$2.sock" \
    -device vhost-user-test-device-pci,chardev=rdma,virtio-id=39,num_vqs=3,config_size=96,vq_size=256 \
    -netdev "stream,id=n0,$3" -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0$(($2 + 1))"
}
t=$(date +%s)
guest server 0 "server=on,addr.type=unix,addr.path=$dir/net.sock" "peer=; $(modes pagecheck)"
wait_socket "$dir/net.sock" "$launch_pid" || true
guest client 1 "server=off,addr.type=unix,addr.path=$dir/net.sock,reconnect-ms=1000" \
  "peer=10.42.0.1; until ping -c 1 -W 1 \$peer >/dev/null; do sleep 1; done; $(modes)"

# 2. The live upgrade, once the client's pingpong after the UPGRADE-WINDOW marker has exchanged
# addresses with the server's.
_in_window() {
  tr -d '\r' <"$dir/client.console" |
    awk '/^UPGRADE-WINDOW/ { m = 1 } m && /remote address:/ { f = 1 } END { exit !f }'
}
# recv_ops: the messages delivered to VM 1's QPs, as the daemon serving now counts them.
recv_ops() {
  target/release/vhost-user-rdma ctl -s "$dir/mgmt.sock" --json stats vm1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["traffic"]["recv_ops"])'
}
_grown() { [ "$(recv_ops || echo 0)" -gt "$1" ]; }
not_alive() { ! kill -0 "$1" 2>/dev/null; }
maps_before=-1
if wait_until "${launch_guests[client]}" "$dir/client.console" _in_window; then
  maps_before=$(grep -c 'doorbell region mapped' "$dir/daemon.log" || true)
  kill -USR2 "$daemon_pid"
  if wait_lines "$dir/daemon.log" 'started the successor, pid [0-9]+' 1 "$daemon_pid"; then
    new=$(sed -n 's/.*started the successor, pid \([0-9]*\):.*/\1/p' "$dir/daemon.log" | tail -n 1)
    launch_on_exit "kill -TERM $new 2>/dev/null || true"
    wait_until "$new" "$dir/daemon.log" not_alive "$daemon_pid" || true
    st=0
    launch_wait "$daemon_pid" || st=$?
    if [ "$st" = 0 ] && wait_lines "$dir/daemon.log" 'took over 2 VMs \(2 connected\)' 1 "$new"; then
      ok "upgrade in the shared-memory mode: $(grep -o 'took over 2 VMs.*' "$dir/daemon.log")"
      daemon_pid=$new
      n0=$(recv_ops || echo 0)
      if wait_until "$new" "$dir/client.console" _grown "$n0"; then
        ok "after the upgrade VM 1 receives through the new daemon ($n0 -> $(recv_ops))"
      else
        failed "after the upgrade VM 1's messages received stay at $n0"
      fi
    else
      failed "upgrade in the shared-memory mode: the old daemon exited with $st, or the" \
        "successor did not take both VMs over: $(grep -m1 -o 'hand-over refused.*' "$dir/daemon.log")"
    fi
  else
    failed "SIGUSR2 started no successor"
  fi
else
  failed "the client's pingpong of the upgrade window did not start"
fi

rc_server=0 rc_client=0
launch_wait "${launch_guests[server]}" || rc_server=$?
launch_wait "${launch_guests[client]}" || rc_client=$?
echo "== $name: guests ran $(($(date +%s) - t)) s, exit $rc_server $rc_client"

n='[0-9]+[.][0-9]+' s='[ \t]+'
lat='([0-9]+[.][0-9]+|inf)'
lat_row="^ *2${s}1000$s$lat$s$lat$s$lat$s$lat$s($n|-?nan)"
bw_row="^ *65536${s}[0-9]+$s$n$s$n$s$n"
for m in SHMEM RAM; do
  for g in server client; do
    line=$(tr -d '\r' <"$dir/$g.console" | grep -m1 "^MODE $m: " || true)
    if [ "$m" = SHMEM ] && [[ "$line" == *" shmem_doorbell"* ]]; then
      ok "$g, $m: the driver negotiated F_SHMEM_DOORBELL"
    elif [ "$m" = RAM ] && [[ -n "$line" && "$line" != *" shmem_doorbell"* ]]; then
      ok "$g, $m: reloaded with shmem_doorbell=0, guest-RAM doorbells"
    else
      failed "$g, $m: the driver's features line: ${line:-none}"
    fi
    check_after "CHECK_$m" "$m: vrdma-check $g (objects, data, async events)" \
      "^VRDMA-CHECK: [0-9]* passed, 0 failed" $g
    check_after "RC_$m" "$m: ibv_rc_pingpong $g" "^50 iters in .* seconds" $g
    check_after "EV_$m" "$m: ibv_rc_pingpong -e $g" "^20 iters in .* seconds" $g
    check_after "SRQ_$m" "$m: ibv_srq_pingpong $g (SRQ)" "^20 iters in .* seconds" $g
    check_after "UD_$m" "$m: ibv_ud_pingpong $g" "^20 iters in .* seconds" $g
    check_after "WLAT_$m" "$m: ib_write_lat $g" "$lat_row" $g
    check_after "WBW_$m" "$m: ib_write_bw $g" "$bw_row" $g
  done
  check_after "RLAT_$m" "$m: ib_read_lat client (post to completion)" "$lat_row" client
  if [ "$m" = SHMEM ]; then
    for g in server client; do
      check_after UPG_SHMEM "ibv_rc_pingpong $g across the upgrade" "^30000 iters in .* seconds" $g
    done
  fi
  want=$([ "$m" = SHMEM ] && echo 1 || echo 0)
  check_after "WBW_$m" "$m: the server's doorbell page mapped: $want" "^DB-PAGE-MAPPED: $want" server
done
maps=$(grep -c 'doorbell region mapped' "$dir/daemon.log" || true)
if [ "$maps" -ge 2 ] && [ "$maps" = "$maps_before" ]; then
  ok "the daemon mapped the doorbell region ($maps SHMEM_MAPs: one per VM and start), its" \
    "successor none (the guests' mappings carried over)"
else
  failed "the daemons mapped the doorbell region $maps times ($maps_before before the upgrade)"
fi
for g in server client; do
  kernel_clean "$g"
done
if [ "$rc_server" = 0 ] && [ "$rc_client" = 0 ]; then
  ok "both guests ran all their tools (exit 0)"
else
  failed "the guests' tools: exit $rc_server (server) and $rc_client (client)"
fi
if kill -0 "$daemon_pid" 2>/dev/null; then ok "the daemon is alive"; else failed "the daemon died"; fi

# Both modes side by side (perftest: t_typical and the 99th percentile in µs; MB/s average).
echo "== $name: the client's numbers, same run (TCG: for the record; the ratio is the result)"
printf '   %-7s %-22s %-22s %s\n' mode "ib_read_lat typ / 99%" "ib_write_lat typ / 99%" "ib_write_bw MB/s"
for m in SHMEM RAM; do
  r=$(after "RLAT_$m" "$lat_row" client | awk '{print $5 " / " $8}')
  w=$(after "WLAT_$m" "$lat_row" client | awk '{print $5 " / " $8}')
  b=$(after "WBW_$m" "$bw_row" client | awk '{print $4}')
  printf '   %-7s %-22s %-22s %s\n' "$m" "${r:--}" "${w:--}" "${b:--}"
done

if [ "$fail" != 0 ] || [ "$keep" = 1 ]; then
  for g in server client; do
    [ -e "$dir/$g.console" ] && show_log "$g console" "$dir/$g.console"
  done
  show_log "daemon log" "$dir/daemon.log"
fi
echo "== $name: whole run $(($(date +%s) - t_start)) s"
verdict "$name"
