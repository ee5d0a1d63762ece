#!/usr/bin/env bash
# Starts one VM with a vhost-user-rdma device on the patched QEMU
# (scripts/build-qemu.sh). The daemon must already listen on the socket:
# QEMU connects to it while it creates the device and exits if nobody answers.
#
#   qemu-configs/run-vm.sh [OPTIONS] [-- MORE QEMU ARGS]
#
#   --socket PATH     daemon socket of this VM (default /tmp/vhost-user-rdma-vm0.sock)
#   --name NAME       VM name, also the QMP socket name /tmp/NAME.qmp (default vm0)
#   --mem SIZE        guest RAM, shared memfd (default 1G)
#   --smp N           vCPUs (default 1)
#   --accel A         kvm or tcg (default tcg)
#   --kernel FILE     kernel to boot (-kernel)
#   --initrd FILE     initramfs (-initrd)
#   --append STR      kernel command line (default "console=ttyS0 iomem=relaxed")
#   --queue-size N    virtqueue size of the device (default 256)
#   --page-per-vq     one notify page per virtqueue (needed for host notifiers)
#   --dry-run         print the command line instead of running it
#
# QEMU is $QEMU if set, else the build from scripts/build-qemu.sh (built on
# first use, cached afterwards).
set -euo pipefail

socket=/tmp/vhost-user-rdma-vm0.sock name=vm0 mem=1G smp=1 accel=tcg
kernel='' initrd='' append='console=ttyS0 iomem=relaxed' queue_size=256 ppv=off dry=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --socket) socket=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --initrd) initrd=$2; shift 2 ;;
    --append) append=$2; shift 2 ;;
    --queue-size) queue_size=$2; shift 2 ;;
    --page-per-vq) ppv=on; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-vm.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [ -z "${QEMU:-}" ]; then
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  QEMU=$(bash "$here/scripts/build-qemu.sh" | tail -n 1)
fi

# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
cmd=(
  "$QEMU" -name "$name"
  -machine q35,memory-backend=mem -accel "$accel" -cpu max -smp "$smp" -m "$mem"
  # Guest RAM must be shared with the daemon: a memfd with share=on.
  -object "memory-backend-memfd,id=mem,size=$mem,share=on"
  -chardev "socket,id=rdma0,path=$socket"
  -device "vhost-user-rdma-pci,chardev=rdma0,queue-size=$queue_size,page-per-vq=$ppv"
  # The console is ttyS0 on this terminal, named explicitly so that more
  # serial ports given after -- become ttyS1, ttyS2, ...
  -nic none -nographic -serial mon:stdio -no-reboot
  -qmp "unix:/tmp/$name.qmp,server=on,wait=off"
)
[ -n "$kernel" ] && cmd+=(-kernel "$kernel" -append "$append")
[ -n "$initrd" ] && cmd+=(-initrd "$initrd")
cmd+=("${extra[@]}")

if [ $dry -eq 1 ]; then
  for a in "${cmd[@]}"; do
    if [[ $a =~ ^[A-Za-z0-9_,.=:/+@%-]+$ ]]; then printf '%s ' "$a"; else printf "'%s' " "$a"; fi
  done
  echo
else
  exec "${cmd[@]}"
fi
