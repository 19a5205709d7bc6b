#!/usr/bin/env bash
# Copy-on-write into a fresh snapshot, pool on the file system holding DIR:
# fio 4 KiB random writes (6 s, end_fsync) into a snapshot of a fully
# written 1 GiB volume; prints the IOPS, the host space the writes took
# (df of DIR's file system) while mounted and after unmount with the
# inodes evicted, and the speed of a cold sequential read of the snapshot
# after them. Run as root; DIR must be a mount point's directory that
# may be frozen (fsfreeze settles background frees before each df).
# docs/benchmarks.md, lever 11.
#
#   bench/cow_space.sh BINARY DIR
set -euo pipefail
B=$1
FS=$(findmnt -n -o TARGET --target "$2")
D=$(mktemp -d "$2/cow_space.XXXXXX")
cleanup() {
  mountpoint -q "$D/mnt" && "$B" umount "$D/mnt" >/dev/null 2>&1 || true
  rm -rf "$D"
}
trap cleanup EXIT
settle() { sync; fsfreeze -f "$FS"; fsfreeze -u "$FS"; }
used() { settle; df -k --output=used "$FS" | tail -1; }
mkdir "$D/mnt"
"$B" format "$D/pool" --size 3G --block-size 64K >/dev/null
"$B" mount "$D/pool" "$D/mnt"
"$B" create "$D/pool" v --size 1G >/dev/null
fio --name=w --filename="$D/mnt/v" --rw=write --bs=1M --size=1G --end_fsync=1 --output=/dev/null
"$B" snapshot "$D/pool" v s >/dev/null
u0=$(used)
fio --name=r --filename="$D/mnt/s" --rw=randwrite --bs=4k --ioengine=psync --runtime=6 \
  --time_based --size=1G --end_fsync=1 --output-format=terse --output="$D/fio.txt"
u1=$(used)
iops=$(awk -F';' '{print $50}' "$D/fio.txt")  # terse v3: write IOPS
# What the copies cost later readers (a block of the snapshot is now two
# or three extents of pool/data where its copy shares the origin's).
settle
echo 3 > /proc/sys/vm/drop_caches
fio --name=s --filename="$D/mnt/s" --rw=read --bs=1M --size=1G --output-format=terse \
  --output="$D/read.txt"
read_mib=$(awk -F';' '{printf "%.0f", $7 / 1024}' "$D/read.txt")  # terse v3: read KiB/s
"$B" umount "$D/mnt"
echo 3 > /proc/sys/vm/drop_caches
u2=$(used)
echo "$B: randwrite4k into a snapshot $iops IOPS; host space: $(((u1 - u0) / 1024)) MiB mounted, $(((u2 - u0) / 1024)) MiB after unmount; then a cold sequential read of the snapshot $read_mib MiB/s"
