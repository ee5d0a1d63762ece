#!/bin/sh
# Resets the virtio RDMA device under a process that holds objects on it (`vrdma-check fatal`),
# twice: through the driver's `reset` attribute (the path a DEVICE_FATAL event or a VMM
# reconnection takes: the driver resets the device and registers it again) and by unbinding the
# driver (then binding it again). Each time the process must get IBV_EVENT_DEVICE_FATAL and
# errors rather than hang, and afterwards the device must work (`vrdma-check rc`). Run in the CI
# guest by scripts/qemu-kmod.sh; its lines start with RESET-.
# Exit status: 0 if every step passed.
fails=0
ibdev=/sys/class/infiniband/virtio_rdma0
vdev=$(basename "$(readlink -f $ibdev/device)")
drv=/sys/bus/virtio/drivers/virtio_rdma
echo "RESET: the device is $vdev"

# $1: a name; $2: a command that resets the device under `vrdma-check fatal`.
under_reset() {
  out=/tmp/$1.out
  vrdma-check fatal >"$out" 2>&1 &
  pid=$!
  i=0
  while ! grep -q READY "$out" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  t0=$(date +%s)
  eval "$2"
  wait $pid
  rc=$?
  sed "s/^/$1-HOLDER /" "$out"
  echo "$1: the holder exited $rc, $(($(date +%s) - t0)) s after the reset"
  [ $rc = 0 ] || fails=$((fails + 1))
}

# $1: a name. Checks that the verbs device works.
after_reset() {
  ibv_devinfo | sed "s/^/$1-AFTER /"
  vrdma-check rc >/tmp/rc.out 2>&1 || fails=$((fails + 1))
  sed "s/^/$1-AFTER /" /tmp/rc.out
}

under_reset RESET-SYSFS "echo 1 > /sys/bus/virtio/devices/$vdev/reset"
# The reset work goes on after the process got its event; unbind and bind are synchronous.
i=0
while ! dmesg | grep -q 'the device is back after its reset' && [ $i -lt 600 ]; do
  sleep 0.1
  i=$((i + 1))
done
after_reset RESET-SYSFS

under_reset RESET-UNBIND "echo $vdev > $drv/unbind"
echo "RESET-UNBIND: $(ls /sys/class/infiniband | wc -l) verbs devices while unbound"
echo "$vdev" >$drv/bind
after_reset RESET-UNBIND
dmesg | grep -E 'virtio_rdma|infiniband' | sed 's/^/RESET-DMESG /'
echo "RESET: $fails failed"
[ $fails = 0 ]
