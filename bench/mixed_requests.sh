#!/usr/bin/env bash
# What mixed buffered I/O costs in FUSE requests: the probe behind
# docs/benchmarks.md lever 16 (AUTO_INVAL_DATA).
#   bench/mixed_requests.sh THINFS_BINARY [MOUNT_OPTIONS] [DIR]
# Formats a 4 GiB sparse pool in DIR (default /var/tmp/mixed_requests),
# mounts it in the foreground with -o MOUNT_OPTIONS, writes a 1 GiB volume
# sequentially (fsynced, then dropped from the page cache), runs fio
# --rw=randrw --bs=4k --numjobs=4 for 6 s, prints its read and write IOPS,
# unmounts and prints the daemon's request counts (reads, writes,
# GETATTRs, page-cache drops). Unmounts and removes DIR on any exit.
# Needs root (FUSE), fio.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"
bin=$(realpath "$1")
mount_opts=${2:-}
dir=${3:-/var/tmp/mixed_requests}
make_work_dir mixed_requests "$dir"
mkdir "$dir/mnt"
pid=
cleanup() {
  mountpoint -q "$dir/mnt" && "$bin" umount "$dir/mnt" >/dev/null 2>&1 || true
  [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin" format "$dir/pool" --size 4G >/dev/null
"$bin" create "$dir/pool" vol --size 1G >/dev/null
"$bin" mount "$dir/pool" "$dir/mnt" -f ${mount_opts:+-o "$mount_opts"} 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do mountpoint -q "$dir/mnt" && break; sleep 0.1; done
mountpoint -q "$dir/mnt" || { cat "$dir/log" >&2; exit 1; }
fio --name=fill --filename="$dir/mnt/vol" --rw=write --bs=1M --size=1G --end_fsync=1 \
  --ioengine=psync --output=/dev/null
evict_files "$dir/mnt/vol"
fio --name=rw --filename="$dir/mnt/vol" --rw=randrw --rwmixread=50 --bs=4k --size=1G \
  --numjobs=4 --group_reporting --time_based --runtime=6 --ioengine=psync --invalidate=1 \
  --randrepeat=0 --output-format=json --output="$dir/out.json"
python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; \
print('randrw4k-4jobs read IOPS', round(j['read']['iops']), 'write IOPS', round(j['write']['iops']))" \
  "$dir/out.json"
"$bin" umount "$dir/mnt" >/dev/null
wait "$pid"
pid=
grep -o 'served .*' "$dir/log"
