#!/usr/bin/env bash
# How much the disk reads for what fio reads: a cold 6 s fio read job on a
# written 1 GiB thinfs volume and on a written 1 GiB plain file beside it,
# alternating (plain, volume, plain, volume), with the disk's read counters
# (/sys/class/block/DEV/stat) taken around each job. Shows the host's
# readahead on pool/data (docs/benchmarks.md, lever 18).
#
#   bench/disk_read_probe.sh THINFS_BINARY JOB [WORKDIR] [MOUNT_OPTIONS]
#
# JOB: qd32 (4 KiB random reads, libaio, iodepth 32, O_DIRECT), qd1 (4 KiB
# random reads, psync, buffered) or seq (1 MiB sequential reads, psync).
# WORKDIR (default /var/tmp/disk-read-probe) must not exist; it is removed
# at the end. Needs root (drop_caches, mount) and about 3 GiB free there.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin=$(realpath "$1") job=$2 work=${3:-/var/tmp/disk-read-probe} opts=${4:-}
case $job in
  qd32) args=(--rw=randread --bs=4k --ioengine=libaio --iodepth=32 --direct=1 --runtime=6 --time_based) ;;
  qd1) args=(--rw=randread --bs=4k --ioengine=psync --runtime=6 --time_based) ;;
  seq) args=(--rw=read --bs=1M --ioengine=psync) ;;
  *) echo "disk_read_probe: JOB is qd32, qd1 or seq, not '$job'" >&2; exit 2 ;;
esac
if [[ -e $work ]]; then
  echo "disk_read_probe: $work exists; give a new directory" >&2
  exit 2
fi
mkdir -p "$work/mnt"
mounted=
cleanup() {
  [[ -n $mounted ]] && "$bin" umount "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT

# The block device under the work directory, as /sys/class/block names it.
stat_file=$(disk_stat_file "$work" disk_read_probe) || exit 1

"$bin" format "$work/pool" --size 3G >/dev/null
"$bin" mount "$work/pool" "$work/mnt" ${opts:+-o "$opts"}
mounted=1
truncate -s 1G "$work/mnt/vol" "$work/plain"
for f in "$work/mnt/vol" "$work/plain"; do
  fio --name=prewrite --filename="$f" --rw=write --bs=1M --size=1G --end_fsync=1 \
    --output=/dev/null
done

# Fields 1 and 3 of the stat file: read I/Os completed, sectors read.
printf '%-6s %9s %12s %12s %12s %12s\n' target IOPS "fio MiB" "disk MiB" "disk/fio" "disk I/Os"
for f in "$work/plain" "$work/mnt/vol" "$work/plain" "$work/mnt/vol"; do
  drop_caches
  read -r ios0 _ sectors0 _ < "$stat_file"
  fio --name=probe --filename="$f" "${args[@]}" --size=1G --invalidate=1 --randrepeat=0 \
    --output-format=json --output="$work/fio.json"
  read -r ios1 _ sectors1 _ < "$stat_file"
  python3 -c '
import json, sys
path, name, sectors, ios = sys.argv[1:]
text = open(path).read()
r = json.loads(text[text.index("{"):])["jobs"][0]["read"]
disk, got = int(sectors) * 512, r["io_bytes"]
iops = r["iops"]
print(f"{name:<6} {iops:9.0f} {got / 2**20:12.1f} {disk / 2**20:12.1f} "
      f"{disk / max(got, 1):12.2f} {ios:>12}")
' "$work/fio.json" "$([[ $f == */vol ]] && echo volume || echo plain)" \
    $((sectors1 - sectors0)) $((ios1 - ios0))
done
