#!/usr/bin/env bash
# What mixed buffered I/O costs: the probe behind docs/benchmarks.md
# levers 16 (AUTO_INVAL_DATA: the FUSE requests it takes) and 58 (a fresh
# snapshot against its origin, and where the CPU goes).
#   bench/mixed_requests.sh THINFS_BINARY [MOUNT_OPTIONS] [DIR]
# Formats a 4 GiB sparse pool in DIR (default /var/tmp/mixed_requests),
# mounts it in the foreground with -o MOUNT_OPTIONS, writes a 1 GiB volume
# sequentially (fsynced, then dropped from the page cache) and runs fio
# --rw=randrw --bs=4k --numjobs=4 for 6 s on it. Per job it prints the
# read and write IOPS, the whole machine's busy CPU time per I/O (every
# CPU, /proc/stat) and the daemon's (utime + stime of its process). Then
# it unmounts and prints the daemon's request counts (reads, writes,
# GETATTRs, page-cache drops).
# SNAPSHOT=1 in the environment: ROUNDS rounds (default 3) instead, each
# a fresh `thinfs snapshot` of the volume and the job on it (writes that
# copy on write), the snapshot deleted, then the job on the volume
# (overwrites in place); every cache is dropped before each job, as
# fio_compare.py's --cache cold does.
# Unmounts and removes DIR on any exit. Needs root (FUSE) and fio.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  header_usage 19
  [[ $# -ge 1 ]] && exit 0
  exit 2
fi
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
daemon=$(cat "$dir/pool/lock")
fio --name=fill --filename="$dir/mnt/vol" --rw=write --bs=1M --size=1G --end_fsync=1 \
  --ioengine=psync --output=/dev/null
evict_files "$dir/mnt/vol"

mixed_job() {  # mixed_job FILE LABEL
  local m0 d0 m1 d1
  m0=$(machine_busy_ticks) d0=$(daemon_cpu_ticks "$daemon")
  fio --name=rw --filename="$1" --rw=randrw --rwmixread=50 --bs=4k --size=1G \
    --numjobs=4 --group_reporting --time_based --runtime=6 --ioengine=psync --invalidate=1 \
    --randrepeat=0 --output-format=json --output="$dir/out.json"
  m1=$(machine_busy_ticks) d1=$(daemon_cpu_ticks "$daemon")
  python3 - "$dir/out.json" "$2" "$m0" "$m1" "$d0" "$d1" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
m0, m1, d0, d1 = (int(x) for x in sys.argv[3:7])
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
us = 1e6 / os.sysconf("SC_CLK_TCK") / max(ios, 1)
print(f"{sys.argv[2]}: randrw4k-4jobs read IOPS {round(j['read']['iops'])} "
      f"write IOPS {round(j['write']['iops'])}, machine_cpu_us_per_io {(m1 - m0) * us:.1f}, "
      f"daemon_cpu_us_per_io {(d1 - d0) * us:.1f}")
EOF
}

if [[ ${SNAPSHOT:-0} == 1 ]]; then
  for r in $(seq 1 "${ROUNDS:-3}"); do
    "$bin" snapshot "$dir/pool" vol snap >/dev/null
    drop_caches
    mixed_job "$dir/mnt/snap" "round $r snapshot"
    rm "$dir/mnt/snap"
    drop_caches
    mixed_job "$dir/mnt/vol" "round $r origin"
  done
else
  mixed_job "$dir/mnt/vol" volume
fi
"$bin" umount "$dir/mnt" >/dev/null
wait "$pid"
pid=
grep -o 'served .*' "$dir/log"
