#!/usr/bin/env bash
# Runs a command as root on Debian 12's own kernel (linux-image-amd64, 6.1),
# in a qemu guest whose root is this machine's / (9p, read-only), so the
# binaries just built and the installed tools are there as they are here.
#
#   scripts/kernel-vm.sh [--dir DIR] [--timeout SECONDS] COMMAND
#
# COMMAND is one bash command line, run in the guest from / with a fresh
# ext4 file system on /tmp (a sparse disk image in DIR), /dev/fuse and
# loop devices. Exits with COMMAND's exit status, or 1 if the guest
# reported none. The guest's console goes to stdout.
#
# Why: this machine and CI run a newer kernel, but a Debian 12 user runs
# 6.1, whose FUSE differs where the daemon depends on it: 6.1 keeps a
# cached reader's pages across a direct write, so the daemon's drops
# (docs/fuse.md, "Inodes and caching") are what keeps that reader right.
#
# DIR (default build-test/kernel-vm; no blanks in its path) keeps the
# kernel and the initramfs between runs; delete it to start over. The
# kernel comes from apt (apt-get download from the machine's Debian mirror),
# unpacked, not installed. qemu emulates the CPU (TCG): it needs no
# /dev/kvm and behaves the same everywhere; THINFS_VM_ACCEL=kvm uses KVM
# (hardware KVM only: a kvm_pvm host, with no vmx flag and no kvm_intel,
# runs only kernels built as PVM guests, and Debian's hangs there).
# Needs root, qemu-system-x86 and busybox-static (scripts/deps.sh).
set -euo pipefail

dir=build-test/kernel-vm
timeout_s=1800
while [[ $# -gt 1 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
command=$1
mkdir -p "$dir"
dir=$(realpath "$dir")
here=$(dirname "$(realpath "$0")")

# The kernel and an initramfs holding busybox, the modules that reach 9p,
# the disk, FUSE and loop devices (with the modules they depend on, read
# from each one's modinfo), and an init that mounts the host's root and
# switches to it (scripts/kernel-vm-init.sh). Only vmlinuz and the
# initramfs are kept.
if [[ ! -e $dir/vmlinuz || ! -e $dir/initrd.gz ]]; then
  rm -rf "$dir/kernel" "$dir/initrd" "$dir/vmlinuz" "$dir/initrd.gz"
  mkdir -p "$dir/kernel"
  kernel_package() {
    { apt-cache depends linux-image-amd64 2>/dev/null || true; } |
      sed -n '/^ *Depends: linux-image-[0-9]/{s/^ *Depends: //p;q}'
  }
  pkg=$(kernel_package)
  if [[ -z $pkg ]]; then
    # No package lists yet (a fresh container with every package present).
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    pkg=$(kernel_package)
  fi
  if [[ -z $pkg ]]; then
    echo "kernel-vm: apt knows no linux-image-amd64" >&2
    exit 1
  fi
  # apt-get download writes into the current directory, as _apt if it can.
  chmod 777 "$dir/kernel"
  (cd "$dir/kernel" && apt-get download -q "$pkg")
  dpkg-deb -x "$dir"/kernel/"$pkg"_*.deb "$dir/kernel/root"
  vmlinuz=$(ls "$dir"/kernel/root/boot/vmlinuz-*)
  release=${vmlinuz##*/vmlinuz-}
  moddir=$dir/kernel/root/lib/modules/$release

  declare -A path=() builtin=() seen=()
  while IFS= read -r f; do
    n=${f##*/}; n=${n%.ko}; path[${n//-/_}]=$f
  done < <(find "$moddir/kernel" -name '*.ko')
  while IFS= read -r f; do
    n=${f##*/}; n=${n%.ko}; builtin[${n//-/_}]=1
  done < "$moddir/modules.builtin"
  order=()
  add() {
    local m=$1 d
    [[ -n ${builtin[$m]:-} || -n ${seen[$m]:-} ]] && return
    if [[ -z ${path[$m]:-} ]]; then
      echo "kernel-vm: no module $m in $release" >&2
      exit 1
    fi
    seen[$m]=1
    for d in $(tr '\0' '\n' < "${path[$m]}" | sed -n 's/^depends=//p' | tr ',' ' '); do
      add "${d//-/_}"
    done
    order+=("$m")
  }
  # crc32c_generic before ext4 and btrfs, which ask the crypto API for it.
  for m in virtio_pci virtio_blk 9pnet_virtio 9p crc32c_generic ext4 fuse loop btrfs xfs; do
    add "$m"
  done
  mkdir -p "$dir"/initrd/{bin,mods,proc,sys,dev,newroot}
  cp "$(command -v busybox)" "$dir/initrd/bin/busybox"
  cp "$here/kernel-vm-init.sh" "$dir/initrd/init"
  chmod +x "$dir/initrd/init"
  i=0
  for m in "${order[@]}"; do
    cp "${path[$m]}" "$dir/initrd/mods/$(printf %03d $i)-$m.ko"
    i=$((i + 1))
  done
  (cd "$dir/initrd" && find . | busybox cpio -o -H newc 2>/dev/null) | gzip -1 > "$dir/initrd.gz.new"
  cp "$vmlinuz" "$dir/vmlinuz"
  mv "$dir/initrd.gz.new" "$dir/initrd.gz"
  rm -rf "$dir/kernel" "$dir/initrd"
fi

printf '%s\n' "$command" > "$dir/command.sh"
# A fresh scratch disk each run, for the guest's /tmp.
rm -f "$dir/scratch.img"
truncate -s 16G "$dir/scratch.img"
mkfs.ext4 -q -F "$dir/scratch.img"

accel=(-accel tcg)
[[ ${THINFS_VM_ACCEL:-} == kvm ]] && accel=(-enable-kvm -cpu host,-arch-capabilities)
log=$dir/console.log
set +e
timeout "$timeout_s" qemu-system-x86_64 "${accel[@]}" -m 6G -smp 2 -nographic -no-reboot \
  -kernel "$dir/vmlinuz" -initrd "$dir/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 thinfs_vm_init=$here/kernel-vm-guest.sh thinfs_vm_dir=$dir" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
  -drive "file=$dir/scratch.img,format=raw,if=virtio,cache=unsafe" < /dev/null 2>&1 | tee "$log"
qemu_status=${PIPESTATUS[0]}
set -e
rm -f "$dir/scratch.img"
status=$(tr -d '\r' < "$log" | sed -n 's/^kernel-vm: exit status \([0-9]*\)$/\1/p' | tail -1)
if [[ -z $status ]]; then
  echo "kernel-vm: the guest reported no exit status (qemu exited with $qemu_status)" >&2
  exit 1
fi
exit "$status"
