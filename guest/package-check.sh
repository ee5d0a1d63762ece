#!/bin/bash
# The checks of scripts/qemu-package.sh, inside its Debian 12 guest with systemd as PID 1 (run
# there by package-check.service, its output on the console): install the package, use the
# service as an operator would, upgrade it live, stop it, remove and purge the package. Each
# check is a step with its own verdict (/etc/tools.sh: guest/checks.sh's guest_tools); the exit
# code goes to the console as GUEST-EXIT for scripts/run-guest.sh, then the machine powers off.
# shellcheck source=/dev/null
. /etc/tools.sh

U=vhost-user-rdma
RUN=/run/vhost-user-rdma
echo "GUEST-READY: uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) init=$(cat /proc/1/comm)"

# wait_for CMD...: CMD until it succeeds, 0.2 s apart; the step's stall watchdog bounds it.
wait_for() {
  until "$@" >/dev/null 2>&1; do sleep 0.2; done
}

active() { systemctl is-active --quiet "$U"; }

install_package() {
  dpkg -i /root/vhost-user-rdma.deb
}

the_user() {
  getent passwd "$U" && id -nG "$U" | tr ' ' '\n' | grep -qx kvm
}

the_unit() {
  systemctl is-enabled "$U" && wait_for active && systemctl is-active "$U" &&
    systemctl status --no-pager --lines=5 "$U"
}

# mode_owner PATH MODE OWNER:GROUP
mode_owner() {
  local got
  got=$(stat -c '%a %U:%G' "$1") || return 1
  echo "$1: $got"
  [ "$got" = "$2 $3" ]
}

the_sockets() {
  mode_owner "$RUN/vm0.sock" 770 "$U:kvm" && mode_owner "$RUN/mgmt.sock" 600 "$U:kvm"
}

# Two VMs: the operator adds vm1 to the configuration and restarts the service; the test VMM's
# demo then runs RC traffic between them (and has a hostile request refused).
two_vms() {
  cat >>/etc/vhost-user-rdma/config.toml <<EOF

[[vm]]
name = "vm1"
socket = "$RUN/vm1.sock"
tenant = "default"
EOF
  systemctl restart "$U" && wait_for test -S "$RUN/vm1.sock" &&
    rdma-demo --socket "$RUN/vm0.sock" --socket "$RUN/vm1.sock"
}

ctl_vms() {
  local out
  out=$(vhost-user-rdma ctl vms) || return 1
  echo "$out"
  grep -q '^vm0 ' <<<"$out" && grep -q '^vm1 ' <<<"$out"
}

# GET /metrics over bash's /dev/tcp (no curl in the image): the daemon's info line, and vm0's
# send work requests from the demo.
metrics() {
  local out
  exec 3<>/dev/tcp/127.0.0.1/9842 || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  out=$(cat <&3)
  exec 3<&-
  grep -E '^vhost_user_rdma_(info|vm_send_ops_total)' <<<"$out"
  grep -q '^vhost_user_rdma_info{' <<<"$out" &&
    grep -E '^vhost_user_rdma_vm_send_ops_total\{[^}]*vm="vm0"' <<<"$out" | grep -qv ' 0$'
}

main_pid() { systemctl show -p MainPID --value "$U"; }

# upgraded BEFORE: the service is active under a main PID other than BEFORE and its journal has
# the successor's "took over"; fails at once (showing the service's state and journal) once the
# service is neither active nor reloading: a failed upgrade does not come back by waiting.
upgraded() {
  local state
  until [ "$(main_pid)" != "$1" ] && [ "$(main_pid)" != 0 ] &&
    journalctl -u "$U" -o cat | grep -q "took over"; do
    state=$(systemctl show -p ActiveState --value "$U")
    if [ "$state" != active ] && [ "$state" != reloading ]; then
      echo "the service is $state"
      systemctl status --no-pager --lines=0 "$U"
      journalctl -u "$U" -o cat --no-pager | tail -n 20
      return 1
    fi
    sleep 0.2
  done
}

# systemctl reload: the running daemon starts its successor, which takes every VM over; the
# service's main PID becomes the successor's.
reload() {
  local before
  before=$(main_pid)
  echo "main PID before: $before"
  if ! systemctl reload "$U"; then
    systemctl status --no-pager --lines=10 "$U"
    return 1
  fi
  upgraded "$before" || return 1
  echo "main PID after: $(main_pid)"
  journalctl -u "$U" -o cat | grep -E 'took over|handed' | tail -n 2
  active
}

vm_after_reload() {
  rdma-demo --socket "$RUN/vm0.sock" --socket "$RUN/vm1.sock"
}

stop() {
  systemctl stop "$U" || return 1
  ! active && [ ! -e "$RUN/vm0.sock" ] && [ ! -e "$RUN/mgmt.sock" ] &&
    echo "inactive, $RUN: $(ls -A "$RUN" 2>/dev/null | wc -l) entries"
}

remove() {
  dpkg -r "$U" || return 1
  [ ! -e /usr/bin/vhost-user-rdma ] && [ ! -e /usr/share/man/man8/vhost-user-rdma.8.gz ] &&
    [ -f /etc/vhost-user-rdma/config.toml ] && ! systemctl is-enabled "$U" 2>/dev/null &&
    echo "removed; the configuration stays"
}

purge() {
  dpkg -P "$U" || return 1
  [ ! -e /etc/vhost-user-rdma ] && echo "purged: /etc/vhost-user-rdma is gone"
}

step 'dpkg -i' install_package
step 'the user' the_user
step 'the unit' the_unit
step 'the sockets' the_sockets
step 'two VMs' two_vms
step 'ctl vms' ctl_vms
step 'metrics' metrics
step 'systemctl reload' reload
step 'a VM after the reload' vm_after_reload
step 'systemctl stop' stop
step 'dpkg -r' remove
step 'dpkg -P' purge
rc=0
steps_verdict || rc=1
echo "GUEST-DONE: uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "GUEST-EXIT: $rc"
# Through PID 1's own socket (there is no D-Bus in the image).
systemctl start --no-block poweroff.target
