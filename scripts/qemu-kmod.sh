#!/usr/bin/env bash
# The Linux guest driver in a real guest: builds virtio_rdma.ko (scripts/build-kmod.sh) for the
# test guest's kernel, boots one QEMU guest with our vhost-user-rdma-pci device on a running
# daemon and a virtio-net interface with the MAC the daemon's configuration pairs the port with,
# loads the module through the kernel's own virtio_pci before virtio_net (the driver waits for
# the interface: no verbs device until virtio_net is loaded), and checks that it bound the device
# (ABI version accepted, control queue answering), registered a RoCE verbs device on that
# interface once it appeared (`rdma link`), and that ib_core's GID table holds the VM's GID, taken
# from the interface's IP address; runs guest-driver/tests/vrdma-check.c (objects, data, the
# attributes the driver reports and the device's async events through ibv_get_async_event) and
# guest-driver/tests/vrdma-reset.sh (device resets under a process holding objects:
# IBV_EVENT_DEVICE_FATAL, errors not hangs, the device back); then removes virtio_net (the verbs
# device goes with its interface, and the removal does not hang on the interface's reference)
# and loads it again (the verbs device comes back on the new interface); then makes ib_core offer
# the interface's link-local address (the device's default GID) before its IPv4 address while
# ib_core's default slot is empty (another MAC address on the interface for a while), and checks
# that the VM's GID is still index 1 (the driver takes the default GID in slot 0 only).
# Meanwhile a second guest runs on a device without device feature bits (a second daemon with
# ud/srq/atomics off: what cloud-hypervisor's generic vhost-user device gives a guest):
# vrdma-check transport-only.
# With --kernel 6.12 the same checks run on Debian 13's 6.12 kernel (the module built for it,
# a guest image with that kernel).
# Prints "qemu-kmod: N passed, M failed" (6.1), "qemu-kmod-6.12: N passed, M failed" (6.12).
#
# Usage: bash scripts/qemu-kmod.sh [--kernel 6.1|6.12] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/launch.sh
. scripts/lib/launch.sh
guest_need_pkgs iproute2
guest_script_args "$@"
case "$kernel" in
6.1) name=qemu-kmod image=rdma-kmod ;;
6.12) name=qemu-kmod-6.12 image=rdma-kmod-6.12 ;;
esac

launch_need_qemu
cargo build --release --locked -q -p vhost-user-rdma
kmod=$(bash scripts/build-kmod.sh --kernel "$kernel")
rdma_core=$(bash scripts/build-rdma-core.sh) # a sysroot: installed as a distribution would
echo "== $name: $kmod"
echo "   $(modinfo -F vermagic "$kmod" 2>/dev/null || strings "$kmod" | grep -m1 '^vermagic=')"
bash scripts/build-guest.sh --kernel "$kernel" --name "$image" --load virtio_pci --module virtio_net \
  --load ib_uverbs --bin "$(command -v rdma)" --file "$kmod:/lib/virtio_rdma.ko" \
  --sysroot "$rdma_core" >/dev/null

launch_workdir kmod

mac=52:54:00:12:34:56
printf '[[tenant]]\nname = "t"\n\n[[vm]]\nname = "vm0"\nsocket = "%s"\ntenant = "t"\nmac = "%s"\n' "$dir/vm0.sock" "$mac" >"$dir/config.toml"
launch_daemon --wait "$dir/vm0.sock" --config "$dir/config.toml"

# Meanwhile a second guest on a device that offers no device feature bits, as cloud-hypervisor's
# generic vhost-user device shows it (transport bits only: qemu-configs/cloud-hypervisor.md): a
# second daemon offering no UD, SRQs or atomics. Checked: the driver reports none, refuses them,
# and RC QPs with their data path work. This guest loads virtio_net before virtio_rdma (the
# interface is there at probe).
bare_mac=52:54:00:12:34:57
printf '[daemon]\nud = false\nsrq = false\natomics = false\n\n[[tenant]]\nname = "t"\n\n[[vm]]\nname = "bare"\nsocket = "%s"\ntenant = "t"\nmac = "%s"\n' \
  "$dir/bare.sock" "$bare_mac" >"$dir/bare.toml"
launch_daemon --log "$dir/bare-daemon.log" --wait "$dir/bare.sock" --config "$dir/bare.toml"
# shellcheck disable=SC2016 # the guest's shell expands them
launch_guest bare --image "$image" --append 'guest.uio=none' \
  --cmd 'modprobe virtio_net && ip link set eth0 up && ip addr add 10.42.0.1/24 dev eth0 &&
    insmod /lib/virtio_rdma.ko && i=0; until grep -q ffff /sys/class/infiniband/virtio_rdma0/ports/1/gids/1 2>/dev/null; do
      [ $i -lt 100 ] || exit 1; i=$((i + 1)); sleep 0.1; done; vrdma-check transport-only' -- \
  -chardev "socket,id=rdma,path=$dir/bare.sock" -device vhost-user-rdma-pci,chardev=rdma \
  -netdev "stream,id=n0,server=on,addr.type=unix,addr.path=$dir/bare-net.sock" \
  -device "virtio-net-pci,netdev=n0,mac=$bare_mac"
bare_pid=$launch_pid

console="$dir/guest.console"
# check DESCRIPTION PATTERN: PATTERN on a line of $console.
check() {
  if grep -q -- "$2" "$console"; then ok "$1"; else failed "$1 (no '$2' on the console)"; fi
}
t=$(date +%s)
rc=0
# shellcheck disable=SC2016 # the guest's shell expands them
launch_guest guest --image "$image" --append 'guest.uio=none' \
  --cmd 'ib=/sys/class/infiniband; g=$ib/virtio_rdma0/ports/1/gids
    upto() { i=0; until eval "$1" || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done; }
    net() { modprobe virtio_net && ip link set eth0 up && ip addr add 10.42.0.1/24 dev eth0 &&
      upto "grep -qs 0a2a $g/1"; }
    gids() { for i in $(seq 0 15); do x=$(cat $g/$i 2>/dev/null) &&
      [ "$x" != 0000:0000:0000:0000:0000:0000:0000:0000 ] && printf " %s=%s" $i $x; done; echo " END"; }
    insmod /lib/virtio_rdma.ko && sleep 1 && echo "EARLY $(ls $ib | wc -l) verbs devices" && net &&
    dmesg | grep -i virtio && rdma link && echo "GID1 $(cat $g/1)" &&
    cat /etc/libibverbs.d/virtio_rdma.driver && ibv_devinfo && vrdma-check && vrdma-reset.sh &&
    rmmod virtio_net && echo "GONE $(ls $ib | wc -l) verbs devices" && net &&
    echo "BACK $(ls $ib) GID1 $(cat $g/1)" && echo "BACK-GIDS$(gids)" &&
    upto "ip -6 addr show dev eth0 | grep -q fe80::5054:ff:fe12:3456" &&
    ip addr del 10.42.0.1/24 dev eth0 && ip link set eth0 address 52:54:00:12:34:99 &&
    ip addr add 10.42.0.1/24 dev eth0 && upto "grep -qs 0a2a $g/1" && echo "LL-FIRST GIDS$(gids)" &&
    ip link set eth0 address 52:54:00:12:34:56 && upto "grep -qs fe80 $g/0" &&
    echo "LL-DEFAULT GIDS$(gids)" &&
    dmesg | grep "went away" && rmmod virtio_rdma && insmod /lib/virtio_rdma.ko &&
    sleep 1 && ibv_devices | sed "s/^/AGAIN /"' -- \
  -chardev "socket,id=rdma,path=$dir/vm0.sock" -device vhost-user-rdma-pci,chardev=rdma \
  -netdev "stream,id=n0,server=on,addr.type=unix,addr.path=$dir/net.sock" \
  -device "virtio-net-pci,netdev=n0,mac=$mac"
launch_wait "$launch_pid" || rc=$?
echo "== $name: guest ran $(($(date +%s) - t)) s, exit $rc"
if [ "$rc" = 0 ]; then ok "insmod and the guest command succeeded"; else failed "guest exit $rc"; fi
# The daemon reports the ABI version of the header the module was built from.
abi=$(sed -n 's/^#define VIRTIO_RDMA_ABI_VERSION \([0-9]*\)$/\1/p' guest-driver/linux/virtio_rdma_abi.h)
check "the driver bound device ID 42 with ABI version $abi" "virtio-rdma ABI $abi (driver $abi)"
check "loaded before virtio_net: it waits for the interface with the paired MAC" \
  "no network interface with permanent address $mac yet"
check "... and registers no verbs device meanwhile" "^EARLY 0 verbs devices"
check "QUERY_PORT: the port is active" "port active"
check "the paired MAC came from the daemon's configuration" "paired MAC $mac"
check "a verbs device registered on the paired interface once virtio_net created it" \
  "registered virtio_rdma0 on eth0"
check "rdma link: a RoCE port, active, on eth0" "virtio_rdma0/1 state ACTIVE physical_state LINK_UP netdev eth0"
check "GID index 1 is the VM's GID (::ffff:10.42.0.1) from the interface's address" \
  "GID1 0000:0000:0000:0000:0000:ffff:0a2a:0001"
check "unmodified ibv_devinfo (rdma-core $(basename "$(dirname "$rdma_core")")) finds the device" \
  "hca_id:.*virtio_rdma0"
check "ibv_devinfo: port 1 active" "state:.*PORT_ACTIVE (4)"
check "ibv_devinfo: RoCE (link layer Ethernet)" "link_layer:.*Ethernet"
check "MRs, CQs, RC and UD QPs to RTS, SEND/RECV, RDMA WRITE and async events (vrdma-check)" \
  "^VRDMA-CHECK: [0-9]* passed, 0 failed"
check "inline data (spec 18.10): an RDMA WRITE from memory of no region, copied at post" \
  "^VRDMA-CHECK ok: .*inline RDMA WRITE (48 bytes) to itself: success, data equal"
check "immediate data: received as sent" \
  "^VRDMA-CHECK ok: .*SEND with immediate 0x12345678 to itself: 2 completions, immediate flagged 0x12345678"
check "work requests beyond the QP's capabilities refused at post (EINVAL), the QP unharmed" \
  "^VRDMA-CHECK ok: .*refused at post: 2 send SGEs EINVAL, 2 receive SGEs EINVAL, 65 inline bytes EINVAL, an inline READ EINVAL; QP state 3"
check "RDMA WRITE to a bad rkey: REM_ACCESS_ERR, and IBV_EVENT_QP_ACCESS_ERR in user space" \
  "^VRDMA-CHECK ok: .*access error: async event local access violation work queue error"
check "a SEND to a QP in RTR: IBV_EVENT_COMM_EST" "^VRDMA-CHECK ok: .*async event communication established"
check "the GUIDs in ib_core's byte order (a locally administered EUI-64)" \
  "^VRDMA-CHECK ok: attributes: node GUID"
check "device_cap_flags: what the device does, nothing more" \
  "^VRDMA-CHECK ok: attributes: device_cap_flags"
check "the port: active, LINK_UP, GID table within what the driver reads" \
  "^VRDMA-CHECK ok: attributes: port state"
check "the device's QUOTA: ENOMEM" "^VRDMA-CHECK ok: attributes: PDs beyond the quota.*Cannot allocate memory"
check "ibv_query_qp: access flags, the address with its GRH, sq_sig_all 0" \
  "^VRDMA-CHECK ok: QP attributes in RTR"
check "the device's RANGE (max_rd_atomic above its limit): EINVAL" \
  "^VRDMA-CHECK ok: .*above the device's.*Invalid argument"
check "the device's BAD_STATE (cur_state not the QP's): EINVAL" \
  "^VRDMA-CHECK ok: .*cur_state INIT (it is RTR): Invalid argument"
check "... and the right cur_state is taken (CURR_QP_STATE_MOD)" \
  "^VRDMA-CHECK ok: .*to RTS with cur_state RTR: ok"
check "to SQD with en_sqd_async_notify: IBV_EVENT_SQ_DRAINED" \
  "^VRDMA-CHECK ok: .*SQD with nothing in flight: async event send queue drained"
check "ibv_create_qp_ex: PD and no create flag work, SEND_OPS_FLAGS gives the extended send API; an operation the device lacks (EOPNOTSUPP) and a create flag (EINVAL) refused" \
  "^VRDMA-CHECK ok: create_qp_ex: PD|CREATE_FLAGS, no flag: created (qp_ex none); SEND_OPS_FLAGS SEND: created (qp_ex yes); ATOMIC_WRITE: Operation not supported; a create flag: Invalid argument"
check "ibv_query_qp: sq_sig_all 1 and no address in RESET" "^VRDMA-CHECK ok: QP attributes in RESET"
check "a CQ overflow: IBV_EVENT_CQ_ERR" "^VRDMA-CHECK ok: .*CQ overflowed: async event CQ error"
check "... and IBV_EVENT_QP_FATAL for its QP" \
  "^VRDMA-CHECK ok: .*its QP failed: async event local work queue catastrophic error"
check "an SRQ below its limit: IBV_EVENT_SRQ_LIMIT_REACHED" "^VRDMA-CHECK ok: .*SRQ limit reached"
check "a QP with an SRQ to ERR: IBV_EVENT_QP_LAST_WQE_REACHED" "^VRDMA-CHECK ok: .*last WQE reached"
for how in SYSFS UNBIND; do
  what=$([ $how = SYSFS ] && echo "reset through the driver's reset attribute" ||
    echo "driver unbound")
  check "device $what: a process holding objects gets IBV_EVENT_DEVICE_FATAL" \
    "^RESET-$how-HOLDER VRDMA-CHECK ok: .*device was reset: async event local catastrophic error"
  check "device $what: its later verbs fail with EIO, its objects are destroyed" \
    "^RESET-$how-HOLDER VRDMA-CHECK: [0-9]* passed, 0 failed"
  check "device $what: virtio_rdma0 back, port active, an RC QP works" \
    "^RESET-$how-AFTER VRDMA-CHECK: [0-9]* passed, 0 failed"
done
check "the driver reset and re-registered the device" "the device is back after its reset"
check "unbound: no verbs device left" "^RESET-UNBIND: 0 verbs devices while unbound"
check "virtio_net removed: the verbs device went with its interface, nothing hung" \
  "^GONE 0 verbs devices"
check "... the driver said why" "network interface eth0 went away: unregistering virtio_rdma0"
check "virtio_net loaded again: virtio_rdma0 back on the new eth0, GID 1 from its address" \
  "^BACK virtio_rdma0 GID1 0000:0000:0000:0000:0000:ffff:0a2a:0001"
# The order of ib_core's address events decides where a GID goes: the interface's link-local
# address, which is the device's default GID, is offered as an ordinary GID too, and lands in the
# first free slot after 0 if it comes while slot 0 holds no default GID for the interface. Made
# so on purpose: a new MAC address (ib_core's default GID from it is not the device's, refused;
# the pairing is by permanent address and stays) while the interface keeps its link-local
# address, offered before the IPv4 address comes back. The driver refuses the default GID
# outside slot 0, so the VM's address takes index 1 whatever the order, and the default GID
# comes back to index 0 with the MAC address.
check "the link-local address offered first while slot 0 is empty: refused, the VM's GID at index 1" \
  "^LL-FIRST GIDS 1=0000:0000:0000:0000:0000:ffff:0a2a:0001 END"
check "... its MAC address back: the default GID at 0, the VM's at 1, nothing else" \
  "^LL-DEFAULT GIDS 0=fe80:0000:0000:0000:5054:00ff:fe12:3456 1=0000:0000:0000:0000:0000:ffff:0a2a:0001 END"
check "rmmod (device reset) and insmod again: the device is back" "AGAIN .*virtio_rdma0"
bare_rc=0
launch_wait "$bare_pid" || bare_rc=$?
console="$dir/bare.console"
check "transport feature bits only (the cloud-hypervisor case): no atomics, no SRQs reported" \
  "^VRDMA-CHECK ok: transport features only: atomic_cap 0, max_srq 0"
check "... UD QPs, SRQs and remote atomic access refused (EOPNOTSUPP)" \
  "^VRDMA-CHECK ok: .*refused: a UD QP (Operation not supported), an SRQ (Operation not supported), a region with remote atomic access (Operation not supported)"
check "... RC QPs to RTS, SEND, RDMA WRITE, inline and immediate data work (guest exit $bare_rc)" \
  "^VRDMA-CHECK: [0-9]* passed, 0 failed"
if [ "$fail" != 0 ]; then
  for f in guest.console daemon.log bare.console bare-daemon.log; do
    show_log "$f" "$dir/$f"
  done
fi
verdict "$name"
