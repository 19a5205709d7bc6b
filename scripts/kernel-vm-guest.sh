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
dir=$(sed -n 's/.*thinfs_vm_dir=\([^ ]*\).*/\1/p' /proc/cmdline)
# The scratch disk on /tmp hides the host's /tmp. A checkout there (README's
# test command clones into `mktemp -d`) must still be found at its own
# path: its top directory is bound back over the scratch disk.
mkdir -p /run/host-tmp && mount --bind /tmp /run/host-tmp
mount -t ext4 /dev/vda /tmp && chmod 1777 /tmp
top=
case $dir in
  /tmp/?*)
    top=${dir#/tmp/}
    top=/tmp/${top%%/*}
    mkdir -p "$top" && mount --bind "/run/host-tmp/${top#/tmp/}" "$top"
    ;;
esac
echo "kernel-vm: running on $(uname -r)"
cd / && bash "$dir/command.sh"
echo "kernel-vm: exit status $?"
[[ -n $top ]] && umount "$top"
umount /tmp
echo o > /proc/sysrq-trigger
sleep 60
