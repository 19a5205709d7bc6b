#!/usr/bin/env bash
# 4 KiB random overwrites of a provisioned volume, through the mount: the
# single-target probe behind docs/benchmarks.md levers 12-13.
#   bench/overwrite_iops.sh THINFS_BINARY [MOUNT_OPTIONS] [DIR]
# Formats a 4 GiB sparse pool in DIR (default /var/tmp/overwrite_iops),
# mounts it with -o MOUNT_OPTIONS, writes a 1 GiB volume sequentially
# (fsynced), then runs fio --rw=randwrite --bs=4k --ioengine=psync for 5 s
# three times and prints each run's IOPS. Unmounts and removes DIR on any
# exit. Needs root (FUSE), fio.
set -euo pipefail
bin=$(realpath "$1")
opts=${2:-}
dir=${3:-/var/tmp/overwrite_iops}
[ -e "$dir" ] && { echo "$dir exists; give another DIR" >&2; exit 2; }
mkdir -p "$dir/mnt"
cleanup() {
  mountpoint -q "$dir/mnt" && "$bin" umount "$dir/mnt" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin" format "$dir/pool" --size 4G >/dev/null
if [ -n "$opts" ]; then "$bin" mount "$dir/pool" "$dir/mnt" -o "$opts"; else "$bin" mount "$dir/pool" "$dir/mnt"; fi
truncate -s 1G "$dir/mnt/vol"
fio --name=fill --filename="$dir/mnt/vol" --rw=write --bs=1M --size=1G --end_fsync=1 \
  --ioengine=psync --output=/dev/null
for _ in 1 2 3; do
  fio --name=rw --filename="$dir/mnt/vol" --rw=randwrite --bs=4k --size=1G --time_based \
    --runtime=5 --ioengine=psync --output-format=json --output="$dir/out.json"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('iops', round(j['jobs'][0]['write']['iops']))" "$dir/out.json"
done
