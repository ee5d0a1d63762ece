#!/bin/bash
# The checks of scripts/qemu-dkms.sh, inside its Debian 12 guest (systemd as PID 1, booted from an
# ext4 disk; run there by dkms-check.service, its output on the console). The guest has Debian's
# pinned 6.1 kernel with its headers, dkms, gcc, libibverbs1 and ibverbs-utils installed, the
# virtio RDMA device on a running daemon and a virtio-net interface with the MAC the daemon pairs
# with it. As an operator would: install the DKMS package (the module is built here), load it,
# install the provider package, see the device through it, run RC traffic, remove both. Each
# check is a step with its own verdict (/etc/tools.sh: guest/checks.sh's guest_tools); the exit
# code goes to the console as GUEST-EXIT for scripts/run-guest.sh, then the machine powers off.
# shellcheck source=/dev/null
. /etc/tools.sh

# No questions from debconf (the console is no terminal to answer them).
export DEBIAN_FRONTEND=noninteractive
DEV=virtio_rdma0
IB=/sys/class/infiniband
# The virtio-net interface's MAC, which the daemon pairs the device with (scripts/qemu-dkms.sh).
MAC=52:54:00:12:34:56
echo "GUEST-READY: uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) init=$(cat /proc/1/comm)"

# wait_for CMD...: CMD until it succeeds, 0.2 s apart; the step's stall watchdog bounds it.
wait_for() {
  until "$@" >/dev/null 2>&1; do sleep 0.2; done
}

# dpkg -i of the DKMS package: its postinst has DKMS build virtio_rdma.ko (minutes under TCG; a
# line every 10 s says how many objects are built, so the watchdogs see progress) and install it.
install_dkms() {
  local ticker r=0
  (
    while sleep 10; do
      echo "  ... $(find /var/lib/dkms/virtio-rdma -name '*.o' 2>/dev/null | wc -l) objects built"
    done
  ) &
  ticker=$!
  dpkg -i /root/virtio-rdma-dkms.deb || r=$?
  kill "$ticker"
  [ "$r" = 0 ] || return "$r"
  dkms status
  dkms status -m virtio-rdma -k "$(uname -r)" | grep -q ': installed' &&
    modinfo -n virtio_rdma | grep -q "/lib/modules/$(uname -r)/updates/dkms/virtio_rdma.ko" &&
    echo "modinfo: $(modinfo -n virtio_rdma), vermagic $(modinfo -F vermagic virtio_rdma)"
}

# netdev: the name of the interface with the paired MAC (udev names it).
netdev() {
  local n
  for n in /sys/class/net/*; do
    if [ "$(cat "$n/address")" = "$MAC" ]; then
      basename "$n"
      return 0
    fi
  done
  return 1
}

# modprobe: the module DKMS installed binds the device; with the interface of the paired MAC up
# and addressed, a RoCE port, active, with the VM's GID at index 1. ib_uverbs (user verbs) is
# loaded by hand: rdma-core's udev rules would, and the image does not have them.
load() {
  local nic
  modprobe virtio_rdma && modprobe ib_uverbs && modprobe virtio_net || return 1
  wait_for netdev
  nic=$(netdev)
  ip link set "$nic" up && ip addr add 10.42.0.1/24 dev "$nic" || return 1
  wait_for grep -q 0a2a "$IB/$DEV/ports/1/gids/1"
  dmesg | grep -i 'virtio.rdma' | tail -n 5
  rdma link show "$DEV/1" | tee /tmp/link
  grep -qE "state ACTIVE physical_state LINK_UP netdev $nic( |$)" /tmp/link &&
    echo "GID 1: $(cat "$IB/$DEV/ports/1/gids/1")"
}

# Without the provider package, libibverbs has no provider for the device.
no_provider() {
  ibv_devices | tee /tmp/devs
  ! grep -q "$DEV" /tmp/devs && echo "no $DEV without the provider"
}

install_provider() {
  dpkg -i /root/ibverbs-providers-virtio-rdma.deb &&
    dpkg -L ibverbs-providers-virtio-rdma | grep -E 'rdmav[0-9]+[.]so|[.]driver$'
}

# The device through the packaged provider: Debian's unmodified ibv_devices and ibv_devinfo on
# Debian's libibverbs1.
devinfo() {
  dpkg-query -W libibverbs1 ibverbs-utils ibverbs-providers-virtio-rdma
  ibv_devices | tee /tmp/devs
  grep -q "$DEV" /tmp/devs || return 1
  ibv_devinfo -d "$DEV" | tee /tmp/info
  grep -q 'state:.*PORT_ACTIVE' /tmp/info && grep -q 'link_layer:.*Ethernet' /tmp/info
}

# RC traffic through the device: Debian's ibv_rc_pingpong, server and client in this guest,
# over GID 1 (the VM's address); each exits 0 only once all its messages completed.
pingpong() {
  local srv r=0
  linebuf ibv_rc_pingpong -d "$DEV" -g 1 -n 200 -s 4096 >/tmp/server 2>&1 &
  srv=$!
  sleep 1
  local i=0
  until linebuf ibv_rc_pingpong -d "$DEV" -g 1 -n 200 -s 4096 127.0.0.1 >/tmp/client 2>&1; do
    if ! grep -q "Couldn't connect to" /tmp/client || [ $i -ge 50 ]; then
      r=1
      break
    fi
    i=$((i + 1))
    sleep 0.2
  done
  wait "$srv" || r=1
  sed 's/^/server: /' /tmp/server
  sed 's/^/client: /' /tmp/client
  [ "$r" = 0 ] && grep -q '^200 iters in' /tmp/server && grep -q '^200 iters in' /tmp/client
}

# dpkg -r: the provider goes, its .driver file (a conffile) stays, libibverbs lists no device;
# dpkg -P: the .driver file goes too.
remove_provider() {
  dpkg -r ibverbs-providers-virtio-rdma || return 1
  ibv_devices 2>&1 | tee /tmp/devs
  ! ls /usr/lib/x86_64-linux-gnu/libibverbs/libvirtio_rdma-* 2>/dev/null &&
    [ -f /etc/libibverbs.d/virtio_rdma.driver ] && ! grep -q "$DEV" /tmp/devs &&
    echo "removed: libibverbs lists no $DEV; the .driver file (a conffile) stays"
}

purge_provider() {
  dpkg -P ibverbs-providers-virtio-rdma || return 1
  [ ! -e /etc/libibverbs.d/virtio_rdma.driver ] && echo "purged: the .driver file is gone"
}

# dpkg -r of the DKMS package: prerm has DKMS remove the module from every kernel; the loaded
# module is unloaded by hand first, as an operator would.
remove_dkms() {
  rmmod virtio_rdma && dpkg -r virtio-rdma-dkms || return 1
  echo "dkms status: '$(dkms status)'"
  [ -z "$(dkms status -m virtio-rdma)" ] && ! modinfo virtio_rdma >/dev/null 2>&1 &&
    ! ls -d /usr/src/virtio-rdma-* 2>/dev/null && [ ! -e "$IB/$DEV" ] &&
    echo "removed: no virtio_rdma.ko for $(uname -r), no sources in /usr/src"
}

STALL=600 step 'dpkg -i virtio-rdma-dkms' install_dkms
step 'modprobe virtio_rdma' load
step 'no provider yet' no_provider
step 'dpkg -i the provider' install_provider
step 'ibv_devices, ibv_devinfo' devinfo
step 'ibv_rc_pingpong' pingpong
step 'dpkg -r the provider' remove_provider
step 'dpkg -P the provider' purge_provider
step 'dpkg -r virtio-rdma-dkms' remove_dkms
rc=0
steps_verdict || rc=1
klog
echo "GUEST-DONE: uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "GUEST-EXIT: $rc"
# Through PID 1's own socket (there is no D-Bus in the image).
systemctl start --no-block poweroff.target
