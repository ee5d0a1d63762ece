#!/usr/bin/env bash
# Two QEMU guests that play RDMA hosts: Debian's 6.1 kernel with Linux soft-RoCE (rdma_rxe) on
# their virtio-net interface, joined by `-netdev dgram` (UDP on the loopback; RoCEv2 over
# `-netdev stream` takes ~40 ms per round trip). This is where the libibverbs transport
# (`--rnic verbs`) is tested, on a real RNIC stack. In each host guest:
#   - the stack itself, natively, with this tree's rdma-core (libibverbs, the rxe provider) and
#     Debian's perftest: `ibv_devinfo`, ibv_rc_pingpong, ib_write_lat, ib_write_bw (the figures
#     the daemon's are compared with, same run);
#   - `vhost-user-rdma rnic-info` (the device as the transport sees it), then the daemon on
#     rxe0 (`--rnic verbs --gid-index 1`) with two VM sockets, and test-VMM VMs (`rdma-peer`):
#       * VM on host 1 <-> VM on host 2: the checked exchange (SEND/RECV, WRITE, WRITE with
#         immediate, READ, atomics, every byte checked) and UD both ways;
#       * the GSI QP through the daemons' CM bridges (docs/abi-v3-design.md section 4): both
#         devices offer F_GSI and QP 1 reaches RTS; host 2's VM sends a CM REQ for port 7480
#         of host 1, whose daemon listens on it for its VM 0 (`--cm-listen vm0=7480`); that VM
#         gets it as a REQ MAD and rejects it, and host 2's VM gets the REJ (rdma-peer
#         cm-probe: REQ and REJ only, no connection);
#       * rping across hosts through the CM bridges, unmodified on the native side: a VM on host 1
#         (`rdma-peer rping-client`, its own CM on QP 1) against native `rping -s` on host 2, and
#         native `rping -c -V` on host 2 against a VM on host 1 (`rdma-peer rping-server` on
#         the port its daemon listens on for it), 20 pings each, data verified;
#       * interop with unmodified rdma-core: a VM against `ibv_rc_pingpong` running natively on
#         the other host, the VM as server and as client;
#       * latency, bandwidth and 64-byte message rate through the daemon (rdma-peer
#         write-lat/write-bw, pingpong) next to the native tools', and the daemon's CPU time
#         per work request (docs/benchmarks.md);
#       * a VM with live RC connections moving between two daemons on rxe0 (tests/tests/
#         verbs_move.rs: virtual QP numbers and keys, PSNs carried over, its peer held and
#         pointed at the new host QP; spec 20.8), on host 1;
#       * a test-VMM VM with a live RC connection moving from host 1's daemon to host 2's
#         (rdma-peer move-out and move-in: its image — guest RAM, queues, driver objects, the
#         device state — goes over TCP; its peer on host 1 is held, then pointed at host 2);
#       * the data-path conformance tests (tests/tests/datapath*.rs, uc.rs) on host 1, their daemon on
#         rxe0 (VUR_TEST_RNIC); those whose behaviour the spec leaves to the NIC (appendix D)
#         are skipped, each named below;
#       * a fault: host 2's link goes down for 6 s while host 1's VM streams RDMA WRITEs to
#         it: host 2's daemon sees the port go down (its VM's RC QP fails with QP_FATAL) and up
#         again; host 1's writer gets RETRY_EXC_ERR (soft-RoCE never gives up by itself after
#         a link flap: the daemon's watchdog does); both daemons go on serving: a second
#         exchange once the link is back;
#       * no leak: once every VM has gone, the daemons hold no VM object and the host device
#         has the objects it had before the first VM came (`rdma resource show`);
#       * the mapping budget (spec 9.5, appendix D): host 2's daemon restarted under a lowered
#         vm.max_map_count (64 mappings above the daemon's reserve: 32 per VM); VM 0 creates
#         CQs until refused (QUOTA, detail 10: each rxe CQ maps its queue) and holds them while
#         VM 1 creates 8 CQs; the daemon still answers, and vm.max_map_count is restored.
# (On 6.1, rxe works neither across a veth pair between namespaces nor between two rxe devices
# of one guest: two guests it is.)
# Prints "qemu-rxe: N passed, M failed".
#
# Usage: bash scripts/qemu-rxe.sh [--keep] [--only 'LABEL ...'] [--smp N]
#   --only: run these steps alone (a developer's loop; the checks of the others then fail).
#   --smp: vCPUs of each host guest (default 1). With 2, the VM's test VMM polling its CQ has a
#     vCPU of its own, as a VM's vCPU would, instead of taking turns with the daemon and rxe.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh
keep=0
only=
smp=1
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1; shift ;;
    --only) only="$2"; shift 2 ;;
    --smp) smp="$2"; shift 2 ;;
    *) echo "usage: $0 [--keep] [--only 'LABEL ...'] [--smp N]" >&2; exit 2 ;;
  esac
done
t_start=$(date +%s)
guest_need_pkgs iproute2 binutils

launch_need_qemu
cargo build --release --locked -q -p vhost-user-rdma -p vhost-user-rdma-tests \
  --bin vhost-user-rdma --bin rdma-peer
rc=$(bash scripts/build-rdma-core.sh)
pt=$(bash scripts/fetch-perftest.sh)

launch_workdir rxe

# The data-path conformance tests, as `cargo test` builds them (debug, stripped for the image).
for t in datapath datapath_multi uc verbs_move; do
  exe=$(cargo test --locked -q -p vhost-user-rdma-tests --test "$t" --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and \
            m["target"]["kind"] == ["test"]:
        print(m["executable"])')
  strip -o "$dir/$t" "$exe"
done
# Tests of those two whose behaviour is the NIC's (spec appendix D): retry timing, statuses and
# events of a refused request's responder, solicited flags, a destination QPN not live on the
# host, a peer gone while the NIC still retries.
skips=(
  broken_queues::malformed_receive_wqe_completes_with_loc_qp_op_err
  completions::error_completions_carry_no_message_fields
  fences_and_arming::arm_solicited_fires_only_for_solicited_or_failed
  operations::length_errors
  operations::read_to_responder_without_rd_atomic
  operations::remote_access_errors
  retries::rc_retry_delivers_once_the_peer_is_ready
  retries::rc_unreachable_destination_retries_then_fails
  retries::rnr_wait_uses_the_responders_min_rnr_timer
  disconnect::vm_disconnect_mid_transfer
  error_flush::a_parked_responder_flushes_its_receive_after_an_access_error
  error_flush::every_receive_of_a_failed_responder_is_flushed
)
skip_args=""
for s in "${skips[@]}"; do skip_args="$skip_args --skip $s"; done

# Each host's steps, a file in the image (the kernel command line is too short for them). They
# run in the same order on both hosts; each pairs with the other host's step of the same label
# (the client side of a native tool retries until the server listens, rdma-peer's clients retry
# by themselves). Every step runs and reports its own verdict whatever the ones before it did
# (`step`, guest/checks.sh); one that waits for a peer whose step failed stops once it has
# printed nothing for $STALL seconds.
# shellcheck disable=SC2016 # the guest's shell expands them
native='run RC ibv_rc_pingpong -g 1 -n 50
  run PP64 ibv_rc_pingpong -g 1 -n 200 -s 64
  run WRITE_LAT ib_write_lat -x 1 -n 200
  run WRITE_BW ib_write_bw -x 1 -n 200
  c0=$(child_ticks)
  run WRITE_RATE ib_write_bw -x 1 -n 5000 -s 64
  echo "NATIVE-CPU ticks $(($(child_ticks) - c0))"'
# With --smp 2 the split is a VM's: the VMs' test VMMs on vCPU 0, the daemon's engine pinned to
# vCPU 1 (a CPU of its own, so it polls through its adaptive window).
pin_vm='' engine_cpus=''
if [ "$smp" -gt 1 ]; then
  pin_vm="taskset -c 0 " engine_cpus="--engine-cpus 1"
fi
peer() { echo "${pin_vm}rdma-peer $1 --socket /tmp/vm$2.sock"; }
# The checked exchanges' RC QPs wait 1 s per try (ACK timeout 18, 7 retries) instead of 67 ms:
# a TCG host guest starved by a loaded machine for longer than soft-RoCE's ~0.5 s of retries
# must not fail a connection whose bytes are what the step checks (both ran into
# RETRY_EXC_ERR at a load of 5 to 7 with the default).
slow="--ack-timeout 18"
srv_steps="step DEVINFO ibv_devinfo -d rxe0
  step RNIC-INFO vhost-user-rdma rnic-info --device rxe0 --gid-index 1
  peer=
  $native
  step DAEMON daemon 10.43.0.2 $engine_cpus
  before=\$(res)
  step VM-EXCHANGE $(peer exchange 0) --role server --tcp 0.0.0.0:7471 $slow
  step VM-UD $(peer ud 0) --role server --tcp 0.0.0.0:7472 -n 50
  step VM-CM-PROBE $(peer cm-probe 0) --role server --tcp 0.0.0.0:7478 --port 7480
  step CM-RPING-VM-CLIENT $(peer rping-client 0) --addr 10.43.0.2 --port 7181 --count 20 --verify \
    --retry-rejected-secs 120
  step CM-RPING-VM-SERVER $(peer rping-server 0) --port 7480
  step INTEROP-VM-SERVER $(peer pingpong 1) --server -n 200
  run INTEROP-NATIVE-SERVER ibv_rc_pingpong -g 1 -n 200
  step VM-PP64 $(peer pingpong 0) --server -n 200 -s 64
  step VM-WRITE-LAT $(peer write-lat 0) --role server --tcp 0.0.0.0:7473 -s 2 -n 200
  step VM-UC-LAT $(peer write-lat 0) --role server --tcp 0.0.0.0:7479 -s 2 -n 200 --uc
  step VM-WRITE-BW $(peer write-bw 0) --role server --tcp 0.0.0.0:7474 -s 65536 -n 200
  step VM-WRITE-RATE $(peer write-bw 0) --role server --tcp 0.0.0.0:7477 -s 64 -n 5000
  step FAULT fault_writer
  step AFTER-FAULT $(peer exchange 0) --role server --tcp 0.0.0.0:7476 $slow
  step CONFORMANCE conformance
  step VERBS-MOVE verbs_moves
  step VERBS-MOVE-HOSTS move_out 10.43.0.2
  step LEAKS leaks \"\$before\"
  steps_verdict"
cli_steps="peer=10.43.0.1; until ping -c 1 -W 1 \$peer >/dev/null; do sleep 1; done
  $native
  step DAEMON daemon 10.43.0.1 $engine_cpus
  before=\$(res)
  step VM-EXCHANGE $(peer exchange 0) --role client --tcp 10.43.0.1:7471 $slow
  step VM-UD $(peer ud 0) --role client --tcp 10.43.0.1:7472 -n 50
  step VM-CM-PROBE $(peer cm-probe 0) --role client --tcp 10.43.0.1:7478 --port 7480
  step CM-RPING-VM-CLIENT linebuf rping -s -a 10.43.0.2 -p 7181 -v
  step CM-RPING-VM-SERVER rping_c 10.43.0.1 7480
  run INTEROP-VM-SERVER ibv_rc_pingpong -g 1 -n 200
  step INTEROP-NATIVE-SERVER $(peer pingpong 1) --client 10.43.0.1 -n 200
  step VM-PP64 $(peer pingpong 0) --client 10.43.0.1 -n 200 -s 64
  step VM-WRITE-LAT $(peer write-lat 0) --role client --tcp 10.43.0.1:7473 -s 2 -n 200
  step VM-UC-LAT $(peer write-lat 0) --role client --tcp 10.43.0.1:7479 -s 2 -n 200 --uc
  step VM-WRITE-BW cpu_during $(peer write-bw 0) --role client --tcp 10.43.0.1:7474 -s 65536 -n 200
  step VM-WRITE-RATE cpu_during $(peer write-bw 0) --role client --tcp 10.43.0.1:7477 -s 64 -n 5000
  step FAULT fault_reader
  sleep 1
  step AFTER-FAULT $(peer exchange 0) --role client --tcp 10.43.0.1:7476 $slow
  step PORT-EVENTS grep -e 'rxe0: port' -e 'port down:' /tmp/daemon.log
  step LEAKS leaks \"\$before\"
  step MAP-LIMIT map_limit 10.43.0.1
  step VERBS-MOVE-HOSTS move_in 10.43.0.1
  steps_verdict"
echo "$srv_steps" >"$dir/server.sh"
echo "$cli_steps" >"$dir/client.sh"

# What both guests' commands source first: up ADDR brings the interface up with ADDR, puts an
# rxe device on it and waits for its GID 1 (the IPv4-mapped address); daemon PEER [ARGS] starts the
# daemon on rxe0 with VM sockets /tmp/vm0.sock and /tmp/vm1.sock, allowed to reach host PEER;
# res prints the host device's object counts; run and klog as in guest/checks.sh, on rxe0;
# daemon_log, after a failure, the daemon's warnings and errors (its log stays in the guest).
{
  cat <<'EOF'
daemon_log() {
  [ -f /tmp/daemon.log ] || return 0
  echo "DAEMON-LOG: its warnings and errors, the last 80"
  grep -E 'WARN|ERROR' /tmp/daemon.log | tail -n 80
}
up() {
  ip link set eth0 up && ip addr add "$1/24" dev eth0 &&
    /usr/local/bin/rdma link add rxe0 type rxe netdev eth0 || return 1
  wait_gid
  ulimit -l unlimited
}
wait_gid() {
  local i=0
  until grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null &&
    grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; do
    [ $i -lt 100 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
}
# rping_c ADDR PORT: native rping's client, 20 pings, data verified (-V); connected again while
# nothing listens on the port yet (the VM's server starts in the same step as this).
rping_c() {
  local i=0
  until linebuf rping -c -a "$1" -p "$2" -C 20 -V -v >/tmp/rping.out 2>&1; do
    cat /tmp/rping.out
    grep -q -e REJECTED -e 'connect error' /tmp/rping.out && [ $i -lt 120 ] || return 1
    i=$((i + 1))
    sleep 1
  done
  cat /tmp/rping.out
}
daemon() {
  local peer=$1
  shift
  vhost-user-rdma --rnic verbs --rnic-device rxe0 --gid-index 1 --remote-gid "$peer" \
    --socket-path /tmp/vm0.sock --socket-path /tmp/vm1.sock --mgmt-socket /tmp/mgmt.sock \
    --cm-listen vm0=7480 "$@" >/tmp/daemon.log 2>&1 &
  local i=0
  until [ -S /tmp/mgmt.sock ]; do
    [ $i -lt 100 ] || { cat /tmp/daemon.log; return 1; }
    i=$((i + 1))
    sleep 0.1
  done
}
# cpu_during CMD...: runs CMD, then prints the daemon's CPU time during it (clock ticks, user
# and system) and the work requests its engine took.
cpu_during() {
  local c0 w0 c1 w1
  c0=$(daemon_ticks) && w0=$(engine_wqes) && "$@" && c1=$(daemon_ticks) && w1=$(engine_wqes) &&
    echo "DAEMON-CPU ticks $((c1 - c0)) wqes $((w1 - w0))"
}
# The CPU time of the shell's finished children (clock ticks, user and system).
child_ticks() {
  awk '{ print $16 + $17 }' "/proc/$$/stat"
}
daemon_ticks() {
  awk '{ print $14 + $15 }' "/proc/$(pidof vhost-user-rdma)/stat"
}
engine_wqes() {
  vhost-user-rdma ctl --socket /tmp/mgmt.sock engines | awk 'NR == 2 { print $4 }'
}
res() {
  /usr/local/bin/rdma resource show rxe0 | grep -o 'pd [0-9]* cq [0-9]* qp [0-9]* .*mr [0-9]* .*'
}
# The fault: host 1's VM writes to host 2's VM while host 2 takes its link down for 6 s.
fault_writer() {
  rdma-peer write-bw --socket /tmp/vm1.sock --role client --tcp 10.43.0.2:7475 -s 65536 \
    -n 1000000 --timeout-secs 60
  echo "FAULT-WRITER-EXIT $?"
}
fault_reader() {
  local reader
  rdma-peer write-bw --socket /tmp/vm1.sock --role server --tcp 0.0.0.0:7475 -s 65536 \
    -n 1000000 --timeout-secs 20 &
  reader=$!
  sleep 3
  ip link set eth0 down
  sleep 6
  ip link set eth0 up
  wait_gid
  wait $reader
  echo "FAULT-READER-EXIT $?"
}
# map_limit PEER: the daemon again, under vm.max_map_count lowered to 64 mappings above its
# reserve (4096): 32 per VM. VM 0 takes its share in CQs and keeps them while VM 1 makes 8.
map_limit() {
  local old fill i=0
  old=$(cat /proc/sys/vm/max_map_count)
  stop_daemon
  echo $((4096 + 64)) >/proc/sys/vm/max_map_count
  daemon "$1" || { echo "$old" >/proc/sys/vm/max_map_count; return 1; }
  rdma-peer fill --socket /tmp/vm0.sock --hold-secs 30 >/tmp/fill0.out 2>&1 &
  fill=$!
  i=0
  until grep -q 'fill:' /tmp/fill0.out; do [ $i -lt 100 ] || break; i=$((i + 1)); sleep 0.1; done
  cat /tmp/fill0.out
  rdma-peer fill --socket /tmp/vm1.sock --max 8
  vhost-user-rdma ctl --socket /tmp/mgmt.sock stats 0 | grep -E 'host share|configured|^  (maps|cq) '
  kill "$fill" 2>/dev/null
  echo "$old" >/proc/sys/vm/max_map_count
  echo "max_map_count back to $(cat /proc/sys/vm/max_map_count)"
}
# stop_daemon: the daemon stopped (5 s at most) and its sockets gone.
stop_daemon() {
  local pid i=0
  pid=$(pidof vhost-user-rdma) && kill "$pid"
  while [ -n "$pid" ] && [ -d "/proc/$pid" ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
  rm -f /tmp/mgmt.sock /tmp/vm0.sock /tmp/vm1.sock
}
# move_lines: after a failed move, what the daemon said of its QPs, holds and moves.
move_lines() {
  echo "DAEMON-LOG: its lines on QPs and moves, the last 40"
  grep -E 'QPN|QP 0x|hold|move|state' /tmp/daemon.log | tail -n 40
  echo "RXE-COUNTERS: $(/usr/local/bin/rdma statistic show link rxe0/1)"
  echo "NEIGHBOURS: $(ip neigh 2>&1 | tr '\n' ' ')"
  return 1
}
# move_out PEER: host 1's side of its VM 0 moving to host PEER with a live RC connection to VM 1
# (rdma-peer move-out, tests/src/vm_move.rs); the wait for PEER is long (its side comes after
# steps of its own) but reports progress.
move_out() {
  rdma-peer move-out --socket /tmp/vm0.sock --peer-socket /tmp/vm1.sock --mgmt /tmp/mgmt.sock \
    --tcp "$1:7482" --timeout-secs 900 || move_lines
}
# move_in PEER: host 2's side of a VM moving from host PEER with its live RC connection
# (rdma-peer move-in, tests/src/vm_move.rs) on a daemon started afresh (map_limit's runs under
# the lowered limit); then nothing of it is left.
move_in() {
  local before
  stop_daemon
  daemon "$1" || return 1
  before=$(res)
  rdma-peer move-in --socket /tmp/vm0.sock --mgmt /tmp/mgmt.sock --tcp 0.0.0.0:7482 ||
    move_lines || return 1
  leaks "$before"
}
# The data-path conformance tests on rxe0 (tests/tests/datapath*.rs); SKIPS names those whose
# behaviour is the NIC's.
conformance() {
  VUR_TEST_RNIC=verbs:rxe0:1 datapath --test-threads 1
  VUR_TEST_RNIC=verbs:rxe0:1 datapath_multi --test-threads 1 $SKIPS
  # UC's drops as the software RNIC counts them are its own.
  VUR_TEST_RNIC=verbs:rxe0:1 uc --test-threads 1 --skip what_rc_would_refuse_is_dropped
}
# A VM with live RC connections moves between two daemons on rxe0 (spec 20.8).
verbs_moves() {
  VUR_TEST_RNIC=verbs:rxe0:1 verbs_move --test-threads 1 --skip the_software_rnic --nocapture
}
# leaks BEFORE: every VM of the daemon gone, no object left, and the device's counts BEFORE.
leaks() {
  local i=0
  until vhost-user-rdma ctl --socket /tmp/mgmt.sock vms | awk 'NR > 1 && ($6 != "no" || $8 + $9 + $10 + $11 != 0) { bad = 1 } END { exit bad }'; do
    [ $i -lt 50 ] || break
    i=$((i + 1))
    sleep 0.2
  done
  vhost-user-rdma ctl --socket /tmp/mgmt.sock vms
  local now
  now=$(res)
  echo "device objects: before $1, now $now"
  [ "$now" = "$1" ] && echo "NO-LEAKS"
}
EOF
  echo "SKIPS='$skip_args'"
  echo "STEPS_ONLY='$only'"
  guest_tools rxe0
} >"$dir/tools.sh"
# The rxe provider and its .driver file come from STAGE-rxe (scripts/build-rdma-core.sh);
# `ip` stays busybox's, `rdma` is the host's iproute2 (busybox has none). rdma_ucm: the host's
# rdma_cm, which the daemons' CM bridges drive.
bash scripts/build-guest.sh --name rxe-host --load crc32_generic --load virtio_pci \
  --load virtio_net --load ib_uverbs --load rdma_rxe --load rdma_ucm \
  --file "$dir/tools.sh:/etc/tools.sh" \
  --file "$GUEST_STDBUF_FILE" \
  --file "$dir/server.sh:/etc/server.sh" --file "$dir/client.sh:/etc/client.sh" \
  --sysroot "$rc" --sysroot "$rc-rxe" --sysroot "$pt" \
  --bin "$(command -v rdma):/usr/local/bin/rdma" --bin target/release/vhost-user-rdma \
  --bin target/release/rdma-peer --bin "$dir/datapath:/usr/local/bin/datapath" \
  --bin "$dir/datapath_multi:/usr/local/bin/datapath_multi" \
  --bin "$dir/uc:/usr/local/bin/uc" --bin "$dir/verbs_move:/usr/local/bin/verbs_move" >/dev/null

# Two free UDP ports on the loopback for -netdev dgram.
launch_dgram_ports

# guest NAME INDEX CMD: host guest INDEX (10.43.0.INDEX+1) running CMD.
guest() {
  local name=$1 i=$2 cmd=$3 mine theirs
  mine=$([ "$i" = 0 ] && echo "$port0" || echo "$port1")
  theirs=$([ "$i" = 0 ] && echo "$port1" || echo "$port0")
  launch_guest "$name" --image rxe-host --smp "$smp" --stall 300 --append 'guest.uio=none' \
    --cmd ". /etc/tools.sh && up 10.43.0.$((i + 1)) && { $cmd; }; r=\$?; klog;
      [ \$r = 0 ] || daemon_log; exit \$r" -- \
    -netdev "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$mine,remote.type=inet,remote.host=127.0.0.1,remote.port=$theirs" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:01:0$((i + 1))"
}
t=$(date +%s)
guest server 0 ". /etc/server.sh"
guest client 1 ". /etc/client.sh"
launch_wait_guests server client
echo "== qemu-rxe: guests ran $(($(date +%s) - t)) s, exit ${rcs[0]} ${rcs[1]}"

# (grep on the file: `grep -q` at the end of a pipe can make its writer die of SIGPIPE, which
# pipefail reports as a failure.)
if grep -q 'state:.*PORT_ACTIVE' "$dir/server.console" &&
  grep -q 'link_layer:.*Ethernet' "$dir/server.console"; then
  ok "ibv_devinfo: rxe0 $(tr -d '\r' <"$dir/server.console" | grep -m1 -o 'state:.*PORT_ACTIVE.*'), Ethernet"
else
  failed "ibv_devinfo does not show an active Ethernet port on rxe0"
fi
check_after RNIC-INFO "rnic-info: the device" '^device: rxe0' server
check_after RNIC-INFO "rnic-info: port 1 active" '^port: 1 [(]active[)]' server
check_after RNIC-INFO "rnic-info: GID 1 is the interface's address" '^gid: ::ffff:10[.]43[.]0[.]1 [(]index 1[)]' server
check_after RNIC-INFO "rnic-info: what guests would be offered" '^offered: max_mtu [1-5] ' server
n='[0-9]+[.][0-9]+' s='[ \t]+'
for g in server client; do
  check_after RC "native ibv_rc_pingpong $g" "^50 iters in .* seconds" $g
  check_after PP64 "native ibv_rc_pingpong $g (64 B)" "^200 iters in .* usec/iter" $g
  check_after WRITE_LAT "native ib_write_lat $g (2 B, 200 iterations, µs)" "^ *2${s}200$s$n$s$n$s$n" $g
  check_after WRITE_BW "native ib_write_bw $g (65536 B, 200 iterations, MB/s)" "^ *65536${s}200$s$n$s$n$s$n" $g
  check_after WRITE_RATE "native ib_write_bw $g (64 B, 5000 iterations, MB/s, Mmsg/s)" "^ *64${s}5000$s$n$s$n$s$n" $g
  check_after WRITE_RATE "... and its CPU time ($g)" '^NATIVE-CPU ticks [1-9]' $g
  check_after VM-EXCHANGE "VM on host $g <-> VM on the other host: the checked exchange" \
    '^rdma-peer: exchange ok' $g
  check_after VM-UD "VM <-> VM across hosts over UD ($g)" '^rdma-peer: ud ok' $g
  check_after VM-CM-PROBE "the verbs daemon offers F_GSI; a VM's GSI QP reaches RTS ($g)" \
    '^rdma-peer: cm-probe: F_GSI offered, QP 1 in RTS' $g
  check_after VM-CM-PROBE "a CM REQ from host 2's VM through both CM bridges, rejected by host 1's VM ($g)" \
    '^rdma-peer: cm-probe ok' $g
  check_after INTEROP-VM-SERVER "interop, the VM serves, the native tool is the client ($g)" \
    "^200 iters in .* usec/iter" $g
  check_after INTEROP-NATIVE-SERVER "interop, the native tool serves, the VM is the client ($g)" \
    "^200 iters in .* usec/iter" $g
  check_after VM-PP64 "VM <-> VM ping-pong through the daemons ($g, 64 B)" "^200 iters in .* usec/iter" $g
  check_after AFTER-FAULT "both daemons serve after the fault: a new exchange ($g)" \
    '^rdma-peer: exchange ok' $g
  check_after LEAKS "no leak on host $g (daemon objects, host device objects)" '^NO-LEAKS' $g
  kernel_clean "$g"
done
check_after CM-RPING-VM-CLIENT "rping: a VM on host 1 (its own CM on QP 1, host 1's CM bridge) against native \`rping -s\` on host 2: 20 pings verified" \
  '^rdma-peer: rping-client: 20 pings verified' server
check_after CM-RPING-VM-CLIENT "... native rping -s on host 2 served them" '^server ping data: rdma-ping-19: ' client
check_after CM-RPING-VM-SERVER "rping: native \`rping -c -V\` on host 2 against a VM on host 1 (cm_listen 7480): 20 pings verified" \
  '^ping data: rdma-ping-19: ' client
check_after CM-RPING-VM-SERVER "... the VM served them and took the disconnection" '^rdma-peer: rping-server: 20 pings served' server
check_after VM-WRITE-LAT "write latency through the daemons (2 B, µs)" '^write_lat: size 2 ' client
for g in server client; do
  check_after VM-UC-LAT "UC QPs across hosts: the VM's UC QP on a host UC QP ($g)" \
    '^write_lat_uc QP: QPN .* connected to QPN' $g
  check_after VM-UC-LAT "... 200 round trips of WRITEs over UC, each one seen by the peer ($g)" \
    '^rdma-peer: write-lat ok' $g
done
check_after VM-UC-LAT "write latency over UC through the daemons (2 B, µs)" '^write_lat: size 2 ' client
check_after VM-WRITE-BW "write bandwidth through the daemons (65536 B)" '^write_bw: size 65536 ' client
check_after VM-WRITE-BW "the daemon's CPU time and work requests during it" '^DAEMON-CPU ticks [0-9]+ wqes [1-9]' client
check_after VM-WRITE-RATE "write message rate through the daemons (64 B)" '^write_bw: size 64 ' client
check_after VM-WRITE-RATE "the daemon's CPU time and work requests during it" '^DAEMON-CPU ticks [0-9]+ wqes [1-9]' client
check_after FAULT "host 2's link down mid-stream: the writer's WRITE fails (RETRY_EXC_ERR)" \
  'RETRY_EXC_ERR' server
check_after FAULT "... and the writer exits with that error" '^FAULT-WRITER-EXIT [1-9]' server
check_after FAULT "... and the reader on host 2 exits with an error too" '^FAULT-READER-EXIT [1-9]' client
check_after PORT-EVENTS "host 2's daemon saw its port go down" 'rxe0: port down' client
check_after PORT-EVENTS "... and failed the RC QP of its VM with QP_FATAL" 'port down: 1 RC QPs of VM 1 fail' client
check_after PORT-EVENTS "... and come back" 'rxe0: port active' client
check_after MAP-LIMIT "lowered vm.max_map_count: a VM's CQs are refused at its mapping share (QUOTA, detail 10)" \
  '^rdma-peer: fill: 32 CQs, then QUOTA detail 10' client
check_after MAP-LIMIT "... while the other VM still creates its own" '^rdma-peer: fill: 8 CQs[^,]*$' client
check_after MAP-LIMIT "... the daemon shows the first VM's mappings at its share" '^  maps +[0-9]+ +32 +32 +32' client
check_after CONFORMANCE "conformance tests on rxe: tests/datapath.rs" '^test result: ok[.] 17 passed' server
check_after CONFORMANCE "conformance tests on rxe: tests/datapath_multi (those that apply)" \
  "^test result: ok[.] [0-9]+ passed; 0 failed; 0 ignored; 0 measured; ${#skips[@]} filtered out" server
check_after CONFORMANCE "conformance tests on rxe: tests/uc.rs (UC QPs on host UC QPs)" \
  '^test result: ok[.] 5 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out' server
check_after VERBS-MOVE "a VM with live RC connections moves between daemons on rxe0 (tests/verbs_move.rs)" \
  '^test result: ok[.] 1 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out' server
check_after VERBS-MOVE "... the blackout its peer saw" '^verbs-move: blackout [0-9]+ ms' server
check_after VERBS-MOVE-HOSTS "a VM with a live RC connection moves from host 1's daemon to host 2's: its peer's held WRITE lands, 25 rounds across the hosts, every byte checked" \
  '^rdma-peer: move-out ok' server
check_after VERBS-MOVE-HOSTS "... the blackout its peer on host 1 saw" '^move-hosts: blackout [0-9]+ ms' server
check_after VERBS-MOVE-HOSTS "... host 2 brought it up from its image and destroyed its objects at the end" \
  '^rdma-peer: move-in ok' client
check_after VERBS-MOVE-HOSTS "... and nothing of it is left on host 2" '^NO-LEAKS' client
# Every step ran whatever the others did; these name the ones that failed.
for g in server client; do
  steps=$(tr -d '\r' <"$dir/$g.console" | grep -E '^STEPS(-FAILED)?:' | tail -n1)
  if [ "$steps" = "STEPS: all passed" ]; then
    ok "$g: every step exited 0"
  else
    failed "$g: steps that failed:${steps#STEPS-FAILED:}${steps:+}$([ -n "$steps" ] || echo " (no verdict: the guest stopped early)")"
  fi
done
if [ "$fail" != 0 ]; then
  for g in server client; do
    show_log "$g console" "$dir/$g.console"
  done
fi
echo "== qemu-rxe: whole run $(($(date +%s) - t_start)) s"
verdict qemu-rxe
