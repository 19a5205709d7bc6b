#!/usr/bin/env bash
# Sequential reads through a mount with the kernel's readahead window of
# 128 KiB against larger ones: the probe behind docs/benchmarks.md, lever
# 40 (mount option readahead=SIZE).
#
#   bench/readahead_probe.sh [--rounds N] [--size SIZE] [--cold] [--prefault SIZE] [--dir DIR]
#                            THINFS_BINARY [KIB...]
#
# Formats a pool, mounts it, writes a SIZE volume (default 1G, fsynced) and
# reads the pool's data file once, so that the host's page cache holds it
# and no read waits for the disk; with --cold, every cache is dropped
# before each read instead (drop_caches), so the daemon reads the disk.
# With --prefault SIZE, SIZE bytes are written to a file in /dev/shm and
# the file removed right before each read: on a VM whose balloon reports
# free pages to the host (docs/benchmarks.md, lever 39), the pages the read
# then caches into are backed again instead of faulting in the host. Per round (default 5) and window (KIB,
# default 128 1024: the kernel's default and thinfs's), the window is
# written to the mount's /sys/class/bdi/MAJ:MIN/read_ahead_kb, the volume
# file's pages are dropped (dd iflag=nocache) and fio reads it 1 MiB at a
# time (psync, as the suite's seqread1M). One line per measurement: MiB/s,
# the daemon's CPU time (user + system) and the reads its engine served
# (one per FUSE read request; `thinfs status --json`, counters.reads). The windows alternate in order round by
# round. Works in DIR (default /var/tmp/readahead_probe; must not exist;
# removed at the end). Needs root, fio and python3 (exit 77 without them).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=5 size=1G cold=0 prefault='' work=/var/tmp/readahead_probe
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --cold) cold=1; shift ;;
    --prefault) prefault=$2; shift 2 ;;
    -h | --help) header_usage 26; exit 0 ;;
    *) echo "readahead_probe: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 1 ]]; then
  header_usage 26
  exit 2
fi
require_root_and_fio readahead_probe
bin=$(realpath "$1")
shift
windows=("$@")
[[ ${#windows[@]} -gt 0 ]] || windows=(128 1024)
make_work_dir readahead_probe "$work"

cleanup() {
  mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null 2>&1
  rm -rf "$work"
  rm -f "/dev/shm/readahead_probe.$$"
}
trap cleanup EXIT

mkdir "$work/mnt"
"$bin" format "$work/pool" --size "$(( $(numfmt --from=iec "$size") * 2 ))" >/dev/null
# readahead=0: the probe sets the window itself, before each read.
"$bin" mount -o readahead=0 "$work/pool" "$work/mnt"
truncate -s "$size" "$work/mnt/v"
fio --name=fill --filename="$work/mnt/v" --rw=write --bs=1M --size="$size" --end_fsync=1 \
  --output=/dev/null
cat "$work/pool/data" >/dev/null
dev=$(awk -v m="$work/mnt" '$5 == m {d = $3} END {print d}' /proc/self/mountinfo)
window_file=/sys/class/bdi/$dev/read_ahead_kb
pid=$(cat "$work/pool/lock")  # the daemon's, written when it took the pool

daemon_cpu_ms() {
  awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / hz)}' "/proc/$pid/stat"
}
reads_served() {
  "$bin" status "$work/pool" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["counters"]["reads"])'
}

for ((r = 1; r <= rounds; r++)); do
  order=("${windows[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#windows[@]} - 1; i >= 0; i--)); do order+=("${windows[i]}"); done
  fi
  for kib in "${order[@]}"; do
    echo "$kib" >"$window_file"
    if ((cold)); then
      sync
      echo 3 >/proc/sys/vm/drop_caches
    else
      dd if="$work/mnt/v" iflag=nocache count=0 status=none
    fi
    if [[ -n $prefault ]]; then
      head -c "$(numfmt --from=iec "$prefault")" /dev/zero >"/dev/shm/readahead_probe.$$"
      rm -f "/dev/shm/readahead_probe.$$"
    fi
    cpu0=$(daemon_cpu_ms)
    reads0=$(reads_served)
    mibs=$(fio --name=seqread --filename="$work/mnt/v" --rw=read --bs=1M --ioengine=psync \
      --size="$size" --output-format=json |
      python3 -c 'import json, sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw"] / 1024))')
    cpu1=$(daemon_cpu_ms)
    reads1=$(reads_served)
    printf 'round %d  window %5d KiB  %6d MiB/s  daemon CPU %5d ms  %6d read requests\n' \
      "$r" "$kib" "$mibs" $((cpu1 - cpu0)) $((reads1 - reads0))
  done
done
