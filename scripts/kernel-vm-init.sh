#!/bin/busybox sh
# /init of scripts/kernel-vm.sh's initramfs: loads the modules it holds,
# mounts the host's root (9p, read-only) and hands over to
# scripts/kernel-vm-guest.sh on it, named on the kernel command line.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /mods/*.ko; do
  insmod "$m" || echo "kernel-vm: insmod $m failed"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot; then
  echo "kernel-vm: cannot mount the host's root"
  poweroff -f
fi
mount --move /dev /newroot/dev
guest=$(sed -n 's/.*thinfs_vm_init=\([^ ]*\).*/\1/p' /proc/cmdline)
umount /proc /sys
exec switch_root /newroot /bin/bash "$guest"
