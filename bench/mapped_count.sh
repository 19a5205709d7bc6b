#!/usr/bin/env bash
# What keeping mapped_blocks exact costs (docs/design.md: range clones, and
# check's mapped-block counts). Needs root and /dev/fuse; uses about 600 MiB
# under /var/tmp and removes it.
# usage: bench/mapped_count.sh THINFS_BINARY [LABEL]
#   1. copy_file_range of a dense 256 MiB volume (pool of 4 KiB blocks,
#      65536 mappings) onto an empty file: in 1, 2 and 8 calls (a piece of
#      2 is 32768 blocks, as many as a 2 GiB piece at 64 KiB), 11 times each;
#   2. thinfs check of a pool holding a dense 64 MiB origin of 4 KiB blocks
#      (16384 mappings) and 50 snapshots of it, 7 runs.
# Prints medians; run it with the binaries to compare, on a quiet machine.
set -euo pipefail
B=$(realpath "$1"); L=${2:-thinfs}
here=$(dirname "$(realpath "$0")")
D=$(mktemp -d /var/tmp/mapped-count.XXXXXX)
M=$D/mnt
mkdir -p "$M"
cleanup() { mountpoint -q "$M" && "$B" umount "$M" || true; rm -rf "$D"; }
trap cleanup EXIT

"$B" format "$D/p1" --size 1G --block-size 4096 >/dev/null
"$B" mount "$D/p1" "$M"
"$B" create "$D/p1" src --size 256M >/dev/null
dd if=/dev/urandom of="$M/src" bs=1M count=256 conv=notrunc,fsync status=none
for pieces in 1 2 8; do
  python3 "$here/clone_pieces.py" "$M" src "$pieces" 11 | sed "s/^/$L clone: /"
done
"$B" umount "$M"

"$B" format "$D/p2" --size 512M --block-size 4096 >/dev/null
"$B" mount "$D/p2" "$M"
"$B" create "$D/p2" origin --size 64M >/dev/null
dd if=/dev/urandom of="$M/origin" bs=1M count=64 conv=notrunc,fsync status=none
for i in $(seq 1 50); do "$B" snapshot "$D/p2" origin "s$i" >/dev/null; done
"$B" umount "$M"
ts=()
for r in 1 2 3 4 5 6 7; do
  t0=$(date +%s%N)
  "$B" check "$D/p2" >/dev/null
  t1=$(date +%s%N)
  ts+=($(((t1 - t0) / 1000000)))
done
printf '%s\n' "${ts[@]}" | sort -n | awk -v L="$L" '{a[NR] = $1} END {
  printf "%s check, 51 devices x 16384 mappings: median %d ms (min %d, max %d, 7 runs)\n",
         L, a[4], a[1], a[7] }'
