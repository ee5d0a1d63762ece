#!/usr/bin/env bash
# Builds the test-guest image: Debian's 6.1 kernel (or trixie's 6.12, --kernel) + a busybox
# initramfs holding the modules a userspace virtio-pci driver needs, our /init, and the given host
# binaries with their shared libraries. See guest/README.md. Output: vmlinuz + initramfs.img in
# the cache (outside the checkout); the kernel download and its extraction are cached, the
# initramfs is rebuilt each time (a few seconds).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest_dir=$(cd "$here/../guest" && pwd)
# shellcheck source-path=SCRIPTDIR/..
# shellcheck source=guest/lib.sh
. "$guest_dir/lib.sh"
# shellcheck source=guest/versions.sh
. "$guest_dir/versions.sh"

usage() {
  cat <<'EOF'
Usage: scripts/build-guest.sh [OPTIONS]

  --bin PATH[:DEST]   add a host binary (default DEST /bin/NAME) with the shared libraries it
                      needs (from ldd, the dynamic loader included); repeatable
  --lib PATH[:DEST]   add a shared library (e.g. one loaded with dlopen) and its own libraries
  --lib-path DIRS     colon-separated directories where the libraries of --bin and --lib files
                      are looked up first (LD_LIBRARY_PATH of ldd); they go to the same paths in
                      the image, so the guest's command sets LD_LIBRARY_PATH=DIRS as well
  --file SRC:DEST     add a file or directory as it is
  --sysroot DIR       add the tree DIR at / (an install staged with DESTDIR, extracted packages),
                      with the shared libraries its programs and libraries need; libraries are
                      looked up in DIR first and go to their place relative to DIR; repeatable
  --module NAME       add a kernel module (and what it depends on); load it with guest.modules=
  --load NAME         add a kernel module and load it at boot
  --run 'CMD ARGS'    the command the guest runs when the kernel command line names none
                      (shell syntax; the boot-time command after " -- " takes precedence)
  --name NAME         image name (default: default): the image goes to CACHE/images/NAME
  --out DIR           write the image to DIR instead
  --compress KIND     gzip (default), zstd or none
  --kernel K          the guest kernel: 6.1 (Debian 12's, default) or 6.12 (Debian 13's);
                      both pinned in guest/versions.sh. 6.12's modules are xz-compressed in
                      the package: the image gets them decompressed (busybox loads plain .ko);
                      its virtio_pci is built in
  --no-strip          keep the debug information of binaries and libraries (stripped by default)
  --print-dir         print only the image directory on stdout at the end
  -h, --help          this text

CACHE is ${VHOST_USER_RDMA_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma/guest}.
Always in the image: busybox, uio + uio_pci_generic (loaded), virtio_pci and vfio_pci (loadable).
EOF
}

bins=() libs=() files=() sysroots=() extra_modules=() load_modules=(uio_pci_generic) lib_path=''
run_cmd='' name=default out='' compress=gzip print_dir=0 strip=1 kernel=6.1
while [ $# -gt 0 ]; do
  case "$1" in
  --bin) bins+=("${2:?--bin needs a path}"); shift 2 ;;
  --lib) libs+=("${2:?--lib needs a path}"); shift 2 ;;
  --lib-path) lib_path=${2:?--lib-path needs directories}; shift 2 ;;
  --file) files+=("${2:?--file needs SRC:DEST}"); shift 2 ;;
  --sysroot) sysroots+=("$(cd "${2:?--sysroot needs a directory}" && pwd)"); shift 2 ;;
  --module) extra_modules+=("${2:?--module needs a name}"); shift 2 ;;
  --load) extra_modules+=("${2:?--load needs a name}"); load_modules+=("$2"); shift 2 ;;
  --run) run_cmd=${2?--run needs a command}; shift 2 ;;
  --name) name=${2:?--name needs a name}; shift 2 ;;
  --out) out=${2:?--out needs a directory}; shift 2 ;;
  --compress) compress=${2:?--compress needs gzip, zstd or none}; shift 2 ;;
  --kernel) kernel=${2:?--kernel needs 6.1 or 6.12}; shift 2 ;;
  --print-dir) print_dir=1; shift ;;
  --no-strip) strip=0; shift ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; guest_die "unknown argument: $1" ;;
  esac
done
case "$compress" in gzip | zstd | none) ;; *) guest_die "--compress: gzip, zstd or none" ;; esac
guest_select_kernel "$kernel" || guest_die "--kernel: 6.1 or 6.12, not $kernel"
[ -n "$out" ] || out="$GUEST_CACHE/images/$name"

# Modules in every image: uio_pci_generic (the userspace driver's binding), virtio_pci (for other
# virtio devices, or to look at ours from the kernel's side), vfio_pci (works with a vIOMMU only).
image_modules=(uio_pci_generic virtio_pci vfio_pci vfio_iommu_type1 "${extra_modules[@]}")

need=(apt dpkg libc-bin coreutils util-linux gzip xz-utils)
[ "$compress" != zstd ] || need+=(zstd)
[ "$strip" = 0 ] || need+=(binutils)
guest_need_pkgs "${need[@]}"

mkdir -p "$GUEST_CACHE"/{downloads,kernel,busybox,tmp}
t_start=$(guest_now)

# extract_vmlinux BZIMAGE OUT: finds the compressed kernel inside a bzImage (xz or zstd) and
# writes the ELF it holds to OUT.
extract_vmlinux() {
  local off magic tool
  for magic in $'\xfd7zXZ' $'\x28\xb5\x2f\xfd'; do
    case "$magic" in $'\xfd7zXZ') tool=(xz -dc) ;; *) tool=(zstd -dcq) ;; esac
    command -v "${tool[0]}" >/dev/null || continue
    while read -r off; do
      tail -c +"$((off + 1))" "$1" | "${tool[@]}" >"$2.part" 2>/dev/null || true
      if [ "$(head -c 4 "$2.part" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
        mv "$2.part" "$2"
        return 0
      fi
    done < <(LC_ALL=C grep -abo "$magic" "$1" | cut -d: -f1)
  done
  rm -f "$2.part"
  return 1
}

# Downloads and extractions are shared by concurrent builds: one at a time.
exec 9>"$GUEST_CACHE/.lock"
flock 9

kdir="$GUEST_CACHE/kernel/${GUEST_KERNEL_PKG}_${GUEST_KERNEL_VERSION}"
if [ "$(cat "$kdir/.sha256" 2>/dev/null)" != "$GUEST_KERNEL_SHA256" ]; then
  deb=$(fetch_deb "$GUEST_KERNEL_PKG" "$GUEST_KERNEL_VERSION" "$GUEST_KERNEL_SHA256" \
    "$GUEST_KERNEL_SUITE")
  t_dl=$(guest_now)
  guest_log "extracting $GUEST_KERNEL_PKG (download $(guest_elapsed "$t_start" "$t_dl") s)"
  rm -rf "$kdir"
  mkdir -p "$kdir"
  nice dpkg-deb -x "$deb" "$kdir"
  # Trixie's packages are laid out for a merged /usr: the modules are in usr/lib/modules.
  [ -e "$kdir/lib" ] || [ ! -d "$kdir/usr/lib/modules" ] || ln -s usr/lib "$kdir/lib"
fi
krel=$(basename "$(find "$kdir/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")
if [ -z "$krel" ] || [ ! -f "$kdir/boot/vmlinuz-$krel" ]; then
  guest_die "$kdir: no kernel in the package"
fi

bbdir="$GUEST_CACHE/busybox/${GUEST_BUSYBOX_VERSION#*:}"
busybox="$bbdir/busybox"
if [ "$(cat "$bbdir/.sha256" 2>/dev/null)" != "$GUEST_BUSYBOX_SHA256" ]; then
  deb=$(fetch_deb "$GUEST_BUSYBOX_PKG" "$GUEST_BUSYBOX_VERSION" "$GUEST_BUSYBOX_SHA256")
  rm -rf "$bbdir"
  mkdir -p "$bbdir/x"
  dpkg-deb -x "$deb" "$bbdir/x"
  mv "$bbdir/x/bin/busybox" "$busybox"
  rm -rf "$bbdir/x"
  printf '%s\n' "$GUEST_BUSYBOX_SHA256" >"$bbdir/.sha256"
fi

# The kernel's module dependency list (Debian's package ships none: its postinst runs depmod).
moddir="$kdir/lib/modules/$krel"
if [ "$(cat "$kdir/.sha256" 2>/dev/null)" != "$GUEST_KERNEL_SHA256" ]; then
  guest_log "depmod $krel"
  nice "$busybox" depmod -b "$kdir" "$krel"
  printf '%s\n' "$GUEST_KERNEL_SHA256" >"$kdir/.sha256"
fi
# The bzImage's payload, uncompressed: QEMU boots an ELF vmlinux through the PVH entry point,
# which skips the XZ decompression that costs ~4 s under TCG.
if [ ! -f "$kdir/vmlinux" ] && grep -q '^CONFIG_PVH=y' "$kdir/boot/config-$krel"; then
  extract_vmlinux "$kdir/boot/vmlinuz-$krel" "$kdir/vmlinux" ||
    guest_log "warning: could not extract vmlinux; the image boots the compressed vmlinuz"
fi
flock -u 9
t_fetched=$(guest_now)

# resolve_modules NAME...: the module files (relative to $moddir) of NAME and everything they
# depend on; names may use - or _. Builtin modules are skipped.
resolve_modules() {
  awk -v want="$*" '
    function norm(s) { gsub("-", "_", s); return s }
    function key(p) { sub(".*/", "", p); sub("\\.ko(\\.[a-z]+)?$", "", p); return norm(p) }
    function add(p,   n, i, d) {
      if (p in seen) return
      seen[p] = 1; print p
      n = split(deps[p], d, " ")
      for (i = 1; i <= n; i++) add(d[i])
    }
    FILENAME ~ /modules\.builtin$/ { builtin[key($0)] = 1; next }
    { p = $1; sub(":$", "", p); path[key(p)] = p; $1 = ""; deps[p] = $0 }
    END {
      n = split(want, w, " ")
      for (i = 1; i <= n; i++) {
        k = norm(w[i])
        if (k in path) add(path[k])
        else if (!(k in builtin)) { print "unknown module: " w[i] > "/dev/stderr"; bad = 1 }
      }
      exit bad
    }' "$moddir/modules.builtin" "$moddir/modules.dep"
}

work=$(mktemp -d "$GUEST_CACHE/tmp/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc/guest,proc,sys,dev,tmp,run,root,mnt} \
  "$root/lib/modules/$krel"
chmod 1777 "$root/tmp"

# Our files first, so that no busybox applet link is written through.
cp -R "$guest_dir/rootfs/." "$root/"
install -m 0755 "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  case "$applet" in busybox | init | linuxrc) continue ;; esac
  [ -e "$root/bin/$applet" ] || [ -L "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
ln -s ../../bin/busybox "$root/usr/bin/env"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

mods=$(resolve_modules "${image_modules[@]}") || guest_die "see the module names above (kernel $krel)"
for m in $mods; do
  case "$m" in
  *.ko.xz)
    mkdir -p "$(dirname "$root/lib/modules/$krel/$m")"
    xz -dc "$moddir/$m" >"$root/lib/modules/$krel/${m%.xz}"
    ;;
  *) install -D -m 0644 "$moddir/$m" "$root/lib/modules/$krel/$m" ;;
  esac
done
cp "$moddir/modules.builtin" "$moddir/modules.order" "$root/lib/modules/$krel/"
"$busybox" depmod -b "$root" "$krel"
printf '%s\n' "${load_modules[@]}" >"$root/etc/guest/modules"

# The library directories of the sysroots, searched before --lib-path and the host's.
sysroot_path=''
for d in "${sysroots[@]}"; do
  for l in usr/lib/x86_64-linux-gnu lib/x86_64-linux-gnu usr/lib lib; do
    [ ! -d "$d/$l" ] || sysroot_path="$sysroot_path${sysroot_path:+:}$d/$l"
  done
done
search_path="$sysroot_path${sysroot_path:+${lib_path:+:}}$lib_path"

# image_path FILE: where a host file goes in the image: relative to its sysroot, or the same path.
image_path() {
  local d
  for d in "${sysroots[@]}"; do
    case "$1" in "$d"/*) printf '%s\n' "${1#"$d"}"; return ;; esac
  done
  printf '%s\n' "$1"
}

# add_libs FILE: copies the shared libraries FILE needs (ldd's answer) to the same paths (or their
# place in a sysroot), without their debug information unless --no-strip.
add_libs() {
  local out lib dest ldenv=()
  [ -z "$search_path" ] || ldenv=(LD_LIBRARY_PATH="$search_path")
  if ! out=$(env "${ldenv[@]}" ldd "$1" 2>&1); then
    case "$out" in
    *"not a dynamic executable"* | *"statically linked"*) return 0 ;;
    *) guest_die "ldd $1: $out" ;;
    esac
  fi
  if grep -q 'not found' <<<"$out"; then
    guest_die "$1 needs libraries this host lacks: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
  fi
  while read -r lib; do
    dest=$(image_path "$lib")
    [ ! -e "$root$dest" ] || continue
    install -D -m 0755 "$lib" "$root$dest"
    [ "$strip" = 0 ] || strip --strip-debug "$root$dest"
  done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }' <<<"$out")
}

is_elf() { [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; }

# split_spec SPEC DEFAULT_DIR: sets src and dest from SRC[:DEST].
split_spec() {
  src=${1%%:*}
  dest=${1#"$src"}
  dest=${dest#:}
  [ -n "$dest" ] || dest="$2/$(basename "$src")"
  [ -e "$src" ] || guest_die "$src: no such file"
}

manifest_bins=()
for spec in "${bins[@]}"; do
  split_spec "$spec" /bin
  if [ ! -f "$src" ] || [ ! -x "$src" ]; then guest_die "$src: not an executable file"; fi
  install -D -m 0755 "$src" "$root$dest"
  if [ "$strip" = 1 ] && is_elf "$src"; then strip --strip-debug "$root$dest"; fi
  add_libs "$src"
  manifest_bins+=("$dest $(sha256sum "$src" | cut -d' ' -f1) $src")
done
for spec in "${libs[@]}"; do
  split_spec "$spec" /usr/lib
  if [ ! -e "$root$dest" ]; then
    install -D -m 0755 "$src" "$root$dest"
    if [ "$strip" = 1 ] && is_elf "$src"; then strip --strip-debug "$root$dest"; fi
  fi
  add_libs "$src"
done
for d in "${sysroots[@]}"; do
  while IFS= read -r -d '' f; do
    rel=${f#"$d"}
    install -D -m "$(stat -c %a "$f")" "$f" "$root$rel"
    if is_elf "$f"; then
      [ "$strip" = 0 ] || strip --strip-debug "$root$rel"
      add_libs "$f"
    fi
  done < <(find "$d" -type f -print0)
  # Symbolic links as they are (e.g. libfoo.so.1 -> libfoo.so.1.2.3 in extracted packages).
  while IFS= read -r -d '' f; do
    rel=${f#"$d"}
    mkdir -p "$(dirname "$root$rel")"
    [ -e "$root$rel" ] || [ -L "$root$rel" ] || cp -P "$f" "$root$rel"
  done < <(find "$d" -type l -print0)
done
for spec in "${files[@]}"; do
  split_spec "$spec" /root
  [[ "$spec" == *:* ]] || guest_die "--file needs SRC:DEST"
  mkdir -p "$(dirname "$root$dest")"
  cp -RL "$src" "$root$dest"
done
[ -z "$run_cmd" ] || printf '%s\n' "$run_cmd" >"$root/etc/guest/run"

case "$compress" in
gzip) compressor=(gzip -6 -n) ;;
zstd) compressor=(zstd -q -10 -T0 --check) ;;
none) compressor=(cat) ;;
esac
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
  "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) | nice "${compressor[@]}" >"$work/initramfs.img"

{
  echo "kernel: $GUEST_KERNEL_PKG $GUEST_KERNEL_VERSION sha256 $GUEST_KERNEL_SHA256 (release $krel)"
  echo "busybox: $GUEST_BUSYBOX_PKG $GUEST_BUSYBOX_VERSION sha256 $GUEST_BUSYBOX_SHA256"
  echo "modules: $(for m in $mods; do m=${m%.xz}; basename "$m" .ko; done | tr '\n' ' ')"
  echo "loaded at boot: ${load_modules[*]}"
  echo "compression: $compress"
  echo "kernel files: vmlinuz$([ -f "$kdir/vmlinux" ] && echo ' vmlinux (uncompressed, PVH entry; run-guest.sh boots this one)')"
  echo "run: ${run_cmd:-<none: guest-info unless the kernel command line names a command>}"
  for b in "${manifest_bins[@]}"; do echo "binary: $b"; done
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$work/manifest.txt"

# put_kernel SRC NAME: the kernel file in the image directory, a hard link to the cache when
# it can be.
put_kernel() {
  [ -f "$1" ] || { rm -f "$out/$2"; return 0; }
  cmp -s "$1" "$out/$2" && return 0
  ln -f "$1" "$out/$2.new" 2>/dev/null || cp "$1" "$out/$2.new"
  mv -f "$out/$2.new" "$out/$2"
}
mkdir -p "$out"
put_kernel "$kdir/boot/vmlinuz-$krel" vmlinuz
put_kernel "$kdir/vmlinux" vmlinux
mv "$work/initramfs.img" "$out/initramfs.img"
mv "$work/manifest.txt" "$out/manifest.txt"
t_end=$(guest_now)

guest_log "image $out: initramfs $(du -k "$out/initramfs.img" | cut -f1) KiB ($compress)," \
  "kernel $krel; kernel+busybox ready in $(guest_elapsed "$t_start" "$t_fetched") s," \
  "initramfs built in $(guest_elapsed "$t_fetched" "$t_end") s"
if [ "$print_dir" = 1 ]; then
  printf '%s\n' "$out"
else
  guest_log "run it: scripts/run-guest.sh --image $out [--cmd 'PROGRAM ARGS'] [-- QEMU ARGS]"
fi
