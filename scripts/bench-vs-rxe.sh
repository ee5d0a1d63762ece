#!/usr/bin/env bash
# Benchmark (not a test: scripts/test.sh does not run it): our device against Linux's own
# software RDMA, between the same two QEMU/TCG guests (Debian 12's 6.1 kernel, one vCPU each), in
# one boot. Each guest has
#   - virtio_rdma0: the vhost-user-rdma daemon on its default software RNIC (one daemon, two VM
#     sockets) and virtio_rdma.ko (scripts/build-kmod.sh), paired with the guest's virtio-net
#     interface by MAC, whose address is the device's GID (::ffff:10.42.0.1 and .2, the daemon's
#     defaults: GID index 1);
#   - rxe0: Linux soft-RoCE (`rdma link add rxe0 type rxe netdev eth0`) on that same interface;
#     the two interfaces are joined by `-netdev dgram` (UDP on the host's loopback, as in
#     scripts/qemu-rxe.sh: RoCEv2 over `-netdev stream` takes ~40 ms per round trip);
#   - siw0 only if the guest kernel has siw: Debian's 6.1 (and 6.12) kernels are built without
#     it (CONFIG_RDMA_SIW is not set), which the script checks in the kernel's config and says.
# Both rdma-core providers (virtio_rdma, rxe: scripts/build-rdma-core.sh, STAGE and STAGE-rxe)
# are in /etc/libibverbs.d, so libibverbs offers both devices to the same, unmodified perftest
# (Debian bookworm's, scripts/fetch-perftest.sh). For R rounds (--rounds, default 3) the devices
# alternate (virtio_rdma0, rxe0, virtio_rdma0, ...) and each runs, server in guest 1 and client
# in guest 2, with -d DEVICE, GID index 1 (-x 1), perftest's TCP exchange (a port of its own
# per run) and:
#   ib_write_lat, ib_read_lat, ib_send_lat   2 B, -n ITERS (--iters, default 500)
#   ib_write_bw                              64 B, -n 20 x ITERS (message rate)
#   ib_write_bw, ib_send_bw                  64 KiB, -n ITERS
# Host CPU: perftest's output goes to a virtio console of each guest (hvc0; the serial console,
# one emulated character at a time, lags by tenths of a second and loads the guest during the
# measured loop). The client's reaches a host monitor over a socket as it is written, which
# takes, when perftest prints its result header (the measured loop starts) and its result row,
# the run time of every thread of the daemon and of both guests' QEMU processes
# (/proc/PID/task/*/schedstat, ns). The table shows the daemon's, over the row's iterations:
# what our device costs the host besides the guests. Between the loop's end and the row,
# perftest calibrates its clock for ~0.2 s, while the daemon idles (its idle cost is in the
# rxe0 runs' samples of the raw file: a few µs per operation at worst). Soft-RoCE's CPU cost is
# not shown: it runs on the guests' emulated CPUs, inside QEMU, together with perftest's busy
# polling of its CQ (and that calibration), which keep each vCPU busy whichever device is used;
# the QEMUs' run time is in the raw file, but under TCG it measures the loop's length, not what
# rxe costs.
#
# Prints the command line, the machine (load average before and after), each run's verdict
# ("ok: R1 virtio_rdma0 write_lat: <perftest's row>", or FAILED with why), and at the end one
# table per test: the median over the rounds for each device of t_min, t_typical, t_avg and the
# 99th percentile (µs, latency tests) or of BW average (MB/s as perftest prints it, i.e. MiB/s)
# and the message rate (Mpps), the factor by which virtio_rdma0 is better (latency: rxe / virtio,
# how many times lower ours is; bandwidth: virtio / rxe, how many times higher), and the
# daemon's CPU per operation. The raw rows and CPU samples go to target/bench-vs-rxe/results-DATE.txt.
# A run that fails or hangs (each is stopped after 300 s without finishing) is reported and the
# others go on; the last line is "bench-vs-rxe: N passed, M failed", and the exit status is
# nonzero if any run or check failed.
#
# Usage: bash scripts/bench-vs-rxe.sh [--rounds N] [--iters N] [--tests LIST] [--pin] [--keep]
#   --rounds N  rounds of every test on every device (default 3)
#   --tests L   only these tests, comma-separated (write_lat, read_lat, send_lat, write_bw_64,
#               write_bw_64k, send_bw_64k; default all)
#   --iters N   latency iterations (default 500); bandwidth: 20 x N at 64 B, N at 64 KiB
#   --pin       both guests' QEMU on CPU 0, the daemon (and its engine thread, --engine-cpus)
#               on CPU 1, for both devices alike (taskset)
#   --keep      keep the work directory (consoles, daemon log)
# Run it under a lock of your own (for example `flock /tmp/qemu.lock ...`) when others boot
# guests too. About 2 minutes with the defaults on a 2-core machine (3 with --pin), once the
# guest's parts are built and cached.
set -euo pipefail
cd "$(dirname "$0")/.."
cmdline="bash scripts/bench-vs-rxe.sh $*"
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
# shellcheck source=guest/versions.sh
. guest/versions.sh
# shellcheck source=guest/checks.sh
. guest/checks.sh

usage() { sed -n '/^# Usage:/,/^# Run it/p' "$0" | sed 's/^# \{0,1\}//'; }
rounds=3 iters=500 pin=0 keep=0 only=
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
  --iters) iters=${2:?--iters needs a number}; shift 2 ;;
  --tests) only=${2:?--tests needs a list}; shift 2 ;;
  --pin) pin=1; shift ;;
  --keep) keep=1; shift ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; guest_die "unknown argument: $1" ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || guest_die "--rounds: a positive number, not $rounds"
[[ "$iters" =~ ^[1-9][0-9]*$ ]] || guest_die "--iters: a positive number, not $iters"
[ "$pin" = 0 ] || [ "$(nproc)" -ge 2 ] || guest_die "--pin needs 2 CPUs"
t_start=$(date +%s)
echo "== bench-vs-rxe: $cmdline"
echo "   machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -r)"

guest_need_pkgs iproute2 util-linux python3
launch_need_qemu
cargo build --release --locked -q -p vhost-user-rdma
kmod=$(bash scripts/build-kmod.sh --kernel 6.1)
rc=$(bash scripts/build-rdma-core.sh)
pt=$(bash scripts/fetch-perftest.sh)
launch_workdir bench-vs-rxe
results_dir=${CARGO_TARGET_DIR:-target}/bench-vs-rxe
mkdir -p "$results_dir"
results="$results_dir/results-$(date +%Y%m%d-%H%M%S).txt"

# The tests: NAME TOOL SIZE ITERATIONS KIND (lat: a latency row, bw: a bandwidth row).
tests=(
  "write_lat ib_write_lat 2 $iters lat"
  "read_lat ib_read_lat 2 $iters lat"
  "send_lat ib_send_lat 2 $iters lat"
  "write_bw_64 ib_write_bw 64 $((20 * iters)) bw"
  "write_bw_64k ib_write_bw 65536 $iters bw"
  "send_bw_64k ib_send_bw 65536 $iters bw"
)
if [ -n "$only" ]; then
  picked=()
  for name in ${only//,/ }; do
    found=0
    for t in "${tests[@]}"; do
      [ "${t%% *}" = "$name" ] && { picked+=("$t"); found=1; }
    done
    [ "$found" = 1 ] || guest_die "--tests: no test named $name"
  done
  tests=("${picked[@]}")
fi
devices=(virtio_rdma0 rxe0)

# The guests' steps, the same file for both (the client's $peer is the server's address); one
# step per round, device and test, each on a TCP port of its own so that a run whose other side
# failed never meets the next run's.
port=18600
{
  echo 'step SETUP-rxe0 setup_rxe'
  echo 'step SETUP-virtio_rdma0 setup_virtio'
  for r in $(seq "$rounds"); do
    for d in "${devices[@]}"; do
      for t in "${tests[@]}"; do
        read -r name tool size n _ <<<"$t"
        port=$((port + 1))
        echo "perf R$r-$d-$name $d $port $tool -x 1 -s $size -n $n"
      done
    done
  done
  echo 'steps_verdict'
} >"$dir/steps.sh"

# What the guests' commands source first: guest_tools (guest/checks.sh: step, steps_verdict,
# linebuf, klog), and
#   setup_rxe / setup_virtio: rxe0 on eth0, virtio_rdma.ko; each waits for its device's port to
#     be active with GID 1, the interface's address;
#   perf LABEL DEVICE PORT TOOL ARGS...: a step running TOOL ARGS -d DEVICE -p PORT (and the
#     server's address on the client), its output on hvc0 after a line "== LABEL", as it comes;
#     the client tries again while the server's tool is not listening yet (for at most 120 s).
#     The step is stopped once it has run for $STALL s (its output does not go through `step`,
#     so its stall watch is a time limit here).
{
  guest_tools virtio_rdma0
  cat <<'EOF'
STALL=300
wait_port() {
  local i=0
  until grep -q ffff "/sys/class/infiniband/$1/ports/1/gids/1" 2>/dev/null &&
    grep -q ACTIVE "/sys/class/infiniband/$1/ports/1/state" 2>/dev/null; do
    [ $i -lt 300 ] || { echo "$1: port 1 not active with GID 1 after 30 s"; return 1; }
    i=$((i + 1))
    sleep 0.1
  done
  echo "$1: port 1 $(cat "/sys/class/infiniband/$1/ports/1/state"), GID 1 $(cat "/sys/class/infiniband/$1/ports/1/gids/1")"
}
setup_rxe() {
  [ -c /dev/hvc0 ] || { echo "no /dev/hvc0 (virtio console)"; return 1; }
  /usr/local/bin/rdma link add rxe0 type rxe netdev eth0 && wait_port rxe0
}
setup_virtio() {
  insmod /lib/virtio_rdma.ko && wait_port virtio_rdma0
}
pconnect() {
  local label=$1 dev=$2 port=$3 t0
  shift 3
  t0=$(date +%s)
  echo "== $label" >/dev/hvc0
  # shellcheck disable=SC2086 # $peer: empty on the server
  until linebuf "$@" -d "$dev" -p "$port" $peer >/dev/hvc0 2>/tmp/err; do
    grep -q "Couldn't connect to" /tmp/err && [ $(($(date +%s) - t0)) -lt 120 ] || {
      cat /tmp/err
      return 1
    }
    sleep 0.2
  done
  cat /tmp/err
}
perf() {
  step "$1" pconnect "$@"
}
EOF
} >"$dir/tools.sh"

# The image: both provider sets, perftest, the host's `rdma` (iproute2; busybox has none), rxe
# and virtio_rdma.ko (loaded by the steps). Its own name: others' scripts rebuild theirs.
bash scripts/build-guest.sh --kernel 6.1 --name bench-vs-rxe --load crc32_generic \
  --load virtio_pci --load virtio_net --load virtio_console --load ib_uverbs --load rdma_rxe \
  --file "$kmod:/lib/virtio_rdma.ko" --file "$dir/tools.sh:/etc/tools.sh" \
  --file "$dir/steps.sh:/etc/steps.sh" --file "$GUEST_STDBUF_FILE" \
  --sysroot "$rc" --sysroot "$rc-rxe" --sysroot "$pt" \
  --bin "$(command -v rdma):/usr/local/bin/rdma" >/dev/null

# siw: only if the guest kernel has it (its config, as the image's kernel package has it).
kconfigs=("$GUEST_CACHE/kernel/${GUEST_KERNEL_PKG}_${GUEST_KERNEL_VERSION}"/boot/config-*)
siw_line=$(grep -E '^(# )?CONFIG_RDMA_SIW[ =]' "${kconfigs[0]}" 2>/dev/null || echo "no CONFIG_RDMA_SIW line")
case "$siw_line" in
CONFIG_RDMA_SIW=[my])
  siw_note="the guest kernel has siw ($siw_line), but scripts/build-rdma-core.sh does not stage"
  siw_note="$siw_note rdma-core's siw provider: siw0 not measured"
  ;;
*)
  siw_note="the guest kernel ($GUEST_KERNEL_PKG $GUEST_KERNEL_VERSION) has no siw"
  siw_note="$siw_note ($siw_line): siw0 not measured"
  ;;
esac
echo "   devices: ${devices[*]}; $siw_note"

# One daemon on the software RNIC, a VM socket per guest, each VM paired with its guest's
# virtio-net interface by MAC. --pin: its engine thread and then every thread of it on CPU 1.
pin_args=()
[ "$pin" = 0 ] || pin_args=(--engine-cpus 1)
launch_daemon --wait "$dir/vm0.sock" --wait "$dir/vm1.sock" --wait "$dir/mgmt.sock" \
  --mgmt-socket "$dir/mgmt.sock" --socket-path "$dir/vm0.sock" --socket-path "$dir/vm1.sock" \
  --mac vm0=52:54:00:00:00:01 --mac vm1=52:54:00:00:00:02 "${pin_args[@]}"
daemon_pid=$launch_pid
[ "$pin" = 0 ] || taskset -a -p -c 1 "$daemon_pid" >/dev/null

launch_dgram_ports
# guest NAME INDEX PERF CMD: guest INDEX (10.42.0.INDEX+1, VM socket vmINDEX) running CMD after
# the interface is up, its hvc0 on the chardev PERF; with --pin, its QEMU (every thread) on CPU 0
# once it runs.
guest() {
  local name=$1 i=$2 perf=$3 cmd=$4 mine theirs
  mine=$([ "$i" = 0 ] && echo "$port0" || echo "$port1")
  theirs=$([ "$i" = 0 ] && echo "$port1" || echo "$port0")
  launch_guest "$name" --image bench-vs-rxe --stall 600 --append 'guest.uio=none' \
    --cmd ". /etc/tools.sh && ulimit -l unlimited && ip link set eth0 up &&
      ip addr add 10.42.0.$((i + 1))/24 dev eth0 && { $cmd; }; r=\$?; klog; exit \$r" -- \
    -chardev "socket,id=rdma,path=$dir/vm$i.sock" -device vhost-user-rdma-pci,chardev=rdma \
    -netdev "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$mine,remote.type=inet,remote.host=127.0.0.1,remote.port=$theirs" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0$((i + 1))" \
    -device virtio-serial-pci -chardev "$perf,id=perf" -device virtconsole,chardev=perf
  if [ "$pin" = 1 ]; then
    if ! wait_until "$launch_pid" "$dir/$name.console" test -s "$dir/$name.pid" ||
      ! taskset -a -p -c 0 "$(cat "$dir/$name.pid")" >/dev/null; then
      failed "could not pin $name's QEMU to CPU 0"
    fi
  fi
}

# The host's monitor: reads the client's hvc0 (perftest's output) from its socket as it comes,
# keeps it in $dir/client.perf, and for each step takes the run time (ns) of every thread of the
# daemon and of both QEMUs at perftest's result header and at its result row. Writes
# "LABEL SECONDS DAEMON-NS QEMU-NS" per step to $dir/cpu.txt.
cat >"$dir/monitor.py" <<'EOF'
import glob, re, socket, sys, time
sock_path, copy, out, daemon = sys.argv[1:5]
pidfiles = sys.argv[5:]
row = re.compile(r"^\s*\d+\s+\d+\s+(\d|inf)")

def runtime(pid):
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total

def snap():
    q = 0
    for p in pidfiles:
        try:
            q += runtime(int(open(p).read().strip()))
        except (OSError, ValueError):
            pass
    return (time.monotonic(), runtime(daemon), q)

s = socket.socket(socket.AF_UNIX)
deadline = time.monotonic() + 300
while True:
    try:
        s.connect(sock_path)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("monitor: cannot connect to " + sock_path)
        time.sleep(0.1)
label = start = None
buf = b""
with open(out, "w") as o, open(copy, "wb") as c:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        c.write(chunk)
        c.flush()
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            if line.startswith("== "):
                label, start = line[3:], None
            elif label and start is None and "#bytes" in line:
                start = snap()
            elif label and start and row.match(line):
                end = snap()
                print(label, f"{end[0] - start[0]:.4f}", end[1] - start[1], end[2] - start[2],
                      file=o, flush=True)
                label = start = None
EOF

t=$(date +%s)
load_before=$(uptime)
echo "   before: $load_before"
guest server 0 "file,path=$dir/server.perf" "peer=; . /etc/steps.sh"
guest client 1 "socket,path=$dir/client-perf.sock,server=on,wait=off" \
  "peer=10.42.0.1; until ping -c 1 -W 1 \$peer >/dev/null; do sleep 1; done; . /etc/steps.sh"
launch_bg python3 "$dir/monitor.py" "$dir/client-perf.sock" "$dir/client.perf" "$dir/cpu.txt" \
  "$daemon_pid" "$dir/server.pid" "$dir/client.pid" </dev/null
monitor_pid=$launch_pid
launch_wait_guests server client
load_after=$(uptime)
echo "== bench-vs-rxe: guests ran $(($(date +%s) - t)) s, exit ${rcs[0]} ${rcs[1]}"
# The monitor ends with the client's QEMU (its socket closes).
i=0
while launch_alive "$monitor_pid" && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
launch_wait "$monitor_pid" || failed "the host's monitor (perftest's output, CPU times) failed"

# Verdicts: the setup steps on both sides, then every run: both sides' step exit 0 and the
# client's result row.
for g in server client; do
  for s in SETUP-rxe0 SETUP-virtio_rdma0; do
    if tr -d '\r' <"$dir/$g.console" | grep -qx "STEP $s exit 0"; then
      ok "$g: $s: $(after "$s" 'port 1' "$g")"
    else
      failed "$g: $s: $(tr -d '\r' <"$dir/$g.console" | grep -A3 -x "$s" | tail -n +2 | tr '\n' ' ')"
    fi
  done
done
n='([0-9]+[.][0-9]+|inf|-?nan)' s='[[:space:]]+'
{
  echo "# $cmdline"
  echo "# $(date -Is), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# before: $load_before"
  echo "# after: $load_after"
  echo "# $siw_note"
  echo "# round device test exit(server,client) seconds daemon_ns qemus_ns | perftest's row"
  echo "# (seconds, daemon_ns, qemus_ns: from perftest's result header to its row, host clock)"
} >"$results"
for r in $(seq "$rounds"); do
  for d in "${devices[@]}"; do
    for tst in "${tests[@]}"; do
      read -r name tool size iter kind <<<"$tst"
      label="R$r-$d-$name"
      if [ "$kind" = lat ]; then
        pat="^ *$size$s$iter$s$n$s$n$s$n$s$n"
      else
        pat="^ *$size$s$iter$s$n$s$n$s$n"
      fi
      line=$(awk -v m="== $label" -v p="$pat" '{ sub(/\r$/, "") } $0 == m { f = 1; next }
        f && /^== / { exit } f && $0 ~ p { print; exit }' "$dir/client.perf" 2>/dev/null)
      ex=()
      for g in server client; do
        e=$(tr -d '\r' <"$dir/$g.console" | sed -n "s/^STEP $label exit \([0-9]*\)$/\1/p" | head -n1)
        ex+=("${e:-none}")
      done
      cpu=$(awk -v l="$label" '$1 == l { print $2, $3, $4; exit }' "$dir/cpu.txt" 2>/dev/null)
      echo "$r $d $name ${ex[0]},${ex[1]} ${cpu:-- - -} | $line" >>"$results"
      if [ -n "$line" ] && [ "${ex[0]}" = 0 ] && [ "${ex[1]}" = 0 ]; then
        ok "R$r $d $name ($tool -s $size -n $iter): $(echo "$line" | tr -s ' ' | sed 's/^ //')"
      else
        why="exit ${ex[0]} (server), ${ex[1]} (client)"
        [ -n "$line" ] || why="$why, no result row"
        [ "${ex[1]}" != 124 ] || why="$why (stopped after 300 s)"
        err=$(tr -d '\r' <"$dir/client.console" | awk -v l="$label" '$0 == l { f = 1; next }
          f && /^STEP / { exit } f && /([Ee]rror|[Ff]ail|[Uu]nable|[Cc]ouldn|not found)/ { print; n++ } n == 2 { exit }' | tr '\n' ' ')
        failed "R$r $d $name ($tool -s $size -n $iter): $why${err:+: $err}"
      fi
    done
  done
done
for g in server client; do
  kernel_clean "$g"
done
if kill -0 "$daemon_pid" 2>/dev/null; then ok "the daemon is alive"; else failed "the daemon died"; fi

# The tables: medians over the rounds, per test and device.
python3 - "$results" "$rounds" <<'EOF'
import statistics, sys
path, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for line in open(path):
    if line.startswith("#"):
        continue
    head, _, row = line.partition("|")
    r, dev, test, ex, secs, dt, qt = head.split()
    runs.setdefault(test, {}).setdefault(dev, []).append((ex, secs, dt, qt, row.split()))

def num(x):
    try:
        v = float(x)
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    except ValueError:
        return None

def med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), len(xs)) if xs else (None, 0)

def fmt(v, nd=2):
    return "-" if v is None else f"{v:,.{nd}f}"

titles = {
    "write_lat": "ib_write_lat, 2 B, µs", "read_lat": "ib_read_lat, 2 B, µs",
    "send_lat": "ib_send_lat, 2 B, µs", "write_bw_64": "ib_write_bw, 64 B",
    "write_bw_64k": "ib_write_bw, 64 KiB", "send_bw_64k": "ib_send_bw, 64 KiB",
}
lat_cols = [("t_min", 2), ("t_typical", 4), ("t_avg", 5), ("p99", 7)]
bw_cols = [("BW avg MB/s", 3), ("Mpps", 4)]
print(f"\n== medians over {rounds} round(s); 'virtio better' is rxe/virtio for latency "
      "(times lower), virtio/rxe for bandwidth (times higher); host CPU: the daemon's run time "
      "per operation, from perftest's result header to its row (rxe0's CPU is on the guests' "
      "vCPUs: not separable under TCG)")
for test, title in titles.items():
    if test not in runs:
        continue
    devs = runs[test]
    lat = test.endswith("_lat")
    cols = lat_cols if lat else bw_cols
    print(f"\n{title}")
    print(f"| {'':24} | {'virtio_rdma0':>12} | {'rxe0':>12} | {'virtio better':>13} |")
    print(f"|{'-' * 26}|{'-' * 14}|{'-' * 14}|{'-' * 15}|")
    for name, idx in cols:
        m = {}
        for dev in ("virtio_rdma0", "rxe0"):
            vals = [num(row[idx]) if len(row) > idx else None for _, _, _, _, row in devs.get(dev, [])]
            m[dev] = med(vals)
        v, x = m["virtio_rdma0"][0], m["rxe0"][0]
        ratio = None
        if v and x:
            ratio = x / v if lat else v / x
        nd = 6 if name == "Mpps" else 2
        print(f"| {name:24} | {fmt(v, nd):>12} | {fmt(x, nd):>12} | {fmt(ratio) + ' x' if ratio else '-':>13} |")
    # The daemon's run time per operation, in µs: over the row's iterations.
    vals = []
    for _, _, dt, _, row in devs.get("virtio_rdma0", []):
        if dt != "-" and len(row) > 1 and row[1].isdigit():
            vals.append(int(dt) / 1e3 / int(row[1]))
    v = med(vals)[0]
    print(f"| {'host CPU/op µs (daemon)':24} | {fmt(v):>12} | {'n/a':>12} | {'':>13} |")
    for dev in ("virtio_rdma0", "rxe0"):
        have = sum(1 for r in devs.get(dev, []) if len(r[4]) > 2)
        if have < rounds:
            print(f"  ({dev}: a result row in {have} of {rounds} rounds only)")
print()
EOF
# The engine's counters over the whole run (LATE_KICKS: work its re-check found before the
# notification came).
echo "   engine threads at the end:"
"${DAEMON}" ctl --socket "$dir/mgmt.sock" engines 2>&1 | sed 's/^/     /' || true
echo "   siw: $siw_note"
echo "   raw rows: $results"
echo "   after: $load_after"
if [ "$fail" != 0 ]; then
  for g in server client; do
    show_log "$g console (last 60 lines)" <(tail -n 60 "$dir/$g.console")
    show_log "$g perftest output (hvc0, last 30 lines)" <(tail -n 30 "$dir/$g.perf" 2>/dev/null)
  done
  show_log "daemon log (warnings and errors, last 40)" <(grep -E 'WARN|ERROR' "$dir/daemon.log" | tail -n 40)
fi
echo "== bench-vs-rxe: whole run $(($(date +%s) - t_start)) s"
verdict bench-vs-rxe
