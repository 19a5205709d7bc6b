#!/usr/bin/env bash
# 4 KiB random overwrites of a file through a FUSE mount: the
# single-target probe behind docs/benchmarks.md levers 12-13 and 57, and
# the stop of 2026-12-06's look at target 1's random write.
#   bench/overwrite_iops.sh THINFS_BINARY [MOUNT_OPTIONS] [DIR]
#   bench/overwrite_iops.sh passthrough=PASSTHROUGH_LL_BINARY [-] [DIR]
# thinfs: formats a 4 GiB sparse pool in DIR (default
# /var/tmp/overwrite_iops), mounts it with -o MOUNT_OPTIONS and makes a
# volume of SIZE; passthrough=: serves a file of SIZE in DIR with libfuse's
# passthrough_ll (as bench/fio_compare.py's fuse-passthrough target).
# Writes the file sequentially (fsynced), then runs fio --rw=randwrite
# --bs=4k --ioengine=psync for 5 s three times and prints, per run: IOPS;
# the daemon's CPU time per write (utime + stime of its process); the
# whole machine's busy CPU time per write (every CPU, /proc/stat) and its
# irq + softirq part; the daemon's threads' voluntary context switches per
# write and, apart, their involuntary ones.
# SIZE (default 1G) and RUNTIME (seconds, default 5) in the environment
# change the file's size and each run's length (CI's quick test: 64M, 1).
# COLD=1 in the environment: before each run the file and what backs it
# (the pool's data file, the passthrough's source file) are synced and
# evicted from the page cache, as fio_compare.py's --cache cold does.
# Unmounts and removes DIR on any exit. Needs root (FUSE) and fio (exit
# 77 without them; 1 under CI).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  header_usage 23
  [[ $# -ge 1 ]] && exit 0
  exit 2
fi
require_root_and_fio overwrite_iops
target=$1
mount_opts=${2:-}
[ "$mount_opts" = - ] && mount_opts=
dir=${3:-/var/tmp/overwrite_iops}
size=${SIZE:-1G}
runtime=${RUNTIME:-5}
make_work_dir overwrite_iops "$dir"
mkdir "$dir/mnt"
pid=
case "$target" in
  passthrough=*) bin=$(realpath "${target#passthrough=}"); unmount=(fusermount3 -u) ;;
  *) bin=$(realpath "$target"); unmount=("$bin" umount) ;;
esac
cleanup() {
  if mountpoint -q "$dir/mnt"; then "${unmount[@]}" "$dir/mnt" >/dev/null 2>&1 || true; fi
  # passthrough_ll exits once unmounted; the thinfs daemon is not our child.
  if [[ -n ${passthrough_pid:-} ]]; then wait "$passthrough_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
case "$target" in
  passthrough=*)
    mkdir "$dir/src"
    truncate -s "$size" "$dir/src/fio.dat"
    start_passthrough overwrite_iops "$bin" "$dir/src" "$dir/mnt" "$dir/passthrough.log"
    pid=$passthrough_pid
    file=$dir/mnt/fio.dat
    backing=$dir/src/fio.dat
    ;;
  *)
    "$bin" format "$dir/pool" --size 4G >/dev/null
    "$bin" mount "$dir/pool" "$dir/mnt" ${mount_opts:+-o "$mount_opts"}
    pid=$(cat "$dir/pool/lock")
    truncate -s "$size" "$dir/mnt/vol"
    file=$dir/mnt/vol
    backing=$dir/pool/data
    ;;
esac
fio --name=fill --filename="$file" --rw=write --bs=1M --size="$size" --end_fsync=1 \
  --ioengine=psync --output=/dev/null
for _ in 1 2 3; do
  if [ "${COLD:-0}" = 1 ]; then evict_files "$file" "$backing"; fi
  daemon_before=$(daemon_cpu_ticks "$pid")
  busy_before=$(machine_busy_ticks)
  irq_before=$(machine_irq_ticks)
  switches_before=$(daemon_context_switches "$pid")
  fio --name=rw --filename="$file" --rw=randwrite --bs=4k --size="$size" --time_based \
    --runtime="$runtime" --ioengine=psync --output-format=json --output="$dir/out.json"
  daemon_after=$(daemon_cpu_ticks "$pid")
  busy_after=$(machine_busy_ticks)
  irq_after=$(machine_irq_ticks)
  switches_after=$(daemon_context_switches "$pid")
  python3 -c '
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
writes = max(1, j["total_ios"])
daemon, busy, irq = (int(a) - int(b) for b, a in zip(sys.argv[2:5], sys.argv[5:8]))
voluntary, involuntary = (int(a) - int(b) for b, a in zip(sys.argv[8].split(), sys.argv[9].split()))
us = 1e6 / os.sysconf("SC_CLK_TCK") / writes  # per tick, per write
print("iops", round(j["iops"]), "daemon_cpu_us_per_write", round(daemon * us, 1),
      "machine_cpu_us_per_write", round(busy * us, 1), "irq_us", round(irq * us, 2),
      "switches_per_write", round(voluntary / writes, 2), "involuntary", round(involuntary / writes, 3))' \
    "$dir/out.json" "$daemon_before" "$busy_before" "$irq_before" "$daemon_after" "$busy_after" \
    "$irq_after" "$switches_before" "$switches_after"
done
