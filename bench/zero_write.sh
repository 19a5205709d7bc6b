#!/usr/bin/env bash
# Writes of zeros through a thinfs mount: the probe behind
# docs/benchmarks.md, lever 53 (the cost of zero detection).
#
#   bench/zero_write.sh [--rounds N] [--size SIZE] [--dir DIR] CONFIG...
#
# CONFIG is THINFS_BINARY or THINFS_BINARY:MOUNT_OPTIONS. Per CONFIG:
# formats a sparse pool of four times --size (default 1G) and mounts it.
# Then N rounds (default 3), the CONFIGs alternating, three jobs each, all
# fio 1 MiB sequential writes of zeros (--zero_buffers, end_fsync) of
# --size into a volume made for the job and deleted after it:
#   - fresh:  into a new volume (nothing mapped: every block stays a hole);
#   - direct: the same with O_DIRECT (a writer with no cache of its own,
#             as a loop device with --direct-io=on or qemu cache=none);
#   - over:   over a volume written with random data first (untimed):
#             every block is unmapped.
# Prints one line per job: CONFIG, job, MiB/s, and the daemon's CPU time
# (utime + stime) per GiB written. Works in DIR (default
# /var/tmp/zero_write; must not exist; removed at the end). Needs root
# (mount) and fio (exit 77 without them; 1 under CI).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 size=1G work=/var/tmp/zero_write
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    -h | --help) header_usage 20; exit 0 ;;
    *) echo "zero_write: unknown option $1" >&2; exit 2 ;;
  esac
done
parse_probe_configs zero_write 20 "$@"
bytes=$(numfmt --from=iec "$size")
make_work_dir zero_write "$work"
mounted=() pids=()
cleanup() {
  umount_configs "$work"
  rm -rf "$work"
}
trap cleanup EXIT

label() { echo "${bins[$1]}${opts[$1]:+:${opts[$1]}}"; }

mount_configs "$work" "$((4 * bytes))"

# job I NAME [FIO_OPTION...]: one timed write of zeros into volume z of
# CONFIG I, which the caller made; prints its line and deletes z.
job() {
  local i=$1 name=$2 d=$work/$1 before after
  shift 2
  before=$(daemon_cpu_ticks "${pids[$i]}")
  fio --name=zeros --filename="$d/mnt/z" --rw=write --bs=1M --size="$size" --zero_buffers \
    --end_fsync=1 --ioengine=psync "$@" --output-format=json --output="$work/out.json"
  after=$(daemon_cpu_ticks "${pids[$i]}")
  python3 -c '
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
cpu_ms = (int(sys.argv[3]) - int(sys.argv[2])) * 1e3 / os.sysconf("SC_CLK_TCK")
gib = j["io_bytes"] / 2**30
print(sys.argv[4], sys.argv[5], "mibs", round(j["bw_bytes"] / 2**20),
      "daemon_cpu_ms_per_gib", round(cpu_ms / gib))' \
    "$work/out.json" "$before" "$after" "$(label "$i")" "$name"
  "${bins[$i]}" delete "$d/pool" z >/dev/null
}

for ((r = 1; r <= rounds; r++)); do
  for i in "${!bins[@]}"; do
    d=$work/$i
    truncate -s "$size" "$d/mnt/z"
    job "$i" fresh
    truncate -s "$size" "$d/mnt/z"
    job "$i" direct --direct=1
    truncate -s "$size" "$d/mnt/z"
    fio --name=data --filename="$d/mnt/z" --rw=write --bs=1M --size="$size" --end_fsync=1 \
      --ioengine=psync --output=/dev/null
    job "$i" over
  done
done
