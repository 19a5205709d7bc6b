# PID 1 of scripts/kernel-vm.sh's guest, on the host's root (read-only):
# mounts what a Debian system has, runs DIR/command.sh and reports its exit
# status on the console, then powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts pts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs run /run
# udev makes these on a real system; bash's <(...) needs /dev/fd.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t ext4 /dev/vda /tmp && chmod 1777 /tmp
dir=$(sed -n 's/.*thinfs_vm_dir=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "kernel-vm: running on $(uname -r)"
cd / && bash "$dir/command.sh"
echo "kernel-vm: exit status $?"
umount /tmp
echo o > /proc/sysrq-trigger
sleep 60
