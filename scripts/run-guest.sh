#!/usr/bin/env bash
# Boots the test guest (scripts/build-guest.sh) under QEMU/TCG, runs one command in it and exits
# with that command's exit code, read from the "GUEST-EXIT: <code>" line that the guest's /init
# prints on the serial console before it powers off. See guest/README.md.
#
# Exit status: the guest command's (0-255); 124 if the time limit was hit; 125 if the guest
# printed no exit code (QEMU failed to start, kernel panic, ...); 130 if interrupted. The
# console log is printed on every failure of the machinery.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest_dir=$(cd "$here/../guest" && pwd)
# shellcheck source-path=SCRIPTDIR/..
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
GUEST_DIE_CODE=125

usage() {
  cat <<'EOF'
Usage: scripts/run-guest.sh [OPTIONS] [-- QEMU ARGS...]

  --image NAME|DIR   image built by build-guest.sh (default: default, i.e. CACHE/images/default)
  --kernel FILE      kernel to boot instead of the image's
  --initrd FILE      initramfs to boot instead of the image's
  --disk FILE        attach FILE (a raw disk image) as a virtio-blk disk, /dev/vda in the guest,
                     in QEMU's snapshot mode: the guest writes to a temporary copy-on-write
                     file that QEMU drops at exit, FILE never changes (a system on it boots
                     with --append 'guest.root=/dev/vda': see guest/rootfs/init)
  --bzimage          boot the image's compressed vmlinuz rather than its vmlinux
  --cmd 'CMD ARGS'   command for the guest (shell syntax), passed base64-encoded on the kernel
                     command line; without it the image's --run command (or guest-info) runs
  --append 'PARAMS'  more kernel parameters, e.g. 'guest.modules=virtio_pci guest.uio=none'
  --mem SIZE         guest RAM (default 1G), a shared memfd so vhost-user daemons can map it
  --smp N            vCPUs (default 1)
  --hugepages N      2 MiB hugepages the kernel reserves at boot (default 64)
  --stall SEC        stop QEMU once the console has printed nothing for SEC seconds (default
                     300; 0: never): a guest that makes progress runs as long as it needs
  --timeout SEC      stop QEMU after SEC seconds whatever it does (default 0: no limit)
  --reboot           let the guest reboot: a reboot inside it or QMP system_reset restarts it
                     (same kernel, command line and command) instead of ending QEMU; a kernel
                     panic then reboots too (count the GUEST-READY lines)
  --log FILE         where the console goes (default CACHE/logs/console-DATE-PID.log)
  -v, --verbose      show the console while the guest runs
  -q, --quiet        on success print nothing (default: the command's output)
  --shell            interactive: a shell on this terminal instead of the command (Ctrl-A x
                     quits QEMU)
  -h, --help         this text

QEMU ARGS after -- are passed to QEMU as they are (e.g. -chardev ... -device ...).
QEMU is $QEMU, or qemu-system-x86_64 on PATH (installed from Debian if there is none).
Exit status: the guest command's; 124 on time-out or stall; 125 if the guest gave no exit code;
130 if interrupted.
EOF
}

image=default kernel='' initrd='' cmd='' append='' mem=1G smp=1 hugepages=64 timeout_s=0 stall_s=300
log='' verbose=0 quiet=0 shell=0 bzimage=0 reboot=0 disk='' qemu_args=()
while [ $# -gt 0 ]; do
  case "$1" in
  --image) image=${2:?--image needs a name or directory}; shift 2 ;;
  --kernel) kernel=${2:?--kernel needs a file}; shift 2 ;;
  --initrd) initrd=${2:?--initrd needs a file}; shift 2 ;;
  --disk) disk=${2:?--disk needs a file}; shift 2 ;;
  --bzimage) bzimage=1; shift ;;
  --cmd) cmd=${2?--cmd needs a command}; shift 2 ;;
  --append) append=${2?--append needs parameters}; shift 2 ;;
  --mem) mem=${2:?--mem needs a size}; shift 2 ;;
  --smp) smp=${2:?--smp needs a number}; shift 2 ;;
  --hugepages) hugepages=${2:?--hugepages needs a number}; shift 2 ;;
  --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
  --stall) stall_s=${2:?--stall needs seconds}; shift 2 ;;
  --log) log=${2:?--log needs a file}; shift 2 ;;
  --reboot) reboot=1; shift ;;
  -v | --verbose) verbose=1; shift ;;
  -q | --quiet) quiet=1; shift ;;
  --shell) shell=1; shift ;;
  -h | --help) usage; exit 0 ;;
  --) shift; qemu_args=("$@"); break ;;
  *) usage >&2; guest_die "unknown argument: $1 (QEMU arguments go after --)" ;;
  esac
done

case "$image" in
*/*) imgdir=$image ;;
*) imgdir="$GUEST_CACHE/images/$image" ;;
esac
if [ -z "$kernel" ]; then
  # The uncompressed ELF kernel (PVH entry) boots ~4 s faster under TCG than the bzImage.
  kernel="$imgdir/vmlinux"
  [ -f "$kernel" ] && [ "$bzimage" = 0 ] || kernel="$imgdir/vmlinuz"
fi
[ -n "$initrd" ] || initrd="$imgdir/initramfs.img"
for f in "$kernel" "$initrd" ${disk:+"$disk"}; do
  [ -f "$f" ] || guest_die "$f: not found (build the image with scripts/build-guest.sh)"
done
[[ "$timeout_s" =~ ^[0-9]+$ ]] || guest_die "--timeout: seconds expected"
[[ "$stall_s" =~ ^[0-9]+$ ]] || guest_die "--stall: seconds expected"

guest_ensure_qemu

# A QEMU run from its build tree (or installed without firmware blobs) lacks SeaBIOS and the
# linuxboot option ROM: point it at Debian's.
fw_args=()
have_bios=0 have_rom=0
while read -r d; do
  if [ -f "$d/bios-256k.bin" ]; then have_bios=1; fi
  if [ -f "$d/pvh.bin" ] && [ -f "$d/linuxboot_dma.bin" ]; then have_rom=1; fi
done < <("$QEMU" -L help 2>/dev/null || true)
if [ "$have_bios" = 0 ] || [ "$have_rom" = 0 ]; then
  if ! guest_pkg_installed seabios || ! guest_pkg_installed qemu-system-data; then
    guest_log "$QEMU has no firmware: installing Debian's seabios and qemu-system-data"
    guest_apt_install seabios qemu-system-data
  fi
  fw_args=(-L /usr/share/seabios -L /usr/share/qemu)
fi

kcmd="console=ttyS0 quiet iomem=relaxed panic=-1 hugepages=$hugepages"
[ -z "$append" ] || kcmd+=" $append"
[ "$shell" = 0 ] || kcmd+=" guest.shell=1"
# The command goes base64-encoded in one parameter: no quoting issues, and no limit on its word
# count (words after " -- " become init's arguments, which the kernel caps at ~30).
[ -z "$cmd" ] || kcmd+=" guest.cmd64=$(printf '%s' "$cmd" | base64 -w0)"
# x86's COMMAND_LINE_SIZE.
[ "${#kcmd}" -lt 2048 ] || guest_die "kernel command line too long (${#kcmd} bytes, limit 2047)"

disk_args=()
# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
[ -z "$disk" ] || disk_args=(-drive "file=$disk,if=virtio,format=raw,snapshot=on")
# -no-reboot turns every reset into an exit, QMP system_reset included.
no_reboot=(-no-reboot)
[ "$reboot" = 0 ] || no_reboot=()
# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
# sata=off: SeaBIOS probes q35's AHCI ports, which takes some 30 s under TCG (7 s to the kernel
# without it); the guests have no disks but --disk's, on virtio-blk.
qemu=("$QEMU" -machine q35,sata=off -accel tcg -cpu max -smp "$smp" -m "$mem"
  -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa "node,memdev=mem"
  -nographic "${no_reboot[@]}" -nic none "${fw_args[@]}"
  -kernel "$kernel" -initrd "$initrd" -append "$kcmd" "${disk_args[@]}" "${qemu_args[@]}")

if [ "$shell" = 1 ]; then
  exec "${qemu[@]}"
fi

mkdir -p "$GUEST_CACHE/logs"
find "$GUEST_CACHE/logs" -name 'console-*.log' -mtime +7 -delete 2>/dev/null || true
[ -n "$log" ] || log="$GUEST_CACHE/logs/console-$(date +%Y%m%d-%H%M%S)-$$.log"
: >"$log"

limit=()
[ "$timeout_s" = 0 ] || limit=(timeout -k 10 "$timeout_s")
t0=$(guest_now)
# QEMU runs in the background so that Ctrl-C / SIGTERM here can stop it (timeout(1) puts it in
# a process group of its own, out of reach of the terminal's SIGINT).
"${limit[@]}" "${qemu[@]}" </dev/null >"$log" 2>&1 &
qpid=$!
interrupted=''
trap 'interrupted=1; kill -TERM "$qpid" 2>/dev/null' INT TERM
tail_pid=''
if [ "$verbose" = 1 ]; then
  tail -n +1 -f --pid="$qpid" "$log" &
  tail_pid=$!
fi
# The stall watchdog: the console's size, once a second. It ends with QEMU, or with this script
# if that is killed outright (QEMU is then its caller's to stop: scripts/lib/launch.sh does it
# by QEMU's -pidfile).
stalled=''
if [ "$stall_s" != 0 ]; then
  (
    size=-1 idle=0
    while kill -0 "$qpid" 2>/dev/null && kill -0 $$ 2>/dev/null; do
      now=$(stat -c %s "$log" 2>/dev/null || echo 0)
      if [ "$now" != "$size" ]; then size=$now idle=0; else idle=$((idle + 1)); fi
      if [ "$idle" -ge "$stall_s" ]; then
        echo stalled >"$log.stalled"
        kill -TERM "$qpid" 2>/dev/null
        sleep 10
        kill -KILL "$qpid" 2>/dev/null
        break
      fi
      sleep 1
    done
  ) &
  watch_pid=$!
fi
while :; do
  qrc=0
  wait "$qpid" || qrc=$?
  kill -0 "$qpid" 2>/dev/null || break
done
if [ "$stall_s" != 0 ]; then
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
  [ ! -f "$log.stalled" ] || stalled=1
  rm -f "$log.stalled"
fi
[ -z "$tail_pid" ] || wait "$tail_pid" || true
trap - INT TERM
t1=$(guest_now)
if [ -n "$interrupted" ]; then
  guest_log "interrupted; console log: $log"
  exit 130
fi

clean=$(tr -d '\r' <"$log")
code=$(sed -n 's/^GUEST-EXIT: \([0-9][0-9]*\)$/\1/p' <<<"$clean" | tail -n1)
ready=$(sed -n 's/.*GUEST-READY: uptime=\([0-9.]*\).*/\1/p' <<<"$clean" | tail -n1)
done_at=$(sed -n 's/^GUEST-DONE: uptime=\([0-9.]*\).*/\1/p' <<<"$clean" | tail -n1)

show_log() {
  echo "----- console log ($log) -----" >&2
  cat "$log" >&2
  echo "----- end of console log -----" >&2
}

if [ -z "$code" ]; then
  show_log
  if [ -n "$stalled" ]; then
    guest_log "error: the console printed nothing for $stall_s s: stopped (a stall, not a time limit)"
    exit 124
  fi
  if [ "$timeout_s" != 0 ] && { [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; }; then
    guest_log "error: time limit of $timeout_s s reached, the guest printed no exit code"
    exit 124
  fi
  guest_log "error: the guest printed no 'GUEST-EXIT: <code>' line (QEMU exit status $qrc)"
  exit 125
fi

if [ "$quiet" = 0 ] && [ "$verbose" = 0 ]; then
  # The command's output: between "GUEST-RUN:" and "GUEST-DONE:" (init adds one newline).
  awk '/^GUEST-DONE: / { run = 0 } run { if (held) print prev; prev = $0; held = 1 }
    /^GUEST-RUN: / { run = 1 } END { if (held && prev != "") print prev }' <<<"$clean"
fi
guest_log "guest exit code $code; QEMU ran $(guest_elapsed "$t0" "$t1") s" \
  "(guest uptime: ready ${ready:-?} s, done ${done_at:-?} s); console log: $log"
exit "$code"
