#!/usr/bin/env bash
# 4 KiB random writes into a fresh snapshot, and what an fsync after a
# burst of them waits for: the probe behind docs/benchmarks.md, lever 23
# (how much copy-on-write copying may be owed to the next commit).
#
#   bench/cow_burst.sh [--rounds N] [--size SIZE] [--runtime S] [--burst S] [--dir DIR] CONFIG...
#
# CONFIG is THINFS_BINARY or THINFS_BINARY:MOUNT_OPTIONS (for example
# build/thinfs:deferred_copy=256M). Per CONFIG: formats a pool of four
# times --size, mounts it, writes a volume `vol` of --size (default 1G) in
# order (fsynced). Then N rounds (default 3), the CONFIGs alternating:
#   - snapshots `vol`, drops every cache, and runs fio 4 KiB random writes
#     (psync, QD1) into the snapshot for --runtime (fio's time: 6, the
#     default, or 500ms): IOPS, median and 99th percentile latency;
#   - snapshots `vol` again, drops every cache, writes 4 KiB at random
#     places for --burst seconds (default 1) from one process, then times
#     one fsync: writes per second, and the fsync's milliseconds;
#   - deletes both snapshots.
# Prints one line per measurement. Works in DIR (default /var/tmp/cow_burst;
# must not exist; removed at the end). Needs root (drop_caches, mount),
# fio, python3.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 size=1G runtime=6 burst=1 work=/var/tmp/cow_burst
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    -h | --help) header_usage 21; exit 0 ;;
    *) echo "cow_burst: unknown option $1" >&2; exit 2 ;;
  esac
done
parse_probe_configs cow_burst 21 "$@"
bytes=$(numfmt --from=iec "$size")
make_work_dir cow_burst "$work"
mounted=() pids=()
cleanup() {
  umount_configs "$work"
  rm -rf "$work"
}
trap cleanup EXIT

label() { echo "$(basename "$(dirname "${bins[$1]}")")/$(basename "${bins[$1]}")${opts[$1]:+ -o ${opts[$1]}}"; }

mount_configs "$work" "$((4 * bytes))"
for i in "${!bins[@]}"; do
  d=$work/$i
  truncate -s "$bytes" "$d/mnt/vol"
  fio --name=fill --filename="$d/mnt/vol" --rw=write --bs=1M --size="$bytes" --end_fsync=1 \
    --output=/dev/null
done

for r in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    d=$work/$i
    "${bins[$i]}" snapshot "$d/pool" vol w >/dev/null
    drop_caches
    fio --name=cow --filename="$d/mnt/w" --rw=randwrite --bs=4k --ioengine=psync --time_based \
      --runtime="$runtime" --randrepeat=0 --output-format=json --output="$d/fio.json"
    python3 - "$d/fio.json" "$r" "$(label "$i")" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
p = w["clat_ns"]["percentile"]
print(f"round {sys.argv[2]} {sys.argv[3]}: randwrite4k {w['iops']:.0f} IOPS, "
      f"p50 {p['50.000000'] / 1000:.0f} us, p99 {p['99.000000'] / 1000:.0f} us")
EOF
    "${bins[$i]}" snapshot "$d/pool" vol b >/dev/null
    drop_caches
    python3 - "$d/mnt/b" "$burst" "$r" "$(label "$i")" <<'EOF'
import os, random, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDWR)
blocks = os.fstat(fd).st_size // 4096
buf = os.urandom(4096)
n, end = 0, time.monotonic() + secs
while time.monotonic() < end:
    for _ in range(64):
        os.pwrite(fd, buf, random.randrange(blocks) * 4096)
    n += 64
t = time.monotonic()
os.fsync(fd)
dt = time.monotonic() - t
os.close(fd)
print(f"round {sys.argv[3]} {sys.argv[4]}: burst {n / secs:.0f} writes/s for {secs:g} s, "
      f"then fsync {dt * 1000:.0f} ms")
EOF
    "${bins[$i]}" delete "$d/pool" w >/dev/null
    "${bins[$i]}" delete "$d/pool" b >/dev/null
  done
done
