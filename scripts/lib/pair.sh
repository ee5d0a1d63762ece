# shellcheck shell=bash
# What the scripts share that run an RDMA tool between two QEMU guests on one daemon while
# something happens to them (scripts/qemu-migrate.sh: a live migration; scripts/qemu-upgrade.sh:
# the daemon's live upgrade): the guests' helpers, their image, the tool's command line and
# result row, each guest's command and network interface. Source it after scripts/lib/launch.sh
# and guest/checks.sh ($dir, guest_tools).

# pair_tools: what the guests' commands source first (/etc/tools.sh): guest_tools for
# virtio_rdma0, net_up N (the paired interface up as 10.42.0.N: the driver registers its verbs
# device on it), wait_dev (until virtio_rdma0's port is active) and wait_gid (until its GID 1,
# the interface's address, is there).
pair_tools() {
  guest_tools virtio_rdma0
  cat <<'EOF'
net_up() {
  modprobe virtio_net && ip link set eth0 up && ip addr add 10.42.0.$1/24 dev eth0
}
wait_dev() {
  local i=0
  until ibv_devinfo -d virtio_rdma0 2>/dev/null | grep -q PORT_ACTIVE; do
    [ $i -lt 300 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
}
wait_gid() {
  local i=0
  until grep -q ffff /sys/class/infiniband/virtio_rdma0/ports/1/gids/1 2>/dev/null; do
    [ $i -lt 100 ] || return 1
    i=$((i + 1))
    sleep 0.1
  done
}
EOF
}

# pair_image NAME TOOLS KMOD RDMA-CORE [TOOL]: builds the guest image NAME (for $kernel) with
# virtio_rdma.ko (KMOD), rdma-core (RDMA-CORE's tree) and TOOLS as /etc/tools.sh; with a
# perftest TOOL (*_bw), Debian's perftest too, in an image NAME-perftest. Sets image.
pair_image() {
  local extra=()
  image=$1
  case "${5:-}" in
  *_bw) image=$1-perftest extra=(--sysroot "$(bash "$LAUNCH_REPO/scripts/fetch-perftest.sh")") ;;
  esac
  # shellcheck disable=SC2154 # kernel: guest_script_args
  bash "$LAUNCH_REPO/scripts/build-guest.sh" --kernel "$kernel" --name "$image" \
    --load virtio_pci --load virtio_net --load ib_uverbs --file "$3:/lib/virtio_rdma.ko" \
    --file "$2:/etc/tools.sh" --file "$GUEST_STDBUF_FILE" --sysroot "$4" "${extra[@]}" >/dev/null
}

# pair_tool TOOL SIZE SECONDS: the tool between the guests, `pingpong` (ibv_rc_pingpong,
# $PAIR_PINGPONG_ITERS iterations of 4 KiB, default 200000: enough to outlast the migrations
# and upgrades the scripts make meanwhile, at 0.2-0.8 ms per iteration under TCG) or a
# perftest bandwidth test (write_bw, read_bw, atomic_bw: Debian's
# unmodified ib_*_bw over GID 1, -x 1, with the TCP exchange; SIZE-byte messages, atomics 8;
# -D SECONDS, measured from 3 s after the start to 3 s before the end, -f 3: perftest's default
# margins are a quarter of -D at each end). Sets label (the guests' step), tool_name, tool_line
# (the client's `run` adds the server's address), size (the message size) and row (the pattern
# of the result row both sides print).
# shellcheck disable=SC2034 # read by the scripts
pair_tool() {
  local n='[0-9]+[.][0-9]+' sp='[[:space:]]+'
  size=$2
  case "$1" in
  pingpong)
    local iters=${PAIR_PINGPONG_ITERS:-200000}
    label=RC tool_name=ibv_rc_pingpong tool_line="ibv_rc_pingpong -g 1 -n $iters -s 4096"
    row="^$iters iters in .* seconds"
    ;;
  *_bw)
    # perftest's row: "#bytes #iterations BW-peak BW-average[MB/s] MsgRate[Mpps]".
    label=${1^^} tool_name=ib_$1
    tool_line="ib_$1 -x 1 -D $3 -f 3"
    if [ "$1" = atomic_bw ]; then size=8; else tool_line="$tool_line -s $size"; fi
    row="^ *$size${sp}[0-9]+$sp$n$sp$n$sp$n"
    ;;
  *) guest_die "pair_tool: pingpong or a perftest bandwidth test, not $1" ;;
  esac
}

# pair_cmd N PEER BODY: a guest's command: its interface up as 10.42.0.N, virtio_rdma.ko loaded,
# the device ready (BEFORE-OK); then on the client (PEER, the server's address; empty on the
# server) until the server answers a ping; then BODY (steps: `run $label $tool_line`) and the
# steps' verdict; the kernel's warnings at the end.
pair_cmd() {
  local reach=''
  # shellcheck disable=SC2016 # the guest's shell expands it
  [ -z "$2" ] || reach=' && until ping -c 1 -W 1 $peer >/dev/null; do sleep 1; done'
  echo ". /etc/tools.sh && net_up $1 && insmod /lib/virtio_rdma.ko && wait_dev &&
    wait_gid && echo BEFORE-OK && peer=$2$reach && { $3; steps_verdict; };
    r=\$?; klog; exit \$r"
}

# pair_nic NAME MAC [PEER]: QEMU arguments for guest NAME's interface, paired with its RDMA
# device by MAC: a stream server on $dir/NAME-net.sock, or, with PEER, a client of PEER's
# (reconnecting: PEER may come up later, or be a migration's destination).
pair_nic() {
  # shellcheck disable=SC2154 # dir: launch_workdir
  local net="server=on,addr.type=unix,addr.path=$dir/$1-net.sock"
  [ -z "${3:-}" ] || net="server=off,addr.type=unix,addr.path=$dir/$3-net.sock,reconnect-ms=500"
  echo "-netdev stream,id=n0,$net -device virtio-net-pci,netdev=n0,mac=$2"
}
